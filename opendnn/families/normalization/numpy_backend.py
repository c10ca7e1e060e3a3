"""Layer, RMS, group and instance normalization on the NumPy backend: the references in the
compute dtype."""

from __future__ import annotations

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import read, write
from opendnn.families.normalization.problem import NormProblem, backward_reference, forward_reference


def supports(problem: NormProblem) -> str | None:
    return None


def workspace_size(problem: NormProblem) -> int:
    return 0


def run(
    problem: NormProblem,
    x: Bound,
    y: Bound,
    scale: Bound | None,
    bias: Bound | None,
    mean: Bound | None,
    inv_std: Bound | None,
    dy: Bound | None = None,
    dscale: Bound | None = None,
) -> None:
    """Forward: y, and mean / inv_std when bound. Backward: dx into ``y``, dscale and dbias (into
    ``bias``) when bound, from the saved mean / inv_std where bound (else recomputed from x), as the
    Triton backend does."""
    compute = problem.compute_dtype
    xs = read(x, compute)
    scales = read(scale, compute) if scale is not None else None
    if not problem.backward:
        biases = read(bias, compute) if bias is not None else None
        values, means, inv_stds = forward_reference(
            problem.mode, xs, scales, biases, problem.epsilon, problem.normalized_ndim, problem.groups
        )
        write(y, values, problem.alpha, problem.beta)
        if mean is not None:
            write(mean, means.reshape(mean.desc.dims))
        if inv_std is not None:
            write(inv_std, inv_stds.reshape(inv_std.desc.dims))
        return
    assert dy is not None
    dx, dscales, dbiases = backward_reference(
        problem.mode,
        xs,
        read(dy, compute),
        scales,
        problem.epsilon,
        problem.normalized_ndim,
        problem.groups,
        saved_mean=None if mean is None else read(mean, compute).reshape(-1),
        saved_inv_std=None if inv_std is None else read(inv_std, compute).reshape(-1),
    )
    write(y, dx, problem.alpha, problem.beta)
    if dscale is not None:
        write(dscale, dscales, problem.dparam_alpha, problem.dparam_beta)
    if bias is not None:
        write(bias, dbiases, problem.dparam_alpha, problem.dparam_beta)
