"""Scaled dot-product attention (cuDNN's SDPA forward and backward): the parameters, the shape and
dtype rules, and the float64 NumPy reference.

Tensors have dims (batch B, heads H, sequence S, head dim D) with any strides, so BSHD, BHSD and
packed QKV buffers are all just strides: q (B, Hq, Sq, D), k (B, Hkv, Skv, D), v (B, Hkv, Skv, Dv),
o (B, Hq, Sq, Dv). Query head h reads key/value head ``h // (Hq / Hkv)`` (grouped-query attention;
Hkv = 1 is multi-query attention). For each batch b, query head h, query i and key j:

    s[i, j] = scale * q[i] . k[j]                              (scale defaults to 1 / sqrt(D))
    s       = softcap * tanh(s / softcap)                      (when softcap is set)
    s       = s + bias[i, j]                                   (a float bias; broadcast over size-1 dims)
    s       = s - alibi_slopes[h] * |j - (i + shift)|          (ALiBi: the distance to the diagonal)
    s[i, j] = -inf where key j does not take part (the masks below, or a BOOLEAN bias that is False)
    lse[i]  = log(sum_j exp(s[i, j]) + exp(sinks[h]))          (the saved stats; no sink term without sinks)
    p       = exp(s - lse)
    o[i]    = sum_j p[i, j] * keep[i, j] / (1 - dropout_p) * v[j]

ALiBi slopes are per query head, (Hq,) or (B, Hq) (FlashAttention's ``alibi_slopes``), and the
distance is measured from the mask's diagonal ``i + shift`` (below): with BOTTOM_RIGHT alignment it
is FlashAttention's ``-slope * |i + Skv - Sq - j|``, causal or not. An attention sink is one logit
per query head (Hq,) that joins every row's softmax denominator and takes no value (gpt-oss's sinks):
a row's weights sum to less than 1, and a row with no key has lse = sinks[h] and o = 0.

Masks. With ``len_q = seq_lens_q[b]`` and ``len_kv = seq_lens_kv[b]`` (clamped to 0..Sq and 0..Skv;
Sq and Skv when absent) and ``shift = len_kv - len_q`` for BOTTOM_RIGHT alignment, 0 for TOP_LEFT,
key j takes part for query i when ``i < len_q``, ``j < len_kv`` and, for a window (left, right),
``i + shift - left <= j <= i + shift + right`` (None: unbounded on that side). Causal is the right
bound 0: TOP_LEFT is torch's ``is_causal`` (query i sees keys 0..i), BOTTOM_RIGHT aligns the last
query with the last key (FlashAttention's causal when Sq != Skv, and cuDNN's bottom-right mask).

Rows with no key taking part (padding rows past len_q included) give o = 0 and lse = -inf, and no
gradient flows through them: FlashAttention's convention, and torch's SDPA on the CPU, which returns
0 for a fully masked row too (also through the NaN-free path of a float mask of -inf).

Dropout keeps element (b, h, i, j) when ``u >= dropout_p``, where u is the uniform float32 that
Triton's ``tl.rand(seed, counter)`` gives (Philox 4x32 with 10 rounds) for the counter
``offset + ((b * Hq + h) * Sq + i) * Skv + j``: the kernels regenerate the mask in the backward, and
``philox_uniform`` here computes the same numbers bit for bit.

Backward, from dO (dims of o) with ``d = keep / (1 - dropout_p)``:

    dV[j]  = sum_i p[i, j] * d[i, j] * dO[i]        dP[i, j] = d[i, j] * dO[i] . v[j]
    dS     = p * (dP - delta),  delta[i] = sum_j p[i, j] * dP[i, j] = dO[i] . o[i]
    dBias  = dS summed over the dims the bias broadcasts
    dS'    = dS * (1 - tanh^2)                      (through the softcap, when set)
    dQ[i]  = scale * sum_j dS'[i, j] * k[j]         dK[j] = scale * sum_i dS'[i, j] * q[i]
    dSinks[h] = -sum_{b, i} exp(sinks[h] - lse[b, h, i]) * delta[b, h, i]

dK and dV sum over the query heads that share a key/value head. Data in FLOAT, HALF, BFLOAT16 or
DOUBLE (one dtype for q, k, v, o and their gradients); stats in FLOAT (DOUBLE allowed with DOUBLE
data, whose backward needs the extra digits); seq lens INT32 or INT64; ALiBi slopes, sinks and their
gradient in FLOAT or the data dtype. The slopes have no gradient (they are constants in ALiBi).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status, require
from opendnn.core.memo import cached_hash, memoized

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256  # the head dims the kernels support
MAX_SEED = 2**63 - 1
MAX_OFFSET = 2**62  # counters are offset + element index, and stay below 2**63


class DiagonalAlignment(enum.Enum):
    """Where the causal diagonal and the window sit when Sq != Skv (cuDNN's diagonal alignment)."""

    TOP_LEFT = "top_left"
    BOTTOM_RIGHT = "bottom_right"


@dataclass(frozen=True)
class AttentionDescriptor:
    """The parameters of an attention, without the tensors (cuDNN's SDPA attributes).

    Args:
        scale: what q . k is multiplied by; None for 1 / sqrt(D).
        causal: key j > query i takes no part (the window's right bound 0).
        alignment: DiagonalAlignment of the causal diagonal and the window.
        window: (left, right) keys around the diagonal taking part, each an int >= 0 or None (unbounded).
        softcap: s = softcap * tanh(s / softcap) before the bias; None for none.
        dropout_p: probability of dropping each attention weight, in [0, 1).
        seed: the Philox key, 0 to 2**63 - 1.
        offset: the first Philox counter, 0 to 2**62.

    Raises:
        BadParam: naming the field and the rule it broke.
    """

    scale: float | None = None
    causal: bool = False
    alignment: DiagonalAlignment | str = DiagonalAlignment.TOP_LEFT  # a name becomes its DiagonalAlignment
    window: tuple[int | None, int | None] = (None, None)
    softcap: float | None = None
    dropout_p: float = 0.0
    seed: int = 0
    offset: int = 0

    def __post_init__(self) -> None:
        if self.scale is not None and not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)):
            raise BadParam(f"scale={self.scale!r} must be a finite number or None")
        if not isinstance(self.causal, bool):
            raise BadParam(f"causal={self.causal!r} must be a bool")
        alignments = [a.value for a in DiagonalAlignment]
        if not (isinstance(self.alignment, DiagonalAlignment) or self.alignment in alignments):
            raise BadParam(f"alignment={self.alignment!r} must be a DiagonalAlignment (TOP_LEFT or BOTTOM_RIGHT)")
        object.__setattr__(self, "alignment", DiagonalAlignment(self.alignment))
        window = self.window
        if not (
            isinstance(window, (tuple, list))
            and len(window) == 2
            and all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 0) for b in window)
        ):
            raise BadParam(f"window={window!r} must be a pair (left, right), each an int at least 0 or None")
        object.__setattr__(self, "window", tuple(window))
        if self.softcap is not None and not (isinstance(self.softcap, (int, float)) and 0 < self.softcap < math.inf):
            raise BadParam(f"softcap={self.softcap!r} must be positive and finite, or None")
        if not (isinstance(self.dropout_p, (int, float)) and 0.0 <= self.dropout_p < 1.0):
            raise BadParam(f"dropout_p={self.dropout_p!r} must be at least 0 and below 1")
        for name, value, limit, text in (
            ("seed", self.seed, MAX_SEED, "2**63 - 1"),
            ("offset", self.offset, MAX_OFFSET, "2**62"),
        ):
            if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= limit):
                raise BadParam(f"{name}={value!r} must be an int from 0 to {text}")
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "offset", int(self.offset))

    @property
    def band(self) -> tuple[int | None, int | None]:
        """(left, right) bounds around the diagonal, causal folded in (right at most 0)."""
        left, right = self.window
        if self.causal:
            right = 0
        return left, right

    def resolved_scale(self, head_dim: int) -> float:
        return float(self.scale) if self.scale is not None else 1.0 / math.sqrt(head_dim)


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


