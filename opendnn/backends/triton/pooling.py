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
row were most of the first version's instructions and registers on sm_90). Offsets are an int64
scalar base per tile plus int32 per element (int64 only for tensors past 2**31 elements). The window
loop is unrolled over the constexpr window (a plain loop for windows over UNROLL_LIMIT positions).

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

from opendnn.backends.triton.launch import Launch, Launches, Scratch, Slot
from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.ops.pooling import PoolingProblem

CANONICAL_DIMS = 5
UNROLL_LIMIT = 64  # window positions (or phase x shift pairs) unrolled in full
FORWARD_TILE = 2048  # outputs of a forward program: 16 per thread at 4 warps
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
def outer_offset(c0, c1, c2, strides):
    """Scalar int64 offset of coordinates along canonical dims 0-2: the tile's base."""
    return c0.to(tl.int64) * strides[0] + c1.to(tl.int64) * strides[1] + c2.to(tl.int64) * strides[2]


@triton.jit
def tile_offset(d0, d1, d2, p3, p4, strides, WIDE: tl.constexpr):
    """(columns, rows) offsets from the tile's base: per row, ``d0 .. d2`` (positions along dims 0-2
    relative to the base) and ``p3``; per column ``p4``. int32 unless WIDE (an extent past 2**31)."""
    if WIDE:
        d0, d1, d2, p3, p4 = d0.to(tl.int64), d1.to(tl.int64), d2.to(tl.int64), p3.to(tl.int64), p4.to(tl.int64)
    rows = d0 * strides[0] + d1 * strides[1] + d2 * strides[2] + p3 * strides[3]
    return rows[None, :] + (p4 * strides[4])[:, None]


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
def window_counts(s0, s1, s2, s3, s4, sizes, pads, WINDOW: tl.constexpr, CLIPPED: tl.constexpr,
                  INCLUDE_PADDING: tl.constexpr):
    """The (columns, rows) tile of window counts: a scalar (dims 0-2) x a per-row x a per-column factor."""
    rows = (window_count(s0, sizes[0], pads[0], WINDOW[0], CLIPPED[0], INCLUDE_PADDING)
            * window_count(s1, sizes[1], pads[1], WINDOW[1], CLIPPED[1], INCLUDE_PADDING)
            * window_count(s2, sizes[2], pads[2], WINDOW[2], CLIPPED[2], INCLUDE_PADDING)
            * window_count(s3, sizes[3], pads[3], WINDOW[3], CLIPPED[3], INCLUDE_PADDING))
    counts = rows[None, :] * window_count(s4, sizes[4], pads[4], WINDOW[4], CLIPPED[4], INCLUDE_PADDING)[:, None]
    return tl.maximum(counts, 1)  # windows outside the tile's range may count 0; real ones never do


