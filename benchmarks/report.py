"""The results file of a GPU and the report written from it (BENCHMARKS.md and a PNG chart of the ratios).

The results file (``benchmarks/results/h200.json``) holds the current measurement of every benchmark row
on one GPU::

    {"gpu": "NVIDIA H200",
     "runs": {"<id>": {"date": "2026-11-30", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130",
                       "triton": "3.6.0", "cudnn": 91900, "opendnn": "0.1.0",
                       "command": "`benchmarks/run.py --suite matmul`", "timing": "Per call: ..."}},
     "suites": {"matmul": [{"case": "square_4096", "dtype": "bfloat16", "shape": "4096x4096x4096",
                            "opendnn_ms": 0.2067, "torch_ms": 0.1883, "ratio": 0.91, "run": "<id>"}, ...]}}

A row holds what its run measured (the keys of ``COLUMNS``; a figure a run did not record is absent) and
the id of its run. ``save_run`` adds a run and replaces the rows it measured, keeping the others, so each
row holds the most recent figures recorded for its case; runs no row refers to are dropped. A row is
identified by its ``KEYS`` (a dtype cell counts by its first word: the convolution suite appends the
workspace). ``notes`` (suite -> [{"run": id, "text": ...}]) say what a run measured beyond its rows (a range
over several rows, say); ``{run}`` in a text becomes the run's letter, and a note goes with its run.

``write_report`` renders the file: one table per suite (in ``SUITES`` order, then any other), each row
with its run's letter, the runs (date, GPU, versions, command, timing) under the table, and the chart;
then, where the GPU results file has a ``cpu.json`` beside it (written by ``benchmarks/cpu.py``), the
"CPU backend" section: one table of its rows with its run line and note.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent
RESULTS = REPOSITORY / "benchmarks" / "results" / "h200.json"
MARKDOWN = REPOSITORY / "BENCHMARKS.md"
CHART = REPOSITORY / "benchmarks" / "results" / "h200.png"
CPU_RESULTS = "cpu.json"  # benchmarks/cpu.py's results, beside the GPU's results file
CPU_TITLE = "CPU backend"
HOST_RESULTS = "host_cpu.json"  # benchmarks/host_overhead.py's results, beside the GPU's results file

KEYS = ("model", "case", "mode", "round", "dtype")  # what identifies a row within its suite
# (row key, column header, format) in the order tables show them; a table shows the columns its rows fill
COLUMNS = (
    ("model", "model", None),
    ("case", "case", None),
    ("mode", "mode", None),
    ("round", "round", None),
    ("dtype", "dtype", None),
    ("shape", "shape", None),
    ("batch", "batch", None),
    ("opendnn_ms", "opendnn ms", "ms"),
    ("torch_ms", "torch ms", "ms"),
    ("gbps", "opendnn GB/s", ".0f"),
    ("torch_gbps", "torch GB/s", ".0f"),
    ("tflops", "opendnn TFLOP/s", ".1f"),
    ("torch_tflops", "torch TFLOP/s", ".1f"),
    ("host_us", "opendnn host us", ".0f"),
    ("device_us", "opendnn device us", ".1f"),
    ("torch_device_us", "torch device us", ".1f"),
    ("one_gpu_img_s", "1 GPU img/s", ",.0f"),
    ("two_gpu_img_s", "2 GPUs img/s", ",.0f"),
    ("speedup", "speed-up", ".2f"),
    ("ratio", "ratio", ".2f"),
    ("check", "check", None),
)
# suite -> (title, what it measures, decimals of its times in ms), in the report's order
SUITES: dict[str, tuple[str, str, int]] = {
    "elementwise": (
        "Activations and tensor ops",
        "Every activation forward and backward, op_tensor ADD and MUL, "
        "add_tensor with a broadcast bias and scale_tensor on 32768 x 4096 (transformer rows).",
        4,
    ),
    "transform": (
        "Layout and dtype transforms",
        "transform_tensor between NCHW and NHWC and between float32 and "
        "bfloat16 on a ResNet-50 activation (64 x 256 x 56 x 56); `copy` (NCHW to NCHW against torch's "
        "clone) is the copy bandwidth of the same tensor.",
        4,
    ),
    "reduce": ("Reductions", "reduce_tensor ADD and MAX over the last dim of 32768 x 4096.", 4),
    "matmul": (
        "Matrix multiplication",
        "Square products, N = 4224 (a partial last round of tiles), the three "
        "linear layers of a transformer block at 16384 tokens, fp8 products (precise and fast "
        "accumulation) against `torch._scaled_mm`, a fused linear + bias + GELU against torch's three ops, "
        "and 512 products of 128^3. float32 runs TF32 on both sides.",
        4,
    ),
    "convolution": (
        "Convolution",
        "The ResNet-50 layers and a depthwise layer at batch 64, forward, backward data "
        "and backward filter with the algorithms calls that name none take, against cuDNN (`cudnn.benchmark` "
        "on). The dtype cell names the layout: NHWC activations take KRSC filters, NCHW ones KCRS; float32 "
        "runs with TF32 on both sides.",
        4,
    ),
    "convolution_networks": (
        "Convolution layers of other networks",
        "Layers that no planner table was tuned on, at batch 64 unless the case names another: dense 3x3 "
        "layers of VGG-16 and a U-Net decoder (batch 16), ResNeXt-50's grouped 3x3 (32 groups), ConvNeXt-T's "
        "7x7 and EfficientNet-B0's 5x5 depthwise layers, MobileNetV2's and EfficientNet-B0's strided depthwise "
        "3x3 and 5x5, a 3-D 3x3x3 layer over 16 frames (batch 8), ResNet-50's 3x3 layers 1, 3 and 4 at batch 1 "
        "and its layer-3 3x3 at 256, "
        "channel counts that are not multiples of 64 (GoogLeNet, DenseNet-121, SqueezeNet, a detector's strided "
        "3x3 over 32 channels at batch 16), RegNetY's 3x3 in groups of 56 channels, and DeepLabV3's 3x3 at "
        "dilation 2 (batch 16); forward, backward data and backward filter with the algorithms calls that "
        "name none take (the dtype cell names one other than IMPLICIT_GEMM and ALGO_0) against cuDNN "
        "(`cudnn.benchmark` on), layouts as in the convolution table.",
        4,
    ),
    "convolution_fused": (
        "Fused convolution",
        "Inference of conv -> batch norm -> + residual -> relu as one opendnn "
        "call (the norm folded into the filter) against torch's four ops, ResNet-50 layers at "
        "batch 64; the call takes the forward algorithm the heuristics rank first, as calls that name none "
        "do (the dtype cell names one other than IMPLICIT_GEMM).",
        4,
    ),
    "pooling": (
        "Pooling",
        "ResNet-50's 3x3 stride-2 max pool, a 2x2 stride-2 average pool, a global average pool (torch's "
        "`adaptive_avg_pool2d(x, 1)`, as squeeze-and-excitation blocks and classifier heads pool) and a global "
        "max pool (`adaptive_max_pool2d(x, 1)`) on 64 x 256 x 56 x 56, NCHW and NHWC, forward and backward. "
        "torch's max pools compute their indices in the forward and read them in the backward; opendnn's "
        "backward keeps cuDNN's contract (it reads x and y, no indices), so the backward rows favour torch.",
        4,
    ),
    "resample": (
        "Resampling",
        "The 2x upsampling of a U-Net or FPN decoder (`nn.Upsample(scale_factor=2)`), bilinear and nearest, "
        "and a bilinear 2x downsampling, on 64 x 256 x 56 x 56, NCHW and NHWC, forward and backward, against "
        "torch's upsample kernels (whose backward adds atomically; opendnn's gathers in a fixed order).",
        4,
    ),
    "batch_norm": (
        "Batch normalization",
        "Training forward and backward on 64 x 256 x 56 x 56, and batch norm + "
        "add + relu against torch's three ops. GB/s counts the passes of three-pass kernels: forward "
        "reads x twice and writes y, backward reads x and dy twice and writes dx, the add + relu forms "
        "add z (and dz).",
        4,
    ),
    "normalization": (
        "LRN, layer norm and RMS norm",
        "Cross-channel LRN (n = 5) on 64 x 256 x 56 x 56, NCHW and "
        "NHWC; layer norm and RMS norm over rows of 32768 x 4096.",
        4,
    ),
    "softmax": (
        "Softmax",
        "Softmax over the last dim of 32768 x 4096, over 64 rows of 1,048,576, and across the "
        "channels of NCHW 64 x 1000 x 7 x 7.",
        4,
    ),
    "attention": (
        "Attention",
        "Scaled dot-product attention in bf16 against torch's SDPA (its fastest backend on the "
        "machine): head dim 128 at 4k and 16k tokens per sequence, causal and not, GQA 64/8 and 16 heads, "
        "forward and backward (dq, dk, dv); head dims 64 and 256 forward; GPT-2 small's causal attention "
        "(12 heads of 64, 8 sequences of 1,024 tokens) forward and backward; a packed batch of five sequences "
        "of 16,384 tokens against one torch call per sequence; the fp8 forward (e4m3 q, k, v, P scaled to "
        "e4m3's largest value, bf16 o) against torch's bf16 SDPA on the same values. FLOPs: 4 B Hq Sq Skv D "
        "forward, halved when causal, 2.5x for the backward.",
        4,
    ),
    "graph": (
        "Graph API plans",
        "Plans of `opendnn.graph`, executed with a variant pack, against the same computation in torch: "
        "relu(x * s1 + b1 + (z * s2 + b2)) over 64 x 256 x 56 x 56, NCHW and NHWC, as one generated kernel "
        "against torch eager's six kernels and against `torch.compile` of the same function (`_compiled`), "
        "beside the copy of that tensor; batch norm apply + relu + 3x3 convolution + per-channel sum and "
        "sum of squares (ResNet-50 layer 3, batch 64, NHWC) against torch's five ops with cuDNN's "
        "convolution, beside the bare convolution; `execute_host`: 1000 executes of a built three-node plan "
        "against torch's three ops as often, on a drained GPU (ms for 1000 calls read as us a call). "
        "The dtype cell names each plan's engine and its kernel launches per execute.",
        4,
    ),
    "graph_attention": (
        "Graph API attention",
        "`sdpa` and `sdpa_backward` plans of `opendnn.graph` in bf16 on the attention suite's GQA 64/8 "
        "heads of 128, 4k tokens, batch 4, causal, BSHD: the forward followed by a residual add against "
        "torch's SDPA and add, the backward (dq, dk, dv) against torch's autograd of its SDPA. FLOPs as "
        "the attention suite's.",
        4,
    ),
    "models": (
        "Whole models",
        "torchvision's ResNet-50, MobileNetV2, EfficientNet-B0 and ConvNeXt-tiny at batch 64, 224 x 224, "
        "bf16 autocast, "
        "channels_last: the same model converted to opendnn (`opendnn.torch.convert`) against torch/cuDNN; "
        "unet (a U-Net in plain torch, `benchmarks/unet.py`, bilinear upsampling in its decoder, a class per "
        "pixel) the same way at the batch its row names; "
        "gpt2_small (GPT-2 small in plain torch, `benchmarks/gpt2.py`), bf16 autocast: its attention "
        "routed to opendnn (`opendnn.torch.attention.scaled_dot_product_attention`) against torch's SDPA, "
        "every other operation torch's on both sides; "
        "(fused): `opendnn.torch.fuse` of the converted model against torch's plain one; (graph): each "
        "side's step captured in a CUDA graph and replayed (the GPU's time without the host's); (compiled): "
        'each side under `torch.compile(mode="reduce-overhead")`; (opendnn backend): torch\'s model under '
        '`torch.compile(backend="opendnn")` with CUDA graphs against `torch.compile(mode="reduce-overhead")`. '
        "Training is one SGD step.",
        2,
    ),
    "eager": (
        "Eager training step",
        "One SGD training step of the converted model (and of "
        "`opendnn.torch.fuse(model.train())` of it) against torch's, batch 64, bf16 autocast, channels_last, "
        "in rounds of ten steps back to back, interleaved in one process.",
        2,
    ),
    "data_parallel": (
        "Data parallel",
        "DDP over NCCL (`NCCL_NVLS_ENABLE=0`), one process per GPU, every layer "
        "on opendnn: images per second on one and on two GPUs.",
        2,
    ),
}
LEGEND = (
    "ratio = torch time / opendnn time: above 1, opendnn is faster. GB/s counts the fewest bytes each op "
    "must move (each input read once, the output written once) unless its table says otherwise; TFLOP/s "
    "counts 2 flops per multiply-add; check: relative norm error against torch's result. A figure its run "
    "did not record is shown as -."
)


def versions() -> dict[str, Any]:
    """torch, Triton, cuDNN and opendnn versions of this process."""
    import torch

    import opendnn

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "cudnn": torch.backends.cudnn.version(),
        "opendnn": opendnn.__version__,
    }


_LOCATIONS = ("--out", "--results", "--markdown", "--chart")  # where a run writes: no part of what it measured


def gpu_run(gpu: str, command: str, timing: str) -> dict[str, Any]:
    """The run entry of a measurement taken now on ``gpu`` by ``command`` (less the options that name
    where it writes, which are the machine's own paths)."""
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = measuring(command)
    return {"date": now[:10], "time": now, "gpu": gpu, **versions(), "command": f"`{command}`", "timing": timing}


def measuring(command: str) -> str:
    """``command`` without its output locations (``--out DIR``, ``--results=FILE``, ...)."""
    kept: list[str] = []
    skip = False
    for word in command.split(" "):
        if skip:
            skip = False
        elif word in _LOCATIONS:
            skip = True
        elif not word.startswith(tuple(f"{option}=" for option in _LOCATIONS)):
            kept.append(word)
    return " ".join(kept)


def load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def save_run(path: Path, run: dict[str, Any], suites: dict[str, list[dict[str, Any]]]) -> None:
    """Adds ``run`` (date, time, gpu, versions, command, timing) to the results file at ``path`` and replaces
    the rows of ``suites`` it measured (the row of the same suite and identity), keeping the others."""
    path = Path(path)
    results = load(path) if path.exists() else {"gpu": run["gpu"], "runs": {}, "suites": {}}
    check_gpu(results, run["gpu"], path)
    run_id = f"{run.get('time', run['date'])} {run['command']}"
    results["runs"][run_id] = run
    for suite, rows in suites.items():
        fresh = {identity(row): {**row, "run": run_id} for row in rows}
        old = results["suites"].get(suite, [])
        replaced = [fresh.pop(identity(row), row) for row in old]  # a re-measured row keeps its place
        results["suites"][suite] = replaced + list(fresh.values())
    used = {row["run"] for rows in results["suites"].values() for row in rows}
    results["runs"] = {key: value for key, value in results["runs"].items() if key in used}
    results["notes"] = {
        suite: kept
        for suite, notes in results.get("notes", {}).items()
        if (kept := [note for note in notes if note["run"] in used])
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def check_gpu(results: dict[str, Any], gpu: str, path: Path) -> None:
    """A results file holds one GPU's rows."""
    if results["gpu"] != gpu:
        raise SystemExit(
            f"--results {path} holds {results['gpu']} rows, and this GPU is {gpu}: name another results file"
        )


def identity(row: dict[str, Any]) -> tuple[Any, ...]:
    dtype = row.get("dtype")
    return tuple(row.get(key) for key in KEYS[:-1]) + (dtype.split()[0] if dtype else None,)


def write_report(results_path: Path = RESULTS, markdown_path: Path = MARKDOWN, chart_path: Path = CHART) -> None:
    """BENCHMARKS.md and the chart of the ratios, from the results file; the CPU backend's section and
    the host-cost section from the ``cpu.json`` and ``host_cpu.json`` beside it, when they are there."""
    results = load(results_path)
    chart(results, chart_path)
    sections = []
    for name, section in ((CPU_RESULTS, cpu_table), (HOST_RESULTS, host_section)):
        path = Path(results_path).parent / name
        if path.exists():
            sections.append(section(load(path), _relative(path, markdown_path.parent)))
    chart_file, results_file = (_relative(p, markdown_path.parent) for p in (chart_path, results_path))
    markdown_path.write_text(markdown(results, chart_file, results_file, sections))


def host_section(host: dict[str, Any], results_file: str) -> list[str]:
    """The host cost per call through ``opendnn.torch`` (CPU, kernels stubbed) beside torch's own op."""
    run = host["run"]
    lines = [
        "## Host cost per call (CPU, kernels stubbed)",
        "",
        "The Python a call through `opendnn.torch` costs on the host: a converted module on a tiny channels-last "
        "input (dtype under the table), with Triton's interpreter and every kernel replaced by a no-op, against "
        "the same torch module on the same input (torch's CPU op on a tiny input costs about its host path). "
        "`forward` is an eval-mode forward under `torch.no_grad`; `train step` is forward, `.float().sum()` and "
        "backward. `fused` is conv + batch norm + relu through `opendnn.torch.fuse` against torch's three "
        "modules. ratio = torch us / opendnn us (above 1: opendnn's host path is cheaper). From "
        f"[{results_file}]({results_file}).",
        "",
        "| op | mode | opendnn us | torch us | ratio |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['op']} | {row['mode']} | {row['opendnn_us']:.1f} | {row['torch_us']:.1f} | {row['ratio']:.2f} |"
        for row in host["rows"]
    ]
    lines += [
        "",
        f"{run['date']}, {run['cpu']}; torch {run['torch']}, Triton {run['triton']}, opendnn {run['opendnn']}, "
        f"Python {run['python']}. {run['command']}. {run['timing']}, load average {run['load']}.",
    ]
    return lines


def markdown(results: dict[str, Any], chart_file: str, results_file: str, sections: Sequence[list[str]] = ()) -> str:
    """The report; ``sections``: further sections after the GPU suites, each a list of lines starting
    with its "## " heading (the CPU backend's, the host cost's)."""
    suites = ordered_suites(results)
    lines = [
        "# Benchmarks",
        "",
        f"opendnn against torch (cuDNN, cuBLAS, ATen kernels) on one {results['gpu']}: the same process, the same "
        "inputs, every row checked against torch before it is timed. Each row holds the most recent figures "
        "recorded for its case; the runs under each table give their date, versions, command and timing, and "
        "a note under a table says where a later run recorded only a range over several rows.",
        "",
        LEGEND,
        "",
        f"Written by `python benchmarks/run.py --report` from [{results_file}]({results_file}). A GPU run of "
        "`benchmarks/run.py` or `benchmarks/models.py` replaces the rows it measures there.",
        "",
        f"![torch time / opendnn time of every row, per suite]({chart_file})",
        "",
        *(f"- [{title(name)}](#{_anchor(title(name))})" for name in suites),
        *(f"- [{section[0][3:]}](#{_anchor(section[0][3:])})" for section in sections),
    ]
    for name in suites:
        lines += ["", *suite_table(results, name)]
    for section in sections:
        lines += ["", *section]
    return "\n".join(lines) + "\n"


def cpu_table(results: dict[str, Any], results_file: str) -> list[str]:
    """The CPU backend section: each row of benchmarks/cpu.py's results, its run line and note."""
    lines = [
        f"## {CPU_TITLE}",
        "",
        "The NumPy backend (what runs without a GPU) against torch's CPU kernels, float32, in one process on "
        "the same inputs, every row checked against torch before it is timed: convolution through the "
        "cuDNN-shaped calls, the rest through `opendnn.functional` on NumPy arrays. ratio = torch time / "
        f"opendnn time. From [{results_file}]({results_file}).",
        "",
        "| op | shape | direction | torch ms | opendnn ms | ratio |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['op']} | {row['shape']} | {row['direction']} | {row['torch_ms']:.2f} | {row['opendnn_ms']:.2f} | "
        f"{row['ratio']:.2f} |"
        for row in results["rows"]
    ]
    versions = f"torch {results['torch']} ({results['torch_threads']} threads), NumPy {results['numpy']}, "
    lines += [
        "",
        f"Run: {results['date']}, {results['cpu']}, {results['cores']} cores; {versions}opendnn {results['opendnn']}. "
        f"{results['command']}. {results['timing']}",
    ]
    return lines + (["", results["note"]] if results.get("note") else [])


def ordered_suites(results: dict[str, Any]) -> list[str]:
    present = [name for name, rows in results["suites"].items() if rows]
    return [name for name in SUITES if name in present] + [name for name in present if name not in SUITES]


def title(suite: str) -> str:
    return SUITES[suite][0] if suite in SUITES else suite


def suite_table(results: dict[str, Any], suite: str) -> list[str]:
    rows = results["suites"][suite]
    _, about, ms_decimals = SUITES.get(suite, (suite, "", 4))
    runs = list(dict.fromkeys(row["run"] for row in rows))
    letters = {run: _letter(index) for index, run in enumerate(runs)}
    columns = [(key, header, spec) for key, header, spec in COLUMNS if any(row.get(key) is not None for row in rows)]
    lines = [f"## {title(suite)}", ""] + ([about, ""] if about else [])
    lines += [
        "| " + " | ".join([header for _, header, _ in columns] + ["run"]) + " |",
        "|" + "---|" * (len(columns) + 1),
    ]
    for row in rows:
        cells = [_cell(row, key, f".{ms_decimals}f" if spec == "ms" else spec) for key, _, spec in columns]
        lines.append("| " + " | ".join(cells + [letters[row["run"]]]) + " |")
    lines += ["", "Runs:", ""]
    lines += [f"- {letters[run]}: {describe_run(results['runs'][run])}" for run in runs]
    notes = [note for note in results.get("notes", {}).get(suite, []) if note["run"] in letters]
    lines += [line for note in notes for line in ("", note["text"].format(run=letters[note["run"]]))]
    return lines


def describe_run(run: dict[str, Any]) -> str:
    versions = f"torch {run['torch']}, Triton {run['triton']}, cuDNN {_cudnn(run['cudnn'])}, opendnn {run['opendnn']}"
    return f"{run['date']}, {run['gpu']}; {versions}. {run['command']}. {run['timing']}"


def chart(results: dict[str, Any], path: Path) -> None:
    """One column of points per suite: each row's ratio on a log scale, the suite's median as a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    suites = [
        (name, ratios)
        for name in ordered_suites(results)
        if (ratios := [row["ratio"] for row in results["suites"][name] if row.get("ratio")])
    ]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.9 * len(suites) + 2), 5.0))
    for position, (_, ratios) in enumerate(suites):
        spread = [position + 0.3 * (_jitter(index) - 0.5) for index in range(len(ratios))]
        axes.scatter(spread, ratios, s=14, alpha=0.7)
        axes.hlines(statistics.median(ratios), position - 0.35, position + 0.35, colors="black", linewidth=1.5)
    axes.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    axes.set_yscale("log")
    every = [ratio for _, ratios in suites for ratio in ratios]
    powers = range(math.floor(math.log2(min(every, default=1.0))), math.ceil(math.log2(max(every, default=1.0))) + 1)
    axes.yaxis.set_major_locator(ticker.FixedLocator([2.0**power for power in powers]))
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(ticker.NullFormatter())
    axes.set_xticks(range(len(suites)), [title(name) for name, _ in suites], rotation=35, ha="right")
    axes.set_ylabel("torch time / opendnn time")
    axes.set_title(f"opendnn against torch on one {results['gpu']} (above 1: opendnn faster; bars: medians)")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(figure)


def _cell(row: dict[str, Any], key: str, spec: str | None) -> str:
    value = row.get(key)
    if key == "check":
        return _check(row)
    if value is None:
        return "-"
    if spec is None:
        return str(value)
    return _number(value, spec)


def _number(value: float, spec: str) -> str:
    """``value`` in the column's format, or as recorded when the record has more digits than the format
    keeps (a measured figure is never rounded into a better one)."""
    text = format(value, spec)
    decimals = spec.rsplit(".", 1)[-1].rstrip("f") if "." in spec else ""
    recorded = repr(float(value)).split(".")[-1]
    if decimals.isdigit() and float(text.replace(",", "")) != value and len(recorded) <= int(decimals) + 2:
        return format(value, ",") if "," in spec else repr(float(value))
    return text


def _check(row: dict[str, Any]) -> str:
    if row.get("check") is None:
        return "-"
    if row["check"] == "ok":
        return f"ok ({row['rel_err']:.1e})" if row.get("rel_err") is not None else "ok"
    message = (row.get("error") or "").replace("|", "\\|").replace("\n", " ")
    return f"**{row['check']}**: {message[:200]}"


def _cudnn(version: Any) -> str:
    if isinstance(version, int):
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100} ({version})"
    return str(version)


def _letter(index: int) -> str:
    letters = string.ascii_uppercase
    return letters[index] if index < len(letters) else letters[index // 26 - 1] + letters[index % 26]


def _jitter(index: int) -> float:
    """A spread in [0, 1) that is the same on every run: the fractional part of index times the golden ratio."""
    return math.fmod(index * 0.6180339887498949, 1.0)


def _anchor(heading: str) -> str:
    """The fragment GitHub gives a heading."""
    kept = "".join(ch for ch in heading.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _relative(target: Path, start: Path) -> str:
    try:
        return Path(target).resolve().relative_to(Path(start).resolve()).as_posix()
    except ValueError:
        return Path(target).resolve().as_posix()
