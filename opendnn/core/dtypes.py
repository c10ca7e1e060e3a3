"""Element types and their mappings to NumPy, torch and Triton."""

from __future__ import annotations

import enum
import functools
from typing import Any

import numpy as np


class DataType(enum.Enum):
    """cuDNN's data types (the subset opendnn supports).

    Each member's value is its name; ``itemsize`` is the size of one element in bytes.
    """

    FLOAT = "float32"
    DOUBLE = "float64"
    HALF = "float16"
    BFLOAT16 = "bfloat16"
    FP8_E4M3 = "float8_e4m3fn"  # matmul inputs only; NumPy stores the bits as uint8
    FP8_E5M2 = "float8_e5m2"
    INT8 = "int8"
    UINT8 = "uint8"
    INT32 = "int32"
    INT64 = "int64"
    BOOLEAN = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_floating(self) -> bool:
        return self in (DataType.FLOAT, DataType.DOUBLE, DataType.HALF, DataType.BFLOAT16)

    @property
    def compute_type(self) -> DataType:
        """The type arithmetic runs in: DOUBLE for DOUBLE, FLOAT for everything else."""
        return DataType.DOUBLE if self is DataType.DOUBLE else DataType.FLOAT

    @property
    def is_fp8(self) -> bool:
        return self in (DataType.FP8_E4M3, DataType.FP8_E5M2)

    def to_numpy(self) -> np.dtype:
        """The NumPy dtype. BFLOAT16 maps to ``ml_dtypes.bfloat16`` when ml_dtypes is installed, else
        to uint16 (its bit pattern, see ``core.arrays``); the fp8 types to uint8 (their bits)."""
        return _numpy_dtype(self._value_)  # by the value: an Enum member hashes through Python, 0.1 us

    def to_torch(self) -> Any:
        import torch

        return getattr(torch, self.value)

    def to_triton(self) -> Any:
        import triton.language as tl

        return {
            "float32": tl.float32,
            "float64": tl.float64,
            "float16": tl.float16,
            "bfloat16": tl.bfloat16,
            "float8_e4m3fn": tl.float8e4nv,
            "float8_e5m2": tl.float8e5,
            "int8": tl.int8,
            "uint8": tl.uint8,
            "int32": tl.int32,
            "int64": tl.int64,
            "bool": tl.int1,
        }[self.value]

    @classmethod
    def of(cls, dtype: Any) -> DataType:
        """The DataType of a NumPy dtype, a torch dtype, a DataType or its name ("float32")."""
        if isinstance(dtype, DataType):
            return dtype
        try:
            return _data_type_of(dtype)  # memoized: this runs for every tensor of every call
        except TypeError:  # unhashable
            return cls._parse(dtype)

    @classmethod
    def _parse(cls, dtype: Any) -> DataType:
        name = str(dtype).removeprefix("torch.")
        if name == "bfloat16":  # torch's, or NumPy's from ml_dtypes
            return cls.BFLOAT16
        if name in ("float8_e4m3fn", "float8_e5m2"):
            return cls(name)
        for candidate in (dtype, name):
            try:
                return cls(np.dtype(candidate).name)
            except (TypeError, ValueError):
                pass
        from opendnn.core.errors import BadParam

        raise BadParam(f"dtype={dtype!r} is not one of {[m.value for m in cls]}")


_ITEMSIZE = {
    DataType.FLOAT: 4,
    DataType.DOUBLE: 8,
    DataType.HALF: 2,
    DataType.BFLOAT16: 2,
    DataType.FP8_E4M3: 1,
    DataType.FP8_E5M2: 1,
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.INT32: 4,
    DataType.INT64: 8,
    DataType.BOOLEAN: 1,
}


@functools.lru_cache(maxsize=64)  # a table of the few dtype spellings, read for every array of every call
def _data_type_of(dtype: Any) -> DataType:
    return DataType._parse(dtype)


@functools.cache  # asked for every output and reference: the ml_dtypes look-up happens once
def _numpy_dtype(name: str) -> np.dtype:
    data_type = DataType(name)
    if data_type.is_fp8:
        return np.dtype("uint8")
    if data_type is DataType.BFLOAT16:
        return numpy_bfloat16() or np.dtype("uint16")
    return np.dtype(name)


def numpy_bfloat16() -> np.dtype | None:
    """ml_dtypes' bfloat16 NumPy dtype, or None when ml_dtypes is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)
