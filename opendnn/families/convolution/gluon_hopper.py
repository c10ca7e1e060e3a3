"""Convolutions on Hopper (sm_90): a persistent, warp-specialized implicit-GEMM engine in Gluon.

The problems are the TMA route's (``triton_tma.tma_blocks``) in 16-bit types and in float32 as TF32,
forward (stride 1, or strides x's phase view reads) and backward data: ``2 * pixels * outputs *
reduced * taps`` FLOPs over the activations read once from HBM (then once a tap from L2, one box per
tap), the filter and the output. A launch computes one output phase (``triton_tma.output_phases``):
a forward's y, or the pixels of dx one stride apart that a backward data's phase sums from its own
taps (stride 1: all of dx, every tap). The GEMM view is ``conv_tma_kernel``'s: a tile's 128 rows are
an IMAGES x BLOCK_H x BLOCK_W box of the phase's output pixels, its reduction runs over (tap,
128-byte chunk of channels) of the phase's taps (``triton_gemm.tap_step``), and per step the A
operand is the box of the activations' phase view [N, AH / view_stride_h, view_stride_h, AW /
view_stride_w, view_stride_w * C] (the forward's strides; 1 for dy) that holds the input pixels the
tile's output pixels read for the tap (``triton_gemm.phase_view_box``; at stride 1, the box at the
tile's origin moved by the tap's shift), TMA's zero fill of coordinates outside the view, negative
ones included, being the padding; B is the filter read as the matrix [K, R*S*C]. A phase without
taps (a 1x1 stride-2 layer's odd rows or columns) runs no step: its consumers write alpha * 0 (+
beta * dx).

One program per SM walks the units ``pid, pid + PROGRAMS, ...``: a unit is a tile (pixel boxes x
output-channel tiles, in grouped order: ``triton_gemm.grouped_tile``) and one slice of its steps, the
slice count 1 unless a forward's few tiles split their reduction (``triton_tma.reduction_slices``:
each slice then stores its float32 partial sums, ``slice_elements`` apart, and
``triton_gemm.slice_sum_kernel`` finishes them). Each program is three partitions of warps that talk
only through shared memory and mbarriers:

- **producer** (``tma_producer``, 1 warp, PRODUCER_REGISTERS registers a thread): for every step of
  every tile of the program, waits until a stage of the ring is empty, then has TMA copy into it the
  activations' box [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_K] of the tap in the phase view and the
  filter's box: forward [BLOCK_N, 1, BLOCK_K] at (k0, tap, c0) of the filter read per tap [K, R*S, C]
  (B transposed, K-major), backward data [BLOCK_K, BLOCK_N] at (k0, tap * C + c0) of the matrix
  [K, R*S*C], dy's channels its rows (B as stored); a partial last chunk of channels
  (``triton_tma.tma_block_k``) reads zeros past them in both boxes. Both
  signalling the stage's ``ready`` barrier with their byte count. It builds both descriptors on the
  device at its start (the tensormap proxy's release and acquire in one thread).
- **two consumers** (``mma_consumer``, one warpgroup each, CONSUMER_REGISTERS registers a thread; the
  first is the kernel's own 4 warps): consumer h owns rows ``64 h .. 64 h + 63`` of the tile, a
  64 x BLOCK_N float32 accumulator. Per step it waits for ``ready``, issues an asynchronous
  ``warpgroup_mma`` on its 64 rows of the box and all of B, both read from shared memory, waits until
  one MMA group is left in flight and releases the previous step's stage on ``empty``. After the
  tile's last step it finishes its rows in parts of at most 128 channels (``finish_part``): each
  converted to a blocked layout of 8 consecutive channels a thread, then ``triton_gemm.epilogue``, the
  epilogue of every convolution kernel (alpha, residual z with alpha2, bias, activation with its NaN
  rule, beta * y), stored at the output pixels' strides and masked where the box runs past N, H or W.
  Meanwhile the producer already fills the ring with the next tile's steps.

**The box as an MMA operand.** Shared memory holds a box as rows of BLOCK_K channels (a chunk: 128
bytes, 64 16-bit or 32 float32 channels, or 32 or 64 bytes where fewer channels are reduced), one
row per pixel in (image, row, phase, column) order (one phase a box), swizzled by the row's bytes:
each row's 16-byte pieces permuted by the row's index within every group of 8 rows (1024 bytes
with 128-byte rows). The layout is a function of the flat row index alone, that of the [128, BLOCK_K]
operand wgmma reads. So ``reshape([128, BLOCK_K])`` of the shared memory descriptor is exact, and
``slice`` of 64 rows (whole swizzle groups) is consumer h's half. Boxes stay at least 8 pixels
wide (``TMA_MIN_W``), so a row of the box is whole swizzle groups as well. A never passes through
registers: no ``local_load``, no layout conversion, no wgmma with an operand in registers.

**Ring and barriers.** As the matrix engine's (``matmul/gluon_hopper.py``): ``ready[s]`` counts the
producer's ``expect`` plus the stage's bytes, ``empty[s]`` one arrival per consumer warpgroup once its
MMAs on the stage are complete; step ``i`` of a partition uses stage ``i % STAGES`` in phase
``(i // STAGES) & 1``, the producer waiting on ``empty`` with the phase flipped.

**Registers.** 12 warps; ``setmaxnreg`` leaves the producer 24 registers a thread and gives each
consumer 240 (a 64 x 256 accumulator is 128 of them).

**Shared memory.** A stage is the box (128 rows of a chunk: 16 KB with 128-byte chunks) and the
filter's tile (BLOCK_N rows of a chunk: 8, 16 or 32 KB); the epilogue's layout conversion takes up
to 8 KB a consumer. Of sm_90's 227 KB a block, the stages that fit beside the epilogue (``stages``):
8 for BLOCK_N = 64, 6 for 128, 4 for 256 with 128-byte chunks, in either type.

**TF32.** wgmma takes TF32 operands only K-major (the reduced dim contiguous in shared memory) and 8
deep an instruction (16 for 16-bit types: 32 bytes either way, ``INSTR_K``). The box is K-major as it
lands (channels contiguous), and so is the filter's [BLOCK_N, 1, 32] box, read B transposed: the
forward's KRSC filter, or backward data's filter repacked [C, R, S, K] in the workspace, over which
backward data runs as a forward (``triton_tma.packs_filter``; BACKWARD is then False). A stage holds
half the channels of a 16-bit one, so a tile takes twice the steps of half the MMAs each. The tensor
cores truncate the float32 bits to TF32; the copies the route stages are rounded to nearest on the
way (``triton_tma.staging_kernel``).

**Tiles.** BLOCK_N is 64, 128 or 256 output channels, the one whose tiles the design expects to
finish soonest on the GPU's SMs: fewest rounds of tiles times the rows a step loads (128 + BLOCK_N),
ties to the widest (``block_n``). A narrow tile reloads the same boxes for more tiles; a wide one
can leave SMs idle in the last round.

**Arguments.** The kernel takes ``conv_tma_kernel``'s arguments (``triton_tma.tma_arguments``). The
partitions take every scalar as an argument of its own, in tuples written out where
``warp_specialize`` is called (a tuple assigned in a Gluon kernel turns its constexprs, a unit stride
Triton specialized, into runtime values; see ``matmul/gluon_hopper.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from opendnn.families.convolution.problem import ConvolutionProblem
from opendnn.families.convolution.triton_gemm import box_origin, epilogue, grouped_tile, phase_view_box, tap_step
from opendnn.families.convolution.triton_tma import (
    TMA_BLOCK_M,
    phase_launches,
    reduction_slices,
    tma_arguments,
)
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.launch import Launch

CONSUMER_REGISTERS = gl.constexpr(240)
PRODUCER_REGISTERS = gl.constexpr(24)
EPILOGUE_COLUMNS = gl.constexpr(128)  # output channels a consumer finishes at a time


@gluon.jit
def tma_producer(
    a_ptr,
    w_ptr,
    a_ring,
    w_ring,
    ready,
    empty,
    N,
    AH,
    AW,
    RED,
    OH,
    OW,
    OUTC,
    R,
    S,
    a_sn,
    a_sh,
    a_sw,
    w_sk,
    view_stride_h,
    view_stride_w,
    taps_h,
    taps_w,
    shift_h,
    shift_w,
    shift_step_h,
    shift_step_w,
    filter_row,
    filter_column,
    filter_row_step,
    filter_column_step,
    total,
    slice_steps,
    BACKWARD: gl.constexpr,
    GROUP_M: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """Fill the ring: per (tap, chunk) step of every unit of this program (a tile and a slice of
    its steps), the activations' box of the tap in their phase view and the filter's box."""
    STAGES: gl.constexpr = w_ring.shape[0]
    IMAGES: gl.constexpr = a_ring.shape[1]
    BLOCK_H: gl.constexpr = a_ring.shape[2]
    BLOCK_W: gl.constexpr = a_ring.shape[4]
    BLOCK_K: gl.constexpr = a_ring.shape[5]
    BLOCK_N: gl.constexpr = w_ring.shape[2] if BACKWARD else w_ring.shape[1]
    a_box: gl.constexpr = [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_K]
    a_desc = tma.make_tensor_descriptor(
        a_ptr,
        [N, AH // view_stride_h, view_stride_h, AW // view_stride_w, view_stride_w * RED],
        [a_sn, view_stride_h * a_sh, a_sh, view_stride_w * a_sw, 1],
        a_box,
        a_ring.layout,
    )
    if BACKWARD:  # dy's channels are the filter's rows: [K, R*S*C]
        w_desc = tma.make_tensor_descriptor(w_ptr, [RED, R * S * OUTC], [w_sk, 1], [BLOCK_K, BLOCK_N], w_ring.layout)
    else:  # per tap, [K, R*S, C]: a partial last chunk reads zeros, not the next tap's channels
        w_desc = tma.make_tensor_descriptor(
            w_ptr, [OUTC, R * S, RED], [w_sk, RED, 1], [BLOCK_N, 1, BLOCK_K], w_ring.layout
        )
    tiles_m = gl.cdiv(N, IMAGES) * gl.cdiv(OH, BLOCK_H) * gl.cdiv(OW, BLOCK_W)
    tiles_n = gl.cdiv(OUTC, BLOCK_N)
    chunks = gl.cdiv(RED, BLOCK_K)
    steps = taps_h * taps_w * chunks
    step = 0
    for unit in range(gl.program_id(0), total * gl.maximum(1, gl.cdiv(steps, slice_steps)), PROGRAMS):
        tile_m, tile_n = grouped_tile(unit % total, tiles_m, tiles_n, GROUP_M)
        n0, h0, w0 = box_origin(tile_m, N, OH, OW, IMAGES, BLOCK_H, BLOCK_W)
        col0 = tile_n * BLOCK_N
        first = unit // total * slice_steps
        for j in range(first, gl.minimum(first + slice_steps, steps)):
            tap_h, tap_w, w_tap, c0 = tap_step(
                j,
                chunks,
                taps_w,
                S,
                shift_h,
                shift_w,
                shift_step_h,
                shift_step_w,
                filter_row,
                filter_column,
                filter_row_step,
                filter_column_step,
                BLOCK_K,
            )
            stage = step % STAGES
            mbarrier.wait(empty.index(stage), (step // STAGES & 1) ^ 1)
            filled = ready.index(stage)
            mbarrier.expect(filled, a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            box = phase_view_box(n0, h0, w0, c0, tap_h, tap_w, view_stride_h, view_stride_w, RED)
            a_coordinates = [box[0], box[1], box[2], box[3], box[4]]
            tma.async_copy_global_to_shared(a_desc, a_coordinates, filled, a_ring.index(stage))
            if BACKWARD:
                tma.async_copy_global_to_shared(w_desc, [c0, w_tap * OUTC + col0], filled, w_ring.index(stage))
            else:
                tma.async_copy_global_to_shared(w_desc, [col0, w_tap, c0], filled, w_ring.index(stage))
            step += 1


@gluon.jit
def finish_part(
    acc,
    col0,
    out_rows,
    z_rows,
    pixel_valid,
    out_ptr,
    bias_ptr,
    z_ptr,
    OUTC,
    o_sc,
    z_sc,
    bias_sc,
    alpha,
    beta,
    alpha2,
    coef,
    HAS_BETA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_Z: gl.constexpr,
    ACTIVATION: gl.constexpr,
    PROPAGATE_NAN: gl.constexpr,
):
    """The epilogue of output channels ``col0 ..`` of a consumer's rows (``out_rows``, ``z_rows``: the
    pixels' element offsets in the output and in z), then their masked store."""
    COLUMNS: gl.constexpr = acc.shape[1]
    # a thread's 8 consecutive channels (16-byte loads and stores of 16-bit channels-last tensors)
    LAYOUT: gl.constexpr = gl.BlockedLayout([1, 8], [256 // COLUMNS, COLUMNS // 8], [4, 1], [1, 0])
    channels = col0 + gl.arange(0, COLUMNS, layout=gl.SliceLayout(0, LAYOUT))
    rows_valid = gl.convert_layout(pixel_valid, gl.SliceLayout(1, LAYOUT))
    mask = rows_valid[:, None] & (channels < OUTC)[None, :]
    out_offsets = gl.convert_layout(out_rows, gl.SliceLayout(1, LAYOUT))[:, None] + channels[None, :] * o_sc
    z_offsets = gl.convert_layout(z_rows, gl.SliceLayout(1, LAYOUT))[:, None] + channels[None, :] * z_sc
    epilogue(
        gl.convert_layout(acc, LAYOUT),
        out_ptr,
        out_offsets,
        mask,
        bias_ptr,
        channels[None, :] * bias_sc,
        z_ptr,
        z_offsets,
        alpha,
        beta,
        alpha2,
        coef,
        HAS_BETA,
        HAS_BIAS,
        HAS_Z,
        ACTIVATION,
        PROPAGATE_NAN,
        gl.float32,
    )


@gluon.jit
def mma_consumer(
    a_ring,
    w_ring,
    ready,
    empty,
    out_ptr,
    bias_ptr,
    z_ptr,
    N,
    RED,
    OH,
    OW,
    OUTC,
    taps_h,
    taps_w,
    o_sn,
    o_sc,
    o_sh,
    o_sw,
    o_base,
    z_sn,
    z_sc,
    z_sh,
    z_sw,
    bias_sc,
    alpha,
    beta,
    alpha2,
    coef,
    total,
    slice_steps,
    slice_elements,
    HALF: gl.constexpr,
    BACKWARD: gl.constexpr,
    HAS_BETA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_Z: gl.constexpr,
    ACTIVATION: gl.constexpr,
    PROPAGATE_NAN: gl.constexpr,
    GROUP_M: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """Rows ``HALF * 64`` on of every unit of this program (a tile and a slice of its steps): the
    MMAs, then the epilogue (a slice's partial sums: the plain store of one slice of them)."""
    STAGES: gl.constexpr = w_ring.shape[0]
    IMAGES: gl.constexpr = a_ring.shape[1]
    BLOCK_H: gl.constexpr = a_ring.shape[2]
    BLOCK_W: gl.constexpr = a_ring.shape[4]
    BLOCK_K: gl.constexpr = a_ring.shape[5]
    BLOCK_M: gl.constexpr = IMAGES * BLOCK_H * BLOCK_W
    HALF_M: gl.constexpr = BLOCK_M // 2
    BLOCK_N: gl.constexpr = w_ring.shape[2] if BACKWARD else w_ring.shape[1]
    INSTR_K: gl.constexpr = 256 // a_ring.dtype.primitive_bitwidth  # 32 bytes: 16 16-bit or 8 TF32 elements
    ACC_LAYOUT: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, INSTR_K]
    )
    tiles_m = gl.cdiv(N, IMAGES) * gl.cdiv(OH, BLOCK_H) * gl.cdiv(OW, BLOCK_W)
    tiles_n = gl.cdiv(OUTC, BLOCK_N)
    k_steps = taps_h * taps_w * gl.cdiv(RED, BLOCK_K)  # none for a phase without taps: alpha * 0 (+ beta * out)
    rows = HALF * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, ACC_LAYOUT))
    step = 0
    for unit in range(gl.program_id(0), total * gl.maximum(1, gl.cdiv(k_steps, slice_steps)), PROGRAMS):
        first = unit // total * slice_steps
        unit_steps = gl.minimum(first + slice_steps, k_steps) - first
        acc = gl.zeros((HALF_M, BLOCK_N), dtype=gl.float32, layout=ACC_LAYOUT)
        for k_step in range(unit_steps):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), step // STAGES & 1)
            # the box as the [128, BLOCK_K] operand (module docstring): this consumer's 64 rows of it
            a = a_ring.index(stage).reshape([BLOCK_M, BLOCK_K]).slice(HALF * HALF_M, HALF_M)
            w = w_ring.index(stage)
            if not BACKWARD:  # the filter's [BLOCK_N, 1, BLOCK_K] box is B transposed
                w = w.reshape([BLOCK_N, BLOCK_K]).permute((1, 0))
            acc = warpgroup_mma(a, w, acc, is_async=True)  # float32 as TF32 (the default input precision)
            acc = warpgroup_mma_wait(1, deps=(acc,))  # the previous step's MMA is done: release its stage
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k_step > 0)
            step += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=unit_steps > 0)

        tile_m, tile_n = grouped_tile(unit % total, tiles_m, tiles_n, GROUP_M)
        n0, h0, w0 = box_origin(tile_m, N, OH, OW, IMAGES, BLOCK_H, BLOCK_W)
        n = n0 + rows // (BLOCK_H * BLOCK_W)
        o_h = h0 + rows // BLOCK_W % BLOCK_H
        o_w = w0 + rows % BLOCK_W
        pixel_valid = (n < N) & (o_h < OH) & (o_w < OW)
        out_rows = o_base + (unit // total).to(gl.int64) * slice_elements + n.to(gl.int64) * o_sn
        out_rows += o_h * o_sh + o_w * o_sw
        z_rows = n.to(gl.int64) * z_sn + o_h * z_sh + o_w * z_sw
        col0 = tile_n * BLOCK_N
        if BLOCK_N > EPILOGUE_COLUMNS:  # two parts of 128 channels: half the registers of a conversion
            parts = gl.split(acc.reshape([HALF_M, 2, EPILOGUE_COLUMNS]).permute((0, 2, 1)))
            for part in gl.static_range(2):
                finish_part(
                    parts[part],
                    col0 + part * EPILOGUE_COLUMNS,
                    out_rows,
                    z_rows,
                    pixel_valid,
                    out_ptr,
                    bias_ptr,
                    z_ptr,
                    OUTC,
                    o_sc,
                    z_sc,
                    bias_sc,
                    alpha,
                    beta,
                    alpha2,
                    coef,
                    HAS_BETA,
                    HAS_BIAS,
                    HAS_Z,
                    ACTIVATION,
                    PROPAGATE_NAN,
                )
        else:
            finish_part(
                acc,
                col0,
                out_rows,
                z_rows,
                pixel_valid,
                out_ptr,
                bias_ptr,
                z_ptr,
                OUTC,
                o_sc,
                z_sc,
                bias_sc,
                alpha,
                beta,
                alpha2,
                coef,
                HAS_BETA,
                HAS_BIAS,
                HAS_Z,
                ACTIVATION,
                PROPAGATE_NAN,
            )


@gluon.jit
def conv_warp_specialized_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    N,
    AH,
    AW,
    RED,
    OH,
    OW,
    OUTC,
    R,
    S,
    a_sn,
    a_sh,
    a_sw,
    w_sk,
    o_sn,
    o_sc,
    o_sh,
    o_sw,
    o_base,
    z_sn,
    z_sc,
    z_sh,
    z_sw,
    bias_sc,
    view_stride_h,
    view_stride_w,
    taps_h,
    taps_w,
    shift_h,
    shift_w,
    shift_step_h,
    shift_step_w,
    filter_row,
    filter_column,
    filter_row_step,
    filter_column_step,
    slice_steps,
    slice_elements,
    OD,
    T,
    LAYERS,
    layer_stride,
    o_sd,
    z_sd,
    taps_d,
    shift_d,
    shift_step_d,
    filter_depth,
    filter_depth_step,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: gl.constexpr,
    HAS_BETA: gl.constexpr,
    HAS_BIAS: gl.constexpr,
    HAS_Z: gl.constexpr,
    ACTIVATION: gl.constexpr,
    PROPAGATE_NAN: gl.constexpr,
    IMAGES: gl.constexpr,
    BLOCK_H: gl.constexpr,
    BLOCK_W: gl.constexpr,
    BLOCK_N: gl.constexpr,
    BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr,
    STAGES: gl.constexpr,
    PROGRAMS: gl.constexpr,
):
    """``conv_tma_kernel``'s convolution (same arguments: channels-last A [N, AH, AW, RED] read in
    boxes, the KRSC filter as the matrix [K, R*S*C], the output at any strides) on the warp-specialized
    engine, for 2-D problems (``engine_reads_boxes``): the 3-D arguments from OD to filter_depth_step
    hold one frame and one tap in depth, and it reads none of them."""
    dtype: gl.constexpr = a_ptr.dtype.element_ty
    A_BOX: gl.constexpr = [IMAGES, BLOCK_H, 1, BLOCK_W, BLOCK_K]  # a box of the phase view
    W_BOX: gl.constexpr = [BLOCK_K, BLOCK_N] if BACKWARD else [BLOCK_N, 1, BLOCK_K]
    A_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(A_BOX, dtype)  # swizzled by the chunk's bytes
    W_LAYOUT: gl.constexpr = gl.NVMMASharedLayout.get_default_for(W_BOX, dtype)
    a_ring = gl.allocate_shared_memory(dtype, [STAGES] + A_BOX, A_LAYOUT)
    w_ring = gl.allocate_shared_memory(dtype, [STAGES] + W_BOX, W_LAYOUT)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for stage in gl.static_range(STAGES):
        mbarrier.init(ready.index(stage), count=1)
        mbarrier.init(empty.index(stage), count=2)  # one arrival per consumer warpgroup
    total = gl.cdiv(N, IMAGES) * gl.cdiv(OH, BLOCK_H) * gl.cdiv(OW, BLOCK_W) * gl.cdiv(OUTC, BLOCK_N)
    # The consumers' argument tuples differ only in HALF, and are written out twice: a tuple built once
    # and assigned would lose its constexprs (module docstring, "Arguments").
    gl.warp_specialize(  # the first partition runs in the kernel's own 4 warps
        [
            (
                mma_consumer,
                (
                    a_ring,
                    w_ring,
                    ready,
                    empty,
                    out_ptr,
                    bias_ptr,
                    z_ptr,
                    N,
                    RED,
                    OH,
                    OW,
                    OUTC,
                    taps_h,
                    taps_w,
                    o_sn,
                    o_sc,
                    o_sh,
                    o_sw,
                    o_base,
                    z_sn,
                    z_sc,
                    z_sh,
                    z_sw,
                    bias_sc,
                    alpha,
                    beta,
                    alpha2,
                    coef,
                    total,
                    slice_steps,
                    slice_elements,
                    0,
                    BACKWARD,
                    HAS_BETA,
                    HAS_BIAS,
                    HAS_Z,
                    gl.constexpr(ACTIVATION),  # a str in a tuple must stay a constexpr
                    PROPAGATE_NAN,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
            (
                mma_consumer,
                (
                    a_ring,
                    w_ring,
                    ready,
                    empty,
                    out_ptr,
                    bias_ptr,
                    z_ptr,
                    N,
                    RED,
                    OH,
                    OW,
                    OUTC,
                    taps_h,
                    taps_w,
                    o_sn,
                    o_sc,
                    o_sh,
                    o_sw,
                    o_base,
                    z_sn,
                    z_sc,
                    z_sh,
                    z_sw,
                    bias_sc,
                    alpha,
                    beta,
                    alpha2,
                    coef,
                    total,
                    slice_steps,
                    slice_elements,
                    1,
                    BACKWARD,
                    HAS_BETA,
                    HAS_BIAS,
                    HAS_Z,
                    gl.constexpr(ACTIVATION),  # a str in a tuple must stay a constexpr
                    PROPAGATE_NAN,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
            (
                tma_producer,
                (
                    a_ptr,
                    w_ptr,
                    a_ring,
                    w_ring,
                    ready,
                    empty,
                    N,
                    AH,
                    AW,
                    RED,
                    OH,
                    OW,
                    OUTC,
                    R,
                    S,
                    a_sn,
                    a_sh,
                    a_sw,
                    w_sk,
                    view_stride_h,
                    view_stride_w,
                    taps_h,
                    taps_w,
                    shift_h,
                    shift_w,
                    shift_step_h,
                    shift_step_w,
                    filter_row,
                    filter_column,
                    filter_row_step,
                    filter_column_step,
                    total,
                    slice_steps,
                    BACKWARD,
                    GROUP_M,
                    PROGRAMS,
                ),
            ),
        ],
        [4, 1],
        [CONSUMER_REGISTERS, PRODUCER_REGISTERS],
    )


# ---- launcher ------------------------------------------------------------------------------------

SHARED_MEMORY = 227 * 1024  # what one block may use on sm_90
EPILOGUE_SHARED_MEMORY = 2 * 8 * 1024  # the two consumers' layout conversions
MAX_STAGES = 8  # more than a 3x3 layer of 64 channels has steps (9) buys nothing


def stages(block_n: int, chunk_bytes: int) -> int:
    """The ring's stages that fit in shared memory beside the epilogue: a stage holds one chunk of
    channels a row (``chunk_bytes``), so 8, 6, 4 for BLOCK_N 64, 128, 256 with 128-byte chunks (64
    16-bit or 32 float32 channels), 8 with narrower ones."""
    stage_bytes = (TMA_BLOCK_M + block_n) * chunk_bytes
    return min(MAX_STAGES, (SHARED_MEMORY - EPILOGUE_SHARED_MEMORY) // stage_bytes)


def block_n(boxes: int, outputs: int, sms: int) -> int:
    """The output-channel tile whose tiles finish soonest, no wider than the channels need: fewest
    rounds of ``sms`` tiles times the rows a tile's step loads (the 128-pixel box and BLOCK_N filter
    rows, which its MMAs' time grows with too), ties to the widest."""
    widths = [width for width in (64, 128, 256) if width == 64 or width < 2 * outputs]
    return min(
        widths,
        key=lambda width: (triton.cdiv(boxes * triton.cdiv(outputs, width), sms) * (TMA_BLOCK_M + width), -width),
    )


def warp_specialized_launches(problem: ConvolutionProblem) -> list[Launch]:
    """The launches of ``conv_warp_specialized_kernel``, one per output phase (``phase_launches``): one
    program per SM (fewer for fewer tiles)."""
    sms = programs_to_fill(1)

    def launch(phase: tuple[int, int], size: tuple[int, int, int]) -> Launch:
        args, options, boxes, outputs = tma_arguments(problem, phase, size)
        width = block_n(boxes, outputs, sms)
        programs = max(1, min(boxes * triton.cdiv(outputs, width) * reduction_slices(problem)[0], sms))
        options.update(
            BLOCK_N=width,
            STAGES=stages(width, options["BLOCK_K"] * problem.x.dtype.itemsize),
            PROGRAMS=programs,
            num_warps=4,  # the first consumer's; the other partitions add 8 (4 + 1, padded)
        )
        return Launch(conv_warp_specialized_kernel, (programs,), args, options)

    return phase_launches(problem, launch)
