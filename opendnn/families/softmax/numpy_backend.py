"""Softmax on the NumPy backend: the reference's formulas in the compute dtype (float32, float64 for
float64), computed straight into the output's memory where it may be (``output_array``), else into
one new array that ``write`` blends. The inputs are read where they lie (no copy of an input that
already holds the compute dtype); each step is one whole-array operation writing the output:

    forward   out = x - max(x); out = exp(out); out /= sum(out)             (LOG: out -= log(sum(exp(out))))
    backward  out = dy - sum(dy * y); out *= y                              (LOG: out = dy - exp(y) * sum(dy))

(the sums einsum passes, the backward's ``sum(dy * y)`` one over dy and y with no product array).
Where no exp of x overflows and no sum of exps comes near the subnormals, the forward skips the max
(``forward_unshifted``: out = exp(x); out /= sum(out)).
"""

from __future__ import annotations

import functools
import math
import string

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.reference_io import output_array, read, write
from opendnn.families.softmax.problem import SoftmaxAlgorithm, SoftmaxProblem


def supports(problem: SoftmaxProblem) -> str | None:
    return None


def run(problem: SoftmaxProblem, inputs: list[Bound], output: Bound) -> None:
    compute = problem.compute_dtype
    values = [read(bound, compute) for bound in inputs]
    target = output_array(output, compute, problem.alpha, problem.beta, *values)
    out = np.empty(values[0].shape, compute.to_numpy()) if target is None else target
    if problem.backward or not forward_unshifted(problem.algo, values[0], problem.axes, out):
        with np.errstate(all="ignore"):  # overflow, inf - inf and 0/0 give the IEEE results on purpose
            if problem.backward:
                backward(problem.algo, values[0], values[1], problem.axes, out)
            else:
                forward(problem.algo, values[0], problem.axes, out)
    if target is None:
        write(output, out, problem.alpha, problem.beta)


def forward(algo: SoftmaxAlgorithm, x: np.ndarray, axes: tuple[int, ...], out: np.ndarray) -> None:
    """``reference_forward`` of x into out."""
    if algo is SoftmaxAlgorithm.FAST:
        np.exp(x, out=out)
    else:
        np.subtract(x, np.maximum.reduce(x, axis=axes, keepdims=True), out=out)
        if algo is SoftmaxAlgorithm.LOG:
            out -= np.log(np.exp(out).sum(axis=axes, keepdims=True))
            return
        np.exp(out, out=out)
    out /= _sum(axes, out)


def forward_unshifted(algo: SoftmaxAlgorithm, x: np.ndarray, axes: tuple[int, ...], out: np.ndarray) -> bool:
    """``exp(x) / sum(exp(x))`` into out, the max not subtracted, where that is the reference's value to
    rounding: x's largest element leaves every sum of exps finite (NaN and inf fail the test) and
    every sum is past the subnormals by a factor 1 / eps, so that an exp rounded as a subnormal
    errs by less than the sum's own rounding. Two passes fewer than ``forward`` (the max along the
    axes and the subtraction of a per-row value, a broadcast pass), and no floating-point error to
    silence. Returns False, out left unspecified, where the test fails (then ``forward`` runs)."""
    if algo is not SoftmaxAlgorithm.ACCURATE or x.size == 0:
        return False
    largest, smallest_sum = _unshifted_limits(x.dtype, x.shape, axes)
    if not np.maximum.reduce(x, axis=None) < largest:
        return False
    np.exp(x, out=out)
    total = _sum(axes, out)
    if not np.minimum.reduce(total, axis=None) >= smallest_sum:
        return False
    out /= total
    return True


@functools.lru_cache(maxsize=256)  # per dtype, shape and axes: asked on every call
def _unshifted_limits(dtype: np.dtype, shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[float, float]:
    """``forward_unshifted``'s bounds for x of ``shape`` whose rows run along ``axes``: x below the
    first (so that a row's exps sum to less than the dtype's largest value), the sums of exps at
    least the second."""
    info = np.finfo(dtype)
    length = math.prod(shape[a] for a in axes)
    return float(np.log(info.max)) - math.log(length), float(info.tiny / info.eps)


def backward(algo: SoftmaxAlgorithm, y: np.ndarray, dy: np.ndarray, axes: tuple[int, ...], out: np.ndarray) -> None:
    """``reference_backward`` of y and dy into out."""
    if algo is SoftmaxAlgorithm.LOG:  # dy - exp(y) * sum(dy)
        total = dy.sum(axis=axes, keepdims=True)
        np.exp(y, out=out)
        out *= total
        np.subtract(dy, out, out=out)
        return
    np.subtract(dy, _sum(axes, dy, y), out=out)
    out *= y


def _sum(axes: tuple[int, ...], *factors: np.ndarray) -> np.ndarray:
    """sum(product of ``factors``) over ``axes``, kept as dims of 1: one einsum pass over the factors,
    no product array (einsum's vectorised sum also runs faster than ``ndarray.sum`` on short rows)."""
    subscripts, kept = _summation(factors[0].shape, axes, len(factors))
    return np.einsum(subscripts, *factors).reshape(kept)


@functools.lru_cache(maxsize=256)  # per shape: building the subscripts costs as much as a short row's sum
def _summation(shape: tuple[int, ...], axes: tuple[int, ...], count: int) -> tuple[str, tuple[int, ...]]:
    """einsum's subscripts summing ``count`` factors of ``shape`` over ``axes``, and the kept shape."""
    dims = string.ascii_letters[: len(shape)]
    kept = "".join(d for k, d in enumerate(dims) if k not in axes)
    return ",".join([dims] * count) + "->" + kept, tuple(1 if k in axes else n for k, n in enumerate(shape))
