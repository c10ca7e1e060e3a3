"""Float32 as TF32 on the warp-specialized engine (``convolution/gluon_hopper.py``) on the GPU
(``pytest -m gpu``): forward and backward data, channels-last in strided sub-regions and NCHW backward
data through its staged copy, against float64 and against cuDNN's own TF32 error on the same inputs."""

import math

import pytest
import torch
import torch.nn.functional as TF
from tf32 import cudnn_tf32, tf32_nearest, tf32_truncated

import opendnn as od
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"

# (batch, C, H, W, K): ResNet-50's stride-1 3x3 layers, then sizes no box divides and K no channel tile
# divides (C and K whole 32-channel chunks: each is the reduced dim of one direction)
SHAPES = [
    (2, 64, 56, 56, 64),
    (4, 128, 28, 28, 128),
    (8, 256, 14, 14, 256),
    (16, 512, 7, 7, 512),  # batch 16: the repacked filter no bigger than an explicit GEMM's columns
    (3, 96, 13, 21, 160),
]
ALPHA = 0.75


def _descriptor(t):
    return od.TensorDescriptor(od.DataType.FLOAT, tuple(t.shape), t.stride())


def _sub_region(n, c, h, w, fill=None):
    """An (N, C, H, W) channels-last float32 view inside a NaN-filled buffer larger in every dim but N,
    16-byte aligned (what TMA reads), and the buffer; ``fill``: values for the view."""
    buffer = torch.full((n, h + 2, w + 3, c + 8), math.nan, device=DEVICE)
    view = buffer[:, 1 : h + 1, 2 : w + 2, 8:].permute(0, 3, 1, 2)
    if fill is not None:
        view.copy_(fill)
    return view, buffer


def _nchw(n, c, h, w, fill=None):
    """A packed NCHW float32 tensor (NaN, or ``fill``) and itself as its buffer."""
    tensor = torch.full((n, c, h, w), math.nan, device=DEVICE)
    if fill is not None:
        tensor.copy_(fill)
    return tensor, tensor


def _channels_last(n, c, h, w, fill=None):
    """A packed NHWC float32 tensor (NaN, or ``fill``; pixels C apart, as x's phase view needs) and
    itself as its buffer."""
    tensor, _ = _nchw(n, c, h, w, fill)
    tensor = tensor.contiguous(memory_format=torch.channels_last)
    return tensor, tensor


