"""Pooling forward and backward (max, average including / excluding padding; 1, 2 and 3 spatial
dims; any strides): a forward kernel that also finds the argmax for the backward, and a gather
backward kernel.

Memory model (bytes of the tensors' dtype; E = x's elements, F = y's elements):
- forward reads x once and writes y once: E + F (F more with beta != 0). Each element of x is
  loaded once per window that holds it, but the windows of one program overlap in L1/L2, so DRAM
  sees x once. 64 x 256 x 56 x 56 float32 with 3x3 stride 2: 206 MB + 51 MB, 0.061 ms at 4.2 TB/s.
- max backward, two passes: (1) the forward kernel reads x and y and writes, per output, the
  position in its window of the first element equal to y (int8 for windows of up to 127
  positions): E + F + F/4 for float32; (2) the gather reads those positions and dy and writes dx
  once: F/4 + F + E. Average backward is the gather alone, on dy: F + E.
FLOPs: one compare or add per window position: memory-bound.

Layout: the tensors become five canonical dims (N, C, D, H, W; missing spatial dims of size 1,
window 1), reordered so that the walked dim with the smallest stride (C for NHWC, W for NCHW) comes
last and the one with the next smallest (W for NHWC, H for NCHW) before it. A program owns BLOCK_R
rows (the four outer dims, flattened) by BLOCK_C positions of the last dim, held as a (BLOCK_C,
BLOCK_R) tensor: Triton's coalescing pass puts the lanes along dim 0 when no dim is contiguous (NCHW
with stride 2), so a warp's load spans 32 neighbouring positions of one row; in NHWC the last dim is
contiguous and the loads are vectorized along it. The program splits its first row index once; the
other rows' coordinates come from compares and carries (no division per element: int64 divisions per
row would be most of the kernel's instructions and registers on sm_90). Offsets are an int64
scalar base per tile plus int32 per element (int64 only for tensors past 2**31 elements). The window
loop is unrolled over the constexpr window (a plain loop for windows over UNROLL_LIMIT positions).

Strips (forward, stride 2 along unit-stride input rows: NCHW): instead of one strided scalar load per
window position and output, each window row is read as a contiguous strip of 2 x BLOCK_C input positions
per tile row (16-byte vector loads: the launcher proves the rows aligned, ``_strip_alignment``, and the
kernel says so with ``tl.multiple_of``), reshaped into (column, 2) pairs and split into even and odd
positions: with padding 1 a 3-wide window takes odd[c - 1], even[c], odd[c], and odd[c - 1] is the odd
half shifted one column in registers (``shift_right``) plus one load per thread's run of columns (the
value left of the run). Outputs are stored as vectors too (``Y_VECTOR``).

Backward gather: each input position ``i = o * stride - padding + r`` belongs to exactly one cell
``o`` (``r`` in ``0 .. stride - 1``), so a program owns a tile of cells and, for each phase ``r``,
writes dx at the cell's input positions: the sum over the windows ``o - q`` that hold ``i`` (window
offset ``r + q * stride < window``) of their dy, where that window's argmax is this offset (max) or
divided by the window's count (averages). Each window's dy (and argmax) is loaded once per cell and
shared by every phase (one sum per phase, the stores last). Every element of dx is written once, no
atomics, in a fixed order: the results are bitwise repeatable.

Masks: rows past the output (and, for strided columns, columns past it) read the last row's or
column's window, so the forward's loads carry no tile mask, only its stores. A position is tested
against the input's start only at the window offsets under the padding, and against its end only at
the offsets where the last window overhangs it (constants of the launch): with 3x3 windows, stride 2,
padding 1 on 56 positions, 4 of 9 offsets test nothing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.pooling.problem import PoolingProblem
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

CANONICAL_DIMS = 5
UNROLL_LIMIT = 64  # window positions (or phase x shift pairs) unrolled in full
FORWARD_TILE = 512  # outputs of a forward program (H200, NHWC 3x3 max fwd: 512 beat 1024, 2048 and 4096)
STRIP_TILE = 1024  # outputs of a forward program reading stride-2 windows as contiguous strips (NCHW)
STRIP_WARPS = 4  # 8 outputs per thread (H200 sweep: 3x3 max bf16 33.0 us at 4 warps, 33.9 at 2, 42.2 at 8)
STRIP_BYTES = 16  # widest vector of a strip load (0: no strips, every forward takes the general path)
ARGMAX_TILE = 1024  # outputs of an argmax program (it holds y and positions too), half for strided loads
BACKWARD_TILE = 512  # cells of a backward program: each writes prod(stride) elements of dx (registers)
MAX_INNER_BLOCK = 256
NARROW_SCALE = 2  # tiles of dtypes under 4 bytes with contiguous columns: this many times the elements
INT32_LIMIT = 2**31 - 1


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
def split_constant(index, SIZES: tl.constexpr):
    """Coordinates of ``index`` over five constexpr sizes (last fastest)."""
    c4 = index % SIZES[4]
    index = index // SIZES[4]
    c3 = index % SIZES[3]
    index = index // SIZES[3]
    c2 = index % SIZES[2]
    index = index // SIZES[2]
    return index // SIZES[1], index % SIZES[1], c2, c3, c4


@triton.jit
def within(position, size, j, LOW: tl.constexpr, HIGH: tl.constexpr):
    """0 <= position < size for a position at window offset ``j``, testing only the ends that offset can
    pass: before the input when ``j < LOW`` (the padding), past its end when ``j >= HIGH`` (where the last
    window overhangs): a constant offset of the unrolled loop tests one end or none."""
    return ((position >= 0) | (j >= LOW)) & ((position < size) | (j < HIGH))


@triton.jit
def window_count(start, size, pad, WINDOW: tl.constexpr, CLIPPED: tl.constexpr, INCLUDE_PADDING: tl.constexpr):
    """Positions a window starting at ``start`` counts along one dim: up to the end of the trailing
    padding (INCLUDE_PADDING) or inside the input only; the window where no window is CLIPPED."""
    if not CLIPPED:
        count = start * 0 + WINDOW
    elif INCLUDE_PADDING:
        count = tl.minimum(start + WINDOW, size + pad) - start
    else:
        count = tl.minimum(start + WINDOW, size) - tl.maximum(start, 0)
    return count


@triton.jit
def window_counts(
    s0, s1, s2, s3, s4, sizes, pads, WINDOW: tl.constexpr, CLIPPED: tl.constexpr, INCLUDE_PADDING: tl.constexpr
):
    """The (columns, rows) tile of window counts: a scalar (dims 0-2) x a per-row x a per-column factor."""
    rows = (
        window_count(s0, sizes[0], pads[0], WINDOW[0], CLIPPED[0], INCLUDE_PADDING)
        * window_count(s1, sizes[1], pads[1], WINDOW[1], CLIPPED[1], INCLUDE_PADDING)
        * window_count(s2, sizes[2], pads[2], WINDOW[2], CLIPPED[2], INCLUDE_PADDING)
        * window_count(s3, sizes[3], pads[3], WINDOW[3], CLIPPED[3], INCLUDE_PADDING)
    )
    counts = rows[None, :] * window_count(s4, sizes[4], pads[4], WINDOW[4], CLIPPED[4], INCLUDE_PADDING)[:, None]
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
    load_cols,
    in_sizes,
    x_strides,
    best,
    found,
    total,
    y_value,
    WINDOW: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    LINEAR: tl.constexpr,
    KIND: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """Fold window position ``j`` into the accumulators: the max (``best``) or the sum (``j`` row-major over
    the canonical window), or ``found``, the row-major position ``j`` in N, C, D, H, W order of an element
    equal to y (the positions come last to first: the first match is the last written)."""
    if KIND == "argmax":
        j0, j1, j2, j3, j4 = (
            j // LINEAR[0] % WINDOW[0],
            j // LINEAR[1] % WINDOW[1],
            j // LINEAR[2] % WINDOW[2],
            j // LINEAR[3] % WINDOW[3],
            j // LINEAR[4] % WINDOW[4],
        )
    else:
        j0, j1, j2, j3, j4 = split_constant(j, WINDOW)
    ok_row = (
        within(s3 + j3, in_sizes[3], j3, LOW[3], HIGH[3])
        & within(s0 + j0, in_sizes[0], j0, LOW[0], HIGH[0])
        & within(s1 + j1, in_sizes[1], j1, LOW[1], HIGH[1])
        & within(s2 + j2, in_sizes[2], j2, LOW[2], HIGH[2])
    )
    ok = ok_row[None, :] & (load_cols & within(s4 + j4, in_sizes[4], j4, LOW[4], HIGH[4]))[:, None]
    # the shift along dims 0-3 is shared by a window row; a unit stride along dim 4 folds into the load's offset
    row_shift = j0 * x_strides[0] + j1 * x_strides[1] + j2 * x_strides[2] + j3 * x_strides[3]
    x_at = (x_tile + row_shift) + j4 * x_strides[4]
    if KIND == "max":
        if PROPAGATE_NAN:  # padding reads -inf; one max.NaN.f32 on sm_90
            x = tl.load(x_at, mask=ok, other=float("-inf")).to(COMPUTE)
            best = tl.maximum(best, x, propagate_nan=tl.PropagateNan.ALL)
        else:  # best starts as NaN, which every number replaces
            x = tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
            best = tl.where(ok & (x == x) & ((x > best) | (best != best)), x, best)
    elif KIND == "argmax":
        x = tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
        found = tl.where(ok & ((x == y_value) | ((x != x) & (y_value != y_value))), j, found)
    else:
        total += tl.load(x_at, mask=ok, other=0.0).to(COMPUTE)
    return best, found, total


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
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    LINEAR: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    UNROLL: tl.constexpr,
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
    write y = alpha * pool(x) + beta * y; "argmax" reads y and writes, per output, the row-major window
    position of the first element of x equal to it (the window's size when none is)."""
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
    s0 = x0 * STRIDE[0] - pads[0]
    s1 = o1 * STRIDE[1] - pads[1]
    s2 = o2 * STRIDE[2] - pads[2]
    s3 = o3 * STRIDE[3] - pads[3]
    s4 = x4 * STRIDE[4] - pads[4]
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
    steps: tl.constexpr = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
    found = tl.full((BLOCK_C, BLOCK_R), steps, tl.int32)
    total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    first: tl.constexpr = (steps - 1) * (KIND == "argmax")  # argmax: the window's positions last to first
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
                load_cols,
                in_sizes,
                x_strides,
                best,
                found,
                total,
                y_value,
                WINDOW,
                LOW,
                HIGH,
                LINEAR,
                KIND,
                PROPAGATE_NAN,
                COMPUTE,
            )
    else:
        for i in range(steps):
            best, found, total = window_step(
                first + step * i,
                x_tile,
                s0,
                s1,
                s2,
                s3,
                s4,
                load_cols,
                in_sizes,
                x_strides,
                best,
                found,
                total,
                y_value,
                WINDOW,
                LOW,
                HIGH,
                LINEAR,
                KIND,
                PROPAGATE_NAN,
                COMPUTE,
            )

    if KIND == "argmax":
        argmax_at = (
            argmax_ptr
            + outer_offset(b0, b1, b2, argmax_strides)
            + tile_offset(o0 - b0, o1 - b1, o2 - b2, o3, cols, argmax_strides, WIDE)
        )
        tl.store(argmax_at, found.to(argmax_ptr.dtype.element_ty), mask=mask)
    else:
        if KIND == "max":
            result = best
        else:
            counts = window_counts(s0, s1, s2, s3, s4, in_sizes, pads, WINDOW, CLIPPED, INCLUDE_PADDING)
            result = total / counts.to(COMPUTE)
        result = result * tl.cast(alpha, COMPUTE)
        if HAS_BETA:
            result += tl.cast(beta, COMPUTE) * tl.load(y_at, mask=mask).to(COMPUTE)
        tl.store(y_at, result.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def window_values(
    q,
    b0,
    b1,
    b2,
    o0,
    o1,
    o2,
    o3,
    o4,
    tile_ok,
    dy_ptr,
    argmax_ptr,
    in_sizes,
    out_sizes,
    pads,
    dy_strides,
    argmax_strides,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    CLIPPED: tl.constexpr,
    SHIFTS: tl.constexpr,
    LAST_SHIFT: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    ARGMAX_LIKE_DY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """dy of the windows ``o - q`` of the cells ``o`` (0 outside the output; divided by the window's count
    for averages) and, for max, their argmax positions: loaded once, shared by every phase."""
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    w0, w1, w2, w3, w4 = o0 - q0, o1 - q1, o2 - q2, o3 - q3, o4 - q4
    # o - q < 0 only when q > 0; past the output only when q < cells - outputs (offset -q against LAST_SHIFT)
    w_row = (
        within(w3, out_sizes[3], -q3, 0, LAST_SHIFT[3])
        & within(w0, out_sizes[0], -q0, 0, LAST_SHIFT[0])
        & within(w1, out_sizes[1], -q1, 0, LAST_SHIFT[1])
        & within(w2, out_sizes[2], -q2, 0, LAST_SHIFT[2])
    )
    ok = tile_ok & w_row[None, :] & within(w4, out_sizes[4], -q4, 0, LAST_SHIFT[4])[:, None]
    dy_at = (
        dy_ptr
        + outer_offset(b0 - q0, b1 - q1, b2 - q2, dy_strides)
        + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, dy_strides, WIDE)
    )
    gradient = tl.load(dy_at, mask=ok, other=0.0).to(COMPUTE)
    if KIND == "max":
        if ARGMAX_LIKE_DY:  # the same offsets as dy's, computed once
            argmax_strides = dy_strides
        argmax_at = (
            argmax_ptr
            + outer_offset(b0 - q0, b1 - q1, b2 - q2, argmax_strides)
            + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, argmax_strides, WIDE)
        )
        positions = tl.load(argmax_at, mask=ok, other=-1).to(tl.int32)
    else:
        counts = window_counts(
            w0 * STRIDE[0] - pads[0],
            w1 * STRIDE[1] - pads[1],
            w2 * STRIDE[2] - pads[2],
            w3 * STRIDE[3] - pads[3],
            w4 * STRIDE[4] - pads[4],
            in_sizes,
            pads,
            WINDOW,
            CLIPPED,
            INCLUDE_PADDING,
        )
        gradient = gradient / counts.to(COMPUTE)
        positions = ok.to(tl.int32)  # not read by averages
    return gradient, positions


