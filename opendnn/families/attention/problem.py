"""Scaled dot-product attention (cuDNN's SDPA forward and backward): a call's problem, the shape and
dtype rules, and the host checks of ragged offsets' and block tables' values. The parameters are an
``AttentionDescriptor`` (``descriptor``); the formulas and the float64 reference are in ``reference``,
whose public names are importable from here too.

Tensors have dims (batch B, heads H, sequence S, head dim D) with any strides, so BSHD, BHSD and
packed QKV buffers are all just strides: q (B, Hq, Sq, D), k (B, Hkv, Skv, D), v (B, Hkv, Skv, Dv),
o (B, Hq, Sq, Dv), stats (B, Hq, Sq). Query heads are a multiple of key/value heads (grouped-query
attention; Hkv = 1 is multi-query attention).

Data in FLOAT, HALF, BFLOAT16 or DOUBLE (one dtype for q, k, v, o and their gradients); stats in
FLOAT (DOUBLE allowed with DOUBLE data, whose backward needs the extra digits); seq lens INT32 or
INT64; ALiBi slopes, sinks and their gradient in FLOAT or the data dtype.

fp8 forward (cuDNN's fp8 SDPA): q, k and v in one of FP8_E4M3 and FP8_E5M2, o in an fp8 type,
BFLOAT16 or HALF, and the per-tensor factors descale_q, descale_k, descale_v, descale_s, scale_s and
scale_o (one FLOAT element each, all required); amax_s and amax_o (one FLOAT element each) are
written when given. fp8 backward (cuDNN's fp8 SDPA backward): o as the forward's, dO in an fp8
type, dq, dk and dv in an fp8 type, BFLOAT16 or HALF, the factors descale_q, descale_k, descale_v,
descale_o, descale_do, descale_s, descale_dp, scale_s, scale_dq, scale_dk, scale_dv and scale_dp
(all required), and the maxima amax_dq, amax_dk, amax_dv and amax_dp when given. The masks of both
directions are the causal one, windows and sequence lengths; a bias, ALiBi, sinks, softcap,
dropout, ragged or paged layouts are refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np

from opendnn.core.arrays import CPU, Bound
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status, require
from opendnn.core.memo import cached_hash, memoized
from opendnn.families.attention.descriptor import MAX_OFFSET, MAX_SEED, AttentionDescriptor, DiagonalAlignment
from opendnn.families.attention.reference import (
    PHILOX_KEY_A,
    PHILOX_KEY_B,
    PHILOX_ROUND_A,
    PHILOX_ROUND_B,
    PHILOX_ROUNDS,
    UINT32,
    Extras,
    Fp8Backward,
    Fp8BackwardScales,
    Fp8Forward,
    Fp8Scales,
    Gradients,
    allowed_keys,
    diagonal_offsets,
    dropout_keep,
    gathered,
    packed,
    padded,
    philox_uniform,
    ragged_reference,
    reference_backward,
    reference_backward_fp8,
    reference_forward,
    reference_forward_fp8,
    saturated_fp8,
)

__all__ = [
    # this module's own: the problem, its rules and the host checks
    "API_NAMES",
    "FP8_AMAX",
    "FP8_BACKWARD_AMAX",
    "FP8_BACKWARD_SCALES",
    "FP8_OUTPUT_TYPES",
    "FP8_SCALES",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
    "SLOTS",
    "STATS_DIMS",
    "AttentionProblem",
    "AttentionTensors",
    "SlotNames",
    "attention_problem",
    "check_layout_values",
    "host_values",
    "one_or",
    # the parameters (descriptor) and the float64 reference (reference), importable from here too
    "MAX_OFFSET",
    "MAX_SEED",
    "PHILOX_KEY_A",
    "PHILOX_KEY_B",
    "PHILOX_ROUND_A",
    "PHILOX_ROUND_B",
    "PHILOX_ROUNDS",
    "UINT32",
    "AttentionDescriptor",
    "DiagonalAlignment",
    "Extras",
    "Fp8Backward",
    "Fp8BackwardScales",
    "Fp8Forward",
    "Fp8Scales",
    "Gradients",
    "allowed_keys",
    "diagonal_offsets",
    "dropout_keep",
    "gathered",
    "packed",
    "padded",
    "philox_uniform",
    "ragged_reference",
    "reference_backward",
    "reference_backward_fp8",
    "reference_forward",
    "reference_forward_fp8",
    "saturated_fp8",
]

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256  # the head dims the kernels support
STATS_DIMS = ("batch", "heads", "sequence")
# the fp8 forward's per-tensor factors (inputs, in Fp8Scales' order) and maxima (outputs)
FP8_SCALES = Fp8Scales._fields
FP8_AMAX = ("amax_s", "amax_o")
# the fp8 backward's (in Fp8BackwardScales' order)
FP8_BACKWARD_SCALES = Fp8BackwardScales._fields
FP8_BACKWARD_AMAX = ("amax_dq", "amax_dk", "amax_dv", "amax_dp")
FP8_OUTPUT_TYPES = (DataType.FP8_E4M3, DataType.FP8_E5M2, DataType.BFLOAT16, DataType.HALF)
T = TypeVar("T")


@dataclass(frozen=True)
class AttentionProblem:
    """A validated attention call, forward (o and stats written) or backward (``do`` given: dq, dk,
    dv and dbias written): the parameters and the descriptors, no memory."""

    __hash__ = cached_hash  # problems key the per-call caches

    params: AttentionDescriptor
    scale: float
    q: TensorDescriptor
    k: TensorDescriptor
    v: TensorDescriptor
    o: TensorDescriptor
    stats: TensorDescriptor | None = None
    bias: TensorDescriptor | None = None
    seq_lens_q: TensorDescriptor | None = None
    seq_lens_kv: TensorDescriptor | None = None
    do: TensorDescriptor | None = None
    dq: TensorDescriptor | None = None
    dk: TensorDescriptor | None = None
    dv: TensorDescriptor | None = None
    dbias: TensorDescriptor | None = None
    alibi_slopes: TensorDescriptor | None = None
    sinks: TensorDescriptor | None = None
    dsinks: TensorDescriptor | None = None
    ragged_offsets_q: TensorDescriptor | None = None
    ragged_offsets_kv: TensorDescriptor | None = None
    block_table: TensorDescriptor | None = None
    descale_q: TensorDescriptor | None = None
    descale_k: TensorDescriptor | None = None
    descale_v: TensorDescriptor | None = None
    descale_s: TensorDescriptor | None = None
    scale_s: TensorDescriptor | None = None
    scale_o: TensorDescriptor | None = None
    amax_s: TensorDescriptor | None = None
    amax_o: TensorDescriptor | None = None
    descale_o: TensorDescriptor | None = None
    descale_do: TensorDescriptor | None = None
    descale_dp: TensorDescriptor | None = None
    scale_dq: TensorDescriptor | None = None
    scale_dk: TensorDescriptor | None = None
    scale_dv: TensorDescriptor | None = None
    scale_dp: TensorDescriptor | None = None
    amax_dq: TensorDescriptor | None = None
    amax_dk: TensorDescriptor | None = None
    amax_dv: TensorDescriptor | None = None
    amax_dp: TensorDescriptor | None = None
    max_seqlen_q: int = 0  # with ragged offsets: the longest sequence the kernels plan for
    max_seqlen_kv: int = 0
    allow_tf32: bool = False

    @property
    def backward(self) -> bool:
        return self.do is not None

    @property
    def ragged(self) -> bool:
        """Packed sequences: q, k, v and their kin are (1, H, total tokens, D), sequence b at the rows
        ragged_offsets[b] .. ragged_offsets[b + 1] of its side."""
        return self.ragged_offsets_q is not None

    @property
    def batch(self) -> int:
        return self.ragged_offsets_q.dims[0] - 1 if self.ragged_offsets_q is not None else self.q.dims[0]

    @property
    def seq_q(self) -> int:
        """The queries a batch may have: Sq, or the longest ragged sequence planned for."""
        return self.max_seqlen_q if self.ragged else self.q.dims[2]

    @property
    def seq_kv(self) -> int:
        """The keys a batch may have: Skv, the longest ragged sequence, or the paged blocks' capacity."""
        if self.ragged:
            return self.max_seqlen_kv
        if self.block_table is not None:
            return self.block_table.dims[1] * self.k.dims[2]
        return self.k.dims[2]

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.q.dims[1] // self.k.dims[1]

    @property
    def mask_bias(self) -> bool:
        """The bias is a BOOLEAN mask (True: the key takes part) rather than added to the scores."""
        return self.bias is not None and self.bias.dtype is DataType.BOOLEAN

    @property
    def compute_dtype(self) -> DataType:
        return self.q.dtype.compute_type

    @property
    def fp8(self) -> bool:
        """fp8 q, k and v with per-tensor factors (cuDNN's fp8 SDPA forward)."""
        return self.q.dtype.is_fp8


