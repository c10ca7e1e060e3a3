"""``opendnn bench``: one problem given on the command line, checked against the float64 reference
or timed against torch, in the spirit of oneDNN's benchdnn.

A problem is a driver (conv, matmul, pooling, softmax, batch_norm), its sizes as letters each
followed by a number (``n64c256h56w56``: batch, channels, then depth, height, width, outermost
first; a filter ``k256r3s3``: output channels, then depth t, height r, width s; a product
``b8m512n512k512``), a direction, a dtype and a layout. ``--mode check`` runs it once on the chosen
device and backend and once in float64 on the NumPy backend (the reference) from the same
rounded inputs, and prints the relative error ``||out - ref|| / ||ref||`` against the sample
table's bound for the dtype; ``--mode perf`` times opendnn and, when torch is installed, torch's
own operation on the same tensors, in alternating rounds. One line per problem, starting with the
options that reproduce it.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import opendnn
import opendnn.functional as F
from opendnn.apps.command_line import (
    USAGE_ERROR,
    CommandError,
    add_backend_option,
    add_command,
    add_device_option,
    create_handle,
    int_at_least,
    missing_packages,
    non_negative_int,
    positive_int,
    require_packages,
)
from opendnn.samples import Sample, relative_error

DESCRIPTION = """\
Checks or times one problem given on the command line, e.g.
  opendnn bench conv --shape n64c256h56w56 --filter k256r3s3 --pad 1 --dtype bf16 --layout nhwc
  opendnn bench matmul --shape m512n512k512 --mode perf
