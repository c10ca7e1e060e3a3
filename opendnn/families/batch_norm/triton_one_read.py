"""Batch normalization reading the data once (``triton_backend`` says when it is chosen): the training
forward (``bn_one_read_forward_kernel``) and, for float32 with saved statistics, the backward
(``bn_one_read_backward_kernel``) of one feature per thread-block cluster of CTAs on sm_90 and later (one
CTA per feature, where it fits, on GPUs without clusters and in the interpreter). Each CTA holds its tile
in registers through a cluster barrier (``cluster_sums``) and asks L2 for a later cluster's tile
(``prefetch_tile``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.families.batch_norm.triton_tiles import (
    PARTIAL_ROW,
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
def cluster_barrier(token):
    """Wait until every thread of this CTA's cluster (sm_90) has arrived; the memory writes before it
    are visible after it (release / acquire at cluster scope). Returns ``token``: values computed from it
    cannot be moved above the barrier."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n\tmov.b32 $0, $1;",
        "=r,r",
        [token],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def cluster_sums(
    part1,
    part2,
    work_ptr,
    pid,
    rank,
    f,
    f_valid,
    feature_total,
    CLUSTER: tl.constexpr,
    CLUSTER_BARRIER: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """Two sums of one feature over its cluster: each CTA's parts go side by side into the workspace (the
    cluster reads them back in one 64-byte round; rank-major rows of features measured 35% slower), a
    barrier, then every CTA adds the CLUSTER pairs in order: the same sums on every CTA. The barrier is the
    cluster's (CLUSTER_BARRIER, sm_90) or, where there are no clusters and CLUSTER is 1, the CTA's."""
    partial = workspace(work_ptr, COMPUTE) + PARTIAL_ROW * feature_total + (pid // CLUSTER) * (2 * CLUSTER)
    tl.store(partial + rank + f * 0, part1, mask=f_valid)
    tl.store(partial + CLUSTER + rank + f * 0, part2, mask=f_valid)
    token = rank * 0
    if CLUSTER_BARRIER:
        token = cluster_barrier(token)
    else:
        tl.debug_barrier()
    ranks = tl.arange(0, CLUSTER) + token  # loads after the barrier: their addresses come from its token
    return tl.sum(tl.load(partial + ranks), 0), tl.sum(tl.load(partial + CLUSTER + ranks), 0)


@triton.jit
def prefetch_tile(
    ptr,
    f,
    feature_total,
    rank,
    outer_sizes,
    outer_strides,
    inner_stride,
    f_sizes,
    f_strides,
    outer_total,
    inner_total,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
    STEP: tl.constexpr,
):
    """Ask L2 to fetch CTA ``rank``'s tile of feature ``f`` (nothing when f is past the end) and keep it
    (evict_last), one address every STEP lanes, without waiting: the data of a cluster that runs later,
    coming from DRAM while this one sums, waits at its barrier and stores."""
    outer, inner, r_valid = tile_lanes(rank, 1, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64, STEP)
    offsets = (
        reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_strides, inner_stride)[:, None]
        + dim_offsets(f, F_DIMS, f_sizes, f_strides)[None, :]
    )
    valid = r_valid[:, None] & (f < feature_total)[None, :]
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\t@p prefetch.global.L2::evict_last [$1];\n\tmov.b32 $0, 0;\n\t}",
        "=r,l,r",
        [ptr + offsets, valid.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def bn_one_read_forward_kernel(
    x_ptr,
    z_ptr,
    y_ptr,
    scale_ptr,
    bias_ptr,
    mean_ptr,
    var_ptr,
    saved_mean_ptr,
    saved_inv_ptr,
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
    f_param,
    mask_strides,
    outer_total,
    inner_total,
    feature_total,
    count: tl.float64,
    epsilon: tl.float64,
    factor: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    ceiling: tl.float64,
    ahead,
    CLUSTER: tl.constexpr,
    CLUSTER_BARRIER: tl.constexpr,
    PREFETCH: tl.constexpr,
    ADD_Z: tl.constexpr,
    ACTIVATION: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    WRITE_MASK: tl.constexpr,
    HAS_BETA: tl.constexpr,
    UPDATE_MEAN: tl.constexpr,
    UPDATE_VAR: tl.constexpr,
    SAVE: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """The whole training forward of one feature (rows orientation) in one cluster of CLUSTER CTAs, x read
    once: CTA ``rank`` loads its BLOCK_O outer x BLOCK_I inner lanes (the ``rank``-th tile of that size)
    and keeps them in registers; its shifted sums go to the workspace's partial rows (slice ``rank``);
    after a cluster barrier every CTA adds the CLUSTER slices in order (the same sums on every CTA),
    finishes the statistics (rank 0 writes the saved ones and the running averages) and normalizes
    the lanes it holds. CLUSTER_BARRIER: a cluster barrier (sm_90); without it (GPUs without clusters,
    and the interpreter, which runs programs one at a time and has no inline assembly) CLUSTER is 1 and
    the CTA's barrier serves. PREFETCH: lanes per L2 prefetch of the tile of
    the feature ``ahead`` (0: none); the data then streams (loads evict_first, stores .cs), so that the
    prefetched tiles stay in L2.
    Measured on the H200 (docs/design/batch_norm.md): each CTA's partial sums side by
    side per feature (rank-major rows of features cost 35%), the lanes' offsets kept through the barrier
    (recomputed after it they took 255 registers), no load after the normalize, and the prefetch: 122 us at
    64x256x56x56 float32 against 157 for the three passes."""
    LOAD_EVICT: tl.constexpr = "evict_first" if PREFETCH > 0 else ""
    STORE_CACHE: tl.constexpr = ".cs" if PREFETCH > 0 else ""
    pid = tl.program_id(0)
    rank = pid % CLUSTER
    f, f_valid = feature_lanes(pid // CLUSTER, feature_total, 1, INDEX_64)
    fx = dim_offsets(f, F_DIMS, f_sizes, f_x)
    fp = dim_offsets(f, F_DIMS, f_sizes, f_param)
    # the one feature's shift (its first element), scale and bias as scalars: broadcast free (a [1] vector
    # broadcast to the tile took a layout conversion of the whole tile through shared memory); loaded first,
    # with the running averages rank 0 updates, so that nothing after the barrier waits on them
    x0 = tl.sum(tl.load(x_ptr + fx, mask=f_valid, other=0.0).to(COMPUTE), 0)
    scale = tl.sum(tl.load(scale_ptr + fp, mask=f_valid, other=0.0).to(COMPUTE), 0)
    b = tl.sum(tl.load(bias_ptr + fp, mask=f_valid, other=0.0).to(COMPUTE), 0)
    writer = f_valid & (rank == 0)
    running_mean, running_var = load_running(mean_ptr, var_ptr, fp, writer, UPDATE_MEAN, UPDATE_VAR)
    outer, inner, r_valid = tile_lanes(rank, 1, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)
    valid = r_valid[:, None] & f_valid[None, :]
    x = tl.load(
        x_ptr + (reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_x, inner_x)[:, None] + fx[None, :]),
        mask=valid,
        other=0.0,
        eviction_policy=LOAD_EVICT,
    )
    z = x
    if ADD_Z:  # with x, ahead of the barrier (loaded after it, the CTA idled a DRAM round trip: 18-26% slower)
        rz = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_z, inner_z)
        z = tl.load(
            z_ptr + (rz[:, None] + dim_offsets(f, F_DIMS, f_sizes, f_z)[None, :]),
            mask=valid,
            other=0.0,
            eviction_policy=LOAD_EVICT,
        )
    if PREFETCH > 0:
        prefetch_tile(
            x_ptr,
            f + ahead,
            feature_total,
            rank,
            outer_sizes,
            outer_x,
            inner_x,
            f_sizes,
            f_x,
            outer_total,
            inner_total,
            OUTER_DIMS,
            F_DIMS,
            BLOCK_O,
            BLOCK_I,
            INDEX_64,
            PREFETCH,
        )
        if ADD_Z:
            prefetch_tile(
                z_ptr,
                f + ahead,
                feature_total,
                rank,
                outer_sizes,
                outer_z,
                inner_z,
                f_sizes,
                f_z,
                outer_total,
                inner_total,
                OUTER_DIMS,
                F_DIMS,
                BLOCK_O,
                BLOCK_I,
                INDEX_64,
                PREFETCH,
            )
    d = tl.where(valid, x.to(COMPUTE) - x0, 0.0)
    sum1, sum2 = cluster_sums(
        tl.sum(d, 0),
        tl.sum(d * d, 0),
        work_ptr,
        pid,
        rank,
        f,
        f_valid,
        feature_total,
        CLUSTER,
        CLUSTER_BARRIER,
        COMPUTE,
    )
    n = tl.cast(count, COMPUTE)
    mean, var = shifted_statistics(sum1, sum2, n, x0)
    inv_std = inverse_std(var, epsilon, COMPUTE)
    normalize_tile(
        x,
        z,
        mean,
        scale * inv_std,
        b,
        y_ptr,
        mask_ptr,
        valid,
        rank,
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
        1,
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
        STORE_CACHE,
    )
    # rank 0 writes the statistics, stores only: a CTA that waited on a load here would keep its cluster's
    # successor from starting (the running averages are loaded first)
    record_statistics(
        mean,
        var,
        inv_std,
        n,
        running_mean,
        running_var,
        mean_ptr,
        var_ptr,
        saved_mean_ptr + fp,
        saved_inv_ptr + fp,
        fp,
        writer,
        factor,
        UPDATE_MEAN,
        UPDATE_VAR,
        SAVE,
        COMPUTE,
    )


@triton.jit
def bn_one_read_backward_kernel(
    x_ptr,
    dy_ptr,
    dx_ptr,
    dz_ptr,
    scale_ptr,
    saved_mean_ptr,
    saved_inv_ptr,
    dscale_ptr,
    dbias_ptr,
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
    f_param,
    mask_strides,
    outer_total,
    inner_total,
    feature_total,
    count: tl.float64,
    alpha: tl.float64,
    beta: tl.float64,
    alpha_param: tl.float64,
    beta_param: tl.float64,
    ahead,
    CLUSTER: tl.constexpr,
    CLUSTER_BARRIER: tl.constexpr,
    PREFETCH: tl.constexpr,
    MASKED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    TORCH_RULE: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    HAS_BETA: tl.constexpr,
    HAS_BETA_PARAM: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """The whole backward of one feature with its saved statistics, x and dy read once: laid out as
    ``bn_one_read_forward_kernel`` (a cluster of CLUSTER CTAs per feature, CTA ``rank`` holding its tile of
    x and dy in registers). Each CTA's sum(g) and sum(g (x - mean)) go side by side into the workspace;
    after the cluster barrier every CTA adds them in order, writes its dx (and dz), and rank 0 the
    gradients of scale and bias. PREFETCH as in the forward, for x and dy."""
    LOAD_EVICT: tl.constexpr = "evict_first" if PREFETCH > 0 else ""
    STORE_CACHE: tl.constexpr = ".cs" if PREFETCH > 0 else ""
    pid = tl.program_id(0)
    rank = pid % CLUSTER
    f, f_valid = feature_lanes(pid // CLUSTER, feature_total, 1, INDEX_64)
    fp = dim_offsets(f, F_DIMS, f_sizes, f_param)
    # the feature's statistics and scale as scalars, and what rank 0 blends with, loaded first
    mean = tl.sum(tl.load(saved_mean_ptr + fp, mask=f_valid, other=0.0).to(COMPUTE), 0)
    inv_std = tl.sum(tl.load(saved_inv_ptr + fp, mask=f_valid, other=0.0).to(COMPUTE), 0)
    scale = tl.sum(tl.load(scale_ptr + fp, mask=f_valid, other=0.0).to(COMPUTE), 0)
    writer = f_valid & (rank == 0)
    old_dscale, old_dbias = load_old_gradients(dscale_ptr, dbias_ptr, fp, writer, HAS_BETA_PARAM)
    fx, fdy = dim_offsets(f, F_DIMS, f_sizes, f_x), dim_offsets(f, F_DIMS, f_sizes, f_dy)
    x, dy, packed, valid = tile_data(
        x_ptr,
        dy_ptr,
        mask_ptr,
        f,
        f_valid,
        fx,
        fdy,
        rank,
        rank + 1,
        outer_sizes,
        outer_x,
        outer_dy,
        inner_x,
        inner_dy,
        mask_strides,
        outer_total,
        inner_total,
        1,
        True,
        MASKED,
        PROPAGATE_NAN,
        OUTER_DIMS,
        BLOCK_O,
        BLOCK_I,
        INDEX_64,
        LOAD_EVICT,
    )
    outer, inner, _ = tile_lanes(rank, 1, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)  # dx's, dz's
    if PREFETCH > 0:
        prefetch_tile(
            x_ptr,
            f + ahead,
            feature_total,
            rank,
            outer_sizes,
            outer_x,
            inner_x,
            f_sizes,
            f_x,
            outer_total,
            inner_total,
            OUTER_DIMS,
            F_DIMS,
            BLOCK_O,
            BLOCK_I,
            INDEX_64,
            PREFETCH,
        )
        prefetch_tile(
            dy_ptr,
            f + ahead,
            feature_total,
            rank,
            outer_sizes,
            outer_dy,
            inner_dy,
            f_sizes,
            f_dy,
            outer_total,
            inner_total,
            OUTER_DIMS,
            F_DIMS,
            BLOCK_O,
            BLOCK_I,
            INDEX_64,
            PREFETCH,
        )
    g = gradient_input(dy, packed, MASKED, PROPAGATE_NAN, TORCH_RULE, COMPUTE)
    centred = tl.where(valid, x.to(COMPUTE) - mean, 0.0)
    sum1, sum2 = cluster_sums(
        tl.sum(g, 0),
        tl.sum(g * centred, 0),
        work_ptr,
        pid,
        rank,
        f,
        f_valid,
        feature_total,
        CLUSTER,
        CLUSTER_BARRIER,
        COMPUTE,
    )
    k1, k2, k3 = gradient_coefficients(sum1, sum2, tl.cast(count, COMPUTE), scale, inv_std)
    backward_tile(
        g,
        centred,
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
        STORE_CACHE,
    )
    record_gradients(
        sum1,
        sum2,
        inv_std,
        old_dscale,
        old_dbias,
        dscale_ptr,
        dbias_ptr,
        fp,
        writer,
        alpha_param,
        beta_param,
        HAS_BETA_PARAM,
        COMPUTE,
    )
