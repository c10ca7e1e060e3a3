"""Cross-channel LRN and divisive normalization (LCN), forward and backward.

Memory model (E elements of b bytes, window n): LRN forward reads x once and writes y once
(2 E b); backward reads x and dy and writes dx (3 E b). About 3n + 10 FLOPs per element: memory
bound. float32 64 x 256 x 56 x 56 (205 M elements) forward moves 1.64 GB: 0.39 ms at 4.2 TB/s.

LRN tiles are (channels x pixels), pixels being the spatial dims flattened (merged into one dim
when contiguous, so NCHW rows are unit-stride vectors). ``lrn_forward_kernel`` loads the tile
shifted by each of the n window offsets along channels: one tile's worth comes from DRAM, the
other n - 1 shifted copies from L1/L2, and the window sum is exact (no running sum to cancel).
``lrn_backward_kernel`` needs, for each output channel, the mirrored window sum of
t = dy * x * s^(-beta-1), where s itself is a window sum: a program computes s, s^-beta and t on
an extended tile (its BLOCK_C - n + 1 output channels plus the n - 1 channels around them), parks
t and s^-beta in its own scratch slot (L2-resident: the grid is persistent, 2 programs per
SM, each reusing one slot), synchronises the block and reads the slot back shifted. Reads of x
and dy: once from DRAM; dx written once.

Divisive normalization (rare, not a speed target) uses one gather kernel in three phases over
planes (sample, channel) with spatial dims (D, H, W): FORWARD (box window of d^2, d = x - means),
CARRY (temp = dy * d * s^(-beta-1), temp2 = s^-beta: cuDNN's temp buffers) and GRADIENT (mirrored
box sum of temp, then dx and dmeans = -dx). Window loops are runtime loops: n^S loads per element.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import triton
import triton.language as tl

from opendnn.backends.triton.device import multiprocessors
from opendnn.backends.triton.launch import Launch, Launches, Scratch, Slot
from opendnn.backends.triton.reduce import flat_offsets
from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.ops.lrn import LRNProblem

TILE_ELEMENTS = 4096  # channels x pixels per tile: 16 per thread at 8 warps
CHANNEL_BLOCK = 32
PROGRAMS_PER_SM = 2  # backward's persistent grid: 128 registers x 256 threads -> 2 resident per SM
DIVISIVE_BLOCK = 256


@triton.jit
def power(s, exponent):
    """s ** exponent for s > 0."""
    return tl.exp(tl.log(s) * exponent)


@triton.jit
def window_sum_of_squares(x_ptr, x_base, x_channel_stride, x_pixels, channels, p_mask, c,
                          WINDOW: tl.constexpr, BEHIND: tl.constexpr, COMPUTE: tl.constexpr):
    """(sum over the window of x[c + j - BEHIND]^2, x[c]) for the channels c of a tile."""
    acc = tl.zeros((c.shape[0], x_pixels.shape[0]), COMPUTE)
    center = acc
    for j in tl.static_range(WINDOW):
        cj = c + (j - BEHIND)
        mask = ((cj >= 0) & (cj < channels))[:, None] & p_mask[None, :]
        v = tl.load(x_ptr + (x_base + cj[:, None] * x_channel_stride + x_pixels[None, :]), mask=mask,
                    other=0.0).to(COMPUTE)
        acc += v * v
        if j == BEHIND:
            center = v
    return acc, center


@triton.jit
def blend_store(ptr, offsets, mask, value, alpha, beta, HAS_BETA: tl.constexpr):
    out = value * alpha
    if HAS_BETA:
        out += beta * tl.load(ptr + offsets, mask=mask, other=0.0).to(value.dtype)
    tl.store(ptr + offsets, out.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def lrn_forward_kernel(
    x_ptr, y_ptr, x_batch_stride, y_batch_stride, x_channel_stride, y_channel_stride,
    pixel_sizes, pixel_x, pixel_y, channels, pixels, channel_blocks, pixel_blocks,
    k: tl.float64, scale: tl.float64, exponent: tl.float64, alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, BEHIND: tl.constexpr, PIXEL_DIMS: tl.constexpr, PIXEL_UNIT: tl.constexpr,
    HAS_BETA: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Program (sample, channel block, pixel block): y = x * (k + scale * window sum of x^2)^-exponent."""
    pid = tl.program_id(0).to(tl.int64)
    pb = pid % pixel_blocks
    rest = pid // pixel_blocks
    cb = rest % channel_blocks
    n = rest // channel_blocks
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = p < pixels
    x_pixels = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_x, PIXEL_UNIT)
    acc, center = window_sum_of_squares(x_ptr, n * x_batch_stride, x_channel_stride, x_pixels, channels, p_mask,
                                        c, WINDOW, BEHIND, COMPUTE)
    s = tl.cast(k, COMPUTE) + tl.cast(scale, COMPUTE) * acc
    y = center * power(s, -tl.cast(exponent, COMPUTE))
    mask = (c < channels)[:, None] & p_mask[None, :]
    y_offsets = n * y_batch_stride + c[:, None] * y_channel_stride + flat_offsets(
        p, PIXEL_DIMS, pixel_sizes, pixel_y, PIXEL_UNIT)[None, :]
    blend_store(y_ptr, y_offsets, mask, y, tl.cast(alpha, COMPUTE), tl.cast(beta, COMPUTE), HAS_BETA)


