"""Elementary functions. The exact ones are built from ``tl.math`` only, so they run in Triton's
interpreter too (which lacks libdevice); each keeps full relative accuracy near zero, where the
naive formula cancels: expm1 and log1p by Kahan's trick, tanh by a polynomial there.

The ``*_approx`` functions are for float32 arithmetic whose result is stored in 16 bits (bfloat16's
half-ulp is 2^-9 relative): built on the GPU's approximate instructions (ex2, lg2, rcp, tanh
.approx: one MUFU each, no interpreter support, so callers gate them on a FAST constexpr set only
on a GPU), each keeps its relative error below 2^-11 over the whole range, tails included."""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
INVERSE_FACTORIALS = tl.constexpr(
    (
        1.0,
        0.5,
        0.16666666666666666,
        0.041666666666666664,
        0.008333333333333333,
        0.001388888888888889,
        0.0001984126984126984,
        2.48015873015873e-05,
        2.7557319223985893e-06,
    )
)  # 1/1! .. 1/9!
# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2) (Numerical Recipes' erfcc form), P of degree 5
# fitted here on z in [0, 10] (beyond, erfc underflows float32): relative error 7.6e-6. Stored as
# log2(e) P(t) - 1, so that erfc(z) / 2 = t 2^(that - log2(e) z^2): no multiplies by log2(e) or 1/2.
ERFC_EXP2_COEFFICIENTS = tl.constexpr(
    (
        0.3300782320682044,
        -1.023157283916383,
        0.6845620122809761,
        0.3670768612210411,
        1.4686848237246601,
        -2.8272336591092224,
    )
)


@triton.jit
def expm1(x):
    """exp(x) - 1: exact where exp(x) rounds to 1, Kahan's correction elsewhere."""
    u = tl.exp(x)
    near_one = (u == 1.0) | (u - 1.0 == -1.0)
    safe_log = tl.where(near_one, 1.0, tl.log(u))
    return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, (u - 1.0) * x / safe_log))


@triton.jit
def expm1_nonpositive(x):
    """exp(x) - 1 for float32 x <= 0 (ELU's branch) to about 3 ulp, a third of ``expm1``'s
    instructions: Taylor to x^10 above -1 (truncation 2.5e-8), else exp - 1 (no cancellation there:
    the result is below -0.63)."""
    taylor = x * 0.0 + 2.755731922398589e-07
    for k in tl.static_range(9, 0, -1):
        taylor = taylor * x + INVERSE_FACTORIALS[k - 1]
    return tl.where(x > -1.0, taylor * x, tl.exp(x) - 1.0)


@triton.jit
def log1p(x):
    """log(1 + x) with Kahan's correction for the rounding of 1 + x."""
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.log(u) * x / tl.where(d == 0.0, 1.0, d))


@triton.jit
def tanh(x):
    """tanh to about 1 ulp. In float32: an odd polynomial below |x| = 0.625 (fitted for relative
    error, max 8e-8), else 1 - 2 / (exp(2|x|) + 1): one exp and one division, where the expm1 form
    costs an exp, a log and three divisions (0.75x of torch in float32, 0.46x in bfloat16).
    float64 keeps the expm1 form, accurate to its last bits."""
    ax = tl.abs(x)
    if x.dtype.is_fp64():
        e = expm1(-2.0 * ax)
        t = -e / (2.0 + e)
    else:
        x2 = x * x  # tanh(x) = x + x^3 * P(x^2), P's coefficients fitted on [0, 0.625]
        polynomial = 0.02062647484380182 - x2 * 0.005692164951657219
        polynomial = polynomial * x2 - 0.05373538407985852
        polynomial = polynomial * x2 + 0.13331382291522104
        polynomial = polynomial * x2 - 0.33333279252158543
        t = tl.where(ax < 0.625, ax + ax * x2 * polynomial, 1.0 - 2.0 / (tl.exp(2.0 * ax) + 1.0))
    return tl.where(x < 0, -t, tl.where(x > 0, t, x))  # x itself at +-0 (tanh(-0) = -0) and NaN


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def tan(x):
    return tl.sin(x) / tl.cos(x)


@triton.jit
def maximum(a, b):
    """IEEE 754's maximum: NaN where either operand is NaN, +0 above -0 (a GPU's max and NumPy's
    maximum each pick one of two zeros their own way)."""
    both_zero = tl.abs(a) + tl.abs(b) == 0
    return tl.where(both_zero, a + b, tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def minimum(a, b):
    """IEEE 754's minimum: NaN where either operand is NaN, -0 below +0."""
    both_zero = tl.abs(a) + tl.abs(b) == 0
    return tl.where(both_zero, (a * -1 + b * -1) * -1, tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL))


