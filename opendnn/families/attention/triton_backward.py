"""The attention backward, deterministic: no atomics, every gradient element written by one program
that sums its terms in a fixed order, and a workspace linear in the sequence length.

1. ``attention_delta_kernel``: delta = rowsum(dO * O) per query row (B * Hq * Sq numbers, float32;
   float64 for DOUBLE), the workspace.
2. ``attention_dkdv_kernel``: one program per (BLOCK_N keys, batch, key/value head) holds k and v
   and loops over the (query head, query block) pairs of its group that its masks leave, recomputing
   p = exp(s - lse) from the saved stats: dV += (p * dropout)^T dO, dP = (dO v^T) * dropout,
   dS = p * (dP - delta), dK += dS'^T q (dS' through the softcap).
3. ``attention_dq_kernel``: one program per (BLOCK_M queries, batch, query head) loops over the key
   blocks: dQ += dS' k.

Both split their loop as the forward does: the interior's blocks (query_range, key_range), with no
mask, then the edge blocks; the padding past the program's own length is zeroed after the loop.
Each of kernels 1-3 takes its block from scheduled_block, as the forward: the heaviest first under
a causal mask (the last query blocks for dQ, the first key blocks for dK/dV), and over the real
blocks of ragged sequences.
4. ``attention_dbias_kernel`` (``triton_dbias``, only when dbias is asked for).
5. ``attention_dsinks_kernel`` (only with sinks): one program per query head sums
   -exp(sink - lse) * delta over the batches and rows: dSinks reads B * Sq * 2 numbers a head.

FLOPs, with ``pairs`` the (query, key) pairs taking part: the dK/dV kernel computes four products
(q k^T, p^T dO, dO v^T, dS^T q: ``2 * pairs * (2 * D + 2 * Dv)``), the dQ kernel three (q k^T,
dO v^T, dS k: ``2 * pairs * (2 * D + Dv)``), so the backward does 3.5 forwards of work with
D = Dv, where a backward that adds dQ with atomics does 2.5; the dbias kernel adds two products
more. Bytes: each kernel reads q, dO, the stats and delta once per key block that sees them (dK/dV)
or k and v once per query block (dQ), mostly from L2; it writes each gradient once. Like the
forward, past a few hundred keys a row the products dominate.
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
    load_tile,
    log2_score_scalars,
    packed_sequence,
    query_range,
    rounded_to_fp8,
    scheduled_block,
    sequence_lengths,
    store_tile,
    tile_scores,
)


@triton.jit
def attention_delta_kernel(
    o_ptr,
    do_ptr,
    delta_ptr,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    descale_o_ptr,
    descale_v_ptr,
    o_strides,
    do_strides,
    seq_lens_strides,
    batch,
    heads_q,
    packed_rows,
    seq_q,
    seq_kv,
    value_dim,
    HAS_LENS_Q: tl.constexpr,
    HAS_LENS_KV: tl.constexpr,
    RAGGED: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    FP8: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Program (rank, b * Hq + h), ragged (rank, h): delta[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d]
    for the BLOCK_M rows i of scheduled_block's block (of a ragged sequence: its own rows, at
    (b * Hq + h) * max_seqlen_q + i). FP8: delta * descale_o / descale_v, in the units of the fp8
    products dO v^T before their factors descale_dO * descale_v (so dS = p * (dO v^T - delta) times
    those factors)."""
    b = tl.program_id(1) // heads_q
    h = tl.program_id(1) % heads_q
    b, start_m = scheduled_block(
        tl.program_id(0), b, seq_lens_q_ptr, seq_lens_strides[0], batch, packed_rows[0], seq_q,
        False, RAGGED, BLOCK_M, BLOCK_B,
    )  # fmt: skip
    _, _, _, start_q, _, limit_q, _ = sequence_lengths(
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
    rows = start_m + tl.arange(0, BLOCK_M)
    value_dims = tl.arange(0, BLOCK_DV)
    o_base = head_base(b, h, o_strides, start_q)
    o = load_tile(o_ptr, o_base, rows, value_dims, o_strides, limit_q, value_dim, 0.0)
    do_base = head_base(b, h, do_strides, start_q)
    do = load_tile(do_ptr, do_base, rows, value_dims, do_strides, limit_q, value_dim, 0.0)
    delta = tl.sum(o.to(COMPUTE) * do.to(COMPUTE), 1)
    if FP8:
        delta = delta * (tl.load(descale_o_ptr) / tl.load(descale_v_ptr))
    tl.store(delta_ptr + (b.to(tl.int64) * heads_q + h) * seq_q + rows, delta, mask=rows < limit_q)


@triton.jit
def row_statistics(
    stats_ptr,
    delta_ptr,
    b,
    h,
    rows,
    stats_strides,
    start_q,
    limit_q,
    heads_q,
    seq_q,
    COMPUTE: tl.constexpr,
    MASK_ROWS: tl.constexpr = True,
):
    """(lse, delta) of the rows, lse in log2 units as tile_scores' scores: +inf where a row has no
    key (-inf saved) or is past its limit (MASK_ROWS: some may be), so that exp2(s - lse) is 0 there."""
    inside = below(rows, limit_q, MASK_ROWS)
    offsets = head_base(b, h, stats_strides, start_q) + rows.to(tl.int64) * stats_strides[2]
    lse = tl.load(stats_ptr + offsets, mask=inside, other=float("inf")).to(COMPUTE)
    lse = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = tl.load(delta_ptr + (b.to(tl.int64) * heads_q + h) * seq_q + rows, mask=inside, other=0.0)
    return lse, delta


@triton.jit
def attention_dsinks_kernel(
    stats_ptr,
    delta_ptr,
    sinks_ptr,
    dsinks_ptr,
    seq_lens_q_ptr,
    stats_strides,
    sinks_stride,
    dsinks_stride,
    seq_lens_strides,
    batch,
    heads_q,
    packed_rows,
    seq_q,
    RAGGED: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Program h: dSinks[h] = -sum_{b, i} exp(sinks[h] - lse[b, h, i]) * delta[b, h, i], in a fixed order
    (RAGGED: the rows of each sequence, at its offset in the stats)."""
    h = tl.program_id(0).to(tl.int64)
    sink = tl.load(sinks_ptr + h * sinks_stride).to(COMPUTE)
    acc = tl.zeros((BLOCK_M,), COMPUTE)
    for first in range(0, batch * seq_q, BLOCK_M):  # the (batch, row) pairs of head h, BLOCK_M at a time
        pairs = first + tl.arange(0, BLOCK_M).to(tl.int64)
        b = tl.minimum(pairs // seq_q, batch - 1)
        rows = pairs % seq_q
        inside = pairs < batch * seq_q
        start = tl.zeros_like(rows)  # the sequence's first row in the stats
        if RAGGED:
            start, length = packed_sequence(seq_lens_q_ptr, b, seq_lens_strides[0], packed_rows[0], seq_q)
            inside &= rows < length
        lse = tl.load(
            stats_ptr + b * stats_strides[0] + h * stats_strides[1] + (start + rows) * stats_strides[2],
            mask=inside,
            other=0.0,
        ).to(COMPUTE)
        delta = tl.load(delta_ptr + (b * heads_q + h) * seq_q + rows, mask=inside, other=0.0)
        # rows without a key or sink (lse -inf) have o = 0, so delta = 0: no term
        acc += tl.where(inside & (lse != float("-inf")), tl.exp2((sink - lse) * LOG2E) * delta, 0.0)
    gradient = -tl.sum(acc, 0)
    tl.store(dsinks_ptr + h.to(tl.int64) * dsinks_stride, gradient.to(dsinks_ptr.dtype.element_ty))


@triton.jit
def tile_gradients(
    q,
    k,
    v,
    do,
    lse,
    delta,
    rows,
    columns,
    b,
    h,
    bias_ptr,
    bias_strides,
    heads_q,
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
    dropout_p,
    dropout_scale,
    seed,
    offset,
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BIAS_ADD: tl.constexpr,
    BIAS_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr,
    EDGE: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """(p * dropout, dS, t) of a tile: the weights that multiplied v, the scores' gradient
    p * (dP - delta), and tanh of the capped scores (see tile_scores, which EDGE is passed to)."""
    s, t = tile_scores(
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
    p = tl.exp2(s - lse[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION, out_dtype=COMPUTE)
    dropped = p
    if DROPOUT:
        kept = dropout_kept(seed, offset, b, h, rows, columns, heads_q, seq_q, seq_kv, dropout_p)
        dropped = tl.where(kept, p * dropout_scale, 0.0)
        dp = tl.where(kept, dp * dropout_scale, 0.0)
    return dropped, p * (dp - delta[:, None]), t


@triton.jit
def through_softcap(ds, t, SOFTCAP: tl.constexpr):
    """dS' = dS * (1 - tanh^2): the gradient of the scores before the softcap."""
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return ds


@triton.jit
def scaled_fp8_gradient(gradient, descale, scale_ptr, amax_ptr, STORE_AMAX: tl.constexpr, dtype, ON_GRID: tl.constexpr):
    """An fp8 backward's gradient from its accumulated fp8 products: times ``descale`` (its largest
    |value| joins amax by an atomic max when STORE_AMAX), then times the scale, rounded to ``dtype``."""
    gradient = gradient * descale
    if STORE_AMAX:
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(gradient), 1), 0))
    return rounded_to_fp8(gradient * tl.load(scale_ptr), dtype, ON_GRID)


