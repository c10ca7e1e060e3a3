"""Pooling (cuDNN's pooling forward and backward): one operation, its shape and dtype rules, and its
float64 NumPy reference.

x has dims (N, C, *spatial) with 1 to 3 spatial dims, whatever its memory order; y has dims
(N, C, *out). Along each spatial dim, output ``o`` pools the window of input positions
``o * stride - padding + j * dilation`` for ``j`` in ``0 .. window - 1`` (dilation 1 but for the
max modes); positions outside ``0 .. in - 1`` are padding:

    MAX, MAX_DETERMINISTIC            the largest element of the window (padding ignored)
    AVERAGE_COUNT_INCLUDE_PADDING     the sum of the window over its size, padding counted
    AVERAGE_COUNT_EXCLUDE_PADDING     the sum of the window over the number of input positions in it

``out = (in + 2 * padding - extent) // stride + 1`` with ``extent = dilation * (window - 1) + 1``
(``get_pooling_forward_output_dim``). The
Pythonic API's ceil mode rounds up instead (torch's rule: a last window must start inside the
input or its leading padding); the extra windows reach past the trailing padding, and the counted
size of a window stops at the end of the trailing padding: ``min(start + window, in + padding) -
start`` per dim, as torch's. Padding must be smaller than the window, so every window holds at
least one input position.

NaN: with PROPAGATE_NAN a NaN in the window gives NaN; with NOT_PROPAGATE_NAN NaNs are skipped (a
window of NaNs only gives NaN). Averages follow IEEE arithmetic.

Backward (cuDNN's contract, no index tensor): ``dx[i] = sum over windows w holding i of dy[w] *
d y[w] / d x[i]``. For the max modes the derivative is 1 at the first position of the window, in
row-major window order, whose value equals ``y[w]`` (NaN matching NaN), and 0 elsewhere: the
argmax is recomputed from x and y, ties go to the first position, and a ``y`` that matches nothing
in its window passes no gradient. Both max modes are deterministic here. For the averages the
derivative is ``1 / count``.

Adaptive windows (``adaptive_pooling_problem``, torch's adaptive pools): y's dims are the output's, and
along each spatial dim output ``o`` pools the cell ``[floor(o * in / out), ceil((o + 1) * in / out))``
(``adaptive_cells``). A dim whose cells are one size at one step is that window and stride; along the
others (``PoolingProblem.adaptive``) the cells' sizes vary and may repeat (an output larger than the
input), and each output's cell is computed from the formula. Averages divide by the cell's size.

Indices (the Pythonic max_pool's ``return_indices``, torch's): per output, int64, the flat index
into the input's spatial plane (``sum of position_k * prod(in[k+1:])``) of the window's largest
element, the first of equal ones; with PROPAGATE_NAN the last NaN of a window holding one, as torch's.

Arithmetic runs in float32, float64 for float64 tensors.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import (
    NanPropagation,
    TensorDescriptor,
    check_finite,
    check_float_tensor,
    check_ints,
    check_member,
    check_same_dims,
)
from opendnn.core.dtypes import DataType
from opendnn.core.errors import Status, require
from opendnn.core.memo import cached_hash, memoized

MAX_SPATIAL_DIMS = 3


class PoolingMode(enum.Enum):
    """cuDNN's pooling modes; the value is the name the kernels switch on."""

    MAX = "max"
    AVERAGE_COUNT_INCLUDE_PADDING = "avg_include"
    AVERAGE_COUNT_EXCLUDE_PADDING = "avg_exclude"
    MAX_DETERMINISTIC = "max_deterministic"

    @property
    def is_max(self) -> bool:
        return self in (PoolingMode.MAX, PoolingMode.MAX_DETERMINISTIC)


