"""A plan's memory: its workspace (the virtual tensors that cross from one step to another, then
the scratch the steps share, they run one after another, each region aligned) and the binding of
its tensors for an execute."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, share_memory, strided_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.graph.operation_graph import OperationGraph
from opendnn.graph.operations import CONCATENATED

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


def in_place_inputs(graph: OperationGraph) -> frozenset[tuple[int, int]]:
    """(output uid, input uid) of each concatenation's ``in_place_index`` input: cuDNN's input that
    already lives in its sub-region of the output's memory (copied onto itself)."""
    return frozenset(
        (node.outputs[0][1], uid)
        for node in graph.nodes
        if node.op == "concatenate" and node.attribute("in_place_index") is not None
        for role, uid in node.inputs
        if role == f"{CONCATENATED}{node.attribute('in_place_index')}"
    )


def check_outputs_apart(
    bounds: Sequence[Bound | None],
    bound_tensors: Sequence[tuple[int, str, TensorDescriptor, bool]],
    in_place: frozenset[tuple[int, int]],
) -> None:
    """Refuse a variant pack whose output shares memory with another of its arrays (an input, or
    another output; the very same elements too): the engines read and write in different orders,
    one kernel per node or one for several, so their results would differ. A concatenation's
    ``in_place`` input inside its output is the exception.

    Args:
        bounds: each tensor's Bound by uid.
        bound_tensors: (uid, name, descriptor, written) of each tensor the caller binds.
        in_place: (output uid, input uid) pairs allowed to share memory (``in_place_inputs``).

    Raises:
        BadParam: naming both entries of the pack.
    """
    for uid, name, _, written in bound_tensors:
        if not written:
            continue
        out = bounds[uid]
        assert out is not None
        for other_uid, other_name, _, other_written in bound_tensors:
            if other_uid == uid or (other_written and other_uid < uid) or (uid, other_uid) in in_place:
                continue  # (a pair of outputs is asked once)
            other = bounds[other_uid]
            assert other is not None
            if share_memory(out, other):
                role = "output" if other_written else "input"
                raise BadParam(
                    f"variant_pack['{name}'] (an output) and variant_pack['{other_name}'] (an {role}) share "
                    "memory: a graph's output needs memory of its own, apart from its inputs and other outputs "
                    "(the very same elements too)"
                )


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
