"""Attention on the NumPy backend: the reference in the compute dtype (float32, or float64 for
DOUBLE data). The backward recomputes the forward from q, k and v; it reads neither o nor stats."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, bf16_to_float32, float32_to_bf16
from opendnn.core.dtypes import DataType
from opendnn.families.attention.problem import AttentionProblem, AttentionTensors, reference_backward, reference_forward


def supports(problem: AttentionProblem) -> str | None:
    return None


def workspace_size(problem: AttentionProblem) -> int:
    """Bytes of workspace ``run`` needs: none."""
    return 0


def run(problem: AttentionProblem, t: AttentionTensors) -> None:
    compute = problem.compute_dtype.to_numpy()
    q, k, v = (_values(bound, compute) for bound in (t.q, t.k, t.v))
    bias = None if t.bias is None else _values(t.bias, np.dtype(np.bool_) if problem.mask_bias else compute)
    lens = [None if bound is None else _values(bound, np.dtype(np.int64)) for bound in (t.seq_lens_q, t.seq_lens_kv)]
    per_head = [None if bound is None else _values(bound, compute) for bound in (t.alibi_slopes, t.sinks)]
    if not problem.backward:
        o, lse = reference_forward(problem.params, q, k, v, bias, *lens, *per_head)
        _store(t.o, o)
        if t.stats is not None:
            _store(t.stats, lse)
        return
    assert t.do is not None and t.dq is not None and t.dk is not None and t.dv is not None  # the problem's rules
    gradients = reference_backward(problem.params, q, k, v, _values(t.do, compute), bias, *lens, *per_head)
    for bound, result in zip((t.dq, t.dk, t.dv, t.dbias, t.dsinks), gradients):
        if bound is not None and result is not None:
            _store(bound, result)


def _values(bound: Bound, dtype: np.dtype) -> np.ndarray:
    """The bound array's values as a new NumPy array of ``dtype`` (a CPU tensor or a NumPy array)."""
    view: Any = bound.view
    if not isinstance(view, np.ndarray):
        return (view.float() if bound.desc.dtype is DataType.BFLOAT16 else view).numpy().astype(dtype)
    return (bf16_to_float32(view) if bound.desc.dtype is DataType.BFLOAT16 else view).astype(dtype)


def _store(bound: Bound, result: np.ndarray) -> None:
    """Write ``result`` into the bound array, converted to its dtype."""
    view: Any = bound.view
    if not isinstance(view, np.ndarray):
        import torch

        view.copy_(torch.from_numpy(np.ascontiguousarray(result)))
    elif bound.desc.dtype is DataType.BFLOAT16:
        np.copyto(view, float32_to_bf16(result))
    else:
        np.copyto(view, result.astype(view.dtype))
