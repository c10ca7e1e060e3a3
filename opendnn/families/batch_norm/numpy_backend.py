"""Batch normalization on the NumPy backend, in the compute dtype (float32, float64 for float64).

Inference is the reference's formula. Training and backward view x as ``(N, P, L)``, the statistics
per P (spatial mode: P = C, L = the spatial positions; per-activation mode: P = C*H*W, L = 1), and
run a block of features at a time, every sample's rows of L for those features, while the block is
in cache: its sums over N and L (einsum's vectorised float32 sums), the centred block formed once,
then training's ``y = xc * (scale * inv_std) + bias`` or backward's ``dx = k * g + b * xc + c`` with
``k = scale * inv_std``, ``b = -k * inv_std^2 * sum(g * xc) / n`` and ``c = -k * sum(g) / n`` (the
per-feature values in float64), straight into the output's memory where it may be. No workspace.
The reserve space of the Ex forms holds the activation's mask, one byte per element of x in
row-major order of x's dims: 1 where act' is 1, 0 where it is 0, NAN_MARK where the pre-activation
is NaN under propagate_nan (g is NaN there when the backward propagates NaN too, else 0).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.core.reference_io import numpy_view, output_array, read, write
from opendnn.families.batch_norm import problem as bn
from opendnn.families.batch_norm.problem import BatchNormProblem, BatchNormTensors, Direction

NAN_MARK = 2  # the reserve byte of a NaN pre-activation


def supports(problem: BatchNormProblem) -> str | None:
    return None


def workspace_size(problem: BatchNormProblem) -> int:
    """Bytes of workspace ``run`` needs: none."""
    return 0


def reserve_size(problem: BatchNormProblem) -> int:
    """Bytes of reserve space the Ex forward writes for backward: the mask, a byte per element."""
    return problem.x.numel if problem.ops is not bn.BatchNormOps.BN else 0


def run(problem: BatchNormProblem, t: BatchNormTensors) -> None:
    compute = problem.compute_dtype

    def get(bound: Bound | None) -> np.ndarray | None:
        return None if bound is None else read(bound, compute)

    def need(bound: Bound | None, reader: Callable[[Bound, DataType], np.ndarray] = read) -> np.ndarray:
        if bound is None:  # the API binds these for every problem of the direction
            raise InternalError("batch norm: a tensor its direction reads was not bound")
        return reader(bound, compute)

    scale = need(t.scale)
    if problem.direction is Direction.INFERENCE:
        y = bn.forward_inference(need(t.x), scale, need(t.bias), need(t.mean), need(t.variance), problem.epsilon)
        write(t.out, y, problem.alpha, problem.beta)
    elif problem.direction is Direction.TRAINING:
        _training(problem, t, need(t.x), scale, need(t.bias), get(t.z), get(t.mean), get(t.variance))
    else:
        _backward(problem, t, need(t.x), need(t.dy), scale)


def _rows(values: np.ndarray, mode: bn.BatchNormMode) -> np.ndarray:
    """x's dims as (N, P, L): the statistics are per P, over N and L."""
    n = values.shape[0]
    return values.reshape(n, values.shape[1], -1) if bn.BatchNormMode(mode).is_spatial else values.reshape(n, -1, 1)


BLOCK_ELEMENTS = 1 << 16  # elements of x per block of features: the block, its scratch and g stay in L2


