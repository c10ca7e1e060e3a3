"""The benchmark driver's results file and report (benchmarks/run.py --report, benchmarks/report.py), on the CPU."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import report  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import run  # noqa: E402

H200 = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "triton": "3.6.0", "cudnn": 91900, "opendnn": "0.1.0"}
PER_CALL = "Per call: medians of `triton.testing.do_bench`."


def small_results() -> dict:
    return {
        "gpu": "NVIDIA H200",
        "runs": {
            "new": {"date": "2026-11-30", **H200, "command": "`benchmarks/run.py --suite matmul`", "timing": PER_CALL},
            "old": {
                "date": "2026-11-29",
                **H200,
                "command": "`benchmarks/run.py --suite matmul --rep 30`",
                "timing": PER_CALL,
            },
            "models": {
                "date": "2026-11-30",
                **H200,
                "command": "`benchmarks/models.py --graph`",
                "timing": "Per step.",
            },
        },
        "suites": {
            "models": [
                {
                    "model": "resnet50",
                    "mode": "inference (graph)",
                    "batch": 64,
                    "opendnn_ms": 4.68,
                    "torch_ms": 4.6,
                    "ratio": 0.98,
                    "run": "models",
                }
            ],
            "matmul": [
                {
                    "case": "square_4096",
                    "dtype": "bfloat16",
                    "shape": "4096x4096x4096",
                    "opendnn_ms": 0.2067,
                    "torch_ms": 0.1883,
                    "ratio": 0.9109821,
                    "check": "ok",
                    "rel_err": 3.2e-3,
                    "run": "new",
                },
                {"case": "square_4096", "dtype": "float32", "shape": "4096x4096x4096", "ratio": 1.035, "run": "old"},
                {"case": "batched_128", "dtype": "float32", "shape": "512x128x128x128", "tflops": 62.3, "run": "old"},
            ],
        },
        "notes": {"matmul": [{"run": "old", "text": "Run {run} also measured the float16 rows at 0.86-0.92x."}]},
    }


def write_report(tmp_path: Path, results: dict) -> tuple[str, bytes]:
    results_file, markdown, chart = tmp_path / "h200.json", tmp_path / "BENCHMARKS.md", tmp_path / "h200.png"
    results_file.write_text(json.dumps(results))
    assert (
        run.main(["--report", "--results", str(results_file), "--markdown", str(markdown), "--chart", str(chart)]) == 0
    )
    return markdown.read_text(), chart.read_bytes()


def test_report_has_a_table_per_suite_in_family_order_with_each_rows_run(tmp_path):
    text, _ = write_report(tmp_path, small_results())
    assert text.index("## Matrix multiplication") < text.index("## Whole models")  # SUITES order, not the file's
    assert "| case | dtype | shape | opendnn ms | torch ms | opendnn TFLOP/s | ratio | check | run |" in text
    assert "| square_4096 | bfloat16 | 4096x4096x4096 | 0.2067 | 0.1883 | - | 0.91 | ok (3.2e-03) | A |" in text
    assert "| batched_128 | float32 | 512x128x128x128 | - | - | 62.3 | - | - | B |" in text
    assert "| resnet50 | inference (graph) | 64 | 4.68 | 4.60 | 0.98 | A |" in text
    assert (
        "- A: 2026-11-30, NVIDIA H200; torch 2.11.0+cu130, Triton 3.6.0, cuDNN 9.19.0 (91900), opendnn 0.1.0. "
        "`benchmarks/run.py --suite matmul`. Per call: medians of `triton.testing.do_bench`."
    ) in text
    assert "- B: 2026-11-29, NVIDIA H200;" in text
    assert "Run B also measured the float16 rows at 0.86-0.92x." in text
    assert "![torch time / opendnn time of every row, per suite](h200.png)" in text


def test_report_shows_a_recorded_figure_with_all_its_digits_never_rounded(tmp_path):
    text, _ = write_report(tmp_path, small_results())
    assert "| square_4096 | float32 | 4096x4096x4096 | - | - | - | 1.035 | - | B |" in text


def test_report_writes_a_png_chart_of_the_ratios(tmp_path):
    _, chart = write_report(tmp_path, small_results())
    assert chart[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(chart[16:20], "big"), int.from_bytes(chart[20:24], "big")
    assert width >= 600 and height >= 400


def test_a_run_replaces_the_rows_it_measured_and_keeps_the_others(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(small_results()))
    fresh = report.gpu_run(
        "NVIDIA H200", "benchmarks/run.py --suite matmul --filter square_4096 --dtypes float32", PER_CALL
    )
    report.save_run(
        path,
        fresh,
        {
            "matmul": [
                {
                    "case": "square_4096",
                    "dtype": "float32 ws=0",
                    "shape": "4096x4096x4096",
                    "opendnn_ms": 0.39,
                    "torch_ms": 0.35,
                    "ratio": 0.35 / 0.39,
                    "check": "ok",
                    "rel_err": 4e-4,
                }
            ]
        },
    )
    saved = report.load(path)
    rows = {(row["case"], row["dtype"]): row for row in saved["suites"]["matmul"]}
    assert list(rows) == [("square_4096", "bfloat16"), ("square_4096", "float32 ws=0"), ("batched_128", "float32")]
    replaced = rows["square_4096", "float32 ws=0"]
    assert replaced["opendnn_ms"] == 0.39 and saved["runs"][replaced["run"]]["command"] == (
        "`benchmarks/run.py --suite matmul --filter square_4096 --dtypes float32`"
    )
    assert rows["batched_128", "float32"]["run"] == "old"  # not measured again: kept with its run
    assert saved["suites"]["models"][0]["ratio"] == 0.98
    assert set(saved["runs"]) == {"new", "old", "models", replaced["run"]}


def test_runs_without_rows_are_dropped_with_their_notes(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(small_results()))
    fresh = report.gpu_run("NVIDIA H200", "benchmarks/run.py --suite matmul --dtypes float32", PER_CALL)
    report.save_run(
        path,
        fresh,
        {
            "matmul": [
                {"case": "square_4096", "dtype": "float32", "ratio": 0.96},
                {"case": "batched_128", "dtype": "float32", "ratio": 0.92},
            ]
        },
    )
    saved = report.load(path)
    assert "old" not in saved["runs"]
    assert saved["notes"] == {}


def test_a_results_file_of_another_gpu_is_refused(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(small_results()))
    with pytest.raises(
        SystemExit,
        match=r"holds NVIDIA H200 rows, and this GPU is NVIDIA A100-SXM4-80GB: name "
        r"another results file",
    ):
        report.save_run(path, report.gpu_run("NVIDIA A100-SXM4-80GB", "benchmarks/run.py", PER_CALL), {})
    assert report.load(path) == small_results()


def test_a_cpu_smoke_run_leaves_the_results_file_alone(tmp_path):
    results_file = tmp_path / "h200.json"
    assert (
        run.main(
            [
                "--device",
                "cpu",
                "--quick",
                "--suite",
                "reduce",
                "--filter",
                "reduce_add",
                "--dtypes",
                "float32",
                "--rep",
                "1",
                "--out",
                str(tmp_path / "out"),
                "--results",
                str(results_file),
            ]
        )
        == 0
    )
    assert not results_file.exists()
    assert json.loads((tmp_path / "out" / "reduce.json").read_text())[0]["check"] == "ok"


def test_the_repository_results_file_renders_and_every_row_names_a_run_it_holds(tmp_path):
    results = report.load(report.RESULTS)
    for suite, rows in results["suites"].items():
        for row in rows:
            assert row["run"] in results["runs"], (suite, row)
            assert any(row.get(key) is not None for key in ("ratio", "gbps", "speedup", "opendnn_ms")), (suite, row)
    text, _ = write_report(tmp_path, results)
    assert text.count("\n## ") == len([rows for rows in results["suites"].values() if rows])


def small_cpu_results() -> dict:
    return {
        "date": "2026-12-01",
        "cpu": "Intel(R) Xeon(R) Processor",
        "cores": 2,
        "torch": "2.13.0+cpu",
        "torch_threads": 2,
        "numpy": "2.3.5",
        "opendnn": "0.1.0",
        "command": "`benchmarks/cpu.py --ops softmax`",
        "timing": "Best of 7 runs, opendnn's and torch's alternating, float32.",
        "note": "Measured on a machine shared with other work.",
        "rows": [
            {
                "op": "softmax",
                "shape": "8x1000",
                "direction": "forward",
                "torch_ms": 0.04,
                "opendnn_ms": 0.1,
                "ratio": 0.4,
            },
            {
                "op": "softmax",
                "shape": "8x1048576",
                "direction": "backward",
                "torch_ms": 12.825,
                "opendnn_ms": 30.0,
                "ratio": 0.4275,
            },
        ],
    }


def test_report_renders_the_cpu_section_from_the_cpu_results_beside_the_gpu_ones(tmp_path):
    (tmp_path / "cpu.json").write_text(json.dumps(small_cpu_results()))
    text, _ = write_report(tmp_path, small_results())
    assert text.index("## Whole models") < text.index("## CPU backend")
    assert "- [CPU backend](#cpu-backend)" in text
    assert "| op | shape | direction | torch ms | opendnn ms | ratio |" in text
    assert "| softmax | 8x1000 | forward | 0.04 | 0.10 | 0.40 |" in text
    assert "| softmax | 8x1048576 | backward | 12.82 | 30.00 | 0.43 |" in text
    assert (
        "Run: 2026-12-01, Intel(R) Xeon(R) Processor, 2 cores; torch 2.13.0+cpu (2 threads), NumPy 2.3.5, "
        "opendnn 0.1.0. `benchmarks/cpu.py --ops softmax`. Best of 7 runs, opendnn's and torch's alternating, "
        "float32."
    ) in text
    assert "\nMeasured on a machine shared with other work.\n" in text


def test_report_without_cpu_results_has_no_cpu_section_and_the_same_gpu_sections(tmp_path):
    without, _ = write_report(tmp_path, small_results())
    (tmp_path / "cpu.json").write_text(json.dumps(small_cpu_results()))
    with_cpu, _ = write_report(tmp_path, small_results())
    assert "CPU backend" not in without
    gpu_part = with_cpu[: with_cpu.index("\n## CPU backend")].replace("- [CPU backend](#cpu-backend)\n", "")
    assert gpu_part == without


def test_report_renders_the_host_cost_rows_beside_the_results_file(tmp_path):
    host = {
        "run": {
            "date": "2026-12-01",
            "cpu": "Some CPU, 2 cores",
            "torch": "2.13.0",
            "triton": "3.6.0",
            "opendnn": "0.1.0",
            "python": "3.11.7",
            "command": "`benchmarks/host_overhead.py`",
            "timing": "Best of 7 alternating rounds of 200 calls per side, float32",
            "load": 1.5,
        },
        "rows": [{"op": "relu", "mode": "forward", "opendnn_us": 33.94, "torch_us": 8.9, "ratio": 0.26}],
    }
    (tmp_path / "host_cpu.json").write_text(json.dumps(host))
    text, _ = write_report(tmp_path, small_results())
    assert "## Host cost per call (CPU, kernels stubbed)" in text
    assert "| relu | forward | 33.9 | 8.9 | 0.26 |" in text
    assert "2026-12-01, Some CPU, 2 cores; torch 2.13.0, Triton 3.6.0, opendnn 0.1.0, Python 3.11.7." in text
    assert text.index("## Matrix multiplication") < text.index("## Host cost per call")


def test_report_has_no_host_section_without_its_file(tmp_path):
    text, _ = write_report(tmp_path, small_results())
    assert "Host cost per call" not in text


def test_a_runs_command_keeps_what_it_measured_and_drops_where_it_wrote():
    command = "benchmarks/models.py --fused --out /somewhere --results=/else.json --warmup 100 --chart c.png"
    assert report.measuring(command) == "benchmarks/models.py --fused --warmup 100"
    assert report.gpu_run("GPU", command, "t")["command"] == "`benchmarks/models.py --fused --warmup 100`"
