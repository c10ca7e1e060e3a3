"""torch.autograd Functions over opendnn: the forward and the backward both run opendnn's kernels.

Each Function calls ``opendnn.functional`` in its forward, saves what its backward needs in
``ctx`` (the input, the statistics of a normalization, the output of a pooling or a softmax),
and computes its gradients with opendnn's own backward functions (``conv_backward_data``,
``layer_norm_backward``, ...), never with torch's autograd of torch operations. The only torch
operations used are data movement (views, reshapes, permutes, dtype casts). The backwards are
``once_differentiable``: a second derivative through them raises.

The lowercase functions below (``conv``, ``linear``, ``relu``, ...) are what modules call: they
apply torch's autocast policy (convolutions and products in the autocast dtype; on CUDA, softmax,
softplus and layer/group/RMS norm in float32), then the Function.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import forward_ad
from torch.autograd.function import once_differentiable

from opendnn import functional as normalization_functions  # layer, RMS, group, instance norm and LRN
from opendnn.core.default_handle import shared_handle
from opendnn.core.errors import BadParam, NotSupported
from opendnn.core.handle import Handle, MathType
from opendnn.families.batch_norm.functional import BatchNormState

# (the batch_norm, matmul and softmax modules' names are also their functions': import the functions by name)
from opendnn.families.batch_norm.functional import batch_norm as _batch_norm
from opendnn.families.batch_norm.functional import batch_norm_add_activation as _batch_norm_add_activation
from opendnn.families.batch_norm.functional import (
    batch_norm_add_activation_backward as _batch_norm_add_activation_backward,
)
from opendnn.families.convolution import functional as convolution_functions
from opendnn.families.matmul.functional import linear as _linear
from opendnn.families.matmul.functional import matmul as _matmul
from opendnn.families.pointwise import functional as elementwise_functions
from opendnn.families.pooling import functional as pooling_functions
from opendnn.families.softmax.functional import log_softmax as _log_softmax
from opendnn.families.softmax.functional import log_softmax_backward as _log_softmax_backward
from opendnn.families.softmax.functional import softmax as _softmax
from opendnn.families.softmax.functional import softmax_backward as _softmax_backward

IntOrTuple = int | Sequence[int]


# ---- autocast and gradients -----------------------------------------------------------------------

def _autocast(policy: str, *tensors: torch.Tensor | None) -> tuple[Any, ...]:  # (each a tensor or None, as given)
    """The tensors cast as torch's autocast would for an op of ``policy``: "lower" (convolutions and
    products, to the autocast dtype) or "float32" (softmax, layer/group/RMS norm, softplus: float32
    on CUDA, the input's dtype on the CPU, as torch's lists); unchanged outside autocast."""
    dtype = _autocast_dtype(policy, tensors[0] if tensors[0] is not None else next(t for t in tensors if t is not None))
    if dtype is None:
        return tensors
    return tuple(t if t is None or t.dtype == dtype or not t.is_floating_point() else t.to(dtype) for t in tensors)


def _autocast_dtype(policy: str, first: torch.Tensor) -> torch.dtype | None:
    """The dtype ``_autocast`` casts an op's floating tensors to when ``first`` is its first tensor;
    None when it casts nothing."""
    device = "cuda" if first.is_cuda else first.device.type  # (making a torch.device costs more than the flag)
    if not torch.is_autocast_enabled(device) or not first.is_floating_point():
        return None
    if policy == "float32" and device != "cuda":
        return None
    return torch.get_autocast_dtype(device) if policy == "lower" else torch.float32


class _Unrecorded:
    """The ctx of a forward that autograd does not record: what it saves for the backward is dropped."""

    def save_for_backward(self, *tensors: Any) -> None:
        pass


def _apply(function: type[torch.autograd.Function], *args: Any) -> Any:
    """``function.apply(*args)``, or its forward alone when autograd would record nothing (grad mode
    off, as in inference, or no tensor argument needing a gradient): the same result without the
    cost of an autograd node, whose context and saved tensors would be dropped unused."""
    if _recorded(args):
        return function.apply(*args)
    return function.forward(_Unrecorded(), *args)


def _recorded(args: tuple[Any, ...]) -> bool:
    """Whether autograd must see a call of these arguments: a tensor needing a gradient in grad
    mode, or a forward-mode AD level or functorch transform active (which go through ``apply``)."""
    if torch.is_grad_enabled():
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.requires_grad:
                return True
    return forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active()


def _product_handle(x: torch.Tensor, kind: str) -> Handle | None:
    """For float32 products on CUDA, a handle that allows TF32 when torch's switch for this kind of
    product does (``torch.backends.cudnn.allow_tf32`` for convolutions, on by default;
    ``torch.backends.cuda.matmul.allow_tf32`` for matrix products, off by default); else None, the
    default handle (strict float32)."""
    if x.dtype != torch.float32 or not x.is_cuda:
        return None
    allowed = torch.backends.cudnn.allow_tf32 if kind == "convolution" else torch.backends.cuda.matmul.allow_tf32
    return shared_handle(f"cuda:{x.device.index or 0}", MathType.TENSOR_OP) if allowed else None


def _dense(gradient: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """A gradient with real memory behind every element (``sum().backward()`` hands in stride-0
    expansions, which the GPU kernels would read as a poor layout), laid out as ``like`` when given
    (a tensor of the forward of the gradient's shape: its input or output), so that the backward's
    operands and results keep the forward's memory order (NHWC stays NHWC)."""
    if 0 not in gradient.stride():
        return gradient
    if like is not None and like.shape == gradient.shape:
        return torch.empty_like(like, dtype=gradient.dtype).copy_(gradient)
    return gradient.contiguous()


def _scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor on like's device (a fill kernel, not a host copy: CUDA graphs can capture it)."""
    return torch.full((), value, dtype=like.dtype, device=like.device)


def _sum_to(t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``t`` summed over the dims that broadcasting expanded from ``shape`` (opendnn's reduction)."""
    shape = tuple(shape)
    target = (1,) * (t.ndim - len(shape)) + shape
    summed = [k for k in range(t.ndim) if target[k] == 1 and t.shape[k] != 1]
    if not summed:
        return t.reshape(shape)
    kept = [k for k in range(t.ndim) if k not in summed]
    rows = math.prod(t.shape[k] for k in summed)
    moved = t.permute(*summed, *kept).reshape(rows, -1, 1)
    return convolution_functions.conv_backward_bias(moved).reshape(shape)


# ---- convolution --------------------------------------------------------------------------------

def symmetric_padding(padding: IntOrTuple | str, kernel: Sequence[int], dilation: IntOrTuple) -> tuple[int, ...]:
    """torch's padding ("valid", "same" or ints) as one symmetric int per spatial dim.

    Raises:
        NotSupported: "same" with an even dilated kernel extent pads one more after than before,
            which the backward-data kernels (symmetric padding) cannot undo.
    """
    spatial = len(kernel)
    dilations = (dilation,) * spatial if isinstance(dilation, int) else tuple(dilation)
    if padding == "valid":
        return (0,) * spatial
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
        if any(t % 2 for t in totals):
            raise NotSupported(f"padding='same' with kernel {tuple(kernel)} and dilation {dilations} pads "
                               "asymmetrically; the backward passes take symmetric padding")
        return tuple(t // 2 for t in totals)
    if isinstance(padding, str):
        raise BadParam(f"padding={padding!r} must be 'valid', 'same', an int or one int per spatial dim")
    return (padding,) * spatial if isinstance(padding, int) else tuple(padding)


class Convolution(torch.autograd.Function):
    """y = conv(x, weight) + bias in 1 to 3 spatial dims, with groups (torch's conv{1,2,3}d)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: IntOrTuple,
                padding: tuple[int, ...], dilation: IntOrTuple, groups: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        ctx.handle = _product_handle(x, "convolution")
        return convolution_functions.conv(x, weight, bias, stride, padding, dilation, groups, handle=ctx.handle)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dy = _dense(dy)
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = convolution_functions.conv_backward_data(dy, weight, x.shape, *ctx.geometry, handle=ctx.handle)
        if ctx.needs_input_grad[1]:
            dweight = convolution_functions.conv_backward_filter(x, dy, weight.shape, *ctx.geometry, handle=ctx.handle)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = convolution_functions.conv_backward_bias(dy)
        return dx, dweight, dbias, None, None, None, None


class ConvolutionTranspose(torch.autograd.Function):
    """y = conv_transpose(x, weight) + bias: the backward data of a convolution (torch's
    conv_transpose{1,2,3}d); its gradients are a convolution (dx) and a backward filter (dweight)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: IntOrTuple,
                padding: IntOrTuple, output_padding: IntOrTuple, groups: int, dilation: IntOrTuple) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.has_bias = bias is not None
        ctx.handle = _product_handle(x, "convolution")
        return convolution_functions.conv_transpose(x, weight, bias, stride, padding, output_padding, groups,
                                                    dilation, handle=ctx.handle)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dy = _dense(dy)
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = convolution_functions.conv(dy, weight, None, *ctx.geometry, handle=ctx.handle)
        if ctx.needs_input_grad[1]:
            dweight = convolution_functions.conv_backward_filter(dy, x, weight.shape, *ctx.geometry, handle=ctx.handle)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = convolution_functions.conv_backward_bias(dy)
        return dx, dweight, dbias, None, None, None, None, None


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: IntOrTuple = 1,
         padding: IntOrTuple | str = 0, dilation: IntOrTuple = 1, groups: int = 1) -> torch.Tensor:
    """torch.nn.functional.conv{1,2,3}d through opendnn, forward and backward."""
    x, weight, bias = _autocast("lower", x, weight, bias)
    pads = symmetric_padding(padding, weight.shape[2:], dilation)
    return _apply(Convolution, x, weight, bias, stride, pads, dilation, groups)


def conv_transpose(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: IntOrTuple = 1,
                   padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1,
                   dilation: IntOrTuple = 1) -> torch.Tensor:
    """torch.nn.functional.conv_transpose{1,2,3}d through opendnn, forward and backward."""
    x, weight, bias = _autocast("lower", x, weight, bias)
    return _apply(ConvolutionTranspose, x, weight, bias, stride, padding, output_padding, groups, dilation)


# ---- matrix products ------------------------------------------------------------------------------

class Linear(torch.autograd.Function):
    """y = x @ weight.T + bias (torch's linear); x has any number of leading dims."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.handle = _product_handle(x, "matmul")
        return _linear(x, weight, bias, handle=ctx.handle)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        dy = _dense(dy)
        rows = dy.reshape(-1, dy.shape[-1])
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            dx = _matmul(dy, weight, handle=ctx.handle)
        if ctx.needs_input_grad[1]:
            dweight = _matmul(rows.mT, x.reshape(-1, x.shape[-1]), handle=ctx.handle)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = _sum_to(rows, (dy.shape[-1],))
        return dx, dweight, dbias


class Matmul(torch.autograd.Function):
    """y = a @ b for a (..., M, K) and b (..., K, N), batch dims broadcast (torch.matmul of 2-D and up)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        ctx.handle = _product_handle(a, "matmul")
        return _matmul(a, b, handle=ctx.handle)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.saved_tensors
        dy = _dense(dy)
        da = _sum_to(_matmul(dy, b.mT, handle=ctx.handle), a.shape) if ctx.needs_input_grad[0] else None
        db = _sum_to(_matmul(a.mT, dy, handle=ctx.handle), b.shape) if ctx.needs_input_grad[1] else None
        return da, db


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """torch.nn.functional.linear through opendnn, forward and backward."""
    return _apply(Linear, *_autocast("lower", x, weight, bias))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul of two operands of 2 dims or more through opendnn, forward and backward."""
    if a.ndim < 2 or b.ndim < 2:
        raise NotSupported(f"matmul of a.ndim={a.ndim} and b.ndim={b.ndim}: both need 2 dims or more")
    return _apply(Matmul, *_autocast("lower", a, b))


# ---- activations ------------------------------------------------------------------------------------

def _hardtanh(x: Any, low: float, high: float) -> Any:
    """min(max(x, low), high) = clipped_relu(x - low, high - low) + low."""
    if low == 0:
        return elementwise_functions.clipped_relu(x, high)
    shift = _scalar(low, x)
    clipped = elementwise_functions.clipped_relu(elementwise_functions.sub(x, shift), high - low)
    return elementwise_functions.add(clipped, shift)


def _hardtanh_backward(dy: Any, x: Any, low: float, high: float) -> Any:
    if low == 0:
        return elementwise_functions.clipped_relu_backward(dy, x, high)
    shifted = elementwise_functions.sub(x, _scalar(low, x))
    return elementwise_functions.clipped_relu_backward(dy, shifted, high - low)


# name: (forward(x, *parameters), backward(dy, x, *parameters))
ACTIVATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "relu": (elementwise_functions.relu, elementwise_functions.relu_backward),
    "hardtanh": (_hardtanh, _hardtanh_backward),
    "gelu": (elementwise_functions.gelu, elementwise_functions.gelu_backward),
    "silu": (elementwise_functions.swish, elementwise_functions.swish_backward),
    "sigmoid": (elementwise_functions.sigmoid, elementwise_functions.sigmoid_backward),
    "tanh": (elementwise_functions.tanh, elementwise_functions.tanh_backward),
    "elu": (elementwise_functions.elu, elementwise_functions.elu_backward),
    "softplus": (elementwise_functions.softplus, elementwise_functions.softplus_backward),
}


class Activation(torch.autograd.Function):
    """y = f(x) for an activation of ``ACTIVATIONS``; dx = f'(x) dy by opendnn's ``<f>_backward``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str, parameters: tuple[Any, ...]) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.name, ctx.parameters = name, parameters
        return ACTIVATIONS[name][0](x, *parameters)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        return ACTIVATIONS[ctx.name][1](_dense(dy, x), x, *ctx.parameters), None, None


def relu(x: torch.Tensor) -> torch.Tensor:
    return _apply(Activation, x, "relu", ())


def hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    """min(max(x, min_val), max_val); relu6 is hardtanh(x, 0, 6) (opendnn's clipped relu)."""
    if not min_val < max_val:
        raise NotSupported(f"hardtanh min_val={min_val} must be below max_val={max_val}")
    return _apply(Activation, x, "hardtanh", (float(min_val), float(max_val)))


def relu6(x: torch.Tensor) -> torch.Tensor:
    return hardtanh(x, 0.0, 6.0)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return _apply(Activation, x, "gelu", (approximate,))


def silu(x: torch.Tensor) -> torch.Tensor:
    return _apply(Activation, x, "silu", (1.0,))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return _apply(Activation, x, "sigmoid", ())


def tanh(x: torch.Tensor) -> torch.Tensor:
    return _apply(Activation, x, "tanh", ())


def elu(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return _apply(Activation, x, "elu", (float(alpha),))


def softplus(x: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """log(1 + exp(beta * x)) / beta, with no linear regime (torch's threshold=20 changes the result
    by under exp(-20) relative)."""
    (x,) = _autocast("float32", x)
    return _apply(Activation, x, "softplus", (float(beta),))


# ---- layer, RMS, group and instance norm, LRN ---------------------------------------------------------

def _layer_norm(x: Any, weight: Any, bias: Any, shape: Sequence[int], eps: float) -> tuple[Any, ...]:
    return normalization_functions.layer_norm(x, shape, weight, bias, eps, return_stats=True)


def _layer_norm_backward(dy: Any, x: Any, weight: Any, stats: Sequence[Any], shape: Sequence[int],
                         eps: float) -> tuple[Any, ...]:
    mean, rstd = stats
    return normalization_functions.layer_norm_backward(dy, x, shape, weight, eps, mean=mean, rstd=rstd)


def _rms_norm(x: Any, weight: Any, bias: Any, shape: Sequence[int], eps: float | None) -> tuple[Any, ...]:
    return normalization_functions.rms_norm(x, shape, weight, eps, return_stats=True)


def _rms_norm_backward(dy: Any, x: Any, weight: Any, stats: Sequence[Any], shape: Sequence[int],
                       eps: float | None) -> tuple[Any, ...]:
    (rstd,) = stats
    dx, dweight = normalization_functions.rms_norm_backward(dy, x, shape, weight, eps, rstd=rstd)
    return dx, dweight, None


def _group_norm(x: Any, weight: Any, bias: Any, groups: int, eps: float) -> tuple[Any, ...]:
    return normalization_functions.group_norm(x, groups, weight, bias, eps, return_stats=True)


def _group_norm_backward(dy: Any, x: Any, weight: Any, stats: Sequence[Any], groups: int,
                         eps: float) -> tuple[Any, ...]:
    mean, rstd = stats
    return normalization_functions.group_norm_backward(dy, x, groups, weight, eps, mean=mean, rstd=rstd)


def _instance_norm(x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, ...]:
    return normalization_functions.instance_norm(x, weight, bias, eps, return_stats=True)


def _instance_norm_backward(dy: Any, x: Any, weight: Any, stats: Sequence[Any], eps: float) -> tuple[Any, ...]:
    mean, rstd = stats
    return normalization_functions.instance_norm_backward(dy, x, weight, eps, mean=mean, rstd=rstd)


# name: (forward(x, weight, bias, *config) -> (y, *stats), backward(dy, x, weight, stats, *config) -> (dx, dw, db))
NORMALIZATIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "layer_norm": (_layer_norm, _layer_norm_backward),
    "rms_norm": (_rms_norm, _rms_norm_backward),
    "group_norm": (_group_norm, _group_norm_backward),
    "instance_norm": (_instance_norm, _instance_norm_backward),
}


class Normalization(torch.autograd.Function):
    """y = normalize(x) * weight + bias for a norm of ``NORMALIZATIONS``; the forward's mean and
    inverse standard deviation are saved for the backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, name: str,
                config: tuple[Any, ...]) -> torch.Tensor:
        y, *stats = NORMALIZATIONS[name][0](x, weight, bias, *config)
        ctx.save_for_backward(x, weight, *stats)
        ctx.name, ctx.config = name, config
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, *stats = ctx.saved_tensors
        dx, dweight, dbias = NORMALIZATIONS[ctx.name][1](_dense(dy, x), x, weight, stats, *ctx.config)
        return (dx, dweight if ctx.needs_input_grad[1] else None, dbias if ctx.needs_input_grad[2] else None,
                None, None)


def layer_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    x, weight, bias = _autocast("float32", x, weight, bias)
    return _apply(Normalization, x, weight, bias, "layer_norm", (tuple(normalized_shape), eps))


def rms_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    x, weight = _autocast("float32", x, weight)
    return _apply(Normalization, x, weight, None, "rms_norm", (tuple(normalized_shape), eps))


def group_norm(x: torch.Tensor, num_groups: int, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    x, weight, bias = _autocast("float32", x, weight, bias)
    return _apply(Normalization, x, weight, bias, "group_norm", (num_groups, eps))


def instance_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                  eps: float = 1e-5) -> torch.Tensor:
    """Instance norm from the batch's own statistics (torch's InstanceNorm without running stats)."""
    return _apply(Normalization, x, weight, bias, "instance_norm", (eps,))


class LocalResponseNorm(torch.autograd.Function):
    """Cross-channel LRN (cuDNN's window, which is torch's for odd sizes)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, size: int, alpha: float, beta: float, k: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.parameters = (size, alpha, beta, k)
        return normalization_functions.local_response_norm(x, size, alpha, beta, k)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        dx = normalization_functions.local_response_norm_backward(_dense(dy, x), x, *ctx.parameters)
        return dx, None, None, None, None


def local_response_norm(x: torch.Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> torch.Tensor:
    """torch.nn.functional.local_response_norm for an odd ``size`` (an even one places the window
    one channel differently from torch's)."""
    if size % 2 == 0:
        raise NotSupported(f"local_response_norm size={size}: even sizes place the window differently from torch")
    return _apply(LocalResponseNorm, x, size, alpha, beta, k)


# ---- pooling ------------------------------------------------------------------------------------------

class MaxPool(torch.autograd.Function):
    """The largest element of each window; the backward recomputes the argmax from x and y
    (cuDNN's contract: no index tensor), first position on ties."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple | None, padding: IntOrTuple,
                ceil_mode: bool) -> torch.Tensor:
        y = pooling_functions.max_pool(x, kernel_size, stride, padding, ceil_mode=ceil_mode)
        ctx.save_for_backward(x, y)
        ctx.geometry = (kernel_size, stride, padding)
        ctx.ceil_mode = ceil_mode
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, y = ctx.saved_tensors
        dx = pooling_functions.max_pool_backward(_dense(dy, y), x, y, *ctx.geometry, ceil_mode=ctx.ceil_mode)
        return dx, None, None, None, None


class AvgPool(torch.autograd.Function):
    """The mean of each window over its size (count_include_pad) or its input positions."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple | None, padding: IntOrTuple,
                ceil_mode: bool, count_include_pad: bool) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.geometry = (kernel_size, stride, padding)
        ctx.options = {"ceil_mode": ceil_mode, "count_include_pad": count_include_pad}
        return pooling_functions.avg_pool(x, kernel_size, stride, padding, **ctx.options)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (x,) = ctx.saved_tensors
        dx = pooling_functions.avg_pool_backward(_dense(dy), x, *ctx.geometry, **ctx.options)
        return dx, None, None, None, None, None


class AdaptivePool(torch.autograd.Function):
    """torch's adaptive windows (output o pools [o * n // out, ceil((o + 1) * n / out))), max or average."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, output_size: tuple[int, ...], is_max: bool) -> torch.Tensor:
        ctx.is_max = is_max
        if is_max:
            y = pooling_functions.adaptive_max_pool(x, output_size)
            ctx.save_for_backward(x, y)
            return y
        ctx.save_for_backward(x)
        return pooling_functions.adaptive_avg_pool(x, output_size)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.is_max:
            x, y = ctx.saved_tensors
            return pooling_functions.adaptive_max_pool_backward(_dense(dy, y), x, y), None, None
        (x,) = ctx.saved_tensors
        return pooling_functions.adaptive_avg_pool_backward(_dense(dy), x), None, None


def max_pool(x: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple | None = None, padding: IntOrTuple = 0,
             ceil_mode: bool = False) -> torch.Tensor:
    """torch.nn.functional.max_pool{1,2,3}d without dilation or indices."""
    return _apply(MaxPool, x, kernel_size, stride or None, padding, ceil_mode)


def avg_pool(x: torch.Tensor, kernel_size: IntOrTuple, stride: IntOrTuple | None = None, padding: IntOrTuple = 0,
             ceil_mode: bool = False, count_include_pad: bool = True) -> torch.Tensor:
    """torch.nn.functional.avg_pool{1,2,3}d without divisor_override."""
    return _apply(AvgPool, x, kernel_size, stride or None, padding, ceil_mode, count_include_pad)


def adaptive_pool(x: torch.Tensor, output_size: IntOrTuple | None, is_max: bool = False) -> torch.Tensor:
    """torch.nn.functional.adaptive_{avg,max}_pool{1,2,3}d (an output size of None keeps the input's)."""
    spatial = x.shape[2:]
    sizes = (output_size,) * len(spatial) if isinstance(output_size, int) or output_size is None else output_size
    resolved = tuple(int(n if o is None else o) for o, n in zip(sizes, spatial))
    return _apply(AdaptivePool, x, resolved, is_max)


# ---- softmax --------------------------------------------------------------------------------------------

class Softmax(torch.autograd.Function):
    """softmax or log_softmax along one dim; the backward reads the saved output."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
        y = (_log_softmax if log else _softmax)(x, dim)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log = dim, log
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (y,) = ctx.saved_tensors
        backward = _log_softmax_backward if ctx.log else _softmax_backward
        return backward(y, _dense(dy, y), ctx.dim), None, None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    (x,) = _autocast("float32", x)
    return _apply(Softmax, x, dim, False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    (x,) = _autocast("float32", x)
    return _apply(Softmax, x, dim, True)


# ---- batch norm -----------------------------------------------------------------------------------------

def _per_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A (C,) tensor seen as (1, C, 1, ...) to broadcast against an input of ``ndim`` dims."""
    return t.reshape((1, -1) + (1,) * (ndim - 2))


def _channel_sums(t: Any) -> Any:
    """Sums over every dim but 1 (opendnn's reduction), as (C,)."""
    return convolution_functions.conv_backward_bias(t.reshape(t.shape[0], t.shape[1], -1))


def _frozen_batch_norm_backward(dy: Any, x: Any, weight: Any, mean: Any, var: Any, eps: float) -> tuple[Any, ...]:
    """(dx, dweight, dbias) of batch norm with fixed statistics (eval mode): y = xhat * w + b with
    xhat = (x - mean) * inv_std, so dx = dy * w * inv_std, dweight = sum(dy * xhat), dbias = sum(dy)."""
    inv_std = _per_channel(elementwise_functions.rsqrt(elementwise_functions.add(var, _scalar(eps, var))), x.ndim)
    scale = inv_std if weight is None else elementwise_functions.mul(_per_channel(weight, x.ndim), inv_std)
    dx = elementwise_functions.mul(dy, scale)
    xhat = elementwise_functions.mul(elementwise_functions.sub(x, _per_channel(mean, x.ndim)), inv_std)
    return dx, _channel_sums(elementwise_functions.mul(dy, xhat)), _channel_sums(dy)


class BatchNorm(torch.autograd.Function):
    """Batch norm per channel (dim 1). Training normalizes with the batch statistics, updates the
    running ones in place (momentum, unbiased variance) and saves the batch mean and inverse std
    for the backward; it may add a residual ``z`` and apply an activation after the norm,
    ``act(bn(x) + z)`` with relu or clipped relu (``coef``: the ceiling), in the same one call each
    way (cuDNN's BN_ADD_ACTIVATION / BN_ACTIVATION: the reserve space keeps the activation's mask).
    Evaluation normalizes with the running statistics (frozen: its backward treats them as
    constants), with no z and no activation."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, z: torch.Tensor | None, weight: torch.Tensor | None,
                bias: torch.Tensor | None, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                training: bool, momentum: float, eps: float, activation: str | None = None,
                coef: float = 0.0) -> torch.Tensor:
        ctx.eps, ctx.training, ctx.activation, ctx.coef, ctx.has_z = eps, training, activation, coef, z is not None
        if not training:
            ctx.save_for_backward(x, weight, running_mean, running_var)
            return _batch_norm(x, running_mean, running_var, weight, bias, False, momentum, eps)
        y, state = _batch_norm_add_activation(x, z, running_mean, running_var, weight, bias, True, momentum, eps,
                                              activation=activation, coef=coef, return_state=True)
        ctx.save_for_backward(x, weight, state.saved_mean, state.saved_inv_std)
        ctx.reserve = state.reserve
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, first, second = ctx.saved_tensors
        dy = _dense(dy, x)
        if ctx.training:
            dx, dz, dweight, dbias = _batch_norm_add_activation_backward(
                dy, x, weight, BatchNormState(first, second, ctx.reserve), ctx.eps, activation=ctx.activation,
                coef=ctx.coef, has_z=ctx.has_z)
        else:
            dz = None
            dx, dweight, dbias = _frozen_batch_norm_backward(dy, x, weight, first, second, ctx.eps)
        return (dx, dz, dweight if ctx.needs_input_grad[2] else None, dbias if ctx.needs_input_grad[3] else None,
                None, None, None, None, None, None, None)


def batch_norm(x: torch.Tensor, running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
               weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> torch.Tensor:
    """torch.nn.functional.batch_norm through opendnn (eps at least 1e-5, cuDNN's minimum)."""
    return _apply(BatchNorm, x, None, weight, bias, running_mean, running_var, training, momentum, eps)


def batch_norm_add_activation(x: torch.Tensor, z: torch.Tensor | None, running_mean: torch.Tensor | None,
                              running_var: torch.Tensor | None, weight: torch.Tensor | None,
                              bias: torch.Tensor | None, momentum: float, eps: float, activation: str | None,
                              coef: float = 0.0) -> torch.Tensor:
    """Training: ``act(batch_norm(x) + z)`` (z None: no add; activation "relu", "clipped_relu" or
    None), one opendnn call forward and one backward."""
    return _apply(BatchNorm, x, z, weight, bias, running_mean, running_var, True, momentum, eps, activation, coef)
