"""Softmax benchmark cases: opendnn's softmax_forward / softmax_backward beside torch's softmax,
log_softmax and ``_softmax_backward_data`` (same inputs, same process).

Suite ``softmax``:
    rows          softmax over the last dim of 32768 x 4096 (transformer rows), forward and backward,
                  and log-softmax forward;
    long_row      64 rows of 1,048,576 (few rows: the two-pass kernels split each row);
    channel_nchw  CHANNEL mode on NCHW 64 x 1000 x 7 x 7 (a reduction across a strided dim).

Bytes: forward reads x and writes y; backward reads y and dy and writes dx.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from suites import Bench, Case, Context, desc_of, nbytes, out_of_place

import opendnn

aten = torch.ops.aten

# "full" is the real shape, "quick" a GPU smoke run, "tiny" the CPU smoke run (odd sizes: masked tails run)
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "rows": {"full": (32768, 4096), "quick": (4096, 4096), "tiny": (33, 70)},
    "long_row": {"full": (64, 1 << 20), "quick": (8, 1 << 20), "tiny": (2, 5000)},
    "channel_nchw": {"full": (64, 1000, 7, 7), "quick": (16, 1000, 7, 7), "tiny": (2, 33, 3, 5)},
}


Build = Callable[[Context, torch.dtype], Bench]


def forward(
    shape_name: str, mode: opendnn.SoftmaxMode, algo: opendnn.SoftmaxAlgorithm = opendnn.SoftmaxAlgorithm.ACCURATE
) -> Build:
    """``y = softmax(x)`` (or log-softmax) over the mode's dims: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        dims = SHAPES[shape_name][ctx.size]
        x = ctx.randn(dims, dtype, 3.0)
        y = torch.empty_like(x)
        x_desc, y_desc = desc_of(x), desc_of(y)
        theirs = torch.log_softmax if algo is opendnn.SoftmaxAlgorithm.LOG else torch.softmax
        return out_of_place(
            lambda: opendnn.softmax_forward(ctx.handle, algo, mode, 1.0, x_desc, x, 0.0, y_desc, y),
            lambda: theirs(x, 1),
            y,
            nbytes(x, y),
            dims,
        )

    return build


def backward(shape_name: str, mode: opendnn.SoftmaxMode) -> Build:
    """``dx = y * (dy - sum(dy * y))``: reads y and dy, writes dx (torch: ``_softmax_backward_data``)."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        dims = SHAPES[shape_name][ctx.size]
        y = torch.softmax(ctx.randn(dims, dtype, 3.0), 1)
        dy, dx = ctx.randn(dims, dtype), torch.empty_like(y)
        y_desc, dy_desc, dx_desc = desc_of(y), desc_of(dy), desc_of(dx)
        return out_of_place(
            lambda: opendnn.softmax_backward(
                ctx.handle, opendnn.SoftmaxAlgorithm.ACCURATE, mode, 1.0, y_desc, y, dy_desc, dy, 0.0, dx_desc, dx
            ),
            lambda: aten._softmax_backward_data(dy, y, 1, dtype),
            dx,
            nbytes(y, dy, dx),
            dims,
        )

    return build


INSTANCE, CHANNEL = opendnn.SoftmaxMode.INSTANCE, opendnn.SoftmaxMode.CHANNEL
SOFTMAX = [
    Case("softmax_fwd", "softmax", forward("rows", INSTANCE)),
    Case("softmax_bwd", "softmax", backward("rows", INSTANCE)),
    Case("log_softmax_fwd", "softmax", forward("rows", INSTANCE, opendnn.SoftmaxAlgorithm.LOG)),
    Case("softmax_long_row_fwd", "softmax", forward("long_row", INSTANCE)),
    Case("softmax_long_row_bwd", "softmax", backward("long_row", INSTANCE)),
    Case("softmax_channel_nchw_fwd", "softmax", forward("channel_nchw", CHANNEL)),
    Case("softmax_channel_nchw_bwd", "softmax", backward("channel_nchw", CHANNEL)),
]

SUITES: dict[str, list[Case]] = {"softmax": SOFTMAX}
