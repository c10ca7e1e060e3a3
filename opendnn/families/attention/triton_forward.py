"""The attention forward, FlashAttention-2 style: one program per (BLOCK_M queries, batch, query
head) streams the key/value blocks its masks leave through an online softmax, and writes o and
the rows' logsumexp (the stats the backward needs).

FLOPs, with ``pairs`` the (query, key) pairs taking part (B * Hq * Sq * Skv unmasked, about half of
that causal with Sq = Skv): ``2 * pairs * (D + Dv)`` in the two products (q k^T and p v) and one
exp2 per pair. Bytes: q and o once each (B * Hq * Sq * (D + Dv)), the stats (4 per row), and k and v
once per query block that sees them (B * Hq * Skv * (D + Dv) per block row of BLOCK_M queries:
the query heads of a group and the query blocks of a head read the same keys, mostly from L2).
Past a few hundred keys a row the products dominate: the kernel is bound by the tensor cores
(bfloat16: about 670-790 TFLOP/s on an H200), not by memory.

Per key block: s = tile_scores(q, k) (scale, softcap, bias, ALiBi, masks) in log2 units (the natural
scores times log2(e), folded into the scale, so that each exponential is one exp2 of a difference),
m' = max(m, rowmax(s)), p = exp2(s - m'), l = l * exp2(m - m') + rowsum(p), acc = acc * exp2(m - m')
+ (p * dropout) v. At the end a sink's logit joins l (m and acc rescaled to it), o = acc / l and
lse = m / log2(e) + log(l), in natural units; a row with no key (l = 0) gives o = 0 and lse = -inf.
A row's max of -inf is shifted by 0 instead, so that -inf - -inf never forms. Accumulation in float32
(float64 for DOUBLE); p is rounded to the data dtype before its product with v, as FlashAttention does.

The key blocks run in two loops of one body: first the interior's (key_range: the blocks inside the
band and the lengths for every query of the block), whose loads and scores carry no mask, then the
edge blocks with the whole pipeline. Padding queries past len_q are reset after the loops.

Program order: under a band bounded on the right (causal), a query block sees more keys the later
it lies, so its ranks run from the last block to the first (scheduled_block): the GPU starts the
heaviest programs first and the launch ends on light ones. Ragged sequences (RAGGED) start at their
offsets; the grid covers their real query blocks (the packed tokens' blocks plus one per sequence
at most), each program finding its sequence and block from the offsets. Paged K/V (PAGED) gathers each
key tile's rows through the block table, one table entry per key (cached in L1 across the tile),
so a block size of at least 16 keeps the loads as wide as the dense ones.

fp8 (FP8: cuDNN's fp8 SDPA forward): q, k and v are fp8 and both products take fp8 operands with
float32 accumulation. q k^T's multiplier gains descale_q * descale_k; the running max is rounded up
to a whole number (log2 units), so that every rescaling of acc and l is a power of two, exact on the
fp8-rounded weights; p * scale_s is rounded to v's type before p v; at the end o = acc / l *
descale_s * descale_v, its largest |o| and each row's largest weight (exp2(top - m) / l, top the
row's own max) join amax_o and amax_s by an atomic max (float32 maxima of non-negative numbers, the
same in every order), and o is multiplied by scale_o. Bytes: q, k and v take one byte an element.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.attention.triton_tiles import (
    LOG2E,
    below,
    block_loop,
    compute_scalar,
    dropout_kept,
    head_base,
    head_slope,
    key_range,
    load_rows,
    load_tile,
    log2_score_scalars,
    paged_rows,
    rounded_to_fp8,
    scheduled_block,
    sequence_lengths,
    store_tile,
    tile_scores,
)


@triton.jit
def attention_forward_kernel(
    # memory
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    stats_ptr,
    bias_ptr,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    alibi_slopes_ptr,
    sinks_ptr,
    block_table_ptr,
    descale_q_ptr,
    descale_k_ptr,
    descale_v_ptr,
    descale_s_ptr,
    scale_s_ptr,
    scale_o_ptr,
    amax_s_ptr,
    amax_o_ptr,
    # layout: the strides of each tensor, (B, H, S, D) order ((block, H, row, D) for paged K/V);
    # (B, H, S) for stats; (q, kv) for the lengths or ragged offsets
    q_strides,
    k_strides,
    v_strides,
    o_strides,
    stats_strides,
    bias_strides,
    seq_lens_strides,
    alibi_strides,
    sinks_stride,
    block_table_strides,
    # sizes
    batch,
    heads_q,
    group,
    packed_rows,
    seq_q,
    seq_kv,
    head_dim,
    value_dim,
    block_size,
    # parameters
    scale: tl.float64,
    softcap: tl.float64,
    left,
    right,
    dropout_p: tl.float32,  # compared with float32 uniforms
    dropout_scale: tl.float64,
    seed,
    offset,
    # the variant
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    HAS_LENS_Q: tl.constexpr,
    HAS_LENS_KV: tl.constexpr,
    RAGGED: tl.constexpr,
    PAGED: tl.constexpr,
    BIAS_ADD: tl.constexpr,
    BIAS_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    SINKS: tl.constexpr,
    DROPOUT: tl.constexpr,
    STORE_STATS: tl.constexpr,
    FP8: tl.constexpr,
    STORE_AMAX_S: tl.constexpr,
    STORE_AMAX_O: tl.constexpr,
    FP8_ON_GRID: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    VALUE_DIM_PADDED: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE: tl.constexpr,
    # the tile
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Program (rank, b * Hq + h), ragged (rank, h): o and lse of the BLOCK_M queries of batch b, head
    h that scheduled_block gives the rank, the heaviest block first under a causal mask."""
    b = tl.program_id(1) // heads_q  # ragged: the grid's axis 1 is the heads, b comes from the offsets
    h = tl.program_id(1) % heads_q
    b, start_m = scheduled_block(
        tl.program_id(0), b, seq_lens_q_ptr, seq_lens_strides[0], batch, packed_rows[0], seq_q,
        HAS_RIGHT, RAGGED, BLOCK_M, BLOCK_B,
    )  # fmt: skip
    kv_head = h // group
    len_q, len_kv, shift, start_q, start_kv, limit_q, limit_kv = sequence_lengths(
        b,
        seq_lens_q_ptr,
        seq_lens_kv_ptr,
        seq_lens_strides,
        packed_rows,
        seq_q,
        seq_kv,
        HAS_LENS_Q,
        HAS_LENS_KV,
        RAGGED,
        BOTTOM_RIGHT,
    )
    scale, softcap = log2_score_scalars(scale, softcap, SOFTCAP, COMPUTE)
    slope = head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI, COMPUTE)
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    value_dims = tl.arange(0, BLOCK_DV)
    q_base = head_base(b, h, q_strides, start_q)
    q = load_tile(q_ptr, q_base, rows, dims, q_strides, limit_q, head_dim, 0.0)
    k_base = head_base(b, kv_head, k_strides, start_kv)
    v_base = head_base(b, kv_head, v_strides, start_kv)
    m = tl.full((BLOCK_M,), float("-inf"), COMPUTE)
    if FP8:  # the per-tensor factors, once a program; top: the rows' largest scores
        scale = scale * tl.load(descale_q_ptr) * tl.load(descale_k_ptr)
        scale_s = tl.load(scale_s_ptr)
        top = tl.full((BLOCK_M,), float("-inf"), COMPUTE)
    total = tl.zeros((BLOCK_M,), COMPUTE)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), COMPUTE)
    # the interior's key blocks first, whose scores need no mask, then the edge blocks around it
    lo, hi, inner_lo, inner_hi = key_range(
        start_m, len_q, len_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N
    )
    for EDGE in tl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for step in range(first, stop, BLOCK_N):
            start_n = step + tl.where(step < inner_lo, 0, gap)
            columns = start_n + tl.arange(0, BLOCK_N)
            if PAGED:  # keys past len_kv read nothing: a cache's unused rows may hold anything
                k_rows = paged_rows(
                    block_table_ptr, block_table_strides, b, kv_head, columns, len_kv, block_size, k_strides
                )
                k = load_rows(
                    k_ptr, k_rows, dims, k_strides[3], below(columns, len_kv, EDGE), head_dim, 0.0, HEAD_DIM_PADDED
                )
            else:
                k = load_tile(k_ptr, k_base, columns, dims, k_strides, limit_kv, head_dim, 0.0, EDGE, HEAD_DIM_PADDED)
            s, _ = tile_scores(
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
                HAS_LEFT,
                HAS_RIGHT,
                BIAS_ADD,
                BIAS_MASK,
                SOFTCAP,
                ALIBI,
                EDGE,
                PRECISION,
                COMPUTE,
            )
            if FP8:  # a whole number: rescaling the rounded weights by exp2(m - m_new) is exact
                top = tl.maximum(top, tl.max(s, 1))
                m_new = tl.ceil(top)
            else:
                m_new = tl.maximum(m, tl.max(s, 1))
            shift_m = tl.where(m_new == float("-inf"), 0.0, m_new)
            rescale = tl.exp2(m - shift_m)
            p = tl.exp2(s - shift_m[:, None])
            total = total * rescale + tl.sum(p, 1)
            if DROPOUT:
                kept = dropout_kept(seed, offset, b, h, rows, columns, heads_q, seq_q, seq_kv, dropout_p)
                p = tl.where(kept, p * compute_scalar(dropout_scale, COMPUTE), 0.0)
            if PAGED:
                v_rows = paged_rows(
                    block_table_ptr, block_table_strides, b, kv_head, columns, len_kv, block_size, v_strides
                )
                v = load_rows(
                    v_ptr,
                    v_rows,
                    value_dims,
                    v_strides[3],
                    below(columns, len_kv, EDGE),
                    value_dim,
                    0.0,
                    VALUE_DIM_PADDED,
                )
            else:
                v = load_tile(
                    v_ptr, v_base, columns, value_dims, v_strides, limit_kv, value_dim, 0.0, EDGE, VALUE_DIM_PADDED
                )
            if FP8:
                p = rounded_to_fp8(p * scale_s, v.dtype, FP8_ON_GRID)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION, out_dtype=COMPUTE)
            m = m_new
    # queries past len_q see no key (o = 0): the interior's blocks do not mask them
    padding = rows >= len_q
    m = tl.where(padding, float("-inf"), m)
    total = tl.where(padding, 0.0, total)
    if SINKS:  # the sink's logit joins the denominator
        sink = tl.load(sinks_ptr + h.to(tl.int64) * sinks_stride).to(COMPUTE) * LOG2E
        m_new = tl.maximum(m, sink)
        shift_m = tl.where(m_new == float("-inf"), 0.0, m_new)
        rescale = tl.exp2(m - shift_m)
        total = total * rescale + tl.exp2(sink - shift_m)
        acc = acc * rescale[:, None]
        m = m_new
    empty = total == 0.0
    total = tl.where(empty, 1.0, total)
    o = tl.where(padding[:, None], 0.0, acc / total[:, None])
    if FP8:
        o = o * (tl.load(descale_s_ptr) * tl.load(descale_v_ptr))
        if STORE_AMAX_S:  # a row's largest weight exp2(top - m) / l; 0 for rows with no key
            weight = tl.where(empty | padding, 0.0, tl.exp2(top - m) / total)
            tl.atomic_max(amax_s_ptr, tl.max(weight, 0))
        if STORE_AMAX_O:
            tl.atomic_max(amax_o_ptr, tl.max(tl.max(tl.abs(o), 1), 0))
        o = rounded_to_fp8(o * tl.load(scale_o_ptr), o_ptr.dtype.element_ty, FP8_ON_GRID)
    o_base = head_base(b, h, o_strides, start_q)
    store_tile(o_ptr, o_base, rows, value_dims, o_strides, limit_q, value_dim, o)
    if STORE_STATS:
        lse = tl.where(empty, float("-inf"), m / LOG2E + tl.log(total))  # natural units
        offsets = head_base(b, h, stats_strides, start_q) + rows.to(tl.int64) * stats_strides[2]
        tl.store(stats_ptr + offsets, lse.to(stats_ptr.dtype.element_ty), mask=rows < limit_q)
