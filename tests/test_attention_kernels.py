"""Attention's Triton kernels through the interpreter, on tiny shapes, against the float64 reference:
float64, float32 and float16 with every mask, the bias and its gradient, softcap, ALiBi, sinks and
their gradient,
dropout (its mask regenerated in the backward), GQA, padded head dims and any strides, with outputs
poisoned with NaN inside larger buffers that must stay untouched; tiles of the planner and tiles
of 16 x 16 (many blocks per row); a bitwise repeatable backward; the heaviest-block-first order bitwise equal
to the ranks' own; and every kernel compiled for the H200 (sm_90) under the launcher's own
arguments."""

import os
import subprocess
import sys

import numpy as np
import pytest
import sm90
import torch
import triton
import triton.language as tl  # noqa: F401 (a jit function's module must hold it)

import opendnn as od
from opendnn.families.attention import triton_backend, triton_backward, triton_forward
from opendnn.families.attention.api import attention_backward, attention_forward
from opendnn.families.attention.problem import (
    AttentionDescriptor,
    DiagonalAlignment,
    attention_problem,
    reference_backward,
    reference_forward,
)
from opendnn.families.attention.triton_tiles import scheduled_block
from opendnn.kernels.launch import Slot

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def poisoned_view(shape, dtype):
    """A NaN view of ``shape`` inside a larger NaN buffer, in BSHD memory order, and its buffer."""
    batch, heads, seq, dim = shape
    buffer = torch.full((batch, seq + 2, heads + 1, dim + 3), float("nan"), dtype=dtype)
    return buffer[:, 1 : seq + 1, 1:, 2 : dim + 2].transpose(1, 2), buffer


def written_only_inside(view, buffer):
    inside = torch.zeros(buffer.shape, dtype=torch.bool)
    inside[:, 1 : view.shape[2] + 1, 1:, 2 : view.shape[3] + 2] = True
    return bool(buffer[~inside].isnan().all()) and bool(torch.isfinite(view).all())


def error(actual, expected):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    return ((actual.double() - expected).norm() / expected.norm()).item()


CASES = {
    "gqa_bottom_right_bias_dropout_lengths": dict(
        shapes=(2, 4, 2, 37, 45, 24, 16),
        bias=(2, 1, 37, 45),
        lengths=([37, 29], [40, 45]),
        params=AttentionDescriptor(
            causal=True, alignment=DiagonalAlignment.BOTTOM_RIGHT, dropout_p=0.15, seed=11, offset=3
        ),
    ),
    "window_softcap_boolean_mask": dict(
        shapes=(1, 2, 2, 33, 28, 16, 16),
        bias=(1, 2, 33, 28),
        boolean=True,
        params=AttentionDescriptor(window=(6, 2), softcap=1.5),
    ),
    "mqa_odd_dims_key_bias_alibi": dict(
        shapes=(2, 3, 1, 20, 17, 8, 40), bias=(1, 3, 1, 17), alibi=(3,), params=AttentionDescriptor(scale=0.3)
    ),
    "gqa_causal_alibi_per_batch_sinks_lengths": dict(
        shapes=(2, 4, 2, 23, 30, 16, 16),
        bias=(1, 4, 23, 30),
        alibi=(2, 4),
        sinks=True,
        lengths=([23, 11], [30, 20]),
        params=AttentionDescriptor(causal=True, alignment=DiagonalAlignment.BOTTOM_RIGHT),
    ),
    # block edges on both sides of the band and of the sequences' ends, around blocks inside every mask
    "causal_top_left_more_queries_than_keys": dict(
        shapes=(1, 2, 2, 50, 35, 16, 16), params=AttentionDescriptor(causal=True)
    ),
    "causal_bottom_right_window_more_queries_lengths": dict(
        shapes=(2, 4, 2, 45, 30, 16, 8),
        lengths=([45, 38], [30, 26]),
        params=AttentionDescriptor(causal=True, alignment=DiagonalAlignment.BOTTOM_RIGHT, window=(20, None)),
    ),
    "window_wider_than_a_block_more_keys": dict(
        shapes=(1, 2, 1, 70, 77, 32, 32), params=AttentionDescriptor(window=(40, 5), scale=0.2)
    ),
    "left_window_only_bottom_right_keys_no_query_sees": dict(
        shapes=(1, 2, 1, 21, 70, 16, 16),
        params=AttentionDescriptor(window=(12, None), alignment=DiagonalAlignment.BOTTOM_RIGHT),
    ),
}


