"""Resampling on the NumPy backend: the reference in the compute dtype, each spatial dim contracted
with its interpolation matrix (``problem.resampled``)."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.resample.problem import ResampleProblem, resampled


def supports(problem: ResampleProblem) -> str | None:
    return None


def run(problem: ResampleProblem, source: Bound, out: Bound) -> None:
    """Forward: x -> y; backward: dy -> dx."""
    sizes = (problem.input_dims if problem.backward else problem.output_dims)[2:]
    values = read(source, problem.compute_dtype)
    result = resampled(
        problem.mode, problem.align_corners, problem.scales, values, sizes, problem.compute_dtype, problem.backward
    )
    write(out, result, problem.alpha, problem.beta)
