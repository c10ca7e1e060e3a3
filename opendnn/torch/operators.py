"""The ``opendnn::`` operators of convolution, matrix products, activations, softmax, pooling and
the fused inference chains (``opendnn.torch.normalization`` has the normalizations'): with them,
every opendnn operation that opendnn.torch sends work to.

Each family declares its operators with ``library.define`` (schema, kernel, fake kernel, autocast
rule) and, for the differentiable ones, its gradient with ``library.register_autograd``. The
kernels call ``opendnn.functional``; the backward formulas call the backward operators, never
torch's autograd of torch operations (views, reshapes and dtype casts aside). The backward
operators have no gradient of their own: a second derivative raises.

    torch.ops.opendnn.convolution(x, weight, bias, stride, padding, dilation, groups)

Every list argument is one int per spatial dim, already resolved (``opendnn.torch.functions``
takes torch's forms: an int, "same", None). Outputs that follow an input keep its memory order
(NHWC in, NHWC out), as opendnn lays them out; statistics and products are packed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

import opendnn.functional as F
from opendnn import BadParam, MathType
from opendnn.core.arrays import packed_descriptor
from opendnn.core.default_handle import shared_handle
from opendnn.core.dtypes import DataType
from opendnn.families.pooling.problem import output_size
from opendnn.torch.library import (
    Operator,
    as_torch_error,
    define,
    empty_in_order,
    empty_in_order_of,
    empty_packed,
    float32_on_cuda,
    lower_precision,
    memory_order,
    register_autograd,
)

Tensor = torch.Tensor


def _product_handle(x: Tensor, kind: str) -> Any:
    """For float32 products on CUDA, a handle that allows TF32 when torch's switch for this kind of
    product does (``torch.backends.cudnn.allow_tf32`` for convolutions, on by default;
    ``torch.backends.cuda.matmul.allow_tf32`` for matrix products, off by default); else None, the
    default handle (strict float32)."""
    if x.dtype != torch.float32 or not x.is_cuda:
        return None
    allowed = torch.backends.cudnn.allow_tf32 if kind == "convolution" else torch.backends.cuda.matmul.allow_tf32
    return shared_handle(f"cuda:{x.device.index or 0}", MathType.TENSOR_OP) if allowed else None


def _convolution_handle(first: Tensor, *args: Any) -> Any:
    """The convolution operators' handle rule (``define``'s ``handle``): their kernels' handle."""
    return _product_handle(first, "convolution")


def _matmul_handle(first: Tensor, *args: Any) -> Any:
    """The matrix product operators' handle rule (``define``'s ``handle``): their kernels' handle."""
    return _product_handle(first, "matmul")


def dense(gradient: Tensor, like: Tensor | None = None) -> Tensor:
    """A gradient with real memory behind every element (``sum().backward()`` hands in stride-0
    expansions, which the GPU kernels would read as a poor layout), laid out as ``like`` when given
    (a tensor of the forward: of the gradient's shape, or a channels-last one of its rank), so that
    the backward keeps the forward's memory order (NHWC stays NHWC, and so does dx that follows dy)."""
    if 0 not in gradient.stride():
        return gradient
    if (
        like is not None
        and like.ndim == 4 == gradient.ndim
        and not like.is_contiguous()  # (one channel or one pixel: both orders; the plain one is kept)
        and like.is_contiguous(memory_format=torch.channels_last)
    ):
        return gradient.clone(memory_format=torch.channels_last)  # (one copy, not two calls)
    if like is not None and like.shape == gradient.shape:
        return torch.empty_like(like, dtype=gradient.dtype).copy_(gradient)
    return gradient.contiguous()


def given(ctx: Any, position: int, gradient: Tensor) -> Tensor | None:
    """A gradient the backward computes anyway, passed on where its input needs it."""
    return gradient if ctx.needs_input_grad[position] else None


def _needed(ctx: Any, position: int, gradient: Callable[[], Any]) -> Any:
    return gradient() if ctx.needs_input_grad[position] else None


