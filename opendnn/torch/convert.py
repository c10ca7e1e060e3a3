"""``convert(model)``: run a torch model's supported modules on opendnn, in place.

Each module whose exact type has an opendnn equivalent (``CONVERSIONS``) and whose options opendnn
covers gets that equivalent's class: the object stays the same, so its parameters, buffers, hooks,
train/eval state and every reference to it (an optimizer's, a parent's) are kept. Subclasses of
torch's modules are left alone (their own forward may do something else), as are modules with
no opendnn equivalent; the report says which and why. Calls a module makes in its own forward
(``torch.matmul``, ``F.softmax``) are not modules and stay torch's: ``opendnn.torch.functions``
has their opendnn versions, and ``functional_calls()`` or ``enable()`` route them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
        kind = type(module).__name__
        target = CONVERSIONS.get(type(module))
        if target is not None:
            reason = target.unsupported(module)
            if reason is None:
                module.__class__ = target
                report.converted.append((name, kind))
            else:
                report.left_alone.append((name, kind, reason))
        elif not isinstance(module, (modules.OpendnnModule, *PASS_THROUGH)):
            reason = _no_equivalent(module)
            if reason is not None:
                report.left_alone.append((name, kind, reason))
    return report


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
        return "a subclass of a supported torch module: its own forward may differ, so it runs as written"
    has_children = next(module.children(), None) is not None
    if not has_children:
        return "no opendnn equivalent"
    if type(module).forward is torch.nn.Module.forward or isinstance(module, torch.nn.Sequential):
        return None
    if any(True for _ in module.parameters(recurse=False)):
        return "its own forward uses its own parameters through torch calls"
    return None
