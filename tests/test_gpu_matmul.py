"""GPU tests of matmul (``pytest -m gpu``): the Pythonic API against torch on the device at real
sizes, on both load paths (TMA descriptors for aligned operands, plain pointers otherwise), every
dtype including fp8 and TF32, transposed operands, broadcast batch and the fused epilogue; and the
Gluon Hopper engine (on sm_90) against the float64 reference, the planner's size rule lifted so that
ragged and small products run on it too."""

import math

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize(
    "m, k, n", [(1024, 1024, 1024), (1000, 1001, 999), (4096, 4096, 4096), (1, 4096, 4096), (4096, 1, 4096)]
)
@pytest.mark.parametrize("transposed", [False, True], ids=["packed", "transposed"])
def test_matmul_matches_torch(dtype, m, k, n, transposed):
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=DEVICE, dtype=dtype)
    if transposed:
        a, b = a.t().contiguous().t(), b.t().contiguous().t()
    got = F.matmul(a, b)
    assert got.dtype == dtype and got.shape == (m, n)
    assert relative_error(got, a.double() @ b.double()) < TOLERANCE[dtype]


def test_tf32_only_when_the_handle_allows_it():
    a, b = torch.randn(2048, 2048, device=DEVICE), torch.randn(2048, 2048, device=DEVICE)
    exact = a.double() @ b.double()
    strict = relative_error(F.matmul(a, b), exact)
    tf32 = relative_error(F.matmul(a, b, handle=od.create(DEVICE, math_type=od.MathType.TENSOR_OP)), exact)
    assert strict < 1e-5 and 1e-5 < tf32 < 1e-3


@pytest.mark.parametrize(
    "m, k, n, batch, a_m_major, b_n_major",
    [(256, 64, 3136, (64,), False, True), (256, 256, 4096, (), False, True), (3136, 96, 64, (8,), True, False)],
    ids=["2-D A, batched N-major B", "N-major B", "batched M-major A"],
)
def test_tf32_operands_in_either_order_are_within_tf32_of_float64(m, k, n, batch, a_m_major, b_n_major):
    """TF32 products with an N-major B or an M-major A, at sizes that once took A through registers
    and came out wrong: within TF32's error of float64 (operands truncated to 2**-10, float32 sums)."""
    a = torch.randn(*batch, k, m, device=DEVICE).mT if a_m_major else torch.randn(*batch, m, k, device=DEVICE)
    b = torch.randn(k, n, device=DEVICE) if b_n_major else torch.randn(n, k, device=DEVICE).T
    if batch and b_n_major:  # the batch on B, A 2-D
        a, b = a[0], torch.randn(*batch, k, n, device=DEVICE)
    got = F.matmul(a, b, handle=od.create(DEVICE, math_type=od.MathType.TENSOR_OP))
    assert relative_error(got, a.double() @ b.double()) < 1e-3


