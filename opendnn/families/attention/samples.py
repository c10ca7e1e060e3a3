"""Samples of attention_forward and attention_backward: the masks (causal top-left and bottom-right,
sliding window, sequence lengths, a boolean mask), a float bias and its gradient, softcap, dropout,
GQA and MQA, padded head dims, every dtype and layout; packed (ragged) sequences forward and
backward, and paged K/V forward; the fp8 forward (e4m3 and e5m2 data, bfloat16 or float16 o) with
its per-tensor factors, its stats and its maxima amax_s and amax_o.

A sample's shape is (B, Hq, Hkv, Sq, Skv, D, Dv); its output concatenates every output of the call
(o and the stats forward; dq, dk, dv and dbias backward), each divided by the norm of its reference,
so that each counts alike in the relative error. The backward runs from the reference forward's o
(rounded to the dtype) and stats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported
from opendnn.core.handle import Handle
from opendnn.core.samples import ErrorSample, Sample, Tensors, checked, descriptor, values
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.descriptor import AttentionDescriptor
from opendnn.families.attention.functional import scaled_dot_product_attention, scaled_dot_product_attention_backward
from opendnn.families.attention.functional_packed import (
    scaled_dot_product_attention_paged,
    scaled_dot_product_attention_varlen,
    scaled_dot_product_attention_varlen_backward,
)
from opendnn.families.attention.problem import FP8_AMAX, FP8_SCALES, Fp8Scales, reference_forward_fp8
from opendnn.families.attention.reference import gathered, ragged_reference, reference_backward, reference_forward

# variant -> (the descriptor's fields, bias: None, "float" (1, Hq, Sq, Skv) or "mask" (B, 1, Sq, Skv), lengths)
VARIANTS: dict[str, tuple[dict[str, Any], str | None, bool]] = {
    "plain": ({}, None, False),
    "causal": (dict(causal=True), None, False),
    "causal_bottom_right/lengths": (dict(causal=True, alignment="bottom_right"), None, True),
    "window/softcap/mask": (dict(window=(24, 8), softcap=20.0), "mask", False),
    "bias/dropout": (dict(dropout_p=0.1, seed=1234, offset=77), "float", False),
}


def _lengths(t: Tensors, batch: int, longest: int) -> np.ndarray:
    """Sequence lengths from half the longest to the longest (the last one)."""
    lens = t.rng.integers(longest // 2, longest + 1, batch)
    lens[-1] = longest
    return lens


def _operands(sample: Sample, t: Tensors) -> tuple[AttentionDescriptor, dict[str, Any], dict[str, Any]]:
    """(the descriptor, {slot: tensor}, {slot: float64 NumPy values}) of the inputs q, k, v, bias, lengths."""
    fields, bias_kind, lengths = VARIANTS[sample.variant]
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = sample.shape
    tensors = {
        "q": t.input((batch, heads_q, seq_q, dim), sample.dtype, sample.layout),
        "k": t.input((batch, heads_kv, seq_kv, dim), sample.dtype, sample.layout),
        "v": t.input((batch, heads_kv, seq_kv, value_dim), sample.dtype, sample.layout),
    }
    if bias_kind == "float":
        tensors["bias"] = t.input((1, heads_q, seq_q, seq_kv), sample.dtype, "packed")
    elif bias_kind == "mask":
        tensors["bias"] = t.array(t.rng.uniform(size=(batch, 1, seq_q, seq_kv)) < 0.8, DataType.BOOLEAN)
    if lengths:
        for side, seq in (("q", seq_q), ("kv", seq_kv)):
            tensors[f"seq_lens_{side}"] = t.array(_lengths(t, batch, seq), DataType.INT32)
    values = {
        slot: t.values(tensor).astype(np.int32)
        if slot.startswith("seq")
        else (t.values(tensor) != 0 if slot == "bias" and bias_kind == "mask" else t.values(tensor))
        for slot, tensor in tensors.items()
    }
    return AttentionDescriptor(**fields), tensors, values


def _optional(tensors: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the optional inputs present."""
    return {
        key: value
        for slot in ("bias", "seq_lens_q", "seq_lens_kv")
        if slot in tensors
        for key, value in ((f"{slot}_desc", descriptor(tensors[slot])), (slot, tensors[slot]))
    }


def _stats_type(sample: Sample) -> DataType:
    return DataType.DOUBLE if sample.dtype is DataType.DOUBLE else DataType.FLOAT


