"""Choosing a convolution algorithm, as cuDNN's Get (heuristics) and Find (measurement) calls.

``get_convolution_*_algorithm`` ranks every algorithm of a direction without running anything;
``find_convolution_*_algorithm`` runs each one that applies on the caller's tensors and ranks them
by measured time. Both return ``ConvolutionAlgorithmPerf`` records, the usable ones first. Find's
results are cached per problem in the handle (``handle.algorithm_cache``) and in a JSON file shared
by processes: ``cache_path`` argument, else the ``OPENDNN_ALGORITHM_CACHE`` environment variable,
else ``convolution_algorithms.json`` in the user's cache folder (``default_cache_file``); "" turns
the file off. The file is updated under an exclusive lock (filelock's when installed, else fcntl's
where it exists, else none) and replaced atomically; a corrupt or unreadable file counts as empty.
A problem's key holds the opendnn and Triton versions and the device's name, so an entry measured
by another version or on another GPU is never reused.

Heuristics: DIRECT first for depthwise and few-channel problems, then IMPLICIT_GEMM (no workspace),
IMPLICIT_PRECOMP_GEMM, GEMM (im2col); an algorithm that does not apply, whose workspace passes the
handle's ``workspace_limit``, or that is not deterministic on a deterministic handle gets status
NOT_SUPPORTED and its reason. A backend module that has non-deterministic algorithms says so with
``deterministic(problem) -> bool``; without one, every algorithm of that backend is deterministic
(the case of both backends: no kernel uses atomics). A backend module that runs an algorithm on a
route the ones ranked before it cannot take says so with ``preferred(problem) -> bool`` (the Triton
backend: an IMPLICIT_PRECOMP_GEMM forward reading TF32 copies staged in its workspace): Get ranks
those first, and a Pythonic call that names no algorithm takes the first the handle admits
(``default_algorithm``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib.metadata
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from opendnn._version import __version__
from opendnn.core.arrays import CPU, Bound, allocate_bytes, bind, bind_bytes
from opendnn.core.cache_folder import user_cache_folder
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch, load_backend
from opendnn.core.errors import OpenDnnError, Status
from opendnn.core.handle import Handle, MathType
from opendnn.families.convolution.api import allows_tf32
from opendnn.families.convolution.problem import (
    ALGORITHMS,
    ConvolutionDescriptor,
    ConvolutionDirection,
    ConvolutionMethod,
    ConvolutionProblem,
    FilterDescriptor,
    convolution_problem,
    method_of,
)

Filter = FilterDescriptor | TensorDescriptor
CACHE_ENV = "OPENDNN_ALGORITHM_CACHE"
CACHE_FILE_NAME = "convolution_algorithms.json"
FIND_REPETITIONS = 3
_HEURISTIC_ORDER = (
    ConvolutionMethod.DIRECT,
    ConvolutionMethod.IMPLICIT_GEMM,
    ConvolutionMethod.IMPLICIT_PRECOMP_GEMM,
    ConvolutionMethod.GEMM,
)


@dataclass(frozen=True)
class ConvolutionAlgorithmPerf:
    """One algorithm's record (cuDNN's cudnnConvolution*AlgoPerf_t).

    Attributes:
        algo: the algorithm's enum member.
        status: Status.SUCCESS when it can run this problem, else NOT_SUPPORTED (see ``reason``).
        time: measured milliseconds (Find), -1.0 when not measured (Get or not supported).
        memory: workspace bytes it needs.
        deterministic: bitwise repeatable results.
        math_type: TENSOR_OP when it may use TF32, else FMA.
        reason: why it cannot run, "" when it can.
    """

    algo: enum.Enum
    status: Status
    time: float
    memory: int
    deterministic: bool
    math_type: MathType
    reason: str = ""


# ---- Get: heuristics -----------------------------------------------------------------------------


def get_convolution_forward_algorithm(
    handle: Handle,
    x_desc: TensorDescriptor,
    w_desc: Filter,
    conv_desc: ConvolutionDescriptor,
    y_desc: TensorDescriptor,
    requested_count: int | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Every ConvolutionFwdAlgo ranked by heuristics, usable ones first (nothing runs)."""
    return _ranked(
        handle, _problems(handle, ConvolutionDirection.FORWARD, conv_desc, x_desc, w_desc, y_desc), requested_count
    )


