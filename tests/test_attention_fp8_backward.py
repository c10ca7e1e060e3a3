"""The fp8 attention backward (cuDNN's fp8 SDPA backward) on the NumPy backend and on the Triton
kernels through the interpreter, against the float64 reference with the same quantization steps (P
and dS rounded to fp8 with their scales): e4m3 and e5m2 data, dO of either type, gradients in fp8
and in 16 bits, causal and not, GQA, odd lengths, outputs and maxima poisoned with NaN; and the
calls the fp8 backward refuses, with their messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.attention.api import attention_backward
from opendnn.families.attention.problem import FP8_BACKWARD_AMAX, FP8_BACKWARD_SCALES, attention_problem
from opendnn.families.attention.reference import Fp8BackwardScales, reference_backward_fp8, reference_forward
from opendnn.functional import scaled_dot_product_attention_backward

LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
CASES = [  # (data dtype, dO dtype, gradients' dtype, (B, Hq, Hkv, Sq, Skv, D, Dv), descriptor fields)
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e4m3fn, (2, 4, 2, 37, 45, 32, 32), dict(causal=True)),
    (torch.float8_e5m2, torch.float8_e5m2, torch.float8_e5m2, (1, 3, 1, 19, 70, 16, 24), {}),
    (torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, (2, 2, 2, 33, 17, 32, 16), dict(causal=True)),
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float16, (1, 4, 2, 50, 50, 64, 64), dict(window=(9, 3))),
]


def _descriptor(array):
    return od.TensorDescriptor(od.DataType.of(array.dtype), tuple(array.shape), tuple(array.stride()))


def _factors(dtype, grad_dtype):
    scale_s, scale_dp = LARGEST[dtype], LARGEST[grad_dtype] / 16.0
    factors = (0.5, 0.75, 1.25, 0.8, 0.6, 1.0 / scale_s, 1.0 / scale_dp, scale_s, 2.0, 0.5, 4.0, scale_dp)
    return Fp8BackwardScales(*(float(np.float32(factor)) for factor in factors))  # as the kernels load them


def _keywords(arrays):
    return {key: value for slot, a in arrays.items() for key, value in ((f"{slot}_desc", _descriptor(a)), (slot, a))}


def _backward(backend, dtype, grad_dtype, out_dtype, shape, fields, seed=0):
    """(dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp) of attention_backward on ``backend`` and the
    reference's, from random fp8 q, k, v, o and dO and the forward's stats."""
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = shape
    rng = np.random.default_rng(seed)

    def data(*dims, dtype=dtype):
        return torch.from_numpy(rng.uniform(-3.0, 3.0, dims)).to(dtype)

    q, k, v = (
        data(batch, heads_q, seq_q, dim),
        data(batch, heads_kv, seq_kv, dim),
        data(batch, heads_kv, seq_kv, value_dim),
    )
    o, do = data(batch, heads_q, seq_q, value_dim), data(batch, heads_q, seq_q, value_dim, dtype=grad_dtype)
    factors = _factors(dtype, grad_dtype)
    params = od.AttentionDescriptor(**fields)
    values = [x.double().numpy() for x in (q, k, v, o, do)]
    descaled = values[0] * (factors.descale_q * factors.descale_k)
    stats = torch.from_numpy(reference_forward(params, descaled, values[1], values[2])[1]).float()
    gradients = [torch.full(x.shape, float("nan")).to(out_dtype) for x in (q, k, v)]
    arrays = {slot: torch.tensor([value], dtype=torch.float32) for slot, value in zip(FP8_BACKWARD_SCALES, factors)}
    arrays |= {slot: torch.full((1,), float("nan")) for slot in FP8_BACKWARD_AMAX}
    tensors = [item for array in (q, k, v, o, do, stats, *gradients) for item in (_descriptor(array), array)]
    attention_backward(od.Handle(backend=backend), params, *tensors, **_keywords(arrays))
    dtypes = [od.DataType.of(t) for t in (dtype, grad_dtype, out_dtype, out_dtype, out_dtype)]
    expected = reference_backward_fp8(params, *values, factors, tuple(dtypes))
    actual = (*(g.double().numpy() for g in gradients), *(arrays[slot].item() for slot in FP8_BACKWARD_AMAX))
    return actual, expected


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("dtype, grad_dtype, out_dtype, shape, fields", CASES)
def test_fp8_backward_matches_reference_with_the_same_quantization(
    backend, dtype, grad_dtype, out_dtype, shape, fields
):
    actual, expected = _backward(backend, dtype, grad_dtype, out_dtype, shape, fields)
    for ours, theirs in zip(actual[:3], expected[:3]):
        error = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
        # the float32 kernels and the float64 reference round the same numbers to fp8, but for a rare
        # one within float32's error of a rounding boundary
        assert error <= (2e-3 if out_dtype in LARGEST else 1e-2), error
    for ours, theirs in zip(actual[3:], expected[3:]):
        assert ours == pytest.approx(theirs, rel=1e-5)


def test_functional_fp8_backward_returns_gradients_and_maxima():
    rng = np.random.default_rng(3)
    q, k, v, o, do = (
        torch.from_numpy(rng.uniform(-2.0, 2.0, (1, 2, 20, 16))).to(torch.float8_e4m3fn) for _ in range(5)
    )
    factors = _factors(torch.float8_e4m3fn, torch.float8_e4m3fn)
    params = od.AttentionDescriptor(causal=True)
    values = [x.double().numpy() for x in (q, k, v, o, do)]
    descaled = values[0] * (factors.descale_q * factors.descale_k)
    stats = torch.from_numpy(reference_forward(params, descaled, values[1], values[2])[1]).float()
    keywords = dict(factors._asdict(), descale_q=torch.tensor([factors.descale_q]))  # an array and numbers
    *gradients, amax_dq, amax_dk, amax_dv, amax_dp = scaled_dot_product_attention_backward(
        do, q, k, v, o, stats, is_causal=True, grad_dtype=torch.bfloat16, return_amax=True, **keywords
    )
    fp8, bf16 = od.DataType.FP8_E4M3, od.DataType.BFLOAT16
    expected = reference_backward_fp8(params, *values, factors, (fp8, fp8, bf16, bf16, bf16))
    for ours, theirs in zip(gradients, expected[:3]):
        assert ours.dtype == torch.bfloat16
        assert np.linalg.norm(ours.double().numpy() - theirs) <= 1e-2 * np.linalg.norm(theirs)
    for ours, theirs in zip((amax_dq, amax_dk, amax_dv, amax_dp), expected[3:]):
        assert ours.item() == pytest.approx(theirs, rel=1e-6) and theirs > 0


def _backward_call(**changes):
    q = torch.zeros(1, 2, 8, 16).to(torch.float8_e4m3fn)
    return dict(grad_out=q, query=q, key=q, value=q, out=q, stats=torch.zeros(1, 2, 8)) | changes


FP8 = "query.dtype=float8_e4m3fn"
REFUSALS = [
    (dict(softcap=5.0), NotSupported, f"attention parameters.softcap=5.0 with {FP8} is not supported"),
    (dict(dropout_p=0.1), NotSupported, f"attention parameters.dropout_p=0.1 with {FP8}"),
    (dict(attn_mask=torch.ones(8, 8)), NotSupported, f"attn_mask with {FP8} is not supported"),
    (dict(sinks=torch.zeros(2)), NotSupported, f"sinks with {FP8} is not supported"),
    (dict(grad_dtype=torch.float32), NotSupported, "grad_query.dtype=float32 must be float8_e4m3fn, float8_e5m2"),
    (dict(grad_out=torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)), NotSupported, "grad_out.dtype=bfloat16 must be"),
    (dict(scale_dp=torch.ones(2)), BadParam, "scale_dp.shape=[2] must hold one element"),
    (dict(descale_dp=torch.ones(1, dtype=torch.float16)), NotSupported, "descale_dp.dtype=float16 must be float32"),
]


@pytest.mark.parametrize("changes, error, message", REFUSALS)
def test_fp8_backward_refusals_name_the_parameter(changes, error, message):
    with pytest.raises(error) as raised:
        scaled_dot_product_attention_backward(**_backward_call(**changes))
    assert message in str(raised.value)


def test_fp8_backward_takes_no_forward_factor_and_needs_its_own():
    q = od.TensorDescriptor(od.DataType.FP8_E4M3, (1, 2, 8, 16))
    stats = od.TensorDescriptor(od.DataType.FLOAT, (1, 2, 8))
    one = od.TensorDescriptor(od.DataType.FLOAT, (1,))
    factors = {f"{slot}_desc": one for slot in FP8_BACKWARD_SCALES}
    handle, params = od.Handle(backend="numpy"), od.AttentionDescriptor()
    assert od.get_attention_backward_workspace_size(handle, params, q, q, q, q, q, stats, q, q, q, **factors) == 0
    slots = {slot: one for slot in FP8_BACKWARD_SCALES} | dict(stats=stats, do=q, dq=q, dk=q, dv=q, scale_o=one)
    with pytest.raises(BadParam, match=r"scale_o_desc is given but the fp8 backward does not take it"):
        attention_problem(params, q, q, q, q, **slots)
    del factors["scale_dv_desc"]
    with pytest.raises(BadParam, match=r"scale_dv_desc=None but the backward of q_desc.dtype=FP8_E4M3 needs it"):
        od.get_attention_backward_workspace_size(handle, params, q, q, q, q, q, stats, q, q, q, **factors)
