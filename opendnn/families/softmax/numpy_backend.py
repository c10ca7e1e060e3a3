"""Softmax on the NumPy backend: the reference in the compute dtype."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.softmax.problem import SoftmaxProblem, reference_backward, reference_forward


def supports(problem: SoftmaxProblem) -> str | None:
    return None


def run(problem: SoftmaxProblem, inputs: list[Bound], output: Bound) -> None:
    values = [read(bound, problem.compute_dtype) for bound in inputs]
    if problem.backward:
        result = reference_backward(problem.algo, values[0], values[1], problem.axes)
    else:
        result = reference_forward(problem.algo, values[0], problem.axes)
    write(output, result, problem.alpha, problem.beta)
