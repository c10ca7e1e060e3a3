"""A plan's workspace: the virtual tensors that cross from one step to another, then the scratch
the steps share (they run one after another), each region aligned."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import strided_view
from opendnn.core.descriptors import TensorDescriptor

ALIGNMENT = 256  # bytes: every region starts at a multiple (any element type, vector loads)


def aligned(count: int) -> int:
    """``count`` bytes rounded up to a multiple of ALIGNMENT."""
    return -(-count // ALIGNMENT) * ALIGNMENT


def typed_view(buffer: Any, offset: int, desc: TensorDescriptor) -> Any:
    """The tensor ``desc`` laid in ``buffer`` (a 1-D uint8 NumPy array or torch tensor) from byte ``offset``."""
    piece = buffer[offset : offset + desc.size_in_bytes]
    if isinstance(piece, np.ndarray):
        return strided_view(piece.view(desc.dtype.to_numpy()), desc)
    return strided_view(piece.view(desc.dtype.to_torch()), desc)
