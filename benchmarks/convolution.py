"""Benchmark cases of convolution against torch (cuDNN, ``cudnn.benchmark`` on), same inputs, same
process; and the workspace each algorithm needs against an im2col buffer.

Suite ``convolution``: the ResNet-50 layers and the depthwise layer of ``LAYERS`` at batch 64,
forward, backward data and backward filter with the algorithm a call that names none takes (the
heuristics' first: IMPLICIT_GEMM, ALGO_0, ALGO_0, unless the backend prefers another, which the
dtype cell then names). bfloat16 and float16 run NHWC activations with KRSC filters; float32 runs NCHW with KCRS
filters, TF32 on both sides (a TENSOR_OP descriptor; torch's cudnn.allow_tf32) and a 2e-3
tolerance. The dtype cell reads ``<layout>_<dtype> ws=<workspace bytes>``. FLOPs: 2 * N * K * P *
Q * (C / groups) * R * S per direction.

Suite ``convolution_networks``: layers of other networks (``NETWORK_LAYERS``: VGG, U-Net, ResNeXt,
ConvNeXt, EfficientNet, MobileNetV2, a 3-D layer, batch 1 and 256), the same three directions.

Suite ``convolution_algorithms``: the forward of four layers with every other applicable algorithm
(IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT), to weigh time against workspace.

Suite ``convolution_fused``: inference of conv -> batch norm -> + residual -> relu as one opendnn call
(the norm folded, ``convolution_bias_activation_forward``) against torch's four ops.

Memory report, no GPU needed (Triton's interpreter answers the workspace queries)::

    PYTHONPATH=. python benchmarks/convolution.py --memory
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, desc_of, nbytes

import opendnn

TF32_TOLERANCE = 2e-3
BATCH = {"full": 64, "quick": 8, "tiny": 2}
TINY_SPATIAL = 9  # largest spatial size of the CPU smoke run


@dataclass(frozen=True)
class Layer:
    """A square convolution layer: C -> K channels over size x size pixels (x depth frames when
    ``depth``: a 3-D convolution with a filt x filt x filt filter), 'same' padding at its dilation."""

    name: str
    c: int
    size: int  # H = W
    k: int
    filt: int  # R = S (= T in 3-D)
    stride: int
    groups: int = 1
    depth: int = 0  # D of a 3-D layer; 0: a 2-D layer
    batch: int = 0  # images of the layer at the full size; 0: the size preset's batch
    dilation: int = 1

    @property
    def pad(self) -> int:
        return self.dilation * (self.filt // 2)

    @property
    def spatial_dims(self) -> int:
        return 3 if self.depth else 2


LAYERS = [
    Layer("r50_conv1", 3, 224, 64, 7, 2),
    Layer("r50_l1_1x1", 64, 56, 64, 1, 1),
    Layer("r50_l1_3x3", 64, 56, 64, 3, 1),
    Layer("r50_l1_1x1up", 64, 56, 256, 1, 1),
    Layer("r50_l2_3x3s2", 128, 56, 128, 3, 2),
    Layer("r50_l3_3x3", 256, 14, 256, 3, 1),
    Layer("r50_l3_1x1", 1024, 14, 256, 1, 1),
    Layer("r50_l4_3x3", 512, 7, 512, 3, 1),
    Layer("dw_3x3_c256", 256, 28, 256, 3, 1, groups=256),
]
# Layers of other networks, never tuned for: dense 3x3 layers of VGG-16 and a U-Net decoder, ResNeXt-50's
# grouped 3x3 (32 groups), ConvNeXt-T's 7x7 and EfficientNet-B0's 5x5 depthwise layers, MobileNetV2's and
# EfficientNet-B0's strided depthwise 3x3 and 5x5, a 3-D 3x3x3 video layer, ResNet-50's 3x3 layers at batch 1
# and one at 256; channel counts that are not multiples of 64 (GoogLeNet's 3x3 over 96 channels, DenseNet-121's
# 3x3 to 32, SqueezeNet's 3x3 over 16, a detector's strided 3x3 over 32), RegNetY's groups of 56 channels,
# and DeepLabV3's dilated 3x3 (dilation 2).
NETWORK_LAYERS = [
    Layer("vgg_3x3_c128_112", 128, 112, 128, 3, 1),
    Layer("vgg_3x3_c512_28", 512, 28, 512, 3, 1),
    Layer("unet_3x3_c128to64_128", 128, 128, 64, 3, 1, batch=16),
    Layer("resnext_3x3_g32_c256_28", 256, 28, 256, 3, 1, groups=32),
    Layer("resnext_3x3_g32_c1024_7", 1024, 7, 1024, 3, 1, groups=32),
    Layer("convnext_dw7x7_c96_56", 96, 56, 96, 7, 1, groups=96),
    Layer("convnext_dw7x7_c384_14", 384, 14, 384, 7, 1, groups=384),
    Layer("effnet_dw5x5_c240_28", 240, 28, 240, 5, 1, groups=240),
    Layer("effnet_dw5x5_c672_14", 672, 14, 672, 5, 1, groups=672),
    Layer("mbv2_dw3x3s2_c144_56", 144, 56, 144, 3, 2, groups=144),
    Layer("effnet_dw5x5s2_c144_56", 144, 56, 144, 5, 2, groups=144),
    Layer("video_3x3x3_c64_16x56", 64, 56, 64, 3, 1, depth=16, batch=8),
    Layer("r50_l1_3x3_batch1", 64, 56, 64, 3, 1, batch=1),
    Layer("r50_l3_3x3_batch1", 256, 14, 256, 3, 1, batch=1),
    Layer("r50_l4_3x3_batch1", 512, 7, 512, 3, 1, batch=1),
    Layer("r50_l3_3x3_batch256", 256, 14, 256, 3, 1, batch=256),
    Layer("googlenet_3x3_c96to128_28", 96, 28, 128, 3, 1),
    Layer("densenet_3x3_c128to32_28", 128, 28, 32, 3, 1),
    Layer("squeezenet_3x3_c16to64_56", 16, 56, 64, 3, 1),
    Layer("detector_3x3s2_c32to64_320", 32, 320, 64, 3, 2, batch=16),
    Layer("regnety_3x3_g4_c224_28", 224, 28, 224, 3, 1, groups=4),
    Layer("deeplab_3x3_dil2_c256_33", 256, 33, 256, 3, 1, dilation=2, batch=16),
]
DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")
DEFAULT_ALGORITHM = {
    "fwd": opendnn.ConvolutionFwdAlgo.IMPLICIT_GEMM,
    "bwd_data": opendnn.ConvolutionBwdDataAlgo.ALGO_0,
    "bwd_filter": opendnn.ConvolutionBwdFilterAlgo.ALGO_0,
}


@contextlib.contextmanager
def cudnn_settings(tf32: bool) -> Iterator[None]:
    """cuDNN as torch's side of every convolution row runs: its algorithm search on, TF32 as ``tf32`` says."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = tf32, True
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


