"""LRN and divisive normalization as cuDNN's: cudnnLRNCrossChannelForward/Backward and
cudnnDivisiveNormalizationForward/Backward (see ``problem.py`` for the formulas)."""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import TensorDescriptor, check_member
from opendnn.core.dispatch import dispatch
from opendnn.core.handle import Handle
from opendnn.families.lrn.problem import DivNormMode, LRNDescriptor, LRNMode, lrn_problem


def lrn_cross_channel_forward(
    handle: Handle,
    norm_desc: LRNDescriptor,
    mode: LRNMode,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * lrn(x) + beta * y`` across channels (dim 1); with beta == 0, y is never read.

    Raises:
        BadParam: x with fewer than 3 dims, y not of x's dims, a tensor past its buffer.
    """
    problem = lrn_problem(norm_desc, check_member("mode", LRNMode, mode), x_desc, y_desc, alpha=alpha, beta=beta)
    dispatch(handle, "lrn", problem, bind("x", x_desc, x), bind("y", y_desc, y, output=True))


def lrn_cross_channel_backward(
    handle: Handle,
    norm_desc: LRNDescriptor,
    mode: LRNMode,
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
    """``dx = alpha * d lrn(x)/dx . dy + beta * dx``. y (the forward output) is checked but the
    backends recompute what they need from x, which costs less memory traffic than reading y.

    Raises:
        BadParam: tensors of other dims than x's, dy of another dtype, a tensor past its buffer.
    """
    problem = lrn_problem(
        norm_desc,
        check_member("mode", LRNMode, mode),
        x_desc,
        dx_desc,
        backward=True,
        others={"y_desc": y_desc, "dy_desc": dy_desc},
        alpha=alpha,
        beta=beta,
    )
    bind("y", y_desc, y)
    dispatch(
        handle,
        "lrn",
        problem,
        bind("x", x_desc, x),
        bind("dx", dx_desc, dx, output=True),
        None,
        bind("dy", dy_desc, dy),
    )


def divisive_normalization_forward(
    handle: Handle,
    norm_desc: LRNDescriptor,
    mode: DivNormMode,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    means: Any,
    temp: Any,
    temp2: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * (x - means) / (k + alpha_n/n^S * boxsum((x - means)^2))^beta_n + beta * y``.

    Args:
        means: of x_desc's dims and dtype, or None (zeros).
        temp, temp2: scratch of x_desc's dims and dtype (cuDNN's); None lets the backend allocate.

    Raises:
        BadParam: x not 4-D or 5-D, y not of x's dims, a tensor past its buffer.
    """
    problem = lrn_problem(
        norm_desc,
        check_member("mode", DivNormMode, mode),
        x_desc,
        y_desc,
        alpha=alpha,
        beta=beta,
        has_means=means is not None,
    )
    dispatch(
        handle,
        "lrn",
        problem,
        bind("x", x_desc, x),
        bind("y", y_desc, y, output=True),
        None if means is None else bind("means", x_desc, means),
        None,
        None,
        *_temps(x_desc, temp, temp2),
    )


def divisive_normalization_backward(
    handle: Handle,
    norm_desc: LRNDescriptor,
    mode: DivNormMode,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    means: Any,
    dy: Any,
    temp: Any,
    temp2: Any,
    beta: float,
    dx_dmeans_desc: TensorDescriptor,
    dx: Any,
    dmeans: Any,
) -> None:
    """dx and dmeans (= -dx before blending), both ``alpha * gradient + beta * prior``; dy and
    means share x_desc, dx and dmeans share dx_dmeans_desc. dmeans may be None (not written).

    Raises:
        BadParam: x not 4-D or 5-D, dx_dmeans_desc not of x's dims, a tensor past its buffer.
    """
    mode = check_member("mode", DivNormMode, mode)
    problem = lrn_problem(
        norm_desc, mode, x_desc, dx_dmeans_desc, backward=True, alpha=alpha, beta=beta, has_means=means is not None
    )
    dispatch(
        handle,
        "lrn",
        problem,
        bind("x", x_desc, x),
        bind("dx", dx_dmeans_desc, dx, output=True),
        None if means is None else bind("means", x_desc, means),
        bind("dy", x_desc, dy),
        None if dmeans is None else bind("dmeans", dx_dmeans_desc, dmeans, output=True),
        *_temps(x_desc, temp, temp2),
    )


def _temps(x_desc: TensorDescriptor, temp: Any, temp2: Any) -> tuple[Any, Any]:
    return (
        None if temp is None else bind("temp", x_desc, temp, output=True),
        None if temp2 is None else bind("temp2", x_desc, temp2, output=True),
    )
