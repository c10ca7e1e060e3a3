"""The bad-input sweep: every public call of opendnn.functional, and the main cuDNN-shaped calls, with
each parameter given a wrong type, NaN, inf, a negative, zero, a fraction, an out-of-range enum or
a mismatched shape where that breaks a rule. Each must raise opendnn's typed error (BadParam or
NotSupported) whose message names the caller's own parameter, and leave every array it was given
as it was (a cuDNN-shaped call's output is poisoned beforehand and must come back unchanged).

The table: one ``Call`` per function, holding a factory of valid arguments and, per parameter, the
bad values to try; one test runs every (call, parameter, bad value).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import opendnn as od
import opendnn.functional as F

TEXT, NAN, INF, NEGATIVE, ZERO, FRACTION, ENUM = "text", math.nan, math.inf, -1, 0, 1.5, 99
KIND_NAMES = {
    id(TEXT): "type",
    id(NAN): "nan",
    id(INF): "inf",
    id(NEGATIVE): "negative",
    id(ZERO): "zero",
    id(FRACTION): "fraction",
    id(ENUM): "enum",
}
POISON = 7.0  # a cuDNN-shaped call's output holds it beforehand, and must still hold it afterwards


def data(*shape: int, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """Random values, never zeros."""
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape).astype(dtype)


def poisoned(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.full(shape, POISON, dtype)


@dataclass(frozen=True)
class Bad:
    """A bad value of one parameter, the error it gives and a fragment its message must hold
    (besides the parameter's name)."""

    value: Any
    name: str
    fragment: str = ""
    named: str | None = None  # the name the message holds, when the value reaches it by another (a field's)


def bad(value: Any, name: str | None = None, fragment: str = "", named: str | None = None) -> Bad:
    return Bad(value, name or KIND_NAMES.get(id(value), "shape"), fragment, named)


@dataclass(frozen=True)
class Call:
    """A public call: valid keyword arguments (made afresh for each case), and the bad values of
    each parameter."""

    name: str
    function: Callable[..., Any]
    arguments: Callable[[], dict[str, Any]]
    bad: dict[str, tuple[Any, ...]]


X4 = (2, 4, 5, 5)  # N, C, H, W


def _functional_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    calls = []
    for name in (
        "abs",
        "ceil",
        "floor",
        "cos",
        "sin",
        "tan",
        "exp",
        "log",
        "neg",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "erf",
        "logical_not",
        "relu",
        "sigmoid",
        "tanh",
        "global_avg_pool",
    ):
        calls.append(Call(name, getattr(F, name), lambda: {"x": x()}, {"x": (TEXT, [1.0, 2.0])}))
    for name in (
        "add",
        "sub",
        "mul",
        "div",
        "maximum",
        "minimum",
        "fmod",
        "pow",
        "add_square",
        "eq",
        "ne",
        "gt",
        "ge",
        "lt",
        "le",
        "logical_and",
        "logical_or",
    ):
        calls.append(
            Call(
                name,
                getattr(F, name),
                lambda: {"a": x(), "b": data(5)},
                {"a": (TEXT,), "b": (TEXT, bad(data(3), fragment="do not broadcast"))},
            )
        )
    for name in ("relu_backward", "sigmoid_backward", "tanh_backward"):
        calls.append(
            Call(name, getattr(F, name), lambda: {"dy": x(), "x": x()}, {"dy": (TEXT, data(3)), "x": (TEXT, data(3))})
        )
    # each coefficient's rule (ACTIVATION_TABLE): finite, above 0 for the betas and the ceiling, which has no default
    for name, parameter, bads in (
        ("elu", "alpha", FINITE),
        ("softplus", "beta", (*FINITE, NEGATIVE, ZERO)),
        ("swish", "beta", (*FINITE, NEGATIVE, ZERO)),
        ("clipped_relu", "ceiling", (*FINITE, bad(None, "none"), NEGATIVE, ZERO)),
    ):
        calls.append(
            Call(name, getattr(F, name), lambda p=parameter: {"x": x(), p: 1.5}, {"x": (TEXT,), parameter: bads})
        )
        calls.append(
            Call(
                f"{name}_backward",
                getattr(F, f"{name}_backward"),
                lambda p=parameter: {"dy": x(), "x": x(), p: 1.5},
                {"dy": (TEXT, data(3)), parameter: bads},
            )
        )
    calls += [
        Call("gelu", F.gelu, lambda: {"x": x()}, {"x": (TEXT,), "approximate": (TEXT, ENUM)}),
        Call(
            "gelu_backward",
            F.gelu_backward,
            lambda: {"dy": x(), "x": x()},
            {"dy": (TEXT, data(3)), "approximate": (TEXT, ENUM)},
        ),
        Call(
            "where",
            F.where,
            lambda: {"condition": x() > 1, "a": x(), "b": x()},
            {"condition": (TEXT, data(3)), "a": (TEXT, data(3)), "b": (TEXT, data(3))},
        ),
        Call(
            "pointwise",
            lambda mode, inputs, coef=None: F.pointwise(mode, *inputs, coef=coef),
            lambda: {"mode": od.PointwiseMode.SWISH_FWD, "inputs": (x(),), "coef": 1.0},
            {"mode": (TEXT, ENUM), "inputs": (bad((x(), x()), "arity"),), "coef": (TEXT, NAN, INF, ZERO)},
        ),
        Call(
            "gen_index",
            F.gen_index,
            lambda: {"x": x(), "axis": 1},
            {"x": (TEXT,), "axis": (TEXT, FRACTION, NAN, 4, -5), "dtype": (TEXT, ENUM)},
        ),
        Call(
            "transform",
            F.transform,
            lambda: {"x": x(), "layout": "NHWC", "alpha": 2.0},
            {
                "x": (TEXT,),
                "layout": (TEXT, ENUM, (0, 1, 2), (0, 1, 2, 2)),
                "dtype": (TEXT, ENUM),
                "alpha": (TEXT, NAN, INF),
            },
        ),
        # matrix products
        Call(
            "matmul",
            F.matmul,
            lambda: {"a": data(3, 4), "b": data(4, 5), "bias": data(5), "activation": "relu", "residual": data(3, 5)},
            {
                "a": (TEXT, data(3, 3)),
                "b": (TEXT, data(3, 5)),
                "bias": (TEXT, data(3)),
                "activation": (TEXT, ENUM),
                "coef": (TEXT, NAN, INF),
                "residual": (TEXT, data(5, 3)),
                "bias_axis": (TEXT, ENUM),
                "alpha": (TEXT, NAN, INF),
                "a_scale": (TEXT, NAN, INF),
                "b_scale": (TEXT, NAN, INF),
                "out_dtype": (TEXT, ENUM, "int32"),
            },
        ),
        Call(
            "matmul clipped relu",
            F.matmul,
            lambda: {"a": data(3, 4), "b": data(4, 5), "activation": "clipped_relu", "coef": 6.0},
            {"coef": (bad(None, "none"), NEGATIVE, ZERO)},
        ),
        Call(
            "linear",
            F.linear,
            lambda: {"x": data(3, 4), "weight": data(5, 4), "bias": data(5)},
            {"x": (TEXT, data(3, 5)), "weight": (TEXT, data(5, 3), data(5)), "bias": (TEXT, data(4))},
        ),
        # softmax
        *(
            Call(
                name,
                getattr(F, name),
                lambda: {"x": x(), "dim": 1},
                {"x": (TEXT,), "dim": (TEXT, FRACTION, NAN, 4, -5)},
            )
            for name in ("softmax", "log_softmax")
        ),
        *(
            Call(
                name,
                getattr(F, name),
                lambda: {"y": x(), "dy": x(), "dim": 1},
                {"y": (TEXT,), "dy": (TEXT, data(2, 4)), "dim": (TEXT, FRACTION, 4)},
            )
            for name in ("softmax_grad", "log_softmax_grad")
        ),
    ]
    return calls + _convolution_calls() + _pooling_calls() + _normalization_calls() + _batch_norm_calls()


INT = (TEXT, FRACTION, NAN)  # an int parameter given another type
POSITIVE_INT = (*INT, ZERO, NEGATIVE)
GEOMETRY = {
    "stride": (*POSITIVE_INT, (1, 2, 3)),
    "padding": (*INT, NEGATIVE, (1, 2, 3)),
    "dilation": (*POSITIVE_INT, (1, 2, 3)),
    "groups": (*POSITIVE_INT, 3),
}
FINITE = (TEXT, NAN, INF)


def _convolution_calls() -> list[Call]:
    x, w, dy = lambda: data(2, 4, 5, 5), lambda: data(6, 4, 3, 3), lambda: data(2, 6, 3, 3)  # noqa: E731
    return [
        Call(
            "conv",
            F.conv,
            lambda: {"x": x(), "w": w(), "bias": data(6)},
            {
                "x": (TEXT, data(2, 4, 5), data(2, 4, 5, 5).astype(np.int32)),
                "w": (TEXT, data(6, 3, 3, 3)),
                "bias": (TEXT, data(4), data(6, 1)),
                **GEOMETRY,
                "padding": (*GEOMETRY["padding"], TEXT),
                "mode": (TEXT, ENUM),
                "algo": (TEXT, ENUM, od.ConvolutionBwdDataAlgo.ALGO_0),
            },
        ),
        Call(
            "conv_bias_activation",
            F.conv_bias_activation,
            lambda: {"x": x(), "w": w(), "bias": data(6), "z": data(2, 6, 3, 3), "activation": "silu"},
            {
                "z": (TEXT, data(2, 6, 3, 4)),
                "activation": (TEXT, ENUM),
                "coef": (*FINITE, ZERO, NEGATIVE),
                "alpha2": FINITE,
                **GEOMETRY,
                "bias": (TEXT, data(4)),
            },
        ),
        Call(
            "conv_bias_activation clipped relu",
            F.conv_bias_activation,
            lambda: {"x": x(), "w": w(), "activation": "clipped_relu", "coef": 6.0},
            {"coef": (bad(None, "none"), ZERO)},
        ),
        Call(
            "conv_transpose",
            F.conv_transpose,
            lambda: {"x": dy(), "w": data(6, 4, 3, 3)},
            {
                "x": (TEXT, data(2, 5, 3, 3)),
                "w": (TEXT, data(6, 4, 3)),
                "bias": (TEXT, data(6)),
                "output_padding": (*INT, NEGATIVE, 1),
                **GEOMETRY,
                "groups": (*POSITIVE_INT, 4),
            },
        ),
        Call(
            "conv_backward_data",
            F.conv_backward_data,
            lambda: {"dy": dy(), "w": w(), "input_shape": (2, 4, 5, 5)},
            {
                "dy": (TEXT, data(2, 6, 4, 4)),
                "w": (TEXT, data(6, 3, 3, 3)),
                "input_shape": (TEXT, (2, 4, 5), (2, 4, 5, 5.5)),
                **GEOMETRY,
            },
        ),
        Call(
            "conv_backward_filter",
            F.conv_backward_filter,
            lambda: {"x": x(), "dy": dy(), "weight_shape": (6, 4, 3, 3)},
            {
                "x": (TEXT, data(2, 3, 5, 5)),
                "dy": (TEXT, data(2, 6, 4, 4)),
                "weight_shape": (TEXT, (6, 4, 3), (6, 4, 3, 3.5)),
                **GEOMETRY,
            },
        ),
        Call("conv_backward_bias", F.conv_backward_bias, lambda: {"dy": dy()}, {"dy": (TEXT, data(2, 6))}),
    ]


def _pooling_calls() -> list[Call]:
    x, y = lambda: data(*X4), lambda: data(2, 4, 2, 2)  # noqa: E731
    window = {
        "kernel_size": (*POSITIVE_INT, (1, 2, 3)),
        "stride": (*POSITIVE_INT, (1, 2, 3)),
        "padding": (*INT, NEGATIVE, 2),
    }
    adaptive = {"output_size": (*POSITIVE_INT, (1, 2, 3))}
    return [
        Call("max_pool", F.max_pool, lambda: {"x": x(), "kernel_size": 2}, {"x": (TEXT, data(4, 5)), **window}),
        Call("avg_pool", F.avg_pool, lambda: {"x": x(), "kernel_size": 2}, {"x": (TEXT, data(4, 5)), **window}),
        Call(
            "max_pool_backward",
            F.max_pool_backward,
            lambda: {"dy": y(), "x": x(), "y": y(), "kernel_size": 2},
            {"dy": (TEXT, data(2, 4, 3, 3)), "y": (TEXT, data(2, 4, 3, 3)), **window},
        ),
        Call(
            "avg_pool_backward",
            F.avg_pool_backward,
            lambda: {"dy": y(), "x": x(), "kernel_size": 2},
            {"dy": (TEXT, data(2, 4, 3, 3)), "x": (TEXT,), **window},
        ),
        Call(
            "adaptive_avg_pool",
            F.adaptive_avg_pool,
            lambda: {"x": x(), "output_size": 2},
            {"x": (TEXT, data(4, 5)), **adaptive},
        ),
        Call(
            "adaptive_max_pool",
            F.adaptive_max_pool,
            lambda: {"x": x(), "output_size": 2},
            {"x": (TEXT, data(4, 5)), **adaptive},
        ),
        Call(
            "adaptive_avg_pool_backward",
            F.adaptive_avg_pool_backward,
            lambda: {"dy": y(), "x": x()},
            {"dy": (TEXT, data(2, 3, 2, 2), data(2, 4, 2)), "x": (TEXT,)},
        ),
        Call(
            "adaptive_max_pool_backward",
            F.adaptive_max_pool_backward,
            lambda: {"dy": y(), "x": x(), "y": y()},
            {"dy": (TEXT, data(2, 3, 2, 2)), "y": (TEXT, data(2, 4, 3, 3))},
        ),
        Call(
            "global_avg_pool_backward",
            F.global_avg_pool_backward,
            lambda: {"dy": data(2, 4, 1, 1), "x": x()},
            {"dy": (TEXT, data(2, 3, 1, 1)), "x": (TEXT,)},
        ),
    ]


EPS = (*FINITE, NEGATIVE)


def _normalization_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    shape = {"normalized_shape": (TEXT, FRACTION, NAN, ZERO, (4,), (5, 4), (1, 2, 3, 4, 5))}
    lrn = {
        "size": (*POSITIVE_INT, 17),
        "alpha": FINITE,
        "beta": (*FINITE, ZERO, NEGATIVE),
        "k": (*FINITE, ZERO, NEGATIVE),
    }
    return [
        Call(
            "layer_norm",
            F.layer_norm,
            lambda: {"x": x(), "normalized_shape": (5, 5), "weight": data(5, 5), "bias": data(5, 5)},
            {"x": (TEXT,), **shape, "weight": (TEXT, data(5), data(4, 5)), "bias": (TEXT, data(5)), "eps": EPS},
        ),
        Call(
            "rms_norm",
            F.rms_norm,
            lambda: {"x": x(), "normalized_shape": 5, "weight": data(5)},
            {"x": (TEXT,), **shape, "weight": (TEXT, data(4)), "eps": EPS},
        ),
        Call(
            "group_norm",
            F.group_norm,
            lambda: {"x": x(), "num_groups": 2, "weight": data(4), "bias": data(4)},
            {
                "x": (TEXT, data(4)),
                "num_groups": (*POSITIVE_INT, 3),
                "weight": (TEXT, data(3)),
                "bias": (TEXT, data(5)),
                "eps": EPS,
            },
        ),
        Call(
            "instance_norm",
            F.instance_norm,
            lambda: {"x": x(), "weight": data(4)},
            {"x": (TEXT, data(4)), "weight": (TEXT, data(3)), "bias": (TEXT, data(3)), "eps": EPS},
        ),
        Call(
            "layer_norm_backward",
            F.layer_norm_backward,
            lambda: {"dy": x(), "x": x(), "normalized_shape": (5,), "weight": data(5)},
            {
                "dy": (TEXT, data(2, 4, 5)),
                **shape,
                "weight": (TEXT, data(4)),
                "eps": EPS,
                "mean": (TEXT, data(3)),
                "rstd": (TEXT, data(3)),
            },
        ),
        Call(
            "rms_norm_backward",
            F.rms_norm_backward,
            lambda: {"dy": x(), "x": x(), "normalized_shape": 5},
            {"dy": (TEXT, data(2, 4, 5)), **shape, "weight": (TEXT, data(4)), "eps": EPS, "rstd": (TEXT, data(3))},
        ),
        Call(
            "group_norm_backward",
            F.group_norm_backward,
            lambda: {"dy": x(), "x": x(), "num_groups": 2},
            {
                "dy": (TEXT, data(2, 4, 5)),
                "num_groups": (*POSITIVE_INT, 3),
                "weight": (TEXT, data(3)),
                "eps": EPS,
                "mean": (TEXT, data(3)),
                "rstd": (TEXT, data(3)),
            },
        ),
        Call(
            "instance_norm_backward",
            F.instance_norm_backward,
            lambda: {"dy": x(), "x": x()},
            {"dy": (TEXT, data(2, 4, 5)), "weight": (TEXT, data(3)), "eps": EPS},
        ),
        Call(
            "local_response_norm",
            F.local_response_norm,
            lambda: {"x": x(), "size": 3},
            {"x": (TEXT, data(4, 5)), **lrn},
        ),
        Call(
            "local_response_norm_backward",
            F.local_response_norm_backward,
            lambda: {"dy": x(), "x": x(), "size": 3},
            {"dy": (TEXT, data(2, 4, 5)), **lrn},
        ),
        Call(
            "divisive_norm",
            F.divisive_norm,
            lambda: {"x": x(), "means": x(), "size": 3},
            {"x": (TEXT, data(4, 5)), "means": (TEXT, data(2, 4, 5)), "temp": (TEXT, data(3)), **lrn},
        ),
        Call(
            "divisive_norm_backward",
            F.divisive_norm_backward,
            lambda: {"dy": x(), "x": x(), "size": 3},
            {"dy": (TEXT, data(2, 4, 5)), "means": (TEXT, data(2, 4, 5)), **lrn},
        ),
    ]


def _batch_norm_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    statistics = lambda: {"running_mean": data(4), "running_var": data(4)}  # noqa: E731
    parameters = {
        "weight": (TEXT, data(3)),
        "bias": (TEXT, data(5)),
        "eps": EPS,
        "running_mean": (TEXT, data(3), data(4, dtype=np.float64)),
        "running_var": (TEXT, data(3), data(4, dtype=np.float64)),
    }
    state = F.batch_norm_add_activation(data(*X4), data(*X4), **statistics(), return_state=True)[1]
    return [
        Call(
            "batch_norm",
            F.batch_norm,
            lambda: {"x": x(), **statistics(), "training": True},
            {"x": (TEXT, data(4)), **parameters, "momentum": (*FINITE, NEGATIVE, 2.0)},
        ),
        Call(
            "batch_norm inference",
            F.batch_norm,
            lambda: {"x": x(), **statistics()},
            {**parameters, "running_mean": (TEXT, data(3), bad(None, "none"))},
        ),
        Call(
            "batch_norm_add_activation",
            F.batch_norm_add_activation,
            lambda: {"x": x(), "z": x(), **statistics()},
            {
                "z": (TEXT, data(2, 4, 5)),
                **parameters,
                "momentum": (*FINITE, NEGATIVE, 2.0),
                "activation": (TEXT, ENUM, "sigmoid"),
            },
        ),
        Call(
            "batch_norm_add_activation clipped relu",
            F.batch_norm_add_activation,
            lambda: {"x": x(), "z": x(), "activation": "clipped_relu", "coef": 6.0},
            {"coef": (bad(None, "none"), *FINITE, ZERO, NEGATIVE)},
        ),
        Call(
            "batch_norm_backward",
            F.batch_norm_backward,
            lambda: {"dy": x(), "x": x()},
            {
                "dy": (TEXT, data(2, 4, 5)),
                "weight": (TEXT, data(3)),
                "eps": EPS,
                "saved_mean": (TEXT, data(3)),
            },
        ),
        Call(
            "batch_norm_add_activation_backward",
            F.batch_norm_add_activation_backward,
            lambda: {"dy": x(), "x": x(), "weight": data(4), "state": state},
            {
                "dy": (TEXT, data(2, 4, 5)),
                "weight": (TEXT, data(3)),
                "state": (TEXT,),
                "eps": EPS,
                "activation": (TEXT, ENUM, "sigmoid"),
            },
        ),
    ]


FUNCTIONAL_CALLS = _functional_calls()


def _cases(calls: list[Call]) -> list[tuple[Call, str, Bad]]:
    cases = []
    for call in calls:
        for parameter, values in call.bad.items():
            for value in values:
                cases.append((call, parameter, value if isinstance(value, Bad) else bad(value)))
    return cases


def _id(case: tuple[Call, str, Bad]) -> str:
    call, parameter, value = case
    return f"{call.name}-{parameter}-{value.name}"


def _snapshot(arguments: dict[str, Any]) -> list[tuple[Any, np.ndarray]]:
    """Every NumPy array among the arguments (in tuples too), with a copy of its values."""
    arrays = []
    for value in arguments.values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, np.ndarray):
                arrays.append((item, item.copy()))
    return arrays


