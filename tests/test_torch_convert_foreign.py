"""``opendnn.torch.convert`` on timm's layers: stand-ins with timm's module paths, class names and
forwards (timm is not needed), converted modules against their own unconverted forward in float64,
forward and backward, and the running statistics a batch norm keeps."""

import copy

import pytest
import torch
import torch.nn.functional as TF

import opendnn.torch as ot
from opendnn.core.errors import BadParam


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).norm() / theirs.norm()).item()


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert relative_error(ours, theirs) < 1e-10


def as_timms(cls: type, module: str, name: str) -> type:
    cls.__module__, cls.__name__, cls.__qualname__ = module, name, name
    return cls


# ---- stand-ins: timm 1.0's constructors (trimmed) and forwards --------------------------------------


class BatchNormAct2d(torch.nn.BatchNorm2d):
    def __init__(
        self,
        num_features,
        eps=1e-5,
        momentum=0.1,
        affine=True,
        track_running_stats=True,
        apply_act=True,
        act_layer=torch.nn.ReLU,
        inplace=True,
        drop_layer=None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.drop = drop_layer() if drop_layer is not None else torch.nn.Identity()
        self.act = act_layer(inplace=inplace) if apply_act else torch.nn.Identity()

    def forward(self, x):
        assert x.ndim == 4, f"expected 4D input (got {x.ndim}D input)"
        if self.momentum is None:
            exponential_average_factor = 0.0
        else:
            exponential_average_factor = self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:
                    exponential_average_factor = 1.0 / float(self.num_batches_tracked)
                else:
                    exponential_average_factor = self.momentum
        if self.training:
            bn_training = True
        else:
            bn_training = (self.running_mean is None) and (self.running_var is None)
        x = TF.batch_norm(
            x,
            self.running_mean if not self.training or self.track_running_stats else None,
            self.running_var if not self.training or self.track_running_stats else None,
            self.weight,
            self.bias,
            bn_training,
            exponential_average_factor,
            self.eps,
        )
        x = self.drop(x)
        x = self.act(x)
        return x


class LayerNorm(torch.nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-6, affine=True, fast_norm=False):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)
        self._fast_norm = fast_norm

    def forward(self, x):
        return TF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class LayerNorm2d(torch.nn.LayerNorm):
    def __init__(self, num_channels, eps=1e-6, affine=True, fast_norm=False):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine)
        self._fast_norm = fast_norm

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = TF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class GroupNorm(torch.nn.GroupNorm):
    def __init__(self, num_channels, num_groups=32, eps=1e-5, affine=True, fast_norm=False):
        super().__init__(num_groups, num_channels, eps=eps, affine=affine)
        self._fast_norm = fast_norm

    def forward(self, x):
        return TF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class GroupNorm1(torch.nn.GroupNorm):
    def __init__(self, num_channels, fast_norm=False, **kwargs):
        super().__init__(1, num_channels, **kwargs)
        self._fast_norm = fast_norm

    def forward(self, x):
        return TF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class Linear(torch.nn.Linear):
    def forward(self, input):
        if torch.jit.is_scripting():
            bias = self.bias.to(dtype=input.dtype) if self.bias is not None else None
            return TF.linear(input, self.weight.to(dtype=input.dtype), bias=bias)
        return TF.linear(input, self.weight, self.bias)


SPATIAL_DIMS = {"NCHW": (2, 3), "NHWC": (1, 2), "NCL": (2,), "NLC": (1,)}  # timm's get_spatial_dim


class FastAdaptiveAvgPool(torch.nn.Module):
    def __init__(self, flatten=False, input_fmt="NCHW"):
        super().__init__()
        self.flatten = flatten
        self.dim = SPATIAL_DIMS[input_fmt]

    def forward(self, x):
        return x.mean(self.dim, keepdim=not self.flatten)


as_timms(BatchNormAct2d, "timm.layers.norm_act", "BatchNormAct2d")
for _norm in (LayerNorm, LayerNorm2d, GroupNorm, GroupNorm1):
    as_timms(_norm, "timm.layers.norm", _norm.__name__)
as_timms(Linear, "timm.layers.linear", "Linear")
as_timms(FastAdaptiveAvgPool, "timm.layers.adaptive_avgmax_pool", "FastAdaptiveAvgPool")


# ---- helpers ------------------------------------------------------------------------------------------


