"""``functional_calls()``: run torch's functional calls on opendnn inside a ``with`` block.

``convert`` swaps modules; the calls a model makes in its own forward (``torch.matmul`` and
``F.softmax`` in an attention block, ``F.adaptive_avg_pool2d`` in MobileNetV2) are not modules.
Within ``with opendnn.torch.functional_calls() as calls:``, those calls with an opendnn
equivalent go to ``opendnn.torch.functions`` (forward and backward on opendnn); the others, and
the routed ones whose options opendnn does not cover (``inplace=True``, adaptive max pooling's
``return_indices=True``, non-float tensors, unbatched inputs but to max pooling), run as torch's.
``calls.routed`` counts the calls routed per function, ``calls.left_to_torch`` says why the others
were not.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from opendnn.core.errors import NotSupported
from opendnn.families.batch_norm.problem import BN_MIN_EPSILON
from opendnn.torch import functions

_is_compiling = torch.compiler.is_compiling


def require(condition: bool, reason: str) -> None:
    if not condition:
        raise NotSupported(reason)


def _batched(x: torch.Tensor, spatial: int) -> None:
    require(x.ndim == spatial + 2, f"input of {x.ndim} dims (opendnn takes a batch dim here)")


def _matmul(input: torch.Tensor, other: torch.Tensor, *, out: Any = None) -> torch.Tensor:
    require(out is None, "out= given")
    return functions.matmul(input, other)


def _conv(spatial: int) -> Callable[..., torch.Tensor]:
    def conv(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> torch.Tensor:
        _batched(input, spatial)
        return functions.conv(input, weight, bias, stride, padding, dilation, groups)

    return conv


def _conv_transpose(spatial: int) -> Callable[..., torch.Tensor]:
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
        _batched(input, spatial)
        return functions.conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation)

    return conv_transpose


def _elementwise(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """An activation taking torch's ``inplace`` flag (in-place updates stay torch's)."""

    def activation(input: torch.Tensor, *args: Any, inplace: bool = False, **kwargs: Any) -> torch.Tensor:
        require(not inplace, "inplace=True")
        return forward(input, *args, **kwargs)

    return activation


def _softmax(log: bool) -> Callable[..., torch.Tensor]:
    def softmax(
        input: torch.Tensor, dim: int | None = None, _stacklevel: int = 3, dtype: torch.dtype | None = None
    ) -> torch.Tensor:
        if dim is None:
            raise NotSupported("dim=None (implicit dim)")
        x = input if dtype is None else input.to(dtype)
        return functions.log_softmax(x, dim) if log else functions.softmax(x, dim)

    return softmax


def _batch_norm(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    require(eps >= BN_MIN_EPSILON, f"eps={eps} below {BN_MIN_EPSILON}")
    return functions.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _instance_norm(
    input: torch.Tensor,
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    require(use_input_stats and running_mean is None and running_var is None, "running statistics")
    require(functions.values_per_set(input, None) > 1, "one value per instance (torch's call refuses it)")
    return functions.instance_norm(input, weight, bias, eps)


def _group_norm(
    input: torch.Tensor, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5
) -> torch.Tensor:
    require(functions.values_per_set(input, num_groups) > 1, "one value per group (torch's call refuses it)")
    return functions.group_norm(input, num_groups, weight, bias, eps)


def _max_pool(spatial: int, with_indices: bool) -> Callable[..., Any]:
    """F.max_pool{spatial}d (return_indices=False), or F.max_pool{spatial}d_with_indices, which
    F.max_pool{spatial}d calls for return_indices=True."""
    pool = functions.max_pool_with_indices if with_indices else functions.max_pool

    def max_pool(
        input: torch.Tensor,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
        return_indices: bool = with_indices,
    ) -> Any:
        require(input.ndim in (spatial + 1, spatial + 2), f"input of {input.ndim} dims")
        return functions.batch_of_one(input, spatial, pool, kernel_size, stride, padding, dilation, ceil_mode)

    return max_pool


def _avg_pool(spatial: int) -> Callable[..., torch.Tensor]:
    def avg_pool(
        input: torch.Tensor,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> torch.Tensor:
        _batched(input, spatial)
        require(divisor_override is None, "divisor_override")
        return functions.avg_pool(input, kernel_size, stride, padding, ceil_mode, count_include_pad)

    return avg_pool


def _adaptive_pool(spatial: int, is_max: bool) -> Callable[..., torch.Tensor]:
    def adaptive_pool(input: torch.Tensor, output_size: Any, return_indices: bool = False) -> torch.Tensor:
        _batched(input, spatial)
        require(not return_indices, "return_indices=True")
        refusal = functions.adaptive_output_refusal(output_size, spatial)
        require(refusal is None, str(refusal))  # torch's own call then raises torch's error
        return functions.adaptive_pool(input, output_size, is_max)

    return adaptive_pool


def _interpolate(
    input: torch.Tensor,
    size: Any = None,
    scale_factor: Any = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> torch.Tensor:
    require(mode in functions.INTERPOLATION_MODES, f"mode={mode!r}")
    require(not antialias, "antialias=True")
    require(3 <= input.ndim <= 5, f"input of {input.ndim} dims (opendnn takes N, C and 1 to 3 spatial dims)")
    return functions.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor)


def _local_response_norm(
    input: torch.Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0
) -> torch.Tensor:
    require(size % 2 == 1, f"size={size} is even")
    return functions.local_response_norm(input, size, alpha, beta, k)


def _routes() -> dict[Callable[..., Any], Callable[..., torch.Tensor]]:
    relu, sigmoid, tanh = _elementwise(functions.relu), _elementwise(functions.sigmoid), _elementwise(functions.tanh)
    softmax, log_softmax = _softmax(False), _softmax(True)
    routes: dict[Callable[..., Any], Callable[..., torch.Tensor]] = {
        torch.matmul: _matmul,
        torch.Tensor.matmul: _matmul,
        torch.Tensor.__matmul__: _matmul,
        torch.bmm: _matmul,
        F.linear: functions.linear,
        F.relu: relu,
        torch.relu: relu,
        torch.Tensor.relu: relu,
        F.relu6: _elementwise(functions.relu6),
        F.hardtanh: _elementwise(functions.hardtanh),
        F.elu: _elementwise(functions.elu),
        F.silu: _elementwise(functions.silu),
        F.gelu: functions.gelu,
        torch.sigmoid: sigmoid,
        torch.Tensor.sigmoid: sigmoid,
        torch.tanh: tanh,
        torch.Tensor.tanh: tanh,
        F.softplus: functions.softplus,
        F.softmax: softmax,
        torch.softmax: softmax,
        torch.Tensor.softmax: softmax,
        F.log_softmax: log_softmax,
        torch.log_softmax: log_softmax,
        torch.Tensor.log_softmax: log_softmax,
        F.layer_norm: functions.layer_norm,
        F.rms_norm: functions.rms_norm,
        F.group_norm: _group_norm,
        F.batch_norm: _batch_norm,
        F.instance_norm: _instance_norm,
        F.local_response_norm: _local_response_norm,
        F.interpolate: _interpolate,
    }
    for spatial in (1, 2, 3):
        routes[getattr(F, f"conv{spatial}d")] = _conv(spatial)
        routes[getattr(F, f"conv_transpose{spatial}d")] = _conv_transpose(spatial)
        routes[getattr(F, f"max_pool{spatial}d")] = _max_pool(spatial, False)
        routes[getattr(F, f"max_pool{spatial}d_with_indices")] = _max_pool(spatial, True)
        routes[getattr(F, f"avg_pool{spatial}d")] = _avg_pool(spatial)
        routes[getattr(F, f"adaptive_avg_pool{spatial}d")] = _adaptive_pool(spatial, False)
        routes[getattr(F, f"adaptive_max_pool{spatial}d")] = _adaptive_pool(spatial, True)
    return routes


def all_float(values: Iterable[Any]) -> bool:
    """Whether ``values`` hold a tensor and every tensor among them is of a floating dtype."""
    tensors = 0
    for value in values:  # (a loop: a generator or a list costs more than the test, per call)
        if isinstance(value, torch.Tensor):
            if not value.is_floating_point():
                return False
            tensors += 1
    return tensors > 0


class functional_calls(TorchFunctionMode):  # noqa: N801 (used as a context manager, like torch.no_grad)
    """A context in which torch's functional calls with an opendnn equivalent run on opendnn.

    Attributes:
        routed: calls routed to opendnn, counted per torch function name (eager calls: a call
            inside a torch.compile'd function is routed and not counted).
        left_to_torch: for each torch function with an opendnn route that ran as torch's, why
            (the last reason seen).
    """

    def __init__(self) -> None:
        super().__init__()
        # torch function: (its route, its name)
        self.routes = {func: (route, getattr(func, "__name__", str(func))) for func, route in _routes().items()}
        self.routed: Counter[str] = Counter()
        self.left_to_torch: dict[str, str] = {}

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        routed = self.routes.get(func)
        if routed is None:
            return func(*args, **(kwargs or {}))
        route, name = routed
        kwargs = kwargs or {}
        if not all_float(itertools.chain(args, kwargs.values()) if kwargs else args):
            self.left_to_torch[name] = "a tensor argument that is not floating point"
            return func(*args, **kwargs)
        try:
            result = route(*args, **kwargs)
        except NotSupported as reason:
            self.left_to_torch[name] = str(reason)
            return func(*args, **kwargs)
        if not _is_compiling():  # (a count torch.compile traced would be a guard failing every call)
            self.routed[name] += 1
        return result
