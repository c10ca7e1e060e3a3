"""Attention benchmark cases: ``opendnn.functional.scaled_dot_product_attention`` and its backward beside
``torch.nn.functional.scaled_dot_product_attention`` (torch picks its fastest backend on the machine:
cuDNN, flash or memory-efficient), same torch tensors, same process.

Suite ``attention``, bfloat16 on the H200 (``--dtypes bfloat16``), shapes after FlashAttention-3's
benchmark (a model width of 2048, about 16k tokens a batch) and Llama-3.1's GQA (64 query heads, 8
key/value heads):
    gqa_hd128   64/8 heads of 128, sequences of 4k (batch 4) and 16k (batch 1), causal and not,
                forward and backward (dq, dk, dv);
    mha_hd128   16/16 heads of 128, the same sequences, masks and directions;
    mha_hd64    32 heads of 64 and ``mha_hd256`` 8 heads of 256, 4k (batch 4), forward, causal and not;
                and GPT-2 small's attention, 12 heads of 64, 8 sequences of 1k, causal, forward and
                backward;
    varlen      16 heads of 128, 16,384 tokens in five sequences of 1k to 6k (the token count of
                mha_hd128 at 4k), causal, forward and backward through the packed (cu_seqlens) call;
                torch runs its SDPA sequence by sequence, having no packed form on a dense call;
    fp8         gqa_hd128 at 4k, causal and not, forward with q, k and v in float8_e4m3fn (P scaled by
                448 before its rounding, o in bfloat16) beside torch's bfloat16 SDPA on the same
                values (torch has no fp8 SDPA); the check allows the rounding of P to e4m3 (5%); and
                the non-causal backward (q, k, v, o and dO in e4m3, P scaled by 448 and dS by 64
                before their rounding, gradients in bfloat16) beside torch's bfloat16 SDPA backward
                on the same values, the check allowing the rounding of P and dS to e4m3 (10%).
Tensors are BSHD in memory, (B, H, S, D) views, as a model's projections leave them.

FLOPs: ``4 * B * Hq * Sq * Skv * D`` forward (two products of 2 flops a multiply-add), halved
causal; the backward counts 2.5 forwards (five products). Varlen sums over its sequences. The
correctness check compares the output (forward) or dq, dk and dv flattened into one tensor
(backward; each side pays the same concatenation); the forward's output is copied into the tensor
the check reads (one pass over o, under 1% of the call).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from suites import Bench, Case, Context, nbytes

import opendnn.functional as F

# "full" is the real shape, "quick" a GPU smoke run, "tiny" the CPU smoke run (odd lengths: masked tails)
# (batch, query heads, key/value heads, sequence, head dim)
SHAPES: dict[str, dict[str, tuple[int, int, int, int, int]]] = {
    "gqa_hd128_4k": {"full": (4, 64, 8, 4096, 128), "quick": (1, 64, 8, 1024, 128), "tiny": (2, 4, 2, 37, 16)},
    "gqa_hd128_16k": {"full": (1, 64, 8, 16384, 128), "quick": (1, 16, 2, 2048, 128), "tiny": (1, 4, 2, 70, 16)},
    "mha_hd128_4k": {"full": (4, 16, 16, 4096, 128), "quick": (1, 16, 16, 1024, 128), "tiny": (2, 3, 3, 37, 16)},
    "mha_hd128_16k": {"full": (1, 16, 16, 16384, 128), "quick": (1, 16, 16, 2048, 128), "tiny": (1, 3, 3, 70, 16)},
    "mha_hd64_4k": {"full": (4, 32, 32, 4096, 64), "quick": (1, 32, 32, 1024, 64), "tiny": (2, 3, 3, 37, 8)},
    "mha_hd256_4k": {"full": (4, 8, 8, 4096, 256), "quick": (1, 8, 8, 1024, 256), "tiny": (2, 3, 3, 37, 32)},
    # GPT-2 small's attention: 8 sequences of 1,024 tokens, 12 heads of 64
    "mha_hd64_1k": {"full": (8, 12, 12, 1024, 64), "quick": (2, 12, 12, 512, 64), "tiny": (2, 3, 3, 37, 8)},
}
# the varlen rows: (heads, head dim, sequence lengths)
VARLEN: dict[str, tuple[int, int, tuple[int, ...]]] = {
    "full": (16, 128, (1024, 2048, 3072, 4096, 6144)),
    "quick": (16, 128, (256, 512, 768, 1024, 1536)),
    "tiny": (3, 16, (5, 40, 17)),
}

Build = Callable[[Context, torch.dtype], Bench]


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor


def bshd(ctx: Context, dtype: torch.dtype, batch: int, heads: int, seq: int, dim: int) -> torch.Tensor:
    """A random (batch, heads, seq, dim) view of BSHD memory."""
    return ctx.randn((batch, seq, heads, dim), dtype).transpose(1, 2)


def attention_flops(heads: int, dim: int, pairs: int, causal: bool, backward: bool) -> int:
    """``4 * heads * pairs * dim`` (pairs: Sq * Skv summed over the batch), halved causal, x2.5 backward."""
    flops = 4 * heads * pairs * dim // (2 if causal else 1)
    return flops * 5 // 2 if backward else flops


def dense(shape_name: str, causal: bool, backward: bool) -> Build:
    """The dense call: forward ``o = softmax(q k^T / sqrt(D)) v``, or the backward's dq, dk, dv."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        batch, heads_q, heads_kv, seq, dim = SHAPES[shape_name][ctx.size]
        inputs = Inputs(
            bshd(ctx, dtype, batch, heads_q, seq, dim),
            bshd(ctx, dtype, batch, heads_kv, seq, dim),
            bshd(ctx, dtype, batch, heads_kv, seq, dim),
            bshd(ctx, dtype, batch, heads_q, seq, dim),
        )
        options = dict(is_causal=causal, enable_gqa=heads_q != heads_kv)
        flops = attention_flops(heads_q, dim, batch * seq * seq, causal, backward)
        shape = (batch, heads_q, heads_kv, seq, dim)
        run = _backward if backward else _forward
        return run(inputs, options, flops, shape)

    return build