def _joined(pairs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The (actual, expected) pairs flattened and concatenated, each divided by its expected norm."""
    scales = [max(float(np.linalg.norm(expected[np.isfinite(expected)])), 1e-30) for _, expected in pairs]
    return (
        np.concatenate([actual.ravel() / s for (actual, _), s in zip(pairs, scales)]),
        np.concatenate([expected.ravel() / s for (_, expected), s in zip(pairs, scales)]),
    )


def run_attention_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    params, tensors, values = _operands(sample, t)
    batch, heads_q, _, seq_q, _, _, value_dim = sample.shape
    o = t.output((batch, heads_q, seq_q, value_dim), sample.dtype, sample.layout, None)
    stats = t.output((batch, heads_q, seq_q), _stats_type(sample), "packed", None)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    attention_forward(
        handle,
        params,
        descriptor(q),
        q,
        descriptor(k),
        k,
        descriptor(v),
        v,
        descriptor(o),
        o,
        stats_desc=descriptor(stats),
        stats=stats,
        **_optional(tensors),
    )
    expected_o, expected_stats = reference_forward(
        params,
        values["q"],
        values["k"],
        values["v"],
        values.get("bias"),
        values.get("seq_lens_q"),
        values.get("seq_lens_kv"),
    )
    return _joined([checked(t, o, expected_o), (t.values(stats), expected_stats)])


def fp8_factors(dtype: DataType) -> Fp8Scales:
    """Per-tensor factors for fp8 samples, none of them 1: P scaled to the type's largest value
    (448 for e4m3, 57344 for e5m2) and back."""
    largest = 448.0 if dtype is DataType.FP8_E4M3 else 57344.0
    return Fp8Scales(0.5, 0.75, 1.25, 1.0 / largest, largest, 2.0)


def run_attention_forward_fp8(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """The fp8 forward into o of sample.out_dtype: o, stats, amax_s and amax_o against the float64 reference."""
    params, tensors, values = _operands(sample, t)
    batch, heads_q, _, seq_q, _, _, value_dim = sample.shape
    assert sample.out_dtype is not None
    o = t.output((batch, heads_q, seq_q, value_dim), sample.out_dtype, sample.layout, None)
    stats = t.output((batch, heads_q, seq_q), DataType.FLOAT, "packed", None)
    factors = fp8_factors(sample.dtype)
    scalars = {slot: t.array(np.array([value]), DataType.FLOAT) for slot, value in zip(FP8_SCALES, factors)}
    scalars |= {slot: t.output((1,), DataType.FLOAT, "packed", None) for slot in FP8_AMAX}
    q, k, v = (tensors[slot] for slot in ("q", "k", "v"))
    keywords: dict[str, Any] = {  # the factors' and maxima's descriptors and arrays, by parameter name
        key: value
        for slot, array in scalars.items()
        for key, value in ((f"{slot}_desc", descriptor(array)), (slot, array))
    }
    attention_forward(
        handle,
        params,
        descriptor(q),
        q,
        descriptor(k),
        k,
        descriptor(v),
        v,
        descriptor(o),
        o,
        stats_desc=descriptor(stats),
        stats=stats,
        **_optional(tensors),
        **keywords,
    )
    lens = (values.get("seq_lens_q"), values.get("seq_lens_kv"))
    inputs = (values["q"], values["k"], values["v"])
    expected = reference_forward_fp8(params, *inputs, factors, sample.dtype, sample.out_dtype, *lens)
    return _joined(
        [
            checked(t, o, expected.o),
            (t.values(stats), expected.lse),
            (t.values(scalars["amax_s"]), np.array([expected.amax_s])),
            (t.values(scalars["amax_o"]), np.array([expected.amax_o])),
        ]
    )


def run_attention_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """o and stats from the float64 reference forward, dO random; dbias for a float bias."""
    params, tensors, values = _operands(sample, t)
    inputs = (values["q"], values["k"], values["v"])
    optional = (values.get("bias"), values.get("seq_lens_q"), values.get("seq_lens_kv"))
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    o = t.input((*q.shape[:3], v.shape[3]), sample.dtype, sample.layout)
    expected_o, expected_stats = reference_forward(params, *inputs, *optional)
    t.fill(o, expected_o)
    stats = t.array(expected_stats, _stats_type(sample))
    do = t.input(tuple(o.shape), sample.dtype, sample.layout)
    grads = [t.output(tuple(x.shape), sample.dtype, sample.layout, None) for x in (q, k, v)]
    extra = _optional(tensors)
    if VARIANTS[sample.variant][1] == "float":
        extra["dbias"] = dbias = t.output(tuple(tensors["bias"].shape), sample.dtype, "packed", None)
        extra["dbias_desc"] = descriptor(dbias)
        grads.append(dbias)
    attention_backward(
        handle,
        params,
        descriptor(q),
        q,
        descriptor(k),
        k,
        descriptor(v),
        v,
        descriptor(o),
        o,
        descriptor(do),
        do,
        descriptor(stats),
        stats,
        *(item for grad in grads[:3] for item in (descriptor(grad), grad)),
        **extra,
    )
    expected = reference_backward(params, *inputs, t.values(do), *optional)
    return _joined([checked(t, grad, reference) for grad, reference in zip(grads, expected) if reference is not None])


# packed sequences and paged K/V: variant -> the descriptor's fields
LAYOUT_VARIANTS: dict[str, dict[str, Any]] = {
    "ragged": {},
    "ragged/causal": dict(causal=True, alignment="bottom_right"),
    "paged/causal": dict(causal=True, alignment="bottom_right"),
}
BLOCK_SIZE = 16  # rows of a paged K/V block


def _ragged(sample: Sample, t: Tensors) -> tuple[AttentionDescriptor, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(descriptor, {slot: tensor}, {slot: values}, the call's ragged keywords): q, k, v packed as
    (1, H, tokens, D) with every sequence's offsets."""
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = sample.shape
    offsets = {
        side: np.concatenate([[0], np.cumsum(_lengths(t, batch, seq))]) for side, seq in (("q", seq_q), ("kv", seq_kv))
    }
    total_q, total_kv = int(offsets["q"][-1]), int(offsets["kv"][-1])
    tensors = {
        "q": t.input((1, heads_q, total_q, dim), sample.dtype, sample.layout),
        "k": t.input((1, heads_kv, total_kv, dim), sample.dtype, sample.layout),
        "v": t.input((1, heads_kv, total_kv, value_dim), sample.dtype, sample.layout),
    }
    keywords: dict[str, Any] = dict(max_seqlen_q=seq_q, max_seqlen_kv=seq_kv)
    for side in ("q", "kv"):
        array = t.array(offsets[side], DataType.INT32)
        keywords[f"ragged_offsets_{side}_desc"], keywords[f"ragged_offsets_{side}"] = descriptor(array), array
    values = {slot: t.values(tensor) for slot, tensor in tensors.items()}
    values |= {f"offsets_{side}": offsets[side] for side in offsets}
    return AttentionDescriptor(**LAYOUT_VARIANTS[sample.variant]), tensors, values, keywords


def run_ragged_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    params, tensors, values, keywords = _ragged(sample, t)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    o = t.output((*q.shape[:3], v.shape[3]), sample.dtype, sample.layout, None)
    stats = t.output(tuple(q.shape[:3]), _stats_type(sample), "packed", None)
    pairs = [item for x in (q, k, v, o) for item in (descriptor(x), x)]
    attention_forward(handle, params, *pairs, stats_desc=descriptor(stats), stats=stats, **keywords)
    _, _, _, seq_q, seq_kv, _, _ = sample.shape
    expected_o, expected_stats = ragged_reference(
        params, values["q"], values["k"], values["v"], values["offsets_q"], values["offsets_kv"], seq_q, seq_kv
    )
    assert expected_o is not None and expected_stats is not None
    return _joined([checked(t, o, expected_o), (t.values(stats), expected_stats)])


def run_ragged_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """o and stats from the float64 reference forward, dO random."""
    params, tensors, values, keywords = _ragged(sample, t)
    _, _, _, seq_q, seq_kv, _, _ = sample.shape
    inputs = (values["q"], values["k"], values["v"], values["offsets_q"], values["offsets_kv"], seq_q, seq_kv)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    expected_o, expected_stats = ragged_reference(params, *inputs)
    assert expected_o is not None and expected_stats is not None
    o = t.input((*q.shape[:3], v.shape[3]), sample.dtype, sample.layout)
    t.fill(o, expected_o)
    stats = t.array(expected_stats, _stats_type(sample))
    do = t.input(tuple(o.shape), sample.dtype, sample.layout)
    grads = [t.output(tuple(x.shape), sample.dtype, sample.layout, None) for x in (q, k, v)]
    pairs = [item for x in (q, k, v, o, do, stats, *grads) for item in (descriptor(x), x)]
    attention_backward(handle, params, *pairs, **keywords)
    expected = ragged_reference(params, *inputs, t.values(do))
    return _joined(
        [checked(t, grad, reference) for grad, reference in zip(grads, expected[:3]) if reference is not None]
    )


def run_paged_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """K/V in blocks of BLOCK_SIZE rows in shuffled order, read through the block table."""
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = sample.shape
    per_sequence = -(-seq_kv // BLOCK_SIZE)
    table = t.rng.permutation(batch * per_sequence).reshape(batch, per_sequence)
    lens = _lengths(t, batch, seq_kv)
    q = t.input((batch, heads_q, seq_q, dim), sample.dtype, sample.layout)
    k_cache = t.input((batch * per_sequence, heads_kv, BLOCK_SIZE, dim), sample.dtype, "packed")
    v_cache = t.input((batch * per_sequence, heads_kv, BLOCK_SIZE, value_dim), sample.dtype, "packed")
    table_array, lens_array = t.array(table, DataType.INT32), t.array(lens, DataType.INT32)
    o = t.output((batch, heads_q, seq_q, value_dim), sample.dtype, sample.layout, None)
    stats = t.output((batch, heads_q, seq_q), _stats_type(sample), "packed", None)
    params = AttentionDescriptor(**LAYOUT_VARIANTS[sample.variant])
    pairs = [item for x in (q, k_cache, v_cache, o) for item in (descriptor(x), x)]
    attention_forward(
        handle,
        params,
        *pairs,
        stats_desc=descriptor(stats),
        stats=stats,
        seq_lens_kv_desc=descriptor(lens_array),
        seq_lens_kv=lens_array,
        block_table_desc=descriptor(table_array),
        block_table=table_array,
    )
    keys, values = (gathered(t.values(cache), table, lens) for cache in (k_cache, v_cache))
    expected_o, expected_stats = reference_forward(params, t.values(q), keys, values, None, None, lens)
    return _joined([checked(t, o, expected_o), (t.values(stats), expected_stats)])


# (B, Hq, Hkv, Sq, Skv, D, Dv): GQA with Sq != Skv and a padded value dim; MQA with head dim 8
SHAPES = {
    "small": ((2, 4, 2, 20, 27, 16, 24), (1, 2, 1, 33, 16, 8, 8)),
    "large": ((2, 8, 2, 1024, 1024, 128, 128), (1, 4, 1, 2048, 1536, 64, 64)),
}


def samples(size: str = "small") -> Iterator[Sample]:
    """Every variant x direction on the first shape in float32, float16 and bfloat16; at "small" the
    layouts and float64 on a few, the second shape on every variant."""
    first, second = SHAPES[size]
    half = (DataType.HALF, DataType.BFLOAT16)
    runners = (("attention_forward", run_attention_forward), ("attention_backward", run_attention_backward))
    for op, runner in runners:
        for variant in VARIANTS:
            for dtype in (DataType.FLOAT, *half):
                yield Sample(op, variant, dtype, first, runner=runner)
            yield Sample(op, variant, DataType.FLOAT, second, layout="permuted", runner=runner)
        yield Sample(op, "causal_bottom_right/lengths", DataType.FLOAT, first, layout="subregion", runner=runner)
        if size == "small":
            yield Sample(op, "bias/dropout", DataType.DOUBLE, second, runner=runner)
    for op, runner in (("attention_forward", run_ragged_forward), ("attention_backward", run_ragged_backward)):
        for variant in ("ragged", "ragged/causal"):
            for dtype in (DataType.FLOAT, *half):
                yield Sample(op, variant, dtype, first, runner=runner)
        yield Sample(op, "ragged/causal", DataType.FLOAT, second, layout="permuted", runner=runner)
    for dtype in (DataType.FLOAT, *half):
        yield Sample("attention_forward", "paged/causal", dtype, first, runner=run_paged_forward)
    fp8 = (
        ("plain", DataType.FP8_E4M3, DataType.BFLOAT16, "packed"),
        ("causal", DataType.FP8_E5M2, DataType.HALF, "permuted"),
        ("causal_bottom_right/lengths", DataType.FP8_E4M3, DataType.BFLOAT16, "subregion"),
    )
    for variant, dtype, out_dtype, layout in fp8:
        yield Sample(
            "attention_forward", variant, dtype, first, layout, out_dtype=out_dtype, runner=run_attention_forward_fp8
        )


def _dense_operands(**changes: Any) -> dict[str, Any]:
    """A good call of scaled_dot_product_attention on torch's batch-less 3-D form (2 heads, 4 queries,
    5 keys, head dim 16), with ``changes``."""
    return dict(query=values(2, 4, 16), key=values(2, 5, 16), value=values(2, 5, 16)) | changes


def _dense_backward_operands(**changes: Any) -> dict[str, Any]:
    """A good call of scaled_dot_product_attention_backward on ``_dense_operands``, with ``changes``."""
    return _dense_operands(grad_out=values(2, 4, 16), out=values(2, 4, 16), stats=values(2, 4)) | changes


def _batched(*leading: int, heads: int | None = 2, key_heads: int = 2, head_dim: int = 16) -> dict[str, Any]:
    """query (*leading, heads, 4, head_dim), key and value (*leading, key_heads, 5, head_dim); with
    heads None, torch's 2-D form: query (4, head_dim), key and value (5, head_dim)."""
    query_heads, kv_heads = ((), ()) if heads is None else ((heads,), (key_heads,))
    keys = values(*leading, *kv_heads, 5, head_dim)
    return dict(query=values(*leading, *query_heads, 4, head_dim), key=keys, value=keys)


def _varlen_operands(**changes: Any) -> dict[str, Any]:
    """A good call of scaled_dot_product_attention_varlen (queries 4 and 2, keys 2 and 3), with ``changes``."""
    offsets = dict(cu_seqlens_q=np.array([0, 4, 6], np.int32), cu_seqlens_k=np.array([0, 2, 5], np.int32))
    packed = dict(query=values(6, 2, 16), key=values(5, 2, 16), value=values(5, 2, 16))
    return packed | offsets | dict(max_seqlen_q=4, max_seqlen_k=3) | changes


def _varlen_backward_operands(**changes: Any) -> dict[str, Any]:
    """A good call of scaled_dot_product_attention_varlen_backward on ``_varlen_operands``, with ``changes``."""
    return _varlen_operands(grad_out=values(6, 2, 16), out=values(6, 2, 16), stats=values(2, 6)) | changes


def _paged_operands(**changes: Any) -> dict[str, Any]:
    """A good call of scaled_dot_product_attention_paged (2 sequences of 16 and 9 keys in 4 blocks of 8
    rows), with ``changes``."""
    table, lens = np.array([[0, 1], [2, 3]], np.int32), np.array([16, 9], np.int32)
    caches = dict(k_cache=values(4, 8, 2, 16), v_cache=values(4, 8, 2, 16))
    return dict(query=values(2, 2, 3, 16), **caches, block_table=table, seq_lens_kv=lens) | changes


def _changed(
    good: Callable[..., dict[str, Any]], changes: Callable[[], dict[str, Any]]
) -> Callable[[], dict[str, Any]]:
    """The arguments of a good call with ``changes``, made when called (an error sample's arguments)."""
    return lambda: good(**changes())


# rows of (name, the changes to a good call, error, message)
ErrorTable = tuple[tuple[str, Callable[[], dict[str, Any]], type[Exception], str], ...]


# (name, the changes to a good call, error, message) of the dense calls, 2-D and 3-D (torch's
# batch-less forms), 4-D and 5-D: each names the caller's own parameter and its shape as given (axes from the
# end, as torch's (..., heads, sequence, head dim)), never the (batch, heads, sequence, head dim)
# form the problem takes
DENSE_ERRORS: ErrorTable = (
    ("3-D head dim below the kernels' range", lambda: _batched(head_dim=4), NotSupported,
     "query.shape[-1]=4 must be between 8 and 256 (the head dims the kernels support)"),
    ("4-D head dim below the kernels' range", lambda: _batched(1, head_dim=4), NotSupported,
     "query.shape[-1]=4 must be between 8 and 256"),
    ("3-D value head dim above the kernels' range", lambda: dict(value=values(2, 5, 264)), NotSupported,
     "value.shape[-1]=264 must be between 8 and 256"),
    ("3-D key head dim not the query's", lambda: dict(key=values(2, 5, 8)), BadParam,
     "key.shape[-1]=8 must equal query.shape[-1]=16"),
    ("3-D value length not the key's", lambda: dict(value=values(2, 6, 16)), BadParam,
     "value.shape[-2]=6 must equal key.shape[-2]=5"),
    ("3-D query heads not a multiple of key heads", lambda: _batched(heads=3) | dict(enable_gqa=True), BadParam,
     "query.shape[-3]=3 must be a multiple of key.shape[-3]=2 (query heads per key/value head)"),
    ("5-D query heads not a multiple of key heads",
     lambda: _batched(2, 3, heads=3, key_heads=2) | dict(enable_gqa=True), BadParam,
     "query.shape[-3]=3 must be a multiple of key.shape[-3]=2"),
    ("3-D value heads not the key's", lambda: _batched(heads=4) | dict(value=values(3, 5, 16), enable_gqa=True),
     BadParam, "value.shape[-3]=3 must equal key.shape[-3]=2"),
    ("heads differ without enable_gqa", lambda: _batched(heads=4), BadParam,
     "key.shape[-3]=2 must equal query.shape[-3]=4 unless enable_gqa=True"),
    ("query of 1 dim", lambda: dict(query=values(16)), BadParam,
     "query.ndim=1 must be at least 2 (..., sequence, head dim)"),
    ("2-D head dim below the kernels' range", lambda: _batched(heads=None, head_dim=4), NotSupported,
     "query.shape[-1]=4 must be between 8 and 256"),
    ("key of 1 dim", lambda: dict(key=values(16)), BadParam,
     "key.ndim=1 must be at least 2 (..., sequence, head dim)"),
    ("2-D mask of other keys", lambda: _batched(heads=None) | dict(attn_mask=values(4, 6)), BadParam,
     "attn_mask.shape[-1]=6 must be 5 or 1 (it broadcasts to [4, 5])"),
    ("2-D query, 3-D mask", lambda: _batched(heads=None) | dict(attn_mask=values(1, 4, 5)), BadParam,
     "attn_mask.ndim=3 must be at most query.ndim=2"),
    ("2-D sinks of 2 heads", lambda: _batched(heads=None) | dict(sinks=values(2)), BadParam,
     "sinks.shape=[2] must be [1]"),
    ("4-D key batch not the query's", lambda: _batched(2) | dict(key=values(3, 2, 5, 16)), BadParam,
     "key.shape[-4]=3 must be 2 or 1 (the batch dims of query.shape=[2, 2, 4, 16], key.shape=[3, 2, 5, 16], "
     "value.shape=[2, 2, 5, 16] broadcast)"),
    ("5-D value batch dims not the query's", lambda: _batched(2, 3) | dict(value=values(3, 2, 2, 5, 16)), BadParam,
     "value.shape[-5]=3 must be 2 or 1 (the batch dims of"),
    ("key of another dtype", lambda: dict(key=values(2, 5, 16, dtype=np.float64)), BadParam,
     "key.dtype=float64 must equal query.dtype=float32"),
    ("3-D empty query", lambda: dict(query=np.ones((2, 0, 16), np.float32)), BadParam,
     "query.shape=(2, 0, 16) must have no empty dimension"),
    ("3-D mask of other keys", lambda: dict(attn_mask=values(2, 4, 6)), BadParam,
     "attn_mask.shape[-1]=6 must be 5 or 1 (it broadcasts to [2, 4, 5])"),
    ("2-D mask of other queries", lambda: dict(attn_mask=values(3, 5)), BadParam,
     "attn_mask.shape[-2]=3 must be 4 or 1 (it broadcasts to [2, 4, 5])"),
    ("3-D mask of other heads", lambda: dict(attn_mask=values(3, 1, 5)), BadParam,
     "attn_mask.shape[-3]=3 must be 2 or 1 (it broadcasts to [2, 4, 5])"),
    ("mask of more dims than the query", lambda: dict(attn_mask=values(1, 2, 4, 5)), BadParam,
     "attn_mask.ndim=4 must be at most query.ndim=3"),
    ("4-D mask batch not the query's", lambda: _batched(2) | dict(attn_mask=values(4, 1, 4, 5)), BadParam,
     "attn_mask.shape[-4]=4 must be 2 or 1 (attn_mask.shape=[4, 1, 4, 5] broadcasts over query's leading dims [2])"),
    ("5-D mask batch dims not the query's", lambda: _batched(2, 3) | dict(attn_mask=values(2, 4, 1, 4, 5)), BadParam,
     "attn_mask.shape[-4]=4 must be 3 or 1 (attn_mask.shape=[2, 4, 1, 4, 5] broadcasts over query's leading dims "
     "[2, 3])"),
    ("mask of integers", lambda: dict(attn_mask=np.ones((4, 5), np.int32)), NotSupported,
     "attn_mask.dtype=int32 must equal query.dtype=float32 (added to the scores) or be bool"),
    ("dropout probability of 1.5", lambda: dict(dropout_p=1.5), BadParam,
     "dropout_p=1.5 must be at least 0 and below 1"),
    ("dropout probability of NaN", lambda: dict(dropout_p=float("nan")), BadParam,
     "dropout_p=nan must be at least 0 and below 1"),
    ("negative dropout probability", lambda: dict(dropout_p=-0.25), BadParam,
     "dropout_p=-0.25 must be at least 0 and below 1"),
    ("scale of NaN", lambda: dict(scale=float("nan")), BadParam, "scale=nan must be a finite number or None"),
    ("scale of inf", lambda: dict(scale=float("inf")), BadParam, "scale=inf must be a finite number or None"),
    ("3-D seq_lens_q of another batch", lambda: dict(seq_lens_q=np.array([4, 4], np.int32)), BadParam,
     "seq_lens_q.shape=[2] must be [1] (one length per batch of query)"),
    ("3-D alibi_slopes of other heads", lambda: dict(alibi_slopes=values(3)), BadParam,
     "alibi_slopes.shape=[3] must be [2] or [1, 2] (one per query head, or per batch and query head of query)"),
    ("5-D alibi_slopes of other batch dims", lambda: _batched(2, 3) | dict(alibi_slopes=values(3, 2, 2)), BadParam,
     "alibi_slopes.shape=[3, 2, 2] must have query's leading dims [2, 3] and 1 more"),
    ("sinks of other heads", lambda: dict(sinks=values(3)), BadParam,
     "sinks.shape=[3] must be [2] (one per query head of query)"),
)  # fmt: skip
DENSE_BACKWARD_ERRORS: ErrorTable = (
    ("out of another value head dim", lambda: dict(out=values(2, 4, 8)), BadParam,
     "out.shape=[2, 4, 8] must be [2, 4, 16] (query's shape with value's head dim, as the forward gives it; "
     "query.shape=[2, 4, 16])"),
    ("grad_out of 4 dims for a 3-D query", lambda: dict(grad_out=values(1, 2, 4, 16)), BadParam,
     "grad_out.shape=[1, 2, 4, 16] must be [2, 4, 16]"),
    ("stats of other queries", lambda: dict(stats=values(2, 5)), BadParam,
     "stats.shape=[2, 5] must be [2, 4] (query's shape less its head dim, as the forward gives it"),
    ("5-D stats of other batch dims",
     lambda: _batched(2, 3) | dict(grad_out=values(2, 3, 2, 4, 16), out=values(2, 3, 2, 4, 16),
                                   stats=values(3, 2, 2, 4)),
     BadParam, "stats.shape=[3, 2, 2, 4] must be [2, 3, 2, 4]"),
    ("2-D stats of other queries",
     lambda: _batched(heads=None) | dict(grad_out=values(4, 16), out=values(4, 16), stats=values(5)), BadParam,
     "stats.shape=[5] must be [4] (query's shape less its head dim, as the forward gives it; query.shape=[4, 16])"),
    ("stats of float16", lambda: dict(stats=values(2, 4, dtype=np.float16)), NotSupported,
     "stats.dtype=float16 must be float32 for query.dtype=float32"),
    ("mask_grad without a mask", lambda: dict(mask_grad=True), BadParam,
     "mask_grad=True needs a float attn_mask, got attn_mask=None"),
    ("mask_grad of a boolean mask", lambda: dict(mask_grad=True, attn_mask=np.ones((4, 5), bool)), NotSupported,
     "mask_grad=True needs a float attn_mask: attn_mask.dtype=bool is a mask and has no gradient"),
)  # fmt: skip
# (name, the changes to a good call, error, message) of the packed and paged calls: each names the
# caller's own parameter and axis, never the (1, heads, tokens, head dim) form the problem takes
VARLEN_ERRORS: ErrorTable = (
    ("packed query of 2 dims", lambda: dict(query=values(6, 32)), BadParam,
     "query.ndim=2 must be 3 (total tokens, heads, head dim)"),
    ("packed query heads not a multiple of key heads", lambda: dict(query=values(6, 3, 16)), BadParam,
     "query.shape[1]=3 must be a multiple of key.shape[1]=2 (query heads per key/value head)"),
    ("packed key head dim not the query's", lambda: dict(key=values(5, 2, 8)), BadParam,
     "key.shape[2]=8 must equal query.shape[2]=16"),
    ("packed value tokens not the key's", lambda: dict(value=values(4, 2, 16)), BadParam,
     "value.shape[0]=4 must equal key.shape[0]=5"),
    ("packed key of another dtype", lambda: dict(key=values(5, 2, 16, dtype=np.float64)), BadParam,
     "key.dtype=float64 must equal query.dtype=float32"),
    ("packed head dim below the kernels' range",
     lambda: dict(query=values(6, 2, 4), key=values(5, 2, 4), value=values(5, 2, 4)), NotSupported,
     "query.shape[2]=4 must be between 8 and 256"),
    ("no query tokens", lambda: dict(query=np.ones((0, 2, 16), np.float32)), BadParam,
     "query.shape=(0, 2, 16) must have no empty dimension"),
    ("cu_seqlens_q starting below 0", lambda: dict(cu_seqlens_q=np.array([-1, 4, 6], np.int32)), BadParam,
     "cu_seqlens_q[0]=-1 must be at least 0"),
    ("cu_seqlens_q decreasing",
     lambda: dict(cu_seqlens_q=np.array([0, 4, 3, 6], np.int32), cu_seqlens_k=np.array([0, 2, 4, 5], np.int32)),
     BadParam, "cu_seqlens_q[2]=3 must be at least cu_seqlens_q[1]=4 (offsets never decrease)"),
    ("cu_seqlens_q past the query tokens", lambda: dict(cu_seqlens_q=np.array([0, 4, 7], np.int32)), BadParam,
     "cu_seqlens_q[2]=7 must equal the packed tokens, query.shape[0]=6"),
    ("cu_seqlens_k short of the key tokens", lambda: dict(cu_seqlens_k=np.array([0, 2, 4], np.int32)), BadParam,
     "cu_seqlens_k[2]=4 must equal the packed tokens, key.shape[0]=5"),
    ("cu_seqlens_k of another batch", lambda: dict(cu_seqlens_k=np.array([0, 5], np.int32)), BadParam,
     "cu_seqlens_k.shape=[2] must equal cu_seqlens_q.shape=[3] (as many sequences of keys as of queries)"),
    ("cu_seqlens_q of 2 dims", lambda: dict(cu_seqlens_q=np.array([[0, 4, 6]], np.int32)), BadParam,
     "cu_seqlens_q.shape=[1, 3] must be [batch + 1], one dim of at least 2"),
    ("cu_seqlens_q of floats", lambda: dict(cu_seqlens_q=np.array([0.0, 4.0, 6.0])), NotSupported,
     "cu_seqlens_q.dtype=float64 must be int32 or int64"),
    ("cu_seqlens_k of int16", lambda: dict(cu_seqlens_k=np.array([0, 2, 5], np.int16)), BadParam,
     "cu_seqlens_k.dtype=int16 must be one of"),
    ("max_seqlen_q below a sequence", lambda: dict(max_seqlen_q=3), BadParam,
     "max_seqlen_q=3 must be at least 4, the length of sequence 0 in cu_seqlens_q"),
    ("max_seqlen_k of 0", lambda: dict(max_seqlen_k=0), BadParam, "max_seqlen_k=0 must be an int of at least 1"),
    ("packed sinks of other heads", lambda: dict(sinks=values(3)), BadParam,
     "sinks.shape=[3] must be [2] (one per query head of query)"),
)  # fmt: skip
VARLEN_BACKWARD_ERRORS: ErrorTable = (
    ("packed grad_out tokens not the query's", lambda: dict(grad_out=values(5, 2, 16)), BadParam,
     "grad_out.shape[0]=5 must equal query.shape[0]=6"),
    ("packed out of 2 dims", lambda: dict(out=values(6, 32)), BadParam,
     "out.ndim=2 must be 3 (total tokens, heads, value head dim)"),
    ("packed stats tokens first", lambda: dict(stats=values(6, 2)), BadParam,
     "stats.shape=[6, 2] must be [2, 6] (heads, sequence of query)"),
    ("packed stats of float16", lambda: dict(stats=values(2, 6, dtype=np.float16)), NotSupported,
     "stats.dtype=float16 must be float32 for query.dtype=float32"),
)  # fmt: skip
PAGED_ERRORS: ErrorTable = (
    ("k_cache of 3 dims", lambda: dict(k_cache=values(4, 8, 32)), BadParam,
     "k_cache.ndim=3 must be 4 (num blocks, block size, heads, head dim)"),
    ("paged query heads not a multiple of the cache's", lambda: dict(query=values(2, 3, 3, 16)), BadParam,
     "query.shape[1]=3 must be a multiple of k_cache.shape[2]=2 (query heads per key/value head)"),
    ("k_cache head dim not the query's", lambda: dict(k_cache=values(4, 8, 2, 8)), BadParam,
     "k_cache.shape[3]=8 must equal query.shape[3]=16"),
    ("v_cache block size not k_cache's", lambda: dict(v_cache=values(4, 4, 2, 16)), BadParam,
     "v_cache.shape[1]=4 must equal k_cache.shape[1]=8"),
    ("k_cache of another dtype", lambda: dict(k_cache=values(4, 8, 2, 16, dtype=np.float64)), BadParam,
     "k_cache.dtype=float64 must equal query.dtype=float32"),
    ("block_table rows not the batch", lambda: dict(block_table=np.array([[0, 1]], np.int32)), BadParam,
     "block_table.shape=[1, 2] must be [2, blocks per sequence] (one row per batch, query.shape[0]=2)"),
    ("block_table of int64", lambda: dict(block_table=np.array([[0, 1], [2, 3]], np.int64)), NotSupported,
     "block_table.dtype=int64 must be int32"),
    ("block number past the cache", lambda: dict(block_table=np.array([[0, 1], [2, 4]], np.int32)), BadParam,
     "block_table[1, 1]=4 must be a block of k_cache, from 0 to k_cache.shape[0] - 1 = 3 (sequence 1 needs 2 blocks)"),
    ("negative block number", lambda: dict(block_table=np.array([[-1, 1], [2, 3]], np.int32)), BadParam,
     "block_table[0, 0]=-1 must be a block of k_cache"),
    ("seq_lens_kv of another batch", lambda: dict(seq_lens_kv=np.array([16], np.int32)), BadParam,
     "seq_lens_kv.shape=[1] must be [2] (one length per batch of query)"),
)  # fmt: skip


def error_samples() -> list[ErrorSample]:
    """Bad calls of scaled_dot_product_attention, its backward, and its packed and paged forms, and their messages."""
    return [
        ErrorSample(name, call, _changed(good, changes), error, message)
        for call, good, table in (
            (scaled_dot_product_attention, _dense_operands, DENSE_ERRORS),
            (scaled_dot_product_attention_backward, _dense_backward_operands, DENSE_BACKWARD_ERRORS),
            (scaled_dot_product_attention_varlen, _varlen_operands, VARLEN_ERRORS),
            (scaled_dot_product_attention_varlen_backward, _varlen_backward_operands, VARLEN_BACKWARD_ERRORS),
            (scaled_dot_product_attention_paged, _paged_operands, PAGED_ERRORS),
        )
        for name, changes, error, message in table
    ]
