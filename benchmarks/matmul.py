"""Benchmark cases of matmul against torch (cuBLAS / cuBLASLt), same inputs, same process.

Suite ``matmul`` (each case in the requested dtype; float32 runs TF32 on both sides, through a
TENSOR_OP handle and ``torch.backends.cuda.matmul.allow_tf32``):
    square_4096, square_8192   C = A @ B, all packed row-major.
    ragged_4224                the same with N = 4224: 16.5 tiles of 256, 544 tiles in 5 rounds of 132 programs
                               where 4096 takes 4 (docs/design/matmul.md).
    llm_qkv, llm_up, llm_down  16384 tokens through a linear layer (4096->4096, 4096->11008,
                               11008->4096): x @ W.T with W stored (out, in), read transposed in place.
    fp8_8192, fp8_8192_fast    fp8 A (e4m3) @ B (e4m3 for bfloat16, e5m2 otherwise) stored column-major,
                               per-tensor scales, output in the requested dtype, against torch._scaled_mm;
                               precise accumulation, or fast (TENSOR_OP handle, use_fast_accum=True).
    linear_bias_gelu           gelu(x @ W.T + bias), 16384 x 4096 -> 4096, fused, against torch's
                               matmul, then bias add, then gelu.
    batched_128                512 independent 128 x 128 x 128 products.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, desc_of, nbytes, out_of_place

import opendnn

SIZES = {"full": 1, "quick": 4, "tiny": 64}  # dims divided by this (odd remainders added for tiny)
TF32_TOLERANCE = 2e-3


def _dims(ctx: Context, *dims: int) -> tuple[int, ...]:
    divisor = SIZES[ctx.size]
    return tuple(max(1, d // divisor) + (3 if ctx.size == "tiny" else 0) for d in dims)


@contextlib.contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _handle(ctx: Context, dtype: torch.dtype) -> opendnn.Handle:
    """TF32 for float32, as torch is told to use."""
    if dtype is not torch.float32:
        return ctx.handle
    return opendnn.create(ctx.device, math_type=opendnn.MathType.TENSOR_OP)


def _bench(
    ctx: Context,
    dtype: torch.dtype,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    torch_fn: Callable[[], torch.Tensor],
    epilogue: opendnn.MatmulEpilogue | None = None,
    extra_bytes: int = 0,
    label: str | None = None,
    handle: opendnn.Handle | None = None,
) -> Bench:
    handle = handle or _handle(ctx, dtype)
    a_desc, b_desc, c_desc = desc_of(a), desc_of(b), desc_of(c)

    def run_torch() -> torch.Tensor:
        with _tf32(dtype is torch.float32):
            return torch_fn()

    bench = out_of_place(
        lambda: opendnn.matmul(handle, 1.0, a_desc, a, b_desc, b, 0.0, c_desc, c, epilogue),
        run_torch,
        c,
        nbytes(a, b, c) + extra_bytes,
        (*a.shape[:-1], b.shape[-1], a.shape[-1]),
        label,
    )
    flops = 2 * c.numel() * a.shape[-1]
    tolerance = TF32_TOLERANCE if dtype is torch.float32 else None
    return Bench(
        bench.opendnn,
        bench.torch,
        bench.output,
        bench.nbytes,
        bench.reset,
        bench.shape,
        bench.dtype_label,
        flops,
        tolerance,
    )


def product(rows: int, inner: int, columns: int) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        m, k, n = _dims(ctx, rows, inner, columns)
        a, b = ctx.randn((m, k), dtype), ctx.randn((k, n), dtype)
        c = torch.empty((m, n), dtype=dtype, device=ctx.device)
        return _bench(ctx, dtype, a, b, c, lambda: a @ b)

    return build


def linear_layer(tokens: int, features_in: int, features_out: int) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        m, k, n = _dims(ctx, tokens, features_in, features_out)
        x, weight = ctx.randn((m, k), dtype), ctx.randn((n, k), dtype, k**-0.5)
        c = torch.empty((m, n), dtype=dtype, device=ctx.device)
        return _bench(ctx, dtype, x, weight.t(), c, lambda: F.linear(x, weight))

    return build


def fp8(fast: bool) -> Callable[[Context, torch.dtype], Bench]:
    """fp8 products with per-tensor scales: precise accumulation (partial sums promoted to fp32,
    torch's default) or fast (a TENSOR_OP handle against ``use_fast_accum=True``)."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        (m,) = _dims(ctx, 8192)
        m = (m + 15) // 16 * 16  # torch._scaled_mm needs multiples of 16
        b_type = torch.float8_e4m3fn if dtype is torch.bfloat16 else torch.float8_e5m2
        a = ctx.randn((m, m), torch.float32).to(torch.float8_e4m3fn)
        b = ctx.randn((m, m), torch.float32).to(b_type).t()  # column-major, as cuBLASLt's fp8 wants
        c = torch.empty((m, m), dtype=dtype, device=ctx.device)
        a_scale, b_scale = 0.5, 0.25
        scale_a = torch.tensor(a_scale, device=ctx.device)
        scale_b = torch.tensor(b_scale, device=ctx.device)
        epilogue = opendnn.MatmulEpilogue(a_scale=a_scale, b_scale=b_scale)
        handle = opendnn.create(ctx.device, math_type=opendnn.MathType.TENSOR_OP if fast else opendnn.MathType.DEFAULT)
        label = f"e4m3x{'e4m3' if b_type is torch.float8_e4m3fn else 'e5m2'}->{str(dtype).removeprefix('torch.')}"
        bench = _bench(
            ctx,
            dtype,
            a,
            b,
            c,
            lambda: torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=dtype, use_fast_accum=fast),
            epilogue,
            label=label,
            handle=handle,
        )
        return Bench(
            bench.opendnn,
            bench.torch,
            bench.output,
            bench.nbytes,
            bench.reset,
            bench.shape,
            label,
            bench.flops,
            1e-2 if fast or dtype is not torch.float32 else 1e-5,
        )

    return build


