"""Pooling on the NumPy backend: the float64-capable reference in the compute dtype."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.pooling.problem import PoolingProblem, reference_backward, reference_forward, reference_indices


def supports(problem: PoolingProblem) -> str | None:
    return None


def run(
    problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None, indices: Bound | None = None
) -> None:
    compute = problem.compute_dtype
    geometry = (problem.window, problem.padding, problem.stride)
    if dx is None or dy is None:
        values = read(x, compute)
        options = (problem.propagate_nan, problem.ceil_mode, problem.dilation)
        write(y, reference_forward(problem.mode, values, *geometry, *options), problem.alpha, problem.beta)
        if indices is not None:
            write(indices, reference_indices(values, *geometry, *options))
        return
    result = reference_backward(
        problem.mode,
        read(x, compute),
        read(y, compute),
        read(dy, compute),
        *geometry,
        problem.ceil_mode,
        problem.dilation,
    )
    write(dx, result, problem.alpha, problem.beta)
