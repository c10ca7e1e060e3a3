"""The error function on NumPy arrays, for the float64 reference (GELU's erf form and the ``erf`` op).

``erf`` is ``scipy.special.erf`` when SciPy is installed, else ``cody_erf``: W. J. Cody's rational
Chebyshev approximations (Math. Comp. 23 (1969) 631-637; his CALERF routine), vectorized. Three
ranges of ``y = |x|``:

- ``y <= 0.46875``: ``erf(x) = x * P(y^2) / Q(y^2)``
- ``0.46875 < y <= 4``: ``erfc(y) = exp(-y^2) * P(y) / Q(y)``
- ``y > 4``: ``erfc(y) = exp(-y^2) / y * (1/sqrt(pi) + P(1/y^2) / (y^2 Q(1/y^2)))``

and ``erf(x) = sign(x) * (1 - erfc(y))``. ``exp(-y^2)`` is formed as ``exp(-s^2) * exp(-(y - s)(y + s))``
with ``s`` = y rounded down to a sixteenth, so that ``y^2``'s rounding error is not amplified.
Against ``math.erf`` (tests/test_libraries.py): 99% of results are within 1 ulp, the rest within
2 ulp, except for ``0.47 < |x| < 1``, where ``1 - erfc`` passes erfc's rounding on and a result is
at most 5 ulp off (4e-16 relative). NaN stays NaN, ``erf(+-inf) = +-1`` and ``erf(-0.0) = -0.0``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

_SMALL_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03)
_SMALL_A_LEAD = 1.85777706184603153e-1
_SMALL_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_MIDDLE_C = (
    5.64188496988670089e-1,
    8.88314979438837594e00,
    6.61191906371416295e01,
    2.98635138197400131e02,
    8.81952221241769090e02,
    1.71204761263407058e03,
    2.05107837782607147e03,
    1.23033935479799725e03,
)
_MIDDLE_C_LEAD = 2.15311535474403846e-8
_MIDDLE_D = (
    1.57449261107098347e01,
    1.17693950891312499e02,
    5.37181101862009858e02,
    1.62138957456669019e03,
    3.29079923573345963e03,
    4.36261909014324716e03,
    3.43936767414372164e03,
    1.23033935480374942e03,
)
_LARGE_P = (
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
)
_LARGE_P_LEAD = 1.63153871373020978e-2
_LARGE_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1, 6.05183413124413191e-2)
_LARGE_Q_LAST = 2.33520497626869185e-3
_ONE_OVER_SQRT_PI = 5.6418958354775628695e-1
_SMALL_END, _MIDDLE_END = 0.46875, 4.0
_SATURATED = 27.0  # erfc(27) < 2**-1074: erf is exactly +-1 from here on (and y*y cannot overflow)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function of every element, in ``x``'s dtype (computed in float64)."""
    return _implementation()(np.asarray(x, np.float64)).astype(np.asarray(x).dtype, copy=False)


@functools.cache
def _implementation() -> Callable[[np.ndarray], np.ndarray]:
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:
        return cody_erf
    return scipy_erf  # type: ignore[no-any-return]


def cody_erf(x: np.ndarray) -> np.ndarray:
    """The error function of a float64 array by Cody's approximations (see the module docstring)."""
    x = np.asarray(x, np.float64)
    y = np.minimum(np.abs(x), _SATURATED)  # NaN stays NaN
    result = np.full(x.shape, np.nan)
    small = y <= _SMALL_END
    result[small] = _erf_small(x[small])
    middle = (y > _SMALL_END) & (y <= _MIDDLE_END)
    result[middle] = np.copysign(1.0 - _erfc_middle(y[middle]), x[middle])
    large = y > _MIDDLE_END
    result[large] = np.copysign(1.0 - _erfc_large(y[large]), x[large])
    return result


def _erf_small(x: np.ndarray) -> np.ndarray:
    # erf(x) = x * P/Q evaluated as x + x * (P - Q)/Q: the correction is a tenth of the result, so
    # the rational's rounding errors reach the result a tenth as large
    squared = x * x
    difference, denominator = (_SMALL_A_LEAD - 1.0) * squared, squared
    for a, b in zip(_SMALL_A[:3], _SMALL_B[:3]):
        difference, denominator = (difference + (a - b)) * squared, (denominator + b) * squared
    return x + x * ((difference + (_SMALL_A[3] - _SMALL_B[3])) / (denominator + _SMALL_B[3]))


def _erfc_middle(y: np.ndarray) -> np.ndarray:
    numerator, denominator = _MIDDLE_C_LEAD * y, y
    for c, d in zip(_MIDDLE_C[:7], _MIDDLE_D[:7]):
        numerator, denominator = (numerator + c) * y, (denominator + d) * y
    return _exp_minus_squared(y) * (numerator + _MIDDLE_C[7]) / (denominator + _MIDDLE_D[7])


def _erfc_large(y: np.ndarray) -> np.ndarray:
    inverse_squared = 1.0 / (y * y)
    numerator, denominator = _LARGE_P_LEAD * inverse_squared, inverse_squared
    for p, q in zip(_LARGE_P[:4], _LARGE_Q):
        numerator, denominator = (numerator + p) * inverse_squared, (denominator + q) * inverse_squared
    ratio = inverse_squared * (numerator + _LARGE_P[4]) / (denominator + _LARGE_Q_LAST)
    return _exp_minus_squared(y) * (_ONE_OVER_SQRT_PI - ratio) / y


def _exp_minus_squared(y: np.ndarray) -> np.ndarray:
    """exp(-y^2) without the rounding error of y^2 amplified: split y at a sixteenth."""
    head = np.trunc(y * 16.0) / 16.0
    return np.exp(-head * head) * np.exp(-(y - head) * (y + head))
