"""The backward filter over pixel-major rasters of x and dy: TF32, and 16-bit problems the TMA route
cannot box (3-D, strides its phase view cannot read).

wgmma takes TF32 operands only K-major, the reduced dim contiguous in shared memory. A backward
filter reduces over pixels, and channels-last boxes hold the pixels outermost (NCHW planes hold them
innermost, but their rows are not 16-byte multiples where TMA would box them, and a tap's shift
wraps across rows). So this route copies x and dy (float32 rounded to TF32 to nearest,
``round_to_tf32``) into rasters whose pixels are innermost and whose rows share one pitch:

- dy's raster: per image and output channel, its depth slices of ``rows`` rows of ``pitch`` pixels:
  the OH x OW output pixels, zeros past OW and OH (the last slice ends at row OH);
- x's raster: per image, input channel and phase of the stride that a tap reads (``_phases``), the
  pixels of x at that phase, depth slices of the same rows and pitch, zero where the padding is.

Output pixel q = (od * rows + oh) * pitch + ow meets tap (t, r, s) in x's raster of phase
((t * dil_d) % stride_d, (r * dil_h) % stride_h, (s * dil_w) % stride_w) at q + shift, shift =
((t * dil_d // stride_d) * rows + r * dil_h // stride_h) * pitch + s * dil_w // stride_w: one offset a
tap. So every tap's product is a GEMM over contiguous runs of pixels,

    dw[k, c, tap] = sum over n, q of dy_raster[n, k, q] * x_raster[n, c, phase(tap), q + shift(tap)],

whose boxes of 128 bytes of pixels land K-major for both operands. The zero columns and rows of dy's
raster meet x's pixels past a row's or a slice's end (the wrap), which the kernel loads as zeros, so
they add nothing even where x is infinite; boxes past an image's plane are TMA's zero fill.

**Tiles and slices.** A program computes a BLOCK_K x BLOCK_C tile of one tap over one slice of the
(image, pixel box) steps; slices leave float32 partial filters that ``filter_sum_kernel`` adds in
slice order (bitwise repeatable), a lone slice writes dw itself. The plan (``raster_plan``) takes the
tile and slice count whose estimated time is least: the rounds of programs over the SMs (as many
together on an SM as its shared memory and registers hold) times a slice's steps times the SM's time
for a step of each program it holds (their MMAs, their loads, or one step's latency, whichever is
longest), plus the partials' round trip and the sum kernel.

**Memory.** The rasters hold about x and dy (more by the pitch's padding columns); the route applies
where they take no more than an explicit GEMM's column matrix, the bound every default algorithm
keeps (3x3 and larger filters; not 1x1 layers, whose columns are x itself).

**In place.** A 1x1 filter at stride 1 without padding over tensors whose images hold their pixels
contiguous (NCHW, NCDHW) needs no copy: x and dy are their own rasters (the pitch a row, no phase,
output pixel q meets x's pixel q), so the kernel reads them where they lie, at their own image and
channel strides, and takes no workspace but its partial filters (``reads_in_place``). dy's box comes
by TMA where its strides are multiples of 16 bytes, else through pointers (a 7 x 7 float32 plane is
196 bytes). Its TF32 operands are truncated by the tensor cores, as on every route that reads
float32 where it lies: rounding them in registers takes them off the path from TMA to the tensor
cores (the ResNet-50 1024 -> 256 1x1 layer at 14 x 14, batch 64: 329 us rounded, 73 truncated).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import triton
import triton.language as tl

from opendnn.families.convolution.gluon_filter import PARTIAL_BYTES_PER_US, SM_LOAD_BYTES_PER_US, SUM_LAUNCH_US
from opendnn.families.convolution.problem import ConvolutionMethod, ConvolutionProblem, method_of
from opendnn.families.convolution.triton_direct import store_tap_filter
from opendnn.families.convolution.triton_gemm import round_to_tf32
from opendnn.families.convolution.triton_matrix import pixels_contiguous, pixelwise
from opendnn.families.convolution.triton_tiles import (
    BACKWARD_FILTER,
    dot_precision,
    geometry,
    im2col_elements,
    itemsize_of,
    strides5,
    tf32,
)
from opendnn.families.convolution.triton_tma import tma_blocks
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.launch import Launch, Slot

BOX_BYTES = 128  # bytes of pixels a box: one swizzle row (32 float32 pixels, 64 16-bit ones)
PLANE_BYTES = 16  # a plane a multiple of 16 bytes: TMA's stride alignment
MIN_CHANNELS = 64  # fewer input or output channels leave a step's loads far longer than its MMAs
STAGES = 3  # a stage's loads in flight while the MMAs work through another (4 fit fewer programs an SM)
MIN_SLICE_STEPS = 8  # steps a slice takes at least: fewer leave the pipeline's fill uncovered
# What a program of this kernel sustains on an H200 SM, fitted to ResNet-50's 3x3 layers (NHWC, batch
# 64; docs/design/convolution.md, "TF32 backward filter over rasters"): the MMAs of a step at 1.2 TF32
# TFLOP/s an SM (tl.dot's wgmma behind pointer-loaded x tiles; half the tensor cores' peak; 16-bit
# operands twice that, the tensor cores' ratio), and at least 0.9 us a step however small, the latency
# of its loads, which programs sharing an SM overlap.
SM_TF32_FLOPS_PER_US = 1.2e6
STEP_LATENCY_US = 0.9
SM_SHARED_BYTES = 228 * 1024
SM_REGISTERS = 65536
REGISTERS_BESIDE_ACCUMULATOR = 64  # a thread's pointers, masks and pipeline state (ptxas: 96 at 64 x 64)
STAGING_PIXELS, STAGING_CHANNELS, STAGING_WARPS = 128, 32, 4


@dataclasses.dataclass(frozen=True)
class RasterShape:
    """The rasters' geometry: pixels a row, rows a depth slice, x's depth slices, dy's pixels (OD
    slices, the last OH rows), pixels a plane of each (padded to TMA's alignment), x's phases per dim
    (depth, height, width); ``in_place``: x and dy are their own rasters (``reads_in_place``), whose
    planes are the images' pixels; ``dy_tma``: dy's boxes come by TMA (its strides are multiples of
    16 bytes), else through pointers."""

    pitch: int
    rows: int
    x_depth: int
    dy_pixels: int
    x_plane: int
    dy_plane: int
    phases: tuple[int, int, int]
    in_place: bool
    dy_tma: bool

    @property
    def x_pixels(self) -> int:
        return self.x_depth * self.rows * self.pitch


@dataclasses.dataclass(frozen=True)
class RasterPlan(RasterShape):
    """The rasters' geometry and how the product runs: the tile, the slices and the steps each takes,
    the tiles."""

    block_k: int
    block_c: int
    slices: int
    slice_steps: int
    tiles: int

    @property
    def partials(self) -> int:
        """Partial filters the slices leave: 0 where a lone slice writes dw itself."""
        return self.slices if self.slices > 1 else 0


def _plane(pixels: int, itemsize: int) -> int:
    multiple = PLANE_BYTES // itemsize
    return -(-pixels // multiple) * multiple


def _phases(taps: int, dilation: int, stride: int) -> int:
    """Phases of the stride along one dim that its taps read: tap t reads phase (t * dilation) %
    stride, which repeats every stride / gcd(dilation, stride) taps, so tap t reads x's raster of
    phase index t % phases, the phase ((t % phases) * dilation) % stride."""
    return min(taps, stride // math.gcd(dilation, stride))


def raster_elements(problem: ConvolutionProblem, plan: RasterPlan) -> tuple[int, int]:
    """Elements of x's raster and of dy's in the workspace (none where they are read in place)."""
    if plan.in_place:
        return 0, 0
    geo = geometry(problem)
    return geo.n * geo.c * math.prod(plan.phases) * plan.x_plane, geo.n * geo.k * plan.dy_plane


def reads_in_place(problem: ConvolutionProblem) -> bool:
    """Whether x and dy are their own rasters (module docstring, "In place"): one tap at stride 1
    without padding, each image's pixels contiguous in both."""
    return pixelwise(problem) and pixels_contiguous(problem.x) and pixels_contiguous(problem.y)


def staged_operands(problem: ConvolutionProblem) -> tuple[str, ...]:
    """The operands ("x", "y") whose rasters are copies in the workspace, where TMA reads them."""
    plan = raster_plan(problem)
    assert plan is not None  # the route's problems only
    return () if plan.in_place else ("x", "y")


def _candidates(problem: ConvolutionProblem, shape: RasterShape) -> list[tuple[float, RasterPlan]]:
    """Every tile and slice count for ``problem`` with rasters of ``shape``, each with its estimated
    time in microseconds (module docstring)."""
    geo = geometry(problem)
    itemsize = itemsize_of(problem)
    box = BOX_BYTES // itemsize
    steps = geo.n * triton.cdiv(shape.dy_plane, box)
    sms = programs_to_fill(1)
    partial_bytes = geo.k * geo.c * geo.taps * 4
    flops_per_us = SM_TF32_FLOPS_PER_US * 4 // itemsize
    block_k = 128 if geo.k > 64 else 64  # 64-row tiles ran 1.3-1.4x slower wherever 128 fit
    candidates = []
    for block_c in (64, 128, 256):
        if block_c > 64 and block_c >= 2 * geo.c:
            continue  # no wider than the channels need
        warps = _warps(block_k, block_c)
        stage_bytes = (block_k + block_c) * BOX_BYTES
        registers = 32 * warps * (block_k * block_c // (32 * warps) + REGISTERS_BESIDE_ACCUMULATOR)
        per_sm = min(SM_SHARED_BYTES // (STAGES * stage_bytes), SM_REGISTERS // registers)
        tiles = triton.cdiv(geo.k, block_k) * geo.taps * triton.cdiv(geo.c, block_c)
        for slices in range(1, max(1, min(sms, steps // MIN_SLICE_STEPS)) + 1):
            slice_steps = triton.cdiv(steps, slices)
            if triton.cdiv(steps, slice_steps) != slices:
                continue  # the same slices as a smaller count
            plan = RasterPlan(
                **vars(shape), block_k=block_k, block_c=block_c, slices=slices, slice_steps=slice_steps, tiles=tiles
            )
            programs = tiles * slices
            resident = min(per_sm, triton.cdiv(programs, sms))  # programs an SM runs together
            step_us = max(  # the SM's time for a step of each resident program
                resident * 2 * block_k * block_c * box / flops_per_us,
                resident * stage_bytes / SM_LOAD_BYTES_PER_US,
                STEP_LATENCY_US,
            )
            estimate = triton.cdiv(programs, sms * resident) * slice_steps * step_us
            if plan.partials:
                estimate += SUM_LAUNCH_US + 2 * plan.partials * partial_bytes / PARTIAL_BYTES_PER_US
            candidates.append((estimate, plan))
    return candidates


def _warps(block_k: int, block_c: int) -> int:
    """Two warpgroups for tiles of 128 x 128 and more (a 128 x 256 tile's accumulator needs their
    registers: with one it ran 2.6x slower), one below."""
    return 8 if block_k * block_c >= 128 * 128 else 4


@functools.lru_cache(maxsize=256)  # per problem: asked by choose, the workspace and the launches
def raster_plan(problem: ConvolutionProblem) -> RasterPlan | None:
    """How this route runs ``problem``, or None where it does not apply: a backward filter, ungrouped,
    implicit GEMM, at least MIN_CHANNELS input and output channels, in float32 as TF32 or in a 16-bit
    type where the TMA route cannot box it (``tma_blocks``: 3-D, strides the phase view cannot read;
    the cp.async kernels they took ran 1.8-5.1x slower), whose rasters are read in place or fit in an
    explicit GEMM's column matrix. The least estimated time wins (ties: fewer partial filters, then
    the wider tile)."""
    geo = geometry(problem)
    implicit = method_of(problem.algo) in (ConvolutionMethod.IMPLICIT_GEMM, ConvolutionMethod.IMPLICIT_PRECOMP_GEMM)
    sixteen_bit = itemsize_of(problem) == 2 and tma_blocks(problem) is None
    if (
        problem.direction is not BACKWARD_FILTER
        or not (tf32(problem) or sixteen_bit)
        or not implicit
        or geo.groups != 1
        or min(geo.c, geo.k) < MIN_CHANNELS
    ):
        return None
    od, oh, ow = geo.y_size
    reach = [(taps - 1) * dilation // stride for taps, dilation, stride in zip(geo.filt, geo.dilation, geo.stride)]
    pitch, rows, x_depth = ow + reach[2], oh + reach[1], od + reach[0]
    phases = (
        _phases(geo.filt[0], geo.dilation[0], geo.stride[0]),
        _phases(geo.filt[1], geo.dilation[1], geo.stride[1]),
        _phases(geo.filt[2], geo.dilation[2], geo.stride[2]),
    )
    itemsize = itemsize_of(problem)
    dy_pixels = ((od - 1) * rows + oh) * pitch
    in_place = reads_in_place(problem)
    if in_place:  # the images' own planes
        x_plane = dy_plane = dy_pixels
    else:
        x_plane, dy_plane = _plane(x_depth * rows * pitch, itemsize), _plane(dy_pixels, itemsize)
        x_elements, dy_elements = geo.n * geo.c * math.prod(phases) * x_plane, geo.n * geo.k * dy_plane
        if x_elements + dy_elements > im2col_elements(problem):
            return None
    if max(geo.c * math.prod(phases) * x_plane, geo.k * dy_plane) >= 2**31:
        return None  # the kernels index within one image's raster in int32
    dy_tma = not in_place or all(s > 0 and s * itemsize % PLANE_BYTES == 0 for s in problem.y.strides[:2])
    shape = RasterShape(pitch, rows, x_depth, dy_pixels, x_plane, dy_plane, phases, in_place, dy_tma)
    return min(_candidates(problem, shape), key=lambda c: (round(c[0], 1), c[1].partials, -c[1].block_c))[1]


@triton.jit
def raster_staging_kernel(
    target_ptr,
    source_ptr,
    C,
    size,
    source_strides,
    rows,
    pitch,
    pixels,
    plane,
    stride,
    dilation,
    phases,
    pad,
    ROUND: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):
    """target[n, c, phase, q] = source[n, c, stride * (z, i, j) + phase's offsets - pad] for q = (z *
    rows + i) * pitch + j < ``pixels`` (rounded to TF32 where ROUND), zero where that is outside the
    source and for the rest of the plane. The tuples run over (depth, height, width): ``size`` the
    source's, ``source_strides`` its strides; phase (a, b, e) of ``phases`` has the offsets ((a *
    dilation) % stride, ...) (``_phases``). Program (box of BLOCK_Q pixels of the plane, block of
    BLOCK_C channels, image x phase)."""
    count = phases[0] * phases[1] * phases[2]
    phase = tl.program_id(2) % count
    n = (tl.program_id(2) // count).to(tl.int64)
    q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    line = q // pitch  # two divisions a pixel (l1 NCHW's backward filter: 262 us, 284 with four)
    depth = line // rows
    z = depth * stride[0] + phase // (phases[1] * phases[2]) * dilation[0] % stride[0] - pad[0]
    row = (line - depth * rows) * stride[1] + phase // phases[2] % phases[1] * dilation[1] % stride[1] - pad[1]
    col = (q - line * pitch) * stride[2] + phase % phases[2] * dilation[2] % stride[2] - pad[2]
    inside = (q < pixels) & (z >= 0) & (z < size[0]) & (row >= 0) & (row < size[1]) & (col >= 0) & (col < size[2])
    offsets = z * source_strides[0] + row * source_strides[1] + col * source_strides[2]
    value = tl.load(
        source_ptr + n * source_strides[3] + c[:, None].to(tl.int64) * source_strides[4] + offsets[None, :],
        mask=(c < C)[:, None] & inside[None, :],
        other=0.0,
    )
    if ROUND:
        value = round_to_tf32(value)
    target = ((n * C + c[:, None]) * count + phase) * plane + q[None, :]
    tl.store(target_ptr + target, value, mask=(c < C)[:, None] & (q < plane)[None, :])


@triton.jit
def filter_raster_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    N,
    C,
    K,
    filt,
    phases,
    stride,
    dilation,
    dy_size,
    rows,
    pitch,
    x_plane,
    dy_plane,
    x_strides,
    dy_strides,
    w_strides,
    slice_steps,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    DY_TMA: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Program (k tile x tap x c tile, slice): dw[k, c, tap] = sum over the slice's steps (image n,
    box of BLOCK_P pixels at q) of dy_raster[n, k, q..] * x_raster[n, c, phase, q + shift..], both
    K-major (module docstring); ``filt``, ``phases``, ``stride``, ``dilation`` and ``dy_size`` run over
    (depth, height, width), ``x_strides`` and ``dy_strides`` over the rasters' (image, channel),
    ``w_strides`` over dw's (k, c, depth, height, width). dy's box is read by TMA where DY_TMA (its
    strides are multiples of 16 bytes), else through pointers; x's through pointers, since a tap's
    shift puts its start anywhere in a row and TMA wants a box's innermost start 16-byte aligned.
    x's pixels that meet dy's padding (past OW, OH or the last slice) load as zeros: dy's zeros
    there would make an infinite x NaN, not nothing."""
    if DY_TMA:
        dy_desc = tl.make_tensor_descriptor(
            dy_ptr, [N, K, dy_plane], [dy_strides[0], dy_strides[1], 1], [1, BLOCK_K, BLOCK_P]
        )
    T, R, S = filt
    tiles_c = tl.cdiv(C, BLOCK_C)
    pid = tl.program_id(0)
    c0 = pid % tiles_c * BLOCK_C
    tap = pid // tiles_c % (T * R * S)
    k0 = pid // (tiles_c * T * R * S) * BLOCK_K
    t, r, s = tap // (R * S), tap // S % R, tap % S
    phase = (t % phases[0] * phases[1] + r % phases[1]) * phases[2] + s % phases[2]
    reach_d, reach_h, reach_w = t * dilation[0] // stride[0], r * dilation[1] // stride[1], s * dilation[2] // stride[2]
    shift = (reach_d * rows + reach_h) * pitch + reach_w
    image_steps = tl.cdiv(dy_plane, BLOCK_P)
    dy_end = ((dy_size[0] - 1) * rows + dy_size[1]) * pitch  # dy's real pixels end here
    split = tl.program_id(1)
    begin = split * slice_steps
    end = tl.minimum(begin + slice_steps, N * image_steps)

    c_index = c0 + tl.arange(0, BLOCK_C)
    k_index = k0 + tl.arange(0, BLOCK_K)
    x_rows = x_ptr + c_index[:, None].to(tl.int64) * x_strides[1] + phase * x_plane
    dy_rows = dy_ptr + k_index[:, None].to(tl.int64) * dy_strides[1]
    acc = tl.zeros((BLOCK_K, BLOCK_C), tl.float32)
    for step in range(begin, end):
        n = step // image_steps
        q = step % image_steps * BLOCK_P
        output = q + tl.arange(0, BLOCK_P)  # dy's pixels of the box
        if DY_TMA:
            a = dy_desc.load([n, k0, q]).reshape(BLOCK_K, BLOCK_P)
        else:
            a = tl.load(
                dy_rows + n.to(tl.int64) * dy_strides[0] + output[None, :],
                mask=(k_index < K)[:, None] & (output < dy_plane)[None, :],
                other=0.0,
            )
        line = output // pitch
        real = (output < dy_end) & (output - line * pitch < dy_size[2]) & (line % rows < dy_size[1])
        b = tl.load(
            x_rows + n.to(tl.int64) * x_strides[0] + (output + shift)[None, :],
            mask=(c_index < C)[:, None] & real[None, :],
            other=0.0,
        )
        acc = tl.dot(a.to(DOT), b.T.to(DOT), acc, input_precision=PRECISION)

    k = k0 + tl.arange(0, BLOCK_K)[:, None]
    c = c0 + tl.arange(0, BLOCK_C)[None, :]
    store_tap_filter(
        acc,
        k,
        c,
        tap,
        split,
        dw_ptr,
        partial_ptr,
        K,
        C,
        T,
        R,
        S,
        w_strides[0],
        w_strides[1],
        w_strides[2],
        w_strides[3],
        w_strides[4],
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        tl.float32,
    )


def raster_launches(problem: ConvolutionProblem, dot: Any) -> list[Launch]:
    """The two staging copies (x's raster into the workspace's ``x_staged``, dy's into ``y_staged``;
    none where the rasters are read in place) and the product, its operands as ``dot`` (``dot_type``:
    float32 under the interpreter, which has no 16-bit products); the caller adds the partial
    filters' sum where the plan leaves them."""
    plan = raster_plan(problem)
    assert plan is not None  # what choose read
    geo = geometry(problem)
    if plan.in_place:
        (x_sn, x_sc), (dy_sn, dy_sk) = problem.x.strides[:2], problem.y.strides[:2]
        return [_product_launch(problem, plan, dot, ("x", "y"), ((x_sn, x_sc), (dy_sn, dy_sk)))]
    count = math.prod(plan.phases)
    raster_strides = ((geo.c * count * plan.x_plane, count * plan.x_plane), (geo.k * plan.dy_plane, plan.dy_plane))
    ones = (1, 1, 1)
    copies = (
        (
            "x",
            "x_staged",
            geo.c,
            geo.x_size,
            plan.x_pixels,
            plan.x_plane,
            geo.stride,
            geo.dilation,
            plan.phases,
            geo.pad,
        ),
        ("y", "y_staged", geo.k, geo.y_size, plan.dy_pixels, plan.dy_plane, ones, ones, ones, (0, 0, 0)),
    )
    launches = []
    for source, target, channels, size, pixels, plane, stride, dilation, phases, pad in copies:
        s_n, s_c, s_d, s_h, s_w = strides5(problem.x if source == "x" else problem.y)
        grid = (triton.cdiv(plane, STAGING_PIXELS), triton.cdiv(channels, STAGING_CHANNELS), geo.n * math.prod(phases))
        copy_args = (
            Slot(target),
            Slot(source),
            channels,
            size,
            (s_d, s_h, s_w, s_n, s_c),
            plan.rows,
            plan.pitch,
            pixels,
            plane,
            stride,
            dilation,
            phases,
            pad,
        )
        copy_options = dict(
            ROUND=tf32(problem), BLOCK_C=STAGING_CHANNELS, BLOCK_Q=STAGING_PIXELS, num_warps=STAGING_WARPS
        )
        launches.append(Launch(raster_staging_kernel, grid, copy_args, copy_options))
    launches.append(_product_launch(problem, plan, dot, ("x_staged", "y_staged"), raster_strides))
    return launches


def _product_launch(
    problem: ConvolutionProblem,
    plan: RasterPlan,
    dot: Any,
    rasters: tuple[str, str],
    strides: tuple[tuple[int, int], tuple[int, int]],
) -> Launch:
    """``filter_raster_kernel`` over the rasters in the slots ``rasters`` (x's, dy's), whose (image,
    channel) strides are ``strides``."""
    geo = geometry(problem)
    args = (
        Slot(rasters[0]),
        Slot(rasters[1]),
        Slot("w"),
        Slot("partial") if plan.partials else Slot("w"),
        geo.n,
        geo.c,
        geo.k,
        geo.filt,
        plan.phases,
        geo.stride,
        geo.dilation,
        geo.y_size,
        plan.rows,
        plan.pitch,
        plan.x_plane,
        plan.dy_plane,
        *strides,
        strides5(problem.w),
        plan.slice_steps,
        problem.alpha,
        problem.beta,
    )
    options: dict[str, Any] = dict(
        FLIP=problem.flip,
        PARTIAL=bool(plan.partials),
        HAS_BETA=problem.beta != 0.0,
        DY_TMA=plan.dy_tma,
        DOT=dot,
        PRECISION=dot_precision(problem),
        BLOCK_K=plan.block_k,
        BLOCK_C=plan.block_c,
        BLOCK_P=BOX_BYTES // itemsize_of(problem),
        num_warps=_warps(plan.block_k, plan.block_c),
        num_stages=STAGES,
    )
    return Launch(filter_raster_kernel, (plan.tiles, plan.slices), args, options)
