"""Layer, RMS, group and instance normalization: one operation, its rules and its float64 NumPy
reference.

Each mode splits x's elements into *rows* (the sets normalized together) and, within a row, the
normalized elements:

    LAYER_NORM, RMS_NORM  the last ``normalized_ndim`` dims of x form a row; scale and bias have
                          x's dims with the others set to 1 (one parameter per normalized element).
    GROUP_NORM            x is (N, C, spatial...); the C channels split into ``groups`` equal groups
                          and a row is (one sample, one group): C/groups channels x all spatial
                          elements; scale and bias are per channel, dims (1, C, 1, ...).
    INSTANCE_NORM         GROUP_NORM with one channel per group (groups = C).

Per row, over its M elements (float32 arithmetic, float64 for float64 data):

    mean = sum(x) / M,  inv_std = 1 / sqrt(sum((x - mean)^2) / M + epsilon)      (biased variance)
    y = (x - mean) * inv_std * scale + bias
    RMS_NORM: inv_rms = 1 / sqrt(sum(x^2) / M + epsilon),  y = x * inv_rms * scale + bias

Missing scale means 1, missing bias 0. Training forward also writes the row statistics (mean and
inv_std; RMS_NORM writes inv_rms into ``inv_std`` and has no mean) with dims: x's dims with the
normalized ones set to 1 (LAYER/RMS), or (N, groups, 1, ...) (GROUP/INSTANCE).

Backward, with xhat = (x - mean) * inv_std (RMS: x * inv_rms), g = dy * scale and means over
the row:

    dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))      (RMS: inv_rms * (g - xhat * mean(g * xhat)))
    dscale = sum over every element sharing the parameter of dy * xhat,  dbias = sum of dy

Blending: ``y = alpha * result + beta * y``; backward has (alpha, beta) for dx and a second pair
for dscale and dbias.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import (
    TensorDescriptor,
    check_finite,
    check_float_tensor,
    check_int,
    check_member,
    check_same_dims,
)
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status, require


class NormMode(enum.Enum):
    """Which elements are normalized together (see the module docstring)."""

    LAYER_NORM = "layer"
    RMS_NORM = "rms"
    GROUP_NORM = "group"
    INSTANCE_NORM = "instance"


@dataclass(frozen=True)
class NormDescriptor:
    """A normalization: mode, epsilon, and the normalized dims (LAYER/RMS) or groups (GROUP).

    Args:
        mode: NormMode.
        epsilon: added to the variance (mean square for RMS); at least 0.
        normalized_ndim: LAYER_NORM and RMS_NORM: how many trailing dims of x form a row (>= 1).
        groups: GROUP_NORM: how many groups the channels split into (>= 1).

    Raises:
        BadParam: epsilon negative or not finite, normalized_ndim or groups below 1.
    """

    mode: NormMode
    epsilon: float = 1e-5
    normalized_ndim: int = 1
    groups: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", check_member("mode", NormMode, self.mode))
        epsilon = check_finite("epsilon", self.epsilon)
        require(epsilon >= 0, f"epsilon={self.epsilon} must be finite and at least 0")
        object.__setattr__(self, "epsilon", epsilon)
        for name in ("normalized_ndim", "groups"):
            value = check_int(name, getattr(self, name))
            require(value >= 1, f"{name}={value} must be at least 1")
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class NormProblem:
    """A validated normalization, forward (``dy`` None) or backward.

    ``rows`` is how many rows x has and ``row_size`` the elements per row; ``groups`` is 0 for
    LAYER/RMS and the group count for GROUP/INSTANCE. ``dparam_alpha/beta`` blend dscale and dbias.
    """

    mode: NormMode
    x: TensorDescriptor
    y: TensorDescriptor  # forward: y; backward: dx
    scale: TensorDescriptor | None
    bias: TensorDescriptor | None  # forward: bias; backward: dbias
    stats: TensorDescriptor | None  # mean and inv_std
    dy: TensorDescriptor | None
    dscale: TensorDescriptor | None
    normalized_ndim: int
    groups: int
    epsilon: float
    alpha: float = 1.0
    beta: float = 0.0
    dparam_alpha: float = 1.0
    dparam_beta: float = 0.0
    has_mean: bool = False
    compute_dtype: DataType = DataType.FLOAT

    @property
    def backward(self) -> bool:
        return self.dy is not None

    @property
    def rms(self) -> bool:
        return self.mode is NormMode.RMS_NORM

    @property
    def grouped(self) -> bool:
        return self.groups > 0

    @property
    def rows(self) -> int:
        return self.x.numel // self.row_size

    @property
    def row_size(self) -> int:
        if self.grouped:
            return self.x.numel // (self.x.dims[0] * self.groups)
        return math.prod(self.x.dims[-self.normalized_ndim :])


def param_dims(mode: NormMode, x_dims: tuple[int, ...], normalized_ndim: int) -> tuple[int, ...]:
    """Dims of scale and bias: x's with the non-normalized dims set to 1 (per channel for GROUP)."""
    if mode in (NormMode.GROUP_NORM, NormMode.INSTANCE_NORM):
        return tuple(d if k == 1 else 1 for k, d in enumerate(x_dims))
    lead = len(x_dims) - normalized_ndim
    return tuple(1 if k < lead else d for k, d in enumerate(x_dims))


