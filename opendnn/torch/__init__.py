"""opendnn inside PyTorch: operators, nn Modules, model conversion and fusion, and a switch for
torch's own operators.

``import opendnn.torch`` (importing ``opendnn`` alone never imports torch). The layers:

- ``opendnn.torch.operators`` / ``opendnn.torch.normalization`` / ``opendnn.torch.attention``:
  every opendnn operation as a
  PyTorch operator of the ``opendnn::`` namespace (``torch.ops.opendnn.convolution``, ...),
  declared through torch.library: a kernel for CPU and CUDA tensors, a fake kernel, a gradient
  computed by opendnn's backward operators, torch's autocast policy, a vmap rule. So
  torch.compile, torch.export, torch.func and torch.jit.trace take them like torch's own.
- ``opendnn.torch.functions``: torch.nn.functional-like calls of those operators (``conv``,
  ``linear``, ``softmax``, ...).
- ``opendnn.torch.modules``: subclasses of torch's nn modules (same constructor arguments,
  parameters, buffers and state-dict keys) that run on opendnn.
- ``convert(model)``: swaps a torch model's supported modules for opendnn's in place and reports
  what it converted and what it left to torch, and why.
- ``fuse(model)``: a traced copy of the model whose chains each run as one opendnn call: in eval
  mode ``convolution -> batch norm [-> + residual] [-> activation]`` and
  ``linear [-> activation] [-> + residual]``; in training mode
  ``batch norm [-> + residual] [-> ReLU / ReLU6]``.
- ``enable()`` / ``disable()`` / ``with enabled():``: torch's own aten operators (convolution,
  batch norm, pooling, softmax, norms, linear / matmul, activations, scaled dot-product
  attention) run on opendnn, for an
  unmodified model; ``functional_calls()``: the same for torch's Python functional calls in a
  ``with`` block, counting what it routed.
- ``warmup(model, example_input)``: compiles the kernels of a model's step in parallel processes
  before the step runs, into Triton's on-disk cache.

Tensors on the CPU run on opendnn's NumPy backend, CUDA tensors on its Triton kernels.
"""

from opendnn.torch import attention, functions, modules, normalization, operators
from opendnn.torch.ahead_of_time import WarmupReport, training_step, warmup
from opendnn.torch.aten import disable, enable, enabled, is_enabled
from opendnn.torch.convert import CONVERSIONS, ConversionReport, convert
from opendnn.torch.fuse import FusedConvolution, FusedLinear, fuse
from opendnn.torch.modules import (
    ELU,
    GELU,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
    GroupNorm,
    Hardtanh,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    Linear,
    LocalResponseNorm,
    LogSoftmax,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    OpendnnModule,
    ReLU,
    ReLU6,
    RMSNorm,
    Sigmoid,
    SiLU,
    Softmax,
    Softplus,
    Tanh,
)
from opendnn.torch.routing import functional_calls

__all__ = [
    "CONVERSIONS",
    "attention",
    "FusedConvolution",
    "FusedLinear",
    "fuse",
    "ELU",
    "GELU",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "ConversionReport",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "GroupNorm",
    "Hardtanh",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "LayerNorm",
    "Linear",
    "LocalResponseNorm",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "OpendnnModule",
    "RMSNorm",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softplus",
    "Tanh",
    "WarmupReport",
    "convert",
    "disable",
    "enable",
    "enabled",
    "functional_calls",
    "functions",
    "is_enabled",
    "modules",
    "normalization",
    "operators",
    "training_step",
    "warmup",
]
