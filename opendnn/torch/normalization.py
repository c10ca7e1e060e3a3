"""The ``opendnn::`` operators of the normalizations: layer, RMS, group and instance norm, local
response norm and batch norm (training, with the running statistics returned for the caller to
copy back, and inference), each with its backward operator. ``opendnn.torch.operators`` says how
operators are declared and shaped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import opendnn.functional as F
from opendnn import (
    ActivationDescriptor,
    ActivationMode,
    BadParam,
    BatchNormMode,
    BatchNormOps,
    DataType,
    NanPropagation,
    TensorDescriptor,
    get_batch_normalization_training_ex_reserve_space_size,
)
from opendnn.core.default_handle import shared_handle
from opendnn.torch.library import (
    Operator,
    compute_dtype,
    define,
    empty_in_order_of,
    empty_packed,
    float32_on_cuda,
    local_response_norm_autocast,
    register_autograd,
)
from opendnn.torch.operators import dense, given, register_gradient_of_input, scalar

Tensor = torch.Tensor


# ---- layer, RMS, group and instance norm, LRN ---------------------------------------------------------


def _normalized(x: Tensor, stats_shape: Sequence[Any], stats: int) -> tuple[Tensor, ...]:
    """The fake outputs of a norm: y in x's memory order and ``stats`` packed statistics."""
    return (
        empty_in_order_of(x, x.shape),
        *(empty_packed(x, stats_shape, compute_dtype(x.dtype)) for _ in range(stats)),
    )


def _row_stats(x: Tensor, normalized_shape: Sequence[int]) -> list[Any]:
    """One statistic per row of the normalized trailing dims (layer and RMS norm)."""
    count = len(normalized_shape)
    return [*_checked_rows(x, normalized_shape).shape[: x.ndim - count], *(1,) * count]


def _checked_rows(x: Tensor, normalized_shape: Sequence[int]) -> Tensor:
    """x, when its trailing dims are ``normalized_shape``; else BadParam naming both."""
    count = len(normalized_shape)
    if count > x.ndim or list(x.shape[x.ndim - count :]) != list(normalized_shape):
        raise BadParam(
            f"normalized_shape={list(normalized_shape)} must equal the last {count} dims of x.shape={list(x.shape)}"
        )
    return x


def _group_stats(x: Tensor, groups: Any) -> list[Any]:
    """One statistic per sample and group of channels (group norm; instance norm: C groups)."""
    return [x.shape[0], groups, *(1,) * (x.ndim - 2)]


def _parameter_gradients(x: Tensor, weight: Tensor | None, shape: Sequence[Any], count: int) -> tuple[Tensor, ...]:
    """The fake (dx, dweight[, dbias]) of a norm's backward: dweight and dbias of weight's shape and
    dtype, or of torch's parameter shape in x's dtype without a weight."""
    like = weight if weight is not None else x
    return (
        empty_in_order_of(x, x.shape),
        *(empty_packed(like, like.shape if weight is not None else shape) for _ in range(count)),
    )


layer_norm = define(
    "layer_norm(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    lambda x, normalized_shape, weight, bias, eps: F.layer_norm(
        _checked_rows(x, normalized_shape), tuple(normalized_shape), weight, bias, eps, return_stats=True
    ),
    lambda x, normalized_shape, weight, bias, eps: _normalized(x, _row_stats(x, normalized_shape), 2),
    autocast=float32_on_cuda,
)

layer_norm_backward = define(
    "layer_norm_backward(Tensor dy, Tensor x, int[] normalized_shape, Tensor? weight, Tensor mean, Tensor rstd,"
    " float eps) -> (Tensor, Tensor, Tensor)",
    lambda dy, x, normalized_shape, weight, mean, rstd, eps: F.layer_norm_backward(
        dy, x, tuple(normalized_shape), weight, eps, mean=mean, rstd=rstd
    ),
    lambda dy, x, normalized_shape, weight, mean, rstd, eps: _parameter_gradients(x, weight, normalized_shape, 2),
    differentiable=False,
)

