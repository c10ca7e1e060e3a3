"""The Pythonic softmax functions: softmax and log-softmax over any one dim, forward and backward,
of arrays with any strides (the output keeps the input's dimension order).

See ``opendnn.functional``'s docstring for the conventions every function follows, and ``problem.py``
for the formulas.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import as_native, empty_like, wrap
from opendnn.core.caller_arrays import shaped, to_caller_kind
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import check_int
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.families.softmax.problem import SoftmaxAlgorithm, softmax_problem


def softmax(x: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """exp(x - max) / sum(exp(x - max)) along ``dim`` (as torch.softmax)."""
    return _softmax(SoftmaxAlgorithm.ACCURATE, dim, (x,), handle)


def log_softmax(x: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """(x - max) - log(sum(exp(x - max))) along ``dim`` (as torch.log_softmax)."""
    return _softmax(SoftmaxAlgorithm.LOG, dim, (x,), handle)


def softmax_backward(y: Any, dy: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """dx = y * (dy - sum(dy * y)) along ``dim``, from softmax's output y and its gradient dy."""
    return _softmax(SoftmaxAlgorithm.ACCURATE, dim, (y, dy), handle)


def log_softmax_backward(y: Any, dy: Any, dim: int = -1, *, handle: Handle | None = None) -> Any:
    """dx = dy - exp(y) * sum(dy) along ``dim``, from log_softmax's output y and its gradient dy."""
    return _softmax(SoftmaxAlgorithm.LOG, dim, (y, dy), handle)


def _softmax(algo: SoftmaxAlgorithm, dim: int, arrays: tuple[Any, ...], handle: Handle | None) -> Any:
    names = ("y", "dy") if len(arrays) == 2 else ("x",)
    inputs = [wrap(name, array) for name, array in zip(names, arrays)]
    shape = tuple(np.shape(as_native(arrays[0])))
    ndim, dim = inputs[0].desc.ndim, check_int("dim", dim)
    if not -ndim <= dim < ndim:  # (the message is formatted only on failure: this runs for every call)
        raise BadParam(f"dim={dim} must be between {-ndim} and {ndim - 1} for {names[0]} of {ndim} dims")
    output = empty_like(inputs[-1])
    problem = softmax_problem(
        algo,
        (dim % ndim,),
        [f"{b.name}" for b in inputs] + ["out"],
        [b.desc for b in inputs] + [output.desc],
        backward=len(arrays) == 2,
    )
    dispatch(handle_for(inputs[0], handle), "softmax", problem, inputs, output)
    return to_caller_kind(shaped(output.view, shape), arrays[0])
