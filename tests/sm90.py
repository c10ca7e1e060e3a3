"""Compile Triton kernels for the H200 (sm_90) on a machine without a GPU, specialized exactly as
Triton's own launcher specializes a call there (its binder: 16-byte aligned pointers and multiples of
16 marked, ints equal to 1 made constants). For scripts that tests run in a subprocess: triton must
load without its interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from opendnn.kernels.warmup import specialize  # noqa: F401  (the tests' name for it)

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


def run_script(path: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """The test script ``path`` run as a program with Triton's compiler (not its interpreter); the
    calling test is skipped, with the script's reason, where this machine cannot run ptxas."""
    import pytest

    completed = subprocess.run(
        [sys.executable, path],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TRITON_INTERPRET": "0"},
    )
    if completed.returncode == SKIP_STATUS:
        pytest.skip(completed.stdout.strip())
    return completed


def script_rows(path: str, timeout: int) -> list[list[str]]:
    """The lines the test script ``path`` prints, split at whitespace (``run_script``), once it has
    exited with 0."""
    completed = run_script(path, timeout)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return [line.split() for line in completed.stdout.splitlines()]


def ptxas_report(ptx: str, arch: int) -> str:
    """What ``ptxas -v`` says compiling ``ptx`` for sm_``arch`` (sm_90a on Hopper, where wgmma and
    setmaxnreg need the arch-specific target)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as folder:
        source, output = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
        with open(source, "w") as file:
            file.write(ptx)
        suffix = "a" if arch == 90 else ""
        report = subprocess.run(
            [get_ptxas(arch).path, f"-arch=sm_{arch}{suffix}", "-v", source, "-o", output],
            capture_output=True,
            text=True,
        )
    assert report.returncode == 0, report.stderr
    return report.stderr


def ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """(registers a thread, bytes spilled) that ptxas reports compiling ``ptx`` for sm_``arch``."""
    report = ptxas_report(ptx, arch)
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    assert registers and spills, report
    return int(registers.group(1)), int(spills.group(1))


def wgmma_serialized(ptx: str, arch: int) -> bool:
    """ptxas serializes the wgmma instructions of ``ptx`` (waits for each before issuing the next), as
    its "Potential Performance Loss" notes say."""
    return "wgmma.mma_async instructions are serialized" in ptxas_report(ptx, arch)


def warp_specialized_figures(compiled: Any) -> dict[str, Any]:
    """What a compiled warp-specialized Gluon kernel is made of: its name, its partitions' warps and
    total warps, asynchronous and synchronous wgmma ops, those whose A is a register tensor, shared
    memory loads and stores of register tensors, TMA loads, the setmaxnreg register counts and the
    shared memory bytes."""
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    return dict(
        kernel=compiled.metadata.name,
        partitions=[int(w) for w in re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir)],
        warps=compiled.metadata.num_warps,
        async_mma=len(re.findall(r"ttng\.warp_group_dot .*isAsync = true", ttgir)),
        synchronous_mma=len(re.findall(r"ttng\.warp_group_dot (?!.*isAsync = true)", ttgir)),
        a_from_registers=len(re.findall(r"ttng\.warp_group_dot %\S+, .*: tensor<", ttgir)),
        shared_loads=len(re.findall(r"ttg\.local_load ", ttgir)),
        shared_stores=len(re.findall(r"ttg\.local_store ", ttgir)),
        tma_loads=len(re.findall(r"ttng\.async_tma_copy_global_to_local ", ttgir)),
        registers=sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        shared=compiled.metadata.shared,
    )


def sass(cubin: bytes) -> str:
    """The SASS of a cubin (cuobjdump, shipped beside Triton's ptxas)."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as file:
            file.write(cubin)
        cuobjdump = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
        report = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    return report.stdout


def warp_specialized_report(
    kernel: Any, args: tuple[Any, ...], options: dict[str, Any], target: Any, backend: Any
) -> dict[str, Any]:
    """A warp-specialized Gluon kernel launched with ``args`` and ``options`` compiled for ``target``:
    ``warp_specialized_figures``, the wgmma instructions in the PTX, ptxas's registers a thread
    (``launch_registers``) and spilled bytes, and whether ptxas serialized the wgmmas."""
    specialized = specialize(kernel, args, options, backend)
    compiled = compile_sm90(kernel, *specialized[1:], specialized[0], target)
    ptx = compiled.asm["ptx"]
    registers, spilled = ptxas_usage(ptx, 90)
    return dict(
        **warp_specialized_figures(compiled),
        wgmma_instructions=len(re.findall(r"wgmma\.mma_async", ptx)),
        launch_registers=registers,
        spilled=spilled,
        serialized=wgmma_serialized(ptx, 90),
    )
