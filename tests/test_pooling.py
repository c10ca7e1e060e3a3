"""Pooling: the float64 reference against torch on the CPU (every mode, 1-3 spatial dims, ceil
mode) and against finite differences; NaN and tie rules; the Pythonic API on both backends (Triton
through its interpreter) against torch; error messages."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.pooling.problem import (
    PoolingMode,
    pooling_problem,
    reference_adaptive_backward,
    reference_adaptive_forward,
    reference_backward,
    reference_forward,
    reference_indices,
)

BACKENDS = ["numpy", "triton"]
INCLUDE, EXCLUDE = PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING
# (x shape, window, stride, padding)
GEOMETRIES = [
    ((2, 3, 11), (3,), (2,), (1,)),
    ((2, 3, 9, 10), (3, 3), (2, 2), (1, 1)),
    ((2, 2, 8, 9), (2, 3), (3, 1), (0, 1)),
    ((1, 2, 5, 6, 7), (3, 2, 3), (2, 2, 1), (1, 0, 1)),
]
TORCH_MAX = {1: TF.max_pool1d, 2: TF.max_pool2d, 3: TF.max_pool3d}
TORCH_AVG = {1: TF.avg_pool1d, 2: TF.avg_pool2d, 3: TF.avg_pool3d}


def random(shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def torch_pool(mode, x, window, stride, padding, ceil_mode=False):
    spatial = x.ndim - 2
    if mode is PoolingMode.MAX:
        return TORCH_MAX[spatial](x, window, stride, padding, ceil_mode=ceil_mode)
    return TORCH_AVG[spatial](x, window, stride, padding, ceil_mode=ceil_mode, count_include_pad=mode is INCLUDE)


def descriptor(t):
    return od.TensorDescriptor(t.dtype, t.shape, t.stride())


# the reference ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("mode", [PoolingMode.MAX, INCLUDE, EXCLUDE])
@pytest.mark.parametrize("shape, window, stride, padding", GEOMETRIES)
def test_reference_matches_torch_forward_and_backward(shape, window, stride, padding, mode, ceil_mode):
    x = random(shape).requires_grad_()
    expected = torch_pool(mode, x, window, stride, padding, ceil_mode)
    dy = random(expected.shape, seed=1)
    expected.backward(dy)
    y = reference_forward(mode, x.detach().numpy(), window, padding, stride, ceil_mode=ceil_mode)
    np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-13, atol=1e-13)
    dx = reference_backward(mode, x.detach().numpy(), y, dy.numpy(), window, padding, stride, ceil_mode=ceil_mode)
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", [PoolingMode.MAX, INCLUDE, EXCLUDE])
def test_reference_backward_matches_finite_differences(mode):
    x = random((1, 2, 5, 6), seed=3).numpy()
    window, stride, padding = (3, 2), (2, 1), (1, 1)
    dy = random(reference_forward(mode, x, window, padding, stride).shape, seed=4).numpy()

    def loss(values):
        return float((reference_forward(mode, values, window, padding, stride) * dy).sum())

    step = 1e-6
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        bumped = x.copy()
        bumped[index] += step
        lowered = x.copy()
        lowered[index] -= step
        numeric[index] = (loss(bumped) - loss(lowered)) / (2 * step)
    y = reference_forward(mode, x, window, padding, stride)
    np.testing.assert_allclose(reference_backward(mode, x, y, dy, window, padding, stride), numeric, atol=1e-7)


def test_max_ties_go_to_the_first_position_in_window_order():
    x = np.array([[[[1.0, 2.0, 2.0], [2.0, 0.0, 2.0]]]])
    y = reference_forward(PoolingMode.MAX, x, (2, 3), (0, 0), (1, 1))
    assert y.item() == 2.0
    dx = reference_backward(PoolingMode.MAX, x, y, np.ones_like(y), (2, 3), (0, 0), (1, 1))
    assert dx.tolist() == [[[[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_option_decides_whether_nan_wins(backend):
    x = torch.tensor([[[1.0, float("nan"), float("nan"), float("nan"), 3.0, 0.5]]])
    handle = od.create("cpu", backend=backend)
    results = {}
    for propagate in (False, True):
        y = F.max_pool(x, 2, propagate_nan=propagate, handle=handle)
        results[propagate] = y.flatten().tolist()
    assert results[False][0] == 1.0 and np.isnan(results[False][1]) and results[False][2] == 3.0  # all NaN: NaN
    assert np.isnan(results[True][0]) and np.isnan(results[True][1]) and results[True][2] == 3.0
    dx = F.max_pool_backward(torch.ones(1, 1, 3), x, F.max_pool(x, 2, handle=handle), 2, handle=handle)
    assert dx.flatten().tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]  # the first NaN of each NaN window


# the cuDNN-shaped API ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_with_alpha_beta_blends_into_dx(backend):
    handle = od.create("cpu", backend=backend)
    pool = od.PoolingDescriptor(od.PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, (3, 3), (1, 1), (2, 2))
    x = random((2, 3, 7, 6), seed=5).float()
    y = torch.empty(od.get_pooling_forward_output_dim(pool, descriptor(x)))
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    assert torch.equal(y, TF.max_pool2d(x, 3, 2, 1))
    dy, dx0 = random(y.shape, seed=6).float(), random(x.shape, seed=7).float()
    dx = dx0.clone()
    od.pooling_backward(
        handle, pool, 2.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, -0.5, descriptor(dx), dx
    )
    xt = x.clone().requires_grad_()
    TF.max_pool2d(xt, 3, 2, 1).backward(dy)
    torch.testing.assert_close(dx, 2.0 * xt.grad - 0.5 * dx0)


ERRORS = [
    (
        lambda: od.PoolingDescriptor(od.PoolingMode.MAX, 0, (2, 2), (2, 0), (1, 1)),
        "padding[0]=2 must be smaller than window[0]=2",
    ),
    (lambda: od.PoolingDescriptor(od.PoolingMode.MAX, 0, (2, 2), (0, 0), (1, 0)), "stride[1]=0 must be at least 1"),
    (lambda: od.PoolingDescriptor(od.PoolingMode.MAX, 0, (2, 2, 2, 2), 0, 1), "len(window)=4 must be between 1"),
    (lambda: od.PoolingDescriptor(od.PoolingMode.MAX, 0, (2, 2), (0,), (1, 1)), "len(padding)=1 must equal"),
    (
        lambda: od.get_pooling_forward_output_dim(_POOL, od.TensorDescriptor("float32", (1, 1, 8))),
        "x_desc.ndim=3 must be 2 + the pooling's 2 spatial dims",
    ),
    (
        lambda: od.get_pooling_forward_output_dim(_POOL, od.TensorDescriptor("float32", (1, 1, 1, 8))),
        "window[0]=3 must fit in x_desc.dims[2]=1 + 2 * padding[0]=0",
    ),
    (lambda: _forward((2, 3, 8, 8), (2, 3, 4, 4)), "y_desc.dims[2]=4 must equal 3, the pooled size"),
    (lambda: _forward((2, 3, 8, 8), (2, 4, 3, 3)), "y_desc.dims[1]=4 must equal 3, x_desc.dims"),
    (lambda: _forward((2, 3, 8, 8), (2, 3, 3, 3), torch.float64), "y_desc.dtype=DOUBLE must equal x_desc.dtype=FLOAT"),
    (lambda: F.max_pool(torch.ones(2, 3), 2), "x.ndim=2 must be 3, 4 or 5"),
    (lambda: F.avg_pool(torch.ones(1, 1, 4, 4), (2, 2, 2)), "kernel_size=(2, 2, 2) must be an int or 2 ints"),
]
_POOL = od.PoolingDescriptor(od.PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, (3, 3), (0, 0), (2, 2))


def _forward(x_shape, y_shape, y_dtype=torch.float32):
    x, y = torch.ones(x_shape), torch.zeros(y_shape, dtype=y_dtype)
    od.pooling_forward(od.create("cpu"), _POOL, 1.0, descriptor(x), x, 0.0, descriptor(y), y)


@pytest.mark.parametrize("call, message", ERRORS, ids=[m for _, m in ERRORS])
def test_errors_name_the_parameter_and_rule(call, message):
    with pytest.raises(od.BadParam) as error:
        call()
    assert message in str(error.value)


# the Pythonic API ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_max_and_avg_pool_match_torch_nhwc_ceil_mode(backend, dtype):
    handle = od.create("cpu", backend=backend)
    # 8 channels: one full column block (the Triton forward's unmasked FULL_COLUMNS loads)
    x = random((2, 8, 9, 7), seed=8, dtype=dtype).to(memory_format=torch.channels_last)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    y = F.max_pool(x, 3, 2, 1, ceil_mode=True, handle=handle)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.dtype == dtype
    assert torch.equal(y, TF.max_pool2d(x, 3, 2, 1, ceil_mode=True))
    dy = random(y.shape, seed=9, dtype=dtype)
    xt = x.clone().requires_grad_()
    TF.max_pool2d(xt, 3, 2, 1, ceil_mode=True).backward(dy)
    torch.testing.assert_close(F.max_pool_backward(dy, x, y, 3, 2, 1, ceil_mode=True, handle=handle), xt.grad)
    for include in (True, False):
        expected = TF.avg_pool2d(x.double(), 3, 2, 1, ceil_mode=True, count_include_pad=include)
        y = F.avg_pool(x, 3, 2, 1, ceil_mode=True, count_include_pad=include, handle=handle)
        assert ((y.double() - expected).norm() / expected.norm()).item() < tolerance
        xt = x.double().requires_grad_()
        TF.avg_pool2d(xt, 3, 2, 1, ceil_mode=True, count_include_pad=include).backward(dy.double())
        dx = F.avg_pool_backward(dy, x, 3, 2, 1, ceil_mode=True, count_include_pad=include, handle=handle)
        assert ((dx.double() - xt.grad).norm() / xt.grad.norm()).item() < tolerance


# (x shape, window, stride, padding, dilation): in ceil mode torch takes a window longer than the padded
# input where the rounded-up count gives one output; the window reads what it reaches of the input
CEIL_WINDOWS_PAST_THE_INPUT = [
    ((2, 3, 3), (3,), (3,), (0,), (2,)),  # the plane's one window, dilated: positions 0 and 2
    ((2, 3, 4, 3), (5, 1), (3, 1), (0, 0), (1, 1)),
    ((2, 3, 4, 3), (5, 3), (3, 2), (0, 1), (1, 1)),  # beside a padded dim
    ((1, 2, 3, 4, 5), (3, 2, 1), (3, 3, 2), (0, 1, 0), (2, 3, 1)),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("geometry", CEIL_WINDOWS_PAST_THE_INPUT, ids=str)
def test_a_ceil_mode_window_longer_than_the_padded_input_pools_as_torchs(backend, geometry):
    shape, window, stride, padding, dilation = geometry
    handle = od.create("cpu", backend=backend)
    x = random(shape, seed=10)
    spatial = x.ndim - 2
    xt = x.clone().requires_grad_()
    expected = TORCH_MAX[spatial](xt, window, stride, padding, dilation, ceil_mode=True)
    dy = random(expected.shape, seed=11)
    expected.backward(dy)
    y = F.max_pool(x, window, stride, padding, dilation, ceil_mode=True, handle=handle)
    assert torch.equal(y, expected.detach())
    dx = F.max_pool_backward(dy, x, y, window, stride, padding, dilation, ceil_mode=True, handle=handle)
    torch.testing.assert_close(dx, xt.grad, rtol=1e-12, atol=1e-12)
    if dilation != (1,) * spatial:
        return
    for include in (True, False):
        xt = x.clone().requires_grad_()
        expected = TORCH_AVG[spatial](xt, window, stride, padding, ceil_mode=True, count_include_pad=include)
        expected.backward(dy)
        y = F.avg_pool(x, window, stride, padding, ceil_mode=True, count_include_pad=include, handle=handle)
        torch.testing.assert_close(y, expected.detach(), rtol=1e-12, atol=1e-12)
        dx = F.avg_pool_backward(
            dy, x, window, stride, padding, ceil_mode=True, count_include_pad=include, handle=handle
        )
        torch.testing.assert_close(dx, xt.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape, output_size",
    [
        ((2, 3, 8, 6), 1),
        ((2, 3, 8, 6), (4, 3)),  # divisible
        ((2, 3, 7, 6), (3, 4)),
        ((1, 2, 3, 2), (4, 3)),
        ((2, 3, 8, 15), (7, 7)),  # one more than a multiple: windows of 2 at steps of 1, of 3 at steps of 2
        ((2, 2, 1, 10), (3, 5)),  # larger (one cell repeated) beside divisible
    ],
)  # not, larger
def test_adaptive_pools_match_torch(backend, shape, output_size, monkeypatch):
    """Against torch, forward and backward, one dispatch a call. Cells of one size at one step (sizes that
    divide, or one more than a multiple of the output) run as that pooling; the others as one pooling whose
    windows are the cells (``adaptive`` along the dims whose cells vary)."""
    from opendnn.families.pooling import functional

    dispatched = []
    run = functional.dispatch
    monkeypatch.setattr(functional, "dispatch", lambda *args: dispatched.append(args[2]) or run(*args))
    handle = od.create("cpu", backend=backend)
    x = random(shape, seed=10)
    for ours, ours_backward, theirs in (
        (F.adaptive_avg_pool, F.adaptive_avg_pool_backward, TF.adaptive_avg_pool2d),
        (F.adaptive_max_pool, F.adaptive_max_pool_backward, TF.adaptive_max_pool2d),
    ):
        xt = x.clone().requires_grad_()
        expected = theirs(xt, output_size)
        y = ours(x, output_size, handle=handle)
        torch.testing.assert_close(y, expected.detach())
        dy = random(expected.shape, seed=11)
        expected.backward(dy)
        args = (dy, x, y) if ours is F.adaptive_max_pool else (dy, x)
        torch.testing.assert_close(ours_backward(*args, handle=handle), xt.grad)
    sizes, outputs = shape[2:], (output_size,) * 2 if isinstance(output_size, int) else output_size
    irregular = tuple(not (n % o in (0, 1) and n >= o) for n, o in zip(sizes, outputs))
    assert len(dispatched) == 4, [(p.window, p.stride) for p in dispatched]
    assert all(p.adaptive == (irregular if any(irregular) else ()) for p in dispatched), dispatched


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_adaptive_pools_called_again_match_torch_on_new_values(backend, channels_last):
    """The second call of a signature runs its kept plan (cells of one size at one step) or the full path
    again (cells walked one by one): each on new values matches torch's pools of the same values."""
    handle = od.create("cpu", backend=backend)
    for seed in (20, 21):
        x = random((2, 3, 8, 6), seed=seed).float()
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        for output_size in (1, (4, 3), (3, 4)):
            y = F.adaptive_avg_pool(x, output_size, handle=handle)
            torch.testing.assert_close(y, TF.adaptive_avg_pool2d(x.double(), output_size).float())
            dy = random(y.shape, seed=seed + 10).float()
            expected = torch.ops.aten._adaptive_avg_pool2d_backward(dy.double(), x.double()).float()
            torch.testing.assert_close(F.adaptive_avg_pool_backward(dy, x, handle=handle), expected)
            y, indices = TF.adaptive_max_pool2d(x, output_size, return_indices=True)
            torch.testing.assert_close(F.adaptive_max_pool(x, output_size, handle=handle), y)
            expected = torch.ops.aten.adaptive_max_pool2d_backward(dy, x, indices)
            torch.testing.assert_close(F.adaptive_max_pool_backward(dy, x, y, handle=handle), expected)
        x_numpy = x.numpy()
        np.testing.assert_allclose(F.global_avg_pool(x_numpy, handle=handle), x.double().mean((2, 3), True), 1e-6)


