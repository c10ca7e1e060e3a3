"""The depthwise kernels compiled for the H200 (sm_90) on the CPU. As ConvNeXt's 7 x 7 depthwise layer
(batch 64, 96 channels, 56 x 56) plans them: the NCHW float32 backward filter (``filter_depthwise_kernel``)
and the forward and backward data in NCHW float32 (``conv_depthwise_kernel``) and NHWC bfloat16
(``conv_depthwise_rows_kernel``, runs of 14 output pixels), with the filter read in place
(IMPLICIT_GEMM, ALGO_0) and packed tap-major in the workspace (IMPLICIT_PRECOMP_GEMM, ALGO_1), each
with its accumulator in registers (no spills, at most MAX_REGISTERS a thread, so that several programs
share an SM; the rows kernel's run of sums takes more: ROWS_KERNEL_REGISTERS), compiled in seconds (at
most the filter's width unrolled), channels-last activations in 16-byte channel vectors, the run's
window of input columns loaded once a filter row, and a channels-last packed filter's column in one
16-byte load a thread and tap. And the NHWC backward filter (``filter_depthwise_rows_kernel``, one
compile per filter width) of a 7 x 7, a 5 x 5 and a 3 x 3 layer in bfloat16 and two in float32,
its walk along the output rows counted in the SASS. In a subprocess: triton must load without its
interpreter (tests/sm90.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
import time
from pathlib import Path

import sm90

from opendnn.families.convolution.problem import ConvolutionBwdDataAlgo, ConvolutionFwdAlgo

MAX_REGISTERS = 192  # at 192, two programs of 4 warps share an SM
MAX_SECONDS = 10
BFLOAT16_NHWC, FLOAT32_NCHW = "bfloat16 channels_last", "float32 channels_first"
DATA_KERNEL = {BFLOAT16_NHWC: "conv_depthwise_rows_kernel", FLOAT32_NCHW: "conv_depthwise_kernel"}
# conv_depthwise_rows_kernel: a run's sums (14 pixels x 8 channels a thread), the filter row's 7 columns
# and the window's columns in flight take up to the whole register file of a thread (two programs of 4
# warps an SM). In place, a filter column is 8 scalar loads; the run spills up to SPILLED_IN_PLACE bytes
# there and was still faster than runs of 7 or 8 that do not (99 against 100 us at this layer, 44 against
# 57 us at EfficientNet's 5 x 5 layer of 240 channels).
ROWS_KERNEL_REGISTERS = 255
SPILLED_IN_PLACE = 64
RUN = 14  # 56 output pixels a row, runs of at most 16
ROWS = [
    f"filter_depthwise_kernel BACKWARD_FILTER {FLOAT32_NCHW} in_place",  # NHWC: filter_depthwise_rows_kernel
    *(
        f"{DATA_KERNEL[layout]} {direction} {layout} {filt}"
        for direction in ("FORWARD", "BACKWARD_DATA")
        for layout in (BFLOAT16_NHWC, FLOAT32_NCHW)
        for filt in ("in_place", "packed")
    ),
]
PACKED_ALGORITHM = {"FORWARD": ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, "BACKWARD_DATA": ConvolutionBwdDataAlgo.ALGO_1}
FILTER_TAPS = 7  # the width of the filter compiled: a channels-last packed filter's row is unrolled
# filter_depthwise_rows_kernel, NHWC, per filter width and dtype: the layer (C = K, H = W, stride) it is
# compiled for and the channels a thread holds in the planned tile (16 bytes of them)
ROWS_LAYERS = {
    (7, "bfloat16"): (96, 56, 1, 8),
    (5, "bfloat16"): (240, 28, 1, 8),
    (3, "bfloat16"): (256, 28, 1, 8),
    (7, "float32"): (96, 56, 1, 4),
    (5, "float32"): (144, 56, 2, 4),
}
ROWS_MIN_FMA_SHARE = 0.3  # FFMA among the walk's instructions (measured 0.30-0.50)


def test_depthwise_rows_filter_walk_is_fmas_and_two_loads_a_step():
    """The walk along an output row, WIDTH steps unrolled (the innermost loop of the SASS): WIDTH x WIDTH
    x channels FFMAs, one dy and `stride` x loads a step (the next steps' loads, in flight across the
    loop's back edge), no spills."""
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split() for line in completed.stdout.splitlines() if line.startswith("rows")]
    assert [(int(line[1]), line[2]) for line in lines] == list(ROWS_LAYERS)
    for line in lines:
        width, dtype = int(line[1]), line[2]
        registers, spills, seconds, instructions, fmas, loads = map(float, line[3:])
        assert registers <= ROWS_KERNEL_REGISTERS and spills == 0, line
        assert seconds < MAX_SECONDS, line
        stride = ROWS_LAYERS[width, dtype][2]
        assert fmas == width * width * ROWS_LAYERS[width, dtype][3] and loads == (1 + stride) * width, line
        assert fmas / instructions >= ROWS_MIN_FMA_SHARE, line


