"""Executables: a plain eager ``opendnn.torch`` call replayed as its allocations and its launches.

A call of one signature (each tensor's shape, strides, dtype and device, and the other arguments)
allocates the same outputs and launches the same kernels with the same arguments every time: only
the tensors' addresses change. So the first call of a signature on a Triton handle runs recorded
(``record``: core/recording.py), and what it did becomes the signature's ``Executable``, kept on
the handle (``Handle.executables``, at most LIMIT): per output its allocation (shape, strides,
dtype), per launch the kernel and where each tensor argument lies, as a source (an input of the
call, an output, a scratch buffer) and a byte offset into it. A repeated call runs a function
generated for its signature, which allocates the outputs and scratch, reads each source's address
and launches: on a GPU each kernel's C launcher is called with the addresses (``DirectLaunch``);
under Triton's interpreter its ``run`` is called with the sources (``InterpretedLaunch``; a view
only where a launch's tensor starts elsewhere in its source or has another dtype).

A call is replayable when everything it did on the host is an allocation, a view or a launch: the
recording runs under a TorchDispatchMode that sees every torch operation the call makes outside its
launches, and any other one (a copy, a fill, a tensor made from data) leaves the signature to the
full path (``Fallback``, with the reason), as does a call that ran on another handle, launched
nothing, or handed a kernel memory that is neither an input nor allocated in the call. A replay
whose inputs' addresses fall differently modulo 16 than the recorded ones (what Triton specializes
a pointer on, and what the TMA paths ask), or that meets a registered launch hook, takes the full
path too. docs/design/torch_host_path.md has the measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opendnn.core.arrays import CPU
from opendnn.core.handle import Handle
from opendnn.core.recording import recording

LIMIT = 1024  # executables per handle; past it they are all dropped (a network makes a few hundred signatures)
# the allocators replays are made with (a test poisons what they give): an output of an input's shape,
# strides and dtype is allocated like that input (0.74 us against 1.0: no shape and strides to parse)
empty_strided = torch.empty_strided
empty_like = torch.empty_like
ALIGNMENT = 16  # bytes: pointers Triton specializes as aligned, and the TMA paths' base alignment

_aten = torch.ops.aten
_ALLOCATIONS = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.empty_permuted.default,
        _aten.empty_like.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)
# views whose memory was filled from host data, not by the call's launches
_FROM_DATA = frozenset({_aten.lift_fresh.default})
# new tensors made from Python values alone (a 0-d tensor of a constant): a replay makes them again,
# or keeps the recorded one where the call neither returns nor changed it (_Sources._allocate)
_FACTORIES = frozenset({_aten.full.default, _aten.zeros.default, _aten.ones.default, _aten.scalar_tensor.default})
_FILL = _aten.fill_.Scalar  # of a new storage with a number: a factory too (Recording._fills_new_storage)


def filled(shape: tuple[int, ...], strides: tuple[int, ...], value: Any, **placement: Any) -> torch.Tensor:
    """A new tensor of ``shape`` and ``strides`` filled with ``value``: what a recorded allocation and
    fill made."""
    return torch.empty_strided(shape, strides, **placement).fill_(value)


def record(handle: Handle, key: tuple[Any, ...], kernel: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``kernel(*args)``, recorded: its executable (or the Fallback saying why there is none) is kept
    on ``handle`` under ``key``. A call that raises keeps nothing."""
    with Recording() as recorder, recording(recorder):
        output = kernel(*args)
    executable = recorder.executable(handle, kernel, args, output)
    if executable is None:
        return output
    if len(handle.executables) >= LIMIT:
        handle.executables.clear()
    handle.executables[key] = executable
    return output


class Fallback:
    """A signature that takes the full path on every call, and why (kept on ``handle``)."""

    def __init__(self, handle: Handle, kernel: Callable[..., Any], reason: str) -> None:
        self.handle, self.kernel, self.reason = handle, kernel, reason

    def replay(self, args: tuple[Any, ...]) -> Any:
        return self.kernel(*args)

    def __repr__(self) -> str:
        return f"Fallback({self.reason})"


