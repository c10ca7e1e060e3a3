"""Backward filter on Hopper (sm_90): the warp-specialized engine of ``gluon_hopper`` reducing over
pixels.

The problems are the TMA route's backward filter (``triton_tma.tma_blocks``) in 16-bit types:
``dw[k, c, tap] = sum over output pixels p of dy[p, k] * x[stride * p + shift(tap), c]``, a GEMM with
the output channels as rows, (tap, input channel) as columns and the N * P * Q output pixels as its
reduced dim. Both operands are activations read by TMA in boxes of IMAGES x BLOCK_H x BLOCK_W pixels
(64 or 128): dy's box of 64 channels (128 bytes) at a tile's output pixels, x's box of BLOCK_C
channels of the pixels those read at the tap, a box of x's phase view (``triton_gemm.phase_view_box``;
stride 1: dy's box moved by the tap's shift), TMA's zero fill the padding. In shared
memory a box is one row of channels a pixel with the 128-byte swizzle, the [pixels, channels] matrix
wgmma reads (``gluon_hopper``, "The box as an MMA operand"): x's box is B as it stands ([pixels, c],
channels contiguous) and dy's box, permuted, is A ([k, pixels], k contiguous: wgmma reads a 16-bit A
from shared memory in either major order).

**Tiles and work units.** A tile is K_CHUNKS chunks of 64 output channels (two where there are more
than 64) x BLOCK_C input channels (64, 128 or 256) at one tap. Its pixel boxes are cut into
``slices`` runs of equal length; a work unit is one slice of one tile, and one program per SM walks
the units ``pid, pid + PROGRAMS, ...`` in slice-major order (the units running together read the
same pixels). A slice's sums go to the workspace as a float32 partial filter and
``filter_sum_kernel`` adds the partials in slice order, so the result is bitwise repeatable; a
single slice writes dw itself (alpha, beta, the true convolution's turned-around taps).

**Partitions.** As in ``gluon_hopper``: a producer warp fills an mbarrier ring, per box of a unit,
with K_CHUNKS boxes of dy and one of x; two consumer warpgroups issue asynchronous wgmma from it and
release each stage once their MMAs on it are complete. With two chunks of output channels consumer h
owns chunk h (64 rows of the tile) and every pixel; with one (64 output channels or fewer) both own
it and consumer h takes rows ``PIXELS / 2 * h ..`` of every box (half the pixels), writing a partial
filter of its own (``2 * slice + h``). A consumer's 64 x BLOCK_C float32 accumulator is stored from
the MMA's register layout (a thread's two adjacent channels on each of its rows: whole 32-byte
sectors), without a layout conversion: the ring takes all of shared memory.

**The plan** (``filter_candidates``, ``filter_split``): for each BLOCK_C, the box of powers of two
that covers the pixels with the least padding among those that leave MIN_STAGES stages
(``filter_box``), and every slice count; the estimated time of each is the units' rounds over the
SMs times the boxes of a slice times a step's time (the larger of its MMAs' and its loads' time at
the rates below), at least the time of reading x and dy from HBM once, plus, when there are partial
filters, the sum kernel's launch and their round trip. The least estimate wins.
"""

from __future__ import annotations

