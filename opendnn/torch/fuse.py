"""Fusion: the chains of layers that one opendnn call with a fused epilogue can compute, found in a
model's torch.fx graph and each replaced by that call.

    fused = opendnn.torch.fuse(model.eval())    # inference; a torch.fx.GraphModule, ``model`` left as it is
    fused = opendnn.torch.fuse(model.train())   # training

An eval-mode model fuses two kinds of chain, each link the only user of the one before:

- convolution -> batch norm (running statistics) [-> + residual] [-> activation]: one convolution
  with the batch norm folded into its weights and bias and the residual and activation in its
  epilogue (cuDNN's ConvolutionBiasActivationForward: ``act(conv(x, w') + z + b')``). A ResNet
  bottleneck's conv3 -> bn3 -> += identity -> relu is one call, its conv1 -> bn1 -> relu another;
  MobileNetV2's conv -> bn -> relu6 and its projection conv -> bn -> + x too. Folding, per output
  channel: scale = gamma / sqrt(running_var + eps), w' = w * scale, b' = (b - running_mean) * scale
  + beta, in float64, stored in the convolution's dtype.
- linear [-> activation] [-> + residual]: one matrix product with the bias, activation and
  residual in its epilogue (``act(x @ w.T + b) + z``): a transformer MLP's fc1 -> gelu, and its
  fc2 -> + x. ReLU and ReLU6 run after the product, which would turn NaN into 0 where torch's
  keep it (``NAN_DROPPING_EPILOGUES``); the convolution's epilogue keeps NaN itself.

Activations: ReLU, ReLU6, GELU (either form), SiLU, ELU, Softplus, Sigmoid, Tanh, as modules or
functions, with their coefficients (ELU's alpha, Softplus's beta; a Softplus whose threshold is
below torch's 20 is left to torch, which returns x past it). A residual that broadcasts or has
another dtype than the product is added after it, as torch would.
These fused modules are for inference: they hold copies of the parameters taken at fusion time
(train the original and fuse again), and refuse inputs that need a gradient.

A training-mode model fuses batch norm [-> + residual] [-> ReLU or ReLU6] into one batch norm
computing ``act(bn(x) + z)`` forward and backward in one opendnn call each (cuDNN's
BN_ADD_ACTIVATION / BN_ACTIVATION; the reserve space keeps the activation's mask): a ResNet
bottleneck's bn3 -> += identity -> relu, MobileNetV2's bn -> relu6 and bn -> + x. The fused batch
norm is the model's own module (of the copy), its class swapped: same parameters, running
statistics and state-dict names, so ``fused.state_dict()`` loads into the model. A batch norm
called from several places stays as it is.
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from typing import Any, cast

import torch
import torch.fx
import torch.nn.functional as TF

from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.pointwise.problem import PointwiseMode, resolved_coef
from opendnn.torch import functions, operators
from opendnn.torch.library import autocast_dtype
from opendnn.torch.modules import BatchNorm1d, BatchNorm2d, BatchNorm3d, OpendnnModule, _BatchNorm, _Convolution
from opendnn.torch.operators import add

CONVOLUTIONS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
BATCH_NORMS = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}  # by spatial dims
ADDITIONS = (operator.add, operator.iadd, torch.add)
# (mode, coefficient: None for the mode's default in opendnn.families.pointwise.problem's ACTIVATION_TABLE)
Activation = tuple[str, float | None]
ACTIVATION_MODULES: dict[type, Activation] = {
    torch.nn.ReLU: ("relu", None),
    torch.nn.ReLU6: ("clipped_relu", 6.0),
    torch.nn.SiLU: ("swish", None),
    torch.nn.Sigmoid: ("sigmoid", None),
    torch.nn.Tanh: ("tanh", None),
}
ACTIVATION_FUNCTIONS: dict[Any, Activation] = {
    TF.relu: ("relu", None),
    torch.relu: ("relu", None),
    TF.relu6: ("clipped_relu", 6.0),
    TF.silu: ("swish", None),
    torch.sigmoid: ("sigmoid", None),
    torch.tanh: ("tanh", None),
    TF.gelu: ("gelu", None),
    TF.elu: ("elu", None),
    TF.softplus: ("softplus", None),
}
# the keyword arguments an activation function may take: its coefficient's, and what fusion leaves as torch's
COEFFICIENT_ARGUMENTS: dict[Any, str] = {TF.elu: "alpha", TF.softplus: "beta"}
SOFTPLUS_THRESHOLD = 20.0  # torch's default: past beta * x > threshold torch returns x, within exp(-20) of softplus
GELU_FORMS = {"none": "gelu", "tanh": "gelu_approx_tanh"}
# a fused chain's activation as the activation operator names it, for a residual added after the
# product (one that broadcasts or promotes): (name, its parameters given the chain's coefficient)
ACTIVATION_OPERATORS = {
    "relu": ("relu", lambda coef: ()),
    "clipped_relu": ("hardtanh", lambda coef: [0.0, coef]),
    "swish": ("silu", lambda coef: [coef]),
    "sigmoid": ("sigmoid", lambda coef: ()),
    "tanh": ("tanh", lambda coef: ()),
    "gelu": ("gelu", lambda coef: ()),
    "gelu_approx_tanh": ("gelu_tanh", lambda coef: ()),
    "elu": ("elu", lambda coef: [coef]),
    "softplus": ("softplus", lambda coef: [coef]),
}


class _Fused(OpendnnModule, torch.nn.Module):
    """What both fused modules share: inputs that need no gradient, and the parameters cast to the
    autocast dtype once, not at every call as torch's autocast does outside its cache (the casts
    are kept beside the parameters while these stay as they are: same storage, no in-place write)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: str | None
    coef: float
    _casts: tuple[Any, torch.Tensor, torch.Tensor | None] | None = None  # (key, weight, bias)

    def _autocast(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(x, weight, bias) as the product takes them: under autocast, in its dtype."""
        dtype = autocast_dtype(x)
        if dtype is None:
            return x, self.weight, self.bias
        key = (dtype, *((t.data_ptr(), t._version) for t in (self.weight, self.bias) if t is not None))
        if self._casts is None or self._casts[0] != key:
            self._casts = (key, self.weight.to(dtype), None if self.bias is None else self.bias.to(dtype))
        return x.to(dtype), self._casts[1], self._casts[2]

    def _check_inference(self, *tensors: torch.Tensor | None) -> None:
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
            raise BadParam(f"a {type(self).__name__} is for inference: its inputs need no gradient (torch.no_grad())")

    def _activate(self, y: torch.Tensor) -> torch.Tensor:
        """The chain's activation on its own, after a residual added on its own."""
        if self.activation is None:
            return y
        name, parameters = ACTIVATION_OPERATORS[self.activation]
        return operators.activation(y, name, parameters(self.coef))


def _coefficient(activation: str | None, coef: float | None) -> float:
    """The coefficient a fused chain's activation runs with: ``coef``, or its mode's default."""
    return 0.0 if activation is None else resolved_coef(PointwiseMode(f"{activation}_fwd"), coef)


class FusedConvolution(_Fused):
    """``act(conv(x, w') + z + b')``: a convolution with a batch norm folded in (``w'``, ``b'``), and
    the residual ``z`` and the activation where the chain had them. For inference only."""

    def __init__(
        self,
        conv: torch.nn.Conv1d | torch.nn.Conv2d | torch.nn.Conv3d,
        norm: torch.nn.Module,
        activation: str | None,
        coef: float | None,
        residual: bool,
    ) -> None:
        super().__init__()
        weight, bias = folded(conv, norm)
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        self.activation, self.coef, self.residual = activation, _coefficient(activation, coef), residual
        # one int per spatial dim ("same" / "valid" resolved), as the operator takes them
        self.geometry = (
            list(self.stride),
            list(functions.symmetric_padding(self.padding, weight.shape[2:], self.dilation)),
            list(self.dilation),
        )

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        self._check_inference(x, z)
        x, weight, bias = self._autocast(x)
        stride, padding, dilation = self.geometry
        if z is None or (
            z.dtype == x.dtype and list(z.shape) == operators.convolution_shape(x, weight, stride, padding, dilation)
        ):
            return operators.convolution_bias_activation(
                x, weight, bias, z, self.activation, self.coef, stride, padding, dilation, self.groups
            )
        y = operators.convolution_bias_activation(
            x, weight, bias, None, None, 0.0, stride, padding, dilation, self.groups
        )
        return self._activate(add(y, z))  # z broadcasts or promotes: torch's addition

    def extra_repr(self) -> str:
        return (
            f"weight={tuple(self.weight.shape)}, stride={self.stride}, padding={self.padding}, "
            f"groups={self.groups}, residual={self.residual}, activation={self.activation}"
        )


# the activations the matrix product's epilogue turns NaN into 0 in (as cuBLASLt's RELU epilogue
# does); torch's ReLU, ReLU6 and Hardtanh keep NaN, so a linear chain runs them after the product
NAN_DROPPING_EPILOGUES = ("relu", "clipped_relu")


class FusedLinear(_Fused):
    """``act(x @ w.T + b) + z``: a linear layer with the activation and the residual ``z`` where
    the chain had them (relu and clipped relu after the product: ``NAN_DROPPING_EPILOGUES``). For
    inference only."""

    def __init__(self, linear: torch.nn.Linear, activation: str | None, coef: float | None, residual: bool) -> None:
        super().__init__()
        self.register_buffer("weight", linear.weight.detach().clone())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.activation, self.coef, self.residual = activation, _coefficient(activation, coef), residual

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        self._check_inference(x, z)
        x, weight, bias = self._autocast(x)
        if self.activation in NAN_DROPPING_EPILOGUES:
            y = self._activate(operators.matmul_bias_activation(x, weight.t(), bias, None, None, 0.0))
            return y if z is None else add(y, z)
        if z is None or (z.dtype == x.dtype and z.shape == (*x.shape[:-1], weight.shape[0])):
            return operators.matmul_bias_activation(x, weight.t(), bias, z, self.activation, self.coef)
        return add(operators.matmul_bias_activation(x, weight.t(), bias, None, self.activation, self.coef), z)

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)}, residual={self.residual}, activation={self.activation}"


