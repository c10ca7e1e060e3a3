"""Matrix multiplication on the NumPy backend: the reference's ``np.matmul`` (BLAS) and epilogue run in
the compute dtype (float32 for float32, 16-bit and fp8 inputs, float64 for float64), a small product
on one BLAS thread (``core/blas_threads.py``)."""

from __future__ import annotations

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.blas_threads import blas_limit
from opendnn.core.dtypes import DataType
from opendnn.core.reference_io import read, write
from opendnn.families.matmul.problem import MatmulProblem, fp8_to_float64, reference


def supports(problem: MatmulProblem) -> str | None:
    return None


def run(
    problem: MatmulProblem, a: Bound, b: Bound, c: Bound, bias: Bound | None = None, residual: Bound | None = None
) -> None:
    compute = problem.compute_dtype
    with blas_limit(problem.flops // 2):
        result = reference(
            _values(a, compute),
            _values(b, compute),
            bias=None if bias is None else _values(bias, compute),
            bias_axis=problem.bias_axis,
            activation=problem.activation,
            coef=problem.coef,
            residual=None if residual is None else _values(residual, compute),
            scale=problem.scale,
            dtype=compute.to_numpy(),
        )
    write(c, result, problem.alpha, problem.beta)


def _values(bound: Bound, compute: DataType) -> np.ndarray:
    """The tensor's values in the compute dtype (fp8 decoded from its bits)."""
    if not bound.desc.dtype.is_fp8:
        return read(bound, compute)
    view = bound.view
    if isinstance(view, np.ndarray):
        bits = view
    else:
        import torch

        bits = view.view(torch.uint8).numpy()
    return fp8_to_float64(bits, bound.desc.dtype).astype(compute.to_numpy(), copy=False)