def run_case(name, dtype, backend="triton"):
    """(outputs of the backend, the float64 reference), forward and backward, over strided inputs."""
    case = CASES[name]
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = case["shapes"]
    generator = torch.Generator().manual_seed(len(name))
    q = torch.randn(batch, seq_q, heads_q, dim, generator=generator).to(dtype).transpose(1, 2)  # BSHD
    kv = torch.randn(batch, seq_kv, 2, heads_kv, max(dim, value_dim), generator=generator).to(dtype)  # packed K, V
    k, v = kv[:, :, 0, :, :dim].transpose(1, 2), kv[:, :, 1, :, :value_dim].transpose(1, 2)
    bias = torch.randn(case["bias"], generator=generator).to(dtype) if "bias" in case else None
    if case.get("boolean"):
        bias = bias > -0.8
    lengths = [None if lens is None else torch.tensor(lens) for lens in case.get("lengths", (None, None))]
    slopes = torch.rand(case["alibi"], generator=generator).to(dtype) if "alibi" in case else None
    sinks = torch.randn(heads_q, generator=generator).to(dtype) if case.get("sinks") else None
    params = case["params"]
    o, o_buffer = poisoned_view((batch, heads_q, seq_q, value_dim), dtype)
    stats = torch.full(
        (batch, heads_q, seq_q), float("nan"), dtype=torch.float64 if dtype == torch.float64 else torch.float32
    )
    handle = od.create("cpu", backend=backend)
    optional = {} if bias is None else dict(bias_desc=descriptor(bias), bias=bias)
    for side, lens in zip(("q", "kv"), lengths):
        if lens is not None:
            optional.update({f"seq_lens_{side}_desc": descriptor(lens), f"seq_lens_{side}": lens})
    for slot, tensor in (("alibi_slopes", slopes), ("sinks", sinks)):
        if tensor is not None:
            optional.update({f"{slot}_desc": descriptor(tensor), slot: tensor})
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
        **optional,
    )
    do = torch.randn(o.shape, generator=generator).to(dtype)
    grads = [poisoned_view(t.shape, dtype) for t in (q, k, v)]
    dbias = None if bias is None or bias.dtype == torch.bool else torch.full_like(bias, float("nan"))
    if dbias is not None:
        optional.update(dbias_desc=descriptor(dbias), dbias=dbias)
    dsinks = None if sinks is None else torch.full_like(sinks, float("nan"))
    if dsinks is not None:
        optional.update(dsinks_desc=descriptor(dsinks), dsinks=dsinks)
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
        *(item for view, _ in grads for item in (descriptor(view), view)),
        **optional,
    )
    arrays = [t.double().numpy() for t in (q, k, v)]
    bias_array = None if bias is None else bias.numpy() if bias.dtype == torch.bool else bias.double().numpy()
    lens_arrays = [None if lens is None else lens.numpy() for lens in lengths]
    per_head = [None if t is None else t.double().numpy() for t in (slopes, sinks)]
    expected_o, expected_stats = reference_forward(params, *arrays, bias_array, *lens_arrays, *per_head)
    expected_grads = reference_backward(params, *arrays, do.double().numpy(), bias_array, *lens_arrays, *per_head)
    assert written_only_inside(o, o_buffer) and all(written_only_inside(*g) for g in grads)
    actual = [o, stats, *(view for view, _ in grads), dbias, dsinks]
    return actual, [expected_o, expected_stats, *expected_grads]


