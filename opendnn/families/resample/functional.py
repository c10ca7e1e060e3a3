"""The Pythonic resampling functions: ``interpolate`` with torch's signature and rules (nearest,
nearest-exact, linear, bilinear, trilinear, bicubic, and area as the pooling family's adaptive
average) and its backward, of arrays with any strides (outputs keep
the input's memory order).

The output size is ``size``, or ``floor(in * scale_factor)`` per spatial dim. The coordinates use the
scale ``1 / scale_factor`` where a scale factor is given (unless ``recompute_scale_factor``), else
``in / out``; ``align_corners=True`` maps the corner pixels' centres onto each other, as torch's.
See ``problem.py`` for the taps and weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from opendnn.core.arrays import allocate, empty_like, keyed_bound, packed_like, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import TensorDescriptor, check_finite, check_ints
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.errors import BadParam, NotSupported, Status, require
from opendnn.core.handle import Handle
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.pooling import functional as pooling
from opendnn.families.resample.problem import InterpolationMode, resample_problem

Size = int | Sequence[int]
Factor = float | Sequence[float]

# torch's mode names -> (the mode, the input rank it needs or None for any of 3 to 5); "area" is the
# pooling family's adaptive average (torch's too)
MODES: dict[str, tuple[InterpolationMode | None, int | None]] = {
    "nearest": (InterpolationMode.NEAREST, None),
    "nearest-exact": (InterpolationMode.NEAREST_EXACT, None),
    "linear": (InterpolationMode.LINEAR, 3),
    "bilinear": (InterpolationMode.LINEAR, 4),
    "trilinear": (InterpolationMode.LINEAR, 5),
    "bicubic": (InterpolationMode.CUBIC, 4),
    "area": (None, None),
}


def _geometry(
    x_desc: TensorDescriptor,
    size: Size | None,
    scale_factor: Factor | None,
    mode: str,
    align_corners: bool | None,
    recompute_scale_factor: bool | None,
) -> tuple[InterpolationMode | None, bool, tuple[int, ...], tuple[float, ...] | None]:
    """torch's argument rules: the mode (None: area), align_corners, the output's spatial size and the
    scales the coordinates use (None: in / out)."""
    ndim = x_desc.ndim
    if not isinstance(mode, str) or mode not in MODES:
        raise BadParam(f"mode={mode!r} is not a mode: interpolate computes {sorted(MODES)}")
    kind, rank = MODES[mode]
    require(3 <= ndim <= 5, f"input.ndim={ndim} must be 3, 4 or 5: (N, C, *spatial) with 1 to 3 spatial dims")
    if rank is not None and ndim != rank:
        raise BadParam(f"mode={mode!r} needs an input of {rank} dims, not input.ndim={ndim}")
    if align_corners is not None and (kind is None or kind.taps == 1):
        raise BadParam(
            f"align_corners={align_corners} with mode={mode!r}: only the linear modes and bicubic align corners"
        )
    spatial, in_sizes = ndim - 2, x_desc.dims[2:]
    if (size is None) == (scale_factor is None):
        raise BadParam("give exactly one of size and scale_factor")
    if size is not None:
        out = check_ints("size", size, spatial)
        for k, o in enumerate(out):
            require(o >= 1, f"size[{k}]={o} must be at least 1")
        if recompute_scale_factor:
            raise BadParam("recompute_scale_factor=True needs scale_factor, not size")
        return kind, bool(align_corners), out, None
    factors = scale_factor if isinstance(scale_factor, Sequence) else (scale_factor,) * spatial
    factors = tuple(check_finite(f"scale_factor[{k}]", f) for k, f in enumerate(factors))
    require(len(factors) == spatial, f"scale_factor={list(factors)} must hold one factor per spatial dim ({spatial})")
    out = tuple(math.floor(n * f) for n, f in zip(in_sizes, factors))
    for k, (f, o) in enumerate(zip(factors, out)):
        require(f > 0 and o >= 1, f"scale_factor[{k}]={f} gives an output size of {o} from {in_sizes[k]}: needs >= 1")
    exact = not recompute_scale_factor and not align_corners
    return kind, bool(align_corners), out, tuple(1.0 / f for f in factors) if exact else None


@caller_dtypes
def interpolate(
    input: Any,
    size: Size | None = None,
    scale_factor: Factor | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
    *,
    handle: Handle | None = None,
) -> Any:
    """``input`` (N, C, *spatial) resampled to ``size`` or by ``scale_factor`` (as torch.nn.functional.interpolate).

    Raises:
        BadParam: both or neither of size and scale_factor, an unknown mode, a linear or the bicubic
            mode at the wrong rank, align_corners with a nearest mode or area, an output size below 1.
        NotSupported: antialias=True, a non-float dtype.
    """
    return _resample(input, None, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias, handle)


@caller_dtypes
def interpolate_backward(
    grad_output: Any,
    input: Any,
    size: Size | None = None,
    scale_factor: Factor | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    *,
    handle: Handle | None = None,
) -> Any:
    """The gradient of ``interpolate(input, size, scale_factor, mode, ...)`` from ``grad_output``: a new
    array of grad_output's kind and device with ``input``'s shape, dtype and memory order. Its values
    are never read, so ``input`` may also be its ``TensorDescriptor`` (dims, strides and dtype alone).

    Raises:
        BadParam: ``grad_output`` not of the forward's output shape, or a rule of ``interpolate``.
    """
    arguments = (size, scale_factor, mode, align_corners, recompute_scale_factor, False, handle)
    return _resample(input, grad_output, *arguments, backward=True)


def _resample(
    x: Any,
    dy: Any | None,
    size: Size | None,
    scale_factor: Factor | None,
    mode: str,
    align_corners: bool | None,
    recompute_scale_factor: bool | None,
    antialias: bool,
    handle: Handle | None,
    backward: bool = False,
) -> Any:
    """The forward of the input ``x`` (an array), or (``backward``) the gradient of ``x`` from ``dy``:
    ``x`` an array, or its TensorDescriptor, as the backward reads no value of it."""
    scalars = (size, scale_factor, mode, align_corners, recompute_scale_factor)
    described = backward and isinstance(x, TensorDescriptor)
    if described:  # keyed by its values, as an array by its array_key
        key = signature("interpolate_backward", (dy,), (*scalars, x.dtype, x.dims, x.strides))
    else:
        key = signature("interpolate_backward" if backward else "interpolate", (x, dy), scalars)
    caller = dy if backward else x  # the array the call reads, whose kind and device its output takes
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:
            device = key[1][-1]
            source = keyed_bound("grad_output" if backward else "input", plan.extra, caller, device)
            out = allocate(source, plan.outputs[0])
            execute(handle, plan, source, out)
            return to_caller_kind(out.view, caller)
    if antialias:
        raise NotSupported("antialias=True is not implemented: interpolate computes without antialiasing")
    source = wrap("grad_output" if backward else "input", caller)
    if described:
        x_desc = x
    else:
        x_desc = wrap("input", x).desc if backward else source.desc
    kind, aligned, out_size, scales = _geometry(x_desc, size, scale_factor, mode, align_corners, recompute_scale_factor)
    expected = (*x_desc.dims[:2], *out_size)
    if backward and source.desc.dims != expected:
        raise BadParam(
            f"grad_output.shape={list(source.desc.dims)} must be the forward's output shape {list(expected)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    if kind is None:  # area: the mean over torch's adaptive windows
        if not backward:
            return pooling.adaptive_avg_pool(x, out_size, handle=handle)
        return pooling.adaptive_avg_pool_backward(dy, x, handle=handle)
    if backward:
        out = allocate(source, packed_like(x_desc, x_desc.dtype, x_desc.dims))
    else:
        out = empty_like(source, dims=expected)
    problem = resample_problem(
        kind,
        ("grad_output", "input") if backward else ("input", "output"),
        (source.desc, out.desc),
        scales=scales,
        align_corners=aligned,
        backward=backward,
    )
    handle = handle_for(source, handle)
    implementation = dispatch(handle, "resample", problem, source, out)
    keep(handle, key, Plan("resample", problem, (out.desc,), implementation, source.desc))
    return to_caller_kind(out.view, caller)
