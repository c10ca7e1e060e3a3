"""Pooling forward and backward (max, average including / excluding padding; 1, 2 and 3 spatial
dims; any strides; dilated max windows and torch's indices): a forward kernel that also finds the
argmax for the backward, and a gather backward kernel.

Memory model (bytes of the tensors' dtype; E = x's elements, F = y's elements):
- forward reads x once and writes y once: E + F (F more with beta != 0). Each element of x is
  loaded once per window that holds it, but the windows of one program overlap in L1/L2, so DRAM
  sees x once. 64 x 256 x 56 x 56 float32 with 3x3 stride 2: 206 MB + 51 MB, 0.061 ms at 4.2 TB/s.
- max backward, two passes: (1) the forward kernel reads x and y and writes, per output, the
  position in its window of the first element equal to y (int8 for windows of up to 127
  positions): E + F + F/4 for float32; (2) the gather reads those positions and dy and writes dx
  once: F/4 + F + E. Average backward is the gather alone, on dy: F + E.
- return_indices: the max forward ("indices") also writes each output's int64 index: E + F + 8F bytes.
FLOPs: one compare or add per window position: memory-bound.

Dilation: window offset j reads input position ``o * stride - padding + j * dilation``; the general
forward path and the argmax pass scale each offset's position and address by the constexpr DILATION
(1 folds away: undilated kernels compile as without it); the strips stay undilated.

Indices (KIND "indices"): the max forward keeps, beside the max, the window position of torch's index,
walking the window first to last in N, C, D, H, W order: the first input position, then each element
larger than the max so far, and with NaN propagation each NaN (the last NaN stays); it converts that
position to the flat index into x's spatial plane (PLANE: each dim's weight) at the store. One pass over
x, no read of y (the argmax pass matches y and keeps the first NaN, not torch's last).

Layout: the tensors become five canonical dims (N, C, D, H, W; missing spatial dims of size 1,
window 1), reordered so that the walked dim with the smallest stride (C for NHWC, W for NCHW) comes
last and the one with the next smallest (W for NHWC, H for NCHW) before it. A program owns BLOCK_R
rows (the four outer dims, flattened) by BLOCK_C positions of the last dim, held as a (BLOCK_C,
BLOCK_R) tensor: Triton's coalescing pass puts the lanes along dim 0 when no dim is contiguous (NCHW
with stride 2), so a warp's load spans 32 neighbouring positions of one row; in NHWC the last dim is
contiguous and the loads are vectorized along it. The program splits its first row index once; the
other rows' coordinates come from compares and carries (no division per element: int64 divisions per
row would be most of the kernel's instructions and registers on sm_90). Offsets are an int64
scalar base per tile plus int32 per element (int64 only for tensors past 2**31 elements). The window
loop is unrolled over the constexpr window (a plain loop for windows over UNROLL_LIMIT positions).

Global windows (each window the whole input along the dims it pools, one output there: global pools)
have few outputs and long windows: a tile
of outputs walking its windows would leave the GPU idle (64 x 32 x 112 x 112 NHWC: two programs of 1,024
outputs, each walking 12,544 positions). The forward average and max are the reduce family's reduction
of the pooled dims instead, split across the GPU with a fixed-order sum of the slices, and the average's
backward is a broadcast, ``dx = alpha * dy / count + beta * dx`` (the pointwise family's kernel), each at
copy speed. The max's argmax pass, its gather and the forward with indices keep the pooling kernels' plain
loops (GLOBAL) with the window's sizes at run time, so one compiled kernel serves every input size (the
window-shaped constants are None); the forward's plain loop unrolls LOOP_CHUNK positions at a time. The
max's backward spreads over a second grid axis (``_spread``): the argmax pass in slices of the window, each
its first match into a slice of the scratch, and the gather (each cell's dy and the least of the slices'
positions loaded once) in runs of the phases. Where the window's positions are one unit-stride run in x and
dx (NCHW, NCDHW: ``_positions_in_lines``) the max's backward takes ``triton_global``'s kernels instead: their
tiles are cells by lines of positions, so loads of x and stores of dx are whole 16-byte vectors, where the
tiled kernels' lanes run along the cells, each a plane apart.

Adaptive windows (torch's adaptive cells along the dims whose cells are not one size at one step,
``PoolingProblem.adaptive``; ADAPTIVE per canonical dim): output o's window is [floor(o in / out),
ceil((o + 1) in / out)), computed per row or column of the tile; WINDOW is the largest cell, and offsets
from the smallest cell's size on (HIGH) are tested against the cell's end. In the gather a cell of an
adaptive dim is one input position (stride 1), and its windows are the SHIFTS outputs from the first
holding it (at most ceil(out / in) + 1); its offset in each window is taken off that window's argmax
position, so the phases' constant offsets match as on a fixed window. With ADAPTIVE all false the
kernels compile as without it (the adaptive code sits in constexpr branches, without inlined helpers).

Strips (forward, stride 2 along unit-stride input rows: NCHW): instead of one strided scalar load per
window position and output, each window row is read as a contiguous strip of 2 x BLOCK_C input positions
per tile row (16-byte vector loads: the launcher proves the rows aligned, ``_strip_alignment``, and the
kernel says so with ``tl.multiple_of``), reshaped into (column, 2) pairs and split into even and odd
positions: with padding 1 a 3-wide window takes odd[c - 1], even[c], odd[c], and odd[c - 1] is the odd
half shifted one column in registers (``shift_right``) plus one load per thread's run of columns (the
value left of the run). Outputs are stored as vectors too (``Y_VECTOR``).

Backward gather: each input position ``i = o * stride - padding + r`` belongs to exactly one cell
``o`` (``r`` in ``0 .. stride - 1``), so a program owns a tile of cells and, for each phase ``r``,
writes dx at the cell's input positions: the sum over the windows ``o - q`` that hold ``i`` (``r + q *
stride`` a multiple of the dilation, at window offset ``(r + q * stride) / dilation < window``) of their
dy, where that window's argmax is this offset (max) or divided by the window's count (averages). A
dilated window spans ``dilation * (window - 1) + 1`` positions: more windows ``q`` per cell, each adding
to the phases that fall on its offsets (constants of the unrolled loops). Each window's dy (and
argmax) is loaded once per cell and shared by every phase (one sum per phase, the stores last). Every
element of dx is written once, no atomics, in a fixed order: the results are bitwise repeatable.

Masks: rows past the output (and, for strided columns, columns past it) read the last row's or
column's window, so the forward's loads carry no tile mask, only its stores. A position is tested
against the input's start only at the window offsets under the padding (LOW: ``ceil(padding /
dilation)`` offsets), and against its end only at the offsets where the last window overhangs it
(constants of the launch): with 3x3 windows, stride 2,
padding 1 on 56 positions, 4 of 9 offsets test nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dispatch import backend_module
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.pointwise.problem import PointwiseMode, pointwise_problem
from opendnn.families.pooling.numpy_backend import _windows_holding_input
from opendnn.families.pooling.problem import PoolingProblem, _geometry, adaptive_cells
from opendnn.families.pooling.triton_backward import pool_backward_kernel
from opendnn.families.pooling.triton_forward import LOOP_CHUNK, pool_forward_kernel
from opendnn.families.pooling.triton_global import global_argmax_kernel, global_gather_kernel
from opendnn.families.reduce.problem import ReduceProblem, ReduceTensorOp
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

CANONICAL_DIMS = 5
# window positions (or phase x shift pairs) unrolled in full: 5 x 5 and 3 x 3 x 3 windows. Compiling costs about
# 0.1 s a position for sm_90 (at 64, a 4 x 4 x 4 max pool took 6.5 s forward, 7.2 s backward: docs/design/pooling.md)
UNROLL_LIMIT = 27
FORWARD_TILE = 512  # outputs of a forward program (H200, NHWC 3x3 max fwd: 512 beat 1024, 2048 and 4096)
STRIP_TILE = 1024  # outputs of a forward program reading stride-2 windows as contiguous strips (NCHW)
STRIP_WARPS = 4  # 8 outputs per thread (H200 sweep: 3x3 max bf16 33.0 us at 4 warps, 33.9 at 2, 42.2 at 8)
STRIP_BYTES = 16  # widest vector of a strip load (0: no strips, every forward takes the general path)
ARGMAX_TILE = 1024  # outputs of an argmax program (it holds y and positions too), half for strided loads
BACKWARD_TILE = 512  # cells of a backward program: each writes prod(stride) elements of dx (registers)
MAX_INNER_BLOCK = 256
NARROW_SCALE = 2  # tiles of dtypes under 4 bytes with contiguous columns: this many times the elements
INT32_LIMIT = 2**31 - 1
# a GLOBAL max backward spread over a second grid axis: about this many programs (H200: 132 SMs), slices of the
# window (or runs of its phases) of at least this many positions
SPREAD_PROGRAMS = 1024
SPREAD_POSITIONS = 128
# a GLOBAL max backward whose window positions are one unit-stride run in x and dx (NCHW): a program's tile
GLOBAL_CELLS = 8  # cells (windows), 2 a warp
GLOBAL_LINE_BYTES = 512  # a cell's positions a loop step: a warp's 32 lanes x 16-byte vectors
GLOBAL_WARPS = 4


# launcher ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanonicalPooling:
    """The problem on five dims (N, C, D, H, W) reordered so that the innermost dim comes last."""

    order: tuple[int, ...]  # canonical dim -> original dim (N, C, D, H, W numbering)
    window: tuple[int, ...]
    stride: tuple[int, ...]
    pads: tuple[int, ...]
    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]
    linear: tuple[int, ...]  # weight of each dim's window offset in the row-major window position
    dilation: tuple[int, ...]  # input positions between a window's neighbouring offsets
    adaptive: tuple[bool, ...] = (False,) * CANONICAL_DIMS  # torch's adaptive cells (window: the largest)

    def permute(self, values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in self.order)

    @property
    def overhang(self) -> tuple[int, ...]:
        """Per dim, the first window offset at which the last window passes the input's end (the window's
        size when none does); the offsets under the padding (``low``) can fall before its start. Along an
        adaptive dim, the first offset past a cell's end: its smallest cell's size."""
        return tuple(
            _smallest_cell(n, o) if a else min(-(-(n + p - (o - 1) * s) // d), w)
            for w, s, p, n, o, d, a in zip(
                self.window, self.stride, self.pads, self.in_sizes, self.out_sizes, self.dilation, self.adaptive
            )
        )

    @property
    def low(self) -> tuple[int, ...]:
        """Per dim, the window offsets that can fall before the input's start: those under the padding."""
        return tuple(-(-p // d) for p, d in zip(self.pads, self.dilation))

    @property
    def extent(self) -> tuple[int, ...]:
        """Per dim, the input positions a window spans: ``dilation * (window - 1) + 1``."""
        return tuple(d * (w - 1) + 1 for w, d in zip(self.window, self.dilation))

    @property
    def clipped(self) -> tuple[bool, ...]:
        """Per dim, whether a window may reach past the input (padding, or ceil mode's last window): the
        kernels count windows' sizes only along those dims (an adaptive dim's counts are its cells')."""
        return tuple(
            not a and (p > 0 or h < w) for p, h, w, a in zip(self.pads, self.overhang, self.window, self.adaptive)
        )

    @property
    def is_global(self) -> bool:
        """Each window is the whole input along the dims it pools (one output there; every other dim has
        window 1 and stride 1), without padding or dilation: the kernels' GLOBAL path, which takes the
        window's sizes at run time (one compiled kernel for every input size)."""
        return (
            not any(self.pads)
            and not any(self.adaptive)
            and all(d == 1 for d in self.dilation)
            and all(
                (w == n and o == 1) or (w == 1 and s == 1)
                for w, s, n, o in zip(self.window, self.stride, self.in_sizes, self.out_sizes)
            )
        )


def _smallest_cell(size: int, out: int) -> int:
    """The fewest positions of an adaptive cell (``adaptive_cells``) along a dim of ``size`` into ``out``."""
    return min(end - start for start, end in adaptive_cells(size, out))


def _most_holders(size: int, out: int) -> int:
    """The most adaptive cells holding one input position along a dim of ``size`` into ``out``: position i
    lies in outputs ``floor(i * out / size)`` to ``ceil((i + 1) * out / size) - 1``."""
    i = np.arange(size, dtype=np.int64)
    return int((-(-(i + 1) * out // size) - i * out // size).max())


def _five(values: tuple[int, ...], lead: int, fill: int) -> tuple[int, ...]:
    """(N, C, *spatial) values widened to (N, C, D, H, W) with ``fill`` for the missing leading spatial dims."""
    return (*values[:2], *(fill,) * lead, *values[2:])


def canonical(problem: PoolingProblem, inner_strides: tuple[int, ...], cells: bool) -> CanonicalPooling:
    """The canonical form: last the dim of smallest ``inner_strides`` among those the tile walks (more
    than one output, or more than one cell when ``cells``), before it the walked dim of next smallest
    stride (the tile's rows), the others in N, C, D, H, W order (one position per program)."""
    lead = 3 - len(problem.window)
    window = (1, 1, *(1,) * lead, *problem.window)
    stride = (1, 1, *(1,) * lead, *problem.stride)
    pads = (0, 0, *(0,) * lead, *problem.padding)
    dilation = (1, 1, *(1,) * lead, *(problem.dilation or (1,) * len(problem.window)))
    adaptive = (False, False, *(False,) * lead, *(problem.adaptive or (False,) * len(problem.window)))
    in_sizes = _five(problem.x.dims, lead, 1)
    out_sizes = _five(problem.y.dims, lead, 1)
    walked = _cell_sizes(in_sizes, stride, pads) if cells else out_sizes
    strides = _five(inner_strides, lead, 0)

    def smallest_stride(dims: list[int]) -> int:
        return min([d for d in dims if walked[d] > 1] or dims[-1:], key=lambda d: (strides[d], -d))

    inner = smallest_stride(list(range(CANONICAL_DIMS)))
    rest = [d for d in range(CANONICAL_DIMS) if d != inner]
    row = smallest_stride(rest)
    order = (*(d for d in rest if d != row), row, inner)
    linear = tuple(math.prod(window[d + 1 :]) for d in range(CANONICAL_DIMS))

    def pick(values: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(values[d] for d in order)

    return CanonicalPooling(
        order,
        pick(window),
        pick(stride),
        pick(pads),
        pick(in_sizes),
        pick(out_sizes),
        pick(linear),
        pick(dilation),
        tuple(adaptive[d] for d in order),
    )


def _cell_sizes(in_sizes: tuple[int, ...], stride: tuple[int, ...], pads: tuple[int, ...]) -> tuple[int, ...]:
    """Cells per dim: enough for every input position ``o * stride - pad + r`` (``r < stride``)."""
    return tuple(-(-(n + p) // s) for n, s, p in zip(in_sizes, stride, pads))


def _launch_shape(
    sizes: tuple[int, ...], unit_stride: bool, tile: int, narrow: bool
) -> tuple[tuple[int], int, int, bool]:
    """Grid, BLOCK_R, BLOCK_C and CARRY for a tile walk over canonical ``sizes`` (rows: dims 0-3
    flattened). ``tile`` elements per program, NARROW_SCALE times that when ``narrow`` (a 2-byte dtype
    whose columns are contiguous: vector loads): a thread's index and mask work is per vector whatever
    its bytes, so at fp32's count bf16 moved half the bytes per instruction (and its gather loaded 8 of
    16 bytes). When dim 3 holds at least a quarter of the rows' block, the block is cut to at most twice
    dim 3 so that a tile's row coordinates come from compares (CARRY)."""
    if narrow:
        tile *= NARROW_SCALE
    block_c = min(triton.next_power_of_2(sizes[4]), MAX_INNER_BLOCK if unit_stride else 64)
    rows = math.prod(sizes[:4])
    block_r = max(1, min(tile // block_c, triton.next_power_of_2(rows)))
    carry = 4 * sizes[3] >= block_r
    if carry:
        block_r = min(block_r, 1 << (2 * sizes[3]).bit_length() - 1)
    programs = triton.cdiv(rows, block_r) * triton.cdiv(sizes[4], block_c)
    assert programs <= INT32_LIMIT and rows <= INT32_LIMIT, f"{rows} rows"
    return (programs,), block_r, block_c, carry


def _wide(plan: CanonicalPooling, *strides: tuple[int, ...]) -> bool:
    """Whether an offset from a tile's base (its rows reach one step or the full size of dims 0-2; window
    and padding included) may pass int32."""
    extents = [
        max(plan.in_sizes[d], plan.out_sizes[d]) + 2 * (plan.extent[d] + plan.stride[d]) for d in range(CANONICAL_DIMS)
    ]
    return any(sum(e * abs(s) for e, s in zip(extents, strides_)) > INT32_LIMIT for strides_ in strides)


def _argmax_dtype(positions: int) -> Any:
    import torch

    return torch.int8 if positions <= 127 else torch.int16 if positions <= 32767 else torch.int32


def supports(problem: PoolingProblem) -> str | None:
    for k, (adaptive, size, out) in enumerate(zip(problem.adaptive, problem.x.dims[2:], problem.y.dims[2:])):
        # the kernels' int32 products o * size and (i + 1) * out (o up to twice the outputs in a tile's last block)
        if adaptive and 2 * (size + 1) * (out + 1) > INT32_LIMIT:
            return f"adaptive cells of spatial dim {k}: {size} positions into {out} outputs pass 32-bit products"
    return None


def run(
    problem: PoolingProblem, x: Bound, y: Bound, dy: Bound | None, dx: Bound | None, indices: Bound | None = None
) -> None:
    tensors = {"x": torch_view(x), "y": torch_view(y)}
    if dx is None or dy is None:
        reduction = _global_reduction(problem) if indices is None else None
        if reduction is not None:  # another family's backend: through the operation table
            reduce = backend_module("reduce", "triton")
            fast = reduce.FAST_PICKS and tensors["x"].is_cuda
            reduce.scratch_launches(reduction, fast)({"a": tensors["x"], "c": tensors["y"]})
            return
        if indices is not None:
            tensors["indices"] = torch_view(indices)
        _forward_launches(problem, indices is not None)(tensors)
    elif not problem.mode.is_max and _is_global(problem):  # dx = alpha * dy / count + beta * dx, broadcast
        count = math.prod(problem.window)
        spread = pointwise_problem(PointwiseMode.IDENTITY, [dy], dx, alpha=problem.alpha / count, beta=problem.beta)
        backend_module("pointwise", "triton").run(spread, [dy], dx)
    else:
        tensors["dy"], tensors["dx"] = torch_view(dy), torch_view(dx)
        _backward_config(problem, BACKWARD_TILE)(tensors)


@functools.lru_cache(maxsize=256)  # per problem, asked by every backward run
def _is_global(problem: PoolingProblem) -> bool:
    return canonical(problem, problem.x.strides, cells=False).is_global


@functools.lru_cache(maxsize=256)  # per problem, asked by every run
def _global_reduction(problem: PoolingProblem) -> ReduceProblem | None:
    """A forward average or max over global windows as the reduction of the dims it pools (the reduce
    family's kernels, split across the GPU when the outputs are few); None for other windows."""
    if not _is_global(problem):
        return None
    op = ReduceTensorOp.MAX if problem.mode.is_max else ReduceTensorOp.AVG
    return ReduceProblem(
        op,
        problem.x,
        problem.y,
        None,
        _pooled_dims(problem),
        problem.alpha,
        problem.beta,
        problem.propagate_nan,
        problem.compute_dtype,
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def _forward_launches(problem: PoolingProblem, with_indices: bool) -> Launch | Launches:
    """The forward: "indices" for return_indices, and for a max with NaN propagation whose dilated windows
    can lie wholly in the padding (their y is NaN: the "indices" kind knows a window found no input; its
    indices go to a scratch then), else "max" or "avg"."""
    if not problem.mode.is_max:
        return _forward_config(problem, "avg", (0,) * CANONICAL_DIMS, FORWARD_TILE)
    if with_indices:
        return _forward_config(problem, "indices", (0,) * CANONICAL_DIMS, FORWARD_TILE)
    import torch

    if not problem.dilation or not problem.propagate_nan:
        return _forward_config(problem, "max", (0,) * CANONICAL_DIMS, FORWARD_TILE)
    geometry = _geometry(
        problem.x.dims, problem.window, problem.padding, problem.stride, problem.ceil_mode, problem.dilation
    )
    if _windows_holding_input(geometry).all():
        return _forward_config(problem, "max", (0,) * CANONICAL_DIMS, FORWARD_TILE)
    dims = _five(problem.y.dims, _lead(problem), 1)
    launch = _forward_config(problem, "indices", strides_for_order(dims, tuple(range(CANONICAL_DIMS))), FORWARD_TILE)
    return Launches((launch,), (Scratch("indices", math.prod(dims), torch.int64),))


def _pooled_dims(problem: PoolingProblem) -> tuple[int, ...]:
    """The dims of x (N, C, *spatial numbering) that a global window pools: those of more than one position."""
    return tuple(2 + k for k, (w, n) in enumerate(zip(problem.window, problem.x.dims[2:])) if w == n > 1)


def _lead(problem: PoolingProblem) -> int:
    return 3 - len(problem.window)


@functools.lru_cache(maxsize=256)  # per problem, not per call: the forward's launch and the backward's argmax
def _forward_config(
    problem: PoolingProblem, kind: str, argmax_strides: tuple[int, ...], tile: int, splits: int = 1
) -> Launch:
    """The forward launch (planned once per problem): y for "max"/"avg"; y and the "indices" slot for
    "indices"; for "argmax", the window positions into the "argmax" slot (its strides over the five
    canonical dims in N, C, D, H, W numbering), for a GLOBAL window in ``splits`` slices of it (grid axis 1),
    each its first match, one after another in the slot."""
    plan = canonical(problem, problem.x.strides, cells=False)
    if plan.is_global:  # one output along the pooled dims: their stride is never stepped
        plan = dataclasses.replace(plan, stride=(1,) * CANONICAL_DIMS)
    lead = _lead(problem)
    x_strides = plan.permute(_five(problem.x.strides, lead, 0))
    y_strides = plan.permute(_five(problem.y.strides, lead, 0))
    if kind == "indices" and problem.indices is not None:  # else the scratch's
        argmax_strides = _five(problem.indices.strides, lead, 0)
    argmax_strides = plan.permute(argmax_strides)
    if kind == "argmax" and x_strides[4] * plan.stride[4] != 1:
        tile //= 2  # scalar loads: registers per output (133 against 54 on sm_90 for NCHW 3x3 at 1024)
    narrow = x_strides[4] * plan.stride[4] == 1 and problem.x.dtype.itemsize < 4
    strips = kind in ("max", "avg") and not any(plan.adaptive)
    strip = _strip_alignment(plan, x_strides, problem.x.dtype.itemsize) if strips else 0
    grid, block_r, block_c, carry = _launch_shape(
        plan.out_sizes, x_strides[4] == 1, STRIP_TILE if strip else tile, narrow
    )
    strip = min(strip, 2 * block_c)
    y_vector = _aligned_run(plan, y_strides, plan.out_sizes[4], strip // 2) if strip else 1
    args = (
        Slot("x"),
        Slot("y"),
        Slot(kind if kind in ("argmax", "indices") else "y"),
        plan.in_sizes,
        plan.out_sizes,
        plan.pads,
        x_strides,
        y_strides,
        argmax_strides,
        problem.alpha,
        problem.beta,
    )
    shaped = not plan.is_global  # the window's shape a constant of the kernel
    constants = dict(
        WINDOW=plan.window if shaped else None,
        STRIDE=plan.stride,
        CLIPPED=plan.clipped,
        ADAPTIVE=plan.adaptive,
        LOW=plan.low,
        HIGH=plan.overhang if shaped else None,
        LINEAR=plan.linear if shaped else None,
        DILATION=plan.dilation,
        PLANE=plan.permute(_plane_weights(problem)) if kind == "indices" else (0,) * CANONICAL_DIMS,
        KIND=kind,
        INCLUDE_PADDING=problem.mode.value == "avg_include",
        PROPAGATE_NAN=problem.propagate_nan,
        HAS_BETA=problem.beta != 0.0,
        UNROLL=shaped and math.prod(plan.window) <= UNROLL_LIMIT,
        GLOBAL=not shaped,
        CARRY=carry,
        WIDE=_wide(plan, x_strides, y_strides, argmax_strides),
        COMPUTE=_compute(problem),
        FULL_COLUMNS=plan.out_sizes[4] % block_c == 0,
        STRIP=strip,
        LEFT_GROUP=min(strip // 2, 4) if plan.pads[4] == 1 else 0,
        Y_VECTOR=y_vector,
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=STRIP_WARPS if strip else 4,
    )
    return Launch(pool_forward_kernel, (*grid, splits), args, constants)


def _plane_weights(problem: PoolingProblem) -> tuple[int, ...]:
    """Per dim (N, C, D, H, W numbering), the weight of a position in the flat index into x's spatial plane
    (the indices of return_indices): row-major over the spatial dims, 0 for N, C and missing dims."""
    spatial = problem.x.dims[2:]
    weights = tuple(math.prod(spatial[k + 1 :]) for k in range(len(spatial)))
    return (0, 0, *(0,) * _lead(problem), *weights)


def _strip_alignment(plan: CanonicalPooling, x_strides: tuple[int, ...], itemsize: int) -> int:
    """Elements per vector of the forward's strip loads (``strip_pool``), 0 for the general path: undilated
    windows of stride 2 along unit-stride input rows; the largest power of two up to STRIP_BYTES that divides
    the row length and the strides of the dims the tile or the window moves along (rows start aligned), if 4
    or more."""
    if plan.stride[4] != 2 or x_strides[4] != 1 or any(d > 1 for d in plan.dilation):
        return 0
    strip = _aligned_run(plan, x_strides, plan.in_sizes[4], STRIP_BYTES // itemsize)
    return strip if strip >= 4 else 0  # (float64's pairs: more instructions than the general path on sm_90)


def _aligned_run(plan: CanonicalPooling, strides: tuple[int, ...], row: int, limit: int) -> int:
    """The largest power of two up to ``limit`` that divides ``row`` (the length of the tensor's rows along
    dim 4) and the strides of the dims 0-3 that a tile or a window moves along: runs of that many columns
    start aligned when the tensor does; 1 when its columns are not contiguous."""
    if strides[4] != 1 or limit < 1:
        return 1
    moved = [strides[d] for d in range(4) if plan.in_sizes[d] > 1 or plan.window[d] > 1 or plan.pads[d] > 0]
    common = math.gcd(row, *moved)
    return min(common & -common, limit)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def _backward_config(problem: PoolingProblem, tile: int) -> Launches:
    """The backward's launches (planned once per problem): for max, the argmax pass into a per-call
    scratch (packed, in the gather's canonical order), then the gather."""
    if problem.dy is None or problem.dx is None:
        raise InternalError("pooling backward planned without dy and dx")
    if problem.mode.is_max and _is_global(problem) and _positions_in_lines(problem, problem.dx):
        return _global_max_backward(problem, problem.dy, problem.dx)
    plan = canonical(problem, problem.dx.strides, cells=True)
    if plan.is_global:  # one cell along the pooled dims, the whole window, whatever the descriptor's stride
        plan = canonical(problem, problem.dx.strides, cells=False)
        plan = dataclasses.replace(plan, stride=plan.window)
    lead = _lead(problem)
    dims = _five(problem.y.dims, lead, 1)
    argmax_strides = strides_for_order(dims, plan.order) if problem.mode.is_max else (0,) * CANONICAL_DIMS
    cells = _cell_sizes(plan.in_sizes, plan.stride, plan.pads)
    dy_strides = plan.permute(_five(problem.dy.strides, lead, 0))
    dx_strides = plan.permute(_five(problem.dx.strides, lead, 0))
    shifts = tuple(
        _most_holders(n, o) if a else -(-e // s)
        for e, s, n, o, a in zip(plan.extent, plan.stride, plan.in_sizes, plan.out_sizes, plan.adaptive)
    )
    gather_argmax_strides = plan.permute(argmax_strides)
    # the scratch is packed in the canonical order, as dy usually is (dims of one output position do not count)
    argmax_like_dy = all(a == d for a, d, n in zip(gather_argmax_strides, dy_strides, plan.out_sizes) if n > 1)
    shaped = not plan.is_global  # the window's shape a constant of the kernel (as the forward's)
    narrow = dx_strides[4] * (plan.stride[4] if shaped else 1) == 1 and problem.x.dtype.itemsize < 4
    grid, block_r, block_c, carry = _launch_shape(cells, dx_strides[4] == 1, tile, narrow)

    args = (
        Slot("dy"),
        Slot("argmax" if problem.mode.is_max else "dy"),
        Slot("dx"),
        plan.in_sizes,
        plan.out_sizes,
        cells,
        plan.pads,
        dy_strides,
        gather_argmax_strides,
        dx_strides,
        problem.alpha,
        problem.beta,
    )
    high = tuple(n + p - (c - 1) * s for n, p, c, s in zip(plan.in_sizes, plan.pads, cells, plan.stride))
    constants = dict(
        WINDOW=plan.window if shaped else None,
        STRIDE=plan.stride if shaped else None,
        CLIPPED=plan.clipped,
        ADAPTIVE=plan.adaptive,
        LOW=plan.pads,
        HIGH=high if shaped else None,
        SHIFTS=shifts,
        LAST_SHIFT=tuple(1 + o - c for o, c in zip(plan.out_sizes, cells)),
        LINEAR=plan.linear if shaped else None,
        DILATION=plan.dilation,
        KIND="max" if problem.mode.is_max else "avg",
        INCLUDE_PADDING=problem.mode.value == "avg_include",
        HAS_BETA=problem.beta != 0.0,
        UNROLL=shaped and math.prod(plan.stride) * math.prod(shifts) <= UNROLL_LIMIT,
        GLOBAL=not shaped,
        ARGMAX_LIKE_DY=argmax_like_dy,
        CARRY=carry,
        WIDE=_wide(plan, dy_strides, dx_strides, gather_argmax_strides),
        COMPUTE=_compute(problem),
        BLOCK_R=block_r,
        BLOCK_C=block_c,
        num_warps=4,
    )
    if not problem.mode.is_max:
        return Launches((Launch(pool_backward_kernel, grid, args, constants),))
    # a GLOBAL max's few long windows: the argmax pass in slices of the window and the gather's phases in as
    # many runs, over a second grid axis (else one program a tile of outputs walks their windows whole)
    splits = 1 if shaped else _spread(grid[0], math.prod(plan.window), LOOP_CHUNK.value)
    argmax = _forward_config(problem, "argmax", argmax_strides, ARGMAX_TILE, splits)
    gather = Launch(pool_backward_kernel, (*grid, splits), args, constants)
    scratch = Scratch("argmax", splits * math.prod(dims), _argmax_dtype(math.prod(problem.window)))
    return Launches((argmax, gather), (scratch,))


def _spread(programs: int, positions: int, grain: int) -> int:
    """Slices of a GLOBAL window (and runs of its phases) for ``programs`` programs walking it whole: enough
    for about SPREAD_PROGRAMS programs in all, each slice at least SPREAD_POSITIONS positions; 1 where the
    programs are enough already. (The count is the kernels' grid axis 1, not a constant of theirs.)"""
    want = max(1, min(-(-SPREAD_PROGRAMS // programs), positions // SPREAD_POSITIONS))
    span = triton.cdiv(triton.cdiv(positions, want), grain) * grain  # as the kernels cut the window
    return triton.cdiv(positions, span)  # slices of whole grains of positions, none empty


def _positions_in_lines(problem: PoolingProblem, dx: TensorDescriptor) -> bool:
    """Whether a global window's positions, row-major over the dims it pools, are one run of unit stride in x
    and in dx (NCHW, NCDHW): each window's elements are then its positions past its first (``triton_global``)."""
    pooled = _pooled_dims(problem)

    def unit_stride_run(strides: tuple[int, ...]) -> bool:
        step = 1
        for d in reversed(pooled):
            if strides[d] != step:
                return False
            step *= problem.x.dims[d]
        return True

    return unit_stride_run(problem.x.strides) and unit_stride_run(dx.strides)


def _global_max_backward(problem: PoolingProblem, dy: TensorDescriptor, dx: TensorDescriptor) -> Launches:
    """The backward of a GLOBAL max whose positions lie in lines (``_positions_in_lines``, ``triton_global``): the
    argmax pass, then the gather, each over blocks of GLOBAL_CELLS cells by runs of the window (grid axis 1, as
    many as ``_spread`` gives); the cells are y's elements, over y's dims merged where they step alike in x, y,
    dy and dx (``_cell_dims``: a contiguous NCHW's cells are one dim, no division)."""
    sizes, strides = _cell_dims(problem.y.dims, (problem.x, problem.y, dy, dx))
    x_strides, y_strides, dy_strides, dx_strides = strides
    cells, positions = math.prod(problem.y.dims), math.prod(problem.window)
    assert cells <= INT32_LIMIT and positions <= INT32_LIMIT, f"{cells} cells of {positions} positions"
    block_positions = GLOBAL_LINE_BYTES // problem.x.dtype.itemsize
    cell_blocks = triton.cdiv(cells, GLOBAL_CELLS)
    grid = (cell_blocks, _spread(cell_blocks, positions, block_positions))
    tile = dict(BLOCK_CELLS=GLOBAL_CELLS, BLOCK_POSITIONS=block_positions, num_warps=GLOBAL_WARPS)
    argmax_args = (Slot("x"), Slot("y"), Slot("argmax"), cells, positions, sizes, x_strides, y_strides)
    gather_args = (Slot("dy"), Slot("argmax"), Slot("dx"), cells, positions, sizes, dy_strides, dx_strides)
    gather_constants = dict(HAS_BETA=problem.beta != 0.0, COMPUTE=_compute(problem), **tile)
    return Launches(
        (
            Launch(global_argmax_kernel, grid, argmax_args, tile),
            Launch(global_gather_kernel, grid, (*gather_args, problem.alpha, problem.beta), gather_constants),
        ),
        (Scratch("argmax", grid[1] * cells, _argmax_dtype(positions)),),
    )


def _cell_dims(
    dims: tuple[int, ...], tensors: tuple[TensorDescriptor, ...]
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Five dims whose row-major indices number the elements of a tensor of ``dims`` (y's: the cells), and each
    of ``tensors``' strides over them: the dims of more than one element, neighbours merged where an outer one
    steps its inner one's size times its stride in every tensor, then padded in front with dims of one element."""
    merged: list[tuple[int, tuple[int, ...]]] = []
    for d, size in enumerate(dims):
        if size == 1:
            continue
        strides = tuple(t.strides[d] for t in tensors)
        if merged and all(outer == size * inner for outer, inner in zip(merged[-1][1], strides)):
            merged[-1] = (merged[-1][0] * size, strides)
        else:
            merged.append((size, strides))
    merged = [(1, (0,) * len(tensors))] * (CANONICAL_DIMS - len(merged)) + merged
    return tuple(size for size, _ in merged), tuple(zip(*(strides for _, strides in merged)))


def _compute(problem: PoolingProblem) -> Any:
    return tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32