def dense_fp8(shape_name: str, causal: bool) -> Build:
    """The fp8 forward (e4m3 q, k, v; P scaled to e4m3's largest value; o in bfloat16) beside torch's
    bfloat16 forward on the same values."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        batch, heads_q, heads_kv, seq, dim = SHAPES[shape_name][ctx.size]
        fp8 = torch.float8_e4m3fn
        q, k, v = (bshd(ctx, dtype, batch, heads, seq, dim).to(fp8) for heads in (heads_q, heads_kv, heads_kv))
        options = dict(is_causal=causal, enable_gqa=heads_q != heads_kv)
        factors = dict(scale_s=448.0, descale_s=torch.tensor([1 / 448], device=q.device))
        wide = [t.to(torch.bfloat16) for t in (q, k, v)]
        output = torch.empty_like(wide[0])
        return Bench(
            lambda: output.copy_(
                F.scaled_dot_product_attention(q, k, v, out_dtype=torch.bfloat16, **factors, **options)
            ),
            lambda: torch.nn.functional.scaled_dot_product_attention(*wide, **options),
            output,
            nbytes(q, k, v) + nbytes(output),
            lambda: output.fill_(math.nan),
            (batch, heads_q, heads_kv, seq, dim),
            dtype_label="float8_e4m3fn",
            flops=attention_flops(heads_q, dim, batch * seq * seq, causal, False),
            tolerance=0.05,
        )

    return build


def dense_fp8_backward(shape_name: str) -> Build:
    """The fp8 backward (e4m3 q, k, v, o and dO; P scaled by 448 and dS by 64 before their rounding;
    bfloat16 gradients) beside torch's bfloat16 backward on the same values."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        batch, heads_q, heads_kv, seq, dim = SHAPES[shape_name][ctx.size]
        fp8 = torch.float8_e4m3fn
        q, k, v = (bshd(ctx, dtype, batch, heads, seq, dim).to(fp8) for heads in (heads_q, heads_kv, heads_kv))
        do = bshd(ctx, dtype, batch, heads_q, seq, dim).to(fp8)
        options = dict(enable_gqa=heads_q != heads_kv)
        forward = dict(scale_s=448.0, descale_s=1 / 448)
        out, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, **forward, **options)
        factors = dict(forward, scale_dp=64.0, descale_dp=1 / 64)
        leaves = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
        theirs = torch.nn.functional.scaled_dot_product_attention(*leaves, **options)
        return _gradients(
            lambda: F.scaled_dot_product_attention_backward(
                do, q, k, v, out, stats, grad_dtype=torch.bfloat16, **factors, **options
            ),
            theirs,
            leaves,
            do.to(torch.bfloat16),
            nbytes(q, k, v, out, do) + nbytes(*leaves),
            (batch, heads_q, heads_kv, seq, dim),
            attention_flops(heads_q, dim, batch * seq * seq, False, True),
            tolerance=0.1,
        )

    return build


