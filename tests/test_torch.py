"""opendnn inside PyTorch: autograd Functions, modules, conversion and routed functional calls,
against torch's own modules on the CPU (opendnn's NumPy backend)."""

import copy
import pickle
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as TF
from torch.overrides import TorchFunctionMode

import opendnn.torch as ot
from opendnn.core.errors import BadParam, NotSupported
from opendnn.torch import functions as OF

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours.double() - theirs.double()).norm() / theirs.double().norm()).item()


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype = torch.float64) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert relative_error(ours, theirs) < TOLERANCE[dtype]


# ---- every Function against torch's op, forward and backward, float64 ---------------------------------


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


FUNCTIONS = {
    "conv1d": (
        lambda x, w, b: OF.conv(x, w, b, 1, "same"),
        lambda x, w, b: TF.conv1d(x, w, b, 1, "same"),
        [(2, 3, 9), (4, 3, 3), (4,)],
    ),
    "conv2d_groups_stride": (
        lambda x, w, b: OF.conv(x, w, b, 2, 1, 1, 2),
        lambda x, w, b: TF.conv2d(x, w, b, 2, 1, 1, 2),
        [(2, 4, 7, 6), (6, 2, 3, 3), (6,)],
    ),
    "conv2d_depthwise_dilated": (
        lambda x, w: OF.conv(x, w, None, 1, 2, 2, 4),
        lambda x, w: TF.conv2d(x, w, None, 1, 2, 2, 4),
        [(2, 4, 7, 6), (4, 1, 3, 3)],
    ),
    "conv3d": (
        lambda x, w: OF.conv(x, w, None, 1, 1),
        lambda x, w: TF.conv3d(x, w, None, 1, 1),
        [(2, 3, 4, 5, 4), (4, 3, 3, 3, 3)],
    ),
    "conv_transpose1d": (
        lambda x, w: OF.conv_transpose(x, w, None, 2, 1, 1),
        lambda x, w: TF.conv_transpose1d(x, w, None, 2, 1, 1),
        [(2, 3, 5), (3, 4, 3)],
    ),
    "conv_transpose2d_groups": (
        lambda x, w, b: OF.conv_transpose(x, w, b, 2, 1, 1, 2),
        lambda x, w, b: TF.conv_transpose2d(x, w, b, 2, 1, 1, 2),
        [(2, 4, 5, 4), (4, 3, 3, 3), (6,)],
    ),
    "conv_transpose3d": (
        lambda x, w: OF.conv_transpose(x, w, None, 1, 1),
        lambda x, w: TF.conv_transpose3d(x, w, None, 1, 1),
        [(1, 2, 3, 4, 3), (2, 3, 3, 3, 3)],
    ),
    "conv_transpose2d_output_padding_past_the_stride": (  # below the dilation: x's gradient has fewer positions
        lambda x, w, b: OF.conv_transpose(x, w, b, (1, 2), (2, 1), (2, 1), 1, (3, 1)),
        lambda x, w, b: TF.conv_transpose2d(x, w, b, (1, 2), (2, 1), (2, 1), 1, (3, 1)),
        [(2, 3, 5, 4), (3, 2, 3, 3), (2,)],
    ),
    "linear": (OF.linear, TF.linear, [(2, 5, 4), (3, 4), (3,)]),
    "matmul_broadcast": (OF.matmul, torch.matmul, [(2, 3, 5, 4), (3, 4, 6)]),
    "matmul_transposed": (lambda a, b: OF.matmul(a, b.mT), lambda a, b: a @ b.mT, [(2, 5, 4), (2, 6, 4)]),
    "relu": (OF.relu, torch.relu, [(3, 8)]),
    "relu6": (OF.relu6, TF.relu6, [(3, 8)]),
    "hardtanh": (lambda x: OF.hardtanh(x, -2.0, 3.0), lambda x: TF.hardtanh(x, -2.0, 3.0), [(3, 8)]),
    "gelu": (OF.gelu, TF.gelu, [(3, 8)]),
    "gelu_tanh": (lambda x: OF.gelu(x, "tanh"), lambda x: TF.gelu(x, approximate="tanh"), [(3, 8)]),
    "silu": (OF.silu, TF.silu, [(3, 8)]),
    "sigmoid": (OF.sigmoid, torch.sigmoid, [(3, 8)]),
    "tanh": (OF.tanh, torch.tanh, [(3, 8)]),
    "elu": (lambda x: OF.elu(x, 0.5), lambda x: TF.elu(x, 0.5), [(3, 8)]),
    "softplus": (lambda x: OF.softplus(x, 2.0), lambda x: TF.softplus(x, 2.0), [(3, 8)]),
    "layer_norm": (
        lambda x, w, b: OF.layer_norm(x, (5, 4), w, b),
        lambda x, w, b: TF.layer_norm(x, (5, 4), w, b),
        [(2, 3, 5, 4), (5, 4), (5, 4)],
    ),
    "rms_norm": (lambda x, w: OF.rms_norm(x, (4,), w), lambda x, w: TF.rms_norm(x, (4,), w), [(2, 3, 4), (4,)]),
    "group_norm": (
        lambda x, w, b: OF.group_norm(x, 3, w, b),
        lambda x, w, b: TF.group_norm(x, 3, w, b),
        [(2, 6, 5, 4), (6,), (6,)],
    ),
    "instance_norm": (
        lambda x, w, b: OF.instance_norm(x, w, b),
        lambda x, w, b: TF.instance_norm(x, weight=w, bias=b),
        [(2, 3, 5, 4), (3,), (3,)],
    ),
    "local_response_norm": (
        lambda x: OF.local_response_norm(x, 3, 0.1, 0.75, 1.0),
        lambda x: TF.local_response_norm(x, 3, 0.1, 0.75, 1.0),
        [(2, 6, 4, 3)],
    ),
    "batch_norm_training": (
        lambda x, w, b: OF.batch_norm(x, None, None, w, b, True),
        lambda x, w, b: TF.batch_norm(x, None, None, w, b, True),
        [(4, 3, 5, 2), (3,), (3,)],
    ),
    "batch_norm_1d": (
        lambda x, w, b: OF.batch_norm(x, None, None, w, b, True),
        lambda x, w, b: TF.batch_norm(x, None, None, w, b, True),
        [(6, 3), (3,), (3,)],
    ),
    "max_pool2d_ceil": (
        lambda x: OF.max_pool(x, 3, 2, 1, ceil_mode=True),
        lambda x: TF.max_pool2d(x, 3, 2, 1, ceil_mode=True),
        [(2, 3, 7, 6)],
    ),
    "max_pool2d_dilated": (
        lambda x: OF.max_pool(x, (3, 2), (1, 2), 1, (2, 3), True),
        lambda x: TF.max_pool2d(x, (3, 2), (1, 2), 1, (2, 3), True),
        [(2, 3, 9, 8)],
    ),
    "max_pool3d_with_indices": (
        lambda x: OF.max_pool_with_indices(x, 2, 2, 1, 2, True)[0],
        lambda x: TF.max_pool3d(x, 2, 2, 1, 2, True, True)[0],
        [(1, 2, 5, 6, 4)],
    ),
    "max_pool1d": (lambda x: OF.max_pool(x, 2), lambda x: TF.max_pool1d(x, 2), [(2, 3, 9)]),
    "avg_pool2d_exclude_pad": (
        lambda x: OF.avg_pool(x, 3, 2, 1, False, False),
        lambda x: TF.avg_pool2d(x, 3, 2, 1, False, False),
        [(2, 3, 7, 6)],
    ),
    "avg_pool3d": (lambda x: OF.avg_pool(x, 2), lambda x: TF.avg_pool3d(x, 2), [(1, 2, 4, 4, 5)]),
    "adaptive_avg_pool2d": (
        lambda x: OF.adaptive_pool(x, (3, None)),
        lambda x: TF.adaptive_avg_pool2d(x, (3, None)),
        [(2, 3, 7, 6)],
    ),
    "adaptive_max_pool2d": (
        lambda x: OF.adaptive_pool(x, (4, 3), True),
        lambda x: TF.adaptive_max_pool2d(x, (4, 3)),
        [(2, 3, 7, 6)],
    ),
    "interpolate_bilinear": (
        lambda x: OF.interpolate(x, scale_factor=(1.5, 2.0), mode="bilinear"),
        lambda x: TF.interpolate(x, scale_factor=(1.5, 2.0), mode="bilinear"),
        [(2, 3, 7, 6)],
    ),
    "interpolate_trilinear_aligned": (
        lambda x: OF.interpolate(x, (3, 7, 5), mode="trilinear", align_corners=True),
        lambda x: TF.interpolate(x, (3, 7, 5), mode="trilinear", align_corners=True),
        [(1, 2, 4, 4, 5)],
    ),
    "interpolate_bicubic_aligned": (
        lambda x: OF.interpolate(x, (9, 4), mode="bicubic", align_corners=True),
        lambda x: TF.interpolate(x, (9, 4), mode="bicubic", align_corners=True),
        [(2, 3, 7, 6)],
    ),
    "interpolate_area": (
        lambda x: OF.interpolate(x, (3, 4), mode="area"),
        lambda x: TF.interpolate(x, (3, 4), mode="area"),
        [(2, 3, 7, 6)],
    ),
    "interpolate_nearest_exact1d": (
        lambda x: OF.interpolate(x, 13, mode="nearest-exact"),
        lambda x: TF.interpolate(x, 13, mode="nearest-exact"),
        [(2, 3, 9)],
    ),
    "softmax": (lambda x: OF.softmax(x, 1), lambda x: TF.softmax(x, 1), [(2, 5, 3)]),
    "log_softmax": (lambda x: OF.log_softmax(x, -1), lambda x: TF.log_softmax(x, -1), [(2, 5, 3)]),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_matches_torch_forward_and_backward(name):
    ours, theirs, shapes = FUNCTIONS[name]
    torch.manual_seed(0)
    inputs = [(3 * _randn(*shape) if len(shape) == 2 and k == 0 else _randn(*shape)) for k, shape in enumerate(shapes)]
    mine = [t.clone().requires_grad_() for t in inputs]
    reference = [t.clone().requires_grad_() for t in inputs]
    y, y_reference = ours(*mine), theirs(*reference)
    dy = torch.randn_like(y_reference)
    y.backward(dy)
    y_reference.backward(dy)
    assert_close(y, y_reference)
    for t, t_reference in zip(mine, reference):
        assert_close(t.grad, t_reference.grad)


# (input shape, interpolate's options): every mode, by size and by scale factor
INTERPOLATIONS = [
    ((2, 3, 5, 4), {"size": (9, 7), "mode": "nearest"}),
    ((2, 3, 5, 4), {"scale_factor": 2.0, "mode": "nearest-exact"}),
    ((2, 3, 5, 4), {"scale_factor": 2.0, "mode": "bilinear", "align_corners": False}),
    ((2, 3, 5, 4), {"size": (9, 7), "mode": "bilinear", "align_corners": True}),
    ((2, 3, 5, 4), {"scale_factor": (1.5, 2.0), "mode": "bicubic"}),
    ((1, 2, 3, 4, 5), {"size": (5, 6, 4), "mode": "trilinear", "align_corners": True}),
    ((2, 3, 7, 6), {"size": (3, 4), "mode": "area"}),
    ((2, 3, 8, 6), {"scale_factor": 0.5, "mode": "area"}),
]


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
@pytest.mark.parametrize("shape, options", INTERPOLATIONS, ids=[str(options) for _, options in INTERPOLATIONS])
def test_interpolate_keeps_no_tensor_of_the_inputs_size_and_its_gradient_is_torchs_in_the_inputs_order(
    shape, options, channels_last, backend, monkeypatch
):
    """The gradient needs the input's shape and memory order alone, as torch's upsample backward: a
    training step does not keep the input alive until the backward."""
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    torch.manual_seed(0)
    x = _randn(*shape)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)
    mine, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = OF.interpolate(mine, **options)
    assert [t.shape for t in saved if t.numel() >= x.numel()] == []
    y_reference = TF.interpolate(reference, **options)
    dy = torch.randn_like(y_reference)
    y.backward(dy)
    y_reference.backward(dy)
    torch.testing.assert_close(y, y_reference)
    torch.testing.assert_close(mine.grad, reference.grad)
    assert mine.grad.stride() == x.stride()