def test_depthwise_kernels_fit_the_register_file_and_compile_in_seconds():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split() for line in completed.stdout.splitlines() if not line.startswith("rows")]
    assert [" ".join(line[:5]) for line in lines] == ROWS
    for line in lines:
        registers, spills, seconds, vector_loads = int(line[5]), int(line[6]), float(line[7]), int(line[8])
        assert seconds < MAX_SECONDS, line
        if line[0] != "conv_depthwise_rows_kernel":
            assert registers <= MAX_REGISTERS and spills == 0, line
            continue
        assert registers <= ROWS_KERNEL_REGISTERS and spills <= (0 if line[4] == "packed" else SPILLED_IN_PLACE), line
        # one filter row: the window's RUN + 6 input columns, one 16-byte vector a thread each (32 runs x 32
        # channels over 128 threads), and packed, the row's 7 filter columns
        assert vector_loads == RUN + FILTER_TAPS - 1 + (FILTER_TAPS if line[4] == "packed" else 0), line


def main() -> None:
    """Print, per kernel, direction and layout: registers, spilled bytes, compile seconds and the
    16-byte global loads in its PTX."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for row in ROWS:
        name, direction, dtype, order, filt = row.split()
        problem = compile_times.conv(
            compile_times.ConvolutionDirection[direction], dtype, order, 64, 96, 96, (56, 56), (7, 7), 1, 96
        )
        if filt == "packed":
            problem = dataclasses.replace(problem, algo=PACKED_ALGORITHM[direction])
        _, compiles = compile_times.distinct_compiles([problem], backend)
        (item,) = [item for item in compiles if item.name == name]
        with tempfile.TemporaryDirectory() as folder:
            ptx = Path(folder) / "kernel.ptx"
            seconds = compile_times.compile_sm90(item, target, ptx)  # nothing cached
            text = ptx.read_text()
            registers, spills = sm90.ptxas_usage(text, 90)
        vector_loads = len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", text))
        print(row, registers, spills, f"{seconds:.2f}", vector_loads, flush=True)
    for (width, dtype), (channels, size, stride, _) in ROWS_LAYERS.items():
        problem = compile_times.conv(
            compile_times.ConvolutionDirection.BACKWARD_FILTER,
            dtype,
            "channels_last",
            64,
            channels,
            channels,
            (size, size),
            (width, width),
            stride,
            channels,
        )
        _, compiles = compile_times.distinct_compiles([problem], backend)
        (item,) = [item for item in compiles if item.name == "filter_depthwise_rows_kernel"]
        options, signature, constexprs, attrs = item.specialized
        with tempfile.TemporaryDirectory() as folder:
            compile_times.triton.knobs.cache.dir = folder  # nothing cached
            start = time.perf_counter()
            compiled = sm90.compile_sm90(item.launch.kernel, signature, constexprs, attrs, options, target)
            seconds = time.perf_counter() - start
        registers, spills = sm90.ptxas_usage(compiled.asm["ptx"], 90)
        walk = innermost_loop(sm90.sass(compiled.asm["cubin"]))
        fmas = sum(op == "FFMA" for op in walk)
        loads = sum(op.startswith("LDG") for op in walk)
        print("rows", width, dtype, registers, spills, f"{seconds:.2f}", len(walk), fmas, loads, flush=True)


def innermost_loop(sass: str) -> list[str]:
    """The opcodes of the shortest loop (a branch back to an earlier address) that holds FFMAs."""
    instructions = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    addresses = [int(address, 16) for address, _, _ in instructions]
    loops = []
    for address, opcode, operands in instructions:
        target = re.match(r"\s*0x([0-9a-f]+)", operands)
        if opcode == "BRA" and target and int(target.group(1), 16) < int(address, 16):
            first, last = int(target.group(1), 16), int(address, 16)
            loops.append([op for at, (_, op, _) in zip(addresses, instructions) if first <= at <= last])
    return min((loop for loop in loops if "FFMA" in loop), key=len)


if __name__ == "__main__":
    main()
