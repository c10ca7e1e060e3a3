"""Samples of matrix multiplication: every input dtype (fp8 too) in every layout, broadcast batch,
vectors (M, N or K of 1), alpha/beta, output dtypes, and every epilogue (bias per row and per
column, each forward activation, residual, fp8 scales).

A sample's shape is ``(*batch, M, K, N)``; its variant names the batch of B when it differs from
A's (``b_batch=...``) and the epilogue (``bias_col+gelu+residual``). Layout ``permuted`` stores A
and B transposed (and C column-major), ``subregion`` views them inside larger buffers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.samples import FLOAT_TYPES, LAYOUTS, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.matmul import functional as F
from opendnn.families.matmul.api import MatmulEpilogue, matmul
from opendnn.families.matmul.problem import ACTIVATIONS, BiasAxis, reference

SHAPES = {"small": (2, 13, 9, 11), "large": (3, 515, 1030, 390)}
VECTOR_SHAPES = {
    "small": ((1, 9, 11), (13, 9, 1), (13, 1, 11), (1, 1, 1)),
    "large": ((1, 1030, 390), (515, 1030, 1), (515, 1, 390)),
}
# exact in float32 (Triton's interpreter passes float scalars as float32)
COEF = {"clipped_relu_fwd": 1.25, "elu_fwd": 0.75, "swish_fwd": 1.375, "softplus_fwd": 0.875}
SCALES = (0.5, 1.5)  # fp8 per-tensor scales


def run_matmul(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    *batch, m, k, n = sample.shape
    b_batch, parts = _parse(sample.variant, tuple(batch))
    a = t.input((*batch, m, k), sample.dtype, sample.layout, -1.0, 1.0)
    b = t.input((*b_batch, k, n), sample.dtype, sample.layout, -1.0, 1.0)
    out_shape = (*np.broadcast_shapes(tuple(batch), b_batch), m, n)
    options: dict[str, Any] = {}
    bias = residual = None
    if "bias_col" in parts or "bias_row" in parts:
        axis = BiasAxis.COLUMN if "bias_col" in parts else BiasAxis.ROW
        bias = t.input((n if axis is BiasAxis.COLUMN else m,), DataType.FLOAT, "packed")
        options.update(bias_desc=descriptor(bias), bias=bias, bias_axis=axis)
    activation = next((mode for mode in ACTIVATIONS if mode.value in parts), None)
    coef = COEF.get(activation.value, 0.0) if activation else 0.0
    if activation is not None:
        options.update(activation=activation, coef=coef)
    if "residual" in parts:
        residual = t.input(out_shape, DataType.FLOAT, sample.layout)
        options.update(residual_desc=descriptor(residual), residual=residual)
    scale = 1.0
    if sample.dtype.is_fp8:
        options.update(a_scale=SCALES[0], b_scale=SCALES[1])
        scale = SCALES[0] * SCALES[1]
    result = reference(
        t.values(a),
        t.values(b),
        bias=None if bias is None else t.values(bias),
        bias_axis=options.get("bias_axis", BiasAxis.COLUMN),
        activation=activation,
        coef=coef,
        residual=None if residual is None else t.values(residual),
        scale=scale,
    )
    c, expected = blend(sample, t, out_shape, result)
    matmul(
        handle,
        sample.alpha,
        descriptor(a),
        a,
        descriptor(b),
        b,
        sample.beta,
        descriptor(c),
        c,
        MatmulEpilogue(**options),
    )
    return checked(t, c, expected)


def _parse(variant: str, a_batch: tuple[int, ...]) -> tuple[tuple[int, ...], set[str]]:
    """(B's batch dims, the epilogue's parts) of a variant like ``b_batch=1+bias_col+relu_fwd``."""
    parts = set(variant.split("+"))
    b_batch = a_batch
    for part in parts:
        if part.startswith("b_batch="):
            text = part.removeprefix("b_batch=")
            b_batch = tuple(int(d) for d in text.split(",")) if text else ()
    return b_batch, parts


def samples(size: str = "small") -> Iterator[Sample]:
    """The matmul samples at SHAPES[size]."""
    shape = SHAPES[size]
    *batch, m, k, n = shape

    def sample(variant: str = "plain", dtype: DataType = DataType.FLOAT, **kw: Any) -> Sample:
        return Sample("matmul", variant, dtype, kw.pop("shape", shape), runner=run_matmul, **kw)

    for dtype, layout in itertools.product(FLOAT_TYPES, LAYOUTS):
        yield sample(dtype=dtype, layout=layout)
    for dtype in (DataType.FP8_E4M3, DataType.FP8_E5M2):
        yield sample(dtype=dtype, out_dtype=DataType.FLOAT)
        yield sample("bias_col+relu_fwd", dtype, out_dtype=DataType.BFLOAT16, layout="permuted")
    yield sample("b_batch=", shape=(3, 1, m, k, n))  # B one matrix, broadcast over A's batch
    yield sample("b_batch=4,1,1", DataType.HALF, shape=(3, 1, m, k, n), layout="permuted")  # both broadcast
    yield sample("b_batch=1", DataType.BFLOAT16, shape=(4, m, k, n), layout="subregion")
    for vector in VECTOR_SHAPES[size]:
        yield sample(shape=vector)
    yield sample(alpha=0.5, beta=-0.75, layout="subregion")
    yield sample("bias_col+gelu_fwd+residual", DataType.BFLOAT16, alpha=1.5, beta=0.25, layout="permuted")
    yield sample(dtype=DataType.BFLOAT16, out_dtype=DataType.FLOAT)
    yield sample(dtype=DataType.FLOAT, out_dtype=DataType.HALF, layout="permuted")
    yield sample(dtype=DataType.DOUBLE, out_dtype=DataType.FLOAT)
    for index, activation in enumerate(ACTIVATIONS):
        bias = "bias_row" if index % 2 else "bias_col"
        dtype = (DataType.FLOAT, DataType.HALF)[index % 2]
        yield sample(f"{bias}+{activation.value}", dtype, layout=LAYOUTS[index % 3])
    yield sample("bias_row+residual", DataType.DOUBLE, layout="subregion")
    yield sample("bias_col+swish_fwd+residual", beta=1.0, shape=tuple(batch) + (1, k, n))


def error_samples() -> list[ErrorSample]:
    """Bad calls of the matrix products and their messages."""
    return [
        ErrorSample(
            "inner dims differ",
            F.matmul,
            lambda: {"a": values(2, 3), "b": values(4, 5)},
            BadParam,
            "a.dims[-1]=3 must equal b.dims[-2]=4",
        ),
        ErrorSample(
            "residual of another shape",
            F.matmul,
            lambda: {"a": values(3), "b": values(3, 4), "residual": values(5)},
            BadParam,
            "residual.shape=[5] must equal the result's shape [4]",
        ),
        ErrorSample(
            "clipped relu without its ceiling",
            F.matmul,
            lambda: {"a": values(2, 3), "b": values(3, 4), "activation": "clipped_relu"},
            BadParam,
            "coef=None: CLIPPED_RELU needs its ceiling",
        ),
        ErrorSample(
            "unknown activation",
            F.matmul,
            lambda: {"a": values(2, 3), "b": values(3, 4), "activation": "mish"},
            BadParam,
            "activation='mish' is not a forward activation",
        ),
        ErrorSample(
            "linear weight of other in_features",
            F.linear,
            lambda: {"x": values(2, 3), "weight": values(4, 5)},
            BadParam,
            "x.shape=(2, 3) must end with weight.shape[1]=5",
        ),
    ]
