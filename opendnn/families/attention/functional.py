"""The Pythonic attention: ``scaled_dot_product_attention`` with torch's semantics and its backward.

Arrays are (batch, heads, sequence, head dim) with any strides; NumPy in, NumPy out, torch in,
torch out. ``attn_mask`` broadcasts to (batch, heads, queries, keys) as torch's does: a boolean
mask takes part where True, a float mask is added to the scores. A row with no key taking part
gives 0, as torch's SDPA on the CPU gives (see ``opendnn.families.attention.problem`` for the
formulas). Keyword-only extensions: a sliding ``window`` (left, right), the causal ``alignment``,
per-batch sequence lengths, ``softcap``, the dropout ``seed`` and ``offset`` (the same seed gives
the same mask, in the backward too), the saved statistics, and the handle.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from opendnn.core.arrays import Bound, allocate, as_native, empty_like, wrap
from opendnn.core.caller_arrays import shaped, to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status
from opendnn.core.handle import Handle, MathType
from opendnn.families.attention.problem import (
    AttentionDescriptor,
    AttentionTensors,
    DiagonalAlignment,
    attention_problem,
)

NAMES = (
    ("params", "attention parameters"),
    ("q", "query"),
    ("k", "key"),
    ("v", "value"),
    ("o", "out"),
    ("stats", "stats"),
    ("bias", "attn_mask"),
    ("seq_lens_q", "seq_lens_q"),
    ("seq_lens_kv", "seq_lens_kv"),
    ("do", "grad_out"),
    ("dq", "grad_query"),
    ("dk", "grad_key"),
    ("dv", "grad_value"),
    ("dbias", "grad_attn_mask"),
)


@caller_dtypes
def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    window: tuple[int | None, int | None] | None = None,
    alignment: DiagonalAlignment | str = DiagonalAlignment.TOP_LEFT,
    seq_lens_q: Any = None,
    seq_lens_kv: Any = None,
    softcap: float | None = None,
    seed: int = 0,
    offset: int = 0,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """``softmax(query @ key^T * scale + attn_mask) @ value`` as torch.nn.functional.scaled_dot_product_attention.

    Args:
        window: (left, right): query i sees keys i - left to i + right (None: unbounded).
        alignment: where the causal diagonal and the window sit when the lengths differ: TOP_LEFT
            (torch's is_causal) or BOTTOM_RIGHT (the last query on the last key).
        seq_lens_q, seq_lens_kv: integer arrays of one length per batch: positions past them are padding.
        softcap: scores become softcap * tanh(scores / softcap) before the mask is added.
        seed, offset: the dropout mask's Philox key and first counter.
        return_stats: also return the rows' logsumexp (batch, heads, queries), float32 (float64 for
            float64 data): what the backward needs.

    Returns:
        out (batch, heads, queries, value head dim), or (out, stats) with return_stats.

    Raises:
        BadParam: dims that disagree, key/value heads fewer than query heads without enable_gqa,
            a bad parameter (naming it).
        NotSupported: a non-float dtype, a head dim outside 8..256.
    """
    params = _params(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _inputs(query, key, value, attn_mask, seq_lens_q, seq_lens_kv, enable_gqa)
    q = inputs.q
    batch, heads, seq_q, _ = q.desc.dims
    out = empty_like(q, dims=(batch, heads, seq_q, inputs.v.desc.dims[3]))
    stats = None
    if return_stats:
        stats_dtype = DataType.DOUBLE if q.desc.dtype is DataType.DOUBLE else DataType.FLOAT
        stats = allocate(q, TensorDescriptor(stats_dtype, (batch, heads, seq_q)), "stats")
    _run(
        params,
        AttentionTensors(inputs.q, inputs.k, inputs.v, out, stats, inputs.bias, inputs.seq_lens_q, inputs.seq_lens_kv),
        handle,
    )
    result = to_caller_kind(out.view, query)
    return (result, to_caller_kind(stats.view, query)) if stats is not None else result


@caller_dtypes
def scaled_dot_product_attention_backward(
    grad_out: Any,
    query: Any,
    key: Any,
    value: Any,
    out: Any,
    stats: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    window: tuple[int | None, int | None] | None = None,
    alignment: DiagonalAlignment | str = DiagonalAlignment.TOP_LEFT,
    seq_lens_q: Any = None,
    seq_lens_kv: Any = None,
    softcap: float | None = None,
    seed: int = 0,
    offset: int = 0,
    mask_grad: bool = False,
    handle: Handle | None = None,
) -> tuple[Any, ...]:
    """The gradients of ``scaled_dot_product_attention`` with respect to query, key and value, from
    the forward's ``out`` and ``stats`` (``return_stats=True``) and the gradient ``grad_out``, under
    the forward's own arguments (the same seed regenerates the same dropout mask).

    Returns:
        (grad_query, grad_key, grad_value), each of its input's dims and dimension order; with
        mask_grad, also the gradient of a float attn_mask, of the mask's own dims.

    Raises:
        BadParam: as scaled_dot_product_attention; out, stats or grad_out of other dims; mask_grad
            without a float attn_mask.
        NotSupported: as scaled_dot_product_attention.
    """
    params = _params(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _inputs(query, key, value, attn_mask, seq_lens_q, seq_lens_kv, enable_gqa)
    if mask_grad and inputs.bias is None:
        raise BadParam("mask_grad=True needs a float attn_mask, got attn_mask=None", Status.BAD_PARAM_NULL_POINTER)
    dq, dk, dv = (empty_like(bound) for bound in (inputs.q, inputs.k, inputs.v))
    dbias = empty_like(inputs.bias) if mask_grad and inputs.bias is not None else None
    tensors = AttentionTensors(
        inputs.q,
        inputs.k,
        inputs.v,
        wrap("out", out),
        wrap("stats", stats),
        inputs.bias,
        inputs.seq_lens_q,
        inputs.seq_lens_kv,
        wrap("grad_out", grad_out),
        dq,
        dk,
        dv,
        dbias,
    )
    _run(params, tensors, handle)
    results = [dq.view, dk.view, dv.view]
    if dbias is not None:  # of the mask's own dims, without the leading ones it was given
        results.append(shaped(dbias.view, tuple(as_native(attn_mask).shape)))
    return tuple(to_caller_kind(view, query) for view in results)


def _params(
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    window: tuple[int | None, int | None] | None,
    alignment: DiagonalAlignment | str,
    softcap: float | None,
    seed: int,
    offset: int,
) -> AttentionDescriptor:
    return AttentionDescriptor(
        scale=scale,
        causal=bool(is_causal),
        alignment=alignment,
        window=(None, None) if window is None else window,
        softcap=softcap,
        dropout_p=dropout_p,
        seed=seed,
        offset=offset,
    )


class _Inputs(NamedTuple):
    q: Bound
    k: Bound
    v: Bound
    bias: Bound | None
    seq_lens_q: Bound | None
    seq_lens_kv: Bound | None


def _inputs(
    query: Any, key: Any, value: Any, attn_mask: Any, seq_lens_q: Any, seq_lens_kv: Any, enable_gqa: bool
) -> _Inputs:
    """The input arrays bound in the problem's slots; the mask given leading dims up to 4, as torch broadcasts."""
    q, k = wrap("query", query), wrap("key", key)
    if not enable_gqa and q.desc.ndim == k.desc.ndim == 4 and q.desc.dims[1] != k.desc.dims[1]:
        raise BadParam(
            f"key.dims[1]={k.desc.dims[1]} must equal query.dims[1]={q.desc.dims[1]} unless enable_gqa=True",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    bias = None
    if attn_mask is not None:
        bias = wrap("attn_mask", attn_mask)
        if bias.desc.ndim < 4:
            view = bias.view
            bias = wrap("attn_mask", view.reshape((1,) * (4 - bias.desc.ndim) + tuple(view.shape)))
    lens = [
        None if array is None else wrap(name, array)
        for name, array in (("seq_lens_q", seq_lens_q), ("seq_lens_kv", seq_lens_kv))
    ]
    return _Inputs(q, k, wrap("value", value), bias, lens[0], lens[1])


def _run(params: AttentionDescriptor, tensors: AttentionTensors, handle: Handle | None) -> None:
    """Check the call under the functional names and dispatch it on ``handle`` (default: the query's device's)."""
    handle = handle_for(tensors.q, handle)
    descs = {slot: bound.desc for slot, bound in zip(tensors._fields, tensors) if bound is not None}
    problem = attention_problem(params, **descs, names=NAMES, allow_tf32=handle.math_type is MathType.TENSOR_OP)
    dispatch(handle, "attention", problem, tensors)