class _FeatureBlocks:
    """Blocks of features of (N, P, L) rows, every sample's rows of L for a few features, about
    BLOCK_ELEMENTS elements each: a block's statistics and its result are formed while it is in
    cache, so x crosses memory once. Holds two scratch blocks and two planes for per-feature operands."""

    def __init__(self, rows: np.ndarray) -> None:
        count, features, length = rows.shape
        step = max(1, min(features, BLOCK_ELEMENTS // (count * length)))
        self.count = count * length  # the elements each feature's statistics run over
        self.slices = [slice(start, min(features, start + step)) for start in range(0, features, step)]
        self.scratch = np.empty((2, count * step * length), rows.dtype)
        # A per-feature constant over rows shorter than NumPy's ufunc buffer is a buffered operand, copied
        # as it broadcasts; written out along L once per block (for all its samples) it is a plain one.
        self.planes = np.empty((2, step, length), rows.dtype) if length < np.getbufsize() else None
        self.planes_dtype = rows.dtype

    def buffer(self, index: int, block: np.ndarray) -> np.ndarray:
        """Scratch ``index`` (0 or 1) shaped as ``block``."""
        return self.scratch[index, : block.size].reshape(block.shape)

    def operand(self, values: np.ndarray, plane: int) -> np.ndarray:
        """Per-feature ``values`` (the block's features, 1) as an operand of the block's rows."""
        if self.planes is None:
            return values.astype(self.planes_dtype, copy=False)
        out = self.planes[plane, : values.shape[0]]
        out[...] = values.astype(self.planes_dtype, copy=False)  # converted first: a converting broadcast costs 2x
        return out


def _training(
    problem: BatchNormProblem,
    t: BatchNormTensors,
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    z: np.ndarray | None,
    running_mean: np.ndarray | None,
    running_var: np.ndarray | None,
) -> None:
    """``v = (x - mean) * (scale * inv_std) + bias`` a block of features at a time (the block's mean,
    then its variance from the centred block, then its v), then ``+ z`` and the activation."""
    rows = _rows(x, problem.mode)
    blocks = _FeatureBlocks(rows)
    n = blocks.count
    scale_rows, bias_rows = _rows(scale, problem.mode)[0], _rows(bias, problem.mode)[0]
    mean, var = np.empty_like(scale_rows), np.empty_like(scale_rows)
    reserve = t.reserve if problem.reserve else None  # where the activation's mask is kept
    plain = z is None and problem.activation in (None, "identity") and reserve is None  # y is v
    target = output_array(t.out, problem.compute_dtype, problem.alpha, problem.beta, x) if plain else None
    v = np.empty_like(rows) if target is None else _rows(target, problem.mode)
    for f in blocks.slices:
        values = rows[:, f]
        mean[f] = np.einsum("npl->p", values)[:, None] / n
        xc = np.subtract(values, blocks.operand(mean[f], 0), out=blocks.buffer(0, values))
        var[f] = np.einsum("npl,npl->p", xc, xc)[:, None] / n
        xc *= blocks.operand(scale_rows[f] / np.sqrt(var[f] + problem.epsilon), 1)
        np.add(xc, blocks.operand(bias_rows[f], 0), out=v[:, f])
    inv_std = 1.0 / np.sqrt(var + problem.epsilon)
    if target is None:
        values = v.reshape(x.shape)
        if z is not None:
            values += z
        y, mask = bn.activate(values, problem.activation, problem.activation_coef, problem.propagate_nan)
        write(t.out, y, problem.alpha, problem.beta)
        if reserve is not None:
            numpy_view(reserve).reshape(-1)[: x.size] = np.where(np.isnan(mask), NAN_MARK, mask).reshape(-1)
    stats = {"mean": mean, "inv_std": inv_std}
    stats |= bn.running_statistics(
        mean.reshape(scale.shape), var.reshape(scale.shape), n, problem.factor, running_mean, running_var
    )
    for name, bound in (
        ("running_mean", t.mean),
        ("running_var", t.variance),
        ("mean", t.saved_mean),
        ("inv_std", t.saved_inv_std),
    ):
        if bound is not None:
            write(bound, stats[name].reshape(bound.desc.dims))


def _backward(problem: BatchNormProblem, t: BatchNormTensors, x: np.ndarray, dy: np.ndarray, scale: np.ndarray) -> None:
    """``dx = k * g + b * (x - mean) + c`` a block of features at a time (every sample's rows of L
    for those features): ``k = scale * inv_std``, ``b = -k * inv_std^2 * sum(g * (x - mean)) / n``,
    ``c = -k * sum(g) / n``, the block's two sums and then its dx formed while it is in cache, so x
    and g are read from memory once and dx written once; the per-feature values in float64."""
    compute = problem.compute_dtype
    mask = None
    if t.reserve is not None and problem.reserve:
        marks = numpy_view(t.reserve).reshape(-1)[: x.size].reshape(x.shape)
        at_nan = 1.0 if problem.torch_rule else np.nan if problem.propagate_nan else 0.0
        mask = np.where(marks == NAN_MARK, at_nan, marks).astype(x.dtype)
    if mask is None:
        g = dy
    elif problem.torch_rule:  # torch's selects: 0 where the mask is, even for a NaN or infinite dy
        g = np.where(mask != 0, dy, 0.0).astype(dy.dtype, copy=False)
    else:
        g = dy * mask
    if t.z is not None:
        write(t.z, g, problem.alpha, problem.beta)
    rows, g_rows = _rows(x, problem.mode), _rows(g, problem.mode)
    blocks = _FeatureBlocks(rows)
    n = blocks.count
    saved = problem.saved and t.saved_mean is not None and t.saved_inv_std is not None
    mean, inv_std = np.empty((rows.shape[1], 1)), np.empty((rows.shape[1], 1))  # else formed block by block
    for values, bound in ((mean, t.saved_mean), (inv_std, t.saved_inv_std)):
        if saved and bound is not None:
            values[...] = _rows(read(bound, compute), problem.mode)[0]
    scale_rows = _rows(scale, problem.mode)[0]
    k, b_per_sum, c_per_sum = (np.empty_like(mean) for _ in range(3))  # b per sum(g * xc), c per sum(g)

    def per_feature(f: slice) -> None:
        k[f] = scale_rows[f] * inv_std[f]
        b_per_sum[f], c_per_sum[f] = -k[f] * inv_std[f] ** 2 / n, -k[f] / n

    if saved:
        per_feature(slice(None))
    dscale, dbias = np.empty_like(mean), np.empty_like(mean)
    target = output_array(t.out, compute, problem.alpha, problem.beta, x, g)  # dx's own memory, where it may be
    dx = np.empty_like(rows) if target is None else _rows(target, problem.mode)
    for f in blocks.slices:
        values, gradient, out = rows[:, f], g_rows[:, f], dx[:, f]
        if not saved:
            mean[f] = np.einsum("npl->p", values)[:, None] / n
        xc = np.subtract(values, blocks.operand(mean[f], 0), out=blocks.buffer(0, values))
        if not saved:  # the variance from the centred block
            inv_std[f] = 1.0 / np.sqrt(np.einsum("npl,npl->p", xc, xc)[:, None] / n + problem.epsilon)
            per_feature(f)
        dbias[f] = np.einsum("npl->p", gradient)[:, None]
        dscale[f] = np.einsum("npl,npl->p", gradient, xc)[:, None]  # sum(g * (x - mean))
        xc *= blocks.operand(b_per_sum[f] * dscale[f], 0)
        np.multiply(gradient, blocks.operand(k[f], 1), out=out)
        out += xc
        out += blocks.operand(c_per_sum[f] * dbias[f], 1)
    dscale *= inv_std
    if target is None:
        write(t.out, dx.reshape(x.shape), problem.alpha, problem.beta)
    if t.dscale is None or t.dbias is None:
        raise InternalError("batch norm backward: dscale and dbias were not bound")
    write(t.dscale, dscale.reshape(t.dscale.desc.dims), problem.alpha_param, problem.beta_param)
    write(t.dbias, dbias.reshape(t.dbias.desc.dims), problem.alpha_param, problem.beta_param)
