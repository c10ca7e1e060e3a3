"""Cross-channel LRN and divisive normalization (LCN), forward and backward.

Memory model (E elements of b bytes, window n): LRN forward reads x once and writes y once
(2 E b); backward reads x and dy and writes dx (3 E b). About 3n + 10 FLOPs per element: memory
bound if the instructions stay few. float32 64 x 256 x 56 x 56 (51.4 M elements) forward moves
411 MB: 98 us at 4.2 TB/s, bfloat16 49 us, in which the H200 issues about 30 (bf16) to 60 (fp32)
instructions per element: the kernels' budget (tl.log alone costs 20, a shifted reload 3 to 6).

LRN has two algorithms: channels-contiguous layouts take "vector" where ``VECTOR`` has an entry, the
others "stream" per ``STREAM`` (docs/design/lrn.md has the sweeps). s^-beta is
exp2(-beta * log2(s)) with the hardware's lg2.approx / ex2.approx (tl.log is a 20-instruction
polynomial): 2 MUFU ops per element forward, 3 backward (one log2, two exp2).

"stream", ``lrn_stream_kernel``: a program owns a block of pixels and walks a chunk of their channels
in groups of V (16 bytes of channels per thread if channels are contiguous, else 1) per loop step,
the [pixels, V] tile split into V register tensors. The window's lanes (x^2, and in backward x, dy,
s^-beta, t = dy x s^(-beta-1)) ride in loop-carried tuples: each window sum is an exact sum of n
registers, nothing is loaded twice (beyond a chunk's halo) and backward needs no scratch (step t
completes s for group t - LAG_S and the mirrored window of t for group t - LAG_S - LAG_D). DEPTH steps
of loads are in flight (prefetched into the tuple: Triton's pipeliner leaves such loads alone).

"vector", ``lrn_vector_kernel`` (channels stride 1): a program's tile is [(pixel, group) rows, V]
(16-byte groups, a warp's load 512 contiguous bytes); the groups around each row come from the tile
reloaded shifted by whole groups (aligned vectors, L1 hits; taking them from neighbouring warp lanes
by shfl.sync instead is no faster on the H200). Backward computes s and t on the n - 1 channels
around its groups as well: all in registers, one pass.

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

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.families.lrn.problem import LRNProblem
from opendnn.kernels import math as tm
from opendnn.kernels.indexing import flat_offsets
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

# The streaming kernel (lrn_stream_kernel) per (direction, channels-inner layout, 16-bit data): pixels
# per thread, warps, groups of loads in flight (depth), channels per program (chunk; 0: all) and the
# channel loop's unroll factor (unrolled, the register tuples' rotation is renaming instead of moves).
# Channels-inner layouts step V = 16 bytes of channels per thread, the others one channel. Programs are
# long (a channel walk): chunks trade the last wave's idle SMs against re-reading n - 1 halo channels.
# Each entry is the fastest stream variant of an H200 sweep (docs/design/lrn.md); channels-inner
# layouts take it only where VECTOR's entry is None.
STREAM = {
    ("forward", False, False): dict(pixels_per_thread=4, warps=1, depth=8, chunk=64, unroll=8),
    ("forward", False, True): dict(pixels_per_thread=4, warps=1, depth=4, chunk=128, unroll=8),
    ("forward", True, False): dict(pixels_per_thread=1, warps=2, depth=8, chunk=0, unroll=8),
    ("forward", True, True): dict(pixels_per_thread=1, warps=2, depth=4, chunk=64, unroll=8),
    ("backward", False, False): dict(pixels_per_thread=4, warps=1, depth=2, chunk=128, unroll=8),
    ("backward", False, True): dict(pixels_per_thread=4, warps=1, depth=4, chunk=64, unroll=8),
    ("backward", True, False): dict(pixels_per_thread=2, warps=2, depth=4, chunk=0, unroll=8),
    ("backward", True, True): dict(pixels_per_thread=1, warps=2, depth=8, chunk=0, unroll=8),
}
# Channels-contiguous layouts (channels stride 1) take ``lrn_vector_kernel`` where the entry of
# (direction, 16-bit data) is not None: rows (pixel, 16-byte channel group) per thread, warps, groups per
# program at most (the rest of its rows are pixels). H200, 64x256x56x56 n=5 (docs/design/lrn.md): forward fp32 /
# bf16 102.8 / 56.8 us, backward 147.7 (4 rows a thread) / 101.9 (2 rows).
VECTOR = {
    ("forward", False): dict(rows_per_thread=2, warps=4, groups=64),
    ("forward", True): dict(rows_per_thread=2, warps=4, groups=64),
    ("backward", False): dict(rows_per_thread=4, warps=4, groups=64),
    ("backward", True): dict(rows_per_thread=2, warps=4, groups=64),
}
DIVISIVE_BLOCK = 256


@triton.jit
def log_of(s, FAST: tl.constexpr):
    """log(s) for s > 0, in base 2 when FAST (float32 on a GPU: the hardware's lg2.approx, one
    instruction, where tl.log compiles to a polynomial of about 20), else in base e (the interpreter
    has no inline asm; float64 keeps its exact log). ``exp_of`` is its inverse."""
    if FAST:
        out = tm.log2_approx(s)
    else:
        out = tl.log(s)
    return out


@triton.jit
def exp_of(v, FAST: tl.constexpr):
    """2^v when FAST (ex2.approx), else e^v: the inverse of ``log_of``."""
    if FAST:
        out = tl.exp2(v)
    else:
        out = tl.exp(v)
    return out


@triton.jit
def power(s, exponent, FAST: tl.constexpr):
    """s ** exponent for s > 0."""
    return exp_of(log_of(s, FAST) * exponent, FAST)


@triton.jit
def tile_coordinates(tile, channel_blocks, pixel_blocks):
    """(sample (int64), channel block, pixel block) of a tile numbered pixel block fastest."""
    rest = tile // pixel_blocks
    return (rest // channel_blocks).to(tl.int64), rest % channel_blocks, tile % pixel_blocks


@triton.jit
def pixel_mask(p, pixels, EVEN_P: tl.constexpr):
    """p < pixels, or all true when the blocks divide the pixels (EVEN_P): no per-element predicate."""
    if EVEN_P:
        mask = tl.full(p.shape, True, tl.int1)
    else:
        mask = p < pixels
    return mask


@triton.jit
def blend_store(ptr, offsets, mask, value, alpha, beta, HAS_BETA: tl.constexpr):
    out = value * alpha
    if HAS_BETA:
        out += beta * tl.load(ptr + offsets, mask=mask, other=0.0).to(value.dtype)
    tl.store(ptr + offsets, out.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def split_lanes(tile, V: tl.constexpr):
    """The V columns (1, 2, 4 or 8, held by one thread) of a [P, V] tile as a tuple of [P] tensors."""
    P: tl.constexpr = tile.shape[0]
    if V == 1:
        lanes = (tl.reshape(tile, [P]),)
    else:
        even, odd = tl.split(tl.reshape(tile, [P, V // 2, 2]))
        if V == 2:
            lanes = (tl.reshape(even, [P]), tl.reshape(odd, [P]))
        else:
            e0, e2 = tl.split(tl.reshape(even, [P, V // 4, 2]))  # lanes 0 (4), 2 (6)
            o1, o3 = tl.split(tl.reshape(odd, [P, V // 4, 2]))  # lanes 1 (5), 3 (7)
            if V == 4:
                lanes = (tl.reshape(e0, [P]), tl.reshape(o1, [P]), tl.reshape(e2, [P]), tl.reshape(o3, [P]))
            else:
                l0, l4 = tl.split(e0)
                l2, l6 = tl.split(e2)
                l1, l5 = tl.split(o1)
                l3, l7 = tl.split(o3)
                lanes = (l0, l1, l2, l3, l4, l5, l6, l7)
    return lanes


@triton.jit
def join_lanes(lanes, V: tl.constexpr):
    """``split_lanes``'s inverse: the [P, V] tile of V [P] tensors."""
    P: tl.constexpr = lanes[0].shape[0]
    if V == 1:
        tile = tl.reshape(lanes[0], [P, 1])
    elif V == 2:
        tile = tl.join(lanes[0], lanes[1])
    elif V == 4:
        tile = tl.reshape(tl.join(tl.join(lanes[0], lanes[2]), tl.join(lanes[1], lanes[3])), [P, 4])
    else:
        even = tl.reshape(tl.join(tl.join(lanes[0], lanes[4]), tl.join(lanes[2], lanes[6])), [P, 4])
        odd = tl.reshape(tl.join(tl.join(lanes[1], lanes[5]), tl.join(lanes[3], lanes[7])), [P, 4])
        tile = tl.reshape(tl.join(even, odd), [P, 8])
    return tile