TORCH_ADAPTIVE = {
    (mode, spatial): getattr(TF, f"adaptive_{name}_pool{spatial}d")
    for mode, name in ((PoolingMode.MAX, "max"), (INCLUDE, "avg"))
    for spatial in (1, 2, 3)
}
# (x shape, output size): cells of more than one size or step along some dims, beside dims whose cells are
# one size at one step (13 -> 5 beside 8 -> 4); outputs larger than the input (cells repeating: 5 -> 7)
ADAPTIVE = [
    ((2, 3, 10, 10), (7, 7)),  # VGG's pool over a 320-pixel image
    ((2, 3, 13, 8), (5, 4)),
    ((2, 3, 12, 13), (12, 5)),  # one cell a position along H (window 1, stride 1) beside 13 -> 5
    ((1, 2, 9, 6, 7), (5, 3, 4)),
    ((2, 3, 5), (7,)),
    ((2, 2, 3, 13), (7, 5)),
    ((2, 3, 1, 4), (3, 3)),  # one position into three outputs, 4 -> 3
]


@pytest.mark.parametrize("mode", [PoolingMode.MAX, INCLUDE])
@pytest.mark.parametrize("shape, output_size", ADAPTIVE)
def test_reference_adaptive_pools_match_torch(shape, output_size, mode):
    x = random(shape, seed=50).requires_grad_()
    expected = TORCH_ADAPTIVE[mode, len(shape) - 2](x, output_size)
    dy = random(expected.shape, seed=51)
    expected.backward(dy)
    y = reference_adaptive_forward(mode, x.detach().numpy(), output_size)
    np.testing.assert_allclose(y, expected.detach().numpy(), rtol=1e-13, atol=1e-13)
    dx = reference_adaptive_backward(mode, x.detach().numpy(), y, dy.numpy())
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-13, atol=1e-13)


