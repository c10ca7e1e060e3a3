"""Samples of the LRN family: cross-channel LRN and divisive normalization, forward and backward.

The divisive backward's dx and dmeans are checked together (``concatenated``). Parameters are exact in
float32 (Triton's interpreter passes float scalars as float32): the alphas make alpha / n^S = 0.125.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.samples import (
    FLOAT_TYPES,
    LAYOUTS,
    ErrorSample,
    Sample,
    Tensors,
    blend,
    checked,
    concatenated,
    descriptor,
    values,
)
from opendnn.families.lrn import functional as F
from opendnn.families.lrn import problem as lrn
from opendnn.families.lrn.api import (
    divisive_normalization_backward,
    divisive_normalization_forward,
    lrn_cross_channel_backward,
    lrn_cross_channel_forward,
)
from opendnn.families.lrn.problem import DivNormMode, LRNDescriptor, LRNMode

LRN_BETA, LRN_K = 0.75, 1.5


def _lrn_desc(n: int, spatial: int = 1) -> LRNDescriptor:
    alpha = 0.125 * n**spatial
    return LRNDescriptor(n, alpha, LRN_BETA, LRN_K)


def run_lrn_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc = _lrn_desc(int(sample.variant.removeprefix("n")))
    x = t.input(sample.shape, sample.dtype, sample.layout)
    y, expected = blend(sample, t, sample.shape, lrn.lrn_reference(t.values(x), desc))
    lrn_cross_channel_forward(
        handle, desc, LRNMode.CROSS_CHANNEL_DIM1, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y
    )
    return checked(t, y, expected)


def run_lrn_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc = _lrn_desc(int(sample.variant.removeprefix("n")))
    x = t.input(sample.shape, sample.dtype, sample.layout)
    dy = t.input(sample.shape, sample.dtype, sample.layout)
    y = t.input(sample.shape, sample.dtype, "packed")  # the forward output: checked, not read
    dx, expected = blend(sample, t, sample.shape, lrn.lrn_backward_reference(t.values(x), t.values(dy), desc))
    lrn_cross_channel_backward(
        handle,
        desc,
        LRNMode.CROSS_CHANNEL_DIM1,
        sample.alpha,
        descriptor(y),
        y,
        descriptor(dy),
        dy,
        descriptor(x),
        x,
        sample.beta,
        descriptor(dx),
        dx,
    )
    return checked(t, dx, expected)


def _divisive_inputs(sample: Sample, t: Tensors) -> tuple[LRNDescriptor, Any, Any]:
    n_text, _, means_text = sample.variant.partition("+")
    desc = _lrn_desc(int(n_text.removeprefix("n")), len(sample.shape) - 2)
    x = t.input(sample.shape, sample.dtype, sample.layout)
    means = t.input(sample.shape, sample.dtype, sample.layout, -0.5, 0.5) if means_text == "means" else None
    return desc, x, means


def run_divisive_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc, x, means = _divisive_inputs(sample, t)
    result = lrn.divisive_reference(t.values(x), None if means is None else t.values(means), desc)
    y, expected = blend(sample, t, sample.shape, result)
    divisive_normalization_forward(
        handle,
        desc,
        DivNormMode.PRECOMPUTED_MEANS,
        sample.alpha,
        descriptor(x),
        x,
        means,
        None,
        None,
        sample.beta,
        descriptor(y),
        y,
    )
    return checked(t, y, expected)


def run_divisive_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc, x, means = _divisive_inputs(sample, t)
    dy = t.input(sample.shape, sample.dtype, sample.layout)
    temp, temp2 = (t.output(sample.shape, sample.dtype, sample.layout, None) for _ in range(2))
    dx_ref, dmeans_ref = lrn.divisive_backward_reference(
        t.values(x), None if means is None else t.values(means), t.values(dy), desc
    )
    dx, dx_expected = blend(sample, t, sample.shape, dx_ref)
    dmeans, dmeans_expected = blend(sample, t, sample.shape, dmeans_ref)
    divisive_normalization_backward(
        handle,
        desc,
        DivNormMode.PRECOMPUTED_MEANS,
        sample.alpha,
        descriptor(x),
        x,
        means,
        dy,
        temp,
        temp2,
        sample.beta,
        descriptor(dx),
        dx,
        dmeans,
    )
    return concatenated([checked(t, dx, dx_expected), checked(t, dmeans, dmeans_expected)])


# the table -------------------------------------------------------------------------------------

LRN_SHAPES = {"small": (2, 7, 3, 5), "large": (8, 96, 28, 28)}
DIVISIVE_SHAPES = {"small": ((2, 3, 5, 6), (1, 2, 3, 4, 5)), "large": ((4, 16, 40, 48), (2, 4, 8, 16, 16))}
DIVISIVE_4D = (
    ("n3+means", DataType.FLOAT, "packed"),
    ("n4", DataType.BFLOAT16, "permuted"),
    ("n3+means", DataType.DOUBLE, "subregion"),
    ("n4", DataType.HALF, "packed"),
)
DIVISIVE_5D = (("n3+means", DataType.FLOAT, "permuted"), ("n3", DataType.DOUBLE, "packed"))


def samples(size: str = "small") -> Iterator[Sample]:
    """The LRN samples at size "small" (CPU, interpreter) or "large" (GPU)."""

    def sample(
        op: str, runner: Callable[..., Any], variant: str, dtype: DataType, shape: tuple[int, ...], **kw: Any
    ) -> Sample:
        return Sample(op, variant, dtype, shape, runner=runner, **kw)

    shape = LRN_SHAPES[size]
    for dtype, layout in itertools.product(FLOAT_TYPES, LAYOUTS):
        yield sample("lrn_cross_channel_forward", run_lrn_forward, "n5", dtype, shape, layout=layout)
        yield sample("lrn_cross_channel_backward", run_lrn_backward, "n5", dtype, shape, layout=layout)
    yield sample(
        "lrn_cross_channel_forward",
        run_lrn_forward,
        "n4",
        DataType.FLOAT,
        shape,
        alpha=0.5,
        beta=-0.75,
        layout="subregion",
    )
    yield sample(
        "lrn_cross_channel_backward",
        run_lrn_backward,
        "n4",
        DataType.FLOAT,
        shape,
        alpha=1.5,
        beta=0.25,
        layout="permuted",
    )
    for divisive_shape, cases in zip(DIVISIVE_SHAPES[size], (DIVISIVE_4D, DIVISIVE_5D)):
        for variant, dtype, layout in cases:
            yield sample(
                "divisive_normalization_forward", run_divisive_forward, variant, dtype, divisive_shape, layout=layout
            )
            yield sample(
                "divisive_normalization_backward", run_divisive_backward, variant, dtype, divisive_shape, layout=layout
            )
    yield sample(
        "divisive_normalization_backward",
        run_divisive_backward,
        "n3+means",
        DataType.FLOAT,
        DIVISIVE_SHAPES[size][0],
        alpha=0.5,
        beta=0.25,
    )


def error_samples() -> list[ErrorSample]:
    """Bad calls of the LRN functions and their messages."""
    return [
        ErrorSample(
            "LRN size 0",
            F.local_response_norm,
            lambda: {"x": values(2, 4, 3), "size": 0},
            BadParam,
            "size=0 must be an integer from 1 to 16",
        ),
    ]
