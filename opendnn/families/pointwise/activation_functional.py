"""The Pythonic activations, forward and backward (dx = dy * f'(x)): relu, clipped relu, elu, gelu,
sigmoid, tanh, softplus, swish; each is one planned pointwise call (``functional._pointwise``).

See ``opendnn.functional``'s docstring for the conventions every function follows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import constant_like, wrap
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.errors import BadParam, require
from opendnn.core.handle import Handle
from opendnn.families.pointwise.functional import _pointwise, where
from opendnn.families.pointwise.problem import PointwiseMode, resolved_coef

# activations, forward ------------------------------------------------------------------------


@caller_dtypes
def relu(x: Any, *, propagate_nan: bool = False, handle: Handle | None = None) -> Any:
    """max(x, 0); NaN gives NaN with propagate_nan, else 0."""
    return _pointwise(PointwiseMode.RELU_FWD, x, propagate_nan=propagate_nan, handle=handle)


@caller_dtypes
def clipped_relu(x: Any, ceiling: float, *, propagate_nan: bool = False, handle: Handle | None = None) -> Any:
    """min(max(x, 0), ceiling) (relu6 for ceiling 6)."""
    mode = PointwiseMode.CLIPPED_RELU_FWD
    return _pointwise(mode, x, coef=resolved_coef(mode, ceiling, "ceiling"), propagate_nan=propagate_nan, handle=handle)


@caller_dtypes
def elu(x: Any, alpha: float = 1.0, *, handle: Handle | None = None) -> Any:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    return _pointwise(
        PointwiseMode.ELU_FWD, x, coef=resolved_coef(PointwiseMode.ELU_FWD, alpha, "alpha"), handle=handle
    )


@caller_dtypes
def gelu(x: Any, approximate: str = "none", *, handle: Handle | None = None) -> Any:
    """x * Phi(x) (approximate="none") or its tanh form (approximate="tanh"), as torch's."""
    return _pointwise(_gelu_mode(approximate, "_FWD"), x, handle=handle)


@caller_dtypes
def sigmoid(x: Any, *, handle: Handle | None = None) -> Any:
    """1 / (1 + exp(-x))."""
    return _pointwise(PointwiseMode.SIGMOID_FWD, x, handle=handle)


@caller_dtypes
def tanh(x: Any, *, handle: Handle | None = None) -> Any:
    """Hyperbolic tangent, (exp(2x) - 1) / (exp(2x) + 1).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.TANH_FWD, x, handle=handle)


@caller_dtypes
def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0, *, handle: Handle | None = None) -> Any:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's linear region).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        beta: finite and above 0 (torch's default 1.0).
        threshold: where beta * x exceeds it the result is x (torch's default 20.0); inf turns the
            linear region off.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.

    Raises:
        BadParam: ``beta`` not a finite number above 0, ``threshold`` NaN.
    """
    mode = PointwiseMode.SOFTPLUS_FWD
    y = _pointwise(mode, x, coef=resolved_coef(mode, beta, "beta"), handle=handle)
    return _linear_region(x, x, y, beta, threshold, handle)


def _linear_region(x: Any, linear: Any, y: Any, beta: float, threshold: float, handle: Handle | None) -> Any:
    """``linear`` where beta * x > threshold, else ``y`` (softplus's linear region, as torch's)."""
    if np.isnan(threshold):
        raise BadParam(f"threshold={threshold} must be a number (inf turns the linear region off)")
    if threshold == np.inf:
        return y
    bound = constant_like(wrap("x", x), threshold).view
    beyond = _pointwise(PointwiseMode.CMP_GT, x, bound, input_scales=(beta, 1.0, 1.0), handle=handle)
    return where(beyond, linear, y)


@caller_dtypes
def swish(x: Any, beta: float = 1.0, *, handle: Handle | None = None) -> Any:
    """x * sigmoid(beta * x) (silu for beta 1)."""
    return _pointwise(
        PointwiseMode.SWISH_FWD, x, coef=resolved_coef(PointwiseMode.SWISH_FWD, beta, "beta"), handle=handle
    )


# activations, backward: dx = dy * f'(x) ------------------------------------------------------


@caller_dtypes
def relu_backward(
    dy: Any, x: Any, *, propagate_nan: bool = False, torch_rule: bool = False, handle: Handle | None = None
) -> Any:
    """Gradient of relu: dy where x > 0, else 0.

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        propagate_nan: a NaN in ``x`` gives NaN; without it, 0.
        torch_rule: torch's formula (threshold_backward): 0 where x <= 0, else dy, selected: dy
            where ``x`` is NaN, 0 where x <= 0 even for a NaN or infinite dy.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together, ``propagate_nan`` and ``torch_rule`` both set.
    """
    return _pointwise(PointwiseMode.RELU_BWD, dy, x, propagate_nan=propagate_nan, torch_rule=torch_rule, handle=handle)


