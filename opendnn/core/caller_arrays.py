"""Returning a Pythonic call's result as the kind of array the caller passed, in the shape asked."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from opendnn.core.arrays import is_torch
from opendnn.core.errors import NotSupported


def to_caller_kind(native: Any, like: Any) -> Any:
    """Return ``native`` (a NumPy array or torch tensor) as the kind of array the caller passed.

    NumPy and torch arrays come back as they are. Another library's array (``like``) names its
    library through array-api-compat's ``array_namespace`` when array-api-compat is installed (so
    a jax.numpy array in gives a jax.numpy array out), whose ``from_dlpack`` takes the result
    without a copy; without array-api-compat, the library is guessed from the array type's module.

    Raises:
        NotSupported: array-api-compat knows no namespace of ``like``, or the namespace cannot
            take the result through ``from_dlpack``.
    """
    if isinstance(like, np.ndarray) or type(like) is type(native):
        return native
    if is_torch(like):
        return _by_module(native, like)
    try:
        import array_api_compat
    except ImportError:
        return _by_module(native, like)
    kind = f"{type(like).__module__}.{type(like).__qualname__}"
    try:
        namespace = array_api_compat.array_namespace(like)
    except TypeError as error:
        raise NotSupported(
            f"an input of type {kind} asks for the result as its library's array, and array-api-compat "
            f"knows no namespace of it ({error}); pass NumPy arrays, torch tensors or arrays of an "
            "array-API library"
        ) from error
    try:
        return namespace.from_dlpack(native)
    except (AttributeError, TypeError, BufferError, RuntimeError) as error:
        raise NotSupported(
            f"an input of type {kind} asks for the result as an array of {namespace.__name__}, which "
            f"cannot take it through from_dlpack ({type(error).__name__}: {error}); pass NumPy arrays "
            "or torch tensors"
        ) from error


def _by_module(native: Any, like: Any) -> Any:
    """``native`` through the ``from_dlpack`` of the top-level module of ``like``'s type, or as it is."""
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
