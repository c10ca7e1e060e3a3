"""Batch normalization (training and inference forward, backward, the Ex forms with add + relu):
a split reduction, a tiny per-feature combine, and an elementwise pass; or, for NCHW-like layouts whose
features fit 16 CTAs' registers, one kernel reading the data once (``bn_one_read_forward_kernel``, and
``bn_one_read_backward_kernel`` for float32 with saved statistics: a thread-block cluster per feature on
sm_90 and later; one CTA per feature, where it fits, on GPUs without clusters and in the interpreter).

The kernels live in ``triton_three_pass`` (the statistics or gradient pass, the combine, the elementwise
pass) and ``triton_one_read`` (the one-read kernels), over the device functions of ``triton_tiles`` that
both share; this module plans a call (``bn_plan``: layout, tile, split, and which of the two designs)
and builds its launches.

Memory model, per element of x (itemsize b bytes of data; the parameters are negligible):
- training forward: the statistics pass reads x, the normalize pass reads x (and z) and writes y
  (and one bit of mask): 3b bytes (4b with z). The benchmarks count 3b (read x twice, write y),
  as the cuDNN reference figures do; the fewest bytes any method moves is 2b, which the one-read kernel moves.
- inference: reads x, writes y: 2b.
- backward: the gradient pass reads x and dy (and the mask bit), the elementwise pass reads them again
  and writes dx (and dz): 5b (6b with dz).
About one to three FLOPs per element per pass: memory-bound. At 64x256x56x56 fp32 (205 MB) the
training forward moves 616 MB: 0.15 ms at 4.2 TB/s.

Layout: the elements are indexed by (reduced index, feature): the reduced dims (N and the spatial
dims for SPATIAL, N for PER_ACTIVATION) and the feature dims (C, and the spatial dims for
PER_ACTIVATION) are each sorted by x's strides and merged where every tensor is contiguous
(``bn_plan``). The reduced index is split into (outer, inner): when x's innermost reduced dim is
contiguous and its size a multiple of 8 (NCHW), a program owns one feature and tiles of
BLOCK_O x BLOCK_I (rows along the contiguous inner dim); otherwise (NHWC, or short planes) the inner
part is empty and a program owns BLOCK_F consecutive features and BLOCK_O reduced indices, so each
tile row is a contiguous run of channels. Offsets need division only on the small per-tile vectors.

The statistics pass cuts the reduced set of each feature block into ``splits`` slices, one program
each, accumulating the shifted sums sum(x - x0) and sum((x - x0)^2) (x0: the feature's first
element, which keeps the fp32 sums free of cancellation) or, backward, sum(g) and
sum(g * (x - mean)); the combine adds the slices in order (bitwise repeatable, no atomics), a program
per few features holding all their slices in one load round where it can (NHWC: 256 slices, 32
programs), writes the statistics, the running averages and per-feature coefficients: y = (x - mean) * a + bias
(forward) or dx = k1 * g + k2 * (x - mean) + k3 (backward), centred first so that data far from
zero keep their accuracy. The elementwise pass walks the tiles in the reverse order of
the statistics pass, so its first reads hit what the statistics pass left in L2.

Workspace: one buffer the kernels take whole (a pointer, no per-call views of its regions), in rows
of feature_total compute elements: 4 coefficients, the recomputed mean and inv std, the partial sums.

Reserve space: the activation's mask, one bit per element, 8 consecutive reduced indices of one
feature per byte, bytes laid out by x's layout alone (feature-major when x's reduced dims are
innermost, else reduced-major), so backward reads what forward wrote whatever dy's layout. A byte
is found from its group's first lane (groups are aligned), never by a reduction across lanes. With
propagate_nan a second plane of the same layout follows the mask: a bit per NaN pre-activation, which
a propagating backward turns into a NaN gradient (a plain one ignores it: 0 there).

Load scheduling (read in the sm_90 SASS): left alone, ptxas consumes each 16-byte load before issuing
the next, so a thread has one or two loads in flight and a pass runs at latency, not bandwidth. The
reduce loop issues tile t + 1's loads before summing tile t (carried raw), the combine likewise its
load rounds (left alone: 4 rounds of 32 loads, each load's round trip in turn, 15 us); the elementwise kernels
issue every data load, then a CTA barrier, then load the per-feature coefficients all arithmetic
needs, so no arithmetic can be scheduled between the data loads. The one-read kernels hold a CTA's data
through a cluster barrier, when the SM has nothing else to load; in clusters of 4 CTAs or more each CTA
also asks L2 for its tile of the feature 8 ahead (``prefetch_tile``), which a later cluster loads, so DRAM
keeps working while clusters sum, wait and store (docs/design/batch_norm.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from opendnn.core.arrays import torch_view
from opendnn.core.errors import InternalError
from opendnn.families.batch_norm.problem import BatchNormOps, BatchNormProblem, BatchNormTensors, Direction
from opendnn.families.batch_norm.triton_one_read import bn_one_read_backward_kernel, bn_one_read_forward_kernel
from opendnn.families.batch_norm.triton_three_pass import (
    bn_backward_kernel,
    bn_combine_kernel,
    bn_forward_kernel,
    bn_reduce_kernel,
)
from opendnn.kernels.device import has_clusters, programs_to_fill
from opendnn.kernels.indexing import merged_dims
from opendnn.kernels.launch import Launch, Slot

TILE = 4096  # elements per tile: 16 per thread at 8 warps
COLUMN_BLOCK = 64  # most features a columns tile covers
PROGRAMS_PER_SM = 8  # statistics programs: enough to fill the GPU several times (1024 on an H200, a power of two)
MIN_SLICE_TILES = 4  # tiles each slice of the statistics pass reads at least
FINAL_BLOCK = 64  # most features per program of the combine
FINAL_TILE = 2048  # partial sums per load round of the combine
FINAL_MIN_BLOCK = 8  # fewest features per program of the combine (32 bytes of each slice's row)
ONE_READ_TILE = 16384  # most lanes of each held tensor a CTA of the one-read kernels keeps in registers
MAX_CLUSTER = 16  # most CTAs per feature of the one-read kernels (sm_90: above 8 is "non-portable", allowed)
PREFETCH_BYTES = 64  # the one-read kernels ask L2 for a later cluster's tile, one prefetch per 64 bytes of it,
PREFETCH_AHEAD = 8  # for the feature 8 ahead (about the next wave of 16-CTA clusters on 132 SMs),
PREFETCH_MIN_CLUSTER = 4  # in clusters of 4 CTAs or more (1 CTA a feature, many at once: 3 of 4 cases slower),
PREFETCH_MIN_CLUSTER_DX = 16  # 16 for the backward writing dx alone (28x28, clusters of 4: 95 -> 100 us)


# ---- launcher -------------------------------------------------------------------------------------

DATA = ("x", "out", "z", "dy")  # the data tensors' order in the plan's stride tuples
X, OUT, Z, DY = range(len(DATA))
PARAM = len(DATA)  # the features' extra strides: the parameter tensors


@dataclass(frozen=True)
class BatchNormPlan:
    """The canonical layout of a call and its tiling.

    ``outer``/``inner``: the reduced dims (outermost first, each (size, strides per DATA tensor));
    ``inner`` is the innermost contiguous dim in the rows orientation, else (1, zeros).
    ``features``: (size, strides per DATA tensor + parameter), outermost first.
    """

    outer: tuple[tuple[int, tuple[int, ...]], ...]
    inner: tuple[int, tuple[int, ...]]
    features: tuple[tuple[int, tuple[int, ...]], ...]
    block_o: int
    block_i: int
    block_f: int
    splits: int
    mask_strides: tuple[int, int, int]
    compute_bytes: int
    index_64: bool  # some offset may pass 2**31: 64-bit index arithmetic
    one_read: tuple[int, int, int] = (0, 0, 0)  # (CTAs per feature, BLOCK_O, BLOCK_I) of the one-read kernels

    @property
    def outer_total(self) -> int:
        return math.prod(size for size, _ in self.outer)

    @property
    def feature_total(self) -> int:
        return math.prod(size for size, _ in self.features)

    @property
    def f_blocks(self) -> int:
        return triton.cdiv(self.feature_total, self.block_f)

    @property
    def i_blocks(self) -> int:
        return triton.cdiv(self.inner[0], self.block_i)

    @property
    def tiles(self) -> int:
        return triton.cdiv(self.outer_total, self.block_o) * self.i_blocks

    @functools.cached_property
    def kernel_sizes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(outer sizes, feature sizes) for the kernels: exactly OUTER_DIMS and F_DIMS long, so a
        launch binds few arguments."""
        return tuple(size for size, _ in self.outer), tuple(size for size, _ in self.features)

    @functools.cached_property
    def kernel_strides(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """(outer strides per DATA tensor, feature strides per DATA tensor + PARAM)."""
        outer = tuple(tuple(strides[k] for _, strides in self.outer) for k in range(len(DATA)))
        features = tuple(tuple(strides[k] for _, strides in self.features) for k in range(len(DATA) + 1))
        return outer, features

    @functools.cached_property
    def tile_args(self) -> tuple[int, ...]:
        """The tiled kernels' runtime sizes: outer_total, inner_total, feature_total, f_blocks, i_blocks, tiles."""
        return self.outer_total, self.inner[0], self.feature_total, self.f_blocks, self.i_blocks, self.tiles

    @functools.cached_property
    def blocks(self) -> dict[str, Any]:
        """The tiled kernels' constexprs and warps (computed once: the host path is per call)."""
        return dict(
            OUTER_DIMS=len(self.outer),
            F_DIMS=len(self.features),
            COMPUTE=tl.float64 if self.compute_bytes == 8 else tl.float32,
            INDEX_64=self.index_64,
            BLOCK_O=self.block_o,
            BLOCK_I=self.block_i,
            BLOCK_F=self.block_f,
            num_warps=max(1, min(8, self.block_o * self.block_i * self.block_f // 512)),
        )

    @functools.cached_property
    def combine_blocks(self) -> tuple[int, int]:
        """(features per combine program, slices per load round): every slice in one round where
        FINAL_TILE holds them for FINAL_MIN_BLOCK features, so that many slices spread over many programs."""
        block_s = min(triton.next_power_of_2(self.splits), FINAL_TILE // FINAL_MIN_BLOCK)
        return min(FINAL_BLOCK, FINAL_TILE // block_s, triton.next_power_of_2(self.feature_total)), block_s

    @functools.cached_property
    def workspace_bytes(self) -> int:
        """Coefficients (4 x F), recomputed statistics (2 x F), partial sums (2 x splits x F): the kernels'
        ``workspace`` rows."""
        return -(-(2 * self.splits + 6) * self.feature_total * self.compute_bytes // 16) * 16


@functools.lru_cache(maxsize=256)  # per problem, asked by the size queries and the launches
def bn_plan(problem: BatchNormProblem, clusters: bool) -> BatchNormPlan:
    """Merge and sort the dims, pick the orientation and the tile, decide the split; ``clusters``: the
    device has thread-block clusters (else the one-read kernels run one CTA per feature)."""
    x = problem.x
    descs = [getattr(problem, name) or x for name in ("x", "out", "z", "dy")]
    reduced_axes = problem.reduced_axes
    features = [k for k in range(x.ndim) if k not in reduced_axes]
    reduced = merged_dims([(x.dims[k], tuple(d.strides[k] for d in descs)) for k in reduced_axes]) or [(1, (0,) * 4)]
    param_strides = problem.param.strides
    feature_dims = merged_dims([(x.dims[k], (*(d.strides[k] for d in descs), param_strides[k])) for k in features])
    feature_dims = feature_dims or [(1, (0,) * 5)]
    mask_strides = _mask_strides(problem)
    inner_size, inner_strides = reduced[-1]
    contiguous_rows = mask_strides[0] == 1 and inner_strides[0] == 1  # x's innermost reduced dim: NCHW-like
    one_read = (0, 0, 0)
    backward = problem.direction is Direction.BACKWARD
    if (
        contiguous_rows
        and (problem.direction is Direction.TRAINING or (backward and x.dtype.itemsize == 4))
        and (inner_size % 8 == 0 or not problem.reserve)
    ):
        # rows of any length where no mask is kept (a mask byte holds 8 lanes of one row). The training
        # forward holds x (and z: half the lanes); the backward x and dy, at 16 warps (one CTA an SM: for
        # 16-bit data slower than the three passes on the H200, docs/design/batch_norm.md)
        holds_z = problem.direction is Direction.TRAINING and problem.z is not None
        limit = MAX_CLUSTER if clusters else 1
        one_read = _one_read_split(
            math.prod(size for size, _ in reduced[:-1]), inner_size, ONE_READ_TILE // (2 if holds_z else 1), limit
        )
    rows = contiguous_rows and (inner_size % 8 == 0 or one_read[0] > 0)
    if rows:
        outer, inner = reduced[:-1] or [(1, (0,) * 4)], (inner_size, inner_strides)
        block_i = _row_block(inner_size)
        block_o = max(1, min(TILE // block_i, triton.next_power_of_2(math.prod(s for s, _ in outer))))
        block_f = 1
    else:
        outer, inner = reduced, (1, (0,) * 4)
        block_i = 1
        block_f = min(triton.next_power_of_2(math.prod(size for size, _ in feature_dims)), COLUMN_BLOCK)
        block_o = max(8, min(TILE // block_f, triton.next_power_of_2(math.prod(s for s, _ in outer))))
    extents = [d.extent for d in (x, problem.out, problem.z, problem.dy) if d is not None]
    index_64 = max(*extents, reserve_size(problem)) >= 2**31 - TILE
    plan = BatchNormPlan(
        tuple(outer),
        inner,
        tuple(feature_dims),
        block_o,
        block_i,
        block_f,
        1,
        mask_strides,
        problem.compute_dtype.itemsize,
        index_64,
        one_read,
    )
    if one_read[0]:  # its partial sums: one slice per CTA of a feature
        return dataclasses.replace(plan, splits=one_read[0])
    target = programs_to_fill(PROGRAMS_PER_SM, power_of_two=True)
    splits = max(1, min(triton.cdiv(target, plan.f_blocks), plan.tiles // MIN_SLICE_TILES))
    return dataclasses.replace(plan, splits=splits)


def interpreted() -> bool:
    """Whether Triton's CPU interpreter runs the kernels (one program after another)."""
    return isinstance(bn_one_read_forward_kernel, InterpretedFunction)


def _one_read_split(outer_total: int, inner_total: int, elements: int, limit: int) -> tuple[int, int, int]:
    """(CTAs per feature, BLOCK_O, BLOCK_I) of the one-read kernels: the fewest CTAs, a power of two up to
    ``limit`` (1 under the interpreter, which runs programs one after another: no CTA can wait on another),
    whose tiles of at most ``elements`` lanes (whole rows) cover a feature. (0, 0, 0) when none do."""
    block_i = triton.next_power_of_2(inner_total)
    cluster = 1
    while cluster <= limit:
        block_o = triton.next_power_of_2(triton.cdiv(outer_total, cluster))
        if block_o * block_i <= elements:
            return cluster, block_o, block_i
        cluster *= 2
    return 0, 0, 0


def _row_block(inner: int) -> int:
    """The widest power-of-two block (8 to 1024) that wastes at most 1/16 of a row of ``inner``."""
    for block in (1024, 512, 256, 128, 64, 32, 16):
        if triton.cdiv(inner, block) * block - inner <= inner // 16:
            return block
    return 8


def _mask_strides(problem: BatchNormProblem) -> tuple[int, int, int]:
    """(bytes per 8 reduced indices, bytes per feature, bytes to the NaN plane) of the mask: feature-major
    when x's innermost reduced dim is more contiguous than its innermost feature dim, else reduced-major.
    x alone decides. The NaN plane (propagate_nan only, else 0) follows the mask, one mask's bytes on."""
    x = problem.x
    reduced_axes = problem.reduced_axes
    inner_stride: dict[bool, list[int]] = {True: [], False: []}
    for k in range(x.ndim):
        if x.dims[k] > 1:
            inner_stride[k in reduced_axes].append(x.strides[k])
    feature_major = min(inner_stride[True], default=math.inf) < min(inner_stride[False], default=math.inf)
    groups = triton.cdiv(problem.count, 8)
    features = problem.x.numel // problem.count
    nan_plane = groups * features if problem.propagate_nan else 0
    return (1, groups, nan_plane) if feature_major else (features, 1, nan_plane)


def supports(problem: BatchNormProblem) -> str | None:
    return None


def workspace_size(problem: BatchNormProblem) -> int:
    """Bytes of workspace ``run`` needs: partial sums, coefficients and statistics, on a device with
    thread-block clusters or without (the query has no device: the larger of the two plans)."""
    return max(bn_plan(problem, clusters).workspace_bytes for clusters in (False, True))


@functools.lru_cache(maxsize=256)  # per problem, asked by every call of the Ex forms and their queries
def reserve_size(problem: BatchNormProblem) -> int:
    """Bytes of reserve space: the activation's mask, a bit per element (bytes of 8 reduced indices
    of one feature), then as much for the NaN plane with propagate_nan; 0 for BN."""
    if problem.ops is BatchNormOps.BN:
        return 0
    planes = 2 if problem.propagate_nan else 1
    return -(-triton.cdiv(problem.count, 8) * (problem.x.numel // problem.count) * planes // 16) * 16


def run(problem: BatchNormProblem, t: BatchNormTensors) -> None:
    x = torch_view(t.x)
    clusters = x.is_cuda and not interpreted() and has_clusters(x.device.index)
    launches, fields, needed = bn_launches(problem, tuple([bound is not None for bound in t]), clusters)
    if t.workspace is None or t.workspace.desc.dims[0] < needed:
        raise InternalError(f"batch_norm needs {needed} bytes of workspace")
    tensors = {}
    for k, name in fields:  # the positions of the tensors given
        bound = t[k]
        if bound is None:
            raise InternalError(f"batch_norm planned {name} but it was not given")
        tensors[name] = torch_view(bound)
    for launch in launches:
        launch(tensors)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def bn_launches(
    problem: BatchNormProblem, given: tuple[bool, ...], clusters: bool
) -> tuple[tuple[Launch, ...], tuple[tuple[int, str], ...], int]:
    """(the launches computing ``problem`` with the BatchNormTensors that are ``given`` on a device with
    thread-block ``clusters`` or without, the tensors they take as (index, name) in BatchNormTensors (the
    workspace among them, whole: the kernels find their rows in it), the bytes of workspace)."""
    launches = _launch_sequence(problem, given, clusters)
    used = {name for launch in launches for _, name in launch.slots}
    fields = tuple((k, name) for k, name in enumerate(BatchNormTensors._fields) if name in used)
    return launches, fields, bn_plan(problem, clusters).workspace_bytes


def _launch_sequence(problem: BatchNormProblem, given: tuple[bool, ...], clusters: bool) -> tuple[Launch, ...]:
    """The launches computing ``problem`` (absent tensors are never read; x stands in for them)."""
    launches = _Launches(
        problem,
        bn_plan(problem, clusters),
        {name for name, present in zip(BatchNormTensors._fields, given) if present},
        clusters,
    )
    if problem.direction is Direction.INFERENCE:
        return launches.combine("inference"), launches.forward()
    if problem.direction is Direction.TRAINING:
        if launches.plan.one_read[0]:
            return (launches.one_read_forward(),)
        return launches.reduce(gradient=False), launches.combine("training"), launches.forward()
    recomputed = not (problem.saved and "saved_mean" in launches.given)  # the statistics, into the workspace
    if launches.plan.one_read[0] and not recomputed:
        return (launches.one_read_backward(),)
    statistics = (launches.reduce(gradient=False), launches.combine("statistics")) if recomputed else ()
    return (
        *statistics,
        launches.reduce(gradient=True, recomputed=recomputed),
        launches.combine("backward", recomputed=recomputed),
        launches.backward(),
    )


class _Launches:
    """The kernels' common arguments for one problem, and one method per kernel giving its Launch."""

    def __init__(self, problem: BatchNormProblem, plan: BatchNormPlan, given: set[str], clusters: bool) -> None:
        self.problem, self.plan, self.given, self.clusters = problem, plan, given, clusters
        self.outer_sizes, self.f_sizes = plan.kernel_sizes
        self.mask = Slot("reserve") if "reserve" in given and problem.reserve else Slot("x")
        self.tile_args, self.blocks = plan.tile_args, plan.blocks

    def outer_strides(self, tensor: int) -> tuple[int, ...]:
        return self.plan.kernel_strides[0][tensor]

    def feature_strides(self, tensor: int) -> tuple[int, ...]:
        return self.plan.kernel_strides[1][tensor]

    def view(self, name: str) -> Slot:
        return Slot(name if name in self.given else "x")

    def reduce(self, gradient: bool, recomputed: bool = False) -> Launch:
        """The statistics pass (sums of x) or, ``gradient``, the gradient pass (centred on the saved
        mean, or the ``recomputed`` one in the workspace)."""
        masked = gradient and self.problem.reserve
        mean = Slot("saved_mean") if gradient and not recomputed else Slot("x")
        return Launch(
            bn_reduce_kernel,
            (self.plan.f_blocks * self.plan.splits,),
            (
                Slot("x"),
                self.view("dy"),
                self.mask,
                mean,
                Slot("workspace"),
                self.outer_sizes,
                self.outer_strides(X),
                self.outer_strides(DY),
                self.plan.inner[1][X],
                self.plan.inner[1][DY],
                self.f_sizes,
                self.feature_strides(X),
                self.feature_strides(DY),
                self.feature_strides(PARAM),
                self.plan.mask_strides,
                *self.tile_args,
            ),
            dict(
                GRADIENT=gradient,
                MASKED=masked,
                PROPAGATE_NAN=self.problem.propagate_nan,
                TORCH_RULE=self.problem.torch_rule,
                STATS_IN_WORKSPACE=recomputed,
                **self.blocks,
            ),
        )

    def combine(self, step: str, recomputed: bool = False) -> Launch:
        """The combine of ``step`` ("inference", "training", "statistics", "backward"); the backward's
        statistics are the saved ones or the ``recomputed`` ones in the workspace."""
        p = self.problem
        update_mean, update_var, save = self.writes(step)
        block, block_s = self.plan.combine_blocks
        return Launch(
            bn_combine_kernel,
            (triton.cdiv(self.plan.feature_total, block),),
            (
                Slot("workspace"),
                Slot("x"),
                self.view("scale"),
                self.view("bias"),
                self.view("mean"),
                self.view("variance"),
                self.view("saved_mean"),
                self.view("saved_inv_std"),
                self.view("dscale"),
                self.view("dbias"),
                self.f_sizes,
                self.feature_strides(X),
                self.feature_strides(PARAM),
                self.plan.feature_total,
                self.plan.splits if step != "inference" else 0,
                float(p.count),
                p.epsilon,
                p.factor,
                p.alpha_param,
                p.beta_param,
            ),
            dict(
                STEP=step,
                UPDATE_MEAN=update_mean,
                UPDATE_VAR=update_var,
                SAVE=save,
                STATS_IN_WORKSPACE=step == "statistics" or recomputed,
                HAS_BETA_PARAM=p.beta_param != 0.0,
                F_DIMS=len(self.plan.features),
                COMPUTE=self.blocks["COMPUTE"],
                BLOCK=block,
                BLOCK_S=block_s,
                num_warps=4,
            ),
        )

    def writes(self, step: str) -> tuple[bool, bool, bool]:
        """Whether ``step``'s statistics update the running mean, the running variance, and are saved."""
        given = self.given
        save = step == "statistics" or (step == "training" and "saved_mean" in given and "saved_inv_std" in given)
        return step == "training" and "mean" in given, step == "training" and "variance" in given, save

    def prefetch_lanes(self, min_cluster: int) -> int:
        """Lanes per L2 prefetch in the one-read kernels: PREFETCH_BYTES of data, or 0 in clusters below
        ``min_cluster`` (at least 4: only devices with clusters prefetch, never the interpreter)."""
        if self.plan.one_read[0] < min_cluster:
            return 0
        return PREFETCH_BYTES // self.problem.x.dtype.itemsize

    def one_read_forward(self) -> Launch:
        """The training forward in one launch, a cluster of CTAs per feature (``bn_one_read_forward_kernel``)."""
        p = self.problem
        update_mean, update_var, save = self.writes("training")
        cluster, block_o, block_i = self.plan.one_read
        ids = X, Z, OUT
        return Launch(
            bn_one_read_forward_kernel,
            (self.plan.feature_total * cluster,),
            (
                Slot("x"),
                self.view("z"),
                Slot("out"),
                self.view("scale"),
                self.view("bias"),
                self.view("mean"),
                self.view("variance"),
                self.view("saved_mean"),
                self.view("saved_inv_std"),
                Slot("workspace"),
                self.mask,
                self.outer_sizes,
                *(self.outer_strides(k) for k in ids),
                *(self.plan.inner[1][k] for k in ids),
                self.f_sizes,
                *(self.feature_strides(k) for k in (*ids, PARAM)),
                self.plan.mask_strides,
                self.plan.outer_total,
                self.plan.inner[0],
                self.plan.feature_total,
                float(p.count),
                p.epsilon,
                p.factor,
                p.alpha,
                p.beta,
                p.activation_coef,
                PREFETCH_AHEAD,
            ),
            dict(
                CLUSTER=cluster,
                CLUSTER_BARRIER=self.clusters,
                PREFETCH=self.prefetch_lanes(PREFETCH_MIN_CLUSTER),
                ADD_Z="z" in self.given,
                ACTIVATION=p.activation or "identity",
                PROPAGATE_NAN=p.propagate_nan,
                WRITE_MASK=p.reserve and "reserve" in self.given,
                HAS_BETA=p.beta != 0.0,
                UPDATE_MEAN=update_mean,
                UPDATE_VAR=update_var,
                SAVE=save,
                OUTER_DIMS=len(self.plan.outer),
                F_DIMS=len(self.plan.features),
                COMPUTE=self.blocks["COMPUTE"],
                BLOCK_O=block_o,
                BLOCK_I=block_i,
                INDEX_64=self.plan.index_64,
                num_warps=max(1, min(8, block_o * block_i // 512)),
            ),
            cluster=cluster,
        )

    def one_read_backward(self) -> Launch:
        """The backward with saved statistics in one launch, a cluster of CTAs per feature
        (``bn_one_read_backward_kernel``)."""
        p = self.problem
        cluster, block_o, block_i = self.plan.one_read
        ids = X, DY, OUT, Z
        return Launch(
            bn_one_read_backward_kernel,
            (self.plan.feature_total * cluster,),
            (
                Slot("x"),
                Slot("dy"),
                Slot("out"),
                self.view("z"),
                self.view("scale"),
                Slot("saved_mean"),
                Slot("saved_inv_std"),
                Slot("dscale"),
                Slot("dbias"),
                Slot("workspace"),
                self.mask,
                self.outer_sizes,
                *(self.outer_strides(k) for k in ids),
                *(self.plan.inner[1][k] for k in ids),
                self.f_sizes,
                *(self.feature_strides(k) for k in (*ids, PARAM)),
                self.plan.mask_strides,
                self.plan.outer_total,
                self.plan.inner[0],
                self.plan.feature_total,
                float(p.count),
                p.alpha,
                p.beta,
                p.alpha_param,
                p.beta_param,
                PREFETCH_AHEAD,
            ),
            dict(
                CLUSTER=cluster,
                CLUSTER_BARRIER=self.clusters,
                PREFETCH=self.prefetch_lanes(PREFETCH_MIN_CLUSTER if "z" in self.given else PREFETCH_MIN_CLUSTER_DX),
                MASKED=p.reserve and "reserve" in self.given,
                PROPAGATE_NAN=p.propagate_nan,
                TORCH_RULE=p.torch_rule,
                WRITE_DZ="z" in self.given,
                HAS_BETA=p.beta != 0.0,
                HAS_BETA_PARAM=p.beta_param != 0.0,
                OUTER_DIMS=len(self.plan.outer),
                F_DIMS=len(self.plan.features),
                COMPUTE=self.blocks["COMPUTE"],
                BLOCK_O=block_o,
                BLOCK_I=block_i,
                INDEX_64=self.plan.index_64,
                num_warps=max(1, min(16, block_o * block_i // 1024)),
            ),
            cluster=cluster,
        )

    def forward(self) -> Launch:
        p = self.problem
        ids = X, Z, OUT
        return Launch(
            bn_forward_kernel,
            (self.plan.f_blocks * self.plan.tiles,),
            (
                Slot("x"),
                self.view("z"),
                Slot("out"),
                Slot("workspace"),
                self.mask,
                self.outer_sizes,
                *(self.outer_strides(k) for k in ids),
                *(self.plan.inner[1][k] for k in ids),
                self.f_sizes,
                *(self.feature_strides(k) for k in ids),
                self.plan.mask_strides,
                *self.tile_args,
                p.alpha,
                p.beta,
                p.activation_coef,
            ),
            dict(
                ADD_Z="z" in self.given,
                ACTIVATION=p.activation or "identity",
                PROPAGATE_NAN=p.propagate_nan,
                WRITE_MASK=p.reserve and "reserve" in self.given,
                HAS_BETA=p.beta != 0.0,
                **self.blocks,
            ),
        )

    def backward(self) -> Launch:
        p = self.problem
        ids = X, DY, OUT, Z
        return Launch(
            bn_backward_kernel,
            (self.plan.f_blocks * self.plan.tiles,),
            (
                Slot("x"),
                Slot("dy"),
                Slot("out"),
                self.view("z"),
                Slot("workspace"),
                self.mask,
                self.outer_sizes,
                *(self.outer_strides(k) for k in ids),
                *(self.plan.inner[1][k] for k in ids),
                self.f_sizes,
                *(self.feature_strides(k) for k in ids),
                self.plan.mask_strides,
                *self.tile_args,
                p.alpha,
                p.beta,
            ),
            dict(
                MASKED=p.reserve and "reserve" in self.given,
                PROPAGATE_NAN=p.propagate_nan,
                TORCH_RULE=p.torch_rule,
                WRITE_DZ="z" in self.given,
                HAS_BETA=p.beta != 0.0,
                **self.blocks,
            ),
        )