class Recording(TorchDispatchMode):
    """What a recorded call does: its launches with their tensors, the handles it dispatches on, its
    repeated host steps, the storages it allocates, and the first torch operation that is neither
    an allocation nor a view (``refusal``). Operations inside a launch (the interpreter's) are its own."""

    def __init__(self) -> None:
        super().__init__()
        self.launches: list[tuple[Any, dict[str, torch.Tensor]]] = []
        self.handles: list[Handle] = []
        self.repeats: list[Callable[[], None]] = []
        self.allocated: set[tuple[int, torch.device]] = set()
        self.made: dict[tuple[int, torch.device], tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
        self.refusal: str | None = None
        self.launching = False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        output = func(*args, **(kwargs or {}))
        if self.launching:
            return output
        if func in _ALLOCATIONS:
            self.allocated.add(_storage(output))
        elif func in _FACTORIES:
            self.made[_storage(output)] = (func, tuple(args), dict(kwargs or {}))
        elif func is _FILL and self._fills_new_storage(*args):
            storage, (tensor, value) = _storage(args[0]), args
            self.allocated.discard(storage)
            placement = {"dtype": tensor.dtype, "device": tensor.device}
            self.made[storage] = (filled, (tuple(tensor.shape), tensor.stride(), value), placement)
        elif (not func.is_view or func in _FROM_DATA) and self.refusal is None:
            self.refusal = f"the call runs {func} on the host"
        return output

    def _fills_new_storage(self, tensor: torch.Tensor, value: Any) -> bool:
        """Whether a fill of ``tensor`` with ``value`` makes a constant: a number filling all of a
        storage the call allocated (batch norm's absent weight, filled with ones), which a replay
        makes again as it makes ``torch.full``'s."""
        storage = tensor.untyped_storage()
        return (
            value.__class__ in (int, float, bool)
            and _storage(tensor) in self.allocated
            and tensor.data_ptr() == storage.data_ptr()
            and _extent(tensor) == storage.nbytes()
        )

    def launched(self, launch: Any, tensors: dict[str, Any]) -> None:
        self.launches.append((launch, {name: tensors[name] for name in launch.keyed}))
        self.launching = True
        try:
            launch.launch(tensors)
        finally:
            self.launching = False

    def dispatched(self, handle: Any, operation: str, problem: Any) -> None:
        if not any(handle is seen for seen in self.handles):
            self.handles.append(handle)

    def repeated(self, step: Callable[[], None]) -> None:
        if step not in self.repeats:
            self.repeats.append(step)

    def executable(
        self, handle: Handle, kernel: Callable[..., Any], args: tuple[Any, ...], output: Any
    ) -> Executable | Fallback | None:
        """The recorded call as an Executable, or the Fallback saying why it cannot be one; None
        (keep nothing) for a call one of whose tensors lies within more than one input (inputs that
        share memory, as the same tensor passed twice): which of them it came from is then unknown,
        and the signature's next call, whose inputs may lie apart, records. Inputs that share a
        storage without that ambiguity (q, k and v as views of one projection) are kept."""
        if self.refusal is not None:
            return Fallback(handle, kernel, self.refusal)
        if not self.launches:
            return Fallback(handle, kernel, "the call launches nothing")
        if self.handles != [handle]:
            return Fallback(handle, kernel, f"the call runs on {self.handles}, not on {handle}")
        outputs = (output,) if isinstance(output, torch.Tensor) else tuple(output)
        try:
            sources = _Sources(args, outputs, self.allocated, self.made)
            results = tuple(sources.place(t) if isinstance(t, torch.Tensor) else None for t in outputs)
            steps = [
                (launch, {name: sources.place(t, shaped=False) for name, t in used.items()})
                for launch, used in self.launches
            ]
        except _Ambiguous:
            return None
        except _Unplaced as error:
            return Fallback(handle, kernel, str(error))
        device = sources.tensors[0].device
        if any(t.device != device for t in sources.tensors):
            return Fallback(handle, kernel, f"the call's tensors are on more devices than {device}")
        return Executable(handle, kernel, sources, results, isinstance(output, torch.Tensor), steps, self.repeats)


class _Unplaced(Exception):
    """A tensor of the call is neither in an input nor in memory the call allocated."""


class _Ambiguous(Exception):
    """A tensor of the call lies within more than one of its inputs."""


# a tensor's place: (source index, None) for the source itself, else (source index, (byte offset,
# dtype, shape, strides)) for a view into it
View = tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]]
Place = tuple[int, "View | None"]