class _FusedBatchNorm(_BatchNorm):
    """``act(batch_norm(x) + z)``: a batch norm with the residual ``z`` and the activation (relu, or
    clipped relu with ceiling ``coef``) where the chain had them, trainable; a converted batch
    norm's class swapped for it (module docstring). Normalizing with running statistics (eval
    mode), or with a residual of another shape or dtype, it takes the steps one by one."""

    activation: str | None
    coef: float
    residual: bool

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:  # type: ignore[override]
        self._check_input_dim(x)
        running_mean, running_var, use_batch_stats, factor = self._statistics()
        if use_batch_stats and (z is None or (z.dtype == x.dtype and z.shape == x.shape)):
            return functions.batch_norm_add_activation(
                x, z, running_mean, running_var, self.weight, self.bias, factor, self.eps, self.activation, self.coef
            )
        y = functions.batch_norm(
            x, running_mean, running_var, self.weight, self.bias, use_batch_stats, factor, self.eps
        )
        y = y if z is None else y + z
        if self.activation is None:
            return y
        return functions.relu(y) if self.activation == "relu" else functions.hardtanh(y, 0.0, self.coef)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, residual={self.residual}, activation={self.activation}"


class FusedBatchNorm1d(_FusedBatchNorm, BatchNorm1d):
    pass


