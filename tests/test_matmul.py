"""matmul: the float64 reference against torch, the fp8 bit tables against torch's casts, the
shape and dtype rules' messages, batch dims no stride merges, and the Pythonic API (matmul,
linear) on both backends (Triton through its interpreter)."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.matmul.api import MatmulEpilogue, matmul
from opendnn.families.matmul.problem import BiasAxis, float_to_fp8, fp8_to_float64, matmul_problem, reference
from opendnn.families.pointwise.problem import PointwiseMode

BACKENDS = ["numpy", "triton"]
FP8 = [(od.DataType.FP8_E4M3, torch.float8_e4m3fn), (od.DataType.FP8_E5M2, torch.float8_e5m2)]


def desc(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def relative_error(actual, expected):
    actual, expected = torch.as_tensor(actual).double(), torch.as_tensor(expected).double()
    return ((actual - expected).norm() / expected.norm()).item()


def test_reference_matches_torch_with_broadcast_batch_and_every_epilogue_part():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 1, 5, 7, generator=gen, dtype=torch.float64)
    b = torch.randn(4, 7, 6, generator=gen, dtype=torch.float64)
    bias_row, bias_col = (
        torch.randn(5, generator=gen, dtype=torch.float64),
        torch.randn(6, generator=gen, dtype=torch.float64),
    )
    residual = torch.randn(3, 4, 5, 6, generator=gen, dtype=torch.float64)
    product = 0.75 * torch.matmul(a, b)
    got = reference(
        a.numpy(),
        b.numpy(),
        bias=bias_col.numpy(),
        activation=PointwiseMode.GELU_FWD,
        residual=residual.numpy(),
        scale=0.75,
    )
    np.testing.assert_allclose(got, (TF.gelu(product + bias_col) + residual).numpy(), rtol=1e-12, atol=1e-12)
    got = reference(
        a.numpy(),
        b.numpy(),
        bias=bias_row.numpy(),
        bias_axis=BiasAxis.ROW,
        activation=PointwiseMode.SWISH_FWD,
        coef=1.0,
        scale=0.75,
    )
    np.testing.assert_allclose(got, TF.silu(product + bias_row[:, None]).numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, torch_dtype", FP8, ids=["e4m3", "e5m2"])
def test_fp8_tables_match_torch_decode_and_round_to_nearest_even(dtype, torch_dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    expected = codes.view(torch_dtype).double().numpy()
    np.testing.assert_array_equal(fp8_to_float64(codes.numpy(), dtype), expected)  # NaNs at the same codes
    largest = float(torch.finfo(torch_dtype).max)
    values = np.random.default_rng(1).uniform(-largest, largest, 4000) * np.logspace(-9, 0, 4000)
    values = np.concatenate([values, expected[np.isfinite(expected)] * 1.0000001, [0.0, -0.0]])
    np.testing.assert_array_equal(
        float_to_fp8(values, dtype), torch.from_numpy(values).to(torch_dtype).view(torch.uint8).numpy()
    )


@pytest.mark.parametrize(
    "a_dims, b_dims, c_dims, message",
    [
        (
            (4, 5),
            (6, 7),
            (4, 7),
            "a_desc.dims[-1]=5 must equal b_desc.dims[-2]=6 (a_desc.dims=[4, 5], b_desc.dims=[6, 7])",
        ),
        (
            (2, 4, 5),
            (3, 5, 7),
            (2, 4, 7),
            "batch dims [2] of A and [3] of B do not broadcast: 2 against 3 at batch dim 0 "
            "(a_desc.dims=[2, 4, 5], b_desc.dims=[3, 5, 7])",
        ),
        (
            (2, 4, 5),
            (5, 7),
            (4, 7),
            "c_desc.dims=[4, 7] must equal [2, 4, 7], the broadcast batch dims then (M, N), for "
            "a_desc.dims=[2, 4, 5], b_desc.dims=[5, 7]",
        ),
        ((5,), (5, 7), (1, 7), "a_desc.dims=[5] must have at least 2 dims"),
    ],
)
def test_shape_errors_name_both_shapes(a_dims, b_dims, c_dims, message):
    with pytest.raises(od.BadParam, match=None) as error:
        matmul_problem(
            od.TensorDescriptor("float32", a_dims),
            od.TensorDescriptor("float32", b_dims),
            od.TensorDescriptor("float32", c_dims),
        )
    assert message in str(error.value)


def test_dtype_pair_error_names_both_dtypes_and_shapes():
    with pytest.raises(od.NotSupported) as error:
        matmul_problem(
            od.TensorDescriptor("float16", (4, 5)),
            od.TensorDescriptor("bfloat16", (5, 7)),
            od.TensorDescriptor("float32", (4, 7)),
        )
    assert (
        "a_desc.dtype=HALF with b_desc.dtype=BFLOAT16 is not supported (a_desc.dims=[4, 5], b_desc.dims=[5, 7])"
        in str(error.value)
    )
    assert error.value.status is od.Status.NOT_SUPPORTED_DATA_TYPE


def test_epilogue_errors_name_the_parameter():
    a, b, c = (od.TensorDescriptor("float32", dims) for dims in ((4, 5), (5, 7), (4, 7)))
    with pytest.raises(od.BadParam, match=r"bias_desc.dims=\[4\] must be \[7\] for bias_axis=COLUMN"):
        matmul_problem(a, b, c, bias_desc=od.TensorDescriptor("float32", (4,)))
    with pytest.raises(od.BadParam, match=r"residual_desc.dims=\[7, 4\] must equal c_desc.dims=\[4, 7\]"):
        matmul_problem(a, b, c, residual_desc=od.TensorDescriptor("float32", (7, 4)))
    with pytest.raises(od.BadParam, match="activation=RELU_BWD must be a forward activation"):
        matmul_problem(a, b, c, activation=PointwiseMode.RELU_BWD)
    with pytest.raises(od.BadParam, match="bias_desc and bias must be given together"):
        MatmulEpilogue(bias_desc=od.TensorDescriptor("float32", (7,)))


def test_math_type_decides_tf32_and_fast_fp8_accumulation():
    a, b, c = (torch.randn(4, 5), torch.randn(5, 7), torch.empty(4, 7))
    seen = []
    from opendnn.families.matmul import numpy_backend as numpy_matmul

    original = numpy_matmul.run
    numpy_matmul.run = lambda problem, *tensors: (
        seen.append((problem.allow_tf32, problem.fast_fp8_accumulation)) or original(problem, *tensors)
    )
    try:
        for math_type in (od.MathType.DEFAULT, od.MathType.TENSOR_OP):
            matmul(od.create("cpu", math_type=math_type), 1.0, desc(a), a, desc(b), b, 0.0, desc(c), c)
    finally:
        numpy_matmul.run = original
    assert seen == [(False, False), (True, True)]


@pytest.mark.parametrize("a_k_major", [True, False])
@pytest.mark.parametrize("b_k_major", [True, False])
@pytest.mark.parametrize("bias_axis", ["column", "row"])
def test_tf32_takes_every_operand_order_copying_what_is_not_k_major(a_k_major, b_k_major, bias_axis, monkeypatch):
    """TF32 wgmma reads its operands from shared memory K-major only: an operand that is not is
    copied K-major first, whatever the problem's size."""
    from opendnn.families.matmul import triton_backend as kernels

    copied = []
    copy = kernels._k_major
    monkeypatch.setattr(kernels, "_k_major", lambda operand, axis: copied.append(operand.name) or copy(operand, axis))
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 37, 19, generator=gen), torch.randn(2, 19, 45, generator=gen)
    a = a if a_k_major else a.mT.contiguous().mT
    b = b.mT.contiguous().mT if b_k_major else b
    bias = torch.randn(45 if bias_axis == "column" else 37, generator=gen)
    residual = torch.randn(2, 37, 45, generator=gen)
    handle = od.create("cpu", backend="triton", math_type=od.MathType.TENSOR_OP)
    got = F.matmul(a, b, bias, "gelu", residual=residual, bias_axis=bias_axis, alpha=0.5, handle=handle)
    product = a.double() @ b.double() + (bias.double() if bias_axis == "column" else bias.double()[:, None])
    assert relative_error(got, 0.5 * (TF.gelu(product) + residual.double())) < 1e-3
    assert copied == [name for name, k_major in (("a", a_k_major), ("b", b_k_major)) if not k_major]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_dims_that_no_stride_merges_run_one_launch_per_outer_index(backend):
    a = torch.randn(2, 3, 4, 6, 5)
    b = torch.randn(3, 1, 5, 7)  # broadcast along the first and last batch dims of A
    c = torch.full((2, 3, 4, 6, 7), float("nan"))
    matmul(od.create("cpu", backend=backend), 1.0, desc(a), a, desc(b), b, 0.0, desc(c), c)
    assert relative_error(c, a.double() @ b.double()) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_matmul_matches_torch_with_vectors_and_numpy_inputs(backend):
    handle = od.create("cpu", backend=backend)
    a, b = torch.randn(2, 5, 9), torch.randn(9, 3)
    assert relative_error(F.matmul(a, b, handle=handle), a.double() @ b.double()) < 1e-6
    vector = torch.randn(9)
    got = F.matmul(vector, b, handle=handle)
    assert got.shape == (3,) and relative_error(got, vector.double() @ b.double()) < 1e-6
    got = F.matmul(a, vector, handle=handle)
    assert got.shape == (2, 5) and relative_error(got, a.double() @ vector.double()) < 1e-6
    got = F.matmul(a.numpy(), b.numpy(), handle=handle)
    assert isinstance(got, np.ndarray) and relative_error(got, a.double() @ b.double()) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_epilogue_matches_torch_ops(backend):
    handle = od.create("cpu", backend=backend)
    a, b, bias, residual = torch.randn(6, 9), torch.randn(9, 5), torch.randn(5), torch.randn(6, 5)
    got = F.matmul(a, b, bias, "gelu", residual=residual, handle=handle)
    assert relative_error(got, TF.gelu(a.double() @ b.double() + bias.double()) + residual.double()) < 1e-6
    got = F.matmul(a, b, torch.randn(6).double(), "relu", bias_axis="row", out_dtype="bfloat16", handle=handle)
    assert got.dtype == torch.bfloat16


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_matches_torch_and_reads_the_weight_transposed(backend):
    x, weight, bias = torch.randn(3, 4, 10), torch.randn(6, 10), torch.randn(6)
    got = F.linear(x, weight, bias, handle=od.create("cpu", backend=backend))
    assert got.shape == (3, 4, 6)
    assert relative_error(got, TF.linear(x.double(), weight.double(), bias.double())) < 1e-6


