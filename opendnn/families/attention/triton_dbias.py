"""The attention backward's bias gradient (only when dbias is asked for): ``attention_dbias_kernel``,
one program per tile of the bias's own dims, sums dS over the dims the bias broadcasts (batch,
heads, queries or keys) in a fixed order, recomputing q k^T and dO v^T (two forwards of FLOPs more
than the backward of ``triton_backward``, whose delta and row statistics it reads)."""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.attention.triton_backward import row_statistics, tile_gradients
from opendnn.families.attention.triton_tiles import (
    compute_scalar,
    head_base,
    head_slope,
    load_tile,
    log2_score_scalars,
    sequence_lengths,
    store_tile,
)


@triton.jit
def attention_dbias_kernel(
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
    dbias_ptr,
    # layout (as the forward's); dbias_dims: the bias's own dims
    q_strides,
    k_strides,
    v_strides,
    do_strides,
    stats_strides,
    bias_strides,
    seq_lens_strides,
    alibi_strides,
    dbias_strides,
    dbias_dims,
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
    # the variant; *_SUMMED: the bias broadcasts along that dim, whose terms this program sums
    HAS_LEFT: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    HAS_LENS_Q: tl.constexpr,
    HAS_LENS_KV: tl.constexpr,
    SOFTCAP: tl.constexpr,
    ALIBI: tl.constexpr,
    DROPOUT: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE: tl.constexpr,
    BATCH_SUMMED: tl.constexpr,
    HEADS_SUMMED: tl.constexpr,
    QUERIES_SUMMED: tl.constexpr,
    KEYS_SUMMED: tl.constexpr,
    # the tile
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Program (tile, bias batch * bias heads + bias head): dBias of one BLOCK_M x BLOCK_N tile of the
    bias's (queries, keys) dims (a whole summed dim counts as one row or column)."""
    tiles_n = tl.cdiv(dbias_dims[3], BLOCK_N)
    tile_m = tl.program_id(0) // tiles_n
    tile_n = tl.program_id(0) % tiles_n
    bias_b = tl.program_id(1) // dbias_dims[1]
    bias_h = tl.program_id(1) % dbias_dims[1]
    score_scale, softcap = log2_score_scalars(scale, softcap, SOFTCAP, COMPUTE)
    dropout_scale = compute_scalar(dropout_scale, COMPUTE)
    dims = tl.arange(0, BLOCK_D)
    value_dims = tl.arange(0, BLOCK_DV)
    m_start, m_stop = tile_m * BLOCK_M, tile_m * BLOCK_M + BLOCK_M
    if QUERIES_SUMMED:
        m_start, m_stop = 0, seq_q
    n_start, n_stop = tile_n * BLOCK_N, tile_n * BLOCK_N + BLOCK_N
    if KEYS_SUMMED:
        n_start, n_stop = 0, seq_kv
    batch_count = batch if BATCH_SUMMED else 1
    head_count = heads_q if HEADS_SUMMED else 1
    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    for batch_step in range(batch_count):
        b = bias_b + batch_step
        # never ragged (a bias and ragged offsets exclude each other): the starts are 0, the limits Sq and Skv
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
            False,
            BOTTOM_RIGHT,
        )
        for head_step in range(head_count):
            h = bias_h + head_step
            kv_head = h // group
            slope = head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI, COMPUTE)
            for start_m in range(m_start, m_stop, BLOCK_M):
                rows = start_m + tl.arange(0, BLOCK_M)
                q = load_tile(q_ptr, head_base(b, h, q_strides, 0), rows, dims, q_strides, seq_q, head_dim, 0.0)
                do = load_tile(
                    do_ptr, head_base(b, h, do_strides, 0), rows, value_dims, do_strides, seq_q, value_dim, 0.0
                )
                lse, delta = row_statistics(
                    stats_ptr, delta_ptr, b, h, rows, stats_strides, 0, seq_q, heads_q, seq_q, COMPUTE
                )
                for start_n in range(n_start, n_stop, BLOCK_N):
                    columns = start_n + tl.arange(0, BLOCK_N)
                    k = load_tile(
                        k_ptr, head_base(b, kv_head, k_strides, 0), columns, dims, k_strides, seq_kv, head_dim, 0.0
                    )
                    v = load_tile(
                        v_ptr,
                        head_base(b, kv_head, v_strides, 0),
                        columns,
                        value_dims,
                        v_strides,
                        seq_kv,
                        value_dim,
                        0.0,
                    )
                    _, ds, _ = tile_gradients(
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
                        True,
                        False,
                        SOFTCAP,
                        ALIBI,
                        DROPOUT,
                        True,
                        PRECISION,
                        COMPUTE,
                    )
                    acc += ds
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if QUERIES_SUMMED:
        acc = tl.sum(acc, 0, keep_dims=True)
        rows = tl.arange(0, 1)
    columns = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if KEYS_SUMMED:
        acc = tl.sum(acc, 1, keep_dims=True)
        columns = tl.arange(0, 1)
    base = bias_b.to(tl.int64) * dbias_strides[0] + bias_h.to(tl.int64) * dbias_strides[1]
    store_tile(dbias_ptr, base, rows, columns, dbias_strides, dbias_dims[2], dbias_dims[3], acc)
