"""torch.nn.functional-like calls of the ``opendnn::`` operators: what opendnn's modules call.

Each function takes torch.nn.functional's arguments (an int or one int per spatial dim, "same"
padding, an output size with None, ...), resolves them and calls its operator (of
``opendnn.torch.operators`` or ``opendnn.torch.normalization``), which carries the rest: the
kernels, the gradient (computed by opendnn's backward operators), torch's autocast policy,
torch.compile / torch.export support.
The only torch operations here are data movement. An argument refused here raises opendnn's
error that is also torch's RuntimeError, as the operators' errors are.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opendnn.core.descriptors import check_finite
from opendnn.core.errors import BadParam, NotSupported
from opendnn.core.memo import memoized
from opendnn.families.resample import functional as resample
from opendnn.torch import normalization, operators
from opendnn.torch.library import as_torch_error

IntOrTuple = int | Sequence[int]


def _per_dim(name: str, value: IntOrTuple, spatial: int) -> tuple[int, ...]:
    """``value`` as one int per spatial dim."""
    values = (int(value),) * spatial if isinstance(value, int) else tuple(map(int, value))
    if len(values) != spatial:
        raise as_torch_error(BadParam(f"{name}={value} must be an int or {spatial} ints, one per spatial dim"))
    return values


# torch's argument forms (ints, tuples, lists, strings) resolved once per distinct form (a max pooling's
# window: 1.4 us resolved, 0.26 cached); aten's int[] arguments come as lists on every call
_resolved_once = functools.partial(memoized, lists_as_tuples=True)


def batch_of_one(x: torch.Tensor, spatial: int, run: Callable[..., Any], *options: Any) -> Any:
    """``run(x, *options)``, or, for an x without its batch dim (torch's modules and functions take
    one sample of ``spatial`` spatial dims so), ``run`` on x as a batch of one with the batch dim of
    each output removed."""
    if x.ndim != spatial + 1:
        return run(x, *options)
    outputs = run(x.unsqueeze(0), *options)
    return outputs.squeeze(0) if isinstance(outputs, torch.Tensor) else tuple(t.squeeze(0) for t in outputs)


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
            raise NotSupported(
                f"padding='same' with kernel {tuple(kernel)} and dilation {dilations} pads "
                "asymmetrically; the backward passes take symmetric padding"
            )
        return tuple(t // 2 for t in totals)
    if isinstance(padding, str):
        raise as_torch_error(
            BadParam(f"padding={padding!r} must be 'valid', 'same', an int or one int per spatial dim")
        )
    return (padding,) * spatial if isinstance(padding, int) else tuple(padding)


def conv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
) -> torch.Tensor:
    """torch.nn.functional.conv{1,2,3}d through opendnn, forward and backward."""
    steps, pads, dilations = _convolution_geometry(weight.shape[2:], stride, padding, dilation)
    return operators.convolution(x, weight, bias, steps, pads, dilations, groups)


@_resolved_once
def _convolution_geometry(
    kernel: Sequence[int], stride: IntOrTuple, padding: IntOrTuple | str, dilation: IntOrTuple
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(stride, padding, dilation) of a convolution of a ``kernel``-sized filter, one int per spatial dim."""
    spatial = len(kernel)
    pads = _per_dim("padding", symmetric_padding(padding, kernel, dilation), spatial)
    return _per_dim("stride", stride, spatial), pads, _per_dim("dilation", dilation, spatial)


def conv_transpose(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple = 0,
    output_padding: IntOrTuple = 0,
    groups: int = 1,
    dilation: IntOrTuple = 1,
) -> torch.Tensor:
    """torch.nn.functional.conv_transpose{1,2,3}d through opendnn, forward and backward."""
    spatial = weight.ndim - 2
    return operators.convolution_transpose(
        x,
        weight,
        bias,
        _per_dim("stride", stride, spatial),
        _per_dim("padding", padding, spatial),
        _per_dim("output_padding", output_padding, spatial),
        groups,
        _per_dim("dilation", dilation, spatial),
    )


