"""Pointwise operations (arithmetic, math, comparisons, logic, activations and their gradients,
op_tensor, add/scale/set/transform_tensor): one strided elementwise kernel.

Memory model: each output element is written once and each input element read once (broadcast
inputs are re-read from cache), plus one read of the output when beta != 0. At H200 copy speed,
about 4.2 TB/s of bytes read plus written, a float32 unary op over 32768 x 4096 elements moves
1.07 GB and takes at least 0.26 ms; arithmetic is a few FLOPs per element, far below the compute
roof, so the kernel is memory-bound and the goal is full-width coalesced loads and stores.

The kernel takes the canonical layout of ``layout.tile_layout``: six outer dims indexed from the
program id, then an A x B tile. Arithmetic runs in float32 (float64 for float64 problems).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.dtypes import DataType
from opendnn.families.pointwise.problem import PointwiseProblem
from opendnn.kernels import layout
from opendnn.kernels import math as tm
from opendnn.kernels.activation import FAST_DTYPES, activation, activation_derivative, torch_gradient
from opendnn.kernels.blend import narrowed
from opendnn.kernels.launch import Launch, Slot

OUTER_DIMS = tl.constexpr(layout.OUTER_DIMS)
# (elements per program, warps) of untransposed tiles by the output's element bytes: two 16-byte vectors per
# thread at 4 warps from 2 bytes up. H200 (docs/design/pointwise.md): 16-bit relu and scale_tensor 3.94 / 3.85 TB/s
# at 4096 x 8 warps, 4.08 / 4.08 at 2048 x 4; float32 relu and scale_tensor 4.00 / 3.93 at 4096 x 8, 4.17 /
# 4.16 at 1024 x 4 (torch 4.16). Transposing tiles stay 64 x 64 at 8 warps (bf16 NCHW -> NHWC 3.70 TB/s,
# 3.53 at 2048 x 4).
TILES = {1: (2048, 4), 2: (2048, 4), 4: (1024, 4), 8: (512, 4)}
# exact softplus (exp + log1p, ~40 instructions an element) wants more elements in flight per thread:
# float32 forward 3.92 TB/s at 1024 x 4, 4.07 at 4096 x 8 (torch 4.06), where the simple ops lose 3-4%
HEAVY_TILE = (4096, 8)
HEAVY_MODES = frozenset({"softplus_fwd"})
TRANSPOSE_TILE = 64  # A and B extent of a transposing tile
TRANSPOSE_WARPS = 8


@triton.jit
def tile_offsets(outer, a_index, b_index, sizes, strides, stride_a, stride_b, ALIGNED: tl.constexpr):
    """Element offsets of an A x B tile of one operand, for outer index ``outer``."""
    base = outer * 0
    for d in tl.static_range(OUTER_DIMS - 1, -1, -1):
        base += (outer % sizes[d]) * strides[d]
        outer = outer // sizes[d]
    if ALIGNED:  # every outer stride is a multiple of 16 elements: rows start aligned
        base = tl.multiple_of(base, 16)
    return base + a_index[:, None] * stride_a + b_index[None, :] * stride_b


@triton.jit
def apply_mode(
    MODE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    a,
    b,
    c,
    coef,
    PROPAGATE_NAN: tl.constexpr,
    FAST: tl.constexpr,
    TORCH_RULE: tl.constexpr,
):
    """The mode's function of up to three inputs (unused ones are ignored). Activations come as
    MODE "activation_fwd" (of a) or "activation_bwd" (a * derivative at b, or torch's gradient of
    dy = a at x = b with TORCH_RULE) with their name."""
    if MODE == "add":
        y = a + b
    elif MODE == "sub":
        y = a - b
    elif MODE == "mul":
        y = a * b
    elif MODE == "div":
        y = a / b
    elif MODE == "max":
        y = tm.maximum(a, b)
    elif MODE == "min":
        y = tm.minimum(a, b)
    elif MODE == "mod":
        y = tm.fmod(a, b)
    elif MODE == "pow":
        y = tm.pow(a, b)
    elif MODE == "add_square":
        y = a + b * b
    elif MODE == "abs":
        y = tl.abs(a)
    elif MODE == "ceil":
        y = tl.math.ceil(a)
    elif MODE == "floor":
        y = tl.math.floor(a)
    elif MODE == "cos":
        y = tl.cos(a)
    elif MODE == "sin":
        y = tl.sin(a)
    elif MODE == "tan":
        y = tm.tan(a)
    elif MODE == "exp":
        y = tl.exp(a)
    elif MODE == "log":
        y = tl.log(a)
    elif MODE == "neg":
        y = a * -1.0  # not -a: Triton negates as 0 - a, which gives +0 for +0
    elif MODE == "sqrt":
        y = tl.sqrt(a)
    elif MODE == "rsqrt":
        y = 1.0 / tl.sqrt(a)
    elif MODE == "reciprocal":
        y = 1.0 / a
    elif MODE == "erf":
        y = tl.math.erf(a)
    elif MODE == "identity":
        y = a
    elif MODE == "cmp_eq":
        y = tl.where(a == b, 1.0, 0.0)
    elif MODE == "cmp_neq":
        y = tl.where(a != b, 1.0, 0.0)
    elif MODE == "cmp_gt":
        y = tl.where(a > b, 1.0, 0.0)
    elif MODE == "cmp_ge":
        y = tl.where(a >= b, 1.0, 0.0)
    elif MODE == "cmp_lt":
        y = tl.where(a < b, 1.0, 0.0)
    elif MODE == "cmp_le":
        y = tl.where(a <= b, 1.0, 0.0)
    elif MODE == "logical_and":
        y = tl.where((a != 0) & (b != 0), 1.0, 0.0)
    elif MODE == "logical_or":
        y = tl.where((a != 0) | (b != 0), 1.0, 0.0)
    elif MODE == "logical_not":
        y = tl.where(a == 0, 1.0, 0.0)
    elif MODE == "binary_select":
        y = tl.where(c != 0, a, b)
    elif MODE == "activation_fwd":
        y = activation(ACTIVATION, a, coef, FAST)
    elif TORCH_RULE:
        tl.static_assert(MODE == "activation_bwd", "torch's rule is a gradient's")
        y = torch_gradient(ACTIVATION, a, b, coef)
    else:
        tl.static_assert(MODE == "activation_bwd", "unknown pointwise mode")
        y = a * activation_derivative(ACTIVATION, b, coef, FAST)
    if (ACTIVATION == "relu" or ACTIVATION == "clipped_relu") and not TORCH_RULE:  # NaN in: NaN, or 0
        x = b
        if MODE == "activation_fwd":
            x = a
        if PROPAGATE_NAN:
            y = tl.where(x != x, x, y)
        else:
            y = tl.where(x != x, 0.0, y)
    return y


@triton.jit
def pointwise_kernel(
    out_ptr,
    in0_ptr,
    in1_ptr,
    in2_ptr,
    sizes,
    size_a,
    size_b,
    out_strides,
    in0_strides,
    in1_strides,
    in2_strides,
    out_stride_a,
    in0_stride_a,
    in1_stride_a,
    in2_stride_a,
    out_stride_b,
    in0_stride_b,
    in1_stride_b,
    in2_stride_b,
    alpha: tl.float64,
    beta: tl.float64,
    scale0: tl.float64,
    scale1: tl.float64,
    coef: tl.float64,
    MODE: tl.constexpr,
    ACTIVATION: tl.constexpr,
    NUM_INPUTS: tl.constexpr,
    HAS_BETA: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    COMPUTE: tl.constexpr,
    ALIGNED: tl.constexpr,
    FAST: tl.constexpr,
    TORCH_RULE: tl.constexpr,
    SCALED_INPUTS: tl.constexpr,
    HAS_ALPHA: tl.constexpr,
    EVEN: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    # sizes and strides are tuples over the outer dims; A and B come as plain ints, so Triton
    # specializes a stride of 1 and multiples of 16 into wide vector accesses
    pid = tl.program_id(0)
    tiles_b = tl.cdiv(size_b, BLOCK_B)
    tiles_a = tl.cdiv(size_a, BLOCK_A)
    b_index = (pid % tiles_b) * BLOCK_B + tl.arange(0, BLOCK_B)
    a_index = ((pid // tiles_b) % tiles_a) * BLOCK_A + tl.arange(0, BLOCK_A)
    outer = (pid // tiles_b // tiles_a).to(tl.int64)
    if EVEN:  # the tile divides A and B: no masks (no predicate per vector access)
        mask = None
    else:
        mask = (a_index < size_a)[:, None] & (b_index < size_b)[None, :]
    a_index = a_index.to(tl.int64)

    a = tl.load(
        in0_ptr + tile_offsets(outer, a_index, b_index, sizes, in0_strides, in0_stride_a, in0_stride_b, ALIGNED),
        mask=mask,
    )
    a = a.to(COMPUTE)
    if SCALED_INPUTS:  # scales (and alpha) of 1 cost no multiplies
        a = a * tl.cast(scale0, COMPUTE)
    b = a
    c = a
    if NUM_INPUTS >= 2:
        b = tl.load(
            in1_ptr + tile_offsets(outer, a_index, b_index, sizes, in1_strides, in1_stride_a, in1_stride_b, ALIGNED),
            mask=mask,
        )
        b = b.to(COMPUTE)
        if SCALED_INPUTS:
            b = b * tl.cast(scale1, COMPUTE)
    if NUM_INPUTS >= 3:
        c = tl.load(
            in2_ptr + tile_offsets(outer, a_index, b_index, sizes, in2_strides, in2_stride_a, in2_stride_b, ALIGNED),
            mask=mask,
        )
        c = c.to(COMPUTE)
    y = apply_mode(MODE, ACTIVATION, a, b, c, tl.cast(coef, COMPUTE), PROPAGATE_NAN, FAST, TORCH_RULE).to(COMPUTE)
    if HAS_ALPHA:
        y = y * tl.cast(alpha, COMPUTE)

    out_offsets = tile_offsets(outer, a_index, b_index, sizes, out_strides, out_stride_a, out_stride_b, ALIGNED)
    if HAS_BETA:  # with beta == 0 the output is never read: it may hold NaN
        y += tl.cast(beta, COMPUTE) * tl.load(out_ptr + out_offsets, mask=mask).to(COMPUTE)
    if out_ptr.dtype.element_ty == tl.int1:
        y = y != 0
    tl.store(out_ptr + out_offsets, narrowed(y, out_ptr.dtype.element_ty), mask=mask)


def supports(problem: PointwiseProblem) -> str | None:
    return None


def run(problem: PointwiseProblem, inputs: Sequence[Bound], output: Bound) -> None:
    views = [torch_view(t) for t in inputs]
    tensors = {"out": torch_view(output), "in0": views[0]}
    tensors["in1"] = views[1] if len(views) > 1 else tensors["out"]
    tensors["in2"] = views[2] if len(views) > 2 else tensors["out"]
    fast = problem.fast_math and tensors["out"].is_cuda and problem.output.dtype in FAST_DTYPES
    pointwise_launch(problem, fast and problem.compute_dtype is DataType.FLOAT)(tensors)


@functools.lru_cache(maxsize=1024)  # per problem, asked by every run (a Plan keeps the backend, not this)
def pointwise_launch(problem: PointwiseProblem, fast: bool = False) -> Launch:
    """The launch computing ``problem``: grid, the arguments after the pointers, constexprs and
    options; ``fast``: the approximate activations (a 16-bit output, float32 arithmetic, a GPU)."""
    tiled = layout.tile_layout(problem.output.dims, [problem.output, *problem.inputs])
    if tiled.transposed:
        elements, warps = TRANSPOSE_TILE**2, TRANSPOSE_WARPS
    elif problem.mode.value in HEAVY_MODES and not fast:
        elements, warps = HEAVY_TILE
    else:
        elements, warps = TILES[problem.output.dtype.itemsize]
    block_a, block_b = tile_shape(tiled, elements)
    grid = (triton.cdiv(tiled.sizes[-2], block_a) * triton.cdiv(tiled.sizes[-1], block_b) * tiled.outer,)
    strides = list(tiled.strides) + [tiled.strides[0]] * (3 - len(problem.inputs))
    mode, activation_name = kernel_mode(problem.mode.value)
    arguments = (
        Slot("out"),
        Slot("in0"),
        Slot("in1"),
        Slot("in2"),
        tiled.sizes[:-2],
        tiled.sizes[-2],
        tiled.sizes[-1],
        *(s[:-2] for s in strides),
        *(s[-2] for s in strides),
        *(s[-1] for s in strides),
        problem.alpha,
        problem.beta,
        problem.input_scales[0],
        problem.input_scales[1],
        problem.coef,
    )
    options = dict(
        MODE=mode,
        ACTIVATION=activation_name,
        NUM_INPUTS=len(problem.inputs),
        HAS_BETA=problem.beta != 0.0,
        PROPAGATE_NAN=problem.propagate_nan,
        COMPUTE=tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32,
        ALIGNED=all(stride % 16 == 0 for s in strides for stride in s[:-2]),
        FAST=fast,
        TORCH_RULE=problem.torch_rule,
        SCALED_INPUTS=any(scale != 1.0 for scale in problem.input_scales),
        HAS_ALPHA=problem.alpha != 1.0,
        EVEN=tiled.sizes[-2] % block_a == 0 and tiled.sizes[-1] % block_b == 0,
        BLOCK_A=block_a,
        BLOCK_B=block_b,
        num_warps=warps,
    )
    return Launch(pointwise_kernel, grid, arguments, options)


def tile_shape(tiled: layout.TiledLayout, elements: int) -> tuple[int, int]:
    """BLOCK_A x BLOCK_B: about ``elements``, square-ish when transposing."""
    size_a, size_b = tiled.sizes[-2], tiled.sizes[-1]
    block_b = min(triton.next_power_of_2(size_b), TRANSPOSE_TILE if tiled.transposed else elements)
    block_a = min(triton.next_power_of_2(size_a), elements // block_b)
    return block_a, block_b


def kernel_mode(name: str) -> tuple[str, str]:
    """("activation_fwd", "relu") for "relu_fwd"; (name, "") for a mode that is no activation."""
    if name.endswith(("_fwd", "_bwd")):
        return "activation" + name[-4:], name[:-4]
    return name, ""
