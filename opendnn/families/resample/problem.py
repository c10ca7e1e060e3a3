"""Resampling by interpolation (cudnn-frontend's resample with its NEAREST and BILINEAR modes, torch's
``interpolate``): one operation, its rules and its NumPy reference.

x has dims (N, C, *spatial) with 1 to 3 spatial dims, y (N, C, *out), each in any memory order.
Along each spatial dim, output ``o`` reads the input at a source coordinate ``src(o)`` computed from
the dim's scale ``s`` (input pixels per output pixel):

    NEAREST         src = floor(o * s)                    one tap, i0 = min(src, in - 1)
    NEAREST_EXACT   src = floor((o + 0.5) * s)            one tap, i0 = min(src, in - 1)
    LINEAR          src = max((o + 0.5) * s - 0.5, 0)     (align_corners: src = o * s)
                    two taps, i0 = min(trunc(src), in - 1), i1 = min(i0 + 1, in - 1),
                    weights 1 - l and l with l = src - i0; a dim whose output size is its
                    input's is copied: i0 = i1 = o, weights 1 and 0, whatever the scale
    CUBIC           src = (o + 0.5) * s - 0.5             (align_corners: src = o * s)
                    four taps, b - 1 .. b + 2 with b = floor(src), each clamped to 0 .. in - 1,
                    weights W(1 + t), W(t), W(1 - t), W(2 - t) with t = src - b and Keys' cubic
                    convolution kernel W of a = -0.75: W(x) = ((a + 2) x - (a + 3)) x^2 + 1 for
                    x <= 1, ((a x - 5a) x + 8a) x - 4a for 1 < x < 2

and y is the product of the dims' weights summed over their taps (LINEAR over 2 dims is bilinear,
over 3 trilinear; CUBIC over 2 is bicubic). The scales and coordinates are computed in the compute
dtype (float32, float64 for float64 tensors) exactly as written, so that the taps a kernel picks are
the reference's: the scale is ``in / out`` (align_corners: ``(in - 1) / (out - 1)``, 0 for one
output) unless the caller gives one, rounded to the compute dtype (1 for a LINEAR dim that is copied).
These are torch's rules (its CPU kernels') for ``nearest``, ``nearest-exact``, ``linear`` /
``bilinear`` / ``trilinear`` and ``bicubic``.

Backward, from dy of y's dims: ``dx[i] = sum over outputs o reading i of dy[o] * weight(o, i)``. It is
computed as a gather over the outputs that can read each input (no atomics, the same sum order on
every run).

Results blend as ``out = alpha * result + beta * out`` (out unread when beta == 0).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opendnn.core.descriptors import TensorDescriptor, check_finite, check_float_tensor, check_member
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status, require

MAX_SPATIAL_DIMS = 3


class InterpolationMode(enum.Enum):
    """How an output pixel reads the input; the value is the name the kernels switch on."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest_exact"
    LINEAR = "linear"
    CUBIC = "cubic"

    @property
    def taps(self) -> int:
        """Input pixels an output pixel reads along one dim."""
        return {InterpolationMode.LINEAR: 2, InterpolationMode.CUBIC: 4}.get(self, 1)

    @property
    def behind(self) -> int:
        """How far its first tap lies behind the source coordinate's floor."""
        return 1 if self is InterpolationMode.CUBIC else 0


CUBIC_A = -0.75  # torch's (and OpenCV's) coefficient of the cubic convolution kernel


@dataclass(frozen=True)
class ResampleDescriptor:
    """How a resampling reads its input: the mode, whether LINEAR or CUBIC aligns the corner pixels' centres
    (``align_corners``) and the scales, input pixels per output pixel along each spatial dim (None:
    the sizes' ratio, in / out; 0.5 for a 2x upsampling). Checked against the tensors by each call."""

    mode: InterpolationMode
    align_corners: bool = False
    scales: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ResampleProblem:
    """A validated resampling, forward or backward: descriptors and parameters, no memory.

    ``tensors`` are (x, y) forward and (dy, dx) backward; ``scales`` one per spatial dim, already
    rounded to the compute dtype.
    """

    mode: InterpolationMode
    align_corners: bool
    scales: tuple[float, ...]
    tensors: tuple[TensorDescriptor, TensorDescriptor]
    backward: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    compute_dtype: DataType = DataType.FLOAT


