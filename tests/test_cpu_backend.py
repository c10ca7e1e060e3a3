"""The NumPy backend's whole-array formulations (separable pooling passes, the max backward over the
phases of chunks of planes, batch norm in blocks of rows, softmax into the output, the convolution
forward in chunks of samples, depthwise convolutions by taps) against the float64 references: exact
to 1e-12 in float64 on inputs holding NaN, -inf and ties, with every geometry rule (padding,
overlap, dilation, ceil mode, 1-3 dims), chunks and blocks that end short, and the caller's inputs
left unchanged."""

import numpy as np
import pytest
import torch
from test_pooling import EXCLUDE, GEOMETRIES, INCLUDE, descriptor

import opendnn as od
import opendnn.functional as F
from opendnn.families.batch_norm import numpy_backend as batch_norm_numpy
from opendnn.families.batch_norm import problem as bn
from opendnn.families.pooling import numpy_backend as pooling_numpy
from opendnn.families.pooling.problem import PoolingMode, reference_backward, reference_forward

GLOBAL = ((2, 2, 7, 7), (7, 7), (1, 1), (0, 0))  # one window per plane: the one-reduction path


def special_values(shape, seed):
    """Random values, rounded so that windows hold ties, with NaN, -inf and a plane of NaN."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal(shape) * 2) / 2
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, flat.size // 9, replace=False)] = np.nan
    flat[rng.choice(flat.size, flat.size // 13, replace=False)] = -np.inf
    x[0, 0, ...] = np.nan  # a plane of NaN: its windows are NaN either way
    return x


def tensor(values):
    return torch.from_numpy(np.ascontiguousarray(values))


@pytest.mark.parametrize("propagate", [False, True])
@pytest.mark.parametrize("mode", [PoolingMode.MAX, INCLUDE, EXCLUDE])
@pytest.mark.parametrize("shape, window, stride, padding", [*GEOMETRIES, GLOBAL])
def test_pooling_matches_the_reference_on_nan_inf_and_ties(shape, window, stride, padding, mode, propagate):
    handle = od.create("cpu")
    nan_opt = od.NanPropagation.PROPAGATE_NAN if propagate else od.NanPropagation.NOT_PROPAGATE_NAN
    pool = od.PoolingDescriptor(mode, nan_opt, window, padding, stride)
    values = special_values(shape, seed=len(shape) + sum(window))
    x = tensor(values)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), float("nan"), dtype=torch.float64)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    expected = reference_forward(mode, values, window, padding, stride, propagate_nan=propagate)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert np.isnan(expected).any()  # the NaN rules were exercised
    dy = tensor(np.random.default_rng(5).standard_normal(tuple(y.shape)))
    dx = torch.full_like(x, float("nan"))
    od.pooling_backward(
        handle, pool, 1.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
    )
    expected = reference_backward(mode, values, y.numpy(), dy.numpy(), window, padding, stride)
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(x.numpy(), values)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dilation", [1, 2])
def test_max_pool_with_dilation_and_ceil_mode_matches_the_reference(dilation, ceil_mode):
    handle = od.create("cpu")
    values = special_values((2, 3, 11, 12), seed=7)
    y = F.max_pool(values, 3, 2, 1, dilation, ceil_mode, handle=handle)
    geometry = ((3, 3), (1, 1), (2, 2))
    expected = reference_forward(
        PoolingMode.MAX, values, *geometry, propagate_nan=True, ceil_mode=ceil_mode, dilation=(dilation,) * 2
    )
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    dy = np.random.default_rng(8).standard_normal(y.shape)
    dx = F.max_pool_backward(dy, values, y, 3, 2, 1, dilation, ceil_mode=ceil_mode, handle=handle)
    expected = reference_backward(
        PoolingMode.MAX, values, y, dy, *geometry, ceil_mode=ceil_mode, dilation=(dilation,) * 2
    )
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)


def test_max_pool_backward_gives_nothing_to_a_window_whose_y_it_does_not_hold():
    """y is the caller's: a window none of whose inputs equals its y passes no gradient."""
    handle = od.create("cpu")
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    y = F.max_pool(x, 2, handle=handle)
    y[0, 0, 1, 1] = -1.0
    dx = F.max_pool_backward(np.full(y.shape, 3.0), x, y, 2, handle=handle)
    expected = reference_backward(PoolingMode.MAX, x, y, np.full(y.shape, 3.0), (2, 2), (0, 0), (2, 2))
    np.testing.assert_array_equal(dx, expected)
    assert dx.sum() == 9.0


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 0.25)])
@pytest.mark.parametrize(
    "mode, propagate", [(PoolingMode.MAX, False), (PoolingMode.MAX, True), (INCLUDE, False), (EXCLUDE, False)]
)
def test_pooling_backward_in_chunks_of_planes_matches_the_reference(monkeypatch, mode, propagate, alpha, beta):
    """Ten planes in chunks of three (the last one short); a padded plane 131 wide, so the max window
    positions' codes take two bytes; dx computed in place (alpha 1, beta 0) or blended."""
    monkeypatch.setattr(pooling_numpy, "CHUNK_ELEMENTS", 3 * 9 * 131)
    handle = od.create("cpu")
    nan_opt = od.NanPropagation.PROPAGATE_NAN if propagate else od.NanPropagation.NOT_PROPAGATE_NAN
    pool = od.PoolingDescriptor(mode, nan_opt, (3, 3), (1, 1), (2, 2))
    values = special_values((2, 5, 7, 130), seed=9)
    x = tensor(values)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), float("nan"), dtype=torch.float64)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    dy = tensor(np.random.default_rng(10).standard_normal(tuple(y.shape)))
    before = np.random.default_rng(11).standard_normal(values.shape)
    dx = tensor(before.copy() if beta else np.full(values.shape, np.nan))
    od.pooling_backward(
        handle, pool, alpha, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, beta, descriptor(dx), dx
    )
    expected = reference_backward(mode, values, y.numpy(), dy.numpy(), (3, 3), (1, 1), (2, 2))
    np.testing.assert_allclose(dx.numpy(), alpha * expected + beta * before, rtol=1e-12, atol=1e-12)
    assert np.isnan(y.numpy()).any() and (expected != 0).sum() > values.size // 8


