"""Tensor descriptors: plain frozen values of dtype, dims and strides (in elements)."""

from __future__ import annotations

import enum
import functools
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status, require

MAX_DIMS = 8
MAX_BYTES = 2**63 - 1  # a buffer's size in bytes is a signed 64-bit integer (torch's, CUDA's)


class TensorFormat(enum.Enum):
    """Memory order of an N, C, spatial... tensor: channels first (NCHW, NCDHW) or last (NHWC, NDHWC)."""

    NCHW = "NCHW"
    NHWC = "NHWC"


class NanPropagation(enum.Enum):
    """Whether NaN inputs give NaN (PROPAGATE_NAN) or are ignored: relu and clipped relu give 0,
    min/max reductions skip them."""

    NOT_PROPAGATE_NAN = 0
    PROPAGATE_NAN = 1


@dataclass(frozen=True)
class TensorDescriptor:
    """A strided view of ``dims`` elements of type ``dtype``.

    Element ``(i0, i1, ...)`` lives ``sum(i_k * strides[k])`` elements after the start of the
    buffer it is used with. Strides default to packed row-major order.

    Args:
        dtype: element type (a DataType, or a NumPy/torch dtype or its name).
        dims: 1 to 8 sizes, each at least 1.
        strides: one stride per dim, each at least 0, in elements; None for packed.

    Raises:
        BadParam: naming the dim or stride that breaks a rule.
    """

    dtype: DataType
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    # set once, in __init__: the elements of buffer the view reaches (its largest offset plus one), the hash
    extent: int = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)

    def __init__(self, dtype: Any, dims: Any, strides: Any = None) -> None:
        dims = check_ints("dims", dims)
        require(1 <= len(dims) <= MAX_DIMS, f"len(dims)={len(dims)} must be between 1 and {MAX_DIMS}")
        for k, d in enumerate(dims):
            require(d >= 1, f"dims[{k}]={d} must be at least 1")
        strides = packed_strides(dims) if strides is None else check_ints("strides", strides)
        require(len(strides) == len(dims), f"len(strides)={len(strides)} must equal len(dims)={len(dims)}")
        for k, s in enumerate(strides):
            require(s >= 0, f"strides[{k}]={s} must be at least 0")
        dtype = check_dtype("dtype", dtype)
        extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
        if extent * dtype.itemsize > MAX_BYTES:
            raise BadParam(
                f"dims={list(dims)} with strides={list(strides)} reach {extent} elements of {dtype.name}: "
                f"more than the {MAX_BYTES} bytes a buffer can hold"
            )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "extent", extent)
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "strides", strides)
        object.__setattr__(self, "_hash", hash((self.dtype, dims, strides)))

    def __hash__(self) -> int:  # computed once: descriptors key the caches of every call
        return self._hash

    @classmethod
    def from_format(cls, format: TensorFormat, dtype: Any, n: int, c: int, *spatial: int) -> TensorDescriptor:
        """A packed N, C, spatial... tensor (dims in that order) stored channels first or last."""
        dims = (n, c, *spatial)
        if check_member("format", TensorFormat, format) is TensorFormat.NCHW:
            return cls(dtype, dims)
        order = (0, *range(2, len(dims)), 1)  # memory order, outermost first
        return cls(dtype, dims, strides_for_order(dims, order))

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def numel(self) -> int:
        return math.prod(self.dims)

    @functools.cached_property  # a frozen value: computed once per descriptor (asked for every output of every call)
    def size_in_bytes(self) -> int:
        """Bytes of buffer the view reaches (cuDNN's GetTensorSizeInBytes)."""
        return self.extent * self.dtype.itemsize

    @property
    def is_packed(self) -> bool:
        return self.strides == packed_strides(self.dims)

    @functools.cached_property  # a frozen value: computed once per descriptor
    def is_non_overlapping(self) -> bool:
        """True when no two elements share an address, so the view may be written."""
        span = 1
        for s, d in sorted((s, d) for d, s in zip(self.dims, self.strides) if d > 1):
            if s < span:
                return False
            span = s * d
        return True

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.dims)}:{list(self.strides)}"


