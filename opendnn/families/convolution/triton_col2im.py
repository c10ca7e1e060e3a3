"""Backward data as a product then a gather: GEMM's route for problems with few input channels.

The column route of GEMM's backward data (``triton_gemm.im2col_kernel`` over dy) holds, for every
pixel of dx, every tap's dy channels: input pixels x taps x K elements, 20 GB for ResNet-50's conv1
at batch 64 (3 input channels, 64 output channels, 7 x 7 taps). Taken the other way round, each pixel
of dy meets every tap once:

    Z[g, tap, c, p] = sum over k of dy[p, g * K/G + k] * w[g * K/G + k, c, tap]    (one product)
    dx[q, g * C/G + c] = sum over the taps that reach q of Z[g, tap, c, p(q, tap)]  (one gather)

Z holds output pixels x taps x C elements (118 M for conv1, float32 sums, 472 MB): the smaller
matrix where the input channels are fewer than the output channels times the stride's area
(``gathers_products``). The product reads dy once a tile of Z's columns; Z is written once and read
once, by the gather, which sums each pixel's taps in tap order (bitwise repeatable, no atomics) and
blends alpha and beta as every backward data does. Z is stored column-major (a column (tap, c)
holds its pixels contiguously): the product's stores run along pixels, and neighbouring pixels of dx
read neighbouring pixels of a column; a gather program holds pixels of one phase of the stride and
walks only that phase's taps.
"""

from __future__ import annotations

import math
from typing import Any

import triton
import triton.language as tl

from opendnn.families.convolution.problem import ConvolutionMethod, ConvolutionProblem, method_of
from opendnn.families.convolution.triton_direct import pixel_coordinates
from opendnn.families.convolution.triton_gemm import (
    epilogue,
    gather_step,
    inside,
    round_to_tf32,
    row_coordinates,
    tap_progression,
    tap_shifts,
)
from opendnn.families.convolution.triton_matrix import matmul_form
from opendnn.families.convolution.triton_tiles import (
    BACKWARD_DATA,
    accumulator_type,
    channels_per_group,
    dot_precision,
    geometry,
    im2col_elements,
    stride_phases,
    strides5,
    uses_direct,
)
from opendnn.kernels.launch import Launch, Slot

PRODUCT_TILE = (64, 64, 64, 4, 1)  # rows (pixels of dy), columns (taps x C/G), reduction (K/G), warps, stages
GATHER_ELEMENTS = 2048  # pixels x channels of a gather program


def col2im_elements(problem: ConvolutionProblem) -> int:
    """Elements of Z, the product's matrix: output pixels x taps x C."""
    geo = geometry(problem)
    return geo.output_pixels * geo.taps * geo.c


def gathers_products(problem: ConvolutionProblem) -> bool:
    """Whether GEMM's backward data takes this route: Z smaller than dy's column matrix, where neither
    the matrix product of a 1x1 layer nor the direct kernels of a depthwise one take the problem."""
    return (
        problem.direction is BACKWARD_DATA
        and method_of(problem.algo) is ConvolutionMethod.GEMM
        and col2im_elements(problem) < im2col_elements(problem)
        and matmul_form(problem) is None
        and not uses_direct(problem, *channels_per_group(problem))
    )


