"""Returning a Pythonic call's result as the kind of array the caller passed, in the shape asked."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np


def to_caller_kind(native: Any, like: Any) -> Any:
    """Return ``native`` as the kind of array the caller passed (NumPy, torch, or a DLPack library's)."""
    if isinstance(like, np.ndarray) or type(like) is type(native):
        return native
    library = type(like).__module__.split(".")[0]
    try:
        return importlib.import_module(library).from_dlpack(native)
    except (ImportError, AttributeError):
        return native


def shaped(native: Any, shape: tuple[int, ...]) -> Any:
    """``native`` with ``shape`` (a 0-d result comes back from a (1,) output); the array itself when
    the shape already matches, never a view of it: autograd refuses in-place updates of a view
    that a custom Function returned."""
    return native if tuple(native.shape) == shape else native.reshape(shape)
