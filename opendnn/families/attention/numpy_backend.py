"""Attention on the NumPy backend: the reference in the compute dtype (float32, or float64 for
DOUBLE data). The backward recomputes the forward from q, k and v; it reads neither o nor stats.
Ragged sequences run through ``ragged_reference`` (padded, then packed again); paged K/V is
gathered from its cache into (B, Hkv, Skv, D) first. fp8 data runs ``reference_forward_fp8`` or
``reference_backward_fp8`` in float64, its factors read on the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, bf16_to_float32, float32_to_bf16
from opendnn.core.dtypes import DataType
from opendnn.families.attention.problem import (
    FP8_BACKWARD_SCALES,
    FP8_SCALES,
    AttentionProblem,
    AttentionTensors,
    Fp8BackwardScales,
    Fp8Scales,
    gathered,
    ragged_reference,
    reference_backward,
    reference_backward_fp8,
    reference_forward,
    reference_forward_fp8,
)
from opendnn.families.matmul.problem import float_to_fp8, fp8_to_float64


def supports(problem: AttentionProblem) -> str | None:
    return None


def workspace_size(problem: AttentionProblem) -> int:
    """Bytes of workspace ``run`` needs: none."""
    return 0


def run(problem: AttentionProblem, t: AttentionTensors) -> None:
    if problem.fp8:
        (_run_fp8_backward if problem.backward else _run_fp8)(problem, t)
        return
    compute = problem.compute_dtype.to_numpy()
    q, k, v = (_values(bound, compute) for bound in (t.q, t.k, t.v))
    bias = None if t.bias is None else _values(t.bias, np.dtype(np.bool_) if problem.mask_bias else compute)
    lens = [None if bound is None else _values(bound, np.dtype(np.int64)) for bound in (t.seq_lens_q, t.seq_lens_kv)]
    per_head = [None if bound is None else _values(bound, compute) for bound in (t.alibi_slopes, t.sinks)]
    do = None if t.do is None else _values(t.do, compute)
    results: tuple[np.ndarray | None, ...]
    if t.ragged_offsets_q is not None and t.ragged_offsets_kv is not None:
        offsets_q, offsets_kv = (
            _values(bound, np.dtype(np.int64)) for bound in (t.ragged_offsets_q, t.ragged_offsets_kv)
        )
        slopes, sinks = per_head
        results = ragged_reference(
            problem.params,
            q,
            k,
            v,
            offsets_q,
            offsets_kv,
            problem.max_seqlen_q,
            problem.max_seqlen_kv,
            do,
            slopes,
            sinks,
        )
    else:
        if t.block_table is not None:
            table = _values(t.block_table, np.dtype(np.int64))
            k, v = (gathered(cache, table, lens[1]) for cache in (k, v))
        if do is None:
            results = reference_forward(problem.params, q, k, v, bias, *lens, *per_head)
        else:
            results = reference_backward(problem.params, q, k, v, do, bias, *lens, *per_head)
    outputs = (t.o, t.stats) if do is None else (t.dq, t.dk, t.dv, t.dbias, t.dsinks)
    for bound, result in zip(outputs, results):
        if bound is not None and result is not None:
            _store(bound, result)


def _run_fp8(problem: AttentionProblem, t: AttentionTensors) -> None:
    """The fp8 forward: o, the stats and the maxima given."""
    float64 = np.dtype(np.float64)
    q, k, v = (_values(bound, float64) for bound in (t.q, t.k, t.v))
    scales = Fp8Scales(*(float(_values(getattr(t, slot), float64).item()) for slot in FP8_SCALES))
    lens = [None if bound is None else _values(bound, np.dtype(np.int64)) for bound in (t.seq_lens_q, t.seq_lens_kv)]
    result = reference_forward_fp8(problem.params, q, k, v, scales, problem.q.dtype, problem.o.dtype, *lens)
    for bound, values in ((t.o, result.o), (t.stats, result.lse), (t.amax_s, result.amax_s), (t.amax_o, result.amax_o)):
        if bound is not None:
            _store(bound, np.asarray(values, np.float64))


def _run_fp8_backward(problem: AttentionProblem, t: AttentionTensors) -> None:
    """The fp8 backward: dq, dk, dv and the maxima given."""
    float64 = np.dtype(np.float64)
    assert t.do is not None and t.dq is not None and t.dk is not None and t.dv is not None
    q, k, v, o, do = (_values(bound, float64) for bound in (t.q, t.k, t.v, t.o, t.do))
    scales = Fp8BackwardScales(*(float(_values(getattr(t, slot), float64).item()) for slot in FP8_BACKWARD_SCALES))
    lens = [None if bound is None else _values(bound, np.dtype(np.int64)) for bound in (t.seq_lens_q, t.seq_lens_kv)]
    dtypes = (problem.q.dtype, t.do.desc.dtype, t.dq.desc.dtype, t.dk.desc.dtype, t.dv.desc.dtype)
    result = reference_backward_fp8(problem.params, q, k, v, o, do, scales, dtypes, *lens)
    outputs = (t.dq, t.dk, t.dv, t.amax_dq, t.amax_dk, t.amax_dv, t.amax_dp)
    for bound, values in zip(outputs, result):
        if bound is not None:
            _store(bound, np.asarray(values, np.float64))


def _values(bound: Bound, dtype: np.dtype) -> np.ndarray:
    """The bound array's values as a new NumPy array of ``dtype`` (a CPU tensor or a NumPy array;
    fp8 NumPy arrays hold the bit patterns)."""
    view: Any = bound.view
    if bound.desc.dtype.is_fp8:
        return (
            fp8_to_float64(view, bound.desc.dtype) if isinstance(view, np.ndarray) else view.double().numpy()
        ).astype(dtype)
    if not isinstance(view, np.ndarray):
        return (view.float() if bound.desc.dtype is DataType.BFLOAT16 else view).numpy().astype(dtype)
    return (bf16_to_float32(view) if view.dtype == np.uint16 else view).astype(dtype)  # bfloat16 bits


def _store(bound: Bound, result: np.ndarray) -> None:
    """Write ``result`` into the bound array, converted to its dtype."""
    view: Any = bound.view
    if not isinstance(view, np.ndarray):
        import torch

        view.copy_(torch.from_numpy(np.ascontiguousarray(result)))
    elif bound.desc.dtype.is_fp8:
        np.copyto(view, float_to_fp8(result, bound.desc.dtype))
    elif view.dtype == np.uint16:  # bfloat16 bits (without ml_dtypes)
        np.copyto(view, float32_to_bf16(result))
    else:
        np.copyto(view, result.astype(view.dtype))
