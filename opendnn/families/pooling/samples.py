"""Samples of pooling forward and backward: every mode, 1-D, 2-D and 3-D windows (overlapping, a
window larger than the input, a stride larger than the window, dilated max windows), NaN inputs under
both NaN options, ties (integer-valued inputs), packed / permuted (channels innermost) / sub-region
layouts, alpha/beta, every float dtype, max_pool's indices (``max_pool_indices``: y and torch's
int64 indices through the Pythonic call), and adaptive pooling whose cells are not one size at one step
(``adaptive_pool_forward`` / ``_backward``, through the Pythonic calls: 10 -> 7, 13 -> 5 beside a dim that
divides, 3-D, an output larger than the input).

The variant names the geometry: ``MAX/k3x3-s2x2-p1x1`` (``-d2x2`` for dilation), or ``MAX/a10x10-7x7`` for an
adaptive pooling of 10 x 10 into 7 x 7, with ``+nan`` (PROPAGATE_NAN) or ``+ties`` appended.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from opendnn.core.descriptors import NanPropagation
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.core.samples import FLOAT_TYPES, LAYOUTS, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.pooling import functional as F
from opendnn.families.pooling.api import pooling_backward, pooling_forward
from opendnn.families.pooling.problem import (
    PoolingDescriptor,
    PoolingMode,
    reference_adaptive_backward,
    reference_adaptive_forward,
    reference_backward,
    reference_forward,
    reference_indices,
)

# geometry -> ((window, stride, padding[, dilation]), {size: x shape})
GEOMETRIES: dict[str, tuple[tuple[tuple[int, ...], ...], dict[str, tuple[int, ...]]]] = {
    "k3x3-s2x2-p1x1": (((3, 3), (2, 2), (1, 1)), {"small": (2, 3, 7, 8), "large": (8, 64, 56, 56)}),
    "k2x2-s2x2-p0x0": (((2, 2), (2, 2), (0, 0)), {"small": (2, 3, 7, 8), "large": (8, 64, 56, 56)}),
    "k3x2-s1x2-p1x0": (((3, 2), (1, 2), (1, 0)), {"small": (2, 3, 6, 7), "large": (8, 32, 40, 48)}),
    "k2x2-s3x3-p0x0": (((2, 2), (3, 3), (0, 0)), {"small": (2, 3, 7, 8), "large": (8, 64, 40, 41)}),  # gaps
    "k4x5-s1x2-p1x1": (((4, 5), (1, 2), (1, 1)), {"small": (2, 3, 3, 4), "large": (64, 64, 3, 4)}),  # > input
    "k3-s2-p1": (((3,), (2,), (1,)), {"small": (2, 3, 9), "large": (16, 64, 999)}),
    "k2x3x2-s2x1x2-p1x1x0": (
        ((2, 3, 2), (2, 1, 2), (1, 1, 0)),
        {"small": (2, 3, 4, 5, 6), "large": (4, 32, 12, 20, 24)},
    ),
    "k3x3-s2x2-p1x1-d2x2": (((3, 3), (2, 2), (1, 1), (2, 2)), {"small": (2, 3, 9, 10), "large": (8, 64, 56, 56)}),
    "k3-s1-p1-d3": (((3,), (1,), (1,), (3,)), {"small": (2, 3, 11), "large": (16, 64, 999)}),
    "k2x3x2-s1x2x1-p1x1x0-d3x2x2": (
        ((2, 3, 2), (1, 2, 1), (1, 1, 0), (3, 2, 2)),
        {"small": (2, 3, 5, 7, 6), "large": (4, 32, 12, 20, 24)},
    ),
}
# adaptive geometry -> ({size: x shape}, output size): cells of more than one size or step along some dims
ADAPTIVE: dict[str, tuple[dict[str, tuple[int, ...]], tuple[int, ...]]] = {
    "a10x10-7x7": ({"small": (2, 3, 10, 10), "large": (8, 512, 10, 10)}, (7, 7)),  # VGG's pool, 320 pixels
    "a13x8-5x4": ({"small": (2, 3, 13, 8), "large": (8, 64, 13, 8)}, (5, 4)),  # beside a dim that divides
    "a9x6x7-5x3x4": ({"small": (2, 3, 9, 6, 7), "large": (4, 32, 9, 6, 7)}, (5, 3, 4)),
    "a5-7": ({"small": (2, 3, 5), "large": (16, 64, 5)}, (7,)),  # cells repeat: output larger than input
    "a3x13-7x5": ({"small": (2, 3, 3, 13), "large": (8, 64, 3, 13)}, (7, 5)),
}
MAIN = "k3x3-s2x2-p1x1"
DILATED = [name for name, (geometry, _) in GEOMETRIES.items() if len(geometry) == 4]  # max pooling's only


def _parse(sample: Sample) -> tuple[PoolingDescriptor, bool]:
    """The pooling descriptor of a variant and whether its inputs are integer-valued (ties)."""
    mode_name, _, rest = sample.variant.partition("/")
    geometry, *flags = rest.split("+")
    window, stride, padding, *dilation = GEOMETRIES[geometry][0]
    nan_opt = NanPropagation.PROPAGATE_NAN if "nan" in flags else NanPropagation.NOT_PROPAGATE_NAN
    pool = PoolingDescriptor(PoolingMode[mode_name], nan_opt, window, padding, stride, dilation[0] if dilation else 1)
    return pool, "ties" in flags


def _input(sample: Sample, t: Tensors, ties: bool) -> Any:
    x = t.input(sample.shape, sample.dtype, sample.layout, nan=sample.nan_inputs)
    if ties:
        t.fill(x, np.round(t.values(x)))
    return x


def run_pooling_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    pool, ties = _parse(sample)
    x = _input(sample, t, ties)
    result = reference_forward(pool.mode, t.values(x), *_geometry(pool), _propagates(pool), dilation=pool.dilation)
    y, expected = blend(sample, t, result.shape, result)
    pooling_forward(handle, pool, sample.alpha, descriptor(x), x, sample.beta, descriptor(y), y)
    return checked(t, y, expected)


def run_pooling_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """y is the forward's output rounded to the dtype (as a caller's would be); dx's reference
    recomputes the argmax from the same x and y."""
    pool, ties = _parse(sample)
    x = _input(sample, t, ties)
    x64 = t.values(x)
    y_values = reference_forward(pool.mode, x64, *_geometry(pool), _propagates(pool), dilation=pool.dilation)
    y = t.input(y_values.shape, sample.dtype, "packed")
    t.fill(y, y_values)
    dy = t.input(y_values.shape, sample.dtype, sample.layout)
    result = reference_backward(pool.mode, x64, t.values(y), t.values(dy), *_geometry(pool), dilation=pool.dilation)
    dx, expected = blend(sample, t, sample.shape, result)
    pooling_backward(
        handle,
        pool,
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


def run_max_pool_indices(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """y and torch's indices of ``max_pool(..., return_indices=True)``: y's values, then 1 for each
    index equal to the reference's (0 otherwise, so one wrong index fails the relative error)."""
    pool, ties = _parse(sample)
    x = _input(sample, t, ties)
    x64, propagate = t.values(x), _propagates(pool)
    y, indices = F.max_pool(
        x,
        pool.window,
        pool.stride,
        pool.padding,
        pool.dilation,
        return_indices=True,
        propagate_nan=propagate,
        handle=handle,
    )
    expected_y = reference_forward(pool.mode, x64, *_geometry(pool), propagate, dilation=pool.dilation)
    expected_indices = reference_indices(x64, *_geometry(pool), propagate, dilation=pool.dilation)
    found = np.asarray(t.values(indices) == expected_indices, np.float64)
    return np.concatenate([t.values(y).ravel(), found.ravel()]), np.concatenate(
        [expected_y.ravel(), np.ones(found.size)]
    )