@triton.jit
def load_group(ptr, offsets, group, last, channels, p_mask, V: tl.constexpr, COMPUTE: tl.constexpr):
    """Channels group * V + (0..V-1) of a [P, V] tile (zeros outside 0..channels-1 and past group ``last``)
    as a tuple of V [P] tensors."""
    c = group * V + tl.arange(0, V)
    mask = ((c >= 0) & (c < channels) & (group <= last))[None, :] & p_mask[:, None]
    return split_lanes(tl.load(ptr + offsets, mask=mask, other=0.0).to(COMPUTE), V)


@triton.jit
def window_sums(values, V: tl.constexpr, WINDOW: tl.constexpr):
    """(values[r] + ... + values[r + WINDOW - 1] for r < V): exact window sums of register lanes."""
    sums = ()
    for r in tl.static_range(V):
        acc = values[r]
        for j in tl.static_range(1, WINDOW):
            acc += values[r + j]
        sums = sums + (acc,)
    return sums


@triton.jit
def lrn_stream_kernel(
    x_ptr,
    dy_ptr,
    out_ptr,
    batch_strides,
    channel_strides,
    pixel_sizes,
    pixel_x,
    pixel_dy,
    pixel_out,
    channels,
    pixels,
    pixel_blocks,
    chunks,
    chunk_groups,
    k: tl.float64,
    scale: tl.float64,
    exponent: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    WINDOW: tl.constexpr,
    BEHIND: tl.constexpr,
    BACKWARD: tl.constexpr,
    PIXEL_DIMS: tl.constexpr,
    PIXEL_UNIT: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    FAST: tl.constexpr,
    WIDE: tl.constexpr,
    EVEN_P: tl.constexpr,
    V: tl.constexpr,
    DEPTH: tl.constexpr,
    UNROLL: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Program (sample, channel chunk, pixel block) walks its chunk's channels in groups of V (V
    channels of BLOCK_P pixels per step), keeping the window's lanes in registers (tuples of [P]
    tensors) and DEPTH groups of loads in flight; each element is read once. Forward, at step t:
    group t's x^2 complete the window of group t - LAG_S, whose y is stored. Backward: group
    t - LAG_S gets s, s^-beta and t = dy x s^(-beta-1), group t - LAG_S - LAG_D (whose mirrored
    window of t is then complete) gets dx. A chunk starts HALO groups early for its windows."""
    AHEAD: tl.constexpr = WINDOW - 1 - BEHIND
    LAG_S: tl.constexpr = (AHEAD + V - 1) // V
    LAG_D: tl.constexpr = (BEHIND + V - 1) // V if BACKWARD else 0
    HALO: tl.constexpr = (WINDOW - 1 + V - 1) // V if BACKWARD else (BEHIND + V - 1) // V
    n, chunk, pb = tile_coordinates(tl.program_id(0), chunks, pixel_blocks)
    p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = pixel_mask(p, pixels, EVEN_P)
    lanes = tl.arange(0, V)
    if WIDE:
        lanes = lanes.to(tl.int64)
    x_tile = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_x, PIXEL_UNIT)[:, None] + lanes * channel_strides[0]
    dy_tile = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_dy, PIXEL_UNIT)[:, None] + lanes * channel_strides[1]
    out_tile = flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_out, PIXEL_UNIT)[:, None] + lanes * channel_strides[2]
    x_ptr += n * batch_strides[0]
    dy_ptr += n * batch_strides[1]
    out_ptr += n * batch_strides[2]
    k = tl.cast(k, COMPUTE)
    scale = tl.cast(scale, COMPUTE)
    exponent = tl.cast(exponent, COMPUTE)
    alpha = tl.cast(alpha, COMPUTE)
    beta = tl.cast(beta, COMPUTE)

    first = chunk * chunk_groups  # the chunk's first output group
    start = first - HALO
    last = tl.minimum(first + chunk_groups, tl.cdiv(channels, V)) - 1 + LAG_S + LAG_D  # the last group loaded
    x_step = V * channel_strides[0]
    dy_step = V * channel_strides[1]
    out_step = V * channel_strides[2]
    if WIDE:
        x_step = x_step.to(tl.int64)
        dy_step = dy_step.to(tl.int64)
        out_step = out_step.to(tl.int64)
    zero = tl.zeros((BLOCK_P,), COMPUTE)
    x_pending = ()
    dy_pending = ()
    for d in tl.static_range(DEPTH):
        x_pending = x_pending + (
            load_group(x_ptr, x_tile + (start + d) * x_step, start + d, last, channels, p_mask, V, COMPUTE),
        )
        if BACKWARD:
            dy_pending = dy_pending + (
                load_group(dy_ptr, dy_tile + (start + d) * dy_step, start + d, last, channels, p_mask, V, COMPUTE),
            )
    squares = (zero,) * (LAG_S * V + BEHIND)  # channels from (t - LAG_S) * V - BEHIND
    xs = (zero,) * ((LAG_S + LAG_D) * V)  # channels from (t - LAG_S - LAG_D) * V
    dys = (zero,) * ((LAG_S + LAG_D) * V)
    us = (zero,) * (LAG_D * V)  # s^-beta, channels from (t - LAG_S - LAG_D) * V
    ts = (zero,) * (LAG_D * V + AHEAD)  # dy x s^(-beta-1), channels from (t - LAG_S - LAG_D) * V - AHEAD
    for t in tl.range(start, last + 1, loop_unroll_factor=UNROLL):
        fresh = x_pending[0]
        x_pending = x_pending[1:] + (
            load_group(x_ptr, x_tile + (t + DEPTH) * x_step, t + DEPTH, last, channels, p_mask, V, COMPUTE),
        )
        xs = xs + fresh
        for r in tl.static_range(V):
            squares = squares + (fresh[r] * fresh[r],)
        sums = window_sums(squares, V, WINDOW)
        squares = squares[V:]
        if BACKWARD:
            dys = dys + dy_pending[0]
            dy_pending = dy_pending[1:] + (
                load_group(dy_ptr, dy_tile + (t + DEPTH) * dy_step, t + DEPTH, last, channels, p_mask, V, COMPUTE),
            )
            for r in tl.static_range(V):
                log_s = log_of(k + scale * sums[r], FAST)
                us = us + (exp_of(log_s * -exponent, FAST),)
                # group t - LAG_S's lane r is at LAG_D * V + r in xs and dys
                ts = ts + (dys[LAG_D * V + r] * xs[LAG_D * V + r] * exp_of(log_s * (-exponent - 1.0), FAST),)
            carried = window_sums(ts, V, WINDOW)
            results = ()
            for r in tl.static_range(V):
                results = results + (dys[r] * us[r] - 2.0 * exponent * scale * xs[r] * carried[r],)
            us = us[V:]
            ts = ts[V:]
            dys = dys[V:]
        else:
            results = ()
            for r in tl.static_range(V):
                results = results + (xs[r] * power(k + scale * sums[r], -exponent, FAST),)
        xs = xs[V:]
        group = t - LAG_S - LAG_D
        c = group * V + lanes
        mask = ((c < channels) & (group >= first))[None, :] & p_mask[:, None]
        blend_store(out_ptr, out_tile + group * out_step, mask, join_lanes(results, V), alpha, beta, HAS_BETA)


@triton.jit
def group_lanes(ptr, tile, center, SHIFT: tl.constexpr, step, mask, COMPUTE: tl.constexpr, V: tl.constexpr):
    """The V lanes of the groups SHIFT groups after each row's (zeros outside ``mask``): the ``center``
    lanes (SHIFT 0) or the tile reloaded SHIFT groups on."""
    if SHIFT == 0:
        out = center
    else:
        out = split_lanes(tl.load(ptr + tile + SHIFT * step, mask=mask, other=0.0).to(COMPUTE), V)
    return out


@triton.jit
def lrn_vector_kernel(
    x_ptr,
    dy_ptr,
    out_ptr,
    batch_strides,
    channel_strides,
    pixel_sizes,
    pixel_x,
    pixel_dy,
    pixel_out,
    channels,
    pixels,
    pixel_blocks,
    group_blocks,
    k: tl.float64,
    scale: tl.float64,
    exponent: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    WINDOW: tl.constexpr,
    BEHIND: tl.constexpr,
    BACKWARD: tl.constexpr,
    PIXEL_DIMS: tl.constexpr,
    PIXEL_UNIT: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    FAST: tl.constexpr,
    WIDE: tl.constexpr,
    EVEN_P: tl.constexpr,
    V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Channels contiguous: program (sample, group block, pixel block) owns BLOCK_G groups of V channels of
    BLOCK_P pixels, a [BLOCK_P * BLOCK_G, V] tile whose consecutive rows are a pixel's consecutive groups.
    SPAN tiles shifted by whole groups from -HALO (``group_lanes``) are split into registers: every window
    sum is a sum of n registers. Backward computes s and t on the n - 1 channels around its groups too."""
    AHEAD: tl.constexpr = WINDOW - 1 - BEHIND
    HALO: tl.constexpr = (WINDOW - 1 + V - 1) // V if BACKWARD else (BEHIND + V - 1) // V
    SPAN: tl.constexpr = 2 * HALO + 1 if BACKWARD else HALO + 1 + (AHEAD + V - 1) // V
    CENTER: tl.constexpr = HALO * V  # lane of the tile's first channel in the concatenated shifted tiles
    n, gb, pb = tile_coordinates(tl.program_id(0), group_blocks, pixel_blocks)
    rows = tl.arange(0, BLOCK_P * BLOCK_G)
    p = pb * BLOCK_P + rows // BLOCK_G
    group = gb * BLOCK_G + rows % BLOCK_G
    p_mask = pixel_mask(p, pixels, EVEN_P)
    lanes = tl.arange(0, V)
    if WIDE:
        group = group.to(tl.int64)
    x_tile = (
        flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_x, PIXEL_UNIT)[:, None]
        + (group[:, None] * V + lanes) * channel_strides[0]
    )
    dy_tile = (
        flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_dy, PIXEL_UNIT)[:, None]
        + (group[:, None] * V + lanes) * channel_strides[1]
    )
    out_tile = (
        flat_offsets(p, PIXEL_DIMS, pixel_sizes, pixel_out, PIXEL_UNIT)[:, None]
        + (group[:, None] * V + lanes) * channel_strides[2]
    )
    x_ptr += n * batch_strides[0]
    dy_ptr += n * batch_strides[1]
    out_ptr += n * batch_strides[2]
    k = tl.cast(k, COMPUTE)
    scale = tl.cast(scale, COMPUTE)
    exponent = tl.cast(exponent, COMPUTE)
    c = group[:, None] * V + lanes
    mask = (c < channels) & p_mask[:, None]
    x_center = split_lanes(tl.load(x_ptr + x_tile, mask=mask, other=0.0).to(COMPUTE), V)
    dy_center = x_center
    if BACKWARD:
        dy_center = split_lanes(tl.load(dy_ptr + dy_tile, mask=mask, other=0.0).to(COMPUTE), V)
    xs = ()
    dys = ()
    for j in tl.static_range(SPAN):
        shifted = (group[:, None] + (j - HALO)) * V + lanes
        shifted_mask = (shifted >= 0) & (shifted < channels) & p_mask[:, None]
        xs = xs + group_lanes(x_ptr, x_tile, x_center, j - HALO, V * channel_strides[0], shifted_mask, COMPUTE, V)
        if BACKWARD:
            dys = dys + group_lanes(
                dy_ptr, dy_tile, dy_center, j - HALO, V * channel_strides[1], shifted_mask, COMPUTE, V
            )
    squares = ()
    for r in tl.static_range(SPAN * V):
        squares = squares + (xs[r] * xs[r],)
    results = ()
    if BACKWARD:
        # s and t on channels CENTER - AHEAD .. CENTER + V - 1 + BEHIND, s^-beta on the tile's V
        sums = window_sums(squares[CENTER - AHEAD - BEHIND :], V + WINDOW - 1, WINDOW)
        ts = ()
        us = ()
        for i in tl.static_range(V + WINDOW - 1):
            log_s = log_of(k + scale * sums[i], FAST)
            ts = ts + (dys[CENTER - AHEAD + i] * xs[CENTER - AHEAD + i] * exp_of(log_s * (-exponent - 1.0), FAST),)
            if i >= AHEAD and i < AHEAD + V:
                us = us + (exp_of(log_s * -exponent, FAST),)
        carried = window_sums(ts, V, WINDOW)
        for r in tl.static_range(V):
            results = results + (dys[CENTER + r] * us[r] - 2.0 * exponent * scale * xs[CENTER + r] * carried[r],)
    else:
        sums = window_sums(squares[CENTER - BEHIND :], V, WINDOW)
        for r in tl.static_range(V):
            results = results + (xs[CENTER + r] * power(k + scale * sums[r], -exponent, FAST),)
    blend_store(
        out_ptr, out_tile, mask, join_lanes(results, V), tl.cast(alpha, COMPUTE), tl.cast(beta, COMPUTE), HAS_BETA
    )