@pytest.mark.parametrize("b_type", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_with_scales_matches_scaled_mm(b_type):
    a = torch.randn(4096, 2048, device=DEVICE).to(torch.float8_e4m3fn)
    b = torch.randn(1024, 2048, device=DEVICE).to(b_type).t()
    scale_a, scale_b = torch.tensor(0.5, device=DEVICE), torch.tensor(2.0, device=DEVICE)
    reference = 0.5 * 2.0 * (a.double() @ b.double())
    # cuBLAS's fp8 product is itself ~1e-4 off the exact one (Hopper's fp8 MMA accumulates with a
    # short mantissa between promotions): opendnn must be about as close to the exact product
    cublas_error = relative_error(torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.float32), reference)
    got = F.matmul(a, b, a_scale=0.5, b_scale=2.0, out_dtype="float32")
    assert relative_error(got, reference) <= max(1.5 * cublas_error, 1e-5)
    fast = F.matmul(
        a, b, a_scale=0.5, b_scale=2.0, out_dtype="float32", handle=od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    )
    assert relative_error(fast, 0.5 * 2.0 * (a.double() @ b.double())) < 5e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_linear_bias_gelu_residual_fused_matches_torch(dtype):
    x = torch.randn(4, 1000, 1536, device=DEVICE, dtype=dtype)
    weight = torch.randn(2048, 1536, device=DEVICE, dtype=dtype) / 40
    bias, residual = torch.randn(2048, device=DEVICE, dtype=dtype), torch.randn(4, 1000, 2048, device=DEVICE)
    expected = TF.gelu(TF.linear(x.double(), weight.double(), bias.double())) + residual.double()
    got = F.matmul(x, weight.t(), bias, "gelu", residual=residual)
    assert relative_error(got, expected) < TOLERANCE[dtype]
    assert (
        relative_error(F.linear(x, weight, bias), TF.linear(x.double(), weight.double(), bias.double()))
        < TOLERANCE[dtype]
    )


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((512, 128, 128), (512, 128, 128)), ((8, 1, 300, 200), (5, 200, 100)), ((6, 256, 512), (512, 384))],
)
def test_batched_broadcast_matches_torch(a_shape, b_shape):
    a = torch.randn(a_shape, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(b_shape, device=DEVICE, dtype=torch.bfloat16)
    assert relative_error(F.matmul(a, b), a.double() @ b.double()) < 1e-2


def test_bias_per_row_and_alpha_beta():
    a, b = torch.randn(777, 555, device=DEVICE), torch.randn(555, 333, device=DEVICE)
    bias = torch.randn(777, device=DEVICE)
    c = torch.randn(777, 333, device=DEVICE)
    expected = 0.5 * torch.relu(a.double() @ b.double() + bias.double()[:, None]) - 2.0 * c.double()
    desc = od.TensorDescriptor
    epilogue = od.MatmulEpilogue(
        bias_desc=desc("float32", (777,)), bias=bias, bias_axis="row", activation=od.PointwiseMode.RELU_FWD
    )
    od.matmul(
        od.create(DEVICE),
        0.5,
        desc("float32", a.shape),
        a,
        desc("float32", b.shape),
        b,
        -2.0,
        desc("float32", c.shape),
        c,
        epilogue,
    )
    assert relative_error(c, expected) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_stores_stay_inside_a_c_window(dtype, beta):
    """C a window of a NaN-filled buffer, its edges inside tiles (big tiles, split epilogue at this
    size): the window holds the product, nothing around it changes."""
    m, k, n = 2000, 512, 3000
    a = torch.randn(m, k, device=DEVICE, dtype=dtype)
    b = torch.randn(k, n, device=DEVICE, dtype=dtype).t().contiguous().t()
    buffer = torch.full((m + 9, n + 40), float("nan"), device=DEVICE, dtype=dtype)
    c = buffer[3 : 3 + m, 8 : 8 + n]
    start = torch.randn(m, n, device=DEVICE, dtype=dtype)
    c.copy_(start)
    desc = od.TensorDescriptor
    handle = od.create(DEVICE, math_type=od.MathType.TENSOR_OP)
    od.matmul(
        handle,
        1.0,
        desc(dtype, a.shape, a.stride()),
        a,
        desc(dtype, b.shape, b.stride()),
        b,
        beta,
        desc(dtype, c.shape, c.stride()),
        c,
    )
    expected = a.double() @ b.double() + beta * start.double()
    assert relative_error(c, expected) < (1e-2 if dtype is torch.bfloat16 else 1e-3)
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[3 : 3 + m, 8 : 8 + n] = False
    assert buffer[outside].isnan().all()


@pytest.mark.parametrize(
    "batch, m, k, n, tile",
    [
        ((), 4096, 1024, 4224, (256, 128, 64)),
        ((512,), 128, 128, 128, (128, 128, 128)),
        ((), 65536, 256, 64, (128, 64, 64)),
    ],
)
@pytest.mark.parametrize("aligned", [True, False], ids=["tma", "pointers"])
def test_rated_and_short_k_tiles_match_torch_on_both_load_paths(batch, m, k, n, tile, aligned, monkeypatch):
    """The tiles ``tile_config`` takes beside 128 x 256 (256 x 128 where it needs fewer rounds, 128 x 128 x 128
    for K = 128, 128 x 64 three an SM for 64 columns; planned for 132 programs, the H200's SMs, on any GPU) with bias,
    gelu and a residual in the epilogue (256 x 128 stores two halves), on TMA and, with every operand one
    element into its buffer (bases not 16-byte aligned), on plain pointers; C a window of a NaN buffer."""
    from opendnn.families.matmul import triton_backend as triton_matmul
    from opendnn.families.matmul.problem import matmul_problem

    monkeypatch.setattr(triton_matmul, "multiprocessors", lambda index: 132)
    dtype, offset = torch.bfloat16, 0 if aligned else 1

    def operand(*dims, scale=1.0):
        return (torch.randn(math.prod(dims) + offset, device=DEVICE) * scale).to(dtype)[offset:].view(dims)

    a, b, residual, bias = operand(*batch, m, k), operand(*batch, k, n, scale=0.125), operand(*batch, m, n), operand(n)
    buffer = torch.full((*batch, m + 2, n + 3), float("nan"), device=DEVICE, dtype=dtype)
    c = buffer[..., 1 : 1 + m, 2 : 2 + n]
    desc = od.TensorDescriptor
    problem = matmul_problem(*(desc(dtype, t.shape, t.stride()) for t in (a, b, c)))
    config = triton_matmul.tile_config(problem, od.DataType.BFLOAT16, False, 132)
    assert (config.block_m, config.block_n, config.block_k) == tile
    epilogue = od.MatmulEpilogue(
        bias_desc=desc(dtype, bias.shape),
        bias=bias,
        activation=od.PointwiseMode.GELU_FWD,
        residual_desc=desc(dtype, residual.shape, residual.stride()),
        residual=residual,
    )
    od.matmul(
        od.create(DEVICE),
        1.0,
        desc(dtype, a.shape, a.stride()),
        a,
        desc(dtype, b.shape, b.stride()),
        b,
        0.0,
        desc(dtype, c.shape, c.stride()),
        c,
        epilogue,
    )
    expected = TF.gelu(a.double() @ b.double() + bias.double()) + residual.double()
    assert relative_error(c, expected) < 1e-2
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[..., 1 : 1 + m, 2 : 2 + n] = False
    assert buffer[outside].isnan().all()


# ---- the Gluon Hopper engine (families/matmul/gluon_hopper.py) ----------------------------------------

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability(0) != (9, 0),
    reason="the Gluon engine runs on sm_90 (H100, H200) alone",
)
ACTIVATIONS = {
    "gelu": (od.PointwiseMode.GELU_FWD, TF.gelu),
    "relu": (od.PointwiseMode.RELU_FWD, torch.relu),
    "silu": (od.PointwiseMode.SWISH_FWD, TF.silu),
}