rms_norm = define(
    "rms_norm(Tensor x, int[] normalized_shape, Tensor? weight, float? eps) -> (Tensor, Tensor)",
    lambda x, normalized_shape, weight, eps: F.rms_norm(
        _checked_rows(x, normalized_shape), tuple(normalized_shape), weight, eps, return_stats=True
    ),
    lambda x, normalized_shape, weight, eps: _normalized(x, _row_stats(x, normalized_shape), 1),
    autocast=float32_on_cuda,
)

rms_norm_backward = define(
    "rms_norm_backward(Tensor dy, Tensor x, int[] normalized_shape, Tensor? weight, Tensor rstd, float? eps)"
    " -> (Tensor, Tensor)",
    lambda dy, x, normalized_shape, weight, rstd, eps: F.rms_norm_backward(
        dy, x, tuple(normalized_shape), weight, eps, rstd=rstd
    ),
    lambda dy, x, normalized_shape, weight, rstd, eps: _parameter_gradients(x, weight, normalized_shape, 1),
    differentiable=False,
)

group_norm = define(
    "group_norm(Tensor x, int groups, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    lambda x, groups, weight, bias, eps: F.group_norm(x, groups, weight, bias, eps, return_stats=True),
    lambda x, groups, weight, bias, eps: _normalized(x, _group_stats(x, groups), 2),
    autocast=float32_on_cuda,
)

group_norm_backward = define(
    "group_norm_backward(Tensor dy, Tensor x, int groups, Tensor? weight, Tensor mean, Tensor rstd, float eps)"
    " -> (Tensor, Tensor, Tensor)",
    lambda dy, x, groups, weight, mean, rstd, eps: F.group_norm_backward(
        dy, x, groups, weight, eps, mean=mean, rstd=rstd
    ),
    lambda dy, x, groups, weight, mean, rstd, eps: _parameter_gradients(x, weight, [x.shape[1]], 2),
    differentiable=False,
)

instance_norm = define(
    "instance_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)",
    lambda x, weight, bias, eps: F.instance_norm(x, weight, bias, eps, return_stats=True),
    lambda x, weight, bias, eps: _normalized(x, _group_stats(x, x.shape[1]), 2),
)

instance_norm_backward = define(
    "instance_norm_backward(Tensor dy, Tensor x, Tensor? weight, Tensor mean, Tensor rstd, float eps)"
    " -> (Tensor, Tensor, Tensor)",
    lambda dy, x, weight, mean, rstd, eps: F.instance_norm_backward(dy, x, weight, eps, mean=mean, rstd=rstd),
    lambda dy, x, weight, mean, rstd, eps: _parameter_gradients(x, weight, [x.shape[1]], 2),
    differentiable=False,
)


def _register_norm_gradient(op: Operator, backward_op: Operator, weight_at: int) -> None:
    """A norm's gradient: the forward keeps x, its weight (``inputs[weight_at]``, the bias after
    it) and its statistics (not differentiable); ``backward_op(dy, x, *inputs[1:weight_at], weight,
    *statistics, eps)`` gives dx and the parameters' gradients."""

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        _, *statistics = output
        ctx.mark_non_differentiable(*statistics)
        x = inputs[0]
        # an inference tensor cannot be saved: its copy is, for the weight's gradient (x needs none),
        # as torch's RMS norm, a composition of operations, saves none of x
        ctx.save_for_backward(x.clone() if x.is_inference() else x, inputs[weight_at], *statistics)
        ctx.configuration, ctx.eps, ctx.count = inputs[1:weight_at], inputs[-1], len(inputs)

    def backward(ctx: Any, dy: Tensor, *_: Any) -> tuple[Any, ...]:
        x, weight, *statistics = ctx.saved_tensors
        dx, *parameters = backward_op(dense(dy, x), x, *ctx.configuration, weight, *statistics, ctx.eps)
        gradients: list[Any] = [dx, *(None,) * (ctx.count - 1)]
        for k, gradient in enumerate(parameters):
            gradients[weight_at + k] = given(ctx, weight_at + k, gradient)
        return tuple(gradients)

    register_autograd(op, backward, setup_context)


