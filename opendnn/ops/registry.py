"""The table of operations and the dispatch that sends a validated problem to a backend.

Each backend module named here has ``supports(problem) -> reason or None`` and
``run(problem, *tensors)``; modules load on first use, so ``import opendnn`` loads no backend.
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
from opendnn.core.handle import Handle, require_backend_available


@dataclass(frozen=True)
class Operation:
    name: str
    backends: dict[str, str]  # backend name -> module implementing it


OPERATIONS = {op.name: op for op in (
    Operation("pointwise", {"numpy": "opendnn.backends.numpy.pointwise",
                            "triton": "opendnn.backends.triton.pointwise"}),
    Operation("reduce", {"numpy": "opendnn.backends.numpy.reduce",
                         "triton": "opendnn.backends.triton.reduce"}),
    Operation("pooling", {"numpy": "opendnn.backends.numpy.pooling",
                          "triton": "opendnn.backends.triton.pooling"}),
    Operation("lrn", {"numpy": "opendnn.backends.numpy.lrn",
                      "triton": "opendnn.backends.triton.lrn"}),
    Operation("batch_norm", {"numpy": "opendnn.backends.numpy.batch_norm",
                             "triton": "opendnn.backends.triton.batch_norm"}),
    Operation("normalization", {"numpy": "opendnn.backends.numpy.normalization",
                                "triton": "opendnn.backends.triton.normalization"}),
    Operation("softmax", {"numpy": "opendnn.backends.numpy.softmax",
                          "triton": "opendnn.backends.triton.softmax"}),
    Operation("matmul", {"numpy": "opendnn.backends.numpy.matmul",
                         "triton": "opendnn.backends.triton.matmul"}),
    Operation("convolution", {"numpy": "opendnn.backends.numpy.convolution",
                              "triton": "opendnn.backends.triton.convolution"}),
    Operation("attention", {"numpy": "opendnn.families.attention.numpy_backend",
                            "triton": "opendnn.families.attention.triton_backend"}),
)}


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
    return _backend_module(operation, backend)


@functools.cache  # a module loads once; a missing package raises, and is not cached
def _backend_module(operation: str, backend: str) -> Any:
    require_backend_available(backend)
    return importlib.import_module(OPERATIONS[operation].backends[backend])

