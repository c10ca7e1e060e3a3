"""The attention forward on Hopper (sm_90): FlashAttention-3's warp-specialized design in Gluon.

FLOPs and bytes are the FlashAttention-2 forward's (``triton_forward``): ``2 * pairs * (D + Dv)`` in the
two products and one exp2 a pair, k and v read once a query block (mostly from L2), so the kernel is
bound by the tensor cores. The aim is tensor cores that never wait: for loads (TMA, a ring of key and
value blocks filled ahead by a warp of its own), for the softmax (two warpgroups take turns on the
tensor cores while the other exponentiates), or for the previous block's P V product (issued
asynchronously, waited for together with the next block's scores).

A query block is BLOCK_M = 128 rows of one batch b and query head h; key/value head ``h // group``
(GQA). The blocks are numbered block-major over the query-block grid (``query_block_grid``), causal
ones from the last query block to the first (``triton_tiles.scheduled_block``), the heaviest first.

**Persistence.** A program per multiprocessor walks the blocks ``program_id``, ``program_id +
programs``, .. so that a block's loads, and the ring's fill, run under the previous block's products
and its store: launching a program per block cost about 8 us a block on the H200 (GQA 64/8, head dim
128: 4.04 ms at 4k keys, 32 key blocks a query block, against 14.58 ms at 16k, 128 blocks), where
torch's SDPA pays none. The ring's count of blocks and the ping-pong turns run on across the
program's blocks; the query boxes are refilled once both consumers have waited for their block's
last Q K^T (``q_empty``, one arrival per consumer), while they finish its last P V and store o.
With per-batch key lengths or ragged offsets the key and value descriptors end at each sequence's
keys, and a descriptor built on the device is not rewritten while copies that read it may be in
flight: there the grid keeps a program per block.

Each program is three partitions of warps that talk only through shared memory and mbarriers:

- **producer** (``key_value_producer``, 1 warp, PRODUCER_REGISTERS registers a thread): builds the
  TMA descriptors of q, k and v (4-D ``[B, H, S, D]`` at the tensors' strides, zero-filled past S) on
  the device, and per query block copies its queries as two 64-row boxes (``q_ready``), then per key
  block of its range, in the consumers' order (``triton_tiles.key_range`` and ``block_loop``: the
  interior's blocks, then the edge blocks; ``gluon_key_blocks.fill_ring``), waits until a stage of
  the ring is empty and copies the BLOCK_N x D key box (``k_ready``) and the BLOCK_N x Dv value box
  (``v_ready``) into it.
- **two consumers** (``softmax_consumer``, one warpgroup each, CONSUMER_REGISTERS registers a thread;
  the first is the kernel's own 4 warps): consumer ``half`` owns query rows ``64 half .. 64 half +
  63``. Per key block: S = Q K^T (``warpgroup_mma``, both operands in shared memory, K permuted),
  issued asynchronously and waited for together with the previous block's P V; the previous stage is
  released; the online softmax in float32 and log2 units (q k^T times scale * log2(e), so each
  exponential is one exp2 of a difference; the edge blocks mask keys past Skv and, causal, past each
  row's diagonal); O rescaled; P rounded to the data dtype and converted, in registers, to the A
  operand of O += P V (``gl.DotOperandLayout``: wgmma's accumulator and A-operand layouts hold the
  same rows in each thread, so no shared memory); P V issued asynchronously on the value box.
  At the end: o = O / l stored masked at o's strides, and the rows' logsumexp (natural units,
  float32; -inf for a row that no key takes part in, whose o is 0) when the problem asks for stats,
  as the ``tl`` forward stores them.

**Lengths and ragged sequences** (HAS_LENS_Q, HAS_LENS_KV, RAGGED; ``triton_tiles.sequence_lengths``
gives each program its sequence's lengths, first tokens and diagonal). The key and value descriptors
start at the sequence's first key and end at its last (``len_kv`` keys), so TMA's zero fill stands
for every key past it: an edge block's masked scores meet zeros in v, never the next sequence's
values or a padding's. The query descriptor spans the whole tensor, the boxes at the sequence's rows:
a query row past ``len_q`` only reaches its own scores, and its o is set to 0 (stats -inf) as the
``tl`` kernel's padding rows are; ragged rows past the sequence are not stored. A ragged grid runs
over the real query blocks (``triton_tiles.query_block_grid``), each program finding its sequence
from the offsets (``ragged_rank``) in its partition's own warps. A sequence's rows are clamped into
the packed tokens (``triton_tiles.packed_sequence``): offsets on a device are not checked on the host,
and wrong ones give wrong rows, never a box or a store outside the tensors.

**Ring and barriers.** STAGES stages, each a key box and a value box. ``k_ready[s]`` and
``v_ready[s]`` count one arrival (the producer's ``expect``) plus their box's bytes, so a consumer
starts Q K^T without waiting for V; ``empty[s]`` counts two arrivals, one per consumer warpgroup, each
issued once its P V product on the stage is complete. Block ``i`` of a program uses stage
``i % STAGES`` in phase ``(i // STAGES) & 1``; the producer waits on ``empty`` with the phase flipped,
which a fresh barrier passes.

**Schedules** (SCHEDULE, a constexpr; bit 0 the ping-pong turns, bit 1 the overlap):

- INDEPENDENT (``independent_blocks``): per block, Q K^T issued and waited for together with the
  previous block's P V, the softmax, P V issued; the two consumers run free of each other.
- PING_PONG: the same, with the consumers taking turns on the tensor cores (FlashAttention-3's
  inter-warpgroup schedule): a section is one consumer's products issued back to back (the previous
  block's P V and this block's Q K^T); ``turn[h]`` lets consumer ``h`` start its section once the
  other has issued its own, and the sections alternate, so one consumer's products run while the
  other exponentiates. Both consumers walk the same blocks, so their sections pair up.
- OVERLAP (``overlapped_blocks``; the intra-warpgroup overlap): the first block's scores and softmax
  alone (masked wherever it lies), then per block Q K^T issued, the previous block's P V issued behind
  it, S waited for alone (``warpgroup_mma_wait(1)``: wgmma groups complete in order), the softmax
  while P V runs, then P V waited for, O rescaled and the stage released; the last block's P V after
  the loops. P of the previous block stays live beside the new scores.
- PING_PONG_OVERLAP: both; a section is one block's Q K^T and the previous block's P V.

**fp8** (FP8: e4m3 q, k and v, cuDNN's fp8 SDPA as ``triton_forward`` defines it): wgmma takes 8-bit
operands K-major only. Q K^T reads both boxes as loaded (the head dim contiguous); for P V the launch
first makes v^T, a (B, Hkv, Dv, S) copy with the keys contiguous (``triton_transpose``), and the
producer copies its Dv x BLOCK_N boxes, which the consumers permute into the K-major B operand. The
scores' multiplier gains descale_q * descale_k; the exponentials subtract the running maxima rounded
up to whole numbers (``online_softmax``), P times scale_s is rounded to e4m3 in registers (A
operand, 4 bytes of consecutive keys a thread: ``k_width`` 4); at the end o = O / l * descale_s *
descale_v, whose largest |o| and each row's largest weight join amax_o and amax_s (``gl.atomic_max``)
before o is multiplied by scale_o and stored in o's dtype. The stats take the rounded maxima, as
the ``tl`` kernel's do.

**Registers.** 12 warps, 168 registers a thread at launch; ``setmaxnreg`` leaves the producer 24 and
gives each consumer 240: a 64 x BLOCK_N float32 score tile (BLOCK_N / 2 a thread), its 16-bit P (a
quarter of that, fp8 an eighth; two of them live in the overlapped schedules) and the 64 x Dv float32
O (Dv / 2).

**Tiles.** ``Tile``: the schedule, BLOCK_N and the ring's stages, per element size and head dim in
TILES (the planner's one place, ``tile_for``); ``candidate_tiles`` lists the others a sweep times (every schedule, the
widths of BLOCK_NS, the most stages that fit in the 227 KB of shared memory beside the query block,
at most 4, and one fewer).

The consumers' loops over the key blocks are in ``gluon_key_blocks``.

**Arguments.** The partitions take every scalar as an argument of its own, written out where
``warp_specialize`` is called (a tuple assigned in a Gluon kernel turns its constexprs into runtime
values; see ``matmul/gluon_hopper.py``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.attention.gluon_key_blocks import fill_ring, independent_blocks, overlapped_blocks
from opendnn.families.attention.problem import (
    FP8_AMAX,
    FP8_BACKWARD_SCALES,
    FP8_SCALES,
    AttentionProblem,
    DiagonalAlignment,
)
from opendnn.families.attention.triton_tiles import (
    LOG2E,
    head_base,
    in_order,
    key_range,
    query_block_grid,
    ragged_rank,
    scheduled_block,
    sequence_lengths,
)
from opendnn.families.attention.triton_transpose import VALUES_TRANSPOSED, transposed_strides, transposed_values
from opendnn.kernels.device import TMA_ALIGNMENT, programs_to_fill
from opendnn.kernels.launch import Launch, Launches, Slot

CONSUMER_REGISTERS = gl.constexpr(240)
PRODUCER_REGISTERS = gl.constexpr(24)
BLOCK_M = 128  # query rows a program: 64 a consumer warpgroup
SHARED_MEMORY = 227 * 1024  # what one block may use on sm_90
BARRIER_BYTES = 1024  # the barriers and the descriptors being built, rounded up
# the consumers' orders of products and softmax (SCHEDULE; module docstring, "Schedules"): bit 0 the
# ping-pong turns, bit 1 the intra-warpgroup overlap
INDEPENDENT, PING_PONG, OVERLAP, PING_PONG_OVERLAP = 0, 1, 2, 3
SCHEDULES = (INDEPENDENT, PING_PONG, OVERLAP, PING_PONG_OVERLAP)
BLOCK_NS = {64: (128, 256), 128: (64, 128), 256: (64,)}  # head dim -> the key block widths a tile may take


@dataclass(frozen=True)
class Tile:
    """A launch of the kernel: the consumers' schedule, keys a block, stages of the ring."""

    schedule: int
    block_n: int
    stages: int


