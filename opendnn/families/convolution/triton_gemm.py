"""Implicit-GEMM convolution kernels: forward and backward data as one GEMM, the im2col and
offset-table helpers of the GEMM and IMPLICIT_PRECOMP_GEMM algorithms, and the fused epilogue.

Every problem arrives in a canonical 3-D form (1-D and 2-D problems gain size-1 dims): the
*gathered* tensor A (x forward, dy backward data) is read through the filter taps, the filter w is
the B operand, and the output O (y forward, dx backward data) is written once.

GEMM view per group g of G:
    rows    m = (n, u_d, u_h, u_w)        output pixels (M = N * OD * OH * OW forward)
    columns o in [0, OUTC)                output channels of the group (K/G forward, C/G backward)
    reduce  j = (tap, c), c in [0, RED)   taps x reduced channels (C/G forward, K/G backward)
    O[m, o] = sum_j A[n, g*RED + c, coord(u, tap)] * W(g, c, o, tap)

Forward: coord = o * stride - pad + r * dilation, valid inside A. Backward data gathers
dy at (h + pad - r * dilation) / stride where that divides exactly; to skip the taps that never
divide, the output pixels are split into stride phases (program axis 2): in phase q = h mod
stride, the valid r form the progression r0(q) + i * stride / gcd(stride, dilation), so every row of
a tile shares one set of taps and no MMA work is masked away.

When RED is a multiple of BLOCK_K (EVEN_RED) a chunk of the reduction lies in one tap: the tap is
a scalar and the channel offsets are contiguous, so NHWC loads are 16-byte vectors. Otherwise
(conv1's 3 channels, say) each lane of the chunk computes its own tap: no padding of the channel
count to the MMA depth is wasted.

Cost model: 2 * M * OUTC * RED * taps FLOPs per group on tensor cores (fp32 accumulation, fp64
MMA for fp64); A tiles are re-read from L2 once per tap and column block, W once per row block;
O is written once (read once more for beta or z). Zero workspace (IMPLICIT_GEMM), taps * 16 bytes
(IMPLICIT_PRECOMP_GEMM), G * M * taps * RED elements (GEMM's im2col matrix).
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.kernels.activation import activation

TF32_DROPPED_BITS = 13  # float32's 23 mantissa bits less TF32's 10
TF32_HALF_UNIT = tl.constexpr(1 << (TF32_DROPPED_BITS - 1))  # half of the last kept bit's unit
TF32_DROPPED = tl.constexpr(TF32_DROPPED_BITS)


@triton.jit
def reduction_index(j0, RED, total, BLOCK_K: tl.constexpr, EVEN_RED: tl.constexpr, AXIS: tl.constexpr):
    """(tap, c, valid) of reduction chunk j0.. laid along AXIS of a 2-D tile (the other dim 1)."""
    lanes = tl.arange(0, BLOCK_K)
    if AXIS == 1:
        lanes = lanes[None, :]
    else:
        lanes = lanes[:, None]
    if EVEN_RED:  # one tap for the whole chunk: scalar tap, contiguous aligned channels, no mask
        tap = tl.zeros([1, 1], tl.int32) + j0 // RED
        c = tl.multiple_of(j0 % RED, BLOCK_K) + lanes
        valid = tl.full([1, 1], 1, tl.int1)
    else:
        j = j0 + lanes
        valid = j < total
        tap = tl.where(valid, j // RED, 0)  # lanes past the last tap read tap 0's table row, not past the table
        c = j % RED
    return tap, c, valid


@triton.jit
def tap_shifts(
    tap,
    table_ptr,
    r0_d,
    r0_h,
    r0_w,
    step_d,
    step_h,
    step_w,
    taps_h,
    taps_w,
    T,
    R,
    S,
    dil_d,
    dil_h,
    dil_w,
    w_st,
    w_sr,
    w_ss,
    FLIP: tl.constexpr,
    PRECOMP: tl.constexpr,
):
    """For tap index ``tap``: the dilated filter position (r * dilation per dim) and the filter's
    offset of that tap (flipped for true convolution), computed or read from the offset table."""
    if PRECOMP:
        entry = table_ptr + tap * 4
        shift_d = tl.load(entry)
        shift_h = tl.load(entry + 1)
        shift_w = tl.load(entry + 2)
        w_offset = tl.load(entry + 3)
    else:
        t = r0_d + (tap // (taps_h * taps_w)) * step_d
        r = r0_h + ((tap // taps_w) % taps_h) * step_h
        s = r0_w + (tap % taps_w) * step_w
        if FLIP:
            w_offset = (T - 1 - t) * w_st + (R - 1 - r) * w_sr + (S - 1 - s) * w_ss
        else:
            w_offset = t * w_st + r * w_sr + s * w_ss
        shift_d = t * dil_d
        shift_h = r * dil_h
        shift_w = s * dil_w
    return shift_d, shift_h, shift_w, w_offset


@triton.jit
def gather_coordinate(u, q, shift, pad, stride, size, BACKWARD: tl.constexpr):
    """(coordinate in A, valid) for output coordinate ``u`` and a dilated tap shift. Backward, the
    output coordinate is u * stride + q and the phase's taps make (q + pad - shift) divide exactly."""
    a = gather_origin(u, pad, stride, BACKWARD) + gather_step(q, shift, pad, stride, BACKWARD)
    return a, (a >= 0) & (a < size)


