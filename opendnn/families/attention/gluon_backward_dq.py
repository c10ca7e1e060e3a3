"""The attention backward's dQ on Hopper (sm_90): the forward's warp-specialized anatomy
(``gluon_forward``) in Gluon, deterministic (no atomics: each dQ row summed by one program, its key
blocks in one fixed order).

FLOPs and bytes are those of the ``tl`` dQ kernel (``triton_backward``): three products a (query,
key) pair, ``2 * pairs * (2 * D + Dv)``, one of the backward's 3.5 forwards of work; q, dO, the
stats and delta read once, k and v once a query block that sees them (mostly from L2), dQ written
once. As in the forward, the products dominate past a few hundred keys a query, so the aim is tensor
cores that never wait: for loads (TMA, a ring of key and value blocks filled ahead by a warp of its
own) or for the exponentials between the products (two consumer warpgroups, each issuing its
products asynchronously, fill the tensor cores while the other computes).

One program per (query block of BLOCK_M = 128 rows, batch b, query head h), key/value head
``h // group`` (GQA): the forward's grid, order (``scheduled_block``: under a causal mask the last
query blocks, the heaviest, first) and key ranges (``key_range`` and ``block_loop``: the interior's
key blocks unmasked, then the edge blocks masked). Three partitions of warps talk only through
shared memory and mbarriers:

- **producer** (``key_value_producer``, 1 warp, PRODUCER_REGISTERS registers a thread): builds the
  TMA descriptors of q, k, v and dO (4-D ``[B, H, S, D]`` at the tensors' strides, zero-filled past
  S) on the device, copies the query block and its dO once as two 64-row boxes each
  (``rows_ready``), then per key block, in the consumers' order, waits until a stage of the ring is
  empty and copies the BLOCK_N x D key box (``k_ready``) and the BLOCK_N x Dv value box
  (``v_ready``) into it.
- **two consumers** (``gradient_consumer``, one warpgroup each, CONSUMER_REGISTERS registers a
  thread; the first is the kernel's own 4 warps): consumer ``half`` owns query rows ``64 half .. 64
  half + 63`` and their float32 dQ (64 x D), with the rows' logsumexp and delta loaded once (plain
  loads; the delta workspace is the ``tl`` delta kernel's). Per key block: S = Q K^T and dP = dO V^T
  issued asynchronously (``issue_products``: both operands in shared memory, K and V permuted), the
  previous block's dQ += dS K issued behind them (K's box as loaded, dS the A operand in registers);
  S waited for alone; P = exp2(S scale log2(e) - lse log2(e)) in float32 (``score_gradient``; the
  edge blocks mask keys past Skv and, causal, keys past a query's diagonal); dP waited for; dS = P
  (dP - delta), rounded to the data dtype and converted in registers to the A operand; the previous
  dS K waited for and its stage released. The first block's dS is computed alone (masked wherever it
  lies), the last block's dS K after the loops. After it: dQ times the softmax scale, cast and
  stored at dq's strides, rows past Sq not stored (TMA's zero rows and their +inf logsumexp make
  them 0 before).

Numerics are the ``tl`` kernel's: scores and the logsumexp in log2 units, the same stats and delta,
float32 products and dS rounded to the data dtype before its product with k.

**Ring and barriers.** STAGES stages, each a key box and a value box. ``k_ready[s]`` and
``v_ready[s]`` count one arrival (the producer's ``expect``) plus their box's bytes, so S starts
before V lands; ``empty[s]`` counts two arrivals, one per consumer warpgroup, issued once its dQ
product on the stage is complete. Block ``i`` of a program uses stage ``i % STAGES`` in phase
``(i // STAGES) & 1``; the producer waits on ``empty`` with the phase flipped, which a fresh barrier
passes.

**Schedule.** The forward's intra-warpgroup overlap (``gluon_key_blocks.overlapped_blocks``): the
exponentials and dS of one block run while the previous block's dS K is on the tensor cores; every
product is waited for within the block that issues it (a product carried in flight past the loop's
end makes ptxas serialize every wgmma, as in ``gluon_backward``). Compiled for sm_90 it spills
nothing at BLOCK_N 64, as the order without the overlap (each block's dS K issued and waited for
after its own dS) does not either; at BLOCK_N 128 the overlap spills and serializes the wgmmas,
and the order without it spills too under a causal mask (docs/design/attention.md, "Backward on
Hopper").

**Registers.** 12 warps, 168 registers a thread at launch; ``setmaxnreg`` leaves the producer 24 and
gives each consumer 240: dQ (D / 2 float32 a thread), S and dP (BLOCK_N / 2 each), two dS in 16
bits (the previous block's and this one's, BLOCK_N / 4 each), and the rows' lse and delta.

**Arguments.** The partitions take every scalar as an argument of its own, written out where
``warp_specialize`` is called (as in ``gluon_forward``).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from opendnn.families.attention.gluon_backward import READ_SLOTS, head_descriptor, row_statistics
from opendnn.families.attention.gluon_forward import tma_strides
from opendnn.families.attention.gluon_key_blocks import block_position, fill_ring, masked_scores
from opendnn.families.attention.problem import AttentionProblem, DiagonalAlignment
from opendnn.families.attention.triton_tiles import LOG2E, block_loop, key_range, scheduled_block
from opendnn.kernels.launch import Launch, Slot

CONSUMER_REGISTERS = gl.constexpr(240)
PRODUCER_REGISTERS = gl.constexpr(24)
BLOCK_M = 128  # query rows a program: 64 a consumer warpgroup
BLOCK_N = 64  # keys a step: S and dP are 64 x 64 float32 a consumer
STAGES = 4  # key and value boxes in the ring: 128 KB of shared memory beside q and dO at head dim 128


@gluon.jit
def program_rows(
    q_ptr,
    batch,
    heads_q,
    seq_q,
    seq_kv,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """(b, h, first query, lo, hi, inner_lo, inner_hi, shift) of the program: its query block
    (``scheduled_block``, as the forward's) and the key blocks it sees (``key_range``)."""
    b = gl.program_id(1) // heads_q
    h = gl.program_id(1) % heads_q
    b, start_m = scheduled_block(gl.program_id(0), b, q_ptr, 0, batch, seq_q, seq_q, CAUSAL, False, BLOCK_M, 1)
    shift = 0
    if BOTTOM_RIGHT:  # the diagonal ends at the last query and key
        shift = seq_kv - seq_q
    lo, hi, inner_lo, inner_hi = key_range(start_m, seq_q, seq_kv, shift, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    return b, h, start_m, lo, hi, inner_lo, inner_hi, shift


@gluon.jit
def key_value_producer(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    q_boxes,
    do_boxes,
    k_ring,
    v_ring,
    rows_ready,
    k_ready,
    v_ready,
    empty,
    batch,
    heads_q,
    heads_kv,
    group,
    seq_q,
    seq_kv,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_s,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    do_stride_b,
    do_stride_h,
    do_stride_s,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """Fill the query and dO boxes once, then the ring with the program's key and value blocks."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    q_desc = head_descriptor(q_ptr, batch, heads_q, seq_q, q_stride_b, q_stride_h, q_stride_s, q_boxes)
    do_desc = head_descriptor(do_ptr, batch, heads_q, seq_q, do_stride_b, do_stride_h, do_stride_s, do_boxes)
    k_desc = head_descriptor(k_ptr, batch, heads_kv, seq_kv, k_stride_b, k_stride_h, k_stride_s, k_ring)
    v_desc = head_descriptor(v_ptr, batch, heads_kv, seq_kv, v_stride_b, v_stride_h, v_stride_s, v_ring)
    b, h, start_m, lo, hi, inner_lo, inner_hi, _ = program_rows(
        q_ptr, batch, heads_q, seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N
    )
    kv_head = h // group
    mbarrier.expect(rows_ready, 2 * (q_desc.block_type.nbytes + do_desc.block_type.nbytes))
    for half in gl.static_range(2):
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m + half * HALF_M, 0], rows_ready, q_boxes.index(half))
        tma.async_copy_global_to_shared(do_desc, [b, h, start_m + half * HALF_M, 0], rows_ready, do_boxes.index(half))
    first_step = gl.to_tensor(0)  # a count the walk adds to
    fill_ring(
        k_desc, v_desc, k_ring, v_ring, k_ready, v_ready, empty, b, kv_head, lo, hi, inner_lo, inner_hi,
        first_step, False,
    )  # fmt: skip


@gluon.jit
def key_operand(k_ring, stage):
    """The [BLOCK_N, D] B operand of dS K in ``stage``: the key box as loaded."""
    return k_ring.index(stage).reshape([k_ring.shape[3], k_ring.shape[4]])


@gluon.jit
def issue_products(q, do, k_ring, v_ring, k_ready, v_ready, step, zeros):
    """S = Q K^T and dP = dO V^T of the key block of loop step ``step`` issued asynchronously, each
    once its box has landed (K and V permuted)."""
    STAGES: gl.constexpr = k_ring.shape[0]
    stage = step % STAGES
    phase = step // STAGES & 1
    mbarrier.wait(k_ready.index(stage), phase)
    s = warpgroup_mma(q, key_operand(k_ring, stage).permute((1, 0)), zeros, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(stage), phase)
    v = v_ring.index(stage).reshape([v_ring.shape[3], v_ring.shape[4]])
    dp = warpgroup_mma(do, v.permute((1, 0)), zeros, use_acc=False, is_async=True)
    return s, dp


@gluon.jit
def score_gradient(
    s,
    dp,
    lse,
    delta,
    rows,
    start_n,
    seq_q,
    seq_kv,
    shift,
    scale_log2,
    dtype: gl.constexpr,
    PENDING: gl.constexpr,
    MASKED: gl.constexpr,
    CAUSAL: gl.constexpr,
    DS_LAYOUT: gl.constexpr,
):
    """dS = P (dP - delta) of the key block at ``start_n``, rounded to the data dtype as the A operand
    of dS K: S waited for (PENDING products issued after dP may still run), P = exp2(S scale_log2 -
    lse), dP waited for. MASKED (an edge block): keys past Skv, queries past Sq and, causal, keys
    past a query's diagonal take no part."""
    s = warpgroup_mma_wait(PENDING + 1, deps=(s,))  # dP may still run
    s = s * scale_log2
    if MASKED:
        s = masked_scores(s, rows, start_n, seq_q, seq_kv, shift, CAUSAL)
    p = gl.exp2(s - lse[:, None])
    dp = warpgroup_mma_wait(PENDING, deps=(dp,))
    return gl.convert_layout((p * (dp - delta[:, None])).to(dtype), DS_LAYOUT)


@gluon.jit
def gradient_consumer(
    q_ptr,
    q_boxes,
    do_boxes,
    k_ring,
    v_ring,
    rows_ready,
    k_ready,
    v_ready,
    empty,
    stats_ptr,
    delta_ptr,
    dq_ptr,
    batch,
    heads_q,
    seq_q,
    seq_kv,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    dq_stride_b,
    dq_stride_h,
    dq_stride_s,
    dq_stride_d,
    scale,
    HALF: gl.constexpr,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """dQ of rows ``HALF * BLOCK_M / 2`` on of the program's query block: per key block S and dP, the
    previous block's dS K behind them, this block's dS; then the store."""
    STAGES: gl.constexpr = k_ring.shape[0]
    HALF_M: gl.constexpr = BLOCK_M // 2
    HEAD_DIM: gl.constexpr = q_boxes.shape[4]
    VALUE_DIM: gl.constexpr = do_boxes.shape[4]
    dtype: gl.constexpr = q_boxes.dtype
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    DQ_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    DS_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=DQ_LAYOUT, k_width=2)
    b, h, start_m, lo, hi, inner_lo, inner_hi, shift = program_rows(
        q_ptr, batch, heads_q, seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N
    )
    rows = start_m + HALF * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, S_LAYOUT))
    lse, delta = row_statistics(
        stats_ptr, delta_ptr, b, h, rows, heads_q, seq_q, stats_stride_b, stats_stride_h, stats_stride_s, True
    )
    scale_log2 = scale * LOG2E  # scores in log2 units, as the stats after row_statistics
    q = q_boxes.index(HALF).reshape([HALF_M, HEAD_DIM])
    do = do_boxes.index(HALF).reshape([HALF_M, VALUE_DIM])
    dq = gl.zeros([HALF_M, HEAD_DIM], gl.float32, DQ_LAYOUT)
    zeros = gl.zeros([HALF_M, BLOCK_N], gl.float32, S_LAYOUT)
    mbarrier.wait(rows_ready, 0)
    interior = (inner_lo < inner_hi).to(gl.int32)  # the first block is the interior's first, else lo
    ds = gl.zeros([HALF_M, BLOCK_N], dtype, DS_LAYOUT)
    if hi > lo:  # the first block's dS alone, masked wherever it lies
        s, dp = issue_products(q, do, k_ring, v_ring, k_ready, v_ready, 0, zeros)
        start_n = inner_lo * interior + lo * (1 - interior)
        ds = score_gradient(
            s, dp, lse, delta, rows, start_n, seq_q, seq_kv, shift, scale_log2, dtype, 0, True, CAUSAL, DS_LAYOUT
        )
    step = 1
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        skip = BLOCK_N * (1 - interior) if EDGE else BLOCK_N * interior  # the first block, done
        for position in range(first + skip, stop, BLOCK_N):
            s, dp = issue_products(q, do, k_ring, v_ring, k_ready, v_ready, step, zeros)
            previous = (step + STAGES - 1) % STAGES
            dq = warpgroup_mma(ds, key_operand(k_ring, previous), dq, is_async=True)  # the previous block's
            ds_next = score_gradient(
                s, dp, lse, delta, rows, block_position(position, inner_lo, gap), seq_q, seq_kv, shift, scale_log2,
                dtype, 1, EDGE, CAUSAL, DS_LAYOUT,
            )  # fmt: skip
            dq, ds = warpgroup_mma_wait(0, deps=(dq, ds))
            mbarrier.arrive(empty.index(previous))
            ds = ds_next
            step += 1
    if hi > lo:  # the last block's dS K
        previous = (step + STAGES - 1) % STAGES
        dq = warpgroup_mma(ds, key_operand(k_ring, previous), dq, is_async=True)
        dq, ds = warpgroup_mma_wait(0, deps=(dq, ds))
        mbarrier.arrive(empty.index(previous))
    dq = dq * scale
    dq_rows = start_m + HALF * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, DQ_LAYOUT))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, DQ_LAYOUT))
    dq_base = dq_ptr + b.to(gl.int64) * dq_stride_b + h.to(gl.int64) * dq_stride_h
    offsets = dq_rows.to(gl.int64)[:, None] * dq_stride_s + dims[None, :] * dq_stride_d
    gl.store(dq_base + offsets, dq.to(dq_ptr.dtype.element_ty), mask=(dq_rows < seq_q)[:, None])


