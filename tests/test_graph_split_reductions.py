"""Generated reductions split over their reduced dims: when the kept elements give fewer programs
than the GPU has multiprocessors, each program reduces one slice into partial results in the
workspace and a second kernel combines them in slice order. The plan's choice for a given
multiprocessor count, then genstats and every reduction mode split on Triton's interpreter (which
plans as for an H200's 132) in NCHW, channels-last and H-N-W-C layouts and sub-regions, with sizes
the slices do not divide, against float64; and the same bits at every run."""

import numpy as np
import pytest
import torch
from graph_helpers import (  # noqa: F401
    LAYOUTS,
    assert_written_inside_only,
    build,
    cpu_graph,
    graph_inputs,
    kernel_cache,
    laid_out,
    poisoned,
    random,
    relative_error,
    run_laid_out,
    t64,
)

import opendnn.graph as og
from opendnn.graph.codegen import generate, reduction_split
from opendnn.graph.fusion import Region, partition
from opendnn.graph.kernel_library import LIBRARY
from opendnn.graph.operation_graph import validate

pytestmark = pytest.mark.usefixtures("kernel_cache")

TOLERANCE = 1e-5
DIMS = (2, 3, 40, 41)  # 3280 elements a channel: 4 loop steps of 1024, the last of 208
SLICES = 4


def test_the_split_fills_the_multiprocessors_with_slices_of_whole_loop_steps():
    assert reduction_split(64, 13, 132) == (7, 2)  # 448 programs: 4 a multiprocessor asks 9 slices, 2 steps each
    assert reduction_split(1, 13, 132) == (13, 1)  # at least one loop step a slice
    assert reduction_split(4, 100, 8) == (8, 13)  # the last slice 9 steps
    assert reduction_split(131, 100, 132) == (5, 20)
    assert reduction_split(132, 100, 132) == (1, 100)  # the kept elements fill the GPU already
    assert reduction_split(64, 1, 132) == (1, 1)  # nothing to split


