"""Batch normalization (cuDNN's cudnnBatchNormalization*): modes, fused ops, shape and dtype rules,
and the float64 NumPy reference.

Over the reduced set ``S`` of each feature (SPATIAL: N and the spatial dims, one feature per
channel; PER_ACTIVATION: N only, one feature per (c, h, w)), with ``n = |S|``:

    mean = sum(x) / n            var = sum((x - mean)^2) / n        (biased, for normalizing)
    xhat = (x - mean) / sqrt(var + eps)
    y    = alpha * act(scale * xhat + bias [+ z]) + beta * y       (act and z: the Ex forms)

Training also updates the running statistics with the exponential average factor ``f`` and the
UNBIASED batch variance: ``running_mean = (1 - f) * running_mean + f * mean``,
``running_var = (1 - f) * running_var + f * var * n / (n - 1)`` (n / 1 when n == 1), and may save
``mean`` and ``inv_std = 1 / sqrt(var + eps)`` for backward. Inference normalizes with the given
estimated mean and variance. Backward, with ``g = dy * act'(pre-activation)`` (``g = dy`` for BN):

    dbias  = sum(g)       dscale = sum(g * xhat)       dz = g
    dx     = scale * inv_std * (g - dbias / n - xhat * dscale / n)

blended: ``dx = alpha_data * dx + beta_data * dx`` (dz likewise), ``dscale = alpha_param * dscale +
beta_param * dscale`` (dbias likewise). The saved mean and inverse std are recomputed from x when
absent. The Ex activations are RELU, CLIPPED_RELU (coef: the ceiling) and IDENTITY; the reserve
space written by the Ex forward carries the activation's mask (where act' is 1) for backward. A NaN
pre-activation gives 0 through relu and clipped relu (cuDNN's NOT_PROPAGATE_NAN, act' = 0 there), or
NaN with ``propagate_nan`` (the activation descriptor's PROPAGATE_NAN; act' is NaN there, so g is NaN:
the pointwise relu backward's rule), in which case the reserve space marks the NaN positions too; a
backward with ``torch_rule`` gives dy there (g = dy where the mask or the NaN mark is set, else 0:
torch's relu and hardtanh backward, the pointwise backward's ``torch_rule``).

Data in FLOAT, HALF, BFLOAT16 or DOUBLE; scale, bias and the statistics in FLOAT (DOUBLE for DOUBLE
data) with the dims of ``derive_bn_tensor_descriptor``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor, check_finite, check_member, check_same_dims
from opendnn.core.dtypes import DataType
from opendnn.core.errors import Status, require
from opendnn.core.memo import cached_hash, memoized

BN_MIN_EPSILON = 0.0  # cuDNN's CUDNN_BN_MIN_EPSILON (older cuDNN asked 1e-5)
ACTIVATIONS = ("relu", "clipped_relu", "identity")  # the activations the Ex forms fuse
NAN_RULED = ("relu", "clipped_relu")  # those whose NaN rule propagate_nan (and torch_rule) set


class BatchNormMode(enum.Enum):
    """Which elements share statistics: PER_ACTIVATION (each (c, spatial) over N), SPATIAL (each
    channel over N and the spatial dims); SPATIAL_PERSISTENT gives SPATIAL's results."""

    PER_ACTIVATION = 0
    SPATIAL = 1
    SPATIAL_PERSISTENT = 2

    @property
    def is_spatial(self) -> bool:
        return self is not BatchNormMode.PER_ACTIVATION


class BatchNormOps(enum.Enum):
    """What the Ex forms fuse after the normalization: nothing, an activation, or an add then an activation."""

    BN = 0
    BN_ACTIVATION = 1
    BN_ADD_ACTIVATION = 2


class Direction(enum.Enum):
    TRAINING = "training"
    INFERENCE = "inference"
    BACKWARD = "backward"


