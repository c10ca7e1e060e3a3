"""Benchmark driver: opendnn against torch (cuDNN, cuBLAS, ATen kernels), same process, same inputs.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 benchmarks/run.py --suite all --out results
    PYTHONPATH=. python3 benchmarks/run.py --suite elementwise --dtypes bfloat16 --filter gelu --quick

CPU smoke run (tiny shapes, NumPy backend, or Triton's interpreter)::

    PYTHONPATH=. python benchmarks/run.py --device cpu --quick --suite elementwise
    TRITON_INTERPRET=1 OPENDNN_BACKEND=triton PYTHONPATH=. python benchmarks/run.py --device cpu --quick

For each case (see ``suites.py`` and the modules in ``SUITE_MODULES``) and dtype:

1. Correctness, once: the output opendnn writes is poisoned with NaN (in-place ops start from a fresh
   copy instead), opendnn and torch run once, and ``||opendnn - torch|| / ||torch||`` (in float64)
   must be under 1e-5 for float32 and 1e-2 for bfloat16/float16. A failure or an exception is
   recorded in the row and shown in the table; it is never dropped.
2. Speed: on CUDA, ``triton.testing.do_bench(fn, warmup, rep, return_mode="median")`` for each of
   opendnn and torch (CUDA events around each call, L2 flushed between calls; opendnn's time includes
   its Python dispatch, as a caller pays it). On the CPU, the median of ``time.perf_counter`` runs.
   The two sides alternate over ``--rounds`` rounds (torch, opendnn, torch, ...) and each keeps the
   median of its rounds, so that a clock that drifts (a GPU warming up to its power cap) weighs on
   both alike.
3. GB/s counts the fewest bytes the op must move: each input read once plus the output written once
   (an in-place output counts as read and written). The same byte count serves opendnn and torch.
   ``ratio = torch_ms / opendnn_ms``: above 1, opendnn is faster.

Writes ``<out>/<suite>.json`` (a list of rows: case, dtype, shape, opendnn_ms, torch_ms, gbps,
torch_gbps, tflops, torch_tflops, ratio, check, rel_err, error) and ``<out>/<suite>.md`` (a header with date, device,
torch, Triton, cuDNN and opendnn versions, then the table), and prints the Markdown table last.
A full-size CUDA run also saves its rows in the results file (``--results``, default
``benchmarks/results/h200.json``), replacing the rows it measured (``report.py``).
Exits with status 1 when any row is wrong or raised, 0 otherwise.

The report, from the results file (no GPU needed)::

    python benchmarks/run.py --report      # writes BENCHMARKS.md and benchmarks/results/h200.png
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import report
import torch
from suites import Bench, Case, Context

import opendnn
from opendnn.samples import relative_error

# modules of benchmarks/ holding a SUITES table (suite name -> cases); each family adds its own
SUITE_MODULES = (
    "suites",
    "matmul",
    "convolution",
    "pooling",
    "resample",
    "batch_norm",
    "normalization",
    "softmax",
    "attention",
    "graph",
)
SUITES: dict[str, list[Case]] = {
    name: cases for module in SUITE_MODULES for name, cases in importlib.import_module(module).SUITES.items()
}

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 1e-2}
COLUMNS = [
    "case",
    "dtype",
    "shape",
    "opendnn ms",
    "torch ms",
    "opendnn GB/s",
    "torch GB/s",
    "opendnn TFLOP/s",
    "torch TFLOP/s",
    "ratio",
    "check",
]


def timing(rounds: int) -> str:
    """How a run's rows were timed, as the report prints it."""
    alternation = f"; torch and opendnn alternate over {rounds} rounds, each side the median of its rounds"
    return (
        "Per call: medians of `triton.testing.do_bench` (CUDA events, L2 flushed), host included"
        + (alternation if rounds > 1 else "")
        + "."
    )


