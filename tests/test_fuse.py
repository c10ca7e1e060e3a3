"""Inference fusion (opendnn.torch.fuse) and the fused convolution it calls
(opendnn.functional.conv_bias_activation): against torch's own eval-mode model and the float64
reference, on both backends (Triton through its interpreter)."""

import copy
import importlib
import operator

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
import opendnn.torch as ot

BACKENDS = ["numpy", "triton"]


def relative_error(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def conv_bn(c_in, c_out, kernel, stride=1, groups=1, activation=None):
    layers = [
        torch.nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
        torch.nn.BatchNorm2d(c_out),
    ]
    return torch.nn.Sequential(*layers, *([activation] if activation is not None else []))


class Bottleneck(torch.nn.Module):
    """torchvision's ResNet bottleneck: one ReLU module shared by three call sites, ``+=`` identity."""

    def __init__(self, c_in, width, stride):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c_in, width, 1, bias=False), torch.nn.BatchNorm2d(width)
        self.conv2 = torch.nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(width)
        self.conv3, self.bn3 = torch.nn.Conv2d(width, 4 * width, 1, bias=False), torch.nn.BatchNorm2d(4 * width)
        self.relu = torch.nn.ReLU(inplace=True)
        self.downsample = conv_bn(c_in, 4 * width, 1, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += self.downsample(x)
        return self.relu(out)


class InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: conv-bn-relu6, depthwise conv-bn-relu6, projection conv-bn, + x."""

    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Sequential(
            conv_bn(channels, 2 * channels, 1, activation=torch.nn.ReLU6()),
            conv_bn(2 * channels, 2 * channels, 3, groups=2 * channels, activation=torch.nn.ReLU6()),
            conv_bn(2 * channels, channels, 1),
        )

    def forward(self, x):
        return x + self.conv(x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.block = Bottleneck(8, 4, 2)
        self.mobile = InvertedResidual(16)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = self.mobile(self.block(self.stem(x)))
        return self.head(TF.adaptive_avg_pool2d(x, 1).flatten(1))


def _count_fallback_additions(monkeypatch):
    """The residuals a fused convolution adds after the fact (they broadcast or promote), by shape."""
    fuse_module = importlib.import_module("opendnn.torch.fuse")  # (opendnn.torch.fuse is also the function)
    seen = []
    original = fuse_module.add
    monkeypatch.setattr(fuse_module, "add", lambda y, z: seen.append(tuple(z.shape)) or original(y, z))
    return seen


def trained_looking(model, dtype):
    """``model`` in eval mode with batch norms whose statistics and affine parameters are not the
    defaults (a folding that ignored one of them would show)."""
    gen = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            k = module.num_features
            module.running_mean.copy_(torch.randn(k, generator=gen))
            module.running_var.copy_(torch.rand(k, generator=gen) + 0.5)
            if module.affine:
                module.weight.data.copy_(torch.randn(k, generator=gen))
                module.bias.data.copy_(torch.randn(k, generator=gen))
    return model.to(dtype).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("converted", [False, True], ids=["torch_modules", "converted"])
def test_fused_model_matches_the_eval_model(backend, converted, monkeypatch):
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    fallbacks = _count_fallback_additions(monkeypatch)
    dtype = torch.float64 if backend == "numpy" else torch.float32
    torch.manual_seed(0)
    model = trained_looking(Net(), dtype)
    x = torch.randn(2, 3, 12, 12, dtype=dtype).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x)
        if converted:
            ot.convert(model)
        fused = ot.fuse(model)
        got = fused(x)
    kinds = [type(m).__name__ for m in fused.modules()]
    assert kinds.count("FusedConvolution") == 8 and not any("BatchNorm" in k for k in kinds)
    assert relative_error(got, expected) < (1e-10 if dtype is torch.float64 else 1e-5)
    calls = [n for n in fused.graph.nodes if n.op == "call_module" and n.target.endswith("_fused")]
    assert sum(len(n.args) == 2 for n in calls) == 2  # the bottleneck's and the inverted residual's additions
    assert fallbacks == []  # both residuals have the output's shape and dtype: added in the epilogue
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())  # the original is left as it was


def test_fused_parameters_are_cast_once_under_autocast_and_again_after_they_change():
    torch.manual_seed(2)
    model = trained_looking(conv_bn(3, 4, 3, activation=torch.nn.ReLU()), torch.float32)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        fused = ot.fuse(model)
        layer = next(m for m in fused.modules() if type(m).__name__ == "FusedConvolution")
        for scale in (1.0, -0.5):
            layer.weight.mul_(scale)  # in place: the cast kept from the calls before is stale after it
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got = fused(x)
                kept = layer._casts[1]
                assert torch.equal(fused(x), got) and layer._casts[1] is kept
            expected = TF.relu(TF.conv2d(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16(), padding=1))
            assert got.dtype == torch.bfloat16 and relative_error(got, expected) < 1e-2


def test_fusion_folds_bias_and_affine_free_norms_and_leaves_chains_without_a_norm_alone():
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, bias=True),
        torch.nn.BatchNorm2d(4, affine=False),
        torch.nn.Conv2d(4, 4, 1),
        torch.nn.ReLU(),  # no batch norm: stays
        torch.nn.Conv2d(4, 4, 1),
        torch.nn.BatchNorm2d(4),
        torch.nn.Sigmoid(),
    ).double()
    trained_looking(model, torch.float64)
    x = torch.randn(2, 3, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        fused = ot.fuse(model)
        assert relative_error(fused(x), model(x)) < 1e-12
    names = [type(m).__name__ for m in fused.modules()]
    assert names.count("FusedConvolution") == 2 and "Conv2d" in names and "Sigmoid" not in names  # fused too


def test_fuse_refuses_untraceable_models_and_inference_inputs_that_need_gradients():
    model = trained_looking(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)), torch.float32)
    fused = ot.fuse(model.eval())
    with pytest.raises(od.BadParam, match="is for inference"):
        fused(torch.randn(1, 3, 5, 5, requires_grad=True))

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x if x.sum() > 0 else -x

    with pytest.raises(od.NotSupported, match="torch.fx could not trace DataDependent"):
        ot.fuse(DataDependent().eval())


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_fusion_matches_torch_in_outputs_gradients_and_running_statistics(backend, monkeypatch):
    """The fused model (float64 on NumPy, float32 on Triton) against torch's unfused model in float64."""
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    dtype = torch.float64 if backend == "numpy" else torch.float32
    torch.manual_seed(3)
    model = trained_looking(Net(), torch.float64).train()
    fused = ot.fuse(copy.deepcopy(model).to(dtype))
    kinds = [type(m).__name__ for m in fused.modules()]
    # the stem's, bn1 / bn2 (+ relu), bn3 (+ downsample + relu), the inverted residual's three (relu6, relu6, + x)
    assert kinds.count("FusedBatchNorm2d") == 7 and kinds.count("BatchNorm2d") == 1  # the downsample's: an operand
    assert not any(n.op == "call_function" and n.target in (operator.add, operator.iadd) for n in fused.graph.nodes)
    assert list(fused.state_dict()) == list(model.state_dict())
    tolerance = 1e-10 if dtype is torch.float64 else 1e-4
    for _ in range(2):  # the running statistics after two steps
        x = torch.randn(4, 3, 12, 12, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
        x_torch, x_ours = x.clone().requires_grad_(), x.to(dtype).requires_grad_()
        expected, got = model(x_torch), fused(x_ours)
        dy = torch.randn_like(expected)
        expected.backward(dy)
        got.backward(dy.to(dtype))
        assert relative_error(got, expected) < tolerance
        assert relative_error(x_ours.grad, x_torch.grad) < tolerance
    ours = dict(fused.named_parameters())
    for name, parameter in model.named_parameters():
        if parameter.grad.norm() < 1e-6:  # the stem convolution's bias, before a batch norm: zero but for rounding
            assert ours[name].grad.norm() < 1e-4, name
        else:
            assert relative_error(ours[name].grad, parameter.grad) < tolerance, name
    ours = fused.state_dict()
    for name, value in model.state_dict().items():
        assert (
            torch.equal(ours[name], value)
            if value.dtype == torch.int64
            else relative_error(ours[name], value) < tolerance
        ), name
    with torch.no_grad():  # eval mode: the fused batch norms take their steps one by one
        assert relative_error(fused.eval()(x.to(dtype)), model.eval()(x)) < tolerance


def test_training_fusion_under_autocast_adds_a_residual_of_another_dtype_after_the_norm():
    class Block(torch.nn.Module):  # the residual is the float32 input; the norm's input, the bf16 conv output
        def __init__(self):
            super().__init__()
            self.conv, self.norm = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.norm(self.conv(x)) + x)

    torch.manual_seed(4)
    model = Block().train()
    fused = ot.fuse(model)
    assert type(fused.norm).__name__ == "FusedBatchNorm2d" and fused.norm.residual
    x = torch.randn(2, 4, 6, 6)
    x_torch, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, got = model(x_torch), fused(x_ours)
    assert got.dtype == expected.dtype == torch.float32
    assert relative_error(got, expected) < 2e-2
    got.sum().backward()
    expected.sum().backward()
    assert relative_error(x_ours.grad, x_torch.grad) < 2e-2
    assert relative_error(fused.norm.weight.grad, model.norm.weight.grad) < 2e-2


def test_training_fusion_leaves_shared_batch_norms_and_unsupported_options_alone():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.negative_eps = torch.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3, eps=-1e-6)

        def forward(self, x):
            return torch.relu(self.norm(x)) + torch.relu(self.norm(-x)) + torch.relu(self.negative_eps(x))

    fused = ot.fuse(Shared().train())
    assert [type(m).__name__ for m in fused.modules()][1:] == ["BatchNorm2d", "BatchNorm2d"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "activation, coef, reference",
    [
        ("relu", 0.0, torch.relu),
        ("relu6", None, None),
        ("clipped_relu", 6.0, lambda t: t.clamp(0, 6)),
        ("silu", 1.0, TF.silu),
        (None, 0.0, lambda t: t),
    ],
)
def test_conv_bias_activation_matches_torch(backend, activation, coef, reference):
    if activation == "relu6":
        with pytest.raises(od.BadParam, match="activation='relu6' is not a forward activation"):
            F.conv_bias_activation(torch.ones(1, 1, 3, 3), torch.ones(1, 1, 1, 1), activation="relu6")
        return
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 9, 7, generator=gen).contiguous(memory_format=torch.channels_last)
    w, bias = torch.randn(8, 3, 3, 3, generator=gen), torch.randn(8, generator=gen)
    z = torch.randn(2, 8, 5, 4, generator=gen)  # packed NCHW while y follows x (channels-last)
    got = F.conv_bias_activation(
        x,
        w,
        bias,
        z,
        activation,
        coef=coef,
        alpha2=0.5,
        stride=2,
        padding=1,
        groups=2,
        handle=od.create("cpu", backend=backend),
    )
    conv = TF.conv2d(x.double(), w.double(), bias.double(), stride=2, padding=1, groups=2)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(got, reference(conv + 0.5 * z.double())) < 1e-6


