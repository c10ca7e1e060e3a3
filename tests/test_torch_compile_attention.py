"""``torch.compile(backend="opendnn")`` lowers scaled dot-product attention: torch's CPU operator
compiled from ``F.scaled_dot_product_attention`` (causal, float and boolean masks, a scale,
grouped-query attention) and a small GPT block against eager torch, forward and backward; the
logsumexp each lowering saves in torch's format (our forward's into torch's backward and torch's
into ours); and the CUDA operators (FlashAttention, memory-efficient, cuDNN), lowered from FX
graphs built by hand and run on CPU tensors against a float64 reference."""

import copy
import math
import operator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF

from opendnn.samples import relative_error
from opendnn.torch.compile_backend import OpendnnBackend, Supported

aten = torch.ops.aten
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()


def reference(q, k, v, bias=None, is_causal=False, scale=None):
    """(out, logsumexp) in float64: the softmax of ``scale * q . k + bias`` (causal: key j <= query
    i) against v, query head h reading key head h // (Hq / Hkv)."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if bias is not None:
        scores = scores + bias.double()
    if is_causal:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(above, -math.inf)
    return torch.softmax(scores, -1) @ v, scores.logsumexp(-1)


def reference_gradients(grad, q, k, v, bias=None, is_causal=False, scale=None):
    """(dq, dk, dv) and, with a bias, dbias of ``reference``'s out, in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    if bias is not None:
        leaves.append(bias.detach().double().requires_grad_())
    out, _ = reference(*leaves[:3], leaves[3] if bias is not None else None, is_causal, scale)
    return torch.autograd.grad(out, leaves, grad.double())


def attention_inputs(dtype, batch=2, heads=4, kv_heads=4, queries=8, keys=8, head_dim=16, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, queries, head_dim, dtype=dtype)
    k = torch.randn(batch, kv_heads, keys, head_dim, dtype=dtype)
    v = torch.randn(batch, kv_heads, keys, head_dim, dtype=dtype)
    return q, k, v


def describes(backend, op):
    return any(f"({op})" in plan.describe() for plan in backend.plans)


# ---- F.scaled_dot_product_attention compiled on the CPU --------------------------------------------


CASES = {
    "causal": lambda: {"is_causal": True},
    "float mask": lambda: {"attn_mask": torch.randn(2, 1, 8, 8, dtype=torch.float64)},
    "boolean mask": lambda: {"attn_mask": torch.rand(8, 8) > 0.3},
    "scale": lambda: {"scale": 0.3, "is_causal": True},
    "grouped-query": lambda: {"enable_gqa": True, "is_causal": True},
    "fewer queries than keys, causal": lambda: {"is_causal": True},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_sdpa_matches_eager_float64_forward_and_backward(case, dtype):
    options = CASES[case]()
    if "attn_mask" in options and options["attn_mask"].is_floating_point():
        options["attn_mask"] = options["attn_mask"].to(dtype)
    kv_heads = 2 if case == "grouped-query" else 4
    queries = 5 if case.startswith("fewer") else 8
    q, k, v = (t.requires_grad_() for t in attention_inputs(dtype, kv_heads=kv_heads, queries=queries))
    backend = OpendnnBackend()
    compiled = torch.compile(lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **options), backend=backend)
    out = compiled(q, k, v)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)

    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    wide_options = {
        key: value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
        for key, value in options.items()
    }
    expected = TF.scaled_dot_product_attention(*wide, **wide_options)
    expected_grads = torch.autograd.grad(expected, wide, grad.double())
    for ours, theirs in zip((out, *grads), (expected, *expected_grads), strict=True):
        assert ours.dtype == dtype and not ours.isnan().any()
        assert relative_error(ours, theirs) < TOLERANCE[dtype]
    assert backend.fallbacks == [] and backend.plans_executed == 2
    assert describes(backend, "sdpa") and describes(backend, "sdpa_backward")


class GptBlock(nn.Module):
    """Pre-norm causal self-attention (one Linear for q, k and v, heads by view and transpose, a
    projection) and a GELU MLP, each with its residual."""

    def __init__(self, width=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = TF.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.fc2(TF.gelu(self.fc1(self.ln2(x))))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_compiled_gpt_block_matches_eager_float64_with_its_attention_lowered(dtype):
    torch.manual_seed(0)
    model = GptBlock().to(dtype)
    wide = copy.deepcopy(model).double()
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 8, 16, dtype=dtype)
    for _ in range(2):  # the second step runs the plans built by the first
        model.zero_grad()
        wide.zero_grad()
        out = compiled(x)
        out.square().sum().backward()
        expected = wide(x.double())
        expected.square().sum().backward()
        assert relative_error(out, expected) < TOLERANCE[dtype]
        for ours, theirs in zip(model.parameters(), wide.parameters(), strict=True):
            assert ours.grad.dtype == dtype and relative_error(ours.grad, theirs.grad) < TOLERANCE[dtype]
    assert backend.fallbacks == []
    assert describes(backend, "sdpa") and describes(backend, "sdpa_backward")
    # the forward and the backward are a region each: the linear layers' and the heads' views lower
    assert len(backend.regions) == 2 and describes(backend, "reshape")


