"""Convolution on the GPU (``pytest -m gpu``): the Pythonic API against torch (cuDNN) on the device, bitwise
determinism of the default algorithms, and the workspace each algorithm asks for."""

import math

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"


@pytest.mark.parametrize(
    "dtype, layout, tolerance",
    [
        (torch.bfloat16, torch.channels_last, 1e-2),
        (torch.float16, torch.channels_last, 1e-2),
        (torch.float32, torch.contiguous_format, 1e-5),
        (torch.float64, torch.contiguous_format, 1e-10),
    ],
)
def test_functional_conv_and_backward_match_torch_on_gpu(dtype, layout, tolerance):
    x = torch.randn(16, 64, 28, 28, device=DEVICE, dtype=dtype).contiguous(memory_format=layout)
    w = torch.randn(128, 32, 3, 3, device=DEVICE, dtype=dtype).contiguous(memory_format=layout)
    bias = torch.randn(128, device=DEVICE, dtype=dtype)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    expected = TF.conv2d(x64, w64, bias.double(), 2, 1, 1, 2)
    y = F.conv(x, w, bias, 2, 1, 1, 2)
    assert y.dtype == dtype and y.is_contiguous(memory_format=layout)
    assert relative_error(y, expected) < tolerance
    dy = torch.randn_like(y)
    expected.backward(dy.double())
    assert relative_error(F.conv_backward_data(dy, w, x.shape, 2, 1, 1, 2), x64.grad) < tolerance
    assert relative_error(F.conv_backward_filter(x, dy, w.shape, 2, 1, 1, 2), w64.grad) < tolerance
    assert relative_error(F.conv_backward_bias(dy), dy.double().sum((0, 2, 3))) < tolerance


def test_tf32_handle_stays_within_tf32_tolerance():
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, w = torch.randn(32, 128, 28, 28, device=DEVICE), torch.randn(128, 128, 3, 3, device=DEVICE)
    assert relative_error(F.conv(x, w, padding=1, handle=handle), TF.conv2d(x.double(), w.double(), padding=1)) < 1e-3


@pytest.mark.parametrize("spatial", [1, 3])
def test_functional_conv_1d_3d_and_transpose_match_torch_on_gpu(spatial):
    x = torch.randn(8, 32, *(14,) * spatial, device=DEVICE)
    w = torch.randn(48, 16, *(3,) * spatial, device=DEVICE)
    conv = {1: TF.conv1d, 3: TF.conv3d}[spatial]
    transpose = {1: TF.conv_transpose1d, 3: TF.conv_transpose3d}[spatial]
    assert relative_error(F.conv(x, w, None, 2, 1, 2, 2), conv(x.double(), w.double(), None, 2, 1, 2, 2)) < 1e-5
    wt = torch.randn(32, 8, *(3,) * spatial, device=DEVICE)
    assert (
        relative_error(F.conv_transpose(x, wt, None, 2, 1, 1, 4), transpose(x.double(), wt.double(), None, 2, 1, 1, 4))
        < 1e-5
    )


def _descriptor(t):
    return od.TensorDescriptor(t.dtype, tuple(t.shape), t.stride())


def test_default_algorithms_are_bitwise_deterministic_and_forward_needs_no_workspace():
    handle = od.create(DEVICE)
    x = torch.randn(32, 64, 56, 56, device=DEVICE, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device=DEVICE, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    xd, wd = _descriptor(x), _descriptor(w)
    yd = _descriptor(torch.empty_like(x))
    assert (
        od.get_convolution_forward_workspace_size(handle, xd, wd, conv_desc, yd, od.ConvolutionFwdAlgo.IMPLICIT_GEMM)
        == 0
    )
    data_bytes = od.get_convolution_backward_data_workspace_size(
        handle, wd, yd, conv_desc, xd, od.ConvolutionBwdDataAlgo.ALGO_0
    )
    filter_bytes = od.get_convolution_backward_filter_workspace_size(
        handle, xd, yd, conv_desc, wd, od.ConvolutionBwdFilterAlgo.ALGO_0
    )
    data_space = torch.empty(data_bytes, dtype=torch.uint8, device=DEVICE) if data_bytes else None
    filter_space = torch.empty(filter_bytes, dtype=torch.uint8, device=DEVICE) if filter_bytes else None
    runs = []
    for _ in range(2):
        y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
        od.convolution_forward(
            handle, 1.0, xd, x, wd, w, conv_desc, od.ConvolutionFwdAlgo.IMPLICIT_GEMM, None, 0.0, yd, y
        )
        od.convolution_backward_data(
            handle, 1.0, wd, w, yd, y, conv_desc, od.ConvolutionBwdDataAlgo.ALGO_0, data_space, 0.0, xd, dx
        )
        od.convolution_backward_filter(
            handle, 1.0, xd, x, yd, y, conv_desc, od.ConvolutionBwdFilterAlgo.ALGO_0, filter_space, 0.0, wd, dw
        )
        runs.append((y, dx, dw))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


def test_every_applicable_algorithm_reports_its_workspace():
    handle = od.create(DEVICE)
    x, w = torch.randn(64, 64, 56, 56, device=DEVICE), torch.randn(64, 64, 3, 3, device=DEVICE)
    y = torch.empty(64, 64, 56, 56, device=DEVICE)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    sizes = {}
    for algo in od.ConvolutionFwdAlgo:
        try:
            sizes[algo] = od.get_convolution_forward_workspace_size(
                handle, _descriptor(x), _descriptor(w), conv_desc, _descriptor(y), algo
            )
        except od.NotSupported:
            continue
    assert sizes[od.ConvolutionFwdAlgo.IMPLICIT_GEMM] == 0
    im2col = 64 * 56 * 56 * 64 * 9 * 4
    assert sizes[od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM] < im2col // 100
    assert sizes[od.ConvolutionFwdAlgo.GEMM] >= im2col


@pytest.mark.parametrize("size, channels", [(14, 256), (7, 512), (56, 64), (28, 128), (5, 64)])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_channels_last_3x3_bfloat16_is_within_its_own_rounding_of_float64(size, channels, direction):
    """Stride 1, channels-last bfloat16 (read by TMA): fp32 accumulation leaves only the output's
    rounding, so the error must be that of float64's result rounded to bfloat16. The samples'
    1e-2 let a wrong box through (6e-3 against 1.66e-3 on ResNet-50's 14 x 14 layer)."""

    def channels_last(t):
        return t.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)

    x, dy = (channels_last(torch.randn(32, channels, size, size, device=DEVICE)) for _ in range(2))
    w = channels_last(torch.randn(channels, channels, 3, 3, device=DEVICE) / math.sqrt(9 * channels))
    if direction == "forward":
        got, want = F.conv(x, w, padding=1), TF.conv2d(x.double(), w.double(), padding=1)
    elif direction == "backward_data":
        got = F.conv_backward_data(dy, w, x.shape, 1, 1)
        want = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), padding=1)
    else:
        got = F.conv_backward_filter(x, dy, w.shape, 1, 1)
        want = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), padding=1)
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(got, want) < 1.25 * rounding, (relative_error(got, want), rounding)


