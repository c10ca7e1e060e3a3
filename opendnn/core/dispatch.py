"""The table of operations and the dispatch that sends a validated problem to a backend.

An operation is an operation family (``opendnn/families/<family>/``); each of its backend modules
(``numpy_backend.py``, ``triton_backend.py``) has ``supports(problem) -> reason or None`` and
``run(problem, *tensors)``. Modules are named here by string and load on first use, so
``import opendnn`` loads no backend.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any

from opendnn.core import log
from opendnn.core.arrays import CPU, Bound, check_overlaps
from opendnn.core.errors import BadParam, NotSupported, Status
from opendnn.core.handle import BACKENDS, Handle, require_backend_available
from opendnn.core.plans import Plan
from opendnn.core.recording import SCOPE

# Not every Triton kernel computes its element offsets in 64 bits: a tensor reaching further than 32-bit
# offsets address is refused before any launch rather than read or written at wrapped offsets.
TRITON_MAX_EXTENT = 2**31 - 1


@dataclass(frozen=True)
class Operation:
    """An operation family: its backends (``opendnn/families/<name>/<backend>_backend.py``), and which
    inputs an output may be exactly, read and written in place (``check_overlaps``): True for any
    (elementwise modes, each element its own; softmax, each row read whole before it is written), or names."""

    name: str
    in_place: bool | tuple[str, ...] = False

    @property
    def backends(self) -> dict[str, str]:
        """Backend name -> the module implementing it."""
        return {backend: f"opendnn.families.{self.name}.{backend}_backend" for backend in BACKENDS}


OPERATIONS = {
    op.name: op
    for op in (  # one line per family
        Operation("pointwise", in_place=True),
        Operation("reduce"),
        Operation("pooling"),
        Operation("lrn"),
        Operation("batch_norm"),
        Operation("normalization"),
        Operation("softmax", in_place=True),
        Operation("matmul"),
        Operation("convolution", in_place=("z",)),
        Operation("attention"),
        Operation("resample"),
    )
}


def require_handle(handle: Any) -> Handle:
    """``handle``, when it is a Handle.

    Raises:
        BadParam: naming ``handle``.
    """
    if not isinstance(handle, Handle):  # (the message is formatted only on failure: this runs for every call)
        raise BadParam(f"handle={handle!r} must be a Handle (opendnn.create)")
    return handle


def dispatch(handle: Handle, operation: str, problem: Any, *tensors: Any) -> Any:
    """Run ``problem`` on the handle's backend, on its device and stream; returns the backend module
    that ran it (what a ``Plan`` keeps for the calls of the same signature).

    Raises:
        BadParam: a tensor on another device than the handle's, a caller's output that overlaps
            another tensor of the call (``check_overlaps``).
        NotSupported: the backend refuses the problem, with its reason.
    """
    device = require_handle(handle).device
    writes = False  # a caller's array among the outputs: opendnn's own new outputs overlap nothing
    extent = 0  # the most elements any tensor of the call reaches
    for item in tensors:  # Bounds, or lists and tuples of them (None where a tensor is absent)
        if isinstance(item, Bound):
            writes = writes or item.output
            extent = max(extent, item.desc.extent)
            if item.device != device:
                handle.check_device(item.name, item.device)
        elif isinstance(item, (list, tuple)):
            for tensor in item:
                if isinstance(tensor, Bound):
                    writes = writes or tensor.output
                    extent = max(extent, tensor.desc.extent)
                    if tensor.device != device:
                        handle.check_device(tensor.name, tensor.device)
    if writes:
        bounds = [
            t
            for item in tensors
            for t in (item if isinstance(item, (list, tuple)) else (item,))
            if isinstance(t, Bound)
        ]
        check_overlaps(bounds, OPERATIONS[operation].in_place)
    backend = handle.backend
    implementation = load_backend(operation, backend, device)
    if backend == "triton" and extent > TRITON_MAX_EXTENT:
        raise NotSupported(
            f"{operation} on backend 'triton': a tensor reaches {extent} elements, past the "
            f"2^31 - 1 that the kernels' 32-bit element offsets address",
            Status.NOT_SUPPORTED_SHAPE,
        )
    reason = refusal(implementation, problem)
    if reason is not None:
        raise NotSupported(f"{operation} on backend {backend!r}: {reason}", Status.NOT_SUPPORTED)
    _run(handle, operation, implementation, problem, tensors)
    return implementation


def execute(handle: Handle, plan: Plan, *tensors: Any) -> None:
    """Run a planned call: the tensors are bound to the plan's descriptors and its outputs are new,
    so what ``dispatch`` checks (devices, overlaps, extents, the backend's refusal) holds already."""
    _run(handle, plan.operation, plan.implementation, plan.problem, tensors)


def _run(handle: Handle, operation: str, implementation: Any, problem: Any, tensors: tuple[Any, ...]) -> None:
    launching = handle.launching()  # refuses a destroyed handle
    recorder = SCOPE.recorder
    if recorder is not None:  # a call being recorded (core/recording.py)
        recorder.dispatched(handle, operation, problem)
    if log.enabled(log.INFO):
        log.logger().info("%s backend=%s device=%s problem=%s", operation, handle.backend, handle.device, problem)
    with launching:
        implementation.run(problem, *tensors)


@functools.lru_cache(maxsize=1024)  # per problem: the cuDNN-shaped calls keep no plan and ask on every call
def _cached_refusal(implementation: Any, problem: Any) -> str | None:
    reason: str | None = implementation.supports(problem)
    return reason


def refusal(implementation: Any, problem: Any) -> str | None:
    """Why the backend module ``implementation`` refuses ``problem``, or None (memoized per problem)."""
    try:
        return _cached_refusal(implementation, problem)
    except TypeError:  # a problem holding something unhashable
        return implementation.supports(problem)  # type: ignore[no-any-return]


def load_backend(operation: str, backend: str, device: str) -> Any:
    """The module implementing ``operation`` on ``backend`` (Triton on the CPU is interpreted)."""
    if backend == "triton" and device == CPU and os.environ.get("TRITON_INTERPRET") != "1":
        raise NotSupported(
            "backend='triton' on the CPU runs Triton's interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported",
            Status.NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING,
        )
    return backend_module(operation, backend)


@functools.cache  # a module loads once; a missing package raises, and is not cached
def backend_module(operation: str, backend: str) -> Any:
    """The module implementing ``operation`` on ``backend``, loaded on first use. A family's backend
    that builds on another family's (convolution on the matrix product, say) takes it from here."""
    require_backend_available(backend)
    return importlib.import_module(OPERATIONS[operation].backends[backend])
