"""Attention's float64 NumPy reference against independent oracles: torch's SDPA on the CPU (forward
and autograd gradients) with masks built here from their definitions, a plain torch formula for
softcap and dropout, finite differences, and Triton's own tl.rand for the dropout generator."""

import numpy as np
import pytest
import torch
import torch.nn.functional as torch_functional
import triton
import triton.language as tl

from opendnn.core.errors import BadParam
from opendnn.families.attention.problem import (
    AttentionDescriptor,
    DiagonalAlignment,
    dropout_keep,
    philox_uniform,
    reference_backward,
    reference_forward,
)


def random(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape)


def torch_attention(q, k, v, do, **kwargs):
    """torch's SDPA in float64: (o, dq, dk, dv[, dmask]) through autograd."""
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]
    mask = kwargs.pop("attn_mask", None)
    if mask is not None and mask.dtype != np.bool_:
        mask = torch.from_numpy(mask).requires_grad_()
        leaves.append(mask)
    elif mask is not None:
        mask = torch.from_numpy(mask)
    o = torch_functional.scaled_dot_product_attention(*leaves[:3], attn_mask=mask, **kwargs)
    o.backward(torch.from_numpy(do))
    return [o.detach().numpy()] + [leaf.grad.numpy() for leaf in leaves]


def band_mask(seq_q, seq_kv, left, right, shift=0):
    """Keys j with i + shift - left <= j <= i + shift + right, by loops."""
    mask = np.zeros((seq_q, seq_kv), bool)
    for i in range(seq_q):
        for j in range(seq_kv):
            mask[i, j] = (left is None or j >= i + shift - left) and (right is None or j <= i + shift + right)
    return mask


def check_against_torch(params, q, k, v, bias=None, seq_lens=(None, None), **torch_kwargs):
    do = random(*q.shape[:3], v.shape[3], seed=9)
    o, lse = reference_forward(params, q, k, v, bias, *seq_lens)
    dq, dk, dv, dbias, _ = reference_backward(params, q, k, v, do, bias, *seq_lens)
    expected = torch_attention(q, k, v, do, **torch_kwargs)
    for ours, theirs in zip((o, dq, dk, dv, dbias), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    return o, lse


# against torch's SDPA ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_q, seq_kv", [(5, 5), (4, 7), (7, 3)])
def test_reference_matches_torch_plain_and_causal_top_left(seq_q, seq_kv):
    q, k, v = random(2, 3, seq_q, 8, seed=1), random(2, 3, seq_kv, 8, seed=2), random(2, 3, seq_kv, 12, seed=3)
    _, lse = check_against_torch(AttentionDescriptor(), q, k, v)
    scores = q @ k.swapaxes(-1, -2) / np.sqrt(8)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), rtol=1e-12)
    check_against_torch(AttentionDescriptor(causal=True), q, k, v, is_causal=True)


def test_reference_causal_bottom_right_and_window_match_masks_built_by_loops():
    q, k, v = random(1, 2, 5, 8, seed=1), random(1, 2, 9, 8, seed=2), random(1, 2, 9, 8, seed=3)
    bottom_right = AttentionDescriptor(causal=True, alignment=DiagonalAlignment.BOTTOM_RIGHT)
    check_against_torch(bottom_right, q, k, v, attn_mask=band_mask(5, 9, None, 0, shift=4))
    for window, alignment, shift in (((2, 1), "top_left", 0), ((1, 0), "bottom_right", 4), ((0, None), "top_left", 0)):
        params = AttentionDescriptor(window=window, alignment=alignment)
        check_against_torch(params, q, k, v, attn_mask=band_mask(5, 9, *window, shift=shift))


def test_reference_gqa_float_bias_gradient_and_scale_match_torch():
    q, k, v = random(2, 6, 5, 16, seed=1), random(2, 2, 7, 16, seed=2), random(2, 2, 7, 8, seed=3)
    for bias_shape in [(2, 6, 5, 7), (1, 6, 1, 7), (2, 1, 5, 1)]:
        bias = random(*bias_shape, seed=4)
        check_against_torch(AttentionDescriptor(scale=0.3), q, k, v, bias, attn_mask=bias, scale=0.3, enable_gqa=True)