_register_norm_gradient(layer_norm, layer_norm_backward, 2)
_register_norm_gradient(rms_norm, rms_norm_backward, 2)
_register_norm_gradient(group_norm, group_norm_backward, 2)
_register_norm_gradient(instance_norm, instance_norm_backward, 1)

local_response_norm = define(
    "local_response_norm(Tensor x, int size, float alpha, float beta, float k) -> Tensor",
    lambda x, size, alpha, beta, k: F.local_response_norm(x, size, alpha, beta, k),
    lambda x, size, alpha, beta, k: empty_in_order_of(x, x.shape),
    autocast=local_response_norm_autocast,
)

local_response_norm_backward = define(
    "local_response_norm_backward(Tensor dy, Tensor x, int size, float alpha, float beta, float k) -> Tensor",
    lambda dy, x, size, alpha, beta, k: F.local_response_norm_backward(dy, x, size, alpha, beta, k),
    lambda dy, x, size, alpha, beta, k: empty_in_order_of(x, x.shape),
    differentiable=False,
)


register_gradient_of_input(local_response_norm, local_response_norm_backward, dense_gradient=True)


# ---- batch norm -----------------------------------------------------------------------------------------


def _channel_shaped(x: Tensor) -> list[Any]:
    """(1, C, 1, ...): how opendnn keeps per-channel statistics of an input of x's rank."""
    return [1, x.shape[1], *(1,) * (x.ndim - 2)]


def _reserve_bytes(x: Tensor, has_z: bool, activation: str | None, coef: float) -> int:
    """The reserve space (the activation's mask) the training forward keeps for its backward, on
    the backend that runs x's device (a byte per element on NumPy, a bit on Triton)."""
    ops = (
        BatchNormOps.BN_ADD_ACTIVATION
        if has_z
        else BatchNormOps.BN
        if activation is None
        else BatchNormOps.BN_ACTIVATION
    )
    if ops is BatchNormOps.BN or x.numel() == 0:
        return 0
    device = "cpu" if x.device.type == "cpu" else f"{x.device.type}:{x.device.index or 0}"
    dims = tuple(int(d) for d in x.shape)
    return get_batch_normalization_training_ex_reserve_space_size(
        shared_handle(device),
        BatchNormMode.SPATIAL,
        ops,
        ActivationDescriptor(
            ActivationMode[(activation or "identity").upper()], NanPropagation.PROPAGATE_NAN, coef=coef or None
        ),
        TensorDescriptor(DataType.of(x.dtype), dims),
    )


def _batch_norm_training(
    x: Tensor,
    z: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    *options: Any,
) -> tuple[Tensor, ...]:
    """(y, saved mean, saved inverse std, reserve, new running mean, new running var): the eager
    kernel (``options``: momentum, eps, activation, coef) on copies of the running statistics (the
    operator is functional; the caller copies them back)."""
    mean, var = (None if t is None else t.clone() for t in (running_mean, running_var))
    y, saved_mean, saved_inv_std, reserve, _, _ = _batch_norm_training_in_place(x, z, weight, bias, mean, var, *options)
    none = x.new_empty(0, dtype=compute_dtype(x.dtype))
    if reserve is None:
        reserve = x.new_empty(0, dtype=torch.uint8)
    return y, saved_mean, saved_inv_std, reserve, none if mean is None else mean, none if var is None else var


def _batch_norm_training_in_place(
    x: Tensor,
    z: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: float,
    eps: float,
    activation: str | None,
    coef: float,
) -> tuple[Any, ...]:
    """The eager kernel: (y, saved mean, saved inverse std, reserve, None, None), the running
    statistics updated in place by the kernels (torch's batch norm updates its own in place), the
    reserve None where the call keeps none (no activation: an allocation a call less)."""
    y, state = F.batch_norm_add_activation(
        x,
        z,
        running_mean,
        running_var,
        weight,
        bias,
        True,
        momentum,
        eps,
        activation=activation,
        coef=coef,
        propagate_nan=True,  # torch's ReLU and Hardtanh keep NaN
        return_state=True,
    )
    return y, state.saved_mean, state.saved_inv_std, state.reserve, None, None


