"""The NumPy backend's BLAS formulation (im2col + batched matmul) against the float64 per-tap
reference, on random geometries: groups, strides, dilation, asymmetric padding, 1-D to 3-D, both
modes, every float dtype, beta blending into a prior output and beta == 0 over a NaN-poisoned one."""

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.core.arrays import Bound
from opendnn.families.convolution import numpy_backend
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem, reference
from opendnn.families.pointwise.problem import PointwiseMode

DIRECTIONS = list(ConvolutionDirection)
# dtype: (rtol, atol) of the fast path in that dtype against the float64 reference
TOLERANCE = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 2e-2),
    torch.bfloat16: (1e-2, 1e-1),
}


def random_geometry(seed):
    """(x dims, w dims, descriptor) of a random convolution with 1 to 3 spatial dims."""
    rng = np.random.default_rng(seed)
    spatial = 1 + seed % 3
    groups = int(rng.choice([1, 2, 3]))
    channels, filters = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
    filt = tuple(int(f) for f in rng.integers(1, 4, spatial))
    dilation = tuple(int(d) for d in rng.integers(1, 3, spatial))
    stride = tuple(int(s) for s in rng.integers(1, 4, spatial))
    pre = tuple(int(p) for p in rng.integers(0, 3, spatial))
    post = tuple(int(p) for p in rng.integers(0, 3, spatial))
    size = tuple(max(int(rng.integers(3, 9)), d * (f - 1) + 1) for d, f in zip(dilation, filt))
    mode = od.ConvolutionMode.CONVOLUTION if seed % 2 else od.ConvolutionMode.CROSS_CORRELATION
    x_dims = (int(rng.integers(1, 4)), channels, *size)
    w_dims = (filters, channels // groups, *filt)
    return x_dims, w_dims, (pre, stride, dilation, mode, groups, post)


def problem_of(seed, direction, dtype, **options):
    x_dims, w_dims, (pre, stride, dilation, mode, groups, post) = random_geometry(seed)
    compute = od.DataType.DOUBLE if dtype is torch.float64 else od.DataType.FLOAT
    conv_desc = od.ConvolutionDescriptor(
        pre, stride, dilation, mode, compute, groups, pre_padding=pre, post_padding=post
    )
    x_desc, w_desc = od.TensorDescriptor(dtype, x_dims), od.TensorDescriptor(dtype, w_dims)
    y_desc = od.TensorDescriptor(dtype, od.get_convolution_forward_output_dim(conv_desc, x_desc, w_desc))
    return convolution_problem(direction, conv_desc, x_desc, w_desc, y_desc, **options)


def uniform(shape, dtype, seed):
    return torch.from_numpy(np.random.default_rng(seed).uniform(-2, 2, shape)).to(dtype)


def check_against_reference(problem, dtype, seed, bias=None, z=None):
    """Run the NumPy backend into an output holding random values (beta != 0) or NaN (beta == 0)
    and compare with alpha * reference + beta * prior, all in float64 from the same inputs."""
    tensors = {
        name: uniform(desc.dims, dtype, seed + k)
        for k, (name, desc) in enumerate((("x", problem.x), ("w", problem.w), ("y", problem.y)))
    }
    output = {
        ConvolutionDirection.FORWARD: "y",
        ConvolutionDirection.BACKWARD_DATA: "x",
        ConvolutionDirection.BACKWARD_FILTER: "w",
    }[problem.direction]
    if problem.beta == 0.0:
        tensors[output].fill_(float("nan"))
    prior = tensors[output].double().numpy().copy()
    as64 = {name: t.double().numpy() for name, t in tensors.items()}
    extra = {name: None if t is None else t.double().numpy() for name, t in (("bias", bias), ("z", z))}
    expected = reference(problem, **{n: None if n == output else a for n, a in as64.items()}, **extra)
    if problem.beta != 0.0:
        expected = expected + problem.beta * prior
    bound = {name: Bound(name, getattr(problem, name), t, "cpu", name == output) for name, t in tensors.items()}
    bound_extra = {
        name: None if t is None else Bound(name, getattr(problem, name), t, "cpu")
        for name, t in (("bias", bias), ("z", z))
    }
    numpy_backend.run(problem, bound["x"], bound["w"], bound["y"], **bound_extra)
    actual = tensors[output].double().numpy()
    assert not np.isnan(actual).any()
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gemm_path_matches_reference_with_beta_blend(seed, direction, dtype):
    problem = problem_of(seed, direction, dtype, alpha=1.5, beta=-0.75)
    check_against_reference(problem, dtype, seed)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gemm_path_overwrites_a_nan_poisoned_output_when_beta_is_zero(seed, direction, dtype):
    problem = problem_of(seed, direction, dtype, alpha=0.5)
    check_against_reference(problem, dtype, seed)


def test_gemm_path_forward_epilogue_matches_reference():
    y_desc = problem_of(4, ConvolutionDirection.FORWARD, torch.float32).y
    bias_desc = od.TensorDescriptor(torch.float32, (1, y_desc.dims[1], 1, 1))
    problem = problem_of(
        4,
        ConvolutionDirection.FORWARD,
        torch.float32,
        alpha=1.25,
        alpha2=0.5,
        bias_desc=bias_desc,
        z_desc=y_desc,
        activation=PointwiseMode.RELU_FWD,
    )
    bias, z = uniform(bias_desc.dims, torch.float32, 98), uniform(y_desc.dims, torch.float32, 99)
    check_against_reference(problem, torch.float32, 4, bias=bias, z=z)


def test_gemm_path_reads_a_channels_last_strided_input():
    x_dims, w_dims = (2, 4, 7, 6), (6, 2, 3, 2)
    x = uniform((2, 7, 6, 4), torch.float32, 1).permute(0, 3, 1, 2)
    w = uniform(w_dims, torch.float32, 2)
    conv_desc = od.ConvolutionDescriptor((1, 0), (2, 1), (1, 2), group_count=2)
    x_desc = od.TensorDescriptor(torch.float32, x_dims, x.stride())
    w_desc = od.TensorDescriptor(torch.float32, w_dims)
    y_desc = od.TensorDescriptor(torch.float32, od.get_convolution_forward_output_dim(conv_desc, x_desc, w_desc))
    problem = convolution_problem(ConvolutionDirection.FORWARD, conv_desc, x_desc, w_desc, y_desc)
    y = torch.full(y_desc.dims, float("nan"))
    numpy_backend.run(
        problem, Bound("x", x_desc, x, "cpu"), Bound("w", w_desc, w, "cpu"), Bound("y", y_desc, y, "cpu", True)
    )
    expected = torch.nn.functional.conv2d(x.double(), w.double(), None, (2, 1), (1, 0), (1, 2), 2)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-5, atol=1e-4)