--mode check compares the output with the float64 reference (the NumPy backend in float64, on the
same rounded inputs) and prints the relative error and PASS or FAIL; --mode perf prints the time
per call of opendnn and, when torch is installed, of torch's operation on the same tensors.
Exit status: 0 (PASS, or timed), 1 (FAIL), 2 (a bad problem)."""

DTYPES = {
    "f64": opendnn.DataType.DOUBLE,
    "f32": opendnn.DataType.FLOAT,
    "f16": opendnn.DataType.HALF,
    "bf16": opendnn.DataType.BFLOAT16,
}
SPATIAL = "dhw"  # the spatial letters of a shape, outermost first
FILTER_LETTER = {"d": "t", "h": "r", "w": "s"}  # a filter's letter for each spatial letter (cuDNN's KCTRS)
RUN_OPTIONS = ("command", "prog", "run", "driver", "mode", "device", "backend", "rounds", "seed")  # not the problem


# ---- problem strings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """Sizes by letter, as parsed from ``text`` (``n64c256h56w56``)."""

    text: str
    values: dict[str, int]

    def __str__(self) -> str:
        return self.text


def sizes(letters: str, required: str, example: str) -> Callable[[str], Sizes]:
    """An argparse type: letters of ``letters``, each at most once and in that order, each followed
    by a positive number; those of ``required`` present."""

    def parse(text: str) -> Sizes:
        def refuse(rule: str) -> argparse.ArgumentTypeError:
            return argparse.ArgumentTypeError(f"{text!r} is not a problem size like {example}: {rule}")

        if not re.fullmatch(r"(?:[a-z]\d+)+", text):
            raise refuse("each letter must be followed by a number")
        pairs = [(letter, int(number)) for letter, number in re.findall(r"([a-z])(\d+)", text)]
        names = "".join(letter for letter, _ in pairs)
        unknown = sorted(set(names) - set(letters))
        if unknown:
            raise refuse(
                f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not among the letters "
                f"{', '.join(letters)}"
            )
        if names != "".join(sorted(set(names), key=letters.index)):
            raise refuse(f"each letter may appear once, in the order {', '.join(letters)}")
        missing = [letter for letter in required if letter not in names]
        if missing:
            raise refuse(f"{', '.join(missing)} must be given")
        zero = [f"{letter}{value}" for letter, value in pairs if value == 0]
        if zero:
            raise refuse(f"{', '.join(zero)}: sizes must be positive")
        return Sizes(text, dict(pairs))

    parse.__name__ = "problem size"
    return parse


def per_dim(minimum: int, meaning: str) -> Callable[[str], tuple[int, ...]]:
    """An argparse type: one int, or one per spatial dim separated by commas, each >= ``minimum``."""
    one = int_at_least(minimum, meaning)

    def parse(text: str) -> tuple[int, ...]:
        return tuple(one(part) for part in text.split(","))

    parse.__name__ = meaning
    return parse


def _spatial(shape: Sizes) -> str:
    """The spatial letters of ``shape`` (w; h w; or d h w), refusing others."""
    letters = "".join(letter for letter in SPATIAL if letter in shape.values)
    if not letters or not SPATIAL.endswith(letters):
        raise CommandError(f"--shape {shape}: spatial dims must be w, h w or d h w", USAGE_ERROR)
    return letters


def _per_spatial(option: str, values: tuple[int, ...], spatial: str) -> tuple[int, ...]:
    """``values`` given for --option, one per spatial dim (one value stands for every dim)."""
    if len(values) == 1:
        return values * len(spatial)
    if len(values) != len(spatial):
        raise CommandError(
            f"--{option} {','.join(map(str, values))} needs 1 or {len(spatial)} values (one per "
            f"spatial dim {' '.join(spatial)})",
            USAGE_ERROR,
        )
    return values


def _activation_dims(shape: Sizes) -> tuple[int, ...]:
    return tuple(shape.values[letter] for letter in "nc" + SPATIAL if letter in shape.values)


# ---- problems ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """An input drawn uniformly from [low, high). ``per_channel``: packed and in the compute dtype
    (batch norm's parameters); otherwise in --dtype, laid out as --layout when it has 3 or more dims."""

    dims: tuple[int, ...]
    low: float = -1.0
    high: float = 1.0
    per_channel: bool = False


# Given the operands (by name) and a handle, does any untimed set-up and returns the call to run.
CallBuilder = Callable[[dict[str, Any], opendnn.Handle], Callable[[], Any]]


@dataclass(frozen=True)
class Problem:
    """One operation call. ``opendnn(arrays, handle)`` does any untimed set-up (the forward output
    a backward reads) and returns the call to check or time; ``torch_forward(tensors)`` is torch's
    forward of the same operation, and for a backward problem ``torch_grads`` names the operands
    whose gradients torch computes from ``dy``."""

    operands: dict[str, Operand]
    opendnn: CallBuilder
    torch_forward: Callable[[dict[str, Any]], Any]
    torch_grads: tuple[str, ...] = ()
    flops: float = 0.0  # 0: memory-bound, rated in GB/s


def conv_problem(args: argparse.Namespace) -> Problem:
    spatial = _spatial(args.shape)
    needed = "k" + "".join(FILTER_LETTER[letter] for letter in spatial)
    if set(args.filter.values) != set(needed):
        raise CommandError(
            f"--filter {args.filter} must give exactly {', '.join(needed)} for --shape {args.shape}", USAGE_ERROR
        )
    stride, pad, dilation = (_per_spatial(name, getattr(args, name), spatial) for name in ("stride", "pad", "dilation"))
    n, c, k, groups = args.shape.values["n"], args.shape.values["c"], args.filter.values["k"], args.groups
    if c % groups or k % groups:
        raise CommandError(f"--groups {groups} must divide c={c} and k={k}", USAGE_ERROR)
    inputs = [args.shape.values[letter] for letter in spatial]
    window = [args.filter.values[FILTER_LETTER[letter]] for letter in spatial]
    out = [(i + 2 * p - d * (f - 1) - 1) // s + 1 for i, f, s, p, d in zip(inputs, window, stride, pad, dilation)]
    if min(out) < 1:
        raise CommandError(
            f"--filter {args.filter} does not fit --shape {args.shape} with --pad "
            f"{','.join(map(str, pad))} and --dilation {','.join(map(str, dilation))}",
            USAGE_ERROR,
        )
    x_dims, w_dims = (n, c, *inputs), (k, c // groups, *window)
    options = {"stride": stride, "padding": pad, "dilation": dilation, "groups": groups}
    calls: dict[str, CallBuilder] = {
        "fwd": lambda a, h: lambda: F.conv(a["x"], a["w"], handle=h, **options),
        "bwd_data": lambda a, h: lambda: F.conv_backward_data(a["dy"], a["w"], x_dims, handle=h, **options),
        "bwd_filter": lambda a, h: lambda: F.conv_backward_filter(a["x"], a["dy"], w_dims, handle=h, **options),
    }
    operands = {"x": Operand(x_dims), "w": Operand(w_dims)}
    if args.direction != "fwd":
        operands["dy"] = Operand((n, k, *out))

    def torch_forward(t: dict[str, Any]) -> Any:
        import torch

        return getattr(torch.nn.functional, f"conv{len(spatial)}d")(t["x"], t["w"], None, stride, pad, dilation, groups)

    grads = {"fwd": (), "bwd_data": ("x",), "bwd_filter": ("w",)}[args.direction]
    flops = 2.0 * n * k * math.prod(out) * (c // groups) * math.prod(window)
    return Problem(operands, calls[args.direction], torch_forward, grads, flops)


def matmul_problem(args: argparse.Namespace) -> Problem:
    batch = (args.shape.values["b"],) if "b" in args.shape.values else ()
    m, n, k = (args.shape.values[letter] for letter in "mnk")
    operands = {"a": Operand((*batch, m, k)), "b": Operand((*batch, k, n))}

    def torch_forward(t: dict[str, Any]) -> Any:
        import torch

        return torch.matmul(t["a"], t["b"])

    return Problem(
        operands,
        lambda a, h: lambda: F.matmul(a["a"], a["b"], handle=h),
        torch_forward,
        flops=2.0 * math.prod(batch) * m * n * k,
    )


def pooling_problem(args: argparse.Namespace) -> Problem:
    spatial = _spatial(args.shape)
    window, stride, pad = (_per_spatial(name, getattr(args, name), spatial) for name in ("window", "stride", "pad"))
    x_dims = _activation_dims(args.shape)
    out = [(i + 2 * p - f) // s + 1 for i, f, s, p in zip(x_dims[2:], window, stride, pad)]
    if min(out) < 1 or any(2 * p > f for f, p in zip(window, pad)):
        raise CommandError(
            f"--window {','.join(map(str, window))} with --pad {','.join(map(str, pad))} must fit "
            f"--shape {args.shape} and pad at most half the window",
            USAGE_ERROR,
        )
    maximum, include_pad = args.alg == "max", args.alg == "avg_include_pad"

    def call(a: dict[str, Any], h: opendnn.Handle) -> Callable[[], Any]:
        x = a["x"]
        if maximum and args.direction == "fwd":
            return lambda: F.max_pool(x, window, stride, pad, handle=h)
        if maximum:
            y = F.max_pool(x, window, stride, pad, handle=h)
            return lambda: F.max_pool_backward(a["dy"], x, y, window, stride, pad, handle=h)
        if args.direction == "fwd":
            return lambda: F.avg_pool(x, window, stride, pad, count_include_pad=include_pad, handle=h)
        return lambda: F.avg_pool_backward(a["dy"], x, window, stride, pad, count_include_pad=include_pad, handle=h)

    def torch_forward(t: dict[str, Any]) -> Any:
        import torch

        pool = getattr(torch.nn.functional, f"{'max' if maximum else 'avg'}_pool{len(spatial)}d")
        extra = {} if maximum else {"count_include_pad": include_pad}
        return pool(t["x"], window, stride, pad, **extra)

    operands = {"x": Operand(x_dims)}
    if args.direction == "bwd":
        operands["dy"] = Operand((*x_dims[:2], *out))
    return Problem(operands, call, torch_forward, ("x",) if args.direction == "bwd" else ())


def softmax_problem(args: argparse.Namespace) -> Problem:
    if args.axis not in args.shape.values:
        raise CommandError(f"--axis {args.axis} is not a letter of --shape {args.shape}", USAGE_ERROR)
    dims = _activation_dims(args.shape)
    dim = [letter for letter in "nc" + SPATIAL if letter in args.shape.values].index(args.axis)
    log = args.alg == "log"
    forward, backward = (F.log_softmax, F.log_softmax_grad) if log else (F.softmax, F.softmax_grad)

    def call(a: dict[str, Any], h: opendnn.Handle) -> Callable[[], Any]:
        if args.direction == "fwd":
            return lambda: forward(a["x"], dim, handle=h)
        y = forward(a["x"], dim, handle=h)
        return lambda: backward(a["dy"], y, dim, handle=h)

    def torch_forward(t: dict[str, Any]) -> Any:
        import torch

        return (torch.log_softmax if log else torch.softmax)(t["x"], dim)

    operands = {"x": Operand(dims)}
    if args.direction == "bwd":
        operands["dy"] = Operand(dims)
    return Problem(operands, call, torch_forward, ("x",) if args.direction == "bwd" else ())


def batch_norm_problem(args: argparse.Namespace) -> Problem:
    dims = _activation_dims(args.shape)
    channels = (dims[1],)
    operands = {
        "x": Operand(dims),
        "weight": Operand(channels, 0.5, 2.0, per_channel=True),
        "bias": Operand(channels, per_channel=True),
    }
    training = args.direction != "fwd_inference"
    if not training:
        operands |= {
            "running_mean": Operand(channels, per_channel=True),
            "running_var": Operand(channels, 0.5, 2.0, per_channel=True),
        }
    if args.direction == "bwd":
        operands["dy"] = Operand(dims)

    def call(a: dict[str, Any], h: opendnn.Handle) -> Callable[[], Any]:
        if args.direction == "bwd":
            return lambda: F.batch_norm_backward(a["dy"], a["x"], a["weight"], handle=h)
        return lambda: F.batch_norm(
            a["x"], a.get("running_mean"), a.get("running_var"), a["weight"], a["bias"], training=training, handle=h
        )

    def torch_forward(t: dict[str, Any]) -> Any:
        import torch

        return torch.nn.functional.batch_norm(
            t["x"], t.get("running_mean"), t.get("running_var"), t["weight"], t["bias"], training=training
        )

    return Problem(operands, call, torch_forward, ("x", "weight", "bias") if args.direction == "bwd" else ())


# ---- the command line --------------------------------------------------------------------------

ACTIVATION_SIZES = sizes("nc" + SPATIAL, "nc", "n64c256h56w56")


def _conv_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape",
        type=ACTIVATION_SIZES,
        required=True,
        default=argparse.SUPPRESS,
        help="x: n (batch), c (channels), then w, h w or d h w",
    )
    parser.add_argument(
        "--filter",
        type=sizes("ktrs", "k", "k256r3s3"),
        required=True,
        default=argparse.SUPPRESS,
        help="w: k (output channels), then t r s for the spatial dims d h w",
    )
    _window_options(parser, window=False)
    parser.add_argument(
        "--dilation",
        type=per_dim(1, "a positive integer"),
        default="1",
        help="one value or one per spatial dim, comma-separated",
    )
    parser.add_argument("--groups", type=positive_int, default=1, help="channel groups (c for depthwise)")


def _window_options(parser: argparse.ArgumentParser, window: bool) -> None:
    each = "one value or one per spatial dim, comma-separated"
    if window:
        parser.add_argument("--window", type=per_dim(1, "a positive integer"), default="2", help=each)
        parser.add_argument(
            "--alg",
            choices=("max", "avg_include_pad", "avg_exclude_pad"),
            default="max",
            help="max, or the average over the whole window or over its input positions only",
        )
    parser.add_argument("--stride", type=per_dim(1, "a positive integer"), default="2" if window else "1", help=each)
    parser.add_argument(
        "--pad", type=per_dim(0, "a non-negative integer"), default="0", help=f"{each}; padding on both sides"
    )


def _matmul_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape",
        type=sizes("bmnk", "mnk", "m512n512k512"),
        required=True,
        default=argparse.SUPPRESS,
        help="[b (batch)] m n k: (b, m, k) @ (b, k, n)",
    )


def _pooling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape", type=ACTIVATION_SIZES, required=True, default=argparse.SUPPRESS, help="x: n c, then w, h w or d h w"
    )
    _window_options(parser, window=True)


def _softmax_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape", type=ACTIVATION_SIZES, required=True, default=argparse.SUPPRESS, help="x: n c, then any of d h w"
    )
    parser.add_argument("--axis", choices=tuple("nc" + SPATIAL), default="c", help="the letter softmax runs along")
    parser.add_argument("--alg", choices=("accurate", "log"), default="accurate", help="softmax or log-softmax")


def _batch_norm_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shape",
        type=ACTIVATION_SIZES,
        required=True,
        default=argparse.SUPPRESS,
        help="x: n c, then any of d h w; statistics per channel",
    )


