"""The consumers' loops over a program's key blocks in the warp-specialized attention forward
(``gluon_forward``, whose docstring describes the partitions, the ring and the schedules): per key
block S = Q K^T, the online softmax, O += P V, in the order of the SCHEDULE they serve
(``independent_blocks``: INDEPENDENT and PING_PONG; ``overlapped_blocks``: OVERLAP and
PING_PONG_OVERLAP), with the pieces they share: the ping-pong turns, the softmax of one score tile,
P as the A operand in registers and the value box as the B operand (v^T's box with fp8 data).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from opendnn.families.attention.triton_tiles import block_loop


@gluon.jit
def block_position(step, inner_lo, gap):
    """The first key of the block that loop position ``step`` of ``block_loop`` stands for."""
    return step + gl.where(step < inner_lo, 0, gap)


@gluon.jit
def fill_ring(
    k_desc,
    v_desc,
    k_ring,
    v_ring,
    k_ready,
    v_ready,
    empty,
    b,
    kv_head,
    lo,
    hi,
    inner_lo,
    inner_hi,
    step,
    VALUES_TRANSPOSED: gl.constexpr,
):
    """A producer's walk over one query block's key blocks in the consumers' order (``block_loop``:
    the interior's, then the edge's): per block, once its stage of the ring is empty, the key box and
    the value box (VALUES_TRANSPOSED: v^T's, the keys contiguous) copied into it. ``step``: the ring's
    blocks filled before; returns the count after."""
    STAGES: gl.constexpr = k_ring.shape[0]
    BLOCK_N: gl.constexpr = k_ring.shape[3]
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for position in range(first, stop, BLOCK_N):
            start_n = block_position(position, inner_lo, gap)
            stage = step % STAGES
            mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)  # a fresh barrier passes phase 1
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, kv_head, start_n, 0], k_ready.index(stage), k_ring.index(stage))
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            v_box = [b, kv_head, start_n, 0] if not VALUES_TRANSPOSED else [b, kv_head, 0, start_n]
            tma.async_copy_global_to_shared(v_desc, v_box, v_ready.index(stage), v_ring.index(stage))
            step += 1
    return step


@gluon.jit
def take_turn(turn, section, HALF: gl.constexpr, PING_PONG: gl.constexpr):
    """Ping-pong: wait until the other consumer has issued its products of the section before
    ``section`` (the first consumer's section 0 starts at once: a fresh barrier passes phase 1)."""
    if PING_PONG:
        mbarrier.wait(turn.index(HALF), (section + 1 - HALF) & 1)


@gluon.jit
def pass_turn(turn, HALF: gl.constexpr, PING_PONG: gl.constexpr):
    """Ping-pong: this consumer's products of a section are issued; the other consumer's turn."""
    if PING_PONG:
        mbarrier.arrive(turn.index(1 - HALF))


@gluon.jit
def masked_scores(s, rows, start_n, seq_q, seq_kv, shift, CAUSAL: gl.constexpr):
    """The score tile ``s`` of query rows ``rows`` by the key block at ``start_n``, -inf where a
    pair takes no part: keys past Skv, queries past Sq and, causal, keys past a query's diagonal."""
    columns = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
    allowed = (columns < seq_kv)[None, :] & (rows < seq_q)[:, None]
    if CAUSAL:
        allowed &= columns[None, :] <= (rows + shift)[:, None]
    return gl.where(allowed, s, float("-inf"))


@gluon.jit
def online_softmax(
    s,
    m,
    total,
    start_n,
    rows,
    seq_q,
    seq_kv,
    shift,
    scale,
    MASKED: gl.constexpr,
    CAUSAL: gl.constexpr,
    FP8: gl.constexpr,
):
    """(p in float32, the new row maxima, the new row sums, the factor that rescales O) of the score
    tile ``s`` of the key block at ``start_n``, in log2 units; MASKED (an edge block): keys past Skv
    and, causal, past each row's diagonal take no part. FP8: the exponentials subtract the maxima
    rounded up to whole numbers, so that every rescaling is a power of two (triton_forward's fp8)."""
    s = s * scale
    if MASKED:
        s = masked_scores(s, rows, start_n, seq_q, seq_kv, shift, CAUSAL)
    m_new = gl.maximum(m, gl.max(s, 1))
    m_old = m
    if FP8:
        m_old = gl.ceil(m)
        shift_m = gl.ceil(m_new)
    else:
        shift_m = m_new
    shift_m = gl.where(shift_m == float("-inf"), 0.0, shift_m)  # -inf - -inf never forms
    rescale = gl.exp2(m_old - shift_m)
    p = gl.exp2(s - shift_m[:, None])
    return p, m_new, total * rescale + gl.sum(p, 1), rescale


@gluon.jit
def weights_operand(p, scale_s, dtype: gl.constexpr, P_LAYOUT: gl.constexpr, FP8: gl.constexpr):
    """P as the A operand of P V in registers: rounded to the data dtype, with FP8 after its
    multiplication by scale_s (cvt.rn.satfinite)."""
    if FP8:
        p = p * scale_s
    return gl.convert_layout(p.to(dtype), P_LAYOUT)


@gluon.jit
def value_operand(v_ring, stage, FP8: gl.constexpr):
    """The [BLOCK_N, Dv] B operand of P V in ``stage``: the value box, or with FP8 the box of v^T
    permuted (8-bit wgmma operands are K-major, the keys contiguous)."""
    if FP8:
        return v_ring.index(stage).reshape([v_ring.shape[3], v_ring.shape[4]]).permute((1, 0))
    else:
        return v_ring.index(stage).reshape([v_ring.shape[3], v_ring.shape[4]])


@gluon.jit
def products_done(o, p, FP8: gl.constexpr):
    """(o, p) once every product this consumer issued is complete; p, the A operand of the last P V,
    is a dependency of the wait where it is 16-bit (the wait takes no 8-bit tensor: with FP8, p is
    only overwritten after the wait)."""
    if FP8:
        o = warpgroup_mma_wait(0, deps=(o,))
    else:
        o, p = warpgroup_mma_wait(0, deps=(o, p))
    return o, p


@gluon.jit
def independent_blocks(
    q,
    k_ring,
    v_ring,
    k_ready,
    v_ready,
    empty,
    q_empty,
    turn,
    m,
    total,
    o,
    step,
    section,
    rows,
    lo,
    hi,
    inner_lo,
    inner_hi,
    seq_q,
    seq_kv,
    shift,
    scale,
    scale_s,
    HALF: gl.constexpr,
    PING_PONG: gl.constexpr,
    CAUSAL: gl.constexpr,
    FP8: gl.constexpr,
    BLOCK_N: gl.constexpr,
    S_LAYOUT: gl.constexpr,
    O_LAYOUT: gl.constexpr,
):
    """Schedules INDEPENDENT and PING_PONG: per key block, S = Q K^T issued and waited for together
    with the previous block's P V, the softmax, then P V issued. A ping-pong section is the previous
    block's P V and this block's Q K^T. ``step`` and ``section``: the ring's blocks and the ping-pong
    sections the consumer's earlier query blocks took; returns (m, total, o, step, section) after
    this query block's."""
    STAGES: gl.constexpr = k_ring.shape[0]
    HALF_M: gl.constexpr = q.shape[0]
    HEAD_DIM: gl.constexpr = q.shape[1]
    # wgmma's A operand from registers: 32 bits of consecutive k a thread
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=O_LAYOUT, k_width=32 // q.dtype.primitive_bitwidth
    )
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    o = warpgroup_mma_init(o)  # waited for with each block's scores
    take_turn(turn, section, HALF, PING_PONG)
    first_step = step
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for position in range(first, stop, BLOCK_N):
            stage = step % STAGES
            phase = step // STAGES & 1
            mbarrier.wait(k_ready.index(stage), phase)
            k = k_ring.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            s = warpgroup_mma(q, k, gl.zeros([HALF_M, BLOCK_N], gl.float32, S_LAYOUT), use_acc=False, is_async=True)
            pass_turn(turn, HALF, PING_PONG)
            s, o = warpgroup_mma_wait(0, deps=(s, o))  # the previous block's P V is done too: release its stage
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=step > first_step)
            start_n = block_position(position, inner_lo, gap)
            p, m, total, rescale = online_softmax(
                s, m, total, start_n, rows, seq_q, seq_kv, shift, scale, EDGE, CAUSAL, FP8
            )
            o = o * gl.convert_layout(rescale, O_ROWS)[:, None]
            p = weights_operand(p, scale_s, q.dtype, P_LAYOUT, FP8)
            mbarrier.wait(v_ready.index(stage), phase)
            section += 1
            take_turn(turn, section, HALF, PING_PONG)
            o = warpgroup_mma(p, value_operand(v_ring, stage, FP8), o, is_async=True)
            step += 1
    mbarrier.arrive(q_empty)  # every Q K^T is complete: the query boxes may take the next block's
    pass_turn(turn, HALF, PING_PONG)
    o = warpgroup_mma_wait(0, deps=(o,))
    mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=step > first_step)
    return m, total, o, step, section + 1