@triton.jit
def col2im_product_kernel(
    dy_ptr,
    w_ptr,
    z_ptr,
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
    PIXELS,
    OD,
    OH,
    OW,
    KG,
    CG,
    T,
    R,
    S,
    FLIP: tl.constexpr,
    COMPUTE: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (tile, g): Z[g] rows p (BLOCK_M pixels of dy) x columns j = (tap, c) (BLOCK_N of
    taps * C/G), the sum over K/G, stored as float sums at z_ptr column-major (G x taps x C/G x PIXELS:
    a column's pixels contiguous, for the product's stores and the gather's loads alike). TF32
    operands are rounded to nearest on the way to the tensor cores."""
    g = tl.program_id(1)
    columns = T * R * S * CG
    tiles_n = tl.cdiv(columns, BLOCK_N)
    p = tl.program_id(0) // tiles_n * BLOCK_M + tl.arange(0, BLOCK_M)
    j = tl.program_id(0) % tiles_n * BLOCK_N + tl.arange(0, BLOCK_N)
    p_valid, j_valid = p < PIXELS, j < columns
    n, o_d, o_h, o_w = pixel_coordinates(p, OD, OH, OW)
    dy_rows = n * dy_sn + o_d * dy_sd + o_h * dy_sh + o_w * dy_sw
    tap = tl.where(j_valid, j // CG, 0)
    _, _, _, w_tap = tap_shifts(tap, w_ptr, 0, 0, 0, 1, 1, 1, R, S, T, R, S, 0, 0, 0, w_st, w_sr, w_ss, FLIP, False)
    w_cols = (j % CG) * w_sc + w_tap
    lanes = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), COMPUTE)
    for k0 in range(0, KG, BLOCK_K):
        k = g * KG + k0 + lanes
        k_valid = k0 + lanes < KG
        a = tl.load(
            dy_ptr + (dy_rows[:, None] + k[None, :] * dy_sc), mask=p_valid[:, None] & k_valid[None, :], other=0.0
        )
        b = tl.load(w_ptr + (k[:, None] * w_sk + w_cols[None, :]), mask=k_valid[:, None] & j_valid[None, :], other=0.0)
        if PRECISION == "tf32":  # to nearest, where the tensor cores would truncate
            a, b = round_to_tf32(a), round_to_tf32(b)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc, input_precision=PRECISION, out_dtype=COMPUTE)
    z_offsets = ((g * columns + j).to(tl.int64) * PIXELS)[None, :] + p[:, None]
    tl.store(z_ptr + z_offsets, acc, mask=p_valid[:, None] & j_valid[None, :])


@triton.jit
def col2im_gather_kernel(
    z_ptr,
    dx_ptr,
    dx_sn,
    dx_sc,
    dx_sd,
    dx_sh,
    dx_sw,
    ROWS,
    OUT_PIXELS,
    UD,
    UH,
    UW,
    XD,
    XH,
    XW,
    OD,
    OH,
    OW,
    C,
    CG,
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
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program (row tile, channel tile, phase): dx for BLOCK_P pixels of one phase of the stride (the
    pixels u * stride + phase, ``row_coordinates``) x BLOCK_C channels, each the sum of the Z entries
    of the phase's taps (``tap_progression``: those that reach a pixel of dy), in tap order."""
    phase = tl.program_id(2)
    qw = phase % sw
    qh = (phase // sw) % sh
    qd = phase // (sw * sh)
    r0_d, taps_d = tap_progression(qd, pad_d, sd, dil_d, T, step_d)
    r0_h, taps_h = tap_progression(qh, pad_h, sh, dil_h, R, step_h)
    r0_w, taps_w = tap_progression(qw, pad_w, sw, dil_w, S, step_w)
    m = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    n, u_d, u_h, u_w, i_d, i_h, i_w, valid = row_coordinates(
        m, UD, UH, UW, XD, XH, XW, qd, qh, qw, sd, sh, sw, True, ROWS
    )
    channel = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_valid = channel < C
    group_taps = (channel // CG).to(tl.int64)[None, :] * (T * R * S)  # the first tap of the channel's group
    z_channel = channel[None, :] % CG
    acc = tl.zeros((BLOCK_P, BLOCK_C), COMPUTE)
    for i in range(0, taps_d * taps_h * taps_w):
        t = r0_d + i // (taps_h * taps_w) * step_d
        r = r0_h + (i // taps_w) % taps_h * step_h
        s = r0_w + i % taps_w * step_w
        o_d = u_d + gather_step(qd, t * dil_d, pad_d, sd, True)
        o_h = u_h + gather_step(qh, r * dil_h, pad_h, sh, True)
        o_w = u_w + gather_step(qw, s * dil_w, pad_w, sw, True)
        reach = valid & inside(o_d, OD) & inside(o_h, OH) & inside(o_w, OW)
        pixel = ((n * OD + o_d) * OH + o_h) * OW + o_w
        offsets = ((group_taps + (t * R + r) * S + s) * CG + z_channel) * OUT_PIXELS + pixel[:, None]
        acc += tl.load(z_ptr + offsets, mask=reach[:, None] & c_valid[None, :], other=0.0).to(COMPUTE)
    dx_pixel = n * dx_sn + i_d.to(tl.int64) * dx_sd + i_h.to(tl.int64) * dx_sh + i_w.to(tl.int64) * dx_sw
    offsets = dx_pixel[:, None] + channel[None, :].to(tl.int64) * dx_sc
    mask = valid[:, None] & c_valid[None, :]
    epilogue(
        acc, dx_ptr, offsets, mask, dx_ptr, offsets, dx_ptr, offsets, alpha, beta, 0.0, 0.0, HAS_BETA, False, False,
        "", False, COMPUTE,
    )  # fmt: skip


def col2im_launches(problem: ConvolutionProblem, dot: Any) -> list[Launch]:
    """The product into the workspace's ``partial`` region (Z, float sums), then the gather into dx."""
    geo = geometry(problem)
    kg, cg = geo.k // geo.groups, geo.c // geo.groups
    block_m, block_n, block_k, warps, stages = PRODUCT_TILE
    compute = accumulator_type(problem)
    product = Launch(
        col2im_product_kernel,
        (triton.cdiv(geo.output_pixels, block_m) * triton.cdiv(geo.taps * cg, block_n), geo.groups),
        (Slot("y"), Slot("w"), Slot("partial"), *strides5(problem.y), *strides5(problem.w), geo.output_pixels,
         *geo.y_size, kg, cg, *geo.filt),
        dict(FLIP=problem.flip, COMPUTE=compute, DOT=dot,
             PRECISION=dot_precision(problem), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
             num_stages=stages),
    )  # fmt: skip
    block_c = min(32, triton.next_power_of_2(geo.c))
    block_p = GATHER_ELEMENTS // block_c
    steps, units = stride_phases(geo)
    rows = geo.n * math.prod(units)
    gather = Launch(
        col2im_gather_kernel,
        (triton.cdiv(rows, block_p), triton.cdiv(geo.c, block_c), math.prod(geo.stride)),
        (Slot("partial"), Slot("x"), *strides5(problem.x), rows, geo.output_pixels, *units, *geo.x_size,
         *geo.y_size, geo.c, cg, *geo.filt, *geo.pad, *geo.stride, *geo.dilation, *steps, problem.alpha,
         problem.beta),
        dict(HAS_BETA=problem.beta != 0.0, COMPUTE=compute, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=4),
    )  # fmt: skip
    return [product, gather]