@triton.jit
def window_share(
    gradient,
    positions,
    phase,
    q,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    SHIFTS: tl.constexpr,
    LINEAR: tl.constexpr,
    KIND: tl.constexpr,
):
    """What window ``o - q`` sends to the input position at offset ``r + q * stride`` of it (``r`` the
    phase): its dy where that offset is its argmax (max) or its dy / count; 0 past the window's end."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    j0, j1, j2, j3, j4 = (
        r0 + q0 * STRIDE[0],
        r1 + q1 * STRIDE[1],
        r2 + q2 * STRIDE[2],
        r3 + q3 * STRIDE[3],
        r4 + q4 * STRIDE[4],
    )
    in_window = (j0 < WINDOW[0]) & (j1 < WINDOW[1]) & (j2 < WINDOW[2]) & (j3 < WINDOW[3]) & (j4 < WINDOW[4])
    if KIND == "max":
        linear = j0 * LINEAR[0] + j1 * LINEAR[1] + j2 * LINEAR[2] + j3 * LINEAR[3] + j4 * LINEAR[4]
        share = tl.where(in_window & (positions == linear), gradient, 0.0)
    else:
        share = tl.where(in_window, gradient, 0.0)
    return share


@triton.jit
def store_phase(
    total,
    phase,
    b0,
    b1,
    b2,
    o0,
    o1,
    o2,
    o3,
    o4,
    row_ok,
    col_ok,
    dx_ptr,
    in_sizes,
    pads,
    dx_strides,
    alpha,
    beta,
    STRIDE: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    HAS_BETA: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """dx = alpha * total + beta * dx at the input positions ``o * stride - padding + r`` of the cells
    ``o`` (``r`` the phase) that lie inside x: tested before its start for phases under the padding
    (LOW), past its end for phases from HIGH (the last cell's)."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    i0 = o0 * STRIDE[0] - pads[0] + r0
    i1 = o1 * STRIDE[1] - pads[1] + r1
    i2 = o2 * STRIDE[2] - pads[2] + r2
    i3 = o3 * STRIDE[3] - pads[3] + r3
    i4 = o4 * STRIDE[4] - pads[4] + r4
    in_row = (
        row_ok
        & within(i3, in_sizes[3], r3, LOW[3], HIGH[3])
        & within(i0, in_sizes[0], r0, LOW[0], HIGH[0])
        & within(i1, in_sizes[1], r1, LOW[1], HIGH[1])
        & within(i2, in_sizes[2], r2, LOW[2], HIGH[2])
    )
    in_ok = in_row[None, :] & (col_ok & within(i4, in_sizes[4], r4, LOW[4], HIGH[4]))[:, None]
    dx_at = (
        dx_ptr
        + outer_offset(
            b0 * STRIDE[0] - pads[0] + r0, b1 * STRIDE[1] - pads[1] + r1, b2 * STRIDE[2] - pads[2] + r2, dx_strides
        )
        + tile_offset((o0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], i3, i4, dx_strides, WIDE)
    )
    result = total * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        result += tl.cast(beta, COMPUTE) * tl.load(dx_at, mask=in_ok).to(COMPUTE)
    tl.store(dx_at, result.to(dx_ptr.dtype.element_ty), mask=in_ok)


@triton.jit
def pool_backward_kernel(
    dy_ptr,
    argmax_ptr,
    dx_ptr,
    in_sizes,
    out_sizes,
    cell_sizes,
    pads,
    dy_strides,
    argmax_strides,
    dx_strides,
    alpha: tl.float64,
    beta: tl.float64,
    WINDOW: tl.constexpr,
    STRIDE: tl.constexpr,
    CLIPPED: tl.constexpr,
    LOW: tl.constexpr,
    HIGH: tl.constexpr,
    SHIFTS: tl.constexpr,
    LAST_SHIFT: tl.constexpr,
    LINEAR: tl.constexpr,
    KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr,
    HAS_BETA: tl.constexpr,
    UNROLL: tl.constexpr,
    ARGMAX_LIKE_DY: tl.constexpr,
    CARRY: tl.constexpr,
    WIDE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program: BLOCK_R rows x BLOCK_C columns of cells (held as BLOCK_C x BLOCK_R); writes dx at every
    input position of those cells. UNROLL: window by window (each window's dy and argmax loaded once,
    one sum per phase, the stores last); else phase by phase, every window loaded per phase."""
    b0, b1, b2, o0, o1, o2, o3, o4 = program_tile(cell_sizes, BLOCK_R, BLOCK_C, CARRY)
    row_ok = o0 < cell_sizes[0]
    col_ok = o4 < cell_sizes[4]
    tile_ok = row_ok[None, :] & col_ok[:, None]
    phases: tl.constexpr = STRIDE[0] * STRIDE[1] * STRIDE[2] * STRIDE[3] * STRIDE[4]
    shifts: tl.constexpr = SHIFTS[0] * SHIFTS[1] * SHIFTS[2] * SHIFTS[3] * SHIFTS[4]
    if UNROLL:
        totals = ()
        for _ in tl.static_range(phases):
            totals = totals + (tl.zeros((BLOCK_C, BLOCK_R), COMPUTE),)
        for q in tl.static_range(shifts):
            gradient, positions = window_values(
                q,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                tile_ok,
                dy_ptr,
                argmax_ptr,
                in_sizes,
                out_sizes,
                pads,
                dy_strides,
                argmax_strides,
                WINDOW,
                STRIDE,
                CLIPPED,
                SHIFTS,
                LAST_SHIFT,
                KIND,
                INCLUDE_PADDING,
                ARGMAX_LIKE_DY,
                WIDE,
                COMPUTE,
            )
            summed = ()
            for phase in tl.static_range(phases):
                summed = summed + (
                    totals[phase] + window_share(gradient, positions, phase, q, WINDOW, STRIDE, SHIFTS, LINEAR, KIND),
                )
            totals = summed
        for phase in tl.static_range(phases):
            store_phase(
                totals[phase],
                phase,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                row_ok,
                col_ok,
                dx_ptr,
                in_sizes,
                pads,
                dx_strides,
                alpha,
                beta,
                STRIDE,
                LOW,
                HIGH,
                HAS_BETA,
                WIDE,
                COMPUTE,
            )
    else:
        for phase in range(phases):
            total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
            for q in range(shifts):
                gradient, positions = window_values(
                    q,
                    b0,
                    b1,
                    b2,
                    o0,
                    o1,
                    o2,
                    o3,
                    o4,
                    tile_ok,
                    dy_ptr,
                    argmax_ptr,
                    in_sizes,
                    out_sizes,
                    pads,
                    dy_strides,
                    argmax_strides,
                    WINDOW,
                    STRIDE,
                    CLIPPED,
                    SHIFTS,
                    LAST_SHIFT,
                    KIND,
                    INCLUDE_PADDING,
                    ARGMAX_LIKE_DY,
                    WIDE,
                    COMPUTE,
                )
                total += window_share(gradient, positions, phase, q, WINDOW, STRIDE, SHIFTS, LINEAR, KIND)
            store_phase(
                total,
                phase,
                b0,
                b1,
                b2,
                o0,
                o1,
                o2,
                o3,
                o4,
                row_ok,
                col_ok,
                dx_ptr,
                in_sizes,
                pads,
                dx_strides,
                alpha,
                beta,
                STRIDE,
                LOW,
                HIGH,
                HAS_BETA,
                WIDE,
                COMPUTE,
            )


# launcher ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanonicalPooling:
    """The problem on five dims (N, C, D, H, W) reordered so that the innermost dim comes last."""

    order: tuple[int, ...]  # canonical dim -> original dim (N, C, D, H, W numbering)
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pads: tuple[int, ...]
    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    linear: tuple[int, ...]  # weight of each dim's window offset in the row-major window position

    def permute(self, values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in self.order)

    @property
    def overhang(self) -> tuple[int, ...]:
        """Per dim, the first window offset at which the last window passes the input's end (the window's
        size when none does); the offsets under the padding are the ones that can fall before its start."""
        return tuple(
            min(n + p - (o - 1) * s, w)
            for w, s, p, n, o in zip(self.window, self.stride, self.pads, self.in_sizes, self.out_sizes)
        )

    @property
    def clipped(self) -> tuple[bool, ...]:
        """Per dim, whether a window may reach past the input (padding, or ceil mode's last window): the
        kernels count windows' sizes only along those dims."""
        return tuple(p > 0 or h < w for p, h, w in zip(self.pads, self.overhang, self.window))


def _five(values: tuple[int, ...], lead: int, fill: int) -> tuple[int, ...]:
    """(N, C, *spatial) values widened to (N, C, D, H, W) with ``fill`` for the missing leading spatial dims."""
    return (*values[:2], *(fill,) * lead, *values[2:])


def canonical(problem: PoolingProblem, inner_strides: tuple[int, ...], cells: bool) -> CanonicalPooling:
    """The canonical form: last the dim of smallest ``inner_strides`` among those the tile walks (more
    than one output, or more than one cell when ``cells``), before it the walked dim of next smallest
    stride (the tile's rows), the others in N, C, D, H, W order (one position per program)."""
    lead = 3 - len(problem.window)
    window = (1, 1, *(1,) * lead, *problem.window)
    stride = (1, 1, *(1,) * lead, *problem.stride)
    pads = (0, 0, *(0,) * lead, *problem.padding)
    in_sizes = _five(problem.x.dims, lead, 1)
    out_sizes = _five(problem.y.dims, lead, 1)
    walked = _cell_sizes(in_sizes, stride, pads) if cells else out_sizes
    strides = _five(inner_strides, lead, 0)

    def smallest_stride(dims: list[int]) -> int:
        return min([d for d in dims if walked[d] > 1] or dims[-1:], key=lambda d: (strides[d], -d))

    inner = smallest_stride(list(range(CANONICAL_DIMS)))
    rest = [d for d in range(CANONICAL_DIMS) if d != inner]
    row = smallest_stride(rest)
    order = (*(d for d in rest if d != row), row, inner)
    linear = tuple(math.prod(window[d + 1 :]) for d in range(CANONICAL_DIMS))

    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in order)

    return CanonicalPooling(
        order, pick(window), pick(stride), pick(pads), pick(in_sizes), pick(out_sizes), pick(linear)
    )


def _cell_sizes(in_sizes: tuple[int, ...], stride: tuple[int, ...], pads: tuple[int, ...]) -> tuple[int, ...]:
    """Cells per dim: enough for every input position ``o * stride - pad + r`` (``r < stride``)."""
    return tuple(-(-(n + p) // s) for n, s, p in zip(in_sizes, stride, pads))


def _launch_shape(
    sizes: tuple[int, ...], unit_stride: bool, tile: int, narrow: bool
) -> tuple[tuple[int], int, int, bool]:
    """Grid, BLOCK_R, BLOCK_C and CARRY for a tile walk over canonical ``sizes`` (rows: dims 0-3
    flattened). ``tile`` elements per program, NARROW_SCALE times that when ``narrow`` (a 2-byte dtype
    whose columns are contiguous: vector loads): a thread's index and mask work is per vector whatever
    its bytes, so at fp32's count bf16 moved half the bytes per instruction (and its gather loaded 8 of
    16 bytes). When dim 3 holds at least a quarter of the rows' block, the block is cut to at most twice
    dim 3 so that a tile's row coordinates come from compares (CARRY)."""
    if narrow:
        tile *= NARROW_SCALE
    block_c = min(triton.next_power_of_2(sizes[4]), MAX_INNER_BLOCK if unit_stride else 64)
    rows = math.prod(sizes[:4])
    block_r = max(1, min(tile // block_c, triton.next_power_of_2(rows)))
    carry = 4 * sizes[3] >= block_r
    if carry:
        block_r = min(block_r, 1 << (2 * sizes[3]).bit_length() - 1)
    programs = triton.cdiv(rows, block_r) * triton.cdiv(sizes[4], block_c)
    assert programs <= INT32_LIMIT and rows <= INT32_LIMIT, f"{rows} rows"
    return (programs,), block_r, block_c, carry


def _wide(plan: CanonicalPooling, *strides: tuple[int, ...]) -> bool:
    """Whether an offset from a tile's base (its rows reach one step or the full size of dims 0-2; window
    and padding included) may pass int32."""
    extents = [
        max(plan.in_sizes[d], plan.out_sizes[d]) + 2 * (plan.window[d] + plan.stride[d]) for d in range(CANONICAL_DIMS)
    ]
    return any(sum(e * abs(s) for e, s in zip(extents, strides_)) > INT32_LIMIT for strides_ in strides)


def _argmax_dtype(positions: int) -> Any:
    import torch

    return torch.int8 if positions <= 127 else torch.int16 if positions <= 32767 else torch.int32


def supports(problem: PoolingProblem) -> str | None:
    if problem.dilation:
        return f"dilation={list(problem.dilation)}: the kernels walk undilated windows (the numpy backend runs it)"
    if problem.indices is not None:
        return "return_indices: the kernels write no indices (the numpy backend does)"
    return None


def run(
    problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None, indices: Bound | None = None
) -> None:
    tensors = {"x": torch_view(x), "y": torch_view(y)}
    if dx is None or dy is None:
        _forward_config(problem, "max" if problem.mode.is_max else "avg", (0,) * CANONICAL_DIMS, FORWARD_TILE)(tensors)
    else:
        tensors["dy"], tensors["dx"] = torch_view(dy), torch_view(dx)
        _backward_config(problem, BACKWARD_TILE)(tensors)


def _lead(problem: PoolingProblem) -> int:
    return 3 - len(problem.window)


@functools.lru_cache(maxsize=256)
def _forward_config(problem: PoolingProblem, kind: str, argmax_strides: tuple[int, ...], tile: int) -> Launch:
    """The forward launch (planned once per problem): y for "max"/"avg"; for "argmax", the window
    positions into the "argmax" slot (its strides over the five canonical dims in N, C, D, H, W numbering)."""
    plan = canonical(problem, problem.x.strides, cells=False)
    lead = _lead(problem)
    x_strides = plan.permute(_five(problem.x.strides, lead, 0))
    y_strides = plan.permute(_five(problem.y.strides, lead, 0))
    argmax_strides = plan.permute(argmax_strides)
    if kind == "argmax" and x_strides[4] * plan.stride[4] != 1:
        tile //= 2  # scalar loads: registers per output (133 against 54 on sm_90 for NCHW 3x3 at 1024)
    narrow = x_strides[4] * plan.stride[4] == 1 and problem.x.dtype.itemsize < 4
    strip = _strip_alignment(plan, x_strides, problem.x.dtype.itemsize) if kind != "argmax" else 0
    grid, block_r, block_c, carry = _launch_shape(
        plan.out_sizes, x_strides[4] == 1, STRIP_TILE if strip else tile, narrow
    )
    strip = min(strip, 2 * block_c)
    y_vector = _aligned_run(plan, y_strides, plan.out_sizes[4], strip // 2) if strip else 1
    args = (
        Slot("x"),
        Slot("y"),
        Slot("argmax" if kind == "argmax" else "y"),
        plan.in_sizes,
        plan.out_sizes,
        plan.pads,
        x_strides,
        y_strides,
        argmax_strides,
        problem.alpha,
        problem.beta,
    )
    constants = dict(
        WINDOW=plan.window,
        STRIDE=plan.stride,
        CLIPPED=plan.clipped,
        LOW=plan.pads,
        HIGH=plan.overhang,
        LINEAR=plan.linear,
        KIND=kind,
        INCLUDE_PADDING=problem.mode.value == "avg_include",
        PROPAGATE_NAN=problem.propagate_nan,
        HAS_BETA=problem.beta != 0.0,
        UNROLL=math.prod(plan.window) <= UNROLL_LIMIT,
        CARRY=carry,
        WIDE=_wide(plan, x_strides, y_strides, argmax_strides),
        COMPUTE=_compute(problem),
        FULL_COLUMNS=plan.out_sizes[4] % block_c == 0,
        STRIP=strip,
        LEFT_GROUP=min(strip // 2, 4) if plan.pads[4] == 1 else 0,
        Y_VECTOR=y_vector,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=STRIP_WARPS if strip else 4,
    )
    return Launch(pool_forward_kernel, grid, args, constants)


def _strip_alignment(plan: CanonicalPooling, x_strides: tuple[int, ...], itemsize: int) -> int:
    """Elements per vector of the forward's strip loads (``strip_pool``), 0 for the general path: windows of
    stride 2 along unit-stride input rows; the largest power of two up to STRIP_BYTES that divides the
    row length and the strides of the dims the tile or the window moves along (rows start aligned), if 4 or
    more."""
    if plan.stride[4] != 2 or x_strides[4] != 1:
        return 0
    strip = _aligned_run(plan, x_strides, plan.in_sizes[4], STRIP_BYTES // itemsize)
    return strip if strip >= 4 else 0  # (float64's pairs: more instructions than the general path on sm_90)


def _aligned_run(plan: CanonicalPooling, strides: tuple[int, ...], row: int, limit: int) -> int:
    """The largest power of two up to ``limit`` that divides ``row`` (the length of the tensor's rows along
    dim 4) and the strides of the dims 0-3 that a tile or a window moves along: runs of that many columns
    start aligned when the tensor does; 1 when its columns are not contiguous."""
    if strides[4] != 1 or limit < 1:
        return 1
    moved = [strides[d] for d in range(4) if plan.in_sizes[d] > 1 or plan.window[d] > 1 or plan.pads[d] > 0]
    common = math.gcd(row, *moved)
    return min(common & -common, limit)


@functools.lru_cache(maxsize=256)
def _backward_config(problem: PoolingProblem, tile: int) -> Launches:
    """The backward's launches (planned once per problem): for max, the argmax pass into a per-call
    scratch (packed, in the gather's canonical order), then the gather."""
    if problem.dy is None or problem.dx is None:
        raise InternalError("pooling backward planned without dy and dx")
    plan = canonical(problem, problem.dx.strides, cells=True)
    lead = _lead(problem)
    dims = _five(problem.y.dims, lead, 1)
    argmax_strides = strides_for_order(dims, plan.order) if problem.mode.is_max else (0,) * CANONICAL_DIMS
    cells = _cell_sizes(plan.in_sizes, plan.stride, plan.pads)
    dy_strides = plan.permute(_five(problem.dy.strides, lead, 0))
    dx_strides = plan.permute(_five(problem.dx.strides, lead, 0))
    shifts = tuple(-(-w // s) for w, s in zip(plan.window, plan.stride))
    gather_argmax_strides = plan.permute(argmax_strides)
    # the scratch is packed in the canonical order, as dy usually is (dims of one output position do not count)
    argmax_like_dy = all(a == d for a, d, n in zip(gather_argmax_strides, dy_strides, plan.out_sizes) if n > 1)
    narrow = dx_strides[4] * plan.stride[4] == 1 and problem.x.dtype.itemsize < 4
    grid, block_r, block_c, carry = _launch_shape(cells, dx_strides[4] == 1, tile, narrow)
    args = (
        Slot("dy"),
        Slot("argmax" if problem.mode.is_max else "dy"),
        Slot("dx"),
        plan.in_sizes,
        plan.out_sizes,
        cells,
        plan.pads,
        dy_strides,
        gather_argmax_strides,
        dx_strides,
        problem.alpha,
        problem.beta,
    )
    constants = dict(
        WINDOW=plan.window,
        STRIDE=plan.stride,
        CLIPPED=plan.clipped,
        LOW=plan.pads,
        HIGH=tuple(n + p - (c - 1) * s for n, p, c, s in zip(plan.in_sizes, plan.pads, cells, plan.stride)),
        SHIFTS=shifts,
        LAST_SHIFT=tuple(1 + o - c for o, c in zip(plan.out_sizes, cells)),
        LINEAR=plan.linear,
        KIND="max" if problem.mode.is_max else "avg",
        INCLUDE_PADDING=problem.mode.value == "avg_include",
        HAS_BETA=problem.beta != 0.0,
        UNROLL=math.prod(plan.stride) * math.prod(shifts) <= UNROLL_LIMIT,
        ARGMAX_LIKE_DY=argmax_like_dy,
        CARRY=carry,
        WIDE=_wide(plan, dy_strides, dx_strides, gather_argmax_strides),
        COMPUTE=_compute(problem),
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=4,
    )
    gather = Launch(pool_backward_kernel, grid, args, constants)
    if not problem.mode.is_max:
        return Launches((gather,))
    argmax = _forward_config(problem, "argmax", argmax_strides, ARGMAX_TILE)
    return Launches((argmax, gather), (Scratch("argmax", math.prod(dims), _argmax_dtype(math.prod(problem.window))),))


def _compute(problem: PoolingProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32
