"""Ragged (packed, cu_seqlens) and paged attention: the reference against each sequence computed
alone, the Triton kernels through the interpreter against the float64 reference (forward and
backward, GQA, causal bottom-right, windows, softcap, dropout, ALiBi, sinks) with outputs poisoned
with NaN inside larger buffers, the paged forward through a shuffled block table over a cache whose
unused rows are NaN, and the cuDNN-shaped calls' refusals of bad offsets and block tables (the
functional calls' refusals are the family's error samples)."""

import re

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.attention import problem as problem_module
from opendnn.families.attention import triton_backend
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.problem import (
    AttentionDescriptor,
    gathered,
    ragged_reference,
    reference_backward,
    reference_forward,
)

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2}
LENS_Q, LENS_KV = [5, 37, 1, 0, 20], [9, 30, 23, 4, 20]  # an empty query sequence and one of a single query


def offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def heads_first(packed):
    """(tokens, heads, D) as the (1, heads, tokens, D) view the problem takes."""
    return packed.transpose(0, 1)[None]


def poisoned(tokens, heads, dim, dtype):
    """A NaN (tokens, heads, dim) view inside a larger NaN buffer, and the buffer."""
    buffer = torch.full((tokens + 2, heads + 1, dim + 1), float("nan"), dtype=dtype)
    return buffer[1 : tokens + 1, 1:, 1:], buffer


def written_only_inside(view, buffer):
    inside = torch.zeros(buffer.shape, dtype=torch.bool)
    inside[1 : view.shape[0] + 1, 1:, 1:] = True
    return bool(buffer[~inside].isnan().all()) and bool(torch.isfinite(view).all())


def relative(actual, expected):
    expected = np.asarray(expected, np.float64)
    finite = np.isfinite(expected)
    assert np.array_equal(finite, torch.isfinite(actual).numpy())
    difference = actual.double().numpy()[finite] - expected[finite]
    return np.linalg.norm(difference) / max(np.linalg.norm(expected[finite]), 1.0)


CASES = {
    "gqa_causal_dropout": (dict(causal=True, alignment="bottom_right", dropout_p=0.2, seed=7, offset=5), False),
    "window_softcap_alibi_sinks": (dict(window=(6, 3), softcap=15.0, alignment="bottom_right"), True),
}