def _names_parameter(message: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message) is not None


def check_refused(call: Call, parameter: str, value: Bad) -> None:
    arguments = call.arguments()
    arguments[parameter] = value.value
    arrays = _snapshot(arguments)
    with pytest.raises((od.BadParam, od.NotSupported)) as raised:
        call.function(**arguments)
    message = str(raised.value)
    name = value.named or parameter
    assert _names_parameter(message, name), f"the message does not name {name}: {message}"
    assert value.fragment in message, f"the message lacks {value.fragment!r}: {message}"
    for array, before in arrays:
        np.testing.assert_array_equal(array, before, err_msg="an array the call was given changed")


# ---- the cuDNN-shaped calls and their descriptors ---------------------------------------------------

H = od.create("cpu", backend="numpy")
D = od.TensorDescriptor("float32", (2, 3))
D_WIDE = od.TensorDescriptor("float32", (2, 4))
X4_DESC = od.TensorDescriptor("float32", X4)
SCALAR = (TEXT, NAN, INF)  # alpha and beta
HANDLE = (TEXT, None)


def _descriptor_calls() -> list[Call]:
    return [
        Call(
            "TensorDescriptor",
            od.TensorDescriptor,
            lambda: {"dtype": "float32", "dims": (2, 3), "strides": (3, 1)},
            {
                "dtype": (TEXT, ENUM),
                "dims": (TEXT, NAN, (2, 0), (2, 1.5), (2, -1), ()),
                "strides": (TEXT, (3,), (-3, 1), (3, 1.5)),
            },
        ),
        Call(
            "FilterDescriptor",
            lambda k, c, r, s, **kw: od.FilterDescriptor(kw["dtype"], kw["format"], k, c, r, s),
            lambda: {"dtype": "float32", "format": od.TensorFormat.NCHW, "k": 4, "c": 3, "r": 3, "s": 3},
            {"dtype": (TEXT,), "format": (TEXT, ENUM), "k": (TEXT, FRACTION, ZERO), "c": (NAN, NEGATIVE)},
        ),
        Call(
            "ConvolutionDescriptor",
            od.ConvolutionDescriptor,
            lambda: {"pad": (1, 1), "stride": (1, 1), "dilation": (1, 1)},
            {
                "pad": (TEXT, FRACTION, (-1, 0), (1,)),
                "stride": (TEXT, NAN, (0, 1), (1, 1, 1, 1)),
                "dilation": (TEXT, (1, 0)),
                "mode": (TEXT, ENUM, 5),
                "compute_type": (TEXT, "float16"),
                "group_count": (TEXT, FRACTION, ZERO),
                "math_type": (TEXT, ENUM),
            },
        ),
        Call(
            "PoolingDescriptor",
            od.PoolingDescriptor,
            lambda: {
                "mode": od.PoolingMode.MAX,
                "nan_opt": od.NanPropagation.PROPAGATE_NAN,
                "window": (2, 2),
                "padding": (0, 0),
                "stride": (2, 2),
            },
            {
                "mode": (TEXT, ENUM),
                "nan_opt": (TEXT, ENUM),
                "window": (TEXT, FRACTION, (0, 2)),
                "padding": (NAN, (-1, 0), (2, 0), (0,)),
                "stride": (TEXT, (0, 1)),
            },
        ),
        Call(
            "LRNDescriptor",
            od.LRNDescriptor,
            lambda: {"n": 5},
            {"n": (TEXT, FRACTION, ZERO, 17), "alpha": SCALAR, "beta": (*SCALAR, ZERO), "k": (*SCALAR, ZERO)},
        ),
        Call(
            "NormDescriptor",
            od.NormDescriptor,
            lambda: {"mode": od.NormMode.LAYER_NORM},
            {
                "mode": (TEXT, ENUM),
                "epsilon": (*SCALAR, NEGATIVE),
                "normalized_ndim": (TEXT, FRACTION, ZERO),
                "groups": (TEXT, ZERO),
            },
        ),
        Call(
            "ActivationDescriptor",
            od.ActivationDescriptor,
            lambda: {"mode": od.ActivationMode.SWISH},
            {"mode": (TEXT, ENUM), "nan_opt": (TEXT, ENUM), "coef": (*SCALAR, ZERO)},
        ),
        Call(
            "ActivationDescriptor clipped relu",
            od.ActivationDescriptor,
            lambda: {"mode": od.ActivationMode.CLIPPED_RELU, "coef": 6.0},
            {"coef": (bad(None, "none"), ZERO)},
        ),
        Call(
            "OpTensorDescriptor",
            od.OpTensorDescriptor,
            lambda: {"op": od.OpTensorOp.ADD},
            {"op": (TEXT, ENUM), "compute_type": (TEXT, "float16")},
        ),
        Call(
            "ReduceTensorDescriptor",
            od.ReduceTensorDescriptor,
            lambda: {"op": od.ReduceTensorOp.MAX},
            {
                "op": (TEXT, ENUM),
                "compute_type": (TEXT, "int32"),
                "nan_opt": (ENUM,),
                "indices": (TEXT, ENUM),
                "indices_type": (TEXT, "float32"),
            },
        ),
        Call(
            "MatmulEpilogue",
            od.MatmulEpilogue,
            lambda: {"activation": od.PointwiseMode.RELU_FWD},
            {"bias_axis": (TEXT, ENUM), "activation": (TEXT, ENUM), "bias": (bad(data(3), "missing desc"),)},
        ),
        Call(
            "create",
            od.create,
            lambda: {"device": "cpu"},
            {"device": (TEXT,), "backend": (TEXT,), "math_type": (TEXT, ENUM)},
        ),
    ]