def test_batch_norm_in_eval_mode_has_frozen_statistics_gradients():
    torch.manual_seed(0)
    x, weight, bias = _randn(4, 3, 5, 2), _randn(3), _randn(3)
    mean, var = _randn(3), torch.rand(3, dtype=torch.float64) + 0.5
    mine = [t.clone().requires_grad_() for t in (x, weight, bias)]
    reference = [t.clone().requires_grad_() for t in (x, weight, bias)]
    y = OF.batch_norm(mine[0], mean, var, mine[1], mine[2], training=False)
    y_reference = TF.batch_norm(reference[0], mean, var, reference[1], reference[2], training=False)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_reference.backward(dy)
    assert_close(y, y_reference)
    for t, t_reference in zip(mine, reference):
        assert_close(t.grad, t_reference.grad)


def test_gradients_come_from_opendnn_functions_not_torch_autograd():
    model = ot.modules.Linear(4, 3)
    y = ot.functions.softmax(ot.functions.relu(model(torch.randn(2, 4))), -1)
    names, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        names.add(type(node).__name__)
        stack += [child for child, _ in node.next_functions if child is not None]
    assert names == {"SoftmaxBackward", "ActivationBackward", "LinearBackward", "AccumulateGrad"}


# ---- torch.autograd's checks on tiny float64 inputs -----------------------------------------------------

