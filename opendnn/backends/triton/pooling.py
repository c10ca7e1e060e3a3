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
window 1), reordered so that the dim with the smallest stride (C for NHWC, W for NCHW) comes last.
A program owns BLOCK_R rows (the four outer dims, flattened) by BLOCK_C positions of that innermost
dim, held as a (BLOCK_C, BLOCK_R) tensor: Triton's coalescing pass puts the lanes along dim 0 when
no dim is contiguous (NCHW with stride 2), so the innermost dim goes there and a warp's load spans 32
neighbouring positions of one row (as a (BLOCK_R, BLOCK_C) tensor it spanned 32 rows, one line
each); in NHWC it is contiguous and the loads are vectorized along it. The window's offsets are
scalars added to one base per row and one per column. The window loop is
unrolled over the constexpr window (a plain loop for windows over UNROLL_LIMIT positions).

Backward gather: each input position ``i = o * stride - padding + r`` belongs to exactly one cell
``o`` (``r`` in ``0 .. stride - 1``), so a program owns a tile of cells and, for each phase ``r``,
writes dx at the cell's input positions: the sum over the windows ``o - q`` that hold ``i`` (window
offset ``r + q * stride < window``) of their dy, where that window's argmax is this offset (max) or
divided by the window's count (averages). Every element of dx is written once, no atomics, in a
fixed order: the results are bitwise repeatable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from opendnn.core.arrays import Bound
from opendnn.core.descriptors import strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.ops.pooling import PoolingProblem

CANONICAL_DIMS = 5
UNROLL_LIMIT = 64  # window positions (or phase x shift pairs) unrolled in full
TILE_ELEMENTS = 2048  # elements of a program's tile: 16 per thread at 4 warps
MAX_INNER_BLOCK = 256