def _batch_norm_training_fake(
    x: Tensor,
    z: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    momentum: float,
    eps: float,
    activation: str | None,
    coef: float,
) -> tuple[Tensor, ...]:
    stats = compute_dtype(x.dtype)
    reserve = _reserve_bytes(x, z is not None, activation, coef)
    running = [empty_packed(x, [0], stats) if t is None else torch.empty_like(t) for t in (running_mean, running_var)]
    return (
        empty_in_order_of(x, x.shape),
        empty_packed(x, _channel_shaped(x), stats),
        empty_packed(x, _channel_shaped(x), stats),
        empty_packed(x, [reserve], torch.uint8),
        *running,
    )


def _batch_norm_training_empty(x: Tensor, *args: Any) -> tuple[Tensor, ...]:
    """An empty batch: empty y, zero statistics, the running statistics unchanged (torch's)."""
    y, mean, inv_std, reserve, running_mean, running_var = _batch_norm_training_fake(x, *args)
    given = args[3:5]
    running = [old.clone() if old is not None else new for old, new in zip(given, (running_mean, running_var))]
    return y, mean.zero_(), inv_std.zero_(), reserve, *running


def _batch_norm_training_in_place_empty(x: Tensor, *args: Any) -> tuple[Any, ...]:
    """An empty batch of the eager kernel: the running statistics stay as they are."""
    return (*_batch_norm_training_empty(x, *args)[:4], None, None)


# the registered operator is functional (torch.compile and torch.export take it so); a plain eager
# call updates the running statistics in place instead of copying them twice
batch_norm_training = define(
    "batch_norm_training(Tensor x, Tensor? z, Tensor? weight, Tensor? bias, Tensor? running_mean,"
    " Tensor? running_var, float momentum, float eps, str? activation, float coef)"
    " -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
    _batch_norm_training,
    _batch_norm_training_fake,
    empty=_batch_norm_training_empty,
    eager=(_batch_norm_training_in_place, _batch_norm_training_in_place_empty),
)


def _batch_norm_training_backward_in_eager(
    dy: Tensor,
    x: Tensor,
    weight: Tensor | None,
    saved_mean: Tensor,
    saved_inv_std: Tensor,
    reserve: Tensor | None,
    eps: float,
    activation: str | None,
    coef: float,
    has_z: bool,
) -> tuple[Tensor | None, ...]:
    """The eager kernel: (dx, dz, dweight, dbias), dz None without z (an allocation a call less)."""
    state = F.BatchNormState(saved_mean, saved_inv_std, reserve if reserve is not None and reserve.numel() else None)
    return F.batch_norm_add_activation_backward(  # (torch's relu and hardtanh gradient: dy at NaN)
        dy, x, weight, state, eps, activation=activation, coef=coef, torch_rule=True, has_z=has_z
    )


def _batch_norm_training_backward(dy: Tensor, x: Tensor, *args: Any) -> tuple[Tensor | None, ...]:
    """The operator's kernel: the eager kernel's, dz empty without z."""
    dx, dz, dweight, dbias = _batch_norm_training_backward_in_eager(dy, x, *args)
    return dx, x.new_empty(0) if dz is None else dz, dweight, dbias


batch_norm_training_backward = define(
    "batch_norm_training_backward(Tensor dy, Tensor x, Tensor? weight, Tensor saved_mean, Tensor saved_inv_std,"
    " Tensor? reserve, float eps, str? activation, float coef, bool has_z) -> (Tensor, Tensor, Tensor, Tensor)",
    _batch_norm_training_backward,
    lambda dy, x, weight, saved_mean, saved_inv_std, reserve, eps, activation, coef, has_z: (
        empty_in_order_of(x, x.shape),
        empty_in_order_of(x, x.shape) if has_z else empty_packed(x, [0]),
        empty_packed(x, [x.shape[1]], compute_dtype(x.dtype)),
        empty_packed(x, [x.shape[1]], compute_dtype(x.dtype)),
    ),
    differentiable=False,
    eager=(_batch_norm_training_backward_in_eager, None),
)


