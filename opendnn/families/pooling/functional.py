"""The Pythonic pooling functions: max, average, adaptive and global pooling, forward and backward.

Inputs have dims (N, C, *spatial) with 1 to 3 spatial dims (the rank says which), in any memory
order; outputs keep the input's memory order. ``kernel_size``, ``stride``, ``padding`` and
``dilation`` are an int or one int per spatial dim; ``stride`` defaults to ``kernel_size``. ``ceil_mode`` rounds the
output size up as torch's does. Max pooling propagates NaN by default, as torch's does. Each
backward function returns dx from the forward's inputs (and output, for max) and dy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opendnn.core.arrays import Bound, allocate, empty_like, keyed_bound, packed_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, check_ints
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, OpenDnnError, Status, require
from opendnn.core.handle import Handle
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.pooling.problem import (
    PoolingDescriptor,
    PoolingMode,
    adaptive_pooling_problem,
    pooled_dims,
    pooling_problem,
)

Size = int | Sequence[int]


def _spatial(x: Bound) -> int:
    spatial = x.desc.ndim - 2
    if not 1 <= spatial <= 3:
        raise BadParam(f"x.ndim={x.desc.ndim} must be 3, 4 or 5: (N, C, *spatial) with 1 to 3 spatial dims")
    return spatial


# what these functions call the pooling descriptor's fields and the problem's tensors
_NAMES = CallerNames({"window": "kernel_size", "x_desc": "x", "y_desc": "y", "dy_desc": "dy"})
_AVERAGE_BACKWARD_NAMES = CallerNames({"window": "kernel_size", "x_desc": "x", "y_desc": "dy", "dy_desc": "dy"})


def _descriptor(
    mode: PoolingMode,
    x: Bound,
    kernel_size: Size,
    stride: Size | None,
    padding: Size,
    propagate_nan: bool = False,
    dilation: Size = 1,
) -> PoolingDescriptor:
    try:
        return _pool_descriptor(mode, _spatial(x), kernel_size, stride, padding, propagate_nan, dilation)
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None


def _pool_descriptor(
    mode: PoolingMode,
    spatial: int,
    kernel_size: Size,
    stride: Size | None,
    padding: Size,
    propagate_nan: bool,
    dilation: Size,
) -> PoolingDescriptor:
    window = check_ints("kernel_size", kernel_size, spatial)
    steps = window if stride is None else check_ints("stride", stride, spatial)
    nan_opt = NanPropagation.PROPAGATE_NAN if propagate_nan else NanPropagation.NOT_PROPAGATE_NAN
    pads, dilations = check_ints("padding", padding, spatial), check_ints("dilation", dilation, spatial)
    return PoolingDescriptor(mode, nan_opt, window, pads, steps, dilations)


def _forward(
    pool: PoolingDescriptor,
    xb: Bound,
    x: Any,
    ceil_mode: bool,
    handle: Handle | None,
    return_indices: bool = False,
    key: tuple[Any, ...] | None = None,
) -> Any:
    try:
        yb = empty_like(xb, dims=pooled_dims(pool, xb.desc, ceil_mode))
        indices = empty_like(xb, DataType.INT64, yb.desc.dims) if return_indices else None
        problem = pooling_problem(
            pool, xb.desc, yb.desc, ceil_mode=ceil_mode, indices_desc=indices.desc if indices is not None else None
        )
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    handle = handle_for(xb, handle)
    if indices is None:
        implementation = dispatch(handle, "pooling", problem, xb, yb, None, None)
        keep(handle, key, Plan("pooling", problem, (yb.desc,), implementation, (xb.desc,)))
        return to_caller_kind(yb.view, x)
    implementation = dispatch(handle, "pooling", problem, xb, yb, None, None, indices)
    keep(handle, key, Plan("pooling", problem, (yb.desc, indices.desc), implementation, (xb.desc,)))
    return to_caller_kind(yb.view, x), to_caller_kind(indices.view, x)


def _backward(
    pool: PoolingDescriptor,
    dy: Any,
    x: Any,
    y: Any | None,
    ceil_mode: bool,
    handle: Handle | None,
    key: tuple[Any, ...] | None = None,
) -> Any:
    xb, dyb = wrap("x", x), wrap("dy", dy)
    yb = wrap("y", y) if y is not None else dyb  # the averages never read y
    dxb = empty_like(xb)
    try:
        problem = pooling_problem(pool, xb.desc, yb.desc, dy_desc=dyb.desc, dx_desc=dxb.desc, ceil_mode=ceil_mode)
    except OpenDnnError as error:
        raise (_NAMES if y is not None else _AVERAGE_BACKWARD_NAMES).renamed(error) from None
    handle = handle_for(xb, handle)
    implementation = dispatch(handle, "pooling", problem, xb, yb, dyb, dxb)
    descs = (xb.desc, dyb.desc) if y is None else (xb.desc, dyb.desc, yb.desc)
    keep(handle, key, Plan("pooling", problem, (dxb.desc,), implementation, descs))
    return to_caller_kind(dxb.view, x)


def _execute(handle: Handle, plan: Plan, key: tuple[Any, ...], arrays: tuple[Any, ...]) -> Any:
    """A planned pooling call: ``arrays`` (x, and for a backward dy and max's y) bound to the plan's
    descriptors, its outputs (y and the indices, or dx) new, in x's kind."""
    device = key[1][-1]
    xb, *others = (keyed_bound(name, desc, a, device) for name, desc, a in zip(("x", "dy", "y"), plan.extra, arrays))
    outputs = [allocate(xb, desc) for desc in plan.outputs]
    if others:  # a backward: (x, y, dy, dx), dy standing for y in the averages, which never read it
        dyb = others[0]
        execute(handle, plan, xb, others[1] if len(others) > 1 else dyb, dyb, outputs[0])
    else:
        execute(handle, plan, xb, outputs[0], None, None, *outputs[1:])
    if len(outputs) > 1:
        return to_caller_kind(outputs[0].view, arrays[0]), to_caller_kind(outputs[1].view, arrays[0])
    return to_caller_kind(outputs[0].view, arrays[0])


def _average_mode(count_include_pad: bool) -> PoolingMode:
    return PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING if count_include_pad else PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING


# fixed windows -----------------------------------------------------------------------------------


@caller_dtypes
def max_pool(
    x: Any,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    dilation: Size = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    *,
    propagate_nan: bool = True,
    handle: Handle | None = None,
) -> Any:
    """The largest element of each window: torch's max_pool1d/2d/3d, with its argument order.

    Args:
        x: (N, C, *spatial), 1 to 3 spatial dims, any memory order.
        kernel_size, stride, padding: the windows (stride defaults to kernel_size).
        dilation: the step between a window's positions (torch's).
        ceil_mode: the output size rounded up, as torch's.
        return_indices: also return, per output, the int64 flat index into x's spatial plane of the
            window's largest element (torch's indices, for max_unpool): its first largest element, and
            with propagate_nan its last NaN.
        propagate_nan: a NaN in a window gives NaN (torch's behaviour); False skips NaNs.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        y (N, C, *out) in x's memory order and of x's kind; with return_indices, (y, indices).

    Raises:
        BadParam: a geometry rule (a window wider than its padded input, padding at or beyond the window).
    """
    key = signature(
        "max_pool", (x,), (kernel_size, stride, padding, dilation, ceil_mode, return_indices, propagate_nan)
    )
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x,))
    xb = wrap("x", x)
    pool = _descriptor(PoolingMode.MAX, xb, kernel_size, stride, padding, propagate_nan, dilation)
    return _forward(pool, xb, x, ceil_mode, handle, return_indices, key)