class AttentionTensors(NamedTuple):
    """The memory of one call, in the problem's slots (None where the call has none)."""

    q: Bound
    k: Bound
    v: Bound
    o: Bound
    stats: Bound | None = None
    bias: Bound | None = None
    seq_lens_q: Bound | None = None
    seq_lens_kv: Bound | None = None
    do: Bound | None = None
    dq: Bound | None = None
    dk: Bound | None = None
    dv: Bound | None = None
    dbias: Bound | None = None
    alibi_slopes: Bound | None = None
    sinks: Bound | None = None
    dsinks: Bound | None = None
    ragged_offsets_q: Bound | None = None
    ragged_offsets_kv: Bound | None = None
    block_table: Bound | None = None
    descale_q: Bound | None = None
    descale_k: Bound | None = None
    descale_v: Bound | None = None
    descale_s: Bound | None = None
    scale_s: Bound | None = None
    scale_o: Bound | None = None
    amax_s: Bound | None = None
    amax_o: Bound | None = None
    descale_o: Bound | None = None
    descale_do: Bound | None = None
    descale_dp: Bound | None = None
    scale_dq: Bound | None = None
    scale_dk: Bound | None = None
    scale_dv: Bound | None = None
    scale_dp: Bound | None = None
    amax_dq: Bound | None = None
    amax_dk: Bound | None = None
    amax_dv: Bound | None = None
    amax_dp: Bound | None = None


