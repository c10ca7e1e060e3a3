"""The warp-specialized Gluon convolution engine (``convolution/gluon_hopper.py``) without a GPU: which
problems the planner gives it, and its kernel compiled for sm_90 on the CPU, its IR checked for the
engine's parts. Run as a script, it prints one JSON line per compiled variant (the test runs it in a
subprocess, with Triton's compiler instead of its interpreter). Its results on the H200 are checked
by tests/test_gpu_convolution.py.
"""

from __future__ import annotations

import json
import re

import pytest
import sm90

import opendnn as od
from opendnn.families.convolution import gluon_hopper
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionDirection, ConvolutionMode, convolution_problem
from opendnn.families.pointwise.problem import PointwiseMode

BF16, FP16, FP32 = od.DataType.BFLOAT16, od.DataType.HALF, od.DataType.FLOAT
FWD, DATA, FILTER = ConvolutionDirection
PRECOMP = od.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
S = kernels.Strategy
SHARED_MEMORY = 227 * 1024  # bytes a block may use on sm_90


def packed(dtype, dims, channels_last=True):
    """A descriptor of ``dims`` (N, C, H, W) packed channels-last (NHWC) or NCHW."""
    n, c, h, w = dims
    strides = (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)
    return od.TensorDescriptor(dtype, dims, strides)


