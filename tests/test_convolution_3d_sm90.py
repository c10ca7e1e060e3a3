"""3-D convolutions on the TMA route (``conv_tma_kernel``, frames read through the view's third dim)
compiled for sm_90 on the CPU: a video layer's forward and backward data, 16-bit and TF32, build and
read their activations by TMA in rank-5 boxes. Run as a script, it prints one JSON line per compiled
variant (the test runs it in a subprocess, with Triton's compiler instead of its interpreter). The
kernels' results are checked against float64 through the interpreter by
tests/test_convolution_kernels.py and on the GPU by tests/test_gpu_convolution.py.
"""

from __future__ import annotations

import json
import re

import sm90

import opendnn as od
from opendnn.core.descriptors import strides_for_order
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem

BF16, FP32 = od.DataType.BFLOAT16, od.DataType.FLOAT
FWD, DATA = ConvolutionDirection.FORWARD, ConvolutionDirection.BACKWARD_DATA


def problem(direction, dtype, stride=1, batch=8, channels=64, frames=16, size=56):
    """A video layer (batch 8, 64 channels, 16 frames of 56 x 56, 3x3x3, pad 1), NDHWC."""
    x_dims, w_dims = (batch, channels, frames, size, size), (channels, channels, 3, 3, 3)
    out = (size - 1) // stride + 1
    y_dims = (batch, channels, frames, out, out)
    desc = {
        name: od.TensorDescriptor(dtype, dims, strides_for_order(dims, (0, 2, 3, 4, 1)))
        for name, dims in (("x", x_dims), ("w", w_dims), ("y", y_dims))
    }
    conv = od.ConvolutionDescriptor((1, 1, 1), (1, stride, stride), (1, 1, 1))
    algo = PRECOMP if batch == 1 else None
    return convolution_problem(direction, conv, desc["x"], desc["w"], desc["y"], algo=algo, allow_tf32=dtype is FP32)


PRECOMP = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
VARIANTS = {
    "forward_bf16": (FWD, BF16),
    "forward_tf32": (FWD, FP32),
    "backward_data_bf16_strided": (DATA, BF16, 2),
    "backward_data_tf32": (DATA, FP32),
    # batch 1, 4 frames of 8 x 8 x 512 channels under IMPLICIT_PRECOMP_GEMM: sliced, summed over frames
    "forward_bf16_sliced_batch_1": (FWD, BF16, 1, 1, 512, 4, 8),
}


def test_3d_forward_and_backward_data_compile_to_tma_kernels_reading_rank_5_boxes():
    completed = sm90.run_script(__file__, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        if "sliced" in name:  # the slices' partial sums, then their sum over frames
            assert report["kernels"] == ["conv_tma_kernel", "slice_sum_kernel"], name
        else:  # one launch a phase: four for the strided backward data
            assert set(report["kernels"]) == {"conv_tma_kernel"}, name
        assert report["box_rank"] == 5 and report["tma_loads"] >= 2, name  # a frame's box of x, the filter's
        assert report["mma"] > 0, name


def main() -> None:
    """Print, per variant, a JSON line: the kernels of its launches (a TF32 forward's staging copies
    left out) and, of its convolution kernel, the rank of its activations' TMA loads, its TMA loads
    (pipelined: one per stage and operand) and its MMA ops."""
    import torch

    from opendnn.kernels.launch import Slot

    target, backend = sm90.target_or_exit()
    for name, arguments in VARIANTS.items():
        prob = problem(*arguments)
        assert kernels.choose(prob, tma_aligned=True, hopper=True) is kernels.Strategy.TMA, name
        launches = kernels.launch_plan(prob, False, kernels.Strategy.TMA).launches
        report = dict(name=name, kernels=[])
        for launch in launches:
            if launch.kernel.fn.__name__ == "staging_kernel":
                continue
            dtype = torch.float32 if launch.kernel.fn.__name__ == "slice_sum_kernel" else prob.x.dtype.to_torch()
            args = tuple(torch.empty(8, dtype=dtype) if isinstance(a, Slot) else a for a in launch.args)
            specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
            compiled = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target)
            assert "cubin" in compiled.asm
            report["kernels"].append(compiled.metadata.name)
            if compiled.metadata.name != "conv_tma_kernel":
                continue
            ttgir = compiled.asm["ttgir"]
            loads = re.findall(r"ttng\.async_tma_copy_global_to_local %\S+\[([^\]]*)\]", ttgir)
            report.update(
                box_rank=max(len(coords.split(",")) for coords in loads) if loads else 0,
                tma_loads=len(loads),
                mma=len(re.findall(r"ttng\.warp_group_dot |tt\.dot ", ttgir)),
            )
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
