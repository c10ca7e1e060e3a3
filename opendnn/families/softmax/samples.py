"""Samples of softmax_forward and softmax_backward: every algorithm, mode and dtype, the layouts,
alpha/beta, NaN inputs, and rows long enough for the two-pass kernels."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.samples import FLOAT_TYPES, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.softmax import functional as F
from opendnn.families.softmax.api import softmax_backward, softmax_forward
from opendnn.families.softmax.problem import (
    SoftmaxAlgorithm,
    SoftmaxMode,
    mode_axes,
    reference_backward,
    reference_forward,
)


def _parameters(sample: Sample) -> tuple[SoftmaxAlgorithm, SoftmaxMode, tuple[int, ...]]:
    algo_name, _, mode_name = sample.variant.partition("/")
    mode = SoftmaxMode[mode_name]
    return SoftmaxAlgorithm[algo_name], mode, mode_axes(mode, len(sample.shape))


def run_softmax_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    algo, mode, axes = _parameters(sample)
    x = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    y, expected = blend(sample, t, sample.shape, reference_forward(algo, t.values(x), axes))
    softmax_forward(handle, algo, mode, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y)
    return checked(t, y, expected)


def run_softmax_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """y is the forward output of random x (rounded to the dtype), dy random."""
    algo, mode, axes = _parameters(sample)
    y = t.input(sample.shape, sample.dtype, sample.layout)
    t.fill(y, reference_forward(algo, t.values(y), axes))
    dy = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    dx, expected = blend(sample, t, sample.shape, reference_backward(algo, t.values(y), t.values(dy), axes))
    softmax_backward(
        handle, algo, mode, sample.alpha, descriptor(y), y, descriptor(dy), dy, sample.beta, descriptor(dx), dx
    )
    return checked(t, dx, expected)


SHAPES = {"small": (3, 7, 5, 3), "large": (64, 1000, 7, 7)}
# rows past one block: the two-pass kernels, along the contiguous dim and across a strided one
LONG_ROWS = {"small": ((2, 20000), (2, 3000, 9)), "large": ((8, 1 << 20), (4, 5000, 64))}


def samples(size: str = "small") -> Iterator[Sample]:
    """Every algorithm x mode x direction in float32 and bfloat16. At size "small" each also in every
    dtype and layout, with alpha/beta and a long row; at "large" (each distinct case is a GPU
    compilation) only ACCURATE takes the other dtypes and layouts, and FAST the long rows."""
    shape = SHAPES[size]
    runners = (("softmax_forward", run_softmax_forward), ("softmax_backward", run_softmax_backward))
    variants = [f"{a.name}/{m.name}" for a, m in itertools.product(SoftmaxAlgorithm, SoftmaxMode)]
    for (op, runner), variant in itertools.product(runners, variants):
        every_case = size == "small" or variant.startswith("ACCURATE")
        for dtype in FLOAT_TYPES if every_case else (DataType.FLOAT, DataType.BFLOAT16):
            yield Sample(op, variant, dtype, shape, runner=runner)
        if every_case:
            yield Sample(op, variant, DataType.FLOAT, shape, layout="permuted", runner=runner)
            yield Sample(op, variant, DataType.BFLOAT16, shape, layout="permuted", alpha=0.5, beta=-0.75, runner=runner)
            yield Sample(op, variant, DataType.FLOAT, shape, layout="subregion", alpha=1.5, beta=0.25, runner=runner)
        if every_case or variant.startswith("FAST"):
            if variant.endswith("INSTANCE"):
                yield Sample(
                    op,
                    variant,
                    DataType.FLOAT,
                    LONG_ROWS[size][0],
                    layout="subregion",
                    alpha=2.0,
                    beta=0.5,
                    runner=runner,
                )
            else:
                yield Sample(op, variant, DataType.FLOAT, LONG_ROWS[size][1], runner=runner)
    for op, runner in runners:
        yield Sample(op, "ACCURATE/CHANNEL", DataType.FLOAT, shape, nan_inputs=True, runner=runner)
        yield Sample(op, "LOG/INSTANCE", DataType.HALF, shape, layout="permuted", nan_inputs=True, runner=runner)


def error_samples() -> list[ErrorSample]:
    """Bad calls of the softmaxes and their messages."""
    return [
        ErrorSample(
            "fractional dim", F.softmax, lambda: {"x": values(2, 3), "dim": 1.5}, BadParam, "dim=1.5 must be an int"
        ),
        ErrorSample(
            "dim out of range",
            F.log_softmax,
            lambda: {"x": values(2, 3), "dim": 2},
            BadParam,
            "dim=2 must be between -2 and 1",
        ),
    ]