def get_convolution_backward_data_algorithm(
    handle: Handle,
    w_desc: Filter,
    dy_desc: TensorDescriptor,
    conv_desc: ConvolutionDescriptor,
    dx_desc: TensorDescriptor,
    requested_count: int | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Every ConvolutionBwdDataAlgo ranked by heuristics, usable ones first (nothing runs)."""
    problems = _problems(handle, ConvolutionDirection.BACKWARD_DATA, conv_desc, dx_desc, w_desc, dy_desc)
    return _ranked(handle, problems, requested_count)


def get_convolution_backward_filter_algorithm(
    handle: Handle,
    x_desc: TensorDescriptor,
    dy_desc: TensorDescriptor,
    conv_desc: ConvolutionDescriptor,
    dw_desc: Filter,
    requested_count: int | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Every ConvolutionBwdFilterAlgo ranked by heuristics, usable ones first (nothing runs)."""
    problems = _problems(handle, ConvolutionDirection.BACKWARD_FILTER, conv_desc, x_desc, dw_desc, dy_desc)
    return _ranked(handle, problems, requested_count)


def _problems(
    handle: Handle,
    direction: ConvolutionDirection,
    conv_desc: ConvolutionDescriptor,
    x_desc: TensorDescriptor,
    w_desc: Filter,
    y_desc: TensorDescriptor,
) -> list[ConvolutionProblem]:
    names = {
        ConvolutionDirection.FORWARD: ("x_desc", "w_desc", "y_desc"),
        ConvolutionDirection.BACKWARD_DATA: ("dx_desc", "w_desc", "dy_desc"),
        ConvolutionDirection.BACKWARD_FILTER: ("x_desc", "dw_desc", "dy_desc"),
    }[direction]
    tf32 = allows_tf32(handle, conv_desc)
    return [
        convolution_problem(direction, conv_desc, x_desc, w_desc, y_desc, algo=algo, allow_tf32=tf32, names=names)
        for algo in ALGORITHMS[direction]
    ]


def _record(handle: Handle, problem: ConvolutionProblem, time_ms: float = -1.0) -> ConvolutionAlgorithmPerf:
    backend = load_backend("convolution", handle.backend, handle.device)
    reason = backend.supports(problem)
    memory = backend.workspace_size(problem) if reason is None else 0
    deterministic = bool(getattr(backend, "deterministic", lambda p: True)(problem))
    limit = handle.workspace_limit
    if reason is None and limit is not None and memory > limit:
        reason = f"workspace of {memory} bytes exceeds handle.workspace_limit={limit}"
    if reason is None and handle.deterministic and not deterministic:
        reason = "not deterministic, and the handle asks for deterministic algorithms"
    status = Status.SUCCESS if reason is None else Status.NOT_SUPPORTED
    math_type = MathType.TENSOR_OP if problem.allow_tf32 else MathType.FMA
    return ConvolutionAlgorithmPerf(
        problem.algo, status, time_ms if reason is None else -1.0, memory, deterministic, math_type, reason or ""
    )


def _rank(problem: ConvolutionProblem) -> int:
    method = method_of(problem.algo)
    return _HEURISTIC_ORDER.index(method) if method in _HEURISTIC_ORDER else len(_HEURISTIC_ORDER)


def _preference(handle: Handle) -> Callable[[ConvolutionProblem], bool]:
    """The handle's backend's ``preferred`` (none preferred where it has none)."""
    backend = load_backend("convolution", handle.backend, handle.device)
    return getattr(backend, "preferred", lambda problem: False)  # type: ignore[no-any-return]


def _ranked(
    handle: Handle, problems: list[ConvolutionProblem], requested_count: int | None
) -> list[ConvolutionAlgorithmPerf]:
    preferred = _preference(handle)
    records = [_record(handle, p) for p in sorted(problems, key=lambda p: (not preferred(p), _rank(p)))]
    records.sort(key=lambda r: r.status is not Status.SUCCESS)  # stable: heuristic order within each
    return records[:requested_count]


def default_algorithm(handle: Handle, problem: ConvolutionProblem) -> ConvolutionProblem:
    """``problem``, built with its direction's default algorithm (IMPLICIT_GEMM, ALGO_0), with the
    algorithm a call that names none takes on ``handle``: the first algorithm the backend prefers
    (``preferred``: its route is one the default cannot take) that the handle admits (workspace limit,
    determinism), else the default. On the Triton backend a TF32 forward over NCHW x (or a KCRS
    filter) thus takes IMPLICIT_PRECOMP_GEMM, whose workspace holds the copies the TMA route reads."""
    preferred = _preference(handle)
    for algo in ALGORITHMS[problem.direction]:
        candidate = dataclasses.replace(problem, algo=algo)
        if algo is not problem.algo and preferred(candidate) and _record(handle, candidate).status is Status.SUCCESS:
            return candidate
    return problem


# ---- Find: measurement ---------------------------------------------------------------------------


def find_convolution_forward_algorithm(
    handle: Handle,
    x_desc: TensorDescriptor,
    x: Any,
    w_desc: Filter,
    w: Any,
    conv_desc: ConvolutionDescriptor,
    y_desc: TensorDescriptor,
    y: Any,
    requested_count: int | None = None,
    cache_path: str | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Run every applicable ConvolutionFwdAlgo on these tensors (y is overwritten) and rank them
    by measured time; workspaces are allocated here, within the handle's workspace_limit."""
    problems = _problems(handle, ConvolutionDirection.FORWARD, conv_desc, x_desc, w_desc, y_desc)
    tensors = (bind("x", x_desc, x), bind("w", problems[0].w, w), bind("y", y_desc, y, output=True))
    return _find(handle, problems, tensors, requested_count, cache_path)


def find_convolution_backward_data_algorithm(
    handle: Handle,
    w_desc: Filter,
    w: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    conv_desc: ConvolutionDescriptor,
    dx_desc: TensorDescriptor,
    dx: Any,
    requested_count: int | None = None,
    cache_path: str | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Find for backward data (dx is overwritten); see ``find_convolution_forward_algorithm``."""
    problems = _problems(handle, ConvolutionDirection.BACKWARD_DATA, conv_desc, dx_desc, w_desc, dy_desc)
    tensors = (bind("dx", dx_desc, dx, output=True), bind("w", problems[0].w, w), bind("dy", dy_desc, dy))
    return _find(handle, problems, tensors, requested_count, cache_path)


def find_convolution_backward_filter_algorithm(
    handle: Handle,
    x_desc: TensorDescriptor,
    x: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    conv_desc: ConvolutionDescriptor,
    dw_desc: Filter,
    dw: Any,
    requested_count: int | None = None,
    cache_path: str | None = None,
) -> list[ConvolutionAlgorithmPerf]:
    """Find for backward filter (dw is overwritten); see ``find_convolution_forward_algorithm``."""
    problems = _problems(handle, ConvolutionDirection.BACKWARD_FILTER, conv_desc, x_desc, dw_desc, dy_desc)
    tensors = (bind("x", x_desc, x), bind("dw", problems[0].w, dw, output=True), bind("dy", dy_desc, dy))
    return _find(handle, problems, tensors, requested_count, cache_path)


def _find(
    handle: Handle,
    problems: list[ConvolutionProblem],
    tensors: tuple[Bound, Bound, Bound],
    requested_count: int | None,
    cache_path: str | None,
) -> list[ConvolutionAlgorithmPerf]:
    key = _cache_key(handle, problems[0])
    path = _cache_file(cache_path)
    cached = handle.algorithm_cache.get(key)
    if cached is None and path is not None:
        cached = _read_records(path).get(key)
        cached = [_from_json(problems[0].direction, r) for r in cached] if cached else None
    if cached is None:
        cached = sorted(
            (_measure(handle, p, tensors) for p in problems), key=lambda r: (r.status is not Status.SUCCESS, r.time)
        )
        if path is not None:
            _write_record(path, key, [_to_json(r) for r in cached])
    handle.algorithm_cache[key] = cached
    return list(cached[:requested_count])


def _measure(
    handle: Handle, problem: ConvolutionProblem, tensors: tuple[Bound, Bound, Bound]
) -> ConvolutionAlgorithmPerf:
    record = _record(handle, problem)
    if record.status is not Status.SUCCESS:
        return record
    x, w, y = tensors
    workspace = (
        bind_bytes("workspace", allocate_bytes(x, record.memory), record.memory, "the algorithm")
        if record.memory
        else None
    )

    def run() -> None:
        dispatch(handle, "convolution", problem, x, w, y, None, None, workspace)

    try:
        run()  # warm-up: compilation
        times = [_timed(handle, run) for _ in range(FIND_REPETITIONS)]
    except OpenDnnError as error:
        return ConvolutionAlgorithmPerf(
            problem.algo, error.status, -1.0, record.memory, record.deterministic, record.math_type, str(error)
        )
    return ConvolutionAlgorithmPerf(
        problem.algo, Status.SUCCESS, statistics.median(times), record.memory, record.deterministic, record.math_type
    )


def _timed(handle: Handle, run: Callable[[], None]) -> float:
    """Milliseconds of one run: CUDA events on the handle's stream, else the wall clock."""
    if handle.device == CPU:
        start = time.perf_counter()
        run()
        return (time.perf_counter() - start) * 1e3
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with handle.launching():
        begin.record()
    run()
    with handle.launching():
        end.record()
    end.synchronize()
    return float(begin.elapsed_time(end))


# ---- the caches ----------------------------------------------------------------------------------


def _cache_key(handle: Handle, problem: ConvolutionProblem) -> str:
    device = handle.device
    if device != CPU:
        import torch

        device = torch.cuda.get_device_name(device)
    parts = [
        f"opendnn{__version__}",
        f"triton{_triton_version()}",
        problem.direction.value,
        handle.backend,
        device,
        str(problem.x),
        str(problem.w),
        str(problem.y),
        f"pre{list(problem.pre_padding)}",
        f"post{list(problem.post_padding)}",
        f"stride{list(problem.stride)}",
        f"dilation{list(problem.dilation)}",
        f"groups{problem.groups}",
        f"flip{problem.flip}",
        f"tf32{problem.allow_tf32}",
        f"limit{handle.workspace_limit}",
        f"det{handle.deterministic}",
    ]
    return "|".join(parts)


@functools.cache
def _triton_version() -> str:
    """The installed Triton's version, read without importing it ("none" when it is absent)."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def default_cache_file() -> Path:
    """``convolution_algorithms.json`` in opendnn's user cache folder (``$OPENDNN_CACHE_DIR`` or the
    platform's, ``opendnn.core.cache_folder``)."""
    return user_cache_folder() / CACHE_FILE_NAME


def _cache_file(cache_path: str | None) -> Path | None:
    text = cache_path if cache_path is not None else os.environ.get(CACHE_ENV)
    if text is None:
        return default_cache_file()
    return Path(text).expanduser() if text else None


def _to_json(record: ConvolutionAlgorithmPerf) -> dict[str, Any]:
    fields = asdict(record)
    fields.update(algo=record.algo.name, status=record.status.name, math_type=record.math_type.name)
    return fields


def _from_json(direction: ConvolutionDirection, fields: dict[str, Any]) -> ConvolutionAlgorithmPerf:
    return ConvolutionAlgorithmPerf(
        ALGORITHMS[direction][fields["algo"]],
        Status[fields["status"]],
        float(fields["time"]),
        int(fields["memory"]),
        bool(fields["deterministic"]),
        MathType[fields["math_type"]],
        str(fields.get("reason", "")),
    )


def _read_records(path: Path) -> dict[str, Any]:
    """The file's records, or {} when it is missing, unreadable or corrupt."""
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sibling lock file: filelock's (every platform) when installed,
    else fcntl's advisory lock where it exists, else none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_suffix(path.suffix + ".lock")
    try:
        import filelock
    except ImportError:
        with _fcntl_locked(lock_path):
            yield
        return
    with filelock.FileLock(lock_path):
        yield


@contextlib.contextmanager
def _fcntl_locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as lock:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_record(path: Path, key: str, records: list[dict[str, Any]]) -> None:
    """Add one problem's records to the file: read, update and atomically replace it under the lock.
    A file that cannot be written leaves the in-handle cache as the only one."""
    try:
        with _locked(path):
            everything = _read_records(path)
            everything[key] = records
            temporary = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")
            temporary.write_text(json.dumps(everything, indent=1))
            os.replace(temporary, path)
    except OSError:
        pass