def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` in float64 with random parameters and running statistics (none at 0 or 1)."""
    module = module.double()
    with torch.no_grad():
        for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
            if name.endswith("running_var"):
                tensor.uniform_(0.5, 2.0)
            elif tensor.is_floating_point():
                tensor.normal_()
    return module


def converted_pair(module: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module, ot.ConversionReport]:
    """(``module`` as it was, its converted copy, the conversion's report)."""
    ours = copy.deepcopy(module)
    return module, ours, ot.convert(ours)


def assert_same_steps(theirs: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor, steps: int = 2) -> None:
    """Forward and backward ``steps`` times on the same input: outputs, the input's and parameters'
    gradients, and every buffer (running statistics, the batch count) equal. Each call draws the same
    random numbers (a dropout's mask)."""
    for _ in range(steps):
        results = []
        for module in (theirs, ours):
            module.zero_grad()
            given = x.detach().clone().requires_grad_()
            torch.manual_seed(1)
            y = module(given)
            dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(2))
            y.backward(dy)
            results.append((y, given.grad, [p.grad for p in module.parameters()]))
        (y0, dx0, grads0), (y1, dx1, grads1) = results
        assert_close(y1, y0)
        assert_close(dx1, dx0)
        for g1, g0 in zip(grads1, grads0):
            assert_close(g1, g0)
        for (name, b0), (_, b1) in zip(theirs.named_buffers(), ours.named_buffers()):
            if b0.is_floating_point():
                assert_close(b1, b0)
            else:
                assert torch.equal(b1, b0), name


# ---- timm's BatchNormAct2d ------------------------------------------------------------------------------


class TanhAct(torch.nn.Tanh):  # an activation taking timm's inplace argument
    def __init__(self, inplace=False):
        super().__init__()


BATCH_NORM_ACTS = {
    "relu": (torch.nn.ReLU, {}),
    "relu6": (torch.nn.ReLU6, {}),
    "silu": (torch.nn.SiLU, {}),
    "tanh": (TanhAct, {}),
    "identity": (torch.nn.ReLU, {"apply_act": False}),
    "hardswish": (torch.nn.Hardswish, {}),
    "dropout_relu": (torch.nn.ReLU, {"drop_layer": lambda: torch.nn.Dropout(0.5)}),
}
BATCH_NORM_OPTIONS = {
    "default": {},
    "momentum_none": {"momentum": None},
    "no_affine": {"affine": False},
    "no_running_stats": {"track_running_stats": False},
    "eps": {"eps": 1e-3},
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("options", BATCH_NORM_OPTIONS.values(), ids=BATCH_NORM_OPTIONS.keys())
@pytest.mark.parametrize("act", BATCH_NORM_ACTS.values(), ids=BATCH_NORM_ACTS.keys())
def test_timms_batch_norm_act_converts_and_computes_its_forward_and_backward(act, options, training, channels_last):
    act_layer, act_options = act
    torch.manual_seed(0)
    module = randomized(BatchNormAct2d(5, act_layer=act_layer, **act_options, **options)).train(training)
    theirs, ours, report = converted_pair(module)
    assert ("", "BatchNormAct2d") in report.converted
    assert isinstance(ours, BatchNormAct2d) and isinstance(ours, ot.BatchNorm2d)
    x = torch.randn(3, 5, 4, 3, dtype=torch.float64) * 2 + 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    assert_same_steps(theirs, ours, x)


def test_timms_batch_norm_act_report_names_an_activation_opendnn_lacks():
    """The batch norm converts; an activation opendnn has no module for runs as torch's, reported."""
    model = torch.nn.Sequential(BatchNormAct2d(4, act_layer=torch.nn.Hardswish), BatchNormAct2d(4))
    report = ot.convert(model)
    assert report.converted == [("0", "BatchNormAct2d"), ("1", "BatchNormAct2d"), ("1.act", "ReLU")]
    assert report.left_alone == [("0.act", "Hardswish", "no opendnn equivalent")]


def test_timms_batch_norm_act_refuses_a_3d_input_as_it_does():
    _, ours, _ = converted_pair(BatchNormAct2d(4).double())
    with pytest.raises(ValueError, match="expected 4D input"):
        ours(torch.randn(2, 4, 3, dtype=torch.float64))


# ---- timm's norms --------------------------------------------------------------------------------------


NORMS = {
    "layer_norm_2d": (lambda **o: LayerNorm2d(6, **o), (2, 6, 3, 4)),
    "layer_norm_2d_eps": (lambda **o: LayerNorm2d(6, eps=1e-2, **o), (2, 6, 3, 4)),
    "layer_norm_2d_no_affine": (lambda **o: LayerNorm2d(6, affine=False, **o), (2, 6, 3, 4)),
    "group_norm_1": (lambda **o: GroupNorm1(6, **o), (2, 6, 3, 4)),
    "group_norm_1_no_affine": (lambda **o: GroupNorm1(6, affine=False, eps=1e-3, **o), (2, 6, 3, 4)),
    "group_norm": (lambda **o: GroupNorm(6, num_groups=3, **o), (2, 6, 3, 4)),
    "layer_norm": (lambda **o: LayerNorm(4, **o), (2, 3, 5, 4)),
}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
@pytest.mark.parametrize("norm", NORMS.values(), ids=NORMS.keys())
def test_timms_norms_convert_and_compute_their_forward_and_backward(norm, channels_last):
    make, shape = norm
    torch.manual_seed(0)
    theirs, ours, report = converted_pair(randomized(make()))
    assert report.converted == [("", type(theirs).__name__)] and report.left_alone == []
    assert isinstance(ours, type(theirs)) and isinstance(ours, ot.modules.OpendnnModule)
    x = torch.randn(shape, dtype=torch.float64) * 3 + 1
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    assert_same_steps(theirs, ours, x, steps=1)


def test_timms_layer_norm_2d_normalizes_the_channels_of_a_view_keeping_the_input_order():
    torch.manual_seed(0)
    _, ours, _ = converted_pair(randomized(LayerNorm2d(6)))
    for memory_format in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, 6, 3, 4, dtype=torch.float64).to(memory_format=memory_format)
        assert ours(x).is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("make", [LayerNorm2d, LayerNorm, GroupNorm1, lambda c, **o: GroupNorm(c, 2, **o)])
def test_timms_norms_built_with_its_fast_norm_flag_are_left_to_torch(make):
    module = make(4, fast_norm=True)
    report = ot.convert(module)
    assert report.converted == []
    ((name, kind, reason),) = report.left_alone
    assert (name, kind) == ("", type(module).__name__) and "_fast_norm=True" in reason
    assert not isinstance(module, ot.modules.OpendnnModule)


def test_timms_group_norm_1_refuses_one_value_per_group_as_torch_does():
    _, ours, _ = converted_pair(GroupNorm1(1).double())
    with pytest.raises(ValueError, match=r"x.shape=\(1, 1, 1, 1\) gives one value per group"):
        ours(torch.randn(1, 1, 1, 1, dtype=torch.float64))


# ---- timm's Linear and FastAdaptiveAvgPool ---------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_timms_linear_converts_and_computes_its_forward_and_backward(bias):
    torch.manual_seed(0)
    theirs, ours, report = converted_pair(randomized(Linear(5, 3, bias=bias)))
    assert report.converted == [("", "Linear")] and isinstance(ours, ot.Linear) and isinstance(ours, Linear)
    assert_same_steps(theirs, ours, torch.randn(2, 4, 5, dtype=torch.float64), steps=1)


POOL_SHAPES = {"NCHW": (2, 3, 4, 5), "NHWC": (2, 4, 5, 3), "NCL": (2, 3, 7), "NLC": (2, 7, 3)}


@pytest.mark.parametrize("flatten", [False, True], ids=["keepdim", "flatten"])
@pytest.mark.parametrize("input_fmt", [*POOL_SHAPES, "NCHW_channels_last"])
def test_timms_fast_adaptive_avg_pool_converts_and_computes_its_forward_and_backward(input_fmt, flatten):
    layout, _, channels_last = input_fmt.partition("_")
    theirs, ours, report = converted_pair(FastAdaptiveAvgPool(flatten, layout))
    assert report.converted == [("", "FastAdaptiveAvgPool")] and isinstance(ours, FastAdaptiveAvgPool)
    torch.manual_seed(0)
    x = torch.randn(POOL_SHAPES[layout], dtype=torch.float64)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    assert_same_steps(theirs, ours, x, steps=1)


def test_timms_fast_adaptive_avg_pool_refuses_an_input_of_another_rank_naming_it():
    _, ours, _ = converted_pair(FastAdaptiveAvgPool(True, "NCHW"))
    with pytest.raises(BadParam, match=r"x.shape=\(2, 3, 4\) must have 4 dims"):
        ours(torch.randn(2, 3, 4, dtype=torch.float64))


# ---- a model of them: the report, state dicts, copies ------------------------------------------------------


class Net(torch.nn.Module):
    """timm's layers as a ConvNeXt / EfficientNet / PoolFormer stem, stage and head use them."""

    def __init__(self):
        super().__init__()
        self.bn = BatchNormAct2d(3, act_layer=torch.nn.SiLU)
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = LayerNorm2d(8)
        self.mixer = GroupNorm1(8)
        self.pool = FastAdaptiveAvgPool(flatten=True)
        self.fc = Linear(8, 4)

    def forward(self, x):  # (no parameter feeds a norm that would cancel it: every gradient is nonzero)
        x = self.norm(self.stem(self.bn(x)))
        return self.fc(self.pool(x + self.mixer(x)))


def test_a_model_of_timms_layers_converts_whole_keeping_state_dicts_and_copies():
    torch.manual_seed(0)
    theirs, ours, report = converted_pair(randomized(Net()))
    assert report.left_alone == []
    assert report.converted == [
        ("bn", "BatchNormAct2d"),
        ("bn.act", "SiLU"),
        ("stem", "Conv2d"),
        ("norm", "LayerNorm2d"),
        ("mixer", "GroupNorm1"),
        ("pool", "FastAdaptiveAvgPool"),
        ("fc", "Linear"),
    ]
    assert "opendnn.LayerNorm2d" in repr(ours)
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    assert_same_steps(theirs, ours, x)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    fresh = Net().double()
    fresh.load_state_dict(ours.state_dict())
    copied = copy.deepcopy(ours)
    assert [type(m) for m in copied.modules()] == [type(m) for m in ours.modules()]
    ours.eval(), fresh.eval(), copied.eval()
    assert_close(copied(x), fresh(x))
    assert_close(ours(x), fresh(x))
    assert ot.convert(ours).converted == []  # converting twice changes nothing