def problem(
    direction=FWD,
    dtype=BF16,
    n=8,
    c=64,
    size=14,
    k=64,
    filt=3,
    stride=1,
    channels_last=True,
    allow_tf32=False,
    flip=False,
    beta=0.0,
    epilogue=None,
    algo=None,
):
    """A 2-D convolution problem, padding filt // 2; ``epilogue``: (activation, coefficient, bias, z,
    propagate NaN) of a forward; ``algo``: None for the direction's default."""
    out = (size + 2 * (filt // 2) - filt) // stride + 1
    x, w = packed(dtype, (n, c, size, size), channels_last), packed(dtype, (k, c, filt, filt), channels_last)
    y = packed(dtype, (n, k, out, out), channels_last)
    mode = ConvolutionMode.CONVOLUTION if flip else ConvolutionMode.CROSS_CORRELATION
    conv = od.ConvolutionDescriptor((filt // 2,) * 2, (stride,) * 2, (1, 1), mode)
    extra = {}
    if epilogue is not None:
        activation, coef, bias, z, propagate_nan = epilogue
        extra = dict(
            activation=activation,
            activation_coef=coef,
            bias_desc=od.TensorDescriptor(dtype, (1, k, 1, 1), (k, 1, 1, 1)) if bias else None,
            z_desc=y if z else None,
            alpha2=0.5 if z else 0.0,
            propagate_nan=propagate_nan,
        )
    return convolution_problem(
        direction, conv, x, w, y, algo=algo, allow_tf32=allow_tf32, alpha=0.75, beta=beta, **extra
    )


@pytest.mark.parametrize(
    "case, arguments, aligned, hopper, expected",
    [
        ("bfloat16 forward", dict(), True, True, S.WARP_SPECIALIZED_TMA),
        ("float16 backward data", dict(direction=DATA, dtype=FP16), True, True, S.WARP_SPECIALIZED_TMA),
        ("true convolution, 192 channels", dict(c=192, k=192, flip=True), True, True, S.WARP_SPECIALIZED_TMA),
        ("backward filter", dict(direction=FILTER), True, True, S.WARP_SPECIALIZED_TMA),
        ("TF32 forward", dict(dtype=FP32, allow_tf32=True), True, True, S.WARP_SPECIALIZED_TMA),
        (
            "TF32 backward data: the repacked filter",
            dict(direction=DATA, dtype=FP32, allow_tf32=True),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 NCHW backward data: dy staged channels-last",
            dict(direction=DATA, dtype=FP32, allow_tf32=True, channels_last=False),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 stride 2: x's phase view",
            dict(dtype=FP32, allow_tf32=True, stride=2),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 stride 2 backward data",
            dict(direction=DATA, dtype=FP32, allow_tf32=True, stride=2),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 backward filter: pixels reduced, K-major in the rasters",
            dict(direction=FILTER, dtype=FP32, allow_tf32=True),
            True,
            True,
            S.RASTER_FILTER,
        ),
        (
            "TF32 backward filter over 32 channels: the TMA route's",
            dict(direction=FILTER, dtype=FP32, allow_tf32=True, c=32, k=32),
            True,
            True,
            S.TMA,
        ),
        (
            "TF32 NCHW forward under IMPLICIT_GEMM: zero workspace, no copy",
            dict(dtype=FP32, allow_tf32=True, channels_last=False),
            True,
            True,
            S.IMPLICIT_GEMM,
        ),
        (
            "TF32 NCHW forward under IMPLICIT_PRECOMP_GEMM: x and the filter staged",
            dict(dtype=FP32, allow_tf32=True, channels_last=False, algo=PRECOMP),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 NCHW stride 2 forward under IMPLICIT_PRECOMP_GEMM: the copy's phase view",
            dict(dtype=FP32, allow_tf32=True, channels_last=False, stride=2, size=28, algo=PRECOMP),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        (
            "TF32 NCHW 1x1 forward under IMPLICIT_PRECOMP_GEMM: x's copy would be the columns",
            dict(dtype=FP32, allow_tf32=True, channels_last=False, filt=1, algo=PRECOMP),
            True,
            True,
            S.PRECOMPUTED_GEMM,
        ),
        (
            "bfloat16 NCHW forward under IMPLICIT_PRECOMP_GEMM: its staged copies",
            dict(channels_last=False, algo=PRECOMP),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        ("TF32 interpreted", dict(dtype=FP32, allow_tf32=True), True, False, S.TMA),
        ("float32 without TF32", dict(dtype=FP32), True, True, S.IMPLICIT_GEMM),
        ("float32 backward data without TF32", dict(direction=DATA, dtype=FP32), True, True, S.IMPLICIT_GEMM),
        ("not sm_90 (or interpreted)", dict(), True, False, S.TMA),
        ("unaligned pointers: no TMA", dict(), False, True, S.IMPLICIT_GEMM),
        ("NCHW: TMA cannot read pixel boxes", dict(channels_last=False), True, True, S.IMPLICIT_GEMM),
        ("stride 2: x's phase view", dict(stride=2), True, True, S.WARP_SPECIALIZED_TMA),
        ("1x1 stride 2: x's phase view", dict(filt=1, stride=2), True, True, S.WARP_SPECIALIZED_TMA),
        ("stride 2, odd height: no phase view", dict(size=15, stride=2), True, True, S.IMPLICIT_GEMM),
        (
            "stride 2 backward data: a launch per phase",
            dict(direction=DATA, stride=2),
            True,
            True,
            S.WARP_SPECIALIZED_TMA,
        ),
        ("odd dx: phases of 8 and 7 rows", dict(direction=DATA, size=15, stride=2), True, True, S.WARP_SPECIALIZED_TMA),
        ("1x1 stride 2 backward data", dict(direction=DATA, filt=1, stride=2), True, True, S.WARP_SPECIALIZED_TMA),
        ("40 channels along a strided row: no zeros past them", dict(c=40, stride=2), True, True, S.IMPLICIT_GEMM),
        ("1x1: a matrix product", dict(filt=1), True, True, S.MATRIX_PRODUCT),
    ],
)
def test_the_engine_takes_the_tma_route_on_sm90_the_tf32_backward_filter_the_rasters(
    case, arguments, aligned, hopper, expected
):
    assert kernels.choose(problem(**arguments), tma_aligned=aligned, hopper=hopper) is expected


def test_its_plan_is_one_persistent_launch_that_reads_by_tma():
    plan = kernels.launch_plan(problem(n=64, c=256, k=256), False, S.WARP_SPECIALIZED_TMA)
    (launch,) = plan.launches
    assert plan.tma and not plan.regions  # descriptors built on the device; zero workspace
    assert launch.kernel.__name__ == "conv_warp_specialized_kernel"
    assert launch.grid[0] == 112  # 112 boxes x 1 tile of 256 channels: a program per tile (132 SMs)
    assert (launch.options["IMAGES"] * launch.options["BLOCK_H"] * launch.options["BLOCK_W"]) == 128
    assert launch.options["BLOCK_W"] >= 8


@pytest.mark.parametrize("channels_last, staged", [(True, []), (False, ["y_staged"])])
def test_tf32_backward_data_on_the_engine_reads_the_rounded_copies_as_a_forward_over_dy(channels_last, staged):
    prob = problem(DATA, FP32, n=64, c=256, k=256, channels_last=channels_last, allow_tf32=True)
    plan = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA)
    *copies, engine = plan.launches
    assert [launch.kernel.__name__ for launch in copies] == ["staging_kernel"] * (len(staged) + 1)
    assert [copy.args[0].name for copy in copies] == [*staged, "w_packed"]
    assert engine.kernel.__name__ == "conv_warp_specialized_kernel"
    assert engine.args[:2] == (kernels.Slot(staged[0] if staged else "y"), kernels.Slot("w_packed"))
    assert not engine.options["BACKWARD"] and engine.options["BLOCK_K"] == 32  # 128-byte chunks of float32
    assert [region[0] for region in plan.regions] == [*staged, "w_packed"]


def test_tf32_nchw_strided_backward_data_on_the_engine_stages_each_row_phase_of_dx():
    """ResNet-50's 3x3 stride-2 layer, NCHW: a row phase's two launches write its rows of dx
    channels-last in the workspace, then a copy moves them into dx; the workspace holds one row
    phase's rows (28 of dx's 56), not dx."""
    prob = problem(DATA, FP32, n=64, c=128, size=56, k=128, stride=2, channels_last=False, allow_tf32=True)
    plan = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA)
    written = [launch.args[0 if launch.kernel.__name__ == "staging_kernel" else 2].name for launch in plan.launches]
    assert written == ["y_staged", "w_packed", "x_staged", "x_staged", "x", "x_staged", "x_staged", "x"]
    regions = {name: end - start for name, start, end, _ in plan.regions}
    assert regions["x_staged"] == 64 * 128 * 28 * 56 * 4


def test_tf32_nchw_forward_under_precomp_runs_the_engine_on_x_and_the_filter_staged():
    prob = problem(FWD, FP32, n=64, c=256, k=256, channels_last=False, allow_tf32=True, algo=PRECOMP)
    plan = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA)
    *copies, engine = plan.launches
    assert [copy.args[0].name for copy in copies] == ["x_staged", "w_packed"]
    assert {launch.kernel.__name__ for launch in copies} == {"staging_kernel"}
    assert engine.kernel.__name__ == "conv_warp_specialized_kernel"
    assert engine.args[:3] == (kernels.Slot("x_staged"), kernels.Slot("w_packed"), kernels.Slot("y"))
    bound = dict(zip(gluon_hopper.conv_warp_specialized_kernel.arg_names, engine.args))
    assert (bound["a_sh"], bound["a_sw"], bound["w_sk"]) == (14 * 256, 256, 9 * 256)  # NHWC copy, KRSC copy
    assert (bound["o_sc"], bound["o_sh"], bound["o_sw"]) == (14 * 14, 14, 1)  # y written NCHW
    assert [region[0] for region in plan.regions] == ["table", "x_staged", "w_packed"]


def test_strided_backward_data_is_one_launch_per_phase_of_dx_with_its_taps():
    plan = kernels.launch_plan(problem(DATA, n=64, c=128, size=56, k=128, stride=2), False, S.WARP_SPECIALIZED_TMA)
    assert [launch.kernel.__name__ for launch in plan.launches] == ["conv_warp_specialized_kernel"] * 4
    arguments = gluon_hopper.conv_warp_specialized_kernel.arg_names
    for launch, (taps_h, taps_w) in zip(plan.launches, [(1, 1), (1, 2), (2, 1), (2, 2)]):  # pad 1: phase 1 sums r 0, 2
        bound = dict(zip(arguments, launch.args))
        assert (bound["taps_h"], bound["taps_w"], bound["OH"], bound["OW"]) == (taps_h, taps_w, 28, 28)


@pytest.mark.parametrize(
    "size, channels, expected",
    [
        (56, 64, 64),  # no wider than the channels
        (28, 128, 128),
        (14, 256, 256),  # 112 boxes: one round of 256-wide tiles, two of 128-wide ones (ties: the widest)
        (7, 512, 128),  # under 33 boxes: one round of 128-wide tiles, and of 256-wide ones half the SMs idle
    ],
)
def test_the_channel_tile_finishes_resnet50_layers_soonest(size, channels, expected):
    (launch,) = gluon_hopper.warp_specialized_launches(problem(n=64, c=channels, size=size, k=channels))
    assert launch.options["BLOCK_N"] == expected


def test_a_batch_1_layer_slices_its_reduction_over_the_sms_and_sums_the_slices_after():
    """ResNet-50's 14 x 14 3x3 layer at batch 1: 2 boxes of pixels x 4 tiles of 64 channels, 36 steps
    each; under IMPLICIT_PRECOMP_GEMM 9 slices of 4 steps (partial sums in the workspace), a program
    per unit."""
    prob = problem(n=1, c=256, size=14, k=256, algo=PRECOMP)
    plan = kernels.launch_plan(prob, False, S.WARP_SPECIALIZED_TMA)
    engine, finish = plan.launches
    assert (engine.kernel.__name__, finish.kernel.fn.__name__) == ("conv_warp_specialized_kernel", "slice_sum_kernel")
    bound = dict(zip(gluon_hopper.conv_warp_specialized_kernel.arg_names, engine.args))
    assert bound["out_ptr"] == kernels.Slot("partial") and bound["slice_steps"] == 4
    assert bound["slice_elements"] == 14 * 14 * 256 and not engine.options["HAS_BETA"]
    assert engine.grid[0] == engine.options["PROGRAMS"] == 2 * 4 * 9
    assert [region[0] for region in plan.regions] == ["table", "partial"]
    assert kernels.preferred(prob) and not kernels.preferred(problem(n=1, c=256, size=14, k=256))


def test_the_ring_takes_the_stages_that_fit_beside_the_epilogue():
    assert [gluon_hopper.stages(width, 128) for width in (64, 128, 256)] == [8, 6, 4]
    assert [gluon_hopper.stages(width, 64) for width in (64, 128, 256)] == [8, 8, 8]


@pytest.mark.parametrize(
    "arguments, chunk, steps",
    [
        (dict(c=96), 64, 2),  # GoogLeNet's 3x3 over 96 channels: a whole chunk and half of one
        (dict(c=32), 32, 1),  # one chunk of 32 channels
        (dict(c=32, stride=2), 32, 1),  # a strided 3x3 over 32 channels: one whole chunk of 32
        (dict(direction=DATA, k=32), 32, 1),  # DenseNet's 3x3 to 32 channels, backward: dy's 32
        (dict(c=40, dtype=FP32, allow_tf32=True), 32, 2),  # float32: 32 channels a chunk
    ],
)
def test_reductions_of_fewer_or_not_whole_chunks_of_channels_take_the_engine(arguments, chunk, steps):
    prob = problem(**arguments)
    assert kernels.choose(prob, tma_aligned=True, hopper=True) is S.WARP_SPECIALIZED_TMA
    (launch,) = gluon_hopper.warp_specialized_launches(prob)[-1:]
    assert launch.options["BLOCK_K"] == chunk
    assert kernels.reduction_slices(prob)[1] == 9 * steps


def test_a_partial_chunk_along_a_strided_row_of_x_is_not_read_by_tma():
    """x's phase view packs a pixel's two column phases side by side: past 40 channels lie the next
    phase's, not zeros."""
    assert kernels.tma_blocks(problem(c=40, stride=2)) is None
    assert kernels.tma_blocks(problem(c=40)) is not None


def test_fewer_than_32_reduced_channels_stay_on_the_gemm_whose_steps_span_taps():
    assert kernels.tma_blocks(problem(c=16)) is None and kernels.tma_blocks(problem(direction=DATA, k=16)) is None


# ---- every epilogue variant compiled for sm_90 ----------------------------------------------------

# name: problem arguments (batch 8 except where the channel tile needs more)
TF32 = dict(dtype=FP32, allow_tf32=True)
NCHW_STAGED = dict(channels_last=False, algo=PRECOMP, **TF32)
VARIANTS = {
    "plain_64_channels": dict(n=8, size=56),
    "bias_relu_residual": dict(n=8, c=128, size=28, k=128, epilogue=(PointwiseMode.RELU_FWD, None, True, True, False)),
    "beta_float16_256": dict(n=64, dtype=FP16, c=256, k=256, beta=0.5),
    "clipped_relu_nan_flip": dict(
        n=8, c=192, size=7, k=160, flip=True, epilogue=(PointwiseMode.CLIPPED_RELU_FWD, 6.0, True, False, True)
    ),
    "backward_data": dict(direction=DATA, n=8, c=128, size=28, k=256, beta=0.25),
    "stride_2_3x3": dict(n=8, c=128, size=56, k=128, stride=2),  # ResNet-50's l2 3x3 stride 2
    "stride_2_1x1": dict(n=8, c=256, size=56, k=512, filt=1, stride=2),  # its first downsample
    # backward data of those two layers, the last phase of dx: taps r = 0, 2 per dim; none at 1x1
    "backward_data_stride_2_3x3": dict(direction=DATA, n=8, c=128, size=56, k=128, stride=2),
    "backward_data_stride_2_1x1": dict(direction=DATA, n=8, c=256, size=56, k=512, filt=1, stride=2),
    # float32 as TF32: 32-channel chunks, each tile width, the repacked filter, NCHW dy staged
    "tf32_64_channels": dict(n=8, size=56, **TF32),
    "tf32_bias_relu_residual_128": dict(
        n=64, c=128, size=28, k=128, epilogue=(PointwiseMode.RELU_FWD, None, True, True, False), **TF32
    ),
    "tf32_beta_256": dict(n=64, c=256, k=256, beta=0.5, **TF32),
    "tf32_backward_data": dict(direction=DATA, n=8, c=128, size=28, k=256, beta=0.25, **TF32),
    "tf32_backward_data_nchw": dict(direction=DATA, n=8, c=128, size=28, k=128, channels_last=False, **TF32),
    "tf32_stride_2_3x3": dict(n=8, c=128, size=56, k=128, stride=2, **TF32),
    "tf32_stride_2_1x1": dict(n=8, c=256, size=56, k=512, filt=1, stride=2, **TF32),
    "tf32_backward_data_stride_2_3x3": dict(direction=DATA, n=8, c=128, size=56, k=128, stride=2, **TF32),
    # an NCHW forward under IMPLICIT_PRECOMP_GEMM: the staged copies read, y stored NCHW
    "tf32_nchw_forward_staged_bias_relu_residual": dict(
        n=8, c=128, size=28, k=128, epilogue=(PointwiseMode.RELU_FWD, None, True, True, False), **NCHW_STAGED
    ),
    "tf32_nchw_forward_staged_stride_2_beta": dict(n=8, c=128, size=56, k=128, stride=2, beta=0.5, **NCHW_STAGED),
    # batch 1 under IMPLICIT_PRECOMP_GEMM: slices of the reduction, partial sums stored as they are
    "sliced_batch_1": dict(n=1, c=256, size=14, k=256, algo=PRECOMP),
    # reductions of fewer or not whole chunks of channels: 64-byte and 32-byte rows, a partial chunk
    "partial_chunk_96_channels": dict(c=96, size=28, k=128),
    "chunk_of_32_channels": dict(c=32, size=56, k=64),
    "backward_data_chunk_of_32_channels": dict(direction=DATA, c=128, size=28, k=32),
    "tf32_partial_chunk_40_channels": dict(c=40, size=28, k=64, **TF32),
    "tf32_sliced_batch_1_nchw": dict(n=1, c=256, size=14, k=256, **NCHW_STAGED),
}
TF32_VARIANTS = tuple(name for name in VARIANTS if name.startswith("tf32"))
CHECKED_FOR_SPILLS = (
    "plain_64_channels",
    "beta_float16_256",
    "stride_2_3x3",
    "backward_data_stride_2_3x3",
    *TF32_VARIANTS,
)


def variant_launch(name):
    """The launch of variant ``name`` (its last output phase) and tensors for its slots (one element
    each, of the slot's dtype: only their dtypes and alignments specialize it)."""
    import torch

    arguments = VARIANTS[name]
    launch = gluon_hopper.warp_specialized_launches(problem(**arguments))[-1]
    dtype = arguments.get("dtype", BF16).to_torch()
    slots = ("x", "w", "y", "bias", "z", "x_staged", "y_staged", "w_packed")  # and the staged copies TF32 reads
    return launch, {**{slot: torch.empty(8, dtype=dtype) for slot in slots}, "partial": torch.empty(8)}


def test_every_epilogue_variant_compiles_to_a_warp_specialized_wgmma_kernel_reading_a_from_shared_memory():
    completed = sm90.run_script(__file__, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        assert report["kernel"] == "conv_warp_specialized_kernel", name
        assert report["partitions"] == [4, 1], name  # beside the kernel's own 4 warps (the first consumer)
        assert report["warps"] == 12, name
        assert report["async_mma"] == 2 and report["synchronous_mma"] == 0, name  # one per consumer
        assert report["waits"] == [0, 0, 1, 1], name  # one group in flight per step, none after the last
        # A straight from the ring: a reshaped box, no operand loaded into registers
        assert report["a_from_registers"] == 0 and report["shared_loads"] == 0, name
        assert report["box_reshapes"] >= 2, name
        assert report["tma_loads"] == 2 and report["box_rank"] == 5, name  # a box of x's phase view
        assert (report["barrier_waits"], report["barrier_arrives"]) == (3, 4), name
        assert {240, 24} <= set(report["registers"]), name  # setmaxnreg: consumers 240, producer 24
        options = gluon_hopper.warp_specialized_launches(problem(**VARIANTS[name]))[-1].options
        chunk_bytes = options["BLOCK_K"] * (4 if name in TF32_VARIANTS else 2)
        ring = options["STAGES"] * (128 + options["BLOCK_N"]) * chunk_bytes  # 192 KB with 128-byte chunks
        assert ring < report["shared"] <= SHARED_MEMORY, name  # the ring and the epilogue's
        # wgmma.mma_async.sync.aligned.m64n<BLOCK_N>k<depth>.f32.<A>.<B>: TF32 operands 8 deep, 16-bit ones 16
        operands = {instruction.split(".", 1)[1] for instruction in report["mma_instructions"]}
        depths = {
            re.search(r"k(\d+)$", instruction.split(".", 1)[0]).group(1) for instruction in report["mma_instructions"]
        }
        if name in TF32_VARIANTS:
            assert (operands, depths) == ({"f32.tf32.tf32"}, {"8"}), name
        else:
            assert depths == {"16"} and not any("tf32" in kind for kind in operands), name
    for name in CHECKED_FOR_SPILLS:
        assert reports[name]["spilled"] == 0, name


def main() -> None:
    """Print, per variant, a JSON line: the kernel, its partitions' warps, total warps, asynchronous and
    synchronous wgmma ops, the pendings of each wgmma wait, wgmma ops whose A is a register tensor,
    shared memory loads into registers, reshapes of shared memory descriptors, TMA loads and the rank
    of the activations' box, the mbarrier waits and arrivals, the setmaxnreg register counts, the
    shared memory, the wgmma instructions of the PTX and (for CHECKED_FOR_SPILLS) ptxas's spilled bytes."""
    from opendnn.kernels.launch import Slot

    target, backend = sm90.target_or_exit()
    for name in VARIANTS:
        launch, tensors = variant_launch(name)
        args = tuple(tensors[a.name] if isinstance(a, Slot) else a for a in launch.args)
        specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
        compiled = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target)
        ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
        assert "cubin" in compiled.asm
        box_ranks = re.findall(r"ttng\.async_tma_copy_global_to_local .*?\[([^\]]*)\]", ttgir)
        report = dict(
            name=name,
            kernel=compiled.metadata.name,
            partitions=[int(w) for w in re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir)],
            warps=compiled.metadata.num_warps,
            async_mma=len(re.findall(r"ttng\.warp_group_dot .*isAsync = true", ttgir)),
            synchronous_mma=len(re.findall(r"ttng\.warp_group_dot (?!.*isAsync = true)", ttgir)),
            waits=sorted(int(p) for p in re.findall(r"ttng\.warp_group_dot_wait .*pendings = (\d+)", ttgir)),
            a_from_registers=len(re.findall(r"ttng\.warp_group_dot %\S+, .*: tensor<", ttgir)),
            shared_loads=len(re.findall(r"ttg\.local_load ", ttgir)),
            box_reshapes=len(re.findall(r"ttg\.memdesc_reshape ", ttgir)),
            tma_loads=len(re.findall(r"ttng\.async_tma_copy_global_to_local ", ttgir)),
            box_rank=max(len(coords.split(",")) for coords in box_ranks) if box_ranks else 0,
            barrier_waits=len(re.findall(r"ttng\.wait_barrier ", ttgir)),
            barrier_arrives=len(re.findall(r"ttng\.arrive_barrier ", ttgir)),
            registers=sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            shared=compiled.metadata.shared,
            mma_instructions=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+)", ptx))),
            spilled=sm90.ptxas_usage(ptx, 90)[1] if name in CHECKED_FOR_SPILLS else None,
        )
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
