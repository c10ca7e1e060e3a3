"""torch.nn modules whose forward and backward run on opendnn.

Each class subclasses torch's module of the same name and overrides ``forward`` only: the
constructor arguments, parameters, buffers and state-dict keys are torch's, so a torch state dict
loads unchanged and ``opendnn.torch.convert`` can swap a torch module's class in place. A module
whose options opendnn does not cover (``padding_mode="reflect"``, an adaptive max pooling's
``return_indices=True``, ...) says why in ``unsupported()``; its constructor raises NotSupported
with that reason.
"""

from __future__ import annotations

from typing import Any

import torch

from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.batch_norm.problem import BN_MIN_EPSILON
from opendnn.families.convolution.functional import transpose_post_padding
from opendnn.torch import functions
from opendnn.torch.library import as_torch_error


class OpendnnModule(torch.nn.Module):
    """What every opendnn module shares: the constructor refuses options opendnn does not cover."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reason = self.unsupported()
        if reason is not None:
            raise NotSupported(f"{type(self).__name__}: {reason}")

    def unsupported(self) -> str | None:
        """Why this module's options cannot run on opendnn, or None when they can."""
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # under a TorchFunctionMode (functional_calls around a converted model), every torch call of
        # opendnn's host path (views, data pointers, allocations: dozens a call) would pass through the
        # mode's Python handler: twice the host time of a call. opendnn's modules route nothing further.
        if torch._C._len_torch_function_stack():
            with torch._C.DisableTorchFunction():
                return torch.nn.Module.__call__(self, *args, **kwargs)
        # torch's, without a super() object per call; looked up per call: torch.fx's tracer replaces it
        return torch.nn.Module.__call__(self, *args, **kwargs)

    def _get_name(self) -> str:  # the name printed by repr(model): show which modules run on opendnn
        return f"opendnn.{type(self).__name__}"

    def __prepare_scriptable__(self) -> torch.nn.Module:
        # torch.jit.script asks every module before compiling its forward, which is Python here
        raise as_torch_error(
            NotSupported(
                f"torch.jit.script cannot compile {type(self).__name__}.forward (Python that calls the opendnn:: "
                "operators); torch.jit.trace, torch.compile and torch.export take opendnn modules"
            )
        )


# ---- convolution ----------------------------------------------------------------------------------


class _Convolution(OpendnnModule):
    spatial = 0
    # torch's attributes, set by the torch class this mixes into
    weight: torch.Tensor
    bias: torch.Tensor | None
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: str | tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    padding_mode: Any

    def unsupported(self) -> str | None:
        if self.padding_mode != "zeros":
            return f"padding_mode={self.padding_mode!r} (only 'zeros')"
        try:
            functions.symmetric_padding(self.padding, self.kernel_size, self.dilation)
        except NotSupported as error:
            return str(error)
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == self.spatial + 1:  # one sample (functions.batch_of_one, inline: every call asks)
            return self.forward(x.unsqueeze(0)).squeeze(0)
        return functions.conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_Convolution, torch.nn.Conv1d):
    spatial = 1


class Conv2d(_Convolution, torch.nn.Conv2d):
    spatial = 2


class Conv3d(_Convolution, torch.nn.Conv3d):
    spatial = 3


