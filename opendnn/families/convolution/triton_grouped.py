"""Grouped convolutions with few channels per group (ResNeXt's 8 or 16, RegNet's 8-16): a program
owns a tile of pixels and a block of whole groups whose channels are contiguous, and multiplies by
the block-diagonal filter of those groups as one dense tensor-core product per tap.

Per tap, forward (backward data the same with dy gathered and the filter's K and C exchanged per
group)::

    O[m, block channels] += A[m at tap, block reduced channels] @ W_block[tap]
    W_block[l, o] = w(group, l mod RED, o mod OUTC, tap) where l // RED == o // OUTC, else 0

Backward filter: per tap and block, ``dy[pixels, block K]^T @ x[pixels at tap, block C]`` summed over
a slice of the pixels; only the diagonal blocks (k and c of one group) are stored, partial slices go
to the workspace and ``filter_sum_kernel`` adds them in a fixed order (bitwise repeatable).

Cost model, NHWC 16-bit, ResNeXt-50's 28 x 28 layer (batch 64, 256 channels, 32 groups of 8, 3 x 3):
x and y are 25.7 MB each, so one pass is ~12 us at the 4.2 TB/s copy speed. A program reads each
input pixel's block of channels once per tap (64 contiguous bytes for a 32-channel block; the taps'
re-reads come from L1/L2) and writes its outputs once. The useful work is 2 * 8 * 9 FLOPs per output
element (1.85 GFLOP); the dense block of GROUPS_PER_BLOCK groups does that many times more (4 for 8
channels a group in a 32-channel block: 7.4 GFLOP, ~15 us at half the bf16 tensor-core rate). The
same work on CUDA cores (72 fused multiply-adds an output, no waste) is 1.85 GFLOP at the ~67 TFLOP/s
of float32 FMA: ~28 us at peak. The tensor cores with the waste are expected to win from 4 up to 16
channels a group. Measured, the route also beat the implicit GEMM at 32 a group, and up to 64 a group
(one group a block) wherever a group's channels are not whole 128-byte chunks, which the GEMM's tiles
would run masked (RegNetY's 56: 0.10-0.18 of cuDNN on the GEMM, 1.01-1.41 here); groups of whole
chunks keep the GEMM (GROUPED_BLOCK_CHANNELS, GROUPED_MAX_CHANNELS; docs/design/convolution.md).
``benchmarks/grouped_sweep.py`` times the candidate tiles against cuDNN.

The tiles are loaded with a group's channels along one side: where the caller's tensors hold them
apart (an NCHW model's activations and KCRS filter), every element is a load of its own. Under the
algorithms that have a workspace (``PACKED_FILTER_METHODS``) the forward and backward data read
channels-last copies instead (``grouped_copies``), which the heuristics rank first; IMPLICIT_GEMM
reads the caller's tensors and keeps zero workspace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from opendnn.core.descriptors import TensorDescriptor
from opendnn.families.convolution.problem import ConvolutionMethod, ConvolutionProblem, method_of
from opendnn.families.convolution.triton_direct import store_filter
from opendnn.families.convolution.triton_gemm import (
    epilogue,
    gather_coordinate,
    row_coordinates,
    tap_progression,
    tap_shifts,
)
from opendnn.families.convolution.triton_tiles import (
    BACKWARD_DATA,
    BACKWARD_FILTER,
    MIN_SLICE_STEPS,
    PACKED_FILTER_METHODS,
    accumulator_type,
    channels_last,
    dot_precision,
    geometry,
    strides5,
    tf32,
)
from opendnn.families.convolution.triton_tma import TMA_BLOCK_BYTES, copy_launch, tma_read
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.launch import Launch, Slot

GROUPED_MAX_CHANNELS = 64  # most channels a group this route takes where they are not whole 128-byte chunks
GROUPED_BLOCK_CHANNELS = 32  # channels a program's block of groups spans (the block's widest side); every
# group of at most this many channels takes the route
GROUPED_PIXELS = 128  # pixels a program (a reduction step of the backward filter); half for 4- and 8-byte
# types but a TF32 forward or backward data, whose registers would spill
GROUPED_WARPS = 4
# backward filter slices aim for this many programs an SM: its loop waits on its loads (H200 sweep, 2 to 32)
GROUPED_FILTER_PROGRAMS_PER_SM = 8
GROUPED_STAGES = 3
FLOAT32_STAGES = 2  # of a TF32 forward's or backward data's 128-pixel tile (3 measured 8-30% slower)
MMA_MIN_WIDTH = 16  # narrowest side of a tensor-core operand


@triton.jit
def block_lanes(g0, G, PER_GROUP: tl.constexpr, GROUPS_PER_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """The lanes of a block of groups starting at group g0: (group within the block, channel within
    its group, valid) per lane; lanes past the block's groups or the last group are not valid."""
    lanes = tl.arange(0, BLOCK)
    group = lanes // PER_GROUP
    return group, lanes - group * PER_GROUP, (group < GROUPS_PER_BLOCK) & (g0 + group < G)


