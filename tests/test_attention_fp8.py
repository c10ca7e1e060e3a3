"""The fp8 attention forward (cuDNN's fp8 SDPA) on the NumPy backend and on the Triton kernel through
the interpreter, against the float64 reference with the same quantization steps: e4m3 and e5m2, o in
fp8 and in bfloat16, causal and not, GQA, odd lengths, outputs and maxima poisoned with NaN; and the
calls the fp8 forward refuses, with their messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.attention.api import attention_forward, get_attention_forward_workspace_size
from opendnn.families.attention.problem import FP8_AMAX, FP8_SCALES
from opendnn.families.attention.reference import Fp8Scales, reference_forward, reference_forward_fp8
from opendnn.functional import scaled_dot_product_attention

LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
CASES = [  # (data dtype, o dtype, (B, Hq, Hkv, Sq, Skv, D, Dv), descriptor fields)
    (torch.float8_e4m3fn, torch.float8_e4m3fn, (2, 4, 2, 37, 45, 32, 32), dict(causal=True)),
    (torch.float8_e5m2, torch.float8_e5m2, (1, 3, 1, 19, 70, 16, 24), {}),
    (torch.float8_e4m3fn, torch.bfloat16, (2, 2, 2, 33, 17, 32, 16), dict(causal=True, alignment="bottom_right")),
    (torch.float8_e5m2, torch.float16, (1, 4, 2, 50, 50, 64, 64), dict(window=(9, 3))),
]


def _descriptor(array):
    return od.TensorDescriptor(od.DataType.of(array.dtype), tuple(array.shape), tuple(array.stride()))


def _forward(backend, dtype, out_dtype, shape, fields, factors, seed=0):
    """(o, stats, amax_s, amax_o) of attention_forward on ``backend`` and the reference's."""
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = shape
    rng = np.random.default_rng(seed)

    def data(*dims):
        return torch.from_numpy(rng.uniform(-3.0, 3.0, dims)).to(dtype)

    q, k, v = (
        data(batch, heads_q, seq_q, dim),
        data(batch, heads_kv, seq_kv, dim),
        data(batch, heads_kv, seq_kv, value_dim),
    )
    o = torch.full((batch, heads_q, seq_q, value_dim), float("nan")).to(out_dtype)
    stats = torch.full((batch, heads_q, seq_q), float("nan"))
    arrays = {slot: torch.tensor([value], dtype=torch.float32) for slot, value in zip(FP8_SCALES, factors)}
    arrays |= {slot: torch.full((1,), float("nan")) for slot in FP8_AMAX}
    keywords = {
        key: value for slot, a in arrays.items() for key, value in ((f"{slot}_desc", _descriptor(a)), (slot, a))
    }
    params = od.AttentionDescriptor(**fields)
    tensors = [item for array in (q, k, v, o) for item in (_descriptor(array), array)]
    attention_forward(
        od.Handle(backend=backend), params, *tensors, stats_desc=_descriptor(stats), stats=stats, **keywords
    )
    values = (q.double().numpy(), k.double().numpy(), v.double().numpy())
    expected = reference_forward_fp8(params, *values, factors, od.DataType.of(dtype), od.DataType.of(out_dtype))
    actual = (o.double().numpy(), stats.double().numpy(), arrays["amax_s"].item(), arrays["amax_o"].item())
    return actual, expected, values, params


