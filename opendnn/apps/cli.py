"""The ``opendnn`` command (also ``python -m opendnn``): ``demo``, ``check``, ``bench``, ``warmup`` and
``info``.
Its help, exit statuses included, is DESCRIPTION and each subcommand's."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
import zlib
from collections import Counter
from typing import NamedTuple

import opendnn
from opendnn.apps import bench, demo, warmup
from opendnn.apps.command_line import (
    TRITON_PACKAGES,
    USAGE_ERROR,
    CommandError,
    HelpFormatter,
    add_backend_option,
    add_command,
    add_device_option,
    create_handle,
    missing_packages,
    require_packages,
)
from opendnn.apps.terminal import ProgressBar, table
from opendnn.samples import Sample, relative_error, samples

DESCRIPTION = """\
opendnn: deep-learning primitives (the job of NVIDIA's cuDNN) with Triton kernels for CUDA
devices and a NumPy reference backend that runs anywhere.

exit status: 0 on success, 1 when a check fails or a needed package is missing, 2 for a bad
command line."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
        sys.stdout.flush()
    except CommandError as error:
        print(f"{args.prog}: error: {error}", file=sys.stderr)
        return error.status
    except BrokenPipeError:  # the reader left (``opendnn check | head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opendnn", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"opendnn {opendnn.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo_parser = add_command(
        commands, "demo", "train a small CNN on the 8x8 digits with opendnn alone", demo.DESCRIPTION
    )
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=run_demo, prog=demo_parser.prog)

    check = add_command(
        commands,
        "check",
        "run every operation's samples against the float64 reference",
        "Runs every operation's samples (random inputs, outputs poisoned with NaN) on one device\n"
        "and backend and compares each output with the float64 reference. Samples that need a\n"
        "package that is not installed (torch) are skipped and counted.",
    )
    add_device_option(check)
    add_backend_option(check)
    check.add_argument(
        "--filter", default="", help="only samples whose name contains this text (default: %(default)r, every sample)"
    )
    check.set_defaults(run=run_check, prog=check.prog)

    bench.add_arguments(
        add_command(commands, "bench", "check or time one problem given on the command line", bench.DESCRIPTION)
    )

    warmup.add_arguments(
        add_command(
            commands, "warmup", "compile a model's kernels ahead of its first step, in parallel", warmup.DESCRIPTION
        )
    )

    info = add_command(
        commands,
        "info",
        "print version, backends found and devices",
        "Prints opendnn's version, the versions of NumPy, torch and Triton, and the devices.",
    )
    info.set_defaults(run=run_info, prog=info.prog)
    return parser


def run_demo(args: argparse.Namespace) -> int:
    require_packages("the digits demo", demo.PACKAGES, "demo")
    return demo.main(args)


def run_info(args: argparse.Namespace) -> int:
    print(f"opendnn {opendnn.__version__} (version() = {opendnn.version()})")
    print(f"python {platform.python_version()} on {platform.machine()}")
    for name in ("numpy", "torch", "triton"):
        try:
            module = __import__(name)
            print(f"{name:8s}{module.__version__}")
        except ImportError:
            print(f"{name:8s}not installed")
    print("backends: numpy" + ("" if missing_packages(TRITON_PACKAGES) else ", triton"))
    if not missing_packages({"torch": "torch"}):
        import torch

        for index in range(torch.cuda.device_count()):
            print(f"device cuda:{index}: {torch.cuda.get_device_name(index)}")
    print("device cpu")
    return 0


class SampleResult(NamedTuple):
    sample: Sample
    error: float  # relative to the float64 reference; NaN when the call raised
    passed: bool
    seconds: float


def run_check(args: argparse.Namespace) -> int:
    handle = create_handle(args.device, args.backend)
    every = list(samples())
    chosen = [s for s in every if args.filter in s.name]
    if not chosen:
        raise CommandError(f"--filter {args.filter!r} matches none of the {len(every)} samples", USAGE_ERROR)
    bar = ProgressBar()
    results: list[SampleResult] = []
    skipped: Counter[str] = Counter()  # missing package -> samples it stopped
    failures = 0
    for done, sample in enumerate(chosen, 1):
        try:
            results.append(_run_sample(sample, handle, bar))
            failures += not results[-1].passed
        except ModuleNotFoundError as error:
            if error.name not in TRITON_PACKAGES:  # a sample stopped by a missing package is skipped
                raise
            skipped[TRITON_PACKAGES[error.name]] += 1
        bar.show(done, len(chosen), f"failures: {failures}")
    bar.clear()
    if results:
        rows = [
            (
                r.sample.op,
                r.sample.variant,
                r.sample.dtype.value,
                "x".join(map(str, r.sample.shape)),
                r.sample.layout,
                handle.backend,
                f"{r.error:.2e}",
                "pass" if r.passed else "FAIL",
                f"{r.seconds * 1000:.1f}",
            )
            for r in results
        ]
        header = ("op", "variant", "dtype", "shape", "layout", "backend", "rel. error", "result", "ms")
        print("\n".join(table(header, rows, right=("rel. error", "ms"))) + "\n")
    summary = f"{len(results) - failures} of {len(results)} samples pass on {handle.device} ({handle.backend})"
    for package, count in skipped.items():
        summary += f"; {count} skipped: they need {package}, not installed here (pip install {package})"
    print(summary)
    if not results:
        raise CommandError("no sample ran: install what the skipped samples need")
    return 1 if failures else 0


def _run_sample(sample: Sample, handle: opendnn.Handle, bar: ProgressBar) -> SampleResult:
    """Runs ``sample`` (seeded by its name) and measures it; an opendnn error fails it, named on
    its own line."""
    start = time.perf_counter()
    try:
        actual, expected = sample.run(handle, seed=zlib.crc32(sample.name.encode()))
        error = relative_error(actual, expected)
    except opendnn.OpenDnnError as exc:
        bar.line(f"{sample.name}: {type(exc).__name__}: {exc}")
        error = math.nan
    return SampleResult(sample, error, error <= sample.tolerance, time.perf_counter() - start)


if __name__ == "__main__":
    sys.exit(main())