@triton.jit
def window_step(j, x_tile, s0, s1, s2, s3, s4, load_cols, in_sizes, x_strides,
                best, found, total, y_value,
                WINDOW: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr, LINEAR: tl.constexpr, KIND: tl.constexpr,
                PROPAGATE_NAN: tl.constexpr, COMPUTE: tl.constexpr):
    """Fold window position ``j`` into the accumulators: the max (``best``) or the sum (``j`` row-major over
    the canonical window), or ``found``, the row-major position ``j`` in N, C, D, H, W order of an element
    equal to y (the positions come last to first: the first match is the last written)."""
    if KIND == "argmax":
        j0, j1, j2, j3, j4 = (j // LINEAR[0] % WINDOW[0], j // LINEAR[1] % WINDOW[1], j // LINEAR[2] % WINDOW[2],
                              j // LINEAR[3] % WINDOW[3], j // LINEAR[4] % WINDOW[4])
    else:
        j0, j1, j2, j3, j4 = split_constant(j, WINDOW)
    ok_row = (within(s3 + j3, in_sizes[3], j3, LOW[3], HIGH[3])
              & within(s0 + j0, in_sizes[0], j0, LOW[0], HIGH[0]) & within(s1 + j1, in_sizes[1], j1, LOW[1], HIGH[1])
              & within(s2 + j2, in_sizes[2], j2, LOW[2], HIGH[2]))
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
def pool_forward_kernel(
    x_ptr, y_ptr, argmax_ptr, in_sizes, out_sizes, pads, x_strides, y_strides, argmax_strides,
    alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, STRIDE: tl.constexpr, CLIPPED: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr,
    LINEAR: tl.constexpr, KIND: tl.constexpr, INCLUDE_PADDING: tl.constexpr, PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr, UNROLL: tl.constexpr, CARRY: tl.constexpr, WIDE: tl.constexpr, COMPUTE: tl.constexpr,
    FULL_COLUMNS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
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
    x_tile = (x_ptr + outer_offset(b0 * STRIDE[0] - pads[0], b1 * STRIDE[1] - pads[1], b2 * STRIDE[2] - pads[2],
                                   x_strides)
              + tile_offset((x0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], s3, s4, x_strides,
                            WIDE))
    mask = row_ok[None, :] & col_ok[:, None]
    y_at = (y_ptr + outer_offset(b0, b1, b2, y_strides)
            + tile_offset(o0 - b0, o1 - b1, o2 - b2, o3, cols, y_strides, WIDE))

    y_value = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    if KIND == "argmax":
        y_value = tl.load(y_at, mask=mask, other=0.0).to(COMPUTE)
    best = tl.full((BLOCK_C, BLOCK_R), float("-inf") if PROPAGATE_NAN else float("nan"), COMPUTE)
    steps: tl.constexpr = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
    found = tl.full((BLOCK_C, BLOCK_R), steps, tl.int32)
    total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    first: tl.constexpr = (steps - 1) * (KIND == "argmax")  # argmax: the window's positions last to first
    step: tl.constexpr = 1 - 2 * (KIND == "argmax")
    if UNROLL:
        for i in tl.static_range(steps):
            best, found, total = window_step(first + step * i, x_tile, s0, s1, s2, s3, s4, load_cols, in_sizes,
                                             x_strides, best, found, total, y_value,
                                             WINDOW, LOW, HIGH, LINEAR, KIND, PROPAGATE_NAN, COMPUTE)
    else:
        for i in range(steps):
            best, found, total = window_step(first + step * i, x_tile, s0, s1, s2, s3, s4, load_cols, in_sizes,
                                             x_strides, best, found, total, y_value,
                                             WINDOW, LOW, HIGH, LINEAR, KIND, PROPAGATE_NAN, COMPUTE)

    if KIND == "argmax":
        argmax_at = (argmax_ptr + outer_offset(b0, b1, b2, argmax_strides)
                     + tile_offset(o0 - b0, o1 - b1, o2 - b2, o3, cols, argmax_strides, WIDE))
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
def window_values(q, b0, b1, b2, o0, o1, o2, o3, o4, tile_ok, dy_ptr, argmax_ptr, in_sizes, out_sizes, pads,
                  dy_strides, argmax_strides,
                  WINDOW: tl.constexpr, STRIDE: tl.constexpr, CLIPPED: tl.constexpr, SHIFTS: tl.constexpr,
                  LAST_SHIFT: tl.constexpr, KIND: tl.constexpr, INCLUDE_PADDING: tl.constexpr,
                  ARGMAX_LIKE_DY: tl.constexpr, WIDE: tl.constexpr, COMPUTE: tl.constexpr):
    """dy of the windows ``o - q`` of the cells ``o`` (0 outside the output; divided by the window's count
    for averages) and, for max, their argmax positions: loaded once, shared by every phase."""
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    w0, w1, w2, w3, w4 = o0 - q0, o1 - q1, o2 - q2, o3 - q3, o4 - q4
    # o - q < 0 only when q > 0; past the output only when q < cells - outputs (offset -q against LAST_SHIFT)
    w_row = (within(w3, out_sizes[3], -q3, 0, LAST_SHIFT[3]) & within(w0, out_sizes[0], -q0, 0, LAST_SHIFT[0])
             & within(w1, out_sizes[1], -q1, 0, LAST_SHIFT[1]) & within(w2, out_sizes[2], -q2, 0, LAST_SHIFT[2]))
    ok = tile_ok & w_row[None, :] & within(w4, out_sizes[4], -q4, 0, LAST_SHIFT[4])[:, None]
    dy_at = (dy_ptr + outer_offset(b0 - q0, b1 - q1, b2 - q2, dy_strides)
             + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, dy_strides, WIDE))
    gradient = tl.load(dy_at, mask=ok, other=0.0).to(COMPUTE)
    if KIND == "max":
        if ARGMAX_LIKE_DY:  # the same offsets as dy's, computed once
            argmax_strides = dy_strides
        argmax_at = (argmax_ptr + outer_offset(b0 - q0, b1 - q1, b2 - q2, argmax_strides)
                     + tile_offset(o0 - b0, o1 - b1, o2 - b2, w3, w4, argmax_strides, WIDE))
        positions = tl.load(argmax_at, mask=ok, other=-1).to(tl.int32)
    else:
        counts = window_counts(w0 * STRIDE[0] - pads[0], w1 * STRIDE[1] - pads[1], w2 * STRIDE[2] - pads[2],
                               w3 * STRIDE[3] - pads[3], w4 * STRIDE[4] - pads[4], in_sizes, pads, WINDOW,
                               CLIPPED, INCLUDE_PADDING)
        gradient = gradient / counts.to(COMPUTE)
        positions = ok.to(tl.int32)  # not read by averages
    return gradient, positions


@triton.jit
def window_share(gradient, positions, phase, q,
                 WINDOW: tl.constexpr, STRIDE: tl.constexpr, SHIFTS: tl.constexpr, LINEAR: tl.constexpr,
                 KIND: tl.constexpr):
    """What window ``o - q`` sends to the input position at offset ``r + q * stride`` of it (``r`` the
    phase): its dy where that offset is its argmax (max) or its dy / count; 0 past the window's end."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    j0, j1, j2, j3, j4 = (r0 + q0 * STRIDE[0], r1 + q1 * STRIDE[1], r2 + q2 * STRIDE[2], r3 + q3 * STRIDE[3],
                          r4 + q4 * STRIDE[4])
    in_window = (j0 < WINDOW[0]) & (j1 < WINDOW[1]) & (j2 < WINDOW[2]) & (j3 < WINDOW[3]) & (j4 < WINDOW[4])
    if KIND == "max":
        linear = j0 * LINEAR[0] + j1 * LINEAR[1] + j2 * LINEAR[2] + j3 * LINEAR[3] + j4 * LINEAR[4]
        share = tl.where(in_window & (positions == linear), gradient, 0.0)
    else:
        share = tl.where(in_window, gradient, 0.0)
    return share


@triton.jit
def store_phase(total, phase, b0, b1, b2, o0, o1, o2, o3, o4, row_ok, col_ok, dx_ptr, in_sizes, pads, dx_strides,
                alpha, beta, STRIDE: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr, HAS_BETA: tl.constexpr,
                WIDE: tl.constexpr, COMPUTE: tl.constexpr):
    """dx = alpha * total + beta * dx at the input positions ``o * stride - padding + r`` of the cells
    ``o`` (``r`` the phase) that lie inside x: tested before its start for phases under the padding
    (LOW), past its end for phases from HIGH (the last cell's)."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    i0 = o0 * STRIDE[0] - pads[0] + r0
    i1 = o1 * STRIDE[1] - pads[1] + r1
    i2 = o2 * STRIDE[2] - pads[2] + r2
    i3 = o3 * STRIDE[3] - pads[3] + r3
    i4 = o4 * STRIDE[4] - pads[4] + r4
    in_row = (row_ok & within(i3, in_sizes[3], r3, LOW[3], HIGH[3]) & within(i0, in_sizes[0], r0, LOW[0], HIGH[0])
              & within(i1, in_sizes[1], r1, LOW[1], HIGH[1]) & within(i2, in_sizes[2], r2, LOW[2], HIGH[2]))
    in_ok = in_row[None, :] & (col_ok & within(i4, in_sizes[4], r4, LOW[4], HIGH[4]))[:, None]
    dx_at = (dx_ptr + outer_offset(b0 * STRIDE[0] - pads[0] + r0, b1 * STRIDE[1] - pads[1] + r1,
                                   b2 * STRIDE[2] - pads[2] + r2, dx_strides)
             + tile_offset((o0 - b0) * STRIDE[0], (o1 - b1) * STRIDE[1], (o2 - b2) * STRIDE[2], i3, i4, dx_strides,
                           WIDE))
    result = total * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        result += tl.cast(beta, COMPUTE) * tl.load(dx_at, mask=in_ok).to(COMPUTE)
    tl.store(dx_at, result.to(dx_ptr.dtype.element_ty), mask=in_ok)


@triton.jit
def pool_backward_kernel(
    dy_ptr, argmax_ptr, dx_ptr, in_sizes, out_sizes, cell_sizes, pads, dy_strides, argmax_strides, dx_strides,
    alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, STRIDE: tl.constexpr, CLIPPED: tl.constexpr, LOW: tl.constexpr, HIGH: tl.constexpr,
    SHIFTS: tl.constexpr, LAST_SHIFT: tl.constexpr, LINEAR: tl.constexpr, KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr, HAS_BETA: tl.constexpr, UNROLL: tl.constexpr, ARGMAX_LIKE_DY: tl.constexpr,
    CARRY: tl.constexpr, WIDE: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
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
            gradient, positions = window_values(q, b0, b1, b2, o0, o1, o2, o3, o4, tile_ok, dy_ptr, argmax_ptr,
                                                in_sizes, out_sizes, pads, dy_strides, argmax_strides, WINDOW,
                                                STRIDE, CLIPPED, SHIFTS, LAST_SHIFT, KIND, INCLUDE_PADDING,
                                                ARGMAX_LIKE_DY, WIDE, COMPUTE)
            summed = ()
            for phase in tl.static_range(phases):
                summed = summed + (totals[phase] + window_share(gradient, positions, phase, q, WINDOW, STRIDE,
                                                                SHIFTS, LINEAR, KIND),)
            totals = summed
        for phase in tl.static_range(phases):
            store_phase(totals[phase], phase, b0, b1, b2, o0, o1, o2, o3, o4, row_ok, col_ok, dx_ptr, in_sizes,
                        pads, dx_strides, alpha, beta, STRIDE, LOW, HIGH, HAS_BETA, WIDE, COMPUTE)
    else:
        for phase in range(phases):
            total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
            for q in range(shifts):
                gradient, positions = window_values(q, b0, b1, b2, o0, o1, o2, o3, o4, tile_ok, dy_ptr,
                                                    argmax_ptr, in_sizes, out_sizes, pads, dy_strides,
                                                    argmax_strides, WINDOW, STRIDE, CLIPPED, SHIFTS, LAST_SHIFT,
                                                    KIND, INCLUDE_PADDING, ARGMAX_LIKE_DY, WIDE, COMPUTE)
                total += window_share(gradient, positions, phase, q, WINDOW, STRIDE, SHIFTS, LINEAR, KIND)
            store_phase(total, phase, b0, b1, b2, o0, o1, o2, o3, o4, row_ok, col_ok, dx_ptr, in_sizes, pads,
                        dx_strides, alpha, beta, STRIDE, LOW, HIGH, HAS_BETA, WIDE, COMPUTE)


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
        return tuple(min(n + p - (o - 1) * s, w) for w, s, p, n, o in
                     zip(self.window, self.stride, self.pads, self.in_sizes, self.out_sizes))

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
    linear = tuple(math.prod(window[d + 1:]) for d in range(CANONICAL_DIMS))

    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in order)

    return CanonicalPooling(order, pick(window), pick(stride), pick(pads), pick(in_sizes), pick(out_sizes),
                            pick(linear))


def _cell_sizes(in_sizes: tuple[int, ...], stride: tuple[int, ...], pads: tuple[int, ...]) -> tuple[int, ...]:
    """Cells per dim: enough for every input position ``o * stride - pad + r`` (``r < stride``)."""
    return tuple(-(-(n + p) // s) for n, s, p in zip(in_sizes, stride, pads))


def _launch_shape(sizes: tuple[int, ...], unit_stride: bool, tile: int,
                  narrow: bool) -> tuple[tuple[int], int, int, bool]:
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
    extents = [max(plan.in_sizes[d], plan.out_sizes[d]) + 2 * (plan.window[d] + plan.stride[d])
               for d in range(CANONICAL_DIMS)]
    return any(sum(e * abs(s) for e, s in zip(extents, strides_)) > INT32_LIMIT for strides_ in strides)


def _argmax_dtype(positions: int) -> Any:
    import torch

    return torch.int8 if positions <= 127 else torch.int16 if positions <= 32767 else torch.int32


def supports(problem: PoolingProblem) -> str | None:
    return None


def run(problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None) -> None:
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
    grid, block_r, block_c, carry = _launch_shape(plan.out_sizes, x_strides[4] == 1, tile, narrow)
    args = (Slot("x"), Slot("y"), Slot("argmax" if kind == "argmax" else "y"), plan.in_sizes, plan.out_sizes,
            plan.pads, x_strides, y_strides, argmax_strides, problem.alpha, problem.beta)
    constants = dict(
        WINDOW=plan.window, STRIDE=plan.stride, CLIPPED=plan.clipped, LOW=plan.pads, HIGH=plan.overhang,
        LINEAR=plan.linear, KIND=kind,
        INCLUDE_PADDING=problem.mode.value == "avg_include", PROPAGATE_NAN=problem.propagate_nan,
        HAS_BETA=problem.beta != 0.0, UNROLL=math.prod(plan.window) <= UNROLL_LIMIT, CARRY=carry,
        WIDE=_wide(plan, x_strides, y_strides, argmax_strides), COMPUTE=_compute(problem),
        FULL_COLUMNS=plan.out_sizes[4] % block_c == 0, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return Launch(pool_forward_kernel, grid, args, constants)


@functools.lru_cache(maxsize=256)
def _backward_config(problem: PoolingProblem, tile: int) -> Launches:
    """The backward's launches (planned once per problem): for max, the argmax pass into a per-call
    scratch (packed, in the gather's canonical order), then the gather."""
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
    args = (Slot("dy"), Slot("argmax" if problem.mode.is_max else "dy"), Slot("dx"), plan.in_sizes,
            plan.out_sizes, cells, plan.pads, dy_strides, gather_argmax_strides, dx_strides, problem.alpha,
            problem.beta)
    constants = dict(
        WINDOW=plan.window, STRIDE=plan.stride, CLIPPED=plan.clipped, LOW=plan.pads,
        HIGH=tuple(n + p - (c - 1) * s for n, p, c, s in zip(plan.in_sizes, plan.pads, cells, plan.stride)),
        SHIFTS=shifts, LAST_SHIFT=tuple(1 + o - c for o, c in zip(plan.out_sizes, cells)), LINEAR=plan.linear,
        KIND="max" if problem.mode.is_max else "avg", INCLUDE_PADDING=problem.mode.value == "avg_include",
        HAS_BETA=problem.beta != 0.0, UNROLL=math.prod(plan.stride) * math.prod(shifts) <= UNROLL_LIMIT,
        ARGMAX_LIKE_DY=argmax_like_dy, CARRY=carry,
        WIDE=_wide(plan, dy_strides, dx_strides, gather_argmax_strides), COMPUTE=_compute(problem), BLOCK_R=block_r,
        BLOCK_C=block_c, num_warps=4)
    gather = Launch(pool_backward_kernel, grid, args, constants)
    if not problem.mode.is_max:
        return Launches((gather,))
    argmax = _forward_config(problem, "argmax", argmax_strides, ARGMAX_TILE)
    return Launches((argmax, gather), (Scratch("argmax", math.prod(dims), _argmax_dtype(math.prod(problem.window))),))


def _compute(problem: PoolingProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32