@dataclass(frozen=True)
class Driver:
    summary: str
    directions: tuple[str, ...]
    add_options: Callable[[argparse.ArgumentParser], None]
    problem: Callable[[argparse.Namespace], Problem]
    layouts: tuple[str, ...] = ("nchw", "nhwc")


DRIVERS = {
    "conv": Driver(
        "convolution (cross-correlation, as torch's)", ("fwd", "bwd_data", "bwd_filter"), _conv_options, conv_problem
    ),
    "matmul": Driver("matrix product, batched or not", ("fwd",), _matmul_options, matmul_problem, layouts=()),
    "pooling": Driver("max or average pooling", ("fwd", "bwd"), _pooling_options, pooling_problem),
    "softmax": Driver("softmax or log-softmax along one dim", ("fwd", "bwd"), _softmax_options, softmax_problem),
    "batch_norm": Driver(
        "batch normalization (training forward, inference forward, backward)",
        ("fwd", "fwd_inference", "bwd"),
        _batch_norm_options,
        batch_norm_problem,
    ),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``opendnn bench DRIVER ...``: one subcommand per driver."""
    drivers = parser.add_subparsers(dest="driver", required=True, metavar="DRIVER")
    for name, driver in DRIVERS.items():
        sub = add_command(drivers, name, driver.summary, f"{driver.summary}.\n\n{DESCRIPTION}")
        driver.add_options(sub)
        sub.add_argument(
            "--direction", choices=driver.directions, default=driver.directions[0], help="fwd, or which backward"
        )
        sub.add_argument("--dtype", choices=tuple(DTYPES), default="f32", help="of the inputs and outputs")
        if driver.layouts:
            sub.add_argument(
                "--layout",
                choices=driver.layouts,
                default=driver.layouts[0],
                help="memory order of inputs with 3 or more dims (nhwc: channels last)",
            )
        sub.add_argument(
            "--mode",
            choices=("check", "perf"),
            default="check",
            help="check: against the float64 reference; perf: time against torch",
        )
        add_device_option(sub)
        add_backend_option(sub)
        sub.add_argument("--rounds", type=positive_int, default=20, help="perf: timed calls of each, alternating")
        sub.add_argument("--seed", type=non_negative_int, default=0, help="of the random inputs")
        sub.set_defaults(run=run, prog=sub.prog)


def reproducer(args: argparse.Namespace) -> str:
    """The driver and its problem's options, as a command line that gives the same problem."""

    def text(value: Any) -> str:
        return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)

    first = ("shape", "filter")  # the sizes, then the other options by name
    options = sorted(
        ((name, value) for name, value in vars(args).items() if name not in RUN_OPTIONS),
        key=lambda option: (first.index(option[0]) if option[0] in first else len(first), option[0]),
    )
    return " ".join([args.driver] + [f"--{name.replace('_', '-')} {text(value)}" for name, value in options])


