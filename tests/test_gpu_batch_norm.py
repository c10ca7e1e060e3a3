"""Batch normalization on a CUDA device (``pytest -m gpu``): the family's samples at real sizes and
the Pythonic API against torch (cuDNN) on the device."""

import zlib

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import batch_norm, relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
SAMPLES = list(batch_norm.samples("large"))
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def error(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_batch_norm_sample_matches_float64_reference_on_gpu(sample):
    actual, expected = sample.run(od.create(DEVICE), seed=zlib.crc32(sample.name.encode()))
    assert relative_error(actual, expected) <= sample.tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_training_forward_and_backward_match_torch_on_gpu(dtype, channels_last):
    x = torch.randn(32, 96, 28, 28, device=DEVICE).mul_(2).add_(1).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.rand(96, device=DEVICE) + 0.5
    bias = torch.randn(96, device=DEVICE)
    mean, var = torch.zeros(96, device=DEVICE), torch.ones(96, device=DEVICE)
    torch_mean, torch_var = mean.clone(), var.clone()
    for _ in range(3):
        y = F.batch_norm(x, mean, var, weight, bias, training=True)
        expected = TF.batch_norm(x.double(), torch_mean.double(), torch_var.double(), weight.double(), bias.double(),
                                 True)
        TF.batch_norm(x.float(), torch_mean, torch_var, weight, bias, True)
    assert y.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert error(y, expected) < TOLERANCE[dtype]
    assert error(mean, torch_mean) < 1e-5 and error(var, torch_var) < 1e-5
    xr = x.double().requires_grad_()
    wr, br = weight.double().requires_grad_(), bias.double().requires_grad_()
    dy = torch.randn_like(x)
    TF.batch_norm(xr, None, None, wr, br, True).backward(dy.double())
    dx, dweight, dbias = F.batch_norm_backward(dy, x, weight)
    assert error(dx, xr.grad) < TOLERANCE[dtype]
    assert error(dweight, wr.grad) < 1e-4 and error(dbias, br.grad) < 1e-4


@pytest.mark.parametrize("channels_last", [False, True])
def test_training_forward_and_backward_are_bitwise_repeatable_on_gpu(channels_last):
    """The statistics are summed in slices added in a fixed order (no atomics): two calls give the same
    bits (NHWC: 196 slices, combined by 32 programs)."""
    x = torch.randn(64, 256, 28, 28, device=DEVICE).mul_(2).add_(1)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    weight, bias = torch.rand(256, device=DEVICE) + 0.5, torch.randn(256, device=DEVICE)
    runs = []
    for _ in range(2):
        y = F.batch_norm(x, None, None, weight, bias, training=True)
        runs.append((y, *F.batch_norm_backward(dy, x, weight)))
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_relu_matches_torch_on_gpu(dtype):
    x = torch.randn(32, 64, 28, 28, device=DEVICE, dtype=dtype).contiguous(memory_format=torch.channels_last)
    z = torch.randn_like(x)
    weight, bias = torch.rand(64, device=DEVICE) + 0.5, torch.randn(64, device=DEVICE)
    xr, zr = x.double().requires_grad_(), z.double().requires_grad_()
    wr, br = weight.double().requires_grad_(), bias.double().requires_grad_()
    pre_activation = TF.batch_norm(xr, None, None, wr, br, True) + zr
    expected = torch.relu(pre_activation)
    dy = torch.randn_like(x)
    y, state = F.batch_norm_add_activation(x, z, None, None, weight, bias, return_state=True)
    assert error(y, expected) < TOLERANCE[dtype]
    # relu's derivative taken where opendnn's forward put it: an element within rounding of 0 may fall
    # on either side, and one such flip moves dx by ~1/sqrt(numel) (the float64 graph knows nothing of it)
    pre_activation.backward(dy.double() * (y > 0))
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(dy, x, weight, state)
    assert error(dx, xr.grad) < 2 * TOLERANCE[dtype] and error(dz, zr.grad) < TOLERANCE[dtype]
    assert error(dweight, wr.grad) < 1e-3 and error(dbias, br.grad) < 1e-3
