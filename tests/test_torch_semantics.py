"""Every module ``opendnn.torch.convert`` supports, side by side with torch's in float64, training and
eval: random inputs with NaN and infinities (outputs agree, NaN where torch's NaN is), finite
inputs (outputs, input gradients and parameter gradients agree), empty batches, unbatched inputs
where torch's module takes them, odd sizes; and the errors torch's module raises, of torch's type."""

import copy

import pytest
import torch

import opendnn.torch as ot
from opendnn.core.errors import OpenDnnError

nn = torch.nn

# name: (the torch module, an input shape of odd sizes, whether it also takes an unbatched input)
MODULES = {
    "Conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), (2, 3, 7), True),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2), (2, 4, 7, 5), True),
    "Conv3d": (lambda: nn.Conv3d(2, 3, 3, padding=(1, 0, 1), dilation=(1, 1, 2)), (2, 2, 3, 4, 7), True),
    "ConvTranspose1d": (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), (2, 3, 5), True),
    "ConvTranspose2d": (
        lambda: nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1, groups=2),
        (2, 4, 3, 5),
        True,
    ),
    "ConvTranspose3d": (lambda: nn.ConvTranspose3d(2, 3, 2), (1, 2, 3, 2, 3), True),
    "Linear": (lambda: nn.Linear(5, 3), (2, 3, 5), True),
    "BatchNorm1d": (lambda: nn.BatchNorm1d(3), (4, 3, 5), False),
    "BatchNorm1d_2d_input": (lambda: nn.BatchNorm1d(3, momentum=None), (5, 3), False),
    "BatchNorm2d": (lambda: nn.BatchNorm2d(3), (4, 3, 5, 3), False),
    "BatchNorm3d": (lambda: nn.BatchNorm3d(2, affine=False), (3, 2, 3, 2, 3), False),
    "LayerNorm": (lambda: nn.LayerNorm((3, 5)), (2, 3, 5), True),
    "RMSNorm": (lambda: nn.RMSNorm(5), (2, 3, 5), True),
    "GroupNorm": (lambda: nn.GroupNorm(2, 4), (2, 4, 3, 5), False),
    "InstanceNorm1d": (lambda: nn.InstanceNorm1d(3, affine=True), (2, 3, 5), True),
    "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3), (2, 3, 4, 5), True),
    "InstanceNorm3d": (lambda: nn.InstanceNorm3d(2, affine=True), (2, 2, 3, 4, 3), True),
    "LocalResponseNorm": (lambda: nn.LocalResponseNorm(3, alpha=0.1), (2, 5, 4, 3), False),
    "ReLU": (nn.ReLU, (3, 7), True),
    "ReLU6": (nn.ReLU6, (3, 7), True),
    "Hardtanh": (lambda: nn.Hardtanh(-2.0, 3.0), (3, 7), True),
    "GELU": (nn.GELU, (3, 7), True),
    "GELU_tanh": (lambda: nn.GELU("tanh"), (3, 7), True),
    "SiLU": (nn.SiLU, (3, 7), True),
    "Sigmoid": (nn.Sigmoid, (3, 7), True),
    "Tanh": (nn.Tanh, (3, 7), True),
    "ELU": (lambda: nn.ELU(0.5), (3, 7), True),
    "Softplus": (lambda: nn.Softplus(beta=2.0), (3, 7), True),
    "MaxPool1d": (lambda: nn.MaxPool1d(3, 2, 1), (2, 3, 8), True),
    "MaxPool2d": (lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True), (2, 3, 7, 6), True),
    "MaxPool3d": (lambda: nn.MaxPool3d(2), (1, 2, 4, 5, 4), True),
    "AvgPool1d": (lambda: nn.AvgPool1d(3, 2, 1), (2, 3, 8), True),
    "AvgPool2d": (lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 7, 6), True),
    "AvgPool3d": (lambda: nn.AvgPool3d(2, 1), (1, 2, 4, 5, 4), True),
    "AdaptiveAvgPool1d": (lambda: nn.AdaptiveAvgPool1d(3), (2, 3, 8), True),
    "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 6), True),
    "AdaptiveAvgPool3d": (lambda: nn.AdaptiveAvgPool3d(2), (1, 2, 4, 5, 3), True),
    "AdaptiveMaxPool1d": (lambda: nn.AdaptiveMaxPool1d(3), (2, 3, 8), True),
    "AdaptiveMaxPool2d": (lambda: nn.AdaptiveMaxPool2d((4, 3)), (2, 3, 7, 6), True),
    "AdaptiveMaxPool3d": (lambda: nn.AdaptiveMaxPool3d(2), (1, 2, 4, 5, 3), True),
    "Upsample": (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), (2, 3, 5, 6), False),
    "UpsamplingNearest2d": (lambda: nn.UpsamplingNearest2d(size=(7, 9)), (2, 3, 5, 6), False),
    "UpsamplingBilinear2d": (lambda: nn.UpsamplingBilinear2d(scale_factor=1.5), (2, 3, 5, 6), False),
    "Upsample_bicubic": (lambda: nn.Upsample(size=(9, 4), mode="bicubic"), (2, 3, 5, 6), False),
    "Softmax": (lambda: nn.Softmax(dim=1), (2, 5, 3), True),
    "LogSoftmax": (lambda: nn.LogSoftmax(dim=-1), (2, 5, 3), True),
}


