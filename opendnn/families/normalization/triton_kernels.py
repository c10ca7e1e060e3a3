"""The Triton kernels of layer, group, instance and RMS normalization (forward, backward, the
finalizing pass of the split parameter gradients); ``triton_backend`` plans and launches them."""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.kernels.blend import blend_store, narrowed
from opendnn.kernels.indexing import dim_offsets, flat_offsets


@triton.jit
def load_row_tile(ptr, row_offsets, col_offsets, mask, COMPUTE: tl.constexpr):
    return tl.load(ptr + (row_offsets[:, None] + col_offsets[None, :]), mask=mask, other=0.0).to(COMPUTE)


@triton.jit
def row_offsets_of(g, rows, group_stride, ROW_DIMS: tl.constexpr, row_sizes, row_strides, ALIGN: tl.constexpr):
    offsets = g * group_stride + dim_offsets(rows, ROW_DIMS, row_sizes, row_strides)
    return tl.multiple_of(offsets, ALIGN)


@triton.jit
def load_params(
    scale_ptr,
    bias_ptr,
    g,
    cols,
    col_mask,
    row_size,
    params_per_group,
    PER_SPATIAL: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """Scale and bias of columns ``cols`` of group g ((1, BLOCK) tiles; 1 and 0 when absent)."""
    if PER_SPATIAL:
        index = g * params_per_group + cols // (row_size // params_per_group)
    else:
        index = cols
    scale = tl.full((1, cols.shape[0]), 1.0, COMPUTE)
    bias = tl.zeros((1, cols.shape[0]), COMPUTE)
    if HAS_SCALE:
        scale = tl.load(scale_ptr + index, mask=col_mask, other=0.0).to(COMPUTE)[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + index, mask=col_mask, other=0.0).to(COMPUTE)[None, :]
    return scale, bias


@triton.jit
def row_statistics(x, mask, row_size, eps, RMS: tl.constexpr):
    """(mean, inv_std) of the rows of a register tile (mean 0 for RMS)."""
    count = tl.cast(row_size, x.dtype)
    if RMS:
        mean = tl.zeros((x.shape[0],), x.dtype)
        square = tl.sum(x * x, axis=1) / count
    else:
        mean = tl.sum(x, axis=1) / count
        centered = tl.where(mask, x - mean[:, None], 0.0)
        square = tl.sum(centered * centered, axis=1) / count
    return mean, 1.0 / tl.sqrt(square + eps)


@triton.jit
def streamed_statistics(
    x_ptr,
    x_rows,
    row_mask,
    row_size,
    eps,
    COL_DIMS: tl.constexpr,
    col_sizes,
    col_x,
    COL_UNIT: tl.constexpr,
    RMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """(mean, inv_std) of rows too long for registers (mean 0 for RMS, whose inv_std is that of the
    mean square): one pass of sums shifted by the row's first element (mean + small deviations:
    no catastrophic cancellation)."""
    shift = tl.zeros((BLOCK_R,), COMPUTE)
    if not RMS:
        shift = tl.load(x_ptr + x_rows, mask=row_mask, other=0.0).to(COMPUTE)
    first = tl.zeros((BLOCK_R, BLOCK), COMPUTE)
    second = tl.zeros((BLOCK_R, BLOCK), COMPUTE)
    for start in range(0, row_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = row_mask[:, None] & (cols < row_size)[None, :]
        x = load_row_tile(x_ptr, x_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT), mask, COMPUTE)
        d = tl.where(mask, x - shift[:, None], 0.0)
        if not RMS:
            first += d
        second += d * d
    count = tl.cast(row_size, COMPUTE)
    if RMS:
        mean = shift  # zeros: RMS norm neither centres nor subtracts a squared mean
        square = tl.sum(second, axis=1) / count
    else:
        mean_shifted = tl.sum(first, axis=1) / count
        mean = shift + mean_shifted
        square = tl.maximum(tl.sum(second, axis=1) / count - mean_shifted * mean_shifted, 0.0)
    return mean, 1.0 / tl.sqrt(square + eps)


@triton.jit
def norm_forward_kernel(
    x_ptr,
    y_ptr,
    scale_ptr,
    bias_ptr,
    mean_ptr,
    rstd_ptr,
    group_strides,
    row_sizes,
    row_x,
    row_y,
    row_stats,
    col_sizes,
    col_x,
    col_y,
    inner_rows,
    row_size,
    params_per_group,
    eps: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    ROW_DIMS: tl.constexpr,
    COL_DIMS: tl.constexpr,
    COL_UNIT: tl.constexpr,
    ALIGN: tl.constexpr,
    PER_SPATIAL: tl.constexpr,
    RMS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    HAS_RSTD: tl.constexpr,
    HAS_BETA: tl.constexpr,
    SINGLE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < inner_rows
    x_rows = row_offsets_of(g, rows, group_strides[0], ROW_DIMS, row_sizes, row_x, ALIGN)
    y_rows = row_offsets_of(g, rows, group_strides[1], ROW_DIMS, row_sizes, row_y, ALIGN)
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        col_mask = cols < row_size
        mask = row_mask[:, None] & col_mask[None, :]
        x = load_row_tile(x_ptr, x_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT), mask, COMPUTE)
        mean, rstd = row_statistics(x, mask, row_size, tl.cast(eps, COMPUTE), RMS)
        scale, bias = load_params(
            scale_ptr,
            bias_ptr,
            g,
            cols,
            col_mask,
            row_size,
            params_per_group,
            PER_SPATIAL,
            HAS_SCALE,
            HAS_BIAS,
            COMPUTE,
        )
        y = (x - mean[:, None]) * rstd[:, None] * scale + bias
        blend_store(
            y_ptr,
            y_rows[:, None] + flat_offsets(cols, COL_DIMS, col_sizes, col_y, COL_UNIT)[None, :],
            mask,
            y,
            tl.cast(alpha, COMPUTE),
            tl.cast(beta, COMPUTE),
            HAS_BETA,
        )
    else:
        mean, rstd = streamed_statistics(
            x_ptr,
            x_rows,
            row_mask,
            row_size,
            tl.cast(eps, COMPUTE),
            COL_DIMS,
            col_sizes,
            col_x,
            COL_UNIT,
            RMS,
            COMPUTE,
            BLOCK_R,
            BLOCK,
        )
        for start in range(0, row_size, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            col_mask = cols < row_size
            mask = row_mask[:, None] & col_mask[None, :]
            x = load_row_tile(x_ptr, x_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT), mask, COMPUTE)
            scale, bias = load_params(
                scale_ptr,
                bias_ptr,
                g,
                cols,
                col_mask,
                row_size,
                params_per_group,
                PER_SPATIAL,
                HAS_SCALE,
                HAS_BIAS,
                COMPUTE,
            )
            y = (x - mean[:, None]) * rstd[:, None] * scale + bias
            blend_store(
                y_ptr,
                y_rows[:, None] + flat_offsets(cols, COL_DIMS, col_sizes, col_y, COL_UNIT)[None, :],
                mask,
                y,
                tl.cast(alpha, COMPUTE),
                tl.cast(beta, COMPUTE),
                HAS_BETA,
            )
    stats_rows = g * group_strides[3] + dim_offsets(rows, ROW_DIMS, row_sizes, row_stats)
    if HAS_MEAN:
        tl.store(mean_ptr + stats_rows, mean, mask=row_mask)
    if HAS_RSTD:
        tl.store(rstd_ptr + stats_rows, rstd, mask=row_mask)


@triton.jit
def add_pairs(a, b, c, d):
    return a + c, b + d


@triton.jit
def add_triples(a, b, c, d, e, f):
    return a + d, b + e, c + f


@triton.jit
def row_gradient(
    x, dy, mask, mean, rstd, scale, row_size, eps, RMS: tl.constexpr, HAS_MEAN: tl.constexpr, HAS_RSTD: tl.constexpr
):
    """(dx, xhat) of a register tile of whole rows, with the statistics given (HAS_MEAN, HAS_RSTD)
    or computed here. The row sums share one cross-warp reduction (sum(g * (x - mean)), sum(g)
    and, without rstd, sum((x - mean)^2); sum(g * xhat) = rstd * sum(g * (x - mean))), after the
    mean's own when layer norm recomputes it: one or two barrier rounds per tile, not four."""
    count = tl.cast(row_size, x.dtype)
    if not (HAS_MEAN or RMS):
        mean = tl.sum(x, axis=1) / count
    centered = tl.where(mask, x - mean[:, None], 0.0)
    g = dy * scale
    if HAS_RSTD:
        if RMS:
            g_centered = tl.sum(g * centered, axis=1)
            g_sum = g_centered  # unused
        else:
            g_centered, g_sum = tl.reduce((g * centered, g), 1, add_pairs)
    else:
        if RMS:
            square, g_centered = tl.reduce((centered * centered, g * centered), 1, add_pairs)
            g_sum = square  # unused
        else:
            square, g_centered, g_sum = tl.reduce((centered * centered, g * centered, g), 1, add_triples)
        rstd = 1.0 / tl.sqrt(square / count + eps)
    xhat = centered * rstd[:, None]
    inner = g - xhat * (g_centered * rstd / count)[:, None]
    if not RMS:
        inner -= (g_sum / count)[:, None]
    return rstd[:, None] * inner, xhat


@triton.jit
def norm_backward_kernel(
    x_ptr,
    dy_ptr,
    dx_ptr,
    scale_ptr,
    mean_ptr,
    rstd_ptr,
    partial_ptr,
    group_strides,
    row_sizes,
    row_x,
    row_dy,
    row_dx,
    row_stats,
    col_sizes,
    col_x,
    col_dy,
    col_dx,
    inner_rows,
    row_size,
    params_per_group,
    eps: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    ROW_DIMS: tl.constexpr,
    COL_DIMS: tl.constexpr,
    COL_UNIT: tl.constexpr,
    ALIGN: tl.constexpr,
    PER_SPATIAL: tl.constexpr,
    RMS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_MEAN: tl.constexpr,
    HAS_RSTD: tl.constexpr,
    HAS_BETA: tl.constexpr,
    SINGLE: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Program (g, p): tiles p, p + P, ... of group g; partial column sums of dy * xhat and dy go
    to the workspace at [0 or 1, g, p, column]."""
    g = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    programs = tl.num_programs(1)
    slice_offset = (g * programs + p) * row_size
    half = tl.num_programs(0).to(tl.int64) * programs * row_size  # where the dy sums start
    tiles = tl.cdiv(inner_rows, BLOCK_R)
    eps = tl.cast(eps, COMPUTE)
    if SINGLE:
        cols = tl.arange(0, BLOCK)
        col_mask = cols < row_size
        scale, _ = load_params(
            scale_ptr, scale_ptr, g, cols, col_mask, row_size, params_per_group, PER_SPATIAL, HAS_SCALE, False, COMPUTE
        )
        x_cols = flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT)
        dy_cols = flat_offsets(cols, COL_DIMS, col_sizes, col_dy, COL_UNIT)
        dx_cols = flat_offsets(cols, COL_DIMS, col_sizes, col_dx, COL_UNIT)
        dscale = tl.zeros((BLOCK,), COMPUTE)
        dbias = tl.zeros((BLOCK,), COMPUTE)
    for tile in tl.range(p, tiles, programs, num_stages=STAGES):
        rows = tile * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        row_mask = rows < inner_rows
        x_rows = row_offsets_of(g, rows, group_strides[0], ROW_DIMS, row_sizes, row_x, ALIGN)
        dy_rows = row_offsets_of(g, rows, group_strides[1], ROW_DIMS, row_sizes, row_dy, ALIGN)
        dx_rows = row_offsets_of(g, rows, group_strides[2], ROW_DIMS, row_sizes, row_dx, ALIGN)
        stats_rows = g * group_strides[3] + dim_offsets(rows, ROW_DIMS, row_sizes, row_stats)
        mean = tl.zeros((BLOCK_R,), COMPUTE)  # RMS; else given, or computed here or in row_gradient
        rstd = mean
        if SINGLE:
            mask = row_mask[:, None] & col_mask[None, :]
            x = load_row_tile(x_ptr, x_rows, x_cols, mask, COMPUTE)
            dy = load_row_tile(dy_ptr, dy_rows, dy_cols, mask, COMPUTE)
        elif not (HAS_RSTD and (HAS_MEAN or RMS)):  # no saved statistics (RMS: mean 0): a pass over x for them
            mean, rstd = streamed_statistics(
                x_ptr,
                x_rows,
                row_mask,
                row_size,
                eps,
                COL_DIMS,
                col_sizes,
                col_x,
                COL_UNIT,
                RMS,
                COMPUTE,
                BLOCK_R,
                BLOCK,
            )
        if HAS_RSTD:
            rstd = tl.load(rstd_ptr + stats_rows, mask=row_mask, other=1.0).to(COMPUTE)
        if HAS_MEAN:
            mean = tl.load(mean_ptr + stats_rows, mask=row_mask, other=0.0).to(COMPUTE)
        if SINGLE:
            dx, xhat = row_gradient(x, dy, mask, mean, rstd, scale, row_size, eps, RMS, HAS_MEAN, HAS_RSTD)
            blend_store(
                dx_ptr,
                dx_rows[:, None] + dx_cols[None, :],
                mask,
                dx,
                tl.cast(alpha, COMPUTE),
                tl.cast(beta, COMPUTE),
                HAS_BETA,
            )
            dscale += tl.sum(dy * xhat, axis=0)
            dbias += tl.sum(dy, axis=0)
        else:
            streamed_row_gradient(
                x_ptr,
                dy_ptr,
                dx_ptr,
                scale_ptr,
                partial_ptr + slice_offset,
                half,
                tile == p,
                g,
                x_rows,
                dy_rows,
                dx_rows,
                row_mask,
                mean,
                rstd,
                row_size,
                params_per_group,
                alpha,
                beta,
                COL_DIMS,
                col_sizes,
                col_x,
                col_dy,
                col_dx,
                COL_UNIT,
                PER_SPATIAL,
                RMS,
                HAS_SCALE,
                HAS_BETA,
                COMPUTE,
                BLOCK_R,
                BLOCK,
            )
    if SINGLE:
        tl.store(partial_ptr + slice_offset + cols, dscale, mask=col_mask)
        tl.store(partial_ptr + half + slice_offset + cols, dbias, mask=col_mask)


@triton.jit
def streamed_row_gradient(
    x_ptr,
    dy_ptr,
    dx_ptr,
    scale_ptr,
    partial_ptr,
    half,
    first_tile,
    g,
    x_rows,
    dy_rows,
    dx_rows,
    row_mask,
    mean,
    rstd,
    row_size,
    params_per_group,
    alpha,
    beta,
    COL_DIMS: tl.constexpr,
    col_sizes,
    col_x,
    col_dy,
    col_dx,
    COL_UNIT: tl.constexpr,
    PER_SPATIAL: tl.constexpr,
    RMS: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    HAS_BETA: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Backward of rows too long for registers, given their statistics: the two row sums, then dx
    and the partial column sums (added into this program's workspace slice; the row sums' cross-warp
    reductions, barriers, separate one tile's stores from the next tile's loads of the slice)."""
    sum_g = tl.zeros((BLOCK_R, BLOCK), COMPUTE)
    sum_gx = tl.zeros((BLOCK_R, BLOCK), COMPUTE)
    for start in range(0, row_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        col_mask = cols < row_size
        mask = row_mask[:, None] & col_mask[None, :]
        x = load_row_tile(x_ptr, x_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT), mask, COMPUTE)
        dy = load_row_tile(dy_ptr, dy_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_dy, COL_UNIT), mask, COMPUTE)
        scale, _ = load_params(
            scale_ptr, scale_ptr, g, cols, col_mask, row_size, params_per_group, PER_SPATIAL, HAS_SCALE, False, COMPUTE
        )
        grad = dy * scale
        sum_g += grad
        sum_gx += tl.where(mask, grad * (x - mean[:, None]) * rstd[:, None], 0.0)
    count = tl.cast(row_size, COMPUTE)
    projection = tl.sum(sum_gx, axis=1) / count
    average = tl.sum(sum_g, axis=1) / count
    for start in range(0, row_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        col_mask = cols < row_size
        mask = row_mask[:, None] & col_mask[None, :]
        x = load_row_tile(x_ptr, x_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_x, COL_UNIT), mask, COMPUTE)
        dy = load_row_tile(dy_ptr, dy_rows, flat_offsets(cols, COL_DIMS, col_sizes, col_dy, COL_UNIT), mask, COMPUTE)
        scale, _ = load_params(
            scale_ptr, scale_ptr, g, cols, col_mask, row_size, params_per_group, PER_SPATIAL, HAS_SCALE, False, COMPUTE
        )
        xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        inner = dy * scale - xhat * projection[:, None]
        if not RMS:
            inner -= average[:, None]
        blend_store(
            dx_ptr,
            dx_rows[:, None] + flat_offsets(cols, COL_DIMS, col_sizes, col_dx, COL_UNIT)[None, :],
            mask,
            rstd[:, None] * inner,
            tl.cast(alpha, COMPUTE),
            tl.cast(beta, COMPUTE),
            HAS_BETA,
        )
        dscale = tl.sum(dy * xhat, axis=0)
        dbias = tl.sum(dy, axis=0)
        if not first_tile:
            dscale += tl.load(partial_ptr + cols, mask=col_mask, other=0.0)
            dbias += tl.load(partial_ptr + half + cols, mask=col_mask, other=0.0)
        tl.store(partial_ptr + cols, dscale, mask=col_mask)
        tl.store(partial_ptr + half + cols, dbias, mask=col_mask)


@triton.jit
def norm_finalize_kernel(
    partial_ptr,
    dscale_ptr,
    dbias_ptr,
    param_sizes,
    dscale_strides,
    dbias_strides,
    parameters,
    programs,
    row_size,
    params_per_group,
    half,
    alpha: tl.float64,
    beta: tl.float64,
    PARAM_DIMS: tl.constexpr,
    HAS_DSCALE: tl.constexpr,
    HAS_BETA: tl.constexpr,
    BLOCK_F: tl.constexpr,
    ROWS: tl.constexpr,
):
    """dscale[f] (and dbias[f]) = alpha * (sum over programs p and the S = row_size / params_per_group
    columns of parameter f of the partials, slice 0 first) + beta * prior; f = g * params_per_group + q
    is the parameter's flattened index, placed through the caller's strides. Program (i, k) sums
    block i of dscale (k = 0) or dbias (k = 1; k = 0 when dbias is the only output)."""
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    which = tl.program_id(1) + (0 if HAS_DSCALE else 1)
    f_mask = f < parameters
    g = f // params_per_group
    spatial = row_size // params_per_group
    column = (f - g * params_per_group) * spatial
    first_slice = g.to(tl.int64) * programs  # of the group's workspace slices (int64: large workspaces)
    count = programs * spatial  # summands per parameter, walked as r = p * spatial + s
    acc = tl.zeros((ROWS, BLOCK_F), partial_ptr.dtype.element_ty)
    for start in range(0, count, ROWS):
        r = start + tl.arange(0, ROWS)
        p = r // spatial
        summands = (
            which * half + (first_slice[None, :] + p[:, None]) * row_size + column[None, :] + (r - p * spatial)[:, None]
        )
        acc += tl.load(partial_ptr + summands, mask=(r < count)[:, None] & f_mask[None, :], other=0.0)
    total = tl.sum(acc, axis=0)
    if which == 0:
        blend_vector(
            dscale_ptr + dim_offsets(f, PARAM_DIMS, param_sizes, dscale_strides), f_mask, total, alpha, beta, HAS_BETA
        )
    else:
        blend_vector(
            dbias_ptr + dim_offsets(f, PARAM_DIMS, param_sizes, dbias_strides), f_mask, total, alpha, beta, HAS_BETA
        )


@triton.jit
def blend_vector(pointers, mask, value, alpha, beta, HAS_BETA: tl.constexpr):
    out = value * tl.cast(alpha, value.dtype)
    if HAS_BETA:
        out += tl.cast(beta, value.dtype) * tl.load(pointers, mask=mask, other=0.0).to(value.dtype)
    tl.store(pointers, narrowed(out, pointers.dtype.element_ty), mask=mask)
