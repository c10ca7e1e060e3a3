"""Attention as cuDNN's SDPA: ``attention_forward`` and ``attention_backward`` over descriptors, and
the workspace queries ``get_attention_forward_workspace_size`` / ``get_attention_backward_workspace_size``.

The parameters (scale, causal mask and its alignment, sliding window, softcap, dropout) live in an
AttentionDescriptor; the tensors are given as descriptor and array pairs of any strides (see
``opendnn.families.attention.reference`` for the formulas and the masks, ``problem`` for the dims).
Optional tensors: stats (the per-row logsumexp the backward needs), a bias (float: added to the
scores; BOOLEAN: a mask, True where the key takes part), per-batch sequence lengths of the queries
and keys, ALiBi slopes (per query head, or per batch and query head) and attention sinks (one logit
per query head, with their gradient dsinks in the backward). The outputs must not overlap the inputs. The kernels
allocate their workspace themselves, on the tensors' device; the queries say how much.

Ragged (packed) sequences, as cuDNN's ragged offset tensors: ``ragged_offsets_q`` and
``ragged_offsets_kv`` ((B + 1,) INT32 or INT64) give where each sequence starts, and q, o, do, dq
and stats are descriptors of the packed tokens, (1, Hq, total_q, D) of any strides (a (total_q,
Hq, D) buffer is strides (0, D, Hq * D, 1)), k, v, dk and dv likewise (1, Hkv, total_kv, D);
``max_seqlen_q`` / ``max_seqlen_kv`` bound the sequences (default: the totals). Unlike cuDNN's
per-tensor offsets in elements, an offset counts tokens (rows of dims[2]) and serves every tensor
of its side: element offset = token offset * that tensor's dims[2] stride, cuDNN's value for packed
layouts. Offsets on the host are checked before any kernel runs; offsets on a device are not read by
the host (no synchronisation): the kernels clamp each sequence into the packed tokens, so offsets
that break the rules give wrong rows, never a read or write outside the tensors.
Paged K/V (forward only, as cuDNN's paged attention): ``block_table`` (B, blocks per sequence),
INT32, with k and v descriptors of the caches, (num blocks, Hkv, block size, D) of any strides.

fp8 forward, as cuDNN's fp8 SDPA: q, k and v FP8_E4M3 or FP8_E5M2, o fp8, BFLOAT16 or HALF, and
the per-tensor factors ``descale_q``, ``descale_k``, ``descale_v``, ``descale_s``, ``scale_s`` and
``scale_o`` (one FLOAT element each, on the device: read by the kernel, never by the host);
``amax_s`` and ``amax_o`` (one FLOAT element each) receive the largest softmax weight and the
largest |o| before scale_o (see ``reference`` for the formulas). fp8 backward, as cuDNN's fp8 SDPA
backward: the forward's q, k, v, o and stats, do FP8_E4M3 or FP8_E5M2, dq, dk and dv fp8, BFLOAT16
or HALF, the factors ``descale_q``, ``descale_k``, ``descale_v``, ``descale_o``, ``descale_do``,
``descale_s``, ``descale_dp``, ``scale_s``, ``scale_dq``, ``scale_dk``, ``scale_dv`` and
``scale_dp`` (on the device, as the forward's); ``amax_dq``, ``amax_dk``, ``amax_dv`` and
``amax_dp`` receive the largest |dQ|, |dK|, |dV| before their scales and the largest |dS| before
scale_dp.
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import Bound, bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch, load_backend, refusal, require_handle
from opendnn.core.errors import BadParam, NotSupported, Status
from opendnn.core.handle import Handle, MathType
from opendnn.families.attention.descriptor import AttentionDescriptor
from opendnn.families.attention.problem import (
    API_NAMES,
    FP8_AMAX,
    FP8_BACKWARD_AMAX,
    FP8_BACKWARD_SCALES,
    FP8_SCALES,
    OUTPUTS,
    AttentionProblem,
    AttentionTensors,
    attention_problem,
    check_layout_values,
)

# the optional tensors of each direction, as keyword-only (name_desc, name) pairs
LAYOUT_OPTIONAL = ("ragged_offsets_q", "ragged_offsets_kv", "block_table")
FORWARD_OPTIONAL = ("bias", "seq_lens_q", "seq_lens_kv", "alibi_slopes", "sinks", *LAYOUT_OPTIONAL)
BACKWARD_OPTIONAL = (*FORWARD_OPTIONAL, "dbias", "dsinks")
FP8_OPTIONAL = (*FP8_SCALES, *FP8_AMAX)
FP8_BACKWARD_OPTIONAL = (*FP8_BACKWARD_SCALES, *FP8_BACKWARD_AMAX)
BACKWARD_SLOTS = ("q", "k", "v", "o", "stats", "do", "dq", "dk", "dv")


def attention_forward(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    q: Any,
    k_desc: TensorDescriptor,
    k: Any,
    v_desc: TensorDescriptor,
    v: Any,
    o_desc: TensorDescriptor,
    o: Any,
    *,
    stats_desc: TensorDescriptor | None = None,
    stats: Any = None,
    bias_desc: TensorDescriptor | None = None,
    bias: Any = None,
    seq_lens_q_desc: TensorDescriptor | None = None,
    seq_lens_q: Any = None,
    seq_lens_kv_desc: TensorDescriptor | None = None,
    seq_lens_kv: Any = None,
    alibi_slopes_desc: TensorDescriptor | None = None,
    alibi_slopes: Any = None,
    sinks_desc: TensorDescriptor | None = None,
    sinks: Any = None,
    ragged_offsets_q_desc: TensorDescriptor | None = None,
    ragged_offsets_q: Any = None,
    ragged_offsets_kv_desc: TensorDescriptor | None = None,
    ragged_offsets_kv: Any = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    block_table_desc: TensorDescriptor | None = None,
    block_table: Any = None,
    descale_q_desc: TensorDescriptor | None = None,
    descale_q: Any = None,
    descale_k_desc: TensorDescriptor | None = None,
    descale_k: Any = None,
    descale_v_desc: TensorDescriptor | None = None,
    descale_v: Any = None,
    descale_s_desc: TensorDescriptor | None = None,
    descale_s: Any = None,
    scale_s_desc: TensorDescriptor | None = None,
    scale_s: Any = None,
    scale_o_desc: TensorDescriptor | None = None,
    scale_o: Any = None,
    amax_s_desc: TensorDescriptor | None = None,
    amax_s: Any = None,
    amax_o_desc: TensorDescriptor | None = None,
    amax_o: Any = None,
) -> None:
    """``o = softmax(mask(softcap(scale * q k^T) + bias - alibi), sinks) v`` with dropout, and the rows'
    logsumexp into ``stats`` when given (dims (B, Hq, Sq), FLOAT). fp8 q, k and v take the
    factors ``descale_q`` ... ``scale_o`` and fill ``amax_s`` and ``amax_o`` when given.

    Raises:
        BadParam: dims that disagree, a tensor past its buffer or on another device, an overlapping
            output, an array given without its descriptor (or the reverse), ragged offsets that
            decrease, end elsewhere than the packed tokens or exceed a max_seqlen, a needed block
            number outside the caches.
        NotSupported: a non-float dtype, a head dim outside 8..256, ragged offsets with a bias,
            sequence lengths or a block table; with fp8 data a bias, ALiBi, sinks, softcap,
            dropout, ragged offsets or a block table.
    """
    pairs = _pairs(locals(), ("q", "k", "v", "o", "stats", *FORWARD_OPTIONAL, *FP8_OPTIONAL))
    _run(handle, attn_desc, pairs, max_seqlen_q, max_seqlen_kv)


def attention_backward(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    q: Any,
    k_desc: TensorDescriptor,
    k: Any,
    v_desc: TensorDescriptor,
    v: Any,
    o_desc: TensorDescriptor,
    o: Any,
    do_desc: TensorDescriptor,
    do: Any,
    stats_desc: TensorDescriptor,
    stats: Any,
    dq_desc: TensorDescriptor,
    dq: Any,
    dk_desc: TensorDescriptor,
    dk: Any,
    dv_desc: TensorDescriptor,
    dv: Any,
    *,
    bias_desc: TensorDescriptor | None = None,
    bias: Any = None,
    dbias_desc: TensorDescriptor | None = None,
    dbias: Any = None,
    seq_lens_q_desc: TensorDescriptor | None = None,
    seq_lens_q: Any = None,
    seq_lens_kv_desc: TensorDescriptor | None = None,
    seq_lens_kv: Any = None,
    alibi_slopes_desc: TensorDescriptor | None = None,
    alibi_slopes: Any = None,
    sinks_desc: TensorDescriptor | None = None,
    sinks: Any = None,
    dsinks_desc: TensorDescriptor | None = None,
    dsinks: Any = None,
    ragged_offsets_q_desc: TensorDescriptor | None = None,
    ragged_offsets_q: Any = None,
    ragged_offsets_kv_desc: TensorDescriptor | None = None,
    ragged_offsets_kv: Any = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    block_table_desc: TensorDescriptor | None = None,
    block_table: Any = None,
    descale_q_desc: TensorDescriptor | None = None,
    descale_q: Any = None,
    descale_k_desc: TensorDescriptor | None = None,
    descale_k: Any = None,
    descale_v_desc: TensorDescriptor | None = None,
    descale_v: Any = None,
    descale_o_desc: TensorDescriptor | None = None,
    descale_o: Any = None,
    descale_do_desc: TensorDescriptor | None = None,
    descale_do: Any = None,
    descale_s_desc: TensorDescriptor | None = None,
    descale_s: Any = None,
    descale_dp_desc: TensorDescriptor | None = None,
    descale_dp: Any = None,
    scale_s_desc: TensorDescriptor | None = None,
    scale_s: Any = None,
    scale_dq_desc: TensorDescriptor | None = None,
    scale_dq: Any = None,
    scale_dk_desc: TensorDescriptor | None = None,
    scale_dk: Any = None,
    scale_dv_desc: TensorDescriptor | None = None,
    scale_dv: Any = None,
    scale_dp_desc: TensorDescriptor | None = None,
    scale_dp: Any = None,
    amax_dq_desc: TensorDescriptor | None = None,
    amax_dq: Any = None,
    amax_dk_desc: TensorDescriptor | None = None,
    amax_dk: Any = None,
    amax_dv_desc: TensorDescriptor | None = None,
    amax_dv: Any = None,
    amax_dp_desc: TensorDescriptor | None = None,
    amax_dp: Any = None,
) -> None:
    """dq, dk, dv (and dbias, of the bias's dims, and dsinks, when given) from the forward's o and
    stats and the gradient do, with the forward's own attn_desc (the dropout mask is regenerated
    from its seed). fp8 q, k and v take the factors ``descale_q`` ... ``scale_dp`` and fill
    ``amax_dq`` ... ``amax_dp`` when given.

    Raises:
        BadParam: as attention_forward; stats, dq, dk or dv missing; dbias without a float bias;
            dsinks without sinks; an fp8 backward's factor missing or not one FLOAT element.
        NotSupported: as attention_forward; dbias of a BOOLEAN mask; a block table (no backward
            through paged K/V); dO not fp8, or dq, dk, dv not fp8, BFLOAT16 or HALF, with fp8 data.
    """
    slots = (*BACKWARD_SLOTS, *BACKWARD_OPTIONAL, *FP8_BACKWARD_OPTIONAL)
    _run(handle, attn_desc, _pairs(locals(), slots), max_seqlen_q, max_seqlen_kv)


def get_attention_forward_workspace_size(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    k_desc: TensorDescriptor,
    v_desc: TensorDescriptor,
    o_desc: TensorDescriptor,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    **optional_descs: TensorDescriptor | None,
) -> int:
    """Bytes of workspace ``attention_forward`` allocates on this handle's backend for these
    descriptors (``optional_descs``: its keyword descriptors, ``stats_desc``, ``bias_desc``, ...).

    Raises:
        BadParam, NotSupported: as attention_forward.
    """
    optional = _optional_descs(optional_descs, ("stats", *FORWARD_OPTIONAL, *FP8_OPTIONAL))
    descs = dict(q=q_desc, k=k_desc, v=v_desc, o=o_desc, **optional)
    return _workspace_size(handle, attn_desc, descs, max_seqlen_q, max_seqlen_kv)


def get_attention_backward_workspace_size(
    handle: Handle,
    attn_desc: AttentionDescriptor,
    q_desc: TensorDescriptor,
    k_desc: TensorDescriptor,
    v_desc: TensorDescriptor,
    o_desc: TensorDescriptor,
    do_desc: TensorDescriptor,
    stats_desc: TensorDescriptor,
    dq_desc: TensorDescriptor,
    dk_desc: TensorDescriptor,
    dv_desc: TensorDescriptor,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    **optional_descs: TensorDescriptor | None,
) -> int:
    """Bytes of workspace ``attention_backward`` allocates on this handle's backend for these
    descriptors (``optional_descs``: its keyword descriptors, ``bias_desc``, ``dsinks_desc``, ...).

    Raises:
        BadParam, NotSupported: as attention_backward.
    """
    descs = dict(
        q=q_desc,
        k=k_desc,
        v=v_desc,
        o=o_desc,
        do=do_desc,
        stats=stats_desc,
        dq=dq_desc,
        dk=dk_desc,
        dv=dv_desc,
        **_optional_descs(optional_descs, (*BACKWARD_OPTIONAL, *FP8_BACKWARD_OPTIONAL)),
    )
    return _workspace_size(handle, attn_desc, descs, max_seqlen_q, max_seqlen_kv)


def _pairs(arguments: dict[str, Any], slots: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """(descriptor, array) of each slot, from a call's own arguments ``slot_desc`` and ``slot``."""
    return {slot: (arguments[f"{slot}_desc"], arguments[slot]) for slot in slots}