def _activation_arguments() -> dict[str, Any]:
    return {
        "handle": H,
        "act_desc": od.ActivationDescriptor(od.ActivationMode.RELU),
        "alpha": 1.0,
        "x_desc": D,
        "x": data(2, 3),
        "beta": 0.0,
        "y_desc": D,
        "y": poisoned(2, 3),
    }


def _conv_arguments() -> dict[str, Any]:
    return {
        "handle": H,
        "alpha": 1.0,
        "x_desc": X4_DESC,
        "x": data(*X4),
        "w_desc": od.FilterDescriptor("float32", od.TensorFormat.NCHW, 6, 4, 3, 3),
        "w": data(6, 4, 3, 3),
        "conv_desc": od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1)),
        "algo": od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
        "workspace": None,
        "beta": 0.0,
        "y_desc": od.TensorDescriptor("float32", (2, 6, 5, 5)),
        "y": poisoned(2, 6, 5, 5),
    }


def _pool_arguments() -> dict[str, Any]:
    return {
        "handle": H,
        "pool_desc": od.PoolingDescriptor(od.PoolingMode.MAX, od.NanPropagation.PROPAGATE_NAN, (2, 2), (0, 0), (2, 2)),
        "alpha": 1.0,
        "x_desc": X4_DESC,
        "x": data(*X4),
        "beta": 0.0,
        "y_desc": od.TensorDescriptor("float32", (2, 4, 2, 2)),
        "y": poisoned(2, 4, 2, 2),
    }


