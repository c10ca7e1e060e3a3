"""Local response normalization (cross-channel LRN) and divisive normalization (LCN): one
operation, its rules and its float64 NumPy references.

The LRN descriptor (cudnnSetLRNDescriptor) holds ``n`` (window width, 1..16), ``alpha`` (variance
scale), ``beta`` (power, >= 0.01) and ``k`` (>= 1e-5); defaults 5, 1e-4, 0.75, 2.0. The window
around index i spans ``i - lookbehind .. i + lookahead`` with lookbehind = floor((n-1)/2) and
lookahead = n - 1 - lookbehind (n = 10: i-4 .. i+5); indices past the edges count as 0.

Cross-channel LRN (LRNMode.CROSS_CHANNEL_DIM1), x of dims (N, C, spatial...)::

    s[c] = k + alpha / n * sum_{j = c - lookbehind}^{c + lookahead} x[j]^2
    y[c] = x[c] * s[c]^(-beta)

    dx[c] = dy[c] * s[c]^(-beta)
            - 2 * beta * alpha / n * x[c] * sum_{j = c - lookahead}^{c + lookbehind} dy[j] * x[j] * s[j]^(-beta-1)

(the backward sum runs over the channels j whose window contains c: the mirrored window).

Divisive normalization (cudnnDivisiveNormalizationForward, DivNormMode.PRECOMPUTED_MEANS), x of
dims (N, C, H, W) or (N, C, D, H, W), ``means`` of x's dims or absent (zeros). cuDNN documents
that it computes the divisive part (``x / sigma``) of Jarrett et al.'s local contrast
normalization, the subtractive part being the caller's ``means``; and, for cudnnSetLRNDescriptor,
that "for DivisiveNormalization layer the window has the same extents as above in all 'spatial'
dimensions" and that alpha "is divided by the window width for LRN and by (window
width)^#spatialDimensions for DivisiveNormalization". It does not print the formula; opendnn
takes LRN's with the window moved from channels to the spatial dims. With d = x - means and W(p)
the n x n (x n) box window around the spatial position p (lookbehind/lookahead per dim as above,
no Gaussian weights, positions past the edges count as 0)::

    s[p] = k + alpha / n^S * sum_{q in W(p)} d[q]^2          (S = 2 or 3 spatial dims)
    y[p] = d[p] * s[p]^(-beta)

    dd[p] = dy[p] * s[p]^(-beta) - 2 * beta * alpha / n^S * d[p] * sum_{q in W'(p)} dy[q] * d[q] * s[q]^(-beta-1)
    dx = dd,  dmeans = -dd

W' is the mirrored window. Each channel and sample is normalized on its own. ``temp`` and
``temp2`` are x-shaped scratch tensors of x's dtype (cuDNN's), used by backends that need them.
Arithmetic runs in float32, float64 for float64 data. Blending: ``out = alpha * result + beta * out``.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import TensorDescriptor, check_finite, check_float_tensor, check_int, check_same_dims
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status, require

LRN_MIN_N, LRN_MAX_N = 1, 16
LRN_MIN_BETA = 0.01
LRN_MIN_K = 1e-5


class LRNMode(enum.Enum):
    """cuDNN's LRN mode: the window runs along dim 1 (channels)."""

    CROSS_CHANNEL_DIM1 = 0


class DivNormMode(enum.Enum):
    """cuDNN's divisive normalization mode: the caller passes the means (or none, meaning zeros)."""

    PRECOMPUTED_MEANS = 0


@dataclass(frozen=True)
class LRNDescriptor:
    """LRN and divisive normalization parameters, with cuDNN's limits and defaults.

    Raises:
        BadParam: n outside 1..16, beta below 0.01, k below 1e-5, a non-finite value.
    """

    n: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 2.0

    def __post_init__(self) -> None:
        n = check_int("n", self.n)
        require(LRN_MIN_N <= n <= LRN_MAX_N, f"n={self.n} must be an integer from {LRN_MIN_N} to {LRN_MAX_N}")
        object.__setattr__(self, "n", n)
        for name in ("alpha", "beta", "k"):
            object.__setattr__(self, name, check_finite(name, getattr(self, name)))
        require(self.beta >= LRN_MIN_BETA, f"beta={self.beta} must be at least {LRN_MIN_BETA}")
        require(self.k >= LRN_MIN_K, f"k={self.k} must be at least {LRN_MIN_K}")

    @property
    def lookbehind(self) -> int:
        return (self.n - 1) // 2

    @property
    def lookahead(self) -> int:
        return self.n - 1 - self.lookbehind


@dataclass(frozen=True)
class LRNProblem:
    """A validated LRN or divisive normalization call.

    ``divisive`` picks LCN over cross-channel LRN; ``backward`` picks the gradient. ``x`` describes
    x (and means, dy, temp and temp2, which share its dims); ``y`` the output (y, or dx and dmeans).
    """

    desc: LRNDescriptor
    divisive: bool
    backward: bool
    x: TensorDescriptor
    y: TensorDescriptor
    alpha: float = 1.0
    beta: float = 0.0
    has_means: bool = False
    compute_dtype: DataType = DataType.FLOAT

    @property
    def scale(self) -> float:
        """alpha / n for LRN, alpha / n^S for divisive normalization (S spatial dims)."""
        spatial = self.x.ndim - 2 if self.divisive else 1
        return self.desc.alpha / self.desc.n**spatial


