"""What the launchers ask of the GPU: its multiprocessor count, to size persistent grids; whether it
has TMA (Hopper's tensor memory accelerator) and thread-block clusters (both from sm_90 on), and
Hopper's warpgroup MMA (sm_90 alone); and the scratch memory of device-built descriptors."""

from __future__ import annotations

import functools
import os
from typing import Any

from opendnn.core.recording import SCOPE

TMA_ALIGNMENT = 16  # bytes: what TMA asks of a base address and of every stride but the last
# Triton's interpreter plans as for an H200's 132 multiprocessors, so the CPU tests run the splits a GPU gets
INTERPRETED_MULTIPROCESSORS = 132


@functools.cache  # a property of the hardware, asked on every launch
def multiprocessors(device_index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def programs_to_fill(per_sm: int, power_of_two: bool = False) -> int:
    """How many programs give each multiprocessor of the current CUDA device ``per_sm`` of them
    (INTERPRETED_MULTIPROCESSORS stand for the device under Triton's interpreter): the grid a planner
    aims for when it splits a reduction into slices; ``power_of_two`` rounds it down to one (an H200,
    132 SMs, at 8 per SM: 1024, not 1056). Planners ask it once per problem and cache the plan."""
    import torch

    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        programs = per_sm * INTERPRETED_MULTIPROCESSORS
    else:
        programs = per_sm * multiprocessors(torch.cuda.current_device())
    return 1 << (programs.bit_length() - 1) if power_of_two else programs


@functools.cache  # a property of the hardware, asked on every call
def has_tma(device_index: int | None) -> bool:
    return _sm90_or_newer(device_index)


@functools.cache  # a property of the hardware, asked on every call
def has_clusters(device_index: int | None) -> bool:
    """Thread-block clusters (CTAs co-scheduled on one GPC, waiting on each other with barrier.cluster)."""
    return _sm90_or_newer(device_index)


@functools.cache  # a property of the hardware, asked on every call
def has_wgmma(device_index: int | None) -> bool:
    """Hopper's warpgroup MMA (``wgmma``, which Gluon's ``warpgroup_mma`` issues): sm_90 alone."""
    import torch

    return torch.cuda.get_device_capability(device_index or 0) == (9, 0)


def _sm90_or_newer(device_index: int | None) -> bool:
    import torch

    return torch.cuda.get_device_capability(device_index or 0)[0] >= 9


def tma_ready(a: Any, b: Any, interpreted: bool) -> bool:
    """TMA can read the torch tensors a and b: 16-byte aligned bases, on a GPU that has TMA (the
    interpreter emulates it)."""
    if a.data_ptr() % TMA_ALIGNMENT or b.data_ptr() % TMA_ALIGNMENT:
        return False
    return interpreted or (a.is_cuda and has_tma(a.device.index))


def use_descriptor_scratch() -> None:
    """Give kernels that build tensor descriptors on the device (``tl.make_tensor_descriptor``)
    their global scratch memory: Triton asks ``triton.set_allocator``'s hook at each launch."""
    import triton

    triton.set_allocator(descriptor_scratch)
    recorder = SCOPE.recorder
    if recorder is not None:  # a recorded call's replays set it too (core/recording.py)
        recorder.repeated(use_descriptor_scratch)


_SCRATCH: dict[tuple[int, int], Any] = {}  # (device, stream) -> the largest scratch buffer given there


def descriptor_scratch(size: int, alignment: int, stream: int) -> Any:
    """Scratch of ``size`` bytes for a launch on ``stream`` of the current device: one buffer per
    stream, kept (an allocation costs ~5 us of host time per launch on an H200 machine). Launches on
    one stream run in order, so the next one rewrites its descriptors only after the last finished.
    A stream being captured into a CUDA graph gets fresh memory from the graph's own pool."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        return torch.empty(size, dtype=torch.int8, device="cuda")
    key = (torch.cuda.current_device(), stream)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.numel() < size:
        buffer = _SCRATCH[key] = kept_buffer(size, key[0])
    return buffer


def kept_buffer(size: int, device: int) -> Any:
    """``size`` zeroed bytes on CUDA ``device`` that opendnn keeps between calls (scratch, a plan's
    workspace), allocated from a memory pool of opendnn's own: a buffer made while torch routes the
    thread's allocations to a CUDA graph's pool (cudagraph trees' warm-up under torch.compile) would
    otherwise stay alive in that pool, which the trees refuse. Zeroed once, so that no kernel reads
    memory nothing wrote (the device-built TMA descriptors read their scratch before filling it)."""
    import torch

    with torch.cuda.use_mem_pool(_kept_pool(device), device):
        return torch.zeros(size, dtype=torch.uint8, device=torch.device("cuda", device))


@functools.cache
def _kept_pool(device: int) -> Any:
    import torch

    return torch.cuda.MemPool()
