"""Batch normalization (training and inference forward, backward, the Ex forms with add + relu):
a split reduction, a tiny per-feature combine, and an elementwise pass; or, for NCHW-like layouts whose
features fit 16 CTAs' registers, one kernel reading the data once (``bn_one_read_forward_kernel``, and
``bn_one_read_backward_kernel`` for float32 with saved statistics: a thread-block cluster per feature on
sm_90 and later; one CTA per feature, where it fits, on GPUs without clusters and in the interpreter).

Memory model, per element of x (itemsize b bytes of data; the parameters are negligible):
- training forward: the statistics pass reads x, the normalize pass reads x (and z) and writes y
  (and one bit of mask): 3b bytes (4b with z). The benchmarks count 3b (read x twice, write y),
  as the cuDNN reference figures do; the fewest bytes any method moves is 2b, which the one-read kernel moves.
- inference: reads x, writes y: 2b.
- backward: the gradient pass reads x and dy (and the mask bit), the elementwise pass reads them again
  and writes dx (and dz): 5b (6b with dz).
About one to three FLOPs per element per pass: memory-bound. At 64x256x56x56 fp32 (205 MB) the
training forward moves 616 MB: 0.15 ms at 4.2 TB/s.

Layout: the elements are indexed by (reduced index, feature): the reduced dims (N and the spatial
dims for SPATIAL, N for PER_ACTIVATION) and the feature dims (C, and the spatial dims for
PER_ACTIVATION) are each sorted by x's strides and merged where every tensor is contiguous
(``bn_plan``). The reduced index is split into (outer, inner): when x's innermost reduced dim is
contiguous and its size a multiple of 8 (NCHW), a program owns one feature and tiles of
BLOCK_O x BLOCK_I (rows along the contiguous inner dim); otherwise (NHWC, or short planes) the inner
part is empty and a program owns BLOCK_F consecutive features and BLOCK_O reduced indices, so each
tile row is a contiguous run of channels. Offsets need division only on the small per-tile vectors.

The statistics pass cuts the reduced set of each feature block into ``splits`` slices, one program
each, accumulating the shifted sums sum(x - x0) and sum((x - x0)^2) (x0: the feature's first
element, which keeps the fp32 sums free of cancellation) or, backward, sum(g) and
sum(g * (x - mean)); the combine adds the slices in order (bitwise repeatable, no atomics), a program
per few features holding all their slices in one load round where it can (NHWC: 256 slices, 32
programs), writes the statistics, the running averages and per-feature coefficients: y = (x - mean) * a + bias
(forward) or dx = k1 * g + k2 * (x - mean) + k3 (backward), centred first so that data far from
zero keep their accuracy. The elementwise pass walks the tiles in the reverse order of
the statistics pass, so its first reads hit what the statistics pass left in L2.

Workspace: one buffer the kernels take whole (a pointer, no per-call views of its regions), in rows
of feature_total compute elements: 4 coefficients, the recomputed mean and inv std, the partial sums.

Reserve space: the activation's mask, one bit per element, 8 consecutive reduced indices of one
feature per byte, bytes laid out by x's layout alone (feature-major when x's reduced dims are
innermost, else reduced-major), so backward reads what forward wrote whatever dy's layout. A byte
is found from its group's first lane (groups are aligned), never by a reduction across lanes.

Load scheduling (read in the sm_90 SASS): left alone, ptxas consumes each 16-byte load before issuing
the next, so a thread has one or two loads in flight and a pass runs at latency, not bandwidth. The
reduce loop issues tile t + 1's loads before summing tile t (carried raw), the combine likewise its
load rounds (left alone: 4 rounds of 32 loads, each load's round trip in turn, 15 us); the elementwise kernels
issue every data load, then a CTA barrier, then load the per-feature coefficients all arithmetic
needs, so no arithmetic can be scheduled between the data loads. The one-read kernels hold a CTA's data
through a cluster barrier, when the SM has nothing else to load; in clusters of 4 CTAs or more each CTA
also asks L2 for its tile of the feature 8 ahead (``prefetch_tile``), which a later cluster loads, so DRAM
keeps working while clusters sum, wait and store (docs/design/batch_norm.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from opendnn.backends.triton.device import has_clusters
from opendnn.backends.triton.launch import Launch, Slot
from opendnn.backends.triton.reduce import dim_offsets, merged_dims
from opendnn.core.arrays import torch_view
from opendnn.core.errors import InternalError
from opendnn.ops.batch_norm import BatchNormOps, BatchNormProblem, BatchNormTensors, Direction

TILE = 4096  # elements per tile: 16 per thread at 8 warps
COLUMN_BLOCK = 64  # most features a columns tile covers
TARGET_PROGRAMS = 1024  # statistics programs: enough to fill an H200 (132 SMs) several times
MIN_SLICE_TILES = 4  # tiles each slice of the statistics pass reads at least
FINAL_BLOCK = 64  # most features per program of the combine
FINAL_TILE = 2048  # partial sums per load round of the combine
FINAL_MIN_BLOCK = 8  # fewest features per program of the combine (32 bytes of each slice's row)
ONE_READ_TILE = 16384  # most lanes of each held tensor a CTA of the one-read kernels keeps in registers
MAX_CLUSTER = 16  # most CTAs per feature of the one-read kernels (sm_90: above 8 is "non-portable", allowed)
PREFETCH_BYTES = 64  # the one-read kernels ask L2 for a later cluster's tile, one prefetch per 64 bytes of it,
PREFETCH_AHEAD = 8  # for the feature 8 ahead (about the next wave of 16-CTA clusters on 132 SMs),
PREFETCH_MIN_CLUSTER = 4  # in clusters of 4 CTAs or more (1 CTA a feature, many at once: 3 of 4 cases slower),
PREFETCH_MIN_CLUSTER_DX = 16  # 16 for the backward writing dx alone (28x28, clusters of 4: 95 -> 100 us)
NO_HINT = tl.constexpr("")  # no cache hint on a load or store
MASK_GROUP = tl.constexpr(8)  # bits per mask byte
STATS_ROW = tl.constexpr(4)  # workspace rows (of feature_total elements): 4 coefficients, mean, inv std,
PARTIAL_ROW = tl.constexpr(6)  # then the partial sums (2 x splits rows)


@triton.jit
def tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr,
               INDEX_64: tl.constexpr, STEP: tl.constexpr = 1):
    """The tile ``t``'s lanes as (outer index, inner index, valid), BLOCK_O * BLOCK_I of them, the
    inner index fastest (every STEP-th lane only); int64 when some offset may pass 2**31."""
    if INDEX_64:
        t = tl.cast(t, tl.int64)
    lane = tl.arange(0, BLOCK_O * BLOCK_I // STEP) * STEP
    o_block = t // i_blocks
    outer = o_block * BLOCK_O + lane // BLOCK_I
    inner = (t - o_block * i_blocks) * BLOCK_I + lane % BLOCK_I
    return outer, inner, (outer < outer_total) & (inner < inner_total)


@triton.jit
def reduced_offsets(outer, inner, OUTER_DIMS: tl.constexpr, sizes, strides, inner_stride):
    return dim_offsets(outer, OUTER_DIMS, sizes, strides) + inner * inner_stride


@triton.jit
def mask_offsets(outer, inner, f, inner_total, mask_strides):
    """Byte of each element's mask bit: its flat reduced index / 8 and its feature, by the strides."""
    return ((outer * inner_total + inner) // MASK_GROUP * mask_strides[0])[:, None] + (f * mask_strides[1])[None, :]


@triton.jit
def load_mask_bytes(mask_ptr, t, stop, f, f_valid, i_blocks, outer_total, inner_total, mask_strides,
                    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr):
    """Tile t's mask bytes (nothing for t >= stop), one per aligned group of 8 lanes, loaded at the
    group's first lane (groups are aligned, see store_mask_bits): no reduction across lanes (one would
    go through shared memory with barriers, every tile)."""
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64, MASK_GROUP)
    offsets = mask_offsets(outer, inner, f, inner_total, mask_strides)
    return tl.load(mask_ptr + offsets, mask=(r_valid & (t < stop))[:, None] & f_valid[None, :], other=0)