SLOTS = AttentionTensors._fields
OUTPUTS = ("o", "stats", "dq", "dk", "dv", "dbias", "dsinks", *FP8_AMAX, *FP8_BACKWARD_AMAX)  # the slots a call writes


@dataclass(frozen=True)
class SlotNames:
    """How a call names the problem's slots in its errors, so that each message names the caller's
    own parameter, and the caller's own axis of it.

    Args:
        names: (slot, the caller's name) pairs: "params", every AttentionTensors field,
            "max_seqlen_q" and "max_seqlen_kv".
        sizes: the caller's word for a tensor's sizes: "dims" (a descriptor's) or "shape" (an array's).
        axes: (slot, axes) pairs for the slots whose caller's array holds the problem's dims in
            another order: axes[d] is the caller's axis of the problem's dim d, None where the
            caller's array has no such dim. A packed (tokens, heads, head dim) query, which the
            problem takes as (1, heads, tokens, head dim), has axes (None, 1, 0, 2).
    """

    __hash__ = cached_hash  # a key of the memoized problems

    names: tuple[tuple[str, str], ...]
    sizes: str = "dims"
    axes: tuple[tuple[str, tuple[int | None, ...]], ...] = ()

    def __getitem__(self, slot: str) -> str:
        return dict(self.names)[slot]

    def whole(self, slot: str) -> str:
        """The slot's sizes as the caller writes them: ``query.shape``, ``q_desc.dims``."""
        return f"{self[slot]}.{self.sizes}"

    def dim(self, slot: str, d: int) -> str:
        """The problem's dim ``d`` of the slot as the caller writes it: ``query.shape[0]``, ``q_desc.dims[2]``."""
        axes = dict(self.axes).get(slot)
        axis = d if axes is None else axes[d]
        return f"{self[slot]}.dims[{d}]" if axis is None else f"{self.whole(slot)}[{axis}]"

    def in_caller_order(self, slot: str, items: Sequence[T]) -> list[T]:
        """``items``, one per dim of the slot in the problem, in the order of the caller's axes (the
        dims the caller's array lacks left out)."""
        axes = dict(self.axes).get(slot)
        if axes is None:
            return list(items)
        return [items[d] for axis, d in sorted((axis, d) for d, axis in enumerate(axes) if axis is not None)]


# the cuDNN-shaped calls name descriptors
API_NAMES = SlotNames(
    (
        ("params", "attn_desc"),
        *((slot, f"{slot}_desc") for slot in SLOTS),
        ("max_seqlen_q", "max_seqlen_q"),
        ("max_seqlen_kv", "max_seqlen_kv"),
    )
)


