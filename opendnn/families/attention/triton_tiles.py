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

from typing import TYPE_CHECKING

import triton
import triton.language as tl

if TYPE_CHECKING:
    from opendnn.families.attention.problem import AttentionProblem

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E)


@triton.jit
def below(indices, limit, MASKED: tl.constexpr):
    """``indices < limit``; all True where the caller knows it holds (not MASKED): a load under an
    all-True mask compiles to an unmasked load."""
    if MASKED:
        return indices < limit
    else:
        return tl.full(indices.shape, True, tl.int1)


@triton.jit
def load_rows(
    ptr, row_offsets, columns, column_stride, row_mask, column_limit, other, MASK_COLUMNS: tl.constexpr = True
):
    """Elements [rows, columns] at ``row_offsets[r] + columns * column_stride``; ``other`` where
    ``row_mask`` is False or a column is past its limit (MASK_COLUMNS: some may be)."""
    offsets = row_offsets[:, None] + columns[None, :] * column_stride
    mask = row_mask[:, None] & below(columns, column_limit, MASK_COLUMNS)[None, :]
    return tl.load(ptr + offsets, mask=mask, other=other)


@triton.jit
def load_tile(
    ptr,
    base,
    rows,
    columns,
    strides,
    row_limit,
    column_limit,
    other,
    MASK_ROWS: tl.constexpr = True,
    MASK_COLUMNS: tl.constexpr = True,
):
    """Elements [rows, columns] of the (S, D) slice at ``base`` of a (B, H, S, D) tensor of ``strides``
    (offsets rows * strides[2] + columns * strides[3]); ``other`` where a row or column is past its
    limit (MASK_ROWS, MASK_COLUMNS: some may be)."""
    row_offsets = base + rows.to(tl.int64) * strides[2]
    return load_rows(
        ptr, row_offsets, columns, strides[3], below(rows, row_limit, MASK_ROWS), column_limit, other, MASK_COLUMNS
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
    """``values`` into elements [rows, columns] of the (S, D) slice at ``base`` (see load_tile), those
    of rows and columns within their limits."""
    offsets = base + rows.to(tl.int64)[:, None] * strides[2] + columns[None, :] * strides[3]
    mask = (rows < row_limit)[:, None] & (columns < column_limit)[None, :]
    tl.store(ptr + offsets, values.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def head_base(b, h, strides, start):
    """The offset of (batch b, head h) in a (B, H, S, D) tensor, in 64 bits; ``start`` rows down
    the sequence dim (a ragged sequence's first token; 0 otherwise)."""
    return b.to(tl.int64) * strides[0] + h.to(tl.int64) * strides[1] + tl.cast(start, tl.int64) * strides[2]


@triton.jit
def scheduled_block(
    rank,
    b,
    offsets_ptr,
    offsets_stride,
    batch,
    rows,
    seq_len,
    REVERSED: tl.constexpr,
    RAGGED: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """(b, start): the batch and first row of the block that the program of ``rank`` on its grid's
    block axis computes. Dense: block ``rank`` of cdiv(seq_len, BLOCK), batch b as given. RAGGED:
    ``ragged_rank`` over the (batch + 1) offsets at ``offsets_ptr`` of sequences packed in ``rows``
    rows, BLOCK_B >= batch of them loaded at once. REVERSED: ``in_order``."""
    blocks = tl.cdiv(seq_len, BLOCK)
    index = rank
    if RAGGED:
        sequences = tl.arange(0, BLOCK_B)
        b, index, blocks = ragged_rank(rank, sequences, offsets_ptr, offsets_stride, batch, rows, seq_len, BLOCK)
    return b, in_order(index, blocks, REVERSED) * BLOCK


@triton.jit
def ragged_rank(rank, sequences, offsets_ptr, offsets_stride, batch, rows, longest, BLOCK: tl.constexpr):
    """(b, index, blocks) of ``rank`` on a ragged grid: the ranks run over the real blocks of every
    sequence, sequence by sequence (cdiv(length, BLOCK) each, the lengths ``packed_sequence`` gives
    from the (batch + 1) offsets at ``offsets_ptr``, ``rows`` and ``longest``; ``sequences``: 0, 1,
    .. at least batch of them, in the caller's layout), so rank r is block ``index`` of the
    ``blocks`` of sequence b, the one whose blocks' running count first passes r; the at most
    ``batch`` ranks past the last sequence's blocks get a block past its end (an empty range: they
    store nothing)."""
    inside = sequences < batch
    _, lengths = packed_sequence(offsets_ptr, tl.minimum(sequences, batch - 1), offsets_stride, rows, longest)
    counts = tl.where(inside, tl.cdiv(lengths, BLOCK), 0)
    ends = tl.cumsum(counts, 0)  # past each sequence's last block
    b = tl.minimum(tl.sum((ends <= rank).to(tl.int32), 0), batch - 1)
    own = sequences == b
    blocks = tl.sum(tl.where(own, counts, 0), 0)
    return b, rank - tl.sum(tl.where(own, ends, 0), 0) + blocks, blocks


@triton.jit
def in_order(index, blocks, REVERSED: tl.constexpr):
    """Block ``index`` of a sequence's ``blocks`` in launch order, or REVERSED from its last to its
    first (the heaviest first where the band grows along the axis); indices past the blocks stay.
    Either way each block is one rank's, once."""
    if REVERSED:
        index = tl.where(index < blocks, blocks - 1 - index, index)
    return index


@triton.jit
def packed_sequence(offsets_ptr, b, offsets_stride, rows, longest):
    """(start, length) of sequence b of ragged offsets, clamped into the ``rows`` packed rows and to
    the ``longest`` (max_seqlen) of them: offsets that break their rules (offsets on a device are
    not checked on the host) give wrong rows, never a read or write outside the tensors."""
    start = tl.load(offsets_ptr + b.to(tl.int64) * offsets_stride).to(tl.int64)
    stop = tl.load(offsets_ptr + (b + 1).to(tl.int64) * offsets_stride).to(tl.int64)
    start = tl.minimum(tl.maximum(start, 0), rows)
    stop = tl.minimum(tl.maximum(stop, start), rows)
    return start.to(tl.int32), tl.minimum(stop - start, longest).to(tl.int32)


@triton.jit
def sequence_lengths(
    b,
    seq_lens_q_ptr,
    seq_lens_kv_ptr,
    seq_lens_strides,
    packed_rows,
    seq_q,
    seq_kv,
    HAS_LENS_Q: tl.constexpr,
    HAS_LENS_KV: tl.constexpr,
    RAGGED: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
):
    """(len_q, len_kv, shift, start_q, start_kv, limit_q, limit_kv) of batch b: the lengths clamped
    to 0..Sq and 0..Skv, the diagonal's shift, the first row of the sequence in its tensors (RAGGED:
    ``packed_sequence`` in the (q, kv) ``packed_rows``; else 0), and the rows its loads and stores
    stop at (the lengths with RAGGED, else Sq and Skv: padding rows are written too)."""
    len_q = seq_q
    len_kv = seq_kv
    start_q = 0
    start_kv = 0
    if RAGGED:
        start_q, len_q = packed_sequence(seq_lens_q_ptr, b, seq_lens_strides[0], packed_rows[0], seq_q)
        start_kv, len_kv = packed_sequence(seq_lens_kv_ptr, b, seq_lens_strides[1], packed_rows[1], seq_kv)
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
    """(lo, hi, inner_lo, inner_hi) of queries start_m .. start_m + BLOCK_M - 1: [lo, hi) the keys
    they may see, lo a multiple of BLOCK_N, empty where every query is past len_q; [inner_lo,
    inner_hi) the interior, the whole key blocks inside len_kv and inside the band of every one of
    the queries, whose scores need no mask: multiples of BLOCK_N, or both hi where there is none.
    The edge blocks are the rest, [lo, inner_lo) and [inner_hi, hi). Queries past len_q (the last
    block's padding) do not bound the interior: a kernel discards or zeroes their results."""
    lo = 0
    hi = len_kv
    inner_lo = 0
    inner_hi = len_kv // BLOCK_N * BLOCK_N
    if HAS_LEFT:  # the first query's first key; the last query's first key
        lo = tl.maximum(start_m + shift - left, 0) // BLOCK_N * BLOCK_N
        inner_lo = tl.cdiv(tl.maximum(start_m + BLOCK_M - 1 + shift - left, 0), BLOCK_N) * BLOCK_N
    if HAS_RIGHT:  # past the last query's last key; past the first query's last key
        hi = tl.minimum(hi, start_m + BLOCK_M + shift + right)
        inner_hi = tl.minimum(inner_hi, tl.maximum(start_m + shift + right + 1, 0) // BLOCK_N * BLOCK_N)
    hi = tl.where(start_m >= len_q, lo, tl.maximum(hi, lo))  # padding rows only, or the band past the keys: none
    inner_lo = tl.minimum(inner_lo, hi)
    inner_hi = tl.minimum(inner_hi, hi)
    return lo, hi, inner_lo, tl.maximum(inner_hi, inner_lo)


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
    """(lo, hi, inner_lo, inner_hi) of keys start_n .. start_n + BLOCK_N - 1: key_range of the
    transposed band (key j is seen by the queries i with j - shift - right <= i <= j - shift + left),
    in queries and multiples of BLOCK_M; keys past len_kv do not bound the interior."""
    return key_range(start_n, len_kv, len_q, -shift, right, left, HAS_RIGHT, HAS_LEFT, BLOCK_N, BLOCK_M)


@triton.jit
def block_loop(lo, hi, inner_lo, inner_hi, EDGE: tl.constexpr):
    """(first, stop, gap) of a loop over a range's interior blocks [inner_lo, inner_hi) (gap 0) or
    over its edge blocks (EDGE): steps [lo, hi - gap) with gap = inner_hi - inner_lo, step s standing
    for the block at s + gap from inner_lo on, so that the loop jumps over the interior."""
    if EDGE:
        return lo, hi - (inner_hi - inner_lo), inner_hi - inner_lo
    else:
        return inner_lo, inner_hi, 0


@triton.jit
def rounded_to_fp8(x, dtype: tl.constexpr, ON_GRID: tl.constexpr):
    """float32 ``x`` as ``dtype``: rounded to nearest even and saturated at the largest finite value
    where ``dtype`` is fp8 (the GPU's cvt.rn.satfinite), converted as it is otherwise. ON_GRID (on
    Triton's interpreter, whose conversion to fp8 cuts the mantissa without carrying a round-up into
    the exponent, and cuts subnormals) first saturates and rounds in float32 to the fp8 type's values:
    normal ones by Veltkamp's split (c = x * (2**(23 - mantissa bits) + 1), x = c - (c - x)),
    subnormal ones to a multiple of the smallest, q, by adding and taking away 1.5 * 2**23 * q; the
    conversion of the result is exact."""
    if ON_GRID and (dtype == tl.float8e4nv or dtype == tl.float8e5):
        if dtype == tl.float8e4nv:  # 3 mantissa bits, smallest normal 2**-6, smallest subnormal 2**-9
            largest, split, normal, shifter = 448.0, 1048577.0, 0.015625, 24576.0
        else:  # 2 mantissa bits, smallest normal 2**-14, smallest subnormal 2**-16
            largest, split, normal, shifter = 57344.0, 2097153.0, 0.00006103515625, 192.0
        x = tl.minimum(tl.maximum(x, -largest), largest)
        c = x * split
        x = tl.where(tl.abs(x) < normal, (x + shifter) - shifter, c - (c - x))
    return x.to(dtype)


@triton.jit
def compute_scalar(value, COMPUTE: tl.constexpr):
    """A float argument in the COMPUTE dtype, as a 1-element tensor (Triton's interpreter rounds
    tl.cast of a float argument through float32; tl.full keeps its float64 digits)."""
    return tl.full((1,), value, COMPUTE)


@triton.jit
def log2_score_scalars(scale, softcap, SOFTCAP: tl.constexpr, COMPUTE: tl.constexpr):
    """(multiplier, cap) in the COMPUTE dtype for tile_scores, whose scores are in log2 units (the
    natural ones times LOG2E, so that exp(s - m) is exp2 of a difference): q k^T times scale *
    LOG2E; with SOFTCAP, tanh's argument q k^T times scale / softcap and the cap softcap * LOG2E."""
    scale = compute_scalar(scale, COMPUTE)
    softcap = compute_scalar(softcap, COMPUTE)
    if SOFTCAP:
        return scale / softcap, softcap * LOG2E
    else:
        return scale * LOG2E, softcap


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
    EDGE: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """(s, t): the tile's scores in log2 units (the natural ones times LOG2E), -inf where the key
    takes no part, and tanh of the capped scores (the softcap's derivative needs it; s itself without
    a softcap). ``scale`` and ``softcap`` are log2_score_scalars'; BIAS_ADD: the bias is added to the
    scores, BIAS_MASK: it is a boolean mask; ALIBI: ``slope`` (log2 units, head_slope's) times the
    key's distance to the diagonal is subtracted. EDGE: some (query, key) pair of the tile may lie
    outside the lengths or the band; else the tile is in its range's interior and its scores are not
    masked (but for a boolean mask's own)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION, out_dtype=COMPUTE) * scale
    t = s
    if SOFTCAP:
        t = tanh_of(s)
        s = softcap * t
    if BIAS_ADD or BIAS_MASK:  # broadcast dims have stride 0
        bias_base = head_base(b, h, bias_strides, 0)
        # masked in the interior too, whose padding queries or keys may lie past Sq or Skv
        bias = load_tile(bias_ptr, bias_base, rows, columns, bias_strides, seq_q, seq_kv, 0)
        if BIAS_ADD:
            s += bias.to(COMPUTE) * LOG2E
        else:
            s = tl.where(bias != 0, s, float("-inf"))
    diagonal = rows + shift
    if ALIBI:
        s -= slope * tl.abs(columns[None, :] - diagonal[:, None]).to(COMPUTE)
    if EDGE:
        allowed = (rows < len_q)[:, None] & (columns < len_kv)[None, :]
        if HAS_LEFT:
            allowed &= columns[None, :] >= (diagonal - left)[:, None]
        if HAS_RIGHT:
            allowed &= columns[None, :] <= (diagonal + right)[:, None]
        s = tl.where(allowed, s, float("-inf"))
    return s, t


@triton.jit
def head_slope(alibi_slopes_ptr, b, h, alibi_strides, ALIBI: tl.constexpr, COMPUTE: tl.constexpr):
    """The ALiBi slope of batch b and query head h in COMPUTE and log2 units (times LOG2E; 0 without
    ALiBi); a batch stride of 0 for slopes of one per head."""
    slope = tl.zeros((), COMPUTE)
    if ALIBI:
        slope = tl.load(alibi_slopes_ptr + b.to(tl.int64) * alibi_strides[0] + h * alibi_strides[1]).to(COMPUTE) * LOG2E
    return slope


@triton.jit
def dropout_kept(seed, offset, b, h, rows, columns, heads_q, seq_q, seq_kv, dropout_p):
    """True where the weight (b, h, i, j) is kept: tl.rand at counter offset + ((b * Hq + h) * Sq + i) * Skv + j."""
    base = offset + (b.to(tl.int64) * heads_q + h) * seq_q * seq_kv
    counters = base + rows.to(tl.int64)[:, None] * seq_kv + columns[None, :]
    return tl.rand(seed, counters) >= dropout_p


def block_grid(problem: AttentionProblem, heads: int, rows: int, seq_len: int, block: int) -> tuple[int, int]:
    """The grid of a kernel with a program per block of one side's rows (``block`` of them) and
    head: (blocks of seq_len, batch * heads), or with ragged sequences (blocks, heads) over the
    real blocks, which ``rows`` packed tokens in ``batch`` sequences bound by cdiv(rows, block) +
    batch (each sequence's last block may be partial) without reading the offsets on the host."""
    batch = problem.batch
    if not problem.ragged:
        return triton.cdiv(seq_len, block), batch * heads
    return min(triton.cdiv(rows, block) + batch, batch * triton.cdiv(seq_len, block)), heads


def query_block_grid(problem: AttentionProblem, block: int) -> tuple[int, int]:
    """``block_grid`` of the query side: a program per ``block`` queries of a query head."""
    return block_grid(problem, problem.q.dims[1], problem.q.dims[2], problem.seq_q, block)
