"""Host overhead: microseconds of Python per opendnn call through ``opendnn.torch``, kernels stubbed.

Triton runs under its CPU interpreter with every kernel replaced by a no-op, so what is timed is the
host path alone (autocast, autograd, descriptors, problems, dispatch, launch arguments): what a GPU
forward pays per call on top of its kernels. Each op is a torch module on a tiny channels-last float32
input (``TINY``), converted (opendnn, kernels stubbed) and as torch's own module: torch's CPU op on a
tiny input costs about its host path, so the two columns compare per-call host costs. ``--autocast``
runs both under bf16 autocast (opendnn's path then includes the casts; torch's CPU emulates bf16
convolutions and products slowly, so its column is then no host-cost proxy). Both
are timed for the inference forward (eval, no_grad) and for a training step (forward,
``.float().sum()``, backward); the rounds alternate between the two sides and each keeps its best.
``torch floor`` is a module of torch's own ``x + x`` (the module, autocast and autograd cost every row
includes); ``fused`` is conv + bn + relu through ``opendnn.torch.fuse`` against torch's three modules.
``F.relu (calls)`` and the like are torch's functional calls (``torch.nn.functional``) of the module rows'
ops with their parameters, routed by ``opendnn.torch.functional_calls()`` (``(calls)``) or ``enable()``
(``(enabled)``), against the same call unrouted; each round of the routed side runs inside the context, the
training step's backward included (``enable()`` costs milliseconds to enter and leave: not per call).
``add`` is opendnn's ``functional.add`` called directly (converted models keep torch's ``+``); ``bn_fwd``
and ``bn_bwd`` are ``functional.batch_norm``'s training forward and ``batch_norm_backward`` called
directly on a bf16 8 x 64 x 16 x 16 input (float32 parameters, saved statistics given).
``--profile OP`` prints a cProfile of one row. ``--model NAME`` steps a whole converted model instead
(``mobilenet_v2``, ``resnet50``; ``benchmarks/host_models.py``): per step its host time, the calls
that replayed an executable, took the full path or were recorded, every Fallback with its reason,
and the calls that would wait for the GPU.

The module rows go to ``benchmarks/results/host_cpu.json`` (``--results``; ``''`` saves nothing) with
the date, CPU and versions; ``benchmarks/run.py --report`` renders them in BENCHMARKS.md. Run it with
``MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456``
(glibc otherwise maps and faults large allocations anew, and the training rows jump between two modes).

    PYTHONPATH=. python benchmarks/host_overhead.py [--repeats N] [--profile OP [--train]] [--results PATH]
    PYTHONPATH=. python benchmarks/host_overhead.py --model mobilenet_v2 [--batch 2 --size 64 --steps 4]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["OPENDNN_BACKEND"] = "triton"

import host_models  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

import opendnn.functional as F  # noqa: E402
import opendnn.torch as ot  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "host_cpu.json"
TINY = (1, 64, 2, 2)  # N, C, H, W (linear: the 256 features of one row)


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


def functional_calls(modules: dict[str, torch.nn.Module]) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """torch's functional calls of the module rows' ops, with the modules' parameters."""
    conv, linear = modules["conv"], modules["linear"]
    return {
        "relu": TF.relu,
        "conv": lambda x: TF.conv2d(x, conv.weight, None, 1, 1),
        "max_pool": lambda x: TF.max_pool2d(x, 3, 2, 1),
        "linear": lambda x: TF.linear(x, linear.weight, linear.bias),
    }


def microseconds(step: Callable[[], object], repeats: int, rounds: int = 3) -> float:
    """The best of ``rounds`` averages over ``repeats`` calls (the least disturbed by other work)."""
    return alternating([step], repeats, rounds)[0]


Scope = Callable[[], AbstractContextManager[object]]


def alternating(
    steps: list[Callable[[], object]], repeats: int, rounds: int = 3, scopes: list[Scope] | None = None
) -> list[float]:
    """Per step, the best of ``rounds`` averages over ``repeats`` calls, the steps taking turns each
    round (a slow spell of the shared machine then hits every side alike), each step's rounds inside
    its scope (untimed: entered before the first call, left after the last). Timed in the thread's
    CPU time: the wall clock would also count the turns other processes take on a shared machine."""
    best = [float("inf")] * len(steps)
    for _ in range(rounds):
        for k, step in enumerate(steps):
            with (scopes[k] if scopes else nullcontext)():
                step()
                start = time.thread_time()
                for _ in range(repeats):
                    step()
                best[k] = min(best[k], (time.thread_time() - start) / repeats)
    return [value * 1e6 for value in best]


def tiny_input(name: str) -> torch.Tensor:
    x = torch.randn(TINY).contiguous(memory_format=torch.channels_last)
    return x.reshape(1, -1)[:, :256].clone() if name == "linear" else x


