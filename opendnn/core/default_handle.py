"""The handle a Pythonic call runs on when the caller passes none: one shared handle per device."""

from __future__ import annotations

import functools
import os
from typing import Any

from opendnn.core.arrays import Bound
from opendnn.core.handle import Handle, MathType


def handle_for(bound: Bound, handle: Handle | None) -> Handle:
    """``handle``, or the shared default handle of the bound's device."""
    return handle if handle is not None else shared_handle(bound.device)


def shared_handle(device: str, math_type: MathType = MathType.DEFAULT) -> Handle:
    """One handle per device, math type and ``OPENDNN_BACKEND``, made once instead of per call."""
    # (the math type by its value: an Enum member hashes through Python, 0.3 us a call)
    return _shared_handle(device, math_type._value_, _ENVIRONMENT.get(_BACKEND_VARIABLE))


# os.environ's own mapping, read without its Mapping.get (which raises and catches a KeyError where the
# variable is unset: 0.6 us a call, against 0.03): the shared handle follows the variable on every call
_ENVIRONMENT = os.environ._data  # type: ignore[attr-defined]
_BACKEND_VARIABLE = os.environ.encodekey("OPENDNN_BACKEND")  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=64)  # not a per-call cache: the one shared handle per device, math type, backend
def _shared_handle(device: str, math_type: Any, backend: Any) -> Handle:
    # Safe to share: a default handle has no stream of its own (it enqueues on the current one,
    # per thread), is never destroyed (callers never see it), and its algorithm cache is a dict
    # whose single reads and writes the GIL keeps whole; ``backend`` keys the environment's choice.
    # ``backend``: the variable's value as the environment holds it (bytes on POSIX)
    environment = os.environ.decodevalue(backend) if backend else None  # type: ignore[attr-defined]
    return Handle(device, backend=environment, math_type=MathType(math_type))
