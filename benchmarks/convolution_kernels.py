"""The Triton convolution kernels on the GPU, called directly (no API layer): correctness against
torch and times beside torch/cuDNN on the ResNet-50 layers of ``LAYERS`` (batch 64).

    PYTHONPATH=. python3 benchmarks/convolution_kernels.py --out DIR [--budget SECONDS]

Sections, in order, each started only while ``--budget`` seconds remain: NHWC bfloat16 layers,
other tiles on some layers, small checks of every dtype and algorithm, NCHW float32 layers.
Times are taken twice: per call as a caller sees them (host launch cost included) and replayed
from a CUDA graph (the GPU's time alone). Prints
one table (ratio = torch time / opendnn time, above 1 is faster than cuDNN) and writes
DIR/convolution_kernels.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from opendnn.core.arrays import Bound
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDirection,
    ConvolutionFwdAlgo,
    ConvolutionProblem,
)

FWD, DATA, FILTER = ConvolutionDirection
DEFAULT = {
    FWD: ConvolutionFwdAlgo.IMPLICIT_GEMM,
    DATA: ConvolutionBwdDataAlgo.ALGO_0,
    FILTER: ConvolutionBwdFilterAlgo.ALGO_0,
}
TORCH = {
    DataType.FLOAT: torch.float32,
    DataType.HALF: torch.float16,
    DataType.BFLOAT16: torch.bfloat16,
    DataType.DOUBLE: torch.float64,
}
# name: (C, H=W, K, R=S, stride, groups), batch 64, padding R // 2
LAYERS = {
    "r50_conv1": (3, 224, 64, 7, 2, 1),
    "r50_l1_1x1": (64, 56, 64, 1, 1, 1),
    "r50_l1_3x3": (64, 56, 64, 3, 1, 1),
    "r50_l1_1x1up": (64, 56, 256, 1, 1, 1),
    "r50_l2_3x3s2": (128, 56, 128, 3, 2, 1),
    "r50_l3_3x3": (256, 14, 256, 3, 1, 1),
    "r50_l3_1x1": (1024, 14, 256, 1, 1, 1),
    "r50_l4_3x3": (512, 7, 512, 3, 1, 1),
    "dw_3x3_c256": (256, 28, 256, 3, 1, 256),
}
ATEN = torch.ops.aten


def descriptor(dims, dtype, channels_last):
    order = (0, *range(2, len(dims)), 1) if channels_last else tuple(range(len(dims)))
    strides = [0] * len(dims)
    step = 1
    for k in reversed(order):
        strides[k] = step
        step *= dims[k]
    return TensorDescriptor(dtype, tuple(dims), tuple(strides))


def default_problem(problem):
    """``problem`` with the algorithm opendnn's calls that name none take (``algorithms.default_algorithm``
    on a handle without a workspace limit): the first the backend prefers (an NCHW TF32 forward's
    IMPLICIT_PRECOMP_GEMM, which stages x and the filter), else the direction's default."""
    for algo in type(problem.algo):
        candidate = dataclasses.replace(problem, algo=algo)
        if kernels.supports(candidate) is None and kernels.preferred(candidate):
            return candidate
    return problem


def tensor(desc, fill=True):
    t = torch.empty(desc.extent, dtype=TORCH[desc.dtype], device="cuda").as_strided(desc.dims, desc.strides)
    return t.normal_() if fill else t.fill_(float("nan"))


