"""Softmax forward and backward (FAST, ACCURATE, LOG; any rows, any strides): a one-pass kernel for
rows that fit in registers and a two-pass scheme for longer rows.

Memory model: forward reads x and writes y, backward reads y and dy and writes dx (plus the output
once more when beta != 0). The arithmetic is a few FLOPs and one exp2 per element, so the kernels
are memory-bound: at the H200's copy speed, about 4.2 TB/s, float32 32768 x 4096 forward moves
1.07 GB and takes at least 0.26 ms, backward 1.61 GB and 0.38 ms.

Layout (``softmax_plan``): the reduced dims and the kept dims form two groups, each sorted by
stride and merged where contiguous for every operand, so any mode on any layout becomes rows of
length L with per-operand strides (several reduced dims remain only for views that do not merge,
such as sub-regions). The kept group's innermost dim is tiled BLOCK_K at a time, its outer dims
walked one per program; a tile is BLOCK_K rows x BLOCK_R row elements. When the row dim is the
contiguous one (softmax over the last dim, CHANNEL on NHWC), a tile is a few whole rows; when a kept
dim is the contiguous one (CHANNEL on NCHW), a tile is 8 to 16 neighbouring pixels x the channels,
so every load is contiguous along the pixels. Triton picks the tile's fast axis from the strides.

- One pass (BLOCK_K x next_pow2(L) <= MAX_TILE elements): each element is read once and written
  once; the row's max, the exps and the sum stay in registers and each exp is computed once
  (rows of 4096: BLOCK 4096, 8 warps, 16 elements per thread, 16-byte loads).
- Two passes (longer rows): the row is cut into ``chunks`` slices of ``chunk_tiles`` tiles, one
  program per (rows, slice), so that a few very long rows still fill the GPU. ``softmax_stats``
  folds each slice's tiles into a running (max, sum of exp(x - max)) (forward; the max is 0 for
  FAST) or a sum (backward: sum(dy*y), or sum(dy) for LOG) and writes it into a small workspace
  (2 x chunks x rows numbers); ``softmax_apply`` combines the slices of its rows, re-reads its slice
  and writes the output. It runs the programs in reverse order so that the slices read last by the
  first kernel, still in L2, are read first. Reads 2x, writes 1x. The workspace is allocated here
  with torch, on the handle's stream (cuDNN's softmax takes no workspace argument).

exp(z) is exp2(z * log2(e)). A row whose max is -inf is shifted by 0 instead, so that the two-pass
merge never forms -inf - -inf; the row still ends NaN (0 / 0), as the reference's does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import MAX_DIMS
from opendnn.core.dtypes import DataType
from opendnn.families.softmax.problem import SoftmaxAlgorithm, SoftmaxProblem
from opendnn.kernels.blend import narrowed
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.indexing import dim_offsets, merged_dims
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

LOG2E = tl.constexpr(1.4426950408889634)
MAX_TILE = 16384  # most elements a one-pass tile holds: 32 float32 per thread at 16 warps
ROW_TILE = 4096  # elements of a one-pass tile of whole rows (several rows when they are short)
COLUMN_BLOCK = 16  # most neighbouring rows of a tile when a kept dim is the contiguous one
MIN_COLUMN_BLOCK = 8  # and fewest (32 contiguous bytes of float32)
COLUMN_TILE = 8192  # elements of a one-pass tile of neighbouring rows
STREAM_TILE = 4096  # elements of a two-pass tile
PROGRAMS_PER_SM = 8  # enough programs to fill the GPU several times over (1024 on an H200, a power of two)
MIN_CHUNK_TILES = 4  # tiles each slice of a two-pass row reads at least
MAX_WARPS = 16


@triton.jit
def operand_offsets(
    outer,
    k,
    r,
    outer_sizes,
    outer_strides,
    inner_stride,
    reduced_sizes,
    reduced_strides,
    OUTER_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    K_UNIT: tl.constexpr,
    R_UNIT: tl.constexpr,
    WIDE: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
):
    """One operand's offsets of the tile: rows ``k`` of the innermost kept dim (at index ``outer``
    of the outer kept dims) x elements ``r`` of the row. ROW_ALIGN: what every row start is a
    multiple of (so that rows of 1000 float32, say, still load 16 bytes at a time)."""
    if K_UNIT:
        starts = k
    else:
        starts = k * inner_stride
    starts += dim_offsets(outer, OUTER_DIMS, outer_sizes, outer_strides)
    starts = aligned(starts, ROW_ALIGN)
    if WIDE:
        r = r.to(tl.int64)
    if REDUCED_DIMS > 1:
        r_offsets = dim_offsets(r, REDUCED_DIMS, reduced_sizes, reduced_strides)
    elif R_UNIT:
        r_offsets = r
    else:
        r_offsets = r * reduced_strides[0]
    return starts[:, None] + r_offsets[None, :]


@triton.jit
def aligned(value, ALIGN: tl.constexpr):
    """``value``, known to be a multiple of ALIGN, written so that Triton knows it too (the mask of
    a row of 1000 is then constant over groups of 8, and the loads become vectors)."""
    if ALIGN > 1:
        value = value // ALIGN * ALIGN
    return value


@triton.jit
def program_index(pid, WIDE: tl.constexpr):
    """The program id, in 64 bits when offsets may pass 2**31 (every index derived from it follows)."""
    if WIDE:
        pid = pid.to(tl.int64)
    return pid


@triton.jit
def rows_of_block(block, inner_size, BLOCK_K: tl.constexpr):
    """Block ``block`` of rows: (its index over the outer kept dims, its rows along the innermost)."""
    inner_blocks = tl.cdiv(inner_size, BLOCK_K)
    outer = block // inner_blocks
    return outer, (block - outer * inner_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)


@triton.jit
def exp_of(z):
    return tl.exp2(z * LOG2E)


@triton.jit
def safe_shift(m):
    """The row's shift: its max, or 0 where the max is -inf (so that -inf - -inf never occurs)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def tile_max(USES_MAX: tl.constexpr, a, COMPUTE: tl.constexpr, BLOCK_K: tl.constexpr):
    """Each row's max of the tile, or 0 when nothing is shifted (FAST, backward)."""
    if USES_MAX:
        m = tl.max(a, axis=1)
    else:
        m = tl.zeros((BLOCK_K,), COMPUTE)
    return m


