"""Resampling by interpolation: the float64 reference against torch on the CPU (every mode, 1-3 spatial
dims, sizes and scale factors, aligned corners), the Pythonic API on both backends (Triton through its
interpreter) against torch, the backward's candidate window over many ratios, and error messages."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.families.resample.problem import InterpolationMode, reference, resample_problem

BACKENDS = ["numpy", "triton"]
TORCH_MODES = {
    "nearest": InterpolationMode.NEAREST,
    "nearest-exact": InterpolationMode.NEAREST_EXACT,
    "linear": InterpolationMode.LINEAR,
    "bicubic": InterpolationMode.CUBIC,  # (torch's for 2 spatial dims only)
}
LINEAR_NAMES = {3: "linear", 4: "bilinear", 5: "trilinear"}
# (x shape, size, scale_factor): one of the last two given
GEOMETRIES = [
    ((2, 3, 9), (4,), None),
    ((2, 3, 5), None, (2.5,)),
    ((2, 3, 5, 7), (10, 14), None),
    ((2, 3, 5, 7), None, (1.7, 0.6)),
    ((2, 2, 7, 5), (3, 11), None),
    ((1, 2, 3, 4, 5), (5, 8, 3), None),
    ((1, 2, 3, 4, 5), None, (2.0, 0.5, 3.0)),
    ((2, 3, 1, 6), (3, 4), None),
]


def random(shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def torch_mode(name, ndim):
    return LINEAR_NAMES[ndim] if name == "linear" else name


def test_area_is_the_adaptive_average():
    """mode='area' is torch's adaptive average pooling, forward and backward."""
    x = random((2, 3, 10, 7), dtype=torch.float32)
    dy = random((2, 3, 4, 5), 1, torch.float32)
    x_grad = x.clone().requires_grad_()
    TF.interpolate(x_grad, size=(4, 5), mode="area").backward(dy)
    torch.testing.assert_close(F.interpolate(x, (4, 5), mode="area"), TF.interpolate(x, size=(4, 5), mode="area"))
    torch.testing.assert_close(F.interpolate_backward(dy, x, (4, 5), mode="area"), x_grad.grad)


def descriptor(t):
    return od.TensorDescriptor(t.dtype, t.shape, t.stride())


def torch_forward_backward(x, dy_seed, name, size, scale_factor, align_corners):
    """torch's y and dx (for a random dy) of x."""
    x = x.detach().clone().requires_grad_()
    y = TF.interpolate(
        x, size=size, scale_factor=scale_factor, mode=torch_mode(name, x.ndim), align_corners=align_corners
    )
    dy = random(y.shape, dy_seed, x.dtype)
    y.backward(dy)
    return y.detach(), dy, x.grad


def aligned_cases():
    for name in TORCH_MODES:
        for align_corners in [None] if name.startswith("nearest") else [False, True]:
            yield name, align_corners


