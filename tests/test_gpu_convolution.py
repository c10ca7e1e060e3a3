"""Convolution on the GPU (``pytest -m gpu``): the Pythonic API against torch (cuDNN) on the device, bitwise
determinism of the default algorithms, and the workspace each algorithm asks for."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as TF
from tf32 import cudnn_tf32

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


@pytest.mark.parametrize(
    "direction, dtype, memory_format, stride",
    [
        ("forward", torch.bfloat16, torch.channels_last_3d, 1),
        ("forward", torch.float32, torch.contiguous_format, 1),  # TF32: reads channels-last copies
        ("backward_data", torch.bfloat16, torch.channels_last_3d, 1),
        ("backward_data", torch.bfloat16, torch.channels_last_3d, 2),  # phases over rows and columns
        ("backward_data", torch.float32, torch.contiguous_format, 1),
    ],
)
def test_3d_convolutions_read_frames_by_tma_within_their_rounding_and_repeat_bitwise(
    direction, dtype, memory_format, stride
):
    """A video layer's 3x3x3 forward and backward data on the TMA route (a box a frame, each tap in
    depth moving the frame read): within 2x the error of the operands rounded to the dtype (TF32 for
    float32) against float64, and bitwise equal over two runs."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 6, 19, 19, generator=generator)  # odd: stride 2 needs no output padding
    w = torch.randn(48, 64, 3, 3, 3, generator=generator) / math.sqrt(27 * 64)
    out_size = (19 - 1) // stride + 1
    dy = torch.randn(4, 48, 6, out_size, out_size, generator=generator)
    x, w, dy = (t.to(DEVICE, dtype).contiguous(memory_format=memory_format) for t in (x, w, dy))
    conv = od.ConvolutionDescriptor((1, 1, 1), (1, stride, stride), (1, 1, 1), math_type=od.MathType.TENSOR_OP)
    forward = direction == "forward"
    descriptors = [_descriptor(t) for t in (x, w, dy)]
    direction_enum = ConvolutionDirection.FORWARD if forward else ConvolutionDirection.BACKWARD_DATA
    problem = convolution_problem(direction_enum, conv, *descriptors, allow_tf32=dtype is torch.float32)
    if dtype is torch.float32 and forward:
        problem = dataclasses.replace(problem, algo=od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)
    assert kernels.tma_blocks(problem) is not None
    if forward:
        run = lambda: F.conv(x, w, padding=1, handle=handle)  # noqa: E731
        want = TF.conv3d(x.double(), w.double(), padding=1)
        rounded = TF.conv3d(_rounded(x), _rounded(w), padding=1)
    else:
        strides = (1, stride, stride)
        run = lambda: F.conv_backward_data(dy, w, x.shape, strides, 1, handle=handle)  # noqa: E731
        want = torch.nn.grad.conv3d_input(x.shape, w.double(), dy.double(), stride=strides, padding=1)
        rounded = torch.nn.grad.conv3d_input(x.shape, _rounded(w), _rounded(dy), stride=strides, padding=1)
    got = run()
    bound = 2 * max(relative_error(rounded, want), relative_error(want.to(dtype), want))
    assert relative_error(got, want) < bound, (relative_error(got, want), bound)
    assert torch.equal(got, run())


def test_a_3d_forward_of_few_tiles_sums_its_reduction_slices_over_frames():
    """Batch 1, 256 channels of 4 x 8 x 8 (one box a frame): the forward slices its 27 taps x 2 chunks
    and ``slice_sum_kernel`` walks the frames, with bias and ReLU in its epilogue."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 256, 4, 8, 8, generator=generator)
    w = torch.randn(256, 256, 3, 3, 3, generator=generator) / math.sqrt(27 * 256)
    bias = torch.randn(256, generator=generator)
    x, w = (t.to(DEVICE, torch.bfloat16).contiguous(memory_format=torch.channels_last_3d) for t in (x, w))
    bias = bias.to(DEVICE, torch.bfloat16)
    y = torch.empty(1, 256, 4, 8, 8, device=DEVICE, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last_3d
    )
    conv = od.ConvolutionDescriptor((1, 1, 1), (1, 1, 1), (1, 1, 1))
    precomputed = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    problem = convolution_problem(ConvolutionDirection.FORWARD, conv, *(_descriptor(t) for t in (x, w, y)))
    assert kernels.reduction_slices(dataclasses.replace(problem, algo=precomputed))[0] > 1
    run = lambda: F.conv_bias_activation(x, w, bias, activation="relu", padding=1, algo=precomputed)  # noqa: E731
    want = TF.relu(TF.conv3d(x.double(), w.double(), bias.double(), padding=1))
    got = run()
    assert relative_error(got, want) < 1e-2
    assert torch.equal(got, run())


def _rounded(t):
    """``t`` in float64 as the tensor cores take it: float32 rounded to TF32's 10 mantissa bits."""
    if t.dtype is not torch.float32:
        return t.double()
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).double()


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


