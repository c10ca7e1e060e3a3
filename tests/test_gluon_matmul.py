"""The Gluon Hopper engine of the matrix product (families/matmul/gluon_hopper.py) without a GPU: which
products the planner gives it, and every epilogue variant compiled for the H200 (sm_90), specialized
as Triton's launcher specializes a call there, its IR read for what makes the engine: three warp
partitions (two consumer warpgroups and a 1-warp producer) with their register budgets, asynchronous
wgmma with one group in flight, the ring's mbarrier waits and arrivals, and a shared-memory ring within
sm_90's 227 KB. In a subprocess: triton must load without its interpreter (tests/sm90.py). The GPU runs
are in tests/test_gpu_matmul.py.
"""

from __future__ import annotations

import json
import re

import pytest
import sm90

import opendnn as od
from opendnn.families.matmul import triton_backend as triton_matmul
from opendnn.families.matmul.problem import matmul_problem
from opendnn.families.pointwise.problem import PointwiseMode

BF16, FP16, FP32, FP64 = od.DataType.BFLOAT16, od.DataType.HALF, od.DataType.FLOAT, od.DataType.DOUBLE
GLUON, TL_DOT = triton_matmul.Engine.GLUON_HOPPER, triton_matmul.Engine.TL_DOT
SHARED_MEMORY = 227 * 1024  # bytes a block may use on sm_90


def descriptor(dtype, dims, transposed=False, row_stride=None):
    """A descriptor of ``dims`` (batch dims first) stored packed, or with its last two dims stored
    swapped (``transposed``); ``row_stride``: the stride of the stored rows in place of the packed one."""
    *batch, rows, cols = dims
    stored_rows, stored_cols = (cols, rows) if transposed else (rows, cols)
    row = row_stride or stored_cols
    strides = [1, row] if transposed else [row, 1]
    size = row * stored_rows
    for dim in reversed(batch):
        strides.insert(0, size)
        size *= dim
    return od.TensorDescriptor(dtype, tuple(dims), tuple(strides))


def plan(problem, a, b, c, bias=None, residual=None, tma=True, interpreted=False, hopper=True, fast=False):
    return triton_matmul.launch_plan(problem, a, b, c, bias, residual, tma, interpreted, 132, fast, hopper)


@pytest.mark.parametrize(
    "case, dtype, batch, m, n, k, expected",
    [
        ("square", BF16, (), 4096, 4096, 4096, GLUON),
        ("half", FP16, (), 4224, 4096, 4096, GLUON),
        ("ragged K", BF16, (), 4096, 4096, 1000, GLUON),
        ("batched", BF16, (8,), 1024, 1024, 512, GLUON),  # 8 x 32 tiles of 128 x 256
        ("ragged N", BF16, (), 4096, 4224, 4096, TL_DOT),  # 256 x 128 tiles finish a round sooner
        ("too small", BF16, (), 128, 4096, 4096, TL_DOT),  # 16 tiles of 128 x 256 for 132 SMs
        ("float32", FP32, (), 4096, 4096, 4096, TL_DOT),
        ("float64", FP64, (), 4096, 4096, 4096, TL_DOT),
    ],
)
def test_the_gluon_engine_takes_16_bit_products_that_fill_the_gpu_with_its_tiles(case, dtype, batch, m, n, k, expected):
    a, b, c = (descriptor(dtype, (*batch, *dims)) for dims in ((m, k), (k, n), (m, n)))
    assert plan(matmul_problem(a, b, c), a, b, c).engine is expected


@pytest.mark.parametrize("a_transposed", [False, True])
@pytest.mark.parametrize("b_transposed", [False, True])
def test_the_gluon_engine_reads_either_order_of_a_and_b(a_transposed, b_transposed):
    a, b = descriptor(BF16, (4096, 2048), a_transposed), descriptor(BF16, (2048, 4096), b_transposed)
    c = descriptor(BF16, (4096, 4096))
    launch = plan(matmul_problem(a, b, c), a, b, c).launches[0][0]
    assert launch.kernel.__name__ == "gluon_matmul_kernel"
    assert (launch.options["A_TRANSPOSED"], launch.options["B_TRANSPOSED"]) == (a_transposed, b_transposed)
    names = launch.kernel.arg_names
    row_strides = launch.args[names.index("a_row_stride")], launch.args[names.index("b_row_stride")]
    assert row_strides == (4096 if a_transposed else 2048, 2048 if b_transposed else 4096)  # as stored


