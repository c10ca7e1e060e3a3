"""The ``opendnn::`` operators as torch.library sees them: torch.library.opcheck on a representative
sample of each (schema, autograd registration, fake kernel against the real one, AOT dispatch with
dynamic shapes), fake strides equal to the real ones, every operator sampled, errors as torch's
exception type with opendnn's message, empty batches."""

import pytest
import torch
import torch.nn.functional as TF

import opendnn.torch  # noqa: F401 (registers the operators)
from opendnn.core.errors import BadParam, NotSupported

ops = torch.ops.opendnn
CL = torch.channels_last
FP8_TYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
DEFAULT_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
# opcheck's test_schema compares each input before and after with torch.allclose, which fp8
# tensors lack: an fp8 operator's samples run the other checks (test_torch_attention_fp8 compares
# the inputs' bytes instead)
WITHOUT_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _randn(*shape, grad=False, layout=None):
    t = torch.randn(*shape, dtype=torch.float64)
    if layout is not None:
        t = t.contiguous(memory_format=layout)
    return t.requires_grad_(grad)


def _positive(*shape):
    return torch.rand(*shape, dtype=torch.float64) + 0.5


def _training_state(x, activation):
    """(saved mean, saved inverse std, reserve) of a training batch norm of x, for its backward."""
    _, mean, inv_std, reserve, _, _ = ops.batch_norm_training(
        x, None, None, None, None, None, 0.1, 1e-5, activation, 0.0
    )
    return mean, inv_std, reserve


