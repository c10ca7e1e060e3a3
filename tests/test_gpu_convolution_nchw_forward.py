"""NCHW float32 forwards with TF32 on the GPU (``pytest -m gpu``): ResNet-50's 3x3 layers under
IMPLICIT_PRECOMP_GEMM, what a call that names no algorithm takes for them, copy x channels-last and
the filter KRSC into the workspace, both rounded to TF32 to nearest, and run the TMA route on the
copies (the warp-specialized engine on sm_90), writing y NCHW. Each is held to the float64
convolution of the rounded operands (float32 sums), to cuDNN's TF32 error on the same inputs, and
bitwise repeatable, with y and the workspace poisoned before each run."""

import math

import pytest
import torch
import torch.nn.functional as TF
from tf32 import cudnn_tf32, tf32_nearest

import opendnn as od
import opendnn.functional as F
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
from opendnn.families.convolution.triton_tma import reduction_slices
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
PRECOMP, IMPLICIT = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, od.ConvolutionFwdAlgo.IMPLICIT_GEMM
ROUNDED_PRODUCT = 2e-5  # float32 sums of the rounded operands' products, against their float64 sums
ALPHA = 0.75

# name: (batch, channels = K, size, stride), the smallest batches whose copies stay below an explicit
# GEMM's columns (l4's filter is 9.4 MB: batch 16)
LAYERS = {
    "l1_3x3": (2, 64, 56, 1),
    "l2_3x3_stride_2": (4, 128, 56, 2),
    "l3_3x3": (8, 256, 14, 1),
    "l4_3x3": (16, 512, 7, 1),
}


def _descriptor(t):
    return od.TensorDescriptor(od.DataType.FLOAT, tuple(t.shape), t.stride())


def _cudnn_tf32(x, w, stride):
    return cudnn_tf32(lambda *inputs: TF.conv2d(*inputs, stride=stride, padding=1), x, w)


def _layer(name):
    n, c, size, stride = LAYERS[name]
    generator = torch.Generator().manual_seed(c + size)
    x = torch.randn(n, c, size, size, generator=generator).to(DEVICE)
    w = (torch.randn(c, c, 3, 3, generator=generator) / math.sqrt(9 * c)).to(DEVICE)
    prior = torch.randn(n, c, (size - 1) // stride + 1, (size - 1) // stride + 1, generator=generator).to(DEVICE)
    return x, w, prior, od.ConvolutionDescriptor((1, 1), (stride, stride), (1, 1))


@pytest.mark.parametrize("beta", [0.0, 0.5])
@pytest.mark.parametrize("name", LAYERS)
def test_the_staged_nchw_forward_is_the_product_of_rounded_operands_and_as_close_as_cudnn(
    name, beta, planned_convolutions
):
    from opendnn.families.convolution.triton_backend import Strategy
    from opendnn.kernels.device import has_wgmma

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, w, prior, conv = _layer(name)
    y = torch.empty_like(prior)
    xd, wd, yd = _descriptor(x), _descriptor(w), _descriptor(y)
    assert od.get_convolution_forward_algorithm(handle, xd, wd, conv, yd)[0].algo is PRECOMP
    size = od.get_convolution_forward_workspace_size(handle, xd, wd, conv, yd, PRECOMP)
    problem = convolution_problem(ConvolutionDirection.FORWARD, conv, xd, wd, yd, algo=PRECOMP, allow_tf32=True)
    slices = reduction_slices(problem)[0]  # l4 at batch 16: its 144 steps sliced (the partials in the workspace)
    copies = x.numel() * 4 + w.numel() * 4 + (slices * y.numel() * 4 if slices > 1 else 0)
    assert copies <= size < copies + 1024 * 3  # the copies, the partials, the table and alignment
    workspace = torch.empty(size, dtype=torch.uint8, device=DEVICE)
    runs = []
    for _ in range(3):
        workspace.fill_(255)  # every float32 in it NaN
        y.copy_(prior if beta else torch.full_like(prior, math.nan))
        od.convolution_forward(handle, ALPHA, xd, x, wd, w, conv, PRECOMP, workspace, beta, yd, y)
        runs.append(y.clone())
    assert all(torch.equal(runs[0], run) for run in runs[1:])

    engine = "conv_warp_specialized_kernel" if has_wgmma(0) else "conv_tma_kernel"
    strategy = Strategy.WARP_SPECIALIZED_TMA if has_wgmma(0) else Strategy.TMA
    finish = ["slice_sum_kernel"] if slices > 1 else []
    assert planned_convolutions[0] == (PRECOMP, strategy, ["staging_kernel", "staging_kernel", engine, *finish])

    stride = conv.stride
    rounded = TF.conv2d(tf32_nearest(x).double(), tf32_nearest(w).double(), stride=stride, padding=1)
    error = relative_error(runs[0], ALPHA * rounded + beta * prior.double())
    assert error < ROUNDED_PRODUCT, error
    exact = TF.conv2d(x.double(), w.double(), stride=stride, padding=1)
    cudnn = _cudnn_tf32(x, w, stride)
    cudnn_error = relative_error(cudnn, exact)
    error = relative_error(runs[0], ALPHA * exact + beta * prior.double())
    assert error < 1.5 * cudnn_error, (error, cudnn_error)  # truncating the operands gives 2.6x
    if not beta:
        assert relative_error(runs[0], ALPHA * cudnn.double()) < 3 * cudnn_error


@pytest.mark.parametrize("name", ["l1_3x3", "l4_3x3"])
def test_a_call_naming_no_algorithm_takes_the_staged_route(name, planned_convolutions):
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, w, prior, conv = _layer(name)
    got = F.conv(x, w, stride=conv.stride, padding=1, handle=handle)
    assert [(algo, kernels[:2]) for algo, _, kernels in planned_convolutions] == [
        (PRECOMP, ["staging_kernel", "staging_kernel"])
    ]
    y = torch.full_like(prior, math.nan)
    xd, wd, yd = _descriptor(x), _descriptor(w), _descriptor(y)
    workspace = torch.empty(
        od.get_convolution_forward_workspace_size(handle, xd, wd, conv, yd, PRECOMP), dtype=torch.uint8, device=DEVICE
    )
    od.convolution_forward(handle, 1.0, xd, x, wd, w, conv, PRECOMP, workspace, 0.0, yd, y)
    assert torch.equal(got, y)


def test_implicit_gemm_keeps_the_nchw_forward_on_the_cp_async_gemm_without_workspace(planned_convolutions):
    from opendnn.families.convolution.triton_backend import Strategy

    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    x, w, prior, conv = _layer("l3_3x3")
    y = torch.full_like(prior, math.nan)
    xd, wd, yd = _descriptor(x), _descriptor(w), _descriptor(y)
    assert od.get_convolution_forward_workspace_size(handle, xd, wd, conv, yd, IMPLICIT) == 0
    od.convolution_forward(handle, 1.0, xd, x, wd, w, conv, IMPLICIT, None, 0.0, yd, y)
    assert planned_convolutions == [(IMPLICIT, Strategy.IMPLICIT_GEMM, ["conv_gemm_kernel"])]
    exact = TF.conv2d(x.double(), w.double(), padding=1)
    assert relative_error(y, exact) < 3 * relative_error(_cudnn_tf32(x, w, 1), exact)  # truncation: 2.6x
