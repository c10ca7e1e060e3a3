"""Every elementwise activation module ``opendnn.torch.convert`` supports, side by side with torch's on
inputs with NaN, infinities and each activation's edges (0, the clip values, softplus's threshold),
float64 and float32, forward and backward (an output gradient with NaN too): bit for bit where both
compute exactly (relu, relu6, hardtanh), else to float32's tolerance, NaN in the same places.

torch's reference is its module applied to each element alone: its CPU kernels' scalar loop, whose
formula its CUDA kernels share. (Its vectorized CPU loop differs at NaN for hardtanh and elu:
tests/test_torch_semantics.py.)"""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as TF

import opendnn.functional as F
import opendnn.torch as ot
from opendnn import BadParam

nn = torch.nn

# name: (torch's module, the activation's edges besides 0)
ACTIVATIONS = {
    "ReLU": (nn.ReLU, ()),
    "ReLU6": (nn.ReLU6, (6.0,)),
    "Hardtanh": (nn.Hardtanh, (-1.0, 1.0)),
    "Hardtanh_shifted": (lambda: nn.Hardtanh(-2.0, 3.0), (-2.0, 3.0)),
    "GELU": (nn.GELU, ()),
    "GELU_tanh": (lambda: nn.GELU("tanh"), ()),
    "SiLU": (nn.SiLU, ()),
    "Sigmoid": (nn.Sigmoid, ()),
    "Tanh": (nn.Tanh, ()),
    "ELU": (lambda: nn.ELU(0.5), ()),
    "Softplus": (lambda: nn.Softplus(beta=2.0), (10.0, 10.5)),  # beta * x at torch's threshold 20 and past it
    "Softplus_threshold": (lambda: nn.Softplus(beta=0.5, threshold=3.0), (6.0, 6.5)),
}
EXACT = {"ReLU", "ReLU6", "Hardtanh", "Hardtanh_shifted"}
TOLERANCE = {"rtol": 1.3e-6, "atol": 1e-5}  # torch's defaults for float32, for both dtypes
NOT_ELEMENTWISE = {nn.Softmax, nn.LogSoftmax}  # (tests/test_torch.py and test_torch_semantics.py)


def test_every_elementwise_activation_conversion_is_covered():
    activations = {
        kind for kind in ot.CONVERSIONS if kind.__module__ == "torch.nn.modules.activation"
    } - NOT_ELEMENTWISE
    assert {type(make()) for make, _ in ACTIVATIONS.values()} == activations


