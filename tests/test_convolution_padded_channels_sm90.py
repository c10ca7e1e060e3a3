"""conv1 through the padded copy (``pads_channels``: ResNet-50's 7 x 7 stride 2 stem over 3 channels,
batch 64, channels-last), compiled for the H200 (sm_90) on the CPU: the forward's ``conv_gemm_kernel``
(bfloat16 and float32) and the bfloat16 backward filter's ``filter_gemm_kernel`` load a tap's
PIXEL_CHANNELS channels of the copy as one aligned vector by cp.async (8 bytes in bfloat16, 16 in
float32) into their pipelined shared-memory stages, not one channel at a time. A group offset the
compiler cannot prove zero keeps the vector's alignment unknown: the forward's tile was then copied a
channel at a time (bfloat16: synchronous 2-byte loads; float32: 4-byte cp.async), 1.28 and 1.20 times
slower on the H200. (A TF32 backward filter's operands reduce over pixels, which wgmma needs
contiguous in shared memory: both are copied there 4 bytes at a time, transposed.) In a subprocess:
triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from pathlib import Path

import sm90

from opendnn.families.convolution.problem import ConvolutionBwdFilterAlgo, ConvolutionFwdAlgo

VECTOR_BYTES = {"bfloat16": 8, "float32": 16}  # PIXEL_CHANNELS = 4 channels a tap
KERNELS = {  # the direction's kernel, and the algorithm that pads
    "FORWARD": ("conv_gemm_kernel", ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM),
    "BACKWARD_FILTER": ("filter_gemm_kernel", ConvolutionBwdFilterAlgo.ALGO_3),
}
CASES = [("FORWARD", "bfloat16"), ("FORWARD", "float32"), ("BACKWARD_FILTER", "bfloat16")]


def test_the_padded_copy_is_gathered_in_vectors_by_cp_async():
    rows = sm90.script_rows(__file__, timeout=300)
    assert [tuple(row[:2]) for row in rows] == CASES
    for direction, dtype, vectors in rows:
        assert int(vectors) > 0, (direction, dtype)


def main() -> None:
    """Print, per case: how many of the kernel's cp.async copies are a tap's vector wide."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for direction, dtype in CASES:
        name, algo = KERNELS[direction]
        problem = compile_times.conv(
            compile_times.ConvolutionDirection[direction], dtype, "channels_last", 64, 3, 64, (224, 224), (7, 7), 2,
            tf32=True,
        )  # fmt: skip
        _, compiles = compile_times.distinct_compiles([dataclasses.replace(problem, algo=algo)], backend)
        (item,) = [item for item in compiles if item.launch.kernel.__name__ == name]
        with tempfile.TemporaryDirectory() as folder:
            ptx_path = Path(folder) / "kernel.ptx"
            compile_times.compile_sm90(item, target, ptx_path)
            ptx = ptx_path.read_text()
        copies = re.findall(r"cp\.async\.\w+\.shared\.global[^;]*,\s*(0x[0-9a-f]+),", ptx)
        print(direction, dtype, [int(size, 16) for size in copies].count(VECTOR_BYTES[dtype]), flush=True)


if __name__ == "__main__":
    main()
