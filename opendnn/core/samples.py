"""What every sample shares: the Sample record, its tensors, blending, the out-of-bounds check and the
error measure.

Besides its samples, each family lists ``error_samples()``: calls that must fail, each with the
error and a fragment of the message (which names the caller's parameter and the rule it broke).

A sample names an API call, a variant (the mode), a dtype, a shape, a layout and alpha/beta. Run
on a handle, it draws random inputs (never zeros), poisons the output (NaN, or random values that
beta blends in), calls the cuDNN-shaped API through descriptors, and returns the output next to
the float64 reference computed from the very same (rounded) inputs. Layouts: ``packed``;
``permuted`` (a transposed dimension order, e.g. NHWC seen as NCHW); ``subregion`` (a view inside
a larger buffer, whose elements outside the view must come back untouched).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opendnn.core.arrays import is_torch
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.handle import Handle

# ||out - ref|| / ||ref|| allowed, per output dtype
# float64: at most 1.1e-14 measured (batch norm's training forward at the large sizes, whose saved
# mean, a sum of 12544 terms that cancels, is off by 2.5e-14; docs/design/launch.md)
# fp8 inputs: Hopper's fp8 tensor cores add products with fewer bits than fp32 (cuBLAS's _scaled_mm
# measures 4e-5 to 6e-5 at K = 390; tests/test_gpu_matmul.py holds opendnn to cuBLAS's error)
TOLERANCE = {
    DataType.DOUBLE: 1e-13,
    DataType.FLOAT: 1e-5,
    DataType.HALF: 1e-2,
    DataType.BFLOAT16: 1e-2,
    DataType.FP8_E4M3: 1e-4,
    DataType.FP8_E5M2: 1e-4,
}
LAYOUTS = ("packed", "permuted", "subregion")
SENTINEL = 1234.5  # fills a sub-region output's buffer: it must survive outside the view


@dataclass(frozen=True)
class Sample:
    op: str
    variant: str
    dtype: DataType
    shape: tuple[int, ...]
    layout: str = "packed"
    alpha: float = 1.0
    beta: float = 0.0
    out_dtype: DataType | None = None
    nan_inputs: bool = False
    runner: Callable[..., tuple[np.ndarray, np.ndarray]] | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        extras = [self.layout] + ([f"a{self.alpha:g}b{self.beta:g}"] if (self.alpha, self.beta) != (1, 0) else [])
        extras += ["nan"] if self.nan_inputs else []
        extras += [f"to_{self.out_dtype.value}"] if self.out_dtype else []
        return f"{self.op}[{self.variant}]-{self.dtype.value}-{'x'.join(map(str, self.shape))}-{'-'.join(extras)}"

    @property
    def tolerance(self) -> float:
        return max(TOLERANCE.get(self.dtype, 0.0), TOLERANCE.get(self.out_dtype or self.dtype, 0.0))

    def run(self, handle: Handle, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(output, float64 reference), both as float64 NumPy arrays."""
        if self.runner is None:
            raise ValueError(f"sample {self.name} has no runner")
        tensors = Tensors(handle.device, np.random.default_rng(seed), use_numpy=handle.backend == "numpy")
        return self.runner(self, tensors, handle)


@dataclass(frozen=True)
class ErrorSample:
    """A call that must fail: ``call(**arguments())`` raises ``error`` whose message holds
    ``fragment``; the arrays it was given come back unchanged."""

    name: str
    call: Callable[..., Any]
    arguments: Callable[[], dict[str, Any]]
    error: type[Exception]
    fragment: str


