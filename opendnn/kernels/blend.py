"""cuDNN's output blending in a kernel: ``out = alpha * value + beta * out``, out unread when beta is 0."""

import triton
import triton.language as tl


@triton.jit
def blend_store(ptr, offsets, mask, value, alpha, beta, HAS_BETA: tl.constexpr):
    """Store ``alpha * value (+ beta * out)`` at ``ptr + offsets``, in the output's dtype, the blend in
    ``value``'s."""
    out = value * alpha
    if HAS_BETA:
        out += beta * tl.load(ptr + offsets, mask=mask, other=0.0).to(value.dtype)
    tl.store(ptr + offsets, out.to(ptr.dtype.element_ty), mask=mask)
