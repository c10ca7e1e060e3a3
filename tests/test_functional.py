"""The Pythonic API: outputs of the caller's kind, device and layout; broadcasting; both backends."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F

BACKENDS = ["numpy", "triton"]


@pytest.fixture(params=BACKENDS)
def handle(request):
    return od.create("cpu", backend=request.param)


ACTIVATIONS = [
    (lambda x, h: F.relu(x, handle=h), torch.relu),
    (lambda x, h: F.clipped_relu(x, 6.0, handle=h), lambda x: TF.hardtanh(x, 0.0, 6.0)),
    (lambda x, h: F.elu(x, 0.5, handle=h), lambda x: TF.elu(x, 0.5)),
    (lambda x, h: F.gelu(x, handle=h), TF.gelu),
    (lambda x, h: F.gelu(x, "tanh", handle=h), lambda x: TF.gelu(x, approximate="tanh")),
    (lambda x, h: F.sigmoid(x, handle=h), torch.sigmoid),
    (lambda x, h: F.tanh(x, handle=h), torch.tanh),
    (lambda x, h: F.softplus(x, 2.0, handle=h), lambda x: TF.softplus(x, beta=2.0)),
    (lambda x, h: F.swish(x, handle=h), TF.silu),
]


@pytest.mark.parametrize("ours, theirs", ACTIVATIONS)
def test_activations_match_torch_and_keep_layout(ours, theirs, handle):
    x = (4 * torch.randn(2, 5, 3, 4, dtype=torch.float64)).to(memory_format=torch.channels_last)
    y = ours(x, handle)
    assert isinstance(y, torch.Tensor) and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, theirs(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["relu", "elu", "gelu", "sigmoid", "tanh", "softplus", "swish"])
def test_activation_backward_matches_torch_autograd(name, handle):
    x = (3 * torch.randn(3, 7, dtype=torch.float64)).t().requires_grad_()
    dy = torch.randn(7, 3, dtype=torch.float64)
    theirs = {
        "relu": torch.relu,
        "elu": TF.elu,
        "gelu": TF.gelu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
        "softplus": TF.softplus,
        "swish": TF.silu,
    }[name]
    theirs(x).backward(dy)
    ours = getattr(F, f"{name}_backward")(dy, x.detach(), handle=handle)
    torch.testing.assert_close(ours, x.grad, rtol=1e-11, atol=1e-12)


def test_numpy_in_numpy_out_with_broadcasting():
    handle = od.create("cpu")  # NumPy arrays run on the numpy backend (Triton takes torch tensors)
    a = np.random.default_rng(0).normal(size=(4, 1, 3)).astype(np.float32)
    b = np.random.default_rng(1).normal(size=(5, 1)).astype(np.float32)
    for ours, theirs in [(F.add, np.add), (F.mul, np.multiply), (F.maximum, np.maximum), (F.sub, np.subtract)]:
        result = ours(a, b, handle=handle)
        assert isinstance(result, np.ndarray) and result.shape == (4, 5, 3) and result.dtype == np.float32
        np.testing.assert_allclose(result, theirs(a, b), rtol=1e-6)
    assert F.lt(a, b, handle=handle).dtype == np.bool_
    np.testing.assert_array_equal(F.lt(a, b, handle=handle), a < b)


def test_binary_ops_broadcast_torch_tensors(handle):
    a = torch.randn(4, 1, 3)
    b = torch.randn(5, 1).abs() + 0.5
    torch.testing.assert_close(F.div(a, b, handle=handle), a / b)
    torch.testing.assert_close(F.fmod(a, b, handle=handle), torch.fmod(a, b))
    torch.testing.assert_close(F.pow(b, a, handle=handle), torch.pow(b, a))
    torch.testing.assert_close(F.where(a > 0, a, b, handle=handle), torch.where(a > 0, a, b))
    torch.testing.assert_close(F.logical_and(a > 0, b > 1, handle=handle), (a > 0) & (b > 1))


def test_mixed_dtypes_promote_to_the_wider_float(handle):
    a = torch.randn(3, 4, dtype=torch.float16)
    b = torch.randn(3, 4, dtype=torch.bfloat16)
    assert F.add(a, b, handle=handle).dtype == torch.float32
    assert F.add(a, b.double(), handle=handle).dtype == torch.float64


def test_transform_changes_layout_and_dtype(handle):
    x = torch.randn(2, 3, 4, 5)
    nhwc = F.transform(x, "NHWC", handle=handle)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(nhwc, x)
    back = F.transform(nhwc, od.TensorFormat.NCHW, dtype=torch.bfloat16, alpha=2.0, handle=handle)
    assert back.is_contiguous() and back.dtype == torch.bfloat16
    torch.testing.assert_close(back, (2 * x).to(torch.bfloat16))
    assert F.transform(x, (3, 2, 1, 0), handle=handle).stride() == (1, 2, 6, 24)


def test_gen_index_counts_along_axis(handle):
    x = torch.randn(3, 4)
    torch.testing.assert_close(F.gen_index(x, 1, handle=handle), torch.arange(4).expand(3, 4))
    torch.testing.assert_close(
        F.gen_index(x, -2, dtype="float32", handle=handle), torch.arange(3.0)[:, None].expand(3, 4)
    )


def test_scalar_inputs_give_scalar_outputs(handle):
    result = F.exp(torch.tensor(1.5, dtype=torch.float64), handle=handle)
    assert result.shape == () and result.item() == pytest.approx(np.exp(1.5))


# fused activations take torch's default coefficient when the call gives none ------------------------


def test_matmul_silu_without_coef_is_torchs_silu():
    result = F.matmul(np.array([[1.0, -2.0]]), np.eye(2), activation="silu")
    np.testing.assert_allclose(result, [[1 / (1 + np.exp(-1.0)), -2 / (1 + np.exp(2.0))]], rtol=1e-12)
    np.testing.assert_allclose(result, [[0.731, -0.238]], atol=5e-4)


DEFAULTED = [("silu", TF.silu), ("elu", TF.elu), ("softplus", TF.softplus), ("identity", lambda t: t)]


@pytest.mark.parametrize("activation, theirs", DEFAULTED)
def test_epilogues_without_coef_match_torchs_default(activation, theirs, handle):
    gen = torch.Generator().manual_seed(11)
    a, b, bias = (torch.randn(*s, dtype=torch.float64, generator=gen) for s in ((5, 7), (7, 6), (6,)))
    torch.testing.assert_close(F.matmul(a, b, bias, activation, handle=handle), theirs(a @ b + bias))
    x, w = torch.randn(2, 3, 6, 5, dtype=torch.float64, generator=gen), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    got = F.conv_bias_activation(x, w, bias[:4], activation=activation, padding=1, handle=handle)
    torch.testing.assert_close(got, theirs(TF.conv2d(x, w, bias[:4], padding=1)))


@pytest.mark.parametrize(
    "mode, theirs",
    [
        (od.PointwiseMode.SWISH_FWD, TF.silu),
        (od.PointwiseMode.ELU_FWD, TF.elu),
        (od.PointwiseMode.SOFTPLUS_FWD, TF.softplus),
    ],
)
def test_cudnn_shaped_epilogues_without_coef_match_torchs_default(mode, theirs):
    handle = od.create("cpu")
    a, b = torch.randn(4, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    c = torch.full((4, 3), float("nan"), dtype=torch.float64)
    od.matmul(
        handle,
        1.0,
        od.TensorDescriptor("float64", (4, 5)),
        a,
        od.TensorDescriptor("float64", (5, 3)),
        b,
        0.0,
        od.TensorDescriptor("float64", (4, 3)),
        c,
        od.MatmulEpilogue(activation=mode),
    )
    torch.testing.assert_close(c, theirs(a @ b))
    torch.testing.assert_close(F.pointwise(mode, a, handle=handle), theirs(a))


def test_where_takes_its_dtype_from_the_branches_not_the_condition():
    condition = np.array([1.0, 0.0, 2.0])
    a, b = np.array([1.5, 2.5, 3.5], np.float32), np.array([-1.0, -2.0, -3.0], np.float32)
    result = F.where(condition, a, b)
    assert result.dtype == np.where(condition != 0, a, b).dtype == np.float32
    np.testing.assert_array_equal(result, [1.5, -2.0, 3.5])
    tensors = [torch.from_numpy(v) for v in (condition, a, b)]
    assert F.where(*tensors).dtype == torch.where(tensors[0] != 0, tensors[1], tensors[2]).dtype == torch.float32


def test_inputs_that_require_grad_are_read_detached(handle):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    y = F.linear(F.relu(x, handle=handle), w, handle=handle)
    assert not y.requires_grad
    torch.testing.assert_close(y, torch.relu(x.detach()) @ w.detach().t())
    torch.testing.assert_close(
        F.layer_norm(x, 4, weight=w[0], handle=handle), TF.layer_norm(x, (4,), weight=w[0]).detach()
    )


@pytest.mark.parametrize("backend", ["numpy", "triton"])
def test_float64_into_bfloat16_rounds_as_torch(backend):
    """A float64 result stored as bfloat16 goes through float32, as torch's conversion does (Triton's
    interpreter garbles the direct one). The interpreter truncates float32 to bfloat16 (a GPU rounds to
    nearest), so the Triton backend on the CPU is within one bfloat16 step of torch's."""
    x = torch.randn(5, 1, 2, dtype=torch.float64)
    out = F.transform(x, (1, 2, 0), dtype=torch.bfloat16, handle=od.Handle(backend=backend))
    assert out.dtype == torch.bfloat16
    step = 2.0**-7 * x.abs()
    assert ((out.double() - x.to(torch.bfloat16).double()).abs() <= step).all()