@triton.jit
def unpack_mask_bits(packed):
    """The activation's mask (True where act' = 1) of each lane, from its group's byte, by shifts."""
    GROUPS: tl.constexpr = packed.shape[0]
    COLS: tl.constexpr = packed.shape[1]
    bits = (packed.to(tl.int32)[:, None, :] >> tl.arange(0, MASK_GROUP)[None, :, None]) & 1
    return tl.reshape(bits, (GROUPS * MASK_GROUP, COLS)) != 0


@triton.jit
def store_mask_bits(mask_ptr, bits, valid, t, f, f_valid, i_blocks, outer_total, inner_total, mask_strides,
                    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr):
    """Pack 8 lanes' bits per byte. A group's byte and existence are its first lane's (groups are
    aligned: BLOCK_O or BLOCK_I and, in rows orientation, the row length are multiples of 8)."""
    ROWS: tl.constexpr = bits.shape[0]
    COLS: tl.constexpr = bits.shape[1]
    weights = (1 << tl.arange(0, MASK_GROUP))[None, :, None]
    packed = tl.sum(tl.reshape((bits & valid).to(tl.int32), (ROWS // MASK_GROUP, MASK_GROUP, COLS)) * weights, 1)
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64,
                                       MASK_GROUP)
    offsets = mask_offsets(outer, inner, f, inner_total, mask_strides)
    tl.store(mask_ptr + offsets, packed.to(tl.uint8), mask=r_valid[:, None] & f_valid[None, :])


@triton.jit
def feature_lanes(pid_f, feature_total, BLOCK_F: tl.constexpr, INDEX_64: tl.constexpr):
    """Program ``pid_f``'s BLOCK_F features and which of them exist."""
    if INDEX_64:
        pid_f = tl.cast(pid_f, tl.int64)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    return f, f < feature_total


@triton.jit
def tile_data(
    x_ptr, dy_ptr, mask_ptr, f, f_valid, fx, fdy, t, stop,
    outer_sizes, outer_x, outer_dy, inner_x, inner_dy, mask_strides, outer_total, inner_total, i_blocks,
    GRADIENT: tl.constexpr, MASKED: tl.constexpr, OUTER_DIMS: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr, LOAD_EVICT: tl.constexpr = NO_HINT,
):
    """Tile t's loads, raw (nothing uses them here, so they are all in flight at once): x, dy (x when
    not GRADIENT) and the mask bytes (the feature indices when not MASKED); nothing past ``stop``."""
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)
    valid = (r_valid & (t < stop))[:, None] & f_valid[None, :]
    rx = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_x, inner_x)
    x = tl.load(x_ptr + (rx[:, None] + fx[None, :]), mask=valid, other=0.0, eviction_policy=LOAD_EVICT)
    dy = x
    packed = f[None, :]
    if GRADIENT:
        rdy = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_dy, inner_dy)
        dy = tl.load(dy_ptr + (rdy[:, None] + fdy[None, :]), mask=valid, other=0.0, eviction_policy=LOAD_EVICT)
        if MASKED:
            packed = load_mask_bytes(mask_ptr, t, stop, f, f_valid, i_blocks, outer_total, inner_total, mask_strides,
                                     BLOCK_O, BLOCK_I, INDEX_64)
    return x, dy, packed, valid


@triton.jit
def workspace(work_ptr, COMPUTE: tl.constexpr):
    """The workspace (any dtype) as COMPUTE elements, in rows of feature_total: the elementwise pass's
    4 coefficients, the recomputed mean and inv std (STATS_ROW), the partial sums (PARTIAL_ROW on)."""
    return work_ptr.to(tl.pointer_type(COMPUTE), bitcast=True)


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
    x_ptr, dy_ptr, mask_ptr, saved_mean_ptr, work_ptr,
    outer_sizes, outer_x, outer_dy, inner_x, inner_dy, f_sizes, f_x, f_dy, f_param, mask_strides,
    outer_total, inner_total, feature_total, f_blocks, i_blocks, tiles,
    GRADIENT: tl.constexpr, MASKED: tl.constexpr, STATS_IN_WORKSPACE: tl.constexpr, OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_F: tl.constexpr, INDEX_64: tl.constexpr,
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
    x, dy, packed, valid = tile_data(x_ptr, dy_ptr, mask_ptr, f, f_valid, fx, fdy, start, stop, outer_sizes,
                                     outer_x, outer_dy, inner_x, inner_dy, mask_strides, outer_total, inner_total,
                                     i_blocks, GRADIENT, MASKED, OUTER_DIMS, BLOCK_O, BLOCK_I, INDEX_64)
    for t in range(start, stop):
        x_next, dy_next, packed_next, valid_next = tile_data(
            x_ptr, dy_ptr, mask_ptr, f, f_valid, fx, fdy, t + 1, stop, outer_sizes, outer_x, outer_dy, inner_x,
            inner_dy, mask_strides, outer_total, inner_total, i_blocks, GRADIENT, MASKED, OUTER_DIMS, BLOCK_O,
            BLOCK_I, INDEX_64)
        d = tl.where(valid, x.to(COMPUTE) - center[None, :], 0.0)
        if GRADIENT:
            g = dy.to(COMPUTE)
            if MASKED:
                g = tl.where(unpack_mask_bits(packed), g, 0.0)
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
    return (tl.load(partial + offsets, mask=both, other=0.0),
            tl.load(partial + splits * feature_total + offsets, mask=both, other=0.0))


