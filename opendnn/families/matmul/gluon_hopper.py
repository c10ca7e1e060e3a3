"""Matrix multiplication on Hopper (sm_90): a persistent, warp-specialized GEMM engine in Gluon.

FLOPs and bytes are the ``tl.dot`` kernel's (``triton_backend``): ``2 * batch * M * N * K`` FLOPs over
at least ``A + B + C`` bytes, far above the H200's ridge for the products this engine takes (16-bit
operands that fill the GPU with 128 x 256 tiles), so the aim is tensor cores that never wait: for
loads, for the MMAs' own results, or for the epilogue.

One program per SM walks the tiles ``pid, pid + PROGRAMS, ...`` of ``batch x tiles_m x tiles_n`` in
grouped order (``triton_tiles.tile_coordinates``). Each program is three partitions of warps that run
side by side and talk only through shared memory and mbarriers:

- **producer** (``tma_producer``, 1 warp, PRODUCER_REGISTERS registers a thread): for every k-step of
  every tile of the program, waits until a stage of the ring is empty, then has TMA copy into it the
  two 64-row halves of A's 128 x 64 tile and B's 64 x 256 tile, all signalling the stage's ``ready``
  barrier with their byte count. TMA reads 3-D descriptors ``[batch, rows, cols]`` in each operand's
  stored order (a transposed operand's rows are K), zero-filled past every edge, so M, N and K may
  have any size. The producer builds them itself, on the device, at its start: the thread that
  releases a new descriptor to the tensormap proxy is the one that acquires it and reads through it.
- **two consumers** (``mma_consumer``, one warpgroup each, CONSUMER_REGISTERS registers a thread;
  the first is the kernel's own 4 warps, the default partition): consumer h owns rows
  ``64 h .. 64 h + 63`` of the tile, a 64 x 256 float32 accumulator (128 registers a thread). Per
  k-step it waits for ``ready``, issues an asynchronous ``warpgroup_mma`` on its half of A and all
  of B, waits until one MMA group is left in flight (the previous step's is then done) and releases
  the previous step's stage on ``empty``. After the tile's last step it finishes its 64 x 256 half of
  C in two 64 x 128 parts: each converted to a blocked layout of 8 consecutive columns a thread
  (16-byte loads and stores of a 16-bit C), then ``triton_tiles.finish_tile``, the epilogue of the
  ``tl.dot`` kernel: scale, bias per row or column, activation, residual, alpha, beta * C, cast and
  masked store. Meanwhile the producer already fills the ring with the next tile's k-steps.

**Ring and barriers.** STAGES stages, each A's two halves and B's tile. ``ready[s]`` counts one
arrival (the producer's ``expect``) plus the stage's bytes; ``empty[s]`` counts two arrivals, one per
consumer: an ``mbarrier.arrive`` is issued by one thread of its partition, so each warpgroup arrives
for itself once its own MMAs on the stage are complete (``warpgroup_mma_wait``), and the stage is
free when both have. Step ``i`` of a partition (counted over all its tiles) uses stage
``i % STAGES`` in phase ``(i // STAGES) & 1``; the producer waits on ``empty`` with the phase
flipped, which a fresh barrier passes. Only the async proxy (TMA writes, wgmma reads) touches the
ring, so no proxy fence is needed between the two.

**Registers.** The kernel's 4 warps and the workers' 4 + 1 (padded to 4) are 12 warps, 168 registers
a thread at launch (64K over 384 threads). Inside the partitions ``setmaxnreg`` moves them: the
producer's warpgroup gives up all but 24, each consumer warpgroup gets 240 (the compiler gives the
default partition what the workers leave).

**Shared memory.** A stage is ``(128 x 64 + 64 x 256) x 2`` bytes = 48 KB; the epilogue's layout
conversion takes 8 KB a consumer (Triton stages the 64 x 128 float32 part in 4 rounds); the
barriers and the descriptors being built a few hundred bytes. Of sm_90's 227 KB a block, 4 stages
(192 KB of ring, 208 KB in all) are what fits (``STAGES``).

**Arguments.** The partitions take every scalar as an argument of its own, in tuples written out
where ``warp_specialize`` is called: a tuple assigned in a Gluon kernel turns its constexprs (a unit
stride that Triton specialized) into runtime values, and the epilogue would lose its vector loads and
stores; concatenated, a tuple loses a string constexpr (the activation's name) altogether.
"""

from __future__ import annotations

from typing import Any

import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from opendnn.core.descriptors import TensorDescriptor
from opendnn.families.matmul.problem import MatmulProblem
from opendnn.families.matmul.triton_tiles import (
    batch_offset,
    epilogue_arguments,
    epilogue_options,
    finish_tile,
    persistent_programs,
    tile_coordinates,
)
from opendnn.kernels.launch import Launch, Slot

