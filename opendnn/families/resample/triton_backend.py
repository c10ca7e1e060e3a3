"""Resampling by interpolation on Triton: one gather kernel per direction.

Memory model (forward, E_in and E_out elements of b bytes): y is written once (E_out b) and each
output reads its 1 (nearest) to 16 (bicubic) taps, which neighbouring outputs share in cache, so
the traffic is about (E_in + E_out) b: memory bound, a few dozen instructions per output. The
backward reads dy once and writes dx once, the same (E_in + E_out) b.

Both kernels tile their output (y forward, dx backward) as [rows, columns], the columns running
along the output's innermost dim in memory (channels for channels-last tensors, the width for
channels-first ones), so that a warp's stores and, along that dim, its loads are contiguous. A
row's coordinates (sample, channel, spatial) come from one division and modulo per dim, shared by
the row's columns.

``resample_forward_kernel``: per output, the taps along each spatial dim (``problem.source_taps``'s
formula, in the compute dtype) and their product of weights; 1 load per output for the nearest
modes, 2, 4 or 8 for linear over 1, 2 or 3 dims, 16 for bicubic (a dim whose input is one pixel
wide too, its taps on that pixel).

``resample_backward_kernel``: a gather, deterministic: per dx element and spatial dim, the outputs
that can read it lie in a window of ``reach`` outputs starting at ``floor((i - AHEAD) / s) + lead``;
each is mapped forward again with the forward's formula and adds ``dy * weight`` where one of its
taps is the element (a tap of weight 0 too, as torch's backward adds it: a NaN dy gives NaN there),
the loads masked where the output does not read it. The planner computes ``lead`` and ``reach`` per
dim from the forward's taps, in the kernel's arithmetic (``_candidates``): the least window that
holds every output reading every input. For a 2x upsampling that is 2 outputs per dim for the nearest
modes and 4 for linear (4 and 16 candidates per element in 2-D, each a read of dy).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.resample.problem import CUBIC_A, ResampleProblem, source_taps
from opendnn.kernels.blend import blend_store
from opendnn.kernels.launch import Launch, Launches, Slot

# outputs per program: 8 per thread of the forward's 4 warps, 4 per thread of the backward's 8 (its
# gather keeps each element's window position, weights and flags live: 72 registers and a spill at 8
# per thread over 3 spatial dims on sm_90, 48 at 4)
ELEMENTS = 1024
COLUMNS = 64  # the widest tile along the innermost dim
GRID_Y = tl.constexpr(65535)
KEYS_A = tl.constexpr(CUBIC_A)  # CUDA's limit on a grid's y and z


@triton.jit
def _coordinate(rows, columns, divisor, size, IS_INNER: tl.constexpr):
    """A dim's coordinate over the [rows, columns] tile: the columns' own along the innermost dim,
    else the rows' (a [rows, 1] tensor)."""
    if IS_INNER:
        coordinate = columns[None, :]
    else:
        coordinate = ((rows // divisor) % size)[:, None]
    return coordinate


@triton.jit
def _tile(
    sizes,
    divisors,
    rows,
    columns,
    INNER: tl.constexpr,
    INDEX: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """The program's [BLOCK_R, BLOCK_C] tile of the output over dims (N, C, D, H, W): its mask and
    the five coordinates. Row blocks run along the grid's x, column blocks along its y and z (y holds
    at most 65535)."""
    row = tl.program_id(0).to(INDEX) * BLOCK_R + tl.arange(0, BLOCK_R)
    column_block = tl.program_id(1) + tl.program_id(2) * GRID_Y
    column = column_block.to(INDEX) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (row < rows)[:, None] & (column < columns)[None, :]
    n = _coordinate(row, column, divisors[0], sizes[0], INNER == 0)
    c = _coordinate(row, column, divisors[1], sizes[1], INNER == 1)
    d = _coordinate(row, column, divisors[2], sizes[2], INNER == 2)
    h = _coordinate(row, column, divisors[3], sizes[3], INNER == 3)
    w = _coordinate(row, column, divisors[4], sizes[4], INNER == 4)
    return mask, n, c, d, h, w


@triton.jit
def _source(o, scale, in_size, MODE: tl.constexpr, ALIGN: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr):
    """Output ``o``'s source along one dim (problem.source_taps): the base index its taps start from
    (behind it by ``mode.behind``) and the source's fraction past it."""
    position = o.to(COMPUTE)
    last = tl.cast(in_size - 1, COMPUTE)  # (sources clamped before they become integers: a large scale's overflow)
    if MODE == "nearest":
        base, fraction = tl.minimum(tl.floor(position * scale), last).to(INDEX), 0.0
    elif MODE == "nearest_exact":
        base, fraction = tl.minimum(tl.floor((position + 0.5) * scale), last).to(INDEX), 0.0
    else:
        if ALIGN:
            source = scale * position
        else:
            source = scale * (position + 0.5) - 0.5
        if MODE == "linear":
            source = tl.maximum(source, 0.0)
            base = tl.minimum(source, last).to(INDEX)
            fraction = tl.minimum(source - base.to(COMPUTE), 1.0)  # (torch's clamp: a source past the last pixel)
        else:
            whole = tl.floor(source)
            base, fraction = tl.minimum(whole, last + 1.0).to(INDEX), source - whole
    return base, fraction


@triton.jit
def _near(x):
    """Keys' cubic convolution kernel for |x| <= 1 (problem.cubic_weights)."""
    return ((KEYS_A + 2.0) * x - (KEYS_A + 3.0)) * x * x + 1.0


@triton.jit
def _far(x):
    """Keys' cubic convolution kernel for 1 < |x| < 2 (problem.cubic_weights)."""
    return ((KEYS_A * x - 5.0 * KEYS_A) * x + 8.0 * KEYS_A) * x - 4.0 * KEYS_A


@triton.jit
def _tap(t: tl.constexpr, TAPS: tl.constexpr, MODE: tl.constexpr, base, fraction, in_size, out_size):
    """Tap ``t`` of a dim read through TAPS taps: its index and weight (one tap: a nearest mode, or a
    spatial dim the tensors lack)."""
    if TAPS == 1:
        index, weight = tl.minimum(tl.maximum(base, 0), in_size - 1), 1.0
    elif MODE == "linear":
        if t == 0:
            index, weight = base, 1.0 - fraction
        else:  # a dim of unchanged size is copied (its scale 1): both taps on the output's own index
            index = tl.where(out_size == in_size, base, tl.minimum(base + 1, in_size - 1))
            weight = fraction
    else:
        index = tl.minimum(tl.maximum(base + (t - 1), 0), in_size - 1)
        if t == 0:
            weight = _far(fraction + 1.0)
        elif t == 1:
            weight = _near(fraction)
        elif t == 2:
            weight = _near(1.0 - fraction)
        else:
            weight = _far(2.0 - fraction)
    return index, weight


@triton.jit
def _read_weight(
    o,
    i,
    out_size,
    scale,
    in_size,
    MODE: tl.constexpr,
    TAPS: tl.constexpr,
    ALIGN: tl.constexpr,
    COMPUTE: tl.constexpr,
    INDEX: tl.constexpr,
):
    """Whether output ``o`` (one within the output) has input ``i`` among its taps along one dim, the
    weight it reads it with, summed over its taps that fall on i, and whether those taps' products with
    an infinite dy sum to NaN, as torch adds them one by one: a tap of weight 0 (dy * 0; a NaN dy is NaN
    anyway) or taps of both signs (inf - inf)."""
    base, fraction = _source(o, scale, in_size, MODE, ALIGN, COMPUTE, INDEX)
    reads = o < 0  # all false, of o's shape
    positive, negative, zero = reads, reads, reads
    factor = tl.zeros(o.shape, COMPUTE)
    for t in tl.static_range(TAPS):
        index, weight = _tap(t, TAPS, MODE, base, fraction, in_size, out_size)
        on = index == i
        reads = reads | on
        factor += tl.where(on, weight, 0.0)
        positive = positive | (on & (weight > 0.0))
        negative = negative | (on & (weight < 0.0))
        zero = zero | (on & (weight == 0.0))
    return reads & (o < out_size), factor, zero | (positive & negative)


@triton.jit
def _first(i, step, lead, out_size, AHEAD: tl.constexpr, COMPUTE: tl.constexpr, INDEX: tl.constexpr):
    """The first output that may read input ``i`` along one dim: max(floor((i - AHEAD) * step) + lead, 0),
    the product clamped to the output before it becomes an integer (``_candidates`` mirrors it)."""
    start = tl.minimum(tl.floor((i - AHEAD).to(COMPUTE) * step), tl.cast(out_size, COMPUTE))
    return tl.maximum(start.to(INDEX) + lead, 0)


@triton.jit
def resample_forward_kernel(
    x_ptr,
    y_ptr,
    x_strides,
    y_strides,
    in_sizes,
    sizes,
    divisors,
    rows,
    columns,
    scale_d: tl.float64,
    scale_h: tl.float64,
    scale_w: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    INNER: tl.constexpr,
    TAPS_D: tl.constexpr,
    TAPS_H: tl.constexpr,
    TAPS_W: tl.constexpr,
    MODE: tl.constexpr,
    ALIGN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    INDEX: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """y over dims (N, C, D, H, W) (sizes; absent spatial dims of size 1), x over (N, C, in_sizes)."""
    mask, n, c, od, oh, ow = _tile(sizes, divisors, rows, columns, INNER, INDEX, BLOCK_R, BLOCK_C)
    base_d, fraction_d = _source(od, tl.cast(scale_d, COMPUTE), in_sizes[0], MODE, ALIGN, COMPUTE, INDEX)
    base_h, fraction_h = _source(oh, tl.cast(scale_h, COMPUTE), in_sizes[1], MODE, ALIGN, COMPUTE, INDEX)
    base_w, fraction_w = _source(ow, tl.cast(scale_w, COMPUTE), in_sizes[2], MODE, ALIGN, COMPUTE, INDEX)
    plane = x_ptr + n * x_strides[0] + c * x_strides[1]
    acc = tl.zeros([BLOCK_R, BLOCK_C], COMPUTE)
    for td in tl.static_range(TAPS_D):
        i_d, f_d = _tap(td, TAPS_D, MODE, base_d, fraction_d, in_sizes[0], sizes[2])
        for th in tl.static_range(TAPS_H):
            i_h, f_h = _tap(th, TAPS_H, MODE, base_h, fraction_h, in_sizes[1], sizes[3])
            for tw in tl.static_range(TAPS_W):
                i_w, f_w = _tap(tw, TAPS_W, MODE, base_w, fraction_w, in_sizes[2], sizes[4])
                offsets = i_d * x_strides[2] + i_h * x_strides[3] + i_w * x_strides[4]
                acc += tl.load(plane + offsets, mask=mask).to(COMPUTE) * (f_d * f_h * f_w)
    y = n * y_strides[0] + c * y_strides[1] + od * y_strides[2] + oh * y_strides[3] + ow * y_strides[4]
    blend_store(y_ptr, y, mask, acc, tl.cast(alpha, COMPUTE), tl.cast(beta, COMPUTE), HAS_BETA)


@triton.jit
def resample_backward_kernel(
    dy_ptr,
    dx_ptr,
    dy_strides,
    dx_strides,
    out_sizes,
    sizes,
    divisors,
    rows,
    columns,
    leads,
    reach,
    scale_d: tl.float64,
    scale_h: tl.float64,
    scale_w: tl.float64,
    step_d: tl.float64,
    step_h: tl.float64,
    step_w: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    INNER: tl.constexpr,
    MODE: tl.constexpr,
    TAPS_D: tl.constexpr,
    TAPS_H: tl.constexpr,
    TAPS_W: tl.constexpr,
    AHEAD: tl.constexpr,
    ALIGN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    INDEX: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """dx over dims (N, C, D, H, W) (sizes), dy over (N, C, out_sizes); per spatial dim, the outputs
    ``first .. first + reach - 1`` with ``first = max(floor((i - AHEAD) * step) + lead, 0)`` (AHEAD: how
    far an output's last tap lies past its base; step = 1 / s, 0 where s is 0) are the candidates that
    may read input i."""
    mask, n, c, i_d, i_h, i_w = _tile(sizes, divisors, rows, columns, INNER, INDEX, BLOCK_R, BLOCK_C)
    s_d, s_h, s_w = tl.cast(scale_d, COMPUTE), tl.cast(scale_h, COMPUTE), tl.cast(scale_w, COMPUTE)
    first_d = _first(i_d, tl.cast(step_d, COMPUTE), leads[0], out_sizes[0], AHEAD, COMPUTE, INDEX)
    first_h = _first(i_h, tl.cast(step_h, COMPUTE), leads[1], out_sizes[1], AHEAD, COMPUTE, INDEX)
    first_w = _first(i_w, tl.cast(step_w, COMPUTE), leads[2], out_sizes[2], AHEAD, COMPUTE, INDEX)
    plane = dy_ptr + n * dy_strides[0] + c * dy_strides[1]
    acc = tl.zeros([BLOCK_R, BLOCK_C], COMPUTE)
    for k_d in range(reach[0]):
        o_d = first_d + k_d
        reads_d, f_d, nan_d = _read_weight(o_d, i_d, out_sizes[0], s_d, sizes[2], MODE, TAPS_D, ALIGN, COMPUTE, INDEX)
        for k_h in range(reach[1]):
            o_h = first_h + k_h
            reads_h, f_h, nan_h = _read_weight(
                o_h, i_h, out_sizes[1], s_h, sizes[3], MODE, TAPS_H, ALIGN, COMPUTE, INDEX
            )
            reads_dh, f_dh, nan_dh = mask & reads_d & reads_h, f_d * f_h, nan_d | nan_h
            for k_w in range(reach[2]):
                o_w = first_w + k_w
                reads_w, f_w, nan_w = _read_weight(
                    o_w, i_w, out_sizes[2], s_w, sizes[4], MODE, TAPS_W, ALIGN, COMPUTE, INDEX
                )
                offsets = o_d * dy_strides[2] + o_h * dy_strides[3] + o_w * dy_strides[4]
                gradient = tl.load(plane + offsets, mask=reads_dh & reads_w, other=0.0).to(COMPUTE)
                # dy * 0 where torch's sum of the taps' products is NaN for an infinite dy
                acc += gradient * (f_dh * f_w) + tl.where(nan_dh | nan_w, gradient * 0.0, 0.0)
    dx = n * dx_strides[0] + c * dx_strides[1] + i_d * dx_strides[2] + i_h * dx_strides[3] + i_w * dx_strides[4]
    blend_store(dx_ptr, dx, mask, acc, tl.cast(alpha, COMPUTE), tl.cast(beta, COMPUTE), HAS_BETA)


# the planner -----------------------------------------------------------------------------------------


def supports(problem: ResampleProblem) -> str | None:
    return None


def run(problem: ResampleProblem, source: Bound, out: Bound) -> None:
    """Forward: x -> y; backward: dy -> dx."""
    tensors = {"source": torch_view(source), "out": torch_view(out)}
    device = tensors["source"].device
    resample_launches(problem, (device.index or 0) if device.type == "cuda" else None)(tensors)


def _five(desc: TensorDescriptor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """dims and strides as (N, C, D, H, W): absent leading spatial dims of size 1."""
    missing = 5 - desc.ndim
    dims = (*desc.dims[:2], *(1,) * missing, *desc.dims[2:])
    strides = (*desc.strides[:2], *(0,) * missing, *desc.strides[2:])
    return dims, strides


def _tiling(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, tuple[int, ...], int]:
    """The innermost dim in memory (the tile's columns; the last of equal strides), each dim's
    divisor in the row index (the rows run over the other dims, outermost first) and the row count."""
    candidates = [k for k in range(5) if dims[k] > 1] or [4]
    inner = min(reversed(candidates), key=lambda k: abs(strides[k]))
    outer = sorted((k for k in range(5) if k != inner), key=lambda k: (-abs(strides[k]), k))
    divisors = [1] * 5
    for position, k in enumerate(outer):
        divisors[k] = math.prod(dims[j] for j in outer[position + 1 :])
    return inner, tuple(divisors), math.prod(dims[k] for k in outer)


def _candidates(problem: ResampleProblem, k: int, step: float, ahead: int) -> tuple[int, int]:
    """The backward's (lead, reach) along spatial dim ``k``: the least window, starting at
    ``floor((i - ahead) * step) + lead`` (``_first``), that holds every output reading input i, for
    every i. Computed in the kernel's arithmetic on the forward's taps (``source_taps``), its source
    rounded once (a GPU's) and twice (Triton's interpreter), for the step rounded to the compute dtype
    and, where that is float64, to float32 too (the interpreter passes float64 scalars as float32)."""
    in_size, out_size = problem.tensors[1].dims[2 + k], problem.tensors[0].dims[2 + k]
    compute = problem.compute_dtype
    first_read, last_read = np.full(in_size, out_size), np.full(in_size, -1)
    for fused in (False, True):
        taps = source_taps(problem.mode, problem.align_corners, problem.scales[k], in_size, out_size, compute, fused)
        for index, _ in taps:
            np.minimum.at(first_read, index, np.arange(out_size))
            np.maximum.at(last_read, index, np.arange(out_size))
    read = last_read >= 0  # (an input no output reads, downsampling by nearest, needs no window)
    real = compute.to_numpy().type
    starts = [  # per rounding of the step, the window start floor((i - ahead) * step) of each input read
        np.minimum(np.floor((np.arange(in_size) - ahead).astype(real) * rounded), real(out_size)).astype(np.int64)[read]
        for rounded in {real(step), real(np.float32(step))}
    ]
    lead = min(int(np.min(first_read[read] - start)) for start in starts)
    return lead, max(int(np.max(last_read[read] - np.maximum(start + lead, 0))) for start in starts) + 1


@functools.lru_cache(maxsize=256)  # per problem and device, asked by every run
def resample_launches(problem: ResampleProblem, device: int | None) -> Launches:
    """The one launch computing ``problem`` on CUDA device ``device`` (None: the interpreter)."""
    source, out = problem.tensors
    source_dims, source_strides = _five(source)
    dims, strides = _five(out)
    inner, divisors, rows = _tiling(dims, strides)
    block_c = min(triton.next_power_of_2(dims[inner]), COLUMNS)
    block_r = ELEMENTS // block_c
    column_blocks = triton.cdiv(dims[inner], block_c)
    grid = (triton.cdiv(rows, block_r), min(column_blocks, GRID_Y.value), triton.cdiv(column_blocks, GRID_Y.value))
    scales = (1.0,) * (3 - len(problem.scales)) + problem.scales
    wide = max(source.extent, out.extent, out.numel) >= 2**31
    compute = tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32
    flags: dict[str, Any] = dict(
        INNER=inner,
        MODE=problem.mode.value,
        ALIGN=problem.align_corners,
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=compute,
        INDEX=tl.int64 if wide else tl.int32,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=8 if problem.backward else 4,
    )
    head = (Slot("source"), Slot("out"), source_strides, strides)
    taps, padded = problem.mode.taps, 5 - source.ndim  # (padded: the spatial dims the tensors lack)
    # every tap of a spatial dim, one pixel wide too (its taps' weights of 0 or of both signs make an
    # infinity NaN, as in torch); one for the dims the tensors lack
    per_dim = [1] * padded + [taps] * (source.ndim - 2)
    flags.update(TAPS_D=per_dim[0], TAPS_H=per_dim[1], TAPS_W=per_dim[2])
    if not problem.backward:
        arguments = (*head, source_dims[2:], dims, divisors, rows, dims[inner], *scales)
        return Launches((Launch(resample_forward_kernel, grid, (*arguments, problem.alpha, problem.beta), flags),))
    steps = tuple(1.0 / s if s > 0 else 0.0 for s in scales)  # (a scale of 0 sends every output to input 0)
    ahead = taps - 1 - problem.mode.behind
    windows = [(0, 1)] * padded + [_candidates(problem, k, steps[padded + k], ahead) for k in range(source.ndim - 2)]
    leads, reach = (tuple(column) for column in zip(*windows))
    flags.update(AHEAD=ahead)
    arguments = (*head, source_dims[2:], dims, divisors, rows, dims[inner], leads, reach, *scales, *steps)
    return Launches((Launch(resample_backward_kernel, grid, (*arguments, problem.alpha, problem.beta), flags),))
