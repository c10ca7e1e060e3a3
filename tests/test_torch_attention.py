"""Scaled dot-product attention inside PyTorch: the ``opendnn::`` operator against torch's SDPA
(forward and gradients, any batch rank, GQA, masks), ALiBi and sinks against the float64 reference,
torch.compile / torch.export / torch.func over it, and ``enable()`` routing F.scaled_dot_product_attention
and nn.MultiheadAttention in a transformer block, forward and backward, with torch's own kernels
taking what opendnn refuses."""

import copy

import numpy as np
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import opendnn.torch as ot
from opendnn.families.attention.problem import AttentionDescriptor, reference_backward, reference_forward
from opendnn.torch.attention import scaled_dot_product_attention

ops = torch.ops.opendnn
sdpa = torch.nn.functional.scaled_dot_product_attention


def randn(*shape, grad=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_(grad)


# (query shape, key/value shape, mask shape or None, keywords)
CASES = {
    "3d_float_mask": ((3, 5, 16), (3, 7, 16), (5, 7), {}),
    "4d_gqa_causal": ((2, 4, 6, 16), (2, 2, 6, 16), None, dict(is_causal=True, enable_gqa=True)),
    "5d_broadcast_mask_scale": ((2, 3, 2, 5, 8), (2, 3, 2, 6, 8), (3, 1, 5, 6), dict(scale=0.4)),
    "4d_boolean_mask": ((2, 2, 5, 8), (2, 2, 9, 8), (2, 1, 5, 9), {}),
    "2d_float_mask_scale": ((5, 16), (7, 16), (5, 7), dict(scale=0.4)),
    "2d_causal": ((6, 8), (9, 8), None, dict(is_causal=True)),
    "2d_boolean_mask": ((5, 8), (9, 8), (5, 9), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_operator_matches_torch_forward_and_gradients(name):
    q_shape, kv_shape, mask_shape, keywords = CASES[name]
    q, k, v = randn(*q_shape, seed=1), randn(*kv_shape, seed=2), randn(*kv_shape, seed=3)
    mask = None
    if mask_shape is not None:
        mask = randn(*mask_shape, seed=4)
        if name.endswith("boolean_mask"):
            mask = (mask > -0.5).detach()
    leaves = [t for t in (q, k, v, mask) if t is not None and t.requires_grad]
    expected = sdpa(q, k, v, mask, **keywords)
    do = randn(*expected.shape, grad=False, seed=5)
    expected_grads = torch.autograd.grad(expected, leaves, do)
    ours = scaled_dot_product_attention(q, k, v, mask, **keywords)
    assert ours.grad_fn.name() == "ScaledDotProductAttentionBackward"
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
    for got, want in zip(torch.autograd.grad(ours, leaves, do), expected_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_gradient_penalty_through_attention_is_refused_naming_the_backward_operator():
    """The first derivatives taken with create_graph=True are part of the graph (they need the
    query's), so a second backward reaches the backward operator, which refuses: never gradients
    silently cut from the graph. The statistics need no gradient, as torch's log-sum-exp."""
    q, k, v = randn(1, 2, 3, 8, seed=1), randn(1, 2, 5, 8, seed=2), randn(1, 2, 5, 8, seed=3)
    out, stats = ops.scaled_dot_product_attention(
        q, k, v, None, 0.0, False, None, False, None, None, None, None, "top_left", None, 0
    )
    assert out.requires_grad and not stats.requires_grad
    dq, dk = torch.autograd.grad(out.square().sum(), (q, k), create_graph=True)
    assert dq.requires_grad and dk.requires_grad
    with pytest.raises(RuntimeError, match=r"^opendnn::scaled_dot_product_attention_backward has no gradient"):
        (dq.square().sum() + dk.square().sum()).backward()


def test_batched_output_gradients_give_each_ones_gradients():
    """``torch.autograd.grad(..., is_grads_batched=True)`` (several output gradients at once, as
    ``torch.autograd.functional.jacobian(vectorize=True)`` passes them) through the backward operator."""
    q, k, v = randn(1, 2, 3, 8, seed=1), randn(1, 2, 5, 8, seed=2), randn(1, 2, 5, 8, seed=3)
    sinks = randn(2, seed=4)
    dos = randn(3, 1, 2, 3, 8, grad=False, seed=5)
    ours = torch.autograd.grad(
        scaled_dot_product_attention(q, k, v, sinks=sinks), (q, k, v, sinks), dos, is_grads_batched=True
    )
    for sample, do in enumerate(dos):
        each = torch.autograd.grad(scaled_dot_product_attention(q, k, v, sinks=sinks), (q, k, v, sinks), do)
        for got, want in zip(ours, each, strict=True):
            torch.testing.assert_close(got[sample], want, rtol=1e-10, atol=1e-12)


def test_opcheck_passes_on_2d_query_key_and_value():
    q, k, v, mask = randn(5, 16, seed=1), randn(7, 16, seed=2), randn(7, 8, seed=3), randn(5, 7, seed=4)
    options = (0.0, False, 0.5, False, None, None, None, None, "top_left", None, 0)
    torch.library.opcheck(ops.scaled_dot_product_attention.default, (q, k, v, mask, *options))
    out, stats = ops.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), mask.detach(), *options)
    assert out.shape == (5, 8) and stats.shape == (5,)
    backward = (randn(5, 8, grad=False, seed=5), q.detach(), k.detach(), v.detach(), out, stats, mask.detach())
    torch.library.opcheck(ops.scaled_dot_product_attention_backward.default, (*backward, *options, True))


def test_operator_alibi_and_sinks_match_the_reference_with_the_sinks_gradient():
    q, k, v = randn(2, 4, 6, 8, seed=1), randn(2, 2, 9, 8, seed=2), randn(2, 2, 9, 8, seed=3)
    slopes, sinks = torch.rand(2, 4, dtype=torch.float64), randn(4, seed=4)
    keywords = dict(is_causal=True, enable_gqa=True, alignment="bottom_right")
    out = scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, sinks=sinks, **keywords)
    do = randn(*out.shape, grad=False, seed=5)
    grads = torch.autograd.grad(out, (q, k, v, sinks), do)
    params = AttentionDescriptor(causal=True, alignment="bottom_right")
    arrays = [t.detach().numpy() for t in (q, k, v)]
    extras = dict(alibi_slopes=slopes.numpy(), sinks=sinks.detach().numpy())
    expected_out, _ = reference_forward(params, *arrays, **extras)
    expected = reference_backward(params, *arrays, do.numpy(), **extras)
    np.testing.assert_allclose(out.detach().numpy(), expected_out, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, (expected.dq, expected.dk, expected.dv, expected.dsinks), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_backward_operator_gives_the_mask_and_sinks_gradients_only_when_asked():
    q, k, v, mask = randn(1, 2, 4, 8), randn(1, 2, 4, 8, seed=1), randn(1, 2, 4, 8, seed=2), randn(1, 2, 4, 4, seed=3)
    options = (0.0, False, None, False, None, None, None, None, "top_left", None, 0)
    out, stats = ops.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), mask.detach(), *options)
    args = (torch.ones_like(out), q.detach(), k.detach(), v.detach(), out, stats, mask.detach(), *options)
    without = ops.scaled_dot_product_attention_backward(*args, False)
    assert [g.shape for g in without[3:]] == [(0,), (0,)]  # no mask gradient, no sinks
    grads = ops.scaled_dot_product_attention_backward(*args, True)
    assert grads[3].shape == mask.shape and torch.isfinite(grads[3]).all() and grads[4].shape == (0,)