@triton.jit
def gather_origin(u, pad, stride, BACKWARD: tl.constexpr):
    """The part of ``gather_coordinate`` that depends on the output coordinate ``u`` alone (a row's):
    u * stride - pad forward, u backward; ``gather_step`` adds the tap's."""
    if BACKWARD:
        return u
    return u * stride - pad


@triton.jit
def gather_step(q, shift, pad, stride, BACKWARD: tl.constexpr):
    """The part of ``gather_coordinate`` that depends on the tap alone: its dilated shift forward,
    (q + pad - shift) / stride backward (the phase's taps divide exactly)."""
    if BACKWARD:
        return (q + pad - shift) // stride
    return shift


@triton.jit
def inside(i, size):
    """0 <= i < size, in one unsigned comparison (a negative i wraps past every size)."""
    return i.to(tl.uint32, bitcast=True) < tl.cast(size, tl.uint32)


@triton.jit
def direct_coordinate(o, shift, pad, stride, size, BACKWARD: tl.constexpr):
    """(coordinate in A, valid) for output coordinate ``o``: backward, where (o + pad - shift)
    divides by the stride."""
    if BACKWARD:
        num = o + pad - shift
        a = num // stride
        valid = (num >= 0) & (num % stride == 0) & (a < size)
    else:
        a = o * stride - pad + shift
        valid = (a >= 0) & (a < size)
    return a, valid


@triton.jit
def tap_progression(phase, pad, stride, dilation, extent, step):
    """First valid tap r0 of a backward-data phase and how many taps: r with (phase + pad - r *
    dilation) divisible by stride, r in [0, extent), stepping by ``step``."""
    r0 = extent + step  # none found: no taps
    for i in range(0, step):
        r = step - 1 - i
        if (phase + pad - r * dilation) % stride == 0:
            r0 = r
    count = tl.maximum(extent - r0 + step - 1, 0) // step
    return tl.minimum(r0, extent), count


