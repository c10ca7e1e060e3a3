"""Graph API benchmark cases: plans of ``opendnn.graph`` (built once, then executed with a variant pack,
host included) beside the same computation in torch, same inputs, same process.

Suite ``graph`` (bfloat16 on the H200: ``--dtypes bfloat16``):
    copy                   the copy of a 64 x 256 x 56 x 56 tensor (the ``transform`` suite's case) in the
                           same run: the ceiling of the pointwise rows.
    pointwise_dag_nchw     y = relu(x * s1 + b1 + (z * s2 + b2)), six pointwise ops: the tail of ResNet-50's
    pointwise_dag_nhwc     first bottleneck (its batch norm's apply, the shortcut's, the add, the relu) over x
                           and z of 64 x 256 x 56 x 56 and s, b per channel, NCHW and channels-last. One
                           generated kernel against torch eager's six kernels; each ``_compiled`` row against
                           ``torch.compile`` of the same function (default mode) instead.
    bn_relu_conv_genstats  a batch norm's apply and relu before a 3x3 convolution, then the per-channel sum and
                           sum of squares of its output (ResNet-50 layer 3: 64 x 256 x 14 x 14, 256 -> 256,
                           pad 1, NHWC in 16 bits), one plan against torch's x * scale + bias, relu, cuDNN's
                           conv2d, sum and sum of squares. The check compares the convolution's output with
                           torch's; the build checks the sums against the float64 sums of that output.
    r50_l3_3x3_fwd         that convolution alone, opendnn's and cuDNN's (the ``convolution`` suite's case).
    execute_host           1000 executes of a built three-node plan (relu((x + b) * 0.5), x of 64 x 256) in a
                           row against torch's three ops as often, started on a drained device: each call's
                           kernels take less time than its host side, so the time is the host's, and ms for
                           1000 calls read as us a call.

Suite ``graph_attention`` (bfloat16 on the H200; float32 on the CPU, whose interpreter multiplies
bfloat16 products wrongly, docs/design/attention.md):
    sdpa_gqa_causal_residual_fwd
                           ``o = sdpa(q, k, v)`` then ``y = o + residual`` (the attention suite's
                           gqa_hd128_4k: 64 query heads, 8 key/value heads of 128, BSHD memory, causal),
                           the attention call and a generated kernel, against torch's SDPA and add.
    sdpa_gqa_causal_bwd    ``sdpa_backward`` of the same attention from the forward's o and stats: dq, dk, dv
                           flattened into one tensor on each side, against torch's autograd of its SDPA.
    The dtype cell names the plan's engine (the attention family's launches are not counted).

A plan's dtype cell adds its engine and the kernel launches of one execute (``fused launches=3``). Bytes:
each input read once and each output written once. On the CPU the fused engine runs under
``TRITON_INTERPRET=1``; without it the plans are the reference engine's, and the dtype cell says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import attention
import convolution
import suites
import torch
import torch.nn.functional as F
from suites import Bench, Case, Context, nbytes, out_of_place

import opendnn
import opendnn.graph as og
from opendnn.core.recording import recording
from opendnn.samples import relative_error

Build = Callable[[Context, torch.dtype], Bench]
CONV_LAYER = next(layer for layer in convolution.LAYERS if layer.name == "r50_l3_3x3")
# (dims, calls per timed run) of execute_host; Triton's interpreter takes about 40 ms a launch of 64 x 256
HOST = {"full": ((64, 256), 1000), "quick": ((64, 256), 1000), "tiny": ((3, 10), 2)}
MEMORY_FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}
SUMS_TOLERANCE = 1e-4  # float32 sums of 12544 terms a channel, against float64 ones


def build_plan(graph: og.Graph) -> og.Graph:
    """validate -> build_operation_graph -> create_execution_plans (heuristics A: the fused engine first)
    -> check_support -> build_plans."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([og.HeurMode.A])
    graph.check_support()
    graph.build_plans()
    return graph


def workspace(graph: og.Graph, device: str) -> torch.Tensor:
    return torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=device)


