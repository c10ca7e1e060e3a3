"""How long the first call of a convolution or pooling problem compiles on a cold Triton cache: every
kernel the call launches, each one's compile seconds, and the constexprs that differ between problems.

On the CPU (no GPU needed) each problem is planned as for an H200 (132 SMs, TMA, wgmma) and every
distinct kernel it launches is compiled down to an sm_90 cubin, ptxas included, specialized exactly as
Triton's JIT specializes the call there (tests/sm90.py), each compile with an empty cache folder::

    PYTHONPATH=. python3 benchmarks/compile_times.py                      # every problem
    PYTHONPATH=. python3 benchmarks/compile_times.py --only conv3d,adaptive --ptx ptx

(``--only``: problems whose name holds one of the comma-separated words; ``--ptx DIR``: each kernel's
PTX written there, to compare two versions of a kernel.) On a GPU each problem's first call through the
Triton backend runs in a process of its own with an empty TRITON_CACHE_DIR: the seconds from the call
to the end of its kernels, and each kernel's compile seconds (Triton's JIT hooks)::

    PYTHONPATH=. python3 benchmarks/compile_times.py --device cuda --only conv3d_5x5x5,adaptive

One row per problem: its name, the convolution's route, the seconds of the call (cuda) or of its
compiles (cpu), then each kernel with its seconds and the constexprs whose values differ between the
problems listed that launch it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, on the CPU too (triton reads this when it loads)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import sm90  # noqa: E402  (tests/sm90.py: Triton's specialization and the sm_90 compile)
import torch  # noqa: E402
import triton  # noqa: E402

import opendnn as od  # noqa: E402
from opendnn.core.arrays import Bound, bind  # noqa: E402
from opendnn.families.convolution import triton_backend as convolution  # noqa: E402
from opendnn.families.convolution.problem import (  # noqa: E402
    ConvolutionDirection,
    ConvolutionProblem,
    convolution_problem,  # noqa: E402
)
from opendnn.families.convolution.triton_matrix import filter_matmul_form, matmul_form  # noqa: E402
from opendnn.families.matmul import triton_backend as matmul  # noqa: E402
from opendnn.families.pooling import triton_backend as pooling  # noqa: E402
from opendnn.families.pooling.problem import (  # noqa: E402
    PoolingProblem,
    adaptive_pooling_problem,
    pooled_dims,
    pooling_problem,
)
from opendnn.kernels.launch import Launch, Launches, Slot  # noqa: E402

H200_MULTIPROCESSORS = 132
TORCH_DTYPES = {od.DataType.FLOAT: torch.float32, od.DataType.BFLOAT16: torch.bfloat16, od.DataType.HALF: torch.float16}
FWD, DATA, FILTER = ConvolutionDirection
MAX, AVG = od.PoolingMode.MAX, od.PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING

Problem = ConvolutionProblem | PoolingProblem


def _format(layout: str) -> od.TensorFormat:
    return od.TensorFormat.NHWC if layout == "channels_last" else od.TensorFormat.NCHW


def conv(
    direction: ConvolutionDirection,
    dtype: str,
    layout: str,
    n: int,
    c: int,
    k: int,
    spatial: tuple[int, ...],
    filt: tuple[int, ...],
    stride: int = 1,
    groups: int = 1,
    tf32: bool = False,
) -> ConvolutionProblem:
    """A convolution padded to keep the size at stride 1 (the filter's half), filter in x's layout."""
    dims = len(spatial)
    desc = od.ConvolutionDescriptor(tuple(f // 2 for f in filt), (stride,) * dims, (1,) * dims, group_count=groups)
    x = od.TensorDescriptor.from_format(_format(layout), dtype, n, c, *spatial)
    w = od.FilterDescriptor(dtype, _format(layout), k, c // groups, *filt)
    y = od.TensorDescriptor.from_format(_format(layout), dtype, *od.get_convolution_forward_output_dim(desc, x, w))
    return convolution_problem(direction, desc, x, w, y, allow_tf32=tf32)


def pool(
    mode: od.PoolingMode,
    dtype: str,
    layout: str,
    n: int,
    c: int,
    spatial: tuple[int, ...],
    window: tuple[int, ...],
    stride: int,
    padding: int,
    backward: bool,
) -> PoolingProblem:
    dims = len(spatial)
    nan = od.NanPropagation.NOT_PROPAGATE_NAN
    desc = od.PoolingDescriptor(mode, nan, window, (padding,) * dims, (stride,) * dims)
    x = od.TensorDescriptor.from_format(_format(layout), dtype, n, c, *spatial)
    y = od.TensorDescriptor.from_format(_format(layout), dtype, *pooled_dims(desc, x))
    return pooling_problem(desc, x, y, dy_desc=y, dx_desc=x) if backward else pooling_problem(desc, x, y)


def adaptive(
    mode: od.PoolingMode,
    dtype: str,
    layout: str,
    n: int,
    c: int,
    spatial: tuple[int, ...],
    out: tuple[int, ...],
    backward: bool,
) -> list[PoolingProblem]:
    """What an adaptive pooling runs (functional.adaptive_*_pool): one pooling whose windows are torch's
    cells [o * size // out, ceil((o + 1) * size / out)) along the dims where they differ."""
    x = od.TensorDescriptor.from_format(_format(layout), dtype, n, c, *spatial)
    y = od.TensorDescriptor.from_format(_format(layout), dtype, n, c, *out)
    if backward:
        return [adaptive_pooling_problem(mode, False, x, y, dy_desc=y, dx_desc=x)]
    return [adaptive_pooling_problem(mode, False, x, y)]


@dataclass(frozen=True)
class Row:
    name: str
    problems: Callable[[], list[Problem]]  # what the call runs


def rows() -> list[Row]:
    found = []
    directions = (("fwd", FWD), ("bwd_data", DATA), ("bwd_filter", FILTER))
    convolutions = {  # name: conv's arguments after the direction
        "conv2d_3x3_nhwc_bf16": ("bfloat16", "channels_last", 32, 256, 256, (14, 14), (3, 3)),
        "conv2d_3x3_nchw_fp32": ("float32", "channels_first", 32, 256, 256, (14, 14), (3, 3)),
        "conv2d_3x3_nchw_tf32": ("float32", "channels_first", 32, 256, 256, (14, 14), (3, 3), 1, 1, True),
        "conv2d_7x7s2_nhwc_bf16": ("bfloat16", "channels_last", 32, 3, 64, (224, 224), (7, 7), 2),
        "conv2d_1x1_nhwc_bf16": ("bfloat16", "channels_last", 32, 256, 64, (56, 56), (1, 1)),
        "conv2d_1x1_nchw_fp32": ("float32", "channels_first", 32, 256, 64, (56, 56), (1, 1)),
        "conv2d_dw3x3_nhwc_bf16": ("bfloat16", "channels_last", 32, 256, 256, (28, 28), (3, 3), 1, 256),
        "conv2d_dw7x7_nhwc_bf16": ("bfloat16", "channels_last", 32, 384, 384, (28, 28), (7, 7), 1, 384),
        "conv2d_g32_3x3_nhwc_bf16": ("bfloat16", "channels_last", 32, 128, 128, (56, 56), (3, 3), 1, 32),
        "conv1d_k5_nwc_bf16": ("bfloat16", "channels_last", 32, 256, 256, (1024,), (5,)),
        "conv3d_3x3x3_ndhwc_bf16": ("bfloat16", "channels_last", 4, 64, 64, (32, 32, 32), (3, 3, 3)),
        "conv3d_3x3x3_ncdhw_fp32": ("float32", "channels_first", 4, 64, 64, (32, 32, 32), (3, 3, 3)),
        "conv3d_5x5x5_ndhwc_bf16": ("bfloat16", "channels_last", 4, 64, 64, (32, 32, 32), (5, 5, 5)),
        "conv3d_dw3x3x3_ndhwc_bf16": ("bfloat16", "channels_last", 4, 64, 64, (32, 32, 32), (3, 3, 3), 1, 64),
        "conv3d_5x5x5_c1k8_ndhwc_bf16": ("bfloat16", "channels_last", 4, 1, 8, (64, 64, 64), (5, 5, 5)),
        "conv3d_5x5x5_c4k4_ncdhw_fp32": ("float32", "channels_first", 4, 4, 4, (64, 64, 64), (5, 5, 5)),
    }
    for (name, arguments), (tag, direction) in itertools.product(convolutions.items(), directions):
        found.append(Row(f"{name}_{tag}", lambda d=direction, a=arguments: [conv(d, *a)]))
    poolings = {  # name: pool's arguments before the direction
        "maxpool2d_3x3s2_nchw_fp32": (MAX, "float32", "channels_first", 32, 64, (112, 112), (3, 3), 2, 1),
        "maxpool2d_3x3s2_nhwc_bf16": (MAX, "bfloat16", "channels_last", 32, 64, (112, 112), (3, 3), 2, 1),
        "avgpool2d_2x2_nchw_fp32": (AVG, "float32", "channels_first", 32, 256, (56, 56), (2, 2), 2, 0),
        "maxpool3d_3x3x3s2_ncdhw_fp32": (MAX, "float32", "channels_first", 4, 64, (32, 32, 32), (3, 3, 3), 2, 1),
        "avgpool3d_3x3x3s2_ndhwc_bf16": (AVG, "bfloat16", "channels_last", 4, 64, (32, 32, 32), (3, 3, 3), 2, 1),
        "maxpool3d_4x4x4s2_ndhwc_bf16": (MAX, "bfloat16", "channels_last", 4, 64, (32, 32, 32), (4, 4, 4), 2, 1),
        "avgpool2d_global7x7_nhwc_bf16": (AVG, "bfloat16", "channels_last", 32, 2048, (7, 7), (7, 7), 7, 0),
        "avgpool2d_global7x7_nchw_fp32": (AVG, "float32", "channels_first", 32, 2048, (7, 7), (7, 7), 7, 0),
        "maxpool2d_5x5s1_nchw_fp32": (MAX, "float32", "channels_first", 32, 64, (56, 56), (5, 5), 1, 2),
        "maxpool2d_global_nhwc_bf16": (MAX, "bfloat16", "channels_last", 4, 64, (112, 112), (112, 112), 112, 0),
        "maxpool2d_global_nchw_fp32": (MAX, "float32", "channels_first", 4, 64, (112, 112), (112, 112), 112, 0),
    }
    for (name, arguments), (tag, backward) in itertools.product(poolings.items(), (("fwd", False), ("bwd", True))):
        found.append(Row(f"{name}_{tag}", lambda a=arguments, b=backward: [pool(*a, b)]))
    adaptives = {  # name: adaptive's arguments before the direction
        "adaptive_avg3d_13to5_ncdhw_fp32": (AVG, "float32", "channels_first", 4, 64, (13, 13, 13), (5, 5, 5)),
        "adaptive_max3d_7to5_ndhwc_bf16": (MAX, "bfloat16", "channels_last", 4, 64, (7, 7, 7), (5, 5, 5)),
    }
    for (name, arguments), (tag, backward) in itertools.product(adaptives.items(), (("fwd", False), ("bwd", True))):
        found.append(Row(f"{name}_{tag}", lambda a=arguments, b=backward: adaptive(*a, b)))
    return found


# ---- the launches a problem's call makes, planned as for an H200 ------------------------------------


def launches(problem: Problem) -> tuple[str, list[Launch], dict[str, Any]]:
    """(the route, the launches, the torch dtype of each slot they fill)."""
    if isinstance(problem, PoolingProblem):
        return "", *_pooling_launches(problem)
    return _convolution_launches(problem)


def _convolution_launches(problem: ConvolutionProblem) -> tuple[str, list[Launch], dict[str, Any]]:
    dtype = TORCH_DTYPES[problem.x.dtype]
    slots = {name: dtype for name in ("x", "w", "y", "bias", "z")}
    planned: list[Launch] = []
    strategy = convolution.choose(problem, tma_aligned=True, hopper=True)  # sm_90: the warp-specialized engine
    form = {
        convolution.Strategy.MATRIX_PRODUCT: matmul_form(problem),
        convolution.Strategy.IMAGE_PRODUCTS: filter_matmul_form(problem),
    }.get(strategy)
    if form is not None:  # the products on matmul's kernels, as an H200 runs them
        plan = matmul.launch_plan(
            form, form.a, form.b, form.c, form.bias, None, True, False, H200_MULTIPROCESSORS, False, True
        )
        planned += [launch for launch, _ in plan.launches]
        slots.update(a=dtype, b=dtype, c=TORCH_DTYPES[form.c.dtype], residual=dtype)
    if strategy is not convolution.Strategy.MATRIX_PRODUCT:
        plan = convolution.launch_plan(problem, False, strategy)
        planned += plan.launches
        slots.update({name: region_dtype for name, _, _, region_dtype in plan.regions})
    return strategy.name.lower(), planned, slots


def _pooling_launches(problem: PoolingProblem) -> tuple[list[Launch], dict[str, Any]]:
    if problem.dx is None:
        plan = pooling._forward_launches(problem, False)
    else:
        plan = pooling._backward_config(problem, pooling.BACKWARD_TILE)
    if isinstance(plan, Launch):
        plan = Launches((plan,))
    dtype = TORCH_DTYPES[problem.x.dtype]
    slots = {name: dtype for name in ("x", "y", "dy", "dx")}
    slots.update({scratch.name: scratch.dtype for scratch in plan.scratch})
    return list(plan.launches), slots


@dataclass
class Compile:
    """One distinct kernel of a call: its launch and Triton's (options, signature, constexprs, attrs)."""

    launch: Launch
    specialized: tuple[Any, ...]

    @property
    def name(self) -> str:
        return str(self.launch.kernel.__name__)

    def constexprs(self) -> dict[str, Any]:
        """The kernel's declared constexprs (not the ints Triton specializes on their value 1)."""
        params = self.launch.kernel.params
        return {params[p[0]].name: value for p, value in self.specialized[2].items() if params[p[0]].is_constexpr}


def distinct_compiles(problems: list[Problem], backend: Any) -> tuple[str, list[Compile]]:
    """The route and the distinct kernel specializations the problems' launches compile."""
    found: dict[tuple[str, str], Compile] = {}
    route = ""
    for problem in problems:
        route, planned, slots = launches(problem)
        for launch in planned:
            args = tuple(torch.empty(64, dtype=slots[a.name]) if isinstance(a, Slot) else a for a in launch.args)
            specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
            found.setdefault((launch.kernel.__name__, repr(specialized)), Compile(launch, specialized))
    return route, list(found.values())


def differing(compiles: dict[str, list[Compile]]) -> dict[str, set[str]]:
    """Per kernel, the constexprs whose values differ between the problems that launch it."""
    result = {}
    for name, kernel_compiles in compiles.items():
        values = [c.constexprs() for c in kernel_compiles]
        keys = set().union(*values)
        result[name] = {k for k in keys if len({repr(v.get(k)) for v in values}) > 1}
    return result


def compile_sm90(item: Compile, target: Any, ptx_path: Path | None = None) -> float:
    """Seconds to compile ``item`` for sm_90 with nothing cached; its PTX written to ``ptx_path``."""
    options, signature, constexprs, attrs = item.specialized
    with tempfile.TemporaryDirectory(prefix="opendnn-compile-times-") as cache:
        triton.knobs.cache.dir = cache  # cold: nothing cached
        start = time.perf_counter()
        compiled = sm90.compile_sm90(item.launch.kernel, signature, constexprs, attrs, options, target)
        seconds = time.perf_counter() - start
    if ptx_path is not None:
        ptx_path.write_text(compiled.asm["ptx"])
    return seconds


# ---- the first call on a GPU ---------------------------------------------------------------------


def first_call_on_the_gpu(problems: list[Problem]) -> dict[str, Any]:
    """Seconds of the problems' first calls through the Triton backend (this process has compiled
    nothing) and each kernel compile's seconds."""
    compiles: list[tuple[str, float]] = []
    started: dict[str, float] = {}

    def before(**kwargs: Any) -> bool:
        started[kwargs["fn"].name] = time.perf_counter()
        return False

    def after(**kwargs: Any) -> None:
        name = kwargs["fn"].name
        compiles.append((name, time.perf_counter() - started[name]))

    triton.knobs.runtime.jit_cache_hook, triton.knobs.runtime.jit_post_compile_hook = before, after
    calls = [_bound_call(problem) for problem in problems]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for call in calls:
        call()
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - start, "compiles": compiles}


def _tensor(name: str, desc: od.TensorDescriptor | None) -> Bound | None:
    """``desc`` bound to random values on the GPU (None for None)."""
    if desc is None:
        return None
    extent = 1 + sum((d - 1) * s for d, s in zip(desc.dims, desc.strides))
    memory = torch.randn(extent, device="cuda").to(TORCH_DTYPES.get(desc.dtype, torch.uint8))
    return bind(name, desc, memory.as_strided(desc.dims, desc.strides))


def _bound_call(problem: Problem) -> Callable[[], None]:
    """The problem's call through the Triton backend, its tensors bound."""
    if isinstance(problem, PoolingProblem):
        x, y, dy, dx = (_tensor(name, getattr(problem, name)) for name in ("x", "y", "dy", "dx"))
        return lambda: pooling.run(problem, x, y, dy, dx)
    x, w, y = (_tensor(name, getattr(problem, name)) for name in ("x", "w", "y"))
    size = convolution.workspace_size(problem)
    workspace = _tensor("workspace", od.TensorDescriptor("uint8", (size,))) if size else None
    return lambda: convolution.run(problem, x, w, y, None, None, workspace)


# ---- the table -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", default="", help="comma-separated words: the problems whose name holds one")
    parser.add_argument("--ptx", default="", help="cpu: a folder to write each kernel's PTX into")
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)  # cuda: the one problem of a child process
    args = parser.parse_args(argv)
    words = [w for w in args.only.split(",") if w]
    chosen = [row for row in rows() if not words or any(w in row.name for w in words)]
    if args.row:
        (row,) = [r for r in chosen if r.name == args.row]
        print(json.dumps(first_call_on_the_gpu(row.problems())))
        return 0
    target, backend = sm90.target_or_exit()
    planned = {row.name: distinct_compiles(row.problems(), backend) for row in chosen}
    by_kernel: dict[str, list[Compile]] = {}
    for _, compiles in planned.values():
        for item in compiles:
            by_kernel.setdefault(item.name, []).append(item)
    varying = differing(by_kernel)
    if args.ptx:
        os.makedirs(args.ptx, exist_ok=True)
    for row in chosen:
        route, compiles = planned[row.name]
        if args.device == "cuda":
            with tempfile.TemporaryDirectory(prefix="opendnn-compile-times-") as cache:
                child = subprocess.run(
                    [sys.executable, __file__, "--device", "cuda", "--only", row.name, "--row", row.name],
                    capture_output=True,
                    text=True,
                    env={**os.environ, "TRITON_CACHE_DIR": cache},
                )
            if child.returncode:
                print(f"{row.name}: failed\n{child.stderr[-2000:]}", flush=True)
                continue
            measured = json.loads(child.stdout.splitlines()[-1])
            total, seconds = measured["seconds"], [s for _, s in measured["compiles"]]
            names = [n for n, _ in measured["compiles"]]
        else:
            seconds = [
                compile_sm90(item, target, Path(args.ptx, f"{row.name}.{k}.{item.name}.ptx") if args.ptx else None)
                for k, item in enumerate(compiles)
            ]
            total, names = sum(seconds), [item.name for item in compiles]
        cells = []
        for name, spent in zip(names, seconds):
            item = next((c for c in compiles if c.name == name), None)
            shown = sorted(varying.get(name, ()))
            values = " ".join(f"{k}={item.constexprs().get(k)}" for k in shown) if item else ""
            cells.append(f"{name} {spent:.1f}s" + (f" [{values}]" if values else ""))
        print(f"{row.name:36s} {route:16s} {total:7.1f}s  " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
