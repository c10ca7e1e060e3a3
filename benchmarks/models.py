"""Whole models: torch against the same model with its layers (or its attention) on opendnn, same process.

Usage (on the GPU machine, from the repository root; torchvision: benchmarks/README.md)::

    PYTHONPATH=. python3 benchmarks/models.py --out results
    PYTHONPATH=. python3 benchmarks/models.py --models gpt2_small --out results
    PYTHONPATH=. python benchmarks/models.py --device cpu --batch 2 --size 64 --out /tmp/models  # smoke
    PYTHONPATH=. python benchmarks/models.py --models gpt2_small --device cpu --batch 2 --sequence 16 \
        --layers 1 --out /tmp/models  # smoke
    PYTHONPATH=. python benchmarks/models.py --models unet --device cpu --batch 2 --size 32 --out /tmp/models

The image models, torchvision's ResNet-50 and MobileNetV2 (the default ``--models``; ``weights=None``,
seeded initialisation): channels_last inputs and weights, batch 64 at 224x224 by default. The segmentation
model, ``unet`` (``benchmarks/unet.py``: a U-Net in plain torch, its decoder upsampling with
``nn.Upsample``), the same way at batch 16 by default, a class per pixel. The language
model, ``gpt2_small`` (``benchmarks/gpt2.py``: GPT-2 small in plain torch, seeded initialisation, causal
``F.scaled_dot_product_attention``): batch 8 of 1024 random tokens by default (``--sequence``; ``--layers``
blocks, 12 by default). Both with bf16 autocast:

- inference: one batch's eval-mode forward under ``torch.no_grad``;
- training: one SGD step (momentum 0.9): zero the gradients, forward, cross-entropy on random
  labels, for the language model each token's next one (torch's loss on both sides), backward, update.
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

torch's model runs as it is (``torch.backends.cudnn.benchmark`` on). For an image model, opendnn's is a
deep copy passed through ``opendnn.torch.convert`` and run inside ``functional_calls()`` (MobileNetV2's
forward calls ``F.adaptive_avg_pool2d`` itself). For the language model it is a deep copy whose attention
alone is routed to opendnn: its attention blocks call ``opendnn.torch.attention.scaled_dot_product_attention``
(the call ``opendnn.torch.enable()`` routes ``F.scaled_dot_product_attention`` to; ``enable()`` itself would
route the linear layers, layer norms and GELU too) in place of torch's SDPA, and every other operation is
torch's on both sides; ``--fused``, which converts every layer, skips it (``--backend`` compiles torch's
model as it is, so it runs every model).
Each side is called a few times first (Triton compilation, cuDNN's algorithm search), then timed: on CUDA
the median of ``triton.testing.do_bench`` (L2 flushed between calls; opendnn's time includes its Python
dispatch), on the CPU the median of ``time.perf_counter`` runs (a smoke run, not a figure).
``ratio = torch ms / opendnn ms``: above 1, opendnn is faster. Throughput: images per second, tokens per
second for the language model. The check is the logits' relative norm error against torch's (bf16: expect
~1e-2): each inference row's, and for the ``training`` row one eval-mode forward of each side before the
first step. Anchor: torch's time for the same step in a separate measurement on one H200 (torch 2.11,
cuDNN 9.19).

Writes ``<out>/models.json`` (a list of rows) and ``<out>/models.md`` and prints the Markdown table; a CUDA
run also saves its rows in the results file (``--results``, default ``benchmarks/results/h200.json``), where
they replace the rows of the same model and mode (``report.py``).
Exits with status 1 when a row raised, 2 when an image model is asked for and torchvision is absent.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpt2
import report
import torch
import torch.nn.functional as TF
import unet

import opendnn.torch as ot
from opendnn.torch.graphs import capture

IMAGE_MODELS = ("resnet50", "mobilenet_v2")  # torchvision's (any of its builders' names is taken)
SEGMENTATION_MODELS = ("unet",)  # benchmarks/unet.py
LANGUAGE_MODELS = ("gpt2_small",)  # benchmarks/gpt2.py
DEFAULT_BATCH = {"images": 64, "pixels": 16, "tokens": 8}
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
    "batch",
    "shape",
    "torch ms",
    "opendnn ms",
    "torch throughput",
    "opendnn throughput",
    "ratio",
    "anchor torch ms",
    "check",
]

Timer = Callable[[Callable[[], Any]], float]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Time whole models on torch and with their layers on opendnn.")
    parser.add_argument(
        "--models",
        default=",".join(IMAGE_MODELS),
        help=f"comma-separated: torchvision builders' names, {', '.join(LANGUAGE_MODELS)} "
        f"(default {','.join(IMAGE_MODELS)})",
    )
    parser.add_argument("--device", default="cuda:0", help="cuda:N (default cuda:0) or cpu")
    parser.add_argument(
        "--batch",
        type=int,
        help=f"images or sequences per step (default {DEFAULT_BATCH['images']} images, "
        f"{DEFAULT_BATCH['tokens']} sequences)",
    )
    parser.add_argument("--size", type=int, default=224, help="image height and width (default 224)")
    parser.add_argument(
        "--sequence", type=int, default=gpt2.POSITIONS, help=f"tokens per sequence (default {gpt2.POSITIONS})"
    )
    parser.add_argument("--layers", type=int, default=12, help="the language model's blocks (default 12)")
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
    names = args.models.split(",")
    builders = None
    if any(name not in (*LANGUAGE_MODELS, *SEGMENTATION_MODELS) for name in names):
        try:
            import torchvision.models as builders
        except ImportError as error:
            print(
                f"benchmarks/models.py needs torchvision for its image models ({error}); benchmarks/README.md "
                "says which version to install",
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
    for name in names:
        profile_to = Path(args.out) if args.profile and device.type == "cuda" else None
        whole_model = name not in LANGUAGE_MODELS  # --fused converts every layer (the compile backend lowers any)
        for row in measure(
            name,
            _subject(name, args, device, builders),
            timer,
            profile_to,
            args.graph and device.type == "cuda",
            args.fused and whole_model,
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
    markdown = _markdown(_environment(device), rows, device.type == "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "models.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "models.md").write_text(markdown)
    print(f"\nwrote {out / 'models.json'} and {out / 'models.md'}\n\n{markdown}")
    return 0 if all(row["error"] is None for row in rows) else 1


def _subject(name: str, args: argparse.Namespace, device: torch.device, builders: Any) -> Subject:
    """The model ``name`` on both sides at the command line's batch and shape (``builders``: torchvision's)."""
    if name in LANGUAGE_MODELS:
        build = functools.partial(gpt2.GPT2, args.layers, positions=max(gpt2.POSITIONS, args.sequence))
        return tokens(build, device, args.batch or DEFAULT_BATCH["tokens"], args.sequence)
    if name in SEGMENTATION_MODELS:
        return images(unet.UNet, device, args.batch or DEFAULT_BATCH["pixels"], args.size, per_pixel=True)
    build = functools.partial(getattr(builders, name), weights=None)
    return images(build, device, args.batch or DEFAULT_BATCH["images"], args.size)


@dataclass
class Subject:
    """One model on both sides: torch's model, the copy that runs on opendnn, and one step's data."""

    model: torch.nn.Module  # torch's, as it is
    ours: torch.nn.Module  # the copy that runs on opendnn
    context: AbstractContextManager[Any]  # what the copy's steps run inside
    x: torch.Tensor  # one step's input
    labels: torch.Tensor  # its cross-entropy targets: a class per image, or each token's next token
    batch: int
    shape: str  # one item's: "224x224", "1024 tokens, 12 blocks"
    items: int  # what one step processes: images or tokens
    unit: str  # the throughput's: "img/s" or "tok/s"
    left_to_torch: list[str]  # what the copy leaves to torch, and why


def images(
    build: Callable[[], torch.nn.Module], device: torch.device, batch: int, size: int, per_pixel: bool = False
) -> Subject:
    """An image model (seeded initialisation, channels_last) and its copy converted by ``opendnn.torch.convert``,
    run inside ``functional_calls()``; a batch of random images and labels: one per image, or, for a
    segmentation model (``per_pixel``, ``unet.CLASSES`` classes), one per pixel."""
    torch.manual_seed(0)
    model = build().to(device, memory_format=torch.channels_last)
    ours = copy.deepcopy(model)
    conversion = ot.convert(ours)
    x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
    labels = (
        torch.randint(0, unet.CLASSES, (batch, size, size), device=device)
        if per_pixel
        else torch.randint(0, CLASSES, (batch,), device=device)
    )
    left = [f"{n}: {kind} ({why})" for n, kind, why in conversion.left_alone]
    return Subject(model, ours, ot.functional_calls(), x, labels, batch, f"{size}x{size}", batch, "img/s", left)


def tokens(build: Callable[[], torch.nn.Module], device: torch.device, batch: int, sequence: int) -> Subject:
    """A language model (``gpt2.GPT2``, seeded initialisation) and its copy whose attention alone runs on
    opendnn (``opendnn.torch.attention.scaled_dot_product_attention``); a batch of random token sequences,
    each token's target the next."""
    torch.manual_seed(0)
    model = build().to(device)
    ours = copy.deepcopy(model)
    blocks = gpt2.route_attention(ours, ot.attention.scaled_dot_product_attention)
    vocabulary = model.get_submodule("token_embedding").num_embeddings
    text = torch.randint(0, vocabulary, (batch, sequence + 1), device=device)
    x, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    left = ["every operation but the attention (embeddings, linear layers, layer norms, GELU)"]
    shape = f"{sequence} tokens, {blocks} block{'s' if blocks != 1 else ''}"
    return Subject(model, ours, nullcontext(), x, labels, batch, shape, batch * sequence, "tok/s", left)


