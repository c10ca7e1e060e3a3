"""The Pythonic normalization functions: layer, RMS, group and instance norm, each with its
``<name>_backward``.

Arguments follow ``torch.nn.functional``: ``weight`` and ``bias`` have torch's shapes
(``normalized_shape`` for layer and RMS norm, ``(C,)`` for group and instance norm).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from opendnn.core.arrays import Bound, as_native, empty_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import TensorDescriptor, check_ints
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import BadParam, OpenDnnError, Status
from opendnn.core.handle import Handle
from opendnn.families.normalization.problem import NormDescriptor, NormMode, norm_problem, param_dims, stats_dims

Shape = int | Sequence[int]


# layer, RMS, group and instance norm --------------------------------------------------------------


@caller_dtypes
def layer_norm(
    x: Any,
    normalized_shape: Shape,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims;
    with return_stats, (y, mean, rstd) with rstd = 1 / sqrt(var + eps), one per row (float32).

    Raises:
        BadParam: normalized_shape not x's trailing dims, weight or bias not of normalized_shape,
            eps negative or not finite.
    """
    xb = wrap("x", x)
    return _forward(NormMode.LAYER_NORM, xb, x, eps, normalized_shape, weight, bias, return_stats, handle)


@caller_dtypes
def rms_norm(
    x: Any,
    normalized_shape: Shape,
    weight: Any = None,
    eps: float | None = None,
    *,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing ``normalized_shape`` dims; eps None is
    the dtype's machine epsilon (torch's default); with return_stats, (y, rstd).

    Raises:
        BadParam: as layer_norm.
    """
    xb = wrap("x", x)
    epsilon = _machine_epsilon(xb) if eps is None else eps
    return _forward(NormMode.RMS_NORM, xb, x, epsilon, normalized_shape, weight, None, return_stats, handle)


@caller_dtypes
def group_norm(
    x: Any,
    num_groups: int,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """Normalize x (N, C, spatial...) over each group of C/num_groups channels and all spatial
    elements, then weight and bias per channel; with return_stats, (y, mean, rstd) of dims (N, G, 1...).

    Raises:
        BadParam: num_groups not dividing C, weight or bias not of (C,), eps negative or not finite.
    """
    return _forward(NormMode.GROUP_NORM, wrap("x", x), x, eps, num_groups, weight, bias, return_stats, handle)


@caller_dtypes
def instance_norm(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """Normalize each (sample, channel) of x (N, C, spatial...) over its spatial elements."""
    return _forward(NormMode.INSTANCE_NORM, wrap("x", x), x, eps, None, weight, bias, return_stats, handle)


@caller_dtypes
def layer_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: Shape,
    weight: Any = None,
    eps: float = 1e-5,
    *,
    mean: Any = None,
    rstd: Any = None,
    handle: Handle | None = None,
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``layer_norm``; mean and rstd from the forward, or None (recomputed)."""
    return _backward(NormMode.LAYER_NORM, dy, x, eps, normalized_shape, weight, mean, rstd, handle)


@caller_dtypes
def rms_norm_backward(
    dy: Any,
    x: Any,
    normalized_shape: Shape,
    weight: Any = None,
    eps: float | None = None,
    *,
    rstd: Any = None,
    handle: Handle | None = None,
) -> tuple[Any, Any]:
    """(dx, dweight) of ``rms_norm``."""
    epsilon = _machine_epsilon(wrap("x", x)) if eps is None else eps
    dx, dweight, _ = _backward(NormMode.RMS_NORM, dy, x, epsilon, normalized_shape, weight, None, rstd, handle)
    return dx, dweight


