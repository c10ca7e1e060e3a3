"""Benchmark cases: tables of opendnn calls beside their torch equivalents, grouped into suites.

A case builds a ``Bench`` for one dtype: two closures over the same inputs (opendnn's call and
torch's), the tensor opendnn writes, a ``reset`` that readies the state for the correctness check
(NaN in an output that is never read; a fresh copy of the start value for an in-place op), and the
fewest bytes the op must move: every input read once plus the output written once.

Suites:
    elementwise  every activation forward and backward, op_tensor ADD and MUL, add_tensor with a
                 broadcast bias, scale_tensor; rows x cols tensors (32768 x 4096, transformer rows).
    transform    transform_tensor between NCHW and NHWC, and dtype conversion (float32 <-> bfloat16),
                 on a ResNet-50 activation (64 x 256 x 56 x 56); copy (NCHW to NCHW against torch's
                 clone) is the copy bandwidth of the same tensor in the same run.
    reduce       reduce_tensor ADD and MAX over the last dim of 32768 x 4096 into (32768, 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import opendnn
from opendnn import ActivationMode, OpTensorOp, TensorFormat

aten = torch.ops.aten

# Sizes: "full" is the real model shape, "quick" a GPU smoke run, "tiny" the CPU smoke run (odd sizes,
# so that kernels' masked tails run too).
SHAPES: dict[str, dict[str, tuple[int, ...]]] = {
    "elementwise": {"full": (32768, 4096), "quick": (4096, 4096), "tiny": (33, 70)},
    "transform": {"full": (64, 256, 56, 56), "quick": (8, 256, 56, 56), "tiny": (2, 6, 5, 7)},
    "reduce": {"full": (32768, 4096), "quick": (4096, 4096), "tiny": (33, 70)},
}

ACTIVATION_INPUT_SCALE = 3.0  # x ~ 3 * N(0, 1): clipped relu's ceiling 6 and softplus's tails are reached


@dataclass(frozen=True)
class Context:
    """What every case is built with: the opendnn handle, the torch device and the size preset."""

    handle: opendnn.Handle
    device: str
    size: str  # a key of SHAPES[suite]

    def shape(self, suite: str) -> tuple[int, ...]:
        return SHAPES[suite][self.size]

    def randn(self, dims: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(dims, dtype=dtype, device=self.device).mul_(scale)

    def randn_for(self, desc: opendnn.TensorDescriptor, dtype: torch.dtype) -> torch.Tensor:
        """Random values laid out with ``desc``'s dims and strides."""
        return self.empty_for(desc, dtype).normal_()

    def empty_for(self, desc: opendnn.TensorDescriptor, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty_strided(desc.dims, desc.strides, dtype=dtype, device=self.device)


@dataclass(frozen=True)
class Bench:
    """One case, ready to check and time.

    Attributes:
        opendnn: runs opendnn's call, writing ``output``.
        torch: runs torch's equivalent and returns its result.
        output: the tensor opendnn writes, compared with torch's result after ``reset``.
        nbytes: fewest bytes moved: each input read once + the output written once.
        reset: readies the state for the correctness check.
        shape: the problem's dims, for the report.
        dtype_label: the report's dtype when it is not the input's (conversions).
        flops: floating-point operations of the op (0 for memory-bound ops): the report adds TFLOP/s.
        tolerance: the check's relative error bound when not the dtype's default (TF32 products).
    """

    opendnn: Callable[[], Any]
    torch: Callable[[], torch.Tensor]
    output: torch.Tensor
    nbytes: int
    reset: Callable[[], Any]
    shape: tuple[int, ...]
    dtype_label: str | None = None
    flops: int = 0
    tolerance: float | None = None


@dataclass(frozen=True)
class Case:
    name: str
    suite: str
    build: Callable[[Context, torch.dtype], Bench]


def desc_of(t: torch.Tensor) -> opendnn.TensorDescriptor:
    return opendnn.TensorDescriptor(t.dtype, tuple(t.shape), t.stride())


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def out_of_place(
    run_opendnn: Callable[[], Any],
    run_torch: Callable[[], torch.Tensor],
    output: torch.Tensor,
    moved: int,
    shape: tuple[int, ...],
    dtype_label: str | None = None,
) -> Bench:
    """A Bench whose output is never read by opendnn (beta = 0): it is poisoned with NaN before the check."""
    return Bench(run_opendnn, run_torch, output, moved, lambda: output.fill_(math.nan), shape, dtype_label)


def in_place(
    start: torch.Tensor,
    update_opendnn: Callable[[torch.Tensor], Any],
    update_torch: Callable[[torch.Tensor], torch.Tensor],
    moved: int,
) -> Bench:
    """A Bench updating a tensor in place: opendnn and torch each own a copy, reset to ``start``."""
    mine, theirs = start.clone(), start.clone()

    def reset() -> None:
        mine.copy_(start)
        theirs.copy_(start)

    return Bench(lambda: update_opendnn(mine), lambda: update_torch(theirs), mine, moved, reset, tuple(start.shape))


# ---- elementwise ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Activation:
    """An opendnn activation and torch's forward and autograd-free backward ``(dy, x, y) -> dx``."""

    name: str
    mode: ActivationMode
    coef: float | None
    forward: Callable[[torch.Tensor], torch.Tensor]
    backward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


ACTIVATIONS = [
    Activation("relu", ActivationMode.RELU, None, torch.relu, lambda dy, x, y: aten.threshold_backward(dy, x, 0)),
    Activation(
        "clipped_relu6",
        ActivationMode.CLIPPED_RELU,
        6.0,
        lambda x: F.hardtanh(x, 0.0, 6.0),
        lambda dy, x, y: aten.hardtanh_backward(dy, x, 0.0, 6.0),
    ),
    Activation("tanh", ActivationMode.TANH, None, torch.tanh, lambda dy, x, y: aten.tanh_backward(dy, y)),
    Activation("sigmoid", ActivationMode.SIGMOID, None, torch.sigmoid, lambda dy, x, y: aten.sigmoid_backward(dy, y)),
    Activation("elu", ActivationMode.ELU, 1.0, F.elu, lambda dy, x, y: aten.elu_backward(dy, 1.0, 1.0, 1.0, False, x)),
    Activation("gelu", ActivationMode.GELU, None, F.gelu, lambda dy, x, y: aten.gelu_backward(dy, x)),
    Activation(
        "gelu_tanh",
        ActivationMode.GELU_APPROX_TANH,
        None,
        lambda x: F.gelu(x, approximate="tanh"),
        lambda dy, x, y: aten.gelu_backward(dy, x, approximate="tanh"),
    ),
    Activation(
        "softplus", ActivationMode.SOFTPLUS, 1.0, F.softplus, lambda dy, x, y: aten.softplus_backward(dy, x, 1.0, 20.0)
    ),
    Activation("swish", ActivationMode.SWISH, 1.0, F.silu, lambda dy, x, y: aten.silu_backward(dy, x)),
]


def activation_forward(act: Activation) -> Callable[[Context, torch.dtype], Bench]:
    """``y = act(x)``: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = ctx.randn(ctx.shape("elementwise"), dtype, ACTIVATION_INPUT_SCALE)
        y = torch.empty_like(x)
        act_desc, x_desc, y_desc = opendnn.ActivationDescriptor(act.mode, coef=act.coef), desc_of(x), desc_of(y)
        return out_of_place(
            lambda: opendnn.activation_forward(ctx.handle, act_desc, 1.0, x_desc, x, 0.0, y_desc, y),
            lambda: act.forward(x),
            y,
            nbytes(x, y),
            tuple(x.shape),
        )

    return build


def activation_backward(act: Activation) -> Callable[[Context, torch.dtype], Bench]:
    """``dx = dy * act'(x)``: reads dy and x (torch's tanh and sigmoid read y instead), writes dx."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        x = ctx.randn(ctx.shape("elementwise"), dtype, ACTIVATION_INPUT_SCALE)
        dy, y, dx = torch.randn_like(x), act.forward(x), torch.empty_like(x)
        act_desc = opendnn.ActivationDescriptor(act.mode, coef=act.coef)
        x_desc, y_desc, dy_desc, dx_desc = desc_of(x), desc_of(y), desc_of(dy), desc_of(dx)
        return out_of_place(
            lambda: opendnn.activation_backward(
                ctx.handle, act_desc, 1.0, y_desc, y, dy_desc, dy, x_desc, x, 0.0, dx_desc, dx
            ),
            lambda: act.backward(dy, x, y),
            dx,
            nbytes(dy, x, dx),
            tuple(x.shape),
        )

    return build


