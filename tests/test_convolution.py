"""Convolution: the float64 NumPy reference against torch's convolutions and autograd and against
finite differences; the rules of ``convolution_problem`` as error messages; the algorithm
declaration; the workspace checks; and the Pythonic API against torch on both backends."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.convolution import numpy_backend as numpy_convolution
from opendnn.families.convolution.problem import (
    ConvolutionDirection,
    algorithm_refusal,
    convolution_problem,
    reference_backward_bias,
    reference_backward_data,
    reference_backward_filter,
    reference_epilogue,
    reference_forward,
)
from opendnn.families.convolution.samples import GEOMETRIES
from opendnn.families.pointwise.problem import PointwiseMode
from opendnn.samples import relative_error

SMALL = GEOMETRIES["small"]
TORCH_CONV = {1: TF.conv1d, 2: TF.conv2d, 3: TF.conv3d}
TORCH_CONV_TRANSPOSE = {1: TF.conv_transpose1d, 2: TF.conv_transpose2d, 3: TF.conv_transpose3d}


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tuple(tensor.shape), tensor.stride())


def problem_of(geometry, direction=ConvolutionDirection.FORWARD, dtype="float64", **options):
    conv_desc = geometry.descriptor(od.DataType.of(dtype))
    x_desc = od.TensorDescriptor(dtype, geometry.x_shape)
    w_desc = od.TensorDescriptor(dtype, geometry.w_shape)
    y_desc = od.TensorDescriptor(dtype, od.get_convolution_forward_output_dim(conv_desc, x_desc, w_desc))
    return convolution_problem(direction, conv_desc, x_desc, w_desc, y_desc, **options)


def torch_forward(geometry, x, w):
    """torch's convolution of the geometry: explicit (asymmetric) zero padding, the filter flipped
    for ConvolutionMode.CONVOLUTION."""
    spatial = len(geometry.spatial)
    pads = [p for pre, post in zip(reversed(geometry.pre), reversed(geometry.post)) for p in (pre, post)]
    if geometry.mode is od.ConvolutionMode.CONVOLUTION:
        w = torch.flip(w, dims=tuple(range(2, 2 + spatial)))
    return TORCH_CONV[spatial](TF.pad(x, pads), w, None, geometry.stride, 0, geometry.dilation, geometry.groups)


def random(shape, seed):
    return torch.from_numpy(np.random.default_rng(seed).uniform(-2, 2, shape))


# ---- the reference against torch, float64 --------------------------------------------------------


@pytest.mark.parametrize("name", list(SMALL))
def test_reference_forward_and_backward_match_torch_autograd(name):
    geometry = SMALL[name]
    problem = problem_of(geometry)
    x = random(geometry.x_shape, 1).requires_grad_()
    w = random(geometry.w_shape, 2).requires_grad_()
    y = torch_forward(geometry, x, w)
    dy = random(tuple(y.shape), 3)
    y.backward(dy)
    np.testing.assert_allclose(
        reference_forward(problem, x.detach().numpy(), w.detach().numpy()), y.detach().numpy(), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        reference_backward_data(problem, dy.numpy(), w.detach().numpy()), x.grad.numpy(), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        reference_backward_filter(problem, x.detach().numpy(), dy.numpy()), w.grad.numpy(), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        reference_backward_bias(dy.numpy()).ravel(), dy.sum((0, *range(2, dy.ndim))).numpy(), rtol=1e-12
    )


@pytest.mark.parametrize("spatial", [1, 2, 3])
def test_backward_data_is_torch_conv_transpose(spatial):
    stride, padding, dilation, groups = 2, 1, 2, 2
    dy = random((2, 4, *(3,) * spatial), 4)
    w = random((4, 3, *(2,) * spatial), 5)
    expected = TORCH_CONV_TRANSPOSE[spatial](dy, w, None, stride, padding, 1, groups, dilation)
    actual = F.conv_backward_data(dy, w, tuple(expected.shape), stride, padding, dilation, groups)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def test_reference_backward_matches_finite_differences():
    """<dy, conv(x, w)> is bilinear: its gradients in x and w are the two backward directions."""
    geometry = SMALL["2d_stride_dilation"]
    problem = problem_of(geometry)
    x, w = random(geometry.x_shape, 6).numpy(), random(geometry.w_shape, 7).numpy()
    dy = random(problem.y.dims, 8).numpy()

    def loss(x_, w_):
        return float((reference_forward(problem, x_, w_) * dy).sum())

    step = 1e-6
    for array, gradient in (
        (x, reference_backward_data(problem, dy, w)),
        (w, reference_backward_filter(problem, x, dy)),
    ):
        numeric = np.zeros_like(array)
        for index in np.ndindex(array.shape):
            saved = array[index]
            array[index] = saved + step
            up = loss(x, w)
            array[index] = saved - step
            numeric[index] = (up - loss(x, w)) / (2 * step)
            array[index] = saved
        np.testing.assert_allclose(gradient, numeric, rtol=1e-7, atol=1e-7)


def test_reference_epilogue_matches_torch():
    geometry = SMALL["2d"]
    problem = problem_of(
        geometry,
        alpha=0.5,
        alpha2=-1.25,
        activation=PointwiseMode.RELU_FWD,
        bias_desc=od.TensorDescriptor("float64", (1, geometry.k, 1, 1)),
        z_desc=od.TensorDescriptor("float64", problem_of(geometry).y.dims),
    )
    x, w = random(geometry.x_shape, 9), random(geometry.w_shape, 10)
    z, bias = random(problem.y.dims, 11), random((1, geometry.k, 1, 1), 12)
    conv = reference_forward(problem, x.numpy(), w.numpy())
    expected = torch.relu(0.5 * torch_forward(geometry, x, w) - 1.25 * z + bias)
    np.testing.assert_allclose(
        reference_epilogue(problem, conv, bias.numpy(), z.numpy()), expected.numpy(), rtol=1e-12, atol=1e-12
    )


def test_output_dim_matches_torch_shapes():
    for geometry in SMALL.values():
        x, w = torch.zeros(geometry.x_shape), torch.zeros(geometry.w_shape)
        dims = od.get_convolution_forward_output_dim(
            geometry.descriptor(od.DataType.FLOAT), descriptor(x), descriptor(w)
        )
        assert dims == tuple(torch_forward(geometry, x, w).shape)


def test_filter_descriptor_krsc_is_channels_last():
    w = od.FilterDescriptor("float32", od.TensorFormat.NHWC, 8, 3, 5, 7)
    assert w.tensor.dims == (8, 3, 5, 7) and w.tensor.strides == (105, 1, 21, 3)
    assert od.FilterDescriptor("float32", od.TensorFormat.NCHW, 8, 3, 5, 7).tensor.strides == (105, 35, 7, 1)
    assert od.FilterDescriptor("float16", "NHWC", 4, 2, 3, 3, 3).tensor.strides == (54, 1, 18, 6, 2)


# ---- algorithms ----------------------------------------------------------------------------------


def test_algorithm_declaration_refuses_fft_winograd_and_wide_direct():
    for algo in (od.ConvolutionFwdAlgo.FFT, od.ConvolutionFwdAlgo.WINOGRAD_NONFUSED):
        assert "is not implemented" in algorithm_refusal(problem_of(SMALL["2d"], algo=algo))
    assert algorithm_refusal(problem_of(SMALL["2d_depthwise"], algo=od.ConvolutionFwdAlgo.DIRECT)) is None
    assert algorithm_refusal(problem_of(SMALL["1d"], algo=od.ConvolutionFwdAlgo.DIRECT)) is None
    assert "C/groups=8" in algorithm_refusal(problem_of(SMALL["2d_1x1"], algo=od.ConvolutionFwdAlgo.DIRECT))
    for algo in (*od.ConvolutionBwdDataAlgo, *od.ConvolutionBwdFilterAlgo):
        direction = (
            ConvolutionDirection.BACKWARD_DATA
            if isinstance(algo, od.ConvolutionBwdDataAlgo)
            else ConvolutionDirection.BACKWARD_FILTER
        )
        refusal = algorithm_refusal(problem_of(SMALL["2d"], direction, algo=algo))
        assert (refusal is None) == (algo.name.startswith("ALGO_")), (algo, refusal)


def test_unsupported_algorithm_raises_not_supported_with_reason():
    x, w, y = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.empty(1, 3, 3, 3)
    conv_desc = od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
    with pytest.raises(od.NotSupported, match="FFT_TILING.*is not implemented"):
        od.convolution_forward(
            od.create("cpu"),
            1.0,
            descriptor(x),
            x,
            descriptor(w),
            w,
            conv_desc,
            od.ConvolutionFwdAlgo.FFT_TILING,
            None,
            0.0,
            descriptor(y),
            y,
        )
    with pytest.raises(od.NotSupported, match="is not implemented"):
        od.get_convolution_backward_data_workspace_size(
            od.create("cpu"), descriptor(w), descriptor(y), conv_desc, descriptor(x), od.ConvolutionBwdDataAlgo.WINOGRAD
        )


def test_workspace_smaller_than_needed_is_refused_naming_both_sizes(monkeypatch):
    monkeypatch.setattr(numpy_convolution, "workspace_size", lambda problem: 4096)
    handle = od.create("cpu")
    x, w, y = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3), torch.empty(1, 3, 3, 3)
    conv_desc = od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
    algo = od.ConvolutionFwdAlgo.GEMM
    assert (
        od.get_convolution_forward_workspace_size(handle, descriptor(x), descriptor(w), conv_desc, descriptor(y), algo)
        == 4096
    )
    args = (handle, 1.0, descriptor(x), x, descriptor(w), w, conv_desc, algo)
    with pytest.raises(
        od.BadParam, match="workspace holds 1024 bytes but get_convolution_forward_workspace_size needs 4096 bytes"
    ):
        od.convolution_forward(*args, torch.empty(1024, dtype=torch.uint8), 0.0, descriptor(y), y)
    with pytest.raises(od.BadParam, match="workspace=None but get_convolution_forward_workspace_size needs 4096"):
        od.convolution_forward(*args, None, 0.0, descriptor(y), y)
    od.convolution_forward(*args, torch.empty(4096, dtype=torch.uint8), 0.0, descriptor(y), y)
    torch.testing.assert_close(y, TF.conv2d(x, w))


# ---- error samples -------------------------------------------------------------------------------


def _forward(x_shape, w_shape, y_shape, conv_desc, *, y=None, dtype=torch.float32, w_desc=None):
    x = torch.randn(x_shape, dtype=dtype)
    w = torch.randn(w_shape, dtype=dtype)
    y = torch.empty(y_shape, dtype=dtype) if y is None else y
    od.convolution_forward(
        od.create("cpu"),
        1.0,
        descriptor(x),
        x,
        w_desc or descriptor(w),
        w,
        conv_desc,
        od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
        None,
        0.0,
        od.TensorDescriptor(dtype, y_shape),
        y,
    )


CONV = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: _forward((2, 4, 5, 5), (6, 3, 3, 3), (2, 6, 5, 5), CONV),
            r"w_desc.dims\[1\]=3 must equal x_desc.dims\[1\]/group_count=4",
        ),
        (
            lambda: _forward(
                (2, 5, 5, 5),
                (6, 1, 3, 3),
                (2, 6, 5, 5),
                od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), group_count=2),
            ),
            r"x_desc.dims\[1\]=5 \(C\) must be a multiple of group_count=2",
        ),
        (
            lambda: _forward(
                (2, 4, 5, 5),
                (5, 2, 3, 3),
                (2, 5, 5, 5),
                od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), group_count=2),
            ),
            r"w_desc.dims\[0\]=5 \(K\) must be a multiple of group_count=2",
        ),
        (
            lambda: _forward(
                (2, 4, 3, 3), (6, 4, 5, 5), (2, 6, 1, 1), od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
            ),
            r"output spatial dim 0 = -1 must be at least 1",
        ),
        (lambda: _forward((2, 4, 5, 5), (6, 4, 3, 3), (2, 6, 4, 5), CONV), r"y_desc.dims\[2\]=4 must equal 5"),
        (
            lambda: _forward((2, 4, 5), (6, 4, 3, 3), (2, 6, 5, 5), CONV),
            r"x_desc.ndim=3 must equal 2 \+ conv_desc's 2 spatial dims",
        ),
        (
            lambda: _forward((2, 4, 5, 5), (6, 4, 3, 3), (2, 6, 5, 5), CONV, dtype=torch.float64),
            r"conv_desc.compute_type=FLOAT must be DOUBLE for DOUBLE tensors",
        ),
        (
            lambda: _forward((2, 4, 5, 5), (6, 4, 3, 3), (2, 6, 5, 5), CONV, y=torch.empty(299)),
            r"y_desc reaches 300 elements but y holds 299 from its start",
        ),
        (lambda: od.FilterDescriptor("float32", "CHWN", 6, 4, 3, 3), r"format='CHWN' must be a TensorFormat: one of"),
        (
            lambda: _forward(
                (2, 4, 5, 5),
                (6, 4, 3, 3),
                (2, 6, 5, 5),
                CONV,
                w_desc=od.FilterDescriptor("float32", od.TensorFormat.NCHW, 6, 4, 3),
            ),
            r"w_desc.ndim=3 must equal 2 \+ conv_desc's 2 spatial dims",
        ),
        (lambda: od.ConvolutionDescriptor((1, -1), (1, 1), (1, 1)), r"pad\[1\]=-1 must be at least 0"),
        (lambda: od.ConvolutionDescriptor((1, 1), (1, 0), (1, 1)), r"stride\[1\]=0 must be at least 1"),
        (lambda: od.ConvolutionDescriptor((1, 1), (1, 1), (1,)), r"len\(dilation\)=1 must equal len\(stride\)=2"),
        (
            lambda: od.ConvolutionDescriptor((1,), (1,), (1,), compute_type="float16"),
            r"compute_type=HALF must be FLOAT or DOUBLE",
        ),
    ],
)
def test_bad_parameters_are_refused_naming_the_parameter(call, message):
    with pytest.raises(od.BadParam, match=message):
        call()


def _fused(bias_shape, z_shape=(2, 6, 5, 5), beta_like=None):
    x, w, y = torch.randn(2, 4, 5, 5), torch.randn(6, 4, 3, 3), torch.empty(2, 6, 5, 5)
    bias, z = torch.randn(bias_shape), torch.randn(z_shape)
    od.convolution_bias_activation_forward(
        od.create("cpu"),
        1.0,
        descriptor(x),
        x,
        descriptor(w),
        w,
        CONV,
        od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
        None,
        1.0,
        descriptor(z),
        z,
        descriptor(bias),
        bias,
        od.ActivationDescriptor(od.ActivationMode.RELU),
        descriptor(y),
        y,
    )


def test_fused_bias_and_residual_shapes_are_checked():
    with pytest.raises(od.BadParam, match=r"bias_desc.dims=\[1, 5, 1, 1\] must be \[1, 6, 1, 1\]"):
        _fused((1, 5, 1, 1))
    with pytest.raises(od.BadParam, match=r"z_desc.dims=\[2, 6, 5, 4\] must equal y_desc.dims=\[2, 6, 5, 5\]"):
        _fused((1, 6, 1, 1), (2, 6, 5, 4))


def test_backward_bias_refuses_a_wrong_length():
    dy, db = torch.randn(2, 6, 5, 5), torch.empty(1, 5, 1, 1)
    with pytest.raises(od.BadParam, match=r"db_desc.dims=\[1, 5, 1, 1\] must be \[1, 6, 1, 1\]"):
        od.convolution_backward_bias(od.create("cpu"), 1.0, descriptor(dy), dy, 0.0, descriptor(db), db)


def test_algorithm_of_another_direction_is_refused():
    with pytest.raises(od.BadParam, match="must be a ConvolutionFwdAlgo for forward"):
        problem_of(SMALL["2d"], algo=od.ConvolutionBwdDataAlgo.ALGO_0)
    with pytest.raises(od.BadParam, match="algo=9 must be a ConvolutionFwdAlgo for forward"):
        problem_of(SMALL["2d"], algo=9)


def test_an_algorithm_given_as_cudnns_integer_value_is_its_member():
    assert problem_of(SMALL["2d"], algo=1) == problem_of(SMALL["2d"], algo=od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)
    x, w = random((2, 3, 6, 5), 5), random((4, 3, 3, 3), 6)
    y = torch.full((2, 4, 6, 5), float("nan"), dtype=torch.float64)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), compute_type=od.DataType.DOUBLE)
    args = (od.create("cpu"), 1.0, descriptor(x), x, descriptor(w), w, conv_desc, 0, None, 0.0, descriptor(y), y)
    od.convolution_forward(*args)  # 0: IMPLICIT_GEMM
    assert relative_error(y, TF.conv2d(x, w, padding=1)) < 1e-12


# ---- the cuDNN-shaped API details ----------------------------------------------------------------


def test_fused_forward_adds_y_itself_as_residual():
    x, w, bias = torch.randn(2, 4, 5, 5, dtype=torch.float64), torch.randn(6, 4, 3, 3, dtype=torch.float64), None
    y = torch.randn(2, 6, 5, 5, dtype=torch.float64)
    bias = torch.randn(1, 6, 1, 1, dtype=torch.float64)
    expected = torch.relu(0.5 * TF.conv2d(x, w, None, 1, 1) + 2.0 * y + bias)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), compute_type="float64")
    od.convolution_bias_activation_forward(
        od.create("cpu"),
        0.5,
        descriptor(x),
        x,
        descriptor(w),
        w,
        conv_desc,
        od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
        None,
        2.0,
        descriptor(y),
        y,
        descriptor(bias),
        bias,
        od.ActivationDescriptor(od.ActivationMode.RELU),
        descriptor(y),
        y,
    )
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_tf32_follows_descriptor_then_handle_math_type():
    from opendnn.families.convolution.api import allows_tf32

    default = od.ConvolutionDescriptor((0,), (1,), (1,))
    assert not allows_tf32(od.create("cpu"), default)
    assert allows_tf32(od.create("cpu", math_type=od.MathType.TENSOR_OP), default)
    fma = od.ConvolutionDescriptor((0,), (1,), (1,), math_type=od.MathType.FMA)
    assert not allows_tf32(od.create("cpu", math_type=od.MathType.TENSOR_OP), fma)


# ---- the Pythonic API against torch, both backends -----------------------------------------------

BACKENDS = ["numpy", "triton"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_conv_and_backward_match_torch(backend):
    handle = od.create("cpu", backend=backend)
    x = random((2, 4, 5, 6), 20).float().contiguous(memory_format=torch.channels_last).requires_grad_()
    w = random((6, 2, 3, 3), 21).float().requires_grad_()
    bias = random((6,), 22).float().requires_grad_()
    expected = TF.conv2d(x, w, bias, (2, 1), 1, (1, 2), 2)
    y = F.conv(x.detach(), w.detach(), bias.detach(), (2, 1), 1, (1, 2), 2, handle=handle)
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, expected.detach(), rtol=1e-5, atol=1e-5)
    dy = random(tuple(expected.shape), 23).float()
    expected.backward(dy)
    dx = F.conv_backward_data(dy, w.detach(), x.shape, (2, 1), 1, (1, 2), 2, handle=handle)
    dw = F.conv_backward_filter(x.detach(), dy, w.shape, (2, 1), 1, (1, 2), 2, handle=handle)
    db = F.conv_backward_bias(dy, handle=handle)
    for actual, wanted in ((dx, x.grad), (dw, w.grad), (db, bias.grad)):
        torch.testing.assert_close(actual, wanted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_conv_transpose_matches_torch(backend):
    x, w, bias = random((2, 4, 3, 4), 24).float(), random((4, 3, 3, 2), 25).float(), random((6,), 26).float()
    expected = TF.conv_transpose2d(x, w, bias, 2, 1, (1, 0), 2, (1, 2))
    actual = F.conv_transpose(x, w, bias, 2, 1, (1, 0), 2, (1, 2), handle=od.create("cpu", backend=backend))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_transpose_output_padding_past_the_stride(backend):
    """torch takes an output_padding below the stride or the dilation: at or past the stride (a dilation
    above it), the extra outputs are the ones the padding crops, uncropped; past padding + stride - 1
    no input reaches the last ones, refused by name."""
    handle = od.create("cpu", backend=backend)
    x = random((2, 4, 5, 6), 40)
    for stride, padding, dilation, extra in ((1, 1, 2, 1), (2, 1, 3, 2), (1, 2, 3, 2)):
        w = random((4, 3, 3, 2), 41)
        expected = TF.conv_transpose2d(x, w, None, stride, padding, extra, 1, dilation)
        actual = F.conv_transpose(x, w, None, stride, padding, extra, 1, dilation, handle=handle)
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    with pytest.raises(od.NotSupported, match=r"output_padding\[0\]=1 with padding\[0\]=0 and stride\[0\]=1"):
        F.conv_transpose(x, random((4, 3, 2, 2), 42), None, 1, 0, 1, 1, 2, handle=handle)


def test_functional_conv_1d_3d_same_padding_and_numpy_arrays():
    x1, w1 = random((2, 3, 9), 27), random((5, 3, 4), 28)
    torch.testing.assert_close(
        F.conv(x1, w1, padding="same", dilation=2), TF.conv1d(x1, w1, padding="same", dilation=2)
    )
    x3, w3 = random((1, 4, 4, 5, 3), 29), random((4, 1, 2, 3, 2), 30)
    torch.testing.assert_close(F.conv(x3, w3, None, (1, 2, 1), 1, 1, 4), TF.conv3d(x3, w3, None, (1, 2, 1), 1, 1, 4))
    y = F.conv(x1.numpy(), w1.numpy(), stride=2)
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, TF.conv1d(x1, w1, stride=2).numpy(), rtol=1e-12)


def test_functional_errors_name_the_argument():
    with pytest.raises(od.BadParam, match=r"output_padding\[0\]=2 must be at least 0 and below stride or dilation"):
        F.conv_transpose(torch.randn(1, 2, 3, 3), torch.randn(2, 2, 3, 3), stride=2, output_padding=2)
    with pytest.raises(od.BadParam, match="padding='same' needs stride 1"):
        F.conv(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), stride=2, padding="same")
    with pytest.raises(od.BadParam, match=r"stride=\(1, 2, 3\) must be an int or 2 ints"):
        F.conv(torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3), stride=(1, 2, 3))


# ---- algorithm choice: Get (heuristics) and Find (measurement, cached) ---------------------------


def _tensors(geometry):
    x, w = random(geometry.x_shape, 40).float(), random(geometry.w_shape, 41).float()
    conv_desc = geometry.descriptor(od.DataType.FLOAT)
    y = torch.empty(od.get_convolution_forward_output_dim(conv_desc, descriptor(x), descriptor(w)))
    return x, w, y, conv_desc


def test_get_ranks_usable_algorithms_first_without_running():
    x, w, y, conv_desc = _tensors(SMALL["2d_depthwise"])
    records = od.get_convolution_forward_algorithm(
        od.create("cpu"), descriptor(x), descriptor(w), conv_desc, descriptor(y)
    )
    assert [r.algo.name for r in records[:4]] == ["DIRECT", "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM"]
    assert all(r.status is od.Status.SUCCESS and r.time == -1.0 and r.deterministic for r in records[:4])
    assert {r.algo.name for r in records[4:]} == {"FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"}
    assert all(r.status is od.Status.NOT_SUPPORTED and "not implemented" in r.reason for r in records[4:])
    x, w, y, conv_desc = _tensors(SMALL["2d_1x1"])
    data = od.get_convolution_backward_data_algorithm(
        od.create("cpu"), descriptor(w), descriptor(y), conv_desc, descriptor(x), requested_count=2
    )
    assert [r.algo for r in data] == [od.ConvolutionBwdDataAlgo.ALGO_0, od.ConvolutionBwdDataAlgo.ALGO_1]
    filters = od.get_convolution_backward_filter_algorithm(
        od.create("cpu"), descriptor(x), descriptor(y), conv_desc, descriptor(w)
    )
    assert filters[0].algo is od.ConvolutionBwdFilterAlgo.ALGO_0 and len(filters) == 7


def test_get_refuses_algorithms_past_the_workspace_limit(monkeypatch):
    monkeypatch.setattr(
        numpy_convolution, "workspace_size", lambda problem: 10_000 if problem.algo is od.ConvolutionFwdAlgo.GEMM else 0
    )
    x, w, y, conv_desc = _tensors(SMALL["2d"])
    records = od.get_convolution_forward_algorithm(
        od.create("cpu", workspace_limit=4096), descriptor(x), descriptor(w), conv_desc, descriptor(y)
    )
    gemm = next(r for r in records if r.algo is od.ConvolutionFwdAlgo.GEMM)
    assert gemm.status is od.Status.NOT_SUPPORTED and gemm.memory == 10_000
    assert gemm.reason == "workspace of 10000 bytes exceeds handle.workspace_limit=4096"


def test_get_refuses_a_non_deterministic_algorithm_on_a_deterministic_handle(monkeypatch):
    monkeypatch.setattr(
        numpy_convolution,
        "deterministic",
        lambda problem: problem.algo is not od.ConvolutionFwdAlgo.GEMM,
        raising=False,
    )
    x, w, y, conv_desc = _tensors(SMALL["2d"])
    descs = (descriptor(x), descriptor(w), conv_desc, descriptor(y))
    strict = od.get_convolution_forward_algorithm(od.create("cpu"), *descs)
    gemm = next(r for r in strict if r.algo is od.ConvolutionFwdAlgo.GEMM)
    assert gemm.status is od.Status.NOT_SUPPORTED and not gemm.deterministic
    assert gemm.reason == "not deterministic, and the handle asks for deterministic algorithms"
    assert strict.index(gemm) > max(k for k, r in enumerate(strict) if r.status is od.Status.SUCCESS)
    loose = od.get_convolution_forward_algorithm(od.create("cpu", deterministic=False), *descs)
    gemm = next(r for r in loose if r.algo is od.ConvolutionFwdAlgo.GEMM)
    assert gemm.status is od.Status.SUCCESS and not gemm.deterministic and gemm.reason == ""


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_every_implemented_algorithm_is_deterministic(backend):
    x, w, y, conv_desc = _tensors(SMALL["2d_groups"])
    handle = od.create("cpu", backend=backend)
    records = [
        *od.get_convolution_forward_algorithm(handle, descriptor(x), descriptor(w), conv_desc, descriptor(y)),
        *od.get_convolution_backward_data_algorithm(handle, descriptor(w), descriptor(y), conv_desc, descriptor(x)),
        *od.get_convolution_backward_filter_algorithm(handle, descriptor(x), descriptor(y), conv_desc, descriptor(w)),
    ]
    usable = [r for r in records if r.status is od.Status.SUCCESS]
    assert len(usable) >= 6 and all(r.deterministic for r in usable)
    assert not any("deterministic" in r.reason for r in records)


def test_find_measures_caches_in_handle_and_file_and_survives_a_corrupt_file(tmp_path, monkeypatch):
    x, w, y, conv_desc = _tensors(SMALL["2d_1x1"])
    path = tmp_path / "algorithms.json"
    handle = od.create("cpu")
    args = (descriptor(x), x, descriptor(w), w, conv_desc, descriptor(y), y)
    records = od.find_convolution_forward_algorithm(handle, *args, cache_path=str(path))
    usable = [r for r in records if r.status is od.Status.SUCCESS]
    assert {r.algo.name for r in usable} == {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM"}
    assert [r.time for r in usable] == sorted(r.time for r in usable) and usable[0].time > 0
    torch.testing.assert_close(y, TF.conv2d(x, w))
    assert len(handle.algorithm_cache) == 1 and path.exists()

    calls = []
    monkeypatch.setattr(numpy_convolution, "run", lambda *a: calls.append(a))
    assert od.find_convolution_forward_algorithm(od.create("cpu"), *args, cache_path=str(path)) == records
    assert calls == []  # a new handle read the file: nothing ran

    path.write_text("{not json")
    again = od.find_convolution_forward_algorithm(od.create("cpu"), *args, cache_path=str(path))
    assert len(calls) > 0 and {r.algo for r in again} == {r.algo for r in records}


def test_find_backward_directions_rank_their_algorithms(tmp_path):
    x, w, y, conv_desc = _tensors(SMALL["2d_groups"])
    dy, dx, dw = random(tuple(y.shape), 42).float(), torch.empty_like(x), torch.empty_like(w)
    handle = od.create("cpu")
    data = od.find_convolution_backward_data_algorithm(
        handle, descriptor(w), w, descriptor(dy), dy, conv_desc, descriptor(dx), dx, requested_count=2, cache_path=""
    )
    assert {r.algo.name for r in data} == {"ALGO_0", "ALGO_1"}
    filters = od.find_convolution_backward_filter_algorithm(
        handle, descriptor(x), x, descriptor(dy), dy, conv_desc, descriptor(dw), dw, cache_path=""
    )
    assert {r.algo.name for r in filters if r.status is od.Status.SUCCESS} == {"ALGO_0", "ALGO_1", "ALGO_3"}
    assert not any(tmp_path.iterdir())


def test_default_algorithms_are_bitwise_repeatable_on_triton():
    geometry = SMALL["2d_stride_dilation"]
    x, w = random(geometry.x_shape, 50).float(), random(geometry.w_shape, 51).float()
    handle = od.create("cpu", backend="triton")
    runs = []
    for _ in range(2):
        y = F.conv(x, w, None, geometry.stride, geometry.pre, geometry.dilation, handle=handle)
        dw = F.conv_backward_filter(x, y, w.shape, geometry.stride, geometry.pre, geometry.dilation, handle=handle)
        runs.append((y, dw))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_identity_activation_is_accepted_by_both_fused_forms():
    gen = torch.Generator().manual_seed(12)
    x, w = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=gen), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    bias = torch.randn(4, dtype=torch.float64, generator=gen)
    expected = TF.conv2d(x, w, bias, padding=1)
    torch.testing.assert_close(F.conv_bias_activation(x, w, bias, activation="identity", padding=1), expected)
    y = torch.full_like(expected, float("nan"))
    od.convolution_bias_activation_forward(
        od.create("cpu"),
        1.0,
        descriptor(x),
        x,
        descriptor(w),
        w,
        od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), compute_type="float64"),
        od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
        None,
        0.0,
        None,
        None,
        od.TensorDescriptor("float64", (1, 4, 1, 1)),
        bias.reshape(1, 4, 1, 1),
        od.ActivationDescriptor(od.ActivationMode.IDENTITY),
        descriptor(y),
        y,
    )
    torch.testing.assert_close(y, expected)