def test_every_conversion_is_covered():
    covered = {type(make()) for make, _, _ in MODULES.values()}
    assert covered == set(ot.CONVERSIONS)


def pair(name: str, training: bool) -> tuple[nn.Module, nn.Module]:
    """(torch's module, its converted copy) in float64, with parameters and running statistics
    away from their initial values."""
    torch.manual_seed(0)
    theirs = MODULES[name][0]().double().train(training)
    with torch.no_grad():
        for tensor in [*theirs.parameters(), *theirs.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    ours = copy.deepcopy(theirs)
    assert ot.convert(ours).converted
    return theirs, ours


def with_nonfinite(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """3 * randn with a NaN, a +inf and a -inf at random places."""
    gen = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(shape, generator=gen, dtype=torch.float64)
    flat = x.view(-1)
    places = torch.randperm(flat.numel(), generator=gen)[:3]
    flat[places] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    return x


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert torch.equal(ours.isnan(), theirs.isnan()), "NaN in other places than torch's"
    torch.testing.assert_close(ours, theirs, rtol=1e-8, atol=1e-10, equal_nan=True)


def assert_same_state(ours: nn.Module, theirs: nn.Module) -> None:
    for (key, mine), (_, reference) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(mine.isnan(), reference.isnan()), key
        torch.testing.assert_close(mine, reference, rtol=1e-8, atol=1e-10, equal_nan=True, msg=key)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODULES)
def test_nan_and_infinities_propagate_as_torchs(name, training):
    theirs, ours = pair(name, training)
    for seed in range(3):
        x = with_nonfinite(MODULES[name][1], seed)
        assert_same(ours(x), theirs(x))
    assert_same_state(ours, theirs)


def input_gradients(
    ours: nn.Module, theirs: nn.Module, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both modules' outputs on ``x`` (asserted the same), then the gradients of ``x`` through each
    for one random output gradient dy: (ours, torch's, dy)."""
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    assert_same(y_ours, y_theirs)
    dy = torch.randn_like(y_theirs)
    y_ours.backward(dy)
    y_theirs.backward(dy)
    return x_ours.grad, x_theirs.grad, dy


def assert_same_parameter_gradients(ours: nn.Module, theirs: nn.Module) -> None:
    for (key, mine), (_, reference) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(mine.grad.isnan(), reference.grad.isnan()), key
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-8, atol=1e-10, equal_nan=True, msg=key)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODULES)
def test_outputs_and_gradients_match_torch(name, training):
    theirs, ours = pair(name, training)
    dx_ours, dx_theirs, _ = input_gradients(ours, theirs, 3 * torch.randn(MODULES[name][1], dtype=torch.float64))
    assert_same(dx_ours, dx_theirs)
    assert_same_parameter_gradients(ours, theirs)
    assert_same_state(ours, theirs)


# torch's instance norm with affine parameters fails on an empty batch (an IndexError); opendnn's
# gives the empty result and zero parameter gradients
EMPTY_BATCH_REFUSED_BY_TORCH = {"InstanceNorm1d", "InstanceNorm3d"}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODULES)
def test_an_empty_batch_gives_torchs_empty_result(name, training):
    theirs, ours = pair(name, training)
    x = torch.randn(0, *MODULES[name][1][1:], dtype=torch.float64)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours = ours(x_ours)
    y_ours.sum().backward()
    assert x_ours.grad.shape == x.shape
    if name in EMPTY_BATCH_REFUSED_BY_TORCH:
        with pytest.raises(IndexError):
            theirs(x_theirs)
        assert y_ours.shape == x.shape and all(torch.equal(p.grad, torch.zeros_like(p)) for p in ours.parameters())
        return
    y_theirs = theirs(x_theirs)
    assert y_ours.shape == y_theirs.shape and y_ours.dtype == y_theirs.dtype
    y_theirs.sum().backward()
    for (key, mine), (_, reference) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert torch.equal(mine.grad, reference.grad), key
    assert_same_state(ours, theirs)