def check(actual, expected, tolerance):
    for index, (ours, theirs) in enumerate(zip(actual, expected)):
        if theirs is None:
            continue
        finite = np.isfinite(theirs)
        assert np.array_equal(finite, torch.isfinite(ours).numpy()), index  # -inf stats of empty rows
        scale = max(np.linalg.norm(theirs[finite]), 1.0)  # dbias along keys sums to 0: an absolute error
        difference = (ours.double().numpy() - theirs)[finite]
        assert np.linalg.norm(difference) / scale < tolerance, (index, np.linalg.norm(difference) / scale)


@pytest.fixture(params=["planned", "tiles_16"])
def tiles(request, monkeypatch):
    """The planner's tiles, or 16 x 16 tiles: several blocks along every sequence."""
    if request.param == "tiles_16":

        def small(problem, *where, choose=triton_backend.choose):
            plan = choose(problem, *where)
            return type(plan)(plan.strategy, 16, 16, plan.block_d, plan.block_dv, plan.num_warps, plan.num_stages)

        monkeypatch.setattr(triton_backend, "choose", small)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_the_float64_reference(name, dtype, tiles):
    actual, expected = run_case(name, dtype)
    check(actual, expected, TOLERANCE[dtype])


def test_float16_kernels_match_the_float64_reference():
    """(bfloat16 runs on the GPU only: Triton 3.6's interpreter multiplies bfloat16 tl.dot operands as
    their uint16 bit patterns.)"""
    actual, expected = run_case("gqa_bottom_right_bias_dropout_lengths", torch.float16)
    check(actual, expected, TOLERANCE[torch.float16])


def test_a_problem_plans_its_launches_once_with_a_slot_for_each_tensor_it_has():
    q = od.TensorDescriptor("bfloat16", (2, 4, 40, 64))
    k = od.TensorDescriptor("bfloat16", (2, 2, 50, 64))
    stats = od.TensorDescriptor("float32", (2, 4, 40))
    forward = attention_problem(AttentionDescriptor(causal=True), q, k, k, q, stats=stats)
    backward = attention_problem(AttentionDescriptor(causal=True), q, k, k, q, stats=stats, do=q, dq=q, dk=k, dv=k)
    plans = [(problem, triton_backend.choose(problem)) for problem in (forward, backward)]
    launches = [triton_backend.planned_launches(*pair) for pair in plans]
    assert all(triton_backend.planned_launches(*pair) is first for pair, first in zip(plans, launches))  # cached
    (forward_launch,) = launches[0].launches
    args = dict(zip(forward_launch.kernel.arg_names, forward_launch.args))
    assert (args["q_ptr"], args["stats_ptr"]) == (Slot("q"), Slot("stats"))
    assert args["bias_ptr"] is None and args["sinks_ptr"] is None  # absent: a constant, as the kernel specializes it
    assert not launches[0].scratch
    kernels = [launch.kernel for launch in launches[1].launches]
    assert kernels == [
        triton_backend.attention_delta_kernel,
        triton_backend.attention_dkdv_kernel,
        triton_backend.attention_dq_kernel,
    ]
    (delta,) = launches[1].scratch
    assert (delta.name, delta.numel, delta.dtype) == ("delta", 2 * 4 * 40, torch.float32)
    assert triton_backend.workspace_size(backward) == 2 * 4 * 40 * 4


def test_backward_is_bitwise_repeatable():
    first, _ = run_case("window_softcap_boolean_mask", torch.float32)
    second, _ = run_case("window_softcap_boolean_mask", torch.float32)
    for a, b in zip(first[2:5], second[2:5]):
        assert torch.equal(a, b)


@triton.jit
def launch_order_block(rank, b, offsets_ptr, offsets_stride, batch, rows, seq_len, REVERSED, RAGGED, BLOCK, BLOCK_B):
    """scheduled_block with the blocks in the order of the ranks, never reversed (the constexprs pass through)."""
    return scheduled_block(rank, b, offsets_ptr, offsets_stride, batch, rows, seq_len, False, RAGGED, BLOCK, BLOCK_B)


