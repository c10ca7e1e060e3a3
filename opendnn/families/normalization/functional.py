"""The Pythonic normalization functions: layer, RMS, group and instance norm, each with its
``<name>_backward``.

Arguments follow ``torch.nn.functional``: ``weight`` and ``bias`` have torch's shapes
(``normalized_shape`` for layer and RMS norm, ``(C,)`` for group and instance norm).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opendnn.core.arrays import Bound, as_native, empty_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.handle import Handle
from opendnn.families.normalization.problem import NormDescriptor, NormMode, norm_problem, param_dims, stats_dims

Shape = int | Sequence[int]


# layer, RMS, group and instance norm --------------------------------------------------------------

def layer_norm(x: Any, normalized_shape: Shape, weight: Any = None, bias: Any = None, eps: float = 1e-5, *,
               return_stats: bool = False, handle: Handle | None = None) -> Any:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape`` dims;
    with return_stats, (y, mean, rstd) with rstd = 1 / sqrt(var + eps), one per row (float32)."""
    desc = NormDescriptor(NormMode.LAYER_NORM, eps, normalized_ndim=len(_shape(normalized_shape)))
    return _forward(desc, x, weight, bias, return_stats, handle)


def rms_norm(x: Any, normalized_shape: Shape, weight: Any = None, eps: float | None = None, *,
             return_stats: bool = False, handle: Handle | None = None) -> Any:
    """x / sqrt(mean(x^2) + eps) * weight over the trailing ``normalized_shape`` dims; eps None is
    the dtype's machine epsilon (torch's default); with return_stats, (y, rstd)."""
    xb = wrap("x", x)
    epsilon = _machine_epsilon(xb) if eps is None else eps
    desc = NormDescriptor(NormMode.RMS_NORM, epsilon, normalized_ndim=len(_shape(normalized_shape)))
    return _forward(desc, x, weight, None, return_stats, handle)


def group_norm(x: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5, *,
               return_stats: bool = False, handle: Handle | None = None) -> Any:
    """Normalize x (N, C, spatial...) over each group of C/num_groups channels and all spatial
    elements, then weight and bias per channel; with return_stats, (y, mean, rstd) of dims (N, G, 1...)."""
    return _forward(NormDescriptor(NormMode.GROUP_NORM, eps, groups=num_groups), x, weight, bias, return_stats,
                    handle)


def instance_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, *, return_stats: bool = False,
                  handle: Handle | None = None) -> Any:
    """Normalize each (sample, channel) of x (N, C, spatial...) over its spatial elements."""
    return _forward(NormDescriptor(NormMode.INSTANCE_NORM, eps), x, weight, bias, return_stats, handle)


def layer_norm_backward(dy: Any, x: Any, normalized_shape: Shape, weight: Any = None, eps: float = 1e-5, *,
                        mean: Any = None, rstd: Any = None, handle: Handle | None = None) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``layer_norm``; mean and rstd from the forward, or None (recomputed)."""
    desc = NormDescriptor(NormMode.LAYER_NORM, eps, normalized_ndim=len(_shape(normalized_shape)))
    return _backward(desc, dy, x, weight, mean, rstd, handle)


def rms_norm_backward(dy: Any, x: Any, normalized_shape: Shape, weight: Any = None, eps: float | None = None, *,
                      rstd: Any = None, handle: Handle | None = None) -> tuple[Any, Any]:
    """(dx, dweight) of ``rms_norm``."""
    epsilon = _machine_epsilon(wrap("x", x)) if eps is None else eps
    desc = NormDescriptor(NormMode.RMS_NORM, epsilon, normalized_ndim=len(_shape(normalized_shape)))
    dx, dweight, _ = _backward(desc, dy, x, weight, None, rstd, handle)
    return dx, dweight


def group_norm_backward(dy: Any, x: Any, num_groups: int, weight: Any = None, eps: float = 1e-5, *,
                        mean: Any = None, rstd: Any = None, handle: Handle | None = None) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``group_norm``."""
    return _backward(NormDescriptor(NormMode.GROUP_NORM, eps, groups=num_groups), dy, x, weight, mean, rstd, handle)


