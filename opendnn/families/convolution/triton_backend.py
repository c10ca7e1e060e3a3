"""Convolution on the Triton backend: forward (with the fused bias / residual / activation
epilogue), backward data and backward filter, for 1-3 spatial dims, any strides and groups.

The kernels live in ``triton_gemm`` (implicit GEMM forward and backward data, im2col,
offset tables, the epilogue) and ``triton_direct`` (direct kernels and backward filter);
this module chooses a path per problem (``choose``, which names a ``Strategy``), builds its
launches once (``launch_plan``) and launches them. Problems reach the kernels
in a canonical 3-D form: a 1-D or 2-D problem gains leading spatial dims of size 1.

Algorithms (``method_of(problem.algo)``, in ``problem.py``):
    IMPLICIT_GEMM          zero workspace; depthwise-like problems (few channels per group) take
                           the direct kernels, vectorized over all channels, instead of a GEMM
                           whose tiles would be mostly padding
    IMPLICIT_PRECOMP_GEMM  the same GEMM reading the per-tap shifts and filter offsets from a
                           table of taps * 16 bytes in the workspace (forward, backward filter)
    GEMM                   im2col (forward, backward filter) or the column matrix of dy at the
                           strided positions (backward data) in the workspace, then a matrix product
    DIRECT                 the direct kernel (forward)
Backward filter splits its pixel reduction into slices through the workspace when its tiles are
too few to fill the GPU; slices are summed in a fixed order (deterministic, no atomics).

A 1x1, stride-1, ungrouped forward or backward data over channels-last tensors is a plain matrix
product (pixels x channels times the filter matrix): it runs on matmul's persistent TMA kernel
(``matmul_form``), under every algorithm but DIRECT. A 1x1 backward filter over images that store
their pixels contiguously (NCHW) runs as one product per image, summed in order
(``filter_matmul_form``).

Stride-1, ungrouped 2-D problems in 16-bit types, or float32 where TF32 is allowed, read their
activations by TMA in boxes of pixels (``tma_blocks``). wgmma takes TF32 operands only with the
reduced dim contiguous: TF32 backward data reads the filter repacked [C, R, S, K] in the workspace
(and runs as a forward convolution over dy), and TF32 backward problems whose activations TMA
cannot read where they are (NCHW) read channels-last copies in the workspace (``staged``). The
forward keeps zero workspace.

Tiles come from a small fixed table per shape class (no autotuning, see ``gemm_tile``): 256 x 128,
128 x 128 or 128 x 64 output tiles, 64-deep reduction chunks for 16-bit types (32 for float32, 16
for float64), 3 stages. Launches are planned once per problem and replayed (``launch_plan``).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from opendnn.core.arrays import CPU, Bound, torch_view
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dispatch import backend_module
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.convolution import triton_direct as direct
from opendnn.families.convolution import triton_gemm as gemm
from opendnn.families.convolution.problem import (
    ConvolutionDirection,
    ConvolutionMethod,
    ConvolutionProblem,
    algorithm_refusal,
    method_of,
)
from opendnn.families.matmul.problem import MatmulProblem, matmul_problem
from opendnn.families.pointwise.problem import PointwiseMode, PointwiseProblem
from opendnn.kernels.device import TMA_ALIGNMENT, programs_to_fill, tma_ready, use_descriptor_scratch
from opendnn.kernels.launch import Launch, Slot

FORWARD, BACKWARD_DATA, BACKWARD_FILTER = ConvolutionDirection
PROGRAMS_PER_SM = 2  # split-K slices aim for two programs per SM (264 on an H200)
DIRECT_MAX_REDUCED = 4  # IMPLICIT_GEMM takes the direct kernels up to this many reduced channels per group
DIRECT_MAX_OUTPUTS = 8  # ... and this many output channels per group
DIRECT_FILTER_COLUMNS = 32  # most taps x C/G the direct backward filter keeps in registers
# ... its (pixels, channels, warps) per tile, programs and fewest pixel tiles per slice, by whether dy's
# channels are contiguous. Measured on the H200 (docs/design/convolution.md): channels-last takes one
# warp per program (its pixel sums never leave the warp) and 4x the programs (latency hidden by
# residency): ResNet-like depthwise 3x3 118 -> 65 us; channels-first keeps 4 warps (one warp: 3x slower).
DIRECT_FILTER_TILES = {True: (16, 64, 1, 1056, 2), False: (64, 64, 4, 264, 8)}
WIDE_TILE_PROGRAMS = 96  # fewest 256 x 128 tiles worth taking them (fewer: 128 x 128)
TABLE_BYTES_PER_TAP = 16  # four int32: shift d, h, w and the filter offset
MIN_SLICE_STEPS = 8  # reduction steps each backward-filter slice runs at least
ALIGN = 256  # bytes: the start of each workspace region
SUM_BLOCK = 128  # filter elements per program of the pass that sums the slices
SUM_SPLITS = 16  # slices it loads at a time


@dataclass(frozen=True)
class Geometry:
    """A problem in 3-D canonical form (leading spatial dims of size 1 added)."""

    n: int
    c: int
    k: int
    groups: int
    x_size: tuple[int, int, int]
    y_size: tuple[int, int, int]
    filt: tuple[int, int, int]
    pad: tuple[int, int, int]
    stride: tuple[int, int, int]
    dilation: tuple[int, int, int]

    @property
    def taps(self) -> int:
        return math.prod(self.filt)

    @property
    def output_pixels(self) -> int:
        return self.n * math.prod(self.y_size)

    @property
    def input_pixels(self) -> int:
        return self.n * math.prod(self.x_size)


def _three(values: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return tuple((fill,) * (3 - len(values)) + tuple(values))  # type: ignore[return-value]


def geometry(problem: ConvolutionProblem) -> Geometry:
    x, w, y = problem.x.dims, problem.w.dims, problem.y.dims
    return Geometry(
        x[0],
        x[1],
        w[0],
        problem.groups,
        _three(x[2:], 1),
        _three(y[2:], 1),
        _three(w[2:], 1),
        _three(problem.pre_padding, 0),
        _three(problem.stride, 1),
        _three(problem.dilation, 1),
    )


def strides5(desc: TensorDescriptor | None) -> tuple[int, ...]:
    """(n, c, d, h, w) strides of a descriptor in canonical form (0 for an added dim)."""
    if desc is None:
        return (0,) * 5
    return (*desc.strides[:2], *_three(desc.strides[2:], 0))


def _uses_direct(problem: ConvolutionProblem, reduced: int, outputs: int) -> bool:
    method = method_of(problem.algo)
    if method is ConvolutionMethod.DIRECT:
        return True
    return method is ConvolutionMethod.IMPLICIT_GEMM and reduced <= DIRECT_MAX_REDUCED and outputs <= DIRECT_MAX_OUTPUTS


def _compute(problem: ConvolutionProblem) -> Any:
    return tl.float64 if problem.compute_type is DataType.DOUBLE or problem.x.dtype is DataType.DOUBLE else tl.float32


def _dot_type(problem: ConvolutionProblem, device: str) -> Any:
    """The operand type of tl.dot: the data's, float64 for float64 products, and float32 for
    bfloat16 under the interpreter (Triton 3.6's interpreted tl.dot multiplies bfloat16 bit patterns)."""
    if _compute(problem) == tl.float64:
        return tl.float64
    if problem.x.dtype is DataType.BFLOAT16 and device == CPU:
        return tl.float32
    return {DataType.FLOAT: tl.float32, DataType.HALF: tl.float16, DataType.BFLOAT16: tl.bfloat16}[problem.x.dtype]


def _precision(problem: ConvolutionProblem) -> str:
    return "tf32" if problem.x.dtype is DataType.FLOAT and problem.allow_tf32 else "ieee"


def _item(problem: ConvolutionProblem) -> int:
    return problem.x.dtype.itemsize


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


# ---- tiles ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def gemm_tile(problem: ConvolutionProblem, rows: int, columns: int, reduced: int, depth: int, gemms: int) -> Tile:
    """The tile of ``gemms`` GEMMs (groups x phases) of ``rows`` x ``columns`` reducing over
    ``depth`` = taps x ``reduced`` channels. Measured on the H200 (ResNet-50, NHWC bf16): 256 x 128 x 64 with 8 warps
    and 3 stages wherever it still makes ~100 programs, 128 x 128 below that, 128 x 64 x 64 with 4
    warps and 3 stages for 64 output channels, 256 x 64 x 32 for lanes straddling taps (conv1)."""
    if _compute(problem) == tl.float64:
        return Tile(64, 32, 16, 4, 2)
    block_k = 64 if problem.x.dtype.itemsize == 2 else 32
    if reduced % block_k:  # lanes of a chunk straddle taps: shallower chunks waste less
        block_k = 16 if reduced % 32 and reduced % 16 == 0 else 32
        if block_k == 32 and reduced % 32:
            return Tile(256, max(16, min(64, triton.next_power_of_2(columns))), 32, 8, 3)
    stages = 2 if depth <= block_k else 3  # a single chunk (1x1, 64 channels): less shared memory
    if columns >= 128:
        if triton.cdiv(rows, 256) * triton.cdiv(columns, 128) * gemms >= WIDE_TILE_PROGRAMS:
            return Tile(256, 128, block_k, 8, stages)
        return Tile(128, 128, block_k, 8, stages)
    return Tile(128, max(16, triton.next_power_of_2(columns)), block_k, 4, stages)


# ---- workspace -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterPlan:
    tile: Tile
    splits: int
    slice_pixels: int
    direct: bool


def filter_plan(problem: ConvolutionProblem) -> FilterPlan:
    """Backward filter's tile and pixel slices: enough programs to fill the GPU, each slice at
    least MIN_SLICE_STEPS tiles of pixels."""
    geo = geometry(problem)
    kg, cg = geo.k // geo.groups, geo.c // geo.groups
    pixels = geo.output_pixels
    if (
        _uses_direct(problem, kg, cg)
        and method_of(problem.algo) is ConvolutionMethod.IMPLICIT_GEMM
        and geo.taps * cg <= DIRECT_FILTER_COLUMNS
    ):
        block_m, block_n, warps, target, min_steps = DIRECT_FILTER_TILES[problem.y.strides[1] == 1]
        tile = Tile(block_m, min(block_n, triton.next_power_of_2(geo.k)), 0, warps, 1)
        programs = triton.cdiv(geo.k, tile.block_n)
        step = tile.block_m
        direct_kernel = True
    else:
        target = programs_to_fill(PROGRAMS_PER_SM)
        tile = gemm_tile(problem, kg, cg * geo.taps, cg, pixels, geo.groups * target)
        block_m = max(16, min(tile.block_m, triton.next_power_of_2(kg)))
        block_n = next((b for b in (128, 64, 32, 16) if cg % b == 0), tile.block_n)  # one tap per tile
        block_n = min(block_n, tile.block_n)
        tile = Tile(block_m, block_n, tile.block_k, 8 if block_m * block_n >= 128 * 128 else 4, tile.num_stages)
        programs = triton.cdiv(kg, tile.block_m) * triton.cdiv(cg * geo.taps, tile.block_n) * geo.groups
        step, min_steps = tile.block_k, MIN_SLICE_STEPS
        direct_kernel = False
    splits = max(1, min(triton.cdiv(target, programs), pixels // (step * min_steps)))
    slice_pixels = triton.cdiv(triton.cdiv(pixels, splits), step) * step
    return FilterPlan(tile, triton.cdiv(pixels, slice_pixels), slice_pixels, direct_kernel)


@functools.lru_cache(maxsize=256)
def _workspace_regions(problem: ConvolutionProblem) -> tuple[int, ...]:
    """Bytes of each of REGIONS: offset table, column matrix, backward-filter partial sums, and the
    TMA route's channels-last copies of x and y and its repacked filter."""
    geo = geometry(problem)
    method = method_of(problem.algo)
    table = _aligned(geo.taps * TABLE_BYTES_PER_TAP) if method is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM else 0
    columns = partials = 0
    if method is ConvolutionMethod.GEMM:
        columns = _aligned(_im2col_elements(problem) * _item(problem))
    if problem.direction is BACKWARD_FILTER:  # enough for the TMA kernel's slices and the others'
        splits = max(
            filter_plan(problem).splits,
            _tma_filter_split(problem)[1] if tma_blocks(problem) else 1,
            geo.n if filter_matmul_form(problem) else 1,
        )
        if splits > 1:
            accumulator = 8 if _compute(problem) == tl.float64 else 4
            partials = _aligned(splits * geo.k * (geo.c // geo.groups) * geo.taps * accumulator)
    copies = [
        _aligned(desc.numel * _item(problem)) if tma_blocks(problem) and used else 0
        for desc, used in (
            (problem.x, "x" in staged(problem)),
            (problem.y, "y" in staged(problem)),
            (problem.w, _packs_filter(problem)),
        )
    ]
    return table, columns, partials, *copies


def _im2col_elements(problem: ConvolutionProblem) -> int:
    """Elements of the column matrix an explicit GEMM convolution materialises."""
    geo = geometry(problem)
    if problem.direction is BACKWARD_DATA:
        return geo.input_pixels * geo.taps * geo.k
    return geo.output_pixels * geo.taps * geo.c


def workspace_size(problem: ConvolutionProblem) -> int:
    """Bytes of workspace ``run`` needs for this problem and algorithm."""
    return sum(_workspace_regions(problem))


def supports(problem: ConvolutionProblem) -> str | None:
    reason = algorithm_refusal(problem)
    if reason is not None:
        return reason
    dtypes = {problem.x.dtype, problem.w.dtype, problem.y.dtype}
    if len(dtypes) > 1:
        return f"x, w and y must share one dtype on the triton backend, got {sorted(d.name for d in dtypes)}"
    for name, desc in (("x", problem.x), ("y", problem.y), ("w", problem.w)):
        reach = sum((d - 1) * s for d, s in zip(desc.dims[1:], desc.strides[1:]))
        if reach >= 2**31:  # the kernels index within one sample (one filter) in int32
            return f"{name}_desc spans {reach + 1} elements within one sample; the triton kernels need < 2**31"
    return None


# ---- the path a problem takes --------------------------------------------------------------------


class Strategy(enum.Enum):
    """The path a convolution takes on this backend: ``choose`` names it, one launch builder builds it."""

    MATRIX_PRODUCT = "one product on matmul's kernels (1x1, stride 1, channels-last pixels: matmul_form)"
    IMAGE_PRODUCTS = "a product per image on matmul's kernels, summed in order (1x1 backward filter)"
    TMA = "implicit GEMM reading activations by TMA in boxes of pixels (tma_blocks; Hopper)"
    DIRECT = "the direct kernels, vectorized over all channels (few channels per group)"
    IMPLICIT_GEMM = "implicit GEMM gathering its operand tiles in the mainloop (no workspace)"
    PRECOMPUTED_GEMM = "implicit GEMM through a table of per-tap offsets in the workspace"
    EXPLICIT_GEMM = "im2col (or dy's column matrix) in the workspace, then a GEMM"


@functools.lru_cache(maxsize=512)
def choose(problem: ConvolutionProblem, tma_aligned: bool) -> Strategy:
    """The strategy for ``problem``; ``tma_aligned``: the tensors TMA would read are aligned for it on
    a GPU that has it (a property of the call's pointers, not of the problem)."""
    if matmul_form(problem) is not None:
        return Strategy.MATRIX_PRODUCT
    if filter_matmul_form(problem) is not None:
        return Strategy.IMAGE_PRODUCTS
    if tma_aligned and tma_blocks(problem) is not None:
        return Strategy.TMA
    geo = geometry(problem)
    if problem.direction is BACKWARD_FILTER:
        direct = filter_plan(problem).direct
    else:
        reduced, outputs = (geo.k, geo.c) if problem.direction is BACKWARD_DATA else (geo.c, geo.k)
        direct = _uses_direct(problem, reduced // geo.groups, outputs // geo.groups)
    if direct:
        return Strategy.DIRECT
    method = method_of(problem.algo)
    if method is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM:
        return Strategy.PRECOMPUTED_GEMM
    if method is ConvolutionMethod.GEMM:
        return Strategy.EXPLICIT_GEMM
    return Strategy.IMPLICIT_GEMM


# ---- launch plans --------------------------------------------------------------------------------
# A problem's launches are planned once (tiles, grids, argument lists with named slots for the
# tensors) and cached; each call fills the slots and calls the compiled kernels directly (launch.py):
# the per-call host cost is filling the slots, not re-deriving and re-binding 70 arguments.


@dataclass(frozen=True)
class Plan:
    launches: tuple[Launch, ...]
    regions: tuple[tuple[str, int, int, Any], ...]  # workspace (slot name, start, end, torch dtype)
    tma: bool = False  # a kernel builds TMA descriptors on the device


def run(
    problem: ConvolutionProblem,
    x: Bound,
    w: Bound,
    y: Bound,
    bias: Bound | None = None,
    z: Bound | None = None,
    workspace: Bound | None = None,
) -> None:
    strategy = choose(problem, tma_aligned=True)
    if strategy is Strategy.MATRIX_PRODUCT:
        form = matmul_form(problem)
        assert form is not None  # what choose read
        a, c = (y, x) if problem.direction is BACKWARD_DATA else (x, y)
        matrix_engine = backend_module("matmul", "triton")  # another family's backend: from the operation table
        matrix_engine.run(
            form,
            _matrix(a, form.a),
            _matrix(w, form.b),
            _matrix(c, form.c),
            None if bias is None else _matrix(bias, form.bias),
        )
        return
    interpreted = x.device == CPU
    tensors = {"x": torch_view(x), "w": torch_view(w), "y": torch_view(y)}
    first, second = (tensors[name] for name in TMA_READS[problem.direction])
    if strategy is Strategy.TMA and not tma_ready(first, second, interpreted):
        strategy = choose(problem, tma_aligned=False)
    plan = launch_plan(problem, interpreted, strategy)
    if plan.tma and not interpreted:
        use_descriptor_scratch()
    tensors["bias"] = torch_view(bias) if bias is not None else tensors["y"]
    tensors["z"] = torch_view(z) if z is not None else tensors["y"]
    if plan.regions:
        needed = plan.regions[-1][2]
        if workspace is None or workspace.desc.numel < needed:
            raise InternalError(
                f"convolution needs {needed} bytes of workspace, got {0 if workspace is None else workspace.desc.numel}"
            )
        space = torch_view(workspace).reshape(-1)
        for name, start, end, dtype in plan.regions:
            tensors[name] = space[start:end].view(dtype)
    if strategy is Strategy.IMAGE_PRODUCTS:  # the per-image partial filters, then the launches add them
        form = filter_matmul_form(problem)
        assert form is not None  # what choose read
        partials = tensors["partial"][: math.prod(form.c.dims)].view(form.c.dims)
        matrix_engine = backend_module("matmul", "triton")
        matrix_engine.run(form, _matrix(y, form.a), _matrix(x, form.b), Bound("partial", form.c, partials, x.device))
    for launch in plan.launches:
        launch(tensors)


# ---- 1x1 convolutions as matrix products ---------------------------------------------------------


@functools.lru_cache(maxsize=256)
def matmul_form(problem: ConvolutionProblem) -> MatmulProblem | None:
    """The matrix product a 1x1 problem is, or None. Forward: y[P, K] = x[P, C] @ w[K, C]^T (+ bias);
    backward data: dx[P, C] = dy[P, K] @ w[K, C]; P = N x pixels. Taken when no padding, stride or
    group changes that, when the pixels of x and y each step by one stride and their channels are
    contiguous (channels-last: TMA reads the rows), for 16-bit and TF32 products (matmul runs strict
    float32 and float64 on FMA units, the GEMM kernel on tensor cores), and when matmul's epilogue
    computes the same thing: no residual z or activation, and alpha 1 with a bias (matmul scales the
    biased sum, convolution only the product)."""
    geo = geometry(problem)
    if (
        problem.direction is BACKWARD_FILTER
        or geo.taps != 1
        or geo.groups != 1
        or method_of(problem.algo) is ConvolutionMethod.DIRECT
        or any(problem.pre_padding)
        or any(problem.post_padding)
        or any(s != 1 for s in problem.stride)
        or problem.z is not None
        or problem.activation is not None
        or (problem.bias is not None and problem.alpha != 1.0)
    ):
        return None
    dtype = problem.x.dtype
    if not (dtype.itemsize == 2 or (dtype is DataType.FLOAT and problem.allow_tf32)):
        return None
    a, c = (problem.y, problem.x) if problem.direction is BACKWARD_DATA else (problem.x, problem.y)
    a_pixels, c_pixels = _pixel_stride(a), _pixel_stride(c)
    if a_pixels is None or c_pixels is None or a.strides[1] != 1 or c.strides[1] != 1:
        return None
    w_k, w_c = problem.w.strides[:2]
    rows = geo.output_pixels
    b = (
        TensorDescriptor(dtype, (geo.k, geo.c), (w_k, w_c))
        if problem.direction is BACKWARD_DATA
        else TensorDescriptor(dtype, (geo.c, geo.k), (w_c, w_k))
    )
    bias = None if problem.bias is None else TensorDescriptor(problem.bias.dtype, (geo.k,), (problem.bias.strides[1],))
    return matmul_problem(
        TensorDescriptor(dtype, (rows, a.dims[1]), (a_pixels, 1)),
        b,
        TensorDescriptor(dtype, (rows, c.dims[1]), (c_pixels, 1)),
        alpha=problem.alpha,
        beta=problem.beta,
        bias_desc=bias,
        allow_tf32=problem.allow_tf32,
    )


@functools.lru_cache(maxsize=256)
def filter_matmul_form(problem: ConvolutionProblem) -> MatmulProblem | None:
    """Backward filter of a 1x1 problem whose images store their pixels contiguously (NCHW) as one
    batched product: partial[n] = dy[n] (K x P) @ x[n]^T (P x C), both operands read with the pixels,
    the reduced dim, contiguous (what TF32 tensor cores need); ``filter_sum_kernel`` then adds the N
    partials in order. Taken for 16-bit and TF32 products under IMPLICIT_GEMM when the N partial
    filters take no more memory than an explicit GEMM's columns (K <= pixels per image), for two
    images or more."""
    geo = geometry(problem)
    pixels = geo.output_pixels // geo.n
    dtype = problem.x.dtype
    if (
        problem.direction is not BACKWARD_FILTER
        or geo.taps != 1
        or geo.groups != 1
        or geo.k > pixels
        or geo.n == 1
        or method_of(problem.algo) is not ConvolutionMethod.IMPLICIT_GEMM
        or any(problem.pre_padding)
        or any(problem.post_padding)
        or any(s != 1 for s in problem.stride)
        or not (dtype.itemsize == 2 or _tf32(problem))
    ):
        return None
    if any(_pixel_stride(TensorDescriptor(dtype, (1, *d.dims[1:]), d.strides)) != 1 for d in (problem.x, problem.y)):
        return None
    (x_sn, x_sc), (dy_sn, dy_sk) = problem.x.strides[:2], problem.y.strides[:2]
    return matmul_problem(
        TensorDescriptor(dtype, (geo.n, geo.k, pixels), (dy_sn, dy_sk, 1)),
        TensorDescriptor(dtype, (geo.n, pixels, geo.c), (x_sn, 1, x_sc)),
        TensorDescriptor(DataType.FLOAT, (geo.n, geo.k, geo.c)),
        allow_tf32=problem.allow_tf32,
    )


def _pixel_stride(desc: TensorDescriptor) -> int | None:
    """The one stride that steps through every pixel (n, then spatial dims) in order, or None when
    the pixels are not evenly spaced."""
    pixel_dims = [(d, s) for d, s in zip((desc.dims[0], *desc.dims[2:]), (desc.strides[0], *desc.strides[2:])) if d > 1]
    if not pixel_dims:
        return 1
    stride = pixel_dims[-1][1]
    for (_, outer), (size, inner) in zip(pixel_dims, pixel_dims[1:]):
        if outer != inner * size:
            return None
    return stride


def _matrix(bound: Bound, desc: TensorDescriptor | None) -> Bound:
    """``bound``'s memory seen through the matrix descriptor ``desc`` (same first element)."""
    if desc is None:  # (a matrix form describes every tensor its problem has)
        raise InternalError(f"convolution's matrix form has no descriptor for {bound.name}")
    return Bound(bound.name, desc, torch_view(bound).as_strided(desc.dims, desc.strides), bound.device)


# ---- stride-1 convolutions read by TMA --------------------------------------------------------------

TMA_BLOCK_M = 128  # output pixels per tile: an IMAGES x BLOCK_H x BLOCK_W block
TMA_BLOCK_BYTES = 128  # bytes of reduced channels per chunk: 64 16-bit or 32 float32 (TF32) channels
# Fewest pixels along W in a box: rows of at least 8 pixels (one whole 128-byte swizzle pattern of
# 8 x 128 bytes); the widths verified exact on the H200 (docs/design/convolution.md, "The 8-warp race").
TMA_MIN_W = 8
# conv_tma_kernel runs 4 warps: with 8 (two warpgroups) and 3-4 stages its results on the H200 were
# wrong and changed from run to run (a race; docs/design/convolution.md, "The 8-warp race").
TMA_WARPS, TMA_STAGES = 4, 4
TMA_SHARED_BYTES = 200 * 1024  # filter_tma_kernel's pipeline stages take at most this much shared memory
TMA_READS = {FORWARD: ("x", "w"), BACKWARD_DATA: ("y", "w"), BACKWARD_FILTER: ("x", "y")}  # what TMA reads
ACTIVATION_READS = {FORWARD: ("x",), BACKWARD_DATA: ("y",), BACKWARD_FILTER: ("x", "y")}  # ... of them activations
REGIONS = ("table", "columns", "partial", "x_staged", "y_staged", "w_packed")  # the workspace, in order
MIN_SLICE_BOXES = 4  # boxes of output pixels each backward-filter slice sums at least


def _tf32(problem: ConvolutionProblem) -> bool:
    return problem.x.dtype is DataType.FLOAT and problem.allow_tf32 and _compute(problem) == tl.float32


def _channels_last_aligned(desc: TensorDescriptor) -> bool:
    """Channels contiguous and the other strides 16-byte aligned: TMA can read it in pixel boxes."""
    n_stride, c_stride, _, h_stride, w_stride = strides5(desc)
    aligned = TMA_ALIGNMENT // desc.dtype.itemsize
    return c_stride == 1 and not any(s % aligned for s in (n_stride, h_stride, w_stride))


def _activation(problem: ConvolutionProblem, name: str) -> TensorDescriptor:
    return problem.x if name == "x" else problem.y


@functools.lru_cache(maxsize=256)
def staged(problem: ConvolutionProblem) -> tuple[str, ...]:
    """The activations ("x", "y") the TMA route copies channels-last into the workspace first: a
    TF32 backward problem's operands that TMA cannot read where they are (NCHW, say)."""
    if problem.direction is FORWARD or not _tf32(problem):
        return ()
    return tuple(
        name for name in ACTIVATION_READS[problem.direction] if not _channels_last_aligned(_activation(problem, name))
    )


def _packs_filter(problem: ConvolutionProblem) -> bool:
    """TF32 backward data reads the filter repacked as [C, R, S, K] (wgmma takes TF32 operands only
    with the reduced dim contiguous) and runs as a forward convolution over dy."""
    return problem.direction is BACKWARD_DATA and _tf32(problem)


def _tma_block_k(problem: ConvolutionProblem) -> int:
    return TMA_BLOCK_BYTES // problem.x.dtype.itemsize


@functools.lru_cache(maxsize=256)
def tma_blocks(problem: ConvolutionProblem) -> tuple[int, int, int] | None:
    """(IMAGES, BLOCK_H, BLOCK_W) of the TMA kernels for this problem, or None when they do not
    apply: 2-D (or 1-D) stride-1 ungrouped 16-bit or TF32 problems, implicit GEMM, channels-last
    activations with 16-byte aligned strides (TF32 backward stages others: ``staged``), and for
    forward and backward data reduced channels a multiple of one 128-byte chunk and a KRSC filter
    (read as the matrix [K, R*S*C]; TF32 backward data repacks any filter). The block is the power-of-two box
    of 128 output pixels (input pixels for backward data), at least TMA_MIN_W wide, that pads
    them least (ties: the widest)."""
    geo = geometry(problem)
    implicit = method_of(problem.algo) in (ConvolutionMethod.IMPLICIT_GEMM, ConvolutionMethod.IMPLICIT_PRECOMP_GEMM)
    if (
        geo.groups != 1
        or geo.stride != (1, 1, 1)
        or geo.x_size[0] != 1
        or geo.filt[0] != 1
        or not (problem.x.dtype.itemsize == 2 or _tf32(problem))
        or matmul_form(problem) is not None
        or not implicit
    ):
        return None
    if problem.direction is BACKWARD_FILTER:
        pixels, reduced = geo.y_size, 0
    elif problem.direction is BACKWARD_DATA:
        pixels, reduced = geo.x_size, geo.k
    else:
        pixels, reduced = geo.y_size, geo.c
    if reduced % _tma_block_k(problem):
        return None
    if problem.direction is not BACKWARD_FILTER and not _packs_filter(problem):
        w_sk, w_sc, *w_taps = strides5(problem.w)
        if w_sc != 1 or w_taps[2] != geo.c or w_taps[1] != geo.filt[2] * geo.c or w_sk % 8:
            return None
    copied = sum(_activation(problem, name).numel for name in staged(problem))
    if copied + (problem.w.numel if _packs_filter(problem) else 0) > _im2col_elements(problem):
        return None  # the copies would take more memory than an explicit GEMM's columns (1x1 layers)
    for name in ACTIVATION_READS[problem.direction]:
        desc = _activation(problem, name)
        if name in staged(problem):  # its packed channels-last copy must be aligned
            if desc.dims[1] * desc.dtype.itemsize % TMA_ALIGNMENT:
                return None
        elif not _channels_last_aligned(desc):
            return None
    sides = [2**k for k in range(TMA_BLOCK_M.bit_length())]
    boxes = [(TMA_BLOCK_M // (h * w), h, w) for h in sides for w in sides if h * w <= TMA_BLOCK_M and w >= TMA_MIN_W]

    def padded(box: tuple[int, int, int]) -> tuple[int, int]:
        return pixel_boxes(geo.n, pixels, box) * TMA_BLOCK_M, -box[2]

    return min(boxes, key=padded)


def _planned_tma_blocks(problem: ConvolutionProblem) -> tuple[int, int, int]:
    """``tma_blocks`` of a problem planned on the TMA path, where it is never None."""
    blocks = tma_blocks(problem)
    if blocks is None:
        raise InternalError("a convolution planned on the TMA path has no TMA blocks")
    return blocks


def pixel_boxes(n: int, size: tuple[int, int, int], box: tuple[int, int, int]) -> int:
    """How many (IMAGES, BLOCK_H, BLOCK_W) boxes cover n images of (d, h, w) = ``size`` (d = 1)."""
    return math.prod(-(-extent // side) for extent, side in zip((n, size[1], size[2]), box))


def _tma_filter_tile(problem: ConvolutionProblem) -> tuple[int, int]:
    """(output channels, input channels) of a filter_tma_kernel tile: 128 or 64 (float32: 64, for shared memory)."""
    geo = geometry(problem)
    widest = 128 if _item(problem) == 2 else 64
    return (widest if geo.k >= widest else 64), (widest if geo.c >= widest else 64)


def _tma_filter_split(problem: ConvolutionProblem) -> tuple[int, int, int]:
    """(programs per slice, slices, boxes per slice) of filter_tma_kernel: slices of the output
    pixel boxes enough to fill the GPU, each at least MIN_SLICE_BOXES boxes."""
    geo = geometry(problem)
    boxes = pixel_boxes(geo.n, geo.y_size, _planned_tma_blocks(problem))
    block_k, block_c = _tma_filter_tile(problem)
    programs = triton.cdiv(geo.k, block_k) * geo.taps * triton.cdiv(geo.c, block_c)
    splits = max(1, min(triton.cdiv(programs_to_fill(PROGRAMS_PER_SM), programs), boxes // MIN_SLICE_BOXES))
    per_slice = triton.cdiv(boxes, splits)
    return programs, triton.cdiv(boxes, per_slice), per_slice


@functools.lru_cache(maxsize=256)
def launch_plan(problem: ConvolutionProblem, interpreted: bool, strategy: Strategy) -> Plan:
    """The launches computing ``problem`` by ``strategy`` (``choose``; ``interpreted``: Triton's CPU
    interpreter runs them)."""
    torch = _torch()
    dot = _dot_type(problem, CPU if interpreted else "cuda")
    item_type = {
        DataType.FLOAT: torch.float32,
        DataType.HALF: torch.float16,
        DataType.BFLOAT16: torch.bfloat16,
        DataType.DOUBLE: torch.float64,
    }[problem.x.dtype]
    accumulator = torch.float64 if _compute(problem) == tl.float64 else torch.float32
    regions, start = [], 0
    for name, size, dtype in zip(
        REGIONS, _workspace_regions(problem), (torch.int32, item_type, accumulator, item_type, item_type, item_type)
    ):
        if size:
            regions.append((name, start, start + size, dtype))
            start += size
    if strategy is Strategy.IMAGE_PRODUCTS:  # run() has computed the per-image partials
        launches = [_sum_launch(problem, geometry(problem).n)]
    elif strategy is Strategy.TMA:
        tma_launches = (
            _tma_filter_launches(problem, dot) if problem.direction is BACKWARD_FILTER else [_tma_launch(problem, dot)]
        )
        launches = [*_staging_launches(problem), *tma_launches]
    elif problem.direction is BACKWARD_FILTER:
        launches = _backward_filter(problem, dot, strategy)
    else:
        launches = _forward_or_backward_data(problem, dot, strategy)
    return Plan(tuple(launches), tuple(regions), strategy is Strategy.TMA)


def _forward_or_backward_data(problem: ConvolutionProblem, dot: Any, strategy: Strategy) -> list[Launch]:
    geo = geometry(problem)
    backward = problem.direction is BACKWARD_DATA
    groups = geo.groups
    if backward:
        a, out, a_desc, out_desc = Slot("y"), Slot("x"), problem.y, problem.x
        reduced, outputs, a_size, out_size = geo.k // groups, geo.c // groups, geo.y_size, geo.x_size
    else:
        a, out, a_desc, out_desc = Slot("x"), Slot("y"), problem.x, problem.y
        reduced, outputs, a_size, out_size = geo.c // groups, geo.k // groups, geo.x_size, geo.y_size
    w_sk, w_sc, *w_taps = strides5(problem.w)
    epilogue_args = (*strides5(problem.z), problem.bias.strides[1] if problem.bias is not None else 0)
    scalars = (problem.alpha, problem.beta, problem.alpha2, problem.activation_coef)
    flags = dict(
        FLIP=problem.flip,
        HAS_BETA=problem.beta != 0.0,
        HAS_BIAS=problem.bias is not None,
        HAS_Z=problem.z is not None,
        ACTIVATION=problem.activation.value[:-4] if problem.activation else "",
        PROPAGATE_NAN=problem.propagate_nan,
        COMPUTE=_compute(problem),
    )
    geometry_args = (*geo.pad, *geo.stride, *geo.dilation)
    pixels = geo.n * math.prod(out_size)

    if strategy is Strategy.DIRECT:
        channels = outputs * groups
        block_n = min(64, triton.next_power_of_2(channels))
        grid: tuple[int, ...] = (triton.cdiv(pixels, 64), triton.cdiv(channels, block_n))
        args = (
            a,
            Slot("w"),
            out,
            Slot("bias"),
            Slot("z"),
            *strides5(a_desc),
            w_sk,
            w_sc,
            *w_taps,
            *strides5(out_desc),
            *epilogue_args,
            pixels,
            *out_size,
            *a_size,
            reduced,
            outputs,
            channels,
            *geo.filt,
            *geometry_args,
            *scalars,
        )
        return [
            Launch(
                direct.conv_direct_kernel,
                grid,
                args,
                dict(BACKWARD=backward, BLOCK_M=64, BLOCK_N=block_n, num_warps=4, **flags),
            )
        ]

    launches = []
    table = out
    source = "implicit"
    if strategy is Strategy.PRECOMPUTED_GEMM:
        launches.append(_table_launch(geo, strides5(problem.w)[2:], problem.flip))
        table, source = Slot("table"), "precomp"
    elif strategy is Strategy.EXPLICIT_GEMM:
        launches.append(_im2col_launch(a, a_desc, geo, a_size, out_size, reduced, backward))
        a, source = Slot("columns"), "im2col"

    backward_rows = backward and source != "im2col"
    if backward_rows:
        phases = geo.stride
        steps = tuple(s // math.gcd(s, d) for s, d in zip(geo.stride, geo.dilation))
        units = tuple(-(-o // s) for o, s in zip(out_size, geo.stride))
    else:
        phases, steps, units = (1, 1, 1), (1, 1, 1), out_size
    rows = geo.n * math.prod(units)
    tile = gemm_tile(problem, rows, outputs, reduced, geo.taps * reduced, groups * math.prod(phases))
    grid = (gemm.grid_tiles(rows, outputs, tile.block_m, tile.block_n), groups, math.prod(phases))
    w_s_red, w_s_out = (w_sk, w_sc) if backward else (w_sc, w_sk)
    w_group = (reduced if backward else outputs) * w_sk
    args = (
        a,
        Slot("w"),
        out,
        Slot("bias"),
        Slot("z"),
        table,
        *strides5(a_desc),
        w_s_red,
        w_s_out,
        *w_taps,
        w_group,
        *strides5(out_desc),
        *epilogue_args,
        rows,
        *units,
        *out_size,
        *a_size,
        reduced,
        outputs,
        *geo.filt,
        *geometry_args,
        *steps,
        *scalars,
    )
    launches.append(
        Launch(
            gemm.conv_gemm_kernel,
            grid,
            args,
            dict(
                BACKWARD=backward_rows,
                SOURCE=source,
                EVEN_RED=reduced % tile.block_k == 0,
                DOT=dot,
                PRECISION=_precision(problem),
                BLOCK_M=tile.block_m,
                BLOCK_N=tile.block_n,
                BLOCK_K=tile.block_k,
                GROUP_M=8,
                num_warps=tile.num_warps,
                num_stages=tile.num_stages,
                **flags,
            ),
        )
    )
    return launches


def _tma_launch(problem: ConvolutionProblem, dot: Any) -> Launch:
    geo = geometry(problem)
    images, block_h, block_w = _planned_tma_blocks(problem)
    backward = problem.direction is BACKWARD_DATA
    if backward:
        (a, a_desc), out, out_desc, reduced, outputs = _tma_read(problem, "y"), Slot("x"), problem.x, geo.k, geo.c
        a_size, out_size = geo.y_size, geo.x_size
    else:
        (a, a_desc), out, out_desc, reduced, outputs = _tma_read(problem, "x"), Slot("y"), problem.y, geo.c, geo.k
        a_size, out_size = geo.x_size, geo.y_size
    w, w_sk, flip = Slot("w"), strides5(problem.w)[0], problem.flip
    pads: tuple[int, ...] = geo.pad[1:]
    if _packs_filter(problem):  # a forward convolution of dy with the filter [C, R, S, K], turned around
        backward, w, w_sk, flip = False, Slot("w_packed"), geo.taps * geo.k, not problem.flip
        pads = tuple((size - 1) * dilation - pad for size, dilation, pad in zip(geo.filt[1:], geo.dilation[1:], pads))
    a_sn, _, _, a_sh, a_sw = strides5(a_desc)
    o_sn, o_sc, _, o_sh, o_sw = strides5(out_desc)
    z_sn, z_sc, _, z_sh, z_sw = strides5(problem.z)
    block_n = 128 if outputs > 64 else max(16, triton.next_power_of_2(outputs))
    tiles = pixel_boxes(geo.n, out_size, (images, block_h, block_w)) * triton.cdiv(outputs, block_n)
    args = (
        a,
        w,
        out,
        Slot("bias"),
        Slot("z"),
        geo.n,
        *a_size[1:],
        reduced,
        *out_size[1:],
        outputs,
        *geo.filt[1:],
        a_sn,
        a_sh,
        a_sw,
        w_sk,
        o_sn,
        o_sc,
        o_sh,
        o_sw,
        z_sn,
        z_sc,
        z_sh,
        z_sw,
        problem.bias.strides[1] if problem.bias is not None else 0,
        *pads,
        *geo.dilation[1:],
        problem.alpha,
        problem.beta,
        problem.alpha2,
        problem.activation_coef,
    )
    return Launch(
        gemm.conv_tma_kernel,
        (tiles,),
        args,
        dict(
            BACKWARD=backward,
            FLIP=flip,
            HAS_BETA=problem.beta != 0.0,
            HAS_BIAS=problem.bias is not None,
            HAS_Z=problem.z is not None,
            ACTIVATION=problem.activation.value[:-4] if problem.activation else "",
            PROPAGATE_NAN=problem.propagate_nan,
            COMPUTE=_compute(problem),
            DOT=dot,
            PRECISION=_precision(problem),
            IMAGES=images,
            BLOCK_H=block_h,
            BLOCK_W=block_w,
            BLOCK_N=block_n,
            BLOCK_K=_tma_block_k(problem),
            GROUP_M=8,
            num_warps=TMA_WARPS,
            num_stages=TMA_STAGES,
        ),
    )


def _tma_read(problem: ConvolutionProblem, name: str) -> tuple[Slot, TensorDescriptor]:
    """Where the TMA kernels read activation ``name``: the caller's tensor or its staged copy."""
    desc = _activation(problem, name)
    if name in staged(problem):  # packed in memory order N, spatial dims, C
        return Slot(f"{name}_staged"), _packed_in_order(desc, (0, *range(2, desc.ndim), 1))
    return Slot(name), desc


def _packed_in_order(desc: TensorDescriptor, order: tuple[int, ...]) -> TensorDescriptor:
    """``desc``'s dims packed with its dims laid out in ``order`` (outermost first)."""
    return TensorDescriptor(desc.dtype, desc.dims, strides_for_order(desc.dims, order))


def _staging_launches(problem: ConvolutionProblem) -> list[Launch]:
    """The copies the TMA route reads instead of the caller's tensors: staged activations
    channels-last, and for TF32 backward data the filter [K, C, R, S] repacked as [C, R, S, K]."""
    copies = [(name, _tma_read(problem, name)) for name in staged(problem)]
    if _packs_filter(problem):
        copies.append(("w", (Slot("w_packed"), _packed_in_order(problem.w, (1, *range(2, problem.w.ndim), 0)))))
    launches = []
    pointwise = backend_module("pointwise", "triton")  # another family's backend: from the operation table
    for source, (target, target_desc) in copies:
        source_desc = problem.w if source == "w" else _activation(problem, source)
        copy = pointwise.pointwise_launch(PointwiseProblem(PointwiseMode.IDENTITY, (source_desc,), target_desc))
        names = {"out": target.name, "in0": source, "in1": target.name, "in2": target.name}
        args = tuple(Slot(names[a.name]) if isinstance(a, Slot) else a for a in copy.args)
        launches.append(Launch(copy.kernel, copy.grid, args, copy.options))
    return launches


def _table_launch(geo: Geometry, w_tap_strides: tuple[int, ...], flip: bool) -> Launch:
    block = min(1024, triton.next_power_of_2(geo.taps))
    return Launch(
        gemm.tap_table_kernel,
        (triton.cdiv(geo.taps, block),),
        (Slot("table"), *geo.filt, *geo.dilation, *w_tap_strides),
        dict(FLIP=flip, BLOCK=block, num_warps=4),
    )


def _im2col_launch(
    a: Slot,
    a_desc: TensorDescriptor,
    geo: Geometry,
    a_size: tuple[int, ...],
    out_size: tuple[int, ...],
    reduced: int,
    backward: bool,
) -> Launch:
    """The column matrix G x pixels x (taps * reduced) of A gathered at each output pixel's taps."""
    pixels = geo.n * math.prod(out_size)
    block_k = 64 if reduced % 64 == 0 else 32
    grid = (triton.cdiv(pixels, 64), triton.cdiv(geo.taps * reduced, block_k), geo.groups)
    args = (
        a,
        Slot("columns"),
        *strides5(a_desc),
        pixels,
        *out_size,
        *a_size,
        reduced,
        *geo.filt,
        *geo.pad,
        *geo.stride,
        *geo.dilation,
    )
    return Launch(
        gemm.im2col_kernel,
        grid,
        args,
        dict(BACKWARD=backward, EVEN_RED=reduced % block_k == 0, BLOCK_M=64, BLOCK_K=block_k, num_warps=4),
    )


def _backward_filter(problem: ConvolutionProblem, dot: Any, strategy: Strategy) -> list[Launch]:
    geo = geometry(problem)
    plan = filter_plan(problem)
    kg, cg = geo.k // geo.groups, geo.c // geo.groups
    partial = Slot("partial") if plan.splits > 1 else Slot("w")
    common = (
        *strides5(problem.x),
        *strides5(problem.y),
        *strides5(problem.w),
        geo.output_pixels,
        *geo.y_size,
        *geo.x_size,
        geo.k,
        kg,
        cg,
        *geo.filt,
        *geo.pad,
        *geo.stride,
        *geo.dilation,
        plan.slice_pixels,
        problem.alpha,
        problem.beta,
    )
    flags = dict(FLIP=problem.flip, PARTIAL=plan.splits > 1, HAS_BETA=problem.beta != 0.0, COMPUTE=_compute(problem))
    tile = plan.tile
    launches = []
    if strategy is Strategy.DIRECT:
        grid: tuple[int, ...] = (triton.cdiv(geo.k, tile.block_n), plan.splits)
        launches.append(
            Launch(
                direct.filter_direct_kernel,
                grid,
                (Slot("x"), Slot("y"), Slot("w"), partial, *common),
                dict(
                    COLUMNS=triton.next_power_of_2(geo.taps * cg),
                    BLOCK_M=tile.block_m,
                    BLOCK_N=tile.block_n,
                    num_warps=tile.num_warps,
                    **flags,
                ),
            )
        )
    else:
        table, source, gathered = Slot("w"), "implicit", Slot("x")
        if strategy is Strategy.PRECOMPUTED_GEMM:
            launches.append(_table_launch(geo, strides5(problem.w)[2:], False))
            table, source = Slot("table"), "precomp"
        elif strategy is Strategy.EXPLICIT_GEMM:
            launches.append(_im2col_launch(Slot("x"), problem.x, geo, geo.x_size, geo.y_size, cg, False))
            gathered, source = Slot("columns"), "im2col"
        grid = (triton.cdiv(kg, tile.block_m) * triton.cdiv(cg * geo.taps, tile.block_n), geo.groups, plan.splits)
        args = (gathered, Slot("y"), Slot("w"), partial, table, *common)
        launches.append(
            Launch(
                direct.filter_gemm_kernel,
                grid,
                args,
                dict(
                    SOURCE=source,
                    EVEN_CG=cg % tile.block_n == 0,
                    DOT=dot,
                    PRECISION=_precision(problem),
                    BLOCK_M=tile.block_m,
                    BLOCK_N=tile.block_n,
                    BLOCK_K=tile.block_k,
                    num_warps=tile.num_warps,
                    num_stages=tile.num_stages,
                    **flags,
                ),
            )
        )
    if plan.splits > 1:
        launches.append(_sum_launch(problem, plan.splits))
    return launches


def _sum_launch(problem: ConvolutionProblem, splits: int) -> Launch:
    """dw = alpha * (the sum of the slices' partials) + beta * dw."""
    geo = geometry(problem)
    cg = geo.c // geo.groups
    grid = (triton.cdiv(geo.k * cg * geo.taps, SUM_BLOCK),)
    args = (Slot("w"), Slot("partial"), *strides5(problem.w), geo.k, cg, *geo.filt, splits, problem.alpha, problem.beta)
    return Launch(
        direct.filter_sum_kernel,
        grid,
        args,
        dict(
            FLIP=problem.flip,
            HAS_BETA=problem.beta != 0.0,
            COMPUTE=_compute(problem),
            BLOCK=SUM_BLOCK,
            SPLIT_BLOCK=min(SUM_SPLITS, triton.next_power_of_2(splits)),
            num_warps=4,
        ),
    )


def _tma_filter_launches(problem: ConvolutionProblem, dot: Any) -> list[Launch]:
    geo = geometry(problem)
    images, block_h, block_w = _planned_tma_blocks(problem)
    block_k, block_c = _tma_filter_tile(problem)
    programs, splits, per_slice = _tma_filter_split(problem)
    (x, x_desc), (dy, dy_desc) = _tma_read(problem, "x"), _tma_read(problem, "y")
    x_sn, _, _, x_sh, x_sw = strides5(x_desc)
    dy_sn, _, _, dy_sh, dy_sw = strides5(dy_desc)
    w_sk, w_sc, _, w_sr, w_ss = strides5(problem.w)
    stages = min(4, TMA_SHARED_BYTES // (TMA_BLOCK_M * (block_k + block_c) * _item(problem)))
    args = (
        x,
        dy,
        Slot("w"),
        Slot("partial") if splits > 1 else Slot("w"),
        geo.n,
        *geo.x_size[1:],
        geo.c,
        *geo.y_size[1:],
        geo.k,
        *geo.filt[1:],
        x_sn,
        x_sh,
        x_sw,
        dy_sn,
        dy_sh,
        dy_sw,
        w_sk,
        w_sc,
        w_sr,
        w_ss,
        *geo.pad[1:],
        *geo.dilation[1:],
        per_slice,
        problem.alpha,
        problem.beta,
    )
    launches = [
        Launch(
            direct.filter_tma_kernel,
            (programs, splits),
            args,
            dict(
                FLIP=problem.flip,
                PARTIAL=splits > 1,
                HAS_BETA=problem.beta != 0.0,
                COMPUTE=_compute(problem),
                DOT=dot,
                PRECISION=_precision(problem),
                IMAGES=images,
                BLOCK_H=block_h,
                BLOCK_W=block_w,
                BLOCK_M=block_k,
                BLOCK_N=block_c,
                num_warps=8 if block_k * block_c >= 128 * 128 else 4,
                num_stages=stages,
            ),
        )
    ]
    if splits > 1:
        launches.append(_sum_launch(problem, splits))
    return launches


def _torch() -> Any:
    import torch

    return torch
