"""The NumPy reference against independent oracles in float64: torch on the CPU, closed forms,
and finite differences for every backward mode."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from opendnn.families.pointwise.problem import PointwiseMode, reference

RNG = np.random.default_rng(7)
X = RNG.uniform(-4, 4, 257)
Y = RNG.uniform(0.5, 3, 257)
COEF = 1.375
T = torch.from_numpy

ACTIVATION_ORACLES = {
    "relu": lambda x: torch.relu(x),
    "clipped_relu": lambda x: F.hardtanh(x, 0.0, COEF),
    "elu": lambda x: F.elu(x, COEF),
    "gelu": lambda x: F.gelu(x),
    "gelu_approx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softplus": lambda x: F.softplus(x, beta=COEF, threshold=1e9),
    "swish": lambda x: x * torch.sigmoid(COEF * x),
}
BINARY_ORACLES = {
    "ADD": torch.add,
    "SUB": torch.sub,
    "MUL": torch.mul,
    "DIV": torch.div,
    "MAX": torch.maximum,
    "MIN": torch.minimum,
    "MOD": torch.fmod,
    "POW": torch.pow,
    "ADD_SQUARE": lambda a, b: a + b * b,
    "CMP_EQ": torch.eq,
    "CMP_NEQ": torch.ne,
    "CMP_GT": torch.gt,
    "CMP_GE": torch.ge,
    "CMP_LT": torch.lt,
    "CMP_LE": torch.le,
    "LOGICAL_AND": torch.logical_and,
    "LOGICAL_OR": torch.logical_or,
}
UNARY_ORACLES = {
    "ABS": torch.abs,
    "CEIL": torch.ceil,
    "FLOOR": torch.floor,
    "COS": torch.cos,
    "SIN": torch.sin,
    "TAN": torch.tan,
    "EXP": torch.exp,
    "LOG": torch.log,
    "NEG": torch.neg,
    "SQRT": torch.sqrt,
    "RSQRT": torch.rsqrt,
    "RECIPROCAL": torch.reciprocal,
    "ERF": torch.erf,
    "IDENTITY": lambda a: a,
    "LOGICAL_NOT": torch.logical_not,
}


@pytest.mark.parametrize("name", sorted(ACTIVATION_ORACLES))
def test_activation_forward_matches_torch(name):
    actual = reference(PointwiseMode[name.upper() + "_FWD"], [X], COEF)
    np.testing.assert_allclose(actual, ACTIVATION_ORACLES[name](T(X)).numpy(), rtol=1e-11, atol=1e-15)


@pytest.mark.parametrize("name", sorted(ACTIVATION_ORACLES))
def test_activation_backward_matches_torch_autograd(name):
    x = T(X).clone().requires_grad_()
    dy = RNG.uniform(-1, 1, X.shape)
    ACTIVATION_ORACLES[name](x).backward(T(dy))
    actual = reference(PointwiseMode[name.upper() + "_BWD"], [dy, X], COEF)
    np.testing.assert_allclose(actual, x.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", sorted(ACTIVATION_ORACLES))
def test_activation_backward_matches_finite_differences(name):
    x = X[np.abs(X) > 1e-3]  # away from relu's kinks
    x = x[np.abs(x - COEF) > 1e-3]
    step = 1e-6
    forward = PointwiseMode[name.upper() + "_FWD"]
    numeric = (reference(forward, [x + step], COEF) - reference(forward, [x - step], COEF)) / (2 * step)
    analytic = reference(PointwiseMode[name.upper() + "_BWD"], [np.ones_like(x), x], COEF)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_identity_backward_passes_gradient_through():
    np.testing.assert_array_equal(reference(PointwiseMode.IDENTITY_BWD, [Y, X]), Y)


@pytest.mark.parametrize("name", sorted(BINARY_ORACLES))
def test_binary_mode_matches_torch(name):
    a, b = (Y, X) if name == "POW" else (X, Y)
    b = np.where(np.arange(b.size) % 3 == 0, a, b)  # some ties for the comparisons
    expected = BINARY_ORACLES[name](T(a), T(b)).numpy()
    np.testing.assert_allclose(reference(PointwiseMode[name], [a, b]), expected, rtol=1e-14)


@pytest.mark.parametrize("name", sorted(UNARY_ORACLES))
def test_unary_mode_matches_torch(name):
    x = Y if name in ("LOG", "SQRT", "RSQRT") else X
    expected = UNARY_ORACLES[name](T(x)).numpy()
    np.testing.assert_allclose(reference(PointwiseMode[name], [x]), expected, rtol=1e-14)


def test_binary_select_picks_first_where_mask_is_nonzero():
    mask = np.array([1.0, 0.0, -2.0, 0.0])
    result = reference(PointwiseMode.BINARY_SELECT, [np.array([1.0, 2, 3, 4]), np.array([5.0, 6, 7, 8]), mask])
    np.testing.assert_array_equal(result, [1, 6, 3, 8])


@pytest.mark.parametrize("propagate, expected", [(True, [math.nan, 0.0, 2.0]), (False, [0.0, 0.0, 2.0])])
def test_relu_nan_option(propagate, expected):
    x = np.array([math.nan, -1.0, 2.0])
    np.testing.assert_array_equal(reference(PointwiseMode.RELU_FWD, [x], propagate_nan=propagate), expected)
    clipped = reference(PointwiseMode.CLIPPED_RELU_FWD, [x], coef=1.5, propagate_nan=propagate)
    np.testing.assert_array_equal(clipped, np.minimum(expected, 1.5))


def test_softplus_and_sigmoid_stay_finite_and_accurate_at_extremes():
    x = np.array([-800.0, -40.0, 40.0, 800.0])
    np.testing.assert_allclose(
        reference(PointwiseMode.SOFTPLUS_FWD, [x], 1.0), [0.0, math.exp(-40), 40.0, 800.0], rtol=1e-15, atol=0
    )
    sigmoid = reference(PointwiseMode.SIGMOID_FWD, [x])
    np.testing.assert_allclose(sigmoid[1], 1 / (1 + math.exp(40)), rtol=1e-14)
    assert sigmoid[0] == 0.0 and sigmoid[3] == 1.0


@pytest.mark.parametrize("propagate_nan", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_forward_gives_the_general_forms_bits_with_nan_infinities_and_signed_zeros(propagate_nan, dtype):
    x = np.random.default_rng(0).standard_normal(1000).astype(dtype)
    x[:6] = [np.nan, -0.0, 0.0, np.inf, -np.inf, -np.nan]
    general = np.where(np.isnan(x), x if propagate_nan else np.zeros_like(x), np.where(x > 0, x, 0.0))
    fast = reference(PointwiseMode.RELU_FWD, [x], 0.0, propagate_nan)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    assert fast.dtype == dtype and np.array_equal(fast.view(bits), general.view(bits))
    assert not np.signbit(fast[1])  # -0 in, +0 out