def _save_batch_norm_training(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, z, weight, _, _, _, _, eps, activation, coef = inputs
    y, saved_mean, saved_inv_std, reserve, mean, var = output
    if mean is None and var is None:  # (a plain eager call: the kernels updated the running statistics)
        ctx.mark_non_differentiable(saved_mean, saved_inv_std, *(() if reserve is None else (reserve,)))
    else:
        ctx.mark_non_differentiable(saved_mean, saved_inv_std, reserve, *(t for t in (mean, var) if t is not None))
    ctx.save_for_backward(x, weight, saved_mean, saved_inv_std, reserve)
    ctx.options = (eps, activation, coef, z is not None)


def _batch_norm_training_gradients(ctx: Any, dy: Tensor, *_: Any) -> tuple[Any, ...]:
    x, weight, saved_mean, saved_inv_std, reserve = ctx.saved_tensors
    dy = dense(dy, x)
    dx, dz, dweight, dbias = batch_norm_training_backward.after(
        ctx.source, dy, (dy, x, weight, saved_mean, saved_inv_std, reserve, *ctx.options)
    )
    return (
        dx,
        dz if ctx.options[-1] else None,
        given(ctx, 2, dweight),
        given(ctx, 3, dbias),
        None,
        None,
        None,
        None,
        None,
        None,
    )


register_autograd(batch_norm_training, _batch_norm_training_gradients, _save_batch_norm_training)


def _per_channel(t: Tensor, ndim: int) -> Tensor:
    """A (C,) tensor seen as (1, C, 1, ...) to broadcast against an input of ``ndim`` dims."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def _channel_sums(t: Tensor) -> Tensor:
    """Sums over every dim but 1 (opendnn's reduction), as (C,)."""
    return F.conv_backward_bias(t.reshape(t.shape[0], t.shape[1], -1))


def _frozen_batch_norm_backward(
    dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, var: Tensor, eps: float
) -> tuple[Tensor, ...]:
    """(dx, dweight, dbias) of batch norm with fixed statistics (eval mode): y = xhat * w + b with
    xhat = (x - mean) * inv_std, so dx = dy * w * inv_std, dweight = sum(dy * xhat), dbias = sum(dy)."""
    inv_std = _per_channel(F.rsqrt(F.add(var, scalar(eps, var))), x.ndim)
    scale = inv_std if weight is None else F.mul(_per_channel(weight, x.ndim), inv_std)
    xhat = F.mul(F.sub(x, _per_channel(mean, x.ndim)), inv_std)
    return F.mul(dy, scale), _channel_sums(F.mul(dy, xhat)), _channel_sums(dy)


batch_norm_inference = define(
    "batch_norm_inference(Tensor x, Tensor? weight, Tensor? bias, Tensor running_mean, Tensor running_var,"
    " float eps) -> Tensor",
    lambda x, weight, bias, running_mean, running_var, eps: F.batch_norm(
        x, running_mean, running_var, weight, bias, False, 0.0, eps
    ),
    lambda x, weight, bias, running_mean, running_var, eps: empty_in_order_of(x, x.shape),
)

batch_norm_inference_backward = define(
    "batch_norm_inference_backward(Tensor dy, Tensor x, Tensor? weight, Tensor running_mean, Tensor running_var,"
    " float eps) -> (Tensor, Tensor, Tensor)",
    _frozen_batch_norm_backward,
    lambda dy, x, weight, running_mean, running_var, eps: (
        empty_in_order_of(x, x.shape),
        *(empty_packed(x, [x.shape[1]], torch.promote_types(x.dtype, running_var.dtype)) for _ in range(2)),
    ),
    differentiable=False,
)


def _save_batch_norm_inference(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, _, running_mean, running_var, ctx.eps = inputs
    ctx.save_for_backward(x, weight, running_mean, running_var)


def _batch_norm_inference_gradients(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    x, weight, running_mean, running_var = ctx.saved_tensors
    dx, dweight, dbias = batch_norm_inference_backward(dense(dy, x), x, weight, running_mean, running_var, ctx.eps)
    return dx, given(ctx, 1, dweight), given(ctx, 2, dbias), None, None, None


register_autograd(batch_norm_inference, _batch_norm_inference_gradients, _save_batch_norm_inference)