def samples():
    """(operator name, arguments) pairs: forward operators with inputs that need gradients, the
    backward operators with what their forward saved."""
    torch.manual_seed(0)
    x4, x4_cl = _randn(2, 4, 6, 5, grad=True), _randn(2, 4, 6, 5, grad=True, layout=CL)
    w = _randn(6, 2, 3, 3, grad=True)
    dy = _randn(2, 6, 3, 5)
    y_max = ops.max_pool(x4_cl.detach(), [2, 2], [2, 2], [0, 0], [1, 1], False)
    _, indices = ops.max_pool_with_indices(x4_cl.detach(), [2, 2], [1, 2], [1, 0], [2, 1], True)
    y_adaptive = ops.adaptive_pool(x4.detach(), [4, 3], True)
    y_soft = ops.softmax(x4.detach(), 1, False)
    x_plain = x4.detach()
    _, mean, rstd = ops.layer_norm(x_plain, [6, 5], None, None, 1e-5)
    _, rms = ops.rms_norm(x_plain, [5], None, None)
    _, g_mean, g_rstd = ops.group_norm(x_plain, 2, None, None, 1e-5)
    _, i_mean, i_rstd = ops.instance_norm(x_plain, None, None, 1e-5)
    q, kv, mask = _randn(2, 4, 6, 8, grad=True), _randn(2, 1, 5, 8, grad=True), _randn(1, 4, 6, 5, grad=True)
    attention_options = (0.0, False, None, True, _positive(4), _randn(4, grad=True), 3, None, "bottom_right", 2.0, 0)
    out, stats = ops.scaled_dot_product_attention(
        q.detach(), kv.detach(), kv.detach(), mask.detach(), *attention_options
    )
    q8, kv8 = (torch.randn(*t.shape).to(torch.float8_e4m3fn) for t in (q, kv))
    factors = tuple(torch.rand(1) + 0.5 for _ in range(6))
    fp8_options = (True, 0.3, True, None, None, "top_left", torch.bfloat16)
    out8, do8 = (torch.randn(2, 4, 6, 8).to(torch.float8_e4m3fn) for _ in range(2))
    backward_factors = tuple(torch.rand(1) + 0.5 for _ in range(12))
    return [
        ("convolution", (x4_cl, w, _randn(6, grad=True), [2, 1], [1, 1], [1, 1], 2)),
        ("convolution_transpose", (x4, _randn(4, 3, 3, 3, grad=True), None, [2, 2], [1, 1], [1, 0], 1, [1, 1])),
        ("convolution_backward_data", (dy, w.detach(), [2, 4, 6, 5], [2, 1], [1, 1], [1, 1], 2)),
        ("convolution_backward_filter", (x_plain, dy, [6, 2, 3, 3], [2, 1], [1, 1], [1, 1], 2)),
        ("convolution_backward_bias", (dy,)),
        ("linear", (_randn(3, 2, 5, grad=True), _randn(4, 5, grad=True), _randn(4, grad=True))),
        ("linear_backward_bias", (_randn(6, 4, 1),)),
        ("matmul", (_randn(2, 3, 5, grad=True), _randn(5, 4, grad=True))),
        ("matmul_backward_sum", (_randn(6, 4, 1),)),
        ("activation", (x4_cl, "hardtanh", [-0.5, 0.8])),
        ("activation", (x4, "gelu_tanh", [])),
        ("activation_backward", (_randn(2, 4, 6, 5), x_plain, "elu", [0.7])),
        ("softmax", (x4_cl, 1, True)),
        ("softmax_backward", (_randn(2, 4, 6, 5), y_soft, 1, False)),
        ("max_pool", (x4_cl, [3, 2], [2, 2], [1, 0], [1, 2], True)),
        ("max_pool_backward", (_randn(*y_max.shape), x4_cl.detach(), y_max, [2, 2], [2, 2], [0, 0], [1, 1], False)),
        ("max_pool_with_indices", (x4_cl, [2, 2], [1, 2], [1, 0], [2, 1], True)),
        (
            "max_pool_indices_backward",
            (_randn(*indices.shape), x4_cl.detach(), indices, [2, 2], [1, 2], [1, 0], [2, 1], True),
        ),
        ("avg_pool", (x4, [3, 3], [2, 1], [1, 1], False, False)),
        ("avg_pool_backward", (_randn(2, 4, 3, 5), x_plain, [3, 3], [2, 1], [1, 1], False, False)),
        ("adaptive_pool", (x4_cl, [4, 3], False)),
        ("adaptive_pool", (x4, [4, 3], True)),
        ("adaptive_pool_backward", (_randn(2, 4, 4, 3), x_plain, None, [4, 3], False)),
        ("adaptive_pool_backward", (_randn(2, 4, 4, 3), x_plain, y_adaptive, [4, 3], True)),
        ("interpolate", (x4_cl, [9, 7], [], "bilinear", True)),
        ("interpolate", (x4, [12, 10], [2.0, 2.0], "nearest", False)),
        (
            "interpolate_backward",
            (_randn(2, 4, 12, 10), [2, 4, 6, 5], [0, 1, 2, 3], [12, 10], [2.0, 2.0], "bilinear", False),
        ),
        ("interpolate_backward", (_randn(2, 4, 9, 7), [2, 4, 6, 5], [0, 2, 3, 1], [9, 7], [], "bicubic", True)),
        ("interpolate_backward", (_randn(2, 4, 4, 3), [2, 4, 6, 5], [0, 2, 3, 1], [4, 3], [], "area", False)),
        ("layer_norm", (x4, [6, 5], _randn(6, 5, grad=True), _randn(6, 5, grad=True), 1e-5)),
        ("layer_norm_backward", (_randn(2, 4, 6, 5), x_plain, [6, 5], None, mean, rstd, 1e-5)),
        ("rms_norm", (x4, [5], _randn(5, grad=True), None)),
        ("rms_norm_backward", (_randn(2, 4, 6, 5), x_plain, [5], _randn(5), rms, None)),
        ("group_norm", (x4_cl, 2, _randn(4, grad=True), _randn(4, grad=True), 1e-5)),
        ("group_norm_backward", (_randn(2, 4, 6, 5), x_plain, 2, _randn(4), g_mean, g_rstd, 1e-5)),
        ("instance_norm", (x4, _randn(4, grad=True), None, 1e-5)),
        ("instance_norm_backward", (_randn(2, 4, 6, 5), x_plain, None, i_mean, i_rstd, 1e-5)),
        ("local_response_norm", (x4_cl, 3, 0.1, 0.75, 1.0)),
        ("local_response_norm_backward", (_randn(2, 4, 6, 5), x_plain, 3, 0.1, 0.75, 1.0)),
        (
            "batch_norm_training",
            (
                x4_cl,
                _randn(2, 4, 6, 5, grad=True),
                _randn(4, grad=True),
                _randn(4, grad=True),
                _randn(4),
                _positive(4),
                0.1,
                1e-5,
                "relu",
                0.0,
            ),
        ),
        (
            "batch_norm_training_backward",
            (_randn(2, 4, 6, 5), x_plain, _randn(4), *_training_state(x_plain, "relu"), 1e-5, "relu", 0.0, False),
        ),
        ("batch_norm_inference", (x4_cl, _randn(4, grad=True), None, _randn(4), _positive(4), 1e-5)),
        ("batch_norm_inference_backward", (_randn(2, 4, 6, 5), x_plain, _randn(4), _randn(4), _positive(4), 1e-5)),
        (
            "convolution_bias_activation",
            (x4_cl.detach(), w.detach(), _randn(6), _randn(2, 6, 3, 5), "relu", 0.0, [2, 1], [1, 1], [1, 1], 2),
        ),
        ("matmul_bias_activation", (_randn(3, 2, 5), _randn(5, 4), _randn(4), _randn(3, 2, 4), "gelu", 0.0)),
        ("add", (x_plain, _randn(4, 1, 1))),
        ("scaled_dot_product_attention", (q, _randn(2, 1, 5, 8, grad=True), kv, mask, *attention_options)),
        (
            "scaled_dot_product_attention_backward",
            (
                _randn(*q.shape),
                q.detach(),
                kv.detach(),
                kv.detach(),
                out.detach(),
                stats,
                mask.detach(),
                *(o.detach() if isinstance(o, torch.Tensor) else o for o in attention_options),
                True,
            ),
        ),
        ("scaled_dot_product_attention_fp8", (q8, kv8, kv8, *factors, *fp8_options)),
        (
            "scaled_dot_product_attention_fp8_backward",
            (do8, q8, kv8, kv8, out8, torch.randn(2, 4, 6), *backward_factors, *fp8_options),
        ),
    ]