def test_a_batch_that_b_lacks_folds_into_the_rows_of_one_product():
    """A linear layer over (N, H, W, C): the batch becomes rows of one product where A's, C's and the
    residual's rows lie one stride apart across it; a batch of sliced rows, or a bias per row, keep
    the batched product. Against float64, C poisoned."""
    from opendnn.families.matmul import triton_backend as kernels

    def planned(a, b, c, **epilogue):
        problem = matmul_problem(desc(a), desc(b), desc(c), **epilogue)
        plan = kernels.launch_plan(
            problem, problem.a, problem.b, problem.c, problem.bias, problem.residual, False, True, 4
        )
        ((launch, _),) = plan.launches
        names = launch.kernel.arg_names
        return tuple(launch.args[names.index(name)] for name in ("M", "N", "K", "batch_count"))

    handle = od.create("cpu", backend="triton")
    x, weight, residual = torch.randn(2, 3, 5, 10), torch.randn(10, 6), torch.randn(2, 3, 5, 6)
    c = torch.full((2, 3, 5, 6), float("nan"))
    assert planned(x, weight, c, residual_desc=desc(residual)) == (30, 6, 10, 1)
    got = F.matmul(x, weight, residual=residual, handle=handle)
    assert relative_error(got, x.double() @ weight.double() + residual.double()) < 1e-6
    sliced = torch.randn(2, 3, 6, 10)[:, :, :5]
    assert planned(sliced, weight, c) == (5, 6, 10, 6)
    assert relative_error(F.matmul(sliced, weight, handle=handle), sliced.double() @ weight.double()) < 1e-6
    row_bias = torch.randn(5)
    assert planned(x, weight, c, bias_desc=desc(row_bias), bias_axis="row") == (5, 6, 10, 6)
    got = F.matmul(x, weight, row_bias, bias_axis="row", handle=handle)
    assert relative_error(got, x.double() @ weight.double() + row_bias.double()[:, None]) < 1e-6


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_a_long_k_over_few_tiles_is_split_and_summed_in_a_fixed_order(beta):
    """A linear layer's weight gradient (few tiles of C, K every token): slices of K into float32
    partials, added in slice order with the epilogue (bias, gelu, residual, alpha, beta * C): bitwise
    the same on every run, against float64. Under the interpreter (4 programs) a 32 x 32 tile."""
    from opendnn.families.matmul import triton_backend as kernels

    a, b = torch.randn(20, 1000), torch.randn(1000, 24)
    bias, residual, prior = torch.randn(24), torch.randn(20, 24), torch.randn(20, 24)
    problem = matmul_problem(
        desc(a),
        desc(b),
        desc(prior),
        alpha=2.0,
        beta=beta,
        bias_desc=desc(bias),
        activation=PointwiseMode.GELU_FWD,
        residual_desc=desc(residual),
    )
    plan = kernels.launch_plan(problem, problem.a, problem.b, problem.c, problem.bias, problem.residual, False, True, 4)
    ((launches, _),) = plan.launches
    products, sums = launches.launches
    assert (products.options["SPLITS"], sums.kernel.__name__) == (3, "split_sum_kernel")  # 63 steps of 16
    assert launches.scratch[0].numel == 3 * 20 * 24
    handle = od.create("cpu", backend="triton")
    epilogue = MatmulEpilogue(desc(bias), bias, activation=PointwiseMode.GELU_FWD)
    epilogue = dataclasses.replace(epilogue, residual_desc=desc(residual), residual=residual)
    results = []
    for _ in range(2):
        c = prior.clone()
        matmul(handle, 2.0, desc(a), a, desc(b), b, beta, desc(c), c, epilogue=epilogue)
        results.append(c)
    want = 2.0 * (TF.gelu(a.double() @ b.double() + bias.double()) + residual.double()) + beta * prior.double()
    assert torch.equal(results[0], results[1])
    assert relative_error(results[0], want) < 1e-6