def _forward(inputs: Inputs, options: dict, flops: int, shape: tuple[int, ...]) -> Bench:
    q, k, v = inputs.q, inputs.k, inputs.v
    output = torch.empty_like(q)
    return Bench(
        lambda: output.copy_(F.scaled_dot_product_attention(q, k, v, **options)),
        lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, **options),
        output,
        nbytes(q, k, v, q),
        lambda: output.fill_(math.nan),
        shape,
        flops=flops,
    )


def _backward(inputs: Inputs, options: dict, flops: int, shape: tuple[int, ...]) -> Bench:
    """dq, dk, dv from the forward's saved output and statistics (opendnn) or its autograd graph (torch)."""
    q, k, v, do = inputs.q, inputs.k, inputs.v, inputs.do
    out, stats = F.scaled_dot_product_attention(q, k, v, return_stats=True, **options)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    theirs = torch.nn.functional.scaled_dot_product_attention(*leaves, **options)
    return _gradients(
        lambda: F.scaled_dot_product_attention_backward(do, q, k, v, out, stats, **options),
        theirs,
        leaves,
        do,
        nbytes(q, k, v, out, do, q, k, v),
        shape,
        flops,
    )


def _gradients(
    ours: Callable[[], Sequence[torch.Tensor]],
    theirs: Any,
    leaves: list[torch.Tensor],
    grad_theirs: Any,
    moved: int,
    shape: tuple[int, ...],
    flops: int,
    tolerance: float | None = None,
) -> Bench:
    """A backward's Bench: opendnn's dq, dk, dv (the first three of ``ours()``) and torch's autograd
    ones of ``theirs`` with respect to ``leaves``, each side flattened into one tensor."""
    output = torch.empty(sum(leaf.numel() for leaf in leaves), dtype=leaves[0].dtype, device=leaves[0].device)

    def run_opendnn() -> torch.Tensor:
        return torch.cat([g.reshape(-1) for g in ours()[:3]], out=output)

    def run_torch() -> torch.Tensor:
        grads = torch.autograd.grad(theirs, leaves, grad_theirs, retain_graph=True)
        return torch.cat([g.reshape(-1) for g in grads])

    checks = {} if tolerance is None else dict(dtype_label="float8_e4m3fn", tolerance=tolerance)
    return Bench(run_opendnn, run_torch, output, moved, lambda: output.fill_(math.nan), shape, flops=flops, **checks)