@pytest.fixture
def gluon_planned(monkeypatch):
    """The problems the planner gives the Gluon engine, in a list filled as they are planned."""
    from opendnn.families.matmul import triton_backend as triton_matmul

    planned = []
    make = triton_matmul.gluon_launch
    monkeypatch.setattr(
        triton_matmul, "gluon_launch", lambda problem, *rest: planned.append(problem) or make(problem, *rest)
    )
    triton_matmul.launch_plan.cache_clear()
    yield planned
    triton_matmul.launch_plan.cache_clear()


@pytest.fixture
def gluon_everywhere(gluon_planned, monkeypatch):
    """``gluon_planned``, with every product the Gluon engine reads given to it, however small (the
    planner's size rule lifted)."""
    from opendnn.families.matmul import triton_backend as triton_matmul

    monkeypatch.setattr(triton_matmul, "takes_wide_tiles", lambda problem, sms: True)
    return gluon_planned


def stored(rows, cols, dtype, transposed=False):
    """A random rows x cols operand, stored as its transpose when ``transposed``; its stored rows are
    padded to a multiple of 8 elements (16 bytes: what TMA asks of a stride) whatever its size."""
    stored_rows, stored_cols = (cols, rows) if transposed else (rows, cols)
    buffer = torch.randn(stored_rows, -(-stored_cols // 8) * 8, device=DEVICE).to(dtype)
    view = buffer[:, :stored_cols]
    return view.t() if transposed else view


def product(a, b, c, alpha=1.0, beta=0.0, bias=None, bias_axis="column", activation=None, residual=None):
    """``od.matmul`` of a and b into c with the epilogue given (``activation`` a key of ACTIVATIONS)."""

    def desc(tensor):
        return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())

    epilogue = od.MatmulEpilogue(
        bias_desc=None if bias is None else desc(bias),
        bias=bias,
        bias_axis=bias_axis,
        activation=None if activation is None else ACTIVATIONS[activation][0],
        residual_desc=None if residual is None else desc(residual),
        residual=residual,
    )
    od.matmul(od.create(DEVICE), alpha, desc(a), a, desc(b), b, beta, desc(c), c, epilogue)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(1000, 1000, 1000), (4224, 4096, 4096), (257, 129, 72)])
@pytest.mark.parametrize("a_transposed, b_transposed", [(False, False), (True, False), (False, True), (True, True)])
def test_gluon_engine_matches_the_reference_at_ragged_sizes_in_either_operand_order(
    dtype, m, n, k, a_transposed, b_transposed, gluon_everywhere
):
    """M, N and K off the 128 x 256 x 64 tile (TMA zero-fills past the edges, the stores are masked),
    A and B read in their stored order; C poisoned with NaN."""
    a, b = stored(m, k, dtype, a_transposed), stored(k, n, dtype, b_transposed)
    c = torch.full((m, n), float("nan"), device=DEVICE, dtype=dtype)
    product(a, b, c)
    assert len(gluon_everywhere) == 1
    assert relative_error(c, a.double() @ b.double()) < TOLERANCE[dtype]


