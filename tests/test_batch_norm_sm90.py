"""The one-read batch norm forward compiled for the H200 (sm_90) on this CPU, at the benchmark's
64 x 256 x 56 x 56 float32 NCHW: one cluster barrier, no spills, and at most 128 registers a thread, so
two CTAs of 8 warps fit an SM (at 255 registers, when a layout conversion or offsets recomputed after
the barrier held the tile twice, it ran at half speed). In a subprocess: triton must load without its
interpreter (tests/sm90.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest
import sm90
import torch


def test_one_read_forward_fits_two_ctas_an_sm():
    completed = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "TRITON_INTERPRET": "0"})
    if completed.returncode == sm90.SKIP_STATUS:
        pytest.skip(completed.stdout.strip())
    assert completed.returncode == 0, completed.stderr[-3000:]
    cluster, registers, spills, barriers = map(int, completed.stdout.split()[-4:])
    assert cluster == 16 and barriers == 2  # barrier.cluster arrive and wait
    assert registers <= 128 and spills == 0


def main() -> None:
    from triton.backends.nvidia.compiler import get_ptxas

    import opendnn as od
    from opendnn.backends.triton.batch_norm import bn_launches
    from opendnn.backends.triton.launch import Slot
    from opendnn.ops import batch_norm as bn

    target, backend = sm90.target_or_exit()
    x = od.TensorDescriptor.from_format(od.TensorFormat.NCHW, "float32", 64, 256, 56, 56)
    param = od.derive_bn_tensor_descriptor(x, od.BatchNormMode.SPATIAL)
    problem = bn.batch_norm_problem(bn.Direction.TRAINING, od.BatchNormMode.SPATIAL, x, x, param, 1e-5,
                                    factor=0.1)
    given = tuple(name not in ("z", "dy", "dscale", "dbias", "reserve") for name in bn.BatchNormTensors._fields)
    (launch,), _, _ = bn_launches(problem, given)
    tensor = torch.empty(16)
    args = tuple(tensor if isinstance(a, Slot) else a for a in launch.args)
    specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
    ptx = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target).asm["ptx"]
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        report = subprocess.run([get_ptxas(90).path, f"-arch=sm_{target.arch}a", "-v", source, "-o",
                                 os.path.join(folder, "kernel.cubin")], capture_output=True, text=True, check=True)
    registers = re.search(r"Used (\d+) registers", report.stderr)
    spills = re.search(r"(\d+) bytes spill stores", report.stderr)
    assert registers and spills, report.stderr
    print(launch.cluster, registers.group(1), spills.group(1), ptx.count("barrier.cluster"))


if __name__ == "__main__":
    main()
