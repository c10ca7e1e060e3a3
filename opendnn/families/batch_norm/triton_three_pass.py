"""Batch normalization in three passes (``triton_backend`` describes the layout and the memory model):
the statistics or gradient pass (``bn_reduce_kernel``), its reduced set cut into slices that write
partial sums to the workspace; the per-feature combine (``bn_combine_kernel``), which adds the slices in
order and writes the statistics, the running averages, the gradients of scale and bias and the
elementwise pass's coefficients; the elementwise pass (``bn_forward_kernel``, ``bn_backward_kernel``),
which walks the tiles in the reverse order of the statistics pass so that its first reads hit L2.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.batch_norm.triton_tiles import (
    PARTIAL_ROW,
    STATS_ROW,
    backward_tile,
    feature_lanes,
    gradient_coefficients,
    gradient_input,
    inverse_std,
    load_old_gradients,
    load_running,
    normalize_tile,
    record_gradients,
    record_statistics,
    reduced_offsets,
    shifted_statistics,
    tile_data,
    tile_lanes,
    workspace,
)
from opendnn.kernels.indexing import dim_offsets


@triton.jit
def statistic_pointers(saved_mean_ptr, saved_inv_ptr, work, f, fp, feature_total, IN_WORKSPACE: tl.constexpr):
    """Where each feature's mean and inv std are: the workspace's recomputed ones, or the saved tensors."""
    if IN_WORKSPACE:
        mean_at = work + STATS_ROW * feature_total + f
        return mean_at, mean_at + feature_total
    else:
        return saved_mean_ptr + fp, saved_inv_ptr + fp


@triton.jit
def bn_reduce_kernel(
    x_ptr,
    dy_ptr,
    mask_ptr,
    saved_mean_ptr,
    work_ptr,
    outer_sizes,
    outer_x,
    outer_dy,
    inner_x,
    inner_dy,
    f_sizes,
    f_x,
    f_dy,
    f_param,
    mask_strides,
    outer_total,
    inner_total,
    feature_total,
    f_blocks,
    i_blocks,
    tiles,
    GRADIENT: tl.constexpr,
    MASKED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    TORCH_RULE: tl.constexpr,
    STATS_IN_WORKSPACE: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_F: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Program p: features block p % f_blocks over slice p // f_blocks of its tiles. Writes the
    slice's two sums per feature: sum(x - x0), sum((x - x0)^2); or, GRADIENT, sum(g), sum(g * (x - mean))
    (the mean saved, or recomputed into the workspace: STATS_IN_WORKSPACE).
    Software-pipelined by hand: tile t + 1's loads are issued before tile t is summed (ptxas otherwise
    waits for each 16-byte load before issuing the next: one load in flight per thread)."""
    pid = tl.program_id(0)
    pid_f = pid % f_blocks
    split = pid // f_blocks
    splits = tl.num_programs(0) // f_blocks
    f, f_valid = feature_lanes(pid_f, feature_total, BLOCK_F, INDEX_64)
    fx = dim_offsets(f, F_DIMS, f_sizes, f_x)
    fdy = dim_offsets(f, F_DIMS, f_sizes, f_dy)
    work = workspace(work_ptr, COMPUTE)
    if GRADIENT:
        fp = dim_offsets(f, F_DIMS, f_sizes, f_param)
        mean_at, _ = statistic_pointers(saved_mean_ptr, saved_mean_ptr, work, f, fp, feature_total, STATS_IN_WORKSPACE)
        center = tl.load(mean_at, mask=f_valid, other=0.0).to(COMPUTE)
    else:
        center = tl.load(x_ptr + fx, mask=f_valid, other=0.0).to(COMPUTE)  # x0: the feature's first element
    sum1 = tl.zeros((BLOCK_O * BLOCK_I, BLOCK_F), COMPUTE)
    sum2 = tl.zeros((BLOCK_O * BLOCK_I, BLOCK_F), COMPUTE)
    start, stop = split * tiles // splits, (split + 1) * tiles // splits
    x, dy, packed, valid = tile_data(
        x_ptr,
        dy_ptr,
        mask_ptr,
        f,
        f_valid,
        fx,
        fdy,
        start,
        stop,
        outer_sizes,
        outer_x,
        outer_dy,
        inner_x,
        inner_dy,
        mask_strides,
        outer_total,
        inner_total,
        i_blocks,
        GRADIENT,
        MASKED,
        PROPAGATE_NAN,
        OUTER_DIMS,
        BLOCK_O,
        BLOCK_I,
        INDEX_64,
    )
    for t in range(start, stop):
        x_next, dy_next, packed_next, valid_next = tile_data(
            x_ptr,
            dy_ptr,
            mask_ptr,
            f,
            f_valid,
            fx,
            fdy,
            t + 1,
            stop,
            outer_sizes,
            outer_x,
            outer_dy,
            inner_x,
            inner_dy,
            mask_strides,
            outer_total,
            inner_total,
            i_blocks,
            GRADIENT,
            MASKED,
            PROPAGATE_NAN,
            OUTER_DIMS,
            BLOCK_O,
            BLOCK_I,
            INDEX_64,
        )
        d = tl.where(valid, x.to(COMPUTE) - center[None, :], 0.0)
        if GRADIENT:
            g = gradient_input(dy, packed, MASKED, PROPAGATE_NAN, TORCH_RULE, COMPUTE)
            sum1 += g
            sum2 += g * d
        else:
            sum1 += d
            sum2 += d * d
        x, dy, packed, valid = x_next, dy_next, packed_next, valid_next
    partial = work + PARTIAL_ROW * feature_total
    tl.store(partial + split * feature_total + f, tl.sum(sum1, 0), mask=f_valid)
    tl.store(partial + (splits + split) * feature_total + f, tl.sum(sum2, 0), mask=f_valid)


