"""conv1's forward through the padded copy (``pads_channels``: ResNet-50's 7 x 7 stride 2 stem over 3
channels, batch 64, channels-last), compiled for the H200 (sm_90) on the CPU: ``conv_gemm_kernel`` loads
a tap's PIXEL_CHANNELS channels as one aligned vector by cp.async (8 bytes in bfloat16, 16 in float32)
into its pipelined shared-memory stages, not as one scalar load a channel. A group offset the compiler
cannot prove zero keeps the vector's alignment unknown: the tile is then copied a channel at a time
(bfloat16: synchronous 2-byte loads; float32: 4-byte cp.async), 1.28 and 1.20 times slower on the H200.
In a subprocess: triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from pathlib import Path

import sm90

from opendnn.families.convolution.problem import ConvolutionFwdAlgo

VECTOR_BYTES = {"bfloat16": 8, "float32": 16}  # PIXEL_CHANNELS = 4 channels a tap


def test_the_padded_copy_is_gathered_in_vectors_by_cp_async():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in completed.stdout.splitlines()}
    assert sorted(rows) == sorted(VECTOR_BYTES)
    for dtype, (widest, vectors) in rows.items():
        assert int(widest) == VECTOR_BYTES[dtype] and int(vectors) > 0, (dtype, widest, vectors)


def main() -> None:
    """Print, per dtype: the widest of conv_gemm_kernel's cp.async copies (bytes) and how many of that
    width its PTX holds (the filter's copies stay a channel wide: it is masked to the 3 channels)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import compile_times  # benchmarks/ is a folder of scripts, not a package

    target, backend = sm90.target_or_exit()
    for dtype in VECTOR_BYTES:
        problem = compile_times.conv(
            compile_times.ConvolutionDirection.FORWARD,
            dtype,
            "channels_last",
            64,
            3,
            64,
            (224, 224),
            (7, 7),
            2,
            tf32=True,
        )
        problem = dataclasses.replace(problem, algo=ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM)
        _, compiles = compile_times.distinct_compiles([problem], backend)
        (item,) = [item for item in compiles if item.launch.kernel.__name__ == "conv_gemm_kernel"]
        with tempfile.TemporaryDirectory() as folder:
            ptx_path = Path(folder) / "kernel.ptx"
            compile_times.compile_sm90(item, target, ptx_path)
            ptx = ptx_path.read_text()
        sizes = [int(size, 16) for size in re.findall(r"cp\.async\.\w+\.shared\.global[^;]*,\s*(0x[0-9a-f]+),", ptx)]
        widest = max(sizes, default=0)
        print(dtype, widest, sizes.count(widest), flush=True)


if __name__ == "__main__":
    main()
