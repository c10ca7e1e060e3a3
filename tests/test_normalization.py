"""LRN, divisive normalization and layer / RMS / group / instance norm: the float64 references
against torch on the CPU and against finite differences, the error rules, and the Pythonic API on
both backends.

torch's ``F.local_response_norm`` pads ``size // 2`` channels before and ``(size - 1) // 2`` after
(an average pool over size channels, so alpha is divided by size, as in cuDNN), while cuDNN looks
``(size - 1) // 2`` behind and ``size // 2`` ahead: the two agree for odd sizes, and for even sizes
cuDNN's result is torch's on the channel-reversed tensor.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.lrn import problem as lrn
from opendnn.families.normalization import problem as normalization
from opendnn.families.normalization.problem import NormMode

RNG = np.random.default_rng(7)


def _x(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape)


def _numeric_gradient(function, x, dy, step=1e-6):
    """d(sum(dy * function(x)))/dx by central differences."""
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[index] += step
        minus[index] -= step
        grad[index] = (dy * (function(plus) - function(minus))).sum() / (2 * step)
    return grad


# references against torch ---------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 16])
def test_lrn_reference_matches_torch_with_cudnn_window(size):
    x, dy = _x(2, 9, 3, 4), _x(2, 9, 3, 4)
    desc = od.LRNDescriptor(size, 0.3, 0.75, 1.5)
    xt = torch.from_numpy(x).requires_grad_()
    flip = size % 2 == 0  # cuDNN's window is torch's mirrored
    y = TF.local_response_norm(xt.flip(1) if flip else xt, size, 0.3, 0.75, 1.5)
    y = y.flip(1) if flip else y
    y.backward(torch.from_numpy(dy))
    np.testing.assert_allclose(lrn.lrn_reference(x, desc), y.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(lrn.lrn_backward_reference(x, dy, desc), xt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_lrn_window_placement_is_cudnns():
    desc = od.LRNDescriptor(4, 4.0, 1.0, 1.0)  # s = 1 + sum of x^2 over channels c-1 .. c+2
    x = np.zeros((1, 6, 1, 1))
    x[0, 3] = 1.0
    s = 1.0 / lrn.lrn_reference(np.ones_like(x), desc)[0, :, 0, 0]  # ones: s counts the window
    np.testing.assert_allclose(s, [4, 5, 5, 5, 4, 3])
    assert (desc.lookbehind, desc.lookahead) == (1, 2)


@pytest.mark.parametrize(
    "mode, normalized",
    [
        (NormMode.LAYER_NORM, (5,)),
        (NormMode.LAYER_NORM, (4, 5)),
        (NormMode.RMS_NORM, (5,)),
        (NormMode.RMS_NORM, (3, 4, 5)),
    ],
)
def test_layer_and_rms_references_match_torch(mode, normalized):
    x, dy = _x(2, 3, 4, 5) + 0.5, _x(2, 3, 4, 5)
    w, b = _x(*normalized), _x(*normalized)
    xt, wt, bt = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    if mode is NormMode.LAYER_NORM:
        y = TF.layer_norm(xt, normalized, wt, bt, 1e-5)
    else:
        y = TF.rms_norm(xt, normalized, wt, 1e-5) + bt
    y.backward(torch.from_numpy(dy))
    dims = (1,) * (4 - len(normalized)) + normalized
    out, _, _ = normalization.forward_reference(mode, x, w.reshape(dims), b.reshape(dims), 1e-5, len(normalized))
    dx, dw, db = normalization.backward_reference(mode, x, dy, w.reshape(dims), 1e-5, len(normalized))
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dw.reshape(normalized), wt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(db.reshape(normalized), bt.grad.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(
    "mode, groups", [(NormMode.GROUP_NORM, 3), (NormMode.GROUP_NORM, 1), (NormMode.INSTANCE_NORM, 6)]
)
def test_group_and_instance_references_match_torch(mode, groups):
    x, dy, w, b = _x(2, 6, 3, 5), _x(2, 6, 3, 5), _x(6), _x(6)
    xt, wt, bt = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    if mode is NormMode.INSTANCE_NORM:
        y = TF.instance_norm(xt, weight=wt, bias=bt, eps=1e-5)
    else:
        y = TF.group_norm(xt, groups, wt, bt, 1e-5)
    y.backward(torch.from_numpy(dy))
    p = (1, 6, 1, 1)
    out, mean, rstd = normalization.forward_reference(mode, x, w.reshape(p), b.reshape(p), 1e-5, groups=groups)
    dx, dw, db = normalization.backward_reference(mode, x, dy, w.reshape(p), 1e-5, groups=groups)
    np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(mean, x.reshape(2 * groups, -1).mean(1), rtol=1e-12)
    np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(dw.ravel(), wt.grad.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(db.ravel(), bt.grad.numpy(), rtol=1e-9, atol=1e-11)


# backward against finite differences ----------------------------------------------------------------


def test_lrn_backward_matches_finite_differences():
    desc = od.LRNDescriptor(4, 0.9, 0.6, 1.2)
    x, dy = _x(1, 6, 2, 2), _x(1, 6, 2, 2)
    numeric = _numeric_gradient(lambda v: lrn.lrn_reference(v, desc), x, dy)
    np.testing.assert_allclose(lrn.lrn_backward_reference(x, dy, desc), numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("shape", [(1, 2, 4, 5), (1, 1, 3, 3, 4)])
def test_divisive_backward_matches_finite_differences(shape):
    desc = od.LRNDescriptor(3, 2.0, 0.8, 1.1)
    x, means, dy = _x(*shape), _x(*shape, low=-0.3, high=0.3), _x(*shape)
    numeric = _numeric_gradient(lambda v: lrn.divisive_reference(v, means, desc), x, dy)
    dx, dmeans = lrn.divisive_backward_reference(x, means, dy, desc)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(dmeans, -dx)


def test_divisive_reference_is_box_window_over_spatial_dims():
    desc = od.LRNDescriptor(3, 9.0, 0.5, 1.0)  # s = 1 + sum over the 3 x 3 box of x^2
    x = np.ones((1, 1, 4, 4))
    s = (1.0 / lrn.divisive_reference(x, None, desc)) ** 2
    np.testing.assert_allclose(s[0, 0], 1 + np.array([[4, 6, 6, 4], [6, 9, 9, 6], [6, 9, 9, 6], [4, 6, 6, 4]]))


@pytest.mark.parametrize("mode, count", [(NormMode.LAYER_NORM, 2), (NormMode.RMS_NORM, 1), (NormMode.GROUP_NORM, 2)])
def test_norm_backward_matches_finite_differences(mode, count):
    x, dy = _x(2, 4, 3), _x(2, 4, 3)
    dims = normalization.param_dims(mode, x.shape, count)
    scale = _x(*dims, low=0.5, high=1.5)
    groups = count if mode is NormMode.GROUP_NORM else 0
    dx, _, _ = normalization.backward_reference(mode, x, dy, scale, 1e-5, count, groups)
    np.testing.assert_allclose(
        dx,
        _numeric_gradient(
            lambda v: normalization.forward_reference(mode, v, scale, None, 1e-5, count, groups)[0], x, dy
        ),
        rtol=1e-6,
        atol=1e-8,
    )


# errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((0,), "n=0 must be an integer from 1 to 16"),
        ((17,), "n=17 must be an integer from 1 to 16"),
        ((5, 1e-4, 0.001), "beta=0.001 must be at least 0.01"),
        ((5, 1e-4, 0.75, 1e-6), "k=1e-06 must be at least 1e-05"),
    ],
)
def test_lrn_descriptor_limits(arguments, message):
    with pytest.raises(od.BadParam, match=message):
        od.LRNDescriptor(*arguments)


def test_lrn_descriptor_defaults_are_cudnns():
    assert od.LRNDescriptor() == od.LRNDescriptor(5, 1e-4, 0.75, 2.0)


def _desc(*dims, dtype="float32"):
    return od.TensorDescriptor(dtype, dims)


def test_lrn_errors_name_the_parameter():
    handle = od.create("cpu", backend="numpy")
    x = np.ones((2, 3), np.float32)
    with pytest.raises(od.BadParam, match=r"x_desc.ndim=2 must be at least 3"):
        od.lrn_cross_channel_forward(
            handle, od.LRNDescriptor(), od.LRNMode.CROSS_CHANNEL_DIM1, 1.0, _desc(2, 3), x, 0.0, _desc(2, 3), x
        )
    x4 = np.ones((1, 2, 3, 4), np.float32)
    with pytest.raises(od.BadParam, match=r"y_desc.dims\[3\]=5 must equal x_desc.dims\[3\]=4"):
        od.lrn_cross_channel_forward(
            handle,
            od.LRNDescriptor(),
            od.LRNMode.CROSS_CHANNEL_DIM1,
            1.0,
            _desc(1, 2, 3, 4),
            x4,
            0.0,
            _desc(1, 2, 3, 5),
            np.ones((1, 2, 3, 5), np.float32),
        )
    x3 = np.ones((1, 2, 3), np.float32)
    with pytest.raises(od.BadParam, match=r"x_desc.ndim=3 must be 4 or 5 for divisive normalization"):
        od.divisive_normalization_forward(
            handle,
            od.LRNDescriptor(),
            od.DivNormMode.PRECOMPUTED_MEANS,
            1.0,
            _desc(1, 2, 3),
            x3,
            None,
            None,
            None,
            0.0,
            _desc(1, 2, 3),
            x3,
        )
    with pytest.raises(od.BadParam, match=r"norm_desc=.* must be an LRNDescriptor"):
        od.lrn_cross_channel_forward(
            handle, None, od.LRNMode.CROSS_CHANNEL_DIM1, 1.0, _desc(1, 2, 3, 4), x4, 0.0, _desc(1, 2, 3, 4), x4
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(epsilon=-1.0), "epsilon=-1.0 must be finite and at least 0"),
        (dict(normalized_ndim=0), "normalized_ndim=0 must be at least 1"),
        (dict(groups=0), "groups=0 must be at least 1"),
    ],
)
def test_norm_descriptor_rules(kwargs, message):
    with pytest.raises(od.BadParam, match=message):
        od.NormDescriptor(NormMode.LAYER_NORM, **kwargs)


def test_norm_errors_name_the_parameter():
    handle = od.create("cpu", backend="numpy")
    x = np.ones((2, 6, 3), np.float32)
    y = np.empty_like(x)
    group = od.NormDescriptor(NormMode.GROUP_NORM, groups=4)
    with pytest.raises(od.BadParam, match=r"x_desc.dims\[1\]=6 must be a multiple of norm_desc.groups=4"):
        od.normalization_forward_inference(
            handle, group, 1.0, _desc(2, 6, 3), x, None, None, None, 0.0, _desc(2, 6, 3), y
        )
    layer = od.NormDescriptor(NormMode.LAYER_NORM, normalized_ndim=1)
    scale = np.ones((1, 6, 3), np.float32)
    with pytest.raises(od.BadParam, match=r"scale_desc.dims=\[1, 6, 3\] must be \[1, 1, 3\]"):
        od.normalization_forward_inference(
            handle, layer, 1.0, _desc(2, 6, 3), x, _desc(1, 6, 3), scale, None, 0.0, _desc(2, 6, 3), y
        )
    stats = np.ones((2, 6, 1), np.float16)
    with pytest.raises(od.BadParam, match=r"stats_desc.dtype=HALF must be FLOAT"):
        od.normalization_forward_training(
            handle,
            layer,
            1.0,
            _desc(2, 6, 3),
            x,
            None,
            None,
            None,
            0.0,
            _desc(2, 6, 3),
            y,
            _desc(2, 6, 1, dtype="float16"),
            stats,
            stats,
        )
    rms = od.NormDescriptor(NormMode.RMS_NORM)
    stats32 = np.ones((2, 6, 1), np.float32)
    with pytest.raises(od.BadParam, match="mean must be None for RMS_NORM"):
        od.normalization_forward_training(
            handle,
            rms,
            1.0,
            _desc(2, 6, 3),
            x,
            None,
            None,
            None,
            0.0,
            _desc(2, 6, 3),
            y,
            _desc(2, 6, 1),
            stats32,
            stats32,
        )
    with pytest.raises(od.BadParam, match=r"norm_desc.normalized_ndim=4 must be at most x_desc.ndim=3"):
        od.normalization_forward_inference(
            handle,
            od.NormDescriptor(NormMode.LAYER_NORM, normalized_ndim=4),
            1.0,
            _desc(2, 6, 3),
            x,
            None,
            None,
            None,
            0.0,
            _desc(2, 6, 3),
            y,
        )


# the Pythonic API, on both backends --------------------------------------------------------------------

BACKENDS = ["numpy", "triton"]


def _close(actual, expected, tolerance=1e-5):
    actual, expected = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    assert ((actual - expected).norm() / expected.norm()).item() < tolerance


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_norms_match_torch(backend):
    handle = od.create("cpu", backend=backend)
    x = torch.randn(3, 6, 4, 5)
    w, b = torch.randn(4, 5), torch.randn(4, 5)
    y, mean, rstd = F.layer_norm(x, (4, 5), w, b, return_stats=True, handle=handle)
    _close(y, TF.layer_norm(x, (4, 5), w, b))
    _close(mean.reshape(-1), x.reshape(18, -1).mean(1))
    _close(F.rms_norm(x, (5,), w[0], handle=handle), TF.rms_norm(x, (5,), w[0]))
    wc, bc = torch.randn(6), torch.randn(6)
    _close(F.group_norm(x, 2, wc, bc, handle=handle), TF.group_norm(x, 2, wc, bc))
    _close(F.instance_norm(x, wc, bc, handle=handle), TF.instance_norm(x, weight=wc, bias=bc))
    numpy_y = F.layer_norm(x.numpy(), 5, handle=handle)
    assert isinstance(numpy_y, np.ndarray)
    _close(numpy_y, TF.layer_norm(x, (5,)))


def _strided(*shape):
    """Random values of ``shape`` in every third element of a larger buffer (a view, strides 3 apart
    along its last dim)."""
    return torch.randn(3 * int(np.prod(shape)))[::3].reshape(shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_weights_and_biases_are_read_through_their_strides(backend):
    """A weight or bias that is a strided view (a slice of a larger parameter, a (1, C) view of a
    sub-region) is read element by element as it lies, forward and backward."""
    handle = od.create("cpu", backend=backend)
    x, dy = torch.randn(3, 6, 4, 5), torch.randn(3, 6, 4, 5)
    w, b = _strided(4, 5), _strided(4, 5)
    assert w.reshape(-1).stride() == (3,)  # flattened, still a view of every third element
    _close(F.layer_norm(x, (4, 5), w, b, handle=handle), TF.layer_norm(x, (4, 5), w, b))
    row = torch.randn(1, 15)[:, ::3]  # a (1, 5) view whose size-1 dim hides the stride of 3
    x_row = x.reshape(3, 6, 4, 1, 5)
    _close(F.layer_norm(x_row, (1, 5), row, row, handle=handle), TF.layer_norm(x_row, (1, 5), row, row))
    _close(F.rms_norm(x, (5,), w[0], handle=handle), TF.rms_norm(x, (5,), w[0]))
    wc, bc = _strided(6), _strided(6)
    _close(F.group_norm(x, 2, wc, bc, handle=handle), TF.group_norm(x, 2, wc, bc))
    _close(F.instance_norm(x, wc, bc, handle=handle), TF.instance_norm(x, weight=wc, bias=bc))
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    TF.layer_norm(xt, (4, 5), wt).backward(dy)
    dx, dw, _ = F.layer_norm_backward(dy, x, (4, 5), w, handle=handle)
    _close(dx, xt.grad)
    _close(dw, wt.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_norm_backwards_match_torch_autograd(backend):
    handle = od.create("cpu", backend=backend)
    x, dy = torch.randn(3, 6, 4, 5), torch.randn(3, 6, 4, 5)
    w, b = torch.randn(4, 5).requires_grad_(), torch.randn(4, 5).requires_grad_()
    xt = x.clone().requires_grad_()
    TF.layer_norm(xt, (4, 5), w, b).backward(dy)
    _, mean, rstd = F.layer_norm(x, (4, 5), w.detach(), b.detach(), return_stats=True, handle=handle)
    dx, dw, db = F.layer_norm_backward(dy, x, (4, 5), w.detach(), mean=mean, rstd=rstd, handle=handle)
    for ours, theirs in ((dx, xt.grad), (dw, w.grad), (db, b.grad)):
        _close(ours, theirs)
    wc = torch.randn(6).requires_grad_()
    xt.grad = None
    TF.group_norm(xt, 3, wc).backward(dy)
    dx, dw, _ = F.group_norm_backward(dy, x, 3, wc.detach(), handle=handle)
    _close(dx, xt.grad)
    _close(dw, wc.grad)
    wr = torch.randn(5).requires_grad_()
    xt.grad = None
    TF.rms_norm(xt, (5,), wr, 1e-6).backward(dy)
    dx, dw = F.rms_norm_backward(dy, x, (5,), wr.detach(), 1e-6, handle=handle)
    _close(dx, xt.grad)
    _close(dw, wr.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_backwards_read_the_saved_statistics_not_the_descriptors_epsilon(backend):
    """A backward given the forward's mean and rstd uses them, as cuDNN does: a forward at epsilon 0.5
    and a backward whose descriptor keeps the default 1e-5 give torch's gradients at 0.5."""
    handle = od.create("cpu", backend=backend)
    x, dy = torch.randn(3, 6, 4, 5, dtype=torch.float64), torch.randn(3, 6, 4, 5, dtype=torch.float64)
    w, b = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    cases = (
        (lambda a, s: TF.layer_norm(a, (5,), s, b, 0.5), F.layer_norm, F.layer_norm_backward, ((5,), w, b, 0.5)),
        (lambda a, s: TF.rms_norm(a, (5,), s, 0.5), F.rms_norm, F.rms_norm_backward, ((5,), w, 0.5)),
    )
    for torch_norm, forward, backward, arguments in cases:
        xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
        torch_norm(xt, wt).backward(dy)
        outputs = forward(x, *arguments, return_stats=True, handle=handle)
        stats = dict(zip(("mean", "rstd"), outputs[1:])) if len(outputs) == 3 else {"rstd": outputs[1]}
        dx, dw = backward(dy, x, (5,), w, **stats, handle=handle)[:2]
        _close(dx, xt.grad, 1e-12)
        _close(dw, wt.grad, 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_lrn_and_divisive_norm(backend):
    handle = od.create("cpu", backend=backend)
    x, dy = torch.randn(2, 7, 3, 4), torch.randn(2, 7, 3, 4)
    xt = x.clone().requires_grad_()
    TF.local_response_norm(xt, 5, 0.5, 0.75, 1.5).backward(dy)
    _close(F.local_response_norm(x, 5, 0.5, 0.75, 1.5, handle=handle), TF.local_response_norm(x, 5, 0.5, 0.75, 1.5))
    _close(F.local_response_norm_backward(dy, x, 5, 0.5, 0.75, 1.5, handle=handle), xt.grad)
    means = 0.1 * torch.randn(2, 7, 3, 4)
    desc = od.LRNDescriptor(3, 1.125, 0.75, 1.5)
    expected = lrn.divisive_reference(x.double().numpy(), means.double().numpy(), desc)
    _close(F.divisive_norm(x, means, 3, 1.125, 0.75, 1.5, handle=handle), expected)
    dx, dmeans = F.divisive_norm_backward(dy, x, means, 3, 1.125, 0.75, 1.5, handle=handle)
    expected_dx, _ = lrn.divisive_backward_reference(
        x.double().numpy(), means.double().numpy(), dy.double().numpy(), desc
    )
    _close(dx, expected_dx)
    _close(dmeans, -expected_dx)


@pytest.mark.parametrize("shape, channels_last", [((2, 8200), False), ((1, 9, 30, 31), True)])
def test_streamed_layer_and_rms_norm_match_torch(shape, channels_last):
    """Rows longer than the Triton backend holds in registers (8192) stream in chunks, the last one
    part-masked: packed rows, and 3 normalized dims of a channels-last tensor (strided columns);
    inputs off-centre so that RMS norm differs from layer norm; saved statistics or recomputed."""
    handle = od.create("cpu", backend="triton")
    g = torch.Generator().manual_seed(3)
    x, dy = torch.randn(shape, generator=g) + 0.5, torch.randn(shape, generator=g)
    if channels_last:
        x, dy = x.contiguous(memory_format=torch.channels_last), dy.contiguous(memory_format=torch.channels_last)
    normalized = shape[-3:] if channels_last else shape[-1:]
    w, b = 1 + 0.1 * torch.randn(normalized, generator=g), 0.1 * torch.randn(normalized, generator=g)
    xt, dyt = x.double().requires_grad_(), dy.double()
    reduced = tuple(range(x.ndim - len(normalized)))
    expected = TF.layer_norm(xt, normalized, w.double(), b.double())
    expected.backward(dyt)
    y, mean, rstd = F.layer_norm(x, normalized, w, b, return_stats=True, handle=handle)
    saved = dict(mean=mean, rstd=rstd) if not channels_last else {}
    dx, dw, db = F.layer_norm_backward(dy, x, normalized, w, handle=handle, **saved)
    _close(y, expected)
    _close(dx, xt.grad)
    _close(dw, (TF.layer_norm(xt.detach(), normalized) * dyt).sum(reduced))
    _close(db, dyt.sum(reduced))
    xt.grad = None
    expected = TF.rms_norm(xt, normalized, w.double(), 1e-6)
    expected.backward(dyt)
    y, rstd = F.rms_norm(x, normalized, w, 1e-6, return_stats=True, handle=handle)
    saved = dict(rstd=rstd) if channels_last else {}
    dx, dw = F.rms_norm_backward(dy, x, normalized, w, 1e-6, handle=handle, **saved)
    _close(y, expected)
    _close(dx, xt.grad)
    _close(dw, (TF.rms_norm(xt.detach(), normalized, eps=1e-6) * dyt).sum(reduced))
