"""Batch normalization's device functions that both designs (``triton_three_pass``, ``triton_one_read``)
build on: a tile's lanes and offsets, the activation's mask bits, a tile's loads, the workspace's rows,
the per-feature statistics and coefficients, and the normalize and backward tiles with their alpha / beta
blending. ``triton_backend`` describes the layout, the workspace and the reserve space.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.kernels.indexing import dim_offsets

NO_HINT = tl.constexpr("")  # no cache hint on a load or store
MASK_GROUP = tl.constexpr(8)  # bits per mask byte
STATS_ROW = tl.constexpr(4)  # workspace rows (of feature_total elements): 4 coefficients, mean, inv std,
PARTIAL_ROW = tl.constexpr(6)  # then the partial sums (2 x splits rows)


@triton.jit
def tile_lanes(
    t,
    i_blocks,
    outer_total,
    inner_total,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
    STEP: tl.constexpr = 1,
):
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
def load_mask_bytes(
    mask_ptr,
    t,
    stop,
    f,
    f_valid,
    i_blocks,
    outer_total,
    inner_total,
    mask_strides,
    PROPAGATE_NAN: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Tile t's mask bytes (nothing for t >= stop), one per aligned group of 8 lanes, loaded at the
    group's first lane (groups are aligned, see store_mask_bits): no reduction across lanes (one would
    go through shared memory with barriers, every tile). PROPAGATE_NAN: the NaN plane's byte too, in
    bits 8-15."""
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64, MASK_GROUP)
    offsets = mask_offsets(outer, inner, f, inner_total, mask_strides)
    load_mask = (r_valid & (t < stop))[:, None] & f_valid[None, :]
    packed = tl.load(mask_ptr + offsets, mask=load_mask, other=0)
    if PROPAGATE_NAN:
        nan_bits = tl.load(mask_ptr + mask_strides[2] + offsets, mask=load_mask, other=0)
        packed = packed.to(tl.int32) | (nan_bits.to(tl.int32) << MASK_GROUP)
    return packed


@triton.jit
def unpack_mask_bits(packed):
    """The activation's mask (True where act' = 1) of each lane, from its group's byte (bits 0-7), by shifts."""
    GROUPS: tl.constexpr = packed.shape[0]
    COLS: tl.constexpr = packed.shape[1]
    bits = (packed.to(tl.int32)[:, None, :] >> tl.arange(0, MASK_GROUP)[None, :, None]) & 1
    return tl.reshape(bits, (GROUPS * MASK_GROUP, COLS)) != 0


