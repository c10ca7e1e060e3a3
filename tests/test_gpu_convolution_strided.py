"""Strided convolutions on the GPU (``pytest -m gpu``): the stride-2 forwards read through x's phase
view, 16-bit on the warp-specialized engine and TF32 on ``conv_tma_kernel``, and the stride-2
backward data on the engine, one launch per stride phase of dx, against float64 and cuDNN."""

import math

import pytest
import torch
import torch.nn.functional as TF
from test_gpu_convolution import DEVICE, _assert_repeatable_within_rounding, _descriptor, _sub_region
from tf32 import cudnn_tf32

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu


# (batch, C, H, W, K, R): ResNet-50's 3x3 stride-2 layer and two of its 1x1 stride-2 downsample layers,
# then an odd output (15 x 11) with K no channel tile divides
STRIDED_SHAPES = [
    (4, 128, 56, 56, 128, 3),
    (4, 256, 56, 56, 512, 1),
    (4, 1024, 14, 14, 2048, 1),
    (3, 64, 30, 22, 320, 3),
]


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("n, c, h, w, k, r", STRIDED_SHAPES)
def test_warp_specialized_engine_reads_stride_2_layers_through_the_phase_view(n, c, h, w, k, r, beta):
    """Stride 2, pad r // 2, x's pixels packed (rows of a larger buffer), y a sub-region: the engine's
    result is float64's rounded to bfloat16 (1.25x its rounding), bitwise equal over 4 runs, and
    nothing outside the output is written. beta = 0: y is NaN before each run."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor((r // 2, r // 2), (2, 2), (1, 1))
    rows = torch.full((n, h + 2, w, c), math.nan, dtype=torch.bfloat16, device=DEVICE)
    x = rows[:, 1 : h + 1].permute(0, 3, 1, 2)
    x.copy_(torch.randn(n, c, h, w))
    filt = (torch.randn(k, c, r, r) / math.sqrt(r * r * c)).to(DEVICE, torch.bfloat16)
    filt = filt.contiguous(memory_format=torch.channels_last)
    want = TF.conv2d(x.double(), filt.double(), stride=2, padding=r // 2)
    y, buffer = _sub_region(n, k, *want.shape[2:])
    prior = torch.randn(y.shape, device=DEVICE).to(torch.bfloat16)
    want = want + beta * prior.double()
    xd, wd, yd = _descriptor(x), _descriptor(filt), _descriptor(y)
    problem = convolution_problem(ConvolutionDirection.FORWARD, conv_desc, xd, wd, yd, beta=beta)
    assert kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA

    def run_once():
        algo = od.ConvolutionFwdAlgo.IMPLICIT_GEMM
        od.convolution_forward(handle, 1.0, xd, x, wd, filt, conv_desc, algo, None, beta, yd, y)

    _assert_repeatable_within_rounding(run_once, y, buffer, prior if beta else None, want)


@pytest.mark.parametrize("n, c, h, w, k, r", STRIDED_SHAPES[:2])
def test_tf32_stride_2_forward_reads_the_phase_view_as_close_to_float64_as_cudnn_tf32(n, c, h, w, k, r):
    """Float32 on a TENSOR_OP handle, channels-last: the warp-specialized engine reads x's phase view
    with TF32 products, within 3x cuDNN's own TF32 error against float64 (as the stride-1 layers), repeatable."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x = torch.randn(n, c, h, w, device=DEVICE).contiguous(memory_format=torch.channels_last)
    filt = (torch.randn(k, c, r, r, device=DEVICE) / math.sqrt(r * r * c)).contiguous(memory_format=torch.channels_last)
    want = TF.conv2d(x.double(), filt.double(), stride=2, padding=r // 2)
    conv_desc = od.ConvolutionDescriptor((r // 2, r // 2), (2, 2), (1, 1))
    y = torch.empty(want.shape, device=DEVICE).contiguous(memory_format=torch.channels_last)
    problem = convolution_problem(
        ConvolutionDirection.FORWARD, conv_desc, _descriptor(x), _descriptor(filt), _descriptor(y), allow_tf32=True
    )
    assert kernels.choose(problem, tma_aligned=True, hopper=True) is kernels.Strategy.WARP_SPECIALIZED_TMA
    cudnn = cudnn_tf32(lambda *inputs: TF.conv2d(*inputs, stride=2, padding=r // 2), x, filt)
    cudnn_error = relative_error(cudnn, want)
    got = F.conv(x, filt, stride=2, padding=r // 2, handle=handle)
    assert relative_error(got, want) < 3 * cudnn_error, (relative_error(got, want), cudnn_error)
    assert torch.equal(got, F.conv(x, filt, stride=2, padding=r // 2, handle=handle))


# (batch, C, H, W, K, R) of dx and the filter: ResNet-50's 3x3 stride-2 layer and its first 1x1 stride-2
# downsample, then an odd dx (29 x 23: phases of 15 and 14 rows, 12 and 11 columns)
BACKWARD_SHAPES = [STRIDED_SHAPES[0], STRIDED_SHAPES[1], (3, 64, 29, 23, 320, 3)]


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("n, c, h, w, k, r", BACKWARD_SHAPES)
def test_warp_specialized_engine_runs_stride_2_backward_data_one_launch_per_phase(n, c, h, w, k, r, beta):
    """Stride 2, pad r // 2, dx a sub-region: the engine's result is float64's rounded to bfloat16
    (1.25x its rounding), bitwise equal over 4 runs, and nothing outside dx is written. beta = 0: dx
    is NaN before each run (the 1x1 layer's phases without taps must write zeros); beta = 0.5: it
    holds a prior they must keep scaled."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE)
    conv_desc = od.ConvolutionDescriptor((r // 2, r // 2), (2, 2), (1, 1))
    rows, columns = ((size + 2 * (r // 2) - r) // 2 + 1 for size in (h, w))
    dy = torch.randn(n, k, rows, columns, device=DEVICE).to(torch.bfloat16)
    dy = dy.contiguous(memory_format=torch.channels_last)
    filt = (torch.randn(k, c, r, r) / math.sqrt(r * r * k)).to(DEVICE, torch.bfloat16)
    filt = filt.contiguous(memory_format=torch.channels_last)
    want = torch.nn.grad.conv2d_input((n, c, h, w), filt.double(), dy.double(), stride=2, padding=r // 2)
    dx, buffer = _sub_region(n, c, h, w)
    prior = torch.randn(dx.shape, device=DEVICE).to(torch.bfloat16)
    want = want + beta * prior.double()
    xd, wd, yd = _descriptor(dx), _descriptor(filt), _descriptor(dy)
    problem = convolution_problem(ConvolutionDirection.BACKWARD_DATA, conv_desc, xd, wd, yd, beta=beta)
    assert kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA

    def run_once():
        algo = od.ConvolutionBwdDataAlgo.ALGO_0
        od.convolution_backward_data(handle, 1.0, wd, filt, yd, dy, conv_desc, algo, None, beta, xd, dx)

    _assert_repeatable_within_rounding(run_once, dx, buffer, prior if beta else None, want)