def packed_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides of a packed tensor."""
    return strides_for_order(dims, tuple(range(len(dims))))


def strides_for_order(dims: tuple[int, ...], order: tuple[int, ...]) -> tuple[int, ...]:
    """Packed strides with dims laid out in ``order`` (outermost first)."""
    strides = [0] * len(dims)
    step = 1
    for k in reversed(order):
        strides[k] = step
        step *= dims[k]
    return tuple(strides)


def check_same_dims(name_a: str, a: TensorDescriptor, name_b: str, b: TensorDescriptor) -> None:
    """Raise BadParam naming the first dim where ``a`` and ``b`` differ."""
    require(
        a.ndim == b.ndim, f"{name_a}.ndim={a.ndim} must equal {name_b}.ndim={b.ndim}", Status.BAD_PARAM_SHAPE_MISMATCH
    )
    for k, (da, db) in enumerate(zip(a.dims, b.dims)):
        require(
            da == db, f"{name_a}.dims[{k}]={da} must equal {name_b}.dims[{k}]={db}", Status.BAD_PARAM_SHAPE_MISMATCH
        )


def check_broadcastable(name_a: str, a: TensorDescriptor, name_c: str, c: TensorDescriptor) -> None:
    """Raise BadParam unless each dim of ``a`` equals ``c``'s or is 1 (cuDNN's broadcast rule)."""
    require(
        a.ndim == c.ndim, f"{name_a}.ndim={a.ndim} must equal {name_c}.ndim={c.ndim}", Status.BAD_PARAM_SHAPE_MISMATCH
    )
    for k, (da, dc) in enumerate(zip(a.dims, c.dims)):
        require(
            da in (1, dc),
            f"{name_a}.dims[{k}]={da} must equal {name_c}.dims[{k}]={dc} or 1",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )


def check_float_tensor(name: str, desc: Any) -> None:
    """``desc`` is a TensorDescriptor of a floating-point dtype (the messages are formatted only on
    failure: a passing call formats nothing).

    Raises:
        BadParam: naming ``name``: not a TensorDescriptor.
        NotSupported: naming ``name``: an integer, boolean or fp8 dtype.
    """
    if not isinstance(desc, TensorDescriptor):
        raise BadParam(f"{name}={desc!r} must be a TensorDescriptor")
    if not desc.dtype.is_floating:
        raise NotSupported(
            f"{name}.dtype={desc.dtype.name} must be FLOAT, DOUBLE, HALF or BFLOAT16", Status.NOT_SUPPORTED_DATA_TYPE
        )


def check_finite(name: str, value: Any) -> float:
    """``value`` as a float: a finite real number (a Python or NumPy int, float or bool, as torch
    takes scalars).

    Raises:
        BadParam: naming ``name``: not a real number, or not finite.
    """
    kind = value.__class__
    if not (kind is float or kind is int or isinstance(value, numbers.Real)):
        raise BadParam(f"{name}={value!r} must be a real number")
    number = float(value)
    if not math.isfinite(number):
        raise BadParam(f"{name}={value} must be finite")
    return number


def check_int(name: str, value: Any) -> int:
    """``value`` as an int: a Python or NumPy integer, or a bool (torch takes True for 1).

    Raises:
        BadParam: naming ``name``: not an integer (a float, even a whole one, as torch).
    """
    if value.__class__ is int or isinstance(value, numbers.Integral):
        return int(value)
    raise BadParam(f"{name}={value!r} must be an int")


def check_ints(name: str, value: Any, count: int | None = None) -> tuple[int, ...]:
    """``value`` as a tuple of ints: one int (repeated ``count`` times, once when count is None)
    or a sequence of ints (of ``count`` of them when given).

    Raises:
        BadParam: naming ``name`` (and the position of a bad element): not an int or a sequence
            of ints, or a sequence of another length.
    """
    if value.__class__ is int or isinstance(value, numbers.Integral):
        return (int(value),) * (count or 1)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise BadParam(f"{name}={value!r} must be an int or a sequence of ints")
    values = tuple(check_int(f"{name}[{k}]", v) for k, v in enumerate(value))
    if count is not None and len(values) != count:
        raise BadParam(f"{name}={value!r} must be an int or {count} ints")
    return values


Member = TypeVar("Member", bound=enum.Enum)


def check_member(name: str, kind: type[Member], value: Any) -> Member:
    """``value`` as a member of the enum ``kind``: a member, or a member's value.

    Raises:
        BadParam: naming ``name`` and listing the members.
    """
    if value.__class__ is kind:
        return value  # type: ignore[no-any-return]
    try:
        return kind(value)
    except (ValueError, TypeError):
        members = ", ".join(f"{kind.__name__}.{member.name}" for member in kind)
        article = "an" if kind.__name__[0] in "AEIOU" else "a"
        raise BadParam(f"{name}={value!r} must be {article} {kind.__name__}: one of {members}") from None


def check_dtype(name: str, value: Any) -> DataType:
    """``value`` as a DataType: a DataType, a NumPy or torch dtype, or a dtype's name.

    Raises:
        BadParam: naming ``name`` and listing the data types.
    """
    try:
        return DataType.of(value)
    except BadParam:
        raise BadParam(f"{name}={value!r} must be a data type: one of {[t.value for t in DataType]}") from None