class _ConvolutionTranspose(OpendnnModule):
    spatial = 0
    # torch's attributes and method, from the torch class this mixes into
    weight: torch.Tensor
    bias: torch.Tensor | None
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: Any  # (a transposed convolution takes no string padding)
    dilation: tuple[int, ...]
    groups: int
    output_padding: tuple[int, ...]
    _output_padding: Any

    def unsupported(self) -> str | None:
        try:
            transpose_post_padding(self.padding, self.stride, self.output_padding)
        except NotSupported as error:
            return str(error)
        return None

    def forward(self, x: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        def run(batch: torch.Tensor) -> torch.Tensor:
            output_padding = self._output_padding(
                batch, output_size, self.stride, self.padding, self.kernel_size, self.spatial, self.dilation
            )
            return functions.conv_transpose(
                batch, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
            )

        return functions.batch_of_one(x, self.spatial, run)


class ConvTranspose1d(_ConvolutionTranspose, torch.nn.ConvTranspose1d):
    spatial = 1


class ConvTranspose2d(_ConvolutionTranspose, torch.nn.ConvTranspose2d):
    spatial = 2


class ConvTranspose3d(_ConvolutionTranspose, torch.nn.ConvTranspose3d):
    spatial = 3


class Linear(OpendnnModule, torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.linear(x, self.weight, self.bias)


# ---- normalization ----------------------------------------------------------------------------------


class _BatchNorm(OpendnnModule):
    # torch's attributes and method, from the torch class this mixes into
    weight: Any
    bias: Any
    running_mean: torch.Tensor | None
    running_var: torch.Tensor | None
    num_batches_tracked: torch.Tensor | None
    eps: float
    momentum: float | None
    track_running_stats: bool
    _check_input_dim: Any

    def unsupported(self) -> str | None:
        if not self.eps >= BN_MIN_EPSILON:
            return f"eps={self.eps} is below {BN_MIN_EPSILON} (cuDNN's minimum)"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        running_mean, running_var, use_batch_stats, factor = self._statistics()
        return functions.batch_norm(
            x, running_mean, running_var, self.weight, self.bias, use_batch_stats, factor, self.eps
        )

    def _statistics(self) -> tuple[torch.Tensor | None, torch.Tensor | None, bool, float | torch.Tensor]:
        """(running mean, running var, whether to normalize with the batch's statistics, the running
        statistics' update factor) of this call, as torch's batch norm decides them; counts the batch.
        Each buffer is read once (a buffer is found through ``Module.__getattr__``'s Python). With
        ``momentum=None`` (a cumulative average) the factor is 1 / the batches counted, a tensor on
        the count's device (``functions.batch_norm_add_activation``)."""
        running_mean, running_var = self.running_mean, self.running_var
        factor: float | torch.Tensor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            batches = self.num_batches_tracked
            if batches is not None:
                batches.add_(1)
                factor = batches.double().reciprocal() if self.momentum is None else self.momentum
        use_batch_stats = self.training or (running_mean is None and running_var is None)
        keep_running = not self.training or self.track_running_stats
        return (
            running_mean if keep_running else None,
            running_var if keep_running else None,
            use_batch_stats,
            factor,
        )


class BatchNorm1d(_BatchNorm, torch.nn.BatchNorm1d):
    pass


class BatchNorm2d(_BatchNorm, torch.nn.BatchNorm2d):
    pass


class BatchNorm3d(_BatchNorm, torch.nn.BatchNorm3d):
    pass


class LayerNorm(OpendnnModule, torch.nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(OpendnnModule, torch.nn.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.rms_norm(x, self.normalized_shape, self.weight, self.eps)


def _require_several_values(x: torch.Tensor, batched: torch.Tensor, num_groups: int | None) -> None:
    """Refuse, as torch's module does (ValueError), a normalization of one value per set of
    ``batched`` (x with its batch dim)."""
    if functions.values_per_set(batched, num_groups) == 1:
        each = "instance" if num_groups is None else "group"
        refusal = BadParam(f"x.shape={tuple(x.shape)} gives one value per {each}: more than 1 is needed")
        raise as_torch_error(refusal, ValueError)


class GroupNorm(OpendnnModule, torch.nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _require_several_values(x, x, self.num_groups)
        return functions.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class _InstanceNorm(OpendnnModule):
    # torch's attributes and method, from the torch class this mixes into
    weight: Any
    bias: Any
    eps: float
    track_running_stats: bool
    _get_no_batch_dim: Any

    def unsupported(self) -> str | None:
        if self.track_running_stats:
            return "track_running_stats=True (opendnn's instance norm keeps no running statistics)"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spatial = self._get_no_batch_dim() - 1
        _require_several_values(x, x.unsqueeze(0) if x.ndim == spatial + 1 else x, None)
        return functions.batch_of_one(x, spatial, functions.instance_norm, self.weight, self.bias, self.eps)


class InstanceNorm1d(_InstanceNorm, torch.nn.InstanceNorm1d):
    pass


class InstanceNorm2d(_InstanceNorm, torch.nn.InstanceNorm2d):
    pass


class InstanceNorm3d(_InstanceNorm, torch.nn.InstanceNorm3d):
    pass


class LocalResponseNorm(OpendnnModule, torch.nn.LocalResponseNorm):
    def unsupported(self) -> str | None:
        if self.size % 2 == 0:
            return f"size={self.size} is even: cuDNN's window sits one channel off torch's"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.local_response_norm(x, self.size, self.alpha, self.beta, self.k)


# ---- activations ------------------------------------------------------------------------------------


class ReLU(OpendnnModule, torch.nn.ReLU):
    """torch's ReLU; ``inplace`` is accepted and ignored (the result is a new tensor)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.relu(x)


class Hardtanh(OpendnnModule, torch.nn.Hardtanh):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.hardtanh(x, self.min_val, self.max_val)


class ReLU6(OpendnnModule, torch.nn.ReLU6):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.relu6(x)


class GELU(OpendnnModule, torch.nn.GELU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.gelu(x, self.approximate)


class SiLU(OpendnnModule, torch.nn.SiLU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.silu(x)


class Sigmoid(OpendnnModule, torch.nn.Sigmoid):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.sigmoid(x)


class Tanh(OpendnnModule, torch.nn.Tanh):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.tanh(x)


class ELU(OpendnnModule, torch.nn.ELU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.elu(x, self.alpha)


class Softplus(OpendnnModule, torch.nn.Softplus):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.softplus(x, self.beta, self.threshold)


# ---- pooling and softmax ------------------------------------------------------------------------------


class _MaxPool(OpendnnModule):
    spatial = 0
    # torch's attributes, from the torch class this mixes into
    kernel_size: Any
    stride: Any
    padding: Any
    dilation: Any
    ceil_mode: bool
    return_indices: bool

    def forward(self, x: torch.Tensor) -> Any:
        pool = functions.max_pool_with_indices if self.return_indices else functions.max_pool
        options = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        return functions.batch_of_one(x, self.spatial, pool, *options)


class MaxPool1d(_MaxPool, torch.nn.MaxPool1d):
    spatial = 1


class MaxPool2d(_MaxPool, torch.nn.MaxPool2d):
    spatial = 2


class MaxPool3d(_MaxPool, torch.nn.MaxPool3d):
    spatial = 3


class _AvgPool(OpendnnModule):
    spatial = 0
    # torch's attributes, from the torch class this mixes into
    kernel_size: Any
    stride: Any
    padding: Any
    ceil_mode: bool
    count_include_pad: bool

    def unsupported(self) -> str | None:
        if getattr(self, "divisor_override", None) is not None:
            return f"divisor_override={self.divisor_override}"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        options = (self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)
        return functions.batch_of_one(x, self.spatial, functions.avg_pool, *options)


class AvgPool1d(_AvgPool, torch.nn.AvgPool1d):
    spatial = 1


class AvgPool2d(_AvgPool, torch.nn.AvgPool2d):
    spatial = 2


class AvgPool3d(_AvgPool, torch.nn.AvgPool3d):
    spatial = 3


class _AdaptivePool(OpendnnModule):
    spatial = 0
    is_max = False
    output_size: Any  # torch's attribute, from the torch class this mixes into

    def unsupported(self) -> str | None:
        if getattr(self, "return_indices", False):
            return "return_indices=True (opendnn's adaptive max pooling keeps no index tensor)"
        one_dim = isinstance(self, (torch.nn.AdaptiveAvgPool1d, torch.nn.AdaptiveMaxPool1d))  # (a torch module)
        return functions.adaptive_output_refusal(self.output_size, 1 if one_dim else 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.batch_of_one(x, self.spatial, functions.adaptive_pool, self.output_size, self.is_max)


class AdaptiveAvgPool1d(_AdaptivePool, torch.nn.AdaptiveAvgPool1d):
    spatial = 1


class AdaptiveAvgPool2d(_AdaptivePool, torch.nn.AdaptiveAvgPool2d):
    spatial = 2


class AdaptiveAvgPool3d(_AdaptivePool, torch.nn.AdaptiveAvgPool3d):
    spatial = 3


class AdaptiveMaxPool1d(_AdaptivePool, torch.nn.AdaptiveMaxPool1d):
    spatial, is_max = 1, True


class AdaptiveMaxPool2d(_AdaptivePool, torch.nn.AdaptiveMaxPool2d):
    spatial, is_max = 2, True


class AdaptiveMaxPool3d(_AdaptivePool, torch.nn.AdaptiveMaxPool3d):
    spatial, is_max = 3, True


def _softmax_dim(dim: int | None, ndim: int) -> int:
    """torch's implicit softmax dim for dim=None (0 for 0-, 1- and 3-D inputs, else 1)."""
    if dim is not None:
        return dim
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(OpendnnModule, torch.nn.Softmax):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.softmax(x, _softmax_dim(self.dim, x.ndim))


class LogSoftmax(OpendnnModule, torch.nn.LogSoftmax):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.log_softmax(x, _softmax_dim(self.dim, x.ndim))


# ---- resampling -------------------------------------------------------------------------------------


class Upsample(OpendnnModule, torch.nn.Upsample):
    """torch.nn.Upsample (and its UpsamplingNearest2d and UpsamplingBilinear2d forms) on opendnn's
    interpolation: the nearest, nearest-exact and (bi/tri)linear modes."""

    def unsupported(self) -> str | None:
        if self.mode not in functions.INTERPOLATION_MODES:
            return f"mode={self.mode!r} (opendnn interpolates {sorted(functions.INTERPOLATION_MODES)})"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functions.interpolate(
            x, self.size, self.scale_factor, self.mode, self.align_corners, self.recompute_scale_factor
        )


class UpsamplingNearest2d(Upsample, torch.nn.UpsamplingNearest2d):
    pass


class UpsamplingBilinear2d(Upsample, torch.nn.UpsamplingBilinear2d):
    pass


# ---- timm's layers ----------------------------------------------------------------------------------
# Put in front of timm's classes by ``opendnn.torch.convert`` (its FOREIGN_CONVERSIONS finds them by
# module and name): each reads the attributes timm's constructor sets, and is no module on its own.

# the activation modules a training batch norm applies in its own call (its Ex form), as (name, coef)
BATCH_NORM_ACTIVATIONS: dict[type[torch.nn.Module], tuple[str, float]] = {
    torch.nn.ReLU: ("relu", 0.0),
    ReLU: ("relu", 0.0),
    torch.nn.ReLU6: ("clipped_relu", 6.0),
    ReLU6: ("clipped_relu", 6.0),
}


class TimmBatchNormAct2d(BatchNorm2d):
    """timm's BatchNormAct2d: ``act(drop(batch_norm(x)))``, its ``drop`` and ``act`` the modules it
    holds (which ``convert`` converts, or reports, on their own). Normalizing with the batch's
    statistics, a ReLU or ReLU6 after an Identity drop runs in the batch norm's call, forward and
    backward (cuDNN's BN_ACTIVATION)."""

    drop: torch.nn.Module
    act: torch.nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        running_mean, running_var, use_batch_stats, factor = self._statistics()
        act = self.act
        fused = BATCH_NORM_ACTIVATIONS.get(type(act)) if use_batch_stats else None
        drop = self.drop
        if fused is not None and type(drop) is torch.nn.Identity:
            return functions.batch_norm_add_activation(
                x, None, running_mean, running_var, self.weight, self.bias, factor, self.eps, *fused
            )
        y = functions.batch_norm(
            x, running_mean, running_var, self.weight, self.bias, use_batch_stats, factor, self.eps
        )
        return act(drop(y))


class _TimmNorm(OpendnnModule):
    """timm's norms compute torch's norm unless timm's fast-norm flag was set when they were built
    (``timm.layers.set_fast_norm``): then they normalize in the autocast dtype, or with apex's kernels."""

    def unsupported(self) -> str | None:
        if getattr(self, "_fast_norm", False):
            return "_fast_norm=True (timm's fast norm computes in the autocast dtype or with apex's kernels)"
        return None


class TimmLayerNorm(_TimmNorm, LayerNorm):
    pass


class TimmGroupNorm(_TimmNorm, GroupNorm):
    pass


class TimmLayerNorm2d(_TimmNorm, torch.nn.LayerNorm):
    """timm's LayerNorm2d: a layer norm over the channels of an (N, C, H, W) image, normalizing its
    (N, H, W, C) view as the trailing dim: no copy, the output in x's memory order (timm's comes out
    channels-last from torch's layer norm, whatever x's order)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = functions.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class TimmFastAdaptiveAvgPool(OpendnnModule):
    """timm's FastAdaptiveAvgPool: the mean over the spatial dims ``dim`` of its input format (NCHW,
    NHWC, NCL, NLC), kept as dims of size 1 or, with ``flatten``, dropped: opendnn's adaptive average
    pooling to size 1 of the (N, C, spatial...) view of x."""

    flatten: bool
    dim: tuple[int, ...]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spatial = self.dim
        if x.ndim != len(spatial) + 2:
            raise as_torch_error(
                BadParam(
                    f"x.shape={tuple(x.shape)} must have {len(spatial) + 2} dims: a batch, channels and the "
                    f"spatial dims {spatial} the input format names"
                )
            )
        channel = next(d for d in range(1, x.ndim) if d not in spatial)
        order = (0, channel, *spatial)
        pooled = functions.adaptive_pool(x.permute(order), 1)
        if self.flatten:
            return pooled.reshape(pooled.shape[:2])
        return pooled.permute(tuple(order.index(d) for d in range(x.ndim)))