@pytest.mark.parametrize("propagate", [False, True])
def test_max_pool_backward_with_windows_wider_than_x_matches_the_reference(propagate):
    """Windows of 3 x 4 with padding 1 and 2 over planes of 5 x 3: the window positions' offsets in
    x's plane do not grow in row-major order, so dx is scattered into the padded plane."""
    handle = od.create("cpu")
    values = special_values((2, 3, 5, 3), seed=11)
    y = F.max_pool(values, (3, 4), (2, 1), (1, 2), propagate_nan=propagate, handle=handle)
    dy = np.random.default_rng(12).standard_normal(y.shape)
    dx = F.max_pool_backward(dy, values, y, (3, 4), (2, 1), (1, 2), handle=handle)
    expected = reference_backward(PoolingMode.MAX, values, y, dy, (3, 4), (1, 2), (2, 1))
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    assert (expected != 0).sum() > 10


# Batch norm in blocks of 72 elements (BLOCK_ELEMENTS), every sample's rows of a few features: of
# (3, 5, 3, 4), two features of 3 x 12 positions (spatial: blocks of 2, 2 and 1 features) or 24
# features of 3 (per activation: 24, 24 and 12); of (2, 3, 1, 8200), spatial rows longer than
# NumPy's ufunc buffer, whose per-feature constants broadcast as they are.
BLOCKED_BATCH_NORM = [(3, 5, 3, 4), (2, 3, 1, 8200)]


