"""The pieces both matrix-product engines share (the ``tl.dot`` kernel of ``triton_backend`` and the
warp-specialized Hopper kernel of ``gluon_hopper``): the grouped order of the tiles of C, the element
offset of a batch, and the fused epilogue that finishes a tile of the accumulator and stores it.

They are ``@triton.jit`` functions that make no index ranges of their own: a Gluon kernel calls them
too (its compiler lowers their ``tl`` operations with the layouts of the tensors they are given), so
the epilogue takes the in-tile row and column indices from its caller, in the caller's layout.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.matmul.problem import BiasAxis, MatmulProblem
from opendnn.kernels.activation import activation
from opendnn.kernels.blend import narrowed


@triton.jit
def tile_coordinates(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(batch, tile row, tile column) of a linear tile index: GROUP_M tile rows are walked
    column by column, so GROUP_M rows of A and one column of B serve GROUP_M tiles from L2."""
    per_batch = tiles_m * tiles_n
    batch = tile // per_batch
    index = tile % per_batch
    per_group = GROUP_M * tiles_n
    first_m = (index // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return batch, first_m + (index % per_group) % group_rows, (index % per_group) // group_rows


@triton.jit
def batch_offset(batch, batch_inner, stride_outer, stride_inner):
    """Element offset of a flat batch index over two batch dims (inner size ``batch_inner``)."""
    batch = batch.to(tl.int64)
    return (batch // batch_inner) * stride_outer + (batch % batch_inner) * stride_inner


@triton.jit
def finish_tile(
    acc,
    local_rows,
    local_cols,
    row0,
    col0,
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
    HAS_BIAS: tl.constexpr,
    BIAS_PER_ROW: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_BETA: tl.constexpr,
    ACC: tl.constexpr,
    FAST: tl.constexpr,
):
    """The epilogue of the accumulator tile at (row0, col0) of C, then its masked store.

    ``local_rows`` and ``local_cols`` are ``0 .. acc.shape - 1`` in the slices of ``acc``'s layout
    (``tl.arange`` in a ``tl`` kernel); FAST: a 16-bit C on a GPU, whose activation may use the
    approximate instructions."""
    rows = row0 + local_rows
    cols = col0 + local_cols
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    acc = acc * tl.cast(scale, ACC)
    if HAS_BIAS:
        if BIAS_PER_ROW:
            acc += tl.load(bias_ptr + rows * bias_stride, mask=rows < M).to(ACC)[:, None]
        else:
            acc += tl.load(bias_ptr + cols * bias_stride, mask=cols < N).to(ACC)[None, :]
    if ACTIVATION != "":
        acc = activation(ACTIVATION, acc, tl.cast(coef, ACC), FAST).to(ACC)
    if HAS_RESIDUAL:
        r_tile = r_base + row0.to(tl.int64) * r_stride_m + col0.to(tl.int64) * r_stride_n
        acc += tl.load(r_tile + local_rows[:, None] * r_stride_m + local_cols[None, :] * r_stride_n, mask=mask).to(ACC)
    acc = acc * tl.cast(alpha, ACC)
    c_tile = c_base + row0.to(tl.int64) * c_stride_m + col0.to(tl.int64) * c_stride_n
    c_offsets = local_rows[:, None] * c_stride_m + local_cols[None, :] * c_stride_n
    if HAS_BETA:  # with beta == 0, C is never read: it may hold NaN
        acc += tl.cast(beta, ACC) * tl.load(c_tile + c_offsets, mask=mask).to(ACC)
    tl.store(c_tile + c_offsets, narrowed(acc, c_base.dtype.element_ty), mask=mask)


def persistent_programs(tiles: int, sms: int) -> int:
    """The programs of a persistent kernel: one per SM, or one per tile where there are fewer."""
    return max(1, min(tiles, sms))


def epilogue_arguments(
    c: TensorDescriptor,
    bias: TensorDescriptor | None,
    residual: TensorDescriptor | None,
    c_batch_strides: tuple[int, int],
    r_batch_strides: tuple[int, int] | None,
) -> tuple[int, ...]:
    """The kernels' epilogue arguments, in their order: C's two batch strides and its row and column
    strides, the residual's (zeros without one), the bias's stride (0 without one)."""
    r_strides = (
        (0, 0, 0, 0) if residual is None or r_batch_strides is None else (*r_batch_strides, *residual.strides[-2:])
    )
    return (*c_batch_strides, *c.strides[-2:], *r_strides, 0 if bias is None else bias.strides[0])


def epilogue_options(problem: MatmulProblem, has_bias: bool, has_residual: bool, fast: bool) -> dict[str, Any]:
    """The constexprs of ``finish_tile`` for a problem, by the names the kernels give them."""
    return dict(
        HAS_BIAS=has_bias,
        BIAS_PER_ROW=problem.bias_axis is BiasAxis.ROW,
        ACTIVATION="" if problem.activation is None else problem.activation.value.removesuffix("_fwd"),
        HAS_RESIDUAL=has_residual,
        HAS_BETA=problem.beta != 0.0,
        ACC=tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32,
        FAST=fast,
    )