@pytest.fixture
def counted(monkeypatch):
    """The problems dispatched by the functional calls, and the Triton kernels they launched (by name)."""
    from triton.runtime.interpreter import InterpretedFunction

    from opendnn.families.pooling import functional

    problems, kernels = [], []
    dispatch, run = functional.dispatch, InterpretedFunction.run
    monkeypatch.setattr(functional, "dispatch", lambda *args: problems.append(args[2]) or dispatch(*args))

    def launched(self, *args, **kwargs):
        kernels.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", launched)
    return problems, kernels


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape, output_size", ADAPTIVE)
def test_adaptive_cells_of_varying_size_run_as_one_pooling(
    counted, poisoned_outputs, backend, shape, output_size, channels_last
):
    """Cells of more than one size or step: one dispatch a call, one launch forward (the Triton backend's),
    the argmax pass and the gather backward (max) or the gather alone (average), no fill; the forward and the
    backward against the float64 reference on integer-valued inputs (ties: dy goes to the cell's first
    position equal to y). The second call of a signature runs its kept plan."""
    problems, kernels = counted
    handle = od.create("cpu", backend=backend)
    for seed in (52, 53):
        x = _laid_out(random(shape, seed=seed, dtype=torch.float32).mul(2).round(), channels_last)
        values = x.double().numpy()
        for mode in (PoolingMode.MAX, INCLUDE):
            is_max = mode is PoolingMode.MAX
            del problems[:], kernels[:]
            y = (F.adaptive_max_pool if is_max else F.adaptive_avg_pool)(x, output_size, handle=handle)
            assert y.stride() == _laid_out(torch.empty(y.shape), channels_last).stride()  # x's memory order
            np.testing.assert_allclose(y.double().numpy(), reference_adaptive_forward(mode, values, output_size), 1e-6)
            dy = random(y.shape, seed=seed + 10, dtype=torch.float32)
            if is_max:
                dx = F.adaptive_max_pool_backward(dy, x, y, handle=handle)
            else:
                dx = F.adaptive_avg_pool_backward(dy, x, handle=handle)
            expected = reference_adaptive_backward(mode, values, y.double().numpy(), dy.double().numpy())
            np.testing.assert_allclose(dx.double().numpy(), expected, rtol=1e-6, atol=1e-6)
            assert dx.stride() == x.stride()
            assert len(problems) == (2 if seed == 52 else 0), problems  # then the kept plans
            if seed == 52:
                assert all(p.adaptive and any(p.adaptive) for p in problems), problems
            if backend == "triton":
                backward = ["pool_forward_kernel", "pool_backward_kernel"] if is_max else ["pool_backward_kernel"]
                assert kernels == ["pool_forward_kernel", *backward], kernels


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("propagate_nan", [True, False])
def test_adaptive_max_pool_of_varying_cells_with_nan(backend, propagate_nan, channels_last):
    """NaN in cells that overlap: with propagation a cell holding one is NaN, without it NaNs are skipped and
    only a cell of NaNs is NaN; the backward sends dy to the cell's first position equal to y, NaN matching
    NaN."""
    handle = od.create("cpu", backend=backend)
    x = random((2, 3, 10, 13), seed=54, dtype=torch.float32).round()
    x[random(x.shape, seed=55) > 0.6] = float("nan")
    x[0, 0, :3, :4] = float("nan")  # whole cells of NaN
    x = _laid_out(x, channels_last)
    values = x.double().numpy()
    y = F.adaptive_max_pool(x, (7, 5), propagate_nan=propagate_nan, handle=handle)
    expected = reference_adaptive_forward(PoolingMode.MAX, values, (7, 5), propagate_nan)
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    np.testing.assert_array_equal(y.double().numpy(), expected)
    if propagate_nan:
        assert torch.equal(y.isnan(), TF.adaptive_max_pool2d(x, (7, 5)).isnan())
    dy = random(y.shape, seed=56, dtype=torch.float32)
    dx = F.adaptive_max_pool_backward(dy, x, y, handle=handle)
    expected = reference_adaptive_backward(PoolingMode.MAX, values, y.double().numpy(), dy.double().numpy())
    np.testing.assert_allclose(dx.double().numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_adaptive_pools_of_varying_cells_in_bf16_and_float64(backend, dtype):
    """3-D (9 -> 5 and 7 -> 4 beside 6 -> 3), channels-last: bf16 within its rounding, float64 to 1e-13."""
    handle = od.create("cpu", backend=backend)
    x = _laid_out(random((2, 4, 9, 6, 7), seed=57, dtype=dtype), True)
    values, out = x.double().numpy(), (5, 3, 4)
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-13
    for mode in (PoolingMode.MAX, INCLUDE):
        is_max = mode is PoolingMode.MAX
        y = (F.adaptive_max_pool if is_max else F.adaptive_avg_pool)(x, out, handle=handle)
        assert y.dtype == dtype
        expected = reference_adaptive_forward(mode, values, out)
        assert np.linalg.norm(y.double().numpy() - expected) <= tolerance * np.linalg.norm(expected)
        dy = random(y.shape, seed=58, dtype=dtype)
        dx = (
            F.adaptive_max_pool_backward(dy, x, y, handle=handle)
            if is_max
            else F.adaptive_avg_pool_backward(dy, x, handle=handle)
        )
        expected = reference_adaptive_backward(mode, values, y.double().numpy(), dy.double().numpy())
        assert np.linalg.norm(dx.double().numpy() - expected) <= tolerance * np.linalg.norm(expected)


@pytest.mark.parametrize("mode, channels_last", [(PoolingMode.MAX, False), (INCLUDE, True), (PoolingMode.MAX, True)])
def test_triton_adaptive_cells_in_small_tiles_and_plain_loops(monkeypatch, mode, channels_last):
    """Tiny tiles (rows wrapping across dims, int64 offsets forced) over adaptive cells, and cells past
    UNROLL_LIMIT: 30 -> 7 (windows of up to 6 x 6 = 36 positions: the forward's and the argmax pass's plain
    loops) and 3 -> 20 (a position in up to 8 x 8 = 64 cells: the gather's plain loop)."""
    from opendnn.families.pooling import triton_backend as kernels

    handle = od.create("cpu", backend="triton")
    for shape, out, tiny in (
        ((2, 3, 30, 29), (7, 7), False),
        ((1, 2, 3, 3), (20, 20), False),
        ((2, 3, 10, 11), (7, 4), True),
    ):
        if tiny:
            monkeypatch.setattr(kernels, "FORWARD_TILE", 16)
            monkeypatch.setattr(kernels, "ARGMAX_TILE", 16)
            monkeypatch.setattr(kernels, "BACKWARD_TILE", 8)
            monkeypatch.setattr(kernels, "_wide", lambda *strides: True)
        kernels._forward_config.cache_clear()
        kernels._backward_config.cache_clear()
        x = _laid_out(random(shape, seed=59).round(), channels_last)
        values = x.numpy()
        is_max = mode is PoolingMode.MAX
        y = (F.adaptive_max_pool if is_max else F.adaptive_avg_pool)(x, out, handle=handle)
        np.testing.assert_allclose(y.numpy(), reference_adaptive_forward(mode, values, out), rtol=1e-13, atol=1e-13)
        dy = random(y.shape, seed=60)
        dx = (
            F.adaptive_max_pool_backward(dy, x, y, handle=handle)
            if is_max
            else F.adaptive_avg_pool_backward(dy, x, handle=handle)
        )
        expected = reference_adaptive_backward(mode, values, y.numpy(), dy.numpy())
        np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-13, atol=1e-13)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()


