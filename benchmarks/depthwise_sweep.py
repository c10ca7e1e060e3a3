"""Depthwise layers (batch 64) on the GPU: each direction as planned beside cuDNN; then forward and
backward data with the filter packed in the workspace (the route of the algorithms calls take by
default): channels-last on ``conv_depthwise_rows_kernel`` under each candidate (runs, channels, warps)
tile and longest run (``RUN_CANDIDATES``), channels-first on ``conv_depthwise_kernel`` under each
candidate (pixels, channels, warps, unrolled width) tile; then
the channels-first backward filter's candidate plans: ``filter_depthwise_kernel`` under each (pixels,
channels, taps, warps) tile and programs per SM; then the bfloat16 channels-last backward filter on
``filter_depthwise_rows_kernel`` under each (output rows, channels, filter rows, warps) tile and
programs per SM (``--channels-last-filter``: only that part). 3 x 3 filters run the candidates too,
beside their planned kernels (``conv_direct_kernel``, ``filter_direct_kernel``). Each line gives the
error against float64 and the GPU time (CUDA-graph replay); the last lines give the best plan per
layer, layout and direction as entries of ``triton_tiles.DEPTHWISE_TILES``, ``DEPTHWISE_RUN_TILE``,
``DEPTHWISE_FILTER_TILES`` (channels-last: True, channels-first: False) and ``DEPTHWISE_ROWS_TILES`` (by
filter width), from how many taps each layout should take the new kernels (``DEPTHWISE_MIN_TAPS``,
``DEPTHWISE_FILTER_MIN_TAPS``), the channels-first forward / backward data tile with the best geometric
mean over the layers past 9 taps, and the rows kernel's candidates by their geometric mean over all the
layers and per filter width (``DEPTHWISE_LONGEST_RUN``). docs/design/convolution.md, "Depthwise".

    PYTHONPATH=. python3 benchmarks/depthwise_sweep.py [--budget SECONDS] [--channels-last-filter]
"""

from __future__ import annotations

import argparse
import itertools
import math
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
    "effnet_dw5x5s2_c144_56": (144, 56, 144, 5, 2, 144),
    "dw3x3_c256_28": (256, 28, 256, 3, 1, 256),
    "dw3x3_c128_56": (128, 56, 128, 3, 1, 128),
    "dw3x3_c512_14": (512, 14, 512, 3, 1, 512),
    "dw3x3_c960_7": (960, 7, 960, 3, 1, 960),
}
LAYOUTS = ((DataType.BFLOAT16, True), (DataType.FLOAT, False))  # (dtype, channels last)
# conv_depthwise_kernel's candidate (pixels, channels, warps, unrolled width), channels-first, filter packed
DATA_TILES = [(256, 8, 4, False), (128, 16, 4, False), (128, 16, 4, True), (64, 32, 4, False)]
RUN_CANDIDATES = [  # conv_depthwise_rows_kernel's candidate ((runs, channels, warps), longest run), channels-last
    ((32, 32, 4), 4),
    ((32, 32, 4), 8),
    ((32, 32, 4), 16),
    ((16, 32, 2), 8),
    ((32, 16, 4), 8),
    ((64, 16, 4), 8),
    ((64, 32, 4), 4),
    ((16, 16, 2), 8),
]
TILES = {  # filter_depthwise_kernel's candidate (pixels, channels, taps, warps) per layout
    True: [(32, 32, 8, 4), (16, 32, 8, 2), (32, 64, 8, 4), (64, 32, 4, 4), (32, 32, 16, 4), (16, 64, 8, 4)],
    False: [(64, 16, 8, 4), (32, 32, 8, 4), (128, 16, 4, 4)],
}
PROGRAMS_PER_SM = [4, 8, 16]
MIN_TILES_PER_SLICE = 4
ROWS_TILES = {  # filter_depthwise_rows_kernel's candidate (output rows, channels, filter rows, warps) per width
    3: [(32, 32, 3, 4), (16, 32, 3, 4), (64, 32, 1, 8)],
    5: [(16, 32, 5, 4), (8, 32, 5, 4), (32, 32, 1, 4)],
    7: [(8, 32, 7, 4), (16, 16, 7, 4), (32, 32, 1, 4)],
}
ROWS_PROGRAMS_PER_SM = [2, 4, 8]
MIN_ROW_BLOCKS_PER_SLICE = 2