EPILOGUES = {
    "bias column, gelu": dict(bias_axis="column", activation="gelu"),
    "bias row, relu": dict(bias_axis="row", activation="relu"),
    "silu, residual": dict(activation="silu", residual=True),
    "alpha, beta": dict(alpha=0.5, beta=-2.0),
    "bias, gelu, residual, alpha, beta": dict(
        bias_axis="column", activation="gelu", residual=True, alpha=0.75, beta=0.5
    ),
}


@needs_sm90
@pytest.mark.parametrize(
    "in_dtype, out_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.bfloat16, torch.float32)],
)
@pytest.mark.parametrize("case", list(EPILOGUES))
def test_gluon_engine_epilogues_match_the_reference_and_write_only_inside_c(
    case, in_dtype, out_dtype, gluon_everywhere
):
    """Each epilogue of ``triton_tiles.finish_tile`` on the Gluon engine, into bf16, fp16 and float32,
    C a window of a NaN buffer (its start values read when beta != 0): the window holds the result
    and nothing around it changes."""
    parts = EPILOGUES[case]
    m, n, k = 1000, 1304, 520
    a, b = stored(m, k, in_dtype), stored(k, n, in_dtype, transposed=True)
    axis = parts.get("bias_axis")
    bias = None if axis is None else torch.randn(m if axis == "row" else n, device=DEVICE).to(out_dtype)
    residual = torch.randn(m, n, device=DEVICE).to(out_dtype) if parts.get("residual") else None
    alpha, beta = parts.get("alpha", 1.0), parts.get("beta", 0.0)
    buffer = torch.full((m + 3, n + 9), float("nan"), device=DEVICE, dtype=out_dtype)
    c = buffer[1 : 1 + m, 4 : 4 + n]
    start = torch.randn(m, n, device=DEVICE).to(out_dtype)
    if beta != 0.0:
        c.copy_(start)
    product(a, b, c, alpha, beta, bias, axis or "column", parts.get("activation"), residual)
    expected = a.double() @ b.double()
    if bias is not None:
        expected += bias.double()[:, None] if axis == "row" else bias.double()
    if "activation" in parts:
        expected = ACTIVATIONS[parts["activation"]][1](expected)
    if residual is not None:
        expected += residual.double()
    expected = alpha * expected + beta * start.double()
    assert len(gluon_everywhere) == 1
    assert relative_error(c, expected) < TOLERANCE[out_dtype]
    outside = torch.ones_like(buffer, dtype=torch.bool)
    outside[1 : 1 + m, 4 : 4 + n] = False
    assert buffer[outside].isnan().all()


@needs_sm90
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((4, 1000, 520), (4, 520, 1304)),  # one batch stride each
        ((2, 3, 300, 264), (2, 3, 264, 520)),  # two batch dims that merge into one
        ((6, 256, 512), (512, 384)),  # B broadcast: a descriptor of one batch
        ((512, 256), (6, 256, 384)),  # A broadcast
    ],
)
def test_gluon_engine_matches_the_reference_on_batched_and_broadcast_products(a_shape, b_shape, gluon_everywhere):
    a = torch.randn(a_shape, device=DEVICE).to(torch.bfloat16)
    b = torch.randn(b_shape, device=DEVICE).to(torch.bfloat16)
    expected = a.double() @ b.double()
    c = torch.full(expected.shape, float("nan"), device=DEVICE, dtype=torch.bfloat16)
    product(a, b, c)
    assert len(gluon_everywhere) == 1
    assert relative_error(c, expected) < TOLERANCE[torch.bfloat16]


@needs_sm90
def test_the_planner_gives_a_big_16_bit_linear_layer_to_the_gluon_engine(gluon_planned):
    """Without forcing: 4224 tokens through a 4096 -> 4096 linear layer with bias, gelu and a
    residual (33 x 16 tiles of 128 x 256, 4 rounds of 132 SMs) runs on the Gluon engine."""
    x, weight = stored(4224, 4096, torch.bfloat16), stored(4096, 4096, torch.bfloat16, transposed=True)
    bias, residual = torch.randn(4096, device=DEVICE).to(torch.bfloat16), stored(4224, 4096, torch.bfloat16)
    c = torch.full((4224, 4096), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    product(x, weight, c, bias=bias, activation="gelu", residual=residual)
    expected = TF.gelu(x.double() @ weight.double() + bias.double()) + residual.double()
    assert len(gluon_planned) == 1
    assert relative_error(c, expected) < TOLERANCE[torch.bfloat16]
