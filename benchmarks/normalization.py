"""Benchmark cases of LRN, layer norm and RMS norm against torch, same inputs, same process.

Suite ``normalization``:
    lrn5_{fwd,bwd}_{nchw,nhwc}   cross-channel LRN, n = 5 (alpha 1e-4, beta 0.75, k 2), on a
                                 64 x 256 x 56 x 56 activation. torch composes it from pad, avg_pool
                                 and pow (``F.local_response_norm``); its backward is autograd
                                 through that composition (so torch's time includes its forward).
    layernorm_{fwd,bwd}          32768 x 4096 rows with weight and bias. torch: ``F.layer_norm``
                                 and ``aten.native_layer_norm_backward`` (dx, dweight, dbias).
    rmsnorm_{fwd,bwd}            32768 x 4096 rows with weight. torch: ``F.rms_norm`` and
                                 ``aten._fused_rms_norm_backward`` (dx, dweight).

Bytes counted (the same for both sides): forward reads x and writes y; backward reads x and dy
and writes dx (the parameters and per-row statistics are under 0.1% and not counted). Backward
cases check dx against torch's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, desc_of, nbytes, out_of_place

import opendnn
from opendnn import LRNDescriptor, LRNMode, NormDescriptor, NormMode

aten = torch.ops.aten
SHAPES = {
    "lrn": {"full": (64, 256, 56, 56), "quick": (8, 256, 56, 56), "tiny": (2, 6, 5, 7)},
    "rows": {"full": (32768, 4096), "quick": (4096, 4096), "tiny": (33, 70)},
}
LRN = LRNDescriptor(5, 1e-4, 0.75, 2.0)
EPS = 1e-5


def _lrn_input(ctx: Context, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = torch.randn(SHAPES["lrn"][ctx.size], dtype=dtype, device=ctx.device)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _torch_lrn(x: torch.Tensor) -> torch.Tensor:
    if not x.is_cuda and x.dtype == torch.bfloat16:  # torch's CPU avg_pool3d has no bfloat16 (CPU smoke runs only)
        return F.local_response_norm(x.float(), LRN.n, LRN.alpha, LRN.beta, LRN.k).to(x.dtype)
    return F.local_response_norm(x, LRN.n, LRN.alpha, LRN.beta, LRN.k)


def lrn_forward(channels_last: bool):
    """``y = lrn(x)``: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _lrn_input(ctx, dtype, channels_last)
        y = torch.empty_like(x)
        x_desc, y_desc = desc_of(x), desc_of(y)
        return out_of_place(
            lambda: opendnn.lrn_cross_channel_forward(
                ctx.handle, LRN, LRNMode.CROSS_CHANNEL_DIM1, 1.0, x_desc, x, 0.0, y_desc, y
            ),
            lambda: _torch_lrn(x),
            y,
            nbytes(x, y),
            tuple(x.shape),
        )

    return build


def lrn_backward(channels_last: bool):
    """``dx = d lrn(x)/dx . dy``: reads x and dy, writes dx (y is passed but not read)."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = _lrn_input(ctx, dtype, channels_last)
        dy = torch.randn_like(x)
        y = _torch_lrn(x)
        dx = torch.empty_like(x)
        descs = [desc_of(t) for t in (x, y, dy, dx)]

        def torch_backward() -> torch.Tensor:
            xr = x.detach().requires_grad_()
            return torch.autograd.grad(_torch_lrn(xr), xr, dy)[0]

        return out_of_place(
            lambda: opendnn.lrn_cross_channel_backward(
                ctx.handle,
                LRN,
                LRNMode.CROSS_CHANNEL_DIM1,
                1.0,
                descs[1],
                y,
                descs[2],
                dy,
                descs[0],
                x,
                0.0,
                descs[3],
                dx,
            ),
            torch_backward,
            dx,
            nbytes(x, dy, dx),
            tuple(x.shape),
        )

    return build


def _rows(ctx: Context, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = SHAPES["rows"][ctx.size]
    x = torch.randn(rows, cols, dtype=dtype, device=ctx.device)
    weight = 1 + 0.1 * torch.randn(1, cols, dtype=dtype, device=ctx.device)
    bias = 0.1 * torch.randn(1, cols, dtype=dtype, device=ctx.device)
    return x, weight, bias


def norm_forward(mode: NormMode):
    """``y = norm(x) * weight (+ bias)`` per row: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x, weight, bias = _rows(ctx, dtype)
        rms = mode is NormMode.RMS_NORM
        bias = None if rms else bias
        y = torch.empty_like(x)
        desc, x_desc, y_desc, p_desc = NormDescriptor(mode, EPS), desc_of(x), desc_of(y), desc_of(weight)
        shape = (x.shape[1],)

        def torch_forward() -> torch.Tensor:
            if rms:
                return F.rms_norm(x, shape, weight[0], EPS)
            return F.layer_norm(x, shape, weight[0], bias[0], EPS)

        return out_of_place(
            lambda: opendnn.normalization_forward_inference(
                ctx.handle, desc, 1.0, x_desc, x, p_desc, weight, bias, 0.0, y_desc, y
            ),
            torch_forward,
            y,
            nbytes(x, y),
            tuple(x.shape),
        )

    return build


