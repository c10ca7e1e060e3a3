"""A convolution in the canonical 3-D form the kernels take (``Geometry``), the facts of a problem
the planner reads (accumulator and dot types, TF32, the column matrix of an explicit GEMM), and the
tiles and backward-filter slicing it picks (``gemm_tile``, ``filter_plan``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from opendnn.core.arrays import CPU
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.families.convolution.problem import (
    ConvolutionDirection,
    ConvolutionMethod,
    ConvolutionProblem,
    method_of,
)
from opendnn.kernels.device import programs_to_fill

FORWARD, BACKWARD_DATA, BACKWARD_FILTER = ConvolutionDirection
PROGRAMS_PER_SM = 2  # split-K slices aim for two programs per SM (264 on an H200)
DIRECT_MAX_REDUCED = 4  # IMPLICIT_GEMM takes the direct kernels up to this many reduced channels per group
DIRECT_MAX_OUTPUTS = 8  # ... and this many output channels per group
# channels a pixel of the padded copy of x that a forward or a 16-bit backward filter with fewer input
# channels reads (``pads_channels``): a tap's channels are one 8-byte (16-bit) or 16-byte (float32) load
PIXEL_CHANNELS = 4
DIRECT_UNROLL_STEPS = 9  # most taps x reduced channels the direct kernel unrolls (more: a runtime loop)
DIRECT_FILTER_COLUMNS = 32  # most taps x C/G the direct backward filter keeps in registers
# ... its (pixels, channels, warps) per tile, programs and fewest pixel tiles per slice, by whether dy's
# channels are contiguous. Measured on the H200 (docs/design/convolution.md): channels-last takes one
# warp per program (its pixel sums never leave the warp) and 4x the programs (latency hidden by
# residency): ResNet-like depthwise 3x3 118 -> 65 us; channels-first keeps 4 warps (one warp: 3x slower).
DIRECT_FILTER_TILES = {True: (16, 64, 1, 1056, 2), False: (64, 64, 4, 264, 8)}
# Depthwise backward filter (filter_depthwise_kernel): (pixels, most channels, taps, warps) per program,
# programs per SM and fewest pixel tiles per slice, by whether dy's channels are contiguous; from
# benchmarks/depthwise_sweep.py on the H200 (docs/design/convolution.md). A program's accumulator is
# taps x pixels x channels float32; channels-last reads 64-byte channel rows, channels-first along pixels.
# Channels-first keeps a tile within 192 registers (2.0x cuDNN); 32 x 32 x 8 was up to 15% faster at 252.
DEPTHWISE_FILTER_TILES = {True: (64, 32, 4, 4, 16, 4), False: (64, 16, 8, 4, 8, 4)}
# ... from this many taps, by the same key, for the filters DEPTHWISE_ROWS_TILES leaves. Channels-last: only
# where filter_direct_kernel cannot keep the taps in registers (DIRECT_FILTER_COLUMNS): on 5 x 5 layers it
# was faster (0.24-0.32 of cuDNN against 0.18-0.26). Channels-first: past the 3 x 3 filter (1.8-2.7x cuDNN
# on 5 x 5 and 7 x 7 layers).
DEPTHWISE_FILTER_MIN_TAPS = {True: DIRECT_FILTER_COLUMNS + 1, False: 10}
# Channels-last depthwise backward filter of these filter widths (filter_depthwise_rows_kernel, before the
# two above): (output rows in 16 bits, most channels, filter rows, warps) per program, programs per SM and
# fewest row blocks per slice, by the width: the best geometric mean per width of
# benchmarks/depthwise_sweep.py --channels-last-filter over its layers (one filter row a program beat the
# whole filter's rows on every width: fewer per-tap sums a thread, more programs); with the next group's
# loads in flight (below), 3 x 3 filters take 4 warps at 4 programs an SM (geometric mean 1.05 of cuDNN
# over five 3 x 3 layers in bfloat16, against 1.00 at 8 warps and 2).
DEPTHWISE_ROWS_TILES = {3: (32, 32, 1, 4, 4, 2), 5: (32, 32, 1, 4, 8, 2), 7: (32, 32, 1, 4, 8, 2)}
# ... whose walk issues a group's loads (WIDTH steps) before the previous group's FMAs, where those loads
# take at most this many bytes of registers a thread: the walk waits on its loads, and with the next
# group in flight it waits half as often (3 x 3 layers of 128-256 channels 0.45-0.52 -> 0.88-1.14 of
# cuDNN), but past 320 bytes (8 float32 channels a thread: 7 x 7 at 448, 5 x 5 at stride 2 at 480) the
# kernel spills (1.7-17x slower).
DEPTHWISE_AHEAD_BYTES = 320
# Depthwise forward and backward data (conv_depthwise_kernel): output pixels, most channels and warps per
# program, and whether the filter's width is unrolled, by whether the tensors' channels are contiguous
# and whether the filter is read packed tap-major from the workspace (packs_depthwise_filter); the
# geometric-mean best of benchmarks/depthwise_sweep.py over the 5 x 5 and 7 x 7 layers on the H200. An
# unrolled width puts a filter row's loads in flight at once; it pays where a tap's filter column is
# one vector load (channels-last, packed: 0.98 of cuDNN against 0.93 with the width a runtime loop) and
# costs where it is a load per channel (0.84 against 0.89 in place) or the tile's loads run along the
# pixels (channels-first, packed: 1.92 against 2.17).
DEPTHWISE_TILES = {
    (True, True): (64, 32, 4, True),
    (True, False): (128, 32, 4, False),
    (False, True): (256, 8, 4, False),
    (False, False): (256, 8, 4, False),
}
# Widest filter whose width DEPTHWISE_TILES unrolls (the widest measured; wider filters loop at run time).
DEPTHWISE_MAX_UNROLLED_WIDTH = 7
# ... from this many taps, by whether the channels are contiguous, where the filter is read in place.
# Channels-last problems the rows kernel leaves (backward data strided along the width, wider filters)
# keep conv_direct_kernel below 10 taps (MobileNetV2's 3 x 3 stride-2 backward data: 134 us against 139
# on this kernel); channels-first takes the depthwise kernel for every filter (3 x 3: 2.1x cuDNN
# forward, 2.9-3.8x backward data, against 0.92 and 1.45-1.47 on conv_direct_kernel). A packed filter
# takes it from 1 tap.
DEPTHWISE_MIN_TAPS = {True: 10, False: 1}
# Channels-last depthwise forward and backward data, filters up to
# DEPTHWISE_MAX_UNROLLED_WIDTH wide, the filter packed or in place, before the kernels above and below:
# conv_depthwise_rows_kernel's (runs, most channels, warps) per program. A run of output pixels along a
# row loads its window of input columns once a filter row, where conv_depthwise_kernel loads a column
# per tap. The longest run by the filter's width: 4 pixels up to 3 taps wide, 16 past that (a 3 x 3
# layer of 128 channels at 56 x 56: 48 us at runs of 4, 55 at 8, 50 at 14; ConvNeXt's 7 x 7: 87 us at
# 14, 109 at 8). The best geometric mean of the candidates over the depthwise layers of
# benchmarks/depthwise_sweep.py (docs/design/convolution.md).
DEPTHWISE_RUN_TILE = (32, 32, 4)
DEPTHWISE_LONGEST_RUN = ((3, 4), (DEPTHWISE_MAX_UNROLLED_WIDTH, 16))  # (widest filter, longest run)
# Forwards strided along the width: a run's window spans stride times the columns, and past 3 taps the
# longest run halves (EfficientNet's 5 x 5 stride-2 layer of 144 channels: 0.83 of cuDNN at runs of 14, 1.06
# at 7). 3 taps keep 4: runs of 7-8 gave 0.82-1.09 against 0.81-1.03 over three stride-2 layers.
DEPTHWISE_LONGEST_STRIDED_RUN = ((3, 4), (DEPTHWISE_MAX_UNROLLED_WIDTH, 8))
# Algorithms with a workspace under which conv_depthwise_kernel reads the filter packed tap-major there
# (packs_depthwise_filter); IMPLICIT_GEMM reads the caller's filter, with no workspace.
PACKED_FILTER_METHODS = (ConvolutionMethod.IMPLICIT_PRECOMP_GEMM, ConvolutionMethod.GEMM)
WIDE_TILE_PROGRAMS = 96  # fewest 256 x 128 tiles worth taking them (fewer: 128 x 128)
TABLE_BYTES_PER_TAP = 16  # four int32: shift d, h, w and the filter offset
MIN_SLICE_STEPS = 8  # reduction steps each backward-filter slice runs at least
ALIGN = 256  # bytes: the start of each workspace region
SUM_BLOCK = 128  # filter elements per program of the pass that sums the slices, at most
SUM_MIN_BLOCK = 32  # ... and at least (128 bytes of float32 partials)
SUM_TILE = 2048  # partials a program of it loads at a time (slices x elements)


def epilogue_options(problem: ConvolutionProblem) -> dict[str, Any]:
    """The constexprs of ``triton_gemm.epilogue`` (alpha, z, bias, activation, beta) a problem's kernels take."""
    return dict(
        HAS_BETA=problem.beta != 0.0,
        HAS_BIAS=problem.bias is not None,
        HAS_Z=problem.z is not None,
        ACTIVATION=problem.activation.value[:-4] if problem.activation else "",
        PROPAGATE_NAN=problem.propagate_nan,
    )