def stats_dims(mode: NormMode, x_dims: tuple[int, ...], normalized_ndim: int, groups: int) -> tuple[int, ...]:
    """Dims of mean and inv_std: one per row."""
    if mode in (NormMode.GROUP_NORM, NormMode.INSTANCE_NORM):
        return (x_dims[0], groups) + (1,) * (len(x_dims) - 2)
    lead = len(x_dims) - normalized_ndim
    return tuple(d if k < lead else 1 for k, d in enumerate(x_dims))


def norm_problem(
    norm_desc: NormDescriptor,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    *,
    scale_desc: TensorDescriptor | None = None,
    bias_desc: TensorDescriptor | None = None,
    stats_desc: TensorDescriptor | None = None,
    dy_desc: TensorDescriptor | None = None,
    dscale_desc: TensorDescriptor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    dparam_alpha: float = 1.0,
    dparam_beta: float = 0.0,
    has_mean: bool = False,
) -> NormProblem:
    """The shape and dtype rules of a normalization, forward or backward (``dy_desc`` given).

    Raises:
        BadParam: y (dx) or dy not of x's dims; too few dims for the mode; channels that the
            groups do not divide; scale, bias or statistics of the wrong dims; non-float data;
            statistics that are not FLOAT (DOUBLE for DOUBLE data); non-finite alpha or beta.
    """
    if not isinstance(norm_desc, NormDescriptor):
        raise BadParam(f"norm_desc={norm_desc!r} must be a NormDescriptor")
    mode = norm_desc.mode
    tensors = {"x_desc": x_desc, "y_desc": y_desc, "dy_desc": dy_desc}
    for name, desc in tensors.items():
        if desc is None:
            continue
        check_float_tensor(name, desc)
    check_same_dims("y_desc", y_desc, "x_desc", x_desc)
    if dy_desc is not None:
        check_same_dims("dy_desc", dy_desc, "x_desc", x_desc)
    dims = x_desc.dims
    groups = 0
    if mode in (NormMode.GROUP_NORM, NormMode.INSTANCE_NORM):
        require(len(dims) >= 2, f"x_desc.ndim={len(dims)} must be at least 2 (N, C, spatial...) for {mode.name}")
        groups = dims[1] if mode is NormMode.INSTANCE_NORM else norm_desc.groups
        require(dims[1] % groups == 0, f"x_desc.dims[1]={dims[1]} must be a multiple of norm_desc.groups={groups}")
    else:
        require(
            norm_desc.normalized_ndim <= len(dims),
            f"norm_desc.normalized_ndim={norm_desc.normalized_ndim} must be at most x_desc.ndim={len(dims)}",
        )
    compute = x_desc.dtype.compute_type
    expected_params = param_dims(mode, dims, norm_desc.normalized_ndim)
    for name, desc in (("scale_desc", scale_desc), ("bias_desc", bias_desc), ("dscale_desc", dscale_desc)):
        if desc is not None:
            _check_dims(name, desc, expected_params)
            require(
                desc.dtype.is_floating,
                f"{name}.dtype={desc.dtype.name} must be a float type",
                Status.NOT_SUPPORTED_DATA_TYPE,
            )
    if stats_desc is not None:
        _check_dims("stats_desc", stats_desc, stats_dims(mode, dims, norm_desc.normalized_ndim, groups))
        require(stats_desc.dtype is compute, f"stats_desc.dtype={stats_desc.dtype.name} must be {compute.name}")
    return NormProblem(
        mode,
        x_desc,
        y_desc,
        scale_desc,
        bias_desc,
        stats_desc,
        dy_desc,
        dscale_desc,
        norm_desc.normalized_ndim,
        groups,
        norm_desc.epsilon,
        check_finite("alpha", alpha),
        check_finite("beta", beta),
        check_finite("dparam_alpha", dparam_alpha),
        check_finite("dparam_beta", dparam_beta),
        has_mean and mode is not NormMode.RMS_NORM,
        compute,
    )


