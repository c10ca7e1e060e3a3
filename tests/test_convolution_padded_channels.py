"""Forwards with fewer input channels than a vector (an image's first layer) through Triton's
interpreter: under IMPLICIT_PRECOMP_GEMM (what a call that names no algorithm takes for them) x is
copied channels-last into the workspace with PIXEL_CHANNELS channels a pixel, zeros past its own
(``pad_channels_kernel``), and ``conv_gemm_kernel`` reduces over every channel of the copy, its taps
computed (no offset table), the filter's missing channels masked to zero. Results are held to the
float64 convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as TF
from test_convolution_tf32_staging import tf32_nearest

import opendnn as od
import opendnn.functional as F
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
from opendnn.samples import relative_error

PRECOMP, IMPLICIT = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, od.ConvolutionFwdAlgo.IMPLICIT_GEMM
S = kernels.Strategy
PADDED = ["pad_channels_kernel", "conv_gemm_kernel"]  # the taps computed: no table
BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}  # float32 sums; y rounded once


def handle():
    return od.create("cpu", backend="triton")


def random(shape, seed, dtype):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1).to(dtype)


def reference(x, w, stride, padding):
    conv = {1: TF.conv1d, 2: TF.conv2d, 3: TF.conv3d}[x.ndim - 2]
    return conv(x.double(), w.double(), stride=stride, padding=padding)


@pytest.mark.parametrize(
    "channels, size, filt, stride, channels_last, dtype",
    [
        (3, (11, 9), 7, 2, True, torch.bfloat16),  # conv1's shape, small
        (3, (11, 9), 7, 2, False, torch.float32),
        (1, (10, 7), 3, 1, False, torch.bfloat16),  # gray
        (2, (5, 6, 7), 3, 1, False, torch.float32),  # 3-D
        (3, (23,), 5, 2, False, torch.float32),  # 1-D
    ],
)
def test_a_forward_with_few_channels_reads_a_padded_copy_and_matches_float64(
    planned_convolutions, channels, size, filt, stride, channels_last, dtype
):
    x = random((2, channels, *size), 1, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = random((16, channels, *(filt,) * len(size)), 2, dtype)
    got = F.conv(x, w, stride=stride, padding=filt // 2, handle=handle())
    assert planned_convolutions == [(PRECOMP, S.PRECOMPUTED_GEMM, PADDED)]
    assert relative_error(got.double(), reference(x, w, stride, filt // 2)) < BOUNDS[dtype]


def test_the_copy_holds_x_channels_last_with_zeros_past_its_channels():
    x = random((2, 3, 5, 4), 3, torch.float32)
    desc = od.TensorDescriptor(od.DataType.FLOAT, tuple(x.shape), x.stride())
    w = od.TensorDescriptor(od.DataType.FLOAT, (8, 3, 3, 3), (27, 9, 3, 1))
    y = od.TensorDescriptor(od.DataType.FLOAT, (2, 8, 5, 4), (160, 20, 4, 1))
    conv = od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1))
    problem = _problem(desc, w, y, conv)
    assert kernels.pads_channels(problem)
    padded = kernels.padded_x(problem)
    assert padded.dims == (2, kernels.PIXEL_CHANNELS, 5, 4) and padded.strides == (80, 1, 16, 4)
    plan = kernels.launch_plan(problem, True, S.PRECOMPUTED_GEMM)
    (pad,) = [launch for launch in plan.launches if launch.kernel.__name__ == "pad_channels_kernel"]
    tensors = {"x": x, "x_staged": torch.full((padded.numel,), float("nan"))}
    pad(tensors)
    copy = tensors["x_staged"].view(2, 5, 4, kernels.PIXEL_CHANNELS)
    assert torch.equal(copy[..., :3], x.permute(0, 2, 3, 1))
    assert torch.equal(copy[..., 3:], torch.zeros(2, 5, 4, 1))


def _problem(x, w, y, conv):
    return convolution_problem(ConvolutionDirection.FORWARD, conv, x, w, y, algo=PRECOMP)


def test_the_workspace_holds_the_copy_and_a_short_one_is_refused():
    x = torch.zeros(2, 3, 9, 9)
    w = torch.zeros(8, 3, 7, 7)
    descs = [od.TensorDescriptor(od.DataType.FLOAT, tuple(t.shape), t.stride()) for t in (x, w)]
    conv = od.ConvolutionDescriptor((3, 3), (2, 2), (1, 1))
    y_desc = od.TensorDescriptor(od.DataType.FLOAT, (2, 8, 5, 5), (200, 25, 5, 1))
    size = od.get_convolution_forward_workspace_size(handle(), descs[0], descs[1], conv, y_desc, PRECOMP)
    copy = 2 * 9 * 9 * kernels.PIXEL_CHANNELS * 4  # float32, no offset table
    assert size == -(-copy // 256) * 256
    assert od.get_convolution_forward_workspace_size(handle(), descs[0], descs[1], conv, y_desc, IMPLICIT) == 0
    y = torch.full((2, 8, 5, 5), float("nan"))
    short = torch.zeros(size - 1, dtype=torch.uint8)
    with pytest.raises(od.BadParam, match=f"workspace holds {size - 1} bytes but .* needs {size} bytes"):
        od.convolution_forward(handle(), 1.0, descs[0], x, descs[1], w, conv, PRECOMP, short, 0.0, y_desc, y)


def test_a_one_tap_filter_keeps_the_gather_in_place(planned_convolutions):
    x = random((2, 3, 6, 5), 1, torch.float32)
    w = random((16, 3, 1, 1), 2, torch.float32)
    got = F.conv(x, w, handle=handle())
    assert planned_convolutions == [(IMPLICIT, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]
    assert relative_error(got.double(), reference(x, w, 1, 0)) < BOUNDS[torch.float32]


def _descriptor(t):
    dtype = {torch.float32: od.DataType.FLOAT, torch.float16: od.DataType.HALF}[t.dtype]
    return od.TensorDescriptor(dtype, tuple(t.shape), t.stride())


@pytest.mark.parametrize(
    "case, dtype, stride, dilation, flip, beta",
    [
        ("true convolution, dilation 2, beta", torch.float32, (1, 1), (2, 2), True, 0.5),
        ("stride 3 by 2, float16", torch.float16, (3, 2), (1, 1), False, 0.0),
    ],
)
def test_a_sub_region_of_x_through_the_padded_copy_into_a_sub_region_of_y(
    planned_convolutions, case, dtype, stride, dilation, flip, beta
):
    """x a strided window of a larger buffer, y one inside a NaN buffer, the workspace all NaN bytes: the
    copy reads x at its strides, y is written at its own and nowhere else."""
    big = random((3, 5, 17, 19), 4, dtype)
    x = big[1:, 1:4, 2:15, 3:18]  # 2 x 3 x 13 x 15, every stride its own
    w = random((8, 3, 3, 3), 5, dtype)
    pad = (2, 1)
    out = [(s + 2 * p - d * 2 - 1) // st + 1 for s, p, d, st in zip(x.shape[2:], pad, dilation, stride)]
    buffer = torch.full((2, 10, out[0] + 2, out[1] + 2), float("nan"), dtype=dtype)
    y = buffer[:, 1:9, 1:-1, 1:-1]
    prior = random(y.shape, 6, dtype)
    if beta:
        y.copy_(prior)
    mode = od.ConvolutionMode.CONVOLUTION if flip else od.ConvolutionMode.CROSS_CORRELATION
    conv = od.ConvolutionDescriptor(pad, stride, dilation, mode)
    descs = (_descriptor(x), _descriptor(w), conv, _descriptor(y))
    size = od.get_convolution_forward_workspace_size(handle(), *descs, PRECOMP)
    workspace = torch.full((size,), 255, dtype=torch.uint8)  # every number in it NaN
    od.convolution_forward(handle(), 0.75, descs[0], x, descs[1], w, conv, PRECOMP, workspace, beta, descs[3], y)
    assert planned_convolutions == [(PRECOMP, S.PRECOMPUTED_GEMM, PADDED)]
    weight = w.double().flip([2, 3]) if flip else w.double()
    want = 0.75 * TF.conv2d(x.double(), weight, stride=stride, padding=pad, dilation=dilation) + beta * prior.double()
    assert relative_error(y.double(), want) < (1e-5 if dtype == torch.float32 else 1e-3)
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[:, 1:9, 1:-1, 1:-1] = True
    assert buffer[~inside].isnan().all()  # nothing written outside y


def test_the_fused_epilogue_runs_on_the_padded_copy(planned_convolutions):
    x = random((2, 3, 9, 8), 7, torch.float32)
    w = random((16, 3, 5, 5), 8, torch.float32)
    y = torch.full((2, 16, 9, 8), float("nan"))
    bias, z = random((1, 16, 1, 1), 9, torch.float32), random(y.shape, 10, torch.float32)
    conv = od.ConvolutionDescriptor((2, 2), (1, 1), (1, 1))
    descs = (_descriptor(x), _descriptor(w), conv, _descriptor(y))
    workspace = torch.empty(od.get_convolution_forward_workspace_size(handle(), *descs, PRECOMP), dtype=torch.uint8)
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    od.convolution_bias_activation_forward(
        handle(), 0.75, descs[0], x, descs[1], w, conv, PRECOMP, workspace, 0.5, descs[3], z, _descriptor(bias), bias,
        relu, descs[3], y,
    )  # fmt: skip
    assert planned_convolutions == [(PRECOMP, S.PRECOMPUTED_GEMM, PADDED)]
    want = (0.75 * reference(x, w, 1, 2) + 0.5 * z.double() + bias.double()).clamp(min=0)
    assert relative_error(y.double(), want) < BOUNDS[torch.float32]


FILTER_PADDED = ["pad_channels_kernel", "filter_gemm_kernel"]  # then the slices summed, where there are several
ALGO_0, ALGO_3 = od.ConvolutionBwdFilterAlgo.ALGO_0, od.ConvolutionBwdFilterAlgo.ALGO_3
WEIGHT_GRADIENT = {1: torch.nn.grad.conv1d_weight, 2: torch.nn.grad.conv2d_weight, 3: torch.nn.grad.conv3d_weight}


@pytest.mark.parametrize(
    "channels, size, filt, stride, channels_last, dtype",
    [
        (3, (12, 10), 7, 2, True, torch.bfloat16),  # conv1's shape, small
        (3, (12, 10), 7, 2, False, torch.float16),
        (1, (10, 7), 3, 1, True, torch.bfloat16),  # gray
        (2, (5, 6, 7), 3, 1, False, torch.bfloat16),  # 3-D
    ],
)
def test_a_16_bit_backward_filter_with_few_channels_reads_a_padded_copy_and_matches_float64(
    planned_convolutions, channels, size, filt, stride, channels_last, dtype
):
    """A call that names no algorithm takes ALGO_3, whose GEMM walks the copy's 4 channels a tap and
    stores only x's own: dw holds the float64 gradient, its padding channels nowhere."""
    x = random((2, channels, *size), 1, dtype)
    w_shape = (16, channels, *(filt,) * len(size))
    y_shape = (2, 16, *((s + 2 * (filt // 2) - filt) // stride + 1 for s in size))
    dy = random(y_shape, 2, dtype)
    if channels_last:
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    got = F.conv_backward_filter(x, dy, w_shape, stride=stride, padding=filt // 2, handle=handle())
    assert [(algo, strategy) for algo, strategy, _ in planned_convolutions] == [(ALGO_3, S.PRECOMPUTED_GEMM)]
    assert planned_convolutions[0][2][:2] == FILTER_PADDED
    want = WEIGHT_GRADIENT[len(size)](x.double(), w_shape, dy.double(), stride, filt // 2)
    assert got.shape == w_shape
    assert relative_error(got.double(), want) < BOUNDS[dtype]


def test_a_backward_filter_through_the_padded_copy_into_a_sub_region_with_beta(planned_convolutions):
    """dw a window of a NaN buffer, alpha and beta blended, true convolution, dilation 2, a NaN
    workspace: every tap lands flipped at dw's strides and nothing is written outside it."""
    x = random((3, 4, 15, 13), 11, torch.float16)[1:, :3]  # 2 x 3 x 15 x 13, a channel window
    dy = random((2, 8, 16, 12), 12, torch.float16)[:, :, 1:, 1:]  # 2 x 8 x 15 x 11
    pad, stride, dilation = (2, 1), (1, 1), (2, 2)
    buffer = torch.full((10, 5, 5, 5), float("nan"), dtype=torch.float16)
    dw = buffer[1:9, 1:4, 1:4, 1:4]  # 8 x 3 x 3 x 3 of strides (125, 25, 5, 1)
    prior = random(dw.shape, 13, torch.float16)
    dw.copy_(prior)
    conv = od.ConvolutionDescriptor(pad, stride, dilation, od.ConvolutionMode.CONVOLUTION)
    descs = (_descriptor(x), _descriptor(dy), conv, _descriptor(dw))
    size = od.get_convolution_backward_filter_workspace_size(handle(), *descs, ALGO_3)
    assert size >= 2 * 15 * 13 * kernels.PIXEL_CHANNELS * 2  # the copy
    workspace = torch.full((size,), 255, dtype=torch.uint8)
    od.convolution_backward_filter(
        handle(), 0.75, descs[0], x, descs[1], dy, conv, ALGO_3, workspace, 0.5, descs[3], dw
    )
    assert planned_convolutions[0][2][:2] == FILTER_PADDED
    gradient = WEIGHT_GRADIENT[2](x.double(), dw.shape, dy.double(), stride, pad, dilation)
    want = 0.75 * gradient.flip([2, 3]) + 0.5 * prior.double()
    assert relative_error(dw.double(), want) < BOUNDS[torch.float16]
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[1:9, 1:4, 1:4, 1:4] = True
    assert buffer[~inside].isnan().all()  # nothing written outside dw


def test_a_float32_backward_filter_keeps_the_gather_in_place(planned_convolutions):
    """TF32 operands reduce over pixels, which wgmma reads contiguous: the copy's vectors would land
    4 bytes at a time, so float32 takes no copy, under the default algorithm or ALGO_3."""
    x, dy = random((2, 3, 12, 10), 1, torch.float32), random((2, 16, 6, 5), 2, torch.float32)
    want = WEIGHT_GRADIENT[2](x.double(), (16, 3, 7, 7), dy.double(), 2, 3)
    for algo in (None, ALGO_3):
        got = F.conv_backward_filter(x, dy, (16, 3, 7, 7), stride=2, padding=3, algo=algo, handle=handle())
        assert relative_error(got.double(), want) < BOUNDS[torch.float32]
    taken = [(algo, strategy) for algo, strategy, _ in planned_convolutions]
    assert taken == [(ALGO_0, S.IMPLICIT_GEMM), (ALGO_3, S.PRECOMPUTED_GEMM)]
    assert "pad_channels_kernel" not in planned_convolutions[1][2]


@pytest.mark.parametrize("channels_last", [True, False])
def test_a_tf32_forward_reads_x_and_the_filter_rounded_to_nearest(planned_convolutions, channels_last):
    """Under TF32 both copies hold the operands rounded to TF32 to nearest (the tensor cores would
    truncate what they read in place): the interpreter's exact products land on the float64
    convolution of the rounded operands, not of the caller's."""
    x, w = random((2, 3, 12, 10), 1, torch.float32), random((16, 3, 7, 7), 2, torch.float32)
    if channels_last:
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    handle = od.create("cpu", backend="triton", math_type=od.MathType.TENSOR_OP)
    got = F.conv(x, w, stride=2, padding=3, handle=handle)
    assert planned_convolutions == [
        (PRECOMP, S.PRECOMPUTED_GEMM, ["pad_channels_kernel", "staging_kernel", "conv_gemm_kernel"])
    ]
    x_read, w_read = (torch.from_numpy(tf32_nearest(t.contiguous().numpy())) for t in (x, w))
    want = reference(x_read, w_read, 2, 3)
    assert relative_error(got.double(), want) < BOUNDS[torch.float32]
    assert relative_error(got.double(), reference(x, w, 2, 3)) > 10 * BOUNDS[torch.float32]  # the rounding is seen
    descs = [od.TensorDescriptor(od.DataType.FLOAT, tuple(t.shape), t.stride()) for t in (x, w, got)]
    conv = od.ConvolutionDescriptor((3, 3), (2, 2), (1, 1))
    size = od.get_convolution_forward_workspace_size(handle, descs[0], descs[1], conv, descs[2], PRECOMP)
    copies = [2 * 12 * 10 * kernels.PIXEL_CHANNELS * 4, 16 * 3 * 7 * 7 * 4]  # x's and the filter's, float32
    assert size == sum(-(-copy // 256) * 256 for copy in copies)