def test_reference_boolean_mask_and_seq_lens_give_zero_rows_as_torch():
    q, k, v = random(2, 2, 6, 8, seed=1), random(2, 2, 5, 8, seed=2), random(2, 2, 5, 8, seed=3)
    mask = np.random.default_rng(5).uniform(size=(2, 1, 6, 5)) < 0.7
    mask[0, 0, 2] = False  # a fully masked row: o = 0, lse = -inf, no gradient
    o, lse = check_against_torch(AttentionDescriptor(), q, k, v, mask, attn_mask=mask)
    assert (o[0, :, 2] == 0).all() and (lse[0, :, 2] == -np.inf).all()
    lens_q, lens_kv = np.array([4, 6]), np.array([5, 2])
    padding = np.zeros((2, 1, 6, 5), bool)
    for b in range(2):
        padding[b, :, : lens_q[b], : lens_kv[b]] = True
    o, lse = check_against_torch(AttentionDescriptor(), q, k, v, seq_lens=(lens_q, lens_kv), attn_mask=padding)
    assert (o[0, :, 4:] == 0).all() and (lse[0, :, 4:] == -np.inf).all() and np.isfinite(lse[1]).all()


def test_reference_bottom_right_aligns_to_each_batchs_own_lengths():
    q, k, v = random(2, 1, 4, 8, seed=1), random(2, 1, 6, 8, seed=2), random(2, 1, 6, 8, seed=3)
    lens_q, lens_kv = np.array([3, 4]), np.array([6, 2])
    mask = np.zeros((2, 1, 4, 6), bool)
    for b in range(2):
        mask[b, 0, : lens_q[b], : lens_kv[b]] = band_mask(lens_q[b], lens_kv[b], None, 0, shift=lens_kv[b] - lens_q[b])
    params = AttentionDescriptor(causal=True, alignment=DiagonalAlignment.BOTTOM_RIGHT)
    check_against_torch(params, q, k, v, seq_lens=(lens_q, lens_kv), attn_mask=mask)


# softcap and dropout, against a torch formula ------------------------------------------------------------


