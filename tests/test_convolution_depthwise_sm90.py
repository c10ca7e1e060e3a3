"""The depthwise backward-filter kernel (``filter_depthwise_kernel``) compiled for the H200 (sm_90) on
the CPU, as ConvNeXt's 7 x 7 depthwise layer (batch 64, 96 channels, 56 x 56) plans it in NHWC
bfloat16 and NCHW float32: its taps x pixels x channels accumulator stays in registers (no spills,
at most MAX_REGISTERS a thread, so that several programs share an SM) and it compiles in seconds
(the filter's sizes are run-time values: no unrolled taps). In a subprocess: triton must load without
its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import sm90

MAX_REGISTERS = 192  # the accumulator is 64 a thread; at 192, two programs of 4 warps share an SM
MAX_SECONDS = 10
LAYOUTS = ("bfloat16 channels_last", "float32 channels_first")


def test_depthwise_filter_kernel_fits_the_register_file_and_compiles_in_seconds():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split() for line in completed.stdout.splitlines()[-len(LAYOUTS) :]]
    assert [" ".join(line[:3]) for line in lines] == [f"filter_depthwise_kernel {layout}" for layout in LAYOUTS]
    for line in lines:
        registers, spills, seconds = int(line[3]), int(line[4]), float(line[5])
        assert registers <= MAX_REGISTERS and spills == 0, line
        assert seconds < MAX_SECONDS, line


def main() -> None:
    """Print, per layout: the kernel's name, dtype, layout, registers, spilled bytes, compile seconds."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for layout in LAYOUTS:
        dtype, order = layout.split()
        problem = compile_times.conv(compile_times.FILTER, dtype, order, 64, 96, 96, (56, 56), (7, 7), 1, 96)
        _, compiles = compile_times.distinct_compiles([problem], backend)
        (item,) = [item for item in compiles if item.name == "filter_depthwise_kernel"]
        with tempfile.TemporaryDirectory() as folder:
            ptx = Path(folder) / "kernel.ptx"
            seconds = compile_times.compile_sm90(item, target, ptx)  # nothing cached
            registers, spills = sm90.ptxas_usage(ptx.read_text(), 90)
        print(item.name, layout, registers, spills, f"{seconds:.2f}", flush=True)


if __name__ == "__main__":
    main()