def benchmark_statistics(layout):
    """Genstats over the graph benchmark's convolution output, 64 x 256 x 14 x 14 bfloat16."""
    dims = (64, 256, 14, 14)
    g = og.Graph(io_data_type=og.DataType.BFLOAT16, handle=cpu_graph().handle, name=f"statistics_{layout}")
    y = g.tensor(list(dims), name="y").set_stride(
        [s // 2 for s in laid_out(np.empty(dims, np.float16), LAYOUTS[layout]).strides]
    )
    total, squares = g.genstats(y)
    total.set_output(True)
    squares.set_output(True)
    graph = validate(g)
    (region,) = [part for part in partition(graph) if isinstance(part, Region)]
    return region, graph


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_a_plan_splits_the_statistics_only_for_a_gpu_its_channels_do_not_fill(layout):
    region, graph = benchmark_statistics(layout)
    split = generate(region, graph, LIBRARY, 132).split  # [4, 1024] tiles: 64 programs of 13 loop steps
    assert (split.count, split.slice_steps, split.partials.dims, split.combine_grid) == (7, 2, (2 * 7 * 256,), 1)
    assert generate(region, graph, LIBRARY, 132).grid == (64, 7)
    unsplit = generate(region, graph, LIBRARY, 64)
    assert unsplit.split is None and unsplit.grid == (64, 1)
    assert "combine_partials" not in unsplit.source and "partials" not in unsplit.source


def prologue_statistics(layout, crop, x):
    """relu(x * s + b) and its genstats, x laid out as ``layout``: the graph, inputs and poisoned outputs."""
    rng = np.random.default_rng(61)
    s, b = random(rng, (1, DIMS[1], 1, 1)), random(rng, (1, DIMS[1], 1, 1))
    g = cpu_graph(f"split_stats_{layout}")
    xt, st, bt = graph_inputs(g, x=x, s=s, b=b)
    activated = g.relu(g.bias(g.scale(xt, st), bt))
    total, squares = g.genstats(activated)
    outputs = {activated: poisoned(DIMS, layout, crop)} | {
        t: poisoned((1, DIMS[1], 1, 1), "nchw") for t in (total, squares)
    }
    return g, {xt: x, st: s, bt: b}, outputs


@pytest.mark.parametrize("crop", [False, True], ids=["dense", "sub_region"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_split_genstats_matches_float64(layout, crop):
    x = laid_out(random(np.random.default_rng(60), DIMS), LAYOUTS[layout], crop)
    g, inputs, outputs = prologue_statistics(layout, crop, x)
    activated, total, squares = run_laid_out(g, inputs, outputs, "fused")
    assert f"split into {SLICES} slices of 1 steps by program" in g.plan.source()
    assert g.get_workspace_size() == 2 * SLICES * DIMS[1] * 4  # float32 partial sums and sums of squares
    if crop:
        assert_written_inside_only(next(iter(outputs.values())))
    _, s, b = inputs.values()
    v = torch.relu(t64(x) * t64(s) + t64(b))
    assert relative_error(activated, v.numpy()) < TOLERANCE
    assert relative_error(total, v.sum((0, 2, 3), keepdim=True).numpy()) < TOLERANCE
    assert relative_error(squares, (v * v).sum((0, 2, 3), keepdim=True).numpy()) < TOLERANCE


REDUCE = {
    "add": lambda v, axes: v.sum(axes, keepdims=True),
    "avg": lambda v, axes: v.mean(axes, keepdims=True),
    "min": lambda v, axes: v.min(axes, keepdims=True),
    "max": lambda v, axes: v.max(axes, keepdims=True),
    "amax": lambda v, axes: np.abs(v).max(axes, keepdims=True),
    "norm1": lambda v, axes: np.abs(v).sum(axes, keepdims=True),
    "norm2": lambda v, axes: np.sqrt((v * v).sum(axes, keepdims=True)),
    "mul": lambda v, axes: v.prod(axes, keepdims=True),
    "mul_no_zeros": lambda v, axes: np.where(v != 0, v, 1.0).prod(axes, keepdims=True),
}


@pytest.mark.parametrize("crop", [False, True], ids=["dense", "sub_region"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("mode", REDUCE)
def test_every_reduction_mode_split_matches_float64(mode, layout, crop):
    rng = np.random.default_rng(62)
    values = 1.0 + 0.01 * random(rng, DIMS)  # near 1: a product of 3280 of them stays finite
    values[0, :, 7, 9] = 0.0  # a zero for mul_no_zeros to skip, in the first slice
    values[1, :, 39, 40] = -3.0  # the extremes in the last slice, shorter than the others
    values[1, :, 39, 39] = 2.5
    x = laid_out(values, LAYOUTS[layout], crop)
    g = cpu_graph(f"split_{mode}")
    xt = g.tensor_like(x, name="x")
    y = g.reduction(g.mul(xt, 1.0), mode, [1, DIMS[1], 1, 1])
    out = poisoned((1, DIMS[1], 1, 1), "nchw")
    (result,) = run_laid_out(g, {xt: x}, {y: out}, "fused")
    assert f"split into {SLICES} slices" in g.plan.source()
    assert relative_error(result, REDUCE[mode](values.astype(np.float64), (0, 2, 3))) < TOLERANCE


def test_a_reduction_to_one_value_splits_over_all_its_elements():
    values = random(np.random.default_rng(63), DIMS)
    x = laid_out(values, LAYOUTS["channels_last"], crop=True)
    g = cpu_graph("split_total")
    xt = g.tensor_like(x, name="x")
    y = g.reduction(g.mul(xt, xt), "add", [1, 1, 1, 1])
    (result,) = run_laid_out(g, {xt: x}, {y: poisoned((1, 1, 1, 1), "nchw")}, "fused")
    assert "split into 10 slices of 1 steps" in g.plan.source()  # 9840 elements: 10 loop steps of 1024
    expected = (values.astype(np.float64) ** 2).sum(keepdims=True)
    assert relative_error(result, expected) < TOLERANCE


def test_a_split_plan_gives_the_same_bits_at_every_run():
    x = laid_out(random(np.random.default_rng(64), DIMS), LAYOUTS["channels_last"])
    g, inputs, outputs = prologue_statistics("channels_last", False, x)
    first = [a.copy() for a in (run_laid_out(g, inputs, outputs, "fused"))]
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    for _ in range(3):
        for array in outputs.values():
            array.fill(np.nan)
        workspace.fill(0xFF)  # the partial results are NaN until written
        g.execute({**inputs, **outputs}, workspace)
        for before, after in zip(first, outputs.values()):
            assert np.array_equal(before.astype(np.float32).view(np.uint32), after.view(np.uint32))