def test_reference_softcap_and_dropout_match_a_torch_formula():
    q, k, v = random(2, 4, 5, 8, seed=1), random(2, 2, 6, 8, seed=2), random(2, 2, 6, 8, seed=3)
    bias, do = random(1, 4, 5, 6, seed=4), random(2, 4, 5, 8, seed=5)
    params = AttentionDescriptor(causal=True, softcap=2.5, dropout_p=0.3, seed=123, offset=7)
    keep = torch.from_numpy(dropout_keep(params, (2, 4, 5, 6)))
    assert 0.5 < keep.double().mean() < 0.9
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v, bias)]
    tq, tk, tv, tb = leaves
    tk, tv = tk.repeat_interleave(2, 1), tv.repeat_interleave(2, 1)
    s = 2.5 * torch.tanh(tq @ tk.transpose(-1, -2) / np.sqrt(8) / 2.5) + tb
    s = s.masked_fill(~torch.ones(5, 6, dtype=torch.bool).tril(), float("-inf"))
    o = (torch.softmax(s, -1) * keep / 0.7) @ tv
    o.backward(torch.from_numpy(do))
    np.testing.assert_allclose(reference_forward(params, q, k, v, bias)[0], o.detach().numpy(), rtol=1e-10)
    for ours, leaf in zip(reference_backward(params, q, k, v, do, bias), leaves):
        np.testing.assert_allclose(ours, leaf.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_reference_alibi_and_sinks_match_a_torch_formula():
    """ALiBi: -slope * |j - (i + Skv - Sq)| bottom-right (FlashAttention's); a sink: a column of logits
    in the softmax that multiplies no value."""
    q, k, v = random(2, 2, 5, 8, seed=1), random(2, 2, 7, 8, seed=2), random(2, 2, 7, 8, seed=3)
    slopes, sinks, do = np.abs(random(2, 2, seed=4)), random(2, seed=5), random(2, 2, 5, 8, seed=6)
    params = AttentionDescriptor(causal=True, alignment="bottom_right")
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v, sinks)]
    tq, tk, tv, ts = leaves
    i, j = torch.arange(5).reshape(5, 1), torch.arange(7).reshape(1, 7)
    distance = (i + 2 - j).abs().double()
    s = tq @ tk.transpose(-1, -2) / np.sqrt(8) - torch.from_numpy(slopes)[:, :, None, None] * distance
    s = s.masked_fill(j > i + 2, float("-inf"))
    with_sink = torch.cat([s, ts.reshape(1, 2, 1, 1).expand(2, 2, 5, 1)], -1)
    o = torch.softmax(with_sink, -1)[..., :7] @ tv
    o.backward(torch.from_numpy(do))
    ours, lse = reference_forward(params, q, k, v, alibi_slopes=slopes, sinks=sinks)
    np.testing.assert_allclose(ours, o.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(lse, torch.logsumexp(with_sink, -1).detach().numpy(), rtol=1e-12)
    gradients = reference_backward(params, q, k, v, do, alibi_slopes=slopes, sinks=sinks)
    assert gradients.dbias is None
    for ours, leaf in zip((gradients.dq, gradients.dk, gradients.dv, gradients.dsinks), leaves, strict=True):
        np.testing.assert_allclose(ours, leaf.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_reference_sinks_give_rows_without_keys_zero_output_and_the_sink_as_lse():
    q, k, v = random(1, 2, 3, 8, seed=1), random(1, 2, 4, 8, seed=2), random(1, 2, 4, 8, seed=3)
    sinks = random(2, seed=4)
    o, lse = reference_forward(AttentionDescriptor(), q, k, v, seq_lens_q=np.array([2]), sinks=sinks)
    assert np.all(o[:, :, 2] == 0) and np.all(np.abs(o[:, :, :2]) > 0)
    np.testing.assert_array_equal(lse[0, :, 2], sinks)


def test_reference_backward_matches_finite_differences():
    q, k, v = random(1, 2, 4, 8, seed=1), random(1, 1, 5, 8, seed=2), random(1, 1, 5, 8, seed=3)
    bias, do = random(1, 2, 4, 5, seed=4), random(1, 2, 4, 8, seed=5)
    slopes, sinks = np.abs(random(2, seed=6)), random(2, seed=7)
    params = AttentionDescriptor(window=(2, 1), softcap=1.5, dropout_p=0.2, seed=5)
    gradients = reference_backward(params, q, k, v, do, bias, alibi_slopes=slopes, sinks=sinks)
    inputs = [q, k, v, bias, sinks]
    for index, gradient in enumerate(gradients):
        direction = random(*inputs[index].shape, seed=10 + index)

        def loss(step, index=index, direction=direction):
            moved = [a + step * direction if n == index else a for n, a in enumerate(inputs)]
            *tensors, moved_sinks = moved
            o = reference_forward(params, *tensors, alibi_slopes=slopes, sinks=moved_sinks)[0]
            return float((do * o).sum())

        numeric = (loss(1e-6) - loss(-1e-6)) / 2e-6
        assert float((gradient * direction).sum()) == pytest.approx(numeric, rel=1e-6, abs=1e-9), index


# the dropout generator -------------------------------------------------------------------------------------


@triton.jit
def rand_kernel(out_ptr, counters_ptr, seed, COUNT: tl.constexpr):
    lanes = tl.arange(0, COUNT)
    tl.store(out_ptr + lanes, tl.rand(seed, tl.load(counters_ptr + lanes)))


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 + 17, 2**63 - 1])
def test_philox_uniform_equals_triton_rand_bit_for_bit(seed):
    counters = np.concatenate([np.arange(100), 2**32 - 50 + np.arange(100), [2**40 + 3, 2**62 + 2**33 + 5]])
    counters = np.concatenate([counters, np.arange(256 - counters.size) * 7919 + 2**31]).astype(np.int64)
    out = torch.full((256,), float("nan"))
    rand_kernel[(1,)](out, torch.from_numpy(counters), seed, COUNT=256)
    expected = philox_uniform(seed, counters)
    assert expected.dtype == np.float32 and (expected >= 0).all() and (expected < 1).all()
    np.testing.assert_array_equal(out.numpy().view(np.uint32), expected.view(np.uint32))


