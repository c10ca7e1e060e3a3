"""The handle: one device, one stream, and the policies every call made through it follows."""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterator
from typing import Any

from opendnn.core.arrays import CPU
from opendnn.core.descriptors import check_member
from opendnn.core.errors import BadParam, NotSupported, Status, require

BACKENDS = ("numpy", "triton")
OPTIONS = frozenset({"backend", "math_type", "deterministic", "fast_math", "workspace_limit"})  # Handle's policies


class MathType(enum.Enum):
    """Which arithmetic matrix products may use: DEFAULT (strict fp32), TENSOR_OP (TF32 allowed), FMA."""

    DEFAULT = "default"
    TENSOR_OP = "tensor_op"
    FMA = "fma"


class Handle:
    """Binds opendnn to one device and one stream (cuDNN's cudnnHandle_t).

    Work is enqueued on the handle's stream, or on the framework's current stream when none was
    set. Handles share nothing: each thread, device or stream gets its own.

    Args:
        device: "cpu" or "cuda:N".
        backend: "numpy", "triton" or None for the environment's ``OPENDNN_BACKEND``, else by
            device (CUDA -> triton, CPU -> numpy). "triton" on the CPU runs Triton's interpreter.
        math_type: MathType.
        deterministic: only algorithms giving bitwise repeatable results. The algorithm queries
            (``get_`` / ``find_convolution_*_algorithm``) read it: an algorithm a backend declares
            not deterministic gets status NOT_SUPPORTED and that reason. Every kernel opendnn runs
            is deterministic whatever this says: no atomics, partial results (split reductions,
            the attention backward's dQ, ...) summed in a fixed order, so repeated calls on the
            same inputs give bitwise equal results on both backends.
        fast_math: 16-bit outputs computed in float32 on a GPU may take the hardware's approximate
            instructions (``tanh.approx``, ``ex2.approx``, ...) in the activations of the pointwise
            kernels and of the matrix-product epilogue, within half an ulp of the 16-bit result;
            False keeps the accurate forms. Float32 and float64 outputs and the interpreter always
            take the accurate forms.
        workspace_limit: most bytes of workspace an algorithm chosen for this handle may use.

    An option set anew after construction drops what the handle keeps (algorithm choices, plans,
    ``opendnn.torch``'s executables): each was made under the old value.
    """

    def __init__(
        self,
        device: str = CPU,
        *,
        backend: str | None = None,
        math_type: MathType = MathType.DEFAULT,
        deterministic: bool = True,
        fast_math: bool = True,
        workspace_limit: int | None = None,
    ) -> None:
        self.device = _canonical_device(device)
        self._device_index = int(self.device.partition(":")[2] or 0) if self.device != CPU else -1
        backend = backend or os.environ.get("OPENDNN_BACKEND") or None
        require(backend is None or backend in BACKENDS, f"backend={backend!r} must be one of {BACKENDS}")
        self.backend = backend or ("numpy" if self.device == CPU else "triton")
        require(
            self.backend == "triton" or self.device == CPU,
            f"backend={self.backend!r} runs on the CPU only, not on device={self.device!r}",
        )
        self.math_type = check_member("math_type", MathType, math_type)
        self.deterministic = bool(deterministic)
        self.fast_math = bool(fast_math)
        require(
            workspace_limit is None or workspace_limit >= 0, f"workspace_limit={workspace_limit} must be at least 0"
        )
        self.workspace_limit = workspace_limit
        self.algorithm_cache: dict[Any, Any] = {}
        self.plans: dict[Any, Any] = {}  # call signature -> Plan (opendnn.core.plans)
        self.executables: dict[Any, Any] = {}  # torch call signature -> its executable (opendnn.torch)
        self._stream: Any = None
        self._destroyed = False

    def __setattr__(self, name: str, value: Any) -> None:
        # what the handle keeps (algorithm choices, plans, executables) was made under its options:
        # a changed option drops it
        if name in OPTIONS and name in self.__dict__ and self.__dict__[name] != value:
            self.drop_kept()
        object.__setattr__(self, name, value)

    def drop_kept(self) -> None:
        """Forget the algorithm choices, plans and executables made under the handle's options."""
        self.algorithm_cache.clear()
        self.plans.clear()
        self.executables.clear()

    def set_stream(self, stream: Any) -> None:
        """Enqueue future work on ``stream``: a torch.cuda.Stream, a raw cudaStream_t (int), or None
        for the framework's current stream."""
        self._check_alive()
        if stream is None:
            self._stream = None
            return
        require(self.device != CPU, f"stream={stream!r} needs a CUDA handle, this one is on {self.device}")
        import torch

        if isinstance(stream, int):
            stream = torch.cuda.ExternalStream(stream, device=self.device)
        require(
            isinstance(stream, torch.cuda.Stream),
            f"stream={stream!r} must be a torch.cuda.Stream, an int cudaStream_t or None",
        )
        require(
            _canonical_device(str(stream.device)) == self.device,
            f"stream.device={stream.device} must equal handle.device={self.device}",
            Status.BAD_PARAM_STREAM_MISMATCH,
        )
        self._stream = stream

    def get_stream(self) -> Any:
        """The stream set with set_stream, or None (the framework's current stream)."""
        return self._stream

    def destroy(self) -> None:
        """Release the handle; using it afterwards raises BadParam."""
        self.drop_kept()
        self._stream = None
        self._destroyed = True

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def launching(self) -> contextlib.AbstractContextManager[None]:
        """A context making the handle's device and stream current while kernels are enqueued
        (one that does nothing when they already are: this runs for every call)."""
        self._check_alive()
        if self.device == CPU:
            return _ALREADY_CURRENT
        import torch

        if self._stream is None and torch.cuda.current_device() == self._device_index:
            return _ALREADY_CURRENT  # entering the two contexts would cost more than the launch
        return _made_current(self._device_index, self._stream)

    def check_device(self, name: str, device: str) -> None:
        """Refuse an array that lives on another device than the handle's."""
        self._check_alive()
        if device != self.device:  # the message is formatted only on failure: this runs for every tensor
            raise BadParam(f"{name} is on {device} but the handle is bound to {self.device}")

    def _check_alive(self) -> None:
        if self._destroyed:
            raise BadParam("handle was destroyed and cannot be used")

    def __repr__(self) -> str:
        return (
            f"Handle(device={self.device!r}, backend={self.backend!r}, math_type={self.math_type.name}, "
            f"deterministic={self.deterministic}, fast_math={self.fast_math}, workspace_limit={self.workspace_limit})"
        )


