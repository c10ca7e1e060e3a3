"""Matrix multiplication with fused epilogues: one persistent, tiled ``tl.dot`` kernel, and the planner
that gives the products it applies to (16-bit, TMA-readable, filling an sm_90 GPU) to the
warp-specialized Gluon engine of ``gluon_hopper`` instead (``choose_engine``).

FLOPs and bytes: ``2 * batch * M * N * K`` FLOPs; at least ``A + B + C`` bytes (plus bias, residual,
and C once more when beta != 0). A bf16 8192^3 product is 1.1 TFLOP over 400 MB, about 2700
FLOP/byte, far above the H200's ridge (~190 FLOP/byte at 790 TFLOP/s and 4.2 TB/s): the kernel is
compute-bound, and the goal is to keep the tensor cores (wgmma on sm_90) fed: big tiles
(128 x 256 x 64 for 16-bit inputs, 8 warps = two warpgroups), a 3-stage pipeline of loads, and the
tiles of one program walked in grouped (swizzled) order so that consecutive tiles share rows of A
and columns of B in L2. ``tile_config`` picks the tile per shape: a 16-bit product takes the tile
(128 x 256, 256 x 128 or 128 x 128) that finishes in the fewest rounds of programs x tile time, so an
N of 4224 does not spend a fifth round on 16 tiles; one too small to fill the GPU takes 128 x 128.

The kernel is persistent: ``min(tiles, SMs)`` programs, each walking tiles ``pid, pid + SMs, ...``
over ``batch x tiles_m x tiles_n``, so the loads of the next tile overlap the epilogue of the last.
Operands come in one of two ways (the constexpr ``TMA``):

- tensor descriptors (Hopper's TMA): 3-D ``[batch, rows, cols]`` descriptors built on the device,
  zero-filled past every edge; needs a unit last stride (a transposed operand is described in its
  stored order and transposed in registers, which costs nothing: wgmma reads either order from
  shared memory), 16-byte aligned strides and base, and a batch that is one linear stride (or 0);
- plain pointers with any strides (two batch dims with their own strides, 0 for broadcast; more
  batch dims that no stride merges loop on the host), masked at every edge; cp.async-pipelined
  when strides are multiples of 16 elements. This path serves the interpreter too (which also
  runs the TMA path: it emulates descriptors).

TF32 (float32 where the handle allows it): wgmma reads TF32 tiles from shared memory only K-major,
so ``_tf32_operands`` copies an operand that is not.

The epilogue is constexpr flags over the fp32 (fp64) accumulator: scale (fp8 dequantisation),
bias per row or per column, any forward activation (``kernels.activation``; its approximate
instructions for a 16-bit C on a GPU, as the pointwise kernels), residual, alpha,
beta * C, then one cast to C's dtype and a masked store; 128 x 256 tiles finish in two halves
(half the registers and staging shared memory: fp32 outputs would not fit otherwise). Offsets
are an int64 tile base plus int32 offsets inside the tile.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from opendnn.core.arrays import CPU, Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import backend_module
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.matmul.gluon_hopper import gluon_launch
from opendnn.families.matmul.problem import BiasAxis, MatmulProblem
from opendnn.families.matmul.triton_tiles import (
    batch_offset,
    epilogue_arguments,
    epilogue_options,
    finish_tile,
    persistent_programs,
    tile_coordinates,
)
from opendnn.families.pointwise.problem import PointwiseMode, PointwiseProblem
from opendnn.kernels.activation import FAST_DTYPES
from opendnn.kernels.device import TMA_ALIGNMENT, has_wgmma, multiprocessors, tma_ready, use_descriptor_scratch
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot


@triton.jit
def operand_descriptor(
    ptr, batches, batch_stride, rows, cols, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr
):
    return tl.make_tensor_descriptor(
        ptr, shape=[batches, rows, cols], strides=[batch_stride, row_stride, 1], block_shape=[1, BLOCK_ROWS, BLOCK_COLS]
    )


@triton.jit
def load_tile(
    desc,
    ptr,
    batch,
    row0,
    col0,
    rows,
    cols,
    row_stride,
    col_stride,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    TMA: tl.constexpr,
):
    """The BLOCK_ROWS x BLOCK_COLS tile at (row0, col0) of one operand as it is stored, zero past
    its edges (the K edge must be zero; the others land in rows or columns of C never stored)."""
    if TMA:
        tile = desc.load([batch, row0, col0]).reshape(BLOCK_ROWS, BLOCK_COLS)
    else:  # an int64 tile base, int32 offsets inside the tile: half the address registers
        local_rows = tl.arange(0, BLOCK_ROWS)
        local_cols = tl.arange(0, BLOCK_COLS)
        base = ptr + row0.to(tl.int64) * row_stride + col0.to(tl.int64) * col_stride
        mask = (row0 + local_rows < rows)[:, None] & (col0 + local_cols < cols)[None, :]
        tile = tl.load(base + local_rows[:, None] * row_stride + local_cols[None, :] * col_stride, mask=mask, other=0.0)
    return tile


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    residual_ptr,
    partial_ptr,
    M,
    N,
    K,
    k_per_split,
    batch_count,
    batch_inner,
    a_batch_outer,
    a_batch_inner,
    a_stride_m,
    a_stride_k,
    b_batch_outer,
    b_batch_inner,
    b_stride_k,
    b_stride_n,
    c_batch_outer,
    c_batch_inner,
    c_stride_m,
    c_stride_n,
    r_batch_outer,
    r_batch_inner,
    r_stride_m,
    r_stride_n,
    bias_stride,
    a_tma_batches,
    a_tma_batch_stride,
    b_tma_batches,
    b_tma_batch_stride,
    alpha: tl.float64,
    beta: tl.float64,
    scale: tl.float64,
    coef: tl.float64,
    TMA: tl.constexpr,
    A_TRANSPOSED: tl.constexpr,
    B_TRANSPOSED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BIAS_PER_ROW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    PRECISION: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
    SPLIT_EPILOGUE: tl.constexpr,
    UPCAST: tl.constexpr,
    IMPRECISE: tl.constexpr,
    FAST: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """C's tiles, each the product over K, or with SPLITS > 1 over one of SPLITS slices of
    ``k_per_split`` (a multiple of BLOCK_K) of K: then a tile's float32 partial sum goes to
    ``partial_ptr`` ([SPLITS, M, N], one batch), which ``split_sum_kernel`` adds up and finishes."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles_per_split = batch_count * tiles_m * tiles_n
    total = tiles_per_split * SPLITS
    a_desc = a_ptr
    b_desc = b_ptr
    if TMA:  # stored order: a transposed operand's rows are K
        if A_TRANSPOSED:
            a_desc = operand_descriptor(a_ptr, a_tma_batches, a_tma_batch_stride, K, M, a_stride_k, BLOCK_K, BLOCK_M)
        else:
            a_desc = operand_descriptor(a_ptr, a_tma_batches, a_tma_batch_stride, M, K, a_stride_m, BLOCK_M, BLOCK_K)
        if B_TRANSPOSED:
            b_desc = operand_descriptor(b_ptr, b_tma_batches, b_tma_batch_stride, N, K, b_stride_n, BLOCK_N, BLOCK_K)
        else:
            b_desc = operand_descriptor(b_ptr, b_tma_batches, b_tma_batch_stride, K, N, b_stride_k, BLOCK_K, BLOCK_N)

    for tile in tl.range(tl.program_id(0), total, PROGRAMS, flatten=TMA):
        split = tile // tiles_per_split
        batch, tile_m, tile_n = tile_coordinates(tile % tiles_per_split, tiles_m, tiles_n, GROUP_M)
        m0 = tile_m * BLOCK_M
        n0 = tile_n * BLOCK_N
        a_base = a_ptr + batch_offset(batch, batch_inner, a_batch_outer, a_batch_inner)
        b_base = b_ptr + batch_offset(batch, batch_inner, b_batch_outer, b_batch_inner)
        a_batch = batch % a_tma_batches  # TMA: the batch is one stride (a_tma_batches is 1 when broadcast)
        b_batch = batch % b_tma_batches
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
        k_first = split * k_per_split
        for kt in range(tl.cdiv(tl.minimum(K - k_first, k_per_split), BLOCK_K)):
            k0 = k_first + kt * BLOCK_K
            if A_TRANSPOSED:
                a = load_tile(a_desc, a_base, a_batch, k0, m0, K, M, a_stride_k, a_stride_m, BLOCK_K, BLOCK_M, TMA).T
            else:
                a = load_tile(a_desc, a_base, a_batch, m0, k0, M, K, a_stride_m, a_stride_k, BLOCK_M, BLOCK_K, TMA)
            if B_TRANSPOSED:
                b = load_tile(b_desc, b_base, b_batch, n0, k0, N, K, b_stride_n, b_stride_k, BLOCK_N, BLOCK_K, TMA).T
            else:
                b = load_tile(b_desc, b_base, b_batch, k0, n0, K, N, b_stride_k, b_stride_n, BLOCK_K, BLOCK_N, TMA)
            if UPCAST:  # the interpreter's dot misreads bfloat16 and fp8 (stored as integer bits)
                a = a.to(ACC)
                b = b.to(ACC)
            # fp8: partial sums promoted to full fp32 every IMPRECISE products (None: never)
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=ACC, max_num_imprecise_acc=IMPRECISE)

        # recomputed: fewer live registers
        batch, tile_m, tile_n = tile_coordinates(tile % tiles_per_split, tiles_m, tiles_n, GROUP_M)
        c_base = c_ptr + batch_offset(batch, batch_inner, c_batch_outer, c_batch_inner)
        r_base = residual_ptr + batch_offset(batch, batch_inner, r_batch_outer, r_batch_inner)
        if SPLITS > 1:
            store_partial(acc, partial_ptr, split, tile_m * BLOCK_M, tile_n * BLOCK_N, M, N, BLOCK_M, BLOCK_N)
        elif SPLIT_EPILOGUE:  # two BLOCK_M x BLOCK_N/2 halves: half the registers and staging memory at once
            left, right = tl.split(acc.reshape(BLOCK_M, 2, BLOCK_N // 2).permute(0, 2, 1))
            finish_tile(
                left,
                tl.arange(0, BLOCK_M),
                tl.arange(0, BLOCK_N // 2),
                tile_m * BLOCK_M,
                tile_n * BLOCK_N,
                M,
                N,
                c_base,
                c_stride_m,
                c_stride_n,
                r_base,
                r_stride_m,
                r_stride_n,
                bias_ptr,
                bias_stride,
                alpha,
                beta,
                scale,
                coef,
                HAS_BIAS,
                BIAS_PER_ROW,
                ACTIVATION,
                HAS_RESIDUAL,
                HAS_BETA,
                ACC,
                FAST,
            )
            finish_tile(
                right,
                tl.arange(0, BLOCK_M),
                tl.arange(0, BLOCK_N // 2),
                tile_m * BLOCK_M,
                tile_n * BLOCK_N + BLOCK_N // 2,
                M,
                N,
                c_base,
                c_stride_m,
                c_stride_n,
                r_base,
                r_stride_m,
                r_stride_n,
                bias_ptr,
                bias_stride,
                alpha,
                beta,
                scale,
                coef,
                HAS_BIAS,
                BIAS_PER_ROW,
                ACTIVATION,
                HAS_RESIDUAL,
                HAS_BETA,
                ACC,
                FAST,
            )
        else:
            finish_tile(
                acc,
                tl.arange(0, BLOCK_M),
                tl.arange(0, BLOCK_N),
                tile_m * BLOCK_M,
                tile_n * BLOCK_N,
                M,
                N,
                c_base,
                c_stride_m,
                c_stride_n,
                r_base,
                r_stride_m,
                r_stride_n,
                bias_ptr,
                bias_stride,
                alpha,
                beta,
                scale,
                coef,
                HAS_BIAS,
                BIAS_PER_ROW,
                ACTIVATION,
                HAS_RESIDUAL,
                HAS_BETA,
                ACC,
                FAST,
            )


@triton.jit
def store_partial(acc, partial_ptr, split, row0, col0, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One slice's partial sum of the tile at (row0, col0) into its [M, N] plane of the partials."""
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    plane = partial_ptr + split.to(tl.int64) * M * N
    tl.store(plane + rows[:, None].to(tl.int64) * N + cols[None, :], acc, mask=mask)


@triton.jit
def split_sum_kernel(
    partial_ptr,
    c_ptr,
    bias_ptr,
    residual_ptr,
    M,
    N,
    c_stride_m,
    c_stride_n,
    r_stride_m,
    r_stride_n,
    bias_stride,
    alpha: tl.float64,
    beta: tl.float64,
    scale: tl.float64,
    coef: tl.float64,
    HAS_BIAS: tl.constexpr,
    BIAS_PER_ROW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    ACC: tl.constexpr,
    FAST: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Program (tile row, tile column) of C: the SPLITS partial sums of matmul_kernel's slices of K
    added in slice order (the same sum on every run), then the epilogue and C's store."""
    row0 = tl.program_id(0) * BLOCK_M
    col0 = tl.program_id(1) * BLOCK_N
    rows = row0 + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for split in tl.static_range(SPLITS):
        acc += tl.load(partial_ptr + split * M * N + offsets, mask=mask, other=0.0)
    finish_tile(
        acc,
        tl.arange(0, BLOCK_M),
        tl.arange(0, BLOCK_N),
        row0,
        col0,
        M,
        N,
        c_ptr,
        c_stride_m,
        c_stride_n,
        residual_ptr,
        r_stride_m,
        r_stride_n,
        bias_ptr,
        bias_stride,
        alpha,
        beta,
        scale,
        coef,
        HAS_BIAS,
        BIAS_PER_ROW,
        ACTIVATION,
        HAS_RESIDUAL,
        HAS_BETA,
        ACC,
        FAST,
    )


# ---- launcher ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    per_sm: int = 1  # persistent programs an SM holds at once


INTERPRETER_CONFIG = TileConfig(32, 32, 16, 2, 4, 1)
WIDE_16_BIT_TILES = TileConfig(128, 256, 64, 8, 8, 3)
TF32_TILES = TileConfig(128, 256, 32, 8, 8, 3)  # for TF32 products with enough of them to fill the GPU
FAST_FP8_TILES = TileConfig(128, 256, 128, 8, 8, 3)
PRECISE_FP8_TILES = TileConfig(256, 128, 128, 8, 8, 3)  # a second accumulator for promotion: 256 x 128 fits
SMALL_TILES = TileConfig(128, 128, 64, 8, 8, 4)  # few or small tiles: more programs
SHORT_K_TILES = TileConfig(128, 128, 128, 8, 8, 2)  # 16-bit, 64 < K <= 128: one step a tile, the next tile's in flight
FP32_SMALL_TILES = TileConfig(128, 128, 32, 8, 8, 4)
# Products of at most 64 columns (ResNet-50's 1x1 layers into 64 channels) move bytes, not FLOPs:
# three 4-warp programs an SM keep loads in flight where one 8-warp program drains between its
# tiles (H200, 200704 x 64 x 64: bf16 22 -> 17 us, TF32 48 -> 33 us); 128 bytes of K a step
NARROW_TILES = {2: TileConfig(128, 64, 64, 8, 4, 3, per_sm=3), 4: TileConfig(128, 64, 32, 8, 4, 3, per_sm=3)}
STRICT_FP32_TILES = TileConfig(64, 64, 32, 8, 4, 3)  # IEEE fp32 and fp64 products run on FMA units
# 16-bit products of more columns choose among these tiles, each with its FLOP rate against the first
# (H200, bf16 8192^3): 256 x 128, the same area split the other way (N = 4224 is 33 columns of 128
# but 16.5 of 256), and 128 x 128, half the area (rounds half as long)
RATED_16_BIT_TILES = (
    (WIDE_16_BIT_TILES, 1.0),
    (TileConfig(256, 128, 64, 8, 8, 3), 0.9),
    (SMALL_TILES, 0.89),
)
MIN_SPLIT_STEPS = 16  # fewest steps of BLOCK_K a slice of a split K takes (k_splits)
SPLIT_SUM_BLOCK = 64  # rows and columns of C a program of split_sum_kernel adds up
MAX_PROGRAMS_INTERPRETED = 4


def supports(problem: MatmulProblem) -> str | None:
    return None


class Engine(enum.Enum):
    """The kernel a product runs on (``choose_engine``)."""

    TL_DOT = "tl.dot"  # matmul_kernel: every product, on any GPU and in Triton's interpreter
    GLUON_HOPPER = "gluon_hopper"  # gluon_hopper.gluon_matmul_kernel: warp-specialized, compiled for sm_90


@dataclass(frozen=True)
class Plan:
    """A problem's launches for given operand layouts, each with the element offsets (into a, b,
    c, residual) of the batch it computes: one launch unless more than two batch dims stay
    unmerged (rare; the outer ones loop on the host)."""

    launches: tuple[tuple[Launch | Launches, tuple[int, ...]], ...]  # (the element offsets into a, b, c, residual)
    tma: bool
    engine: Engine


def run(
    problem: MatmulProblem, a: Bound, b: Bound, c: Bound, bias: Bound | None = None, residual: Bound | None = None
) -> None:
    interpreted = c.device == CPU  # Triton on the CPU is its interpreter (dispatch has checked)
    if problem.allow_tf32 and a.desc.dtype is DataType.FLOAT:
        a, b = _tf32_operands(a, b)
    views = {
        name: torch_view(bound)
        for name, bound in (("a", a), ("b", b), ("c", c), ("bias", bias), ("residual", residual))
        if bound is not None
    }
    device = views["c"].device
    tma = tma_ready(views["a"], views["b"], interpreted)
    hopper = not interpreted and has_wgmma(device.index)
    fast = (
        problem.fast_math
        and not interpreted
        and c.desc.dtype in FAST_DTYPES
        and problem.compute_dtype is DataType.FLOAT
    )
    plan = launch_plan(
        problem,
        a.desc,
        b.desc,
        c.desc,
        None if bias is None else bias.desc,
        None if residual is None else residual.desc,
        tma,
        interpreted,
        MAX_PROGRAMS_INTERPRETED if interpreted else multiprocessors(device.index or 0),
        fast,
        hopper,
    )
    views.setdefault("bias", views["c"])
    views.setdefault("residual", views["c"])
    if plan.tma and not interpreted:
        use_descriptor_scratch()
    for launch, offsets in plan.launches:
        launch(_moved(views, offsets) if any(offsets) else views)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def launch_plan(
    problem: MatmulProblem,
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
    bias: TensorDescriptor | None,
    residual: TensorDescriptor | None,
    tma: bool,
    interpreted: bool,
    sms: int,
    fast: bool = False,
    hopper: bool = False,
) -> Plan:
    """The launches for these operand layouts, planned once; ``tma``: the operands' bases are
    16-byte aligned on a GPU with TMA (then it is used where their layouts allow); ``fast``: the
    epilogue's activation may use the GPU's approximate instructions (a 16-bit C); ``hopper``: the
    GPU is an sm_90 (``choose_engine``)."""
    problem, a, b, c, residual = folded(problem, a, b, c, residual)
    batch_dims, strides = merged_batch(problem, a, b, c, residual)
    outer, inner = batch_dims[:-2], batch_dims[-2:]
    inner_strides = [None if s is None else s[-2:] for s in strides]
    offsets = [
        tuple(0 if s is None else sum(i * t for i, t in zip(index, s[:-2])) for s in strides)
        for index in itertools.product(*map(range, outer))
    ]
    (sa_m, sa_k), (sb_k, sb_n) = a.strides[-2:], b.strides[-2:]
    a_transposed = sa_k != 1 and sa_m == 1
    b_transposed = sb_n != 1 and sb_k == 1
    moved_aligned = all(o[k] * d.dtype.itemsize % TMA_ALIGNMENT == 0 for o in offsets for k, d in ((0, a), (1, b)))
    a_inner, b_inner = inner_strides[0], inner_strides[1]
    if a_inner is None or b_inner is None:  # (merged_batch gives strides for every operand given)
        raise InternalError("matmul planned without a's or b's batch strides")
    a_tma = _tma_batch(a, a_transposed, inner, a_inner) if tma and moved_aligned else None
    b_tma = _tma_batch(b, b_transposed, inner, b_inner) if tma and moved_aligned else None
    if a_tma is None or b_tma is None:
        a_tma = b_tma = None
    engine = choose_engine(problem, a_tma is not None, hopper, interpreted, sms)
    if engine is Engine.GLUON_HOPPER and a_tma is not None and b_tma is not None:
        tma_batches, transposed = (a_tma, b_tma), (a_transposed, b_transposed)
        launch: Launch | Launches = gluon_launch(
            problem, a, b, c, bias, residual, inner, inner_strides, tma_batches, transposed, sms, fast
        )
    else:
        launch = _launch(problem, a, b, c, bias, residual, inner, inner_strides, a_tma, b_tma, interpreted, sms, fast)
    return Plan(tuple((launch, o) for o in offsets), a_tma is not None, engine)


def choose_engine(problem: MatmulProblem, tma: bool, hopper: bool, interpreted: bool, sms: int) -> Engine:
    """The Gluon engine (``gluon_hopper``) where it applies: compiled for an sm_90 GPU (``hopper``;
    wgmma is Hopper's alone), 16-bit operands that TMA reads (``tma``: aligned bases, unit last
    strides, 16-byte aligned strides, a batch of one stride) and a product that takes 128 x 256 tiles
    (``takes_wide_tiles``). Every other product runs on the ``tl.dot`` kernel."""
    readable = hopper and not interpreted and tma and problem.a.dtype in (DataType.BFLOAT16, DataType.HALF)
    return Engine.GLUON_HOPPER if readable and takes_wide_tiles(problem, sms) else Engine.TL_DOT


def takes_wide_tiles(problem: MatmulProblem, sms: int) -> bool:
    """The 16-bit product finishes soonest with 128 x 256 tiles, as the ``tl.dot`` kernel plans it
    (``tile_config``; a ragged N that wastes a round of them takes 256 x 128)."""
    return tile_config(problem, problem.a.dtype, False, sms) == WIDE_16_BIT_TILES


def folded(
    problem: MatmulProblem,
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
    residual: TensorDescriptor | None,
) -> tuple[MatmulProblem, TensorDescriptor, TensorDescriptor, TensorDescriptor, TensorDescriptor | None]:
    """A batch that B does not have (a linear layer over (N, L, C) or (N, H, W, C) inputs) folded into
    M, as torch.matmul folds it: one product of batch x M rows where A, C and the residual lay their
    rows one stride apart across the batch and any bias follows the columns; the operands otherwise.
    Batched, each batch is its own column of tiles of M rows (56 rows of a 128-row tile at a 56 x 56
    image's rows) and B is read again per batch."""
    batch = math.prod(problem.batch)
    if batch == 1 or (problem.bias is not None and problem.bias_axis is BiasAxis.ROW):
        return problem, a, b, c, residual
    sizes, strides = merged_batch(problem, a, b, c, residual)
    if len(sizes) > 2 or sizes[0] > 1 or any(strides[1] or ()):  # one batch stride, none for B
        return problem, a, b, c, residual
    rows = batch * problem.m

    def as_rows(desc: TensorDescriptor | None, batch_strides: list[int] | None) -> TensorDescriptor | None:
        """The operand as one matrix of ``rows`` rows where its batch stride is M rows."""
        if desc is None or batch_strides is None or batch_strides[1] != problem.m * desc.strides[-2]:
            return None
        return TensorDescriptor(desc.dtype, (rows, desc.dims[-1]), desc.strides[-2:])

    a_rows, c_rows = as_rows(a, strides[0]), as_rows(c, strides[2])
    r_rows = as_rows(residual, strides[3])
    if a_rows is None or c_rows is None or (residual is not None and r_rows is None):
        return problem, a, b, c, residual
    b_matrix = TensorDescriptor(b.dtype, b.dims[-2:], b.strides[-2:])
    rows_problem = dataclasses.replace(problem, a=a_rows, b=b_matrix, c=c_rows, residual=r_rows, batch=(), m=rows)
    return rows_problem, a_rows, b_matrix, c_rows, r_rows


def merged_batch(
    problem: MatmulProblem, *operands: TensorDescriptor | None
) -> tuple[list[int], list[list[int] | None]]:
    """C's batch dims with each operand's strides (0 where it broadcasts), size-1 dims dropped and
    neighbours that are contiguous for every operand merged; padded to at least 2 dims."""
    rank = len(problem.batch)
    strides_all: list[list[int] | None] = []
    for desc in operands:
        if desc is None:
            strides_all.append(None)
            continue
        dims, strides = desc.dims[:-2], desc.strides[:-2]
        padded = [(1, 0)] * (rank - len(dims)) + list(zip(dims, strides))
        strides_all.append([s if d > 1 else 0 for d, s in padded])
    present = [s for s in strides_all if s is not None]
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in present]
    for k, size in enumerate(problem.batch):
        if size == 1:
            continue
        if sizes and all(m[-1] == s[k] * size for m, s in zip(merged, present)):
            sizes[-1] *= size
            for m, s in zip(merged, present):
                m[-1] = s[k]
            continue
        sizes.append(size)
        for m, s in zip(merged, present):
            m.append(s[k])
    pad = max(0, 2 - len(sizes))
    sizes = [1] * pad + sizes
    padded_iter = iter([[0] * pad + m for m in merged])
    return sizes, [None if s is None else next(padded_iter) for s in strides_all]


def _launch(
    problem: MatmulProblem,
    a: TensorDescriptor,
    b: TensorDescriptor,
    c: TensorDescriptor,
    bias: TensorDescriptor | None,
    residual: TensorDescriptor | None,
    batch_dims: list[int],
    strides: list[Any],
    a_tma: tuple[int, int] | None,
    b_tma: tuple[int, int] | None,
    interpreted: bool,
    sms: int,
    fast: bool,
) -> Launch | Launches:
    """The kernel launch over two batch dims (TMA when ``a_tma`` and ``b_tma`` are given); with K split
    (``k_splits``), that launch into the partial sums and the one that adds them up."""
    (sa_m, sa_k), (sb_k, sb_n) = a.strides[-2:], b.strides[-2:]
    config = tile_config(problem, a.dtype, interpreted, sms)
    batch = batch_dims[0] * batch_dims[1]
    splits, k_per_split = k_splits(problem, config, batch, sms)
    tiles = batch * -(-problem.m // config.block_m) * -(-problem.n // config.block_n)
    programs = persistent_programs(tiles * splits, sms * config.per_sm)
    args = (
        Slot("a"),
        Slot("b"),
        Slot("c"),
        Slot("bias"),
        Slot("residual"),
        Slot("partial" if splits > 1 else "c"),
        problem.m,
        problem.n,
        problem.k,
        k_per_split,
        batch,
        batch_dims[1],
        *strides[0],
        sa_m,
        sa_k,
        *strides[1],
        sb_k,
        sb_n,
        *epilogue_arguments(c, bias, residual, strides[2], strides[3]),
        *(a_tma or (1, 1)),
        *(b_tma or (1, 1)),
        problem.alpha,
        problem.beta,
        problem.scale,
        problem.coef,
    )
    epilogue = epilogue_options(problem, bias is not None, residual is not None, fast)
    products = Launch(
        matmul_kernel,
        (programs,),
        args,
        dict(
            TMA=a_tma is not None,
            A_TRANSPOSED=sa_k != 1 and sa_m == 1,
            B_TRANSPOSED=sb_n != 1 and sb_k == 1,
            **epilogue,
            PRECISION="tf32" if problem.allow_tf32 and a.dtype is DataType.FLOAT else "ieee",
            BLOCK_M=config.block_m,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            GROUP_M=config.group_m,
            PROGRAMS=programs,
            SPLIT_EPILOGUE=config.block_m * config.block_n >= 32768,
            IMPRECISE=config.block_k if a.dtype.is_fp8 and not problem.fast_fp8_accumulation else None,
            UPCAST=interpreted and (a.dtype is DataType.BFLOAT16 or a.dtype.is_fp8),
            SPLITS=splits,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        ),
    )
    if splits == 1:
        return products
    block = SPLIT_SUM_BLOCK
    sums = Launch(
        split_sum_kernel,
        (-(-problem.m // block), -(-problem.n // block)),
        (
            Slot("partial"),
            Slot("c"),
            Slot("bias"),
            Slot("residual"),
            problem.m,
            problem.n,
            *c.strides[-2:],
            *(residual.strides[-2:] if residual is not None else (0, 0)),
            0 if bias is None else bias.strides[0],
            problem.alpha,
            problem.beta,
            problem.scale,
            problem.coef,
        ),
        dict(**epilogue, SPLITS=splits, BLOCK_M=block, BLOCK_N=block, num_warps=4),
    )
    accumulator = torch.float64 if epilogue["ACC"] == tl.float64 else torch.float32
    return Launches((products, sums), (Scratch("partial", splits * problem.m * problem.n, accumulator),))


def k_splits(problem: MatmulProblem, config: TileConfig, batch: int, sms: int) -> tuple[int, int]:
    """(slices, K elements per slice, a multiple of BLOCK_K) of a product of one batch whose tiles fill
    at most half the GPU over a long K (a linear layer's weight gradient, which reduces over every
    token): about a tile per SM, each slice at least MIN_SPLIT_STEPS steps of BLOCK_K; (1, K) else."""
    tiles = -(-problem.m // config.block_m) * -(-problem.n // config.block_n)
    steps = -(-problem.k // config.block_k)
    splits = min(sms // tiles, steps // MIN_SPLIT_STEPS) if batch == 1 else 1
    if splits < 2:
        return 1, problem.k
    per_split = -(-steps // splits)
    return -(-steps // per_split), per_split * config.block_k


def tile_config(problem: MatmulProblem, dtype: DataType, interpreted: bool, sms: int) -> TileConfig:
    """Fixed tiles per shape class (no autotuning): a 16-bit or TF32 product of at most 64 columns
    and rows enough for its tile takes ``NARROW_TILES``, three programs an SM (an NCHW 1x1 backward
    filter's 64 x 64 products 3,136 deep, one an image, ran 47 -> 54 us on it: its tiles half
    empty); a wider 16-bit product the tile of ``RATED_16_BIT_TILES`` it finishes soonest with
    (128 x 128 x 128 for that of 128 x 128 where K fits one step of it); others big tiles where
    they alone fill the GPU."""
    if interpreted:
        return INTERPRETER_CONFIG
    if dtype is DataType.DOUBLE or (dtype is DataType.FLOAT and not problem.allow_tf32):
        return STRICT_FP32_TILES
    narrow = None if dtype.is_fp8 else NARROW_TILES[dtype.itemsize]
    if narrow is not None and problem.n <= narrow.block_n and problem.m >= narrow.block_m:
        return narrow
    batch = max(1, math.prod(problem.batch))
    if dtype in (DataType.BFLOAT16, DataType.HALF):
        tile = min(RATED_16_BIT_TILES, key=lambda rated: _estimated_time(problem, batch, sms, *rated))[0]
        short_k = SMALL_TILES.block_k < problem.k <= SHORT_K_TILES.block_k
        return SHORT_K_TILES if tile == SMALL_TILES and short_k else tile
    if dtype.is_fp8:
        big = FAST_FP8_TILES if problem.fast_fp8_accumulation else PRECISE_FP8_TILES
    else:
        big = TF32_TILES
    if problem.m // big.block_m * (problem.n // big.block_n) * batch < sms:
        return FP32_SMALL_TILES if dtype is DataType.FLOAT else SMALL_TILES
    return big


def _estimated_time(problem: MatmulProblem, batch: int, sms: int, tile: TileConfig, rate: float) -> float:
    """The persistent kernel's time in rounds of ``sms`` programs, one tile each, times a tile's time
    (its area over its rate): where tiles do not divide the GPU, the last round may be nearly empty."""
    tiles = -(-problem.m // tile.block_m) * -(-problem.n // tile.block_n) * batch
    return -(-tiles // sms) * tile.block_m * tile.block_n / rate


def _tma_batch(
    desc: TensorDescriptor, transposed: bool, batch_dims: list[int], batch_strides: list[int]
) -> tuple[int, int] | None:
    """(batches, batch stride) of a 3-D tensor descriptor of the operand (its base 16-byte aligned),
    or None when TMA cannot read it: a last stride that is not 1, a stride not 16-byte aligned, or
    a batch that is not one linear stride."""
    row_stride, col_stride = desc.strides[-2:]
    if transposed:
        row_stride, col_stride = col_stride, row_stride
    itemsize = desc.dtype.itemsize
    outer, inner = batch_strides
    if outer == inner == 0:
        batches, stride = 1, row_stride * desc.dims[-1 if transposed else -2]
    elif batch_dims[0] == 1 or outer == inner * batch_dims[1]:
        batches, stride = batch_dims[0] * batch_dims[1], inner
    else:
        return None
    aligned = all(s * itemsize % TMA_ALIGNMENT == 0 for s in (row_stride, stride))
    if col_stride != 1 or not aligned:
        return None
    return batches, max(stride, TMA_ALIGNMENT // itemsize)


def _tf32_operands(a: Bound, b: Bound) -> tuple[Bound, Bound]:
    """A and B in the order TF32 wgmma reads them from shared memory, K-major: an operand that is not
    is copied so (one pass of the pointwise copy). A from registers takes either order but measured
    wrong on the H200 (docs/design/matmul.md, "TF32")."""
    a_k_major, b_k_major = a.desc.strides[-1] == 1, b.desc.strides[-2] == 1
    return a if a_k_major else _k_major(a, -1), b if b_k_major else _k_major(b, -2)


def _k_major(operand: Bound, k_axis: int) -> Bound:
    """The operand copied with K (``k_axis``) innermost, by the pointwise copy kernel: one pass."""
    view = torch_view(operand)
    copy = torch.empty_like(view if k_axis == -1 else view.mT, memory_format=torch.contiguous_format)
    copy = copy if k_axis == -1 else copy.mT
    target = Bound(
        operand.name, TensorDescriptor(operand.desc.dtype, tuple(copy.shape), copy.stride()), copy, operand.device
    )
    pointwise = backend_module("pointwise", "triton")  # another family's backend: through the operation table
    pointwise.run(PointwiseProblem(PointwiseMode.IDENTITY, (operand.desc,), target.desc), [operand], target)
    return target


def _moved(views: dict[str, Any], offsets: tuple[int, ...]) -> dict[str, Any]:
    """The views with a, b, c and residual moved ``offsets`` elements on: only their addresses are
    used, so each moved view is one element."""
    moved = dict(views)
    for name, offset in zip(("a", "b", "c", "residual"), offsets):
        view = views[name]
        moved[name] = view.as_strided((1,), (1,), view.storage_offset() + offset)
    return moved
