"""Compiling a call's kernels ahead of its first launch, in parallel processes.

A launch's first call compiles its kernel: Triton's JIT binds the arguments (``binder``: each
pointer marked 16-byte aligned or not, each int a multiple of 16 or equal to 1), packs them into
(options, signature, constexprs, attrs) and compiles that source for the current GPU, keeping the
result in its on-disk cache (``TRITON_CACHE_DIR``) under a key of the source, the target, the
options and the environment. ``specialize`` derives the same four from a launch's arguments
through Triton's own binder and packer, so a ``KernelCompile`` compiled here, in any process, is
the entry the JIT looks up on the real launch and finds on disk instead of compiling it again.

``distinct_compiles`` keeps one ``KernelCompile`` per kernel and specialization (a network
launches the same few kernels with the same constexprs many times); ``compile_all`` compiles
them in a pool of processes, each on a CPU core (ptxas included, no GPU needed), and reports how
many were compiled and how many the cache held already. docs/design/launch.md, "Warmup".
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KernelCompile:
    """One distinct kernel of a call, as Triton's JIT specializes it: the ``@triton.jit`` (or
    ``@gluon.jit``) function by module and name (what a worker process imports), and the (options,
    signature, constexprs, attrs) of ``specialize``."""

    module: str
    name: str
    options: Any  # the backend's options (CUDAOptions)
    signature: dict[str, Any]
    constexprs: dict[Any, Any]
    attrs: dict[Any, Any]

    def kernel(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)


@dataclass(frozen=True)
class WarmupReport:
    """What a warmup did: ``compiled`` kernels compiled now, ``cached`` ones the cache held already,
    the ``seconds`` it took from the first compile to the last, and the ``processes`` that compiled."""

    compiled: int
    cached: int
    seconds: float
    processes: int

    def __str__(self) -> str:
        return (
            f"{self.compiled + self.cached} distinct kernels: {self.compiled} compiled, {self.cached} "
            f"found cached, in {self.seconds:.1f} s on {self.processes} processes"
        )


def specialize(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any) -> tuple[Any, ...]:
    """(options, signature, constexprs, attrs) of ``kernel[grid](*args, **kwargs)`` as Triton's
    launcher derives them from the call's values for ``backend`` (``JITFunction.run``: its binder,
    then ``_pack_args``)."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    return kernel._pack_args(backend, kwargs, bound, specialization, options)  # type: ignore[no-any-return]


def distinct_compiles(calls: Iterable[tuple[Any, tuple[Any, ...], dict[str, Any]]], target: Any) -> list[KernelCompile]:
    """The distinct kernels that ``calls``, each (kernel, its arguments, its keyword arguments), compile
    for ``target`` (a ``triton.backends.compiler.GPUTarget``), in the order first met."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    found: dict[tuple[str, str, str], KernelCompile] = {}
    for kernel, args, kwargs in calls:
        options, signature, constexprs, attrs = specialize(kernel, args, kwargs, backend)
        key = (kernel.fn.__module__, kernel.fn.__name__, repr((options, signature, constexprs, attrs)))
        if key not in found:
            found[key] = KernelCompile(key[0], key[1], options, signature, constexprs, attrs)
    return list(found.values())


def current_target() -> Any:
    """The GPUTarget of the current CUDA device (what the JIT compiles for)."""
    from triton.runtime import driver

    return driver.active.get_current_target()


def compile_all(compiles: list[KernelCompile], target: Any, processes: int | None = None) -> WarmupReport:
    """Compile each of ``compiles`` for ``target`` into Triton's on-disk cache, in ``processes``
    worker processes (default: one per CPU core, at most one per kernel); for the GPU this process
    runs on, each kernel's launcher too (``compile_one``)."""
    workers = max(1, min(processes or os.cpu_count() or 1, len(compiles)))
    launchers = _gpu_target() == target
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable; spawn starts clean
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_compiler_process) as pool:
        hits = list(pool.map(compile_one, compiles, [target] * len(compiles), [launchers] * len(compiles)))
    return WarmupReport(hits.count(False), hits.count(True), time.perf_counter() - start, workers)


def _gpu_target() -> Any:
    """The current GPU's target, or None where Triton has no active GPU driver (compiling offline)."""
    try:
        return current_target()
    except RuntimeError:
        return None


def _compiler_process() -> None:
    """A worker compiles: Triton must load without its interpreter (a parent's test run sets it)."""
    os.environ["TRITON_INTERPRET"] = "0"


def compile_one(item: KernelCompile, target: Any, launcher: bool) -> bool:
    """Compile ``item`` for ``target`` into Triton's cache, as the JIT compiles it; True when the
    cache held it already. With ``launcher``, also build the C launcher the JIT's first launch of the
    kernel builds: a module per distinct signature, compiled by the host's C compiler (about a
    second each) and cached beside the kernels; it needs the GPU's driver, so only for the GPU this
    process runs on."""
    import triton
    from triton.compiler import ASTSource

    kernel = item.kernel()
    if kernel.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    else:
        source_type = ASTSource
    hit: list[bool] = []
    triton.knobs.compilation.listener = lambda cache_hit, **_: hit.append(cache_hit)
    try:
        source = source_type(fn=kernel, signature=item.signature, constexprs=item.constexprs, attrs=item.attrs)
        compiled = triton.compile(source, target=target, options=item.options.__dict__)
    finally:
        triton.knobs.compilation.listener = None
    if launcher:
        from triton.runtime import driver

        driver.active.launcher_cls(compiled.src, compiled.metadata)
    return hit == [True]