def _optional_descs(given: dict[str, TensorDescriptor | None], slots: tuple[str, ...]) -> dict[str, Any]:
    unknown = sorted(set(given) - {f"{slot}_desc" for slot in slots})
    if unknown:
        raise BadParam(
            f"{unknown[0]} is not a descriptor of this call (it takes {', '.join(f'{s}_desc' for s in slots)})"
        )
    return {slot: given.get(f"{slot}_desc") for slot in slots}


def _problem(
    handle: Handle, attn_desc: AttentionDescriptor, descs: dict[str, Any], *sizes: int | None
) -> AttentionProblem:
    """The problem of the call; ``sizes``: max_seqlen_q and max_seqlen_kv."""
    descs = {slot: desc for slot, desc in descs.items() if desc is not None}
    math = handle.math_type is MathType.TENSOR_OP
    return attention_problem(attn_desc, **descs, max_seqlen_q=sizes[0], max_seqlen_kv=sizes[1], allow_tf32=math)


def _workspace_size(handle: Handle, attn_desc: AttentionDescriptor, descs: dict[str, Any], *sizes: int | None) -> int:
    problem = _problem(handle, attn_desc, descs, *sizes)
    backend = load_backend("attention", require_handle(handle).backend, handle.device)
    reason = refusal(backend, problem)
    if reason is not None:
        raise NotSupported(f"attention on backend {handle.backend!r}: {reason}", Status.NOT_SUPPORTED)
    size: int = backend.workspace_size(problem)
    return size


def _run(handle: Handle, attn_desc: AttentionDescriptor, pairs: dict[str, tuple[Any, Any]], *sizes: int | None) -> None:
    """Check the call, bind every array given to its descriptor, check the values of ragged offsets
    and block tables, and dispatch it."""
    problem = _problem(handle, attn_desc, {slot: desc for slot, (desc, _) in pairs.items()}, *sizes)
    bound = {slot: _bind_optional(slot, desc, array, output=slot in OUTPUTS) for slot, (desc, array) in pairs.items()}
    tensors = AttentionTensors._make(bound.get(slot) for slot in AttentionTensors._fields)
    check_layout_values(problem, tensors, API_NAMES)
    dispatch(handle, "attention", problem, tensors)


def _bind_optional(name: str, desc: TensorDescriptor | None, array: Any, *, output: bool = False) -> Bound | None:
    if desc is None:
        if array is not None:
            raise BadParam(f"{name}_desc=None but {name} is given", Status.BAD_PARAM_NULL_POINTER)
        return None
    return bind(name, desc, array, output=output)
