"""GPU tests of the graph API (``pytest -m gpu``): the fusion engine's generated kernels compiled
for the device at real sizes, against torch in float64, and the host time of executing a built
fused plan and its capture into a CUDA graph."""

import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import (  # noqa: F401
    QUIET_NUMPY,
    assert_same_special_values,
    epilogue_special_values,
    kernel_cache,
    on_both_engines,
    pointwise_special_values,
    prologue_special_values,
)

import opendnn as od
import opendnn.graph as og
from opendnn.samples import relative_error

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from graph import bias_scale_relu  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"


def built(graph):
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([og.HeurMode.A])
    graph.check_support()
    graph.build_plans()
    assert graph.plan.engine == "fused"
    return graph


def workspace(graph):
    return torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=DEVICE)


@pytest.mark.parametrize("dtype", [og.DataType.HALF, og.DataType.BFLOAT16, og.DataType.FLOAT])
def test_bias_scale_relu_over_a_channels_last_activation(dtype):
    g = og.Graph(io_data_type=dtype, handle=od.Handle(DEVICE), name="bsr")
    x = torch.randn(32, 64, 56, 56, device=DEVICE, dtype=dtype.to_torch()).to(memory_format=torch.channels_last)
    b = torch.randn(1, 64, 1, 1, device=DEVICE, dtype=dtype.to_torch())
    xt, bt = g.tensor_like(x, name="x"), g.tensor_like(b, name="b")
    y = g.relu(g.mul(g.add(xt, bt), 0.5))
    y.set_output(True).set_stride(x.stride())
    built(g)
    out = torch.full_like(x, float("nan"))
    g.execute({xt: x, bt: b, y: out}, workspace(g))
    tolerance = 1e-5 if dtype is og.DataType.FLOAT else 1e-2
    assert relative_error(out, torch.relu((x.double() + b.double()) * 0.5)) < tolerance


def test_conv_bias_relu_and_genstats_at_resnet_sizes():
    g = og.Graph(io_data_type=og.DataType.HALF, handle=od.Handle(DEVICE), name="cbr_stats")
    x = torch.randn(16, 64, 56, 56, device=DEVICE, dtype=torch.half)
    w = torch.randn(64, 64, 3, 3, device=DEVICE, dtype=torch.half) * 0.05
    b = torch.randn(1, 64, 1, 1, device=DEVICE, dtype=torch.half)
    xt, wt, bt = g.tensor_like(x, name="x"), g.tensor_like(w, name="w"), g.tensor_like(b, name="b")
    y = g.relu(g.bias(g.conv_fprop(xt, wt, padding=[1, 1]), bt))
    y.set_output(True)
    total, squares = g.genstats(y)
    total.set_output(True)
    squares.set_output(True)
    built(g)
    out = torch.full((16, 64, 56, 56), float("nan"), device=DEVICE, dtype=torch.half)
    sums = [torch.full((1, 64, 1, 1), float("nan"), device=DEVICE) for _ in range(2)]
    g.execute({xt: x, wt: w, bt: b, y: out, total: sums[0], squares: sums[1]}, workspace(g))
    expected = torch.relu(TF.conv2d(x.double(), w.double(), padding=1) + b.double())
    assert relative_error(out, expected) < 1e-2
    assert relative_error(sums[0], out.double().sum((0, 2, 3), keepdim=True)) < 1e-4
    assert relative_error(sums[1], (out.double() ** 2).sum((0, 2, 3), keepdim=True)) < 1e-4


@QUIET_NUMPY
@pytest.mark.usefixtures("kernel_cache")
@pytest.mark.parametrize("mode", list(od.PointwiseMode), ids=lambda mode: mode.value)
def test_every_compiled_pointwise_mode_gives_the_reference_engines_nan_infinities_and_signed_zeros(mode):
    (actual,), (expected,), _ = on_both_engines(pointwise_special_values(mode), "fused", DEVICE)
    assert_same_special_values(actual, expected, 1e-5, mode.value)


@QUIET_NUMPY
@pytest.mark.usefixtures("kernel_cache")
@pytest.mark.parametrize("activation", [m for m in od.PointwiseMode if m.value.endswith("_fwd")], ids=lambda m: m.value)
def test_compiled_epilogues_and_prologues_give_the_reference_engines_nan_infinities_and_signed_zeros(activation):
    for build_graph in (
        epilogue_special_values("conv_fprop", activation),
        epilogue_special_values("matmul", activation),
        prologue_special_values(activation),
    ):
        actual, expected, _ = on_both_engines(build_graph, "fused", DEVICE)
        for a, e in zip(actual, expected):
            assert_same_special_values(a, e, 1e-5, activation.value)


def test_execute_of_a_built_three_node_plan_costs_little_host_time():
    x = torch.randn(64, 256, device=DEVICE)
    b = torch.randn(1, 256, device=DEVICE)
    out = torch.empty_like(x)
    g, pack = bias_scale_relu(od.Handle(DEVICE), x, b, out)  # the graph benchmarks' execute_host row
    assert g.plan.engine == "fused"
    for _ in range(100):
        g.execute(pack, None)
    torch.cuda.synchronize()
    calls = 2000
    start = time.perf_counter()
    for _ in range(calls):
        g.execute(pack, None)
    host = (time.perf_counter() - start) / calls
    torch.cuda.synchronize()
    assert relative_error(out, torch.relu((x.double() + b.double()) * 0.5)) < 1e-6
    # the published figure is the graph benchmark's execute_host row (9.2 us on the H200, target 10 us);
    # timed here among the other GPU tests it reads up to 13 us, so this bound catches regressions only
    assert host < 20e-6, f"execute took {host * 1e6:.1f} us of host time a call (the target is 10 us)"


def test_a_plan_captured_into_a_cuda_graph_replays_new_inputs_and_updates_to_new_tensors():
    g = og.Graph(handle=od.Handle(DEVICE), name="captured")
    x = torch.randn(64, 256, device=DEVICE)
    b = torch.randn(1, 256, device=DEVICE)
    xt, bt = g.tensor_like(x, name="x"), g.tensor_like(b, name="b")
    s = g.scalar(name="s")
    y = g.relu(g.mul(g.add(xt, bt), s))
    y.set_output(True).set_name("y")
    built(g)
    ws = workspace(g)
    out, eager = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    pack = {xt: x, bt: b, s: 0.5, y: out}
    cuda_graph = g.populate_cuda_graph(pack, ws)
    for _ in range(3):  # new inputs copied into the captured tensors
        x.copy_(torch.randn_like(x))
        b.copy_(torch.randn_like(b))
        out.fill_(float("nan"))
        cuda_graph.replay()
        g.execute({**pack, y: eager}, ws)
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        assert relative_error(out, torch.relu((x.double() + b.double()) * 0.5)) < 1e-6
    assert g.update_cuda_graph(pack, ws, cuda_graph) == []
    x2, out2 = torch.randn_like(x), torch.full_like(x, float("nan"))
    assert g.update_cuda_graph({**pack, xt: x2, s: -1.5, y: out2}, ws, cuda_graph) == ["x", "s", "y"]
    cuda_graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out2, torch.relu((x2.double() + b.double()) * -1.5)) < 1e-6