def lrn_problem(
    lrn_desc: LRNDescriptor,
    mode: LRNMode | DivNormMode,
    x_desc: TensorDescriptor,
    y_desc: TensorDescriptor,
    *,
    backward: bool = False,
    others: dict[str, TensorDescriptor] | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    has_means: bool = False,
) -> LRNProblem:
    """The rules of LRN (``mode`` an LRNMode) and divisive normalization (a DivNormMode).

    Args:
        others: further tensors that must share x's dims and dtype, by parameter name (dy, means...).

    Raises:
        BadParam: a wrong descriptor or mode, x with fewer than 3 dims (LRN) or not 4 or 5 dims
            (divisive), tensors of other dims or dtypes than x's, a non-float dtype, non-finite
            alpha or beta.
    """
    if not isinstance(lrn_desc, LRNDescriptor):
        raise BadParam(f"norm_desc={lrn_desc!r} must be an LRNDescriptor")
    divisive = isinstance(mode, DivNormMode)
    if not isinstance(mode, (LRNMode, DivNormMode)):
        raise BadParam(f"mode={mode!r} must be an LRNMode or a DivNormMode")
    for name, desc in {"x_desc": x_desc, "y_desc": y_desc, **(others or {})}.items():
        check_float_tensor(name, desc)
        if desc is not x_desc:
            check_same_dims(name, desc, "x_desc", x_desc)
        if name != "y_desc":
            require(
                desc.dtype is x_desc.dtype,
                f"{name}.dtype={desc.dtype.name} must equal x_desc.dtype={x_desc.dtype.name}",
                Status.BAD_PARAM,
            )
    if divisive:
        require(x_desc.ndim in (4, 5), f"x_desc.ndim={x_desc.ndim} must be 4 or 5 for divisive normalization")
    else:
        require(x_desc.ndim >= 3, f"x_desc.ndim={x_desc.ndim} must be at least 3 (N, C, spatial...) for LRN")
    return LRNProblem(
        lrn_desc,
        divisive,
        backward,
        x_desc,
        y_desc,
        check_finite("alpha", alpha),
        check_finite("beta", beta),
        has_means,
        x_desc.dtype.compute_type,
    )


# the float64 references --------------------------------------------------------------------------


def window_sum(values: np.ndarray, axes: tuple[int, ...], behind: int, ahead: int) -> np.ndarray:
    """out[i] = sum of values[i - behind .. i + ahead] along each of ``axes`` (a box), zero past the
    edges; shifted additions, so no cumulative-sum cancellation."""
    out = values
    for axis in axes:
        size = out.shape[axis]
        pad = [(0, 0)] * values.ndim
        pad[axis] = (behind, ahead)
        padded = np.pad(out, pad)
        out = functools.reduce(
            np.add, (np.take(padded, range(j, j + size), axis=axis) for j in range(behind + ahead + 1))
        )
    return out


def normalize_reference(x: np.ndarray, desc: LRNDescriptor, axes: tuple[int, ...], scale: float) -> np.ndarray:
    """y = x * (k + scale * windowed sum of x^2)^(-beta), the window along ``axes``."""
    s = desc.k + scale * window_sum(x * x, axes, desc.lookbehind, desc.lookahead)
    return x * s**-desc.beta


def normalize_backward_reference(
    x: np.ndarray, dy: np.ndarray, desc: LRNDescriptor, axes: tuple[int, ...], scale: float
) -> np.ndarray:
    """The gradient of ``normalize_reference`` with respect to x."""
    s = desc.k + scale * window_sum(x * x, axes, desc.lookbehind, desc.lookahead)
    carried = dy * x * s ** (-desc.beta - 1)
    mirrored = window_sum(carried, axes, desc.lookahead, desc.lookbehind)
    return dy * s**-desc.beta - 2 * desc.beta * scale * x * mirrored


def lrn_reference(x: np.ndarray, desc: LRNDescriptor) -> np.ndarray:
    """Cross-channel LRN forward of x (N, C, spatial...)."""
    return normalize_reference(x, desc, (1,), desc.alpha / desc.n)


def lrn_backward_reference(x: np.ndarray, dy: np.ndarray, desc: LRNDescriptor) -> np.ndarray:
    """Cross-channel LRN backward: dx."""
    return normalize_backward_reference(x, dy, desc, (1,), desc.alpha / desc.n)


def divisive_reference(x: np.ndarray, means: np.ndarray | None, desc: LRNDescriptor) -> np.ndarray:
    """Divisive normalization forward of x (N, C, H, W) or (N, C, D, H, W)."""
    d = x if means is None else x - means
    spatial = tuple(range(2, x.ndim))
    return normalize_reference(d, desc, spatial, desc.alpha / desc.n ** len(spatial))


def divisive_backward_reference(
    x: np.ndarray, means: np.ndarray | None, dy: np.ndarray, desc: LRNDescriptor
) -> tuple[np.ndarray, np.ndarray]:
    """Divisive normalization backward: (dx, dmeans)."""
    d = x if means is None else x - means
    spatial = tuple(range(2, x.ndim))
    dd = normalize_backward_reference(d, dy, desc, spatial, desc.alpha / desc.n ** len(spatial))
    return dd, -dd
