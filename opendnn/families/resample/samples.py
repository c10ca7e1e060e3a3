"""Samples of resample_forward and resample_backward: every mode (cubic too) over 1, 2 and 3 spatial dims, up- and
downsampling by integer and non-integer ratios, given scales (torch's scale factors), aligned
corners, an input one pixel wide, NaN inputs, packed / permuted (channels innermost) / sub-region
layouts, alpha/beta and every float dtype; and ``interpolate`` / ``interpolate_backward`` through the Pythonic calls.

The variant names the mode and the geometry: ``LINEAR/2x`` (``+align`` for aligned corners).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported
from opendnn.core.handle import Handle
from opendnn.core.samples import FLOAT_TYPES, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.resample import functional as F
from opendnn.families.resample.api import resample_backward, resample_forward
from opendnn.families.resample.problem import (
    InterpolationMode,
    ResampleDescriptor,
    reference,
    resample_problem,
)

# geometry -> (output spatial size per sample size, the scales the call gives or None, x shape per size)
GEOMETRIES: dict[str, tuple[dict[str, tuple[int, ...]], tuple[float, ...] | None, dict[str, tuple[int, ...]]]] = {
    "2x": ({"small": (10, 14), "large": (112, 112)}, (0.5, 0.5), {"small": (2, 3, 5, 7), "large": (8, 64, 56, 56)}),
    "7x5-3x11": ({"small": (3, 11), "large": (30, 91)}, None, {"small": (2, 3, 7, 5), "large": (8, 64, 70, 41)}),
    "1d-9-4": ({"small": (4,), "large": (400,)}, None, {"small": (2, 3, 9), "large": (16, 64, 999)}),
    "3d": ({"small": (5, 8, 3), "large": (24, 40, 20)}, None, {"small": (1, 2, 3, 4, 5), "large": (2, 32, 12, 20, 24)}),
    "1x6-3x4": ({"small": (3, 4), "large": (7, 40)}, None, {"small": (2, 3, 1, 6), "large": (8, 64, 1, 56)}),
    "x1.7": (
        {"small": (8, 11), "large": (95, 95)},
        (1 / 1.7, 1 / 1.7),
        {"small": (2, 3, 5, 7), "large": (8, 64, 56, 56)},
    ),
}
MAIN = "2x"
LAYOUTS = ("packed", "permuted", "subregion")


def _parse(sample: Sample) -> tuple[ResampleDescriptor, tuple[int, ...]]:
    """The descriptor of a variant and the output's spatial size."""
    mode_name, _, rest = sample.variant.partition("/")
    geometry, *flags = rest.split("+")
    size = "small" if sample.shape == GEOMETRIES[geometry][2]["small"] else "large"
    out, scales, _ = GEOMETRIES[geometry]
    aligned = "align" in flags
    return ResampleDescriptor(InterpolationMode[mode_name], aligned, None if aligned else scales), out[size]


def _expected(
    desc: ResampleDescriptor, source: Any, out_shape: tuple[int, ...], t: Tensors, backward: bool
) -> np.ndarray:
    """The float64 reference of the call reading ``source`` (x, or dy) into an output of ``out_shape``."""
    names = ("dy_desc", "dx_desc") if backward else ("x_desc", "y_desc")
    source_desc = descriptor(source)
    problem = resample_problem(
        desc.mode,
        names,
        (source_desc, TensorDescriptor(source_desc.dtype, out_shape)),
        scales=desc.scales,
        align_corners=desc.align_corners,
        backward=backward,
    )
    return reference(problem, t.values(source))


def run_resample_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc, out = _parse(sample)
    x = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    y_shape = (*sample.shape[:2], *out)
    y, expected = blend(sample, t, y_shape, _expected(desc, x, y_shape, t, backward=False))
    resample_forward(handle, desc, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y)
    return checked(t, y, expected)


def run_resample_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    desc, out = _parse(sample)
    dy = t.input((*sample.shape[:2], *out), sample.dtype, sample.layout, nan=sample.nan_inputs)
    dx, expected = blend(sample, t, sample.shape, _expected(desc, dy, sample.shape, t, backward=True))
    resample_backward(handle, desc, sample.alpha, descriptor(dy), dy, sample.beta, descriptor(dx), dx)
    return checked(t, dx, expected)


