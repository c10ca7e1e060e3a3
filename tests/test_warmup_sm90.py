"""The warmup's compile pool (opendnn/kernels/warmup.py) for the H200 (sm_90) on the CPU: a pooling's
forward and backward and a 3x3 convolution's forward, planned as for an H200
(benchmarks/compile_times.py), compiled in two worker processes into an empty Triton cache; a second
warmup finds every kernel cached; and Triton's JIT, asked to compile the same launches for sm_90
(``JITFunction.warmup``, the launch path's own binder and cache lookup), finds each one in the cache
instead of compiling it: the ahead-of-time key is the launch's; and a compile for the GPU the process
runs on (a stand-in driver here) builds the kernel's launcher too. In a subprocess: triton must load
without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import sm90


def test_the_pool_compiles_what_the_launches_find_in_the_cache():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = json.loads(completed.stdout.splitlines()[-1])
    assert found["launches"] > found["distinct"] >= 3  # the problem list names each problem twice
    assert found["first"] == {"compiled": found["distinct"], "cached": 0, "processes": 2}
    assert found["second"] == {"compiled": 0, "cached": found["distinct"], "processes": 2}
    assert found["jit_cache_hits"] == [True] * found["distinct"]  # the JIT keeps each kernel after its first
    assert found["cache_entries_added_by_jit"] == 0
    # offline (no GPU driver) the pool builds no launcher; for the GPU it runs on, each kernel's own
    assert found["launchers_built_offline"] == 0
    assert found["launcher_built"] == [found["first_kernel"], found["first_signature"]]


class _Sm90Driver:
    """What Triton's JIT asks the active driver on a launch, answered as for an H200 (no GPU here)."""

    def __init__(self, target):
        self.target = target
        self.launchers = []  # (kernel name, signature) of each launcher asked for

    def launcher_cls(self, src, metadata):
        self.launchers.append([src.fn.__name__, dict(src.signature)])

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def main() -> None:
    """Print, as JSON, what the pool compiled, what the second pool found cached, and how many of the
    launches' JIT compiles found their kernel in the cache the pool filled."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="opendnn-warmup-sm90-")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package
    import torch
    import triton
    from triton.runtime import driver

    from opendnn.kernels.warmup import compile_all, compile_one, distinct_compiles

    target, _ = sm90.target_or_exit()
    problems = [
        compile_times.pool(compile_times.MAX, "float32", "channels_first", 2, 8, (8, 8), (3, 3), 2, 1, False),
        compile_times.pool(compile_times.MAX, "float32", "channels_first", 2, 8, (8, 8), (3, 3), 2, 1, True),
        compile_times.conv(compile_times.FWD, "bfloat16", "channels_last", 2, 16, 16, (8, 8), (3, 3)),
    ] * 2
    calls = []
    for problem in problems:
        _, planned, slots = compile_times.launches(problem)
        for launch in planned:
            args = tuple(torch.empty(64, dtype=slots[a.name]) if hasattr(a, "name") else a for a in launch.args)
            calls.append((launch.kernel, args, launch.options, launch.grid))
    compiles = distinct_compiles([call[:3] for call in calls], target)
    first, second = (compile_all(compiles, target, processes=2) for _ in range(2))
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    entries = set(cache.iterdir())
    stand_in = _Sm90Driver(target)
    driver.set_active(stand_in)
    hits: list[bool] = []  # per compile the JIT asks for: whether the cache held it
    triton.knobs.compilation.listener = lambda cache_hit, **_: hits.append(cache_hit)
    for kernel, args, options, grid in calls:
        kernel.warmup(*args, grid=grid, **options)
    found = {
        "launches": len(calls),
        "distinct": len(compiles),
        "first": {"compiled": first.compiled, "cached": first.cached, "processes": first.processes},
        "second": {"compiled": second.compiled, "cached": second.cached, "processes": second.processes},
        "jit_cache_hits": hits,
        "cache_entries_added_by_jit": len(set(cache.iterdir()) - entries),
        "launchers_built_offline": len(stand_in.launchers),
    }
    compile_one(compiles[0], target, True)
    found["launcher_built"] = stand_in.launchers[0]
    found["first_kernel"], found["first_signature"] = compiles[0].name, compiles[0].signature
    print(json.dumps(found))


if __name__ == "__main__":
    main()