Timer = Callable[[Callable[[], Any]], float]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time opendnn against torch on the same inputs; check results.")
    parser.add_argument("--suite", choices=[*SUITES, "all"], default="all")
    parser.add_argument(
        "--dtypes", default="float32,bfloat16", help="comma-separated torch dtype names (default: float32,bfloat16)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller shapes for a smoke run (tiny ones with --device cpu)"
    )
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu")
    parser.add_argument("--out", default="results", help="directory for <suite>.json and <suite>.md")
    parser.add_argument("--filter", default="", help="run only cases whose name contains this text")
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warm-up, ms (default 25)")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench timed repetitions, ms (default 100)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the two sides' timings, alternating (default 3)"
    )
    parser.add_argument(
        "--results",
        default=str(report.RESULTS),
        help="results file a full-size CUDA run saves its rows in and --report reads ('': none; "
        "default benchmarks/results/h200.json)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="write --markdown and --chart from --results and exit (measures nothing, needs no GPU)",
    )
    parser.add_argument("--markdown", default=str(report.MARKDOWN), help="report file (default BENCHMARKS.md)")
    parser.add_argument(
        "--chart", default=str(report.CHART), help="chart of the ratios (default benchmarks/results/h200.png)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report.write_report(Path(args.results), Path(args.markdown), Path(args.chart))
        print(f"wrote {args.markdown} and {args.chart} from {args.results}")
        return 0
    device = "cpu" if args.device == "cpu" else _cuda_device(args.device)
    size = "full" if not args.quick else ("tiny" if device == "cpu" else "quick")
    dtypes = [_torch_dtype(name) for name in args.dtypes.split(",") if name]
    cases = [
        case
        for name, table in SUITES.items()
        if args.suite in (name, "all")
        for case in table
        if args.filter in case.name
    ]
    ctx = Context(opendnn.create(device), device, size)
    results = Path(args.results) if args.results and device != "cpu" and size == "full" else None
    if results is not None and results.exists():  # before hours of measuring: does the file hold this GPU?
        report.check_gpu(report.load(results), torch.cuda.get_device_name(device), results)
    torch.manual_seed(0)
    timer = _cuda_timer(args.warmup, args.rep) if device != "cpu" else _cpu_timer(args.rep)

    rows: list[dict[str, Any]] = []
    measured: dict[str, list[dict[str, Any]]] = {}  # suite -> its rows as the results file keeps them
    for case in cases:
        for dtype in dtypes:
            row = measure(case, ctx, dtype, timer, args.rounds)
            print(_progress_line(row), flush=True)
            rows.append(row)
            measured.setdefault(case.suite, []).append({key: value for key, value in row.items() if value is not None})

    if results is not None:
        command = " ".join(["benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)])
        run = report.gpu_run(torch.cuda.get_device_name(device), command, timing(args.rounds))
        report.save_run(results, run, measured)
        print(f"saved the rows in {results}")
    markdown = _markdown(args.suite, environment(ctx), rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.suite}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / f"{args.suite}.md").write_text(markdown)
    print(f"\nwrote {out / (args.suite + '.json')} and {out / (args.suite + '.md')}\n")
    print(markdown)
    return 0 if all(row["check"] == "ok" for row in rows) else 1


def measure(case: Case, ctx: Context, dtype: torch.dtype, timer: Timer, rounds: int = 1) -> dict[str, Any]:
    """Build, check, then time one case in one dtype, torch and opendnn alternating over ``rounds``
    rounds (each side the median of its rounds); every failure becomes part of the row."""
    row: dict[str, Any] = {
        "case": case.name,
        "dtype": _dtype_name(dtype),
        "shape": None,
        "opendnn_ms": None,
        "torch_ms": None,
        "gbps": None,
        "torch_gbps": None,
        "tflops": None,
        "torch_tflops": None,
        "ratio": None,
        "check": "error",
        "rel_err": None,
        "error": None,
    }
    try:
        bench = case.build(ctx, dtype)
    except Exception as error:  # a missing API or a refused problem is a result, not a crash
        row["error"] = f"build: {_describe(error)}"
        return row
    row["shape"] = "x".join(str(d) for d in bench.shape)
    row["dtype"] = bench.dtype_label or row["dtype"]
    row["check"], row["rel_err"], row["error"] = check(bench)
    try:
        sides = [bench.torch, bench.opendnn] if row["check"] != "error" else [bench.torch]
        times = [[timer(side) for side in sides] for _ in range(rounds)]
        row["torch_ms"] = statistics.median(t[0] for t in times)
        row["torch_gbps"] = _gbps(bench.nbytes, row["torch_ms"])
        row["torch_tflops"] = _tflops(bench.flops, row["torch_ms"])
        if row["check"] != "error":
            row["opendnn_ms"] = statistics.median(t[1] for t in times)
            row["gbps"] = _gbps(bench.nbytes, row["opendnn_ms"])
            row["tflops"] = _tflops(bench.flops, row["opendnn_ms"])
            row["ratio"] = row["torch_ms"] / row["opendnn_ms"]
    except Exception as error:
        row["check"], row["error"] = "error", f"timing: {_describe(error)}"
    return row


def check(bench: Bench) -> tuple[str, float | None, str | None]:
    """("ok" | "WRONG" | "error", relative error, message): opendnn's output against torch's."""
    bench.reset()
    try:
        bench.opendnn()
    except Exception as error:
        return "error", None, f"run: {_describe(error)}"
    try:
        expected = bench.torch()
    except Exception as error:
        return "error", None, f"torch: {_describe(error)}"
    if tuple(expected.shape) != tuple(bench.output.shape):
        return "WRONG", None, f"shape {tuple(bench.output.shape)} != torch's {tuple(expected.shape)}"
    error = relative_error(bench.output, expected)
    tolerance = bench.tolerance or TOLERANCE[bench.output.dtype]
    if error < tolerance:  # NaN compares False: an unwritten element fails
        return "ok", error, None
    return "WRONG", error, f"rel_err {error:.3g} >= {tolerance:g}"


def _cuda_timer(warmup_ms: float, rep_ms: float) -> Timer:
    import triton.testing

    def timer(fn: Callable[[], Any]) -> float:
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return timer


def _cpu_timer(rep_ms: float, min_runs: int = 3, max_runs: int = 1000) -> Timer:
    def timer(fn: Callable[[], Any]) -> float:
        fn()  # warm-up: compilation, caches
        times: list[float] = []
        budget_end = time.perf_counter() + rep_ms / 1e3
        while len(times) < min_runs or (time.perf_counter() < budget_end and len(times) < max_runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return timer


def environment(ctx: Context) -> dict[str, Any]:
    """Date, device and versions for the report's header."""
    device = torch.cuda.get_device_name(ctx.device) if ctx.device != "cpu" else f"CPU ({platform.machine()})"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        **report.versions(),
        "backend": ctx.handle.backend,
        "size": ctx.size,
    }


def _markdown(suite: str, env: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    timing = (
        "Medians of `time.perf_counter` runs (a CPU smoke run, not a performance figure)"
        if env["device"].startswith("CPU")
        else "Medians of `triton.testing.do_bench` (CUDA events, L2 flushed)"
    )
    lines = [
        f"# opendnn vs torch: {suite}",
        "",
        f"{env['date']}, {env['device']}; torch {env['torch']}, Triton {env['triton']}, cuDNN {env['cudnn']}, "
        f"opendnn {env['opendnn']} (backend {env['backend']}, {env['size']} shapes).",
        f"{timing}; GB/s counts the fewest bytes each op must move (each input read once, the output written "
        "once); TFLOP/s counts 2 flops per multiply-add; ratio = torch ms / opendnn ms (above 1: opendnn faster); "
        "check: relative norm error against "
        "torch (float32 < 1e-5, bfloat16 < 1e-2).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(_cells(row)) + " |" for row in rows),
    ]
    return "\n".join(lines) + "\n"


def _cells(row: dict[str, Any]) -> list[str]:
    return [
        row["case"],
        row["dtype"],
        row["shape"] or "-",
        _number(row["opendnn_ms"], ".4f"),
        _number(row["torch_ms"], ".4f"),
        _number(row["gbps"], ".0f"),
        _number(row["torch_gbps"], ".0f"),
        _number(row["tflops"], ".1f"),
        _number(row["torch_tflops"], ".1f"),
        _number(row["ratio"], ".2f"),
        _check_cell(row),
    ]


def _check_cell(row: dict[str, Any]) -> str:
    if row["check"] == "ok":
        return f"ok ({row['rel_err']:.1e})"
    message = (row["error"] or "").replace("|", "\\|").replace("\n", " ")
    return f"**{row['check']}**: {message[:200]}"


def _progress_line(row: dict[str, Any]) -> str:
    status = "ok" if row["check"] == "ok" else f"{row['check']}: {row['error']}"
    return (
        f"{row['case']:<18} {row['dtype']:<18} {row['shape'] or '-':<14} "
        f"opendnn {_number(row['opendnn_ms'], '9.4f')} ms {_number(row['gbps'], '6.0f')} GB/s | "
        f"torch {_number(row['torch_ms'], '9.4f')} ms {_number(row['torch_gbps'], '6.0f')} GB/s | "
        f"ratio {_number(row['ratio'], '5.2f')} | {status}"
    )


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _gbps(moved: int, ms: float) -> float:
    return moved / (ms * 1e-3) / 1e9


def _tflops(flops: int, ms: float) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if flops else None


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.strip(), None)
    if not isinstance(dtype, torch.dtype) or dtype not in TOLERANCE:
        raise SystemExit(f"--dtypes: {name!r} must be one of {[_dtype_name(d) for d in TOLERANCE]}")
    return dtype


def _cuda_device(device: str) -> str:
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch sees no CUDA device (use --device cpu --quick for a smoke run)")
    return device if ":" in device else f"cuda:{torch.cuda.current_device()}"


if __name__ == "__main__":
    sys.exit(main())
