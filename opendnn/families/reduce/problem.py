"""Tensor reduction (cuDNN's reduce_tensor): one operation, its shape and dtype rules, and its
NumPy reference.

``C = alpha * reduce(A) + beta * C``: C has A's number of dims, each dim of C equals A's or is 1,
and the dims where C is 1 and A is not are reduced. With beta == 0 the prior content of C is never
read. Per output element, over the reduced set ``S`` of A's elements:

    ADD: sum(a)              MUL: prod(a)           AVG: sum(a) / |S|
    MIN: min(a)              MAX: max(a)            AMAX: max(|a|)
    NORM1: sum(|a|)          NORM2: sqrt(sum(a^2))  MUL_NO_ZEROS: prod(a for a != 0), 1 if none

MIN, MAX and AMAX may also give indices: the flattened position of the first extreme element in
``S``, row-major over the reduced dims only (their sizes in A's dim order), one per element of C.
The NaN option applies to them: PROPAGATE_NAN makes any NaN in ``S`` the result (its index that of
the first NaN); NOT_PROPAGATE_NAN skips NaNs (all-NaN gives NaN, index 0). The arithmetic
reductions follow IEEE arithmetic, so a NaN in ``S`` always gives NaN.

Arithmetic runs in float32, or float64 when A or C is float64 or compute_type is DOUBLE.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import (
    NanPropagation,
    TensorDescriptor,
    check_dtype,
    check_finite,
    check_float_tensor,
    check_member,
)
from opendnn.core.dtypes import DataType
from opendnn.core.errors import Status, require


class ReduceTensorOp(enum.Enum):
    """cuDNN's reduction operators; the value is the name the kernels switch on."""

    ADD = "add"
    MUL = "mul"
    MIN = "min"
    MAX = "max"
    AMAX = "amax"
    AVG = "avg"
    NORM1 = "norm1"
    NORM2 = "norm2"
    MUL_NO_ZEROS = "mul_no_zeros"

    @property
    def has_indices(self) -> bool:
        """True for the operators that pick one element (MIN, MAX, AMAX) and so may give its index."""
        return self in INDEXED_OPS


INDEXED_OPS = (ReduceTensorOp.MIN, ReduceTensorOp.MAX, ReduceTensorOp.AMAX)
INDEX_TYPES = (DataType.INT32, DataType.INT64)


class ReduceTensorIndices(enum.Enum):
    """Whether MIN, MAX and AMAX also write the flattened index of the element they picked."""

    NO_INDICES = 0
    FLATTENED_INDICES = 1


@dataclass(frozen=True)
class ReduceTensorDescriptor:
    """A reduction: operator, compute type, NaN option and indices request.

    Args:
        op: ReduceTensorOp.
        compute_type: FLOAT or DOUBLE (DOUBLE is used anyway when A or C is float64).
        nan_opt: NanPropagation for MIN, MAX and AMAX.
        indices: ReduceTensorIndices; FLATTENED_INDICES only with MIN, MAX or AMAX.
        indices_type: INT32 or INT64, the element type of the indices array.

    Raises:
        BadParam: a compute or indices type outside those listed.
    """

    op: ReduceTensorOp
    compute_type: DataType = DataType.FLOAT
    nan_opt: NanPropagation = NanPropagation.NOT_PROPAGATE_NAN
    indices: ReduceTensorIndices = ReduceTensorIndices.NO_INDICES
    indices_type: DataType = DataType.INT32

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", check_member("op", ReduceTensorOp, self.op))
        object.__setattr__(self, "nan_opt", check_member("nan_opt", NanPropagation, self.nan_opt))
        object.__setattr__(self, "indices", check_member("indices", ReduceTensorIndices, self.indices))
        compute = check_dtype("compute_type", self.compute_type)
        require(compute in (DataType.FLOAT, DataType.DOUBLE), f"compute_type={compute.name} must be FLOAT or DOUBLE")
        object.__setattr__(self, "compute_type", compute)
        index_type = check_dtype("indices_type", self.indices_type)
        require(index_type in INDEX_TYPES, f"indices_type={index_type.name} must be INT32 or INT64")
        object.__setattr__(self, "indices_type", index_type)


@dataclass(frozen=True)
class ReduceProblem:
    """A validated reduction: descriptors and parameters, no memory.

    ``reduced_axes`` are the dims of A summarised into one element of C; ``indices`` is the
    descriptor of the indices output (C's dims, INT32 or INT64) or None when none is written.
    """

    op: ReduceTensorOp
    a: TensorDescriptor
    c: TensorDescriptor
    indices: TensorDescriptor | None
    reduced_axes: tuple[int, ...]
    alpha: float = 1.0
    beta: float = 0.0
    propagate_nan: bool = False
    compute_dtype: DataType = DataType.FLOAT

    @property
    def reduced_count(self) -> int:
        """Elements of A reduced into each element of C."""
        return math.prod(self.a.dims[k] for k in self.reduced_axes)


