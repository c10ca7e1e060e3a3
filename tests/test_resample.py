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
import opendnn.graph as og
from opendnn.families.resample.problem import InterpolationMode, reference, resample_problem, source_taps
from opendnn.families.resample.triton_backend import resample_launches

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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode, size, scale_factor", [("bilinear", None, (1.5, 2.0)), ("area", (3, 4), None)])
def test_backward_takes_the_inputs_descriptor_in_place_of_the_input(mode, size, scale_factor, backend):
    """The backward reads the input's dims, dtype and strides alone: its descriptor gives the same dx,
    laid out in the input's memory order, on the first call of a signature and on the planned ones."""
    handle = od.Handle(backend=backend)
    x = random((2, 3, 7, 6), dtype=torch.float32).contiguous(memory_format=torch.channels_last)
    _, dy, dx = torch_forward_backward(x, 2, mode, size, scale_factor, None)
    for _ in range(2):
        ours = F.interpolate_backward(dy, descriptor(x), size, scale_factor, mode, handle=handle)
        assert ours.stride() == x.stride()
        torch.testing.assert_close(ours, dx, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_backward_window_holds_the_taps_of_sources_rounded_once_and_twice(dtype):
    """The backward's window per input (its lead and reach) holds every output whose taps include the
    input, where the half-pixel source ``s * (o + 0.5) - 0.5`` is rounded twice (the interpreter, the
    reference) and once (a GPU's fused multiply-add, which moves a tap in about 1% of ratios): over
    random ratios, every mode, aligned corners or not."""
    rng = np.random.default_rng(5)
    real = np.dtype(dtype).type
    for case in range(600):
        length, out = int(rng.integers(1, 60)), int(rng.integers(1, 80))
        mode = list(InterpolationMode)[case % len(InterpolationMode)]
        aligned = bool(case % 3 == 0) and mode.taps > 1
        dy, dx = od.TensorDescriptor(dtype, (1, 1, out)), od.TensorDescriptor(dtype, (1, 1, length))
        problem = resample_problem(mode, ("dy", "dx"), (dy, dx), backward=True, align_corners=aligned)
        launch = resample_launches(problem, None).launches[0]
        (lead, reach), step = (launch.args[9][-1], launch.args[10][-1]), launch.args[-3]
        ahead = mode.taps - 1 - mode.behind
        inputs = np.arange(length)
        start = np.maximum(np.floor((inputs - ahead).astype(real) * real(step)).astype(np.int64) + lead, 0)
        for fused in (False, True):
            taps = source_taps(mode, aligned, problem.scales[0], length, out, problem.compute_dtype, fused)
            for index, _ in taps:
                outputs = np.arange(out)
                inside = (start[index] <= outputs) & (outputs < start[index] + reach)
                assert inside.all(), (length, out, mode, aligned, fused, outputs[~inside])


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
    (0 * inf and 0 * NaN are NaN), forward and backward, as in torch; an infinite gradient too, NaN where
    bicubic's taps clamped at the border fall on one input with weights of both signs (inf - inf)."""
    x = random((2, 3, 6, 7), dtype=torch.float32)
    x[0, 1, 2, 3], x[1, 2, 5, 0], x[1, 0, 0, 6] = float("nan"), float("inf"), -float("inf")
    mode = torch_mode(name, 4)
    for size in [(12, 14), (4, 9)]:
        y, dy, _ = torch_forward_backward(x, 5, name, size, None, None)
        dy[0, 0, 1, 1], dy[1, 1, -1, -1] = float("nan"), float("inf")
        x_grad = x.detach().clone().requires_grad_()
        TF.interpolate(x_grad, size=size, mode=mode).backward(dy)
        handle = od.Handle(backend=backend)
        ours = F.interpolate(x, size, mode=mode, handle=handle)
        ours_dx = F.interpolate_backward(dy, x, size, mode=mode, handle=handle)
        torch.testing.assert_close(ours, y, rtol=2e-6, atol=2e-6, equal_nan=True)
        torch.testing.assert_close(ours_dx, x_grad.grad, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape, scale_factor, name",
    [
        ((2, 3, 6), (1.1,), "linear"),
        ((2, 3, 5, 6), (1.1, 2.5), "bilinear"),
        ((1, 2, 3, 4, 5), (1.3, 0.5, 1.1), "trilinear"),
    ],
)
def test_linear_modes_copy_a_dim_whose_size_is_unchanged(shape, scale_factor, name, backend):
    """A scale factor that leaves a dim's size (6 pixels times 1.1) copies it, as torch's kernels do:
    both taps on the output's own pixel with weights 1 and 0, so that a NaN stays in its column and an
    infinity there is NaN (inf * 1 + inf * 0), forward and backward."""
    x = random(shape)
    x[0, 0, ..., 1], x[-1, -1, ..., -1] = float("nan"), float("inf")
    y, dy, _ = torch_forward_backward(x, 3, name, None, scale_factor, None)
    dy[0, 1, ..., 2] = -float("inf")
    x_grad = x.detach().clone().requires_grad_()
    TF.interpolate(x_grad, scale_factor=scale_factor, mode=name).backward(dy)
    handle = od.Handle(backend=backend)
    ours = F.interpolate(x, scale_factor=scale_factor, mode=name, handle=handle)
    ours_dx = F.interpolate_backward(dy, x, scale_factor=scale_factor, mode=name, handle=handle)
    torch.testing.assert_close(ours, y, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(ours_dx, x_grad.grad, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["bilinear", "bicubic"])
def test_infinities_in_an_input_one_pixel_wide_reach_what_torchs_reach(name, backend):
    """Every tap of a dim one pixel wide reads that pixel: an infinity read with weights of 0 or of both
        signs is NaN (bicubic's border taps), with positive weights an infinity, forward and backward. (Sizes
    whose sources are exact in float32: torch's multiply-add rounds once where opendnn rounds twice.)"""
    x = random((2, 2, 1, 5), dtype=torch.float32)
    x[0, 0, 0, 1], x[1, 1, 0, 4] = float("inf"), -float("inf")
    y, dy, _ = torch_forward_backward(x, 4, name, (4, 8), None, None)
    dy[0, 0, 1, 2], dy[1, 0, 3, 7] = float("inf"), -float("inf")
    x_grad = x.detach().clone().requires_grad_()
    TF.interpolate(x_grad, size=(4, 8), mode=name).backward(dy)
    handle = od.Handle(backend=backend)
    ours = F.interpolate(x, (4, 8), mode=name, handle=handle)
    ours_dx = F.interpolate_backward(dy, x, (4, 8), mode=name, handle=handle)
    torch.testing.assert_close(ours, y, rtol=2e-6, atol=2e-6, equal_nan=True)
    torch.testing.assert_close(ours_dx, x_grad.grad, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "mode, x_shape, y_shape, scales",
    [
        ("NEAREST", (2, 3, 12), (2, 3, 6), (3.7,)),
        ("NEAREST_EXACT", (2, 3, 2, 2), (2, 3, 6, 7), (0.1, 2.0)),
        ("LINEAR", (1, 2, 2, 5), (1, 2, 9, 11), (0.5, 0.37)),
        ("LINEAR", (1, 2, 2, 1, 4), (1, 2, 1, 2, 8), (2.0, 2.0, 2.0)),
        ("CUBIC", (1, 2, 7, 2), (1, 2, 8, 12), (2.0, 0.5)),
    ],
)
def test_backward_of_given_scales_gathers_every_output_clamped_onto_an_input(mode, x_shape, y_shape, scales, backend):
    """Scales given apart from the sizes (3.7 input pixels per output, 12 pixels to 6) send several
    outputs past the input's last pixel, clamped onto it: its gradient gathers them all, as the float64
    reference adds them."""
    dy = random(y_shape, 6)
    dx = torch.full(x_shape, float("nan"), dtype=torch.float64)
    resample = od.ResampleDescriptor(od.InterpolationMode[mode], scales=scales)
    od.resample_backward(od.Handle(backend=backend), resample, 1.0, descriptor(dy), dy, 0.0, descriptor(dx), dx)
    problem = resample_problem(
        od.InterpolationMode[mode], ("dy", "dx"), (descriptor(dy), descriptor(dx)), scales=scales, backward=True
    )
    np.testing.assert_allclose(dx.numpy(), reference(problem, dy.numpy()), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["NEAREST", "NEAREST_EXACT", "LINEAR", "CUBIC"])
def test_scales_past_every_input_pixel_read_the_last_one(mode, backend):
    """A scale of 2^32 input pixels per output sends every output (but nearest's first, at 0) past the
    input's last pixel: the sources are clamped before they become integers, never read outside x. The
    nearest modes and cubic read that pixel (cubic's weights 0, 1, 0, 0 at a fraction of 0), and so does
    linear, its two taps on it weighing 0 and 1 (the fraction clamped to 1, as torch clamps it)."""
    x = random((2, 3, 4), dtype=torch.float32)
    y = torch.full((2, 3, 6), float("nan"))
    resample = od.ResampleDescriptor(od.InterpolationMode[mode], scales=(2.0**32,))
    od.resample_forward(od.Handle(backend=backend), resample, 1.0, descriptor(x), x, 0.0, descriptor(y), y)
    first = 1 if mode == "NEAREST" else 0
    expected = x[:, :, -1:].expand(2, 3, 6 - first)
    torch.testing.assert_close(y[:, :, first:], expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: F.interpolate(x, size=8, mode=["linear"]), "mode=['linear'] is not a mode"),
        (
            lambda x: F.interpolate_backward(random((1, 2, 5)), x, size=6, mode="area"),
            "grad_output.shape=[1, 2, 5] must be the forward's output shape [1, 2, 6]",
        ),
        (lambda x: F.interpolate_backward(None, x, size=6), "grad_output of type NoneType is not"),
        (lambda x: F.interpolate(x, size=2**62), "more than the 9223372036854775807 bytes a buffer can hold"),
        (
            lambda x: od.resample_forward(
                od.Handle(backend="numpy"),
                od.ResampleDescriptor(od.InterpolationMode.NEAREST, scales=(1e300,)),
                1.0,
                descriptor(x),
                x,
                0.0,
                descriptor(torch.empty(1, 2, 8)),
                torch.empty(1, 2, 8),
            ),
            "scales[0]=1e+300 must lie in [1.1754943508222875e-38, 3.4028234663852886e+38], FLOAT's normal range",
        ),
        (
            lambda x: graph_resample(x.shape, [float("nan")]),
            "stride[0]=nan must be finite",
        ),
    ],
)
def test_bad_interpolation_arguments_raise_errors_naming_them(call, message):
    with pytest.raises(od.BadParam, match=re.escape(message)):
        call(random((1, 2, 4), dtype=torch.float32))


def graph_resample(dims, stride):
    graph = og.Graph(handle=od.Handle("cpu"))
    return graph.resample(graph.tensor(dim=list(dims)), "BILINEAR", stride=stride)
