"""The narrow-group route (``triton_grouped``) under candidate tiles beside cuDNN and beside the
implicit GEMM the route replaces: ResNeXt-50's two grouped 3x3 layers and RegNet-like ones, batch 64,
each direction, NHWC bfloat16 or NCHW float32 as TF32 (``--float32``: tiles of pixels, warps and
stages, the channel blocks as planned). Error against float64 and GPU time (CUDA-graph replay); the
best tile per layer and direction at the end. The sweep behind ``GROUPED_BLOCK_CHANNELS``,
``GROUPED_PIXELS`` / ``GROUPED_WARPS`` / ``FLOAT32_STAGES`` and ``GROUPED_MAX_CHANNELS``
(docs/design/convolution.md).

    PYTHONPATH=. python3 benchmarks/grouped_sweep.py [--layers resnext_28,regnet_16_56] [--float32]
"""

from __future__ import annotations

import argparse
import itertools

import torch
from convolution_kernels import DATA, FILTER, FWD, Case, bench_graph

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution import triton_grouped as grouped

LAYERS = {  # name: (C, H=W, K, R=S, stride, groups)
    "resnext_28": (256, 28, 256, 3, 1, 32),  # 8 channels a group
    "resnext_7": (1024, 7, 1024, 3, 1, 32),  # 32 a group: the GEMM's by the cost model
    "regnet_16_56": (128, 56, 128, 3, 1, 8),
    "regnet_16_28": (256, 28, 256, 3, 1, 16),
    "regnet_8_56": (128, 56, 128, 3, 1, 16),
    "regnety_56_28": (224, 28, 224, 3, 1, 4),  # RegNetY's 56 a group
    "wide_64_28": (256, 28, 256, 3, 1, 4),  # 64 a group: the route's widest
}
BLOCK_CHANNELS = (16, 32, 64)
PIXELS_WARPS = ((128, 4), (256, 8))
FLOAT32_TILES = ((128, 4, 2), (128, 4, 3), (128, 8, 2), (256, 8, 2))  # pixels, warps, stages
GEMM = "gemm"  # the route without this one: the implicit GEMM


def configure(max_channels: int, block_channels: int, pixels: int, warps: int, stages: int) -> None:
    grouped.GROUPED_MAX_CHANNELS = max_channels
    grouped.GROUPED_BLOCK_CHANNELS = block_channels
    grouped.GROUPED_PIXELS, grouped.GROUPED_WARPS, grouped.FLOAT32_STAGES = pixels, warps, stages
    for cached in (kernels.choose, kernels.launch_plan, kernels._workspace_regions):
        cached.cache_clear()  # plans are cached per problem


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--float32", action="store_true", help="NCHW float32 as TF32: tiles of pixels, warps, stages")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
    chosen = (
        grouped.GROUPED_MAX_CHANNELS,
        grouped.GROUPED_BLOCK_CHANNELS,
        grouped.GROUPED_PIXELS,
        grouped.GROUPED_WARPS,
        grouped.FLOAT32_STAGES,
    )
    if args.float32:
        candidates = list(FLOAT32_TILES)
    else:
        candidates = [GEMM, *itertools.product(BLOCK_CHANNELS, PIXELS_WARPS)]
    best = []
    for name, direction in itertools.product(args.layers.split(","), (FWD, DATA, FILTER)):
        theirs, results = None, []
        for candidate in candidates:
            if args.float32:
                configure(*chosen[:2], *candidate)
            elif candidate == GEMM:
                configure(0, *chosen[1:])
            else:
                block_channels, (pixels, warps) = candidate
                configure(64, block_channels, pixels, warps, chosen[-1])
            dtype = DataType.FLOAT if args.float32 else DataType.BFLOAT16
            case = Case(LAYERS[name], direction, dtype, channels_last=not args.float32)
            route = kernels.choose(case.problem, tma_aligned=True).name.lower()
            error = max(case.error(), case.error())
            ours = bench_graph(case.run)
            theirs = theirs or bench_graph(case.torch_call())
            results.append((theirs / ours, candidate, route))
            print(
                f"{name:13s} {direction.name:15s} {route:13s} {candidate!s:16s} err={error:.1e} "
                f"ours={ours * 1e3:8.1f}us cudnn={theirs * 1e3:8.1f}us ratio={theirs / ours:.3f}",
                flush=True,
            )
        best.append((name, direction.name, *max(results, key=lambda result: result[0])))
    configure(*chosen)
    print("\nbest per layer and direction (ratio = cuDNN time / ours):")
    for name, direction, ratio, candidate, route in best:
        print(f"{name:13s} {direction:15s} {route:13s} {candidate!s:16s} ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
