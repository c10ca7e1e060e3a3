"""Layer, RMS, group and instance normalization, forward and backward: one program per tile of
rows, the whole row in registers when it fits.

Memory model (M elements per row, R rows, b bytes per element): forward reads x once and writes
y once (2 R M b, plus the parameters, read from L2); backward reads x and dy and writes dx
(3 R M b) and the partial parameter gradients (2 P M floats for P programs, 16 warps of programs
per SM: P = 2 per SM for 4096-wide rows, so ~1% at 32768 x 4096, read back from L2). FLOPs: ~8
per element forward, ~12 backward: memory-bound. At H200 copy speed (4.2 TB/s), float32
32768 x 4096 forward moves 1.07 GB: 0.26 ms; backward 1.6 GB: 0.38 ms.

Canonical form (``norm_plan``): rows are (group, inner row); a row's elements are "columns" in
x's logical order. LAYER/RMS: the group count is 1, inner rows the leading dims, columns the
normalized dims. GROUP/INSTANCE: x (N, C, S...) is seen as (N, G, C/G, S...): the group is G,
inner rows N, columns (C/G, S...); column q * S + s uses parameter g * C/G + q. Neighbouring
dims contiguous for x, y and dy merge, so packed rows are one unit-stride column dim and loads
are full-width vectors (the row offsets carry a ``tl.multiple_of`` hint).

- ``norm_forward_kernel``: program (t, g) normalizes the BLOCK_R rows of tile t of group g. With
  SINGLE the row tile stays in registers (exact two-pass mean and variance); else the row is
  walked in BLOCK chunks twice (sums shifted by the row's first element, then the output).
- ``norm_backward_kernel``: program (g, p) walks tiles p, p + P, ... of group g, writes dx and
  accumulates dy * xhat and dy per column (in registers with SINGLE, else in its own workspace
  slice); ``norm_finalize_kernel`` then sums the P slices (and the S columns of each parameter)
  in a fixed order: deterministic, no atomics. The tile loop is software-pipelined
  (``tl.range(num_stages=PIPELINE_STAGES[itemsize])``: cp.async of the next tiles' x and dy while
  this one computes) when the row fits in registers; the streamed path read-modify-writes its
  workspace slice in the loop, so it is not pipelined. The statistics are recomputed from x when
  the caller passes none (x is in registers anyway); the row sums share one cross-warp reduction.

Scale and bias are read in their own dtype as packed vectors (copied only when not packed);
the finalize kernel writes dscale and dbias through the caller's strides, blended.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import triton
import triton.language as tl

from opendnn.core.arrays import Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.normalization.problem import NormProblem
from opendnn.families.normalization.triton_kernels import (
    norm_backward_kernel,
    norm_finalize_kernel,
    norm_forward_kernel,
)
from opendnn.kernels.device import multiprocessors
from opendnn.kernels.indexing import merged_dims
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

MAX_SINGLE_BLOCK = 8192  # longest row held in registers
LOOP_BLOCK = 4096  # chunk of a longer row
TILE_ELEMENTS = 4096  # rows x columns per program for short rows
# backward (a sweep overrides these and clears the plan caches)
BACKWARD_MAX_WARPS = 16  # at most 16 elements a thread: x, dy and the partial sums in ~128 registers
BACKWARD_SM_WARPS = 16  # warps of resident programs per SM (65536 registers / 128 / 32)
# tile loop software pipeline by element bytes of x: Triton issues tile i + STAGES - 1's cp.async of
# x and dy at the end of iteration i and waits for tile i + 1 at the top of the next, so 2 stages
# overlap no load with this program's compute; 16-bit data keeps STAGES - 1 = 2 tiles in flight (H200,
# bfloat16 layer norm backward 32768 x 4096: 264 / 217 / 232 / 239 us at 2 / 3 / 4 / 5 stages)
PIPELINE_STAGES = {8: 2, 4: 2, 2: 3, 1: 3}
FINAL_BLOCK = 32  # parameters per program of the finalize kernel (layer / RMS norm)
FINAL_TILE = 4096  # partial sums the finalize kernel loads per step


# the launcher --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormPlan:
    """Canonical dims: groups (size, strides of x, y/dx, dy, stats), inner rows and columns as
    (size, strides per operand), innermost last; operands x, out, dy (and stats for rows)."""

    groups: int
    group_strides: tuple[int, ...]
    rows: tuple[tuple[int, tuple[int, ...]], ...]
    cols: tuple[tuple[int, tuple[int, ...]], ...]
    params_per_group: int
    block_r: int
    block: int

    @property
    def inner_rows(self) -> int:
        return math.prod(size for size, _ in self.rows)

    @property
    def single(self) -> bool:
        return self.block >= math.prod(size for size, _ in self.cols)


@functools.lru_cache(maxsize=256)  # per problem, not per call: the form and tiles the launches are planned from
def norm_plan(problem: NormProblem, stats: TensorDescriptor | None) -> NormPlan:
    """The canonical form and tile sizes of a problem (cached: a training loop repeats its shapes)."""
    x, out = problem.x, problem.y
    dy = problem.dy or problem.x
    operands = (x, out, dy)
    stats_strides = stats.strides if stats is not None else (0,) * x.ndim

    def dims(axes: range, with_stats: bool) -> list[tuple[int, tuple[int, ...]]]:
        """The axes in logical order, merged where every operand is contiguous across them."""
        return merged_dims(
            [
                (x.dims[k], tuple(d.strides[k] for d in operands) + ((stats_strides[k],) if with_stats else ()))
                for k in axes
            ],
            by_stride=False,
        )

    if problem.grouped:
        per_group = x.dims[1] // problem.groups
        group_strides = tuple(d.strides[1] * per_group for d in operands) + (stats_strides[1],)
        rows = [(x.dims[0], tuple(d.strides[0] for d in operands) + (stats_strides[0],))]
        cols = [(per_group, tuple(d.strides[1] for d in operands))] + dims(range(2, x.ndim), False)
        params_per_group = per_group
    else:
        lead = x.ndim - problem.normalized_ndim
        group_strides = (0, 0, 0, 0)
        rows = dims(range(lead), True)
        cols = dims(range(lead, x.ndim), False)
        params_per_group = problem.row_size
    rows = [(size, strides) for size, strides in rows if size > 1] or [(1, (0, 0, 0, 0))]
    cols = [(size, strides) for size, strides in cols if size > 1] or [(1, (0, 0, 0))]
    row_size = problem.row_size
    block = triton.next_power_of_2(row_size)
    if block > MAX_SINGLE_BLOCK:
        block = LOOP_BLOCK
    inner = math.prod(size for size, _ in rows)
    block_r = max(1, min(TILE_ELEMENTS // block, triton.next_power_of_2(inner)))
    return NormPlan(problem.groups or 1, group_strides, tuple(rows), tuple(cols), params_per_group, block_r, block)


def _split(dims: tuple[tuple[int, tuple[int, ...]], ...], count: int) -> tuple[tuple[int, ...], ...]:
    """(sizes, strides_0, ..., strides_{count-1}): tuples as long as the dims, no padding (each
    tuple element is a kernel argument the launcher specialises)."""
    return (tuple(size for size, _ in dims), *(tuple(strides[j] for _, strides in dims) for j in range(count)))


def _alignment(plan: NormPlan, count: int) -> int:
    """Largest power of two (at most 16) dividing every row and group stride of the data operands."""
    strides = [plan.group_strides[j] for j in range(count)]
    strides += [s[j] for _, s in plan.rows for j in range(count)]
    gcd = 0
    for stride in strides:
        gcd = math.gcd(gcd, stride)
    return min(16, gcd & -gcd) if gcd else 16


def supports(problem: NormProblem) -> str | None:
    return None


def workspace_size(problem: NormProblem) -> int:
    return 0


def run(
    problem: NormProblem,
    x: Bound,
    y: Bound,
    scale: Bound | None,
    bias: Bound | None,
    mean: Bound | None,
    inv_std: Bound | None,
    dy: Bound | None = None,
    dscale: Bound | None = None,
) -> None:
    """Forward: y and the statistics when bound. Backward: dx into ``y``, dscale, and dbias into ``bias``."""
    bounds = dict(scale=scale, bias=bias, mean=mean, inv_std=inv_std, dy=dy, dscale=dscale)
    tensors = {"x": torch_view(x), "y": torch_view(y)}
    tensors.update((name, torch_view(bound)) for name, bound in bounds.items() if bound is not None)
    for name in ("scale",) if problem.backward else ("scale", "bias"):
        if name in tensors:
            # packed vectors in logical order: the kernels index them by column (a view where one is
            # packed, a copy where the caller's strides are not: a strided weight, a (1, C) view's)
            tensors[name] = tensors[name].reshape(-1).contiguous()
    device = tensors["x"].device
    descs = (b.desc if b is not None else None for b in (inv_std, dscale, bias if problem.backward else None))
    norm_launches(problem, *descs, tuple(sorted(tensors)), (device.index or 0) if device.type == "cuda" else None)(
        tensors
    )


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (the norms keep no plan)
def norm_launches(
    problem: NormProblem,
    stats: TensorDescriptor | None,
    dscale: TensorDescriptor | None,
    dbias: TensorDescriptor | None,
    given: tuple[str, ...],
    device: int | None,
) -> Launches:
    """The launches computing ``problem`` with the tensors named in ``given`` (absent ones are never
    read; x stands in for them) on CUDA device ``device`` (None: the interpreter), planned once."""
    plan = norm_plan(problem, stats)
    compute = tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32
    row_sizes, *row_strides = _split(plan.rows, 4)
    col_sizes, *col_strides = _split(plan.cols, 3)
    unit = len(plan.cols) == 1 and all(s == 1 for s in plan.cols[0][1])
    flags = dict(
        ROW_DIMS=len(plan.rows),
        COL_DIMS=len(plan.cols),
        COL_UNIT=unit,
        ALIGN=_alignment(plan, 3),
        PER_SPATIAL=problem.grouped,
        RMS=problem.rms,
        HAS_SCALE="scale" in given,
        HAS_RSTD="inv_std" in given,
        HAS_BETA=problem.beta != 0.0,
        SINGLE=plan.single,
        COMPUTE=compute,
        BLOCK_R=plan.block_r,
        BLOCK=plan.block,
        num_warps=_warps(plan, problem.backward),
    )
    slot = {name: Slot(name if name in given else "x") for name in ("scale", "bias", "mean", "inv_std")}
    common = (plan.inner_rows, problem.row_size, plan.params_per_group, problem.epsilon, problem.alpha, problem.beta)
    if not problem.backward:
        grid = (triton.cdiv(plan.inner_rows, plan.block_r), plan.groups)  # many tiles: axis 0 has no 65535 limit
        return Launches(
            (
                Launch(
                    norm_forward_kernel,
                    grid,
                    (
                        Slot("x"),
                        Slot("y"),
                        slot["scale"],
                        slot["bias"],
                        slot["mean"],
                        slot["inv_std"],
                        plan.group_strides,
                        row_sizes,
                        row_strides[0],
                        row_strides[1],
                        row_strides[3],
                        col_sizes,
                        col_strides[0],
                        col_strides[1],
                        *common,
                    ),
                    dict(HAS_BIAS="bias" in given, HAS_MEAN="mean" in given, **flags),
                ),
            )
        )
    import torch

    tiles = triton.cdiv(plan.inner_rows, plan.block_r)
    programs = max(1, min(tiles, _programs_per_group(device, plan.groups, BACKWARD_SM_WARPS // flags["num_warps"])))
    half = plan.groups * programs * problem.row_size
    partial = Scratch("partial", 2 * half, torch.float64 if compute == tl.float64 else torch.float32)
    backward = Launch(
        norm_backward_kernel,
        (plan.groups, programs),
        (
            Slot("x"),
            Slot("dy"),
            Slot("y"),
            slot["scale"],
            slot["mean"],
            slot["inv_std"],
            Slot("partial"),
            (plan.group_strides[0], plan.group_strides[2], plan.group_strides[1], plan.group_strides[3]),
            row_sizes,
            row_strides[0],
            row_strides[2],
            row_strides[1],
            row_strides[3],
            col_sizes,
            col_strides[0],
            col_strides[2],
            col_strides[1],
            *common,
        ),
        dict(HAS_MEAN="mean" in given, STAGES=PIPELINE_STAGES[problem.x.dtype.itemsize] if plan.single else 1, **flags),
    )
    if dscale is None and dbias is None:
        return Launches((backward,), (partial,))
    return Launches((backward, _finalize(problem, plan, programs, half, dscale, dbias)), (partial,))


def _finalize(
    problem: NormProblem,
    plan: NormPlan,
    programs: int,
    half: int,
    dscale: TensorDescriptor | None,
    dbias: TensorDescriptor | None,
) -> Launch:
    """dscale and dbias (in the "bias" slot) from the backward's partial sums."""
    parameters = plan.groups * plan.params_per_group
    written = [d for d in (dscale, dbias) if d is not None]
    sizes = [d for d in written[0].dims if d > 1] or [1]
    strides = [tuple(s for d, s in zip(desc.dims, desc.strides) if d > 1) or (0,) for desc in written]
    # layer/RMS: a parameter per column, summands contiguous across parameters; group: few parameters,
    # many summands each (programs x spatial), so one or two parameters per program
    block_f = FINAL_BLOCK if problem.row_size == plan.params_per_group else 2
    return Launch(
        norm_finalize_kernel,
        (triton.cdiv(parameters, block_f), len(written)),
        (
            Slot("partial"),
            Slot("dscale" if dscale is not None else "partial"),
            Slot("bias" if dbias is not None else "partial"),
            tuple(sizes),
            strides[0],
            strides[-1],
            parameters,
            programs,
            problem.row_size,
            plan.params_per_group,
            half,
            problem.dparam_alpha,
            problem.dparam_beta,
        ),
        dict(
            PARAM_DIMS=len(sizes),
            HAS_DSCALE=dscale is not None,
            HAS_BETA=problem.dparam_beta != 0.0,
            BLOCK_F=block_f,
            ROWS=FINAL_TILE // block_f,
            num_warps=4,
        ),
    )


def _programs_per_group(device: int | None, groups: int, per_sm: int) -> int:
    if device is None:
        return 2
    return max(1, max(1, per_sm) * multiprocessors(device) // groups)


def _warps(plan: NormPlan, backward: bool) -> int:
    """16 elements a thread (backward: at most BACKWARD_MAX_WARPS warps; forward: 8)."""
    return max(1, min(BACKWARD_MAX_WARPS if backward else 8, plan.block_r * plan.block // 512))
