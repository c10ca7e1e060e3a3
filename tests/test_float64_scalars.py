"""Float scalars reach the Triton kernels exactly: float64 work with alpha, beta, coefficients,
epsilon, momentum, LRN's parameters and scales that float32 cannot hold matches the float64
reference to a relative 1e-14, where a scalar rounded to float32 costs up to 3e-8 (the least:
normalization's epsilon 1e-5 against a variance near 3, 2.5e-14). Under Triton's interpreter a float kernel argument is
a Python float that the kernel would round to float32 wherever it assigns or casts it; the
launches pass it as a float64 scalar (kernels/launch.py)."""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import opendnn as od
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.batch_norm import samples as batch_norm
from opendnn.families.convolution import samples as convolution
from opendnn.families.lrn import samples as lrn
from opendnn.families.matmul import samples as matmul_samples
from opendnn.families.matmul.api import MatmulEpilogue, matmul
from opendnn.families.matmul.problem import reference as matmul_reference
from opendnn.families.pointwise import samples as elementwise
from opendnn.families.pointwise.problem import PointwiseMode
from opendnn.kernels.launch import Launch, Slot
from opendnn.samples import relative_error, samples

ALPHA, BETA = 1 / 3, 0.1  # neither is a float32 value
TOLERANCE = 1e-14

# (module of the sample table, name, value): each family scalar of the samples, made a value that
# float32 cannot hold
FAMILY_SCALARS = (
    (elementwise, "_ACTIVATION_COEF", {"CLIPPED_RELU": 1.1, "ELU": 0.1, "SWISH": 1 / 3, "SOFTPLUS": 0.7}),
    (batch_norm, "EPSILON", 0.01 / 3),
    (batch_norm, "FACTOR", 0.1),  # the running statistics' momentum
    (batch_norm, "CEILING", 1.1),
    (lrn, "LRN_BETA", 0.7),
    (lrn, "LRN_K", 1 / 3),
    (matmul_samples, "COEF", {"clipped_relu_fwd": 1.1, "elu_fwd": 0.1, "swish_fwd": 1 / 3, "softplus_fwd": 0.7}),
    (convolution, "ALPHA2", 0.1),
    (
        convolution,
        "_ACTIVATIONS",
        {
            **convolution._ACTIVATIONS,
            "CLIPPED_RELU": (PointwiseMode.CLIPPED_RELU_FWD, 1.1),
            "SWISH": (PointwiseMode.SWISH_FWD, 1 / 3),
        },
    ),
)

# (op, variant) of the sample table, run in float64 with alpha = ALPHA and beta = BETA
BLENDED = (
    *(
        (op, name)
        for op in ("activation_forward", "activation_backward")
        for name in ("CLIPPED_RELU", "ELU", "SWISH", "SOFTPLUS", "GELU")
    ),
    ("pointwise", "ADD"),
    ("add_tensor", "bias"),
    ("scale_tensor", "scale"),
    ("transform_tensor", "layout"),
    ("reduce_tensor", "ADD/0,2,3"),
    ("reduce_tensor", "AVG/0,2,3"),
    ("reduce_tensor", "NORM2/0,1,2,3"),
    *(
        (op, variant)
        for op in ("softmax_forward", "softmax_backward")
        for variant in ("ACCURATE/CHANNEL", "LOG/INSTANCE", "FAST/INSTANCE")
    ),
    ("bn_forward_training", "SPATIAL/BN"),
    ("bn_forward_training", "PER_ACTIVATION/BN"),
    ("bn_forward_training", "SPATIAL_PERSISTENT/BN"),
    ("bn_forward_training", "SPATIAL/BN_ACTIVATION+clipped_relu"),
    ("bn_forward_inference", "SPATIAL/BN"),
    ("bn_backward", "SPATIAL/BN"),
    ("bn_backward", "PER_ACTIVATION/BN/nosaved"),
    ("bn_backward", "SPATIAL/BN_ACTIVATION+clipped_relu"),
    *(
        (op, f"{mode}/k3x3-s2x2-p1x1")
        for op in ("pooling_forward", "pooling_backward")
        for mode in ("MAX", "AVERAGE_COUNT_INCLUDE_PADDING", "AVERAGE_COUNT_EXCLUDE_PADDING")
    ),
    ("lrn_cross_channel_forward", "n5"),
    ("lrn_cross_channel_backward", "n5"),
    ("divisive_normalization_forward", "n3+means"),
    ("divisive_normalization_backward", "n3+means"),
    *(
        (op, variant)
        for op in ("normalization_forward_training", "normalization_forward_inference", "normalization_backward")
        for variant in ("LAYER_NORM/2", "RMS_NORM/1", "GROUP_NORM/3")
    ),
    ("normalization_backward", "GROUP_NORM/2+recompute"),
    ("matmul", "plain"),
    ("matmul", "bias_col+swish_fwd+residual"),
    ("matmul", "bias_col+elu_fwd"),
    ("matmul", "bias_row+clipped_relu_fwd"),
    ("matmul", "bias_row+softplus_fwd"),
    ("convolution_forward", "2d_stride_dilation/IMPLICIT_GEMM"),
    ("convolution_forward", "2d_depthwise/DIRECT"),
    ("convolution_backward_data", "2d_stride_dilation/ALGO_0"),
    ("convolution_backward_data", "2d_stride_dilation/ALGO_1"),
    ("convolution_backward_filter", "2d_stride_dilation/ALGO_0"),
    ("convolution_backward_filter", "2d_stride_dilation/ALGO_1"),
    ("convolution_bias_activation_forward", "2d/IMPLICIT_GEMM/bias+CLIPPED_RELU+z=y"),
    ("convolution_bias_activation_forward", "2d/IMPLICIT_GEMM/bias+SWISH+z=y"),
    ("convolution_backward_bias", "2d/none"),
)
BETA_ONLY = (("op_tensor", "ADD"), ("op_tensor", "MUL"))  # op_tensor has no alpha (alpha1 and alpha2 below)