@gluon.jit
def overlapped_blocks(
    q,
    k_ring,
    v_ring,
    k_ready,
    v_ready,
    empty,
    q_empty,
    turn,
    m,
    total,
    o,
    step,
    section,
    rows,
    lo,
    hi,
    inner_lo,
    inner_hi,
    seq_q,
    seq_kv,
    shift,
    scale,
    scale_s,
    HALF: gl.constexpr,
    PING_PONG: gl.constexpr,
    CAUSAL: gl.constexpr,
    FP8: gl.constexpr,
    BLOCK_N: gl.constexpr,
    S_LAYOUT: gl.constexpr,
    O_LAYOUT: gl.constexpr,
):
    """Schedules OVERLAP and PING_PONG_OVERLAP (FlashAttention-3's intra-warpgroup overlap): the
    first block's scores and softmax alone, then per key block S = Q K^T issued, the previous block's
    P V issued behind it, S waited for alone, so that the softmax runs while P V is on the tensor
    cores; O is rescaled once P V is done. A ping-pong section is one block's Q K^T and the previous
    block's P V. ``step`` and ``section``: the ring's blocks and the ping-pong sections the
    consumer's earlier query blocks took; returns (m, total, o, step, section) after this query
    block's."""
    STAGES: gl.constexpr = k_ring.shape[0]
    HALF_M: gl.constexpr = q.shape[0]
    HEAD_DIM: gl.constexpr = q.shape[1]
    # wgmma's A operand from registers: 32 bits of consecutive k a thread
    P_LAYOUT: gl.constexpr = gl.DotOperandLayout(
        operand_index=0, parent=O_LAYOUT, k_width=32 // q.dtype.primitive_bitwidth
    )
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    interior = (inner_lo < inner_hi).to(gl.int32)  # the first block is the interior's first, else lo
    started = (hi > lo).to(gl.int32)
    p = gl.zeros([HALF_M, BLOCK_N], q.dtype, P_LAYOUT)
    if hi > lo:  # the first block, masked wherever it lies
        take_turn(turn, section, HALF, PING_PONG)
        mbarrier.wait(k_ready.index(step % STAGES), step // STAGES & 1)
        k = k_ring.index(step % STAGES).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
        s = warpgroup_mma(q, k, gl.zeros([HALF_M, BLOCK_N], gl.float32, S_LAYOUT), use_acc=False, is_async=True)
        pass_turn(turn, HALF, PING_PONG)
        s = warpgroup_mma_wait(0, deps=(s,))
        start_n = inner_lo * interior + lo * (1 - interior)
        p, m, total, _ = online_softmax(s, m, total, start_n, rows, seq_q, seq_kv, shift, scale, True, CAUSAL, FP8)
        p = weights_operand(p, scale_s, q.dtype, P_LAYOUT, FP8)
    current = step + started  # the ring's block after the first
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        skip = BLOCK_N * (1 - interior) if EDGE else BLOCK_N * interior  # the first block, done
        for position in range(first + skip, stop, BLOCK_N):
            stage = current % STAGES
            previous = (current + STAGES - 1) % STAGES
            take_turn(turn, section + current - step, HALF, PING_PONG)
            mbarrier.wait(k_ready.index(stage), current // STAGES & 1)
            k = k_ring.index(stage).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0))
            s = warpgroup_mma(q, k, gl.zeros([HALF_M, BLOCK_N], gl.float32, S_LAYOUT), use_acc=False, is_async=True)
            mbarrier.wait(v_ready.index(previous), (current - 1) // STAGES & 1)
            o = warpgroup_mma(p, value_operand(v_ring, previous, FP8), o, is_async=True)
            pass_turn(turn, HALF, PING_PONG)
            s = warpgroup_mma_wait(1, deps=(s,))  # S alone: the previous block's P V may still run
            start_n = block_position(position, inner_lo, gap)
            p_next, m, total, rescale = online_softmax(
                s, m, total, start_n, rows, seq_q, seq_kv, shift, scale, EDGE, CAUSAL, FP8
            )
            o, p = products_done(o, p, FP8)
            mbarrier.arrive(empty.index(previous))
            o = o * gl.convert_layout(rescale, O_ROWS)[:, None]
            p = weights_operand(p_next, scale_s, q.dtype, P_LAYOUT, FP8)
            current += 1
    mbarrier.arrive(q_empty)  # every Q K^T is complete: the query boxes may take the next block's
    if hi > lo:  # the last block's P V
        previous = (current + STAGES - 1) % STAGES
        take_turn(turn, section + current - step, HALF, PING_PONG)
        mbarrier.wait(v_ready.index(previous), (current - 1) // STAGES & 1)
        o = warpgroup_mma(p, value_operand(v_ring, previous, FP8), o, is_async=True)
        pass_turn(turn, HALF, PING_PONG)
        o, p = products_done(o, p, FP8)
        mbarrier.arrive(empty.index(previous))
    return m, total, o, current, section + current - step + started