def _op_tensor_arguments() -> dict[str, Any]:
    return {
        "handle": H,
        "op_desc": od.OpTensorDescriptor(od.OpTensorOp.ADD),
        "alpha1": 1.0,
        "a_desc": D,
        "a": data(2, 3),
        "alpha2": 1.0,
        "b_desc": D,
        "b": data(2, 3),
        "beta": 0.0,
        "c_desc": D,
        "c": poisoned(2, 3),
    }


def _softmax_arguments() -> dict[str, Any]:
    return {
        "handle": H,
        "algo": od.SoftmaxAlgorithm.ACCURATE,
        "mode": od.SoftmaxMode.CHANNEL,
        "alpha": 1.0,
        "x_desc": D,
        "x": data(2, 3),
        "beta": 0.0,
        "y_desc": D,
        "y": poisoned(2, 3),
    }


def _cudnn_calls() -> list[Call]:
    bn_param = od.TensorDescriptor("float32", (1, 4, 1, 1))
    return [
        Call(
            "activation_forward",
            od.activation_forward,
            _activation_arguments,
            {
                "handle": HANDLE,
                "act_desc": (TEXT, None),
                "alpha": SCALAR,
                "beta": SCALAR,
                "x_desc": (TEXT, D_WIDE),
                "x": (TEXT, data(5), data(2, 3, dtype=np.float64)),
                "y_desc": (TEXT, D_WIDE, od.TensorDescriptor("float32", (2, 3), (1, 1))),
                "y": (TEXT, poisoned(5)),
            },
        ),
        Call(
            "activation_backward",
            od.activation_backward,
            lambda: {
                **_activation_arguments(),
                "dy_desc": D,
                "dy": data(2, 3),
                "dx_desc": D,
                "dx": poisoned(2, 3),
                "y": data(2, 3),
            },
            {"dy_desc": (TEXT, D_WIDE), "dy": (TEXT,), "dx_desc": (TEXT, D_WIDE), "alpha": SCALAR},
        ),
        Call(
            "op_tensor",
            od.op_tensor,
            _op_tensor_arguments,
            {
                "handle": HANDLE,
                "op_desc": (TEXT,),
                "alpha1": SCALAR,
                "alpha2": SCALAR,
                "beta": SCALAR,
                "a_desc": (TEXT, D_WIDE),
                "b_desc": (D_WIDE,),
                "c_desc": (D_WIDE,),
                "c": (TEXT,),
            },
        ),
        Call(
            "add_tensor",
            od.add_tensor,
            lambda: {
                "handle": H,
                "alpha": 1.0,
                "a_desc": D,
                "a": data(2, 3),
                "beta": 0.0,
                "c_desc": D,
                "c": poisoned(2, 3),
            },
            {"alpha": SCALAR, "a_desc": (D_WIDE,), "a": (TEXT,)},
        ),
        Call(
            "scale_tensor",
            od.scale_tensor,
            lambda: {"handle": H, "y_desc": D, "y": poisoned(2, 3), "alpha": 2.0},
            {"y_desc": (TEXT, D_WIDE), "alpha": SCALAR},
        ),
        Call(
            "set_tensor",
            od.set_tensor,
            lambda: {"handle": H, "y_desc": D, "y": poisoned(2, 3), "value": 1.0},
            {"y_desc": (TEXT,), "value": (TEXT, None)},
        ),
        Call(
            "transform_tensor",
            od.transform_tensor,
            lambda: {
                "handle": H,
                "alpha": 1.0,
                "x_desc": D,
                "x": data(2, 3),
                "beta": 0.0,
                "y_desc": D,
                "y": poisoned(2, 3),
            },
            {"alpha": SCALAR, "x_desc": (D_WIDE,), "y": (TEXT, poisoned(4))},
        ),
        Call(
            "pointwise",
            od.pointwise,
            lambda: {
                "handle": H,
                "mode": od.PointwiseMode.ADD,
                "alpha": 1.0,
                "inputs": [(D, data(2, 3))] * 2,
                "beta": 0.0,
                "y_desc": D,
                "y": poisoned(2, 3),
            },
            {"mode": (TEXT, ENUM), "alpha": SCALAR, "coef": SCALAR, "y_desc": (D_WIDE,)},
        ),
        Call(
            "gen_index",
            od.gen_index,
            lambda: {"handle": H, "axis": 1, "y_desc": D, "y": poisoned(2, 3)},
            {"axis": (TEXT, FRACTION, 2, -3)},
        ),
        Call(
            "convolution_forward",
            od.convolution_forward,
            _conv_arguments,
            {
                "handle": HANDLE,
                "alpha": SCALAR,
                "beta": SCALAR,
                "x_desc": (TEXT, od.TensorDescriptor("float32", (2, 3, 5, 5))),
                "w_desc": (TEXT,),
                "conv_desc": (TEXT,),
                "algo": (TEXT, ENUM, od.ConvolutionBwdDataAlgo.ALGO_0),
                "y_desc": (TEXT, od.TensorDescriptor("float32", (2, 6, 4, 4))),
                "y": (TEXT, poisoned(5)),
            },
        ),
        Call(
            "convolution_bias_activation_forward",
            od.convolution_bias_activation_forward,
            lambda: (
                lambda a: (
                    {k: v for k, v in a.items() if k not in ("alpha", "beta")}
                    | {
                        "alpha1": 1.0,
                        "alpha2": 0.5,
                        "z_desc": a["y_desc"],
                        "z": data(2, 6, 5, 5),
                        "bias_desc": od.TensorDescriptor("float32", (1, 6, 1, 1)),
                        "bias": data(1, 6, 1, 1),
                        "act_desc": od.ActivationDescriptor(od.ActivationMode.ELU),
                    }
                )
            )(_conv_arguments()),
            {
                "alpha1": SCALAR,
                "alpha2": SCALAR,
                "act_desc": (TEXT,),
                "z_desc": (od.TensorDescriptor("float32", (2, 6, 5, 4)),),
                "bias_desc": (TEXT, od.TensorDescriptor("float32", (1, 4, 1, 1))),
            },
        ),
        Call(
            "convolution_backward_data",
            od.convolution_backward_data,
            lambda: {
                "handle": H,
                "alpha": 1.0,
                "w_desc": od.FilterDescriptor("float32", "NCHW", 6, 4, 3, 3),
                "w": data(6, 4, 3, 3),
                "dy_desc": od.TensorDescriptor("float32", (2, 6, 5, 5)),
                "dy": data(2, 6, 5, 5),
                "conv_desc": od.ConvolutionDescriptor((1, 1), (1, 1), (1, 1)),
                "algo": od.ConvolutionBwdDataAlgo.ALGO_0,
                "workspace": None,
                "beta": 0.0,
                "dx_desc": X4_DESC,
                "dx": poisoned(*X4),
            },
            {
                "alpha": SCALAR,
                "algo": (ENUM, od.ConvolutionFwdAlgo.IMPLICIT_GEMM),
                "dy_desc": (od.TensorDescriptor("float32", (2, 5, 5, 5)),),
                "dx_desc": (TEXT,),
            },
        ),
        Call(
            "convolution_backward_bias",
            od.convolution_backward_bias,
            lambda: {
                "handle": H,
                "alpha": 1.0,
                "dy_desc": X4_DESC,
                "dy": data(*X4),
                "beta": 0.0,
                "db_desc": bn_param,
                "db": poisoned(1, 4, 1, 1),
            },
            {"handle": HANDLE, "alpha": SCALAR, "db_desc": (TEXT, od.TensorDescriptor("float32", (1, 3, 1, 1)))},
        ),
        Call(
            "matmul",
            od.matmul,
            lambda: {
                "handle": H,
                "alpha": 1.0,
                "a_desc": D,
                "a": data(2, 3),
                "b_desc": od.TensorDescriptor("float32", (3, 4)),
                "b": data(3, 4),
                "beta": 0.0,
                "c_desc": D_WIDE,
                "c": poisoned(2, 4),
            },
            {
                "handle": HANDLE,
                "alpha": SCALAR,
                "beta": SCALAR,
                "a_desc": (TEXT, D_WIDE),
                "c_desc": (TEXT, D),
                "epilogue": (
                    TEXT,
                    bad(
                        od.MatmulEpilogue(activation=od.PointwiseMode.ELU_FWD, coef=math.nan), "nan coef", named="coef"
                    ),
                    bad(od.MatmulEpilogue(activation=od.PointwiseMode.CLIPPED_RELU_FWD), "no ceiling", named="coef"),
                ),
            },
        ),
        Call(
            "pooling_forward",
            od.pooling_forward,
            _pool_arguments,
            {
                "handle": HANDLE,
                "pool_desc": (TEXT,),
                "alpha": SCALAR,
                "beta": SCALAR,
                "y_desc": (od.TensorDescriptor("float32", (2, 4, 3, 3)),),
            },
        ),
        Call(
            "softmax_forward",
            od.softmax_forward,
            _softmax_arguments,
            {
                "handle": HANDLE,
                "algo": (TEXT, ENUM),
                "mode": (TEXT, ENUM),
                "alpha": SCALAR,
                "beta": SCALAR,
                "y_desc": (D_WIDE,),
            },
        ),
        Call(
            "lrn_cross_channel_forward",
            od.lrn_cross_channel_forward,
            lambda: {
                "handle": H,
                "norm_desc": od.LRNDescriptor(3),
                "mode": od.LRNMode.CROSS_CHANNEL_DIM1,
                "alpha": 1.0,
                "x_desc": X4_DESC,
                "x": data(*X4),
                "beta": 0.0,
                "y_desc": X4_DESC,
                "y": poisoned(*X4),
            },
            {"handle": HANDLE, "norm_desc": (TEXT,), "mode": (TEXT, ENUM), "alpha": SCALAR, "beta": SCALAR},
        ),
        Call(
            "batch_normalization_forward_training",
            od.batch_normalization_forward_training,
            lambda: {
                "handle": H,
                "mode": od.BatchNormMode.SPATIAL,
                "alpha": 1.0,
                "beta": 0.0,
                "x_desc": X4_DESC,
                "x": data(*X4),
                "y_desc": X4_DESC,
                "y": poisoned(*X4),
                "bn_scale_bias_mean_var_desc": bn_param,
                "bn_scale": data(1, 4, 1, 1),
                "bn_bias": data(1, 4, 1, 1),
                "exponential_average_factor": 0.1,
                "result_running_mean": data(1, 4, 1, 1),
                "result_running_variance": data(1, 4, 1, 1),
                "epsilon": 1e-5,
            },
            {
                "handle": HANDLE,
                "mode": (TEXT, ENUM),
                "alpha": SCALAR,
                "exponential_average_factor": (*SCALAR, 2.0),
                "epsilon": (*SCALAR, NEGATIVE),
                "bn_scale_bias_mean_var_desc": (TEXT, od.TensorDescriptor("float32", (4,))),
            },
        ),
        Call(
            "normalization_forward_inference",
            od.normalization_forward_inference,
            lambda: {
                "handle": H,
                "norm_desc": od.NormDescriptor(od.NormMode.LAYER_NORM),
                "alpha": 1.0,
                "x_desc": D,
                "x": data(2, 3),
                "scale_desc": None,
                "scale": None,
                "bias": None,
                "beta": 0.0,
                "y_desc": D,
                "y": poisoned(2, 3),
            },
            {"handle": HANDLE, "norm_desc": (TEXT,), "alpha": SCALAR, "y_desc": (D_WIDE,)},
        ),
        Call(
            "reduce_tensor",
            od.reduce_tensor,
            lambda: {
                "handle": H,
                "reduce_desc": od.ReduceTensorDescriptor(od.ReduceTensorOp.ADD),
                "indices": None,
                "workspace": None,
                "alpha": 1.0,
                "a_desc": D,
                "a": data(2, 3),
                "beta": 0.0,
                "c_desc": od.TensorDescriptor("float32", (2, 1)),
                "c": poisoned(2, 1),
            },
            {"handle": HANDLE, "reduce_desc": (TEXT,), "alpha": SCALAR, "c_desc": (D_WIDE,)},
        ),
    ]