# (element bytes, head dim) -> the planned tile (the one place the planner's schedule and tile come
# from). 16-bit: at 128 the fastest of benchmarks/attention_schedules.py on the H200; at 64 and 256 the
# sweep has not timed them yet: 64 is the overlapped tile the sweep routes there, 256 keeps the
# independent tile that measured 0.61-0.67 of torch's SDPA. e4m3: at 128 the fastest of the sweep
# (independent, 3.42 ms full and 2.11 ms causal on GQA 64/8 4k, against 3.85 and 2.70 for the 16-bit
# tile's schedule at 4 stages); at 64 (not yet swept) the 16-bit tile's schedule and key block, the
# ring at 4 stages, which half the bytes a stage leave room for
TILES = {
    (2, 64): Tile(PING_PONG_OVERLAP, 128, 4),
    (2, 128): Tile(PING_PONG_OVERLAP, 128, 3),
    (2, 256): Tile(INDEPENDENT, 64, 2),
    (1, 64): Tile(PING_PONG_OVERLAP, 128, 4),
    (1, 128): Tile(INDEPENDENT, 128, 3),
}


@gluon.jit
def program_block(
    tile,
    rows,
    lens_q_ptr,
    lens_kv_ptr,
    lens_stride_q,
    lens_stride_kv,
    packed_rows,
    batch,
    heads_q,
    seq_q,
    seq_kv,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_LENS_Q: gl.constexpr,
    HAS_LENS_KV: gl.constexpr,
    RAGGED: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_B: gl.constexpr,
):
    """(b, h, start_m, len_q, len_kv, shift, start_q, start_kv, limit_q) of query block ``tile``: its
    rank ``tile // rows`` on the grid's block axis and its row ``tile % rows`` (b * Hq + h; ragged, h)
    give its sequence b, query head h and first query (``scheduled_block``; ragged, ``ragged_rank``),
    then ``sequence_lengths`` of b."""
    rank = tile // rows
    b = tile % rows // heads_q
    h = tile % rows % heads_q
    if RAGGED:  # the offsets in the partition's own warps (a Gluon tensor takes an explicit layout)
        sequences = gl.arange(0, BLOCK_B, layout=gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
        b, index, blocks = ragged_rank(
            rank, sequences, lens_q_ptr, lens_stride_q, batch, packed_rows[0], seq_q, BLOCK_M
        )
        start_m = in_order(index, blocks, CAUSAL) * BLOCK_M
    else:
        b, start_m = scheduled_block(rank, b, lens_q_ptr, 0, batch, seq_q, seq_q, CAUSAL, False, BLOCK_M, 1)
    len_q, len_kv, shift, start_q, start_kv, limit_q, _ = sequence_lengths(
        b, lens_q_ptr, lens_kv_ptr, (lens_stride_q, lens_stride_kv), packed_rows, seq_q, seq_kv,
        HAS_LENS_Q, HAS_LENS_KV, RAGGED, BOTTOM_RIGHT,
    )  # fmt: skip
    return b, h, start_m, len_q, len_kv, shift, start_q, start_kv, limit_q


@gluon.jit
def key_value_descriptors(
    k_ptr,
    v_ptr,
    start_kv,
    len_kv,
    tensor_batch,
    heads_kv,
    k_strides,
    v_strides,
    k_ring,
    v_ring,
    FP8: gl.constexpr,
):
    """The TMA descriptors of the key and value boxes (``k_ring``'s and ``v_ring``'s) of a sequence
    whose ``len_kv`` keys start at key ``start_kv``: they end at its last key, so that TMA's zero fill
    stands for every key past it (with FP8, v^T's boxes: its (B, H, D) strides, the keys contiguous)."""
    BLOCK_N: gl.constexpr = k_ring.shape[3]
    HEAD_DIM: gl.constexpr = k_ring.shape[4]
    keys = gl.maximum(len_kv, 1)  # a descriptor's dims are positive; no block is read where there is no key
    k_desc = tma.make_tensor_descriptor(
        k_ptr + gl.to_tensor(start_kv).to(gl.int64) * k_strides[2],
        [tensor_batch, heads_kv, keys, HEAD_DIM],
        [k_strides[0], k_strides[1], k_strides[2], 1],
        [1, 1, BLOCK_N, HEAD_DIM],
        k_ring.layout,
    )
    V_BOX: gl.constexpr = [1, 1, BLOCK_N, HEAD_DIM] if not FP8 else [1, 1, HEAD_DIM, BLOCK_N]
    v_rows = keys if not FP8 else HEAD_DIM  # equal head dims (out_of_scope)
    v_columns = HEAD_DIM if not FP8 else keys
    v_desc = tma.make_tensor_descriptor(
        v_ptr + gl.to_tensor(start_kv).to(gl.int64) * v_strides[2],
        [tensor_batch, heads_kv, v_rows, v_columns],
        [v_strides[0], v_strides[1], v_strides[2], 1],
        V_BOX,
        v_ring.layout,
    )
    return k_desc, v_desc


@gluon.jit
def key_value_producer(
    q_ptr,
    k_ptr,
    v_ptr,
    q_boxes,
    k_ring,
    v_ring,
    q_ready,
    q_empty,
    k_ready,
    v_ready,
    empty,
    tiles,
    rows,
    lens_q_ptr,
    lens_kv_ptr,
    lens_stride_q,
    lens_stride_kv,
    batch,
    heads_q,
    heads_kv,
    group,
    seq_q,
    seq_kv,
    packed_rows,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_s,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_LENS_Q: gl.constexpr,
    HAS_LENS_KV: gl.constexpr,
    RAGGED: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_B: gl.constexpr,
    FP8: gl.constexpr,
):
    """Per query block of the program: the query boxes once the consumers' products of the previous
    block no longer read them, then the ring with the block's key and value blocks (module
    docstring, "Persistence" and "Lengths and ragged sequences")."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    HEAD_DIM: gl.constexpr = q_boxes.shape[4]
    SEQUENCE_KEYS: gl.constexpr = HAS_LENS_KV or RAGGED  # descriptors per sequence: one block a program
    tensor_batch = batch
    if RAGGED:  # one packed batch: a sequence is its rows from its first token on
        tensor_batch = 1
    q_desc = tma.make_tensor_descriptor(
        q_ptr,
        [tensor_batch, heads_q, packed_rows[0], HEAD_DIM],
        [q_stride_b, q_stride_h, q_stride_s, 1],
        [1, 1, HALF_M, HEAD_DIM],
        q_boxes.layout,
    )
    k_strides = (k_stride_b, k_stride_h, k_stride_s)
    v_strides = (v_stride_b, v_stride_h, v_stride_s)
    if not SEQUENCE_KEYS:
        every_k, every_v = key_value_descriptors(
            k_ptr, v_ptr, 0, seq_kv, tensor_batch, heads_kv, k_strides, v_strides, k_ring, v_ring, FP8
        )
    step = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        b, h, start_m, len_q, len_kv, shift, start_q, start_kv, _ = program_block(
            tile, rows, lens_q_ptr, lens_kv_ptr, lens_stride_q, lens_stride_kv, packed_rows, batch, heads_q,
            seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, HAS_LENS_Q, HAS_LENS_KV, RAGGED, BLOCK_M, BLOCK_B,
        )  # fmt: skip
        if SEQUENCE_KEYS:
            k_desc, v_desc = key_value_descriptors(
                k_ptr, v_ptr, start_kv, len_kv, tensor_batch, heads_kv, k_strides, v_strides, k_ring, v_ring, FP8
            )
        else:
            k_desc, v_desc = every_k, every_v
        tensor_b = b
        if RAGGED:
            tensor_b = 0
        kv_head = h // group
        iteration = (tile - gl.program_id(0)) // gl.num_programs(0)
        mbarrier.wait(q_empty, iteration & 1 ^ 1)  # a fresh barrier passes phase 1
        mbarrier.expect(q_ready, 2 * q_desc.block_type.nbytes)
        for half in gl.static_range(2):
            q_box = [tensor_b, h, start_q + start_m + half * HALF_M, 0]
            tma.async_copy_global_to_shared(q_desc, q_box, q_ready, q_boxes.index(half))
        lo, hi, inner_lo, inner_hi = key_range(start_m, len_q, len_kv, shift, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
        step = fill_ring(
            k_desc, v_desc, k_ring, v_ring, k_ready, v_ready, empty, tensor_b, kv_head, lo, hi, inner_lo, inner_hi,
            step, FP8,
        )  # fmt: skip


@gluon.jit
def softmax_consumer(
    q_ptr,
    q_boxes,
    k_ring,
    v_ring,
    q_ready,
    q_empty,
    k_ready,
    v_ready,
    empty,
    turn,
    o_ptr,
    stats_ptr,
    tiles,
    rows,
    lens_q_ptr,
    lens_kv_ptr,
    lens_stride_q,
    lens_stride_kv,
    packed_rows,
    batch,
    heads_q,
    seq_q,
    seq_kv,
    o_stride_b,
    o_stride_h,
    o_stride_s,
    o_stride_d,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    scale,
    fp8_factors,
    HALF: gl.constexpr,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_LENS_Q: gl.constexpr,
    HAS_LENS_KV: gl.constexpr,
    RAGGED: gl.constexpr,
    BLOCK_B: gl.constexpr,
    STORE_STATS: gl.constexpr,
    FP8: gl.constexpr,
    STORE_AMAX_S: gl.constexpr,
    STORE_AMAX_O: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    SCHEDULE: gl.constexpr,
):
    """Rows ``HALF * BLOCK_M / 2`` on of each of the program's query blocks: the two products a key
    block with the online softmax between them, in SCHEDULE's order, then o and the stats.
    ``fp8_factors``: the pointers to descale_q, descale_k, descale_v, descale_s, scale_s, scale_o,
    amax_s and amax_o."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    HEAD_DIM: gl.constexpr = q_boxes.shape[4]
    VALUE_DIM: gl.constexpr = HEAD_DIM  # equal head dims (out_of_scope)
    K_STEP: gl.constexpr = 256 // q_boxes.dtype.primitive_bitwidth  # a wgmma's k: 32 bytes
    S_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, K_STEP]
    )
    O_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, VALUE_DIM, K_STEP]
    )
    ROWS: gl.constexpr = gl.SliceLayout(1, S_LAYOUT)
    O_ROWS: gl.constexpr = gl.SliceLayout(1, O_LAYOUT)
    PING_PONG_TURNS: gl.constexpr = SCHEDULE % 2 == 1  # PING_PONG, PING_PONG_OVERLAP (bit 0)
    OVERLAPPED: gl.constexpr = SCHEDULE >= 2  # OVERLAP, PING_PONG_OVERLAP (bit 1)
    scale = scale * LOG2E  # scores in log2 units: each exponential is one exp2 of a difference
    scale_s = 1.0
    if FP8:  # the per-tensor factors, loaded on the device; m: the rows' largest scores, not rounded
        scale = scale * gl.load(fp8_factors[0]) * gl.load(fp8_factors[1])
        scale_s = gl.load(fp8_factors[4])
    q = q_boxes.index(HALF).reshape([HALF_M, HEAD_DIM])
    step = 0  # the ring's blocks taken
    section = 0  # the ping-pong sections taken
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        b, h, start_m, len_q, len_kv, shift, start_q, _, limit_q = program_block(
            tile, rows, lens_q_ptr, lens_kv_ptr, lens_stride_q, lens_stride_kv, packed_rows, batch, heads_q,
            seq_q, seq_kv, CAUSAL, BOTTOM_RIGHT, HAS_LENS_Q, HAS_LENS_KV, RAGGED, BLOCK_M, BLOCK_B,
        )  # fmt: skip
        lo, hi, inner_lo, inner_hi = key_range(start_m, len_q, len_kv, shift, 0, 0, False, CAUSAL, BLOCK_M, BLOCK_N)
        queries = start_m + HALF * HALF_M + gl.arange(0, HALF_M, layout=ROWS)
        m = gl.full([HALF_M], float("-inf"), gl.float32, ROWS)
        total = gl.zeros([HALF_M], gl.float32, ROWS)
        o = gl.zeros([HALF_M, VALUE_DIM], gl.float32, O_LAYOUT)
        mbarrier.wait(q_ready, (tile - gl.program_id(0)) // gl.num_programs(0) & 1)
        if OVERLAPPED:
            m, total, o, step, section = overlapped_blocks(
                q, k_ring, v_ring, k_ready, v_ready, empty, q_empty, turn, m, total, o, step, section, queries, lo,
                hi, inner_lo, inner_hi, len_q, len_kv, shift, scale, scale_s, HALF, PING_PONG_TURNS, CAUSAL, FP8,
                BLOCK_N, S_LAYOUT, O_LAYOUT,
            )  # fmt: skip
        else:
            m, total, o, step, section = independent_blocks(
                q, k_ring, v_ring, k_ready, v_ready, empty, q_empty, turn, m, total, o, step, section, queries, lo,
                hi, inner_lo, inner_hi, len_q, len_kv, shift, scale, scale_s, HALF, PING_PONG_TURNS, CAUSAL, FP8,
                BLOCK_N, S_LAYOUT, O_LAYOUT,
            )  # fmt: skip
        # no key takes part, or a query past len_q (the interior's blocks do not mask them): o = 0, lse = -inf
        empty_row = (total == 0.0) | (queries >= len_q)
        o = gl.where(gl.convert_layout(empty_row, O_ROWS)[:, None], 0.0, o / gl.convert_layout(total, O_ROWS)[:, None])
        o_rows = gl.convert_layout(queries, O_ROWS)
        if FP8:
            top = m
            m = gl.ceil(top)  # the exponentials' shift
            o = o * (gl.load(fp8_factors[2]) * gl.load(fp8_factors[3]))
            if STORE_AMAX_S:  # a row's largest weight exp2(top - m) / l; 0 for rows past Sq or with no key
                weight = gl.where(empty_row, 0.0, gl.exp2(top - m) / total)
                gl.atomic_max(fp8_factors[6], gl.max(weight, 0))
            if STORE_AMAX_O:  # rows past Sq (TMA's zero queries) take no part
                magnitude = gl.where((o_rows < len_q)[:, None], gl.abs(o), 0.0)
                gl.atomic_max(fp8_factors[7], gl.max(gl.max(magnitude, 1), 0))
            o = o * gl.load(fp8_factors[5])
        dims = gl.arange(0, VALUE_DIM, layout=gl.SliceLayout(0, O_LAYOUT))
        o_base = o_ptr + head_base(b, h, (o_stride_b, o_stride_h, o_stride_s), start_q)
        offsets = o_rows.to(gl.int64)[:, None] * o_stride_s + dims[None, :] * o_stride_d
        gl.store(o_base + offsets, o.to(o_ptr.dtype.element_ty), mask=(o_rows < limit_q)[:, None])
        if STORE_STATS:
            lse = gl.where(empty_row, float("-inf"), m / LOG2E + gl.log(total))  # natural units
            stats_base = stats_ptr + head_base(b, h, (stats_stride_b, stats_stride_h, stats_stride_s), start_q)
            gl.store(stats_base + queries.to(gl.int64) * stats_stride_s, lse, mask=queries < limit_q)


@gluon.jit
def attention_warp_specialized_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    stats_ptr,
    descale_q_ptr,
    descale_k_ptr,
    descale_v_ptr,
    descale_s_ptr,
    scale_s_ptr,
    scale_o_ptr,
    amax_s_ptr,
    amax_o_ptr,
    tiles,
    rows,
    lens_q_ptr,
    lens_kv_ptr,
    lens_stride_q,
    lens_stride_kv,
    batch,
    heads_q,
    heads_kv,
    group,
    seq_q,
    seq_kv,
    packed_rows,
    q_stride_b,
    q_stride_h,
    q_stride_s,
    k_stride_b,
    k_stride_h,
    k_stride_s,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    o_stride_b,
    o_stride_h,
    o_stride_s,
    o_stride_d,
    stats_stride_b,
    stats_stride_h,
    stats_stride_s,
    scale: tl.float32,
    CAUSAL: gl.constexpr,
    BOTTOM_RIGHT: gl.constexpr,
    HAS_LENS_Q: gl.constexpr,
    HAS_LENS_KV: gl.constexpr,
    RAGGED: gl.constexpr,
    STORE_STATS: gl.constexpr,
    FP8: gl.constexpr,
    STORE_AMAX_S: gl.constexpr,
    STORE_AMAX_O: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_B: gl.constexpr,
    STAGES: gl.constexpr,
    SCHEDULE: gl.constexpr,
):
    """o (and the stats) of query blocks ``tile`` = program_id, program_id + programs, .. below
    ``tiles``: block (tile // rows) of row tile % rows (b * Hq + h; ragged, h) of the query-block grid.
    Strides are in elements, (B, H, S, D) order; q, k and v have a unit head-dim stride. FP8: q, k and
    v in e4m3, v_ptr and its strides v^T's ((B, H, D, S), the keys contiguous), and the fp8 factors' and
    maxima's pointers (o's where the problem has none: never read)."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    fp8_factors = (
        descale_q_ptr,
        descale_k_ptr,
        descale_v_ptr,
        descale_s_ptr,
        scale_s_ptr,
        scale_o_ptr,
        amax_s_ptr,
        amax_o_ptr,
    )  # softmax_consumer's order
    Q_BOX: gl.constexpr = [1, 1, HALF_M, HEAD_DIM]
    KV_BOX: gl.constexpr = [1, 1, BLOCK_N, HEAD_DIM]
    q_boxes = gl.allocate_shared_memory(dtype, [2] + Q_BOX, gl.NVMMASharedLayout.get_default_for(Q_BOX, dtype))
    KV_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(KV_BOX, dtype)
    V_BOX: gl.constexpr = KV_BOX if not FP8 else [1, 1, HEAD_DIM, BLOCK_N]  # v^T's: K-major for 8-bit wgmma
    k_ring = gl.allocate_shared_memory(dtype, [STAGES] + KV_BOX, KV_LAYOUT)
    v_ring = gl.allocate_shared_memory(dtype, [STAGES] + V_BOX, gl.NVMMASharedLayout.get_default_for(V_BOX, dtype))
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ping-pong: the consumers'
    mbarrier.init(q_ready, count=1)
    mbarrier.init(q_empty, count=2)  # one arrival per consumer warpgroup
    for half in gl.static_range(2):
        mbarrier.init(turn.index(half), count=1)
    for stage in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(stage), count=1)
        mbarrier.init(v_ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    # the consumers' argument tuples differ only in HALF (module docstring, "Arguments")
    gl.warp_specialize(  # the first partition runs in the kernel's own 4 warps
        [
            (
                softmax_consumer,
                (
                    q_ptr,
                    q_boxes,
                    k_ring,
                    v_ring,
                    q_ready,
                    q_empty,
                    k_ready,
                    v_ready,
                    empty,
                    turn,
                    o_ptr,
                    stats_ptr,
                    tiles,
                    rows,
                    lens_q_ptr,
                    lens_kv_ptr,
                    lens_stride_q,
                    lens_stride_kv,
                    packed_rows,
                    batch,
                    heads_q,
                    seq_q,
                    seq_kv,
                    o_stride_b,
                    o_stride_h,
                    o_stride_s,
                    o_stride_d,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    scale,
                    fp8_factors,
                    0,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    HAS_LENS_Q,
                    HAS_LENS_KV,
                    RAGGED,
                    BLOCK_B,
                    STORE_STATS,
                    FP8,
                    STORE_AMAX_S,
                    STORE_AMAX_O,
                    BLOCK_M,
                    BLOCK_N,
                    SCHEDULE,
                ),
            ),
            (
                softmax_consumer,
                (
                    q_ptr,
                    q_boxes,
                    k_ring,
                    v_ring,
                    q_ready,
                    q_empty,
                    k_ready,
                    v_ready,
                    empty,
                    turn,
                    o_ptr,
                    stats_ptr,
                    tiles,
                    rows,
                    lens_q_ptr,
                    lens_kv_ptr,
                    lens_stride_q,
                    lens_stride_kv,
                    packed_rows,
                    batch,
                    heads_q,
                    seq_q,
                    seq_kv,
                    o_stride_b,
                    o_stride_h,
                    o_stride_s,
                    o_stride_d,
                    stats_stride_b,
                    stats_stride_h,
                    stats_stride_s,
                    scale,
                    fp8_factors,
                    1,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    HAS_LENS_Q,
                    HAS_LENS_KV,
                    RAGGED,
                    BLOCK_B,
                    STORE_STATS,
                    FP8,
                    STORE_AMAX_S,
                    STORE_AMAX_O,
                    BLOCK_M,
                    BLOCK_N,
                    SCHEDULE,
                ),
            ),
            (
                key_value_producer,
                (
                    q_ptr,
                    k_ptr,
                    v_ptr,
                    q_boxes,
                    k_ring,
                    v_ring,
                    q_ready,
                    q_empty,
                    k_ready,
                    v_ready,
                    empty,
                    tiles,
                    rows,
                    lens_q_ptr,
                    lens_kv_ptr,
                    lens_stride_q,
                    lens_stride_kv,
                    batch,
                    heads_q,
                    heads_kv,
                    group,
                    seq_q,
                    seq_kv,
                    packed_rows,
                    q_stride_b,
                    q_stride_h,
                    q_stride_s,
                    k_stride_b,
                    k_stride_h,
                    k_stride_s,
                    v_stride_b,
                    v_stride_h,
                    v_stride_s,
                    CAUSAL,
                    BOTTOM_RIGHT,
                    HAS_LENS_Q,
                    HAS_LENS_KV,
                    RAGGED,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_B,
                    FP8,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, PRODUCER_REGISTERS],
    )


# ---- launcher ------------------------------------------------------------------------------------


def most_stages(element_bytes: int, head_dim: int, block_n: int) -> int:
    """The key and value boxes of ``block_n`` keys that fit beside the query block in shared memory at
    ``head_dim`` and ``element_bytes`` a number."""
    query_bytes = BLOCK_M * head_dim * element_bytes
    stage_bytes = 2 * block_n * head_dim * element_bytes
    return (SHARED_MEMORY - BARRIER_BYTES - query_bytes) // stage_bytes


def tile_for(element_bytes: int, head_dim: int) -> Tile:
    """The planned tile of data of ``element_bytes`` a number at ``head_dim`` (TILES)."""
    return TILES[element_bytes, head_dim]


def candidate_tiles(element_bytes: int, head_dim: int) -> list[Tile]:
    """The planned tile, then every other schedule, key block width of BLOCK_NS and ring: the most
    stages that fit (at most 4) and one fewer (at least 2)."""
    planned = tile_for(element_bytes, head_dim)
    grid = [
        Tile(schedule, block_n, stages)
        for schedule in SCHEDULES
        for block_n in BLOCK_NS[head_dim]
        for top in [min(4, most_stages(element_bytes, head_dim, block_n))]
        for stages in range(max(2, top - 1), top + 1)
    ]
    return [planned, *(tile for tile in grid if tile != planned)]


@functools.lru_cache(maxsize=256)  # per problem, asked by every call
def out_of_scope(problem: AttentionProblem) -> str | None:
    """Why ``problem`` is not this kernel's, or None: a 16-bit or e4m3 forward with equal head dims of
    TILES (64, 128 or 256; e4m3: 64 or 128), no mask but causal (either alignment) and sequence
    lengths or ragged offsets, no bias, ALiBi, softcap, dropout, sinks or paged layout, the fp8
    backward's factors (a backward asked about its forward), and q, k, v strides that a TMA
    descriptor reads (a unit head-dim stride, every other one 16-byte aligned). The base addresses'
    alignment is the call's (``tma_aligned``)."""
    params = problem.params
    dtype, head_dim = problem.q.dtype, problem.q.dims[3]
    if problem.backward:
        return "a backward"
    if dtype not in (DataType.BFLOAT16, DataType.HALF, DataType.FP8_E4M3):
        return f"{dtype.name} data (16-bit or e4m3 only)"
    if (dtype.itemsize, head_dim) not in TILES or problem.v.dims[3] != head_dim:
        dims = [d for size, d in TILES if size == dtype.itemsize]
        return f"head dims {head_dim} and {problem.v.dims[3]} (equal, and one of {dims} for {dtype.name})"
    if params.band not in ((None, None), (None, 0)):
        return "a window (no mask or causal only)"
    extras: tuple[str, ...] = ("bias", "alibi_slopes", "sinks", "block_table")
    # and the fp8 backward's own factors: a backward whose do a caller took away to ask about its forward
    extras += tuple(name for name in FP8_BACKWARD_SCALES if name not in FP8_SCALES)
    present = [name for name in extras if getattr(problem, name) is not None]
    if present:
        return f"{', '.join(present)} given"
    if params.softcap is not None or params.dropout_p > 0:
        return "a softcap or dropout"
    if problem.stats is not None and problem.stats.dtype is not DataType.FLOAT:
        return f"{problem.stats.dtype.name} stats (float32 only)"
    for name in ("q", "k", "v"):
        desc = getattr(problem, name)
        strides = tma_strides(desc)
        if desc.strides[3] != 1 or any(s == 0 or s * desc.dtype.itemsize % TMA_ALIGNMENT for s in strides):
            return f"{name}'s strides {desc.strides} (a unit last stride, the others 16-byte aligned, not broadcast)"
    return None


