"""The CPU convolution (the NumPy backend's im2col + BLAS matmul) beside torch's CPU convolution, on
the ResNet-50 layers of ``convolution_kernels.LAYERS`` at batch 8, float32, all three directions,
in one process on the same inputs (each result checked against torch's before it is timed).

    PYTHONPATH=. python3 benchmarks/cpu.py [--batch 8] [--repeats 5] [--layers r50_l1_3x3,...]

Runs of the two alternate and the best of ``--repeats`` counts. Prints one row per layer and
direction: milliseconds of each, GFLOP/s of opendnn and ratio = torch / opendnn (above 1 is faster
than torch).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from convolution_kernels import LAYERS

import opendnn as od


def descriptor(tensor: torch.Tensor) -> od.TensorDescriptor:
    return od.TensorDescriptor(tensor.dtype, tuple(tensor.shape), tensor.stride())


def best_of(calls: list[Callable[[], object]], repeats: int) -> list[float]:
    """The best time in seconds of each call, the calls alternating ``repeats`` times."""
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for k, call in enumerate(calls):
            start = time.perf_counter()
            call()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def layer_calls(layer: str, batch: int) -> dict[str, tuple[Callable[[], object], Callable[[], object], float]]:
    """Per direction: (opendnn call, torch call, FLOPs), opendnn's output checked against torch's."""
    c, h, k, r, s, g = LAYERS[layer]
    pad = r // 2
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, c, h, h, generator=generator)
    w = torch.randn(k, c // g, r, r, generator=generator)
    y_torch = F.conv2d(x, w, None, s, pad, 1, g)
    dy = torch.randn(y_torch.shape, generator=generator)
    y, dx, dw = torch.empty_like(y_torch), torch.empty_like(x), torch.empty_like(w)
    handle = od.create("cpu")
    conv_desc = od.ConvolutionDescriptor((pad, pad), (s, s), (1, 1), group_count=g)
    x_desc, w_desc, y_desc = descriptor(x), descriptor(w), descriptor(y)
    calls = {
        "forward": (
            lambda: od.convolution_forward(
                handle, 1.0, x_desc, x, w_desc, w, conv_desc, od.ConvolutionFwdAlgo.IMPLICIT_GEMM, None, 0.0, y_desc, y
            ),
            lambda: F.conv2d(x, w, None, s, pad, 1, g),
            y,
        ),
        "backward_data": (
            lambda: od.convolution_backward_data(
                handle, 1.0, w_desc, w, y_desc, dy, conv_desc, od.ConvolutionBwdDataAlgo.ALGO_0, None, 0.0, x_desc, dx
            ),
            lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, s, pad, 1, g),
            dx,
        ),
        "backward_filter": (
            lambda: od.convolution_backward_filter(
                handle, 1.0, x_desc, x, y_desc, dy, conv_desc, od.ConvolutionBwdFilterAlgo.ALGO_0, None, 0.0, w_desc, dw
            ),
            lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, s, pad, 1, g),
            dw,
        ),
    }
    flops = 2.0 * y_torch.numel() * (c // g) * r * r
    for ours, theirs, out in calls.values():
        ours()
        torch.testing.assert_close(out, theirs(), rtol=1e-3, atol=1e-2)
    return {direction: (ours, theirs, flops) for direction, (ours, theirs, _) in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated names of LAYERS")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch}, float32")
    print("| layer | direction | torch ms | opendnn ms | opendnn GFLOP/s | torch / opendnn |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for layer in args.layers.split(","):
        for direction, (ours, theirs, flops) in layer_calls(layer, args.batch).items():
            ours_s, theirs_s = best_of([ours, theirs], args.repeats)
            print(
                f"| {layer} | {direction} | {theirs_s * 1e3:.1f} | {ours_s * 1e3:.1f} | "
                f"{flops / ours_s / 1e9:.1f} | {theirs_s / ours_s:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