CUDNN_CALLS = [*_descriptor_calls(), *_cudnn_calls()]
# (call, its arguments, the output, the input it is laid over one element further on)
OVERLAPS = [
    (od.activation_forward, _activation_arguments, "y", "x"),
    (od.op_tensor, _op_tensor_arguments, "c", "b"),
    (od.softmax_forward, _softmax_arguments, "y", "x"),
    (od.convolution_forward, _conv_arguments, "y", "x"),
]


@pytest.mark.parametrize("case", _cases(FUNCTIONAL_CALLS), ids=_id)
def test_functional_refuses_bad_input_naming_the_parameter(case):
    check_refused(*case)


@pytest.mark.parametrize("case", _cases(CUDNN_CALLS), ids=_id)
def test_cudnn_shaped_calls_refuse_bad_input_naming_the_parameter(case):
    check_refused(*case)


@pytest.mark.parametrize("function, arguments, output, source", OVERLAPS, ids=[o[0].__name__ for o in OVERLAPS])
def test_an_output_partly_over_an_input_is_refused_naming_both(function, arguments, output, source):
    values = arguments()
    source_shape, output_shape = values[source].shape, values[output].shape
    buffer = data(max(math.prod(source_shape), 1 + math.prod(output_shape)))
    # the output one element after the input: a partial overlap
    values[source] = buffer[: math.prod(source_shape)].reshape(source_shape)
    values[output] = buffer[1 : 1 + math.prod(output_shape)].reshape(output_shape)
    before = buffer.copy()
    with pytest.raises(od.BadParam, match=f"{output} and {source} overlap in memory"):
        function(**values)
    np.testing.assert_array_equal(buffer, before)