@pytest.mark.parametrize("name", [name for name, (_, _, unbatched) in MODULES.items() if unbatched])
def test_an_unbatched_input_gives_torchs_result(name):
    theirs, ours = pair(name, training=False)
    x = 3 * torch.randn(MODULES[name][1][1:], dtype=torch.float64)
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ours, y_theirs = ours(x_ours), theirs(x_theirs)
    assert_same(y_ours, y_theirs)
    y_ours.sum().backward()
    y_theirs.sum().backward()
    assert_same(x_ours.grad, x_theirs.grad)


@pytest.mark.parametrize("name", ["RMSNorm", "LayerNorm", "GroupNorm", "InstanceNorm1d"])
def test_an_input_made_in_inference_mode_trains_a_norms_parameters(name):
    """An inference tensor outside inference mode, the parameters needing gradients: the output and
    the parameters' gradients are torch's (torch's RMS norm takes it; its other norms refuse to save
    it, so theirs run on a normal copy)."""
    theirs, ours = pair(name, training=True)
    with torch.inference_mode():
        x = 3 * torch.randn(MODULES[name][1], dtype=torch.float64)
    y_ours, y_theirs = ours(x), theirs(x if name == "RMSNorm" else x.clone())
    assert_same(y_ours, y_theirs)
    dy = torch.randn_like(y_theirs)
    y_ours.backward(dy)
    y_theirs.backward(dy)
    assert_same_parameter_gradients(ours, theirs)


