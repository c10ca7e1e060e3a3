"""Storing a kernel's result: cuDNN's output blending ``out = alpha * value + beta * out`` (out unread
when beta is 0) and the conversion to the output's dtype."""

import triton
import triton.language as tl


@triton.jit
def narrowed(value, dtype: tl.constexpr):
    """``value`` as ``dtype``; a float64 becomes a bfloat16 through float32, as torch converts it (and
    Triton 3.6's interpreter garbles the direct conversion)."""
    if value.dtype == tl.float64 and dtype == tl.bfloat16:
        value = value.to(tl.float32)
    return value.to(dtype)


@triton.jit
def blend_store(ptr, offsets, mask, value, alpha, beta, HAS_BETA: tl.constexpr):
    """Store ``alpha * value (+ beta * out)`` at ``ptr + offsets``, in the output's dtype, the blend in
    ``value``'s."""
    out = value * alpha
    if HAS_BETA:
        out += beta * tl.load(ptr + offsets, mask=mask, other=0.0).to(value.dtype)
    tl.store(ptr + offsets, narrowed(out, ptr.dtype.element_ty), mask=mask)