def measure(
    name: str,
    subject: Subject,
    timer: Timer,
    profile_to: Path | None = None,
    graph: bool = False,
    fused: bool = False,
    only: list[str] | None = None,
    compiled: bool = False,
    backend: bool = False,
) -> list[dict[str, Any]]:
    """The inference and training rows of one model: torch's, then the copy's that runs on opendnn (and with
    ``profile_to``, a profile of each opendnn step; with ``graph``, the same two steps again, each
    side captured in a CUDA graph and timed by replaying it; with ``fused``, inference and
    training of the converted copy passed through ``opendnn.torch.fuse`` against torch's unfused model, eager and,
    with ``graph``, captured; with ``compiled``, both steps of each side's model under
    ``torch.compile(mode="reduce-overhead")``; with ``backend``, both steps of a copy of torch's model
    under the opendnn compile backend against torch's model under reduce-overhead); ``only``: these
    modes alone)."""
    model, ours, calls, x, labels = subject.model, subject.ours, subject.context, subject.x, subject.labels
    # torch's model for the opendnn compile backend, before any step changes it
    lowered = copy.deepcopy(model) if backend else None
    fused_models: dict[Callable[..., Any], torch.nn.Module] = {}  # ot.fuse(ours) per step kind, made when first used
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
            "batch": subject.batch,
            "shape": subject.shape,
            "unit": subject.unit,
            "torch_ms": None,
            "opendnn_ms": None,
            "torch_items_s": None,
            "opendnn_items_s": None,
            "ratio": None,
            "anchor_torch_ms": ANCHOR_MS.get((name, mode)),
            "rel_err": None,
            "error": None,
            "left_to_torch": subject.left_to_torch,
        }
        step = inference_step if mode.startswith("inference") else training_step
        if "fused" in mode and step not in fused_models:  # folded for inference; bn + add + relu for training
            fused_models[step] = ot.fuse(ours.eval() if step is inference_step else ours.train())
        net = fused_models[step] if "fused" in mode else ours
        theirs = model
        context: AbstractContextManager[Any] = calls
        if "compiled" in mode:
            net, theirs = (compiled_models.setdefault(id(m), _compiled(m)) for m in (net, model))
        if lowered is not None and "backend" in mode:
            net, theirs = (
                compiled_models.setdefault(id(lowered), _lowered(lowered)),
                compiled_models.setdefault(id(model), _compiled(model)),
            )
            context = nullcontext()
        try:
            if mode == "training":  # one forward of each side's parameters as they are before the first step
                row["rel_err"] = relative_error(
                    inference_step(net, x, labels, context)(), inference_step(theirs, x, labels, nullcontext())()
                )
            torch_step, our_step = step(theirs, x, labels, nullcontext()), step(net, x, labels, context)
            if "compiled" in mode or "backend" in mode:
                torch_step, our_step = _new_iteration(torch_step), _new_iteration(our_step)
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
        row["routed"] = dict(getattr(calls, "routed", {}))  # functional_calls' count of what it routed
        for side in ("torch", "opendnn"):
            if row[f"{side}_ms"] is not None:
                row[f"{side}_items_s"] = subject.items / (row[f"{side}_ms"] * 1e-3)
        if row["opendnn_ms"] is not None:
            row["ratio"] = row["torch_ms"] / row["opendnn_ms"]
        rows.append(row)
    return rows


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float32 on the tensors' device (a language model's logits,
    8 x 1024 x 50257, are too large for a float64 copy on the host); inf when ``actual`` is not finite."""
    actual, expected = actual.float(), expected.float()
    if not bool(torch.isfinite(actual).all()):
        return float("inf")
    return float(torch.linalg.vector_norm(actual - expected) / torch.linalg.vector_norm(expected))


def _saved(row: dict[str, Any]) -> dict[str, Any]:
    """A row as the results file keeps it."""
    saved = {
        "model": row["model"],
        "mode": row["mode"],
        "batch": row["batch"],
        "shape": row["shape"],
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
        # (batch, classes) against (batch,), (batch, H, W, classes) against (batch, H, W), or (batch,
        # sequence, vocabulary) against (batch, sequence)
        loss = TF.cross_entropy(logits.float().flatten(0, -2), labels.flatten())
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


def _environment(device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    version = report.versions()
    try:
        import torchvision

        vision = f", torchvision {torchvision.__version__}"
    except ImportError:  # (a run of the language model alone needs none)
        vision = ""
    return (
        f"{date}, {name}; torch {version['torch']}{vision}, Triton {version['triton']}, cuDNN {version['cudnn']}, "
        f"opendnn {version['opendnn']}; bf16 autocast, image models channels_last."
    )


def _markdown(environment: str, rows: list[dict[str, Any]], cpu: bool) -> str:
    timing = (
        "medians of `time.perf_counter` runs (a CPU smoke run, not a performance figure)"
        if cpu
        else "medians of `triton.testing.do_bench` (L2 flushed)"
    )
    lines = [
        "# Whole models: torch against opendnn",
        "",
        environment,
        "Image models: converted to opendnn against torch/cuDNN; gpt2_small: its attention routed to opendnn "
        "(`opendnn.torch.attention.scaled_dot_product_attention`) against torch's SDPA, every other operation "
        f"torch's on both sides. Times are {timing}; ratio = torch ms / opendnn ms (above 1: opendnn faster); "
        "training = one SGD step (forward, cross-entropy, backward, update); (graph): the same step captured in "
        "a CUDA graph and replayed, both sides (the GPU's time without the host's); (compiled): each side's "
        'model under torch.compile(mode="reduce-overhead"); (opendnn backend): torch\'s model under '
        'torch.compile(backend="opendnn") with CUDA graphs against reduce-overhead; throughput: images or '
        "tokens per second; check: the logits' relative norm error against torch's (training: one forward "
        "before the first step).",
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
            str(row["batch"]),
            row["shape"],
            _number(row["torch_ms"], ".2f"),
            _number(row["opendnn_ms"], ".2f"),
            _number(row["torch_items_s"], ",.0f", f" {row['unit']}"),
            _number(row["opendnn_items_s"], ",.0f", f" {row['unit']}"),
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


def _number(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else format(value, spec) + unit


if __name__ == "__main__":
    sys.exit(main())
