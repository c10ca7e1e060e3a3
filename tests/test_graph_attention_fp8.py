"""The graph API's fp8 attention (``sdpa_fp8`` and ``sdpa_fp8_backward``) on the reference engine
(NumPy) and on the fused engine (Triton, through its interpreter), against the attention family's
float64 reference with the same quantization steps: e4m3 and e5m2, o and the gradients in fp8,
bfloat16 and float16, causal masks, a sliding window, padding masks, BSHD strides; outputs poisoned
with NaN; inference with virtual maxima, serialized graphs rebuilt and run, and the refusals with
their messages."""

import numpy as np
import pytest
import torch
from graph_helpers import build, kernel_cache  # noqa: F401

import opendnn as od
import opendnn.graph as og
from opendnn.families.attention.problem import FP8_BACKWARD_SCALES
from opendnn.families.attention.reference import (
    Fp8BackwardScales,
    Fp8Scales,
    reference_backward_fp8,
    reference_forward,
    reference_forward_fp8,
)

ENGINES = ["reference", "fused"]
BATCH, HEADS_Q, HEADS_KV, SEQ_Q, SEQ_KV, HEAD_DIM, VALUE_DIM = 2, 4, 2, 9, 13, 16, 32
LENGTHS_Q, LENGTHS_KV = np.array([6, 9], np.int32), np.array([13, 4], np.int32)
TYPES = {od.DataType.FP8_E4M3: torch.float8_e4m3fn, od.DataType.FP8_E5M2: torch.float8_e5m2}
LARGEST = {od.DataType.FP8_E4M3: 448.0, od.DataType.FP8_E5M2: 57344.0}

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder

# each case: q, k and v's type, o's type, the memory layout, the builder's keywords, the family's parameters
CASES = {
    "e4m3_causal": (od.DataType.FP8_E4M3, None, "bhsd", {"use_causal_mask": True}, {"causal": True}),
    "e5m2_bottom_right_window_bfloat16": (
        od.DataType.FP8_E5M2,
        od.DataType.BFLOAT16,
        "bshd",
        {"use_causal_mask_bottom_right": True, "sliding_window_length": 4},
        {"causal": True, "alignment": "bottom_right", "window": (3, None)},
    ),
    "e4m3_padding_half": (od.DataType.FP8_E4M3, od.DataType.HALF, "bhsd", {"use_padding_mask": True}, {}),
}


def qkv(rng, dtype, layout):
    """fp8 q, k, v (B, H, S, D) of grouped-query heads, in BHSD memory or BSHD memory read through strides."""
    shapes = (
        (BATCH, HEADS_Q, SEQ_Q, HEAD_DIM),
        (BATCH, HEADS_KV, SEQ_KV, HEAD_DIM),
        (BATCH, HEADS_KV, SEQ_KV, VALUE_DIM),
    )
    if layout == "bshd":
        shapes = tuple((b, s, h, d) for b, h, s, d in shapes)
    arrays = [torch.from_numpy(rng.uniform(-3.0, 3.0, shape)).to(TYPES[dtype]) for shape in shapes]
    return [a.transpose(1, 2) for a in arrays] if layout == "bshd" else arrays


def factors_of(dtype):
    return Fp8Scales(0.5, 0.75, 1.25, 1.0 / LARGEST[dtype], LARGEST[dtype], 2.0)


def fp8_graph(dtype, arrays, name="graph"):
    """A graph of fp8 io type, with q, k, v like ``arrays`` and the six factors as FLOAT inputs."""
    g = og.Graph(io_data_type=dtype, handle=od.Handle("cpu"), name=name)
    q, k, v = (g.tensor_like(array, name=role) for role, array in zip("qkv", arrays))
    factors = [g.tensor([1, 1, 1, 1], name=slot, data_type=od.DataType.FLOAT) for slot in Fp8Scales._fields]
    return g, (q, k, v), factors


def factor_arrays(factors, values):
    return {t: torch.full((1, 1, 1, 1), value) for t, value in zip(factors, values)}


def execute(g, inputs, outputs):
    """Execute the built ``g`` with ``outputs`` (in the strides the graph gives them: o takes q's
    memory order) poisoned with NaN; their values in float64."""
    arrays = {
        t: torch.empty_strided(t.get_dim(), t.get_stride(), dtype=t.get_data_type().to_torch()).copy_(
            torch.full(t.get_dim(), float("nan"))
        )
        for t in outputs
    }
    g.execute({**inputs, **arrays}, np.empty(g.get_workspace_size(), np.uint8))
    return [arrays[t].double().numpy() for t in outputs]


