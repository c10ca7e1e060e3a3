"""Convolutions whose activations are read by TMA in boxes of pixels (Hopper): when they
apply (``tma_blocks``), the workspace copies they read instead of the caller's tensors (``staged``,
the filter repacked: ``packs_filter``), the rows of dx they write channels-last first
(``stages_output``), and their launches."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.convolution import triton_direct as direct
from opendnn.families.convolution import triton_gemm as gemm
from opendnn.families.convolution.problem import (
    ConvolutionMethod,
    ConvolutionProblem,
    method_of,
)
from opendnn.families.convolution.triton_matrix import matmul_form
from opendnn.families.convolution.triton_tiles import (
    BACKWARD_DATA,
    BACKWARD_FILTER,
    FORWARD,
    PROGRAMS_PER_SM,
    accumulator_type,
    channels_last,
    dot_precision,
    epilogue_options,
    geometry,
    im2col_elements,
    itemsize_of,
    on_tensor_cores,
    reduces_strided_pixels,
    strides5,
    sum_blocks,
    tf32,
)
from opendnn.kernels.device import TMA_ALIGNMENT, programs_to_fill
from opendnn.kernels.indexing import dim_offsets
from opendnn.kernels.launch import Launch, Slot
from opendnn.kernels.layout import OUTER_DIMS, tile_layout

# ---- convolutions read by TMA ---------------------------------------------------------------------

TMA_BLOCK_M = 128  # output pixels per tile: an IMAGES x BLOCK_H x BLOCK_W block
TMA_BLOCK_BYTES = 128  # bytes of reduced channels per chunk: 64 16-bit or 32 float32 (TF32) channels
# Fewest reduced channels the forward and backward data take, and the narrowest chunk: a (tap, chunk)
# step over fewer carries too little work for its barriers and copy (SqueezeNet's 3x3 over 16
# channels, chunks of 16 on the H100: 0.043 ms against 0.035 on the cp.async GEMM, whose steps span taps)
MIN_CHUNK = 32
# Fewest pixels along W in a box: rows of at least 8 pixels (one whole 128-byte swizzle pattern of
# 8 x 128 bytes); the widths verified exact on the H200 (docs/design/convolution.md, "The 8-warp race").
TMA_MIN_W = 8
# conv_tma_kernel runs 4 warps: with 8 (two warpgroups) and 3-4 stages its results on the H200 were
# wrong and changed from run to run (a race; docs/design/convolution.md, "The 8-warp race").
TMA_WARPS, TMA_STAGES = 4, 4
TMA_SHARED_BYTES = 200 * 1024  # filter_tma_kernel's pipeline stages take at most this much shared memory
TMA_READS = {FORWARD: ("x", "w"), BACKWARD_DATA: ("y", "w"), BACKWARD_FILTER: ("x", "y")}  # what TMA reads
ACTIVATION_READS = {FORWARD: ("x",), BACKWARD_DATA: ("y",), BACKWARD_FILTER: ("x", "y")}  # ... of them activations
MIN_SLICE_BOXES = 4  # boxes of output pixels each backward-filter slice sums at least
MIN_SLICE_STEPS = 4  # (tap, chunk) steps each slice of a sliced forward reduces at least
NOMINAL_BLOCK_N = 128  # the output-channel tile reduction_slices counts a forward's tiles in
NARROWEST_BLOCK_N = 64  # ... and the narrowest the kernels take, which sets how many rounds the units run
# the sliced forward's cost model, fitted to ResNet-50's 3x3 layers at batches 1-16 on the H200 (bf16,
# GPU time; docs/design/convolution.md): a (tap, chunk) step of a tile, the sum kernel's launch, and
# the rate of the partials' round trip (written by the slices, read by the sum)
STEP_US = 0.22
SLICE_SUM_US = 3.0
PARTIAL_BYTES_PER_US = 2.0e6


def _channels_last_aligned(desc: TensorDescriptor) -> bool:
    """Channels contiguous and the other strides 16-byte aligned: TMA can read it in pixel boxes."""
    n_stride, c_stride, _, h_stride, w_stride = strides5(desc)
    aligned = TMA_ALIGNMENT // desc.dtype.itemsize
    return c_stride == 1 and not any(s % aligned for s in (n_stride, h_stride, w_stride))


def _activation(problem: ConvolutionProblem, name: str) -> TensorDescriptor:
    return problem.x if name == "x" else problem.y


def stages_forward(problem: ConvolutionProblem) -> bool:
    """A forward may read copies in the workspace: under IMPLICIT_PRECOMP_GEMM, whose workspace holds
    them. IMPLICIT_GEMM keeps zero workspace (cuDNN's has none) and reads x and w where they are."""
    return (
        problem.direction is FORWARD
        and on_tensor_cores(problem)
        and method_of(problem.algo) is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM
    )


@functools.lru_cache(maxsize=256)  # per problem, not per call: asked by choose, the workspace and the TMA launches
def staged(problem: ConvolutionProblem) -> tuple[str, ...]:
    """The activations ("x", "y") the TMA route copies channels-last into the workspace first: the
    operands that TMA cannot read where they are (NCHW, say) of a backward problem, or of a forward
    that may stage (``stages_forward``)."""
    if not on_tensor_cores(problem) or (problem.direction is FORWARD and not stages_forward(problem)):
        return ()
    return tuple(
        name for name in ACTIVATION_READS[problem.direction] if not _channels_last_aligned(_activation(problem, name))
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (the operands TMA reads in the workspace)
def packs_filter(problem: ConvolutionProblem) -> bool:
    """The TMA route reads a copy of the filter (``packed_filter``): TF32 backward data reads it
    repacked as [C, R, S, K] (wgmma takes TF32 operands only with the reduced dim contiguous) and runs
    as a forward convolution over dy, and so does a 16-bit one where the filter cannot be read as the
    matrix [K, R*S*C] (an NCHW caller's KCRS filter); a forward that may stage (``stages_forward``)
    reads it as KRSC where it cannot."""
    if problem.direction is BACKWARD_DATA:
        return tf32(problem) or not _filter_matrix_readable(problem)
    return stages_forward(problem) and not _filter_matrix_readable(problem)


def packed_filter(problem: ConvolutionProblem) -> TensorDescriptor:
    """The filter's copy in the workspace (``packs_filter``), packed [C, R, S, K] for backward data
    and [K, R, S, C] for the forward."""
    spatial = tuple(range(2, problem.w.ndim))
    order = (1, *spatial, 0) if problem.direction is BACKWARD_DATA else (0, *spatial, 1)
    return _packed_in_order(problem.w, order)


def _filter_matrix_readable(problem: ConvolutionProblem) -> bool:
    """TMA can read the caller's filter as the matrix [K, R*S*C]: KRSC with its taps packed and a K
    stride of whole 16 bytes (a size-1 dim's stride is any: torch's 1x1 channels-last)."""
    geo = geometry(problem)
    w_sk, w_sc, _, w_sr, w_ss = strides5(problem.w)
    packed_taps = (geo.filt[2] == 1 or w_ss == geo.c) and (geo.filt[1] == 1 or w_sr == geo.filt[2] * geo.c)
    return w_sc == 1 and packed_taps and w_sk * problem.w.dtype.itemsize % TMA_ALIGNMENT == 0


def _reduced(problem: ConvolutionProblem) -> int:
    """The channels a forward or backward data on the TMA route reduces: x's, or dy's."""
    geo = geometry(problem)
    return geo.k if problem.direction is BACKWARD_DATA else geo.c


def tma_block_k(problem: ConvolutionProblem) -> int:
    """The reduced channels of a (tap, chunk) step: one 128-byte row of them (64 16-bit or 32 float32
    channels), or 32 where no more are reduced. A reduction that is not whole chunks ends in a partial
    one: TMA fills the channels past the last with zeros, in the activations' box and in the filter's
    (read per tap, [K, taps, C])."""
    return min(TMA_BLOCK_BYTES // problem.x.dtype.itemsize, max(MIN_CHUNK, triton.next_power_of_2(_reduced(problem))))


def _partial_chunk_readable(problem: ConvolutionProblem) -> bool:
    """A reduction ending in a partial chunk reads zeros past its channels: in the activations' phase
    view where the view's last dim is the channels alone (a forward of unit stride along W; backward
    data gathers dy at unit stride), and in a filter read per tap (a forward's, TF32 backward data's
    repacked one) where its tap stride is TMA-aligned; backward data's filter [K, R*S*C] has zeros
    past its K rows."""
    unit_view = problem.direction is BACKWARD_DATA or geometry(problem).stride[2] == 1
    per_tap = problem.direction is FORWARD or packs_filter(problem)
    return unit_view and (not per_tap or _reduced(problem) * problem.x.dtype.itemsize % TMA_ALIGNMENT == 0)


@functools.lru_cache(maxsize=256)  # per problem, not per call: asked by choose, the workspace and the TMA launches
def tma_blocks(problem: ConvolutionProblem) -> tuple[int, int, int] | None:
    """(IMAGES, BLOCK_H, BLOCK_W) of the TMA kernels for this problem, or None when they do not
    apply: ungrouped 16-bit or TF32 problems, 2-D (or 1-D), or 3-D forwards and backward data whose
    frames the kernels read (``_frames_fit``), implicit GEMM, stride 1, a forward or backward filter
    that x's phase view can read or a backward data (``_phase_view_fits``), channels-last
    activations with 16-byte aligned strides (TF32 backward problems, and TF32 forwards under
    IMPLICIT_PRECOMP_GEMM, stage others: ``staged``), and for forward and backward data at least
    MIN_CHUNK reduced channels, in whole chunks (``tma_block_k``) or ending in a partial one that
    reads zeros past them (``_partial_chunk_readable``), and a KRSC filter (read per tap [K, R*S, C];
    TF32 backward data, and those forwards, copy any other: ``packs_filter``); the activations'
    copies smaller than an explicit GEMM's columns (the filter's copy is the weights' size, which at
    batch 1 outweighs the columns: ResNet-50's 7 x 7 layer, NCHW float32, ran on the cp.async GEMM
    at 0.11 of cuDNN). The block is ``least_padded_box`` of the output pixels (input pixels for
    backward data; a strided backward data's first output phase, each phase's launch taking the box
    of its own size: ``output_phases``)."""
    geo = geometry(problem)
    implicit = method_of(problem.algo) in (ConvolutionMethod.IMPLICIT_GEMM, ConvolutionMethod.IMPLICIT_PRECOMP_GEMM)
    if (
        geo.groups != 1
        or not _phase_view_fits(problem)
        or not _frames_fit(problem)
        or not on_tensor_cores(problem)
        or matmul_form(problem) is not None
        or not implicit
        or (geo.taps == 1 and reduces_strided_pixels(problem))  # mma.sync's GEMM runs those faster
    ):
        return None
    if problem.direction is BACKWARD_FILTER:
        pixels, reduced = geo.y_size, 0
    elif problem.direction is BACKWARD_DATA:
        pixels, reduced = output_phases(problem)[0][1], geo.k
    else:
        pixels, reduced = geo.y_size, geo.c
    if reduced < MIN_CHUNK and problem.direction is not BACKWARD_FILTER:
        return None
    if reduced % tma_block_k(problem) and not _partial_chunk_readable(problem):
        return None
    if problem.direction is not BACKWARD_FILTER and not packs_filter(problem) and not _filter_matrix_readable(problem):
        return None
    copied = sum(_activation(problem, name).numel for name in staged(problem))
    if copied >= im2col_elements(problem):
        return None  # the copies would take an explicit GEMM's columns' memory or more (1x1 layers: x is them)
    for name in ACTIVATION_READS[problem.direction]:
        desc = _activation(problem, name)
        if name in staged(problem):  # its packed channels-last copy must be aligned
            if desc.dims[1] * desc.dtype.itemsize % TMA_ALIGNMENT:
                return None
        elif not _channels_last_aligned(desc):
            return None
    return least_padded_box(geo.n, pixels)


def least_padded_box(n: int, size: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (IMAGES, BLOCK_H, BLOCK_W) box of powers of two, TMA_BLOCK_M pixels and at least TMA_MIN_W
    wide, whose boxes cover n images of (d, h, w) = ``size`` (d = 1) with the least padding (ties: the
    widest)."""
    sides = [2**k for k in range(TMA_BLOCK_M.bit_length())]
    boxes = [(TMA_BLOCK_M // (h * w), h, w) for h in sides for w in sides if h * w <= TMA_BLOCK_M and w >= TMA_MIN_W]
    return min(boxes, key=lambda box: (pixel_boxes(n, size, box), -box[2]))


def has_frames(problem: ConvolutionProblem) -> bool:
    """A 3-D problem whose input or filter spans more than one frame in depth (one that spans one is
    a 2-D problem with a size-1 leading dim, the canonical form of ``triton_tiles.geometry``)."""
    geo = geometry(problem)
    return geo.x_size[0] > 1 or geo.filt[0] > 1


def _frames_fit(problem: ConvolutionProblem) -> bool:
    """A 2-D (or 1-D) problem, or a 3-D forward or backward data whose frames ``conv_tma_kernel``
    reads through the view's third dim (the phase view's row phases in 2-D; the depth stride is 1,
    ``_phase_view_fits``): a forward of unit stride along H, whose view has no row phases, or a
    backward data that writes dx where it lies (``stages_output`` stages 2-D rows)."""
    if not has_frames(problem):
        return True
    if problem.direction is BACKWARD_DATA:
        return not stages_output(problem)
    return problem.direction is FORWARD and geometry(problem).stride[1] == 1


def _phase_view_fits(problem: ConvolutionProblem) -> bool:
    """Stride 1; a backward data, whose output phases (``output_phases``) each gather dy at unit stride
    and store their pixels of dx at its strides; or a forward or backward filter whose x the kernels
    read through its phase view [N, H / stride_h, stride_h, W / stride_w, stride_w * C]
    (``triton_gemm.phase_view_box``): H and W multiples of their strides, so that a row or column past
    the view is one past x (with an odd H a row inside the view could lie past x), and along a strided
    W the channels packed per pixel (pixel stride C), so that a pixel's phases lie side by side in the
    view's last dim (a forward's staged copy of x has them packed)."""
    geo = geometry(problem)
    depth_stride, stride_h, stride_w = geo.stride
    if (depth_stride, stride_h, stride_w) == (1, 1, 1):
        return True
    if problem.direction is BACKWARD_DATA:
        return depth_stride == 1
    x_read = tma_read(problem, "x")[1] if stages_forward(problem) else problem.x
    return (
        problem.direction in (FORWARD, BACKWARD_FILTER)
        and depth_stride == 1
        and geo.x_size[1] % stride_h == 0
        and geo.x_size[2] % stride_w == 0
        and (stride_w == 1 or strides5(x_read)[4] == geo.c)
    )


def _planned_tma_blocks(problem: ConvolutionProblem) -> tuple[int, int, int]:
    """``tma_blocks`` of a problem planned on the TMA path, where it is never None."""
    blocks = tma_blocks(problem)
    if blocks is None:
        raise InternalError("a convolution planned on the TMA path has no TMA blocks")
    return blocks


def pixel_boxes(n: int, size: tuple[int, int, int], box: tuple[int, int, int]) -> int:
    """How many (IMAGES, BLOCK_H, BLOCK_W) boxes cover n images of (d, h, w) = ``size``: a box covers
    one frame (d = 1 but in 3-D)."""
    return size[0] * math.prod(-(-extent // side) for extent, side in zip((n, size[1], size[2]), box))


def _tma_filter_tile(problem: ConvolutionProblem) -> tuple[int, int]:
    """(output channels, input channels) of a filter_tma_kernel tile: 128 or 64 (float32: 64, for shared memory)."""
    geo = geometry(problem)
    widest = 128 if itemsize_of(problem) == 2 else 64
    return (widest if geo.k >= widest else 64), (widest if geo.c >= widest else 64)


def tma_filter_split(problem: ConvolutionProblem) -> tuple[int, int, int]:
    """(programs per slice, slices, boxes per slice) of filter_tma_kernel: slices of the output
    pixel boxes enough to fill the GPU, each at least MIN_SLICE_BOXES boxes."""
    geo = geometry(problem)
    boxes = pixel_boxes(geo.n, geo.y_size, _planned_tma_blocks(problem))
    block_k, block_c = _tma_filter_tile(problem)
    programs = triton.cdiv(geo.k, block_k) * geo.taps * triton.cdiv(geo.c, block_c)
    splits = max(1, min(triton.cdiv(programs_to_fill(PROGRAMS_PER_SM), programs), boxes // MIN_SLICE_BOXES))
    per_slice = triton.cdiv(boxes, splits)
    return programs, triton.cdiv(boxes, per_slice), per_slice


@functools.lru_cache(maxsize=256)  # per problem: asked by the workspace query, preferred and the launches
def reduction_slices(problem: ConvolutionProblem) -> tuple[int, int]:
    """(slices, steps a slice) of a forward on the TMA route: where its tiles (``NOMINAL_BLOCK_N``
    output channels wide) fill at most half the GPU (a batch-1 layer: ResNet-50's 14 x 14 3x3 is 2
    boxes of pixels, 4 tiles of 36 steps), its reduction over (tap, chunk) steps is split into
    slices of at least MIN_SLICE_STEPS steps, about a tile per SM in all, each slice writing float32
    partial sums that ``slice_sum_kernel`` adds in a fixed order (bitwise repeatable), where the steps
    a tile no longer runs one after another (in the rounds the units take at the narrowest tile)
    save more than that kernel and the partials' round trip cost (``STEP_US``, ``SLICE_SUM_US``,
    ``PARTIAL_BYTES_PER_US``: ResNet-50's 56 x 56 layer at batch 1, 9 steps, is not sliced, nor its
    14 x 14 layer at batch 4, whose 8 slices would take two rounds and 13 MB of partials). Under
    IMPLICIT_PRECOMP_GEMM alone, whose workspace holds the partials (IMPLICIT_GEMM keeps zero
    workspace); (1, steps) where it is not sliced."""
    geo = geometry(problem)
    steps = geo.taps * triton.cdiv(_reduced(problem), tma_block_k(problem))  # (every output phase's or more)
    blocks = tma_blocks(problem)
    precomputed = method_of(problem.algo) is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM
    if problem.direction is not FORWARD or blocks is None or not precomputed:
        return 1, steps
    boxes, programs = pixel_boxes(geo.n, geo.y_size, blocks), programs_to_fill(1)
    wanted = min(programs // (boxes * triton.cdiv(geo.k, NOMINAL_BLOCK_N)), steps // MIN_SLICE_STEPS)
    per_slice = triton.cdiv(steps, max(1, wanted))
    slices = triton.cdiv(steps, per_slice)
    rounds = triton.cdiv(boxes * triton.cdiv(geo.k, NARROWEST_BLOCK_N) * slices, programs)
    saved_us = (steps - per_slice * rounds) * STEP_US
    partials_us = 2 * slices * partial_output(problem).numel * 4 / PARTIAL_BYTES_PER_US
    if wanted < 2 or saved_us <= SLICE_SUM_US + partials_us:  # the sum would cost what the slices save
        return 1, steps
    return slices, per_slice


def partial_output(problem: ConvolutionProblem) -> TensorDescriptor:
    """One slice's float32 partial sums of a sliced forward (``reduction_slices``): y's dims packed
    channels-last, the slices one after another in the workspace."""
    return channels_last(problem.y, DataType.FLOAT)


def slice_sum_launch(problem: ConvolutionProblem) -> Launch:
    """``slice_sum_kernel``'s launch: y from a sliced forward's partial sums, with the epilogue; blocks
    of elements small enough that every SM sums (``triton_backend``'s backward-filter sum alike)."""
    geo = geometry(problem)
    elements = geo.n * math.prod(geo.y_size) * geo.k
    slices = reduction_slices(problem)[0]
    block, split_block = sum_blocks(elements, slices)
    args = (
        Slot("partial"),
        Slot("y"),
        Slot("bias"),
        Slot("z"),
        elements,
        *geo.y_size,
        geo.k,
        *strides5(problem.y),
        *strides5(problem.z),
        problem.bias.strides[1] if problem.bias is not None else 0,
        slices,
        problem.alpha,
        problem.beta,
        problem.alpha2,
        problem.activation_coef,
    )
    options = dict(epilogue_options(problem), BLOCK=block, SPLIT_BLOCK=split_block, num_warps=4)
    return Launch(gemm.slice_sum_kernel, (triton.cdiv(elements, block),), args, options)


def output_phases(problem: ConvolutionProblem) -> list[tuple[tuple[int, int], tuple[int, int, int]]]:
    """The output phases the TMA kernels compute in a launch each, as ((row phase a, column phase b),
    their pixel grid (frames, rows, columns)): a forward's one phase is y; a backward data's are the
    pixels (stride_h * i + a, stride_w * j + b) of dx, ceil((H - a) / stride_h) x ceil((W - b) /
    stride_w) of them (stride 1: one phase, dx), each a stride-1 convolution of dy with the taps of
    its phase (``tap_progression``); phases without pixels are left out."""
    geo = geometry(problem)
    if problem.direction is not BACKWARD_DATA:
        return [((0, 0), geo.y_size)]
    (frames, height, width), (_, stride_h, stride_w) = geo.x_size, geo.stride
    phases = [
        ((a, b), (frames, -(-(height - a) // stride_h), -(-(width - b) // stride_w)))
        for a in range(stride_h)
        for b in range(stride_w)
    ]
    return [(phase, size) for phase, size in phases if size[1] > 0 and size[2] > 0]


def tap_progression(problem: ConvolutionProblem, dim: int, phase: int) -> tuple[int, int, int, int, int]:
    """The taps along spatial dim ``dim`` (1: rows, 2: columns) that output phase ``phase`` sums, as
    (count, the first's shift, shift step, the first's filter index, filter index step): tap k reads
    A's phase view at the output coordinate moved by shift + k * shift step (``phase_view_box``) and
    the filter at index first + k * step. Forward: every tap r, shift r * dilation - pad. Backward
    data: the r with (phase + pad - r * dilation) divisible by the stride, r0 + k * stride /
    gcd(stride, dilation), shift (phase + pad - r * dilation) / stride, walked from the last where
    TF32 runs it as a forward over dy with the filter turned around (``packs_filter``). True
    convolution reads the filter at R - 1 - r."""
    geo = geometry(problem)
    extent, pad, stride, dilation = geo.filt[dim], geo.pad[dim], geo.stride[dim], geo.dilation[dim]
    forward = problem.direction is FORWARD
    if forward:
        taps = range(extent)
    else:
        step = stride // math.gcd(stride, dilation)
        first = next((r for r in range(step) if (phase + pad - r * dilation) % stride == 0), extent)
        taps = range(first, extent, step)
        if packs_filter(problem):
            taps = taps[::-1]
    if not taps:
        return 0, 0, 0, 0, 0

    def shift(r: int) -> int:
        return r * dilation - pad if forward else (phase + pad - r * dilation) // stride

    def index(r: int) -> int:
        return extent - 1 - r if problem.flip else r

    r0, r1 = taps[0], taps[0] + taps.step
    return len(taps), shift(r0), shift(r1) - shift(r0), index(r0), index(r1) - index(r0)


def tma_arguments(
    problem: ConvolutionProblem, phase: tuple[int, int], size: tuple[int, int, int]
) -> tuple[tuple[Any, ...], dict[str, Any], int, int]:
    """What the forward and backward-data TMA kernels (``conv_tma_kernel``, ``gluon_hopper``'s
    ``conv_warp_specialized_kernel``) share for output phase ``phase`` of pixel grid ``size``
    (``output_phases``): their arguments, their constexprs, how many pixel boxes cover the phase's
    output and how many output channels it has. Where dx's rows are staged (``stages_output``), the
    phase writes the workspace's rows of its row phase, its columns one stride apart; a sliced
    forward (``reduction_slices``) writes its slices' partial sums, with no epilogue."""
    geo = geometry(problem)
    images, block_h, block_w = least_padded_box(geo.n, size)
    backward = problem.direction is BACKWARD_DATA
    if backward:  # dy gathered at unit stride, dx's pixels of the phase written one stride apart
        (a, a_desc), out, out_desc, reduced, outputs = tma_read(problem, "y"), Slot("x"), problem.x, geo.k, geo.c
        a_size, view_strides, out_strides = geo.y_size, (1, 1), geo.stride[1:]
    else:
        (a, a_desc), out, out_desc, reduced, outputs = tma_read(problem, "x"), Slot("y"), problem.y, geo.c, geo.k
        a_size, view_strides, out_strides = geo.x_size, geo.stride[1:], (1, 1)
    first_row = phase[0]  # of the output's pixels of the phase
    if stages_output(problem):  # the row phase's rows in the workspace, each a row of dx
        out, out_desc, out_strides, first_row = Slot("x_staged"), staged_rows(problem, phase[0]), (1, geo.stride[2]), 0
    slices, slice_steps = reduction_slices(problem)
    slice_elements = 0
    if slices > 1:  # partial sums into the workspace: the epilogue is slice_sum_launch's
        out, out_desc = Slot("partial"), partial_output(problem)
        slice_elements = out_desc.numel
        problem = dataclasses.replace(problem, alpha=1.0, beta=0.0, bias=None, z=None, activation=None)
    w, w_sk = Slot("w"), strides5(problem.w)[0]
    if packs_filter(problem):  # backward data: a forward convolution of dy with the filter [C, R, S, K]
        backward, w, w_sk = False, Slot("w_packed"), geo.taps * reduced  # forward: the filter [K, R, S, C]
    a_sn, _, a_sd, a_sh, a_sw = strides5(a_desc)
    o_sn, o_sc, o_sd, o_sh, o_sw = strides5(out_desc)
    z_sn, z_sc, z_sd, z_sh, z_sw = strides5(problem.z)
    # per dim (count, shift, shift step, filter index, index step), passed as rows' and columns' in turn
    progressions = zip(*(tap_progression(problem, dim, coordinate) for dim, coordinate in zip((1, 2), phase)))
    # the view's third dim (conv_tma_kernel): a 3-D problem's frames, a 2-D one's row phases
    layers = (a_size[0], a_sd) if has_frames(problem) else (view_strides[0], a_sh)
    args = (
        a,
        w,
        out,
        Slot("bias"),
        Slot("z"),
        geo.n,
        *a_size[1:],
        reduced,
        *size[1:],
        outputs,
        *geo.filt[1:],
        a_sn,
        a_sh,
        a_sw,
        w_sk,
        o_sn,
        o_sc,
        out_strides[0] * o_sh,
        out_strides[1] * o_sw,
        first_row * o_sh + phase[1] * o_sw,
        z_sn,
        z_sc,
        z_sh,
        z_sw,
        problem.bias.strides[1] if problem.bias is not None else 0,
        *view_strides,
        *(value for pair in progressions for value in pair),
        slice_steps,
        slice_elements,
        size[0],
        geo.filt[0],
        *layers,
        o_sd,
        z_sd,
        *tap_progression(problem, 0, 0),
        problem.alpha,
        problem.beta,
        problem.alpha2,
        problem.activation_coef,
    )
    options = dict(
        **epilogue_options(problem),
        BACKWARD=backward,
        IMAGES=images,
        BLOCK_H=block_h,
        BLOCK_W=block_w,
        BLOCK_K=tma_block_k(problem),
        GROUP_M=8,
    )
    return args, options, pixel_boxes(geo.n, size, (images, block_h, block_w)), outputs


def tma_launches(problem: ConvolutionProblem, dot: Any) -> list[Launch]:
    """``conv_tma_kernel``'s launches: one per output phase (``phase_launches``), a program per tile
    and slice (``reduction_slices``)."""

    def launch(phase: tuple[int, int], size: tuple[int, int, int]) -> Launch:
        args, options, boxes, outputs = tma_arguments(problem, phase, size)
        block_n = 128 if outputs > 64 else max(16, triton.next_power_of_2(outputs))
        options.update(
            COMPUTE=accumulator_type(problem),
            DOT=dot,
            PRECISION=dot_precision(problem),
            BLOCK_N=block_n,
            num_warps=TMA_WARPS,
            num_stages=TMA_STAGES,
        )
        grid = (boxes * triton.cdiv(outputs, block_n), reduction_slices(problem)[0])
        return Launch(gemm.conv_tma_kernel, grid, args, options)

    return phase_launches(problem, launch)


def phase_launches(
    problem: ConvolutionProblem, launch: Callable[[tuple[int, int], tuple[int, int, int]], Launch]
) -> list[Launch]:
    """``launch(phase, size)`` for every output phase (``output_phases``); where dx's rows are staged
    (``stages_output``), a row phase's launches fill the workspace's rows and a copy moves them into
    dx before the next row phase's."""
    if not stages_output(problem):
        return [launch(phase, size) for phase, size in output_phases(problem)]
    launches: list[Launch] = []
    stride_h, (n_stride, c_stride, _, h_stride, w_stride) = geometry(problem).stride[1], strides5(problem.x)
    for row_phase in range(stride_h):
        phases = [(phase, size) for phase, size in output_phases(problem) if phase[0] == row_phase]
        if not phases:
            continue
        launches += [launch(phase, size) for phase, size in phases]
        rows = staged_rows(problem, row_phase)
        dx_rows = TensorDescriptor(
            problem.x.dtype, rows.dims, (n_stride, c_stride, stride_h * h_stride, w_stride)
        )  # dx's rows of the row phase, from its row row_phase on
        launches.append(copy_launch(Slot("x"), dx_rows, "x_staged", rows, False, row_phase * h_stride))
    return launches


def stages_output(problem: ConvolutionProblem) -> bool:
    """A strided backward data whose dx holds its channels apart (NCHW) writes each row phase's
    rows channels-last into the workspace (``staged_rows``), then copies them into dx: written where
    they lie, a phase's pixels a stride apart fill part of each 32-byte sector, and the next phase's
    launch fills the rest after the first has left L2 (ResNet-50's 3x3 stride-2 layer, NCHW float32:
    docs/design/convolution.md, "Strided backward data into NCHW"). The rows of one row phase take the
    workspace, not all of dx; beta * dx would need dx's prior values there too, so beta keeps dx."""
    geo = geometry(problem)
    return (
        problem.direction is BACKWARD_DATA
        and on_tensor_cores(problem)
        and problem.beta == 0.0
        and strides5(problem.x)[1] != 1
        and geo.stride[1] * geo.stride[2] > 1
    )


def staged_rows(problem: ConvolutionProblem, row_phase: int) -> TensorDescriptor:
    """The workspace's copy of dx's rows of ``row_phase`` (rows row_phase, row_phase + stride_h, ...),
    packed channels-last: row phase 0 has the most of them, the region's size."""
    geo = geometry(problem)
    (_, height, width), stride_h = geo.x_size, geo.stride[1]
    dims = (geo.n, geo.c, -(-(height - row_phase) // stride_h), width)
    return channels_last(TensorDescriptor(problem.x.dtype, dims))


def tma_read(problem: ConvolutionProblem, name: str) -> tuple[Slot, TensorDescriptor]:
    """Where the TMA kernels read activation ``name``: the caller's tensor or its staged copy."""
    desc = _activation(problem, name)
    if name in staged(problem):
        return Slot(f"{name}_staged"), channels_last(desc)
    return Slot(name), desc


def _packed_in_order(desc: TensorDescriptor, order: tuple[int, ...]) -> TensorDescriptor:
    """``desc``'s dims packed with its dims laid out in ``order`` (outermost first)."""
    return TensorDescriptor(desc.dtype, desc.dims, strides_for_order(desc.dims, order))


STAGING_OUTER_DIMS = tl.constexpr(OUTER_DIMS)
STAGING_TILE = 64  # A and B extent of a staging copy's tile (a transpose's: loads along A, stores along B)
STAGING_WARPS = 8


@triton.jit
def staging_kernel(
    target_ptr,
    source_ptr,
    target_offset,
    sizes,
    size_a,
    size_b,
    target_strides,
    source_strides,
    target_stride_a,
    source_stride_a,
    target_stride_b,
    source_stride_b,
    ROUND_TO_TF32: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """target = source, rounded to TF32 (``triton_gemm.round_to_tf32``) where ROUND_TO_TF32, target's elements
    from ``target_offset`` on. One BLOCK x BLOCK tile of dims A x B of the canonical layout
    (``kernels.layout``) a program; ``sizes`` and the strides are tuples over its outer dims."""
    pid = tl.program_id(0)
    tiles_b = tl.cdiv(size_b, BLOCK)
    tiles_a = tl.cdiv(size_a, BLOCK)
    b_index = pid % tiles_b * BLOCK + tl.arange(0, BLOCK)
    a_index = (pid // tiles_b % tiles_a * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    outer = (pid // tiles_b // tiles_a).to(tl.int64)
    mask = (a_index < size_a)[:, None] & (b_index < size_b)[None, :]
    source = dim_offsets(outer, STAGING_OUTER_DIMS, sizes, source_strides)
    value = tl.load(
        source_ptr + source + a_index[:, None] * source_stride_a + b_index[None, :] * source_stride_b, mask=mask
    )
    target = target_offset + dim_offsets(outer, STAGING_OUTER_DIMS, sizes, target_strides)
    tl.store(
        target_ptr + target + a_index[:, None] * target_stride_a + b_index[None, :] * target_stride_b,
        gemm.round_to_tf32(value) if ROUND_TO_TF32 else value,
        mask=mask,
    )


def staging_launches(problem: ConvolutionProblem) -> list[Launch]:
    """The copies the TMA route reads instead of the caller's tensors, float32 rounded to TF32 on the
    way: staged activations channels-last (``activation_staging_launches``), and the filter where the
    route reads a copy (``packed_filter``: [C, R, S, K] for backward data, KRSC for a forward)."""
    launches = activation_staging_launches(problem)
    if packs_filter(problem):
        launches.append(copy_launch(Slot("w_packed"), packed_filter(problem), "w", problem.w, tf32(problem)))
    return launches


def activation_staging_launches(problem: ConvolutionProblem) -> list[Launch]:
    """The channels-last copies of the activations ``staged`` names, float32 rounded to TF32 on the
    way, in the workspace regions ``tma_read`` reads them from."""
    names, rounded = staged(problem), tf32(problem)
    return [copy_launch(*tma_read(problem, name), name, _activation(problem, name), rounded) for name in names]


def copy_launch(
    target: Slot,
    target_desc: TensorDescriptor,
    source: str,
    source_desc: TensorDescriptor,
    round_to_tf32: bool,
    target_offset: int = 0,
) -> Launch:
    """``staging_kernel`` copying the tensor in slot ``source`` into ``target`` at ``target_desc``'s
    strides from element ``target_offset`` on, rounded to TF32 on the way where ``round_to_tf32``."""
    tiled = tile_layout(target_desc.dims, [target_desc, source_desc])
    (target_strides, source_strides) = tiled.strides
    grid = (triton.cdiv(tiled.sizes[-2], STAGING_TILE) * triton.cdiv(tiled.sizes[-1], STAGING_TILE) * tiled.outer,)
    args = (
        target,
        Slot(source),
        target_offset,
        tiled.sizes[:-2],
        tiled.sizes[-2],
        tiled.sizes[-1],
        target_strides[:-2],
        source_strides[:-2],
        target_strides[-2],
        source_strides[-2],
        target_strides[-1],
        source_strides[-1],
    )
    options = dict(ROUND_TO_TF32=round_to_tf32, BLOCK=STAGING_TILE, num_warps=STAGING_WARPS)
    return Launch(staging_kernel, grid, args, options)


def filter_arguments(problem: ConvolutionProblem, partial: bool) -> tuple[Any, ...]:
    """What the backward-filter TMA kernels (``filter_tma_kernel``, ``gluon_filter``'s
    ``filter_warp_specialized_kernel``) take first: x and dy where TMA reads them, dw, the partial
    filters (``partial``) or dw again, then the sizes, the tensors' strides, the padding, the dilation
    and the convolution's stride."""
    geo = geometry(problem)
    (x, x_desc), (dy, dy_desc) = tma_read(problem, "x"), tma_read(problem, "y")
    x_sn, _, _, x_sh, x_sw = strides5(x_desc)
    dy_sn, _, _, dy_sh, dy_sw = strides5(dy_desc)
    w_sk, w_sc, _, w_sr, w_ss = strides5(problem.w)
    return (
        x,
        dy,
        Slot("w"),
        Slot("partial") if partial else Slot("w"),
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
        *geo.stride[1:],
    )


def tma_filter_launch(problem: ConvolutionProblem, dot: Any) -> Launch:
    """The backward filter read by TMA: partial filters per slice of pixel boxes when it splits."""
    images, block_h, block_w = _planned_tma_blocks(problem)
    block_k, block_c = _tma_filter_tile(problem)
    programs, splits, per_slice = tma_filter_split(problem)
    stages = min(4, TMA_SHARED_BYTES // (TMA_BLOCK_M * (block_k + block_c) * itemsize_of(problem)))
    args = (*filter_arguments(problem, splits > 1), per_slice, problem.alpha, problem.beta)
    return Launch(
        direct.filter_tma_kernel,
        (programs, splits),
        args,
        dict(
            FLIP=problem.flip,
            PARTIAL=splits > 1,
            HAS_BETA=problem.beta != 0.0,
            COMPUTE=accumulator_type(problem),
            DOT=dot,
            PRECISION=dot_precision(problem),
            IMAGES=images,
            BLOCK_H=block_h,
            BLOCK_W=block_w,
            BLOCK_M=block_k,
            BLOCK_N=block_c,
            num_warps=8 if block_k * block_c >= 128 * 128 else 4,
            num_stages=stages,
        ),
    )
