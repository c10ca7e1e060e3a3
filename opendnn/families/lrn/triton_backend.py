"""Cross-channel LRN and divisive normalization (LCN), forward and backward.

Memory model (E elements of b bytes, window n): LRN forward reads x once and writes y once
(2 E b); backward reads x and dy and writes dx (3 E b). About 3n + 10 FLOPs per element: memory
bound if the instructions stay few. float32 64 x 256 x 56 x 56 (51.4 M elements) forward moves
411 MB: 98 us at 4.2 TB/s, bfloat16 49 us, in which the H200 issues about 30 (bf16) to 60 (fp32)
instructions per element: the kernels' budget (tl.log alone costs 20, a shifted reload 3 to 6).

LRN has two algorithms: channels-contiguous layouts take "vector" where ``VECTOR`` has an entry, the
others "stream" per ``STREAM`` (docs/design/lrn.md has the sweeps). s^-beta is
exp2(-beta * log2(s)) with the hardware's lg2.approx / ex2.approx (tl.log is a 20-instruction
polynomial): 2 MUFU ops per element forward, 3 backward (one log2, two exp2).

"stream", ``lrn_stream_kernel``: a program owns a block of pixels and walks a chunk of their channels
in groups of V (16 bytes of channels per thread if channels are contiguous, else 1) per loop step,
the [pixels, V] tile split into V register tensors. The window's lanes (x^2, and in backward x, dy,
s^-beta, t = dy x s^(-beta-1)) ride in loop-carried tuples: each window sum is an exact sum of n
registers, nothing is loaded twice (beyond a chunk's halo) and backward needs no scratch (step t
completes s for group t - LAG_S and the mirrored window of t for group t - LAG_S - LAG_D). DEPTH steps
of loads are in flight (prefetched into the tuple: Triton's pipeliner leaves such loads alone).

"vector", ``lrn_vector_kernel`` (channels stride 1): a program's tile is [(pixel, group) rows, V]
(16-byte groups, a warp's load 512 contiguous bytes); the groups around each row come from the tile
reloaded shifted by whole groups (aligned vectors, L1 hits; taking them from neighbouring warp lanes
by shfl.sync instead is no faster on the H200). Backward computes s and t on the n - 1 channels
around its groups as well: all in registers, one pass.

Divisive normalization (rare, not a speed target) uses one gather kernel in three phases over
planes (sample, channel) with spatial dims (D, H, W): FORWARD (box window of d^2, d = x - means),
CARRY (temp = dy * d * s^(-beta-1), temp2 = s^-beta: cuDNN's temp buffers) and GRADIENT (mirrored
box sum of temp, then dx and dmeans = -dx). Window loops are runtime loops: n^S loads per element.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.families.lrn.problem import LRNProblem
from opendnn.families.lrn.triton_kernels import divisive_kernel, lrn_stream_kernel, lrn_vector_kernel
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

# The streaming kernel (lrn_stream_kernel) per (direction, channels-inner layout, 16-bit data): pixels
# per thread, warps, groups of loads in flight (depth), channels per program (chunk; 0: all) and the
# channel loop's unroll factor (unrolled, the register tuples' rotation is renaming instead of moves).
# Channels-inner layouts step V = 16 bytes of channels per thread, the others one channel. Programs are
# long (a channel walk): chunks trade the last wave's idle SMs against re-reading n - 1 halo channels.
# Each entry is the fastest stream variant of an H200 sweep (docs/design/lrn.md); channels-inner
# layouts take it only where VECTOR's entry is None.
STREAM = {
    ("forward", False, False): dict(pixels_per_thread=4, warps=1, depth=8, chunk=64, unroll=8),
    ("forward", False, True): dict(pixels_per_thread=4, warps=1, depth=4, chunk=128, unroll=8),
    ("forward", True, False): dict(pixels_per_thread=1, warps=2, depth=8, chunk=0, unroll=8),
    ("forward", True, True): dict(pixels_per_thread=1, warps=2, depth=4, chunk=64, unroll=8),
    ("backward", False, False): dict(pixels_per_thread=4, warps=1, depth=2, chunk=128, unroll=8),
    ("backward", False, True): dict(pixels_per_thread=4, warps=1, depth=4, chunk=64, unroll=8),
    ("backward", True, False): dict(pixels_per_thread=2, warps=2, depth=4, chunk=0, unroll=8),
    ("backward", True, True): dict(pixels_per_thread=1, warps=2, depth=8, chunk=0, unroll=8),
}
# Channels-contiguous layouts (channels stride 1) take ``lrn_vector_kernel`` where the entry of
# (direction, 16-bit data) is not None: rows (pixel, 16-byte channel group) per thread, warps, groups per
# program at most (the rest of its rows are pixels). H200, 64x256x56x56 n=5 (docs/design/lrn.md): forward fp32 /
# bf16 102.8 / 56.8 us, backward 147.7 (4 rows a thread) / 101.9 (2 rows).
VECTOR = {
    ("forward", False): dict(rows_per_thread=2, warps=4, groups=64),
    ("forward", True): dict(rows_per_thread=2, warps=4, groups=64),
    ("backward", False): dict(rows_per_thread=4, warps=4, groups=64),
    ("backward", True): dict(rows_per_thread=2, warps=4, groups=64),
}
DIVISIVE_BLOCK = 256


# the launchers -------------------------------------------------------------------------------------


def supports(problem: LRNProblem) -> str | None:
    return None


def run(
    problem: LRNProblem,
    x: Bound,
    y: Bound,
    means: Bound | None = None,
    dy: Bound | None = None,
    dmeans: Bound | None = None,
    temp: Bound | None = None,
    temp2: Bound | None = None,
) -> None:
    """Forward writes y; backward writes dx into ``y`` (and dmeans for divisive normalization)."""
    bounds = dict(x=x, out=y, means=means, dy=dy, dmeans=dmeans, temp=temp, temp2=temp2)
    present = {name: bound for name, bound in bounds.items() if bound is not None}
    given = tuple((name, bound.desc) for name, bound in present.items())
    tensors = {name: torch_view(bound) for name, bound in present.items()}
    device = tensors["x"].device
    lrn_launches(problem, given, (device.index or 0) if device.type == "cuda" else None)(tensors)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (LRN keeps no plan)
def lrn_launches(problem: LRNProblem, given: tuple[tuple[str, TensorDescriptor], ...], device: int | None) -> Launches:
    """The launches computing ``problem`` on the tensors ``given`` as (name, descriptor) on CUDA device
    ``device`` (None: the interpreter), planned once."""
    descs = dict(given)
    if problem.divisive:
        return _divisive_launches(problem, descs)
    return _lrn_launches(
        problem, [descs[name] for name in (("x", "out") if "dy" not in descs else ("x", "dy", "out"))], device
    )


def _scalars(problem: LRNProblem) -> tuple[float, ...]:
    desc = problem.desc
    return desc.k, problem.scale, desc.beta, problem.alpha, problem.beta


def _compute(problem: LRNProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32


def _scratch_dtype(problem: LRNProblem) -> Any:
    import torch

    return torch.float64 if problem.compute_dtype is DataType.DOUBLE else torch.float32


def _pixel_dims(descs: list[TensorDescriptor]) -> list[tuple[int, tuple[int, ...]]]:
    """The spatial dims (logical order) merged where contiguous for every operand."""
    dims = descs[0].dims
    merged: list[tuple[int, tuple[int, ...]]] = []
    for k in range(2, len(dims)):
        strides = tuple(d.strides[k] for d in descs)
        if dims[k] == 1:
            continue
        if merged and all(outer == s * dims[k] for outer, s in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * dims[k], strides)
        else:
            merged.append((dims[k], strides))
    return merged or [(1, (0,) * len(descs))]


def _lrn_launches(problem: LRNProblem, descs: list[TensorDescriptor], device: int | None) -> Launches:
    """descs: x and y (forward) or x, dy and dx (backward, dx in the "out" slot)."""
    channels_inner = descs[0].strides[1] == 1 and descs[0].dims[1] > 1
    direction = "backward" if problem.backward else "forward"
    narrow = max(d.dtype.itemsize for d in descs) <= 2
    if channels_inner and VECTOR[direction, narrow] is not None:
        return _vector_launches(problem, descs, _pixel_dims(descs), VECTOR[direction, narrow], device)
    return _stream_launches(
        problem, descs, _pixel_dims(descs), STREAM[direction, channels_inner, narrow], channels_inner, device
    )


def _stream_launches(
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    config: dict[str, int],
    channels_inner: bool,
    device: int | None,
) -> Launches:
    """One ``lrn_stream_kernel`` launch; descs: x and y, or x, dy and dx."""
    pixels = math.prod(size for size, _ in pixel_dims)
    channels = descs[0].dims[1]
    vector = min(8, max(1, 16 // max(d.dtype.itemsize for d in descs))) if channels_inner else 1
    vector = min(vector, triton.next_power_of_2(channels))
    # twice the registers per pixel (windows over 8, float64): half the pixels per thread
    halvings = (problem.desc.n > 8) + (problem.compute_dtype is DataType.DOUBLE)
    per_thread = max(1, config["pixels_per_thread"] >> halvings) if device is not None else 1
    warps = config["warps"] if device is not None else 1
    block_p = min(32 * warps * per_thread, triton.next_power_of_2(pixels))
    groups = triton.cdiv(channels, vector)
    chunk_groups = groups if not config["chunk"] else min(groups, max(1, config["chunk"] // vector))
    chunks = triton.cdiv(groups, chunk_groups)
    pixel_blocks = triton.cdiv(pixels, block_p)
    return _channel_launch(
        lrn_stream_kernel,
        problem,
        descs,
        pixel_dims,
        device,
        pixel_blocks * chunks,
        (pixel_blocks, chunks, chunk_groups),
        vector * (config["depth"] + 2) + problem.desc.n,
        EVEN_P=pixels % block_p == 0,
        V=vector,
        DEPTH=config["depth"],
        UNROLL=config["unroll"],
        BLOCK_P=block_p,
        num_warps=max(1, min(warps, block_p // 32)),
    )


def _vector_launches(
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    config: dict[str, Any],
    device: int | None,
) -> Launches:
    """One ``lrn_vector_kernel`` launch (channels stride 1); descs: x and y, or x, dy and dx."""
    pixels = math.prod(size for size, _ in pixel_dims)
    channels = descs[0].dims[1]
    vector = min(max(1, 16 // max(d.dtype.itemsize for d in descs)), triton.next_power_of_2(channels))
    groups = triton.cdiv(channels, vector)
    block_g = min(triton.next_power_of_2(groups), config["groups"])
    rows = 32 * config["warps"] * config["rows_per_thread"] if device is not None else 32
    block_p = min(max(1, rows // block_g), triton.next_power_of_2(pixels))
    pixel_blocks, group_blocks = triton.cdiv(pixels, block_p), triton.cdiv(groups, block_g)
    return _channel_launch(
        lrn_vector_kernel,
        problem,
        descs,
        pixel_dims,
        device,
        pixel_blocks * group_blocks,
        (pixel_blocks, group_blocks),
        problem.desc.n + 2 * vector,
        EVEN_P=pixels % block_p == 0,
        V=vector,
        BLOCK_P=block_p,
        BLOCK_G=block_g,
        num_warps=max(1, min(config["warps"], block_p * block_g // 32)) if device is not None else 1,
    )


def _channel_launch(
    kernel: Any,
    problem: LRNProblem,
    descs: list[TensorDescriptor],
    pixel_dims: list[tuple[int, tuple[int, ...]]],
    device: int | None,
    blocks: int,
    block_args: tuple[int, ...],
    reach: int,
    **flags: Any,
) -> Launches:
    """One launch of ``kernel`` (``lrn_stream_kernel`` or ``lrn_vector_kernel``: the same leading arguments) over
    ``blocks`` programs per sample; ``reach``: how many channels past a sample its offsets may go."""
    x = descs[0]
    operands = [x, descs[1] if problem.backward else x, descs[-1]]
    strides = [tuple(s[j] for _, s in pixel_dims) for j in range(len(descs))]
    pixel_strides = strides if problem.backward else [strides[0], strides[0], strides[1]]
    compute = _compute(problem)
    flags.update(
        WINDOW=problem.desc.n,
        BEHIND=problem.desc.lookbehind,
        BACKWARD=problem.backward,
        PIXEL_DIMS=len(pixel_dims),
        PIXEL_UNIT=len(pixel_dims) == 1 and all(s == 1 for s in pixel_dims[0][1]),
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=compute,
        FAST=device is not None and compute == tl.float32,
        WIDE=max(_sample_extent(d) + reach * abs(d.strides[1]) for d in operands) >= 2**31,
    )
    tensors = (Slot("x"), Slot("dy") if problem.backward else Slot("x"), Slot("out"))
    return Launches(
        (
            Launch(
                kernel,
                (x.dims[0] * blocks,),
                (
                    *tensors,
                    tuple(d.strides[0] for d in operands),
                    tuple(d.strides[1] for d in operands),
                    tuple(size for size, _ in pixel_dims),
                    *pixel_strides,
                    x.dims[1],
                    math.prod(size for size, _ in pixel_dims),
                    *block_args,
                    *_scalars(problem),
                ),
                flags,
            ),
        )
    )


def _sample_extent(desc: TensorDescriptor) -> int:
    """The largest element offset within one sample (dims 1..), plus one."""
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(desc.dims[1:], desc.strides[1:]))


def _divisive_launches(problem: LRNProblem, descs: dict[str, TensorDescriptor]) -> Launches:
    """The divisive normalization's phases; a backward's temp and temp2 are per-call scratch when not given."""
    x = descs["x"]
    scratch = tuple(
        Scratch(name, x.numel, _scratch_dtype(problem))
        for name in ("temp", "temp2")
        if problem.backward and name not in descs
    )
    strides = {name: desc.strides for name, desc in descs.items()}
    strides.update((array.name, packed_strides(x.dims)) for array in scratch)
    names = ("x", "means", "dy", "out", "dmeans", "temp", "temp2")
    pointers = [Slot(name if name in strides else "x") for name in names]
    dims = x.dims
    sizes = (1, *dims[2:]) if len(dims) == 4 else dims[2:]
    spatial = math.prod(sizes)
    grid = (dims[0] * dims[1], triton.cdiv(spatial, DIVISIVE_BLOCK))
    flags = dict(
        SPATIAL_DIMS=len(dims) - 2,
        BEHIND=problem.desc.lookbehind,
        HAS_MEANS="means" in descs,
        HAS_DMEANS="dmeans" in descs,
        HAS_BETA=problem.beta != 0.0,
        COMPUTE=_compute(problem),
        BLOCK=DIVISIVE_BLOCK,
        num_warps=4,
    )
    arguments = (
        *pointers,
        *(_five_strides(strides.get(name, x.strides)) for name in names),
        sizes,
        dims[1],
        spatial,
        problem.desc.n,
        *_scalars(problem),
    )
    phases = ("carry", "gradient") if problem.backward else ("forward",)
    return Launches(
        tuple(Launch(divisive_kernel, grid, arguments, dict(PHASE=phase, **flags)) for phase in phases), scratch
    )


def _five_strides(strides: tuple[int, ...]) -> tuple[int, ...]:
    """(n, c, d, h, w) strides of a 4-D or 5-D tensor (d stride 0 for 4-D)."""
    return strides if len(strides) == 5 else (strides[0], strides[1], 0, strides[2], strides[3])