def op_tensor(
    op: OpTensorOp, torch_op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> Callable[[Context, torch.dtype], Bench]:
    """``c = op(a, b)``: reads a and b, writes c."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        shape = ctx.shape("elementwise")
        a, b = ctx.randn(shape, dtype), ctx.randn(shape, dtype)
        c = torch.empty_like(a)
        op_desc, a_desc, b_desc, c_desc = opendnn.OpTensorDescriptor(op), desc_of(a), desc_of(b), desc_of(c)
        return out_of_place(
            lambda: opendnn.op_tensor(ctx.handle, op_desc, 1.0, a_desc, a, 1.0, b_desc, b, 0.0, c_desc, c),
            lambda: torch_op(a, b),
            c,
            nbytes(a, b, c),
            shape,
        )

    return build


def add_bias(ctx: Context, dtype: torch.dtype) -> Bench:
    """``c = alpha * bias + c`` (add_tensor, beta = 1) with a (1, cols) bias: reads c and bias, writes c."""
    rows, cols = ctx.shape("elementwise")
    alpha = 0.5
    bias, start = ctx.randn((1, cols), dtype), ctx.randn((rows, cols), dtype)
    bias_desc, c_desc = desc_of(bias), desc_of(start)
    return in_place(
        start,
        lambda c: opendnn.add_tensor(ctx.handle, alpha, bias_desc, bias, 1.0, c_desc, c),
        lambda c: c.add_(bias, alpha=alpha),
        nbytes(start, start, bias),
    )


def scale(ctx: Context, dtype: torch.dtype) -> Bench:
    """``y = alpha * y`` in place: reads and writes y. alpha = -1 keeps values bounded over many timed runs."""
    start = ctx.randn(ctx.shape("elementwise"), dtype)
    y_desc = desc_of(start)
    return in_place(
        start, lambda y: opendnn.scale_tensor(ctx.handle, y_desc, y, -1.0), lambda y: y.mul_(-1.0), nbytes(start, start)
    )


ELEMENTWISE = [
    *(Case(f"{act.name}_fwd", "elementwise", activation_forward(act)) for act in ACTIVATIONS),
    *(Case(f"{act.name}_bwd", "elementwise", activation_backward(act)) for act in ACTIVATIONS),
    Case("op_tensor_add", "elementwise", op_tensor(OpTensorOp.ADD, torch.add)),
    Case("op_tensor_mul", "elementwise", op_tensor(OpTensorOp.MUL, torch.mul)),
    Case("add_tensor_bias", "elementwise", add_bias),
    Case("scale_tensor", "elementwise", scale),
]


# ---- transform -----------------------------------------------------------------------------------


def change_layout(
    source: TensorFormat, target: TensorFormat, torch_copy: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[Context, torch.dtype], Bench]:
    """``y = x`` from one memory order to the other: reads x, writes y."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        dims = ctx.shape("transform")
        x_desc = opendnn.TensorDescriptor.from_format(source, dtype, *dims)
        y_desc = opendnn.TensorDescriptor.from_format(target, dtype, *dims)
        x, y = ctx.randn_for(x_desc, dtype), ctx.empty_for(y_desc, dtype)
        return out_of_place(
            lambda: opendnn.transform_tensor(ctx.handle, 1.0, x_desc, x, 0.0, y_desc, y),
            lambda: torch_copy(x),
            y,
            nbytes(x, y),
            dims,
        )

    return build


CONVERSION_TARGET = {
    torch.float32: torch.bfloat16,
    torch.bfloat16: torch.float32,
    torch.float16: torch.float32,
    torch.float64: torch.float32,
}


def convert(ctx: Context, dtype: torch.dtype) -> Bench:
    """``y = x`` converted to another dtype (float32 <-> bfloat16), packed NCHW: reads x, writes y."""
    dims = ctx.shape("transform")
    target = CONVERSION_TARGET[dtype]
    x = ctx.randn(dims, dtype)
    y = torch.empty(dims, dtype=target, device=ctx.device)
    x_desc, y_desc = desc_of(x), desc_of(y)
    label = f"{str(dtype).removeprefix('torch.')}->{str(target).removeprefix('torch.')}"
    return out_of_place(
        lambda: opendnn.transform_tensor(ctx.handle, 1.0, x_desc, x, 0.0, y_desc, y),
        lambda: x.to(target),
        y,
        nbytes(x, y),
        dims,
        label,
    )


TRANSFORM = [
    Case("copy", "transform", change_layout(TensorFormat.NCHW, TensorFormat.NCHW, lambda x: x.clone())),  # ceiling
    Case(
        "nchw_to_nhwc",
        "transform",
        change_layout(TensorFormat.NCHW, TensorFormat.NHWC, lambda x: x.contiguous(memory_format=torch.channels_last)),
    ),
    Case("nhwc_to_nchw", "transform", change_layout(TensorFormat.NHWC, TensorFormat.NCHW, lambda x: x.contiguous())),
    Case("convert", "transform", convert),
]


# ---- reduce --------------------------------------------------------------------------------------


def reduce_last_dim(
    op_name: str, torch_reduce: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[Context, torch.dtype], Bench]:
    """``c[i, 0] = reduce_j a[i, j]``: reads a, writes c."""

    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        # Imported here: the reduce API is newer than the rest, and the other suites must run without it.
        from opendnn import ReduceTensorDescriptor, ReduceTensorOp, get_reduction_workspace_size, reduce_tensor

        rows, cols = ctx.shape("reduce")
        a = ctx.randn((rows, cols), dtype)
        c = torch.empty((rows, 1), dtype=dtype, device=ctx.device)
        reduce_desc = ReduceTensorDescriptor(op=getattr(ReduceTensorOp, op_name))
        a_desc, c_desc = desc_of(a), desc_of(c)
        size = get_reduction_workspace_size(ctx.handle, reduce_desc, a_desc, c_desc)
        workspace = torch.empty(size, dtype=torch.uint8, device=ctx.device) if size else None
        return out_of_place(
            lambda: reduce_tensor(ctx.handle, reduce_desc, None, workspace, 1.0, a_desc, a, 0.0, c_desc, c),
            lambda: torch_reduce(a),
            c,
            nbytes(a, c),
            (rows, cols),
        )

    return build


REDUCE = [
    Case("reduce_add", "reduce", reduce_last_dim("ADD", lambda a: torch.sum(a, dim=-1, keepdim=True))),
    Case("reduce_max", "reduce", reduce_last_dim("MAX", lambda a: torch.amax(a, dim=-1, keepdim=True))),
]

SUITES: dict[str, list[Case]] = {"elementwise": ELEMENTWISE, "transform": TRANSFORM, "reduce": REDUCE}