def assert_matches(actual, expected, out_dtype):
    """o as the family's fp8 tests hold it (fp8: the same roundings but for a rare element near a
    rounding boundary; 16-bit: within their rounding), stats and maxima closely."""
    o, stats, amax_s, amax_o = actual
    assert not np.isnan(o).any() and not np.isnan(stats).any(), "an element was never written"
    error = np.linalg.norm(o - expected.o) / np.linalg.norm(expected.o)
    assert error <= (1e-4 if out_dtype in LARGEST else 1e-2), error
    if out_dtype in LARGEST:
        assert np.mean(o != expected.o) <= 0.01
    finite = np.isfinite(expected.lse)
    assert np.array_equal(np.isfinite(stats[..., 0]), finite)
    np.testing.assert_allclose(stats[..., 0][finite], expected.lse[finite], atol=1e-5)
    assert amax_s.item() == pytest.approx(expected.amax_s, rel=1e-5)
    assert amax_o.item() == pytest.approx(expected.amax_o, rel=1e-5)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_sdpa_fp8_matches_the_family_reference(engine, case):
    dtype, out_dtype, layout, keywords, params = CASES[case]
    rng = np.random.default_rng(1)
    arrays = qkv(rng, dtype, layout)
    g, (q, k, v), factors = fp8_graph(dtype, arrays)
    padding, reference_extras = {}, {}
    if keywords.get("use_padding_mask"):
        lens_q = g.tensor([BATCH, 1, 1, 1], name="seq_len_q", data_type=od.DataType.INT32)
        lens_kv = g.tensor([BATCH, 1, 1, 1], name="seq_len_kv", data_type=od.DataType.INT32)
        padding = {lens_q: torch.from_numpy(LENGTHS_Q).reshape(-1, 1, 1, 1)}
        padding[lens_kv] = torch.from_numpy(LENGTHS_KV).reshape(-1, 1, 1, 1)
        keywords = {**keywords, "seq_len_q": lens_q, "seq_len_kv": lens_kv}
        reference_extras = {"seq_lens_q": LENGTHS_Q, "seq_lens_kv": LENGTHS_KV}
    outputs = g.sdpa_fp8(q, k, v, *factors, attn_scale=0.3, **keywords)
    o, stats, amax_s, amax_o = outputs
    for t in outputs:
        t.set_output(True)
    if out_dtype is not None:
        o.set_data_type(out_dtype)
    assert [t.get_dim() for t in outputs] == [
        [BATCH, HEADS_Q, SEQ_Q, VALUE_DIM],
        [BATCH, HEADS_Q, SEQ_Q, 1],
        [1, 1, 1, 1],
        [1, 1, 1, 1],
    ]
    assert [t.get_data_type() for t in outputs[1:]] == [od.DataType.FLOAT] * 3
    build(g, engine)
    assert [step.describe() for step in g.plan.steps] == ["node 'sdpa_fp8_0' (sdpa_fp8) as its own call"]
    values = factors_of(dtype)
    inputs = {q: arrays[0], k: arrays[1], v: arrays[2], **factor_arrays(factors, values), **padding}
    actual = execute(g, inputs, outputs)
    expected = reference_forward_fp8(
        od.AttentionDescriptor(scale=0.3, **params),
        *(a.double().numpy() for a in arrays),
        values,
        dtype,
        out_dtype or dtype,
        **reference_extras,
    )
    assert_matches(actual, expected, out_dtype or dtype)


@pytest.mark.parametrize("engine", ENGINES)
def test_inference_has_no_stats_and_keeps_virtual_maxima_in_the_workspace(engine):
    dtype = od.DataType.FP8_E4M3
    rng = np.random.default_rng(2)
    arrays = qkv(rng, dtype, "bhsd")
    g, (q, k, v), factors = fp8_graph(dtype, arrays)
    o, stats, amax_s, amax_o = g.sdpa_fp8(q, k, v, *factors, is_inference=True)  # attn_scale None: 1.0
    assert stats is None and amax_s.is_virtual and amax_o.is_virtual
    o.set_output(True).set_data_type(od.DataType.BFLOAT16)
    build(g, engine)
    assert g.get_workspace_size() > 0  # the two maxima the call writes
    values = factors_of(dtype)
    (out,) = execute(g, {q: arrays[0], k: arrays[1], v: arrays[2], **factor_arrays(factors, values)}, [o])
    expected = reference_forward_fp8(
        od.AttentionDescriptor(scale=1.0), *(a.double().numpy() for a in arrays), values, dtype, od.DataType.BFLOAT16
    )
    assert not np.isnan(out).any()
    assert np.linalg.norm(out - expected.o) / np.linalg.norm(expected.o) <= 1e-2


