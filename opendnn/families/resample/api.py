"""Resampling by interpolation, cuDNN-shaped: the forward and backward of cudnn-frontend's resample
operation in its NEAREST and BILINEAR modes (and torch's nearest-exact and 1-D / 3-D linear), as
calls on a handle with descriptors and alpha / beta.

``y = alpha * resample(x) + beta * y`` and ``dx = alpha * resample'(dy) + beta * dx`` (see
``problem.py`` for the taps and weights). Any dims (N, C and 1 to 3 spatial), any strides.
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import bind
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle
from opendnn.families.resample.problem import ResampleDescriptor, ResampleProblem, resample_problem


def _problem(
    resample_desc: Any,
    names: tuple[str, str],
    descs: tuple[TensorDescriptor, TensorDescriptor],
    backward: bool,
    alpha: float,
    beta: float,
) -> ResampleProblem:
    if not isinstance(resample_desc, ResampleDescriptor):
        raise BadParam(f"resample_desc={resample_desc!r} must be a ResampleDescriptor")
    return resample_problem(
        resample_desc.mode,
        names,
        descs,
        scales=resample_desc.scales,
        align_corners=resample_desc.align_corners,
        backward=backward,
        alpha=alpha,
        beta=beta,
    )


def resample_forward(
    handle: Handle,
    resample_desc: ResampleDescriptor,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * resample(x) + beta * y``; y's spatial dims are the output size. With beta == 0,
    y is never read.

    Raises:
        BadParam: N or C of x and y that differ, spatial ranks that differ or lie outside 1..3, bad
            scales, a tensor past its buffer or on another device, an overlapping y.
        NotSupported: a non-float dtype.
    """
    problem = _problem(resample_desc, ("x_desc", "y_desc"), (x_desc, y_desc), False, alpha, beta)
    xb, yb = bind("x", x_desc, x), bind("y", y_desc, y, output=True)
    dispatch(handle, "resample", problem, xb, yb)


def resample_backward(
    handle: Handle,
    resample_desc: ResampleDescriptor,
    alpha: float,
    dy_desc: TensorDescriptor,
    dy: Any,
    beta: float,
    dx_desc: TensorDescriptor,
    dx: Any,
) -> None:
    """``dx = alpha * resample'(dy) + beta * dx``: each input pixel gathers the gradients of the
    outputs that read it, times their weights. With beta == 0, dx is never read.

    Raises:
        BadParam: N or C of dy and dx that differ, spatial ranks that differ or lie outside 1..3, bad
            scales, a tensor past its buffer or on another device, an overlapping dx.
        NotSupported: a non-float dtype.
    """
    problem = _problem(resample_desc, ("dy_desc", "dx_desc"), (dy_desc, dx_desc), True, alpha, beta)
    dyb, dxb = bind("dy", dy_desc, dy), bind("dx", dx_desc, dx, output=True)
    dispatch(handle, "resample", problem, dyb, dxb)
