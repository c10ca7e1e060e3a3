"""Softmax on the GPU (``pytest -m gpu``): the Pythonic API against torch on the device (rows of 4096, a row of
1,048,576, CHANNEL on NCHW and NHWC, bfloat16), and the special rows through both kernels."""

import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, dim, channels_last",
    [
        ((4096, 4096), -1, False),
        ((3, 1 << 20), 1, False),
        ((64, 1000, 7, 7), 1, False),
        ((64, 1000, 7, 7), 1, True),
        ((512, 77), 0, False),
    ],
)
def test_softmax_forward_and_backward_match_torch_on_gpu(shape, dim, channels_last, dtype):
    x = 3 * torch.randn(shape, device=DEVICE, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    for ours, ours_backward, theirs in (
        (F.softmax, F.softmax_grad, torch.softmax),
        (F.log_softmax, F.log_softmax_grad, torch.log_softmax),
    ):
        y = ours(x, dim)
        assert y.dtype == dtype and y.shape == x.shape
        expected = theirs(x.double(), dim)
        assert relative_error(y, expected) < TOLERANCE[dtype]
        y64, dy64 = y.double(), dy.double()  # the backward from our own y, in float64
        if theirs is torch.softmax:
            expected_dx = y64 * (dy64 - (dy64 * y64).sum(dim, keepdim=True))
        else:
            expected_dx = dy64 - torch.exp(y64) * dy64.sum(dim, keepdim=True)
        assert relative_error(ours_backward(dy, y, dim), expected_dx) < TOLERANCE[dtype]


@pytest.mark.parametrize("length", [7, 4096, 1 << 20])
def test_special_rows_on_gpu(length):
    x = torch.linspace(-2, 2, 4 * length, device=DEVICE).reshape(4, length)
    x[0] = float("-inf")
    x[1, length // 2] = float("nan")
    x[2] = x[2] + 1000.0
    handle = od.create(DEVICE)
    desc = od.TensorDescriptor("float32", x.shape)
    for algo in od.SoftmaxAlgorithm:
        y = torch.full_like(x, float("nan"))
        od.softmax_forward(handle, algo, od.SoftmaxMode.INSTANCE, 1.0, desc, x, 0.0, desc, y)
        assert torch.isnan(y[:2]).all()
        assert torch.isnan(y[2]).all() if algo is od.SoftmaxAlgorithm.FAST else torch.isfinite(y[2]).all()
        expected = (torch.log_softmax if algo is od.SoftmaxAlgorithm.LOG else torch.softmax)(x[3:].double(), 1)
        assert relative_error(y[3:], expected) < 1e-5