ERRORS = {  # name: (the torch module, an input it refuses)
    "Conv2d_channels": (lambda: nn.Conv2d(4, 6, 3), (2, 3, 7, 5)),
    "Conv2d_too_small": (lambda: nn.Conv2d(3, 6, 5), (2, 3, 4, 4)),
    "Linear_features": (lambda: nn.Linear(5, 3), (2, 4)),
    "LayerNorm_shape": (lambda: nn.LayerNorm(5), (2, 4)),
    "GroupNorm_channels": (lambda: nn.GroupNorm(2, 4), (2, 6, 3)),
    "BatchNorm2d_rank": (lambda: nn.BatchNorm2d(3), (2, 3, 4)),
    "MaxPool2d_window": (lambda: nn.MaxPool2d(5), (1, 2, 3, 3)),
    "Softmax_dim": (lambda: nn.Softmax(dim=3), (2, 3)),
    "LayerNorm_trailing_dims": (lambda: nn.LayerNorm((4, 5)), (2, 5, 4)),
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors_are_of_torchs_type_with_opendnns_message(name):
    make, shape = ERRORS[name]
    theirs = make().double()
    ours = copy.deepcopy(theirs)
    ot.convert(ours)
    x = torch.randn(shape, dtype=torch.float64)
    with pytest.raises(Exception) as torch_error:
        theirs(x)
    with pytest.raises(type(torch_error.value)) as our_error:
        ours(x)
    if isinstance(our_error.value, OpenDnnError):  # (a module's own check, as torch's, is torch's error)
        assert "=" in str(our_error.value) and "must" in str(our_error.value)


# at a NaN input, torch's hardtanh (ReLU6) and elu backward formulas give dy (they test x <= low, false
# for NaN), and so do its CUDA kernels and the scalar loop of its CPU kernels over a tensor's tail; the
# vectorized loop over the body gives 0 (hardtanh) and NaN (elu). opendnn gives the formula's dy
# everywhere (tests/test_torch_activations.py checks it element by element against torch's)
NAN_GRADIENT_BY_TORCH_CPU_LOOP = {"ReLU6", "Hardtanh", "ELU"}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", MODULES)
def test_gradients_of_inputs_with_nan_and_infinities_are_torchs(name, training):
    theirs, ours = pair(name, training)
    x = with_nonfinite(MODULES[name][1], seed=1)
    dx_ours, dx_theirs, dy = input_gradients(ours, theirs, x)
    if name in NAN_GRADIENT_BY_TORCH_CPU_LOOP:
        dx_theirs[x.isnan()] = dy[x.isnan()]
    assert_same(dx_ours, dx_theirs)
    assert_same_parameter_gradients(ours, theirs)


class ConvChain(nn.Module):
    """conv -> batch norm -> activation, and linear -> activation: the chains ``fuse`` puts in one call."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), activation
        self.linear, self.act2 = nn.Linear(5, 6), copy.deepcopy(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act2(self.linear(self.act(self.norm(self.conv(x)))))


@pytest.mark.parametrize(
    "activation",
    [nn.ReLU(), nn.ReLU6(), nn.GELU(), nn.SiLU()],
    ids=["relu", "relu6", "gelu", "silu"],
)
def test_fused_epilogues_keep_nan_where_torchs_modules_do(activation):
    torch.manual_seed(0)
    theirs = ConvChain(activation).double().eval()
    with torch.no_grad():
        for tensor in [*theirs.parameters(), *theirs.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    fused = ot.fuse(copy.deepcopy(theirs))
    kinds = {type(module).__name__ for module in fused.modules()}
    assert {"FusedConvolution", "FusedLinear"} <= kinds
    with torch.no_grad():
        for seed in range(3):
            x = with_nonfinite((2, 3, 4, 5), seed)
            x[0, :, 1, 2] = float("nan")  # a NaN the batch norm's shift does not move
            assert_same(fused(x), theirs(x))


def test_functional_conv_bias_activation_keeps_cudnns_nan_default_and_propagates_when_asked():
    import numpy as np

    import opendnn.functional as F

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 2, 4, 4)), rng.standard_normal((3, 2, 1, 1))
    x[0, :, 1, 2] = np.nan
    y_default = F.conv_bias_activation(x, w, None, None, "relu")
    y_propagated = F.conv_bias_activation(x, w, None, None, "relu", propagate_nan=True)
    expected = np.maximum(np.einsum("kc,nchw->nkhw", w[:, :, 0, 0], np.nan_to_num(x, nan=0.0)), 0.0)
    nan_places = np.zeros_like(expected, dtype=bool)
    nan_places[0, :, 1, 2] = True
    np.testing.assert_allclose(y_default, np.where(nan_places, 0.0, expected), rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isnan(y_propagated), nan_places)
    np.testing.assert_allclose(y_propagated[~nan_places], expected[~nan_places], rtol=1e-12, atol=1e-12)


class NormChain(nn.Module):
    """batch norm -> + residual -> activation: the chain ``fuse`` puts in one training batch norm call."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.norm, self.act = nn.BatchNorm2d(4), activation

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(x) + z)


