"""GEMM's backward data over few input channels through Triton's interpreter: where the product's
matrix Z (output pixels x taps x C) is smaller than dy's column matrix (input pixels x taps x K),
``col2im_product_kernel`` writes Z's float sums into the workspace and ``col2im_gather_kernel`` adds
each pixel's taps into dx in tap order (``triton_col2im``). Results are held to the float64 gradient."""

from __future__ import annotations

import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.families.convolution import triton_backend as kernels
from opendnn.samples import relative_error

ALGO_1 = od.ConvolutionBwdDataAlgo.ALGO_1
S = kernels.Strategy
GATHERED = ["col2im_product_kernel", "col2im_gather_kernel"]
BOUNDS = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}  # float sums; dx rounded once
INPUT_GRADIENT = {1: torch.nn.grad.conv1d_input, 2: torch.nn.grad.conv2d_input, 3: torch.nn.grad.conv3d_input}


def handle():
    return od.create("cpu", backend="triton")


def random(shape, seed, dtype=torch.float32):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1).to(dtype)


def descriptor(t):
    dtype = {torch.float32: od.DataType.FLOAT, torch.float16: od.DataType.HALF}[t.dtype]
    return od.TensorDescriptor(dtype, tuple(t.shape), t.stride())


@pytest.mark.parametrize(
    "case, channels, size, filt, stride, dilation, groups, channels_last, dtype",
    [
        ("conv1's shape, small", 3, (12, 10), 7, 2, 1, 1, True, torch.bfloat16),
        ("conv1's shape, NCHW float32", 3, (12, 10), 7, 2, 1, 1, False, torch.float32),
        ("dilation 2", 2, (9, 11), 3, 1, 2, 1, False, torch.float16),
        ("two groups", 4, (8, 7), 3, 2, 1, 2, True, torch.float32),
        ("3-D", 3, (5, 6, 7), 3, 2, 1, 1, False, torch.float32),
        ("1-D", 1, (23,), 5, 3, 1, 1, False, torch.float32),
    ],
)
def test_gemms_backward_data_over_few_channels_gathers_the_products_and_matches_float64(
    planned_convolutions, case, channels, size, filt, stride, dilation, groups, channels_last, dtype
):
    w = random((16, channels // groups, *(filt,) * len(size)), 1, dtype)
    pad = dilation * (filt // 2)
    out = [(s + 2 * pad - dilation * (filt - 1) - 1) // stride + 1 for s in size]
    dy = random((2, 16, *out), 2, dtype)
    if channels_last:
        w, dy = (t.contiguous(memory_format=torch.channels_last) for t in (w, dy))
    x_shape = (2, channels, *size)
    got = F.conv_backward_data(
        dy, w, x_shape, stride=stride, padding=pad, dilation=dilation, groups=groups, algo=ALGO_1, handle=handle()
    )
    assert planned_convolutions == [(ALGO_1, S.EXPLICIT_GEMM, GATHERED)]
    want = INPUT_GRADIENT[len(size)](x_shape, w.double(), dy.double(), stride, pad, dilation, groups)
    assert relative_error(got.double(), want) < BOUNDS[dtype]


def test_the_gather_writes_a_sub_region_of_dx_with_alpha_and_beta_from_a_nan_workspace(planned_convolutions):
    """True convolution, dx a window of a NaN buffer holding a prior, a workspace of NaN bytes: each
    tap lands flipped, dx = alpha * gradient + beta * prior, and nothing outside dx is written."""
    w = random((8, 3, 5, 5), 3)
    dy = random((3, 10, 6, 6), 4)[1:, 1:9]  # 2 x 8 x 6 x 6, a window of a larger buffer
    buffer = torch.full((2, 5, 14, 14), float("nan"))
    dx = buffer[:, 1:4, 1:-2, 2:-1]  # 2 x 3 x 11 x 11
    prior = random(dx.shape, 5)
    dx.copy_(prior)
    conv = od.ConvolutionDescriptor((2, 2), (2, 2), (1, 1), od.ConvolutionMode.CONVOLUTION)
    descs = (descriptor(w), descriptor(dy), conv, descriptor(dx))
    size = od.get_convolution_backward_data_workspace_size(handle(), *descs, ALGO_1)
    z = 2 * 6 * 6 * 25 * 3 * 4  # output pixels x taps x C, float32
    assert size == -(-z // 256) * 256
    workspace = torch.full((size,), 255, dtype=torch.uint8)
    od.convolution_backward_data(handle(), 0.75, descs[0], w, descs[1], dy, conv, ALGO_1, workspace, 0.5, descs[3], dx)
    assert planned_convolutions == [(ALGO_1, S.EXPLICIT_GEMM, GATHERED)]
    gradient = torch.nn.grad.conv2d_input(dx.shape, w.double().flip([2, 3]), dy.double(), 2, 2)
    assert relative_error(dx.double(), 0.75 * gradient + 0.5 * prior.double()) < BOUNDS[torch.float32]
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[:, 1:4, 1:-2, 2:-1] = True
    assert buffer[~inside].isnan().all()


def test_more_input_than_output_channels_keep_dys_column_matrix(planned_convolutions):
    """16 input channels, 4 output channels at stride 1: Z (output pixels x taps x 16) would pass dy's
    column matrix (input pixels x taps x 4), which GEMM's backward data then keeps."""
    w, dy = random((4, 16, 3, 3), 6), random((2, 4, 5, 5), 7)
    got = F.conv_backward_data(dy, w, (2, 16, 5, 5), padding=1, algo=ALGO_1, handle=handle())
    assert planned_convolutions == [(ALGO_1, S.EXPLICIT_GEMM, ["im2col_kernel", "conv_gemm_kernel"])]
    want = torch.nn.grad.conv2d_input((2, 16, 5, 5), w.double(), dy.double(), 1, 1)
    assert relative_error(got.double(), want) < BOUNDS[torch.float32]


def test_an_image_layers_backward_data_naming_no_algorithm_gathers_the_products(planned_convolutions):
    """A backward data into an image's three channels that names no algorithm takes ALGO_1's product
    and gather (the implicit GEMM would spend its MMA columns on padding); a handle admitting no
    workspace keeps the implicit GEMM. Both against float64."""
    w = random((16, 3, 7, 7), 7).contiguous(memory_format=torch.channels_last)
    dy = random((2, 16, 6, 5), 8).contiguous(memory_format=torch.channels_last)
    x_shape = (2, 3, 12, 10)
    want = torch.nn.grad.conv2d_input(x_shape, w.double(), dy.double(), 2, 3)
    got = F.conv_backward_data(dy, w, x_shape, stride=2, padding=3, handle=handle())
    assert planned_convolutions == [(ALGO_1, S.EXPLICIT_GEMM, GATHERED)]
    assert relative_error(got.double(), want) < BOUNDS[torch.float32]
    planned_convolutions.clear()
    no_workspace = od.create("cpu", backend="triton", workspace_limit=0)
    got = F.conv_backward_data(dy, w, x_shape, stride=2, padding=3, handle=no_workspace)
    assert [algo for algo, _, _ in planned_convolutions] == [od.ConvolutionBwdDataAlgo.ALGO_0]
    assert relative_error(got.double(), want) < BOUNDS[torch.float32]