def test_a_serialized_sdpa_fp8_graph_rebuilds_and_runs():
    dtype = od.DataType.FP8_E5M2
    rng = np.random.default_rng(3)
    arrays = qkv(rng, dtype, "bhsd")
    g, (q, k, v), factors = fp8_graph(dtype, arrays)
    outputs = g.sdpa_fp8(q, k, v, *factors, attn_scale=0.2, use_causal_mask=True, name="attention")
    for t in outputs:
        t.set_output(True)
    build(g)
    rebuilt = og.Graph.deserialize(g.serialize(), od.Handle("cpu"))
    values = factors_of(dtype)
    inputs = {"q": arrays[0], "k": arrays[1], "v": arrays[2]}
    inputs |= {slot: torch.full((1, 1, 1, 1), value) for slot, value in zip(Fp8Scales._fields, values)}
    results = {
        t.name: torch.full(t.get_dim(), float("nan")).to(t.get_data_type().to_torch()) for t in outputs if t is not None
    }
    rebuilt.execute({**inputs, **results}, np.empty(rebuilt.get_workspace_size(), np.uint8))
    expected = reference_forward_fp8(
        od.AttentionDescriptor(scale=0.2, causal=True), *(a.double().numpy() for a in arrays), values, dtype, dtype
    )
    actual = [results[f"attention::{role}"].double().numpy() for role in ("o", "stats", "amax_s", "amax_o")]
    assert_matches(actual, expected, dtype)


# ---- refusals -----------------------------------------------------------------------------------------


def refusal_graph(data_type=od.DataType.FP8_E4M3, factor_dims=(1, 1, 1, 1), factor_type=od.DataType.FLOAT):
    g = og.Graph(io_data_type=od.DataType.FP8_E4M3, handle=od.Handle("cpu"))
    q = g.tensor([BATCH, HEADS_Q, SEQ_Q, HEAD_DIM], name="q", data_type=data_type)
    k = g.tensor([BATCH, HEADS_KV, SEQ_KV, HEAD_DIM], name="k", data_type=data_type)
    v = g.tensor([BATCH, HEADS_KV, SEQ_KV, VALUE_DIM], name="v", data_type=data_type)
    factors = [g.tensor(list(factor_dims), name=slot, data_type=factor_type) for slot in Fp8Scales._fields]
    return g, q, k, v, factors


def test_data_of_another_type_than_fp8_is_refused_at_the_builder():
    g, q, k, v, factors = refusal_graph(data_type=od.DataType.HALF)
    with pytest.raises(
        od.BadParam,
        match=r"node 'sdpa_fp8_0' \(sdpa_fp8\): descale_q is given but q.dtype=HALF is not FP8_E4M3 or FP8_E5M2",
    ):
        g.sdpa_fp8(q, k, v, *factors)


def test_a_factor_of_two_elements_is_refused_at_the_builder():
    g, q, k, v, factors = refusal_graph(factor_dims=(1, 1, 1, 2))
    with pytest.raises(
        od.BadParam, match=r"node 'sdpa_fp8_0' \(sdpa_fp8\): descale_q.dims=\[1, 1, 1, 2\] must hold one element"
    ):
        g.sdpa_fp8(q, k, v, *factors)


def test_a_factor_given_as_a_number_is_refused_at_the_builder():
    g, q, k, v, factors = refusal_graph()
    with pytest.raises(
        od.BadParam, match=r"scale_o 'sdpa_fp8_0::scale_o' is a scalar passed by value; only pointwise operations"
    ):
        g.sdpa_fp8(q, k, v, *factors[:5], 2.0)


def test_both_causal_alignments_are_refused_naming_the_builders_parameters():
    g, q, k, v, factors = refusal_graph()
    with pytest.raises(od.BadParam, match=r"use_causal_mask=True and use_causal_mask_bottom_right=True: .* not both"):
        g.sdpa_fp8(q, k, v, *factors, use_causal_mask=True, use_causal_mask_bottom_right=True)