def _check_dims(name: str, desc: TensorDescriptor, expected: tuple[int, ...]) -> None:
    if not isinstance(desc, TensorDescriptor):
        raise BadParam(f"{name}={desc!r} must be a TensorDescriptor")
    if desc.dims != expected:
        raise BadParam(f"{name}.dims={list(desc.dims)} must be {list(expected)}", Status.BAD_PARAM_SHAPE_MISMATCH)


# the float64 reference ---------------------------------------------------------------------------


def _rows(x: np.ndarray, grouped: int, normalized_ndim: int) -> np.ndarray:
    """x as (rows, row_size); a view in logical (row-major) order."""
    if grouped:
        return x.reshape(x.shape[0] * grouped, -1)
    return x.reshape(-1, math.prod(x.shape[x.ndim - normalized_ndim :]))


def _per_element(param: np.ndarray | None, shape: tuple[int, ...], fill: float) -> np.ndarray:
    return np.broadcast_to(fill if param is None else param, shape)


def forward_reference(
    mode: NormMode,
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float,
    normalized_ndim: int = 1,
    groups: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, inv_std) in x's float dtype; mean and inv_std as (rows,) arrays (mean zeros for RMS).

    Args:
        scale, bias: arrays broadcastable to x (``param_dims``), or None.
        groups: GROUP/INSTANCE's group count (0 for LAYER/RMS).
    """
    mode = NormMode(mode)
    rows = _rows(x, groups, normalized_ndim)
    if mode is NormMode.RMS_NORM:
        mean = np.zeros(rows.shape[0], x.dtype)
        inv_std = 1.0 / np.sqrt((rows * rows).mean(axis=1) + epsilon)
    else:
        mean = rows.mean(axis=1)
        centered = rows - mean[:, None]
        inv_std = 1.0 / np.sqrt((centered * centered).mean(axis=1) + epsilon)
    xhat = ((rows - mean[:, None]) * inv_std[:, None]).reshape(x.shape)
    y = xhat * _per_element(scale, x.shape, 1.0) + _per_element(bias, x.shape, 0.0)
    return y, mean, inv_std


def backward_reference(
    mode: NormMode,
    x: np.ndarray,
    dy: np.ndarray,
    scale: np.ndarray | None,
    epsilon: float,
    normalized_ndim: int = 1,
    groups: int = 0,
    param_shape: tuple[int, ...] | None = None,
    *,
    saved_mean: np.ndarray | None = None,
    saved_inv_std: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dx, dscale, dbias): dx of x's shape; dscale and dbias of ``param_shape`` (default: the
    parameters' dims, ``param_dims``). The statistics are the forward's saved ones where given, as
    (rows,) arrays (cuDNN's: the backward then reads no epsilon), else recomputed from x."""
    mode = NormMode(mode)
    _, mean, inv_std = forward_reference(mode, x, None, None, epsilon, normalized_ndim, groups)
    if saved_mean is not None and mode is not NormMode.RMS_NORM:
        mean = saved_mean
    if saved_inv_std is not None:
        inv_std = saved_inv_std
    rows = _rows(x, groups, normalized_ndim)
    xhat = (rows - mean[:, None]) * inv_std[:, None]
    g = _rows(dy * _per_element(scale, x.shape, 1.0), groups, normalized_ndim)
    projection = (g * xhat).mean(axis=1, keepdims=True)
    inner = g - xhat * projection
    if mode is not NormMode.RMS_NORM:
        inner = inner - g.mean(axis=1, keepdims=True)
    dx = (inv_std[:, None] * inner).reshape(x.shape)
    shape = param_shape or param_dims(mode, x.shape, normalized_ndim)
    axes = tuple(k for k, d in enumerate(shape) if d == 1 and x.shape[k] != 1)
    dscale = (dy * xhat.reshape(x.shape)).sum(axis=axes, keepdims=True).reshape(shape)
    dbias = dy.sum(axis=axes, keepdims=True).reshape(shape)
    return dx, dscale, dbias
