"""The graph benchmark suite on the CPU at its tiny sizes, the plans on the fused engine (Triton's
interpreter): every row checks against torch, each plan's row names its engine and launches, and the
check of the statistics refuses sums that are not the output's; the graph_attention suite in float32 (the
interpreter multiplies bfloat16 products wrongly)."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import convolution  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import graph  # noqa: E402
import run  # noqa: E402

# the convolution plan with 8 -> 16 channels: the interpreter takes about 15 s a call of ResNet-50's 256 -> 256
SMALL_LAYER = convolution.Layer("small_3x3", 8, 9, 16, 3, 1)


def test_cpu_smoke_run_of_the_graph_suite_checks_every_row_on_the_fused_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(graph, "CONV_LAYER", SMALL_LAYER)
    argv = ["--device", "cpu", "--quick", "--suite", "graph", "--dtypes", "float32,bfloat16", "--rep", "1"]
    assert run.main([*argv, "--out", str(tmp_path), "--results", ""]) == 0
    rows = json.loads((tmp_path / "graph.json").read_text())
    assert [row["case"] for row in rows] == [case.name for case in graph.GRAPH for _ in range(2)]
    assert all(row["check"] == "ok" for row in rows), rows
    cells = {(row["case"], row["dtype"].split()[0]): row for row in rows}
    for case, layout in (("pointwise_dag_nchw", "nchw"), ("pointwise_dag_nhwc_compiled", "nhwc")):
        assert cells[case, f"{layout}_float32"]["dtype"] == f"{layout}_float32 fused launches=1"
        assert cells[case, f"{layout}_float32"]["rel_err"] < 1e-6
    # the prologue's kernel, the convolution, the statistics' kernel
    assert cells["bn_relu_conv_genstats", "nchw_float32"]["dtype"] == "nchw_float32 fused launches=3"
    assert cells["bn_relu_conv_genstats", "nhwc_bfloat16"]["dtype"] == "nhwc_bfloat16 fused launches=3"
    conv = cells["bn_relu_conv_genstats", "nchw_float32"]
    assert conv["shape"] == "2x8x9x9"
    assert conv["tflops"] * 1e12 * conv["opendnn_ms"] * 1e-3 == pytest.approx(2 * 2 * 16 * 9 * 9 * 8 * 9, rel=1e-9)
    assert cells["execute_host", "float32"]["dtype"] == "float32 fused launches=1"


def test_the_statistics_check_refuses_sums_that_are_not_the_outputs():
    y = torch.randn(2, 3, 4, 5)
    stats = torch.stack([y.sum((0, 2, 3)), (y * y).sum((0, 2, 3))])
    graph.check_sums(stats, y)
    stats[1, 2] += 0.01 * stats[1].norm()
    with pytest.raises(ValueError, match=r"genstats: rel_err 0\.0\d+ >= 0\.0001 against the float64 sums of y"):
        graph.check_sums(stats, y)
    stats[1, 2] = math.nan  # an unwritten sum
    with pytest.raises(ValueError, match=r"genstats: rel_err inf >= 0\.0001"):
        graph.check_sums(stats, y)


def test_cpu_smoke_run_of_the_graph_attention_suite_checks_each_row_against_torch(tmp_path):
    argv = ["--device", "cpu", "--quick", "--suite", "graph_attention", "--dtypes", "float32", "--rep", "1"]
    assert run.main([*argv, "--out", str(tmp_path), "--results", ""]) == 0
    rows = json.loads((tmp_path / "graph_attention.json").read_text())
    assert [row["case"] for row in rows] == [case.name for case in graph.GRAPH_ATTENTION]
    assert all(row["check"] == "ok" and row["rel_err"] < 1e-5 for row in rows), rows
    assert [row["dtype"] for row in rows] == ["float32 fused", "float32 fused"]