def test_maxima_of_another_type_than_float_are_refused_by_validate():
    g, q, k, v, factors = refusal_graph()
    o, _, amax_s, _ = g.sdpa_fp8(q, k, v, *factors, is_inference=True)
    o.set_output(True)
    amax_s.set_output(True).set_data_type(od.DataType.HALF)
    with pytest.raises(od.BadParam, match=r"output amax_s 'sdpa_fp8_0::amax_s' data type HALF must be FLOAT"):
        g.validate()


@pytest.mark.parametrize(
    ("factor_type", "o_type", "message"),
    [
        (od.DataType.HALF, None, r"node 'sdpa_fp8_0' \(sdpa_fp8\): descale_q.dtype=HALF must be FLOAT"),
        (
            od.DataType.FLOAT,
            od.DataType.FLOAT,
            r"node 'sdpa_fp8_0' \(sdpa_fp8\): o.dtype=FLOAT must be FP8_E4M3, FP8_E5M2, BFLOAT16, HALF "
            r"for q.dtype=FP8_E4M3",
        ),
    ],
)
def test_types_the_fp8_forward_does_not_take_are_each_engines_reason_in_check_support(factor_type, o_type, message):
    g, q, k, v, factors = refusal_graph(factor_type=factor_type)
    o, _, _, _ = g.sdpa_fp8(q, k, v, *factors, is_inference=True)
    o.set_output(True)
    if o_type is not None:
        o.set_data_type(o_type)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.NotSupported, match=message):
        g.check_support()


# ---- the backward -------------------------------------------------------------------------------------

# each case: q, k and v's type, dO's type, the gradients' type, the layout, the builder's keywords, the
# family's parameters
BACKWARD_CASES = {
    "e4m3_causal": (
        od.DataType.FP8_E4M3,
        od.DataType.FP8_E4M3,
        None,
        "bhsd",
        {"use_causal_mask": True},
        {"causal": True},
    ),
    "e5m2_bottom_right_window_bfloat16": (
        od.DataType.FP8_E5M2,
        od.DataType.FP8_E5M2,
        od.DataType.BFLOAT16,
        "bshd",
        {"use_causal_mask_bottom_right": True, "sliding_window_length": 4},
        {"causal": True, "alignment": "bottom_right", "window": (3, None)},
    ),
    "e4m3_e5m2_do_padding_half": (
        od.DataType.FP8_E4M3,
        od.DataType.FP8_E5M2,
        od.DataType.HALF,
        "bhsd",
        {"use_padding_mask": True},
        {},
    ),
}


def backward_factors_of(dtype, grad_dtype):
    """The twelve factors, as float32 holds them (the kernels load them so)."""
    scale_s, scale_dp = LARGEST[dtype], LARGEST[grad_dtype] / 16.0
    factors = (0.5, 0.75, 1.25, 0.8, 0.6, 1.0 / scale_s, 1.0 / scale_dp, scale_s, 2.0, 0.5, 4.0, scale_dp)
    return Fp8BackwardScales(*(float(np.float32(factor)) for factor in factors))


def backward_arrays(rng, dtype, grad_dtype, layout, params, factors, lengths=None):
    """fp8 q, k, v and o, dO of ``grad_dtype``, and the forward's stats (B, Hq, Sq, 1) for them."""
    q, k, v = qkv(rng, dtype, layout)
    o, do = (
        torch.from_numpy(rng.uniform(-3.0, 3.0, (BATCH, HEADS_Q, SEQ_Q, VALUE_DIM))).to(TYPES[t])
        for t in (dtype, grad_dtype)
    )
    values = [a.double().numpy() for a in (q, k, v)]
    descaled = values[0] * (factors.descale_q * factors.descale_k)
    lse = reference_forward(od.AttentionDescriptor(**params), descaled, *values[1:], **(lengths or {}))[1]
    return [q, k, v, o, do, torch.from_numpy(lse).float()[..., None]]


def fp8_backward_graph(dtype, arrays, name="graph"):
    """A graph of fp8 io type, with q, k, v, o, dO and stats like ``arrays`` and the twelve factors."""
    g = og.Graph(io_data_type=dtype, handle=od.Handle("cpu"), name=name)
    tensors = [g.tensor_like(array, name=role) for role, array in zip(("q", "k", "v", "o", "dO", "stats"), arrays)]
    factors = [g.tensor([1, 1, 1, 1], name=slot, data_type=od.DataType.FLOAT) for slot in FP8_BACKWARD_SCALES]
    return g, tensors, factors