def batch_norm_parameters(shape, mode):
    """The float64 descriptor of scale, bias and the statistics of x of ``shape`` in ``mode``."""
    return od.TensorDescriptor(
        "float64", bn.derive_bn_tensor_descriptor(od.TensorDescriptor("float64", shape), mode).dims
    )


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 0.25)])
@pytest.mark.parametrize("mode", [od.BatchNormMode.SPATIAL, od.BatchNormMode.PER_ACTIVATION])
@pytest.mark.parametrize("shape", BLOCKED_BATCH_NORM)
def test_batch_norm_training_in_blocks_matches_the_reference(monkeypatch, shape, mode, alpha, beta):
    """y computed in place (alpha 1, beta 0) or blended, the running statistics updated, the saved
    mean and inverse std written."""
    monkeypatch.setattr(batch_norm_numpy, "BLOCK_ELEMENTS", 72)
    rng = np.random.default_rng(13)
    x = rng.standard_normal(shape) * 3 + 2
    params = batch_norm_parameters(shape, mode)
    scale, bias = rng.uniform(0.5, 2.0, params.dims), rng.standard_normal(params.dims)
    running = rng.standard_normal(params.dims), rng.uniform(0.5, 2.0, params.dims)
    before = rng.standard_normal(x.shape)
    y = tensor(before.copy() if beta else np.full(x.shape, np.nan))
    running_mean, running_var = tensor(running[0].copy()), tensor(running[1].copy())
    saved_mean, saved_inv_std = (tensor(np.full(params.dims, np.nan)) for _ in range(2))
    xt = tensor(x)
    od.batch_normalization_forward_training(
        od.create("cpu"),
        mode,
        alpha,
        beta,
        descriptor(xt),
        xt,
        descriptor(y),
        y,
        params,
        tensor(scale),
        tensor(bias),
        0.25,
        running_mean,
        running_var,
        1e-5,
        saved_mean,
        saved_inv_std,
    )
    expected = bn.forward_training(
        x, scale, bias, 1e-5, mode, factor=0.25, running_mean=running[0], running_var=running[1]
    )
    np.testing.assert_allclose(y.numpy(), alpha * expected["y"] + beta * before, rtol=1e-12, atol=1e-12)
    for got, name in (
        (running_mean, "running_mean"),
        (running_var, "running_var"),
        (saved_mean, "mean"),
        (saved_inv_std, "inv_std"),
    ):
        np.testing.assert_allclose(got.numpy(), expected[name], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 0.25)])
@pytest.mark.parametrize("saved", [False, True])
@pytest.mark.parametrize("mode", [od.BatchNormMode.SPATIAL, od.BatchNormMode.PER_ACTIVATION])
@pytest.mark.parametrize("shape", BLOCKED_BATCH_NORM)
def test_batch_norm_backward_in_blocks_matches_the_reference(monkeypatch, shape, mode, saved, alpha, beta):
    """Saved or recomputed statistics; dx computed in place (alpha 1, beta 0) or blended."""
    monkeypatch.setattr(batch_norm_numpy, "BLOCK_ELEMENTS", 72)
    rng = np.random.default_rng(12)
    x, dy = rng.standard_normal(shape) * 3 + 2, rng.standard_normal(shape)
    params = batch_norm_parameters(shape, mode)
    scale = rng.uniform(0.5, 2.0, params.dims)
    axes = bn.reduced_axes(x.ndim, mode)
    mean = x.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(x.var(axis=axes, keepdims=True) + 1e-5)
    before = rng.standard_normal(x.shape), rng.standard_normal(params.dims), rng.standard_normal(params.dims)
    dx, dscale, dbias = (tensor(b.copy() if beta else np.full(b.shape, np.nan)) for b in before)
    xt, dyt = tensor(x), tensor(dy)
    statistics = (tensor(mean), tensor(inv_std)) if saved else (None, None)
    od.batch_normalization_backward(
        od.create("cpu"),
        mode,
        alpha,
        beta,
        alpha,
        beta,
        descriptor(xt),
        xt,
        descriptor(dyt),
        dyt,
        descriptor(dx),
        dx,
        params,
        tensor(scale),
        dscale,
        dbias,
        1e-5,
        *statistics,
    )
    expected = bn.backward(x, dy, scale, 1e-5, mode)
    for got, name, prior in zip((dx, dscale, dbias), ("dx", "dscale", "dbias"), before):
        np.testing.assert_allclose(got.numpy(), alpha * expected[name] + beta * prior, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_batch_norm_training_and_backward_leave_their_inputs_unchanged_and_match_torch(dtype, tolerance):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 5, 6, 7)) * 3 + 2).astype(dtype)
    dy, weight, bias = rng.standard_normal(x.shape).astype(dtype), rng.random(5).astype(dtype), rng.random(5)
    bias = bias.astype(dtype)
    kept = x.copy(), dy.copy()
    handle = od.create("cpu")
    y = F.batch_norm(x, None, None, weight, bias, training=True, handle=handle)
    dx, dweight, dbias = F.batch_norm_backward(dy, x, weight, handle=handle)
    xt = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    wt, bt = torch.from_numpy(weight.astype(np.float64)).requires_grad_(), torch.from_numpy(bias.astype(np.float64))
    bt.requires_grad_()
    expected = torch.nn.functional.batch_norm(xt, None, None, wt, bt, True, 0.1, 1e-5)
    expected.backward(torch.from_numpy(dy.astype(np.float64)))
    for got, want in ((y, expected), (dx, xt.grad), (dweight, wt.grad), (dbias, bt.grad)):
        want = want.detach().numpy()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < tolerance
    np.testing.assert_array_equal(x, kept[0])
    np.testing.assert_array_equal(dy, kept[1])


