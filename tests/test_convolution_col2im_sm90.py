"""GEMM's backward data of ResNet-50's conv1 by product and gather (``triton_col2im``: 7 x 7 stride 2
over 3 channels, batch 64), its product compiled for the H200 (sm_90) on the CPU: Z is stored
column-major, a column's pixels contiguous, so every store of ``col2im_product_kernel`` is a 16-byte
vector, and dy's tile is read in 16-byte vectors along its channels (NHWC) or its pixels (NCHW).
Stored tap-major with the channel innermost, its stores went three channels apart, a word at a time,
and the product ran 1.4-2.1 times slower on the H200. In a subprocess: triton must load without its
interpreter (tests/sm90.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from pathlib import Path

import sm90

from opendnn.families.convolution.problem import ConvolutionBwdDataAlgo

CASES = [("bfloat16", "channels_last"), ("float32", "channels_first"), ("float32", "channels_last")]


def test_the_products_columns_are_stored_and_dy_read_in_16_byte_vectors():
    rows = sm90.script_rows(__file__, timeout=300)
    assert [tuple(row[:2]) for row in rows] == CASES
    for dtype, layout, vector_stores, scalar_stores, vector_loads in rows:
        assert int(vector_stores) > 0 and int(scalar_stores) == 0, (dtype, layout)
        assert int(vector_loads) > 0, (dtype, layout)


def main() -> None:
    """Print, per case: the product kernel's 16-byte stores, its narrower stores, its 16-byte loads."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for dtype, layout in CASES:
        problem = compile_times.conv(
            compile_times.ConvolutionDirection.BACKWARD_DATA, dtype, layout, 64, 3, 64, (224, 224), (7, 7), 2,
            tf32=True,
        )  # fmt: skip
        problem = dataclasses.replace(problem, algo=ConvolutionBwdDataAlgo.ALGO_1)
        _, compiles = compile_times.distinct_compiles([problem], backend)
        (item,) = [item for item in compiles if item.launch.kernel.__name__ == "col2im_product_kernel"]
        with tempfile.TemporaryDirectory() as folder:
            ptx_path = Path(folder) / "kernel.ptx"
            compile_times.compile_sm90(item, target, ptx_path)
            ptx = ptx_path.read_text()
        stores = re.findall(r"st\.global(\.v\d)?\.", ptx)
        vector_loads = len(re.findall(r"ld\.global\.v4\.", ptx))
        print(dtype, layout, stores.count(".v4"), len(stores) - stores.count(".v4"), vector_loads, flush=True)


if __name__ == "__main__":
    main()