def inputs(edges: tuple[float, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, dy): 3 * randn with NaN, +-inf, 0 and the edges at random places (the edges' neighbours
    too), and an output gradient holding NaN where x is negative and where it is positive."""
    gen = torch.Generator().manual_seed(len(edges))
    x = 3 * torch.randn(5, 9, generator=gen, dtype=torch.float64)
    specials = [float("nan"), float("nan"), float("inf"), -float("inf"), 0.0, -1.5, 0.5, -0.0]
    for edge in edges:
        specials += [edge, torch.nextafter(torch.tensor(edge), torch.tensor(-float("inf"))).item()]
        specials += [torch.nextafter(torch.tensor(edge), torch.tensor(float("inf"))).item()]
    flat = x.view(-1)
    places = torch.randperm(flat.numel(), generator=gen)[: len(specials)]
    flat[places] = torch.tensor(specials, dtype=torch.float64)
    dy = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    dy.view(-1)[places[5:7]] = float("nan")  # where x is -1.5 and 0.5
    return x.to(dtype), dy.to(dtype)


def forward_backward(call: Callable, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(call(x), the gradient of x for the output gradient dy)."""
    x = x.clone().requires_grad_()
    y = call(x)
    y.backward(dy)
    return y.detach(), x.grad


def torch_elementwise(call: Callable, x: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's output and input gradient, each element computed alone (torch's scalar kernel)."""
    pairs = [forward_backward(call, a.reshape(1), b.reshape(1)) for a, b in zip(x.view(-1), dy.view(-1))]
    y, dx = (torch.cat(parts).reshape(x.shape) for parts in zip(*pairs))
    return y, dx


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, exact: bool) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    nan = theirs.isnan()
    assert torch.equal(ours.isnan(), nan), "NaN in other places than torch's"
    if exact:
        assert torch.equal(ours[~nan], theirs[~nan])
    else:
        torch.testing.assert_close(ours[~nan], theirs[~nan], **TOLERANCE)


@pytest.fixture(params=["numpy", "triton"])
def backend(request, monkeypatch):
    """The backend CPU tensors run on: NumPy's, or the Triton kernels through Triton's interpreter."""
    monkeypatch.setenv("OPENDNN_BACKEND", request.param)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_outputs_and_gradients_at_nan_infinities_and_edges_are_torchs(name, dtype, backend):
    make, edges = ACTIVATIONS[name]
    theirs = make()
    ours = make()
    assert ot.convert(ours).converted
    x, dy = inputs(edges, dtype)
    y_ours, dx_ours = forward_backward(ours, x, dy)
    y_theirs, dx_theirs = torch_elementwise(theirs, x, dy)
    assert_same(y_ours, y_theirs, name in EXACT)
    assert_same(dx_ours, dx_theirs, name in EXACT)


ROUTED = {  # a torch function, called while enable() / functional_calls() route it
    "relu": torch.relu,
    "relu6": torch.nn.functional.relu6,
    "hardtanh": lambda x: torch.nn.functional.hardtanh(x, -2.0, 3.0),
    "elu": lambda x: torch.nn.functional.elu(x, 0.5),
    "softplus": lambda x: torch.nn.functional.softplus(x, 0.5, 3.0),
}


@pytest.mark.parametrize("route", ["enable", "functional_calls"])
@pytest.mark.parametrize("name", ROUTED)
def test_routed_functions_take_torchs_gradients_at_nan_infinities_and_edges(name, route):
    call = ROUTED[name]
    x, dy = inputs((-2.0, 3.0, 6.0), torch.float64)
    y_theirs, dx_theirs = torch_elementwise(call, x, dy)
    with ot.enabled() if route == "enable" else ot.functional_calls() as calls:
        y_ours, dx_ours = forward_backward(call, x, dy)
    assert calls is None or sum(calls.routed.values()) == 1
    exact = name in ("relu", "relu6", "hardtanh")
    assert_same(y_ours, y_theirs, exact)
    assert_same(dx_ours, dx_theirs, exact)


# torch's formula of each activation whose gradient selects, as opendnn.functional's backward with torch_rule
TORCH_RULES = {
    "relu": (torch.relu, lambda dy, x, **rule: F.relu_backward(dy, x, **rule)),
    "relu6": (TF.relu6, lambda dy, x, **rule: F.clipped_relu_backward(dy, x, 6.0, **rule)),
    "hardtanh_0_2": (
        lambda x: TF.hardtanh(x, 0.0, 2.0),
        lambda dy, x, **rule: F.clipped_relu_backward(dy, x, 2.0, **rule),
    ),
    "elu": (lambda x: TF.elu(x, 0.5), lambda dy, x, **rule: F.elu_backward(dy, x, 0.5, **rule)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", TORCH_RULES)
def test_the_functional_backward_with_torch_rule_is_torchs_autograd(name, dtype, backend):
    """NaN, infinities, -0.0, 0 and the edges in x, NaN and infinities in dy (where x is negative
    and where it is positive): torch's autograd element by element, bit for bit where it selects."""
    forward, backward = TORCH_RULES[name]
    x, dy = inputs((2.0, 6.0), dtype)
    dy.view(-1)[:3] = torch.tensor([float("inf"), -float("inf"), float("nan")], dtype=dtype)
    _, dx_theirs = torch_elementwise(forward, x, dy)
    dx_ours = backward(dy, x, torch_rule=True)
    assert_same(dx_ours, dx_theirs, exact=name != "elu")
    assert not torch.equal(backward(dy, x).isnan(), dx_theirs.isnan())  # cuDNN's rule differs at NaN


def test_propagate_nan_and_torch_rule_together_are_refused():
    x = torch.randn(3, 4)
    with pytest.raises(BadParam, match=r"propagate_nan=True and torch_rule=True: torch's rule gives dy where x is NaN"):
        F.relu_backward(x, x, propagate_nan=True, torch_rule=True)


def test_the_functional_and_cudnn_shaped_backward_keep_cudnns_rule_at_nan():
    """The torch layer's relu passes dy where x is NaN (torch's); opendnn.functional's relu_backward,
    cuDNN's activation backward, gives 0 there (NOT_PROPAGATE_NAN) or NaN (PROPAGATE_NAN)."""
    x = torch.tensor([float("nan"), -1.0, 2.0], dtype=torch.float64)
    dy = torch.tensor([0.5, 0.25, 0.75], dtype=torch.float64)
    _, dx_module = forward_backward(ot.ReLU(), x, dy)
    assert torch.equal(dx_module, torch.tensor([0.5, 0.0, 0.75], dtype=torch.float64))
    assert torch.equal(F.relu_backward(dy, x), torch.tensor([0.0, 0.0, 0.75], dtype=torch.float64))
    assert F.relu_backward(dy, x, propagate_nan=True)[0].isnan()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_on_cuda_outputs_and_gradients_are_torchs_whole_tensors(name):
    """torch's CUDA kernels take their formulas' values at every position (no vectorized loop of their own)."""
    make, edges = ACTIVATIONS[name]
    ours = make()
    ot.convert(ours)
    x, dy = (t.to("cuda", torch.float32) for t in inputs(edges, torch.float64))
    y_ours, dx_ours = forward_backward(ours, x, dy)
    y_theirs, dx_theirs = forward_backward(make(), x, dy)
    assert_same(y_ours, y_theirs, name in EXACT)
    assert_same(dx_ours, dx_theirs, name in EXACT)
