"""The Pythonic batch normalization: ``batch_norm`` as torch's, its backward, and the fused
add + activation forms (cuDNN's Ex calls) with theirs.

Statistics are per channel (dim 1) over every other dim. weight, bias and the running statistics
are 1-D of C elements; they are used in float32 (float64 for float64 data), converted when given
in another dtype, except the running statistics, which are updated in place and so must already
be float32 (float64).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import opendnn.api.batch_norm as api
from opendnn.api.activation import ActivationDescriptor, ActivationMode
from opendnn.core.arrays import (
    Bound,
    allocate,
    allocate_bytes,
    as_native,
    bind,
    device_of,
    dtype_of,
    empty_like,
    wrap,
)
from opendnn.core.errors import BadParam, require
from opendnn.core.handle import Handle
from opendnn.functional.common import handle_for, to_caller_kind
from opendnn.ops.batch_norm import BatchNormMode, BatchNormOps, derive_bn_tensor_descriptor

MODE = BatchNormMode.SPATIAL


@dataclass(frozen=True)
class BatchNormState:
    """What ``batch_norm_add_activation`` keeps for its backward: the saved mean and inverse std
    (C elements each) and the reserve space (the activation's mask)."""

    saved_mean: Any
    saved_inv_std: Any
    reserve: Any


def batch_norm(x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None, bias: Any = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5, *,
               handle: Handle | None = None) -> Any:
    """``weight * (x - mean) / sqrt(var + eps) + bias`` per channel, as torch.nn.functional.batch_norm.

    Training normalizes with the batch statistics and, when given, updates running_mean and
    running_var in place: ``running = (1 - momentum) * running + momentum * batch`` (unbiased
    variance); inference uses running_mean and running_var. weight/bias None mean 1 and 0.

    Raises:
        BadParam: eps below 1e-5, momentum outside [0, 1], a parameter not of C elements, running
            statistics missing in inference or of the wrong dtype.
    """
    return batch_norm_add_activation(x, None, running_mean, running_var, weight, bias, training, momentum, eps,
                                     activation=None, handle=handle)


def batch_norm_add_activation(x: Any, z: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                              bias: Any = None, training: bool = True, momentum: float = 0.1, eps: float = 1e-5, *,
                              activation: str | None = "relu", coef: float = 0.0, return_state: bool = False,
                              handle: Handle | None = None) -> Any:
    """``act(batch_norm(x) + z)`` in one pass over memory (z None: no add; activation "relu",
    "clipped_relu" (``coef``: its ceiling, 6.0 for relu6), "identity" or None). With
    ``return_state`` (training only) returns ``(y, BatchNormState)`` for
    ``batch_norm_add_activation_backward``."""
    xb = wrap("x", x)
    handle = handle_for(xb, handle)
    y = empty_like(xb)
    params = _Parameters(xb)
    desc = params.desc
    scale, shift = params.convert(weight, "weight", 1.0), params.convert(bias, "bias", 0.0)
    mean, var = params.running(running_mean, "running_mean"), params.running(running_var, "running_var")
    if not training:
        require(running_mean is not None and running_var is not None,
                "running_mean and running_var are needed when training=False")
        require(z is None and activation in (None, "identity"), "inference takes no z and no activation")
        api.batch_normalization_forward_inference(handle, MODE, 1.0, 0.0, xb.desc, xb, y.desc, y, desc,
                                                  scale, shift, mean, var, eps)
        return to_caller_kind(y.view, x)
    zb = None if z is None else wrap("z", z)
    ops = _ops(zb, activation)
    act = _activation_descriptor(ops, activation, coef)
    saved_mean, saved_inv = params.new(), params.new()
    z_desc = None if zb is None else zb.desc
    # plain BN keeps no mask: no reserve space to size
    reserve = None if ops is BatchNormOps.BN else allocate_bytes(
        xb, api.get_batch_normalization_training_ex_reserve_space_size(handle, MODE, ops, act, xb.desc))
    api.batch_normalization_forward_training_ex(
        handle, MODE, ops, 1.0, 0.0, xb.desc, xb, z_desc, zb, y.desc, y, desc,
        scale, shift, momentum, mean, var, eps, saved_mean, saved_inv, act,
        api.AUTOMATIC, reserve)
    out = to_caller_kind(y.view, x)
    if return_state:
        return out, BatchNormState(saved_mean.view, saved_inv.view, reserve)
    return out


def batch_norm_backward(dy: Any, x: Any, weight: Any = None, saved_mean: Any = None, saved_inv_std: Any = None,
                        eps: float = 1e-5, *, handle: Handle | None = None) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of the training ``batch_norm``; the batch statistics are recomputed from
    x when saved_mean and saved_inv_std are not given."""
    dx, _, dweight, dbias = _backward(dy, x, weight, BatchNormState(saved_mean, saved_inv_std, None), eps, None,
                                      0.0, False, handle)
    return dx, dweight, dbias


def batch_norm_add_activation_backward(dy: Any, x: Any, weight: Any, state: BatchNormState, eps: float = 1e-5, *,
                                       activation: str | None = "relu", coef: float = 0.0, has_z: bool = True,
                                       handle: Handle | None = None) -> tuple[Any, Any, Any, Any]:
    """(dx, dz, dweight, dbias) of ``batch_norm_add_activation`` (dz None when it had no z)."""
    return _backward(dy, x, weight, state, eps, activation, coef, has_z, handle)


def _backward(dy: Any, x: Any, weight: Any, state: BatchNormState, eps: float, activation: str | None, coef: float,
              has_z: bool, handle: Handle | None) -> tuple[Any, Any, Any, Any]:
    xb, dyb = wrap("x", x), wrap("dy", dy)
    handle = handle_for(xb, handle)
    params = _Parameters(xb)
    scale = params.convert(weight, "weight", 1.0)
    dx = empty_like(xb)
    dz = empty_like(xb) if has_z else None
    ops = _ops(dz, activation)
    act = _activation_descriptor(ops, activation, coef)
    dweight, dbias = params.new(), params.new()
    dz_desc = None if dz is None else dz.desc
    saved_mean = None if state.saved_mean is None else params.convert(state.saved_mean, "saved_mean")
    saved_inv = None if state.saved_inv_std is None else params.convert(state.saved_inv_std, "saved_inv_std")
    api.batch_normalization_backward_ex(
        handle, MODE, ops, 1.0, 0.0, 1.0, 0.0, xb.desc, xb, None, None, dyb.desc, dyb, dz_desc,
        dz, dx.desc, dx, params.desc, scale, None, dweight, dbias, eps,
        saved_mean, saved_inv, act, api.AUTOMATIC, state.reserve)
    return (to_caller_kind(dx.view, x), None if dz is None else to_caller_kind(dz.view, x),
            to_caller_kind(params.flat(dweight), x), to_caller_kind(params.flat(dbias), x))


@functools.lru_cache(maxsize=64)  # a frozen descriptor, validated once per (ops, activation, coef): per call otherwise
def _activation_descriptor(ops: BatchNormOps, activation: str | None, coef: float) -> ActivationDescriptor | None:
    if ops is BatchNormOps.BN:
        return None
    return ActivationDescriptor(ActivationMode[(activation or "identity").upper()], coef=coef or None)


def _ops(z: Bound | None, activation: str | None) -> BatchNormOps:
    if z is not None:
        return BatchNormOps.BN_ADD_ACTIVATION
    return BatchNormOps.BN if activation is None else BatchNormOps.BN_ACTIVATION


class _Parameters:
    """The per-channel tensors of one call, bound as (1, C, 1, ...) views in the compute dtype."""

    def __init__(self, x: Bound) -> None:
        if x.desc.ndim < 2:  # (the message is formatted only on failure: this runs for every call)
            raise BadParam(f"x.ndim={x.desc.ndim} must be at least 2 (N, C, ...)")
        self.x = x
        self.channels = x.desc.dims[1]
        self.dtype = x.desc.dtype.compute_type
        self.desc = derive_bn_tensor_descriptor(x.desc, MODE)  # packed: what new() allocates

    def new(self, fill: float | None = None) -> Bound:
        out = allocate(self.x, self.desc)
        if fill is not None:
            if isinstance(out.view, np.ndarray):
                out.view.fill(fill)
            else:
                out.view.fill_(fill)
        return out

    def convert(self, array: Any, name: str, default: float = 0.0) -> Bound:
        """``array`` (C elements, any float dtype) as a (1, C, 1...) array of the compute dtype."""
        if array is None:
            return self.new(default)
        native = as_native(array, name)
        if math.prod(native.shape) != self.channels:
            raise BadParam(f"{name}.shape={tuple(native.shape)} must hold C={self.channels} elements")
        if _is_contiguous(native) and dtype_of(native) is self.dtype and isinstance(native, type(self.x.view)):
            return self._view(name, native)  # already what the kernels read: only read, so no copy
        out = self.new()
        flat = out.view.reshape(-1)
        flat[...] = native.reshape(-1) if isinstance(native, type(flat)) else np.asarray(native).reshape(-1)
        return out

    def running(self, array: Any, name: str) -> Bound | None:
        """The caller's running statistic seen as (1, C, 1...), updated in place."""
        if array is None:
            return None
        native = as_native(array, name)
        # the messages are formatted only on failure: this runs for every call
        if dtype_of(native) is not self.dtype:
            raise BadParam(f"{name}.dtype={dtype_of(native).value} must be {self.dtype.value} "
                           "(updated in place)")
        if tuple(native.shape) != (self.channels,):
            raise BadParam(f"{name}.shape={tuple(native.shape)} must be ({self.channels},)")
        if not _is_contiguous(native):
            raise BadParam(f"{name} must be contiguous (it is updated in place)")
        return self._view(name, native)

    def _view(self, name: str, native: Any) -> Bound:
        """A contiguous array of C elements in the compute dtype, bound as (1, C, 1...)."""
        dims = self.desc.dims
        view = native if native.shape == dims else native.reshape(dims)  # (saved statistics come as (1, C, 1...))
        if isinstance(view, np.ndarray) or view.stride() != self.desc.strides:  # (size-1 dims may keep odd strides)
            return bind(name, self.desc, view)
        return Bound(name, self.desc, view, device_of(view))  # a tensor of the desc's dims, strides and dtype

    def flat(self, bound: Bound) -> Any:
        return bound.view.reshape(self.channels)


def _is_contiguous(native: Any) -> bool:
    return bool(native.flags.c_contiguous) if isinstance(native, np.ndarray) else native.is_contiguous()
