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

A kept kernel is launched through the C function of the launcher Triton built for it
(``CompiledKernel.run.launch``, past the launcher's Python wrapper, which allocates the global and
profile scratch that a kernel without them does not take: ``_Direct``), with the arguments Triton's
own ``CompiledKernel.__getitem__`` runner passes (triton 3.6, compiler.py), less its per-launch
Python: the runner asks for the current device and its stream, builds the launch metadata that only
launch hooks read, and hands the launcher the hook chains, which it calls even when empty. Pointers
go to the launcher as integers (the addresses the key has read): given a tensor it would call
``data_ptr()`` again and ask the driver about the address (``cuPointerGetAttribute``), per pointer
argument and launch. Here the stream is the current one of the tensors' device (dispatch has made
the handle's device current and checked the tensors are on it, so it is the runner's stream) and,
while no launch hook is registered (``knobs.runtime.launch_enter_hook`` / ``launch_exit_hook``), the
metadata and hooks are None, which the launcher skips. With a hook registered, another Triton
version, or a kernel that is not Triton's own CompiledKernel, the runner launches as before.

A cluster launch (``cluster`` > 1, sm_90: CTAs ``cluster * k`` to ``cluster * k + cluster - 1`` form
one thread-block cluster, co-scheduled, able to wait on each other with ``cluster_barrier``) goes
through the same C launcher with the cluster size in place of the kernel's ``num_ctas`` in its packed
metadata: the launcher then asks ``cuLaunchKernelEx`` for clusters of that many CTAs along x (and
multiplies the grid's x by it, so it is given the number of clusters). The kernel itself is compiled
as any other (one CTA per program); Triton's runner cannot launch it in clusters, so it is compiled
without launching (``warmup``) and always launched directly, hooks or not.

Under Triton's CPU interpreter ``kernel[grid](...)`` runs the kernel and returns None: nothing is
cached, every call goes through the interpreter, and no key is computed.

While a call is recorded (core/recording.py) a launch hands itself and its tensors to the
recorder, which launches it. ``opendnn.torch``'s executables then replay it without the per-call
work above: ``direct`` binds the kept compiled kernel's C launcher with every argument but the
addresses (``DirectLaunch``), ``interpreted_call`` the interpreter's ``run`` with every argument
but the tensors (``InterpretedLaunch``); docs/design/launch.md. A caller that launches on the same
memory again and again (a graph plan's kept binding) binds the launch to its tensors once
(``bound``: ``BoundLaunch``), addresses included.

Float scalars (alpha, beta, epsilon, coefficients, scales) reach a kernel exactly: each goes to a
parameter annotated ``tl.float64``, which a compiled kernel takes as a double (``.param .f64``) and
rounds only where it computes in float32, or to one annotated ``tl.float32`` where the kernel says
it computes with the float32 (the warp-specialized kernels, whose arithmetic is float32 throughout).
A float for an unannotated parameter is refused when the launch is planned: Triton would silently
compile it as a float32. Triton's interpreter
hands the kernel the Python float itself and makes a float32 constant of it wherever the kernel
assigns or casts it (``tl.cast(alpha, COMPUTE)``): half a float32 ulp, up to 6e-8 relative, lost
from float64 work. So under the interpreter a launch passes each float as the float64 scalar
tensor a compiled kernel holds (which also promotes as the compiled kernel's scalar does); a
compiled launch passes the float as it is. docs/design/launch.md has the measurements.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import triton
import triton.language as tl
from triton import knobs
from triton.compiler import CompiledKernel
from triton.runtime import driver
from triton.runtime.interpreter import InterpretedFunction, interpreter_builder

from opendnn.core.errors import InternalError
from opendnn.core.memo import memoized
from opendnn.core.recording import SCOPE
from opendnn.kernels.device import descriptor_scratch

# the launcher's argument layout below is triton 3.6's (CompiledKernel.__getitem__'s runner)
DIRECT_LAUNCH = triton.__version__.split(".")[:2] == ["3", "6"]


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
    cluster: int = 1  # CTAs per thread-block cluster along x (grid[0] counts CTAs, a multiple of it)
    compiled: dict[tuple[Any, ...], Any] = field(default_factory=dict)  # (device, pointer keys) -> kernel

    def __post_init__(self) -> None:
        self.grid = (*self.grid, *(1,) * (3 - len(self.grid)))
        self.slots = tuple((k, a.name) for k, a in enumerate(self.args) if isinstance(a, Slot))
        # the key is taken once per distinct tensor: a slot filled twice (an absent tensor's stand-in) keys alike
        self.keyed = tuple(dict.fromkeys(name for _, name in self.slots))
        self.slot_keys = tuple((index, self.keyed.index(name)) for index, name in self.slots)
        names = self.kernel.arg_names[len(self.args) :]
        self.constexprs = tuple(self.options[name] for name in names)
        self.interpreted = isinstance(self.kernel, InterpretedFunction)
        if self.interpreted and self.cluster > 1:  # the interpreter runs one program after another
            raise InternalError("a cluster launch cannot run in Triton's interpreter")
        self.passed = _exact_floats(self.kernel, self.args, self.interpreted)  # the args as the kernel takes them

    def __call__(self, tensors: dict[str, Any]) -> None:
        recorder = SCOPE.recorder
        if recorder is not None:  # a call being recorded (core/recording.py): the recorder launches
            recorder.launched(self, tensors)
            return
        self.launch(tensors)

    def launch(self, tensors: dict[str, Any]) -> None:
        """Run the kernel with the slots filled from ``tensors``."""
        if self.interpreted:  # every call runs through the interpreter: no key, nothing to keep
            self.kernel[self.grid](*self.filled(tensors), **self.options)
            return
        keyed = [tensors[name] for name in self.keyed]
        addresses = [t.data_ptr() for t in keyed]
        device = keyed[0].device.index
        key = (device, *[(address % 16 == 0, t.dtype) for address, t in zip(addresses, keyed)])
        kept: Any = self.compiled.get(key)  # a _Direct, another runner, or None
        if kept.__class__ is _Direct and (self.cluster > 1 or not hooked()):
            args = list(self.args)
            for index, k in self.slot_keys:
                args[index] = addresses[k]
            grid = self.grid
            kept.run(
                grid[0] // self.cluster, grid[1], grid[2], kept.stream(device), *kept.head, *args, *self.constexprs
            )
        elif kept is None:
            if self.cluster > 1:
                if not DIRECT_LAUNCH:
                    raise InternalError(f"cluster launches need triton 3.6's launcher, not {triton.__version__}")
                kernel = self.kernel.warmup(*self.filled(tensors), grid=self.grid, **self.options)
            else:
                kernel = self.kernel[self.grid](*self.filled(tensors), **self.options)
            if isinstance(kernel, CompiledKernel):  # only a compiled kernel is kept; Triton's own runs directly
                direct = DIRECT_LAUNCH and type(kernel) is CompiledKernel
                self.compiled[key] = _Direct.of(kernel, self.cluster) if direct else kernel
            if self.cluster > 1:  # compiled, not launched yet
                self.launch(tensors)
        else:  # a launch hook is registered (or another Triton): Triton's runner launches it
            kernel = kept.kernel if kept.__class__ is _Direct else kept
            kernel[self.grid](*self.filled(tensors), *self.constexprs)

    def bound(self, tensors: dict[str, Any]) -> BoundLaunch | None:
        """This launch with ``tensors`` fixed, for a caller that launches it again and again on the same
        memory (a graph plan's kept binding): the direct call with every argument, addresses included,
        bound once, so a call costs the stream's lookup and the C launcher. None under the interpreter,
        before the kernel is compiled for ``tensors``, or where the launch cannot be direct."""
        if self.interpreted or not DIRECT_LAUNCH:
            return None
        keyed = [tensors[name] for name in self.keyed]
        addresses = [t.data_ptr() for t in keyed]
        device = keyed[0].device.index
        kept: Any = self.compiled.get((device, *[(a % 16 == 0, t.dtype) for a, t in zip(addresses, keyed)]))
        if kept.__class__ is not _Direct:
            return None
        args = list(self.args)
        for index, k in self.slot_keys:
            args[index] = addresses[k]
        grid = (self.grid[0] // self.cluster, self.grid[1], self.grid[2])
        return BoundLaunch(self, tensors, kept.run, grid, kept.stream, device, (*kept.head, *args, *self.constexprs))

    def filled(self, tensors: dict[str, Any]) -> list[Any]:
        """The kernel's leading arguments as ``launch`` passes them, the slots filled from ``tensors``."""
        args = list(self.passed)
        for index, name in self.slots:
            args[index] = tensors[name]
        return args

    def interpreted_call(self) -> InterpretedLaunch | None:
        """This launch under Triton's interpreter with its arguments bound (what ``launch`` calls
        through ``kernel[grid]``); None for a compiled kernel."""
        if not self.interpreted:
            return None
        return InterpretedLaunch(self.kernel.run, self.grid, self.passed, self.slots, self.options)

    def direct(self, tensors: dict[str, Any], located: dict[str, tuple[int, int]]) -> DirectLaunch | None:
        """This launch replayed from addresses: the direct launch it keeps for ``tensors`` (their
        device, pointer alignments and dtypes) called with the slot ``name`` at ``bases[source] +
        offset``, where ``located[name]`` is (source, offset). None where the replay must call the
        launch with tensors: under the interpreter, or a kernel that is not Triton 3.6's own
        CompiledKernel (module docstring)."""
        if self.interpreted or not DIRECT_LAUNCH:
            return None
        keyed = [tensors[name] for name in self.keyed]
        key = (keyed[0].device.index, *[(t.data_ptr() % 16 == 0, t.dtype) for t in keyed])
        kept: Any = self.compiled.get(key)
        if kept.__class__ is not _Direct:
            return None
        grid = (self.grid[0] // self.cluster, self.grid[1], self.grid[2])
        slots = tuple((index, *located[name]) for index, name in self.slots)
        return DirectLaunch(kept.run, grid, kept.head, (*self.args, *self.constexprs), slots)


@dataclass(frozen=True)
class _Direct:
    """A compiled kernel as its C launcher takes it: ``run(grid_x, grid_y, grid_z, stream, *head,
    *arguments)``. ``head`` holds what Triton's runner passes between the stream and the kernel's
    arguments (module docstring): the function handle and the packed metadata (with the cluster size
    in place of num_ctas for a cluster launch), no launch metadata and no hooks. Where the kernel
    needs no global or profile scratch, ``run`` is the compiled C function itself, past the
    launcher's Python wrapper that would allocate them (the cooperative grid and PDL flags it adds go
    in ``head``); a kernel with global scratch alone (device-built TMA descriptors) is given opendnn's
    kept scratch by ``_ScratchLaunch``; one with profile scratch keeps the wrapper."""

    kernel: Any  # the CompiledKernel
    run: Any
    head: tuple[Any, ...]
    stream: Any  # device index -> the current stream's handle

    @staticmethod
    def of(kernel: Any, cluster: int) -> _Direct:
        metadata = kernel.packed_metadata
        if cluster > 1:
            metadata = (metadata[0], cluster, *metadata[2:])
        launcher, function = kernel.run, kernel.function
        stream = driver.active.get_current_stream
        hooks = (metadata, None, None, None)  # launch metadata, enter and exit hooks
        if launcher.profile_scratch_size:
            return _Direct(kernel, launcher, (function, *hooks), stream)
        if launcher.global_scratch_size:
            return _Direct(kernel, _ScratchLaunch.of(launcher), (function, *hooks), stream)
        flags = (launcher.launch_cooperative_grid, launcher.launch_pdl, None, None)  # no scratch
        return _Direct(kernel, launcher.launch, (function, *flags, *hooks), stream)


@dataclass(frozen=True)
class _ScratchLaunch:
    """The C launcher of a kernel that takes global scratch (and no profile scratch), called as
    Triton's wrapper calls it (``CudaLauncher.__call__``: ``run(grid_x, grid_y, grid_z, stream,
    function, *rest)``) with the scratch its grid needs from ``descriptor_scratch`` (the kept buffer of
    the launch's stream), passed as its address: the wrapper would ask the allocator hook through two
    closures per launch and hand the launcher the tensor, whose address it would look up with the
    driver (``cuPointerGetAttribute``)."""

    launch: Any  # the compiled C function
    per_program: int  # bytes of scratch a program takes (every CTA of it)
    alignment: int
    cooperative: bool
    pdl: bool

    @staticmethod
    def of(launcher: Any) -> _ScratchLaunch:
        flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
        per_program = launcher.num_ctas * launcher.global_scratch_size
        return _ScratchLaunch(launcher.launch, per_program, launcher.global_scratch_align, *flags)

    def __call__(self, grid_x: int, grid_y: int, grid_z: int, stream: int, function: Any, *rest: Any) -> None:
        scratch = descriptor_scratch(grid_x * grid_y * grid_z * self.per_program, self.alignment, stream)
        address = scratch.data_ptr()  # (scratch, held to the end of the call, outlives the launcher's read)
        self.launch(grid_x, grid_y, grid_z, stream, function, self.cooperative, self.pdl, address, None, *rest)


@dataclass(frozen=True)
class BoundLaunch:
    """A launch bound to its tensors (``Launch.bound``): calling it runs ``run(*grid, stream, *rest)``,
    what ``Launch.launch`` passes on its direct path for these tensors. While a call is recorded, or a
    launch hook is registered (and the launch is not a cluster launch, which is always direct), it
    calls the launch with the tensors instead, as ``Launch.__call__`` would."""

    launch: Launch
    tensors: dict[str, Any]
    run: Any  # the launcher's C function (_Direct.run)
    grid: tuple[int, int, int]
    stream: Any  # device index -> the current stream's handle
    device: int
    rest: tuple[Any, ...]  # the head, the arguments (addresses in the slots) and the constexprs

    def __call__(self) -> None:
        if SCOPE.recorder is not None or (self.launch.cluster == 1 and hooked()):
            self.launch(self.tensors)
            return
        self.run(*self.grid, self.stream(self.device), *self.rest)


@dataclass(frozen=True)
class DirectLaunch:
    """A kept direct launch (``_Direct``) with its grid and arguments bound, for a replay that
    passes the tensors' addresses: the call is ``run(*grid, stream, *head, *args)`` with each slot's
    argument (``args[index]``) the address ``bases[source] + offset`` (what ``Launch.launch`` passes
    on its direct path, less the key and the lookup)."""

    run: Any  # the launcher's C function (or its wrapper, for a kernel that takes global scratch)
    grid: tuple[int, int, int]
    head: tuple[Any, ...]  # what goes between the stream and the arguments (_Direct.head)
    args: tuple[Any, ...]  # the arguments and constexprs, a slot's place holding its Slot
    slots: tuple[tuple[int, int, int], ...]  # (argument index, source, byte offset)


@dataclass(frozen=True)
class InterpretedLaunch:
    """A launch under Triton's interpreter with its arguments bound, for a replay: the call is
    ``run(*args, grid=grid, warmup=False, **options)`` (what ``kernel[grid](*args, **options)``
    calls) with each slot's argument (``args[index]``) the tensor the replay places there."""

    run: Any  # the InterpretedFunction's run
    grid: tuple[int, ...]
    args: tuple[Any, ...]  # the arguments as the kernel takes them, a slot's place holding its Slot
    slots: tuple[tuple[int, str], ...]  # (argument index, slot name)
    options: dict[str, Any]


def _exact_floats(kernel: Any, args: tuple[Any, ...], interpreted: bool) -> tuple[Any, ...]:
    """``args`` with each float as the kernel takes it (module docstring): refused unless its parameter
    is annotated ``tl.float64`` or ``tl.float32``; under the interpreter, a float64 one as the float64
    scalar tensor."""
    floats = [index for index, value in enumerate(args) if isinstance(value, float)]
    if not floats:
        return args
    float64, float32 = _float_parameters(kernel.fn)
    for index in floats:
        if index not in float64 | float32:
            raise InternalError(
                f"{kernel.fn.__name__}: the float {kernel.arg_names[index]}={args[index]!r} needs a "
                "parameter annotated tl.float64 or tl.float32 (Triton compiles an unannotated float as a "
                "float32)"
            )
    if not interpreted:
        return args
    return tuple(
        tl.tensor(interpreter_builder.get_fp64(value), tl.float64) if index in float64 else value
        for index, value in enumerate(args)
    )


@memoized  # a launch replanned per call (the graph engine's execute-time scalars) asks again: 70 us each
def _float_parameters(function: Any) -> tuple[frozenset[int], frozenset[int]]:
    """The positions of ``function``'s parameters annotated ``tl.float64``, and of those annotated
    ``tl.float32``."""
    parameters = list(inspect.signature(function).parameters.values())

    def annotated(name: str) -> frozenset[int]:
        return frozenset(k for k, p in enumerate(parameters) if p.annotation in (f"tl.{name}", getattr(tl, name)))

    return annotated("float64"), annotated("float32")


def hooked() -> bool:
    """Whether a launch hook is registered (a HookChain with calls, or any other hook set)."""
    runtime = knobs.runtime
    return _hook_set(runtime.launch_enter_hook) or _hook_set(runtime.launch_exit_hook)


def _hook_set(hook: Any) -> bool:
    return hook is not None and (not isinstance(hook, knobs.HookChain) or bool(hook.calls))


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
