"""Strided tensors reduced to the canonical form the elementwise kernels take.

Every elementwise problem, whatever its dimension order, strides and broadcasts, becomes RANK
dims: six outer dims walked by program id, then a tile of dims A x B. B is the output's innermost
dim; A is an input's innermost dim when that differs from B (a transpose: loads coalesce along A,
stores along B, and Triton stages the tile through shared memory), else the output's next dim.
Dims of size 1 are dropped and dims that are contiguous for every operand merge, so packed
tensors of any shape become one long dim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opendnn.core.descriptors import TensorDescriptor

RANK = 8
OUTER_DIMS = RANK - 2


@dataclass(frozen=True)
class TiledLayout:
    sizes: tuple[int, ...]  # RANK sizes: OUTER_DIMS outer dims, then A, then B
    strides: tuple[tuple[int, ...], ...]  # for each operand (output first), RANK strides
    transposed: bool  # A is an input's innermost dim

    @property
    def outer(self) -> int:
        count = 1
        for size in self.sizes[:OUTER_DIMS]:
            count *= size
        return count


def tile_layout(dims: Sequence[int], operands: Sequence[TensorDescriptor]) -> TiledLayout:
    """Canonical layout of operands (output first) broadcast to ``dims``."""
    strides = [[s if d > 1 else 0 for d, s in zip(desc.dims, desc.strides)] for desc in operands]
    order = sorted((k for k in range(len(dims)) if dims[k] > 1), key=lambda k: tuple(-s[k] for s in strides))
    sizes: list[int] = []
    merged: list[list[int]] = [[] for _ in operands]
    for k in order:
        if sizes and all(m[-1] == s[k] * dims[k] for m, s in zip(merged, strides)):
            sizes[-1] *= dims[k]
            for m, s in zip(merged, strides):
                m[-1] = s[k]
        else:
            sizes.append(dims[k])
            for m, s in zip(merged, strides):
                m.append(s[k])
    tile_a = _transposed_dim(sizes, merged[1:])
    transposed = tile_a is not None
    if tile_a is None:
        tile_a = len(sizes) - 2
    if tile_a >= 0:
        moved = [k for k in range(len(sizes)) if k not in (tile_a, len(sizes) - 1)] + [tile_a, len(sizes) - 1]
        sizes = [sizes[k] for k in moved]
        merged = [[m[k] for k in moved] for m in merged]
    pad = RANK - len(sizes)
    return TiledLayout(tuple([1] * pad + sizes), tuple(tuple([0] * pad + m) for m in merged), transposed)


def _transposed_dim(sizes: list[int], input_strides: list[list[int]]) -> int | None:
    """The innermost dim of the first input whose innermost dim is not the output's."""
    last = len(sizes) - 1
    for strides in input_strides:
        moving = [k for k in range(len(sizes)) if strides[k] != 0]
        if not moving:
            continue
        inner = min(moving, key=lambda k: strides[k])
        if inner != last and (strides[last] == 0 or strides[inner] < strides[last]):
            return inner
    return None
