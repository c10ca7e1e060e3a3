"""Batch normalization on the NumPy backend: the float64 reference run in the compute dtype.

No workspace. The reserve space of the Ex forms holds the activation's mask, one byte per element
of x in row-major order of x's dims.
"""

from __future__ import annotations

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.errors import InternalError
from opendnn.core.reference_io import numpy_view, read, write
from opendnn.families.batch_norm import problem as bn
from opendnn.families.batch_norm.problem import BatchNormProblem, BatchNormTensors, Direction


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

    def need(bound: Bound | None) -> np.ndarray:  # the API binds these for every problem of the direction
        if bound is None:
            raise InternalError("batch norm: a tensor its direction reads was not bound")
        return read(bound, compute)

    x, scale = need(t.x), need(t.scale)
    if problem.direction is Direction.INFERENCE:
        y = bn.forward_inference(x, scale, need(t.bias), need(t.mean), need(t.variance), problem.epsilon)
        write(t.out, y, problem.alpha, problem.beta)
    elif problem.direction is Direction.TRAINING:
        _training(problem, t, x, scale, need(t.bias), get(t.z), get(t.mean), get(t.variance))
    else:
        _backward(problem, t, x, need(t.dy), scale)


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
    result = bn.forward_training(
        x,
        scale,
        bias,
        problem.epsilon,
        problem.mode,
        factor=problem.factor,
        running_mean=running_mean,
        running_var=running_var,
        z=z,
        activation=problem.activation,
        coef=problem.activation_coef,
    )
    write(t.out, result["y"], problem.alpha, problem.beta)
    for name, bound in (
        ("running_mean", t.mean),
        ("running_var", t.variance),
        ("mean", t.saved_mean),
        ("inv_std", t.saved_inv_std),
    ):
        if bound is not None:
            write(bound, result[name].reshape(bound.desc.dims))
    if t.reserve is not None and problem.reserve:
        numpy_view(t.reserve).reshape(-1)[: x.size] = result["mask"].reshape(-1)


def _backward(problem: BatchNormProblem, t: BatchNormTensors, x: np.ndarray, dy: np.ndarray, scale: np.ndarray) -> None:
    compute = problem.compute_dtype
    mean = inv_std = mask = None
    if problem.saved and t.saved_mean is not None and t.saved_inv_std is not None:
        mean, inv_std = read(t.saved_mean, compute), read(t.saved_inv_std, compute)
    if t.reserve is not None and problem.reserve:
        mask = numpy_view(t.reserve).reshape(-1)[: x.size].reshape(x.shape).astype(x.dtype)
    result = bn.backward(x, dy, scale, problem.epsilon, problem.mode, mean=mean, inv_std=inv_std, mask=mask)
    write(t.out, result["dx"], problem.alpha, problem.beta)
    if t.z is not None:
        write(t.z, result["dz"], problem.alpha, problem.beta)
    if t.dscale is None or t.dbias is None:
        raise InternalError("batch norm backward: dscale and dbias were not bound")
    write(t.dscale, result["dscale"].reshape(t.dscale.desc.dims), problem.alpha_param, problem.beta_param)
    write(t.dbias, result["dbias"].reshape(t.dbias.desc.dims), problem.alpha_param, problem.beta_param)