@triton.jit
def element_offsets(plane, index, channels, strides, sizes):
    """Offset of spatial element ``index`` (flattened D, H, W) of plane (n * C + c), given the five
    strides (n, c, d, h, w) and the sizes (D, H, W)."""
    w = index % sizes[2]
    h = (index // sizes[2]) % sizes[1]
    d = index // (sizes[2] * sizes[1])
    return (
        (plane // channels) * strides[0]
        + (plane % channels) * strides[1]
        + d * strides[2]
        + h * strides[3]
        + w * strides[4]
    )


@triton.jit
def divisive_kernel(
    x_ptr,
    means_ptr,
    dy_ptr,
    out_ptr,
    dmeans_ptr,
    temp_ptr,
    temp2_ptr,
    x_strides,
    means_strides,
    dy_strides,
    out_strides,
    dmeans_strides,
    temp_strides,
    temp2_strides,
    sizes,
    channels,
    spatial,
    n,
    k: tl.float64,
    scale: tl.float64,
    exponent: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    PHASE: tl.constexpr,
    SPATIAL_DIMS: tl.constexpr,
    BEHIND: tl.constexpr,
    HAS_MEANS: tl.constexpr,
    HAS_DMEANS: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
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
                    acc += tl.load(
                        temp_ptr + element_offsets(plane, neighbour, channels, temp_strides, sizes),
                        mask=inside,
                        other=0.0,
                    ).to(COMPUTE)
                else:
                    v = centered(
                        x_ptr,
                        means_ptr,
                        plane,
                        neighbour,
                        channels,
                        x_strides,
                        means_strides,
                        sizes,
                        inside,
                        HAS_MEANS,
                        COMPUTE,
                    )
                    acc += v * v
    center = centered(
        x_ptr, means_ptr, plane, index, channels, x_strides, means_strides, sizes, mask, HAS_MEANS, COMPUTE
    )
    k = tl.cast(k, COMPUTE)
    scale = tl.cast(scale, COMPUTE)
    exponent = tl.cast(exponent, COMPUTE)
    alpha = tl.cast(alpha, COMPUTE)
    beta = tl.cast(beta, COMPUTE)
    if PHASE == "forward":
        y = center * power(k + scale * acc, -exponent, False)
        blend_store(
            out_ptr, element_offsets(plane, index, channels, out_strides, sizes), mask, y, alpha, beta, HAS_BETA
        )
    elif PHASE == "carry":
        s = k + scale * acc
        u = power(s, -exponent, False)
        dy = tl.load(dy_ptr + element_offsets(plane, index, channels, dy_strides, sizes), mask=mask, other=0.0).to(
            COMPUTE
        )
        tl.store(
            temp_ptr + element_offsets(plane, index, channels, temp_strides, sizes),
            (dy * center * u / s).to(temp_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(
            temp2_ptr + element_offsets(plane, index, channels, temp2_strides, sizes),
            u.to(temp2_ptr.dtype.element_ty),
            mask=mask,
        )
    else:
        dy = tl.load(dy_ptr + element_offsets(plane, index, channels, dy_strides, sizes), mask=mask, other=0.0).to(
            COMPUTE
        )
        u = tl.load(temp2_ptr + element_offsets(plane, index, channels, temp2_strides, sizes), mask=mask, other=0.0).to(
            COMPUTE
        )
        dd = dy * u - 2.0 * exponent * scale * center * acc
        blend_store(
            out_ptr, element_offsets(plane, index, channels, out_strides, sizes), mask, dd, alpha, beta, HAS_BETA
        )
        if HAS_DMEANS:
            blend_store(
                dmeans_ptr,
                element_offsets(plane, index, channels, dmeans_strides, sizes),
                mask,
                -dd,
                alpha,
                beta,
                HAS_BETA,
            )


@triton.jit
def centered(
    x_ptr,
    means_ptr,
    plane,
    index,
    channels,
    x_strides,
    means_strides,
    sizes,
    mask,
    HAS_MEANS: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """x - means at spatial element ``index`` of ``plane`` (0 where masked)."""
    v = tl.load(x_ptr + element_offsets(plane, index, channels, x_strides, sizes), mask=mask, other=0.0).to(COMPUTE)
    if HAS_MEANS:
        v -= tl.load(
            means_ptr + element_offsets(plane, index, channels, means_strides, sizes), mask=mask, other=0.0
        ).to(COMPUTE)
    return v


# the launchers -------------------------------------------------------------------------------------


def supports(problem: LRNProblem) -> str | None:
    return None


def run(
    problem: LRNProblem,
    x: Bound,
    y: Bound,
    means: Bound | None = None,
    dy: Bound | None = None,
    dmeans: Bound | None = None,
    temp: Bound | None = None,
    temp2: Bound | None = None,
) -> None:
    """Forward writes y; backward writes dx into ``y`` (and dmeans for divisive normalization)."""
    bounds = dict(x=x, out=y, means=means, dy=dy, dmeans=dmeans, temp=temp, temp2=temp2)
    present = {name: bound for name, bound in bounds.items() if bound is not None}
    given = tuple((name, bound.desc) for name, bound in present.items())
    tensors = {name: torch_view(bound) for name, bound in present.items()}
    device = tensors["x"].device
    lrn_launches(problem, given, (device.index or 0) if device.type == "cuda" else None)(tensors)


@functools.lru_cache(maxsize=256)
def lrn_launches(problem: LRNProblem, given: tuple[tuple[str, TensorDescriptor], ...], device: int | None) -> Launches:
    """The launches computing ``problem`` on the tensors ``given`` as (name, descriptor) on CUDA device
    ``device`` (None: the interpreter), planned once."""
    descs = dict(given)
    if problem.divisive:
        return _divisive_launches(problem, descs)
    return _lrn_launches(
        problem, [descs[name] for name in (("x", "out") if "dy" not in descs else ("x", "dy", "out"))], device
    )


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
    channels_inner = descs[0].strides[1] == 1 and descs[0].dims[1] > 1
    direction = "backward" if problem.backward else "forward"
    narrow = max(d.dtype.itemsize for d in descs) <= 2
    if channels_inner and VECTOR[direction, narrow] is not None:
        return _vector_launches(problem, descs, _pixel_dims(descs), VECTOR[direction, narrow], device)
    return _stream_launches(
        problem, descs, _pixel_dims(descs), STREAM[direction, channels_inner, narrow], channels_inner, device
    )


def _stream_launches(
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    config: dict[str, int],
    channels_inner: bool,
    device: int | None,
) -> Launches:
    """One ``lrn_stream_kernel`` launch; descs: x and y, or x, dy and dx."""
    pixels = math.prod(size for size, _ in pixel_dims)
    channels = descs[0].dims[1]
    vector = min(8, max(1, 16 // max(d.dtype.itemsize for d in descs))) if channels_inner else 1
    vector = min(vector, triton.next_power_of_2(channels))
    # twice the registers per pixel (windows over 8, float64): half the pixels per thread
    halvings = (problem.desc.n > 8) + (problem.compute_dtype is DataType.DOUBLE)
    per_thread = max(1, config["pixels_per_thread"] >> halvings) if device is not None else 1
    warps = config["warps"] if device is not None else 1
    block_p = min(32 * warps * per_thread, triton.next_power_of_2(pixels))
    groups = triton.cdiv(channels, vector)
    chunk_groups = groups if not config["chunk"] else min(groups, max(1, config["chunk"] // vector))
    chunks = triton.cdiv(groups, chunk_groups)
    pixel_blocks = triton.cdiv(pixels, block_p)
    return _channel_launch(
        lrn_stream_kernel,
        problem,
        descs,
        pixel_dims,
        device,
        pixel_blocks * chunks,
        (pixel_blocks, chunks, chunk_groups),
        vector * (config["depth"] + 2) + problem.desc.n,
        EVEN_P=pixels % block_p == 0,
        V=vector,
        DEPTH=config["depth"],
        UNROLL=config["unroll"],
        BLOCK_P=block_p,
        num_warps=max(1, min(warps, block_p // 32)),
    )


def _vector_launches(
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    config: dict[str, Any],
    device: int | None,
) -> Launches:
    """One ``lrn_vector_kernel`` launch (channels stride 1); descs: x and y, or x, dy and dx."""
    pixels = math.prod(size for size, _ in pixel_dims)
    channels = descs[0].dims[1]
    vector = min(max(1, 16 // max(d.dtype.itemsize for d in descs)), triton.next_power_of_2(channels))
    groups = triton.cdiv(channels, vector)
    block_g = min(triton.next_power_of_2(groups), config["groups"])
    rows = 32 * config["warps"] * config["rows_per_thread"] if device is not None else 32
    block_p = min(max(1, rows // block_g), triton.next_power_of_2(pixels))
    pixel_blocks, group_blocks = triton.cdiv(pixels, block_p), triton.cdiv(groups, block_g)
    return _channel_launch(
        lrn_vector_kernel,
        problem,
        descs,
        pixel_dims,
        device,
        pixel_blocks * group_blocks,
        (pixel_blocks, group_blocks),
        problem.desc.n + 2 * vector,
        EVEN_P=pixels % block_p == 0,
        V=vector,
        BLOCK_P=block_p,
        BLOCK_G=block_g,
        num_warps=max(1, min(config["warps"], block_p * block_g // 32)) if device is not None else 1,
    )


def _channel_launch(
    kernel: Any,
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    device: int | None,
    blocks: int,
    block_args: tuple[int, ...],
    reach: int,
    **flags: Any,
) -> Launches:
    """One launch of ``kernel`` (``lrn_stream_kernel`` or ``lrn_vector_kernel``: the same leading arguments) over
    ``blocks`` programs per sample; ``reach``: how many channels past a sample its offsets may go."""
    x = descs[0]
    operands = [x, descs[1] if problem.backward else x, descs[-1]]
    strides = [tuple(s[j] for _, s in pixel_dims) for j in range(len(descs))]
    pixel_strides = strides if problem.backward else [strides[0], strides[0], strides[1]]
    compute = _compute(problem)
    flags.update(
        WINDOW=problem.desc.n,
        BEHIND=problem.desc.lookbehind,
        BACKWARD=problem.backward,
        PIXEL_DIMS=len(pixel_dims),
        PIXEL_UNIT=len(pixel_dims) == 1 and all(s == 1 for s in pixel_dims[0][1]),
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=compute,
        FAST=device is not None and compute == tl.float32,
        WIDE=max(_sample_extent(d) + reach * abs(d.strides[1]) for d in operands) >= 2**31,
    )
    tensors = (Slot("x"), Slot("dy") if problem.backward else Slot("x"), Slot("out"))
    return Launches(
        (
            Launch(
                kernel,
                (x.dims[0] * blocks,),
                (
                    *tensors,
                    tuple(d.strides[0] for d in operands),
                    tuple(d.strides[1] for d in operands),
                    tuple(size for size, _ in pixel_dims),
                    *pixel_strides,
                    x.dims[1],
                    math.prod(size for size, _ in pixel_dims),
                    *block_args,
                    *_scalars(problem),
                ),
                flags,
            ),
        )
    )


def _sample_extent(desc: TensorDescriptor) -> int:
    """The largest element offset within one sample (dims 1..), plus one."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(desc.dims[1:], desc.strides[1:]))


def _divisive_launches(problem: LRNProblem, descs: dict[str, TensorDescriptor]) -> Launches:
    """The divisive normalization's phases; a backward's temp and temp2 are per-call scratch when not given."""
    x = descs["x"]
    scratch = tuple(
        Scratch(name, x.numel, _scratch_dtype(problem))
        for name in ("temp", "temp2")
        if problem.backward and name not in descs
    )
    strides = {name: desc.strides for name, desc in descs.items()}
    strides.update((array.name, packed_strides(x.dims)) for array in scratch)
    names = ("x", "means", "dy", "out", "dmeans", "temp", "temp2")
    pointers = [Slot(name if name in strides else "x") for name in names]
    dims = x.dims
    sizes = (1, *dims[2:]) if len(dims) == 4 else dims[2:]
    spatial = math.prod(sizes)
    grid = (dims[0] * dims[1], triton.cdiv(spatial, DIVISIVE_BLOCK))
    flags = dict(
        SPATIAL_DIMS=len(dims) - 2,
        BEHIND=problem.desc.lookbehind,
        HAS_MEANS="means" in descs,
        HAS_DMEANS="dmeans" in descs,
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=_compute(problem),
        BLOCK=DIVISIVE_BLOCK,
        num_warps=4,
    )
    arguments = (
        *pointers,
        *(_five_strides(strides.get(name, x.strides)) for name in names),
        sizes,
        dims[1],
        spatial,
        problem.desc.n,
        *_scalars(problem),
    )
    phases = ("carry", "gradient") if problem.backward else ("forward",)
    return Launches(
        tuple(Launch(divisive_kernel, grid, arguments, dict(PHASE=phase, **flags)) for phase in phases), scratch
    )


def _five_strides(strides: tuple[int, ...]) -> tuple[int, ...]:
    """(n, c, d, h, w) strides of a 4-D or 5-D tensor (d stride 0 for 4-D)."""
    return strides if len(strides) == 5 else (strides[0], strides[1], 0, strides[2], strides[3])
