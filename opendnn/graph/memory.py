"""A plan's memory: its workspace (the virtual tensors that cross from one step to another, then
the scratch the steps share, they run one after another, each region aligned) and the binding of
its tensors for an execute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, strided_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.handle import Handle

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


class Binding:
    """A plan's tensors bound for an execute: ``bounds``, each tensor's Bound by uid (the caller's
    arrays, the crossing tensors carved out of the workspace, the scalars a call reads as tensors);
    ``arrays``, the caller's arrays and scalar values by uid (None for the others); the steps'
    ``scratch``; per step what its first run learnt (a generated kernel's launch tensors, a call's
    recorded launches).
    A call with the very same arrays, ``workspace`` and ``handle`` runs on it as it is."""

    __slots__ = ("handle", "workspace", "bounds", "arrays", "scratch", "launch_tensors")

    def __init__(
        self, handle: Handle, workspace: Any, bounds: list[Bound | None], arrays: Sequence[Any], scratch: Any
    ) -> None:
        self.handle, self.workspace, self.bounds, self.arrays, self.scratch = handle, workspace, bounds, arrays, scratch
        self.launch_tensors: dict[Any, Any] = {}