def test_small_convolutions_run_on_one_blas_thread_large_ones_on_all():
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="the BLAS thread limit needs threadpoolctl")

    def blas_threads():
        return [pool["num_threads"] for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas"]

    before = blas_threads()
    small = problem_of(0, ConvolutionDirection.FORWARD, torch.float32)
    with numpy_backend._blas_limit(small):
        assert blas_threads() == [1] * len(before)
    assert blas_threads() == before
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    x_desc, w_desc = (
        od.TensorDescriptor(torch.float32, (8, 64, 56, 56)),
        od.TensorDescriptor(torch.float32, (64, 64, 3, 3)),
    )
    y_desc = od.TensorDescriptor(torch.float32, (8, 64, 56, 56))
    large = convolution_problem(ConvolutionDirection.FORWARD, conv_desc, x_desc, w_desc, y_desc)
    with numpy_backend._blas_limit(large):
        assert blas_threads() == before


# Depthwise convolutions (one input channel per group) in float32 against the float64 reference: y of
# x's dims at unit strides (each tap a flat shift of x) and the padded planes' layout otherwise, with
# one or two filters per channel (the second on the im2col path); and the forward of one group with y
# of x's dims, whose columns are the same flat shifts.
DEPTHWISE = [  # x dims, groups, filters per group, filter, padding, stride, dilation
    ((2, 6, 9, 10), 6, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 6, 9, 10), 6, 2, (3, 3), (1, 1), (1, 1), (1, 1)),
    ((2, 6, 9, 10), 6, 1, (3, 3), (1, 1), (2, 2), (1, 1)),
    ((2, 6, 9, 10), 6, 1, (3, 3), (2, 2), (1, 1), (2, 2)),
    ((2, 6, 9, 10), 6, 2, (3, 2), (0, 1), (1, 2), (2, 1)),
    ((2, 6, 9, 10), 1, 5, (3, 3), (2, 1), (1, 1), (2, 1)),
]