class _Sources:
    """The memory a recorded call's tensors lie in, in order: its tensor inputs, then its new
    allocations (an output that fills its storage, allocated as itself; any other storage the
    call allocated, as a byte buffer)."""

    def __init__(
        self, args: tuple[Any, ...], outputs: tuple[Any, ...], allocated: set[Any], made: dict[Any, Any]
    ) -> None:
        self.allocated, self.made = allocated, made
        self.tensors: list[torch.Tensor] = []  # the recorded call's tensor of each source
        self.inputs: list[int] = []  # the argument position of each input source
        # each new source: ("empty", shape, strides, dtype); for a tensor made from Python values,
        # ("make", factory, args, kwargs) where the call returns it, else ("keep", the tensor)
        self.new: list[tuple[Any, ...]] = []
        self.spans: list[tuple[tuple[int, torch.device], int, int]] = []  # (storage, first byte, end)
        for position, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and arg.numel():
                self.inputs.append(position)
                self._add(arg)
        for output in outputs:  # (an empty output gets its own: every empty tensor's storage is at 0)
            if isinstance(output, torch.Tensor) and (not output.numel() or self._find(output) is None):
                self._allocate(output, returned=True)

    def _add(self, tensor: torch.Tensor) -> None:
        start = tensor.data_ptr()
        self.tensors.append(tensor)
        self.spans.append((_storage(tensor), start, start + _extent(tensor)))

    def _allocate(self, tensor: torch.Tensor, returned: bool = False) -> None:
        storage = tensor.untyped_storage()
        made = self.made.get(_storage(tensor))
        if made is not None:
            # the tensor as it was made (its storage in the made shape); a constant the call only read
            # is kept (torch.equal waits for the fill on a GPU, so a replay on another stream reads it
            # filled), one it returns or wrote is made again
            func, args, kwargs = made
            fresh = func(*args, **kwargs)
            whole = torch.empty(0, dtype=fresh.dtype, device=fresh.device).set_(storage, 0, fresh.shape, fresh.stride())
            kept = not returned and torch.equal(whole, fresh)
            self.new.append(("keep", whole) if kept else ("make", *made))
            self._add(whole)
            return
        if storage.nbytes() and _storage(tensor) not in self.allocated:
            raise _Unplaced(f"a {tuple(tensor.shape)} {tensor.dtype} tensor lies in memory the call did not allocate")
        if tensor.data_ptr() == storage.data_ptr() and _extent(tensor) == storage.nbytes():
            self.new.append(("empty", tuple(tensor.shape), tensor.stride(), tensor.dtype))
            self._add(tensor)
        else:
            self.new.append(("empty", (storage.nbytes(),), (1,), torch.uint8))
            self._add(torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage))

    def _find(self, tensor: torch.Tensor) -> int | None:
        """The source ``tensor`` lies within (an empty one: the source it is), or None; _Ambiguous
        where it lies within several."""
        if not tensor.numel():
            return next((index for index, source in enumerate(self.tensors) if source is tensor), None)
        storage, start = _storage(tensor), tensor.data_ptr()
        end = start + _extent(tensor)
        found = [
            index
            for index, (held, first, last) in enumerate(self.spans)
            if held == storage and first <= start and end <= last
        ]
        if len(found) > 1:
            raise _Ambiguous
        return found[0] if found else None

    def place(self, tensor: torch.Tensor, shaped: bool = True) -> Place:
        """Where ``tensor`` lies: its source, and the view into it unless it is the source itself,
        or, not ``shaped``, unless it starts where the source does with the source's dtype (a kernel
        takes a tensor as its address and dtype: Triton keys a compiled kernel and passes nothing
        else, and its interpreter hands the kernel the address within a copy of the whole storage)."""
        found = self._find(tensor)
        if found is None:
            self._allocate(tensor)
        index = len(self.tensors) - 1 if found is None else found
        source = self.tensors[index]
        if (
            tensor.data_ptr() == source.data_ptr()
            and tensor.dtype == source.dtype
            and (not shaped or (tensor.shape == source.shape and tensor.stride() == source.stride()))
        ):
            return index, None
        return index, (tensor.data_ptr() - source.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())


