"""Inference fusion: each convolution -> batch norm [-> + residual] [-> relu / relu6] of a model in
eval mode becomes one opendnn convolution, the batch norm folded into its weights and bias and the
residual and activation in its epilogue (cuDNN's ConvolutionBiasActivationForward).

    fused = opendnn.torch.fuse(model.eval())   # a torch.fx.GraphModule; ``model`` is left as it is

The chains are found in the model's torch.fx graph: a convolution whose only user is a batch norm
(running statistics, eval mode), whose only user may be an addition of another tensor, whose only
user may be a ReLU or ReLU6 (module or function), each link with no other user. A ResNet
bottleneck's conv3 -> bn3 -> += identity -> relu is one call; its conv1 -> bn1 -> relu another;
MobileNetV2's conv -> bn -> relu6 and its projection conv -> bn -> + x too. Folding, per output
channel k: scale = gamma / sqrt(running_var + eps), w' = w * scale, b' = (b - running_mean) * scale
+ beta, computed in float64 and stored in the convolution's dtype.

The fused modules are for inference: they hold copies of the folded parameters taken at fusion
time (train the original and fuse again), and refuse inputs that need a gradient.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as TF

from opendnn.core.errors import BadParam, NotSupported
from opendnn.functional.convolution import conv_bias_activation
from opendnn.functional.elementwise import add, clipped_relu, relu
from opendnn.torch.functions import _autocast, _product_handle
from opendnn.torch.modules import OpendnnModule

CONVOLUTIONS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
BATCH_NORMS = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}  # by spatial dims
ACTIVATION_MODULES = {torch.nn.ReLU: ("relu", 0.0), torch.nn.ReLU6: ("clipped_relu", 6.0)}
ACTIVATION_FUNCTIONS = {TF.relu: ("relu", 0.0), torch.relu: ("relu", 0.0), TF.relu6: ("clipped_relu", 6.0)}
ADDITIONS = (operator.add, operator.iadd, torch.add)


class FusedConvolution(OpendnnModule, torch.nn.Module):
    """``act(conv(x, w') + z + b')``: a convolution with a batch norm folded in (``w'``, ``b'``), and
    the residual ``z`` and the activation where the chain had them. For inference only."""

    def __init__(self, conv: torch.nn.Module, norm: torch.nn.Module, activation: str | None, coef: float,
                 residual: bool) -> None:
        super().__init__()
        weight, bias = folded(conv, norm)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        self.activation, self.coef, self.residual = activation, coef, residual

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or (z is not None and z.requires_grad)):
            raise BadParam("a fused convolution is for inference: its input needs no gradient (torch.no_grad())")
        x, weight, bias = _autocast("lower", x, self.weight, self.bias)
        geometry = dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                        handle=_product_handle(x, "convolution"))
        if z is None or (z.dtype == x.dtype and z.shape == self._output_shape(x)):
            return conv_bias_activation(x, weight, bias, z, self.activation, coef=self.coef, **geometry)
        # a residual that broadcasts or promotes: the chain's addition as torch would do it, then the activation
        y = add(conv_bias_activation(x, weight, bias, **geometry), z)
        if self.activation is None:
            return y
        return relu(y) if self.activation == "relu" else clipped_relu(y, self.coef)

    def _output_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        spatial = []
        for k, size in enumerate(x.shape[2:]):
            if self.padding == "same":
                spatial.append(size)
                continue
            pad = 0 if self.padding == "valid" else self.padding[k]
            extent = self.dilation[k] * (self.weight.shape[2 + k] - 1) + 1
            spatial.append((size + 2 * pad - extent) // self.stride[k] + 1)
        return (x.shape[0], self.weight.shape[0], *spatial)

    def extra_repr(self) -> str:
        return (f"weight={tuple(self.weight.shape)}, stride={self.stride}, padding={self.padding}, "
                f"groups={self.groups}, residual={self.residual}, activation={self.activation}")


def folded(conv: torch.nn.Module, norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(w', b') of ``conv`` followed by the eval-mode batch norm ``norm``, in float64 then cast back."""
    with torch.no_grad():
        scale = torch.rsqrt(norm.running_var.double() + norm.eps)
        if norm.weight is not None:
            scale = scale * norm.weight.double()
        shift = -norm.running_mean.double() * scale
        if conv.bias is not None:
            shift = shift + conv.bias.double() * scale
        if norm.bias is not None:
            shift = shift + norm.bias.double()
        weight = conv.weight.double() * scale.reshape(-1, *(1,) * (conv.weight.ndim - 1))
        return weight.to(conv.weight.dtype), shift.to(conv.weight.dtype)


class _Tracer(torch.fx.Tracer):
    """torch's leaf modules, and opendnn's (converted models keep them whole)."""

    def is_leaf_module(self, module: torch.nn.Module, qualified_name: str) -> bool:
        return isinstance(module, OpendnnModule) or super().is_leaf_module(module, qualified_name)


def fuse(model: torch.nn.Module) -> torch.fx.GraphModule:
    """A traced copy of ``model`` (eval mode) with its convolution chains fused (module docstring).

    Raises:
        BadParam: ``model`` is in training mode (batch norm would use batch statistics).
        NotSupported: torch.fx cannot trace ``model`` (control flow that depends on the data).
    """
    if model.training:
        raise BadParam("fuse(model): model.training is True; fusion folds eval-mode statistics (call model.eval())")
    model = copy.deepcopy(model)
    try:
        graph = _Tracer().trace(model)
    except Exception as error:  # torch.fx cannot follow data-dependent control flow, among others
        raise NotSupported(f"fuse(model): torch.fx could not trace {type(model).__name__}: {error}") from error
    fused = torch.fx.GraphModule(model, graph, type(model).__name__)
    modules = dict(fused.named_modules())
    for node in list(graph.nodes):
        chain = _chain(node, modules)
        if chain is None:
            continue
        conv_node, norm_node, add_node, act_node = chain
        activation, coef = _activation(act_node, modules) if act_node is not None else (None, 0.0)
        residual = None
        if add_node is not None:
            residual = add_node.args[1] if add_node.args[0] is norm_node else add_node.args[0]
        name = f"{conv_node.target.replace('.', '_')}_fused"
        while hasattr(fused, name):  # a convolution module called more than once
            name += "_"
        fused.add_submodule(name, FusedConvolution(modules[conv_node.target], modules[norm_node.target], activation,
                                                   coef, residual is not None))
        last = act_node or add_node or norm_node
        with graph.inserting_before(last):
            call = graph.call_module(name, (conv_node.args[0], *(() if residual is None else (residual,))))
        last.replace_all_uses_with(call)
        for link in (act_node, add_node, norm_node, conv_node):
            if link is not None:
                graph.erase_node(link)
    graph.lint()
    fused.delete_all_unused_submodules()
    fused.recompile()
    return fused


def _chain(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> tuple[Any, Any, Any, Any] | None:
    """(conv, batch norm, addition or None, activation or None) starting at ``node``, or None."""
    conv = modules.get(node.target) if node.op == "call_module" else None
    if not isinstance(conv, CONVOLUTIONS) or conv.padding_mode != "zeros" or len(node.args) != 1 or node.kwargs:
        return None
    norm_node = _only_user(node)
    norm = modules.get(norm_node.target) if norm_node is not None and norm_node.op == "call_module" else None
    spatial = conv.weight.ndim - 2
    if not isinstance(norm, BATCH_NORMS[spatial]) or norm.training or norm.running_mean is None:
        return None
    add_node, act_node = None, None
    user = _only_user(norm_node)
    if user is not None and _is_addition(user, norm_node):
        add_node, user = user, _only_user(user)
    if user is not None and _activation(user, modules) is not None:
        act_node = user
    return node, norm_node, add_node, act_node


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _is_addition(node: torch.fx.Node, operand: torch.fx.Node) -> bool:
    """``operand + other`` of two tensors (no alpha), ``other`` a node of the graph."""
    if node.op != "call_function" or node.target not in ADDITIONS or node.kwargs or len(node.args) != 2:
        return False
    a, b = node.args
    other = b if a is operand else a if b is operand else None
    return isinstance(other, torch.fx.Node) and other is not operand


def _activation(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> tuple[str, float] | None:
    """(mode, coefficient) of a ReLU / ReLU6 node of one tensor argument, or None."""
    if node.op == "call_module":
        module = modules.get(node.target)
        kind = next((v for k, v in ACTIVATION_MODULES.items() if isinstance(module, k)), None)
        return kind if kind is not None and len(node.args) == 1 and not node.kwargs else None
    if node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS and len(node.args) == 1:
        if not node.kwargs or set(node.kwargs) == {"inplace"}:
            return ACTIVATION_FUNCTIONS[node.target]
    return None