SLOTS = AttentionTensors._fields
# the caller's name of each slot in the errors; the cuDNN-shaped calls name descriptors
API_NAMES = (
    ("params", "attn_desc"),
    *((slot, f"{slot}_desc") for slot in SLOTS),
    ("max_seqlen_q", "max_seqlen_q"),
    ("max_seqlen_kv", "max_seqlen_kv"),
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
    max_seqlen_q: int | None = None,
    max_seqlen_kv: int | None = None,
    names: tuple[tuple[str, str], ...] = API_NAMES,
    allow_tf32: bool = False,
) -> AttentionProblem:
    """The shape and dtype rules of every attention call; a backward when ``do`` is given.

    Ragged (packed) sequences: with ``ragged_offsets_q`` and ``ragged_offsets_kv`` ((B + 1,) token
    offsets, FlashAttention's cu_seqlens), q, o, do, dq and stats are the packed query tokens
    (1, Hq, total_q, ...), k, v, dk and dv the packed key tokens (1, Hkv, total_kv, ...), and
    ``max_seqlen_q`` / ``max_seqlen_kv`` (default: the totals) bound the sequences' lengths.
    Paged K/V (a forward): with ``block_table`` (B, max blocks), k and v are caches of dims
    (num blocks, Hkv, block size, D) and key j of batch b lives in block ``block_table[b, j // block
    size]``, row ``j % block size``.

    Args:
        names: (slot, the caller's name) pairs for the messages: "params", every AttentionTensors
            field, "max_seqlen_q" and "max_seqlen_kv".

    Raises:
        BadParam: naming the descriptor: not 4 dims, dims that disagree (batch, heads, sequence,
            head dim), query heads not a multiple of key/value heads, dtypes that differ, stats,
            bias, seq lens, ALiBi slopes, sinks, offsets, block table or gradients of the wrong
            dims or dtype, a tensor the backward needs missing.
        NotSupported: a non-float dtype, a head dim outside 8..256, the gradient of a BOOLEAN mask,
            ragged offsets with a bias, sequence lengths or a block table, the backward through
            paged K/V.
    """
    name = dict(names)
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
        q.dtype.is_floating,
        f"{name['q']}.dtype={q.dtype.name} must be FLOAT, DOUBLE, HALF or BFLOAT16",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    for slot, desc in data.items():
        require(
            desc.dtype is q.dtype, f"{name[slot]}.dtype={desc.dtype.name} must equal {name['q']}.dtype={q.dtype.name}"
        )
    heads_q, head_dim = q.dims[1], q.dims[3]
    heads_kv, value_dim = k.dims[1], v.dims[3]
    layout = _check_layout(name, descs, max_seqlen_q, max_seqlen_kv)
    batch, seq_kv = layout[0], layout[2]
    _check_dims(name, "k", k, [None if block_table is not None else ("q", 0), None, None, ("q", 3)], data)
    _check_dims(name, "v", v, [("k", 0), ("k", 1), ("k", 2), None], data)
    require(
        heads_q % heads_kv == 0,
        f"{name['q']}.dims[1]={heads_q} must be a multiple of "
        f"{name['k']}.dims[1]={heads_kv} (query heads per key/value head)",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for slot, dim in (("q", head_dim), ("v", value_dim)):
        require(
            MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM,
            f"{name[slot]}.dims[3]={dim} must be between {MIN_HEAD_DIM} "
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
                f"{name[slot]}.dims={list(lens.dims)} must be [{batch}] (one length per batch of {name['q']})",
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
            f"{name['dsinks']} of dims {list(dsinks.dims)} and dtype {dsinks.dtype.name} must have "
            f"{name['sinks']}'s dims {list(sinks.dims)} and dtype {sinks.dtype.name}",
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
    name: dict[str, str],
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
            f"{name['block_table']}.dims={list(table.dims)} must be [{q.dims[0]}, blocks per sequence] "
            f"(one row per batch of {name['q']})",
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
            desc.ndim == 1 and desc.dims[0] >= 2 and desc.dims == first.dims,
            f"{name[slot]}.dims={list(desc.dims)} must be [batch + 1] of at least 2, the same for both sides "
            f"({name['ragged_offsets_q']}.dims={list(first.dims)})",
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
            f"{name[slot]}.dims[0]={descs[slot].dims[0]} must be 1 with ragged offsets "  # type: ignore[union-attr]
            "(the packed tokens of every sequence along dims[2])",
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


def _check_per_head(
    name: dict[str, str], slot: str, desc: TensorDescriptor, q: TensorDescriptor, shapes: tuple[tuple[int, ...], ...]
) -> None:
    """ALiBi slopes and sinks: one number per query head (slopes: per batch too), FLOAT or q's dtype."""
    require(
        desc.dims in shapes,
        f"{name[slot]}.dims={list(desc.dims)} must be {' or '.join(str(list(shape)) for shape in shapes)} "
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
    name: dict[str, str],
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
                f"{name[slot]}.dims[{d}]={desc.dims[d]} must equal {name[source[0]]}.dims[{source[1]}]={expected}",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )


def _check_stats(name: dict[str, str], stats: TensorDescriptor, q: TensorDescriptor) -> None:
    require(
        stats.dims == q.dims[:3],
        f"{name['stats']}.dims={list(stats.dims)} must be {list(q.dims[:3])} (batch, heads, sequence of {name['q']})",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    allowed = (DataType.FLOAT, DataType.DOUBLE) if q.dtype is DataType.DOUBLE else (DataType.FLOAT,)
    require(
        stats.dtype in allowed,
        f"{name['stats']}.dtype={stats.dtype.name} must be "
        f"{' or '.join(t.name for t in allowed)} for {name['q']}.dtype={q.dtype.name}",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def _check_bias(name: dict[str, str], bias: TensorDescriptor, q: TensorDescriptor, seq_kv: int) -> None:
    full = (*q.dims[:3], seq_kv)
    require(
        bias.ndim == 4,
        f"{name['bias']}.ndim={bias.ndim} must be 4 (batch, heads, queries, keys)",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for d, (size, expected) in enumerate(zip(bias.dims, full)):
        if size not in (1, expected):
            sizes = "1" if expected == 1 else f"{expected} or 1"
            raise BadParam(
                f"{name['bias']}.dims[{d}]={size} must be {sizes} (it broadcasts to {list(full)})",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
    require(
        bias.dtype in (q.dtype, DataType.BOOLEAN),
        f"{name['bias']}.dtype={bias.dtype.name} must equal {name['q']}.dtype={q.dtype.name} (added to the "
        "scores) or be BOOLEAN (a mask, True where the key takes part)",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def _check_bias_gradient(name: dict[str, str], dbias: TensorDescriptor, bias: TensorDescriptor | None) -> None:
    require(bias is not None, f"{name['dbias']} is given but {name['bias']}=None", Status.BAD_PARAM_NULL_POINTER)
    assert bias is not None
    if bias.dtype is DataType.BOOLEAN:
        raise NotSupported(f"{name['dbias']}: {name['bias']}.dtype=BOOLEAN is a mask and has no gradient")
    require(
        dbias.dims == bias.dims,
        f"{name['dbias']}.dims={list(dbias.dims)} must equal {name['bias']}.dims={list(bias.dims)}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    require(
        dbias.dtype is bias.dtype,
        f"{name['dbias']}.dtype={dbias.dtype.name} must equal {name['bias']}.dtype={bias.dtype.name}",
    )


# ---- the counter-based generator of the dropout mask ---------------------------------------------

PHILOX_KEY_A, PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUND_A, PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
PHILOX_ROUNDS = 10
UINT32 = np.uint64(0xFFFFFFFF)


def philox_uniform(seed: int, counters: np.ndarray) -> np.ndarray:
    """Triton's ``tl.rand(seed, counters)`` bit for bit: uniform float32 in [0, 1).

    Philox 4x32 with 10 rounds, key (seed low, seed high 32 bits), counter (counter low, counter
    high 32 bits, 0, 0); the first output word, read as an int32 x, becomes ``(x < 0 ? -x - 1 : x)``
    times 4.6566127342e-10 in float32. Words live in uint64 so that 32 x 32-bit products are exact.

    Args:
        counters: non-negative integers below 2**63, any shape.
    """
    counters = np.asarray(counters, np.int64).astype(np.uint64)
    c0, c1 = counters & UINT32, counters >> np.uint64(32)
    c2 = c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for _ in range(PHILOX_ROUNDS):
        product_b, product_a = np.uint64(PHILOX_ROUND_B) * c2, np.uint64(PHILOX_ROUND_A) * c0
        c0, c2 = (product_b >> np.uint64(32)) ^ c1 ^ k0, (product_a >> np.uint64(32)) ^ c3 ^ k1
        c1, c3 = product_b & UINT32, product_a & UINT32
        k0, k1 = (k0 + np.uint64(PHILOX_KEY_A)) & UINT32, (k1 + np.uint64(PHILOX_KEY_B)) & UINT32
    signed = c0.astype(np.int64) - np.where(c0 >= np.uint64(2**31), np.int64(2**32), np.int64(0))
    magnitude = np.where(signed < 0, -signed - 1, signed)
    return magnitude.astype(np.float32) * np.float32(4.6566127342e-10)


def dropout_keep(params: AttentionDescriptor, shape: tuple[int, int, int, int]) -> np.ndarray:
    """The dropout mask of a (B, Hq, Sq, Skv) attention: True where the weight is kept."""
    counters = params.offset + np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    return philox_uniform(params.seed, counters) >= np.float32(params.dropout_p)


# ---- float64 reference ------------------------------------------------------------------------------


def diagonal_offsets(
    params: AttentionDescriptor,
    batch: int,
    seq_q: int,
    seq_kv: int,
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, inside): (B, 1, Sq, Skv) ``j - (i + shift)``, key j's place relative to query i's
    diagonal, and booleans True where query i and key j are inside their lengths."""
    len_q = np.full(batch, seq_q) if seq_lens_q is None else np.clip(np.asarray(seq_lens_q, np.int64), 0, seq_q)
    len_kv = np.full(batch, seq_kv) if seq_lens_kv is None else np.clip(np.asarray(seq_lens_kv, np.int64), 0, seq_kv)
    len_q, len_kv = len_q.reshape(batch, 1, 1, 1), len_kv.reshape(batch, 1, 1, 1)
    i, j = np.arange(seq_q).reshape(1, 1, seq_q, 1), np.arange(seq_kv).reshape(1, 1, 1, seq_kv)
    shift = len_kv - len_q if params.alignment is DiagonalAlignment.BOTTOM_RIGHT else np.zeros_like(len_q)
    return j - (i + shift), (i < len_q) & (j < len_kv)


def allowed_keys(
    params: AttentionDescriptor,
    batch: int,
    seq_q: int,
    seq_kv: int,
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
) -> np.ndarray:
    """(B, 1, Sq, Skv) booleans: True where key j takes part for query i (padding, causal, window)."""
    offsets, allowed = diagonal_offsets(params, batch, seq_q, seq_kv, seq_lens_q, seq_lens_kv)
    left, right = params.band
    if left is not None:
        allowed = allowed & (offsets >= -left)
    if right is not None:
        allowed = allowed & (offsets <= right)
    return allowed


class Extras(NamedTuple):
    """The optional inputs of the reference beyond q, k and v (arrays, or None where absent)."""

    bias: np.ndarray | None = None  # float (added) or boolean (a mask), 4 dims broadcasting to (B, Hq, Sq, Skv)
    seq_lens_q: np.ndarray | None = None
    seq_lens_kv: np.ndarray | None = None
    alibi_slopes: np.ndarray | None = None  # (Hq,) or (B, Hq)
    sinks: np.ndarray | None = None  # (Hq,)


class _Weights(NamedTuple):
    p: np.ndarray  # softmax weights (B, Hq, Sq, Skv), 0 where no key takes part
    dropped: np.ndarray  # p * keep / (1 - dropout_p)
    kept: np.ndarray | None  # keep / (1 - dropout_p), with dropout
    lse: np.ndarray  # (B, Hq, Sq), -inf for rows with no key (and no sink)
    tanh: np.ndarray | None  # tanh(scale * q . k / softcap), when softcapped
    keys: np.ndarray  # k repeated to the query heads
    values: np.ndarray  # v repeated to the query heads


def _weights(params: AttentionDescriptor, q: np.ndarray, k: np.ndarray, v: np.ndarray, extras: Extras) -> _Weights:
    batch, heads_q, seq_q, head_dim = q.shape
    group, seq_kv = heads_q // k.shape[1], k.shape[2]
    keys, values = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    bias = extras.bias
    with np.errstate(all="ignore"):  # masked rows: -inf scores, on purpose
        scores = params.resolved_scale(head_dim) * (q @ keys.swapaxes(-1, -2))
        tanh = None
        if params.softcap is not None:
            tanh = np.tanh(scores / params.softcap)
            scores = params.softcap * tanh
        allowed = allowed_keys(params, batch, seq_q, seq_kv, extras.seq_lens_q, extras.seq_lens_kv)
        if bias is not None and bias.dtype == np.bool_:
            allowed = allowed & bias
        elif bias is not None:
            scores = scores + bias
        if extras.alibi_slopes is not None:
            slopes = np.broadcast_to(extras.alibi_slopes, (batch, heads_q)).reshape(batch, heads_q, 1, 1)
            offsets, _ = diagonal_offsets(params, batch, seq_q, seq_kv, extras.seq_lens_q, extras.seq_lens_kv)
            scores = scores - slopes * np.abs(offsets)
        scores = np.where(allowed, scores, -np.inf)
        top = scores.max(axis=-1, keepdims=True)
        sinks = None
        if extras.sinks is not None:
            sinks = np.broadcast_to(extras.sinks.reshape(1, heads_q, 1, 1), top.shape)
            top = np.maximum(top, sinks)
        shift = np.where(top == -np.inf, 0.0, top)
        exps = np.exp(scores - shift)
        total = exps.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sinks - shift)
        p = exps / np.where(total == 0, 1.0, total)  # rows with no key: 0 (NaN stays NaN)
        lse = np.where(total == 0, -np.inf, top + np.log(total))[..., 0]
    kept = None
    if params.dropout_p > 0:
        kept = dropout_keep(params, (batch, heads_q, seq_q, seq_kv)) / (1.0 - params.dropout_p)
    return _Weights(p, p if kept is None else p * kept, kept, lse, tanh, keys, values)


def reference_forward(
    params: AttentionDescriptor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(o, lse): the forward definition in the inputs' float dtype. ``bias`` is a float array added to
    the scores or a boolean mask, of 4 dims that broadcast to (B, Hq, Sq, Skv)."""
    w = _weights(params, q, k, v, Extras(bias, seq_lens_q, seq_lens_kv, alibi_slopes, sinks))
    return w.dropped @ w.values, w.lse


class Gradients(NamedTuple):
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dbias: np.ndarray | None  # of the bias's dims, for a float bias
    dsinks: np.ndarray | None  # (Hq,), with sinks


def reference_backward(
    params: AttentionDescriptor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    bias: np.ndarray | None = None,
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
) -> Gradients:
    """The backward definition from the inputs and dO (the forward recomputed), under the forward's arguments."""
    extras = Extras(bias, seq_lens_q, seq_lens_kv, alibi_slopes, sinks)
    w = _weights(params, q, k, v, extras)
    batch, heads_kv, seq_kv = k.shape[:3]
    group = q.shape[1] // heads_kv
    dp = do @ w.values.swapaxes(-1, -2)
    if w.kept is not None:
        dp = dp * w.kept
    delta = (w.p * dp).sum(axis=-1, keepdims=True)
    ds = w.p * (dp - delta)
    dbias, dsinks = None, None
    if bias is not None and bias.dtype != np.bool_:
        broadcast = tuple(d for d in range(4) if bias.shape[d] == 1 and ds.shape[d] != 1)
        dbias = ds.sum(axis=broadcast, keepdims=True) if broadcast else ds
    if extras.sinks is not None:
        with np.errstate(over="ignore"):
            sink_weights = np.exp(extras.sinks.reshape(1, -1, 1) - w.lse)
        dsinks = -(sink_weights * delta[..., 0]).sum(axis=(0, 2))
    if w.tanh is not None:
        ds = ds * (1.0 - w.tanh**2)
    scale = params.resolved_scale(q.shape[3])
    dq = scale * (ds @ w.keys)
    dk = (scale * (ds.swapaxes(-1, -2) @ q)).reshape(batch, heads_kv, group, seq_kv, -1).sum(axis=2)
    dv = (w.dropped.swapaxes(-1, -2) @ do).reshape(batch, heads_kv, group, seq_kv, -1).sum(axis=2)
    return Gradients(dq, dk, dv, dbias, dsinks)


# ---- ragged and paged layouts: the host checks of their values, and the reference through padding ----


def host_values(bound: Bound) -> np.ndarray:
    """A bound array's values on the host as int64 (a device tensor is copied: a synchronisation)."""
    view = bound.view
    if not isinstance(view, np.ndarray):
        view = view.detach().cpu().numpy()
    return np.asarray(view, np.int64)


def check_layout_values(problem: AttentionProblem, t: AttentionTensors, names: tuple[tuple[str, str], ...]) -> None:
    """Refuse ragged offsets and block tables whose values would read or write outside the tensors,
    before any kernel runs: offsets that start below 0, decrease, end elsewhere than the packed
    tokens or hold a sequence longer than its max_seqlen; a needed block number outside the cache.

    Raises:
        BadParam: naming the offsets or the block table, the place and the rule.
    """
    name = dict(names)
    if t.ragged_offsets_q is not None and t.ragged_offsets_kv is not None:
        sides = (
            ("ragged_offsets_q", t.ragged_offsets_q, "q", problem.q.dims[2], "max_seqlen_q", problem.max_seqlen_q),
            ("ragged_offsets_kv", t.ragged_offsets_kv, "k", problem.k.dims[2], "max_seqlen_kv", problem.max_seqlen_kv),
        )
        for slot, bound, tensor, total, max_slot, longest in sides:
            _check_offsets(
                name[slot], host_values(bound), f"{name[tensor]}.dims[2]={total}", total, name[max_slot], longest
            )
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
                f"{name['block_table']}[{b}, {j}]={table[b, j]} must be a block of {name['k']} "
                f"(0 to {blocks - 1}): sequence {b} needs {int(-(-lens[b] // block_size))} blocks"
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


def padded(packed: np.ndarray, offsets: np.ndarray, length: int) -> np.ndarray:
    """(1, H, T, ...) packed sequences as (B, H, length, ...), zeros past each sequence's end."""
    result = np.zeros((len(offsets) - 1, packed.shape[1], length, *packed.shape[3:]), packed.dtype)
    for b, (start, stop) in enumerate(zip(offsets[:-1], offsets[1:])):
        result[b, :, : stop - start] = packed[0, :, start:stop]
    return result


def packed(padded_rows: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The inverse of ``padded``: the rows of each sequence, concatenated as (1, H, T, ...)."""
    rows = [padded_rows[b, :, : stop - start] for b, (start, stop) in enumerate(zip(offsets[:-1], offsets[1:]))]
    return np.concatenate(rows, axis=1)[None]


def ragged_reference(
    params: AttentionDescriptor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    offsets_q: np.ndarray,
    offsets_kv: np.ndarray,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    do: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray | None, ...]:
    """The reference of packed sequences (q, k, v, do of dims (1, H, T, D)): each sequence padded to
    its max_seqlen, computed as a batch with its lengths (so sequence b is batch b of the dropout
    counters and of (B, Hq) ALiBi slopes), and packed again. (o, lse) without ``do``; with it the
    Gradients, dq, dk and dv packed."""
    offsets_q, offsets_kv = np.asarray(offsets_q, np.int64), np.asarray(offsets_kv, np.int64)
    lens = (np.diff(offsets_q), np.diff(offsets_kv))
    q_rows, do_rows = (None if x is None else padded(x, offsets_q, max_seqlen_q) for x in (q, do))
    k_rows, v_rows = (padded(x, offsets_kv, max_seqlen_kv) for x in (k, v))
    assert q_rows is not None
    if do_rows is None:
        o, lse = reference_forward(params, q_rows, k_rows, v_rows, None, *lens, alibi_slopes, sinks)
        return packed(o, offsets_q), packed(lse[..., None], offsets_q)[..., 0]
    grads = reference_backward(params, q_rows, k_rows, v_rows, do_rows, None, *lens, alibi_slopes, sinks)
    return Gradients(
        packed(grads.dq, offsets_q), packed(grads.dk, offsets_kv), packed(grads.dv, offsets_kv), None, grads.dsinks
    )


def gathered(cache: np.ndarray, block_table: np.ndarray, seq_lens_kv: np.ndarray | None) -> np.ndarray:
    """A paged cache (num blocks, H, block size, D) as (B, H, blocks per sequence * block size, D):
    sequence b's blocks in table order, zeros past its length (the table entries there unread, the
    cache rows there never used)."""
    batch, blocks = block_table.shape
    block_size = cache.shape[2]
    lens = np.full(batch, blocks * block_size) if seq_lens_kv is None else np.asarray(seq_lens_kv, np.int64)
    result = np.zeros((batch, cache.shape[1], blocks * block_size, cache.shape[3]), cache.dtype)
    for b in range(batch):
        for j in range(min(blocks, -(-int(lens[b]) // block_size))):
            result[b, :, j * block_size : (j + 1) * block_size] = cache[block_table[b, j]]
        result[b, :, max(int(lens[b]), 0) :] = 0
    return result
