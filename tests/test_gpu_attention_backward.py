"""The attention backward with dK, dV and dQ on the warp-specialized Gluon kernels (``gluon_backward``,
``gluon_backward_dq``) on an H200 (``pytest -m gpu``): dq, dk and dv against the float64 reference,
random inputs, outputs poisoned inside larger poisoned buffers; causal in both alignments, odd
lengths, GQA and MQA, BSHD and BHSD strides, bfloat16 and float16, head dims 64 and 128."""

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.families.attention import gluon_backward, gluon_backward_dq
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.problem import AttentionDescriptor
from opendnn.families.attention.reference import reference_backward

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
# name: (dtype, (B, Hq, Hkv, Sq, Skv, D), layout, descriptor fields)
BOTTOM_RIGHT = dict(causal=True, alignment="bottom_right")
CASES = {
    "gqa_causal_top_left_odd_lengths": ("bfloat16", (2, 8, 2, 1000, 1537, 128), "bshd", dict(causal=True)),
    "gqa_causal_bottom_right": ("bfloat16", (2, 8, 2, 1000, 1537, 128), "bhsd", BOTTOM_RIGHT),
    "more_queries_than_keys_bottom_right": ("float16", (1, 4, 4, 1537, 1000, 64), "bshd", BOTTOM_RIGHT),
    "float16_head_dim_64_gqa_full": ("float16", (2, 8, 2, 1000, 1537, 64), "bhsd", dict()),
    "mqa_full_scaled": ("bfloat16", (1, 4, 1, 1537, 1000, 128), "bshd", dict(scale=0.05)),
}


def random_view(batch, heads, seq, dim, layout, dtype, generator):
    """A random (B, H, S, D) tensor, a view of BSHD memory or BHSD memory."""
    if layout == "bshd":
        return torch.randn(batch, seq, heads, dim, device=DEVICE, dtype=dtype, generator=generator).transpose(1, 2)
    return torch.randn(batch, heads, seq, dim, device=DEVICE, dtype=dtype, generator=generator)


def poisoned_view(batch, heads, seq, dim, dtype):
    """(a (B, H, S, D) view of BSHD strides inside a larger buffer of NaN, the buffer, the view's mask)."""
    buffer = torch.full((batch, seq + 2, heads + 1, dim + 8), float("nan"), device=DEVICE, dtype=dtype)
    inside = torch.zeros(buffer.shape, dtype=torch.bool, device=DEVICE)
    inside[:, 1 : seq + 1, 1:, 8:] = True
    return buffer[:, 1 : seq + 1, 1:, 8:].transpose(1, 2), buffer, inside


@pytest.mark.parametrize("name", list(CASES))
def test_the_warp_specialized_dkdv_and_dq_match_the_float64_reference_on_gpu(name, monkeypatch):
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the warp-specialized backward runs on sm_90 (Hopper) alone")
    launched = []
    for module in (gluon_backward, gluon_backward_dq):

        def recorded(*args, module=module, launch=module.launch):
            launched.append(module.__name__)
            launch(*args)

        monkeypatch.setattr(module, "launch", recorded)
    dtype_name, (batch, heads_q, heads_kv, seq_q, seq_kv, dim), layout, fields = CASES[name]
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(DEVICE).manual_seed(len(name))
    q, do = (random_view(batch, heads_q, seq_q, dim, layout, dtype, generator) for _ in range(2))
    k, v = (random_view(batch, heads_kv, seq_kv, dim, layout, dtype, generator) for _ in range(2))
    o = torch.empty_like(q)
    stats = torch.empty(batch, heads_q, seq_q, device=DEVICE)
    params = AttentionDescriptor(**fields)
    handle = od.create(DEVICE)

    def pairs(*tensors):
        return [item for t in tensors for item in (od.TensorDescriptor(t.dtype, t.shape, t.stride()), t)]

    attention_forward(handle, params, *pairs(q, k, v, o), stats_desc=pairs(stats)[0], stats=stats)
    sides = ((heads_q, seq_q), (heads_kv, seq_kv), (heads_kv, seq_kv))
    gradients = [poisoned_view(batch, heads, seq, dim, dtype) for heads, seq in sides]
    dq, dk, dv = (view for view, _, _ in gradients)
    attention_backward(handle, params, *pairs(q, k, v, o, do, stats, dq, dk, dv))
    torch.cuda.synchronize()
    assert launched == [gluon_backward.__name__, gluon_backward_dq.__name__], name
    expected = reference_backward(params, *(t.double().cpu().numpy() for t in (q, k, v, do)))
    for slot, (view, buffer, inside) in zip(("dq", "dk", "dv"), gradients):
        assert bool(buffer[~inside].isnan().all()) and bool(torch.isfinite(view).all()), (name, slot)
        reference = getattr(expected, slot)
        error = np.linalg.norm(view.double().cpu().numpy() - reference) / np.linalg.norm(reference)
        assert error < 1e-2, (name, slot, error)