@triton.jit
def partial_round(partial, s0, splits, f, valid, feature_total, BLOCK_S: tl.constexpr):
    """The two partial sums of slices s0 to s0 + BLOCK_S (zeros past ``splits``) of features ``f``."""
    s = s0 + tl.arange(0, BLOCK_S)
    offsets = s[:, None] * feature_total + f[None, :]
    both = (s < splits)[:, None] & valid[None, :]
    return (
        tl.load(partial + offsets, mask=both, other=0.0),
        tl.load(partial + splits * feature_total + offsets, mask=both, other=0.0),
    )


@triton.jit
def bn_combine_kernel(
    work_ptr,
    x_ptr,
    scale_ptr,
    bias_ptr,
    mean_ptr,
    var_ptr,
    saved_mean_ptr,
    saved_inv_ptr,
    dscale_ptr,
    dbias_ptr,
    f_sizes,
    f_x,
    f_param,
    feature_total,
    splits,
    count: tl.float64,
    epsilon: tl.float64,
    factor: tl.float64,
    alpha_param: tl.float64,
    beta_param: tl.float64,
    STEP: tl.constexpr,
    UPDATE_MEAN: tl.constexpr,
    UPDATE_VAR: tl.constexpr,
    SAVE: tl.constexpr,
    STATS_IN_WORKSPACE: tl.constexpr,
    HAS_BETA_PARAM: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Per feature, after the reduce pass (STEP "training", "statistics", "backward") or without one
    ("inference"): the statistics, running averages, gradients of scale and bias, and the
    coefficients of the elementwise pass, in the workspace's rows 0-3. mean_ptr / var_ptr: the running
    (training) or estimated (inference) statistics; the saved ones (or the workspace's, STATS_IN_WORKSPACE)
    are written by "training" (SAVE) and "statistics", read by "backward"."""
    f = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = f < feature_total
    fp = dim_offsets(f, F_DIMS, f_sizes, f_param)
    work = workspace(work_ptr, COMPUTE)
    partial = work + PARTIAL_ROW * feature_total
    mean_at, inv_at = statistic_pointers(saved_mean_ptr, saved_inv_ptr, work, f, fp, feature_total, STATS_IN_WORKSPACE)
    sum1 = tl.zeros((BLOCK_S, BLOCK), COMPUTE)  # BLOCK_S slices at a time: few dependent load rounds
    sum2 = tl.zeros((BLOCK_S, BLOCK), COMPUTE)
    # pipelined as the reduce: round r + 1's loads are issued before round r is added (else ptxas issues
    # each 16-byte load after the adds of the one before: a load round trip per 4 partial sums)
    part1, part2 = partial_round(partial, 0, splits, f, valid, feature_total, BLOCK_S)
    for s0 in range(BLOCK_S, splits + BLOCK_S, BLOCK_S):
        next1, next2 = partial_round(partial, s0, splits, f, valid, feature_total, BLOCK_S)
        sum1 += part1
        sum2 += part2
        part1, part2 = next1, next2
    sum1 = tl.sum(sum1, 0)
    sum2 = tl.sum(sum2, 0)
    n = tl.cast(count, COMPUTE)
    scale = tl.load(scale_ptr + fp, mask=valid, other=0.0).to(COMPUTE)
    if STEP == "backward":
        mean = tl.load(mean_at, mask=valid, other=0.0).to(COMPUTE)
        inv_std = tl.load(inv_at, mask=valid, other=0.0).to(COMPUTE)
        old_dscale, old_dbias = load_old_gradients(dscale_ptr, dbias_ptr, fp, valid, HAS_BETA_PARAM)
        record_gradients(
            sum1,
            sum2,
            inv_std,
            old_dscale,
            old_dbias,
            dscale_ptr,
            dbias_ptr,
            fp,
            valid,
            alpha_param,
            beta_param,
            HAS_BETA_PARAM,
            COMPUTE,
        )
        k1, k2, k3 = gradient_coefficients(sum1, sum2, n, scale, inv_std)
        tl.store(work + f, k1, mask=valid)
        tl.store(work + feature_total + f, k3, mask=valid)
        tl.store(work + 2 * feature_total + f, mean, mask=valid)
        tl.store(work + 3 * feature_total + f, k2, mask=valid)
    else:
        if STEP == "inference":
            mean = tl.load(mean_ptr + fp, mask=valid, other=0.0).to(COMPUTE)
            var = tl.load(var_ptr + fp, mask=valid, other=0.0).to(COMPUTE)
        else:
            x0 = tl.load(x_ptr + dim_offsets(f, F_DIMS, f_sizes, f_x), mask=valid, other=0.0).to(COMPUTE)
            mean, var = shifted_statistics(sum1, sum2, n, x0)
        inv_std = inverse_std(var, epsilon, COMPUTE)
        running_mean, running_var = load_running(mean_ptr, var_ptr, fp, valid, UPDATE_MEAN, UPDATE_VAR)
        record_statistics(
            mean,
            var,
            inv_std,
            n,
            running_mean,
            running_var,
            mean_ptr,
            var_ptr,
            mean_at,
            inv_at,
            fp,
            valid,
            factor,
            UPDATE_MEAN,
            UPDATE_VAR,
            SAVE,
            COMPUTE,
        )
        tl.store(work + f, scale * inv_std, mask=valid)
        tl.store(work + feature_total + f, tl.load(bias_ptr + fp, mask=valid, other=0.0).to(COMPUTE), mask=valid)
        tl.store(work + 2 * feature_total + f, mean, mask=valid)


@triton.jit
def bn_forward_kernel(
    x_ptr,
    z_ptr,
    y_ptr,
    work_ptr,
    mask_ptr,
    outer_sizes,
    outer_x,
    outer_z,
    outer_y,
    inner_x,
    inner_z,
    inner_y,
    f_sizes,
    f_x,
    f_z,
    f_y,
    mask_strides,
    outer_total,
    inner_total,
    feature_total,
    f_blocks,
    i_blocks,
    tiles,
    alpha: tl.float64,
    beta: tl.float64,
    ceiling: tl.float64,
    ADD_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    WRITE_MASK: tl.constexpr,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_F: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """y = alpha * act(x * a + b [+ z]) + beta * y over one tile; the mask bits of act' too."""
    pid = tl.program_id(0)
    pid_f = pid % f_blocks
    t = tiles - 1 - pid // f_blocks  # the last tiles first: the statistics pass left them in L2
    f, f_valid = feature_lanes(pid_f, feature_total, BLOCK_F, INDEX_64)
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)
    valid = r_valid[:, None] & f_valid[None, :]
    rx = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_x, inner_x)
    x = tl.load(x_ptr + (rx[:, None] + dim_offsets(f, F_DIMS, f_sizes, f_x)[None, :]), mask=valid, other=0.0)
    z = x
    if ADD_Z:
        rz = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_z, inner_z)
        z = tl.load(z_ptr + (rz[:, None] + dim_offsets(f, F_DIMS, f_sizes, f_z)[None, :]), mask=valid, other=0.0)
    tl.debug_barrier()  # every load above is in flight before any is used (see bn_backward_kernel)
    coef = workspace(work_ptr, COMPUTE) + f
    a = tl.load(coef, mask=f_valid, other=0.0)[None, :]
    b = tl.load(coef + feature_total, mask=f_valid, other=0.0)[None, :]
    mean = tl.load(coef + 2 * feature_total, mask=f_valid, other=0.0)[None, :]
    normalize_tile(
        x,
        z,
        mean,
        a,
        b,
        y_ptr,
        mask_ptr,
        valid,
        t,
        f,
        f_valid,
        outer,
        inner,
        outer_sizes,
        outer_y,
        inner_y,
        f_sizes,
        f_y,
        mask_strides,
        outer_total,
        inner_total,
        i_blocks,
        alpha,
        beta,
        ceiling,
        ADD_Z,
        ACTIVATION,
        PROPAGATE_NAN,
        WRITE_MASK,
        HAS_BETA,
        OUTER_DIMS,
        F_DIMS,
        COMPUTE,
        BLOCK_O,
        BLOCK_I,
        INDEX_64,
    )