@triton.jit
def tile_indices(column_blocks, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The program's rows (int64) and columns: one grid axis (the others hold 65535 programs at most),
    column blocks fastest so that neighbouring programs share rows of x."""
    pid = tl.program_id(0)
    row_block = (pid // column_blocks).to(tl.int64)
    return row_block * BLOCK_R + tl.arange(0, BLOCK_R), (pid % column_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)


@triton.jit
def split_rows(index, sizes):
    """Coordinates of a flattened row index over the four outer dims ``sizes[0..3]`` (last fastest)."""
    c3 = index % sizes[3]
    index = index // sizes[3]
    c2 = index % sizes[2]
    index = index // sizes[2]
    return index // sizes[1], index % sizes[1], c2, c3


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
def inside(position, size, WINDOWED: tl.constexpr):
    """0 <= position < size; always true along a dim without a window (its positions are outputs)."""
    if WINDOWED:
        ok = (position >= 0) & (position < size)
    else:
        ok = position == position
    return ok


@triton.jit
def window_count(start, size, pad, WINDOW: tl.constexpr, INCLUDE_PADDING: tl.constexpr):
    """Positions a window starting at ``start`` counts along one dim: up to the end of the trailing
    padding (INCLUDE_PADDING) or inside the input only."""
    if WINDOW == 1:
        count = start * 0 + 1
    elif INCLUDE_PADDING:
        count = tl.minimum(start + WINDOW, size + pad) - start
    else:
        count = tl.minimum(start + WINDOW, size) - tl.maximum(start, 0)
    return count


@triton.jit
def window_counts(s0, s1, s2, s3, s4, sizes, pads, WINDOW: tl.constexpr, INCLUDE_PADDING: tl.constexpr):
    """The (rows, columns) tile of window counts, as a product of a per-row and a per-column factor."""
    rows = (window_count(s0, sizes[0], pads[0], WINDOW[0], INCLUDE_PADDING)
            * window_count(s1, sizes[1], pads[1], WINDOW[1], INCLUDE_PADDING)
            * window_count(s2, sizes[2], pads[2], WINDOW[2], INCLUDE_PADDING)
            * window_count(s3, sizes[3], pads[3], WINDOW[3], INCLUDE_PADDING))
    counts = rows[None, :] * window_count(s4, sizes[4], pads[4], WINDOW[4], INCLUDE_PADDING)[:, None]
    return tl.maximum(counts, 1)  # windows outside the tile's range may count 0; real ones never do


@triton.jit
def window_step(j, x_ptr, x_row, x_col, s0, s1, s2, s3, s4, row_ok, col_ok, in_sizes, x_strides,
                best, found, total, y_value,
                WINDOW: tl.constexpr, LINEAR: tl.constexpr, KIND: tl.constexpr, PROPAGATE_NAN: tl.constexpr,
                COMPUTE: tl.constexpr):
    """Fold window position ``j`` (row-major over the canonical window) into the accumulators:
    the max (``best``), the smallest row-major position equal to y (``found``) or the sum."""
    j0, j1, j2, j3, j4 = split_constant(j, WINDOW)
    ok_row = (row_ok & inside(s0 + j0, in_sizes[0], WINDOW[0] > 1) & inside(s1 + j1, in_sizes[1], WINDOW[1] > 1)
              & inside(s2 + j2, in_sizes[2], WINDOW[2] > 1) & inside(s3 + j3, in_sizes[3], WINDOW[3] > 1))
    ok = ok_row[None, :] & (col_ok & inside(s4 + j4, in_sizes[4], WINDOW[4] > 1))[:, None]
    shift = j0 * x_strides[0] + j1 * x_strides[1] + j2 * x_strides[2] + j3 * x_strides[3] + j4 * x_strides[4]
    x = tl.load(x_ptr + (x_row[None, :] + x_col[:, None] + shift), mask=ok, other=0.0).to(COMPUTE)
    if KIND == "max":
        if PROPAGATE_NAN:
            take = ok & ((x > best) | (x != x))
        else:  # best starts as NaN, which every number replaces
            take = ok & (x == x) & ((x > best) | (best != best))
        best = tl.where(take, x, best)
    elif KIND == "argmax":
        linear = j0 * LINEAR[0] + j1 * LINEAR[1] + j2 * LINEAR[2] + j3 * LINEAR[3] + j4 * LINEAR[4]
        match = ok & ((x == y_value) | ((x != x) & (y_value != y_value))) & (linear < found)
        found = tl.where(match, linear, found)
    else:
        total += x
    return best, found, total


@triton.jit
def pool_forward_kernel(
    x_ptr, y_ptr, argmax_ptr, in_sizes, out_sizes, pads, x_strides, y_strides, argmax_strides, row_count,
    column_blocks, alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, STRIDE: tl.constexpr, LINEAR: tl.constexpr, KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr, PROPAGATE_NAN: tl.constexpr, HAS_BETA: tl.constexpr, UNROLL: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Program (rows, columns): BLOCK_R x BLOCK_C outputs (held as BLOCK_C x BLOCK_R). KIND "max" and "avg" write
    y = alpha * pool(x) + beta * y; "argmax" reads y and writes, per output, the row-major window
    position of the first element of x equal to it (the window's size when none is)."""
    rows, cols = tile_indices(column_blocks, BLOCK_R, BLOCK_C)
    row_ok = rows < row_count
    col_ok = cols < out_sizes[4]
    o0, o1, o2, o3 = split_rows(rows, out_sizes)
    s0 = o0 * STRIDE[0] - pads[0]
    s1 = o1 * STRIDE[1] - pads[1]
    s2 = o2 * STRIDE[2] - pads[2]
    s3 = o3 * STRIDE[3] - pads[3]
    s4 = cols * STRIDE[4] - pads[4]
    x_row = s0 * x_strides[0] + s1 * x_strides[1] + s2 * x_strides[2] + s3 * x_strides[3]
    x_col = s4 * x_strides[4]
    mask = row_ok[None, :] & col_ok[:, None]
    y_offsets = (o0 * y_strides[0] + o1 * y_strides[1] + o2 * y_strides[2] + o3 * y_strides[3])[None, :] \
        + (cols * y_strides[4])[:, None]

    y_value = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    if KIND == "argmax":
        y_value = tl.load(y_ptr + y_offsets, mask=mask, other=0.0).to(COMPUTE)
    best = tl.full((BLOCK_C, BLOCK_R), float("-inf") if PROPAGATE_NAN else float("nan"), COMPUTE)
    found = tl.full((BLOCK_C, BLOCK_R), WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4], tl.int32)
    total = tl.zeros((BLOCK_C, BLOCK_R), COMPUTE)
    steps: tl.constexpr = WINDOW[0] * WINDOW[1] * WINDOW[2] * WINDOW[3] * WINDOW[4]
    if UNROLL:
        for j in tl.static_range(steps):
            best, found, total = window_step(j, x_ptr, x_row, x_col, s0, s1, s2, s3, s4, row_ok, col_ok, in_sizes,
                                             x_strides, best, found, total, y_value,
                                             WINDOW, LINEAR, KIND, PROPAGATE_NAN, COMPUTE)
    else:
        for j in range(steps):
            best, found, total = window_step(j, x_ptr, x_row, x_col, s0, s1, s2, s3, s4, row_ok, col_ok, in_sizes,
                                             x_strides, best, found, total, y_value,
                                             WINDOW, LINEAR, KIND, PROPAGATE_NAN, COMPUTE)

    if KIND == "argmax":
        argmax_offsets = (o0 * argmax_strides[0] + o1 * argmax_strides[1] + o2 * argmax_strides[2]
                          + o3 * argmax_strides[3])[None, :] + (cols * argmax_strides[4])[:, None]
        tl.store(argmax_ptr + argmax_offsets, found.to(argmax_ptr.dtype.element_ty), mask=mask)
    else:
        if KIND == "max":
            result = best
        else:
            result = total / window_counts(s0, s1, s2, s3, s4, in_sizes, pads, WINDOW, INCLUDE_PADDING).to(COMPUTE)
        result = result * tl.cast(alpha, COMPUTE)
        if HAS_BETA:
            result += tl.cast(beta, COMPUTE) * tl.load(y_ptr + y_offsets, mask=mask).to(COMPUTE)
        tl.store(y_ptr + y_offsets, result.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def window_gradient(phase, q, o0, o1, o2, o3, o4, in_ok, dy_ptr, argmax_ptr, in_sizes, out_sizes, pads,
                    dy_strides, argmax_strides,
                    WINDOW: tl.constexpr, STRIDE: tl.constexpr, SHIFTS: tl.constexpr, LINEAR: tl.constexpr,
                    KIND: tl.constexpr, INCLUDE_PADDING: tl.constexpr, COMPUTE: tl.constexpr):
    """The gradient that window ``o - q`` sends to the input position at offset ``r + q * stride``
    of it (``r`` the phase): dy where that offset is the window's argmax (max) or dy / count."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    q0, q1, q2, q3, q4 = split_constant(q, SHIFTS)
    j0, j1, j2, j3, j4 = (r0 + q0 * STRIDE[0], r1 + q1 * STRIDE[1], r2 + q2 * STRIDE[2], r3 + q3 * STRIDE[3],
                          r4 + q4 * STRIDE[4])
    in_window = (j0 < WINDOW[0]) & (j1 < WINDOW[1]) & (j2 < WINDOW[2]) & (j3 < WINDOW[3]) & (j4 < WINDOW[4])
    w0, w1, w2, w3, w4 = o0 - q0, o1 - q1, o2 - q2, o3 - q3, o4 - q4
    w_row = ((w0 >= 0) & (w0 < out_sizes[0]) & (w1 >= 0) & (w1 < out_sizes[1]) & (w2 >= 0) & (w2 < out_sizes[2])
             & (w3 >= 0) & (w3 < out_sizes[3]))
    ok = in_ok & in_window & w_row[None, :] & ((w4 >= 0) & (w4 < out_sizes[4]))[:, None]
    offsets = (w0 * dy_strides[0] + w1 * dy_strides[1] + w2 * dy_strides[2] + w3 * dy_strides[3])[None, :] \
        + (w4 * dy_strides[4])[:, None]
    gradient = tl.load(dy_ptr + offsets, mask=ok, other=0.0).to(COMPUTE)  # masked by tile only: vectorized
    if KIND == "max":
        argmax_offsets = (w0 * argmax_strides[0] + w1 * argmax_strides[1] + w2 * argmax_strides[2]
                          + w3 * argmax_strides[3])[None, :] + (w4 * argmax_strides[4])[:, None]
        linear = j0 * LINEAR[0] + j1 * LINEAR[1] + j2 * LINEAR[2] + j3 * LINEAR[3] + j4 * LINEAR[4]
        ok = ok & (tl.load(argmax_ptr + argmax_offsets, mask=ok, other=-1).to(tl.int32) == linear)
    else:
        counts = window_counts(w0 * STRIDE[0] - pads[0], w1 * STRIDE[1] - pads[1], w2 * STRIDE[2] - pads[2],
                               w3 * STRIDE[3] - pads[3], w4 * STRIDE[4] - pads[4], in_sizes, pads, WINDOW,
                               INCLUDE_PADDING)
        gradient = gradient / counts.to(COMPUTE)
    return tl.where(ok, gradient, 0.0)


@triton.jit
def phase_gradient(phase, o0, o1, o2, o3, o4, row_ok, col_ok, dy_ptr, argmax_ptr, dx_ptr, in_sizes, out_sizes,
                   pads, dy_strides, argmax_strides, dx_strides, alpha, beta,
                   WINDOW: tl.constexpr, STRIDE: tl.constexpr, SHIFTS: tl.constexpr, LINEAR: tl.constexpr,
                   KIND: tl.constexpr, INCLUDE_PADDING: tl.constexpr, HAS_BETA: tl.constexpr, UNROLL: tl.constexpr,
                   COMPUTE: tl.constexpr):
    """dx at the input positions ``o * stride - padding + r`` of the cells ``o`` (``r`` the phase)."""
    r0, r1, r2, r3, r4 = split_constant(phase, STRIDE)
    i0 = o0 * STRIDE[0] - pads[0] + r0
    i1 = o1 * STRIDE[1] - pads[1] + r1
    i2 = o2 * STRIDE[2] - pads[2] + r2
    i3 = o3 * STRIDE[3] - pads[3] + r3
    i4 = o4 * STRIDE[4] - pads[4] + r4
    in_row = (row_ok & (i0 >= 0) & (i0 < in_sizes[0]) & (i1 >= 0) & (i1 < in_sizes[1]) & (i2 >= 0)
              & (i2 < in_sizes[2]) & (i3 >= 0) & (i3 < in_sizes[3]))
    in_ok = in_row[None, :] & (col_ok & (i4 >= 0) & (i4 < in_sizes[4]))[:, None]
    shifts: tl.constexpr = SHIFTS[0] * SHIFTS[1] * SHIFTS[2] * SHIFTS[3] * SHIFTS[4]
    total = tl.zeros(in_ok.shape, COMPUTE)
    if UNROLL:
        for q in tl.static_range(shifts):
            total += window_gradient(phase, q, o0, o1, o2, o3, o4, in_ok, dy_ptr, argmax_ptr, in_sizes, out_sizes,
                                     pads, dy_strides, argmax_strides, WINDOW, STRIDE, SHIFTS, LINEAR, KIND,
                                     INCLUDE_PADDING, COMPUTE)
    else:
        for q in range(shifts):
            total += window_gradient(phase, q, o0, o1, o2, o3, o4, in_ok, dy_ptr, argmax_ptr, in_sizes, out_sizes,
                                     pads, dy_strides, argmax_strides, WINDOW, STRIDE, SHIFTS, LINEAR, KIND,
                                     INCLUDE_PADDING, COMPUTE)
    dx_offsets = (i0 * dx_strides[0] + i1 * dx_strides[1] + i2 * dx_strides[2] + i3 * dx_strides[3])[None, :] \
        + (i4 * dx_strides[4])[:, None]
    result = total * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        result += tl.cast(beta, COMPUTE) * tl.load(dx_ptr + dx_offsets, mask=in_ok).to(COMPUTE)
    tl.store(dx_ptr + dx_offsets, result.to(dx_ptr.dtype.element_ty), mask=in_ok)


@triton.jit
def pool_backward_kernel(
    dy_ptr, argmax_ptr, dx_ptr, in_sizes, out_sizes, cell_sizes, pads, dy_strides, argmax_strides, dx_strides,
    row_count, column_blocks, alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, STRIDE: tl.constexpr, SHIFTS: tl.constexpr, LINEAR: tl.constexpr, KIND: tl.constexpr,
    INCLUDE_PADDING: tl.constexpr, HAS_BETA: tl.constexpr, UNROLL: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Program (rows, columns): BLOCK_R x BLOCK_C cells (held as BLOCK_C x BLOCK_R); writes dx at every input
    position of those cells, phase by phase."""
    rows, o4 = tile_indices(column_blocks, BLOCK_R, BLOCK_C)
    row_ok = rows < row_count
    col_ok = o4 < cell_sizes[4]
    o0, o1, o2, o3 = split_rows(rows, cell_sizes)
    phases: tl.constexpr = STRIDE[0] * STRIDE[1] * STRIDE[2] * STRIDE[3] * STRIDE[4]
    if UNROLL:
        for phase in tl.static_range(phases):
            phase_gradient(phase, o0, o1, o2, o3, o4, row_ok, col_ok, dy_ptr, argmax_ptr, dx_ptr, in_sizes,
                           out_sizes, pads, dy_strides, argmax_strides, dx_strides, alpha, beta, WINDOW, STRIDE,
                           SHIFTS, LINEAR, KIND, INCLUDE_PADDING, HAS_BETA, UNROLL, COMPUTE)
    else:
        for phase in range(phases):
            phase_gradient(phase, o0, o1, o2, o3, o4, row_ok, col_ok, dy_ptr, argmax_ptr, dx_ptr, in_sizes,
                           out_sizes, pads, dy_strides, argmax_strides, dx_strides, alpha, beta, WINDOW, STRIDE,
                           SHIFTS, LINEAR, KIND, INCLUDE_PADDING, HAS_BETA, UNROLL, COMPUTE)


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


def _five(values: tuple[int, ...], lead: int, fill: int) -> tuple[int, ...]:
    """(N, C, *spatial) values widened to (N, C, D, H, W) with ``fill`` for the missing leading spatial dims."""
    return (*values[:2], *(fill,) * lead, *values[2:])


def canonical(problem: PoolingProblem, inner_strides: tuple[int, ...], cells: bool) -> CanonicalPooling:
    """The canonical form, its innermost dim the one of smallest ``inner_strides`` among those
    the tile walks (more than one output, or more than one cell when ``cells``)."""
    lead = 3 - len(problem.window)
    window = (1, 1, *(1,) * lead, *problem.window)
    stride = (1, 1, *(1,) * lead, *problem.stride)
    pads = (0, 0, *(0,) * lead, *problem.padding)
    in_sizes = _five(problem.x.dims, lead, 1)
    out_sizes = _five(problem.y.dims, lead, 1)
    walked = _cell_sizes(in_sizes, stride, pads) if cells else out_sizes
    strides = _five(inner_strides, lead, 0)
    candidates = [d for d in range(CANONICAL_DIMS) if walked[d] > 1] or [CANONICAL_DIMS - 1]
    inner = min(candidates, key=lambda d: (strides[d], -d))
    order = tuple(d for d in range(CANONICAL_DIMS) if d != inner) + (inner,)
    linear = tuple(math.prod(window[d + 1:]) for d in range(CANONICAL_DIMS))
    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in order)

    return CanonicalPooling(order, pick(window), pick(stride), pick(pads), pick(in_sizes), pick(out_sizes),
                            pick(linear))


