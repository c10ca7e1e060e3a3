"""The ``opendnn`` command: ``opendnn demo`` trains a small CNN on the 8x8 digits with opendnn alone;
``opendnn check`` runs every registered operation's samples on the best available backend against
the float64 reference; ``opendnn info`` prints version, backends and devices."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import zlib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opendnn", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    from opendnn.apps import demo

    demo.add_arguments(commands.add_parser("demo", help="train a small CNN on the 8x8 digits with opendnn alone"))
    check = commands.add_parser("check", help="run every operation's samples against the float64 reference")
    check.add_argument("--device", default=None, help="cpu or cuda:N (default: CUDA when present, else cpu)")
    check.add_argument("--backend", choices=("numpy", "triton"), default=None,
                       help="force a backend (triton on the CPU runs Triton's interpreter)")
    check.add_argument("--filter", default="", help="only samples whose name contains this text")
    commands.add_parser("info", help="print version, backends found and devices")
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "demo":
        return demo.main(args)
    if args.backend == "triton" and (args.device or "cpu") == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton loads
    return run_check(args.device, args.backend, args.filter)


def info() -> int:
    import opendnn

    print(f"opendnn {opendnn.__version__} (version() = {opendnn.version()})")
    print(f"python {platform.python_version()} on {platform.machine()}")
    for name in ("numpy", "torch", "triton"):
        try:
            module = __import__(name)
            print(f"{name:8s}{module.__version__}")
        except ImportError:
            print(f"{name:8s}not installed")
    print("backends: numpy" + (", triton" if _has("triton") and _has("torch") else ""))
    if _has("torch"):
        import torch

        for index in range(torch.cuda.device_count()):
            print(f"device cuda:{index}: {torch.cuda.get_device_name(index)}")
    print("device cpu")
    return 0


def run_check(device: str | None, backend: str | None, name_filter: str) -> int:
    import opendnn
    from opendnn.samples import relative_error, samples

    handle = opendnn.create(device, backend=backend)
    chosen = [s for s in samples() if name_filter in s.name]
    rows, failures = [], 0
    for done, sample in enumerate(chosen, 1):
        start = time.perf_counter()
        try:
            actual, expected = sample.run(handle, seed=zlib.crc32(sample.name.encode()))
            error = relative_error(actual, expected)
            passed = error <= sample.tolerance
        except opendnn.OpenDnnError as exc:
            error, passed = float("nan"), False
            print(f"\n{sample.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        elapsed = time.perf_counter() - start
        failures += not passed
        rows.append((sample, error, passed, elapsed))
        _progress(done, len(chosen), failures)
    print(file=sys.stderr)
    print(f"{'op':20s} {'variant':28s} {'dtype':9s} {'shape':10s} {'layout':10s} {'backend':8s} "
          f"{'rel. error':>10s} {'result':6s} {'ms':>8s}")
    for sample, error, passed, elapsed in rows:
        print(f"{sample.op:20s} {sample.variant:28s} {sample.dtype.value:9s} {'x'.join(map(str, sample.shape)):10s} "
              f"{sample.layout:10s} {handle.backend:8s} {error:10.2e} {'pass' if passed else 'FAIL':6s} "
              f"{elapsed * 1000:8.1f}")
    print(f"\n{len(rows) - failures} of {len(rows)} samples pass on {handle.device} ({handle.backend})")
    return 1 if failures else 0


def _progress(done: int, total: int, failures: int) -> None:
    width = 40
    filled = width * done // total
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  failures: {failures}", end="",
          file=sys.stderr, flush=True)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