# ---- running -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    problem = DRIVERS[args.driver].problem(args)
    dtype = DTYPES[args.dtype]
    handle = create_handle(args.device, args.backend)
    use_torch = not missing_packages({"torch": "torch"})
    if not use_torch and dtype is opendnn.DataType.BFLOAT16:  # NumPy arrays hold bfloat16 as ml_dtypes' type
        require_packages("--dtype bf16 on NumPy arrays (without torch)", {"ml_dtypes": "ml_dtypes"}, "cpu")
    arrays = make_arrays(problem, dtype, getattr(args, "layout", "nchw") == "nhwc", args.device, args.seed, use_torch)
    where = f"{handle.device} {handle.backend}"
    try:
        if args.mode == "check":
            error, tolerance = check(problem, arrays, handle, dtype)
            print(
                f"{reproducer(args)}  [{where}]  rel. error {error:.2e} (bound {tolerance:.0e})  "
                f"{'PASS' if error <= tolerance else 'FAIL'}"
            )
            return 0 if error <= tolerance else 1
        print(f"{reproducer(args)}  [{where}]  {perf(problem, arrays, handle, args.rounds, use_torch)}")
        return 0
    except opendnn.BadParam as refused:
        raise CommandError(f"BadParam: {refused}", USAGE_ERROR) from None
    except opendnn.OpenDnnError as failed:
        raise CommandError(f"{type(failed).__name__}: {failed}") from None