def test_functional_errors_name_both_shapes():
    with pytest.raises(od.BadParam, match=r"a.dims=\[2, 3\], b.dims=\[4, 5\]"):
        F.matmul(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(od.BadParam, match=r"a.shape=\[2, 2, 3\] and b.shape=\[3, 3, 5\] do not broadcast"):
        F.matmul(np.ones((2, 2, 3)), np.ones((3, 3, 5)))
    with pytest.raises(od.BadParam, match="activation='mish' is not a forward activation"):
        F.matmul(np.ones((2, 3)), np.ones((3, 5)), activation="mish")


def test_split_epilogue_of_wide_tiles_runs_in_the_interpreter(monkeypatch):
    from opendnn.families.matmul import triton_backend as triton_matmul

    monkeypatch.setattr(triton_matmul, "INTERPRETER_CONFIG", triton_matmul.TileConfig(128, 256, 16, 2, 4, 1))
    a, b, bias = torch.randn(2, 20, 24), torch.randn(24, 300), torch.randn(20)
    got = F.matmul(a, b, bias, "tanh", bias_axis="row", handle=od.create("cpu", backend="triton"))
    assert relative_error(got, torch.tanh(a.double() @ b.double() + bias.double()[:, None])) < 1e-6


@pytest.mark.parametrize("tile", [None, (128, 256), (256, 128)])
def test_epilogue_writes_only_inside_c_when_c_is_a_sub_region(tile, monkeypatch):
    """C a window of a larger NaN-filled buffer, its edges inside tiles (masked stores; the 128 x 256
    and 256 x 128 tiles store two halves): the window holds the product, every element around it
    is untouched."""
    from opendnn.families.matmul import triton_backend as triton_matmul

    config = triton_matmul.INTERPRETER_CONFIG if tile is None else triton_matmul.TileConfig(*tile, 16, 2, 4, 1)
    monkeypatch.setattr(triton_matmul, "INTERPRETER_CONFIG", config)
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 37, 20, generator=gen), torch.randn(2, 20, 44, generator=gen)
    buffer = torch.full((2, 40, 52), float("nan"))
    c = buffer[:, 1:38, 4:48]
    matmul(od.create("cpu", backend="triton"), 1.0, desc(a), a, desc(b), b, 0.0, desc(c), c)
    assert relative_error(c, a.double() @ b.double()) < 1e-6
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, 1:38, 4:48] = False
    assert buffer[outside].isnan().all()


