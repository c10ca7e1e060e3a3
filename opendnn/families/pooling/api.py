"""Pooling as cuDNN's: cudnnPoolingForward, cudnnPoolingBackward and the output-dims query.

``y = alpha * pool(x) + beta * y`` and ``dx = alpha * pool'(x, y, dy) + beta * dx`` (see
``problem.py`` for the modes, the window rule, NaN and the backward's argmax rule).
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.handle import Handle
from opendnn.families.pooling.problem import PoolingDescriptor, pooling_problem


def pooling_forward(
    handle: Handle,
    pool_desc: PoolingDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * pool(x) + beta * y``; with beta == 0, y is never read.

    Raises:
        BadParam: y's dims not ``get_pooling_forward_output_dim``, dtypes that differ, a tensor past
            its buffer or on another device.
    """
    xb = bind("x", x_desc, x)
    yb = bind("y", y_desc, y, output=True)
    problem = pooling_problem(pool_desc, x_desc, y_desc, alpha=alpha, beta=beta)
    dispatch(handle, "pooling", problem, xb, yb, None, None)


def pooling_backward(
    handle: Handle,
    pool_desc: PoolingDescriptor,
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
    """``dx = alpha * (gradient of pooling at x, given y and dy) + beta * dx``; with beta == 0, dx
    is never read. The max modes find the first position of each window equal to y (no indices).

    Raises:
        BadParam: dy's dims not y's, dx's not x's, y's not the pooled dims, dtypes that differ, a
            tensor past its buffer or on another device.
    """
    yb, dyb, xb = bind("y", y_desc, y), bind("dy", dy_desc, dy), bind("x", x_desc, x)
    dxb = bind("dx", dx_desc, dx, output=True)
    problem = pooling_problem(pool_desc, x_desc, y_desc, dy_desc=dy_desc, dx_desc=dx_desc, alpha=alpha, beta=beta)
    dispatch(handle, "pooling", problem, xb, yb, dyb, dxb)
