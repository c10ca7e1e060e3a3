"""GPU tests of resampling (``pytest -m gpu`` on a CUDA machine): interpolation against torch's CUDA kernels
on real sizes, forward and backward, and a backward that repeats bit for bit (torch's adds atomically)."""

import pytest
import torch
import torch.nn.functional as TF

import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
# (mode, x shape, size or None, scale factor or None, align_corners)
CASES = [
    ("bilinear", (16, 64, 56, 56), None, 2.0, None),
    ("nearest", (16, 64, 56, 56), None, 2.0, None),
    ("bilinear", (16, 64, 56, 56), None, 0.5, None),
    ("bilinear", (8, 32, 45, 61), (97, 40), None, True),
    ("nearest-exact", (8, 32, 45, 61), (97, 40), None, None),
    ("trilinear", (2, 32, 8, 28, 28), None, (2.0, 2.0, 2.0), None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("mode, shape, size, scale_factor, align_corners", CASES)
def test_interpolate_matches_torch_on_gpu(mode, shape, size, scale_factor, align_corners, channels_last, dtype):
    """Forward and backward against torch's float64 on the device; the backward twice, bit for bit."""
    x = torch.randn(shape, device=DEVICE, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)
    options = dict(size=size, scale_factor=scale_factor, mode=mode)
    aligned = {} if align_corners is None else {"align_corners": align_corners}
    reference = x.double().requires_grad_()
    expected = TF.interpolate(reference, **options, **aligned)
    dy = torch.randn(expected.shape, device=DEVICE, dtype=dtype)
    expected.backward(dy.double())
    y = F.interpolate(x, **options, **aligned)
    dx = F.interpolate_backward(dy, x, **options, **aligned)
    assert y.dtype == dtype and y.stride() == torch.empty_like(expected, dtype=dtype).stride()
    assert relative_error(y, expected) < TOLERANCE[dtype]
    assert relative_error(dx, reference.grad) < TOLERANCE[dtype] and dx.stride() == x.stride()
    assert torch.equal(dx, F.interpolate_backward(dy, x, **options, **aligned))
