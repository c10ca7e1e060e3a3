"""The depthwise kernels past 9 taps compiled for the H200 (sm_90) on the CPU, as ConvNeXt's 7 x 7
depthwise layer (batch 64, 96 channels, 56 x 56) plans them in NHWC bfloat16 and NCHW float32: the
backward filter (``filter_depthwise_kernel``) and the forward and backward data
(``conv_depthwise_kernel``). Each keeps its accumulator in registers (no spills, at most MAX_REGISTERS
a thread, so that several programs share an SM) and compiles in seconds (the filter's sizes are
run-time values: no unrolled taps); channels-last activations load 16-byte channel vectors. In a
subprocess: triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import sm90

MAX_REGISTERS = 192  # at 192, two programs of 4 warps share an SM
MAX_SECONDS = 10
LAYOUTS = ("bfloat16 channels_last", "float32 channels_first")
KERNELS = (
    ("filter_depthwise_kernel", "BACKWARD_FILTER"),
    ("conv_depthwise_kernel", "FORWARD"),
    ("conv_depthwise_kernel", "BACKWARD_DATA"),
)
ROWS = [f"{name} {direction} {layout}" for name, direction in KERNELS for layout in LAYOUTS]


def test_depthwise_kernels_fit_the_register_file_and_compile_in_seconds():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split() for line in completed.stdout.splitlines()[-len(ROWS) :]]
    assert [" ".join(line[:4]) for line in lines] == ROWS
    for line in lines:
        registers, spills, seconds, vector_loads = int(line[4]), int(line[5]), float(line[6]), int(line[7])
        assert registers <= MAX_REGISTERS and spills == 0, line
        assert seconds < MAX_SECONDS, line
        if line[0] == "conv_depthwise_kernel" and line[3] == "channels_last":
            assert vector_loads > 0, line


def main() -> None:
    """Print, per kernel, direction and layout: registers, spilled bytes, compile seconds and the
    16-byte global loads in its PTX."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for name, direction in KERNELS:
        for layout in LAYOUTS:
            dtype, order = layout.split()
            problem = compile_times.conv(
                compile_times.ConvolutionDirection[direction], dtype, order, 64, 96, 96, (56, 56), (7, 7), 1, 96
            )
            _, compiles = compile_times.distinct_compiles([problem], backend)
            (item,) = [item for item in compiles if item.name == name]
            with tempfile.TemporaryDirectory() as folder:
                ptx = Path(folder) / "kernel.ptx"
                seconds = compile_times.compile_sm90(item, target, ptx)  # nothing cached
                text = ptx.read_text()
                registers, spills = sm90.ptxas_usage(text, 90)
            vector_loads = len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", text))
            print(name, direction, layout, registers, spills, f"{seconds:.2f}", vector_loads, flush=True)


if __name__ == "__main__":
    main()
