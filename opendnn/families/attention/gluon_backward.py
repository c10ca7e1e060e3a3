"""The attention backward's dK and dV on Hopper (sm_90): FlashAttention-3's warp-specialized design in
Gluon, deterministic (no atomics, every query block summed in one fixed order).

FLOPs and bytes are those of the ``tl`` dK/dV kernel (``triton_backward``): four products a (query,
key) pair, ``2 * pairs * (2 * D + 2 * Dv)``, 2.5 of the backward's 3.5 forwards of work; q, dO, the
stats and delta read once a key block that sees them (mostly from L2), k and v once, dK and dV written
once. The products dominate past a few hundred queries a key, so the aim is tensor cores that never
wait: for loads (TMA, a ring of query blocks filled ahead by a warp of its own) or for the
exponentials between the products (two consumer warpgroups, each issuing its products asynchronously,
fill the tensor cores while the other computes).

One program per (key block of BLOCK_N = 128 keys, batch b, key/value head); it walks the (query
head, query block) pairs of its group in the ``tl`` kernel's order: the interior's query blocks
(``triton_tiles.query_range`` and ``block_loop``), whose pairs need no mask, head by head, then the
edge blocks, head by head. Key blocks run in grid order, the heaviest first under a causal mask (a key
is seen by the queries from its diagonal on). Three partitions of warps talk only through shared
memory and mbarriers:

- **producer** (``query_block_producer``, 1 warp, PRODUCER_REGISTERS registers a thread): builds the
  TMA descriptors of q, k, v and dO (4-D ``[B, H, S, D]`` at the tensors' strides, zero-filled past
  S) on the device, copies the program's keys and values once as two 64-row boxes each
  (``kv_ready``), then per query block, in the consumers' order, waits until a stage of the ring is
  empty and copies the BLOCK_M x D query box (``q_ready``) and the BLOCK_M x Dv dO box
  (``do_ready``) into it.
- **two consumers** (``gradient_consumer``, one warpgroup each, CONSUMER_REGISTERS registers a
  thread; the first is the kernel's own 4 warps): consumer ``half`` owns keys ``64 half .. 64 half +
  63`` of the block and their float32 dK and dV (64 x D each). Per query block, with the keys as
  rows (so that P^T and dS^T come out of an accumulator in the layout of wgmma's A operand): the
  rows' logsumexp and delta loaded (plain loads; the delta workspace is the ``tl`` delta kernel's);
  S^T = K Q^T and dP^T = V dO^T issued asynchronously (both operands in shared memory, Q and dO
  permuted); S^T waited for alone; P^T = exp2(S^T scale log2(e) - lse log2(e)) in float32 (the edge
  blocks mask queries past Sq, keys past Skv and, causal, keys past a query's diagonal); dP^T waited
  for; dS^T = P^T (dP^T - delta); P^T and dS^T rounded to the data dtype and converted in registers
  to the A operand; dV += P^T dO and dK += dS^T Q issued together and waited for, then the stage
  released. After the last block: dK times the softmax scale, both cast and stored at dk's and
  dv's strides, keys past Skv not stored.

Numerics are the ``tl`` kernel's: scores and the logsumexp in log2 units, the same float32 products
and the same roundings of P and dS to the data dtype before their products.

**Ring and barriers.** STAGES stages, each a query box and a dO box. ``q_ready[s]`` and
``do_ready[s]`` count one arrival (the producer's ``expect``) plus their box's bytes, so S^T starts
before dO lands; ``empty[s]`` counts two arrivals, one per consumer warpgroup, issued once its dV and
dK products on the stage are complete (waited for within the block: carried in flight into the next
block's S^T, ptxas serializes every wgmma; docs/design/attention.md). Block ``i`` of a program uses
stage ``i % STAGES`` in phase ``(i // STAGES) & 1``; the producer waits on ``empty`` with the phase
flipped, which a fresh barrier passes.

**Registers.** 12 warps, 168 registers a thread at launch; ``setmaxnreg`` leaves the producer 24 and
gives each consumer 240: dK and dV (D / 2 float32 each a thread), S^T and dP^T (BLOCK_M / 2 each),
P^T and dS^T in 16 bits (BLOCK_M / 4 each), and the block's lse and delta. At head dim 128 with
BLOCK_M 64 the four float32 tiles take 192; a BLOCK_M of 128 (64 more) or head dim 256 (dK and dV
alone take 256) does not fit, so head dim 256 stays on the ``tl`` kernel.

**Arguments.** The partitions take every scalar as an argument of its own, written out where
``warp_specialize`` is called (as in ``gluon_forward``).
"""