@triton.jit
def tile_terms(ALGO: tl.constexpr, BACKWARD: tl.constexpr, a, b, shift):
    """What each element adds to its row's sum: exp(x - shift) forward, dy * y backward (dy for LOG)."""
    if BACKWARD:
        if ALGO == "log":
            terms = b
        else:
            terms = a * b
    else:
        terms = exp_of(a - shift[:, None])
    return terms


@triton.jit
def finish(ALGO: tl.constexpr, BACKWARD: tl.constexpr, a, b, terms, shift, total):
    """The result from the operands (a = x forward, a = y and b = dy backward), the terms, the
    row's shift and its sum."""
    if BACKWARD:
        if ALGO == "log":
            out = b - exp_of(a) * total[:, None]
        else:
            out = a * (b - total[:, None])
    elif ALGO == "log":
        out = (a - shift[:, None]) - tl.log(total)[:, None]
    else:
        out = terms * (1.0 / total)[:, None]
    return out


@triton.jit
def load_operands(a_ptr, b_ptr, a_offsets, b_offsets, mask, BACKWARD: tl.constexpr, COMPUTE: tl.constexpr):
    """The tile of a (and b backward) in the compute dtype; masked lanes hold -inf forward (they
    add exp(-inf) = 0) and 0 backward."""
    if BACKWARD:
        a = tl.load(a_ptr + a_offsets, mask=mask, other=0.0).to(COMPUTE)
        b = tl.load(b_ptr + b_offsets, mask=mask, other=0.0).to(COMPUTE)
    else:
        a = tl.load(a_ptr + a_offsets, mask=mask, other=float("-inf")).to(COMPUTE)
        b = a
    return a, b


