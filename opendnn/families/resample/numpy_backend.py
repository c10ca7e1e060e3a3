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
    write(out, resampled(problem, read(source, problem.compute_dtype)), problem.alpha, problem.beta)
