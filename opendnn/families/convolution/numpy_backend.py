"""Convolution on the NumPy backend: every direction as one batched matrix product per call (BLAS),
in the compute dtype, every algorithm that applies computed the same way, no workspace.

The problem's padded x is viewed (``as_strided``, no copy) as columns ``(G, C/G, *filt, N, *out)``:
column (c, r) of output position (n, o) is ``x_padded[n, g*C/G + c, o * stride + r * dilation]``.
One contiguous copy of that view (im2col, C*R*S*N*out elements) turns each direction into a
matmul batched over the G groups, with ``wg`` the filter as ``(G, K/G, C/G * R*S)``:

    FORWARD:          y_g  = wg @ cols_g                      (K/G, N*out)
    BACKWARD_FILTER:  dw_g = (cols_g @ dy_g^T)^T              (K/G, C/G * R*S)
    BACKWARD_DATA:    dcols_g = wg^T @ dy_g, then each tap r adds its slice of dcols into dx_padded

Where y has x's spatial dims at unit strides, every tap reads x at one flat shift of the output's
place, so the columns are contiguous copies of x's own planes with the padding set to zero
(``_Shifts``): the forward of one group takes them a sample at a time, with no padded copy of x.

Depthwise convolutions (C/G == K/G == 1) skip the columns: per chunk of channels of one sample,
the taps' runs of the planes are copied into the rows of a stack and matmuls batched over the
channels form each channel's products. Where y has x's dims at unit strides (``_Shifts``), the
planes carry zero rows before and after, so the first spatial dim's taps are offsets into the stack
and it holds one row per combination of the other dims' taps: per first-dim tap, a (1, T_rest) @
(T_rest, plane) product, summed. Otherwise every tap's run of the padded planes (``_Planes``) is a
row, and one (1, T) @ (T, plane) product.

The float64 reference in problem.py (one einsum per filter tap) stays the oracle these are tested
against; alpha, the fused forward epilogue and the beta blend are the reference's own.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.blas_threads import blas_limit
from opendnn.core.reference_io import output_array, read, write
from opendnn.families.convolution.problem import (
    ConvolutionDirection,
    ConvolutionProblem,
    _filter_groups,
    _interior,
    _padded_shape,
    algorithm_refusal,
    blend_output,
)

# The forward's column matrix per chunk of samples, in bytes: as many samples as fit, at least one.
# Columns are allocated afresh on every call, and from 32 MB on glibc maps them anew each time, so
# that the copy into them first faults in every page (conv1 of ResNet-50 at batch 8: 59 MB, 7.4 MB a
# sample); below that the memory of the previous call is reused. One product per chunk: the fewer
# products, the fewer times the second BLAS thread is waited for.
GEMM_COLUMN_BYTES = 1 << 24
# A depthwise convolution's padded planes per chunk: the chunk, its output layout and the taps'
# products stay in L2.
DEPTHWISE_ELEMENTS = 1 << 15


def _blas_limit(problem: ConvolutionProblem) -> contextlib.AbstractContextManager[Any]:
    """One BLAS thread for a small convolution (the same count of products in every direction)."""
    return blas_limit(math.prod(problem.y.dims) * math.prod(problem.w.dims[1:]))


def supports(problem: ConvolutionProblem) -> str | None:
    return algorithm_refusal(problem)


def workspace_size(problem: ConvolutionProblem) -> int:
    """Bytes of workspace ``run`` needs: none, whatever the algorithm."""
    return 0


def _column_view(
    problem: ConvolutionProblem,
    x_padded: np.ndarray,
    filt: tuple[int, ...] | None = None,
    stride: tuple[int, ...] | None = None,
) -> np.ndarray:
    """The padded x (contiguous) viewed as (G, C/G, *filt, N, *out) without a copy: tap r of output o
    at ``o * stride + r * dilation`` (the problem's filter dims and stride unless given)."""
    groups, per_group = problem.groups, problem.w.dims[1]
    filt = tuple(problem.w.dims[2:]) if filt is None else filt
    stride = problem.stride if stride is None else stride
    item = x_padded.strides
    spatial = item[2:]
    shape = (groups, per_group, *filt, x_padded.shape[0], *problem.y.dims[2:])
    strides = (
        per_group * item[1],
        item[1],
        *(d * s for d, s in zip(problem.dilation, spatial)),
        item[0],
        *(st * s for st, s in zip(stride, spatial)),
    )
    return np.lib.stride_tricks.as_strided(x_padded, shape, strides, writeable=False)


def _padded(problem: ConvolutionProblem, x: np.ndarray) -> np.ndarray:
    """x padded with zeros (x itself, C-ordered, where no padding is nonzero)."""
    if not any(problem.pre_padding) and not any(problem.post_padding):
        return np.ascontiguousarray(x)
    x_padded = np.zeros((*x.shape[:2], *_padded_shape(problem)[2:]), x.dtype)
    x_padded[_interior(problem)] = x
    return x_padded


def _columns(problem: ConvolutionProblem, x: np.ndarray) -> np.ndarray:
    """im2col: (G, C/G * R*S, N * out), contiguous. Where the filter is wider than twice the stride
    along the last spatial dim, the padded x is first split into that many phases along it (every
    stride-th element, one copy of x), so that each tap along that dim reads its rows contiguously
    from one phase: the copy streams instead of gathering every stride-th element. A narrower filter
    reads each element of x too few times to pay for the phases (ResNet-50's 3x3 stride-2 layer:
    6.5 ms of columns with them, 5.6 without; its 7x7 stride-2 conv1: 11.3 with, 13.9 without)."""
    x_padded = _padded(problem, x)
    step, dilation, width = problem.stride[-1], problem.dilation[-1], problem.w.dims[-1]
    if step == 1 or width <= 2 * step:
        cols = np.ascontiguousarray(_column_view(problem, x_padded))
    else:
        view = _column_view(problem, x_padded)
        cols = np.empty(view.shape, x.dtype)
        phases = [np.ascontiguousarray(x_padded[..., q::step]) for q in range(step)]
        taps = (*problem.w.dims[2:-1], 1)
        for b in range(width):
            q, offset = (b * dilation) % step, (b * dilation) // step
            tap = _column_view(problem, phases[q][..., offset:], taps, (*problem.stride[:-1], 1))
            np.copyto(cols[(..., slice(b, b + 1)) + (slice(None),) * (1 + problem.spatial_dims)], tap)
    return cols.reshape(problem.groups, -1, x.shape[0] * math.prod(problem.y.dims[2:]))


def _filter_matrix(problem: ConvolutionProblem, w: np.ndarray) -> np.ndarray:
    """(K, C/G, *filt) -> (G, K/G, C/G * R*S), flipped for ConvolutionMode.CONVOLUTION."""
    wg = _filter_groups(w, problem)
    return wg.reshape(*wg.shape[:2], -1)


def _output_matrix(problem: ConvolutionProblem, y: np.ndarray) -> np.ndarray:
    """(N, K, *out) -> (G, K/G, N * out)."""
    n, k = y.shape[:2]
    yg = y.reshape(n, problem.groups, k // problem.groups, -1).transpose(1, 2, 0, 3)
    return yg.reshape(problem.groups, k // problem.groups, -1)


def gemm_forward(
    problem: ConvolutionProblem, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """y (N, K, *out): the reference's ``reference_forward`` as one batched matmul over the groups per
    chunk of samples (into ``out``, C-ordered y dims, where given). A chunk's product lands in y's
    order straight from the matmul where the chunk is one sample, and through one copy otherwise."""
    n, k, *spatial = problem.y.dims
    out = np.empty(problem.y.dims, x.dtype) if out is None else out
    if problem.groups == 1 and _same(problem):
        return _shifted_forward(problem, x, w, out)
    wg = _filter_matrix(problem, w)
    sample = math.prod(problem.w.dims[1:]) * math.prod(spatial) * x.itemsize  # one sample's columns
    chunk = max(1, min(n, GEMM_COLUMN_BYTES // sample))
    for start in range(0, n, chunk):
        samples = slice(start, min(n, start + chunk))
        y = out[samples].reshape(-1, problem.groups, k // problem.groups, math.prod(spatial))
        if y.shape[0] == 1:
            np.matmul(wg, _columns(problem, x[samples]), out=y[0])
        else:
            yg = np.matmul(wg, _columns(problem, x[samples]))
            np.copyto(y, yg.reshape(*yg.shape[:2], y.shape[0], -1).transpose(2, 0, 1, 3))
    return out


def _shifted_forward(problem: ConvolutionProblem, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``gemm_forward`` of one group where y has x's dims at unit strides: per sample, the columns as
    ``_Shifts``' stack with every tap a row (T, C, out), each tap's rows copied from x's planes at one
    flat shift, and one product with the filter as (K, T * C) straight into y's memory (``out``
    C-ordered): one product a sample, since on a loaded machine each product waits for the second
    BLAS thread."""
    k, c = problem.w.dims[:2]
    shifts = _Shifts(problem, c, x.dtype, 1, split=0)
    taps_first = np.ascontiguousarray(_filter_groups(w, problem).reshape(k, c, -1).transpose(0, 2, 1)).reshape(k, -1)
    for n in range(x.shape[0]):
        columns = shifts.taps(x[n].reshape(-1), c)[:, 0]
        np.matmul(taps_first, columns.transpose(1, 0, 2).reshape(-1, shifts.plane), out=out[n].reshape(k, -1))
    return out


def gemm_backward_filter(problem: ConvolutionProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dw (K, C/G, *filt): the reference's ``reference_backward_filter`` as one batched matmul."""
    cols = _columns(problem, x)
    # cols @ dy^T, then transposed: BLAS runs the long N*out reduction far faster this way round
    dw_t = np.matmul(cols, _output_matrix(problem, dy).transpose(0, 2, 1))
    return _filter_order(problem, np.ascontiguousarray(dw_t.transpose(0, 2, 1)).reshape(problem.w.dims))


def _filter_order(problem: ConvolutionProblem, dw: np.ndarray) -> np.ndarray:
    """dw of the taps as the products index them, in the filter's order (flipped back for
    ConvolutionMode.CONVOLUTION)."""
    if problem.flip:
        dw = dw[(slice(None), slice(None), *(slice(None, None, -1),) * problem.spatial_dims)]
    return dw


def gemm_backward_data(problem: ConvolutionProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dx (N, C, *spatial): the reference's ``reference_backward_data`` as one batched matmul and
    one strided add per filter tap (col2im)."""
    dcols = np.matmul(_filter_matrix(problem, w).transpose(0, 2, 1), _output_matrix(problem, dy))
    groups, per_group, filt = problem.groups, problem.w.dims[1], problem.w.dims[2:]
    n, out = dy.shape[0], problem.y.dims[2:]
    dcols = dcols.reshape(groups, per_group, math.prod(filt), n, *out)
    dx_padded = np.zeros(_padded_shape(problem), dy.dtype)
    # the writable twin of _column_view, one tap at a time: taps overlap where stride < dilated filter
    item = dx_padded.strides
    shape = (groups, per_group, n, *out)
    strides = (per_group * item[1], item[1], item[0], *(st * s for st, s in zip(problem.stride, item[2:])))
    for t, r in enumerate(np.ndindex(*filt)):
        offset = sum(rd * dil * s for rd, dil, s in zip(r, problem.dilation, item[2:]))
        base = dx_padded.reshape(-1)[offset // dx_padded.itemsize :]
        tap = np.lib.stride_tricks.as_strided(base, shape, strides)
        tap += dcols[:, :, t]
    return dx_padded[_interior(problem)]


class _Planes:
    """Depthwise geometry (G == C == K: each output channel reads its own input channel): chunks of
    ``count`` padded planes as one flat buffer, and the outputs of such a chunk laid out so that
    every filter tap reads the buffer as one 1-D run: plane p's output o sits at ``p * ext_plane +
    sum(o_k * ext_strides[k])`` and tap r reads the padded buffer at ``offsets[r] + step * that``,
    ``step`` the last dim's stride. The padded planes' last dim is rounded up to a multiple of
    ``step``; the positions of the layout that no output takes (past the end of an output row) are
    junk that no result reads. With unit strides the layout is the padded planes' own."""

    def __init__(self, problem: ConvolutionProblem, count: int, dtype: np.dtype) -> None:
        spatial = list(_padded_shape(problem)[2:])
        self.step = step = problem.stride[-1]
        spatial[-1] = -(-spatial[-1] // step) * step
        strides = [math.prod(spatial[k + 1 :]) for k in range(len(spatial))]
        self.count, self.plane, self.ext_plane = count, math.prod(spatial), math.prod(spatial) // step
        self.spatial = tuple(spatial)
        self.ext_strides = [st * s // step for st, s in zip(problem.stride, strides)]
        self.filt = filt = tuple(problem.w.dims[2:])
        self.tap_steps = [d * s for d, s in zip(problem.dilation, strides)]  # a tap's offset per filter index
        self.offsets = [sum(r * s for r, s in zip(tap, self.tap_steps)) for tap in np.ndindex(*filt)]
        self.out = tuple(problem.y.dims[2:])
        self.length = count * self.ext_plane
        self.padded = np.zeros(count * self.plane + max(self.offsets) + step, dtype)  # zeros stay in the padding
        self.inside_slices = (slice(None), *(slice(p, p + n) for p, n in zip(problem.pre_padding, problem.x.dims[2:])))
        self.inside = self.interior(self.padded)
        self.stack = np.empty((len(self.offsets), self.length), dtype)

    def interior(self, flat: np.ndarray) -> np.ndarray:
        """The places of x in a flat array of padded planes, as (planes, *x's spatial dims)."""
        planes = min(self.count, flat.size // self.plane)
        return flat[: planes * self.plane].reshape(planes, *self.spatial)[self.inside_slices]

    def tap(self, t: int, planes: int) -> np.ndarray:
        """Tap t of the first ``planes`` planes, over the output layout (1-D, writable)."""
        start = self.offsets[t]
        return self.padded[start : start + self.step * planes * self.ext_plane : self.step]

    def taps(self, planes: int, flat: np.ndarray | None = None, origin: int = 0, sign: int = 1) -> np.ndarray:
        """Every tap's run of the first ``planes`` planes copied into a row of the stack (one copy of a
        strided view), as (planes, T, ext_plane): each plane a (T, ext_plane) matrix that BLAS reads in
        place. Tap t's run starts at ``origin + sign * offsets[t]`` of ``flat`` (the padded planes)."""
        flat = self.padded if flat is None else flat
        used, item = planes * self.ext_plane, flat.itemsize
        runs = np.lib.stride_tricks.as_strided(
            flat[origin:], (*self.filt, used), (*(sign * s * item for s in self.tap_steps), self.step * item)
        )
        rows = self.stack[:, :used]
        np.copyto(rows.reshape(*self.filt, used), runs)
        return rows.reshape(-1, planes, self.ext_plane).transpose(1, 0, 2)

    def outputs(self, layout: np.ndarray) -> np.ndarray:
        """The output positions of an output-layout array (planes * ext_plane, flat) as (planes, *out)."""
        item = layout.itemsize
        strides = (self.ext_plane * item, *(s * item for s in self.ext_strides))
        return np.lib.stride_tricks.as_strided(layout, (layout.size // self.ext_plane, *self.out), strides)

    def weights(self, taps: np.ndarray) -> np.ndarray:
        """(T, planes * ext_plane): each plane's weight of each tap over its output positions, 0 on
        the junk (so that junk times junk adds an exact 0, whatever the weight)."""
        expanded = np.zeros(taps.size * self.ext_plane, taps.dtype)
        self.outputs(expanded)[...] = taps.reshape((-1,) + (1,) * len(self.out))
        return expanded.reshape(taps.shape[0], -1)


class _Shifts:
    """Where y has x's spatial dims at unit strides (``_same``): for every output place o, tap r reads
    x at o + offset(r), ``offset_k = r_k * dilation_k - pre_padding_k`` (negated for the depthwise
    backward data, which reads dy at o - offset(r)). Along the first ``split`` spatial dims (none or
    the first) the chunk's planes are laid out with zero rows before and after (as many as the
    offsets reach), so that a tap's offset along them is a start further into the buffer, no copy.
    Along the other dims a tap is one flat shift: the stack holds a row per combination of those
    dims' taps, the chunk's padded planes at that shift, with the places whose input lies in the
    padding set to 0 (along each such dim with a nonzero offset, a slab at one end; every place whose
    read crosses a row's or a plane's edge, or the chunk's end, lies in one of those slabs). The taps
    sharing their first ``split`` indices then form a (T_rest, plane) matrix of each plane, rows the
    stack's rows and columns a contiguous run starting their offset further: the stack holds the
    padded input exactly, T_rest copies of it where every tap would take T."""

    def __init__(self, problem: ConvolutionProblem, count: int, dtype: np.dtype, sign: int, split: int) -> None:
        spatial, filt = tuple(problem.x.dims[2:]), tuple(problem.w.dims[2:])
        offsets = [
            [sign * (r * d - p) for r in range(size)] for size, d, p in zip(filt, problem.dilation, problem.pre_padding)
        ]
        leading = offsets[0] if split else [0]
        before, after = max(0, -min(leading)), max(0, max(leading))
        row = math.prod(spatial[1:])
        strides = [math.prod(spatial[k + 1 :]) for k in range(len(spatial))]
        self.plane = math.prod(spatial)
        self.padded_shape = (before + spatial[0] + after, *spatial[1:])
        self.padded_plane = math.prod(self.padded_shape)
        self.interior = (slice(None), slice(before, before + spatial[0]))
        self.starts = [(before + o) * row for o in leading]  # each leading tap's matrix
        self.rows: list[tuple[int, list[tuple[slice, ...]]]] = []  # per other dims' tap: shift, zero slabs
        for tap in itertools.product(*offsets[split:]):
            slabs = [
                (slice(None),) * (1 + k) + (slice(max(0, n - o), n) if o > 0 else slice(0, min(n, -o)),)
                for k, (o, n) in enumerate(zip(tap, spatial[split:]), start=split)
                if o
            ]
            self.rows.append((sum(o * st for o, st in zip(tap, strides[split:])), slabs))
        # x goes into the row of no shift, or into a row of its own where no tap has one
        self.base = next((i for i, (shift, slabs) in enumerate(self.rows) if not shift and not slabs), len(self.rows))
        self.stack = np.zeros((max(self.base + 1, len(self.rows)), count * self.padded_plane), dtype)
        item = self.stack.itemsize
        step = self.starts[1] - self.starts[0] if len(self.starts) > 1 else 0  # the leading taps' offsets
        self.matrices = np.lib.stride_tricks.as_strided(  # (count, leading taps, T_rest, plane)
            self.stack[0, self.starts[0] :],
            (count, len(self.starts), len(self.rows), self.plane),
            (self.padded_plane * item, step * item, self.stack.strides[0], item),
            writeable=False,
        )

    def taps(self, flat: np.ndarray, planes: int) -> np.ndarray:
        """The first ``planes`` planes of ``flat`` (1-D) into the stack, as (planes, leading taps,
        T_rest, plane): per plane and leading tap (one where ``split`` is 0) the (T_rest, plane)
        matrix of its taps, which BLAS reads in place."""
        used = planes * self.padded_plane
        base = self.stack[self.base, :used]
        base.reshape(planes, *self.padded_shape)[self.interior] = flat.reshape(planes, -1, *self.padded_shape[1:])
        for index, (row, (shift, slabs)) in enumerate(zip(self.stack, self.rows)):
            if index == self.base:
                continue
            run = row[:used]
            start, stop = max(0, -shift), min(used, used - shift)
            if start < stop:
                run[start:stop] = base[start + shift : stop + shift]
            padding = run.reshape(planes, *self.padded_shape)
            for slab in slabs:
                padding[slab] = 0
        return self.matrices[:planes]


def _same(problem: ConvolutionProblem) -> bool:
    """Whether y has x's spatial dims at unit strides (a "same" convolution): each tap a flat shift."""
    return all(s == 1 for s in problem.stride) and problem.y.dims[2:] == problem.x.dims[2:]


def _blocks(problem: ConvolutionProblem, plane: int) -> list[slice]:
    """The channels in chunks of ``DEPTHWISE_ELEMENTS`` elements of planes, at least one plane."""
    channels = problem.x.dims[1]
    count = max(1, min(channels, DEPTHWISE_ELEMENTS // plane))
    return [slice(c, min(channels, c + count)) for c in range(0, channels, count)]


def _shift_blocks(problem: ConvolutionProblem, dtype: np.dtype, sign: int) -> tuple[_Shifts, list[slice]]:
    blocks = _blocks(problem, math.prod(problem.x.dims[2:]))
    return _Shifts(problem, blocks[0].stop, dtype, sign, split=1), blocks


def _channel_blocks(problem: ConvolutionProblem, dtype: np.dtype) -> tuple[_Planes, list[slice]]:
    blocks = _blocks(problem, _Planes(problem, 1, dtype).plane)
    return _Planes(problem, blocks[0].stop, dtype), blocks


def _channel_taps(problem: ConvolutionProblem, w: np.ndarray) -> np.ndarray:
    """The filter as (C, 1, T): each channel's taps as a row, for a (1, T) @ (T, ext_plane) product."""
    return _filter_groups(w, problem).reshape(problem.groups, 1, -1)


def _shifted_depthwise(
    problem: ConvolutionProblem, source: np.ndarray, taps: np.ndarray, out: np.ndarray, sign: int
) -> np.ndarray:
    """The forward (x, ``sign`` 1) or the backward data (dy, ``sign`` -1) of a depthwise convolution
    whose y has x's dims at unit strides: per chunk of channels of one sample, the sum over the
    first-dim taps of each channel's (1, T_rest) taps times its (T_rest, plane) matrix (``_Shifts``),
    the first product straight into ``out``'s planes and each other one added to them."""
    shifts, blocks = _shift_blocks(problem, source.dtype, sign)
    term = np.empty((blocks[0].stop, 1, shifts.plane), source.dtype)
    inner = len(shifts.rows)
    for block in blocks:
        count = block.stop - block.start
        weights = [taps[block, :, r * inner : (r + 1) * inner] for r in range(len(shifts.starts))]
        for n in range(source.shape[0]):
            planes = out[n, block].reshape(count, 1, -1)  # out's own memory: out is C-ordered
            matrices = shifts.taps(source[n, block].reshape(-1), count)
            np.matmul(weights[0], matrices[:, 0], out=planes)
            for r in range(1, len(weights)):
                planes += np.matmul(weights[r], matrices[:, r], out=term[:count])
    return out


def depthwise_forward(
    problem: ConvolutionProblem, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """y (N, K, *out) of a depthwise convolution: ``_shifted_depthwise`` where y has x's dims at unit
    strides; else per chunk of channels of one sample, the taps' runs of the padded planes copied
    into the rows of a stack, then one matmul batched over the chunk's channels, each channel's
    (1, T) weights times its (T, ext_plane) runs."""
    out = np.empty(problem.y.dims, x.dtype) if out is None else out
    taps = _channel_taps(problem, w)
    if _same(problem):
        return _shifted_depthwise(problem, x, taps, out, 1)
    planes, blocks = _channel_blocks(problem, x.dtype)
    result = np.empty(planes.length, x.dtype)
    for block in blocks:
        count = block.stop - block.start
        y = result[: count * planes.ext_plane]
        for n in range(x.shape[0]):
            planes.inside[:count] = x[n, block]
            np.matmul(taps[block], planes.taps(count), out=y.reshape(count, 1, -1))
            out[n, block] = planes.outputs(y)
    return out


def depthwise_backward_data(
    problem: ConvolutionProblem, dy: np.ndarray, w: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """dx (N, C, *spatial) of a depthwise convolution. With finite weights where y has x's dims at unit
    strides, ``_shifted_depthwise`` over dy. With other unit strides and finite weights, per chunk
    of channels of one sample: dx_padded[q] = sum over taps t of w_t * dy[q - offset_t] (dy in the
    output layout, which is the padded planes' own, 0 on its junk and before its start), the shifted
    runs of dy copied into the stack and summed by one batched matmul as in the forward. Else each
    tap's weights times dy (junk 0) are added into the tap's 1-D run of the padded planes: an
    infinite or NaN weight times the 0 of a junk place would make a NaN that no output sends there."""
    out = np.empty(problem.x.dims, dy.dtype) if out is None else out
    if any(s != 1 for s in problem.stride) or not np.isfinite(w).all():
        return _depthwise_backward_data_by_taps(problem, dy, w, out)
    taps = _channel_taps(problem, w)
    if _same(problem):
        return _shifted_depthwise(problem, dy, taps, out, -1)
    planes, blocks = _channel_blocks(problem, dy.dtype)
    before = max(planes.offsets)
    shifted = np.zeros(before + planes.length, dy.dtype)  # dy's layout after ``before`` zeros
    gradient, result = shifted[before:], np.empty(planes.length, dy.dtype)
    for block in blocks:
        count = block.stop - block.start
        used = count * planes.ext_plane
        g, dx = gradient[:used], result[:used]
        for n in range(dy.shape[0]):
            planes.outputs(g)[:] = dy[n, block]
            np.matmul(taps[block], planes.taps(count, shifted, before, -1), out=dx.reshape(count, 1, -1))
            out[n, block] = planes.interior(dx)
    return out


def _depthwise_backward_data_by_taps(
    problem: ConvolutionProblem, dy: np.ndarray, w: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """``depthwise_backward_data`` one tap at a time, into the tap's run of the padded planes."""
    planes, blocks = _channel_blocks(problem, dy.dtype)
    taps = _filter_groups(w, problem).reshape(problem.groups, -1).T  # (T, C)
    gradient, term = np.zeros(planes.length, dy.dtype), np.empty(planes.length, dy.dtype)
    for block in blocks:
        count = block.stop - block.start
        weights = planes.weights(taps[:, block])
        g, product = gradient[: weights.shape[1]], term[: weights.shape[1]]
        for n in range(dy.shape[0]):
            planes.outputs(g)[:] = dy[n, block]
            planes.padded.fill(0)
            for t in range(weights.shape[0]):
                run = planes.tap(t, count)
                run += np.multiply(g, weights[t], out=product)
            out[n, block] = planes.inside[:count]
    return out


def depthwise_backward_filter(problem: ConvolutionProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dw (K, 1, *filt) of a depthwise convolution: per chunk of channels of one sample, dy in the
    output layout (0 on its junk) times the stack of the taps' runs of the padded planes, one matmul
    batched over the chunk's channels ((1, ext_plane) @ (ext_plane, T) each). A junk place of a run
    holds x or padding that no output reads, and 0 times it is 0 unless it is infinite or NaN: where
    the sum comes out NaN, it is formed again with the stack's junk set to 0 (exact for any x). Where
    y has x's dims at unit strides the stack is ``_Shifts``', which holds no junk."""
    if _same(problem):
        shifts, blocks = _shift_blocks(problem, x.dtype, 1)
        taps = np.zeros((problem.groups, len(shifts.starts), len(shifts.rows)), x.dtype)
        for block in blocks:
            count = block.stop - block.start
            for n in range(x.shape[0]):
                gradient = dy[n, block].reshape(count, 1, 1, -1)
                matrices = shifts.taps(x[n, block].reshape(-1), count)
                taps[block] += np.matmul(gradient, matrices.transpose(0, 1, 3, 2)).reshape(count, *taps.shape[1:])
        return _filter_order(problem, taps.reshape(problem.w.dims))
    taps = _depthwise_filter_sums(problem, x, dy, clear_junk=False)
    if np.isnan(taps).any():
        taps = _depthwise_filter_sums(problem, x, dy, clear_junk=True)
    return _filter_order(problem, taps.reshape(problem.w.dims))


def _depthwise_filter_sums(problem: ConvolutionProblem, x: np.ndarray, dy: np.ndarray, clear_junk: bool) -> np.ndarray:
    """(C, 1, T): each channel's sums over the samples and outputs of dy times each tap's input."""
    planes, blocks = _channel_blocks(problem, x.dtype)
    taps = np.zeros((problem.groups, 1, len(planes.offsets)), x.dtype)
    gradient = np.zeros(planes.length, x.dtype)
    junk = np.ones(planes.ext_plane, bool)
    planes.outputs(junk)[...] = False
    for block in blocks:
        count = block.stop - block.start
        g = gradient[: count * planes.ext_plane]
        for n in range(x.shape[0]):
            planes.inside[:count] = x[n, block]
            planes.outputs(g)[:] = dy[n, block]
            rows = planes.taps(count)
            if clear_junk:
                np.copyto(rows, 0, where=junk)
            taps[block] += np.matmul(g.reshape(count, 1, -1), rows.transpose(0, 2, 1))
    return taps


GEMM = {
    ConvolutionDirection.FORWARD: lambda p, x, w, y, out: gemm_forward(p, x, w, out),
    ConvolutionDirection.BACKWARD_DATA: lambda p, x, w, y, out: gemm_backward_data(p, y, w),
    ConvolutionDirection.BACKWARD_FILTER: lambda p, x, w, y, out: gemm_backward_filter(p, x, y),
}
DEPTHWISE = {
    ConvolutionDirection.FORWARD: lambda p, x, w, y, out: depthwise_forward(p, x, w, out),
    ConvolutionDirection.BACKWARD_DATA: lambda p, x, w, y, out: depthwise_backward_data(p, y, w, out),
    ConvolutionDirection.BACKWARD_FILTER: lambda p, x, w, y, out: depthwise_backward_filter(p, x, y),
}


def _depthwise(problem: ConvolutionProblem) -> bool:
    """Whether each output channel reads one input channel of its own (C/G == K/G == 1)."""
    return problem.w.dims[1] == 1 and problem.w.dims[0] == problem.groups


def run(
    problem: ConvolutionProblem,
    x: Bound,
    w: Bound,
    y: Bound,
    bias: Bound | None = None,
    z: Bound | None = None,
    workspace: Bound | None = None,
) -> None:
    compute = problem.compute_type
    direction = problem.direction
    x_values = read(x, compute) if direction is not ConvolutionDirection.BACKWARD_DATA else None
    w_values = read(w, compute) if direction is not ConvolutionDirection.BACKWARD_FILTER else None
    y_values = read(y, compute) if direction is not ConvolutionDirection.FORWARD else None
    bias_values = read(bias, compute) if bias is not None else None
    z_values = read(z, compute) if z is not None else None  # read before y is written: z may be y
    output = {
        ConvolutionDirection.FORWARD: y,
        ConvolutionDirection.BACKWARD_DATA: x,
        ConvolutionDirection.BACKWARD_FILTER: w,
    }[direction]
    inputs = [v for v in (x_values, w_values, y_values) if v is not None]
    # the bare product straight into the output's memory, where it may be
    target = output_array(output, compute, problem.alpha, problem.beta, *inputs) if _bare(problem) else None
    with _blas_limit(problem), np.errstate(all="ignore"):  # inf and NaN inputs give the IEEE results
        conv = (DEPTHWISE if _depthwise(problem) else GEMM)[direction](problem, x_values, w_values, y_values, target)
    if conv is not target:
        result = blend_output(problem, conv, bias_values, z_values).astype(compute.to_numpy(), copy=False)
        write(output, result, 1.0, problem.beta)


def _bare(problem: ConvolutionProblem) -> bool:
    """Whether the forward's output is the product alone: alpha 1, no bias, residual or activation."""
    return problem.alpha == 1.0 and problem.bias is None and problem.z is None and problem.activation is None