def _factors(dtype, scale_s=None):
    scale_s = LARGEST[dtype] if scale_s is None else scale_s
    return Fp8Scales(0.5, 0.75, 1.25, 1.0 / scale_s, scale_s, 2.0)


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("dtype, out_dtype, shape, fields", CASES)
def test_fp8_forward_matches_reference_with_the_same_quantization(backend, dtype, out_dtype, shape, fields):
    (o, stats, amax_s, amax_o), expected, _, _ = _forward(backend, dtype, out_dtype, shape, fields, _factors(dtype))
    error = np.linalg.norm(o - expected.o) / np.linalg.norm(expected.o)
    # fp8 o: the float32 kernel and the float64 reference round the same numbers, but for a rare one
    # that lies within float32's error of a rounding boundary (o near 0, where sums cancel)
    assert error <= (1e-4 if out_dtype in LARGEST else 1e-2), error
    if out_dtype in LARGEST:
        assert np.mean(o != expected.o) <= 0.01
    finite = np.isfinite(expected.lse)
    assert np.array_equal(np.isfinite(stats), finite) and np.allclose(stats[finite], expected.lse[finite], atol=1e-5)
    assert amax_s == pytest.approx(expected.amax_s, rel=1e-5) and amax_o == pytest.approx(expected.amax_o, rel=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_fp8_forward_rounds_p_as_the_reference_does(backend):
    """With scale_s 1/16, P / 16 takes few fp8 values (most are subnormal): the result follows the
    reference's rounding of P, and is far from the unrounded softmax's."""
    dtype, shape = torch.float8_e4m3fn, (1, 2, 2, 24, 40, 32, 32)
    factors = _factors(dtype, scale_s=0.0625)
    (o, _, _, _), expected, values, params = _forward(backend, dtype, torch.bfloat16, shape, {}, factors)
    unrounded, _ = reference_forward(params.__class__(scale=(1 / np.sqrt(32)) * 0.5 * 0.75), *values)
    unrounded = unrounded * 1.25 * 2.0
    assert np.linalg.norm(o - expected.o) / np.linalg.norm(expected.o) <= 1e-2
    assert np.linalg.norm(unrounded - expected.o) / np.linalg.norm(expected.o) >= 0.05


def test_functional_fp8_returns_out_stats_and_maxima():
    rng = np.random.default_rng(1)
    q = torch.from_numpy(rng.uniform(-3, 3, (2, 4, 20, 32))).to(torch.float8_e4m3fn)
    k = torch.from_numpy(rng.uniform(-3, 3, (2, 2, 24, 32))).to(torch.float8_e4m3fn)
    out, stats, amax_s, amax_o = scaled_dot_product_attention(
        q,
        k,
        k,
        is_causal=True,
        enable_gqa=True,
        scale_s=448.0,
        descale_s=torch.tensor([1 / 448]),
        out_dtype=torch.bfloat16,
        return_stats=True,
        return_amax=True,
        handle=od.Handle(backend="numpy"),
    )
    factors = Fp8Scales(1.0, 1.0, 1.0, 1 / 448, 448.0, 1.0)
    values = [x.double().numpy() for x in (q, k, k)]
    expected = reference_forward_fp8(
        od.AttentionDescriptor(causal=True), *values, factors, od.DataType.FP8_E4M3, od.DataType.BFLOAT16
    )
    assert out.dtype == torch.bfloat16 and stats.shape == (2, 4, 20) and amax_s.shape == amax_o.shape == (1,)
    assert np.linalg.norm(out.double().numpy() - expected.o) / np.linalg.norm(expected.o) <= 1e-2
    assert amax_s.item() == pytest.approx(expected.amax_s, rel=1e-6) == 1.0  # query 0 sees key 0 alone
    assert amax_o.item() == pytest.approx(expected.amax_o, rel=1e-6)


def _fp8_call(**changes):
    q = torch.zeros(1, 2, 8, 16).to(torch.float8_e4m3fn)
    return dict(query=q, key=q, value=q) | changes


FP8 = "query.dtype=float8_e4m3fn"
FLOATS = dict(query=torch.zeros(1, 2, 8, 16), key=torch.zeros(1, 2, 8, 16), value=torch.zeros(1, 2, 8, 16))
REFUSALS = [
    (dict(softcap=5.0), NotSupported, f"attention parameters.softcap=5.0 with {FP8} is not supported"),
    (dict(dropout_p=0.1), NotSupported, f"attention parameters.dropout_p=0.1 with {FP8}"),
    (dict(attn_mask=torch.ones(8, 8, dtype=torch.bool)), NotSupported, f"attn_mask with {FP8} is not supported"),
    (dict(sinks=torch.zeros(2)), NotSupported, f"sinks with {FP8} is not supported"),
    (dict(alibi_slopes=torch.zeros(2)), NotSupported, f"alibi_slopes with {FP8}"),
    (dict(out_dtype=torch.float32), NotSupported, "out.dtype=float32 must be float8_e4m3fn, float8_e5m2, bfloat16"),
    (dict(descale_q=torch.ones(2)), BadParam, "descale_q.shape=[2] must hold one element"),
    (dict(scale_o=torch.ones(1, dtype=torch.float16)), NotSupported, "scale_o.dtype=float16 must be float32"),
    (dict(**FLOATS, descale_v=2.0), BadParam, "descale_v is given but query.dtype=float32 is not"),
]


@pytest.mark.parametrize("changes, error, message", REFUSALS)
def test_fp8_refusals_name_the_parameter(changes, error, message):
    with pytest.raises(error) as raised:
        scaled_dot_product_attention(**_fp8_call(**changes))
    assert message in str(raised.value)


def test_an_fp8_forward_reports_the_values_copy_the_warp_specialized_kernel_takes():
    """v^T of (2, 3, 37, 64) e4m3 values, rows of 37 keys padded to 48: 2 * 3 * 64 * 48 bytes; the
    same forward in bfloat16 takes none, and the NumPy backend none."""
    q = od.TensorDescriptor(od.DataType.FP8_E4M3, (2, 3, 37, 64))
    out = od.TensorDescriptor(od.DataType.BFLOAT16, (2, 3, 37, 64))
    one = od.TensorDescriptor(od.DataType.FLOAT, (1,))
    factors = {f"{slot}_desc": one for slot in FP8_SCALES}
    params = od.AttentionDescriptor()
    triton_handle = od.create("cpu", backend="triton")
    assert get_attention_forward_workspace_size(triton_handle, params, q, q, q, out, **factors) == 2 * 3 * 64 * 48
    wide = od.TensorDescriptor(od.DataType.BFLOAT16, (2, 3, 37, 64))
    assert get_attention_forward_workspace_size(triton_handle, params, wide, wide, wide, out) == 0
    numpy_handle = od.create("cpu", backend="numpy")
    assert get_attention_forward_workspace_size(numpy_handle, params, q, q, q, out, **factors) == 0


def test_fp8_api_requires_every_factor_of_its_direction():
    q = od.TensorDescriptor(od.DataType.FP8_E4M3, (1, 2, 8, 16))
    one = od.TensorDescriptor(od.DataType.FLOAT, (1,))
    factors = {f"{slot}_desc": one for slot in FP8_SCALES if slot != "scale_s"}
    handle, params = od.Handle(backend="numpy"), od.AttentionDescriptor()
    with pytest.raises(BadParam, match=r"scale_s_desc=None but the forward of q_desc.dtype=FP8_E4M3 needs it"):
        get_attention_forward_workspace_size(handle, params, q, q, q, q, **factors)
    with pytest.raises(BadParam, match=r"descale_q_desc=None but the backward of q_desc.dtype=FP8_E4M3 needs it"):
        od.get_attention_backward_workspace_size(
            handle, params, q, q, q, q, q, od.TensorDescriptor("float32", (1, 2, 8)), q, q, q
        )
