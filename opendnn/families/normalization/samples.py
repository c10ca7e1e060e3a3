"""Samples of the normalization family: layer / RMS / group / instance normalization, forward (training
and inference) and backward.

Outputs that come in several tensors (y with mean and inv_std; dx with dscale and dbias) are checked
together (``concatenated``), against the float64 reference concatenated alike.
"""

from __future__ import annotations

import dataclasses
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
from opendnn.families.normalization import functional as F
from opendnn.families.normalization import problem as normalization
from opendnn.families.normalization.api import (
    normalization_backward,
    normalization_forward_inference,
    normalization_forward_training,
)
from opendnn.families.normalization.problem import NormDescriptor, NormMode


def _norm_setup(sample: Sample, t: Tensors) -> tuple[NormDescriptor, Any, Any, Any, tuple[int, ...]]:
    """(descriptor, x, scale, bias, stats dims) of a "MODE/k" variant (k: normalized dims or groups)."""
    name, _, number = sample.variant.partition("/")
    mode = NormMode[name]
    count = int(number or 1)
    desc = NormDescriptor(mode, 1e-5, normalized_ndim=count, groups=count)
    x = t.input(sample.shape, sample.dtype, sample.layout)
    dims = normalization.param_dims(mode, sample.shape, count)
    scale = t.input(dims, sample.dtype, "packed", 0.5, 2.0)
    bias = t.input(dims, sample.dtype, "packed")
    groups = sample.shape[1] if mode is NormMode.INSTANCE_NORM else count
    return desc, x, scale, bias, normalization.stats_dims(mode, sample.shape, count, groups)


def _groups(desc: NormDescriptor, shape: tuple[int, ...]) -> int:
    if desc.mode is NormMode.INSTANCE_NORM:
        return shape[1]
    return desc.groups if desc.mode is NormMode.GROUP_NORM else 0


def run_norm_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """Training forward (y, mean, inv_std) when the op says so, else inference (y)."""
    desc, x, scale, bias, stats = _norm_setup(sample, t)
    y_ref, mean_ref, rstd_ref = normalization.forward_reference(
        desc.mode,
        t.values(x),
        t.values(scale),
        t.values(bias),
        desc.epsilon,
        desc.normalized_ndim,
        _groups(desc, sample.shape),
    )
    y, expected = blend(sample, t, sample.shape, y_ref)
    scale_desc = descriptor(scale)
    if sample.op == "normalization_forward_inference":
        normalization_forward_inference(
            handle, desc, sample.alpha, descriptor(x), x, scale_desc, scale, bias, sample.beta, descriptor(y), y
        )
        return checked(t, y, expected)
    stats_dtype = sample.dtype.compute_type
    rms = desc.mode is NormMode.RMS_NORM
    mean = None if rms else t.output(stats, stats_dtype, "packed", None)
    inv_std = t.output(stats, stats_dtype, "packed", None)
    normalization_forward_training(
        handle,
        desc,
        sample.alpha,
        descriptor(x),
        x,
        scale_desc,
        scale,
        bias,
        sample.beta,
        descriptor(y),
        y,
        descriptor(inv_std),
        mean,
        inv_std,
    )
    parts = [checked(t, y, expected), (t.values(inv_std), rstd_ref)]
    if mean is not None:
        parts.append((t.values(mean), mean_ref))
    return concatenated(parts)


