"""Pooling on the NumPy backend: whole-array passes over the windows in the compute dtype (float32,
float64 for float64 tensors), the same map as the float64 reference in problem.py.

Forward, max and sum are separable: the windows are reduced one spatial dim at a time, a pass per
window position along that dim over strided views of the padded input (3 + 3 passes for a 3x3
window instead of 9). Max pads with NaN and reduces with ``fmax``, which skips NaN, so a window is
NaN only when all its inputs are; with NaN propagation it pads with -inf and reduces with
``maximum``, which keeps NaN. The backward passes run the (N, C) planes in chunks that stay in
cache, into dx's own memory where they may: average backward is the transpose of its forward, one
dim at a time; max backward splits the chunk's padded planes by the stride into phases, where each
window position is compared with y in one contiguous pass, finds each window's first position
(row-major) holding y and adds dy there with one ``np.add.at``. A plane that is one window (global
pooling) reduces in one pass. The indices of ``return_indices`` are the reference's.

Adaptive windows (cells of varying size or step, ``PoolingProblem.adaptive``) take every output's cell from
its bounds (``_cell_table``: per dim, each output's positions, the largest cell wide, and which of them lie
in its cell): the forward reduces one spatial dim at a time over those positions gathered, the backward
walks the positions of the largest window (row-major) over every output at once, finds each cell's first
position equal to y (max) and adds dy there, or adds dy over the cell's size (averages), with ``np.add.at``
(cells overlap, and repeat where the output is larger than the input).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import output_array, read, write
from opendnn.families.pooling.problem import (
    PoolingMode,
    PoolingProblem,
    _Geometry,
    _geometry,
    adaptive_cells,
    reference_indices,
)

CHUNK_ELEMENTS = 1 << 17  # a backward chunk's padded planes: 512 KB of float32, in L2 beside its windows


def supports(problem: PoolingProblem) -> str | None:
    return None


def run(
    problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None, indices: Bound | None = None
) -> None:
    compute = problem.compute_dtype
    if problem.adaptive:
        _adaptive_run(problem, x, y, dy, dx)
        return
    geo, counts = _windows(problem)
    if dx is None or dy is None:
        values = read(x, compute)
        if problem.mode.is_max:
            result = max_forward(values, geo, problem.propagate_nan)
        else:
            result = _reduce_windows(_padded(values, geo, 0.0), geo, np.add)
            result /= counts
        write(y, result, problem.alpha, problem.beta)
        if indices is not None:
            options = (problem.propagate_nan, problem.ceil_mode, problem.dilation)
            write(indices, reference_indices(values, problem.window, problem.padding, problem.stride, *options))
        return
    gradient = read(dy, compute)
    inputs = [read(x, compute), read(y, compute), gradient] if problem.mode.is_max else [gradient]
    target = output_array(dx, compute, problem.alpha, problem.beta, *inputs)  # dx's own memory, where it may be
    result = np.empty(x.desc.dims, compute.to_numpy()) if target is None else target
    if problem.mode.is_max:
        max_backward(inputs[0], inputs[1], gradient, geo, result)
    elif _whole_planes(geo):  # one window per plane: its share of dy broadcast over the plane
        np.copyto(result, gradient / counts)
    else:
        average_backward(gradient, counts, geo, result)
    if target is None:
        write(dx, result, problem.alpha, problem.beta)


@functools.lru_cache(maxsize=256)  # per problem: forming them costs more than a small pool's passes
def _windows(problem: PoolingProblem) -> tuple[_Geometry, np.ndarray]:
    """The problem's windows and each window's count as the averages count it, in the compute dtype
    (small integers: exact), read-only: the problem's calls share it."""
    geo = _geometry(
        problem.x.dims, problem.window, problem.padding, problem.stride, problem.ceil_mode, problem.dilation
    )
    counts = geo.counts(problem.mode is PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING)
    counts = counts.astype(problem.compute_dtype.to_numpy())
    counts.flags.writeable = False
    return geo, counts


def _taps(geo: _Geometry, k: int, j: int, ndim: int) -> tuple[slice, ...]:
    """Window position ``j`` along spatial dim ``k``: the slice of the padded input it reads for every output."""
    start = j * geo.dilation[k]
    along = slice(start, start + (geo.out[k] - 1) * geo.stride[k] + 1, geo.stride[k])
    return (slice(None),) * (2 + k) + (along,) + (slice(None),) * (ndim - 3 - k)


