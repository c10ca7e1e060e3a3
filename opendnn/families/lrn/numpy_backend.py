"""LRN and divisive normalization on the NumPy backend: the references in the compute dtype."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.lrn.problem import (
    LRNProblem,
    divisive_backward_reference,
    divisive_reference,
    lrn_backward_reference,
    lrn_reference,
)


def supports(problem: LRNProblem) -> str | None:
    return None


def run(
    problem: LRNProblem,
    x: Bound,
    y: Bound,
    means: Bound | None = None,
    dy: Bound | None = None,
    dmeans: Bound | None = None,
    temp: Bound | None = None,
    temp2: Bound | None = None,
) -> None:
    """Forward writes y; backward writes dx into ``y`` (and dmeans for divisive normalization)."""
    compute = problem.compute_dtype
    xs = read(x, compute)
    mean_values = read(means, compute) if means is not None else None
    desc = problem.desc
    if not problem.backward:
        result = divisive_reference(xs, mean_values, desc) if problem.divisive else lrn_reference(xs, desc)
        write(y, result, problem.alpha, problem.beta)
        return
    assert dy is not None
    gradients = read(dy, compute)
    if not problem.divisive:
        write(y, lrn_backward_reference(xs, gradients, desc), problem.alpha, problem.beta)
        return
    dx, dmean_values = divisive_backward_reference(xs, mean_values, gradients, desc)
    write(y, dx, problem.alpha, problem.beta)
    if dmeans is not None:
        write(dmeans, dmean_values, problem.alpha, problem.beta)
