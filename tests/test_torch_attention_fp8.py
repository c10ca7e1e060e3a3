"""The fp8 attention forward inside PyTorch: the ``opendnn::scaled_dot_product_attention_fp8``
operator against the family's float64 reference with the same quantization steps (e4m3 and e5m2,
out in fp8 and bfloat16, causal masks, a window, GQA, 3-dim inputs), outputs checked for NaN; its
inputs left as they were (opcheck's other checks and the fake kernel's shapes, dtypes and strides
are test_torch_operators' sample), and the gradient it refuses."""

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.families.attention.reference import Fp8Scales, reference_forward_fp8
from opendnn.torch.attention import scaled_dot_product_attention_fp8

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
    with pytest.raises(od.NotSupported, match=r"opendnn::scaled_dot_product_attention_fp8 has no gradient: the fp8"):
        out.float().sum().backward()