# name: (the opendnn call, its inputs' shapes): every family, small enough for finite differences
TINY = {
    "conv2d": (lambda x, w, b: OF.conv(x, w, b, 2, 1), [(2, 3, 5, 4), (4, 3, 3, 3), (4,)]),
    "conv1d_grouped": (lambda x, w: OF.conv(x, w, None, 1, 1, 1, 2), [(2, 4, 5), (4, 2, 3)]),
    "conv3d_depthwise": (lambda x, w, b: OF.conv(x, w, b, 1, 1, 1, 2), [(1, 2, 3, 3, 3), (2, 1, 2, 2, 2), (2,)]),
    "conv_transpose2d": (lambda x, w, b: OF.conv_transpose(x, w, b, 2, 1, 1, 2), [(2, 4, 3, 3), (4, 2, 3, 3), (4,)]),
    "linear": (OF.linear, [(2, 3, 5), (4, 5), (4,)]),
    "matmul_broadcast": (OF.matmul, [(2, 1, 3, 4), (3, 4, 2)]),
    "max_pool2d_ceil": (lambda x: OF.max_pool(x, 3, 2, 1, ceil_mode=True), [(2, 2, 6, 5)]),
    "max_pool1d_with_indices": (lambda x: OF.max_pool_with_indices(x, 2, 1, 1, 2)[0], [(2, 2, 7)]),
    "avg_pool3d_ceil": (lambda x: OF.avg_pool(x, 2, 1, 0, True), [(1, 2, 3, 4, 3)]),
    "adaptive_max_pool2d": (lambda x: OF.adaptive_pool(x, (3, 2), True), [(2, 2, 7, 5)]),
    "interpolate_bicubic": (lambda x: OF.interpolate(x, scale_factor=1.5, mode="bicubic"), [(1, 2, 3, 4)]),
    "softmax": (lambda x: OF.softmax(x, 1), [(2, 4, 3)]),
    "log_softmax": (lambda x: OF.log_softmax(x, -1), [(2, 3, 4)]),
    "gelu": (OF.gelu, [(3, 5)]),
    "elu": (lambda x: OF.elu(x, 0.7), [(3, 5)]),
    "batch_norm_training": (lambda x, w, b: OF.batch_norm(x, None, None, w, b, True), [(3, 2, 2, 3), (2,), (2,)]),
    "batch_norm_eval": (
        lambda x, w, b: OF.batch_norm(
            x, torch.full((2,), 0.1, dtype=torch.float64), torch.ones(2, dtype=torch.float64), w, b
        ),
        [(3, 2, 4), (2,), (2,)],
    ),
    "layer_norm": (lambda x, w, b: OF.layer_norm(x, (3, 4), w, b), [(2, 3, 4), (3, 4), (3, 4)]),
    "rms_norm": (lambda x, w: OF.rms_norm(x, (4,), w, 1e-5), [(2, 3, 4), (4,)]),
    "group_norm": (lambda x, w, b: OF.group_norm(x, 2, w, b), [(2, 4, 3), (4,), (4,)]),
    "instance_norm": (lambda x, w, b: OF.instance_norm(x, w, b), [(2, 3, 2, 3), (3,), (3,)]),
    "local_response_norm": (lambda x: OF.local_response_norm(x, 3, 0.1, 0.75, 1.0), [(2, 5, 2, 3)]),
    "attention": (ot.attention.scaled_dot_product_attention, [(1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)]),
}


@pytest.mark.parametrize("name", TINY)
def test_gradcheck_passes_with_every_input_and_with_each_alone(name):
    """Finite differences against the gradients, and torch's check that a backward given no output
    gradient (None, as a node downstream may pass) gives none or zeros."""
    call, shapes = TINY[name]
    torch.manual_seed(0)
    inputs = [_randn(*shape) for shape in shapes]
    masks = [[True] * len(inputs)] + (
        [[k == j for j in range(len(inputs))] for k in range(len(inputs))] if len(inputs) > 1 else []
    )
    for mask in masks:
        assert torch.autograd.gradcheck(call, [t.clone().requires_grad_(m) for t, m in zip(inputs, mask)])