@triton.jit
def bn_combine_kernel(
    work_ptr, x_ptr, scale_ptr, bias_ptr, mean_ptr, var_ptr, saved_mean_ptr, saved_inv_ptr,
    dscale_ptr, dbias_ptr, f_sizes, f_x, f_param, feature_total, splits,
    count: tl.float64, epsilon: tl.float64, factor: tl.float64, alpha_param: tl.float64, beta_param: tl.float64,
    STEP: tl.constexpr, UPDATE_MEAN: tl.constexpr, UPDATE_VAR: tl.constexpr, SAVE: tl.constexpr,
    STATS_IN_WORKSPACE: tl.constexpr, HAS_BETA_PARAM: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_S: tl.constexpr,
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
        record_gradients(sum1, sum2, inv_std, old_dscale, old_dbias, dscale_ptr, dbias_ptr, fp, valid, alpha_param,
                         beta_param, HAS_BETA_PARAM, COMPUTE)
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
        record_statistics(mean, var, inv_std, n, running_mean, running_var, mean_ptr, var_ptr, mean_at, inv_at, fp,
                          valid, factor, UPDATE_MEAN, UPDATE_VAR, SAVE, COMPUTE)
        tl.store(work + f, scale * inv_std, mask=valid)
        tl.store(work + feature_total + f, tl.load(bias_ptr + fp, mask=valid, other=0.0).to(COMPUTE), mask=valid)
        tl.store(work + 2 * feature_total + f, mean, mask=valid)


@triton.jit
def load_old_gradients(dscale_ptr, dbias_ptr, fp, read, HAS_BETA_PARAM: tl.constexpr):
    """The scale and bias gradients a backward blends with (beta_param), loaded ahead of the update."""
    return (tl.load(dscale_ptr + fp, mask=read & HAS_BETA_PARAM, other=0.0),
            tl.load(dbias_ptr + fp, mask=read & HAS_BETA_PARAM, other=0.0))


@triton.jit
def record_gradients(sum1, sum2, inv_std, old_dscale, old_dbias, dscale_ptr, dbias_ptr, fp, write, alpha_param,
                     beta_param, HAS_BETA_PARAM: tl.constexpr, COMPUTE: tl.constexpr):
    """Where ``write``: dscale = alpha_param * sum(g (x - mean)) * inv_std, dbias = alpha_param * sum(g),
    each + beta_param * its old value (``load_old_gradients``)."""
    dscale = tl.cast(alpha_param, COMPUTE) * sum2 * inv_std
    dbias = tl.cast(alpha_param, COMPUTE) * sum1
    if HAS_BETA_PARAM:
        dscale += tl.cast(beta_param, COMPUTE) * old_dscale
        dbias += tl.cast(beta_param, COMPUTE) * old_dbias
    tl.store(dscale_ptr + fp, dscale, mask=write)
    tl.store(dbias_ptr + fp, dbias, mask=write)


@triton.jit
def gradient_coefficients(sum1, sum2, n, scale, inv_std):
    """(k1, k2, k3) of dx = k1 g + k2 (x - mean) + k3, from sum(g) and sum(g (x - mean)) over n elements."""
    k1 = scale * inv_std
    return k1, -k1 * inv_std * inv_std * sum2 / n, -k1 * sum1 / n


@triton.jit
def shifted_statistics(sum1, sum2, n, x0):
    """(mean, biased variance) from the shifted sums sum(x - x0), sum((x - x0)^2) of n elements."""
    shifted_mean = sum1 / n
    return x0 + shifted_mean, tl.maximum(sum2 / n - shifted_mean * shifted_mean, 0.0)


@triton.jit
def inverse_std(var, epsilon, COMPUTE: tl.constexpr):
    if COMPUTE == tl.float64:
        return 1.0 / tl.sqrt(var + epsilon)
    else:
        return 1.0 / tl.sqrt_rn(var + tl.cast(epsilon, tl.float32))


@triton.jit
def load_running(mean_ptr, var_ptr, fp, read, UPDATE_MEAN: tl.constexpr, UPDATE_VAR: tl.constexpr):
    """The running mean and variance that will be updated (where ``read``), loaded ahead of the update."""
    return (tl.load(mean_ptr + fp, mask=read & UPDATE_MEAN, other=0.0),
            tl.load(var_ptr + fp, mask=read & UPDATE_VAR, other=0.0))


@triton.jit
def record_statistics(mean, var, inv_std, n, running_mean, running_var, mean_ptr, var_ptr, mean_at, inv_at, fp, write,
                      factor, UPDATE_MEAN: tl.constexpr, UPDATE_VAR: tl.constexpr, SAVE: tl.constexpr,
                      COMPUTE: tl.constexpr):
    """Where ``write``: the saved statistics (SAVE) and the running averages (from ``load_running``'s
    values, with the unbiased variance). Stores only: nothing waits on them."""
    if SAVE:  # training's saved statistics, or the backward's recomputed ones (STEP "statistics")
        tl.store(mean_at, mean, mask=write)
        tl.store(inv_at, inv_std, mask=write)
    keep = 1.0 - tl.cast(factor, COMPUTE)
    if UPDATE_MEAN:
        tl.store(mean_ptr + fp, keep * running_mean + tl.cast(factor, COMPUTE) * mean, mask=write)
    if UPDATE_VAR:
        unbiased = var * n / tl.maximum(n - 1.0, 1.0)
        tl.store(var_ptr + fp, keep * running_var + tl.cast(factor, COMPUTE) * unbiased, mask=write)


@triton.jit
def bn_forward_kernel(
    x_ptr, z_ptr, y_ptr, work_ptr, mask_ptr,
    outer_sizes, outer_x, outer_z, outer_y, inner_x, inner_z, inner_y, f_sizes, f_x, f_z, f_y, mask_strides,
    outer_total, inner_total, feature_total, f_blocks, i_blocks, tiles,
    alpha: tl.float64, beta: tl.float64, ceiling: tl.float64,
    ADD_Z: tl.constexpr, ACTIVATION: tl.constexpr, WRITE_MASK: tl.constexpr, HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_F: tl.constexpr, INDEX_64: tl.constexpr,
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
    normalize_tile(x, z, mean, a, b, y_ptr, mask_ptr, valid, t, f, f_valid, outer, inner, outer_sizes, outer_y,
                   inner_y, f_sizes, f_y, mask_strides, outer_total, inner_total, i_blocks, alpha, beta, ceiling,
                   ADD_Z, ACTIVATION, WRITE_MASK, HAS_BETA, OUTER_DIMS, F_DIMS, COMPUTE, BLOCK_O, BLOCK_I, INDEX_64)


@triton.jit
def normalize_tile(
    x, z, mean, a, b, y_ptr, mask_ptr, valid, t, f, f_valid, outer, inner, outer_sizes, outer_y, inner_y, f_sizes, f_y,
    mask_strides, outer_total, inner_total, i_blocks, alpha, beta, ceiling,
    ADD_Z: tl.constexpr, ACTIVATION: tl.constexpr, WRITE_MASK: tl.constexpr, HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr, STORE_CACHE: tl.constexpr = NO_HINT,
):
    """Tile t of y = alpha * act((x - mean) * a + b [+ z]) + beta * y (mean, a, b: rows of the features, or
    scalars for one feature), and its mask bits of act'."""
    v = (x.to(COMPUTE) - mean) * a + b  # centred first: exact for data far from zero
    if ADD_Z:
        v += z.to(COMPUTE)
    if ACTIVATION == "relu":
        on = v > 0.0
        v = tl.where(on, v, 0.0)
    elif ACTIVATION == "clipped_relu":
        on = (v > 0.0) & (v < tl.cast(ceiling, COMPUTE))
        v = tl.minimum(tl.where(v > 0.0, v, 0.0), tl.cast(ceiling, COMPUTE))
    else:
        on = valid
    store_blended(v, y_ptr, valid, f, outer, inner, outer_sizes, outer_y, inner_y, f_sizes, f_y, alpha, beta, HAS_BETA,
                  OUTER_DIMS, F_DIMS, COMPUTE, STORE_CACHE)
    if WRITE_MASK:
        store_mask_bits(mask_ptr, on, valid, t, f, f_valid, i_blocks, outer_total, inner_total, mask_strides,
                        BLOCK_O, BLOCK_I, INDEX_64)


@triton.jit
def cluster_barrier(token):
    """Wait until every thread of this CTA's cluster (sm_90) has arrived; the memory writes before it
    are visible after it (release / acquire at cluster scope). Returns ``token``: values computed from it
    cannot be moved above the barrier."""
    return tl.inline_asm_elementwise(
        "barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n\tmov.b32 $0, $1;",
        "=r,r", [token], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def cluster_sums(part1, part2, work_ptr, pid, rank, f, f_valid, feature_total, CLUSTER: tl.constexpr,
                 CLUSTER_BARRIER: tl.constexpr, COMPUTE: tl.constexpr):
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
def prefetch_tile(ptr, f, feature_total, rank, outer_sizes, outer_strides, inner_stride, f_sizes, f_strides,
                  outer_total, inner_total, OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, BLOCK_O: tl.constexpr,
                  BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr, STEP: tl.constexpr):
    """Ask L2 to fetch CTA ``rank``'s tile of feature ``f`` (nothing when f is past the end) and keep it
    (evict_last), one address every STEP lanes, without waiting: the data of a cluster that runs later,
    coming from DRAM while this one sums, waits at its barrier and stores."""
    outer, inner, r_valid = tile_lanes(rank, 1, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64, STEP)
    offsets = (reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_strides, inner_stride)[:, None]
               + dim_offsets(f, F_DIMS, f_sizes, f_strides)[None, :])
    valid = r_valid[:, None] & (f < feature_total)[None, :]
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\t@p prefetch.global.L2::evict_last [$1];\n\tmov.b32 $0, 0;\n\t}",
        "=r,l,r", [ptr + offsets, valid.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def bn_one_read_forward_kernel(
    x_ptr, z_ptr, y_ptr, scale_ptr, bias_ptr, mean_ptr, var_ptr, saved_mean_ptr, saved_inv_ptr, work_ptr, mask_ptr,
    outer_sizes, outer_x, outer_z, outer_y, inner_x, inner_z, inner_y, f_sizes, f_x, f_z, f_y, f_param, mask_strides,
    outer_total, inner_total, feature_total,
    count: tl.float64, epsilon: tl.float64, factor: tl.float64, alpha: tl.float64, beta: tl.float64,
    ceiling: tl.float64, ahead,
    CLUSTER: tl.constexpr, CLUSTER_BARRIER: tl.constexpr, PREFETCH: tl.constexpr,
    ADD_Z: tl.constexpr, ACTIVATION: tl.constexpr, WRITE_MASK: tl.constexpr,
    HAS_BETA: tl.constexpr, UPDATE_MEAN: tl.constexpr, UPDATE_VAR: tl.constexpr, SAVE: tl.constexpr,
    OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr,
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
    x = tl.load(x_ptr + (reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_x, inner_x)[:, None]
                         + fx[None, :]), mask=valid, other=0.0, eviction_policy=LOAD_EVICT)
    z = x
    if ADD_Z:  # with x, ahead of the barrier (loaded after it, the CTA idled a DRAM round trip: 18-26% slower)
        rz = reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_z, inner_z)
        z = tl.load(z_ptr + (rz[:, None] + dim_offsets(f, F_DIMS, f_sizes, f_z)[None, :]), mask=valid, other=0.0,
                    eviction_policy=LOAD_EVICT)
    if PREFETCH > 0:
        prefetch_tile(x_ptr, f + ahead, feature_total, rank, outer_sizes, outer_x, inner_x, f_sizes, f_x,
                      outer_total, inner_total, OUTER_DIMS, F_DIMS, BLOCK_O, BLOCK_I, INDEX_64, PREFETCH)
        if ADD_Z:
            prefetch_tile(z_ptr, f + ahead, feature_total, rank, outer_sizes, outer_z, inner_z, f_sizes, f_z,
                          outer_total, inner_total, OUTER_DIMS, F_DIMS, BLOCK_O, BLOCK_I, INDEX_64, PREFETCH)
    d = tl.where(valid, x.to(COMPUTE) - x0, 0.0)
    sum1, sum2 = cluster_sums(tl.sum(d, 0), tl.sum(d * d, 0), work_ptr, pid, rank, f, f_valid, feature_total,
                              CLUSTER, CLUSTER_BARRIER, COMPUTE)
    n = tl.cast(count, COMPUTE)
    mean, var = shifted_statistics(sum1, sum2, n, x0)
    inv_std = inverse_std(var, epsilon, COMPUTE)
    normalize_tile(x, z, mean, scale * inv_std, b, y_ptr, mask_ptr, valid, rank, f, f_valid, outer, inner,
                   outer_sizes, outer_y, inner_y, f_sizes, f_y, mask_strides, outer_total, inner_total, 1, alpha, beta,
                   ceiling, ADD_Z, ACTIVATION, WRITE_MASK, HAS_BETA, OUTER_DIMS, F_DIMS, COMPUTE, BLOCK_O, BLOCK_I,
                   INDEX_64, STORE_CACHE)
    # rank 0 writes the statistics, stores only: a CTA that waited on a load here would keep its cluster's
    # successor from starting (the running averages are loaded first)
    record_statistics(mean, var, inv_std, n, running_mean, running_var, mean_ptr, var_ptr, saved_mean_ptr + fp,
                      saved_inv_ptr + fp, fp, writer, factor, UPDATE_MEAN, UPDATE_VAR, SAVE, COMPUTE)


@triton.jit
def bn_backward_kernel(
    x_ptr, dy_ptr, dx_ptr, dz_ptr, work_ptr, mask_ptr,
    outer_sizes, outer_x, outer_dy, outer_dx, outer_dz, inner_x, inner_dy, inner_dx, inner_dz,
    f_sizes, f_x, f_dy, f_dx, f_dz, mask_strides,
    outer_total, inner_total, feature_total, f_blocks, i_blocks, tiles, alpha: tl.float64, beta: tl.float64,
    MASKED: tl.constexpr, WRITE_DZ: tl.constexpr, HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_F: tl.constexpr, INDEX_64: tl.constexpr,
):
    """dx = alpha * (k1 * g + k2 * x + k3) + beta * dx, g = dy * mask; dz = alpha * g + beta * dz."""
    pid = tl.program_id(0)
    t = tiles - 1 - pid // f_blocks  # the last tiles first: the gradient pass left them in L2
    f, f_valid = feature_lanes(pid % f_blocks, feature_total, BLOCK_F, INDEX_64)
    fx, fdy = dim_offsets(f, F_DIMS, f_sizes, f_x), dim_offsets(f, F_DIMS, f_sizes, f_dy)
    x, dy, packed, valid = tile_data(x_ptr, dy_ptr, mask_ptr, f, f_valid, fx, fdy, t, tiles, outer_sizes, outer_x,
                                     outer_dy, inner_x, inner_dy, mask_strides, outer_total, inner_total, i_blocks,
                                     True, MASKED, OUTER_DIMS, BLOCK_O, BLOCK_I, INDEX_64)
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
    backward_tile(gradient_input(dy, packed, MASKED, COMPUTE), x.to(COMPUTE) - mean, k1, k2, k3, dx_ptr, dz_ptr,
                  valid, f, outer, inner, outer_sizes, outer_dx, outer_dz, inner_dx, inner_dz, f_sizes, f_dx, f_dz,
                  alpha, beta, WRITE_DZ, HAS_BETA, OUTER_DIMS, F_DIMS, COMPUTE)


@triton.jit
def gradient_input(dy, packed, MASKED: tl.constexpr, COMPUTE: tl.constexpr):
    """g: the gradient reaching the batch norm, dy where the activation's mask bit is set (MASKED)."""
    g = dy.to(COMPUTE)
    if MASKED:
        g = tl.where(unpack_mask_bits(packed), g, 0.0)
    return g


@triton.jit
def backward_tile(
    g, centred, k1, k2, k3, dx_ptr, dz_ptr, valid, f, outer, inner, outer_sizes, outer_dx, outer_dz, inner_dx,
    inner_dz, f_sizes, f_dx, f_dz, alpha, beta, WRITE_DZ: tl.constexpr, HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr, COMPUTE: tl.constexpr, STORE_CACHE: tl.constexpr = NO_HINT,
):
    """A tile of dx = alpha * (k1 g + k2 (x - mean) + k3) + beta * dx and dz = alpha * g + beta * dz
    (k1, k2, k3: rows of the features, or scalars for one feature; ``centred``: x - mean)."""
    store_blended(k1 * g + k2 * centred + k3, dx_ptr, valid, f, outer, inner, outer_sizes, outer_dx, inner_dx, f_sizes,
                  f_dx, alpha, beta, HAS_BETA, OUTER_DIMS, F_DIMS, COMPUTE, STORE_CACHE)
    if WRITE_DZ:
        store_blended(g, dz_ptr, valid, f, outer, inner, outer_sizes, outer_dz, inner_dz, f_sizes, f_dz, alpha, beta,
                      HAS_BETA, OUTER_DIMS, F_DIMS, COMPUTE, STORE_CACHE)


@triton.jit
def store_blended(value, ptr, valid, f, outer, inner, outer_sizes, outer_strides, inner_stride, f_sizes, f_strides,
                  alpha, beta, HAS_BETA: tl.constexpr, OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr,
                  COMPUTE: tl.constexpr, STORE_CACHE: tl.constexpr):
    """Store alpha * value + beta * (the tensor's own value, read only when HAS_BETA) at a tile's lanes of
    the tensor at ``ptr`` (its strides given)."""
    offsets = (reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_strides, inner_stride)[:, None]
               + dim_offsets(f, F_DIMS, f_sizes, f_strides)[None, :])
    out = value * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        out += tl.cast(beta, COMPUTE) * tl.load(ptr + offsets, mask=valid, other=0.0).to(COMPUTE)
    tl.store(ptr + offsets, out.to(ptr.dtype.element_ty), mask=valid, cache_modifier=STORE_CACHE)