def register_gradient_of_input(
    op: Operator, backward_op: Operator, saved: tuple[str, ...] = ("input",), dense_gradient: bool = False
) -> None:
    """The gradient of an operator of one differentiable input (its first) and options (pooling
    windows, an activation's name): ``backward_op(dy, *saved, *options)``, where ``saved`` names
    what the forward keeps ("input", "output"). The activations' and pooling's backward kernels
    read dy through its strides and lay dx out as x: dy reaches them as it comes (a stride-0
    expansion from ``sum().backward()`` too, no copy). ``dense_gradient``: dy is made ``dense`` in
    the forward's order first (softmax's dx follows dy; local response norm's vector kernel reads
    dy's channels as contiguous)."""

    keeps_input, keeps_output = "input" in saved, "output" in saved
    assert saved in (("input",), ("output",), ("input", "output")), saved

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        # (branches, not a mapping and a generator: this runs in every forward that needs a gradient)
        if keeps_input and keeps_output:
            ctx.save_for_backward(inputs[0], output)
        else:
            ctx.save_for_backward(inputs[0] if keeps_input else output)
        ctx.options = inputs[1:]

    # the options' gradients (every call passes all of the schema's arguments: none has a default)
    none_for_options = (None,) * (len(op.overload._schema.arguments) - 1)

    def backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
        tensors = ctx.saved_tensors
        if dense_gradient:
            dy = dense(dy, tensors[-1])
        return (backward_op.after(ctx.source, dy, (dy, *tensors, *ctx.options)), *none_for_options)

    register_autograd(op, backward, setup_context)


# ---- convolution ------------------------------------------------------------------------------------


def convolution_shape(
    x: Tensor, weight: Tensor, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
) -> list[Any]:
    spatial = [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    ]
    return [x.shape[0], weight.shape[0], *spatial]


def _transposed_shape(
    x: Tensor,
    weight: Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    output_padding: Sequence[int],
    groups: int,
    dilation: Sequence[int],
) -> list[Any]:
    spatial = [
        (n - 1) * s - 2 * p + d * (k - 1) + o + 1
        for n, k, s, p, o, d in zip(x.shape[2:], weight.shape[2:], stride, padding, output_padding, dilation)
    ]
    return [x.shape[0], weight.shape[1] * groups, *spatial]


def _bias_of_an_empty_sum(fake: Callable[..., Tensor], convolution: bool) -> Callable[..., Tensor]:
    """What a product (x, weight, bias, options...) gives for an x of no element, as torch: nothing
    for no sample, the bias (else 0) for no input channel or feature (an empty sum); a convolution's
    empty spatial dim torch refuses."""

    def empty(x: Tensor, weight: Tensor, bias: Tensor | None, *options: Any) -> Tensor:
        if convolution and 0 in x.shape[2:] and 0 not in x.shape[:2]:
            refusal = BadParam(
                f"x.shape={list(x.shape)}: an empty batch or channel dim is taken, an empty spatial dim not"
            )
            raise as_torch_error(refusal)
        y = fake(x, weight, bias, *options).zero_()
        if bias is None:
            return y
        return y.add_(bias.view(-1, *[1] * (y.ndim - 2)) if convolution else bias)

    return empty


def _convolution_fake(
    x: Tensor, weight: Tensor, bias: Tensor | None, stride: Sequence[int], padding: Sequence[int], *options: Any
) -> Tensor:
    dilation, _ = options
    return empty_in_order_of(x, convolution_shape(x, weight, stride, padding, dilation))


def _transposed_fake(x: Tensor, weight: Tensor, bias: Tensor | None, *options: Any) -> Tensor:
    return empty_in_order_of(x, _transposed_shape(x, weight, *options))


convolution = define(
    "convolution(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups)"
    " -> Tensor",
    lambda x, weight, bias, stride, padding, dilation, groups: F.conv(
        x,
        weight,
        bias,
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
        handle=_product_handle(x, "convolution"),
    ),
    _convolution_fake,
    autocast=lower_precision,
    handle=_convolution_handle,
    empty=_bias_of_an_empty_sum(_convolution_fake, convolution=True),
)

convolution_transpose = define(
    "convolution_transpose(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] output_padding,"
    " int groups, int[] dilation) -> Tensor",
    lambda x, weight, bias, stride, padding, output_padding, groups, dilation: F.conv_transpose(
        x,
        weight,
        bias,
        tuple(stride),
        tuple(padding),
        tuple(output_padding),
        groups,
        tuple(dilation),
        handle=_product_handle(x, "convolution"),
    ),
    _transposed_fake,
    autocast=lower_precision,
    handle=_convolution_handle,
    empty=_bias_of_an_empty_sum(_transposed_fake, convolution=True),
)