class Executable:
    """A signature's replay: ``executable.replay(args)`` gives what the recorded call gave, for new
    tensors of the same signature (module docstring). The replay is a function generated for the
    signature (``source`` has its text): the inputs' alignment checks, the allocations and the
    launches, each argument bound, without a loop or a lookup."""

    def __init__(
        self,
        handle: Handle,
        kernel: Callable[..., Any],
        sources: _Sources,
        results: tuple[Place | None, ...],
        single: bool,
        steps: list[tuple[Any, dict[str, Place]]],
        repeats: Sequence[Callable[[], None]],
    ) -> None:
        from opendnn.kernels.launch import hooked

        self.handle, self.launches, self.allocations = handle, len(steps), len(sources.new)
        direct = [launch.direct(_tensors(sources, used), _offsets(used)) for launch, used in steps]
        self.direct = all(step is not None for step in direct)
        names: dict[str, Any] = {
            "kernel": kernel,
            "empty_strided": empty_strided,
            "empty_like": empty_like,
            "device": sources.tensors[0].device,
            "launching": handle.launching,
            "at": _at,
            "hooked": hooked,
        }
        body = [f"repeat{k}()" for k in range(len(repeats))]  # the launches, in the handle's launching context
        names.update((f"repeat{k}", step) for k, step in enumerate(repeats))
        body += self._launches(direct, steps, names)
        if handle.device == CPU:  # nothing to make current (a destroyed handle has dropped its executables)
            launching = [f"    {line}" for line in body]
        else:
            launching = ["    with launching():", *(f"        {line}" for line in body)]
        outputs = [_expression(place, names) if place is not None else "None" for place in results]
        returned = outputs[0] if single else "(" + ", ".join(outputs) + ",)"
        lines = ["def replay(args):", *self._memory(sources, names), *launching, f"    return {returned}"]
        self.source = "\n".join(lines) + "\n"
        exec(compile(self.source, f"<opendnn executable of {kernel}>", "exec"), names)
        self.replay: Callable[[tuple[Any, ...]], Any] = names["replay"]

    def _memory(self, sources: _Sources, names: dict[str, Any]) -> list[str]:
        """The replay's lines that read the inputs, check their alignment and allocate the rest."""
        lines, checks = [], []
        for k, position in enumerate(sources.inputs):
            lines += [f"    s{k} = args[{position}]", f"    b{k} = s{k}.data_ptr()"]
            checks.append(f"b{k} % {ALIGNMENT} != {sources.tensors[k].data_ptr() % ALIGNMENT}")
        if self.direct:
            checks.append("hooked()")
        if checks:  # Triton (and the TMA paths) specialize on the alignment: otherwise the full path
            lines += [f"    if {' or '.join(checks)}:", "        return kernel(*args)"]
        for k, (kind, *new) in enumerate(sources.new, len(sources.inputs)):
            if kind == "empty":
                like = _alike(sources, *new)
                if like is not None:
                    lines.append(f"    s{k} = empty_like(s{like})")
                else:
                    names[f"shape{k}"], names[f"strides{k}"], names[f"dtype{k}"] = new
                    lines.append(f"    s{k} = empty_strided(shape{k}, strides{k}, dtype=dtype{k}, device=device)")
            elif kind == "make":
                names[f"make{k}"], names[f"make_args{k}"], names[f"make_kwargs{k}"] = new
                lines.append(f"    s{k} = make{k}(*make_args{k}, **make_kwargs{k})")
            else:  # "keep"
                names[f"kept{k}"] = new[0]
                lines.append(f"    s{k} = kept{k}")
            if self.direct:
                lines.append(f"    b{k} = s{k}.data_ptr()")
        return lines

    def _launches(
        self, direct: list[Any], steps: list[tuple[Any, dict[str, Place]]], names: dict[str, Any]
    ) -> list[str]:
        """The replay's launches: C launchers given addresses (a GPU), the interpreter's run given
        tensors, or (neither: a kernel Triton 3.6 did not compile itself) each Launch given tensors."""
        if self.direct:
            from triton.runtime import driver

            names["current_stream"] = driver.active.get_current_stream
            index = names["device"].index
            return [
                f"stream = current_stream({index})",
                *(_direct_call(k, call, names) for k, call in enumerate(direct)),
            ]
        interpreted = [launch.interpreted_call() for launch, _ in steps]
        if all(call is not None for call in interpreted):
            return [
                _interpreted_call(k, call, used, names) for k, (call, (_, used)) in enumerate(zip(interpreted, steps))
            ]
        lines = []
        for k, (launch, used) in enumerate(steps):
            names[f"launch{k}"] = launch.launch
            items = ", ".join(f"{name!r}: {_expression(place, names)}" for name, place in used.items())
            lines.append(f"launch{k}({{{items}}})")
        return lines

    def __repr__(self) -> str:
        return f"Executable({self.launches} launches, {self.allocations} allocations, direct={self.direct})"