DEPTHWISE_LAYERS = [  # (channels, size, filter, stride, padding): ConvNeXt, EfficientNet, MobileNetV2, odd sizes
    (96, 56, 7, 1, 3),
    (240, 28, 5, 1, 2),
    (144, 56, 3, 2, 1),
    (40, 23, 3, 1, 1),
    (24, 19, 5, 3, 1),
]


@pytest.mark.parametrize("channels, size, filt, stride, pad", DEPTHWISE_LAYERS)
@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("direction", ["forward", "backward_data"])
def test_channels_last_depthwise_bfloat16_is_within_its_own_rounding_of_float64(
    channels, size, filt, stride, pad, packed, direction
):
    """The depthwise kernels (runs of output pixels along the rows where they apply) with the filter
    packed in the workspace (IMPLICIT_PRECOMP_GEMM, ALGO_1: the algorithms calls that name none take)
    and read in place (IMPLICIT_GEMM, ALGO_0): float32 sums leave only the output's rounding, written
    over NaN."""

    def channels_last(t):
        return t.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)

    handle = od.create(DEVICE)
    x = channels_last(torch.randn(8, channels, size, size, device=DEVICE))
    w = channels_last(torch.randn(channels, 1, filt, filt, device=DEVICE) / filt)
    want_y = TF.conv2d(x.double(), w.double(), stride=stride, padding=pad, groups=channels)
    dy = channels_last(torch.randn_like(want_y))
    conv_desc = od.ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1), group_count=channels)
    xd, wd, yd = _descriptor(x), _descriptor(w), _descriptor(dy)
    if direction == "forward":
        algo = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM if packed else od.ConvolutionFwdAlgo.IMPLICIT_GEMM
        size = od.get_convolution_forward_workspace_size(handle, xd, wd, conv_desc, yd, algo)
        got, want = torch.full_like(dy, float("nan")), want_y
    else:
        algo = od.ConvolutionBwdDataAlgo.ALGO_1 if packed else od.ConvolutionBwdDataAlgo.ALGO_0
        size = od.get_convolution_backward_data_workspace_size(handle, wd, yd, conv_desc, xd, algo)
        got = torch.full_like(x, float("nan"))
        want = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), stride=stride, padding=pad, groups=channels)
    assert (size > 0) is packed
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE) if size else None
    if direction == "forward":
        od.convolution_forward(handle, 1.0, xd, x, wd, w, conv_desc, algo, workspace, 0.0, yd, got)
    else:
        od.convolution_backward_data(handle, 1.0, wd, w, yd, dy, conv_desc, algo, workspace, 0.0, xd, got)
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(got, want) < 1.25 * rounding, (relative_error(got, want), rounding)


@pytest.mark.parametrize("size, channels", [(14, 256), (7, 512), (56, 64)])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_tf32_3x3_is_as_close_to_float64_as_cudnn_tf32(size, channels, layout, direction):
    """Stride-1 float32 on a TENSOR_OP handle (TMA with TF32 where it applies; NCHW backward reads
    channels-last copies), against float64, and repeatable. The tensor cores truncate the float32 bits
    they are given to TF32 where cuDNN rounds to nearest: 2.6x cuDNN's error on the H200 (7.7e-4
    against 2.9e-4, every layer), so operands read as the caller holds them are held to 3x. NCHW
    backward problems read copies of both operands rounded to nearest as they are staged, as cuDNN
    rounds: 1.5x. A wrong or racing box is 10x."""
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
    cudnn_error = relative_error(cudnn_tf32(theirs, *inputs), want)
    got = ours()
    bound = 1.5 if layout is torch.contiguous_format and direction != "forward" else 3
    assert relative_error(got, want) < bound * cudnn_error, (relative_error(got, want), cudnn_error)
    assert torch.equal(got, ours())


