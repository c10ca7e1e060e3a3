"""Depthwise backward filter on channels-last tensors: one reduced channel per group, any channel
multiplier KG, filters of any height and depth and a width of ``WIDTH`` taps (a constant: one compiled
kernel per width).

dw[k, t, r, s] = sum over output pixels (n, o_d, o_h, o_w) of dy[n, o_d, o_h, o_w, k] *
x[n, o_d * sd + t * dil_d - pad_d, o_h * sh + r * dil_h - pad_h, o_w * sw + s * dil_w - pad_w, k // KG].

A program owns BLOCK_N channels (contiguous in NHWC: a thread holds a short vector of them), a block of
FILTER_ROWS rows (t, r) of the filter and a slice of the output rows (n, o_d, o_h flattened), BLOCK_ROWS
output rows at a time, one a thread along the channels. For each filter row every thread walks its
output row along o_w, WIDTH steps unrolled at a time: per step it loads dy once and the x elements that
enter the filter row's window (one at stride 1), converts each to float32 once, and adds the products of
dy with the window's WIDTH values into WIDTH per-tap sums. The window is a ring of WIDTH registers a
channel whose slots the unrolled steps name as constants (no moves); the sums, FILTER_ROWS x WIDTH a
channel, stay in each thread's registers until the slice ends, then are added across the program's rows
once. Slices write partial sums to the workspace, which ``filter_sum_kernel`` adds in a fixed order.

Walking o_w by 1 moves the window by ``sw`` taps when the dilation is 1. In general the walk takes
o_w = phase, phase + STEP, ... (STEP = dil_w / gcd(sw, dil_w)) for each phase below STEP, which moves
the window by SHIFT = sw / gcd(sw, dil_w) taps a step (SHIFT new loads a step; SHIFT is a constant of
the kernel: 1 at stride 1, 2 at stride 2).

The walk waits on its loads (few warps a scheduler, a memory round trip a group of WIDTH steps). With
``AHEAD`` a group's loads (``group_loads``) go out before the previous group's FMAs, so one round trip
hides behind a group's work; they stay in their own dtype in registers until used (WIDTH * (SHIFT + 1)
vectors a thread), which the planner allows where it does not spill.

Traffic: x and dy read about once from DRAM per filter-row block, dy re-read from L1 per filter row;
2 * taps FLOPs per dy element, FILTER_ROWS x WIDTH FMAs per loaded dy vector element.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.convolution.triton_direct import store_filter


@triton.jit
def replaced(values, index: tl.constexpr, value):
    """``values`` with element ``index`` set to ``value``."""
    return values[:index] + (value,) + values[index + 1 :]


@triton.jit
def group_loads(x_rows, dy_rows, x_mask, dy_mask, o_w0, walk, WIDTH: tl.constexpr, SHIFT: tl.constexpr):
    """The loads of the WIDTH steps from o_w = o_w0 (masked past the row's end), in the tensors' own
    dtypes: the SHIFT x columns that enter the window a step (WIDTH * SHIFT, step-major) and the steps'
    dy (WIDTH). ``walk``: (x_sw, dy_sw, OW, XW, sw, dil_w, pad_w, STEP)."""
    x_sw, dy_sw, OW, XW, sw, dil_w, pad_w, STEP = walk
    xs = (tl.zeros_like(x_mask).to(x_rows.dtype.element_ty),) * (WIDTH * SHIFT)
    dys = (tl.zeros_like(dy_mask).to(dy_rows.dtype.element_ty),) * WIDTH
    for u in tl.static_range(WIDTH):
        o_w = o_w0 + u * STEP
        for tap in tl.static_range(SHIFT):
            i_w = o_w * sw + (WIDTH - SHIFT + tap) * dil_w - pad_w
            x = tl.load(x_rows + i_w * x_sw, mask=x_mask & (i_w >= 0) & (i_w < XW), other=0.0)
            xs = replaced(xs, u * SHIFT + tap, x)
        dys = replaced(dys, u, tl.load(dy_rows + o_w * dy_sw, mask=dy_mask & (o_w < OW), other=0.0))
    return xs, dys


@triton.jit
def filter_depthwise_rows_kernel(
    x_ptr,
    dy_ptr,
    dw_ptr,
    partial_ptr,
    x_sn,
    x_sc,
    x_sd,
    x_sh,
    x_sw,
    dy_sn,
    dy_sc,
    dy_sd,
    dy_sh,
    dy_sw,
    w_sk,
    w_sc,
    w_st,
    w_sr,
    w_ss,
    ROWS,
    OD,
    OH,
    OW,
    XD,
    XH,
    XW,
    K,
    KG,
    T,
    R,
    pad_d,
    pad_h,
    pad_w,
    sd,
    sh,
    sw,
    dil_d,
    dil_h,
    dil_w,
    STEP,
    slice_rows,
    alpha: tl.float64,
    beta: tl.float64,
    FLIP: tl.constexpr,
    PARTIAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    WIDTH: tl.constexpr,
    SHIFT: tl.constexpr,
    AHEAD: tl.constexpr,
    FILTER_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (channel block, filter-row block, slice): dw[k, t, r, :] for BLOCK_N channels k and
    FILTER_ROWS filter rows (t, r), summed over output rows [split * slice_rows, (split + 1) *
    slice_rows) of the ROWS = N * OD * OH."""
    k = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    first_filter_row = tl.program_id(1) * FILTER_ROWS
    split = tl.program_id(2)
    k_valid = (k < K)[None, :]
    x_channels = ((k // KG) * x_sc)[None, :]
    dy_channels = (k * dy_sc)[None, :]
    zero = tl.zeros((BLOCK_ROWS, BLOCK_N), COMPUTE)
    sums = (zero,) * (FILTER_ROWS * WIDTH)
    begin = split * slice_rows
    end = tl.minimum(begin + slice_rows, ROWS)
    for row0 in range(begin, end, BLOCK_ROWS):
        row = row0 + tl.arange(0, BLOCK_ROWS)
        row_valid = row < end
        o_h = row % OH
        o_d = row // OH % OD
        n = (row // (OH * OD)).to(tl.int64)
        dy_rows = dy_ptr + (n * dy_sn + o_d * dy_sd + o_h * dy_sh)[:, None] + dy_channels
        for j in tl.static_range(FILTER_ROWS):
            filter_row = first_filter_row + j
            i_d = o_d * sd + filter_row // R * dil_d - pad_d
            i_h = o_h * sh + filter_row % R * dil_h - pad_h
            inside = row_valid & (filter_row < T * R) & (i_d >= 0) & (i_d < XD) & (i_h >= 0) & (i_h < XH)
            x_rows = x_ptr + (n * x_sn + i_d * x_sd + i_h * x_sh)[:, None] + x_channels
            x_mask = inside[:, None] & k_valid
            dy_mask = row_valid[:, None] & k_valid
            for phase in range(STEP):
                # the window before the first step: taps 0 .. WIDTH - SHIFT - 1 at o_w = phase
                window = (zero,) * WIDTH
                for first in tl.static_range(WIDTH - SHIFT):
                    i_w = phase * sw + first * dil_w - pad_w
                    x = tl.load(x_rows + i_w * x_sw, mask=x_mask & (i_w >= 0) & (i_w < XW), other=0.0)
                    window = replaced(window, first, x.to(COMPUTE))
                walk = (x_sw, dy_sw, OW, XW, sw, dil_w, pad_w, STEP)
                if AHEAD:
                    ahead = group_loads(x_rows, dy_rows, x_mask, dy_mask, phase, walk, WIDTH, SHIFT)
                for o_w0 in range(phase, OW, STEP * WIDTH):
                    if AHEAD:  # this group's loads came in during the last group's FMAs; the next group's go out
                        xs, dys = ahead
                        ahead = group_loads(x_rows, dy_rows, x_mask, dy_mask, o_w0 + STEP * WIDTH, walk, WIDTH, SHIFT)
                    else:
                        xs, dys = group_loads(x_rows, dy_rows, x_mask, dy_mask, o_w0, walk, WIDTH, SHIFT)
                    for u in tl.static_range(WIDTH):
                        for tap in tl.static_range(SHIFT):  # the taps that enter the window
                            entering = xs[u * SHIFT + tap].to(COMPUTE)
                            window = replaced(window, (u * SHIFT + WIDTH - SHIFT + tap) % WIDTH, entering)
                        dy = dys[u].to(COMPUTE)
                        for s in tl.static_range(WIDTH):
                            products = sums[j * WIDTH + s] + dy * window[(u * SHIFT + s) % WIDTH]
                            sums = replaced(sums, j * WIDTH + s, products)
    for j in tl.static_range(FILTER_ROWS):
        filter_row = first_filter_row + j
        for s in tl.static_range(WIDTH):
            store_filter(
                tl.sum(sums[j * WIDTH + s], axis=0)[None, :],
                k[None, :],
                filter_row * WIDTH + s,
                split,
                dw_ptr,
                partial_ptr,
                K,
                1,
                T * R * WIDTH,
                T,
                R,
                WIDTH,
                w_sk,
                w_sc,
                w_st,
                w_sr,
                w_ss,
                k_valid & (filter_row < T * R),
                alpha,
                beta,
                PARTIAL,
                HAS_BETA,
                FLIP,
                COMPUTE,
            )
