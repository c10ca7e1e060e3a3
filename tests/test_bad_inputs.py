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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import opendnn as od
import opendnn.functional as F

TEXT, NAN, INF, NEGATIVE, ZERO, FRACTION, ENUM = "text", math.nan, math.inf, -1, 0, 1.5, 99
KIND_NAMES = {id(TEXT): "type", id(NAN): "nan", id(INF): "inf", id(NEGATIVE): "negative", id(ZERO): "zero",
              id(FRACTION): "fraction", id(ENUM): "enum"}
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
    error: type[Exception] | tuple[type[Exception], ...] = (od.BadParam, od.NotSupported)
    fragment: str = ""


def bad(value: Any, name: str | None = None, error: type[Exception] | tuple[type[Exception], ...] = (
        od.BadParam, od.NotSupported), fragment: str = "") -> Bad:
    return Bad(value, name or KIND_NAMES.get(id(value), "shape"), error, fragment)


@dataclass(frozen=True)
class Call:
    """A public call: valid keyword arguments (made afresh for each case), and the bad values of
    each parameter. ``named`` is the name the message must hold, when the parameter is reached by
    another name (an attribute of a descriptor)."""

    name: str
    function: Callable[..., Any]
    arguments: Callable[[], dict[str, Any]]
    bad: dict[str, tuple[Any, ...]]
    named: dict[str, str] = field(default_factory=dict)


X4 = (2, 4, 5, 5)  # N, C, H, W


