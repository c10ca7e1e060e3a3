"""The handle a Pythonic call runs on when the caller passes none: one shared handle per device."""

from __future__ import annotations

import functools
import os

from opendnn.core.arrays import Bound
from opendnn.core.handle import Handle, MathType


def handle_for(bound: Bound, handle: Handle | None) -> Handle:
    """``handle``, or the shared default handle of the bound's device."""
    return handle if handle is not None else shared_handle(bound.device)


def shared_handle(device: str, math_type: MathType = MathType.DEFAULT) -> Handle:
    """One handle per device, math type and ``OPENDNN_BACKEND``, made once instead of per call."""
    # (the math type by its value: an Enum member hashes through Python, 0.3 us a call)
    return _shared_handle(device, math_type._value_, os.environ.get("OPENDNN_BACKEND"))


@functools.lru_cache(maxsize=64)  # not a per-call cache: the one shared handle per device, math type, backend
def _shared_handle(device: str, math_type: str, backend: str | None) -> Handle:
    # Safe to share: a default handle has no stream of its own (it enqueues on the current one,
    # per thread), is never destroyed (callers never see it), and its algorithm cache is a dict
    # whose single reads and writes the GIL keeps whole; ``backend`` keys the environment's choice.
    return Handle(device, backend=backend or None, math_type=MathType(math_type))