def test_softmax_forward_and_backward_leave_their_inputs_unchanged():
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((3, 50)), rng.standard_normal((3, 50))
    kept = x.copy(), dy.copy()
    y = F.softmax(x, -1, handle=od.create("cpu"))
    y_kept = y.copy()
    dx = F.softmax_grad(dy, y, -1, handle=od.create("cpu"))
    expected = torch.softmax(torch.from_numpy(kept[0]), -1)
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-12, atol=1e-15)
    expected_dx = y_kept * (kept[1] - (kept[1] * y_kept).sum(-1, keepdims=True))
    np.testing.assert_allclose(dx, expected_dx, rtol=1e-12, atol=1e-15)
    for got, want in ((x, kept[0]), (dy, kept[1]), (y, y_kept)):
        np.testing.assert_array_equal(got, want)


# Softmax's forward without the max: rows of each kind, the path it takes, and the values against the
# float64 reference (a row at -100 in float32 sums past the subnormals' bound; 100 overflows float32).
UNSHIFTED_ROWS = [  # dtype, row offset, whether the max is skipped
    (np.float32, 0.0, True),
    (np.float32, 60.0, True),
    (np.float32, -60.0, True),
    (np.float32, -100.0, False),
    (np.float32, 100.0, False),
    (np.float64, 600.0, True),
    (np.float64, -700.0, False),
]


@pytest.mark.parametrize("dtype, offset, unshifted", UNSHIFTED_ROWS)
def test_softmax_forward_skips_the_max_only_where_it_keeps_the_references_values(dtype, offset, unshifted):
    from opendnn.families.softmax import numpy_backend as softmax_numpy
    from opendnn.families.softmax.problem import SoftmaxAlgorithm, reference_forward

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 4, 37)) * 4 + offset).astype(dtype)
    x[0, 0, :5] = -np.inf  # exp(-inf) is 0 either way
    x[1, 2, 3] -= 45  # an exp far below its row's others: subnormal or 0 in float32 at offset -60
    expected = reference_forward(SoftmaxAlgorithm.ACCURATE, x.astype(np.float64), (1, 2))
    out = np.full_like(x, np.nan)
    assert softmax_numpy.forward_unshifted(SoftmaxAlgorithm.ACCURATE, x, (1, 2), out) is unshifted
    tolerance = 1e-6 if dtype == np.float32 else 1e-13
    if unshifted:
        assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < tolerance
    region = np.full((6, 9, 80), np.nan, dtype)
    region[:, 1:9:2, 3:77:2] = x  # a strided sub-region of a larger buffer, softmax along its first dim
    got = F.softmax(region[:, 1:9:2, 3:77:2].transpose(2, 1, 0), 0).transpose(2, 1, 0)
    expected = reference_forward(SoftmaxAlgorithm.ACCURATE, x.astype(np.float64), (2,))
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < tolerance


def test_softmax_forward_keeps_the_max_for_nan_and_inf():
    from opendnn.families.softmax import numpy_backend as softmax_numpy
    from opendnn.families.softmax.problem import SoftmaxAlgorithm

    for special in (np.nan, np.inf):  # a row holding either is NaN throughout
        x = np.random.default_rng(6).standard_normal((3, 9)).astype(np.float32)
        x[1, 4] = special
        assert not softmax_numpy.forward_unshifted(SoftmaxAlgorithm.ACCURATE, x, (1,), np.empty_like(x))
        y = F.softmax(x, -1)
        assert np.isnan(y[1]).all()
        np.testing.assert_allclose(y[[0, 2]], torch.softmax(torch.from_numpy(x[[0, 2]]), -1).numpy(), rtol=1e-6)