@triton.jit
def epilogue(
    acc,
    out_ptr,
    out_offsets,
    mask,
    bias_ptr,
    bias_offsets,
    z_ptr,
    z_offsets,
    alpha,
    beta,
    alpha2,
    coef,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """out = act(alpha * acc + alpha2 * z + bias), or alpha * acc + beta * out (out unread when
    beta == 0)."""
    y = acc * tl.cast(alpha, COMPUTE)
    if HAS_Z:
        y += tl.cast(alpha2, COMPUTE) * tl.load(z_ptr + z_offsets, mask=mask).to(COMPUTE)
    if HAS_BIAS:
        y += tl.load(bias_ptr + bias_offsets, mask=mask).to(COMPUTE)
    if ACTIVATION != "":
        x = y
        y = activation(ACTIVATION, x, tl.cast(coef, COMPUTE)).to(COMPUTE)
        if ACTIVATION == "relu" or ACTIVATION == "clipped_relu":  # NaN in: NaN, or 0 if not propagated
            if PROPAGATE_NAN:
                y = tl.where(x != x, x, y)
            else:
                y = tl.where(x != x, 0.0, y)
    if HAS_BETA:
        y += tl.cast(beta, COMPUTE) * tl.load(out_ptr + out_offsets, mask=mask).to(COMPUTE)
    tl.store(out_ptr + out_offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def grouped_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of linear tile index ``tile``: GROUP_M tile rows are walked column by
    column, so they share each column tile of the filter while it is hot in L2."""
    band = tile // (GROUP_M * tiles_n)
    band_rows = tl.minimum(tiles_m - band * GROUP_M, GROUP_M)
    index = tile % (GROUP_M * tiles_n)
    return band * GROUP_M + index % band_rows, index // band_rows


@triton.jit
def row_coordinates(m, UD, UH, UW, OD, OH, OW, qd, qh, qw, sd, sh, sw, BACKWARD: tl.constexpr, M):
    """Row m's (n, u_d, u_h, u_w), its output coordinates and whether it is a real pixel."""
    u_w = m % UW
    u_h = (m // UW) % UH
    u_d = (m // (UW * UH)) % UD
    n = m // (UW * UH * UD)
    if BACKWARD:  # phase q of the stride: output pixel u * stride + q
        o_d = u_d * sd + qd
        o_h = u_h * sh + qh
        o_w = u_w * sw + qw
        valid = (m < M) & (o_d < OD) & (o_h < OH) & (o_w < OW)
    else:
        o_d = u_d
        o_h = u_h
        o_w = u_w
        valid = m < M
    return n, u_d, u_h, u_w, o_d, o_h, o_w, valid


@triton.jit
def conv_gemm_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    table_ptr,
    a_sn,
    a_sc,
    a_sd,
    a_sh,
    a_sw,
    w_s_red,
    w_s_out,
    w_st,
    w_sr,
    w_ss,
    w_group,
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
    UD,
    UH,
    UW,
    OD,
    OH,
    OW,
    AD,
    AH,
    AW,
    RED,
    OUTC,
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
    step_d,
    step_h,
    step_w,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    SOURCE: tl.constexpr,
    PIXEL_CHANNELS: tl.constexpr,
    EVEN_RED: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Program (tile, g, phase): a BLOCK_M x BLOCK_N tile of O for group g. SOURCE is "implicit"
    (taps computed), "precomp" (taps read from the offset table at table_ptr) or "im2col" (A is the
    G x M x (taps * RED) matrix at a_ptr, already gathered). PIXEL_CHANNELS (0: none): A is a
    channels-last copy holding that many channels a pixel, the first RED real and the rest zeros
    (``pad_channels_kernel``); the reduction runs over all of them with the channel and pixel strides
    as constants, so that a tap's channels load as one vector."""
    g = tl.program_id(1)
    phase = tl.program_id(2)
    qw = phase % sw
    qh = (phase // sw) % sh
    qd = phase // (sw * sh)
    if BACKWARD:
        r0_d, taps_d = tap_progression(qd, pad_d, sd, dil_d, T, step_d)
        r0_h, taps_h = tap_progression(qh, pad_h, sh, dil_h, R, step_h)
        r0_w, taps_w = tap_progression(qw, pad_w, sw, dil_w, S, step_w)
    else:
        r0_d, r0_h, r0_w, taps_d, taps_h, taps_w = 0, 0, 0, T, R, S
    lanes = RED  # reduced channels a tap, as the reduction walks them
    pixel_stride = a_sw
    if PIXEL_CHANNELS > 0:
        lanes = PIXEL_CHANNELS
        pixel_stride = PIXEL_CHANNELS
    total = taps_d * taps_h * taps_w * lanes

    tile_m, tile_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(OUTC, BLOCK_N), GROUP_M)

    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n, u_d, u_h, u_w, o_d, o_h, o_w, row_valid = row_coordinates(
        m, UD, UH, UW, OD, OH, OW, qd, qh, qw, sd, sh, sw, BACKWARD, M
    )
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < OUTC
    # A's coordinate in each dim is a row's origin plus a tap's step: a row's offset and a chunk's
    # offsets are summed once an element, with the bounds (lanes straddling taps: conv1's 3 channels)
    origin_d = gather_origin(u_d, pad_d, sd, BACKWARD)[:, None]
    origin_h = gather_origin(u_h, pad_h, sh, BACKWARD)[:, None]
    origin_w = gather_origin(u_w, pad_w, sw, BACKWARD)[:, None]
    group_offset = (g * RED).to(tl.int64) * a_sc
    if PIXEL_CHANNELS > 0:  # a padded copy holds one group: a constant 0 keeps a tap's lanes one vector
        group_offset = 0
    a_rows = (
        n.to(tl.int64)[:, None] * a_sn
        + group_offset
        + origin_d.to(tl.int64) * a_sd
        + origin_h.to(tl.int64) * a_sh
        + origin_w.to(tl.int64) * pixel_stride
    )
    if SOURCE == "im2col":
        a_rows = (g * M + m).to(tl.int64)[:, None] * total
    w_cols = g.to(tl.int64) * w_group + cols[None, :] * w_s_out

    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    for j0 in range(0, total, BLOCK_K):
        tap, c, j_valid = reduction_index(j0, lanes, total, BLOCK_K, EVEN_RED, 1)
        if SOURCE == "im2col":
            a_mask = row_valid[:, None] & j_valid
            a = tl.load(a_ptr + a_rows + (j0 + tl.arange(0, BLOCK_K))[None, :], mask=a_mask, other=0.0)
        else:
            shift_d, shift_h, shift_w, _ = tap_shifts(
                tap,
                table_ptr,
                r0_d,
                r0_h,
                r0_w,
                step_d,
                step_h,
                step_w,
                taps_h,
                taps_w,
                T,
                R,
                S,
                dil_d,
                dil_h,
                dil_w,
                w_st,
                w_sr,
                w_ss,
                FLIP,
                SOURCE == "precomp",
            )
            step_in_d = gather_step(qd, shift_d, pad_d, sd, BACKWARD)
            step_in_h = gather_step(qh, shift_h, pad_h, sh, BACKWARD)
            step_in_w = gather_step(qw, shift_w, pad_w, sw, BACKWARD)
            i_d, i_h, i_w = origin_d + step_in_d, origin_h + step_in_h, origin_w + step_in_w
            a_mask = row_valid[:, None] & j_valid & inside(i_d, AD) & inside(i_h, AH) & inside(i_w, AW)
            chunk_offsets = step_in_d * a_sd + step_in_h * a_sh + step_in_w * pixel_stride + c * a_sc
            a = tl.load(a_ptr + (a_rows + chunk_offsets), mask=a_mask, other=0.0)
        tap_b, c_b, j_valid_b = reduction_index(j0, lanes, total, BLOCK_K, EVEN_RED, 0)
        _, _, _, w_tap = tap_shifts(
            tap_b,
            table_ptr,
            r0_d,
            r0_h,
            r0_w,
            step_d,
            step_h,
            step_w,
            taps_h,
            taps_w,
            T,
            R,
            S,
            dil_d,
            dil_h,
            dil_w,
            w_st,
            w_sr,
            w_ss,
            FLIP,
            SOURCE == "precomp",
        )
        b_mask = j_valid_b & col_valid[None, :]
        if PIXEL_CHANNELS > 0:  # the copy's padding channels have no filter
            b_mask &= c_b < RED
        b = tl.load(w_ptr + (w_cols + c_b * w_s_red + w_tap), mask=b_mask, other=0.0)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)

    mask = row_valid[:, None] & col_valid[None, :]
    channels = (g * OUTC + cols)[None, :]
    n = n.to(tl.int64)[:, None]
    o_d, o_h, o_w = o_d[:, None], o_h[:, None], o_w[:, None]
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
def pixel_box_descriptor(
    ptr,
    N,
    H,
    W,
    C,
    sn,
    sh,
    sw,
    IMAGES: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """A TMA descriptor of a channels-last [N, H, W, C] tensor read in IMAGES x BLOCK_H x BLOCK_W
    boxes of BLOCK_C channels; coordinates outside it read zeros."""
    return tl.make_tensor_descriptor(ptr, [N, H, W, C], [sn, sh, sw, 1], [IMAGES, BLOCK_H, BLOCK_W, BLOCK_C])


@triton.jit
def box_origin(box, N, H, W, IMAGES: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """(n0, h0, w0) of box ``box`` of the pixel grid N x H x W, boxes in (image, row, column) order."""
    blocks_h = tl.cdiv(H, BLOCK_H)
    blocks_w = tl.cdiv(W, BLOCK_W)
    return box // (blocks_h * blocks_w) * IMAGES, box // blocks_w % blocks_h * BLOCK_H, box % blocks_w * BLOCK_W


@triton.jit
def phase_view_box(n0, h0, w0, c0, shift_h, shift_w, stride_h, stride_w, C):
    """The coordinates in the phase view of a channels-last [N, H, W, C] tensor (dims [N, H / stride_h,
    stride_h, W / stride_w, stride_w * C]) of the box whose output pixel (n0, h0, w0) reads input pixel
    (stride_h * h0 + shift_h, stride_w * w0 + shift_w), channels c0..: x[n, s*i + a, s*j + b, c] is the
    view's [n, i, a, j, b * C + c], so the rows i = h0 + floor(shift_h / stride_h) .. of phase a =
    shift_h mod stride_h are the pixels output rows h0.. read, one stride apart."""
    phase_h = (shift_h % stride_h + stride_h) % stride_h  # in [0, stride) whatever the sign of the shift
    phase_w = (shift_w % stride_w + stride_w) % stride_w
    # shift - phase is a multiple of the stride: its division is exact under truncation too
    return n0, h0 + (shift_h - phase_h) // stride_h, phase_h, w0 + (shift_w - phase_w) // stride_w, phase_w * C + c0


@triton.jit
def tap_window(first, view, outputs):
    """Where a tap's reads along one dim of x's phase view can meet a pixel of dy: output index u reads
    view index u + first, and the indices [lo, hi) = [max(0, first), min(view, outputs + first)) are
    inside both x (0 <= index < view) and dy (u < outputs). Returns (lo, hi - lo, lo): the descriptor's
    first index, its extent and the view index its coordinate 0 stands for. An empty range (the tap
    reads only padding) gives one index at 0 and coordinate 0 standing for first - 1: every box
    coordinate, u + 1, lies past that extent, so the box is all zero fill."""
    lo = tl.maximum(first, 0)
    hi = tl.minimum(view, outputs + first)
    empty = hi <= lo
    return tl.where(empty, 0, lo), tl.where(empty, 1, hi - lo), tl.where(empty, first - 1, lo)


@triton.jit
def tap_view_window(shift_h, shift_w, stride_h, stride_w, XH, XW, OH, OW, x_sh, x_sw):
    """The rows and columns of x's phase view (``phase_view_box``) that a backward filter's tap of
    shift (shift_h, shift_w) multiplies with dy pixels inside OH x OW (``tap_window`` per dim). A
    descriptor of the view starting there and only that large reads zeros wherever dy's box is past
    dy or x's pixel is padding: dy's zero fill never meets a real x (0 * inf would be NaN). Returns
    (the offset of its first pixel from x's, in elements; its rows; its columns; the view row and
    column its coordinates count from: the box of output pixel (h0, w0) is phase_view_box at
    (h0 - origin_h, w0 - origin_w)). The offset is whole rows and pixels of x: 16-byte aligned
    wherever x's row and pixel strides are."""
    _, first_h, _, first_w, _ = phase_view_box(0, 0, 0, 0, shift_h, shift_w, stride_h, stride_w, 0)
    base_h, rows, origin_h = tap_window(first_h, XH // stride_h, OH)
    base_w, columns, origin_w = tap_window(first_w, XW // stride_w, OW)
    return base_h * stride_h * x_sh + base_w * stride_w * x_sw, rows, columns, origin_h, origin_w


@triton.jit
def tap_step(
    j,
    chunks,
    taps_w,
    S,
    shift_h,
    shift_w,
    shift_step_h,
    shift_step_w,
    filter_row,
    filter_column,
    filter_row_step,
    filter_column_step,
    BLOCK_K: tl.constexpr,
):
    """Reduction step ``j`` of a TMA convolution, (tap, chunk of BLOCK_K channels) with the chunks
    fastest: (the tap's shift in rows, in columns, its filter tap (r * S + s), the chunk's first
    channel). Tap (k_h, k_w) of the taps_h x taps_w progressions is shifted by shift + k * shift_step
    and reads the filter's row filter_row + k_h * filter_row_step (columns alike)."""
    tap = j // chunks
    k_h = tap // taps_w
    k_w = tap % taps_w
    w_tap = (filter_row + k_h * filter_row_step) * S + filter_column + k_w * filter_column_step
    return shift_h + k_h * shift_step_h, shift_w + k_w * shift_step_w, w_tap, j % chunks * BLOCK_K


@triton.jit
def conv_tma_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    N,
    AH,
    AW,
    RED,
    OH,
    OW,
    OUTC,
    R,
    S,
    a_sn,
    a_sh,
    a_sw,
    w_sk,
    o_sn,
    o_sc,
    o_sh,
    o_sw,
    o_base,
    z_sn,
    z_sc,
    z_sh,
    z_sw,
    bias_sc,
    view_stride_h,
    view_stride_w,
    taps_h,
    taps_w,
    shift_h,
    shift_w,
    shift_step_h,
    shift_step_w,
    filter_row,
    filter_column,
    filter_row_step,
    filter_column_step,
    slice_steps,
    slice_elements,
    OD,
    T,
    LAYERS,
    layer_stride,
    o_sd,
    z_sd,
    taps_d,
    shift_d,
    shift_step_d,
    filter_depth,
    filter_depth_step,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    IMAGES: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """One output phase of an ungrouped 2-D convolution over channels-last A and a KRSC filter, read
    by TMA (``triton_tma.output_phases``: a forward is one phase; a backward data one per stride phase
    of dx). The output is the OH x OW pixel grid at ``o_base`` and strides o_sh, o_sw (a backward
    phase's rows and columns of dx, one stride apart); a tile's rows are an IMAGES x BLOCK_H x BLOCK_W
    block of it. A is read through its phase view [N, AH / view_stride_h, view_stride_h, AW /
    view_stride_w, view_stride_w * RED] (the forward's strides; 1 backward, where a phase gathers dy
    at unit stride): per (tap, chunk) of the phase's taps_h x taps_w taps (``tap_step``) the A tile is
    one 5-D box [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_K] of it (``phase_view_box``; stride 1: the block
    moved by the tap's shift), TMA filling what falls outside A, the padding, with zeros. A phase with
    no taps writes alpha * 0 (+ beta * out). The reduced channels end in a partial chunk where they are
    not whole chunks: TMA reads zeros past them. The filter KRSC (KTRSC in 3-D, T = 1 in 2-D): forward,
    read per tap as [K, T*R*S, C], its [BLOCK_N, 1, BLOCK_K] box at (k, tap, c) is B transposed;
    backward data, read as the matrix [K, T*R*S*C], its [BLOCK_K, BLOCK_N] box at (k, tap*C + c) is B.
    Program (tile, slice) reduces
    steps ``slice * slice_steps ..`` of the (tap, chunk) steps and writes them ``slice *
    slice_elements`` past ``o_base``: a sliced forward (``triton_tma.reduction_slices``) writes its
    slices' float32 partial sums, which ``slice_sum_kernel`` finishes; one slice of every step is the
    whole convolution. A 3-D problem's frames are the view's third dim in place of the row phases
    (LAYERS of them, ``layer_stride`` apart; its forwards of unit stride along H have none): tiles
    walk the OD output frames too (a box covers one), and its taps_d taps in depth (a progression as
    the rows' and columns') move the box's frame, T filter frames of R x S taps."""
    BLOCK_M: tl.constexpr = IMAGES * BLOCK_H * BLOCK_W
    a_desc = tl.make_tensor_descriptor(
        a_ptr,
        [N, AH // view_stride_h, LAYERS, AW // view_stride_w, view_stride_w * RED],
        [a_sn, view_stride_h * a_sh, layer_stride, view_stride_w * a_sw, 1],
        [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_K],
    )
    if BACKWARD:
        w_desc = tl.make_tensor_descriptor(w_ptr, [RED, T * R * S * OUTC], [w_sk, 1], [BLOCK_K, BLOCK_N])
    else:  # per tap: a partial last chunk reads zeros, not the next tap's channels
        w_desc = tl.make_tensor_descriptor(w_ptr, [OUTC, T * R * S, RED], [w_sk, RED, 1], [BLOCK_N, 1, BLOCK_K])

    frame_boxes = tl.cdiv(OH, BLOCK_H) * tl.cdiv(OW, BLOCK_W)
    tiles_m = tl.cdiv(N, IMAGES) * OD * frame_boxes
    tile_m, tile_n = grouped_tile(tl.program_id(0), tiles_m, tl.cdiv(OUTC, BLOCK_N), GROUP_M)
    col0 = tile_n * BLOCK_N
    frame = tile_m // frame_boxes % OD  # tiles in (images, frame, rows, columns) order
    in_frame = tile_m // (frame_boxes * OD) * frame_boxes + tile_m % frame_boxes  # the tile's box of its frame
    n0, h0, w0 = box_origin(in_frame, N, OH, OW, IMAGES, BLOCK_H, BLOCK_W)

    chunks = tl.cdiv(RED, BLOCK_K)
    plane_steps = taps_h * taps_w * chunks  # the steps of one tap in depth
    first_step = tl.program_id(1) * slice_steps
    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    for j in range(first_step, tl.minimum(first_step + slice_steps, taps_d * plane_steps)):
        k_d = j // plane_steps
        tap_h, tap_w, w_tap, c0 = tap_step(
            j % plane_steps,
            chunks,
            taps_w,
            S,
            shift_h,
            shift_w,
            shift_step_h,
            shift_step_w,
            filter_row,
            filter_column,
            filter_row_step,
            filter_column_step,
            BLOCK_K,
        )
        w_tap += (filter_depth + k_d * filter_depth_step) * R * S
        box = phase_view_box(n0, h0, w0, c0, tap_h, tap_w, view_stride_h, view_stride_w, RED)
        layer = box[2] + frame + shift_d + k_d * shift_step_d  # the row phase (2-D) or the frame read (3-D)
        a = a_desc.load([box[0], box[1], layer, box[3], box[4]]).reshape(BLOCK_M, BLOCK_K)
        if BACKWARD:
            b = w_desc.load([c0, w_tap * OUTC + col0])
        else:
            b = w_desc.load([col0, w_tap, c0]).reshape(BLOCK_N, BLOCK_K).T
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)

    rows = tl.arange(0, BLOCK_M)
    n = n0 + rows // (BLOCK_H * BLOCK_W)
    o_h = h0 + rows // BLOCK_W % BLOCK_H
    o_w = w0 + rows % BLOCK_W
    cols = col0 + tl.arange(0, BLOCK_N)
    mask = ((n < N) & (o_h < OH) & (o_w < OW))[:, None] & (cols < OUTC)[None, :]
    n, o_h, o_w, channels = n.to(tl.int64)[:, None], o_h[:, None], o_w[:, None], cols[None, :]
    out_offsets = o_base + tl.program_id(1).to(tl.int64) * slice_elements + n * o_sn + channels * o_sc
    out_offsets += frame * o_sd + o_h * o_sh + o_w * o_sw
    z_offsets = n * z_sn + channels * z_sc + frame * z_sd + o_h * z_sh + o_w * z_sw
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
def slice_sum_kernel(
    partial_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    elements,
    OD,
    OH,
    OW,
    OUTC,
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
    slices,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLIT_BLOCK: tl.constexpr,
):
    """The output of a sliced forward: per element (pixel, channel) of the slices' float32 partial
    sums ([slices, N * OD * OH * OW * OUTC] packed, channels innermost; OD = 1 in 2-D), their sum,
    then the convolution's epilogue, stored at the output's strides. SPLIT_BLOCK slices are loaded at
    a time (independent loads in flight) and summed across slices once at the end, in a fixed tree:
    the result is bitwise repeatable."""
    e = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = e < elements
    lanes = tl.arange(0, SPLIT_BLOCK)
    total = tl.zeros((SPLIT_BLOCK, BLOCK), tl.float32)
    for s0 in range(0, slices, SPLIT_BLOCK):
        split = s0 + lanes
        offsets = split.to(tl.int64)[:, None] * elements + e[None, :]
        total += tl.load(partial_ptr + offsets, mask=(split < slices)[:, None] & mask[None, :], other=0.0)
    c = e % OUTC
    p = e // OUTC
    o_w = p % OW
    o_h = p // OW % OH
    o_d = p // (OW * OH) % OD
    n = (p // (OW * OH * OD)).to(tl.int64)
    epilogue(
        tl.sum(total, axis=0),
        out_ptr,
        n * o_sn + c * o_sc + o_d * o_sd + o_h * o_sh + o_w * o_sw,
        mask,
        bias_ptr,
        c * bias_sc,
        z_ptr,
        n * z_sn + c * z_sc + o_d * z_sd + o_h * z_sh + o_w * z_sw,
        alpha,
        beta,
        alpha2,
        coef,
        HAS_BETA,
        HAS_BIAS,
        HAS_Z,
        ACTIVATION,
        PROPAGATE_NAN,
        tl.float32,
    )


@triton.jit
def round_to_tf32(value):
    """float32 ``value`` rounded to TF32, to nearest with ties away from zero (``cvt.rna.tf32.f32``):
    the bits plus half of the last kept bit's unit, the 13 dropped bits cleared (a carry into the
    exponent is the next binade, or infinity past the largest finite value; NaN stays NaN)."""
    bits = value.to(tl.uint32, bitcast=True) + TF32_HALF_UNIT
    rounded = (bits >> TF32_DROPPED << TF32_DROPPED).to(tl.float32, bitcast=True)
    return tl.where(value == value, rounded, value)


@triton.jit
def pad_channels_kernel(
    x_ptr,
    out_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    pixels,
    D,
    H,
    W,
    C,
    PIXEL_CHANNELS: tl.constexpr,
    ROUND_TO_TF32: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """x (N, C, D, H, W at its strides) copied channels-last with PIXEL_CHANNELS channels a pixel,
    zeros past its C, rounded to TF32 where ROUND_TO_TF32: the A operand ``conv_gemm_kernel`` reads a
    tap of as one vector."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w = p % W
    h = (p // W) % H
    d = (p // (W * H)) % D
    n = p // (W * H * D)
    c = tl.arange(0, PIXEL_CHANNELS)
    pixel = n.to(tl.int64) * x_sn + d.to(tl.int64) * x_sd + h.to(tl.int64) * x_sh + w.to(tl.int64) * x_sw
    inside = (p < pixels)[:, None]
    value = tl.load(x_ptr + (pixel[:, None] + c[None, :] * x_sc), mask=inside & (c < C)[None, :], other=0.0)
    if ROUND_TO_TF32:
        value = round_to_tf32(value)
    tl.store(out_ptr + (p.to(tl.int64)[:, None] * PIXEL_CHANNELS + c[None, :]), value, mask=inside)


@triton.jit
def tap_table_kernel(
    table_ptr, T, R, S, dil_d, dil_h, dil_w, w_st, w_sr, w_ss, FLIP: tl.constexpr, BLOCK: tl.constexpr
):
    """IMPLICIT_PRECOMP_GEMM's offset table: per tap, the dilated shifts (d, h, w) and the filter offset."""
    tap = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = tap < T * R * S
    shift_d, shift_h, shift_w, w_offset = tap_shifts(
        tap, table_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, dil_d, dil_h, dil_w, w_st, w_sr, w_ss, FLIP, False
    )
    tl.store(table_ptr + tap * 4, shift_d, mask=mask)
    tl.store(table_ptr + tap * 4 + 1, shift_h, mask=mask)
    tl.store(table_ptr + tap * 4 + 2, shift_w, mask=mask)
    tl.store(table_ptr + tap * 4 + 3, w_offset, mask=mask)


@triton.jit
def im2col_kernel(
    a_ptr,
    col_ptr,
    a_sn,
    a_sc,
    a_sd,
    a_sh,
    a_sw,
    M,
    OD,
    OH,
    OW,
    AD,
    AH,
    AW,
    RED,
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
    BACKWARD: tl.constexpr,
    EVEN_RED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """The GEMM algorithms' explicit gather: col[g, m, (tap, c)] = A[n, g*RED + c, coord(m, tap)],
    0 where the tap falls in the padding (or, backward data, between strides)."""
    g = tl.program_id(2)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    j0 = tl.program_id(1) * BLOCK_K
    total = T * R * S * RED
    n, o_d, o_h, o_w, _, _, _, row_valid = row_coordinates(m, OD, OH, OW, OD, OH, OW, 0, 0, 0, 1, 1, 1, False, M)
    tap, c, j_valid = reduction_index(j0, RED, total, BLOCK_K, EVEN_RED, 1)
    shift_d, shift_h, shift_w, _ = tap_shifts(
        tap, col_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, dil_d, dil_h, dil_w, 0, 0, 0, False, False
    )
    i_d, ok_d = direct_coordinate(o_d[:, None], shift_d, pad_d, sd, AD, BACKWARD)
    i_h, ok_h = direct_coordinate(o_h[:, None], shift_h, pad_h, sh, AH, BACKWARD)
    i_w, ok_w = direct_coordinate(o_w[:, None], shift_w, pad_w, sw, AW, BACKWARD)
    a_offsets = n.to(tl.int64)[:, None] * a_sn + (g * RED + c) * a_sc + i_d * a_sd + i_h * a_sh + i_w * a_sw
    inside = row_valid[:, None] & j_valid
    a = tl.load(a_ptr + a_offsets, mask=inside & ok_d & ok_h & ok_w, other=0.0)
    col_offsets = (g * M + m).to(tl.int64)[:, None] * total + (j0 + tl.arange(0, BLOCK_K))[None, :]
    tl.store(col_ptr + col_offsets, a, mask=inside)


def grid_tiles(m: int, outc: int, block_m: int, block_n: int) -> int:
    return triton.cdiv(m, block_m) * triton.cdiv(outc, block_n)