@pytest.mark.parametrize("channels, groups", [(224, 4), (256, 32)])  # RegNetY's 56 a group, ResNeXt's 8
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_tf32_grouped_nchw_is_within_tf32_of_float64(channels, groups, direction):
    """Grouped float32 over NCHW on a TENSOR_OP handle (every direction reading channels-last copies
    rounded to TF32 under the algorithm a call that names none takes): within 3x cuDNN's error against
    float64 where cuDNN runs TF32, and within TF32's truncation (1e-3) where it does not (its grouped
    backward data ran float32 on an H100: 3.9e-7), and repeatable."""
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, dy = (torch.randn(16, channels, 14, 14, device=DEVICE) for _ in range(2))
    w = torch.randn(channels, channels // groups, 3, 3, device=DEVICE) / math.sqrt(9 * channels // groups)
    if direction == "forward":
        inputs, ours = (x, w), lambda: F.conv(x, w, padding=1, groups=groups, handle=handle)

        def theirs(a, b):
            return TF.conv2d(a, b, padding=1, groups=groups)

    elif direction == "backward_data":
        inputs, ours = (dy, w), lambda: F.conv_backward_data(dy, w, x.shape, 1, 1, groups=groups, handle=handle)

        def theirs(a, b):
            return torch.nn.grad.conv2d_input(x.shape, b, a, padding=1, groups=groups)

    else:
        inputs, ours = (x, dy), lambda: F.conv_backward_filter(x, dy, w.shape, 1, 1, groups=groups, handle=handle)

        def theirs(a, b):
            return torch.nn.grad.conv2d_weight(a, w.shape, b, padding=1, groups=groups)

    want = theirs(*(t.double() for t in inputs))
    cudnn_error = relative_error(cudnn_tf32(theirs, *inputs), want)
    got = ours()
    assert relative_error(got, want) < max(3 * cudnn_error, 1e-3), (relative_error(got, want), cudnn_error)
    assert torch.equal(got, ours())


@pytest.mark.parametrize("c, size, k", [(64, 56, 64), (1024, 14, 256), (512, 7, 2048)])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
def test_tf32_1x1_is_within_tf32_of_float64(c, size, k, layout, direction):
    """ResNet-50's 1x1 layers at batch 8 in float32 on a TENSOR_OP handle, each direction and layout
    on its route (matrix products, per-image products, rasters read in place, TMA boxes): within
    TF32's error of float64 (operands truncated or rounded to TF32, float32 sums) and repeatable."""
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x = torch.randn(8, c, size, size, device=DEVICE).contiguous(memory_format=layout)
    dy = torch.randn(8, k, size, size, device=DEVICE).contiguous(memory_format=layout)
    w = (torch.randn(k, c, 1, 1, device=DEVICE) / math.sqrt(c)).contiguous(memory_format=layout)
    if direction == "forward":
        want = TF.conv2d(x.double(), w.double())

        def ours():
            return F.conv(x, w, handle=handle)
    elif direction == "backward_data":
        want = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double())

        def ours():
            return F.conv_backward_data(dy, w, x.shape, handle=handle)
    else:
        want = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double())

        def ours():
            return F.conv_backward_filter(x, dy, w.shape, handle=handle)

    got = ours()
    assert relative_error(got, want) < 1e-3, relative_error(got, want)
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
        bound = 3 * relative_error(cudnn_tf32(torch.nn.grad.conv2d_weight, x, (256, 64, 1, 1), dy), want)
    got = ours()
    assert relative_error(got, want) < bound, (relative_error(got, want), bound)
    assert torch.equal(got, ours())


# ---- the warp-specialized engine (convolution/gluon_hopper.py) --------------------------------------

# (batch, C, H, W, K): ResNet-50's stride-1 3x3 layers, then sizes no box divides and K no channel tile
# divides (C and K whole 64-channel chunks: each is the reduced dim of one direction)
ENGINE_SHAPES = [
    (2, 64, 56, 56, 64),
    (4, 128, 28, 28, 128),
    (8, 256, 14, 14, 256),
    (8, 512, 7, 7, 512),
    (3, 192, 13, 21, 192),
    (5, 64, 9, 30, 320),
    (4, 96, 28, 28, 128),  # reductions of fewer or not whole 64-channel chunks: zeros past the channels
    (8, 32, 28, 28, 64),
    (8, 128, 28, 28, 32),
]


def _sub_region(n, c, h, w, fill=None):
    """An (N, C, H, W) channels-last bfloat16 view inside a NaN-filled buffer larger in every dim but
    N, 16-byte aligned (what TMA reads), and the buffer; ``fill``: values for the view."""
    buffer = torch.full((n, h + 2, w + 3, c + 8), math.nan, dtype=torch.bfloat16, device=DEVICE)
    view = buffer[:, 1 : h + 1, 2 : w + 2, 8:].permute(0, 3, 1, 2)
    if fill is not None:
        view.copy_(fill)
    return view, buffer


def _untouched_outside(view, buffer):
    """Every element of ``buffer`` outside ``view`` still NaN."""
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[:, 1 : view.shape[2] + 1, 2 : view.shape[3] + 2, 8:] = True
    return bool(buffer[~inside].isnan().all())