@pytest.mark.parametrize("activation", [nn.ReLU(), nn.ReLU6()], ids=["relu", "relu6"])
def test_fused_training_batch_norm_keeps_nan_where_torchs_modules_do(activation):
    """A NaN in x's channel 1 (all its statistics, so all its outputs, are NaN) and one in the residual
    (that output alone): NaN through the fused relu / clipped relu, as through torch's modules."""
    torch.manual_seed(0)
    theirs = NormChain(activation).double().train()
    fused = ot.fuse(copy.deepcopy(theirs))
    assert "FusedBatchNorm2d" in {type(module).__name__ for module in fused.modules()}
    with torch.no_grad():
        for seed in range(2):
            x, z = 3 * torch.randn(2, 4, 3, 5, dtype=torch.float64), torch.randn(2, 4, 3, 5, dtype=torch.float64)
            x[1, 1, 2, seed] = float("nan")
            z[0, 2, 1, 3 - seed] = float("nan")
            expected = theirs(x, z)
            assert expected.isnan().any() and not expected.isnan().all()
            assert_same(fused(x, z), expected)
            torch.testing.assert_close(fused.norm.running_mean, theirs.norm.running_mean, equal_nan=True)


# torch's relu and hardtanh backward formulas, as its CUDA kernels and its CPU kernels' scalar loop
# compute them (the vectorized CPU loop gives hardtanh 0 at NaN): a selection, dy where the
# pre-activation is NaN; the gradient of torch.where is that selection
TORCH_FORMULAS = {
    "relu": nn.ReLU(),
    "relu6": lambda v: torch.where(v <= 0, 0.0, torch.where(v >= 6, 6.0, v)),
}
# x's plane and dtype that take each Triton design: the three passes (35 positions), the one-read
# kernels (32, float32: the one-read backward's)
DESIGNS = {"three-pass": ((5, 7), torch.float64), "one-read": ((4, 8), torch.float32)}


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("activation", [nn.ReLU(), nn.ReLU6()], ids=["relu", "relu6"])
def test_fused_training_batch_norm_gradients_at_nan_are_torchs(activation, backend, design, monkeypatch):
    """A NaN in x's channel 1 (all its pre-activations NaN), one in the residual's channel 2 (that
    pre-activation alone) and one in dy: the gradients of x, the residual and the parameters are
    torch's, whose relu and hardtanh pass dy at a NaN pre-activation (0 there would change dz and
    channel 2's dx)."""
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    plane, dtype = DESIGNS[design]
    torch.manual_seed(0)
    ours = ot.fuse(NormChain(activation).to(dtype).train())
    assert "FusedBatchNorm2d" in {type(module).__name__ for module in ours.modules()}
    theirs = NormChain(TORCH_FORMULAS["relu" if isinstance(activation, nn.ReLU) else "relu6"]).to(dtype).train()
    theirs.norm.load_state_dict(ours.norm.state_dict())
    x, z, dy = (3 * torch.randn(2, 4, *plane, dtype=dtype) for _ in range(3))
    x[1, 1, 2, 3], z[0, 2, 1, 3], dy[0, 3, 0, 0] = float("nan"), float("nan"), float("nan")
    gradients = []
    for model in (ours, theirs):
        x_grad, z_grad = x.clone().requires_grad_(), z.clone().requires_grad_()
        model(x_grad, z_grad).backward(dy)
        gradients.append((x_grad.grad, z_grad.grad, model.norm.weight.grad, model.norm.bias.grad))
    tolerance = {"rtol": 1e-8, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    for mine, reference in zip(*gradients):
        assert torch.equal(mine.isnan(), reference.isnan()) and not reference.isnan().all()
        torch.testing.assert_close(mine, reference, equal_nan=True, **tolerance)
    assert gradients[0][1][0, 2, 1, 3] == dy[0, 2, 1, 3]  # dy passes the NaN pre-activation
