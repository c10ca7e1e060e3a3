"""Softmax (cuDNN's softmax_forward / softmax_backward): one operation, its rules and its NumPy
reference.

Over each "row", the set ``S`` of elements reduced together:

    FAST:      y = exp(x) / sum_S(exp(x))                  (no max subtraction: overflows past ~88 in float32)
    ACCURATE:  y = exp(x - m) / sum_S(exp(x - m)),  m = max_S(x)
    LOG:       y = (x - m) - log(sum_S(exp(x - m)))

Backward, from the forward output y and its gradient dy:

    FAST, ACCURATE:  dx = y * (dy - sum_S(dy * y))
    LOG:             dx = dy - exp(y) * sum_S(dy)

``SoftmaxMode.INSTANCE`` reduces over every dim but the first (C, H, W for each N);
``SoftmaxMode.CHANNEL`` over the second only (C for each N, H, W). The Pythonic API reduces over any
one dim. IEEE arithmetic decides the special rows: a NaN makes its whole row NaN, and so does a row
of -inf (ACCURATE and LOG: -inf - -inf) or a +inf. Results blend as ``out = alpha * result + beta *
out`` (out unread when beta == 0). Arithmetic runs in float32, or float64 when any tensor is float64.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import TensorDescriptor, check_finite, check_float_tensor, check_member
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status, require


class SoftmaxAlgorithm(enum.Enum):
    """cuDNN's softmax algorithms; the value is the name the kernels switch on."""

    FAST = "fast"
    ACCURATE = "accurate"
    LOG = "log"


class SoftmaxMode(enum.Enum):
    """Which dims form a row: INSTANCE every dim but N, CHANNEL the C dim only."""

    INSTANCE = "instance"
    CHANNEL = "channel"


def mode_axes(mode: SoftmaxMode, ndim: int) -> tuple[int, ...]:
    """The dims a mode reduces over, for a tensor of ``ndim`` dims (N, C, spatial...)."""
    return tuple(range(1, ndim)) if SoftmaxMode(mode) is SoftmaxMode.INSTANCE else (1,)


@dataclass(frozen=True)
class SoftmaxProblem:
    """A validated softmax, forward or backward: descriptors and parameters, no memory.

    ``tensors`` are the operands, output last: (x, y) forward, (y, dy, dx) backward. ``axes`` are
    the dims reduced together into one row.
    """

    algo: SoftmaxAlgorithm
    axes: tuple[int, ...]
    tensors: tuple[TensorDescriptor, ...]
    backward: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    compute_dtype: DataType = DataType.FLOAT


def softmax_problem(
    algo: SoftmaxAlgorithm,
    axes: Sequence[int],
    names: Sequence[str],
    descs: Sequence[TensorDescriptor],
    *,
    backward: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> SoftmaxProblem:
    """The shape and dtype rules shared by every softmax call.

    Args:
        axes: the dims reduced into one row (any non-empty set of distinct dims).
        names: the descriptors' parameter names, for the error messages ("x_desc", ...).
        descs: the operands, output last.

    Raises:
        BadParam: an algorithm that is not a SoftmaxAlgorithm, dims that differ between the
            operands, a non-float dtype, an axis out of range, non-finite alpha or beta.
    """
    algo = check_member("algo", SoftmaxAlgorithm, algo)
    for name, desc in zip(names, descs):
        check_float_tensor(name, desc)
    first, dims = names[0], descs[0].dims
    for name, desc in zip(names[1:], descs[1:]):
        if desc.dims != dims:
            raise BadParam(
                f"{name}.dims={list(desc.dims)} must equal {first}.dims={list(dims)}", Status.BAD_PARAM_SHAPE_MISMATCH
            )
    axes = tuple(sorted({int(k) for k in axes}))
    require(
        len(axes) > 0 and all(0 <= k < len(dims) for k in axes),
        f"axes={list(axes)} must be dims of {first} (0 to {len(dims) - 1})",
    )
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    compute = DataType.DOUBLE if any(desc.dtype is DataType.DOUBLE for desc in descs) else DataType.FLOAT
    return SoftmaxProblem(algo, axes, tuple(descs), backward, alpha, beta, compute)


def mode_problem(
    algo: SoftmaxAlgorithm,
    mode: SoftmaxMode,
    names: Sequence[str],
    descs: Sequence[TensorDescriptor],
    *,
    backward: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> SoftmaxProblem:
    """``softmax_problem`` for a cuDNN mode: the tensors must have at least N and C dims.

    Raises:
        BadParam: a mode that is not a SoftmaxMode, fewer than 2 dims, or a rule of ``softmax_problem``.
    """
    mode = check_member("mode", SoftmaxMode, mode)
    ndim = descs[0].ndim if isinstance(descs[0], TensorDescriptor) else 2  # softmax_problem refuses the rest
    require(ndim >= 2, f"{names[0]}.ndim={ndim} must be at least 2 (N, C, spatial...) for mode {mode.name}")
    return softmax_problem(algo, mode_axes(mode, ndim), names, descs, backward=backward, alpha=alpha, beta=beta)


def reference_forward(algo: SoftmaxAlgorithm, x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """The forward definition, computed in ``x``'s float dtype."""
    algo = SoftmaxAlgorithm(algo)
    axes = tuple(axes)
    with np.errstate(all="ignore"):  # overflow, inf - inf and 0/0 give the IEEE results on purpose
        z = x if algo is SoftmaxAlgorithm.FAST else x - x.max(axis=axes, keepdims=True)
        e = np.exp(z)
        total = e.sum(axis=axes, keepdims=True)
        return z - np.log(total) if algo is SoftmaxAlgorithm.LOG else e / total


def reference_backward(algo: SoftmaxAlgorithm, y: np.ndarray, dy: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """The backward definition (dx from y and dy), computed in the inputs' float dtype."""
    axes = tuple(axes)
    with np.errstate(all="ignore"):
        if SoftmaxAlgorithm(algo) is SoftmaxAlgorithm.LOG:
            return dy - np.exp(y) * dy.sum(axis=axes, keepdims=True)
        return y * (dy - (dy * y).sum(axis=axes, keepdims=True))