@triton.jit
def store_blended(o_ptr, offsets, mask, out, alpha, beta, HAS_BETA: tl.constexpr, COMPUTE: tl.constexpr):
    """out = alpha * result + beta * out; out is unread when beta == 0."""
    out = out * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        out += tl.cast(beta, COMPUTE) * tl.load(o_ptr + offsets, mask=mask).to(COMPUTE)
    tl.store(o_ptr + offsets, narrowed(out, o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_one_pass_kernel(
    a_ptr,
    b_ptr,
    o_ptr,
    outer_sizes,
    a_outer,
    b_outer,
    o_outer,
    inner_size,
    a_inner,
    b_inner,
    o_inner,
    reduced_sizes,
    a_reduced,
    b_reduced,
    o_reduced,
    row_length,
    alpha: tl.float64,
    beta: tl.float64,
    ALGO: tl.constexpr,
    BACKWARD: tl.constexpr,
    USES_MAX: tl.constexpr,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    K_UNIT: tl.constexpr,
    R_UNIT: tl.constexpr,
    WIDE: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program p: BLOCK_K whole rows (a block of the innermost kept dim), read once, written once."""
    pid = program_index(tl.program_id(0), WIDE)
    outer, k = rows_of_block(pid, inner_size, BLOCK_K)
    r = tl.arange(0, BLOCK_R)
    row_length = aligned(row_length, ROW_ALIGN)
    mask = (k < inner_size)[:, None] & (r < row_length)[None, :]
    a_offsets = operand_offsets(
        outer,
        k,
        r,
        outer_sizes,
        a_outer,
        a_inner,
        reduced_sizes,
        a_reduced,
        OUTER_DIMS,
        REDUCED_DIMS,
        K_UNIT,
        R_UNIT,
        WIDE,
        ROW_ALIGN,
    )
    b_offsets = operand_offsets(
        outer,
        k,
        r,
        outer_sizes,
        b_outer,
        b_inner,
        reduced_sizes,
        b_reduced,
        OUTER_DIMS,
        REDUCED_DIMS,
        K_UNIT,
        R_UNIT,
        WIDE,
        ROW_ALIGN,
    )
    o_offsets = operand_offsets(
        outer,
        k,
        r,
        outer_sizes,
        o_outer,
        o_inner,
        reduced_sizes,
        o_reduced,
        OUTER_DIMS,
        REDUCED_DIMS,
        K_UNIT,
        R_UNIT,
        WIDE,
        ROW_ALIGN,
    )
    a, b = load_operands(a_ptr, b_ptr, a_offsets, b_offsets, mask, BACKWARD, COMPUTE)
    shift = safe_shift(tile_max(USES_MAX, a, COMPUTE, BLOCK_K))
    terms = tile_terms(ALGO, BACKWARD, a, b, shift)
    out = finish(ALGO, BACKWARD, a, b, terms, shift, tl.sum(terms, axis=1))
    store_blended(o_ptr, o_offsets, mask, out, alpha, beta, HAS_BETA, COMPUTE)


@triton.jit
def softmax_stats_kernel(
    a_ptr,
    b_ptr,
    stats_ptr,
    outer_sizes,
    a_outer,
    b_outer,
    inner_size,
    a_inner,
    b_inner,
    reduced_sizes,
    a_reduced,
    b_reduced,
    row_length,
    k_blocks,
    kept_total,
    chunks,
    chunk_tiles,
    ALGO: tl.constexpr,
    BACKWARD: tl.constexpr,
    USES_MAX: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    K_UNIT: tl.constexpr,
    R_UNIT: tl.constexpr,
    WIDE: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program p = slice * k_blocks + rows block: the running (max, sum) of its rows over its slice's
    tiles, stored at stats[0 or 1, slice, row]."""
    pid = program_index(tl.program_id(0), WIDE)
    chunk = pid // k_blocks
    block = pid - chunk * k_blocks
    outer, k = rows_of_block(block, inner_size, BLOCK_K)
    k_mask = k < inner_size
    row_length = aligned(row_length, ROW_ALIGN)
    lanes = tl.arange(0, BLOCK_R)
    m = tl.zeros((BLOCK_K,), COMPUTE)
    if USES_MAX:
        m += float("-inf")
    total = tl.zeros((BLOCK_K,), COMPUTE)
    tiles = tl.cdiv(row_length, BLOCK_R)
    for t in range(chunk * chunk_tiles, tl.minimum((chunk + 1) * chunk_tiles, tiles)):
        r = t * BLOCK_R + lanes
        mask = k_mask[:, None] & (r < row_length)[None, :]
        a_offsets = operand_offsets(
            outer,
            k,
            r,
            outer_sizes,
            a_outer,
            a_inner,
            reduced_sizes,
            a_reduced,
            OUTER_DIMS,
            REDUCED_DIMS,
            K_UNIT,
            R_UNIT,
            WIDE,
            ROW_ALIGN,
        )
        b_offsets = operand_offsets(
            outer,
            k,
            r,
            outer_sizes,
            b_outer,
            b_inner,
            reduced_sizes,
            b_reduced,
            OUTER_DIMS,
            REDUCED_DIMS,
            K_UNIT,
            R_UNIT,
            WIDE,
            ROW_ALIGN,
        )
        a, b = load_operands(a_ptr, b_ptr, a_offsets, b_offsets, mask, BACKWARD, COMPUTE)
        if USES_MAX:
            m_new = tl.maximum(m, tl.max(a, axis=1))
            shift = safe_shift(m_new)
            total = total * exp_of(m - shift) + tl.sum(tile_terms(ALGO, BACKWARD, a, b, shift), axis=1)
            m = m_new
        else:  # m stays 0: a plain sum. `total * exp(0) + sum(dy)` broke Triton 3.6's thread-locality pass
            total += tl.sum(tile_terms(ALGO, BACKWARD, a, b, m), axis=1)
    row = outer * inner_size + k
    tl.store(stats_ptr + chunk * kept_total + row, m, mask=k_mask)
    tl.store(stats_ptr + (chunks + chunk) * kept_total + row, total, mask=k_mask)


@triton.jit
def softmax_apply_kernel(
    a_ptr,
    b_ptr,
    o_ptr,
    stats_ptr,
    outer_sizes,
    a_outer,
    b_outer,
    o_outer,
    inner_size,
    a_inner,
    b_inner,
    o_inner,
    reduced_sizes,
    a_reduced,
    b_reduced,
    o_reduced,
    row_length,
    k_blocks,
    kept_total,
    chunks,
    chunk_tiles,
    alpha: tl.float64,
    beta: tl.float64,
    ALGO: tl.constexpr,
    BACKWARD: tl.constexpr,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    K_UNIT: tl.constexpr,
    R_UNIT: tl.constexpr,
    WIDE: tl.constexpr,
    ROW_ALIGN: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CHUNKS_BLOCK: tl.constexpr,
):
    """The stats kernel's program p, run as program count - 1 - p: combine the slices' (max, sum)
    of its rows, then write its slice of the output."""
    pid = program_index(tl.num_programs(0) - 1 - tl.program_id(0), WIDE)
    chunk = pid // k_blocks
    block = pid - chunk * k_blocks
    outer, k = rows_of_block(block, inner_size, BLOCK_K)
    k_mask = k < inner_size
    row = outer * inner_size + k
    slices = tl.arange(0, CHUNKS_BLOCK)
    stats_mask = k_mask[:, None] & (slices < chunks)[None, :]
    stats_offsets = slices[None, :] * kept_total + row[:, None]
    m = tl.load(stats_ptr + stats_offsets, mask=stats_mask, other=float("-inf"))
    sums = tl.load(stats_ptr + chunks * kept_total + stats_offsets, mask=stats_mask, other=0.0)
    shift = safe_shift(tl.max(m, axis=1))
    total = tl.sum(sums * exp_of(m - shift[:, None]), axis=1)

    row_length = aligned(row_length, ROW_ALIGN)
    lanes = tl.arange(0, BLOCK_R)
    tiles = tl.cdiv(row_length, BLOCK_R)
    for t in range(chunk * chunk_tiles, tl.minimum((chunk + 1) * chunk_tiles, tiles)):
        r = t * BLOCK_R + lanes
        mask = k_mask[:, None] & (r < row_length)[None, :]
        a_offsets = operand_offsets(
            outer,
            k,
            r,
            outer_sizes,
            a_outer,
            a_inner,
            reduced_sizes,
            a_reduced,
            OUTER_DIMS,
            REDUCED_DIMS,
            K_UNIT,
            R_UNIT,
            WIDE,
            ROW_ALIGN,
        )
        b_offsets = operand_offsets(
            outer,
            k,
            r,
            outer_sizes,
            b_outer,
            b_inner,
            reduced_sizes,
            b_reduced,
            OUTER_DIMS,
            REDUCED_DIMS,
            K_UNIT,
            R_UNIT,
            WIDE,
            ROW_ALIGN,
        )
        o_offsets = operand_offsets(
            outer,
            k,
            r,
            outer_sizes,
            o_outer,
            o_inner,
            reduced_sizes,
            o_reduced,
            OUTER_DIMS,
            REDUCED_DIMS,
            K_UNIT,
            R_UNIT,
            WIDE,
            ROW_ALIGN,
        )
        a, b = load_operands(a_ptr, b_ptr, a_offsets, b_offsets, mask, BACKWARD, COMPUTE)
        out = finish(ALGO, BACKWARD, a, b, tile_terms(ALGO, BACKWARD, a, b, shift), shift, total)
        store_blended(o_ptr, o_offsets, mask, out, alpha, beta, HAS_BETA, COMPUTE)


Dims = tuple[tuple[int, tuple[int, ...]], ...]  # (size, (a, b, out strides)), outermost first


@dataclass(frozen=True)
class SoftmaxPlan:
    """The canonical layout of a softmax and how it is cut into programs."""

    outer: Dims  # the kept dims but the innermost
    inner: tuple[int, tuple[int, ...]]  # the innermost kept dim (size, x / y / dy strides), tiled BLOCK_K at a time
    reduced: Dims  # the dims of a row
    block_k: int
    block_r: int
    chunks: int  # slices per row in the two-pass scheme; 0 for one pass
    chunk_tiles: int
    num_warps: int

    @property
    def kept_total(self) -> int:
        return math.prod(size for size, _ in self.outer) * self.inner[0]

    @property
    def k_blocks(self) -> int:
        """Blocks of BLOCK_K rows: the outer kept dims times the blocks of the innermost."""
        return math.prod(size for size, _ in self.outer) * triton.cdiv(self.inner[0], self.block_k)

    @property
    def row_length(self) -> int:
        return math.prod(size for size, _ in self.reduced)


@functools.lru_cache(maxsize=256)  # per problem, not per call: the tile and split the launches are planned from
def softmax_plan(problem: SoftmaxProblem) -> SoftmaxPlan:
    """Canonicalise the layout, then pick the tile, one or two passes, and the slices per row."""
    a, b, out = (problem.tensors[0], problem.tensors[1 if problem.backward else 0], problem.tensors[-1])
    dims = [(size, (a.strides[k], b.strides[k], out.strides[k])) for k, size in enumerate(a.dims)]
    kept = merged_dims([d for k, d in enumerate(dims) if k not in problem.axes]) or [(1, (0, 0, 0))]
    reduced = merged_dims([dims[k] for k in problem.axes]) or [(1, (0, 0, 0))]
    inner_size, inner_strides = kept[-1]
    row_length = math.prod(size for size, _ in reduced)
    row_block = triton.next_power_of_2(row_length)
    columns = inner_size > 1 and inner_strides[0] < reduced[-1][1][0]
    if columns:
        block_k = min(triton.next_power_of_2(inner_size), COLUMN_BLOCK, max(MIN_COLUMN_BLOCK, COLUMN_TILE // row_block))
    else:
        block_k = min(triton.next_power_of_2(inner_size), max(1, ROW_TILE // row_block))
    chunks = chunk_tiles = 0
    if block_k * row_block <= MAX_TILE:
        block_r = row_block
    else:
        block_r = max(1, STREAM_TILE // block_k)
        tiles = triton.cdiv(row_length, block_r)
        k_blocks = math.prod(size for size, _ in kept[:-1]) * triton.cdiv(inner_size, block_k)
        target = programs_to_fill(PROGRAMS_PER_SM, power_of_two=True)
        chunks = max(1, min(triton.cdiv(target, k_blocks), tiles // MIN_CHUNK_TILES))
        chunk_tiles = triton.cdiv(tiles, chunks)
        chunks = triton.cdiv(tiles, chunk_tiles)
    num_warps = max(1, min(MAX_WARPS, block_k * block_r // 512))
    return SoftmaxPlan(tuple(kept[:-1]), kept[-1], tuple(reduced), block_k, block_r, chunks, chunk_tiles, num_warps)


def supports(problem: SoftmaxProblem) -> str | None:
    return None


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def softmax_launches(problem: SoftmaxProblem) -> Launches:
    """The launches computing ``problem``, planned once per problem (the host time of a call is part
    of its time): one pass, or the stats pass into a per-call scratch then the apply pass."""
    import torch

    plan = softmax_plan(problem)
    outer_sizes, *outer_strides = _padded(plan.outer)
    reduced_sizes, *reduced_strides = _padded(plan.reduced)
    inner_size, inner_strides = plan.inner
    layout = (outer_sizes, *outer_strides, inner_size, *inner_strides, reduced_sizes, *reduced_strides)
    input_layout = (
        outer_sizes,
        *outer_strides[:2],
        inner_size,
        *inner_strides[:2],
        reduced_sizes,
        *reduced_strides[:2],
    )
    flags = dict(
        ALGO=problem.algo.value,
        BACKWARD=problem.backward,
        OUTER_DIMS=len(plan.outer),
        REDUCED_DIMS=len(plan.reduced),
        K_UNIT=all(s == 1 for s in inner_strides),
        R_UNIT=len(plan.reduced) == 1 and all(s == 1 for s in plan.reduced[0][1]),
        WIDE=max(t.extent for t in problem.tensors) >= 2**31,
        ROW_ALIGN=_row_alignment(plan),
        COMPUTE=tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32,
        BLOCK_K=plan.block_k,
        BLOCK_R=plan.block_r,
        num_warps=plan.num_warps,
    )
    a, b, out = Slot("a"), Slot("b" if problem.backward else "a"), Slot("out")
    uses_max = not problem.backward and problem.algo is not SoftmaxAlgorithm.FAST
    has_beta = problem.beta != 0.0
    if plan.chunks == 0:
        return Launches(
            (
                Launch(
                    softmax_one_pass_kernel,
                    (plan.k_blocks,),
                    (a, b, out, *layout, plan.row_length, problem.alpha, problem.beta),
                    dict(USES_MAX=uses_max, HAS_BETA=has_beta, **flags),
                ),
            )
        )
    grid = (plan.k_blocks * plan.chunks,)
    chunking = (plan.row_length, plan.k_blocks, plan.kept_total, plan.chunks, plan.chunk_tiles)
    stats = Scratch(
        "stats",
        2 * plan.chunks * plan.kept_total,
        torch.float64 if problem.compute_dtype is DataType.DOUBLE else torch.float32,
    )
    return Launches(
        (
            Launch(
                softmax_stats_kernel,
                grid,
                (a, b, Slot("stats"), *input_layout, *chunking),
                dict(USES_MAX=uses_max, **flags),
            ),
            Launch(
                softmax_apply_kernel,
                grid,
                (a, b, out, Slot("stats"), *layout, *chunking, problem.alpha, problem.beta),
                dict(HAS_BETA=has_beta, CHUNKS_BLOCK=triton.next_power_of_2(plan.chunks), **flags),
            ),
        ),
        (stats,),
    )


def run(problem: SoftmaxProblem, inputs: list[Bound], output: Bound) -> None:
    tensors = {"a": torch_view(inputs[0]), "out": torch_view(output)}
    if problem.backward:
        tensors["b"] = torch_view(inputs[1])
    softmax_launches(problem)(tensors)


def _row_alignment(plan: SoftmaxPlan) -> int:
    """The largest power of two, up to 16, that divides the row length and every row start of every
    operand when rows are contiguous; 1 when they are not."""
    if len(plan.reduced) > 1 or any(s != 1 for s in plan.reduced[0][1]):
        return 1
    strides = [s for _, dim_strides in (*plan.outer, plan.inner) for s in dim_strides]
    return math.gcd(plan.row_length, 16, *strides)


def _padded(dims: Dims) -> tuple[tuple[int, ...], ...]:
    """(sizes, a strides, b strides, out strides), each padded to MAX_DIMS with size 1, stride 0."""
    pad = MAX_DIMS - len(dims)
    sizes = tuple(size for size, _ in dims) + (1,) * pad
    return (sizes, *(tuple(strides[j] for _, strides in dims) + (0,) * pad for j in range(3)))