@triton.jit
def grouped_conv_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    z_ptr,
    a_sn,
    a_sc,
    a_sd,
    a_sh,
    a_sw,
    w_s_red,
    w_s_out,
    w_st,
    w_sr,
    w_ss,
    w_group,
    o_sn,
    o_sc,
    o_sd,
    o_sh,
    o_sw,
    z_sn,
    z_sc,
    z_sd,
    z_sh,
    z_sw,
    bias_sc,
    M,
    UD,
    UH,
    UW,
    OD,
    OH,
    OW,
    AD,
    AH,
    AW,
    G,
    T,
    R,
    S,
    pad_d,
    pad_h,
    pad_w,
    sd,
    sh,
    sw,
    dil_d,
    dil_h,
    dil_w,
    step_d,
    step_h,
    step_w,
    alpha: tl.float64,
    beta: tl.float64,
    alpha2: tl.float64,
    coef: tl.float64,
    BACKWARD: tl.constexpr,
    FLIP: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    RED: tl.constexpr,
    OUTC: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    """Program (pixel tile, block of groups, phase): BLOCK_M output pixels x the block's OUTC *
    GROUPS_PER_BLOCK output channels, one dense product per tap (a runtime loop) with the filter's
    off-diagonal blocks zero. Backward (dx), the pixels of a tile share one stride phase and so one
    progression of taps (as in ``conv_gemm_kernel``)."""
    phase = tl.program_id(2)
    qw = phase % sw
    qh = (phase // sw) % sh
    qd = phase // (sw * sh)
    if BACKWARD:
        r0_d, taps_d = tap_progression(qd, pad_d, sd, dil_d, T, step_d)
        r0_h, taps_h = tap_progression(qh, pad_h, sh, dil_h, R, step_h)
        r0_w, taps_w = tap_progression(qw, pad_w, sw, dil_w, S, step_w)
    else:
        r0_d, r0_h, r0_w, taps_d, taps_h, taps_w = 0, 0, 0, T, R, S

    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n, u_d, u_h, u_w, o_d, o_h, o_w, row_valid = row_coordinates(
        m, UD, UH, UW, OD, OH, OW, qd, qh, qw, sd, sh, sw, BACKWARD, M
    )
    g0 = tl.program_id(1) * GROUPS_PER_BLOCK
    group_r, c_r, red_valid = block_lanes(g0, G, RED, GROUPS_PER_BLOCK, BLOCK_R)
    group_o, c_o, out_valid = block_lanes(g0, G, OUTC, GROUPS_PER_BLOCK, BLOCK_O)
    # the block's reduced channels are contiguous in A: channel g0 * RED + lane
    a_rows = n.to(tl.int64)[:, None] * a_sn + (g0 * RED + tl.arange(0, BLOCK_R)).to(tl.int64)[None, :] * a_sc
    a_valid = row_valid[:, None] & red_valid[None, :]
    diagonal = (group_r[:, None] == group_o[None, :]) & red_valid[:, None] & out_valid[None, :]
    w_block = (g0 + group_r)[:, None] * w_group + c_r[:, None] * w_s_red + c_o[None, :] * w_s_out
    u_d, u_h, u_w = u_d[:, None], u_h[:, None], u_w[:, None]

    acc = tl.zeros((BLOCK_M, BLOCK_O), COMPUTE)
    for tap in range(0, taps_d * taps_h * taps_w):
        shift_d, shift_h, shift_w, w_tap = tap_shifts(
            tap,
            w_ptr,
            r0_d,
            r0_h,
            r0_w,
            step_d,
            step_h,
            step_w,
            taps_h,
            taps_w,
            T,
            R,
            S,
            dil_d,
            dil_h,
            dil_w,
            w_st,
            w_sr,
            w_ss,
            FLIP,
            False,
        )
        i_d, ok_d = gather_coordinate(u_d, qd, shift_d, pad_d, sd, AD, BACKWARD)
        i_h, ok_h = gather_coordinate(u_h, qh, shift_h, pad_h, sh, AH, BACKWARD)
        i_w, ok_w = gather_coordinate(u_w, qw, shift_w, pad_w, sw, AW, BACKWARD)
        a = tl.load(a_ptr + a_rows + i_d * a_sd + i_h * a_sh + i_w * a_sw, mask=a_valid & ok_d & ok_h & ok_w, other=0.0)
        b = tl.load(w_ptr + w_block + w_tap, mask=diagonal, other=0.0)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)

    mask = row_valid[:, None] & out_valid[None, :]
    channels = (g0 * OUTC + tl.arange(0, BLOCK_O))[None, :]
    n = n.to(tl.int64)[:, None]
    o_d, o_h, o_w = o_d[:, None], o_h[:, None], o_w[:, None]
    out_offsets = n * o_sn + channels * o_sc + o_d * o_sd + o_h * o_sh + o_w * o_sw
    z_offsets = n * z_sn + channels * z_sc + o_d * z_sd + o_h * z_sh + o_w * z_sw
    epilogue(
        acc,
        out_ptr,
        out_offsets,
        mask,
        bias_ptr,
        channels * bias_sc,
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
        COMPUTE,
    )


