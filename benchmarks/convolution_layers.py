"""Every layer of ``convolution_kernels.LAYERS`` (batch 64) in all three directions, in one layout and
dtype: the route the default algorithm takes, its error against float64, its workspace, and GPU
time (CUDA-graph replay) beside cuDNN's (torch, cudnn.benchmark, TF32 allowed for float32).

    PYTHONPATH=. python3 benchmarks/convolution_layers.py nchw_float32 [--layers NAME ...]
        [--directions fwd bwd_data bwd_filter] [--out FILE.json] [--results benchmarks/results/h200.json]

Prints one line per case, then the geometric mean and the minimum of cudnn / opendnn per direction;
with ``--results``, saves the rows in the results file's convolution suite (``report.py``), where they
replace the rows of the same layer, direction and layout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import report
import torch
from convolution_kernels import DATA, FILTER, FWD, LAYERS, Case, bench_graph

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.kernels.device import has_wgmma

DTYPES = {"float32": DataType.FLOAT, "bfloat16": DataType.BFLOAT16, "float16": DataType.HALF}
DIRECTIONS = {FWD.name: "fwd", DATA.name: "bwd_data", FILTER.name: "bwd_filter"}  # the case names' suffixes
TIMING = "GPU time: each side's call replayed from a CUDA graph (`do_bench_cudagraph`), without the host."


def saved_rows(layout_dtype: str, rows: list[dict]) -> list[dict]:
    """``rows`` as the results file's convolution suite keeps them."""
    saved = []
    for row in rows:
        channels, size = LAYERS[row["layer"]][:2]
        saved.append(
            dict(
                case=f"{row['layer']}_{DIRECTIONS[row['direction']]}",
                dtype=layout_dtype,
                shape=f"64x{channels}x{size}x{size}",
                opendnn_ms=row["ms"],
                torch_ms=row["cudnn_ms"],
                ratio=row["ratio"],
            )
        )
    return saved


def route(case: Case) -> str:
    if kernels.matmul_form(case.problem) is not None or kernels.filter_matmul_form(case.problem) is not None:
        return "matmul"
    if kernels.choose(case.problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER:
        return "raster"
    if kernels.tma_blocks(case.problem) is None:
        return "old"  # the cp.async GEMM or the direct kernels
    if kernels.choose(case.problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA:
        return "gluon"
    return "tma+staged" if kernels.staged(case.problem) else "tma"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("layout_dtype", help="nchw_float32, nhwc_bfloat16, nhwc_float32, ...")
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=list(LAYERS), help="the layers to run")
    parser.add_argument(
        "--directions",
        nargs="+",
        choices=list(DIRECTIONS.values()),
        default=list(DIRECTIONS.values()),
        help="only these",
    )
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--results", help="save the rows in this results file (e.g. benchmarks/results/h200.json)")
    args = parser.parse_args()
    layout, dtype = args.layout_dtype.split("_")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    rows = []
    for layer in args.layers:
        for direction in (d for d in (FWD, DATA, FILTER) if DIRECTIONS[d.name] in args.directions):
            case = Case(layer, direction, DTYPES[dtype], layout == "nhwc")
            error = case.error()
            ours, theirs = bench_graph(case.run), bench_graph(case.torch_call())
            error = max(error, case.error())
            rows.append(
                dict(
                    layer=layer,
                    direction=direction.name,
                    route=route(case),
                    error=error,
                    ms=ours,
                    cudnn_ms=theirs,
                    ratio=theirs / ours,
                    workspace=kernels.workspace_size(case.problem),
                )
            )
            print(
                f"{layer:13s} {direction.name:15s} {rows[-1]['route']:10s} err={error:.1e} ours={ours * 1e3:8.1f}us "
                f"cudnn={theirs * 1e3:8.1f}us ratio={theirs / ours:.3f} ws={rows[-1]['workspace']}",
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as file:
            json.dump(rows, file, indent=1)
    if args.results:
        command = " ".join(["benchmarks/convolution_layers.py", *sys.argv[1:]])
        run = report.gpu_run(torch.cuda.get_device_name(), command, TIMING)
        report.save_run(args.results, run, {"convolution": saved_rows(args.layout_dtype, rows)})
    for direction in (FWD, DATA, FILTER):
        ratios = [row["ratio"] for row in rows if row["direction"] == direction.name]
        if not ratios:
            continue
        print(
            f"{layout} {dtype} {direction.name:15s} geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}"
            f" min {min(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
