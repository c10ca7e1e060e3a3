"""Activation forward and backward, as cuDNN's cudnnActivationForward / cudnnActivationBackward."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, check_member, check_same_dims
from opendnn.core.dispatch import dispatch, require_handle
from opendnn.core.errors import require
from opendnn.core.handle import Handle
from opendnn.families.pointwise.problem import PointwiseMode, pointwise_problem, resolved_coef


class ActivationMode(enum.Enum):
    """cuDNN's activation modes, plus GELU (erf and tanh forms) and SOFTPLUS from its graph API."""

    SIGMOID = "sigmoid"
    RELU = "relu"
    TANH = "tanh"
    CLIPPED_RELU = "clipped_relu"  # coef: the ceiling
    ELU = "elu"  # coef: alpha
    IDENTITY = "identity"
    SWISH = "swish"  # coef: beta
    GELU = "gelu"
    GELU_APPROX_TANH = "gelu_approx_tanh"
    SOFTPLUS = "softplus"  # coef: beta


@dataclass(frozen=True)
class ActivationDescriptor:
    """An activation and its parameter.

    Args:
        mode: ActivationMode.
        nan_opt: NanPropagation for relu and clipped relu.
        coef: clipped relu's ceiling (required, > 0), elu's alpha, swish's and softplus's beta
            (each 1.0 when None: problem.py's ACTIVATION_TABLE); ignored by the other modes.

    Raises:
        BadParam: a mode or nan_opt out of range, a coef against the mode's rule.
    """

    mode: ActivationMode
    nan_opt: NanPropagation = NanPropagation.NOT_PROPAGATE_NAN
    coef: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", check_member("mode", ActivationMode, self.mode))
        object.__setattr__(self, "nan_opt", check_member("nan_opt", NanPropagation, self.nan_opt))
        object.__setattr__(self, "coef", resolved_coef(self.forward_mode, self.coef))

    @property
    def forward_mode(self) -> PointwiseMode:
        if self.mode is ActivationMode.IDENTITY:
            return PointwiseMode.IDENTITY
        return PointwiseMode(self.mode.value + "_fwd")

    @property
    def backward_mode(self) -> PointwiseMode:
        return PointwiseMode(self.mode.value + "_bwd")


def activation_forward(
    handle: Handle,
    act_desc: ActivationDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * act(x) + beta * y``; with beta == 0, y is never read.

    Raises:
        BadParam: x_desc and y_desc differ in dims, a tensor reaches past its buffer, ...
    """
    _check_activation_descriptor(act_desc)
    xb, yb = bind("x", x_desc, x), bind("y", y_desc, y, output=True)
    check_same_dims("x_desc", x_desc, "y_desc", y_desc)
    problem = pointwise_problem(
        act_desc.forward_mode,
        [xb],
        yb,
        alpha=alpha,
        beta=beta,
        coef=act_desc.coef or 0.0,
        propagate_nan=_propagates(act_desc),
        fast_math=require_handle(handle).fast_math,
    )
    dispatch(handle, "pointwise", problem, [xb], yb)


def activation_backward(
    handle: Handle,
    act_desc: ActivationDescriptor,
    alpha: float,
    y_desc: TensorDescriptor,
    y: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    dx_desc: TensorDescriptor,
    dx: Any,
) -> None:
    """``dx = alpha * dy * act'(x) + beta * dx``; y (the forward output) is checked, not needed.

    Raises:
        BadParam: any of y, dy, x, dx differing in dims, a tensor past its buffer, ...
    """
    _check_activation_descriptor(act_desc)
    bind("y", y_desc, y)
    dyb, xb = bind("dy", dy_desc, dy), bind("x", x_desc, x)
    dxb = bind("dx", dx_desc, dx, output=True)
    for name, desc in (("y_desc", y_desc), ("dy_desc", dy_desc), ("dx_desc", dx_desc)):
        check_same_dims(name, desc, "x_desc", x_desc)
    problem = pointwise_problem(
        act_desc.backward_mode,
        [dyb, xb],
        dxb,
        alpha=alpha,
        beta=beta,
        coef=act_desc.coef or 0.0,
        propagate_nan=_propagates(act_desc),
        fast_math=require_handle(handle).fast_math,
    )
    dispatch(handle, "pointwise", problem, [dyb, xb], dxb)


def _check_activation_descriptor(act_desc: Any) -> None:
    require(isinstance(act_desc, ActivationDescriptor), f"act_desc={act_desc!r} must be an ActivationDescriptor")


def _propagates(act_desc: ActivationDescriptor) -> bool:
    return act_desc.nan_opt is NanPropagation.PROPAGATE_NAN