@triton.jit
def lrn_backward_kernel(
    x_ptr, dy_ptr, dx_ptr, scratch_ptr, batch_strides, x_channel_stride, dy_channel_stride, dx_channel_stride,
    pixel_sizes, pixel_x, pixel_dy, pixel_dx, channels, pixels, channel_blocks, pixel_blocks, tiles,
    k: tl.float64, scale: tl.float64, exponent: tl.float64, alpha: tl.float64, beta: tl.float64,
    WINDOW: tl.constexpr, BEHIND: tl.constexpr, PIXEL_DIMS: tl.constexpr, PIXEL_UNIT: tl.constexpr,
    HAS_BETA: tl.constexpr, COMPUTE: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Persistent program: tiles pid, pid + P, ...; each owns BLOCK_C - WINDOW + 1 output channels.
    Extended row i of a tile is channel c0 - AHEAD + i."""
    AHEAD: tl.constexpr = WINDOW - 1 - BEHIND
    OUT: tl.constexpr = BLOCK_C - WINDOW + 1
    lanes_c = tl.arange(0, BLOCK_C)
    lanes_p = tl.arange(0, BLOCK_P)
    slot = scratch_ptr + tl.program_id(0).to(tl.int64) * (2 * BLOCK_C * BLOCK_P)
    tile_index = lanes_c[:, None] * BLOCK_P + lanes_p[None, :]
    k = tl.cast(k, COMPUTE)
    scale = tl.cast(scale, COMPUTE)
    exponent = tl.cast(exponent, COMPUTE)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        pb = tile % pixel_blocks
        rest = tile // pixel_blocks
        cb = rest % channel_blocks
        n = (rest // channel_blocks).to(tl.int64)
        c0 = cb * OUT
        p = pb * BLOCK_P + lanes_p
        p_mask = p < pixels
        x_pixels = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_x, PIXEL_UNIT)
        dy_pixels = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_dy, PIXEL_UNIT)
        x_base = n * batch_strides[0]
        dy_base = n * batch_strides[1]

        extended = c0 - AHEAD + lanes_c
        acc, xe = window_sum_of_squares(x_ptr, x_base, x_channel_stride, x_pixels, channels, p_mask, extended,
                                        WINDOW, BEHIND, COMPUTE)
        s = k + scale * acc
        u = power(s, -exponent)
        e_mask = ((extended >= 0) & (extended < channels))[:, None] & p_mask[None, :]
        dye = tl.load(dy_ptr + (dy_base + extended[:, None] * dy_channel_stride + dy_pixels[None, :]), mask=e_mask,
                      other=0.0).to(COMPUTE)
        tl.store(slot + tile_index, dye * xe * u / s)
        tl.store(slot + BLOCK_C * BLOCK_P + tile_index, u)
        tl.debug_barrier()

        c = c0 + lanes_c
        out_mask = ((lanes_c < OUT) & (c < channels))[:, None] & p_mask[None, :]
        carried = tl.zeros((BLOCK_C, BLOCK_P), COMPUTE)
        for j in tl.static_range(WINDOW):
            row_mask = (lanes_c + j < BLOCK_C)[:, None] & out_mask
            carried += tl.load(slot + tile_index + j * BLOCK_P, mask=row_mask, other=0.0)
        uc = tl.load(slot + BLOCK_C * BLOCK_P + tile_index + AHEAD * BLOCK_P,
                     mask=(lanes_c + AHEAD < BLOCK_C)[:, None] & out_mask, other=0.0)
        xc = tl.load(x_ptr + (x_base + c[:, None] * x_channel_stride + x_pixels[None, :]), mask=out_mask,
                     other=0.0).to(COMPUTE)
        dyc = tl.load(dy_ptr + (dy_base + c[:, None] * dy_channel_stride + dy_pixels[None, :]), mask=out_mask,
                      other=0.0).to(COMPUTE)
        dx = dyc * uc - 2.0 * exponent * scale * xc * carried
        dx_offsets = n * batch_strides[2] + c[:, None] * dx_channel_stride + flat_offsets(
            p, PIXEL_DIMS, pixel_sizes, pixel_dx, PIXEL_UNIT)[None, :]
        blend_store(dx_ptr, dx_offsets, out_mask, dx, tl.cast(alpha, COMPUTE), tl.cast(beta, COMPUTE), HAS_BETA)
        tl.debug_barrier()  # the slot is rewritten by the next tile


@triton.jit
def element_offsets(plane, index, channels, strides, sizes):
    """Offset of spatial element ``index`` (flattened D, H, W) of plane (n * C + c), given the five
    strides (n, c, d, h, w) and the sizes (D, H, W)."""
    w = index % sizes[2]
    h = (index // sizes[2]) % sizes[1]
    d = index // (sizes[2] * sizes[1])
    return ((plane // channels) * strides[0] + (plane % channels) * strides[1] + d * strides[2]
            + h * strides[3] + w * strides[4])


@triton.jit
def divisive_kernel(
    x_ptr, means_ptr, dy_ptr, out_ptr, dmeans_ptr, temp_ptr, temp2_ptr,
    x_strides, means_strides, dy_strides, out_strides, dmeans_strides, temp_strides, temp2_strides,
    sizes, channels, spatial, n, k: tl.float64, scale: tl.float64, exponent: tl.float64,
    alpha: tl.float64, beta: tl.float64, PHASE: tl.constexpr, SPATIAL_DIMS: tl.constexpr, BEHIND: tl.constexpr,
    HAS_MEANS: tl.constexpr, HAS_DMEANS: tl.constexpr, HAS_BETA: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """PHASE "forward": y; "carry": temp and temp2; "gradient": dx (and dmeans). Program
    (plane, block) covers BLOCK spatial elements of one (sample, channel) plane."""
    plane = tl.program_id(0).to(tl.int64)
    index = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = index < spatial
    w = index % sizes[2]
    h = (index // sizes[2]) % sizes[1]
    d = index // (sizes[2] * sizes[1])
    if PHASE == "gradient":
        behind = n - 1 - BEHIND  # the mirrored window
    else:
        behind = BEHIND
    depth = 1
    depth_behind = 0
    if SPATIAL_DIMS == 3:
        depth = n
        depth_behind = behind
    acc = tl.zeros((BLOCK,), COMPUTE)
    for a in range(depth):
        for b in range(n):
            for e in range(n):
                dd = d + a - depth_behind
                hh = h + b - behind
                ww = w + e - behind
                inside = mask & (dd >= 0) & (dd < sizes[0]) & (hh >= 0) & (hh < sizes[1]) & (ww >= 0) & (ww < sizes[2])
                neighbour = (dd * sizes[1] + hh) * sizes[2] + ww
                if PHASE == "gradient":
                    acc += tl.load(temp_ptr + element_offsets(plane, neighbour, channels, temp_strides, sizes),
                                   mask=inside, other=0.0).to(COMPUTE)
                else:
                    v = centered(x_ptr, means_ptr, plane, neighbour, channels, x_strides, means_strides, sizes,
                                 inside, HAS_MEANS, COMPUTE)
                    acc += v * v
    center = centered(x_ptr, means_ptr, plane, index, channels, x_strides, means_strides, sizes, mask, HAS_MEANS,
                      COMPUTE)
    k = tl.cast(k, COMPUTE)
    scale = tl.cast(scale, COMPUTE)
    exponent = tl.cast(exponent, COMPUTE)
    alpha = tl.cast(alpha, COMPUTE)
    beta = tl.cast(beta, COMPUTE)
    if PHASE == "forward":
        y = center * power(k + scale * acc, -exponent)
        blend_store(out_ptr, element_offsets(plane, index, channels, out_strides, sizes), mask, y, alpha, beta,
                    HAS_BETA)
    elif PHASE == "carry":
        s = k + scale * acc
        u = power(s, -exponent)
        dy = tl.load(dy_ptr + element_offsets(plane, index, channels, dy_strides, sizes), mask=mask,
                     other=0.0).to(COMPUTE)
        tl.store(temp_ptr + element_offsets(plane, index, channels, temp_strides, sizes),
                 (dy * center * u / s).to(temp_ptr.dtype.element_ty), mask=mask)
        tl.store(temp2_ptr + element_offsets(plane, index, channels, temp2_strides, sizes),
                 u.to(temp2_ptr.dtype.element_ty), mask=mask)
    else:
        dy = tl.load(dy_ptr + element_offsets(plane, index, channels, dy_strides, sizes), mask=mask,
                     other=0.0).to(COMPUTE)
        u = tl.load(temp2_ptr + element_offsets(plane, index, channels, temp2_strides, sizes), mask=mask,
                    other=0.0).to(COMPUTE)
        dd = dy * u - 2.0 * exponent * scale * center * acc
        blend_store(out_ptr, element_offsets(plane, index, channels, out_strides, sizes), mask, dd, alpha, beta,
                    HAS_BETA)
        if HAS_DMEANS:
            blend_store(dmeans_ptr, element_offsets(plane, index, channels, dmeans_strides, sizes), mask, -dd,
                        alpha, beta, HAS_BETA)


@triton.jit
def centered(x_ptr, means_ptr, plane, index, channels, x_strides, means_strides, sizes, mask,
             HAS_MEANS: tl.constexpr, COMPUTE: tl.constexpr):
    """x - means at spatial element ``index`` of ``plane`` (0 where masked)."""
    v = tl.load(x_ptr + element_offsets(plane, index, channels, x_strides, sizes), mask=mask, other=0.0).to(COMPUTE)
    if HAS_MEANS:
        v -= tl.load(means_ptr + element_offsets(plane, index, channels, means_strides, sizes), mask=mask,
                     other=0.0).to(COMPUTE)
    return v


# the launchers -------------------------------------------------------------------------------------

def supports(problem: LRNProblem) -> str | None:
    return None


def run(problem: LRNProblem, x: Bound, y: Bound, means: Bound | None = None, dy: Bound | None = None,
        dmeans: Bound | None = None, temp: Bound | None = None, temp2: Bound | None = None) -> None:
    """Forward writes y; backward writes dx into ``y`` (and dmeans for divisive normalization)."""
    bounds = dict(x=x, out=y, means=means, dy=dy, dmeans=dmeans, temp=temp, temp2=temp2)
    given = tuple((name, bound.desc) for name, bound in bounds.items() if bound is not None)
    tensors = {name: torch_view(bounds[name]) for name, _ in given}
    device = tensors["x"].device
    lrn_launches(problem, given, (device.index or 0) if device.type == "cuda" else None)(tensors)


@functools.lru_cache(maxsize=256)
def lrn_launches(problem: LRNProblem, given: tuple[tuple[str, TensorDescriptor], ...],
                 device: int | None) -> Launches:
    """The launches computing ``problem`` on the tensors ``given`` as (name, descriptor) on CUDA device
    ``device`` (None: the interpreter), planned once."""
    descs = dict(given)
    if problem.divisive:
        return _divisive_launches(problem, descs)
    return _lrn_launches(problem, [descs[name] for name in (("x", "out") if "dy" not in descs else ("x", "dy", "out"))],
                         device)


def _scalars(problem: LRNProblem) -> tuple[float, ...]:
    desc = problem.desc
    return desc.k, problem.scale, desc.beta, problem.alpha, problem.beta


def _compute(problem: LRNProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32


def _scratch_dtype(problem: LRNProblem) -> Any:
    import torch

    return torch.float64 if problem.compute_dtype is DataType.DOUBLE else torch.float32


def _pixel_dims(descs: list[TensorDescriptor]) -> list[tuple[int, tuple[int, ...]]]:
    """The spatial dims (logical order) merged where contiguous for every operand."""
    dims = descs[0].dims
    merged: list[tuple[int, tuple[int, ...]]] = []
    for k in range(2, len(dims)):
        strides = tuple(d.strides[k] for d in descs)
        if dims[k] == 1:
            continue
        if merged and all(outer == s * dims[k] for outer, s in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * dims[k], strides)
        else:
            merged.append((dims[k], strides))
    return merged or [(1, (0,) * len(descs))]


def _lrn_launches(problem: LRNProblem, descs: list[TensorDescriptor], device: int | None) -> Launches:
    """descs: x and y (forward) or x, dy and dx (backward, dx in the "out" slot)."""
    x, out = descs[0], descs[-1]
    pixel_dims = _pixel_dims(descs)
    sizes = tuple(size for size, _ in pixel_dims)  # as long as the dims: each element is a kernel argument
    pixel_strides = [tuple(s[j] for _, s in pixel_dims) for j in range(len(descs))]
    pixels = math.prod(size for size, _ in pixel_dims)
    channels = x.dims[1]
    window = problem.desc.n
    channels_inner = x.strides[1] == 1 and channels > 1
    extended = channels + (window - 1 if problem.backward else 0)
    block_c = min(2 * CHANNEL_BLOCK if channels_inner else CHANNEL_BLOCK, triton.next_power_of_2(extended))
    block_c = max(block_c, triton.next_power_of_2(window)) if problem.backward else block_c
    block_p = min(TILE_ELEMENTS // block_c, triton.next_power_of_2(pixels))
    outputs = block_c - window + 1 if problem.backward else block_c
    channel_blocks, pixel_blocks = triton.cdiv(channels, outputs), triton.cdiv(pixels, block_p)
    unit = len(pixel_dims) == 1 and all(s == 1 for s in pixel_dims[0][1])
    flags = dict(WINDOW=window, BEHIND=problem.desc.lookbehind, PIXEL_DIMS=len(pixel_dims), PIXEL_UNIT=unit,
                 HAS_BETA=problem.beta != 0.0, COMPUTE=_compute(problem), BLOCK_C=block_c, BLOCK_P=block_p,
                 num_warps=max(1, min(8, block_c * block_p // 512)))
    tiles = x.dims[0] * channel_blocks * pixel_blocks
    if len(descs) == 2:
        return Launches((Launch(lrn_forward_kernel, (tiles,), (
            Slot("x"), Slot("out"), x.strides[0], out.strides[0], x.strides[1], out.strides[1], sizes,
            *pixel_strides, channels, pixels, channel_blocks, pixel_blocks, *_scalars(problem)), flags),))
    programs = min(tiles, 2 if device is None else PROGRAMS_PER_SM * multiprocessors(device))
    scratch = Scratch("scratch", programs * 2 * block_c * block_p, _scratch_dtype(problem))
    return Launches((Launch(lrn_backward_kernel, (programs,), (
        Slot("x"), Slot("dy"), Slot("out"), Slot("scratch"), tuple(d.strides[0] for d in descs), x.strides[1],
        descs[1].strides[1], out.strides[1], sizes, *pixel_strides, channels, pixels, channel_blocks, pixel_blocks,
        tiles, *_scalars(problem)), flags),), (scratch,))


def _divisive_launches(problem: LRNProblem, descs: dict[str, TensorDescriptor]) -> Launches:
    """The divisive normalization's phases; a backward's temp and temp2 are per-call scratch when not given."""
    x = descs["x"]
    scratch = tuple(Scratch(name, x.numel, _scratch_dtype(problem)) for name in ("temp", "temp2")
                    if problem.backward and name not in descs)
    strides = {name: desc.strides for name, desc in descs.items()}
    strides.update((array.name, packed_strides(x.dims)) for array in scratch)
    names = ("x", "means", "dy", "out", "dmeans", "temp", "temp2")
    pointers = [Slot(name if name in strides else "x") for name in names]
    dims = x.dims
    sizes = (1, *dims[2:]) if len(dims) == 4 else dims[2:]
    spatial = math.prod(sizes)
    grid = (dims[0] * dims[1], triton.cdiv(spatial, DIVISIVE_BLOCK))
    flags = dict(SPATIAL_DIMS=len(dims) - 2, BEHIND=problem.desc.lookbehind, HAS_MEANS="means" in descs,
                 HAS_DMEANS="dmeans" in descs, HAS_BETA=problem.beta != 0.0, COMPUTE=_compute(problem),
                 BLOCK=DIVISIVE_BLOCK, num_warps=4)
    arguments = (*pointers, *(_five_strides(strides.get(name, x.strides)) for name in names), sizes, dims[1],
                 spatial, problem.desc.n, *_scalars(problem))
    phases = ("carry", "gradient") if problem.backward else ("forward",)
    return Launches(tuple(Launch(divisive_kernel, grid, arguments, dict(PHASE=phase, **flags)) for phase in phases),
                    scratch)


def _five_strides(strides: tuple[int, ...]) -> tuple[int, ...]:
    """(n, c, d, h, w) strides of a 4-D or 5-D tensor (d stride 0 for 4-D)."""
    return strides if len(strides) == 5 else (strides[0], strides[1], 0, strides[2], strides[3])
