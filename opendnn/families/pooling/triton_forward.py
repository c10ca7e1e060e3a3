"""The Triton kernels of the pooling forward (general windows, stride-2 strips, and the argmax pass
of the max backward) and the tile helpers the backward shares (the design is in ``triton_backend``'s
docstring)."""

from __future__ import annotations

import triton
import triton.language as tl

LOOP_CHUNK = tl.constexpr(16)  # window positions the forward's plain loop unrolls at a time: loads in flight


@triton.jit
def advance(base, step, size, CARRY: tl.constexpr):
    """``base + step`` as a coordinate below ``size`` and a carry into the next dim: two compares when
    CARRY (the launcher's promise that ``base + step < 3 * size``), else a division."""
    total = base + step
    if CARRY:
        carry = (total >= size).to(tl.int32) + (total >= 2 * size).to(tl.int32)
    else:
        carry = total // size
    return total - carry * size, carry


@triton.jit
def program_tile(sizes, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CARRY: tl.constexpr):
    """The program's tile: BLOCK_R consecutive rows (canonical dims 0-3 flattened, dim 3 fastest) by
    BLOCK_C columns (dim 4); one grid axis (the others hold 65535 programs at most), column blocks
    fastest so that neighbouring programs share rows of x. Returns the first row's coordinates along
    dims 0-2 (scalars: the tile's base), every row's coordinates along dims 0-3 and the columns, int32.
    Divisions are per program; per row only without CARRY (dim 3 under half the block)."""
    pid = tl.program_id(0)
    column_blocks = tl.cdiv(sizes[4], BLOCK_C)
    start = (pid // column_blocks) * BLOCK_R
    b3 = start % sizes[3]
    start = start // sizes[3]
    b2 = start % sizes[2]
    start = start // sizes[2]
    b1 = start % sizes[1]
    b0 = start // sizes[1]
    c3, carry = advance(b3, tl.arange(0, BLOCK_R), sizes[3], CARRY)
    c2, carry = advance(b2, carry, sizes[2], CARRY)
    c1, carry = advance(b1, carry, sizes[1], CARRY)
    return b0, b1, b2, b0 + carry, c1, c2, c3, (pid % column_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)


@triton.jit
def column_start(sizes, BLOCK_C: tl.constexpr):
    """The first column of the program's tile (as ``program_tile`` numbers them), a scalar."""
    return (tl.program_id(0) % tl.cdiv(sizes[4], BLOCK_C)) * BLOCK_C


@triton.jit
def outer_offset(c0, c1, c2, strides):
    """Scalar int64 offset of coordinates along canonical dims 0-2: the tile's base."""
    return c0.to(tl.int64) * strides[0] + c1.to(tl.int64) * strides[1] + c2.to(tl.int64) * strides[2]


@triton.jit
def tile_offset(d0, d1, d2, p3, p4, strides, WIDE: tl.constexpr):
    """(columns, rows) offsets from the tile's base: per row, ``d0 .. d2`` (positions along dims 0-2
    relative to the base) and ``p3``; per column ``p4``. int32 unless WIDE (an extent past 2**31)."""
    return row_offset(d0, d1, d2, p3, strides, WIDE)[None, :] + column_offset(p4, strides, WIDE)[:, None]


@triton.jit
def column_offset(p4, strides, WIDE: tl.constexpr):
    """Per column offsets (``tile_offset`` without the rows)."""
    if WIDE:
        p4 = p4.to(tl.int64)
    return p4 * strides[4]


@triton.jit
def row_offset(d0, d1, d2, p3, strides, WIDE: tl.constexpr):
    """Per row offsets from the tile's base (``tile_offset`` without the columns)."""
    if WIDE:
        d0, d1, d2, p3 = d0.to(tl.int64), d1.to(tl.int64), d2.to(tl.int64), p3.to(tl.int64)
    return d0 * strides[0] + d1 * strides[1] + d2 * strides[2] + p3 * strides[3]


@triton.jit
def split_constant(index, SIZES):
    """Coordinates of ``index`` over five sizes (last fastest): constants fold the divisions."""
    c4 = index % SIZES[4]
    index = index // SIZES[4]
    c3 = index % SIZES[3]
    index = index // SIZES[3]
    c2 = index % SIZES[2]
    index = index // SIZES[2]
    return index // SIZES[1], index % SIZES[1], c2, c3, c4


@triton.jit
def global_window(in_sizes, out_sizes):
    """A GLOBAL window (the whole input along the dims it pools, one output there; ``out_sizes`` may be the
    backward's cells): its size along each canonical dim (1 along the dims it does not pool), the weight of
    each dim in its row-major positions, and its positions."""
    window = (
        in_sizes[0] - out_sizes[0] + 1,
        in_sizes[1] - out_sizes[1] + 1,
        in_sizes[2] - out_sizes[2] + 1,
        in_sizes[3] - out_sizes[3] + 1,
        in_sizes[4] - out_sizes[4] + 1,
    )
    linear = (
        window[1] * window[2] * window[3] * window[4],
        window[2] * window[3] * window[4],
        window[3] * window[4],
        window[4],
        1,
    )
    return window, linear, window[0] * linear[0]


@triton.jit
def window_run(positions, BLOCK_POSITIONS: tl.constexpr):
    """The first and the end of this program's run of a GLOBAL window's ``positions`` (or phases): the window cut
    into as many runs of whole BLOCK_POSITIONS as grid axis 1 has programs (the planner makes none empty)."""
    span = tl.cdiv(tl.cdiv(positions, tl.num_programs(1)), BLOCK_POSITIONS) * BLOCK_POSITIONS
    start = tl.program_id(1) * span
    return start, tl.minimum(positions, start + span)


@triton.jit
def within(position, size, j, LOW, HIGH):
    """0 <= position < size for a position at window offset ``j``, testing only the ends that offset can
    pass: before the input when ``j < LOW`` (the padding), past its end when ``j >= HIGH`` (where the last
    window overhangs): a constant offset of the unrolled loop tests one end or none."""
    return ((position >= 0) | (j >= LOW)) & ((position < size) | (j < HIGH))


@triton.jit
def cell_start(o, size, out, STRIDE, pad, ADAPTIVE: tl.constexpr):
    """The first input position of window ``o`` along one dim: ``o * stride - pad``, or for an ADAPTIVE dim
    (torch's adaptive cells, ``size`` positions into ``out`` outputs) ``floor(o * size / out)``."""
    if ADAPTIVE:
        start = o * size // out
    else:
        start = o * STRIDE - pad
    return start


@triton.jit
def cell_end(o, size, out, ADAPTIVE: tl.constexpr):
    """Where window ``o`` stops reading along one dim: for an ADAPTIVE dim its cell's end, ``ceil((o + 1) *
    size / out)``; else the input's end (``size``), which only padded windows reach past."""
    if ADAPTIVE:
        end = ((o + 1) * size + out - 1) // out
    else:
        end = size
    return end


@triton.jit
def cell_shift(o, b, start, base, STRIDE, ADAPTIVE: tl.constexpr):
    """Input positions from the tile's first window (``b``, starting at ``base``) to window ``o`` (starting at
    ``start``) along one dim: ``(o - b) * stride``, a difference of starts for an ADAPTIVE dim."""
    if ADAPTIVE:
        shift = start - base
    else:
        shift = (o - b) * STRIDE
    return shift


@triton.jit
def window_count(
    start, end, size, pad, WINDOW, CLIPPED: tl.constexpr, ADAPTIVE: tl.constexpr, INCLUDE_PADDING: tl.constexpr
):
    """Positions a window starting at ``start`` counts along one dim: up to the end of the trailing
    padding (INCLUDE_PADDING) or inside the input only; the window where no window is CLIPPED; an
    ADAPTIVE dim's cell, ``end - start`` (no padding)."""
    if ADAPTIVE:
        count = end - start
    elif not CLIPPED:
        count = start * 0 + WINDOW
    elif INCLUDE_PADDING:
        count = tl.minimum(start + WINDOW, size + pad) - start
    else:
        count = tl.minimum(start + WINDOW, size) - tl.maximum(start, 0)
    return count


@triton.jit
def window_counts(
    s0,
    s1,
    s2,
    s3,
    s4,
    e0,
    e1,
    e2,
    e3,
    e4,
    sizes,
    pads,
    WINDOW,
    CLIPPED: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
):
    """The (columns, rows) tile of window counts: a scalar (dims 0-2) x a per-row x a per-column factor
    (``e0 .. e4``: the cells' ends, read along ADAPTIVE dims only)."""
    rows = (
        window_count(s0, e0, sizes[0], pads[0], WINDOW[0], CLIPPED[0], ADAPTIVE[0], INCLUDE_PADDING)
        * window_count(s1, e1, sizes[1], pads[1], WINDOW[1], CLIPPED[1], ADAPTIVE[1], INCLUDE_PADDING)
        * window_count(s2, e2, sizes[2], pads[2], WINDOW[2], CLIPPED[2], ADAPTIVE[2], INCLUDE_PADDING)
        * window_count(s3, e3, sizes[3], pads[3], WINDOW[3], CLIPPED[3], ADAPTIVE[3], INCLUDE_PADDING)
    )
    column = window_count(s4, e4, sizes[4], pads[4], WINDOW[4], CLIPPED[4], ADAPTIVE[4], INCLUDE_PADDING)
    counts = rows[None, :] * column[:, None]
    return tl.maximum(counts, 1)  # windows outside the tile's range may count 0; real ones never do


@triton.jit
def window_step(
    j,
    x_tile,
    s0,
    s1,
    s2,
    s3,
    s4,
    e0,
    e1,
    e2,
    e3,
    e4,
    load_cols,
    x_strides,
    best,
    found,
    total,
    y_value,
    WINDOW,
    LOW: tl.constexpr,
    HIGH,
    LINEAR,
    DILATION: tl.constexpr,
    KIND: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """Fold window position ``j`` into the accumulators: the max (``best``) or the sum (``j`` row-major over
    the canonical window), or ``found``, the row-major position ``j`` in N, C, D, H, W order of an element
    equal to y (the positions come last to first: the first match is the last written). "indices" folds the
    max and, in ``found``, torch's index rule, positions first to last (N, C, D, H, W order): the first
    input, then each larger element, and with PROPAGATE_NAN each NaN (the last NaN stays). WINDOW, HIGH and
    LINEAR are constants but for a GLOBAL window (the input's sizes at run time). ``e0 .. e4``: where each
    window stops reading, the input's end or an adaptive cell's (HIGH then its smallest cell: offsets below it
    test nothing)."""
    if KIND == "argmax" or KIND == "indices":
        j0, j1, j2, j3, j4 = (
            j // LINEAR[0] % WINDOW[0],
            j // LINEAR[1] % WINDOW[1],
            j // LINEAR[2] % WINDOW[2],
            j // LINEAR[3] % WINDOW[3],
            j // LINEAR[4] % WINDOW[4],
        )
    else:
        j0, j1, j2, j3, j4 = split_constant(j, WINDOW)
    # input positions of the offsets (dilated windows step DILATION positions per offset)
    i0, i1, i2, i3, i4 = j0 * DILATION[0], j1 * DILATION[1], j2 * DILATION[2], j3 * DILATION[3], j4 * DILATION[4]
    ok_row = (
        within(s3 + i3, e3, j3, LOW[3], HIGH[3])
        & within(s0 + i0, e0, j0, LOW[0], HIGH[0])
        & within(s1 + i1, e1, j1, LOW[1], HIGH[1])
        & within(s2 + i2, e2, j2, LOW[2], HIGH[2])
    )
    ok = ok_row[None, :] & (load_cols & within(s4 + i4, e4, j4, LOW[4], HIGH[4]))[:, None]
    # the shift along dims 0-3 is shared by a window row; a unit stride along dim 4 folds into the load's offset
    row_shift = i0 * x_strides[0] + i1 * x_strides[1] + i2 * x_strides[2] + i3 * x_strides[3]
    x_at = (x_tile + row_shift) + i4 * x_strides[4]
    if KIND == "max" or KIND == "indices":
        steps = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
        if PROPAGATE_NAN:  # padding reads -inf; one max.NaN.f32 on sm_90
            x = tl.load(x_at, mask=ok, other=float("-inf")).to(COMPUTE)
            if KIND == "indices":
                found = tl.where(ok & ((x > best) | (x != x) | (found == steps)), j, found)
            best = tl.maximum(best, x, propagate_nan=tl.PropagateNan.ALL)
        else:  # best starts as NaN, which every number replaces
            x = tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
            take = ok & (x == x) & ((x > best) | (best != best))
            if KIND == "indices":
                found = tl.where(take | (ok & (found == steps)), j, found)
            best = tl.where(take, x, best)
    elif KIND == "argmax":
        x = tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
        found = tl.where(ok & ((x == y_value) | ((x != x) & (y_value != y_value))), j, found)
    else:
        total += tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
    return best, found, total


@triton.jit
def window_index(found, s0, s1, s2, s3, s4, WINDOW, LINEAR, DILATION: tl.constexpr, PLANE: tl.constexpr):
    """int64 flat positions in x's spatial plane (PLANE: each dim's weight) of the window positions ``found``
    (row-major in N, C, D, H, W order) of the windows starting at ``s0 .. s4``; -1 where none was found."""
    rows = s0.to(tl.int64) * PLANE[0] + s1.to(tl.int64) * PLANE[1] + s2.to(tl.int64) * PLANE[2]
    rows += s3.to(tl.int64) * PLANE[3]
    starts = rows[None, :] + (s4.to(tl.int64) * PLANE[4])[:, None]
    position = found.to(tl.int64)
    offsets = (
        (position // LINEAR[0] % WINDOW[0]) * (DILATION[0] * PLANE[0])
        + (position // LINEAR[1] % WINDOW[1]) * (DILATION[1] * PLANE[1])
        + (position // LINEAR[2] % WINDOW[2]) * (DILATION[2] * PLANE[2])
        + (position // LINEAR[3] % WINDOW[3]) * (DILATION[3] * PLANE[3])
        + (position // LINEAR[4] % WINDOW[4]) * (DILATION[4] * PLANE[4])
    )
    steps = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
    return tl.where(found < steps, starts + offsets, -1)


@triton.jit
def strip_load(strip_at, start, ok_row, size, fill, SHIFT: tl.constexpr, GRAIN: tl.constexpr, BLOCK_C: tl.constexpr):
    """The (rows, 2 BLOCK_C) strip of input positions ``start + SHIFT + k`` at ``strip_at + SHIFT`` (pointers of
    positions ``start + k``, k < 2 BLOCK_C), ``fill`` outside rows ``ok_row`` and outside 0 .. size - 1; its runs
    of GRAIN positions lie wholly inside or outside the row (whole-vector masks). The shift is added to the
    pointers, not to int32 offsets: ptxas then addresses a shifted strip from the strip's registers
    (an immediate offset) instead of forming one 64-bit address per element."""
    k = tl.arange(0, 2 * BLOCK_C)
    grain_at = start + SHIFT + (k // GRAIN) * GRAIN
    in_row = (grain_at >= 0) & (grain_at < size)
    return tl.load(strip_at + SHIFT, mask=ok_row[:, None] & in_row[None, :], other=fill)


@triton.jit
def left_of_runs(x_base, row_shift, first_column, ok_row, size, fill, GROUP: tl.constexpr, BLOCK_C: tl.constexpr):
    """(rows, BLOCK_C // GROUP): the odd input position just before each run of GROUP pairs of the strip,
    loaded as the second of an aligned (even, odd) pair: the pairs' layout then matches the strip's split
    halves (a thread's run), where single strided positions would get a layout of their own (and shared
    memory conversions)."""
    pair_start = first_column - 2 + 2 * GROUP * tl.arange(0, BLOCK_C // GROUP)
    pair_at = pair_start[:, None] + tl.arange(0, 2)[None, :]
    in_row = (pair_start >= 0) & (pair_start < size)  # a pair lies wholly inside or outside the row
    # (runs, rows, 2) then permuted: the coalescing pass orders equally strided dims first to last, so the runs
    # go first to get the strip's thread order (4 x 8 threads over rows x runs)
    pairs = tl.load(
        x_base + tl.multiple_of(pair_at[:, None, :] + row_shift[None, :, None], (1, 1, 2)),
        mask=in_row[:, None, None] & ok_row[None, :, None],
        other=fill,
    )
    _, odd = tl.split(tl.permute(pairs, (1, 0, 2)))
    return odd


@triton.jit
def shift_right(values, left, GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """``values`` (BLOCK_R, BLOCK_C) moved one column right: column c gets column c - 1, the first column of
    each run of GROUP (1, 2 or 4) gets ``left`` (BLOCK_R, BLOCK_C // GROUP), the value before its run. With
    runs as a thread holds them, only ``left`` crosses threads (one load per run instead of per column)."""
    if GROUP == 1:
        shifted = left
    elif GROUP == 2:
        c0, c1 = tl.split(tl.reshape(values, (BLOCK_R, BLOCK_C // 2, 2)))
        shifted = tl.reshape(tl.join(left, c0), (BLOCK_R, BLOCK_C))
    else:  # runs of 4: columns 4 g + 2 a + b as (g, a, b)
        even, odd = tl.split(tl.reshape(values, (BLOCK_R, BLOCK_C // 4, 2, 2)))
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
        shifted = tl.reshape(tl.join(tl.join(left, c1), tl.join(c0, c2)), (BLOCK_R, BLOCK_C))
    return shifted


@triton.jit
def strip_pool(
    x_ptr,
    b0,
    b1,
    b2,
    x0,
    o1,
    o2,
    s0,
    s1,
    s2,
    s3,
    s4,
    in_sizes,
    out_sizes,
    pads,
    x_strides,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    KIND: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
    STRIP: tl.constexpr,
    LEFT_GROUP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Max or sum over windows of stride 2 along unit-stride input rows (NCHW), read as contiguous strips:
    per window row, the strip at shift q (input positions 2 c0 + 2 q + k, k < 2 BLOCK_C, c0 the tile's
    first column) is one vector load per STRIP elements, reshaped into (column, 2) pairs and split: its
    even / odd halves hold, for every column c of the tile, the taps at window offsets 2 q - pad and
    2 q + 1 - pad. Taps come in window order (row-major, as ``window_step``'s). Returns (BLOCK_C, BLOCK_R)
    like the general path. STRIP (elements) divides the input's row strides, its row length and 2 BLOCK_C:
    rows are STRIP-aligned, and a vector of the strip lies wholly inside or outside its row."""
    rows = row_offset((x0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], s3, x_strides, WIDE)
    x_base = x_ptr + outer_offset(
        b0 * STRIDE[0] - pads[0], b1 * STRIDE[1] - pads[1], b2 * STRIDE[2] - pads[2], x_strides
    )  # its alignment: Triton's, from the strides' specialization
    first_column = 2 * column_start(out_sizes, BLOCK_C)
    k = tl.arange(0, 2 * BLOCK_C)
    best = tl.full((BLOCK_R, BLOCK_C), float("-inf") if PROPAGATE_NAN else float("nan"), COMPUTE)
    total = tl.zeros((BLOCK_R, BLOCK_C), COMPUTE)
    first_shift: tl.constexpr = -((LOW[4] + 1) // 2)
    shifts: tl.constexpr = (WINDOW[4] - 1 - LOW[4] - 2 * first_shift) // 2 + 1
    window_rows: tl.constexpr = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3]
    for i in tl.static_range(window_rows):
        j0, j1, j2, j3, _ = split_constant(i * WINDOW[4], WINDOW)
        ok_row = (
            within(s3 + j3, in_sizes[3], j3, LOW[3], HIGH[3])
            & within(s0 + j0, in_sizes[0], j0, LOW[0], HIGH[0])
            & within(s1 + j1, in_sizes[1], j1, LOW[1], HIGH[1])
            & within(s2 + j2, in_sizes[2], j2, LOW[2], HIGH[2])
        )
        row_shift = rows + (j0 * x_strides[0] + j1 * x_strides[1] + j2 * x_strides[2] + j3 * x_strides[3])
        # runs of STRIP positions start aligned (the hint that makes the loads vectors; see _strip_alignment)
        strip_at = x_base + tl.multiple_of(row_shift[:, None] + (first_column + k)[None, :], (1, STRIP))
        fill = float("-inf") if KIND == "max" and PROPAGATE_NAN else 0.0
        strip = strip_load(strip_at, first_column, ok_row, in_sizes[4], fill, 0, STRIP, BLOCK_C)
        main_even, main_odd = tl.split(tl.reshape(strip, (BLOCK_R, BLOCK_C, 2)))
        for qi in tl.static_range(shifts):
            q = first_shift + qi
            if q == 0:
                even, odd = main_even, main_odd
            elif q == -1 and LEFT_GROUP > 0:  # the odd position left of each pair: the main strip's, shifted
                even = main_even  # (not used: padding 1, the window starts at the odd position)
                odd = shift_right(
                    main_odd,
                    left_of_runs(x_base, row_shift, first_column, ok_row, in_sizes[4], fill, LEFT_GROUP, BLOCK_C),
                    LEFT_GROUP,
                    BLOCK_R,
                    BLOCK_C,
                )
            else:  # STRIP >= 2: a strip shifted by whole (even, odd) pairs starts 2-aligned
                strip = strip_load(strip_at, first_column, ok_row, in_sizes[4], fill, 2 * q, 2, BLOCK_C)
                even, odd = tl.split(tl.reshape(strip, (BLOCK_R, BLOCK_C, 2)))
            for r in tl.static_range(2):
                j4 = 2 * q + r + LOW[4]
                if j4 >= 0 and j4 < WINDOW[4]:
                    if r == 0:
                        x = even.to(COMPUTE)
                    else:
                        x = odd.to(COMPUTE)
                    if KIND == "max":
                        if PROPAGATE_NAN:
                            best = tl.maximum(best, x, propagate_nan=tl.PropagateNan.ALL)
                        else:
                            ok = ok_row[:, None] & within(s4 + j4, in_sizes[4], j4, LOW[4], HIGH[4])[None, :]
                            best = tl.where(ok & (x == x) & ((x > best) | (best != best)), x, best)
                    else:
                        total += x
    return tl.trans(best), tl.trans(total)


@triton.jit
def pool_forward_kernel(
    x_ptr,
    y_ptr,
    argmax_ptr,
    in_sizes,
    out_sizes,
    pads,
    x_strides,
    y_strides,
    argmax_strides,
    alpha: tl.float64,
    beta: tl.float64,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    CLIPPED: tl.constexpr,
    ADAPTIVE: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    LINEAR: tl.constexpr,
    DILATION: tl.constexpr,
    PLANE: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    UNROLL: tl.constexpr,
    GLOBAL: tl.constexpr,
    CARRY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
    FULL_COLUMNS: tl.constexpr,
    STRIP: tl.constexpr,
    LEFT_GROUP: tl.constexpr,
    Y_VECTOR: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program: BLOCK_R rows x BLOCK_C columns of outputs (held as BLOCK_C x BLOCK_R). KIND "max" and "avg"
    write y = alpha * pool(x) + beta * y; "indices" writes max's y and, at ``argmax_ptr``, torch's int64
    index of each window's max: its flat position in x's spatial plane (PLANE: each dim's weight in it);
    "argmax" reads y and writes, per output, the row-major window position of the first element of x equal
    to it (the window's size when none is). Window offsets step DILATION input positions. GLOBAL: each
    window is the whole input along the dims it pools (one output there; WINDOW, HIGH and LINEAR None):
    its sizes are taken at run time, so one compiled kernel serves every input size; a GLOBAL "argmax" cuts
    the window into as many slices of whole LOOP_CHUNKs as grid axis 1 has programs, each program writing its
    slice's first match (or the window's size) at slice ``program_id(1)`` of the scratch. ADAPTIVE dims (torch's
    adaptive cells of varying size or step; stride 1, no padding, WINDOW the largest cell) compute each
    window's start and end from the cells' formula and mask the offsets past its end."""
    b0, b1, b2, o0, o1, o2, o3, cols = program_tile(out_sizes, BLOCK_R, BLOCK_C, CARRY)
    row_ok = o0 < out_sizes[0]
    col_ok = cols < out_sizes[4]
    # rows past the output read the last row's windows (valid addresses: no tile mask on the loads), and so
    # do strided columns (scalar loads); contiguous ones keep their mask (a min() would cost the vector loads)
    # unless BLOCK_C divides the columns (FULL_COLUMNS): unpredicated loads, which ptxas keeps more of in flight
    x0 = tl.minimum(o0, out_sizes[0] - 1)
    if STRIDE[4] > 1:
        x4 = tl.minimum(cols, out_sizes[4] - 1)
        load_cols = cols >= 0
    elif FULL_COLUMNS:
        x4 = cols
        load_cols = cols >= 0
    else:
        x4 = cols
        load_cols = col_ok
    if ADAPTIVE[0] or ADAPTIVE[1] or ADAPTIVE[2] or ADAPTIVE[3] or ADAPTIVE[4]:  # (else: no helper calls)
        s0 = cell_start(x0, in_sizes[0], out_sizes[0], STRIDE[0], pads[0], ADAPTIVE[0])
        s1 = cell_start(o1, in_sizes[1], out_sizes[1], STRIDE[1], pads[1], ADAPTIVE[1])
        s2 = cell_start(o2, in_sizes[2], out_sizes[2], STRIDE[2], pads[2], ADAPTIVE[2])
        s3 = cell_start(o3, in_sizes[3], out_sizes[3], STRIDE[3], pads[3], ADAPTIVE[3])
        s4 = cell_start(x4, in_sizes[4], out_sizes[4], STRIDE[4], pads[4], ADAPTIVE[4])
        # where each window stops reading: an adaptive cell's end, or the input's
        e0 = cell_end(x0, in_sizes[0], out_sizes[0], ADAPTIVE[0])
        e1 = cell_end(o1, in_sizes[1], out_sizes[1], ADAPTIVE[1])
        e2 = cell_end(o2, in_sizes[2], out_sizes[2], ADAPTIVE[2])
        e3 = cell_end(o3, in_sizes[3], out_sizes[3], ADAPTIVE[3])
        e4 = cell_end(x4, in_sizes[4], out_sizes[4], ADAPTIVE[4])
        base0 = cell_start(b0, in_sizes[0], out_sizes[0], STRIDE[0], pads[0], ADAPTIVE[0])
        base1 = cell_start(b1, in_sizes[1], out_sizes[1], STRIDE[1], pads[1], ADAPTIVE[1])
        base2 = cell_start(b2, in_sizes[2], out_sizes[2], STRIDE[2], pads[2], ADAPTIVE[2])
        x_tile = (
            x_ptr
            + outer_offset(base0, base1, base2, x_strides)
            + tile_offset(
                cell_shift(x0, b0, s0, base0, STRIDE[0], ADAPTIVE[0]),
                cell_shift(o1, b1, s1, base1, STRIDE[1], ADAPTIVE[1]),
                cell_shift(o2, b2, s2, base2, STRIDE[2], ADAPTIVE[2]),
                s3,
                s4,
                x_strides,
                WIDE,
            )
        )
    else:  # (inlined helpers, even empty ones, add debug labels that moved ptxas's register allocation)
        s0 = x0 * STRIDE[0] - pads[0]
        s1 = o1 * STRIDE[1] - pads[1]
        s2 = o2 * STRIDE[2] - pads[2]
        s3 = o3 * STRIDE[3] - pads[3]
        s4 = x4 * STRIDE[4] - pads[4]
        e0, e1, e2, e3, e4 = in_sizes[0], in_sizes[1], in_sizes[2], in_sizes[3], in_sizes[4]
        x_tile = (
            x_ptr
            + outer_offset(b0 * STRIDE[0] - pads[0], b1 * STRIDE[1] - pads[1], b2 * STRIDE[2] - pads[2], x_strides)
            + tile_offset((x0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], s3, s4, x_strides, WIDE)
        )
    # (the sum written out here: a hint on a helper's result is lost when the helper is inlined)
    y_offsets = (
        row_offset(o0 - b0, o1 - b1, o2 - b2, o3, y_strides, WIDE)[None, :]
        + column_offset(cols, y_strides, WIDE)[:, None]
    )
    if Y_VECTOR > 1:  # runs of Y_VECTOR columns start aligned and lie wholly inside or outside y's rows
        y_offsets = tl.multiple_of(y_offsets, (Y_VECTOR, 1))
        col_ok = (cols // Y_VECTOR) * Y_VECTOR < out_sizes[4]
    mask = row_ok[None, :] & col_ok[:, None]
    y_at = y_ptr + outer_offset(b0, b1, b2, y_strides) + y_offsets

    y_value = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    if KIND == "argmax":
        y_value = tl.load(y_at, mask=mask, other=0.0).to(COMPUTE)
    best = tl.full((BLOCK_C, BLOCK_R), float("-inf") if PROPAGATE_NAN else float("nan"), COMPUTE)
    if not GLOBAL:  # the window's shape as constants
        window: tl.constexpr = WINDOW
        high: tl.constexpr = HIGH
        linear: tl.constexpr = LINEAR
        steps: tl.constexpr = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
        first: tl.constexpr = (steps - 1) * (KIND == "argmax")  # argmax: the window's positions last to first
    else:  # no offset leaves the input: the window's end is the input's
        window, linear, steps = global_window(in_sizes, out_sizes)
        high = window
        first = (steps - 1) * (KIND == "argmax")
    found = tl.full((BLOCK_C, BLOCK_R), steps, tl.int32)
    total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    step: tl.constexpr = 1 - 2 * (KIND == "argmax")
    if STRIP:
        best, total = strip_pool(
            x_ptr,
            b0,
            b1,
            b2,
            x0,
            o1,
            o2,
            s0,
            s1,
            s2,
            s3,
            s4,
            in_sizes,
            out_sizes,
            pads,
            x_strides,
            WINDOW,
            STRIDE,
            LOW,
            HIGH,
            KIND,
            PROPAGATE_NAN,
            WIDE,
            COMPUTE,
            STRIP,
            LEFT_GROUP,
            BLOCK_R,
            BLOCK_C,
        )
    elif UNROLL:
        for i in tl.static_range(steps):
            best, found, total = window_step(
                first + step * i,
                x_tile,
                s0,
                s1,
                s2,
                s3,
                s4,
                e0,
                e1,
                e2,
                e3,
                e4,
                load_cols,
                x_strides,
                best,
                found,
                total,
                y_value,
                WINDOW,
                LOW,
                HIGH,
                LINEAR,
                DILATION,
                KIND,
                PROPAGATE_NAN,
                COMPUTE,
            )
    else:  # LOOP_CHUNK positions unrolled at a time (their loads in flight), the last chunk masked
        walked = steps
        if GLOBAL and KIND == "argmax":  # this program's slice of the window (grid axis 1), last to first
            start, end = window_run(steps, LOOP_CHUNK)
            walked = end - start
            first = end - 1
        for chunk in range(0, walked, LOOP_CHUNK):
            for i in tl.static_range(LOOP_CHUNK):
                best, found, total = window_step(
                    first + step * (chunk + i),
                    x_tile,
                    s0,
                    s1,
                    s2,
                    s3,
                    s4,
                    e0,
                    e1,
                    e2,
                    e3,
                    e4,
                    load_cols & (chunk + i < walked),
                    x_strides,
                    best,
                    found,
                    total,
                    y_value,
                    window,
                    LOW,
                    high,
                    linear,
                    DILATION,
                    KIND,
                    PROPAGATE_NAN,
                    COMPUTE,
                )

    if KIND == "argmax" or KIND == "indices":
        argmax_at = (
            argmax_ptr
            + outer_offset(b0, b1, b2, argmax_strides)
            + tile_offset(o0 - b0, o1 - b1, o2 - b2, o3, cols, argmax_strides, WIDE)
        )
    if KIND == "argmax":
        if GLOBAL:  # the scratch holds a slice after another, each of y's size
            argmax_at += tl.program_id(1) * (out_sizes[0] * out_sizes[1] * out_sizes[2] * out_sizes[3] * out_sizes[4])
        tl.store(argmax_at, found.to(argmax_ptr.dtype.element_ty), mask=mask)
    else:
        if KIND == "indices":
            tl.store(argmax_at, window_index(found, s0, s1, s2, s3, s4, window, linear, DILATION, PLANE), mask=mask)
            best = tl.where(found < steps, best, float("nan"))  # a window of padding alone (dilated) holds no max
        if KIND == "max" or KIND == "indices":
            result = best
        else:
            counts = window_counts(
                s0, s1, s2, s3, s4, e0, e1, e2, e3, e4, in_sizes, pads, window, CLIPPED, ADAPTIVE, INCLUDE_PADDING
            )
            result = total / counts.to(COMPUTE)
        result = result * tl.cast(alpha, COMPUTE)
        if HAS_BETA:
            result += tl.cast(beta, COMPUTE) * tl.load(y_at, mask=mask).to(COMPUTE)
        tl.store(y_at, result.to(y_ptr.dtype.element_ty), mask=mask)