class FunctionForms(torch.nn.Module):
    """1-D and 3-D chains, 'same' padding, torch.add and functional relu / relu6, and a sum of a
    batch norm's output with itself (not a residual: left to torch after the fold)."""

    def __init__(self):
        super().__init__()
        self.conv1d, self.bn1d = torch.nn.Conv1d(3, 4, 5, padding="same"), torch.nn.BatchNorm1d(4)
        self.conv3d, self.bn3d = torch.nn.Conv3d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm3d(4)
        self.conv2d, self.bn2d = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4)
        self.strided, self.bn_strided = torch.nn.Conv2d(3, 4, 3, 2, 1, dilation=1), torch.nn.BatchNorm2d(4)

    def forward(self, line, volume, image):
        a = TF.relu(torch.add(self.bn1d(self.conv1d(line)), line[:, :1]), inplace=True)
        b = TF.relu6(self.bn3d(self.conv3d(volume)))
        c = self.bn2d(self.conv2d(image))
        shortcut = TF.avg_pool2d(torch.cat([image, image[:, :1]], 1), 2)  # the strided output's shape
        d = torch.relu(self.bn_strided(self.strided(image)) + shortcut)
        return a.sum() + b.sum() + (c + c).sum() + d.sum()


def test_fusion_of_1d_and_3d_chains_function_forms_and_a_self_sum(monkeypatch):
    fallbacks = _count_fallback_additions(monkeypatch)
    torch.manual_seed(4)
    model = FunctionForms().double()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 1.5)
    model.eval()
    inputs = (
        torch.randn(2, 3, 11, dtype=torch.float64),
        torch.randn(2, 3, 5, 6, 7, dtype=torch.float64),
        torch.randn(2, 3, 8, 8, dtype=torch.float64),
    )
    with torch.no_grad():
        fused = ot.fuse(model)
        assert relative_error(fused(*inputs), model(*inputs)) < 1e-12
    calls = {n.target: len(n.args) for n in fused.graph.nodes if n.op == "call_module"}
    assert calls == {"conv1d_fused": 2, "conv3d_fused": 1, "conv2d_fused": 1, "strided_fused": 2}
    assert [n.target for n in fused.graph.nodes if n.op == "call_function"].count(TF.relu) == 0
    assert fallbacks == [(2, 1, 11)]  # the 1-D chain's residual broadcasts: added after the convolution;
    # the strided chain's has its output's shape (2, 4, 4, 4): added in the epilogue