@memoized  # the reserve-space size query (cuDNN-shaped, no plan) derives it on every call
def derive_bn_tensor_descriptor(x_desc: TensorDescriptor, mode: BatchNormMode) -> TensorDescriptor:
    """The descriptor of scale, bias, means and variances for ``x_desc`` in ``mode``: dims (1, C, 1...)
    for SPATIAL, (1, C, spatial...) for PER_ACTIVATION; FLOAT (DOUBLE for DOUBLE data); packed.

    Raises:
        BadParam: x_desc with fewer than 2 dims or not of a float type.
    """
    mode = BatchNormMode(mode)
    require(isinstance(x_desc, TensorDescriptor), f"x_desc={x_desc!r} must be a TensorDescriptor")
    require(x_desc.ndim >= 2, f"x_desc.ndim={x_desc.ndim} must be at least 2 (N, C, spatial...)")
    require(
        x_desc.dtype.is_floating,
        f"x_desc.dtype={x_desc.dtype.name} must be FLOAT, DOUBLE, HALF or BFLOAT16",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    dims = (1, x_desc.dims[1], *((1,) * (x_desc.ndim - 2) if mode.is_spatial else x_desc.dims[2:]))
    return TensorDescriptor(x_desc.dtype.compute_type, dims)


@dataclass(frozen=True)
class BatchNormProblem:
    """A validated batch normalization call: descriptors and parameters, no memory.

    ``out`` is y (forward) or dx (backward); ``z`` is the forward's z or the backward's dz (BN_ADD_ACTIVATION);
    ``dy`` the backward's incoming gradient. ``update_running`` / ``saved``: whether the running
    statistics are updated (training) and whether saved mean and inv std are written (training) or
    given (backward).
    """

    __hash__ = cached_hash  # problems key the per-call caches

    direction: Direction
    mode: BatchNormMode
    ops: BatchNormOps
    x: TensorDescriptor
    out: TensorDescriptor
    param: TensorDescriptor
    epsilon: float
    z: TensorDescriptor | None = None
    dy: TensorDescriptor | None = None
    activation: str | None = None
    activation_coef: float = 0.0
    propagate_nan: bool = False  # a NaN pre-activation stays NaN through relu / clipped relu (and g)
    factor: float = 0.0
    alpha: float = 1.0
    beta: float = 0.0
    alpha_param: float = 1.0
    beta_param: float = 0.0
    update_running: bool = False
    saved: bool = False
    reserve: bool = False  # the Ex forward writes, or the Ex backward reads, the activation mask
    torch_rule: bool = False  # backward with propagate_nan's NaN marks: g = dy at a NaN pre-activation (torch's)

    @property
    def reduced_axes(self) -> tuple[int, ...]:
        return reduced_axes(self.x.ndim, self.mode)

    @property
    def count(self) -> int:
        """Elements per feature: n."""
        return math.prod(self.x.dims[k] for k in self.reduced_axes)

    @property
    def compute_dtype(self) -> DataType:
        return self.x.dtype.compute_type


class BatchNormTensors(NamedTuple):
    """The memory of one call (None where the call has none). ``out`` is y or dx, ``z`` is z or dz;
    ``mean`` / ``variance`` are the running statistics (training) or the estimated ones
    (inference); the saved statistics are outputs of training, inputs of backward."""

    x: Bound
    out: Bound
    scale: Bound | None = None
    bias: Bound | None = None
    z: Bound | None = None
    dy: Bound | None = None
    dscale: Bound | None = None
    dbias: Bound | None = None
    mean: Bound | None = None
    variance: Bound | None = None
    saved_mean: Bound | None = None
    saved_inv_std: Bound | None = None
    workspace: Bound | None = None
    reserve: Bound | None = None


def reduced_axes(ndim: int, mode: BatchNormMode) -> tuple[int, ...]:
    return (0, *range(2, ndim)) if BatchNormMode(mode).is_spatial else (0,)


@memoized  # the cuDNN-shaped calls keep no plan: they ask again on every call
def batch_norm_problem(
    direction: Direction,
    mode: BatchNormMode,
    x_desc: TensorDescriptor,
    out_desc: TensorDescriptor,
    param_desc: TensorDescriptor,
    epsilon: float,
    *,
    ops: BatchNormOps = BatchNormOps.BN,
    z_desc: TensorDescriptor | None = None,
    dy_desc: TensorDescriptor | None = None,
    activation: str | None = None,
    activation_coef: float = 0.0,
    propagate_nan: bool = False,
    factor: float = 0.0,
    alpha: float = 1.0,
    beta: float = 0.0,
    alpha_param: float = 1.0,
    beta_param: float = 0.0,
    update_running: bool = False,
    saved: bool = False,
    reserve: bool = False,
    torch_rule: bool = False,
) -> BatchNormProblem:
    """The shape and dtype rules of every batch normalization call (``torch_rule``: a backward
    whose relu or clipped relu had ``propagate_nan`` gives dy at a NaN pre-activation).

    Raises:
        BadParam: naming the descriptor or parameter: out, z or dy not of x's dims and dtype, a
            parameter descriptor not of ``derive_bn_tensor_descriptor``'s dims and dtype for this
            mode, epsilon below 1e-5, an exponential average factor outside [0, 1], non-finite
            alpha/beta, an activation missing for the Ex ops.
        NotSupported: a data type or activation the operation lacks.
    """
    mode, ops = check_member("mode", BatchNormMode, mode), check_member("bn_ops", BatchNormOps, ops)
    direction = Direction(direction)
    expected = derive_bn_tensor_descriptor(x_desc, mode)
    out_name = "dx_desc" if direction is Direction.BACKWARD else "y_desc"
    z_name = "dz_desc" if direction is Direction.BACKWARD else "z_desc"
    param_name = "d_bn_scale_bias_desc" if direction is Direction.BACKWARD else "bn_scale_bias_mean_var_desc"
    named = [(out_name, out_desc), (z_name, z_desc), ("dy_desc", dy_desc)]
    for name, desc in named:  # messages are formatted only on failure: this runs on every call
        if desc is None:
            continue
        if not isinstance(desc, TensorDescriptor):
            require(False, f"{name}={desc!r} must be a TensorDescriptor")
        if desc.dims != x_desc.dims:
            check_same_dims(name, desc, "x_desc", x_desc)
        if desc.dtype is not x_desc.dtype:
            require(
                False,
                f"{name}.dtype={desc.dtype.name} must equal x_desc.dtype={x_desc.dtype.name}",
                Status.NOT_SUPPORTED_DATA_TYPE,
            )
    if not isinstance(param_desc, TensorDescriptor):
        require(False, f"{param_name}={param_desc!r} must be a TensorDescriptor")
    if param_desc.dims != expected.dims:
        require(
            False,
            f"{param_name}.dims={list(param_desc.dims)} must equal {list(expected.dims)} for "
            f"mode={mode.name} (derive_bn_tensor_descriptor of x_desc.dims={list(x_desc.dims)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    if param_desc.dtype is not expected.dtype:
        require(
            False,
            f"{param_name}.dtype={param_desc.dtype.name} must be {expected.dtype.name} for "
            f"x_desc.dtype={x_desc.dtype.name}",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    epsilon = check_finite("epsilon", epsilon)
    if not epsilon >= BN_MIN_EPSILON:  # (the message is formatted only on failure)
        require(False, f"epsilon={epsilon} must be at least {BN_MIN_EPSILON} (CUDNN_BN_MIN_EPSILON)")
    factor = check_finite("exponential_average_factor", factor)
    require(0.0 <= factor <= 1.0, f"exponential_average_factor={factor} must be between 0 and 1")
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    alpha_param, beta_param = check_finite("alpha_param", alpha_param), check_finite("beta_param", beta_param)
    if ops is BatchNormOps.BN:
        activation, activation_coef, propagate_nan = None, 0.0, False
    else:
        require(
            activation is not None,
            f"activation_desc=None but bn_ops={ops.name} needs one",
            Status.BAD_PARAM_NULL_POINTER,
        )
        require(
            activation in ACTIVATIONS,
            f"activation_desc.mode={str(activation).upper()} must be RELU, CLIPPED_RELU or IDENTITY for the Ex forms",
            Status.NOT_SUPPORTED,
        )
    if ops is BatchNormOps.BN_ADD_ACTIVATION:
        require(
            z_desc is not None, f"{z_name}=None but bn_ops=BN_ADD_ACTIVATION needs it", Status.BAD_PARAM_NULL_POINTER
        )
    else:
        z_desc = None
    return BatchNormProblem(
        direction,
        mode,
        ops,
        x_desc,
        out_desc,
        param_desc,
        epsilon,
        z_desc,
        dy_desc,
        activation,
        float(activation_coef),
        bool(propagate_nan) and activation in NAN_RULED,
        factor,
        alpha,
        beta,
        alpha_param,
        beta_param,
        bool(update_running),
        bool(saved),
        bool(reserve),
        bool(torch_rule) and direction is Direction.BACKWARD and bool(propagate_nan) and activation in NAN_RULED,
    )


# ---- float64 reference ----------------------------------------------------------------------------


def statistics(x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) over ``axes``, keeping dims."""
    mean = x.mean(axis=axes, keepdims=True)
    return mean, ((x - mean) ** 2).mean(axis=axes, keepdims=True)


def activate(
    v: np.ndarray, activation: str | None, coef: float, propagate_nan: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(act(v), act'(v) as 0/1): relu, clipped relu (ceiling ``coef``) or identity/None. At a NaN v,
    both are NaN with ``propagate_nan``, else 0."""
    if activation == "relu":
        mask = v > 0
    elif activation == "clipped_relu":
        mask = (v > 0) & (v < coef)
    else:
        return v, np.ones_like(v)
    result = np.where(mask, v, 0.0) if activation == "relu" else np.clip(v, 0.0, coef)
    nan = np.isnan(v)
    keep = propagate_nan and nan.any()
    result = np.where(nan, v if keep else 0.0, result)
    return result, np.where(nan, v, mask) if keep else mask.astype(v.dtype)


def forward_training(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    epsilon: float,
    mode: BatchNormMode,
    *,
    factor: float = 0.0,
    running_mean: np.ndarray | None = None,
    running_var: np.ndarray | None = None,
    z: np.ndarray | None = None,
    activation: str | None = None,
    coef: float = 0.0,
    propagate_nan: bool = False,
) -> dict[str, np.ndarray]:
    """Training forward in x's dtype. Returns y, mask (act'), mean, inv_std, and the updated
    running_mean / running_var when given; statistics with the parameters' dims (1, C, ...)."""
    axes = reduced_axes(x.ndim, mode)
    n = math.prod(x.shape[k] for k in axes)
    mean, var = statistics(x, axes)
    inv_std = 1.0 / np.sqrt(var + epsilon)
    v = scale * (x - mean) * inv_std + bias + (0.0 if z is None else z)
    y, mask = activate(v, activation, coef, propagate_nan)
    out = {"y": y, "mask": mask, "mean": mean, "inv_std": inv_std}
    return out | running_statistics(mean, var, n, factor, running_mean, running_var)


def running_statistics(
    mean: np.ndarray,
    var: np.ndarray,
    n: int,
    factor: float,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The updated running_mean / running_var (those given): ``(1 - factor) * running + factor *
    batch``, the batch variance made unbiased (``* n / (n - 1)``)."""
    out = {}
    if running_mean is not None:
        out["running_mean"] = (1 - factor) * running_mean + factor * mean
    if running_var is not None:
        out["running_var"] = (1 - factor) * running_var + factor * var * n / max(n - 1, 1)
    return out


def forward_inference(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float,
    *,
    z: np.ndarray | None = None,
    activation: str | None = None,
    coef: float = 0.0,
    propagate_nan: bool = False,
) -> np.ndarray:
    """``act(scale * (x - mean) / sqrt(var + eps) + bias [+ z])`` with the estimated statistics."""
    v = scale * (x - mean) / np.sqrt(var + epsilon) + bias + (0.0 if z is None else z)
    return activate(v, activation, coef, propagate_nan)[0]


def backward(
    x: np.ndarray,
    dy: np.ndarray,
    scale: np.ndarray,
    epsilon: float,
    mode: BatchNormMode,
    *,
    mean: np.ndarray | None = None,
    inv_std: np.ndarray | None = None,
    mask: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Backward in x's dtype: dx, dscale, dbias and dz (= g = dy * mask). The statistics are
    recomputed from x when ``mean`` or ``inv_std`` is None."""
    axes = reduced_axes(x.ndim, mode)
    n = math.prod(x.shape[k] for k in axes)
    if mean is None or inv_std is None:
        mean, var = statistics(x, axes)
        inv_std = 1.0 / np.sqrt(var + epsilon)
    g = dy if mask is None else dy * mask
    xhat = (x - mean) * inv_std
    dbias = g.sum(axis=axes, keepdims=True)
    dscale = (g * xhat).sum(axis=axes, keepdims=True)
    dx = scale * inv_std * (g - dbias / n - xhat * dscale / n)
    return {"dx": dx, "dscale": dscale, "dbias": dbias, "dz": g}