# Convolution: the forward in chunks of samples (one sample alone, written by the matmul into y, or
# several, the last chunk short), im2col from the phases of a strided last dim, and the depthwise
# path (C/G == K/G == 1) in chunks of a few channels, the last one short.
CONVOLUTIONS = [  # x dims, filter dims, pre, post, stride, dilation, mode
    ((5, 4, 11), (3,), (1,), (2,), (3,), (2,), od.ConvolutionMode.CROSS_CORRELATION),
    ((5, 4, 9, 10), (3, 2), (1, 0), (2, 1), (1, 2), (2, 1), od.ConvolutionMode.CONVOLUTION),
    ((5, 4, 7, 9), (3, 3), (1, 1), (1, 1), (2, 2), (1, 1), od.ConvolutionMode.CROSS_CORRELATION),
    # unit strides: the depthwise backward data gathers shifted runs of dy
    ((5, 4, 7, 8), (3, 3), (1, 2), (1, 0), (1, 1), (1, 2), od.ConvolutionMode.CONVOLUTION),
    ((5, 4, 5, 6, 7), (2, 3, 2), (0, 1, 1), (1, 0, 2), (2, 1, 3), (1, 2, 1), od.ConvolutionMode.CONVOLUTION),
    # y of x's dims at unit strides: the depthwise taps are flat shifts of x (dy), the padding zero slabs
    ((5, 4, 11), (3,), (2,), (0,), (1,), (1,), od.ConvolutionMode.CROSS_CORRELATION),
    ((5, 4, 7, 8), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), od.ConvolutionMode.CROSS_CORRELATION),
    ((5, 4, 7, 8), (3, 3), (1, 3), (3, 1), (1, 1), (2, 2), od.ConvolutionMode.CONVOLUTION),
    ((5, 4, 3, 4), (3, 3), (3, 3), (3, 3), (1, 1), (3, 3), od.ConvolutionMode.CROSS_CORRELATION),
    ((5, 4, 5, 6, 7), (3, 1, 2), (1, 0, 1), (1, 0, 0), (1, 1, 1), (1, 1, 1), od.ConvolutionMode.CONVOLUTION),
    # filters wider than twice the last stride: im2col from that dim's phases
    ((5, 4, 8, 16), (2, 7), (1, 3), (1, 3), (1, 3), (1, 1), od.ConvolutionMode.CONVOLUTION),
    ((5, 4, 9, 17), (3, 5), (1, 2), (0, 2), (2, 2), (1, 2), od.ConvolutionMode.CROSS_CORRELATION),
]


def convolution_case(geometry, groups, filters, direction, alpha, beta):
    from opendnn.families.convolution.problem import convolution_problem

    x_dims, filt, pre, post, stride, dilation, mode = geometry
    conv_desc = od.ConvolutionDescriptor(
        pre, stride, dilation, mode, od.DataType.DOUBLE, groups, pre_padding=pre, post_padding=post
    )
    x_desc = od.TensorDescriptor("float64", x_dims)
    w_desc = od.TensorDescriptor("float64", (filters, x_dims[1] // groups, *filt))
    y_desc = od.TensorDescriptor("float64", od.get_convolution_forward_output_dim(conv_desc, x_desc, w_desc))
    return convolution_problem(direction, conv_desc, x_desc, w_desc, y_desc, alpha=alpha, beta=beta)


def check_convolution(problem, special=False):
    """numpy_backend.run against the reference (alpha applied) + beta * prior (NaN-poisoned where beta is 0),
    float64 to 1e-12; ``special`` puts an inf in w (or in x for the filter gradient)."""
    from opendnn.core.arrays import Bound
    from opendnn.families.convolution import numpy_backend as convolution_numpy
    from opendnn.families.convolution.problem import ConvolutionDirection, reference

    rng = np.random.default_rng(sum(problem.x.dims) + len(problem.w.dims))
    arrays = {name: rng.standard_normal(getattr(problem, name).dims) for name in ("x", "w", "y")}
    output = {"forward": "y", "backward_data": "x", "backward_filter": "w"}[problem.direction.value]
    if special:
        arrays["x" if problem.direction is ConvolutionDirection.BACKWARD_FILTER else "w"].reshape(-1)[1] = np.inf
    prior = np.full(arrays[output].shape, np.nan) if problem.beta == 0 else arrays[output].copy()
    expected = reference(problem, **{name: None if name == output else a for name, a in arrays.items()})
    expected = expected + problem.beta * prior if problem.beta else expected  # reference applies alpha
    tensors = {name: tensor(prior if name == output else a) for name, a in arrays.items()}
    bound = {name: Bound(name, getattr(problem, name), t, "cpu", name == output) for name, t in tensors.items()}
    convolution_numpy.run(problem, bound["x"], bound["w"], bound["y"])
    got = tensors[output].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert np.isnan(got).sum() == np.isnan(expected).sum() < got.size // 2


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (1.5, -0.5)])
@pytest.mark.parametrize("samples", [1, 2])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("geometry", CONVOLUTIONS, ids=lambda g: f"{len(g[0]) - 2}d")
def test_convolution_forward_in_chunks_of_samples_matches_the_reference(
    monkeypatch, geometry, groups, samples, alpha, beta
):
    """Five samples one at a time (into y's memory where alpha is 1 and beta 0) or two at a time."""
    from opendnn.families.convolution import numpy_backend as convolution_numpy
    from opendnn.families.convolution.problem import ConvolutionDirection

    problem = convolution_case(geometry, groups, 6, ConvolutionDirection.FORWARD, alpha, beta)
    per_sample = int(np.prod(problem.w.dims[1:])) * int(np.prod(problem.y.dims[2:])) * 8  # one sample's columns
    monkeypatch.setattr(convolution_numpy, "GEMM_COLUMN_BYTES", samples * per_sample)
    check_convolution(problem)