from __future__ import annotations

import dataclasses
import functools
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

from opendnn.families.attention import gluon_forward
from opendnn.families.attention.gluon_forward import tma_strides
from opendnn.families.attention.gluon_key_blocks import block_position
from opendnn.families.attention.problem import AttentionProblem, DiagonalAlignment
from opendnn.families.attention.triton_tiles import LOG2E, block_loop, query_range
from opendnn.kernels.device import TMA_ALIGNMENT
from opendnn.kernels.launch import Launch, Slot

CONSUMER_REGISTERS = gl.constexpr(240)
PRODUCER_REGISTERS = gl.constexpr(24)
BLOCK_M = 64  # queries a step: S^T and dP^T are 64 x 64 float32 a consumer
BLOCK_N = 128  # keys a program: 64 a consumer warpgroup
STAGES = 3  # query and dO boxes in the ring: 160 KB of shared memory in all at head dim 128
HEAD_DIMS = (64, 128)


@gluon.jit
def program_blocks(
    heads_kv,
    seq_q,
    seq_kv,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """(b, key/value head, first key, lo, hi, inner_lo, inner_hi, shift) of the program: its key block
    and the query blocks that see it (``query_range``), as the ``tl`` dK/dV kernel takes them."""
    b = gl.program_id(1) // heads_kv
    kv_head = gl.program_id(1) % heads_kv
    start_n = gl.program_id(0) * BLOCK_N
    shift = 0
    if BOTTOM_RIGHT:  # the diagonal ends at the last query and key
        shift = seq_kv - seq_q
    lo, hi, inner_lo, inner_hi = query_range(start_n, seq_q, seq_kv, shift, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
    return b, kv_head, start_n, lo, hi, inner_lo, inner_hi, shift


@gluon.jit
def head_descriptor(ptr, batch, heads, seq, stride_b, stride_h, stride_s, boxes):
    """The TMA descriptor of a (B, H, S, D) tensor at ``ptr`` (a unit head-dim stride) whose box is
    one of ``boxes``, the shared memory it is copied into: zero-filled past S."""
    BOX: gl.constexpr = [1, 1, boxes.shape[3], boxes.shape[4]]
    return tma.make_tensor_descriptor(
        ptr, [batch, heads, seq, boxes.shape[4]], [stride_b, stride_h, stride_s, 1], BOX, boxes.layout
    )


@gluon.jit
def query_block_producer(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    k_boxes,
    v_boxes,
    q_ring,
    do_ring,
    kv_ready,
    q_ready,
    do_ready,
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
    """Fill the key and value boxes once, then the ring with the program's query and dO blocks."""
    STAGES: gl.constexpr = q_ring.shape[0]
    HALF_N: gl.constexpr = BLOCK_N // 2
    q_desc = head_descriptor(q_ptr, batch, heads_q, seq_q, q_stride_b, q_stride_h, q_stride_s, q_ring)
    do_desc = head_descriptor(do_ptr, batch, heads_q, seq_q, do_stride_b, do_stride_h, do_stride_s, do_ring)
    k_desc = head_descriptor(k_ptr, batch, heads_kv, seq_kv, k_stride_b, k_stride_h, k_stride_s, k_boxes)
    v_desc = head_descriptor(v_ptr, batch, heads_kv, seq_kv, v_stride_b, v_stride_h, v_stride_s, v_boxes)
    b, kv_head, start_n, lo, hi, inner_lo, inner_hi, _ = program_blocks(
        heads_kv, seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N
    )
    mbarrier.expect(kv_ready, 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for half in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [b, kv_head, start_n + half * HALF_N, 0], kv_ready, k_boxes.index(half))
        tma.async_copy_global_to_shared(v_desc, [b, kv_head, start_n + half * HALF_N, 0], kv_ready, v_boxes.index(half))
    step = 0
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for h in range(kv_head * group, kv_head * group + group):
            for position in range(first, stop, BLOCK_M):
                start_m = block_position(position, inner_lo, gap)
                stage = step % STAGES
                mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)
                mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_ready.index(stage), q_ring.index(stage))
                mbarrier.expect(do_ready.index(stage), do_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(
                    do_desc, [b, h, start_m, 0], do_ready.index(stage), do_ring.index(stage)
                )
                step += 1


@gluon.jit
def row_statistics(
    stats_ptr,
    delta_ptr,
    b,
    h,
    rows,
    heads_q,
    seq_q,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    MASKED: gl.constexpr,
):
    """(lse, delta) of query rows ``rows`` of (b, h), lse in log2 units: +inf where a row has no key
    (-inf saved) or lies past Sq (MASKED: some may), so that exp2(s - lse) is 0 there (as
    ``triton_backward.row_statistics``)."""
    inside = rows < seq_q
    if not MASKED:
        inside = gl.full(rows.shape, True, gl.int1, rows.type.layout)
    stats_base = stats_ptr + b.to(gl.int64) * stats_stride_b + h.to(gl.int64) * stats_stride_h
    lse = gl.load(stats_base + rows.to(gl.int64) * stats_stride_s, mask=inside, other=float("inf"))
    lse = gl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    delta = gl.load(delta_ptr + (b.to(gl.int64) * heads_q + h) * seq_q + rows, mask=inside, other=0.0)
    return lse, delta


@gluon.jit
def gradient_consumer(
    k_boxes,
    v_boxes,
    q_ring,
    do_ring,
    kv_ready,
    q_ready,
    do_ready,
    empty,
    stats_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    heads_q,
    heads_kv,
    group,
    seq_q,
    seq_kv,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    dk_stride_b,
    dk_stride_h,
    dk_stride_s,
    dk_stride_d,
    dv_stride_b,
    dv_stride_h,
    dv_stride_s,
    dv_stride_d,
    scale,
    HALF: gl.constexpr,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
):
    """dK and dV of keys ``HALF * BLOCK_N / 2`` on of the program's key block: per query block the
    four products with P^T and dS^T between them, then the stores."""
    STAGES: gl.constexpr = q_ring.shape[0]
    HALF_N: gl.constexpr = BLOCK_N // 2
    HEAD_DIM: gl.constexpr = q_ring.shape[4]
    VALUE_DIM: gl.constexpr = do_ring.shape[4]
    dtype: gl.constexpr = q_ring.dtype
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_M, 16]
    )
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16]
    )
    OPERAND_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC_LAYOUT, k_width=2)
    b, kv_head, start_n, lo, hi, inner_lo, inner_hi, shift = program_blocks(
        heads_kv, seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, BLOCK_M, BLOCK_N
    )
    keys = start_n + HALF * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, S_LAYOUT))
    scale_log2 = scale * LOG2E  # scores in log2 units, as the stats after row_statistics
    k = k_boxes.index(HALF).reshape([HALF_N, HEAD_DIM])
    v = v_boxes.index(HALF).reshape([HALF_N, VALUE_DIM])
    dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, ACC_LAYOUT)
    dv = gl.zeros([HALF_N, VALUE_DIM], gl.float32, ACC_LAYOUT)
    mbarrier.wait(kv_ready, 0)
    step = 0
    for EDGE in gl.static_range(2):
        first, stop, gap = block_loop(lo, hi, inner_lo, inner_hi, EDGE)
        for h in range(kv_head * group, kv_head * group + group):
            for position in range(first, stop, BLOCK_M):
                stage = step % STAGES
                phase = step // STAGES & 1
                rows = block_position(position, inner_lo, gap) + gl.arange(
                    0, BLOCK_M, layout=gl.SliceLayout(0, S_LAYOUT)
                )
                lse, delta = row_statistics(
                    stats_ptr, delta_ptr, b, h, rows, heads_q, seq_q, stats_stride_b, stats_stride_h, stats_stride_s,
                    EDGE,
                )  # fmt: skip
                q = q_ring.index(stage).reshape([BLOCK_M, HEAD_DIM])
                do = do_ring.index(stage).reshape([BLOCK_M, VALUE_DIM])
                mbarrier.wait(q_ready.index(stage), phase)
                zeros = gl.zeros([HALF_N, BLOCK_M], gl.float32, S_LAYOUT)
                st = warpgroup_mma(k, q.permute((1, 0)), zeros, use_acc=False, is_async=True)
                mbarrier.wait(do_ready.index(stage), phase)
                dpt = warpgroup_mma(v, do.permute((1, 0)), zeros, use_acc=False, is_async=True)
                st = warpgroup_mma_wait(1, deps=(st,))  # S^T done, dP^T may still run
                st = st * scale_log2
                if EDGE:
                    allowed = (keys < seq_kv)[:, None] & (rows < seq_q)[None, :]
                    if CAUSAL:
                        allowed &= keys[:, None] <= (rows + shift)[None, :]
                    st = gl.where(allowed, st, float("-inf"))
                pt = gl.exp2(st - lse[None, :])
                dpt = warpgroup_mma_wait(0, deps=(dpt,))
                ds = gl.convert_layout((pt * (dpt - delta[None, :])).to(dtype), OPERAND_LAYOUT)
                p = gl.convert_layout(pt.to(dtype), OPERAND_LAYOUT)
                dv = warpgroup_mma(p, do, dv, is_async=True)
                dk = warpgroup_mma(ds, q, dk, is_async=True)
                dv, dk, p, ds = warpgroup_mma_wait(0, deps=(dv, dk, p, ds))
                mbarrier.arrive(empty.index(stage))
                step += 1
    dk = dk * scale
    acc_keys = start_n + HALF * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, ACC_LAYOUT))
    dims = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ACC_LAYOUT))
    inside = (acc_keys < seq_kv)[:, None]
    dk_base = dk_ptr + b.to(gl.int64) * dk_stride_b + kv_head.to(gl.int64) * dk_stride_h
    dk_offsets = acc_keys.to(gl.int64)[:, None] * dk_stride_s + dims[None, :] * dk_stride_d
    gl.store(dk_base + dk_offsets, dk.to(dk_ptr.dtype.element_ty), mask=inside)
    dv_base = dv_ptr + b.to(gl.int64) * dv_stride_b + kv_head.to(gl.int64) * dv_stride_h
    dv_offsets = acc_keys.to(gl.int64)[:, None] * dv_stride_s + dims[None, :] * dv_stride_d
    gl.store(dv_base + dv_offsets, dv.to(dv_ptr.dtype.element_ty), mask=inside)