def _functional_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    calls = []
    for name in ("abs", "ceil", "floor", "cos", "sin", "tan", "exp", "log", "neg", "sqrt", "rsqrt", "reciprocal",
                 "erf", "logical_not", "relu", "sigmoid", "tanh", "global_avg_pool"):
        calls.append(Call(name, getattr(F, name), lambda: {"x": x()}, {"x": (TEXT, [1.0, 2.0])}))
    for name in ("add", "sub", "mul", "div", "maximum", "minimum", "fmod", "pow", "add_square", "eq", "ne", "gt",
                 "ge", "lt", "le", "logical_and", "logical_or"):
        calls.append(Call(name, getattr(F, name), lambda: {"a": x(), "b": data(5)},
                          {"a": (TEXT,), "b": (TEXT, bad(data(3), fragment="do not broadcast"))}))
    for name in ("relu_backward", "sigmoid_backward", "tanh_backward"):
        calls.append(Call(name, getattr(F, name), lambda: {"dy": x(), "x": x()},
                          {"dy": (TEXT, data(3)), "x": (TEXT, data(3))}))
    # each coefficient's rule (ACTIVATION_TABLE): finite, above 0 for the betas and the ceiling, which has no default
    for name, parameter, bads in (("elu", "alpha", FINITE), ("softplus", "beta", (*FINITE, NEGATIVE, ZERO)),
                                  ("swish", "beta", (*FINITE, NEGATIVE, ZERO)),
                                  ("clipped_relu", "ceiling", (*FINITE, bad(None, "none"), NEGATIVE, ZERO))):
        calls.append(Call(name, getattr(F, name), lambda p=parameter: {"x": x(), p: 1.5},
                          {"x": (TEXT,), parameter: bads}))
        calls.append(Call(f"{name}_backward", getattr(F, f"{name}_backward"),
                          lambda p=parameter: {"dy": x(), "x": x(), p: 1.5},
                          {"dy": (TEXT, data(3)), parameter: bads}))
    calls += [
        Call("gelu", F.gelu, lambda: {"x": x()}, {"x": (TEXT,), "approximate": (TEXT, ENUM)}),
        Call("gelu_backward", F.gelu_backward, lambda: {"dy": x(), "x": x()},
             {"dy": (TEXT, data(3)), "approximate": (TEXT, ENUM)}),
        Call("where", F.where, lambda: {"condition": x() > 1, "a": x(), "b": x()},
             {"condition": (TEXT, data(3)), "a": (TEXT, data(3)), "b": (TEXT, data(3))}),
        Call("pointwise", lambda mode, inputs, coef=None: F.pointwise(mode, *inputs, coef=coef),
             lambda: {"mode": od.PointwiseMode.SWISH_FWD, "inputs": (x(),), "coef": 1.0},
             {"mode": (TEXT, ENUM), "inputs": (bad((x(), x()), "arity"),), "coef": (TEXT, NAN, INF, ZERO)}),
        Call("gen_index", F.gen_index, lambda: {"x": x(), "axis": 1},
             {"x": (TEXT,), "axis": (TEXT, FRACTION, NAN, 4, -5), "dtype": (TEXT, ENUM)}),
        Call("transform", F.transform, lambda: {"x": x(), "layout": "NHWC", "alpha": 2.0},
             {"x": (TEXT,), "layout": (TEXT, ENUM, (0, 1, 2), (0, 1, 2, 2)), "dtype": (TEXT, ENUM),
              "alpha": (TEXT, NAN, INF)}),
        # matrix products
        Call("matmul", F.matmul, lambda: {"a": data(3, 4), "b": data(4, 5), "bias": data(5), "activation": "relu",
                                          "residual": data(3, 5)},
             {"a": (TEXT, data(3, 3)), "b": (TEXT, data(3, 5)), "bias": (TEXT, data(3)),
              "activation": (TEXT, ENUM), "coef": (TEXT, NAN, INF), "residual": (TEXT, data(5, 3)),
              "bias_axis": (TEXT, ENUM), "alpha": (TEXT, NAN, INF), "a_scale": (TEXT, NAN, INF),
              "b_scale": (TEXT, NAN, INF), "out_dtype": (TEXT, ENUM, "int32")}),
        Call("matmul clipped relu", F.matmul, lambda: {"a": data(3, 4), "b": data(4, 5), "activation": "clipped_relu",
                                                       "coef": 6.0},
             {"coef": (bad(None, "none"), NEGATIVE, ZERO)}),
        Call("linear", F.linear, lambda: {"x": data(3, 4), "weight": data(5, 4), "bias": data(5)},
             {"x": (TEXT, data(3, 5)), "weight": (TEXT, data(5, 3), data(5)), "bias": (TEXT, data(4))}),
        # softmax
        *(Call(name, getattr(F, name), lambda: {"x": x(), "dim": 1},
               {"x": (TEXT,), "dim": (TEXT, FRACTION, NAN, 4, -5)}) for name in ("softmax", "log_softmax")),
        *(Call(name, getattr(F, name), lambda: {"y": x(), "dy": x(), "dim": 1},
               {"y": (TEXT,), "dy": (TEXT, data(2, 4)), "dim": (TEXT, FRACTION, 4)})
          for name in ("softmax_backward", "log_softmax_backward")),
    ]
    return calls + _convolution_calls() + _pooling_calls() + _normalization_calls() + _batch_norm_calls()


INT = (TEXT, FRACTION, NAN)  # an int parameter given another type
POSITIVE_INT = (*INT, ZERO, NEGATIVE)
GEOMETRY = {"stride": (*POSITIVE_INT, (1, 2, 3)), "padding": (*INT, NEGATIVE, (1, 2, 3)),
            "dilation": (*POSITIVE_INT, (1, 2, 3)), "groups": (*POSITIVE_INT, 3)}
FINITE = (TEXT, NAN, INF)


