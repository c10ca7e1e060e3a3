"""Attention through its two faces on every backend (Triton through its interpreter): the Pythonic
``scaled_dot_product_attention`` against torch's SDPA in float64 (forward, and gradients through
torch's autograd), the cuDNN-shaped calls with descriptors over BSHD, BHSD and packed QKV strides,
NumPy in and out, and the errors, whose messages name the caller's parameter."""

import numpy as np
import pytest
import torch
import torch.nn.functional as torch_functional

import opendnn as od
import opendnn.functional as F
from opendnn.families.attention import functional
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.problem import (
    AttentionDescriptor,
    DiagonalAlignment,
    attention_problem,
    reference_backward,
    reference_forward,
)

BACKENDS = ["numpy", "triton"]


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def randn(*shape, dtype=torch.float64, seed=0):
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def torch_gradients(q, k, v, do, mask=None, **kwargs):
    """(o, dq, dk, dv[, dmask]) of torch's SDPA through autograd."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if mask is not None and mask.is_floating_point():
        mask = mask.detach().clone().requires_grad_()
        leaves.append(mask)
    o = torch_functional.scaled_dot_product_attention(*leaves[:3], attn_mask=mask, **kwargs)
    o.backward(do)
    return [o.detach()] + [leaf.grad for leaf in leaves]


def relative_error(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


# the Pythonic API against torch ------------------------------------------------------------------------

CASES = {
    "plain": dict(shapes=((2, 3, 9, 16), (2, 3, 11, 16), (2, 3, 11, 16)), kwargs={}),
    "causal_more_queries": dict(shapes=((1, 2, 13, 8), (1, 2, 6, 8), (1, 2, 6, 24)), kwargs=dict(is_causal=True)),
    "gqa_scale": dict(
        shapes=((2, 4, 7, 32), (2, 2, 10, 32), (2, 2, 10, 16)), kwargs=dict(enable_gqa=True, scale=0.2, is_causal=True)
    ),
    "mqa_float_mask": dict(
        shapes=((1, 4, 8, 16), (1, 1, 12, 16), (1, 1, 12, 16)), kwargs=dict(enable_gqa=True), mask=(1, 4, 8, 12)
    ),
    "bool_mask_with_empty_row": dict(
        shapes=((2, 2, 6, 8), (2, 2, 9, 8), (2, 2, 9, 8)), kwargs={}, mask=(2, 1, 6, 9), boolean=True
    ),
    "float_mask_2d": dict(shapes=((1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 16)), kwargs={}, mask=(5, 7)),
    "2d_query_causal_scale": dict(shapes=((9, 16), (6, 16), (6, 24)), kwargs=dict(is_causal=True, scale=0.3)),
    "2d_query_float_mask": dict(shapes=((5, 8), (7, 8), (7, 8)), kwargs={}, mask=(5, 7)),
    "2d_query_key_mask": dict(shapes=((5, 8), (7, 8), (7, 16)), kwargs=dict(scale=0.7), mask=(7,)),
}


def case_tensors(name):
    case = CASES[name]
    q, k, v = (randn(*shape, seed=n) for n, shape in enumerate(case["shapes"]))
    mask = None
    if "mask" in case:
        mask = randn(*case["mask"], seed=7)
        if case.get("boolean"):
            mask = mask > -0.6
            mask[0, 0, 1] = False  # a row no key takes part in: 0, as torch gives
    return q, k, v, mask, case["kwargs"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_functional_matches_torch_forward_and_gradients(name, backend):
    q, k, v, mask, kwargs = case_tensors(name)
    handle = od.create("cpu", backend=backend)
    o, stats = F.scaled_dot_product_attention(q, k, v, mask, return_stats=True, handle=handle, **kwargs)
    do = randn(*o.shape, seed=8)
    expected = torch_gradients(q, k, v, do, mask, **kwargs)
    assert relative_error(o, expected[0]) < 1e-12
    float_mask = mask is not None and mask.is_floating_point()
    grads = F.scaled_dot_product_attention_backward(
        do, q, k, v, o, stats, mask, handle=handle, mask_grad=float_mask, **kwargs
    )
    assert len(grads) == len(expected) - 1
    for ours, theirs in zip(grads, expected[1:]):
        assert ours.shape == theirs.shape and relative_error(ours, theirs) < 1e-11


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_plain_calls_called_again_take_their_plan_and_match_torch_on_new_values(backend):
    """A plain call (4-dim query, key and value, no mask, lengths or dropout) keeps a plan on the handle; a
    call of the same signature runs it on new values (outputs new each call, the stats too) and matches
    torch; a call whose key and value broadcast along the batch (bound as stride-0 views), or with a mask,
    keeps none."""
    handle = od.create("cpu", backend=backend)
    options = dict(is_causal=True, scale=0.4, window=(3, None))
    for seed in (1, 2):
        q, k, v = randn(2, 4, 6, 8, seed=seed), randn(2, 2, 5, 8, seed=seed + 10), randn(2, 2, 5, 8, seed=seed + 20)
        o, stats = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_stats=True, handle=handle, **options)
        mask = torch.ones(6, 5, dtype=torch.bool).tril().logical_and(torch.ones(6, 5, dtype=torch.bool).triu(-3))
        expected = torch_functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask, scale=0.4
        )
        assert relative_error(o, expected) < 1e-12
        scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.4
        assert relative_error(stats, scores.masked_fill(~mask, -torch.inf).logsumexp(-1)) < 1e-12
    assert len(handle.plans) == 1
    first = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, handle=handle, **options)
    again = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, handle=handle, **options)
    assert torch.equal(first, again) and first.data_ptr() != again.data_ptr() and len(handle.plans) == 2
    unbatched = randn(2, 5, 8, seed=30)
    broadcast = F.scaled_dot_product_attention(q, unbatched, unbatched, enable_gqa=True, handle=handle)
    expected = torch_functional.scaled_dot_product_attention(q, *[unbatched.repeat_interleave(2, 0)] * 2)
    assert relative_error(broadcast, expected) < 1e-12
    F.scaled_dot_product_attention(q, k, v, randn(6, 5, seed=31), enable_gqa=True, handle=handle)
    assert len(handle.plans) == 2


@pytest.fixture
def problems_built(monkeypatch):
    """The problems the Pythonic calls build (a call that takes its plan builds none), every output and
    gradient they allocate poisoned with NaN."""
    built = []

    def counted(*args, **kwargs):
        built.append(attention_problem(*args, **kwargs))
        return built[-1]

    def poisoned(allocate):
        def allocated(*args, **kwargs):
            bound = allocate(*args, **kwargs)
            bound.view[...] = float("nan")
            return bound

        return allocated

    monkeypatch.setattr(functional, "attention_problem", counted)
    monkeypatch.setattr(functional, "allocate", poisoned(functional.allocate))
    monkeypatch.setattr(functional, "empty_like", poisoned(functional.empty_like))
    return built


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_plain_backward_called_again_takes_its_plan_and_gives_the_same_gradients(backend, problems_built):
    """A plain backward (4-dim arrays, no mask, lengths, dropout or fp8) keeps a plan on the handle, GQA key and
    value (fewer heads) too; a call of the same signature builds no problem and gives the first call's gradients
    bit for bit in new arrays, on new values torch's; a call of other strides, dtype or causality gets a plan of
    its own; one whose key and value broadcast along the batch (stride-0 views, their gradients summed back) or
    whose arrays are fp8 (factors made per call) keeps none; mask_grad without a mask still raises."""
    handle = od.create("cpu", backend=backend)
    options = dict(is_causal=True, scale=0.4, enable_gqa=True)

    def backward(q, k, v, seed, **changed):
        o, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, handle=handle, **options | changed)
        do = randn(*o.shape, dtype=q.dtype, seed=seed)
        grads = F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, handle=handle, **options | changed)
        return grads, torch_gradients(q, k, v, do, **options | changed)[1:]

    q, k, v = randn(1, 2, 6, 8, seed=1), randn(1, 1, 5, 8, seed=2), randn(1, 1, 5, 8, seed=3)
    first, expected = backward(q, k, v, seed=4)
    again, _ = backward(q, k, v, seed=4)
    assert len(problems_built) == 2 and len(handle.plans) == 2  # the forward's and the backward's
    for ours, theirs, planned in zip(first, expected, again):
        assert relative_error(ours, theirs) < 1e-11
        assert torch.equal(planned, ours) and planned.stride() == ours.stride()
        assert planned.data_ptr() != ours.data_ptr()
    q, k, v = randn(1, 2, 6, 8, seed=5), randn(1, 1, 5, 8, seed=6), randn(1, 1, 5, 8, seed=7)
    grads, expected = backward(q, k, v, seed=8)
    assert len(problems_built) == 2 and all(relative_error(g, e) < 1e-11 for g, e in zip(grads, expected))
    bshd = randn(1, 6, 2, 8, seed=9).transpose(1, 2)
    other_signatures = [
        ((bshd, k, v), {}, 1e-11),
        ((q.float(), k.float(), v.float()), {}, 1e-5),
        ((q, k, v), dict(is_causal=False), 1e-11),
    ]
    for count, (arrays, changed, tolerance) in enumerate(other_signatures, 1):
        grads, expected = backward(*arrays, seed=10, **changed)
        assert len(handle.plans) == 2 + 2 * count  # the backward's, and the forward's of the same signature
        assert all(relative_error(g, e) < tolerance for g, e in zip(grads, expected))
        assert grads[0].stride() == arrays[0].stride()
    plans = len(handle.plans)
    one_batch = randn(1, 1, 5, 8, seed=11)
    grads, expected = backward(randn(2, 2, 6, 8, seed=12), one_batch, one_batch, seed=13)
    assert grads[1].shape == (1, 1, 5, 8) and relative_error(grads[1], expected[1]) < 1e-11
    q8, k8, v8, do8 = (randn(1, 2, 4, 16, seed=seed).to(torch.float8_e4m3fn) for seed in (14, 15, 16, 17))
    first, again = (F.scaled_dot_product_attention(q8, k8, v8, return_stats=True, handle=handle) for _ in range(2))
    assert torch.equal(first[0].float(), again[0].float())
    F.scaled_dot_product_attention_backward(do8, q8, k8, v8, *again, handle=handle)
    assert len(handle.plans) == plans
    do, stats = randn(1, 2, 6, 8, seed=18), randn(1, 2, 6, seed=19)  # the planned signature's arrays, but mask_grad
    with pytest.raises(od.BadParam, match=r"mask_grad=True needs a float attn_mask, got attn_mask=None"):
        F.scaled_dot_product_attention_backward(do, q, k, v, do, stats, mask_grad=True, handle=handle, **options)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_empty_rows_give_zero_output_zero_gradient_and_minus_inf_stats(backend):
    q, k, v = randn(2, 2, 6, 8, seed=1), randn(2, 2, 5, 8, seed=2), randn(2, 2, 5, 8, seed=3)
    lens_q, lens_kv = torch.tensor([4, 6], dtype=torch.int32), torch.tensor([5, 0], dtype=torch.int32)
    handle = od.create("cpu", backend=backend)
    o, stats = F.scaled_dot_product_attention(
        q, k, v, seq_lens_q=lens_q, seq_lens_kv=lens_kv, return_stats=True, handle=handle
    )
    assert (o[0, :, 4:] == 0).all() and (o[1] == 0).all() and (stats[0, :, 4:] == -torch.inf).all()
    assert (stats[1] == -torch.inf).all() and torch.isfinite(stats[0, :, :4]).all()
    mask = torch.zeros(2, 1, 6, 5, dtype=torch.bool)
    mask[0, :, :4, :5] = True
    do = randn(2, 2, 6, 8, seed=4)
    expected = torch_gradients(q, k, v, do, mask)
    assert relative_error(o, expected[0]) < 1e-12
    grads = F.scaled_dot_product_attention_backward(
        do, q, k, v, o, stats, seq_lens_q=lens_q, seq_lens_kv=lens_kv, handle=handle
    )
    for ours, theirs in zip(grads, expected[1:]):
        assert relative_error(ours, theirs) < 1e-11
    assert (grads[0][1] == 0).all() and (grads[1][0, :, 5:] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_window_bottom_right_softcap_and_dropout_match_the_reference(backend):
    q, k, v = randn(2, 4, 10, 16, seed=1), randn(2, 2, 14, 16, seed=2), randn(2, 2, 14, 8, seed=3)
    bias = randn(2, 1, 10, 14, seed=4)
    lens_q, lens_kv = np.array([10, 7]), np.array([12, 14])
    params = AttentionDescriptor(
        causal=True,
        alignment=DiagonalAlignment.BOTTOM_RIGHT,
        window=(3, None),
        softcap=3.0,
        dropout_p=0.25,
        seed=99,
        offset=5,
    )
    kwargs = dict(
        dropout_p=0.25,
        is_causal=True,
        enable_gqa=True,
        window=(3, None),
        alignment="bottom_right",
        softcap=3.0,
        seed=99,
        offset=5,
        seq_lens_q=torch.from_numpy(lens_q),
        seq_lens_kv=torch.from_numpy(lens_kv),
    )
    handle = od.create("cpu", backend=backend)
    o, stats = F.scaled_dot_product_attention(q, k, v, bias, return_stats=True, handle=handle, **kwargs)
    arrays = [t.numpy() for t in (q, k, v)]
    expected_o, expected_stats = reference_forward(params, *arrays, bias.numpy(), lens_q, lens_kv)
    assert relative_error(o, torch.from_numpy(expected_o)) < 1e-12
    np.testing.assert_allclose(stats.numpy(), expected_stats, rtol=1e-12)
    do = randn(*o.shape, seed=5)
    grads = F.scaled_dot_product_attention_backward(
        do, q, k, v, o, stats, bias, mask_grad=True, handle=handle, **kwargs
    )
    expected = reference_backward(params, *arrays, do.numpy(), bias.numpy(), lens_q, lens_kv)
    for ours, theirs in zip(grads, expected):
        assert relative_error(ours, torch.from_numpy(theirs)) < 1e-11


def test_functional_returns_numpy_for_numpy():
    for shape in ((1, 2, 5, 8), (5, 8)):
        q, k, v = (randn(*shape, seed=n).numpy().astype(np.float32) for n in range(3))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, handle=od.create("cpu", backend="numpy"))
        assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.shape == shape
        expected = torch_functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=True)
        np.testing.assert_allclose(o, expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_2d_enable_gqa_is_the_call_without_it(backend):
    """A 2-D call has one query head and one key/value head: enable_gqa changes nothing (torch's SDPA
    raises an IndexError for it)."""
    handle = od.create("cpu", backend=backend)
    q, k, v = randn(6, 16, seed=1), randn(4, 16, seed=2), randn(4, 8, seed=3)
    o, stats = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_stats=True, handle=handle)
    do = randn(6, 8, seed=4)
    expected = torch_gradients(q, k, v, do)
    assert stats.shape == (6,) and relative_error(o, expected[0]) < 1e-12
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, enable_gqa=True, handle=handle)
    for ours, theirs in zip(grads, expected[1:], strict=True):
        assert ours.shape == theirs.shape and relative_error(ours, theirs) < 1e-11


# the cuDNN-shaped calls over any strides ----------------------------------------------------------------------


def layouts(batch, heads_q, heads_kv, seq_q, seq_kv, dim, dtype):
    """q, k, v as BHSD, as BSHD (a transposed view) and as one packed QKV buffer (B, S, 3, H, D)."""
    yield (
        "bhsd",
        (
            randn(batch, heads_q, seq_q, dim, dtype=dtype, seed=1),
            randn(batch, heads_kv, seq_kv, dim, dtype=dtype, seed=2),
            randn(batch, heads_kv, seq_kv, dim, dtype=dtype, seed=3),
        ),
    )
    yield (
        "bshd",
        tuple(
            randn(batch, s, h, dim, dtype=dtype, seed=n).transpose(1, 2)
            for n, (h, s) in enumerate(((heads_q, seq_q), (heads_kv, seq_kv), (heads_kv, seq_kv)))
        ),
    )
    if heads_q == heads_kv and seq_q == seq_kv:
        packed = randn(batch, seq_q, 3, heads_q, dim, dtype=dtype, seed=4)
        yield "packed_qkv", tuple(packed[:, :, n].transpose(1, 2) for n in range(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_api_forward_and_backward_over_every_layout(backend):
    handle = od.create("cpu", backend=backend)
    params = AttentionDescriptor(causal=True, window=(4, None))
    for heads_kv, seq_kv in ((2, 12), (1, 9)):
        for layout, (q, k, v) in layouts(2, 2, heads_kv, 12, seq_kv, 16, torch.float64):
            o = torch.full((2, 12, 2, 16), float("nan"), dtype=torch.float64).transpose(1, 2)  # BSHD out
            stats = torch.full((2, 2, 12), float("nan"), dtype=torch.float64)
            attention_forward(
                handle,
                params,
                descriptor(q),
                q,
                descriptor(k),
                k,
                descriptor(v),
                v,
                descriptor(o),
                o,
                stats_desc=descriptor(stats),
                stats=stats,
            )
            arrays = [t.numpy() for t in (q, k, v)]
            expected_o, expected_stats = reference_forward(params, *arrays)
            assert relative_error(o, torch.from_numpy(expected_o)) < 1e-12, layout
            np.testing.assert_allclose(stats.numpy(), expected_stats, rtol=1e-12)
            do = randn(2, 2, 12, 16, seed=5)
            grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
            attention_backward(
                handle,
                params,
                descriptor(q),
                q,
                descriptor(k),
                k,
                descriptor(v),
                v,
                descriptor(o),
                o,
                descriptor(do),
                do,
                descriptor(stats),
                stats,
                *(item for g in grads for item in (descriptor(g), g)),
            )
            for ours, theirs in zip(grads, reference_backward(params, *arrays, do.numpy())):
                assert relative_error(ours, torch.from_numpy(theirs)) < 1e-11, layout


# errors ---------------------------------------------------------------------------------------------------------


def call_forward(
    q_shape=(1, 2, 4, 16),
    k_shape=(1, 2, 5, 16),
    v_shape=(1, 2, 5, 16),
    o_shape=(1, 2, 4, 16),
    dtype="float64",
    params=None,
    **optional,
):
    handle = od.create("cpu", backend="numpy")
    descs = [od.TensorDescriptor(dtype, shape) for shape in (q_shape, k_shape, v_shape, o_shape)]
    arrays = [np.zeros(256, od.DataType.of(dtype).to_numpy()) for _ in descs]
    attention_forward(
        handle,
        params or AttentionDescriptor(),
        descs[0],
        arrays[0],
        descs[1],
        arrays[1],
        descs[2],
        arrays[2],
        descs[3],
        arrays[3],
        **optional,
    )


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: call_forward(params="causal"), od.BadParam, r"attn_desc='causal' must be an AttentionDescriptor"),
        (lambda: call_forward(q_shape=(2, 4, 16)), od.BadParam, r"q_desc.ndim=3 must be 4 \(batch, heads, sequence"),
        (lambda: call_forward(k_shape=(1, 2, 5, 8)), od.BadParam, r"k_desc.dims\[3\]=8 must equal q_desc.dims\[3\]=16"),
        (lambda: call_forward(v_shape=(1, 2, 4, 16)), od.BadParam, r"v_desc.dims\[2\]=4 must equal k_desc.dims\[2\]=5"),
        (
            lambda: call_forward(q_shape=(1, 3, 4, 16), o_shape=(1, 3, 4, 16)),
            od.BadParam,
            r"q_desc.dims\[1\]=3 must be a multiple of k_desc.dims\[1\]=2 \(query heads per key/value head\)",
        ),
        (lambda: call_forward(o_shape=(1, 2, 5, 16)), od.BadParam, r"o_desc.dims\[2\]=5 must equal q_desc.dims\[2\]=4"),
        (
            lambda: call_forward(
                q_shape=(1, 1, 1, 4), k_shape=(1, 1, 1, 4), v_shape=(1, 1, 1, 4), o_shape=(1, 1, 1, 4)
            ),
            od.NotSupported,
            r"q_desc.dims\[3\]=4 must be between 8 and 256 \(the head dims the kernels support\)",
        ),
        (
            lambda: call_forward(v_shape=(1, 2, 5, 264), o_shape=(1, 2, 4, 264)),
            od.NotSupported,
            r"v_desc.dims\[3\]=264 must be between 8 and 256",
        ),
        (
            lambda: call_forward(dtype="int32"),
            od.NotSupported,
            r"q_desc.dtype=INT32 must be FLOAT, DOUBLE, HALF, BFLOAT16, FP8_E4M3 or FP8_E5M2",
        ),
        (
            lambda: call_forward(stats_desc=od.TensorDescriptor("float64", (1, 2, 5)), stats=np.zeros(10)),
            od.BadParam,
            r"stats_desc.dims=\[1, 2, 5\] must be \[1, 2, 4\]",
        ),
        (
            lambda: call_forward(
                dtype="float32", stats_desc=od.TensorDescriptor("float64", (1, 2, 4)), stats=np.zeros(8)
            ),
            od.NotSupported,
            r"stats_desc.dtype=DOUBLE must be FLOAT for q_desc.dtype=FLOAT",
        ),
        (
            lambda: call_forward(bias_desc=od.TensorDescriptor("float64", (1, 2, 3, 5)), bias=np.zeros(30)),
            od.BadParam,
            r"bias_desc.dims\[2\]=3 must be 4 or 1 \(it broadcasts to \[1, 2, 4, 5\]\)",
        ),
        (
            lambda: call_forward(bias_desc=od.TensorDescriptor("float32", (1, 1, 4, 5)), bias=np.zeros(20, np.float32)),
            od.NotSupported,
            r"bias_desc.dtype=FLOAT must equal q_desc.dtype=DOUBLE \(added to the scores\) or be BOOLEAN",
        ),
        (
            lambda: call_forward(seq_lens_q_desc=od.TensorDescriptor("int32", (2,)), seq_lens_q=np.zeros(2, np.int32)),
            od.BadParam,
            r"seq_lens_q_desc.dims=\[2\] must be \[1\] \(one length per batch of q_desc\)",
        ),
        (
            lambda: call_forward(
                seq_lens_kv_desc=od.TensorDescriptor("float32", (1,)), seq_lens_kv=np.zeros(1, np.float32)
            ),
            od.NotSupported,
            r"seq_lens_kv_desc.dtype=FLOAT must be INT32 or INT64",
        ),
        (lambda: call_forward(bias=np.zeros(20)), od.BadParam, r"bias_desc=None but bias is given"),
        (
            lambda: call_forward(o_shape=(1, 2, 4, 16 * 8)),
            od.BadParam,
            r"o_desc.dims\[3\]=128 must equal v_desc.dims\[3\]",
        ),
        (
            lambda: call_forward(q_shape=(1, 2, 16, 16), o_shape=(1, 2, 16, 16)),
            od.BadParam,
            r"q_desc reaches 512 elements but q holds 256 from its start",
        ),
        (
            lambda: call_forward(alibi_slopes_desc=od.TensorDescriptor("float32", (3,)), alibi_slopes=np.ones(3)),
            od.BadParam,
            r"alibi_slopes_desc.dims=\[3\] must be \[2\] or \[1, 2\] \(one per query head, or per batch and query head",
        ),
        (
            lambda: call_forward(sinks_desc=od.TensorDescriptor("int32", (2,)), sinks=np.ones(2, np.int32)),
            od.NotSupported,
            r"sinks_desc.dtype=INT32 must be FLOAT or DOUBLE",
        ),
        (
            lambda: F.scaled_dot_product_attention(randn(8), randn(3, 8), randn(3, 8)),
            od.BadParam,
            r"query.ndim=1 must be at least 2 \(\.\.\., sequence, head dim\)",
        ),
        (
            lambda: F.scaled_dot_product_attention(randn(2, 1, 3, 8), randn(3, 2, 3, 8), randn(3, 2, 3, 8)),
            od.BadParam,
            r"key.shape\[-4\]=3 must be 2 or 1 \(the batch dims of query.shape=\[2, 1, 3, 8\]",
        ),
        (
            lambda: F.scaled_dot_product_attention(randn(1, 4, 3, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8)),
            od.BadParam,
            r"key.shape\[-3\]=2 must equal query.shape\[-3\]=4 unless enable_gqa=True",
        ),
        (
            lambda: F.scaled_dot_product_attention(randn(1, 2, 3, 8), randn(1, 2, 3, 16), randn(1, 2, 3, 8)),
            od.BadParam,
            r"key.shape\[-1\]=16 must equal query.shape\[-1\]=8",
        ),
        (
            lambda: F.scaled_dot_product_attention(
                randn(1, 2, 3, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8), randn(2, 2, 3, 3)
            ),
            od.BadParam,
            r"attn_mask.shape\[-4\]=2 must be 1 \(attn_mask.shape=\[2, 2, 3, 3\] broadcasts over query's leading "
            r"dims \[1\]\)",
        ),
        (
            lambda: F.scaled_dot_product_attention(
                randn(1, 2, 3, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8), dropout_p=1.5
            ),
            od.BadParam,
            r"dropout_p=1.5 must be at least 0 and below 1",
        ),
        (
            lambda: F.scaled_dot_product_attention(
                randn(1, 2, 3, 8), randn(1, 2, 3, 8), randn(1, 2, 3, 8), window=(1, -2)
            ),
            od.BadParam,
            r"window=\(1, -2\) must be a pair",
        ),
        (
            lambda: F.scaled_dot_product_attention_backward(
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3),
                mask_grad=True,
            ),
            od.BadParam,
            r"mask_grad=True needs a float attn_mask, got attn_mask=None",
        ),
        (
            lambda: F.scaled_dot_product_attention_backward(
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 4),
            ),
            od.BadParam,
            r"stats.shape=\[1, 2, 4\] must be \[1, 2, 3\] \(query's shape less its head dim, as the forward gives it",
        ),
        (
            lambda: F.scaled_dot_product_attention_backward(
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3, 8),
                randn(1, 2, 3),
                torch.ones(3, 3, dtype=torch.bool),
                mask_grad=True,
            ),
            od.NotSupported,
            r"mask_grad=True needs a float attn_mask: attn_mask.dtype=bool is a mask and has no gradient",
        ),
    ],
)
def test_errors_name_the_parameter_and_the_rule(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_backward_refuses_missing_gradients_before_binding():
    q = od.TensorDescriptor("float32", (1, 1, 4, 8))
    stats = od.TensorDescriptor("float32", (1, 1, 4))
    with pytest.raises(od.BadParam, match=r"dk_desc=None but the backward needs it"):
        attention_backward(
            od.create("cpu", backend="numpy"),
            AttentionDescriptor(),
            q,
            None,
            q,
            None,
            q,
            None,
            q,
            None,
            q,
            None,
            stats,
            None,
            q,
            None,
            None,
            None,
            q,
            None,
        )


# batch ranks, ALiBi and sinks, workspace --------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "q_shape, kv_shape, mask_shape",
    [((3, 5, 16), (3, 7, 16), (5, 7)), ((2, 3, 2, 5, 8), (2, 3, 2, 6, 8), (3, 1, 5, 6))],
    ids=["3d", "5d_broadcast_mask"],
)
def test_functional_takes_any_batch_rank_as_torch(backend, q_shape, kv_shape, mask_shape):
    handle = od.create("cpu", backend=backend)
    q, k, v, mask = randn(*q_shape, seed=1), randn(*kv_shape, seed=2), randn(*kv_shape, seed=3), randn(*mask_shape)
    do = randn(*q_shape, seed=4)
    expected = torch_gradients(q, k, v, do, mask)
    o, stats = F.scaled_dot_product_attention(q, k, v, mask, return_stats=True, handle=handle)
    assert stats.shape == q_shape[:-1]
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, mask, mask_grad=True, handle=handle)
    for ours, theirs in zip([o, *grads], expected, strict=True):
        assert ours.shape == theirs.shape and relative_error(ours, theirs) < 1e-10


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_alibi_and_sinks_match_the_reference(backend):
    handle = od.create("cpu", backend=backend)
    q, k, v = randn(2, 4, 9, 16, seed=1), randn(2, 2, 12, 16, seed=2), randn(2, 2, 12, 16, seed=3)
    slopes, sinks, do = torch.rand(4, dtype=torch.float64), randn(4, seed=4), randn(2, 4, 9, 16, seed=5)
    kwargs = dict(enable_gqa=True, window=(5, 0), alibi_slopes=slopes, sinks=sinks)
    o, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, handle=handle, **kwargs)
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, o, stats, handle=handle, **kwargs)
    params = AttentionDescriptor(window=(5, 0))
    arrays = [t.numpy() for t in (q, k, v)]
    extras = dict(alibi_slopes=slopes.numpy(), sinks=sinks.numpy())
    expected_o, expected_stats = reference_forward(params, *arrays, **extras)
    expected = reference_backward(params, *arrays, do.numpy(), **extras)
    assert len(grads) == 4
    pairs = zip(
        (o, stats, *grads), (expected_o, expected_stats, expected.dq, expected.dk, expected.dv, expected.dsinks)
    )
    for ours, theirs in pairs:
        assert relative_error(ours, torch.from_numpy(theirs)) < 1e-10


def test_workspace_queries_give_what_the_kernels_allocate(monkeypatch):
    handle, numpy_handle = od.create("cpu", backend="triton"), od.create("cpu", backend="numpy")
    q, k, v, do = (
        randn(2, 4, 9, 16, seed=1),
        randn(2, 2, 12, 16, seed=2),
        randn(2, 2, 12, 16, seed=3),
        randn(2, 4, 9, 16),
    )
    o, dq = torch.empty_like(q), torch.empty_like(q)
    dk, dv, stats = torch.empty_like(k), torch.empty_like(v), torch.empty(2, 4, 9, dtype=torch.float64)
    sinks, dsinks = randn(4, seed=4), torch.empty(4, dtype=torch.float64)
    forward = [descriptor(t) for t in (q, k, v, o)]
    backward = [*forward, *(descriptor(t) for t in (do, stats, dq, dk, dv))]
    extra = dict(sinks_desc=descriptor(sinks), dsinks_desc=descriptor(dsinks))
    params = AttentionDescriptor()
    assert od.get_attention_forward_workspace_size(handle, params, *forward, stats_desc=backward[5]) == 0
    size = od.get_attention_backward_workspace_size(handle, params, *backward, **extra)
    assert size == 2 * 4 * 9 * 8  # delta: one float64 a query row
    assert od.get_attention_backward_workspace_size(numpy_handle, params, *backward, **extra) == 0
    allocated = []
    empty = torch.empty

    def recording_empty(*args, **kwargs):
        if isinstance(args[0], int):  # a one-dim array: a call's scratch, in bytes
            allocated.append(args[0] * kwargs["dtype"].itemsize)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording_empty)
    o_ = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, sinks=sinks, return_stats=True, handle=handle)
    F.scaled_dot_product_attention_backward(do, q, k, v, *o_, enable_gqa=True, sinks=sinks, handle=handle)
    assert allocated == [size]
    with pytest.raises(od.BadParam, match=r"dbias_desc is not a descriptor of this call"):
        od.get_attention_forward_workspace_size(handle, params, *forward, dbias_desc=forward[0])
