"""The attention benchmark suite and the tile sweep on the CPU at their tiny sizes: every row checks
against torch's SDPA, the FLOP counts are the model's, and the sweep times the planner's tile first."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attention  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import attention_schedules  # noqa: E402
import attention_tiles  # noqa: E402
import run  # noqa: E402

from opendnn.families.attention import gluon_forward, triton_backend  # noqa: E402


def test_cpu_smoke_run_of_the_attention_suite_checks_every_row(tmp_path):
    argv = ["--device", "cpu", "--quick", "--suite", "attention", "--dtypes", "float32", "--rep", "1"]
    assert run.main([*argv, "--out", str(tmp_path), "--results", ""]) == 0
    rows = json.loads((tmp_path / "attention.json").read_text())
    assert [row["case"] for row in rows] == [case.name for case in attention.ATTENTION]
    # the fp8 rows against torch's bfloat16 SDPA: the rounding of P to e4m3 (a few percent)
    assert all(row["check"] == "ok" and row["rel_err"] < (0.05 if "fp8" in row["case"] else 1e-5) for row in rows), rows
    by_name = {row["case"]: row for row in rows}
    # 2 x 4 heads x 37 x 37 pairs x 16 dims x 4 flops; causal halves it, the backward counts 2.5 times
    flops = 4 * 2 * 4 * 37 * 37 * 16
    for name, expected in (
        ("attn_gqa_hd128_4k_fwd", flops),
        ("attn_gqa_hd128_4k_causal_fwd", flops // 2),
        ("attn_gqa_hd128_4k_bwd", flops * 5 // 2),
    ):
        row = by_name[name]
        assert row["tflops"] * 1e12 * row["opendnn_ms"] * 1e-3 == pytest.approx(expected, rel=1e-9), name


def test_varlen_rows_count_the_tokens_of_each_sequence():
    heads, dim, lengths = attention.VARLEN["full"]
    assert sum(lengths) == 4 * 4096 == attention.SHAPES["mha_hd128_4k"]["full"][0] * 4096  # the dense row's tokens
    assert attention.attention_flops(heads, dim, sum(n * n for n in lengths), True, False) == 2 * heads * dim * sum(
        n * n for n in lengths
    )


def test_tile_sweep_times_each_candidate_with_the_planners_first(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    argv = ["--device", "cpu", "--quick", "--dtype", "float32", "--max-tiles", "2", "--rep", "1", "--jobs", "2"]
    assert attention_tiles.main([*argv, "--filter", "gqa_hd128_4k_causal", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attention_tiles.json").read_text())
    assert [(row["case"], row["planned"]) for row in rows] == [
        (case, planned)
        for case in ("attn_gqa_hd128_4k_causal_fwd", "attn_gqa_hd128_4k_causal_bwd")
        for planned in (True, False)
    ]
    assert all(row["check"] == "ok" and row["opendnn_ms"] > 0 for row in rows), rows
    assert triton_backend.tile_for.__name__ == "tile_for"  # the planner's own again after the sweep


def test_candidate_tiles_start_with_the_table_and_stay_within_the_sequences():
    from opendnn import TensorDescriptor
    from opendnn.families.attention.problem import AttentionDescriptor, attention_problem

    q = TensorDescriptor("bfloat16", (1, 8, 4096, 128))
    k = TensorDescriptor("bfloat16", (1, 2, 40, 128))
    problem = attention_problem(AttentionDescriptor(), q, k, k, q)
    tiles = triton_backend.candidate_tiles(problem)
    assert tiles[0] == triton_backend.tile_for(problem) == triton_backend.Tile(128, 64, 4, 2)
    assert len(set(tiles)) == len(tiles) and all(tile.block_n <= 64 for tile in tiles[1:])
    assert {tile.block_m for tile in tiles} == {64, 128}


def test_schedule_sweep_forces_its_tile_on_every_head_dim_and_gives_the_planner_back():
    from opendnn import TensorDescriptor
    from opendnn.families.attention.problem import AttentionDescriptor, attention_problem

    q = TensorDescriptor("bfloat16", (1, 8, 4096, 64))
    problem = attention_problem(AttentionDescriptor(causal=True), q, q, q, q)
    tile = gluon_forward.Tile(gluon_forward.PING_PONG, 256, 3)
    with attention_schedules.forced_tile(tile):
        plan = triton_backend.choose(problem, True, True)
        assert (plan.strategy, plan.block_n, plan.num_stages) == ("warp_specialized_forward", 256, 3)
    assert triton_backend.choose(problem, True, True).strategy == "flash2_forward"  # causal head dim 64: tl again
    assert gluon_forward.tile_for(2, 64) == gluon_forward.TILES[2, 64]


def test_schedule_sweep_table_puts_each_tile_beside_torch_and_names_the_best():
    def result(row, tile, ms, planned=False):
        timed = dict(opendnn_ms=ms, ratio=2.0 / ms, check="ok") if ms else dict(check="WRONG", error="rel_err 1")
        return dict(row=row, tile=tile, planned=planned, torch_ms=2.0, **timed)

    results = [
        result("gqa_hd128_4k", "ping-pong+overlap n128 s3", 2.5, planned=True),
        result("gqa_hd128_4k", "independent n128 s3", 2.0),
        result("mha_hd64_4k", "ping-pong+overlap n128 s3", None, planned=True),
        result("mha_hd64_4k", "independent n128 s3", 4.0),
    ]
    lines = attention_schedules.table(results).splitlines()
    assert lines[0] == "| tile | gqa_hd128_4k | mha_hd64_4k |"
    assert lines[2] == "| torch SDPA | 2.000 ms | 2.000 ms |"
    assert lines[3] == "| ping-pong+overlap n128 s3 | 2.500 ms (0.80) | WRONG |"
    assert lines[4] == "| independent n128 s3 | 2.000 ms (1.00) | 4.000 ms (0.50) |"
    assert lines[-2:] == [
        "best gqa_hd128_4k: independent n128 s3: ratio 1.00",
        "best mha_hd64_4k: independent n128 s3: ratio 0.50",
    ]