@pytest.mark.parametrize("tiles", ["tiles_16"], indirect=True)
@pytest.mark.parametrize(
    "name",
    [
        "causal_top_left_more_queries_than_keys",
        "causal_bottom_right_window_more_queries_lengths",
        "left_window_only_bottom_right_keys_no_query_sees",
        "gqa_bottom_right_bias_dropout_lengths",
    ],
)
def test_heaviest_block_first_changes_no_bit(name, tiles, monkeypatch):
    """Every program computes its block as in the ranks' own order: the outputs and gradients equal
    bitwise those of the kernels with scheduled_block's reversal off."""
    heaviest_first, _ = run_case(name, torch.float32)
    for module in (triton_forward, triton_backward):
        monkeypatch.setattr(module, "scheduled_block", launch_order_block)
    in_rank_order, _ = run_case(name, torch.float32)
    for ours, theirs in zip(heaviest_first, in_rank_order):
        assert (ours is None and theirs is None) or torch.equal(ours, theirs)


def test_lengths_outside_the_sequence_are_clamped():
    q, k, v = (torch.randn(2, 2, 12, 16, dtype=torch.float64) for _ in range(3))
    lens_q, lens_kv = torch.tensor([-3, 100]), torch.tensor([100, 5])
    o = torch.full_like(q, float("nan"))
    attention_forward(
        od.create("cpu", backend="triton"),
        AttentionDescriptor(),
        descriptor(q),
        q,
        descriptor(k),
        k,
        descriptor(v),
        v,
        descriptor(o),
        o,
        seq_lens_q_desc=descriptor(lens_q),
        seq_lens_q=lens_q,
        seq_lens_kv_desc=descriptor(lens_kv),
        seq_lens_kv=lens_kv,
    )
    expected, _ = reference_forward(
        AttentionDescriptor(),
        q.numpy(),
        k.numpy(),
        v.numpy(),
        seq_lens_q=np.array([0, 12]),
        seq_lens_kv=np.array([12, 5]),
    )
    assert (o[0] == 0).all() and error(o, expected) < 1e-12


def plan_of(dims_q, dims_k, dims_v, dtype, backward=False):
    descs = [od.TensorDescriptor(dtype, dims) for dims in (dims_q, dims_k, dims_v)]
    out = od.TensorDescriptor(dtype, (*dims_q[:3], dims_v[3]))
    extra = {}
    if backward:
        extra = dict(stats=od.TensorDescriptor("float32", dims_q[:3]), do=out, dq=descs[0], dk=descs[1], dv=descs[2])
    return triton_backend.choose(attention_problem(AttentionDescriptor(), *descs, out, **extra))


def test_planner_picks_tiles_by_head_dim_and_dtype_within_the_sequence():
    big = plan_of((4, 16, 4096, 128), (4, 16, 4096, 128), (4, 16, 4096, 128), "bfloat16")
    assert (big.strategy, big.block_m, big.block_n, big.block_d, big.num_warps) == ("flash2_forward", 128, 64, 128, 4)
    padded = plan_of((1, 2, 4096, 80), (1, 2, 4096, 80), (1, 2, 4096, 8), "float16", backward=True)
    assert (padded.strategy, padded.block_m, padded.block_n, padded.block_d, padded.block_dv) == (
        "flash2_deterministic_backward",
        64,
        64,
        128,
        16,
    )
    short = plan_of((1, 1, 5, 256), (1, 1, 40, 256), (1, 1, 40, 256), "float32")
    assert (short.block_m, short.block_n, short.block_d) == (16, 16, 256)


# compiled for the H200 (sm_90): Triton's CUDA compiler runs without a GPU --------------------------------------

