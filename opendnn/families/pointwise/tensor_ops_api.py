"""Tensor operations as cuDNN's: set, scale, add, op_tensor, transform, and any pointwise mode.

All of them are one pointwise problem: ``out = alpha * f(s0 * in0, s1 * in1, in2) + beta * out``.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opendnn.core.arrays import Bound, bind, constant_like, index_along
from opendnn.core.descriptors import (
    TensorDescriptor,
    check_broadcastable,
    check_dtype,
    check_finite,
    check_int,
    check_member,
    check_same_dims,
)
from opendnn.core.dispatch import dispatch, require_handle
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, require
from opendnn.core.handle import Handle
from opendnn.families.pointwise.problem import PointwiseMode, pointwise_problem


class OpTensorOp(enum.Enum):
    """cuDNN's op_tensor operations; SQRT and NOT use A only."""

    ADD = PointwiseMode.ADD
    MUL = PointwiseMode.MUL
    MIN = PointwiseMode.MIN
    MAX = PointwiseMode.MAX
    SQRT = PointwiseMode.SQRT
    NOT = PointwiseMode.LOGICAL_NOT


@dataclass(frozen=True)
class OpTensorDescriptor:
    """Which op_tensor operation, computed in ``compute_type`` (FLOAT or DOUBLE; DOUBLE tensors need
    DOUBLE, as cuDNN's)."""

    op: OpTensorOp
    compute_type: DataType = DataType.FLOAT
    propagate_nan: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", check_member("op", OpTensorOp, self.op))
        compute = check_dtype("compute_type", self.compute_type)
        require(compute in (DataType.FLOAT, DataType.DOUBLE), f"compute_type={compute.name} must be FLOAT or DOUBLE")
        object.__setattr__(self, "compute_type", compute)


def pointwise(
    handle: Handle,
    mode: PointwiseMode,
    alpha: float,
    inputs: Sequence[tuple[TensorDescriptor, Any]],
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
    *,
    coef: float | None = None,
    propagate_nan: bool = False,
) -> None:
    """``y = alpha * mode(*inputs) + beta * y`` with each input's dims equal to y's or 1.

    Args:
        inputs: (descriptor, array) pairs, as many as the mode's arity.
        coef: the mode's coefficient; None for its default (problem.py's ACTIVATION_TABLE).
    """
    mode = check_member("mode", PointwiseMode, mode)
    bound = [bind(f"inputs[{k}]", desc, array) for k, (desc, array) in enumerate(inputs)]
    _run(
        handle,
        mode,
        bound,
        bind("y", y_desc, y, output=True),
        alpha=alpha,
        beta=beta,
        coef=coef,
        propagate_nan=propagate_nan,
    )


def set_tensor(handle: Handle, y_desc: TensorDescriptor, y: Any, value: float) -> None:
    """Every element of y becomes ``value`` (converted to y's dtype; NaN and infinities too).

    Raises:
        BadParam: a value that is not a real number, ...
    """
    if not isinstance(value, numbers.Real):  # (the message is formatted only on failure)
        raise BadParam(f"value={value!r} must be a real number")
    yb = bind("y", y_desc, y, output=True)
    _run(handle, PointwiseMode.IDENTITY, [constant_like(yb, value)], yb)


def scale_tensor(handle: Handle, y_desc: TensorDescriptor, y: Any, alpha: float) -> None:
    """``y = alpha * y`` in place."""
    yb = bind("y", y_desc, y, output=True)
    _run(handle, PointwiseMode.IDENTITY, [yb], yb, alpha=alpha)


def add_tensor(
    handle: Handle, alpha: float, a_desc: TensorDescriptor, a: Any, beta: float, c_desc: TensorDescriptor, c: Any
) -> None:
    """``c = alpha * a + beta * c``, each dim of a equal to c's or 1 (broadcast)."""
    ab = bind("a", a_desc, a)
    _run(handle, PointwiseMode.IDENTITY, [ab], bind("c", c_desc, c, output=True), alpha=alpha, beta=beta)


def op_tensor(
    handle: Handle,
    op_desc: OpTensorDescriptor,
    alpha1: float,
    a_desc: TensorDescriptor,
    a: Any,
    alpha2: float,
    b_desc: TensorDescriptor,
    b: Any,
    beta: float,
    c_desc: TensorDescriptor,
    c: Any,
) -> None:
    """``c = op(alpha1 * a, alpha2 * b) + beta * c``; a has c's dims, b broadcasts to them.
    SQRT and NOT read a only (b is still checked).

    Raises:
        BadParam: a's dims not c's, b's not broadcasting to them, a DOUBLE tensor with
            ``op_desc.compute_type`` FLOAT (float32 arithmetic would round its values), ...
    """
    require(isinstance(op_desc, OpTensorDescriptor), f"op_desc={op_desc!r} must be an OpTensorDescriptor")
    scales = check_finite("alpha1", alpha1), check_finite("alpha2", alpha2)
    ab, bb = bind("a", a_desc, a), bind("b", b_desc, b)
    cb = bind("c", c_desc, c, output=True)
    check_same_dims("a_desc", a_desc, "c_desc", c_desc)
    check_broadcastable("b_desc", b_desc, "c_desc", c_desc)
    if op_desc.compute_type is not DataType.DOUBLE:
        for name, desc in (("a_desc", a_desc), ("b_desc", b_desc), ("c_desc", c_desc)):
            require(
                desc.dtype is not DataType.DOUBLE,
                f"op_desc.compute_type={op_desc.compute_type.name} must be DOUBLE for DOUBLE tensors "
                f"({name}.dtype=DOUBLE)",
            )
    mode = op_desc.op.value
    _run(
        handle,
        mode,
        [ab, bb][: mode.arity],
        cb,
        beta=beta,
        input_scales=scales,
        propagate_nan=op_desc.propagate_nan,
        compute_type=op_desc.compute_type,
    )


def transform_tensor(
    handle: Handle, alpha: float, x_desc: TensorDescriptor, x: Any, beta: float, y_desc: TensorDescriptor, y: Any
) -> None:
    """``y = alpha * x + beta * y`` between any two layouts and dtypes with the same dims."""
    xb, yb = bind("x", x_desc, x), bind("y", y_desc, y, output=True)
    check_same_dims("x_desc", x_desc, "y_desc", y_desc)
    _run(handle, PointwiseMode.IDENTITY, [xb], yb, alpha=alpha, beta=beta)


def gen_index(handle: Handle, axis: int, y_desc: TensorDescriptor, y: Any) -> None:
    """Each element of y becomes its index along ``axis`` (cuDNN's GEN_INDEX)."""
    yb, axis = bind("y", y_desc, y, output=True), check_int("axis", axis)
    require(-yb.desc.ndim <= axis < yb.desc.ndim, f"axis={axis} must be in [-{yb.desc.ndim}, {yb.desc.ndim})")
    _run(handle, PointwiseMode.IDENTITY, [index_along(yb, axis % yb.desc.ndim)], yb)


def _run(handle: Handle, mode: PointwiseMode, inputs: list[Bound], output: Bound, **parameters: Any) -> None:
    problem = pointwise_problem(mode, inputs, output, fast_math=require_handle(handle).fast_math, **parameters)
    dispatch(handle, "pointwise", problem, inputs, output)
