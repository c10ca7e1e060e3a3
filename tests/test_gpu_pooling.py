"""GPU tests of pooling (``pytest -m gpu`` on a CUDA machine): the Pythonic API against torch on the device, and
bitwise-repeatable backward."""

import pytest
import torch
import torch.nn.functional as TF

import opendnn.functional as F
import opendnn.torch as ot
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _close(actual, expected, dtype):
    return relative_error(actual, expected) < TOLERANCE[dtype]


# opendnn.torch's call and torch's of the ops whose backward kernels read dy through its strides
STRIDED_GRADIENT_CALLS = {
    "max_pool": (lambda x: ot.functions.max_pool(x, 3, 2, 1), lambda x: TF.max_pool2d(x, 3, 2, 1)),
    "avg_pool": (lambda x: ot.functions.avg_pool(x, 3, 2, 1), lambda x: TF.avg_pool2d(x, 3, 2, 1)),
    "relu": (ot.functions.relu, TF.relu),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(STRIDED_GRADIENT_CALLS))
def test_a_stride_0_gradient_reaches_the_backward_kernels_as_it_comes_on_gpu(name, dtype):
    """``sum().backward()`` hands the backward a stride-0 expansion, which the pooling and relu
    kernels read as it comes: torch's gradient, in x's channels-last order, recorded and replayed. The
    float64 reference runs NCHW (torch 2.11's CUDA avg_pool2d backward on channels-last float64 ignores
    the padding)."""
    ours, theirs = STRIDED_GRADIENT_CALLS[name]
    x = torch.randn(16, 64, 56, 56, device=DEVICE, dtype=dtype).contiguous(memory_format=torch.channels_last)
    reference = x.double().contiguous().requires_grad_()
    theirs(reference).sum().backward()
    x.requires_grad_()
    for _ in range(3):
        x.grad = None
        ours(x).sum().backward()
        assert _close(x.grad, reference.grad, dtype) and x.grad.stride() == x.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_max_and_avg_pool_match_torch_on_gpu(dtype, channels_last):
    x = torch.randn(16, 64, 56, 56, device=DEVICE, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    xt = x.detach().clone().requires_grad_()
    expected = TF.max_pool2d(xt, 3, 2, 1)
    y = F.max_pool(x, 3, 2, 1)
    assert y.device == x.device and y.dtype == dtype and torch.equal(y, expected.detach())
    assert y.is_contiguous(memory_format=torch.channels_last) == channels_last
    dy = torch.randn_like(y)
    expected.backward(dy)
    assert _close(F.max_pool_backward(dy, x, y, 3, 2, 1), xt.grad, dtype)
    for ceil_mode, include in ((False, True), (True, False)):
        # the float64 reference runs NCHW: torch 2.11's CUDA avg_pool2d backward on channels_last
        # float64 ignores the padding (its dx comes out shifted by one position in H and W)
        xt = x.detach().double().contiguous().requires_grad_()
        expected = TF.avg_pool2d(xt, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=include)
        y = F.avg_pool(x, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=include)
        assert _close(y, expected.detach(), dtype)
        dy = torch.randn_like(y)
        expected.backward(dy.double().contiguous())
        dx = F.avg_pool_backward(dy, x, 3, 2, 1, ceil_mode=ceil_mode, count_include_pad=include)
        assert _close(dx, xt.grad, dtype)


@pytest.mark.parametrize("output_size", [1, 7, (5, 6)])
def test_adaptive_pools_match_torch_on_gpu(output_size):
    x = torch.randn(8, 32, 28, 28, device=DEVICE)
    assert torch.equal(F.adaptive_max_pool(x, output_size), TF.adaptive_max_pool2d(x, output_size))
    torch.testing.assert_close(F.adaptive_avg_pool(x, output_size), TF.adaptive_avg_pool2d(x, output_size))


@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True)])
@pytest.mark.parametrize(
    "shape, output_size",
    [((8, 512, 10, 10), (7, 7)), ((8, 64, 13, 12), (5, 12)), ((4, 32, 9, 6, 7), (5, 3, 4)), ((8, 16, 5, 3), (7, 7))],
)
def test_adaptive_pools_of_varying_cells_match_torch_on_gpu(shape, output_size, dtype, channels_last):
    """Cells of more than one size or step (VGG's 10 x 10 -> 7 x 7, beside a dim of one cell a position, 3-D,
    outputs larger than the input) as one pooling: forward and backward against torch's, max exactly."""
    x = torch.randn(shape, device=DEVICE, dtype=dtype).round()  # ties
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last if x.ndim == 4 else torch.channels_last_3d)
    spatial = len(shape) - 2
    for ours, backward, theirs in (
        (F.adaptive_max_pool, F.adaptive_max_pool_backward, getattr(TF, f"adaptive_max_pool{spatial}d")),
        (F.adaptive_avg_pool, F.adaptive_avg_pool_backward, getattr(TF, f"adaptive_avg_pool{spatial}d")),
    ):
        is_max = ours is F.adaptive_max_pool
        xt = (x if is_max else x.double()).detach().requires_grad_()
        expected = theirs(xt, output_size)
        y = ours(x, output_size)
        assert torch.equal(y, expected.detach()) if is_max else _close(y, expected.detach(), dtype)
        dy = torch.randn_like(y)
        expected.backward(dy.to(expected.dtype))
        dx = backward(dy, x, y) if is_max else backward(dy, x)
        assert dx.stride() == x.stride() and _close(dx, xt.grad, dtype)


