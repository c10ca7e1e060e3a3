"""Attention on the Triton backend: the planner and the launches of the kernels in
``triton_forward`` (FlashAttention-2 forward), ``gluon_forward`` (the warp-specialized forward on
Hopper) and ``triton_backward`` (the deterministic backward), whose docstrings carry the FLOP and
byte models.

``choose(problem, tma_aligned, hopper)`` names the strategy: a forward that ``warp_specialized``
takes (compiled for an sm_90 GPU, ``hopper``: wgmma is Hopper's alone, Triton's interpreter never is
one; q, k and v base addresses 16-byte aligned, ``tma_aligned``; a problem of ``gluon_forward``'s
scope, ``out_of_scope``: 16-bit or e4m3 data, no mask but causal, q, k and v strides readable by TMA;
its element size and head dim in WARP_SPECIALIZED_TILES, or unmasked in
UNMASKED_WARP_SPECIALIZED_TILES) runs on the warp-specialized kernel (``warp_specialized_forward``);
every other forward on the FlashAttention-2 kernel (``flash2_forward``). A backward under the same
two conditions (dO aligned too) whose problem is ``gluon_backward``'s (``out_of_scope``: the 16-bit
forward's scope at head dims 64 and 128, dO readable by TMA too) computes delta on the ``tl`` kernel,
then dK and dV (``gluon_backward``) and dQ (``gluon_backward_dq``) on the warp-specialized kernels
(``warp_specialized_backward``); every other backward runs on the deterministic ``tl`` kernels alone
(``flash2_deterministic_backward``). For the ``tl`` kernels it picks the tile from the head dims and
the dtype: the tile of queries (BLOCK_M) and keys (BLOCK_N), the head dims padded to powers of two (at least 16,
the smallest a tensor-core product takes; the padding is masked), the warps and pipeline stages.
Tiles shrink with the head dim (the accumulators stay in registers) and with the element size
(float32 products run on FMA units without TF32, float64 ones always), and never exceed the
sequence lengths rounded up to a power of two.

``planned_launches(problem, plan)`` makes the plan's launches once per (problem, plan): each a
``kernels.launch.Launch`` whose tensors are Slots named by the problem's slots, so a call fills them
and calls the kernels compiled for it, and ``opendnn.torch`` records and replays them. The backward
takes one scratch array a call, delta, of B * Hq * Sq numbers in the compute dtype
(``workspace_size``); the fp8 forward another, v^T (``triton_transpose``); both on the tensors'
device and the current stream.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from opendnn.core.arrays import CPU, torch_view
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.families.attention import gluon_backward, gluon_backward_dq, gluon_forward
from opendnn.families.attention.problem import (
    FP8_AMAX,
    FP8_BACKWARD_AMAX,
    OUTPUTS,
    SLOTS,
    AttentionProblem,
    AttentionTensors,
    DiagonalAlignment,
)
from opendnn.families.attention.triton_backward import (
    attention_delta_kernel,
    attention_dkdv_kernel,
    attention_dq_kernel,
    attention_dsinks_kernel,
)
from opendnn.families.attention.triton_dbias import attention_dbias_kernel
from opendnn.families.attention.triton_forward import attention_forward_kernel
from opendnn.families.attention.triton_tiles import block_grid, query_block_grid
from opendnn.families.attention.triton_transpose import transposed_elements
from opendnn.kernels.device import has_wgmma, use_descriptor_scratch
from opendnn.kernels.launch import Launch, Launches, Scratch, Slot

MIN_BLOCK = 16  # the smallest dim of a tensor-core product
# (element bytes, head dim) of the forwards the warp-specialized kernel takes where it can (a key of
# gluon_forward.TILES); every e4m3 head dim of the kernel goes to it, whose wgmma takes fp8 operands
# from shared memory without the tl kernel's rearrangement of v; 16-bit head dim 64 only without a
# mask: causal, the FlashAttention-2 kernel is faster there on the H200 (docs/design/attention.md,
# "Forward on Hopper" and "fp8")
WARP_SPECIALIZED_TILES = ((2, 128), (2, 256), (1, 64), (1, 128))
UNMASKED_WARP_SPECIALIZED_TILES = ((2, 64),)


@dataclass(frozen=True)
class Tile:
    """A launch's shape: BLOCK_M queries by BLOCK_N keys, its warps and its pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# (element bytes) -> ((widest padded head dim, tile), ...): the first row that fits
