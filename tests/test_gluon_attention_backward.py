"""The warp-specialized dK/dV and dQ of the attention backward (``attention/gluon_backward.py``,
``gluon_backward_dq.py``): which backwards the planner gives them, and their kernels compiled for sm_90
on the CPU with their IR and ptxas figures checked (run as a script, it prints one JSON line per
compiled variant; the test runs it in a subprocess, with Triton's compiler instead of its
interpreter). Their results on an H200 are checked in ``test_gpu_attention_backward.py``."""

from __future__ import annotations

import dataclasses
import json

import pytest
import sm90
import torch

import opendnn as od
from opendnn.families.attention import gluon_backward, gluon_backward_dq, triton_backend
from opendnn.families.attention.api import attention_backward
from opendnn.families.attention.problem import AttentionDescriptor, attention_problem
from opendnn.kernels.launch import Launches

SHARED_MEMORY = 227 * 1024  # bytes a block may use on sm_90
WS = "warp_specialized_backward"
TL = "flash2_deterministic_backward"


def problem(dtype="bfloat16", head_dim=128, heads=(8, 2), seq=(4096, 4096), do=None, **fields):
    """A packed (B, H, S, D) backward problem of batch 2; ``do``: dO's descriptor (q's by default);
    ``fields``: the AttentionDescriptor's."""
    (heads_q, heads_kv), (seq_q, seq_kv) = heads, seq
    q = od.TensorDescriptor(dtype, (2, heads_q, seq_q, head_dim))
    k = od.TensorDescriptor(dtype, (2, heads_kv, seq_kv, head_dim))
    stats = od.TensorDescriptor("float32", (2, heads_q, seq_q))
    return attention_problem(AttentionDescriptor(**fields), q, k, k, q, stats=stats, do=do or q, dq=q, dk=k, dv=k)


# ---- the planner ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("bfloat16, head dim 128, causal", dict(causal=True)),
        ("float16, head dim 64", dict(dtype="float16", head_dim=64)),
        ("bottom-right causal, odd lengths", dict(causal=True, alignment="bottom_right", seq=(1000, 1537))),
        ("MQA", dict(heads=(8, 1))),
    ],
)
def test_16_bit_backwards_without_extras_take_the_warp_specialized_dkdv_and_dq_on_sm90(case, arguments):
    chosen = problem(**arguments)
    assert gluon_backward.out_of_scope(chosen) is None, case
    plan = triton_backend.choose(chosen, True, True)
    tl_plan = triton_backend.choose(chosen)  # delta keeps the tl kernel's tile
    assert (plan.strategy, tl_plan.strategy) == (WS, TL), case
    assert (plan.block_m, plan.block_n, plan.num_warps) == (tl_plan.block_m, tl_plan.block_n, tl_plan.num_warps)


@pytest.mark.parametrize(
    "case, arguments, reason",
    [
        ("float32", dict(dtype="float32"), "FLOAT data"),
        ("head dim 256", dict(head_dim=256), "head dim 256 (64 or 128)"),
        ("head dim 96", dict(head_dim=96), "head dims 96 and 96"),
        ("a window", dict(window=(64, 0)), "a window"),
        ("a softcap", dict(softcap=30.0), "a softcap"),
        ("dropout", dict(dropout_p=0.1), "dropout"),
    ],
)
def test_other_backwards_stay_on_the_tl_kernels(case, arguments, reason):
    assert reason in gluon_backward.out_of_scope(problem(**arguments)), case
    assert triton_backend.choose(problem(**arguments), True, True).strategy == TL, case


def test_ragged_and_length_limited_backwards_stay_on_the_tl_kernels():
    """The warp-specialized forward takes ragged offsets and per-batch lengths; its backward does not
    read them, so those backwards keep the tl kernels, which do."""
    d = od.TensorDescriptor
    q, k = (d("bfloat16", (1, heads, 5000, 128), (0, 128, heads * 128, 1)) for heads in (8, 2))
    stats, offsets = d("float32", (1, 8, 5000)), d("int32", (4,))
    ragged = attention_problem(
        AttentionDescriptor(causal=True, alignment="bottom_right"), q, k, k, q, stats=stats, do=q, dq=q, dk=k, dv=k,
        ragged_offsets_q=offsets, ragged_offsets_kv=offsets, max_seqlen_q=3000, max_seqlen_kv=3000,
    )  # fmt: skip
    lengths = dataclasses.replace(problem(causal=True), seq_lens_q=d("int32", (2,)), seq_lens_kv=d("int32", (2,)))
    for case in (ragged, lengths):
        assert gluon_backward.out_of_scope(case) == "ragged offsets or per-batch sequence lengths"
        assert triton_backend.choose(case, True, True).strategy == TL