@memoized
def attention_problem(
    params: AttentionDescriptor,
    q: TensorDescriptor,
    k: TensorDescriptor,
    v: TensorDescriptor,
    o: TensorDescriptor,
    *,
    stats: TensorDescriptor | None = None,
    bias: TensorDescriptor | None = None,
    seq_lens_q: TensorDescriptor | None = None,
    seq_lens_kv: TensorDescriptor | None = None,
    do: TensorDescriptor | None = None,
    dq: TensorDescriptor | None = None,
    dk: TensorDescriptor | None = None,
    dv: TensorDescriptor | None = None,
    dbias: TensorDescriptor | None = None,
    alibi_slopes: TensorDescriptor | None = None,
    sinks: TensorDescriptor | None = None,
    dsinks: TensorDescriptor | None = None,
    ragged_offsets_q: TensorDescriptor | None = None,
    ragged_offsets_kv: TensorDescriptor | None = None,
    block_table: TensorDescriptor | None = None,
    descale_q: TensorDescriptor | None = None,
    descale_k: TensorDescriptor | None = None,
    descale_v: TensorDescriptor | None = None,
    descale_s: TensorDescriptor | None = None,
    scale_s: TensorDescriptor | None = None,
    scale_o: TensorDescriptor | None = None,
    amax_s: TensorDescriptor | None = None,
    amax_o: TensorDescriptor | None = None,
    descale_o: TensorDescriptor | None = None,
    descale_do: TensorDescriptor | None = None,
    descale_dp: TensorDescriptor | None = None,
    scale_dq: TensorDescriptor | None = None,
    scale_dk: TensorDescriptor | None = None,
    scale_dv: TensorDescriptor | None = None,
    scale_dp: TensorDescriptor | None = None,
    amax_dq: TensorDescriptor | None = None,
    amax_dk: TensorDescriptor | None = None,
    amax_dv: TensorDescriptor | None = None,
    amax_dp: TensorDescriptor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    names: SlotNames = API_NAMES,
    allow_tf32: bool = False,
) -> AttentionProblem:
    """The shape and dtype rules of every attention call; a backward when ``do`` is given.

    Ragged (packed) sequences: with ``ragged_offsets_q`` and ``ragged_offsets_kv`` ((B + 1,) token
    offsets, FlashAttention's cu_seqlens), q, o, do, dq and stats are the packed query tokens
    (1, Hq, total_q, ...), k, v, dk and dv the packed key tokens (1, Hkv, total_kv, ...), and
    ``max_seqlen_q`` / ``max_seqlen_kv`` (default: the totals) bound the sequences' lengths.
    Paged K/V (a forward): with ``block_table`` (B, max blocks), k and v are caches of dims
    (num blocks, Hkv, block size, D) and key j of batch b lives in block ``block_table[b, j // block
    size]``, row ``j % block size``. fp8 q, k and v: the per-tensor factors ``descale_q`` ...
    ``scale_o`` and the maxima ``amax_s`` / ``amax_o`` forward, ``descale_q`` ... ``scale_dp``
    and ``amax_dq`` ... ``amax_dp`` backward (see ``reference``).

    Args:
        names: how the caller names each slot and its dims in the messages.

    Raises:
        BadParam: naming the descriptor: not 4 dims, dims that disagree (batch, heads, sequence,
            head dim), query heads not a multiple of key/value heads, dtypes that differ, stats,
            bias, seq lens, ALiBi slopes, sinks, offsets, block table or gradients of the wrong
            dims or dtype, a tensor the backward needs missing, an fp8 factor missing or not one
            element, fp8 factors with data that is not fp8.
        NotSupported: a non-float dtype, a head dim outside 8..256, the gradient of a BOOLEAN mask,
            ragged offsets with a bias, sequence lengths or a block table, the backward through
            paged K/V; with fp8 data a bias, ALiBi, sinks, softcap, dropout, ragged offsets, a
            block table, o, dq, dk or dv of another dtype than fp8, BFLOAT16 or HALF, or dO
            not fp8.
    """
    name = names
    if not isinstance(params, AttentionDescriptor):
        raise BadParam(f"{name['params']}={params!r} must be an AttentionDescriptor")
    descs = dict(
        q=q,
        k=k,
        v=v,
        o=o,
        stats=stats,
        bias=bias,
        seq_lens_q=seq_lens_q,
        seq_lens_kv=seq_lens_kv,
        do=do,
        dq=dq,
        dk=dk,
        dv=dv,
        dbias=dbias,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        dsinks=dsinks,
        ragged_offsets_q=ragged_offsets_q,
        ragged_offsets_kv=ragged_offsets_kv,
        block_table=block_table,
        descale_q=descale_q,
        descale_k=descale_k,
        descale_v=descale_v,
        descale_s=descale_s,
        scale_s=scale_s,
        scale_o=scale_o,
        amax_s=amax_s,
        amax_o=amax_o,
        descale_o=descale_o,
        descale_do=descale_do,
        descale_dp=descale_dp,
        scale_dq=scale_dq,
        scale_dk=scale_dk,
        scale_dv=scale_dv,
        scale_dp=scale_dp,
        amax_dq=amax_dq,
        amax_dk=amax_dk,
        amax_dv=amax_dv,
        amax_dp=amax_dp,
    )
    backward = do is not None
    for slot in ("stats", "dq", "dk", "dv") if backward else ():
        require(descs[slot] is not None, f"{name[slot]}=None but the backward needs it", Status.BAD_PARAM_NULL_POINTER)
    for slot, desc in descs.items():
        if desc is not None and not isinstance(desc, TensorDescriptor):
            raise BadParam(f"{name[slot]}={desc!r} must be a TensorDescriptor")
    data = {slot: desc for slot in ("q", "k", "v", "o", "do", "dq", "dk", "dv") if (desc := descs[slot]) is not None}
    for slot, desc in data.items():
        require(
            desc.ndim == 4,
            f"{name[slot]}.ndim={desc.ndim} must be 4 (batch, heads, sequence, head dim)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    require(
        q.dtype.is_floating or q.dtype.is_fp8,
        f"{name['q']}.dtype={q.dtype.name} must be FLOAT, DOUBLE, HALF, BFLOAT16, FP8_E4M3 or FP8_E5M2",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    for slot, desc in data.items():
        if slot in ("o", "do", "dq", "dk", "dv") and q.dtype.is_fp8:
            continue  # _check_fp8's rule
        require(
            desc.dtype is q.dtype, f"{name[slot]}.dtype={desc.dtype.name} must equal {name['q']}.dtype={q.dtype.name}"
        )
    heads_q, head_dim = q.dims[1], q.dims[3]
    heads_kv, value_dim = k.dims[1], v.dims[3]
    layout = _check_layout(name, descs, max_seqlen_q, max_seqlen_kv)
    _check_fp8(name, params, descs)
    batch, seq_kv = layout[0], layout[2]
    _check_dims(name, "k", k, [None if block_table is not None else ("q", 0), None, None, ("q", 3)], data)
    _check_dims(name, "v", v, [("k", 0), ("k", 1), ("k", 2), None], data)
    require(
        heads_q % heads_kv == 0,
        f"{name.dim('q', 1)}={heads_q} must be a multiple of "
        f"{name.dim('k', 1)}={heads_kv} (query heads per key/value head)",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for slot, dim in (("q", head_dim), ("v", value_dim)):
        require(
            MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM,
            f"{name.dim(slot, 3)}={dim} must be between {MIN_HEAD_DIM} "
            f"and {MAX_HEAD_DIM} (the head dims the kernels support)",
            Status.NOT_SUPPORTED_SHAPE,
        )
    output_dims = [("q", 0), ("q", 1), ("q", 2), ("v", 3)]
    for slot, source in (("o", None), ("do", None), ("dq", "q"), ("dk", "k"), ("dv", "v")):
        if slot in data:
            rule = output_dims if source is None else [(source, d) for d in range(4)]
            _check_dims(name, slot, data[slot], rule, data)
    if stats is not None:
        _check_stats(name, stats, q)
    if bias is not None:
        _check_bias(name, bias, q, seq_kv)
    if dbias is not None:
        _check_bias_gradient(name, dbias, bias)
    for slot in ("seq_lens_q", "seq_lens_kv"):
        lens = descs[slot]
        if lens is not None:
            require(
                lens.dims == (batch,),
                f"{name.whole(slot)}={list(lens.dims)} must be [{batch}] (one length per batch of {name['q']})",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
            require(
                lens.dtype in (DataType.INT32, DataType.INT64),
                f"{name[slot]}.dtype={lens.dtype.name} must be INT32 or INT64",
                Status.NOT_SUPPORTED_DATA_TYPE,
            )
    for slot, shapes in (("alibi_slopes", ((heads_q,), (batch, heads_q))), ("sinks", ((heads_q,),))):
        per_head = descs[slot]
        if per_head is not None:
            _check_per_head(name, slot, per_head, q, shapes)
    if dsinks is not None:
        require(sinks is not None, f"{name['dsinks']} is given but {name['sinks']}=None", Status.BAD_PARAM_NULL_POINTER)
        assert sinks is not None
        require(
            (dsinks.dims, dsinks.dtype) == (sinks.dims, sinks.dtype),
            f"{name['dsinks']} of {name.sizes} {list(dsinks.dims)} and dtype {dsinks.dtype.name} must have "
            f"{name['sinks']}'s {name.sizes} {list(sinks.dims)} and dtype {sinks.dtype.name}",
        )
    optional = {slot: desc for slot, desc in descs.items() if slot not in ("q", "k", "v", "o")}
    return AttentionProblem(
        params=params,
        scale=params.resolved_scale(head_dim),
        q=q,
        k=k,
        v=v,
        o=o,
        max_seqlen_q=layout[1],
        max_seqlen_kv=seq_kv,
        allow_tf32=bool(allow_tf32) and q.dtype is DataType.FLOAT,
        **optional,
    )


def _check_layout(
    name: SlotNames,
    descs: dict[str, TensorDescriptor | None],
    max_seqlen_q: int | None,
    max_seqlen_kv: int | None,
) -> tuple[int, int, int]:
    """(batch, Sq, Skv) of the call, after the rules of ragged offsets and of a block table."""
    q, k = descs["q"], descs["k"]
    assert q is not None and k is not None
    offsets = [descs["ragged_offsets_q"], descs["ragged_offsets_kv"]]
    table = descs["block_table"]
    if offsets == [None, None]:
        for slot, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
            require(value is None, f"{name[slot]}={value!r} is given without ragged offsets")
        if table is None:
            return q.dims[0], q.dims[2], k.dims[2]
        require(
            table.ndim == 2 and table.dims[0] == q.dims[0],
            f"{name.whole('block_table')}={list(table.dims)} must be [{q.dims[0]}, blocks per sequence] "
            f"(one row per batch, {name.dim('q', 0)}={q.dims[0]})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            table.dtype is DataType.INT32,
            f"{name['block_table']}.dtype={table.dtype.name} must be INT32",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
        if descs["do"] is not None:
            raise NotSupported(
                f"{name['block_table']} is given: the backward through paged K/V is not supported (forward only)"
            )
        return q.dims[0], q.dims[2], table.dims[1] * k.dims[2]
    for slot, other in (("ragged_offsets_q", "ragged_offsets_kv"), ("ragged_offsets_kv", "ragged_offsets_q")):
        require(
            descs[slot] is not None,
            f"{name[slot]}=None but {name[other]} is given (ragged offsets come in pairs)",
            Status.BAD_PARAM_NULL_POINTER,
        )
    for slot in ("bias", "seq_lens_q", "seq_lens_kv", "block_table"):
        if descs[slot] is not None:
            raise NotSupported(f"{name[slot]} with ragged offsets is not supported")
    first = offsets[0]
    assert first is not None
    for slot, desc in zip(("ragged_offsets_q", "ragged_offsets_kv"), offsets):
        assert desc is not None
        require(
            desc.ndim == 1 and desc.dims[0] >= 2,
            f"{name.whole(slot)}={list(desc.dims)} must be [batch + 1], one dim of at least 2 "
            "(where each sequence starts, then the end of the last)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            desc.dims == first.dims,
            f"{name.whole(slot)}={list(desc.dims)} must equal {name.whole('ragged_offsets_q')}={list(first.dims)} "
            "(as many sequences of keys as of queries)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            desc.dtype in (DataType.INT32, DataType.INT64),
            f"{name[slot]}.dtype={desc.dtype.name} must be INT32 or INT64",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    for slot in ("q", "k"):
        require(
            descs[slot].dims[0] == 1,  # type: ignore[union-attr]
            f"{name.dim(slot, 0)}={descs[slot].dims[0]} must be 1 with ragged offsets "  # type: ignore[union-attr]
            f"(the packed tokens of every sequence along {name.dim(slot, 2)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    lengths = []
    for slot, value, total in (("max_seqlen_q", max_seqlen_q, q.dims[2]), ("max_seqlen_kv", max_seqlen_kv, k.dims[2])):
        value = total if value is None else value
        require(
            isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1,
            f"{name[slot]}={value!r} must be an int of at least 1",
        )
        lengths.append(int(value))
    return first.dims[0] - 1, lengths[0], lengths[1]


def _check_fp8(name: SlotNames, params: AttentionDescriptor, descs: dict[str, TensorDescriptor | None]) -> None:
    """The fp8 rules: the direction's factors (one FLOAT element each, all required) and maxima (one
    FLOAT element each, optional), no factor of the other direction, the dtypes of o, dO and the
    gradients, and the parameters and tensors fp8 does not serve; no factor without fp8."""
    q, o = descs["q"], descs["o"]
    assert q is not None and o is not None
    every = dict.fromkeys((*FP8_SCALES, *FP8_AMAX, *FP8_BACKWARD_SCALES, *FP8_BACKWARD_AMAX))
    if not q.dtype.is_fp8:
        for slot in every:
            require(
                descs[slot] is None,
                f"{name[slot]} is given but {name['q']}.dtype={q.dtype.name} is not FP8_E4M3 or FP8_E5M2",
            )
        return
    fp8 = f"{name['q']}.dtype={q.dtype.name}"
    backward = descs["do"] is not None
    for slot in ("bias", "alibi_slopes", "sinks", "ragged_offsets_q", "block_table", "dbias", "dsinks"):
        if descs[slot] is not None:
            raise NotSupported(
                f"{name[slot]} with {fp8} is not supported (fp8 attention's masks: causal, window, sequence lengths)"
            )
    for field, value in (("softcap", params.softcap), ("dropout_p", params.dropout_p)):
        if value:
            raise NotSupported(f"{name['params']}.{field}={value!r} with {fp8} is not supported")
    for slot in ("o", "dq", "dk", "dv") if backward else ("o",):
        desc = descs[slot]
        assert desc is not None
        require(
            desc.dtype in FP8_OUTPUT_TYPES,
            f"{name[slot]}.dtype={desc.dtype.name} must be {', '.join(t.name for t in FP8_OUTPUT_TYPES)} for {fp8}",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    if backward:
        do = descs["do"]
        assert do is not None
        require(
            do.dtype.is_fp8,
            f"{name['do']}.dtype={do.dtype.name} must be FP8_E4M3 or FP8_E5M2 for {fp8}",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    scales, maxima = (FP8_BACKWARD_SCALES, FP8_BACKWARD_AMAX) if backward else (FP8_SCALES, FP8_AMAX)
    direction = "backward" if backward else "forward"
    for slot in every:
        desc = descs[slot]
        if slot not in scales and slot not in maxima:
            require(desc is None, f"{name[slot]} is given but the fp8 {direction} does not take it")
            continue
        if desc is None:
            require(
                slot in maxima,
                f"{name[slot]}=None but the {direction} of {fp8} needs it (a per-tensor factor)",
                Status.BAD_PARAM_NULL_POINTER,
            )
            continue
        require(
            math.prod(desc.dims) == 1,
            f"{name.whole(slot)}={list(desc.dims)} must hold one element (a per-tensor number)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            desc.dtype is DataType.FLOAT,
            f"{name[slot]}.dtype={desc.dtype.name} must be FLOAT",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )


def _check_per_head(
    name: SlotNames, slot: str, desc: TensorDescriptor, q: TensorDescriptor, shapes: tuple[tuple[int, ...], ...]
) -> None:
    """ALiBi slopes and sinks: one number per query head (slopes: per batch too), FLOAT or q's dtype."""
    require(
        desc.dims in shapes,
        f"{name.whole(slot)}={list(desc.dims)} must be {' or '.join(str(list(shape)) for shape in shapes)} "
        f"(one per query head{', or per batch and query head' if len(shapes) > 1 else ''} of {name['q']})",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    allowed = dict.fromkeys((DataType.FLOAT, q.dtype))
    require(
        desc.dtype in allowed,
        f"{name[slot]}.dtype={desc.dtype.name} must be {' or '.join(t.name for t in allowed)}",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def _check_dims(
    name: SlotNames,
    slot: str,
    desc: TensorDescriptor,
    rule: Sequence[tuple[str, int] | None],
    descs: dict[str, TensorDescriptor],
) -> None:
    """Each dim d of ``desc`` equals dim rule[d][1] of descriptor rule[d][0] (None: any size)."""
    for d, source in enumerate(rule):
        if source is None:
            continue
        expected = descs[source[0]].dims[source[1]]
        if desc.dims[d] != expected:
            raise BadParam(
                f"{name.dim(slot, d)}={desc.dims[d]} must equal {name.dim(*source)}={expected}",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )


def _check_stats(name: SlotNames, stats: TensorDescriptor, q: TensorDescriptor) -> None:
    if stats.dims != q.dims[:3]:
        expected, meaning = name.in_caller_order("stats", q.dims[:3]), name.in_caller_order("stats", STATS_DIMS)
        raise BadParam(
            f"{name.whole('stats')}={name.in_caller_order('stats', stats.dims)} must be {expected} "
            f"({', '.join(meaning)} of {name['q']})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    allowed = (DataType.FLOAT, DataType.DOUBLE) if q.dtype is DataType.DOUBLE else (DataType.FLOAT,)
    require(
        stats.dtype in allowed,
        f"{name['stats']}.dtype={stats.dtype.name} must be "
        f"{' or '.join(t.name for t in allowed)} for {name['q']}.dtype={q.dtype.name}",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def _check_bias(name: SlotNames, bias: TensorDescriptor, q: TensorDescriptor, seq_kv: int) -> None:
    full = (*q.dims[:3], seq_kv)
    require(
        bias.ndim == 4,
        f"{name['bias']}.ndim={bias.ndim} must be 4 (batch, heads, queries, keys)",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for d, (size, expected) in enumerate(zip(bias.dims, full)):
        if size not in (1, expected):
            raise BadParam(
                f"{name.dim('bias', d)}={size} must be {one_or(expected)} "
                f"(it broadcasts to {name.in_caller_order('bias', full)})",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
    require(
        bias.dtype in (q.dtype, DataType.BOOLEAN),
        f"{name['bias']}.dtype={bias.dtype.name} must equal {name['q']}.dtype={q.dtype.name} (added to the "
        "scores) or be BOOLEAN (a mask, True where the key takes part)",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def one_or(size: int) -> str:
    """The sizes a dim that broadcasts to ``size`` may have, in words: "1", or "``size`` or 1"."""
    return "1" if size == 1 else f"{size} or 1"


def _check_bias_gradient(name: SlotNames, dbias: TensorDescriptor, bias: TensorDescriptor | None) -> None:
    require(bias is not None, f"{name['dbias']} is given but {name['bias']}=None", Status.BAD_PARAM_NULL_POINTER)
    assert bias is not None
    if bias.dtype is DataType.BOOLEAN:
        raise NotSupported(f"{name['dbias']}: {name['bias']}.dtype=BOOLEAN is a mask and has no gradient")
    require(
        dbias.dims == bias.dims,
        f"{name.whole('dbias')}={list(dbias.dims)} must equal {name.whole('bias')}={list(bias.dims)}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    require(
        dbias.dtype is bias.dtype,
        f"{name['dbias']}.dtype={dbias.dtype.name} must equal {name['bias']}.dtype={bias.dtype.name}",
    )


# ---- ragged and paged layouts: the host checks of their values, and the reference through padding ----


def host_values(bound: Bound) -> np.ndarray:
    """A bound array's values on the host as int64 (a device tensor is copied: a synchronisation)."""
    view = bound.view
    if not isinstance(view, np.ndarray):
        view = view.detach().cpu().numpy()
    return np.asarray(view, np.int64)


def check_layout_values(problem: AttentionProblem, t: AttentionTensors, names: SlotNames) -> None:
    """Refuse ragged offsets and block tables whose values would read or write outside the tensors,
    before any kernel runs: offsets that start below 0, decrease, end elsewhere than the packed
    tokens or hold a sequence longer than its max_seqlen; a needed block number outside the cache.
    Offsets on a device are not read here (that would wait for the device): the kernels clamp each
    sequence into the packed tokens (``triton_tiles.packed_sequence``), so wrong ones give wrong
    rows, never a read or write outside the tensors.

    Raises:
        BadParam: naming the offsets or the block table (as the caller's array is named), the place
            and the rule.
    """
    if t.ragged_offsets_q is not None and t.ragged_offsets_kv is not None:
        sides = (
            (t.ragged_offsets_q, "q", problem.q.dims[2], "max_seqlen_q", problem.max_seqlen_q),
            (t.ragged_offsets_kv, "k", problem.k.dims[2], "max_seqlen_kv", problem.max_seqlen_kv),
        )
        for bound, tensor, total, max_slot, longest in sides:
            if bound.device != CPU:  # the kernels clamp them (docstring)
                continue
            total_text = f"{names.dim(tensor, 2)}={total}"
            _check_offsets(bound.name, host_values(bound), total_text, total, names[max_slot], longest)
    if t.block_table is not None:
        table = host_values(t.block_table)
        block_size, blocks = problem.k.dims[2], problem.k.dims[0]
        lens = np.full(problem.batch, problem.seq_kv)
        if t.seq_lens_kv is not None:
            lens = np.clip(host_values(t.seq_lens_kv), 0, problem.seq_kv)
        needed = np.arange(table.shape[1])[None, :] < -(-lens[:, None] // block_size)
        bad = np.argwhere(needed & ((table < 0) | (table >= blocks)))
        if bad.size:
            b, j = bad[0]
            raise BadParam(
                f"{t.block_table.name}[{b}, {j}]={table[b, j]} must be a block of {names['k']}, from 0 to "
                f"{names.dim('k', 0)} - 1 = {blocks - 1} (sequence {b} needs {int(-(-lens[b] // block_size))} blocks)"
            )


def _check_offsets(name: str, offsets: np.ndarray, total_text: str, total: int, max_name: str, longest: int) -> None:
    if offsets[0] < 0:
        raise BadParam(f"{name}[0]={offsets[0]} must be at least 0")
    steps = np.diff(offsets)
    if (steps < 0).any():
        i = int(np.flatnonzero(steps < 0)[0])
        raise BadParam(
            f"{name}[{i + 1}]={offsets[i + 1]} must be at least {name}[{i}]={offsets[i]} (offsets never decrease)"
        )
    if offsets[-1] != total:
        raise BadParam(f"{name}[{len(offsets) - 1}]={offsets[-1]} must equal the packed tokens, {total_text}")
    if steps.max() > longest:
        i = int(np.argmax(steps))
        raise BadParam(f"{max_name}={longest} must be at least {steps[i]}, the length of sequence {i} in {name}")
