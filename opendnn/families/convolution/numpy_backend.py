"""Convolution on the NumPy backend: the float64-capable reference in the compute dtype, every
algorithm that applies computed the same way, no workspace."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.convolution.problem import ConvolutionDirection, ConvolutionProblem, algorithm_refusal, reference


def supports(problem: ConvolutionProblem) -> str | None:
    return algorithm_refusal(problem)


def workspace_size(problem: ConvolutionProblem) -> int:
    """Bytes of workspace ``run`` needs: none, whatever the algorithm."""
    return 0


def run(problem: ConvolutionProblem, x: Bound, w: Bound, y: Bound, bias: Bound | None = None,
        z: Bound | None = None, workspace: Bound | None = None) -> None:
    compute = problem.compute_type
    direction = problem.direction
    inputs = {
        "x": read(x, compute) if direction is not ConvolutionDirection.BACKWARD_DATA else None,
        "w": read(w, compute) if direction is not ConvolutionDirection.BACKWARD_FILTER else None,
        "y": read(y, compute) if direction is not ConvolutionDirection.FORWARD else None,
        "bias": read(bias, compute) if bias is not None else None,
        "z": read(z, compute) if z is not None else None,  # read before y is written: z may be y
    }
    result = reference(problem, **inputs).astype(compute.to_numpy(), copy=False)
    output = {ConvolutionDirection.FORWARD: y, ConvolutionDirection.BACKWARD_DATA: x,
              ConvolutionDirection.BACKWARD_FILTER: w}[direction]
    write(output, result, 1.0, problem.beta)
