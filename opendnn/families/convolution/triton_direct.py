"""Convolution kernels without a matrix product: the direct kernel (depthwise and small channel
counts, forward and backward data) and the backward-filter kernels (implicit GEMM over the
N*P*Q pixels, a direct one for depthwise, and the pass that sums split partials in order).

Direct: a program owns BLOCK_M output pixels x BLOCK_N output channels over *all* groups, so in
NHWC each tap's load of A is one contiguous row of channels per pixel (a vector load), and the
taps x reduced channels of each group (few: that is when it is chosen) are walked as scalar
FMAs. Each input element is read taps times, mostly from L1/L2; 2 * N*P*Q * K * C/G * taps FLOPs.

Backward filter: dw[k, (tap, c)] = sum over pixels of dy[pixel, k] * x[gather(pixel, tap), c]: a
GEMM of (K/G) x (taps * C/G) per group whose reduction runs over the N*P*Q pixels. When the
tiles are too few to fill the GPU, the pixels are cut into ``splits`` equal slices whose partial
sums (float32, float64 for float64) go to the workspace; ``filter_sum_kernel`` adds the slices in
a fixed order. No atomics anywhere: the result is bitwise repeatable.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.convolution.triton_gemm import (
    box_origin,
    direct_coordinate,
    epilogue,
    gather_coordinate,
    phase_view_box,
    pixel_box_descriptor,
    reduction_index,
    row_coordinates,
    tap_shifts,
    tap_view_window,
)


@triton.jit
def direct_step(
    acc,
    j,
    a_ptr,
    w_ptr,
    n,
    o,
    oc,
    g,
    row_valid,
    col_valid,
    a_strides,
    a_sizes,
    w_strides,
    pads,
    strides,
    dilation,
    RED,
    OUTC,
    T,
    R,
    S,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """``acc`` plus the products of reduction step j = (tap, c): reduced channel c of each column's
    group at the tap. Tuples are per dim (d, h, w), with n first for A's and w's (k, c) for the filter's."""
    tap = j // RED
    c = j % RED
    shift_d, shift_h, shift_w, w_tap = tap_shifts(
        tap, w_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, *dilation, w_strides[2], w_strides[3], w_strides[4], FLIP, False
    )
    i_d, ok_d = direct_coordinate(o[0], shift_d, pads[0], strides[0], a_sizes[0], BACKWARD)
    i_h, ok_h = direct_coordinate(o[1], shift_h, pads[1], strides[1], a_sizes[1], BACKWARD)
    i_w, ok_w = direct_coordinate(o[2], shift_w, pads[2], strides[2], a_sizes[2], BACKWARD)
    a_rows = n * a_strides[0] + i_d * a_strides[2] + i_h * a_strides[3] + i_w * a_strides[4]
    mask = row_valid[:, None] & col_valid[None, :] & ok_d & ok_h & ok_w
    a_channel = g * RED + c
    a = tl.load(a_ptr + a_rows + (a_channel * a_strides[1])[None, :], mask=mask, other=0.0)
    if BACKWARD:
        w_offsets = a_channel * w_strides[0] + (oc - g * OUTC) * w_strides[1] + w_tap
    else:
        w_offsets = oc * w_strides[0] + c * w_strides[1] + w_tap
    w = tl.load(w_ptr + w_offsets, mask=col_valid, other=0.0)
    return acc + a.to(COMPUTE) * w.to(COMPUTE)[None, :]


