"""The generated kernels of the graph benchmark's shapes compiled for the H200 (sm_90) on the CPU, in
bfloat16: a pointwise DAG over 64 x 256 x 56 x 56 and genstats over 64 x 256 x 14 x 14, NCHW and
channels-last. Walking the space in memory order, the pointwise kernel loads and stores its full-size
tensors as 16-byte vectors in both layouts (walked in logical order, a channels-last load is one
element, lanes C elements apart), and the genstats tile's fast axis is the contiguous one: the
reduced axis for NCHW, the kept channels for channels-last. In a subprocess: triton must load
without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import json
import re
from collections import Counter

import sm90

import opendnn as od
import opendnn.graph as og
from opendnn.core.descriptors import strides_for_order

DAG_DIMS, STATS_DIMS = (64, 256, 56, 56), (64, 256, 14, 14)
ORDERS = {"nchw": (0, 1, 2, 3), "nhwc": (0, 2, 3, 1)}  # memory order, outermost first


def test_generated_kernels_load_along_the_contiguous_dim(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENDNN_GRAPH_KERNELS", str(tmp_path))
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    kernels = json.loads(completed.stdout.splitlines()[-1])
    for layout, loads in (("nchw", 2), ("nhwc", 6)):  # channels-last: the per-channel vectors are contiguous too
        dag = kernels[f"pointwise_dag_{layout}"]
        assert dag["layout"] == {"sizePerThread": [8], "order": [0]}
        assert dag["loads"].get("ld.global.v4.b32") == loads and dag["stores"] == {"st.global.v4.b32": 1}
    assert "ld.global.b16" not in kernels["pointwise_dag_nhwc"]["loads"]
    # [BLOCK_KEEP, BLOCK_REDUCE] = [4, 1024]: NCHW reads 2 pixels a lane (W = 14 bounds the run Triton
    # can prove), channels-last 4 channels a lane (8 bytes)
    assert kernels["genstats_nchw"]["layout"] == {"sizePerThread": [1, 2], "order": [1, 0]}
    assert kernels["genstats_nchw"]["loads"] == {"ld.global.b32": 16}
    assert kernels["genstats_nhwc"]["layout"] == {"sizePerThread": [4, 1], "order": [0, 1]}
    assert kernels["genstats_nhwc"]["loads"] == {"ld.global.v2.b32": 8}


def strides(dims: tuple[int, ...], layout: str) -> list[int]:
    return list(strides_for_order(dims, ORDERS[layout]))


def pointwise_dag(layout: str) -> og.Graph:
    """``benchmarks/graph.py``'s DAG: relu(x * s1 + b1 + (z * s2 + b2)), s and b per channel."""
    g = og.Graph(io_data_type=og.DataType.BFLOAT16, handle=od.Handle("cpu"), name=f"pointwise_dag_{layout}")
    x, z = (g.tensor(list(DAG_DIMS), name=n).set_stride(strides(DAG_DIMS, layout)) for n in "xz")
    s1, b1, s2, b2 = (g.tensor([1, DAG_DIMS[1], 1, 1], name=n) for n in "s1 b1 s2 b2".split())
    y = g.relu(g.add(g.add(g.mul(x, s1), b1), g.add(g.mul(z, s2), b2)))
    y.set_output(True).set_stride(strides(DAG_DIMS, layout))
    return g


def genstats(layout: str) -> og.Graph:
    """The per-channel sum and sum of squares of y."""
    g = og.Graph(io_data_type=og.DataType.BFLOAT16, handle=od.Handle("cpu"), name=f"genstats_{layout}")
    total, squares = g.genstats(g.tensor(list(STATS_DIMS), name="y").set_stride(strides(STATS_DIMS, layout)))
    total.set_output(True)
    squares.set_output(True)
    return g


def main() -> None:
    """Print, as one JSON line by graph name: the layout Triton gives the kernel's loads (sizePerThread
    and order of the first ``#blocked`` encoding of its TTGIR) and its global load and store
    instructions counted by kind."""
    import torch

    from opendnn.graph.codegen import generate
    from opendnn.graph.fusion import Region, partition
    from opendnn.graph.kernel_library import LIBRARY, load_kernel
    from opendnn.graph.operation_graph import validate

    target, backend = sm90.target_or_exit(90)
    kernels = {}
    for g in (pointwise_dag("nchw"), pointwise_dag("nhwc"), genstats("nchw"), genstats("nhwc")):
        graph = validate(g)
        (region,) = [part for part in partition(graph) if isinstance(part, Region)]
        generated = generate(region, graph, LIBRARY)
        kernel = load_kernel(generated.source)
        pointers = tuple(torch.empty(16, dtype=graph.tensors[uid].desc.dtype.to_torch()) for uid in generated.pointers)
        options = {**dict(generated.blocks), "num_warps": generated.num_warps}
        specialized = sm90.specialize(kernel, pointers, options, backend)
        compiled = sm90.compile_sm90(kernel, *specialized[1:], specialized[0], target)
        blocked = re.search(
            r"#blocked = #ttg.blocked<\{sizePerThread = (\[.*?\]).*order = (\[.*?\])", compiled.asm["ttgir"]
        )
        assert blocked is not None
        ptx = compiled.asm["ptx"]
        kernels[g.name] = {
            "layout": {"sizePerThread": json.loads(blocked.group(1)), "order": json.loads(blocked.group(2))},
            "loads": Counter(re.findall(r"ld\.global[\w.]*", ptx)),
            "stores": Counter(re.findall(r"st\.global[\w.]*", ptx)),
        }
    print(json.dumps(kernels))


if __name__ == "__main__":
    main()
