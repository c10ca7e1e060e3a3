"""Sweep of attention's tiles on the GPU: for rows of the attention suite (the GQA 64/8 head-dim-128 ones by
default; ``--filter`` picks others), the forward and the backward at every tile the planner could take
(``triton_backend.candidate_tiles``: the table's tile first, then its direction's grid of BLOCK_M,
BLOCK_N, warps and stages), each timed beside torch's SDPA in the same process, on the same tensors.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 benchmarks/attention_tiles.py --jobs 16 --out results
    PYTHONPATH=. python3 benchmarks/attention_tiles.py --filter gqa_hd128_4k_causal_fwd --rep 50

CPU smoke run (tiny shapes through Triton's interpreter, float32)::

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/attention_tiles.py --device cpu --quick --max-tiles 2

The sweep replaces ``triton_backend.tile_for`` (the planner's one tile decision) for each call; the rest
of the plan (head-dim padding, the clamp to the sequence lengths) is the planner's own. With ``--jobs``
above 1 the kernels are first compiled in that many worker processes (Triton's on-disk cache keeps
them), so the timing process loads them compiled. Each tile's result is checked against torch's
(relative error under 1e-2 in bfloat16); a tile that does not fit (shared memory past the H200's 227 KB)
or is wrong is a row saying so. Prints a line per tile and a Markdown table per case as each case ends, and
rewrites ``<out>/attention_tiles.json`` after each case (a run cut short keeps the cases it finished).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import attention
import run
import torch
from suites import Bench, Case, Context

import opendnn
from opendnn.families.attention import triton_backend
from opendnn.families.attention.problem import AttentionProblem
from opendnn.families.attention.triton_backend import Tile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time attention at each candidate tile beside torch's SDPA.")
    parser.add_argument(
        "--filter",
        default="gqa_hd128",
        help="cases whose name contains one of these comma-separated texts (default gqa_hd128)",
    )
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu")
    parser.add_argument("--quick", action="store_true", help="smaller shapes (tiny ones with --device cpu)")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype name (default bfloat16; float32 on a CPU)")
    parser.add_argument("--max-tiles", type=int, default=0, help="time only the first N candidates (0: all)")
    parser.add_argument("--jobs", type=int, default=1, help="processes compiling the kernels first (default 1)")
    parser.add_argument("--warmup", type=float, default=10.0, help="do_bench warm-up, ms (default 10)")
    parser.add_argument("--rep", type=float, default=50.0, help="do_bench timed repetitions, ms (default 50)")
    parser.add_argument("--out", default="results", help="directory for attention_tiles.json")
    return parser.parse_args(argv)


@contextlib.contextmanager
def forced_tile(tile: Tile) -> Iterator[None]:
    """Every attention plan made inside takes ``tile``."""
    planned = triton_backend.tile_for
    triton_backend.tile_for = lambda problem: tile
    try:
        yield
    finally:
        triton_backend.tile_for = planned


def planned_problem(bench: Bench) -> AttentionProblem:
    """The problem the opendnn call of ``bench`` plans (the last one, for a call that makes several)."""
    planned, seen = triton_backend.tile_for, []

    def recording(problem: AttentionProblem) -> Tile:
        seen.append(problem)
        return planned(problem)

    triton_backend.tile_for = recording
    try:
        bench.opendnn()
    finally:
        triton_backend.tile_for = planned
    return seen[-1]


def cases(name_filter: str) -> list[Case]:
    texts = name_filter.split(",")
    return [case for case in attention.ATTENTION if any(text in case.name for text in texts)]


_BENCHES: dict[str, Bench] = {}  # a compiling worker's benches, built once per case


def compile_tile(task: tuple[str, str, str, str, Tile]) -> str | None:
    """In a worker: run the case once at the tile (compiling its kernels into Triton's cache); the
    error, if any."""
    case_name, device, size, dtype_name, tile = task
    try:
        if case_name not in _BENCHES:
            case = next(case for case in attention.ATTENTION if case.name == case_name)
            ctx = Context(opendnn.create(device), device, size)
            _BENCHES[case_name] = case.build(ctx, getattr(torch, dtype_name))
        with forced_tile(tile):
            _BENCHES[case_name].opendnn()
        return None
    except Exception as error:  # the timing process meets it again and records it in the tile's row
        return f"{type(error).__name__}: {str(error)[:200]}"


def candidates(case: Case, ctx: Context, dtype: torch.dtype, max_tiles: int) -> list[Tile]:
    """The tiles of ``case``'s problem (``max_tiles`` of them, 0: all), the planned one first."""
    tiles = triton_backend.candidate_tiles(planned_problem(case.build(ctx, dtype)))
    return tiles[:max_tiles] if max_tiles else tiles


def precompile(plans: list[tuple[Case, list[Tile]]], ctx: Context, args: argparse.Namespace) -> None:
    """Every (case, tile) run once in ``args.jobs`` worker processes: their kernels land compiled in
    Triton's cache, so the timing process loads them."""
    tasks = [(case.name, ctx.device, ctx.size, args.dtype, tile) for case, tiles in plans for tile in tiles]
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        errors = [error for error in pool.map(compile_tile, tasks) if error is not None]
    print(f"compiled {len(tasks)} (case, tile) pairs in {args.jobs} processes; {len(errors)} failed", flush=True)


def sweep_case(case: Case, tiles: list[Tile], ctx: Context, dtype: torch.dtype, timer: run.Timer) -> list[dict]:
    """One row per tile of ``case``: time, TFLOP/s, torch's time and the ratio, the check."""
    bench = case.build(ctx, dtype)
    torch_ms = timer(bench.torch)
    rows = []
    for tile in tiles:
        row: dict[str, Any] = dict(
            case=case.name, tile=_label(tile), planned=tile == tiles[0], torch_ms=torch_ms, flops=bench.flops
        )
        with forced_tile(tile):
            row["check"], row["rel_err"], row["error"] = run.check(bench)
            if row["check"] == "ok":
                row["opendnn_ms"] = timer(bench.opendnn)
                row["tflops"] = bench.flops / (row["opendnn_ms"] * 1e-3) / 1e12
                row["ratio"] = torch_ms / row["opendnn_ms"]
        rows.append(row)
        print(_line(row), flush=True)
    torch_ms_after = timer(bench.torch)  # torch again, after the sweep: a clock that drifted shows here
    for row in rows:
        row["torch_ms_after"] = torch_ms_after
    return rows


def markdown(case_name: str, rows: list[dict]) -> str:
    best = min((row for row in rows if row.get("opendnn_ms")), key=lambda row: row["opendnn_ms"], default=None)
    torch_ms, flops = rows[0]["torch_ms"], rows[0]["flops"]
    lines = [
        f"### {case_name}: torch {torch_ms:.3f} ms ({flops / (torch_ms * 1e-3) / 1e12:.0f} TFLOP/s), "
        f"{rows[0]['torch_ms_after']:.3f} ms after the sweep",
        "",
        "| BLOCK_M x BLOCK_N x warps x stages | ms | TFLOP/s | ratio | check |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        mark = " (planned)" if row["planned"] else ""
        mark += " **best**" if row is best else ""
        if row.get("opendnn_ms"):
            cells = [f"{row['opendnn_ms']:.3f}", f"{row['tflops']:.0f}", f"{row['ratio']:.2f}", "ok"]
        else:
            cells = ["-", "-", "-", f"{row['check']}: {(row['error'] or '')[:120]}"]
        lines.append(f"| {row['tile']}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = "cpu" if args.device == "cpu" else run._cuda_device(args.device)
    size = "full" if not args.quick else ("tiny" if device == "cpu" else "quick")
    dtype = getattr(torch, args.dtype)
    ctx = Context(opendnn.create(device), device, size)
    timer = run._cuda_timer(args.warmup, args.rep) if device != "cpu" else run._cpu_timer(args.rep)
    print(run.environment(ctx), flush=True)
    plans = [(case, candidates(case, ctx, dtype, args.max_tiles)) for case in cases(args.filter)]
    if args.jobs > 1:
        precompile(plans, ctx, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case, tiles in plans:
        rows = sweep_case(case, tiles, ctx, dtype, timer)
        results += rows
        (out / "attention_tiles.json").write_text(json.dumps(results, indent=2) + "\n")  # a run cut short keeps these
        print("\n" + markdown(case.name, rows), flush=True)
    return 0 if all(row["check"] != "WRONG" for row in results) else 1  # a tile that does not fit: an error row


def _label(tile: Tile) -> str:
    return f"{tile.block_m} x {tile.block_n} x {tile.num_warps} x {tile.num_stages}"


def _line(row: dict) -> str:
    if row.get("opendnn_ms"):
        result = f"{row['opendnn_ms']:9.3f} ms {row['tflops']:6.0f} TFLOP/s ratio {row['ratio']:5.2f}"
    else:
        result = f"{row['check']}: {row['error']}"
    return f"{row['case']:<34} {row['tile']:<18} {result}"


if __name__ == "__main__":
    sys.exit(main())