def linear_bias_gelu(ctx: Context, dtype: torch.dtype) -> Bench:
    m, k, n = _dims(ctx, 16384, 4096, 4096)
    x, weight = ctx.randn((m, k), dtype), ctx.randn((n, k), dtype, k**-0.5)
    bias = ctx.randn((n,), dtype)
    c = torch.empty((m, n), dtype=dtype, device=ctx.device)
    epilogue = opendnn.MatmulEpilogue(bias_desc=desc_of(bias), bias=bias, activation=opendnn.PointwiseMode.GELU_FWD)
    return _bench(
        ctx, dtype, x, weight.t(), c, lambda: F.gelu(torch.matmul(x, weight.t()) + bias), epilogue, nbytes(bias)
    )


def batched(ctx: Context, dtype: torch.dtype) -> Bench:
    count, size = (512, 128) if ctx.size != "tiny" else (5, 19)
    a, b = ctx.randn((count, size, size), dtype), ctx.randn((count, size, size), dtype)
    c = torch.empty((count, size, size), dtype=dtype, device=ctx.device)
    return _bench(ctx, dtype, a, b, c, lambda: torch.bmm(a, b))


MATMUL = [
    Case("square_4096", "matmul", product(4096, 4096, 4096)),
    Case("square_8192", "matmul", product(8192, 8192, 8192)),
    Case("ragged_4224", "matmul", product(4096, 4096, 4224)),
    Case("llm_qkv", "matmul", linear_layer(16384, 4096, 4096)),
    Case("llm_up", "matmul", linear_layer(16384, 4096, 11008)),
    Case("llm_down", "matmul", linear_layer(16384, 11008, 4096)),
    Case("fp8_8192", "matmul", fp8(fast=False)),
    Case("fp8_8192_fast", "matmul", fp8(fast=True)),
    Case("linear_bias_gelu", "matmul", linear_bias_gelu),
    Case("batched_128", "matmul", batched),
]

SUITES: dict[str, list[Case]] = {"matmul": MATMUL}