def test_triton_adaptive_launches_read_the_cells_as_constants_of_the_launch():
    """10 x 10 -> 7 x 7 NHWC bf16: one kernel of each kind over every cell, its windows (3 x 3: the largest
    cell) and the outputs holding a position (2 x 2) bounded by constants; HIGH is the smallest cell (2: offsets
    below it test nothing)."""
    from opendnn.families.pooling import triton_backend
    from opendnn.families.pooling.problem import adaptive_pooling_problem

    x = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "bfloat16", 8, 512, 10, 10)
    y = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "bfloat16", 8, 512, 7, 7)
    forward = triton_backend._forward_launches(adaptive_pooling_problem(PoolingMode.MAX, True, x, y), False)
    problem = adaptive_pooling_problem(PoolingMode.MAX, False, x, y, dy_desc=y, dx_desc=x)
    assert problem.adaptive == (True, True) and problem.window == (3, 3) and problem.stride == (1, 1)
    argmax, gather = triton_backend._backward_config(problem, triton_backend.BACKWARD_TILE).launches
    for launch in (forward, argmax, gather):  # canonical (N, D, H, W, C)
        assert launch.options["ADAPTIVE"] == (False, False, True, True, False)
        assert launch.options["WINDOW"] == (1, 1, 3, 3, 1) and launch.options["UNROLL"]
    assert forward.options["HIGH"] == (1, 1, 2, 2, 1) and not forward.options["STRIP"]
    assert gather.options["SHIFTS"] == (1, 1, 2, 2, 1) and gather.options["STRIDE"] == (1,) * 5
    assert adaptive_pooling_problem(PoolingMode.MAX, False, x, y) is adaptive_pooling_problem(
        PoolingMode.MAX, False, x, y
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_pools_of_long_windows_and_numpy_inputs(backend):
    """70 positions: the Triton kernels' plain loops with the window's sizes at run time (GLOBAL); the
    forward's in four chunks of LOOP_CHUNK positions and a partly masked one."""
    handle = od.create("cpu", backend=backend)
    x = random((2, 3, 70), seed=12).numpy()
    y = F.global_avg_pool(x, handle=handle)
    assert isinstance(y, np.ndarray) and y.shape == (2, 3, 1)
    np.testing.assert_allclose(y, x.mean(axis=2, keepdims=True), rtol=1e-12)
    dx = F.global_avg_pool_backward(np.ones_like(y), x, handle=handle)
    np.testing.assert_allclose(dx, np.full(x.shape, 1 / 70), rtol=1e-12)
    y = F.adaptive_max_pool(x, 1, handle=handle)
    np.testing.assert_array_equal(y, x.max(axis=2, keepdims=True))
    dx = F.adaptive_max_pool_backward(np.full(y.shape, 2.0), x, y, handle=handle)
    np.testing.assert_array_equal(dx, 2.0 * (x == y))


def test_triton_long_max_windows_in_a_transposed_layout_pick_the_first_tie():
    """72 positions (plain loops: the argmax pass and a gather of 2 phases x 40 windows) on an x whose H
    is its innermost dim, so the kernels walk the window in another order than N, C, D, H, W: the
    argmax must still be the first tie in that order."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 10, 9), seed=15).round().transpose(2, 3)  # (2, 3, 9, 10), H innermost; many ties
    window, stride, padding = (8, 9), (1, 2), (1, 2)
    pool = od.PoolingDescriptor(PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, window, padding, stride)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), float("nan"), dtype=torch.float64)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    np.testing.assert_array_equal(y.numpy(), reference_forward(PoolingMode.MAX, x.numpy(), window, padding, stride))
    dy, dx = random(y.shape, seed=16), torch.full_like(x, float("nan"))
    od.pooling_backward(
        handle, pool, 1.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
    )
    expected = reference_backward(PoolingMode.MAX, x.numpy(), y.numpy(), dy.numpy(), window, padding, stride)
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode, channels_last, wide", [(PoolingMode.MAX, False, True), (INCLUDE, True, False)])
def test_triton_tiles_that_wrap_rows_and_int64_offsets(monkeypatch, mode, channels_last, wide):
    """Tiny tiles, so a tile's rows wrap across dims (the compare-and-carry row coordinates), and the
    int64 offsets the launcher picks for tensors past 2**31 elements, forced here."""
    from opendnn.families.pooling import triton_backend as kernels

    monkeypatch.setattr(kernels, "FORWARD_TILE", 16)
    monkeypatch.setattr(kernels, "ARGMAX_TILE", 16)
    monkeypatch.setattr(kernels, "BACKWARD_TILE", 8)
    monkeypatch.setattr(kernels, "_wide", lambda *strides: wide)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 3, 4, 5), seed=13, dtype=torch.float32)
    x = x.contiguous(memory_format=torch.channels_last_3d) if channels_last else x
    window, stride, padding = (2, 2, 3), (1, 2, 2), (0, 1, 1)
    pool = od.PoolingDescriptor(mode, od.NanPropagation.PROPAGATE_NAN, window, padding, stride)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), float("nan"))
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    expected = reference_forward(mode, x.double().numpy(), window, padding, stride)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6, atol=1e-6)
    dy, dx = random(y.shape, seed=14, dtype=torch.float32), torch.full_like(x, float("nan"))
    od.pooling_backward(
        handle, pool, 1.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
    )
    expected = reference_backward(
        mode, x.double().numpy(), y.double().numpy(), dy.double().numpy(), window, padding, stride
    )
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-5, atol=1e-6)


# dilation and indices on the Triton backend -----------------------------------------------------

# (x shape, window, stride, padding, dilation, ceil mode)
DILATED = [
    ((2, 3, 13), (3,), (2,), (1,), (2,), True),
    ((2, 3, 11, 12), (3, 3), (2, 2), (1, 1), (2, 2), False),
    ((2, 3, 11, 10), (2, 3), (1, 2), (1, 1), (3, 2), True),
    ((1, 2, 7, 8, 9), (2, 2, 3), (2, 1, 2), (1, 0, 1), (2, 3, 2), False),
]
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _laid_out(x, channels_last):
    if not channels_last:
        return x
    if x.ndim == 3:  # (N, C, W) with C innermost
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    return x.contiguous(memory_format=CHANNELS_LAST[x.ndim])


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """The functional calls' outputs filled with NaN (floats) or -7 (indices) before the kernels run."""
    from opendnn.families.pooling import functional

    allocate = functional.empty_like

    def poisoned(*args, **kwargs):
        bound = allocate(*args, **kwargs)
        bound.view.fill_(-7 if not bound.view.is_floating_point() else float("nan"))
        return bound

    monkeypatch.setattr(functional, "empty_like", poisoned)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape, window, stride, padding, dilation, ceil_mode", DILATED)
def test_triton_dilated_max_pool_indices_and_backward_match_torch(
    poisoned_outputs, shape, window, stride, padding, dilation, ceil_mode, channels_last
):
    handle = od.create("cpu", backend="triton")
    x = _laid_out(random(shape, seed=17, dtype=torch.float32).mul(2).round(), channels_last)  # many ties
    xt = x.clone().requires_grad_()
    expected, expected_indices = TORCH_MAX[len(shape) - 2](
        xt, window, stride, padding, dilation, ceil_mode, return_indices=True
    )
    y, indices = F.max_pool(x, window, stride, padding, dilation, ceil_mode, True, handle=handle)
    assert torch.equal(y, expected) and torch.equal(indices, expected_indices)
    assert y.stride() == indices.stride() == expected.stride()
    dy = random(y.shape, seed=18, dtype=torch.float32)
    expected.backward(dy)
    dx = F.max_pool_backward(dy, x, y, window, stride, padding, dilation, ceil_mode=ceil_mode, handle=handle)
    torch.testing.assert_close(dx, xt.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("propagate_nan", [True, False])
def test_triton_indices_of_nan_windows_follow_torch_and_the_reference(poisoned_outputs, propagate_nan, channels_last):
    """NaN propagation: the last NaN of a window (torch's index); without it NaNs are skipped and an
    all-NaN window gives its first input position (the reference's rule)."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 9, 10), seed=19, dtype=torch.float32).round()
    x[random(x.shape, seed=20) > 0.5] = float("nan")
    x = _laid_out(x, channels_last)
    geometry = (3, 3), (2, 1), (1, 1), (2, 3)
    y, indices = F.max_pool(x, *geometry, True, True, propagate_nan=propagate_nan, handle=handle)
    window, stride, padding, dilation = geometry
    values = x.double().numpy()
    np.testing.assert_array_equal(
        indices.numpy(), reference_indices(values, window, padding, stride, propagate_nan, True, dilation)
    )
    np.testing.assert_array_equal(
        y.double().numpy(),
        reference_forward(PoolingMode.MAX, values, window, padding, stride, propagate_nan, True, dilation),
    )
    if propagate_nan:
        expected, expected_indices = TF.max_pool2d(x, *geometry, True, return_indices=True)
        assert torch.equal(indices, expected_indices) and torch.equal(y.isnan(), expected.isnan())


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("propagate_nan", [True, False])
def test_triton_global_windows_match_the_reference_with_ties_nan_and_indices(
    poisoned_outputs, propagate_nan, channels_last
):
    """Windows that are the whole input, 3 x 4 x 5 = 60 positions (the GLOBAL loops: chunks of
    LOOP_CHUNK in the forward, the last partly past the window): max with ties and NaN, its indices and backward, and
    the average's forward and backward."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 3, 4, 5), seed=30, dtype=torch.float32).round()  # many ties
    x[0, 1, 2, 3, 1] = x[1, 0, 0, 0, 4] = x[1, 0, 2, 1, 0] = float("nan")
    x = _laid_out(x, channels_last)
    window, padding, values = (3, 4, 5), (0, 0, 0), x.double().numpy()
    y, indices = F.max_pool(x, window, return_indices=True, propagate_nan=propagate_nan, handle=handle)
    expected = reference_forward(PoolingMode.MAX, values, window, padding, window, propagate_nan)
    np.testing.assert_array_equal(y.double().numpy(), expected)
    np.testing.assert_array_equal(indices.numpy(), reference_indices(values, window, padding, window, propagate_nan))
    dy = random(y.shape, seed=31, dtype=torch.float32)
    dx = F.max_pool_backward(dy, x, y, window, handle=handle)
    expected = reference_backward(
        PoolingMode.MAX, values, y.double().numpy(), dy.double().numpy(), window, padding, window
    )
    np.testing.assert_allclose(dx.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    x = x.nan_to_num(0.5)
    xt = x.clone().requires_grad_()
    expected = TF.avg_pool3d(xt, window)
    torch.testing.assert_close(F.avg_pool(x, window, handle=handle), expected.detach())
    expected.backward(dy)
    torch.testing.assert_close(F.avg_pool_backward(dy, x, window, handle=handle), xt.grad)


@pytest.mark.parametrize("shape, spread", [((2, 3, 3, 4, 5), 8), ((2, 3, 30, 31), 128), ((2, 5, 70), 32)])
def test_triton_global_max_backward_in_slices_of_the_window(monkeypatch, shape, spread):
    """A channels-last global max's backward (positions the channels apart: the tiled kernels) over few outputs
    spreads over a second grid axis: the argmax pass cuts the window into slices, each its first match, and the
    gather takes the least of them and writes a run of the phases. Ties and NaN (propagated or not) against the
    reference: 60 positions in 4 slices of 16 (the last partial, SPREAD_POSITIONS forced to 8), 930 in 7 of 144,
    70 in 2 of 48."""
    from opendnn.families.pooling import triton_backend as kernels

    monkeypatch.setattr(kernels, "SPREAD_POSITIONS", spread)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()
    handle = od.create("cpu", backend="triton")
    x = random(shape, seed=61, dtype=torch.float32).round()  # many ties
    x.view(-1)[::37] = float("nan")
    x = _laid_out(x, True)
    window, padding, values = shape[2:], (0,) * (len(shape) - 2), x.double().numpy()
    pool = od.PoolingDescriptor(PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, window, padding, window)
    y_desc = od.TensorDescriptor(x.dtype, (*shape[:2], *(1,) * len(window)), None)
    planned = kernels._backward_config(
        pooling_problem(pool, descriptor(x), y_desc, dy_desc=y_desc, dx_desc=descriptor(x)), kernels.BACKWARD_TILE
    )
    slices, steps = planned.launches[0].grid[1], math.prod(window)
    span = math.ceil(math.ceil(steps / slices) / 16) * 16  # the argmax pass's slices: whole LOOP_CHUNKs
    assert planned.launches[1].kernel is kernels.pool_backward_kernel
    assert slices > 1 and planned.launches[1].grid[1] == slices and (slices - 1) * span < steps <= slices * span
    assert planned.scratch[0].numel == slices * shape[0] * shape[1]
    for propagate_nan in (True, False):
        y = F.max_pool(x, window, propagate_nan=propagate_nan, handle=handle)
        dy = random(y.shape, seed=62, dtype=torch.float32)
        dx = F.max_pool_backward(dy, x, y, window, handle=handle)
        expected = reference_backward(
            PoolingMode.MAX, values, y.double().numpy(), dy.double().numpy(), window, padding, window
        )
        np.testing.assert_array_equal(dx.double().numpy(), expected)
        dx = F.adaptive_max_pool_backward(dy, x, y, handle=handle)
        np.testing.assert_array_equal(dx.double().numpy(), expected)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()


@pytest.mark.parametrize("stride", [(1, 1, 1), (2, 1, 3), (3, 5, 4)], ids=["unit", "inside", "past"])
@pytest.mark.parametrize("x_order, dx_order", [((0, 2, 3, 4, 1), (0, 1, 2, 3, 4)), ((1, 2, 3, 4, 0), (0, 2, 3, 4, 1))])
def test_triton_global_max_backward_of_any_stride_writes_only_dx(stride, x_order, dx_order):
    """A cuDNN-shaped global max (one output along the pooled dims) may give any stride: the backward's gather
    (x or dx not NCDHW: the tiled kernels) takes the window as one cell whatever it is. dx is a view inside a
    larger buffer; nothing outside it changes, and beta blends its old values."""
    handle = od.create("cpu", backend="triton")
    shape, window = (2, 3, 2, 3, 4), (2, 3, 4)
    x = random(shape, seed=64, dtype=torch.float32).permute(*x_order).contiguous().permute(*np.argsort(x_order))
    pool = od.PoolingDescriptor(PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, window, (0, 0, 0), stride)
    y = TF.max_pool3d(x, window)
    dy = random(y.shape, seed=65, dtype=torch.float32)
    packed = torch.empty([shape[k] + 1 for k in dx_order]).permute(*np.argsort(dx_order))
    buffer = random(packed.numel() + 10, seed=66, dtype=torch.float32)
    dx = buffer[5:].as_strided(shape, packed.stride())
    before, old = buffer.clone(), dx.clone()
    od.pooling_backward(
        handle, pool, 2.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, -0.5, descriptor(dx), dx
    )
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[5:].as_strided(shape, packed.stride()).fill_(False)
    assert torch.equal(buffer[outside], before[outside])
    xt = x.double().requires_grad_()
    TF.max_pool3d(xt, window).backward(dy.double())
    torch.testing.assert_close(dx.double(), 2.0 * xt.grad - 0.5 * old.double())


# (x shape, window): global windows whose positions are one unit-stride run in NCHW / NCDHW x and dx: every
# spatial dim pooled, W alone (H's windows one position), H and W of a 3-D input
LINE_WINDOWS = [
    ((2, 3, 30, 31), (30, 31)),
    ((2, 5, 70), (70,)),
    ((2, 3, 3, 4, 5), (3, 4, 5)),
    ((2, 3, 5, 70), (1, 70)),
    ((2, 3, 4, 5, 6), (1, 5, 6)),
]


def _backward_plan(x, y, dx, window, nan=od.NanPropagation.NOT_PROPAGATE_NAN):
    """The Triton backend's plan of a max pool's backward over ``window`` (stride: the window) on descriptors."""
    from opendnn.families.pooling import triton_backend

    pool = od.PoolingDescriptor(PoolingMode.MAX, nan, window, (0,) * len(window), window)
    problem = pooling_problem(pool, x, y, dy_desc=y, dx_desc=dx)
    return triton_backend._backward_config(problem, triton_backend.BACKWARD_TILE)


@pytest.mark.parametrize("shape, window", LINE_WINDOWS)
def test_triton_global_max_backward_in_lines_matches_the_reference(monkeypatch, poisoned_outputs, shape, window):
    """NCHW-like global windows: the argmax pass and the gather over blocks of cells (not a multiple of the
    block's) by runs of their positions, here lines of 8 positions and runs of 16 (SPREAD_POSITIONS 8), the
    window's last run ending in a partial line. Ties, NaN and windows of NaN alone, with and without NaN
    propagation, on NaN-poisoned dx: equal to the reference."""
    from opendnn.families.pooling import triton_backend as kernels
    from opendnn.families.pooling import triton_global

    monkeypatch.setattr(kernels, "SPREAD_POSITIONS", 8)
    monkeypatch.setattr(kernels, "GLOBAL_LINE_BYTES", 32)
    kernels._backward_config.cache_clear()
    handle = od.create("cpu", backend="triton")
    x = random(shape, seed=63, dtype=torch.float32).round()  # many ties
    x.view(-1)[::29] = float("nan")
    x[0, 1] = float("nan")  # windows of NaN alone
    y_desc = od.TensorDescriptor(x.dtype, (*shape[:2], *(n // w for n, w in zip(shape[2:], window))), None)
    planned = _backward_plan(descriptor(x), y_desc, descriptor(x), window)
    argmax, gather = planned.launches
    assert argmax.kernel is triton_global.global_argmax_kernel and gather.kernel is triton_global.global_gather_kernel
    runs, positions = argmax.grid[1], math.prod(window)
    assert gather.grid == argmax.grid and runs == math.ceil(positions / 16) and positions % 8 > 0
    assert planned.scratch[0].numel == runs * math.prod(y_desc.dims)
    padding, values = (0,) * len(window), x.double().numpy()
    for propagate_nan in (True, False):
        y = F.max_pool(x, window, propagate_nan=propagate_nan, handle=handle)
        assert y.isnan().any()
        dy = random(y.shape, seed=64, dtype=torch.float32)
        dx = F.max_pool_backward(dy, x, y, window, handle=handle)
        expected = reference_backward(
            PoolingMode.MAX, values, y.double().numpy(), dy.double().numpy(), window, padding, window
        )
        np.testing.assert_array_equal(dx.double().numpy(), expected)
    kernels._backward_config.cache_clear()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_triton_global_max_backward_in_lines_in_every_dtype(poisoned_outputs, dtype):
    """930 positions a window in the default lines (bf16 / fp16 256 positions, float64 64: whole lines, then a
    partial one), ties and NaN: dx equal to the reference on the dtype's values."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 30, 31), seed=65, dtype=dtype).mul(2).round()
    x.view(-1)[::41] = float("nan")
    values = x.double().numpy()
    for propagate_nan in (True, False):
        y = F.adaptive_max_pool(x, 1, propagate_nan=propagate_nan, handle=handle)
        dy = random(y.shape, seed=66, dtype=dtype)
        dx = F.adaptive_max_pool_backward(dy, x, y, handle=handle)
        assert dx.dtype == dtype and dx.stride() == x.stride()
        expected = reference_backward(
            PoolingMode.MAX, values, y.double().numpy(), dy.double().numpy(), (30, 31), (0, 0), (30, 31)
        )
        np.testing.assert_array_equal(dx.double().numpy(), expected)


def test_triton_global_max_backward_in_lines_of_sub_regions_blends_with_alpha_and_beta():
    """Sub-regions whose windows' positions are still unit-stride runs: x every other batch of a slice of channels
    of a larger NCHW buffer (its cells' dims, N and C, do not merge: a division per cell), dx a slice of another,
    y channels-last and dy broadcast along N (stride 0), through the cuDNN-shaped calls: dx = 1.5 * the
    reference - 0.5 * dx, the rest of dx's buffer untouched."""
    from opendnn.families.pooling import triton_global

    handle = od.create("cpu", backend="triton")
    x = random((4, 7, 9, 10), seed=67).round()[::2, 2:5]  # (2, 3, 9, 10), ties
    x[1, 2, 4, 5] = float("nan")
    window, zeros = (9, 10), (0, 0)
    pool = od.PoolingDescriptor(PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, window, zeros, window)
    y = torch.full((2, 3, 1, 1), float("nan"), dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    dy = random((1, 3, 1, 1), seed=68).expand(2, 3, 1, 1)
    buffer = random((3, 5, 9, 10), seed=69)
    prior = buffer.clone()
    dx = buffer[1:3, 1:4]
    argmax = _backward_plan(descriptor(x), descriptor(y), descriptor(dx), window).launches[0]
    assert argmax.kernel is triton_global.global_argmax_kernel and argmax.args[5] == (1, 1, 1, 2, 3)
    od.pooling_backward(
        handle, pool, 1.5, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, -0.5, descriptor(dx), dx
    )
    gradient = reference_backward(PoolingMode.MAX, x.numpy(), y.numpy(), dy.numpy(), window, zeros, window)
    np.testing.assert_allclose(dx.numpy(), 1.5 * gradient - 0.5 * prior[1:3, 1:4].numpy(), rtol=1e-15, atol=1e-15)
    assert (gradient != 0).sum() == 6
    buffer[1:3, 1:4] = prior[1:3, 1:4]
    assert torch.equal(buffer, prior)


def test_triton_global_max_backward_plans_lines_only_where_positions_are_unit_stride():
    """The line kernels for NCHW / NCDHW global windows (and W alone), the same constants for every size (one
    compiled kernel); the tiled kernels where the positions are not one unit-stride run in x and in dx, in
    window order: channels-last x, an x whose H is its innermost dim, a channels-last dx."""
    from opendnn.families.pooling import triton_backend, triton_global

    def planned(x_format, dx_format, dims, window, transposed=False):
        x = od.TensorDescriptor.from_format(x_format, "bfloat16", *dims)
        if transposed:  # H innermost, then W
            x = od.TensorDescriptor("bfloat16", dims, (dims[1] * dims[2] * dims[3], dims[2] * dims[3], 1, dims[2]))
        dx = od.TensorDescriptor.from_format(dx_format, "bfloat16", *dims)
        out = tuple(n // w for n, w in zip(dims[2:], window))
        y = od.TensorDescriptor.from_format(od.TensorFormat.NCHW, "bfloat16", *dims[:2], *out)
        return _backward_plan(x, y, dx, window).launches

    nchw, nhwc = od.TensorFormat.NCHW, od.TensorFormat.NHWC
    line_kernels = [triton_global.global_argmax_kernel, triton_global.global_gather_kernel]
    tiled_kernels = [triton_backend.pool_forward_kernel, triton_backend.pool_backward_kernel]
    lines = [planned(nchw, nchw, dims, dims[2:]) for dims in ((64, 256, 56, 56), (2, 3, 7, 9), (8, 16, 3, 112, 112))]
    lines.append(planned(nchw, nchw, (2, 3, 5, 70), (1, 70)))
    assert all([launch.kernel for launch in launches] == line_kernels for launches in lines)
    for kernels in zip(*lines):
        assert all(launch.options == kernels[0].options for launch in kernels), [k.options for k in kernels]
    for tiled in (
        planned(nhwc, nhwc, (2, 3, 7, 9), (7, 9)),
        planned(nchw, nchw, (2, 3, 7, 9), (7, 9), transposed=True),
        planned(nchw, nhwc, (2, 3, 7, 9), (7, 9)),
        planned(nchw, nchw, (2, 3, 5, 70), (5, 1)),
    ):
        assert [launch.kernel for launch in tiled] == tiled_kernels


def test_triton_global_windows_of_any_size_share_one_compiled_kernel():
    """Global pools of other sizes (windows of 2 or 3 positions a dim too), plan the same kernels with the
    same constants: one compile serves them all. Pools that are not global keep
    their window's shape as constants (unrolled up to UNROLL_LIMIT positions)."""
    from opendnn.families.pooling import triton_backend

    def launches(shape, window):
        x = od.TensorDescriptor.from_format(od.TensorFormat.NHWC, "bfloat16", *shape)
        nan = od.NanPropagation.NOT_PROPAGATE_NAN
        pool = od.PoolingDescriptor(PoolingMode.MAX, nan, window, (0,) * len(window), window)
        y = od.TensorDescriptor.from_format(
            od.TensorFormat.NHWC, "bfloat16", *od.get_pooling_forward_output_dim(pool, x)
        )
        forward = triton_backend._forward_launches(pooling_problem(pool, x, y), False)
        backward = triton_backend._backward_config(pooling_problem(pool, x, y, dy_desc=y, dx_desc=x), 512)
        return [forward, *backward.launches]

    planned = [launches((4, 32, *window), window) for window in ((7, 7, 7), (2, 3, 2), (3, 3, 2), (9, 1, 5))]
    for kernels in zip(*planned):
        assert all(launch.options == kernels[0].options for launch in kernels), [k.options for k in kernels]
        assert kernels[0].options["GLOBAL"] and kernels[0].options["WINDOW"] is None
    for window, unrolled in (((3, 3, 3), True), ((4, 4, 4), False)):  # 27 positions (and phases); 64
        shaped = launches((4, 32, 8, 8, 8), window)
        assert [launch.options["WINDOW"] for launch in shaped] == [(1, *window, 1)] * 3
        assert [launch.options["UNROLL"] for launch in shaped] == [unrolled] * 3


@pytest.mark.parametrize("channels_last", [False, True])
def test_triton_global_pools_reduce_and_broadcast_with_alpha_and_beta(channels_last):
    """Global windows through the cuDNN-shaped calls: the forward average and max are reductions of the pooled
    dims, split across programs (few outputs of thousands of positions: the rows kernel for NCHW, the columns
    kernel for NHWC), the average's backward a broadcast; on NaN-poisoned outputs with beta 0, then blended
    with beta, against the float64 reference."""
    from opendnn.families.pooling import triton_backend
    from opendnn.families.reduce.triton_backend import reduce_plan

    handle = od.create("cpu", backend="triton")
    shape = (1, 16, 48, 47) if channels_last else (1, 2, 96, 97)
    x = _laid_out(random(shape, seed=40), channels_last)
    window, zeros, pooled = shape[2:], (0, 0), (*shape[:2], 1, 1)
    values, dy = x.numpy(), random(pooled, seed=41)
    for mode in (PoolingMode.MAX, INCLUDE, EXCLUDE):
        pool = od.PoolingDescriptor(mode, od.NanPropagation.PROPAGATE_NAN, window, zeros, window)
        expected = reference_forward(mode, values, window, zeros, window)
        y = torch.full(pooled, float("nan"), dtype=torch.float64)
        assert (
            reduce_plan(triton_backend._global_reduction(pooling_problem(pool, descriptor(x), descriptor(y)))).splits
            > 1
        )
        od.pooling_forward(handle, pool, 2.0, descriptor(x), x, 0.0, descriptor(y), y)
        np.testing.assert_allclose(y.numpy(), 2.0 * expected, rtol=1e-12, atol=1e-15)
        prior = random(y.shape, seed=42)
        y = prior.clone()
        od.pooling_forward(handle, pool, 2.0, descriptor(x), x, 0.5, descriptor(y), y)
        np.testing.assert_allclose(y.numpy(), 2.0 * expected + 0.5 * prior.numpy(), rtol=1e-12, atol=1e-15)
        if mode is PoolingMode.MAX:
            continue
        dx = torch.full_like(x, float("nan"))
        od.pooling_backward(
            handle, pool, 3.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
        )
        gradient = reference_backward(mode, values, y.numpy(), dy.numpy(), window, zeros, window)
        np.testing.assert_allclose(dx.numpy(), 3.0 * gradient, rtol=1e-13)
        od.pooling_backward(
            handle, pool, 3.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, -1.0, descriptor(dx), dx
        )
        np.testing.assert_allclose(dx.numpy(), 3.0 * gradient - 3.0 * gradient, atol=1e-15)
        assert dx.stride() == x.stride()


def test_triton_long_dilated_windows_run_the_plain_loops():
    """72 window positions (over UNROLL_LIMIT: the forward's and the argmax pass's plain loops, and a
    gather of 2 phases x 41 windows) with dilation, through the cuDNN-shaped calls on NaN-poisoned outputs."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 20, 21), seed=21).round()
    window, stride, padding, dilation = (8, 9), (1, 2), (1, 2), (2, 2)
    nan = od.NanPropagation.NOT_PROPAGATE_NAN
    pool = od.PoolingDescriptor(PoolingMode.MAX, nan, window, padding, stride, dilation)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), float("nan"), dtype=torch.float64)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    expected = reference_forward(PoolingMode.MAX, x.numpy(), window, padding, stride, dilation=dilation)
    np.testing.assert_array_equal(y.numpy(), expected)
    dy, dx = random(y.shape, seed=22), torch.full_like(x, float("nan"))
    od.pooling_backward(
        handle, pool, 1.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
    )
    expected = reference_backward(
        PoolingMode.MAX, x.numpy(), y.numpy(), dy.numpy(), window, padding, stride, dilation=dilation
    )
    np.testing.assert_allclose(dx.numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("propagate_nan", [True, False])
def test_triton_dilated_windows_of_padding_alone_give_nan_and_no_index(poisoned_outputs, propagate_nan):
    """Along W (1 position, padding 1, dilation 2) every window reads positions -1 and 1: no input, so y is
    NaN (as the reference's, not the padding's -inf) and the index -1; the backward sends nothing."""
    handle = od.create("cpu", backend="triton")
    x = random((2, 3, 5, 1), seed=23)
    window, stride, padding, dilation = (2, 2), (1, 1), (0, 1), (1, 2)
    nan = od.NanPropagation.PROPAGATE_NAN if propagate_nan else od.NanPropagation.NOT_PROPAGATE_NAN
    pool = od.PoolingDescriptor(PoolingMode.MAX, nan, window, padding, stride, dilation)
    y = torch.full(od.get_pooling_forward_output_dim(pool, descriptor(x)), 7.0, dtype=torch.float64)
    od.pooling_forward(handle, pool, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    assert y.shape == (2, 3, 4, 1) and y.isnan().all()
    _, indices = F.max_pool(
        x, window, stride, padding, dilation, return_indices=True, propagate_nan=propagate_nan, handle=handle
    )
    assert indices.tolist() == reference_indices(x.numpy(), window, padding, stride, dilation=dilation).tolist()
    assert (indices == -1).all()
    dy, dx = random(y.shape, seed=24), torch.full_like(x, float("nan"))
    od.pooling_backward(
        handle, pool, 1.0, descriptor(y), y, descriptor(dy), dy, descriptor(x), x, 0.0, descriptor(dx), dx
    )
    assert torch.equal(dx, torch.zeros_like(x))