@triton.jit
def attention_dkdv_kernel(
    # memory
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    stats_ptr,
    delta_ptr,
    bias_ptr,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    alibi_slopes_ptr,
    dk_ptr,
    dv_ptr,
    # fp8: the per-tensor factors and maxima
    descale_q_ptr,
    descale_k_ptr,
    descale_v_ptr,
    descale_do_ptr,
    descale_s_ptr,
    descale_dp_ptr,
    scale_s_ptr,
    scale_dk_ptr,
    scale_dv_ptr,
    scale_dp_ptr,
    amax_dk_ptr,
    amax_dv_ptr,
    amax_dp_ptr,
    # layout (as the forward's)
    q_strides,
    k_strides,
    v_strides,
    do_strides,
    stats_strides,
    bias_strides,
    seq_lens_strides,
    alibi_strides,
    dk_strides,
    dv_strides,
    # sizes
    batch,
    heads_q,
    group,
    packed_rows,
    seq_q,
    seq_kv,
    head_dim,
    value_dim,
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
    BIAS_ADD: tl.constexpr,
    BIAS_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr,
    FP8: tl.constexpr,
    STORE_AMAX_DK: tl.constexpr,
    STORE_AMAX_DV: tl.constexpr,
    STORE_AMAX_DP: tl.constexpr,
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
    """Program (rank, b * Hkv + kv head), ragged (rank, kv head): dK and dV of the BLOCK_N keys of
    scheduled_block's block, the heaviest first: a key block is seen by the queries from it on under
    a causal mask, so the first blocks are the heaviest, and the order is reversed only for a band
    bounded on the left alone. FP8: p * scale_s rounded to q's type before its product with dO, dS
    * scale_dP to dO's type before its product with q, amax_dP joined from the block's dS."""
    heads_kv = heads_q // group
    b = tl.program_id(1) // heads_kv  # ragged: the grid's axis 1 is the heads, b comes from the offsets
    kv_head = tl.program_id(1) % heads_kv
    b, start_n = scheduled_block(
        tl.program_id(0),
        b,
        seq_lens_kv_ptr,
        seq_lens_strides[1],
        batch,
        packed_rows[1],
        seq_kv,
        HAS_LEFT and not HAS_RIGHT,
        RAGGED,
        BLOCK_N,
        BLOCK_B,
    )
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
    score_scale, softcap = log2_score_scalars(scale, softcap, SOFTCAP, COMPUTE)
    dropout_scale = compute_scalar(dropout_scale, COMPUTE)
    if FP8:  # the per-tensor factors, once a program; largest_ds: each key's largest |dS|
        score_scale = score_scale * (tl.load(descale_q_ptr) * tl.load(descale_k_ptr))
        ds_scale = compute_scalar(scale, COMPUTE) * (tl.load(descale_do_ptr) * tl.load(descale_v_ptr))
        scale_s = tl.load(scale_s_ptr)
        scale_dp = tl.load(scale_dp_ptr)
        largest_ds = tl.zeros((BLOCK_N,), COMPUTE)
    columns = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    value_dims = tl.arange(0, BLOCK_DV)
    k_base = head_base(b, kv_head, k_strides, start_kv)
    k = load_tile(k_ptr, k_base, columns, dims, k_strides, limit_kv, head_dim, 0.0)
    v_base = head_base(b, kv_head, v_strides, start_kv)
    v = load_tile(v_ptr, v_base, columns, value_dims, v_strides, limit_kv, value_dim, 0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), COMPUTE)
    dv = tl.zeros((BLOCK_N, BLOCK_DV), COMPUTE)
    # the (query head, query block) pairs of the group, head by head in one loop (its pipeline fills
    # once, not once a head): the interior's query blocks first, whose scores need no mask, then the
    # edge blocks around it, unpipelined (a second prologue beside dK and dV spills registers)
    lo, hi, inner_lo, inner_hi = query_range(
        start_n, len_q, len_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N
    )
    for EDGE in tl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        h = kv_head * group
        step = first
        for _ in tl.range(0, group * tl.cdiv(stop - first, BLOCK_M), num_stages=1 if EDGE else None):
            slope = head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI, COMPUTE)
            q_base = head_base(b, h, q_strides, start_q)
            do_base = head_base(b, h, do_strides, start_q)
            start_m = step + tl.where(step < inner_lo, 0, gap)
            rows = start_m + tl.arange(0, BLOCK_M)
            q = load_tile(q_ptr, q_base, rows, dims, q_strides, limit_q, head_dim, 0.0, EDGE, HEAD_DIM_PADDED)
            do = load_tile(
                do_ptr, do_base, rows, value_dims, do_strides, limit_q, value_dim, 0.0, EDGE, VALUE_DIM_PADDED
            )
            lse, delta = row_statistics(
                stats_ptr, delta_ptr, b, h, rows, stats_strides, start_q, limit_q, heads_q, seq_q, COMPUTE, EDGE
            )
            dropped, ds, t = tile_gradients(
                q,
                k,
                v,
                do,
                lse,
                delta,
                rows,
                columns,
                b,
                h,
                bias_ptr,
                bias_strides,
                heads_q,
                seq_q,
                seq_kv,
                len_q,
                len_kv,
                shift,
                left,
                right,
                score_scale,
                softcap,
                slope,
                dropout_p,
                dropout_scale,
                seed,
                offset,
                HAS_LEFT,
                HAS_RIGHT,
                BIAS_ADD,
                BIAS_MASK,
                SOFTCAP,
                ALIBI,
                DROPOUT,
                EDGE,
                PRECISION,
                COMPUTE,
            )
            if FP8:
                ds = ds * ds_scale
                largest_ds = tl.maximum(largest_ds, tl.max(tl.abs(ds), 0))
                p = rounded_to_fp8(dropped * scale_s, q.dtype, FP8_ON_GRID)
                dv += tl.dot(tl.trans(p), do, out_dtype=COMPUTE)
                ds = rounded_to_fp8(ds * scale_dp, do.dtype, FP8_ON_GRID)
                dk += tl.dot(tl.trans(ds), q, out_dtype=COMPUTE)
            else:
                dv += tl.dot(tl.trans(dropped.to(do.dtype)), do, input_precision=PRECISION, out_dtype=COMPUTE)
                ds = through_softcap(ds, t, SOFTCAP)
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION, out_dtype=COMPUTE)
            step += BLOCK_M
            h = tl.where(step < stop, h, h + 1)  # past the head's last block: the next head's first
            step = tl.where(step < stop, step, first)
    inside = (columns < len_kv)[:, None]  # keys past len_kv take no part: the interior does not mask them
    dk = tl.where(inside, dk, 0.0)
    dv = tl.where(inside, dv, 0.0)
    if FP8:
        if STORE_AMAX_DP:
            tl.atomic_max(amax_dp_ptr, tl.max(tl.where(columns < len_kv, largest_ds, 0.0), 0))
        descale_dp = tl.load(descale_dp_ptr)
        dk = scaled_fp8_gradient(
            dk,
            descale_dp * tl.load(descale_q_ptr),
            scale_dk_ptr,
            amax_dk_ptr,
            STORE_AMAX_DK,
            dk_ptr.dtype.element_ty,
            FP8_ON_GRID,
        )
        descale_v = tl.load(descale_s_ptr) * tl.load(descale_do_ptr)
        dv = scaled_fp8_gradient(
            dv, descale_v, scale_dv_ptr, amax_dv_ptr, STORE_AMAX_DV, dv_ptr.dtype.element_ty, FP8_ON_GRID
        )
    else:
        dk = dk * compute_scalar(scale, COMPUTE)
    dk_base = head_base(b, kv_head, dk_strides, start_kv)
    store_tile(dk_ptr, dk_base, columns, dims, dk_strides, limit_kv, head_dim, dk)
    dv_base = head_base(b, kv_head, dv_strides, start_kv)
    store_tile(dv_ptr, dv_base, columns, value_dims, dv_strides, limit_kv, value_dim, dv)