@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (1.5, -0.5)])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("geometry", CONVOLUTIONS, ids=lambda g: f"{len(g[0]) - 2}d")
def test_depthwise_convolution_in_chunks_of_channels_matches_the_reference(
    monkeypatch, geometry, direction, alpha, beta
):
    """Four channels in chunks of three; an inf weight (an inf in x for the filter gradient) gives
    the reference's inf and NaN, none on the outputs it does not reach."""
    from opendnn.families.convolution import numpy_backend as convolution_numpy
    from opendnn.families.convolution.problem import ConvolutionDirection

    problem = convolution_case(geometry, 4, 4, ConvolutionDirection(direction), alpha, beta)
    plane = convolution_numpy._Planes(problem, 1, np.float64).plane
    if convolution_numpy._same(problem):
        plane = int(np.prod(problem.x.dims[2:]))
    monkeypatch.setattr(convolution_numpy, "DEPTHWISE_ELEMENTS", 3 * plane)
    assert convolution_numpy._depthwise(problem) and len(convolution_numpy._blocks(problem, plane)) == 2
    check_convolution(problem)
    check_convolution(problem, special=True)


def test_depthwise_filter_gradient_ignores_an_inf_that_no_output_reads():
    """x's last column, read by no output (width 8, filter 3, stride 2), holds inf: the taps' runs read
    it at a junk place of the output layout, and dw stays the reference's finite sums."""
    from opendnn.core.arrays import Bound
    from opendnn.families.convolution import numpy_backend as convolution_numpy
    from opendnn.families.convolution.problem import ConvolutionDirection, reference

    geometry = ((3, 4, 6, 8), (3, 3), (0, 0), (0, 0), (1, 2), (1, 1), od.ConvolutionMode.CROSS_CORRELATION)
    problem = convolution_case(geometry, 4, 4, ConvolutionDirection.BACKWARD_FILTER, 1.0, 0.0)
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal(problem.x.dims), rng.standard_normal(problem.y.dims)
    x[..., -1] = np.inf
    dw = np.full(problem.w.dims, np.nan)
    bound = {
        name: Bound(name, getattr(problem, name), tensor(a), "cpu", name == "w")
        for name, a in (("x", x), ("w", dw), ("y", dy))
    }
    convolution_numpy.run(problem, bound["x"], bound["w"], bound["y"])
    expected = reference(problem, x=x, w=None, y=dy)
    assert np.isfinite(expected).all()
    np.testing.assert_allclose(bound["w"].view.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_a_small_product_runs_on_one_blas_thread_and_a_large_one_on_all():
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="the BLAS thread count needs threadpoolctl")
    from opendnn.core.blas_threads import SINGLE_THREAD_MULTIPLY_ADDS, blas_limit

    def blas_threads():
        return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]

    everywhere = blas_threads()
    with blas_limit(SINGLE_THREAD_MULTIPLY_ADDS - 1):
        assert blas_threads() == [1] * len(everywhere)
    with blas_limit(SINGLE_THREAD_MULTIPLY_ADDS):
        assert blas_threads() == everywhere
    assert blas_threads() == everywhere


def test_an_fp8_tensor_outside_matmul_is_refused_by_name_on_the_numpy_backend():
    """Only the matrix product's reference decodes fp8 bits: another call refuses an fp8 tensor
    (it raised torch's TypeError from inside NumPy's conversion)."""
    handle = od.Handle("cpu", backend="numpy")
    desc = od.TensorDescriptor(od.DataType.FP8_E4M3, (3,))
    x, y = torch.ones(3).to(torch.float8_e4m3fn), torch.zeros(3).to(torch.float8_e4m3fn)
    with pytest.raises(od.NotSupported, match=r"^x of FP8_E4M3 on the NumPy backend: only matmul reads fp8"):
        od.transform_tensor(handle, 1.0, desc, x, 0.0, desc, y)
