"""Launching a planned kernel without Triton's generic launcher.

``kernel[grid](...)`` on a ``@triton.jit`` function binds and specializes every argument on every
call (about 30 us of host time per launch). A ``Launch`` is planned once per problem (grid,
arguments with named ``Slot``s where the tensors go, constexprs and launch options) and cached with
its plan; each call fills the slots and calls the kernel Triton compiled for it, kept per device
(a compiled kernel is loaded into one device's context) and per pointer alignment and dtype of its
tensors (what Triton specializes a pointer on): the per-call host cost is filling the slots.
The other arguments are the plan's own, so they specialize the same way on every call.

A ``Launches`` is a problem's whole plan: its launches in order and the scratch arrays they take
(allocated per call, like the argmax positions of max-pooling's backward), filled into the slots.

Under Triton's CPU interpreter ``kernel[grid](...)`` runs the kernel and returns None: nothing is
cached, every call goes through the interpreter, and no key is computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from triton.compiler import CompiledKernel
from triton.runtime.interpreter import InterpretedFunction


@dataclass(frozen=True)
class Slot:
    """A tensor argument filled at run time, by name (x, y, a workspace region, ...)."""

    name: str


@dataclass
class Launch:
    """One kernel launch of a plan: ``launch(tensors)`` runs it with the slots filled from ``tensors``."""

    kernel: Any  # a @triton.jit function
    grid: tuple[int, ...]
    args: tuple[Any, ...]  # the kernel's leading parameters, tensors as Slots
    options: dict[str, Any]  # the remaining parameters (constexprs) and num_warps / num_stages
    compiled: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # (device, pointer keys) -> kernel

    def __post_init__(self) -> None:
        self.grid = (*self.grid, *(1,) * (3 - len(self.grid)))
        self.slots = tuple((k, a.name) for k, a in enumerate(self.args) if isinstance(a, Slot))
        names = self.kernel.arg_names[len(self.args):]
        self.constexprs = tuple(self.options[name] for name in names)
        self.interpreted = isinstance(self.kernel, InterpretedFunction)

    def __call__(self, tensors: dict[str, Any]) -> None:
        args = list(self.args)
        for index, name in self.slots:
            args[index] = tensors[name]
        if self.interpreted:  # every call runs through the interpreter: no key, nothing to keep
            self.kernel[self.grid](*args, **self.options)
            return
        slotted = [args[index] for index, _ in self.slots]
        key = (slotted[0].device.index, *((t.data_ptr() % 16 == 0, t.dtype) for t in slotted))
        kernel = self.compiled.get(key)
        if kernel is None:
            kernel = self.kernel[self.grid](*args, **self.options)
            if isinstance(kernel, CompiledKernel):  # only a compiled kernel is kept
                self.compiled[key] = kernel
        else:
            kernel[self.grid](*args, *self.constexprs)


@dataclass(frozen=True)
class Scratch:
    """A per-call array of a plan, allocated on the device of the call's tensors and filled into ``name``."""

    name: str
    numel: int
    dtype: Any  # a torch dtype


@dataclass(frozen=True)
class Launches:
    """A problem's launches in order and the scratch arrays they take: ``launches(tensors)`` runs them."""

    launches: tuple[Launch, ...]
    scratch: tuple[Scratch, ...] = ()

    def __call__(self, tensors: dict[str, Any]) -> None:
        if self.scratch:
            import torch

            device = next(iter(tensors.values())).device
            for array in self.scratch:
                tensors[array.name] = torch.empty(array.numel, dtype=array.dtype, device=device)
        for launch in self.launches:
            launch(tensors)
