"""The Pythonic attention's packed forms, beside the dense call of ``functional``.

``scaled_dot_product_attention_varlen`` (and its backward) takes FlashAttention's packed form:
(total tokens, heads, head dim) arrays with cumulative sequence offsets ``cu_seqlens_q`` /
``cu_seqlens_k``; ``scaled_dot_product_attention_paged`` reads K and V from a paged cache
(num blocks, block size, heads, head dim) through a block table, forward only. A separate
function rather than a keyword of the dense call: its key and value are caches of another layout
than the query's, with no dims in common with torch's signature.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import as_native, descriptor_of, empty_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status
from opendnn.core.handle import Handle
from opendnn.families.attention.descriptor import DiagonalAlignment
from opendnn.families.attention.functional import CALLER_NAMES, CallInputs, checked_dispatch, descriptor_of_call
from opendnn.families.attention.problem import AttentionTensors, SlotNames

# the packed calls' arrays: (tokens, heads, head dim) as the problem's (1, heads, tokens, head dim),
# stats (heads, tokens) as (1, heads, tokens)
TOKENS_FIRST = (None, 1, 0, 2)
VARLEN_NAMES = SlotNames(
    CALLER_NAMES,
    "shape",
    (*((slot, TOKENS_FIRST) for slot in ("q", "k", "v", "o", "do", "dq", "dk", "dv")), ("stats", (None, 0, 1))),
)
# the paged call's caches: (blocks, block size, heads, head dim) as the problem's (blocks, heads, block size, head dim)
PAGED_NAMES = SlotNames(
    tuple((slot, {"k": "k_cache", "v": "v_cache"}.get(slot, name)) for slot, name in CALLER_NAMES),
    "shape",
    (("k", (0, 2, 1, 3)), ("v", (0, 2, 1, 3))),
)


@caller_dtypes
def scaled_dot_product_attention_varlen(
    query: Any,
    key: Any,
    value: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: DiagonalAlignment | str = DiagonalAlignment.BOTTOM_RIGHT,
    softcap: float | None = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    seed: int = 0,
    offset: int = 0,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """Attention over packed sequences of different lengths (FlashAttention's varlen form): sequence
    b is rows ``cu_seqlens_q[b] .. cu_seqlens_q[b + 1]`` of query and out and rows ``cu_seqlens_k[b]
    .. cu_seqlens_k[b + 1]`` of key and value, attending only within itself.

    Args:
        query: (total_q, heads, head dim); key: (total_k, key/value heads, head dim); value:
            (total_k, key/value heads, value head dim). Query heads a multiple of key/value heads (GQA).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 or int64 offsets: 0 or more, never decreasing,
            the last one the total tokens. Checked before any kernel runs where they are on the
            host; on a device they are not read by the host (no synchronisation), and the kernels
            clamp each sequence into the total tokens: wrong ones give wrong rows, never a read or
            write outside the tensors.
        max_seqlen_q, max_seqlen_k: at least the longest sequence of each side: the kernels plan their
            tiles and the backward's workspace for it.
        alignment: BOTTOM_RIGHT by default, FlashAttention's causal for sequences of unequal lengths
            (the last query on the last key of its own sequence).
        alibi_slopes: (heads,) or (B, heads). Other arguments: as scaled_dot_product_attention.

    Returns:
        out (total_q, heads, value head dim), or (out, stats) with return_stats: stats the rows'
        logsumexp, (heads, total_q), float32 (float64 for float64 data), what the backward needs.

    Raises:
        BadParam: dims that disagree; offsets of another dtype; offsets on the host that start
            below 0, decrease or end elsewhere than the total tokens, or a max_seqlen shorter than
            one of their sequences.
        NotSupported: as scaled_dot_product_attention.
    """
    params = descriptor_of_call(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _packed_inputs(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
    q = inputs.q
    _, heads, total_q, _ = q.desc.dims
    out = empty_like(q, q.desc.dtype, (1, heads, total_q, inputs.v.desc.dims[3]), (0, 2, 1, 3))
    stats = None
    if return_stats:
        stats_dtype = DataType.DOUBLE if q.desc.dtype is DataType.DOUBLE else DataType.FLOAT
        stats = empty_like(q, stats_dtype, (1, heads, total_q), (0, 1, 2))
    tensors = AttentionTensors(
        q,
        inputs.k,
        inputs.v,
        out,
        stats,
        alibi_slopes=inputs.alibi_slopes,
        sinks=inputs.sinks,
        ragged_offsets_q=inputs.seq_lens_q,
        ragged_offsets_kv=inputs.seq_lens_kv,
    )
    checked_dispatch(params, tensors, handle, VARLEN_NAMES, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_k)
    result = to_caller_kind(_tokens_first(out.view), query)
    return (result, to_caller_kind(stats.view[0], query)) if stats is not None else result


@caller_dtypes
def scaled_dot_product_attention_varlen_backward(
    grad_out: Any,
    query: Any,
    key: Any,
    value: Any,
    out: Any,
    stats: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: DiagonalAlignment | str = DiagonalAlignment.BOTTOM_RIGHT,
    softcap: float | None = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    seed: int = 0,
    offset: int = 0,
    handle: Handle | None = None,
) -> tuple[Any, ...]:
    """The gradients of ``scaled_dot_product_attention_varlen`` from its ``out`` and ``stats``
    (``return_stats=True``) and ``grad_out`` (total_q, heads, value head dim), under the forward's
    own arguments.

    Returns:
        (grad_query, grad_key, grad_value), packed as their inputs; with sinks, last, the sinks' gradient.

    Raises:
        BadParam, NotSupported: as scaled_dot_product_attention_varlen; out, stats or grad_out of other dims.
    """
    params = descriptor_of_call(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _packed_inputs(query, key, value, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks)
    grads = [
        empty_like(bound, bound.desc.dtype, bound.desc.dims, (0, 2, 1, 3)) for bound in (inputs.q, inputs.k, inputs.v)
    ]
    dsinks = None if inputs.sinks is None else empty_like(inputs.sinks)
    tensors = AttentionTensors(
        inputs.q,
        inputs.k,
        inputs.v,
        wrap("out", _heads_first(_native("out", out, PACKED_OUT))),
        wrap("stats", _native("stats", stats, PACKED_STATS)[None]),
        do=wrap("grad_out", _heads_first(_native("grad_out", grad_out, PACKED_OUT))),
        dq=grads[0],
        dk=grads[1],
        dv=grads[2],
        alibi_slopes=inputs.alibi_slopes,
        sinks=inputs.sinks,
        dsinks=dsinks,
        ragged_offsets_q=inputs.seq_lens_q,
        ragged_offsets_kv=inputs.seq_lens_kv,
    )
    checked_dispatch(params, tensors, handle, VARLEN_NAMES, max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_k)
    results = [_tokens_first(grad.view) for grad in grads]
    if dsinks is not None:
        results.append(dsinks.view)
    return tuple(to_caller_kind(view, query) for view in results)


@caller_dtypes
def scaled_dot_product_attention_paged(
    query: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    seq_lens_kv: Any = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    alignment: DiagonalAlignment | str = DiagonalAlignment.BOTTOM_RIGHT,
    seq_lens_q: Any = None,
    softcap: float | None = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    return_stats: bool = False,
    handle: Handle | None = None,
) -> Any:
    """The attention forward over a paged K/V cache (inference; vLLM's and FlashAttention's
    ``block_table``): key j of batch b is row ``j % block_size`` of block ``block_table[b, j //
    block_size]`` of the caches.

    Args:
        query: (B, heads, queries, head dim), as scaled_dot_product_attention's.
        k_cache, v_cache: (num blocks, block size, key/value heads, head dim): query heads a
            multiple of key/value heads (GQA).
        block_table: (B, blocks per sequence) int32 block numbers; the entries past a sequence's
            length are not read. Checked on the host before any kernel runs.
        seq_lens_kv: (B,) keys of each sequence (default: every block of its row full).
        alignment: BOTTOM_RIGHT by default: the queries are the last ones of their sequences.
        Other arguments: as scaled_dot_product_attention.

    Returns:
        out (B, heads, queries, value head dim), or (out, stats) with return_stats.

    Raises:
        BadParam: dims that disagree, a needed block number outside the caches.
        NotSupported: as scaled_dot_product_attention. There is no backward through paged K/V.
    """
    params = descriptor_of_call(0.0, is_causal, scale, window, alignment, softcap, 0, 0)
    q = wrap("query", _native("query", query, ("batch", "heads", "queries", "head dim")))
    caches = [
        wrap(name, _heads_first(_native(name, array, ("num blocks", "block size", "heads", "head dim")), 1))
        for name, array in (("k_cache", k_cache), ("v_cache", v_cache))
    ]
    batch, heads, seq_q, _ = q.desc.dims
    out = empty_like(q, q.desc.dtype, (batch, heads, seq_q, caches[1].desc.dims[3]))
    stats = None
    if return_stats:
        stats = empty_like(
            q, DataType.DOUBLE if q.desc.dtype is DataType.DOUBLE else DataType.FLOAT, (batch, heads, seq_q), (0, 1, 2)
        )
    optional = {
        slot: None if array is None else wrap(name, array)
        for slot, name, array in (
            ("seq_lens_q", "seq_lens_q", seq_lens_q),
            ("seq_lens_kv", "seq_lens_kv", seq_lens_kv),
            ("alibi_slopes", "alibi_slopes", alibi_slopes),
            ("sinks", "sinks", sinks),
            ("block_table", "block_table", block_table),
        )
    }
    tensors = AttentionTensors(q, caches[0], caches[1], out, stats, **optional)
    checked_dispatch(params, tensors, handle, PAGED_NAMES)
    result = to_caller_kind(out.view, query)
    return (result, to_caller_kind(stats.view, query)) if stats is not None else result


# the dims of the packed calls' arrays, as their errors name them
PACKED_INPUT = ("total tokens", "heads", "head dim")
PACKED_OUT = ("total tokens", "heads", "value head dim")
PACKED_STATS = ("heads", "total tokens")


def _native(name: str, array: Any, dims: tuple[str, ...]) -> Any:
    """The caller's ``array`` as its native array, refused unless it has one axis per entry of ``dims``,
    and described as the caller holds it (an empty axis, a dtype opendnn has not, a negative stride are
    named in the caller's axes, before the problem reads it in its own order)."""
    native = as_native(array, name)
    if native.ndim != len(dims):
        raise BadParam(
            f"{name}.ndim={native.ndim} must be {len(dims)} ({', '.join(dims)})", Status.BAD_PARAM_SHAPE_MISMATCH
        )
    descriptor_of(native, name)
    return native


def _heads_first(native: Any, tokens: int = 0) -> Any:
    """A (tokens, heads, D) array as the (1, heads, tokens, D) view the problem takes; with
    ``tokens=1``, a (blocks, rows, heads, D) cache as (blocks, heads, rows, D)."""
    if tokens == 1:
        return np.swapaxes(native, 1, 2) if isinstance(native, np.ndarray) else native.transpose(1, 2)
    return np.swapaxes(native, 0, 1)[None] if isinstance(native, np.ndarray) else native.transpose(0, 1)[None]


def _tokens_first(view: Any) -> Any:
    """The inverse of ``_heads_first``: (1, heads, tokens, D) as (tokens, heads, D)."""
    return np.swapaxes(view[0], 0, 1) if isinstance(view, np.ndarray) else view[0].transpose(0, 1)


def _packed_inputs(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, alibi_slopes: Any, sinks: Any
) -> CallInputs:
    """The packed (tokens, heads, D) arrays as (1, heads, tokens, D) bound views, the offsets in the
    lengths' places."""
    bounds = {
        name: wrap(name, _heads_first(_native(name, array, PACKED_INPUT)))
        for name, array in (("query", query), ("key", key), ("value", value))
    }
    offsets_q, offsets_kv, slopes, sink_logits = (
        None if array is None else wrap(name, array)
        for name, array in (
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("alibi_slopes", alibi_slopes),
            ("sinks", sinks),
        )
    )
    q, k, v = bounds["query"], bounds["key"], bounds["value"]
    own = tuple(as_native(array) for array in (query, key, value))
    shape = tuple(own[0].shape)
    return CallInputs(q, k, v, None, offsets_q, offsets_kv, slopes, sink_logits, (), shape, VARLEN_NAMES, own)