FORWARD_TILES = {
    1: ((64, Tile(64, 64, 4, 3)), (128, Tile(128, 64, 8, 2)), (256, Tile(64, 64, 8, 2))),
    2: ((64, Tile(64, 64, 4, 3)), (128, Tile(128, 64, 4, 2)), (256, Tile(128, 32, 8, 3))),
    4: ((64, Tile(64, 32, 4, 2)), (128, Tile(32, 32, 4, 2)), (256, Tile(32, 16, 4, 2))),
    8: ((64, Tile(32, 16, 4, 2)), (256, Tile(16, 16, 4, 2))),
}
BACKWARD_TILES = {
    1: ((64, Tile(64, 64, 8, 2)), (128, Tile(64, 64, 4, 2)), (256, Tile(32, 32, 8, 2))),
    2: ((64, Tile(64, 64, 8, 2)), (128, Tile(64, 64, 4, 2)), (256, Tile(32, 32, 8, 2))),
    4: ((64, Tile(32, 32, 4, 2)), (128, Tile(32, 16, 4, 2)), (256, Tile(16, 16, 4, 2))),
    8: ((256, Tile(16, 16, 4, 2)),),
}
# the tiles a sweep times (benchmarks/attention_tiles.py) for 16-bit data:
# (BLOCK_M choices, BLOCK_N choices, warps, stages)
FORWARD_GRID = ((64, 128), (32, 64, 128), (4, 8), (2, 3))
BACKWARD_GRID = ((32, 64), (32, 64, 128), (4, 8), (1, 2))


@dataclass(frozen=True)
class AttentionPlan:
    # "warp_specialized_forward", "flash2_forward", "warp_specialized_backward" (dK, dV and dQ on the
    # Gluon kernels, delta on the tl kernel at this tile) or "flash2_deterministic_backward"
    strategy: str
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    warp_tile: gluon_forward.Tile | None = None  # the warp-specialized forward's; None for the other strategies