# (dtype, (B, Hq, Hkv, Sq, Skv, D, Dv), bias dims and dtype or None, descriptor fields, lengths,
# (ALiBi slopes' dims or None, sinks))
SM90_PROBLEMS = [
    ("bfloat16", (2, 8, 2, 1024, 1024, 128, 128), None, dict(causal=True), False, ((8,), True)),
    (
        "float16",
        (2, 4, 4, 512, 700, 64, 64),
        ((1, 4, 512, 700), "float16"),
        dict(causal=True, alignment="bottom_right", window=(128, None), softcap=30.0, dropout_p=0.1, seed=3),
        True,
        ((2, 4), False),
    ),
    ("float32", (1, 2, 2, 300, 300, 80, 80), ((1, 1, 300, 300), "bool"), {}, False, (None, False)),
    ("float64", (1, 2, 1, 64, 64, 32, 16), ((1, 2, 1, 64), "float64"), {}, False, ((2,), True)),
    ("bfloat16", (2, 2, 2, 256, 256, 256, 256), ((2, 1, 1, 1), "bfloat16"), {}, False, (None, False)),
]
# packed (ragged) sequences forward and backward, and paged K/V forward: (dtype, (B, Hq, Hkv, D), fields, kind)
SM90_LAYOUTS = [
    ("bfloat16", (3, 8, 2, 128), dict(causal=True, alignment="bottom_right"), "ragged"),
    ("float16", (3, 4, 4, 64), dict(causal=True, alignment="bottom_right"), "paged"),
]
SM90_LAUNCHES = 5 * 4 + 3 + 2 + 4 + 1  # forward, delta, dK/dV, dQ each; dbias per float bias; dsinks per sinks; layouts


def test_kernels_compile_for_sm90_with_any_int_divisibility():
    """Each launch of SM90_PROBLEMS with the divisibility attrs the launcher gives its int args, and
    with none. In a subprocess: triton must load without its interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode == sm90.SKIP_STATUS:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stdout.splitlines()[-1:] + [result.stderr[-3000:]]
    assert result.stdout.splitlines()[-1] == f"compiled {2 * SM90_LAUNCHES}"


class LaunchRecorder:
    """Stands in for a kernel: ``kernel[grid](**kwargs)`` records the launch instead of running it."""

    def __init__(self, kernel, launches):
        self.kernel, self.launches, self.arg_names = kernel, launches, kernel.arg_names
        self.fn = kernel.fn  # Launch reads its parameters' annotations

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def sm90_problem_tensors(dtype, shapes, bias, fields, lengths, per_head):
    """The problem's forward and backward descriptors and (empty) CPU tensors."""
    batch, heads_q, heads_kv, seq_q, seq_kv, dim, value_dim = shapes
    dims = dict(
        q=(batch, heads_q, seq_q, dim),
        k=(batch, heads_kv, seq_kv, dim),
        v=(batch, heads_kv, seq_kv, value_dim),
        o=(batch, heads_q, seq_q, value_dim),
    )
    dims.update(do=dims["o"], dq=dims["q"], dk=dims["k"], dv=dims["v"])
    types = {slot: dtype for slot in dims}
    dims["stats"], types["stats"] = (batch, heads_q, seq_q), "float64" if dtype == "float64" else "float32"
    if bias is not None:
        dims["bias"], types["bias"] = bias
        if bias[1] != "bool":
            dims["dbias"], types["dbias"] = bias
    if lengths:
        dims["seq_lens_q"] = dims["seq_lens_kv"] = (batch,)
        types["seq_lens_q"] = types["seq_lens_kv"] = "int32"
    alibi, sinks = per_head
    if alibi is not None:
        dims["alibi_slopes"], types["alibi_slopes"] = alibi, "float32"
    if sinks:
        dims["sinks"] = dims["dsinks"] = (heads_q,)
        types["sinks"] = types["dsinks"] = dtype
    descs = {slot: od.TensorDescriptor(types[slot], size) for slot, size in dims.items()}
    tensors = {slot: torch.empty(size, dtype=getattr(torch, types[slot])) for slot, size in dims.items()}
    return AttentionDescriptor(**fields), descs, tensors