@pytest.mark.parametrize("name", TINY)
def test_a_second_derivative_is_torchs_or_refused_naming_the_backward_operator(name):
    """gradgradcheck either passes or stops at an opendnn backward operator, which has no gradient:
    never a second derivative silently zero or detached."""
    call, shapes = TINY[name]
    torch.manual_seed(0)
    inputs = [_randn(*shape).requires_grad_() for shape in shapes]
    try:
        torch.autograd.gradgradcheck(call, inputs)
    except NotSupported as refusal:
        assert isinstance(refusal, RuntimeError)
        assert re.fullmatch(r"opendnn::\w+_backward\w* has no gradient: .*", str(refusal))


@pytest.mark.parametrize("name", ["conv2d", "linear", "max_pool2d_ceil", "gelu", "layer_norm", "attention"])
def test_a_forward_mode_derivative_is_refused_naming_the_operator(name):
    """torch.func.jvp and torch.autograd.forward_ad: the gradients are reverse-mode only, and a
    kernel given a dual tensor would compute on its primal and drop the tangent without a word."""
    call, shapes = TINY[name]
    torch.manual_seed(0)
    inputs = [_randn(*shape) for shape in shapes]
    tangents = [torch.randn_like(t) for t in inputs]
    refusal = r"^opendnn::\w+ has no forward-mode derivative"
    with pytest.raises(NotImplementedError, match=refusal) as error:
        torch.func.jvp(call, tuple(inputs), tuple(tangents))
    assert isinstance(error.value, NotSupported)
    with torch.autograd.forward_ad.dual_level(), pytest.raises(NotSupported, match=refusal):
        call(torch.autograd.forward_ad.make_dual(inputs[0], tangents[0]), *inputs[1:])


def test_a_backward_given_no_output_gradient_gives_no_input_gradient():
    """A downstream node that passes None (here a Function whose backward gives none): torch's
    operators give their inputs none; so do opendnn's, rather than failing on the None."""

    class Cut(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, other):
            return other.clone()

        @staticmethod
        def backward(ctx, grad):
            return None, grad

    x, w = _randn(2, 3, 4, 4).requires_grad_(), _randn(4, 3, 3, 3).requires_grad_()
    other = _randn(2).requires_grad_()
    for call in (lambda: OF.conv(x, w), lambda: OF.relu(x), lambda: OF.layer_norm(x, (4,))):
        Cut.apply(call(), other).sum().backward()
        assert x.grad is None and w.grad is None and torch.equal(other.grad, torch.ones(2, dtype=torch.float64))
        other.grad = None


@pytest.mark.parametrize(
    "ours, theirs, shapes",
    [
        (OF.linear, TF.linear, [(2, 3, 5), (0, 5), (0,)]),
        (OF.linear, TF.linear, [(2, 5), (0, 5)]),
        (OF.matmul, torch.matmul, [(2, 3, 5), (2, 5, 0)]),
    ],
    ids=["linear_bias", "linear", "matmul"],
)
def test_a_product_with_no_output_features_gives_torchs_empty_result_and_gradients(ours, theirs, shapes):
    mine = [_randn(*shape).requires_grad_() for shape in shapes]
    reference = [t.detach().clone().requires_grad_() for t in mine]
    y, y_reference = ours(*mine), theirs(*reference)
    assert y.shape == y_reference.shape
    y.sum().backward()
    y_reference.sum().backward()
    for t, t_reference in zip(mine, reference, strict=True):
        assert torch.equal(t.grad, t_reference.grad)