class LaunchCounter:
    """A recording (``opendnn.core.recording``) that counts the kernels a call launches, and launches them."""

    def __init__(self) -> None:
        self.launches = 0

    def launched(self, launch: Any, tensors: dict[str, Any]) -> None:
        self.launches += 1
        launch.launch(tensors)

    def dispatched(self, handle: Any, operation: str, problem: Any) -> None:
        pass

    def repeated(self, step: Callable[[], None]) -> None:
        pass


def plan_label(graph: og.Graph, execute: Callable[[], Any], first_word: str) -> str:
    """``<first_word> <engine> launches=<n>``, running ``execute`` once to count its launches."""
    counter = LaunchCounter()
    with recording(counter):
        execute()
    return f"{first_word} {graph.plan.engine} launches={counter.launches}"


def bias_scale_relu(
    handle: opendnn.Handle, x: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> tuple[og.Graph, dict[og.Tensor, torch.Tensor]]:
    """``out = relu((x + b) * 0.5)``, three pointwise nodes, as a built graph and its variant pack."""
    g = og.Graph(io_data_type=out.dtype, handle=handle, name="bias_scale_relu")
    xt, bt = g.tensor_like(x, name="x"), g.tensor_like(b, name="b")
    y = g.relu(g.mul(g.add(xt, bt), 0.5))
    y.set_output(True)
    return build_plan(g), {xt: x, bt: b, y: out}


# ---- a pointwise DAG -----------------------------------------------------------------------------


def bottleneck_tail(
    x: torch.Tensor, s1: torch.Tensor, b1: torch.Tensor, z: torch.Tensor, s2: torch.Tensor, b2: torch.Tensor
) -> torch.Tensor:
    return torch.relu(x * s1 + b1 + (z * s2 + b2))


def pointwise_dag(layout: str, compiled: bool) -> Build:
    """``bottleneck_tail`` as one plan: reads x, z and the four per-channel vectors, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        dims = ctx.shape("transform")  # the copy row's tensor
        x, z = (ctx.randn(dims, dtype).contiguous(memory_format=MEMORY_FORMATS[layout]) for _ in range(2))
        s1, b1, s2, b2 = (ctx.randn((1, dims[1], 1, 1), dtype) for _ in range(4))
        arrays, out = (x, s1, b1, z, s2, b2), torch.empty_like(x)
        g = og.Graph(io_data_type=dtype, handle=ctx.handle, name="bottleneck_tail")
        xt, s1t, b1t, zt, s2t, b2t = (g.tensor_like(a, name=n) for a, n in zip(arrays, "x s1 b1 z s2 b2".split()))
        y = g.relu(g.add(g.add(g.mul(xt, s1t), b1t), g.add(g.mul(zt, s2t), b2t)))
        y.set_output(True).set_stride(out.stride())
        pack, ws = dict(zip((xt, s1t, b1t, zt, s2t, b2t, y), (*arrays, out))), workspace(build_plan(g), ctx.device)
        # static shapes: the kernel inductor writes for this one shape, as the plan's is
        theirs = torch.compile(bottleneck_tail, dynamic=False) if compiled else bottleneck_tail
        label = plan_label(g, lambda: g.execute(pack, ws), f"{layout}_{str(dtype).removeprefix('torch.')}")
        return out_of_place(
            lambda: g.execute(pack, ws), lambda: theirs(*arrays), out, nbytes(*arrays, out), dims, label
        )

    return build


# ---- batch norm apply, relu, convolution, statistics ---------------------------------------------


def check_sums(stats: torch.Tensor, y: torch.Tensor) -> None:
    """Raise unless ``stats`` holds the per-channel sum and sum of squares of ``y`` (N, K, H, W)."""
    expected = torch.stack([y.double().sum((0, 2, 3)), y.double().square().sum((0, 2, 3))])
    error = relative_error(stats, expected)
    if not error < SUMS_TOLERANCE:  # NaN compares False: an unwritten sum fails
        raise ValueError(f"genstats: rel_err {error:.3g} >= {SUMS_TOLERANCE:g} against the float64 sums of y")


def bn_relu_conv_genstats(ctx: Context, dtype: torch.dtype) -> Bench:
    """Reads x, scale, bias (per channel) and w; writes y and the (2, K) float32 sums of y."""
    p = convolution.layer_problem(ctx, CONV_LAYER, dtype)
    x, w, pad, k = p.x, p.w, CONV_LAYER.pad, CONV_LAYER.k
    scale, bias = (ctx.randn((1, CONV_LAYER.c, 1, 1), dtype) for _ in range(2))
    out, stats = torch.empty_like(p.dy), torch.empty((2, k), device=ctx.device)
    g = og.Graph(io_data_type=dtype, intermediate_data_type=dtype, handle=ctx.handle, name="bn_relu_conv_genstats")
    xt, st, bt, wt = (g.tensor_like(a, name=n) for a, n in zip((x, scale, bias, w), "x scale bias w".split()))
    activated = g.relu(g.bias(g.scale(xt, st), bt))
    activated.set_stride(x.stride())  # the convolution reads it in the image's layout
    y = g.conv_fprop(activated, wt, padding=[pad, pad])
    y.set_output(True).set_stride(out.stride())
    total, squares = g.genstats(y)
    total.set_output(True)
    squares.set_output(True)
    sums = {total: stats[0].view(1, k, 1, 1), squares: stats[1].view(1, k, 1, 1)}
    pack, ws = {xt: x, st: scale, bt: bias, wt: w, y: out, **sums}, workspace(build_plan(g), ctx.device)

    def poison() -> None:
        out.fill_(math.nan)
        stats.fill_(math.nan)

    def run_torch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with convolution.cudnn_settings(tf32=False):  # the plan's convolution computes in float32, as cuDNN's
            y = F.conv2d(torch.relu(x * scale + bias), w, None, 1, pad)
        return y, y.sum((0, 2, 3), dtype=torch.float32), (y * y).sum((0, 2, 3), dtype=torch.float32)

    poison()
    label = plan_label(g, lambda: g.execute(pack, ws), p.label)
    check_sums(stats, out)
    return Bench(
        lambda: g.execute(pack, ws),
        lambda: run_torch()[0],
        out,
        nbytes(x, scale, bias, w, out, stats),
        poison,
        tuple(x.shape),
        label,
        p.flops,
    )


# ---- attention ---------------------------------------------------------------------------------------


def attention_inputs(ctx: Context, dtype: torch.dtype) -> tuple[attention.Inputs, tuple[int, ...], float]:
    """q, k, v and do of the attention suite's gqa_hd128_4k (BSHD memory), its dims and 1 / sqrt(D)."""
    batch, heads_q, heads_kv, seq, dim = attention.SHAPES["gqa_hd128_4k"][ctx.size]
    inputs = attention.Inputs(
        *(attention.bshd(ctx, dtype, batch, heads, seq, dim) for heads in (heads_q, heads_kv, heads_kv, heads_q))
    )
    return inputs, (batch, heads_q, heads_kv, seq, dim), 1.0 / math.sqrt(dim)


def sdpa_residual(ctx: Context, dtype: torch.dtype) -> Bench:
    """Reads q, k, v and the residual, writes y."""
    inputs, shape, scale = attention_inputs(ctx, dtype)
    q, k, v = inputs.q, inputs.k, inputs.v
    residual, out = torch.randn_like(q), torch.empty_like(q)
    g = og.Graph(io_data_type=dtype, handle=ctx.handle, name="sdpa_residual")
    qt, kt, vt, rt = (g.tensor_like(a, name=n) for a, n in zip((q, k, v, residual), "q k v residual".split()))
    o, _ = g.sdpa(qt, kt, vt, attn_scale=scale, is_inference=True, causal_mask=True)
    y = g.add(o, rt)
    y.set_output(True).set_stride(out.stride())
    pack, ws = {qt: q, kt: k, vt: v, rt: residual, y: out}, workspace(build_plan(g), ctx.device)
    label = f"{str(dtype).removeprefix('torch.')} {g.plan.engine}"
    flops = attention.attention_flops(shape[1], shape[4], shape[0] * shape[3] ** 2, True, False)
    return Bench(
        lambda: g.execute(pack, ws),
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) + residual,
        out,
        nbytes(q, k, v, residual, out),
        lambda: out.fill_(math.nan),
        shape,
        label,
        flops,
    )