CONSUMER_REGISTERS = gl.constexpr(240)
PRODUCER_REGISTERS = gl.constexpr(24)
# a thread's 8 consecutive columns of a 64 x 128 part of C (4 warps): the epilogue's loads and stores
EPILOGUE_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))


@gluon.jit
def operand_descriptor(ptr, batches, batch_stride, rows, cols, row_stride, ring):
    """A TMA descriptor of one operand as it is stored, ``[batches, rows, cols]``, read in boxes of one
    buffer of its ``ring`` (``[buffers, 1, box rows, box cols]``, in the layout wgmma reads)."""
    box: gl.constexpr = [1, ring.shape[2], ring.shape[3]]
    return tma.make_tensor_descriptor(ptr, [batches, rows, cols], [batch_stride, row_stride, 1], box, ring.layout)


@gluon.jit
def tma_producer(
    a_ptr,
    b_ptr,
    a_ring,
    b_ring,
    ready,
    empty,
    M,
    N,
    K,
    a_batches,
    a_batch_stride,
    a_row_stride,
    b_batches,
    b_batch_stride,
    b_row_stride,
    total,
    A_TRANSPOSED: gl.constexpr,
    B_TRANSPOSED: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """Fill the ring: per k-step of every tile of this program, A's two halves and B's tile. The
    descriptors are built here, by the warp that uses them (the tensormap proxy's release and acquire
    in one thread)."""
    STAGES: gl.constexpr = b_ring.shape[0]
    HALF_M: gl.constexpr = BLOCK_M // 2
    if A_TRANSPOSED:
        a_desc = operand_descriptor(a_ptr, a_batches, a_batch_stride, K, M, a_row_stride, a_ring)
    else:
        a_desc = operand_descriptor(a_ptr, a_batches, a_batch_stride, M, K, a_row_stride, a_ring)
    if B_TRANSPOSED:
        b_desc = operand_descriptor(b_ptr, b_batches, b_batch_stride, N, K, b_row_stride, b_ring)
    else:
        b_desc = operand_descriptor(b_ptr, b_batches, b_batch_stride, K, N, b_row_stride, b_ring)
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    step = 0
    for tile in range(gl.program_id(0), total, PROGRAMS):
        batch, tile_m, tile_n = tile_coordinates(tile, tiles_m, tiles_n, GROUP_M)
        a_batch = batch % a_batches  # a broadcast operand is one batch
        b_batch = batch % b_batches
        for k0 in range(0, K, BLOCK_K):
            stage = step % STAGES
            mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)
            filled = ready.index(stage)
            mbarrier.expect(filled, 2 * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for half in gl.static_range(2):
                m0 = tile_m * BLOCK_M + half * HALF_M
                a_coordinates = [a_batch, k0, m0] if A_TRANSPOSED else [a_batch, m0, k0]
                tma.async_copy_global_to_shared(a_desc, a_coordinates, filled, a_ring.index(2 * stage + half))
            n0 = tile_n * BLOCK_N
            b_coordinates = [b_batch, n0, k0] if B_TRANSPOSED else [b_batch, k0, n0]
            tma.async_copy_global_to_shared(b_desc, b_coordinates, filled, b_ring.index(stage))
            step += 1


@gluon.jit
def mma_consumer(
    a_ring,
    b_ring,
    ready,
    empty,
    c_ptr,
    bias_ptr,
    residual_ptr,
    M,
    N,
    K,
    batch_inner,
    c_batch_outer,
    c_batch_inner,
    c_stride_m,
    c_stride_n,
    r_batch_outer,
    r_batch_inner,
    r_stride_m,
    r_stride_n,
    bias_stride,
    alpha,
    beta,
    scale,
    coef,
    total,
    HALF: gl.constexpr,
    A_TRANSPOSED: gl.constexpr,
    B_TRANSPOSED: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    BIAS_PER_ROW: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    HAS_BETA: gl.constexpr,
    ACC: gl.constexpr,
    FAST: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """Rows ``HALF * BLOCK_M / 2`` on of every tile of this program: the MMAs, then the epilogue."""
    STAGES: gl.constexpr = b_ring.shape[0]
    HALF_M: gl.constexpr = BLOCK_M // 2
    HALF_N: gl.constexpr = BLOCK_N // 2
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    tiles_m = gl.cdiv(M, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    k_steps = gl.cdiv(K, BLOCK_K)
    local_rows = gl.arange(0, HALF_M, layout=gl.SliceLayout(1, EPILOGUE_LAYOUT))
    local_cols = gl.arange(0, HALF_N, layout=gl.SliceLayout(0, EPILOGUE_LAYOUT))
    step = 0
    for tile in range(gl.program_id(0), total, PROGRAMS):
        acc = gl.zeros((HALF_M, BLOCK_N), dtype=ACC, layout=ACC_LAYOUT)
        for k_step in range(k_steps):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), step // STAGES & 1)
            a = a_ring.index(2 * stage + HALF)  # [1, rows, cols] as stored
            a = a.reshape([a.shape[1], a.shape[2]])
            b = b_ring.index(stage)
            b = b.reshape([b.shape[1], b.shape[2]])
            if A_TRANSPOSED:  # wgmma reads 16-bit operands from shared memory in either order
                a = a.permute((1, 0))
            if B_TRANSPOSED:
                b = b.permute((1, 0))
            acc = warpgroup_mma(a, b, acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous step's MMA is done: release its stage
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k_step > 0)
            step += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k_steps > 0)

        batch, tile_m, tile_n = tile_coordinates(tile, tiles_m, tiles_n, GROUP_M)
        c_base = c_ptr + batch_offset(batch, batch_inner, c_batch_outer, c_batch_inner)
        r_base = residual_ptr + batch_offset(batch, batch_inner, r_batch_outer, r_batch_inner)
        parts = gl.split(acc.reshape([HALF_M, 2, HALF_N]).permute((0, 2, 1)))  # columns 0..127, 128..255
        for part in gl.static_range(2):
            finish_tile(
                gl.convert_layout(parts[part], EPILOGUE_LAYOUT),
                local_rows,
                local_cols,
                tile_m * BLOCK_M + HALF * HALF_M,
                tile_n * BLOCK_N + part * HALF_N,
                M,
                N,
                c_base,
                c_stride_m,
                c_stride_n,
                r_base,
                r_stride_m,
                r_stride_n,
                bias_ptr,
                bias_stride,
                alpha,
                beta,
                scale,
                coef,
                HAS_BIAS,
                BIAS_PER_ROW,
                ACTIVATION,
                HAS_RESIDUAL,
                HAS_BETA,
                ACC,
                FAST,
            )


@gluon.jit
def gluon_matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    residual_ptr,
    M,
    N,
    K,
    batch_count,
    batch_inner,
    c_batch_outer,
    c_batch_inner,
    c_stride_m,
    c_stride_n,
    r_batch_outer,
    r_batch_inner,
    r_stride_m,
    r_stride_n,
    bias_stride,
    a_batches,
    a_batch_stride,
    a_row_stride,
    b_batches,
    b_batch_stride,
    b_row_stride,
    alpha: tl.float64,
    beta: tl.float64,
    scale: tl.float64,
    coef: tl.float64,
    A_TRANSPOSED: gl.constexpr,
    B_TRANSPOSED: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    BIAS_PER_ROW: gl.constexpr,
    ACTIVATION: gl.constexpr,
    HAS_RESIDUAL: gl.constexpr,
    HAS_BETA: gl.constexpr,
    ACC: gl.constexpr,
    FAST: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """C = epilogue(A @ B) over ``batch_count`` products (two batch dims for C and the residual; A and
    B each one batch stride, ``*_batches`` 1 when broadcast). ``*_row_stride``: the stride of an
    operand's stored rows (K for a transposed A, N for a transposed B)."""
    HALF_M: gl.constexpr = BLOCK_M // 2
    A_BLOCK: gl.constexpr = [1, BLOCK_K, HALF_M] if A_TRANSPOSED else [1, HALF_M, BLOCK_K]
    B_BLOCK: gl.constexpr = [1, BLOCK_N, BLOCK_K] if B_TRANSPOSED else [1, BLOCK_K, BLOCK_N]
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    A_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(A_BLOCK, dtype)  # swizzled as wgmma reads it
    B_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(B_BLOCK, dtype)
    a_ring = gl.allocate_shared_memory(dtype, [2 * STAGES] + A_BLOCK, A_LAYOUT)  # two halves a stage
    b_ring = gl.allocate_shared_memory(dtype, [STAGES] + B_BLOCK, B_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(STAGES):
        mbarrier.init(ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    total = batch_count * gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    # The consumers' argument tuples differ only in HALF, and are written out twice: a tuple built once
    # and assigned (or concatenated) would lose its constexprs (module docstring, "Arguments").
    gl.warp_specialize(  # the first partition runs in the kernel's own 4 warps
        [
            (
                mma_consumer,
                (
                    a_ring,
                    b_ring,
                    ready,
                    empty,
                    c_ptr,
                    bias_ptr,
                    residual_ptr,
                    M,
                    N,
                    K,
                    batch_inner,
                    c_batch_outer,
                    c_batch_inner,
                    c_stride_m,
                    c_stride_n,
                    r_batch_outer,
                    r_batch_inner,
                    r_stride_m,
                    r_stride_n,
                    bias_stride,
                    alpha,
                    beta,
                    scale,
                    coef,
                    total,
                    0,
                    A_TRANSPOSED,
                    B_TRANSPOSED,
                    HAS_BIAS,
                    BIAS_PER_ROW,
                    gl.constexpr(ACTIVATION),  # a str in a tuple must stay a constexpr
                    HAS_RESIDUAL,
                    HAS_BETA,
                    ACC,
                    FAST,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
            (
                mma_consumer,
                (
                    a_ring,
                    b_ring,
                    ready,
                    empty,
                    c_ptr,
                    bias_ptr,
                    residual_ptr,
                    M,
                    N,
                    K,
                    batch_inner,
                    c_batch_outer,
                    c_batch_inner,
                    c_stride_m,
                    c_stride_n,
                    r_batch_outer,
                    r_batch_inner,
                    r_stride_m,
                    r_stride_n,
                    bias_stride,
                    alpha,
                    beta,
                    scale,
                    coef,
                    total,
                    1,
                    A_TRANSPOSED,
                    B_TRANSPOSED,
                    HAS_BIAS,
                    BIAS_PER_ROW,
                    gl.constexpr(ACTIVATION),  # a str in a tuple must stay a constexpr
                    HAS_RESIDUAL,
                    HAS_BETA,
                    ACC,
                    FAST,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
            (
                tma_producer,
                (
                    a_ptr,
                    b_ptr,
                    a_ring,
                    b_ring,
                    ready,
                    empty,
                    M,
                    N,
                    K,
                    a_batches,
                    a_batch_stride,
                    a_row_stride,
                    b_batches,
                    b_batch_stride,
                    b_row_stride,
                    total,
                    A_TRANSPOSED,
                    B_TRANSPOSED,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, PRODUCER_REGISTERS],
    )


# ---- launcher ------------------------------------------------------------------------------------

BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M = 128, 256, 64, 8
SHARED_MEMORY = 227 * 1024  # what one block may use on sm_90
EPILOGUE_SHARED_MEMORY = 2 * 8 * 1024  # the two consumers' layout conversions (as Triton 3.6 compiles them)
STAGE_BYTES = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * 2  # 16-bit A and B tiles: 48 KB
STAGES = (SHARED_MEMORY - EPILOGUE_SHARED_MEMORY) // STAGE_BYTES  # 4


def gluon_launch(
    problem: MatmulProblem,
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
    bias: TensorDescriptor | None,
    residual: TensorDescriptor | None,
    batch_dims: list[int],
    strides: list[Any],
    tma_batches: tuple[tuple[int, int], tuple[int, int]],
    transposed: tuple[bool, bool],
    sms: int,
    fast: bool,
) -> Launch:
    """The kernel's launch over two batch dims: ``strides`` holds each operand's two batch strides
    (``triton_backend.merged_batch``), ``tma_batches`` the (batches, batch stride) of A's and B's
    descriptors, ``transposed`` whether A and B are stored K-major and N-major (rows K); ``fast``: a
    16-bit C whose activation may take the approximate instructions."""
    (sa_m, sa_k), (sb_k, sb_n) = a.strides[-2:], b.strides[-2:]
    a_transposed, b_transposed = transposed
    tiles = batch_dims[0] * batch_dims[1] * -(-problem.m // BLOCK_M) * -(-problem.n // BLOCK_N)
    programs = persistent_programs(tiles, sms)
    args = (
        Slot("a"),
        Slot("b"),
        Slot("c"),
        Slot("bias"),
        Slot("residual"),
        problem.m,
        problem.n,
        problem.k,
        batch_dims[0] * batch_dims[1],
        batch_dims[1],
        *epilogue_arguments(c, bias, residual, strides[2], strides[3]),
        *tma_batches[0],
        sa_k if a_transposed else sa_m,
        *tma_batches[1],
        sb_n if b_transposed else sb_k,
        problem.alpha,
        problem.beta,
        problem.scale,
        problem.coef,
    )
    return Launch(
        gluon_matmul_kernel,
        (programs,),
        args,
        dict(
            A_TRANSPOSED=a_transposed,
            B_TRANSPOSED=b_transposed,
            **epilogue_options(problem, bias is not None, residual is not None, fast),
            BLOCK_M=BLOCK_M,
            BLOCK_N=BLOCK_N,
            BLOCK_K=BLOCK_K,
            GROUP_M=GROUP_M,
            STAGES=STAGES,
            PROGRAMS=programs,
            num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
        ),
    )
