"""``warmup(model, example_input)``: compile the kernels a model's step launches before the step runs.

A convolution's or pooling's first call compiles its kernels, seconds each on a cold cache
(docs/design/convolution.md, "Cold start"). ``warmup`` runs the step once collecting instead of
launching (``collect``): every torch operation runs as usual, opendnn's operators take their full
path (a TorchDispatchMode is on, so no executable is recorded or replayed: executables.py), and
while the call is recorded (core/recording.py) each problem dispatched and each launch planned is
reported to the ``Collector``, which keeps them and launches nothing. The outputs of opendnn's
operators are then left as allocated; the model's buffers are restored afterwards and its
gradients are not touched. The launches' distinct kernels, specialized as the JIT specializes
them for the current GPU, are compiled in a pool of processes into Triton's on-disk cache
(kernels/warmup.py), where the step's real first launches find them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opendnn.core.errors import BadParam
from opendnn.core.recording import recording
from opendnn.kernels.warmup import WarmupReport, compile_all, current_target, distinct_compiles


@dataclass
class Collector:
    """A recorder (core/recording.py) that keeps what a call would run and launches nothing: the
    ``problems`` dispatched, as (operation, problem), and the ``launches``, as (kernel, arguments,
    keyword arguments) of ``kernel[grid](*arguments, **keyword arguments)``."""

    problems: list[tuple[str, Any]] = field(default_factory=list)
    launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)

    def launched(self, launch: Any, tensors: dict[str, Any]) -> None:
        self.launches.append((launch.kernel, tuple(launch.filled(tensors)), launch.options))

    def dispatched(self, handle: Any, operation: str, problem: Any) -> None:
        self.problems.append((operation, problem))

    def repeated(self, step: Callable[[], None]) -> None:
        pass  # a host step before the launches: nothing to compile


class _FullPath(TorchDispatchMode):
    """Runs every operation as it is; while a mode is on, opendnn's operators take their full path."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def collect(step: Callable[[], Any]) -> Collector:
    """What ``step()`` dispatches and launches through opendnn, run without launching a kernel."""
    collector = Collector()
    with _FullPath(), recording(collector):
        step()
    return collector


def training_step(
    model: torch.nn.Module,
    example_input: torch.Tensor,
    training: bool = True,
    autocast: torch.dtype | None = None,
) -> Callable[[], None]:
    """A step of ``model`` on ``example_input``: the forward, and with ``training`` (the model in train
    mode) the backward to every parameter that needs a gradient (``torch.autograd.grad``: the
    parameters' ``.grad`` are left alone); in eval mode without gradients otherwise. With
    ``autocast`` (torch.bfloat16, torch.float16) the forward runs under ``torch.autocast`` of the
    input's device type in that dtype, as mixed-precision training runs it."""

    def step() -> None:
        model.train(training)
        cast = torch.autocast(example_input.device.type, autocast, enabled=autocast is not None)
        with torch.set_grad_enabled(training), cast:
            output = model(example_input)
            outputs = [output] if isinstance(output, torch.Tensor) else [o for o in output if torch.is_tensor(o)]
            parameters = [p for p in model.parameters() if p.requires_grad]
            if training and parameters:
                torch.autograd.grad(outputs, parameters, [torch.ones_like(o) for o in outputs], allow_unused=True)

    return step


def warmup(
    model: torch.nn.Module | Callable[[], Any],
    example_input: torch.Tensor | None = None,
    *,
    training: bool = True,
    autocast: torch.dtype | None = None,
    processes: int | None = None,
) -> WarmupReport:
    """Compile, in ``processes`` processes (default: one per CPU core), the kernels that a step of
    ``model`` on ``example_input`` launches (``training_step``: forward and backward with
    ``training``, forward alone in eval mode otherwise; under ``torch.autocast`` in the dtype
    ``autocast`` names, if any), into Triton's on-disk cache for the current
    GPU. ``model`` may also be a function without arguments that calls opendnn (``example_input``
    None). The model's mode and buffers are as they were after the call.

    Raises:
        BadParam: ``example_input`` missing for a module, or not on a CUDA device.
    """
    if isinstance(model, torch.nn.Module):
        if example_input is None:
            raise BadParam("example_input=None: warmup runs the model once on an example input")
        if not example_input.is_cuda:
            raise BadParam(
                f"example_input is on {example_input.device}: warmup compiles for the CUDA device "
                "the model runs on; move the model and the input there"
            )
        collected = _collect_model(model, example_input, training, autocast)
    else:
        collected = collect(model)
    target = current_target()
    return compile_all(distinct_compiles(collected.launches, target), target, processes)


def _collect_model(
    model: torch.nn.Module, example_input: torch.Tensor, training: bool, autocast: torch.dtype | None
) -> Collector:
    """``collect`` of the model's step, its train / eval mode and buffers (batch norm's running
    statistics and step count) restored afterwards."""
    mode = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        return collect(training_step(model, example_input, training, autocast))
    finally:
        model.train(mode)
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
