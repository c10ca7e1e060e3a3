"""v^T for the warp-specialized fp8 forward (``gluon_forward``): wgmma takes 8-bit operands K-major
only, and P V reduces along the keys, so the kernel reads v as a (B, Hkv, Dv, S) copy whose keys are
contiguous, made once a call by ``transposed_values_kernel`` into a scratch array of the call.

Bytes: v read and written once, 2 * B * Hkv * Skv * Dv (one byte an element), against the forward's
4 * B * Hq * Sq * Skv * D FLOPs: 2 * Hq * Sq / Hkv FLOPs a byte (at 4k tokens and GQA 64/8 about
1/200 of the call at the H200's copy rate and e4m3's tensor-core rate). One program per BLOCK_S keys
of one (batch, head): a tile loaded along the head dim, stored along the keys (Triton's layout
conversion runs through shared memory). The copy's rows are padded to a multiple of 16 keys, so that
each is 16-byte aligned as TMA reads it; the forward's descriptor stops at Skv, so the padding is
never read.
"""

from __future__ import annotations

import triton
import triton.language as tl

from opendnn.core.descriptors import TensorDescriptor
from opendnn.kernels.device import TMA_ALIGNMENT
from opendnn.kernels.launch import Launch, Scratch, Slot

BLOCK_S = 64  # keys a program
VALUES_TRANSPOSED = "values_transposed"  # the scratch holding v^T, as the forward's launches name it


@triton.jit
def transposed_values_kernel(
    v_ptr,
    out_ptr,
    heads,
    seq_kv,
    v_stride_b,
    v_stride_h,
    v_stride_s,
    v_stride_d,
    out_stride_b,
    out_stride_h,
    out_stride_d,
    VALUE_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """out[b, h, d, s] = v[b, h, s, d] for keys s of block program_id(0), (b, h) of program_id(1)."""
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    keys = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, VALUE_DIM)
    v_base = v_ptr + b.to(tl.int64) * v_stride_b + h.to(tl.int64) * v_stride_h
    tile = tl.load(
        v_base + keys.to(tl.int64)[:, None] * v_stride_s + dims[None, :] * v_stride_d, mask=(keys < seq_kv)[:, None]
    )
    out_base = out_ptr + b.to(tl.int64) * out_stride_b + h.to(tl.int64) * out_stride_h
    tl.store(
        out_base + dims.to(tl.int64)[:, None] * out_stride_d + keys[None, :],
        tl.trans(tile),
        mask=(keys < seq_kv)[None, :],
    )


def transposed_values(desc: TensorDescriptor) -> tuple[Launch, Scratch]:
    """The launch writing v^T of the (B, Hkv, S, Dv) tensor ``v`` of ``desc`` (slot "v") into the
    (B, Hkv, Dv, S) scratch VALUES_TRANSPOSED at ``transposed_strides``, and that scratch."""
    import torch

    batch, heads, seq_kv, value_dim = desc.dims
    strides = transposed_strides(desc)
    grid = (triton.cdiv(seq_kv, BLOCK_S), batch * heads)
    args = (Slot("v"), Slot(VALUES_TRANSPOSED), heads, seq_kv, *desc.strides, *strides)
    launch = Launch(transposed_values_kernel, grid, args, dict(VALUE_DIM=value_dim, BLOCK_S=BLOCK_S))
    return launch, Scratch(VALUES_TRANSPOSED, transposed_elements(desc), getattr(torch, desc.dtype.value))


def transposed_strides(desc: TensorDescriptor) -> tuple[int, int, int]:
    """The (B, H, D) strides of v^T's copy of ``desc``'s v (unit key stride), its rows of S keys
    padded to 16-byte multiples."""
    _, heads, seq_kv, value_dim = desc.dims
    keys = TMA_ALIGNMENT // desc.dtype.itemsize  # a 16-byte row's
    padded = triton.cdiv(seq_kv, keys) * keys
    return (heads * value_dim * padded, value_dim * padded, padded)


def transposed_elements(desc: TensorDescriptor) -> int:
    """Elements of v^T's copy of ``desc``'s v, padding included."""
    return desc.dims[0] * transposed_strides(desc)[0]
