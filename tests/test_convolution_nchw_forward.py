"""NCHW float32 forwards with TF32 through Triton's interpreter. Under IMPLICIT_PRECOMP_GEMM (what a
call that names no algorithm takes for them) the TMA route copies x channels-last and the filter
KRSC into the workspace, both rounded to TF32 to nearest, runs ``conv_tma_kernel`` on the copies and
writes y at the caller's strides; IMPLICIT_GEMM keeps zero workspace and reads the caller's tensors.
The interpreter's products are exact float32 ones, so a result is held to the float64 convolution of
the operands the route read: rounded ones for the staged route, the caller's for IMPLICIT_GEMM. The
tiles of TF32 one-tap GEMMs whose operands wgmma cannot take as they lie are chosen here too."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as TF
from test_convolution_tf32_staging import tf32_nearest

import opendnn as od
import opendnn.functional as F
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
from opendnn.samples import relative_error

FP32 = od.DataType.FLOAT
PRECOMP, IMPLICIT = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, od.ConvolutionFwdAlgo.IMPLICIT_GEMM
S = kernels.Strategy
FLOAT32_SUMS = 1e-5  # exact products of the operands read, float32 sums
STAGED = ["staging_kernel", "staging_kernel", "conv_tma_kernel"]  # x's copy, the filter's, the GEMM
SLICE_SUM = ["slice_sum_kernel"]  # after a forward of few tiles and many steps (``reduction_slices``)


def tf32_handle(**options):
    return od.create("cpu", backend="triton", math_type=od.MathType.TENSOR_OP, **options)


def descriptor(t):
    return od.TensorDescriptor(FP32, tuple(t.shape), t.stride())


def random(shape, seed, scale=1.0):
    return (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1) * scale


def rounded(t):
    """``t`` rounded to TF32 to nearest (the staging copies' values)."""
    return torch.from_numpy(tf32_nearest(t.contiguous().numpy()))


def reference(x, w, stride, padding, flip=False):
    """The float64 convolution (cross-correlation, or true convolution with ``flip``) of x and w."""
    spatial = x.ndim - 2
    weight = w.double().flip(list(range(2, w.ndim))) if flip else w.double()
    conv = {1: TF.conv1d, 2: TF.conv2d}[spatial]
    return conv(x.double(), weight, stride=stride, padding=padding)


def layer(n=2, c=64, size=(6, 7), k=48, filt=3, pad=1, stride=1, margin=0, beta=0.0):
    """(x, w, y, prior, y's buffer, conv_desc): NCHW x, a KCRS filter, and y inside a NaN buffer
    ``margin`` elements wider each side in every dim but N (a sub-region with odd strides), holding
    ``prior`` where beta needs one, else NaN."""
    spatial = len(size)
    x = random((n, c, *size), 1)
    w = random((k, c, *(filt,) * spatial), 2, 1 / math.sqrt(c * filt**spatial))
    out = [(s + 2 * pad - filt) // stride + 1 for s in size]
    buffer = torch.full((n, k + 2 * margin, *(o + 2 * margin for o in out)), math.nan)
    y = buffer[(slice(None), *(slice(margin, margin + d) for d in (k, *out)))]
    prior = random(y.shape, 3)
    if beta:
        y.copy_(prior)
    conv = od.ConvolutionDescriptor((pad,) * spatial, (stride,) * spatial, (1,) * spatial)
    return x, w, y, prior, buffer, conv


def aligned(size):
    return -(-size // 256) * 256


@pytest.mark.parametrize(
    "case, arguments, flip",
    [
        ("3x3 pad 1, two 32-channel chunks", dict(), False),
        ("stride 2: the copy's phase view", dict(c=32, size=(16, 20), k=40, stride=2), False),
        ("true convolution, 5x5 filter", dict(c=32, size=(7, 9), k=16, filt=5, pad=2), True),
        ("1-D", dict(c=32, size=(32,), k=16, filt=5, pad=2), False),
        ("alpha, beta, a sub-region of y with odd strides", dict(margin=1, beta=0.5), False),
    ],
)
def test_the_staged_forward_reads_x_and_the_filter_rounded_and_writes_y_at_its_strides(
    case, arguments, flip, planned_convolutions
):
    handle = tf32_handle()
    beta = arguments.get("beta", 0.0)
    x, w, y, prior, buffer, conv = layer(**arguments)
    if flip:
        conv = od.ConvolutionDescriptor(conv.pad, conv.stride, conv.dilation, od.ConvolutionMode.CONVOLUTION)
    descs = (descriptor(x), descriptor(w), conv, descriptor(y))
    size = od.get_convolution_forward_workspace_size(handle, *descs, PRECOMP)
    table = aligned(math.prod(w.shape[2:]) * 16)  # 16 bytes a tap
    problem = convolution_problem(
        ConvolutionDirection.FORWARD, conv, *descs[:2], descs[3], algo=PRECOMP, allow_tf32=True
    )
    slices = kernels.reduction_slices(problem)[0]  # the 5x5 filter's 25 steps: slices
    partials = aligned(slices * y.numel() * 4) if slices > 1 else 0
    assert size == table + partials + aligned(x.numel() * 4) + aligned(w.numel() * 4)
    workspace = torch.full((size,), 255, dtype=torch.uint8)  # every float32 in it NaN
    od.convolution_forward(handle, 0.75, descs[0], x, descs[1], w, conv, PRECOMP, workspace, beta, descs[3], y)

    assert planned_convolutions == [(PRECOMP, S.TMA, STAGED + (SLICE_SUM if slices > 1 else []))]
    stride, padding = conv.stride, conv.pad
    want = 0.75 * reference(rounded(x), rounded(w), stride, padding, flip) + beta * prior.double()
    assert relative_error(y.double(), want) < FLOAT32_SUMS, relative_error(y.double(), want)
    truncated = 0.75 * reference(x, w, stride, padding, flip) + beta * prior.double()
    assert relative_error(y.double(), truncated) > 3 * FLOAT32_SUMS  # the operands were rounded
    inside = torch.zeros_like(buffer, dtype=torch.bool)
    inside[(slice(None), *(slice(m, m + d) for m, d in zip((arguments.get("margin", 0),) * 3, y.shape[1:])))] = True
    assert buffer[~inside].isnan().all()  # nothing written outside y


def test_the_fused_epilogue_runs_on_the_staged_copies(planned_convolutions):
    handle = tf32_handle()
    x, w, y, _, _, conv = layer(c=32, size=(5, 6), k=40)
    bias, z = random((1, 40, 1, 1), 4), random(y.shape, 5)
    descs = (descriptor(x), descriptor(w), conv, descriptor(y))
    workspace = torch.empty(od.get_convolution_forward_workspace_size(handle, *descs, PRECOMP), dtype=torch.uint8)
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    od.convolution_bias_activation_forward(
        handle, 0.75, descs[0], x, descs[1], w, conv, PRECOMP, workspace, 0.5, descs[3], z, descriptor(bias), bias,
        relu, descs[3], y,
    )  # fmt: skip
    assert planned_convolutions == [(PRECOMP, S.TMA, STAGED)]
    want = (0.75 * reference(rounded(x), rounded(w), 1, 1) + 0.5 * z.double() + bias.double()).clamp(min=0)
    assert relative_error(y.double(), want) < FLOAT32_SUMS


def test_implicit_gemm_keeps_zero_workspace_and_reads_the_callers_tensors(planned_convolutions):
    handle = tf32_handle()
    x, w, y, _, _, conv = layer()
    descs = (descriptor(x), descriptor(w), conv, descriptor(y))
    assert od.get_convolution_forward_workspace_size(handle, *descs, IMPLICIT) == 0
    od.convolution_forward(handle, 1.0, descs[0], x, descs[1], w, conv, IMPLICIT, None, 0.0, descs[3], y)
    assert planned_convolutions == [(IMPLICIT, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]
    assert relative_error(y.double(), reference(x, w, 1, 1)) < FLOAT32_SUMS  # the interpreter does not truncate


def test_a_call_naming_no_algorithm_takes_the_staged_route_where_the_backend_prefers_it(planned_convolutions):
    x, w, _, _, _, _ = layer()
    got = F.conv(x, w, padding=1, handle=tf32_handle())
    assert planned_convolutions == [(PRECOMP, S.TMA, STAGED)]
    assert relative_error(got.double(), reference(rounded(x), rounded(w), 1, 1)) < FLOAT32_SUMS

    planned_convolutions.clear()  # channels-last x and a KRSC filter: TMA reads them where they are, no workspace
    F.conv(x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last), padding=1,
           handle=tf32_handle())  # fmt: skip
    assert planned_convolutions == [(IMPLICIT, S.TMA, ["conv_tma_kernel"])]

    planned_convolutions.clear()  # strict float32: no TF32, nothing staged
    F.conv(x, w, padding=1, handle=od.create("cpu", backend="triton"))
    assert planned_convolutions == [(IMPLICIT, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]

    planned_convolutions.clear()  # a workspace limit below the copies: the default
    F.conv(x, w, padding=1, handle=tf32_handle(workspace_limit=1024))
    assert planned_convolutions == [(IMPLICIT, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]


def test_get_ranks_the_staging_algorithm_first_only_where_it_stages():
    handle = tf32_handle()
    x, w, y, _, _, conv = layer()
    nchw = (descriptor(x), descriptor(w), conv, descriptor(y))
    assert [r.algo for r in od.get_convolution_forward_algorithm(handle, *nchw, requested_count=2)] == [
        PRECOMP,
        IMPLICIT,
    ]
    channels_last = [t.contiguous(memory_format=torch.channels_last) for t in (x, w, y)]
    nhwc = (descriptor(channels_last[0]), descriptor(channels_last[1]), conv, descriptor(channels_last[2]))
    assert od.get_convolution_forward_algorithm(handle, *nhwc)[0].algo is IMPLICIT
    assert od.get_convolution_forward_algorithm(od.create("cpu", backend="triton"), *nchw)[0].algo is IMPLICIT


@pytest.mark.parametrize(
    "case, channels_last, stride, expected",
    [
        ("NCHW: x's copy would be the columns themselves", False, 1, S.PRECOMPUTED_GEMM),
        ("NCHW stride 2: x's copy larger than the columns", False, 2, S.PRECOMPUTED_GEMM),
        ("channels-last: the matrix product", True, 1, S.MATRIX_PRODUCT),
    ],
)
def test_1x1_layers_stage_nothing(case, channels_last, stride, expected):
    handle = tf32_handle()
    x, w, y, _, _, _ = layer(c=32, size=(6, 6), k=32, filt=1, pad=0, stride=stride)
    if channels_last:
        x, w, y = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, y))
    conv = od.ConvolutionDescriptor((0, 0), (stride,) * 2, (1, 1))
    descs = (descriptor(x), descriptor(w), conv, descriptor(y))
    problem = convolution_problem(
        ConvolutionDirection.FORWARD, conv, *descs[:2], descs[3], algo=PRECOMP, allow_tf32=True
    )
    assert kernels.choose(problem, tma_aligned=True) is expected
    assert not kernels.preferred(problem)
    assert od.get_convolution_forward_workspace_size(handle, *descs, PRECOMP) == 256  # the tap table alone
    assert od.get_convolution_forward_algorithm(handle, *descs)[0].algo is IMPLICIT


# ResNet-50's 3x3 layers at batch 64: (C = K, H = W, stride) -> IMPLICIT_PRECOMP_GEMM's workspace: the
# tap table, x's copy and the filter's; an explicit GEMM's columns for comparison
RESNET50_3X3 = {
    "l1": ((64, 56, 1), 51_527_936, 462_422_016),
    "l2 stride 2": ((128, 56, 2), 103_350_528, 231_211_008),
    "l3": ((256, 14, 1), 15_204_608, 115_605_504),
    "l4": ((512, 7, 1), 15_859_968, 57_802_752),
}


@pytest.mark.parametrize("name", RESNET50_3X3)
def test_the_workspace_query_reports_one_activation_and_the_filter(name):
    (channels, size, stride), staged, columns = RESNET50_3X3[name]
    out = (size + 2 - 3) // stride + 1
    x = od.TensorDescriptor(FP32, (64, channels, size, size))
    w = od.TensorDescriptor(FP32, (channels, channels, 3, 3))
    y = od.TensorDescriptor(FP32, (64, channels, out, out))
    conv = od.ConvolutionDescriptor((1, 1), (stride, stride), (1, 1))
    handle = tf32_handle()
    assert od.get_convolution_forward_workspace_size(handle, x, w, conv, y, PRECOMP) == staged
    assert od.get_convolution_forward_workspace_size(handle, x, w, conv, y, od.ConvolutionFwdAlgo.GEMM) == columns
    assert od.get_convolution_forward_workspace_size(handle, x, w, conv, y, IMPLICIT) == 0


FWD, DATA = ConvolutionDirection.FORWARD, ConvolutionDirection.BACKWARD_DATA


@pytest.mark.parametrize(
    "case, direction, channels_last, c, k, filt, tile",
    [
        ("NCHW, 256 output channels: fewer, wider rows of them", FWD, False, 64, 256, 1, (128, 256, 8)),
        ("NCHW, 160 output channels", FWD, False, 64, 160, 1, (128, 256, 8)),
        ("NCHW, 64 output channels: mma.sync's tile", FWD, False, 64, 64, 1, (64, 64, 2)),
        ("NCHW 3x3: taps keep the table's tile", FWD, False, 64, 256, 3, (256, 128, 8)),
        ("channels-last: the table's tile", FWD, True, 64, 256, 1, (256, 128, 8)),
        ("NCHW backward data into 64 channels", DATA, False, 64, 256, 1, (64, 64, 2)),
        ("NCHW backward data into 1024 channels", DATA, False, 1024, 256, 1, (64, 128, 2)),
        ("channels-last backward data: the table's tile", DATA, True, 64, 256, 1, (128, 64, 4)),
    ],
)
def test_a_tf32_one_tap_gemm_reading_nchw_pixels_takes_its_tile(case, direction, channels_last, c, k, filt, tile):
    """A (x forward, dy backward) read along its pixels is no operand wgmma takes as it lies: forwards
    of more than 64 output channels take 128 rows and up to 256 columns on 8 warps, the others 64
    rows and up to 128 columns on 2 warps (mma.sync from registers)."""
    x, w, y, _, _, _ = layer(n=1, c=c, size=(56, 56), k=k, filt=filt, pad=filt // 2, stride=1)
    if channels_last:
        x, w, y = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, y))
    conv = od.ConvolutionDescriptor((filt // 2,) * 2, (1, 1), (1, 1))
    descs = (descriptor(x), descriptor(w), descriptor(y))
    algo = IMPLICIT if direction is FWD else od.ConvolutionBwdDataAlgo.ALGO_0
    problem = convolution_problem(direction, conv, *descs, algo=algo, allow_tf32=True)
    columns, reduced = (k, c) if direction is FWD else (c, k)
    chosen = kernels.gemm_tile(problem, 64 * 56 * 56, columns, reduced, reduced * filt * filt, 1)
    assert (chosen.block_m, chosen.block_n, chosen.num_warps) == tile


def test_a_tf32_one_tap_backward_data_over_nchw_dy_on_two_warps_matches_float64(planned_convolutions):
    """A 1x1 backward data over NCHW dy under ALGO_0: 64-row tiles on 2 warps, the caller's tensors
    read where they lie (the interpreter's products exact)."""
    _, w, y, _, _, _ = layer(c=24, size=(9, 7), k=40, filt=1, pad=0, stride=1)
    dy = random(y.shape, 4)
    got = F.conv_backward_data(dy, w, (2, 24, 9, 7), algo=od.ConvolutionBwdDataAlgo.ALGO_0, handle=tf32_handle())
    assert planned_convolutions == [(od.ConvolutionBwdDataAlgo.ALGO_0, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]
    want = torch.nn.grad.conv2d_input((2, 24, 9, 7), w.double(), dy.double())
    assert relative_error(got.double(), want) < FLOAT32_SUMS


def test_a_tf32_one_tap_backward_filter_over_channels_last_tensors_runs_two_warp_tiles(planned_convolutions):
    """A 1x1 backward filter over channels-last x and dy reduces over pixels, strided in both: the
    GEMM on 2-warp tiles (mma.sync), not the TMA route; its slices summed in order, against float64."""
    x = random((2, 32, 9, 7), 5).contiguous(memory_format=torch.channels_last)
    dy = random((2, 48, 9, 7), 6).contiguous(memory_format=torch.channels_last)
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    got = F.conv_backward_filter(x, dy, (48, 32, 1, 1), algo=algo, handle=tf32_handle())
    (taken, strategy, names), *rest = planned_convolutions
    assert (taken, strategy, names[0], rest) == (algo, S.IMPLICIT_GEMM, "filter_gemm_kernel", [])
    conv = od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
    descs = (descriptor(x), descriptor(dy.new_empty(48, 32, 1, 1)), descriptor(dy))
    problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv, *descs, algo=algo, allow_tf32=True)
    assert kernels.filter_plan(problem).tile.num_warps == 2
    want = torch.nn.grad.conv2d_weight(x.double(), (48, 32, 1, 1), dy.double())
    assert relative_error(got.double(), want) < FLOAT32_SUMS


def test_two_warp_filter_tiles_take_twice_the_slices_and_small_filters_sum_in_narrow_blocks():
    """ResNet-50's NHWC TF32 1x1 backward filters (planned, not run): 2-warp programs aim for four an
    SM (as many warps as two of 4), and the pass adding the slices takes narrower blocks for fewer
    filter elements, so that every SM sums (132 SMs stand for the device off the GPU)."""
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    conv = od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
    rows = []
    for c, size, k in ((1024, 14, 256), (64, 56, 64)):
        x = torch.empty(64, c, size, size).contiguous(memory_format=torch.channels_last)
        dy = torch.empty(64, k, size, size).contiguous(memory_format=torch.channels_last)
        descs = (descriptor(x), descriptor(dy.new_empty(k, c, 1, 1)), descriptor(dy))
        problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv, *descs, algo=algo, allow_tf32=True)
        plan = kernels.filter_plan(problem)
        total = kernels._sum_launch(problem, plan.splits)
        tiles = math.ceil(k / plan.tile.block_m) * math.ceil(c / plan.tile.block_n)
        rows.append((plan.tile.num_warps, tiles, plan.splits, total.grid[0], total.options["SPLIT_BLOCK"]))
    # 32 tiles x 17 slices >= 4 x 132 programs; 256 x 1024 elements in 2,048 blocks of 128
    # one tile x 523 slices (at least 8 steps of 32 pixels each); 64 x 64 elements in 128 blocks of 32
    assert rows == [(2, 32, 17, 2048, 16), (2, 1, 523, 128, 64)]


def test_a_tf32_one_tap_forward_over_nchw_x_in_wide_tiles_matches_float64(planned_convolutions):
    """256 output channels over NCHW x under IMPLICIT_GEMM: one 128 x 256 tile of rows, the caller's
    tensors read where they lie (the interpreter's products exact)."""
    x, w, _, _, _, _ = layer(c=32, size=(9, 7), k=256, filt=1, pad=0, stride=1)
    got = F.conv(x, w, algo=IMPLICIT, handle=tf32_handle())
    assert planned_convolutions == [(IMPLICIT, S.IMPLICIT_GEMM, ["conv_gemm_kernel"])]
    assert relative_error(got.double(), TF.conv2d(x.double(), w.double())) < FLOAT32_SUMS