@dataclass(frozen=True)
class PoolingDescriptor:
    """A pooling: mode, NaN option, and window, padding and stride per spatial dim (1 to 3 dims).

    Args:
        mode: PoolingMode.
        nan_opt: NanPropagation (max modes).
        window: window size per spatial dim, each at least 1.
        padding: zero or more positions of padding on both sides of each spatial dim, smaller than
            the window (so no window lies in padding only).
        stride: step between windows per spatial dim, each at least 1.
        dilation: step between a window's positions per spatial dim, each at least 1 (above 1 for the
            max modes only, as torch's max_pool).

    Raises:
        BadParam: lengths that differ or lie outside 1..3, a window or stride below 1, a negative
            padding, or a padding at or beyond the window.
    """

    mode: PoolingMode
    nan_opt: NanPropagation
    window: tuple[int, ...]
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]

    def __init__(
        self,
        mode: PoolingMode,
        nan_opt: NanPropagation,
        window: int | Sequence[int],
        padding: int | Sequence[int],
        stride: int | Sequence[int],
        dilation: int | Sequence[int] = 1,
    ) -> None:
        window, padding = check_ints("window", window), check_ints("padding", padding)
        stride = check_ints("stride", stride)
        dilation = check_ints("dilation", dilation, len(window))
        require(
            1 <= len(window) <= MAX_SPATIAL_DIMS, f"len(window)={len(window)} must be between 1 and {MAX_SPATIAL_DIMS}"
        )
        for name, values in (("padding", padding), ("stride", stride)):
            require(len(values) == len(window), f"len({name})={len(values)} must equal len(window)={len(window)}")
        for k, (w, p, s) in enumerate(zip(window, padding, stride)):
            require(w >= 1, f"window[{k}]={w} must be at least 1")
            require(s >= 1, f"stride[{k}]={s} must be at least 1")
            require(dilation[k] >= 1, f"dilation[{k}]={dilation[k]} must be at least 1")
            require(p >= 0, f"padding[{k}]={p} must be at least 0")
            require(
                p < w,
                f"padding[{k}]={p} must be smaller than window[{k}]={w} "
                "(so that each pooled region holds an input element)",
            )
        mode = check_member("mode", PoolingMode, mode)
        require(
            mode.is_max or dilation == (1,) * len(window),
            f"dilation={list(dilation)} must be 1 for mode {mode.name} (dilated windows are max pooling's)",
        )
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "nan_opt", check_member("nan_opt", NanPropagation, nan_opt))
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "padding", padding)
        object.__setattr__(self, "stride", stride)
        object.__setattr__(self, "dilation", dilation)

    @property
    def spatial_dims(self) -> int:
        return len(self.window)