@pytest.mark.parametrize("call", FUNCTIONAL_CALLS + CUDNN_CALLS, ids=lambda c: c.name)
def test_valid_arguments_of_the_sweep_are_accepted(call):
    call.function(**call.arguments())


# ---- outputs over inputs: exact in-place where the call allows it, interleaved views ------------------


def test_exact_in_place_is_allowed_where_the_call_allows_it():
    x = data(2, 3)
    expected_relu, expected_sum = np.maximum(x, 0), 2 * x
    od.activation_forward(H, od.ActivationDescriptor(od.ActivationMode.RELU), 1.0, D, x, 0.0, D, x)
    np.testing.assert_array_equal(x, expected_relu)
    od.op_tensor(H, od.OpTensorDescriptor(od.OpTensorOp.ADD), 1.0, D, x, 1.0, D, x, 0.0, D, x)
    np.testing.assert_array_equal(x, expected_sum)
    expected = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    od.softmax_forward(H, od.SoftmaxAlgorithm.ACCURATE, od.SoftmaxMode.CHANNEL, 1.0, D, x, 0.0, D, x)
    np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_convolution_adds_z_in_place_but_never_writes_over_x():
    arguments = _conv_arguments()
    y = arguments["y"] = data(2, 6, 5, 5)
    conv = {
        k: arguments[k]
        for k in ("handle", "x_desc", "x", "w_desc", "w", "conv_desc", "algo", "workspace", "y_desc", "y")
    }
    expected = np.full_like(y, np.nan)
    od.convolution_forward(**{**conv, "y": expected, "alpha": 1.0, "beta": 0.0})
    expected += 0.5 * y
    od.convolution_bias_activation_forward(
        **conv, alpha1=1.0, alpha2=0.5, z_desc=arguments["y_desc"], z=y, bias_desc=None, bias=None, act_desc=None
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5)
    x = data(2, 4, 5, 5)
    one_by_one = od.ConvolutionDescriptor((0, 0), (1, 1), (1, 1))
    with pytest.raises(od.BadParam, match="y and x are the same memory: this call cannot write y over x"):
        od.convolution_forward(
            H,
            1.0,
            X4_DESC,
            x,
            od.TensorDescriptor("float32", (4, 4, 1, 1)),
            data(4, 4, 1, 1),
            one_by_one,
            od.ConvolutionFwdAlgo.IMPLICIT_GEMM,
            None,
            0.0,
            X4_DESC,
            x,
        )


def test_two_outputs_in_one_buffer_are_refused():
    x, dy, shared = data(*X4), data(*X4), poisoned(*X4)
    with pytest.raises(od.BadParam, match="dx and dmeans are the same memory"):
        od.divisive_normalization_backward(
            H,
            od.LRNDescriptor(3),
            od.DivNormMode.PRECOMPUTED_MEANS,
            1.0,
            X4_DESC,
            x,
            None,
            dy,
            None,
            None,
            0.0,
            X4_DESC,
            shared,
            shared,
        )
    np.testing.assert_array_equal(shared, POISON)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_interleaved_views_of_one_buffer_do_not_overlap(kind):
    import torch

    buffer = data(2, 6) if kind == "numpy" else torch.from_numpy(data(2, 6))
    x, y = buffer[:, ::2], buffer[:, 1::2]  # the even columns in, the odd ones out
    expected = -np.asarray(x)
    desc = od.TensorDescriptor("float32", (2, 3), (6, 2))
    od.pointwise(H, od.PointwiseMode.NEG, 1.0, [(desc, x)], 0.0, desc, y)
    np.testing.assert_array_equal(np.asarray(y), expected)
    np.testing.assert_array_equal(np.asarray(x), -expected)
