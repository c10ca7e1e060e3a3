"""The NumPy backend beside torch's CPU kernels at ResNet-50 shapes, batch 8, float32, in one process on
the same inputs (each result checked against torch's before it is timed): convolution (the layers of
``convolution_kernels.LAYERS``, three directions, through the cuDNN-shaped calls), matrix products
(ResNet-50's fc and transformer rows), max and average pooling (the stem's 3x3 stride-2 pool, the global
average pool), batch norm training forward and backward, softmax over 8 x 1000 and over long rows
(these through ``opendnn.functional`` on NumPy arrays).

    PYTHONPATH=.:benchmarks python3 benchmarks/cpu.py [--batch 8] [--repeats 7] [--ops conv,matmul,...]
        [--directions forward,backward,...] [--results benchmarks/results/cpu.json]

Runs of the two alternate and the best of ``--repeats`` counts. Prints one row per case and direction
(milliseconds of each, ratio = torch / opendnn: above 1 is faster than torch) and writes the rows with
the date, CPU, core count and versions to ``--results`` ('' for none), which
``benchmarks/run.py --report`` renders as the "CPU backend" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from convolution_kernels import LAYERS

import opendnn as od
import opendnn.functional as odf

RESULTS = Path(__file__).resolve().parent / "results" / "cpu.json"
ATEN = torch.ops.aten
Call = Callable[[], object]
Case = tuple[str, str, str, Call, Call]  # op, shape, direction, opendnn call, torch call


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


def layer_calls(layer: str, batch: int) -> dict[str, tuple[Call, Call, float]]:
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


def conv_cases(batch: int, layers: list[str]) -> list[Case]:
    cases = []
    for layer in layers:
        c, h, k, r, s, g = LAYERS[layer]
        shape = f"{layer}: {batch}x{c}x{h}x{h}, {k}x{c // g}x{r}x{r}, stride {s}" + (f", groups {g}" if g > 1 else "")
        for direction, (ours, theirs, _) in layer_calls(layer, batch).items():
            cases.append(("conv", shape, direction, ours, theirs))
    return cases


def checked(op: str, shape: str, direction: str, ours: Call, theirs: Call) -> Case:
    """The case, after opendnn's first output matched torch's (float32 tolerances)."""
    mine, reference = ours(), theirs()
    mine = mine[0] if isinstance(mine, tuple) else mine
    reference = reference[0] if isinstance(reference, tuple) else reference
    torch.testing.assert_close(torch.as_tensor(np.asarray(mine)), reference, rtol=1e-4, atol=1e-4)
    return (op, shape, direction, ours, theirs)


def random(generator: torch.Generator, *shape: int) -> tuple[torch.Tensor, np.ndarray]:
    """A random float32 tensor and the NumPy array sharing its memory."""
    tensor = torch.randn(*shape, generator=generator)
    return tensor, tensor.numpy()


def matmul_cases(batch: int) -> list[Case]:
    """ResNet-50's fc (linear with bias) and the three products of a transformer block at 1024 tokens."""
    generator = torch.Generator().manual_seed(1)
    x, xn = random(generator, batch, 2048)
    w, wn = random(generator, 1000, 2048)
    bias, biasn = random(generator, 1000)
    cases = [
        checked(
            "linear",
            f"{batch}x2048 @ 2048x1000 + bias",
            "forward",
            lambda: odf.linear(xn, wn, biasn),
            lambda: F.linear(x, w, bias),
        )
    ]
    for m, k, n in ((1024, 768, 768), (1024, 768, 3072), (1024, 3072, 768)):
        a, an = random(generator, m, k)
        b, bn = random(generator, k, n)
        cases.append(
            checked(
                "matmul",
                f"{m}x{k} @ {k}x{n}",
                "forward",
                lambda an=an, bn=bn: odf.matmul(an, bn),
                lambda a=a, b=b: torch.matmul(a, b),
            )
        )
    return cases


def pooling_cases(batch: int) -> list[Case]:
    """The stem's 3x3 stride-2 pools (padding 1) on 64 x 112 x 112 and the global average pool of 2048 x 7 x 7."""
    generator = torch.Generator().manual_seed(2)
    x, xn = random(generator, batch, 64, 112, 112)
    stem = f"{batch}x64x112x112, 3x3 stride 2 pad 1"
    y, indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    yn = y.numpy()
    dy, dyn = random(generator, *y.shape)
    cases = [
        checked("max pool", stem, "forward", lambda: odf.max_pool(xn, 3, 2, 1), lambda: F.max_pool2d(x, 3, 2, 1)),
        checked(
            "max pool",
            stem,
            "backward",
            lambda: odf.max_pool_backward(dyn, xn, yn, 3, 2, 1),
            lambda: ATEN.max_pool2d_with_indices_backward(dy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, indices),
        ),
        checked("avg pool", stem, "forward", lambda: odf.avg_pool(xn, 3, 2, 1), lambda: F.avg_pool2d(x, 3, 2, 1)),
        checked(
            "avg pool",
            stem,
            "backward",
            lambda: odf.avg_pool_backward(dyn, xn, 3, 2, 1),
            lambda: ATEN.avg_pool2d_backward(dy, x, [3, 3], [2, 2], [1, 1], False, True, None),
        ),
    ]
    g, gn = random(generator, batch, 2048, 7, 7)
    dg, dgn = random(generator, batch, 2048, 1, 1)
    pooled = f"{batch}x2048x7x7"
    return cases + [
        checked(
            "global avg pool",
            pooled,
            "forward",
            lambda: odf.global_avg_pool(gn),
            lambda: F.adaptive_avg_pool2d(g, 1),
        ),
        checked(
            "global avg pool",
            pooled,
            "backward",
            lambda: odf.avg_pool_backward(dgn, gn, 7),
            lambda: ATEN._adaptive_avg_pool2d_backward(dg, g),
        ),
    ]