def _padded(x: np.ndarray, geo: _Geometry, fill: float) -> np.ndarray:
    """x padded with ``fill`` so that every window lies inside it (x itself where no padding is needed)."""
    widths = geo.pad_widths()
    return np.pad(x, widths, constant_values=fill) if any(before or after for before, after in widths) else x


def _whole_planes(geo: _Geometry) -> bool:
    """Whether each plane is one window, unpadded and undilated (global pooling)."""
    return all(
        o == 1 and p == 0 and w == n and (d == 1 or n == 1)
        for o, p, w, n, d in zip(geo.out, geo.padding, geo.window, geo.size, geo.dilation)
    )


def _reduce_windows(padded: np.ndarray, geo: _Geometry, combine: np.ufunc) -> np.ndarray:
    """``combine`` over each window of the padded input (left unchanged), one spatial dim at a time
    (outermost first: its slices are whole rows); a plane that is one window in one reduction over
    its contiguous rows (a sum as einsum's vectorised sum, 3.5 times faster than ``np.add.reduce``
    over rows of 49)."""
    if _whole_planes(geo):
        planes = padded.reshape(*padded.shape[:2], -1)
        total = np.einsum("ncl->nc", planes) if combine is np.add else combine.reduce(planes, axis=2)
        return total.reshape(*planes.shape[:2], *geo.out)
    result = padded
    for k, window in enumerate(geo.window):
        if geo.out[k] == 1:  # one window along this dim (global pooling): one reduction
            extent = slice(0, (window - 1) * geo.dilation[k] + 1, geo.dilation[k])
            result = combine.reduce(result[(slice(None),) * (2 + k) + (extent,)], axis=2 + k, keepdims=True)
            continue
        partial = result[_taps(geo, k, 0, padded.ndim)].copy()
        for j in range(1, window):
            combine(partial, result[_taps(geo, k, j, padded.ndim)], out=partial)
        result = partial
    return result


def max_forward(x: np.ndarray, geo: _Geometry, propagate_nan: bool) -> np.ndarray:
    """The largest input of each window; NaN where all are NaN, or with ``propagate_nan`` where any is."""
    fill, combine = (-np.inf, np.maximum) if propagate_nan else (np.nan, np.fmax)
    result = _reduce_windows(_padded(x, geo, fill), geo, combine)
    if propagate_nan:  # a window of padding alone reduced to -inf: it holds no input, so it is NaN
        holds_input = _windows_holding_input(geo)
        if not holds_input.all():
            result[..., ~holds_input] = np.nan
    return result


def _windows_holding_input(geo: _Geometry) -> np.ndarray:
    """Per output position (``geo.out`` dims), whether its window reads an input element."""
    holds = np.ones((), bool)
    for n, w, p, s, d, o in zip(geo.size, geo.window, geo.padding, geo.stride, geo.dilation, geo.out):
        positions = np.arange(o)[None, :] * s - p + np.arange(w)[:, None] * d
        holds = np.multiply.outer(holds, ((positions >= 0) & (positions < n)).any(axis=0))
    return holds


