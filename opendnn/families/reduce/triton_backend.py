"""Tensor reduction (reduce_tensor: add, mul, min, max, amax, avg, norm1, norm2, mul-no-zeros, with
flattened indices for min/max/amax): two strided reduction kernels and a combining pass.

Memory model: each element of A is read once and each element of C written once (read once more
when beta != 0), plus the indices; the arithmetic is one or two FLOPs per element of A, so the
kernels are memory-bound and the goal is full-width coalesced loads of A. At H200 copy speed,
about 4.2 TB/s, float32 32768 x 4096 reduced over the last dim reads 537 MB and takes at least
0.128 ms (0.15 ms at 85%).

Layout: any dim order and strides become a canonical form (``reduce_plan``): the kept dims and
the reduced dims form two groups, each sorted by A's stride (innermost last), size-1 dims dropped
and neighbours contiguous for every operand merged (up to 8 dims in all). Two kernels then read A:

- rows (A's innermost dim is reduced): a program owns BLOCK_K outputs and walks their reduced set
  in BLOCK_K x BLOCK_R tiles, contiguous along the innermost reduced dim, the outer reduced dims
  stepped one per iteration;
- columns (A's innermost dim is kept): a program owns BLOCK_K consecutive outputs along the
  innermost kept dim and walks the whole reduced set in BLOCK_R x BLOCK_K tiles, so each row of a
  tile is one contiguous load.

Both accumulate a whole tile elementwise (float32, float64 for float64 problems) and reduce it
across lanes once at the end, in a fixed order. When the outputs are too few to fill the GPU
(the whole tensor to one element, say), the reduced set is cut into ``splits`` equal slices, one
program each, which write partial results into the caller's workspace; ``reduce_partials_kernel``
then combines the slices in order. No atomics: results are bitwise repeatable.

MIN, MAX and AMAX compare keys (a, -a, -|a|) for the smallest; ties go to the smaller flattened
index, so the order of the walk never changes the index found.
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
from opendnn.core.errors import InternalError
from opendnn.families.reduce.problem import ReduceProblem
from opendnn.kernels.blend import narrowed
from opendnn.kernels.device import programs_to_fill
from opendnn.kernels.indexing import dim_offsets, merged_dims
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

TILE_ELEMENTS = 4096  # elements per tile: 16 per thread at 8 warps
ROW_BLOCK = 1024  # most elements of a row a rows tile covers (H200, 32768 x 4096 bf16 ADD: 3.71 TB/s, 3.54 at 2048)
COLUMN_BLOCK = 128  # most outputs a columns tile covers
COLUMN_MIN = 16  # shortest innermost kept dim worth a columns kernel
PROGRAMS_PER_SM = 8  # enough programs to fill the GPU several times over (1024 on an H200, a power of two)
MIN_SLICE_ITERATIONS = 4  # tiles each slice of a split reduction reads at least
MAX_SPLITS = 1024
FINAL_BLOCK = 1024  # outputs per program of the combining pass
INDEX_BYTES = 8  # partial indices are int64
FAST_PICKS = True  # on a GPU, min/max/amax without indices fold with one min (.NaN) instruction per element
KIND = {
    "add": "sum",
    "avg": "sum",
    "norm1": "sum",
    "norm2": "sum",
    "mul": "prod",
    "mul_no_zeros": "prod",
    "min": "pick",
    "max": "pick",
    "amax": "pick",
}


@triton.jit
def element_key(OP: tl.constexpr, x):
    """What is accumulated for each element: the summand, the factor, or the key whose smallest wins."""
    if OP == "norm1":
        y = tl.abs(x)
    elif OP == "norm2":
        y = x * x
    elif OP == "mul_no_zeros":
        y = tl.where(x == 0, 1.0, x).to(x.dtype)
    elif OP == "max":
        y = -x
    elif OP == "amax":
        y = -tl.abs(x)
    else:
        y = x
    return y


@triton.jit
def takes(x, x_index, v, v_index, PROPAGATE_NAN: tl.constexpr, INDEXED: tl.constexpr):
    """True where key ``x`` beats ``v``: smaller, or NaN against a number (PROPAGATE_NAN) or a
    number against NaN (not), or equal with a smaller index."""
    x_nan = x != x
    v_nan = v != v
    if PROPAGATE_NAN:
        win = (x < v) | (x_nan & ~v_nan)
    else:
        win = (x < v) | (v_nan & ~x_nan)
    if INDEXED:
        win = win | (((x == v) | (x_nan & v_nan)) & (x_index < v_index))
    return win


@triton.jit
def multiply(a, b):
    return a * b


@triton.jit
def neutral(KIND: tl.constexpr, PROPAGATE_NAN: tl.constexpr, zeros):
    """The accumulator's start, shaped as ``zeros``: 0 for sums, 1 for products, the key that loses
    to any element for picks (+inf when NaN propagates, else NaN, which every number beats)."""
    if KIND == "sum":
        acc = zeros
    elif KIND == "prod":
        acc = zeros + 1.0
    elif PROPAGATE_NAN:
        acc = zeros + float("inf")
    else:
        acc = zeros + float("nan")
    return acc


@triton.jit
def accumulate(
    KIND: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    INDEXED: tl.constexpr,
    acc,
    acc_index,
    x,
    x_index,
    mask,
    FAST: tl.constexpr = False,
    EVEN: tl.constexpr = False,
):
    """Fold the elements ``x`` (with flattened indices ``x_index``) where ``mask`` (everywhere when
    EVEN) into the accumulator. FAST (a GPU): picks without indices take the hardware's min, whose
    NaN rule is the one asked (min.NaN propagates, min returns the number); the interpreter's
    minimum always propagates NaN, so it keeps ``takes``."""
    if KIND == "sum" and EVEN:
        acc = acc + x
    elif KIND == "sum":
        acc = acc + tl.where(mask, x, 0.0)
    elif KIND == "prod":
        acc = acc * tl.where(mask, x, 1.0)
    elif FAST and not INDEXED:
        if not EVEN:
            x = tl.where(mask, x, acc)
        if PROPAGATE_NAN:
            acc = tl.minimum(acc, x, propagate_nan=tl.PropagateNan.ALL)
        else:
            acc = tl.minimum(acc, x)
    else:
        win = mask & takes(x, x_index, acc, acc_index, PROPAGATE_NAN, INDEXED)
        acc = tl.where(win, x, acc)
        if INDEXED:
            acc_index = tl.where(win, x_index, acc_index)
    return acc, acc_index


@triton.jit
def minimum_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def reduce_tile(
    KIND: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    INDEXED: tl.constexpr,
    acc,
    acc_index,
    AXIS: tl.constexpr,
    FAST: tl.constexpr = False,
):
    """The accumulator tile reduced across ``AXIS``: (value, index; index 0 when not INDEXED).
    Built-in min/max reductions only, so the result never depends on the reduction tree. FAST
    picks without indices: one reduction by the hardware's min, as in ``accumulate``."""
    index = 0
    if KIND == "pick" and FAST and not INDEXED and PROPAGATE_NAN:
        value = tl.reduce(acc, AXIS, minimum_nan)
    elif KIND == "pick" and FAST and not INDEXED:
        value = tl.min(acc, axis=AXIS)
    elif KIND == "sum":
        value = tl.sum(acc, axis=AXIS)
    elif KIND == "prod":
        value = tl.reduce(acc, AXIS, multiply)
    else:  # picks: the smallest key (NaNs set aside), then NaN if any (PROPAGATE_NAN) or all are
        nan = acc != acc
        best = tl.min(tl.where(nan, float("inf"), acc), axis=AXIS)
        if PROPAGATE_NAN:
            nan_wins = tl.max(nan.to(tl.int32), axis=AXIS) > 0
        else:
            nan_wins = tl.min(nan.to(tl.int32), axis=AXIS) > 0
        value = tl.where(nan_wins, float("nan"), best)
        if INDEXED:  # the smallest index among the lanes holding that key
            same = (acc == tl.expand_dims(value, AXIS)) | (nan & tl.expand_dims(nan_wins, AXIS))
            index = tl.min(tl.where(same, acc_index, 4611686018427387904), axis=AXIS)
    return value, index