def steps(
    module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, autocast: bool = False
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(inference forward, training step) of ``module`` (or of a function) on ``x``, under bf16
    autocast when asked."""
    mode = module.train if isinstance(module, torch.nn.Module) else lambda training: None

    def forward() -> None:
        mode(False)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            module(x)

    def train() -> None:
        mode(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
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
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--profile",
        help="cProfile this op's inference forward ('fused': conv+bn+relu through "
        "opendnn.torch.fuse; 'add', 'bn_fwd', 'bn_bwd': those calls)",
    )
    parser.add_argument("--train", action="store_true", help="profile the training step instead")
    parser.add_argument("--autocast", action="store_true", help="run every module under bf16 autocast")
    parser.add_argument("--results", default=str(RESULTS), help="the results file ('': none)")
    parser.add_argument("--model", choices=sorted(host_models.BUILDERS), help="step this whole model instead")
    parser.add_argument("--modes", default=",".join(host_models.MODES), help="--model's modes, comma-separated")
    parser.add_argument("--batch", type=int, default=2, help="--model's batch")
    parser.add_argument("--size", type=int, default=64, help="--model's image height and width")
    parser.add_argument("--steps", type=int, default=4, help="--model's steps per mode (the first records)")
    args = parser.parse_args()
    InterpretedFunction.run = lambda self, *a, **k: None  # the host path only: kernels do nothing
    # one thread: tiny inputs gain nothing from torch's thread pool, whose synchronization on a shared
    # machine would otherwise dominate torch's column
    torch.set_num_threads(1)
    # the stubbed kernels leave their outputs as the memory held before; where that reads as denormal
    # floats, autograd's accumulation of the gradients costs microcode assists (tens of us, varying
    # with the garbage): flushed to zero, every row pays for its host path alone
    torch.set_flush_denormal(True)
    if args.model:
        for mode in args.modes.split(","):
            host_models.report(args.model, mode.strip(), args.batch, args.size, args.steps)
        return
    torch.manual_seed(0)
    x = torch.randn(8, 64, 16, 16).contiguous(memory_format=torch.channels_last)
    rows: list[dict[str, object]] = []
    print(f"{'op':20} {'mode':10} {'opendnn us':>11} {'torch us':>9} {'ratio':>6}")

    def compare(
        name: str, mode: str, ours: Callable[[], None], theirs: Callable[[], None], routing: Scope = nullcontext
    ) -> None:
        opendnn_us, torch_us = alternating([ours, theirs], args.repeats, args.rounds, [routing, nullcontext])
        ratio = torch_us / opendnn_us
        rows.append({"op": name, "mode": mode, "opendnn_us": round(opendnn_us, 1), "torch_us": round(torch_us, 1)})
        rows[-1]["ratio"] = round(ratio, 2)
        print(f"{name:20} {mode:10} {opendnn_us:11.1f} {torch_us:9.1f} {ratio:6.2f}")
        if name == args.profile and args.train == (mode == "train step"):
            profile(ours, args.repeats)

    torch_modules = modules()
    calls = functional_calls(torch_modules)
    for name, module in torch_modules.items():
        module = module.to(memory_format=torch.channels_last)
        original = copy.deepcopy(module)
        ot.convert(module)
        ours, theirs = steps(module, tiny_input(name), args.autocast), steps(original, tiny_input(name), args.autocast)
        compare(name, "forward", ours[0], theirs[0])
        compare(name, "train step", ours[1], theirs[1])
    # the last module, conv+bn+relu, through opendnn.torch.fuse (folded for inference, bn+relu as one for
    # training) against torch's three modules
    theirs = steps(original, tiny_input("fused"), args.autocast)
    fused_eval, fused_train = ot.fuse(copy.deepcopy(module).eval()), ot.fuse(module.train())
    compare("fused", "forward", steps(fused_eval, tiny_input("fused"), args.autocast)[0], theirs[0])
    compare("fused", "train step", steps(fused_train, tiny_input("fused"), args.autocast)[1], theirs[1])
    # torch's functional calls, routed to opendnn, against the same calls left to torch
    routed = ot.functional_calls()
    for scope, routing in (("calls", lambda: routed), ("enabled", ot.enabled)):
        for name, call in calls.items():
            ours, theirs = steps(call, tiny_input(name), args.autocast), steps(call, tiny_input(name), args.autocast)
            compare(f"F.{name} ({scope})", "forward", ours[0], theirs[0], routing)
            compare(f"F.{name} ({scope})", "train step", ours[1], theirs[1], routing)
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
        print(f"{name:20} {'call':10} {microseconds(call, args.repeats, args.rounds):11.1f}")
        if args.profile == name:
            profile(call, args.repeats)
    if args.results:
        save(Path(args.results), rows, args)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def save(path: Path, rows: list[dict[str, object]], args: argparse.Namespace) -> None:
    """The rows with what they were measured on, replacing the file's previous content."""
    import triton

    import opendnn

    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    run = {
        "date": now[:10],
        "cpu": f"{cpu_name()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "opendnn": opendnn.__version__,
        "python": platform.python_version(),
        "command": "`" + " ".join(["benchmarks/host_overhead.py", *sys.argv[1:]]) + "`",
        "timing": f"Best of {args.rounds} alternating rounds of {args.repeats} calls per side, thread CPU time"
        + (", bf16 autocast" if args.autocast else ", float32"),
        "load": round(os.getloadavg()[0], 2),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": run, "rows": rows}, indent=1) + "\n")
    print(f"saved the rows in {path}")


if __name__ == "__main__":
    main()
