"""Pooling on the NumPy backend: whole-array passes over the windows in the compute dtype (float32,
float64 for float64 tensors), the same map as the float64 reference in problem.py.

Forward, max and sum are separable: the windows are reduced one spatial dim at a time, a pass per
window position along that dim over strided views of the padded input (3 + 3 passes for a 3x3
window instead of 9). Max pads with NaN and reduces with ``fmax``, which skips NaN, so a window is
NaN only when all its inputs are; with NaN propagation it pads with -inf and reduces with
``maximum``, which keeps NaN. The backward passes run the (N, C) planes in chunks that stay in
cache, into dx's own memory where they may: average backward is the transpose of its forward, one
dim at a time; max backward finds each window's first position (row-major) holding y and adds dy
there with one ``np.add.at``. The indices of ``return_indices`` are the reference's.
"""

from __future__ import annotations

import math

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import output_array, read, write
from opendnn.families.pooling.problem import (
    PoolingMode,
    PoolingProblem,
    _Geometry,
    _geometry,
    reference_indices,
)

CHUNK_ELEMENTS = 1 << 17  # a backward chunk's padded planes: 512 KB of float32, in L2 beside its windows


def supports(problem: PoolingProblem) -> str | None:
    return None


def run(
    problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None, indices: Bound | None = None
) -> None:
    compute = problem.compute_dtype
    geo = _geometry(x.desc.dims, problem.window, problem.padding, problem.stride, problem.ceil_mode, problem.dilation)
    include_padding = problem.mode is PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
    if dx is None or dy is None:
        values = read(x, compute)
        if problem.mode.is_max:
            result = max_forward(values, geo, problem.propagate_nan)
        else:
            result = _reduce_windows(_padded(values, geo, 0.0), geo, np.add)
            result /= geo.counts(include_padding)
        write(y, result, problem.alpha, problem.beta)
        if indices is not None:
            options = (problem.propagate_nan, problem.ceil_mode, problem.dilation)
            write(indices, reference_indices(values, problem.window, problem.padding, problem.stride, *options))
        return
    gradient = read(dy, compute)
    inputs = [read(x, compute), read(y, compute), gradient] if problem.mode.is_max else [gradient]
    target = output_array(dx, compute, problem.alpha, problem.beta, *inputs)  # dx's own memory, where it may be
    result = np.empty(x.desc.dims, compute.to_numpy()) if target is None else target
    counts = geo.counts(include_padding).astype(result.dtype)
    if problem.mode.is_max:
        max_backward(inputs[0], inputs[1], gradient, geo, result)
    elif _whole_planes(geo):  # one window per plane: its share of dy broadcast over the plane
        np.copyto(result, gradient / counts)
    else:
        average_backward(gradient, counts, geo, result)
    if target is None:
        write(dx, result, problem.alpha, problem.beta)


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
    """Whether each plane is one window, unpadded (global pooling)."""
    return all(o == 1 and p == 0 and w == n for o, p, w, n in zip(geo.out, geo.padding, geo.window, geo.size))


def _reduce_windows(padded: np.ndarray, geo: _Geometry, combine: np.ufunc) -> np.ndarray:
    """``combine`` over each window of the padded input (left unchanged), one spatial dim at a time
    (outermost first: its slices are whole rows); a plane that is one window in one reduction over
    its contiguous rows, a sum as one matrix-vector product."""
    if _whole_planes(geo):
        planes = padded.reshape(*padded.shape[:2], -1)
        if combine is np.add:
            total = planes @ np.ones(planes.shape[2], planes.dtype)
        else:
            total = combine.reduce(planes, axis=2)
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


def max_backward(x: np.ndarray, y: np.ndarray, dy: np.ndarray, geo: _Geometry, dx: np.ndarray) -> None:
    """dx (C-ordered, x's dims): each window's dy added at its first position (row-major) whose input
    equals y (or is NaN where y is NaN); a window holding no such input adds nothing.

    The (N, C) planes run in chunks whose padded input stays in cache while each window position
    ``j`` is compared with y (one strided pass each). Position ``j``'s code is ``1 + last - shift(j)``,
    ``shift(j)`` its flat offset in the padded plane from the window's origin and ``last`` the largest:
    offsets grow in row-major window order, so each window's largest code among the positions holding
    y names its first such position (0: none). One ``np.add.at`` adds each window's dy at its origin
    plus that offset into the chunk's padded dx, whose inside is the chunk's dx."""
    planes = x.shape[0] * x.shape[1]
    xs, ys, dys, dxs = (a.reshape(planes, *a.shape[2:]) for a in (x, y, dy, dx))
    size, chunk, spatial = _chunking(geo, planes)
    inside = (slice(None), *spatial)
    strides = [math.prod(size[k + 1 :]) for k in range(len(size))]
    padded = np.full((chunk, *size), np.nan, x.dtype)  # the padding never equals y
    padded_dx = np.empty_like(padded)
    offsets = [(slice(None), *index[2:]) for _, index in geo.offsets()]
    shifts = [sum(jk * d * st for jk, d, st in zip(j, geo.dilation, strides)) for j, _ in geo.offsets()]
    last = shifts[-1]
    code = np.empty((chunk, *geo.out), np.min_scalar_type(last + 1))
    first = np.empty_like(code)
    origin = np.zeros((1,) * len(size), np.intp)  # each window's first position in its padded plane
    for k, (o, s, st) in enumerate(zip(geo.out, geo.stride, strides)):
        origin = origin + (np.arange(o) * s * st).reshape(tuple(o if m == k else 1 for m in range(len(size))))
    base = (np.arange(chunk) * math.prod(size)).reshape(chunk, *(1,) * len(size)) + origin + last + 1
    flat = np.empty(base.shape, np.intp)
    y_nan = np.isnan(ys) if np.isnan(ys).any() else None
    valid = np.pad(np.ones(geo.size, bool), geo.pad_widths()[2:])  # where a NaN input may match a NaN y
    for start in range(0, planes, chunk):
        n = min(planes, start + chunk) - start
        padded[:n][inside] = xs[start : start + n]
        first[:n] = 0
        for index, shift in zip(offsets, shifts):
            v = padded[:n][index]
            np.equal(v, ys[start : start + n], out=code[:n], casting="unsafe")
            if y_nan is not None:
                code[:n] |= np.isnan(v) & y_nan[start : start + n] & valid[index[1:]]
            code[:n] *= code.dtype.type(last + 1 - shift)
            np.maximum(first[:n], code[:n], out=first[:n])
        np.subtract(base[:n], first[:n], out=flat[:n])
        padded_dx[:n] = 0
        if first[:n].all():
            np.add.at(padded_dx[:n].reshape(-1), flat[:n].reshape(-1), dys[start : start + n].reshape(-1))
        else:
            found = first[:n] > 0
            np.add.at(padded_dx[:n].reshape(-1), flat[:n][found], dys[start : start + n][found])
        dxs[start : start + n] = padded_dx[:n][inside]


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
