"""The activations' Triton forms, which the pointwise kernel, the convolution and matrix-product
epilogues share: ``activation`` (forward) and ``activation_derivative``, by name (MODE "relu",
"clipped_relu", "elu", "gelu", "gelu_approx_tanh", "sigmoid", "tanh", "softplus", "swish",
"identity"; ``coef`` the clipped relu ceiling, elu alpha, softplus and swish beta), and
``torch_gradient``, torch's gradient of the activations whose torch formula selects (relu, clipped
relu, elu: ``Activation.torch_selects``). The float64 reference forms are
``families/pointwise/problem.py``'s.

FAST (a 16-bit output, float32 arithmetic on a GPU) takes the ``tm.*_approx`` forms where they
save instructions, accurate far beyond the output's half-ulp.

Every ``tl.minimum`` / ``tl.maximum`` on x propagates NaN (``PropagateNan.ALL``): a GPU's min.f32 and
max.f32 return the other operand, so elu's ``min(x, 0)`` would turn a NaN x into 0 there (and elu(NaN)
into 0), where Triton's interpreter, on NumPy, keeps it. elu takes ``min(x, 0)`` as a select
(``nonpositive_part``), which also gives the reference's +0 for -0 on every device.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.core import activation_constants
from opendnn.core.dtypes import DataType
from opendnn.kernels import math as tm

GELU_TANH_SCALE = tl.constexpr(activation_constants.GELU_TANH_SCALE)
GELU_TANH_CUBIC = tl.constexpr(activation_constants.GELU_TANH_CUBIC)
# the output dtypes whose activations may take the approximate forms (FAST) when the handle's fast_math allows
FAST_DTYPES = (DataType.HALF, DataType.BFLOAT16)


@triton.jit
def logistic(v, FAST: tl.constexpr):
    """1 / (1 + exp(-v)): ``tm.sigmoid_approx`` when FAST, else ``tm.sigmoid``."""
    if FAST:
        s = tm.sigmoid_approx(v)
    else:
        s = tm.sigmoid(v)
    return s


@triton.jit
def nonpositive_part(x):
    """min(x, 0) as a select: NaN stays NaN and -0 becomes +0 on every device (a GPU's min of -0 and
    +0 need not give the reference's +0)."""
    return tl.where(x >= 0, 0.0, x)


@triton.jit
def activation(MODE: tl.constexpr, x, coef, FAST: tl.constexpr = False):
    """The activation of x; FAST (a 16-bit output, float32 arithmetic on a GPU): the ``tm.*_approx``
    forms where they save instructions, accurate far beyond the output's half-ulp."""
    if MODE == "relu":
        y = tl.where(x > 0, x, 0.0)
    elif MODE == "clipped_relu":
        y = tl.where(x > 0, tl.where(x < coef, x, coef), 0.0)
    elif MODE == "elu" and FAST:
        y = tl.where(x > 0, x, coef * tm.expm1_approx(nonpositive_part(x)))
    elif MODE == "elu" and x.dtype.is_fp32():
        y = tl.where(x > 0, x, coef * tm.expm1_nonpositive(nonpositive_part(x)))
    elif MODE == "elu":
        y = tl.where(x > 0, x, coef * tm.expm1(nonpositive_part(x)))
    elif MODE == "gelu" and FAST:
        y = x * tm.normal_cdf_approx(x)
    elif MODE == "gelu":
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif MODE == "gelu_approx_tanh":  # (1 + tanh(u)) / 2 = sigmoid(2u): no cancellation for x < 0
        y = x * logistic((x + GELU_TANH_CUBIC * x * x * x) * (2.0 * GELU_TANH_SCALE), FAST)
    elif MODE == "sigmoid":
        y = logistic(x, FAST)
    elif MODE == "tanh" and FAST:
        y = tm.tanh_approx(x)
    elif MODE == "tanh":
        y = tm.tanh(x)
    elif MODE == "softplus" and FAST:
        bx = coef * x
        y = (
            tl.maximum(bx, 0.0, propagate_nan=tl.PropagateNan.ALL)
            + tm.log1p_approx(tm.exp2_approx(-tl.abs(bx) * tm.LOG2E))
        ) * (1.0 / coef)
    elif MODE == "softplus":  # log(1 + exp(coef * x)) / coef, without overflow; times 1 / coef, not a division
        bx = coef * x  # per element (exact for coef = 1, 1 ulp otherwise)
        y = (tl.maximum(bx, 0.0, propagate_nan=tl.PropagateNan.ALL) + tm.log1p(tl.exp(-tl.abs(bx)))) * (1.0 / coef)
    elif MODE == "swish":
        y = x * logistic(coef * x, FAST)
    else:
        tl.static_assert(MODE == "identity", "unknown activation")
        y = x
    return y


@triton.jit
def activation_derivative(MODE: tl.constexpr, x, coef, FAST: tl.constexpr = False):
    """The activation's derivative at x; FAST as in ``activation``."""
    if MODE == "relu":
        d = tl.where(x > 0, 1.0, 0.0)
    elif MODE == "clipped_relu":
        d = tl.where((x > 0) & (x < coef), 1.0, 0.0)
    elif MODE == "elu":
        d = tl.where(x > 0, 1.0, coef * tl.exp(tl.minimum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)))
    elif MODE == "gelu" and FAST:
        d = tm.normal_cdf_approx(x) + x * tm.exp2_approx(x * x * (-0.5 * tm.LOG2E)) * 0.3989422804014327
    elif MODE == "gelu":
        d = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
    elif MODE == "gelu_approx_tanh":  # with s = (1 + t) / 2 = sigmoid(2u): 1 - t^2 = 4 s (1 - s)
        s = logistic((x + GELU_TANH_CUBIC * x * x * x) * (2.0 * GELU_TANH_SCALE), FAST)
        d = s + 2.0 * x * s * (1.0 - s) * GELU_TANH_SCALE * (1.0 + 3.0 * GELU_TANH_CUBIC * x * x)
    elif MODE == "sigmoid":
        s = logistic(x, FAST)
        d = s * (1.0 - s)
    elif MODE == "tanh" and FAST:  # sech(x)^2 = 4u / (1 + u)^2, u = exp(-2|x|): no 1 - t^2 cancellation
        u = tm.exp2_approx(tl.abs(x) * (-2.0 * tm.LOG2E))
        r = tm.reciprocal_approx(1.0 + u)
        d = 4.0 * u * r * r
    elif MODE == "tanh":
        t = tm.tanh(x)
        d = 1.0 - t * t
    elif MODE == "softplus":
        d = logistic(coef * x, FAST)
    elif MODE == "swish":
        s = logistic(coef * x, FAST)
        d = s + coef * x * s * (1.0 - s)
    else:
        tl.static_assert(MODE == "identity", "unknown activation")
        d = tl.where(x == x, 1.0, 1.0)  # 1 at NaN and inf too (x * 0 + 1 is NaN there)
    return d


@triton.jit
def torch_gradient(MODE: tl.constexpr, dy, x, coef):
    """torch's gradient of relu (threshold_backward), clipped relu (hardtanh_backward from 0) and elu:
    0 (relu, clipped relu) or dy * coef * exp(x) (elu) where x <= 0 or x >= coef, else dy. A
    selection, not dy * f'(x): a NaN x fails the tests and passes dy, and a NaN or infinite dy gives
    0 where relu and clipped relu are flat."""
    if MODE == "relu":
        g = tl.where(x <= 0.0, 0.0, dy)
    elif MODE == "clipped_relu":
        g = tl.where((x <= 0.0) | (x >= coef), 0.0, dy)
    else:
        tl.static_assert(MODE == "elu", "torch's gradient selects for relu, clipped_relu and elu")
        g = tl.where(x <= 0.0, dy * coef * tl.exp(tl.minimum(x, 0.0)), dy)
    return g