NO_INPUT_CHANNEL = {  # (call, x's shape, weight's shape): three output channels each
    "conv1d": (lambda x, w, b: OF.conv(x, w, b, 2, 0), (2, 0, 7), (3, 0, 3)),
    "conv2d": (lambda x, w, b: OF.conv(x, w, b, 1, 1), (2, 0, 5, 5), (3, 0, 3, 3)),
    "conv3d": (lambda x, w, b: OF.conv(x, w, b, 1, 1), (1, 0, 3, 4, 3), (3, 0, 3, 3, 3)),
    "conv_transpose2d": (lambda x, w, b: OF.conv_transpose(x, w, b, 2, 1), (2, 0, 4, 4), (0, 3, 3, 3)),
}


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("name", NO_INPUT_CHANNEL)
def test_a_convolution_of_no_input_channel_has_empty_input_and_weight_gradients(name, backend, monkeypatch):
    """Each output is the empty sum plus the bias, so the bias's gradient is dy's sum; x and the
    weight get gradients of their shapes, of no element. (torch's CPU convolution returns an
    output of no channel instead, and a zero bias gradient: docs/differences.md.)"""
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    call, x_shape, w_shape = NO_INPUT_CHANNEL[name]
    x, w, b = (_randn(*shape).requires_grad_() for shape in (x_shape, w_shape, (3,)))
    y = call(x, w, b)
    bias = b.detach().view(1, 3, *[1] * (y.ndim - 2))
    assert torch.equal(y, bias.expand(y.shape))
    dy = _randn(*y.shape)
    y.backward(dy)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    torch.testing.assert_close(b.grad, dy.sum([0, *range(2, dy.ndim)]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_a_converted_conv2d_of_no_input_channel_trains(backend, monkeypatch):
    monkeypatch.setenv("OPENDNN_BACKEND", backend)
    with warnings.catch_warnings():  # torch's initialization of the empty weight warns it does nothing
        warnings.simplefilter("ignore", UserWarning)
        module = torch.nn.Conv2d(0, 3, 3, padding=1).double()
    ot.convert(module)
    x = _randn(2, 0, 5, 5).requires_grad_()
    for _ in range(2):  # the second call replays what the first recorded
        y = module(x)
        assert torch.equal(y, module.bias.detach().view(1, 3, 1, 1).expand(2, 3, 5, 5))
        dy = _randn(*y.shape)
        y.backward(dy)
        assert x.grad.shape == x.shape and module.weight.grad.shape == module.weight.shape
        torch.testing.assert_close(module.bias.grad, dy.sum((0, 2, 3)), rtol=1e-12, atol=1e-12)
        module.zero_grad()


# ---- converted models against torch's ------------------------------------------------------------------


class SmallCNN(torch.nn.Sequential):
    def __init__(self) -> None:
        super().__init__(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(inplace=True),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.AvgPool2d(2),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(8, 10),
            torch.nn.LogSoftmax(dim=1),
        )


class TransformerBlock(torch.nn.Module):
    """Pre-norm self-attention and MLP: linear, layer norm, gelu, softmax attention via matmul."""

    def __init__(self, width: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.softmax = torch.nn.Softmax(dim=-1)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attention = self.softmax(torch.matmul(q, k.transpose(-1, -2)) / (width // self.heads) ** 0.5)
        mixed = torch.matmul(attention, v).transpose(1, 2).reshape(batch, length, width)
        x = x + self.proj(mixed)
        return x + self.mlp(self.norm2(x))


def _parity(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype, routed: bool = False) -> ot.ConversionReport:
    """Convert a copy of model, run both on x, and compare outputs, input gradients and parameter gradients."""
    torch_model = model.to(dtype)
    ours = copy.deepcopy(torch_model)
    report = ot.convert(ours)
    x_ours, x_torch = (x.to(dtype).detach().clone().requires_grad_() for _ in range(2))
    y_torch = torch_model(x_torch)
    if routed:
        with ot.functional_calls() as calls:
            y_ours = ours(x_ours)
        assert calls.routed["matmul"] == 2
    else:
        y_ours = ours(x_ours)
    dy = torch.randn_like(y_torch)
    y_ours.backward(dy)
    y_torch.backward(dy)
    assert_close(y_ours, y_torch, dtype)
    assert_close(x_ours.grad, x_torch.grad, dtype)
    for (name, p_ours), (_, p_torch) in zip(ours.named_parameters(), torch_model.named_parameters()):
        assert relative_error(p_ours.grad, p_torch.grad) < TOLERANCE[dtype], name
    return report


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_converted_cnn_matches_torch(dtype):
    torch.manual_seed(0)
    report = _parity(SmallCNN(), torch.randn(4, 3, 12, 12), dtype)
    assert [kind for _, kind in report.converted] == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "BatchNorm2d",
        "ReLU",
        "AvgPool2d",
        "AdaptiveAvgPool2d",
        "Linear",
        "LogSoftmax",
    ]
    assert report.left_alone == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("routed", [False, True], ids=["modules", "modules+matmul"])
def test_converted_transformer_block_matches_torch(dtype, routed):
    torch.manual_seed(0)
    report = _parity(TransformerBlock(), torch.randn(2, 5, 16), dtype, routed)
    assert sorted(kind for _, kind in report.converted) == [
        "GELU",
        "LayerNorm",
        "LayerNorm",
        "Linear",
        "Linear",
        "Linear",
        "Linear",
        "Softmax",
    ]


def test_channels_last_model_and_input_match_torch_and_stay_channels_last():
    torch.manual_seed(0)
    model = SmallCNN().to(memory_format=torch.channels_last)
    ours = copy.deepcopy(model)
    ot.convert(ours)
    x = torch.randn(4, 3, 12, 12).to(memory_format=torch.channels_last)
    seen = []
    ours[0].register_forward_hook(lambda module, inputs, output: seen.append(output))
    x_ours, x_torch = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours(x_ours).sum().backward()
    model(x_torch).sum().backward()
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    assert relative_error(ours(x), model(x)) < 1e-5
    assert relative_error(x_ours.grad, x_torch.grad) < 1e-5
    assert relative_error(ours[0].weight.grad, model[0].weight.grad) < 1e-5


def test_no_grad_builds_no_graph_and_still_updates_running_statistics():
    torch.manual_seed(0)
    model = SmallCNN()
    ours = copy.deepcopy(model)
    ot.convert(ours)
    x = torch.randn(4, 3, 12, 12, requires_grad=True)
    with torch.no_grad():
        y, y_torch = ours(x), model(x)
    assert y.grad_fn is None and not y.requires_grad
    assert relative_error(y, y_torch) < 1e-5
    assert int(ours[4].num_batches_tracked) == 1
    assert relative_error(ours[4].running_var, model[4].running_var) < 1e-6


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_running_statistics_follow_torch_in_train_and_eval(momentum):
    torch.manual_seed(0)
    theirs = torch.nn.BatchNorm1d(3, momentum=momentum).double()
    ours = ot.BatchNorm1d(3, momentum=momentum).double()
    ours.load_state_dict(theirs.state_dict())
    for _ in range(3):
        x = 2 + 3 * _randn(6, 3, 4)
        assert_close(ours(x), theirs(x))
    for name in ("running_mean", "running_var"):
        assert_close(getattr(ours, name), getattr(theirs, name))
    assert int(ours.num_batches_tracked) == 3
    ours.eval()
    theirs.eval()
    before = ours.running_mean.clone()
    x = _randn(5, 3, 4)
    assert_close(ours(x), theirs(x))
    assert torch.equal(ours.running_mean, before) and int(ours.num_batches_tracked) == 3


@pytest.mark.parametrize("eps", [1e-6, 1e-9])
def test_batch_norm_of_an_epsilon_below_1e_5_converts_and_matches_torch(eps):
    theirs = torch.nn.BatchNorm2d(3, eps=eps).double()
    ours = copy.deepcopy(theirs)
    assert ot.convert(ours).converted == [("", "BatchNorm2d")]
    values = _randn(4, 3, 2, 5)
    values[:, 1] = 5 + 1e-5 * values[:, 1]  # a channel of a variance 1e-5 would dwarf
    x, x_ours = values.clone().requires_grad_(), values.clone().requires_grad_()
    gradient = _randn(4, 3, 2, 5)
    for model, inputs in ((theirs, x), (ours, x_ours)):
        model(inputs).backward(gradient)
    assert_close(ours(x_ours), theirs(x))
    assert_close(x_ours.grad, x.grad)
    assert_close(ours.weight.grad, theirs.weight.grad)
    assert_close(ours.running_var, theirs.running_var)


def test_batch_norm_without_running_statistics_uses_batch_statistics_in_eval():
    theirs = torch.nn.BatchNorm2d(3, track_running_stats=False).double().eval()
    ours = copy.deepcopy(theirs)
    ot.convert(ours)
    x = _randn(4, 3, 2, 5)
    assert_close(ours(x), theirs(x))


def test_state_dict_round_trip_between_torch_and_opendnn_modules():
    torch.manual_seed(0)
    theirs = SmallCNN()
    theirs(torch.randn(4, 3, 12, 12))  # running statistics away from their initial values
    ours = torch.nn.Sequential(
        ot.Conv2d(3, 8, 3, padding=1),
        ot.ReLU(inplace=True),
        ot.MaxPool2d(2),
        ot.Conv2d(8, 8, 3, padding=1, groups=2, bias=False),
        ot.BatchNorm2d(8),
        ot.ReLU(),
        ot.AvgPool2d(2),
        ot.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        ot.Linear(8, 10),
        ot.LogSoftmax(dim=1),
    )
    ours.load_state_dict(theirs.state_dict())
    back = SmallCNN()
    back.load_state_dict(ours.state_dict())
    for (key, value), (key_back, value_back) in zip(theirs.state_dict().items(), back.state_dict().items()):
        assert key == key_back and torch.equal(value, value_back)
    x = torch.randn(2, 3, 12, 12)
    ours.eval()
    theirs.eval()
    assert relative_error(ours(x), theirs(x)) < 1e-5


def test_convert_keeps_objects_parameters_and_training_state():
    model = SmallCNN().eval()
    parameters = list(model.parameters())
    conv = model[0]
    ot.convert(model)
    assert model[0] is conv and isinstance(conv, ot.Conv2d) and not conv.training
    assert all(a is b for a, b in zip(parameters, model.parameters()))
    assert "opendnn.Conv2d" in repr(model)
    assert ot.convert(model).converted == []  # converting twice changes nothing


def test_convert_reports_what_it_left_to_torch_and_why():
    class Custom(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding_mode="reflect"),
        torch.nn.Conv2d(3, 4, 4, padding="same"),
        torch.nn.AdaptiveMaxPool2d(2, return_indices=True),
        torch.nn.LocalResponseNorm(4),
        torch.nn.Softplus(threshold=5),
        torch.nn.PReLU(),
        Custom(3, 3),
        torch.nn.Dropout(),
        torch.nn.InstanceNorm2d(3, track_running_stats=True),
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ConvTranspose1d(3, 3, 2, dilation=2, output_padding=1),
    )
    report = ot.convert(model)
    reasons = {name: reason for name, _, reason in report.left_alone}
    assert report.converted == [("4", "Softplus"), ("9", "Conv2d")]
    assert "output_padding[0]=1 with padding[0]=0 and stride[0]=1" in reasons["10"]
    assert "padding_mode='reflect'" in reasons["0"] and "asymmetrically" in reasons["1"]
    assert "return_indices" in reasons["2"] and "even" in reasons["3"]
    assert reasons["5"] == "no opendnn equivalent" and "subclass" in reasons["6"]
    assert "track_running_stats" in reasons["8"] and "7" not in reasons
    assert "padding_mode='reflect'" in str(report)


def test_convert_does_not_report_an_empty_sequential():
    class Branches(torch.nn.Module):  # as torchvision's ShuffleNet unit of stride 1: one branch passes through
        def __init__(self):
            super().__init__()
            self.branch1 = torch.nn.Sequential()
            self.branch2 = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 1), torch.nn.ReLU())

        def forward(self, x):
            return torch.cat((self.branch1(x), self.branch2(x)), 1)

    model = Branches().double()
    ours = copy.deepcopy(model)
    report = ot.convert(ours)
    assert report.left_alone == []
    assert report.converted == [("branch2.0", "Conv2d"), ("branch2.1", "ReLU")]
    x = torch.randn(2, 2, 3, 3, dtype=torch.float64)
    assert_close(ours(x), model(x), torch.float64)


class Conv3DSimple(torch.nn.Conv3d):
    """As torchvision's video models define it: a constructor and a static helper of its own."""

    def __init__(self, in_planes, out_planes, stride=1):
        super().__init__(in_planes, out_planes, (3, 3, 3), stride, 1, bias=False)

    @staticmethod
    def get_downsample_stride(stride):
        return stride, stride, stride


def test_a_subclass_that_overrides_nothing_converts_and_keeps_its_type_helpers_and_pickling():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv3DSimple(3, 4), torch.nn.BatchNorm3d(4), Conv3DSimple(4, 2, stride=2))
    model = model.double()
    ours = copy.deepcopy(model)
    report = ot.convert(ours)
    assert report.converted == [("0", "Conv3DSimple"), ("1", "BatchNorm3d"), ("2", "Conv3DSimple")]
    assert report.left_alone == []
    conv = ours[0]
    assert isinstance(conv, Conv3DSimple) and isinstance(conv, ot.Conv3d) and type(conv) is type(ours[2])
    assert conv.get_downsample_stride(2) == (2, 2, 2)
    x = torch.randn(2, 3, 4, 6, 6, dtype=torch.float64)
    assert_close(ours(x), model(x), torch.float64)
    restored = pickle.loads(pickle.dumps(ours))
    assert type(restored[0]) is type(conv) and type(copy.deepcopy(ours)[2]) is type(conv)
    assert_close(restored(x), model(x), torch.float64)


