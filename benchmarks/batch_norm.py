"""Batch normalization benchmarks: training forward and backward on a ResNet-50 activation
(64 x 256 x 56 x 56, NCHW and NHWC), and batch norm + add + relu (the Ex form) against torch's
three separate ops (cuDNN batch norm, add, relu), forward and backward.

Bytes counted (the same count serves opendnn and torch; the cuDNN reference figures count the forward so):
    forward     read x twice (statistics, then normalize) + write y                  3 passes
    backward    read x and dy twice (gradient sums, then dx) + write dx             5 passes
    add + relu  forward: the forward's + read z (4 passes); backward: the backward's + write dz (6)
The fewest bytes any method moves are 2 passes forward and 3 backward; multiply GB/s by 2/3 and
3/5 for that measure.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as TF
from suites import SHAPES, Bench, Case, Context, nbytes, out_of_place

import opendnn
from opendnn import BatchNormMode, BatchNormOps

SHAPES["batch_norm"] = {"full": (64, 256, 56, 56), "quick": (8, 256, 56, 56), "tiny": (2, 6, 5, 7)}
MODE = BatchNormMode.SPATIAL
EPS = 1e-5
aten = torch.ops.aten


class Setup:
    """x (and z, dy) in the layout, the per-channel tensors, and opendnn's descriptors."""

    def __init__(self, ctx: Context, dtype: torch.dtype, channels_last: bool) -> None:
        dims = ctx.shape("batch_norm")
        fmt = opendnn.TensorFormat.NHWC if channels_last else opendnn.TensorFormat.NCHW
        self.x_desc = opendnn.TensorDescriptor.from_format(fmt, dtype, *dims)
        self.x, self.z, self.dy = (ctx.randn_for(self.x_desc, dtype) for _ in range(3))
        self.y = ctx.empty_for(self.x_desc, dtype)
        channels = dims[1]
        self.param = opendnn.derive_bn_tensor_descriptor(self.x_desc, MODE)
        self.weight = torch.rand(channels, device=ctx.device) + 0.5
        self.bias = torch.randn(channels, device=ctx.device)
        self.mean, self.var = torch.zeros(channels, device=ctx.device), torch.ones(channels, device=ctx.device)
        self.saved_mean, self.saved_inv = torch.empty_like(self.mean), torch.empty_like(self.mean)
        self.dims = dims

    def forward(self, handle: opendnn.Handle) -> None:
        opendnn.batch_normalization_forward_training(
            handle,
            MODE,
            1.0,
            0.0,
            self.x_desc,
            self.x,
            self.x_desc,
            self.y,
            self.param,
            self.weight,
            self.bias,
            0.1,
            self.mean,
            self.var,
            EPS,
            self.saved_mean,
            self.saved_inv,
        )


