"""The Triton kernels of a global max pool's backward whose window positions are one unit-stride run in x and
dx (NCHW / NCDHW global pools: the design is in ``triton_backend``'s docstring).

A cell is one window (one output: the dims not pooled, flattened), and its positions, row-major in N, C, D,
H, W order, are also the offsets of its elements from the cell's start in x and in dx. A program holds
BLOCK_CELLS cells by BLOCK_POSITIONS positions, a warp's lanes along the positions: its loads of x and its
stores of dx are whole lines of 16-byte vectors. Grid axis 0 walks the blocks of cells, grid axis 1 cuts each
window into as many runs of whole BLOCK_POSITIONS (``window_run``), one a program; the count is the grid's,
and the sizes are arguments: one compiled kernel per dtype serves every input size.

Memory model (E = x's elements, F = y's, S = the runs): the argmax pass reads x and y (E + F elements) and
writes S F positions (int8, int16 or int32 by the window's size); the gather reads those positions and dy (F)
and writes dx (E): 2 E elements moved where F is small. One compare and select per position each way:
memory-bound.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.pooling.triton_forward import split_constant, window_run


@triton.jit
def cell_offset(c0, c1, c2, c3, c4, strides):
    """int64 offsets of cells at coordinates ``c0 .. c4`` in a tensor of ``strides`` (per cell, not per element:
    the positions past a cell's start stay int32)."""
    return (
        c0.to(tl.int64) * strides[0]
        + c1.to(tl.int64) * strides[1]
        + c2.to(tl.int64) * strides[2]
        + c3.to(tl.int64) * strides[3]
        + c4.to(tl.int64) * strides[4]
    )


@triton.jit
def program_cells(cells, BLOCK_CELLS: tl.constexpr):
    """The program's cells and which of them exist; those past the last read the last cell's window (valid
    addresses: only the stores are masked)."""
    cell = tl.program_id(0) * BLOCK_CELLS + tl.arange(0, BLOCK_CELLS)
    return tl.minimum(cell, cells - 1), cell < cells


@triton.jit
def matches(x_rows, p, y, y_is_nan, found, positions, MASKED: tl.constexpr):
    """``found``, set to the position ``p`` where the cells' x there (``p`` past ``x_rows``) equals their y, NaN
    matching NaN. MASKED: loads only the positions below ``positions``, the window's end."""
    if MASKED:
        x = tl.load(x_rows[:, None] + p[None, :], mask=(p < positions)[None, :])
    else:
        x = tl.load(x_rows[:, None] + p[None, :])
    return tl.where((x == y) | ((x != x) & y_is_nan), p[None, :], found)


@triton.jit
def global_argmax_kernel(
    x_ptr,
    y_ptr,
    argmax_ptr,
    cells,
    positions,
    cell_sizes,
    x_strides,
    y_strides,
    BLOCK_CELLS: tl.constexpr,
    BLOCK_POSITIONS: tl.constexpr,
):
    """Program: BLOCK_CELLS cells by one run of their windows' positions. Writes, per cell, the first position of
    the run whose x equals the cell's y (NaN matching NaN), or ``positions`` (the window's size) where none does,
    into run ``program_id(1)`` of the scratch (``cells`` entries a run). Cells are indices row-major over
    ``cell_sizes``; ``x_strides`` and ``y_strides`` are the tensors' strides over the same dims (the pooled dims
    flatten to x's unit-stride positions)."""
    cell, cell_ok = program_cells(cells, BLOCK_CELLS)
    c0, c1, c2, c3, c4 = split_constant(cell, cell_sizes)
    x_rows = x_ptr + cell_offset(c0, c1, c2, c3, c4, x_strides)
    y = tl.load(y_ptr + cell_offset(c0, c1, c2, c3, c4, y_strides))[:, None]
    y_is_nan = y != y
    start, end = window_run(positions, BLOCK_POSITIONS)
    whole = (end - start) // BLOCK_POSITIONS
    tail = start + whole * BLOCK_POSITIONS
    # the lines last to first: a lane keeps its last match, which is its first (one select a position)
    found = tl.full((BLOCK_CELLS, BLOCK_POSITIONS), positions, tl.int32)
    if tail < end:  # the window's last line, partly past its end: masked
        found = matches(x_rows, tail + tl.arange(0, BLOCK_POSITIONS), y, y_is_nan, found, positions, True)
    for k in range(whole):  # whole lines: no mask to compute, no masked value to set
        p = tail - (k + 1) * BLOCK_POSITIONS + tl.arange(0, BLOCK_POSITIONS)
        found = matches(x_rows, p, y, y_is_nan, found, positions, False)
    # a lane past the window's end (a masked load, any value) may hold a position past it, but the partial line's
    # first lane lies inside: the least is the first match, or the window's size
    first = tl.min(found, axis=1)
    argmax_at = argmax_ptr + tl.program_id(1).to(tl.int64) * cells + cell
    tl.store(argmax_at, first.to(argmax_ptr.dtype.element_ty), mask=cell_ok)


@triton.jit
def global_gather_kernel(
    dy_ptr,
    argmax_ptr,
    dx_ptr,
    cells,
    positions,
    cell_sizes,
    dy_strides,
    dx_strides,
    alpha: tl.float64,
    beta: tl.float64,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_CELLS: tl.constexpr,
    BLOCK_POSITIONS: tl.constexpr,
):
    """Program: BLOCK_CELLS cells by one run of their windows' positions. Per cell its window's argmax (the least
    of the argmax pass's runs, as many as grid axis 1 has programs: the first match, since the runs come in
    window order) and its dy, loaded once; then over the run ``dx = alpha * dy`` at the argmax, 0 elsewhere (``+
    beta * dx`` with HAS_BETA). Every element of dx is written once, no atomics."""
    cell, cell_ok = program_cells(cells, BLOCK_CELLS)
    c0, c1, c2, c3, c4 = split_constant(cell, cell_sizes)
    argmax_at = argmax_ptr + cell
    first = tl.load(argmax_at).to(tl.int32)
    for _ in range(1, tl.num_programs(1)):
        argmax_at += cells  # the next run's (pointers step in 64 bits)
        first = tl.minimum(first, tl.load(argmax_at).to(tl.int32))
    gradient = tl.load(dy_ptr + cell_offset(c0, c1, c2, c3, c4, dy_strides)).to(COMPUTE) * tl.cast(alpha, COMPUTE)
    if not HAS_BETA:  # the select in dx's dtype: no conversion per element
        gradient = gradient.to(dx_ptr.dtype.element_ty)
    dx_rows = dx_ptr + cell_offset(c0, c1, c2, c3, c4, dx_strides)
    start, end = window_run(positions, BLOCK_POSITIONS)
    for line in range(start, end, BLOCK_POSITIONS):
        p = line + tl.arange(0, BLOCK_POSITIONS)
        dx_at = dx_rows[:, None] + p[None, :]
        mask = cell_ok[:, None] & (p < positions)[None, :]
        result = tl.where(p[None, :] == first[:, None], gradient[:, None], 0.0)
        if HAS_BETA:
            result += tl.cast(beta, COMPUTE) * tl.load(dx_at, mask=mask).to(COMPUTE)
        tl.store(dx_at, result.to(dx_ptr.dtype.element_ty), mask=mask)