@dataclass
class Problem:
    """A layer's tensors at one dtype: x, w, dy on the device, their descriptors and the conv descriptor."""

    layer: Layer
    dtype: torch.dtype
    x: torch.Tensor
    w: torch.Tensor
    dy: torch.Tensor
    w_desc: opendnn.FilterDescriptor
    conv_desc: opendnn.ConvolutionDescriptor
    label: str

    @property
    def flops(self) -> int:
        return 2 * self.dy.numel() * (self.layer.c // self.layer.groups) * self.layer.filt**self.layer.spatial_dims


def layer_problem(ctx: Context, layer: Layer, dtype: torch.dtype) -> Problem:
    """``layer`` at the context's batch in ``dtype``: channels-last (NHWC, NDHWC) with KRSC filters in
    16 bits, NCHW in float32."""
    n = layer.batch if layer.batch and ctx.size == "full" else BATCH[ctx.size]
    size = min(layer.size, TINY_SPATIAL) if ctx.size == "tiny" else layer.size
    spatial = (min(layer.depth, TINY_SPATIAL) if ctx.size == "tiny" else layer.depth,) if layer.depth else ()
    spatial += (size, size)
    dims = layer.spatial_dims
    channels_last = dtype in (torch.bfloat16, torch.float16)
    if not channels_last:
        memory = torch.contiguous_format
    else:
        memory = torch.channels_last_3d if dims == 3 else torch.channels_last
    x = torch.randn(n, layer.c, *spatial, dtype=dtype, device=ctx.device).contiguous(memory_format=memory)
    w = torch.randn(layer.k, layer.c // layer.groups, *(layer.filt,) * dims, dtype=dtype, device=ctx.device)
    w = w.contiguous(memory_format=memory)
    fmt = opendnn.TensorFormat.NHWC if channels_last else opendnn.TensorFormat.NCHW
    w_desc = opendnn.FilterDescriptor(dtype, fmt, *w.shape)
    compute = opendnn.DataType.DOUBLE if dtype is torch.float64 else opendnn.DataType.FLOAT
    math = opendnn.MathType.TENSOR_OP if dtype is torch.float32 else opendnn.MathType.DEFAULT
    conv_desc = opendnn.ConvolutionDescriptor(
        (layer.pad,) * dims,
        (layer.stride,) * dims,
        (layer.dilation,) * dims,
        opendnn.ConvolutionMode.CROSS_CORRELATION,
        compute,
        layer.groups,
        math,
    )
    y_dims = opendnn.get_convolution_forward_output_dim(conv_desc, desc_of(x), w_desc)
    dy = torch.randn(y_dims, dtype=dtype, device=ctx.device).contiguous(memory_format=memory)
    label = f"{'nhwc' if channels_last else 'nchw'}_{str(dtype).removeprefix('torch.')}"
    return Problem(layer, dtype, x, w, dy, w_desc, conv_desc, label)


def _workspace(ctx: Context, size: int) -> torch.Tensor | None:
    return torch.empty(size, dtype=torch.uint8, device=ctx.device) if size else None


def _torch_backward(p: Problem, mask: list[bool]) -> torch.Tensor:
    layer = p.layer
    grads = torch.ops.aten.convolution_backward(
        p.dy,
        p.x,
        p.w,
        None,
        [layer.stride] * layer.spatial_dims,
        [layer.pad] * layer.spatial_dims,
        [layer.dilation] * layer.spatial_dims,
        False,
        [0] * layer.spatial_dims,
        layer.groups,
        [mask[0], mask[1], False],
    )
    return grads[0] if mask[0] else grads[1]


def _bench(ctx: Context, p: Problem, direction: str, algo: enum.Enum) -> Bench:
    h, cd, wd = ctx.handle, p.conv_desc, p.w_desc
    xd, dyd = desc_of(p.x), desc_of(p.dy)
    layer = p.layer
    if direction == "fwd":
        out = torch.empty_like(p.dy)
        size = opendnn.get_convolution_forward_workspace_size(h, xd, wd, cd, dyd, algo)
        ws = _workspace(ctx, size)

        def run_opendnn() -> None:
            opendnn.convolution_forward(h, 1.0, xd, p.x, wd, p.w, cd, algo, ws, 0.0, dyd, out)

        conv = F.conv3d if layer.depth else F.conv2d

        def run_torch() -> torch.Tensor:
            return conv(p.x, p.w, None, layer.stride, layer.pad, layer.dilation, layer.groups)

        moved = nbytes(p.x, p.w, out)
    elif direction == "bwd_data":
        out = torch.empty_like(p.x)
        size = opendnn.get_convolution_backward_data_workspace_size(h, wd, dyd, cd, xd, algo)
        ws = _workspace(ctx, size)

        def run_opendnn() -> None:
            opendnn.convolution_backward_data(h, 1.0, wd, p.w, dyd, p.dy, cd, algo, ws, 0.0, xd, out)

        def run_torch() -> torch.Tensor:
            return _torch_backward(p, [True, False])

        moved = nbytes(p.dy, p.w, out)
    else:
        out = torch.empty_like(p.w)
        size = opendnn.get_convolution_backward_filter_workspace_size(h, xd, dyd, cd, wd, algo)
        ws = _workspace(ctx, size)

        def run_opendnn() -> None:
            opendnn.convolution_backward_filter(h, 1.0, xd, p.x, dyd, p.dy, cd, algo, ws, 0.0, wd, out)

        def run_torch() -> torch.Tensor:
            return _torch_backward(p, [False, True])

        moved = nbytes(p.x, p.dy, out)
    tf32 = p.dtype is torch.float32

    def torch_call() -> torch.Tensor:
        with cudnn_settings(tf32):
            return run_torch()

    return Bench(
        run_opendnn,
        torch_call,
        out,
        moved,
        lambda: out.fill_(float("nan")),
        tuple(p.x.shape),
        f"{p.label}{algorithm_note(direction, algo)} ws={size}",
        p.flops,
        TF32_TOLERANCE if tf32 else None,
    )


def algorithm_note(direction: str, algo: enum.Enum) -> str:
    """What a row's dtype cell says of its algorithm: its name where it is not the direction's default."""
    return "" if algo is DEFAULT_ALGORITHM[direction] else f" {algo.name}"


def heuristics_choice(ctx: Context, p: Problem, direction: str) -> enum.Enum:
    """The algorithm the heuristics rank first for ``p`` (what a call that names none takes)."""
    h, cd, wd, xd, dyd = ctx.handle, p.conv_desc, p.w_desc, desc_of(p.x), desc_of(p.dy)
    if direction == "fwd":
        ranked = opendnn.get_convolution_forward_algorithm(h, xd, wd, cd, dyd)
    elif direction == "bwd_data":
        ranked = opendnn.get_convolution_backward_data_algorithm(h, wd, dyd, cd, xd)
    else:
        ranked = opendnn.get_convolution_backward_filter_algorithm(h, xd, dyd, cd, wd)
    return ranked[0].algo


def case(layer: Layer, direction: str, algo: enum.Enum | None = None) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        p = layer_problem(ctx, layer, dtype)
        return _bench(ctx, p, direction, algo or heuristics_choice(ctx, p, direction))

    return build


def fused_case(layer: Layer) -> Callable[[Context, torch.dtype], Bench]:
    """Inference of conv -> batch norm (eval) -> + residual -> relu: opendnn's one call with the batch
    norm folded into the filter and bias (what ``opendnn.torch.fuse`` makes of it; the fold is done
    once, before timing) against torch's four ops. The call takes the forward algorithm the
    heuristics rank first, with its workspace, as ``opendnn.torch`` does. The norm's scale is a power
    of two (variance 1 - eps, gamma 2^k), so the folded filter is exact in every dtype and the check
    compares like with like."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        p = layer_problem(ctx, layer, dtype)
        k, eps = layer.k, 1e-5
        gen = torch.Generator(device=ctx.device).manual_seed(0)
        gamma = 2.0 ** torch.randint(-1, 2, (k,), device=ctx.device, generator=gen).float()
        beta, mean = (torch.randn(k, device=ctx.device, generator=gen) for _ in range(2))
        var = torch.full((k,), 1.0 - eps, device=ctx.device)
        weight = (p.w.float() * gamma.view(-1, 1, 1, 1)).to(dtype)  # exact: gamma is a power of two
        bias = (beta - mean * gamma).to(dtype).view(1, k, 1, 1)
        z, out = torch.randn_like(p.dy), torch.empty_like(p.dy)
        xd, yd, h = desc_of(p.x), desc_of(out), ctx.handle
        relu = opendnn.ActivationDescriptor(opendnn.ActivationMode.RELU)
        algo = heuristics_choice(ctx, p, "fwd")
        size = opendnn.get_convolution_forward_workspace_size(h, xd, p.w_desc, p.conv_desc, yd, algo)
        ws = _workspace(ctx, size)

        def run_opendnn() -> None:
            opendnn.convolution_bias_activation_forward(
                h,
                1.0,
                xd,
                p.x,
                p.w_desc,
                weight,
                p.conv_desc,
                algo,
                ws,
                1.0,
                yd,
                z,
                desc_of(bias),
                bias,
                relu,
                yd,
                out,
            )

        def run_torch() -> torch.Tensor:
            with cudnn_settings(dtype is torch.float32):
                y = F.conv2d(p.x, p.w, None, layer.stride, layer.pad, layer.dilation, layer.groups)
                y = F.batch_norm(y, mean.to(dtype), var.to(dtype), gamma.to(dtype), beta.to(dtype), False, 0.0, eps)
                return torch.relu(y + z)

        return Bench(
            run_opendnn,
            run_torch,
            out,
            nbytes(p.x, p.w, z, out),
            lambda: out.fill_(float("nan")),
            tuple(p.x.shape),
            f"{p.label}{algorithm_note('fwd', algo)} conv+bn+add+relu",
            p.flops,
            TF32_TOLERANCE if dtype is torch.float32 else None,
        )

    return build


FWD = opendnn.ConvolutionFwdAlgo
ALGORITHM_CASES = [
    (layer, algo)
    for layer in LAYERS
    if layer.name in ("r50_conv1", "r50_l1_3x3", "r50_l3_1x1", "dw_3x3_c256")
    for algo in (FWD.IMPLICIT_PRECOMP_GEMM, FWD.GEMM, FWD.DIRECT)
    if algo is not FWD.DIRECT or layer.c // layer.groups <= 4
]

SUITES: dict[str, list[Case]] = {
    "convolution": [
        Case(f"{layer.name}_{direction}", "convolution", case(layer, direction))
        for layer in LAYERS
        for direction in DIRECTIONS
    ],
    "convolution_networks": [
        Case(f"{layer.name}_{direction}", "convolution_networks", case(layer, direction))
        for layer in NETWORK_LAYERS
        for direction in DIRECTIONS
    ],
    "convolution_algorithms": [
        Case(f"{layer.name}_fwd_{algo.name.lower()}", "convolution_algorithms", case(layer, "fwd", algo))
        for layer, algo in ALGORITHM_CASES
    ],
    "convolution_fused": [
        Case(f"{layer.name}_fused", "convolution_fused", fused_case(layer))
        for layer in LAYERS
        if layer.groups == 1 and layer.name != "r50_conv1"
    ],
}


# ---- memory report -------------------------------------------------------------------------------


def memory_table(handle: opendnn.Handle, dtype: str = "bfloat16", batch: int = 64) -> str:
    """Markdown: the workspace bytes of every algorithm of every direction on each layer, beside
    the im2col buffer an explicit GEMM convolution materialises (N * P * Q * C * R * S elements)."""
    fmt = opendnn.TensorFormat.NHWC if dtype != "float32" else opendnn.TensorFormat.NCHW
    lines = [
        f"| layer | direction | algorithm | workspace bytes | im2col bytes | ratio ({dtype}, batch {batch}) |",
        "|---|---|---|---|---|---|",
    ]
    queries = {
        "fwd": (
            opendnn.ConvolutionFwdAlgo,
            lambda x, w, c, y, a: opendnn.get_convolution_forward_workspace_size(handle, x, w, c, y, a),
        ),
        "bwd_data": (
            opendnn.ConvolutionBwdDataAlgo,
            lambda x, w, c, y, a: opendnn.get_convolution_backward_data_workspace_size(handle, w, y, c, x, a),
        ),
        "bwd_filter": (
            opendnn.ConvolutionBwdFilterAlgo,
            lambda x, w, c, y, a: opendnn.get_convolution_backward_filter_workspace_size(handle, x, y, c, w, a),
        ),
    }
    for layer in LAYERS:
        x = opendnn.TensorDescriptor.from_format(fmt, dtype, batch, layer.c, layer.size, layer.size)
        w = opendnn.FilterDescriptor(dtype, fmt, layer.k, layer.c // layer.groups, layer.filt, layer.filt)
        conv = opendnn.ConvolutionDescriptor(
            (layer.pad,) * 2, (layer.stride,) * 2, (layer.dilation,) * 2, group_count=layer.groups
        )
        y = opendnn.TensorDescriptor.from_format(fmt, dtype, *opendnn.get_convolution_forward_output_dim(conv, x, w))
        im2col = y.dims[0] * y.dims[2] * y.dims[3] * layer.c * layer.filt**2 * x.dtype.itemsize
        for direction, (algos, query) in queries.items():
            for algo in algos:
                try:
                    size = query(x, w, conv, y, algo)
                except opendnn.NotSupported:
                    continue
                lines.append(
                    f"| {layer.name} | {direction} | {algo.name} | {size:,} | {im2col:,} | {size / im2col:.4f} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="Workspace of every convolution algorithm against im2col.")
    parser.add_argument("--memory", action="store_true", help="print the memory table (the only action)")
    parser.add_argument("--device", default="cpu", help="cpu (Triton's interpreter answers) or cuda:N")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the CPU answers through the interpreter
    if args.memory:
        print(memory_table(opendnn.create(args.device, backend="triton"), args.dtype))


if __name__ == "__main__":
    main()