class SmoothActivations(torch.nn.Module):
    """Conv -> bn -> SiLU / ELU / Softplus and linear -> ELU / softplus / silu chains: each fuses with the
    activation's own coefficient (torch's default where the model gives none)."""

    def __init__(self):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(3, 3, 3, padding=1) for _ in range(4))
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(3) for _ in range(4))
        self.acts = torch.nn.ModuleList(
            [torch.nn.SiLU(), torch.nn.ELU(), torch.nn.ELU(alpha=0.5), torch.nn.Softplus(beta=2.0)]
        )
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(4))

    def forward(self, x):
        for conv, norm, act in zip(self.convs, self.norms, self.acts):
            x = act(norm(conv(x)))
        v = x.mean((2, 3))
        v = TF.elu(self.fcs[0](v))
        v = TF.softplus(self.fcs[1](v), beta=3.0)
        v = TF.silu(self.fcs[2](v))
        return TF.softplus(self.fcs[3](v), threshold=1.0)  # a threshold torch applies: left to torch


def fused_matching_the_model(model_class, input_shape, backend, seed, monkeypatch):
    """``fuse`` of an eval-mode ``model_class()`` on ``backend``, checked against the model on a random
    input (float64 on numpy, float32 on triton)."""
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    dtype = torch.float64 if backend == "numpy" else torch.float32
    torch.manual_seed(seed)
    model = model_class().to(dtype).eval()
    x = torch.randn(*input_shape, dtype=dtype)
    with torch.no_grad():
        fused = ot.fuse(model)
        assert relative_error(fused(x), model(x)) < (1e-12 if dtype is torch.float64 else 1e-5)
    return fused