def sdpa_backward(ctx: Context, dtype: torch.dtype) -> Bench:
    """Reads q, k, v, o, do (and the stats), writes dq, dk, dv."""
    inputs, shape, scale = attention_inputs(ctx, dtype)
    q, k, v, do = inputs.q, inputs.k, inputs.v, inputs.do
    forward = og.Graph(io_data_type=dtype, handle=ctx.handle, name="sdpa_forward")
    qt, kt, vt = (forward.tensor_like(a, name=n) for a, n in zip((q, k, v), "qkv"))
    o_t, stats_t = forward.sdpa(qt, kt, vt, attn_scale=scale, causal_mask=True)
    o, stats = torch.empty_like(q), torch.empty((*q.shape[:3], 1), device=ctx.device)
    o_t.set_output(True).set_stride(o.stride())
    stats_t.set_output(True)
    build_plan(forward).execute({qt: q, kt: k, vt: v, o_t: o, stats_t: stats}, workspace(forward, ctx.device))
    g = og.Graph(io_data_type=dtype, handle=ctx.handle, name="sdpa_backward")
    arrays = (q, k, v, o, do, stats)
    tensors = [g.tensor_like(a, name=n) for a, n in zip(arrays, "q k v o do stats".split())]
    gradients = g.sdpa_backward(*tensors, attn_scale=scale, causal_mask=True)
    outs = [torch.empty_like(a) for a in (q, k, v)]
    for t, out in zip(gradients, outs):
        t.set_output(True).set_stride(out.stride())
    pack, ws = {**dict(zip(tensors, arrays)), **dict(zip(gradients, outs))}, workspace(build_plan(g), ctx.device)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    theirs = F.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)

    def run_opendnn() -> list[torch.Tensor]:
        g.execute(pack, ws)
        return outs

    bench = attention._gradients(
        run_opendnn,
        theirs,
        leaves,
        do,
        nbytes(q, k, v, o, do, stats, *outs),
        shape,
        attention.attention_flops(shape[1], shape[4], shape[0] * shape[3] ** 2, True, True),
    )
    return dataclasses.replace(bench, dtype_label=f"{str(dtype).removeprefix('torch.')} {g.plan.engine}")


