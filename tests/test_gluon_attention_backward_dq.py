"""The warp-specialized dQ of the attention backward (``attention/gluon_backward_dq.py``) compiled for
sm_90 on the CPU with its IR and ptxas figures checked (run as a script, it prints one JSON line per
compiled variant; the test runs it in a subprocess, with Triton's compiler instead of its
interpreter). Which backwards the planner gives it is in ``test_gluon_attention_backward.py``, its
results on an H200 in ``test_gpu_attention_backward.py``."""

from __future__ import annotations

import json
import re

import sm90
import torch
from test_gluon_attention_backward import problem

from opendnn.families.attention import gluon_backward, gluon_backward_dq

SHARED_MEMORY = 227 * 1024  # bytes a block may use on sm_90
# name: (dtype, head dim, causal); GQA 8/2, 4096 queries and keys
VARIANTS = {
    f"{dtype}_{head_dim}_{'causal' if causal else 'full'}": (dtype, head_dim, causal)
    for dtype in ("bfloat16", "float16")
    for head_dim in gluon_backward.HEAD_DIMS
    for causal in (False, True)
}
# (registers a consumer and the producer keep; the launch's registers a thread): setmaxnreg and ptxas
REGISTERS = ([24, 240], 168)
# head dim -> shared bytes, measured: the query and dO blocks and the ring of 4 key and value stages
SHARED = {64: 98_752, 128: 197_056}


def test_every_variant_compiles_to_an_overlapped_kernel_without_spills_or_serialized_wgmma():
    completed = sm90.run_script(__file__, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        _, head_dim, _ = VARIANTS[name]
        assert report["kernel"] == "attention_dq_warp_specialized_kernel", name
        assert report["partitions"] == [4, 1] and report["warps"] == 12, name
        # per consumer: the first block's S and dP; S, dP and the previous dS K in each of the two
        # loops (interior, edge); the last dS K: all asynchronous
        assert (report["async_mma"], report["synchronous_mma"]) == (2 * 9, 0), name
        assert report["a_from_registers"] == 2 * 3, name  # dS K's dS
        assert report["shared_loads"] == 0 and report["shared_stores"] == 0, name  # dS's conversion too
        assert report["tma_loads"] == 8, name  # q's and dO's two halves; k and v in each of the two loops
        # S's and dP's D / 16 k-steps three times, dS K's BLOCK_N / 16 three times, per consumer
        steps = 3 * 2 * head_dim // 16 + 3 * gluon_backward_dq.BLOCK_N // 16
        assert report["wgmma_instructions"] == 2 * steps, name
        assert not report["serialized"], name  # ptxas keeps the products asynchronous
        assert [r for r in report["registers"] if r in REGISTERS[0]] == REGISTERS[0], name
        assert report["launch_registers"] == REGISTERS[1], name
        assert report["spilled"] == 0, name
        assert report["shared"] == SHARED[head_dim] <= SHARED_MEMORY, name


def variant_launch(name):
    """The kernel's (grid, arguments, options) of variant ``name`` on one-element tensors: only their
    dtypes and alignments specialize it."""
    dtype, head_dim, causal = VARIANTS[name]
    chosen = problem(dtype, head_dim, causal=causal)
    assert gluon_backward.out_of_scope(chosen) is None, name
    tensor = torch.empty(8, dtype=getattr(torch, dtype))
    floats = torch.empty(8)
    return gluon_backward_dq.launch_arguments(chosen, tensor, tensor, tensor, tensor, floats, floats, tensor)


def main() -> None:
    """Print, per variant, a JSON line: ``sm90.warp_specialized_figures``, the wgmma instructions in
    the PTX, ptxas's registers a thread and spilled bytes, and whether ptxas serialized the wgmmas."""
    target, backend = sm90.target_or_exit()
    kernel = gluon_backward_dq.attention_dq_warp_specialized_kernel
    for name in VARIANTS:
        _, args, options = variant_launch(name)
        specialized = sm90.specialize(kernel, args, options, backend)
        compiled = sm90.compile_sm90(kernel, *specialized[1:], specialized[0], target)
        ptx = compiled.asm["ptx"]
        registers, spilled = sm90.ptxas_usage(ptx, 90)
        report = dict(
            name=name,
            **sm90.warp_specialized_figures(compiled),
            wgmma_instructions=len(re.findall(r"wgmma\.mma_async", ptx)),
            launch_registers=registers,
            spilled=spilled,
            serialized=sm90.wgmma_serialized(ptx, 90),
        )
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
