"""Host overhead: microseconds of Python per opendnn call through ``opendnn.torch``, kernels stubbed.

Triton runs under its CPU interpreter with every kernel replaced by a no-op, so what is timed is the
host path alone (autocast, autograd, descriptors, problems, dispatch, launch arguments): what a GPU
forward pays per call on top of its kernels. Each op is a converted torch module on a small
channels-last input under bf16 autocast, timed for the inference forward (eval, no_grad) and for a
training step (forward, ``.float().sum()``, backward). ``torch floor`` is a module of torch's own
``x + x``: the module, autocast and autograd cost every row includes; ``add`` is opendnn's
``functional.add`` called directly (forward only: converted models keep torch's ``+``); ``bn_fwd`` and
``bn_bwd`` are ``functional.batch_norm``'s training forward and ``batch_norm_backward`` called
directly on the bf16 input (float32 parameters, saved statistics given).

    PYTHONPATH=. python benchmarks/host_overhead.py [--repeats N] [--profile OP [--train]]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["OPENDNN_BACKEND"] = "triton"

import torch  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import opendnn.functional as F  # noqa: E402
import opendnn.torch as ot  # noqa: E402


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x


def modules() -> dict[str, torch.nn.Module]:
    """The ops of a ResNet, each alone, and the conv + batch norm + relu block they form."""
    return {
        "torch floor": Add(),
        "conv": torch.nn.Conv2d(64, 64, 3, padding=1, bias=False),
        "batch_norm": torch.nn.BatchNorm2d(64),
        "relu": torch.nn.ReLU(),
        "max_pool": torch.nn.MaxPool2d(3, 2, 1),
        "linear": torch.nn.Linear(256, 64),
        "conv+bn+relu": torch.nn.Sequential(
            torch.nn.Conv2d(64, 64, 3, padding=1, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU()
        ),
    }


def microseconds(step: Callable[[], object], repeats: int, rounds: int = 3) -> float:
    """The best of ``rounds`` averages over ``repeats`` calls (the least disturbed by other work)."""
    best = float("inf")
    for _ in range(rounds):
        step()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best * 1e6


def steps(module: torch.nn.Module, x: torch.Tensor) -> tuple[Callable[[], None], Callable[[], None]]:
    """(inference forward, training step) of ``module`` on ``x`` under bf16 autocast."""

    def forward() -> None:
        module.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            module(x)

    def train() -> None:
        module.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = module(x.requires_grad_())
        y.float().sum().backward()

    return forward, train


def profile(step: Callable[[], object], repeats: int) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(repeats)])
    pstats.Stats(profiler).sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument(
        "--profile",
        help="cProfile this op's inference forward ('fused': conv+bn+relu through "
        "opendnn.torch.fuse; 'add', 'bn_fwd', 'bn_bwd': those calls)",
    )
    parser.add_argument("--train", action="store_true", help="profile the training step instead")
    args = parser.parse_args()
    InterpretedFunction.run = lambda self, *a, **k: None  # the host path only: kernels do nothing
    torch.manual_seed(0)
    x = torch.randn(8, 64, 16, 16).contiguous(memory_format=torch.channels_last)
    print(f"{'op':14} {'forward us':>11} {'train step us':>14}")
    for name, module in modules().items():
        module = module.to(memory_format=torch.channels_last)
        ot.convert(module)
        forward, train = steps(module, (x.reshape(8, -1)[:, :256] if name == "linear" else x).detach().clone())
        print(f"{name:14} {microseconds(forward, args.repeats):11.1f} {microseconds(train, args.repeats):14.1f}")
        if name == args.profile:
            profile(train if args.train else forward, args.repeats)
    # the last module, conv+bn+relu, through opendnn.torch.fuse: folded for inference, bn+relu as one for training
    fused_forward, _ = steps(ot.fuse(module.eval()), x.detach().clone())
    _, fused_train = steps(ot.fuse(module.train()), x.detach().clone())
    print(
        f"{'fused c+b+r':14} {microseconds(fused_forward, args.repeats):11.1f} "
        f"{microseconds(fused_train, args.repeats):14.1f}"
    )
    if args.profile == "fused":
        profile(fused_train if args.train else fused_forward, args.repeats)
    half = x.bfloat16()
    # batch norm's training calls through opendnn.functional alone: no module, autocast or autograd
    weight, bias, mean, var = torch.rand(64) + 0.5, torch.randn(64), torch.zeros(64), torch.ones(64)
    _, state = F.batch_norm_add_activation(half, None, mean, var, weight, bias, activation=None, return_state=True)
    dy = torch.randn_like(half)
    calls = {
        "add": lambda: F.add(half, half),
        "bn_fwd": lambda: F.batch_norm(half, mean, var, weight, bias, training=True),
        "bn_bwd": lambda: F.batch_norm_backward(dy, half, weight, state.saved_mean, state.saved_inv_std),
    }
    for name, call in calls.items():
        print(f"{name:14} {microseconds(call, args.repeats):11.1f} {'-':>14}")
        if args.profile == name:
            profile(call, args.repeats)


if __name__ == "__main__":
    main()