# ---- host time of execute ------------------------------------------------------------------------


def execute_host(ctx: Context, dtype: torch.dtype) -> Bench:
    """``calls`` executes of ``bias_scale_relu``'s plan in a row (torch: its three ops as often), after
    the device drained: the events around the run then time the host's loop."""
    dims, calls = HOST[ctx.size]
    x, b = ctx.randn(dims, dtype), ctx.randn((1, dims[1]), dtype)
    out = torch.empty_like(x)
    g, pack = bias_scale_relu(ctx.handle, x, b, out)
    ws = workspace(g, ctx.device)

    def in_a_row(call: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            if ctx.device != "cpu":
                torch.cuda.synchronize(ctx.device)
            for _ in range(calls):
                result = call()
            return result

        return run

    label = plan_label(g, lambda: g.execute(pack, ws), str(dtype).removeprefix("torch."))
    return out_of_place(
        in_a_row(lambda: g.execute(pack, ws)),
        in_a_row(lambda: torch.relu((x + b) * 0.5)),
        out,
        nbytes(x, b, out) * calls,
        dims,
        label,
    )


def borrowed(cases: list[Case], name: str) -> Case:
    """Another suite's case, run in this suite's table."""
    return Case(name, "graph", next(case for case in cases if case.name == name).build)


GRAPH = [
    borrowed(suites.TRANSFORM, "copy"),
    *(
        Case(f"pointwise_dag_{layout}{'_compiled' if compiled else ''}", "graph", pointwise_dag(layout, compiled))
        for layout in MEMORY_FORMATS
        for compiled in (False, True)
    ),
    Case("bn_relu_conv_genstats", "graph", bn_relu_conv_genstats),
    borrowed(convolution.SUITES["convolution"], f"{CONV_LAYER.name}_fwd"),
    Case("execute_host", "graph", execute_host),
]

GRAPH_ATTENTION = [
    Case("sdpa_gqa_causal_residual_fwd", "graph_attention", sdpa_residual),
    Case("sdpa_gqa_causal_bwd", "graph_attention", sdpa_backward),
]

SUITES: dict[str, list[Case]] = {"graph": GRAPH, "graph_attention": GRAPH_ATTENTION}