def _chunking(geo: _Geometry, planes: int) -> tuple[tuple[int, ...], int, tuple[slice, ...]]:
    """A padded plane's dims, the planes per chunk (CHUNK_ELEMENTS of padded planes, at least one) and
    the slices of a padded plane that hold the input."""
    widths = geo.pad_widths()[2:]
    size = tuple(n + before + after for n, (before, after) in zip(geo.size, widths))
    inside = tuple(slice(before, before + n) for (before, _), n in zip(widths, geo.size))
    return size, max(1, min(planes, CHUNK_ELEMENTS // math.prod(size))), inside


class _Phases:
    """The chunk's padded planes split by the stride along each spatial dim into phases (phase q
    holds padded positions ``q + stride * e``), every phase a flat buffer of one layout, ext dims
    ``ceil(padded / stride)``, that the outputs share: output o of plane p sits at ``p * plane +
    sum(o_k * ext_strides[k])``, and window position j reads phase ``j * dilation % stride`` there,
    shifted by ``sum((j * dilation // stride)_k * ext_strides[k])``. So each comparison of window
    positions with y is one pass over contiguous memory, and a phase's positions (those of a
    regular grid of j) are compared in one call. Places of the layout that no output takes, the
    padding and phase places past the padded plane hold ``junk``."""

    def __init__(
        self, geo: _Geometry, size: tuple[int, ...], chunk: int, dtype: np.dtype, junk: object = np.nan
    ) -> None:
        self.size, self.chunk = size, chunk
        self.ext = tuple(-(-n // s) for n, s in zip(size, geo.stride))
        self.ext_strides = [math.prod(self.ext[k + 1 :]) for k in range(len(size))]
        self.plane = math.prod(self.ext)
        self.length = chunk * self.plane
        groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}  # phase: the window positions reading it
        for j in itertools.product(*map(range, geo.window)):
            groups.setdefault(tuple(jk * d % s for jk, d, s in zip(j, geo.dilation, geo.stride)), []).append(j)
        slack = sum((w - 1) * d // s * e for w, d, s, e in zip(geo.window, geo.dilation, geo.stride, self.ext_strides))
        self.padded = np.full(chunk * math.prod(size) + slack, junk, dtype)
        self.phases = {}
        self.views = []  # per phase: the positions reading it, all at once: (*grid, length)
        self.positions: list[tuple[int, ...]] = []  # in the order of the views' rows
        item = np.dtype(dtype).itemsize
        for phase, js in groups.items():
            # with unit strides the one phase is the padded planes themselves
            buffer = self.padded if self.ext == size else np.full(self.length + slack, junk, dtype)
            self.phases[phase] = buffer
            values = [sorted({j[k] for j in js}) for k in range(len(size))]
            shifts = [[jk * d // s for jk in v] for v, d, s in zip(values, geo.dilation, geo.stride)]
            steps = [o[1] - o[0] if len(o) > 1 else 0 for o in shifts]
            start = sum(o[0] * e for o, e in zip(shifts, self.ext_strides))
            grid = tuple(len(v) for v in values)
            strides = (*(st * e * item for st, e in zip(steps, self.ext_strides)), item)
            # (the array constructor, not as_strided's machinery: a call of a few us on small problems)
            self.views.append(np.ndarray((*grid, self.length), buffer.dtype, buffer, start * item, strides))
            self.positions += [
                tuple(values[k][i] for k, i in enumerate(index)) for index in itertools.product(*map(range, grid))
            ]
        self.match = np.empty((len(self.positions), self.length), bool)
        rows = np.cumsum([0] + [math.prod(v.shape[:-1]) for v in self.views])
        self.rows = [self.match[a:b].reshape(v.shape) for a, b, v in zip(rows[:-1], rows[1:], self.views)]
        self.outputs = (slice(None), *(slice(0, o) for o in geo.out))
        self.steps = geo.stride

    def fill(self, x: np.ndarray, inside: tuple[slice, ...]) -> None:
        """The planes of x (at most ``chunk``, spatial dims ``x.shape[1:]``) into the padded planes and
        their phases."""
        n = x.shape[0]
        phased = len(self.phases) > 1 or self.ext != self.size
        if phased and x.shape[1:] == self.size:  # no padding: the phases come from x itself
            padded = x
        else:
            padded = self.padded[: self.chunk * math.prod(self.size)].reshape(self.chunk, *self.size)[:n]
            padded[(slice(None), *inside)] = x
        if phased:
            for phase, buffer in self.phases.items():
                source = padded[(slice(None), *(slice(q, None, s) for q, s in zip(phase, self.steps)))]
                buffer[: self.length].reshape(self.chunk, *self.ext)[(slice(0, n), *map(slice, source.shape[1:]))] = (
                    source
                )

    def layout(self, values: np.ndarray) -> np.ndarray:
        """The output places of a flat array of the layout, as (chunk, *out)."""
        return values[: self.length].reshape(self.chunk, *self.ext)[self.outputs]

    def compare(self, y: np.ndarray, used: int, op: np.ufunc = np.equal) -> np.ndarray:
        """match[i, :used] = op(window position ``positions[i]`` of each output, y (layout))."""
        for view, rows in zip(self.views, self.rows):
            op(view[..., :used], y[:used], out=rows[..., :used])
        return self.match


def max_backward(x: np.ndarray, y: np.ndarray, dy: np.ndarray, geo: _Geometry, dx: np.ndarray) -> None:
    """dx (C-ordered, x's dims): each window's dy added at its first position (row-major) whose input
    equals y (or is NaN where y is NaN); a window holding no such input adds nothing.

    The (N, C) planes run in chunks held in the phases of ``_Phases``, where every window position
    is compared with y in one contiguous pass. Position ``j``'s code is ``1 + last - shift(j)``,
    ``shift(j)`` its flat offset from the window's origin in the plane dx is scattered into and
    ``last`` the largest: offsets grow in row-major window order, so each window's largest code
    among the positions holding y names its first such position (0: none). One ``np.add.at`` adds
    each window's dy at its origin plus that offset. That plane is x's own where the window is
    narrower than x along every dim but the first (the offsets grow there too), dx straight, and
    else the padded plane, whose inside is then copied to dx."""
    planes = x.shape[0] * x.shape[1]
    xs, ys, dys, dxs = (a.reshape(planes, *a.shape[2:]) for a in (x, y, dy, dx))
    if ys.size == 0:  # no window
        dx.fill(0)
        return
    size, chunk, inside = _chunking(geo, planes)
    phases = _Phases(geo, size, chunk, x.dtype)
    direct = all((w - 1) * d < n for w, d, n in zip(geo.window[1:], geo.dilation[1:], geo.size[1:]))
    target = geo.size if direct else size
    strides = [math.prod(target[k + 1 :]) for k in range(len(target))]
    last = sum((w - 1) * d * st for w, d, st in zip(geo.window, geo.dilation, strides))
    codes = np.array(
        [last + 1 - sum(jk * d * st for jk, d, st in zip(j, geo.dilation, strides)) for j in phases.positions],
        np.min_scalar_type(last + 1),
    )[:, None]
    origin = np.zeros((1,) * len(target), np.intp)  # each window's first position in the target plane
    for k, (o, s, p, st) in enumerate(zip(geo.out, geo.stride, geo.padding, strides)):
        where = (np.arange(o) * s - (p if direct else 0)) * st
        origin = origin + where.reshape(tuple(o if m == k else 1 for m in range(len(target))))
    planes_at = (np.arange(chunk) * math.prod(target)).reshape(chunk, *(1,) * len(target))
    base = planes_at + origin + last + 1
    flat = np.empty_like(base)
    match = phases.match
    wide = codes.dtype.itemsize > 1  # codes past a byte: the matches copied into them
    found = np.empty(match.shape, codes.dtype) if wide else match.view(np.uint8)
    first = np.empty(phases.length, codes.dtype)
    y_layout = np.full(phases.length, np.nan, x.dtype)  # junk never equals
    nan_match = None
    if np.isnan(np.max(ys)):  # where y is NaN, the NaN inputs of its window (not the padding) match it
        x_nan = _Phases(geo, size, chunk, np.dtype(bool), junk=False)
        y_nan, nan_match = np.zeros(phases.length, bool), x_nan.match
    padded_dx = None if direct else np.empty((chunk, *size), x.dtype)
    windows = math.prod(geo.out)
    for start in range(0, planes, chunk):
        n = min(planes, start + chunk) - start
        used = n * phases.plane
        phases.fill(xs[start : start + n], inside)
        phases.layout(y_layout)[:n] = ys[start : start + n]
        phases.compare(y_layout, used)
        if nan_match is not None:
            x_nan.fill(np.isnan(xs[start : start + n]), inside)
            x_nan.layout(y_nan)[:n] = np.isnan(ys[start : start + n])
            x_nan.compare(y_nan, used, np.logical_and)
            match[:, :used] |= nan_match[:, :used]
        if wide:
            np.copyto(found[:, :used], match[:, :used])
        np.multiply(found[:, :used], codes, out=found[:, :used])
        np.maximum.reduce(found[:, :used], axis=0, out=first[:used])
        codes_out = phases.layout(first)[:n]
        np.subtract(base[:n], codes_out, out=flat[:n])
        out = dxs[start : start + n] if padded_dx is None else padded_dx[:n]
        out.fill(0)
        if np.count_nonzero(first[:used]) == n * windows:
            np.add.at(out.reshape(-1), flat[:n].reshape(-1), dys[start : start + n].reshape(-1))
        else:  # a window none of whose inputs equals y adds nothing
            hit = codes_out > 0
            np.add.at(out.reshape(-1), flat[:n][hit], dys[start : start + n][hit])
        if padded_dx is not None:
            dxs[start : start + n] = out[(slice(None), *inside)]


def average_backward(dy: np.ndarray, counts: np.ndarray, geo: _Geometry, dx: np.ndarray) -> None:
    """dx (C-ordered, x's dims) of an average pool: each window's share of dy (dy / its count) added to
    every position of its window, the transpose of the forward's passes one spatial dim at a time, in
    chunks of planes whose spread shares stay in cache."""
    planes = dy.shape[0] * dy.shape[1]
    dys, dxs = dy.reshape(planes, 1, *dy.shape[2:]), dx.reshape(planes, 1, *dx.shape[2:])
    size, chunk, inside = _chunking(geo, planes)
    dims = len(size)
    share = np.empty((chunk, 1, *geo.out), dx.dtype)
    spreads = [np.empty((chunk, 1, *geo.out[:k], *size[k:]), dx.dtype) for k in range(dims)]
    for start in range(0, planes, chunk):
        n = min(planes, start + chunk) - start
        result = np.divide(dys[start : start + n], counts, out=share[:n])
        for k in reversed(range(dims)):
            spread = spreads[k][:n]
            spread.fill(0)
            for j in range(geo.window[k]):
                spread[_taps(geo, k, j, spread.ndim)] += result
            result = spread
        dxs[start : start + n] = result[(slice(None), slice(None), *inside)]


@functools.lru_cache(maxsize=256)  # per (input size, output size) of a dim
def _cell_table(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An adaptive dim's cells: per output (rows) and position of the largest cell (columns), the input
    position (a cell's last one past its end, a valid address), whether it lies in the cell, and each cell's
    size; read-only."""
    spans = np.array(adaptive_cells(size, out)).reshape(out, 2)
    sizes = spans[:, 1] - spans[:, 0]
    offsets = np.arange(int(sizes.max()))
    positions = np.minimum(spans[:, :1] + offsets, spans[:, 1:] - 1)
    inside = offsets < sizes[:, None]
    for table in (positions, inside, sizes):
        table.flags.writeable = False
    return positions, inside, sizes


def _along(values: np.ndarray, k: int, ndim: int) -> np.ndarray:
    """A per-output (or per (output, position)) table of spatial dim ``k`` shaped to broadcast there."""
    return values.reshape((1,) * (2 + k) + values.shape + (1,) * (ndim - 3 - k))


def _adaptive_run(problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None) -> None:
    compute = problem.compute_dtype
    sizes, outs = problem.x.dims[2:], problem.y.dims[2:]
    tables = [_cell_table(n, o) for n, o in zip(sizes, outs)]
    counts = np.ones((1, 1) + (1,) * len(outs), compute.to_numpy())
    for k, (_, _, cell_sizes) in enumerate(tables):
        counts = counts * _along(cell_sizes, k, problem.x.ndim)
    if dx is None or dy is None:
        combine: np.ufunc = np.add
        fill = 0.0
        if problem.mode.is_max:
            fill, combine = (-np.inf, np.maximum) if problem.propagate_nan else (np.nan, np.fmax)
        result = read(x, compute)
        for k, (positions, inside, _) in enumerate(tables):  # one spatial dim at a time: (.., out, window, ..)
            gathered = np.take(result, positions, axis=2 + k)
            if not inside.all():  # (a max may read a cell's last position again; a sum may not)
                gathered = np.where(_along(inside, k, gathered.ndim - 1), gathered, fill)
            result = combine.reduce(gathered, axis=3 + k)
        if not problem.mode.is_max:
            result = result / counts
        write(y, result, problem.alpha, problem.beta)
        return
    gradient = read(dy, compute)
    result = np.zeros(problem.x.dims, compute.to_numpy())
    found = np.zeros(gradient.shape, bool)
    if problem.mode.is_max:
        values, y_values = read(x, compute), read(y, compute)
        y_nan = np.isnan(y_values)
    else:  # (the average reads no x)
        share = gradient / counts
    window = [range(positions.shape[1]) for positions, _, _ in tables]
    for j in itertools.product(*window):  # row-major over the largest window: each cell's positions in order
        index: tuple[np.ndarray, ...] = ()
        inside = np.ones((1,) * len(outs), bool)
        for k, ((positions, cell, _), jk) in enumerate(zip(tables, j)):
            shape = tuple(-1 if m == k else 1 for m in range(len(outs)))
            index += (positions[:, jk].reshape(shape),)
            inside = inside & cell[:, jk].reshape(shape)
        where: tuple[Any, ...] = (slice(None), slice(None), *index)
        if problem.mode.is_max:
            v = values[where]
            first = inside & ~found & ((v == y_values) | (np.isnan(v) & y_nan))
            found |= first
            np.add.at(result, where, np.where(first, gradient, 0.0))
        else:
            np.add.at(result, where, np.where(inside, share, 0.0))
    write(dx, result, problem.alpha, problem.beta)