def reduce_problem(
    reduce_desc: ReduceTensorDescriptor,
    a_desc: TensorDescriptor,
    c_desc: TensorDescriptor,
    *,
    indices_desc: TensorDescriptor | None = None,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> ReduceProblem:
    """The shape and dtype rules of a reduction.

    Args:
        indices_desc: the indices output when reduce_desc asks for indices; None for packed
            row-major with C's dims and reduce_desc.indices_type.

    Raises:
        BadParam: C's dims not A's or 1, non-float A or C, indices asked of an operator that has
            none, an indices descriptor not of C's dims or not INT32/INT64, non-finite alpha or beta.
    """
    require(
        isinstance(reduce_desc, ReduceTensorDescriptor), f"reduce_desc={reduce_desc!r} must be a ReduceTensorDescriptor"
    )
    for name, desc in (("a_desc", a_desc), ("c_desc", c_desc)):
        check_float_tensor(name, desc)
    require(
        c_desc.ndim == a_desc.ndim,
        f"c_desc.ndim={c_desc.ndim} must equal a_desc.ndim={a_desc.ndim}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for k, (da, dc) in enumerate(zip(a_desc.dims, c_desc.dims)):
        require(
            dc in (da, 1),
            f"c_desc.dims[{k}]={dc} must equal a_desc.dims[{k}]={da} or 1",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    op = reduce_desc.op
    indices = None
    if reduce_desc.indices is ReduceTensorIndices.FLATTENED_INDICES:
        require(op.has_indices, f"reduce_desc.indices=FLATTENED_INDICES needs op MIN, MAX or AMAX, not op={op.name}")
        indices = indices_desc or TensorDescriptor(reduce_desc.indices_type, c_desc.dims)
        require(
            indices.dims == c_desc.dims,
            f"indices_desc.dims={list(indices.dims)} must equal c_desc.dims={list(c_desc.dims)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            indices.dtype in INDEX_TYPES,
            f"indices_desc.dtype={indices.dtype.name} must be INT32 or INT64",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    reduced = tuple(k for k, (da, dc) in enumerate(zip(a_desc.dims, c_desc.dims)) if dc == 1 and da > 1)
    double = DataType.DOUBLE in (a_desc.dtype, c_desc.dtype, reduce_desc.compute_type)
    return ReduceProblem(
        op,
        a_desc,
        c_desc,
        indices,
        reduced,
        float(alpha),
        float(beta),
        reduce_desc.nan_opt is NanPropagation.PROPAGATE_NAN,
        DataType.DOUBLE if double else DataType.FLOAT,
    )


def reference(
    op: ReduceTensorOp, a: np.ndarray, reduced_axes: Sequence[int], propagate_nan: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """The NumPy definition of every operator, computed in ``a``'s float dtype.

    Returns:
        (values, indices): values with ``a``'s dims, the reduced ones set to 1; indices (int64,
        same dims) for MIN, MAX and AMAX, else None.
    """
    op = ReduceTensorOp(op)
    reduced = sorted(set(reduced_axes))
    kept = [k for k in range(a.ndim) if k not in reduced]
    out_dims = tuple(1 if k in reduced else d for k, d in enumerate(a.shape))
    rows = np.transpose(a, kept + reduced).reshape(*(a.shape[k] for k in kept), -1)  # reduced set last
    if op.has_indices:
        keys = np.abs(rows) if op is ReduceTensorOp.AMAX else rows
        values = _extreme(keys, op is ReduceTensorOp.MIN, propagate_nan)
        matches = (keys == values[..., None]) | (np.isnan(keys) & np.isnan(values)[..., None])
        indices = np.argmax(matches, axis=-1).astype(np.int64)  # the first match
        return values.reshape(out_dims), indices.reshape(out_dims)
    return _ARITHMETIC[op](rows).reshape(out_dims), None


def _extreme(keys: np.ndarray, smallest: bool, propagate_nan: bool) -> np.ndarray:
    if propagate_nan:
        return keys.min(axis=-1) if smallest else keys.max(axis=-1)
    all_nan = np.isnan(keys).all(axis=-1)
    fill = np.inf if smallest else -np.inf
    finite = np.where(np.isnan(keys), fill, keys)
    values = finite.min(axis=-1) if smallest else finite.max(axis=-1)
    return np.where(all_nan, np.nan, values).astype(keys.dtype)


_ARITHMETIC = {
    ReduceTensorOp.ADD: lambda rows: rows.sum(axis=-1),
    ReduceTensorOp.MUL: lambda rows: rows.prod(axis=-1),
    ReduceTensorOp.AVG: lambda rows: rows.sum(axis=-1) / rows.shape[-1],
    ReduceTensorOp.NORM1: lambda rows: np.abs(rows).sum(axis=-1),
    ReduceTensorOp.NORM2: lambda rows: np.sqrt((rows * rows).sum(axis=-1)),
    ReduceTensorOp.MUL_NO_ZEROS: lambda rows: np.where(rows == 0, 1, rows).prod(axis=-1),
}