@triton.jit
def fmod(a, b):
    """C's fmod: the remainder of a / b with a's sign (a zero remainder too), a itself for a finite a
    over an infinite b, NaN for an infinite a or a zero b (a GPU's remainder gives NaN over an
    infinite b and +0 for a -0 remainder)."""
    remainder = a % b
    remainder = tl.where(remainder == 0, a * 0, remainder)
    return tl.where(tl.abs(b) == float("inf"), tl.where(tl.abs(a) < float("inf"), a, float("nan")), remainder)


@triton.jit
def pow(a, b):
    """a ** b as C's pow: a base with its sign bit set (-0 and -inf too) gives a result of its sign
    for an odd integer exponent; a finite negative base with a fractional exponent gives NaN; 1 for
    b = 0, for a = 1 and for a = -1 with an infinite exponent, whatever the other operand.

    The conditions on a and those on b combine through nested selects, never & or |: either operand
    may be a scalar, whose comparison Triton's interpreter cannot combine bitwise with a block's."""
    magnitude = tl.exp(b * tl.log(tl.abs(a)))
    is_integer = tl.floor(b) == b
    is_odd = is_integer & (tl.abs(b % 2.0) == 1.0)
    sign_bit = (a < 0) | ((a == 0) & (1.0 / a < 0))
    signed = tl.where(sign_bit, magnitude * -1.0, magnitude)  # not -magnitude: 0 - (+0) is +0
    result = tl.where(is_odd, signed, magnitude)
    finite_negative = (a < 0) & (a > float("-inf"))
    result = tl.where(is_integer, result, tl.where(finite_negative, float("nan"), result))
    result = tl.where(a == -1.0, tl.where(tl.abs(b) == float("inf"), 1.0, result), result)
    return tl.where(b == 0, 1.0, tl.where(a == 1.0, 1.0, result))


@triton.jit
def _unary_asm(x, INSTRUCTION: tl.constexpr):
    return tl.inline_asm_elementwise(INSTRUCTION, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def exp2_approx(x):
    """2^x (ex2.approx.ftz: relative error 2^-22)."""
    return _unary_asm(x, "ex2.approx.ftz.f32 $0, $1;")


@triton.jit
def log2_approx(x):
    """log2(x) (lg2.approx.ftz: absolute error 2^-22 near 1, relative 2^-22 elsewhere)."""
    return _unary_asm(x, "lg2.approx.ftz.f32 $0, $1;")


@triton.jit
def reciprocal_approx(x):
    """1 / x (rcp.approx.ftz: relative error 2^-23)."""
    return _unary_asm(x, "rcp.approx.ftz.f32 $0, $1;")


@triton.jit
def tanh_approx(x):
    """tanh(x) (tanh.approx: relative error 2^-11, sm_75 and later)."""
    return _unary_asm(x, "tanh.approx.f32 $0, $1;")


@triton.jit
def expm1_approx(x):
    """exp(x) - 1: Taylor to x^4 below |x| = 1/16 (relative error 1.3e-7), else ex2 - 1 (the
    result exceeds 0.06 in size there, so ex2's error stays below 1e-5 relative)."""
    taylor = x + x * x * (0.5 + x * (0.16666666666666666 + x * 0.041666666666666664))
    return tl.where(tl.abs(x) < 0.0625, taylor, exp2_approx(x * LOG2E) - 1.0)


@triton.jit
def log1p_approx(x):
    """log(1 + x) for x >= 0: Taylor to x^5 below 1/16 (relative error 1.6e-7), else lg2.approx."""
    taylor = x * (1.0 - x * (0.5 - x * (0.3333333333333333 - x * (0.25 - x * 0.2))))
    logarithm = log2_approx(1.0 + x) * LN2
    return tl.where(x < 0.0625, taylor, logarithm)


@triton.jit
def sigmoid_approx(x):
    """1 / (1 + exp(-x)): exact limits 0 and 1, relative error about 2^-21."""
    return reciprocal_approx(1.0 + exp2_approx(-x * LOG2E))


@triton.jit
def normal_cdf_approx(x):
    """Phi(x) = erfc(-x / sqrt 2) / 2, with relative accuracy in the lower tail (ERFC_EXP2_COEFFICIENTS)."""
    t = reciprocal_approx(1.0 + tl.abs(x) * 0.35355339059327373)  # z / 2 = |x| / (2 sqrt 2)
    polynomial = t * 0.0 + ERFC_EXP2_COEFFICIENTS[0]
    for k in tl.static_range(1, 6):
        polynomial = polynomial * t + ERFC_EXP2_COEFFICIENTS[k]
    half_erfc = t * exp2_approx(polynomial - x * x * (0.5 * LOG2E))
    return tl.where(x < 0, half_erfc, 1.0 - half_erfc)