@triton.jit
def attention_dq_kernel(
    # memory
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    stats_ptr,
    delta_ptr,
    bias_ptr,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    alibi_slopes_ptr,
    dq_ptr,
    # fp8: the per-tensor factors and maximum
    descale_q_ptr,
    descale_k_ptr,
    descale_v_ptr,
    descale_do_ptr,
    descale_dp_ptr,
    scale_dq_ptr,
    scale_dp_ptr,
    amax_dq_ptr,
    # layout (as the forward's)
    q_strides,
    k_strides,
    v_strides,
    do_strides,
    stats_strides,
    bias_strides,
    seq_lens_strides,
    alibi_strides,
    dq_strides,
    # sizes
    batch,
    heads_q,
    group,
    packed_rows,
    seq_q,
    seq_kv,
    head_dim,
    value_dim,
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
    BIAS_ADD: tl.constexpr,
    BIAS_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr,
    FP8: tl.constexpr,
    STORE_AMAX_DQ: tl.constexpr,
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
    """Program (rank, b * Hq + h), ragged (rank, h): dQ of the BLOCK_M queries of scheduled_block's
    block, the heaviest first under a causal mask (as the forward). FP8: dS * scale_dP rounded to dO's
    type before its product with k, as the dK/dV kernel rounds it."""
    b = tl.program_id(1) // heads_q  # ragged: the grid's axis 1 is the heads, b comes from the offsets
    h = tl.program_id(1) % heads_q
    kv_head = h // group
    b, start_m = scheduled_block(
        tl.program_id(0), b, seq_lens_q_ptr, seq_lens_strides[0], batch, packed_rows[0], seq_q,
        HAS_RIGHT, RAGGED, BLOCK_M, BLOCK_B,
    )  # fmt: skip
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
    score_scale, softcap = log2_score_scalars(scale, softcap, SOFTCAP, COMPUTE)
    dropout_scale = compute_scalar(dropout_scale, COMPUTE)
    if FP8:  # the per-tensor factors, once a program
        score_scale = score_scale * (tl.load(descale_q_ptr) * tl.load(descale_k_ptr))
        ds_scale = compute_scalar(scale, COMPUTE) * (tl.load(descale_do_ptr) * tl.load(descale_v_ptr))
        scale_dp = tl.load(scale_dp_ptr)
    slope = head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI, COMPUTE)
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    value_dims = tl.arange(0, BLOCK_DV)
    q_base = head_base(b, h, q_strides, start_q)
    q = load_tile(q_ptr, q_base, rows, dims, q_strides, limit_q, head_dim, 0.0)
    do_base = head_base(b, h, do_strides, start_q)
    do = load_tile(do_ptr, do_base, rows, value_dims, do_strides, limit_q, value_dim, 0.0)
    lse, delta = row_statistics(
        stats_ptr, delta_ptr, b, h, rows, stats_strides, start_q, limit_q, heads_q, seq_q, COMPUTE
    )
    k_base = head_base(b, kv_head, k_strides, start_kv)
    v_base = head_base(b, kv_head, v_strides, start_kv)
    dq = tl.zeros((BLOCK_M, BLOCK_D), COMPUTE)
    # the interior's key blocks first, whose scores need no mask, then the edge blocks around it
    lo, hi, inner_lo, inner_hi = key_range(
        start_m, len_q, len_kv, shift, left, right, HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N
    )
    for EDGE in tl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for step in range(first, stop, BLOCK_N):
            start_n = step + tl.where(step < inner_lo, 0, gap)
            columns = start_n + tl.arange(0, BLOCK_N)
            k = load_tile(k_ptr, k_base, columns, dims, k_strides, limit_kv, head_dim, 0.0, EDGE, HEAD_DIM_PADDED)
            v = load_tile(
                v_ptr, v_base, columns, value_dims, v_strides, limit_kv, value_dim, 0.0, EDGE, VALUE_DIM_PADDED
            )
            _, ds, t = tile_gradients(
                q,
                k,
                v,
                do,
                lse,
                delta,
                rows,
                columns,
                b,
                h,
                bias_ptr,
                bias_strides,
                heads_q,
                seq_q,
                seq_kv,
                len_q,
                len_kv,
                shift,
                left,
                right,
                score_scale,
                softcap,
                slope,
                dropout_p,
                dropout_scale,
                seed,
                offset,
                HAS_LEFT,
                HAS_RIGHT,
                BIAS_ADD,
                BIAS_MASK,
                SOFTCAP,
                ALIBI,
                DROPOUT,
                EDGE,
                PRECISION,
                COMPUTE,
            )
            if FP8:
                dq += tl.dot(rounded_to_fp8(ds * ds_scale * scale_dp, do.dtype, FP8_ON_GRID), k, out_dtype=COMPUTE)
            else:
                ds = through_softcap(ds, t, SOFTCAP)
                dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION, out_dtype=COMPUTE)
    dq = tl.where((rows < len_q)[:, None], dq, 0.0)  # queries past len_q see no key: the interior does not mask them
    if FP8:
        descale_dq = tl.load(descale_dp_ptr) * tl.load(descale_k_ptr)
        dq = scaled_fp8_gradient(
            dq, descale_dq, scale_dq_ptr, amax_dq_ptr, STORE_AMAX_DQ, dq_ptr.dtype.element_ty, FP8_ON_GRID
        )
    else:
        dq = dq * compute_scalar(scale, COMPUTE)
    dq_base = head_base(b, h, dq_strides, start_q)
    store_tile(dq_ptr, dq_base, rows, dims, dq_strides, limit_q, head_dim, dq)