@pytest.mark.parametrize("backend", BACKENDS)
def test_silu_elu_and_softplus_chains_fuse_with_their_coefficients(backend, monkeypatch):
    fused = fused_matching_the_model(SmoothActivations, (2, 3, 5, 5), backend, 6, monkeypatch)
    names = [type(m).__name__ for m in fused.modules()]
    assert names.count("FusedConvolution") == 4 and names.count("FusedLinear") == 3
    assert [n.target for n in fused.graph.nodes if n.op == "call_function"].count(TF.softplus) == 1


class Mlp(torch.nn.Module):
    """A transformer MLP block: fc1 -> gelu (tanh form), fc2 -> + x; then a head whose SiLU follows a
    linear layer with two users (not fused) and a lone linear layer (nothing to fuse)."""

    def __init__(self, width=12):
        super().__init__()
        self.fc1, self.act, self.fc2 = (
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU("tanh"),
            torch.nn.Linear(4 * width, width),
        )
        self.shared, self.out = torch.nn.Linear(width, width), torch.nn.Linear(width, 3, bias=False)

    def forward(self, x):
        x = x + self.fc2(self.act(self.fc1(x)))
        y = self.shared(x)
        return self.out(TF.silu(y) + y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_chains_fuse_activation_and_residual(backend, monkeypatch):
    fused = fused_matching_the_model(Mlp, (2, 7, 12), backend, 5, monkeypatch)
    calls = {n.target: len(n.args) for n in fused.graph.nodes if n.op == "call_module"}
    assert calls == {"fc1_fused": 1, "fc2_fused": 2, "shared": 1, "out": 1}
    assert [type(m).__name__ for m in fused.modules()].count("FusedLinear") == 2