def test_a_do_that_tma_cannot_read_keeps_the_backward_on_the_tl_kernels():
    dims = (2, 8, 4096, 128)
    bshd = od.TensorDescriptor("bfloat16", dims, (4096 * 8 * 128, 128, 8 * 128, 1))
    odd_rows = od.TensorDescriptor("bfloat16", dims, (4096 * 8 * 132, 132, 8 * 132, 1))  # 264-byte rows
    assert triton_backend.choose(problem(do=bshd), True, True).strategy == WS
    assert "do's strides" in gluon_backward.out_of_scope(problem(do=odd_rows))
    assert triton_backend.choose(problem(do=odd_rows), True, True).strategy == TL


def test_a_forward_an_unaligned_base_another_gpu_or_the_interpreter_never_takes_it():
    backward = problem()
    assert gluon_backward.out_of_scope(backward) is None
    assert triton_backend.choose(backward, True, False).strategy == TL  # not sm_90, or interpreted
    assert triton_backend.choose(backward, False, True).strategy == TL  # a base TMA cannot read
    assert triton_backend.choose(backward).strategy == TL
    forward = attention_problem(AttentionDescriptor(), backward.q, backward.k, backward.v, backward.o)
    assert gluon_backward.out_of_scope(forward) == "a forward"


def test_the_interpreter_runs_an_in_scope_backward_on_the_tl_kernels(monkeypatch):
    launched = []
    for module in (gluon_backward, gluon_backward_dq):
        monkeypatch.setattr(module, "launch", lambda *args: launched.append(args))
    generator = torch.Generator().manual_seed(1)
    q, k, v, o, do = (torch.randn(1, 2, 64, 64, generator=generator).half() for _ in range(5))
    stats = torch.randn(1, 2, 64, generator=generator)
    dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
    d = od.TensorDescriptor
    handle = od.create("cpu", backend="triton")
    pairs = [(d(t.dtype, t.shape), t) for t in (q, k, v, o, do, stats, dq, dk, dv)]
    attention_backward(handle, AttentionDescriptor(causal=True), *(item for pair in pairs for item in pair))
    assert not launched and all(bool(torch.isfinite(t).all()) for t in (dq, dk, dv))


def test_the_warp_specialized_backward_runs_delta_on_tl_then_dkdv_and_dq_on_gluon(monkeypatch):
    ran = []
    monkeypatch.setattr(Launches, "__call__", lambda self, tensors: ran.append((self, sorted(tensors))))
    choose = triton_backend.choose  # as on an sm_90 GPU with aligned tensors
    monkeypatch.setattr(triton_backend, "choose", lambda chosen, aligned, hopper: choose(chosen, True, True))
    generator = torch.Generator().manual_seed(2)
    q, k, v, o, do = (torch.randn(1, 2, 64, 64, generator=generator).half() for _ in range(5))
    stats = torch.randn(1, 2, 64, generator=generator)
    d = od.TensorDescriptor
    pairs = [(d(t.dtype, t.shape), t) for t in (q, k, v, o, do, stats, *(torch.empty_like(q) for _ in range(3)))]
    handle = od.create("cpu", backend="triton")
    attention_backward(handle, AttentionDescriptor(causal=True), *(item for pair in pairs for item in pair))
    [(launches, slots)] = ran
    assert [launch.kernel for launch in launches.launches] == [
        triton_backend.attention_delta_kernel,
        gluon_backward.attention_dkdv_warp_specialized_kernel,
        gluon_backward_dq.attention_dq_warp_specialized_kernel,
    ]
    assert [scratch.name for scratch in launches.scratch] == ["delta"]
    assert slots == ["dk", "do", "dq", "dv", "k", "o", "q", "stats", "v"]


# ---- every variant compiled for sm_90 ------------------------------------------------------------