def _convolution_calls() -> list[Call]:
    x, w, dy = lambda: data(2, 4, 5, 5), lambda: data(6, 4, 3, 3), lambda: data(2, 6, 3, 3)  # noqa: E731
    return [
        Call("conv", F.conv, lambda: {"x": x(), "w": w(), "bias": data(6)},
             {"x": (TEXT, data(2, 4, 5), data(2, 4, 5, 5).astype(np.int32)), "w": (TEXT, data(6, 3, 3, 3)),
              "bias": (TEXT, data(4), data(6, 1)), **GEOMETRY, "padding": (*GEOMETRY["padding"], TEXT),
              "mode": (TEXT, ENUM), "algo": (TEXT, ENUM, od.ConvolutionBwdDataAlgo.ALGO_0)}),
        Call("conv_bias_activation", F.conv_bias_activation,
             lambda: {"x": x(), "w": w(), "bias": data(6), "z": data(2, 6, 3, 3), "activation": "silu"},
             {"z": (TEXT, data(2, 6, 3, 4)), "activation": (TEXT, ENUM), "coef": (*FINITE, ZERO, NEGATIVE),
              "alpha2": FINITE, **GEOMETRY, "bias": (TEXT, data(4))}),
        Call("conv_bias_activation clipped relu", F.conv_bias_activation,
             lambda: {"x": x(), "w": w(), "activation": "clipped_relu", "coef": 6.0},
             {"coef": (bad(None, "none"), ZERO)}),
        Call("conv_transpose", F.conv_transpose, lambda: {"x": dy(), "w": data(6, 4, 3, 3)},
             {"x": (TEXT, data(2, 5, 3, 3)), "w": (TEXT, data(6, 4, 3)), "bias": (TEXT, data(6)),
              "output_padding": (*INT, NEGATIVE, 1), **GEOMETRY, "groups": (*POSITIVE_INT, 4)}),
        Call("conv_backward_data", F.conv_backward_data, lambda: {"dy": dy(), "w": w(), "input_shape": (2, 4, 5, 5)},
             {"dy": (TEXT, data(2, 6, 4, 4)), "w": (TEXT, data(6, 3, 3, 3)),
              "input_shape": (TEXT, (2, 4, 5), (2, 4, 5, 5.5)), **GEOMETRY}),
        Call("conv_backward_filter", F.conv_backward_filter,
             lambda: {"x": x(), "dy": dy(), "weight_shape": (6, 4, 3, 3)},
             {"x": (TEXT, data(2, 3, 5, 5)), "dy": (TEXT, data(2, 6, 4, 4)),
              "weight_shape": (TEXT, (6, 4, 3), (6, 4, 3, 3.5)), **GEOMETRY}),
        Call("conv_backward_bias", F.conv_backward_bias, lambda: {"dy": dy()}, {"dy": (TEXT, data(2, 6))}),
    ]


def _pooling_calls() -> list[Call]:
    x, y = lambda: data(*X4), lambda: data(2, 4, 2, 2)  # noqa: E731
    window = {"kernel_size": (*POSITIVE_INT, (1, 2, 3)), "stride": (*POSITIVE_INT, (1, 2, 3)),
              "padding": (*INT, NEGATIVE, 2)}
    adaptive = {"output_size": (*POSITIVE_INT, (1, 2, 3))}
    return [
        Call("max_pool", F.max_pool, lambda: {"x": x(), "kernel_size": 2}, {"x": (TEXT, data(4, 5)), **window}),
        Call("avg_pool", F.avg_pool, lambda: {"x": x(), "kernel_size": 2}, {"x": (TEXT, data(4, 5)), **window}),
        Call("max_pool_backward", F.max_pool_backward, lambda: {"dy": y(), "x": x(), "y": y(), "kernel_size": 2},
             {"dy": (TEXT, data(2, 4, 3, 3)), "y": (TEXT, data(2, 4, 3, 3)), **window}),
        Call("avg_pool_backward", F.avg_pool_backward, lambda: {"dy": y(), "x": x(), "kernel_size": 2},
             {"dy": (TEXT, data(2, 4, 3, 3)), "x": (TEXT,), **window}),
        Call("adaptive_avg_pool", F.adaptive_avg_pool, lambda: {"x": x(), "output_size": 2},
             {"x": (TEXT, data(4, 5)), **adaptive}),
        Call("adaptive_max_pool", F.adaptive_max_pool, lambda: {"x": x(), "output_size": 2},
             {"x": (TEXT, data(4, 5)), **adaptive}),
        Call("adaptive_avg_pool_backward", F.adaptive_avg_pool_backward, lambda: {"dy": y(), "x": x()},
             {"dy": (TEXT, data(2, 3, 2, 2), data(2, 4, 2)), "x": (TEXT,)}),
        Call("adaptive_max_pool_backward", F.adaptive_max_pool_backward, lambda: {"dy": y(), "x": x(), "y": y()},
             {"dy": (TEXT, data(2, 3, 2, 2)), "y": (TEXT, data(2, 4, 3, 3))}),
        Call("global_avg_pool_backward", F.global_avg_pool_backward, lambda: {"dy": data(2, 4, 1, 1), "x": x()},
             {"dy": (TEXT, data(2, 3, 1, 1)), "x": (TEXT,)}),
    ]