class TimmGELU(torch.nn.Module):
    """As timm's layers.activations defines GELU: F.gelu, with a dummy inplace argument."""

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, input):
        return torch.nn.functional.gelu(input)


class TimmGELUTanh(TimmGELU):
    def forward(self, input):
        return torch.nn.functional.gelu(input, approximate="tanh")


TimmGELU.__module__ = TimmGELUTanh.__module__ = "timm.layers.activations"
TimmGELU.__name__ = TimmGELU.__qualname__ = "GELU"
TimmGELUTanh.__name__ = TimmGELUTanh.__qualname__ = "GELUTanh"


def test_timms_gelu_modules_convert_keeping_their_type():
    """timm's GELU modules are F.gelu (ConvNeXt's activation): they convert, not reported as having
    no opendnn equivalent; a subclass that may compute something else stays torch's."""

    class Scaled(TimmGELU):
        def forward(self, input):
            return 2 * super().forward(input)

    torch.manual_seed(0)
    model = torch.nn.Sequential(TimmGELU(), TimmGELUTanh(inplace=True), Scaled())
    x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    expected = model(x)
    report = ot.convert(model)
    assert report.converted == [("0", "GELU"), ("1", "GELUTanh")]
    assert report.left_alone == [("2", "Scaled", "no opendnn equivalent")]
    assert isinstance(model[0], TimmGELU) and isinstance(model[1], TimmGELUTanh) and isinstance(model[1], ot.GELU)
    assert (model[0].approximate, model[1].approximate) == ("none", "tanh")
    x.requires_grad_()
    assert_close(model(x), expected, torch.float64)
    (gradient,) = torch.autograd.grad((model[0](x) + model[1](x)).sum(), x)
    reference = torch.nn.functional.gelu(x) + torch.nn.functional.gelu(x, approximate="tanh")
    assert_close(gradient, torch.autograd.grad(reference.sum(), x)[0], torch.float64)
    copied = copy.deepcopy(model)
    assert type(copied[1]) is type(model[1])
    assert_close(copied(x), expected, torch.float64)


