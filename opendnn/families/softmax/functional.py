"""The Pythonic softmax functions: softmax and log-softmax over any one dim, forward and backward,
of arrays with any strides (the output keeps the input's dimension order).

See ``opendnn.functional``'s docstring for the conventions every function follows, and ``problem.py``
for the formulas.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from opendnn.core.arrays import allocate, as_native, empty_like, keyed_bound, wrap
from opendnn.core.caller_arrays import shaped, to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import check_int
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.softmax.problem import SoftmaxAlgorithm, softmax_problem


@caller_dtypes
def softmax(x: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """exp(x - max) / sum(exp(x - max)) along ``dim`` (as torch.softmax)."""
    return _softmax(SoftmaxAlgorithm.ACCURATE, dim, (x,), handle)


@caller_dtypes
def log_softmax(x: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """(x - max) - log(sum(exp(x - max))) along ``dim`` (as torch.log_softmax)."""
    return _softmax(SoftmaxAlgorithm.LOG, dim, (x,), handle)


@caller_dtypes
def softmax_grad(dy: Any, y: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """Gradient of softmax: dx = y * (dy - sum(dy * y)) along ``dim``.

    The gradient comes first, as in every other backward function of ``opendnn.functional`` and in
    torch's ``_softmax_backward_data(grad_output, output, dim, ...)``.

    Args:
        dy: the gradient of the loss with respect to softmax's output.
        y: softmax's output, of ``dy``'s shape.
        dim: the dim softmax ran along.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dx, a new array of ``dy``'s kind, shape and dimension order.

    Raises:
        BadParam: ``dim`` out of range, or ``y`` and ``dy`` of different shapes or dtypes.
    """
    return _softmax(SoftmaxAlgorithm.ACCURATE, dim, (y, dy), handle)


@caller_dtypes
def log_softmax_grad(dy: Any, y: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """Gradient of log_softmax: dx = dy - exp(y) * sum(dy) along ``dim``.

    Args:
        dy: the gradient of the loss with respect to log_softmax's output.
        y: log_softmax's output, of ``dy``'s shape.
        dim: the dim log_softmax ran along.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        dx, a new array of ``dy``'s kind, shape and dimension order.

    Raises:
        BadParam: ``dim`` out of range, or ``y`` and ``dy`` of different shapes or dtypes.
    """
    return _softmax(SoftmaxAlgorithm.LOG, dim, (y, dy), handle)


@caller_dtypes
def softmax_backward(y: Any, dy: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """Deprecated (removed in 0.2.0): ``softmax_grad(dy, y, dim)``, the gradient first.

    dx = y * (dy - sum(dy * y)) along ``dim``, from softmax's output y and its gradient dy.

    Warns:
        DeprecationWarning: on every call.
    """
    _deprecated("softmax_backward", "softmax_grad")
    return softmax_grad(dy, y, dim, handle=handle)


@caller_dtypes
def log_softmax_backward(y: Any, dy: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """Deprecated (removed in 0.2.0): ``log_softmax_grad(dy, y, dim)``, the gradient first.

    dx = dy - exp(y) * sum(dy) along ``dim``, from log_softmax's output y and its gradient dy.

    Warns:
        DeprecationWarning: on every call.
    """
    _deprecated("log_softmax_backward", "log_softmax_grad")
    return log_softmax_grad(dy, y, dim, handle=handle)


def _deprecated(name: str, replacement: str) -> None:
    warnings.warn(
        f"opendnn.functional.{name}(y, dy, dim) is deprecated and is removed in 0.2.0: call "
        f"{replacement}(dy, y, dim), which takes the gradient first like every other backward function",
        DeprecationWarning,
        stacklevel=4,  # the caller of the deprecated function, past it and caller_dtypes
    )


def _softmax(algo: SoftmaxAlgorithm, dim: int, arrays: tuple[Any, ...], handle: Handle | None) -> Any:
    names = ("y", "dy") if len(arrays) == 2 else ("x",)
    key = signature("softmax", arrays, (algo, dim))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            descs, shape = plan.extra
            device = key[1][-1]
            inputs = [keyed_bound(name, desc, array, device) for name, desc, array in zip(names, descs, arrays)]
            output = allocate(inputs[-1], plan.outputs[0])
            execute(handle, plan, inputs, output)
            return to_caller_kind(shaped(output.view, shape), arrays[0])
    inputs = [wrap(name, array) for name, array in zip(names, arrays)]
    shape = tuple(np.shape(as_native(arrays[0])))
    ndim, dim = inputs[0].desc.ndim, check_int("dim", dim)
    if not -ndim <= dim < ndim:  # (the message is formatted only on failure: this runs for every call)
        raise BadParam(f"dim={dim} must be between {-ndim} and {ndim - 1} for {names[0]} of {ndim} dims")
    if inputs[-1].desc.dtype is not inputs[0].desc.dtype:  # one dtype, as every non-pointwise operation
        first, last = inputs[0], inputs[-1]
        raise BadParam(
            f"{last.name}.dtype={last.desc.dtype.value} must equal {first.name}.dtype={first.desc.dtype.value}"
        )
    output = empty_like(inputs[-1])
    problem = softmax_problem(
        algo,
        (dim % ndim,),
        [f"{b.name}" for b in inputs] + ["out"],
        [b.desc for b in inputs] + [output.desc],
        backward=len(arrays) == 2,
    )
    handle = handle_for(inputs[0], handle)
    implementation = dispatch(handle, "softmax", problem, inputs, output)
    extra = (tuple(b.desc for b in inputs), shape)
    keep(handle, key, Plan("softmax", problem, (output.desc,), implementation, extra))
    return to_caller_kind(shaped(output.view, shape), arrays[0])