def batch_norm_cases(batch: int) -> list[Case]:
    """Training forward (batch statistics, running statistics updated) and backward (from the saved
    statistics) at the ResNet-50 activations after conv1 and in each stage."""
    generator = torch.Generator().manual_seed(3)
    cases = []
    for c, h in ((64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)):
        x, xn = random(generator, batch, c, h, h)
        dy, dyn = random(generator, batch, c, h, h)
        w, wn = random(generator, c)
        b, bn = random(generator, c)
        mean, var = torch.zeros(c), torch.ones(c)
        mean_n, var_n = mean.numpy().copy(), var.numpy().copy()
        _, saved_mean, saved_inv = ATEN.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        sm, si = saved_mean.numpy(), saved_inv.numpy()
        shape = f"{batch}x{c}x{h}x{h}"
        cases += [
            checked(
                "batch norm",
                shape,
                "forward",
                lambda xn=xn, wn=wn, bn=bn, mean_n=mean_n, var_n=var_n: odf.batch_norm(
                    xn, mean_n, var_n, wn, bn, training=True
                ),
                lambda x=x, w=w, b=b, mean=mean, var=var: ATEN.native_batch_norm(x, w, b, mean, var, True, 0.1, 1e-5),
            ),
            checked(
                "batch norm",
                shape,
                "backward",
                lambda dyn=dyn, xn=xn, wn=wn, sm=sm, si=si: odf.batch_norm_backward(dyn, xn, wn, sm, si),
                lambda dy=dy, x=x, w=w, sm=saved_mean, si=saved_inv: ATEN.native_batch_norm_backward(
                    dy, x, w, None, None, sm, si, True, 1e-5, [True, True, True]
                ),
            ),
        ]
    return cases


def softmax_cases(batch: int) -> list[Case]:
    """Softmax over the last dim of ``batch`` x 1000 (classifier rows) and of ``batch`` rows of 2^20."""
    generator = torch.Generator().manual_seed(4)
    cases = []
    for width in (1000, 1 << 20):
        x, xn = random(generator, batch, width)
        y = torch.softmax(x, -1)
        yn = y.numpy()
        dy, dyn = random(generator, batch, width)
        shape = f"{batch}x{width}"
        cases += [
            checked("softmax", shape, "forward", lambda xn=xn: odf.softmax(xn, -1), lambda x=x: torch.softmax(x, -1)),
            checked(
                "softmax",
                shape,
                "backward",
                lambda dyn=dyn, yn=yn: odf.softmax_grad(dyn, yn, -1),
                lambda dy=dy, y=y: torch._softmax_backward_data(dy, y, -1, torch.float32),
            ),
        ]
    return cases


OPS: dict[str, Callable[[argparse.Namespace], list[Case]]] = {
    "conv": lambda args: conv_cases(args.batch, args.layers.split(",")),
    "matmul": lambda args: matmul_cases(args.batch),
    "pooling": lambda args: pooling_cases(args.batch),
    "batch_norm": lambda args: batch_norm_cases(args.batch),
    "softmax": lambda args: softmax_cases(args.batch),
}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(command: str, repeats: int, note: str, load: tuple[float, float]) -> dict[str, Any]:
    """The run's date, CPU, cores, versions and command, as the results file holds them; the note ends
    with the load average at the run's start and end (other work on the cores moves every row, torch's
    threaded kernels most)."""
    load_sentence = f"Load average (1 minute) at the start and end of the run: {load[0]:.1f} and {load[1]:.1f}."
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "opendnn": od.__version__,
        "command": command,
        "timing": f"Best of {repeats} runs, opendnn's and torch's alternating, float32.",
        "note": f"{note} {load_sentence}".strip(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--layers", default=",".join(LAYERS), help="comma-separated names of LAYERS")
    parser.add_argument(
        "--directions", default="", help="comma-separated, of forward, backward, backward_data, backward_filter (all)"
    )
    parser.add_argument("--results", default=str(RESULTS), help="JSON file the rows are written to ('': none)")
    parser.add_argument("--note", default="", help="a sentence shown under the report's table")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, NumPy {np.__version__}, batch {args.batch}")
    load_at_start = os.getloadavg()[0]
    print("| op | shape | direction | torch ms | opendnn ms | torch / opendnn |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    rows = []
    directions = set(args.directions.split(",")) if args.directions else None
    for op in args.ops.split(","):
        for name, shape, direction, ours, theirs in OPS[op](args):
            if directions is not None and direction not in directions:
                continue
            ours_s, theirs_s = best_of([ours, theirs], args.repeats)
            row = {
                "op": name,
                "shape": shape,
                "direction": direction,
                "torch_ms": round(theirs_s * 1e3, 3),
                "opendnn_ms": round(ours_s * 1e3, 3),
                "ratio": round(theirs_s / ours_s, 3),
            }
            rows.append(row)
            print(
                f"| {name} | {shape} | {direction} | {row['torch_ms']:.2f} | {row['opendnn_ms']:.2f} | "
                f"{row['ratio']:.2f} |",
                flush=True,
            )
    if args.results:
        given = list(argv if argv is not None else sys.argv[1:])
        if "--note" in given:  # the note is shown on its own
            del given[given.index("--note") : given.index("--note") + 2]
        command = "`" + " ".join(["benchmarks/cpu.py", *given]) + "`"
        load = (load_at_start, os.getloadavg()[0])
        results = {**machine(command, args.repeats, args.note, load), "rows": rows}
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