def _assert_repeatable_within_rounding(run_once, out, buffer, prior, want):
    """``run_once`` (which writes ``out``, a view into ``buffer``) four times, ``out`` NaN before each
    (or ``prior``): the runs bitwise equal, within 1.25x of ``want`` rounded to bfloat16 (the TMA
    kernel's test), and nothing in ``buffer`` outside ``out`` written."""
    runs = []
    for _ in range(4):
        out.copy_(torch.full_like(out, math.nan) if prior is None else prior)
        run_once()
        runs.append(out.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(runs[0], want) < 1.25 * rounding, (relative_error(runs[0], want), rounding)
    assert _untouched_outside(out, buffer)


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("n, c, h, w, k", ENGINE_SHAPES)
def test_warp_specialized_engine_is_within_bfloat16_rounding_and_repeatable(n, c, h, w, k, direction, beta):
    """Stride 1, pad 1, in strided sub-regions: the engine's result is float64's rounded to bfloat16
    (1.25x its rounding, as the TMA kernel's test), bitwise equal over 4 runs, and nothing outside the
    output is written. beta = 0: the output is NaN before each run; beta = 0.5: it holds a prior."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    x, _ = _sub_region(n, c, h, w, torch.randn(n, c, h, w))
    dy, _ = _sub_region(n, k, h, w, torch.randn(n, k, h, w))
    filt = (torch.randn(k, c, 3, 3) / math.sqrt(9 * c)).to(DEVICE, torch.bfloat16)
    filt = filt.contiguous(memory_format=torch.channels_last)
    forward = direction == "forward"
    out, buffer = _sub_region(n, k if forward else c, h, w)
    prior = torch.randn(out.shape, device=DEVICE).to(torch.bfloat16)
    if forward:
        want = TF.conv2d(x.double(), filt.double(), padding=1)
    else:
        want = torch.nn.grad.conv2d_input(x.shape, filt.double(), dy.double(), padding=1)
    want = want + beta * prior.double()
    xd, wd, dyd, outd = _descriptor(x), _descriptor(filt), _descriptor(dy), _descriptor(out)
    problem = convolution_problem(
        ConvolutionDirection.FORWARD if forward else ConvolutionDirection.BACKWARD_DATA,
        conv_desc,
        xd if forward else outd,
        wd,
        outd if forward else dyd,
        beta=beta,
    )
    planned = kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0))
    assert planned is kernels.Strategy.WARP_SPECIALIZED_TMA

    def run_once():
        if forward:
            algo = od.ConvolutionFwdAlgo.IMPLICIT_GEMM
            od.convolution_forward(handle, 1.0, xd, x, wd, filt, conv_desc, algo, None, beta, outd, out)
        else:
            algo = od.ConvolutionBwdDataAlgo.ALGO_0
            od.convolution_backward_data(handle, 1.0, wd, filt, dyd, dy, conv_desc, algo, None, beta, outd, out)

    _assert_repeatable_within_rounding(run_once, out, buffer, prior if beta else None, want)


@pytest.mark.parametrize("n, c, h, w, k", [ENGINE_SHAPES[0], ENGINE_SHAPES[4]])
def test_warp_specialized_engine_fuses_bias_relu_and_residual(n, c, h, w, k):
    """y = relu(0.75 * conv(x, w) + 0.5 * z + bias), written into a sub-region poisoned with NaN."""
    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    x, _ = _sub_region(n, c, h, w, torch.randn(n, c, h, w))
    z, _ = _sub_region(n, k, h, w, torch.randn(n, k, h, w))
    y, buffer = _sub_region(n, k, h, w)
    filt = (torch.randn(k, c, 3, 3) / math.sqrt(9 * c)).to(DEVICE, torch.bfloat16)
    filt = filt.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(1, k, 1, 1, device=DEVICE).to(torch.bfloat16)
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    xd, wd, yd, zd, bd = (_descriptor(t) for t in (x, filt, y, z, bias))
    algo = od.ConvolutionFwdAlgo.IMPLICIT_GEMM
    od.convolution_bias_activation_forward(
        handle, 0.75, xd, x, wd, filt, conv_desc, algo, None, 0.5, zd, z, bd, bias, relu, yd, y
    )
    want = torch.relu(0.75 * TF.conv2d(x.double(), filt.double(), padding=1) + 0.5 * z.double() + bias.double())
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(y, want) < 1.25 * rounding, (relative_error(y, want), rounding)
    assert _untouched_outside(y, buffer)


@pytest.mark.parametrize("flip, beta", [(False, 0.0), (True, 0.5)])
@pytest.mark.parametrize("n, c, h, w, k", ENGINE_SHAPES)
def test_warp_specialized_backward_filter_is_within_bfloat16_rounding_and_repeatable(n, c, h, w, k, flip, beta):
    """Stride 1, pad 1, x and dy in strided sub-regions, dw a KRSC view inside a NaN-filled buffer:
    dw is float64's rounded to bfloat16 (1.25x its rounding), bitwise equal over 4 runs (the slices'
    partials summed in order), and nothing outside dw is written. beta = 0.5: dw holds a prior."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE)
    mode = od.ConvolutionMode.CONVOLUTION if flip else od.ConvolutionMode.CROSS_CORRELATION
    conv_desc = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1), mode)
    x, _ = _sub_region(n, c, h, w, torch.randn(n, c, h, w))
    dy, _ = _sub_region(n, k, h, w, torch.randn(n, k, h, w))
    buffer = torch.full((k, 3, 3, c + 8), math.nan, dtype=torch.bfloat16, device=DEVICE)
    dw = buffer[:, :, :, 8:].permute(0, 3, 1, 2)
    prior = torch.randn(dw.shape, device=DEVICE).to(torch.bfloat16)
    want = torch.nn.grad.conv2d_weight(x.double(), dw.shape, dy.double(), padding=1)
    if flip:
        want = want.flip(2, 3)
    want = want + beta * prior.double()
    xd, dwd, dyd = _descriptor(x), _descriptor(dw), _descriptor(dy)
    problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv_desc, xd, dwd, dyd, beta=beta)
    assert kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    size = od.get_convolution_backward_filter_workspace_size(handle, xd, dyd, conv_desc, dwd, algo)
    workspace = torch.full((size,), 255, dtype=torch.uint8, device=DEVICE)  # partials start as NaN
    runs = []
    for _ in range(4):
        dw.copy_(prior if beta else torch.full_like(prior, math.nan))
        od.convolution_backward_filter(handle, 1.0, xd, x, dyd, dy, conv_desc, algo, workspace, beta, dwd, dw)
        runs.append(dw.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(runs[0], want) < 1.25 * rounding, (relative_error(runs[0], want), rounding)
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, :, :, 8:] = False
    assert bool(buffer[outside].isnan().all())


