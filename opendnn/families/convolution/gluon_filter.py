"""Stride-1 backward filter on Hopper (sm_90): the warp-specialized engine of ``gluon_hopper``
reducing over pixels.

The problems are the TMA route's backward filter (``triton_tma.tma_blocks``) in 16-bit types:
``dw[k, c, tap] = sum over output pixels p of dy[p, k] * x[p + shift(tap), c]``, a GEMM with the
output channels as rows, (tap, input channel) as columns and the N * P * Q output pixels as its
reduced dim. Both operands are activations read by TMA in boxes of 128 pixels x 64 channels (128
bytes): dy's box at a tile's output pixels, x's box at the same pixels moved by the tap's shift
(TMA's zero fill is the padding). In shared memory a box is 128 rows of 128 bytes with the 128-byte
swizzle, the [pixels, channels] matrix wgmma reads (``gluon_hopper``, "The box as an MMA operand"): x's
box is B as it stands ([pixels, c], channels contiguous) and dy's box, permuted, is A ([k, pixels],
k contiguous: wgmma reads a 16-bit A from shared memory in either major order).

**Tiles and work units.** A tile is K_CHUNKS x C_CHUNKS chunks of 64 output x 64 input channels at
one tap (128 x 128 where the channels allow). Its pixel boxes are cut into ``slices`` runs of equal
length; a work unit is one slice of one tile, and one program per SM walks the units
``pid, pid + PROGRAMS, ...`` in slice-major order (the units running together read the same pixels).
A slice's sums go to the workspace as a float32 partial filter and ``filter_sum_kernel`` adds the
partials in slice order, so the result is bitwise repeatable; a single slice writes dw itself
(alpha, beta, the true convolution's turned-around taps).

**Partitions.** As in ``gluon_hopper``: a producer warp fills an mbarrier ring, per box of a unit,
with K_CHUNKS boxes of dy and C_CHUNKS boxes of x; two consumer warpgroups issue asynchronous
wgmma from it and release each stage once their MMAs on it are complete. With two chunks of output
channels consumer h owns chunk h (64 rows of the tile) and every pixel; with one (64 output channels
or fewer) both own it and consumer h takes rows ``64 h ..`` of every box (half the pixels), writing
a partial filter of its own (slice ``2 * slice + h``). A consumer keeps one 64 x 64 float32
accumulator per chunk of input channels and stores it from the MMA's register layout (a thread's two
adjacent channels on each of its rows: whole 32-byte sectors), without a layout conversion: the
ring takes all of shared memory.

**Slices** (``filter_split``): the count whose estimated time is least, in two parts. The MMAs: the
units' rounds over the SMs times the boxes of a slice times a step's time, the larger of its MMA time
and its loads' time at the per-SM peak rates below. The partials: one launch of the sum kernel plus
writing and reading them at HBM's bandwidth. Each slice sums at least MIN_SLICE_BOXES boxes.
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from opendnn.families.convolution.gluon_hopper import CONSUMER_REGISTERS, MAX_STAGES, PRODUCER_REGISTERS, SHARED_MEMORY
from opendnn.families.convolution.problem import ConvolutionProblem
from opendnn.families.convolution.triton_direct import store_filter
from opendnn.families.convolution.triton_gemm import box_origin
from opendnn.families.convolution.triton_tiles import geometry, strides5
from opendnn.families.convolution.triton_tma import (
    MIN_SLICE_BOXES,
    TMA_BLOCK_M,
    _planned_tma_blocks,
    _tma_read,
    pixel_boxes,
)
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.launch import Launch, Slot

CHUNK = gl.constexpr(64)  # 16-bit channels of a box: 128 bytes, one swizzle row


@gluon.jit
def filter_producer(
    x_ptr,
    dy_ptr,
    x_ring,
    dy_ring,
    ready,
    empty,
    N,
    XH,
    XW,
    C,
    OH,
    OW,
    K,
    R,
    S,
    x_sn,
    x_sh,
    x_sw,
    dy_sn,
    dy_sh,
    dy_sw,
    pad_h,
    pad_w,
    dil_h,
    dil_w,
    slices,
    slice_boxes,
    PROGRAMS: gl.constexpr,
):
    """Fill the ring: per box of every unit of this program, dy's chunks at the box and x's at the box
    moved by the tap's shift."""
    BOX: gl.constexpr = [dy_ring.shape[1], dy_ring.shape[2], dy_ring.shape[3], dy_ring.shape[4]]
    dy_desc = tma.make_tensor_descriptor(dy_ptr, [N, OH, OW, K], [dy_sn, dy_sh, dy_sw, 1], BOX, dy_ring.layout)
    x_desc = tma.make_tensor_descriptor(x_ptr, [N, XH, XW, C], [x_sn, x_sh, x_sw, 1], BOX, x_ring.layout)
    STAGES: gl.constexpr = ready.shape[0]
    K_CHUNKS: gl.constexpr = dy_ring.shape[0] // STAGES
    C_CHUNKS: gl.constexpr = x_ring.shape[0] // STAGES
    tiles_c = gl.cdiv(C, C_CHUNKS * CHUNK)
    tiles = gl.cdiv(K, K_CHUNKS * CHUNK) * R * S * tiles_c
    boxes = gl.cdiv(N, BOX[0]) * gl.cdiv(OH, BOX[1]) * gl.cdiv(OW, BOX[2])
    step = 0
    for unit in range(gl.program_id(0), tiles * slices, PROGRAMS):
        tile = unit % tiles
        c0 = tile % tiles_c * (C_CHUNKS * CHUNK)
        tap = tile // tiles_c % (R * S)
        k0 = tile // (tiles_c * R * S) * (K_CHUNKS * CHUNK)
        shift_h = tap // S * dil_h - pad_h  # x[p + shift] meets dy[p]
        shift_w = tap % S * dil_w - pad_w
        begin = unit // tiles * slice_boxes
        for box in range(begin, gl.minimum(begin + slice_boxes, boxes)):
            n0, h0, w0 = box_origin(box, N, OH, OW, BOX[0], BOX[1], BOX[2])
            stage = step % STAGES
            mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)
            filled = ready.index(stage)
            mbarrier.expect(filled, (K_CHUNKS + C_CHUNKS) * dy_desc.block_type.nbytes)
            for chunk in gl.static_range(K_CHUNKS):
                tma.async_copy_global_to_shared(
                    dy_desc, [n0, h0, w0, k0 + chunk * CHUNK], filled, dy_ring.index(stage * K_CHUNKS + chunk)
                )
            for chunk in gl.static_range(C_CHUNKS):
                tma.async_copy_global_to_shared(
                    x_desc,
                    [n0, h0 + shift_h, w0 + shift_w, c0 + chunk * CHUNK],
                    filled,
                    x_ring.index(stage * C_CHUNKS + chunk),
                )
            step += 1


