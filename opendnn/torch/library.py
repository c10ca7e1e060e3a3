"""How an opendnn operation becomes a PyTorch operator of the ``opendnn::`` namespace.

``define`` declares one operator through torch.library: its schema; one kernel for the CPU and
CUDA dispatch keys (opendnn.functional picks the NumPy backend for CPU tensors, the Triton
kernels for CUDA ones); a fake kernel giving the outputs' shapes, dtypes and strides without
running anything (torch.compile, torch.export, meta tensors); a loop rule for torch.vmap; and,
where torch's autocast casts the op it stands for, the same cast. ``register_autograd`` gives an
operator its gradient: a ``setup_context`` and a ``backward`` that calls other opendnn operators,
so a traced backward graph holds opendnn operators too. ``define`` returns an ``Operator``, what
opendnn.torch calls: a plain eager call runs the kernel past the dispatcher, on a Triton handle as
the executable of its signature (executables.py). docs/design/torch_integration.md and
torch_host_path.md say why the pieces are shaped so, with the measurements.

What every kernel does the same way:

- An empty main input (a batch of 0 samples) gives the fake kernel's outputs filled with zeros
  and launches nothing: opendnn's descriptors have no empty dims, torch returns empty results
  (and zero gradients for the parameters).
- An opendnn error leaves the operator as an exception of its own class that is also a
  RuntimeError, torch's type for a call its operator refuses, with opendnn's message.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from opendnn.core.arrays import CPU
from opendnn.core.default_handle import shared_handle
from opendnn.core.descriptors import strides_for_order
from opendnn.core.errors import NotSupported, OpenDnnError
from opendnn.core.handle import Handle
from opendnn.torch.executables import record

NAMESPACE = "opendnn"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
DEVICE_KEYS = ("CPU", "CUDA")

# torch's autocast policies an operator may follow: the dtype its floating inputs take, given the
# device type and the call's arguments (None: no cast). Float64 inputs are never cast, as torch's.
AutocastRule = Callable[[str, tuple[Any, ...]], "torch.dtype | None"]
# the handle an operator's kernel runs a call on, given the call's arguments (None: the shared handle
# of the first argument's device)
HandleRule = Callable[..., "Handle | None"]


def lower_precision(device_type: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """Convolutions and matrix products: the autocast dtype (float16 or bfloat16)."""
    return torch.get_autocast_dtype(device_type)


def float32_on_cuda(device_type: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """Softmax, layer/group/RMS norm, softplus: float32 on CUDA, unchanged on the CPU."""
    return torch.float32 if device_type == "cuda" else None


def local_response_norm_autocast(device_type: str, args: tuple[Any, ...]) -> torch.dtype | None:
    """Local response norm in float32, as torch's composition comes out under autocast (its pow runs in
    float32 on CUDA, its 3-D average pooling on the CPU), except on the CPU over one spatial dim (its
    2-D average pooling and pow keep their dtype there)."""
    return None if device_type == "cpu" and args[0].ndim == 3 else torch.float32


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast gives a product's floating input ``x`` on its device now (None: none)."""
    device_type = x.device.type
    if not torch.is_autocast_enabled(device_type) or not x.is_floating_point() or x.dtype == torch.float64:
        return None
    return lower_precision(device_type, (x,))


