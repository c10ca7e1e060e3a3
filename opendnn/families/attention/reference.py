"""Scaled dot-product attention's float64 NumPy reference: the definition every backend is checked
against, the dropout mask's counter-based generator, and packed (ragged) and paged sequences
computed through their padded form.

q (B, Hq, Sq, D), k (B, Hkv, Skv, D), v (B, Hkv, Skv, Dv), o (B, Hq, Sq, Dv); the dims and dtypes
a call may take are ``problem``'s rules. Query head h reads key/value head ``h // (Hq / Hkv)``
(grouped-query attention; Hkv = 1 is multi-query attention). For each batch b, query head h,
query i and key j:

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

dK and dV sum over the query heads that share a key/value head. The ALiBi slopes have no gradient
(they are constants in ALiBi).

fp8 forward (cuDNN's fp8 SDPA): q, k and v are fp8 values with per-tensor float32 factors, and P is
rounded to q's fp8 type before its product with v. With ``M`` each row's largest score in log2 units
rounded up to a whole number (``M = ceil(max_j s[i, j] * log2(e))``):

    s      = scale * descale_q * descale_k * q . k          (then the masks, as above)
    e[j]   = exp2(s[j] * log2(e) - M),  l = sum_j e[j]      (P = e / l, lse = M * ln(2) + log(l))
    o_raw  = (sum_j fp8(e[j] * scale_s) * v[j]) / l * descale_s * descale_v
    amax_s = max over every row of max_j P[j]               (the softmax before scale_s)
    amax_o = max |o_raw|                                    (before scale_o)
    o      = o_raw * scale_o, rounded to o's dtype

``fp8(x)`` rounds to nearest even and saturates at the type's largest finite value (the GPU's
``cvt.rn.satfinite``), for P and for an fp8 o. P is rounded before its division by l, which a
one-pass kernel does not know until its last key block; ``M`` a whole number makes the kernel's
rescaling of earlier blocks (by powers of two) commute with that rounding, so the kernel rounds the
same numbers as this definition. cuDNN's graph writes the rounding after the division: the two
differ by one fp8 rounding of each weight, and agree exactly where the rounding is exact.

fp8 backward (cuDNN's fp8 SDPA backward): q, k, v, o and dO are fp8 values (o may be BFLOAT16 or
HALF, dO of either fp8 type), stats the forward's lse, and P = exp(s - lse) with s as above (the softmax of s). P and
dS are rounded where cuDNN's graph rounds them, P to q's type and dS to dO's:

    delta  = sum_d dO * o * descale_dO * descale_o                  (per query row)
    dV_raw = (sum_i fp8(P * scale_s)[i] * dO[i]) * descale_s * descale_dO
    dP     = (dO . v) * descale_dO * descale_v
    dS     = scale * P * (dP - delta)                 amax_dP = max |dS|
    dQ_raw = (sum_j fp8(dS * scale_dP)[j] * k[j]) * descale_dP * descale_k
    dK_raw = (sum_i fp8(dS * scale_dP)[i] * q[i]) * descale_dP * descale_q
    dX     = dX_raw * scale_dX, rounded to dX's dtype  amax_dX = max |dX_raw|   (X: Q, K, V)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from opendnn.core.dtypes import DataType
from opendnn.families.attention.descriptor import AttentionDescriptor, DiagonalAlignment
from opendnn.families.matmul.problem import float_to_fp8, fp8_table, fp8_to_float64

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
    top: np.ndarray  # (B, Hq, Sq, 1): each row's largest score (or sink), -inf for rows with none
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
    return _Weights(p, p if kept is None else p * kept, kept, lse, top, tanh, keys, values)


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


class Fp8Scales(NamedTuple):
    """The per-tensor factors of an fp8 forward (cuDNN's fp8 SDPA inputs)."""

    descale_q: float
    descale_k: float
    descale_v: float
    descale_s: float
    scale_s: float
    scale_o: float


class Fp8Forward(NamedTuple):
    o: np.ndarray  # o_raw * scale_o, rounded to o's dtype when that is fp8
    lse: np.ndarray
    amax_s: float
    amax_o: float


def saturated_fp8(values: np.ndarray, dtype: DataType) -> np.ndarray:
    """``values`` rounded to the fp8 ``dtype`` (to nearest even, saturating at its largest finite
    value), as float64."""
    positive = fp8_table(dtype)[:128]
    largest = float(positive[np.isfinite(positive)].max())
    return fp8_to_float64(float_to_fp8(np.clip(values, -largest, largest), dtype), dtype)


def reference_forward_fp8(
    params: AttentionDescriptor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scales: Fp8Scales,
    data_dtype: DataType,
    out_dtype: DataType,
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
) -> Fp8Forward:
    """The fp8 forward definition (the module's docstring) in float64: q, k and v are the fp8
    values of ``data_dtype``, P is rounded to it, o to ``out_dtype`` when that is fp8."""
    descaled = q * (scales.descale_q * scales.descale_k)
    w = _weights(params, descaled, k, v, Extras(seq_lens_q=seq_lens_q, seq_lens_kv=seq_lens_kv))
    with np.errstate(invalid="ignore", divide="ignore"):
        whole = np.where(w.top == -np.inf, 0.0, np.ceil(w.top / math.log(2.0)))  # M, log2 units
        total = np.exp(w.lse[..., None] - whole * math.log(2.0))  # l; 0 for rows with no key
        rounded = saturated_fp8(w.p * total * scales.scale_s, data_dtype)
        o_raw = (rounded @ w.values) / np.where(total == 0, 1.0, total) * (scales.descale_s * scales.descale_v)
    o = o_raw * scales.scale_o
    if out_dtype.is_fp8:
        o = saturated_fp8(o, out_dtype)
    return Fp8Forward(o, w.lse, float(w.p.max(initial=0.0)), float(np.abs(o_raw).max(initial=0.0)))


class Fp8BackwardScales(NamedTuple):
    """The per-tensor factors of an fp8 backward (cuDNN's fp8 SDPA backward inputs)."""

    descale_q: float
    descale_k: float
    descale_v: float
    descale_o: float
    descale_do: float
    descale_s: float
    descale_dp: float
    scale_s: float
    scale_dq: float
    scale_dk: float
    scale_dv: float
    scale_dp: float


class Fp8Backward(NamedTuple):
    dq: np.ndarray  # dQ_raw * scale_dQ, rounded to dq's dtype when that is fp8; dk, dv the same
    dk: np.ndarray
    dv: np.ndarray
    amax_dq: float
    amax_dk: float
    amax_dv: float
    amax_dp: float


def reference_backward_fp8(
    params: AttentionDescriptor,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    o: np.ndarray,
    do: np.ndarray,
    scales: Fp8BackwardScales,
    dtypes: tuple[DataType, DataType, DataType, DataType, DataType],
    seq_lens_q: np.ndarray | None = None,
    seq_lens_kv: np.ndarray | None = None,
) -> Fp8Backward:
    """The fp8 backward definition (the module's docstring) in float64 from the fp8 values of q, k,
    v, o and dO (the forward recomputed, as ``reference_backward``); ``dtypes``: those of (q, dO,
    dq, dk, dv)."""
    data_dtype, grad_dtype, *out_dtypes = dtypes
    batch, heads_kv, seq_kv = k.shape[:3]
    group = q.shape[1] // heads_kv
    descaled = q * (scales.descale_q * scales.descale_k)
    w = _weights(params, descaled, k, v, Extras(seq_lens_q=seq_lens_q, seq_lens_kv=seq_lens_kv))
    p = w.p
    delta = (do * o).sum(axis=-1, keepdims=True) * (scales.descale_do * scales.descale_o)
    dp = (do @ w.values.swapaxes(-1, -2)) * (scales.descale_do * scales.descale_v)
    ds = params.resolved_scale(q.shape[3]) * p * (dp - delta)
    rounded_p = saturated_fp8(p * scales.scale_s, data_dtype)
    rounded_ds = saturated_fp8(ds * scales.scale_dp, grad_dtype)

    def per_kv_head(x: np.ndarray) -> np.ndarray:
        return x.reshape(batch, heads_kv, group, seq_kv, -1).sum(axis=2)

    raw = (
        (rounded_ds @ w.keys) * (scales.descale_dp * scales.descale_k),
        per_kv_head(rounded_ds.swapaxes(-1, -2) @ q) * (scales.descale_dp * scales.descale_q),
        per_kv_head(rounded_p.swapaxes(-1, -2) @ do) * (scales.descale_s * scales.descale_do),
    )
    dq, dk, dv = (
        saturated_fp8(gradient * factor, dtype) if dtype.is_fp8 else gradient * factor
        for gradient, factor, dtype in zip(raw, (scales.scale_dq, scales.scale_dk, scales.scale_dv), out_dtypes)
    )
    amax_dq, amax_dk, amax_dv, amax_dp = (float(np.abs(x).max(initial=0.0)) for x in (*raw, ds))
    return Fp8Backward(dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp)


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


# ---- ragged and paged layouts through padding ------------------------------------------------------


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
