"""The pieces every attention kernel shares: loading a tile through any strides (or through a
block table, for paged K/V), the sequence lengths and starts (ragged sequences), the ranges of
blocks a mask leaves, a tile of scores (scale, softcap, bias, ALiBi, masks) and the dropout mask.

Ragged (packed) sequences: with RAGGED the kernels' ``seq_lens_*_ptr`` point at the (B + 1) token
offsets of each side (FlashAttention's cu_seqlens), every tensor's batch stride is 0, and sequence
b starts ``offsets[b]`` rows down its tensors' sequence dim: a per-batch base, no padding copies.
Loads and stores stop at the sequence's own length (the next sequence's rows follow it).

A tile is BLOCK_M queries (rows ``i``) x BLOCK_N keys (columns ``j``) of one batch ``b`` and query
head ``h``. Masks follow ``opendnn.families.attention.reference``: with ``shift`` the diagonal's offset
(``len_kv - len_q`` for BOTTOM_RIGHT, else 0), key j takes part for query i when ``i < len_q``,
``j < len_kv`` and ``i + shift - left <= j <= i + shift + right``. Scores of keys that take no part
are -inf; the softmax turns them into 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)


@triton.jit
def load_rows(ptr, row_offsets, columns, column_stride, row_mask, column_limit, other):
    """Elements [rows, columns] at ``row_offsets[r] + columns * column_stride``; ``other`` where
    ``row_mask`` is False or a column is past its limit."""
    offsets = row_offsets[:, None] + columns[None, :] * column_stride
    mask = row_mask[:, None] & (columns < column_limit)[None, :]
    return tl.load(ptr + offsets, mask=mask, other=other)


@triton.jit
def load_tile(ptr, base, rows, columns, strides, row_limit, column_limit, other):
    """Elements [rows, columns] of the 2-D slice at ``base`` (offsets rows * strides[0] + columns *
    strides[1]); ``other`` where a row or column is past its limit."""
    return load_rows(
        ptr, base + rows.to(tl.int64) * strides[0], columns, strides[1], rows < row_limit, column_limit, other
    )


@triton.jit
def paged_rows(block_table_ptr, block_table_strides, b, kv_head, columns, len_kv, block_size, strides):
    """The offsets of keys ``columns`` of batch b and key/value head kv_head in a paged cache of
    (block, head, row in block, D) strides: block ``block_table[b, j // block_size]``, row
    ``j % block_size``. Keys past len_kv read no table entry (their row offset is 0, masked)."""
    table = block_table_ptr + b.to(tl.int64) * block_table_strides[0]
    blocks = tl.load(table + (columns // block_size) * block_table_strides[1], mask=columns < len_kv, other=0)
    return blocks.to(tl.int64) * strides[0] + kv_head.to(tl.int64) * strides[1] + (columns % block_size) * strides[2]


@triton.jit
def store_tile(ptr, base, rows, columns, strides, row_limit, column_limit, values):
    offsets = base + rows.to(tl.int64)[:, None] * strides[0] + columns[None, :] * strides[1]
    mask = (rows < row_limit)[:, None] & (columns < column_limit)[None, :]
    tl.store(ptr + offsets, values.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def head_base(b, h, strides, start):
    """The offset of (batch b, head h) in a (B, H, S, D) tensor, in 64 bits; ``start`` rows down
    the sequence dim (a ragged sequence's first token; 0 otherwise)."""
    return b.to(tl.int64) * strides[0] + h.to(tl.int64) * strides[1] + tl.cast(start, tl.int64) * strides[2]


@triton.jit
def sequence_lengths(
    b,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    seq_lens_strides,
    seq_q,
    seq_kv,
    HAS_LENS_Q: tl.constexpr,
    HAS_LENS_KV: tl.constexpr,
    RAGGED: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
):
    """(len_q, len_kv, shift, start_q, start_kv, limit_q, limit_kv) of batch b: the lengths clamped
    to 0..Sq and 0..Skv, the diagonal's shift, the first row of the sequence in its tensors (RAGGED;
    else 0), and the rows its loads and stores stop at (the lengths with RAGGED, else Sq and Skv:
    padding rows are written too)."""
    len_q = seq_q
    len_kv = seq_kv
    start_q = 0
    start_kv = 0
    if RAGGED:
        start_q = tl.load(seq_lens_q_ptr + b.to(tl.int64) * seq_lens_strides[0]).to(tl.int32)
        stop = tl.load(seq_lens_q_ptr + (b + 1).to(tl.int64) * seq_lens_strides[0]).to(tl.int32)
        len_q = tl.minimum(tl.maximum(stop - start_q, 0), seq_q)
        start_kv = tl.load(seq_lens_kv_ptr + b.to(tl.int64) * seq_lens_strides[1]).to(tl.int32)
        stop = tl.load(seq_lens_kv_ptr + (b + 1).to(tl.int64) * seq_lens_strides[1]).to(tl.int32)
        len_kv = tl.minimum(tl.maximum(stop - start_kv, 0), seq_kv)
    if HAS_LENS_Q:
        length = tl.load(seq_lens_q_ptr + b.to(tl.int64) * seq_lens_strides[0])
        len_q = tl.minimum(tl.maximum(length, 0), seq_q).to(tl.int32)
    if HAS_LENS_KV:
        length = tl.load(seq_lens_kv_ptr + b.to(tl.int64) * seq_lens_strides[1])
        len_kv = tl.minimum(tl.maximum(length, 0), seq_kv).to(tl.int32)
    shift = 0
    if BOTTOM_RIGHT:
        shift = len_kv - len_q
    limit_q = seq_q
    limit_kv = seq_kv
    if RAGGED:
        limit_q = len_q
        limit_kv = len_kv
    return len_q, len_kv, shift, start_q, start_kv, limit_q, limit_kv


@triton.jit
def key_range(
    start_m,
    len_q,
    len_kv,
    shift,
    left,
    right,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """[lo, hi): the keys that queries start_m .. start_m + BLOCK_M - 1 may see, lo a multiple of BLOCK_N."""
    lo = 0
    hi = len_kv
    if HAS_LEFT:
        lo = tl.maximum(start_m + shift - left, 0)
    if HAS_RIGHT:
        hi = tl.minimum(hi, start_m + BLOCK_M + shift + right)
    hi = tl.where(start_m >= len_q, 0, hi)  # padding rows only: nothing
    return lo // BLOCK_N * BLOCK_N, hi


@triton.jit
def query_range(
    start_n,
    len_q,
    len_kv,
    shift,
    left,
    right,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """[lo, hi): the queries that see any of keys start_n .. start_n + BLOCK_N - 1, lo a multiple of BLOCK_M."""
    lo = 0
    hi = len_q
    if HAS_RIGHT:
        lo = tl.maximum(start_n - shift - right, 0)
    if HAS_LEFT:
        hi = tl.minimum(hi, start_n + BLOCK_N - shift + left)
    hi = tl.where(start_n >= len_kv, 0, hi)  # padding keys only: nothing
    return lo // BLOCK_M * BLOCK_M, hi


@triton.jit
def compute_scalar(value, COMPUTE: tl.constexpr):
    """A float argument in the COMPUTE dtype, as a 1-element tensor (Triton's interpreter rounds
    tl.cast of a float argument through float32; tl.full keeps its float64 digits)."""
    return tl.full((1,), value, COMPUTE)


@triton.jit
def tanh_of(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflowing to inf gives 1)."""
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def tile_scores(
    q,
    k,
    rows,
    columns,
    b,
    h,
    bias_ptr,
    bias_strides,
    seq_q,
    seq_kv,
    len_q,
    len_kv,
    shift,
    left,
    right,
    scale,
    softcap,
    slope,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BIAS_ADD: tl.constexpr,
    BIAS_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """(s, t): the tile's scores, -inf where the key takes no part, and tanh of the capped scores
    (the softcap's derivative needs it; s itself without a softcap). ``scale`` and ``softcap`` are
    in the COMPUTE dtype; BIAS_ADD: the bias is added to the scores, BIAS_MASK: it is a boolean mask;
    ALIBI: ``slope`` times the key's distance to the diagonal is subtracted."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=COMPUTE) * scale
    t = s
    if SOFTCAP:
        t = tanh_of(s / softcap)
        s = softcap * t
    allowed = (rows < len_q)[:, None] & (columns < len_kv)[None, :]
    diagonal = rows + shift
    if HAS_LEFT:
        allowed &= columns[None, :] >= (diagonal - left)[:, None]
    if HAS_RIGHT:
        allowed &= columns[None, :] <= (diagonal + right)[:, None]
    if BIAS_ADD or BIAS_MASK:  # broadcast dims have stride 0
        bias = load_tile(
            bias_ptr,
            head_base(b, h, bias_strides, 0),
            rows,
            columns,
            (bias_strides[2], bias_strides[3]),
            seq_q,
            seq_kv,
            0,
        )
        if BIAS_ADD:
            s += bias.to(COMPUTE)
        else:
            allowed &= bias != 0
    if ALIBI:
        s -= slope * tl.abs(columns[None, :] - diagonal[:, None]).to(COMPUTE)
    return tl.where(allowed, s, float("-inf")), t


@triton.jit
def head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI: tl.constexpr, COMPUTE: tl.constexpr):
    """The ALiBi slope of batch b and query head h in COMPUTE (0 without ALiBi); a batch stride of 0
    for slopes of one per head."""
    slope = tl.zeros((), COMPUTE)
    if ALIBI:
        slope = tl.load(alibi_slopes_ptr + b.to(tl.int64) * alibi_strides[0] + h * alibi_strides[1]).to(COMPUTE)
    return slope


@triton.jit
def dropout_kept(seed, offset, b, h, rows, columns, heads_q, seq_q, seq_kv, dropout_p):
    """True where the weight (b, h, i, j) is kept: tl.rand at counter offset + ((b * Hq + h) * Sq + i) * Skv + j."""
    base = offset + (b.to(tl.int64) * heads_q + h) * seq_q * seq_kv
    counters = base + rows.to(tl.int64)[:, None] * seq_kv + columns[None, :]
    return tl.rand(seed, counters) >= dropout_p