def sum_blocks(elements: int, slices: int) -> tuple[int, int]:
    """(elements, slices) a program of a pass summing ``slices`` partials of ``elements`` each loads at a
    time: blocks narrow enough that every SM sums (a one-tile GEMM's slices are many, its elements few),
    and as many slices as SUM_TILE partials allow, their loads in flight together."""
    elements_per_sm = max(1, elements // programs_to_fill(1))
    block = min(SUM_BLOCK, max(SUM_MIN_BLOCK, 1 << (elements_per_sm.bit_length() - 1)))
    return block, min(SUM_TILE // block, triton.next_power_of_2(slices))


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


def stride_phases(geo: Geometry) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A backward data walked by the stride's phases of dx (pixels u * stride + phase): per dim, the
    step between the taps of a phase (``triton_gemm.tap_progression``) and dx's pixels a phase."""
    steps = tuple(s // math.gcd(s, d) for s, d in zip(geo.stride, geo.dilation))
    units = tuple(-(-x // s) for x, s in zip(geo.x_size, geo.stride))
    return steps, units  # type: ignore[return-value]


def three(values: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return tuple((fill,) * (3 - len(values)) + tuple(values))  # type: ignore[return-value]


def geometry(problem: ConvolutionProblem) -> Geometry:
    x, w, y = problem.x.dims, problem.w.dims, problem.y.dims
    return Geometry(
        x[0],
        x[1],
        w[0],
        problem.groups,
        three(x[2:], 1),
        three(y[2:], 1),
        three(w[2:], 1),
        three(problem.pre_padding, 0),
        three(problem.stride, 1),
        three(problem.dilation, 1),
    )


def strides5(desc: TensorDescriptor | None) -> tuple[int, ...]:
    """(n, c, d, h, w) strides of a descriptor in canonical form (0 for an added dim)."""
    if desc is None:
        return (0,) * 5
    return (*desc.strides[:2], *three(desc.strides[2:], 0))


def uses_direct(problem: ConvolutionProblem, reduced: int, outputs: int) -> bool:
    """Whether a problem of ``reduced`` and ``outputs`` channels per group takes the direct kernels:
    under DIRECT always; with few channels per group under IMPLICIT_GEMM, and under the algorithms of
    PACKED_FILTER_METHODS where conv_depthwise_kernel reads the filter packed
    (``packs_depthwise_filter``)."""
    method = method_of(problem.algo)
    if method is ConvolutionMethod.DIRECT:
        return True
    few = reduced <= DIRECT_MAX_REDUCED and outputs <= DIRECT_MAX_OUTPUTS
    if method in PACKED_FILTER_METHODS:
        return few and packed_filter_layout(problem)
    return few and method is ConvolutionMethod.IMPLICIT_GEMM


def over_image_channels(problem: ConvolutionProblem) -> bool:
    """Whether ``problem`` is ungrouped over fewer than PIXEL_CHANNELS input channels: an image's
    first layer (RGB, gray), whose channels fill neither a 16-byte row nor an MMA's columns."""
    return problem.groups == 1 and problem.x.dims[1] < PIXEL_CHANNELS


def pads_channels(problem: ConvolutionProblem) -> bool:
    """Whether ``problem`` reads a copy of x padded to PIXEL_CHANNELS channels a pixel
    (``padded_x``): an ungrouped IMPLICIT_PRECOMP_GEMM forward in 16 bits or float32, or backward
    filter in 16 bits, with fewer input channels (an image's first layer: RGB, gray), which the
    direct kernels do not take and TMA cannot (a pixel of fewer than 4 channels is no 16-byte row).
    Gathered where it lies, each of its taps' channels is a scalar load with bounds of its own:
    conv1's forward (3 channels, 7 x 7 taps) issues an instruction every 3.45 cycles a warp and moves
    118 GB/s. A float32 backward filter keeps the gather in place: its TF32 operands reduce over
    pixels, which wgmma needs contiguous in shared memory, so the copy's vectors land there 4 bytes at
    a time, transposed, and the copy only adds its traffic (conv1 on the H200: 688 -> 942 us NHWC,
    551 -> 597 NCHW). So does a 1 x 1 filter: each pixel of x is read once, as the copy would read it."""
    forward = problem.direction is FORWARD
    return (
        (forward or problem.direction is BACKWARD_FILTER and problem.x.dtype.itemsize == 2)
        and method_of(problem.algo) is ConvolutionMethod.IMPLICIT_PRECOMP_GEMM
        and over_image_channels(problem)
        and math.prod(problem.w.dims[2:]) > 1
        and problem.x.dtype in (DataType.BFLOAT16, DataType.HALF, DataType.FLOAT)
        and not (forward and uses_direct(problem, *channels_per_group(problem)))
    )


def channels_last(desc: TensorDescriptor, dtype: DataType | None = None) -> TensorDescriptor:
    """``desc``'s dims packed channels-last (N, the spatial dims, C; a filter's K, R, S, C), of its
    type or ``dtype``: the layout of the workspace's copies."""
    return TensorDescriptor(dtype or desc.dtype, desc.dims, strides_for_order(desc.dims, (0, *range(2, desc.ndim), 1)))


def padded_x(problem: ConvolutionProblem) -> TensorDescriptor:
    """The channels-last copy of x with PIXEL_CHANNELS channels a pixel (``pads_channels``)."""
    n, _, *spatial = problem.x.dims
    return channels_last(TensorDescriptor(problem.x.dtype, (n, PIXEL_CHANNELS, *spatial)))


def rounded_filter(problem: ConvolutionProblem) -> TensorDescriptor | None:
    """The filter's copy (KCRS, packed) that a TF32 forward over the padded copy reads, both copies
    rounded to TF32 to nearest as the TMA route's staged operands are (the tensor cores truncate what
    they read in place); None for other problems."""
    if not (pads_channels(problem) and tf32(problem)):
        return None
    w = problem.w
    return TensorDescriptor(w.dtype, w.dims, strides_for_order(w.dims, tuple(range(w.ndim))))


def channels_per_group(problem: ConvolutionProblem) -> tuple[int, int]:
    """(reduced, output) channels per group of a forward or backward data."""
    geo = geometry(problem)
    reduced, outputs = (geo.k, geo.c) if problem.direction is BACKWARD_DATA else (geo.c, geo.k)
    return reduced // geo.groups, outputs // geo.groups


def depthwise_channels_last(problem: ConvolutionProblem) -> bool | None:
    """Whether a depthwise (one reduced channel a group) forward or backward data reads channels-last
    activations; None for other problems."""
    geo = geometry(problem)
    if problem.direction is BACKWARD_FILTER or geo.c != geo.groups:
        return None
    return (problem.y if problem.direction is BACKWARD_DATA else problem.x).strides[1] == 1


def packed_filter_layout(problem: ConvolutionProblem) -> bool:
    """Whether ``problem`` is a depthwise one in a layout measured faster with its filter packed:
    channels-first (float32: 1.8-3.0x cuDNN against 1.5-2.4x in place) and channels-last in 16 bits
    (bfloat16: 0.66-1.74 against 0.62-1.52). Channels-last float32 keeps the caller's filter and its
    routes: its 3 x 3 layer ran 0.58 forward and 0.62 backward data packed, against 0.75 and 0.84 on
    conv_direct_kernel."""
    channels_last = depthwise_channels_last(problem)
    return channels_last is not None and (not channels_last or problem.x.dtype.itemsize == 2)


def packs_depthwise_filter(problem: ConvolutionProblem) -> bool:
    """Whether conv_depthwise_kernel reads the filter packed tap-major in the workspace
    (``depthwise_packed_filter``): a depthwise problem of a ``packed_filter_layout`` with few channels
    per group (as IMPLICIT_GEMM's direct kernels) under an algorithm of PACKED_FILTER_METHODS."""
    packed_method = method_of(problem.algo) in PACKED_FILTER_METHODS
    return packed_method and uses_direct(problem, *channels_per_group(problem))


def depthwise_packed_filter(problem: ConvolutionProblem) -> TensorDescriptor:
    """The depthwise filter's copy in the workspace: [taps, K], so that a tap's filter column, the
    same for every pixel of a program, is contiguous (one vector load a thread, where the caller's
    KRSC or KCRS filter puts a tap's values a filter apart: one load a channel)."""
    w = problem.w
    return TensorDescriptor(w.dtype, w.dims, strides_for_order(w.dims, (*range(2, w.ndim), 1, 0)))


def accumulator_type(problem: ConvolutionProblem) -> Any:
    return tl.float64 if problem.compute_type is DataType.DOUBLE or problem.x.dtype is DataType.DOUBLE else tl.float32


def dot_type(problem: ConvolutionProblem, device: str) -> Any:
    """The operand type of tl.dot: the data's, float64 for float64 products, and float32 for
    bfloat16 under the interpreter (Triton 3.6's interpreted tl.dot multiplies bfloat16 bit patterns)."""
    if accumulator_type(problem) == tl.float64:
        return tl.float64
    if problem.x.dtype is DataType.BFLOAT16 and device == CPU:
        return tl.float32
    return {DataType.FLOAT: tl.float32, DataType.HALF: tl.float16, DataType.BFLOAT16: tl.bfloat16}[problem.x.dtype]


def dot_precision(problem: ConvolutionProblem) -> str:
    return "tf32" if problem.x.dtype is DataType.FLOAT and problem.allow_tf32 else "ieee"


def itemsize_of(problem: ConvolutionProblem) -> int:
    return problem.x.dtype.itemsize


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


# ---- tiles ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def reads_pixels_along(problem: ConvolutionProblem) -> bool:
    """Whether ``problem`` is a TF32 forward or backward data whose A operand (x, or dy) the GEMM reads
    where it lies with its pixels, not its channels, contiguous (NCHW): wgmma takes TF32 operands only
    with the reduced channels contiguous."""
    a = {FORWARD: problem.x, BACKWARD_DATA: problem.y}.get(problem.direction)
    return (
        a is not None
        and tf32(problem)
        and a.strides[1] != 1
        and math.prod(a.dims[2:]) > 1
        and not pads_channels(problem)
    )


def reduces_strided_pixels(problem: ConvolutionProblem) -> bool:
    """Whether ``problem`` is a TF32 backward filter over channels-last x and dy: its GEMM reduces over
    pixels, which lie strided in both operands, so wgmma takes neither from shared memory as it lies.
    ``filter_gemm_kernel`` runs it on 2-warp tiles, whose mma.sync takes operands from registers in
    any order: ResNet-50's NHWC 1x1 layers at 56 x 56 (batch 64, H200) 54 -> 44 us and 121 -> 105 us
    against the TMA route's kernel, which turns its B operand through registers for wgmma; 3x3
    layers keep the raster route (1.9-2.9x faster than either)."""
    channels_last = problem.x.strides[1] == 1 and problem.y.strides[1] == 1
    return problem.direction is BACKWARD_FILTER and tf32(problem) and channels_last


def reduction_chunk(problem: ConvolutionProblem) -> int:
    """A GEMM tile's reduction chunk where nothing shortens it: 128 bytes of 16-bit operands, 32 float32 ones."""
    return 64 if problem.x.dtype.itemsize == 2 else 32


def gemm_tile(problem: ConvolutionProblem, rows: int, columns: int, reduced: int, depth: int, gemms: int) -> Tile:
    """The tile of ``gemms`` GEMMs (groups x phases) of ``rows`` x ``columns`` reducing over
    ``depth`` = taps x ``reduced`` channels. Measured on the H200 (ResNet-50, NHWC bf16): 256 x 128 x 64 with 8 warps
    and 3 stages wherever it still makes ~100 programs, 128 x 128 below that, 128 x 64 x 64 with 4
    warps and 3 stages for 64 output channels, 256 x 64 x 32 for lanes straddling taps (conv1). A TF32
    one-tap GEMM reading A along its pixels (NCHW; ``reads_pixels_along``) has an operand wgmma cannot
    take from shared memory as it lies: a forward of more than 64 output channels takes 128 rows and
    up to 256 columns, 8 warps (fewer, wider rows of output channels a tile read x fewer times), the
    others 64 rows and up to 128 columns on 2 warps, which run mma.sync from registers; a backward
    data's filter, read as [K, C], is not K-major either (ResNet-50's 1x1 layers, batch 64: forwards
    64 -> 256 at 56 x 56 130 -> 115 us, 1024 -> 256 at 14 x 14 61 -> 44 us, 64 -> 64 45 -> 40 us;
    backward data 62 -> 40, 143 -> 92, 110 -> 76-83 us)."""
    if accumulator_type(problem) == tl.float64:
        return Tile(64, 32, 16, 4, 2)
    block_k = reduction_chunk(problem)
    if reduced % block_k:  # lanes of a chunk straddle taps: shallower chunks waste less
        block_k = 16 if reduced % 32 and reduced % 16 == 0 else 32
        if block_k == 32 and reduced % 32:
            return Tile(256, max(16, min(64, triton.next_power_of_2(columns))), 32, 8, 3)
    stages = 2 if depth <= block_k else 3  # a single chunk (1x1, 64 channels): less shared memory
    if depth == reduced and reads_pixels_along(problem):
        if columns >= 128 and problem.direction is FORWARD:
            return Tile(128, min(256, triton.next_power_of_2(columns)), block_k, 8, stages)
        return Tile(64, max(16, min(128, triton.next_power_of_2(columns))), block_k, 2, 3)
    if columns >= 128:
        if triton.cdiv(rows, 256) * triton.cdiv(columns, 128) * gemms >= WIDE_TILE_PROGRAMS:
            return Tile(256, 128, block_k, 8, stages)
        return Tile(128, 128, block_k, 8, stages)
    return Tile(128, max(16, triton.next_power_of_2(columns)), block_k, 4, stages)


def depthwise_tile(problem: ConvolutionProblem) -> tuple[int, int, int, int | None] | None:
    """(pixels, channels, warps, unrolled width or None) of conv_depthwise_kernel's program for a
    depthwise (one reduced channel a group) forward or backward data: with its filter packed
    (``packs_depthwise_filter``), else from DEPTHWISE_MIN_TAPS taps; None for other problems."""
    channels_last = depthwise_channels_last(problem)
    if channels_last is None:
        return None
    geo = geometry(problem)
    packed = packs_depthwise_filter(problem)
    if not packed and geo.taps < DEPTHWISE_MIN_TAPS[channels_last]:
        return None
    pixels, most_channels, warps, unrolled = DEPTHWISE_TILES[channels_last, packed]
    channels = geo.c if problem.direction is BACKWARD_DATA else geo.k
    width = geo.filt[2] if unrolled and geo.filt[2] <= DEPTHWISE_MAX_UNROLLED_WIDTH else None
    return pixels, min(most_channels, triton.next_power_of_2(channels)), warps, width


def depthwise_run_tile(problem: ConvolutionProblem) -> tuple[int, int, int, int] | None:
    """(runs, channels, warps, run length) of conv_depthwise_rows_kernel's program for a channels-last
    depthwise problem the direct kernels take, where the rows kernel applies (DEPTHWISE_RUN_TILE); None
    elsewhere. A row's runs are as long as DEPTHWISE_LONGEST_RUN (DEPTHWISE_LONGEST_STRIDED_RUN for a
    forward strided along the width) allows and equal within one pixel,
    the last one shortest (runs of at most 16: 56 pixels in 4 runs of 14; at most 4: 7 in 2 of 4); a
    strided backward's run is a multiple of the stride (its outputs then take the same taps run after run)."""
    if not depthwise_channels_last(problem):
        return None
    geo = geometry(problem)
    if geo.filt[-1] > DEPTHWISE_MAX_UNROLLED_WIDTH:
        return None
    runs, most_channels, warps = DEPTHWISE_RUN_TILE
    backward = problem.direction is BACKWARD_DATA
    table = DEPTHWISE_LONGEST_STRIDED_RUN if geo.stride[-1] > 1 and not backward else DEPTHWISE_LONGEST_RUN
    longest = next(run for widest, run in table if geo.filt[-1] <= widest)
    width = (geo.x_size if backward else geo.y_size)[-1]
    run = -(-width // -(-width // longest))
    step = geo.stride[-1] if backward else 1  # a backward run starts at a multiple of the stride
    channels = geo.c if backward else geo.k
    return runs, min(most_channels, triton.next_power_of_2(channels)), warps, -(-run // step) * step


# ---- workspace -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterPlan:
    """Backward filter's tile and pixel slices; ``direct``: a direct kernel, ``block_taps``: taps a
    program of filter_depthwise_kernel takes, ``filter_rows``: filter rows a program of
    filter_depthwise_rows_kernel takes, whose tile counts output rows (0: another kernel)."""

    tile: Tile
    splits: int
    slice_pixels: int
    direct: bool
    block_taps: int = 0
    filter_rows: int = 0


def filter_plan(problem: ConvolutionProblem) -> FilterPlan:
    """Backward filter's tile and pixel slices: enough programs to fill the GPU, each slice at
    least MIN_SLICE_STEPS tiles of pixels."""
    geo = geometry(problem)
    kg, cg = geo.k // geo.groups, geo.c // geo.groups
    pixels = geo.output_pixels
    direct = uses_direct(problem, kg, cg) and method_of(problem.algo) is ConvolutionMethod.IMPLICIT_GEMM
    block_taps = filter_rows = 0
    channels_last = problem.y.strides[1] == 1
    float32_sums = accumulator_type(problem) == tl.float32
    if direct and cg == 1 and channels_last and float32_sums and geo.filt[2] in DEPTHWISE_ROWS_TILES:
        block_rows, block_n, filter_rows, warps, per_sm, min_steps = DEPTHWISE_ROWS_TILES[geo.filt[2]]
        block_n = next((b for b in (block_n, block_n // 2) if geo.k % b == 0), block_n)  # no idle channels
        block_n = min(block_n, triton.next_power_of_2(geo.k))
        # as many sums a thread, 16 bytes of channels (the tiles' 8 in 16 bits, 4 in float32)
        block_rows = block_rows * DEPTHWISE_ROWS_TILES[geo.filt[2]][1] // block_n * 2 // itemsize_of(problem)
        tile = Tile(block_rows, block_n, 0, warps, 1)
        filter_rows = min(filter_rows, geo.filt[0] * geo.filt[1])
        target = programs_to_fill(per_sm)
        programs = triton.cdiv(geo.k, block_n) * triton.cdiv(geo.filt[0] * geo.filt[1], filter_rows)
        step = block_rows * geo.y_size[2]  # whole output rows
        direct_kernel = True
    elif direct and cg == 1 and geo.taps >= DEPTHWISE_FILTER_MIN_TAPS[channels_last]:
        block_m, block_n, block_taps, warps, per_sm, min_steps = DEPTHWISE_FILTER_TILES[channels_last]
        block_n = next((b for b in (block_n, block_n // 2) if geo.k % b == 0), block_n)  # no idle channels
        tile = Tile(block_m, min(block_n, triton.next_power_of_2(geo.k)), 0, warps, 1)
        block_taps = min(block_taps, triton.next_power_of_2(geo.taps))
        target = programs_to_fill(per_sm)
        programs = triton.cdiv(geo.k, tile.block_n) * triton.cdiv(geo.taps, block_taps)
        step = tile.block_m
        direct_kernel = True
    elif direct and geo.taps * cg <= DIRECT_FILTER_COLUMNS:
        block_m, block_n, warps, target, min_steps = DIRECT_FILTER_TILES[problem.y.strides[1] == 1]
        tile = Tile(block_m, min(block_n, triton.next_power_of_2(geo.k)), 0, warps, 1)
        programs = triton.cdiv(geo.k, tile.block_n)
        step = tile.block_m
        direct_kernel = True
    else:
        lanes = PIXEL_CHANNELS if pads_channels(problem) else cg  # the columns a tap, as the GEMM walks them
        target = programs_to_fill(PROGRAMS_PER_SM)
        tile = gemm_tile(problem, kg, lanes * geo.taps, lanes, pixels, geo.groups * target)
        block_m = max(16, min(tile.block_m, triton.next_power_of_2(kg)))
        block_n = next((b for b in (128, 64, 32, 16) if lanes % b == 0), tile.block_n)  # one tap per tile
        block_n = min(block_n, tile.block_n)
        # the reduction runs over pixels: its chunk is the dtype's, not one shortened for a forward's lanes
        # straddling taps (conv1's 3 channels, bf16 on the H200: 557 -> 339 us at 64 pixels a chunk against 32)
        block_k = tile.block_k if accumulator_type(problem) == tl.float64 else reduction_chunk(problem)
        tile = Tile(block_m, block_n, block_k, 8 if block_m * block_n >= 128 * 128 else 4, tile.num_stages)
        if lanes % 16 == 0 and reduces_strided_pixels(problem):  # mma.sync's tile
            tile = Tile(min(128, block_m), min(64, block_n), block_k, 2, 3)
            target = programs_to_fill(2 * PROGRAMS_PER_SM)  # 2-warp programs: twice as many hold as many warps
        programs = triton.cdiv(kg, tile.block_m) * triton.cdiv(lanes * geo.taps, tile.block_n) * geo.groups
        step, min_steps = tile.block_k, MIN_SLICE_STEPS
        direct_kernel = False
    splits = max(1, min(triton.cdiv(target, programs), pixels // (step * min_steps)))
    slice_pixels = triton.cdiv(triton.cdiv(pixels, splits), step) * step
    return FilterPlan(tile, triton.cdiv(pixels, slice_pixels), slice_pixels, direct_kernel, block_taps, filter_rows)


def im2col_elements(problem: ConvolutionProblem) -> int:
    """Elements of the column matrix an explicit GEMM convolution materialises."""
    geo = geometry(problem)
    if problem.direction is BACKWARD_DATA:
        return geo.input_pixels * geo.taps * geo.k
    return geo.output_pixels * geo.taps * geo.c


def tf32(problem: ConvolutionProblem) -> bool:
    return problem.x.dtype is DataType.FLOAT and problem.allow_tf32 and accumulator_type(problem) == tl.float32


def on_tensor_cores(problem: ConvolutionProblem) -> bool:
    """16-bit operands, or float32 ones as TF32: the types of the TMA route's products."""
    return problem.x.dtype.itemsize == 2 or tf32(problem)
