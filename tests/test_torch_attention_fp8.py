"""The fp8 attention inside PyTorch: the ``opendnn::scaled_dot_product_attention_fp8`` operator and
its backward ``opendnn::scaled_dot_product_attention_fp8_backward`` against the family's float64
references with the same quantization steps (e4m3 and e5m2, an e5m2 grad_out with e4m3 data, out
and gradients in fp8, bfloat16 and float16, causal masks, a window, GQA, 3-dim inputs), outputs
poisoned or checked for NaN; their inputs left as they were (opcheck's other checks and the fake
kernels' shapes, dtypes and strides are test_torch_operators' samples), the gradient the forward
refuses and a call the backward refuses, with their messages."""

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.families.attention.reference import (
    Fp8BackwardScales,
    Fp8Scales,
    reference_backward_fp8,
    reference_forward,
    reference_forward_fp8,
)
from opendnn.torch.attention import scaled_dot_product_attention_fp8, scaled_dot_product_attention_fp8_backward

ops = torch.ops.opendnn
FACTORS = Fp8Scales(0.5, 0.75, 1.25, 1.0 / 448.0, 448.0, 2.0)
# (data dtype, out dtype, query shape, key shape, value shape, keywords, the family's parameters)
CASES = {
    "e4m3_gqa_causal": (
        torch.float8_e4m3fn,
        None,
        (2, 4, 9, 16),
        (2, 2, 13, 16),
        (2, 2, 13, 32),
        dict(is_causal=True, enable_gqa=True, scale=0.3),
        dict(causal=True, scale=0.3),
    ),
    "e5m2_bottom_right_window_bfloat16": (
        torch.float8_e5m2,
        torch.bfloat16,
        (1, 3, 11, 16),
        (1, 3, 7, 16),
        (1, 3, 7, 16),
        dict(is_causal=True, alignment="bottom_right", window=(3, None)),
        dict(causal=True, alignment="bottom_right", window=(3, None)),
    ),
    "e4m3_3d_bfloat16": (
        torch.float8_e4m3fn,
        torch.bfloat16,
        (3, 10, 16),
        (3, 12, 16),
        (3, 12, 16),
        {},
        {},
    ),
}


def fp8(dtype, shape, seed):
    return torch.from_numpy(np.random.default_rng(seed).uniform(-3.0, 3.0, shape)).to(dtype)


def factor_tensors(values=FACTORS):
    return {slot: torch.tensor([value], dtype=torch.float32) for slot, value in zip(Fp8Scales._fields, values)}


def batched(array, query):
    """An output of a 3-dim (heads, sequence, dim) query with the reference's batch dim of 1 in front."""
    return array if query.ndim == 4 else array[None]


@pytest.mark.parametrize("case", CASES)
def test_operator_matches_the_reference_with_the_same_quantization(case):
    dtype, out_dtype, q_shape, k_shape, v_shape, keywords, params = CASES[case]
    q, k, v = fp8(dtype, q_shape, 1), fp8(dtype, k_shape, 2), fp8(dtype, v_shape, 3)
    out, stats, amax_s, amax_o = scaled_dot_product_attention_fp8(
        q, k, v, **factor_tensors(), out_dtype=out_dtype, **keywords
    )
    out_dtype = out_dtype or dtype
    assert out.dtype == out_dtype and out.shape == (*q_shape[:-1], v_shape[-1])
    assert stats.dtype == amax_s.dtype == amax_o.dtype == torch.float32 and amax_s.shape == amax_o.shape == (1,)
    values = [batched(t.double().numpy(), q) for t in (q, k, v)]
    expected = reference_forward_fp8(
        od.AttentionDescriptor(**params), *values, FACTORS, od.DataType.of(dtype), od.DataType.of(out_dtype)
    )
    o = batched(out.double().numpy(), q)
    assert not np.isnan(o).any() and not np.isnan(stats.numpy()).any()
    error = np.linalg.norm(o - expected.o) / np.linalg.norm(expected.o)
    assert error <= (1e-4 if out_dtype.itemsize == 1 else 1e-2), error
    finite = np.isfinite(expected.lse)
    lse = batched(stats.double().numpy(), q)
    assert np.array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], expected.lse[finite], atol=1e-5)
    assert amax_s.item() == pytest.approx(expected.amax_s, rel=1e-5)
    assert amax_o.item() == pytest.approx(expected.amax_o, rel=1e-5)


def operator_arguments(out_dtype=torch.bfloat16):
    q, k = fp8(torch.float8_e4m3fn, (2, 4, 9, 16), 1), fp8(torch.float8_e4m3fn, (2, 2, 13, 16), 2)
    v = fp8(torch.float8_e4m3fn, (2, 2, 13, 32), 3)
    return (q, k, v, *factor_tensors().values(), True, 0.3, True, None, None, "top_left", out_dtype)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_the_operator_leaves_its_inputs_as_they_were(out_dtype):
    """What opcheck's test_schema checks, which fp8 inputs keep it from checking (test_torch_operators
    runs opcheck's other checks on a sample of the operator)."""
    arguments = operator_arguments(out_dtype)
    tensors = [a for a in arguments if isinstance(a, torch.Tensor)]
    before = [t.view(torch.uint8).clone() if t.dtype.itemsize == 1 else t.clone() for t in tensors]
    out, _, _, _ = ops.scaled_dot_product_attention_fp8(*arguments)
    assert out.dtype == out_dtype and not torch.isnan(out.float()).any()
    after = [t.view(torch.uint8) if t.dtype.itemsize == 1 else t for t in tensors]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_a_gradient_through_the_fp8_operator_is_refused_naming_fp8():
    q, k, v, *_ = operator_arguments()
    factors = factor_tensors()
    factors["scale_s"].requires_grad_()
    out, _, _, _ = scaled_dot_product_attention_fp8(q, k, v, **factors, enable_gqa=True, out_dtype=torch.bfloat16)
    assert out.grad_fn.name() == "ScaledDotProductAttentionFp8Backward"
    with pytest.raises(
        od.NotSupported,
        match=r"scaled_dot_product_attention_fp8 has no gradient: an fp8 training step needs scales the caller "
        r"manages .* call opendnn::scaled_dot_product_attention_fp8_backward",
    ):
        out.float().sum().backward()