def test_a_compiled_gpt_block_on_the_fusion_engine_is_one_region_a_graph():
    torch.manual_seed(0)
    model = GptBlock()
    wide = copy.deepcopy(model).double()
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend, options={"heur_mode": "a"})
    x = torch.randn(2, 8, 16)
    out = compiled(x)
    out.square().sum().backward()
    expected = wide(x.double())
    expected.square().sum().backward()
    assert relative_error(out, expected) < 1e-5
    for ours, theirs in zip(model.parameters(), wide.parameters(), strict=True):
        assert relative_error(ours.grad, theirs.grad) < 1e-4
    assert backend.fallbacks == [] and len(backend.regions) == 2
    assert {plan.engine for plan in backend.plans} == {"fused"}


def test_a_compiled_gpt_block_under_autocast_is_one_region_a_graph_as_close_to_float64_as_eager():
    """bfloat16 autocast on the CPU: its casts lower as the graph's conversions, so they split nothing."""
    torch.manual_seed(0)
    model = GptBlock(width=32)
    eager, wide = copy.deepcopy(model), copy.deepcopy(model).double()
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 8, 32)
    with torch.autocast("cpu", torch.bfloat16):
        ours, theirs = compiled(x), eager(x)
    ours.float().square().sum().backward()
    theirs.float().square().sum().backward()
    expected = wide(x.double())
    expected.square().sum().backward()
    assert ours.dtype == theirs.dtype == torch.float32
    assert relative_error(ours, expected) < 2 * relative_error(theirs, expected) + 1e-3
    for mine, eagers, exact in zip(model.parameters(), eager.parameters(), wide.parameters(), strict=True):
        assert relative_error(mine.grad, exact.grad) < 2 * relative_error(eagers.grad, exact.grad) + 1e-3
    assert backend.fallbacks == [] and len(backend.regions) == 2


def test_a_compiled_gpt_block_in_inference_lowers_its_attention_without_statistics():
    """Under no_grad nothing reads the CPU operator's logsumexp: the plan computes none."""
    torch.manual_seed(0)
    model = GptBlock().double().eval()
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    with torch.no_grad():
        assert relative_error(compiled(x), model(x)) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and describes(backend, "sdpa")


# ---- FX graphs of one attention operator, built by hand ---------------------------------------------


def one_call(target, args, kwargs, outputs):
    """(an FX graph of one call of ``target`` whose tensor arguments are placeholders, returning its
    results at ``outputs``, each node's meta["val"] from torch's meta kernels; the tensors it takes)."""
    graph, tensors = torch.fx.Graph(), []

    def placeholder(value):
        if not isinstance(value, torch.Tensor):
            return value
        node = graph.placeholder(f"input{len(tensors)}")
        node.meta["val"] = value.to("meta")
        tensors.append(value)
        return node

    def meta(value):
        return value.meta["val"] if isinstance(value, torch.fx.Node) else value

    node_args = [placeholder(a) for a in args]
    node_kwargs = {key: placeholder(value) for key, value in kwargs.items()}
    call = graph.call_function(target, tuple(node_args), node_kwargs)
    call.meta["val"] = target(*map(meta, node_args), **{key: meta(value) for key, value in node_kwargs.items()})
    items = []
    for index in outputs:
        items.append(graph.call_function(operator.getitem, (call, index)))
        items[-1].meta["val"] = call.meta["val"][index]
    graph.output(tuple(items))
    return torch.fx.GraphModule(torch.nn.Module(), graph), tensors


def lowered(target, args, kwargs, outputs):
    """The results at ``outputs`` of ``target`` on ``args`` run as an opendnn plan (compiled from
    ``one_call``'s graph, which fails on a CUDA operator left to torch), with torch's meta kernel's
    results, whose shapes, strides and dtypes they must have."""
    module, tensors = one_call(target, args, kwargs, outputs)
    metas = [node.meta["val"] for node in module.graph.nodes if node.target is operator.getitem]
    backend = OpendnnBackend()
    compiled = backend.compile_graph(module, tensors)
    for _ in range(2):  # built, then run again from the plan kept
        results = compiled(list(tensors))
    assert backend.fallbacks == [] and backend.plans_executed == 2
    for result, meta in zip(results, metas, strict=True):
        assert (result.shape, result.stride(), result.dtype) == (meta.shape, meta.stride(), meta.dtype)
    return results