def instance_norm_backward(dy: Any, x: Any, weight: Any = None, eps: float = 1e-5, *, mean: Any = None,
                           rstd: Any = None, handle: Handle | None = None) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of ``instance_norm``."""
    return _backward(NormDescriptor(NormMode.INSTANCE_NORM, eps), dy, x, weight, mean, rstd, handle)


def _shape(normalized_shape: Shape) -> tuple[int, ...]:
    return (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)


def _machine_epsilon(xb: Bound) -> float:
    import numpy as np

    from opendnn.core.dtypes import DataType

    if xb.desc.dtype is DataType.BFLOAT16:
        return 2.0 ** -7
    return float(np.finfo(xb.desc.dtype.to_numpy()).eps)


def _param(name: str, array: Any, dims: tuple[int, ...]) -> Bound | None:
    """A torch-shaped weight or bias seen with the parameter dims the operation takes."""
    if array is None:
        return None
    return wrap(name, as_native(array, name).reshape(dims))


def _stats(xb: Bound, desc: NormDescriptor, groups: int) -> Bound:
    dims = stats_dims(desc.mode, xb.desc.dims, desc.normalized_ndim, groups)
    return empty_like(xb, xb.desc.dtype.compute_type, dims, tuple(range(len(dims))))


def _groups(desc: NormDescriptor, xb: Bound) -> int:
    if desc.mode is NormMode.INSTANCE_NORM:
        return xb.desc.dims[1]
    return desc.groups if desc.mode is NormMode.GROUP_NORM else 0


def _forward(desc: NormDescriptor, x: Any, weight: Any, bias: Any, return_stats: bool,
             handle: Handle | None) -> Any:
    xb = wrap("x", x)
    dims = param_dims(desc.mode, xb.desc.dims, desc.normalized_ndim)
    scale, shift = _param("weight", weight, dims), _param("bias", bias, dims)
    y = empty_like(xb)
    mean = inv_std = None
    if return_stats:
        inv_std = _stats(xb, desc, _groups(desc, xb))
        mean = None if desc.mode is NormMode.RMS_NORM else _stats(xb, desc, _groups(desc, xb))
    problem = norm_problem(desc, xb.desc, y.desc, scale_desc=_desc(scale), bias_desc=_desc(shift),
                           stats_desc=_desc(inv_std), has_mean=mean is not None)
    dispatch(handle_for(xb, handle), "normalization", problem, xb, y, scale, shift, mean, inv_std)
    out = to_caller_kind(y.view, x)
    if not return_stats:
        return out
    assert inv_std is not None
    stats = [to_caller_kind(s.view, x) for s in (mean, inv_std) if s is not None]
    return (out, *stats)


def _desc(bound: Bound | None) -> TensorDescriptor | None:
    return None if bound is None else bound.desc


def _backward(desc: NormDescriptor, dy: Any, x: Any, weight: Any, mean: Any, rstd: Any,
              handle: Handle | None) -> tuple[Any, Any, Any]:
    xb, dyb = wrap("x", x), wrap("dy", dy)
    dims = param_dims(desc.mode, xb.desc.dims, desc.normalized_ndim)
    scale = _param("weight", weight, dims)
    groups = _groups(desc, xb)
    stats = stats_dims(desc.mode, xb.desc.dims, desc.normalized_ndim, groups)
    mean_b, rstd_b = _param("mean", mean, stats), _param("rstd", rstd, stats)
    dx = empty_like(xb)
    param_dtype = scale.desc.dtype if scale is not None else xb.desc.dtype
    order = tuple(range(len(dims)))
    dscale, dbias = empty_like(xb, param_dtype, dims, order), empty_like(xb, param_dtype, dims, order)
    problem = norm_problem(desc, xb.desc, dx.desc, scale_desc=_desc(scale), bias_desc=dbias.desc,
                           stats_desc=_desc(rstd_b), dy_desc=dyb.desc, dscale_desc=dscale.desc,
                           has_mean=mean_b is not None)
    dispatch(handle_for(xb, handle), "normalization", problem, xb, dx, scale, dbias, mean_b, rstd_b, dyb, dscale)
    shape = tuple(as_native(weight, "weight").shape) if weight is not None else _torch_param_shape(desc, xb)
    return (to_caller_kind(dx.view, x), to_caller_kind(dscale.view.reshape(shape), x),
            to_caller_kind(dbias.view.reshape(shape), x))


def _torch_param_shape(desc: NormDescriptor, xb: Bound) -> tuple[int, ...]:
    if desc.mode in (NormMode.GROUP_NORM, NormMode.INSTANCE_NORM):
        return (xb.desc.dims[1],)
    return xb.desc.dims[-desc.normalized_ndim:]