def _check_engine(direction, n, c, h, w, k, stride, beta, layout, bound, absolute=False):
    """One call on a TENSOR_OP handle, planned on the engine, run 3 times with the output poisoned (NaN,
    or a prior for beta) before each: bitwise equal runs, the error against float64 under ``bound``
    times cuDNN's TF32 error on the same inputs (``absolute``: under ``bound`` itself), and nothing
    outside the output written."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    conv_desc = od.ConvolutionDescriptor((1, 1), (stride, stride), (1, 1))
    out_h, out_w = (h - 1) // stride + 1, (w - 1) // stride + 1
    generator = torch.Generator().manual_seed(n * c + k)
    x_values = torch.randn(n, c, h, w, generator=generator)
    dy_values = torch.randn(n, k, out_h, out_w, generator=generator)
    filt = (torch.randn(k, c, 3, 3, generator=generator) / math.sqrt(9 * c)).to(DEVICE)
    filt = filt.contiguous(memory_format=torch.contiguous_format if layout is _nchw else torch.channels_last)
    forward = direction == "forward"
    if forward:
        source, _ = layout(n, c, h, w, x_values)
        out, buffer = layout(n, k, out_h, out_w)

        def compute(a, weights):
            return TF.conv2d(a, weights, stride=stride, padding=1)
    else:
        source, _ = layout(n, k, out_h, out_w, dy_values)
        out, buffer = layout(n, c, h, w)

        def compute(a, weights):
            return torch.nn.grad.conv2d_input((n, c, h, w), weights, a, stride=stride, padding=1)

    prior = torch.randn(out.shape, generator=generator).to(DEVICE)
    want = ALPHA * compute(source.double(), filt.double()) + beta * prior.double()
    cudnn_error = relative_error(cudnn_tf32(compute, source, filt), compute(source.double(), filt.double()))
    sd, wd, outd = _descriptor(source), _descriptor(filt), _descriptor(out)
    xd, yd = (sd, outd) if forward else (outd, sd)
    fwd, data = ConvolutionDirection.FORWARD, ConvolutionDirection.BACKWARD_DATA
    problem = convolution_problem(
        fwd if forward else data, conv_desc, xd, wd, yd, allow_tf32=True, alpha=ALPHA, beta=beta
    )
    assert kernels.choose(problem, tma_aligned=True, hopper=has_wgmma(0)) is kernels.Strategy.WARP_SPECIALIZED_TMA
    if forward:
        algo = od.ConvolutionFwdAlgo.IMPLICIT_GEMM
        size = od.get_convolution_forward_workspace_size(handle, xd, wd, conv_desc, yd, algo)
    else:
        algo = od.ConvolutionBwdDataAlgo.ALGO_0
        size = od.get_convolution_backward_data_workspace_size(handle, wd, yd, conv_desc, xd, algo)
    assert (size == 0) == forward  # backward data reads the filter repacked [C, R, S, K]
    workspace = torch.full((size,), 255, dtype=torch.uint8, device=DEVICE) if size else None  # NaN
    runs = []
    for _ in range(3):
        out.copy_(prior if beta else torch.full_like(prior, math.nan))
        if forward:
            od.convolution_forward(handle, ALPHA, xd, source, wd, filt, conv_desc, algo, workspace, beta, yd, out)
        else:
            od.convolution_backward_data(handle, ALPHA, wd, filt, yd, source, conv_desc, algo, workspace, beta, xd, out)
        runs.append(out.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    error = relative_error(runs[0], want)
    assert error < (bound if absolute else bound * cudnn_error), (error, cudnn_error)
    if layout is _sub_region:
        inside = torch.zeros_like(buffer, dtype=torch.bool)
        inside[:, 1 : out.shape[2] + 1, 2 : out.shape[3] + 2, 8:] = True
        assert bool(buffer[~inside].isnan().all())


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("n, c, h, w, k", SHAPES)
def test_tf32_engine_on_channels_last_sub_regions_is_as_close_to_float64_as_cudnn(n, c, h, w, k, direction, beta):
    """NHWC views inside NaN buffers: the forward reads x and the filter as they are (the tensor cores
    truncate to TF32: 2.6x cuDNN's error measured on the tl route), backward data dy as it is and the
    filter's copy rounded to nearest: within 3x cuDNN's TF32 error."""
    _check_engine(direction, n, c, h, w, k, 1, beta, _sub_region, bound=3)


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("n, c, h, w, k", SHAPES)
def test_tf32_engine_nchw_backward_data_reads_rounded_copies_as_close_as_cudnn(n, c, h, w, k, beta):
    """NCHW backward data reads dy's channels-last copy and the filter's [C, R, S, K] copy, both rounded
    to TF32 to nearest as cuDNN rounds: within 1.5x cuDNN's error (truncation gives 2.6x)."""
    _check_engine("backward_data", n, c, h, w, k, 1, beta, _nchw, bound=1.5)


@pytest.mark.parametrize(
    "direction, layout, bound",
    [("forward", _channels_last, 3), ("backward_data", _sub_region, 3), ("backward_data", _nchw, 1.5)],
)
def test_tf32_engine_stride_2_phases_are_as_close_to_float64_as_cudnn(direction, layout, bound):
    """ResNet-50's l2 3x3 stride-2 layer at batch 4: the forward through x's phase view (packed
    channels-last x: its pixels C apart), backward data one launch per phase of dx."""
    _check_engine(direction, 4, 128, 56, 56, 128, 2, 0.5, layout, bound)


@pytest.mark.parametrize("n, c, h, k", [(4, 128, 56, 128), (3, 64, 29, 96)])
def test_tf32_nchw_strided_backward_data_through_staged_rows_is_as_close_to_float64_as_cudnn(n, c, h, k):
    """beta 0 on NCHW dx: each row phase's rows written channels-last in the workspace, then copied
    into dx (``triton_tma.stages_output``; 29 rows: row phases of 15 and 14). Within TF32's error of
    float64 (operands rounded to 2**-11, float32 sums): on small problems cuDNN may not take TF32."""
    _check_engine("backward_data", n, c, h, h, k, 2, 0.0, _nchw, 1e-3, absolute=True)


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("layout", [_nchw, _sub_region])
@pytest.mark.parametrize(
    "n, c, h, w, k, stride",
    [
        (2, 64, 56, 56, 64, 1),
        (8, 256, 14, 14, 256, 1),
        (16, 512, 7, 7, 512, 1),
        (3, 96, 13, 21, 160, 1),
        (4, 128, 56, 56, 128, 2),
    ],
)
def test_tf32_backward_filter_over_rounded_rasters_is_the_product_of_rounded_operands(
    n, c, h, w, k, stride, layout, beta
):
    """The raster route (``convolution/triton_raster.py``): x and dy copied pixel-major and rounded to
    TF32 to nearest, then one product a tap over runs of pixels (``_raster_backward_filter``): the
    float64 product of the TF32-rounded operands to float32's precision (what the tensor cores
    compute from them), TF32's distance from the exact float64 one."""
    dw, x, dy, prior, _ = _raster_backward_filter(n, c, h, w, k, 3, stride, layout, beta)

    def product(a, gradient):
        return ALPHA * torch.nn.grad.conv2d_weight(a, (k, c, 3, 3), gradient, stride=stride, padding=1) + beta * prior

    of_rounded = product(tf32_nearest(x).double(), tf32_nearest(dy).double())
    assert relative_error(dw, of_rounded) < 2e-5, relative_error(dw, of_rounded)  # float32 sums
    exact = product(x.double(), dy.double())
    assert relative_error(dw, exact) < 6e-4, relative_error(dw, exact)  # TF32: 2**-11 an operand


def _raster_backward_filter(n, c, h, w, k, size, stride, layout, beta):
    """dw of a TF32 backward filter of size x size taps (padding size // 2) over x and dy in
    ``layout``, which must take the raster route: 3 runs with dw and the workspace poisoned before
    each, asserted bitwise equal and to leave dw's buffer untouched outside dw; (dw, x, dy, the prior
    dw that beta scales, the problem)."""
    from opendnn.families.convolution import triton_backend as kernels
    from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    pad = size // 2
    conv_desc = od.ConvolutionDescriptor((pad, pad), (stride, stride), (1, 1))
    out_h, out_w = (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1
    generator = torch.Generator().manual_seed(n * c + k)
    x, _ = layout(n, c, h, w, torch.randn(n, c, h, w, generator=generator))
    dy, _ = layout(n, k, out_h, out_w, torch.randn(n, k, out_h, out_w, generator=generator))
    buffer = torch.full((k + 3, c, size, size), math.nan, device=DEVICE)
    dw = buffer[2 : k + 2]
    prior = torch.randn(dw.shape, generator=generator).to(DEVICE)
    xd, yd, wd = _descriptor(x), _descriptor(dy), _descriptor(dw)
    problem = convolution_problem(
        ConvolutionDirection.BACKWARD_FILTER, conv_desc, xd, wd, yd, allow_tf32=True, alpha=ALPHA, beta=beta
    )
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    space = od.get_convolution_backward_filter_workspace_size(handle, xd, yd, conv_desc, wd, algo)
    runs = []
    for _ in range(3):
        dw.copy_(prior if beta else torch.full_like(prior, math.nan))
        workspace = torch.full((max(space, 1),), 255, dtype=torch.uint8, device=DEVICE)  # every float32 NaN
        od.convolution_backward_filter(handle, ALPHA, xd, x, yd, dy, conv_desc, algo, workspace, beta, wd, dw)
        runs.append(dw.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    assert bool(buffer[:2].isnan().all()) and bool(buffer[k + 2 :].isnan().all())
    return runs[0], x, dy, prior, problem


def _channel_margin(n, c, h, w, fill=None):
    """An NCHW float32 view of the channels 4 onward of a NaN-filled buffer 4 channels wider: each
    image's pixels contiguous, channels H x W apart, images (C + 4) x H x W apart."""
    buffer = torch.full((n, c + 4, h, w), math.nan, device=DEVICE)
    view = buffer[:, 4:]
    if fill is not None:
        view.copy_(fill)
    return view, buffer


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("layout", [_nchw, _channel_margin])
@pytest.mark.parametrize(
    "n, c, h, w, k", [(8, 1024, 14, 14, 256), (3, 96, 9, 12, 160), (2, 64, 28, 28, 2048), (4, 512, 7, 7, 2048)]
)
def test_tf32_1x1_backward_filter_reads_nchw_in_place(n, c, h, w, k, layout, beta):
    """A 1x1 stride-1 backward filter whose images hold their pixels contiguous takes the raster
    route with x and dy read where they lie (dy by TMA, or through pointers where its 7 x 7 planes
    are not 16-byte multiples), truncated to TF32 by the tensor cores (``_raster_backward_filter``):
    the float64 product of the truncated operands to float32's precision."""
    from opendnn.families.convolution import triton_raster as raster

    dw, x, dy, prior, problem = _raster_backward_filter(n, c, h, w, k, 1, 1, layout, beta)
    plan = raster.raster_plan(problem)
    assert plan.in_place and plan.dy_tma == (h * w % 4 == 0)

    def product(a, gradient):
        return ALPHA * torch.einsum("nkhw,nchw->kc", gradient, a)[:, :, None, None] + beta * prior

    of_truncated = product(tf32_truncated(x).double(), tf32_truncated(dy).double())
    assert relative_error(dw, of_truncated) < 2e-5, relative_error(dw, of_truncated)  # float32 sums
    exact = product(x.double(), dy.double())
    assert relative_error(dw, exact) < 1.2e-3, relative_error(dw, exact)  # TF32: 2**-10 an operand