def run_norm_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """dx, dscale and dbias, all blended with the sample's alpha and beta; the saved statistics
    are passed (computed in float64) unless the variant ends in "+recompute"."""
    variant, _, recompute = sample.variant.partition("+")
    desc, x, scale, _, stats = _norm_setup(Sample(sample.op, variant, sample.dtype, sample.shape, sample.layout), t)
    dy = t.input(sample.shape, sample.dtype, sample.layout)
    groups = _groups(desc, sample.shape)
    dx_ref, dscale_ref, dbias_ref = normalization.backward_reference(
        desc.mode, t.values(x), t.values(dy), t.values(scale), desc.epsilon, desc.normalized_ndim, groups
    )
    dx, dx_expected = blend(sample, t, sample.shape, dx_ref)
    packed = dataclasses.replace(sample, layout="packed")  # dscale and dbias share scale's descriptor
    dscale, dscale_expected = blend(packed, t, tuple(scale.shape), dscale_ref)
    dbias, dbias_expected = blend(packed, t, tuple(scale.shape), dbias_ref)
    mean = inv_std = None
    stats_desc = None
    if not recompute:
        _, mean_ref, rstd_ref = normalization.forward_reference(
            desc.mode, t.values(x), None, None, desc.epsilon, desc.normalized_ndim, groups
        )
        stats_dtype = sample.dtype.compute_type
        inv_std = t.output(stats, stats_dtype, "packed", rstd_ref.reshape(stats))
        if desc.mode is not NormMode.RMS_NORM:
            mean = t.output(stats, stats_dtype, "packed", mean_ref.reshape(stats))
        stats_desc = descriptor(inv_std)
    normalization_backward(
        handle,
        desc,
        sample.alpha,
        sample.beta,
        sample.alpha,
        sample.beta,
        descriptor(x),
        x,
        descriptor(dy),
        dy,
        descriptor(scale),
        scale,
        dscale,
        dbias,
        stats_desc,
        mean,
        inv_std,
        descriptor(dx),
        dx,
    )
    return concatenated(
        [checked(t, dx, dx_expected), checked(t, dscale, dscale_expected), checked(t, dbias, dbias_expected)]
    )


# the table -------------------------------------------------------------------------------------

NORM_SHAPES = {"small": (3, 6, 4, 5), "large": (16, 96, 16, 24)}
NORM_VARIANTS = ("LAYER_NORM/1", "LAYER_NORM/2", "RMS_NORM/1", "RMS_NORM/3", "GROUP_NORM/3", "INSTANCE_NORM")
NORM_OPS = {
    "normalization_forward_training": run_norm_forward,
    "normalization_forward_inference": run_norm_forward,
    "normalization_backward": run_norm_backward,
}


def samples(size: str = "small") -> Iterator[Sample]:
    """The normalization samples at size "small" (CPU, interpreter) or "large" (GPU)."""

    def sample(
        op: str, runner: Callable[..., Any], variant: str, dtype: DataType, shape: tuple[int, ...], **kw: Any
    ) -> Sample:
        return Sample(op, variant, dtype, shape, runner=runner, **kw)

    shape = NORM_SHAPES[size]
    for (op, runner), variant in itertools.product(NORM_OPS.items(), NORM_VARIANTS):
        if variant not in ("LAYER_NORM/2", "GROUP_NORM/3"):  # those run in every dtype and layout below
            yield sample(op, runner, variant, DataType.FLOAT, shape, layout="permuted")
    for (op, runner), dtype, layout in itertools.product(NORM_OPS.items(), FLOAT_TYPES, LAYOUTS):
        yield sample(op, runner, "LAYER_NORM/2", dtype, shape, layout=layout)
        yield sample(op, runner, "GROUP_NORM/3", dtype, shape, layout=layout)
    for variant in ("RMS_NORM/1", "LAYER_NORM/1+recompute", "GROUP_NORM/2+recompute"):
        yield sample(
            "normalization_backward",
            run_norm_backward,
            variant,
            DataType.FLOAT,
            shape,
            alpha=0.5,
            beta=0.25,
            layout="subregion",
        )
    yield sample(
        "normalization_forward_training", run_norm_forward, "RMS_NORM/2", DataType.BFLOAT16, shape, alpha=2.0, beta=0.5
    )


def error_samples() -> list[ErrorSample]:
    """Bad calls of the normalizations and their messages."""
    return [
        ErrorSample(
            "normalized_shape not x's trailing dims",
            F.layer_norm,
            lambda: {"x": values(2, 3, 4), "normalized_shape": (3,)},
            BadParam,
            "normalized_shape=[3] must be the trailing dims of x.shape=[2, 3, 4]",
        ),
        ErrorSample(
            "weight of another shape",
            F.layer_norm,
            lambda: {"x": values(2, 3, 4), "normalized_shape": (4,), "weight": values(5)},
            BadParam,
            "weight.shape=(5,) must be (4,)",
        ),
        ErrorSample(
            "negative eps",
            F.group_norm,
            lambda: {"x": values(2, 4, 3), "num_groups": 2, "eps": -1.0},
            BadParam,
            "eps=-1.0 must be finite and at least 0",
        ),
        ErrorSample(
            "num_groups not dividing C",
            F.group_norm,
            lambda: {"x": values(2, 4, 3), "num_groups": 3},
            BadParam,
            "x.dims[1]=4 must be a multiple of num_groups=3",
        ),
    ]
