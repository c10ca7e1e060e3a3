"""The planned launches (kernels/launch.py) of each family, checked without a GPU.

Under the interpreter a Launch always takes Triton's generic launcher (keyword constexprs); on the
GPU it calls the compiled kernel with the constexprs by position after its planned arguments. Here
the launches of real problems (packed and channels-last, float32 and bfloat16) are recorded instead
of run, and their argument lists checked against the kernels' parameters; the last launch of each
kernel (bfloat16, channels-last) is compiled for sm_90, specialized by Triton's own launcher code
(tests/sm90.py; in a subprocess: triton must load without its interpreter).
"""

from __future__ import annotations

import os
import types

import pytest
import sm90
import torch
from triton.compiler import CompiledKernel

import opendnn as od
import opendnn.functional as F
from opendnn.core.dispatch import backend_module
from opendnn.kernels.launch import Launch, Slot

DTYPES = (torch.float32, torch.bfloat16)


def _input(shape, dtype, channels_last):
    x = torch.randn(shape, dtype=dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def pooling_calls(handle, dtype, channels_last):
    x = _input((2, 5, 9, 7), dtype, channels_last)
    y = F.max_pool(x, 3, 2, 1, handle=handle)
    F.max_pool_backward(torch.randn_like(y), x, y, 3, 2, 1, handle=handle)
    y = F.avg_pool(x, (2, 3), 2, count_include_pad=False, handle=handle)
    F.avg_pool_backward(torch.randn_like(y), x, (2, 3), 2, count_include_pad=False, handle=handle)


def softmax_calls(handle, dtype, channels_last):
    for x in (_input((2, 6, 3, 5), dtype, channels_last), _input((2, 1, 1, 20000), dtype, channels_last)):
        y = F.softmax(x, 1 if channels_last else -1, handle=handle)  # one pass; two passes (rows of 20000)
        F.log_softmax_grad(torch.randn_like(y), y, -1, handle=handle)


def normalization_calls(handle, dtype, channels_last):
    x, weight, bias = _input((2, 6, 3, 5), dtype, channels_last), torch.randn(6, 3, 5), torch.randn(6, 3, 5)
    y, mean, rstd = F.layer_norm(x, (6, 3, 5), weight, bias, return_stats=True, handle=handle)
    F.layer_norm_backward(torch.randn_like(y), x, (6, 3, 5), weight, mean=mean, rstd=rstd, handle=handle)
    F.rms_norm_backward(torch.randn_like(y), x, (5,), handle=handle)
    y = F.group_norm(x, 3, torch.randn(6), torch.randn(6), handle=handle)
    F.group_norm_backward(torch.randn_like(y), x, 3, torch.randn(6), handle=handle)


def reduce_calls(handle, dtype, channels_last):
    from opendnn.families.reduce.api import get_reduction_indices_size, get_reduction_workspace_size, reduce_tensor
    from opendnn.families.reduce.problem import ReduceTensorDescriptor, ReduceTensorIndices, ReduceTensorOp

    a = _input((2, 64, 6, 50), dtype, channels_last)
    for op, c_dims in (
        (ReduceTensorOp.ADD, (1, 64, 1, 1)),
        (ReduceTensorOp.NORM2, (2, 64, 6, 1)),
        (ReduceTensorOp.MAX, (1, 1, 1, 1)),
    ):  # columns or rows; the whole tensor, split
        indexed = ReduceTensorIndices.FLATTENED_INDICES if op is ReduceTensorOp.MAX else ReduceTensorIndices.NO_INDICES
        reduce_desc = ReduceTensorDescriptor(op, indices=indexed)
        c = torch.empty(c_dims, dtype=dtype)
        a_desc, c_desc = (od.TensorDescriptor(t.dtype, t.shape, t.stride()) for t in (a, c))
        indices = torch.empty(get_reduction_indices_size(handle, reduce_desc, a_desc, c_desc) // 4, dtype=torch.int32)
        indices = indices if indices.numel() else None
        workspace = torch.empty(get_reduction_workspace_size(handle, reduce_desc, a_desc, c_desc), dtype=torch.uint8)
        reduce_tensor(handle, reduce_desc, indices, workspace, 1.0, a_desc, a, 0.5, c_desc, c)


def lrn_calls(handle, dtype, channels_last):
    x = _input((2, 6, 3, 5), dtype, channels_last)
    y = F.local_response_norm(x, 3, handle=handle)
    F.local_response_norm_backward(torch.randn_like(y), x, 3, handle=handle)
    means = torch.randn_like(x)
    y = F.divisive_norm(x, means, 3, handle=handle)
    F.divisive_norm_backward(torch.randn_like(y), x, means, 3, handle=handle)  # temp and temp2: scratch
    F.divisive_norm_backward(
        torch.randn_like(y), x, None, 3, temp=torch.empty_like(x), temp2=torch.empty_like(x), handle=handle
    )


def matmul_calls(handle, dtype, channels_last):
    a, b = _input((2, 48, 40), dtype, False), _input((40, 32), dtype, False)
    F.matmul(
        a.mT.contiguous().mT if channels_last else a,
        b,
        bias=torch.randn(32, dtype=dtype),
        activation="gelu",
        handle=handle,
    )
    if channels_last and dtype is torch.bfloat16:  # a 1x1 convolution that runs as a matrix product
        F.conv(_input((2, 32, 5, 6), dtype, True), _input((16, 32, 1, 1), dtype, True), handle=handle)


FAMILIES = {
    "pooling": pooling_calls,
    "softmax": softmax_calls,
    "normalization": normalization_calls,
    "reduce": reduce_calls,
    "lrn": lrn_calls,
    "matmul": matmul_calls,
}


def recorded(family):
    """[(launch, tensors)] of the family's calls over DTYPES and both layouts, none of them run."""
    launches = []

    def record(launch, tensors):
        launches.append((launch, dict(tensors)))

    original = Launch.__call__
    Launch.__call__ = record
    try:
        handle = od.create("cpu", backend="triton")
        for dtype in DTYPES:
            for channels_last in (False, True):
                FAMILIES[family](handle, dtype, channels_last)
    finally:
        Launch.__call__ = original
    return launches


@pytest.mark.parametrize("family", FAMILIES)
def test_planned_arguments_match_the_kernel_parameters(family):
    launches = recorded(family)
    assert launches
    for launch, tensors in launches:
        names = launch.kernel.arg_names
        assert len(launch.args) + len(launch.constexprs) == len(names), launch.kernel.__name__
        assert all(name in launch.options for name in names[len(launch.args) :]), launch.kernel.__name__
        assert not set(names[: len(launch.args)]) & set(launch.options), launch.kernel.__name__
        assert all(name in tensors for _, name in launch.slots)
        assert len(launch.grid) == 3 and all(isinstance(g, int) and g > 0 for g in launch.grid)


KERNELS = 2 + 3 + 3 + 3 + 3 + 1  # pooling, softmax, normalization, reduce, lrn (stream, vector, divisive), matmul


def test_the_last_launch_of_each_kernel_compiles_for_sm90():
    completed = sm90.run_script(__file__, timeout=300)
    last = (completed.stdout.splitlines() or [""])[-1]
    assert (completed.returncode, last) == (0, f"compiled {KERNELS}"), completed.stderr[-3000:]


class _Compiled(CompiledKernel):
    """A stand-in for the kernel Triton compiles: records the calls made through the cache."""

    def __init__(self, calls: list) -> None:  # CompiledKernel's own needs a real binary
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("cached", args))


class _Kernel:
    """A stand-in @triton.jit function: its first-call path compiles (records, returns _Compiled)."""

    arg_names = ["x_ptr", "n", "BLOCK"]

    def __init__(self) -> None:
        self.calls: list = []

    def __getitem__(self, grid):
        def first_call(*args, **options):
            self.calls.append(("compiled", options["BLOCK"]))
            return _Compiled(self.calls)

        return first_call


class _Tensor:
    def __init__(self, device: int, address: int) -> None:
        self.device, self.address, self.dtype = types.SimpleNamespace(index=device), address, "fp32"

    def data_ptr(self) -> int:
        return self.address


def test_a_compiled_kernel_is_kept_per_device_and_pointer_alignment():
    # a kernel is loaded into one device's context: device 0's kernel called with device 1's pointers
    # fails with "invalid resource handle", so the device is part of the key
    kernel = _Kernel()
    launch = Launch(kernel, (4,), (Slot("x"), 7), {"BLOCK": 128, "num_warps": 4})
    for device, address in ((0, 4096), (0, 8192), (1, 4096), (0, 4100), (1, 4096)):
        launch({"x": _Tensor(device, address)})
    assert [call[0] for call in kernel.calls] == ["compiled", "cached", "compiled", "compiled", "cached"]
    assert kernel.calls[1][1][1:] == (7, 128)  # leading args, then the constexprs in parameter order


def main() -> None:
    target, backend = sm90.target_or_exit()
    for family in FAMILIES:  # compiled kernels (not interpreted ones), though dispatch asks for the interpreter
        backend_module(family, "triton")
    os.environ["TRITON_INTERPRET"] = "1"
    compiled = 0
    for family in FAMILIES:
        last = {launch.kernel: (launch, tensors) for launch, tensors in recorded(family)}  # bfloat16, channels-last
        for launch, tensors in last.values():
            print(f"compiling {family}: {launch.kernel.__name__}", flush=True)
            args = tuple(tensors[a.name] if isinstance(a, Slot) else a for a in launch.args)
            specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
            assert "cubin" in sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target).asm
            compiled += 1
    print("compiled", compiled)


if __name__ == "__main__":
    main()