def _adaptive(sample: Sample, t: Tensors) -> tuple[PoolingMode, tuple[int, ...], bool, Any]:
    """An adaptive sample's mode, output size, NaN option and input."""
    mode_name, _, rest = sample.variant.partition("/")
    geometry, *flags = rest.split("+")
    return PoolingMode[mode_name], ADAPTIVE[geometry][1], "nan" in flags, _input(sample, t, "ties" in flags)


def run_adaptive_forward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    mode, out, propagate, x = _adaptive(sample, t)
    if mode.is_max:
        y = F.adaptive_max_pool(x, out, propagate_nan=propagate, handle=handle)
    else:
        y = F.adaptive_avg_pool(x, out, handle=handle)
    return t.values(y), reference_adaptive_forward(mode, t.values(x), out, propagate)


def run_adaptive_backward(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """y is the forward's output rounded to the dtype; dx's reference finds the first match of y in each
    cell of the same x."""
    mode, out, propagate, x = _adaptive(sample, t)
    x64 = t.values(x)
    y = t.input((*sample.shape[:2], *out), sample.dtype, "packed")
    t.fill(y, reference_adaptive_forward(mode, x64, out, propagate))
    dy = t.input(y.shape, sample.dtype, sample.layout)
    if mode.is_max:
        dx = F.adaptive_max_pool_backward(dy, x, y, handle=handle)
    else:
        dx = F.adaptive_avg_pool_backward(dy, x, handle=handle)
    return t.values(dx), reference_adaptive_backward(mode, x64, t.values(y), t.values(dy))


def _geometry(pool: PoolingDescriptor) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The (window, padding, stride) arguments of the references."""
    return pool.window, pool.padding, pool.stride


def _propagates(pool: PoolingDescriptor) -> bool:
    return pool.nan_opt is NanPropagation.PROPAGATE_NAN


def samples(size: str = "small") -> Iterator[Sample]:
    """The pooling samples at ``size`` ("small" for the CPU and the interpreter, "large" for a GPU)."""

    def both(variant: str, dtype: DataType = DataType.FLOAT, **kw: Any) -> Iterator[Sample]:
        geometry = variant.partition("/")[2].split("+")[0]
        shape = GEOMETRIES[geometry][1][size]
        yield Sample("pooling_forward", variant, dtype, shape, runner=run_pooling_forward, **kw)
        yield Sample("pooling_backward", variant, dtype, shape, runner=run_pooling_backward, **kw)

    for mode, geometry in itertools.product(PoolingMode, GEOMETRIES):
        if mode.is_max or geometry not in DILATED:
            yield from both(f"{mode.name}/{geometry}", layout="permuted" if geometry == MAIN else "packed")
    for mode, dtype in itertools.product(PoolingMode, FLOAT_TYPES):
        yield from both(f"{mode.name}/{MAIN}+ties", dtype, layout="packed")
    for mode_name, layout in itertools.product(("MAX", "AVERAGE_COUNT_EXCLUDE_PADDING"), LAYOUTS):
        yield from both(f"{mode_name}/k3x2-s1x2-p1x0", DataType.HALF, layout=layout)
    for flags in ("", "+nan"):
        yield from both(f"MAX/{MAIN}{flags}", nan_inputs=True)
        yield from both(f"MAX/k3-s2-p1{flags}", nan_inputs=True, layout="permuted")
    yield from both(f"AVERAGE_COUNT_INCLUDE_PADDING/{MAIN}", nan_inputs=True)
    for mode_name in ("MAX", "AVERAGE_COUNT_INCLUDE_PADDING"):
        yield from both(f"{mode_name}/{MAIN}", alpha=0.5, beta=-0.75, layout="subregion")
        yield from both(f"{mode_name}/k2x3x2-s2x1x2-p1x1x0", DataType.BFLOAT16, alpha=1.5, beta=0.25, layout="permuted")
    yield from both(f"MAX/{DILATED[0]}+ties", DataType.BFLOAT16, layout="permuted")
    for geometry, (flags, layout) in itertools.product((MAIN, *DILATED), (("+ties", "permuted"), ("+nan", "packed"))):
        shape = GEOMETRIES[geometry][1][size]
        nan = flags == "+nan"
        yield Sample(
            "max_pool_indices",
            f"MAX/{geometry}{flags}",
            DataType.FLOAT,
            shape,
            layout,
            nan_inputs=nan,
            runner=run_max_pool_indices,
        )

    for variant, dtype, layout, nan in (  # mode / geometry + flags, dtype, layout, NaN inputs
        ("MAX/a10x10-7x7", DataType.FLOAT, "packed", False),
        ("MAX/a10x10-7x7+ties", DataType.FLOAT, "permuted", False),
        ("MAX/a10x10-7x7", DataType.FLOAT, "permuted", True),
        ("MAX/a10x10-7x7+nan", DataType.FLOAT, "packed", True),
        ("AVERAGE_COUNT_INCLUDE_PADDING/a10x10-7x7", DataType.FLOAT, "permuted", False),
        ("MAX/a13x8-5x4+ties", DataType.BFLOAT16, "permuted", False),
        ("AVERAGE_COUNT_INCLUDE_PADDING/a13x8-5x4", DataType.BFLOAT16, "packed", False),
        ("MAX/a9x6x7-5x3x4+ties", DataType.DOUBLE, "permuted", False),
        ("AVERAGE_COUNT_INCLUDE_PADDING/a9x6x7-5x3x4", DataType.FLOAT, "subregion", False),
        ("MAX/a5-7+ties", DataType.FLOAT, "permuted", False),
        ("AVERAGE_COUNT_INCLUDE_PADDING/a5-7", DataType.DOUBLE, "packed", False),
        ("MAX/a3x13-7x5+nan", DataType.BFLOAT16, "subregion", True),
        ("AVERAGE_COUNT_INCLUDE_PADDING/a3x13-7x5", DataType.HALF, "permuted", False),
    ):
        shape = ADAPTIVE[variant.partition("/")[2].split("+")[0]][0][size]
        for op, runner in (
            ("adaptive_pool_forward", run_adaptive_forward),
            ("adaptive_pool_backward", run_adaptive_backward),
        ):
            yield Sample(op, variant, dtype, shape, layout, nan_inputs=nan, runner=runner)


def error_samples() -> list[ErrorSample]:
    """Bad calls of the poolings and their messages."""
    return [
        ErrorSample(
            "fractional kernel_size",
            F.max_pool,
            lambda: {"x": values(1, 2, 6, 6), "kernel_size": 1.5},
            BadParam,
            "kernel_size=1.5 must be an int",
        ),
        ErrorSample(
            "padding as large as the window",
            F.avg_pool,
            lambda: {"x": values(1, 2, 6, 6), "kernel_size": 2, "padding": 2},
            BadParam,
            "padding[0]=2 must be smaller than kernel_size[0]=2",
        ),
        ErrorSample(
            "pooling mode out of range",
            PoolingDescriptor,
            lambda: {"mode": 7, "nan_opt": NanPropagation.PROPAGATE_NAN, "window": 2, "padding": 0, "stride": 2},
            BadParam,
            "mode=7 must be a PoolingMode: one of PoolingMode.MAX",
        ),
    ]