class FusedBatchNorm2d(_FusedBatchNorm, BatchNorm2d):
    pass


class FusedBatchNorm3d(_FusedBatchNorm, BatchNorm3d):
    pass


# the batch norms a training fusion swaps (torch's and their converted forms; not subclasses, whose
# forward may differ), by the fused class each becomes
FUSED_BATCH_NORMS = {
    cls: fused
    for fused, classes in (
        (FusedBatchNorm1d, (torch.nn.BatchNorm1d, BatchNorm1d)),
        (FusedBatchNorm2d, (torch.nn.BatchNorm2d, BatchNorm2d)),
        (FusedBatchNorm3d, (torch.nn.BatchNorm3d, BatchNorm3d)),
    )
    for cls in classes
}
BN_ACTIVATIONS = ("relu", "clipped_relu")  # what the Ex forms apply after the norm


def folded(conv: Any, norm: Any) -> tuple[torch.Tensor, torch.Tensor]:
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
    """A traced copy of ``model`` with its chains fused (module docstring): the inference chains in
    eval mode, the batch norm chains in training mode.

    Raises:
        NotSupported: torch.fx cannot trace ``model`` (control flow that depends on the data).
    """
    model = copy.deepcopy(model)
    try:
        graph = _Tracer().trace(model)
    except Exception as error:  # torch.fx cannot follow data-dependent control flow, among others
        raise NotSupported(f"fuse(model): torch.fx could not trace {type(model).__name__}: {error}") from error
    fused = torch.fx.GraphModule(model, graph, type(model).__name__)
    modules = dict(fused.named_modules())
    sites = Counter(node.target for node in graph.nodes if node.op == "call_module")
    for node in list(graph.nodes):
        if model.training:
            chain = _batch_norm_chain(node, modules, sites)
        else:
            chain = _convolution_chain(node, modules) or _linear_chain(node, modules)
        if chain is None:
            continue
        module, inputs, links = chain
        name = node.target
        if module is not modules[name]:  # a new module (a batch norm keeps its own, class swapped)
            name = f"{node.target.replace('.', '_')}_fused"
            while hasattr(fused, name):  # a module called more than once
                name += "_"
            fused.add_submodule(name, module)
        with graph.inserting_before(links[-1]):
            call = graph.call_module(name, inputs)
        links[-1].replace_all_uses_with(call)
        for link in reversed(links):
            graph.erase_node(link)
    graph.lint()
    fused.delete_all_unused_submodules()
    fused.recompile()
    return fused