# ---- matrix products ------------------------------------------------------------------------------


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """torch.nn.functional.linear through opendnn, forward and backward."""
    return operators.linear(x, weight, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul of two operands of 2 dims or more through opendnn, forward and backward."""
    if a.ndim < 2 or b.ndim < 2:
        raise NotSupported(f"matmul of a.ndim={a.ndim} and b.ndim={b.ndim}: both need 2 dims or more")
    return operators.matmul(a, b)


# ---- activations ------------------------------------------------------------------------------------


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0); NaN stays NaN, and the gradient is torch's: 0 where x <= 0, else dy (dy where x is
    NaN; opendnn.functional's relu_backward, cuDNN's, gives 0 or NaN there)."""
    return operators.activation(x, "relu", ())


def hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    """min(max(x, min_val), max_val), NaN kept; relu6 is hardtanh(x, 0, 6) (opendnn's clipped relu).
    The gradient is torch's: 0 where x <= min_val or x >= max_val, else dy (dy where x is NaN)."""
    if not min_val < max_val:
        raise NotSupported(f"hardtanh min_val={min_val} must be below max_val={max_val}")
    return operators.activation(x, "hardtanh", [float(min_val), float(max_val)])


def relu6(x: torch.Tensor) -> torch.Tensor:
    return hardtanh(x, 0.0, 6.0)


GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}  # torch's ``approximate`` -> the activation's name


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if approximate not in GELU_FORMS:
        raise as_torch_error(BadParam(f"approximate={approximate!r} must be 'none' or 'tanh'"))
    return operators.activation(x, GELU_FORMS[approximate], ())


def silu(x: torch.Tensor) -> torch.Tensor:
    return operators.activation(x, "silu", (1.0,))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return operators.activation(x, "sigmoid", ())


def tanh(x: torch.Tensor) -> torch.Tensor:
    return operators.activation(x, "tanh", ())