@caller_dtypes
def clipped_relu_backward(
    dy: Any,
    x: Any,
    ceiling: float,
    *,
    propagate_nan: bool = False,
    torch_rule: bool = False,
    handle: Handle | None = None,
) -> Any:
    """Gradient of clipped_relu: dy where 0 < x < ceiling, else 0.

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        ceiling: the clipping value the forward used (6 for relu6); finite and above 0.
        propagate_nan: a NaN in ``x`` gives NaN; without it, 0.
        torch_rule: torch's formula (hardtanh_backward from 0): 0 where x <= 0 or x >= ceiling,
            else dy, selected: dy where ``x`` is NaN, 0 there even for a NaN or infinite dy.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together, ``propagate_nan`` and ``torch_rule`` both set.
        BadParam: ``ceiling`` not a finite number above 0.
    """
    mode = PointwiseMode.CLIPPED_RELU_BWD
    coef = resolved_coef(mode, ceiling, "ceiling")
    return _pointwise(mode, dy, x, coef=coef, propagate_nan=propagate_nan, torch_rule=torch_rule, handle=handle)


@caller_dtypes
def elu_backward(dy: Any, x: Any, alpha: float = 1.0, *, torch_rule: bool = False, handle: Handle | None = None) -> Any:
    """Gradient of elu: dy where x > 0, else dy * alpha * exp(x).

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        alpha: the forward's alpha (torch's default 1.0); finite.
        torch_rule: torch's formula (elu_backward): dy * alpha * exp(x) where x <= 0, else dy:
            dy where ``x`` is NaN (without it, NaN).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
        BadParam: ``alpha`` not a finite number.
    """
    coef = resolved_coef(PointwiseMode.ELU_BWD, alpha, "alpha")
    return _pointwise(PointwiseMode.ELU_BWD, dy, x, coef=coef, torch_rule=torch_rule, handle=handle)


@caller_dtypes
def gelu_backward(dy: Any, x: Any, approximate: str = "none", *, handle: Handle | None = None) -> Any:
    """Gradient of gelu: dy * (Phi(x) + x * phi(x)), or of its tanh form, as torch's.

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        approximate: "none" (the erf form) or "tanh" (the tanh approximation), as the forward.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
        BadParam: ``approximate`` neither 'none' nor 'tanh'.
    """
    return _pointwise(_gelu_mode(approximate, "_BWD"), dy, x, handle=handle)


@caller_dtypes
def sigmoid_backward(dy: Any, x: Any, *, handle: Handle | None = None) -> Any:
    """Gradient of sigmoid: dy * s * (1 - s), with s = sigmoid(x).

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.SIGMOID_BWD, dy, x, handle=handle)


@caller_dtypes
def tanh_backward(dy: Any, x: Any, *, handle: Handle | None = None) -> Any:
    """Gradient of tanh: dy * (1 - tanh(x) ** 2).

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.TANH_BWD, dy, x, handle=handle)


@caller_dtypes
def softplus_backward(
    dy: Any, x: Any, beta: float = 1.0, threshold: float = 20.0, *, handle: Handle | None = None
) -> Any:
    """Gradient of softplus: dy * sigmoid(beta * x), and dy where beta * x > threshold.

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        beta: the forward's beta (torch's default 1.0); finite and above 0.
        threshold: the forward's threshold (torch's default 20.0).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
        BadParam: ``beta`` not a finite number above 0, ``threshold`` NaN.
    """
    mode = PointwiseMode.SOFTPLUS_BWD
    dx = _pointwise(mode, dy, x, coef=resolved_coef(mode, beta, "beta"), handle=handle)
    return _linear_region(x, dy, dx, beta, threshold, handle)


@caller_dtypes
def swish_backward(dy: Any, x: Any, beta: float = 1.0, *, handle: Handle | None = None) -> Any:
    """Gradient of swish: dy * (s + beta * x * s * (1 - s)), with s = sigmoid(beta * x).

    Args:
        dy: the gradient of the loss with respect to the activation's output.
        x: the activation's input, broadcastable with ``dy``.
        beta: the forward's beta (1.0 for silu); finite and above 0.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dy * f'(x), a new array of ``dy``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``dy`` and ``x`` do not broadcast together.
        BadParam: ``beta`` not a finite number above 0.
    """
    mode = PointwiseMode.SWISH_BWD
    return _pointwise(mode, dy, x, coef=resolved_coef(mode, beta, "beta"), handle=handle)


def _gelu_mode(approximate: str, suffix: str) -> PointwiseMode:
    forms = {"none": "GELU", "tanh": "GELU_APPROX_TANH"}
    require(approximate in forms, f"approximate={approximate!r} must be 'none' or 'tanh'")
    return PointwiseMode[forms[approximate] + suffix]
