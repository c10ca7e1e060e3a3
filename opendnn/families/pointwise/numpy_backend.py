"""Pointwise operations on the NumPy backend."""

from __future__ import annotations

from collections.abc import Sequence

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.pointwise.problem import PointwiseProblem, reference


def supports(problem: PointwiseProblem) -> str | None:
    return None


def run(problem: PointwiseProblem, inputs: Sequence[Bound], output: Bound) -> None:
    compute = problem.compute_dtype
    values = [
        read(tensor, compute) * scale if scale != 1.0 else read(tensor, compute)
        for tensor, scale in zip(inputs, problem.input_scales)
    ]
    result = reference(problem.mode, values, problem.coef, problem.propagate_nan, problem.torch_rule)
    write(output, result.astype(compute.to_numpy(), copy=False), problem.alpha, problem.beta)