@pytest.mark.parametrize("size, channels", [(14, 256), (7, 512), (56, 64)])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_tf32_3x3_is_as_close_to_float64_as_cudnn_tf32(size, channels, layout, direction):
    """Stride-1 float32 on a TENSOR_OP handle (TMA with TF32 where it applies; NCHW backward reads
    channels-last copies): within 3x of cuDNN's own TF32 error against float64, and repeatable. The
    tensor cores truncate the float32 bits Triton gives them to TF32 where cuDNN rounds to nearest:
    2.6x cuDNN's error on the H200 (7.7e-4 against 2.9e-4, every layer); a wrong or racing box is 10x."""
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, dy = (torch.randn(32, channels, size, size, device=DEVICE).contiguous(memory_format=layout) for _ in range(2))
    w = (torch.randn(channels, channels, 3, 3, device=DEVICE) / math.sqrt(9 * channels)).contiguous(
        memory_format=layout
    )
    if direction == "forward":

        def ours():
            return F.conv(x, w, padding=1, handle=handle)

        def theirs(*t):
            return TF.conv2d(t[0], t[1], padding=1)

        inputs = (x, w)
    elif direction == "backward_data":

        def ours():
            return F.conv_backward_data(dy, w, x.shape, 1, 1, handle=handle)

        def theirs(*t):
            return torch.nn.grad.conv2d_input(x.shape, t[1], t[0], padding=1)

        inputs = (dy, w)
    else:

        def ours():
            return F.conv_backward_filter(x, dy, w.shape, 1, 1, handle=handle)

        def theirs(*t):
            return torch.nn.grad.conv2d_weight(t[0], w.shape, t[1], padding=1)

        inputs = (x, dy)
    want = theirs(*(t.double() for t in inputs))
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        cudnn_error = relative_error(theirs(*inputs), want)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    got = ours()
    assert relative_error(got, want) < 3 * cudnn_error, (relative_error(got, want), cudnn_error)
    assert torch.equal(got, ours())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nchw_1x1_backward_filter_as_per_image_products_on_gpu(dtype):
    """NCHW 1x1 backward filter as N products dy[n] @ x[n]^T summed in order: bfloat16 within its own
    rounding of float64, float32 (TF32) within 3x cuDNN's TF32 error; repeatable bit for bit."""
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x = torch.randn(32, 64, 56, 56, device=DEVICE, dtype=dtype)
    dy = torch.randn(32, 256, 56, 56, device=DEVICE, dtype=dtype)

    def ours():
        return F.conv_backward_filter(x, dy, (256, 64, 1, 1), handle=handle)

    want = torch.nn.grad.conv2d_weight(x.double(), (256, 64, 1, 1), dy.double())
    if dtype is torch.bfloat16:
        bound = 1.25 * relative_error(want.to(torch.bfloat16), want)
    else:
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = True
        try:
            bound = 3 * relative_error(torch.nn.grad.conv2d_weight(x, (256, 64, 1, 1), dy), want)
        finally:
            torch.backends.cudnn.allow_tf32 = saved
    got = ours()
    assert relative_error(got, want) < bound, (relative_error(got, want), bound)
    assert torch.equal(got, ours())