@pytest.mark.parametrize(
    "case, expected",
    [
        ("every condition met", GLUON),
        ("not sm_90", TL_DOT),
        ("interpreted", TL_DOT),
        ("unaligned base", TL_DOT),
        ("unaligned row stride", TL_DOT),
        ("batch of two strides", TL_DOT),
    ],
)
def test_the_gluon_engine_needs_a_compiled_sm90_kernel_and_operands_tma_reads(case, expected):
    a, b, c = (descriptor(BF16, dims) for dims in ((6, 512, 4096), (6, 4096, 4096), (6, 512, 4096)))  # 6 x 4 x 16 tiles
    if case == "unaligned row stride":  # 4100 x 2 bytes: TMA needs 16-byte aligned strides
        a = descriptor(BF16, (6, 512, 4096), row_stride=4100)
    if case == "batch of two strides":  # A's (2, 3) batch dims with a gap after every third matrix
        a = od.TensorDescriptor(BF16, (2, 3, 512, 4096), (4 * 512 * 4096, 512 * 4096, 4096, 1))
        b, c = descriptor(BF16, (2, 3, 4096, 4096)), descriptor(BF16, (2, 3, 512, 4096))
    hopper, interpreted, tma = case != "not sm_90", case == "interpreted", case != "unaligned base"
    got = plan(matmul_problem(a, b, c), a, b, c, hopper=hopper, interpreted=interpreted, tma=tma)
    kernel = "gluon_matmul_kernel" if expected is GLUON else "matmul_kernel"
    assert got.engine is expected and got.launches[0][0].kernel.__name__ == kernel


def test_the_plan_records_the_engine_of_each_launch():
    a, b, c = (descriptor(BF16, (4096, 4096)) for _ in range(3))
    problem = matmul_problem(a, b, c)
    for hopper, engine, kernel in ((True, GLUON, "gluon_matmul_kernel"), (False, TL_DOT, "matmul_kernel")):
        got = plan(problem, a, b, c, hopper=hopper)
        assert got.engine is engine and {launch.kernel.__name__ for launch, _ in got.launches} == {kernel}


# ---- every epilogue variant compiled for sm_90 ----------------------------------------------------

# name: (activation, A and B dtype, C dtype, bias axis, residual dtype, beta, A transposed, B transposed, batch)
VARIANTS = {
    "plain": (None, BF16, BF16, None, None, 0.0, False, False, ()),
    "linear_gelu": (PointwiseMode.GELU_FWD, BF16, BF16, "column", None, 0.0, False, True, ()),
    "relu_row_residual_beta": (PointwiseMode.RELU_FWD, FP16, FP16, "row", FP16, 0.5, True, False, ()),
    "silu_float32_out": (PointwiseMode.SWISH_FWD, BF16, FP32, "column", FP32, 0.0, False, False, ()),
    "gelu_tanh_float32_out": (PointwiseMode.GELU_APPROX_TANH_FWD, FP16, FP32, "row", None, 1.0, True, True, ()),
    "clipped_relu_batched": (PointwiseMode.CLIPPED_RELU_FWD, BF16, BF16, None, BF16, 0.0, False, False, (3,)),
    "elu": (PointwiseMode.ELU_FWD, FP16, FP16, "column", None, 0.0, False, True, ()),
    "sigmoid_float64_out": (PointwiseMode.SIGMOID_FWD, BF16, FP64, None, None, 0.5, False, False, ()),
    "tanh": (PointwiseMode.TANH_FWD, BF16, BF16, "row", None, 0.0, False, False, ()),
    "softplus_residual_beta": (PointwiseMode.SOFTPLUS_FWD, FP16, FP16, "column", FP16, 0.25, True, False, ()),
}
CHECKED_FOR_SPILLS = ("plain", "linear_gelu")


