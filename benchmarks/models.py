"""Whole torchvision models: torch/cuDNN against the same model converted to opendnn, same process.

Usage (on the GPU machine, from the repository root; torchvision: benchmarks/README.md)::

    PYTHONPATH=. python3 benchmarks/models.py --out results
    PYTHONPATH=. python benchmarks/models.py --device cpu --batch 2 --size 64 --out /tmp/models  # smoke

For ResNet-50 and MobileNetV2 (``weights=None``, seeded initialisation), bf16 autocast,
channels_last inputs and weights, batch 64 at 224x224 by default:

- inference: one batch's eval-mode forward under ``torch.no_grad``;
- training: one SGD step (momentum 0.9): zero the gradients, forward, cross-entropy on random
  labels (torch's loss on both sides), backward, update.
- with ``--graph``, both again, each side's step captured in a CUDA graph and timed by replaying
  it: the GPU's time alone, without the Python that launches the kernels (``--profile`` writes where
  an eager step's time goes);
- with ``--fused``, the converted copy passed through ``opendnn.torch.fuse`` against torch's unfused
  model: inference (conv + batch norm [+ add] [+ relu] as one call) and training (batch norm [+ add]
  [+ relu] as one call each way);
- with ``--compiled``, both steps again with each side's model under
  ``torch.compile(mode="reduce-overhead")`` (inductor, and CUDA graphs on a GPU: the converted model's
  ``opendnn::`` operators in inductor's graphs against torch's own operators compiled by inductor),
  each step marking a new CUDA-graph iteration (``torch.compiler.cudagraph_mark_step_begin``); on the
  CPU, reduce-overhead simply compiles (``--modes`` picks modes);
- with ``--backend``, both steps of torch's own (unconverted) model under
  ``torch.compile(backend="opendnn", options={"cudagraphs": True})`` (``opendnn.torch.compile_backend``:
  the FX graphs' supported regions as opendnn graph plans, CUDA graphs where the shapes are static)
  against the same model under ``torch.compile(mode="reduce-overhead")`` (inductor with CUDA graphs).

torch's model runs as it is (``torch.backends.cudnn.benchmark`` on); opendnn's is a deep copy passed
through ``opendnn.torch.convert`` and run inside ``functional_calls()`` (MobileNetV2's forward calls
``F.adaptive_avg_pool2d`` itself). Each is called a few times first (Triton compilation, cuDNN's
algorithm search), then timed: on CUDA the median of ``triton.testing.do_bench`` (L2 flushed between
calls; opendnn's time includes its Python dispatch), on the CPU the median of ``time.perf_counter``
runs (a smoke run, not a figure). ``ratio = torch ms / opendnn ms``: above 1, opendnn is faster.
The inference row also gives the logits' relative norm error against torch's (bf16: expect ~1e-2).
Anchor: torch's time for the same step in a separate measurement on one H200 (torch 2.11, cuDNN 9.19).

Writes ``<out>/models.json`` (a list of rows) and ``<out>/models.md`` and prints the Markdown table; a CUDA
run also saves its rows in the results file (``--results``, default ``benchmarks/results/h200.json``), where
they replace the rows of the same model and mode (``report.py``).
Exits with status 1 when a row raised, 2 when torchvision is absent.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import report
import torch
import torch.nn.functional as TF

import opendnn.torch as ot
from opendnn.samples import relative_error
from opendnn.torch.graphs import capture

MODELS = ("resnet50", "mobilenet_v2")
# torch 2.11 + cuDNN 9.19 on one H200, batch 64, bf16 autocast, channels_last (a separate measurement)
ANCHOR_MS = {
    ("resnet50", "inference"): 8.51,
    ("resnet50", "training"): 29.98,
    ("mobilenet_v2", "inference"): 7.90,
    ("mobilenet_v2", "training"): 20.46,
}
CLASSES = 1000
TIMING = (
    "Per step: medians of `triton.testing.do_bench` (L2 flushed), host included; (graph) modes replay a "
    "CUDA graph of the step."
)
COLUMNS = [
    "model",
    "mode",
    "torch ms",
    "opendnn ms",
    "torch img/s",
    "opendnn img/s",
    "ratio",
    "anchor torch ms",
    "check",
]

Timer = Callable[[Callable[[], Any]], float]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time torchvision models on torch/cuDNN and converted to opendnn.")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default {','.join(MODELS)})")
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="image height and width (default 224)")
    parser.add_argument("--out", default="results", help="directory for models.json and models.md")
    parser.add_argument("--warmup", type=float, default=200.0, help="do_bench warm-up, ms (default 200)")
    parser.add_argument("--rep", type=float, default=1000.0, help="do_bench timed repetitions, ms (default 1000)")
    parser.add_argument(
        "--graph",
        action="store_true",
        help="also time both sides' steps captured in a CUDA graph (no host work per replay)",
    )
    parser.add_argument(
        "--fused",
        action="store_true",
        help="also time opendnn.torch.fuse's models against torch's plain one: inference (conv + "
        "batch norm [+ add] [+ relu] as one call) and training (batch norm [+ add] [+ relu])",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="also time both models under torch.compile(mode='reduce-overhead'): inference and training",
    )
    parser.add_argument(
        "--backend",
        action="store_true",
        help="also time torch's model under torch.compile(backend='opendnn') with CUDA graphs against "
        "torch.compile(mode='reduce-overhead'): inference and training",
    )
    parser.add_argument(
        "--modes",
        default="",
        help="only these modes, comma-separated (e.g. 'inference,inference (fused, graph)'); default all",
    )
    parser.add_argument(
        "--results",
        default=str(report.RESULTS),
        help="results file a CUDA run saves its rows in ('': none; default benchmarks/results/h200.json)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also write <out>/profile_<model>_<mode>.txt: torch.profiler's busiest kernels and "
        "host time over two opendnn calls (CUDA only)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torchvision.models as builders
    except ImportError as error:
        print(
            f"benchmarks/models.py needs torchvision ({error}); benchmarks/README.md says which version to install",
            file=sys.stderr,
        )
        return 2
    device = torch.device(args.device)
    results = Path(args.results) if args.results and device.type == "cuda" else None
    if results is not None and results.exists():  # before the measuring: does the file hold this GPU?
        report.check_gpu(report.load(results), torch.cuda.get_device_name(device), results)
    torch.backends.cudnn.benchmark = True
    timer = _cuda_timer(args.warmup, args.rep) if device.type == "cuda" else _cpu_timer()
    rows = []
    for name in args.models.split(","):

        def build(name: str = name) -> torch.nn.Module:
            return getattr(builders, name)(weights=None)

        profile_to = Path(args.out) if args.profile and device.type == "cuda" else None
        for row in measure(
            name,
            build,
            device,
            args.batch,
            args.size,
            timer,
            profile_to,
            args.graph and device.type == "cuda",
            args.fused,
            [m.strip() for m in re.split(r",(?![^(]*\))", args.modes) if m.strip()],
            args.compiled,
            args.backend,
        ):
            print(_progress_line(row), flush=True)
            rows.append(row)
    if results is not None:
        command = " ".join(["benchmarks/models.py", *(sys.argv[1:] if argv is None else argv)])
        report.save_run(
            results,
            report.gpu_run(torch.cuda.get_device_name(device), command, TIMING),
            {"models": [_saved(row) for row in rows]},
        )
        print(f"saved the rows in {results}")
    markdown = _markdown(_environment(device, args), rows, device.type == "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "models.md").write_text(markdown)
    print(f"\nwrote {out / 'models.json'} and {out / 'models.md'}\n\n{markdown}")
    return 0 if all(row["error"] is None for row in rows) else 1


def measure(
    name: str,
    build: Callable[[], torch.nn.Module],
    device: torch.device,
    batch: int,
    size: int,
    timer: Timer,
    profile_to: Path | None = None,
    graph: bool = False,
    fused: bool = False,
    only: list[str] | None = None,
    compiled: bool = False,
    backend: bool = False,
) -> list[dict[str, Any]]:
    """The inference and training rows of one model: torch's, then the converted copy's (and with
    ``profile_to``, a profile of each opendnn step; with ``graph``, the same two steps again, each
    side captured in a CUDA graph and timed by replaying it; with ``fused``, inference and
    training of the converted copy passed through ``opendnn.torch.fuse`` against torch's unfused model, eager and,
    with ``graph``, captured; with ``compiled``, both steps of each side's model under
    ``torch.compile(mode="reduce-overhead")``; with ``backend``, both steps of a copy of torch's model
    under the opendnn compile backend against torch's model under reduce-overhead); ``only``: these
    modes alone)."""
    torch.manual_seed(0)
    model = build().to(device, memory_format=torch.channels_last)
    ours = copy.deepcopy(model)
    lowered = copy.deepcopy(model)  # torch's model for the opendnn compile backend, before any step changes it
    report = ot.convert(ours)
    fused_models: dict[Callable[..., Any], torch.nn.Module] = {}  # ot.fuse(ours) per step kind, made when first used
    calls = ot.functional_calls()
    x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, CLASSES, (batch,), device=device)
    rows = []
    modes = ["inference", "training", *(("inference (graph)", "training (graph)") if graph else ())]
    modes += (
        [
            "inference (fused)",
            "training (fused)",
            *(("inference (fused, graph)", "training (fused, graph)") if graph else ()),
        ]
        if fused
        else []
    )
    modes += ["inference (compiled)", "training (compiled)"] if compiled else []
    modes += ["inference (opendnn backend)", "training (opendnn backend)"] if backend else []
    # every inference row first: a training row steps each side's optimizer as many times as its timer
    # calls it, after which the two models hold different parameters and their outputs no longer compare
    modes.sort(key=lambda mode: mode.startswith("training"))
    compiled_models: dict[int, torch.nn.Module] = {}  # torch.compile of each side's model, made when first used
    for mode in [m for m in modes if not only or m in only]:
        row: dict[str, Any] = {
            "model": name,
            "mode": mode,
            "batch": batch,
            "size": size,
            "torch_ms": None,
            "opendnn_ms": None,
            "torch_img_s": None,
            "opendnn_img_s": None,
            "ratio": None,
            "anchor_torch_ms": ANCHOR_MS.get((name, mode)),
            "rel_err": None,
            "error": None,
            "left_to_torch": [f"{n}: {kind} ({why})" for n, kind, why in report.left_alone],
        }
        step = inference_step if mode.startswith("inference") else training_step
        if "fused" in mode and step not in fused_models:  # folded for inference; bn + add + relu for training
            fused_models[step] = ot.fuse(ours.eval() if step is inference_step else ours.train())
        net = fused_models[step] if "fused" in mode else ours
        theirs = model
        context: AbstractContextManager[Any] = calls
        if "compiled" in mode:
            net, theirs = (compiled_models.setdefault(id(m), _compiled(m)) for m in (net, model))
        if "backend" in mode:
            net, theirs = (
                compiled_models.setdefault(id(lowered), _lowered(lowered)),
                compiled_models.setdefault(id(model), _compiled(model)),
            )
            context = nullcontext()
        torch_step, our_step = step(theirs, x, labels, nullcontext()), step(net, x, labels, context)
        if "compiled" in mode or "backend" in mode:
            torch_step, our_step = _new_iteration(torch_step), _new_iteration(our_step)
        try:
            if mode.endswith("graph)"):
                torch_step, our_step = capture(torch_step)[0].replay, capture(our_step)[0].replay
            row["torch_ms"] = timer(torch_step)
            if mode in ("inference", "inference (fused)", "inference (compiled)", "inference (opendnn backend)"):
                # (cloned: a CUDA-graph replay of reduce-overhead may overwrite a previous step's output)
                row["rel_err"] = relative_error(our_step().clone(), torch_step().clone())
            row["opendnn_ms"] = timer(our_step)
            if profile_to is not None and not mode.endswith("graph)"):
                _profile(our_step, profile_to / f"profile_{name}_{mode}.txt")
        except Exception as error:  # a refused problem or a failed kernel is a result, not a crash
            row["error"] = f"{type(error).__name__}: {error}"
        row["routed"] = dict(calls.routed)
        for side in ("torch", "opendnn"):
            if row[f"{side}_ms"] is not None:
                row[f"{side}_img_s"] = batch / (row[f"{side}_ms"] * 1e-3)
        if row["opendnn_ms"] is not None:
            row["ratio"] = row["torch_ms"] / row["opendnn_ms"]
        rows.append(row)
    return rows


def _saved(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the results file keeps it."""
    saved = {
        "model": row["model"],
        "mode": row["mode"],
        "batch": row["batch"],
        "shape": f"{row['size']}x{row['size']}",
        "torch_ms": row["torch_ms"],
        "opendnn_ms": row["opendnn_ms"],
        "ratio": row["ratio"],
        "check": "ok" if row["error"] is None else "error",
        "rel_err": row["rel_err"],
        "error": row["error"],
    }
    return {key: value for key, value in saved.items() if value is not None}