def norm_backward(mode: NormMode):
    """dx, dweight (and dbias) per row: reads x and dy (and the saved statistics), writes dx."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x, weight, bias = _rows(ctx, dtype)
        rms = mode is NormMode.RMS_NORM
        dy, dx = torch.randn_like(x), torch.empty_like(x)
        dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
        shape = (x.shape[1],)
        stats_dims = (x.shape[0], 1)
        mean = None if rms else torch.empty(stats_dims, dtype=torch.float32, device=ctx.device)
        rstd = torch.empty(stats_dims, dtype=torch.float32, device=ctx.device)
        desc, p_desc, s_desc = NormDescriptor(mode, EPS), desc_of(weight), desc_of(rstd)
        x_desc = desc_of(x)
        opendnn.normalization_forward_training(
            ctx.handle,
            desc,
            1.0,
            x_desc,
            x,
            p_desc,
            weight,
            None if rms else bias,
            0.0,
            x_desc,
            torch.empty_like(x),
            s_desc,
            mean,
            rstd,
        )
        if rms:
            _, torch_rstd = aten._fused_rms_norm(x, list(shape), weight[0], EPS)
        else:
            _, torch_mean, torch_rstd = aten.native_layer_norm(x, list(shape), weight[0], bias[0], EPS)

        def torch_backward() -> torch.Tensor:
            if rms and not x.is_cuda:  # the fused kernel is CUDA-only (CPU smoke runs use autograd)
                xr = x.detach().requires_grad_()
                return torch.autograd.grad(F.rms_norm(xr, shape, weight[0], EPS), xr, dy)[0]
            if rms:
                return aten._fused_rms_norm_backward(dy, x, list(shape), torch_rstd, weight[0], [True, True])[0]
            return aten.native_layer_norm_backward(
                dy, x, list(shape), torch_mean, torch_rstd, weight[0], bias[0], [True, True, True]
            )[0]

        return out_of_place(
            lambda: opendnn.normalization_backward(
                ctx.handle,
                desc,
                1.0,
                0.0,
                1.0,
                0.0,
                x_desc,
                x,
                desc_of(dy),
                dy,
                p_desc,
                weight,
                dweight,
                None if rms else dbias,
                s_desc,
                mean,
                rstd,
                desc_of(dx),
                dx,
            ),
            torch_backward,
            dx,
            nbytes(x, dy, dx),
            tuple(x.shape),
        )

    return build


SUITES: dict[str, list[Case]] = {
    "normalization": [
        Case("lrn5_fwd_nchw", "normalization", lrn_forward(False)),
        Case("lrn5_fwd_nhwc", "normalization", lrn_forward(True)),
        Case("lrn5_bwd_nchw", "normalization", lrn_backward(False)),
        Case("lrn5_bwd_nhwc", "normalization", lrn_backward(True)),
        Case("layernorm_fwd", "normalization", norm_forward(NormMode.LAYER_NORM)),
        Case("layernorm_bwd", "normalization", norm_backward(NormMode.LAYER_NORM)),
        Case("rmsnorm_fwd", "normalization", norm_forward(NormMode.RMS_NORM)),
        Case("rmsnorm_bwd", "normalization", norm_backward(NormMode.RMS_NORM)),
    ]
}
