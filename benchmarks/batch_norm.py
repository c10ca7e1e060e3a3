"""Batch normalization benchmarks: training forward and backward on a ResNet-50 activation
(64 x 256 x 56 x 56, NCHW and NHWC), and batch norm + add + relu (the Ex form) against torch's
three separate ops (cuDNN batch norm, add, relu), forward and backward.

Bytes counted (the same count serves opendnn and torch; the cuDNN anchors count the forward so):
    forward     read x twice (statistics, then normalize) + write y                  3 passes
    backward    read x and dy twice (gradient sums, then dx) + write dx             5 passes
    add + relu  forward: the forward's + read z (4 passes); backward: the backward's + write dz (6)
The fewest bytes any method moves are 2 passes forward and 3 backward; multiply GB/s by 2/3 and
3/5 for that measure.
"""

from __future__ import annotations

from collections.abc import Callable
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
            handle, MODE, 1.0, 0.0, self.x_desc, self.x, self.x_desc, self.y, self.param, self.weight, self.bias,
            0.1, self.mean, self.var, EPS, self.saved_mean, self.saved_inv)


def torch_backward(ctx: Context, s: Setup, x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's batch-norm backward of ``x`` (cuDNN's on CUDA): dy -> dx."""
    if ctx.device == "cpu":
        _, mean, inv, _ = aten.native_batch_norm(x, s.weight, s.bias, None, None, True, 0.1, EPS) + (None,)
        return lambda dy: aten.native_batch_norm_backward(dy, x, s.weight, None, None, mean, inv, True, EPS,
                                                          [True, True, True])[0]
    _, mean, inv, reserve = aten.cudnn_batch_norm(x, s.weight, s.bias, s.mean.clone(), s.var.clone(), True, 0.1, EPS)
    return lambda dy: aten.cudnn_batch_norm_backward(x, dy, s.weight, s.mean, s.var, mean, inv, EPS, reserve)[0]


def training_forward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = Setup(ctx, dtype, channels_last)
        torch_mean, torch_var = s.mean.clone(), s.var.clone()
        return out_of_place(lambda: s.forward(ctx.handle),
                            lambda: TF.batch_norm(s.x, torch_mean, torch_var, s.weight, s.bias, True, 0.1, EPS),
                            s.y, nbytes(s.x, s.x, s.y), s.dims)

    return build


def training_backward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = Setup(ctx, dtype, channels_last)
        s.forward(ctx.handle)
        dx, dweight, dbias = torch.empty_like(s.x), torch.empty_like(s.weight), torch.empty_like(s.weight)
        theirs = torch_backward(ctx, s, s.x)
        return out_of_place(
            lambda: opendnn.batch_normalization_backward(
                ctx.handle, MODE, 1.0, 0.0, 1.0, 0.0, s.x_desc, s.x, s.x_desc, s.dy, s.x_desc, dx, s.param, s.weight,
                dweight, dbias, EPS, s.saved_mean, s.saved_inv),
            lambda: theirs(s.dy), dx, nbytes(s.x, s.dy, s.x, s.dy, dx), s.dims)

    return build


class FusedSetup(Setup):
    """The Ex form's activation, workspace and reserve space beside Setup's tensors."""

    def __init__(self, ctx: Context, dtype: torch.dtype, channels_last: bool) -> None:
        super().__init__(ctx, dtype, channels_last)
        self.act = opendnn.ActivationDescriptor(opendnn.ActivationMode.RELU)
        ops = BatchNormOps.BN_ADD_ACTIVATION
        h, x = ctx.handle, self.x_desc
        self.workspace = self.bytes(ctx, opendnn.get_batch_normalization_forward_training_ex_workspace_size(
            h, MODE, ops, x, x, x, self.param, self.act))
        self.bwd_workspace = self.bytes(ctx, opendnn.get_batch_normalization_backward_ex_workspace_size(
            h, MODE, ops, x, x, x, x, x, self.param, self.act))
        self.reserve = self.bytes(ctx, opendnn.get_batch_normalization_training_ex_reserve_space_size(
            h, MODE, ops, self.act, x))

    @staticmethod
    def bytes(ctx: Context, size: int) -> Any:
        return torch.empty(size, dtype=torch.uint8, device=ctx.device) if size else None

    def forward_ex(self, handle: opendnn.Handle) -> None:
        x = self.x_desc
        opendnn.batch_normalization_forward_training_ex(
            handle, MODE, BatchNormOps.BN_ADD_ACTIVATION, 1.0, 0.0, x, self.x, x, self.z, x, self.y, self.param,
            self.weight, self.bias, 0.1, self.mean, self.var, EPS, self.saved_mean, self.saved_inv, self.act,
            self.workspace, self.reserve)


def add_relu_forward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = FusedSetup(ctx, dtype, channels_last)
        torch_mean, torch_var = s.mean.clone(), s.var.clone()
        return out_of_place(
            lambda: s.forward_ex(ctx.handle),
            lambda: torch.relu(TF.batch_norm(s.x, torch_mean, torch_var, s.weight, s.bias, True, 0.1, EPS) + s.z),
            s.y, nbytes(s.x, s.x, s.z, s.y), s.dims)

    return build


def add_relu_backward(channels_last: bool) -> Callable[[Context, torch.dtype], Bench]:
    def build(ctx: Context, dtype: torch.dtype) -> Bench:
        s = FusedSetup(ctx, dtype, channels_last)
        s.forward_ex(ctx.handle)
        dx, dz = torch.empty_like(s.x), torch.empty_like(s.x)
        dweight, dbias = torch.empty_like(s.weight), torch.empty_like(s.weight)
        theirs = torch_backward(ctx, s, s.x)
        y = s.y.clone()
        x = s.x_desc

        def ours() -> None:
            opendnn.batch_normalization_backward_ex(
                ctx.handle, MODE, BatchNormOps.BN_ADD_ACTIVATION, 1.0, 0.0, 1.0, 0.0, x, s.x, x, y, x, s.dy, x, dz,
                x, dx, s.param, s.weight, s.bias, dweight, dbias, EPS, s.saved_mean, s.saved_inv, s.act,
                s.bwd_workspace, s.reserve)

        # torch: relu's backward (the gradient of the add is dz itself), then batch norm's
        return out_of_place(ours, lambda: theirs(aten.threshold_backward(s.dy, y, 0)), dx,
                            nbytes(s.x, s.dy, s.x, s.dy, dx, dz), s.dims)

    return build


SUITES: dict[str, list[Case]] = {"batch_norm": [
    Case("bn_train_fwd_nchw", "batch_norm", training_forward(False)),
    Case("bn_train_fwd_nhwc", "batch_norm", training_forward(True)),
    Case("bn_train_bwd_nchw", "batch_norm", training_backward(False)),
    Case("bn_train_bwd_nhwc", "batch_norm", training_backward(True)),
    Case("bn_add_relu_fwd_nchw", "batch_norm", add_relu_forward(False)),
    Case("bn_add_relu_fwd_nhwc", "batch_norm", add_relu_forward(True)),
    Case("bn_add_relu_bwd_nchw", "batch_norm", add_relu_backward(False)),
    Case("bn_add_relu_bwd_nhwc", "batch_norm", add_relu_backward(True)),
]}
