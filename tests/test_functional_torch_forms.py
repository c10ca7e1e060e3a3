"""opendnn.functional as a torch.nn.functional user expects it: argument orders, torch's optional
arguments (max_pool's dilation and return_indices, add's alpha, softplus's threshold), one dtype rule,
and dtypes named as NumPy and torch name them."""

import warnings

import numpy as np
import pytest
import torch

import opendnn
import opendnn.functional as F
from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.pooling.problem import PoolingMode, reference_backward, reference_forward, reference_indices
from opendnn.samples import relative_error


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(7)


# softmax's gradient, gradient first -------------------------------------------------------------


@pytest.mark.parametrize("log", [False, True])
def test_softmax_grad_takes_the_gradient_first_as_torch(generator, log):
    x = torch.randn(3, 5, 6, dtype=torch.float64, generator=generator)
    dy = torch.randn(3, 5, 6, dtype=torch.float64, generator=generator)
    y = torch.log_softmax(x, 1) if log else torch.softmax(x, 1)
    dx = (F.log_softmax_grad if log else F.softmax_grad)(dy, y, 1)
    ref = (torch._log_softmax_backward_data if log else torch._softmax_backward_data)(dy, y, 1, x.dtype)
    assert relative_error(dx, ref) < 1e-12
    by_name = (F.log_softmax_grad if log else F.softmax_grad)(y=y, dy=dy, dim=1)
    assert torch.equal(by_name, dx)


@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_keeps_its_order_and_warns_deprecated(generator, log):
    y = torch.softmax(torch.randn(4, 7, generator=generator), -1)
    dy = torch.randn(4, 7, generator=generator)
    old, new = (F.log_softmax_backward, F.log_softmax_grad) if log else (F.softmax_backward, F.softmax_grad)
    name = "log_softmax" if log else "softmax"
    with pytest.warns(DeprecationWarning, match=rf"{name}_backward\(y, dy, dim\) is deprecated .* {name}_grad\(dy, y"):
        dx = old(y, dy)
    assert torch.equal(dx, new(dy, y))


def test_softmax_grad_refuses_mixed_dtypes_naming_both(generator):
    y = torch.softmax(torch.randn(2, 3, generator=generator), -1)
    with pytest.raises(BadParam, match=r"^dy.dtype=float16 must equal y.dtype=float32$"):
        F.softmax_grad(y.half(), y)


# torch.nn.grad's convolution gradients ---------------------------------------------------------


def test_conv_input_and_conv_weight_match_torch_nn_grad(generator):
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64, generator=generator)
    w = torch.randn(6, 2, 3, 3, dtype=torch.float64, generator=generator)
    dy = torch.randn(2, 6, 5, 4, dtype=torch.float64, generator=generator)
    dx = F.conv_input(x.shape, w, dy, 2, 1, 1, 2)
    assert relative_error(dx, torch.nn.grad.conv2d_input(x.shape, w, dy, 2, 1, 1, 2)) < 1e-12
    dw = F.conv_weight(x, w.shape, dy, stride=2, padding=1, groups=2)
    assert relative_error(dw, torch.nn.grad.conv2d_weight(x, w.shape, dy, 2, 1, 1, 2)) < 1e-12
    assert torch.equal(dx, F.conv_backward_data(dy, w, x.shape, 2, 1, 1, 2))
    assert torch.equal(dw, F.conv_backward_filter(x, dy, w.shape, 2, 1, 1, 2))


def test_conv_gradients_refuse_the_other_order_naming_the_right_function(generator):
    x = torch.randn(1, 2, 5, 5, generator=generator)
    w = torch.randn(3, 2, 3, 3, generator=generator)
    dy = torch.randn(1, 3, 3, 3, generator=generator)
    with pytest.raises(BadParam, match=r"^dy=\(1, 2, 5, 5\) must be an array, not a shape: .*conv_input\("):
        F.conv_backward_data(x.shape, w, dy)
    with pytest.raises(BadParam, match=r"^dy=\(3, 2, 3, 3\) must be an array, not a shape: .*conv_weight\("):
        F.conv_backward_filter(x, w.shape, dy)
    with pytest.raises(BadParam, match=r"^input_size of type Tensor must be a shape"):
        F.conv_input(dy, w, x.shape)
    with pytest.raises(BadParam, match=r"^weight_size of type Tensor must be a shape"):
        F.conv_weight(x, dy, w.shape)
    with pytest.raises(BadParam, match=r"^grad_output.dims\[1\]=2 must equal 3"):
        F.conv_input(x.shape, w, dy[:, :2])


