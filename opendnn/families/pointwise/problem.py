"""Pointwise operations: one table of modes, each with its arity and its NumPy reference.

cuDNN's graph API treats activations as pointwise modes too (RELU_FWD, RELU_BWD, ...); so does
opendnn, so one elementwise kernel family serves activations, arithmetic, comparisons, logic,
op_tensor, add_tensor, scale_tensor, set_tensor and transform_tensor.

Every mode computes ``out = alpha * f(s0 * in0, s1 * in1, in2) + beta * out`` elementwise, inputs
broadcast (each dim equal to the output's or 1), arithmetic in float32 (float64 when any tensor is
float64 or a 32/64-bit integer), ``coef`` the mode's parameter (clipped relu ceiling, elu alpha,
swish and softplus beta). ``ACTIVATION_TABLE`` is the one place an activation's coefficient is
defined: what it means, torch's default, its rule; every call that takes an activation by name or
mode (pointwise, the matmul and convolution epilogues, batch norm's fused forms) resolves it there.
Backward modes take ``(dy, x)`` and give ``dx = dy * f'(x)``, or, with ``torch_rule``, torch's formula of the
activations whose torch gradient selects rather than multiplies (``Activation.torch_selects``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from opendnn.core.activation_constants import GELU_TANH_CUBIC, GELU_TANH_SCALE
from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor, check_broadcastable, check_finite, check_member
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, require
from opendnn.core.memo import cached_hash, memoized
from opendnn.families.pointwise.erf import erf


class PointwiseMode(enum.Enum):
    """Elementwise functions; the value is the name the kernels switch on."""

    # arithmetic
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    MOD = "mod"
    POW = "pow"
    ADD_SQUARE = "add_square"
    # mathematical
    ABS = "abs"
    CEIL = "ceil"
    FLOOR = "floor"
    COS = "cos"
    SIN = "sin"
    TAN = "tan"
    EXP = "exp"
    LOG = "log"
    NEG = "neg"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    ERF = "erf"
    IDENTITY = "identity"
    # relational (1 for true, 0 for false)
    CMP_EQ = "cmp_eq"
    CMP_NEQ = "cmp_neq"
    CMP_GT = "cmp_gt"
    CMP_GE = "cmp_ge"
    CMP_LT = "cmp_lt"
    CMP_LE = "cmp_le"
    # logical (nonzero is true)
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_NOT = "logical_not"
    BINARY_SELECT = "binary_select"  # in2 ? in0 : in1
    # activations, forward (x) and backward (dy, x)
    RELU_FWD = "relu_fwd"
    RELU_BWD = "relu_bwd"
    CLIPPED_RELU_FWD = "clipped_relu_fwd"
    CLIPPED_RELU_BWD = "clipped_relu_bwd"
    ELU_FWD = "elu_fwd"
    ELU_BWD = "elu_bwd"
    GELU_FWD = "gelu_fwd"
    GELU_BWD = "gelu_bwd"
    GELU_APPROX_TANH_FWD = "gelu_approx_tanh_fwd"
    GELU_APPROX_TANH_BWD = "gelu_approx_tanh_bwd"
    SIGMOID_FWD = "sigmoid_fwd"
    SIGMOID_BWD = "sigmoid_bwd"
    TANH_FWD = "tanh_fwd"
    TANH_BWD = "tanh_bwd"
    SOFTPLUS_FWD = "softplus_fwd"
    SOFTPLUS_BWD = "softplus_bwd"
    SWISH_FWD = "swish_fwd"
    SWISH_BWD = "swish_bwd"
    IDENTITY_BWD = "identity_bwd"

    @property
    def arity(self) -> int:
        return ARITY[self]


_BINARY = {
    "add",
    "sub",
    "mul",
    "div",
    "max",
    "min",
    "mod",
    "pow",
    "add_square",
    "cmp_eq",
    "cmp_neq",
    "cmp_gt",
    "cmp_ge",
    "cmp_lt",
    "cmp_le",
    "logical_and",
    "logical_or",
}
ARITY = {
    mode: 3 if mode is PointwiseMode.BINARY_SELECT else 2 if mode.value in _BINARY or mode.value.endswith("_bwd") else 1
    for mode in PointwiseMode
}


@dataclass(frozen=True)
class Activation:
    """An activation's entry in ACTIVATION_TABLE.

    Attributes:
        name: its PointwiseMode's value less ``_fwd`` / ``_bwd``.
        aliases: other names the Pythonic API takes for it (torch's, where they differ).
        coefficient: what ``coef`` is to it ("ceiling", "alpha", "beta"), None when it takes none.
        default: the coefficient when the caller gives none: torch's default; None when the
            caller must give it.
        positive: the coefficient must be above 0.
        torch_selects: torch's gradient is a selection by a test of x that NaN fails (relu's
            threshold_backward, hardtanh's and elu's backward: ``x <= 0``, ``x >= ceiling``), not
            ``dy * f'(x)``: dy where x is NaN, and 0 where the activation is flat even for a NaN or
            infinite dy. The backward modes' ``torch_rule`` computes it (``torch_gradient``).
    """

    name: str
    aliases: tuple[str, ...] = ()
    coefficient: str | None = None
    default: float | None = None
    positive: bool = False
    torch_selects: bool = False


ACTIVATION_TABLE = {
    entry.name: entry
    for entry in (
        Activation("identity"),
        Activation("relu", torch_selects=True),
        # no default: relu6 is ceiling 6
        Activation("clipped_relu", coefficient="ceiling", positive=True, torch_selects=True),
        Activation("elu", coefficient="alpha", default=1.0, torch_selects=True),
        Activation("gelu"),
        Activation("gelu_approx_tanh", aliases=("gelu_tanh",)),
        Activation("sigmoid"),
        Activation("tanh"),
        Activation("softplus", coefficient="beta", default=1.0, positive=True),
        Activation("swish", aliases=("silu",), coefficient="beta", default=1.0, positive=True),
    )
}
ACTIVATION_NAMES = {alias: entry.name for entry in ACTIVATION_TABLE.values() for alias in (entry.name, *entry.aliases)}


def resolved_coef(mode: PointwiseMode, coef: float | None, name: str = "coef") -> float:
    """The coefficient ``mode`` runs with: ``coef`` checked against the mode's rule in
    ACTIVATION_TABLE, or the table's default when ``coef`` is None (0.0 for a mode without one).

    Args:
        name: what the caller calls ``coef`` (``beta``, ``alpha``, ``ceiling``), for the messages.

    Raises:
        BadParam: ``coef`` not a finite number, not above 0 where the rule says so, or None where
            the mode has no default (clipped relu's ceiling).
    """
    entry = ACTIVATION_TABLE.get(_activation_name(mode))
    if coef is None:
        if entry is None or entry.coefficient is None:
            return 0.0
        if entry.default is None:
            raise BadParam(f"{name}=None: {entry.name.upper()} needs its {entry.coefficient} (a number above 0)")
        return entry.default
    value = check_finite(name, coef)
    if entry is not None and entry.positive and not value > 0:
        raise BadParam(f"{name}={coef} must be above 0: it is the {entry.coefficient} of {entry.name.upper()}")
    return value


def check_nan_rule(propagate_nan: bool, torch_rule: bool) -> None:
    """An activation gradient's rule at a NaN input is one: 0 (neither), NaN (``propagate_nan``) or
    dy (``torch_rule``).

    Raises:
        BadParam: both set.
    """
    if propagate_nan and torch_rule:
        raise BadParam("propagate_nan=True and torch_rule=True: torch's rule gives dy where x is NaN; set one")


def _activation_name(mode: PointwiseMode) -> str:
    return mode.value.removesuffix("_fwd").removesuffix("_bwd")


@dataclass(frozen=True)
class PointwiseProblem:
    """A validated pointwise call: descriptors and parameters, no memory."""

    __hash__ = cached_hash  # problems key the per-call caches

    mode: PointwiseMode
    inputs: tuple[TensorDescriptor, ...]
    output: TensorDescriptor
    alpha: float = 1.0
    beta: float = 0.0
    input_scales: tuple[float, ...] = (1.0, 1.0, 1.0)
    coef: float = 0.0
    propagate_nan: bool = False
    compute_dtype: DataType = DataType.FLOAT
    fast_math: bool = False  # the handle's: approximate activations for 16-bit outputs on a GPU
    torch_rule: bool = False  # a backward mode of an activation that ``torch_selects``: torch's gradient


def pointwise_problem(
    mode: PointwiseMode,
    inputs: Sequence[Bound],
    output: Bound,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    input_scales: Sequence[float] = (1.0, 1.0, 1.0),
    coef: float | None = None,
    propagate_nan: bool = False,
    compute_type: DataType | None = None,
    fast_math: bool = False,
    torch_rule: bool = False,
) -> PointwiseProblem:
    """The shape and dtype rules of every pointwise call. Arithmetic runs in ``compute_type``:
    by default float64 when any tensor is float64, int32 or int64, else float32. ``coef`` None is
    the mode's default (``resolved_coef``). ``torch_rule``: a backward mode computes torch's
    gradient (``torch_gradient``); the other modes' results are torch's already, and it changes
    nothing there.

    Raises:
        BadParam: an input count that does not match the mode, an input that does not broadcast
            to the output, a non-finite alpha, beta or scale, a coefficient against its rule,
            ``propagate_nan`` and ``torch_rule`` both set.
    """
    return _pointwise_problem(
        mode,
        tuple((t.name, t.desc) for t in inputs),
        (output.name, output.desc),
        alpha,
        beta,
        tuple(input_scales),
        coef,
        propagate_nan,
        compute_type,
        fast_math,
        torch_rule,
    )


@memoized  # the cuDNN-shaped calls, broadcasts and transforms keep no plan: asked on every call
def _pointwise_problem(
    mode: PointwiseMode,
    inputs: tuple[tuple[str, TensorDescriptor], ...],
    output: tuple[str, TensorDescriptor],
    alpha: float,
    beta: float,
    input_scales: tuple[float, ...],
    coef: float | None,
    propagate_nan: bool,
    compute_type: DataType | None,
    fast_math: bool,
    torch_rule: bool,
) -> PointwiseProblem:
    """pointwise_problem of (name, descriptor) pairs: hashable, so memoized."""
    mode = check_member("mode", PointwiseMode, mode)
    require(len(inputs) == mode.arity, f"mode={mode.name} takes {mode.arity} inputs, got {len(inputs)}")
    output_name, output_desc = output
    for name, desc in inputs:
        check_broadcastable(f"{name}_desc", desc, f"{output_name}_desc", output_desc)
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    coef = resolved_coef(mode, coef)
    check_nan_rule(propagate_nan, torch_rule)
    entry = ACTIVATION_TABLE.get(_activation_name(mode))
    torch_rule = bool(torch_rule) and mode.value.endswith("_bwd") and entry is not None and entry.torch_selects
    scales = tuple(check_finite(f"input_scales[{k}]", s) for k, s in enumerate(input_scales))
    scales += (1.0,) * (3 - len(scales))
    descs = tuple(desc for _, desc in inputs)
    if compute_type is None:  # float64 also keeps 32- and 64-bit integers exact (to 2**53)
        wide = (DataType.DOUBLE, DataType.INT32, DataType.INT64)
        double = any(d.dtype in wide for d in (*descs, output_desc))
        compute_type = DataType.DOUBLE if double else DataType.FLOAT
    return PointwiseProblem(
        mode,
        descs,
        output_desc,
        alpha,
        beta,
        scales[:3],
        coef,
        bool(propagate_nan),
        compute_type,
        bool(fast_math),
        torch_rule,
    )


def reference(
    mode: PointwiseMode,
    inputs: Sequence[np.ndarray],
    coef: float = 0.0,
    propagate_nan: bool = False,
    torch_rule: bool = False,
) -> np.ndarray:
    """The NumPy definition of every mode, computed in the inputs' float dtype (``torch_rule``: of
    a problem that keeps it, ``torch_gradient``)."""
    a = inputs[0]
    b, c = (*inputs[1:], a, a)[:2]  # (a mode of fewer inputs never reads the missing ones)
    name = mode.value
    if name in _REFERENCE_BINARY:
        return _REFERENCE_BINARY[name](a, b)
    if name in _REFERENCE_UNARY:
        return _REFERENCE_UNARY[name](a)
    if mode is PointwiseMode.BINARY_SELECT:
        return np.where(c != 0, a, b)
    if mode is PointwiseMode.RELU_FWD:  # the values of the general form below, in two passes
        return (np.maximum if propagate_nan else np.fmax)(a, 0.0) + 0.0  # + 0.0: -0 becomes +0
    if name.endswith("_fwd"):
        result = _activation(name.removesuffix("_fwd"), a, coef)
        x = a
    elif torch_rule:
        return torch_gradient(name.removesuffix("_bwd"), a, b, coef)
    else:
        dy, x = a, b
        result = dy * _activation_derivative(name.removesuffix("_bwd"), x, coef)
    if name.startswith(("relu", "clipped_relu")):  # NaN in: NaN out, or 0 without propagation
        return np.where(np.isnan(x), x if propagate_nan else np.zeros_like(x), result)
    return result


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -x))  # 1 / (1 + exp(-x)), relatively accurate for any x


def _activation(name: str, x: np.ndarray, coef: float) -> np.ndarray:
    if name == "identity":
        return x
    if name == "relu":  # +0 at -0 (IEEE's maximum; NumPy leaves the sign of maximum(-0, 0) unspecified)
        return np.where(x > 0, x, 0.0)
    if name == "clipped_relu":
        return np.where(x > 0, np.minimum(x, coef), 0.0)
    if name == "elu":
        return np.where(x > 0, x, coef * np.expm1(np.where(x >= 0, 0.0, x)))  # +0 at -0, NaN at NaN
    if name == "gelu":
        return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    if name == "gelu_approx_tanh":
        return 0.5 * x * (1.0 + np.tanh(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x**3)))
    if name == "sigmoid":
        return _sigmoid(x)
    if name == "tanh":
        return np.tanh(x)
    if name == "softplus":  # log(1 + exp(coef * x)) / coef, without overflow
        bx = coef * x
        return (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / coef
    if name == "swish":
        return x * _sigmoid(coef * x)
    raise AssertionError(name)


def _activation_derivative(name: str, x: np.ndarray, coef: float) -> np.ndarray:
    if name == "identity":
        return np.ones_like(x)
    if name == "relu":
        return (x > 0).astype(x.dtype)
    if name == "clipped_relu":
        return ((x > 0) & (x < coef)).astype(x.dtype)
    if name == "elu":
        return np.where(x > 0, 1.0, coef * np.exp(np.minimum(x, 0))).astype(x.dtype)
    if name == "gelu":
        return 0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    if name == "gelu_approx_tanh":
        t = np.tanh(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_TANH_SCALE * (1 + 3 * GELU_TANH_CUBIC * x * x)
    if name == "sigmoid":
        s = _sigmoid(x)
        return s * (1 - s)
    if name == "tanh":
        return 1 - np.tanh(x) ** 2
    if name == "softplus":
        return _sigmoid(coef * x)
    if name == "swish":
        s = _sigmoid(coef * x)
        return s + coef * x * s * (1 - s)
    raise AssertionError(name)


def torch_gradient(name: str, dy: np.ndarray, x: np.ndarray, coef: float) -> np.ndarray:
    """torch's gradient of an activation that ``torch_selects`` (its CPU kernels' scalar formula,
    which its CUDA kernels share): relu ``x <= 0 ? 0 : dy`` (threshold_backward), clipped relu
    ``x <= 0 || x >= coef ? 0 : dy`` (hardtanh_backward), elu ``x <= 0 ? dy * coef * exp(x) : dy``."""
    if name == "relu":
        return np.where(x <= 0, 0.0, dy).astype(dy.dtype, copy=False)
    if name == "clipped_relu":
        return np.where((x <= 0) | (x >= coef), 0.0, dy).astype(dy.dtype, copy=False)
    if name == "elu":
        return np.where(x <= 0, dy * coef * np.exp(np.minimum(x, 0)), dy)
    raise AssertionError(name)


def _truth(x: np.ndarray) -> np.ndarray:
    return x != 0


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754's maximum: NaN where either is NaN, +0 above -0 (NumPy's maximum returns its second
    operand between two zeros)."""
    return np.where((a == 0) & (b == 0), a + b, np.maximum(a, b))


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754's minimum: NaN where either is NaN, -0 below +0."""
    return np.where((a == 0) & (b == 0), -(-a + -b), np.minimum(a, b))


_REFERENCE_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": _maximum,
    "min": _minimum,
    "mod": np.fmod,
    "pow": np.power,
    "add_square": lambda a, b: a + b * b,
    "cmp_eq": np.equal,
    "cmp_neq": np.not_equal,
    "cmp_gt": np.greater,
    "cmp_ge": np.greater_equal,
    "cmp_lt": np.less,
    "cmp_le": np.less_equal,
    "logical_and": lambda a, b: _truth(a) & _truth(b),
    "logical_or": lambda a, b: _truth(a) | _truth(b),
}
_REFERENCE_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "cos": np.cos,
    "sin": np.sin,
    "tan": np.tan,
    "exp": np.exp,
    "log": np.log,
    "neg": np.negative,
    "sqrt": np.sqrt,
    "rsqrt": lambda a: 1 / np.sqrt(a),
    "reciprocal": lambda a: 1 / a,
    "erf": erf,
    "identity": lambda a: a,
    "logical_not": lambda a: ~_truth(a),
}