class Attention(torch.nn.Module):
    """Self-attention on the opendnn operator: GQA, causal, sinks as a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 32, dtype=torch.float64)
        self.sinks = torch.nn.Parameter(torch.randn(2, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(*x.shape[:2], 4, 8).transpose(1, 2).split([2, 1, 1], dim=1)
        out = scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, sinks=self.sinks)
        return out.transpose(1, 2).flatten(2)


def attention_operators(graph):
    return {
        node.target.name()
        for node in graph.nodes
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target)
    }


def training_step(model, x):
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(torch.ones_like(y))
    return [y, x.grad, *(p.grad for p in model.parameters())]


def test_compile_traces_the_operator_and_its_backward_without_graph_breaks():
    torch.manual_seed(0)
    model, x = Attention(), randn(2, 5, 16, grad=False)
    graphs = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(graph_module, example_inputs):
            graphs[kind].append(graph_module)
            return graph_module

        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(
        copy.deepcopy(model), backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    )
    expected = training_step(copy.deepcopy(model), x)
    for ours, theirs in zip(training_step(compiled, x), expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    assert len(graphs["forward"]) == 1 and len(graphs["backward"]) == 1
    assert attention_operators(graphs["forward"][0].graph) == {"opendnn::scaled_dot_product_attention"}
    assert attention_operators(graphs["backward"][0].graph) == {"opendnn::scaled_dot_product_attention_backward"}
    torch._dynamo.reset()
    eager_backend = torch.compile(copy.deepcopy(model), backend="eager", fullgraph=True)
    for ours, theirs in zip(training_step(eager_backend, x), expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)


def test_export_gives_a_program_of_the_operator_that_runs():
    torch.manual_seed(0)
    model, x = Attention(), randn(2, 5, 16, grad=False)
    program = torch.export.export(model, (x,))
    assert attention_operators(program.graph) == {"opendnn::scaled_dot_product_attention"}
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), model(x), rtol=1e-12, atol=1e-12)


def test_func_grad_gives_torchs_gradients():
    q, k, v = (
        randn(2, 2, 5, 8, grad=False),
        randn(2, 2, 5, 8, grad=False, seed=1),
        randn(2, 2, 5, 8, seed=2, grad=False),
    )

    def loss(function, q):
        return (function(q, k, v, is_causal=True) ** 2).sum()

    ours = torch.func.grad(lambda q: loss(scaled_dot_product_attention, q))(q)
    torch.testing.assert_close(ours, torch.func.grad(lambda q: loss(sdpa, q))(q), rtol=1e-10, atol=1e-12)


class Block(torch.nn.Module):
    """A transformer block of both attentions: nn.MultiheadAttention (causal) and F.scaled_dot_product_attention."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(width)
        self.mha = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.nn.Transformer.generate_square_subsequent_mask(length, dtype=x.dtype)
        h = self.norm(x)
        x = x + self.mha(h, h, h, attn_mask=causal, need_weights=False, is_causal=True)[0]
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        return x + self.proj(sdpa(q, k, v, is_causal=True).transpose(1, 2).flatten(2))