@pytest.fixture(params=["planned", "tiles_16"])
def tiles(request, monkeypatch):
    if request.param == "tiles_16":

        def small(problem, *where, choose=triton_backend.choose):
            plan = choose(problem, *where)
            return type(plan)(plan.strategy, 16, 16, plan.block_d, plan.block_dv, plan.num_warps, plan.num_stages)

        monkeypatch.setattr(triton_backend, "choose", small)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_ragged_kernels_match_the_float64_reference(name, dtype, tiles):
    fields, per_head = CASES[name]
    params = AttentionDescriptor(**fields)
    rng = np.random.default_rng(3)
    heads_q, heads_kv, dim, value_dim = 4, 2, 24, 16
    cu_q, cu_kv = offsets(LENS_Q), offsets(LENS_KV)
    total_q, total_kv, batch = int(cu_q[-1]), int(cu_kv[-1]), len(LENS_Q)
    q, do = (rng.standard_normal((total_q, heads_q, d)) for d in (dim, value_dim))
    k, v = (rng.standard_normal((total_kv, heads_kv, d)) for d in (dim, value_dim))
    # float32 slopes and sinks: the reference takes their rounded values
    slopes = rng.uniform(0.1, 0.5, (batch, heads_q)).astype(np.float32).astype(np.float64) if per_head else None
    sinks = rng.standard_normal(heads_q).astype(np.float32).astype(np.float64) if per_head else None
    inputs = {name: torch.tensor(x, dtype=dtype) for name, x in dict(q=q, k=k, v=v, do=do).items()}
    extra = {}
    for slot, values in (("alibi_slopes", slopes), ("sinks", sinks)):
        if values is not None:
            extra[slot] = torch.tensor(values, dtype=torch.float32)
            extra[f"{slot}_desc"] = descriptor(extra[slot])
    layout = {}
    for slot, values in (("ragged_offsets_q", cu_q), ("ragged_offsets_kv", cu_kv)):
        layout[slot] = torch.tensor(values)
        layout[f"{slot}_desc"] = descriptor(layout[slot])
    sizes = dict(max_seqlen_q=40, max_seqlen_kv=max(LENS_KV))
    views = {slot: heads_first(tensor) for slot, tensor in inputs.items()}
    o, o_buffer = poisoned(total_q, heads_q, value_dim, dtype)
    stats_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    stats = torch.full((1, heads_q, total_q), float("nan"), dtype=stats_dtype)
    handle = od.Handle(backend="triton")
    attention_forward(
        handle, params, *(item for slot in "qkv" for item in (descriptor(views[slot]), views[slot])),
        descriptor(heads_first(o)), heads_first(o), stats_desc=descriptor(stats), stats=stats,
        **extra, **layout, **sizes,
    )  # fmt: skip
    expected_o, expected_stats = ragged_reference(
        params, *(heads_first(torch.tensor(x)).numpy() for x in (q, k, v)), cu_q, cu_kv, 40, max(LENS_KV),
        alibi_slopes=slopes, sinks=sinks,
    )  # fmt: skip
    assert written_only_inside(o, o_buffer)
    assert relative(heads_first(o), expected_o) < TOLERANCE[dtype]
    assert relative(stats, expected_stats) < TOLERANCE[dtype]
    grads = [poisoned(*tensor.shape, dtype) for tensor in (inputs["q"], inputs["k"], inputs["v"])]
    extra_backward = dict(extra)
    if sinks is not None:
        dsinks = torch.full((heads_q,), float("nan"), dtype=torch.float32)
        extra_backward.update(dsinks=dsinks, dsinks_desc=descriptor(dsinks))
    attention_backward(
        handle, params, *(item for slot in "qkv" for item in (descriptor(views[slot]), views[slot])),
        descriptor(heads_first(o)), heads_first(o), descriptor(views["do"]), views["do"],
        descriptor(stats), stats,
        *(item for grad, _ in grads for item in (descriptor(heads_first(grad)), heads_first(grad))),
        **extra_backward, **layout, **sizes,
    )  # fmt: skip
    expected = ragged_reference(
        params, *(heads_first(torch.tensor(x)).numpy() for x in (q, k, v)), cu_q, cu_kv, 40, max(LENS_KV),
        heads_first(torch.tensor(do)).numpy(), alibi_slopes=slopes, sinks=sinks,
    )  # fmt: skip
    for (grad, buffer), reference in zip(grads, expected[:3]):
        assert written_only_inside(grad, buffer)
        assert relative(heads_first(grad), reference) < TOLERANCE[dtype]
    if sinks is not None:
        assert relative(extra_backward["dsinks"], expected.dsinks) < max(TOLERANCE[dtype], 1e-5)


def padded(packed, cu, length):
    """(tokens, heads, D) packed sequences as a (B, heads, length, D) batch, zeros past each one."""
    dense = packed.new_zeros(len(cu) - 1, packed.shape[1], length, packed.shape[2])
    for b in range(len(cu) - 1):
        dense[b, :, : cu[b + 1] - cu[b]] = packed[cu[b] : cu[b + 1]].transpose(0, 1)
    return dense