def test_numpy_inputs_that_are_views_of_one_buffer_read_it_as_it_is(handle):
    """Inputs viewing one buffer (a shifted slice, every other element, a transpose, the same first
    element with other extents) on either backend: the Triton kernels read NumPy memory as torch
    tensors, one per buffer."""
    rng = np.random.default_rng(7)
    x, square, memory = (rng.standard_normal(size).astype(np.float32) for size in (32, (6, 6), 200))

    def t(array):
        return torch.from_numpy(np.asarray(array, np.float64))

    np.testing.assert_allclose(F.add(x[:16], x[::2], handle=handle), t(x[:16]) + t(x[::2]), rtol=1e-6)
    np.testing.assert_allclose(F.mul(x[8:24], x[:16], handle=handle), t(x[8:24]) * t(x[:16]), rtol=1e-6)
    np.testing.assert_allclose(
        F.matmul(square[:4], square.T[:, ::2], handle=handle), t(square[:4]) @ t(square.T[:, ::2]), rtol=1e-5
    )
    image, weight, bias = memory[:32].reshape(1, 2, 4, 4), memory[:54].reshape(3, 2, 3, 3), memory[::3][:3]
    residual = memory[::2][:48].reshape(1, 3, 4, 4)
    result = F.conv_bias_activation(image, weight, bias, residual, "relu", padding=1, handle=handle)
    expected = torch.relu(TF.conv2d(t(image), t(weight), t(bias), padding=1) + t(residual))
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    out = np.full(16, np.nan, np.float32)  # the cuDNN-shaped call: two descriptors over one array
    dense, strided = od.TensorDescriptor("float32", (16,)), od.TensorDescriptor("float32", (16,), (2,))
    od.op_tensor(handle, od.OpTensorDescriptor(od.OpTensorOp.MUL), 1.0, dense, x, 1.0, strided, x, 0.0, dense, out)
    np.testing.assert_allclose(out, t(x[:16]) * t(x[::2]), rtol=1e-6)