def variant_launch(name):
    """The launch the planner makes for variant ``name`` (M = N = 4096, K = 1000) and tensors for its
    slots (one element each, of the slot's dtype: only their dtypes and alignments specialize it)."""
    import torch

    activation, dtype, c_dtype, axis, r_dtype, beta, a_t, b_t, batch = VARIANTS[name]
    m = n = 4096
    k = 1000
    a, b = descriptor(dtype, (*batch, m, k), a_t), descriptor(dtype, (k, n), b_t)
    c = descriptor(c_dtype, (*batch, m, n))
    bias = None if axis is None else od.TensorDescriptor(c_dtype, (m if axis == "row" else n,), (1,))
    residual = None if r_dtype is None else descriptor(r_dtype, (*batch, m, n))
    problem = matmul_problem(
        a,
        b,
        c,
        alpha=0.75,
        beta=beta,
        bias_desc=bias,
        bias_axis=axis or "column",
        activation=activation,
        coef=6.0 if activation is PointwiseMode.CLIPPED_RELU_FWD else None,
        residual_desc=residual,
    )
    fast = c_dtype in (BF16, FP16) and activation is not None
    (launch, _), *_ = plan(problem, a, b, c, bias, residual, fast=fast).launches
    dtypes = {"a": a, "b": b, "c": c, "bias": bias or c, "residual": residual or c}  # absent: C's stand-in
    return launch, {slot: torch.empty(8, dtype=d.dtype.to_torch()) for slot, d in dtypes.items()}


def test_every_epilogue_variant_compiles_to_a_warp_specialized_wgmma_kernel():
    completed = sm90.run_script(__file__, timeout=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    reports = {report["name"]: report for report in map(json.loads, completed.stdout.splitlines())}
    assert set(reports) == set(VARIANTS)
    for name, report in reports.items():
        assert report["kernel"] == "gluon_matmul_kernel", name
        assert report["partitions"] == [4, 1], name  # beside the kernel's own 4 warps (the first consumer)
        assert report["warps"] == 12, name  # 4 + 4 + 1, padded to whole warpgroups
        assert report["async_mma"] == 2 and report["synchronous_mma"] == 0, name  # one per consumer
        assert report["waits"] == [0, 0, 1, 1], name  # one group in flight per k-step, none after the last
        assert report["wgmma_shapes"] == ["m64n256k16"], name
        # waits: the producer's on empty, each consumer's on ready; arrivals: each consumer's on empty, in
        # the mainloop and after it
        assert (report["barrier_waits"], report["barrier_arrives"]) == (3, 4), name
        assert {240, 24} <= set(report["registers"]), name  # setmaxnreg: consumers 240, producer 24
        assert 4 * 48 * 1024 < report["shared"] <= SHARED_MEMORY, name  # 4 stages of 48 KB and the epilogue's
    for name in CHECKED_FOR_SPILLS:
        assert reports[name]["spilled"] == 0, name


def main() -> None:
    """Print, per variant, a JSON line: the kernel, its partitions' warps, total warps, the number of
    asynchronous and synchronous wgmma ops, the pendings of each wgmma wait, the PTX wgmma shapes, the
    mbarrier waits and arrivals, the setmaxnreg register counts, the shared memory, and (for
    CHECKED_FOR_SPILLS) ptxas's spilled bytes."""

    from opendnn.kernels.launch import Slot

    target, backend = sm90.target_or_exit()
    for name in VARIANTS:
        launch, tensors = variant_launch(name)
        args = tuple(tensors[a.name] if isinstance(a, Slot) else a for a in launch.args)
        specialized = sm90.specialize(launch.kernel, args, launch.options, backend)
        compiled = sm90.compile_sm90(launch.kernel, *specialized[1:], specialized[0], target)
        ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
        assert "cubin" in compiled.asm
        spilled = None
        if name in CHECKED_FOR_SPILLS:
            _, spilled = sm90.ptxas_usage(ptx, 90)
        report = dict(
            name=name,
            kernel=compiled.metadata.name,
            partitions=[int(w) for w in re.findall(r"partition\d+\(.*\) num_warps\((\d+)\)", ttgir)],
            warps=compiled.metadata.num_warps,
            async_mma=len(re.findall(r"ttng\.warp_group_dot .*isAsync = true", ttgir)),
            synchronous_mma=len(re.findall(r"ttng\.warp_group_dot (?!.*isAsync = true)", ttgir)),
            waits=sorted(int(p) for p in re.findall(r"ttng\.warp_group_dot_wait .*pendings = (\d+)", ttgir)),
            wgmma_shapes=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
            barrier_waits=len(re.findall(r"ttng\.wait_barrier ", ttgir)),
            barrier_arrives=len(re.findall(r"ttng\.arrive_barrier ", ttgir)),
            registers=sorted({int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
            shared=compiled.metadata.shared,
            spilled=spilled,
        )
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