def _alike(sources: _Sources, shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype) -> int | None:
    """The first input source that ``torch.empty_like`` makes a tensor of ``shape``, ``strides``
    and ``dtype`` from (it keeps the strides of a dense input: asked of the recorded one, whose
    signature every replay's shares), or None."""
    for k in range(len(sources.inputs)):
        tensor = sources.tensors[k]
        if tensor.shape == shape and tensor.stride() == strides and tensor.dtype == dtype:
            if torch.empty_like(tensor).stride() == strides:
                return k
    return None


def _expression(place: Place, names: dict[str, Any]) -> str:
    """The replay's expression of a tensor at ``place``: its source, or a view into it."""
    index, view = place
    if view is None:
        return f"s{index}"
    name = f"view{len(names)}"
    names[name] = view
    return f"at(s{index}, {name})"


def _direct_call(k: int, launch: Any, names: dict[str, Any]) -> str:
    """The replay's call of a DirectLaunch: its C launcher with every argument bound, a slot's as
    its source's base address plus its offset."""
    names[f"run{k}"], names[f"head{k}"] = launch.run, launch.head
    slots = {index: f"b{source} + {offset}" if offset else f"b{source}" for index, source, offset in launch.slots}
    grid = ", ".join(str(g) for g in launch.grid)
    arguments = _arguments(f"{k}", launch.args, slots, names)
    return f"run{k}({grid}, stream, *head{k}, {arguments})"


def _interpreted_call(k: int, launch: Any, used: dict[str, Place], names: dict[str, Any]) -> str:
    """The replay's call of an InterpretedLaunch: the interpreter's run with every argument bound,
    a slot's as the tensor placed there."""
    names[f"run{k}"], names[f"options{k}"] = launch.run, launch.options
    slots = {index: _expression(used[name], names) for index, name in launch.slots}
    arguments = _arguments(f"{k}", launch.args, slots, names)
    return f"run{k}({arguments}, grid={launch.grid!r}, warmup=False, **options{k})"


def _arguments(prefix: str, args: tuple[Any, ...], slots: dict[int, str], names: dict[str, Any]) -> str:
    """A call's argument list: the slots' expressions, each run of bound arguments between them as
    one tuple (one name, splatted)."""
    arguments: list[str] = []
    constants: list[Any] = []
    for index, value in enumerate(args):
        if index in slots:
            if constants:
                names[f"arguments{prefix}_{index}"] = tuple(constants)
                arguments.append(f"*arguments{prefix}_{index}")
                constants = []
            arguments.append(slots[index])
        else:
            constants.append(value)
    if constants:
        names[f"arguments{prefix}_end"] = tuple(constants)
        arguments.append(f"*arguments{prefix}_end")
    return ", ".join(arguments)


def _tensors(sources: _Sources, used: dict[str, Place]) -> dict[str, torch.Tensor]:
    """The recorded tensors of a launch's slots, from their places (what ``Launch.direct`` keys on)."""
    return {name: _at(sources.tensors[index], view) for name, (index, view) in used.items()}


def _offsets(used: dict[str, Place]) -> dict[str, tuple[int, int]]:
    return {name: (index, 0 if view is None else view[0]) for name, (index, view) in used.items()}


def _at(source: torch.Tensor, view: View | None) -> torch.Tensor:
    """``source`` itself, or the view of ``view`` (byte offset from its first element, dtype, shape, strides)."""
    if view is None:
        return source
    offset, dtype, shape, strides = view
    itemsize = dtype.itemsize
    if dtype == source.dtype:
        return source.as_strided(shape, strides, source.storage_offset() + offset // itemsize)
    start = source.storage_offset() * source.element_size() + offset
    return torch.empty(0, dtype=dtype, device=source.device).set_(
        source.untyped_storage(), start // itemsize, shape, strides
    )


def _storage(tensor: torch.Tensor) -> tuple[int, torch.device]:
    return tensor.untyped_storage().data_ptr(), tensor.device


def _extent(tensor: torch.Tensor) -> int:
    """Bytes from a tensor's first element to past its last (0 without elements)."""
    if not tensor.numel():
        return 0
    return (sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size()