def assert_gradients_match(actual, expected, out_dtype):
    """dq, dk, dv as the family's fp8 backward tests hold them, the maxima closely."""
    for ours, theirs in zip(actual[:3], expected[:3]):
        assert not np.isnan(ours).any(), "an element was never written"
        error = np.linalg.norm(ours - theirs) / np.linalg.norm(theirs)
        assert error <= (2e-3 if out_dtype in LARGEST else 1e-2), error
    for ours, theirs in zip(actual[3:], expected[3:]):
        assert ours.item() == pytest.approx(theirs, rel=1e-5) and theirs > 0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", BACKWARD_CASES)
def test_sdpa_fp8_backward_matches_the_family_reference(engine, case):
    dtype, grad_dtype, out_dtype, layout, keywords, params = BACKWARD_CASES[case]
    rng = np.random.default_rng(4)
    factors = backward_factors_of(dtype, grad_dtype)
    lengths = {"seq_lens_q": LENGTHS_Q, "seq_lens_kv": LENGTHS_KV} if keywords.get("use_padding_mask") else {}
    arrays = backward_arrays(rng, dtype, grad_dtype, layout, {"scale": 0.3, **params}, factors, lengths)
    g, tensors, factor_tensors = fp8_backward_graph(dtype, arrays)
    padding = {}
    if lengths:
        lens_q = g.tensor([BATCH, 1, 1, 1], name="seq_len_q", data_type=od.DataType.INT32)
        lens_kv = g.tensor([BATCH, 1, 1, 1], name="seq_len_kv", data_type=od.DataType.INT32)
        padding = {lens_q: torch.from_numpy(LENGTHS_Q).reshape(-1, 1, 1, 1)}
        padding[lens_kv] = torch.from_numpy(LENGTHS_KV).reshape(-1, 1, 1, 1)
        keywords = {**keywords, "seq_len_q": lens_q, "seq_len_kv": lens_kv}
    outputs = g.sdpa_fp8_backward(*tensors, *factor_tensors, attn_scale=0.3, **keywords)
    for t in outputs:
        t.set_output(True)
    if out_dtype is not None:
        for t in outputs[:3]:
            t.set_data_type(out_dtype)
    assert [t.get_dim() for t in outputs] == [t.get_dim() for t in tensors[:3]] + [[1, 1, 1, 1]] * 4
    assert [t.get_data_type() for t in outputs] == [out_dtype or dtype] * 3 + [od.DataType.FLOAT] * 4
    build(g, engine)
    assert [step.describe() for step in g.plan.steps] == [
        "node 'sdpa_fp8_backward_0' (sdpa_fp8_backward) as its own call"
    ]
    inputs = {**dict(zip(tensors, arrays)), **factor_arrays(factor_tensors, factors), **padding}
    actual = execute(g, inputs, outputs)
    expected = reference_backward_fp8(
        od.AttentionDescriptor(scale=0.3, **params),
        *(a.double().numpy() for a in arrays[:5]),
        factors,
        (dtype, grad_dtype, *(out_dtype or dtype,) * 3),
        **lengths,
    )
    assert_gradients_match(actual, expected, out_dtype or dtype)


def test_a_serialized_sdpa_fp8_backward_graph_rebuilds_and_runs():
    dtype = od.DataType.FP8_E4M3
    rng = np.random.default_rng(5)
    factors = backward_factors_of(dtype, dtype)
    arrays = backward_arrays(rng, dtype, dtype, "bhsd", {"scale": 0.2, "causal": True}, factors)
    g, tensors, factor_tensors = fp8_backward_graph(dtype, arrays)
    outputs = g.sdpa_fp8_backward(*tensors, *factor_tensors, attn_scale=0.2, use_causal_mask=True, name="grads")
    for t in outputs:
        t.set_output(True)
    build(g)
    rebuilt = og.Graph.deserialize(g.serialize(), od.Handle("cpu"))
    inputs = dict(zip(("q", "k", "v", "o", "dO", "stats"), arrays))
    inputs |= {slot: torch.full((1, 1, 1, 1), value) for slot, value in zip(FP8_BACKWARD_SCALES, factors)}
    results = {t.name: torch.full(t.get_dim(), float("nan")).to(t.get_data_type().to_torch()) for t in outputs}
    rebuilt.execute({**inputs, **results}, np.empty(rebuilt.get_workspace_size(), np.uint8))
    expected = reference_backward_fp8(
        od.AttentionDescriptor(scale=0.2, causal=True), *(a.double().numpy() for a in arrays[:5]), factors, (dtype,) * 5
    )
    roles = ("dq", "dk", "dv", "amax_dq", "amax_dk", "amax_dv", "amax_dp")
    actual = [results[f"grads::{role}"].double().numpy() for role in roles]
    assert_gradients_match(actual, expected, dtype)