def torch_backward(s: Setup, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's batch-norm backward of ``x`` as its autograd runs it for ``F.batch_norm``: the forward and
    backward of the implementation torch picks for the device and dtypes (cuDNN's for float32 on CUDA;
    for bfloat16 data with float32 weight, which cuDNN's entry point refuses, torch's own kernels), with
    dweight and dbias computed as opendnn computes them: dy -> dx."""
    _, save1, save2, reserve, impl = aten._batch_norm_impl_index(
        x, s.weight, s.bias, s.mean.clone(), s.var.clone(), True, 0.1, EPS, True
    )
    return lambda dy: aten._batch_norm_impl_index_backward(
        impl, x, dy, s.weight, s.mean, s.var, save1, save2, True, EPS, [True, True, True], reserve
    )[0]


def training_forward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = Setup(ctx, dtype, channels_last)
        torch_mean, torch_var = s.mean.clone(), s.var.clone()
        return out_of_place(
            lambda: s.forward(ctx.handle),
            lambda: TF.batch_norm(s.x, torch_mean, torch_var, s.weight, s.bias, True, 0.1, EPS),
            s.y,
            nbytes(s.x, s.x, s.y),
            s.dims,
        )

    return build


def training_backward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = Setup(ctx, dtype, channels_last)
        s.forward(ctx.handle)
        dx, dweight, dbias = torch.empty_like(s.x), torch.empty_like(s.weight), torch.empty_like(s.weight)
        theirs = torch_backward(s, s.x)
        return out_of_place(
            lambda: opendnn.batch_normalization_backward(
                ctx.handle,
                MODE,
                1.0,
                0.0,
                1.0,
                0.0,
                s.x_desc,
                s.x,
                s.x_desc,
                s.dy,
                s.x_desc,
                dx,
                s.param,
                s.weight,
                dweight,
                dbias,
                EPS,
                s.saved_mean,
                s.saved_inv,
            ),
            lambda: theirs(s.dy),
            dx,
            nbytes(s.x, s.dy, s.x, s.dy, dx),
            s.dims,
        )

    return build


class FusedSetup(Setup):
    """The Ex form's activation, workspace and reserve space beside Setup's tensors."""

    def __init__(self, ctx: Context, dtype: torch.dtype, channels_last: bool) -> None:
        super().__init__(ctx, dtype, channels_last)
        self.act = opendnn.ActivationDescriptor(opendnn.ActivationMode.RELU)
        ops = BatchNormOps.BN_ADD_ACTIVATION
        h, x = ctx.handle, self.x_desc
        self.workspace = self.bytes(
            ctx,
            opendnn.get_batch_normalization_forward_training_ex_workspace_size(
                h, MODE, ops, x, x, x, self.param, self.act
            ),
        )
        self.bwd_workspace = self.bytes(
            ctx,
            opendnn.get_batch_normalization_backward_ex_workspace_size(
                h, MODE, ops, x, x, x, x, x, self.param, self.act
            ),
        )
        self.reserve = self.bytes(
            ctx, opendnn.get_batch_normalization_training_ex_reserve_space_size(h, MODE, ops, self.act, x)
        )

    @staticmethod
    def bytes(ctx: Context, size: int) -> Any:
        return torch.empty(size, dtype=torch.uint8, device=ctx.device) if size else None

    def forward_ex(self, handle: opendnn.Handle) -> None:
        x = self.x_desc
        opendnn.batch_normalization_forward_training_ex(
            handle,
            MODE,
            BatchNormOps.BN_ADD_ACTIVATION,
            1.0,
            0.0,
            x,
            self.x,
            x,
            self.z,
            x,
            self.y,
            self.param,
            self.weight,
            self.bias,
            0.1,
            self.mean,
            self.var,
            EPS,
            self.saved_mean,
            self.saved_inv,
            self.act,
            self.workspace,
            self.reserve,
        )


def add_relu_forward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = FusedSetup(ctx, dtype, channels_last)
        torch_mean, torch_var = s.mean.clone(), s.var.clone()
        return out_of_place(
            lambda: s.forward_ex(ctx.handle),
            lambda: torch.relu(TF.batch_norm(s.x, torch_mean, torch_var, s.weight, s.bias, True, 0.1, EPS) + s.z),
            s.y,
            nbytes(s.x, s.x, s.z, s.y),
            s.dims,
        )

    return build


def add_relu_backward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = FusedSetup(ctx, dtype, channels_last)
        s.forward_ex(ctx.handle)
        dx, dz = torch.empty_like(s.x), torch.empty_like(s.x)
        dweight, dbias = torch.empty_like(s.weight), torch.empty_like(s.weight)
        theirs = torch_backward(s, s.x)
        y = s.y.clone()
        x = s.x_desc

        def ours() -> None:
            opendnn.batch_normalization_backward_ex(
                ctx.handle,
                MODE,
                BatchNormOps.BN_ADD_ACTIVATION,
                1.0,
                0.0,
                1.0,
                0.0,
                x,
                s.x,
                x,
                y,
                x,
                s.dy,
                x,
                dz,
                x,
                dx,
                s.param,
                s.weight,
                s.bias,
                dweight,
                dbias,
                EPS,
                s.saved_mean,
                s.saved_inv,
                s.act,
                s.bwd_workspace,
                s.reserve,
            )

        # torch: relu's backward (the gradient of the add is dz itself), then batch norm's
        return out_of_place(
            ours, lambda: theirs(aten.threshold_backward(s.dy, y, 0)), dx, nbytes(s.x, s.dy, s.x, s.dy, dx, dz), s.dims
        )

    return build


SUITES: dict[str, list[Case]] = {
    "batch_norm": [
        Case("bn_train_fwd_nchw", "batch_norm", training_forward(False)),
        Case("bn_train_fwd_nhwc", "batch_norm", training_forward(True)),
        Case("bn_train_bwd_nchw", "batch_norm", training_backward(False)),
        Case("bn_train_bwd_nhwc", "batch_norm", training_backward(True)),
        Case("bn_add_relu_fwd_nchw", "batch_norm", add_relu_forward(False)),
        Case("bn_add_relu_fwd_nhwc", "batch_norm", add_relu_forward(True)),
        Case("bn_add_relu_bwd_nchw", "batch_norm", add_relu_backward(False)),
        Case("bn_add_relu_bwd_nhwc", "batch_norm", add_relu_backward(True)),
    ]
}


# ---- diagnostics: the launch plan of each case, and where a call's time goes -----------------------
# PYTHONPATH=. python benchmarks/batch_norm.py --plan [--quick]         (any machine: launches nothing)
# PYTHONPATH=. python3 benchmarks/batch_norm.py --profile [--quick]     (CUDA: host us, per-kernel device us)
# PYTHONPATH=. python benchmarks/batch_norm.py --host                   (CPU: us per call, kernels stubbed)

SMS = 132  # streaming multiprocessors of the H200
BANDWIDTH = 4.2e12  # bytes/s the predictions assume


@contextlib.contextmanager
def launches_captured(problems: list[Any]) -> Iterator[None]:
    """Within: opendnn's calls hand their BatchNormProblems to ``problems`` instead of launching kernels."""
    from opendnn.families.batch_norm import triton_backend as backend

    real = backend.run
    backend.run = lambda problem, *tensors: problems.append(problem)
    try:
        yield
    finally:
        backend.run = real


def describe_plan(problem: Any) -> list[str]:
    """Grids, programs per SM, tile, sequential loop lengths and bytes per program of each launch, and
    the time the bytes moved take at BANDWIDTH."""
    from opendnn.families.batch_norm.problem import Direction
    from opendnn.families.batch_norm.triton_backend import bn_plan

    plan, b = bn_plan(problem, True), problem.x.dtype.itemsize  # as on the H200 (thread-block clusters)
    tile = plan.block_o * plan.block_i * plan.block_f
    mask = 1 / 8 if problem.reserve else 0.0
    backward = problem.direction is Direction.BACKWARD
    stats_pass = problem.direction is Direction.TRAINING or (backward and not problem.saved)
    grad_pass = (2 * b + mask) if backward else 0.0  # bytes per element the gradient reduce reads
    elementwise = (3 if backward else 2) * b + mask + (b if problem.z else 0)  # x (dy) in, y or dx (z or dz)
    per_element = (b if stats_pass else 0) + grad_pass + elementwise
    moved = per_element * problem.x.numel
    loop = plan.tiles / plan.splits
    _, block_s = plan.combine_blocks
    orientation = "rows (one feature, tile along N x HW)" if plan.block_f == 1 else "columns (BLOCK_F channels)"
    lines = [
        f"  {orientation}: tile {plan.block_o}x{plan.block_i}x{plan.block_f} = {tile} elements, "
        f"{plan.blocks['num_warps']} warps, {plan.feature_total} features in {plan.f_blocks} blocks of "
        f"{plan.tiles} tiles, splits {plan.splits}, INDEX_64 {plan.index_64}"
    ]
    reduce_bytes = loop * tile * ((b if stats_pass else 0) + grad_pass)
    lines.append(
        f"  reduce      grid {plan.f_blocks * plan.splits:6d} ({plan.f_blocks * plan.splits / SMS:6.1f}/SM), "
        f"loop {loop:.2f} tiles/program, {reduce_bytes / 1e3:.0f} kB read/program"
        + (" (x2: statistics + gradient passes)" if backward and stats_pass else "")
    )
    lines.append(
        f"  combine     grid {-(-plan.feature_total // plan.combine_blocks[0]):6d}, "
        f"{-(-plan.splits // block_s)} load rounds of {block_s} slices"
    )
    lines.append(
        f"  elementwise grid {plan.f_blocks * plan.tiles:6d} ({plan.f_blocks * plan.tiles / SMS:6.1f}/SM), "
        f"1 tile/program, {tile * elementwise / 1e3:.0f} kB moved/program"
    )
    lines.append(
        f"  model: {moved / 1e6:.0f} MB moved ({per_element:.3g} B/element) -> "
        f"{moved / BANDWIDTH * 1e3:.3f} ms at {BANDWIDTH / 1e12:.1f} TB/s"
    )
    cluster, block_o, block_i = plan.one_read
    if cluster and (problem.direction is not Direction.BACKWARD or problem.saved):
        lines.append(
            f"  (planned instead: one read, one launch of {plan.feature_total * cluster} CTAs in clusters of "
            f"{cluster}, {block_o}x{block_i} lanes each: the passes above less one read of x"
            + (" and dy)" if backward else ")")
        )
    return lines


def device_profile(fn: Callable[[], Any], calls: int = 10) -> dict[str, float]:
    """Microseconds of device time per call of each kernel ``fn`` launches (torch.profiler, CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {e.key[:40]: e.self_device_time_total / calls for e in prof.key_averages() if e.self_device_time_total > 0}


def host_us(fn: Callable[[], Any], calls: int = 20) -> float:
    """Microseconds the host spends per call enqueueing ``fn`` (the device is not waited for)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def host_path(repeats: int = 300, rounds: int = 5) -> None:
    """Microseconds per opendnn call of each case on the CPU (tiny shape, float32) with Triton's kernels
    stubbed: the host path up to the kernel launch (the launch's own key and C launcher excluded)."""
    from triton.runtime.interpreter import InterpretedFunction

    InterpretedFunction.run = lambda self, *args, **kwargs: None
    ctx = Context(opendnn.create("cpu", backend="triton"), "cpu", "tiny")
    for case in SUITES["batch_norm"]:
        call = case.build(ctx, torch.float32).opendnn
        call()
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            best = min(best, (time.perf_counter() - start) / repeats)
        print(f"{case.name:24} {best * 1e6:6.1f} us/call", flush=True)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan", action="store_true", help="print each case's launch plan (no GPU needed)")
    parser.add_argument("--profile", action="store_true", help="CUDA: do_bench ms, host us/call, device us/kernel")
    parser.add_argument("--quick", action="store_true", help="the quick shape instead of the full one")
    parser.add_argument("--filter", default="", help="only cases whose name contains this text")
    parser.add_argument("--host", action="store_true", help="CPU: us per call with the kernels stubbed")
    args = parser.parse_args()
    device = "cuda:0" if args.profile else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # the Triton backend on the CPU; nothing is launched
    if args.host:
        host_path()
        return
    ctx = Context(opendnn.create(device, backend="triton"), device, "quick" if args.quick else "full")
    torch.manual_seed(0)
    summary = []
    for case in SUITES["batch_norm"]:
        if args.filter not in case.name:
            continue
        for dtype in (torch.float32, torch.bfloat16):
            problems: list[Any] = []
            with launches_captured(problems) if not args.profile else contextlib.nullcontext():
                bench = case.build(ctx, dtype)
            with launches_captured(problems):
                problems.clear()
                bench.opendnn()
            print(f"{case.name} {str(dtype)[6:]}", flush=True)
            for problem in problems:
                print("\n".join(describe_plan(problem)), flush=True)
            if args.profile:
                import triton.testing

                row = [case.name, str(dtype)[6:]]
                for who, fn in (("opendnn", bench.opendnn), ("torch", bench.torch)):
                    ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    kernels = device_profile(fn)
                    host, device_us = host_us(fn), sum(kernels.values())
                    detail = ", ".join(f"{name} {us:.1f}" for name, us in kernels.items())
                    print(
                        f"  {who:8} do_bench {ms:.4f} ms | host {host:.0f} us/call | device "
                        f"{device_us:.1f} us = {detail}",
                        flush=True,
                    )
                    row += [ms, host, device_us]
                summary.append((*row, bench.nbytes / row[2] / 1e9))
            del bench
    if summary:  # the short table, last
        print(
            f"\n{'case':22} {'dtype':8} {'ms':>7} {'torch':>7} {'x torch':>7} {'TB/s':>5} {'host us':>7} "
            f"{'dev us':>7} {'torch host':>10} {'dev':>6}"
        )
        for name, dtype, ms, host, dev, torch_ms, torch_host, torch_dev, tbs in summary:
            print(
                f"{name:22} {dtype:8} {ms:7.4f} {torch_ms:7.4f} {torch_ms / ms:7.2f} {tbs:5.2f} {host:7.0f} "
                f"{dev:7.1f} {torch_host:10.0f} {torch_dev:6.1f}"
            )


if __name__ == "__main__":
    main()
