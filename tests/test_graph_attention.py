"""The graph API's attention (``sdpa``, ``sdpa_backward``) on the reference engine (NumPy) and on the
per-node engine (Triton, through its interpreter), against the attention family's float64
reference; with pointwise nodes around it, serialized and rebuilt, and the refusals."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import build, cpu_graph, graph_inputs, kernel_cache, random, run  # noqa: F401

import opendnn as od
import opendnn.graph as og
from opendnn.families.attention.problem import AttentionDescriptor, reference_backward, reference_forward

ENGINES = ["reference", "per_node"]
TOLERANCE = 1e-5
BATCH, HEADS_Q, HEADS_KV, SEQ_Q, SEQ_KV, HEAD_DIM, VALUE_DIM = 2, 4, 2, 5, 7, 8, 16
LENGTHS_Q, LENGTHS_KV = np.array([3, 5], np.int32), np.array([7, 2], np.int32)

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder

# each case: the builder's keyword arguments, the family's parameters, and what else the case gives
CASES = {
    "causal_top_left": ({"causal_mask": True}, {"causal": True}),
    "causal_bottom_right": ({"causal_mask_bottom_right": True}, {"causal": True, "alignment": "bottom_right"}),
    "sliding_window": ({"causal_mask": True, "sliding_window_length": 3}, {"causal": True, "window": (2, None)}),
    "bias": ({"causal_mask": True}, {"causal": True}),
    "padding": ({"use_padding_mask": True}, {}),
    "dropout": ({"dropout": (0.25, 7, 3)}, {"dropout_p": 0.25, "seed": 7, "offset": 3}),
}


def qkv(rng, layout="bhsd"):
    """q, k, v (B, H, S, D) of grouped-query heads, in BHSD memory or BSHD memory read through strides."""
    shapes = (
        (BATCH, HEADS_Q, SEQ_Q, HEAD_DIM),
        (BATCH, HEADS_KV, SEQ_KV, HEAD_DIM),
        (BATCH, HEADS_KV, SEQ_KV, VALUE_DIM),
    )
    if layout == "bhsd":
        return [random(rng, shape) for shape in shapes]
    return [random(rng, (b, s, h, d)).transpose(0, 2, 1, 3) for b, h, s, d in shapes]


def case_inputs(g, case, rng):
    """The case's optional tensors: as graph tensors (builder keywords) and as the reference's arrays."""
    if case == "bias":
        bias = random(rng, (1, HEADS_Q, SEQ_Q, SEQ_KV))
        (bias_t,) = graph_inputs(g, bias=bias)
        return {"bias": bias_t}, {bias_t: bias}, {"bias": bias}
    if case == "padding":
        lens_q, lens_kv = LENGTHS_Q.reshape(-1, 1, 1, 1), LENGTHS_KV.reshape(-1, 1, 1, 1)
        lens_q_t, lens_kv_t = graph_inputs(g, seq_len_q=lens_q, seq_len_kv=lens_kv)
        arrays = {lens_q_t: lens_q, lens_kv_t: lens_kv}
        return (
            {"seq_len_q": lens_q_t, "seq_len_kv": lens_kv_t},
            arrays,
            {"seq_lens_q": LENGTHS_Q, "seq_lens_kv": LENGTHS_KV},
        )
    return {}, {}, {}


def assert_close(actual, expected, what):
    """No element left unwritten (NaN), infinities (the stats of rows with no key) where expected,
    the rest within TOLERANCE."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    assert not np.isnan(actual).any(), f"{what}: an element was never written"
    np.testing.assert_array_equal(np.isinf(actual), np.isinf(expected), what)
    finite = np.isfinite(expected)
    error = np.linalg.norm(actual[finite] - expected[finite]) / max(np.linalg.norm(expected[finite]), 1e-30)
    assert error < TOLERANCE, f"{what}: relative error {error}"


def t64(array):
    return np.asarray(array, np.float64)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_sdpa_forward_matches_the_family_reference(engine, case):
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng)
    g = cpu_graph()
    qt, kt, vt = graph_inputs(g, q=q, k=k, v=v)
    extra, extra_arrays, reference_extras = case_inputs(g, case, rng)
    keywords, params = CASES[case]
    o, stats = g.sdpa(qt, kt, vt, attn_scale=0.4, **keywords, **extra)
    o.set_output(True)
    stats.set_output(True)
    assert (o.get_dim(), stats.get_dim()) == ([BATCH, HEADS_Q, SEQ_Q, VALUE_DIM], [BATCH, HEADS_Q, SEQ_Q, 1])
    assert stats.get_data_type() is od.DataType.FLOAT
    out_o, out_stats = run(g, {qt: q, kt: k, vt: v, **extra_arrays}, [o, stats], engine)
    expected_o, expected_lse = reference_forward(
        AttentionDescriptor(scale=0.4, **params), t64(q), t64(k), t64(v), **reference_extras
    )
    assert_close(out_o, expected_o, "o")
    assert_close(out_stats[..., 0], expected_lse, "stats")