def run_interpolate(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """torch's scale-factor form of the Pythonic call, forward and backward, checked together."""
    desc, out = _parse(sample)
    names = {InterpolationMode.NEAREST: "nearest", InterpolationMode.NEAREST_EXACT: "nearest-exact"}
    names[InterpolationMode.CUBIC] = "bicubic"
    mode = names.get(desc.mode, ("linear", "bilinear", "trilinear")[len(sample.shape) - 3])
    factors = None if desc.scales is None else tuple(1 / s for s in desc.scales)
    geometry = {"size": out} if factors is None else {"scale_factor": factors}
    aligned = {"align_corners": desc.align_corners} if desc.mode.taps > 1 else {}
    x = t.input(sample.shape, sample.dtype, sample.layout)
    y = F.interpolate(x, mode=mode, handle=handle, **geometry, **aligned)
    dy = t.input(tuple(y.shape), sample.dtype, sample.layout)
    dx = F.interpolate_backward(dy, x, mode=mode, handle=handle, **geometry, **aligned)
    expected_y = _expected(desc, x, tuple(y.shape), t, backward=False)
    expected_dx = _expected(desc, dy, sample.shape, t, backward=True)
    actual = np.concatenate([t.values(y).ravel(), t.values(dx).ravel()])
    return actual, np.concatenate([expected_y.ravel(), expected_dx.ravel()])


def samples(size: str = "small") -> Iterator[Sample]:
    """Every mode x geometry x direction in float32; the main geometry in every dtype and layout and
    with alpha/beta; aligned corners for LINEAR; the Pythonic calls on each geometry with scales."""
    runners = (("resample_forward", run_resample_forward), ("resample_backward", run_resample_backward))
    for (op, runner), mode, geometry in itertools.product(runners, InterpolationMode, GEOMETRIES):
        shape = GEOMETRIES[geometry][2][size]
        variant = f"{mode.name}/{geometry}"
        yield Sample(op, variant, DataType.FLOAT, shape, runner=runner)
        if geometry == MAIN:
            for dtype, layout in itertools.product(FLOAT_TYPES, LAYOUTS):
                if (dtype, layout) != (DataType.FLOAT, "packed"):
                    yield Sample(op, variant, dtype, shape, layout=layout, runner=runner)
            yield Sample(op, variant, DataType.FLOAT, shape, layout="subregion", alpha=0.5, beta=-1.5, runner=runner)
        if geometry in ("x1.7", "7x5-3x11"):
            yield Sample(op, variant, DataType.FLOAT, shape, nan_inputs=True, runner=runner)
        if mode.taps > 1 and geometry in (MAIN, "7x5-3x11", "3d"):
            yield Sample(op, f"{variant}+align", DataType.FLOAT, shape, layout="permuted", runner=runner)
    for mode, geometry in itertools.product(InterpolationMode, ("2x", "x1.7", "7x5-3x11")):
        shape = GEOMETRIES[geometry][2][size]
        yield Sample(
            "interpolate", f"{mode.name}/{geometry}", DataType.BFLOAT16, shape, "permuted", runner=run_interpolate
        )


def error_samples() -> list[ErrorSample]:
    """Bad calls of the resampling functions and their messages."""
    return [
        ErrorSample(
            "size and scale factor",
            F.interpolate,
            lambda: {"input": values(1, 2, 4, 4), "size": 8, "scale_factor": 2.0},
            BadParam,
            "give exactly one of size and scale_factor",
        ),
        ErrorSample(
            "unknown mode",
            F.interpolate,
            lambda: {"input": values(1, 2, 4, 4), "scale_factor": 2.0, "mode": "cubic"},
            BadParam,
            "mode='cubic' is not a mode: interpolate computes ['area', 'bicubic', 'bilinear', 'linear',",
        ),
        ErrorSample(
            "antialiasing",
            F.interpolate,
            lambda: {"input": values(1, 2, 4, 4), "scale_factor": 0.5, "mode": "bilinear", "antialias": True},
            NotSupported,
            "antialias=True is not implemented",
        ),
        ErrorSample(
            "aligned nearest",
            F.interpolate,
            lambda: {"input": values(1, 2, 4, 4), "size": 8, "align_corners": True},
            BadParam,
            "align_corners=True with mode='nearest'",
        ),
        ErrorSample(
            "bilinear of a 3-D input",
            F.interpolate,
            lambda: {"input": values(1, 2, 4), "size": 8, "mode": "bilinear"},
            BadParam,
            "mode='bilinear' needs an input of 4 dims, not input.ndim=3",
        ),
        ErrorSample(
            "empty output",
            F.interpolate,
            lambda: {"input": values(1, 2, 4, 4), "scale_factor": 0.2},
            BadParam,
            "scale_factor[0]=0.2 gives an output size of 0 from 4",
        ),
        ErrorSample(
            "gradient of another shape",
            F.interpolate_backward,
            lambda: {"grad_output": values(1, 2, 7, 8), "input": values(1, 2, 4, 4), "scale_factor": 2.0},
            BadParam,
            "grad_output.shape=[1, 2, 7, 8] must be the forward's output shape [1, 2, 8, 8]",
        ),
    ]
