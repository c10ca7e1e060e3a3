"""Softmax as cuDNN's: cudnnSoftmaxForward and cudnnSoftmaxBackward.

``y = alpha * softmax(x) + beta * y`` and ``dx = alpha * softmax'(y, dy) + beta * dx`` over the
rows a SoftmaxMode picks (see ``problem.py`` for the formulas and the special rows). Any
dims (at least N and C), any strides; y may be x itself (in place), dx may be dy.
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.handle import Handle
from opendnn.families.softmax.problem import SoftmaxAlgorithm, SoftmaxMode, mode_problem


def softmax_forward(
    handle: Handle,
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * softmax(x) + beta * y`` (FAST, ACCURATE) or log-softmax (LOG); with beta == 0, y
    is never read.

    Raises:
        BadParam: dims of x and y that differ, fewer than 2 dims, a tensor past its buffer or on
            another device, an overlapping y, non-finite alpha or beta.
        NotSupported: a non-float dtype.
    """
    problem = mode_problem(algo, mode, ("x_desc", "y_desc"), (x_desc, y_desc), alpha=alpha, beta=beta)
    xb, yb = bind("x", x_desc, x), bind("y", y_desc, y, output=True)
    dispatch(handle, "softmax", problem, [xb], yb)


def softmax_backward(
    handle: Handle,
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    alpha: float,
    y_desc: TensorDescriptor,
    y: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    beta: float,
    dx_desc: TensorDescriptor,
    dx: Any,
) -> None:
    """``dx = alpha * (y * (dy - sum(dy * y))) + beta * dx`` (FAST, ACCURATE) or
    ``alpha * (dy - exp(y) * sum(dy)) + beta * dx`` (LOG, y the log-softmax), sums over each row;
    with beta == 0, dx is never read.

    Raises:
        BadParam: dims of y, dy and dx that differ, fewer than 2 dims, a tensor past its buffer or
            on another device, an overlapping dx, non-finite alpha or beta.
        NotSupported: a non-float dtype.
    """
    problem = mode_problem(
        algo, mode, ("y_desc", "dy_desc", "dx_desc"), (y_desc, dy_desc, dx_desc), backward=True, alpha=alpha, beta=beta
    )
    yb, dyb = bind("y", y_desc, y), bind("dy", dy_desc, dy)
    dxb = bind("dx", dx_desc, dx, output=True)
    dispatch(handle, "softmax", problem, [yb, dyb], dxb)