@pytest.mark.parametrize("engine", ENGINES)
def test_sdpa_reads_bshd_strides_writes_a_bshd_output_and_agrees_with_torch(engine):
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, "bshd")
    g = cpu_graph()
    qt, kt, vt = graph_inputs(g, q=q, k=k, v=v)
    o, stats = g.sdpa(qt, kt, vt, is_inference=True, causal_mask=True)
    assert stats is None
    o.set_output(True).set_stride([SEQ_Q * HEADS_Q * VALUE_DIM, VALUE_DIM, HEADS_Q * VALUE_DIM, 1])
    build(g, engine)
    out = np.full((BATCH, SEQ_Q, HEADS_Q, VALUE_DIM), np.nan, np.float32).transpose(0, 2, 1, 3)  # BSHD memory
    g.execute({qt: q, kt: k, vt: v, o: out}, np.empty(g.get_workspace_size(), np.uint8))
    expected = TF.scaled_dot_product_attention(
        *(torch.tensor(t64(a)) for a in (q, k, v)), is_causal=True, scale=1.0, enable_gqa=True
    )
    assert_close(out, expected.numpy(), "o")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
def test_sdpa_backward_matches_the_family_reference(engine, case):
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng, "bshd" if case == "causal_top_left" else "bhsd")
    do = random(rng, (BATCH, HEADS_Q, SEQ_Q, VALUE_DIM))
    keywords, params = CASES[case]
    g = cpu_graph()
    qt, kt, vt, dot = graph_inputs(g, q=q, k=k, v=v, do=do)
    extra, extra_arrays, reference_extras = case_inputs(g, case, rng)
    descriptor = AttentionDescriptor(scale=0.4, **params)
    o, lse = reference_forward(descriptor, t64(q), t64(k), t64(v), **reference_extras)
    o, stats = o.astype(np.float32), lse.astype(np.float32)[..., None]
    ot, stats_t = graph_inputs(g, o=o, stats=stats)
    gradients = g.sdpa_backward(
        qt, kt, vt, ot, dot, stats_t, attn_scale=0.4, compute_dbias=case == "bias", **keywords, **extra
    )
    assert [t.get_dim() for t in gradients[:3]] == [list(q.shape), list(k.shape), list(v.shape)]
    for t in gradients:
        t.set_output(True)
    outs = run(g, {qt: q, kt: k, vt: v, dot: do, ot: o, stats_t: stats, **extra_arrays}, list(gradients), engine)
    expected = reference_backward(descriptor, t64(q), t64(k), t64(v), t64(do), **reference_extras)
    names = ["dQ", "dK", "dV", "dBias"]
    assert len(outs) == (4 if case == "bias" else 3)
    for out, theirs, what in zip(outs, expected, names):
        assert_close(out, theirs, what)


@pytest.mark.parametrize("engine", ["reference", "per_node", "fused"])
def test_pointwise_nodes_before_and_after_the_attention_run_around_its_call(engine):
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng)
    residual = random(rng, (BATCH, HEADS_Q, SEQ_Q, VALUE_DIM))
    g = cpu_graph()
    qt, kt, vt, rt = graph_inputs(g, q=q, k=k, v=v, residual=residual)
    o, _ = g.sdpa(g.scale(qt, 0.5), kt, vt, is_inference=True, causal_mask_bottom_right=True)
    y = g.add(o, rt)
    y.set_output(True)
    (out,) = run(g, {qt: q, kt: k, vt: v, rt: residual}, [y], engine)
    params = AttentionDescriptor(scale=1.0, causal=True, alignment="bottom_right")
    expected, _ = reference_forward(params, 0.5 * t64(q), t64(k), t64(v))
    assert_close(out, expected + residual, "y")
    assert len(g.plan.steps) == 3 and "(sdpa) as its own call" in g.plan.steps[1].describe()


def test_a_serialized_attention_graph_rebuilds_and_runs():
    rng = np.random.default_rng(5)
    q, k, v = qkv(rng)
    g = cpu_graph()
    qt, kt, vt = graph_inputs(g, q=q, k=k, v=v)
    o, stats = g.sdpa(qt, kt, vt, attn_scale=0.3, causal_mask=True, sliding_window_length=2, name="attention")
    o.set_output(True)
    stats.set_output(True)
    build(g)
    rebuilt = og.Graph.deserialize(g.serialize(), od.Handle("cpu"))
    arrays = {
        name: np.full(t.get_dim(), np.nan, np.float32) for name, t in (("attention::o", o), ("attention::stats", stats))
    }
    rebuilt.execute({"q": q, "k": k, "v": v, **arrays}, np.empty(rebuilt.get_workspace_size(), np.uint8))
    expected_o, expected_lse = reference_forward(
        AttentionDescriptor(scale=0.3, causal=True, window=(1, None)), t64(q), t64(k), t64(v)
    )
    assert_close(arrays["attention::o"], expected_o, "o")
    assert_close(arrays["attention::stats"][..., 0], expected_lse, "stats")