def _backward_data(
    dy: Tensor, weight: Tensor, x_shape: Sequence[int], stride: Any, padding: Any, dilation: Any, groups: int
) -> Tensor:
    """dx through opendnn, computed where it has elements: an x of no channel (whose dy is the bias
    alone, of elements) has a dx of none, which opendnn's descriptors cannot describe."""
    if 0 in x_shape:
        return empty_in_order_of(dy, x_shape)
    return F.conv_backward_data(
        dy,
        weight,
        tuple(x_shape),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
        handle=_product_handle(dy, "convolution"),
    )


def _backward_filter(
    x: Tensor, dy: Tensor, weight_shape: Sequence[int], stride: Any, padding: Any, dilation: Any, groups: int
) -> Tensor:
    """dweight through opendnn, computed where it has elements: a weight of no input channel has
    none (a transposed convolution's x of no channel is its backward filter's dy)."""
    if 0 in weight_shape:
        return empty_in_order_of(x, weight_shape)
    return F.conv_backward_filter(
        x,
        dy,
        tuple(weight_shape),
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        groups,
        handle=_product_handle(x, "convolution"),
    )


convolution_backward_data = define(
    "convolution_backward_data(Tensor dy, Tensor weight, SymInt[] x_shape, int[] stride, int[] padding,"
    " int[] dilation, int groups) -> Tensor",
    _backward_data,
    lambda dy, weight, x_shape, stride, padding, dilation, groups: empty_in_order_of(dy, x_shape),
    differentiable=False,
    handle=_convolution_handle,
)

convolution_backward_filter = define(
    "convolution_backward_filter(Tensor x, Tensor dy, SymInt[] weight_shape, int[] stride, int[] padding,"
    " int[] dilation, int groups) -> Tensor",
    _backward_filter,
    lambda x, dy, weight_shape, stride, padding, dilation, groups: empty_in_order_of(x, weight_shape),
    differentiable=False,
    handle=_convolution_handle,
)

convolution_backward_bias = define(
    "convolution_backward_bias(Tensor dy) -> Tensor",
    lambda dy: F.conv_backward_bias(dy),
    lambda dy: empty_packed(dy, [dy.shape[1]]),
    differentiable=False,
)