def accepted(target, args, kwargs):
    module, _ = one_call(target, args, kwargs, [0])
    call = next(node for node in module.graph.nodes if node.op == "call_function")
    return Supported().is_node_supported({}, call)


def test_the_cpu_operators_logsumexp_is_torchs_values_layout_and_dtype_a_fully_masked_row_included():
    q, k, v = attention_inputs(torch.float64, queries=6, keys=7)
    mask = torch.randn(6, 7, dtype=torch.float64)
    mask[2] = -math.inf  # no key takes part in query 2: torch's logsumexp is 0 there, out 0
    options = {"attn_mask": mask, "scale": 0.4}
    out, logsumexp = lowered(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, k, v), options, [0, 1])
    torch_out, torch_logsumexp = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, **options)
    assert logsumexp.stride() == torch_logsumexp.stride() != logsumexp.contiguous().stride()
    assert torch.equal(logsumexp[:, :, 2], torch.zeros(2, 4, dtype=torch.float64))
    assert relative_error(logsumexp, torch_logsumexp) < 1e-14
    assert relative_error(out, torch_out) < 1e-14


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_our_logsumexp_feeds_torchs_backward_and_torchs_feeds_ours(dtype):
    q, k, v = attention_inputs(dtype, heads=4, kv_heads=2, queries=6, keys=7)
    mask = torch.randn(2, 1, 6, 7, dtype=dtype)
    mask[1, 0, 3] = -math.inf  # a row no key takes part in
    options = {"attn_mask": mask, "scale": 0.4}
    grad = torch.randn(2, 4, 6, 16, dtype=dtype)
    forward, backward = (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )
    wide = [t.double() for t in (grad, q, k, v)]
    wide_options = {"attn_mask": mask.double(), "scale": 0.4}
    expected = backward(*wide, *forward(*wide[1:], **wide_options), 0.0, False, **wide_options)

    ours = lowered(forward, (q, k, v), options, [0, 1])
    for gradient, theirs in zip(backward(grad, q, k, v, *ours, 0.0, False, **options), expected, strict=True):
        assert relative_error(gradient, theirs) < TOLERANCE[dtype]

    theirs = forward(q, k, v, **options)
    gradients = lowered(backward, (grad, q, k, v, *theirs, 0.0, False), options, [0, 1, 2])
    for gradient, wide_gradient in zip(gradients, expected, strict=True):
        assert not gradient.isnan().any() and relative_error(gradient, wide_gradient) < TOLERANCE[dtype]


def philox_state(forward):
    """Placeholders for the Philox seed and offset a CUDA forward saves (nothing reads them without
    dropout): FlashAttention's uint64 rng state and its unused offset, the others' int64 scalars."""
    if forward is aten._scaled_dot_product_flash_attention.default:
        return torch.zeros(2, dtype=torch.uint64), torch.zeros((), dtype=torch.uint64)
    return torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flash_attention_forward_and_backward_lower_with_torchs_logsumexp(kv_heads, is_causal):
    q, k, v = attention_inputs(torch.float32, kv_heads=kv_heads)
    forward = aten._scaled_dot_product_flash_attention.default
    out, logsumexp, seed, offset = lowered(forward, (q, k, v, 0.0, is_causal, False), {"scale": 0.3}, [0, 1, 6, 7])
    expected_out, expected_logsumexp = reference(q, k, v, is_causal=is_causal, scale=0.3)
    assert logsumexp.shape == (2, 4, 8) and logsumexp.dtype == torch.float32
    assert relative_error(out, expected_out) < 1e-5 and relative_error(logsumexp, expected_logsumexp) < 1e-6

    grad = torch.randn_like(out)
    arguments = (grad, q, k, v, expected_out.float(), expected_logsumexp.float(), None, None, 8, 8, 0.0, is_causal)
    backward = aten._scaled_dot_product_flash_attention_backward.default
    gradients = lowered(backward, (*arguments, *philox_state(forward)), {"scale": 0.3}, [0, 1, 2])
    expected = reference_gradients(grad, q, k, v, is_causal=is_causal, scale=0.3)
    for gradient, wide in zip(gradients, expected, strict=True):
        assert relative_error(gradient, wide) < 1e-5


