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
from opendnn.core.arrays import CPU, Bound
from opendnn.core.errors import NotSupported, Status
from opendnn.core.handle import BACKENDS, Handle, require_backend_available

OPERATION_FAMILIES = (  # one line per family: its backends are opendnn/families/<family>/<backend>_backend.py
    "pointwise",
    "reduce",
    "pooling",
    "lrn",
    "batch_norm",
    "normalization",
    "softmax",
    "matmul",
    "convolution",
)


@dataclass(frozen=True)
class Operation:
    name: str
    backends: dict[str, str]  # backend name -> module implementing it


OPERATIONS = {family: Operation(family, {backend: f"opendnn.families.{family}.{backend}_backend"
                                         for backend in BACKENDS}) for family in OPERATION_FAMILIES}


def dispatch(handle: Handle, operation: str, problem: Any, *tensors: Any) -> None:
    """Run ``problem`` on the handle's backend, on its device and stream.

    Raises:
        BadParam: a tensor on another device than the handle's.
        NotSupported: the backend refuses the problem, with its reason.
    """
    device = handle.device
    for item in tensors:  # Bounds, or lists and tuples of them (None where a tensor is absent)
        if isinstance(item, Bound):
            if item.device != device:
                handle.check_device(item.name, item.device)
        elif isinstance(item, (list, tuple)):
            for tensor in item:
                if isinstance(tensor, Bound) and tensor.device != device:
                    handle.check_device(tensor.name, tensor.device)
    launching = handle.launching()  # refuses a destroyed handle
    backend = handle.backend
    implementation = load_backend(operation, backend, device)
    reason = refusal(implementation, problem)
    if reason is not None:
        raise NotSupported(f"{operation} on backend {backend!r}: {reason}", Status.NOT_SUPPORTED)
    if log.enabled(log.INFO):
        log.logger().info("%s backend=%s device=%s problem=%s", operation, backend, device, problem)
    with launching:
        implementation.run(problem, *tensors)


@functools.lru_cache(maxsize=1024)  # supports() is a pure function of the (frozen) problem
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
        raise NotSupported("backend='triton' on the CPU runs Triton's interpreter: set TRITON_INTERPRET=1 "
                           "before triton is first imported", Status.NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
    return backend_module(operation, backend)


@functools.cache  # a module loads once; a missing package raises, and is not cached
def backend_module(operation: str, backend: str) -> Any:
    """The module implementing ``operation`` on ``backend``, loaded on first use. A family's backend
    that builds on another family's (convolution on the matrix product, say) takes it from here."""
    require_backend_available(backend)
    return importlib.import_module(OPERATIONS[operation].backends[backend])

