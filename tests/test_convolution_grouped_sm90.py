"""The narrow-group kernels (triton_grouped) compiled for the H200 (sm_90) on the CPU at the tiles the
planner picks for ResNeXt- and RegNet-like layers, each direction: no register spills (but the TF32
tile's few bytes below), at most 255 registers a thread, and each kernel compiled in seconds (the Cold
start section of docs/design/convolution.md). In a subprocess: triton must load without its
interpreter (tests/sm90.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import sm90

BOUND_SECONDS = 20  # the cold-start bound of tests/test_compile_times_sm90.py
KERNELS = ("grouped_conv_kernel", "grouped_filter_kernel")
# A TF32 forward's or backward data's 128-pixel tile of 64-wide groups spills 32-56 bytes of its hoisted
# gather offsets; it ran 1.2-1.5x faster than 8 warps or 64 pixels without spills (docs/design/convolution.md)
TF32_SPILL_BYTES = 64
LAYERS = (  # name: (dtype, layout, channels in, channels out, groups, size, filter, stride, TF32)
    ("resnext_8", ("bfloat16", "channels_last", 256, 256, 32, 28, 3, 1, False)),
    ("regnet_16_s2", ("bfloat16", "channels_last", 128, 128, 8, 56, 3, 2, False)),
    ("in8_out16_fp32_nchw", ("float32", "channels_first", 64, 128, 8, 14, 5, 1, False)),
    ("regnety_56", ("bfloat16", "channels_last", 224, 224, 4, 28, 3, 1, False)),
    ("regnety_56_fp32_nchw", ("float32", "channels_first", 224, 224, 4, 28, 3, 1, False)),
    ("regnety_56_tf32_nchw", ("float32", "channels_first", 224, 224, 4, 28, 3, 1, True)),
)


def test_grouped_kernels_compile_in_seconds_without_spills():
    completed = sm90.run_script(__file__, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = [line.split() for line in completed.stdout.splitlines() if line.startswith("grouped_")]
    assert sorted((row[0], row[1], row[2]) for row in rows) == sorted(
        (kernel, name, direction)
        for name, _ in LAYERS
        for direction, kernel in zip(("forward", "backward_data", "backward_filter"), (*KERNELS[:1] * 2, KERNELS[1]))
    )
    for row in rows:
        registers, spills, seconds = int(row[-3]), int(row[-2]), float(row[-1])
        spill_bound = TF32_SPILL_BYTES if "tf32" in row[1] and row[0] == KERNELS[0] else 0
        assert spills <= spill_bound and registers <= 255 and seconds < BOUND_SECONDS, row


def main() -> None:
    """Print, per layer and direction, the grouped kernel, its registers a thread, bytes spilled and
    compile seconds for sm_90 with nothing cached."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    from opendnn.families.convolution.problem import ConvolutionDirection

    target, backend = sm90.target_or_exit()
    for name, (dtype, layout, c, k, groups, size, filt, stride, tf32) in LAYERS:
        for direction in ConvolutionDirection:
            dims = (size, size), (filt, filt)
            problem = compile_times.conv(direction, dtype, layout, 4, c, k, *dims, stride, groups, tf32)
            route, compiles = compile_times.distinct_compiles([problem], backend)
            assert route == "grouped", (name, direction, route)
            for item in compiles:
                if item.launch.kernel.__name__ not in KERNELS:
                    continue  # the pass that sums the backward filter's slices
                with tempfile.TemporaryDirectory() as folder:
                    ptx = Path(folder) / "kernel.ptx"
                    seconds = compile_times.compile_sm90(item, target, ptx)
                    registers, spills = sm90.ptxas_usage(ptx.read_text(), 90)
                print(item.launch.kernel.__name__, name, direction.name.lower(), registers, spills, f"{seconds:.2f}")


if __name__ == "__main__":
    main()