def test_enable_routes_a_transformer_blocks_attention_with_torchs_results():
    torch.manual_seed(0)
    model = Block().double()
    ours_model = copy.deepcopy(model)
    x = randn(2, 7, 32, grad=False)
    theirs = training_step(model, x)
    with ot.enabled():
        y = ours_model(x.clone().requires_grad_())
        nodes, queue = set(), [y.grad_fn]
        while queue:
            node = queue.pop()
            if node is not None and node not in nodes:
                nodes.add(node)
                queue += [next_node for next_node, _ in node.next_functions]
        ours = training_step(ours_model, x)
    assert sum(node.name() == "ScaledDotProductAttentionBackward" for node in nodes) == 2
    for got, want in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_enable_leaves_what_opendnn_refuses_to_torch():
    """A head dim of 4 is below opendnn's 8: torch's own SDPA computes it, gradients included."""
    q, k, v = randn(1, 2, 5, 4), randn(1, 2, 5, 4, seed=1), randn(1, 2, 5, 4, seed=2)
    expected = sdpa(q, k, v, is_causal=True)
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    with ot.enabled():
        ours = sdpa(q, k, v, is_causal=True)
        assert ours.grad_fn.name() != "ScaledDotProductAttentionBackward"
        grads = torch.autograd.grad(ours.sum(), (q, k, v))
    torch.testing.assert_close(ours, expected)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_convert_says_why_multihead_attention_runs_through_the_routed_call():
    report = ot.convert(Block())
    reasons = {name: reason for name, _, reason in report.left_alone}
    assert "mha" in reasons and "F.scaled_dot_product_attention" in reasons["mha"]
