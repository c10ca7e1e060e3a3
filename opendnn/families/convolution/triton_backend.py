"""Convolution on the Triton backend: forward (with the fused bias / residual / activation
epilogue), backward data and backward filter, for 1-3 spatial dims, any strides and groups.

The kernels live in ``triton_gemm`` (implicit GEMM forward and backward data, im2col,
offset tables, the epilogue) and ``triton_direct`` (direct kernels and backward filter);
this module chooses a path per problem (``choose``, which names a ``Strategy``), builds its
launches once (``launch_plan``) and launches them. Problems reach the kernels
in a canonical 3-D form: a 1-D or 2-D problem gains leading spatial dims of size 1.

Algorithms (``method_of(problem.algo)``, in ``problem.py``):
    IMPLICIT_GEMM          no workspace in the forward (TF32 backward problems' staged copies:
                           below); depthwise-like problems (few channels per group) take
                           the direct kernels, vectorized over all channels, instead of a GEMM
                           whose tiles would be mostly padding; narrow groups (up to 16 channels
                           a group) take ``triton_grouped``'s block-diagonal products
    IMPLICIT_PRECOMP_GEMM  the same GEMM reading the per-tap shifts and filter offsets from a
                           table of taps * 16 bytes in the workspace (forward, backward filter);
                           a TF32 forward's staged copies of x and the filter (below); depthwise
                           problems: the depthwise kernel over the filter packed tap-major in the
                           workspace (``packs_depthwise_filter``), as under GEMM; grouped
                           problems over NCHW tensors: ``triton_grouped`` over channels-last
                           copies (``grouped_copies``), as under GEMM
    GEMM                   im2col (forward, backward filter) or the column matrix of dy at the
                           strided positions (backward data) in the workspace, then a matrix product;
                           a backward data over few input channels multiplies dy by the filter into
                           the workspace and gathers the products into dx (``triton_col2im``)
    DIRECT                 the direct kernel (forward)
Backward filter splits its pixel reduction into slices through the workspace when its tiles are
too few to fill the GPU; slices are summed in a fixed order (deterministic, no atomics).

A 1x1, stride-1, ungrouped forward or backward data is a plain matrix product (over channels-last
tensors the pixels x channels times the filter matrix; over 16-bit NCHW ones the filter matrix times
each image's channels x pixels): it runs on matmul's persistent TMA kernel (``matmul_form``), under
every algorithm but DIRECT. A 1x1 backward filter over images that store
their pixels contiguously (NCHW) runs as one product per image, summed in order
(``filter_matmul_form``).

Stride-1, ungrouped 2-D problems in 16-bit types, or float32 where TF32 is allowed, read their
activations by TMA in boxes of pixels (``tma_blocks``). wgmma takes TF32 operands only with the
reduced dim contiguous: TF32 backward data reads the filter repacked [C, R, S, K] in the workspace
(and runs as a forward convolution over dy; 16-bit backward data too where the filter is KCRS), and
backward problems whose activations TMA cannot read where they are (NCHW) read channels-last copies
in the workspace (``staged``). A forward does the same under IMPLICIT_PRECOMP_GEMM only
(``stages_forward``: x channels-last, the filter KRSC where it is not, writing y at its own
strides); under IMPLICIT_GEMM it keeps zero workspace. The copies hold float32 values rounded to
TF32 to nearest and take less memory than an explicit GEMM's columns. Calls that name no algorithm
take IMPLICIT_PRECOMP_GEMM where it stages (``preferred``, read by ``algorithms.default_algorithm``).
On an sm_90 GPU the problems of that route run on the persistent, warp-specialized Gluon engine:
forward and backward data in ``gluon_hopper`` (16-bit and TF32), backward filter in ``gluon_filter`` (16-bit;
``engine_reads_boxes``, ``Strategy.WARP_SPECIALIZED_TMA``); so do forwards at strides that divide
x's height and width, read through x's phase view (``triton_gemm.phase_view_box``), and strided
backward data, one launch per stride phase of dx (``triton_tma.output_phases``).

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
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import backend_module
from opendnn.core.dtypes import DataType
from opendnn.core.errors import InternalError
from opendnn.families.convolution import triton_depthwise as depthwise
from opendnn.families.convolution import triton_depthwise_filter as depthwise_filter
from opendnn.families.convolution import triton_direct as direct
from opendnn.families.convolution import triton_gemm as gemm
from opendnn.families.convolution.gluon_filter import filter_split, filter_warp_specialized_launch
from opendnn.families.convolution.gluon_hopper import warp_specialized_launches
from opendnn.families.convolution.problem import (
    ConvolutionMethod,
    ConvolutionProblem,
    algorithm_refusal,
    method_of,
)
from opendnn.families.convolution.triton_col2im import col2im_elements, col2im_launches, gathers_products
from opendnn.families.convolution.triton_grouped import (
    grouped_copies,
    grouped_copy_launches,
    grouped_launch,
    grouped_splits,
    grouped_tile,
)
from opendnn.families.convolution.triton_matrix import (
    filter_matmul_form,
    filter_times_images,
    matmul_form,
    matrix_bound,
)
from opendnn.families.convolution.triton_raster import raster_elements, raster_launches, raster_plan, staged_operands
from opendnn.families.convolution.triton_tiles import (
    BACKWARD_DATA,
    BACKWARD_FILTER,
    DEPTHWISE_AHEAD_BYTES,
    DIRECT_UNROLL_STEPS,
    PIXEL_CHANNELS,
    TABLE_BYTES_PER_TAP,
    FilterPlan,
    Geometry,
    accumulator_type,
    aligned,
    channels_per_group,
    depthwise_packed_filter,
    depthwise_run_tile,
    depthwise_tile,
    dot_precision,
    dot_type,
    epilogue_options,
    filter_plan,
    gemm_tile,
    geometry,
    im2col_elements,
    itemsize_of,
    over_image_channels,
    packs_depthwise_filter,
    padded_x,
    pads_channels,
    rounded_filter,
    stride_phases,
    strides5,
    sum_blocks,
    tf32,
    uses_direct,
)
from opendnn.families.convolution.triton_tma import (
    TMA_READS,
    activation_staging_launches,
    copy_launch,
    has_frames,
    packs_filter,
    partial_output,
    reduction_slices,
    slice_sum_launch,
    staged,
    staged_rows,
    stages_forward,
    stages_output,
    staging_launches,
    tma_blocks,
    tma_filter_launch,
    tma_filter_split,
    tma_launches,
)
from opendnn.kernels.device import has_wgmma, tma_ready, use_descriptor_scratch
from opendnn.kernels.launch import Launch, Slot

REGIONS = ("table", "columns", "partial", "x_staged", "y_staged", "w_packed")  # the workspace, in order


@functools.lru_cache(maxsize=256)  # per problem, not per call: asked by the algorithm and workspace queries
def _workspace_regions(problem: ConvolutionProblem) -> tuple[int, ...]:
    """Bytes of each of REGIONS: offset table, column matrix, the partial sums of a backward filter's
    or a sliced forward's slices (``reduction_slices``), and the TMA route's channels-last copies of
    x and y (a backward data's x: dx's rows it stages, ``stages_output``; the grouped route's
    backward filter's copies of ``staged`` activations alike) and its repacked filter (the raster
    route's rasters of x and dy where it applies: ``triton_raster``)."""
    if packs_depthwise_filter(problem):  # the filter's copy, nothing else
        return 0, 0, 0, 0, 0, aligned(problem.w.numel * itemsize_of(problem))
    copied = grouped_copies(problem)
    if copied:  # the grouped route's copies, nothing else
        operands = (("x", problem.x), ("y", problem.y), ("w", problem.w))
        return 0, 0, 0, *(aligned(desc.numel * itemsize_of(problem) * (name in copied)) for name, desc in operands)
    geo = geometry(problem)
    raster = raster_plan(problem)
    method = method_of(problem.algo)
    precomputed = method is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM and not pads_channels(problem)
    table = aligned(geo.taps * TABLE_BYTES_PER_TAP) if precomputed else 0
    columns = partials = 0
    if gathers_products(problem):  # the product's float sums, which the gather adds up
        partials = aligned(col2im_elements(problem) * (8 if accumulator_type(problem) == tl.float64 else 4))
    elif method is ConvolutionMethod.GEMM:
        columns = aligned(im2col_elements(problem) * itemsize_of(problem))
    if problem.direction is BACKWARD_FILTER:  # enough for the TMA kernel's slices and the others'
        splits = max(
            filter_plan(problem).splits,
            tma_filter_split(problem)[1] if tma_blocks(problem) and raster is None else 1,
            filter_split(problem).partials if tma_blocks(problem) and itemsize_of(problem) == 2 else 1,
            geo.n if filter_matmul_form(problem) else 1,
            grouped_splits(problem),
            raster.partials if raster else 1,
        )
        if splits > 1:
            accumulator = 8 if accumulator_type(problem) == tl.float64 else 4
            partials = aligned(splits * geo.k * (geo.c // geo.groups) * geo.taps * accumulator)
    slices = reduction_slices(problem)[0]
    if slices > 1:  # a sliced forward's float32 partial sums
        partials = aligned(slices * partial_output(problem).numel * 4)
    if raster is not None:  # the rasters, in the places of the TMA route's copies, which are not made
        copies = [*raster_elements(problem, raster), 0]
    elif pads_channels(problem):
        copies = [padded_x(problem).numel, 0, problem.w.numel if rounded_filter(problem) else 0]
    elif problem.direction is BACKWARD_FILTER and choose(problem, tma_aligned=False) is Strategy.GROUPED:
        copies = [problem.x.numel * ("x" in staged(problem)), problem.y.numel * ("y" in staged(problem)), 0]
    elif tma_blocks(problem) is None:
        copies = [0, 0, 0]
    else:
        copies = [
            staged_rows(problem, 0).numel if stages_output(problem) else problem.x.numel * ("x" in staged(problem)),
            problem.y.numel * ("y" in staged(problem)),
            problem.w.numel * packs_filter(problem),
        ]
    return table, columns, partials, *(aligned(elements * itemsize_of(problem)) for elements in copies)


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

    MATRIX_PRODUCT = "one product on matmul's kernels (1x1, stride 1: matmul_form)"
    IMAGE_PRODUCTS = "a product per image on matmul's kernels, summed in order (1x1 backward filter)"
    WARP_SPECIALIZED_TMA = "the TMA route's problems wgmma reads from shared memory, on the warp-specialized engine"
    RASTER_FILTER = "TF32 backward filter over pixel-major copies of x and dy read by TMA (triton_raster)"
    TMA = "implicit GEMM reading activations by TMA in boxes of pixels (tma_blocks; Hopper)"
    DIRECT = "the direct kernels, vectorized over all channels (few channels per group)"
    GROUPED = "blocks of narrow groups, one block-diagonal product per tap (triton_grouped)"
    IMPLICIT_GEMM = "implicit GEMM gathering its operand tiles in the mainloop (no workspace)"
    PRECOMPUTED_GEMM = "implicit GEMM through the workspace: a table of per-tap offsets, or x padded (pads_channels)"
    EXPLICIT_GEMM = "im2col (or dy's column matrix) in the workspace, then a GEMM; or the product, then a gather"


TMA_STRATEGIES = (Strategy.WARP_SPECIALIZED_TMA, Strategy.RASTER_FILTER, Strategy.TMA)  # kernels reading by TMA


def copied_operands(problem: ConvolutionProblem) -> tuple[str, ...]:
    """The operands ("x", "y", "w") the TMA route reads as copies in the workspace (``staged``,
    ``packs_filter``), not where the caller holds them."""
    return (*staged(problem), *(("w",) if packs_filter(problem) else ()))


def preferred(problem: ConvolutionProblem) -> bool:
    """Whether ``problem``'s algorithm takes a route here that the algorithms the heuristics rank
    before it cannot (``algorithms``: Get ranks it first; a call that names no algorithm takes it):
    an IMPLICIT_PRECOMP_GEMM forward whose TMA route reads copies in its workspace (x NCHW or the
    filter not KRSC: ``stages_forward``), which IMPLICIT_GEMM, keeping zero workspace, does not
    make (it reads NCHW x by the cp.async GEMM); a depthwise problem whose kernel reads its filter
    packed tap-major in the workspace (``packs_depthwise_filter``), and a grouped one whose kernel reads
    channels-last copies of its NCHW activation and KCRS filter there (``grouped_copies``); a forward or
    backward filter with
    few input channels reading x padded in the workspace (``pads_channels``); a GEMM backward data
    into an image's channels (``over_image_channels``), which gathers dy's products from the
    workspace (``gathers_products``) where the implicit GEMM would spend its MMA columns on padding;
    a forward of the TMA route whose few tiles would leave most SMs idle, which splits its reduction
    into slices whose partial sums the workspace holds (``reduction_slices``)."""
    return (
        reduction_slices(problem)[0] > 1
        or packs_depthwise_filter(problem)
        or bool(grouped_copies(problem))
        or pads_channels(problem)
        or (gathers_products(problem) and over_image_channels(problem))
        or (stages_forward(problem) and tma_blocks(problem) is not None and bool(copied_operands(problem)))
    )


def engine_reads_boxes(problem: ConvolutionProblem) -> bool:
    """Whether the warp-specialized engine takes a problem of the TMA route (``tma_blocks``): wgmma
    reads its boxes from shared memory as TMA lands them. 16-bit operands in every direction (wgmma
    reads them in either major order); float32 as TF32 (the route takes float32 only where the math
    mode allows TF32) in forward and backward data, whose boxes hold the reduced channels contiguous,
    the K-major order wgmma needs for TF32 operands. A backward filter reduces over pixels, the outer
    dim of its channels-last boxes, so its TF32 operands are not K-major: it takes the raster route
    (``triton_raster``) where that applies, else ``filter_tma_kernel``, which transposes B through
    registers. 2-D problems only: a 3-D problem's frames are ``conv_tma_kernel``'s (``_frames_fit``)."""
    if has_frames(problem):
        return False
    return problem.x.dtype.itemsize == 2 or (tf32(problem) and problem.direction is not BACKWARD_FILTER)


@functools.lru_cache(maxsize=512)  # per problem, asked by every run (a Plan keeps the backend, not this)
def choose(problem: ConvolutionProblem, tma_aligned: bool, hopper: bool = False) -> Strategy:
    """The strategy for ``problem``; ``tma_aligned``: the tensors TMA would read are aligned for it on
    a GPU that has it (a property of the call's pointers, not of the problem); ``hopper``: the kernels
    are compiled for an sm_90 GPU (not interpreted), where the TMA route's problems whose operand boxes
    wgmma reads from shared memory as they land take the warp-specialized engine (``gluon_hopper``,
    ``gluon_filter``; wgmma is sm_90's alone): ``engine_reads_boxes``."""
    if matmul_form(problem) is not None:
        return Strategy.MATRIX_PRODUCT
    if filter_matmul_form(problem) is not None:
        return Strategy.IMAGE_PRODUCTS
    if tma_aligned and raster_plan(problem) is not None:
        return Strategy.RASTER_FILTER
    if tma_aligned and tma_blocks(problem) is not None:
        if hopper and engine_reads_boxes(problem):
            return Strategy.WARP_SPECIALIZED_TMA
        return Strategy.TMA
    if problem.direction is BACKWARD_FILTER:
        direct = filter_plan(problem).direct
    else:
        direct = uses_direct(problem, *channels_per_group(problem))
    if direct:
        return Strategy.DIRECT
    if grouped_tile(problem) is not None:
        return Strategy.GROUPED
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
    interpreted = x.device == CPU
    hopper = not interpreted and has_wgmma(torch_view(x).device.index)
    strategy = choose(problem, tma_aligned=True, hopper=hopper)
    if strategy is Strategy.MATRIX_PRODUCT:
        form = matmul_form(problem)
        assert form is not None  # what choose read
        images, c = (y, x) if problem.direction is BACKWARD_DATA else (x, y)
        a, b = (w, images) if filter_times_images(problem) else (images, w)
        matrix_engine = backend_module("matmul", "triton")  # another family's backend: from the operation table
        matrix_engine.run(
            form,
            matrix_bound(a, form.a),
            matrix_bound(b, form.b),
            matrix_bound(c, form.c),
            None if bias is None else matrix_bound(bias, form.bias),
        )
        return
    tensors = {"x": torch_view(x), "w": torch_view(w), "y": torch_view(y)}
    if strategy in TMA_STRATEGIES:  # TMA reads the copies it reads in the workspace
        copied = staged_operands(problem) if strategy is Strategy.RASTER_FILTER else copied_operands(problem)
        first, second = (
            torch_view(workspace) if workspace is not None and name in copied else tensors[name]
            for name in TMA_READS[problem.direction]
        )
        if not tma_ready(first, second, interpreted):
            strategy = choose(problem, tma_aligned=False, hopper=hopper)
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
        space = torch_view(workspace)  # bytes, one dim
        for name, start, end, dtype in plan.regions:
            tensors[name] = space[start:end].view(dtype)
    if strategy is Strategy.IMAGE_PRODUCTS:  # the per-image partial filters, then the launches add them
        form = filter_matmul_form(problem)
        assert form is not None  # what choose read
        partials = tensors["partial"][: math.prod(form.c.dims)].view(form.c.dims)
        matrix_engine = backend_module("matmul", "triton")
        matrix_engine.run(
            form, matrix_bound(y, form.a), matrix_bound(x, form.b), Bound("partial", form.c, partials, x.device)
        )
    for launch in plan.launches:
        launch(tensors)


@functools.lru_cache(maxsize=256)  # per problem, asked by every run (a Plan keeps the backend, not this)
def launch_plan(problem: ConvolutionProblem, interpreted: bool, strategy: Strategy) -> Plan:
    """The launches computing ``problem`` by ``strategy`` (``choose``; ``interpreted``: Triton's CPU
    interpreter runs them)."""
    torch = _torch()
    dot = dot_type(problem, CPU if interpreted else "cuda")
    item_type = {
        DataType.FLOAT: torch.float32,
        DataType.HALF: torch.float16,
        DataType.BFLOAT16: torch.bfloat16,
        DataType.DOUBLE: torch.float64,
    }[problem.x.dtype]
    accumulator = torch.float64 if accumulator_type(problem) == tl.float64 else torch.float32
    regions, start = [], 0
    for name, size, dtype in zip(
        REGIONS, _workspace_regions(problem), (torch.int32, item_type, accumulator, item_type, item_type, item_type)
    ):
        if size:
            regions.append((name, start, start + size, dtype))
            start += size
    if strategy is Strategy.IMAGE_PRODUCTS:  # run() has computed the per-image partials
        launches = [_sum_launch(problem, geometry(problem).n)]
    elif strategy is Strategy.RASTER_FILTER:
        launches = raster_launches(problem, dot)
        raster = raster_plan(problem)
        assert raster is not None  # what choose read
        if raster.partials:
            launches.append(_sum_launch(problem, raster.partials))
    elif strategy is Strategy.TMA and problem.direction is BACKWARD_FILTER:
        launches = [*staging_launches(problem), tma_filter_launch(problem, dot)]
        splits = tma_filter_split(problem)[1]
        if splits > 1:
            launches.append(_sum_launch(problem, splits))
    elif strategy is Strategy.TMA:
        launches = [*staging_launches(problem), *tma_launches(problem, dot), *_slice_sum(problem)]
    elif strategy is Strategy.WARP_SPECIALIZED_TMA and problem.direction is BACKWARD_FILTER:
        partials = filter_split(problem).partials
        launches = [*activation_staging_launches(problem), filter_warp_specialized_launch(problem)]
        if partials:
            launches.append(_sum_launch(problem, partials))
    elif strategy is Strategy.WARP_SPECIALIZED_TMA:
        launches = [*staging_launches(problem), *warp_specialized_launches(problem), *_slice_sum(problem)]
    elif strategy is Strategy.GROUPED:
        tile = grouped_tile(problem)
        assert tile is not None  # what choose read
        launches = [grouped_launch(problem, dot, tile)]
        if problem.direction is BACKWARD_FILTER:  # reading channels-last copies of NCHW x and dy
            launches = [*activation_staging_launches(problem), *launches]
        else:
            launches = [*grouped_copy_launches(problem), *launches]
        if grouped_splits(problem) > 1:
            launches.append(_sum_launch(problem, grouped_splits(problem)))
    elif problem.direction is BACKWARD_FILTER:
        launches = _backward_filter(problem, dot, strategy)
    elif strategy is Strategy.EXPLICIT_GEMM and gathers_products(problem):
        launches = col2im_launches(problem, dot)
    else:
        launches = _forward_or_backward_data(problem, dot, strategy)
    return Plan(tuple(launches), tuple(regions), strategy in TMA_STRATEGIES)


def _slice_sum(problem: ConvolutionProblem) -> list[Launch]:
    """The launch that finishes a sliced forward of the TMA route (``reduction_slices``), or none."""
    return [slice_sum_launch(problem)] if reduction_slices(problem)[0] > 1 else []


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
    packed = packs_depthwise_filter(problem)
    w, w_desc = (Slot("w_packed"), depthwise_packed_filter(problem)) if packed else (Slot("w"), problem.w)
    rounded = rounded_filter(problem)
    if rounded is not None:
        w, w_desc = Slot("w_packed"), rounded
    w_sk, w_sc, *w_taps = strides5(w_desc)
    epilogue_args = (*strides5(problem.z), problem.bias.strides[1] if problem.bias is not None else 0)
    scalars = (problem.alpha, problem.beta, problem.alpha2, problem.activation_coef)
    flags = dict(FLIP=problem.flip, **epilogue_options(problem), COMPUTE=accumulator_type(problem))
    geometry_args = (*geo.pad, *geo.stride, *geo.dilation)
    pixels = geo.n * math.prod(out_size)
    channels = outputs * groups
    tensors = (a, w, out, Slot("bias"), Slot("z"), *strides5(a_desc))
    direct_args = (
        *tensors,
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
    run_tile = depthwise_run_tile(problem) if strategy is Strategy.DIRECT else None
    if run_tile is not None:  # channels-last depthwise: runs of output pixels along the rows
        runs, block_c, warps, run = run_tile
        runs_per_row = -(-out_size[-1] // run)
        all_runs = geo.n * math.prod(out_size[:-1]) * runs_per_row
        rows_args = (
            *tensors,
            w_sk,
            *w_taps,
            *strides5(out_desc),
            *epilogue_args,
            all_runs,
            runs_per_row,
            *out_size,
            *a_size,
            reduced,
            outputs,
            channels,
            *geo.filt[:2],
            *geo.pad,
            *geo.stride[:2],
            *geo.dilation[:2],
            *scalars,
        )
        run_grid = (triton.cdiv(all_runs, runs), triton.cdiv(channels, block_c))
        run_options = dict(
            BACKWARD=backward,
            WIDTH=geo.filt[2],
            STRIDE_W=geo.stride[2],
            DILATION_W=geo.dilation[2],
            PHASE=(geo.pad[2] - (geo.filt[2] - 1) * geo.dilation[2]) % geo.stride[2] if backward else 0,
            RUN=run,
            BLOCK_P=runs,
            BLOCK_C=block_c,
            num_warps=warps,
        )
        launch = Launch(depthwise.conv_depthwise_rows_kernel, run_grid, rows_args, dict(**run_options, **flags))
        return [copy_launch(w, w_desc, "w", problem.w, False), launch] if packed else [launch]
    depthwise_block = depthwise_tile(problem) if strategy is Strategy.DIRECT else None
    if depthwise_block is not None:  # one reduced channel a group, from DEPTHWISE_MIN_TAPS taps
        block_p, block_c, warps, unrolled_width = depthwise_block
        grid: tuple[int, ...] = (triton.cdiv(pixels, block_p), triton.cdiv(channels, block_c))
        options = dict(
            BACKWARD=backward, UNROLLED_WIDTH=unrolled_width, BLOCK_P=block_p, BLOCK_C=block_c, num_warps=warps
        )
        launch = Launch(depthwise.conv_depthwise_kernel, grid, direct_args, dict(**options, **flags))
        return [copy_launch(w, w_desc, "w", problem.w, False), launch] if packed else [launch]

    if strategy is Strategy.DIRECT:
        block_n = min(64, triton.next_power_of_2(channels))
        grid = (triton.cdiv(pixels, 64), triton.cdiv(channels, block_n))
        return [
            Launch(
                direct.conv_direct_kernel,
                grid,
                direct_args,
                dict(
                    UNROLLED=(reduced, *geo.filt) if geo.taps * reduced <= DIRECT_UNROLL_STEPS else None,
                    BACKWARD=backward,
                    BLOCK_M=64,
                    BLOCK_N=block_n,
                    num_warps=4,
                    **flags,
                ),
            )
        ]

    launches = []
    table = out
    source = "implicit"
    pixel_channels = 0
    if strategy is Strategy.PRECOMPUTED_GEMM and pads_channels(problem):  # taps computed: their lanes' loads vectorize
        launches.append(_pad_launch(problem, geo))
        if rounded is not None:
            launches.append(copy_launch(w, w_desc, "w", problem.w, True))
        a, a_desc, pixel_channels = Slot("x_staged"), padded_x(problem), PIXEL_CHANNELS
    elif strategy is Strategy.PRECOMPUTED_GEMM:
        launches.append(_table_launch(geo, strides5(problem.w)[2:], problem.flip))
        table, source = Slot("table"), "precomp"
    elif strategy is Strategy.EXPLICIT_GEMM:
        launches.append(_im2col_launch(a, a_desc, geo, a_size, out_size, reduced, backward))
        a, source = Slot("columns"), "im2col"

    backward_rows = backward and source != "im2col"
    if backward_rows:
        phases = geo.stride
        steps, units = stride_phases(geo)
    else:
        phases, steps, units = (1, 1, 1), (1, 1, 1), out_size
    rows = geo.n * math.prod(units)
    lanes = pixel_channels or reduced  # reduced channels a tap, as the reduction walks them
    tile = gemm_tile(problem, rows, outputs, lanes, geo.taps * lanes, groups * math.prod(phases))
    grid = (gemm.grid_tiles(rows, outputs, tile.block_m, tile.block_n), groups, math.prod(phases))
    w_s_red, w_s_out = (w_sk, w_sc) if backward else (w_sc, w_sk)
    w_group = (reduced if backward else outputs) * w_sk
    args = (
        a,
        w,
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
                PIXEL_CHANNELS=pixel_channels,
                EVEN_RED=lanes % tile.block_k == 0,
                DOT=dot,
                PRECISION=dot_precision(problem),
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


def _table_launch(geo: Geometry, w_tap_strides: tuple[int, ...], flip: bool) -> Launch:
    block = min(1024, triton.next_power_of_2(geo.taps))
    return Launch(
        gemm.tap_table_kernel,
        (triton.cdiv(geo.taps, block),),
        (Slot("table"), *geo.filt, *geo.dilation, *w_tap_strides),
        dict(FLIP=flip, BLOCK=block, num_warps=4),
    )


def _pad_launch(problem: ConvolutionProblem, geo: Geometry) -> Launch:
    """``pad_channels_kernel`` writing x's padded copy (``padded_x``) into the workspace, rounded to TF32
    for a TF32 product."""
    pixels = geo.n * math.prod(geo.x_size)
    block = 256
    return Launch(
        gemm.pad_channels_kernel,
        (triton.cdiv(pixels, block),),
        (Slot("x"), Slot("x_staged"), *strides5(problem.x), pixels, *geo.x_size, geo.c),
        dict(PIXEL_CHANNELS=PIXEL_CHANNELS, ROUND_TO_TF32=tf32(problem), BLOCK=block, num_warps=4),
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
    beside_x = (*strides5(problem.y), *strides5(problem.w), geo.output_pixels, *geo.y_size, *geo.x_size, geo.k, kg)
    tensor_args = (*strides5(problem.x), *beside_x)
    filter_args = (*geo.filt, *geo.pad, *geo.stride, *geo.dilation, plan.slice_pixels, problem.alpha, problem.beta)
    common = (*tensor_args, cg, *filter_args)
    flags = dict(
        FLIP=problem.flip, PARTIAL=plan.splits > 1, HAS_BETA=problem.beta != 0.0, COMPUTE=accumulator_type(problem)
    )
    tile = plan.tile
    launches = []
    if strategy is Strategy.DIRECT and plan.filter_rows:
        launches.append(_depthwise_rows_launch(problem, plan, partial, flags))
    elif strategy is Strategy.DIRECT and plan.block_taps:
        grid: tuple[int, ...] = (triton.cdiv(geo.k, tile.block_n), triton.cdiv(geo.taps, plan.block_taps), plan.splits)
        args = (Slot("x"), Slot("y"), Slot("w"), partial, *tensor_args, *filter_args)  # C/G is 1
        launches.append(
            Launch(
                direct.filter_depthwise_kernel,
                grid,
                args,
                dict(
                    BLOCK_TAPS=plan.block_taps,
                    BLOCK_M=tile.block_m,
                    BLOCK_N=tile.block_n,
                    num_warps=tile.num_warps,
                    **flags,
                ),
            )
        )
    elif strategy is Strategy.DIRECT:
        grid = (triton.cdiv(geo.k, tile.block_n), plan.splits)
        launches.append(
            Launch(
                direct.filter_direct_kernel,
                grid,
                (Slot("x"), Slot("y"), Slot("w"), partial, *common),
                dict(
                    UNROLLED=(cg, *geo.filt) if geo.taps * cg <= DIRECT_UNROLL_STEPS else None,
                    COLUMNS=triton.next_power_of_2(geo.taps * cg),
                    BLOCK_M=tile.block_m,
                    BLOCK_N=tile.block_n,
                    num_warps=tile.num_warps,
                    **flags,
                ),
            )
        )
    else:
        table, source, gathered, x_strides, pixel_channels = Slot("w"), "implicit", Slot("x"), strides5(problem.x), 0
        if strategy is Strategy.PRECOMPUTED_GEMM and pads_channels(problem):  # taps computed: loads vectorize
            launches.append(_pad_launch(problem, geo))
            gathered, x_strides, pixel_channels = Slot("x_staged"), strides5(padded_x(problem)), PIXEL_CHANNELS
        elif strategy is Strategy.PRECOMPUTED_GEMM:
            launches.append(_table_launch(geo, strides5(problem.w)[2:], False))
            table, source = Slot("table"), "precomp"
        elif strategy is Strategy.EXPLICIT_GEMM:
            launches.append(_im2col_launch(Slot("x"), problem.x, geo, geo.x_size, geo.y_size, cg, False))
            gathered, source = Slot("columns"), "im2col"
        lanes = pixel_channels or cg  # the columns a tap
        grid = (triton.cdiv(kg, tile.block_m) * triton.cdiv(lanes * geo.taps, tile.block_n), geo.groups, plan.splits)
        args = (gathered, Slot("y"), Slot("w"), partial, table, *x_strides, *beside_x, cg, *filter_args)
        launches.append(
            Launch(
                direct.filter_gemm_kernel,
                grid,
                args,
                dict(
                    SOURCE=source,
                    PIXEL_CHANNELS=pixel_channels,
                    EVEN_CG=lanes % tile.block_n == 0,
                    DOT=dot,
                    PRECISION=dot_precision(problem),
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


def _depthwise_rows_launch(problem: ConvolutionProblem, plan: FilterPlan, partial: Slot, flags: dict) -> Launch:
    """filter_depthwise_rows_kernel over (channel blocks, filter-row blocks, slices of output rows)."""
    geo = geometry(problem)
    tile, width = plan.tile, geo.filt[2]
    common = math.gcd(geo.stride[2], geo.dilation[2])
    filter_rows = geo.filt[0] * geo.filt[1]
    grid = (triton.cdiv(geo.k, tile.block_n), triton.cdiv(filter_rows, plan.filter_rows), plan.splits)
    args = (
        Slot("x"),
        Slot("y"),
        Slot("w"),
        partial,
        *strides5(problem.x),
        *strides5(problem.y),
        *strides5(problem.w),
        geo.n * geo.y_size[0] * geo.y_size[1],
        *geo.y_size,
        *geo.x_size,
        geo.k,
        geo.k // geo.groups,
        *geo.filt[:2],
        *geo.pad,
        *geo.stride,
        *geo.dilation,
        geo.dilation[2] // common,
        plan.slice_pixels // geo.y_size[2],
        problem.alpha,
        problem.beta,
    )
    shift = geo.stride[2] // common
    channels = tile.block_m * tile.block_n // (tile.num_warps * 32)  # a thread's channels
    ahead_bytes = width * (shift + 1) * channels * max(problem.x.dtype.itemsize, problem.y.dtype.itemsize)
    options = dict(
        WIDTH=width,
        SHIFT=shift,
        AHEAD=ahead_bytes <= DEPTHWISE_AHEAD_BYTES,
        FILTER_ROWS=plan.filter_rows,
        BLOCK_ROWS=tile.block_m,
        BLOCK_N=tile.block_n,
        num_warps=tile.num_warps,
    )
    return Launch(depthwise_filter.filter_depthwise_rows_kernel, grid, args, dict(**options, **flags))


def _sum_launch(problem: ConvolutionProblem, splits: int) -> Launch:
    """dw = alpha * (the sum of the slices' partials) + beta * dw."""
    geo = geometry(problem)
    cg = geo.c // geo.groups
    elements = geo.k * cg * geo.taps
    block, split_block = sum_blocks(elements, splits)
    grid = (triton.cdiv(elements, block),)
    args = (Slot("w"), Slot("partial"), *strides5(problem.w), geo.k, cg, *geo.filt, splits, problem.alpha, problem.beta)
    return Launch(
        direct.filter_sum_kernel,
        grid,
        args,
        dict(
            FLIP=problem.flip,
            HAS_BETA=problem.beta != 0.0,
            COMPUTE=accumulator_type(problem),
            BLOCK=block,
            SPLIT_BLOCK=split_block,
            num_warps=4,
        ),
    )


def _torch() -> Any:
    import torch

    return torch
