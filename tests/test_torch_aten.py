"""``opendnn.torch.enable()`` / ``disable()`` / ``enabled()``: an unmodified torch model's operators
run on opendnn, against torch's own results on the CPU (float64)."""

import copy

import pytest
import torch
import torch.nn.functional as TF
from test_torch import SmallCNN

import opendnn.torch as ot
from opendnn import BadParam
from opendnn.torch import functions

nn = torch.nn


class EveryRoute(nn.Module):
    """A model of torch modules and functions whose operators opendnn routes (and a few whose
    options it does not cover, which stay torch's): one of each."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1d, self.conv3d = nn.Conv1d(4, 4, 3, padding="same"), nn.Conv3d(1, 2, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.norms = nn.ModuleList(
            [nn.GroupNorm(2, 4), nn.LayerNorm(8), nn.RMSNorm(8), nn.InstanceNorm2d(4), nn.BatchNorm2d(4)]
        )
        self.linear = nn.Linear(8, 8)
        self.activations = nn.ModuleList(
            [
                nn.GELU("tanh"),
                nn.SiLU(),
                nn.Sigmoid(),
                nn.Tanh(),
                nn.ELU(0.5),
                nn.SELU(),
                nn.CELU(2.0),
                nn.Softplus(2.0),
                nn.Softplus(1.0, threshold=2.0),
                nn.Hardtanh(-0.5, 2.0),
                nn.ReLU6(),
                nn.ReLU(),
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 4, 8, 8)
        line = self.conv1d(x.flatten(2)).reshape(x.shape)
        volume = self.conv3d(x.unsqueeze(1)).sum(1)
        x = self.up(TF.max_pool2d(line + volume, 2)) + TF.avg_pool2d(x, 3, 1, 1, divisor_override=7)
        for norm in self.norms:
            x = norm(x)
        x = self.linear(x) + TF.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        for activation in self.activations:
            x = activation(x) + 0.1 * x
        attention = torch.softmax(torch.matmul(x, x.mT), dim=-1)
        resized = TF.interpolate(torch.matmul(attention, x), scale_factor=1.5, mode="bilinear")
        pooled = TF.adaptive_avg_pool2d(resized, (3, 5))
        return TF.log_softmax(pooled.flatten(1), dim=1)


def grad_nodes(y: torch.Tensor) -> set[str]:
    names, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        names.add(type(node).__name__)
        stack += [child for child, _ in node.next_functions if child is not None]
    return names


def opendnn_calls(step) -> set[str]:
    """The opendnn operators ``step()`` calls (torch's profiler records every operator call)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step()
    return {event.name for event in profile.events() if event.name.startswith("opendnn::")}


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize(
    "make, shape", [(EveryRoute, (2, 4, 8, 8)), (SmallCNN, (4, 3, 12, 12))], ids=["every_route", "small_cnn"]
)
def test_enabled_runs_an_unmodified_model_on_opendnn_like_torch(make, shape):
    torch.manual_seed(0)
    theirs = make().double()
    ours = copy.deepcopy(theirs)
    x = torch.randn(shape, dtype=torch.float64)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_theirs = theirs(x_theirs)
    with ot.enabled():
        y_ours = ours(x_ours)
        y_ours.backward(torch.ones_like(y_ours))
    y_theirs.backward(torch.ones_like(y_theirs))
    assert_same(y_ours, y_theirs)
    assert_same(x_ours.grad, x_theirs.grad)
    for (name, mine), (_, reference) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-9, atol=1e-10, msg=name)
    for (name, mine), (_, reference) in zip(ours.named_buffers(), theirs.named_buffers()):
        torch.testing.assert_close(mine, reference, rtol=1e-9, atol=1e-10, msg=name)
    nodes = grad_nodes(y_ours)
    assert {
        "ConvolutionBackward",
        "BatchNormTrainingBackward",
        "LinearBackward",
        "MaxPoolBackward",
        "SoftmaxBackward",
        "ActivationBackward",
    } <= nodes
    assert not {"ConvolutionBackward0", "NativeBatchNormBackward0", "AddmmBackward0"} & nodes


def test_every_route_is_taken_by_the_model_that_uses_them_all():
    torch.manual_seed(0)
    model, x = EveryRoute().double(), torch.randn(2, 4, 8, 8, dtype=torch.float64)
    with ot.enabled():
        called = opendnn_calls(lambda: model(x))
    assert called == {
        f"opendnn::{name}"
        for name in (
            "convolution",
            "convolution_transpose",
            "max_pool",
            "avg_pool",
            "group_norm",
            "layer_norm",
            "rms_norm",
            "instance_norm",
            "batch_norm_training",
            "linear",
            "activation",
            "softmax",
            "matmul",
            "adaptive_pool",
            "interpolate",
        )
    }


def test_inference_mode_and_no_grad_are_routed_too():
    torch.manual_seed(0)
    model, x = SmallCNN().double().eval(), torch.randn(2, 3, 12, 12, dtype=torch.float64)
    expected = model(x)
    with ot.enabled():
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                assert "opendnn::convolution" in opendnn_calls(lambda: assert_same(model(x), expected))


def test_calls_opendnn_does_not_cover_run_as_torchs():
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    calls = {  # asymmetric "same" padding, integers, a vector product
        "conv_same_even_kernel": lambda: TF.conv2d(x, weight, padding="same"),
        "integer_relu": lambda: torch.relu(torch.arange(-3, 3)),
        "vector_matmul": lambda: torch.matmul(x[0, 0, 0], x[0, 0]),
    }
    for name, call in calls.items():
        expected = call()
        with ot.enabled():
            got = call()
            assert not opendnn_calls(call), name
        assert torch.equal(got, expected), name
        if got.requires_grad:  # torch's gradient nodes (their names end in a version number)
            assert all(node[-1].isdigit() or node == "AccumulateGrad" for node in grad_nodes(got)), name