@pytest.mark.parametrize("extra", [{}, dict(window=(7, None), dropout_p=0.2, seed=5)], ids=["causal", "window_dropout"])
def test_ragged_calls_equal_the_dense_call_over_the_same_sequences_bitwise(extra, tiles):
    """The ragged grid computes each sequence's blocks as the dense grid computes batch b padded to
    the longest with per-batch lengths (causal bottom-right, float32): the same bits, forward and
    backward, in every row of every sequence."""
    rng = np.random.default_rng(8)
    cu_q, cu_kv = offsets(LENS_Q), offsets(LENS_KV)
    q, do = (torch.tensor(rng.standard_normal((int(cu_q[-1]), 4, 16)), dtype=torch.float32) for _ in range(2))
    k, v = (torch.tensor(rng.standard_normal((int(cu_kv[-1]), 2, 16)), dtype=torch.float32) for _ in range(2))
    common = dict(is_causal=True, handle=od.Handle(backend="triton"), **extra)
    ragged = (torch.tensor(cu_q), torch.tensor(cu_kv), max(LENS_Q), max(LENS_KV))
    out, stats = F.scaled_dot_product_attention_varlen(q, k, v, *ragged, return_stats=True, **common)
    grads = F.scaled_dot_product_attention_varlen_backward(do, q, k, v, out, stats, *ragged, **common)
    dense = [padded(x, cu, max(lens)) for x, cu, lens in ((q, cu_q, LENS_Q), (k, cu_kv, LENS_KV), (v, cu_kv, LENS_KV))]
    dense_do = padded(do, cu_q, max(LENS_Q))
    common |= dict(seq_lens_q=torch.tensor(LENS_Q), seq_lens_kv=torch.tensor(LENS_KV), alignment="bottom_right")
    dense_out, dense_stats = F.scaled_dot_product_attention(*dense, enable_gqa=True, return_stats=True, **common)
    dense_grads = F.scaled_dot_product_attention_backward(
        dense_do, *dense, dense_out, dense_stats, enable_gqa=True, **common
    )
    for b, (length_q, length_kv) in enumerate(zip(LENS_Q, LENS_KV)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        assert torch.equal(out[rows], dense_out[b, :, :length_q].transpose(0, 1))
        assert torch.equal(stats[:, rows], dense_stats[b, :, :length_q])
        for ours, theirs, part, length in zip(grads, dense_grads, (rows, keys, keys), (length_q, length_kv, length_kv)):
            assert torch.equal(ours[part], theirs[b, :, :length].transpose(0, 1))


def unchecked_ragged_call(monkeypatch, cu_q, cu_kv, max_seqlen):
    """Forward and backward of causal GQA attention (float32, interpreter) over 6 queries and 5 keys
    packed with offsets ``cu_q`` and ``cu_kv`` that the host does not check, as offsets on a device
    are not: o, the stats, dq, dk and dv, each NaN before the call inside a larger NaN buffer, and
    the buffers."""
    monkeypatch.setattr(problem_module, "_check_offsets", lambda *args: None)
    rng = np.random.default_rng(6)
    q, do = (torch.tensor(rng.standard_normal((6, 2, 16)), dtype=torch.float32) for _ in range(2))
    k, v = (torch.tensor(rng.standard_normal((5, 1, 16)), dtype=torch.float32) for _ in range(2))
    o, o_buffer = poisoned(6, 2, 16, torch.float32)
    stats_buffer = torch.full((2, 3, 8), float("nan"))
    stats = stats_buffer[:1, 1:, 1:7]
    grads = [poisoned(*tensor.shape, torch.float32) for tensor in (q, k, v)]
    layout = {}
    for slot, values in (("ragged_offsets_q", cu_q), ("ragged_offsets_kv", cu_kv)):
        layout[slot] = torch.tensor(values, dtype=torch.int32)
        layout[f"{slot}_desc"] = descriptor(layout[slot])
    sizes = dict(max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)
    handle, params = od.Handle(backend="triton"), AttentionDescriptor(causal=True, alignment="bottom_right")
    inputs = [item for x in (q, k, v) for item in (descriptor(heads_first(x)), heads_first(x))]
    output = (descriptor(heads_first(o)), heads_first(o))
    attention_forward(handle, params, *inputs, *output, stats_desc=descriptor(stats), stats=stats, **layout, **sizes)
    attention_backward(
        handle, params, *inputs, *output, descriptor(heads_first(do)), heads_first(do), descriptor(stats), stats,
        *(item for grad, _ in grads for item in (descriptor(heads_first(grad)), heads_first(grad))), **layout, **sizes,
    )  # fmt: skip
    return [o, stats, *(grad for grad, _ in grads)], [o_buffer, stats_buffer, *(buffer for _, buffer in grads)]


def outside_untouched(view, buffer):
    """Every element of the contiguous ``buffer`` outside ``view`` (a view of it) is still NaN."""
    marked = buffer.clone()
    marked.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(0.0)
    return int(marked.isnan().sum()) == buffer.numel() - view.numel()


def test_unchecked_offsets_past_the_packed_tokens_are_clamped_into_them(monkeypatch):
    """Offsets from a device reach the kernels unchecked: each sequence is clamped into the packed
    tokens, so (-3, 4, 99) over 6 queries and (-1, 2, 70) over 5 keys give the bits of (0, 4, 6) and
    (0, 2, 5), where every element is written, and nothing outside the tensors is written."""
    clamped, clamped_buffers = unchecked_ragged_call(monkeypatch, [-3, 4, 99], [-1, 2, 70], 4)
    valid, _ = unchecked_ragged_call(monkeypatch, [0, 4, 6], [0, 2, 5], 4)
    for ours, expected, buffer in zip(clamped, valid, clamped_buffers):
        assert outside_untouched(ours, buffer)
        assert not expected.isnan().any() and torch.equal(ours, expected)


def test_unchecked_offsets_that_decrease_or_outrun_max_seqlen_write_only_inside_the_tensors(monkeypatch):
    """Decreasing offsets and sequences longer than max_seqlen (3) give wrong rows, but every program
    reads and writes inside the tensors."""
    outputs, buffers = unchecked_ragged_call(monkeypatch, [0, 5, 2, 6], [0, 4, 1, 5], 3)
    assert all(outside_untouched(view, buffer) for view, buffer in zip(outputs, buffers))


def test_ragged_reference_is_each_sequence_computed_alone():
    """Packed sequences give what each sequence gives as a batch of one (bottom-right causal)."""
    rng = np.random.default_rng(4)
    params = AttentionDescriptor(causal=True, alignment="bottom_right", softcap=9.0)
    cu_q, cu_kv = offsets(LENS_Q), offsets(LENS_KV)
    q, do = (rng.standard_normal((1, 2, int(cu_q[-1]), 16)) for _ in range(2))
    k, v = (rng.standard_normal((1, 1, int(cu_kv[-1]), 16)) for _ in range(2))
    o, lse = ragged_reference(params, q, k, v, cu_q, cu_kv, 40, 40)
    grads = ragged_reference(params, q, k, v, cu_q, cu_kv, 40, 40, do)
    for b in range(len(LENS_Q)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        alone = (x[:, :, part] for x, part in ((q, rows), (k, keys), (v, keys)))
        expected_o, expected_lse = reference_forward(params, *alone)
        np.testing.assert_allclose(o[:, :, rows], expected_o, atol=1e-12)
        np.testing.assert_allclose(lse[:, :, rows], expected_lse, atol=1e-12)
        alone = (x[:, :, part] for x, part in ((q, rows), (k, keys), (v, keys), (do, rows)))
        expected = reference_backward(params, *alone)
        for ours, theirs, part in zip(grads[:3], expected[:3], (rows, keys, keys)):
            np.testing.assert_allclose(ours[:, :, part], theirs, atol=1e-12)


def test_varlen_functional_calls_return_packed_arrays_of_the_callers_kind():
    rng = np.random.default_rng(5)
    cu_q, cu_kv = offsets([3, 8]), offsets([8, 2])
    q = torch.tensor(rng.standard_normal((11, 4, 16)))
    k, v = (torch.tensor(rng.standard_normal((10, 2, 16))) for _ in range(2))
    out, stats = F.scaled_dot_product_attention_varlen(
        q, k, v, torch.tensor(cu_q), torch.tensor(cu_kv), 8, 8, is_causal=True, return_stats=True
    )
    assert isinstance(out, torch.Tensor) and out.shape == (11, 4, 16) and stats.shape == (4, 11)
    expected_o, expected_lse = ragged_reference(
        AttentionDescriptor(causal=True, alignment="bottom_right"), *(heads_first(x).numpy() for x in (q, k, v)),
        cu_q, cu_kv, 8, 8,
    )  # fmt: skip
    np.testing.assert_allclose(heads_first(out).numpy(), expected_o, atol=1e-12)
    np.testing.assert_allclose(stats.numpy(), expected_lse[0], atol=1e-12)
    do = torch.tensor(rng.standard_normal((11, 4, 16)))
    dq, dk, dv = F.scaled_dot_product_attention_varlen_backward(
        do, q, k, v, out, stats, torch.tensor(cu_q), torch.tensor(cu_kv), 8, 8, is_causal=True
    )
    expected = ragged_reference(
        AttentionDescriptor(causal=True, alignment="bottom_right"), *(heads_first(x).numpy() for x in (q, k, v)),
        cu_q, cu_kv, 8, 8, heads_first(do).numpy(),
    )  # fmt: skip
    for ours, theirs in zip((dq, dk, dv), expected[:3]):
        assert ours.shape == (theirs.shape[2], theirs.shape[1], theirs.shape[3])
        np.testing.assert_allclose(heads_first(ours).numpy(), theirs, atol=1e-12)


@pytest.mark.parametrize("backend", ["triton", "numpy"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_paged_forward_matches_the_gathered_reference(backend, dtype):
    """Blocks in shuffled order, unused cache rows NaN, table entries past a sequence -1 (unread)."""
    rng = np.random.default_rng(6)
    blocks, block_size, heads_q, heads_kv, dim = 9, 16, 4, 2, 16
    lens = np.array([40, 7, 33], np.int32)
    table = np.full((3, 3), -1, np.int32)
    order = rng.permutation(blocks)
    table[0, :3], table[1, :1], table[2, :3] = order[:3], order[3:4], order[4:7]
    k_cache, v_cache = (np.full((blocks, block_size, heads_kv, dim), np.nan) for _ in range(2))
    for b, length in enumerate(lens):
        for j in range(length):
            for cache in (k_cache, v_cache):
                cache[table[b, j // block_size], j % block_size] = rng.standard_normal((heads_kv, dim))
    q = rng.standard_normal((3, heads_q, 5, dim))
    handle = od.Handle(backend=backend)
    out, stats = F.scaled_dot_product_attention_paged(
        torch.tensor(q, dtype=dtype), torch.tensor(k_cache, dtype=dtype), torch.tensor(v_cache, dtype=dtype),
        torch.tensor(table), torch.tensor(lens), is_causal=True, return_stats=True, handle=handle,
    )  # fmt: skip
    keys, values = (gathered(np.swapaxes(cache, 1, 2), table, lens) for cache in (k_cache, v_cache))
    rounded = [torch.tensor(x, dtype=dtype).double().numpy() for x in (q, keys, values)]
    expected_o, expected_lse = reference_forward(
        AttentionDescriptor(causal=True, alignment="bottom_right"), *rounded, None, None, lens
    )
    assert relative(out, expected_o) < TOLERANCE[dtype]
    assert relative(stats, expected_lse) < TOLERANCE[dtype]


def test_paged_backward_is_refused():
    tensors = {
        "q": torch.ones(1, 2, 4, 16), "k": torch.ones(2, 2, 16, 16), "v": torch.ones(2, 2, 16, 16),
        "o": torch.ones(1, 2, 4, 16), "do": torch.ones(1, 2, 4, 16), "stats": torch.ones(1, 2, 4),
        "dq": torch.ones(1, 2, 4, 16), "dk": torch.ones(2, 2, 16, 16), "dv": torch.ones(2, 2, 16, 16),
    }  # fmt: skip
    table = torch.zeros(1, 2, dtype=torch.int32)
    pairs = [
        item
        for slot in ("q", "k", "v", "o", "do", "stats", "dq", "dk", "dv")
        for item in (descriptor(tensors[slot]), tensors[slot])
    ]
    with pytest.raises(
        NotSupported, match=r"block_table_desc is given: the backward through paged K/V is not supported"
    ):
        attention_backward(
            od.Handle(backend="numpy"),
            AttentionDescriptor(),
            *pairs,
            block_table_desc=descriptor(table),
            block_table=table,
        )


def test_a_block_table_entry_past_the_sequence_is_never_read():
    """The refusals of bad packed and paged calls are the family's error samples; an entry outside
    the cache past a sequence's keys is not one."""
    q, cache = np.ones((2, 2, 3, 16)), np.ones((4, 8, 2, 16))
    table = np.array([[0, 1], [3, 4]], np.int32)
    with pytest.raises(BadParam, match=r"block_table\[1, 1\]=4 must be a block of k_cache"):
        F.scaled_dot_product_attention_paged(q, cache, cache, table, np.array([16, 9], np.int32))
    out = F.scaled_dot_product_attention_paged(q, cache, cache, table, np.array([16, 8], np.int32))
    assert np.isfinite(out).all()


def int32(*values):
    return torch.tensor(values, dtype=torch.int32)


def cudnn_call(layout, **changes):
    """attention_forward, ``layout`` "ragged" (packed q (1, 2, 6, 16), k and v (1, 2, 5, 16) with
    offsets) or "paged" (q (2, 2, 3, 16), caches of 4 blocks of 8 rows with a block table), with
    ``changes`` to the tensors (q, k, v) or the keywords (arrays, given with their descriptors, and
    max_seqlen_q / max_seqlen_kv)."""
    if layout == "ragged":
        tensors = dict(q=(1, 2, 6, 16), k=(1, 2, 5, 16), v=(1, 2, 5, 16))
        keywords = dict(ragged_offsets_q=int32(0, 4, 6), ragged_offsets_kv=int32(0, 2, 5))
        keywords |= dict(max_seqlen_q=4, max_seqlen_kv=3)
    else:
        tensors = dict(q=(2, 2, 3, 16), k=(4, 2, 8, 16), v=(4, 2, 8, 16))
        keywords = dict(block_table=int32([0, 1], [2, 3]), seq_lens_kv=int32(16, 9))
    tensors = {slot: torch.rand(*changes.pop(slot, shape)) + 0.5 for slot, shape in tensors.items()}
    keywords |= changes
    tensors["o"] = torch.full((*tensors["q"].shape[:3], tensors["v"].shape[3]), float("nan"))
    descs = {f"{slot}_desc": descriptor(value) for slot, value in keywords.items() if isinstance(value, torch.Tensor)}
    pairs = [item for slot in "qkvo" for item in (descriptor(tensors[slot]), tensors[slot])]
    attention_forward(od.Handle(backend="numpy"), AttentionDescriptor(), *pairs, **keywords, **descs)


@pytest.mark.parametrize(
    "layout, changes, error, message",
    [
        ("ragged", dict(q=(2, 2, 3, 16)), BadParam,
         "q_desc.dims[0]=2 must be 1 with ragged offsets (the packed tokens of every sequence along q_desc.dims[2])"),
        ("ragged", dict(q=(1, 3, 6, 16)), BadParam, "q_desc.dims[1]=3 must be a multiple of k_desc.dims[1]=2"),
        ("ragged", dict(k=(1, 2, 5, 8)), BadParam, "k_desc.dims[3]=8 must equal q_desc.dims[3]=16"),
        ("ragged", dict(ragged_offsets_q=int32(0, 4, 7)), BadParam,
         "ragged_offsets_q[2]=7 must equal the packed tokens, q_desc.dims[2]=6"),
        ("ragged", dict(ragged_offsets_q=int32(0, 4, 3, 6), ragged_offsets_kv=int32(0, 2, 4, 5)), BadParam,
         "ragged_offsets_q[2]=3 must be at least ragged_offsets_q[1]=4 (offsets never decrease)"),
        ("ragged", dict(ragged_offsets_kv=int32(0, 5)), BadParam,
         "ragged_offsets_kv_desc.dims=[2] must equal ragged_offsets_q_desc.dims=[3]"),
        ("ragged", dict(ragged_offsets_q=torch.tensor([0, 4, 6], dtype=torch.int8)), NotSupported,
         "ragged_offsets_q_desc.dtype=INT8 must be INT32 or INT64"),
        ("ragged", dict(max_seqlen_kv=2), BadParam,
         "max_seqlen_kv=2 must be at least 3, the length of sequence 1 in ragged_offsets_kv"),
        ("paged", dict(block_table=int32([0, 1], [2, 5])), BadParam,
         "block_table[1, 1]=5 must be a block of k_desc, from 0 to k_desc.dims[0] - 1 = 3 (sequence 1 needs 2 blocks)"),
        ("paged", dict(block_table=int32([0, 1])), BadParam,
         "block_table_desc.dims=[1, 2] must be [2, blocks per sequence] (one row per batch, q_desc.dims[0]=2)"),
        ("paged", dict(q=(2, 3, 3, 16)), BadParam, "q_desc.dims[1]=3 must be a multiple of k_desc.dims[1]=2"),
    ],
)  # fmt: skip
def test_cudnn_shaped_ragged_and_paged_refusals_name_the_descriptor_or_the_array(layout, changes, error, message):
    """Sizes are named by the descriptor (q_desc.dims[2]), values by the array (ragged_offsets_q[2])."""
    with pytest.raises(error, match=re.escape(message)):
        cudnn_call(layout, **changes)


@pytest.mark.parametrize("layout", ["ragged", "paged"])
def test_the_cudnn_shaped_call_of_the_refusals_succeeds_unchanged(layout):
    cudnn_call(layout)


def test_ragged_offsets_with_a_bias_are_not_supported():
    q = torch.ones(1, 2, 6, 16)
    bias = torch.ones(1, 2, 6, 6)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(NotSupported, match=r"bias_desc with ragged offsets is not supported"):
        attention_forward(
            od.Handle(backend="numpy"), AttentionDescriptor(), descriptor(q), q, descriptor(q), q, descriptor(q), q,
            descriptor(q), torch.empty_like(q), bias_desc=descriptor(bias), bias=bias,
            ragged_offsets_q_desc=descriptor(cu), ragged_offsets_q=cu, ragged_offsets_kv_desc=descriptor(cu),
            ragged_offsets_kv=cu,
        )  # fmt: skip