def backward_refusal_graph(do_type=od.DataType.FP8_E4M3, factor_dims=(1, 1, 1, 1)):
    g = og.Graph(io_data_type=od.DataType.FP8_E4M3, handle=od.Handle("cpu"))
    fp8 = od.DataType.FP8_E4M3
    q = g.tensor([BATCH, HEADS_Q, SEQ_Q, HEAD_DIM], name="q", data_type=fp8)
    k = g.tensor([BATCH, HEADS_KV, SEQ_KV, HEAD_DIM], name="k", data_type=fp8)
    v = g.tensor([BATCH, HEADS_KV, SEQ_KV, VALUE_DIM], name="v", data_type=fp8)
    o = g.tensor([BATCH, HEADS_Q, SEQ_Q, VALUE_DIM], name="o", data_type=fp8)
    do = g.tensor([BATCH, HEADS_Q, SEQ_Q, VALUE_DIM], name="dO", data_type=do_type)
    stats = g.tensor([BATCH, HEADS_Q, SEQ_Q, 1], name="stats", data_type=od.DataType.FLOAT)
    factors = [g.tensor(list(factor_dims), name=slot, data_type=od.DataType.FLOAT) for slot in FP8_BACKWARD_SCALES]
    return g, [q, k, v, o, do, stats], factors


def test_a_backward_factor_of_two_elements_is_refused_naming_the_builders_parameter():
    g, tensors, factors = backward_refusal_graph(factor_dims=(1, 1, 2, 1))
    with pytest.raises(
        od.BadParam,
        match=r"node 'sdpa_fp8_backward_0' \(sdpa_fp8_backward\): descale_q.dims=\[1, 1, 2, 1\] must hold one element",
    ):
        g.sdpa_fp8_backward(*tensors, *factors)


def test_the_backward_refuses_both_causal_alignments():
    g, tensors, factors = backward_refusal_graph()
    with pytest.raises(od.BadParam, match=r"use_causal_mask=True and use_causal_mask_bottom_right=True: .* not both"):
        g.sdpa_fp8_backward(*tensors, *factors, use_causal_mask=True, use_causal_mask_bottom_right=True)


def test_a_backward_factor_given_as_a_number_is_refused_at_the_builder():
    g, tensors, factors = backward_refusal_graph()
    with pytest.raises(
        od.BadParam,
        match=r"scale_dp 'sdpa_fp8_backward_0::scale_dp' is a scalar passed by value; only pointwise operations",
    ):
        g.sdpa_fp8_backward(*tensors, *factors[:11], 2.0)


@pytest.mark.parametrize(
    ("do_type", "gradient_type", "message"),
    [
        (
            od.DataType.HALF,
            None,
            r"node 'sdpa_fp8_backward_0' \(sdpa_fp8_backward\): dO.dtype=HALF must be FP8_E4M3 or FP8_E5M2 "
            r"for q.dtype=FP8_E4M3",
        ),
        (
            od.DataType.FP8_E4M3,
            od.DataType.FLOAT,
            r"node 'sdpa_fp8_backward_0' \(sdpa_fp8_backward\): dQ.dtype=FLOAT must be FP8_E4M3, FP8_E5M2, "
            r"BFLOAT16, HALF for q.dtype=FP8_E4M3",
        ),
    ],
)
def test_types_the_fp8_backward_does_not_take_are_each_engines_reason_in_check_support(do_type, gradient_type, message):
    g, tensors, factors = backward_refusal_graph(do_type=do_type)
    outputs = g.sdpa_fp8_backward(*tensors, *factors)
    for t in outputs:
        t.set_output(True)
    if gradient_type is not None:
        outputs[0].set_data_type(gradient_type)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.NotSupported, match=message):
        g.check_support()
