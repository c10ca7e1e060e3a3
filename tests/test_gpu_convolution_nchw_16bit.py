"""NCHW bfloat16 and float16 convolutions on the GPU (``pytest -m gpu``), what an NCHW model under
autocast runs: ResNet-50-like layers in every direction, with the algorithm a call that names none
takes: 3x3 layers read by TMA from channels-last copies in the workspace (the filter copied too where
its channels lie apart), grouped ones (ResNeXt's, RegNetY's) by the narrow-group kernels over such
copies, 1x1 layers as products of the filter by each image. Exact operands of the
type; each result within twice its own rounding to the type of the float64 convolution, free of NaN,
and bitwise equal over two runs."""

import math

import pytest
import torch
import torch.nn.functional as TF

import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
LAYERS = {  # name: (batch, channels in, channels out, size, filter, stride, groups)
    "l1_3x3": (4, 64, 64, 56, 3, 1, 1),
    "l2_3x3_stride_2": (4, 128, 128, 56, 3, 2, 1),
    "l3_3x3": (8, 256, 256, 14, 3, 1, 1),
    "odd_channels": (4, 96, 80, 20, 3, 1, 1),
    "l1_1x1_up": (4, 64, 256, 56, 1, 1, 1),
    "l3_1x1_down": (8, 1024, 256, 14, 1, 1, 1),
    "resnext_32_groups": (4, 256, 256, 28, 3, 1, 32),
    "regnety_4_groups": (4, 224, 224, 28, 3, 1, 4),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("direction", ["forward", "backward_data", "backward_filter"])
@pytest.mark.parametrize("name", LAYERS)
def test_nchw_16_bit_convolutions_within_their_rounding(name, direction, dtype, planned_convolutions):
    n, c, k, size, filt, stride, groups = LAYERS[name]
    pad = filt // 2
    generator = torch.Generator().manual_seed(c + size)
    out = (size + 2 * pad - filt) // stride + 1
    x = torch.randn(n, c, size, size, generator=generator).to(DEVICE, dtype)
    w = (torch.randn(k, c // groups, filt, filt, generator=generator) / math.sqrt(filt * filt * c // groups)).to(
        DEVICE, dtype
    )
    dy = torch.randn(n, k, out, out, generator=generator).to(DEVICE, dtype)
    x64, w64, dy64 = x.double(), w.double(), dy.double()
    if direction == "forward":
        want = TF.conv2d(x64, w64, stride=stride, padding=pad, groups=groups)
        run = lambda: F.conv(x, w, stride=stride, padding=pad, groups=groups)  # noqa: E731
    elif direction == "backward_data":
        want = torch.nn.grad.conv2d_input(x.shape, w64, dy64, stride=stride, padding=pad, groups=groups)
        run = lambda: F.conv_backward_data(dy, w, x.shape, stride, pad, groups=groups)  # noqa: E731
    else:
        want = torch.nn.grad.conv2d_weight(x64, w.shape, dy64, stride=stride, padding=pad, groups=groups)
        run = lambda: F.conv_backward_filter(x, dy, w.shape, stride, pad, groups=groups)  # noqa: E731
    got = run()
    assert got.dtype == dtype and not got.isnan().any()
    bound = 2 * relative_error(want.to(dtype), want)  # the output's rounding (the operands are exact)
    assert relative_error(got, want) < bound, (relative_error(got, want), bound)
    assert torch.equal(got, run())
    if filt == 3 and (direction != "backward_filter" or stride == 1):
        assert "staging_kernel" in planned_convolutions[0][2], planned_convolutions
