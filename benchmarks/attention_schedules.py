"""Sweep of the warp-specialized attention forward's tiles on an H200: for rows of the attention suite
(``ROWS``; ``--filter`` picks some), the forward at every tile of ``gluon_forward.candidate_tiles``
(the planned tile first, then each schedule, key block width and ring depth), each checked against
torch's SDPA and timed beside it in the same process, on the same tensors.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 benchmarks/attention_schedules.py --jobs 16 --budget 200
    PYTHONPATH=. python3 benchmarks/attention_schedules.py --filter mha_hd64 --rep 50

The sweep replaces ``gluon_forward.tile_for`` (the planner's one tile decision for this kernel) for
each call, and routes every (element bytes, head dim) of ``gluon_forward.TILES`` to the kernel (the planner keeps
causal head dim 64 on the FlashAttention-2 kernel). The fp8 rows (e4m3 q, k and v) time against torch's
bfloat16 SDPA on the same values, as the suite's fp8 rows do. With ``--jobs`` above 1 the kernels are
first compiled in that many worker processes (Triton's on-disk cache keeps them), so the timing process
loads them compiled. A tile whose result fails the suite's check (1e-2 relative in bfloat16; the fp8
rows allow the rounding of P to e4m3) is a row saying so; once
``--budget`` seconds have passed the remaining tiles are not timed. Prints a line per tile, then one
table (row x tile: ms and ratio = torch ms / opendnn ms) and the best tile per row; writes
``<out>/attention_schedules.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import attention
import run
import torch
from suites import Case, Context

import opendnn
from opendnn.families.attention import gluon_forward, triton_backend
from opendnn.families.attention.gluon_forward import Tile

ROWS = {  # row: (head dim, bytes an element of q, k and v)
    "gqa_hd128_4k": (128, 2),
    "gqa_hd128_4k_causal": (128, 2),
    "gqa_hd128_16k": (128, 2),
    "mha_hd64_4k": (64, 2),
    "mha_hd256_4k": (256, 2),
    "gqa_hd128_fp8_4k": (128, 1),
    "gqa_hd128_fp8_4k_causal": (128, 1),
}
SCHEDULE_NAMES = ("independent", "ping-pong", "overlap", "ping-pong+overlap")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time the warp-specialized forward's tiles beside torch's SDPA.")
    parser.add_argument("--filter", default="", help="rows whose name contains one of these comma-separated texts")
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0)")
    parser.add_argument("--jobs", type=int, default=16, help="processes compiling the kernels first (default 16)")
    parser.add_argument("--budget", type=float, default=220.0, help="seconds after which no tile is timed")
    parser.add_argument("--warmup", type=float, default=10.0, help="do_bench warm-up, ms (default 10)")
    parser.add_argument("--rep", type=float, default=30.0, help="do_bench timed repetitions, ms (default 30)")
    parser.add_argument("--out", default="results", help="directory for attention_schedules.json")
    return parser.parse_args(argv)


@contextlib.contextmanager
def forced_tile(tile: Tile) -> Iterator[list[int]]:
    """Every attention forward made inside runs the warp-specialized kernel at ``tile`` where the
    planner routes it there; yields the list each call planned on it appends to."""
    planned_tile, planned_dims, choose = (
        gluon_forward.tile_for,
        triton_backend.WARP_SPECIALIZED_TILES,
        triton_backend.choose,
    )
    launched: list[int] = []

    def chosen(*args: Any) -> Any:
        plan = choose(*args)
        if plan.warp_tile == tile:
            launched.append(1)
        return plan

    gluon_forward.tile_for = lambda element_bytes, head_dim: tile
    triton_backend.WARP_SPECIALIZED_TILES = tuple(gluon_forward.TILES)
    triton_backend.choose = chosen
    try:
        yield launched
    finally:
        gluon_forward.tile_for, triton_backend.WARP_SPECIALIZED_TILES = planned_tile, planned_dims
        triton_backend.choose = choose


def rows(name_filter: str) -> list[str]:
    texts = name_filter.split(",")
    return [row for row in ROWS if any(text in row for text in texts)]


def case_of(row: str) -> Case:
    return next(case for case in attention.ATTENTION if case.name == f"attn_{row}_fwd")


_BENCHES: dict[str, Any] = {}  # a compiling worker's benches, built once per row


def compile_tile(task: tuple[str, str, Tile]) -> str | None:
    """In a worker: run the row once at the tile (compiling its kernel into Triton's cache); the
    error, if any."""
    row, device, tile = task
    try:
        if row not in _BENCHES:
            _BENCHES[row] = case_of(row).build(Context(opendnn.create(device), device, "full"), torch.bfloat16)
        with forced_tile(tile):
            _BENCHES[row].opendnn()
        return None
    except Exception as error:  # the timing process meets it again and records it in the tile's line
        return f"{type(error).__name__}: {str(error)[:200]}"


def precompile(plans: list[tuple[str, list[Tile]]], device: str, jobs: int) -> None:
    tasks = [(row, device, tile) for row, tiles in plans for tile in tiles]
    with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
        errors = [error for error in pool.map(compile_tile, tasks) if error is not None]
    print(f"compiled {len(tasks)} (row, tile) pairs in {jobs} processes; {len(errors)} failed", flush=True)


def sweep_row(row: str, tiles: list[Tile], ctx: Context, timer: run.Timer, deadline: float) -> list[dict]:
    """One result per tile of ``row``: the check, opendnn's and torch's times and the ratio."""
    bench = case_of(row).build(ctx, torch.bfloat16)
    torch_ms = timer(bench.torch)
    results = []
    for tile in tiles:
        result: dict[str, Any] = dict(row=row, tile=label(tile), planned=tile == tiles[0], torch_ms=torch_ms)
        if time.monotonic() > deadline:
            result["check"], result["error"] = "skipped", "past --budget"
        else:
            with forced_tile(tile) as launched:
                result["check"], result["rel_err"], result["error"] = run.check(bench)
                if not launched:
                    result["check"], result["error"] = "error", "the warp-specialized kernel did not run"
                if result["check"] == "ok":
                    result["opendnn_ms"] = timer(bench.opendnn)
                    result["tflops"] = bench.flops / (result["opendnn_ms"] * 1e-3) / 1e12
                    result["ratio"] = torch_ms / result["opendnn_ms"]
        results.append(result)
        print(line(result), flush=True)
    return results


def label(tile: Tile) -> str:
    return f"{SCHEDULE_NAMES[tile.schedule]} n{tile.block_n} s{tile.stages}"


def line(result: dict) -> str:
    if result.get("opendnn_ms"):
        outcome = (
            f"{result['opendnn_ms']:8.3f} ms {result['tflops']:5.0f} TFLOP/s "
            f"torch {result['torch_ms']:8.3f} ms ratio {result['ratio']:5.2f}"
        )
    else:
        outcome = f"{result['check']}: {result['error']}"
    return f"{result['row']:<22} {label_of(result):<32} {outcome}"


def label_of(result: dict) -> str:
    return result["tile"] + (" (planned)" if result["planned"] else "")


def table(results: list[dict]) -> str:
    """Markdown: a line per tile, a column per row (ms and ratio), then the best tile per row."""
    row_names = list(dict.fromkeys(result["row"] for result in results))
    tiles = list(dict.fromkeys(result["tile"] for result in results))
    cell = {(result["row"], result["tile"]): result for result in results}
    lines = ["| tile | " + " | ".join(row_names) + " |", "|---" * (len(row_names) + 1) + "|"]
    torch_cells = [f"{cell[next((r, t) for r, t in cell if r == row)]['torch_ms']:.3f} ms" for row in row_names]
    lines.append("| torch SDPA | " + " | ".join(torch_cells) + " |")
    for tile in tiles:
        cells = []
        for row in row_names:
            result = cell.get((row, tile))
            if result is None:
                cells.append("")
            elif result.get("opendnn_ms"):
                cells.append(f"{result['opendnn_ms']:.3f} ms ({result['ratio']:.2f})")
            else:
                cells.append(result["check"])
        lines.append(f"| {tile} | " + " | ".join(cells) + " |")
    lines.append("")
    for row in row_names:
        timed = [result for result in results if result["row"] == row and result.get("opendnn_ms")]
        best = min(timed, key=lambda result: result["opendnn_ms"], default=None)
        verdict = "none timed" if best is None else f"{label_of(best)}: ratio {best['ratio']:.2f}"
        lines.append(f"best {row}: {verdict}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    device = run._cuda_device(args.device)
    ctx = Context(opendnn.create(device), device, "full")
    timer = run._cuda_timer(args.warmup, args.rep)
    print(run.environment(ctx), flush=True)
    plans = [(row, gluon_forward.candidate_tiles(ROWS[row][1], ROWS[row][0])) for row in rows(args.filter)]
    if args.jobs > 1:
        precompile(plans, device, args.jobs)
    results = []
    for row, tiles in plans:
        results += sweep_row(row, tiles, ctx, timer, start + args.budget)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_schedules.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + table(results), flush=True)
    return 0 if all(result["check"] in ("ok", "skipped") for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
