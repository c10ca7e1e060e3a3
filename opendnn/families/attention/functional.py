"""The Pythonic attention: ``scaled_dot_product_attention`` with torch's semantics and its backward.

Arrays are (..., heads, sequence, head dim) with any strides, as torch's: the leading dims are
batch dims (merged into one, without a copy where their strides allow), a 3-D (N, L, E) array
is N independent attentions and a 2-D (L, E) array one attention; key and value have the query's
rank. NumPy in, NumPy out, torch in, torch out. ``attn_mask`` broadcasts to
(..., heads, queries, keys) as torch's does: a boolean mask takes part where True, a float mask is
added to the scores. A row with no key taking part gives 0, as torch's SDPA on the CPU gives (see
``opendnn.families.attention.reference`` for the formulas). Keyword-only extensions: a sliding
``window`` (left, right), the causal ``alignment``, per-batch sequence lengths, ``softcap``, ALiBi
``alibi_slopes`` and attention ``sinks``, the dropout ``seed`` and ``offset`` (the same seed gives
the same mask, in the backward too), the saved statistics, and the handle.

The packed forms (varlen, paged) are in ``functional_packed``; they share ``checked_dispatch`` and
``descriptor_of_call`` with the dense call.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from opendnn.core.arrays import Bound, allocate, as_native, descriptor_of, empty_like, keyed_bound, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status
from opendnn.core.handle import Handle, MathType
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.attention.descriptor import AttentionDescriptor, DiagonalAlignment
from opendnn.families.attention.problem import (
    FP8_AMAX,
    FP8_BACKWARD_AMAX,
    FP8_BACKWARD_SCALES,
    FP8_SCALES,
    AttentionProblem,
    AttentionTensors,
    SlotNames,
    attention_problem,
    check_layout_values,
    one_or,
)

CALLER_NAMES = (
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
    ("alibi_slopes", "alibi_slopes"),
    ("sinks", "sinks"),
    ("dsinks", "grad_sinks"),
    ("ragged_offsets_q", "cu_seqlens_q"),
    ("ragged_offsets_kv", "cu_seqlens_k"),
    ("block_table", "block_table"),
    *((slot, slot) for slot in dict.fromkeys((*FP8_SCALES, *FP8_AMAX, *FP8_BACKWARD_SCALES, *FP8_BACKWARD_AMAX))),
    ("max_seqlen_q", "max_seqlen_q"),
    ("max_seqlen_kv", "max_seqlen_k"),
)


def _dense_names(leading: int) -> SlotNames:
    """How the dense calls name the problem's dims: by the caller's axis counted from the end
    (``query.shape[-1]`` is the head dim of any batch rank), the batch by its own axis when the
    caller has one batch dim (no axis when it has none, or several merged into one), the heads by
    no axis in a 2-D call (``leading`` -1)."""
    batch = -4 if leading == 1 else None
    heads = None if leading < 0 else -3
    axes = (batch, heads, -2, -1)
    batched = tuple((slot, axes) for slot in ("q", "k", "v", "o", "do", "dq", "dk", "dv", "bias", "dbias"))
    stats = (None if batch is None else -3, None if heads is None else -2, -1)
    return SlotNames(CALLER_NAMES, "shape", (*batched, ("stats", stats)))


# -1: a 2-D (sequence, head dim) query, without heads; 2: two or more batch dims
DENSE_NAMES = {leading: _dense_names(leading) for leading in (-1, 0, 1, 2)}
NAMES = ("query", "key", "value")
SLOT_NAMES = dict(CALLER_NAMES)


class PlanSlots(NamedTuple):
    """The slots a plain call's plan binds to the caller's arrays (in its signature's order, the
    query first) and the slots of the outputs it allocates (a call may leave the last ones out)."""

    given: tuple[str, ...]
    new: tuple[str, ...]


FORWARD_SLOTS = PlanSlots(("q", "k", "v"), ("o", "stats"))
BACKWARD_SLOTS = PlanSlots(("q", "k", "v", "o", "stats", "do"), ("dq", "dk", "dv"))


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
    alibi_slopes: Any = None,
    sinks: Any = None,
    seed: int = 0,
    offset: int = 0,
    return_stats: bool = False,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    descale_s: Any = None,
    scale_s: Any = None,
    scale_o: Any = None,
    out_dtype: Any = None,
    return_amax: bool = False,
    handle: Handle | None = None,
) -> Any:
    """``softmax(query @ key^T * scale + attn_mask) @ value`` as torch.nn.functional.scaled_dot_product_attention.

    Args:
        window: (left, right): query i sees keys i - left to i + right (None: unbounded).
        alignment: where the causal diagonal and the window sit when the lengths differ: TOP_LEFT
            (torch's is_causal) or BOTTOM_RIGHT (the last query on the last key).
        seq_lens_q, seq_lens_kv: integer arrays of one length per batch (the leading dims merged):
            positions past them are padding.
        softcap: scores become softcap * tanh(scores / softcap) before the mask is added.
        alibi_slopes: (heads,) or (..., heads) of the leading dims: ``slope * |j - (i + shift)|`` is
            subtracted from the scores, the distance to the causal diagonal (with BOTTOM_RIGHT,
            FlashAttention's ALiBi).
        sinks: (heads,): one logit per query head that joins each row's softmax denominator.
        seed, offset: the dropout mask's Philox key and first counter.
        return_stats: also return the rows' logsumexp (..., heads, queries), float32 (float64 for
            float64 data): what the backward needs.
        descale_q, descale_k, descale_v, descale_s, scale_s, scale_o: fp8 query, key and value
            (float8_e4m3fn or float8_e5m2, cuDNN's fp8 SDPA forward): the per-tensor factors, each a
            number or a one-element float32 array (None: 1); see
            ``opendnn.families.attention.reference`` for the formula.
        out_dtype: out's dtype (default: the query's); fp8 data may take bfloat16 or float16.
        return_amax: also return amax_s (the largest softmax weight) and amax_o (the largest |out|
            before scale_o), one-element float32 arrays, after the stats: fp8 data only.

    Returns:
        out (..., heads, queries, value head dim); (out, stats) with return_stats; (out, [stats,]
        amax_s, amax_o) with return_amax.

    Raises:
        BadParam: dims that disagree, key/value heads fewer than query heads without enable_gqa,
            a bad parameter (naming it).
        NotSupported: a non-float dtype, a head dim outside 8..256.
    """
    factors = dict(zip(FP8_SCALES, (descale_q, descale_k, descale_v, descale_s, scale_s, scale_o)))
    extras = (attn_mask, seq_lens_q, seq_lens_kv, alibi_slopes, sinks, out_dtype, *factors.values())
    options = (is_causal, scale, enable_gqa, window, alignment, softcap, return_stats)
    arrays = (query, key, value)
    call_key = _plain_signature("scaled_dot_product_attention", arrays, options, extras, (dropout_p, return_amax))
    planned = None if call_key is None else _planned(call_key, handle, arrays, FORWARD_SLOTS)
    if planned is not None:
        return planned if return_stats else planned[0]
    params = descriptor_of_call(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _inputs(query, key, value, attn_mask, seq_lens_q, seq_lens_kv, alibi_slopes, sinks, enable_gqa)
    q = inputs.q
    batch, heads, seq_q, _ = q.desc.dims
    value_dim = inputs.v.desc.dims[3]
    broadcast = inputs.query_shape != tuple(inputs.natives[0].shape)
    out_type = q.desc.dtype if out_dtype is None else DataType.of(out_dtype)
    out = _output(inputs, q, "out", out_type, (batch, heads, seq_q, value_dim), packed=broadcast)
    stats = None
    if return_stats:
        stats_dtype = DataType.DOUBLE if q.desc.dtype is DataType.DOUBLE else DataType.FLOAT
        stats = _output(inputs, q, "stats", stats_dtype, (batch, heads, seq_q), packed=True)
    fp8 = _fp8_arrays(q, factors, FP8_AMAX if return_amax else ())
    tensors = AttentionTensors(
        inputs.q,
        inputs.k,
        inputs.v,
        out.bound,
        None if stats is None else stats.bound,
        inputs.bias,
        inputs.seq_lens_q,
        inputs.seq_lens_kv,
        alibi_slopes=inputs.alibi_slopes,
        sinks=inputs.sinks,
        **fp8,
    )
    handle, problem, implementation = checked_dispatch(params, tensors, handle, inputs.names)
    _keep_plan(handle, call_key, problem, implementation, inputs, tensors, FORWARD_SLOTS)
    results = [out.caller, *([] if stats is None else [stats.caller])]
    results += [fp8[slot].view for slot in FP8_AMAX if slot in fp8]
    return tuple(to_caller_kind(view, query) for view in results) if len(results) > 1 else results[0]


def _plain_signature(
    call: str, arrays: tuple[Any, ...], options: tuple[Any, ...], extras: tuple[Any, ...], flags: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    """The signature of a plain call of ``arrays`` and ``options``: one whose ``extras`` (a mask,
    sequence lengths, ALiBi slopes, sinks, an output dtype, fp8 factors) are all None and whose
    ``flags`` (dropout_p, mask_grad, return_amax) are all 0 or False; None for any other call, which
    takes the full path every time."""
    if any(flags) or any(extra is not None for extra in extras):
        return None
    return signature(call, arrays, options)


def _planned(
    call_key: tuple[Any, ...], handle: Handle | None, arrays: tuple[Any, ...], slots: PlanSlots
) -> tuple[Any, ...] | None:
    """The results of a plain call whose signature has a plan (a tuple), None on its first call:
    ``arrays`` bound to the plan's descriptors in the ``slots.given``, the outputs new, launched
    without the checks the first call made."""
    handle, plan = lookup(handle, call_key)
    if plan is None:
        return None
    device = call_key[1][-1]
    given = zip(slots.given, plan.extra, arrays)
    bounds = {slot: keyed_bound(SLOT_NAMES[slot], desc, array, device) for slot, desc, array in given}
    q = bounds["q"]
    outputs = {slot: allocate(q, desc, SLOT_NAMES[slot]) for slot, desc in zip(slots.new, plan.outputs)}
    execute(handle, plan, AttentionTensors(**bounds, **outputs))
    return tuple(to_caller_kind(output.view, arrays[0]) for output in outputs.values())


def _keep_plan(
    handle: Handle,
    call_key: tuple[Any, ...] | None,
    problem: AttentionProblem,
    implementation: Any,
    inputs: CallInputs,
    tensors: AttentionTensors,
    slots: PlanSlots,
) -> None:
    """Keep the plan of a plain call (``call_key`` not None) that a later call of its signature runs
    as it is: query, key and value 4-dim and bound as given, so the outputs are the caller's as the
    kernels write them (a call of another rank reshapes them; a broadcast input's gradient is summed
    back to its shape), and not fp8 (its factors are arrays made per call)."""
    if call_key is None or len(inputs.query_shape) != 4 or not inputs.as_given or inputs.q.desc.dtype.is_fp8:
        return
    given = tuple(getattr(tensors, slot).desc for slot in slots.given)
    outputs = tuple(bound.desc for bound in (getattr(tensors, slot) for slot in slots.new) if bound is not None)
    keep(handle, call_key, Plan("attention", problem, outputs, implementation, given))


def _fp8_arrays(q: Bound, factors: dict[str, Any], amax: tuple[str, ...]) -> dict[str, Bound]:
    """An fp8 call's slots: each factor given as an array bound as it is, as a number (None: 1,
    when q is fp8) in a new one-element float32 array beside q; new arrays for the ``amax`` slots."""
    arrays: dict[str, Bound] = {}
    for slot, value in factors.items():
        if value is None and not q.desc.dtype.is_fp8:
            continue
        if value is None or isinstance(value, (int, float)):
            new = empty_like(q, DataType.FLOAT, (1,))
            new.view[...] = 1.0 if value is None else value
            arrays[slot] = Bound(slot, new.desc, new.view, new.device)
        else:
            arrays[slot] = wrap(slot, value)
    for slot in amax:
        new = empty_like(q, DataType.FLOAT, (1,))
        arrays[slot] = Bound(slot, new.desc, new.view, new.device)
    return arrays


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
    alibi_slopes: Any = None,
    sinks: Any = None,
    seed: int = 0,
    offset: int = 0,
    mask_grad: bool = False,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    descale_o: Any = None,
    descale_do: Any = None,
    descale_s: Any = None,
    descale_dp: Any = None,
    scale_s: Any = None,
    scale_dq: Any = None,
    scale_dk: Any = None,
    scale_dv: Any = None,
    scale_dp: Any = None,
    grad_dtype: Any = None,
    return_amax: bool = False,
    handle: Handle | None = None,
) -> tuple[Any, ...]:
    """The gradients of ``scaled_dot_product_attention`` with respect to query, key and value, from
    the forward's ``out`` and ``stats`` (``return_stats=True``) and the gradient ``grad_out``, under
    the forward's own arguments (the same seed regenerates the same dropout mask).

    Returns:
        (grad_query, grad_key, grad_value), each of its input's dims; with mask_grad, also the
        gradient of a float attn_mask, of the mask's own dims; with sinks, last, the gradient of
        the sinks. ALiBi slopes are constants: no gradient. With return_amax, last, amax_dq,
        amax_dk, amax_dv and amax_dp.

    fp8 query, key and value (cuDNN's fp8 SDPA backward; grad_out float8_e4m3fn or float8_e5m2):
    ``descale_q`` ... ``scale_dp`` are the per-tensor factors, each a one-element float32 array
    (read on the device) or a number (None: 1); ``grad_dtype`` the gradients' dtype (default: the
    query's; fp8 data may take bfloat16 or float16); ``return_amax`` also returns the largest |dQ|,
    |dK|, |dV| before their scales and the largest |dS| before scale_dp (one-element float32
    arrays).

    Raises:
        BadParam: as scaled_dot_product_attention; out, stats or grad_out of other dims; mask_grad
            without a float attn_mask.
        NotSupported: as scaled_dot_product_attention.
    """
    scales: tuple[Any, ...] = (descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp)
    scales += (scale_s, scale_dq, scale_dk, scale_dv, scale_dp)
    extras = (attn_mask, seq_lens_q, seq_lens_kv, alibi_slopes, sinks, grad_dtype, *scales)
    options = (is_causal, scale, enable_gqa, window, alignment, softcap)
    arrays = (query, key, value, out, stats, grad_out)
    flags = (dropout_p, mask_grad, return_amax)
    call_key = _plain_signature("scaled_dot_product_attention_backward", arrays, options, extras, flags)
    planned = None if call_key is None else _planned(call_key, handle, arrays, BACKWARD_SLOTS)
    if planned is not None:
        return planned
    params = descriptor_of_call(dropout_p, is_causal, scale, window, alignment, softcap, seed, offset)
    inputs = _inputs(query, key, value, attn_mask, seq_lens_q, seq_lens_kv, alibi_slopes, sinks, enable_gqa)
    if mask_grad and inputs.bias is None:
        raise BadParam("mask_grad=True needs a float attn_mask, got attn_mask=None", Status.BAD_PARAM_NULL_POINTER)
    if mask_grad and inputs.bias is not None and inputs.bias.desc.dtype is DataType.BOOLEAN:
        raise NotSupported("mask_grad=True needs a float attn_mask: attn_mask.dtype=bool is a mask and has no gradient")
    # a broadcast input's gradient: packed, then summed back to the input's own shape (_gradient_of)
    grads = [
        _output(
            inputs,
            bound,
            f"grad_{bound.name}",
            bound.desc.dtype if grad_dtype is None else DataType.of(grad_dtype),
            bound.desc.dims,
            packed=0 in bound.desc.strides,
        )
        for bound in (inputs.q, inputs.k, inputs.v)
    ]
    fp8 = _fp8_arrays(inputs.q, dict(zip(FP8_BACKWARD_SCALES, scales)), FP8_BACKWARD_AMAX if return_amax else ())
    dbias = empty_like(inputs.bias) if mask_grad and inputs.bias is not None else None
    dsinks = None if inputs.sinks is None else empty_like(inputs.sinks)
    tensors = AttentionTensors(
        inputs.q,
        inputs.k,
        inputs.v,
        _forwards(inputs, "out", out),
        _forwards(inputs, "stats", stats),
        inputs.bias,
        inputs.seq_lens_q,
        inputs.seq_lens_kv,
        _forwards(inputs, "grad_out", grad_out),
        grads[0].bound,
        grads[1].bound,
        grads[2].bound,
        dbias,
        inputs.alibi_slopes,
        inputs.sinks,
        dsinks,
        **fp8,
    )
    handle, problem, implementation = checked_dispatch(params, tensors, handle, inputs.names)
    _keep_plan(handle, call_key, problem, implementation, inputs, tensors, BACKWARD_SLOTS)
    results = [_gradient_of(name, grad.caller, native) for name, grad, native in zip(NAMES, grads, inputs.natives)]
    if dbias is not None:  # of the mask's own dims, summed over what it broadcast along
        results.append(_unbroadcast(dbias.view, as_native(attn_mask).shape, inputs.leading))
    if dsinks is not None:
        results.append(dsinks.view)
    results += [fp8[slot].view for slot in FP8_BACKWARD_AMAX if slot in fp8]
    return tuple(to_caller_kind(view, query) for view in results)


def descriptor_of_call(
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


class CallInputs(NamedTuple):
    q: Bound
    k: Bound
    v: Bound
    bias: Bound | None
    seq_lens_q: Bound | None
    seq_lens_kv: Bound | None
    alibi_slopes: Bound | None
    sinks: Bound | None
    leading: tuple[int, ...]  # the caller's batch dims (before heads, sequence, head dim)
    query_shape: tuple[int, ...]  # query's shape broadcast with key's and value's batch dims
    names: SlotNames  # how the errors name each slot and dim
    natives: tuple[Any, ...]  # query, key and value as the caller gave them (NumPy arrays or torch tensors)

    @property
    def as_given(self) -> bool:
        """Query, key and value bound in the caller's own shapes: none broadcast to the others."""
        given = zip((self.q, self.k, self.v), self.natives)
        return all(bound.desc.dims == tuple(native.shape) for bound, native in given)

    @property
    def headless(self) -> bool:
        """A 2-D (sequence, head dim) call: its arrays have no heads dim (the problem's is 1)."""
        return len(self.query_shape) == 2

    def caller_shape(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """The caller's shape of an array of the problem's ``dims`` (batch, heads, ...)."""
        shape = (*self.leading, *dims[1:])
        return shape[1:] if self.headless else shape


def _inputs(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    seq_lens_q: Any,
    seq_lens_kv: Any,
    alibi_slopes: Any,
    sinks: Any,
    enable_gqa: bool,
) -> CallInputs:
    """The input arrays as (batch, heads, sequence, head dim) bound in the problem's slots: the
    leading dims merged into the batch (a 2-D call's batch and heads 1), the mask and the slopes
    broadcast as torch broadcasts. Every array is checked as the caller gave it (its empty dims, its
    batch dims) before it is merged."""
    natives = {name: as_native(array, name) for name, array in zip(NAMES, (query, key, value))}
    for name, native in natives.items():
        if native.ndim < 2:
            raise BadParam(
                f"{name}.ndim={native.ndim} must be at least 2 (..., sequence, head dim)",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
        descriptor_of(native, name)
    full = _broadcast({name: tuple(native.shape) for name, native in natives.items()}, enable_gqa)
    shape = full["query"]
    leading = shape[:-3]
    headless = len(shape) == 2
    q, k, v = (wrap(name, _merged(_expanded(natives[name], full[name]), 3, headless)) for name in natives)
    if not enable_gqa and q.desc.dims[1] != k.desc.dims[1] and k.desc.dims[1] != 1:  # one key head broadcasts
        raise BadParam(
            f"key.shape[-3]={k.desc.dims[1]} must equal query.shape[-3]={q.desc.dims[1]} unless enable_gqa=True",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    bias = None if attn_mask is None else wrap("attn_mask", _mask(as_native(attn_mask, "attn_mask"), shape))
    slopes = None
    if alibi_slopes is not None:
        native = as_native(alibi_slopes, "alibi_slopes")
        if native.ndim > 1 and tuple(native.shape[:-1]) != (math.prod(leading),):  # else (batch, heads) already
            _check_leading("alibi_slopes", native, 1, leading, shape)
            native = native.reshape(-1, native.shape[-1])
        slopes = wrap("alibi_slopes", native)
    optional = [
        None if array is None else wrap(name, array)
        for name, array in (("seq_lens_q", seq_lens_q), ("seq_lens_kv", seq_lens_kv), ("sinks", sinks))
    ]
    names = DENSE_NAMES[-1 if headless else min(len(leading), 2)]
    own = tuple(natives.values())
    return CallInputs(q, k, v, bias, optional[0], optional[1], slopes, optional[2], leading, shape, names, own)


def _check_leading(name: str, native: Any, kept: int, leading: tuple[int, ...], query_shape: tuple[int, ...]) -> None:
    """``native`` must be query's leading (batch) dims, then ``kept`` dims of its own."""
    shape = tuple(native.shape)
    if len(shape) != len(leading) + kept or shape[: len(leading)] != leading:
        raise BadParam(
            f"{name}.shape={list(shape)} must have query's leading dims {list(leading)} and {kept} more "
            f"(query.shape={list(query_shape)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )


def broadcast_shapes(
    query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...], enable_gqa: bool
) -> tuple[int, ...]:
    """The shape of ``scaled_dot_product_attention``'s output for inputs of these shapes (their batch
    dims broadcast; the torch operator's fake kernel lays out its outputs by it)."""
    shapes = _broadcast({"query": query_shape, "key": key_shape, "value": value_shape}, enable_gqa)
    return (*shapes["query"][:-1], value_shape[-1])


def _broadcast(shapes: dict[str, tuple[int, ...]], enable_gqa: bool) -> dict[str, tuple[int, ...]]:
    """The shapes query, key and value take once their batch dims broadcast as torch's SDPA broadcasts
    them (as matmul does): the dims before (heads, sequence, head dim) broadcast together; a heads
    dim of 1 broadcasts too (key and value to each other; a query's to the key's, unless enable_gqa,
    where query heads must be a multiple of key heads); one key/value head serves every query head
    as it is (the kernels' MQA). A 2-D array has a heads dim of 1 when the others have more dims.
    Heads that neither match nor are 1 stay as given, for the problem's rules to name.

    Raises:
        BadParam: a batch dim neither 1 nor the others' (torch raises a RuntimeError).
    """
    rank = max(len(shape) for shape in shapes.values())
    if rank == 2:
        return shapes
    padded = {name: (1,) * (rank - len(shape)) + shape for name, shape in shapes.items()}
    leading: list[int] = []
    for axis in range(rank - 3):
        sizes = {name: shape[axis] for name, shape in padded.items()}
        wanted = next((size for size in sizes.values() if size != 1), 1)  # the first array's, unless 1
        for name, size in sizes.items():
            if size not in (1, wanted):
                given = ", ".join(f"{other}.shape={list(shapes[other])}" for other in shapes)
                raise BadParam(
                    f"{name}.shape[{axis - rank}]={size} must be {one_or(wanted)} (the batch dims of {given} "
                    "broadcast)",
                    Status.BAD_PARAM_SHAPE_MISMATCH,
                )
        leading.append(wanted)
    heads = {name: shape[-3] for name, shape in padded.items()}
    if heads["key"] == 1:
        heads["key"] = heads["value"]
    elif heads["value"] == 1:
        heads["value"] = heads["key"]
    if heads["query"] == 1 and not enable_gqa:
        heads["query"] = heads["key"]
    return {name: (*leading, heads[name], *shape[-2:]) for name, shape in padded.items()}


def _expanded(native: Any, shape: tuple[int, ...]) -> Any:
    """``native`` broadcast to ``shape``: a view with stride 0 along the broadcast dims."""
    if tuple(native.shape) == shape:
        return native
    if isinstance(native, np.ndarray):
        return np.broadcast_to(native, shape)
    return native.expand(shape)


def _sum_to(gradient: Any, shape: tuple[int, ...]) -> Any:
    """``gradient`` of a broadcast array summed back to the array's own ``shape``: over the dims it
    has beyond them and the dims ``shape`` holds at 1."""
    extra = gradient.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + d for d, size in enumerate(shape) if size == 1 and gradient.shape[extra + d] != 1
    )
    if axes:
        gradient = gradient.sum(axes)
    return gradient.reshape(shape)


def _gradient_of(name: str, gradient: Any, native: Any) -> Any:
    """The gradient of the input ``native`` from ``gradient``, computed for its broadcast shape: summed
    back to the input's own shape and, for a 4-dim input, laid out in its memory order (as every output
    of a 4-dim call is)."""
    shape = tuple(native.shape)
    if tuple(gradient.shape) == shape:
        return gradient
    summed = _sum_to(gradient, shape)
    if len(shape) != 4:
        return summed
    target = empty_like(wrap(name, native)).view
    target[...] = summed
    return target


def _forwards(inputs: CallInputs, name: str, array: Any) -> Bound:
    """A backward's ``out``, ``grad_out`` or ``stats``, checked to have the shape the forward gives
    it (the caller's own, before its batch dims are merged), then bound with them merged."""
    native = as_native(array, name)
    descriptor_of(native, name)
    queries = inputs.query_shape[:-1]
    expected, meaning = (
        (queries, "query's shape less its head dim")
        if name == "stats"
        else ((*queries, inputs.v.desc.dims[3]), "query's shape with value's head dim")
    )
    if tuple(native.shape) != expected:
        raise BadParam(
            f"{name}.shape={list(native.shape)} must be {list(expected)} ({meaning}, as the forward gives it; "
            f"query.shape={list(inputs.query_shape)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    return wrap(name, _merged(native, 2 if name == "stats" else 3, inputs.headless))


def _merged(native: Any, kept: int, headless: bool = False) -> Any:
    """``native`` with its dims before the last ``kept`` merged into one (1 when there are none):
    a view where the strides allow, else a copy; ``headless``: a 2-D call's array, given a heads dim of 1."""
    native = as_native(native)
    if headless:
        native = native[None]
    shape = tuple(native.shape)
    merged = (math.prod(shape[: len(shape) - kept]), *shape[len(shape) - kept :])
    return native if merged == shape else native.reshape(merged)


def _mask(native: Any, query_shape: tuple[int, ...]) -> Any:
    """The mask (broadcasting to (..., heads, queries, keys)) as 4 dims: its leading dims dropped
    when all 1, merged when they are the query's, broadcast to the query's first (a copy) when
    some are 1 (the problem's rules check the other three dims, named from the end).

    Raises:
        BadParam: more dims than the query, a leading dim neither 1 nor the query's.
    """
    leading = query_shape[:-3]
    rank = len(leading) + 3
    if native.ndim > len(query_shape):
        raise BadParam(
            f"attn_mask.ndim={native.ndim} must be at most query.ndim={len(query_shape)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    descriptor_of(native, "attn_mask")
    given = tuple(native.shape)
    native = native.reshape((1,) * (rank - native.ndim) + given)
    own = tuple(native.shape[: len(leading)])
    for axis, (size, wanted) in enumerate(zip(own, leading)):
        if size not in (1, wanted):
            raise BadParam(
                f"attn_mask.shape[{axis - rank}]={size} must be {one_or(wanted)} (attn_mask.shape={list(given)} "
                f"broadcasts over query's leading dims {list(leading)})",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
    if all(size == 1 for size in own):
        return native.reshape((1, *native.shape[len(leading) :]))
    if own != leading:
        full = (*leading, *native.shape[len(leading) :])
        native = np.broadcast_to(native, full) if isinstance(native, np.ndarray) else native.expand(full)
    return _merged(native, 3)


def _unbroadcast(gradient: Any, shape: tuple[int, ...], leading: tuple[int, ...]) -> Any:
    """The mask's gradient (4 dims, as ``_mask`` gave the mask) summed back to the mask's own ``shape``."""
    if gradient.shape[0] == 1:
        return gradient.reshape(shape)
    return _sum_to(gradient.reshape((*leading, *gradient.shape[1:])), shape)


class _Output(NamedTuple):
    bound: Bound  # 4 dims, as the problem takes it
    caller: Any  # the caller's dims, the same memory


def _output(
    inputs: CallInputs, like: Bound, name: str, dtype: DataType, dims: tuple[int, ...], packed: bool = False
) -> _Output:
    """A new output of the problem's ``dims`` (4, or 3 for stats) and its view in the caller's shape:
    laid out as ``like`` when the caller's arrays are 4-dim (``packed``: packed, as for stats), else packed."""
    shape = inputs.caller_shape(dims)
    if len(inputs.leading) == 1 and not packed:
        bound = empty_like(like, dtype, dims)
        return _Output(Bound(name, bound.desc, bound.view, bound.device), bound.view)
    order = tuple(range(len(dims)))
    bound = empty_like(like, dtype, dims, order)
    caller = bound.view.reshape(shape)  # packed: a view
    return _Output(Bound(name, bound.desc, bound.view, bound.device), caller)


def checked_dispatch(
    params: AttentionDescriptor,
    tensors: AttentionTensors,
    handle: Handle | None,
    names: SlotNames,
    **sizes: int | None,
) -> tuple[Handle, AttentionProblem, Any]:
    """Check the call under the functional ``names`` (the values of ragged offsets and block tables
    too) and dispatch it on ``handle`` (default: the query's device's); ``sizes``: max_seqlen_q and
    max_seqlen_kv of ragged calls. Returns the handle, the problem and the backend that ran it."""
    handle = handle_for(tensors.q, handle)
    descs = {slot: bound.desc for slot, bound in zip(tensors._fields, tensors) if bound is not None}
    math = handle.math_type is MathType.TENSOR_OP
    problem = attention_problem(params, **descs, **sizes, names=names, allow_tf32=math)  # type: ignore[arg-type]
    check_layout_values(problem, tensors, names)
    return handle, problem, dispatch(handle, "attention", problem, tensors)