class Case:
    """One layer, direction, dtype and algorithm: opendnn's call, torch's call, the check."""

    def __init__(self, layer, direction, dtype, channels_last=True, algo=None, n=64, flip=False):
        c, h, k, r, s, g = LAYERS[layer] if isinstance(layer, str) else layer
        p = (h + 2 * (r // 2) - r) // s + 1
        self.direction, self.groups, self.pad, self.stride = direction, g, r // 2, s
        self.x_desc = descriptor((n, c, h, h), dtype, channels_last)
        self.w_desc = descriptor((k, c // g, r, r), dtype, channels_last)
        self.y_desc = descriptor((n, k, p, p), dtype, channels_last)
        self.problem = ConvolutionProblem(
            direction,
            self.x_desc,
            self.w_desc,
            self.y_desc,
            (r // 2,) * 2,
            (r // 2,) * 2,
            (s, s),
            (1, 1),
            g,
            flip,
            DataType.DOUBLE if dtype is DataType.DOUBLE else DataType.FLOAT,
            True,
            algo or DEFAULT[direction],
        )
        if algo is None:
            self.problem = default_problem(self.problem)
        self.flops = 2 * n * p * p * k * (c // g) * r * r
        self.x = tensor(self.x_desc, direction is not DATA)
        self.w = tensor(self.w_desc, direction is not FILTER).mul_(1 / math.sqrt(c // g * r * r))
        self.y = tensor(self.y_desc, direction is not FWD)
        size = kernels.workspace_size(self.problem)
        self.workspace = None
        if size:
            space = torch.empty(size, dtype=torch.uint8, device="cuda")
            self.workspace = Bound("workspace", TensorDescriptor(DataType.UINT8, (size,)), space, "cuda:0")
        self.bounds = [
            Bound(name, d, t, "cuda:0")
            for name, d, t in (("x", self.x_desc, self.x), ("w", self.w_desc, self.w), ("y", self.y_desc, self.y))
        ]

    def run(self):
        kernels.run(self.problem, *self.bounds, None, None, self.workspace)

    def output(self):
        return {FWD: self.y, DATA: self.x, FILTER: self.w}[self.direction]

    def torch_call(self, dtype=None):
        """torch's computation of the same output (inputs cast to ``dtype`` if given)."""
        x, w, y = (t if dtype is None else t.to(dtype) for t in (self.x, self.w, self.y))
        stride, pad, dil = [self.stride] * 2, [self.pad] * 2, [1, 1]
        if self.problem.flip:
            w = w.flip([2, 3])
        if self.direction is FWD:
            return lambda: F.conv2d(x, w, stride=stride, padding=pad, groups=self.groups)
        mask = [self.direction is DATA, self.direction is FILTER, False]
        index = 0 if self.direction is DATA else 1
        return lambda: ATEN.convolution_backward(y, x, w, None, stride, pad, dil, False, [0, 0], self.groups, mask)[
            index
        ]

    def error(self):
        self.output().fill_(float("nan"))
        self.run()
        want = self.torch_call(torch.float64)()
        if self.direction is FILTER and self.problem.flip:
            want = want.flip([2, 3])
        got = self.output().double()
        return (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()


def bench(fn):
    """Median ms per call with the host's launch cost (what a caller sees)."""
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def bench_graph(fn):
    """Median ms per call replayed from a CUDA graph: the GPU's time alone."""
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def use_tile(choose):
    """Make ``choose`` the backend's tile choice (plans are cached per problem: drop them)."""
    kernels.gemm_tile = choose
    kernels.launch_plan.cache_clear()
    kernels._workspace_regions.cache_clear()


def geomean(values):
    return math.exp(sum(map(math.log, values)) / len(values))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out")
    parser.add_argument("--budget", type=float, default=170.0)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, checks = [], []

    def left():
        return args.budget - (time.time() - start)

    def save():
        (out / "convolution_kernels.json").write_text(json.dumps({"rows": rows, "checks": checks}, indent=1))

    def measure(layer, direction, dtype, channels_last=True, label="", host=True):
        case = Case(layer, direction, dtype, channels_last)
        error = case.error()  # compiles; the timed calls and the second check take the cached launch
        ours_gpu, theirs_gpu = bench_graph(case.run), bench_graph(case.torch_call())
        ours, theirs = (bench(case.run), bench(case.torch_call())) if host else (ours_gpu, theirs_gpu)
        error = max(error, case.error())
        row = dict(
            layer=layer,
            direction=direction.name,
            layout=label or ("nhwc" if channels_last else "nchw"),
            dtype=dtype.name,
            error=error,
            ms=ours,
            torch_ms=theirs,
            ratio=theirs / ours,
            gpu_ms=ours_gpu,
            torch_gpu_ms=theirs_gpu,
            gpu_ratio=theirs_gpu / ours_gpu,
            tflops=case.flops / ours_gpu * 1e-9,
            workspace=kernels.workspace_size(case.problem),
        )
        print(
            f"{layer:13s} {direction.name[:13]:13s} {row['layout']:22s} err={error:.0e} ours={ours:.4f} "
            f"torch={theirs:.4f} ratio={theirs / ours:.2f} gpu: {ours_gpu:.4f} {theirs_gpu:.4f} "
            f"{theirs_gpu / ours_gpu:.2f}",
            flush=True,
        )
        save()
        return row

    for layer in LAYERS:
        for direction in (FWD, DATA, FILTER):
            if left() > 0:
                rows.append(measure(layer, direction, DataType.BFLOAT16))

    Tile = kernels.Tile
    tiles = [
        Tile(128, 128, 64, 8, 3),
        Tile(128, 64, 64, 4, 3),
        Tile(64, 128, 64, 4, 4),
        Tile(128, 128, 64, 8, 4),
        Tile(128, 64, 64, 8, 4),
        Tile(256, 128, 64, 8, 3),
        Tile(64, 64, 64, 4, 4),
    ]
    narrow = [
        Tile(128, 64, 32, 4, 3),
        Tile(128, 64, 32, 8, 3),
        Tile(64, 64, 32, 4, 3),
        Tile(128, 64, 64, 8, 3),
        Tile(256, 64, 32, 8, 3),
    ]
    chosen = kernels.gemm_tile
    variants = []
    for layer, direction, options in (
        ("r50_l1_3x3", FWD, tiles),
        ("r50_l4_3x3", FWD, tiles),
        ("r50_l3_1x1", FWD, tiles),
        ("r50_conv1", FWD, narrow),
        ("r50_l3_3x3", FILTER, tiles),
        ("r50_l2_3x3s2", DATA, tiles),
        ("r50_l1_1x1", FWD, tiles),
        ("r50_l1_3x3", FILTER, tiles),
        ("r50_l3_3x3", FWD, tiles),
    ):
        for tile in options:
            if left() > 0:
                use_tile(lambda *args, tile=tile: tile)
                label = f"tile {tile.block_m}x{tile.block_n}x{tile.block_k} w{tile.num_warps} s{tile.num_stages}"
                variants.append(measure(layer, direction, DataType.BFLOAT16, label=label, host=False))
                use_tile(chosen)
    small = (16, 12, 24, 3, 2, 1)
    for dtype in (DataType.FLOAT, DataType.HALF, DataType.DOUBLE):
        for direction, algos in (
            (FWD, list(ConvolutionFwdAlgo)[:4]),
            (DATA, list(ConvolutionBwdDataAlgo)[:2]),
            (
                FILTER,
                [ConvolutionBwdFilterAlgo.ALGO_0, ConvolutionBwdFilterAlgo.ALGO_1, ConvolutionBwdFilterAlgo.ALGO_3],
            ),
        ):
            for algo in algos:
                if left() < 0 or kernels.supports(Case(small, direction, dtype, algo=algo, n=2).problem):
                    continue
                flip = dtype is not DataType.HALF
                case = Case(
                    (4, 12, 8, 3, 2, 4) if algo is ConvolutionFwdAlgo.DIRECT else small,
                    direction,
                    dtype,
                    channels_last=flip,
                    algo=algo,
                    n=2,
                    flip=flip,
                )
                case.problem = dataclasses.replace(case.problem, allow_tf32=False)
                checks.append(
                    dict(
                        dtype=dtype.name,
                        direction=direction.name,
                        algo=algo.name,
                        flip=flip,
                        error=max(case.error(), case.error()),
                    )
                )
    save()
    bad = [c for c in checks if not c["error"] < {"FLOAT": 1e-5, "HALF": 1e-2, "DOUBLE": 1e-10}[c["dtype"]]]
    print(f"\n{len(checks)} small checks (fp32 strict, fp16, fp64; every algorithm; flip), failing: {bad}")

    checks.extend(variants)
    nchw = []
    for layer in LAYERS:
        for direction in (FWD, DATA, FILTER):
            if left() > 0:
                nchw.append(measure(layer, direction, DataType.FLOAT, channels_last=False))
    checks.extend(nchw)
    save()

    table = [
        "| layer | direction | layout | ms | torch ms | ratio | GPU ms | torch GPU ms | GPU ratio | TFLOP/s | "
        "rel. error | workspace B |",
        "|---" * 12 + "|",
    ]
    table += [
        f"| {r['layer']} | {r['direction']} | {r['layout']} {r['dtype']} | {r['ms']:.4f} | {r['torch_ms']:.4f} | "
        f"{r['ratio']:.2f} | {r['gpu_ms']:.4f} | {r['torch_gpu_ms']:.4f} | {r['gpu_ratio']:.2f} | "
        f"{r['tflops']:.0f} | {r['error']:.1e} | {r['workspace']} |"
        for r in rows + nchw
    ]
    for direction in (FWD, DATA, FILTER):
        ratios = [r["ratio"] for r in rows if r["direction"] == direction.name]
        gpu = [r["gpu_ratio"] for r in rows if r["direction"] == direction.name]
        if ratios:
            table.append(
                f"| geomean | {direction.name} | nhwc BFLOAT16 | | | {geomean(ratios):.2f} (min "
                f"{min(ratios):.2f}) | | | {geomean(gpu):.2f} (min {min(gpu):.2f}) | | | |"
            )
    (out / "convolution_kernels.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