def tma_strides(desc: TensorDescriptor) -> tuple[int, ...]:
    """The (B, H, S) strides of a TMA descriptor of ``desc``: a dim of size 1 reads its coordinate 0
    alone, so any 16-byte aligned stride describes it (its own may be anything)."""
    return tuple(stride if size > 1 else TMA_ALIGNMENT for size, stride in zip(desc.dims[:3], desc.strides[:3]))


def tma_aligned(*tensors: Any) -> bool:
    """The torch tensors' base addresses are 16-byte aligned, as TMA reads them."""
    return all(t.data_ptr() % TMA_ALIGNMENT == 0 for t in tensors)


def launch_arguments(problem: AttentionProblem, tile: Tile) -> tuple[tuple[int], tuple[Any, ...], dict[str, Any]]:
    """(grid, arguments, keyword arguments) of the kernel's launch at ``tile`` on ``problem`` (in
    scope), its tensors Slots named by the problem's slots (q, k, v, o, stats, the sequence lengths
    or ragged offsets, the fp8 factors and maxima; o's where the problem has none, never read); with
    fp8 data, v is v^T in the scratch VALUES_TRANSPOSED (``transposed_values``)."""
    batch, heads_q = problem.batch, problem.q.dims[1]
    o = Slot("o")

    def given(slot: str) -> Slot:
        return o if getattr(problem, slot) is None else Slot(slot)

    ragged = problem.ragged  # the packed batch's stride is never read: a sequence starts at its offset
    blocks, rows = query_block_grid(problem, BLOCK_M)
    # persistent, a program per multiprocessor, where the key and value descriptors serve every block;
    # with sequence lengths of the keys or ragged offsets they end at each sequence's keys: a program a block
    programs = blocks * rows if ragged or problem.seq_lens_kv is not None else min(blocks * rows, programs_to_fill(1))
    lens = ("ragged_offsets_q", "ragged_offsets_kv") if ragged else ("seq_lens_q", "seq_lens_kv")
    lens_strides = tuple(0 if getattr(problem, slot) is None else getattr(problem, slot).strides[0] for slot in lens)
    o_strides = (0, *problem.o.strides[1:]) if ragged else problem.o.strides
    stats_strides = (0, 0, 0) if problem.stats is None else problem.stats.strides
    if ragged:
        stats_strides = (0, *stats_strides[1:])
    v, v_strides = (
        (Slot(VALUES_TRANSPOSED), transposed_strides(problem.v)) if problem.fp8 else (Slot("v"), tma_strides(problem.v))
    )
    args = (
        Slot("q"),
        Slot("k"),
        v,
        o,
        given("stats"),
        *(given(slot) for slot in (*FP8_SCALES, *FP8_AMAX)),
        blocks * rows,
        rows,
        *(given(slot) for slot in lens),
        *lens_strides,
        batch,
        heads_q,
        problem.k.dims[1],
        problem.group,
        problem.seq_q,
        problem.seq_kv,
        (problem.q.dims[2], problem.k.dims[2]),  # packed_rows: ragged, the tokens of every sequence
        *tma_strides(problem.q),
        *tma_strides(problem.k),
        *v_strides,
        *o_strides,
        *stats_strides,
        problem.scale,
    )
    options = dict(
        CAUSAL=problem.params.band == (None, 0),
        BOTTOM_RIGHT=problem.params.alignment is DiagonalAlignment.BOTTOM_RIGHT,
        HAS_LENS_Q=problem.seq_lens_q is not None,
        HAS_LENS_KV=problem.seq_lens_kv is not None,
        RAGGED=ragged,
        STORE_STATS=problem.stats is not None,
        FP8=problem.fp8,
        STORE_AMAX_S=problem.amax_s is not None,
        STORE_AMAX_O=problem.amax_o is not None,
        HEAD_DIM=problem.q.dims[3],
        BLOCK_M=BLOCK_M,
        BLOCK_N=tile.block_n,
        BLOCK_B=triton.next_power_of_2(batch) if ragged else 1,  # the offsets scheduled_block loads
        STAGES=tile.stages,
        SCHEDULE=tile.schedule,
        num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
    )
    return (programs,), args, options


def launches(problem: AttentionProblem, tile: Tile) -> Launches:
    """The kernel's launch at ``tile`` on ``problem`` (in scope); with fp8 data, after the launch
    making v^T (``transposed_values``) in a scratch array of the call."""
    grid, args, options = launch_arguments(problem, tile)
    forward = Launch(attention_warp_specialized_kernel, grid, args, options)
    if not problem.fp8:
        return Launches((forward,))
    transpose, values_transposed = transposed_values(problem.v)
    return Launches((transpose, forward), (values_transposed,))