_ALREADY_CURRENT = contextlib.nullcontext()  # reusable: it holds nothing


@contextlib.contextmanager
def _made_current(device_index: int, stream: Any) -> Iterator[None]:
    import torch

    with torch.cuda.device(device_index), torch.cuda.stream(stream):
        yield


def create(device: Any = None, **options: Any) -> Handle:
    """A new handle on ``device`` ("cpu", "cuda", "cuda:N", a torch.device or an int CUDA index);
    None picks the current CUDA device when torch sees one, else the CPU. Keyword options are
    Handle's."""
    if device is None:
        device = _default_device()
    return Handle(device, **options)


def _default_device() -> str:
    try:
        import torch
    except ImportError:
        return CPU
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else CPU


def _canonical_device(device: Any) -> str:
    if isinstance(device, int):
        device = f"cuda:{device}"
    text = str(device)
    if text == "cuda":
        import torch

        return f"cuda:{torch.cuda.current_device()}"
    if text == CPU or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise BadParam(f"device={device!r} must be 'cpu', 'cuda', 'cuda:N' or an int")


def require_backend_available(backend: str) -> None:
    """Raise NotSupported when a backend's packages are missing."""
    if backend == "triton":
        try:
            import torch  # noqa: F401
            import triton  # noqa: F401
        except ImportError as error:
            raise NotSupported(
                f"backend='triton' needs torch and triton: {error}", Status.NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING
            ) from None
