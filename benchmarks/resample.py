"""Benchmark cases of resampling by interpolation against torch (ATen's upsample kernels), same inputs,
same process.

Suite ``resample``: the 2x upsampling of a U-Net / FPN decoder (``nn.Upsample(scale_factor=2)``) on a
64 x 256 x 56 x 56 activation, bilinear and nearest, stored NCHW and NHWC, forward and backward, and a
bilinear 2x downsampling (``scale_factor=0.5``, as image pyramids resize).

Bytes counted (the same for both sides): the forward reads x and writes y, the backward reads dy and
writes dx. torch's backward is ``aten.upsample_bilinear2d_backward`` / ``aten.upsample_nearest2d_backward``
(atomic adds on a GPU: its sums change order run to run; opendnn's gather does not).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, desc_of, nbytes, out_of_place

import opendnn
from opendnn import InterpolationMode, ResampleDescriptor

aten = torch.ops.aten
SHAPES = {"full": (64, 256, 56, 56), "quick": (8, 256, 56, 56), "tiny": (2, 6, 9, 11)}
MODES = {"bilinear": InterpolationMode.LINEAR, "nearest": InterpolationMode.NEAREST}


def _input(ctx: Context, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = torch.randn(SHAPES[ctx.size], dtype=dtype, device=ctx.device)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def forward(mode: str, factor: float, channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    """``y = interpolate(x, scale_factor=factor)``: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _input(ctx, dtype, channels_last)
        y = torch.empty_like(F.interpolate(x, scale_factor=factor, mode=mode))
        resample, x_desc, y_desc = ResampleDescriptor(MODES[mode], scales=(1 / factor,) * 2), desc_of(x), desc_of(y)
        return out_of_place(
            lambda: opendnn.resample_forward(ctx.handle, resample, 1.0, x_desc, x, 0.0, y_desc, y),
            lambda: F.interpolate(x, scale_factor=factor, mode=mode),
            y,
            nbytes(x, y),
            tuple(x.shape),
        )

    return build


def backward(mode: str, factor: float, channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    """dx from dy: reads dy, writes dx."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _input(ctx, dtype, channels_last)
        dy = torch.randn_like(F.interpolate(x, scale_factor=factor, mode=mode))
        dx = torch.empty_like(x)
        resample, dy_desc, dx_desc = ResampleDescriptor(MODES[mode], scales=(1 / factor,) * 2), desc_of(dy), desc_of(dx)
        sizes, scales = (list(dy.shape[2:]), list(x.shape)), [factor, factor]

        def run_torch() -> torch.Tensor:
            if mode == "bilinear":
                return aten.upsample_bilinear2d_backward(dy, *sizes, False, *scales)
            return aten.upsample_nearest2d_backward(dy, *sizes, *scales)

        return out_of_place(
            lambda: opendnn.resample_backward(ctx.handle, resample, 1.0, dy_desc, dy, 0.0, dx_desc, dx),
            run_torch,
            dx,
            nbytes(dy, dx),
            tuple(x.shape),
        )

    return build


RESAMPLE = [
    Case(f"{mode}{name}_{layout}_{direction}", "resample", build(mode, factor, layout == "nhwc"))
    for mode, name, factor in (("bilinear", "2x", 2.0), ("nearest", "2x", 2.0), ("bilinear", "half", 0.5))
    for layout in ("nchw", "nhwc")
    for direction, build in (("fwd", forward), ("bwd", backward))
]

SUITES: dict[str, list[Case]] = {"resample": RESAMPLE}
