"""Elementary functions built from ``tl.math`` only, so they run in Triton's interpreter too
(which lacks libdevice). Each keeps full relative accuracy near zero, where the naive formula
cancels: expm1 and log1p by Kahan's trick, tanh through expm1."""

import triton
import triton.language as tl

NAN = tl.constexpr(float("nan"))


@triton.jit
def expm1(x):
    """exp(x) - 1: exact where exp(x) rounds to 1, Kahan's correction elsewhere."""
    u = tl.exp(x)
    near_one = (u == 1.0) | (u - 1.0 == -1.0)
    safe_log = tl.where(near_one, 1.0, tl.log(u))
    return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, (u - 1.0) * x / safe_log))


@triton.jit
def log1p(x):
    """log(1 + x) with Kahan's correction for the rounding of 1 + x."""
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * x / tl.where(d == 0.0, 1.0, d))


@triton.jit
def tanh(x):
    e = expm1(-2.0 * tl.abs(x))
    t = -e / (2.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def pow(a, b):
    """a ** b as C's pow: negative bases only with integer exponents (sign from the parity)."""
    magnitude = tl.exp(b * tl.log(tl.abs(a)))
    is_integer = tl.floor(b) == b
    is_odd = is_integer & (tl.abs(b % 2.0) == 1.0)
    signed = tl.where(is_odd, -magnitude, magnitude)
    result = tl.where(a >= 0, magnitude, tl.where(is_integer, signed, NAN))
    return tl.where(b == 0, 1.0, result)
