"""Benchmark cases of pooling against torch (cuDNN / ATen pooling kernels), same inputs, same process.

Suite ``pooling``: ResNet-50's stem max pool (3x3, stride 2, padding 1), an average pool (2x2,
stride 2), a global average pool (torch's ``adaptive_avg_pool2d(x, 1)``, as in squeeze-and-excitation
blocks and classifier heads) and a global max pool (``adaptive_max_pool2d(x, 1)``) on a 64 x 256 x 56 x 56
activation, stored NCHW and NHWC, forward and backward.

Bytes counted (the same for both sides): forward reads x and writes y; max backward reads x, y and
dy and writes dx (cuDNN's contract: the argmax is recomputed, no index tensor); average backward
reads dy and writes dx. torch's max backward is timed as
``aten.max_pool2d_with_indices_backward`` (the global max's as ``aten.adaptive_max_pool2d_backward``) with
the indices computed once outside the timed call (torch reads its int64 indices instead of x and y, so the
comparison favours torch); torch's average backward is ``aten.avg_pool2d_backward``, its global average's
``aten._adaptive_avg_pool2d_backward``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, desc_of, nbytes, out_of_place

import opendnn
from opendnn import NanPropagation, PoolingDescriptor, PoolingMode

aten = torch.ops.aten
SHAPES = {"full": (64, 256, 56, 56), "quick": (8, 256, 56, 56), "tiny": (2, 6, 9, 11)}
MAX_3X3 = ("max", 3, 2, 1)  # kind, window, stride, padding
AVG_2X2 = ("avg", 2, 2, 0)
GLOBAL_AVG = ("global", 0, 0, 0)  # the window is the input's spatial size
GLOBAL_MAX = ("globalmax", 0, 0, 0)


def _input(ctx: Context, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = torch.randn(SHAPES[ctx.size], dtype=dtype, device=ctx.device)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _descriptor(x: torch.Tensor, kind: str, window: int, stride: int, padding: int) -> PoolingDescriptor:
    mode = PoolingMode.MAX if kind in ("max", "globalmax") else PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING
    whole = kind in ("global", "globalmax")
    windows = tuple(x.shape[2:]) if whole else (window,) * 2
    strides = windows if whole else (stride,) * 2
    return PoolingDescriptor(mode, NanPropagation.PROPAGATE_NAN, windows, (padding,) * 2, strides)


def _torch_forward(kind: str, window: int, stride: int, padding: int) -> Callable[[torch.Tensor], torch.Tensor]:
    if kind == "max":
        return lambda x: F.max_pool2d(x, window, stride, padding)
    if kind == "global":
        return lambda x: F.adaptive_avg_pool2d(x, 1)
    if kind == "globalmax":
        return lambda x: F.adaptive_max_pool2d(x, 1)
    return lambda x: F.avg_pool2d(x, window, stride, padding)


def forward(geometry: tuple[str, int, int, int], channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    """``y = pool(x)``: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _input(ctx, dtype, channels_last)
        torch_pool = _torch_forward(*geometry)
        y = torch.empty_like(torch_pool(x))
        pool, x_desc, y_desc = _descriptor(x, *geometry), desc_of(x), desc_of(y)
        return out_of_place(
            lambda: opendnn.pooling_forward(ctx.handle, pool, 1.0, x_desc, x, 0.0, y_desc, y),
            lambda: torch_pool(x),
            y,
            nbytes(x, y),
            tuple(x.shape),
        )

    return build


def backward(geometry: tuple[str, int, int, int], channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    """dx from x, y and dy (max) or dy alone (average): the bytes in the module docstring."""
    kind, window, stride, padding = geometry

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _input(ctx, dtype, channels_last)
        if kind == "max":
            y, indices = F.max_pool2d(x, window, stride, padding, return_indices=True)
        elif kind == "globalmax":
            y, indices = F.adaptive_max_pool2d(x, 1, return_indices=True)
        else:
            y = _torch_forward(*geometry)(x)
        dy = torch.randn_like(y)
        dx = torch.empty_like(x)
        pool = _descriptor(x, *geometry)
        descs = [desc_of(t) for t in (y, dy, x, dx)]

        def run_opendnn() -> None:
            opendnn.pooling_backward(ctx.handle, pool, 1.0, descs[0], y, descs[1], dy, descs[2], x, 0.0, descs[3], dx)

        if kind == "max":

            def run_torch() -> torch.Tensor:
                return aten.max_pool2d_with_indices_backward(
                    dy, x, [window] * 2, [stride] * 2, [padding] * 2, [1, 1], False, indices
                )

            moved = nbytes(x, y, dy, dx)
        elif kind == "globalmax":

            def run_torch() -> torch.Tensor:
                return aten.adaptive_max_pool2d_backward(dy, x, indices)

            moved = nbytes(x, y, dy, dx)
        elif kind == "global":

            def run_torch() -> torch.Tensor:
                return aten._adaptive_avg_pool2d_backward(dy, x)

            moved = nbytes(dy, dx)
        else:

            def run_torch() -> torch.Tensor:
                return aten.avg_pool2d_backward(dy, x, [window] * 2, [stride] * 2, [padding] * 2, False, True, None)

            moved = nbytes(dy, dx)
        return out_of_place(run_opendnn, run_torch, dx, moved, tuple(x.shape))

    return build


POOLING = [
    Case(f"{name}_{layout}_{direction}", "pooling", build(geometry, layout == "nhwc"))
    for name, geometry in (
        ("maxpool3s2", MAX_3X3),
        ("avgpool2s2", AVG_2X2),
        ("globalavg", GLOBAL_AVG),
        ("globalmax", GLOBAL_MAX),
    )
    for layout in ("nchw", "nhwc")
    for direction, build in (("fwd", forward), ("bwd", backward))
]

SUITES: dict[str, list[Case]] = {"pooling": POOLING}