# max_pool: dilation and indices -----------------------------------------------------------------

POOLS = [
    ((2, 3, 11, 10), 3, 2, 1, 2, False),
    ((2, 3, 11, 10), (2, 3), 1, (1, 0), (3, 2), True),
    ((1, 2, 13), 3, 2, 1, 3, True),
    ((1, 2, 7, 8, 9), 2, 1, 1, 2, False),
]


@pytest.mark.parametrize(("shape", "kernel", "stride", "padding", "dilation", "ceil_mode"), POOLS)
def test_max_pool_dilation_and_indices_match_torch(generator, shape, kernel, stride, padding, dilation, ceil_mode):
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    pool = getattr(torch.nn.functional, f"max_pool{len(shape) - 2}d")
    y_ref, indices_ref = pool(x, kernel, stride, padding, dilation, ceil_mode, True)
    y, indices = F.max_pool(x, kernel, stride, padding, dilation, ceil_mode, True)
    assert indices.dtype == torch.int64
    assert torch.equal(y, y_ref) and torch.equal(indices, indices_ref)
    dy = torch.randn(y_ref.shape, dtype=torch.float64, generator=generator)
    leaf = x.clone().requires_grad_()
    pool(leaf, kernel, stride, padding, dilation, ceil_mode).backward(dy)
    dx = F.max_pool_backward(dy, x, y, kernel, stride, padding, dilation, ceil_mode=ceil_mode)
    assert relative_error(dx, leaf.grad) < 1e-12


def test_max_pool_indices_of_nan_and_ties_follow_torch():
    x = torch.tensor([[[1.0, 3.0, 3.0, float("nan"), 2.0, float("nan"), 5.0, 5.0]]])
    y, indices = F.max_pool(x, 4, 2, return_indices=True)
    y_ref, indices_ref = torch.nn.functional.max_pool1d(x, 4, 2, return_indices=True)
    assert torch.equal(indices, indices_ref), (indices, indices_ref)
    assert torch.allclose(y, y_ref, equal_nan=True)


def test_max_pool_reference_with_dilation_equals_pooling_a_subsampled_input(generator):
    # dilation 2 with stride 2 and no padding pools the even positions with a 3-window of stride 1
    x = np.asarray(torch.randn(2, 3, 13, generator=generator, dtype=torch.float64))
    dilated = reference_forward(PoolingMode.MAX, x, (3,), (0,), (2,), dilation=(2,))
    plain = reference_forward(PoolingMode.MAX, x[:, :, ::2], (3,), (0,), (1,))
    np.testing.assert_array_equal(dilated, plain)
    indices = reference_indices(x, (3,), (0,), (2,), dilation=(2,))
    np.testing.assert_array_equal(np.take_along_axis(x, indices, 2), dilated)
    dx = reference_backward(PoolingMode.MAX, x, dilated, np.ones_like(dilated), (3,), (0,), (2,), dilation=(2,))
    assert dx[:, :, 1::2].sum() == 0 and dx.sum() == dilated.size


def test_pooling_refuses_dilation_for_averages_and_windows_past_the_input():
    with pytest.raises(BadParam, match=r"^dilation=\[2, 2\] must be 1 for mode AVERAGE_COUNT_INCLUDE_PADDING"):
        opendnn.PoolingDescriptor(opendnn.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, 0, (2, 2), (0, 0), (1, 1), 2)
    with pytest.raises(BadParam, match=r"^kernel_size\[0\]=3 dilated by 3 must fit in x.dims\[2\]=4"):
        F.max_pool(torch.randn(1, 1, 4, 4), 3, 1, 0, 3)


