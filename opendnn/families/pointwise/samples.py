"""Samples of the pointwise family: activations, pointwise, op/add/scale/set/transform tensor and
gen_index."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from opendnn.core.descriptors import NanPropagation, TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle, create
from opendnn.core.samples import FLOAT_TYPES, LAYOUTS, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.pointwise import activation_functional, functional
from opendnn.families.pointwise.activation_api import (
    ActivationDescriptor,
    ActivationMode,
    activation_backward,
    activation_forward,
)
from opendnn.families.pointwise.problem import PointwiseMode, reference
from opendnn.families.pointwise.tensor_ops_api import (
    OpTensorDescriptor,
    OpTensorOp,
    add_tensor,
    gen_index,
    op_tensor,
    pointwise,
    scale_tensor,
    set_tensor,
    transform_tensor,
)

_DOMAINS: dict[str, tuple[float, float]] = {
    "log": (0.1, 4.0),
    "sqrt": (0.1, 4.0),
    "rsqrt": (0.1, 4.0),
    "tan": (-1.2, 1.2),
    "exp": (-4.0, 4.0),
}


def _input_range(mode: PointwiseMode, position: int) -> tuple[float, float]:
    if mode is PointwiseMode.POW:
        return (0.2, 3.0) if position == 0 else (-2.0, 2.0)
    if mode in (PointwiseMode.DIV, PointwiseMode.MOD) and position == 1:
        return (0.5, 3.0)
    return _DOMAINS.get(mode.value, (-3.0, 3.0))


def run_pointwise(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    mode = PointwiseMode[sample.variant]
    inputs = []
    for position in range(mode.arity):
        low, high = _input_range(mode, position)
        inputs.append(t.input(sample.shape, sample.dtype, sample.layout, low, high))
    if mode.value.startswith("cmp"):  # make some elements equal
        inputs[1][..., ::2] = inputs[0][..., ::2]
    result = reference(mode, [t.values(x) for x in inputs], coef=1.5)
    y, expected = blend(sample, t, sample.shape, result.astype(np.float64))
    pointwise(handle, mode, sample.alpha, [(descriptor(x), x) for x in inputs], sample.beta, descriptor(y), y, coef=1.5)
    return checked(t, y, expected)


# Coefficients, alphas and betas are exact in float32: Triton's interpreter passes float scalars as
# float32, which would cost float64 samples about 1e-8 of accuracy (compiled kernels take float64).
_ACTIVATION_COEF = {"CLIPPED_RELU": 1.25, "ELU": 0.75, "SWISH": 1.375, "SOFTPLUS": 0.875}


def _activation(sample: Sample) -> tuple[ActivationDescriptor, float, bool]:
    name, _, propagation = sample.variant.partition("+")
    coef = _ACTIVATION_COEF.get(name, 0.0)
    propagate = propagation == "propagate_nan"
    nan_opt = NanPropagation.PROPAGATE_NAN if propagate else NanPropagation.NOT_PROPAGATE_NAN
    return ActivationDescriptor(ActivationMode[name], nan_opt, coef or None), coef, propagate


def run_activation_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    act, coef, propagate = _activation(sample)
    x = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    result = reference(act.forward_mode, [t.values(x)], act.coef or 0.0, propagate)
    y, expected = blend(sample, t, sample.shape, result)
    activation_forward(handle, act, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y)
    return checked(t, y, expected)


def run_activation_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    act, coef, propagate = _activation(sample)
    x = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    dy = t.input(sample.shape, sample.dtype, sample.layout)
    y = t.input(sample.shape, sample.dtype, "packed")  # the forward output: checked, not used
    result = reference(act.backward_mode, [t.values(dy), t.values(x)], act.coef or 0.0, propagate)
    dx, expected = blend(sample, t, sample.shape, result)
    activation_backward(
        handle,
        act,
        sample.alpha,
        descriptor(y),
        y,
        descriptor(dy),
        dy,
        descriptor(x),
        x,
        sample.beta,
        descriptor(dx),
        dx,
    )
    return checked(t, dx, expected)


def _broadcast_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Every dim but the second set to 1 (a per-channel tensor)."""
    return tuple(d if k == 1 else 1 for k, d in enumerate(shape)) if len(shape) > 1 else (1,)