def replan() -> None:
    kernels.launch_plan.cache_clear()
    kernels._workspace_regions.cache_clear()


def timed(case: Case) -> tuple[float, float]:
    """(error against float64, microseconds of a graph-replayed call)."""
    error = max(case.error(), case.error())
    return error, bench_graph(case.run) * 1e3


def sweep_forward_and_backward_data(start: float, budget: float, cudnn: dict, best: dict, scores: dict) -> None:
    """Each layer's forward and backward data: channels-first under each candidate of DATA_TILES,
    channels-last under each of RUN_CANDIDATES (the rows kernel's problems); ``cudnn``: cuDNN's
    microseconds per (layer, layout, direction); ``scores``: per (layout, entry), the ratios of the
    layers past 9 taps (channels-first) or of every layer, and per (layout, filter width, entry) those
    of the width's layers (channels-last)."""
    chosen = (
        dict(tiles.DEPTHWISE_TILES),
        tiles.DEPTHWISE_RUN_TILE,
        tiles.DEPTHWISE_LONGEST_RUN,
        tiles.DEPTHWISE_LONGEST_STRIDED_RUN,
    )
    for (name, shape), (dtype, channels_last) in itertools.product(LAYERS.items(), LAYOUTS):
        layout = f"{dtype.name} {'NHWC' if channels_last else 'NCHW'}"
        candidates = RUN_CANDIDATES if channels_last else DATA_TILES
        for candidate, direction in itertools.product(candidates, (FWD, DATA)):
            if time.time() - start > budget:
                continue
            if channels_last:
                tile, longest = candidate
                tiles.DEPTHWISE_RUN_TILE = tile
                tiles.DEPTHWISE_LONGEST_RUN = ((tiles.DEPTHWISE_MAX_UNROLLED_WIDTH, longest),)
                tiles.DEPTHWISE_LONGEST_STRIDED_RUN = tiles.DEPTHWISE_LONGEST_RUN
                entry = f"DEPTHWISE_RUN_TILE = {tile}, longest run {longest}"
            else:
                tiles.DEPTHWISE_TILES[False, True] = candidate
                entry = f"DEPTHWISE_TILES[False, True] = {candidate}"
            replan()
            error, ours = timed(Case(shape, direction, dtype, channels_last))
            ratio = cudnn[name, layout, direction] / ours
            print(
                f"{name:24s} {layout:14s} {direction.name:15s} candidate {entry} err={error:.1e} "
                f"ours={ours:8.1f}us ratio={ratio:.3f}",
                flush=True,
            )
            best[name, layout, direction] = max(best.get((name, layout, direction), (0.0, "")), (ratio, entry))
            if channels_last:
                scores.setdefault((layout, entry), []).append(ratio)
                scores.setdefault((f"{layout} {shape[3]} wide", entry), []).append(ratio)
            elif shape[3] > 3:
                scores.setdefault((layout, entry), []).append(ratio)
    tiles.DEPTHWISE_TILES.update(chosen[0])
    tiles.DEPTHWISE_RUN_TILE, tiles.DEPTHWISE_LONGEST_RUN, tiles.DEPTHWISE_LONGEST_STRIDED_RUN = chosen[1:]
    replan()


