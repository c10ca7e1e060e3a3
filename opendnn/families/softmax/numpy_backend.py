"""Softmax on the NumPy backend: the reference's formulas in the compute dtype (float32, float64 for
float64), each step in place on the freshly read arrays (no new array of x's size but the log
form's exp and the backward's ``dy * y``)."""

from __future__ import annotations

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read_copy, write
from opendnn.families.softmax.problem import SoftmaxAlgorithm, SoftmaxProblem


def supports(problem: SoftmaxProblem) -> str | None:
    return None


def run(problem: SoftmaxProblem, inputs: list[Bound], output: Bound) -> None:
    values = [read_copy(bound, problem.compute_dtype) for bound in inputs]  # overwritten
    with np.errstate(all="ignore"):  # overflow, inf - inf and 0/0 give the IEEE results on purpose
        if problem.backward:
            result = backward(problem.algo, values[0], values[1], problem.axes)
        else:
            result = forward(problem.algo, values[0], problem.axes)
    write(output, result, problem.alpha, problem.beta)


def forward(algo: SoftmaxAlgorithm, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``reference_forward``, overwriting x."""
    if algo is not SoftmaxAlgorithm.FAST:
        x -= x.max(axis=axes, keepdims=True)
    if algo is SoftmaxAlgorithm.LOG:
        x -= np.log(np.exp(x).sum(axis=axes, keepdims=True))
        return x
    np.exp(x, out=x)
    x /= x.sum(axis=axes, keepdims=True)
    return x


def backward(algo: SoftmaxAlgorithm, y: np.ndarray, dy: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``reference_backward``, overwriting y and dy."""
    if algo is SoftmaxAlgorithm.LOG:  # dy - exp(y) * sum(dy)
        total = dy.sum(axis=axes, keepdims=True)
        np.exp(y, out=y)
        y *= total
        dy -= y
        return dy
    dy -= (dy * y).sum(axis=axes, keepdims=True)
    dy *= y
    return dy