def define(
    schema: str,
    kernel: Callable[..., Any],
    fake: Callable[..., Any],
    *,
    autocast: AutocastRule | None = None,
    empty: Callable[..., Any] | None = None,
    differentiable: bool = True,
    handle: HandleRule | None = None,
    eager: tuple[Callable[..., Any], Callable[..., Any] | None] | None = None,
    repeatable: Callable[..., bool] | None = None,
) -> Operator:
    """Declare ``opendnn::<schema>`` with ``kernel`` for CPU and CUDA tensors and ``fake`` for
    fake ones (the same arguments; outputs of the right metadata, nothing computed).

    Args:
        autocast: the operator's autocast rule (``lower_precision``, ``float32_on_cuda``, ...);
            None: autocast leaves it alone.
        empty: what the kernel returns when its first argument has no elements (default: the
            fake kernel's outputs, zeroed).
        differentiable: False for the backward operators and the inference-only ones: a gradient
            through them raises (torch's fallback would warn and give a wrong zero); True: a
            ``register_autograd`` call gives the operator its gradient.
        handle: the handle ``kernel`` runs a call on, when it passes one (default: the shared
            handle of the first argument's device): where the call's executable is kept.
        repeatable: whether a plain call's signature is worth recording (default: always);
            False where it almost never repeats (attention with dropout: a seed drawn per call),
            so that recording it is wasted work and its executable would crowd the handle's.
        eager: (kernel, empty) of the plain eager calls (``Operator``), where they differ from
            the registered operator's (empty None: the default above): batch norm's training
            forward updates the running statistics in place and returns None for the operator's
            new ones; batch norm's kernels return None for the tensors a call leaves unused.

    Returns:
        The ``Operator``: what opendnn.torch calls (its ``overload`` is the registered operator).
    """
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    zeros = _zeros(fake)
    device_kernel = _kernel(kernel, empty or zeros)
    for key in DEVICE_KEYS:
        LIBRARY.impl(name, device_kernel, key)
    qualified = f"{NAMESPACE}::{name}"
    torch.library.register_fake(qualified, fake, lib=LIBRARY)
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    torch.library.register_vmap(qualified, _loop_rule(op), lib=LIBRARY)
    if autocast is not None:
        for device_type in ("cpu", "cuda"):
            key = f"Autocast{device_type.upper()}"
            LIBRARY.impl(name, _autocast_kernel(op, device_type, key, autocast), key, with_keyset=True)
    eager_kernel = device_kernel if eager is None else _kernel(eager[0], eager[1] or zeros)
    operator = Operator(op, device_kernel, autocast, handle, eager_kernel, repeatable)
    if not differentiable:
        register_autograd(operator, _no_derivative(name), lambda ctx, inputs, output: None)
    return operator


