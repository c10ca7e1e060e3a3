"""Depthwise layers (batch 64) on the GPU: each direction as planned beside cuDNN, then the backward
filter's candidate plans: ``filter_depthwise_kernel`` under each (pixels, channels, taps, warps) tile
and programs per SM, and for 3 x 3 filters ``filter_direct_kernel`` as planned beside it. Each line
gives the error against float64 and the GPU time (CUDA-graph replay); the last lines give the best
plan per layer and layout as the entries of ``triton_tiles.DEPTHWISE_FILTER_TILES`` (channels-last:
True, channels-first: False) and whether 3 x 3 filters should take the new kernel
(``DEPTHWISE_FILTER_MIN_TAPS`` = 9 instead of 10). docs/design/convolution.md, "Depthwise".

    PYTHONPATH=. python3 benchmarks/depthwise_sweep.py [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from convolution_kernels import DATA, FILTER, FWD, Case, bench_graph

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution import triton_tiles as tiles

LAYERS = {  # name: (C, H=W, K, R=S, stride, groups)
    "convnext_dw7x7_c96_56": (96, 56, 96, 7, 1, 96),
    "convnext_dw7x7_c384_14": (384, 14, 384, 7, 1, 384),
    "effnet_dw5x5_c240_28": (240, 28, 240, 5, 1, 240),
    "effnet_dw5x5_c672_14": (672, 14, 672, 5, 1, 672),
    "mbv2_dw3x3s2_c144_56": (144, 56, 144, 3, 2, 144),
    "dw3x3_c256_28": (256, 28, 256, 3, 1, 256),
}
LAYOUTS = ((DataType.BFLOAT16, True), (DataType.FLOAT, False))  # (dtype, channels last)
TILES = {  # candidate (pixels, channels, taps, warps) per layout
    True: [(32, 32, 8, 4), (16, 32, 8, 2), (32, 64, 8, 4), (64, 32, 4, 4), (32, 32, 16, 4), (16, 64, 8, 4)],
    False: [(64, 16, 8, 4), (32, 32, 8, 4), (128, 16, 4, 4)],
}
PROGRAMS_PER_SM = [4, 8, 16]
MIN_TILES_PER_SLICE = 4


def replan() -> None:
    kernels.launch_plan.cache_clear()
    kernels._workspace_regions.cache_clear()


def timed(case: Case) -> tuple[float, float]:
    """(error against float64, microseconds of a graph-replayed call)."""
    error = max(case.error(), case.error())
    return error, bench_graph(case.run) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; later candidates are skipped")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    start = time.time()
    chosen, min_taps = dict(tiles.DEPTHWISE_FILTER_TILES), tiles.DEPTHWISE_FILTER_MIN_TAPS
    best = {}
    for (name, shape), (dtype, channels_last) in itertools.product(LAYERS.items(), LAYOUTS):
        layout = f"{dtype.name} {'NHWC' if channels_last else 'NCHW'}"
        for direction in (FWD, DATA, FILTER):  # as planned
            case = Case(shape, direction, dtype, channels_last)
            cudnn = bench_graph(case.torch_call()) * 1e3
            error, ours = timed(case)
            print(
                f"{name:24s} {layout:14s} {direction.name:15s} planned err={error:.1e} ours={ours:8.1f}us "
                f"cudnn={cudnn:8.1f}us ratio={cudnn / ours:.3f}",
                flush=True,
            )
        filter_cudnn = cudnn  # the last direction's: the backward filter
        if shape[3] == 3:
            best[name, layout] = (filter_cudnn / ours, "filter_direct_kernel as planned")
        tiles.DEPTHWISE_FILTER_MIN_TAPS = 9  # 3 x 3 filters take the new kernel too
        for tile, per_sm in itertools.product(TILES[channels_last], PROGRAMS_PER_SM):
            if time.time() - start > args.budget:
                break
            tiles.DEPTHWISE_FILTER_TILES[channels_last] = (*tile, per_sm, MIN_TILES_PER_SLICE)
            replan()
            case = Case(shape, FILTER, dtype, channels_last)
            error, ours = timed(case)
            entry = f"DEPTHWISE_FILTER_TILES[{channels_last}] = {(*tile, per_sm, MIN_TILES_PER_SLICE)}"
            print(
                f"{name:24s} {layout:14s} FILTER candidate {entry} err={error:.1e} ours={ours:8.1f}us "
                f"ratio={filter_cudnn / ours:.3f}",
                flush=True,
            )
            best[name, layout] = max(best.get((name, layout), (0.0, "")), (filter_cudnn / ours, entry))
        tiles.DEPTHWISE_FILTER_TILES.update(chosen)
        tiles.DEPTHWISE_FILTER_MIN_TAPS = min_taps
        replan()
    print("best backward filter per layer (ratio = cuDNN time / opendnn time):")
    for (name, layout), (ratio, entry) in best.items():
        print(f"best {name:24s} {layout:14s} ratio={ratio:.3f} {entry}")


if __name__ == "__main__":
    main()
