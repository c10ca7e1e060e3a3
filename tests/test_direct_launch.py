"""Launch's direct call of a compiled kernel's C launcher (kernels/launch.py), checked without a
GPU against Triton's own runner (``CompiledKernel.__getitem__``): both are run on one stand-in kernel
whose launcher records its arguments, under a stand-in driver that names the current device and
its stream. The direct call must pass what the runner passes, except the launch metadata and the
hook chains, which it passes as None while no hook is registered, and the tensors, which it passes
as their addresses; with a hook registered it must leave the launch to the runner."""

from __future__ import annotations

import contextlib
import types

import pytest
from triton import knobs
from triton.backends.nvidia.driver import CudaLauncher
from triton.compiler import CompiledKernel
from triton.runtime import _allocation, driver

from opendnn.core.recording import recording
from opendnn.kernels import launch as launch_module
from opendnn.kernels.launch import Launch, Slot

pytestmark = pytest.mark.skipif(not launch_module.DIRECT_LAUNCH, reason="the direct launch is written for triton 3.6")

STREAM = 0x5EED


class _Driver:
    """The current device is 0; each device's current stream is STREAM + its index."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return STREAM + device


def _compiled(calls: list, scratch: int = 0) -> CompiledKernel:
    """A CompiledKernel (the class itself: the direct path takes only Triton's own) whose handles are
    loaded and whose launcher is Triton's CudaLauncher (its Python wrapper as it is, ``scratch`` bytes of
    global scratch per CTA) over a C function that records its arguments."""
    kernel = object.__new__(CompiledKernel)
    kernel.module, kernel.function, kernel.packed_metadata = object(), 0xF00, (4, 1, 0)
    kernel.name, kernel.src, kernel.metadata = "k", None, None
    launcher = object.__new__(CudaLauncher)
    launcher.launch = lambda *args: calls.append(args)
    launcher.num_ctas, launcher.launch_cooperative_grid, launcher.launch_pdl = 1, False, False
    launcher.global_scratch_size, launcher.global_scratch_align = scratch, 128
    launcher.profile_scratch_size, launcher.profile_scratch_align = 0, 1
    kernel._run = launcher
    return kernel


# what the C function takes: gridX, gridY, gridZ, stream, function, cooperative, pdl, global scratch,
# profile scratch, packed metadata, launch metadata, enter hook, exit hook, the kernel's arguments
LAUNCH_METADATA, ARGUMENTS = 10, 13


class _Kernel:
    """A stand-in @triton.jit function whose first call compiles (returns the recording kernel)."""

    arg_names = ["x_ptr", "y_ptr", "n", "BLOCK"]

    def __init__(self, compiled: CompiledKernel) -> None:
        self.compiled = compiled

    def __getitem__(self, grid):
        return lambda *args, **options: self.compiled


class _Tensor:
    def __init__(self, address: int) -> None:
        self.device, self.address, self.dtype = types.SimpleNamespace(index=0), address, "fp32"

    def data_ptr(self) -> int:
        return self.address


@pytest.fixture
def fake_driver(monkeypatch):
    monkeypatch.setattr(driver, "_active", _Driver())


def _launched(launch: Launch, tensors: dict) -> None:
    launch(tensors)  # compiles (the stand-in) and keeps the kernel
    launch(tensors)  # the kept kernel: the direct path


def test_the_direct_launch_passes_what_triton_runner_passes(fake_driver):
    direct, runner = [], []
    kernel = _compiled(direct)
    tensors = {"x": _Tensor(4096), "y": _Tensor(8192)}
    _launched(Launch(_Kernel(kernel), (3, 2), (Slot("x"), Slot("y"), 7), {"BLOCK": 128, "num_warps": 4}), tensors)
    assert len(direct) == 1
    kernel._run.launch = lambda *args: runner.append(args)
    kernel[(3, 2, 1)](tensors["x"], tensors["y"], 7, 128)  # Triton's runner, with the same arguments
    (ours,), (theirs,) = direct, runner
    head = (3, 2, 1, STREAM, 0xF00, False, False, None, None, (4, 1, 0))
    assert ours[:LAUNCH_METADATA] == theirs[:LAUNCH_METADATA] == head
    assert ours[LAUNCH_METADATA:ARGUMENTS] == (None, None, None)
    assert theirs[ARGUMENTS:] == (tensors["x"], tensors["y"], 7, 128)
    assert ours[ARGUMENTS:] == (4096, 8192, 7, 128)  # the tensors' addresses: the launcher takes them as is


def test_a_kernel_with_global_scratch_gets_the_kept_scratch_of_its_stream_by_address(fake_driver, monkeypatch):
    """Passed what Triton's wrapper passes, less the allocator hook: the scratch of the grid's 6 CTAs
    on the launch's stream, as the kept buffer's address."""
    calls, asked, hooked = [], [], []
    kept = types.SimpleNamespace(data_ptr=lambda: 0xBEEF00)
    monkeypatch.setattr(launch_module, "descriptor_scratch", lambda *request: asked.append(request) or kept)
    monkeypatch.setattr(
        _allocation, "_allocator", types.SimpleNamespace(get=lambda: lambda *request: hooked.append(request))
    )
    kernel = _compiled(calls, scratch=32)
    launch = Launch(_Kernel(kernel), (3, 2), (Slot("x"), Slot("x"), 7), {"BLOCK": 64, "num_warps": 4})
    _launched(launch, {"x": _Tensor(64)})
    (args,) = calls
    assert asked == [(6 * 32, 128, STREAM)] and not hooked
    assert args[:LAUNCH_METADATA] == (3, 2, 1, STREAM, 0xF00, False, False, 0xBEEF00, None, (4, 1, 0))
    assert args[ARGUMENTS:] == (64, 64, 7, 64)
    kernel._run.launch = lambda *request: calls.append(request)  # Triton's wrapper, its hook asked
    monkeypatch.setattr(
        _allocation, "_allocator", types.SimpleNamespace(get=lambda: lambda *request: hooked.append(request) or "mem")
    )
    kernel[(3, 2, 1)](64, 64, 7, 64)
    assert hooked == asked and calls[1][:LAUNCH_METADATA] == (*args[:7], "mem", None, (4, 1, 0))


def test_a_registered_launch_hook_leaves_the_launch_to_the_runner(fake_driver):
    calls, seen = [], []
    kernel = _compiled(calls)
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        _launched(
            Launch(_Kernel(kernel), (1,), (Slot("x"), Slot("x"), 5), {"BLOCK": 64, "num_warps": 4}), {"x": _Tensor(0)}
        )
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    (args,) = calls
    # the runner's launch metadata and hook chain
    assert args[LAUNCH_METADATA] is not None and args[LAUNCH_METADATA + 1] is knobs.runtime.launch_enter_hook


def test_a_bound_launch_passes_what_the_direct_launch_passes_and_defers_to_hooks_and_recordings(fake_driver):
    calls = []
    kernel = _compiled(calls)
    tensors = {"x": _Tensor(4096), "y": _Tensor(8200)}  # y not 16-byte aligned: its own specialization
    launch = Launch(_Kernel(kernel), (3, 2), (Slot("x"), Slot("y"), 7), {"BLOCK": 128, "num_warps": 4})
    assert launch.bound(tensors) is None  # not compiled for these tensors yet
    _launched(launch, tensors)
    bound = launch.bound(tensors)
    assert launch.bound({"x": _Tensor(4096), "y": _Tensor(8192)}) is None  # another alignment: not compiled
    bound()
    direct, ours = calls
    assert ours == direct and ours[ARGUMENTS:] == (4096, 8200, 7, 128)
    hook, seen = (lambda *args: None), []
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        bound()  # a hook: Triton's runner launches, with its metadata and hook chain
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert calls[-1][LAUNCH_METADATA] is not None

    class Recorder:
        def launched(self, launched, given):
            seen.append((launched, given))

    with recording(Recorder()):
        bound()
    assert seen == [(launch, tensors)] and len(calls) == 3  # the recorder launches it, not the bound call


class _ClusterKernel(_Kernel):
    """A stand-in whose ``warmup`` compiles without launching (records the call); ``kernel[grid]`` is refused:
    Triton's runner would launch each CTA on its own, not in clusters."""

    def __init__(self, compiled: CompiledKernel) -> None:
        super().__init__(compiled)
        self.warmed: list = []

    def warmup(self, *args, grid, **options):
        self.warmed.append((args, grid, options))
        return self.compiled

    def __getitem__(self, grid):
        raise AssertionError("a cluster launch went through Triton's runner")