# ---- refusals -----------------------------------------------------------------------------------------


def graph_with_qkv(head_dim=HEAD_DIM, value_dim=VALUE_DIM, key_dim=HEAD_DIM):
    g = cpu_graph()
    q = g.tensor([BATCH, HEADS_Q, SEQ_Q, head_dim], name="q")
    k = g.tensor([BATCH, HEADS_KV, SEQ_KV, key_dim], name="k")
    v = g.tensor([BATCH, HEADS_KV, SEQ_KV, value_dim], name="v")
    return g, q, k, v


def test_mismatched_head_dims_are_refused_at_the_builder_naming_the_parameters():
    g, q, k, v = graph_with_qkv(key_dim=16)
    with pytest.raises(od.BadParam, match=r"node 'sdpa_0' \(sdpa\): k.dims\[3\]=16 must equal q.dims\[3\]=8"):
        g.sdpa(q, k, v)


def test_a_causal_mask_with_a_bias_of_another_query_length_is_refused():
    g, q, k, v = graph_with_qkv()
    bias = g.tensor([1, HEADS_Q, 3, SEQ_KV], name="bias")
    with pytest.raises(od.BadParam, match=r"bias.dims\[2\]=3 must be 5 or 1"):
        g.sdpa(q, k, v, causal_mask=True, bias=bias)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"dropout": "mask"}, od.NotSupported, r"dropout=\(tensor 'mask', tensor 'scale'\) is not supported"),
        ({"dropout": (1.5, 0, 0)}, od.BadParam, r"dropout probability=1.5 must be at least 0 and below 1"),
        ({"attn_scale": "tensor"}, od.NotSupported, r"attn_scale=tensor 'scale' is not supported"),
        ({"causal_mask": True, "causal_mask_bottom_right": True}, od.BadParam, r"not both"),
        ({"sliding_window_length": 0}, od.BadParam, r"sliding_window_length=0 must be an int of at least 1"),
        ({"use_padding_mask": True}, od.BadParam, r"use_padding_mask=True needs both seq_len_q and seq_len_kv"),
    ],
)
def test_parameters_the_builder_refuses(keywords, error, message):
    g, q, k, v = graph_with_qkv()
    if keywords.get("dropout") == "mask":
        keywords = {"dropout": (g.tensor([1, 1, SEQ_Q, SEQ_KV], name="mask"), g.tensor([1], name="scale"))}
    if keywords.get("attn_scale") == "tensor":
        keywords = {"attn_scale": g.tensor([1], name="scale")}
    with pytest.raises(error, match=message):
        g.sdpa(q, k, v, **keywords)


def test_sequence_lengths_must_have_cudnn_frontends_four_dims():
    g, q, k, v = graph_with_qkv()
    lens_q, lens_kv = (
        g.tensor([BATCH], data_type=od.DataType.INT32),
        g.tensor([BATCH, 1, 1, 1], data_type=od.DataType.INT32),
    )
    with pytest.raises(od.BadParam, match=r"seq_len_q '.*' dims \[2\] must be \(batch, 1, 1, 1\)"):
        g.sdpa(q, k, v, use_padding_mask=True, seq_len_q=lens_q, seq_len_kv=lens_kv)


def test_dbias_needs_a_bias():
    g, q, k, v = graph_with_qkv()
    o, stats = g.sdpa(q, k, v)
    with pytest.raises(od.BadParam, match=r"compute_dbias=True needs a bias"):
        g.sdpa_backward(q, k, v, o, g.tensor(o.get_dim(), name="do"), stats, compute_dbias=True)


def test_an_output_of_another_type_than_q_is_refused_by_validate():
    g, q, k, v = graph_with_qkv()
    o, _ = g.sdpa(q, k, v, is_inference=True)
    o.set_output(True).set_data_type(od.DataType.HALF)
    with pytest.raises(od.BadParam, match=r"output o 'sdpa_0::o' data type HALF must be FLOAT"):
        g.validate()


def test_a_head_dim_the_kernels_do_not_take_is_each_engines_reason_in_check_support():
    g, q, k, v = graph_with_qkv(head_dim=512, key_dim=512)
    o, _ = g.sdpa(q, k, v, is_inference=True)
    o.set_output(True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.FALLBACK])
    with pytest.raises(od.NotSupported, match=r"node 'sdpa_0' \(sdpa\): q.dims\[3\]=512 must be between 8 and 256"):
        g.check_support()