def make_arrays(
    problem: Problem, dtype: opendnn.DataType, channels_last: bool, device: str, seed: int, use_torch: bool
) -> dict[str, Any]:
    """The operands' random values in their dtypes and layouts: torch tensors on ``device`` when
    torch is installed, else NumPy arrays (``device`` is then the CPU; bfloat16 is ml_dtypes')."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {}
    for name, operand in problem.operands.items():
        values = rng.uniform(operand.low, operand.high, operand.dims)
        ndim = len(operand.dims)
        laid_out = channels_last and ndim >= 3 and not operand.per_channel
        order = (0, *range(2, ndim), 1) if laid_out else tuple(range(ndim))
        stored = np.ascontiguousarray(values.transpose(order))
        kind = dtype.compute_type if operand.per_channel else dtype
        if use_torch:
            import torch

            array = torch.from_numpy(stored).to(device=device, dtype=kind.to_torch())
            arrays[name] = array.permute(*np.argsort(order).tolist())
        else:
            arrays[name] = stored.astype(kind.to_numpy()).transpose(np.argsort(order))
    return arrays


def float64(array: Any) -> np.ndarray:
    """A NumPy or torch array's values as a packed float64 NumPy array."""
    if isinstance(array, np.ndarray):
        return np.array(array, np.float64)
    return array.detach().to("cpu").double().numpy()


