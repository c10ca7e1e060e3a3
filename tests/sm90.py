"""Compile Triton kernels for the H200 (sm_90) on a machine without a GPU, specialized exactly as
Triton's own launcher specializes a call there (its binder: 16-byte aligned pointers and multiples of
16 marked, ints equal to 1 made constants). For scripts that tests run in a subprocess: triton must
load without its interpreter."""

from __future__ import annotations

import sys
from typing import Any

SKIP_STATUS = 77  # a script's exit status when this machine cannot run Triton's CUDA compiler


def target_or_exit(arch: int = 90) -> tuple[Any, Any]:
    """(the sm_``arch`` target, its compiler backend); exits with SKIP_STATUS, saying why, where ptxas
    cannot run."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", arch, 32)
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        backend = make_backend(target)
        get_ptxas(arch)
    except (ImportError, RuntimeError) as error:
        print(f"Triton's CUDA compiler cannot run here: {error}")
        sys.exit(SKIP_STATUS)
    return target, backend


def specialize(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any) -> tuple[Any, ...]:
    """(options, signature, constexprs, attrs) of ``kernel[grid](*args, **kwargs)`` as Triton's
    launcher derives them from the call's values."""
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    return kernel._pack_args(backend, kwargs, bound, specialization, options)


def compile_sm90(
    kernel: Any, signature: dict[str, Any], constexprs: dict[Any, Any], attrs: dict[Any, Any], options: Any, target: Any
) -> Any:
    """The kernel (a ``@triton.jit`` or a ``@gluon.jit`` one) compiled down to a cubin for ``target``."""
    import triton
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    source_type = GluonASTSource if kernel.is_gluon() else ASTSource
    source = source_type(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=target, options=options.__dict__)
