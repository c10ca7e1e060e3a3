"""The Triton kernels of LRN across channels (streamed and channel-vector forms, forward and
backward) and of divisive normalization; ``triton_backend`` plans and launches them."""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.kernels import math as tm
from opendnn.kernels.blend import blend_store
from opendnn.kernels.indexing import flat_offsets


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
