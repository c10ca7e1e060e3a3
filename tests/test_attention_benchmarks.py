"""The attention benchmark suite and the tile sweep on the CPU at their tiny sizes: every row checks
against torch's SDPA, the FLOP counts are the model's, and the sweep times the planner's tile first."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import attention  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import attention_tiles  # noqa: E402
import run  # noqa: E402

from opendnn.families.attention import triton_backend  # noqa: E402


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