@caller_dtypes
def max_pool_backward(
    dy: Any,
    x: Any,
    y: Any,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    dilation: Size = 1,
    *,
    ceil_mode: bool = False,
    handle: Handle | None = None,
) -> Any:
    """dx of max_pool: each dy goes to the first position of its window equal to y (found from x and y,
    as cuDNN's backward does; the forward's indices are not needed)."""
    key = signature("max_pool_backward", (x, dy, y), (kernel_size, stride, padding, dilation, ceil_mode))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x, dy, y))
    pool = _descriptor(PoolingMode.MAX, wrap("x", x), kernel_size, stride, padding, dilation=dilation)
    return _backward(pool, dy, x, y, ceil_mode, handle, key)


@caller_dtypes
def avg_pool(
    x: Any,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    *,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    handle: Handle | None = None,
) -> Any:
    """The mean of each window, over its size (count_include_pad) or its input positions only."""
    key = signature("avg_pool", (x,), (kernel_size, stride, padding, ceil_mode, count_include_pad))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x,))
    xb = wrap("x", x)
    pool = _descriptor(_average_mode(count_include_pad), xb, kernel_size, stride, padding)
    return _forward(pool, xb, x, ceil_mode, handle, key=key)


@caller_dtypes
def avg_pool_backward(
    dy: Any,
    x: Any,
    kernel_size: Size,
    stride: Size | None = None,
    padding: Size = 0,
    *,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    handle: Handle | None = None,
) -> Any:
    """dx of avg_pool: each dy spread evenly over its window (x gives the dims and layout only)."""
    key = signature("avg_pool_backward", (x, dy), (kernel_size, stride, padding, ceil_mode, count_include_pad))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x, dy))
    pool = _descriptor(_average_mode(count_include_pad), wrap("x", x), kernel_size, stride, padding)
    return _backward(pool, dy, x, None, ceil_mode, handle, key)


# adaptive and global windows ---------------------------------------------------------------------


def _output_size(x: Bound, output_size: Size) -> tuple[int, ...]:
    out = check_ints("output_size", output_size, _spatial(x))
    for k, o in enumerate(out):
        require(o >= 1, f"output_size[{k}]={o} must be at least 1")
    return out


