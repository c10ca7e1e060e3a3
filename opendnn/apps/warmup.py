"""``opendnn warmup``: compile the kernels of a torch model's step before the step runs, in parallel
(``opendnn.torch.warmup``)."""

from __future__ import annotations

import argparse
import copy
import importlib
import time
from collections.abc import Callable
from typing import Any

from opendnn.apps.command_line import TRITON_PACKAGES, USAGE_ERROR, CommandError, positive_int, require_packages

DESCRIPTION = """\
Compiles, in parallel processes, every kernel that one step of a model on opendnn launches, into
Triton's on-disk cache (TRITON_CACHE_DIR) for the current GPU, so that the first step of training
or inference finds them there instead of compiling each on its first launch, e.g.
  opendnn warmup --model torchvision:resnet50 --input 64x3x224x224 --dtype bfloat16 --channels-last
The model is made by calling MODULE:FUNCTION without arguments, converted to opendnn
(opendnn.torch.convert) and run once on a random input without launching a kernel, to collect
what it would launch. Prints how many distinct kernels were compiled and found cached.
Exit status: 0 (compiled), 1 (no GPU, or a package missing), 2 (a bad command line)."""

DTYPES = ("float32", "bfloat16", "float16")


def input_shape(text: str) -> tuple[int, ...]:
    """An argparse type: sizes separated by x (``64x3x224x224``), each a positive integer."""
    parts = text.split("x")
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not an input shape like 64x3x224x224: positive sizes and x")
    return tuple(int(part) for part in parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        required=True,
        default=argparse.SUPPRESS,
        help="MODULE:FUNCTION that makes the torch model when called without arguments (torchvision:resnet50)",
    )
    parser.add_argument("--input", type=input_shape, required=True, default=argparse.SUPPRESS, help="N x C x ...")
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the step's compute dtype: bfloat16 and float16 run it under torch.autocast, the model's "
        "parameters and statistics staying float32, as mixed-precision training runs",
    )
    parser.add_argument("--channels-last", action="store_true", help="model and input in channels-last order")
    parser.add_argument("--eval", action="store_true", help="an inference step (forward alone), not a training one")
    parser.add_argument("--jobs", type=positive_int, default=None, help="compiling processes (default: CPU cores)")
    parser.add_argument(
        "--step",
        action="store_true",
        help="then time two steps of the model on opendnn and on torch (the first of each loads its kernels)",
    )
    parser.set_defaults(run=run, prog=parser.prog)


def model_factory(text: str) -> Callable[[], Any]:
    """The function MODULE:FUNCTION names, refused with a CommandError saying why."""
    module_name, _, function_name = text.partition(":")
    if not module_name or not function_name:
        raise CommandError(f"--model {text!r} must be MODULE:FUNCTION, like torchvision:resnet50", USAGE_ERROR)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CommandError(f"--model {text}: module {module_name!r} does not import: {error}") from None
    factory = getattr(module, function_name, None)
    if factory is None and module_name == "torchvision":  # torchvision's models live in torchvision.models
        factory = getattr(getattr(module, "models", None), function_name, None)
    if not callable(factory):
        raise CommandError(f"--model {text}: {module_name} has no function {function_name!r}", USAGE_ERROR)
    return factory  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    require_packages("opendnn warmup", TRITON_PACKAGES, "gpu")
    import torch

    if not torch.cuda.is_available():
        raise CommandError("warmup compiles the kernels for the current GPU and needs one: torch sees no CUDA device")
    import opendnn.torch

    factory = model_factory(args.model)
    autocast = None if args.dtype == "float32" else getattr(torch, args.dtype)
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    torch_model = factory().to("cuda", memory_format=layout)
    model = copy.deepcopy(torch_model)
    opendnn.torch.convert(model)
    example_input = torch.randn(args.input, device="cuda").contiguous(memory_format=layout)
    training = not args.eval
    report = opendnn.torch.warmup(model, example_input, training=training, autocast=autocast, processes=args.jobs)
    print(f"{args.model} {'x'.join(map(str, args.input))} {args.dtype}: {report}")
    if args.step:
        for name, timed in (("opendnn", model), ("torch", torch_model)):
            step = opendnn.torch.training_step(timed, example_input, training, autocast)
            seconds = [_seconds(step) for _ in range(2)]
            print(f"{name:8s} first step {seconds[0]:.2f} s, second {seconds[1] * 1e3:.1f} ms")
    return 0


def _seconds(step: Callable[[], None]) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - start