def run_op_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    op = OpTensorOp[sample.variant]
    low = 0.1 if op is OpTensorOp.SQRT else -3.0
    a = t.input(sample.shape, sample.dtype, sample.layout, low)
    b = t.input(_broadcast_shape(sample.shape), sample.dtype, "packed")
    alpha1, alpha2 = 0.75, -1.5
    values = [alpha1 * t.values(a), alpha2 * t.values(b)][: op.value.arity]
    result = reference(op.value, values)
    c, expected = blend(sample, t, sample.shape, result.astype(np.float64))  # alpha stays 1: op_tensor has none
    compute = DataType.DOUBLE if sample.dtype is DataType.DOUBLE else DataType.FLOAT
    op_tensor(
        handle,
        OpTensorDescriptor(op, compute),
        alpha1,
        descriptor(a),
        a,
        alpha2,
        descriptor(b),
        b,
        sample.beta,
        descriptor(c),
        c,
    )
    return checked(t, c, expected)


def run_add_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    a = t.input(_broadcast_shape(sample.shape), sample.dtype, "packed")
    c, expected = blend(sample, t, sample.shape, np.broadcast_to(t.values(a), sample.shape))
    add_tensor(handle, sample.alpha, descriptor(a), a, sample.beta, descriptor(c), c)
    return checked(t, c, expected)


def run_scale_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    y = t.output(sample.shape, sample.dtype, sample.layout, t.rng.uniform(-3, 3, sample.shape))
    expected = sample.alpha * t.values(y)
    scale_tensor(handle, descriptor(y), y, sample.alpha)
    return checked(t, y, expected)


def run_set_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    y = t.output(sample.shape, sample.dtype, sample.layout, None)
    value = float(t.rng.uniform(-3, 3))
    expected = np.full(sample.shape, t.values(t.array(np.array(value), sample.dtype)))
    set_tensor(handle, descriptor(y), y, value)
    return checked(t, y, expected)


def run_transform_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    x = t.input(sample.shape, sample.dtype, "packed" if sample.variant == "layout" else sample.layout)
    y, expected = blend(sample, t, sample.shape, t.values(x))
    transform_tensor(handle, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y)
    return checked(t, y, expected)