def resample_problem(
    mode: InterpolationMode,
    names: Sequence[str],
    descs: Sequence[TensorDescriptor],
    *,
    scales: Sequence[float] | None = None,
    align_corners: bool = False,
    backward: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
) -> ResampleProblem:
    """The rules every resampling call shares.

    Args:
        names: the descriptors' parameter names, for the error messages ("x_desc", "y_desc").
        descs: (x, y) forward, (dy, dx) backward.
        scales: input pixels per output pixel along each spatial dim (None: in / out, torch's rule
            without a scale factor); not with ``align_corners``, which fixes them.

    Raises:
        BadParam: a mode that is not an InterpolationMode, N or C that differ between the tensors,
            spatial ranks that differ or lie outside 1..3, scales of the wrong count, not finite, not
            positive or outside the compute dtype's normal range, scales or a mode other than LINEAR
            with align_corners, non-finite alpha or beta.
        NotSupported: a non-float dtype.
    """
    mode = check_member("mode", InterpolationMode, mode)
    for name, desc in zip(names, descs):
        check_float_tensor(name, desc)
    (first, second), (a, b) = names, descs
    spatial = a.ndim - 2
    require(
        1 <= spatial <= MAX_SPATIAL_DIMS,
        f"{first}.dims={list(a.dims)} must be (N, C, *spatial) with 1 to {MAX_SPATIAL_DIMS} spatial dims",
    )
    if b.ndim != a.ndim or b.dims[:2] != a.dims[:2]:
        raise BadParam(
            f"{second}.dims={list(b.dims)} must be (N, C, *spatial) with {first}.dims={list(a.dims)}'s N, C "
            f"and {spatial} spatial dims",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    align_corners = bool(align_corners)
    if align_corners and mode.taps == 1:
        raise BadParam(f"align_corners=True with mode {mode.name}: only LINEAR and CUBIC align corners")
    x, y = (b, a) if backward else (a, b)
    compute = DataType.DOUBLE if any(desc.dtype is DataType.DOUBLE for desc in descs) else DataType.FLOAT
    if scales is None:
        scales = source_scales(x.dims[2:], y.dims[2:], align_corners, compute)
    else:
        if align_corners:
            raise BadParam(f"scales={list(scales)} with align_corners=True: aligned corners fix the scales")
        scales = tuple(check_finite(f"scales[{k}]", s) for k, s in enumerate(scales))
        require(len(scales) == spatial, f"scales={list(scales)} must hold one scale per spatial dim ({spatial})")
        real = compute.to_numpy()
        tiny, huge = float(np.finfo(real).tiny), float(np.finfo(real).max)  # (s and the backward's 1 / s finite)
        for k, s in enumerate(scales):
            require(s > 0, f"scales[{k}]={s} must be positive (input pixels per output pixel)")
            require(tiny <= s <= huge, f"scales[{k}]={s} must lie in [{tiny}, {huge}], {compute.name}'s normal range")
        scales = tuple(float(real.type(s)) for s in scales)
    if mode is InterpolationMode.LINEAR:  # a dim of unchanged size is copied, whatever its scale
        scales = tuple(1.0 if n == o else s for s, n, o in zip(scales, x.dims[2:], y.dims[2:]))
    alpha, beta = check_finite("alpha", alpha), check_finite("beta", beta)
    return ResampleProblem(mode, align_corners, scales, (a, b), backward, alpha, beta, compute)


def source_scales(
    in_sizes: Sequence[int], out_sizes: Sequence[int], align_corners: bool, compute: DataType
) -> tuple[float, ...]:
    """Input pixels per output pixel along each dim, divided in the compute dtype as torch divides:
    in / out, or (in - 1) / (out - 1) with aligned corners (0 for a single output)."""
    real = compute.to_numpy().type
    if align_corners:
        return tuple(float(real(n - 1) / real(o - 1)) if o > 1 else 0.0 for n, o in zip(in_sizes, out_sizes))
    return tuple(float(real(n) / real(o)) for n, o in zip(in_sizes, out_sizes))


def source_taps(
    mode: InterpolationMode,
    align_corners: bool,
    scale: float,
    in_size: int,
    out_size: int,
    compute: DataType,
    fused: bool = False,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per output along one dim, its taps as (input index, weight) arrays, one pair per tap, computed
    in the compute dtype as the kernels compute them; ``fused``: the half-pixel source ``s * (o + 0.5)
    - 0.5`` rounded once, as a GPU's fused multiply-add computes it (Triton contracts it on GPUs),
    where the reference rounds the product and the difference apart (the two differ by a unit in the
    last place, which moves a tap where the source lies that close to an integer)."""
    real = compute.to_numpy().type
    o, s = np.arange(out_size, dtype=real), real(scale)
    last = real(in_size - 1)  # (sources clamped before they become integers: a large scale's overflow)
    if mode is InterpolationMode.NEAREST:
        return [(np.minimum(np.floor(o * s), last).astype(np.int64), np.ones(out_size, real))]
    if mode is InterpolationMode.NEAREST_EXACT:
        return [(np.minimum(np.floor((o + real(0.5)) * s), last).astype(np.int64), np.ones(out_size, real))]
    if align_corners:
        source = s * o
    elif fused:  # (the product exact in the wider type, the difference rounded once)
        wide = np.float64 if real is np.float32 else np.longdouble
        source = (wide(s) * (o + real(0.5)).astype(wide) - wide(0.5)).astype(real)
    else:
        source = s * (o + real(0.5)) - real(0.5)
    if mode is InterpolationMode.LINEAR:
        source = np.maximum(source, real(0))
        i0 = np.minimum(source, last).astype(np.int64)
        weight = np.minimum(source - i0.astype(real), real(1))  # (torch's clamp: a source past the last pixel)
        i1 = i0 if in_size == out_size else np.minimum(i0 + 1, in_size - 1)  # (a copied dim: scale 1, weight 0)
        return [(i0, real(1) - weight), (i1, weight)]
    base = np.floor(source)
    t = source - base
    return [
        (np.clip(np.minimum(base, last + 1).astype(np.int64) - 1 + k, 0, in_size - 1), factor)
        for k, factor in enumerate(cubic_weights(t, real))
    ]


def cubic_weights(t: np.ndarray, real: type) -> tuple[np.ndarray, ...]:
    """The four taps' weights of a fraction ``t`` (Keys' kernel at 1 + t, t, 1 - t and 2 - t), as torch
    evaluates them."""
    a, one = real(CUBIC_A), real(1)

    def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        return ((a + real(2)) * x - (a + real(3))) * x * x + one

    def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        return ((a * x - real(5) * a) * x + real(8) * a) * x - real(4) * a

    return far(t + one), near(t), near(one - t), far(one - t + one)


def resampled(problem: ResampleProblem, values: np.ndarray) -> np.ndarray:
    """The problem's result from its input's values (x, or dy for a backward) in ``values``' dtype, one
    spatial dim at a time: the forward gathers each output's taps, the backward adds each output's
    gradient into its taps. Every tap counts, a weight of 0 too (as in torch, a NaN or an infinity read
    with weight 0 gives NaN)."""
    out = values
    for k, (scale, size) in enumerate(zip(problem.scales, problem.tensors[1].dims[2:])):
        axis = 2 + k
        in_size, out_size = (size, out.shape[axis]) if problem.backward else (out.shape[axis], size)
        taps = source_taps(problem.mode, problem.align_corners, scale, in_size, out_size, problem.compute_dtype)
        moved = np.moveaxis(out, axis, 0)  # the dim resampled first: a tap's weights broadcast along the rest
        weights = [(index, factor.astype(values.dtype).reshape(-1, *[1] * (moved.ndim - 1))) for index, factor in taps]
        if problem.backward:
            result = np.zeros((in_size, *moved.shape[1:]), values.dtype)
            for index, factor in weights:
                np.add.at(result, index, moved * factor)
        else:
            result = sum(moved[index] * factor for index, factor in weights)
        out = np.moveaxis(result, 0, axis)
    return out


def reference(problem: ResampleProblem, values: np.ndarray) -> np.ndarray:
    """The problem's result in float64 from its input's values (x, or dy for a backward)."""
    return resampled(problem, values.astype(np.float64))
