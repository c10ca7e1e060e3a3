"""The resampling kernels compiled for the H200 (sm_90) on the CPU: forward and backward, nearest,
(bi/tri)linear and bicubic, channels-first and channels-last, 16-bit, float32 and float64, each without spills. In
a subprocess: triton must load without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sm90
import torch

# (mode, dtype, x dims, y dims, channels last, backward)
CASES = [
    ("LINEAR", "bfloat16", (64, 256, 56, 56), (64, 256, 112, 112), True, False),
    ("LINEAR", "bfloat16", (64, 256, 56, 56), (64, 256, 112, 112), True, True),
    ("NEAREST", "float32", (64, 256, 56, 56), (64, 256, 112, 112), False, False),
    ("NEAREST", "float32", (64, 256, 56, 56), (64, 256, 112, 112), False, True),
    ("LINEAR", "float32", (8, 32, 12, 20, 24), (8, 32, 24, 40, 48), False, True),
    ("NEAREST_EXACT", "float64", (16, 64, 999), (16, 64, 400), False, True),
    ("CUBIC", "bfloat16", (16, 64, 56, 56), (16, 64, 97, 40), True, False),
    ("CUBIC", "bfloat16", (16, 64, 56, 56), (16, 64, 97, 40), True, True),
]


def test_resampling_kernels_compile_without_spills():
    rows = sm90.script_rows(__file__, timeout=600)[-len(CASES) :]
    assert [row[0] for row in rows] == [
        "resample_backward_kernel" if case[-1] else "resample_forward_kernel" for case in CASES
    ]
    for name, registers, spills in rows:
        assert int(spills) == 0 and int(registers) <= 128, (name, registers, spills)


def main() -> None:
    """Print, per case: the kernel's name, its registers a thread and its spilled bytes."""
    import opendnn as od
    from opendnn.families.resample.problem import InterpolationMode, resample_problem
    from opendnn.families.resample.triton_backend import resample_launches
    from opendnn.kernels.launch import Slot

    target, backend = sm90.target_or_exit(90)
    for mode, dtype, x_dims, y_dims, channels_last, backward in CASES:
        descs = []
        for dims in (x_dims, y_dims):
            order = (0, *range(2, len(dims)), 1) if channels_last else tuple(range(len(dims)))
            strides = [0] * len(dims)
            step = 1
            for k in reversed(order):
                strides[k] = step
                step *= dims[k]
            descs.append(od.TensorDescriptor(dtype, dims, strides))
        pair = (descs[1], descs[0]) if backward else tuple(descs)
        problem = resample_problem(InterpolationMode[mode], ("a", "b"), pair, backward=backward)
        (launch,) = resample_launches(problem, 0).launches
        tensor = torch.empty(16, dtype=getattr(torch, dtype))
        args = tuple(tensor if isinstance(a, Slot) else a for a in launch.args)
        specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
        ptx = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target).asm["ptx"]
        registers, spills = sm90.ptxas_usage(ptx, 90)
        print(launch.kernel.__name__, registers, spills)


if __name__ == "__main__":
    main()