def depthwise_tensor(dims, layout, region, seed):
    """Random float32 values of ``dims`` (N, C, H, W) held channels-last for "nhwc", and inside a
    larger NaN buffer (every dim 2 longer, offset 1) where ``region``: returns (tensor, buffer)."""
    order = (0, 2, 3, 1) if layout == "nhwc" else (0, 1, 2, 3)
    stored = tuple(dims[k] + 2 * region for k in order)
    buffer = torch.full(stored, float("nan"))
    inner = buffer[tuple(slice(1, -1) if region else slice(None) for _ in stored)]
    inner.copy_(uniform(inner.shape, torch.float32, seed))
    return inner.permute(*np.argsort(order)), buffer


@pytest.mark.parametrize("beta", [0.0, -0.75])
@pytest.mark.parametrize("region", [False, True], ids=["whole", "region"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("direction", DIRECTIONS, ids=lambda d: d.value)
@pytest.mark.parametrize("geometry", DEPTHWISE, ids=str)
def test_depthwise_float32_matches_the_float64_reference(geometry, direction, layout, region, beta):
    """Inputs and output in the layout, the output a strided sub-region of a NaN buffer (or all of its
    own memory) poisoned with NaN where beta is 0; the buffer around the region stays NaN."""
    x_dims, groups, filters, filt, padding, stride, dilation = geometry
    conv_desc = od.ConvolutionDescriptor(padding, stride, dilation, group_count=groups)
    w_dims = (filters * groups, x_dims[1] // groups, *filt)
    x, _ = depthwise_tensor(x_dims, layout, False, 1)
    w, _ = depthwise_tensor(w_dims, layout, False, 2)
    y_dims = od.get_convolution_forward_output_dim(
        conv_desc, od.TensorDescriptor(torch.float32, x_dims), od.TensorDescriptor(torch.float32, w_dims)
    )
    y, _ = depthwise_tensor(y_dims, layout, False, 3)
    tensors = {"x": x, "w": w, "y": y}
    output = {"forward": "y", "backward_data": "x", "backward_filter": "w"}[direction.value]
    tensors[output], buffer = depthwise_tensor(tensors[output].shape, layout, region, 4)
    if beta == 0.0:
        tensors[output].fill_(float("nan"))
    prior = tensors[output].double().numpy().copy()
    descs = {name: od.TensorDescriptor(torch.float32, tuple(t.shape), t.stride()) for name, t in tensors.items()}
    problem = convolution_problem(direction, conv_desc, descs["x"], descs["w"], descs["y"], alpha=1.0, beta=beta)
    as64 = {name: None if name == output else t.double().numpy() for name, t in tensors.items()}
    expected = reference(problem, **as64) + (beta * prior if beta else 0.0)
    bound = {name: Bound(name, descs[name], t, "cpu", name == output) for name, t in tensors.items()}
    numpy_backend.run(problem, bound["x"], bound["w"], bound["y"])
    np.testing.assert_allclose(tensors[output].double().numpy(), expected, rtol=1e-5, atol=1e-4)
    assert np.isnan(buffer.numpy()).sum() == buffer.numel() - tensors[output].numel()