def test_converting_timms_gelu_twice_changes_nothing():
    """A converted class of another library's has that class's module and name: converting again
    leaves it as it is (no class built in front of the converted one)."""
    model = torch.nn.Sequential(TimmGELU(), TimmGELUTanh(), torch.nn.ReLU())
    first = ot.convert(model)
    kinds = [type(m) for m in model]
    second = ot.convert(model)
    assert second.converted == [] and second.left_alone == [] and [type(m) for m in model] == kinds
    assert len(first.converted) == 3
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    assert_close(model[0](x), torch.nn.functional.gelu(x), torch.float64)


def test_module_constructor_refuses_options_opendnn_does_not_cover():
    with pytest.raises(NotSupported, match="padding_mode='circular'"):
        ot.Conv2d(3, 4, 3, padding_mode="circular")
    with pytest.raises(NotSupported, match="return_indices=True"):
        ot.AdaptiveMaxPool2d(2, return_indices=True)


def test_conv_refuses_a_padding_string_it_does_not_know():
    with pytest.raises(BadParam, match="padding='full' must be 'valid', 'same'"):
        ot.functions.conv(_randn(1, 3, 5, 5), _randn(4, 3, 3, 3), padding="full")


def test_modules_take_unbatched_inputs_and_transposed_output_size():
    x = _randn(3, 9)
    conv = ot.Conv1d(3, 4, 3).double()
    assert_close(conv(x), torch.nn.Conv1d.forward(conv, x))
    up = ot.ConvTranspose2d(3, 2, 3, stride=2).double()
    x = _randn(1, 3, 4, 4)
    assert_close(up(x, output_size=[10, 10]), torch.nn.ConvTranspose2d.forward(up, x, output_size=[10, 10]))


def test_functional_calls_route_to_opendnn_and_leave_the_rest_to_torch():
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64, requires_grad=True)
    with ot.functional_calls() as calls:
        y = TF.adaptive_avg_pool2d(TF.relu(x), 2)
        z = TF.relu(y.clone(), inplace=True)
    assert calls.routed == {"relu": 1, "adaptive_avg_pool2d": 1}
    assert calls.left_to_torch == {"relu": "inplace=True"}
    z.sum().backward()
    expected = torch.autograd.grad(TF.adaptive_avg_pool2d(TF.relu(x), 2).sum(), x)[0]
    assert_close(x.grad, expected)


def test_a_torch_function_mode_sees_no_torch_call_of_an_opendnn_module():
    """opendnn's modules run their host path (views, data pointers, allocations) with torch function
    modes off: a mode around a converted model, as functional_calls is, would intercept each call."""

    class Recorder(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).double()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    expected = model(x)
    ot.convert(model)
    with Recorder() as recorder:
        y = model(x)
        y.sum()  # the mode is in force again after the module
    assert recorder.seen == ["sum"]
    assert_close(y, expected)


def test_autocast_runs_products_in_bfloat16_like_torch():
    torch.manual_seed(0)
    model = SmallCNN()
    ours = copy.deepcopy(model)
    ot.convert(ours)
    x = torch.randn(2, 3, 12, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, first_torch = ours[0](x), model[0](x)
        y, y_torch = ours(x), model(x)
    assert first.dtype == first_torch.dtype == torch.bfloat16
    assert y.dtype == y_torch.dtype
    assert relative_error(y, y_torch) < 2e-2


@pytest.mark.parametrize("shape", [(2, 4, 7), (2, 4, 5, 6), (2, 4, 3, 5, 6)])
def test_local_response_norm_under_cpu_autocast_keeps_torchs_dtype(shape):
    """torch's composition comes out in float32 under CPU autocast (its 3-D average pooling) but keeps a
    bfloat16 input's dtype over one spatial dim (its 2-D pooling): opendnn's operator gives the same."""
    x = torch.randn(shape).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ot.functions.local_response_norm(x, 3).dtype == TF.local_response_norm(x, 3).dtype


def test_importing_opendnn_does_not_import_opendnn_torch():
    code = "import sys, opendnn; print('opendnn.torch' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == [
        "False",
        "False",
    ]