# (the fused module, its inputs, the nodes it replaces: the chain's first to last)
Chain = tuple[torch.nn.Module, tuple[Any, ...], list[torch.fx.Node]]


def _convolution_chain(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> Chain | None:
    conv = _module(node, modules, CONVOLUTIONS)
    if conv is None or _Convolution.unsupported(conv) is not None:  # (a padding mode, an asymmetric "same")
        return None
    norm_node = _only_user(node)
    if norm_node is None:
        return None
    norm = _module(norm_node, modules, BATCH_NORMS[conv.weight.ndim - 2])
    if norm is None or norm.training or norm.running_mean is None:
        return None
    links = [node, norm_node]
    residual = _residual(links, _only_user(norm_node))
    activation, coef = _activation_link(links, _only_user(links[-1]), modules)
    fused = FusedConvolution(conv, norm, activation, coef, residual is not None)
    return fused, _inputs(node, residual), links


def _batch_norm_chain(node: torch.fx.Node, modules: dict[str, torch.nn.Module], sites: Counter[Any]) -> Chain | None:
    """A training chain from the batch norm ``node`` calls, whose class it swaps for the fused one
    (the module is the traced copy's, called from this one place)."""
    norm = _module(node, modules, tuple(FUSED_BATCH_NORMS))
    if norm is None or type(norm) not in FUSED_BATCH_NORMS or sites[node.target] != 1:
        return None
    if FUSED_BATCH_NORMS[type(norm)].unsupported(norm) is not None:  # torch's, with options opendnn lacks
        return None
    links = [node]
    residual = _residual(links, _only_user(node))
    activation, coef = _activation_link(links, _only_user(links[-1]), modules, BN_ACTIVATIONS)
    if len(links) == 1:  # a batch norm alone: nothing to fuse
        return None
    norm.__class__ = FUSED_BATCH_NORMS[type(norm)]
    norm.activation, norm.coef, norm.residual = activation, 0.0 if coef is None else coef, residual is not None
    return norm, _inputs(node, residual), links


def _linear_chain(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> Chain | None:
    linear = _module(node, modules, (torch.nn.Linear,))
    if linear is None:
        return None
    links = [node]
    activation, coef = _activation_link(links, _only_user(node), modules)
    residual = _residual(links, _only_user(links[-1]))
    if len(links) == 1:  # a linear layer alone: nothing to fuse
        return None
    fused = FusedLinear(linear, activation, coef, residual is not None)
    return fused, _inputs(node, residual), links


def _inputs(node: torch.fx.Node, residual: torch.fx.Node | None) -> tuple[Any, ...]:
    """The fused module's inputs: the chain's input, and its residual where it has one."""
    return (node.args[0],) if residual is None else (node.args[0], residual)


def _module(node: torch.fx.Node, modules: dict[str, torch.nn.Module], kinds: type | tuple[type, ...]) -> Any:
    """The module ``node`` calls on one tensor, when it is of one of ``kinds``; else None."""
    module = modules.get(cast(str, node.target)) if node.op == "call_module" else None
    return module if isinstance(module, kinds) and len(node.args) == 1 and not node.kwargs else None


def _residual(links: list[torch.fx.Node], user: torch.fx.Node | None) -> torch.fx.Node | None:
    """The other operand when ``user`` adds one to the chain's last node (``user`` joins ``links``)."""
    if user is None:
        return None
    other = _other_operand(user, links[-1])
    if other is not None:
        links.append(user)
    return other


def _activation_link(
    links: list[torch.fx.Node],
    user: torch.fx.Node | None,
    modules: dict[str, torch.nn.Module],
    modes: tuple[str, ...] | None = None,
) -> tuple[str | None, float | None]:
    """(mode, coefficient) when ``user`` is an activation, of ``modes`` when given (it joins
    ``links``); else (None, None)."""
    if user is None:
        return None, None
    kind = _activation(user, modules)
    if kind is None or (modes is not None and kind[0] not in modes):
        return None, None
    links.append(user)
    return kind


def _only_user(node: torch.fx.Node) -> torch.fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _other_operand(node: torch.fx.Node, operand: torch.fx.Node) -> torch.fx.Node | None:
    """``other`` when ``node`` is ``operand + other`` of two tensors (no alpha); else None."""
    if node.op != "call_function" or node.target not in ADDITIONS or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    other = b if a is operand else a if b is operand else None
    return other if isinstance(other, torch.fx.Node) and other is not operand else None


def _activation(node: torch.fx.Node, modules: dict[str, torch.nn.Module]) -> Activation | None:
    """(mode, coefficient) of an activation node of one tensor argument, or None."""
    if node.op == "call_module":
        module = modules.get(cast(str, node.target))
        if len(node.args) != 1 or node.kwargs:
            return None
        if isinstance(module, torch.nn.GELU):
            return GELU_FORMS[module.approximate], None
        if isinstance(module, torch.nn.ELU):
            return "elu", module.alpha
        if isinstance(module, torch.nn.Softplus):
            return ("softplus", module.beta) if module.threshold >= SOFTPLUS_THRESHOLD else None
        return next((kind for cls, kind in ACTIVATION_MODULES.items() if isinstance(module, cls)), None)
    if node.op != "call_function" or node.target not in ACTIVATION_FUNCTIONS or len(node.args) != 1:
        return None
    if node.target is TF.gelu and set(node.kwargs) <= {"approximate"}:
        return GELU_FORMS[cast(str, node.kwargs.get("approximate", "none"))], None
    coefficient = COEFFICIENT_ARGUMENTS.get(node.target)
    if not set(node.kwargs) <= {"inplace", "threshold", coefficient}:
        return None
    if cast(float, node.kwargs.get("threshold", SOFTPLUS_THRESHOLD)) < SOFTPLUS_THRESHOLD:  # (softplus's)
        return None
    mode, default = ACTIVATION_FUNCTIONS[node.target]
    return mode, (default if coefficient is None else cast(float, node.kwargs.get(coefficient, default)))
