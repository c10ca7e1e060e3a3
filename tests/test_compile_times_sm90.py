"""The first calls that compiled longest, compiled for the H200 (sm_90) on the CPU with nothing cached
(benchmarks/compile_times.py; the table is in docs/design/convolution.md, Cold start): a 3-D convolution
with a 5 x 5 x 5 filter over 4 channels, each direction (its direct kernel unrolled 500 taps x channels:
minutes), and a 3-D adaptive max pooling's backward (its argmax pass and gather over cells of two sizes). Each
call's kernels must compile in under BOUND_SECONDS on this CPU. In a subprocess: triton must load
without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import sm90

BOUND_SECONDS = 20  # about 15x what they take (0.2-2.5 s), a fraction of what they took (10-470 s)
PROBLEMS = (
    "conv3d_5x5x5_c4k4_ncdhw_fp32_fwd",
    "conv3d_5x5x5_c4k4_ncdhw_fp32_bwd_data",
    "conv3d_5x5x5_c4k4_ncdhw_fp32_bwd_filter",
    "adaptive_max3d_7to5_ndhwc_bf16_bwd",
)


def test_the_slowest_first_calls_compile_in_seconds():
    completed = sm90.run_script(__file__, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    seconds = {name: float(value) for name, value in (line.split() for line in completed.stdout.splitlines())}
    assert sorted(seconds) == sorted(PROBLEMS)
    for name, spent in seconds.items():
        assert spent < BOUND_SECONDS, (name, spent)


def main() -> None:
    """Print each problem of PROBLEMS and the seconds its kernels take to compile for sm_90, nothing cached."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for row in compile_times.rows():
        if row.name in PROBLEMS:
            _, compiles = compile_times.distinct_compiles(row.problems(), backend)
            print(row.name, sum(compile_times.compile_sm90(item, target) for item in compiles), flush=True)


if __name__ == "__main__":
    main()