def inference_step(
    model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor, context: AbstractContextManager[Any]
) -> Callable[[], torch.Tensor]:
    model.eval()

    def run() -> torch.Tensor:
        with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False), context:
            return model(x)

    return run


def training_step(
    model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor, context: AbstractContextManager[Any]
) -> Callable[[], torch.Tensor]:
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=torch.bfloat16, cache_enabled=False), context:
            logits = model(x)
        loss = TF.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` under ``torch.compile(mode="reduce-overhead")``: the same parameters, compiled when first called."""
    return torch.compile(model, mode="reduce-overhead")  # type: ignore[return-value]


def _lowered(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` under the opendnn compile backend with CUDA graphs, compiled when first called."""
    from opendnn.torch.compile_backend import OpendnnBackend

    return torch.compile(model, backend=OpendnnBackend(), options={"cudagraphs": True})  # type: ignore[return-value]


def _new_iteration(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``step`` marking a new iteration for reduce-overhead's CUDA graphs first: the previous step's
    outputs are no longer read, so its replay may reuse their memory."""

    def iteration() -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return step()

    return iteration


def _profile(step: Callable[[], Any], path: Path, calls: int = 2) -> None:
    """torch.profiler over ``calls`` steps: wall time per step, and the operators and kernels sorted
    by their own GPU time (where the time goes: a slow kernel, or host work the GPU waits on)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / calls
    table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=70)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{calls} calls, wall {wall_ms:.2f} ms per call (profiler on)\n{table}\n")
    print(f"profile: {path} (wall {wall_ms:.2f} ms per call)", flush=True)


def _cuda_timer(warmup_ms: float, rep_ms: float, first_calls: int = 3) -> Timer:
    import triton.testing

    def timer(fn: Callable[[], Any]) -> float:
        for _ in range(first_calls):  # compilation and algorithm search, outside do_bench's estimate
            fn()
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return timer


def _cpu_timer(runs: int = 3) -> Timer:
    def timer(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return timer


def _environment(device: torch.device, args: argparse.Namespace) -> str:
    import torchvision

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    version = report.versions()
    return (
        f"{date}, {name}; torch {version['torch']}, torchvision {torchvision.__version__}, Triton "
        f"{version['triton']}, cuDNN {version['cudnn']}, opendnn {version['opendnn']}; "
        f"batch {args.batch} at {args.size}x{args.size}, bf16 autocast, channels_last."
    )


def _markdown(environment: str, rows: list[dict[str, Any]], cpu: bool) -> str:
    timing = (
        "medians of `time.perf_counter` runs (a CPU smoke run, not a performance figure)"
        if cpu
        else "medians of `triton.testing.do_bench` (L2 flushed)"
    )
    lines = [
        "# Whole models: torch/cuDNN against opendnn (converted)",
        "",
        environment,
        f"Times are {timing}; ratio = torch ms / opendnn ms (above 1: opendnn faster); training = one SGD "
        "step (forward, cross-entropy, backward, update); (graph): the same step captured in a CUDA graph "
        "and replayed, both sides (the GPU's time without the host's); (compiled): each side's model under "
        'torch.compile(mode="reduce-overhead"); (opendnn backend): torch\'s model under '
        'torch.compile(backend="opendnn") with CUDA graphs against reduce-overhead; check: the inference '
        "logits' relative norm error against torch's.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        check = (
            f"**error**: {row['error'][:200]}".replace("|", "\\|")
            if row["error"]
            else (f"ok ({row['rel_err']:.1e})" if row["rel_err"] is not None else "ok")
        )
        cells = [
            row["model"],
            row["mode"],
            _number(row["torch_ms"], ".2f"),
            _number(row["opendnn_ms"], ".2f"),
            _number(row["torch_img_s"], ",.0f"),
            _number(row["opendnn_img_s"], ",.0f"),
            _number(row["ratio"], ".2f"),
            _number(row["anchor_torch_ms"], ".2f"),
            check,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _progress_line(row: dict[str, Any]) -> str:
    return (
        f"{row['model']:<14} {row['mode']:<10} torch {_number(row['torch_ms'], '8.2f')} ms | "
        f"opendnn {_number(row['opendnn_ms'], '8.2f')} ms | ratio {_number(row['ratio'], '5.2f')} | "
        f"{row['error'] or 'ok'}"
    )


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
