"""``convert(model)``: run a torch model's supported modules on opendnn, in place.

Each module whose exact type has an opendnn equivalent (``CONVERSIONS``) and whose options opendnn
covers gets that equivalent's class: the object stays the same, so its parameters, buffers, hooks,
train/eval state and every reference to it (an optimizer's, a parent's) are kept. A subclass of a
supported module that changes none of its methods (a constructor of its own, helpers of its own:
torchvision's ``Conv3DSimple``) gets a class that puts opendnn's in front of the subclass, so the
module keeps its type and its helpers; so does a class of another library whose forward opendnn
computes exactly (``FOREIGN_CONVERSIONS``: timm's GELU, Linear, BatchNormAct2d, LayerNorm2d, ...), with
opendnn's class for it in front. Subclasses that override a method
are left alone (their own forward may do something else), as are modules with no opendnn equivalent;
the report says which and why. Calls a module makes in its own forward (``torch.matmul``,
``F.softmax``) are not modules and stay torch's: ``opendnn.torch.functions`` has their opendnn
versions, and ``functional_calls()`` or ``enable()`` route them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from opendnn.torch import modules

CONVERSIONS: dict[type[torch.nn.Module], type[modules.OpendnnModule]] = {
    torch.nn.Conv1d: modules.Conv1d,
    torch.nn.Conv2d: modules.Conv2d,
    torch.nn.Conv3d: modules.Conv3d,
    torch.nn.ConvTranspose1d: modules.ConvTranspose1d,
    torch.nn.ConvTranspose2d: modules.ConvTranspose2d,
    torch.nn.ConvTranspose3d: modules.ConvTranspose3d,
    torch.nn.Linear: modules.Linear,
    torch.nn.BatchNorm1d: modules.BatchNorm1d,
    torch.nn.BatchNorm2d: modules.BatchNorm2d,
    torch.nn.BatchNorm3d: modules.BatchNorm3d,
    torch.nn.LayerNorm: modules.LayerNorm,
    torch.nn.RMSNorm: modules.RMSNorm,
    torch.nn.GroupNorm: modules.GroupNorm,
    torch.nn.InstanceNorm1d: modules.InstanceNorm1d,
    torch.nn.InstanceNorm2d: modules.InstanceNorm2d,
    torch.nn.InstanceNorm3d: modules.InstanceNorm3d,
    torch.nn.LocalResponseNorm: modules.LocalResponseNorm,
    torch.nn.ReLU: modules.ReLU,
    torch.nn.ReLU6: modules.ReLU6,
    torch.nn.Hardtanh: modules.Hardtanh,
    torch.nn.GELU: modules.GELU,
    torch.nn.SiLU: modules.SiLU,
    torch.nn.Sigmoid: modules.Sigmoid,
    torch.nn.Tanh: modules.Tanh,
    torch.nn.ELU: modules.ELU,
    torch.nn.Softplus: modules.Softplus,
    torch.nn.MaxPool1d: modules.MaxPool1d,
    torch.nn.MaxPool2d: modules.MaxPool2d,
    torch.nn.MaxPool3d: modules.MaxPool3d,
    torch.nn.AvgPool1d: modules.AvgPool1d,
    torch.nn.AvgPool2d: modules.AvgPool2d,
    torch.nn.AvgPool3d: modules.AvgPool3d,
    torch.nn.AdaptiveAvgPool1d: modules.AdaptiveAvgPool1d,
    torch.nn.AdaptiveAvgPool2d: modules.AdaptiveAvgPool2d,
    torch.nn.AdaptiveAvgPool3d: modules.AdaptiveAvgPool3d,
    torch.nn.AdaptiveMaxPool1d: modules.AdaptiveMaxPool1d,
    torch.nn.AdaptiveMaxPool2d: modules.AdaptiveMaxPool2d,
    torch.nn.AdaptiveMaxPool3d: modules.AdaptiveMaxPool3d,
    torch.nn.Softmax: modules.Softmax,
    torch.nn.LogSoftmax: modules.LogSoftmax,
    torch.nn.Upsample: modules.Upsample,
    torch.nn.UpsamplingNearest2d: modules.UpsamplingNearest2d,
    torch.nn.UpsamplingBilinear2d: modules.UpsamplingBilinear2d,
}

# Classes of other libraries, found by module and name (nothing imports those libraries): the opendnn
# class put in front of each, and the class attributes that fix its options. timm's GELU modules (what
# its create_act_layer("gelu") builds: ConvNeXt's MLPs) and Linear (a Linear that casts its weight only
# under torch.jit.script) are torch's; its norms are torch's unless built with its fast-norm flag
# (refused), its BatchNormAct2d (EfficientNet, RegNet) a batch norm before its own drop and act
# modules, its LayerNorm2d (ConvNeXt's stem and downsampling) a layer norm over an image's channels,
# GroupNorm1 (PoolFormer) a group norm of one group, FastAdaptiveAvgPool a global average pooling.
FOREIGN_CONVERSIONS: dict[tuple[str, str], tuple[type[modules.OpendnnModule], dict[str, Any]]] = {
    ("timm.layers.activations", "GELU"): (modules.GELU, {"approximate": "none"}),
    ("timm.layers.activations", "GELUTanh"): (modules.GELU, {"approximate": "tanh"}),
    ("timm.layers.linear", "Linear"): (modules.Linear, {}),
    ("timm.layers.norm_act", "BatchNormAct2d"): (modules.TimmBatchNormAct2d, {}),
    ("timm.layers.norm", "LayerNorm"): (modules.TimmLayerNorm, {}),
    ("timm.layers.norm", "LayerNorm2d"): (modules.TimmLayerNorm2d, {}),
    ("timm.layers.norm", "GroupNorm"): (modules.TimmGroupNorm, {}),
    ("timm.layers.norm", "GroupNorm1"): (modules.TimmGroupNorm, {}),
    ("timm.layers.adaptive_avgmax_pool", "FastAdaptiveAvgPool"): (modules.TimmFastAdaptiveAvgPool, {}),
}

# Modules that do no arithmetic opendnn has a primitive for: they stay torch's and need no mention.
PASS_THROUGH: tuple[type[torch.nn.Module], ...] = (
    torch.nn.Identity,
    torch.nn.Flatten,
    torch.nn.Unflatten,
    torch.nn.Dropout,
    torch.nn.Dropout1d,
    torch.nn.Dropout2d,
    torch.nn.Dropout3d,
)


@dataclass
class ConversionReport:
    """What ``convert`` did: ``converted`` holds (qualified name, type name) pairs; ``left_alone``
    holds (qualified name, type name, reason) triples. The root module's name is ""."""

    converted: list[tuple[str, str]] = field(default_factory=list)
    left_alone: list[tuple[str, str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"converted {len(self.converted)} modules to opendnn, left {len(self.left_alone)} to torch"]
        lines += [f"  opendnn  {name or '(root)'}: {kind}" for name, kind in self.converted]
        lines += [f"  torch    {name or '(root)'}: {kind} ({reason})" for name, kind, reason in self.left_alone]
        return "\n".join(lines)


def convert(model: torch.nn.Module) -> ConversionReport:
    """Swap, in place, every supported module of ``model`` (itself included) for opendnn's.

    Returns:
        A ConversionReport of the modules converted and of those left to torch with the reason
        (an option opendnn does not cover, or no opendnn equivalent). Containers and pass-through
        modules (Sequential, Dropout, Flatten, ...) are not listed.
    """
    report = ConversionReport()
    for name, module in model.named_modules():
        if isinstance(module, modules.OpendnnModule):
            continue  # opendnn's already (a converted class of another library's has that class's name)
        kind = type(module).__name__
        target = CONVERSIONS.get(type(module)) or _subclass_target(type(module))
        if target is not None:
            reason = target.unsupported(module)
            if reason is None:
                module.__class__ = target
                report.converted.append((name, kind))
            else:
                report.left_alone.append((name, kind, reason))
        elif not isinstance(module, PASS_THROUGH):
            reason = _no_equivalent(module)
            if reason is not None:
                report.left_alone.append((name, kind, reason))
    return report


# What a subclass may define and still take opendnn's methods: its constructor and the class's own records.
SUBCLASS_OWN = frozenset(
    {"__init__", "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__"}
    | {"__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__"}
)


# one class per subclass, shared by its modules (and found again when one is unpickled)
_SUBCLASS_TARGETS: dict[type[torch.nn.Module], type[modules.OpendnnModule] | None] = {}


def _subclass_target(kind: type[torch.nn.Module]) -> type[modules.OpendnnModule] | None:
    """For a subclass of a supported torch module that overrides none of that module's attributes (it may
    add its own), or a class of ``FOREIGN_CONVERSIONS``: a class with opendnn's equivalent first and
    ``kind`` after it, so methods come from opendnn's class and ``kind``'s own helpers and type stay.
    None for any other class."""
    if kind not in _SUBCLASS_TARGETS:
        _SUBCLASS_TARGETS[kind] = _converted_class(kind)
    return _SUBCLASS_TARGETS[kind]


def _converted_class(kind: type[torch.nn.Module]) -> type[modules.OpendnnModule] | None:
    target, options = FOREIGN_CONVERSIONS.get((kind.__module__, kind.__qualname__), (None, {}))
    if target is None:
        base = next((klass for klass in kind.__mro__[1:] if klass in CONVERSIONS), None)
        if base is None:
            return None
        between = kind.__mro__[: kind.__mro__.index(base)]
        if any(name not in SUBCLASS_OWN and hasattr(base, name) for klass in between for name in vars(klass)):
            return None
        target = CONVERSIONS[base]
    namespace = {
        **options,
        "__module__": kind.__module__,
        "__qualname__": kind.__qualname__,
        "__reduce_ex__": _reduce_converted,
    }
    converted: type[modules.OpendnnModule] = type(kind.__name__, (target, kind), namespace)
    return converted


def _reduce_converted(module: torch.nn.Module, protocol: int) -> tuple[Any, ...]:
    """Pickling (and deepcopy) of a converted subclass's module: the class it was converted from (the
    second base of its class), found by name, and its state; ``_restore_converted`` builds the converted
    class again from that class."""
    return _restore_converted, (type(module).__bases__[1],), module.__dict__


def _restore_converted(subclass: type[torch.nn.Module]) -> torch.nn.Module:
    target = _subclass_target(subclass)
    assert target is not None  # the subclass converted when it was pickled
    return target.__new__(target)


# Modules whose own forward reaches opendnn through a routed functional call instead of a module swap.
ROUTED_CALLS: dict[type[torch.nn.Module], str] = {
    torch.nn.MultiheadAttention: (
        "runs torch's forward, whose F.scaled_dot_product_attention (need_weights=False, as in "
        "TransformerEncoderLayer) opendnn.torch.enable() routes to opendnn; need_weights=True returns "
        "the attention weights, which a fused attention never forms"
    ),
}


def _no_equivalent(module: torch.nn.Module) -> str | None:
    """Why a module without an opendnn class stays torch's, or None for a plain container."""
    if type(module) in ROUTED_CALLS:
        return ROUTED_CALLS[type(module)]
    if any(isinstance(module, torch_type) for torch_type in CONVERSIONS):
        return "a subclass of a supported torch module that overrides its methods: it runs as written"
    # a container's computation is its children's; an empty Sequential (a branch that passes its input
    # through, as in torchvision's ShuffleNet) has none
    if isinstance(module, torch.nn.Sequential) or type(module).forward is torch.nn.Module.forward:
        return None
    has_children = next(module.children(), None) is not None
    if not has_children:
        return "no opendnn equivalent"
    if any(True for _ in module.parameters(recurse=False)):
        return "its own forward uses its own parameters through torch calls"
    return None