def _cell_sizes(in_sizes: tuple[int, ...], stride: tuple[int, ...], pads: tuple[int, ...]) -> tuple[int, ...]:
    """Cells per dim: enough for every input position ``o * stride - pad + r`` (``r < stride``)."""
    return tuple(-(-(n + p) // s) for n, s, p in zip(in_sizes, stride, pads))


def _blocks(inner: int, rows: int, unit_stride: bool) -> tuple[int, int]:
    block_c = min(triton.next_power_of_2(inner), MAX_INNER_BLOCK if unit_stride else 64)
    block_r = max(1, min(TILE_ELEMENTS // block_c, triton.next_power_of_2(rows)))
    return block_r, block_c


def _argmax_dtype(positions: int) -> Any:
    import torch

    return torch.int8 if positions <= 127 else torch.int16 if positions <= 32767 else torch.int32


def supports(problem: PoolingProblem) -> str | None:
    return None


def run(problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None) -> None:
    if dx is None or dy is None:
        _forward(problem, x, y)
    else:
        _backward(problem, x, y, dy, dx)


def _lead(problem: PoolingProblem) -> int:
    return 3 - len(problem.window)


def _forward_launch(problem: PoolingProblem, kind: str, x: Bound, y: Bound, argmax: Any = None,
                    argmax_strides: tuple[int, ...] = (0,) * CANONICAL_DIMS) -> None:
    """Launch the forward kernel: y for "max"/"avg"; for "argmax", the window positions into ``argmax``
    (its strides over the five canonical dims in N, C, D, H, W numbering)."""
    plan = canonical(problem, x.desc.strides, cells=False)
    lead = _lead(problem)
    x_strides, y_strides = plan.permute(_five(x.desc.strides, lead, 0)), plan.permute(_five(y.desc.strides, lead, 0))
    rows = math.prod(plan.out_sizes[:4])
    block_r, block_c = _blocks(plan.out_sizes[4], rows, x_strides[4] == 1)
    column_blocks = triton.cdiv(plan.out_sizes[4], block_c)
    grid = (triton.cdiv(rows, block_r) * column_blocks,)
    y_view = _torch_view(y)
    pool_forward_kernel[grid](
        _torch_view(x), y_view, y_view if argmax is None else argmax, plan.in_sizes, plan.out_sizes, plan.pads,
        x_strides, y_strides, plan.permute(argmax_strides), rows, column_blocks, problem.alpha, problem.beta,
        WINDOW=plan.window, STRIDE=plan.stride, LINEAR=plan.linear, KIND=kind,
        INCLUDE_PADDING=problem.mode.value == "avg_include", PROPAGATE_NAN=problem.propagate_nan,
        HAS_BETA=problem.beta != 0.0, UNROLL=math.prod(plan.window) <= UNROLL_LIMIT,
        COMPUTE=_compute(problem), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)


def _forward(problem: PoolingProblem, x: Bound, y: Bound) -> None:
    _forward_launch(problem, "max" if problem.mode.is_max else "avg", x, y)


def _backward(problem: PoolingProblem, x: Bound, y: Bound, dy: Bound, dx: Bound) -> None:
    import torch

    plan = canonical(problem, dx.desc.strides, cells=True)
    lead = _lead(problem)
    argmax = _torch_view(dy)  # unused unless max
    argmax_strides = (0,) * CANONICAL_DIMS
    if problem.mode.is_max:
        dims = _five(problem.y.dims, lead, 1)
        argmax_strides = strides_for_order(dims, plan.order)  # packed, in the backward's canonical order
        argmax = torch.empty(math.prod(dims), dtype=_argmax_dtype(math.prod(plan.window)), device=argmax.device)
        _forward_launch(problem, "argmax", x, y, argmax, argmax_strides)
    cells = _cell_sizes(plan.in_sizes, plan.stride, plan.pads)
    dy_strides = plan.permute(_five(dy.desc.strides, lead, 0))
    dx_strides = plan.permute(_five(dx.desc.strides, lead, 0))
    shifts = tuple(-(-w // s) for w, s in zip(plan.window, plan.stride))
    rows = math.prod(cells[:4])
    block_r, block_c = _blocks(cells[4], rows, dx_strides[4] == 1)
    column_blocks = triton.cdiv(cells[4], block_c)
    grid = (triton.cdiv(rows, block_r) * column_blocks,)
    pool_backward_kernel[grid](
        _torch_view(dy), argmax, _torch_view(dx), plan.in_sizes, plan.out_sizes, cells, plan.pads, dy_strides,
        plan.permute(argmax_strides), dx_strides, rows, column_blocks, problem.alpha, problem.beta,
        WINDOW=plan.window, STRIDE=plan.stride, SHIFTS=shifts, LINEAR=plan.linear,
        KIND="max" if problem.mode.is_max else "avg", INCLUDE_PADDING=problem.mode.value == "avg_include",
        HAS_BETA=problem.beta != 0.0, UNROLL=math.prod(plan.stride) * math.prod(shifts) <= UNROLL_LIMIT,
        COMPUTE=_compute(problem), BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)


def _compute(problem: PoolingProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32


def _torch_view(bound: Bound) -> Any:
    """The bound view as a torch tensor sharing memory (a NumPy array is wrapped, bfloat16 bits
    reinterpreted)."""
    import numpy as np
    import torch

    view = bound.view
    if isinstance(view, np.ndarray):
        view = torch.from_numpy(view)
        if bound.desc.dtype is DataType.BFLOAT16:
            view = view.view(torch.bfloat16)
    return view