def varlen(backward: bool) -> Build:
    """The packed (cu_seqlens) call over sequences of different lengths, causal; torch: one SDPA per sequence."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        heads, dim, lengths = VARLEN[ctx.size]
        tokens = sum(lengths)
        q, k, v, do = (ctx.randn((tokens, heads, dim), dtype) for _ in range(4))
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=ctx.device)
        longest = max(lengths)
        flops = attention_flops(heads, dim, sum(length * length for length in lengths), True, backward)
        shape = (len(lengths), heads, heads, tokens, dim)
        packed = dict(max_seqlen_q=longest, max_seqlen_k=longest, is_causal=True)
        starts = [int(start) for start in offsets[:-1].tolist()]
        pieces = [slice(start, start + length) for start, length in zip(starts, lengths)]

        def per_sequence(t: torch.Tensor, piece: slice) -> torch.Tensor:
            return t[piece].transpose(0, 1).unsqueeze(0)  # (1, heads, length, dim): SDPA's fused kernels take 4-D only

        def sdpa(*tensors: torch.Tensor) -> list[torch.Tensor]:
            return [
                torch.nn.functional.scaled_dot_product_attention(
                    *(per_sequence(t, piece) for t in tensors), is_causal=True
                )
                for piece in pieces
            ]

        if not backward:
            output = torch.empty_like(q)

            def run_opendnn() -> torch.Tensor:
                return output.copy_(F.scaled_dot_product_attention_varlen(q, k, v, offsets, offsets, **packed))

            def run_torch() -> torch.Tensor:
                return torch.cat([o[0].transpose(0, 1) for o in sdpa(q, k, v)])

            return Bench(
                run_opendnn, run_torch, output, nbytes(q, k, v, q), lambda: output.fill_(math.nan), shape, flops=flops
            )
        out, stats = F.scaled_dot_product_attention_varlen(q, k, v, offsets, offsets, return_stats=True, **packed)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        outs = sdpa(*leaves)
        do_pieces = [per_sequence(do, piece) for piece in pieces]
        return _gradients(
            lambda: F.scaled_dot_product_attention_varlen_backward(do, q, k, v, out, stats, offsets, offsets, **packed),
            outs,
            leaves,
            do_pieces,
            nbytes(q, k, v, out, do, q, k, v),
            shape,
            flops,
        )

    return build


def _dense_cases() -> list[Case]:
    cases = []
    for heads in ("gqa", "mha"):
        for backward in (False, True):
            for seq in ("4k", "16k"):
                for causal in (False, True):
                    name = f"attn_{heads}_hd128_{seq}{'_causal' if causal else ''}_{'bwd' if backward else 'fwd'}"
                    cases.append(Case(name, "attention", dense(f"{heads}_hd128_{seq}", causal, backward)))
    for dim in (64, 256):
        for causal in (False, True):
            name = f"attn_mha_hd{dim}_4k{'_causal' if causal else ''}_fwd"
            cases.append(Case(name, "attention", dense(f"mha_hd{dim}_4k", causal, False)))
    for backward in (False, True):  # GPT-2's causal attention
        name = f"attn_mha_hd64_1k_causal_{'bwd' if backward else 'fwd'}"
        cases.append(Case(name, "attention", dense("mha_hd64_1k", True, backward)))
    return cases


ATTENTION = [
    *_dense_cases(),
    Case("attn_varlen_hd128_causal_fwd", "attention", varlen(False)),
    Case("attn_varlen_hd128_causal_bwd", "attention", varlen(True)),
    Case("attn_gqa_hd128_fp8_4k_fwd", "attention", dense_fp8("gqa_hd128_4k", False)),
    Case("attn_gqa_hd128_fp8_4k_causal_fwd", "attention", dense_fp8("gqa_hd128_4k", True)),
    Case("attn_gqa_hd128_fp8_4k_bwd", "attention", dense_fp8_backward("gqa_hd128_4k")),
]

SUITES: dict[str, list[Case]] = {"attention": ATTENTION}
