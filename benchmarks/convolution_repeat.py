"""Convolution kernels checked for races and timed: per layer and direction, the error against
float64 over repeated runs, whether the outputs of six runs are bitwise equal, and the GPU time
(replayed from a CUDA graph) beside cuDNN's. A race shows as a spread of errors and unequal runs
(docs/design/convolution.md, "The 8-warp race").

    PYTHONPATH=. python3 benchmarks/convolution_repeat.py
"""

from __future__ import annotations

import torch
import triton
from convolution_kernels import DATA, FILTER, FWD, Case

from opendnn.core.dtypes import DataType

# (C, H=W, K, R=S, stride, groups), batch: the stride-1 ResNet-50 shapes that the TMA kernels read
SHAPES = (
    ((256, 14, 256, 3, 1, 1), 64),
    ((128, 28, 128, 3, 1, 1), 32),
    ((512, 7, 512, 3, 1, 1), 64),
    ((64, 56, 64, 3, 1, 1), 64),
    ((1024, 14, 256, 1, 1, 1), 64),
)
ERROR_RUNS, EQUAL_RUNS = 4, 6


def main() -> None:
    print("| C | H | R | direction | error vs float64 (min-max) | runs bitwise equal | us | cuDNN us | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for shape, n in SHAPES:
        for direction in (FWD, DATA, FILTER):
            case = Case(shape, direction, DataType.BFLOAT16, n=n)
            errors = [case.error() for _ in range(ERROR_RUNS)]
            outputs = []
            for _ in range(EQUAL_RUNS):
                case.run()
                outputs.append(case.output().clone())
            equal = all(torch.equal(outputs[0], o) for o in outputs[1:])
            ours = triton.testing.do_bench_cudagraph(case.run, rep=20, return_mode="median")
            theirs = triton.testing.do_bench_cudagraph(case.torch_call(), rep=20, return_mode="median")
            print(
                f"| {shape[0]} | {shape[1]} | {shape[3]} | {direction.name} | {min(errors):.2e}-{max(errors):.2e} | "
                f"{equal} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {theirs / ours:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
