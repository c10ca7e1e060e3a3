"""Depthwise forward and backward data from ``DEPTHWISE_MIN_TAPS`` taps (5 x 5, 7 x 7, 3 x 3 x 3, long
1-D filters), or any filter read packed from the workspace: one reduced channel per group, any channel
multiplier.

Forward: y[n, k, o] = sum over taps of x[n, k // KG, o * stride - pad + tap * dilation] * w[k, 0, tap].
Backward data is the same sum over dy with the filter turned around: dx[n, c, i] = sum over the KG
channels k of group c and the taps with (i + pad - tap * dilation) divisible by the stride of
dy[n, k, (i + pad - tap * dilation) / stride] * w[k, 0, tap].

A program owns BLOCK_P consecutive output pixels (runs of whole rows, flattened over n, d, h, w) and
BLOCK_C output channels (contiguous in NHWC: 16-byte channel-vector loads). Per tap it loads the
tile's input [pixels, channels] moved by the tap's shift and adds its products with the tap's
filter column (BLOCK_C values, the same for every pixel): the tile's input halo, (rows + R - 1) x
(W + S - 1) pixels at stride 1, comes from global memory about once and stays in L1 while the taps
walk it. Every pixel's image address and coordinates are computed once per program; a tap costs a
coordinate, a mask and the loads. Few channels a program (16) and many pixels keep the filter's
loads (a strided column of the filter per tap: one sector per channel) a small share of the tile's;
read from the workspace packed tap-major (``triton_tiles.packs_depthwise_filter``), a tap's filter
column is one vector load a thread. Float32 accumulation (float64 for float64), then the epilogue
every convolution kernel shares (alpha, z, bias, activation, beta * out).

Traffic: x (or dy) read once plus the halo's share, the output written once; 2 * taps * KG FLOPs per
output element of the backward (2 * taps forward). The filter's sizes are run-time values, but for
UNROLLED_WIDTH: the filter's width as a constant, its taps unrolled (one compiled kernel per width).

``conv_depthwise_rows_kernel`` takes the channels-last problems with filters up to 7 taps wide (the
forward and backward data at any stride and dilation): a program owns BLOCK_P
runs of RUN consecutive output pixels of a row x BLOCK_C channels and, per filter row, loads the run's
window of input columns once, (RUN - 1) * stride + (WIDTH - 1) * dilation + 1 of them, each converted
once and added times its tap into the sum of every output of the run that reads it: 1.4 loads an
output pixel a filter row for a run of 14 and a 7-wide filter, where the kernel above loads 7. The
width, stride and dilation along it are constants (one compiled kernel per width, stride and run), so
each (output, tap) pair is resolved when the kernel compiles. docs/design/convolution.md, "Depthwise".
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.convolution.triton_depthwise_filter import replaced
from opendnn.families.convolution.triton_gemm import direct_coordinate, epilogue


@triton.jit
def conv_depthwise_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    a_sn,
    a_sc,
    a_sd,
    a_sh,
    a_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    o_sn,
    o_sc,
    o_sd,
    o_sh,
    o_sw,
    z_sn,
    z_sc,
    z_sd,
    z_sh,
    z_sw,
    bias_sc,
    PIXELS,
    OD,
    OH,
    OW,
    AD,
    AH,
    AW,
    RED,
    OUTC,
    CHANNELS,
    T,
    R,
    S,
    pad_d,
    pad_h,
    pad_w,
    sd,
    sh,
    sw,
    dil_d,
    dil_h,
    dil_w,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    UNROLLED_WIDTH: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (pixel block, channel block): out[n, oc, o_d, o_h, o_w] for BLOCK_P consecutive output
    pixels (n, o_d, o_h, o_w flattened: runs of whole rows) and BLOCK_C of the CHANNELS output
    channels. Output channel oc of group oc // OUTC reads A's channels g * RED + m (m < RED) with
    filter row k = oc (forward: RED is 1, OUTC the multiplier) or k = g * RED + m (backward data: RED
    is the multiplier, OUTC 1). The arguments are conv_direct_kernel's; the filter's reduced channel is
    always 0 (w_sc unused)."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    pixel_valid = p < PIXELS
    o_w = p % OW
    o_h = p // OW % OH
    o_d = p // (OW * OH) % OD
    n = (p // (OW * OH * OD)).to(tl.int64)
    oc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_valid = oc < CHANNELS
    group = oc // OUTC
    a_pixels = (a_ptr + n * a_sn)[:, None]  # each pixel's image: 64-bit once, 32-bit offsets per tap
    columns = (o_w, dil_w, pad_w, sw, AW, a_sw, S, w_ss)
    channel_args = (oc, channel_valid, group, RED, a_sc, w_sk)
    acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
    for t in range(T):
        i_d, ok_d = direct_coordinate(o_d, t * dil_d, pad_d, sd, AD, BACKWARD)
        for r in range(R):
            i_h, ok_h = direct_coordinate(o_h, r * dil_h, pad_h, sh, AH, BACKWARD)
            if FLIP:
                w_row_taps = (T - 1 - t) * w_st + (R - 1 - r) * w_sr
            else:
                w_row_taps = t * w_st + r * w_sr
            row = (a_pixels, i_d * a_sd + i_h * a_sh, pixel_valid & ok_d & ok_h, w_ptr, w_row_taps)
            if UNROLLED_WIDTH is None:
                for s in range(S):
                    acc = depthwise_tap(acc, s, *row, *columns, *channel_args, BACKWARD, FLIP, COMPUTE)
            else:
                for s in tl.static_range(UNROLLED_WIDTH):
                    acc = depthwise_tap(acc, s, *row, *columns, *channel_args, BACKWARD, FLIP, COMPUTE)
    channels = oc[None, :]
    mask = pixel_valid[:, None] & channel_valid[None, :]
    out_offsets = n[:, None] * o_sn + channels * o_sc + (o_d * o_sd + o_h * o_sh + o_w * o_sw)[:, None]
    z_offsets = n[:, None] * z_sn + channels * z_sc + (o_d * z_sd + o_h * z_sh + o_w * z_sw)[:, None]
    epilogue(
        acc,
        out_ptr,
        out_offsets,
        mask,
        bias_ptr,
        channels * bias_sc,
        z_ptr,
        z_offsets,
        alpha,
        beta,
        alpha2,
        coef,
        HAS_BETA,
        HAS_BIAS,
        HAS_Z,
        ACTIVATION,
        PROPAGATE_NAN,
        COMPUTE,
    )


@triton.jit
def depthwise_tap(
    acc,
    s,
    a_pixels,
    row_offsets,
    row_valid,
    w_ptr,
    w_row_taps,
    o_w,
    dil_w,
    pad_w,
    sw,
    AW,
    a_sw,
    S,
    w_ss,
    oc,
    channel_valid,
    group,
    RED,
    a_sc,
    w_sk,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """acc plus the products of filter column ``s`` of one filter row (``row_offsets``: each pixel's
    offset to that row of A from its image ``a_pixels``; ``w_row_taps``: the offset of the row's first
    tap in the filter): the tile's input moved by the tap's shift times the tap's filter column, for
    each of the RED reduced channels."""
    i_w, ok_w = direct_coordinate(o_w, s * dil_w, pad_w, sw, AW, BACKWARD)
    a_rows = a_pixels + (row_offsets + i_w * a_sw)[:, None]
    mask = (row_valid & ok_w)[:, None] & channel_valid[None, :]
    w_tap = w_row_taps + ((S - 1 - s) if FLIP else s) * w_ss
    for m in range(RED):
        a_channel = group * RED + m
        a = tl.load(a_rows + (a_channel * a_sc)[None, :], mask=mask, other=0.0)
        w_row = a_channel if BACKWARD else oc
        w = tl.load(w_ptr + w_row * w_sk + w_tap, mask=channel_valid, other=0.0)
        acc += a.to(COMPUTE) * w.to(COMPUTE)[None, :]
    return acc


@triton.jit
def conv_depthwise_rows_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    a_sn,
    a_sc,
    a_sd,
    a_sh,
    a_sw,
    w_sk,
    w_st,
    w_sr,
    w_ss,
    o_sn,
    o_sc,
    o_sd,
    o_sh,
    o_sw,
    z_sn,
    z_sc,
    z_sd,
    z_sh,
    z_sw,
    bias_sc,
    RUNS,
    RUNS_PER_ROW,
    OD,
    OH,
    OW,
    AD,
    AH,
    AW,
    RED,
    OUTC,
    CHANNELS,
    T,
    R,
    pad_d,
    pad_h,
    pad_w,
    sd,
    sh,
    dil_d,
    dil_h,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    WIDTH: tl.constexpr,
    STRIDE_W: tl.constexpr,
    DILATION_W: tl.constexpr,
    PHASE: tl.constexpr,
    RUN: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (run block, channel block): out[n, oc, o_d, o_h, o_w0 : o_w0 + RUN] for BLOCK_P runs of
    RUN output pixels along a row (n, o_d, o_h and the run flattened, RUNS_PER_ROW runs a row) and
    BLOCK_C of the CHANNELS output channels. Channels and groups as conv_depthwise_kernel's. Backward
    data walks dy with the filter's row turned around: output i of a run reads dy column j through tap q
    where ``j * STRIDE_W = i + PHASE + q * DILATION_W`` (a run starts at a multiple of the stride; PHASE is
    ``(pad - (WIDTH - 1) * dilation) mod stride``), so a strided layer's outputs take only their own taps."""
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    run_valid = p < RUNS
    o_w0 = p % RUNS_PER_ROW * RUN
    o_h = p // RUNS_PER_ROW % OH
    o_d = p // (RUNS_PER_ROW * OH) % OD
    n = (p // (RUNS_PER_ROW * OH * OD)).to(tl.int64)
    oc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    channel_valid = oc < CHANNELS
    group = oc // OUTC
    if BACKWARD:  # dy column of output o_w and tap s: (o_w + pad - s * dilation) / stride, where it divides
        first_column = (o_w0 + pad_w - (WIDTH - 1) * DILATION_W - PHASE) // STRIDE_W  # exact: o_w0 % stride == 0
    else:  # o_w * stride - pad + s * dilation
        first_column = o_w0 * STRIDE_W - pad_w
    a_pixels = a_ptr + n * a_sn  # each run's image: 64-bit once, 32-bit offsets per filter row
    zero = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
    sums = (zero,) * RUN
    for t in range(T):
        i_d, ok_d = direct_coordinate(o_d, t * dil_d, pad_d, sd, AD, BACKWARD)
        for r in range(R):
            i_h, ok_h = direct_coordinate(o_h, r * dil_h, pad_h, sh, AH, BACKWARD)
            if FLIP:
                w_row_taps = (T - 1 - t) * w_st + (R - 1 - r) * w_sr
            else:
                w_row_taps = t * w_st + r * w_sr
            row_start = a_pixels + i_d * a_sd + i_h * a_sh + first_column * a_sw
            row_valid = run_valid & ok_d & ok_h
            for m in range(RED):
                a_channel = group * RED + m
                a_rows = row_start[:, None] + (a_channel * a_sc)[None, :]
                w_row = w_ptr + (a_channel if BACKWARD else oc) * w_sk + w_row_taps
                taps = window_taps(w_row, w_ss, channel_valid, BACKWARD, FLIP, COMPUTE, WIDTH)
                sums = walk_window(
                    sums,
                    a_rows,
                    first_column,
                    row_valid,
                    AW,
                    a_sw,
                    channel_valid,
                    taps,
                    STRIDE_W if BACKWARD else 1,
                    1 if BACKWARD else STRIDE_W,
                    PHASE,
                    DILATION_W,
                    RUN,
                )
    channels = oc[None, :]
    for i in tl.static_range(RUN):
        o_w = o_w0 + i
        mask = (run_valid & (o_w < OW))[:, None] & channel_valid[None, :]
        out_offsets = n[:, None] * o_sn + channels * o_sc + (o_d * o_sd + o_h * o_sh + o_w * o_sw)[:, None]
        z_offsets = n[:, None] * z_sn + channels * z_sc + (o_d * z_sd + o_h * z_sh + o_w * z_sw)[:, None]
        epilogue(
            sums[i],
            out_ptr,
            out_offsets,
            mask,
            bias_ptr,
            channels * bias_sc,
            z_ptr,
            z_offsets,
            alpha,
            beta,
            alpha2,
            coef,
            HAS_BETA,
            HAS_BIAS,
            HAS_Z,
            ACTIVATION,
            PROPAGATE_NAN,
            COMPUTE,
        )


@triton.jit
def window_taps(
    w_row, w_ss, channel_valid, BACKWARD: tl.constexpr, FLIP: tl.constexpr, COMPUTE: tl.constexpr, WIDTH: tl.constexpr
):
    """A filter row's WIDTH filter columns (each BLOCK_C values, converted once) in the window's order:
    the forward multiplies the window's column q by tap q, the backward by tap WIDTH - 1 - q; FLIP
    turns the row around once more."""
    taps = ()
    for q in tl.static_range(WIDTH):
        s = WIDTH - 1 - q if BACKWARD != FLIP else q
        tap = tl.load(w_row + s * w_ss, mask=channel_valid, other=0.0).to(COMPUTE)[None, :]
        taps = taps + (tap,)  # type: ignore[assignment]
    return taps


@triton.jit
def walk_window(
    sums,
    a_rows,
    first_column,
    row_valid,
    AW,
    a_sw,
    channel_valid,
    taps,
    COLUMN_STEP: tl.constexpr,
    OUTPUT_STEP: tl.constexpr,
    PHASE: tl.constexpr,
    DILATION_W: tl.constexpr,
    RUN: tl.constexpr,
):
    """``sums`` (RUN tiles, one per output pixel of the run) plus one filter row's products: the run's
    window of input columns is loaded once, column j = first_column + j converted to the taps' type once, and
    added times tap q into the sum of every output i that reads it: ``j * COLUMN_STEP = i * OUTPUT_STEP +
    PHASE + q * DILATION_W`` (the forward's stride steps the outputs, a strided backward's the columns).
    Columns no output reads are never used, so never loaded."""
    for j in tl.static_range(((RUN - 1) * OUTPUT_STEP + PHASE + (len(taps) - 1) * DILATION_W) // COLUMN_STEP + 1):
        column = first_column + j
        mask = (row_valid & (column >= 0) & (column < AW))[:, None] & channel_valid[None, :]
        a = tl.load(a_rows + j * a_sw, mask=mask, other=0.0).to(taps[0].dtype)
        for i in tl.static_range(RUN):  # output i reads column j through tap (j * COLUMN_STEP - i * ...) / DILATION_W
            if (
                j * COLUMN_STEP >= i * OUTPUT_STEP + PHASE
                and (j * COLUMN_STEP - i * OUTPUT_STEP - PHASE) % DILATION_W == 0
                and j * COLUMN_STEP - i * OUTPUT_STEP - PHASE < len(taps) * DILATION_W
            ):
                sums = replaced(sums, i, sums[i] + a * taps[(j * COLUMN_STEP - i * OUTPUT_STEP - PHASE) // DILATION_W])
    return sums
