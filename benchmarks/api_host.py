"""Host cost per call of the cuDNN-shaped API: microseconds of Python per call, kernels stubbed.

Triton runs under its CPU interpreter with every kernel replaced by a no-op (as in
``host_overhead.py``), so what is timed is the host path alone: descriptor checks, the problem,
dispatch, the plan and the launch arguments. The calls are a ResNet-50 layer's: the 3x3 convolution
of its first stage (64 -> 64 channels, 56 x 56) in its three directions, a 1x1 forward (64 -> 256), the
stem's 3x3 max pooling, a batch norm training forward and a relu, on bf16 channels-last CPU tensors
of batch 8, each call with the same descriptors and arrays every time (as a network's step makes it);
VGG's 7 x 7 adaptive average pooling over a 320-pixel image's 10 x 10 map (512 channels: cells of 2 and 3
positions at steps of 1 and 2, one launch), forward and backward;
and the Pythonic attention forward and backward of GPT-2 small's shape (8 x 12 heads x 1,024 x 64,
causal, fp16).
Each row is the best of ``--rounds`` averages over ``--repeats`` calls, in the thread's CPU time.
``--profile NAME`` prints a cProfile of one row.

    PYTHONPATH=. python benchmarks/api_host.py [--repeats N] [--rounds N] [--profile conv_fwd_3x3]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["OPENDNN_BACKEND"] = "triton"

import torch  # noqa: E402
from host_overhead import microseconds, profile  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import opendnn as od  # noqa: E402
import opendnn.functional as F  # noqa: E402

BATCH = 8


def tensor(*dims: int) -> tuple[od.TensorDescriptor, torch.Tensor]:
    """A bf16 channels-last N, C, H, W tensor (a vector when given one dim) and its descriptor."""
    if len(dims) == 1:
        array = torch.randn(1, dims[0], 1, 1)
    else:
        array = torch.randn(dims).contiguous(memory_format=torch.channels_last).bfloat16()
    return od.TensorDescriptor(array.dtype, array.shape, array.stride()), array


def calls(handle: od.Handle) -> dict[str, Callable[[], None]]:
    """The ResNet-50 calls, each bound to its descriptors and arrays."""
    nhwc = od.TensorFormat.NHWC
    x_desc, x = tensor(BATCH, 64, 56, 56)
    y_desc, y = tensor(BATCH, 64, 56, 56)
    w_desc = od.FilterDescriptor(od.DataType.BFLOAT16, nhwc, 64, 64, 3, 3)
    w = torch.randn(64, 64, 3, 3).contiguous(memory_format=torch.channels_last).bfloat16()
    conv = od.ConvolutionDescriptor(pad=(1, 1), stride=(1, 1), dilation=(1, 1))
    wide_desc, wide = tensor(BATCH, 256, 56, 56)
    w1_desc = od.FilterDescriptor(od.DataType.BFLOAT16, nhwc, 256, 64, 1, 1)
    w1 = torch.randn(256, 64, 1, 1).contiguous(memory_format=torch.channels_last).bfloat16()
    conv1 = od.ConvolutionDescriptor(pad=(0, 0), stride=(1, 1), dilation=(1, 1))
    stem_desc, stem = tensor(BATCH, 64, 112, 112)
    pool = od.PoolingDescriptor(od.PoolingMode.MAX, od.NanPropagation.NOT_PROPAGATE_NAN, (3, 3), (1, 1), (2, 2))
    stat_desc, scale = tensor(64)
    bias, mean, var = torch.randn_like(scale), torch.zeros_like(scale), torch.ones_like(scale)
    save_mean, save_inv = torch.empty_like(scale), torch.empty_like(scale)
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    fwd, bwd_data, bwd_filter = od.ConvolutionFwdAlgo, od.ConvolutionBwdDataAlgo, od.ConvolutionBwdFilterAlgo
    filter_bytes = od.get_convolution_backward_filter_workspace_size(
        handle, x_desc, y_desc, conv, w_desc, bwd_filter.ALGO_0
    )
    workspace = torch.empty(filter_bytes, dtype=torch.uint8) if filter_bytes else None
    # float16: under the interpreter a bfloat16 attention runs on float32 copies of its tensors (Triton
    # 3.6 interprets bfloat16 products wrongly), which a GPU call never makes; float16 takes its path
    q, k, v, out, grad_out = (torch.randn(8, 12, 1024, 64).half() for _ in range(5))
    stats = torch.randn(8, 12, 1024)
    _, vgg = tensor(BATCH, 512, 10, 10)
    _, vgg_dy = tensor(BATCH, 512, 7, 7)
    return {
        "conv_fwd_3x3": lambda: od.convolution_forward(
            handle, 1.0, x_desc, x, w_desc, w, conv, fwd.IMPLICIT_GEMM, None, 0.0, y_desc, y
        ),
        "conv_bwd_data_3x3": lambda: od.convolution_backward_data(
            handle, 1.0, w_desc, w, y_desc, y, conv, bwd_data.ALGO_0, None, 0.0, x_desc, x
        ),
        "conv_bwd_filter_3x3": lambda: od.convolution_backward_filter(
            handle, 1.0, x_desc, x, y_desc, y, conv, bwd_filter.ALGO_0, workspace, 0.0, w_desc, w
        ),
        "conv_fwd_1x1": lambda: od.convolution_forward(
            handle, 1.0, x_desc, x, w1_desc, w1, conv1, fwd.IMPLICIT_GEMM, None, 0.0, wide_desc, wide
        ),
        "max_pool_fwd": lambda: od.pooling_forward(handle, pool, 1.0, stem_desc, stem, 0.0, x_desc, x),
        "bn_fwd_training": lambda: od.batch_normalization_forward_training(
            handle,
            od.BatchNormMode.SPATIAL_PERSISTENT,
            1.0,
            0.0,
            x_desc,
            x,
            y_desc,
            y,
            stat_desc,
            scale,
            bias,
            0.1,
            mean,
            var,
            1e-5,
            save_mean,
            save_inv,
        ),  # fmt: skip
        "relu_fwd": lambda: od.activation_forward(handle, relu, 1.0, x_desc, x, 0.0, y_desc, y),
        "adaptive_avg_fwd_10to7": lambda: F.adaptive_avg_pool(vgg, (7, 7), handle=handle),
        "adaptive_avg_bwd_10to7": lambda: F.adaptive_avg_pool_backward(vgg_dy, vgg, handle=handle),
        "sdpa_fwd_functional": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, handle=handle),
        "sdpa_bwd_functional": lambda: F.scaled_dot_product_attention_backward(
            grad_out, q, k, v, out, stats, is_causal=True, handle=handle
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", help="cProfile this row's call")
    args = parser.parse_args()
    InterpretedFunction.run = lambda self, *a, **k: None  # the host path only: kernels do nothing
    torch.set_num_threads(1)
    torch.manual_seed(0)
    handle = od.create("cpu", backend="triton")
    print(f"{'call':22} {'host us':>8}")
    for name, call in calls(handle).items():
        print(f"{name:22} {microseconds(call, args.repeats, args.rounds):8.1f}")
        if name == args.profile:
            profile(call, args.repeats)


if __name__ == "__main__":
    main()
