"""The Pythonic attention broadcasts the batch dims of query, key and value as torch's SDPA does
(as matmul does): forward and gradients against torch's SDPA in float64 on the CPU, outputs and
gradients of the shapes torch gives, key and value read through stride-0 views (never copied), and
the forms torch refuses refused with the dims named."""

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

# (query, key, value shapes, keywords)
FORMS = [
    ((2, 3, 5, 8), (3, 7, 8), (3, 7, 8), {}),  # key and value without the batch dim
    ((3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {}),  # query without it
    ((2, 3, 5, 8), (1, 3, 7, 8), (1, 3, 7, 8), dict(is_causal=True)),
    ((2, 3, 5, 8), (2, 1, 7, 8), (2, 1, 7, 8), {}),  # one key/value head for every query head
    ((2, 3, 5, 8), (7, 8), (7, 8), {}),
    ((5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {}),
    ((2, 1, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), {}),  # one query head for every key head
    ((2, 3, 5, 8), (3, 7, 8), (2, 3, 7, 8), {}),  # key and value of different batch dims
    ((4, 1, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), dict(is_causal=True)),
    ((2, 4, 5, 8), (2, 7, 8), (2, 7, 8), dict(enable_gqa=True)),
]


@pytest.mark.parametrize("shapes", FORMS, ids=lambda form: str(form))
def test_broadcast_batch_dims_match_torch_in_float64(shapes):
    generator = torch.Generator().manual_seed(3)
    *dims, options = shapes
    q, k, v = (torch.randn(d, dtype=torch.float64, generator=generator) for d in dims)
    mask = torch.randn((5, 7), dtype=torch.float64, generator=generator) if not options else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask, **options)
    do = torch.randn(expected.shape, dtype=torch.float64, generator=generator)
    expected.backward(do)
    out, stats = F.scaled_dot_product_attention(q, k, v, mask, return_stats=True, **options)
    assert out.shape == expected.shape and stats.shape == expected.shape[:-1]
    assert relative_error(out, expected.detach()) < 1e-12
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, out, stats, mask, **options)
    for name, grad, leaf in zip(("query", "key", "value"), grads, leaves):
        assert grad.shape == leaf.shape, name
        assert relative_error(grad, leaf.grad) < 1e-12, name


def test_broadcast_key_and_value_reach_the_kernels_as_views(monkeypatch):
    """The bound key and value share the caller's memory (stride 0 along the broadcast batch dim)."""
    from opendnn.families.attention import functional

    seen = {}
    run = functional.checked_dispatch

    def recording(params, tensors, handle, names, **sizes):
        seen.update(k=tensors.k, v=tensors.v)
        return run(params, tensors, handle, names, **sizes)

    monkeypatch.setattr(functional, "checked_dispatch", recording)
    q, k, v = torch.randn(4, 3, 5, 8), torch.randn(3, 7, 8), torch.randn(3, 7, 8)
    F.scaled_dot_product_attention(q, k, v)
    for name, original in (("k", k), ("v", v)):
        bound = seen[name]
        assert bound.view.data_ptr() == original.data_ptr() and bound.desc.strides[0] == 0, name


@pytest.mark.parametrize(
    "dims, options, message",
    [
        (
            ((2, 3, 5, 8), (4, 3, 7, 8), (4, 3, 7, 8)),
            {},
            r"key.shape\[-4\]=4 must be 2 or 1 \(the batch dims of query.shape=\[2, 3, 5, 8\], "
            r"key.shape=\[4, 3, 7, 8\], value.shape=\[4, 3, 7, 8\] broadcast\)",
        ),
        (((2, 3, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)), {}, r"key.shape\[-3\]=2 must equal query.shape\[-3\]=3"),
        (
            ((2, 1, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)),
            dict(enable_gqa=True),
            r"query.shape\[-3\]=1 must be a multiple of key.shape\[-3\]=2",
        ),
    ],
)
def test_forms_torch_refuses_are_refused_naming_the_dims(dims, options, message):
    q, k, v = (torch.randn(d) for d in dims)
    with pytest.raises(RuntimeError):  # torch's own refusal of the form
        torch.nn.functional.scaled_dot_product_attention(q, k, v, **options)
    with pytest.raises(od.BadParam, match=message):
        F.scaled_dot_product_attention(q, k, v, **options)


def test_numpy_arrays_broadcast_as_torch_tensors_do():
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((3, 7, 8)), rng.standard_normal((1, 3, 7, 8))
    do = rng.standard_normal((2, 3, 5, 8))
    out, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True)
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, out, stats)
    leaves = [torch.tensor(array, requires_grad=True) for array in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*leaves)
    expected.backward(torch.tensor(do))
    assert isinstance(out, np.ndarray) and relative_error(out, expected.detach().numpy()) < 1e-12
    for grad, leaf in zip(grads, leaves):
        assert isinstance(grad, np.ndarray) and grad.shape == leaf.shape
        assert relative_error(grad, leaf.grad.numpy()) < 1e-12


def test_value_of_one_head_serves_the_keys_heads_under_enable_gqa():
    """torch repeats key and value to the query heads separately; one value head equals any number."""
    generator = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(d, dtype=torch.float64, generator=generator) for d in ((4, 4, 16), (2, 5, 16), (1, 5, 16)))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert relative_error(F.scaled_dot_product_attention(q, k, v, enable_gqa=True), expected) < 1e-12


def test_a_broadcast_4d_inputs_gradient_keeps_its_memory_order():
    """A (1, heads, keys, dim) view of BSHD memory, broadcast over the query's batch: its gradient is
    summed back and laid out as the key is, as every output of a 4-dim call follows its input."""
    generator = torch.Generator().manual_seed(4)
    q = torch.randn((2, 3, 5, 8), dtype=torch.float64, generator=generator)
    k, v = (torch.randn((1, 7, 3, 8), dtype=torch.float64, generator=generator).transpose(1, 2) for _ in range(2))
    out, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True)
    do = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    grads = F.scaled_dot_product_attention_backward(do, q, k, v, out, stats)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*leaves).backward(do)
    for grad, leaf in zip(grads[1:], leaves[1:]):
        assert grad.shape == (1, 3, 7, 8) and grad.transpose(1, 2).is_contiguous()
        assert relative_error(grad, leaf.grad) < 1e-12


def test_torch_operators_fake_kernels_lay_out_broadcast_outputs_as_the_real_ones():
    import opendnn.torch  # noqa: F401  (registers the operators)

    ops = torch.ops.opendnn
    generator = torch.Generator().manual_seed(6)
    q = torch.randn((2, 3, 5, 8), dtype=torch.float64, generator=generator)
    k, v = (torch.randn((1, 7, 3, 8), dtype=torch.float64, generator=generator).transpose(1, 2) for _ in range(2))
    options = (0.0, False, None, False, None, None, None, None, "top_left", None, 0)
    for query, key in ((q, k), (q[:1], torch.randn((2, 3, 7, 8), dtype=torch.float64, generator=generator))):
        torch.library.opcheck(ops.scaled_dot_product_attention.default, (query, key, v, None, *options))
        out, stats = ops.scaled_dot_product_attention(query, key, v, None, *options)
        assert out.shape == (2, 3, 5, 8) and stats.shape == (2, 3, 5)
        do = torch.randn(out.shape, dtype=torch.float64, generator=generator)
        backward = (do, query, key, v, out, stats, None, *options, False)
        torch.library.opcheck(ops.scaled_dot_product_attention_backward.default, backward)