def _backward_filter_runs(handle, conv_desc, xd, x, dyd, dy, dwd, dw, count):
    """dw by ``od.convolution_backward_filter`` (alpha 1, beta 0) ``count`` times, dw and the workspace's
    partial filters NaN before each: each run's dw."""
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    size = od.get_convolution_backward_filter_workspace_size(handle, xd, dyd, conv_desc, dwd, algo)
    workspace = torch.empty((max(size, 1),), dtype=torch.uint8, device=DEVICE)
    runs = []
    for _ in range(count):
        dw.fill_(math.nan)
        workspace.fill_(255)
        od.convolution_backward_filter(handle, 1.0, xd, x, dyd, dy, conv_desc, algo, workspace, 0.0, dwd, dw)
        runs.append(dw.clone())
    return runs


@pytest.mark.parametrize("filt, pad", [(3, 1), (1, 0)])
def test_warp_specialized_backward_filter_reads_strided_x_through_its_phase_view(filt, pad):
    """ResNet-50's stride-2 3x3 and 1x1 layers at batch 4: dw within 1.25x bfloat16's rounding of
    float64 and bitwise equal over 3 runs, on the engine."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor((pad, pad), (2, 2), (1, 1))
    out = (56 + 2 * pad - filt) // 2 + 1
    x = torch.randn(4, 128, 56, 56, device=DEVICE).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(4, 128, out, out, device=DEVICE).to(torch.bfloat16)
    dy = dy.contiguous(memory_format=torch.channels_last)
    dw = torch.empty(128, 128, filt, filt, device=DEVICE, dtype=torch.bfloat16)
    dw = dw.contiguous(memory_format=torch.channels_last)
    want = torch.nn.grad.conv2d_weight(x.double(), dw.shape, dy.double(), stride=2, padding=pad)
    xd, dwd, dyd = _descriptor(x), _descriptor(dw), _descriptor(dy)
    problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv_desc, xd, dwd, dyd)
    assert kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA
    runs = _backward_filter_runs(handle, conv_desc, xd, x, dyd, dy, dwd, dw, 3)
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    rounding = relative_error(want.to(torch.bfloat16), want)
    assert relative_error(runs[0], want) < 1.25 * rounding, (relative_error(runs[0], want), rounding)


# (batch, C, H, W, K, pre padding, post padding, stride, dilation): layers whose pixel boxes run past OH
# and OW; the 7 x 7 one gives the engine 576 units of one box, 4-5 a program, so a program rewrites
# x's descriptor while the ring still holds the previous unit's loads; in the last, the taps of filter
# rows 0 and 2 read only padding
EDGE_LAYERS = [
    (2, 64, 6, 7, 64, (1, 1), (1, 1), (1, 1), (1, 1)),
    (4, 128, 12, 14, 128, (1, 1), (1, 1), (2, 2), (1, 1)),
    (2, 1024, 7, 7, 1024, (1, 1), (1, 1), (1, 1), (1, 1)),
    (2, 64, 2, 8, 64, (3, 1), (3, 1), (1, 1), (3, 1)),
]


@pytest.mark.parametrize("kernel", ["filter_warp_specialized_kernel", "filter_tma_kernel"])
@pytest.mark.parametrize("n, c, h, w, k, pre, post, stride, dilation", EDGE_LAYERS)
def test_boxed_backward_filters_keep_an_infinite_x_to_the_taps_that_read_it(
    monkeypatch, n, c, h, w, k, pre, post, stride, dilation, kernel
):
    """x infinite in image 0's last column and image 1's last row: dw finite wherever float64's is
    (dy's zero fill past OH and OW never meets a real x pixel: no 0 * inf), within 1.25x bfloat16's
    rounding there, NaN and inf where float64 has them, zeros for taps that read only padding, and
    bitwise equal over 3 runs with dw and the partials NaN before each. filter_tma_kernel runs where
    the engine would (the backend told the GPU has no wgmma)."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import (
        ConvolutionDirection,
        convolution_problem,
        reference_backward_filter,
    )
    from opendnn.kernels.launch import Launch

    if kernel == "filter_tma_kernel":
        monkeypatch.setattr(kernels, "has_wgmma", lambda device: False)
    launched, launch = [], Launch.launch

    def recorded(self, tensors):
        launched.append(self.kernel.__name__)
        launch(self, tensors)

    monkeypatch.setattr(Launch, "launch", recorded)
    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor(pre, stride, dilation, pre_padding=pre, post_padding=post)
    generator = torch.Generator().manual_seed(5)
    out = [(s + a + b - d * 2 - 1) // t + 1 for s, a, b, d, t in zip((h, w), pre, post, dilation, stride)]
    x = torch.randn(n, c, h, w, generator=generator).to(DEVICE, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    x[0, :, :, -1] = math.inf
    x[1, :, -1, :] = -math.inf
    dy = torch.randn(n, k, *out, generator=generator).to(DEVICE, torch.bfloat16)
    dy = dy.contiguous(memory_format=torch.channels_last)
    dw = torch.empty(k, c, 3, 3, device=DEVICE, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    xd, dwd, dyd = _descriptor(x), _descriptor(dw), _descriptor(dy)
    problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv_desc, xd, dwd, dyd)
    want = torch.from_numpy(reference_backward_filter(problem, x.double().cpu().numpy(), dy.double().cpu().numpy()))
    assert want.isfinite().any() and (want == 0).any() == (pre[0] == 3)  # zeros: the taps of padding alone
    runs = _backward_filter_runs(handle, conv_desc, xd, x, dyd, dy, dwd, dw, 3)
    assert kernel in launched, launched
    assert all(torch.equal(runs[0].view(torch.int16), run.view(torch.int16)) for run in runs[1:])  # NaN too
    got = runs[0].double().cpu()
    rounding = relative_error(want.to(torch.bfloat16), want)
    # inf unless dw is finite wherever float64 is and has float64's NaN and inf; 0 where bfloat16 holds
    # float64's products exactly (the layer of padding taps)
    assert relative_error(got, want) <= 1.25 * rounding, (relative_error(got, want), rounding)
    assert (got[want == 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_3d_backward_filter_over_rasters_matches_float64_and_repeats_bitwise(dtype, memory_format):
    """A video layer's 3x3x3 backward filter (batch 2, 64 channels, 8 frames of 28 x 28) on the raster
    route (``convolution/triton_raster.py``; float32 as TF32): 3 runs with dw and the workspace
    poisoned before each, bitwise equal, within the dtype's product error of float64."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    conv_desc = od.ConvolutionDescriptor((1, 1, 1), (1, 1, 1), (1, 1, 1))
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 64, 8, 28, 28, generator=generator).to(DEVICE, dtype).contiguous(memory_format=memory_format)
    dy = torch.randn(2, 64, 8, 28, 28, generator=generator).to(DEVICE, dtype).contiguous(memory_format=memory_format)
    dw = torch.empty(64, 64, 3, 3, 3, device=DEVICE, dtype=dtype).contiguous(memory_format=memory_format)
    kind = od.DataType.FLOAT if dtype == torch.float32 else od.DataType.BFLOAT16
    descriptors = [od.TensorDescriptor(kind, tuple(t.shape), t.stride()) for t in (x, dy, dw)]
    xd, yd, wd = descriptors
    problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv_desc, xd, wd, yd, allow_tf32=True)
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    size = od.get_convolution_backward_filter_workspace_size(handle, xd, yd, conv_desc, wd, algo)
    runs = []
    for _ in range(3):
        dw.fill_(math.nan)
        workspace = torch.full((size,), 255, dtype=torch.uint8, device=DEVICE)
        od.convolution_backward_filter(handle, 1.0, xd, x, yd, dy, conv_desc, algo, workspace, 0.0, wd, dw)
        runs.append(dw.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    want = torch.nn.grad.conv3d_weight(x.double(), dw.shape, dy.double(), padding=1)
    assert relative_error(runs[0].double(), want) < (6e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize(
    "channels, size, filt, stride, dtype, layout, math_type, bound",
    [  # conv1's shape at batch 4 (bf16; TF32 in both layouts; strict float32), a gray 3x3, a video stem
        (3, (224, 224), (7, 7), 2, torch.bfloat16, torch.channels_last, od.MathType.DEFAULT, 1e-2),
        (3, (224, 224), (7, 7), 2, torch.float32, torch.channels_last, od.MathType.TENSOR_OP, 6e-4),
        (3, (224, 224), (7, 7), 2, torch.float32, torch.contiguous_format, od.MathType.TENSOR_OP, 6e-4),
        (3, (224, 224), (7, 7), 2, torch.float32, torch.contiguous_format, od.MathType.DEFAULT, 1e-5),
        (1, (63, 65), (3, 3), 1, torch.bfloat16, torch.contiguous_format, od.MathType.DEFAULT, 1e-2),
        (3, (8, 56, 56), (3, 7, 7), 2, torch.bfloat16, torch.contiguous_format, od.MathType.DEFAULT, 1e-2),
    ],
)
def test_a_forward_with_few_channels_reads_x_padded_and_matches_float64_on_gpu(
    planned_convolutions, channels, size, filt, stride, dtype, layout, math_type, bound
):
    """A call naming no algorithm over fewer than four input channels takes IMPLICIT_PRECOMP_GEMM's
    padded copy of x (``pads_channels``), TF32 with the filter copied rounded beside it, and lands
    within its precision's error of float64: bf16 y rounded once, TF32 operands rounded to nearest,
    or float32 sums; repeatable bit for bit."""
    handle = od.create(DEVICE, math_type=math_type)
    x = torch.randn(4, channels, *size, device=DEVICE, dtype=dtype)
    if layout is torch.channels_last:
        x = x.contiguous(memory_format=layout)
    w = torch.randn(64, channels, *filt, device=DEVICE, dtype=dtype) / math.sqrt(channels * math.prod(filt))
    padding = tuple(f // 2 for f in filt)
    conv = {2: TF.conv2d, 3: TF.conv3d}[len(size)]
    want = conv(x.double(), w.double(), stride=stride, padding=padding)
    got = F.conv(x, w, stride=stride, padding=padding, handle=handle)
    tf32 = dtype == torch.float32 and math_type is od.MathType.TENSOR_OP  # the filter copied rounded too
    copies = ["pad_channels_kernel", *["staging_kernel"] * tf32]
    assert [kernels for _, _, kernels in planned_convolutions] == [[*copies, "conv_gemm_kernel"]]
    assert relative_error(got.double(), want) < bound, relative_error(got.double(), want)
    assert torch.equal(got, F.conv(x, w, stride=stride, padding=padding, handle=handle))


@pytest.mark.parametrize(
    "channels, size, filt, stride, dtype, layout, bound",
    [  # conv1's shape at batch 4 (bf16 NHWC, fp16 NCHW), a gray 3x3, a video stem
        (3, (224, 224), (7, 7), 2, torch.bfloat16, torch.channels_last, 1e-2),
        (3, (224, 224), (7, 7), 2, torch.float16, torch.contiguous_format, 1e-3),
        (1, (63, 65), (3, 3), 1, torch.bfloat16, torch.channels_last, 1e-2),
        (3, (8, 56, 56), (3, 7, 7), 2, torch.bfloat16, torch.contiguous_format, 1e-2),
    ],
)
def test_a_backward_filter_with_few_channels_reads_x_padded_and_matches_float64_on_gpu(
    planned_convolutions, channels, size, filt, stride, dtype, layout, bound
):
    """A 16-bit backward filter naming no algorithm over fewer than four input channels takes ALGO_3's
    padded copy of x (``pads_channels``), its slices summed in order: within its precision's error of
    float64 and repeatable bit for bit."""
    handle = od.create(DEVICE)
    x = torch.randn(4, channels, *size, device=DEVICE, dtype=dtype)
    padding = tuple(f // 2 for f in filt)
    out = [(s + 2 * p - f) // stride + 1 for s, p, f in zip(size, padding, filt)]
    dy = torch.randn(4, 64, *out, device=DEVICE, dtype=dtype)
    if layout is torch.channels_last:
        x, dy = x.contiguous(memory_format=layout), dy.contiguous(memory_format=layout)
    w_shape = (64, channels, *filt)
    weight_gradient = {2: torch.nn.grad.conv2d_weight, 3: torch.nn.grad.conv3d_weight}[len(size)]
    want = weight_gradient(x.double(), w_shape, dy.double(), stride, padding)
    got = F.conv_backward_filter(x, dy, w_shape, stride=stride, padding=padding, handle=handle)
    assert [kernels[:2] for _, _, kernels in planned_convolutions] == [["pad_channels_kernel", "filter_gemm_kernel"]]
    assert relative_error(got.double(), want) < bound, relative_error(got.double(), want)
    again = F.conv_backward_filter(x, dy, w_shape, stride=stride, padding=padding, handle=handle)
    assert torch.equal(got, again)


@pytest.mark.parametrize(
    "dtype, layout, math_type, bound",
    [
        (torch.bfloat16, torch.channels_last, od.MathType.DEFAULT, 1e-2),
        (torch.float32, torch.contiguous_format, od.MathType.TENSOR_OP, 6e-4),
        (torch.float32, torch.contiguous_format, od.MathType.DEFAULT, 1e-5),
    ],
)
def test_gemms_backward_data_of_conv1_gathers_the_products_and_matches_float64_on_gpu(
    planned_convolutions, dtype, layout, math_type, bound
):
    """ResNet-50's conv1 at batch 4 under ALGO_1: the product's float sums in the workspace, gathered
    into dx in tap order (``triton_col2im``): within its precision's error of float64, bit for bit
    repeatable."""
    handle = od.create(DEVICE, math_type=math_type)
    w = (torch.randn(64, 3, 7, 7, device=DEVICE) / math.sqrt(147)).to(dtype).contiguous(memory_format=layout)
    dy = torch.randn(4, 64, 112, 112, device=DEVICE, dtype=dtype).contiguous(memory_format=layout)
    algo = od.ConvolutionBwdDataAlgo.ALGO_1

    def gradient():
        return F.conv_backward_data(dy, w, (4, 3, 224, 224), stride=2, padding=3, algo=algo, handle=handle)

    got = gradient()
    assert [kernels for _, _, kernels in planned_convolutions] == [["col2im_product_kernel", "col2im_gather_kernel"]]
    want = torch.nn.grad.conv2d_input((4, 3, 224, 224), w.double(), dy.double(), 2, 3)
    assert relative_error(got.double(), want) < bound, relative_error(got.double(), want)
    assert torch.equal(got, gradient())


@pytest.mark.parametrize(
    "dtype, layout, tolerance",
    [(torch.bfloat16, torch.channels_last, 1e-2), (torch.float32, torch.contiguous_format, 1e-3)],
)
@pytest.mark.parametrize("n, c, size", [(1, 256, 14), (1, 512, 7), (2, 128, 28)])
def test_a_forward_of_few_tiles_sliced_over_the_sms_matches_torch_and_repeats_bitwise(
    n, c, size, dtype, layout, tolerance
):
    """Batch-1 layers on the TMA route split their reduction into slices (``reduction_slices``); the
    slices' partial sums add in a fixed order, so two calls agree to the bit; bias and relu in the
    epilogue that finishes them."""
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x = torch.randn(n, c, size, size, device=DEVICE, dtype=dtype).contiguous(memory_format=layout)
    w = (torch.randn(c, c, 3, 3, device=DEVICE, dtype=dtype) / math.sqrt(9 * c)).contiguous(memory_format=layout)
    bias = torch.randn(c, device=DEVICE, dtype=dtype)
    expected = TF.conv2d(x.double(), w.double(), bias.double(), padding=1).relu()
    first = F.conv_bias_activation(x, w, bias, activation="relu", padding=1, handle=handle)
    second = F.conv_bias_activation(x, w, bias, activation="relu", padding=1, handle=handle)
    assert relative_error(first, expected) < tolerance
    assert torch.equal(first, second)
