"""The Triton convolution kernels through the interpreter on tiny shapes, against torch's
convolution and autograd in float64 on the CPU (an oracle independent of opendnn's reference)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
import torch.nn.functional as F

import opendnn as od
import opendnn.functional as functional
from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDirection,
    ConvolutionFwdAlgo,
    ConvolutionProblem,
)
from opendnn.families.convolution.triton_tiles import (
    DEPTHWISE_FILTER_MIN_TAPS,
    DEPTHWISE_MAX_UNROLLED_WIDTH,
    DEPTHWISE_ROWS_TILES,
    aligned,
    depthwise_packed_filter,
)
from opendnn.families.convolution.triton_tma import tma_block_k
from opendnn.families.pointwise.problem import PointwiseMode
from opendnn.samples import relative_error

FWD, DATA, FILTER = ConvolutionDirection
TORCH = {
    DataType.FLOAT: torch.float32,
    DataType.HALF: torch.float16,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.DOUBLE: torch.float64,
}
TOLERANCE = {DataType.FLOAT: 1e-5, DataType.HALF: 1e-2, DataType.BFLOAT16: 1e-2, DataType.DOUBLE: 1e-10}
TF32_TOLERANCE = 1e-3  # float32 where TF32 is allowed: the TMA route's staged copies hold TF32 values
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def layout(dims: tuple[int, ...], channels_last: bool, margin: int = 0) -> tuple[TensorDescriptor, torch.Tensor]:
    """Strides of dims packed NCHW or NHWC, inside a buffer ``margin`` elements larger (poisoned)."""
    order = (0, *range(2, len(dims)), 1) if channels_last else tuple(range(len(dims)))
    strides = [0] * len(dims)
    step = 1
    for k in reversed(order):
        strides[k] = step
        step *= dims[k]
    return tuple(strides), torch.full((step + margin,), float("nan"), dtype=torch.float64)


def make(dims, dtype, channels_last=False, margin=0, fill=True, seed=0):
    """(descriptor, Bound, float64 values): random values rounded to ``dtype``, NaN around them."""
    strides, buffer = layout(dims, channels_last, margin)
    buffer = buffer.to(TORCH[dtype])
    desc = TensorDescriptor(dtype, dims, strides)
    view = buffer.as_strided(dims, strides, margin // 2 if margin else 0)
    if fill:
        generator = torch.Generator().manual_seed(seed)
        view.copy_(torch.rand(dims, generator=generator, dtype=torch.float64) * 2 - 1)
    return desc, Bound("t", desc, view, "cpu"), buffer


def output_size(size, filt, pre, post, stride, dilation):
    return (size + pre + post - dilation * (filt - 1) - 1) // stride + 1


def torch_forward(x, w, pre, post, stride, dilation, groups, flip):
    spatial = x.dim() - 2
    if flip:
        w = w.flip(list(range(2, 2 + spatial)))
    padding = [p for pair in zip(reversed(pre), reversed(post)) for p in pair]
    return CONV[spatial](F.pad(x, padding), w, stride=stride, dilation=dilation, groups=groups)


def check(
    direction,
    dtype,
    x_dims,
    k,
    filt,
    pre=None,
    post=None,
    stride=None,
    dilation=None,
    groups=1,
    flip=False,
    algo=None,
    channels_last=False,
    alpha=1.0,
    beta=0.0,
    bias=False,
    z=False,
    act=None,
    coef=0.0,
    allow_tf32=False,
    margin=6,
):
    """Run the problem through ``kernels.run`` and compare with torch in float64; x and y sit
    ``margin // 2`` elements into NaN-filled buffers (6: misaligned for 16-byte loads, 16: aligned)."""
    spatial = len(x_dims) - 2
    ones, zeros = (1,) * spatial, (0,) * spatial
    pre, post = pre or zeros, post or pre or zeros
    stride, dilation = stride or ones, dilation or ones
    out = tuple(output_size(*a) for a in zip(x_dims[2:], filt, pre, post, stride, dilation))
    y_dims = (x_dims[0], k, *out)
    w_dims = (k, x_dims[1] // groups, *filt)
    x_desc, xb, _ = make(x_dims, dtype, channels_last, margin=margin, fill=direction is not DATA, seed=1)
    w_desc, wb, _ = make(w_dims, dtype, channels_last, fill=direction is not FILTER, seed=2)
    y_desc, yb, _ = make(y_dims, dtype, channels_last, margin=margin, fill=direction is not FWD, seed=3)
    outputs = {FWD: yb, DATA: xb, FILTER: wb}
    out = outputs[direction]
    prior = torch.rand(out.desc.dims, generator=torch.Generator().manual_seed(4), dtype=torch.float64) * 2 - 1
    if beta:
        out.view.copy_(prior)
    prior = out.view.double().clone() if beta else None
    bias_b = z_b = None
    if bias:
        bias_desc, bias_b, _ = make((1, k) + ones, dtype, seed=5)
    if z:
        _, z_b, _ = make(y_dims, dtype, channels_last, seed=6)
    default = {
        FWD: ConvolutionFwdAlgo.IMPLICIT_GEMM,
        DATA: ConvolutionBwdDataAlgo.ALGO_0,
        FILTER: ConvolutionBwdFilterAlgo.ALGO_0,
    }[direction]
    problem = ConvolutionProblem(
        direction,
        x_desc,
        w_desc,
        y_desc,
        pre,
        post,
        stride,
        dilation,
        groups,
        flip,
        DataType.DOUBLE if dtype is DataType.DOUBLE else DataType.FLOAT,
        allow_tf32,
        algo or default,
        alpha,
        beta,
        bias_desc if bias else None,
        z_b.desc if z else None,
        0.5 if z else 0.0,
        act,
        coef,
    )
    assert kernels.supports(problem) is None
    size = kernels.workspace_size(problem)
    workspace = (
        Bound("workspace", TensorDescriptor(DataType.UINT8, (size,)), torch.zeros(size, dtype=torch.uint8), "cpu")
        if size
        else None
    )
    kernels.run(problem, xb, wb, yb, bias_b, z_b, workspace)

    x = xb.view.double().requires_grad_(direction is DATA)
    w = wb.view.double().requires_grad_(direction is FILTER)
    y = torch_forward(x, w, pre, post, stride, dilation, groups, flip)
    if direction is FWD:
        want = alpha * y
        if z:
            want = want + 0.5 * z_b.view.double()
        if bias:
            want = want + bias_b.view.double()
        if act is PointwiseMode.RELU_FWD:
            want = torch.relu(want)
        elif act is PointwiseMode.SWISH_FWD:
            want = want * torch.sigmoid(coef * want)
    else:
        (grad,) = torch.autograd.grad(y, x if direction is DATA else w, yb.view.double())
        want = alpha * grad
    if beta:
        want = want + beta * prior
    got = out.view.double()
    error = (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()
    tolerance = TF32_TOLERANCE if allow_tf32 and dtype is DataType.FLOAT else TOLERANCE[dtype]
    assert error < tolerance, (problem.algo, error)
    return problem


def test_forward_nchw_float32_odd_channels_blends_alpha_beta():
    check(FWD, DataType.FLOAT, (2, 5, 7, 6), 6, (3, 3), pre=(1, 1), alpha=0.5, beta=0.75)


def test_forward_nhwc_half_groups_stride_dilation_flip():
    check(
        FWD,
        DataType.HALF,
        (1, 32, 9, 8),
        34,
        (3, 2),
        pre=(2, 1),
        stride=(2, 1),
        dilation=(2, 3),
        groups=2,
        flip=True,
        channels_last=True,
    )


def test_forward_conv1_shape_straddles_taps_in_bfloat16():
    check(FWD, DataType.BFLOAT16, (1, 3, 11, 11), 16, (7, 7), pre=(3, 3), stride=(2, 2), channels_last=True)


def test_forward_1d_float64_asymmetric_padding():
    check(FWD, DataType.DOUBLE, (2, 3, 13), 4, (4,), pre=(2,), post=(1,), stride=(2,))


def test_forward_3d_float32_channels_last_tf32_allowed():
    check(
        FWD,
        DataType.FLOAT,
        (1, 4, 4, 5, 5),
        5,
        (2, 3, 3),
        pre=(1, 1, 1),
        stride=(1, 2, 1),
        flip=True,
        channels_last=True,
        allow_tf32=True,
    )


@pytest.mark.parametrize("algo", [ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, ConvolutionFwdAlgo.GEMM])
def test_forward_precomputed_and_explicit_gemm(algo):
    check(
        FWD,
        DataType.FLOAT,
        (2, 6, 6, 5),
        8,
        (3, 3),
        pre=(1, 0),
        stride=(1, 2),
        dilation=(2, 1),
        groups=2,
        flip=True,
        algo=algo,
        beta=0.5,
    )


@pytest.mark.parametrize("algo", [ConvolutionFwdAlgo.IMPLICIT_GEMM, ConvolutionFwdAlgo.DIRECT])
def test_forward_depthwise_channel_multiplier_direct(algo):
    check(
        FWD,
        DataType.FLOAT,
        (2, 6, 6, 7),
        12,
        (3, 3),
        pre=(1, 1),
        stride=(2, 1),
        groups=6,
        algo=algo,
        channels_last=True,
        beta=0.5,
    )


def test_forward_epilogue_bias_residual_relu():
    check(
        FWD,
        DataType.HALF,
        (1, 16, 6, 6),
        20,
        (3, 3),
        pre=(1, 1),
        bias=True,
        z=True,
        act=PointwiseMode.RELU_FWD,
        alpha=1.5,
        channels_last=True,
    )


def test_forward_direct_epilogue_swish():
    check(
        FWD,
        DataType.FLOAT,
        (1, 4, 5, 5),
        4,
        (3, 3),
        pre=(1, 1),
        groups=4,
        bias=True,
        z=True,
        act=PointwiseMode.SWISH_FWD,
        coef=1.5,
    )


def test_backward_data_stride_phases_dilation_groups_flip():
    check(
        DATA,
        DataType.FLOAT,
        (2, 4, 9, 8),
        6,
        (3, 4),
        pre=(1, 2),
        post=(2, 0),
        stride=(2, 3),
        dilation=(2, 1),
        groups=2,
        flip=True,
        alpha=0.5,
        beta=0.25,
    )


def test_backward_data_nhwc_bfloat16_1x1_stride2():
    check(DATA, DataType.BFLOAT16, (2, 32, 7, 7), 16, (1, 1), stride=(2, 2), channels_last=True)


def test_backward_data_explicit_gemm_3d():
    check(
        DATA,
        DataType.DOUBLE,
        (1, 3, 5, 4, 6),
        4,
        (2, 2, 3),
        pre=(1, 0, 1),
        stride=(2, 1, 2),
        algo=ConvolutionBwdDataAlgo.ALGO_1,
        flip=True,
    )


def test_backward_data_depthwise_direct():
    check(
        DATA,
        DataType.FLOAT,
        (2, 6, 7, 6),
        12,
        (3, 3),
        pre=(1, 1),
        stride=(2, 2),
        groups=6,
        channels_last=True,
        beta=0.5,
    )


def direct_launch(problem: ConvolutionProblem):
    """The direct kernel's launch in the problem's plan."""
    plan = kernels.launch_plan(problem, True, kernels.choose(problem, tma_aligned=True))
    names = ("conv_direct_kernel", "filter_direct_kernel")
    (launch,) = [launch for launch in plan.launches if launch.kernel.__name__ in names]
    return launch


@pytest.mark.parametrize("direction", [FWD, DATA, FILTER])
def test_direct_kernels_unroll_the_taps_of_a_9_tap_depthwise_filter(direction):
    """Channels-last forward and backward data of a 1 x 9 filter (past the widths conv_depthwise_rows_kernel
    takes) and a channels-first 3 x 3 backward filter (channels-last takes filter_depthwise_rows_kernel)."""
    channels_last = direction is not FILTER
    filt, pre = ((3, 3), (1, 1)) if direction is FILTER else ((1, 9), (0, 4))
    problem = check(direction, DataType.FLOAT, (2, 4, 6, 11), 4, filt, pre=pre, groups=4, channels_last=channels_last)
    assert direct_launch(problem).options["UNROLLED"] == (1, 1, *filt)


@pytest.mark.parametrize("direction", [FWD, DATA])
def test_direct_kernel_loops_over_taps_and_channels_at_run_time_past_the_unroll_limit(direction):
    """3-D, 2 x 3 x 2 taps x 3 reduced channels: 36 steps, past DIRECT_UNROLL_STEPS; strided, dilated,
    flipped, asymmetric padding, beta."""
    x_dims, groups = ((2, 3, 5, 6, 7), 1) if direction is FWD else ((2, 6, 5, 6, 7), 2)
    problem = check(
        direction,
        DataType.FLOAT,
        x_dims,
        6,
        (2, 3, 2),
        pre=(1, 1, 0),
        post=(0, 1, 1),
        stride=(1, 2, 1),
        dilation=(2, 1, 2),
        groups=groups,
        flip=True,
        channels_last=direction is FWD,
        beta=0.5,
    )
    assert direct_launch(problem).options["UNROLLED"] is None


def test_direct_backward_filter_loops_over_taps_at_run_time_past_the_unroll_limit():
    """3x3 taps x 2 channels a group: 18 columns, past DIRECT_UNROLL_STEPS, within DIRECT_FILTER_COLUMNS."""
    problem = check(FILTER, DataType.FLOAT, (2, 4, 5, 6), 4, (3, 3), pre=(1, 1), groups=2, beta=0.5)
    assert direct_launch(problem).options["UNROLLED"] is None


def depthwise_filter_launch(problem):
    plan = kernels.launch_plan(problem, True, kernels.choose(problem, tma_aligned=True))
    (launch,) = [launch for launch in plan.launches if launch.kernel.__name__ == "filter_depthwise_kernel"]
    return launch


DEPTHWISE_PAST_THE_UNROLL_LIMIT = [  # (dtype, x_dims, k, filt, options), one channel a group
    # 7x7 channels-last, channels not a multiple of the block, pixels not a multiple of the tile, beta
    (DataType.BFLOAT16, (3, 20, 9, 10), 20, (7, 7), dict(pre=(3, 3), channels_last=True, beta=0.5)),
    # 5x5 stride 2, dilation, asymmetric padding, true convolution, alpha; NCHW
    (
        DataType.FLOAT,
        (3, 6, 11, 9),
        6,
        (5, 5),
        dict(pre=(2, 1), post=(1, 2), stride=(2, 2), dilation=(1, 2), flip=True, alpha=2.0),
    ),
    # a channel multiplier of 2, half, channels-last, aligned buffers, beta
    (DataType.HALF, (2, 5, 8, 7), 10, (5, 3), dict(pre=(2, 1), channels_last=True, margin=16, beta=-1.0)),
    # 3-D 3x3x3 (27 taps: four tap blocks of 8 in the backward filter), stride 2
    (DataType.FLOAT, (2, 3, 5, 6, 5), 3, (3, 3, 3), dict(pre=(1, 1, 1), stride=(2, 1, 2), channels_last=True)),
    # 1-D, float64, 11 taps
    (DataType.DOUBLE, (2, 4, 29), 4, (11,), dict(pre=(5,), beta=-1.0)),
]


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("dtype, x_dims, k, filt, options", DEPTHWISE_PAST_THE_UNROLL_LIMIT)
def test_depthwise_backward_filter_past_the_unroll_limit(dtype, x_dims, k, filt, options, channels_last):
    """Each case in both layouts: channels-last filters of a width in DEPTHWISE_ROWS_TILES in float32
    sums take filter_depthwise_rows_kernel (tests/test_convolution_depthwise_filter.py); the others
    filter_depthwise_kernel from their layout's DEPTHWISE_FILTER_MIN_TAPS taps, filter_direct_kernel
    below, all against float64."""
    options = dict(options, channels_last=channels_last)
    problem = check(FILTER, dtype, x_dims, k, filt, groups=x_dims[1], **options)
    plan = kernels.filter_plan(problem)
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.DIRECT
    rows_kernel = channels_last and filt[-1] in DEPTHWISE_ROWS_TILES and dtype is not DataType.DOUBLE
    assert bool(plan.filter_rows) == rows_kernel
    if rows_kernel or math.prod(filt) < DEPTHWISE_FILTER_MIN_TAPS[channels_last]:
        assert plan.block_taps == 0
        return
    assert depthwise_filter_launch(problem).grid[1] == -(-math.prod(filt) // plan.block_taps)


def depthwise_kernel_name(problem):
    """The forward / backward data kernel a depthwise problem should take: channels-last filters up to
    DEPTHWISE_MAX_UNROLLED_WIDTH wide walk runs of output pixels (conv_depthwise_rows_kernel); the
    others conv_depthwise_kernel."""
    channels_last = (problem.y if problem.direction is DATA else problem.x).strides[1] == 1
    walks = channels_last and problem.w.dims[-1] <= DEPTHWISE_MAX_UNROLLED_WIDTH
    return "conv_depthwise_rows_kernel" if walks else "conv_depthwise_kernel"


def depthwise_launch(problem):
    *_, launch = kernels.launch_plan(problem, True, kernels.choose(problem, tma_aligned=True)).launches
    assert launch.kernel.__name__ == depthwise_kernel_name(problem)
    return launch


@pytest.mark.parametrize("direction", [FWD, DATA])
@pytest.mark.parametrize("dtype, x_dims, k, filt, options", DEPTHWISE_PAST_THE_UNROLL_LIMIT)
def test_depthwise_forward_and_backward_data_past_the_unroll_limit(direction, dtype, x_dims, k, filt, options):
    problem = check(direction, dtype, x_dims, k, filt, groups=x_dims[1], **options)
    launch = depthwise_launch(problem)
    channels = x_dims[1] if direction is DATA else k
    assert launch.grid[1] == -(-channels // launch.options["BLOCK_C"])


DEPTHWISE_PACKED = [  # beside those: a channels-last 3 x 3 stride 2, and a channels-last width past
    # DEPTHWISE_MAX_UNROLLED_WIDTH
    (DataType.BFLOAT16, (2, 12, 9, 8), 12, (3, 3), dict(pre=(1, 1), stride=(2, 2), channels_last=True)),
    (DataType.HALF, (2, 6, 31), 6, (11,), dict(pre=(4,), post=(6,), channels_last=True, beta=0.5)),
]


@pytest.mark.parametrize(
    "direction, algo",
    [
        (FWD, ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM),
        (FWD, ConvolutionFwdAlgo.GEMM),
        (DATA, ConvolutionBwdDataAlgo.ALGO_1),
    ],
)
@pytest.mark.parametrize("dtype, x_dims, k, filt, options", DEPTHWISE_PAST_THE_UNROLL_LIMIT + DEPTHWISE_PACKED)
def test_depthwise_under_a_workspace_reads_the_filter_packed_tap_major(
    direction, algo, dtype, x_dims, k, filt, options
):
    """Under the algorithms with a workspace the depthwise kernel reads a copy of the filter packed
    [taps, K] there (the workspace holds that copy alone) and the call prefers them, channels-first or
    in 16 bits; channels-last float32 and float64 keep their earlier routes. Against float64."""
    problem = check(direction, dtype, x_dims, k, filt, groups=x_dims[1], algo=algo, **options)
    plan = kernels.launch_plan(problem, True, kernels.choose(problem, tma_aligned=True))
    names = [launch.kernel.__name__ for launch in plan.launches]
    packed = not options.get("channels_last") or dtype.itemsize == 2
    assert kernels.preferred(problem) is packed
    if not packed:
        assert "staging_kernel" not in names and "conv_depthwise_kernel" not in names
        return
    assert names == ["staging_kernel", depthwise_kernel_name(problem)]
    assert not plan.launches[0].options["ROUND_TO_TF32"]
    assert kernels.workspace_size(problem) == aligned(math.prod((k, *filt)) * dtype.itemsize)
    packed = depthwise_packed_filter(problem)
    assert packed.strides[0] == 1 and packed.strides[-1] == k
    if names[1] == "conv_depthwise_kernel":
        unrolled = options.get("channels_last") and filt[-1] <= DEPTHWISE_MAX_UNROLLED_WIDTH
        assert plan.launches[1].options["UNROLLED_WIDTH"] == (filt[-1] if unrolled else None)


def test_functional_depthwise_calls_take_the_packed_filter_unless_the_workspace_is_refused(planned_convolutions):
    """conv and conv_backward_data naming no algorithm take the algorithms that read the filter packed
    (Get ranks them first); a handle admitting no workspace keeps the caller's filter. Against float64."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 12, 9, 10, generator=generator).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(12, 1, 5, 5, generator=generator).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(2, 12, 9, 10, generator=generator).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    packed = ["staging_kernel", "conv_depthwise_rows_kernel"]
    handle = od.create("cpu", backend="triton")
    y = functional.conv(x, w, padding=2, groups=12, handle=handle)
    dx = functional.conv_backward_data(dy, w, x.shape, padding=2, groups=12, handle=handle)
    assert planned_convolutions == [
        (ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, S.DIRECT, packed),
        (ConvolutionBwdDataAlgo.ALGO_1, S.DIRECT, packed),
    ]
    want_y = F.conv2d(x.double(), w.double(), padding=2, groups=12)
    want_dx = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), padding=2, groups=12)
    assert relative_error(y.double(), want_y) < TOLERANCE[BF16]
    assert relative_error(dx.double(), want_dx) < TOLERANCE[BF16]
    planned_convolutions.clear()
    no_workspace = od.create("cpu", backend="triton", workspace_limit=0)
    functional.conv(x, w, padding=2, groups=12, handle=no_workspace)
    functional.conv_backward_data(dy, w, x.shape, padding=2, groups=12, handle=no_workspace)
    in_place = ["conv_depthwise_rows_kernel"]
    assert planned_convolutions == [
        (ConvolutionFwdAlgo.IMPLICIT_GEMM, S.DIRECT, in_place),
        (ConvolutionBwdDataAlgo.ALGO_0, S.DIRECT, in_place),
    ]


DEPTHWISE_RUNS = [  # (direction, dtype, x_dims, k, filt, options), one channel a group, channels-last
    # 53 pixels a row, a 3-wide filter: 14 runs of 4, the last of 1; padding, beta
    (FWD, DataType.BFLOAT16, (1, 12, 3, 53), 12, (3, 3), dict(pre=(1, 1), beta=0.5)),
    # 14 pixels a row, a 5-wide filter: one run; a channel multiplier of 3, true convolution, a margin
    (FWD, DataType.HALF, (2, 4, 5, 14), 12, (5, 5), dict(pre=(2, 1), post=(2, 3), flip=True, margin=16)),
    # stride 2 and 3 along the width (columns between the taps never loaded), asymmetric padding; 17
    # pixels a row: runs of 6 and 5 (at most 8 past 3 taps when strided)
    (FWD, DataType.FLOAT, (2, 5, 7, 37), 5, (3, 5), dict(pre=(1, 0), post=(0, 1), stride=(1, 2))),
    (FWD, DataType.BFLOAT16, (1, 9, 6, 29), 9, (2, 7), dict(pre=(1, 3), stride=(2, 3), alpha=-2.0)),
    # dilation along both dims, float64
    (FWD, DataType.DOUBLE, (2, 3, 9, 20), 3, (3, 4), dict(pre=(2, 2), dilation=(2, 3))),
    # 3-D, 1 x 1 filter (a run of one tap)
    (FWD, DataType.BFLOAT16, (2, 6, 3, 4, 11), 6, (3, 3, 3), dict(pre=(1, 1, 1), stride=(2, 1, 1))),
    (FWD, DataType.BFLOAT16, (2, 6, 5, 9), 6, (1, 1), dict(beta=-1.0)),
    # backward data: stride 2 along the height only, dilated width, a channel multiplier of 2, beta
    (DATA, DataType.BFLOAT16, (2, 5, 9, 23), 10, (3, 5), dict(pre=(1, 4), stride=(2, 1), dilation=(1, 2), beta=0.5)),
    (DATA, DataType.FLOAT, (1, 7, 6, 11), 7, (7, 7), dict(pre=(3, 3), flip=True)),
    (DATA, DataType.HALF, (1, 4, 3, 4, 9), 4, (3, 3, 3), dict(pre=(1, 1, 1), post=(0, 1, 2))),
    # backward data strided along the width: each output takes the taps of its phase. Stride 2 over 23
    # columns (runs of 4); stride 3 with dilation 2 (phase 2 of 3; runs of 15, a multiple of 3); stride 2
    # with a channel multiplier of 2 and true convolution (one run of 14)
    (DATA, DataType.BFLOAT16, (2, 6, 9, 23), 6, (3, 3), dict(pre=(1, 1), stride=(2, 2))),
    (DATA, DataType.FLOAT, (1, 5, 7, 29), 5, (5, 5), dict(pre=(2, 1), stride=(1, 3), dilation=(1, 2), beta=0.5)),
    (DATA, DataType.HALF, (1, 4, 8, 14), 8, (5, 5), dict(pre=(2, 2), stride=(2, 2), flip=True)),
]


@pytest.mark.parametrize("direction, dtype, x_dims, k, filt, options", DEPTHWISE_RUNS)
def test_depthwise_runs_along_the_rows(direction, dtype, x_dims, k, filt, options):
    """conv_depthwise_rows_kernel against float64, over the filter packed in the workspace in 16 bits
    (the algorithms calls that name none take) and in place in 32 and 64 bits (from 10 taps): runs as
    long as DEPTHWISE_LONGEST_RUN allows (4 pixels up to 3 taps wide, else 16; 8 for a forward strided
    along the width), equal within one pixel,
    a strided backward's rounded up to a multiple of the stride, the output a row's runs cover exactly (x
    and y poisoned around the tensors)."""
    packed = ConvolutionBwdDataAlgo.ALGO_1 if direction is DATA else ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    algo = packed if dtype.itemsize == 2 else None
    problem = check(direction, dtype, x_dims, k, filt, groups=x_dims[1], channels_last=True, algo=algo, **options)
    launch = depthwise_launch(problem)
    width = (problem.x if direction is DATA else problem.y).dims[-1]
    longest = 4 if filt[-1] <= 3 else 8 if direction is FWD and problem.stride[-1] > 1 else 16
    step = problem.stride[-1] if direction is DATA else 1
    equal = -(-width // -(-width // longest))
    run = launch.options["RUN"]
    assert run == -(-equal // step) * step and (-(-width // run) - 1) * run < width


def test_depthwise_forward_epilogue_bias_residual_relu():
    problem = check(
        FWD,
        DataType.BFLOAT16,
        (2, 24, 7, 9),
        24,
        (7, 7),
        pre=(3, 3),
        groups=24,
        bias=True,
        z=True,
        act=PointwiseMode.RELU_FWD,
        alpha=1.5,
        channels_last=True,
    )
    assert depthwise_launch(problem).options["HAS_BIAS"]


@pytest.mark.parametrize("direction", [FWD, DATA])
def test_depthwise_writes_a_strided_channel_slice_and_nothing_around_it(direction):
    """The output is channels [4, 4 + 20) of a 32-channel NHWC buffer poisoned with NaN: the slice
    matches torch in float64 and the other channels stay NaN."""
    groups, spatial, filt, pad = 20, (9, 10), (5, 5), (2, 2)
    out_dims = (3, groups, *spatial)
    buffer = torch.full((3, *spatial, 32), float("nan"), dtype=torch.bfloat16)
    out = buffer[..., 4 : 4 + groups].permute(0, 3, 1, 2)
    out_desc = TensorDescriptor(DataType.BFLOAT16, out_dims, out.stride())
    a_desc, a, _ = make(out_dims, DataType.BFLOAT16, True, seed=1)
    w_desc, w, _ = make((groups, 1, *filt), DataType.BFLOAT16, True, seed=2)
    x_desc, y_desc = (out_desc, a_desc) if direction is DATA else (a_desc, out_desc)
    problem = ConvolutionProblem(
        direction,
        x_desc,
        w_desc,
        y_desc,
        pad,
        pad,
        (1, 1),
        (1, 1),
        groups,
        False,
        DataType.FLOAT,
        False,
        ConvolutionFwdAlgo.IMPLICIT_GEMM if direction is FWD else ConvolutionBwdDataAlgo.ALGO_0,
        1.0,
        0.0,
    )
    depthwise_launch(problem)
    out_bound = Bound("out", out_desc, out, "cpu")
    x, y = (out_bound, a) if direction is DATA else (a, out_bound)
    kernels.run(problem, x, w, y)
    want = torch_forward(a.view.double(), w.view.double(), pad, pad, (1, 1), (1, 1), groups, False)
    if direction is DATA:  # the same layer's backward data: the filter turned around, channels swapped
        weight = w.view.double().flip([2, 3])
        want = F.conv2d(a.view.double(), weight, padding=pad, groups=groups)
    error = (torch.linalg.norm(out.double() - want) / torch.linalg.norm(want)).item()
    assert error < TOLERANCE[DataType.BFLOAT16], error
    assert buffer[..., :4].isnan().all() and buffer[..., 4 + groups :].isnan().all()


def test_depthwise_backward_filter_slices_are_summed_in_a_fixed_order():
    """Many slices (the workspace's partials, then filter_sum_kernel) of filter_depthwise_rows_kernel:
    bitwise the same on every run."""
    problem = check(FILTER, DataType.BFLOAT16, (24, 12, 16, 16), 12, (7, 7), pre=(3, 3), groups=12, channels_last=True)
    assert kernels.filter_plan(problem).splits > 1 and kernels.filter_plan(problem).filter_rows
    x_desc, x, _ = make(problem.x.dims, DataType.BFLOAT16, True, seed=1)
    _, y, _ = make(problem.y.dims, DataType.BFLOAT16, True, seed=3)
    size = kernels.workspace_size(problem)
    results = []
    for _ in range(2):
        w_desc, w, _ = make(problem.w.dims, DataType.BFLOAT16, True, fill=False)
        space = torch.full((size,), 255, dtype=torch.uint8)  # stale partials must not leak into the sum
        workspace = Bound("workspace", TensorDescriptor(DataType.UINT8, (size,)), space, "cpu")
        kernels.run(problem, x, w, y, None, None, workspace)
        results.append(w.view.clone())
    assert not results[0].isnan().any()
    assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))


def test_backward_filter_split_slices_nhwc_half():
    problem = check(FILTER, DataType.HALF, (1, 16, 32, 32), 16, (1, 1), channels_last=True)
    assert kernels.filter_plan(problem).splits > 1


@pytest.mark.parametrize("algo", [ConvolutionBwdFilterAlgo.ALGO_1, ConvolutionBwdFilterAlgo.ALGO_3])
def test_backward_filter_gemm_and_precomputed_flip_beta(algo):
    check(
        FILTER,
        DataType.FLOAT,
        (2, 6, 7, 6),
        4,
        (3, 2),
        pre=(1, 0),
        stride=(2, 1),
        dilation=(1, 2),
        groups=2,
        flip=True,
        algo=algo,
        alpha=2.0,
        beta=0.5,
    )


def test_backward_filter_odd_channels_1d_float64():
    check(FILTER, DataType.DOUBLE, (2, 3, 17), 5, (5,), pre=(2,), post=(1,), stride=(3,))


def test_backward_filter_depthwise_direct_split():
    problem = check(
        FILTER, DataType.FLOAT, (2, 8, 24, 24), 8, (3, 3), pre=(1, 1), groups=8, channels_last=True, beta=0.5
    )
    assert kernels.filter_plan(problem).direct


def test_workspace_sizes_by_algorithm():
    base = dict(x_dims=(1, 4, 6, 6), k=4, filt=(3, 3))
    for algo, nonzero in (
        (ConvolutionFwdAlgo.IMPLICIT_GEMM, False),
        (ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, True),
        (ConvolutionFwdAlgo.GEMM, True),
    ):
        problem = check(FWD, DataType.FLOAT, base["x_dims"], base["k"], base["filt"], algo=algo)
        assert (kernels.workspace_size(problem) > 0) == nonzero
    im2col = 16 * 4 * 9 * 4
    assert (
        kernels.workspace_size(check(FWD, DataType.FLOAT, (1, 4, 6, 6), 4, (3, 3), algo=ConvolutionFwdAlgo.GEMM))
        == math.ceil(im2col / 256) * 256
    )


def test_backward_filter_direct_two_channels_per_group_flip_float64():
    problem = check(
        FILTER, DataType.DOUBLE, (2, 4, 5, 6), 4, (3, 3), pre=(1, 0), stride=(1, 2), groups=2, flip=True, beta=0.5
    )
    assert kernels.filter_plan(problem).direct


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("direction", [FWD, DATA])
def test_1x1_runs_as_a_matrix_product(direction, channels_last):
    """Channels-last: the pixels by the filter; NCHW: the filter by each image (the images' batch
    dim, 32 pixels: channels 64 bytes apart, what TMA reads; x and y inside NaN-filled buffers)."""
    problem = check(
        direction, DataType.BFLOAT16, (2, 32, 4, 8), 48, (1, 1), channels_last=channels_last,
        alpha=1.0 if direction is FWD else 1.5, beta=0.5, bias=direction is FWD, margin=16,
    )  # fmt: skip
    assert kernels.matmul_form(problem) is not None
    assert kernels.filter_times_images(problem) is not channels_last


def test_1x1_forward_with_bias_as_a_matrix_product_but_not_epilogues_matmul_computes_otherwise():
    one_by_one = dict(dtype=DataType.HALF, x_dims=(2, 16, 4, 5), k=32, filt=(1, 1))
    assert kernels.matmul_form(check(FWD, **one_by_one, channels_last=True, bias=True)) is not None
    assert (
        kernels.matmul_form(check(FWD, DataType.FLOAT, (2, 16, 4, 5), 32, (1, 1), channels_last=True, allow_tf32=True))
        is not None
    )
    for kw in (dict(bias=True, alpha=0.5), dict(bias=True, z=True), dict(bias=True, act=PointwiseMode.RELU_FWD)):
        assert kernels.matmul_form(check(FWD, **one_by_one, channels_last=True, **kw)) is None, kw
    assert kernels.matmul_form(check(FWD, **{**one_by_one, "x_dims": (2, 16, 4, 8)}, bias=True)) is not None  # NCHW
    assert kernels.matmul_form(check(FWD, **one_by_one)) is None  # NCHW channels 40 bytes apart: no TMA
    nchw_tf32 = check(FWD, DataType.FLOAT, (2, 16, 4, 5), 32, (1, 1), allow_tf32=True)
    assert kernels.matmul_form(nchw_tf32) is None  # its images would be TF32 operands pixels-major
    assert kernels.matmul_form(check(FWD, DataType.FLOAT, (2, 16, 4, 5), 32, (1, 1), channels_last=True)) is None
    assert kernels.matmul_form(check(FWD, **one_by_one, channels_last=True, stride=(2, 2))) is None


def _read_by_tma(problem):
    return kernels.choose(problem, tma_aligned=True) is kernels.Strategy.TMA


def test_tma_forward_3x3_flip_epilogue_and_a_partial_column_tile():
    problem = check(
        FWD,
        DataType.BFLOAT16,
        (3, 64, 5, 7),
        48,
        (3, 3),
        pre=(1, 1),
        flip=True,
        channels_last=True,
        bias=True,
        z=True,
        act=PointwiseMode.RELU_FWD,
        margin=16,
    )
    assert _read_by_tma(problem)


def test_tma_forward_asymmetric_padding_dilation_two_chunks_per_tap_half():
    problem = check(
        FWD,
        DataType.HALF,
        (2, 128, 6, 5),
        80,
        (3, 2),
        pre=(0, 2),
        post=(2, 1),
        dilation=(2, 1),
        channels_last=True,
        alpha=0.5,
        beta=0.25,
        margin=16,
    )
    assert _read_by_tma(problem)


def test_tma_backward_data_dilation_flip_beta():
    problem = check(
        DATA,
        DataType.BFLOAT16,
        (2, 40, 6, 7),
        64,
        (3, 3),
        pre=(2, 2),
        dilation=(2, 2),
        flip=True,
        channels_last=True,
        beta=0.5,
        margin=16,
    )
    assert _read_by_tma(problem)


@pytest.mark.parametrize(
    "direction, dtype, x_dims, k, options, chunk",
    [
        (FWD, DataType.BFLOAT16, (2, 40, 6, 7), 48, dict(flip=True, bias=True, act=PointwiseMode.RELU_FWD), 64),
        (FWD, DataType.HALF, (2, 32, 5, 9), 40, dict(dilation=(2, 1), pre=(2, 1)), 32),
        (FWD, DataType.BFLOAT16, (2, 32, 6, 8), 24, dict(stride=(2, 2)), 32),  # whole chunks along strided rows
        (DATA, DataType.BFLOAT16, (2, 24, 6, 7), 40, dict(stride=(2, 2), beta=0.5), 64),
        (FWD, DataType.FLOAT, (2, 40, 6, 7), 24, dict(allow_tf32=True, alpha=0.5), 32),
        (DATA, DataType.FLOAT, (2, 24, 6, 7), 36, dict(allow_tf32=True), 32),  # the repacked filter per tap
    ],
    ids=["bf16_40_partial", "half_32_chunk_32", "bf16_32_strided", "data_40_strided", "tf32_40", "tf32_data_36"],
)
def test_tma_reductions_of_fewer_or_not_whole_chunks_of_channels(direction, dtype, x_dims, k, options, chunk):
    options = {"pre": (1, 1), **options}
    problem = check(direction, dtype, x_dims, k, (3, 3), channels_last=True, margin=16, **options)
    assert _read_by_tma(problem) and tma_block_k(problem) == chunk


def test_a_partial_chunk_reads_the_filter_per_tap_not_the_next_taps_channels():
    """An infinite weight at tap (0, 1) of 40 channels read in chunks of 64: the chunk of tap (0, 0)
    must read zeros past channel 39 of the filter, not tap (0, 1)'s channels, else every pixel of that
    output channel would add 0 * inf."""
    dims, k = (1, 40, 5, 12), 16
    x_desc, xb, _ = make(dims, DataType.BFLOAT16, True, margin=16, seed=1)
    w_desc, wb, _ = make((k, 40, 3, 3), DataType.BFLOAT16, True, seed=2)
    y_desc, yb, _ = make(dims[:1] + (k,) + dims[2:], DataType.BFLOAT16, True, margin=16, fill=False)
    wb.view[3, 0, 0, 1] = float("inf")
    problem = ConvolutionProblem(
        FWD, x_desc, w_desc, y_desc, (1, 1), (1, 1), (1, 1), (1, 1), 1, False, DataType.FLOAT, False,
        ConvolutionFwdAlgo.IMPLICIT_GEMM, 1.0, 0.0, None, None, 0.0, None, 0.0,
    )  # fmt: skip
    assert _read_by_tma(problem) and tma_block_k(problem) == 64
    kernels.run(problem, xb, wb, yb, None, None, None)
    want = torch_forward(xb.view.double(), wb.view.double(), (1, 1), (1, 1), (1, 1), (1, 1), 1, False)
    got = yb.view.double()
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.isnan(want[0, 3, 0]).all() and torch.isinf(want[0, 3, 1:]).all()  # row 0 reads padding there
    finite = torch.isfinite(want)
    assert relative_error(got[finite].numpy(), want[finite].numpy()) < 1e-2


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.BFLOAT16])
@pytest.mark.parametrize("direction", [FWD, DATA, FILTER])
def test_a_grouped_backward_filter_over_nchw_reads_channels_last_copies_of_x_and_dy(direction, dtype):
    """Blocks of groups load [pixels, channels] tiles: over NCHW activations a gather of single
    elements. The backward filter reads channels-last copies (rounded to TF32 in float32); the
    forward and backward data under IMPLICIT_GEMM / ALGO_0 read theirs in place, with zero workspace."""
    problem = check(
        direction, dtype, (2, 24, 5, 6), 36, (3, 3), pre=(1, 1), groups=3, allow_tf32=True, beta=0.5, margin=16,
    )  # fmt: skip
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.GROUPED
    names = _kernel_names(problem)
    if direction is FILTER:
        assert names[:2] == ["staging_kernel"] * 2 and names[2] == "grouped_filter_kernel"
        assert kernels.workspace_size(problem) >= (problem.x.numel + problem.y.numel) * dtype.itemsize
    else:
        assert names == ["grouped_conv_kernel"] and kernels.workspace_size(problem) == 0


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.BFLOAT16])
@pytest.mark.parametrize(
    "direction, algo", [(FWD, ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM), (DATA, ConvolutionBwdDataAlgo.ALGO_1)]
)
def test_a_grouped_problem_over_nchw_reads_channels_last_copies_under_an_algorithm_with_a_workspace(
    direction, algo, dtype
):
    """The tiles' group channels are contiguous in the copies of the KCRS filter and of the reduced
    NCHW activation (a vector load a thread, where the caller's layout puts each element apart); the
    heuristics rank the algorithm first. Group widths of 12 and 8 (not whole chunks), stride 2
    backward data (a launch per phase); a channels-last problem copies nothing and keeps its route."""
    problem = check(
        direction, dtype, (2, 36, 7, 6), 24, (3, 3), pre=(1, 1), stride=(2, 2) if direction is DATA else None,
        groups=3, algo=algo, allow_tf32=True, beta=0.5, bias=direction is FWD, margin=16,
    )  # fmt: skip
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.GROUPED and kernels.preferred(problem)
    assert _kernel_names(problem) == ["staging_kernel", "staging_kernel", "grouped_conv_kernel"]
    reduced = problem.y if direction is DATA else problem.x
    copies = [kernels.aligned(desc.numel * dtype.itemsize) for desc in (reduced, problem.w)]
    assert kernels.workspace_size(problem) == sum(copies)
    channels_last = {
        name: TensorDescriptor(dtype, desc.dims, strides_for_order(desc.dims, (0, 2, 3, 1)))
        for name, desc in (("x", problem.x), ("w", problem.w), ("y", problem.y))
    }
    assert not kernels.preferred(dataclasses.replace(problem, **channels_last))


@pytest.mark.parametrize(
    "direction, dtype, x_dims, k, filt, options",
    [
        (FWD, DataType.BFLOAT16, (2, 32, 4, 5, 6), 40, (3, 3, 3), dict(pre=(2, 1, 1), dilation=(2, 1, 1), flip=True)),
        (
            FWD,
            DataType.HALF,
            (1, 64, 3, 6, 8),
            24,
            (3, 1, 3),
            dict(pre=(1, 0, 1), bias=True, act=PointwiseMode.RELU_FWD),
        ),
        (DATA, DataType.BFLOAT16, (2, 40, 4, 6, 7), 48, (3, 3, 3), dict(pre=(1, 1, 1), stride=(1, 2, 2), beta=0.5)),
        (DATA, DataType.FLOAT, (2, 24, 3, 5, 6), 32, (3, 3, 3), dict(pre=(1, 1, 1), allow_tf32=True)),
    ],
    ids=["bf16_dilated_flipped", "half_epilogue", "data_strided_hw_beta", "tf32_data_repacked_filter"],
)
def test_3d_forward_and_backward_data_read_frames_by_tma(direction, dtype, x_dims, k, filt, options):
    """Frames are the view's third dim: a box covers one output frame, and each tap in depth moves the
    frame it reads (zero fill past the first and last frames is the depth padding)."""
    problem = check(direction, dtype, x_dims, k, filt, channels_last=True, margin=16, **options)
    assert _read_by_tma(problem) and _kernel_names(problem)[-1] == "conv_tma_kernel"
    assert kernels.choose(problem, tma_aligned=True, hopper=True) is kernels.Strategy.TMA  # the engine: 2-D


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.BFLOAT16])
def test_a_3d_forward_over_ncdhw_reads_its_staged_copy_and_strided_frames_stay_off_tma(dtype):
    precomputed = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    problem = check(FWD, dtype, (2, 32, 3, 5, 6), 24, (3, 3, 3), pre=(1, 1, 1), algo=precomputed, allow_tf32=True)
    assert kernels.staged(problem) == ("x",) and "conv_tma_kernel" in _kernel_names(problem)
    backward = check(DATA, dtype, (2, 24, 3, 5, 6), 32, (3, 3, 3), pre=(1, 1, 1), flip=True, allow_tf32=True)
    assert kernels.staged(backward) == ("y",) and "conv_tma_kernel" in _kernel_names(backward)
    base = dict(dtype=DataType.BFLOAT16, x_dims=(2, 32, 4, 6, 6), k=32, filt=(3, 3, 3), pre=(1, 1, 1), margin=16)
    assert kernels.tma_blocks(check(FWD, **base, channels_last=True, stride=(2, 1, 1))) is None  # depth strided
    assert kernels.tma_blocks(check(FWD, **base, channels_last=True, stride=(1, 2, 2))) is None  # rows: no phases


def _random_tma_problem(rng):
    """Arguments of ``check`` for a random 2-D or 3-D forward or backward data the TMA route may take:
    channel counts whole or partial chunks, strides (unit in depth), dilations, padding, true
    convolution, beta, 16-bit or TF32 (NCHW forwards under IMPLICIT_PRECOMP_GEMM staged)."""
    spatial = rng.choice([2, 3])
    direction, dtype = rng.choice([FWD, DATA]), rng.choice([DataType.BFLOAT16, DataType.HALF, DataType.FLOAT])
    sizes = tuple(rng.randint(2, 4) if spatial == 3 and d == 0 else rng.randint(3, 8) for d in range(spatial))
    filt = tuple(rng.choice([1, 2, 3]) for _ in range(spatial))
    stride = tuple(1 if spatial == 3 and d == 0 else rng.choice([1, 1, 2]) for d in range(spatial))
    dilation = tuple(rng.choice([1, 1, 2]) for _ in range(spatial))
    pre = tuple(rng.randint(0, d * (f - 1)) for f, d in zip(filt, dilation))
    post = tuple(d * (f - 1) - p for f, d, p in zip(filt, dilation, pre))  # the output as large as x
    options = dict(pre=pre, post=post, stride=stride, dilation=dilation, flip=rng.random() < 0.3, margin=16)
    options.update(channels_last=rng.random() < 0.75, beta=rng.choice([0.0, 0.5]), allow_tf32=dtype is DataType.FLOAT)
    if direction is FWD and (dtype is DataType.FLOAT or not options["channels_last"]):
        options["algo"] = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM  # NCHW x: its staged copy
    channels = (rng.randint(1, 3), rng.choice([32, 40, 64, 96]), *sizes)
    return direction, dtype, channels, rng.choice([24, 32, 40, 80]), filt, options


def test_random_problems_of_the_tma_route_match_float64():
    """24 seeded random problems (``_random_tma_problem``), each against torch in float64 by ``check``;
    most of them on the TMA route."""
    rng = random.Random(7)
    problems = [check(*arguments[:5], **arguments[5]) for arguments in (_random_tma_problem(rng) for _ in range(24))]
    assert sum(_read_by_tma(problem) for problem in problems) >= 12


def _kernel_names(problem):
    strategy = kernels.choose(problem, tma_aligned=True)
    return [launch.kernel.fn.__name__ for launch in kernels.launch_plan(problem, True, strategy).launches]


@pytest.mark.parametrize(
    "epilogue",
    [dict(), dict(alpha=0.5, beta=0.25, bias=True, z=True, act=PointwiseMode.RELU_FWD)],
    ids=["plain", "alpha_beta_bias_z_relu"],
)
def test_a_forward_of_few_tiles_slices_its_reduction_and_sums_the_slices_in_the_epilogue(epilogue):
    """One 64-pixel box and one tile of channels over 27 (tap, chunk) steps: slices of 5, 5, 5, 5, 5
    and 2 steps write float32 partial sums, which the sum kernel adds and finishes."""
    precomputed = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    problem = check(
        FWD, DataType.BFLOAT16, (1, 192, 6, 7), 48, (3, 3), pre=(1, 1), algo=precomputed, channels_last=True,
        margin=16, **epilogue,
    )  # fmt: skip
    assert _read_by_tma(problem)
    assert kernels.reduction_slices(problem) == (6, 5)
    assert _kernel_names(problem) == ["conv_tma_kernel", "slice_sum_kernel"]
    assert kernels.workspace_size(problem) >= 6 * 6 * 7 * 48 * 4


def test_a_3d_forward_of_few_tiles_slices_its_reduction_over_frames():
    """Two frames of one 64-pixel box, 27 taps of three chunks: the slices' partial sums and the sum
    kernel's epilogue walk frames too."""
    precomputed = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    problem = check(
        FWD, DataType.BFLOAT16, (1, 160, 2, 6, 7), 48, (3, 3, 3), pre=(1, 1, 1), algo=precomputed,
        channels_last=True, margin=16, bias=True, z=True, act=PointwiseMode.RELU_FWD,
    )  # fmt: skip
    assert kernels.reduction_slices(problem)[0] > 1
    assert _kernel_names(problem) == ["conv_tma_kernel", "slice_sum_kernel"]


def test_a_sliced_tf32_forward_over_nchw_reads_its_staged_copies():
    precomputed = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    problem = check(FWD, DataType.FLOAT, (1, 128, 12, 12), 40, (3, 3), pre=(1, 1), algo=precomputed, allow_tf32=True)
    assert kernels.reduction_slices(problem)[0] > 1
    assert _kernel_names(problem)[-2:] == ["conv_tma_kernel", "slice_sum_kernel"]


def test_the_zero_workspace_forward_and_forwards_of_many_tiles_or_few_steps_are_not_sliced():
    shape = dict(dtype=DataType.BFLOAT16, x_dims=(1, 192, 6, 7), k=48, filt=(3, 3), pre=(1, 1), channels_last=True)
    problem = check(FWD, **shape, margin=16)  # IMPLICIT_GEMM: no workspace for partial sums
    assert kernels.reduction_slices(problem)[0] == 1 and kernels.workspace_size(problem) == 0
    assert _kernel_names(problem) == ["conv_tma_kernel"]
    many = dataclasses.replace(problem, algo=ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)
    assert kernels.reduction_slices(many)[0] > 1
    few = dataclasses.replace(
        many,
        x=TensorDescriptor(DataType.BFLOAT16, (1, 64, 6, 7), many.x.strides),
        w=TensorDescriptor(DataType.BFLOAT16, (48, 64, 3, 3), many.w.strides),
    )
    assert kernels.reduction_slices(few) == (1, 9)  # 9 steps: the sum would cost what the slices save
    wide = dataclasses.replace(
        many,
        x=TensorDescriptor(DataType.BFLOAT16, (512, 128, 6, 7), many.x.strides),
        y=TensorDescriptor(DataType.BFLOAT16, (512, 48, 6, 7), many.y.strides),
    )  # fmt: skip
    assert kernels.reduction_slices(wide)[0] == 1  # 512 boxes: the tiles fill the GPU


@pytest.mark.parametrize("splits", [False, True])
def test_tma_backward_filter_dilation_flip_beta(splits):
    dims = (16, 64, 9, 10) if splits else (1, 64, 4, 5)  # 14 boxes of 8 x 1 x 16 pixels in 3 slices, or one
    problem = check(
        FILTER,
        DataType.BFLOAT16,
        dims,
        128,
        (3, 2),
        pre=(2, 1),
        post=(0, 1),
        dilation=(2, 1),
        flip=True,
        channels_last=True,
        beta=0.5,
        margin=16,
    )
    assert _read_by_tma(problem)
    assert (kernels.tma_filter_split(problem)[1] > 1) == splits


def test_tma_not_taken_when_misaligned_strided_or_nchw():
    base = dict(dtype=DataType.BFLOAT16, x_dims=(2, 64, 5, 6), k=32, filt=(3, 3), pre=(1, 1))
    assert kernels.tma_blocks(check(FWD, **base, channels_last=True)) is not None  # margin 6: the run falls back
    stride_2_odd_height = check(FWD, **base, channels_last=True, stride=(2, 1), margin=16)
    assert kernels.tma_blocks(stride_2_odd_height) is None  # no phase view fits 5 rows
    assert kernels.tma_blocks(check(FWD, **base, margin=16)) is None


@pytest.mark.parametrize("direction", [FWD, DATA])
def test_tma_tf32_channels_last_forward_and_backward_data_dilation_flip_beta(direction):
    problem = check(
        direction,
        DataType.FLOAT,
        (2, 32, 6, 7),
        64,
        (3, 2),
        pre=(2, 1),
        post=(0, 1),
        dilation=(2, 1),
        flip=True,
        channels_last=True,
        beta=0.5,
        allow_tf32=True,
        margin=16,
    )
    assert _read_by_tma(problem) and kernels.staged(problem) == ()
    assert kernels.workspace_size(problem) == (problem.w.numel * 4 if direction is DATA else 0)  # filter [C, R, S, K]


@pytest.mark.parametrize("dtype", [DataType.FLOAT, DataType.BFLOAT16])
@pytest.mark.parametrize("direction", [FWD, DATA, FILTER])
def test_tma_nchw_problems_stage_channels_last_copies(direction, dtype):
    """TF32 and 16-bit alike: backward problems under every implicit algorithm, forwards under
    IMPLICIT_PRECOMP_GEMM; the KCRS filter copied KRSC (forward) or [C, R, S, K] (backward data)."""
    dims = (4, 32, 9, 10) if direction is FILTER else (2, 32, 5, 7)
    algo = ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM if direction is FWD else None
    problem = check(
        direction, dtype, dims, 64, (3, 3), pre=(1, 1), flip=direction is DATA, beta=0.5, algo=algo,
        allow_tf32=True, margin=16,
    )  # fmt: skip
    assert _read_by_tma(problem)
    assert kernels.staged(problem) == {FWD: ("x",), DATA: ("y",), FILTER: ("x", "y")}[direction]
    assert kernels.packs_filter(problem) is (direction is not FILTER)


def test_tma_tf32_not_taken_for_strict_float32_nchw_forward_or_odd_channels():
    base = dict(dtype=DataType.FLOAT, x_dims=(2, 32, 5, 6), k=32, filt=(3, 3), pre=(1, 1), margin=16)
    assert kernels.tma_blocks(check(FWD, **base, channels_last=True)) is None  # TF32 not allowed
    assert kernels.tma_blocks(check(FWD, **base, allow_tf32=True)) is None  # NCHW forward: no workspace to stage
    six_reduced = check(DATA, **{**base, "k": 6}, allow_tf32=True)  # the repacked filter's taps 24 bytes apart
    assert kernels.tma_blocks(six_reduced) is None
    one_by_one = dict(dtype=DataType.FLOAT, x_dims=(2, 64, 5, 6), k=64, filt=(1, 1), margin=16, allow_tf32=True)
    for direction in (DATA, FILTER):  # NCHW 1x1: copies would outweigh an explicit GEMM's columns (x itself)
        assert kernels.tma_blocks(check(direction, **one_by_one)) is None


@pytest.mark.parametrize("dtype, tf32", [(DataType.FLOAT, True), (DataType.BFLOAT16, False)])
def test_nchw_1x1_backward_filter_as_per_image_products_summed_in_order(dtype, tf32):
    problem = check(FILTER, dtype, (3, 40, 5, 6), 24, (1, 1), beta=0.5, allow_tf32=tf32, margin=16)
    assert kernels.filter_matmul_form(problem) is not None
    assert kernels.workspace_size(problem) >= 3 * 24 * 40 * 4  # the three images' partial filters


def test_nchw_1x1_backward_filter_product_not_taken_when_partials_outweigh_columns_or_channels_last():
    base = dict(dtype=DataType.FLOAT, x_dims=(2, 16, 2, 3), filt=(1, 1), allow_tf32=True, margin=16)
    assert kernels.filter_matmul_form(check(FILTER, k=8, **base)) is None  # 8 partial rows > 6 pixels
    assert kernels.filter_matmul_form(check(FILTER, k=4, **base, channels_last=True)) is None
    assert kernels.filter_matmul_form(check(FILTER, k=4, **{**base, "allow_tf32": False})) is None  # strict fp32


S = kernels.Strategy
F32, BF16 = DataType.FLOAT, DataType.BFLOAT16


@pytest.mark.parametrize(
    "direction, dtype, x_dims, k, filt, options, strategy",
    [
        (FWD, F32, (2, 16, 7, 9), 16, (3, 3), dict(pre=(1, 1)), S.IMPLICIT_GEMM),
        (FWD, F32, (2, 16, 7, 9), 16, (3, 3), dict(algo=ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM), S.PRECOMPUTED_GEMM),
        (FWD, F32, (2, 16, 7, 9), 16, (3, 3), dict(algo=ConvolutionFwdAlgo.GEMM), S.EXPLICIT_GEMM),
        (FWD, F32, (2, 8, 7, 9), 8, (3, 3), dict(groups=4, algo=ConvolutionFwdAlgo.DIRECT), S.DIRECT),
        (FWD, F32, (2, 16, 7, 9), 16, (3, 3), dict(groups=16, channels_last=True), S.DIRECT),  # depthwise
        (DATA, F32, (2, 16, 7, 9), 16, (3, 3), dict(algo=ConvolutionBwdDataAlgo.ALGO_1), S.EXPLICIT_GEMM),
        (FILTER, F32, (2, 8, 9, 9), 8, (3, 3), dict(groups=8, channels_last=True), S.DIRECT),
        (FILTER, F32, (2, 16, 7, 9), 16, (3, 3), dict(algo=ConvolutionBwdFilterAlgo.ALGO_3), S.PRECOMPUTED_GEMM),
        (FWD, BF16, (2, 32, 5, 6), 48, (1, 1), dict(channels_last=True), S.MATRIX_PRODUCT),
        (FILTER, BF16, (3, 40, 5, 6), 24, (1, 1), dict(margin=16), S.IMAGE_PRODUCTS),
    ],
)
def test_choose_names_the_path_and_the_run_takes_it(direction, dtype, x_dims, k, filt, options, strategy):
    problem = check(direction, dtype, x_dims, k, filt, **options)  # runs the chosen path against torch
    assert kernels.choose(problem, tma_aligned=True) is strategy
    assert kernels.choose(problem, tma_aligned=False) is strategy  # none of them reads by TMA


def test_choose_takes_tma_only_for_aligned_tensors():
    problem = check(FWD, BF16, (2, 64, 10, 12), 64, (3, 3), pre=(1, 1), channels_last=True, margin=16)
    assert kernels.choose(problem, tma_aligned=True) is S.TMA
    assert kernels.choose(problem, tma_aligned=False) is S.IMPLICIT_GEMM  # the interpreter's run took this one
