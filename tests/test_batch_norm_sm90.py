"""The one-read batch norm kernels compiled for the H200 (sm_90) on the CPU, at the benchmark's
64 x 256 x 56 x 56 float32 NCHW: one cluster barrier, the L2 prefetch, no spills, and at most 128
registers a thread, so that two CTAs of 8 warps (the forward) or one of 16 (the backward) fit an SM
(at 255 registers, as when a layout conversion or offsets recomputed after the barrier hold the tile twice,
the forward runs at half speed). Planned for a GPU without thread-block clusters (sm_80, at 64x1024x14x14)
they compile too: one CTA a feature, no cluster barrier, no prefetch. In a subprocess: triton must load
without its interpreter (tests/sm90.py)."""

from __future__ import annotations

import sm90
import torch


def test_one_read_kernels_fit_the_register_file():
    completed = sm90.run_script(__file__, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = [line.split() for line in completed.stdout.splitlines()[-4:]]
    kernels = ["bn_one_read_forward_kernel", "bn_one_read_backward_kernel"]
    assert [(line[0], line[1]) for line in lines] == [(kernel, arch) for arch in ("90", "80") for kernel in kernels]
    for line in lines[:2]:  # the H200, 64x256x56x56: clusters of 16
        cluster, registers, spills, barriers, prefetches = map(int, line[2:])
        assert cluster == 16 and barriers == 2  # barrier.cluster arrive and wait
        assert registers <= 128 and spills == 0
        assert prefetches > 0  # the L2 prefetch of a later cluster's tile (PREFETCH_MIN_CLUSTER <= 16)
    for line in lines[2:]:  # a GPU without clusters (sm_80), 64x1024x14x14: one CTA a feature, compiled
        cluster, _, _, barriers, prefetches = map(int, line[2:])
        assert cluster == 1 and barriers == 0 and prefetches == 0


def main() -> None:
    """Print, per one-read kernel: its name, the arch, CTAs per cluster, registers, spilled bytes, cluster
    barrier instructions and L2 prefetches; for sm_90 at 64x256x56x56 planned with clusters, for sm_80
    (an A100: no clusters) at 64x1024x14x14 planned without."""

    import opendnn as od
    from opendnn.families.batch_norm import problem as bn
    from opendnn.families.batch_norm.triton_backend import bn_launches
    from opendnn.kernels.launch import Slot

    for arch, clusters, shape in ((90, True, (64, 256, 56, 56)), (80, False, (64, 1024, 14, 14))):
        target, backend = sm90.target_or_exit(arch)
        x = od.TensorDescriptor.from_format(od.TensorFormat.NCHW, "float32", *shape)
        param = od.derive_bn_tensor_descriptor(x, od.BatchNormMode.SPATIAL)
        for direction in (bn.Direction.TRAINING, bn.Direction.BACKWARD):
            backward = direction is bn.Direction.BACKWARD
            problem = bn.batch_norm_problem(
                direction,
                od.BatchNormMode.SPATIAL,
                x,
                x,
                param,
                1e-5,
                factor=0.1,
                dy_desc=x if backward else None,
                saved=backward,
            )
            absent = ("z", "reserve") if backward else ("z", "dy", "dscale", "dbias", "reserve")
            (launch,), _, _ = bn_launches(
                problem, tuple(name not in absent for name in bn.BatchNormTensors._fields), clusters
            )
            tensor = torch.empty(16)
            args = tuple(tensor if isinstance(a, Slot) else a for a in launch.args)
            specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
            ptx = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target).asm["ptx"]
            registers, spills = sm90.ptxas_usage(ptx, arch)
            print(
                launch.kernel.__name__,
                arch,
                launch.cluster,
                registers,
                spills,
                ptx.count("barrier.cluster"),
                ptx.count("prefetch.global.L2::evict_last"),
            )


if __name__ == "__main__":
    main()