def test_outputs_can_be_updated_in_place_like_torchs():
    """ResNet's ``out += identity`` after a batch norm: opendnn's Functions return tensors, never
    views (autograd forbids in-place updates of a view a custom Function returned); EfficientNet's
    in-place dropout after its adaptive average pooling: that backward keeps no output to invalidate."""
    import opendnn.torch as ot

    x = torch.randn(2, 4, 6, 6, dtype=torch.float64, requires_grad=True)
    layers = [
        ot.Conv2d(4, 4, 3, padding=1).double(),
        ot.BatchNorm2d(4).double(),
        ot.ReLU(),
        ot.GELU(),
        ot.AvgPool2d(2),
        ot.AdaptiveAvgPool2d(2),
        ot.LayerNorm(6).double(),
    ]
    for layer in layers:
        out = layer(x)
        out += 1.0
        out.sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
        x.grad = None


def test_linear_over_many_tokens_trains_like_torch_with_its_weight_gradient_split_along_k(monkeypatch):
    """A linear layer over (2, 300, 8) on the Triton kernels: its forward and data gradient one product
    of 600 rows, its weight gradient (K = 600 tokens, one tile) split along K into partials added in a
    fixed order. Three steps, the later ones replayed, against torch in float64."""
    from opendnn.families.matmul import triton_backend as kernels

    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    planned = []
    launch_plan = kernels.launch_plan

    def recording(*args, **options):
        plan = launch_plan(*args, **options)
        planned.append(tuple(type(launch).__name__ for launch, _ in plan.launches))
        return plan

    monkeypatch.setattr(kernels, "launch_plan", recording)
    torch.manual_seed(0)
    theirs = torch.nn.Linear(8, 8).double()
    ours = ot.Linear(8, 8).double()
    ours.load_state_dict(theirs.state_dict())
    for _ in range(3):
        x = torch.randn(2, 300, 8, dtype=torch.float64)
        mine, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours(mine).square().sum().backward()
        theirs(reference).square().sum().backward()
        assert_close(mine.grad, reference.grad)
        assert_close(ours.weight.grad, theirs.weight.grad)
        assert_close(ours.bias.grad, theirs.bias.grad)
        ours.zero_grad()
        theirs.zero_grad()
    assert ("Launches",) in planned  # the weight gradient: products into partials, then their sum


@pytest.mark.parametrize(
    "shape, wider_shape, make, call",
    [
        ((2, 3, 1), (2, 3, 2), lambda: torch.nn.InstanceNorm1d(3, affine=True), lambda x: TF.instance_norm(x)),
        ((3, 1), (3, 2), lambda: torch.nn.InstanceNorm1d(3), lambda x: TF.instance_norm(x.unsqueeze(0))),
        ((1, 3), (1, 3, 2), lambda: torch.nn.GroupNorm(3, 3), lambda x: TF.group_norm(x, 3)),
        ((1, 4, 1, 1), (1, 4, 1, 2), lambda: torch.nn.GroupNorm(4, 4), lambda x: TF.group_norm(x, 4)),
    ],
    ids=["instance", "instance_unbatched", "group", "group_spatial"],
)
def test_a_norm_over_one_value_per_set_is_refused_as_torch_refuses_it(shape, wider_shape, make, call):
    """torch's group and instance norm refuse one value per set (a ValueError before they compute):
    routed calls leave it to torch, converted modules refuse it too; one more value computes."""
    x = torch.randn(shape, dtype=torch.float64)
    with pytest.raises(ValueError, match="Expected more than 1"):
        call(x)
    with ot.functional_calls() as calls, pytest.raises(ValueError, match="Expected more than 1"):
        call(x)
    assert not calls.routed
    module = torch.nn.Sequential(make().double())
    ot.convert(module)
    with pytest.raises(BadParam, match=r"x.shape=\(.*\) gives one value per (instance|group): more than 1 is needed"):
        module(x)
    wider = torch.randn(wider_shape, dtype=torch.float64)
    expected = make().double()(wider)
    assert_close(module(wider), expected, torch.float64)
    expected = call(wider)
    with ot.functional_calls() as calls:
        assert_close(call(wider), expected, torch.float64)
    assert sum(calls.routed.values()) == 1


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"scale_factor": float("inf"), "mode": "bilinear"}, BadParam, r"scale_factor\[0\]=inf must be finite"),
        ({"scale_factor": (2.0, float("nan")), "mode": "nearest"}, BadParam, r"scale_factor\[1\]=nan must be finite"),
        (
            {"scale_factor": 1e30, "mode": "bilinear"},
            BadParam,
            r"scale_factor\[0\]=1e\+30 gives 4000000000000000079538499354624 output positions, past int64",
        ),
        (
            {"size": 3, "mode": "nearest", "align_corners": False},
            ValueError,
            r"align_corners=False with mode='nearest': only the linear modes and bicubic align corners",
        ),
        (
            {"size": 3, "mode": "area", "align_corners": True},
            ValueError,
            r"align_corners=True with mode='area': only the linear modes and bicubic align corners",
        ),
    ],
    ids=["infinite_scale", "nan_scale", "huge_scale", "nearest_aligned", "area_aligned"],
)
def test_interpolate_refuses_what_torch_refuses_naming_the_argument(options, error, message):
    """A scale factor that is not finite (Python's int() of it would raise an untyped error) and
    align_corners beside a mode without corners (torch's ValueError; the call ignored it)."""
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    with pytest.raises((RuntimeError, ValueError)):
        TF.interpolate(x, **options)
    with pytest.raises(error, match=message) as refusal:
        OF.interpolate(x, **options)
    assert isinstance(refusal.value, BadParam) and isinstance(refusal.value, (RuntimeError, ValueError))
    with ot.functional_calls(), pytest.raises(error, match=message):
        TF.interpolate(x, **options)
