"""``enable()`` / ``disable()`` / ``with enabled():``: torch's own operators run on opendnn.

An unmodified model (torch's modules, ``F.conv2d``, ``torch.softmax``, ...) calls torch's ``aten``
operators. While opendnn is enabled, those of ``ROUTES`` (convolutions, linear and matmul, batch,
layer, group, RMS and instance norm, max and average pooling, softmax, the activations, scaled
dot-product attention: ``F.scaled_dot_product_attention`` and so ``nn.MultiheadAttention``) have a
kernel of opendnn's at the Autograd dispatch keys of CPU and CUDA tensors: a call opendnn covers
goes to the ``opendnn::`` operator (forward and backward on opendnn), any other goes on to torch's
own implementation (its decomposition, or its kernel below autograd when no gradient is needed).

    with opendnn.torch.enabled():
        y = torchvision_model(x)        # its convolutions, batch norms, ... run on opendnn

The registration is process-wide (torch's dispatcher has no per-thread kernels): ``enable()``
turns it on for every thread until ``disable()``; ``enabled()`` restores the state it found.
Operators torch calls from C++ (an LSTM's sigmoid) are routed too. A routed operator's gradient
node is opendnn's (``ConvolutionBackward``, where torch's is ``ConvolutionBackward0``).
docs/design/torch_integration.md compares this with a TorchDispatchMode (measured).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from opendnn.core.errors import NotSupported
from opendnn.families.batch_norm.problem import BN_MIN_EPSILON
from opendnn.torch import attention, functions
from opendnn.torch.library import carries_tangent, compute_dtype
from opendnn.torch.routing import all_float, require

Route = Callable[..., torch.Tensor]


def _floating(*values: Any) -> None:
    require(all_float(values), "a tensor argument that is not floating point")


def _batched(x: torch.Tensor, spatial: int, run: Callable[..., Any], *options: Any) -> Any:
    """``run(x, *options)``, or on x as a batch of one when x has no batch dim (torch's modules take both)."""
    require(x.ndim in (spatial + 1, spatial + 2), f"input of {x.ndim} dims")
    return functions.batch_of_one(x, spatial, run, *options)


def _conv(spatial: int) -> Route:
    def conv(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> torch.Tensor:
        _floating(input, weight, bias)
        return _batched(input, spatial, functions.conv, weight, bias, stride, padding, dilation, groups)

    return conv


def _conv_transpose(spatial: int) -> Route:
    def conv_transpose(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        dilation: Any = 1,
    ) -> torch.Tensor:
        _floating(input, weight, bias)
        options = (weight, bias, stride, padding, output_padding, groups, dilation)
        return _batched(input, spatial, functions.conv_transpose, *options)

    return conv_transpose


def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    _floating(input, weight, bias)
    return functions.linear(input, weight, bias)


def _matmul(input: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    _floating(input, other)
    require(input.ndim >= 2 and other.ndim >= 2, "an operand of fewer than 2 dims")
    return functions.matmul(input, other)


def _softmax(log: bool) -> Route:
    def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        x = input if dtype is None else input.to(dtype)
        _floating(x)
        return functions.log_softmax(x, dim) if log else functions.softmax(x, dim)

    return softmax


def _layer_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> torch.Tensor:
    _floating(input, weight, bias)
    return functions.layer_norm(input, normalized_shape, weight, bias, eps)


def _group_norm(
    input: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> torch.Tensor:
    _floating(input, weight, bias)
    return functions.group_norm(input, num_groups, weight, bias, eps)


def _rms_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None, eps: float | None = None
) -> torch.Tensor:
    _floating(input, weight)
    return functions.rms_norm(input, normalized_shape, weight, eps)


def _instance_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    use_input_stats: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> torch.Tensor:
    _floating(input, weight, bias)
    require(use_input_stats and running_mean is None and running_var is None, "running statistics")
    return functions.instance_norm(input, weight, bias, eps)


def _batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> torch.Tensor:
    _floating(input, weight, bias)
    require(eps >= BN_MIN_EPSILON, f"eps={eps} below {BN_MIN_EPSILON}")
    require(input.ndim >= 2, f"input of {input.ndim} dims")
    running = [t for t in (running_mean, running_var) if t is not None]
    require(training or len(running) == 2, "no running statistics in evaluation")
    require(
        all(t.dtype == compute_dtype(input.dtype) and t.is_contiguous() for t in running),
        "running statistics of another dtype than the compute dtype, or not contiguous",
    )
    return functions.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _max_pool(spatial: int, with_indices: bool) -> Route:
    pool = functions.max_pool_with_indices if with_indices else functions.max_pool

    def max_pool(
        input: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
    ) -> Any:
        _floating(input)
        return _batched(input, spatial, pool, kernel_size, stride, padding, dilation, ceil_mode)

    return max_pool


def _avg_pool(spatial: int) -> Route:
    def avg_pool(
        input: torch.Tensor,
        kernel_size: Any,
        stride: Any = (),
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> torch.Tensor:
        _floating(input)
        if divisor_override is None:
            options = (kernel_size, stride, padding, ceil_mode, count_include_pad)
            return _batched(input, spatial, functions.avg_pool, *options)
        # a window's sum is its mean over its positions inside the padded input times their count
        mean = _batched(input, spatial, functions.avg_pool, kernel_size, stride, padding, ceil_mode, True)
        counts = _window_counts(input.shape[-spatial:], mean.shape[-spatial:], kernel_size, stride, padding)
        return mean * (counts.to(mean.device, mean.dtype) / divisor_override)

    return avg_pool


def _window_counts(
    sizes: Sequence[int], pooled: Sequence[int], kernel_size: Any, stride: Any, padding: Any
) -> torch.Tensor:
    """Per output position (a tensor of the ``pooled`` sizes), the count of its window's positions
    inside the padded input: the kernel's, less where ceil_mode lets a last window run past it."""
    spatial = len(sizes)

    def per_dim(value: Any, default: list[int]) -> list[int]:
        values = [value] if isinstance(value, int) else list(value or ())
        return default if not values else values * spatial if len(values) == 1 else values

    kernel = per_dim(kernel_size, [])
    steps, pads = per_dim(stride, kernel), per_dim(padding, [0] * spatial)
    counts = torch.ones(())
    for n, out, k, s, p in zip(sizes, pooled, kernel, steps, pads):
        starts = torch.arange(out) * s - p
        counts = counts.unsqueeze(-1) * (torch.clamp(starts + k, max=n + p) - starts)
    return counts


def _adaptive_avg_pool(spatial: int) -> Route:
    def adaptive_avg_pool(input: torch.Tensor, output_size: Any) -> torch.Tensor:
        _floating(input)
        return _batched(input, spatial, functions.adaptive_pool, output_size)

    return adaptive_avg_pool


def _elementwise(forward: Callable[..., torch.Tensor]) -> Route:
    def activation(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        _floating(input)
        return forward(input, *args, **kwargs)

    return activation


def _hardtanh(input: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    if not min_val < max_val:  # a constant: torch's clamp gives it
        return torch.clamp(input, min_val, max_val)
    return functions.hardtanh(input, min_val, max_val)


def _elu(input: torch.Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> torch.Tensor:
    if scale == 1 and input_scale == 1:
        return functions.elu(input, alpha)
    # SELU and CELU: scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1)), in torch operations
    return scale * torch.where(input > 0, input, alpha * torch.expm1(input * input_scale))


def _scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    enable_gqa: bool = False,
) -> torch.Tensor:
    _floating(query, key, value)
    require(attn_mask is None or attn_mask.is_floating_point() or attn_mask.dtype == torch.bool, "an integer mask")
    require(not (is_causal and attn_mask is not None), "is_causal with an attn_mask (torch refuses it)")
    return attention.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _upsample(mode: str) -> Route:
    """aten's ``upsample_*.vec`` in ``mode`` (F.interpolate's calls): the output size or the scale
    factors, which also set the coordinates' scales; both only where they agree."""

    def upsample(input: torch.Tensor, output_size: Sequence[int] | None, *options: Any) -> torch.Tensor:
        *aligned, scale_factors = options
        _floating(input)
        if output_size is not None and scale_factors is not None:
            sizes = [math.floor(n * f) for n, f in zip(input.shape[2:], scale_factors)]
            require(sizes == list(output_size), "output_size and scale_factors that disagree")
            output_size = None
        return functions.interpolate(input, output_size, scale_factors, mode, aligned[0] if aligned else None)

    return upsample


# aten overload: how opendnn computes it (NotSupported: torch's implementation computes it)
ROUTES: dict[str, Route] = {
    "linear": _linear,
    "matmul": _matmul,
    "softmax.int": _softmax(False),
    "log_softmax.int": _softmax(True),
    "layer_norm": _layer_norm,
    "group_norm": _group_norm,
    "rms_norm": _rms_norm,
    "instance_norm": _instance_norm,
    "batch_norm": _batch_norm,
    "relu": _elementwise(functions.relu),
    "relu6": _elementwise(functions.relu6),
    "hardtanh": _elementwise(_hardtanh),
    "gelu": _elementwise(functions.gelu),
    "silu": _elementwise(functions.silu),
    "sigmoid": _elementwise(functions.sigmoid),
    "tanh": _elementwise(functions.tanh),
    "elu": _elementwise(_elu),
    "softplus": _elementwise(functions.softplus),
    "scaled_dot_product_attention": _scaled_dot_product_attention,
    "upsample_linear1d.vec": _upsample("linear"),
    "upsample_bilinear2d.vec": _upsample("bilinear"),
    "upsample_trilinear3d.vec": _upsample("trilinear"),
    "upsample_bicubic2d.vec": _upsample("bicubic"),
    "avg_pool1d": _avg_pool(1),
    "avg_pool2d": _avg_pool(2),
    "avg_pool3d": _avg_pool(3),
    "conv_transpose1d": _conv_transpose(1),
    "conv_transpose2d.input": _conv_transpose(2),
    "conv_transpose3d.input": _conv_transpose(3),
    **{
        f"{name}{spatial}d{overload}": make(spatial)
        for spatial in (1, 2, 3)
        for name, overload, make in (
            ("conv", "", _conv),
            ("conv", ".padding", _conv),
            ("max_pool", "", lambda spatial: _max_pool(spatial, False)),
            ("max_pool", "_with_indices", lambda spatial: _max_pool(spatial, True)),
            ("adaptive_avg_pool", "", _adaptive_avg_pool),
            ("upsample_nearest", ".vec", lambda spatial: _upsample("nearest")),
            ("_upsample_nearest_exact", ".vec", lambda spatial: _upsample("nearest-exact")),
        )
    },
}
AUTOGRAD_KEYS = ("AutogradCPU", "AutogradCUDA")
# torch.inference_mode() skips the Autograd keys: the operators torch decomposes (convolutions,
# linear, matmul, the norms, softmax, max and adaptive pooling) take opendnn's kernel at the device
# keys too; those with kernels of their own keep them there (their kernel is the fallback)
DEVICE_KEYS = ("CPU", "CUDA")


def _kernel(overload: torch._ops.OpOverload, route: Route) -> Callable[..., Any]:
    """opendnn's kernel for ``overload`` at the Autograd dispatch keys: the route, or torch's own
    implementation where the route refuses (NotSupported)."""
    below_autograd = torch._C._after_autograd_keyset
    composite = _composite(overload)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return route(*args, **kwargs)
        except NotSupported:
            if composite:  # torch's decomposition, whose operators are dispatched (and routed) in turn
                return overload.decompose(*args, **kwargs)
            if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
                raise  # (no route refuses a call that needs a gradient)
            if carries_tangent(args):
                raise  # (below autograd, torch's kernel would drop the tangent)
            return overload.redispatch(keyset & below_autograd, *args, **kwargs)  # torch's kernel, no gradient

    return kernel


def _composite(overload: torch._ops.OpOverload) -> bool:
    """Whether torch implements ``overload`` by decomposing it into other operators."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "CompositeImplicitAutograd")


class _Switch:
    """The registration while opendnn is enabled (torch's dispatcher is process-wide state)."""

    lock = threading.Lock()
    library: torch.library.Library | None = None


def enable() -> None:
    """Route torch's operators of ``ROUTES`` to opendnn, in every thread, until ``disable()``."""
    with _Switch.lock:
        if _Switch.library is not None:
            return
        library = torch.library.Library("aten", "IMPL")
        for name, route in ROUTES.items():
            base, _, overload_name = name.partition(".")
            overload = getattr(getattr(torch.ops.aten, base), overload_name or "default")
            kernel = _kernel(overload, route)
            for key in (*AUTOGRAD_KEYS, *(DEVICE_KEYS if _composite(overload) else ())):
                library.impl(name, kernel, key, with_keyset=True)
        _Switch.library = library


def disable() -> None:
    """Give torch's operators back their own kernels."""
    with _Switch.lock:
        if _Switch.library is not None:
            _Switch.library._destroy()
            _Switch.library = None


def is_enabled() -> bool:
    return _Switch.library is not None


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """``enable()`` for a ``with`` block; on leaving it, opendnn is enabled as it was before."""
    before = is_enabled()
    enable()
    try:
        yield
    finally:
        if not before:
            disable()