def _kernel(kernel: Callable[..., Any], empty: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        if args[0].numel() == 0:
            return empty(*args)
        try:
            if torch.is_grad_enabled():  # (a transform's inner call: the kernels read the tensors' memory)
                with torch.no_grad():
                    return kernel(*args)
            return kernel(*args)
        except OpenDnnError as error:
            if isinstance(error, TORCH_ERRORS):  # already of torch's type for this refusal
                raise
            raise as_torch_error(error) from None

    return run


def _zeros(fake: Callable[..., Any]) -> Callable[..., Any]:
    def zeros(*args: Any) -> Any:
        outputs = fake(*args)
        if isinstance(outputs, torch.Tensor):
            return outputs.zero_()
        return tuple(output.zero_() for output in outputs)

    return zeros


TORCH_ERRORS = (RuntimeError, IndexError)  # what torch's operators raise for a call they refuse


def as_torch_error(error: OpenDnnError, kind: type[Exception] = RuntimeError) -> OpenDnnError:
    """``error`` as an instance of its class and of ``kind`` (same message and status), so that
    code catching torch's exception type catches it, and code catching opendnn's does too."""
    key = (type(error), kind)
    both = _TORCH_ERROR_CLASSES.get(key)
    if both is None:
        both = _TORCH_ERROR_CLASSES[key] = type(
            type(error).__name__, key, {"__module__": type(error).__module__, "__doc__": type(error).__doc__}
        )
    return both(str(error), error.status).with_traceback(error.__traceback__)


# (opendnn's error class, torch's exception type) -> the class of both, made once
_TORCH_ERROR_CLASSES: dict[tuple[type[OpenDnnError], type[Exception]], type[OpenDnnError]] = {}


def _autocast_kernel(op: torch._ops.OpOverload, device_type: str, key: str, rule: AutocastRule) -> Callable[..., Any]:
    """The operator's kernel at an autocast dispatch key: the floating inputs cast to the rule's
    dtype, then the call goes on below autocast, the key excluded: under torch's Python dispatcher
    (torch.compile's fake-tensor propagation) a redispatch finds the call's keys anew, and would come
    back here without the exclusion."""
    below = getattr(torch._C.DispatchKey, key)
    excluded = torch._C.DispatchKeySet(below)

    def kernel(keyset: Any, *args: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return op.redispatch(keyset.remove(below), *autocast_arguments(rule, device_type, args))

    return kernel


def autocast_arguments(rule: AutocastRule, device_type: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with the floating tensors cast as ``rule`` says for ``device_type`` (float64 never)."""
    dtype = rule(device_type, args)
    if dtype is None:
        return args
    return tuple(_cast(arg, dtype) for arg in args)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype not in (dtype, torch.float64):
        return value.to(dtype)
    return value


def _loop_rule(op: torch._ops.OpOverload) -> Callable[..., Any]:
    """torch.vmap's rule for ``op``: one call per sample, the results stacked along dim 0."""

    def rule(info: Any, in_dims: Sequence[int | None], *args: Any) -> Any:
        samples = [
            op(*(arg.select(dim, k) if isinstance(dim, int) else arg for arg, dim in zip(args, in_dims)))
            for k in range(info.batch_size)
        ]
        if isinstance(samples[0], torch.Tensor):
            return torch.stack(samples), 0
        outputs = tuple(torch.stack(parts) for parts in zip(*samples))
        return outputs, (0,) * len(outputs)

    return rule


def _no_derivative(name: str) -> Callable[..., Any]:
    def refuse(ctx: Any, *grads: Any) -> Any:
        raise as_torch_error(
            NotSupported(f"opendnn::{name} has no gradient: opendnn's gradients are differentiable once")
        )

    return refuse


# ---- the call path and autograd ------------------------------------------------------------------------

_INCLUDED_KEYS = torch._C._dispatch_tls_local_include_set
# the keys the thread's dispatch state includes in plain eager calls (inference mode: fewer), as bits
_PLAIN_INCLUDED = ~(
    torch._C.DispatchKeySet(torch._C.DispatchKey.BackendSelect)
    | torch._C.DispatchKeySet(torch._C.DispatchKey.ADInplaceOrView)
).raw_repr()
_TRANSFORMED = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode  # included while a torch.func transform runs
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
_TENSOR = torch.Tensor  # (a global: torch.Tensor is two lookups a test)
_is_compiling = torch.compiler.is_compiling
_profiler_enabled = torch.autograd._profiler_enabled
_any_requires_grad = torch._C._any_requires_grad
_grad_enabled = torch.is_grad_enabled
_any_autocast = torch._C._is_any_autocast_enabled  # on some device type (one read, then the call's own)
_forward_ad = torch.autograd.forward_ad  # (its _current_level: -1 outside forward-mode AD's dual levels)
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_DEVICE_KEYS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


def plain(args: tuple[Any, ...]) -> bool:
    """Whether a call on ``args`` would reach the CPU or CUDA kernel straight after autograd and
    autocast: nothing in the thread's dispatch state (no TorchDispatchMode or fake-tensor mode,
    no torch.func transform, no torch.jit.trace) and no tensor subclass among the arguments."""
    return _plain_state(_INCLUDED_KEYS()) and _plain_tensors(args)


def _plain_state(included: Any) -> bool:
    """Whether the thread's included dispatch keys are those of plain eager calls."""
    return not included.raw_repr() & _PLAIN_INCLUDED


def _plain_tensors(args: tuple[Any, ...]) -> bool:
    for arg in args:  # (a loop: a generator costs a frame per call)
        if isinstance(arg, _TENSOR) and type(arg) not in _PLAIN_TYPES:
            return False
    return True


class Operator:
    """An ``opendnn::`` operator as opendnn.torch calls it: ``operator(*args)`` computes
    ``operator.overload(*args)``, the registered operator, at the host cost of the work alone
    (an operator declared with an eager kernel computes that kernel's result in plain eager calls:
    batch norm's training forward updates the running statistics in place and returns None for them).

    A plain eager call (``plain``) skips the dispatcher's round trips (each boxes the arguments
    into a Python kernel): the autocast rule applied once, then the eager autograd Function where
    an input needs a gradient, else the kernel (``execute``: on a Triton handle, the executable of
    the call's signature). Under torch.func the Function is applied here, where functorch's layers
    see it. Every other call (torch.compile, torch.export, torch.jit.trace, fake tensors, dispatch
    modes, torch's profiler) goes through ``overload``, which traced graphs and profiles record.
    docs/design/torch_host_path.md has the measurements.
    """

    def __init__(
        self,
        overload: torch._ops.OpOverload,
        device_kernel: Callable[..., Any],
        autocast: AutocastRule | None,
        handle: HandleRule | None = None,
        eager_kernel: Callable[..., Any] | None = None,
        repeatable: Callable[..., bool] | None = None,
    ):
        self.overload = overload
        self.repeatable = repeatable
        self.name: str = overload._opname
        self.device_kernel = device_kernel
        self.eager_kernel = eager_kernel or device_kernel
        self.autocast = autocast
        self.handle_rule = handle
        self.key = signature_function(overload)
        self.plain_tensors = plain_tensors_function(overload)
        self.function: Any = None  # the autograd.Functions (register_autograd)
        self.eager: Any = None
        self.apply: Any = None  # eager.apply: torch's C entry, less Function.apply's Python
        self.transformable: Any = None

    def __call__(self, *args: Any) -> Any:
        if _is_compiling() or _profiler_enabled():  # (a profile records the operator)
            return self.overload(*args)
        included = _INCLUDED_KEYS()
        if included.raw_repr() & _PLAIN_INCLUDED:  # a mode, a transform, tracing
            return self._transformed(args) if included.has(_TRANSFORMED) else self.overload(*args)
        if not self.plain_tensors(args):
            return self.overload(*args)
        if _forward_ad._current_level >= 0:
            refuse_tangents(self.name, args)
        if self.autocast is not None and _any_autocast():
            args = self._autocast(args)
        if _grad_enabled() and _any_requires_grad(*args):
            return self.apply(*args)
        return self.executed(self.eager_kernel, args)[0]

    def _transformed(self, args: tuple[Any, ...]) -> Any:
        """A call under a torch.func transform: the Function functorch's layers take, where an
        input needs a gradient."""
        if _forward_ad._current_level >= 0:
            refuse_tangents(self.name, args)
        if self.autocast is not None:
            args = self._autocast(args)
        if _grad_enabled() and _any_requires_grad(*args):
            return self.transformable.apply(*args)
        return self.overload(*args)

    def _autocast(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` cast by the operator's autocast rule where autocast is on for their device."""
        assert self.autocast is not None  # (the callers ask)
        device_type = "cuda" if args[0].is_cuda else "cpu"
        if torch.is_autocast_enabled(device_type):
            return autocast_arguments(self.autocast, device_type, args)
        return args

    def execute(self, kernel: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``kernel(*args)`` (the device kernel or the eager one) for a plain call: on a Triton
        handle, the executable the handle keeps for the call's signature (executables.py),
        recorded on the signature's first call."""
        return self.executed(kernel, args)[0]

    def executed(self, kernel: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
        """``execute``'s output, and what the handle keeps for the call's signature (its Executable
        or Fallback; None: nothing, the NumPy backend, an unkeyed or unrepeatable call): the source a backward's
        calls key on (``after``). The handle: the operator's rule, else the shared handle of the
        first tensor's device."""
        first = args[0]
        handle = self.handle_rule(*args) if self.handle_rule is not None else None
        if handle is None:
            handle = shared_handle(f"cuda:{first.get_device()}" if first.is_cuda else CPU)
        if handle.backend != "triton":
            return kernel(*args), None
        try:
            key = self.key(kernel, *args)
        except TypeError:  # not the schema's number of arguments: the kernel says so
            key = None
        if key is None or (self.repeatable is not None and not self.repeatable(*args)):
            return kernel(*args), None
        executable = handle.executables.get(key)
        if executable is None:  # the signature's first call: recorded (kept: an Executable, a Fallback or nothing)
            return record(handle, key, kernel, args), handle.executables.get(key)
        return executable.replay(args), executable

    def after(self, source: Any, gradient: Any, args: tuple[Any, ...], part: int = 0) -> Any:
        """``self(*args)`` for a backward operator called in the backward of a plain call whose
        forward ran as ``source`` (``executed``'s second value, kept on the autograd context):
        every argument but ``gradient`` is fixed by the forward's signature (its tensors, what it
        saved, its options), so the call runs on the forward's handle (``source.handle``) and keys
        on the kernel, ``source`` and the gradient's shape, strides and dtype alone (and ``part``,
        where one backward calls the operator twice), without the operator's schema key or handle
        rule. A call that is not plain (a mode, compiled autograd, autocast, a gradient through the
        backward, no source) is ``self(*args)``."""
        # (the other tensors are the forward's, plain where it has a source, or views of them)
        if (
            source is None
            or gradient.__class__ not in _PLAIN_TYPES
            or _INCLUDED_KEYS().raw_repr() & _PLAIN_INCLUDED
            or (self.autocast is not None and _any_autocast())
            or _is_compiling()
            or _profiler_enabled()
            or (_grad_enabled() and _any_requires_grad(*args))
        ):
            return self(*args)
        handle, kernel = source.handle, self.eager_kernel
        if handle.backend != "triton":  # (changed since the forward: its executables were dropped)
            return kernel(*args)
        key = (kernel, source, part, gradient.shape, gradient.stride(), gradient.dtype)
        executable = handle.executables.get(key)
        if executable is None:
            return record(handle, key, kernel, args)
        return executable.replay(args)

    def __repr__(self) -> str:
        return f"<opendnn operator {NAMESPACE}::{self.name}>"


def carries_tangent(args: tuple[Any, ...]) -> bool:
    """Whether a tensor among ``args`` carries a forward-mode tangent (torch.func.jvp,
    torch.autograd.forward_ad)."""
    if _forward_ad._current_level < 0:
        return False
    for arg in args:
        if isinstance(arg, _TENSOR) and _forward_ad.unpack_dual(arg).tangent is not None:
            return True
    return False


def refuse_tangents(name: str, args: tuple[Any, ...]) -> None:
    """Raise where ``args`` carry a forward-mode tangent: the operators' gradients are reverse-mode
    only, and their kernels would drop the tangent without a word."""
    if carries_tangent(args):
        raise as_torch_error(
            NotSupported(
                f"opendnn::{name} has no forward-mode derivative (torch.func.jvp, torch.autograd.forward_ad):"
                " its gradients are reverse-mode only"
            ),
            NotImplementedError,
        )


def signature_function(overload: torch._ops.OpOverload) -> Callable[..., tuple[Any, ...] | None]:
    """``key(kernel, *args)``: the key of a plain call of an operator's ``kernel`` on ``args``, made
    for the operator's schema: per tensor its shape, strides, dtype and device, and every other
    argument (a list as the tuple of its items); None where an argument is not of its schema's type
    (nor a float NaN: no key would ever find it again), and the call takes the full path. A function
    generated per schema: no loop and no test of a type the schema fixes. A tuple whose items passed
    once is kept (``checked``, by identity) and not tested again: opendnn.torch.functions passes the
    same resolved tuples on every call."""
    checked: dict[int, tuple[Any, ...]] = {}
    names: dict[str, Any] = {"items": _items, "checked": checked}
    parameters, checks, parts = [], [], []
    for k, argument in enumerate(overload._schema.arguments):
        name, kind = f"a{k}", str(argument.type)
        parameters.append(name)
        tensor = f"{name}.shape, {name}.stride(), {name}.dtype, {name}.device"
        if kind == "Tensor":
            parts.append(tensor)
        elif kind == "Optional[Tensor]":
            parts.append(f"None if {name} is None else ({tensor})")
        elif kind.startswith("List["):
            checks += [
                f"if checked.get(id({name})) is not {name}:",
                f"    {name} = items({name}, checked)",
                f"    if {name} is None:",
                "        return None",
            ]
            parts.append(name)
        else:
            scalar = kind.removeprefix("Optional[").removesuffix("]")
            names[f"classes{k}"] = _SCALARS[scalar] | ({type(None)} if kind.startswith("Optional[") else set())
            nan = f" or {name} != {name}" if scalar == "float" else ""
            checks += [f"if {name}.__class__ not in classes{k}{nan}:", "    return None"]
            parts.append(name)
    lines = [f"def key(kernel, {', '.join(parameters)}):", *(f"    {line}" for line in checks)]
    lines += [
        "    try:",
        f"        return (kernel, {', '.join(parts)})",
        "    except AttributeError:",
        "        return None",
    ]
    exec(compile("\n".join(lines) + "\n", f"<the key of opendnn::{overload._opname}>", "exec"), names)
    return names["key"]  # type: ignore[no-any-return]


def plain_tensors_function(overload: torch._ops.OpOverload) -> Callable[[tuple[Any, ...]], bool]:
    """``plain_tensors(args)``: whether each tensor argument of a call of an operator is a plain
    tensor (a tensor subclass, or anything else where the schema takes a tensor, sends the call to
    the registered operator), made for the operator's schema: a test per tensor position, no loop
    (batch norm's ten arguments: 0.16 us against 0.66). A call of another number of arguments is
    tested as a loop over them."""
    tests = []
    for k, argument in enumerate(overload._schema.arguments):
        kind = str(argument.type)
        if kind == "Tensor":
            tests.append(f"args[{k}].__class__ in plain")
        elif kind == "Optional[Tensor]":
            tests.append(f"(args[{k}] is None or args[{k}].__class__ in plain)")
    count = len(overload._schema.arguments)
    lines = [
        "def plain_tensors(args):",
        f"    if len(args) != {count}:",
        "        return loop(args)",
        f"    return {' and '.join(tests) or 'True'}",
    ]
    names: dict[str, Any] = {"plain": frozenset(_PLAIN_TYPES), "loop": _plain_tensors}
    exec(compile("\n".join(lines) + "\n", f"<the tensor test of opendnn::{overload._opname}>", "exec"), names)
    return names["plain_tensors"]  # type: ignore[no-any-return]


# the classes a schema's scalar type takes (an int where a float goes, a bool where an int goes)
_SCALARS = {
    "int": frozenset({int, bool}),
    "float": frozenset({float, int}),
    "bool": frozenset({bool}),
    "str": frozenset({str}),
}
_NUMBERS = frozenset({int, float, bool})


_CHECKED_LIMIT = 256  # tuples a key function keeps as checked; past it they are all dropped


def _items(value: Any, checked: dict[int, tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """A list argument as the tuple of its items (numbers that equal themselves), else None; a
    tuple that passes is kept in ``checked`` under its id (kept alive there: the id stays its own)."""
    if value.__class__ not in (list, tuple, torch.Size):
        return None
    for item in value:
        if item.__class__ not in _NUMBERS or item != item:
            return None
    if value.__class__ is not tuple:
        return tuple(value)
    if len(checked) >= _CHECKED_LIMIT:
        checked.clear()
    checked[id(value)] = value
    return value


SetupContext = Callable[[Any, tuple[Any, ...], Any], None]
_C_APPLY = torch._C._FunctionBase.__dict__["apply"]  # what Function.apply calls last
_ANY_ARGUMENTS = inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])


def register_autograd(operator: Operator, backward: Callable[..., Any], setup_context: SetupContext) -> None:
    """torch.library.register_autograd(op, backward, setup_context=setup_context), for torch.func too.

    The contract is torch.library's: ``setup_context(ctx, inputs, output)`` saves what the
    backward needs, ``backward(ctx, *output_grads)`` returns one gradient (or None) per input.
    ``backward`` runs where some output's gradient is defined: where none is (torch passes None
    for an output nothing flowed back to, as the contexts ask), no input gets a gradient, as from
    torch's own operators.
    torch.library's own registration (torch 2.13) wraps them in an autograd.Function without a
    ``setup_context`` staticmethod, which torch.func's transforms refuse. This one makes two
    autograd.Functions named after the operator (``opendnn::convolution`` -> ``ConvolutionBackward``
    in a graph), of one forward and one backward:

    - ``operator.function``, whose ``forward(ctx, *args)`` keeps the context itself: the
      operator's kernel at the Autograd key (tracing, fake tensors, modes) applies it; and
      ``operator.eager``, the same for the plain eager calls of ``Operator.__call__``, whose forward
      runs the call's executable without asking again whether the call is plain;
    - ``operator.transformable``, with a ``setup_context`` staticmethod and a generated vmap rule,
      which torch.func's transforms take: ``Operator.__call__`` applies it under a transform.
      Function.apply binds such a Function's arguments to its forward's signature on every call
      (about twice the cost of the other, docs/design/torch_integration.md), so eager calls avoid it.

    The forward calls the device kernel where the call is plain, else the operator again (below
    autograd: gradients are off inside a forward).
    """
    execute, executed, overload = operator.execute, operator.executed, operator.overload
    device_kernel, eager_kernel = operator.device_kernel, operator.eager_kernel

    def compute(*args: Any) -> Any:
        return execute(device_kernel, args) if plain(args) else overload(*args)

    # a stated signature spares Function.apply's inspect.signature parse of the forward each call
    compute.__signature__ = _ANY_ARGUMENTS  # type: ignore[attr-defined]

    nothing = (None,) * len(overload._schema.arguments)

    def gradients(ctx: Any, *grads: Any) -> Any:
        for grad in grads:  # (a loop: a generator costs a frame per call)
            if grad is not None:
                return backward(ctx, *grads)
        return nothing

    def keep(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.set_materialize_grads(False)
        ctx.source = None  # (the backward's calls key on the forward's own executable where there is one: after)
        setup_context(ctx, inputs, output)

    def forward(ctx: Any, *args: Any) -> Any:
        output = compute(*args)
        keep(ctx, args, output)
        return output

    def eager_forward(ctx: Any, *args: Any) -> Any:
        output, source = executed(eager_kernel, args)
        ctx.materialize_grads = False  # (what set_materialize_grads sets, without its frame)
        ctx.source = source
        setup_context(ctx, args, output)
        return output

    name = "".join(part.capitalize() for part in operator.name.split("_"))
    members = {"backward": staticmethod(gradients), "__module__": __name__}
    function: Any = type(
        name,
        (torch.autograd.Function,),
        {**members, "forward": staticmethod(forward), "__doc__": f"The autograd node of opendnn::{operator.name}."},
    )
    operator.function = function
    operator.eager = type(
        name,
        (torch.autograd.Function,),
        {**members, "forward": staticmethod(eager_forward), "__doc__": function.__doc__},
    )
    # Function.apply's Python binds arguments for a setup_context (this one has none) and unwraps
    # tensors leaked from finished torch.func transforms (which the plain calls' kernels, with or
    # without a gradient, do not take): its C entry applies the Function, 1.5 us less a call
    operator.apply = _C_APPLY.__get__(None, operator.eager)
    # the engine runs a node through its ``apply``, whose Python (BackwardCFunction's) looks up the
    # Function's backward and whether it takes its gradients boxed on every call: the eager
    # Function's nodes (a backward, unboxed) are the backward itself
    operator.eager._backward_cls.apply = gradients
    operator.transformable = type(
        name,
        (torch.autograd.Function,),
        {
            **members,
            "forward": staticmethod(compute),
            "setup_context": staticmethod(keep),
            "generate_vmap_rule": True,  # (under vmap, forward and backward call the operators' loop rules)
            "__doc__": f"The autograd node of opendnn::{operator.name} under torch.func's transforms.",
        },
    )

    def kernel(keyset: Any, *args: Any) -> Any:
        if _forward_ad._current_level >= 0:
            refuse_tangents(operator.name, args)
        if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
            return function.apply(*args)
        rest = keyset & _AFTER_AUTOGRAD
        if rest.highestPriorityTypeId() in _DEVICE_KEYS:
            return device_kernel(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(rest, *args)

    LIBRARY.impl(operator.name, kernel, "Autograd", with_keyset=True)


# ---- fake outputs -------------------------------------------------------------------------------------


def memory_order(tensor: torch.Tensor) -> list[int]:
    """``tensor``'s dims in memory order, outermost first: the largest stride first, ties in dim order
    (``core.arrays.memory_order``'s rule, uncached: a traced tensor's strides are symbolic, unhashable)."""
    strides = tensor.stride()
    return sorted(range(tensor.ndim), key=lambda k: -strides[k])


def empty_in_order(
    shape: Sequence[Any], order: Sequence[int], like: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A new packed tensor of ``shape`` with its dims laid out in ``order`` (outermost first), on
    ``like``'s device (``like``'s dtype by default)."""
    strides = strides_for_order(tuple(shape), tuple(order))
    return torch.empty_strided(tuple(shape), strides, dtype=dtype or like.dtype, device=like.device)


def empty_in_order_of(like: torch.Tensor, shape: Sequence[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new tensor of ``shape`` with its dims laid out in ``like``'s memory order (``memory_order``),
    as opendnn lays out the outputs that follow an input."""
    return empty_in_order(shape, memory_order(like), like, dtype)


def empty_packed(like: torch.Tensor, shape: Sequence[Any], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` on ``like``'s device (``like``'s dtype by default)."""
    return torch.empty(tuple(shape), dtype=dtype or like.dtype, device=like.device)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype opendnn keeps statistics in: float64 for float64 data, float32 for the others."""
    return torch.float64 if dtype == torch.float64 else torch.float32
