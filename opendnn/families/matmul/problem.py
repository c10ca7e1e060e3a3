"""Matrix multiplication (cuBLASLt's matmul with epilogues): one operation, its shape and dtype
rules, and its float64 NumPy reference.

``C = alpha * (act(s * (A @ B) + bias) + residual) + beta * C``, per batch element, where

- A is ``(*batch_a, M, K)``, B ``(*batch_b, K, N)`` and C ``(*batch, M, N)`` with ``batch`` the
  NumPy broadcast of ``batch_a`` and ``batch_b`` (each dim equal or 1, missing leading dims are 1);
  any strides, so a transposed A or B is a descriptor, never a copy;
- ``s = a_scale * b_scale`` are per-tensor scales (what fp8 inputs carry; 1 otherwise);
- ``bias`` is a vector of N elements added to every row (``BiasAxis.COLUMN``, torch's linear) or of
  M elements added to every column (``BiasAxis.ROW``);
- ``act`` is any forward activation of the pointwise family (``PointwiseMode.*_FWD``, with its
  ``coef``), or none (None or IDENTITY);
- ``residual`` is a tensor of C's dims (any strides and float dtype) added after the activation.

With beta == 0 the prior content of C is never read. Inputs: A and B both FLOAT, HALF, BFLOAT16 or
DOUBLE, or both fp8 (E4M3 or E5M2, mixed allowed); C, bias and residual of any float dtype, chosen
independently of the inputs. Products accumulate in float32 (float64 for DOUBLE inputs); FLOAT
inputs may use TF32, and fp8 inputs fast accumulation, when the handle's math type is TENSOR_OP.

fp8 values have no NumPy dtype: they are stored as uint8 bit patterns and decoded through a
256-entry table (``fp8_to_float64`` / ``float_to_fp8``), as bfloat16 is stored as uint16 bits.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from opendnn.core.descriptors import TensorDescriptor, check_finite, check_member
from opendnn.core.dtypes import DataType
from opendnn.core.errors import Status, require
from opendnn.core.memo import cached_hash, memoized
from opendnn.families.pointwise.problem import PointwiseMode, resolved_coef
from opendnn.families.pointwise.problem import reference as pointwise_reference

INPUT_TYPES = (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16, DataType.DOUBLE)
FP8_TYPES = (DataType.FP8_E4M3, DataType.FP8_E5M2)
OUTPUT_TYPES = INPUT_TYPES


class BiasAxis(enum.Enum):
    """Which index of C the bias follows: COLUMN (N values, one per column: torch's linear) or ROW
    (M values, one per row)."""

    COLUMN = "column"
    ROW = "row"


ACTIVATIONS = tuple(mode for mode in PointwiseMode if mode.value.endswith("_fwd"))


@dataclass(frozen=True)
class MatmulProblem:
    """A validated matrix product: descriptors and parameters, no memory.

    ``batch`` is C's leading dims; ``bias`` (1-D, N or M elements along ``bias_axis``) and
    ``residual`` (C's dims) are None when absent; ``activation`` is a ``*_FWD`` mode or None.
    """

    __hash__ = cached_hash  # problems key the per-call caches

    a: TensorDescriptor
    b: TensorDescriptor
    c: TensorDescriptor
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    alpha: float = 1.0
    beta: float = 0.0
    bias: TensorDescriptor | None = None
    bias_axis: BiasAxis = BiasAxis.COLUMN
    activation: PointwiseMode | None = None
    coef: float = 0.0
    residual: TensorDescriptor | None = None
    scale: float = 1.0
    allow_tf32: bool = False
    fast_fp8_accumulation: bool = False
    compute_dtype: DataType = DataType.FLOAT
    fast_math: bool = False  # the handle's: approximate epilogue activations for 16-bit outputs on a GPU

    @property
    def flops(self) -> int:
        """Floating-point operations of the product: 2 per multiply-add."""
        return 2 * math.prod(self.batch) * self.m * self.n * self.k


@memoized  # the cuDNN-shaped call, vector and residual products keep no plan: asked on every call
def matmul_problem(
    a_desc: TensorDescriptor,
    b_desc: TensorDescriptor,
    c_desc: TensorDescriptor,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias_desc: TensorDescriptor | None = None,
    bias_axis: BiasAxis | str = BiasAxis.COLUMN,
    activation: PointwiseMode | None = None,
    coef: float | None = None,
    residual_desc: TensorDescriptor | None = None,
    a_scale: float = 1.0,
    b_scale: float = 1.0,
    allow_tf32: bool = False,
    fast_fp8_accumulation: bool = False,
    fast_math: bool = False,
) -> MatmulProblem:
    """The shape and dtype rules of a matrix product.

    ``allow_tf32`` lets FLOAT inputs use TF32; ``fast_fp8_accumulation`` lets fp8 products skip the
    periodic promotion of the tensor cores' partial sums to full fp32 (cuBLASLt's FAST_ACCUM: a few
    percent faster, relative error about 1e-3 instead of 1e-6). Both come from the handle's
    TENSOR_OP math type; ``fast_math`` is the handle's (``Handle``). ``coef`` None is the
    activation's default (``resolved_coef``).

    Raises:
        BadParam: fewer than 2 dims, inner dims that differ, batch dims that do not broadcast, C not
            of the broadcast shape, a bias or residual of the wrong shape, an activation that is not
            a forward one, non-finite alpha, beta, coef or scales (the shapes named in each message).
        NotSupported (NOT_SUPPORTED_DATA_TYPE): an unsupported dtype pair.
    """
    for name, desc in (("a_desc", a_desc), ("b_desc", b_desc), ("c_desc", c_desc)):
        require(isinstance(desc, TensorDescriptor), f"{name}={desc!r} must be a TensorDescriptor")
        require(
            desc.ndim >= 2,
            f"{name}.dims={list(desc.dims)} must have at least 2 dims (..., rows, cols)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    shapes = f"a_desc.dims={list(a_desc.dims)}, b_desc.dims={list(b_desc.dims)}"
    (m, k), (k_b, n) = a_desc.dims[-2:], b_desc.dims[-2:]
    require(
        k == k_b, f"a_desc.dims[-1]={k} must equal b_desc.dims[-2]={k_b} ({shapes})", Status.BAD_PARAM_SHAPE_MISMATCH
    )
    batch = _broadcast_batch(a_desc.dims[:-2], b_desc.dims[:-2], shapes)
    expected = (*batch, m, n)
    require(
        c_desc.dims == expected,
        f"c_desc.dims={list(c_desc.dims)} must equal {list(expected)}, the broadcast "
        f"batch dims then (M, N), for {shapes}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    compute = _check_dtypes(a_desc, b_desc, c_desc, shapes)
    axis = check_member("bias_axis", BiasAxis, bias_axis)
    if bias_desc is not None:
        length = n if axis is BiasAxis.COLUMN else m
        require(
            bias_desc.dims == (length,),
            f"bias_desc.dims={list(bias_desc.dims)} must be [{length}] for bias_axis={axis.name} "
            f"(C is {list(expected)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        _check_float("bias_desc", bias_desc)
    if residual_desc is not None:
        require(
            residual_desc.dims == expected,
            f"residual_desc.dims={list(residual_desc.dims)} must equal c_desc.dims={list(expected)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        _check_float("residual_desc", residual_desc)
    if activation is not None:
        activation = check_member("activation", PointwiseMode, activation)
        require(
            activation in ACTIVATIONS or activation is PointwiseMode.IDENTITY,
            f"activation={activation.name} must be a forward activation or IDENTITY "
            f"({', '.join(m.name for m in ACTIVATIONS)})",
        )
        coef = resolved_coef(activation, coef)
        if activation is PointwiseMode.IDENTITY:
            activation = None  # backends see *_FWD activations only
    else:
        coef = 0.0 if coef is None else check_finite("coef", coef)
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    scale = check_finite("a_scale", a_scale) * check_finite("b_scale", b_scale)
    return MatmulProblem(
        a_desc,
        b_desc,
        c_desc,
        batch,
        m,
        n,
        k,
        alpha,
        beta,
        bias_desc,
        axis,
        activation,
        coef,
        residual_desc,
        scale,
        bool(allow_tf32),
        bool(fast_fp8_accumulation),
        compute,
        bool(fast_math),
    )


def _broadcast_batch(batch_a: tuple[int, ...], batch_b: tuple[int, ...], shapes: str) -> tuple[int, ...]:
    rank = max(len(batch_a), len(batch_b))
    padded_a = (1,) * (rank - len(batch_a)) + batch_a
    padded_b = (1,) * (rank - len(batch_b)) + batch_b
    for k, (da, db) in enumerate(zip(padded_a, padded_b)):
        require(
            da == db or 1 in (da, db),
            f"batch dims {list(batch_a)} of A and {list(batch_b)} of B do not broadcast: {da} against {db} "
            f"at batch dim {k} ({shapes})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    return tuple(max(da, db) for da, db in zip(padded_a, padded_b))


def _check_dtypes(a: TensorDescriptor, b: TensorDescriptor, c: TensorDescriptor, shapes: str) -> DataType:
    pair = f"a_desc.dtype={a.dtype.name} with b_desc.dtype={b.dtype.name}"
    both_fp8 = a.dtype in FP8_TYPES and b.dtype in FP8_TYPES
    require(
        both_fp8 or (a.dtype is b.dtype and a.dtype in INPUT_TYPES),
        f"{pair} is not supported ({shapes}): A and B must share one of "
        f"{', '.join(t.name for t in INPUT_TYPES)}, or both be FP8_E4M3/FP8_E5M2",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    require(
        c.dtype in OUTPUT_TYPES,
        f"c_desc.dtype={c.dtype.name} must be one of {', '.join(t.name for t in OUTPUT_TYPES)} ({pair})",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    return DataType.DOUBLE if a.dtype is DataType.DOUBLE else DataType.FLOAT


def _check_float(name: str, desc: TensorDescriptor) -> None:
    require(
        desc.dtype in OUTPUT_TYPES,
        f"{name}.dtype={desc.dtype.name} must be one of {', '.join(t.name for t in OUTPUT_TYPES)}",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )


def reference(
    a: np.ndarray,
    b: np.ndarray,
    *,
    bias: np.ndarray | None = None,
    bias_axis: BiasAxis = BiasAxis.COLUMN,
    activation: PointwiseMode | None = None,
    coef: float = 0.0,
    residual: np.ndarray | None = None,
    scale: float = 1.0,
    dtype: npt.DTypeLike = np.float64,
) -> np.ndarray:
    """``act(scale * (a @ b) + bias) + residual`` in ``dtype``, float64 unless a backend computes in
    float32 (alpha and beta are the caller's blend).

    Args:
        a, b: float arrays of shapes ``(*batch_a, M, K)`` and ``(*batch_b, K, N)``.
        bias: N values (COLUMN) or M values (ROW), or None.
    """
    result = np.matmul(np.asarray(a, dtype), np.asarray(b, dtype))
    if scale != 1.0:
        result *= scale
    if bias is not None:
        bias = np.asarray(bias, dtype)
        result += bias if BiasAxis(bias_axis) is BiasAxis.COLUMN else bias[:, None]
    if activation is not None:
        result = pointwise_reference(PointwiseMode(activation), [result], coef)
    if residual is not None:
        result = result + np.asarray(residual, dtype)
    return result


# ---- fp8 bit patterns ----------------------------------------------------------------------------

_FP8_FORMAT = {DataType.FP8_E4M3: (4, 7), DataType.FP8_E5M2: (5, 15)}  # exponent bits, bias


@functools.cache
def fp8_table(dtype: DataType) -> np.ndarray:
    """The float64 value of each of the 256 bit patterns of an fp8 type. E4M3 (``e4m3fn``) has no
    infinities and NaN at S.1111.111; E5M2 is IEEE-like (infinities and NaNs at exponent 31)."""
    exponent_bits, bias = _FP8_FORMAT[DataType.of(dtype)]
    mantissa_bits = 7 - exponent_bits
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = codes & ((1 << mantissa_bits) - 1)
    fraction = mantissa / (1 << mantissa_bits)
    values = np.where(exponent == 0, fraction * 2.0 ** (1 - bias), (1 + fraction) * 2.0 ** (exponent - bias))
    values = sign * values
    if exponent_bits == 4:
        values[(codes & 0x7F) == 0x7F] = np.nan
    else:
        top = exponent == (1 << exponent_bits) - 1
        values[top & (mantissa == 0)] = sign[top & (mantissa == 0)] * np.inf
        values[top & (mantissa != 0)] = np.nan
    return values


def fp8_to_float64(bits: np.ndarray, dtype: DataType) -> np.ndarray:
    """fp8 bit patterns (uint8) to float64."""
    return fp8_table(dtype)[np.asarray(bits, np.uint8)]


def float_to_fp8(values: np.ndarray, dtype: DataType) -> np.ndarray:
    """float values to fp8 bit patterns (uint8), rounding to nearest even; values past the largest
    finite one round to it when within half a step, else become NaN (E4M3) or infinity (E5M2)."""
    table = fp8_table(dtype)
    positive = np.arange(128)[np.isfinite(table[:128])]  # codes of finite non-negative values, ascending
    magnitudes = table[positive]
    x = np.asarray(values, np.float64)
    size = np.abs(x)
    upper = np.clip(np.searchsorted(magnitudes, size), 1, len(positive) - 1)
    below, above = magnitudes[upper - 1], magnitudes[upper]
    take_above = (size - below > above - size) | ((size - below == above - size) & (positive[upper] % 2 == 0))
    codes = np.where(take_above, positive[upper], positive[upper - 1])
    largest = magnitudes[-1]
    overflow = size > largest + (largest - magnitudes[-2]) / 2
    special = 0x7F if dtype is DataType.FP8_E4M3 else 0x7C  # NaN for E4M3, infinity for E5M2
    codes = np.where(overflow, special, codes)
    codes = np.where(np.isnan(x), 0x7F, codes)
    return (codes | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)