def _float64_samples():
    table = {(s.op, s.variant): s for s in reversed(list(samples()))}  # the first sample of each
    for (op, variant), alpha in [(case, ALPHA) for case in BLENDED] + [(case, 1.0) for case in BETA_ONLY]:
        yield dataclasses.replace(table[op, variant], dtype=DataType.DOUBLE, out_dtype=None, alpha=alpha, beta=BETA)


SAMPLES = list(_float64_samples())


@pytest.fixture
def family_scalars(monkeypatch):
    for module, name, value in FAMILY_SCALARS:
        monkeypatch.setattr(module, name, value)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_float64_sample_with_scalars_float32_cannot_hold_matches_the_reference(sample, family_scalars):
    actual, expected = sample.run(od.create("cpu", backend="triton"), seed=zlib.crc32(sample.name.encode()))
    error = relative_error(actual, expected)
    assert error <= TOLERANCE, f"relative error {error:.3g} above {TOLERANCE:g}"


def _descriptor(array: torch.Tensor) -> od.TensorDescriptor:
    return od.TensorDescriptor(array.dtype, array.shape, array.stride())


def test_matmul_scales_reach_the_kernel_exactly():
    rng = np.random.default_rng(7)
    a, b = (torch.from_numpy(rng.uniform(-1, 1, shape)) for shape in ((13, 9), (9, 11)))
    c = torch.full((13, 11), float("nan"), dtype=torch.float64)
    matmul(
        od.create("cpu", backend="triton"),
        ALPHA,
        _descriptor(a),
        a,
        _descriptor(b),
        b,
        0.0,
        _descriptor(c),
        c,
        MatmulEpilogue(a_scale=BETA, b_scale=0.7),
    )
    expected = ALPHA * matmul_reference(a.numpy(), b.numpy(), scale=BETA * 0.7)
    assert relative_error(c.numpy(), expected) <= TOLERANCE


def test_op_tensor_input_scales_reach_the_kernel_exactly():
    rng = np.random.default_rng(8)
    a, b = (torch.from_numpy(rng.uniform(-3, 3, (2, 3, 4, 5))) for _ in range(2))
    c = torch.full_like(a, float("nan"))
    op = od.OpTensorDescriptor(od.OpTensorOp.ADD, DataType.DOUBLE)
    od.op_tensor(
        od.create("cpu", backend="triton"),
        op,
        ALPHA,
        _descriptor(a),
        a,
        BETA,
        _descriptor(b),
        b,
        0.0,
        _descriptor(c),
        c,
    )
    assert relative_error(c.numpy(), ALPHA * a.numpy() + BETA * b.numpy()) <= TOLERANCE


@triton.jit
def _scaled_kernel(x_ptr, y_ptr, alpha: tl.float64, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    scale = alpha  # an assignment: the interpreter's to_tensor, a float32 of a Python float
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets) * tl.cast(scale, tl.float64))


@triton.jit
def _unannotated_kernel(x_ptr, alpha, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), alpha)


def test_a_launch_passes_a_float64_parameter_its_exact_value():
    x = torch.from_numpy(np.random.default_rng(9).uniform(1, 2, 16))
    y = torch.full_like(x, float("nan"))
    Launch(_scaled_kernel, (1,), (Slot("x"), Slot("y"), ALPHA), {"BLOCK": 16})({"x": x, "y": y})
    assert torch.equal(y, x * ALPHA)


@triton.jit
def _float32_kernel(x_ptr, alpha: tl.float32, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.float32) + alpha)


def test_a_float32_parameter_takes_the_float_rounded_to_float32():
    x = torch.full((16,), float("nan"), dtype=torch.float32)
    Launch(_float32_kernel, (1,), (Slot("x"), ALPHA), {"BLOCK": 16})({"x": x})
    assert torch.equal(x, torch.full((16,), ALPHA, dtype=torch.float32))


def test_a_float_for_an_unannotated_parameter_is_refused():
    with pytest.raises(
        InternalError,
        match=r"_unannotated_kernel: the float alpha=0\.1 needs a parameter annotated "
        r"tl\.float64 or tl\.float32 \(Triton compiles an unannotated float as a float32\)",
    ):
        Launch(_unannotated_kernel, (1,), (Slot("x"), BETA), {"BLOCK": 16})