def sm90_layout_problem(dtype, shapes, fields, kind, backward):
    """A ragged (packed tokens, offsets of sequences of 300, 17 and 700 tokens) or paged (blocks of 16
    rows, 40 blocks, 3 queries a sequence) problem of SM90_LAYOUTS and its CPU tensors, offsets and
    block table filled with valid values (the kernels' recorded launches never read the others)."""
    batch, heads_q, heads_kv, dim = shapes
    stats_dtype = "float32"
    if kind == "ragged":
        offsets = torch.tensor([0, 300, 317, 1017], dtype=torch.int32)
        dims = dict(q=(1, heads_q, 1017, dim), k=(1, heads_kv, 1017, dim), o=(1, heads_q, 1017, dim))
        dims.update(v=dims["k"], stats=(1, heads_q, 1017))
        if backward:
            dims.update(do=dims["o"], dq=dims["q"], dk=dims["k"], dv=dims["k"])
        layout = dict(ragged_offsets_q=offsets, ragged_offsets_kv=offsets.clone())
        sizes = dict(max_seqlen_q=700, max_seqlen_kv=700)
    else:
        dims = dict(q=(batch, heads_q, 3, dim), k=(40, heads_kv, 16, dim), o=(batch, heads_q, 3, dim))
        dims.update(v=dims["k"], stats=(batch, heads_q, 3))
        table = torch.arange(batch * 10, dtype=torch.int32).reshape(batch, 10)
        layout = dict(block_table=table, seq_lens_kv=torch.tensor([160, 7, 100], dtype=torch.int32))
        sizes = {}
    tensors = {
        slot: torch.empty(size, dtype=getattr(torch, stats_dtype if slot == "stats" else dtype))
        for slot, size in dims.items()
    }
    tensors.update(layout)
    descs = {
        slot: od.TensorDescriptor(str(tensor.dtype).removeprefix("torch."), tensor.shape)
        for slot, tensor in tensors.items()
    }
    return attention_problem(AttentionDescriptor(**fields), **descs, **sizes), tensors


def compile_attention_for_sm90() -> None:
    """Record the arguments ``run()`` passes to each kernel of SM90_PROBLEMS (forward and backward),
    specialize them as Triton's launcher does, and compile each for sm_90 down to a cubin."""
    from triton._utils import find_paths_if

    from opendnn.core.arrays import bind
    from opendnn.families.attention.problem import SLOTS, AttentionTensors

    target, backend = sm90.target_or_exit()
    launches = []
    for name in (
        "attention_forward_kernel",
        "attention_delta_kernel",
        "attention_dkdv_kernel",
        "attention_dq_kernel",
        "attention_dbias_kernel",
        "attention_dsinks_kernel",
    ):
        setattr(triton_backend, name, LaunchRecorder(getattr(triton_backend, name), launches))
    forward_slots = ("q", "k", "v", "o", "stats", "bias", "seq_lens_q", "seq_lens_kv", "alibi_slopes", "sinks")
    for dtype, shapes, bias, fields, lengths, per_head in SM90_PROBLEMS:
        params, descs, tensors = sm90_problem_tensors(dtype, shapes, bias, fields, lengths, per_head)
        for slots in (forward_slots, SLOTS):
            chosen = {slot: desc for slot, desc in descs.items() if slot in slots}
            problem = attention_problem(params, **chosen)
            bound = {slot: bind(slot, desc, tensors[slot]) for slot, desc in chosen.items()}
            triton_backend.run(problem, AttentionTensors(**bound))
    for dtype, shapes, fields, kind in SM90_LAYOUTS:
        for backward in (False, True) if kind == "ragged" else (False,):
            problem, tensors = sm90_layout_problem(dtype, shapes, fields, kind, backward)
            bound = {slot: bind(slot, getattr(problem, slot), tensor) for slot, tensor in tensors.items()}
            triton_backend.run(problem, AttentionTensors(**bound))
    compiled = 0
    for kernel, args, kwargs in launches:
        options, signature, constexprs, attrs = sm90.specialize(kernel, args, kwargs, backend)
        ints = find_paths_if(list(signature.values()), lambda _, kind: kind in ("i32", "i64"))
        pointers = {path: attr for path, attr in attrs.items() if path not in ints}
        for pattern, pattern_attrs in {"the launcher's": attrs, "no": pointers}.items():
            print(f"compiling {kernel.__name__} with {pattern} int divisibility attrs", flush=True)
            assert "cubin" in sm90.compile_sm90(kernel, signature, constexprs, pattern_attrs, options, target).asm
            compiled += 1
    print("compiled", compiled)


if __name__ == "__main__":
    compile_attention_for_sm90()