@caller_dtypes
def group_norm_backward(
    dy: Any,
    x: Any,
    num_groups: int,
    weight: Any = None,
    eps: float = 1e-5,
    *,
    mean: Any = None,
    rstd: Any = None,
    handle: Handle | None = None,
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``group_norm``."""
    return _backward(NormMode.GROUP_NORM, dy, x, eps, num_groups, weight, mean, rstd, handle)


@caller_dtypes
def instance_norm_backward(
    dy: Any,
    x: Any,
    weight: Any = None,
    eps: float = 1e-5,
    *,
    mean: Any = None,
    rstd: Any = None,
    handle: Handle | None = None,
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``instance_norm``."""
    return _backward(NormMode.INSTANCE_NORM, dy, x, eps, None, weight, mean, rstd, handle)


# what these functions call the normalization descriptor's fields and the problem's tensors
_NAMES = CallerNames(
    {
        "epsilon": "eps",
        "groups": "num_groups",
        "norm_desc.groups": "num_groups",
        "x_desc": "x",
        "y_desc": "y",
        "dy_desc": "dy",
        "stats_desc": "rstd",
    }
)


def _descriptor(mode: NormMode, xb: Bound, eps: float, shape_or_groups: Any) -> tuple[NormDescriptor, int]:
    """(the descriptor, the group count: 0 for LAYER/RMS) of a call: ``shape_or_groups`` is its
    normalized_shape (LAYER/RMS) or num_groups (GROUP).

    Raises:
        BadParam: a normalized_shape that is not x's trailing dims, a rule of NormDescriptor.
    """
    if mode in (NormMode.LAYER_NORM, NormMode.RMS_NORM):
        shape = check_ints("normalized_shape", shape_or_groups)
        if xb.desc.dims[-len(shape) :] != shape or len(shape) > xb.desc.ndim:  # (formatted only on failure)
            raise BadParam(
                f"normalized_shape={list(shape)} must be the trailing dims of x.shape={list(xb.desc.dims)}",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
        return NormDescriptor(mode, eps, normalized_ndim=len(shape)), 0
    if xb.desc.ndim < 2:
        raise BadParam(f"x.ndim={xb.desc.ndim} must be at least 2 (N, C, spatial...) for {mode.name}")
    if mode is NormMode.INSTANCE_NORM:
        return NormDescriptor(mode, eps), xb.desc.dims[1]
    desc = NormDescriptor(mode, eps, groups=shape_or_groups)
    return desc, desc.groups


def _machine_epsilon(xb: Bound) -> float:
    import numpy as np

    from opendnn.core.dtypes import DataType

    if xb.desc.dtype is DataType.BFLOAT16:
        return 2.0**-7
    return float(np.finfo(xb.desc.dtype.to_numpy()).eps)


def _param(name: str, array: Any, dims: tuple[int, ...], shape: tuple[int, ...]) -> Bound | None:
    """A weight or bias of torch's ``shape`` (or of the operation's ``dims``) seen with ``dims``."""
    if array is None:
        return None
    native = as_native(array, name)
    if tuple(native.shape) not in (shape, dims):  # (the message is formatted only on failure)
        raise BadParam(f"{name}.shape={tuple(native.shape)} must be {shape}", Status.BAD_PARAM_SHAPE_MISMATCH)
    return wrap(name, native.reshape(dims))


def _statistic(name: str, array: Any, dims: tuple[int, ...]) -> Bound | None:
    """A forward's mean or rstd (one value per row, any shape holding them) seen with ``dims``."""
    if array is None:
        return None
    native = as_native(array, name)
    if math.prod(native.shape) != math.prod(dims):  # (the message is formatted only on failure)
        raise BadParam(
            f"{name}.shape={tuple(native.shape)} must hold {math.prod(dims)} values, one per row ({list(dims)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    return wrap(name, native.reshape(dims))


def _torch_param_shape(desc: NormDescriptor, xb: Bound) -> tuple[int, ...]:
    if desc.mode in (NormMode.GROUP_NORM, NormMode.INSTANCE_NORM):
        return (xb.desc.dims[1],)
    return xb.desc.dims[-desc.normalized_ndim :]


def _stats(xb: Bound, desc: NormDescriptor, groups: int) -> Bound:
    dims = stats_dims(desc.mode, xb.desc.dims, desc.normalized_ndim, groups)
    return empty_like(xb, xb.desc.dtype.compute_type, dims, tuple(range(len(dims))))


def _forward(
    mode: NormMode,
    xb: Bound,
    x: Any,
    eps: float,
    shape_or_groups: Any,
    weight: Any,
    bias: Any,
    return_stats: bool,
    handle: Handle | None,
) -> Any:
    try:
        desc, groups = _descriptor(mode, xb, eps, shape_or_groups)
        dims, shape = param_dims(desc.mode, xb.desc.dims, desc.normalized_ndim), _torch_param_shape(desc, xb)
        scale, shift = _param("weight", weight, dims, shape), _param("bias", bias, dims, shape)
        y = empty_like(xb)
        mean = inv_std = None
        if return_stats:
            inv_std = _stats(xb, desc, groups)
            mean = None if desc.mode is NormMode.RMS_NORM else _stats(xb, desc, groups)
        problem = norm_problem(
            desc,
            xb.desc,
            y.desc,
            scale_desc=_desc(scale),
            bias_desc=_desc(shift),
            stats_desc=_desc(inv_std),
            has_mean=mean is not None,
        )
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    dispatch(handle_for(xb, handle), "normalization", problem, xb, y, scale, shift, mean, inv_std)
    out = to_caller_kind(y.view, x)
    if not return_stats:
        return out
    assert inv_std is not None
    stats = [to_caller_kind(s.view, x) for s in (mean, inv_std) if s is not None]
    return (out, *stats)


def _desc(bound: Bound | None) -> TensorDescriptor | None:
    return None if bound is None else bound.desc


def _backward(
    mode: NormMode,
    dy: Any,
    x: Any,
    eps: float,
    shape_or_groups: Any,
    weight: Any,
    mean: Any,
    rstd: Any,
    handle: Handle | None,
) -> tuple[Any, Any, Any]:
    xb, dyb = wrap("x", x), wrap("dy", dy)
    try:
        desc, groups = _descriptor(mode, xb, eps, shape_or_groups)
        dims, shape = param_dims(desc.mode, xb.desc.dims, desc.normalized_ndim), _torch_param_shape(desc, xb)
        scale = _param("weight", weight, dims, shape)
        stats = stats_dims(desc.mode, xb.desc.dims, desc.normalized_ndim, groups)
        mean_b, rstd_b = _statistic("mean", mean, stats), _statistic("rstd", rstd, stats)
        dx = empty_like(xb)
        param_dtype = scale.desc.dtype if scale is not None else xb.desc.dtype
        order = tuple(range(len(dims)))
        dscale, dbias = empty_like(xb, param_dtype, dims, order), empty_like(xb, param_dtype, dims, order)
        problem = norm_problem(
            desc,
            xb.desc,
            dx.desc,
            scale_desc=_desc(scale),
            bias_desc=dbias.desc,
            stats_desc=_desc(rstd_b),
            dy_desc=dyb.desc,
            dscale_desc=dscale.desc,
            has_mean=mean_b is not None,
        )
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    dispatch(handle_for(xb, handle), "normalization", problem, xb, dx, scale, dbias, mean_b, rstd_b, dyb, dscale)
    shape = tuple(as_native(weight, "weight").shape) if weight is not None else shape
    return (
        to_caller_kind(dx.view, x),
        to_caller_kind(dscale.view.reshape(shape), x),
        to_caller_kind(dbias.view.reshape(shape), x),
    )
