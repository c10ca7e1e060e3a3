"""The attention backward with dK, dV and dQ on the warp-specialized Gluon kernels (``gluon_backward``,
``gluon_backward_dq``) on an H200 (``pytest -m gpu``): dq, dk and dv against the float64 reference,
random inputs, outputs poisoned inside larger poisoned buffers; causal in both alignments, odd
lengths, GQA and MQA, BSHD and BHSD strides, bfloat16 and float16, head dims 64 and 128; and a ragged
backward, which stays on the tl kernels."""

import numpy as np
import pytest
import torch

import opendnn as od
from opendnn.families.attention import triton_backend
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.problem import AttentionDescriptor
from opendnn.families.attention.reference import ragged_reference, reference_backward

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


def pairs(*tensors):
    """(descriptor, tensor) of each tensor, flattened."""
    return [item for t in tensors for item in (od.TensorDescriptor(t.dtype, t.shape, t.stride()), t)]


@pytest.mark.parametrize("name", list(CASES))
def test_the_warp_specialized_dkdv_and_dq_match_the_float64_reference_on_gpu(name, monkeypatch):
    if torch.cuda.get_device_capability(0) != (9, 0):
        pytest.skip("the warp-specialized backward runs on sm_90 (Hopper) alone")
    chosen = []
    choose = triton_backend.choose
    monkeypatch.setattr(triton_backend, "choose", lambda *args: chosen.append(choose(*args)) or chosen[-1])
    dtype_name, (batch, heads_q, heads_kv, seq_q, seq_kv, dim), layout, fields = CASES[name]
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(DEVICE).manual_seed(len(name))
    q, do = (random_view(batch, heads_q, seq_q, dim, layout, dtype, generator) for _ in range(2))
    k, v = (random_view(batch, heads_kv, seq_kv, dim, layout, dtype, generator) for _ in range(2))
    o = torch.empty_like(q)
    stats = torch.empty(batch, heads_q, seq_q, device=DEVICE)
    params = AttentionDescriptor(**fields)
    handle = od.create(DEVICE)
    attention_forward(handle, params, *pairs(q, k, v, o), stats_desc=pairs(stats)[0], stats=stats)
    sides = ((heads_q, seq_q), (heads_kv, seq_kv), (heads_kv, seq_kv))
    gradients = [poisoned_view(batch, heads, seq, dim, dtype) for heads, seq in sides]
    dq, dk, dv = (view for view, _, _ in gradients)
    attention_backward(handle, params, *pairs(q, k, v, o, do, stats, dq, dk, dv))
    torch.cuda.synchronize()
    assert chosen[-1].strategy == "warp_specialized_backward", name  # dK/dV and dQ on the Gluon kernels
    expected = reference_backward(params, *(t.double().cpu().numpy() for t in (q, k, v, do)))
    for slot, (view, buffer, inside) in zip(("dq", "dk", "dv"), gradients):
        assert bool(buffer[~inside].isnan().all()) and bool(torch.isfinite(view).all()), (name, slot)
        reference = getattr(expected, slot)
        error = np.linalg.norm(view.double().cpu().numpy() - reference) / np.linalg.norm(reference)
        assert error < 1e-2, (name, slot, error)


def test_a_ragged_backward_behind_the_warp_specialized_forward_matches_the_float64_reference_on_gpu():
    """bf16 packed sequences, causal bottom-right, GQA: the forward runs warp-specialized, the
    backward on the tl kernels (the warp-specialized one does not read offsets); dq, dk and dv
    poisoned inside larger buffers, against the float64 reference of each sequence."""
    lens_q, lens_kv, heads_q, heads_kv, dim = [700, 1, 1537, 0, 300], [900, 64, 1500, 20, 300], 8, 2, 128
    cu_q, cu_kv = (np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32) for lengths in (lens_q, lens_kv))
    total_q, total_kv = int(cu_q[-1]), int(cu_kv[-1])
    generator = torch.Generator(DEVICE).manual_seed(11)
    q, do = (random_view(1, heads_q, total_q, dim, "bshd", torch.bfloat16, generator) for _ in range(2))
    k, v = (random_view(1, heads_kv, total_kv, dim, "bshd", torch.bfloat16, generator) for _ in range(2))
    o = torch.empty_like(q)
    stats = torch.empty(1, heads_q, total_q, device=DEVICE)
    params = AttentionDescriptor(**BOTTOM_RIGHT)
    layout = dict(max_seqlen_q=max(lens_q), max_seqlen_kv=max(lens_kv))
    for side, cu in (("q", cu_q), ("kv", cu_kv)):
        offsets = torch.tensor(cu, device=DEVICE)
        layout |= {f"ragged_offsets_{side}": offsets, f"ragged_offsets_{side}_desc": pairs(offsets)[0]}
    handle = od.create(DEVICE)
    attention_forward(handle, params, *pairs(q, k, v, o), stats_desc=pairs(stats)[0], stats=stats, **layout)
    sides = ((heads_q, total_q), (heads_kv, total_kv), (heads_kv, total_kv))
    gradients = [poisoned_view(1, heads, seq, dim, torch.bfloat16) for heads, seq in sides]
    attention_backward(handle, params, *pairs(q, k, v, o, do, stats, *(view for view, _, _ in gradients)), **layout)
    torch.cuda.synchronize()
    arrays = (t.double().cpu().numpy() for t in (q, k, v))
    expected = ragged_reference(params, *arrays, cu_q, cu_kv, max(lens_q), max(lens_kv), do.double().cpu().numpy())
    for slot, (view, buffer, inside), reference in zip(("dq", "dk", "dv"), gradients, expected[:3]):
        assert bool(buffer[~inside].isnan().all()) and bool(torch.isfinite(view).all()), slot
        error = np.linalg.norm(view.double().cpu().numpy() - reference) / np.linalg.norm(reference)
        assert error < 1e-2, (slot, error)