EPS = (*FINITE, NEGATIVE)


def _normalization_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    shape = {"normalized_shape": (TEXT, FRACTION, NAN, ZERO, (4,), (5, 4), (1, 2, 3, 4, 5))}
    lrn = {"size": (*POSITIVE_INT, 17), "alpha": FINITE, "beta": (*FINITE, ZERO, NEGATIVE),
           "k": (*FINITE, ZERO, NEGATIVE)}
    return [
        Call("layer_norm", F.layer_norm, lambda: {"x": x(), "normalized_shape": (5, 5), "weight": data(5, 5),
                                                  "bias": data(5, 5)},
             {"x": (TEXT,), **shape, "weight": (TEXT, data(5), data(4, 5)), "bias": (TEXT, data(5)), "eps": EPS}),
        Call("rms_norm", F.rms_norm, lambda: {"x": x(), "normalized_shape": 5, "weight": data(5)},
             {"x": (TEXT,), **shape, "weight": (TEXT, data(4)), "eps": EPS}),
        Call("group_norm", F.group_norm, lambda: {"x": x(), "num_groups": 2, "weight": data(4), "bias": data(4)},
             {"x": (TEXT, data(4)), "num_groups": (*POSITIVE_INT, 3), "weight": (TEXT, data(3)),
              "bias": (TEXT, data(5)), "eps": EPS}),
        Call("instance_norm", F.instance_norm, lambda: {"x": x(), "weight": data(4)},
             {"x": (TEXT, data(4)), "weight": (TEXT, data(3)), "bias": (TEXT, data(3)), "eps": EPS}),
        Call("layer_norm_backward", F.layer_norm_backward,
             lambda: {"dy": x(), "x": x(), "normalized_shape": (5,), "weight": data(5)},
             {"dy": (TEXT, data(2, 4, 5)), **shape, "weight": (TEXT, data(4)), "eps": EPS,
              "mean": (TEXT, data(3)), "rstd": (TEXT, data(3))}),
        Call("rms_norm_backward", F.rms_norm_backward, lambda: {"dy": x(), "x": x(), "normalized_shape": 5},
             {"dy": (TEXT, data(2, 4, 5)), **shape, "weight": (TEXT, data(4)), "eps": EPS, "rstd": (TEXT, data(3))}),
        Call("group_norm_backward", F.group_norm_backward, lambda: {"dy": x(), "x": x(), "num_groups": 2},
             {"dy": (TEXT, data(2, 4, 5)), "num_groups": (*POSITIVE_INT, 3), "weight": (TEXT, data(3)), "eps": EPS,
              "mean": (TEXT, data(3)), "rstd": (TEXT, data(3))}),
        Call("instance_norm_backward", F.instance_norm_backward, lambda: {"dy": x(), "x": x()},
             {"dy": (TEXT, data(2, 4, 5)), "weight": (TEXT, data(3)), "eps": EPS}),
        Call("local_response_norm", F.local_response_norm, lambda: {"x": x(), "size": 3},
             {"x": (TEXT, data(4, 5)), **lrn}),
        Call("local_response_norm_backward", F.local_response_norm_backward,
             lambda: {"dy": x(), "x": x(), "size": 3}, {"dy": (TEXT, data(2, 4, 5)), **lrn}),
        Call("divisive_norm", F.divisive_norm, lambda: {"x": x(), "means": x(), "size": 3},
             {"x": (TEXT, data(4, 5)), "means": (TEXT, data(2, 4, 5)), "temp": (TEXT, data(3)), **lrn}),
        Call("divisive_norm_backward", F.divisive_norm_backward, lambda: {"dy": x(), "x": x(), "size": 3},
             {"dy": (TEXT, data(2, 4, 5)), "means": (TEXT, data(2, 4, 5)), **lrn}),
    ]