SAMPLES = samples()


def _id(sample):
    return sample[0]


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{name}-{k}" for k, (name, _) in enumerate(SAMPLES)])
def test_opcheck_passes(sample):
    name, args = sample
    fp8 = any(isinstance(a, torch.Tensor) and a.dtype in FP8_TYPES for a in args)
    torch.library.opcheck(getattr(ops, name).default, args, test_utils=WITHOUT_SCHEMA if fp8 else DEFAULT_CHECKS)


@pytest.mark.parametrize("sample", SAMPLES, ids=[f"{name}-{k}" for k, (name, _) in enumerate(SAMPLES)])
def test_fake_outputs_have_the_real_ones_shapes_dtypes_and_strides(sample):
    name, args = sample
    op = getattr(ops, name).default
    with torch.no_grad():
        real = op(*args)
    with torch._subclasses.FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
    real, fake = (r if isinstance(r, (tuple, list)) else (r,) for r in (real, fake))
    for r, f in zip(real, fake, strict=True):
        assert (f.shape, f.dtype, f.stride()) == (r.shape, r.dtype, r.stride())


def test_every_operator_has_a_sample():
    declared = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("opendnn::")}
    assert declared == {f"opendnn::{name}" for name, _ in SAMPLES}


def test_an_opendnn_error_is_also_torchs_exception_type():
    with pytest.raises(RuntimeError, match=r"must equal") as caught:
        ops.convolution(_randn(1, 3, 5, 5), _randn(4, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], 1)
    assert isinstance(caught.value, BadParam) and "RuntimeError" in [c.__name__ for c in type(caught.value).__mro__]