def test_disable_gives_torch_its_kernels_back_and_enabled_restores_the_state_it_found():
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    weight = torch.randn(4, 3, 3, 3)
    assert not ot.is_enabled()
    ot.enable()
    try:
        with ot.enabled():
            assert "ConvolutionBackward" in grad_nodes(TF.conv2d(x, weight))
        assert ot.is_enabled()  # it was enabled before the block
    finally:
        ot.disable()
    assert not ot.is_enabled()
    assert "ConvolutionBackward0" in grad_nodes(TF.conv2d(x, weight))
    with ot.enabled():
        pass
    assert not ot.is_enabled() and "ConvolutionBackward0" in grad_nodes(TF.conv2d(x, weight))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize(
    "geometry",
    [((3, 2, 0), (2, 7, 7)), ((3, 2, 1), (3, 8, 6)), ((2, 3, (1, 0)), (2, 5, 7)), ((2, (2, 1, 3), 1), (2, 5, 4, 6))],
    ids=["2d", "2d_padded", "2d_asymmetric", "3d"],
)
def test_divisor_override_with_ceil_mode_is_torchs(geometry, count_include_pad):
    """A window that ceil_mode lets run past the padded input sums fewer positions: its sum over
    divisor_override, forward and backward, as torch's."""
    (kernel, stride, padding), shape = geometry
    torch.manual_seed(0)
    x = torch.randn(2, *shape, dtype=torch.float64, requires_grad=True)
    pool = TF.avg_pool2d if len(shape) == 3 else TF.avg_pool3d
    options = (kernel, stride, padding, True, count_include_pad, 5)
    expected = pool(x, *options)
    dy = torch.randn_like(expected)
    with ot.enabled():
        y = pool(x, *options)
        assert "AvgPoolBackward" in grad_nodes(y)
        (gradient,) = torch.autograd.grad(y, x, dy)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gradient, torch.autograd.grad(expected, x, dy)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "call",
    [torch.relu, lambda x: TF.max_pool2d(x, 2), lambda x: TF.gelu(x, approximate="tanh")],
    ids=["relu", "max_pool2d", "gelu"],
)
def test_a_forward_mode_derivative_of_a_routed_call_is_refused_naming_the_operator(call):
    """torch.func.jvp through a routed operator torch computes with a kernel of its own: opendnn's
    gradients are reverse-mode only, and torch's kernel below autograd would drop the tangent."""
    x, tangent = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 4, 4, dtype=torch.float64)
    with ot.enabled(), pytest.raises(NotImplementedError, match=r"^opendnn::\w+ has no forward-mode derivative"):
        torch.func.jvp(call, (x,), (tangent,))


def test_a_forward_mode_derivative_of_a_decomposed_call_is_torchs():
    x, weight = torch.randn(1, 2, 5, 5, dtype=torch.float64), torch.randn(3, 2, 3, 3, dtype=torch.float64)
    tangents = (torch.randn_like(x), torch.randn_like(weight))
    expected = torch.func.jvp(TF.conv2d, (x, weight), tangents)
    with ot.enabled():
        got = torch.func.jvp(TF.conv2d, (x, weight), tangents)
    for ours, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("route", ["enable", "functional_calls", "convert"])
def test_adaptive_pooling_and_area_interpolation_to_no_position_give_torchs_empty_results(route):
    """An output size of 0 (a scale factor below one over the size, in area mode) gives torch's
    empty result and a zero gradient, not an error."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 1, 6, dtype=torch.float64, requires_grad=True)
    calls = [lambda t: TF.interpolate(t, scale_factor=0.5, mode="area"), lambda t: TF.adaptive_avg_pool2d(t, (0, 2))]
    if route == "functional_calls":  # (enable() leaves adaptive max pooling to torch, whose gradient refuses it)
        calls.append(lambda t: TF.adaptive_max_pool2d(t, (2, 0)))
    if route == "convert":
        model = nn.Sequential(nn.AdaptiveAvgPool2d((0, 2)), nn.AdaptiveMaxPool2d((1, 0)))
        ot.convert(model)
        calls = list(model)
    contexts = {"enable": ot.enabled, "functional_calls": ot.functional_calls, "convert": torch.enable_grad}
    for call in calls:
        expected = call(x)
        with contexts[route]():
            y = call(x)
        assert y.shape == expected.shape and expected.numel() == 0
        (gradient,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(gradient, torch.zeros_like(x))


def test_an_adaptive_output_size_of_none_keeps_torchs_rule():
    """None keeps an input size only as an element of a 2-D or 3-D output size: routed calls give the
    rest to torch (its TypeError), opendnn's call refuses it by name, convert leaves the module."""
    x1, x2 = torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(2, 3, 4, 5, dtype=torch.float64)
    with ot.functional_calls():
        torch.testing.assert_close(TF.adaptive_avg_pool2d(x2, (None, 2)), TF.adaptive_avg_pool2d(x2, (4, 2)))
        for call, x, size in ((TF.adaptive_max_pool1d, x1, [None]), (TF.adaptive_avg_pool2d, x2, None)):
            with pytest.raises(TypeError):
                call(x, size)
    with pytest.raises(BadParam, match=r"output_size=\[None\]: None keeps an input size only as an element of a 2-D"):
        functions.adaptive_pool(x1, [None])
    model = nn.Sequential(nn.AdaptiveAvgPool1d([None]))
    report = ot.convert(model)
    assert [reason for _, _, reason in report.left_alone] == [
        "output_size=[None]: None keeps an input size only as an element of a 2-D or 3-D output size"
    ]