@triton.jit
def bn_backward_kernel(
    x_ptr,
    dy_ptr,
    dx_ptr,
    dz_ptr,
    work_ptr,
    mask_ptr,
    outer_sizes,
    outer_x,
    outer_dy,
    outer_dx,
    outer_dz,
    inner_x,
    inner_dy,
    inner_dx,
    inner_dz,
    f_sizes,
    f_x,
    f_dy,
    f_dx,
    f_dz,
    mask_strides,
    outer_total,
    inner_total,
    feature_total,
    f_blocks,
    i_blocks,
    tiles,
    alpha: tl.float64,
    beta: tl.float64,
    MASKED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    TORCH_RULE: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_F: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """dx = alpha * (k1 * g + k2 * x + k3) + beta * dx, g = dy * mask; dz = alpha * g + beta * dz."""
    pid = tl.program_id(0)
    t = tiles - 1 - pid // f_blocks  # the last tiles first: the gradient pass left them in L2
    f, f_valid = feature_lanes(pid % f_blocks, feature_total, BLOCK_F, INDEX_64)
    fx, fdy = dim_offsets(f, F_DIMS, f_sizes, f_x), dim_offsets(f, F_DIMS, f_sizes, f_dy)
    x, dy, packed, valid = tile_data(
        x_ptr,
        dy_ptr,
        mask_ptr,
        f,
        f_valid,
        fx,
        fdy,
        t,
        tiles,
        outer_sizes,
        outer_x,
        outer_dy,
        inner_x,
        inner_dy,
        mask_strides,
        outer_total,
        inner_total,
        i_blocks,
        True,
        MASKED,
        PROPAGATE_NAN,
        OUTER_DIMS,
        BLOCK_O,
        BLOCK_I,
        INDEX_64,
    )
    outer, inner, _ = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)  # dx's, dz's
    # A CTA barrier, then the per-feature coefficients every result needs: no arithmetic can start before
    # all the data loads above are issued (loads do not cross a barrier). Otherwise ptxas interleaves them
    # (two 16-byte loads in flight per thread, arithmetic waiting on them, the next two); Ex kernels whose
    # mask code puts barriers there run 3x faster on the H200 (docs/design/batch_norm.md).
    tl.debug_barrier()
    coef = workspace(work_ptr, COMPUTE) + f
    k1 = tl.load(coef, mask=f_valid, other=0.0)[None, :]
    k3 = tl.load(coef + feature_total, mask=f_valid, other=0.0)[None, :]
    mean = tl.load(coef + 2 * feature_total, mask=f_valid, other=0.0)[None, :]
    k2 = tl.load(coef + 3 * feature_total, mask=f_valid, other=0.0)[None, :]
    backward_tile(
        gradient_input(dy, packed, MASKED, PROPAGATE_NAN, TORCH_RULE, COMPUTE),
        x.to(COMPUTE) - mean,
        k1,
        k2,
        k3,
        dx_ptr,
        dz_ptr,
        valid,
        f,
        outer,
        inner,
        outer_sizes,
        outer_dx,
        outer_dz,
        inner_dx,
        inner_dz,
        f_sizes,
        f_dx,
        f_dz,
        alpha,
        beta,
        WRITE_DZ,
        HAS_BETA,
        OUTER_DIMS,
        F_DIMS,
        COMPUTE,
    )
