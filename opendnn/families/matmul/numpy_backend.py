"""Matrix multiplication on the NumPy backend: the float64 reference, cast to the compute dtype."""

from __future__ import annotations

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.dtypes import DataType
from opendnn.core.reference_io import read, write
from opendnn.families.matmul.problem import MatmulProblem, fp8_to_float64, reference


def supports(problem: MatmulProblem) -> str | None:
    return None


def run(
    problem: MatmulProblem, a: Bound, b: Bound, c: Bound, bias: Bound | None = None, residual: Bound | None = None
) -> None:
    result = reference(
        _values(a),
        _values(b),
        bias=None if bias is None else _values(bias),
        bias_axis=problem.bias_axis,
        activation=problem.activation,
        coef=problem.coef,
        residual=None if residual is None else _values(residual),
        scale=problem.scale,
    )
    write(c, result.astype(problem.compute_dtype.to_numpy(), copy=False), problem.alpha, problem.beta)


def _values(bound: Bound) -> np.ndarray:
    """The tensor's values in float64 (fp8 decoded from its bits)."""
    if not bound.desc.dtype.is_fp8:
        return read(bound, DataType.DOUBLE)
    view = bound.view
    if isinstance(view, np.ndarray):
        bits = view
    else:
        import torch

        bits = view.view(torch.uint8).numpy()
    return fp8_to_float64(bits, bound.desc.dtype)
