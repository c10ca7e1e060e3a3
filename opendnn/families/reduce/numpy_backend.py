"""Tensor reduction on the NumPy backend: the reference in the compute dtype, no workspace."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.reduce.problem import ReduceProblem, reference


def supports(problem: ReduceProblem) -> str | None:
    return None


def workspace_size(problem: ReduceProblem) -> int:
    """Bytes of workspace ``run`` needs: none."""
    return 0


def run(problem: ReduceProblem, a: Bound, c: Bound, indices: Bound | None, workspace: Bound | None = None) -> None:
    compute = problem.compute_dtype
    values, flat_indices = reference(problem.op, read(a, compute), problem.reduced_axes, problem.propagate_nan)
    write(c, values.astype(compute.to_numpy(), copy=False), problem.alpha, problem.beta)
    if indices is not None and problem.indices is not None and flat_indices is not None:
        write(indices, flat_indices)