def _save_convolution(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias, *geometry = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry, ctx.has_bias = geometry, bias is not None


def _convolution_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    geometry, source, needed = ctx.geometry, ctx.source, ctx.needs_input_grad
    dy = dense(dy, x)
    return (
        convolution_backward_data.after(source, dy, (dy, weight, x.shape, *geometry)) if needed[0] else None,
        convolution_backward_filter.after(source, dy, (x, dy, weight.shape, *geometry)) if needed[1] else None,
        convolution_backward_bias.after(source, dy, (dy,)) if ctx.has_bias and needed[2] else None,
        None,
        None,
        None,
        None,
    )


def _save_transposed(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias, stride, padding, _, groups, dilation = inputs
    ctx.save_for_backward(x, weight)
    ctx.geometry, ctx.has_bias = (stride, padding, dilation, groups), bias is not None


def _transposed_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    """A transposed convolution's dx is a convolution of dy, its dweight a backward filter with
    the roles of x and dy swapped.

    An output_padding past the stride (below the dilation) leaves the convolution of dy more
    outputs than x has: x's gradient is their first ones (a window's start does not depend on the
    trailing padding), and the backward filter reads x followed by zeros up to their count."""
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.geometry
    dy = dense(dy)
    reach = [
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(dy.shape[2:], weight.shape[2:], stride, padding, dilation)
    ]
    surplus = [r - n for r, n in zip(reach, x.shape[2:])]
    convolved = x.shape[1] > 0  # an x of no channel has a dx of none: no weight's output channel convolves dy
    dx = _needed(
        ctx,
        0,
        lambda: convolution(dy, weight, None, stride, padding, dilation, groups) if convolved else x.new_empty(x.shape),
    )
    if dx is not None and any(surplus):
        dx = dx[(..., *(slice(0, n) for n in x.shape[2:]))]
    zeros = [count for extra in reversed(surplus) for count in (0, extra)]  # torch.nn.functional.pad's order
    return (
        dx,
        _needed(
            ctx,
            1,
            lambda: convolution_backward_filter(
                dy,
                torch.nn.functional.pad(x, zeros) if any(surplus) else x,
                weight.shape,
                stride,
                padding,
                dilation,
                groups,
            ),
        ),
        convolution_backward_bias(dy) if ctx.has_bias and ctx.needs_input_grad[2] else None,
        None,
        None,
        None,
        None,
        None,
    )


register_autograd(convolution, _convolution_backward, _save_convolution)
register_autograd(convolution_transpose, _transposed_backward, _save_transposed)


# ---- matrix products -----------------------------------------------------------------------------------


def _broadcast_product_shape(a: Tensor, b: Tensor) -> list[Any]:
    return [*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]]


def _linear_fake(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return empty_packed(x, [*x.shape[:-1], weight.shape[0]])


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if weight.shape[0] == 0:  # no output features: torch's empty result (opendnn's descriptors have no empty dims)
        return _linear_fake(x, weight, bias)
    return F.linear(x, weight, bias, handle=_product_handle(x, "matmul"))


linear = define(
    "linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor",
    _linear,
    _linear_fake,
    autocast=lower_precision,
    handle=_matmul_handle,
    empty=_bias_of_an_empty_sum(_linear_fake, convolution=False),
)


def _matmul_fake(a: Tensor, b: Tensor) -> Tensor:
    return empty_packed(a, _broadcast_product_shape(a, b))


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    if b.shape[-1] == 0:  # no output columns: torch's empty result
        return _matmul_fake(a, b)
    return F.matmul(a, b, handle=_product_handle(a, "matmul"))


matmul = define(
    "matmul(Tensor a, Tensor b) -> Tensor",
    _matmul,
    _matmul_fake,
    autocast=lower_precision,
    handle=_matmul_handle,
)


def _column_sums_fake(dy: Tensor) -> Tensor:
    return empty_packed(dy, [dy.shape[1]])


# The products' reductions of a gradient, as (rows, columns, 1) -> (columns,): one operator per
# product, so that a second derivative through one is refused naming the product the caller called
linear_backward_bias = define(
    "linear_backward_bias(Tensor dy) -> Tensor",
    lambda dy: F.conv_backward_bias(dy),
    _column_sums_fake,
    differentiable=False,
)
matmul_backward_sum = define(
    "matmul_backward_sum(Tensor dy) -> Tensor",
    lambda dy: F.conv_backward_bias(dy),
    _column_sums_fake,
    differentiable=False,
)


def sum_to(t: Tensor, shape: Sequence[Any], reduction: Operator) -> Tensor:
    """``t`` summed over the dims that broadcasting expanded from ``shape`` by ``reduction``
    (``linear_backward_bias`` or ``matmul_backward_sum``)."""
    target = (1,) * (t.ndim - len(shape)) + tuple(shape)
    summed = [k for k in range(t.ndim) if target[k] == 1 and t.shape[k] != 1]
    if not summed:
        return t.reshape(shape)
    kept = [k for k in range(t.ndim) if k not in summed]
    moved = t.permute(*summed, *kept).reshape(
        math.prod(t.shape[k] for k in summed), math.prod(t.shape[k] for k in kept), 1
    )
    return reduction(moved).reshape(shape)


def _save_linear(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    x, weight = ctx.saved_tensors
    source, needed = ctx.source, ctx.needs_input_grad
    dy = dense(dy)
    # (the rows of dy and x: the tensors themselves where they are rows already, a view costing 1 us)
    rows, x_rows = (dy, x) if dy.ndim == 2 else (dy.flatten(0, -2), x.flatten(0, -2))
    return (
        matmul.after(source, dy, (dy, weight)) if needed[0] else None,
        matmul.after(source, dy, (rows.mT, x_rows), part=1) if needed[1] else None,
        sum_to(rows, (dy.shape[-1],), linear_backward_bias) if ctx.has_bias and ctx.needs_input_grad[2] else None,
    )


def _save_operands(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def _matmul_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    dy = dense(dy)
    return (
        _needed(ctx, 0, lambda: sum_to(matmul(dy, b.mT), a.shape, matmul_backward_sum)),
        _needed(ctx, 1, lambda: sum_to(matmul(a.mT, dy), b.shape, matmul_backward_sum)),
    )


register_autograd(linear, _linear_backward, _save_linear)
register_autograd(matmul, _matmul_backward, _save_operands)


# ---- activations ---------------------------------------------------------------------------------------


def scalar(value: float, like: Tensor) -> Tensor:
    """A 0-d tensor on like's device (a fill kernel, not a host copy: CUDA graphs can capture it)."""
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _hardtanh(x: Tensor, low: float, high: float) -> Tensor:
    """min(max(x, low), high), exactly (clipped relu where low is 0); NaN stays NaN."""
    if low == 0:
        return F.clipped_relu(x, high, propagate_nan=True)
    return F.minimum(F.maximum(x, scalar(low, x)), scalar(high, x))


def _hardtanh_backward(dy: Tensor, x: Tensor, low: float, high: float) -> Tensor:
    """torch's hardtanh_backward: 0 where x <= low or x >= high, else dy (dy at a NaN x, 0 there
    for a NaN dy): clipped relu's torch rule where low is 0, one launch; else composed of four."""
    if low == 0:
        return F.clipped_relu_backward(dy, x, high, torch_rule=True)
    outside = F.logical_or(F.le(x, scalar(low, x)), F.ge(x, scalar(high, x)))
    return F.where(outside, scalar(0.0, dy), dy)


# name (torch's): (forward(x, *parameters), backward(dy, x, *parameters)). The forwards keep NaN as
# torch's do (relu's and clipped relu's PROPAGATE_NAN). The backwards are torch's formulas, NaN
# included: relu, hardtanh and elu pass dy where x is NaN (torch tests x <= 0, false for NaN), where
# the cuDNN-shaped activation backward and opendnn.functional's give 0 or NaN for relu and clipped
# relu (the NaN option) and NaN for elu; their ``torch_rule`` computes torch's in one launch
# (docs/design/torch_integration.md).
ACTIVATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "relu": (lambda x: F.relu(x, propagate_nan=True), lambda dy, x: F.relu_backward(dy, x, torch_rule=True)),
    "hardtanh": (_hardtanh, _hardtanh_backward),
    "gelu": (F.gelu, F.gelu_backward),
    "gelu_tanh": (lambda x: F.gelu(x, "tanh"), lambda dy, x: F.gelu_backward(dy, x, "tanh")),
    "silu": (F.swish, F.swish_backward),
    "sigmoid": (F.sigmoid, F.sigmoid_backward),
    "tanh": (F.tanh, F.tanh_backward),
    "elu": (F.elu, lambda dy, x, alpha: F.elu_backward(dy, x, alpha, torch_rule=True)),
    "softplus": (F.softplus, F.softplus_backward),
}


def _activation_autocast(device_type: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """torch's autocast runs softplus in float32 on CUDA and leaves the other activations alone."""
    return float32_on_cuda(device_type, args) if args[1] == "softplus" else None


activation = define(
    "activation(Tensor x, str name, float[] parameters) -> Tensor",
    lambda x, name, parameters: ACTIVATIONS[name][0](x, *parameters),
    lambda x, name, parameters: empty_in_order_of(x, x.shape),
    autocast=_activation_autocast,
)

activation_backward = define(
    "activation_backward(Tensor dy, Tensor x, str name, float[] parameters) -> Tensor",
    lambda dy, x, name, parameters: ACTIVATIONS[name][1](dy, x, *parameters),
    lambda dy, x, name, parameters: empty_in_order_of(dy, dy.shape),
    differentiable=False,
)


register_gradient_of_input(activation, activation_backward)


# ---- softmax --------------------------------------------------------------------------------------------


def _checked_dim(x: Tensor, dim: int) -> int:
    """``dim`` when x has it; else torch's IndexError (also opendnn's BadParam) naming it."""
    rank = max(x.ndim, 1)
    if not -rank <= dim < rank:
        raise as_torch_error(BadParam(f"dim={dim} must be in [{-rank}, {rank - 1}] for x of {x.ndim} dims"), IndexError)
    return dim


def _softmax_fake(x: Tensor, dim: int, log: bool) -> Tensor:
    _checked_dim(x, dim)
    return empty_in_order_of(x, x.shape)


softmax = define(
    "softmax(Tensor x, int dim, bool log) -> Tensor",
    lambda x, dim, log: (F.log_softmax if log else F.softmax)(x, _checked_dim(x, dim)),
    _softmax_fake,
    autocast=float32_on_cuda,
)

softmax_backward = define(
    "softmax_backward(Tensor dy, Tensor y, int dim, bool log) -> Tensor",
    lambda dy, y, dim, log: (F.log_softmax_grad if log else F.softmax_grad)(dy, y, dim),
    lambda dy, y, dim, log: empty_in_order_of(dy, dy.shape),
    differentiable=False,
)


register_gradient_of_input(softmax, softmax_backward, saved=("output",), dense_gradient=True)


# ---- pooling --------------------------------------------------------------------------------------------


def _pooled_shape(
    x: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    dilation: Sequence[int] | None = None,
) -> list[Any]:
    """The pooled dims, torch's: with ceil_mode a last window that would start in the padding is dropped."""
    spatial = zip(x.shape[2:], kernel_size, padding, stride, dilation or [1] * len(kernel_size))
    return [*x.shape[:2], *(output_size(n, k, p, s, ceil_mode, d) for n, k, p, s, d in spatial)]


def _pooling_autocast(device_type: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """torch's CPU autocast runs the 3-D poolings in float32 (not max pooling with indices); the
    others keep their dtype."""
    return torch.float32 if device_type == "cpu" and args[0].ndim == 5 else None


max_pool = define(
    "max_pool(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    lambda x, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool(
        x, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), ceil_mode=ceil_mode
    ),
    lambda x, kernel_size, stride, padding, dilation, ceil_mode: empty_in_order_of(
        x, _pooled_shape(x, kernel_size, stride, padding, ceil_mode, dilation)
    ),
    autocast=_pooling_autocast,
)

max_pool_backward = define(
    "max_pool_backward(Tensor dy, Tensor x, Tensor y, int[] kernel_size, int[] stride, int[] padding,"
    " int[] dilation, bool ceil_mode) -> Tensor",
    lambda dy, x, y, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool_backward(
        dy, x, y, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), ceil_mode=ceil_mode
    ),
    lambda dy, x, y, kernel_size, stride, padding, dilation, ceil_mode: empty_in_order_of(x, x.shape),
    differentiable=False,
)

max_pool_with_indices = define(
    "max_pool_with_indices(Tensor x, int[] kernel_size, int[] stride, int[] padding, int[] dilation,"
    " bool ceil_mode) -> (Tensor, Tensor)",
    lambda x, kernel_size, stride, padding, dilation, ceil_mode: F.max_pool(
        x, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), ceil_mode, return_indices=True
    ),
    lambda x, kernel_size, stride, padding, dilation, ceil_mode: (
        empty_in_order_of(x, _pooled_shape(x, kernel_size, stride, padding, ceil_mode, dilation)),
        empty_in_order_of(x, _pooled_shape(x, kernel_size, stride, padding, ceil_mode, dilation), torch.int64),
    ),
)


def _indexed_gradient(
    dy: Tensor,
    x: Tensor,
    indices: Tensor,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> Tensor:
    """dx of max pooling with indices (torch's max_pool2d_with_indices_backward): each dy added at the
    input position its index names. The pooling backward puts each dy at the first position of its
    window whose x equals y; given, for x, every position's own flat index and, for y, the indices, the
    one position that matches is the indexed one. The indices are exact in float32 up to planes of
    2**24 positions (float64 past them and for float64 tensors); dx sums in that dtype."""
    plane = math.prod(x.shape[2:])
    exact = torch.float64 if x.dtype == torch.float64 or plane > 2**24 else torch.float32
    positions = empty_in_order_of(x, x.shape, exact).copy_(
        torch.arange(plane, dtype=exact, device=x.device).view(1, 1, *x.shape[2:]).expand(x.shape)
    )
    dx = F.max_pool_backward(
        dy.to(exact), positions, indices.to(exact), kernel_size, stride, padding, dilation, ceil_mode=ceil_mode
    )
    return dx.to(x.dtype)


max_pool_indices_backward = define(
    "max_pool_indices_backward(Tensor dy, Tensor x, Tensor indices, int[] kernel_size, int[] stride,"
    " int[] padding, int[] dilation, bool ceil_mode) -> Tensor",
    lambda dy, x, indices, kernel_size, stride, padding, dilation, ceil_mode: _indexed_gradient(
        dy, x, indices, tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation), ceil_mode
    ),
    lambda dy, x, indices, kernel_size, stride, padding, dilation, ceil_mode: empty_in_order_of(x, x.shape),
    differentiable=False,
)


avg_pool = define(
    "avg_pool(Tensor x, int[] kernel_size, int[] stride, int[] padding, bool ceil_mode, bool count_include_pad)"
    " -> Tensor",
    lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad: F.avg_pool(
        x, tuple(kernel_size), tuple(stride), tuple(padding), ceil_mode=ceil_mode, count_include_pad=count_include_pad
    ),
    lambda x, kernel_size, stride, padding, ceil_mode, count_include_pad: empty_in_order_of(
        x, _pooled_shape(x, kernel_size, stride, padding, ceil_mode)
    ),
    autocast=_pooling_autocast,
)

avg_pool_backward = define(
    "avg_pool_backward(Tensor dy, Tensor x, int[] kernel_size, int[] stride, int[] padding, bool ceil_mode,"
    " bool count_include_pad) -> Tensor",
    lambda dy, x, kernel_size, stride, padding, ceil_mode, count_include_pad: F.avg_pool_backward(
        dy,
        x,
        tuple(kernel_size),
        tuple(stride),
        tuple(padding),
        ceil_mode=ceil_mode,
        count_include_pad=count_include_pad,
    ),
    lambda dy, x, kernel_size, stride, padding, ceil_mode, count_include_pad: empty_in_order_of(x, x.shape),
    differentiable=False,
)


def _adaptive_pool_fake(x: Tensor, output_size: Sequence[int], is_max: bool) -> Tensor:
    return empty_in_order_of(x, [*x.shape[:2], *output_size])


def _adaptive_pool(x: Tensor, output_size: Sequence[int], is_max: bool) -> Tensor:
    if 0 in output_size:  # no output positions: torch's empty result (opendnn's descriptors have no empty dims)
        return _adaptive_pool_fake(x, output_size, is_max)
    return (F.adaptive_max_pool if is_max else F.adaptive_avg_pool)(x, tuple(output_size))


adaptive_pool = define(
    "adaptive_pool(Tensor x, int[] output_size, bool is_max) -> Tensor",
    _adaptive_pool,
    _adaptive_pool_fake,
    autocast=_pooling_autocast,
)

adaptive_pool_backward = define(  # (the output size is dy's; y, the forward's output, only for max pooling)
    "adaptive_pool_backward(Tensor dy, Tensor x, Tensor? y, int[] output_size, bool is_max) -> Tensor",
    lambda dy, x, y, output_size, is_max: (
        F.adaptive_max_pool_backward(dy, x, y) if is_max else F.adaptive_avg_pool_backward(dy, x)
    ),
    lambda dy, x, y, output_size, is_max: empty_in_order_of(x, x.shape),
    differentiable=False,
)


# max pooling's backward finds each window's largest element again from x and y (cuDNN's contract:
# no index tensor), the first on ties
register_gradient_of_input(max_pool, max_pool_backward, saved=("input", "output"))


def _save_indexed(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    _, indices = output
    ctx.mark_non_differentiable(indices)
    ctx.save_for_backward(inputs[0], indices)
    ctx.options = inputs[1:]


def _indexed_backward(ctx: Any, dy: Tensor, _: Any) -> tuple[Any, ...]:
    x, indices = ctx.saved_tensors
    dx = max_pool_indices_backward(dense(dy, indices), x, indices, *ctx.options)
    return (dx, *(None,) * len(ctx.options))


register_autograd(max_pool_with_indices, _indexed_backward, _save_indexed)
register_gradient_of_input(avg_pool, avg_pool_backward)


def _save_adaptive(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """x, and y where max pooling's backward finds the windows' largest elements again: the average's
    backward reads no y, so an in-place op on it (EfficientNet's dropout after its pooling) leaves
    the gradient valid, as torch's."""
    x, _, is_max = inputs
    if is_max:
        ctx.save_for_backward(x, output)
    else:
        ctx.save_for_backward(x)
    ctx.options = inputs[1:]


def _adaptive_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    x, *kept = ctx.saved_tensors
    y = kept[0] if kept else None
    return (adaptive_pool_backward.after(ctx.source, dy, (dy, x, y, *ctx.options)), None, None)


register_autograd(adaptive_pool, _adaptive_backward, _save_adaptive)


# ---- resampling -----------------------------------------------------------------------------------------


ALIGNING_MODES = frozenset({"linear", "bilinear", "trilinear", "bicubic"})  # the modes taking align_corners


def _interpolated(kernel: Callable[..., Any]) -> Callable[..., Any]:
    """The functional call ``kernel(*tensors, size or scale_factor, mode, align_corners)`` of an
    operator taking both (``scale_factor`` empty where the call gave a size): the factor, where
    given, also sets the coordinates' scales, as torch's."""

    def call(*arguments: Any) -> Any:
        *tensors, size, scale_factor, mode, align_corners = arguments
        geometry = {"scale_factor": tuple(scale_factor)} if scale_factor else {"size": tuple(size)}
        aligned = {"align_corners": align_corners} if mode in ALIGNING_MODES else {}
        return kernel(*tensors, mode=mode, **geometry, **aligned)

    return call


def _interpolate_fake(x: Tensor, size: Sequence[int], *options: Any) -> Tensor:
    return empty_in_order_of(x, [*x.shape[:2], *size])


def _interpolate(
    x: Tensor, size: Sequence[int], scale_factor: Sequence[float], mode: str, align_corners: bool
) -> Tensor:
    if mode == "area" and 0 in size:  # adaptive average pooling to no position: torch's empty result
        return _interpolate_fake(x, size)
    return _functional_forward(x, size, scale_factor, mode, align_corners)


_functional_forward = _interpolated(F.interpolate)
interpolate = define(
    "interpolate(Tensor x, int[] size, float[] scale_factor, str mode, bool align_corners) -> Tensor",
    _interpolate,
    _interpolate_fake,
)

_functional_backward = _interpolated(F.interpolate_backward)


def _interpolation_gradient(dy: Tensor, x_shape: Sequence[int], x_order: Sequence[int], *options: Any) -> Tensor:
    """dx of an input of ``x_shape`` laid out in ``x_order`` (its dims, outermost first), in dy's
    dtype: the input's descriptor stands for it (its values are never read)."""
    x_desc = packed_descriptor(DataType.of(dy.dtype), tuple(x_shape), tuple(x_order))
    return _functional_backward(dy, x_desc, *options)


# the backward takes the input's shape and memory order, as torch's upsample backward takes its size:
# the forward keeps no tensor of the input's size alive
interpolate_backward = define(
    "interpolate_backward(Tensor dy, SymInt[] x_shape, int[] x_order, int[] size, float[] scale_factor, str mode,"
    " bool align_corners) -> Tensor",
    _interpolation_gradient,
    lambda dy, x_shape, x_order, *options: empty_in_order(x_shape, x_order, dy),
    differentiable=False,
)


def _save_interpolated(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    """The input's shape and memory order, not the input: its gradient reads no value of it."""
    x = inputs[0]
    ctx.x_shape, ctx.x_order, ctx.options = x.shape, memory_order(x), inputs[1:]


def _interpolated_backward(ctx: Any, dy: Tensor) -> tuple[Any, ...]:
    arguments = (dy, ctx.x_shape, ctx.x_order, *ctx.options)
    return (interpolate_backward.after(ctx.source, dy, arguments), None, None, None, None)


register_autograd(interpolate, _interpolated_backward, _save_interpolated)

# ---- fused inference chains (opendnn.torch.fuse) -------------------------------------------------------

convolution_bias_activation = define(
    "convolution_bias_activation(Tensor x, Tensor weight, Tensor? bias, Tensor? z, str? activation, float coef,"
    " int[] stride, int[] padding, int[] dilation, int groups) -> Tensor",
    lambda x, weight, bias, z, activation, coef, stride, padding, dilation, groups: F.conv_bias_activation(
        x,
        weight,
        bias,
        z,
        activation,
        coef=coef,
        stride=tuple(stride),
        padding=tuple(padding),
        dilation=tuple(dilation),
        groups=groups,
        propagate_nan=True,  # torch's ReLU, ReLU6 and Hardtanh keep NaN
        handle=_product_handle(x, "convolution"),
    ),
    lambda x, weight, bias, z, activation, coef, stride, padding, dilation, groups: empty_in_order_of(
        x, convolution_shape(x, weight, stride, padding, dilation)
    ),
    differentiable=False,
    handle=_convolution_handle,
)

matmul_bias_activation = define(
    "matmul_bias_activation(Tensor a, Tensor b, Tensor? bias, Tensor? residual, str? activation, float coef) -> Tensor",
    lambda a, b, bias, residual, activation, coef: F.matmul(
        a, b, bias, activation, coef=coef, residual=residual, handle=_product_handle(a, "matmul")
    ),
    lambda a, b, bias, residual, activation, coef: empty_packed(a, _broadcast_product_shape(a, b)),
    differentiable=False,
    handle=_matmul_handle,
)


def _sum_fake(a: Tensor, b: Tensor) -> Tensor:
    """a + b broadcast and promoted as torch's; laid out as the operand of the result's shape."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    dtype = torch.result_type(a, b)
    like = next((t for t in (a, b) if t.shape == shape), None)
    return empty_packed(a, shape, dtype) if like is None else empty_in_order_of(like, shape, dtype)


add = define("add(Tensor a, Tensor b) -> Tensor", lambda a, b: F.add(a, b), _sum_fake, differentiable=False)