@triton.jit
def pack_mask_bits(bits, valid):
    """8 lanes' bits per byte (as int32), one per aligned group of 8 lanes."""
    ROWS: tl.constexpr = bits.shape[0]
    COLS: tl.constexpr = bits.shape[1]
    weights = (1 << tl.arange(0, MASK_GROUP))[None, :, None]
    return tl.sum(tl.reshape((bits & valid).to(tl.int32), (ROWS // MASK_GROUP, MASK_GROUP, COLS)) * weights, 1)


@triton.jit
def store_mask_bits(
    mask_ptr,
    bits,
    nan_bits,
    valid,
    t,
    f,
    f_valid,
    i_blocks,
    outer_total,
    inner_total,
    mask_strides,
    PROPAGATE_NAN: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
):
    """Pack 8 lanes' bits per byte; PROPAGATE_NAN: ``nan_bits`` too, into the NaN plane
    (``mask_strides[2]`` bytes on). A group's byte and existence are its first lane's (groups are
    aligned: BLOCK_O or BLOCK_I and, in rows orientation, the row length are multiples of 8)."""
    outer, inner, r_valid = tile_lanes(t, i_blocks, outer_total, inner_total, BLOCK_O, BLOCK_I, INDEX_64, MASK_GROUP)
    at = mask_ptr + mask_offsets(outer, inner, f, inner_total, mask_strides)
    group_valid = r_valid[:, None] & f_valid[None, :]
    tl.store(at, pack_mask_bits(bits, valid).to(tl.uint8), mask=group_valid)
    if PROPAGATE_NAN:
        tl.store(at + mask_strides[2], pack_mask_bits(nan_bits, valid).to(tl.uint8), mask=group_valid)


@triton.jit
def feature_lanes(pid_f, feature_total, BLOCK_F: tl.constexpr, INDEX_64: tl.constexpr):
    """Program ``pid_f``'s BLOCK_F features and which of them exist."""
    if INDEX_64:
        pid_f = tl.cast(pid_f, tl.int64)
    f = pid_f * BLOCK_F + tl.arange(0, BLOCK_F)
    return f, f < feature_total


@triton.jit
def tile_data(
    x_ptr,
    dy_ptr,
    mask_ptr,
    f,
    f_valid,
    fx,
    fdy,
    t,
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
    GRADIENT: tl.constexpr,
    MASKED: tl.constexpr,
    PROPAGATE_NAN: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INDEX_64: tl.constexpr,
    LOAD_EVICT: tl.constexpr = NO_HINT,
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
            packed = load_mask_bytes(
                mask_ptr,
                t,
                stop,
                f,
                f_valid,
                i_blocks,
                outer_total,
                inner_total,
                mask_strides,
                PROPAGATE_NAN,
                BLOCK_O,
                BLOCK_I,
                INDEX_64,
            )
    return x, dy, packed, valid


@triton.jit
def workspace(work_ptr, COMPUTE: tl.constexpr):
    """The workspace (any dtype) as COMPUTE elements, in rows of feature_total: the elementwise pass's
    4 coefficients, the recomputed mean and inv std (STATS_ROW), the partial sums (PARTIAL_ROW on)."""
    return work_ptr.to(tl.pointer_type(COMPUTE), bitcast=True)


@triton.jit
def load_old_gradients(dscale_ptr, dbias_ptr, fp, read, HAS_BETA_PARAM: tl.constexpr):
    """The scale and bias gradients a backward blends with (beta_param), loaded ahead of the update."""
    return (
        tl.load(dscale_ptr + fp, mask=read & HAS_BETA_PARAM, other=0.0),
        tl.load(dbias_ptr + fp, mask=read & HAS_BETA_PARAM, other=0.0),
    )


@triton.jit
def record_gradients(
    sum1,
    sum2,
    inv_std,
    old_dscale,
    old_dbias,
    dscale_ptr,
    dbias_ptr,
    fp,
    write,
    alpha_param,
    beta_param,
    HAS_BETA_PARAM: tl.constexpr,
    COMPUTE: tl.constexpr,
):
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
    return (
        tl.load(mean_ptr + fp, mask=read & UPDATE_MEAN, other=0.0),
        tl.load(var_ptr + fp, mask=read & UPDATE_VAR, other=0.0),
    )


@triton.jit
def record_statistics(
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
    write,
    factor,
    UPDATE_MEAN: tl.constexpr,
    UPDATE_VAR: tl.constexpr,
    SAVE: tl.constexpr,
    COMPUTE: tl.constexpr,
):
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
def normalize_tile(
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
    INDEX_64: tl.constexpr,
    STORE_CACHE: tl.constexpr = NO_HINT,
):
    """Tile t of y = alpha * act((x - mean) * a + b [+ z]) + beta * y (mean, a, b: rows of the features, or
    scalars for one feature), and its mask bits of act'; PROPAGATE_NAN: a NaN pre-activation stays NaN
    through relu and clipped relu, and its bit is set in the NaN plane."""
    v = (x.to(COMPUTE) - mean) * a + b  # centred first: exact for data far from zero
    if ADD_Z:
        v += z.to(COMPUTE)
    nan = v != v
    if ACTIVATION == "relu":
        on = v > 0.0
        kept = on
        if PROPAGATE_NAN:
            kept = on | nan
        v = tl.where(kept, v, 0.0)
    elif ACTIVATION == "clipped_relu":
        on = (v > 0.0) & (v < tl.cast(ceiling, COMPUTE))
        clipped = tl.minimum(tl.where(v > 0.0, v, 0.0), tl.cast(ceiling, COMPUTE))
        if PROPAGATE_NAN:
            clipped = tl.where(nan, v, clipped)
        v = clipped
    else:
        on = valid
    store_blended(
        v,
        y_ptr,
        valid,
        f,
        outer,
        inner,
        outer_sizes,
        outer_y,
        inner_y,
        f_sizes,
        f_y,
        alpha,
        beta,
        HAS_BETA,
        OUTER_DIMS,
        F_DIMS,
        COMPUTE,
        STORE_CACHE,
    )
    if WRITE_MASK:
        store_mask_bits(
            mask_ptr,
            on,
            nan,
            valid,
            t,
            f,
            f_valid,
            i_blocks,
            outer_total,
            inner_total,
            mask_strides,
            PROPAGATE_NAN,
            BLOCK_O,
            BLOCK_I,
            INDEX_64,
        )


@triton.jit
def gradient_input(
    dy, packed, MASKED: tl.constexpr, PROPAGATE_NAN: tl.constexpr, TORCH_RULE: tl.constexpr, COMPUTE: tl.constexpr
):
    """g: the gradient reaching the batch norm, dy where the activation's mask bit is set (MASKED);
    PROPAGATE_NAN: NaN where the NaN plane's bit (bits 8-15 of ``packed``) is set, or dy there with
    TORCH_RULE (torch's relu and hardtanh backward: a NaN fails their tests)."""
    g = dy.to(COMPUTE)
    if MASKED:
        passes = unpack_mask_bits(packed)
        if TORCH_RULE:
            passes = passes | unpack_mask_bits(packed >> MASK_GROUP)
        g = tl.where(passes, g, 0.0)
        if PROPAGATE_NAN and not TORCH_RULE:
            g = tl.where(unpack_mask_bits(packed >> MASK_GROUP), float("nan"), g)
    return g


@triton.jit
def backward_tile(
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
    WRITE_DZ: tl.constexpr,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    STORE_CACHE: tl.constexpr = NO_HINT,
):
    """A tile of dx = alpha * (k1 g + k2 (x - mean) + k3) + beta * dx and dz = alpha * g + beta * dz
    (k1, k2, k3: rows of the features, or scalars for one feature; ``centred``: x - mean)."""
    store_blended(
        k1 * g + k2 * centred + k3,
        dx_ptr,
        valid,
        f,
        outer,
        inner,
        outer_sizes,
        outer_dx,
        inner_dx,
        f_sizes,
        f_dx,
        alpha,
        beta,
        HAS_BETA,
        OUTER_DIMS,
        F_DIMS,
        COMPUTE,
        STORE_CACHE,
    )
    if WRITE_DZ:
        store_blended(
            g,
            dz_ptr,
            valid,
            f,
            outer,
            inner,
            outer_sizes,
            outer_dz,
            inner_dz,
            f_sizes,
            f_dz,
            alpha,
            beta,
            HAS_BETA,
            OUTER_DIMS,
            F_DIMS,
            COMPUTE,
            STORE_CACHE,
        )


@triton.jit
def store_blended(
    value,
    ptr,
    valid,
    f,
    outer,
    inner,
    outer_sizes,
    outer_strides,
    inner_stride,
    f_sizes,
    f_strides,
    alpha,
    beta,
    HAS_BETA: tl.constexpr,
    OUTER_DIMS: tl.constexpr,
    F_DIMS: tl.constexpr,
    COMPUTE: tl.constexpr,
    STORE_CACHE: tl.constexpr,
):
    """Store alpha * value + beta * (the tensor's own value, read only when HAS_BETA) at a tile's lanes of
    the tensor at ``ptr`` (its strides given)."""
    offsets = (
        reduced_offsets(outer, inner, OUTER_DIMS, outer_sizes, outer_strides, inner_stride)[:, None]
        + dim_offsets(f, F_DIMS, f_sizes, f_strides)[None, :]
    )
    out = value * tl.cast(alpha, COMPUTE)
    if HAS_BETA:
        out += tl.cast(beta, COMPUTE) * tl.load(ptr + offsets, mask=valid, other=0.0).to(COMPUTE)
    tl.store(ptr + offsets, out.to(ptr.dtype.element_ty), mask=valid, cache_modifier=STORE_CACHE)