# ---- the backward -------------------------------------------------------------------------------------

LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
# each case: the forward's case (the data, shapes and options), grad_out's dtype, the gradients' dtype
BACKWARD_CASES = {
    "e4m3_gqa_causal": ("e4m3_gqa_causal", torch.float8_e4m3fn, None),
    "e5m2_bottom_right_window_bfloat16": ("e5m2_bottom_right_window_bfloat16", torch.float8_e5m2, torch.bfloat16),
    "e4m3_3d_e5m2_grad_float16": ("e4m3_3d_bfloat16", torch.float8_e5m2, torch.float16),
}


def backward_factors(dtype, grad_dtype):
    """The twelve factors, as float32 holds them (the kernels load them so)."""
    scale_s, scale_dp = LARGEST[dtype], LARGEST[grad_dtype] / 16.0
    factors = (0.5, 0.75, 1.25, 0.8, 0.6, 1.0 / scale_s, 1.0 / scale_dp, scale_s, 2.0, 0.5, 4.0, scale_dp)
    return Fp8BackwardScales(*(float(np.float32(factor)) for factor in factors))


def backward_arguments(case):
    """(grad_out, query, key, value, out, stats), the factors and the reference's result of ``case``."""
    forward, grad_dtype, out_dtype = BACKWARD_CASES[case]
    dtype, _, q_shape, k_shape, v_shape, _, params = CASES[forward]
    q, k, v = fp8(dtype, q_shape, 4), fp8(dtype, k_shape, 5), fp8(dtype, v_shape, 6)
    out_shape = (*q_shape[:-1], v_shape[-1])
    out, grad_out = fp8(dtype, out_shape, 7), fp8(grad_dtype, out_shape, 8)
    factors = backward_factors(dtype, grad_dtype)
    values = [batched(t.double().numpy(), q) for t in (q, k, v, out, grad_out)]
    descriptor = od.AttentionDescriptor(**params)
    descaled = values[0] * (factors.descale_q * factors.descale_k)
    stats = torch.from_numpy(reference_forward(descriptor, descaled, *values[1:3])[1]).float().reshape(q_shape[:-1])
    dtypes = [od.DataType.of(t) for t in (dtype, grad_dtype, *(out_dtype or dtype,) * 3)]
    expected = reference_backward_fp8(descriptor, *values, factors, tuple(dtypes))
    return (grad_out, q, k, v, out, stats), factors, expected


@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_backward_operator_matches_the_reference_with_the_same_quantization(case):
    forward, _, out_dtype = BACKWARD_CASES[case]
    keywords = CASES[forward][5]
    tensors, factors, expected = backward_arguments(case)
    factor_keywords = {slot: torch.tensor([value]) for slot, value in zip(Fp8BackwardScales._fields, factors)}
    *gradients, amax_dq, amax_dk, amax_dv, amax_dp = scaled_dot_product_attention_fp8_backward(
        *tensors, **factor_keywords, grad_dtype=out_dtype, **keywords
    )
    out_dtype = out_dtype or tensors[1].dtype
    for ours, source, theirs in zip(gradients, tensors[1:4], expected[:3]):
        assert ours.dtype == out_dtype and ours.shape == source.shape
        values = batched(ours.double().numpy(), tensors[1])
        assert not np.isnan(values).any()
        error = np.linalg.norm(values - theirs) / np.linalg.norm(theirs)
        assert error <= (2e-3 if out_dtype.itemsize == 1 else 1e-2), error
    for ours, theirs in zip((amax_dq, amax_dk, amax_dv, amax_dp), expected[3:]):
        assert ours.dtype == torch.float32 and ours.shape == (1,)
        assert ours.item() == pytest.approx(theirs, rel=1e-5) and theirs > 0


def test_the_backward_operator_leaves_its_inputs_as_they_were():
    """What opcheck's test_schema checks, which fp8 inputs keep it from checking."""
    tensors, factors, _ = backward_arguments("e4m3_gqa_causal")
    arguments = (*tensors, *(torch.tensor([value]) for value in factors), True, 0.3, True, None, None, "top_left", None)
    inputs = [a for a in arguments if isinstance(a, torch.Tensor)]
    before = [t.view(torch.uint8).clone() if t.dtype.itemsize == 1 else t.clone() for t in inputs]
    gradients = ops.scaled_dot_product_attention_fp8_backward(*arguments)
    assert gradients[0].dtype == torch.float8_e4m3fn and not torch.isnan(gradients[0].float()).any()
    after = [t.view(torch.uint8) if t.dtype.itemsize == 1 else t for t in inputs]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


def test_the_backward_operator_refuses_a_grad_out_that_is_not_fp8():
    (grad_out, *tensors), factors, _ = backward_arguments("e4m3_gqa_causal")
    factor_keywords = {slot: torch.tensor([value]) for slot, value in zip(Fp8BackwardScales._fields, factors)}
    with pytest.raises(
        od.NotSupported,
        match=r"grad_out.dtype=bfloat16 must be float8_e4m3fn or float8_e5m2 for query.dtype=float8_e4m3fn",
    ):
        scaled_dot_product_attention_fp8_backward(
            grad_out.to(torch.bfloat16), *tensors, **factor_keywords, is_causal=True, enable_gqa=True
        )