def test_an_empty_batch_gives_empty_outputs_and_zero_parameter_gradients():
    x = torch.randn(0, 3, 5, 5, requires_grad=True)
    weight, bias = torch.randn(4, 3, 3, 3, requires_grad=True), torch.randn(4, requires_grad=True)
    y = ops.convolution(x, weight, bias, [1, 1], [1, 1], [1, 1], 1)
    assert y.shape == (0, 4, 5, 5)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(weight.grad, torch.zeros_like(weight))
    assert torch.equal(bias.grad, torch.zeros_like(bias))


def test_an_empty_sum_gives_the_bias_and_an_empty_spatial_dim_is_refused():
    """No input feature or channel: each output is an empty sum plus the bias (it was 0, the bias
    dropped); a convolution over an empty spatial dim is refused as torch refuses it."""
    x, weight, bias = torch.randn(2, 0, dtype=torch.float64), torch.randn(3, 0, dtype=torch.float64), torch.randn(3)
    bias = bias.double()
    torch.testing.assert_close(ops.linear(x, weight, bias), TF.linear(x, weight, bias), rtol=0, atol=0)
    assert torch.equal(ops.linear(x, weight, None), torch.zeros(2, 3, dtype=torch.float64))
    images, filters = torch.randn(2, 0, 4, 4, dtype=torch.float64), torch.randn(3, 0, 3, 3, dtype=torch.float64)
    y = ops.convolution(images, filters, bias, [1, 1], [1, 1], [1, 1], 1)
    assert torch.equal(y, bias.view(1, 3, 1, 1).expand(2, 3, 4, 4))
    with pytest.raises(RuntimeError, match=r"x.shape=\[2, 3, 0, 5\]: an empty batch or channel dim is taken"):
        ops.convolution(torch.randn(2, 3, 0, 5), torch.randn(4, 3, 3, 3), None, [1, 1], [2, 2], [1, 1], 1)


def test_a_second_derivative_raises_instead_of_giving_a_wrong_zero():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(ops.activation(x, "gelu", []).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="opendnn::activation_backward has no gradient"):
        torch.autograd.grad(gradient.sum(), x)


def test_a_second_derivative_through_a_product_reduction_names_the_product():
    """A linear layer's bias gradient and a broadcast operand's gradient of matmul are sums of the
    output gradient: a second derivative through them is refused naming the product called, while
    the first derivatives match torch's in float64."""
    torch.manual_seed(0)
    x, weight, bias = (
        torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((2, 3, 5), (4, 5), (4,))
    )
    layer = torch.nn.Linear(5, 4, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(weight), layer.bias.copy_(bias)
    model = torch.nn.Sequential(layer)
    opendnn.torch.convert(model)
    converted = model[0]
    assert type(converted).__module__ == "opendnn.torch.modules"
    gradients = torch.autograd.grad(converted(x).square().sum(), (x, converted.bias), create_graph=True)
    expected = torch.autograd.grad(torch.nn.functional.linear(x, weight, bias).square().sum(), (x, bias))
    for gradient, reference in zip(gradients, expected):
        torch.testing.assert_close(gradient, reference, rtol=1e-12, atol=1e-12)
    with pytest.raises(NotSupported, match=r"^opendnn::linear_backward_bias has no gradient"):
        torch.autograd.grad(gradients[1].sum(), x)
    a, b = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True), torch.randn(4, 5, dtype=torch.float64)
    (gradient,) = torch.autograd.grad(ops.matmul(a, b.requires_grad_()).square().sum(), b, create_graph=True)
    torch.testing.assert_close(gradient, torch.autograd.grad((a @ b).square().sum(), b)[0], rtol=1e-12, atol=1e-12)
    with pytest.raises(NotSupported, match=r"^opendnn::matmul_backward_sum has no gradient"):
        torch.autograd.grad(gradient.sum(), a)