def output_size(size: int, window: int, padding: int, stride: int, ceil_mode: bool = False, dilation: int = 1) -> int:
    """Windows along one dim: ``(size + 2 * padding - extent) // stride + 1`` with ``extent =
    dilation * (window - 1) + 1`` (rounded up in ceil mode, less a last window that would start in
    the trailing padding); 0 when none fits. In ceil mode, as in torch, a window longer than the
    padded input still gives one output (the window clipped to the input and its padding) where the
    rounded-up count reaches 1."""
    span = size + 2 * padding - (dilation * (window - 1) + 1)
    if not ceil_mode:
        return span // stride + 1 if span >= 0 else 0
    count = -(-span // stride) + 1
    if count < 1:
        return 0
    return count - 1 if (count - 1) * stride >= size + padding else count


def get_pooling_forward_output_dim(pool_desc: PoolingDescriptor, x_desc: TensorDescriptor) -> tuple[int, ...]:
    """The dims of y: (N, C, *out) with ``out = (in + 2 * padding - window) // stride + 1``.

    Raises:
        BadParam: x_desc's rank is not 2 + the descriptor's spatial dims, or a window larger than
            its padded input.
    """
    return pooled_dims(pool_desc, x_desc, ceil_mode=False)


def pooled_dims(pool_desc: PoolingDescriptor, x_desc: TensorDescriptor, ceil_mode: bool = False) -> tuple[int, ...]:
    """The dims of y, rounded down as cuDNN's (``get_pooling_forward_output_dim``) or up (ceil_mode)."""
    require(isinstance(pool_desc, PoolingDescriptor), f"pool_desc={pool_desc!r} must be a PoolingDescriptor")
    require(isinstance(x_desc, TensorDescriptor), f"x_desc={x_desc!r} must be a TensorDescriptor")
    spatial = pool_desc.spatial_dims
    require(
        x_desc.ndim == 2 + spatial,
        f"x_desc.ndim={x_desc.ndim} must be 2 + the pooling's {spatial} spatial dims",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    out = []
    geometry = zip(x_desc.dims[2:], pool_desc.window, pool_desc.padding, pool_desc.stride, pool_desc.dilation)
    for k, (size, w, p, s, d) in enumerate(geometry):
        require(
            output_size(size, w, p, s, ceil_mode, d) >= 1,
            f"window[{k}]={w}"
            + (f" dilated by {d}" if d > 1 else "")
            + f" must fit in x_desc.dims[{k + 2}]={size} + 2 * padding[{k}]={p}"
            + (f" with the last window rounded up (ceil_mode) at stride[{k}]={s}" if ceil_mode else ""),
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        out.append(output_size(size, w, p, s, ceil_mode, d))
    return (*x_desc.dims[:2], *out)


@dataclass(frozen=True)
class PoolingProblem:
    """A validated pooling, forward (dy and dx None) or backward: descriptors and parameters."""

    __hash__ = cached_hash  # problems key the per-call caches

    mode: PoolingMode
    propagate_nan: bool
    window: tuple[int, ...]
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    x: TensorDescriptor
    y: TensorDescriptor
    dy: TensorDescriptor | None = None
    dx: TensorDescriptor | None = None
    alpha: float = 1.0
    beta: float = 0.0
    ceil_mode: bool = False
    dilation: tuple[int, ...] = ()  # () for all 1
    indices: TensorDescriptor | None = None  # forward only: int64, y's dims (return_indices)
    # per spatial dim, whether its windows are torch's adaptive cells of varying size or step (window: the
    # largest cell; stride 1, padding 0); () for none (adaptive_pooling_problem)
    adaptive: tuple[bool, ...] = ()

    @property
    def backward(self) -> bool:
        return self.dx is not None

    @property
    def compute_dtype(self) -> DataType:
        return DataType.DOUBLE if self.x.dtype is DataType.DOUBLE else DataType.FLOAT


@memoized  # the cuDNN-shaped calls and the adaptive pools keep no plan: asked on every call
def pooling_problem(
    pool_desc: PoolingDescriptor,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    *,
    dy_desc: TensorDescriptor | None = None,
    dx_desc: TensorDescriptor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    ceil_mode: bool = False,
    indices_desc: TensorDescriptor | None = None,
) -> PoolingProblem:
    """The shape and dtype rules of pooling forward (dy_desc, dx_desc None) or backward.

    Args:
        ceil_mode: output dims rounded up (the Pythonic API's ceil_mode); cuDNN's calls round down.
        indices_desc: the forward's int64 indices of the max modes (the Pythonic API's
            return_indices), y's dims; None for none.

    Raises:
        BadParam: x's rank not 2 + spatial dims, y's dims not the output dims, dy's not y's, dx's
            not x's, dtypes that differ or are not floating, non-finite alpha or beta.
    """
    out_dims = pooled_dims(pool_desc, x_desc, ceil_mode)
    return _checked(pool_desc, out_dims, x_desc, y_desc, dy_desc, dx_desc, alpha, beta, ceil_mode, indices_desc)


def _checked(
    pool_desc: PoolingDescriptor,
    out_dims: tuple[int, ...],
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    dy_desc: TensorDescriptor | None,
    dx_desc: TensorDescriptor | None,
    alpha: float,
    beta: float,
    ceil_mode: bool,
    indices_desc: TensorDescriptor | None,
    adaptive: tuple[bool, ...] = (),
) -> PoolingProblem:
    """The problem of a pooling whose output dims are ``out_dims``, its tensors' rules checked."""
    tensors = {"x_desc": x_desc, "y_desc": y_desc, "dy_desc": dy_desc, "dx_desc": dx_desc}
    for name, desc in tensors.items():
        if desc is None:
            continue
        check_float_tensor(name, desc)
        require(
            desc.dtype is x_desc.dtype,
            f"{name}.dtype={desc.dtype.name} must equal x_desc.dtype={x_desc.dtype.name}",
            Status.BAD_PARAM,
        )
    require(
        y_desc.ndim == len(out_dims),
        f"y_desc.ndim={y_desc.ndim} must equal x_desc.ndim={x_desc.ndim}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for k, (got, want) in enumerate(zip(y_desc.dims, out_dims)):
        rule = "x_desc.dims" if k < 2 else "the pooled size (get_pooling_forward_output_dim)"
        require(got == want, f"y_desc.dims[{k}]={got} must equal {want}, {rule}", Status.BAD_PARAM_SHAPE_MISMATCH)
    require((dy_desc is None) == (dx_desc is None), "dy_desc and dx_desc must both be given (backward) or neither")
    if dy_desc is not None and dx_desc is not None:
        check_same_dims("dy_desc", dy_desc, "y_desc", y_desc)
        check_same_dims("dx_desc", dx_desc, "x_desc", x_desc)
    if indices_desc is not None:
        require(pool_desc.mode.is_max and dx_desc is None, "indices_desc must be None but for a max forward")
        require(
            indices_desc.dtype is DataType.INT64,
            f"indices_desc.dtype={indices_desc.dtype.name} must be INT64",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
        check_same_dims("indices_desc", indices_desc, "y_desc", y_desc)
    dilated = any(d > 1 for d in pool_desc.dilation)
    return PoolingProblem(
        pool_desc.mode,
        pool_desc.nan_opt is NanPropagation.PROPAGATE_NAN,
        pool_desc.window,
        pool_desc.padding,
        pool_desc.stride,
        x_desc,
        y_desc,
        dy_desc,
        dx_desc,
        check_finite("alpha", alpha),
        check_finite("beta", beta),
        bool(ceil_mode),
        pool_desc.dilation if dilated else (),
        indices_desc,
        adaptive if any(adaptive) else (),
    )


def adaptive_cells(size: int, out: int) -> list[tuple[int, int]]:
    """torch's adaptive windows along one dim: output o pools [floor(o * size / out), ceil((o + 1) * size / out))."""
    return [(o * size // out, -(-(o + 1) * size // out)) for o in range(out)]


def regular_cells(spans: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """(window, stride) when the cells ``spans`` (start, end) are one size at one step of at least 1, else
    None. An output larger than the input repeats cells (steps of 0): not regular."""
    sizes = {end - start for start, end in spans}
    steps = {b[0] - a[0] for a, b in zip(spans, spans[1:])} or sizes  # one cell: its step is its size
    if len(sizes) > 1 or len(steps) > 1 or 0 in steps:
        return None
    return min(sizes), min(steps)


@memoized  # the functional calls build it on the first call of a signature, the plan keeps it
def adaptive_pooling_problem(
    mode: PoolingMode,
    propagate_nan: bool,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    *,
    dy_desc: TensorDescriptor | None = None,
    dx_desc: TensorDescriptor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> PoolingProblem:
    """Adaptive pooling (torch's ``adaptive_{max,avg}_pool``) forward (dy_desc, dx_desc None) or backward:
    the output dims are y_desc's, and output o pools ``adaptive_cells`` along each spatial dim. A dim whose
    cells are one size at one step (``regular_cells``) is that window and stride without padding; the
    others are ``adaptive`` (window: the largest cell, stride 1). Every cell holds an input position, so
    the averages' counts (the cell's size) include padding or not alike.

    Raises:
        BadParam: x's rank not 3 to 5, y's rank not x's, y's batch or channels not x's, an output size
            below 1, and the rules of ``pooling_problem`` (dtypes, dy's dims y's, dx's x's).
    """
    require(isinstance(x_desc, TensorDescriptor), f"x_desc={x_desc!r} must be a TensorDescriptor")
    require(isinstance(y_desc, TensorDescriptor), f"y_desc={y_desc!r} must be a TensorDescriptor")
    spatial = x_desc.ndim - 2
    require(
        1 <= spatial <= MAX_SPATIAL_DIMS,
        f"x_desc.ndim={x_desc.ndim} must be 3, 4 or 5: (N, C, *spatial) with 1 to {MAX_SPATIAL_DIMS} spatial dims",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    require(
        y_desc.ndim == x_desc.ndim,
        f"y_desc.ndim={y_desc.ndim} must equal x_desc.ndim={x_desc.ndim}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for k in range(2):
        require(
            y_desc.dims[k] == x_desc.dims[k],
            f"y_desc.dims[{k}]={y_desc.dims[k]} must equal {x_desc.dims[k]}, x_desc.dims",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    windows, strides, adaptive = [], [], []
    for k, (size, out) in enumerate(zip(x_desc.dims[2:], y_desc.dims[2:])):
        require(out >= 1, f"y_desc.dims[{k + 2}]={out} must be at least 1", Status.BAD_PARAM_SHAPE_MISMATCH)
        require(size >= 1, f"x_desc.dims[{k + 2}]={size} must be at least 1", Status.BAD_PARAM_SHAPE_MISMATCH)
        spans = adaptive_cells(size, out)
        regular = regular_cells(spans)
        windows.append(regular[0] if regular else max(end - start for start, end in spans))
        strides.append(regular[1] if regular else 1)
        adaptive.append(regular is None)
    nan_opt = NanPropagation.PROPAGATE_NAN if propagate_nan else NanPropagation.NOT_PROPAGATE_NAN
    pool = PoolingDescriptor(mode, nan_opt, windows, (0,) * spatial, strides)
    return _checked(pool, y_desc.dims, x_desc, y_desc, dy_desc, dx_desc, alpha, beta, False, None, tuple(adaptive))


# the float64 reference ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Geometry:
    """Windows over an input padded so that every window lies inside it."""

    window: tuple[int, ...]
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    size: tuple[int, ...]  # input spatial dims
    out: tuple[int, ...]

    def pad_widths(self) -> list[tuple[int, int]]:
        ends = [
            max(0, (o - 1) * s - p + d * (w - 1) + 1 - n)
            for n, w, p, s, d, o in zip(self.size, self.window, self.padding, self.stride, self.dilation, self.out)
        ]
        return [(0, 0), (0, 0), *zip(self.padding, ends)]

    def offsets(self) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...]]]:
        """For each window position j (row-major): j, and the slice of the padded input it reads for every output."""
        for j in itertools.product(*(range(w) for w in self.window)):
            yield (
                j,
                (
                    slice(None),
                    slice(None),
                    *(
                        slice(jk * d, jk * d + (o - 1) * s + 1, s)
                        for jk, o, s, d in zip(j, self.out, self.stride, self.dilation)
                    ),
                ),
            )

    def flat_positions(self, j: tuple[int, ...]) -> np.ndarray:
        """Per output, the flat index into the input's spatial plane of window position ``j``."""
        flat = np.zeros((1, 1) + (1,) * len(self.out), np.int64)
        for k, (n, p, s, d, o) in enumerate(zip(self.size, self.padding, self.stride, self.dilation, self.out)):
            position = np.arange(o, dtype=np.int64) * s - p + j[k] * d
            flat = flat * n + position.reshape((1, 1) + tuple(o if m == k else 1 for m in range(len(self.out))))
        return flat

    def counts(self, include_padding: bool) -> np.ndarray:
        """Per output, the window's count: positions up to the end of the trailing padding
        (include_padding) or input positions only."""
        total = np.ones((1, 1) + (1,) * len(self.out))
        for k, (n, w, p, s, o) in enumerate(zip(self.size, self.window, self.padding, self.stride, self.out)):
            start = np.arange(o) * s - p
            end = np.minimum(start + w, n + p) if include_padding else np.minimum(start + w, n)
            count = end - (start if include_padding else np.maximum(start, 0))
            total = total * count.reshape((1, 1) + tuple(o if m == k else 1 for m in range(len(self.out))))
        return total


def _geometry(
    x_shape: tuple[int, ...],
    window: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
    ceil_mode: bool,
    dilation: Sequence[int] = (),
) -> _Geometry:
    size = tuple(x_shape[2:])
    dilation = tuple(dilation) or (1,) * len(size)
    out = tuple(output_size(n, w, p, s, ceil_mode, d) for n, w, p, s, d in zip(size, window, padding, stride, dilation))
    return _Geometry(tuple(window), tuple(padding), tuple(stride), dilation, size, out)


def reference_forward(
    mode: PoolingMode,
    x: np.ndarray,
    window: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
    propagate_nan: bool = False,
    ceil_mode: bool = False,
    dilation: Sequence[int] = (),
) -> np.ndarray:
    """y of x (dims N, C, *spatial) in x's float dtype; ``dilation`` () for all 1."""
    mode = PoolingMode(mode)
    geo = _geometry(x.shape, window, padding, stride, ceil_mode, dilation)
    valid = np.pad(np.ones(x.shape, bool), geo.pad_widths())
    padded = np.pad(x, geo.pad_widths())
    if mode.is_max:
        best = np.full(x.shape[:2] + geo.out, np.nan, x.dtype)  # stays NaN where all are NaN
        seen_nan = np.zeros(best.shape, bool)
        for _, index in geo.offsets():
            v, ok = padded[index], valid[index]
            seen_nan |= ok & np.isnan(v)
            take = ok & ~np.isnan(v) & ~(v <= best)  # beats best, or best is still NaN
            best = np.where(take, v, best)
        return np.where(seen_nan, np.nan, best) if propagate_nan else best
    total = np.zeros(x.shape[:2] + geo.out, x.dtype)
    for _, index in geo.offsets():
        total = total + padded[index]  # padding holds zeros
    return total / geo.counts(mode is PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING)


def reference_backward(
    mode: PoolingMode,
    x: np.ndarray,
    y: np.ndarray,
    dy: np.ndarray,
    window: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
    ceil_mode: bool = False,
    dilation: Sequence[int] = (),
) -> np.ndarray:
    """dx (x's dims and float dtype) from x, y and dy: a gather of dy over the windows holding each
    input position, at the first position matching y (max modes) or over the count (averages)."""
    mode = PoolingMode(mode)
    geo = _geometry(x.shape, window, padding, stride, ceil_mode, dilation)
    widths = geo.pad_widths()
    valid = np.pad(np.ones(x.shape, bool), widths)
    padded = np.pad(x, widths)
    dx = np.zeros(padded.shape, x.dtype)
    if mode.is_max:
        found = np.zeros(y.shape, bool)
        for _, index in geo.offsets():
            v = padded[index]
            first = valid[index] & ~found & ((v == y) | (np.isnan(v) & np.isnan(y)))
            found |= first
            dx[index] += np.where(first, dy, 0.0)
    else:
        share = dy / geo.counts(mode is PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING)
        for _, index in geo.offsets():
            dx[index] += share
    inside = tuple(slice(before, before + n) for (before, _), n in zip(widths, x.shape))
    return dx[inside] * valid[inside]


def reference_indices(
    x: np.ndarray,
    window: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
    propagate_nan: bool = False,
    ceil_mode: bool = False,
    dilation: Sequence[int] = (),
) -> np.ndarray:
    """The max modes' indices (int64, y's dims): per window, the flat index into x's spatial plane of
    its first largest element; with ``propagate_nan`` its last NaN where it holds one (torch's rule)."""
    geo = _geometry(x.shape, window, padding, stride, ceil_mode, dilation)
    widths = geo.pad_widths()
    valid = np.pad(np.ones(x.shape, bool), widths)
    padded = np.pad(x, widths)
    best = np.full(x.shape[:2] + geo.out, -np.inf, x.dtype)
    first = np.full(best.shape, -1, np.int64)  # a window's first input position: all-NaN windows keep it
    indices = np.full(best.shape, -1, np.int64)
    for j, index in geo.offsets():
        v, ok = padded[index], valid[index]
        flat = geo.flat_positions(j)
        first = np.where(ok & (first < 0), flat, first)
        take = ok & ((v > best) | (np.isnan(v) if propagate_nan else (v >= best) & (indices < 0)))
        best = np.where(take, v, best)
        indices = np.where(take, flat, indices)
    return np.where(indices < 0, first, indices)


def _adaptive_windows(
    shape: tuple[int, ...], out: Sequence[int]
) -> Iterator[tuple[tuple[slice, ...], tuple[slice, ...], tuple[int, ...]]]:
    """Per output cell (row-major): the input's slices of its window, the output's of its element, and the
    window's sizes."""
    cells = [adaptive_cells(n, o) for n, o in zip(shape[2:], out)]
    for index in itertools.product(*(range(o) for o in out)):
        spans = [cells[k][o] for k, o in enumerate(index)]
        yield (
            (slice(None), slice(None), *(slice(a, b) for a, b in spans)),
            (slice(None), slice(None), *(slice(o, o + 1) for o in index)),
            tuple(b - a for a, b in spans),
        )


def reference_adaptive_forward(
    mode: PoolingMode, x: np.ndarray, out: Sequence[int], propagate_nan: bool = False
) -> np.ndarray:
    """y (dims N, C, *out) of torch's adaptive pooling of x, cell by cell: each cell ``adaptive_cells`` pooled
    as one window (max with the NaN rules of ``reference_forward``, or the mean over the cell's size)."""
    mode = PoolingMode(mode)
    y = np.empty(x.shape[:2] + tuple(out), x.dtype)
    zeros = (0,) * len(out)
    for x_cell, y_cell, window in _adaptive_windows(x.shape, out):
        y[y_cell] = reference_forward(mode, x[x_cell], window, zeros, window, propagate_nan)
    return y


def reference_adaptive_backward(mode: PoolingMode, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dx of torch's adaptive pooling (the output dims are y's), cell by cell: each cell's gradient
    (``reference_backward`` of its window: its dy at the first position of the cell equal to y, or dy over
    the cell's size) added into dx."""
    mode = PoolingMode(mode)
    dx = np.zeros(x.shape, x.dtype)
    out = y.shape[2:]
    zeros = (0,) * len(out)
    for x_cell, y_cell, window in _adaptive_windows(x.shape, out):
        dx[x_cell] += reference_backward(mode, x[x_cell], y[y_cell], dy[y_cell], window, zeros, window)
    return dx