import dataclasses
import math

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from opendnn.families.convolution.gluon_hopper import CONSUMER_REGISTERS, MAX_STAGES, PRODUCER_REGISTERS, SHARED_MEMORY
from opendnn.families.convolution.problem import ConvolutionProblem
from opendnn.families.convolution.triton_direct import store_tap_filter
from opendnn.families.convolution.triton_gemm import box_origin, phase_view_box, tap_view_window
from opendnn.families.convolution.triton_tiles import geometry
from opendnn.families.convolution.triton_tma import (
    MIN_SLICE_BOXES,
    filter_arguments,
    pixel_boxes,
)
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.launch import Launch

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
    stride_h,
    stride_w,
    slices,
    slice_boxes,
    PROGRAMS: gl.constexpr,
):
    """Fill the ring: per box of every unit of this program, dy's chunks at the box and x's box of the
    pixels they meet at the tap, in x's phase view, through a descriptor of the unit's tap's window of
    it (``tap_view_window``: TMA's zero fill wherever dy's pixel is past dy or x's is padding)."""
    BOX: gl.constexpr = [dy_ring.shape[1], dy_ring.shape[2], dy_ring.shape[3], dy_ring.shape[4]]
    X_BOX: gl.constexpr = [x_ring.shape[1], x_ring.shape[2], 1, x_ring.shape[4], x_ring.shape[5]]
    dy_desc = tma.make_tensor_descriptor(dy_ptr, [N, OH, OW, K], [dy_sn, dy_sh, dy_sw, 1], BOX, dy_ring.layout)
    STAGES: gl.constexpr = ready.shape[0]
    K_CHUNKS: gl.constexpr = dy_ring.shape[0] // STAGES
    BLOCK_C: gl.constexpr = x_ring.shape[5]
    tiles_c = gl.cdiv(C, BLOCK_C)
    tiles = gl.cdiv(K, K_CHUNKS * CHUNK) * R * S * tiles_c
    boxes = gl.cdiv(N, BOX[0]) * gl.cdiv(OH, BOX[1]) * gl.cdiv(OW, BOX[2])
    step = 0
    for unit in range(gl.program_id(0), tiles * slices, PROGRAMS):
        tile = unit % tiles
        c0 = tile % tiles_c * BLOCK_C
        tap = tile // tiles_c % (R * S)
        k0 = tile // (tiles_c * R * S) * (K_CHUNKS * CHUNK)
        shift_h = tap // S * dil_h - pad_h  # x[stride * p + shift] meets dy[p]
        shift_w = tap % S * dil_w - pad_w
        offset, rows, columns, origin_h, origin_w = tap_view_window(
            shift_h, shift_w, stride_h, stride_w, XH, XW, OH, OW, x_sh, x_sw
        )
        # the descriptor is rewritten in place: the previous unit's loads land first (each stage's last)
        for back in gl.static_range(STAGES):
            last = step - 1 - back
            mbarrier.wait(ready.index((last + STAGES) % STAGES), last // STAGES & 1, pred=last >= 0)
        x_desc = tma.make_tensor_descriptor(
            x_ptr + offset,
            [N, rows, stride_h, columns, stride_w * C],
            [x_sn, stride_h * x_sh, x_sh, stride_w * x_sw, 1],
            X_BOX,
            x_ring.layout,
        )
        begin = unit // tiles * slice_boxes
        for box in range(begin, gl.minimum(begin + slice_boxes, boxes)):
            n0, h0, w0 = box_origin(box, N, OH, OW, BOX[0], BOX[1], BOX[2])
            stage = step % STAGES
            mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)
            filled = ready.index(stage)
            mbarrier.expect(filled, K_CHUNKS * dy_desc.block_type.nbytes + x_desc.block_type.nbytes)
            for chunk in gl.static_range(K_CHUNKS):
                tma.async_copy_global_to_shared(
                    dy_desc, [n0, h0, w0, k0 + chunk * CHUNK], filled, dy_ring.index(stage * K_CHUNKS + chunk)
                )
            x_box = phase_view_box(n0, h0 - origin_h, w0 - origin_w, c0, shift_h, shift_w, stride_h, stride_w, C)
            tma.async_copy_global_to_shared(x_desc, x_box, filled, x_ring.index(stage))
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
    IMAGES: gl.constexpr = dy_ring.shape[1]
    BLOCK_H: gl.constexpr = dy_ring.shape[2]
    BLOCK_W: gl.constexpr = dy_ring.shape[3]
    BLOCK_C: gl.constexpr = x_ring.shape[5]
    PIXELS: gl.constexpr = IMAGES * BLOCK_H * BLOCK_W
    # one chunk of output channels: both consumers own it, each reduces half of every box's pixels
    ROWS: gl.constexpr = PIXELS // 2 if K_CHUNKS == 1 else PIXELS
    FIRST_ROW: gl.constexpr = HALF * ROWS if K_CHUNKS == 1 else 0
    K_CHUNK: gl.constexpr = 0 if K_CHUNKS == 1 else HALF
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_C, 16]
    )
    tiles_c = gl.cdiv(C, BLOCK_C)
    tiles = gl.cdiv(K, K_CHUNKS * CHUNK) * R * S * tiles_c
    boxes = gl.cdiv(N, IMAGES) * gl.cdiv(OH, BLOCK_H) * gl.cdiv(OW, BLOCK_W)
    k_offsets = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, ACC_LAYOUT))
    c_offsets = gl.arange(0, BLOCK_C, layout=gl.SliceLayout(0, ACC_LAYOUT))
    step = 0
    for unit in range(gl.program_id(0), tiles * slices, PROGRAMS):
        acc = gl.zeros((CHUNK, BLOCK_C), dtype=gl.float32, layout=ACC_LAYOUT)
        begin = unit // tiles * slice_boxes
        count = gl.minimum(begin + slice_boxes, boxes) - begin
        for i in range(count):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), step // STAGES & 1)
            # dy's box as A = [k, pixels] (k contiguous), x's as B = [pixels, c]: this consumer's rows
            a = dy_ring.index(stage * K_CHUNKS + K_CHUNK).reshape([PIXELS, CHUNK]).slice(FIRST_ROW, ROWS)
            b = x_ring.index(stage).reshape([PIXELS, BLOCK_C]).slice(FIRST_ROW, ROWS)
            acc = warpgroup_mma(a.permute((1, 0)), b, acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous step's MMA is done: release its stage
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=i > 0)
            step += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=count > 0)

        tile = unit % tiles
        c = tile % tiles_c * BLOCK_C + c_offsets
        tap = tile // tiles_c % (R * S)
        k = (tile // (tiles_c * R * S) * K_CHUNKS + K_CHUNK) * CHUNK + k_offsets
        store_tap_filter(
            acc,
            k[:, None],
            c[None, :],
            tap,
            unit // tiles * 2 + HALF if K_CHUNKS == 1 else unit // tiles,  # the partial filter's index
            dw_ptr,
            partial_ptr,
            K,
            C,
            1,
            R,
            S,
            w_sk,
            w_sc,
            0,
            w_sr,
            w_ss,
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
    stride_h,
    stride_w,
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
    BLOCK_C: gl.constexpr,
    STAGES: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """``filter_tma_kernel``'s backward filter (channels-last x [N, XH, XW, C] and dy [N, OH, OW, K]
    read in boxes, dw at any strides, or the units' partial filters) on the warp-specialized engine."""
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    DY_BOX: gl.constexpr = [IMAGES, BLOCK_H, BLOCK_W, CHUNK]
    X_BOX: gl.constexpr = [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_C]  # a box of x's phase view
    dy_ring = gl.allocate_shared_memory(  # 128-byte swizzle
        dtype, [STAGES * K_CHUNKS] + DY_BOX, gl.NVMMASharedLayout.get_default_for(DY_BOX, dtype)
    )
    x_ring = gl.allocate_shared_memory(dtype, [STAGES] + X_BOX, gl.NVMMASharedLayout.get_default_for(X_BOX, dtype))
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
                    stride_h,
                    stride_w,
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

# The rates the slice count is estimated with, per SM of an H200 (132 SMs), as this engine sustains
# them on ResNet-50's layers at batch 64: its wgmma (a step of 2 x 64 x 128 x 256 MMAs, 4.2 MFLOP,
# takes 0.83 us on the 7 x 7 layer: 5.3 TFLOP/s an SM, 700 an H200), its loads from L2 (a step of
# 2.1 MFLOP and 32 KB takes 0.37 us on the 56 x 56 layer), and the partial filters' round trip, the
# consumers' stores and the sum kernel's loads (two slices of the 7 x 7 layer's 9.4 MB filter add
# 21.5 us: 1.75 TB/s).
SM_MMA_FLOPS_PER_US = 5.3e6
SM_LOAD_BYTES_PER_US = 8.8e4
PARTIAL_BYTES_PER_US = 1.75e6
HBM_BYTES_PER_US = 3.8e6  # a copy's speed: x and dy are read from HBM at least once
SUM_LAUNCH_US = 3.0  # the partials' sum kernel launched after the engine, and its tail
MIN_STAGES = 3  # a stage's loads in flight while the consumers work through two others
BOX_ROWS = 128  # most pixels a box holds
MIN_BOX_ROWS = 64  # fewest: a step's barriers and MMA issue cost the time of loading some rows


@dataclasses.dataclass(frozen=True)
class FilterSplit:
    """How the backward filter runs on the engine: the pixel box, the tile (chunks of 64 output
    channels, input channels), the ring, the pixel slices and the partial filters they leave (0: the
    units write dw themselves)."""

    box: tuple[int, int, int]
    k_chunks: int
    block_c: int
    stages: int
    slices: int
    slice_boxes: int
    units: int

    @property
    def partials(self) -> int:
        """Partial filters the units leave: one a slice, two with one chunk of output channels (each
        consumer's half of the pixels); 0 where a lone slice writes dw itself."""
        partials = self.slices * (2 if self.k_chunks == 1 else 1)
        return partials if partials > 1 else 0


def filter_box(n: int, size: tuple[int, int], rows: int, multiple: int) -> tuple[int, int, int]:
    """The (IMAGES, BLOCK_H, BLOCK_W) box of powers of two (shared memory's shapes) of MIN_BOX_ROWS to
    ``rows`` pixels, a multiple of ``multiple`` (whole 16-deep MMA steps), that covers n images of
    ``size`` with the fewest pixels, padding included (ties: the biggest box, then the widest rows of
    pixels contiguous in memory)."""
    sides = [2**k for k in range(rows.bit_length())]
    candidates = [
        (images, block_h, block_w)
        for images in sides
        for block_h in sides
        for block_w in sides
        if MIN_BOX_ROWS <= images * block_h * block_w <= rows and images * block_h * block_w % multiple == 0
    ]

    def covered(box: tuple[int, int, int]) -> tuple[int, int, int, int]:
        return pixel_boxes(n, (1, *size), box) * math.prod(box), -math.prod(box), -box[2], -box[1]

    return min(candidates, key=covered)


def filter_candidates(problem: ConvolutionProblem) -> list[tuple[float, FilterSplit]]:
    """Every tile and slice count the engine could take for ``problem``, with its estimated time in
    microseconds (module docstring, "The plan")."""
    geo = geometry(problem)
    k_chunks = 2 if geo.k > CHUNK.value else 1
    halves = 2 if k_chunks == 1 else 1  # consumers sharing a box's pixels
    partial_bytes = geo.k * geo.c * geo.taps * 4
    reads_us = (problem.x.numel + problem.y.numel) * problem.x.dtype.itemsize / HBM_BYTES_PER_US
    sms = programs_to_fill(1)
    candidates = []
    for block_c in (64, 128, 256):
        if block_c > 64 and block_c >= 2 * geo.c:
            continue  # no wider than the channels need
        row_bytes = (k_chunks * CHUNK.value + block_c) * 2  # a pixel's channels in a stage
        rows = min(BOX_ROWS, (SHARED_MEMORY - 1024) // (MIN_STAGES * row_bytes))  # 1 KB for the barriers
        box = filter_box(geo.n, geo.y_size[1:], rows, 16 * halves)
        pixels = math.prod(box)
        boxes = pixel_boxes(geo.n, geo.y_size, box)
        stages = min(MAX_STAGES, (SHARED_MEMORY - 1024) // (pixels * row_bytes))
        tiles = triton.cdiv(geo.k, k_chunks * CHUNK.value) * geo.taps * triton.cdiv(geo.c, block_c)
        step_us = max(  # both consumers' MMAs on one box, or its loads
            2 * pixels * k_chunks * CHUNK.value * block_c / SM_MMA_FLOPS_PER_US,
            pixels * row_bytes / SM_LOAD_BYTES_PER_US,
        )
        for per_slice in sorted(
            {triton.cdiv(boxes, slices) for slices in range(1, boxes // MIN_SLICE_BOXES + 1)} | {boxes}
        ):
            slices = triton.cdiv(boxes, per_slice)
            split = FilterSplit(box, k_chunks, block_c, stages, slices, per_slice, tiles * slices)
            estimate = max(triton.cdiv(tiles * slices, sms) * per_slice * step_us, reads_us)
            if split.partials:
                estimate += SUM_LAUNCH_US + 2 * split.partials * partial_bytes / PARTIAL_BYTES_PER_US
            candidates.append((estimate, split))
    return candidates


def filter_split(problem: ConvolutionProblem) -> FilterSplit:
    """The candidate (``filter_candidates``) whose estimated time is least (ties: fewer partial
    filters, then the wider tile)."""
    return min(filter_candidates(problem), key=lambda c: (round(c[0], 1), c[1].partials, -c[1].block_c))[1]


def filter_warp_specialized_launch(problem: ConvolutionProblem) -> Launch:
    """The launch of ``filter_warp_specialized_kernel``: one program per SM (fewer for fewer units)."""
    split = filter_split(problem)
    programs = min(split.units, programs_to_fill(1))
    args = (
        *filter_arguments(problem, split.partials > 0),
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
            IMAGES=split.box[0],
            BLOCK_H=split.box[1],
            BLOCK_W=split.box[2],
            K_CHUNKS=split.k_chunks,
            BLOCK_C=split.block_c,
            STAGES=split.stages,
            PROGRAMS=programs,
            num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
        ),
    )
