"""How many BLAS threads a NumPy backend's matrix product runs on: one below
``SINGLE_THREAD_MULTIPLY_ADDS``, every thread above (threadpoolctl, where installed)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

# Below this many multiply-adds a product runs on one BLAS thread: waking, and then spinning, a
# second thread for a small product costs more than it saves, and far more on a loaded machine
# or beside another library's spinning threads (torch's OpenMP pool).
SINGLE_THREAD_MULTIPLY_ADDS = 1 << 25


@functools.cache  # threadpoolctl scans the loaded libraries once; None where it is not installed
def _controller() -> Any:
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def blas_limit(multiply_adds: int) -> contextlib.AbstractContextManager[Any]:
    """A context that runs a product of ``multiply_adds`` on one BLAS thread where it is small."""
    controller = _controller() if multiply_adds < SINGLE_THREAD_MULTIPLY_ADDS else None
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1, user_api="blas")