@pytest.mark.parametrize(
    "m, n, k, batch, tile",
    [
        (4096, 4096, 64, (), (128, 256, 64)),  # 512 tiles: 4 rounds of 132 programs
        (4096, 4224, 64, (), (256, 128, 64)),  # 128 x 256: 544 tiles, 5 rounds; 256 x 128: 528, 4 rounds
        (4224, 4096, 64, (), (128, 256, 64)),  # the other way round
        (4224, 4224, 64, (), (128, 256, 64)),  # 561 tiles both ways; 128 x 128: 1089, 9 rounds of half the time
        (16384, 11008, 64, (), (128, 256, 64)),  # 5504 tiles both ways
        (1024, 4224, 64, (2,), (256, 128, 64)),  # the batch counts: 2 x 136 tiles, 3 rounds; 2 x 132, 2 rounds
        (128, 4096, 64, (), (128, 128, 64)),  # one round of the smallest tile
        (200704, 64, 64, (), (128, 64, 64)),  # 64 columns move bytes: three narrow programs an SM
        (200704, 96, 384, (), (256, 128, 64)),  # 784 tiles of 256 x 128, 6 rounds
        (12544, 256, 1024, (), (128, 256, 64)),  # 98 tiles in one round, where 128 x 128 takes two
        (3136, 512, 2048, (), (128, 128, 64)),  # 100 tiles of 128 x 128 in one round
        (128, 128, 128, (512,), (128, 128, 128)),  # short K: the whole of K in one step
        (128, 128, 129, (512,), (128, 128, 64)),
    ],
)
def test_16_bit_products_take_the_tile_they_finish_soonest_with(m, n, k, batch, tile):
    from opendnn.families.matmul import triton_backend as triton_matmul

    a = od.TensorDescriptor(od.DataType.BFLOAT16, (*batch, m, k), None)
    b = od.TensorDescriptor(od.DataType.BFLOAT16, (*batch, k, n), None)
    c = od.TensorDescriptor(od.DataType.BFLOAT16, (*batch, m, n), None)
    config = triton_matmul.tile_config(matmul_problem(a, b, c), od.DataType.BFLOAT16, False, 132)
    assert (config.block_m, config.block_n, config.block_k) == tile