# add's alpha, softplus's threshold ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_add_and_sub_alpha_match_torch(generator, backend):
    handle = opendnn.create(backend=backend)
    a = torch.randn(3, 4, generator=generator)
    b = torch.randn(4, generator=generator)
    out = F.add(a, b, alpha=2.5, handle=handle)
    assert relative_error(out, torch.add(a, b, alpha=2.5)) < 1e-6
    assert relative_error(F.sub(a, b, alpha=-0.75, handle=handle), torch.sub(a, b, alpha=-0.75)) < 1e-6
    with pytest.raises(BadParam, match=r"^alpha=inf must be finite"):
        F.add(a, b, alpha=float("inf"), handle=handle)


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize(("beta", "threshold"), [(1.0, 20.0), (2.0, 5.0), (0.5, 1.0)])
def test_softplus_threshold_is_torchs_linear_region(generator, backend, beta, threshold):
    handle = opendnn.create(backend=backend)
    x = torch.randn(5, 9, dtype=torch.float64, generator=generator) * 15
    y = F.softplus(x, beta, threshold, handle=handle)
    assert relative_error(y, torch.nn.functional.softplus(x, beta, threshold)) < 1e-12
    linear = beta * x > threshold
    assert linear.any() and torch.equal(y[linear], x[linear])  # exactly x, not log1p(exp(.)) / beta
    dy = torch.randn(5, 9, dtype=torch.float64, generator=generator)
    leaf = x.clone().requires_grad_()
    torch.nn.functional.softplus(leaf, beta, threshold).backward(dy)
    dx = F.softplus_backward(dy, x, beta, threshold, handle=handle)
    assert relative_error(dx, leaf.grad) < 1e-12
    assert torch.equal(dx[linear], dy[linear])


def test_softplus_threshold_inf_turns_the_linear_region_off_and_nan_is_refused(generator):
    x = torch.tensor([30.0, 40.0], dtype=torch.float64)
    np.testing.assert_allclose(F.softplus(x, 1.0, float("inf")), np.log1p(np.exp(x.numpy())), rtol=1e-15)
    with pytest.raises(BadParam, match=r"^threshold=nan must be a number"):
        F.softplus(x, 1.0, float("nan"))


# one dtype rule, dtypes named as NumPy and torch name them --------------------------------------


def test_pointwise_promotes_and_conv_refuses_mixed_dtypes_naming_both(generator):
    a = torch.randn(2, 3, 6, 6, generator=generator)
    w = torch.randn(4, 3, 3, 3, generator=generator).half()
    b = torch.randn(6, generator=generator).half()
    assert F.add(a, b).dtype == torch.add(a, b).dtype == torch.float32
    with pytest.raises(BadParam, match=r"^w.dtype=float16 must equal x.dtype=float32$"):
        F.conv(a, w)
    with pytest.raises(NotSupported, match=r"^a.dtype=float32 with b.dtype=float16 is not supported"):
        F.matmul(a[0, 0], torch.randn(6, 2, generator=generator).half())


def test_functional_errors_spell_dtypes_as_numpy_and_torch(generator):
    with pytest.raises(NotSupported, match=r"^x.dtype=int32 must be float32, float64, float16 or bfloat16$"):
        F.softmax(torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(BadParam, match=r"^dy.dtype=float16 must equal x.dtype=float32$"):
        x = torch.randn(1, 1, 4, 4, generator=generator)
        F.max_pool_backward(torch.randn(1, 1, 2, 2, generator=generator).half(), x, F.max_pool(x, 2), 2)


def test_cudnn_shaped_errors_keep_cudnns_dtype_names():
    desc = opendnn.TensorDescriptor(opendnn.DataType.INT32, (2, 3))
    with pytest.raises(NotSupported, match=r"FLOAT, DOUBLE, HALF or BFLOAT16"):
        opendnn.softmax_forward(
            opendnn.create(),
            opendnn.SoftmaxAlgorithm.ACCURATE,
            opendnn.SoftmaxMode.INSTANCE,
            1.0,
            desc,
            np.ones((2, 3), np.int32),
            0.0,
            desc,
            np.ones((2, 3), np.int32),
        )


def test_softmax_grad_warns_nothing(generator):
    x = torch.randn(2, 3, generator=generator)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.softmax_grad(torch.randn(2, 3, generator=generator), torch.softmax(x, -1))