def _adaptive_forward(mode: PoolingMode, x: Any, output_size: Size, propagate_nan: bool, handle: Handle | None) -> Any:
    """One pooling whose windows are torch's cells (``adaptive_pooling_problem``: a plain window and stride
    along the dims whose cells are one size at one step, the cells computed in the kernels elsewhere)."""
    key = signature("adaptive_pool", (x,), (mode, output_size, propagate_nan))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x,))
    xb = wrap("x", x)
    yb = empty_like(xb, dims=(*xb.desc.dims[:2], *_output_size(xb, output_size)))
    try:
        problem = adaptive_pooling_problem(mode, propagate_nan, xb.desc, yb.desc)
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    handle = handle_for(xb, handle)
    implementation = dispatch(handle, "pooling", problem, xb, yb, None, None)
    keep(handle, key, Plan("pooling", problem, (yb.desc,), implementation, (xb.desc,)))
    return to_caller_kind(yb.view, x)


def _adaptive_backward(mode: PoolingMode, dy: Any, x: Any, y: Any | None, handle: Handle | None) -> Any:
    key = signature("adaptive_pool_backward", (x, dy, y), (mode,))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            return _execute(handle, plan, key, (x, dy) if y is None else (x, dy, y))
    dyb = wrap("dy", dy)
    described = y is None and isinstance(x, TensorDescriptor)  # (the average reads no x: dx stands for it)
    xb = allocate(dyb, packed_like(x, x.dtype, x.dims), "x") if described else wrap("x", x)
    if dyb.desc.dims[:2] != xb.desc.dims[:2] or dyb.desc.ndim != xb.desc.ndim:  # dy's dims give the windows
        raise BadParam(
            f"dy.shape={list(dyb.desc.dims)} must be (N, C, *output_size) for x.shape={list(xb.desc.dims)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    yb = wrap("y", y) if y is not None else dyb
    if yb.desc.dims != dyb.desc.dims:
        raise BadParam(
            f"y.shape={list(yb.desc.dims)} must equal dy.shape={list(dyb.desc.dims)}", Status.BAD_PARAM_SHAPE_MISMATCH
        )
    _output_size(xb, dyb.desc.dims[2:])
    dxb = xb if described else empty_like(xb)  # every element written once: the gather sums the cells holding it
    try:
        problem = adaptive_pooling_problem(mode, False, xb.desc, yb.desc, dy_desc=dyb.desc, dx_desc=dxb.desc)
    except OpenDnnError as error:
        raise (_NAMES if y is not None else _AVERAGE_BACKWARD_NAMES).renamed(error) from None
    handle = handle_for(xb, handle)
    implementation = dispatch(handle, "pooling", problem, xb, yb, dyb, dxb)
    descs = (xb.desc, dyb.desc) if y is None else (xb.desc, dyb.desc, yb.desc)
    keep(handle, key, Plan("pooling", problem, (dxb.desc,), implementation, descs))
    return to_caller_kind(dxb.view, dy if described else x)


@caller_dtypes
def adaptive_avg_pool(x: Any, output_size: Size, *, handle: Handle | None = None) -> Any:
    """The mean over torch's adaptive windows: output o pools [o * n // out, ceil((o + 1) * n / out))."""
    return _adaptive_forward(PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, x, output_size, False, handle)


@caller_dtypes
def adaptive_avg_pool_backward(dy: Any, x: Any, *, handle: Handle | None = None) -> Any:
    """dx of adaptive_avg_pool (the output size is dy's), of x's dims, dtype and memory order. x's values
    are never read, so ``x`` may also be its ``TensorDescriptor`` (dx then of dy's kind and device)."""
    return _adaptive_backward(PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING, dy, x, None, handle)


@caller_dtypes
def adaptive_max_pool(x: Any, output_size: Size, *, propagate_nan: bool = True, handle: Handle | None = None) -> Any:
    """The largest element of torch's adaptive windows."""
    return _adaptive_forward(PoolingMode.MAX, x, output_size, propagate_nan, handle)


@caller_dtypes
def adaptive_max_pool_backward(dy: Any, x: Any, y: Any, *, handle: Handle | None = None) -> Any:
    """dx of adaptive_max_pool: each dy goes to the first position of its window equal to y."""
    return _adaptive_backward(PoolingMode.MAX, dy, x, y, handle)


@caller_dtypes
def global_avg_pool(x: Any, *, handle: Handle | None = None) -> Any:
    """The mean over all spatial positions: dims (N, C, 1, ...)."""
    return adaptive_avg_pool(x, 1, handle=handle)


@caller_dtypes
def global_avg_pool_backward(dy: Any, x: Any, *, handle: Handle | None = None) -> Any:
    """dx of global_avg_pool: dy / (number of spatial positions), broadcast."""
    return adaptive_avg_pool_backward(dy, x, handle=handle)