@triton.jit
def conv_direct_kernel(
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
    M,
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
    UNROLLED: tl.constexpr,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """O[m, o] over all CHANNELS output channels o (group o // OUTC): forward W is w[o, c, tap],
    backward data w[g*RED + c, o - g*OUTC, tap]. UNROLLED is (RED, T, R, S) again, as constants, for
    few taps x channels: their loop unrolled, so that all their loads are in flight at once; None for
    more: a runtime loop, one compiled kernel for any filter (DIRECT_UNROLL_STEPS)."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    oc = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n, _, _, _, o_d, o_h, o_w, row_valid = row_coordinates(m, OD, OH, OW, OD, OH, OW, 0, 0, 0, 1, 1, 1, False, M)
    col_valid = oc < CHANNELS
    g = oc // OUTC
    n = n.to(tl.int64)[:, None]
    o_d, o_h, o_w = o_d[:, None], o_h[:, None], o_w[:, None]
    if UNROLLED is not None:  # the filter's sizes as constants
        red: tl.constexpr = UNROLLED[0]
        filt_d: tl.constexpr = UNROLLED[1]
        filt_h: tl.constexpr = UNROLLED[2]
        filt_w: tl.constexpr = UNROLLED[3]
    else:
        red, filt_d, filt_h, filt_w = RED, T, R, S
    o = (o_d, o_h, o_w)
    a_strides, a_sizes = (a_sn, a_sc, a_sd, a_sh, a_sw), (AD, AH, AW)
    w_strides = (w_sk, w_sc, w_st, w_sr, w_ss)
    pads, strides, dilation = (pad_d, pad_h, pad_w), (sd, sh, sw), (dil_d, dil_h, dil_w)
    tile = (a_ptr, w_ptr, n, o, oc, g, row_valid, col_valid)
    geometry = (a_strides, a_sizes, w_strides, pads, strides, dilation, red, OUTC, filt_d, filt_h, filt_w)
    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    if UNROLLED is None:
        for j in range(filt_d * filt_h * filt_w * red):
            acc = direct_step(acc, j, *tile, *geometry, BACKWARD, FLIP, COMPUTE)
    else:
        for j in tl.static_range(filt_d * filt_h * filt_w * red):
            acc = direct_step(acc, j, *tile, *geometry, BACKWARD, FLIP, COMPUTE)
    channels = oc[None, :]
    mask = row_valid[:, None] & col_valid[None, :]
    out_offsets = n * o_sn + channels * o_sc + o_d * o_sd + o_h * o_sh + o_w * o_sw
    z_offsets = n * z_sn + channels * z_sc + o_d * z_sd + o_h * z_sh + o_w * z_sw
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
def store_filter(
    value,
    k,
    j,
    split,
    dw_ptr,
    partial_ptr,
    K,
    CG,
    TAPS,
    T,
    R,
    S,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    mask,
    alpha,
    beta,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """dw[k, c, tap] = alpha * value + beta * dw for j = (tap, c); or the slice's partial sums."""
    if PARTIAL:
        tl.store(partial_ptr + ((split * K + k).to(tl.int64) * (TAPS * CG) + j), value, mask=mask)
    else:
        tap = j // CG
        _, _, _, w_tap = tap_shifts(
            tap, dw_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, 0, 0, 0, w_st, w_sr, w_ss, FLIP, False
        )
        offsets = k * w_sk + (j - tap * CG) * w_sc + w_tap
        epilogue(
            value,
            dw_ptr,
            offsets,
            mask,
            dw_ptr,
            offsets,
            dw_ptr,
            offsets,
            alpha,
            beta,
            0.0,
            0.0,
            HAS_BETA,
            False,
            False,
            "",
            False,
            COMPUTE,
        )


@triton.jit
def store_tap_filter(
    value,
    k,
    c,
    tap,
    split,
    dw_ptr,
    partial_ptr,
    K,
    C,
    T,
    R,
    S,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    alpha,
    beta,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """``store_filter`` of an ungrouped problem's tile at one tap: output channels ``k`` (a column)
    by input channels ``c`` (a row), those past K and C left out."""
    store_filter(
        value,
        k,
        tap * C + c,
        split,
        dw_ptr,
        partial_ptr,
        K,
        C,
        T * R * S,
        T,
        R,
        S,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        (k < K) & (c < C),
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


@triton.jit
def pixel_coordinates(p, OD, OH, OW):
    o_w = p % OW
    o_h = (p // OW) % OH
    o_d = (p // (OW * OH)) % OD
    return (p // (OW * OH * OD)).to(tl.int64), o_d, o_h, o_w


@triton.jit
def filter_gemm_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    table_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    dy_sn,
    dy_sc,
    dy_sd,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    PIXELS,
    OD,
    OH,
    OW,
    XD,
    XH,
    XW,
    K,
    KG,
    CG,
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
    slice_pixels,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    SOURCE: tl.constexpr,
    PIXEL_CHANNELS: tl.constexpr,
    EVEN_CG: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (tile, g, split): dw rows k (BLOCK_M of K/G) x columns j = (tap, c) (BLOCK_N of
    taps * C/G), summed over pixels [split * slice_pixels, (split + 1) * slice_pixels). SOURCE as
    conv_gemm_kernel's: "im2col" reads x already gathered (G x PIXELS x (taps * C/G) at x_ptr).
    PIXEL_CHANNELS (0: none) as conv_gemm_kernel's: x is a channels-last copy of one group with that
    many channels a pixel, the columns walk them all (a tap's channels one vector) and the padding
    channels' sums are not stored."""
    g = tl.program_id(1)
    split = tl.program_id(2)
    taps = T * R * S
    columns = CG  # columns a tap
    pixel_stride = x_sw
    group_offset = g * CG * x_sc
    if PIXEL_CHANNELS > 0:  # constants: a tap's lanes are one aligned vector
        columns = PIXEL_CHANNELS
        pixel_stride = PIXEL_CHANNELS
        group_offset = 0
    tiles_n = tl.cdiv(taps * columns, BLOCK_N)
    k = tl.program_id(0) // tiles_n * BLOCK_M + tl.arange(0, BLOCK_M)
    j0 = tl.program_id(0) % tiles_n * BLOCK_N
    tap, c, j_valid = reduction_index(j0, columns, taps * columns, BLOCK_N, EVEN_CG, 1)
    shift_d, shift_h, shift_w, _ = tap_shifts(
        tap,
        table_ptr,
        0,
        0,
        0,
        1,
        1,
        1,
        R,
        S,
        T,
        R,
        S,
        dil_d,
        dil_h,
        dil_w,
        0,
        0,
        0,
        False,
        SOURCE == "precomp",
    )
    k_valid = k < KG
    dy_cols = (g * KG + k)[:, None] * dy_sc
    x_cols = group_offset + c * x_sc
    lanes = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    begin = split * slice_pixels
    end = tl.minimum(begin + slice_pixels, PIXELS)
    for p0 in range(begin, end, BLOCK_K):
        p = p0 + lanes
        p_valid = p < end
        n, o_d, o_h, o_w = pixel_coordinates(p, OD, OH, OW)
        dy_rows = n * dy_sn + o_d * dy_sd + o_h * dy_sh + o_w * dy_sw
        a = tl.load(dy_ptr + dy_cols + dy_rows[None, :], mask=k_valid[:, None] & p_valid[None, :], other=0.0)
        if SOURCE == "im2col":
            col_offsets = (g * PIXELS + p).to(tl.int64)[:, None] * (taps * CG) + j0 + tl.arange(0, BLOCK_N)[None, :]
            b = tl.load(x_ptr + col_offsets, mask=p_valid[:, None] & j_valid, other=0.0)
        else:
            i_d, ok_d = gather_coordinate(o_d[:, None], 0, shift_d, pad_d, sd, XD, False)
            i_h, ok_h = gather_coordinate(o_h[:, None], 0, shift_h, pad_h, sh, XH, False)
            i_w, ok_w = gather_coordinate(o_w[:, None], 0, shift_w, pad_w, sw, XW, False)
            b_mask = p_valid[:, None] & j_valid & ok_d & ok_h & ok_w
            b_offsets = n[:, None] * x_sn + i_d * x_sd + i_h * x_sh + i_w * pixel_stride + x_cols
            b = tl.load(x_ptr + b_offsets, mask=b_mask, other=0.0)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)
    j = j0 + tl.arange(0, BLOCK_N)[None, :]
    stored = k_valid[:, None] & (j < taps * columns)
    if PIXEL_CHANNELS > 0:  # the copy's columns to dw's: its padding channels dropped
        stored &= j % PIXEL_CHANNELS < CG
        j = j // PIXEL_CHANNELS * CG + j % PIXEL_CHANNELS
    store_filter(
        acc,
        (g * KG + k)[:, None],
        j,
        split,
        dw_ptr,
        partial_ptr,
        K,
        CG,
        taps,
        T,
        R,
        S,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        stored,
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


@triton.jit
def filter_tma_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    N,
    XH,
    XW,
    C,
    OH,
    OW,
    K,
    R,
    S,
    x_sn,
    x_sh,
    x_sw,
    dy_sn,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_sr,
    w_ss,
    pad_h,
    pad_w,
    dil_h,
    dil_w,
    stride_h,
    stride_w,
    slice_boxes,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    IMAGES: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Ungrouped 2-D backward filter over channels-last x and dy, read by TMA (stride 1, or a stride
    dividing x's height and width with its channels packed per pixel). Program (k tile x tap x c
    tile, split): dw[k, c, tap] = sum over output pixels p of dy[p, k] * x[stride * p + shift(tap), c],
    for the IMAGES x BLOCK_H x BLOCK_W boxes of output pixels of the split; x's box is one of its phase
    view (``phase_view_box``; stride 1: dy's box moved by the tap's shift) through a descriptor of the
    tap's window of it (``tap_view_window``): box positions past dy, and x positions in the padding or
    meeting dy's positions past dy, are TMA's zero fill."""
    BLOCK_P: tl.constexpr = IMAGES * BLOCK_H * BLOCK_W
    tiles_c = tl.cdiv(C, BLOCK_N)
    pid = tl.program_id(0)
    c0 = pid % tiles_c * BLOCK_N
    tap = pid // tiles_c % (R * S)
    k0 = pid // (tiles_c * R * S) * BLOCK_M
    shift_h = tap // S * dil_h - pad_h
    shift_w = tap % S * dil_w - pad_w
    dy_desc = pixel_box_descriptor(dy_ptr, N, OH, OW, K, dy_sn, dy_sh, dy_sw, IMAGES, BLOCK_H, BLOCK_W, BLOCK_M)
    offset, rows, columns, origin_h, origin_w = tap_view_window(
        shift_h, shift_w, stride_h, stride_w, XH, XW, OH, OW, x_sh, x_sw
    )
    x_desc = tl.make_tensor_descriptor(
        x_ptr + offset,
        [N, rows, stride_h, columns, stride_w * C],
        [x_sn, stride_h * x_sh, x_sh, stride_w * x_sw, 1],
        [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_N],
    )
    split = tl.program_id(1)
    begin = split * slice_boxes
    end = tl.minimum(begin + slice_boxes, tl.cdiv(N, IMAGES) * tl.cdiv(OH, BLOCK_H) * tl.cdiv(OW, BLOCK_W))

    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    for box in range(begin, end):
        n0, h0, w0 = box_origin(box, N, OH, OW, IMAGES, BLOCK_H, BLOCK_W)
        a = dy_desc.load([n0, h0, w0, k0]).reshape(BLOCK_P, BLOCK_M)
        b = x_desc.load(phase_view_box(n0, h0 - origin_h, w0 - origin_w, c0, shift_h, shift_w, stride_h, stride_w, C))
        b = b.reshape(BLOCK_P, BLOCK_N)
        acc = tl.dot(a.T.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)

    k = k0 + tl.arange(0, BLOCK_M)[:, None]
    c = c0 + tl.arange(0, BLOCK_N)[None, :]
    store_tap_filter(
        acc,
        k,
        c,
        tap,
        split,
        dw_ptr,
        partial_ptr,
        K,
        C,
        1,
        R,
        S,
        w_sk,
        w_sc,
        0,
        w_sr,
        w_ss,
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


@triton.jit
def filter_direct_step(
    acc,
    j,
    a,
    column,
    x_ptr,
    n,
    o,
    x_group,
    mask,
    x_strides,
    x_sizes,
    pads,
    strides,
    dilation,
    CG,
    T,
    R,
    S,
    COMPUTE: tl.constexpr,
):
    """``acc`` plus column j = (tap, c) of a tile's products: its dy (``a``, pixels x channels k) times
    x at the tap, channel c of each k's group, summed over the tile's pixels. Tuples as ``direct_step``'s."""
    tap = j // CG
    c = j % CG
    shift_d, shift_h, shift_w, _ = tap_shifts(
        tap, x_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, *dilation, 0, 0, 0, False, False
    )
    i_d, ok_d = gather_coordinate(o[0], 0, shift_d, pads[0], strides[0], x_sizes[0], False)
    i_h, ok_h = gather_coordinate(o[1], 0, shift_h, pads[1], strides[1], x_sizes[1], False)
    i_w, ok_w = gather_coordinate(o[2], 0, shift_w, pads[2], strides[2], x_sizes[2], False)
    x_rows = n * x_strides[0] + i_d * x_strides[2] + i_h * x_strides[3] + i_w * x_strides[4]
    inside = mask & (ok_d & ok_h & ok_w)[:, None]
    b = tl.load(x_ptr + x_rows[:, None] + ((x_group + c) * x_strides[1])[None, :], mask=inside, other=0.0)
    total = tl.sum(a * b.to(COMPUTE), axis=0)
    return tl.where(column == j, acc + total[None, :], acc)


@triton.jit
def filter_direct_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    dy_sn,
    dy_sc,
    dy_sd,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    PIXELS,
    OD,
    OH,
    OW,
    XD,
    XH,
    XW,
    K,
    KG,
    CG,
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
    slice_pixels,
    alpha: tl.float64,
    beta: tl.float64,
    UNROLLED: tl.constexpr,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    COLUMNS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (channel block, split): dw[k, j] for BLOCK_N output channels k of all groups and
    every column j = (tap, c) (taps * C/G <= COLUMNS). Each BLOCK_M-pixel tile of dy is loaded once
    and multiplied by x at every tap (neighbouring taps hit the same cache lines); the products are
    summed across the tile's pixels in a fixed tree. UNROLLED: (CG, T, R, S) again, as constants,
    where the columns' loop is unrolled; None: a runtime loop (as conv_direct_kernel's)."""
    split = tl.program_id(1)
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if UNROLLED is not None:  # the filter's sizes as constants
        cg: tl.constexpr = UNROLLED[0]
        filt_d: tl.constexpr = UNROLLED[1]
        filt_h: tl.constexpr = UNROLLED[2]
        filt_w: tl.constexpr = UNROLLED[3]
    else:
        cg, filt_d, filt_h, filt_w = CG, T, R, S
    x_strides, x_sizes = (x_sn, x_sc, x_sd, x_sh, x_sw), (XD, XH, XW)
    pads, strides, dilation = (pad_d, pad_h, pad_w), (sd, sh, sw), (dil_d, dil_h, dil_w)
    k_valid = k < K
    x_group = (k // KG) * cg
    column = tl.arange(0, COLUMNS)[:, None]
    lanes = tl.arange(0, BLOCK_M)
    acc = tl.zeros((COLUMNS, BLOCK_N), COMPUTE)
    begin = split * slice_pixels
    end = tl.minimum(begin + slice_pixels, PIXELS)
    for p0 in range(begin, end, BLOCK_M):
        p = p0 + lanes
        p_valid = p < end
        n, o_d, o_h, o_w = pixel_coordinates(p, OD, OH, OW)
        o = (o_d, o_h, o_w)
        dy_rows = n * dy_sn + o_d * dy_sd + o_h * dy_sh + o_w * dy_sw
        mask = p_valid[:, None] & k_valid[None, :]
        a = tl.load(dy_ptr + dy_rows[:, None] + (k * dy_sc)[None, :], mask=mask, other=0.0).to(COMPUTE)
        step_inputs = (a, column, x_ptr, n, o, x_group, mask, x_strides, x_sizes, pads, strides, dilation, cg)
        if UNROLLED is None:
            for j in range(filt_d * filt_h * filt_w * cg):
                acc = filter_direct_step(acc, j, *step_inputs, filt_d, filt_h, filt_w, COMPUTE)
        else:
            for j in tl.static_range(filt_d * filt_h * filt_w * cg):
                acc = filter_direct_step(acc, j, *step_inputs, filt_d, filt_h, filt_w, COMPUTE)
    store_filter(
        acc,
        k[None, :],
        column,
        split,
        dw_ptr,
        partial_ptr,
        K,
        cg,
        filt_d * filt_h * filt_w,
        filt_d,
        filt_h,
        filt_w,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        k_valid[None, :] & (column < filt_d * filt_h * filt_w * cg),
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


@triton.jit
def filter_depthwise_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    dy_sn,
    dy_sc,
    dy_sd,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    PIXELS,
    OD,
    OH,
    OW,
    XD,
    XH,
    XW,
    K,
    KG,
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
    slice_pixels,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_TAPS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Backward filter of one reduced channel per group (depthwise, any channel multiplier KG):
    dw[k, tap] = sum over pixels p of dy[p, k] * x[gather(p, tap), k // KG]. Program (channel
    block, tap block, split): BLOCK_N output channels k x BLOCK_TAPS taps, over the pixels of the
    split in tiles of BLOCK_M. Each dy tile is loaded once and multiplied by x at each of the
    block's taps (neighbouring taps read the same lines: L1 hits); every product is added into
    its own lane of a [taps, pixels, channels] accumulator, so the loop has no reduction across
    threads: the pixels are summed once, after the loop. The filter's sizes are run-time values:
    one compiled kernel for every filter."""
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tap = tl.program_id(1) * BLOCK_TAPS + tl.arange(0, BLOCK_TAPS)
    split = tl.program_id(2)
    taps = T * R * S
    shift_d, shift_h, shift_w, _ = tap_shifts(
        tap, x_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, dil_d, dil_h, dil_w, 0, 0, 0, False, False
    )
    shift_d, shift_h, shift_w = shift_d[:, None], shift_h[:, None], shift_w[:, None]
    tap_valid = (tap < taps)[:, None]
    k_valid = k < K
    x_channels = ((k // KG) * x_sc)[None, None, :]
    dy_channels = (k * dy_sc)[None, :]
    lanes = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_TAPS, BLOCK_M, BLOCK_N), COMPUTE)
    begin = split * slice_pixels
    end = tl.minimum(begin + slice_pixels, PIXELS)
    for p0 in range(begin, end, BLOCK_M):
        p = p0 + lanes
        p_valid = p < end
        n, o_d, o_h, o_w = pixel_coordinates(p, OD, OH, OW)
        dy_rows = n * dy_sn + o_d * dy_sd + o_h * dy_sh + o_w * dy_sw
        dy_mask = p_valid[:, None] & k_valid[None, :]
        dy = tl.load(dy_ptr + dy_rows[:, None] + dy_channels, mask=dy_mask, other=0.0).to(COMPUTE)
        i_d, ok_d = gather_coordinate(o_d[None, :], 0, shift_d, pad_d, sd, XD, False)
        i_h, ok_h = gather_coordinate(o_h[None, :], 0, shift_h, pad_h, sh, XH, False)
        i_w, ok_w = gather_coordinate(o_w[None, :], 0, shift_w, pad_w, sw, XW, False)
        x_rows = n[None, :] * x_sn + i_d * x_sd + i_h * x_sh + i_w * x_sw
        inside = tap_valid & p_valid[None, :] & ok_d & ok_h & ok_w
        x_mask = inside[:, :, None] & k_valid[None, None, :]
        x = tl.load(x_ptr + x_rows[:, :, None] + x_channels, mask=x_mask, other=0.0)
        acc += x.to(COMPUTE) * dy[None, :, :]
    store_filter(
        tl.sum(acc, axis=1),
        k[None, :],
        tap[:, None],
        split,
        dw_ptr,
        partial_ptr,
        K,
        1,
        taps,
        T,
        R,
        S,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        tap_valid & k_valid[None, :],
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


@triton.jit
def filter_sum_kernel(
    dw_ptr,
    partial_ptr,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    K,
    CG,
    T,
    R,
    S,
    splits,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
):
    """dw = alpha * (sum of the slices' partials) + beta * dw. SPLIT_BLOCK slices are loaded at a
    time (independent loads in flight) and summed across slices once at the end, in a fixed tree."""
    columns = T * R * S * CG
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = e < K * columns
    lanes = tl.arange(0, SPLIT_BLOCK)
    total = tl.zeros((SPLIT_BLOCK, BLOCK), COMPUTE)
    for s0 in range(0, splits, SPLIT_BLOCK):
        split = s0 + lanes
        offsets = split[:, None] * (K * columns) + e[None, :]
        total += tl.load(partial_ptr + offsets, mask=(split < splits)[:, None] & mask[None, :], other=0.0)
    k = e // columns
    store_filter(
        tl.sum(total, axis=0),
        k,
        e - k * columns,
        0,
        dw_ptr,
        partial_ptr,
        K,
        CG,
        T * R * S,
        T,
        R,
        S,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        mask,
        alpha,
        beta,
        False,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )
