"""The boxed 16-bit backward filter (``filter_tma_kernel``) through Triton's interpreter, called by
``od.convolution_backward_filter``: each tap reads x through a descriptor of its window of x's phase
view (``triton_gemm.tap_view_window``), so the zeros of dy's boxes past OH and OW never meet a real x
pixel. An infinite x reaches only the taps that read it, as in the float64 reference, and a tap that
reads only padding gives zeros."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

import opendnn as od
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem, reference_backward_filter
from opendnn.samples import relative_error

BF16 = od.DataType.BFLOAT16


def descriptor(t):
    return od.TensorDescriptor(BF16, tuple(t.shape), t.stride())


def channels_last(n, c, h, w, seed):
    """An (N, C, H, W) bfloat16 channels-last tensor of random values in [-1, 1)."""
    values = torch.rand((n, c, h, w), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return values.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)


def backward_filter(monkeypatch, size, pre, post, stride, dilation, infinite, n=2, c=64, k=64, filt=(3, 3)):
    """dw (K, C, R, S, NaN before the call, its workspace's partial filters too) by the public call on
    the CPU's Triton backend, x infinite in image 0's last column and image 1's last row if
    ``infinite``; returns (dw, the float64 reference, the kernels launched)."""
    out = tuple(
        (s + a + b - d * (f - 1) - 1) // t + 1 for s, a, b, d, f, t in zip(size, pre, post, dilation, filt, stride)
    )
    x, dy = channels_last(n, c, *size, seed=1), channels_last(n, k, *out, seed=2)
    if infinite:
        x[0, :, :, -1] = math.inf
        x[1, :, -1, :] = -math.inf
    dw = torch.full((k, c, *filt), math.nan, dtype=torch.bfloat16)
    xd, dyd, dwd = descriptor(x), descriptor(dy), descriptor(dw)
    conv = od.ConvolutionDescriptor(pre, stride, dilation, pre_padding=pre, post_padding=post)
    handle = od.create("cpu", backend="triton")
    algo = od.ConvolutionBwdFilterAlgo.ALGO_0
    size_bytes = od.get_convolution_backward_filter_workspace_size(handle, xd, dyd, conv, dwd, algo)
    workspace = torch.full((max(size_bytes, 1),), 255, dtype=torch.uint8)  # partials start as NaN
    launched = []
    run = InterpretedFunction.run

    def recorded(self, *args, **kwargs):
        launched.append(self.fn.__name__)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recorded)
    with np.errstate(invalid="ignore"):  # 0 * inf in the taps that do read the infinite pixels
        od.convolution_backward_filter(handle, 1.0, xd, x, dyd, dy, conv, algo, workspace, 0.0, dwd, dw)
        problem = convolution_problem(ConvolutionDirection.BACKWARD_FILTER, conv, xd, dwd, dyd)
        want = reference_backward_filter(problem, x.double().numpy(), dy.double().numpy())
    return dw, torch.from_numpy(want), launched


# (size, pre padding, post padding, stride, dilation): dy's boxes run past OH and OW in all of them
LAYERS = {
    "6 x 7, stride 1": ((6, 7), (1, 1), (1, 1), (1, 1), (1, 1)),
    "12 x 14, stride 2": ((12, 14), (1, 1), (1, 1), (2, 2), (1, 1)),
    "2 x 8, dilation 3: taps (0, s) and (2, s) read only padding": ((2, 8), (3, 1), (3, 1), (1, 1), (3, 1)),
    "2 x 8, stride 2, pre padding 4: taps (0, s) and (1, s) read only padding": (
        (2, 8),
        (4, 1),
        (0, 1),
        (2, 2),
        (1, 1),
    ),
    "2 x 8, stride 2, post padding 4: taps (2, s) read only padding": ((2, 8), (0, 1), (4, 1), (2, 2), (1, 1)),
}


@pytest.mark.parametrize("infinite", [True, False], ids=["infinite x at the edges", "finite x"])
@pytest.mark.parametrize("layer", LAYERS)
def test_boxed_backward_filter_matches_float64_where_it_is_finite_and_zero_where_taps_read_padding(
    monkeypatch, layer, infinite
):
    dw, want, launched = backward_filter(monkeypatch, *LAYERS[layer], infinite=infinite)
    assert launched == ["filter_tma_kernel"]
    assert want.isfinite().any()
    # relative_error is inf unless dw is finite wherever float64 is, with its NaN and inf where float64's are
    assert relative_error(dw, want) < 1e-2, (relative_error(dw, want), int((dw.isnan() & want.isfinite()).sum()))
    assert (dw.double()[want == 0] == 0).all()  # the taps that read only padding