@gluon.jit
def attention_dkdv_warp_specialized_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    stats_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
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
    dk_stride_b,
    dk_stride_h,
    dk_stride_s,
    dk_stride_d,
    dv_stride_b,
    dv_stride_h,
    dv_stride_s,
    dv_stride_d,
    scale: tl.float32,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
):
    """dK and dV of one key block of batch b, key/value head g: program (rank, b * Hkv + g). Strides are
    in elements, (B, H, S, D) order; q, k, v and dO have a unit head-dim stride; delta is the ``tl``
    delta kernel's workspace, (b * Hq + h) * Sq + i."""
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    KV_BOX: gl.constexpr = [1, 1, BLOCK_N // 2, HEAD_DIM]
    Q_BOX: gl.constexpr = [1, 1, BLOCK_M, HEAD_DIM]
    KV_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(KV_BOX, dtype)
    Q_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(Q_BOX, dtype)
    k_boxes = gl.allocate_shared_memory(dtype, [2] + KV_BOX, KV_LAYOUT)
    v_boxes = gl.allocate_shared_memory(dtype, [2] + KV_BOX, KV_LAYOUT)
    q_ring = gl.allocate_shared_memory(dtype, [STAGES] + Q_BOX, Q_LAYOUT)
    do_ring = gl.allocate_shared_memory(dtype, [STAGES] + Q_BOX, Q_LAYOUT)
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    for stage in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(stage), count=1)
        mbarrier.init(do_ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    # the consumers' argument tuples differ only in HALF (module docstring, "Arguments")
    gl.warp_specialize(  # the first partition runs in the kernel's own 4 warps
        [
            (
                gradient_consumer,
                (
                    k_boxes,
                    v_boxes,
                    q_ring,
                    do_ring,
                    kv_ready,
                    q_ready,
                    do_ready,
                    empty,
                    stats_ptr,
                    delta_ptr,
                    dk_ptr,
                    dv_ptr,
                    heads_q,
                    heads_kv,
                    group,
                    seq_q,
                    seq_kv,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    dk_stride_b,
                    dk_stride_h,
                    dk_stride_s,
                    dk_stride_d,
                    dv_stride_b,
                    dv_stride_h,
                    dv_stride_s,
                    dv_stride_d,
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
                    k_boxes,
                    v_boxes,
                    q_ring,
                    do_ring,
                    kv_ready,
                    q_ready,
                    do_ready,
                    empty,
                    stats_ptr,
                    delta_ptr,
                    dk_ptr,
                    dv_ptr,
                    heads_q,
                    heads_kv,
                    group,
                    seq_q,
                    seq_kv,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    dk_stride_b,
                    dk_stride_h,
                    dk_stride_s,
                    dk_stride_d,
                    dv_stride_b,
                    dv_stride_h,
                    dv_stride_s,
                    dv_stride_d,
                    scale,
                    1,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    BLOCK_M,
                    BLOCK_N,
                ),
            ),
            (
                query_block_producer,
                (
                    q_ptr,
                    k_ptr,
                    v_ptr,
                    do_ptr,
                    k_boxes,
                    v_boxes,
                    q_ring,
                    do_ring,
                    kv_ready,
                    q_ready,
                    do_ready,
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


@functools.lru_cache(maxsize=256)  # per problem, asked by every call
def out_of_scope(problem: AttentionProblem) -> str | None:
    """Why ``problem`` is not this kernel's nor ``gluon_backward_dq``'s (one scope for both), or None: a
    backward of 16-bit data whose forward ``gluon_forward`` takes (equal head dims, no mask but causal,
    no extras, TMA-readable q, k and v), at head dim 64 or 128 (HEAD_DIMS: at 256 dK and dV do not fit
    in a consumer's registers), whose dO a TMA descriptor reads too, over sequences of the problem's
    own lengths (ragged offsets and per-batch lengths, which the forward takes, stay on the ``tl``
    kernels). dq, dk and dv may have any strides (masked stores)."""
    if not problem.backward:
        return "a forward"
    forward = gluon_forward.out_of_scope(dataclasses.replace(problem, do=None, dq=None, dk=None, dv=None))
    if forward is not None:
        return forward
    if problem.ragged or problem.seq_lens_q is not None or problem.seq_lens_kv is not None:
        return "ragged offsets or per-batch sequence lengths"
    if problem.q.dtype.itemsize != 2:
        return f"{problem.q.dtype.name} data (16-bit only)"
    if problem.q.dims[3] not in HEAD_DIMS:
        return f"head dim {problem.q.dims[3]} (64 or 128)"
    do = problem.do
    assert do is not None  # a backward's
    if do.strides[3] != 1 or any(s == 0 or s * do.dtype.itemsize % TMA_ALIGNMENT for s in tma_strides(do)):
        return f"do's strides {do.strides} (a unit last stride, the others 16-byte aligned, not broadcast)"
    return None


# the tensors both backward kernels read, in their parameters' order ("delta": the tl delta kernel's workspace)
READ_SLOTS = tuple(Slot(name) for name in ("q", "k", "v", "do", "stats", "delta"))


def launch_arguments(problem: AttentionProblem) -> tuple[tuple[int, int], tuple[Any, ...], dict[str, Any]]:
    """(grid, arguments, keyword arguments) of the kernel's launch on ``problem`` (in scope), its
    tensors Slots named by the problem's slots, and "delta" the ``tl`` delta kernel's workspace."""
    do_desc, stats_desc, dk_desc, dv_desc = problem.do, problem.stats, problem.dk, problem.dv
    assert do_desc is not None and stats_desc is not None and dk_desc is not None and dv_desc is not None
    heads_kv = problem.k.dims[1]
    grid = (triton.cdiv(problem.seq_kv, BLOCK_N), problem.batch * heads_kv)
    args = (
        *READ_SLOTS,
        Slot("dk"),
        Slot("dv"),
        problem.batch,
        problem.q.dims[1],
        heads_kv,
        problem.group,
        problem.seq_q,
        problem.seq_kv,
        *tma_strides(problem.q),
        *tma_strides(problem.k),
        *tma_strides(problem.v),
        *tma_strides(do_desc),
        *stats_desc.strides,
        *dk_desc.strides,
        *dv_desc.strides,
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
    """The kernel's launch on ``problem`` (in scope): dK and dV."""
    grid, args, options = launch_arguments(problem)
    return Launch(attention_dkdv_warp_specialized_kernel, grid, args, options)