def _batch_norm_calls() -> list[Call]:
    x = lambda: data(*X4)  # noqa: E731
    statistics = lambda: {"running_mean": data(4), "running_var": data(4)}  # noqa: E731
    parameters = {"weight": (TEXT, data(3)), "bias": (TEXT, data(5)), "eps": (*EPS, ZERO, 1e-6),
                  "running_mean": (TEXT, data(3), data(4, dtype=np.float64)),
                  "running_var": (TEXT, data(3), data(4, dtype=np.float64))}
    state = F.batch_norm_add_activation(data(*X4), data(*X4), **statistics(), return_state=True)[1]
    return [
        Call("batch_norm", F.batch_norm, lambda: {"x": x(), **statistics(), "training": True},
             {"x": (TEXT, data(4)), **parameters, "momentum": (*FINITE, NEGATIVE, 2.0)}),
        Call("batch_norm inference", F.batch_norm, lambda: {"x": x(), **statistics()},
             {**parameters, "running_mean": (TEXT, data(3), bad(None, "none"))}),
        Call("batch_norm_add_activation", F.batch_norm_add_activation, lambda: {"x": x(), "z": x(), **statistics()},
             {"z": (TEXT, data(2, 4, 5)), **parameters, "momentum": (*FINITE, NEGATIVE, 2.0),
              "activation": (TEXT, ENUM, "sigmoid")}),
        Call("batch_norm_add_activation clipped relu", F.batch_norm_add_activation,
             lambda: {"x": x(), "z": x(), "activation": "clipped_relu", "coef": 6.0},
             {"coef": (bad(None, "none"), *FINITE, ZERO, NEGATIVE)}),
        Call("batch_norm_backward", F.batch_norm_backward, lambda: {"dy": x(), "x": x()},
             {"dy": (TEXT, data(2, 4, 5)), "weight": (TEXT, data(3)), "eps": (*EPS, ZERO),
              "saved_mean": (TEXT, data(3))}),
        Call("batch_norm_add_activation_backward", F.batch_norm_add_activation_backward,
             lambda: {"dy": x(), "x": x(), "weight": data(4), "state": state},
             {"dy": (TEXT, data(2, 4, 5)), "weight": (TEXT, data(3)), "state": (TEXT,), "eps": (*EPS, ZERO),
              "activation": (TEXT, ENUM, "sigmoid")}),
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
    assert isinstance(raised.value, value.error), f"{type(raised.value).__name__}: {message}"
    name = call.named.get(parameter, parameter)
    assert _names_parameter(message, name), f"the message does not name {name}: {message}"
    assert value.fragment in message, f"the message lacks {value.fragment!r}: {message}"
    for array, before in arrays:
        np.testing.assert_array_equal(array, before, err_msg="an array the call was given changed")


@pytest.mark.parametrize("case", _cases(FUNCTIONAL_CALLS), ids=_id)
def test_functional_refuses_bad_input_naming_the_parameter(case):
    check_refused(*case)


@pytest.mark.parametrize("call", FUNCTIONAL_CALLS, ids=[c.name for c in FUNCTIONAL_CALLS])
def test_valid_arguments_of_the_sweep_are_accepted(call):
    call.function(**call.arguments())
