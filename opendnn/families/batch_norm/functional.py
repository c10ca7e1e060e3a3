"""The Pythonic batch normalization: ``batch_norm`` as torch's, its backward, and the fused
add + activation forms (cuDNN's Ex calls) with theirs.

Statistics are per channel (dim 1) over every other dim. weight, bias and the running statistics
are 1-D of C elements; they are used in float32 (float64 for float64 data), converted when given
in another dtype, except the running statistics, which are updated in place and so must already
be float32 (float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import opendnn.families.batch_norm.api as api
from opendnn.core.arrays import (
    Bound,
    allocate,
    as_native,
    bind,
    device_of,
    dtype_of,
    keyed_bound,
    packed_like,
    scratch_bytes,
    wrap,
)
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import NanPropagation, TensorDescriptor
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.errors import BadParam, OpenDnnError, require
from opendnn.core.handle import Handle
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.batch_norm.problem import (
    BatchNormMode,
    BatchNormOps,
    BatchNormTensors,
    derive_bn_tensor_descriptor,
)
from opendnn.families.pointwise.activation_api import ActivationDescriptor, ActivationMode
from opendnn.families.pointwise.functional import activation_mode
from opendnn.families.pointwise.problem import PointwiseMode, check_nan_rule

MODE = BatchNormMode.SPATIAL


@dataclass(frozen=True)
class BatchNormState:
    """What ``batch_norm_add_activation`` keeps for its backward: the saved mean and inverse std
    (C elements each) and the reserve space (the activation's mask)."""

    saved_mean: Any
    saved_inv_std: Any
    reserve: Any


@caller_dtypes
def batch_norm(
    x: Any,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    handle: Handle | None = None,
) -> Any:
    """``weight * (x - mean) / sqrt(var + eps) + bias`` per channel, as torch.nn.functional.batch_norm.

    Training normalizes with the batch statistics and, when given, updates running_mean and
    running_var in place: ``running = (1 - momentum) * running + momentum * batch`` (unbiased
    variance); inference uses running_mean and running_var. weight/bias None mean 1 and 0.

    Raises:
        BadParam: eps below 1e-5, momentum outside [0, 1], a parameter not of C elements, running
            statistics missing in inference or of the wrong dtype.
    """
    return batch_norm_add_activation(
        x, None, running_mean, running_var, weight, bias, training, momentum, eps, activation=None, handle=handle
    )


@caller_dtypes
def batch_norm_add_activation(
    x: Any,
    z: Any,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
    *,
    activation: str | None = "relu",
    coef: float | None = None,
    propagate_nan: bool = False,
    return_state: bool = False,
    handle: Handle | None = None,
) -> Any:
    """``act(batch_norm(x) + z)`` in one pass over memory (z None: no add; activation "relu",
    "clipped_relu" (``coef``: its ceiling, 6.0 for relu6; it has no default), "identity" or None;
    ``propagate_nan``: relu and clipped relu keep NaN, as torch's do, instead of cuDNN's default 0). With
    ``return_state`` (training only) returns ``(y, BatchNormState)`` for
    ``batch_norm_add_activation_backward``."""
    training = bool(training)
    arrays = (weight, bias, running_mean, running_var)
    scalars = (training, momentum, eps, activation, coef, propagate_nan)
    key = signature("batch_norm", (x, z, *arrays), scalars)
    if key is not None:
        keyed_handle, plan = lookup(handle, key)
        if plan is not None:  # a signature whose checks passed: x and z bound as its problem has them
            problem, device = plan.problem, keyed_handle.device
            zb = None if problem.z is None else keyed_bound("z", problem.z, z, device)
            xb = keyed_bound("x", problem.x, x, device)
            return _forward_run(keyed_handle, plan, key, xb, zb, arrays, training, return_state, x)
    xb = wrap("x", x)
    handle = handle_for(xb, handle)
    zb = None if z is None or not training else wrap("z", z)
    try:
        plan = _forward_plan(xb, z, zb, handle, arrays, training, momentum, eps, activation, coef, propagate_nan)
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    return _forward_run(handle, plan, key, xb, zb, _natives(arrays), training, return_state, x)


def _forward_run(
    handle: Handle,
    plan: Plan,
    key: tuple[Any, ...] | None,
    xb: Bound,
    zb: Bound | None,
    arrays: tuple[Any, ...],
    training: bool,
    return_state: bool,
    x: Any,
) -> Any:
    """Run a forward call on its ``plan``: y, the parameters (``arrays``: weight, bias, running mean
    and variance) read as the plan says, the saved statistics and the scratch memory new."""
    memory: _Memory = plan.extra
    params, (weight_source, bias_source, mean_source, var_source) = memory.params, memory.sources
    weight, bias, running_mean, running_var = arrays
    y = allocate(xb, plan.outputs[0], "y")
    scale, shift = params.bind(xb, weight_source, weight, "weight"), params.bind(xb, bias_source, bias, "bias")
    workspace = scratch_bytes(xb, memory.workspace)
    if not training:
        tensors = BatchNormTensors(
            xb,
            y,
            scale,
            shift,
            mean=params.bind(xb, mean_source, running_mean, "running_mean"),
            variance=params.bind(xb, var_source, running_var, "running_var"),
            workspace=workspace,
        )
        _run(handle, plan, key, tensors)
        return to_caller_kind(y.view, x)
    saved_mean, saved_inv = params.new(xb, "saved_mean"), params.new(xb, "saved_inv_std")
    reserve = scratch_bytes(xb, memory.reserve, "reserve_space")
    tensors = BatchNormTensors(
        xb,
        y,
        scale,
        shift,
        z=zb,
        mean=params.bind(xb, mean_source, running_mean, "running_mean"),
        variance=params.bind(xb, var_source, running_var, "running_var"),
        saved_mean=saved_mean,
        saved_inv_std=saved_inv,
        workspace=workspace,
        reserve=reserve,
    )
    _run(handle, plan, key, tensors)
    out = to_caller_kind(y.view, x)
    if return_state:
        return out, BatchNormState(saved_mean.view, saved_inv.view, None if reserve is None else reserve.view)
    return out


@caller_dtypes
def batch_norm_backward(
    dy: Any,
    x: Any,
    weight: Any = None,
    saved_mean: Any = None,
    saved_inv_std: Any = None,
    eps: float = 1e-5,
    *,
    handle: Handle | None = None,
) -> tuple[Any, Any, Any]:
    """(dx, dweight, dbias) of the training ``batch_norm``; the batch statistics are recomputed from
    x when saved_mean and saved_inv_std are not given."""
    dx, _, dweight, dbias = _backward(
        dy, x, weight, BatchNormState(saved_mean, saved_inv_std, None), eps, None, 0.0, False, handle
    )
    return dx, dweight, dbias


@caller_dtypes
def batch_norm_add_activation_backward(
    dy: Any,
    x: Any,
    weight: Any,
    state: BatchNormState,
    eps: float = 1e-5,
    *,
    activation: str | None = "relu",
    coef: float | None = None,
    propagate_nan: bool = False,
    torch_rule: bool = False,
    has_z: bool = True,
    handle: Handle | None = None,
) -> tuple[Any, Any, Any, Any]:
    """(dx, dz, dweight, dbias) of ``batch_norm_add_activation`` (dz None when it had no z); the
    gradient at a NaN pre-activation is 0, or NaN with ``propagate_nan``, or dy with ``torch_rule``
    (torch's relu and hardtanh backward, a selection: 0 where the activation is flat, whatever dy);
    either needs a forward that had ``propagate_nan``, whose reserve space marks the NaN positions."""
    check_nan_rule(propagate_nan, torch_rule)
    return _backward(dy, x, weight, state, eps, activation, coef, has_z, handle, propagate_nan, torch_rule)


def _backward(
    dy: Any,
    x: Any,
    weight: Any,
    state: BatchNormState,
    eps: float,
    activation: str | None,
    coef: float | None,
    has_z: bool,
    handle: Handle | None,
    propagate_nan: bool = False,
    torch_rule: bool = False,
) -> tuple[Any, Any, Any, Any]:
    has_z = bool(has_z)
    if not isinstance(state, BatchNormState):  # (the message is formatted only on failure)
        raise BadParam(f"state={state!r} must be the BatchNormState of batch_norm_add_activation")
    arrays = (weight, state.saved_mean, state.saved_inv_std)
    scalars = (eps, activation, coef, has_z, propagate_nan, torch_rule)
    key = signature("batch_norm_backward", (x, dy, *arrays, state.reserve), scalars)
    if key is not None:
        keyed_handle, plan = lookup(handle, key)
        if plan is not None:  # a signature whose checks passed: x and dy bound as its problem has them
            problem, device = plan.problem, keyed_handle.device
            xb, dyb = keyed_bound("x", problem.x, x, device), keyed_bound("dy", problem.dy, dy, device)
            return _backward_run(keyed_handle, plan, key, xb, dyb, arrays, state.reserve, has_z, x)
    xb, dyb = wrap("x", x), wrap("dy", dy)
    handle = handle_for(xb, handle)
    try:
        plan = _backward_plan(xb, dyb, handle, arrays, eps, activation, coef, has_z, propagate_nan, torch_rule)
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    return _backward_run(handle, plan, key, xb, dyb, _natives(arrays), state.reserve, has_z, x)


def _backward_run(
    handle: Handle,
    plan: Plan,
    key: tuple[Any, ...] | None,
    xb: Bound,
    dyb: Bound,
    arrays: tuple[Any, ...],
    reserve: Any,
    has_z: bool,
    x: Any,
) -> tuple[Any, Any, Any, Any]:
    """Run a backward call on its ``plan``: dx (dz), dweight and dbias new, the parameters
    (``arrays``: weight, saved mean and inverse std) read as the plan says."""
    memory: _Memory = plan.extra
    params, (weight_source, mean_source, inv_source) = memory.params, memory.sources
    weight, saved_mean, saved_inv_std = arrays
    dx = allocate(xb, plan.outputs[0], "dx")
    dz = allocate(xb, plan.outputs[0], "dz") if has_z else None
    dweight, dbias = params.new(xb, "d_bn_scale_result"), params.new(xb, "d_bn_bias_result")
    tensors = BatchNormTensors(
        xb,
        dx,
        params.bind(xb, weight_source, weight, "weight"),
        z=dz,
        dy=dyb,
        dscale=dweight,
        dbias=dbias,
        saved_mean=params.bind(xb, mean_source, saved_mean, "saved_mean"),
        saved_inv_std=params.bind(xb, inv_source, saved_inv_std, "saved_inv_std"),
        workspace=scratch_bytes(xb, memory.workspace),
        reserve=api.bind_reserve(reserve, memory.reserve),
    )
    _run(handle, plan, key, tensors)
    return (
        to_caller_kind(dx.view, x),
        None if dz is None else to_caller_kind(dz.view, x),
        to_caller_kind(params.flat(dweight), x),
        to_caller_kind(params.flat(dbias), x),
    )


def _run(handle: Handle, plan: Plan, key: tuple[Any, ...] | None, tensors: BatchNormTensors) -> None:
    """Run ``tensors`` on ``plan``: a kept plan executes; a new one (no implementation yet) is
    dispatched, which checks the call's devices and the backend's support, and is kept under ``key``."""
    if plan.implementation is not None:
        execute(handle, plan, tensors)
        return
    implementation = dispatch(handle, "batch_norm", plan.problem, tensors)
    keep(handle, key, replace(plan, implementation=implementation))


def _natives(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arrays of a call whose checks passed as native ones (a DLPack one has no key, so no plan)."""
    return tuple(None if array is None else as_native(array) for array in arrays)


# what these functions call the batch norm layer's parameters
_NAMES = CallerNames(
    {
        "epsilon": "eps",
        "exponential_average_factor": "momentum",
        "x_desc": "x",
        "y_desc": "y",
        "z_desc": "z",
        "dy_desc": "dy",
        "dx_desc": "dx",
        "dz_desc": "z",
    }
)


# ---- the plans: what a call's signature decides, made once through the checks ----------------------
#
# Every check of a call but the binds of its memory depends only on its signature (core/plans.py):
# each array's kind, dtype, shape, strides and device (x, z or dy, the parameters, the reserve
# space) and the scalars; the handle that keeps the plan adds its backend and device. A Plan holds
# what those checks decided (the problem, the output's descriptor, the backend, and in ``extra`` how
# each parameter is read and the workspace and reserve sizes), never a caller's array; a repeated
# signature then costs one lookup, the allocations, the binds and the launches.


@dataclass(frozen=True)
class _Source:
    """How a caller's parameter becomes the (1, C, 1...) array a call reads: ``fill`` (absent: a new
    array of this value), ``copy`` (not in the compute dtype, not contiguous or not of x's kind: a new
    array holding its elements), or a view of it (``direct``: a tensor whose view has the
    descriptor's strides, bound without bind's checks; NumPy views are bound)."""

    fill: float | None = None
    copy: bool = False
    direct: bool = False


@dataclass(frozen=True)
class _Memory:
    """A batch norm plan's ``extra``: the parameters' descriptor and their sources (in the call's
    order of its parameter arrays), and the bytes of workspace and reserve space."""

    params: _Parameters
    sources: tuple[_Source | None, ...]
    workspace: int
    reserve: int


def _forward_plan(
    xb: Bound,
    z: Any,
    zb: Bound | None,
    handle: Handle,
    arrays: tuple[Any, ...],
    training: bool,
    momentum: float,
    eps: float,
    activation: str | None,
    coef: float | None,
    propagate_nan: bool,
) -> Plan:
    """The plan of a forward call (its implementation None until its first dispatch); its output
    y is packed in x's memory order."""
    params = _Parameters(xb.desc)
    weight, bias, running_mean, running_var = arrays
    sources = (
        params.source(xb, weight, "weight", 1.0),
        params.source(xb, bias, "bias", 0.0),
        params.running(running_mean, "running_mean"),
        params.running(running_var, "running_var"),
    )
    y = packed_like(xb.desc, xb.desc.dtype, xb.desc.dims)
    if not training:
        require(
            running_mean is not None and running_var is not None,
            "running_mean and running_var are needed when training=False",
        )
        require(z is None and activation in (None, "identity"), "inference takes no z and no activation")
        problem = api.inference_problem(MODE, 1.0, 0.0, xb.desc, y, params.desc, eps)
    else:
        ops = _ops(zb is not None, activation)
        problem = api.training_ex_problem(
            MODE,
            ops,
            1.0,
            0.0,
            xb.desc,
            None if zb is None else zb.desc,
            y,
            params.desc,
            momentum,
            eps,
            _activation_descriptor(ops, activation, coef, propagate_nan),
            running=(running_mean is not None, running_var is not None),
            saved=(True, True),
        )
    return Plan("batch_norm", problem, (y,), None, _Memory(params, sources, *api.space_sizes(handle, problem)))


def _backward_plan(
    xb: Bound,
    dyb: Bound,
    handle: Handle,
    arrays: tuple[Any, ...],
    eps: float,
    activation: str | None,
    coef: float | None,
    has_z: bool,
    propagate_nan: bool,
    torch_rule: bool,
) -> Plan:
    """The plan of a backward call (as ``_forward_plan``'s); its output dx (and dz) is packed in x's
    memory order. ``torch_rule`` reads the reserve's NaN marks, which ``propagate_nan`` lays out."""
    params = _Parameters(xb.desc)
    weight, saved_mean, saved_inv_std = arrays
    sources = (
        params.source(xb, weight, "weight", 1.0),
        params.source(xb, saved_mean, "saved_mean"),
        params.source(xb, saved_inv_std, "saved_inv_std"),
    )
    dx = packed_like(xb.desc, xb.desc.dtype, xb.desc.dims)
    ops = _ops(has_z, activation)
    problem = api.backward_ex_problem(
        MODE,
        ops,
        1.0,
        0.0,
        1.0,
        0.0,
        xb.desc,
        dyb.desc,
        dx if has_z else None,
        dx,
        params.desc,
        eps,
        _activation_descriptor(ops, activation, coef, propagate_nan or torch_rule),
        saved=(saved_mean is not None, saved_inv_std is not None),
        torch_rule=torch_rule,
    )
    return Plan("batch_norm", problem, (dx,), None, _Memory(params, sources, *api.space_sizes(handle, problem)))


def _activation_descriptor(
    ops: BatchNormOps, activation: str | None, coef: float | None, propagate_nan: bool = False
) -> ActivationDescriptor | None:
    if ops is BatchNormOps.BN:
        return None
    mode = activation_mode(activation) or PointwiseMode.IDENTITY
    if mode not in _EX_ACTIVATIONS:  # (the message is formatted only on failure)
        raise BadParam(f"activation={activation!r} must be 'relu', 'clipped_relu', 'identity' or None")
    nan_opt = NanPropagation.PROPAGATE_NAN if propagate_nan else NanPropagation.NOT_PROPAGATE_NAN
    return ActivationDescriptor(_EX_ACTIVATIONS[mode], nan_opt, coef)


_EX_ACTIVATIONS = {
    PointwiseMode.RELU_FWD: ActivationMode.RELU,
    PointwiseMode.IDENTITY: ActivationMode.IDENTITY,
    PointwiseMode.CLIPPED_RELU_FWD: ActivationMode.CLIPPED_RELU,
}  # the activations Ex forms fuse


def _ops(has_z: bool, activation: str | None) -> BatchNormOps:
    if has_z:
        return BatchNormOps.BN_ADD_ACTIVATION
    return BatchNormOps.BN if activation is None else BatchNormOps.BN_ACTIVATION


class _Parameters:
    """The per-channel tensors of calls on one x descriptor, as (1, C, 1, ...) arrays in the compute
    dtype: ``source`` checks a caller's array (once per signature) and says how to read it, ``bind``
    reads it so."""

    def __init__(self, x_desc: TensorDescriptor) -> None:
        if x_desc.ndim < 2:
            raise BadParam(f"x.ndim={x_desc.ndim} must be at least 2 (N, C, ...)")
        self.channels = x_desc.dims[1]
        self.dtype = x_desc.dtype.compute_type
        self.desc = derive_bn_tensor_descriptor(x_desc, MODE)  # packed: what new() allocates

    def new(self, like: Bound, name: str, fill: float | None = None) -> Bound:
        out = allocate(like, self.desc, name)
        if fill is not None:
            if isinstance(out.view, np.ndarray):
                out.view.fill(fill)
            else:
                out.view.fill_(fill)
        return out

    def source(self, like: Bound, array: Any, name: str, default: float | None = None) -> _Source | None:
        """How ``array`` (C elements, any float dtype; None: ``default`` everywhere, or nothing when
        that is None) is read in the compute dtype."""
        if array is None:
            return None if default is None else _Source(fill=default)
        native = as_native(array, name)
        if math.prod(native.shape) != self.channels:
            raise BadParam(f"{name}.shape={tuple(native.shape)} must hold C={self.channels} elements")
        if _is_contiguous(native) and dtype_of(native) is self.dtype and isinstance(native, type(like.view)):
            return self._view(native)  # already what the kernels read: only read, so no copy
        return _Source(copy=True)

    def running(self, array: Any, name: str) -> _Source | None:
        """The caller's running statistic, seen as (1, C, 1...) and updated in place."""
        if array is None:
            return None
        native = as_native(array, name)
        # the messages are formatted only on failure: this runs for every new signature
        if dtype_of(native) is not self.dtype:
            raise BadParam(
                f"{name}.dtype={dtype_of(native).value} must be {self.dtype.value}"
                " (running statistics are used in place)"
            )
        if tuple(native.shape) != (self.channels,):
            raise BadParam(f"{name}.shape={tuple(native.shape)} must be ({self.channels},)")
        if not _is_contiguous(native):
            raise BadParam(f"{name} must be contiguous (running statistics are used in place)")
        return self._view(native)

    def _view(self, native: Any) -> _Source:
        # a tensor whose (1, C, 1...) view has the descriptor's strides needs no bind (size-1 dims
        # may keep odd strides): the same dtype, shape and strides give the same view every call
        direct = not isinstance(native, np.ndarray) and self._reshaped(native).stride() == self.desc.strides
        return _Source(direct=direct)

    def bind(self, like: Bound, source: _Source | None, native: Any, name: str) -> Bound | None:
        """A native array read as ``source`` says (checked by ``source``, or proven alike by a plan's key)."""
        if source is None:
            return None
        if source.fill is not None:
            return self.new(like, name, source.fill)
        if source.copy:
            out = self.new(like, name)
            flat = out.view.reshape(-1)
            flat[...] = native.reshape(-1) if isinstance(native, type(flat)) else np.asarray(native).reshape(-1)
            return out
        view = self._reshaped(native)
        if source.direct:
            return Bound(name, self.desc, view, device_of(view))
        return bind(name, self.desc, view)

    def _reshaped(self, native: Any) -> Any:
        dims = self.desc.dims
        return native if native.shape == dims else native.reshape(dims)  # (saved statistics come as (1, C, 1...))

    def flat(self, bound: Bound) -> Any:
        return bound.view.reshape(self.channels)


def _is_contiguous(native: Any) -> bool:
    return bool(native.flags.c_contiguous) if isinstance(native, np.ndarray) else native.is_contiguous()