def values(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    """Random values of ``shape``, never zeros (the error samples' arrays)."""
    return np.random.default_rng(len(shape)).uniform(0.5, 2.0, shape).astype(dtype)


def relative_error(actual: Any, expected: Any) -> float:
    """||actual - expected|| / ||expected|| over finite values; inf when NaN or inf positions differ.

    Either side may be a NumPy array or a torch tensor on any device (read as float64 on the host).
    """
    actual, expected = _float64(actual), _float64(expected)
    if actual.shape != expected.shape:
        return math.inf
    finite = np.isfinite(expected)
    same_specials = np.array_equal(np.isnan(actual), np.isnan(expected)) and np.array_equal(
        actual[np.isinf(expected)], expected[np.isinf(expected)]
    )
    if not same_specials or not np.isfinite(actual[finite]).all():
        return math.inf
    scale = np.linalg.norm(expected[finite])
    return float(np.linalg.norm(actual[finite] - expected[finite]) / (scale if scale > 0 else 1.0))


def _float64(array: Any) -> np.ndarray:
    if is_torch(array):  # a tensor of any dtype (bfloat16 too) on any device
        return array.detach().to("cpu").double().numpy()
    return np.asarray(array, np.float64)


class Tensors:
    """Makes a sample's arrays and reads them back as float64: NumPy arrays for the NumPy backend
    (no torch needed, except for a dtype NumPy cannot hold: fp8, and bfloat16 without ml_dtypes),
    torch tensors on the device for the others. Every method takes either kind."""

    def __init__(self, device: str, rng: np.random.Generator, use_numpy: bool = False) -> None:
        self.device = device
        self.rng = rng
        self.use_numpy = use_numpy
        self._outputs: list[tuple[Any, np.ndarray, float]] = []  # sub-region outputs: buffer, view's mask, sentinel

    @property
    def torch(self) -> Any:
        """The torch module (a sample that needs it raises ModuleNotFoundError where it is missing)."""
        import torch

        return torch

    def input(
        self,
        shape: tuple[int, ...],
        dtype: DataType,
        layout: str,
        low: float = -3.0,
        high: float = 3.0,
        nan: bool = False,
    ) -> Any:
        view = self._allocate(shape, dtype, layout)
        values = self.rng.uniform(low, high, shape)
        if nan:
            values.reshape(-1)[:: max(1, values.size // 5)] = np.nan
        self.fill(view, values)
        return view

    def output(self, shape: tuple[int, ...], dtype: DataType, layout: str, initial: np.ndarray | None) -> Any:
        """An output poisoned with NaN (or holding ``initial``, for beta != 0)."""
        view = self._allocate(shape, dtype, layout, output=True)
        if initial is None:
            self.fill(view, np.full(shape, np.nan if dtype.is_floating else 77.0))
        else:
            self.fill(view, initial)
        return view

    def fill(self, array: Any, values: np.ndarray) -> None:
        """Write ``values`` (broadcast to the array's shape) into ``array``, rounded to its dtype."""
        if isinstance(array, np.ndarray):
            array[...] = np.asarray(values).astype(array.dtype)
        else:
            array.copy_(self.torch.from_numpy(np.array(values, order="C")).to(array.dtype))  # 0-d stays 0-d

    def array(self, values: np.ndarray, dtype: DataType) -> Any:
        """A new packed array of ``dtype`` holding ``values``, of the kind this sample uses."""
        array = self._new((), values.shape, dtype)
        self.fill(array, values)
        return array

    def empty_strided(self, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DataType) -> Any:
        """An uninitialised array of ``shape`` with ``strides`` (in elements) in a buffer just large enough."""
        return self._new(strides, shape, dtype)

    def workspace(self, size: int) -> Any:
        """A byte buffer of ``size`` bytes, or None for 0."""
        return self.array(np.zeros(size, np.uint8), DataType.UINT8) if size else None

    def values(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array.astype(np.float64)
        return array.detach().to("cpu", self.torch.float64).numpy()

    def untouched_outside_views(self) -> bool:
        """True when every buffer element outside each sub-region output still holds SENTINEL."""
        return all((self.values(buffer)[~mask] == sentinel).all() for buffer, mask, sentinel in self._outputs)

    def _kind_is_numpy(self, dtype: DataType) -> bool:
        return self.use_numpy and dtype.to_numpy() != np.uint16 and not dtype.is_fp8

    def _new(self, strides: tuple[int, ...], shape: tuple[int, ...], dtype: DataType) -> Any:
        """A new array of ``shape``: packed when ``strides`` is (), else with those strides."""
        if self._kind_is_numpy(dtype):
            if not strides:
                return np.empty(shape, dtype.to_numpy())
            extent = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
            buffer = np.empty(extent, dtype.to_numpy())
            itemsize = buffer.itemsize
            return np.lib.stride_tricks.as_strided(buffer, shape, tuple(s * itemsize for s in strides))
        torch = self.torch
        if not strides:
            return torch.empty(shape, dtype=dtype.to_torch(), device=self.device)
        return torch.empty_strided(shape, strides, dtype=dtype.to_torch(), device=self.device)

    def _allocate(self, shape: tuple[int, ...], dtype: DataType, layout: str, output: bool = False) -> Any:
        if layout == "packed":
            return self._new((), shape, dtype)
        if layout == "permuted":  # memory order: dim 0, then the last dims reversed (NHWC-like for 4-D)
            order = (0, *reversed(range(1, len(shape)))) if len(shape) > 2 else tuple(reversed(range(len(shape))))
            stored = self._new((), tuple(shape[k] for k in order), dtype)
            inverse = tuple(int(k) for k in np.argsort(order))
            return stored.transpose(inverse) if isinstance(stored, np.ndarray) else stored.permute(*inverse)
        assert layout == "subregion", layout
        buffer = self._new((), tuple(d + 3 for d in shape), dtype)
        self.fill(buffer, np.full(buffer.shape, SENTINEL))
        index = tuple(slice(1, 1 + d) for d in shape)
        if output:
            mask = np.zeros(buffer.shape, dtype=bool)
            mask[index] = True
            self._outputs.append((buffer, mask, self.values(buffer).flat[0]))  # SENTINEL in the dtype
        return buffer[index]


def descriptor(array: Any) -> TensorDescriptor:
    """The descriptor of a sample's array (a NumPy array or a torch tensor): its dtype, shape and strides."""
    if isinstance(array, np.ndarray):
        return TensorDescriptor(array.dtype, array.shape, tuple(s // array.itemsize for s in array.strides))
    return TensorDescriptor(array.dtype, array.shape, array.stride())


def blend(sample: Sample, t: Tensors, shape: tuple[int, ...], result: np.ndarray) -> tuple[Any, np.ndarray]:
    """The output tensor and the expected alpha * result + beta * y0."""
    out_dtype = sample.out_dtype or sample.dtype
    initial = t.rng.uniform(-2, 2, shape) if sample.beta != 0 else None
    y = t.output(shape, out_dtype, sample.layout, initial)
    expected = sample.alpha * result
    if initial is not None:
        expected = expected + sample.beta * t.values(y)
    return y, expected


def checked(t: Tensors, y: Any, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    actual = t.values(y)
    if not t.untouched_outside_views():
        actual = np.full_like(actual, np.nan)  # an out-of-bounds write fails the sample
    return actual, expected


def concatenated(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Outputs that come in several tensors, checked together: the (actual, expected) pairs concatenated."""
    return (np.concatenate([a.ravel() for a, _ in parts]), np.concatenate([e.ravel() for _, e in parts]))


FLOAT_TYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE)