@pytest.mark.parametrize(
    "shape, dtype, channels_last",
    [
        ((2, 32, 112, 112), torch.float32, False),
        ((2, 32, 112, 112), torch.bfloat16, False),
        ((64, 256, 7, 7), torch.float32, False),
        ((2, 32, 112, 112), torch.bfloat16, True),
    ],
)
def test_global_max_pool_backward_matches_the_first_tie_on_gpu(shape, dtype, channels_last):
    """NCHW: the line kernels (cells by runs of their positions), few outputs (2 x 32) of 112 x 112 positions in
    runs over a second grid axis, many of 7 x 7 (scalar loads: rows of 49 positions are not 16-byte aligned);
    channels-last: the argmax pass in slices of the window and the gather in runs of the phases. With ties, dy
    goes to the first position equal to y."""
    x = torch.randn(shape, device=DEVICE).round().to(dtype)  # ties
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = F.adaptive_max_pool(x, 1)
    dy = torch.randn_like(y)
    first = (x.flatten(2) == y.flatten(2)).int().argmax(2, keepdim=True)  # the first position equal to y
    expected = torch.zeros_like(x).flatten(2).scatter_(2, first, dy.flatten(2)).view_as(x)
    dx = F.adaptive_max_pool_backward(dy, x, y)
    assert torch.equal(dx, expected) and dx.stride() == x.stride()
    assert torch.equal(F.max_pool_backward(dy, x, y, shape[2:]), dx)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, False), (torch.bfloat16, True)])
def test_max_pool_backward_is_bitwise_repeatable_on_gpu(stride, dtype, channels_last):
    """Ties everywhere; stride 2 sums up to 4 windows per dx element in the window-major gather, and
    bf16 channels-last takes the doubled (NARROW_SCALE) tiles."""
    x = torch.randn(8, 64, 56, 56, device=DEVICE).round().to(dtype)  # many ties
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = F.max_pool(x, 3, stride, 1)
    dy = torch.randn_like(y)
    first = F.max_pool_backward(dy, x, y, 3, stride, 1)
    assert all(torch.equal(first, F.max_pool_backward(dy, x, y, 3, stride, 1)) for _ in range(3))
    xt = x.float().requires_grad_()
    TF.max_pool2d(xt, 3, stride, 1).backward(dy.float())
    torch.testing.assert_close(first, xt.grad.to(dtype))


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_small_tiles_and_int64_offsets_on_gpu(monkeypatch, channels_last, wide):
    """Tiles whose rows wrap across dims (compare-and-carry row coordinates) and the int64 offsets
    (forced) against torch on the device."""
    from opendnn.families.pooling import triton_backend as kernels

    monkeypatch.setattr(kernels, "FORWARD_TILE", 64)
    monkeypatch.setattr(kernels, "ARGMAX_TILE", 64)
    monkeypatch.setattr(kernels, "BACKWARD_TILE", 32)
    monkeypatch.setattr(kernels, "_wide", lambda *strides: wide)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()
    x = torch.randn(3, 5, 7, 13, 11, device=DEVICE)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    xt = x.clone().requires_grad_()
    expected = TF.max_pool3d(xt, (2, 3, 3), (1, 2, 2), (0, 1, 1))
    y = F.max_pool(x, (2, 3, 3), (1, 2, 2), (0, 1, 1))
    assert torch.equal(y, expected.detach())
    dy = torch.randn_like(y)
    expected.backward(dy)
    torch.testing.assert_close(F.max_pool_backward(dy, x, y, (2, 3, 3), (1, 2, 2), (0, 1, 1)), xt.grad)
    xt = x.clone().requires_grad_()
    expected = TF.avg_pool3d(xt, 3, 2, 1, count_include_pad=False)
    torch.testing.assert_close(F.avg_pool(x, 3, 2, 1, count_include_pad=False), expected.detach())
    dy = torch.randn_like(expected)
    expected.backward(dy)
    torch.testing.assert_close(F.avg_pool_backward(dy, x, 3, 2, 1, count_include_pad=False), xt.grad)
    kernels._forward_config.cache_clear()
    kernels._backward_config.cache_clear()
