"""The depthwise 3x3 backward-filter kernel (``filter_direct_kernel``) under each (pixels, channels,
warps) tile and program count: error against float64 and GPU time (CUDA-graph replay) beside cuDNN.
The sweep behind ``convolution.DIRECT_FILTER_TILES`` (docs/design/convolution.md).

    PYTHONPATH=. python3 benchmarks/depthwise_filter_sweep.py
"""

from __future__ import annotations

import itertools

import torch
from convolution_kernels import FILTER, Case, bench_graph

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels

SHAPES = {
    "c256_28": (256, 28, 256, 3, 1, 256),
    "c128_56": (128, 56, 128, 3, 1, 128),
    "c512_14": (512, 14, 512, 3, 1, 512),
    "c960_7": (960, 7, 960, 3, 1, 960),
}
TILES = [(64, 64, 4), (32, 64, 2), (32, 64, 1), (16, 64, 1)]  # pixels, channels, warps
PROGRAMS = [(264, 8), (1056, 2), (2112, 2), (4224, 1)]  # programs, fewest pixel tiles per slice


def main() -> None:
    torch.backends.cudnn.benchmark = True
    chosen = dict(kernels.DIRECT_FILTER_TILES)
    for (name, shape), dtype in itertools.product(SHAPES.items(), (DataType.BFLOAT16, DataType.FLOAT)):
        channels_last = dtype is DataType.BFLOAT16
        theirs = None
        for tile, programs in itertools.product(TILES, PROGRAMS):
            kernels.DIRECT_FILTER_TILES[channels_last] = (*tile, *programs)
            kernels.launch_plan.cache_clear()
            kernels._workspace_regions.cache_clear()
            case = Case(shape, FILTER, dtype, channels_last)
            error = max(case.error(), case.error())
            ours = bench_graph(case.run)
            theirs = theirs or bench_graph(case.torch_call())
            print(
                f"{name:8s} {dtype.name:8s} tile={tile} programs={programs} err={error:.1e} "
                f"ours={ours * 1e3:7.1f}us cudnn={theirs * 1e3:7.1f}us ratio={theirs / ours:.3f}",
                flush=True,
            )
        kernels.DIRECT_FILTER_TILES.update(chosen)


if __name__ == "__main__":
    main()