@pytest.mark.parametrize(
    "shape, size, scale_factor, name, align_corners",
    [
        (*geometry, *case)
        for geometry in GEOMETRIES
        for case in aligned_cases()
        if case[0] != "bicubic" or len(geometry[0]) == 4  # (torch's bicubic takes 2 spatial dims)
    ],
)
def test_reference_matches_torch_forward_and_backward(shape, size, scale_factor, name, align_corners):
    x = random(shape)
    y, dy, dx = torch_forward_backward(x, 1, name, size, scale_factor, align_corners)
    exact = scale_factor is not None and not align_corners
    scales = tuple(1 / f for f in scale_factor) if exact else None
    for backward, source, out, expected in ((False, x, y, y), (True, dy, dx, dx)):
        descs = (descriptor(source), descriptor(out))
        problem = resample_problem(
            TORCH_MODES[name], ("a", "b"), descs, scales=scales, align_corners=bool(align_corners), backward=backward
        )
        np.testing.assert_allclose(reference(problem, source.numpy()), expected.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, align_corners", list(aligned_cases()))
@pytest.mark.parametrize("shape, size, scale_factor", GEOMETRIES[2:5])
def test_interpolate_matches_torch_in_float32_channels_last(shape, size, scale_factor, name, align_corners, backend):
    """torch computes the coordinates in float32 as opendnn does: the nearest modes pick the same pixels
    (equal values), the linear ones the same weights to rounding; the backward's sums to rounding (torch
    adds the gradients of an input in another order)."""
    handle = od.Handle(backend=backend)
    x = random(shape, dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    y, dy, dx = torch_forward_backward(x, 2, name, size, scale_factor, align_corners)
    mode = torch_mode(name, x.ndim)
    aligned = {} if align_corners is None else {"align_corners": align_corners}
    ours = F.interpolate(x, size, scale_factor, mode, handle=handle, **aligned)
    ours_dx = F.interpolate_backward(dy, x, size, scale_factor, mode, handle=handle, **aligned)
    assert ours.stride() == y.stride() and ours_dx.stride() == x.stride()
    tolerance = 0.0 if name.startswith("nearest") else 2e-6
    torch.testing.assert_close(ours, y, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(ours_dx, dx, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["nearest", "nearest-exact", "linear", "bicubic"])
def test_backward_window_holds_every_output_reading_an_input(name):
    """The backward's gather visits a window of candidate outputs per input; over many ratios (up by
    as much as 9x, down by as much as 7x) every gradient reaches its input: dx equals torch's."""
    handle = od.Handle(backend="triton")
    rng = np.random.default_rng(3)
    for case in range(40):
        length, out = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        if case % 4 == 0:
            out = length * int(rng.integers(2, 10))
        # torch's bicubic takes 2 spatial dims: the width, beside a height of 1
        x = random((1, 2, 1, length) if name == "bicubic" else (1, 2, length), case, torch.float32)
        size = (1, out) if name == "bicubic" else (out,)
        for align_corners in [None] if name.startswith("nearest") else [False, True]:
            _, dy, dx = torch_forward_backward(x, case, name, size, None, align_corners)
            aligned = {} if align_corners is None else {"align_corners": align_corners}
            ours = F.interpolate_backward(dy, x, size, None, torch_mode(name, x.ndim), handle=handle, **aligned)
            torch.testing.assert_close(ours, dx, rtol=2e-6, atol=2e-6, msg=f"{length} -> {out} {align_corners}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_coordinates_are_computed_in_the_compute_dtype(backend):
    """14 pixels resized to 46: output 23 reads floor(23 * 14/46), 6 in float32 (6.9999995) and 7 in
    float64, as torch reads it for each dtype."""
    handle = od.Handle(backend=backend)
    x = torch.arange(14, dtype=torch.float64).reshape(1, 1, 14)
    wide = F.interpolate(x, (46,), handle=handle)
    narrow = F.interpolate(x.float(), (46,), handle=handle)
    assert (wide[0, 0, 23].item(), narrow[0, 0, 23].item()) == (7.0, 6.0)
    torch.testing.assert_close(wide, TF.interpolate(x, size=(46,)), rtol=0, atol=0)
    torch.testing.assert_close(narrow, TF.interpolate(x.float(), size=(46,)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda h, x, y: od.resample_forward(h, "linear", 1.0, descriptor(x), x, 0.0, descriptor(y), y),
            od.BadParam,
            "resample_desc='linear' must be a ResampleDescriptor",
        ),
        (
            lambda h, x, y: od.resample_forward(
                h, od.ResampleDescriptor(od.InterpolationMode.LINEAR), 1.0, descriptor(x), x, 0.0, descriptor(y[:1]), y
            ),
            od.BadParam,
            "y_desc.dims=[1, 3, 8, 10] must be (N, C, *spatial) with x_desc.dims=[2, 3, 4, 5]'s N, C",
        ),
        (
            lambda h, x, y: od.resample_forward(
                h,
                od.ResampleDescriptor(od.InterpolationMode.LINEAR, scales=(0.5,)),
                1.0,
                descriptor(x),
                x,
                0.0,
                descriptor(y),
                y,
            ),
            od.BadParam,
            "scales=[0.5] must hold one scale per spatial dim (2)",
        ),
        (
            lambda h, x, y: od.resample_forward(
                h,
                od.ResampleDescriptor(od.InterpolationMode.LINEAR, scales=(0.5, -1.0)),
                1.0,
                descriptor(x),
                x,
                0.0,
                descriptor(y),
                y,
            ),
            od.BadParam,
            "scales[1]=-1.0 must be positive",
        ),
        (
            lambda h, x, y: od.resample_backward(
                h,
                od.ResampleDescriptor(od.InterpolationMode.NEAREST, align_corners=True),
                1.0,
                descriptor(y),
                y,
                0.0,
                descriptor(x),
                x,
            ),
            od.BadParam,
            "align_corners=True with mode NEAREST: only LINEAR and CUBIC align corners",
        ),
        (
            lambda h, x, y: od.resample_forward(
                h,
                od.ResampleDescriptor(od.InterpolationMode.NEAREST),
                1.0,
                descriptor(x.int()),
                x.int(),
                0.0,
                descriptor(y),
                y,
            ),
            od.NotSupported,
            "x_desc.dtype=INT32 must be FLOAT, DOUBLE, HALF or BFLOAT16",
        ),
    ],
)
def test_cudnn_shaped_calls_name_the_bad_parameter(call, error, message):
    x, y = random((2, 3, 4, 5), dtype=torch.float32), torch.full((2, 3, 8, 10), float("nan"))
    before = y.clone()
    with pytest.raises(error, match=re.escape(message)):
        call(od.Handle(backend="numpy"), x, y)
    torch.testing.assert_close(y, before, equal_nan=True)


def test_interpolate_refuses_antialiasing_by_name():
    with pytest.raises(od.NotSupported, match="antialias=True is not implemented"):
        F.interpolate(random((1, 1, 4, 4), dtype=torch.float32), scale_factor=0.5, mode="bilinear", antialias=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["nearest", "linear", "bicubic"])
def test_nan_and_infinities_reach_the_outputs_torchs_reach(backend, name):
    """A NaN or an infinity reaches every output that takes it as a tap, a tap of weight 0 included
    (0 * inf and 0 * NaN are NaN), forward and backward, as in torch. (Not an infinite gradient in the
    bicubic backward: where taps clamped at the border fall on one input with weights of both signs,
    torch adds inf and -inf, NaN, and opendnn inf times their summed weight: docs/design/resample.md.)"""
    x = random((2, 3, 6, 7), dtype=torch.float32)
    x[0, 1, 2, 3], x[1, 2, 5, 0], x[1, 0, 0, 6] = float("nan"), float("inf"), -float("inf")
    mode = torch_mode(name, 4)
    for size in [(12, 14), (4, 9)]:
        y, dy, _ = torch_forward_backward(x, 5, name, size, None, None)
        dy[0, 0, 1, 1], dy[1, 1, -1, -1] = float("nan"), float("inf") if name != "bicubic" else 5.0
        x_grad = x.detach().clone().requires_grad_()
        TF.interpolate(x_grad, size=size, mode=mode).backward(dy)
        handle = od.Handle(backend=backend)
        ours = F.interpolate(x, size, mode=mode, handle=handle)
        ours_dx = F.interpolate_backward(dy, x, size, mode=mode, handle=handle)
        torch.testing.assert_close(ours, y, rtol=2e-6, atol=2e-6, equal_nan=True)
        torch.testing.assert_close(ours_dx, x_grad.grad, rtol=1e-5, atol=1e-5, equal_nan=True)