def elu(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """x if x > 0 else alpha * (exp(x) - 1); the gradient is torch's: dy where x is NaN."""
    return operators.activation(x, "elu", [float(alpha)])


def softplus(x: torch.Tensor, beta: float = 1.0, threshold: float = 20.0) -> torch.Tensor:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's linear regime)."""
    return operators.activation(x, "softplus", [float(beta), float(threshold)])


# ---- layer, RMS, group and instance norm, LRN ---------------------------------------------------------


def layer_norm(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    return normalization.layer_norm(x, list(normalized_shape), weight, bias, eps)[0]


def rms_norm(
    x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None, eps: float | None = None
) -> torch.Tensor:
    return normalization.rms_norm(x, list(normalized_shape), weight, eps)[0]


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    return normalization.group_norm(x, num_groups, weight, bias, eps)[0]


def instance_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    """Instance norm from the batch's own statistics (torch's InstanceNorm without running stats)."""
    return normalization.instance_norm(x, weight, bias, eps)[0]


def values_per_set(x: torch.Tensor, num_groups: int | None) -> int:
    """What torch.nn.functional's group norm (``num_groups``) and instance norm (None) count as the
    values normalized together before they run, and refuse when it is 1 (its ValueError "Expected
    more than 1 value per channel"): group norm's count takes the batch in, as torch's does."""
    spatial = math.prod(x.shape[2:])
    return spatial if num_groups is None else x.shape[0] * x.shape[1] // num_groups * spatial


def local_response_norm(
    x: torch.Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
) -> torch.Tensor:
    """torch.nn.functional.local_response_norm for an odd ``size`` (an even one places the window
    one channel differently from torch's)."""
    if size % 2 == 0:
        raise NotSupported(f"local_response_norm size={size}: even sizes place the window differently from torch")
    return normalization.local_response_norm(x, size, alpha, beta, k)


# ---- pooling ------------------------------------------------------------------------------------------


@_resolved_once
def _window(
    spatial: int, kernel_size: IntOrTuple, stride: IntOrTuple | None, padding: IntOrTuple
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(kernel, stride, padding), one int per spatial dim; the stride defaults (None or []) to the kernel.

    Raises:
        BadParam (also torch's RuntimeError): a padding over half the kernel size, which torch's max and
            average pooling refuse (dilated or not).
    """
    kernel = _per_dim("kernel_size", kernel_size, spatial)
    steps = kernel if stride is None or stride == [] or stride == () else _per_dim("stride", stride, spatial)
    pads = _per_dim("padding", padding, spatial)
    for k, (size, pad) in enumerate(zip(kernel, pads)):
        if pad > size // 2:
            raise as_torch_error(BadParam(f"padding[{k}]={pad} must be at most half of kernel_size[{k}]={size}"))
    return kernel, steps, pads


@_resolved_once
def max_pool_window(
    spatial: int,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(kernel, stride, padding, dilation) of a max pooling, one int per spatial dim (``_window``'s rules)."""
    kernel, steps, pads = _window(spatial, kernel_size, stride, padding)
    return kernel, steps, pads, _per_dim("dilation", dilation, spatial)


def max_pool(
    x: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
) -> torch.Tensor:
    """torch.nn.functional.max_pool{1,2,3}d (``return_indices=False``); NaN propagates, as torch's.

    The gradient goes to each window's first largest element (cuDNN's backward: found again from x
    and y), torch's index; in a window holding several NaNs, to the first NaN, where torch's goes to
    the last (``max_pool_with_indices`` follows torch there too).
    """
    return operators.max_pool(x, *max_pool_window(x.ndim - 2, kernel_size, stride, padding, dilation), ceil_mode)


def max_pool_with_indices(
    x: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    ceil_mode: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.functional.max_pool{1,2,3}d with ``return_indices=True``: (y, indices), the indices
    torch's (int64 flat positions in x's spatial plane: each window's first largest element, its last
    NaN where it holds one); the gradient goes to the indexed positions, as torch's."""
    window = max_pool_window(x.ndim - 2, kernel_size, stride, padding, dilation)
    return operators.max_pool_with_indices(x, *window, ceil_mode)


def avg_pool(
    x: torch.Tensor,
    kernel_size: IntOrTuple,
    stride: IntOrTuple | None = None,
    padding: IntOrTuple = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> torch.Tensor:
    """torch.nn.functional.avg_pool{1,2,3}d without divisor_override.

    Raises:
        BadParam (also torch's RuntimeError): a padding over half the kernel size, which torch refuses.
    """
    return operators.avg_pool(x, *_window(x.ndim - 2, kernel_size, stride, padding), ceil_mode, count_include_pad)


def adaptive_output_refusal(output_size: Any, spatial: int) -> str | None:
    """Why torch refuses ``output_size`` for ``spatial`` dims: None keeps an input size only as an
    element of a 2-D or 3-D output size. None where it takes it."""
    if output_size is None or (spatial == 1 and not isinstance(output_size, int) and None in output_size):
        return f"output_size={output_size!r}: None keeps an input size only as an element of a 2-D or 3-D output size"
    return None


def adaptive_pool(x: torch.Tensor, output_size: int | Sequence[int | None], is_max: bool = False) -> torch.Tensor:
    """torch.nn.functional.adaptive_{avg,max}_pool{1,2,3}d (an element None keeps the input's size).

    Raises:
        BadParam: an output size torch refuses (``adaptive_output_refusal``).
    """
    spatial = x.shape[2:]
    refusal = adaptive_output_refusal(output_size, len(spatial))
    if refusal is not None:
        raise BadParam(refusal)
    sizes = (output_size,) * len(spatial) if isinstance(output_size, int) else output_size
    resolved = [int(n if o is None else o) for o, n in zip(sizes, spatial)]
    return operators.adaptive_pool(x, resolved, is_max)


# ---- resampling ------------------------------------------------------------------------------------------


INTERPOLATION_MODES = frozenset(resample.MODES)  # torch's mode names opendnn computes


def interpolate(
    x: torch.Tensor,
    size: IntOrTuple | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> torch.Tensor:
    """torch.nn.functional.interpolate in its nearest, nearest-exact, (bi/tri)linear, bicubic and area
    modes, without antialiasing; the output size resolved here (``floor(in * scale_factor)``), the factor
    kept where it sets the coordinates' scales (not with ``recompute_scale_factor`` or aligned corners).

    Raises:
        BadParam (also torch's ValueError): align_corners given with a mode that has no corners to align
            (nearest, nearest-exact, area), as torch refuses it; a scale factor not finite, or giving a
            size past int64.
    """
    spatial = x.shape[2:]
    if (size is None) == (scale_factor is None):
        raise BadParam("give exactly one of size and scale_factor")
    if align_corners is not None and mode not in operators.ALIGNING_MODES:
        refusal = BadParam(
            f"align_corners={align_corners} with mode={mode!r}: only the linear modes and bicubic align corners"
        )
        raise as_torch_error(refusal, ValueError)
    if scale_factor is None:
        sizes = (size,) * len(spatial) if isinstance(size, int) else tuple(size or ())
        factors: list[float] = []
    else:
        given = scale_factor if isinstance(scale_factor, Sequence) else [scale_factor] * len(spatial)
        factors = [check_finite(f"scale_factor[{k}]", f) for k, f in enumerate(given)]
        sizes = tuple(math.floor(n * f) for n, f in zip(spatial, factors))
        for k, (f, s) in enumerate(zip(factors, sizes)):
            if s >= 2**63:
                raise BadParam(f"scale_factor[{k}]={f} gives {s} output positions, past int64 (torch's limit)")
        if recompute_scale_factor or align_corners:
            factors = []
    return operators.interpolate(x, [int(s) for s in sizes], factors, mode, bool(align_corners))


# ---- softmax --------------------------------------------------------------------------------------------


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return operators.softmax(x, dim, False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return operators.softmax(x, dim, True)


# ---- batch norm -----------------------------------------------------------------------------------------


def batch_norm(
    x: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float | torch.Tensor = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """torch.nn.functional.batch_norm through opendnn (eps at least 0, cuDNN's minimum); momentum
    as ``batch_norm_add_activation`` takes it."""
    if training:
        return batch_norm_add_activation(x, None, running_mean, running_var, weight, bias, momentum, eps, None)
    if running_mean is None or running_var is None:
        raise as_torch_error(BadParam("running_mean and running_var are needed when training=False"))
    return normalization.batch_norm_inference(x, weight, bias, running_mean, running_var, eps)


def batch_norm_add_activation(
    x: torch.Tensor,
    z: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    momentum: float | torch.Tensor,
    eps: float,
    activation: str | None,
    coef: float = 0.0,
) -> torch.Tensor:
    """Training: ``act(batch_norm(x) + z)`` (z None: no add; activation "relu", "clipped_relu" or
    None), one opendnn call forward and one backward. The running statistics are updated in place,
    as torch's are: by the kernels in a plain eager call, else copied back from the registered
    operator's functional results. A momentum given as a tensor (a batch norm with ``momentum=None``:
    1 / the batches counted, a new value each step) is applied after the call, from the batch's saved
    statistics, so that the call's signature stays that of momentum 0 and nothing waits for the
    device to read the count."""
    cumulative = isinstance(momentum, torch.Tensor)  # the running statistics are left out of the call
    kept_mean, kept_var = (None, None) if cumulative else (running_mean, running_var)
    y, saved_mean, saved_inv_std, _, mean, var = normalization.batch_norm_training(
        x,
        z,
        weight,
        bias,
        kept_mean,
        kept_var,
        0.0 if isinstance(momentum, torch.Tensor) else momentum,
        eps,
        activation,
        coef,
    )
    # the statistics passed come back updated (None: the eager kernel updated them in place); one left
    # out of the call (cumulative: updated below) comes back empty
    if kept_mean is not None and mean is not None:
        kept_mean.copy_(mean)
    if kept_var is not None and var is not None:
        kept_var.copy_(var)
    if cumulative and running_mean is not None and running_var is not None and x.numel():  # (empty: no change)
        count = x.numel() // x.shape[1]  # values a channel: the batch variance's unbiased form, as torch's
        batch_mean = saved_mean.reshape(running_mean.shape).to(running_mean.dtype)
        biased = (saved_inv_std.reshape(running_var.shape).double().pow(-2) - eps).clamp_min(0.0)  # (NaN stays)
        unbiased = biased * (count / max(count - 1, 1))
        # torch's update, (1 - factor) * running + factor * batch: an infinite batch statistic stays one
        running_mean.mul_(1 - momentum).add_(momentum * batch_mean)
        running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
    return y
