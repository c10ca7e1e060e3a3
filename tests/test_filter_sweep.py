"""benchmarks/filter_sweep.py on the CPU: the candidate it times is the plan the backend launches, and
the planner comes back after it."""

import dataclasses
import importlib
from pathlib import Path

from test_gluon_convolution import FILTER, S, problem

from opendnn.families.convolution import gluon_filter
from opendnn.families.convolution import triton_backend as kernels

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_a_candidate_becomes_the_launched_plan_and_the_planner_comes_back(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    sweep = importlib.import_module("filter_sweep")
    prob = problem(direction=FILTER, n=64, c=256, size=14, k=256)
    planner = gluon_filter.filter_split
    planned = planner(prob)
    other = next(split for _, split in gluon_filter.filter_candidates(prob) if split.block_c != planned.block_c)
    try:
        sweep.plan_with(lambda problem, split=other: split)
        engine = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA).launches[0]
        assert engine.options["BLOCK_C"] == other.block_c and engine.grid[0] == min(other.units, 132)
        regions = {
            name: end - start
            for name, start, end, _ in kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA).regions
        }
        assert regions.get("partial", 0) >= other.partials * 256 * 256 * 9 * 4
    finally:
        sweep.plan_with(planner)
    engine = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA).launches[0]
    assert engine.options["BLOCK_C"] == planned.block_c
    assert dataclasses.asdict(gluon_filter.filter_split(prob)) == dataclasses.asdict(planned)