@triton.jit
def store_result(
    OP: tl.constexpr,
    value,
    index,
    c_ptr,
    c_offsets,
    index_ptr,
    index_offsets,
    mask,
    count,
    alpha,
    beta,
    HAS_BETA: tl.constexpr,
    INDEXED: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """C = alpha * finish(value) + beta * C (C unread when beta == 0), and the indices."""
    if OP == "avg":
        value = value / tl.cast(count, COMPUTE)
    elif OP == "norm2":
        if COMPUTE == tl.float64:
            value = tl.sqrt(value)
        else:
            value = tl.sqrt_rn(value)  # correctly rounded, as the float64 one is
    elif OP == "max" or OP == "amax":
        value = -value
    y = value * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        y += tl.cast(beta, COMPUTE) * tl.load(c_ptr + c_offsets, mask=mask).to(COMPUTE)
    tl.store(c_ptr + c_offsets, narrowed(y, c_ptr.dtype.element_ty), mask=mask)
    if INDEXED:
        tl.store(index_ptr + index_offsets, index.to(index_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_partials(partial_ptr, partial_index_ptr, offsets, value, index, mask, INDEXED: tl.constexpr):
    """One split's partial results (and indices) into the workspace, for the combining pass."""
    tl.store(partial_ptr + offsets, value, mask=mask)
    if INDEXED:
        tl.store(partial_index_ptr + offsets, index, mask=mask)


@triton.jit
def reduce_rows_kernel(
    a_ptr,
    c_ptr,
    index_ptr,
    partial_ptr,
    partial_index_ptr,
    kept_sizes,
    kept_a,
    kept_c,
    kept_i,
    reduced_sizes,
    reduced_a,
    reduced_w,
    kept_total,
    row_blocks,
    iterations,
    count: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    OP: tl.constexpr,
    KIND: tl.constexpr,
    KEPT_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    INDEXED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    PARTIAL: tl.constexpr,
    INNER_UNIT: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FAST: tl.constexpr,
    EVEN: tl.constexpr,
):
    """Program (k, s): outputs k*BLOCK_K.. over iterations [s*T/S, (s+1)*T/S) of T = (outer reduced
    index, block of the innermost reduced dim) pairs."""
    pid_s = tl.program_id(1).to(tl.int64)
    k = tl.program_id(0).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = k < kept_total
    a_k = dim_offsets(k, KEPT_DIMS, kept_sizes, kept_a)
    lanes = tl.arange(0, BLOCK_R)
    inner = reduced_sizes[REDUCED_DIMS - 1]
    begin = pid_s * iterations // tl.num_programs(1)
    end = (pid_s + 1) * iterations // tl.num_programs(1)

    acc = neutral(KIND, PROPAGATE_NAN, tl.zeros((BLOCK_K, BLOCK_R), COMPUTE))
    acc_index = tl.full((BLOCK_K, BLOCK_R), 4611686018427387904, tl.int64)  # 2**62 loses every tie
    for t in range(begin, end):
        if REDUCED_DIMS == 1:  # t is the block along the one reduced dim: no 64-bit division
            row = t * 0
        else:
            row = t // row_blocks
        r = (t - row * row_blocks) * BLOCK_R + lanes
        if INNER_UNIT:
            r_offsets = r
        else:
            r_offsets = r * reduced_a[REDUCED_DIMS - 1]
        r_offsets += dim_offsets(row, REDUCED_DIMS - 1, reduced_sizes, reduced_a)
        mask = k_mask[:, None] & (r < inner)[None, :]
        if EVEN:  # BLOCK_K divides the outputs and BLOCK_R the innermost reduced dim
            x = tl.load(a_ptr + (a_k[:, None] + r_offsets[None, :]))
        else:
            x = tl.load(a_ptr + (a_k[:, None] + r_offsets[None, :]), mask=mask, other=0.0)
        x_index = 0
        if INDEXED:
            x_index = r * reduced_w[REDUCED_DIMS - 1] + dim_offsets(row, REDUCED_DIMS - 1, reduced_sizes, reduced_w)
            x_index = x_index[None, :]
        acc, acc_index = accumulate(
            KIND, PROPAGATE_NAN, INDEXED, acc, acc_index, element_key(OP, x.to(COMPUTE)), x_index, mask, FAST, EVEN
        )
    value, index = reduce_tile(KIND, PROPAGATE_NAN, INDEXED, acc, acc_index, 1, FAST)

    if PARTIAL:
        store_partials(partial_ptr, partial_index_ptr, pid_s * kept_total + k, value, index, k_mask, INDEXED)
    else:
        store_result(
            OP,
            value,
            index,
            c_ptr,
            dim_offsets(k, KEPT_DIMS, kept_sizes, kept_c),
            index_ptr,
            dim_offsets(k, KEPT_DIMS, kept_sizes, kept_i),
            k_mask,
            count,
            alpha,
            beta,
            HAS_BETA,
            INDEXED,
            COMPUTE,
        )


@triton.jit
def reduce_columns_kernel(
    a_ptr,
    c_ptr,
    index_ptr,
    partial_ptr,
    partial_index_ptr,
    kept_sizes,
    kept_a,
    kept_c,
    kept_i,
    reduced_sizes,
    reduced_a,
    reduced_w,
    kept_total,
    column_blocks,
    reduced_total,
    iterations,
    count: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    OP: tl.constexpr,
    KIND: tl.constexpr,
    KEPT_DIMS: tl.constexpr,
    REDUCED_DIMS: tl.constexpr,
    INDEXED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    PARTIAL: tl.constexpr,
    INNER_UNIT: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    FAST: tl.constexpr,
):
    """Program (k, s): BLOCK_K consecutive outputs along the innermost kept dim (one index of the
    outer kept dims) over reduced blocks [s*T/S, (s+1)*T/S) of T = cdiv(reduced_total, BLOCK_R)."""
    pid_k = tl.program_id(0).to(tl.int64)
    pid_s = tl.program_id(1).to(tl.int64)
    outer = pid_k // column_blocks
    k_inner = (pid_k - outer * column_blocks) * BLOCK_K + tl.arange(0, BLOCK_K)
    inner = kept_sizes[KEPT_DIMS - 1]
    k_mask = k_inner < inner
    k = outer * inner + k_inner  # flattened over the kept dims
    if INNER_UNIT:
        a_k = k_inner
    else:
        a_k = k_inner * kept_a[KEPT_DIMS - 1]
    a_k += dim_offsets(outer, KEPT_DIMS - 1, kept_sizes, kept_a)
    lanes = tl.arange(0, BLOCK_R)
    begin = pid_s * iterations // tl.num_programs(1)
    end = (pid_s + 1) * iterations // tl.num_programs(1)

    acc = neutral(KIND, PROPAGATE_NAN, tl.zeros((BLOCK_R, BLOCK_K), COMPUTE))
    acc_index = tl.full((BLOCK_R, BLOCK_K), 4611686018427387904, tl.int64)  # 2**62 loses every tie
    for t in range(begin, end):
        r = t * BLOCK_R + lanes
        mask = (r < reduced_total)[:, None] & k_mask[None, :]
        r_offsets = dim_offsets(r, REDUCED_DIMS, reduced_sizes, reduced_a)
        x = tl.load(a_ptr + (r_offsets[:, None] + a_k[None, :]), mask=mask, other=0.0)
        x_index = 0
        if INDEXED:
            x_index = dim_offsets(r, REDUCED_DIMS, reduced_sizes, reduced_w)[:, None]
        acc, acc_index = accumulate(
            KIND, PROPAGATE_NAN, INDEXED, acc, acc_index, element_key(OP, x.to(COMPUTE)), x_index, mask, FAST
        )
    value, index = reduce_tile(KIND, PROPAGATE_NAN, INDEXED, acc, acc_index, 0, FAST)

    if PARTIAL:
        store_partials(partial_ptr, partial_index_ptr, pid_s * kept_total + k, value, index, k_mask, INDEXED)
    else:
        outer_c = dim_offsets(outer, KEPT_DIMS - 1, kept_sizes, kept_c)
        outer_i = dim_offsets(outer, KEPT_DIMS - 1, kept_sizes, kept_i)
        store_result(
            OP,
            value,
            index,
            c_ptr,
            outer_c + k_inner * kept_c[KEPT_DIMS - 1],
            index_ptr,
            outer_i + k_inner * kept_i[KEPT_DIMS - 1],
            k_mask,
            count,
            alpha,
            beta,
            HAS_BETA,
            INDEXED,
            COMPUTE,
        )


@triton.jit
def reduce_partials_kernel(
    c_ptr,
    index_ptr,
    partial_ptr,
    partial_index_ptr,
    kept_sizes,
    kept_c,
    kept_i,
    kept_total,
    splits,
    count: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    OP: tl.constexpr,
    KIND: tl.constexpr,
    KEPT_DIMS: tl.constexpr,
    INDEXED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Combine the ``splits`` partial results of each output, slice 0 first, and store C."""
    k = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = k < kept_total
    acc = neutral(KIND, PROPAGATE_NAN, tl.zeros((BLOCK,), COMPUTE))
    acc_index = tl.full((BLOCK,), 4611686018427387904, tl.int64)
    for s in range(splits):
        x = tl.load(partial_ptr + s * kept_total + k, mask=mask, other=0.0)
        x_index = 0
        if INDEXED:
            x_index = tl.load(partial_index_ptr + s * kept_total + k, mask=mask, other=0)
        acc, acc_index = accumulate(KIND, PROPAGATE_NAN, INDEXED, acc, acc_index, x, x_index, mask)
    store_result(
        OP,
        acc,
        acc_index,
        c_ptr,
        dim_offsets(k, KEPT_DIMS, kept_sizes, kept_c),
        index_ptr,
        dim_offsets(k, KEPT_DIMS, kept_sizes, kept_i),
        mask,
        count,
        alpha,
        beta,
        HAS_BETA,
        INDEXED,
        COMPUTE,
    )


@dataclass(frozen=True)
class ReducePlan:
    """The canonical layout of a reduction and how it is cut into programs."""

    kept: tuple[tuple[int, tuple[int, ...]], ...]  # (size, (A, C, indices strides)), innermost last
    reduced: tuple[tuple[int, tuple[int, ...]], ...]  # (size, (A stride, flattened-index weight))
    columns: bool
    block_k: int
    block_r: int
    iterations: int  # tiles along the reduced set per output block
    splits: int
    value_bytes: int  # workspace for partial values (16-byte aligned), then partial indices
    index_bytes: int

    @property
    def kept_total(self) -> int:
        return math.prod(size for size, _ in self.kept)

    @property
    def workspace_bytes(self) -> int:
        return self.value_bytes + self.index_bytes


@functools.lru_cache(maxsize=256)  # per problem, asked by the workspace size query and every run
def reduce_plan(problem: ReduceProblem) -> ReducePlan:
    """Canonicalise the layout, pick the kernel and its tile, and decide the split."""
    a, c = problem.a, problem.c
    index_strides = problem.indices.strides if problem.indices is not None else (0,) * a.ndim
    weights = [0] * a.ndim
    step = 1
    for k in reversed(problem.reduced_axes):  # row-major over the reduced dims in A's dim order
        weights[k] = step
        step *= a.dims[k]
    kept = merged_dims(
        [
            (a.dims[k], (a.strides[k], c.strides[k], index_strides[k]))
            for k in range(a.ndim)
            if k not in problem.reduced_axes and a.dims[k] > 1
        ]
    ) or [(1, (0, 0, 0))]
    reduced = merged_dims([(a.dims[k], (a.strides[k], weights[k])) for k in problem.reduced_axes]) or [(1, (0, 0))]
    kept_total = math.prod(size for size, _ in kept)
    reduced_total = math.prod(size for size, _ in reduced)
    kept_inner, (kept_stride, _, _) = kept[-1]
    columns = kept_inner >= COLUMN_MIN and (reduced_total == 1 or kept_stride < reduced[-1][1][0])
    if columns:
        block_k = min(triton.next_power_of_2(kept_inner), COLUMN_BLOCK)
        block_r = min(TILE_ELEMENTS // block_k, triton.next_power_of_2(reduced_total))
        iterations = triton.cdiv(reduced_total, block_r)
        programs = kept_total // kept_inner * triton.cdiv(kept_inner, block_k)
    else:
        reduced_inner = reduced[-1][0]
        block_r = min(triton.next_power_of_2(reduced_inner), ROW_BLOCK)
        block_k = min(TILE_ELEMENTS // block_r, triton.next_power_of_2(kept_total))
        iterations = reduced_total // reduced_inner * triton.cdiv(reduced_inner, block_r)
        programs = triton.cdiv(kept_total, block_k)
    splits, target = 1, programs_to_fill(PROGRAMS_PER_SM, power_of_two=True)
    if programs < target:
        splits = max(1, min(MAX_SPLITS, triton.cdiv(target, programs), iterations // MIN_SLICE_ITERATIONS))
    value_bytes = index_bytes = 0
    if splits > 1:
        value_bytes = -(-splits * kept_total * problem.compute_dtype.itemsize // 16) * 16
        index_bytes = splits * kept_total * INDEX_BYTES if problem.indices is not None else 0
    return ReducePlan(
        tuple(kept), tuple(reduced), columns, block_k, block_r, iterations, splits, value_bytes, index_bytes
    )


def supports(problem: ReduceProblem) -> str | None:
    return None


def workspace_size(problem: ReduceProblem) -> int:
    """Bytes of workspace ``run`` needs: partial results when the reduced set is split, else 0."""
    return reduce_plan(problem).workspace_bytes


def run(problem: ReduceProblem, a: Bound, c: Bound, indices: Bound | None, workspace: Bound | None = None) -> None:
    import torch

    plan = reduce_plan(problem)
    tensors = {"a": torch_view(a), "c": torch_view(c)}
    if problem.indices is not None and indices is not None:
        tensors["indices"] = torch_view(indices)
    indexed = "indices" in tensors
    if plan.splits > 1:
        if workspace is None or workspace.desc.numel < plan.workspace_bytes:
            raise InternalError(
                f"reduce needs {plan.workspace_bytes} bytes of workspace, got "
                f"{0 if workspace is None else workspace.desc.numel}"
            )
        space = torch_view(workspace).reshape(-1).view(torch.uint8)
        tensors["partial"] = space[: plan.value_bytes].view(
            torch.float64 if problem.compute_dtype is DataType.DOUBLE else torch.float32
        )
        if indexed:
            tensors["partial_index"] = space[plan.value_bytes : plan.workspace_bytes].view(torch.int64)
    reduce_launches(problem, indexed, FAST_PICKS and tensors["a"].is_cuda)(tensors)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (reductions keep no plan)
def reduce_launches(problem: ReduceProblem, indexed: bool, fast: bool = False) -> Launches:
    """The launches computing ``problem`` (with the indices when ``indexed``; ``fast``: on a GPU,
    see ``accumulate``), planned once: the reduction, then the combination of the partial results
    when the reduced set is split."""
    plan = reduce_plan(problem)
    split = plan.splits > 1
    c, indices = Slot("c"), Slot("indices" if indexed else "c")
    partial, partial_index = Slot("partial" if split else "c"), Slot("partial_index" if split and indexed else "c")
    kept_sizes, kept_a, kept_c, kept_i = _padded(plan.kept, 3)
    reduced_sizes, reduced_a, reduced_w = _padded(plan.reduced, 2)
    op = problem.op.value
    flags = dict(
        OP=op,
        KIND=KIND[op],
        KEPT_DIMS=len(plan.kept),
        INDEXED=indexed,
        PROPAGATE_NAN=problem.propagate_nan,
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32,
    )
    scalars = (float(problem.reduced_count), problem.alpha, problem.beta)
    grid = (_programs(plan), plan.splits)
    kernel_flags = dict(
        flags,
        REDUCED_DIMS=len(plan.reduced),
        PARTIAL=split,
        BLOCK_K=plan.block_k,
        BLOCK_R=plan.block_r,
        FAST=fast,
        num_warps=max(1, min(8, plan.block_k * plan.block_r // 512)),
    )
    common = (
        Slot("a"),
        c,
        indices,
        partial,
        partial_index,
        kept_sizes,
        kept_a,
        kept_c,
        kept_i,
        reduced_sizes,
        reduced_a,
        reduced_w,
        plan.kept_total,
    )
    if plan.columns:
        launch = Launch(
            reduce_columns_kernel,
            grid,
            (*common, triton.cdiv(plan.kept[-1][0], plan.block_k), math.prod(reduced_sizes), plan.iterations, *scalars),
            dict(INNER_UNIT=plan.kept[-1][1][0] == 1, **kernel_flags),
        )
    else:
        launch = Launch(
            reduce_rows_kernel,
            grid,
            (*common, triton.cdiv(plan.reduced[-1][0], plan.block_r), plan.iterations, *scalars),
            dict(
                INNER_UNIT=plan.reduced[-1][1][0] == 1,
                EVEN=plan.reduced[-1][0] % plan.block_r == 0 and plan.kept_total % plan.block_k == 0,
                **kernel_flags,
            ),
        )
    if not split:
        return Launches((launch,))
    block = min(FINAL_BLOCK, triton.next_power_of_2(plan.kept_total))
    return Launches(
        (
            launch,
            Launch(
                reduce_partials_kernel,
                (triton.cdiv(plan.kept_total, block),),
                (
                    c,
                    indices,
                    partial,
                    partial_index,
                    kept_sizes,
                    kept_c,
                    kept_i,
                    plan.kept_total,
                    plan.splits,
                    *scalars,
                ),
                dict(BLOCK=block, num_warps=4, **flags),
            ),
        )
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run of a caller's plan
def scratch_launches(problem: ReduceProblem, fast: bool = False) -> Launches:
    """``reduce_launches`` without indices for a caller that holds no workspace (a global pooling): the
    partial results of a split go to a per-call scratch."""
    launches = reduce_launches(problem, False, fast)
    plan = reduce_plan(problem)
    if plan.splits == 1:
        return launches
    import torch

    double = problem.compute_dtype is DataType.DOUBLE
    partial = Scratch("partial", plan.splits * plan.kept_total, torch.float64 if double else torch.float32)
    return Launches(launches.launches, (partial,))


def _programs(plan: ReducePlan) -> int:
    if plan.columns:
        inner = plan.kept[-1][0]
        return plan.kept_total // inner * triton.cdiv(inner, plan.block_k)
    return triton.cdiv(plan.kept_total, plan.block_k)


def _padded(dims: tuple[tuple[int, tuple[int, ...]], ...], count: int) -> tuple[tuple[int, ...], ...]:
    """(sizes, strides_0, ..., strides_{count-1}), each padded to MAX_DIMS with size 1, stride 0."""
    pad = MAX_DIMS - len(dims)
    sizes = tuple(size for size, _ in dims) + (1,) * pad
    return (sizes, *(tuple(strides[j] for _, strides in dims) + (0,) * pad for j in range(count)))