@triton.jit
def grouped_filter_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    y_sn,
    y_sc,
    y_sd,
    y_sh,
    y_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    P,
    OD,
    OH,
    OW,
    XD,
    XH,
    XW,
    G,
    K,
    T,
    R,
    S,
    pad_d,
    pad_h,
    pad_w,
    sd,
    sh,
    sw,
    dil_d,
    dil_h,
    dil_w,
    slice_pixels,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    KG: tl.constexpr,
    CG: tl.constexpr,
    GROUPS_PER_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (tap, block of groups, slice): dy[pixels, block K]^T @ x[pixels at tap, block C]
    over the slice's pixels, BLOCK_M at a time; the diagonal blocks are the groups' dw at the tap
    (or the slice's partial sums). The taps of a block and slice run side by side (axis 0), so their
    programs read the same dy tiles while they are in L2."""
    tap = tl.program_id(0)
    t = tap // (R * S)
    r = (tap // S) % R
    s = tap % S
    g0 = tl.program_id(1) * GROUPS_PER_BLOCK
    split = tl.program_id(2)
    group_k, k_in_group, k_valid = block_lanes(g0, G, KG, GROUPS_PER_BLOCK, BLOCK_K)
    group_c, c_in_group, c_valid = block_lanes(g0, G, CG, GROUPS_PER_BLOCK, BLOCK_C)
    k = g0 * KG + tl.arange(0, BLOCK_K)
    c = g0 * CG + tl.arange(0, BLOCK_C)
    start = split * slice_pixels
    end = tl.minimum(start + slice_pixels, P)

    acc = tl.zeros((BLOCK_K, BLOCK_C), COMPUTE)
    for p0 in range(start, end, BLOCK_M):
        p = p0 + tl.arange(0, BLOCK_M)
        o_w = p % OW
        o_h = (p // OW) % OH
        o_d = (p // (OW * OH)) % OD
        n = (p // (OW * OH * OD)).to(tl.int64)
        pixel_valid = p < end
        dy_pixels = n * y_sn + o_d * y_sd + o_h * y_sh + o_w * y_sw
        dy_offsets = dy_pixels[None, :] + k.to(tl.int64)[:, None] * y_sc
        dy = tl.load(dy_ptr + dy_offsets, mask=k_valid[:, None] & pixel_valid[None, :], other=0.0)
        i_d = o_d * sd - pad_d + t * dil_d
        i_h = o_h * sh - pad_h + r * dil_h
        i_w = o_w * sw - pad_w + s * dil_w
        inside = pixel_valid & (i_d >= 0) & (i_d < XD) & (i_h >= 0) & (i_h < XH) & (i_w >= 0) & (i_w < XW)
        x_pixels = n * x_sn + i_d * x_sd + i_h * x_sh + i_w * x_sw
        x_offsets = x_pixels[:, None] + c.to(tl.int64)[None, :] * x_sc
        x = tl.load(x_ptr + x_offsets, mask=inside[:, None] & c_valid[None, :], other=0.0)
        acc = tl.dot(dy.to(DOT), x.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)

    diagonal = (group_k[:, None] == group_c[None, :]) & k_valid[:, None] & c_valid[None, :]
    store_filter(
        acc,
        k[:, None],
        tap * CG + c_in_group[None, :],
        split,
        dw_ptr,
        partial_ptr,
        K,
        CG,
        T * R * S,
        T,
        R,
        S,
        w_sk,
        w_sc,
        w_st,
        w_sr,
        w_ss,
        diagonal,
        alpha,
        beta,
        PARTIAL,
        HAS_BETA,
        FLIP,
        COMPUTE,
    )


# ---- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupedTile:
    """A program's work: BLOCK_M pixels (output pixels; backward filter: pixels a reduction step)
    by a block of ``groups_per_block`` whole groups."""

    groups_per_block: int
    block_m: int
    num_warps: int
    num_stages: int


def channels_per_group(problem: ConvolutionProblem) -> tuple[int, int]:
    """(reduced, output) channels a group: (C/G, K/G) forward, (K/G, C/G) backward data; backward
    filter's product is (K/G) x (C/G), reported as (C/G, K/G) like the forward."""
    geo = geometry(problem)
    cg, kg = geo.c // geo.groups, geo.k // geo.groups
    return (kg, cg) if problem.direction is BACKWARD_DATA else (cg, kg)


def grouped_tile(problem: ConvolutionProblem) -> GroupedTile | None:
    """The tile of this route, or None where it does not apply: grouped problems under IMPLICIT_GEMM,
    or reading copies in the workspace (``grouped_copies``), of fitting groups
    (``_groups_fit``)."""
    implicit = method_of(problem.algo) is ConvolutionMethod.IMPLICIT_GEMM
    if not (implicit and _groups_fit(problem)) and not grouped_copies(problem):
        return None
    as_tf32 = tf32(problem) and problem.direction is not BACKWARD_FILTER
    wide = problem.x.dtype.itemsize <= 2 or as_tf32  # the others' 128-pixel tiles spill registers
    groups_per_block = max(1, min(problem.groups, GROUPED_BLOCK_CHANNELS // max(channels_per_group(problem))))
    pixels = GROUPED_PIXELS if wide else GROUPED_PIXELS // 2
    return GroupedTile(groups_per_block, pixels, GROUPED_WARPS, FLOAT32_STAGES if as_tf32 else GROUPED_STAGES)


def _groups_fit(problem: ConvolutionProblem) -> bool:
    """A grouped problem with at most GROUPED_BLOCK_CHANNELS channels a group on either side, or at
    most GROUPED_MAX_CHANNELS where a group's channels on some side are not whole 128-byte chunks (the
    implicit GEMM's tiles run unmasked only on whole chunks: 64 16-bit channels a group are its)."""
    per_group = channels_per_group(problem)
    widest = max(per_group)
    whole_chunks = all(channels * problem.x.dtype.itemsize % TMA_BLOCK_BYTES == 0 for channels in per_group)
    wide = widest > GROUPED_MAX_CHANNELS or (widest > GROUPED_BLOCK_CHANNELS and whole_chunks)
    return problem.groups > 1 and not wide


def grouped_copies(problem: ConvolutionProblem) -> tuple[str, ...]:
    """The operands a forward or backward data of this route reads as channels-last copies in the
    workspace (``grouped_read``): under an algorithm of PACKED_FILTER_METHODS, those that hold a
    group's channels apart, of the filter ("w", copied KRSC) and the activation it reduces ("x"
    forward, "y" backward data). H100, RegNetY's 3x3 (4 groups of 56 at 28 x 28, batch 64, NCHW
    float32 as TF32, per call): forward 0.476 -> 0.202 ms, backward data 0.997 -> 0.225, with the
    128-pixel tile (docs/design/convolution.md, "Float32 over NCHW: channels-last copies")."""
    if problem.direction is BACKWARD_FILTER or method_of(problem.algo) not in PACKED_FILTER_METHODS:
        return ()
    if not _groups_fit(problem):
        return ()
    reduced = "y" if problem.direction is BACKWARD_DATA else "x"
    return tuple(name for name in ("w", reduced) if _operand(problem, name).strides[1] != 1)


def grouped_read(problem: ConvolutionProblem, name: str) -> tuple[Slot, TensorDescriptor]:
    """Where this route's forward or backward data reads operand ``name``: the caller's tensor, or its
    channels-last copy (``grouped_copies``)."""
    desc = _operand(problem, name)
    if name not in grouped_copies(problem):
        return Slot(name), desc
    return Slot("w_packed" if name == "w" else f"{name}_staged"), channels_last(desc)


def grouped_copy_launches(problem: ConvolutionProblem) -> list[Launch]:
    """The copies ``grouped_copies`` names, rounded to TF32 (to nearest, as the TMA route's staged
    operands) where the products are TF32's."""
    return [
        copy_launch(*grouped_read(problem, name), name, _operand(problem, name), tf32(problem))
        for name in grouped_copies(problem)
    ]


def _operand(problem: ConvolutionProblem, name: str) -> TensorDescriptor:
    return {"x": problem.x, "y": problem.y, "w": problem.w}[name]


def block_width(groups_per_block: int, per_group: int) -> int:
    return max(MMA_MIN_WIDTH, triton.next_power_of_2(groups_per_block * per_group))


def grouped_filter_slices(problem: ConvolutionProblem, tile: GroupedTile) -> tuple[int, int]:
    """(slices, pixels a slice) of the backward filter's pixel reduction: programs (taps x blocks x
    slices) to fill the GPU GROUPED_FILTER_PROGRAMS_PER_SM times over, each slice at least MIN_SLICE_STEPS
    steps of BLOCK_M pixels."""
    geo = geometry(problem)
    programs = geo.taps * triton.cdiv(geo.groups, tile.groups_per_block)
    pixels = geo.output_pixels
    splits = max(
        1,
        min(
            triton.cdiv(programs_to_fill(GROUPED_FILTER_PROGRAMS_PER_SM), programs),
            pixels // (tile.block_m * MIN_SLICE_STEPS),
        ),
    )
    slice_pixels = triton.cdiv(triton.cdiv(pixels, splits), tile.block_m) * tile.block_m
    return triton.cdiv(pixels, slice_pixels), slice_pixels


def grouped_splits(problem: ConvolutionProblem) -> int:
    """Slices of this route's backward filter (1 where the route or the direction does not apply)."""
    tile = grouped_tile(problem)
    if tile is None or problem.direction is not BACKWARD_FILTER:
        return 1
    return grouped_filter_slices(problem, tile)[0]


def grouped_launch(problem: ConvolutionProblem, dot: Any, tile: GroupedTile) -> Launch:
    """The launch of this route's kernel for ``problem`` (its slices, if any, summed by the caller)."""
    if problem.direction is BACKWARD_FILTER:
        return _filter_launch(problem, dot, tile)
    geo = geometry(problem)
    backward = problem.direction is BACKWARD_DATA
    reduced, outputs = channels_per_group(problem)
    if backward:
        source, out, out_desc, a_size, out_size = "y", "x", problem.x, geo.y_size, geo.x_size
        phases = geo.stride
        steps = tuple(s // math.gcd(s, d) for s, d in zip(geo.stride, geo.dilation))
        units = tuple(-(-o // s) for o, s in zip(out_size, geo.stride))
    else:
        source, out, out_desc, a_size, out_size = "x", "y", problem.y, geo.x_size, geo.y_size
        phases, steps, units = (1, 1, 1), (1, 1, 1), out_size
    (a, a_desc), (w, w_desc) = grouped_read(problem, source), grouped_read(problem, "w")
    w_sk, w_sc, *w_taps = strides5(w_desc)
    rows = geo.n * math.prod(units)
    args = (
        a,
        w,
        Slot(out),
        Slot("bias"),
        Slot("z"),
        *strides5(a_desc),
        *((w_sk, w_sc) if backward else (w_sc, w_sk)),  # the filter's strides along reduced, output channels
        *w_taps,
        (reduced if backward else outputs) * w_sk,
        *strides5(out_desc),
        *strides5(problem.z),
        problem.bias.strides[1] if problem.bias is not None else 0,
        rows,
        *units,
        *out_size,
        *a_size,
        geo.groups,
        *geo.filt,
        *geo.pad,
        *geo.stride,
        *geo.dilation,
        *steps,
        problem.alpha,
        problem.beta,
        problem.alpha2,
        problem.activation_coef,
    )
    grid = (triton.cdiv(rows, tile.block_m), triton.cdiv(geo.groups, tile.groups_per_block), math.prod(phases))
    epilogue = dict(
        HAS_BIAS=problem.bias is not None,
        HAS_Z=problem.z is not None,
        ACTIVATION=problem.activation.value[:-4] if problem.activation else "",
        PROPAGATE_NAN=problem.propagate_nan,
    )
    widths = dict(
        BLOCK_R=block_width(tile.groups_per_block, reduced), BLOCK_O=block_width(tile.groups_per_block, outputs)
    )
    options = _options(problem, dot, tile, BACKWARD=backward, RED=reduced, OUTC=outputs, **epilogue, **widths)
    return Launch(grouped_conv_kernel, grid, args, options)


def _filter_launch(problem: ConvolutionProblem, dot: Any, tile: GroupedTile) -> Launch:
    """The backward filter's launch: a TF32 backward filter reads its NCHW activations as channels-last
    copies rounded to TF32 (``staged``, ``triton_tma.activation_staging_launches``), whose rows of
    channels its [pixels, channels] tiles load whole (float32, batch 64 on an H100: RegNetY's 3x3, 4
    groups of 56, 0.78 -> 0.60 ms; ResNeXt's 3x3, 32 groups, 28 x 28 0.58 -> 0.28, 7 x 7 0.142 -> 0.092)."""
    geo = geometry(problem)
    cg, kg = channels_per_group(problem)
    splits, slice_pixels = grouped_filter_slices(problem, tile)
    (x, x_desc), (y, y_desc) = tma_read(problem, "x"), tma_read(problem, "y")
    args = (
        x,
        y,
        Slot("w"),
        Slot("partial") if splits > 1 else Slot("w"),
        *strides5(x_desc),
        *strides5(y_desc),
        *strides5(problem.w),
        geo.output_pixels,
        *geo.y_size,
        *geo.x_size,
        geo.groups,
        geo.k,
        *geo.filt,
        *geo.pad,
        *geo.stride,
        *geo.dilation,
        slice_pixels,
        problem.alpha,
        problem.beta,
    )
    widths = dict(BLOCK_K=block_width(tile.groups_per_block, kg), BLOCK_C=block_width(tile.groups_per_block, cg))
    options = _options(problem, dot, tile, PARTIAL=splits > 1, KG=kg, CG=cg, **widths)
    grid = (geo.taps, triton.cdiv(geo.groups, tile.groups_per_block), splits)
    return Launch(grouped_filter_kernel, grid, args, options)


def _options(problem: ConvolutionProblem, dot: Any, tile: GroupedTile, **own: Any) -> dict[str, Any]:
    """The constexprs and launch options both kernels take, with ``own``: those of one kernel."""
    return dict(
        own,
        FLIP=problem.flip,
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=accumulator_type(problem),
        DOT=dot,
        PRECISION=dot_precision(problem),
        GROUPS_PER_BLOCK=tile.groups_per_block,
        BLOCK_M=tile.block_m,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