def head_blocks(problem: AttentionProblem) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_DV): the head dims padded to powers of two, at least MIN_BLOCK."""
    return _padded(problem.q.dims[3]), _padded(problem.v.dims[3])


def tile_for(problem: AttentionProblem) -> Tile:
    """The tile of ``problem`` from the table, by its widest padded head dim and element size: the
    one place the planner decides it (a sweep replaces this function to time other tiles)."""
    widest = max(head_blocks(problem))
    tiles = (BACKWARD_TILES if problem.backward else FORWARD_TILES)[problem.q.dtype.itemsize]
    return next(tile for width, tile in tiles if widest <= width)


def candidate_tiles(problem: AttentionProblem) -> list[Tile]:
    """The tile ``tile_for`` picks for ``problem``, then every other tile of its direction's grid
    (FORWARD_GRID, BACKWARD_GRID) no wider than its sequences allow."""
    chosen = tile_for(problem)
    block_ms, block_ns, warps, stages = BACKWARD_GRID if problem.backward else FORWARD_GRID
    grid = [
        Tile(block_m, block_n, num_warps, num_stages)
        for block_m in block_ms
        for block_n in block_ns
        for num_warps in warps
        for num_stages in stages
        if block_m <= _padded(problem.seq_q) and block_n <= _padded(problem.seq_kv)
    ]
    return [chosen, *(tile for tile in grid if tile != chosen)]


def warp_specialized(problem: AttentionProblem, tma_aligned: bool, hopper: bool) -> bool:
    """The warp-specialized forward runs ``problem``: the call is compiled for an sm_90 GPU
    (``hopper``), q, k and v have 16-byte aligned base addresses (``tma_aligned``, a property of the
    call's pointers, not of the problem), ``gluon_forward`` takes the problem and its element size and
    head dim are in WARP_SPECIALIZED_TILES, or in UNMASKED_WARP_SPECIALIZED_TILES without a mask."""
    tile = (problem.q.dtype.itemsize, problem.q.dims[3])
    unmasked = problem.params.band == (None, None)
    return (
        tma_aligned
        and hopper
        and gluon_forward.out_of_scope(problem) is None
        and (tile in WARP_SPECIALIZED_TILES or (unmasked and tile in UNMASKED_WARP_SPECIALIZED_TILES))
    )


def choose(problem: AttentionProblem, tma_aligned: bool = False, hopper: bool = False) -> AttentionPlan:
    """The strategy and tile of ``problem`` (``warp_specialized``'s arguments; in a backward
    ``tma_aligned`` covers dO too): the warp-specialized forward with its own tile where
    ``warp_specialized`` holds, the warp-specialized dK/dV and dQ where ``gluon_backward`` takes the
    problem on the same two conditions (one predicate for both kernels); otherwise, and for the ``tl``
    kernels beside it, ``tile_for``'s tile, never wider than the sequences rounded up to a power of
    two."""
    if warp_specialized(problem, tma_aligned, hopper):
        head_dim = problem.q.dims[3]
        warp_tile = gluon_forward.tile_for(problem.q.dtype.itemsize, head_dim)
        return AttentionPlan(
            "warp_specialized_forward",
            gluon_forward.BLOCK_M,
            warp_tile.block_n,
            head_dim,
            head_dim,
            4,
            warp_tile.stages,
            warp_tile,
        )
    block_d, block_dv = head_blocks(problem)
    tile = tile_for(problem)
    block_m = min(tile.block_m, _padded(problem.seq_q))
    block_n = min(tile.block_n, _padded(problem.seq_kv))
    strategy = "flash2_forward"
    if problem.backward:
        in_scope = tma_aligned and hopper and gluon_backward.out_of_scope(problem) is None
        strategy = "warp_specialized_backward" if in_scope else "flash2_deterministic_backward"
    return AttentionPlan(strategy, block_m, block_n, block_d, block_dv, tile.num_warps, tile.num_stages)


def _padded(size: int) -> int:
    """``size`` rounded up to a power of two, at least MIN_BLOCK (on the host: triton.next_power_of_2 costs
    about 3 us a call, and every call plans with several)."""
    return max(MIN_BLOCK, 1 << (size - 1).bit_length())


def supports(problem: AttentionProblem) -> str | None:
    return None


def workspace_size(problem: AttentionProblem) -> int:
    """Bytes of workspace ``run`` allocates for ``problem``, at most: the backward's delta, one number
    per query row in the compute dtype (float32; float64 for DOUBLE); an fp8 forward of the
    warp-specialized kernel's scope, v^T's copy (``triton_transpose``; taken where the call runs on
    that kernel, on Hopper with aligned tensors); none for any other forward."""
    if problem.backward:
        return problem.batch * problem.q.dims[1] * problem.seq_q * problem.compute_dtype.itemsize
    if problem.fp8 and gluon_forward.out_of_scope(problem) is None:
        return transposed_elements(problem.v) * problem.v.dtype.itemsize
    return 0


def run(problem: AttentionProblem, t: AttentionTensors) -> None:
    views = {slot: torch_view(bound) for slot, bound in zip(t._fields, t) if bound is not None}
    compiled = t.q.device != CPU  # Triton on the CPU is its interpreter
    if problem.q.dtype is DataType.BFLOAT16 and isinstance(attention_forward_kernel, InterpretedFunction):
        interpreted_in_float32(problem, views)
        return
    hopper = compiled and has_wgmma(views["q"].device.index)
    read_by_tma = [views[slot] for slot in ("q", "k", "v", "do") if slot in views]
    plan = choose(problem, gluon_forward.tma_aligned(*read_by_tma), hopper)
    for slot in (*FP8_AMAX, *FP8_BACKWARD_AMAX):
        if slot in views:  # the kernels' programs join it by atomic max of numbers >= 0
            views[slot].zero_()
    if plan.strategy.startswith("warp_specialized"):
        use_descriptor_scratch()  # the Gluon kernels build their TMA descriptors on the device
    planned_launches(problem, plan)(views)


def interpreted_in_float32(problem: AttentionProblem, views: dict[str, Any]) -> None:
    """``problem`` on float32 copies of its bfloat16 tensors, the outputs rounded back: Triton 3.6's
    interpreter multiplies bfloat16 tl.dot operands as their bit patterns (the kernels then compute
    in float32 what a GPU computes from bfloat16 operands, P and dS unrounded)."""
    bfloat16 = (slot for slot in views if getattr(problem, slot).dtype is DataType.BFLOAT16)
    copies = {slot: views[slot].float() for slot in bfloat16}
    descs: dict[str, Any] = {
        slot: TensorDescriptor(DataType.FLOAT, copy.shape, copy.stride()) for slot, copy in copies.items()
    }
    widened = dataclasses.replace(problem, **descs)
    planned_launches(widened, choose(widened, False, False))({**views, **copies})
    for slot in OUTPUTS:
        if slot in copies:
            views[slot].copy_(copies[slot])


@functools.lru_cache(maxsize=256)  # per (problem, plan), asked by every call: the Launches keep their compiled kernels
def planned_launches(problem: AttentionProblem, plan: AttentionPlan) -> Launches:
    """The launches of ``plan`` on ``problem``, their tensors Slots named by the problem's slots
    (AttentionTensors' fields) and the backward's "delta" scratch (``workspace_size``)."""
    if plan.warp_tile is not None:
        return gluon_forward.launches(problem, plan.warp_tile)
    args = dict(_arguments(problem, plan))
    args.update({f"{slot}_ptr": None if getattr(problem, slot) is None else Slot(slot) for slot in SLOTS})
    if problem.ragged:  # the kernels read a ragged side's offsets where they read its lengths
        args["seq_lens_q_ptr"], args["seq_lens_kv_ptr"] = args["ragged_offsets_q_ptr"], args["ragged_offsets_kv_ptr"]
    query_blocks = query_block_grid(problem, plan.block_m)
    if not problem.backward:
        return Launches((_launch(attention_forward_kernel, query_blocks, args, plan),))
    import torch

    double = problem.compute_dtype is DataType.DOUBLE
    delta = Scratch(
        "delta", workspace_size(problem) // problem.compute_dtype.itemsize, torch.float64 if double else torch.float32
    )
    args["delta_ptr"] = Slot("delta")
    launches = [_launch(attention_delta_kernel, query_blocks, args, plan)]
    if plan.strategy == "warp_specialized_backward":
        launches += [gluon_backward.launch(problem), gluon_backward_dq.launch(problem)]
    else:
        key_blocks = block_grid(problem, problem.k.dims[1], problem.k.dims[2], problem.seq_kv, plan.block_n)
        launches += [
            _launch(attention_dkdv_kernel, key_blocks, args, plan),
            _launch(attention_dq_kernel, query_blocks, args, plan),
        ]
    if problem.dbias is not None:
        bias_batch, bias_heads, bias_queries, bias_keys = problem.dbias.dims
        tiles = triton.cdiv(bias_queries, plan.block_m) * triton.cdiv(bias_keys, plan.block_n)
        launches.append(_launch(attention_dbias_kernel, (tiles, bias_batch * bias_heads), args, plan))
    if problem.dsinks is not None:
        launches.append(_launch(attention_dsinks_kernel, (problem.q.dims[1], 1), args, plan))
    return Launches(tuple(launches), (delta,))


def _launch(kernel: Any, grid: tuple[int, int], args: dict[str, Any], plan: AttentionPlan) -> Launch:
    """The launch of ``kernel`` on ``grid`` with the arguments it names, its constexprs as options."""
    leading = _leading_parameters(kernel.fn)
    options = {name: args[name] for name in kernel.arg_names[len(leading) :]}
    return Launch(
        kernel,
        grid,
        tuple(args[name] for name in leading),
        {**options, "num_warps": plan.num_warps, "num_stages": plan.num_stages},
    )


@functools.cache
def _leading_parameters(function: Any) -> tuple[str, ...]:
    """The names of ``function``'s parameters before its constexprs (which all come last)."""
    parameters = inspect.signature(function).parameters.values()
    return tuple(p.name for p in itertools.takewhile(lambda p: "constexpr" not in str(p.annotation), parameters))


@functools.lru_cache(maxsize=256)
def _arguments(problem: AttentionProblem, plan: AttentionPlan) -> tuple[tuple[str, Any], ...]:
    """Every argument but the pointers, by name, for any of the kernels: planned once per problem."""
    left, right = problem.params.band
    dropout = problem.params.dropout_p
    heads_q, head_dim = problem.q.dims[1], problem.q.dims[3]
    bias, dbias, alibi, table = problem.bias, problem.dbias, problem.alibi_slopes, problem.block_table
    summed = [False] * 4 if dbias is None else [size == 1 for size in dbias.dims]
    lengths = (
        (problem.ragged_offsets_q, problem.ragged_offsets_kv)
        if problem.ragged
        else (problem.seq_lens_q, problem.seq_lens_kv)
    )
    seq_lens_strides = tuple(0 if d is None else d.strides[0] for d in lengths)
    ragged = problem.ragged  # packed sequences: batch b starts at its offset, the batch stride is unused

    def strides(desc: TensorDescriptor | None, ndim: int) -> tuple[int, ...]:
        found = _strides(desc, ndim)
        return (0, *found[1:]) if ragged else found

    args = dict(
        q_strides=strides(problem.q, 4),
        k_strides=problem.k.strides if table is not None else strides(problem.k, 4),
        v_strides=problem.v.strides if table is not None else strides(problem.v, 4),
        o_strides=strides(problem.o, 4),
        stats_strides=strides(problem.stats, 3),
        do_strides=strides(problem.do, 4),
        dq_strides=strides(problem.dq, 4),
        dk_strides=strides(problem.dk, 4),
        dv_strides=strides(problem.dv, 4),
        # broadcast dims of the bias read one element: stride 0
        bias_strides=(0, 0, 0, 0)
        if bias is None
        else tuple(0 if d == 1 else s for d, s in zip(bias.dims, bias.strides)),
        dbias_strides=_strides(dbias, 4),
        dbias_dims=(1, 1, 1, 1) if dbias is None else dbias.dims,
        seq_lens_strides=seq_lens_strides,
        # slopes of one per head read the same ones for every batch: batch stride 0
        alibi_strides=(0, 0) if alibi is None else ((0, *alibi.strides) if alibi.ndim == 1 else alibi.strides),
        sinks_stride=0 if problem.sinks is None else problem.sinks.strides[0],
        dsinks_stride=0 if problem.dsinks is None else problem.dsinks.strides[0],
        block_table_strides=(0, 0) if table is None else table.strides,
        batch=problem.batch,
        heads_q=heads_q,
        group=problem.group,
        packed_rows=(problem.q.dims[2], problem.k.dims[2]),  # ragged: the tokens of every sequence
        seq_q=problem.seq_q,
        seq_kv=problem.seq_kv,
        head_dim=head_dim,
        value_dim=problem.v.dims[3],
        block_size=problem.k.dims[2],
        scale=problem.scale,
        softcap=problem.params.softcap or 1.0,
        left=left or 0,
        right=right or 0,
        dropout_p=dropout,
        dropout_scale=1.0 / (1.0 - dropout),
        seed=problem.params.seed,
        offset=problem.params.offset,
        HAS_LEFT=left is not None,
        HAS_RIGHT=right is not None,
        BOTTOM_RIGHT=problem.params.alignment is DiagonalAlignment.BOTTOM_RIGHT,
        HAS_LENS_Q=problem.seq_lens_q is not None,
        HAS_LENS_KV=problem.seq_lens_kv is not None,
        RAGGED=ragged,
        PAGED=table is not None,
        BIAS_ADD=bias is not None and not problem.mask_bias,
        BIAS_MASK=problem.mask_bias,
        SOFTCAP=problem.params.softcap is not None,
        ALIBI=alibi is not None,
        SINKS=problem.sinks is not None,
        DROPOUT=dropout > 0,
        STORE_STATS=problem.stats is not None,
        FP8=problem.fp8,
        STORE_AMAX_S=problem.amax_s is not None,
        STORE_AMAX_O=problem.amax_o is not None,
        STORE_AMAX_DQ=problem.amax_dq is not None,
        STORE_AMAX_DK=problem.amax_dk is not None,
        STORE_AMAX_DV=problem.amax_dv is not None,
        STORE_AMAX_DP=problem.amax_dp is not None,
        FP8_ON_GRID=problem.fp8 and isinstance(attention_forward_kernel, InterpretedFunction),
        HEAD_DIM_PADDED=head_dim != plan.block_d,
        VALUE_DIM_PADDED=problem.v.dims[3] != plan.block_dv,
        PRECISION="tf32" if problem.allow_tf32 else "ieee",
        COMPUTE=tl.float64 if problem.compute_dtype is DataType.DOUBLE else tl.float32,
        BATCH_SUMMED=summed[0],
        HEADS_SUMMED=summed[1],
        QUERIES_SUMMED=summed[2],
        KEYS_SUMMED=summed[3],
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        BLOCK_D=plan.block_d,
        BLOCK_DV=plan.block_dv,
        BLOCK_B=triton.next_power_of_2(problem.batch) if ragged else 1,  # the offsets scheduled_block loads
    )
    return tuple(args.items())


def _strides(desc: TensorDescriptor | None, ndim: int) -> tuple[int, ...]:
    return (0,) * ndim if desc is None else desc.strides