@gluon.jit
def filter_consumer(
    x_ring,
    dy_ring,
    ready,
    empty,
    dw_ptr,
    partial_ptr,
    N,
    C,
    OH,
    OW,
    K,
    R,
    S,
    w_sk,
    w_sc,
    w_sr,
    w_ss,
    slices,
    slice_boxes,
    alpha,
    beta,
    HALF: gl.constexpr,
    PARTIAL: gl.constexpr,
    HAS_BETA: gl.constexpr,
    FLIP: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """Consumer ``HALF``'s part of every unit of this program: its MMAs, then its rows of the tile
    stored to dw or to its partial filter."""
    STAGES: gl.constexpr = ready.shape[0]
    K_CHUNKS: gl.constexpr = dy_ring.shape[0] // STAGES
    C_CHUNKS: gl.constexpr = x_ring.shape[0] // STAGES
    IMAGES: gl.constexpr = dy_ring.shape[1]
    BLOCK_H: gl.constexpr = dy_ring.shape[2]
    BLOCK_W: gl.constexpr = dy_ring.shape[3]
    PIXELS: gl.constexpr = IMAGES * BLOCK_H * BLOCK_W
    # one chunk of output channels: both consumers own it, each reduces half of every box's pixels
    ROWS: gl.constexpr = PIXELS // 2 if K_CHUNKS == 1 else PIXELS
    FIRST_ROW: gl.constexpr = HALF * ROWS if K_CHUNKS == 1 else 0
    K_CHUNK: gl.constexpr = 0 if K_CHUNKS == 1 else HALF
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, CHUNK, 16]
    )
    tiles_c = gl.cdiv(C, C_CHUNKS * CHUNK)
    tiles = gl.cdiv(K, K_CHUNKS * CHUNK) * R * S * tiles_c
    boxes = gl.cdiv(N, IMAGES) * gl.cdiv(OH, BLOCK_H) * gl.cdiv(OW, BLOCK_W)
    k_offsets = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, ACC_LAYOUT))
    c_offsets = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ACC_LAYOUT))
    step = 0
    for unit in range(gl.program_id(0), tiles * slices, PROGRAMS):
        acc0 = gl.zeros((CHUNK, CHUNK), dtype=gl.float32, layout=ACC_LAYOUT)
        acc1 = gl.zeros((CHUNK, CHUNK), dtype=gl.float32, layout=ACC_LAYOUT)
        begin = unit // tiles * slice_boxes
        count = gl.minimum(begin + slice_boxes, boxes) - begin
        for i in range(count):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), step // STAGES & 1)
            # dy's box as A = [k, pixels] (k contiguous), x's as B = [pixels, c]: this consumer's rows
            a = dy_ring.index(stage * K_CHUNKS + K_CHUNK).reshape([PIXELS, CHUNK]).slice(FIRST_ROW, ROWS)
            b0 = x_ring.index(stage * C_CHUNKS).reshape([PIXELS, CHUNK]).slice(FIRST_ROW, ROWS)
            acc0 = warpgroup_mma(a.permute((1, 0)), b0, acc0, is_async=True)
            if C_CHUNKS == 2:
                b1 = x_ring.index(stage * C_CHUNKS + 1).reshape([PIXELS, CHUNK]).slice(FIRST_ROW, ROWS)
                acc1 = warpgroup_mma(a.permute((1, 0)), b1, acc1, is_async=True)
                acc0, acc1 = warpgroup_mma_wait(2, deps=(acc0, acc1))  # the previous step's MMAs are done
            else:
                acc0 = warpgroup_mma_wait(1, deps=(acc0,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=i > 0)
            step += 1
        acc0, acc1 = warpgroup_mma_wait(0, deps=(acc0, acc1))
        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=count > 0)

        tile = unit % tiles
        c0 = tile % tiles_c * (C_CHUNKS * CHUNK)
        tap = tile // tiles_c % (R * S)
        k = (tile // (tiles_c * R * S) * K_CHUNKS + K_CHUNK) * CHUNK + k_offsets
        part = unit // tiles * 2 + HALF if K_CHUNKS == 1 else unit // tiles
        for chunk in gl.static_range(C_CHUNKS):
            c = c0 + chunk * CHUNK + c_offsets
            store_filter(
                acc1 if chunk == 1 else acc0,
                k[:, None],
                tap * C + c[None, :],
                part,
                dw_ptr,
                partial_ptr,
                K,
                C,
                R * S,
                1,
                R,
                S,
                w_sk,
                w_sc,
                0,
                w_sr,
                w_ss,
                (k < K)[:, None] & (c < C)[None, :],
                alpha,
                beta,
                PARTIAL,
                HAS_BETA,
                FLIP,
                gl.float32,
            )


@gluon.jit
def filter_warp_specialized_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    N,
    XH,
    XW,
    C,
    OH,
    OW,
    K,
    R,
    S,
    x_sn,
    x_sh,
    x_sw,
    dy_sn,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_sr,
    w_ss,
    pad_h,
    pad_w,
    dil_h,
    dil_w,
    slices,
    slice_boxes,
    alpha: tl.float64,
    beta: tl.float64,
    PARTIAL: gl.constexpr,
    HAS_BETA: gl.constexpr,
    FLIP: gl.constexpr,
    IMAGES: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_W: gl.constexpr,
    K_CHUNKS: gl.constexpr,
    C_CHUNKS: gl.constexpr,
    STAGES: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """``filter_tma_kernel``'s backward filter (channels-last x [N, XH, XW, C] and dy [N, OH, OW, K]
    read in boxes, dw at any strides, or the units' partial filters) on the warp-specialized engine."""
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    BOX: gl.constexpr = [IMAGES, BLOCK_H, BLOCK_W, CHUNK]
    LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(BOX, dtype)  # 128-byte swizzle
    dy_ring = gl.allocate_shared_memory(dtype, [STAGES * K_CHUNKS] + BOX, LAYOUT)
    x_ring = gl.allocate_shared_memory(dtype, [STAGES * C_CHUNKS] + BOX, LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(STAGES):
        mbarrier.init(ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    # the consumers' argument tuples differ only in HALF (gluon_hopper, "Arguments")
    gl.warp_specialize(
        [
            (
                filter_consumer,
                (
                    x_ring,
                    dy_ring,
                    ready,
                    empty,
                    dw_ptr,
                    partial_ptr,
                    N,
                    C,
                    OH,
                    OW,
                    K,
                    R,
                    S,
                    w_sk,
                    w_sc,
                    w_sr,
                    w_ss,
                    slices,
                    slice_boxes,
                    alpha,
                    beta,
                    0,
                    PARTIAL,
                    HAS_BETA,
                    FLIP,
                    PROGRAMS,
                ),
            ),
            (
                filter_consumer,
                (
                    x_ring,
                    dy_ring,
                    ready,
                    empty,
                    dw_ptr,
                    partial_ptr,
                    N,
                    C,
                    OH,
                    OW,
                    K,
                    R,
                    S,
                    w_sk,
                    w_sc,
                    w_sr,
                    w_ss,
                    slices,
                    slice_boxes,
                    alpha,
                    beta,
                    1,
                    PARTIAL,
                    HAS_BETA,
                    FLIP,
                    PROGRAMS,
                ),
            ),
            (
                filter_producer,
                (
                    x_ptr,
                    dy_ptr,
                    x_ring,
                    dy_ring,
                    ready,
                    empty,
                    N,
                    XH,
                    XW,
                    C,
                    OH,
                    OW,
                    K,
                    R,
                    S,
                    x_sn,
                    x_sh,
                    x_sw,
                    dy_sn,
                    dy_sh,
                    dy_sw,
                    pad_h,
                    pad_w,
                    dil_h,
                    dil_w,
                    slices,
                    slice_boxes,
                    PROGRAMS,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, PRODUCER_REGISTERS],
    )


# ---- planner and launcher ------------------------------------------------------------------------

# Per-SM peak rates of an H200 (132 SMs) the slice count is estimated with: dense 16-bit wgmma
# (989 TFLOP/s), L2 to one SM (64 bytes a clock at 1.98 GHz), and HBM for the partials (4.8 TB/s).
SM_MMA_FLOPS_PER_US = 7.5e6
SM_LOAD_BYTES_PER_US = 1.27e5
HBM_BYTES_PER_US = 4.8e6
SUM_LAUNCH_US = 3.0  # the partials' sum kernel launched after the engine, and its tail


@dataclasses.dataclass(frozen=True)
class FilterSplit:
    """How the backward filter runs on the engine: chunks of a tile, pixel slices and the partial
    filters they leave (0: the units write dw themselves)."""

    k_chunks: int
    c_chunks: int
    slices: int
    slice_boxes: int
    units: int
    partials: int


def filter_split(problem: ConvolutionProblem) -> FilterSplit:
    """The tile and the slice count whose estimated time is least (module docstring, "Slices")."""
    geo = geometry(problem)
    images, block_h, block_w = _planned_tma_blocks(problem)
    boxes = pixel_boxes(geo.n, geo.y_size, (images, block_h, block_w))
    k_chunks, c_chunks = (2 if geo.k > CHUNK.value else 1), (2 if geo.c > CHUNK.value else 1)
    tiles = triton.cdiv(geo.k, k_chunks * CHUNK.value) * geo.taps * triton.cdiv(geo.c, c_chunks * CHUNK.value)
    halves = 2 if k_chunks == 1 else 1  # partial filters a unit leaves
    step_us = max(  # both consumers' MMAs on one box, or its chunks' loads
        2 * TMA_BLOCK_M * k_chunks * c_chunks * CHUNK.value**2 / SM_MMA_FLOPS_PER_US,
        (k_chunks + c_chunks) * TMA_BLOCK_M * CHUNK.value * 2 / SM_LOAD_BYTES_PER_US,
    )
    partial_bytes = geo.k * geo.c * geo.taps * 4
    sms = programs_to_fill(1)

    def estimate(slices: int) -> float:
        per_slice = triton.cdiv(boxes, slices)
        mainloop = triton.cdiv(tiles * slices, sms) * per_slice * step_us
        partials = slices * halves
        return mainloop + (SUM_LAUNCH_US + 2 * partials * partial_bytes / HBM_BYTES_PER_US if partials > 1 else 0)

    slices = min(range(1, max(1, boxes // MIN_SLICE_BOXES) + 1), key=estimate)
    per_slice = triton.cdiv(boxes, slices)
    slices = triton.cdiv(boxes, per_slice)
    partials = slices * halves
    return FilterSplit(k_chunks, c_chunks, slices, per_slice, tiles * slices, partials if partials > 1 else 0)


def stages(split: FilterSplit) -> int:
    """The ring's stages that fit in shared memory: a stage is every chunk of one box."""
    stage_bytes = (split.k_chunks + split.c_chunks) * TMA_BLOCK_M * CHUNK.value * 2
    return min(MAX_STAGES, (SHARED_MEMORY - 1024) // stage_bytes)  # 1 KB for the barriers


def filter_warp_specialized_launch(problem: ConvolutionProblem) -> Launch:
    """The launch of ``filter_warp_specialized_kernel``: one program per SM (fewer for fewer units)."""
    geo = geometry(problem)
    images, block_h, block_w = _planned_tma_blocks(problem)
    split = filter_split(problem)
    (x, x_desc), (dy, dy_desc) = _tma_read(problem, "x"), _tma_read(problem, "y")
    x_sn, _, _, x_sh, x_sw = strides5(x_desc)
    dy_sn, _, _, dy_sh, dy_sw = strides5(dy_desc)
    w_sk, w_sc, _, w_sr, w_ss = strides5(problem.w)
    programs = min(split.units, programs_to_fill(1))
    args = (
        x,
        dy,
        Slot("w"),
        Slot("partial") if split.partials else Slot("w"),
        geo.n,
        *geo.x_size[1:],
        geo.c,
        *geo.y_size[1:],
        geo.k,
        *geo.filt[1:],
        x_sn,
        x_sh,
        x_sw,
        dy_sn,
        dy_sh,
        dy_sw,
        w_sk,
        w_sc,
        w_sr,
        w_ss,
        *geo.pad[1:],
        *geo.dilation[1:],
        split.slices,
        split.slice_boxes,
        problem.alpha,
        problem.beta,
    )
    return Launch(
        filter_warp_specialized_kernel,
        (programs,),
        args,
        dict(
            PARTIAL=split.partials > 0,
            HAS_BETA=problem.beta != 0.0,
            FLIP=problem.flip,
            IMAGES=images,
            BLOCK_H=block_h,
            BLOCK_W=block_w,
            K_CHUNKS=split.k_chunks,
            C_CHUNKS=split.c_chunks,
            STAGES=stages(split),
            PROGRAMS=programs,
            num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
        ),
    )
