"""GPU tests of the normalization families (``pytest -m gpu``): the Pythonic API against torch on the device, at
transformer and ResNet sizes, in float32 and bfloat16."""

import pytest
import torch
import torch.nn.functional as TF

import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _close(actual, expected, dtype):
    assert actual.device.type == "cuda"
    error = relative_error(actual, expected)
    assert error < TOLERANCE[dtype], f"relative error {error:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cols", [4096, 1000, 12288])  # whole row in registers, odd width, streamed row
def test_layer_and_rms_norm_match_torch_on_gpu(dtype, cols):
    x = torch.randn(512, cols, device=DEVICE, dtype=dtype) + 0.5  # off-centre: RMS norm differs from layer norm
    dy = torch.randn_like(x)
    w = (1 + 0.1 * torch.randn(cols, device=DEVICE)).to(dtype).requires_grad_()
    b = (0.1 * torch.randn(cols, device=DEVICE)).to(dtype).requires_grad_()
    xr = x.double().requires_grad_()
    expected = TF.layer_norm(xr, (cols,), w.double(), b.double())
    _close(F.layer_norm(x, cols, w.detach(), b.detach()), expected, dtype)
    expected.backward(dy.double())
    dx, dw, db = F.layer_norm_backward(dy, x, cols, w.detach())
    _close(dx, xr.grad, dtype)
    _close(dw, TF.layer_norm(x.double(), (cols,)).mul(dy.double()).sum(0), dtype)
    _close(db, dy.double().sum(0), dtype)
    xr.grad = None
    expected = TF.rms_norm(xr, (cols,), w.double(), 1e-6)
    _close(F.rms_norm(x, cols, w.detach(), 1e-6), expected, dtype)
    expected.backward(dy.double())
    dx, _ = F.rms_norm_backward(dy, x, cols, w.detach(), 1e-6)
    _close(dx, xr.grad, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_instance_and_lrn_match_torch_on_gpu(dtype, channels_last):
    x = torch.randn(8, 64, 28, 28, device=DEVICE, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(64, device=DEVICE, dtype=dtype), torch.randn(64, device=DEVICE, dtype=dtype)
    _close(F.group_norm(x, 8, w, b), TF.group_norm(x.double(), 8, w.double(), b.double()), dtype)
    _close(F.instance_norm(x, w, b), TF.instance_norm(x.double(), weight=w.double(), bias=b.double()), dtype)
    y = F.local_response_norm(x, 5, 1e-3, 0.75, 2.0)
    assert y.stride() == x.stride()
    _close(y, TF.local_response_norm(x.double(), 5, 1e-3, 0.75, 2.0), dtype)
    xr = x.double().requires_grad_()
    dy = torch.randn_like(x)
    TF.local_response_norm(xr, 5, 1e-3, 0.75, 2.0).backward(dy.double())
    _close(F.local_response_norm_backward(dy, x, 5, 1e-3, 0.75, 2.0), xr.grad, dtype)