# name: (kernel, dtype, head dim, causal); GQA 8/2, 4096 queries and keys
VARIANTS = {
    f"{kernel}_{dtype}_{head_dim}_{'causal' if causal else 'full'}": (kernel, dtype, head_dim, causal)
    for kernel in ("dkdv", "dq")
    for dtype in ("bfloat16", "float16")
    for head_dim in gluon_backward.HEAD_DIMS
    for causal in (False, True)
}
# (registers a consumer and the producer keep; the launch's registers a thread): setmaxnreg and ptxas
REGISTERS = ([24, 240], 168)
# kernel -> head dim -> the most bytes ptxas spills. dK/dV, measured: 368, causal 500, at head dim 128
# (loop-invariant scalars around the head loop, with dK, dV, S^T and dP^T taking 192 registers a
# thread), none at 64. dQ: none (BLOCK_N 64: dQ, S, dP and two dS take 160 at head dim 128)
SPILLS = {"dkdv": {64: 0, 128: 500}, "dq": {64: 0, 128: 0}}
# dQ's shared bytes, head dim -> measured: the query and dO blocks and the ring of 4 key and value stages
DQ_SHARED = {64: 98_752, 128: 197_056}


def products(kernel, head_dim):
    """(asynchronous products, those with A from registers, wgmma instructions) of both consumers.
    dK/dV, per consumer: S^T, dP^T, dV and dK (dV's P^T and dK's dS^T from registers) in each of the
    two loops (interior, edge); S^T's and dP^T's D / 16 k-steps, dV's and dK's BLOCK_M / 16. dQ, per
    consumer: the first block's S and dP, then S, dP and the previous block's dS K (dS from
    registers) in each of the two loops, the last block's dS K; S's and dP's D / 16 k-steps three
    times, dS K's BLOCK_N / 16 three times."""
    if kernel == "dkdv":
        return 2 * 8, 2 * 4, 2 * 2 * (2 * head_dim // 16 + 2 * gluon_backward.BLOCK_M // 16)
    return 2 * 9, 2 * 3, 2 * 3 * (2 * head_dim // 16 + gluon_backward_dq.BLOCK_N // 16)


def test_every_variant_compiles_to_a_warp_specialized_kernel_with_operands_from_registers():
    completed = sm90.run_script(__file__, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        kernel, _, head_dim, _ = VARIANTS[name]
        assert report["kernel"] == f"attention_{kernel}_warp_specialized_kernel", name
        assert report["partitions"] == [4, 1] and report["warps"] == 12, name
        async_mma, a_from_registers, wgmma_instructions = products(kernel, head_dim)
        assert (report["async_mma"], report["synchronous_mma"]) == (async_mma, 0), name
        assert report["a_from_registers"] == a_from_registers, name
        assert report["shared_loads"] == 0 and report["shared_stores"] == 0, name  # the A operands' conversions
        # dK/dV: k's and v's two halves, q and dO in each of the two loops; dQ: q's and dO's two
        # halves, k and v in each of the two loops
        assert report["tma_loads"] == 8, name
        assert report["wgmma_instructions"] == wgmma_instructions, name
        assert not report["serialized"], name  # ptxas keeps the products asynchronous
        assert [r for r in report["registers"] if r in REGISTERS[0]] == REGISTERS[0], name
        assert report["launch_registers"] == REGISTERS[1], name
        assert report["spilled"] <= SPILLS[kernel][head_dim], name
        assert report["shared"] <= SHARED_MEMORY, name
        if kernel == "dq":
            assert report["shared"] == DQ_SHARED[head_dim], name


def variant_launch(name):
    """(the kernel, its (grid, arguments, options)) of variant ``name`` on one-element tensors: only
    their dtypes and alignments specialize it."""
    kernel, dtype, head_dim, causal = VARIANTS[name]
    chosen = problem(dtype, head_dim, causal=causal)
    assert gluon_backward.out_of_scope(chosen) is None, name
    tensor = torch.empty(8, dtype=getattr(torch, dtype))
    floats = torch.empty(8)
    tensors = {**dict.fromkeys(("q", "k", "v", "do", "dq", "dk", "dv"), tensor), "stats": floats, "delta": floats}
    launch = (gluon_backward if kernel == "dkdv" else gluon_backward_dq).launch(chosen)
    return launch.kernel, (launch.grid, launch.filled(tensors), launch.options)


def main() -> None:
    """Print, per variant, a JSON line: its name and ``sm90.warp_specialized_report``."""
    target, backend = sm90.target_or_exit()
    for name in VARIANTS:
        kernel, (_, args, options) = variant_launch(name)
        report = sm90.warp_specialized_report(kernel, args, options, target, backend)
        print(json.dumps(dict(name=name, **report)), flush=True)


if __name__ == "__main__":
    main()