def sweep_channels_last_filter(start: float, budget: float) -> None:
    """The bfloat16 channels-last backward filter of every layer: as planned beside cuDNN, then
    ``filter_depthwise_rows_kernel`` under each candidate of ROWS_TILES and ROWS_PROGRAMS_PER_SM; the
    best entry of ``DEPTHWISE_ROWS_TILES`` per layer, and per filter width the entries by their
    geometric mean over that width's layers (the planner's table takes one entry a width)."""
    chosen, best, scores = dict(tiles.DEPTHWISE_ROWS_TILES), {}, {}
    for name, shape in LAYERS.items():
        case = Case(shape, FILTER, DataType.BFLOAT16, True)
        cudnn = bench_graph(case.torch_call()) * 1e3
        error, ours = timed(case)
        print(
            f"{name:24s} bf16 NHWC FILTER planned err={error:.1e} ours={ours:8.1f}us cudnn={cudnn:8.1f}us "
            f"ratio={cudnn / ours:.3f}",
            flush=True,
        )
        width = shape[3]
        for tile, per_sm in itertools.product(ROWS_TILES[width], ROWS_PROGRAMS_PER_SM):
            if time.time() - start > budget:
                break
            tiles.DEPTHWISE_ROWS_TILES[width] = (*tile, per_sm, MIN_ROW_BLOCKS_PER_SLICE)
            replan()
            error, ours = timed(Case(shape, FILTER, DataType.BFLOAT16, True))
            entry = f"DEPTHWISE_ROWS_TILES[{width}] = {tiles.DEPTHWISE_ROWS_TILES[width]}"
            print(f"{name:24s} bf16 NHWC FILTER candidate {entry} err={error:.1e} ours={ours:8.1f}us", flush=True)
            best[name] = max(best.get(name, (0.0, "")), (cudnn / ours, entry))
            scores.setdefault(entry, []).append(cudnn / ours)
        tiles.DEPTHWISE_ROWS_TILES.update(chosen)
        replan()
    for name, (ratio, entry) in best.items():
        print(f"best {name:24s} bf16 NHWC FILTER ratio={ratio:.3f} {entry}")
    for entry, ratios in sorted(scores.items(), key=lambda item: -geomean(item[1])):
        print(f"geomean bf16 NHWC FILTER {geomean(ratios):.3f} over {len(ratios)} {entry}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=200.0, help="seconds; later candidates are skipped")
    parser.add_argument(
        "--channels-last-filter",
        action="store_true",
        help="only the bfloat16 channels-last backward filter (filter_depthwise_rows_kernel's candidates)",
    )
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    start = time.time()
    if args.channels_last_filter:
        sweep_channels_last_filter(start, args.budget)
        return
    chosen, min_taps = dict(tiles.DEPTHWISE_FILTER_TILES), tiles.DEPTHWISE_FILTER_MIN_TAPS
    best, cudnn, scores = {}, {}, {}
    for (name, shape), (dtype, channels_last) in itertools.product(LAYERS.items(), LAYOUTS):
        layout = f"{dtype.name} {'NHWC' if channels_last else 'NCHW'}"
        for direction in (FWD, DATA, FILTER):  # as planned
            case = Case(shape, direction, dtype, channels_last)
            cudnn[name, layout, direction] = bench_graph(case.torch_call()) * 1e3
            error, ours = timed(case)
            ratio = cudnn[name, layout, direction] / ours
            print(
                f"{name:24s} {layout:14s} {direction.name:15s} planned err={error:.1e} ours={ours:8.1f}us "
                f"cudnn={cudnn[name, layout, direction]:8.1f}us ratio={ratio:.3f}",
                flush=True,
            )
            if shape[3] == 3:
                best[name, layout, direction] = (ratio, "3 x 3 kernel as planned")
    sweep_forward_and_backward_data(start, args.budget, cudnn, best, scores)
    for (name, shape), (dtype, channels_last) in itertools.product(LAYERS.items(), LAYOUTS):
        if channels_last:  # filter_depthwise_rows_kernel's candidates: sweep_channels_last_filter
            continue
        layout = f"{dtype.name} {'NHWC' if channels_last else 'NCHW'}"
        filter_cudnn = cudnn[name, layout, FILTER]
        tiles.DEPTHWISE_FILTER_MIN_TAPS = {True: 1, False: 1}  # every filter takes the new kernel
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
            key = (name, layout, FILTER)
            best[key] = max(best.get(key, (0.0, "")), (filter_cudnn / ours, entry))
        tiles.DEPTHWISE_FILTER_TILES.update(chosen)
        tiles.DEPTHWISE_FILTER_MIN_TAPS = min_taps
        replan()
    sweep_channels_last_filter(start, args.budget)
    print("best per layer and direction (ratio = cuDNN time / opendnn time):")
    for (name, layout, direction), (ratio, entry) in best.items():
        print(f"best {name:24s} {layout:14s} {direction.name:15s} ratio={ratio:.3f} {entry}")
    print("forward and backward data candidates by geometric mean (channels-first: over the layers past 9 taps):")
    for (layout, entry), ratios in sorted(scores.items(), key=lambda item: -geomean(item[1])):
        print(f"geomean {layout:14s} {geomean(ratios):.3f} over {len(ratios)} {entry}")


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


if __name__ == "__main__":
    main()