def padded_bias(queries, keys):
    """A float bias as torch passes the memory-efficient kernel one: its rows padded to a multiple of
    16 elements, the keys a slice of them."""
    return torch.randn(2, 4, queries, -(-keys // 16) * 16)[..., :keys]


@pytest.mark.parametrize("is_causal", [False, True])
def test_memory_efficient_attention_with_a_bias_lowers_forward_and_backward_the_bias_gradient_included(is_causal):
    q, k, v = attention_inputs(torch.float32, queries=32, keys=20)
    bias = padded_bias(32, 20)
    forward = aten._scaled_dot_product_efficient_attention.default
    out, logsumexp, seed, offset = lowered(forward, (q, k, v, bias, True, 0.0, is_causal), {}, [0, 1, 2, 3])
    expected_out, expected_logsumexp = reference(q, k, v, bias, is_causal)
    assert logsumexp.shape == (2, 4, 32) and out.stride() == (32 * 4 * 16, 16, 4 * 16, 1)
    assert relative_error(out, expected_out) < 1e-5 and relative_error(logsumexp, expected_logsumexp) < 1e-6

    grad = torch.randn_like(out)
    arguments = (grad, q, k, v, bias, expected_out.float(), expected_logsumexp.float(), *philox_state(forward))
    backward = aten._scaled_dot_product_efficient_attention_backward.default
    gradients = lowered(backward, (*arguments, 0.0, [True] * 4, is_causal), {}, [0, 1, 2, 3])
    assert gradients[3].stride()[-2] == 32  # torch's rows of the bias's gradient, padded to 16 elements
    for gradient, wide in zip(gradients, reference_gradients(grad, q, k, v, bias, is_causal), strict=True):
        assert relative_error(gradient, wide) < 1e-5


def test_memory_efficient_attention_without_logsumexp_computes_none():
    q, k, v = attention_inputs(torch.float32, queries=8)
    forward = aten._scaled_dot_product_efficient_attention.default
    out, logsumexp = lowered(forward, (q, k, v, None, False, 0.0, True), {}, [0, 1])
    assert logsumexp.shape == (2, 4, 0)
    assert relative_error(out, reference(q, k, v, is_causal=True)[0]) < 1e-5


@pytest.mark.parametrize("is_causal", [False, True])
def test_cudnn_attention_forward_and_backward_lower_with_torchs_logsumexp(is_causal):
    q, k, v = attention_inputs(torch.float32, queries=6, keys=9)
    bias = torch.randn(1, 4, 6, 9).expand(2, 4, 6, 9)
    forward = aten._scaled_dot_product_cudnn_attention.default
    arguments = (q, k, v, bias, True, 0.0, is_causal, False)
    out, logsumexp, seed, offset = lowered(forward, arguments, {"scale": 0.3}, [0, 1, 6, 7])
    expected_out, expected_logsumexp = reference(q, k, v, bias, is_causal, 0.3)
    assert logsumexp.shape == (2, 4, 6, 1)
    assert relative_error(out, expected_out) < 1e-5
    assert relative_error(logsumexp, expected_logsumexp[..., None]) < 1e-6

    grad = torch.randn_like(out)
    saved = (expected_out.float(), expected_logsumexp[..., None].float(), *philox_state(forward), bias)
    backward = aten._scaled_dot_product_cudnn_attention_backward.default
    arguments = (grad, q, k, v, *saved, None, None, 6, 9, 0.0, is_causal)
    gradients = lowered(backward, arguments, {"scale": 0.3}, [0, 1, 2])
    expected = reference_gradients(grad, q, k, v, bias, is_causal, 0.3)[:3]
    for gradient, wide in zip(gradients, expected, strict=True):
        assert relative_error(gradient, wide) < 1e-5


def test_what_the_lowerings_cannot_reproduce_stays_on_torch():
    q, k, v = attention_inputs(torch.float32, queries=8, keys=12)
    square = attention_inputs(torch.float32, queries=8, keys=8)
    grad, lse = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 32)
    cases = {
        "dropout": (aten._scaled_dot_product_flash_attention_for_cpu.default, (*square, 0.1), {}),
        "flash, causal over fewer queries than keys (its mask aligned at the bottom right)": (
            aten._scaled_dot_product_flash_attention.default,
            (q, k, v, 0.0, True),
            {},
        ),
        "flash, debug mask": (aten._scaled_dot_product_flash_attention.default, (*square, 0.0, False, True), {}),
        "memory-efficient, logsumexp rows padded to 32": (
            aten._scaled_dot_product_efficient_attention.default,
            (*square, None, True),
            {},
        ),
        "memory-efficient backward, logsumexp rows padded to 32": (
            aten._scaled_dot_product_efficient_attention_backward.default,
            (grad, *square, None, grad, lse, *philox_state(None), 0.0, [True, True, True, False]),
            {},
        ),
    }
    for case, (target, args, kwargs) in cases.items():
        assert not accepted(target, args, kwargs), case
    assert accepted(aten._scaled_dot_product_flash_attention_for_cpu.default, square, {})