@gluon.jit
def attention_dq_warp_specialized_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    stats_ptr,
    delta_ptr,
    dq_ptr,
    batch,
    heads_q,
    heads_kv,
    group,
    seq_q,
    seq_kv,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_s,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    do_stride_b,
    do_stride_h,
    do_stride_s,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    dq_stride_b,
    dq_stride_h,
    dq_stride_s,
    dq_stride_d,
    scale: tl.float32,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):
    """dQ of one query block of batch b, query head h: program (rank, b * Hq + h). Strides are in
    elements, (B, H, S, D) order; q, k, v and dO have a unit head-dim stride; delta is the ``tl``
    delta kernel's workspace, (b * Hq + h) * Sq + i."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    ROWS_BOX: gl.constexpr = [1, 1, BLOCK_M // 2, HEAD_DIM]
    KV_BOX: gl.constexpr = [1, 1, BLOCK_N, HEAD_DIM]
    ROWS_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(ROWS_BOX, dtype)
    KV_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(KV_BOX, dtype)
    q_boxes = gl.allocate_shared_memory(dtype, [2] + ROWS_BOX, ROWS_LAYOUT)
    do_boxes = gl.allocate_shared_memory(dtype, [2] + ROWS_BOX, ROWS_LAYOUT)
    k_ring = gl.allocate_shared_memory(dtype, [STAGES] + KV_BOX, KV_LAYOUT)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES] + KV_BOX, KV_LAYOUT)
    rows_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(rows_ready, count=1)
    for stage in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    # the consumers' argument tuples differ only in HALF (module docstring, "Arguments")
    gl.warp_specialize(  # the first partition runs in the kernel's own 4 warps
        [
            (
                gradient_consumer,
                (
                    q_ptr,
                    q_boxes,
                    do_boxes,
                    k_ring,
                    v_ring,
                    rows_ready,
                    k_ready,
                    v_ready,
                    empty,
                    stats_ptr,
                    delta_ptr,
                    dq_ptr,
                    batch,
                    heads_q,
                    seq_q,
                    seq_kv,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    dq_stride_b,
                    dq_stride_h,
                    dq_stride_s,
                    dq_stride_d,
                    scale,
                    0,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    BLOCK_M,
                    BLOCK_N,
                ),
            ),
            (
                gradient_consumer,
                (
                    q_ptr,
                    q_boxes,
                    do_boxes,
                    k_ring,
                    v_ring,
                    rows_ready,
                    k_ready,
                    v_ready,
                    empty,
                    stats_ptr,
                    delta_ptr,
                    dq_ptr,
                    batch,
                    heads_q,
                    seq_q,
                    seq_kv,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    dq_stride_b,
                    dq_stride_h,
                    dq_stride_s,
                    dq_stride_d,
                    scale,
                    1,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    BLOCK_M,
                    BLOCK_N,
                ),
            ),
            (
                key_value_producer,
                (
                    q_ptr,
                    k_ptr,
                    v_ptr,
                    do_ptr,
                    q_boxes,
                    do_boxes,
                    k_ring,
                    v_ring,
                    rows_ready,
                    k_ready,
                    v_ready,
                    empty,
                    batch,
                    heads_q,
                    heads_kv,
                    group,
                    seq_q,
                    seq_kv,
                    q_stride_b,
                    q_stride_h,
                    q_stride_s,
                    k_stride_b,
                    k_stride_h,
                    k_stride_s,
                    v_stride_b,
                    v_stride_h,
                    v_stride_s,
                    do_stride_b,
                    do_stride_h,
                    do_stride_s,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    BLOCK_M,
                    BLOCK_N,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, PRODUCER_REGISTERS],
    )


# ---- launcher ------------------------------------------------------------------------------------


def launch_arguments(problem: AttentionProblem) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, arguments, keyword arguments) of the kernel's launch on ``problem`` (in scope), its
    tensors Slots named by the problem's slots, and "delta" the ``tl`` delta kernel's workspace."""
    do_desc, stats_desc, dq_desc = problem.do, problem.stats, problem.dq
    assert do_desc is not None and stats_desc is not None and dq_desc is not None
    heads_q = problem.q.dims[1]
    grid = (triton.cdiv(problem.seq_q, BLOCK_M), problem.batch * heads_q)
    args = (
        *READ_SLOTS,
        Slot("dq"),
        problem.batch,
        heads_q,
        problem.k.dims[1],
        problem.group,
        problem.seq_q,
        problem.seq_kv,
        *tma_strides(problem.q),
        *tma_strides(problem.k),
        *tma_strides(problem.v),
        *tma_strides(do_desc),
        *stats_desc.strides,
        *dq_desc.strides,
        problem.scale,
    )
    options = dict(
        CAUSAL=problem.params.band == (None, 0),
        BOTTOM_RIGHT=problem.params.alignment is DiagonalAlignment.BOTTOM_RIGHT,
        HEAD_DIM=problem.q.dims[3],
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        STAGES=STAGES,
        num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
    )
    return grid, args, options


def launch(problem: AttentionProblem) -> Launch:
    """The kernel's launch on ``problem`` (in scope): dQ."""
    grid, args, options = launch_arguments(problem)
    return Launch(attention_dq_warp_specialized_kernel, grid, args, options)
