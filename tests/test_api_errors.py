"""Error samples: each bad call raises BadParam naming the parameter, its value and the rule, and
leaves the output untouched."""

import re

import numpy as np
import pytest

import opendnn as od
import opendnn.functional as F

H = od.create("cpu")
D = od.TensorDescriptor("float32", (2, 3))
D4 = od.TensorDescriptor("float32", (2, 4))
DD = od.TensorDescriptor("float64", (2, 3))
RELU = od.ActivationDescriptor(od.ActivationMode.RELU)


def ones(shape=(2, 3), dtype=np.float32):
    return np.ones(shape, dtype)


ERROR_SAMPLES = [
    (
        "dims differ",
        lambda y: od.activation_forward(H, RELU, 1.0, D4, ones((2, 4)), 0.0, D, y),
        "x_desc.dims[1]=4 must equal y_desc.dims[1]=3",
    ),
    (
        "backward dims differ",
        lambda y: od.activation_backward(H, RELU, 1.0, D, ones(), D4, ones((2, 4)), D, ones(), 0.0, D, y),
        "dy_desc.dims[1]=4 must equal x_desc.dims[1]=3",
    ),
    (
        "descriptor type",
        lambda y: od.activation_forward(H, "relu", 1.0, D, ones(), 0.0, D, y),
        "act_desc='relu' must be an ActivationDescriptor",
    ),
    (
        "clipped relu ceiling",
        lambda y: od.ActivationDescriptor(od.ActivationMode.CLIPPED_RELU, coef=0.0),
        "coef=0.0 must be above 0: it is the ceiling of CLIPPED_RELU",
    ),
    (
        "add_tensor broadcast",
        lambda y: od.add_tensor(H, 1.0, od.TensorDescriptor("float32", (2, 2)), ones((2, 2)), 0.0, D, y),
        "a_desc.dims[1]=2 must equal c_desc.dims[1]=3 or 1",
    ),
    (
        "op_tensor b",
        lambda y: od.op_tensor(
            H, od.OpTensorDescriptor(od.OpTensorOp.ADD), 1.0, D, ones(), 1.0, D4, ones((2, 4)), 0.0, D, y
        ),
        "b_desc.dims[1]=4 must equal c_desc.dims[1]=3 or 1",
    ),
    (
        "op_tensor compute type",
        lambda y: od.OpTensorDescriptor(od.OpTensorOp.ADD, od.DataType.HALF),
        "compute_type=HALF must be FLOAT or DOUBLE",
    ),
    (
        "op_tensor float arithmetic of double tensors",
        lambda y: od.op_tensor(
            H, od.OpTensorDescriptor(od.OpTensorOp.MUL), 1.0, DD, ones(dtype=np.float64), 1.0, D, ones(), 0.0, D, y
        ),
        "op_desc.compute_type=FLOAT must be DOUBLE for DOUBLE tensors (a_desc.dtype=DOUBLE)",
    ),
    (
        "arity",
        lambda y: od.pointwise(H, od.PointwiseMode.ADD, 1.0, [(D, ones())], 0.0, D, y),
        "mode=ADD takes 2 inputs, got 1",
    ),
    (
        "dtype mismatch",
        lambda y: od.scale_tensor(H, D, np.ones((2, 3)), 2.0),
        "y.dtype=float64 must equal y_desc.dtype=float32",
    ),
    (
        "past the buffer",
        lambda y: od.transform_tensor(H, 1.0, D, ones((5,)), 0.0, D, y),
        "x_desc reaches 6 elements but x holds 5 from its start",
    ),
    (
        "non-finite alpha",
        lambda y: od.transform_tensor(H, float("inf"), D, ones(), 0.0, D, y),
        "alpha=inf must be finite",
    ),
    ("gen_index axis", lambda y: od.gen_index(H, 2, D, y), "axis=2 must be in [-2, 2)"),
    ("broadcast", lambda y: F.add(ones((2, 3)), ones((4,))), "a.shape=(2, 3), b.shape=(4,) do not broadcast together"),
]


@pytest.mark.parametrize("what, call, message", ERROR_SAMPLES, ids=[s[0] for s in ERROR_SAMPLES])
def test_bad_input_names_parameter_and_leaves_output_alone(what, call, message):
    y = np.full((2, 3), 7.0, np.float32)
    with pytest.raises(od.BadParam, match=re.escape(message)):
        call(y)
    np.testing.assert_array_equal(y, 7.0)


def test_triton_on_cpu_without_interpreter_is_not_supported(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    handle = od.create("cpu", backend="triton")
    with pytest.raises(od.NotSupported, match="set TRITON_INTERPRET=1"):
        od.scale_tensor(handle, D, ones(), 2.0)