def run_gen_index(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    axis = int(sample.variant.removeprefix("axis"))
    y = t.output(sample.shape, sample.dtype, sample.layout, None)
    expected = np.indices(sample.shape)[axis].astype(np.float64)
    gen_index(handle, axis, descriptor(y), y)
    return checked(t, y, expected)


# the table -------------------------------------------------------------------------------------

ACTIVATIONS = (
    "RELU",
    "RELU+propagate_nan",
    "CLIPPED_RELU",
    "CLIPPED_RELU+propagate_nan",
    "ELU",
    "GELU",
    "GELU_APPROX_TANH",
    "SIGMOID",
    "TANH",
    "SOFTPLUS",
    "SWISH",
    "IDENTITY",
)
PLAIN_MODES = tuple(m.name for m in PointwiseMode if not m.value.endswith(("_fwd", "_bwd")))


SHAPES = {"small": (2, 3, 4, 5), "large": (8, 64, 40, 48)}


def samples(size: str = "small") -> Iterator[Sample]:
    """The elementwise samples at SHAPES[size] (some use its leading dims only)."""
    shape = SHAPES[size]

    def sample(
        op: str, runner: Callable[..., Any], variant: str, dtype: DataType = DataType.FLOAT, **kw: Any
    ) -> Sample:
        return Sample(op, variant, dtype, kw.pop("shape", shape), runner=runner, **kw)

    for name, dtype, layout in itertools.product(ACTIVATIONS, FLOAT_TYPES, LAYOUTS):
        yield sample("activation_forward", run_activation_forward, name, dtype, layout=layout)
        yield sample("activation_backward", run_activation_backward, name, dtype, layout=layout)
    for name in ("RELU", "RELU+propagate_nan", "CLIPPED_RELU", "CLIPPED_RELU+propagate_nan"):
        yield sample("activation_forward", run_activation_forward, name, nan_inputs=True)
        yield sample("activation_backward", run_activation_backward, name, nan_inputs=True)
    for name in ("GELU", "SWISH"):
        yield sample("activation_forward", run_activation_forward, name, alpha=0.5, beta=-0.75, layout="subregion")
        yield sample("activation_backward", run_activation_backward, name, alpha=1.5, beta=0.25)
    for name, dtype in itertools.product(PLAIN_MODES, (DataType.FLOAT, DataType.BFLOAT16, DataType.DOUBLE)):
        yield sample("pointwise", run_pointwise, name, dtype)
    for name in ("ADD", "MUL", "CMP_LT", "BINARY_SELECT", "EXP"):
        yield sample("pointwise", run_pointwise, name, layout="permuted", alpha=2.0, beta=0.5)
        yield sample("pointwise", run_pointwise, name, DataType.HALF, layout="subregion")
    yield sample("pointwise", run_pointwise, "CMP_GE", out_dtype=DataType.BOOLEAN)
    for op, dtype in itertools.product(OpTensorOp, FLOAT_TYPES):
        yield sample("op_tensor", run_op_tensor, op.name, dtype, layout="permuted")
    yield sample("op_tensor", run_op_tensor, "ADD", beta=1.0, layout="subregion")
    for dtype in FLOAT_TYPES:
        yield sample("add_tensor", run_add_tensor, "bias", dtype, alpha=1.0, beta=1.0)
        yield sample("scale_tensor", run_scale_tensor, "scale", dtype, alpha=-0.625, layout="subregion")
        yield sample("set_tensor", run_set_tensor, "value", dtype, layout="permuted")
    yield sample("set_tensor", run_set_tensor, "value", DataType.INT32)
    for out_dtype, layout in itertools.product(FLOAT_TYPES, LAYOUTS):
        yield sample("transform_tensor", run_transform_tensor, "layout", out_dtype=out_dtype, layout=layout)
    yield sample(
        "transform_tensor",
        run_transform_tensor,
        "dtype",
        DataType.BFLOAT16,
        out_dtype=DataType.FLOAT,
        layout="subregion",
        alpha=2.0,
        beta=0.5,
    )
    yield sample("transform_tensor", run_transform_tensor, "dtype", DataType.INT32, out_dtype=DataType.FLOAT)
    for axis in range(len(shape)):
        yield sample("gen_index", run_gen_index, f"axis{axis}", DataType.INT64, layout="permuted")


def _over_shifted_x() -> dict[str, Any]:
    """activation_forward's arguments with y one element after x in one buffer: a partial overlap."""
    buffer = values(7)
    desc = TensorDescriptor("float32", (2, 3))
    return {
        "handle": create("cpu"),
        "act_desc": ActivationDescriptor(ActivationMode.RELU),
        "alpha": 1.0,
        "x_desc": desc,
        "x": buffer[:6],
        "beta": 0.0,
        "y_desc": desc,
        "y": buffer[1:],
    }


def error_samples() -> list[ErrorSample]:
    """Bad calls of the pointwise functions and their messages."""
    return [
        ErrorSample(
            "softplus beta inf",
            activation_functional.softplus,
            lambda: {"x": values(4), "beta": float("inf")},
            BadParam,
            "beta=inf must be finite",
        ),
        ErrorSample(
            "swish beta 0",
            activation_functional.swish,
            lambda: {"x": values(4), "beta": 0.0},
            BadParam,
            "beta=0.0 must be above 0: it is the beta of SWISH",
        ),
        ErrorSample(
            "clipped relu without its ceiling",
            lambda mode, x: functional.pointwise(mode, x),
            lambda: {"mode": PointwiseMode.CLIPPED_RELU_FWD, "x": values(4)},
            BadParam,
            "coef=None: CLIPPED_RELU needs its ceiling",
        ),
        ErrorSample(
            "activation mode out of range",
            ActivationDescriptor,
            lambda: {"mode": 5},
            BadParam,
            "mode=5 must be an ActivationMode: one of ActivationMode.SIGMOID",
        ),
        ErrorSample("y over a shifted x", activation_forward, _over_shifted_x, BadParam, "y and x overlap in memory"),
    ]
