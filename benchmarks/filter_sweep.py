"""The warp-specialized backward filter's candidate plans (``gluon_filter.filter_candidates``) on an
sm_90 GPU: per layer (batch 64, NHWC bfloat16) the candidates the cost model ranks best, each with its
estimate, its GPU time (CUDA-graph replay) beside cuDNN's and its error against float64, the planned
one marked; the last lines give per layer the fastest candidate against the planned one: where the
model's rates (``gluon_filter``'s SM_* and *_BYTES_PER_US) need measuring again.
docs/design/convolution.md, "Backward filter on the engine".

    PYTHONPATH=. python3 benchmarks/filter_sweep.py [--layers NAME ...] [--top N]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from convolution_kernels import FILTER, LAYERS, Case, bench_graph

from opendnn.core.dtypes import DataType
from opendnn.families.convolution import gluon_filter
from opendnn.families.convolution import triton_backend as kernels

ENGINE_LAYERS = [name for name in LAYERS if name not in ("r50_conv1", "dw_3x3_c256")]  # the rest take other kernels


def plan_with(choose: Any) -> None:
    """Make ``choose`` the engine's plan for every problem (plans are cached per problem: drop them)."""
    gluon_filter.filter_split = kernels.filter_split = choose
    kernels.launch_plan.cache_clear()
    kernels._workspace_regions.cache_clear()


def describe(split: gluon_filter.FilterSplit) -> str:
    return (
        f"C={split.block_c:3d} box={split.box} stages={split.stages} slices={split.slices:3d} partials={split.partials}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", nargs="+", choices=ENGINE_LAYERS, default=ENGINE_LAYERS)
    parser.add_argument("--top", type=int, default=5, help="candidates a layer, best estimates first")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    planner = gluon_filter.filter_split
    best = []
    for layer in args.layers:
        base = Case(layer, FILTER, DataType.BFLOAT16, True)
        planned = planner(base.problem)
        ranked = sorted(gluon_filter.filter_candidates(base.problem), key=lambda candidate: candidate[0])
        candidates = ranked[: args.top] + [candidate for candidate in ranked[args.top :] if candidate[1] == planned]
        cudnn_us = bench_graph(base.torch_call()) * 1e3
        timed = []
        for estimate, split in candidates:
            plan_with(lambda problem, split=split: split)
            case = Case(layer, FILTER, DataType.BFLOAT16, True)
            error = case.error()
            us = bench_graph(case.run) * 1e3
            error = max(error, case.error())
            timed.append((us, split))
            mark = "planned" if split == planned else ""
            print(
                f"{layer:13s} {describe(split)} estimate={estimate:6.1f}us ours={us:7.1f}us "
                f"cudnn={cudnn_us:6.1f}us ratio={cudnn_us / us:.3f} err={error:.1e} {mark}",
                flush=True,
            )
        plan_with(planner)
        fastest_us, fastest = min(timed, key=lambda entry: entry[0])
        planned_us = next(us for us, split in timed if split == planned)
        best.append(f"{layer:13s} fastest {describe(fastest)} {fastest_us:.1f}us; planned {planned_us:.1f}us")
    print("\n".join(best))


if __name__ == "__main__":
    main()