@pytest.mark.parametrize(
    "m, n, k, tile, per_sm",
    [
        (200704, 64, 64, (128, 64, 32), 3),  # 64 columns move bytes: three narrow programs an SM
        (200704, 40, 256, (128, 64, 32), 3),
        (64, 64, 3136, (128, 128, 32), 1),  # rows too few to fill a narrow tile: the small tile
        (16384, 4096, 4096, (128, 256, 32), 1),  # wide products keep the big tile, one program an SM
    ],
)
def test_tf32_products_of_few_columns_take_narrow_tiles_where_rows_fill_them(m, n, k, tile, per_sm):
    from opendnn.families.matmul import triton_backend as triton_matmul

    a, b, c = (od.TensorDescriptor(od.DataType.FLOAT, dims, None) for dims in ((m, k), (k, n), (m, n)))
    problem = matmul_problem(a, b, c, allow_tf32=True)
    config = triton_matmul.tile_config(problem, od.DataType.FLOAT, False, 132)
    assert (config.block_m, config.block_n, config.block_k, config.per_sm) == (*tile, per_sm)
    strict = triton_matmul.tile_config(matmul_problem(a, b, c), od.DataType.FLOAT, False, 132)
    assert strict == triton_matmul.STRICT_FP32_TILES  # IEEE float32 stays on the FMA tile


def test_tf32_product_with_an_n_major_b_writes_a_column_major_c_window():
    """An N-major B under TF32 (copied K-major) with beta * C read from, and C written to, a
    column-major window of a NaN buffer."""
    gen = torch.Generator().manual_seed(6)
    a, b = torch.randn(3, 21, 17, generator=gen), torch.randn(3, 17, 26, generator=gen)  # b: N innermost
    buffer = torch.full((3, 30, 24), float("nan"))
    c = buffer[:, 2:28, 1:22].mT  # (3, 21, 26), M innermost
    start = torch.randn(3, 21, 26, generator=gen)
    c.copy_(start)
    handle = od.create("cpu", backend="triton", math_type=od.MathType.TENSOR_OP)
    matmul(handle, 0.5, desc(a), a, desc(b), b, 2.0, desc(c), c)
    assert relative_error(c, 0.5 * (a.double() @ b.double()) + 2.0 * start.double()) < 1e-3
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[:, 2:28, 1:22] = False
    assert buffer[outside].isnan().all()


@pytest.mark.parametrize(
    "a_shape, b_shape", [((3,), (3, 4)), ((2, 5, 3), (3,)), ((3,), (3,)), ((3,), (4, 3, 5)), ((1, 3), (4, 3, 5))]
)
def test_a_residual_of_the_results_own_shape_is_added(a_shape, b_shape):
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0.5, 2.0, a_shape), rng.uniform(0.5, 2.0, b_shape)
    expected = np.matmul(a, b)
    residual = rng.uniform(0.5, 2.0, np.shape(expected))
    np.testing.assert_allclose(F.matmul(a, b, residual=residual), expected + residual, rtol=1e-12)
