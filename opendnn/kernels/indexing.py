"""Indexing helpers the kernels of several families share: a flat index to strided offsets
(``dim_offsets``, ``flat_offsets``, in the kernels) and the merging of dims into the fewest strided
ones (``merged_dims``, in the planners)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dim_offsets(index, COUNT: tl.constexpr, sizes, strides):
    """Offset of ``index`` taken row-major over dims 0 .. COUNT-1 (the last fastest). The
    outermost dim takes the rest without a modulo: an index past the end gives an offset past
    the end, which callers mask."""
    offset = index * 0
    for j in tl.static_range(COUNT - 1):
        offset += (index % sizes[COUNT - 1 - j]) * strides[COUNT - 1 - j]
        index = index // sizes[COUNT - 1 - j]
    if COUNT > 0:
        offset += index * strides[0]
    return offset


@triton.jit
def flat_offsets(index, COUNT: tl.constexpr, sizes, strides, UNIT: tl.constexpr):
    """``dim_offsets``, or ``index`` itself when the dims merge into one of stride 1 (UNIT)."""
    if UNIT:
        offsets = index
    else:
        offsets = dim_offsets(index, COUNT, sizes, strides)
    return offsets


def merged_dims(dims: list[tuple[int, tuple[int, ...]]], by_stride: bool = True) -> list[tuple[int, tuple[int, ...]]]:
    """(size, strides of each operand) dims, size-1 dims dropped, neighbours merged where every
    operand is contiguous across them (outer stride = inner stride * inner size). ``by_stride``:
    sorted by the strides first (outermost first), else in the order given. Shared by the
    reduction, softmax, batch norm and layer-norm plans."""
    kept = [d for d in dims if d[0] > 1]
    merged: list[tuple[int, tuple[int, ...]]] = []
    for size, strides in sorted(kept, key=lambda d: tuple(-s for s in d[1])) if by_stride else kept:
        if merged and all(outer == s * size for outer, s in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * size, strides)
        else:
            merged.append((size, strides))
    return merged
