"""TF32 references for the GPU tests: float32 rounded to TF32 as cuDNN rounds or truncated as the
tensor cores take it, and torch's result with cuDNN's TF32 allowed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def tf32_nearest(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` (finite) rounded to TF32, to nearest with ties away from zero, as cuDNN rounds."""
    return ((t.contiguous().view(torch.int32) + 0x1000) & -0x2000).view(torch.float32)


def tf32_truncated(t: torch.Tensor) -> torch.Tensor:
    """float32 ``t`` truncated to TF32 (its 13 low mantissa bits cleared), as the tensor cores take
    float32 operands that nothing has rounded."""
    return (t.contiguous().view(torch.int32) & -0x2000).view(torch.float32)


def cudnn_tf32(compute: Callable[..., torch.Tensor], *inputs: Any) -> torch.Tensor:
    """``compute`` of float32 ``inputs`` by torch with cuDNN's TF32 allowed."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        return compute(*inputs)
    finally:
        torch.backends.cudnn.allow_tf32 = saved