@triton.jit
def bn_one_read_backward_kernel(
    x_ptr, dy_ptr, dx_ptr, dz_ptr, scale_ptr, saved_mean_ptr, saved_inv_ptr, dscale_ptr, dbias_ptr, work_ptr,
    mask_ptr, outer_sizes, outer_x, outer_dy, outer_dx, outer_dz, inner_x, inner_dy, inner_dx, inner_dz,
    f_sizes, f_x, f_dy, f_dx, f_dz, f_param, mask_strides, outer_total, inner_total, feature_total,
    count: tl.float64, alpha: tl.float64, beta: tl.float64, alpha_param: tl.float64, beta_param: tl.float64, ahead,
    CLUSTER: tl.constexpr, CLUSTER_BARRIER: tl.constexpr, PREFETCH: tl.constexpr,
    MASKED: tl.constexpr, WRITE_DZ: tl.constexpr,
    HAS_BETA: tl.constexpr, HAS_BETA_PARAM: tl.constexpr, OUTER_DIMS: tl.constexpr, F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr, BLOCK_O: tl.constexpr, BLOCK_I: tl.constexpr, INDEX_64: tl.constexpr,
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
    x, dy, packed, valid = tile_data(x_ptr, dy_ptr, mask_ptr, f, f_valid, fx, fdy, rank, rank + 1, outer_sizes,
                                     outer_x, outer_dy, inner_x, inner_dy, mask_strides, outer_total, inner_total, 1,
                                     True, MASKED, OUTER_DIMS, BLOCK_O, BLOCK_I, INDEX_64, LOAD_EVICT)
    outer, inner, _ = tile_lanes(rank, 1, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64)  # dx's, dz's
    if PREFETCH > 0:
        prefetch_tile(x_ptr, f + ahead, feature_total, rank, outer_sizes, outer_x, inner_x, f_sizes, f_x,
                      outer_total, inner_total, OUTER_DIMS, F_DIMS, BLOCK_O, BLOCK_I, INDEX_64, PREFETCH)
        prefetch_tile(dy_ptr, f + ahead, feature_total, rank, outer_sizes, outer_dy, inner_dy, f_sizes, f_dy,
                      outer_total, inner_total, OUTER_DIMS, F_DIMS, BLOCK_O, BLOCK_I, INDEX_64, PREFETCH)
    g = gradient_input(dy, packed, MASKED, COMPUTE)
    centred = tl.where(valid, x.to(COMPUTE) - mean, 0.0)
    sum1, sum2 = cluster_sums(tl.sum(g, 0), tl.sum(g * centred, 0), work_ptr, pid, rank, f, f_valid, feature_total,
                              CLUSTER, CLUSTER_BARRIER, COMPUTE)
    k1, k2, k3 = gradient_coefficients(sum1, sum2, tl.cast(count, COMPUTE), scale, inv_std)
    backward_tile(g, centred, k1, k2, k3, dx_ptr, dz_ptr, valid, f, outer, inner, outer_sizes, outer_dx, outer_dz,
                  inner_dx, inner_dz, f_sizes, f_dx, f_dz, alpha, beta, WRITE_DZ, HAS_BETA, OUTER_DIMS, F_DIMS,
                  COMPUTE, STORE_CACHE)
    record_gradients(sum1, sum2, inv_std, old_dscale, old_dbias, dscale_ptr, dbias_ptr, fp, writer, alpha_param,
                     beta_param, HAS_BETA_PARAM, COMPUTE)


# ---- launcher -------------------------------------------------------------------------------------

DATA = ("x", "out", "z", "dy")  # the data tensors' order in the plan's stride tuples
X, OUT, Z, DY = range(len(DATA))
PARAM = len(DATA)  # the features' extra strides: the parameter tensors


@dataclass(frozen=True)
class BatchNormPlan:
    """The canonical layout of a call and its tiling.

    ``outer``/``inner``: the reduced dims (outermost first, each (size, strides per DATA tensor));
    ``inner`` is the innermost contiguous dim in the rows orientation, else (1, zeros).
    ``features``: (size, strides per DATA tensor + parameter), outermost first.
    """

    outer: tuple[tuple[int, tuple[int, ...]], ...]
    inner: tuple[int, tuple[int, ...]]
    features: tuple[tuple[int, tuple[int, ...]], ...]
    block_o: int
    block_i: int
    block_f: int
    splits: int
    mask_strides: tuple[int, int]
    compute_bytes: int
    index_64: bool  # some offset may pass 2**31: 64-bit index arithmetic
    one_read: tuple[int, int, int] = (0, 0, 0)  # (CTAs per feature, BLOCK_O, BLOCK_I) of the one-read kernels

    @property
    def outer_total(self) -> int:
        return math.prod(size for size, _ in self.outer)

    @property
    def feature_total(self) -> int:
        return math.prod(size for size, _ in self.features)

    @property
    def f_blocks(self) -> int:
        return triton.cdiv(self.feature_total, self.block_f)

    @property
    def i_blocks(self) -> int:
        return triton.cdiv(self.inner[0], self.block_i)

    @property
    def tiles(self) -> int:
        return triton.cdiv(self.outer_total, self.block_o) * self.i_blocks

    @functools.cached_property
    def kernel_sizes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(outer sizes, feature sizes) for the kernels: exactly OUTER_DIMS and F_DIMS long, so a
        launch binds few arguments."""
        return tuple(size for size, _ in self.outer), tuple(size for size, _ in self.features)

    @functools.cached_property
    def kernel_strides(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """(outer strides per DATA tensor, feature strides per DATA tensor + PARAM)."""
        outer = tuple(tuple(strides[k] for _, strides in self.outer) for k in range(len(DATA)))
        features = tuple(tuple(strides[k] for _, strides in self.features) for k in range(len(DATA) + 1))
        return outer, features

    @functools.cached_property
    def tile_args(self) -> tuple[int, ...]:
        """The tiled kernels' runtime sizes: outer_total, inner_total, feature_total, f_blocks, i_blocks, tiles."""
        return self.outer_total, self.inner[0], self.feature_total, self.f_blocks, self.i_blocks, self.tiles

    @functools.cached_property
    def blocks(self) -> dict[str, Any]:
        """The tiled kernels' constexprs and warps (computed once: the host path is per call)."""
        return dict(OUTER_DIMS=len(self.outer), F_DIMS=len(self.features),
                    COMPUTE=tl.float64 if self.compute_bytes == 8 else tl.float32, INDEX_64=self.index_64,
                    BLOCK_O=self.block_o, BLOCK_I=self.block_i, BLOCK_F=self.block_f,
                    num_warps=max(1, min(8, self.block_o * self.block_i * self.block_f // 512)))

    @functools.cached_property
    def combine_blocks(self) -> tuple[int, int]:
        """(features per combine program, slices per load round): every slice in one round where
        FINAL_TILE holds them for FINAL_MIN_BLOCK features, so that many slices spread over many programs."""
        block_s = min(triton.next_power_of_2(self.splits), FINAL_TILE // FINAL_MIN_BLOCK)
        return min(FINAL_BLOCK, FINAL_TILE // block_s, triton.next_power_of_2(self.feature_total)), block_s

    @functools.cached_property
    def workspace_bytes(self) -> int:
        """Coefficients (4 x F), recomputed statistics (2 x F), partial sums (2 x splits x F): the kernels'
        ``workspace`` rows."""
        return -(-(2 * self.splits + 6) * self.feature_total * self.compute_bytes // 16) * 16


@functools.lru_cache(maxsize=256)
def bn_plan(problem: BatchNormProblem, clusters: bool) -> BatchNormPlan:
    """Merge and sort the dims, pick the orientation and the tile, decide the split; ``clusters``: the
    device has thread-block clusters (else the one-read kernels run one CTA per feature)."""
    x = problem.x
    descs = [getattr(problem, name) or x for name in ("x", "out", "z", "dy")]
    reduced_axes = problem.reduced_axes
    features = [k for k in range(x.ndim) if k not in reduced_axes]
    reduced = merged_dims([(x.dims[k], tuple(d.strides[k] for d in descs)) for k in reduced_axes]) or [(1, (0,) * 4)]
    param_strides = problem.param.strides
    feature_dims = merged_dims([(x.dims[k], (*(d.strides[k] for d in descs), param_strides[k])) for k in features])
    feature_dims = feature_dims or [(1, (0,) * 5)]
    mask_strides = _mask_strides(problem)
    inner_size, inner_strides = reduced[-1]
    contiguous_rows = mask_strides[0] == 1 and inner_strides[0] == 1  # x's innermost reduced dim: NCHW-like
    one_read = (0, 0, 0)
    backward = problem.direction is Direction.BACKWARD
    if (contiguous_rows and (problem.direction is Direction.TRAINING or (backward and x.dtype.itemsize == 4))
            and (inner_size % 8 == 0 or not problem.reserve)):
        # rows of any length where no mask is kept (a mask byte holds 8 lanes of one row). The training
        # forward holds x (and z: half the lanes); the backward x and dy, at 16 warps (one CTA an SM: for
        # 16-bit data slower than the three passes on the H200, docs/design/batch_norm.md)
        holds_z = problem.direction is Direction.TRAINING and problem.z is not None
        limit = MAX_CLUSTER if clusters else 1
        one_read = _one_read_split(math.prod(size for size, _ in reduced[:-1]), inner_size,
                                   ONE_READ_TILE // (2 if holds_z else 1), limit)
    rows = contiguous_rows and (inner_size % 8 == 0 or one_read[0] > 0)
    if rows:
        outer, inner = reduced[:-1] or [(1, (0,) * 4)], (inner_size, inner_strides)
        block_i = _row_block(inner_size)
        block_o = max(1, min(TILE // block_i, triton.next_power_of_2(math.prod(s for s, _ in outer))))
        block_f = 1
    else:
        outer, inner = reduced, (1, (0,) * 4)
        block_i = 1
        block_f = min(triton.next_power_of_2(math.prod(size for size, _ in feature_dims)), COLUMN_BLOCK)
        block_o = max(8, min(TILE // block_f, triton.next_power_of_2(math.prod(s for s, _ in outer))))
    extents = [d.extent for d in (x, problem.out, problem.z, problem.dy) if d is not None]
    index_64 = max(*extents, reserve_size(problem)) >= 2**31 - TILE
    plan = BatchNormPlan(tuple(outer), inner, tuple(feature_dims), block_o, block_i, block_f, 1, mask_strides,
                         problem.compute_dtype.itemsize, index_64, one_read)
    if one_read[0]:  # its partial sums: one slice per CTA of a feature
        return dataclasses.replace(plan, splits=one_read[0])
    splits = max(1, min(triton.cdiv(TARGET_PROGRAMS, plan.f_blocks), plan.tiles // MIN_SLICE_TILES))
    return dataclasses.replace(plan, splits=splits)


def interpreted() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (one program after another)."""
    return isinstance(bn_one_read_forward_kernel, InterpretedFunction)


def _one_read_split(outer_total: int, inner_total: int, elements: int, limit: int) -> tuple[int, int, int]:
    """(CTAs per feature, BLOCK_O, BLOCK_I) of the one-read kernels: the fewest CTAs, a power of two up to
    ``limit`` (1 under the interpreter, which runs programs one after another: no CTA can wait on another),
    whose tiles of at most ``elements`` lanes (whole rows) cover a feature. (0, 0, 0) when none do."""
    block_i = triton.next_power_of_2(inner_total)
    cluster = 1
    while cluster <= limit:
        block_o = triton.next_power_of_2(triton.cdiv(outer_total, cluster))
        if block_o * block_i <= elements:
            return cluster, block_o, block_i
        cluster *= 2
    return 0, 0, 0


def _row_block(inner: int) -> int:
    """The widest power-of-two block (8 to 1024) that wastes at most 1/16 of a row of ``inner``."""
    for block in (1024, 512, 256, 128, 64, 32, 16):
        if triton.cdiv(inner, block) * block - inner <= inner // 16:
            return block
    return 8


def _mask_strides(problem: BatchNormProblem) -> tuple[int, int]:
    """(bytes per 8 reduced indices, bytes per feature) of the mask: feature-major when x's innermost
    reduced dim is more contiguous than its innermost feature dim, else reduced-major. x alone decides."""
    x = problem.x
    reduced_axes = problem.reduced_axes
    inner_stride: dict[bool, list[int]] = {True: [], False: []}
    for k in range(x.ndim):
        if x.dims[k] > 1:
            inner_stride[k in reduced_axes].append(x.strides[k])
    feature_major = min(inner_stride[True], default=math.inf) < min(inner_stride[False], default=math.inf)
    groups = triton.cdiv(problem.count, 8)
    features = problem.x.numel // problem.count
    return (1, groups) if feature_major else (features, 1)


def supports(problem: BatchNormProblem) -> str | None:
    return None


def workspace_size(problem: BatchNormProblem) -> int:
    """Bytes of workspace ``run`` needs: partial sums, coefficients and statistics, on a device with
    thread-block clusters or without (the query has no device: the larger of the two plans)."""
    return max(bn_plan(problem, clusters).workspace_bytes for clusters in (False, True))


@functools.lru_cache(maxsize=256)  # asked on every call of the Ex forms
def reserve_size(problem: BatchNormProblem) -> int:
    """Bytes of reserve space: the activation's mask, a bit per element (bytes of 8 reduced indices
    of one feature), 0 for BN."""
    if problem.ops is BatchNormOps.BN:
        return 0
    return -(-triton.cdiv(problem.count, 8) * (problem.x.numel // problem.count) // 16) * 16


def run(problem: BatchNormProblem, t: BatchNormTensors) -> None:
    x = torch_view(t.x)
    clusters = x.is_cuda and not interpreted() and has_clusters(x.device.index)
    launches, fields, needed = bn_launches(problem, tuple([bound is not None for bound in t]), clusters)
    if t.workspace is None or t.workspace.desc.dims[0] < needed:
        raise InternalError(f"batch_norm needs {needed} bytes of workspace")
    tensors = {}
    for k, name in fields:  # the positions of the tensors given
        bound = t[k]
        if bound is None:
            raise InternalError(f"batch_norm planned {name} but it was not given")
        tensors[name] = torch_view(bound)
    for launch in launches:
        launch(tensors)


@functools.lru_cache(maxsize=256)
def bn_launches(problem: BatchNormProblem, given: tuple[bool, ...], clusters: bool) -> tuple[
        tuple[Launch, ...], tuple[tuple[int, str], ...], int]:
    """(the launches computing ``problem`` with the BatchNormTensors that are ``given`` on a device with
    thread-block ``clusters`` or without, the tensors they take as (index, name) in BatchNormTensors (the
    workspace among them, whole: the kernels find their rows in it), the bytes of workspace)."""
    launches = _launch_sequence(problem, given, clusters)
    used = {name for launch in launches for _, name in launch.slots}
    fields = tuple((k, name) for k, name in enumerate(BatchNormTensors._fields) if name in used)
    return launches, fields, bn_plan(problem, clusters).workspace_bytes


def _launch_sequence(problem: BatchNormProblem, given: tuple[bool, ...], clusters: bool) -> tuple[Launch, ...]:
    """The launches computing ``problem`` (absent tensors are never read; x stands in for them)."""
    launches = _Launches(problem, bn_plan(problem, clusters),
                         {name for name, present in zip(BatchNormTensors._fields, given) if present}, clusters)
    if problem.direction is Direction.INFERENCE:
        return launches.combine("inference"), launches.forward()
    if problem.direction is Direction.TRAINING:
        if launches.plan.one_read[0]:
            return (launches.one_read_forward(),)
        return launches.reduce(gradient=False), launches.combine("training"), launches.forward()
    recomputed = not (problem.saved and "saved_mean" in launches.given)  # the statistics, into the workspace
    if launches.plan.one_read[0] and not recomputed:
        return (launches.one_read_backward(),)
    statistics = (launches.reduce(gradient=False), launches.combine("statistics")) if recomputed else ()
    return (*statistics, launches.reduce(gradient=True, recomputed=recomputed),
            launches.combine("backward", recomputed=recomputed), launches.backward())


class _Launches:
    """The kernels' common arguments for one problem, and one method per kernel giving its Launch."""

    def __init__(self, problem: BatchNormProblem, plan: BatchNormPlan, given: set[str], clusters: bool) -> None:
        self.problem, self.plan, self.given, self.clusters = problem, plan, given, clusters
        self.outer_sizes, self.f_sizes = plan.kernel_sizes
        self.mask = Slot("reserve") if "reserve" in given and problem.reserve else Slot("x")
        self.tile_args, self.blocks = plan.tile_args, plan.blocks

    def outer_strides(self, tensor: int) -> tuple[int, ...]:
        return self.plan.kernel_strides[0][tensor]

    def feature_strides(self, tensor: int) -> tuple[int, ...]:
        return self.plan.kernel_strides[1][tensor]

    def view(self, name: str) -> Slot:
        return Slot(name if name in self.given else "x")

    def reduce(self, gradient: bool, recomputed: bool = False) -> Launch:
        """The statistics pass (sums of x) or, ``gradient``, the gradient pass (centred on the saved
        mean, or the ``recomputed`` one in the workspace)."""
        masked = gradient and self.problem.reserve
        mean = Slot("saved_mean") if gradient and not recomputed else Slot("x")
        return Launch(bn_reduce_kernel, (self.plan.f_blocks * self.plan.splits,), (
            Slot("x"), self.view("dy"), self.mask, mean, Slot("workspace"),
            self.outer_sizes, self.outer_strides(X), self.outer_strides(DY), self.plan.inner[1][X],
            self.plan.inner[1][DY], self.f_sizes, self.feature_strides(X), self.feature_strides(DY),
            self.feature_strides(PARAM), self.plan.mask_strides, *self.tile_args),
            dict(GRADIENT=gradient, MASKED=masked, STATS_IN_WORKSPACE=recomputed, **self.blocks))

    def combine(self, step: str, recomputed: bool = False) -> Launch:
        """The combine of ``step`` ("inference", "training", "statistics", "backward"); the backward's
        statistics are the saved ones or the ``recomputed`` ones in the workspace."""
        p = self.problem
        update_mean, update_var, save = self.writes(step)
        block, block_s = self.plan.combine_blocks
        return Launch(bn_combine_kernel, (triton.cdiv(self.plan.feature_total, block),), (
            Slot("workspace"), Slot("x"), self.view("scale"), self.view("bias"), self.view("mean"),
            self.view("variance"), self.view("saved_mean"), self.view("saved_inv_std"), self.view("dscale"),
            self.view("dbias"), self.f_sizes, self.feature_strides(X), self.feature_strides(PARAM),
            self.plan.feature_total, self.plan.splits if step != "inference" else 0, float(p.count), p.epsilon,
            p.factor, p.alpha_param, p.beta_param), dict(
            STEP=step, UPDATE_MEAN=update_mean, UPDATE_VAR=update_var, SAVE=save,
            STATS_IN_WORKSPACE=step == "statistics" or recomputed, HAS_BETA_PARAM=p.beta_param != 0.0,
            F_DIMS=len(self.plan.features), COMPUTE=self.blocks["COMPUTE"], BLOCK=block, BLOCK_S=block_s,
            num_warps=4))

    def writes(self, step: str) -> tuple[bool, bool, bool]:
        """Whether ``step``'s statistics update the running mean, the running variance, and are saved."""
        given = self.given
        save = step == "statistics" or (step == "training" and "saved_mean" in given and "saved_inv_std" in given)
        return step == "training" and "mean" in given, step == "training" and "variance" in given, save

    def prefetch_lanes(self, min_cluster: int) -> int:
        """Lanes per L2 prefetch in the one-read kernels: PREFETCH_BYTES of data, or 0 in clusters below
        ``min_cluster`` (at least 4: only devices with clusters prefetch, never the interpreter)."""
        if self.plan.one_read[0] < min_cluster:
            return 0
        return PREFETCH_BYTES // self.problem.x.dtype.itemsize

    def one_read_forward(self) -> Launch:
        """The training forward in one launch, a cluster of CTAs per feature (``bn_one_read_forward_kernel``)."""
        p = self.problem
        update_mean, update_var, save = self.writes("training")
        cluster, block_o, block_i = self.plan.one_read
        ids = X, Z, OUT
        return Launch(bn_one_read_forward_kernel, (self.plan.feature_total * cluster,), (
            Slot("x"), self.view("z"), Slot("out"), self.view("scale"), self.view("bias"), self.view("mean"),
            self.view("variance"), self.view("saved_mean"), self.view("saved_inv_std"), Slot("workspace"), self.mask,
            self.outer_sizes, *(self.outer_strides(k) for k in ids), *(self.plan.inner[1][k] for k in ids),
            self.f_sizes, *(self.feature_strides(k) for k in (*ids, PARAM)), self.plan.mask_strides,
            self.plan.outer_total, self.plan.inner[0], self.plan.feature_total, float(p.count), p.epsilon, p.factor,
            p.alpha, p.beta, p.activation_coef, PREFETCH_AHEAD), dict(
            CLUSTER=cluster, CLUSTER_BARRIER=self.clusters, PREFETCH=self.prefetch_lanes(PREFETCH_MIN_CLUSTER),
            ADD_Z="z" in self.given,
            ACTIVATION=p.activation or "identity",
            WRITE_MASK=p.reserve and "reserve" in self.given, HAS_BETA=p.beta != 0.0, UPDATE_MEAN=update_mean,
            UPDATE_VAR=update_var, SAVE=save, OUTER_DIMS=len(self.plan.outer), F_DIMS=len(self.plan.features),
            COMPUTE=self.blocks["COMPUTE"], BLOCK_O=block_o, BLOCK_I=block_i, INDEX_64=self.plan.index_64,
            num_warps=max(1, min(8, block_o * block_i // 512))), cluster=cluster)

    def one_read_backward(self) -> Launch:
        """The backward with saved statistics in one launch, a cluster of CTAs per feature
        (``bn_one_read_backward_kernel``)."""
        p = self.problem
        cluster, block_o, block_i = self.plan.one_read
        ids = X, DY, OUT, Z
        return Launch(bn_one_read_backward_kernel, (self.plan.feature_total * cluster,), (
            Slot("x"), Slot("dy"), Slot("out"), self.view("z"), self.view("scale"), Slot("saved_mean"),
            Slot("saved_inv_std"), Slot("dscale"), Slot("dbias"), Slot("workspace"), self.mask, self.outer_sizes,
            *(self.outer_strides(k) for k in ids), *(self.plan.inner[1][k] for k in ids), self.f_sizes,
            *(self.feature_strides(k) for k in (*ids, PARAM)), self.plan.mask_strides, self.plan.outer_total,
            self.plan.inner[0], self.plan.feature_total, float(p.count), p.alpha, p.beta, p.alpha_param,
            p.beta_param, PREFETCH_AHEAD), dict(
            CLUSTER=cluster, CLUSTER_BARRIER=self.clusters,
            PREFETCH=self.prefetch_lanes(PREFETCH_MIN_CLUSTER if "z" in self.given else PREFETCH_MIN_CLUSTER_DX),
            MASKED=p.reserve and "reserve" in self.given, WRITE_DZ="z" in self.given, HAS_BETA=p.beta != 0.0,
            HAS_BETA_PARAM=p.beta_param != 0.0, OUTER_DIMS=len(self.plan.outer), F_DIMS=len(self.plan.features),
            COMPUTE=self.blocks["COMPUTE"], BLOCK_O=block_o, BLOCK_I=block_i, INDEX_64=self.plan.index_64,
            num_warps=max(1, min(16, block_o * block_i // 1024))), cluster=cluster)

    def forward(self) -> Launch:
        p = self.problem
        ids = X, Z, OUT
        return Launch(bn_forward_kernel, (self.plan.f_blocks * self.plan.tiles,), (
            Slot("x"), self.view("z"), Slot("out"), Slot("workspace"), self.mask, self.outer_sizes,
            *(self.outer_strides(k) for k in ids), *(self.plan.inner[1][k] for k in ids), self.f_sizes,
            *(self.feature_strides(k) for k in ids), self.plan.mask_strides, *self.tile_args,
            p.alpha, p.beta, p.activation_coef), dict(
            ADD_Z="z" in self.given, ACTIVATION=p.activation or "identity",
            WRITE_MASK=p.reserve and "reserve" in self.given, HAS_BETA=p.beta != 0.0, **self.blocks))

    def backward(self) -> Launch:
        p = self.problem
        ids = X, DY, OUT, Z
        return Launch(bn_backward_kernel, (self.plan.f_blocks * self.plan.tiles,), (
            Slot("x"), Slot("dy"), Slot("out"), self.view("z"), Slot("workspace"), self.mask, self.outer_sizes,
            *(self.outer_strides(k) for k in ids), *(self.plan.inner[1][k] for k in ids), self.f_sizes,
            *(self.feature_strides(k) for k in ids), self.plan.mask_strides, *self.tile_args, p.alpha, p.beta),
            dict(MASKED=p.reserve and "reserve" in self.given, WRITE_DZ="z" in self.given, HAS_BETA=p.beta != 0.0,
                 **self.blocks))
