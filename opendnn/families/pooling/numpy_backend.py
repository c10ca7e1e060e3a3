"""Pooling on the NumPy backend: whole-array passes over the windows in the compute dtype (float32,
float64 for float64 tensors), the same map as the float64 reference in problem.py.

Forward, max and sum are separable: the windows are reduced one spatial dim at a time, a pass per
window position along that dim over strided views of the padded input (3 + 3 passes for a 3x3
window instead of 9). Max pads with NaN and reduces with ``fmax``, which skips NaN, so a window is
NaN only when all its inputs are; with NaN propagation it pads with -inf and reduces with
``maximum``, which keeps NaN. Average backward is the transpose of its forward, one dim at a time.
Max backward finds each window's first position (row-major) holding y, then adds dy into dx with
one ``bincount`` over x's flat positions. The indices of ``return_indices`` are the reference's.
"""

from __future__ import annotations

import math

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.pooling.problem import (
    PoolingMode,
    PoolingProblem,
    _Geometry,
    _geometry,
    reference_indices,
)


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
    if problem.mode.is_max:
        result = max_backward(read(x, compute), read(y, compute), gradient, geo)
    else:
        gradient = gradient / geo.counts(include_padding)  # each window's share of its dy
        result = average_backward(gradient, geo)
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


def _reduce_windows(padded: np.ndarray, geo: _Geometry, combine: np.ufunc) -> np.ndarray:
    """``combine`` over each window of the padded input (left unchanged), one spatial dim at a time
    (outermost first: its slices are whole rows)."""
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


def max_backward(x: np.ndarray, y: np.ndarray, dy: np.ndarray, geo: _Geometry) -> np.ndarray:
    """dx: each window's dy added at its first position (row-major) whose input equals y (or is NaN
    where y is NaN); a window holding no such input adds nothing."""
    widths = geo.pad_widths()
    padded = np.pad(x, widths, constant_values=np.nan)  # padding never equals y
    y_nan = np.isnan(y)
    valid = np.pad(np.ones(x.shape[2:], bool), widths[2:]) if y_nan.any() else None
    offsets = list(geo.offsets())
    origin = geo.flat_positions((0,) * len(geo.out))  # flat index into x's spatial plane of each window's start
    plane_strides = [math.prod(geo.size[k + 1 :]) for k in range(len(geo.size))]
    shift = np.array([sum(jk * d * st for jk, d, st in zip(j, geo.dilation, plane_strides)) for j, _ in offsets])
    tap = np.full(y.shape, -1, np.min_scalar_type(-len(offsets)))  # each window's first position holding y
    for t in reversed(range(len(offsets))):  # the last write is the first position
        v = padded[offsets[t][1]]
        hit = v == y
        if valid is not None:
            hit |= np.isnan(v) & y_nan & valid[offsets[t][1][2:]]
        np.copyto(tap, t, where=hit)
    planes = np.arange(y.shape[0] * y.shape[1]).reshape(y.shape[:2] + (1,) * len(geo.out)) * math.prod(geo.size)
    flat = shift[tap] + origin + planes  # an index into x.reshape(-1); wrong only where tap is -1
    found = tap >= 0
    if found.all():
        dx = np.bincount(flat.reshape(-1), weights=dy.reshape(-1), minlength=x.size)
    else:
        dx = np.bincount(flat[found], weights=dy[found], minlength=x.size)
    return dx.reshape(x.shape).astype(x.dtype, copy=False)


def average_backward(share: np.ndarray, geo: _Geometry) -> np.ndarray:
    """dx of an average pool from each window's share of dy: the transpose of the forward's passes,
    each share added to every position of its window."""
    widths = geo.pad_widths()
    result = share
    for k in reversed(range(len(geo.window))):
        before, after = widths[2 + k]
        shape = list(result.shape)
        shape[2 + k] = geo.size[k] + before + after
        spread = np.zeros(shape, share.dtype)
        for j in range(geo.window[k]):
            spread[_taps(geo, k, j, spread.ndim)] += result
        result = spread
    inside = tuple(slice(before, before + n) for (before, _), n in zip(widths[2:], geo.size))
    return result[(slice(None), slice(None), *inside)]