def test_dropout_mask_depends_on_seed_and_offset_only():
    params = AttentionDescriptor(dropout_p=0.5, seed=3, offset=10)
    keep = dropout_keep(params, (2, 2, 3, 4))
    again = dropout_keep(AttentionDescriptor(dropout_p=0.5, seed=3, offset=10, causal=True), (2, 2, 3, 4))
    shifted = dropout_keep(AttentionDescriptor(dropout_p=0.5, seed=3, offset=11), (2, 2, 3, 4))
    assert np.array_equal(keep, again)
    assert np.array_equal(keep.reshape(-1)[1:], shifted.reshape(-1)[:-1])
    assert not np.array_equal(keep, dropout_keep(AttentionDescriptor(dropout_p=0.5, seed=4, offset=10), (2, 2, 3, 4)))


# the descriptor's rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(scale=float("nan")), r"scale=nan must be a finite number or None"),
        (dict(causal=1), r"causal=1 must be a bool"),
        (dict(alignment="middle"), r"alignment='middle' must be a DiagonalAlignment \(TOP_LEFT or BOTTOM_RIGHT\)"),
        (dict(window=(-1, 0)), r"window=\(-1, 0\) must be a pair \(left, right\), each an int at least 0 or None"),
        (dict(window=3), r"window=3 must be a pair"),
        (dict(softcap=0.0), r"softcap=0.0 must be positive and finite, or None"),
        (dict(dropout_p=1.0), r"dropout_p=1.0 must be at least 0 and below 1"),
        (dict(seed=-1), r"seed=-1 must be an int from 0 to 2\*\*63 - 1"),
        (dict(offset=2**62 + 1), r"offset=4611686018427387905 must be an int from 0 to 2\*\*62"),
    ],
)
def test_descriptor_errors_name_the_field_and_the_rule(fields, message):
    with pytest.raises(BadParam, match=message):
        AttentionDescriptor(**fields)


def test_descriptor_folds_causal_into_the_band_and_resolves_the_scale():
    assert AttentionDescriptor(causal=True, window=(3, 5)).band == (3, 0)
    assert AttentionDescriptor(window=(None, 2)).band == (None, 2)
    assert AttentionDescriptor().resolved_scale(64) == 0.125 and AttentionDescriptor(scale=2).resolved_scale(64) == 2.0
    assert AttentionDescriptor(alignment="bottom_right").alignment is DiagonalAlignment.BOTTOM_RIGHT


def test_the_parameters_and_the_reference_stay_importable_from_problem():
    """problem holds the rules; the parameters and the reference live beside it and keep their old address."""
    from opendnn.families.attention import descriptor, problem, reference

    moved = {
        descriptor: ("AttentionDescriptor", "DiagonalAlignment", "MAX_SEED", "MAX_OFFSET"),
        reference: (
            "philox_uniform", "dropout_keep", "diagonal_offsets", "allowed_keys", "Extras", "Gradients",
            "reference_forward", "reference_backward", "padded", "packed", "ragged_reference", "gathered",
            "PHILOX_KEY_A", "PHILOX_KEY_B", "PHILOX_ROUND_A", "PHILOX_ROUND_B", "PHILOX_ROUNDS", "UINT32",
        ),
    }  # fmt: skip
    for home, names in moved.items():
        for name in names:
            assert getattr(problem, name) is getattr(home, name), name
            assert name in problem.__all__, name
    assert set(problem.__all__) <= set(vars(problem))