def _outputs(result: Any) -> list[Any]:
    return list(result) if isinstance(result, tuple) else [result]


def check(
    problem: Problem, arrays: dict[str, Any], handle: opendnn.Handle, dtype: opendnn.DataType
) -> tuple[float, float]:
    """(the largest relative error of the outputs against the float64 reference, the bound for
    ``dtype``). The reference runs the same call in float64 on the NumPy backend, from the
    operands' rounded values."""
    actual = _outputs(problem.opendnn(arrays, handle)())
    reference = opendnn.create("cpu", backend="numpy")
    expected = _outputs(problem.opendnn({name: float64(a) for name, a in arrays.items()}, reference)())
    error = max(relative_error(float64(a), e) for a, e in zip(actual, expected))
    return error, Sample("bench", "", dtype, ()).tolerance  # the sample table's bound for the dtype


def perf(problem: Problem, arrays: dict[str, Any], handle: opendnn.Handle, rounds: int, use_torch: bool) -> str:
    """Median time per call of opendnn and (with torch) torch, called in alternation after one
    untimed call each (which compiles the kernels); rated in TFLOP/s, or in GB/s counting each
    operand and output once."""
    calls = {"opendnn": problem.opendnn(arrays, handle)}
    if use_torch:
        calls["torch"] = torch_call(problem, arrays)
    synchronize = _synchronizer(handle.device)
    outputs = {name: _outputs(call()) for name, call in calls.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            synchronize()
            start = time.perf_counter()
            call()
            synchronize()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(seconds) for name, seconds in times.items()}
    parts = []
    for name, seconds in median.items():
        if problem.flops:
            tera = problem.flops / seconds / 1e12
            rate = f"{tera:.3g} TFLOP/s" if tera >= 1 else f"{tera * 1e3:.3g} GFLOP/s"
        else:
            moved = sum(_nbytes(a) for a in [*arrays.values(), *outputs[name]])
            rate = f"{moved / seconds / 1e9:.3g} GB/s"
        parts.append(f"{name} {seconds * 1e3:.4g} ms ({rate})")
    if "torch" in median:
        parts.append(f"torch/opendnn {median['torch'] / median['opendnn']:.3g}x")
    return "  ".join(parts)


def torch_call(problem: Problem, tensors: dict[str, Any]) -> Callable[[], Any]:
    """torch's forward, or for a backward problem the gradients torch's autograd computes for
    ``problem.torch_grads`` from ``dy`` (its forward run once, untimed)."""
    if not problem.torch_grads:
        return lambda: problem.torch_forward(tensors)
    import torch

    leaves = {name: t.detach().requires_grad_(name in problem.torch_grads) for name, t in tensors.items()}
    y = problem.torch_forward(leaves)
    wanted = [leaves[name] for name in problem.torch_grads]
    return lambda: torch.autograd.grad(y, wanted, tensors["dy"], retain_graph=True)


def _synchronizer(device: str) -> Callable[[], None]:
    if device == "cpu":
        return lambda: None
    import torch

    return lambda: torch.cuda.synchronize(device)


def _nbytes(array: Any) -> int:
    return int(array.nbytes) if isinstance(array, np.ndarray) else array.numel() * array.element_size()
