"""What every Pythonic function shares: the default handle and returning the caller's kind of array."""

from __future__ import annotations

import functools
import importlib
import os
import re
from typing import Any

import numpy as np

from opendnn.core.arrays import Bound
from opendnn.core.errors import BadParam, OpenDnnError
from opendnn.core.handle import Handle, MathType
from opendnn.ops.pointwise import ACTIVATION_NAMES, PointwiseMode


def handle_for(bound: Bound, handle: Handle | None) -> Handle:
    """``handle``, or the shared default handle of the bound's device."""
    return handle if handle is not None else shared_handle(bound.device)


def shared_handle(device: str, math_type: MathType = MathType.DEFAULT) -> Handle:
    """One handle per device, math type and ``OPENDNN_BACKEND``, made once instead of per call."""
    return _shared_handle(device, math_type, os.environ.get("OPENDNN_BACKEND"))


@functools.lru_cache(maxsize=64)
def _shared_handle(device: str, math_type: MathType, backend: str | None) -> Handle:
    # Safe to share: a default handle has no stream of its own (it enqueues on the current one,
    # per thread), is never destroyed (callers never see it), and its algorithm cache is a dict
    # whose single reads and writes the GIL keeps whole; ``backend`` keys the environment's choice.
    return Handle(device, backend=backend or None, math_type=math_type)


def to_caller_kind(native: Any, like: Any) -> Any:
    """Return ``native`` as the kind of array the caller passed (NumPy, torch, or a DLPack library's)."""
    if isinstance(like, np.ndarray) or type(like) is type(native):
        return native
    library = type(like).__module__.split(".")[0]
    try:
        return importlib.import_module(library).from_dlpack(native)
    except (ImportError, AttributeError):
        return native


class CallerNames:
    """How a Pythonic function names the parameters of the cuDNN-shaped layer it builds on
    (``{"epsilon": "eps", "x_desc": "x", ...}``), so that an error raised there names the caller's
    own parameters: ``raise NAMES.renamed(error) from None`` in an ``except OpenDnnError``. A name
    is replaced where it stands whole (``x_desc`` in ``x_desc.dims[1]``, not in ``dx_desc``)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w.])(?:{alternatives})(?!\w)")

    def renamed(self, error: OpenDnnError) -> OpenDnnError:
        """``error`` (same type, status and traceback) with the names in its message replaced."""
        message = self._pattern.sub(lambda match: self.names[match.group(0)], str(error))
        return type(error)(message, error.status).with_traceback(error.__traceback__)


def shaped(native: Any, shape: tuple[int, ...]) -> Any:
    """``native`` with ``shape`` (a 0-d result comes back from a (1,) output); the array itself when
    the shape already matches, never a view of it: autograd refuses in-place updates of a view
    that a custom Function returned."""
    return native if tuple(native.shape) == shape else native.reshape(shape)


def activation_mode(activation: str | PointwiseMode | None) -> PointwiseMode | None:
    """The mode of a fused epilogue's activation, named as torch does ("relu", "silu", "gelu_tanh",
    "identity", ...: ``ACTIVATION_TABLE``'s names and aliases) or given as a PointwiseMode; None
    for none.

    Raises:
        BadParam: a name that is not an activation's.
    """
    if activation is None or isinstance(activation, PointwiseMode):
        return activation
    name = ACTIVATION_NAMES.get(str(activation).lower().removesuffix("_fwd"))
    if name is None:
        raise BadParam(f"activation={activation!r} is not a forward activation: None or one of "
                       f"{', '.join(map(repr, ACTIVATION_NAMES))}")
    return PointwiseMode.IDENTITY if name == "identity" else PointwiseMode(f"{name}_fwd")