def test_a_cluster_launch_compiles_without_launching_and_asks_for_clusters(fake_driver):
    """``cluster`` 4 over 12 CTAs: the launcher gets 3 along x (it multiplies by the cluster size) and the
    cluster size in place of num_ctas in the packed metadata, on the first call too, hook or not."""
    calls, seen = [], []
    stand_in = _ClusterKernel(_compiled(calls))
    tensors = {"x": _Tensor(4096)}
    launch = Launch(stand_in, (12,), (Slot("x"), Slot("x"), 5), {"BLOCK": 64, "num_warps": 4}, cluster=4)
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch(tensors)
        launch(tensors)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(stand_in.warmed) == 1 and stand_in.warmed[0][1] == (12, 1, 1)
    assert len(calls) == 2 and not seen
    for args in calls:
        assert args[:LAUNCH_METADATA] == (3, 1, 1, STREAM, 0xF00, False, False, None, None, (4, 4, 0))
        assert args[LAUNCH_METADATA:] == (None, None, None, 4096, 4096, 5, 64)


def test_descriptor_scratch_is_kept_per_device_and_stream_and_fresh_while_a_graph_is_captured(monkeypatch):
    """The scratch of device-built TMA descriptors (``triton.set_allocator``'s hook): one buffer per
    (device, stream), grown when a launch needs more, never kept while a CUDA graph is captured (the
    CUDA calls stood in for: the test needs no GPU)."""
    import torch

    from opendnn.kernels import device as device_module

    state = {"device": 0, "capturing": False, "pool": None}
    allocated = []

    zeros = torch.zeros

    def empty(size, dtype, device):
        allocated.append((size, state["pool"]))
        return zeros(size, dtype=dtype)

    @contextlib.contextmanager
    def use_mem_pool(pool, device):
        state["pool"] = pool
        yield
        state["pool"] = None

    monkeypatch.setattr(device_module, "_SCRATCH", {})
    monkeypatch.setattr(device_module, "_kept_pool", lambda device: f"opendnn's pool on {device}")
    monkeypatch.setattr(torch.cuda, "use_mem_pool", use_mem_pool)
    monkeypatch.setattr(torch, "empty", empty)  # a captured graph's scratch
    monkeypatch.setattr(torch, "zeros", empty)  # a kept buffer (zeroed once)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: state["device"])
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    scratch = device_module.descriptor_scratch
    first = scratch(256, 64, STREAM)
    assert scratch(128, 64, STREAM) is first  # smaller: the kept buffer serves
    other_stream = scratch(256, 64, STREAM + 1)
    state["device"] = 1
    other_device = scratch(256, 64, STREAM)
    state["device"] = 0
    grown = scratch(512, 64, STREAM)
    assert grown is not first and grown.numel() == 512 and scratch(256, 64, STREAM) is grown
    state["capturing"] = True
    captured = scratch(256, 64, STREAM)
    assert captured is not grown and device_module._SCRATCH[(0, STREAM)] is grown
    assert len({id(t) for t in (first, other_stream, other_device, grown, captured)}) == 5
    # the kept buffers come from opendnn's own pool (never from a CUDA graph's pool that torch routes the
    # thread's allocations to), a captured graph's from the graph's
    on0, on1 = "opendnn's pool on 0", "opendnn's pool on 1"
    assert allocated == [(256, on0), (256, on0), (256, on1), (512, on0), (256, None)]
