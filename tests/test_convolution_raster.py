"""The TF32 backward filter over pixel-major rasters (``triton_raster``) through Triton's interpreter:
the rasters hold x and dy rounded to TF32 with zeros where the padding and the pitch are, and the
filter they give matches torch's float64 gradient to TF32's precision in any layout, sub-region,
stride, dilation, padding, mode and beta."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import triton.language as tl
from test_convolution_tf32_staging import tf32_nearest
from test_gluon_convolution import problem as gluon_problem

import opendnn as od
from opendnn.core.arrays import Bound
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution import triton_raster as raster
from opendnn.families.convolution.problem import ConvolutionDirection, ConvolutionProblem
from opendnn.kernels.device import programs_to_fill
from opendnn.samples import relative_error

FILTER = ConvolutionDirection.BACKWARD_FILTER
FP32 = od.DataType.FLOAT
TF32_ERROR = 2e-3  # operands rounded to TF32 (2**-11 relative), float32 sums


def activation(n, c, size, channels_last, margin, seed):
    """An (N, C, H, W) float32 view with random values inside a NaN buffer ``margin`` rows taller and
    channels wider (the view starts one row and one channel in): a sub-region of a larger tensor."""
    h, w = size
    if channels_last:
        buffer = torch.full((n, h + margin, w, c + margin), math.nan)
        view = buffer[:, margin:, :, margin:].permute(0, 3, 1, 2)
    else:
        buffer = torch.full((n, c + margin, h + margin, w), math.nan)
        view = buffer[:, margin:, margin:]
    view.copy_(torch.rand((n, c, h, w), generator=torch.Generator().manual_seed(seed)) * 2 - 1)
    return view


def bound(name, view):
    return Bound(name, od.TensorDescriptor(FP32, tuple(view.shape), view.stride()), view, "cpu")


def filter_problem(
    n=2,
    c=64,
    size=(6, 7),
    k=64,
    filt=(3, 3),
    pre=(1, 1),
    post=None,
    stride=(1, 1),
    dilation=(1, 1),
    channels_last=False,
    margin=0,
    flip=False,
    beta=0.0,
):
    """(problem, x, dy, dw): a TF32 backward filter and its tensors, dw NaN (or random for beta)."""
    post = post or pre
    out = tuple(
        (s + a + b - d * (f - 1) - 1) // t + 1 for s, a, b, d, f, t in zip(size, pre, post, dilation, filt, stride)
    )
    x = activation(n, c, size, channels_last, margin, seed=1)
    dy = activation(n, k, out, channels_last, margin, seed=3)
    dw = torch.empty((k, c, *filt))
    if channels_last:
        dw = dw.contiguous(memory_format=torch.channels_last)
    dw.copy_(torch.rand(dw.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1 if beta else math.nan)
    mode = od.ConvolutionMode.CONVOLUTION if flip else od.ConvolutionMode.CROSS_CORRELATION
    problem = ConvolutionProblem(
        FILTER,
        bound("x", x).desc,
        bound("w", dw).desc,
        bound("y", dy).desc,
        pre,
        post,
        stride,
        dilation,
        groups=1,
        flip=mode is od.ConvolutionMode.CONVOLUTION,
        compute_type=FP32,
        allow_tf32=True,
        algo=od.ConvolutionBwdFilterAlgo.ALGO_0,
        alpha=0.75,
        beta=beta,
    )
    return problem, x, dy, dw


def poisoned_workspace(problem):
    size = kernels.workspace_size(problem)
    if size == 0:
        return None
    space = torch.full((size,), 255, dtype=torch.uint8)  # every float32 in it NaN
    return Bound("workspace", od.TensorDescriptor(od.DataType.UINT8, (size,)), space, "cpu")


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("NCHW 3x3 pad 1", dict()),
        ("NHWC 3x3 pad 1, true convolution, beta", dict(channels_last=True, flip=True, beta=0.5)),
        ("sub-regions of x and dy, NCHW", dict(margin=2)),
        ("sub-regions, NHWC, 128 input channels", dict(channels_last=True, margin=1, c=128, k=80)),
        ("stride 2, odd output", dict(size=(9, 7), stride=(2, 2), channels_last=True)),
        ("strides 3 and 2, asymmetric padding", dict(size=(12, 12), pre=(2, 0), post=(0, 1), stride=(3, 2))),
        ("a 2 x 3 filter", dict(size=(9, 8), filt=(2, 3), pre=(1, 0), post=(0, 1), channels_last=True)),
        ("dilation 2, pad 2", dict(size=(8, 10), pre=(2, 2), dilation=(2, 2), channels_last=True)),
        ("dilation 2 and stride 2 (taps of one phase)", dict(size=(9, 9), pre=(2, 2), dilation=(2, 2), stride=(2, 2))),
        ("a 1-D convolution", dict(size=(1, 12), filt=(1, 5), pre=(0, 2))),
        ("slices summed in order", dict(n=4, size=(16, 16))),
    ],
)
def test_the_raster_backward_filter_matches_float64_to_tf32_precision(case, arguments):
    problem, x, dy, dw = filter_problem(**arguments)
    prior = dw.clone()
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER  # TMA reads its copies
    plan = raster.raster_plan(problem)
    if case == "slices summed in order":
        assert plan.partials > 1
    kernels.run(problem, bound("x", x), bound("w", dw), bound("y", dy), None, None, poisoned_workspace(problem))

    w64 = torch.zeros(dw.shape, dtype=torch.float64, requires_grad=True)
    pad = (problem.pre_padding[1], problem.post_padding[1], problem.pre_padding[0], problem.post_padding[0])
    weight = w64.flip(-2, -1) if problem.flip else w64
    y64 = F.conv2d(F.pad(x.double(), pad), weight, stride=problem.stride, dilation=problem.dilation)
    (gradient,) = torch.autograd.grad(y64, w64, dy.double())
    want = 0.75 * gradient + problem.beta * prior.double().nan_to_num()
    assert relative_error(dw.double(), want) < TF32_ERROR, relative_error(dw.double(), want)


def numpy_raster(source, rows, pitch, plane, stride, pad, phases):
    """The raster of ``source`` (N, C, H, W) as the module docstring lays it out (dilation 1: a phase
    index is the phase), in float64."""
    n, c, h, w = source.shape
    target = np.zeros((n, c, phases[0] * phases[1], plane))
    for phase in range(phases[0] * phases[1]):
        for i in range(rows):
            for j in range(pitch):
                row = stride[0] * i + phase // phases[1] - pad[0]
                col = stride[1] * j + phase % phases[1] - pad[1]
                if 0 <= row < h and 0 <= col < w:
                    target[:, :, phase, i * pitch + j] = source[:, :, row, col]
    return target


def test_the_rasters_hold_x_and_dy_rounded_to_tf32_with_zeros_at_the_padding_and_the_pitch():
    problem, x, dy, _ = filter_problem(size=(9, 7), stride=(2, 2), pre=(1, 2), post=(1, 0), channels_last=True)
    plan = raster.raster_plan(problem)
    staging = raster.raster_launches(problem, tl.float32)[:2]
    assert [launch.kernel.__name__ for launch in staging] == ["raster_staging_kernel"] * 2
    x_elements, dy_elements = raster.raster_elements(problem, plan)
    tensors = {
        "x": x,
        "y": dy,
        "x_staged": torch.full((x_elements,), math.nan),
        "y_staged": torch.full((dy_elements,), math.nan),
    }
    for launch in staging:
        launch(tensors)
    rounded = {name: torch.from_numpy(tf32_nearest(t.contiguous().numpy())) for name, t in (("x", x), ("y", dy))}
    want_x = numpy_raster(rounded["x"].numpy(), plan.rows, plan.pitch, plan.x_plane, (2, 2), (1, 2), plan.phases[1:])
    want_dy = numpy_raster(rounded["y"].numpy(), dy.shape[2], plan.pitch, plan.dy_plane, (1, 1), (0, 0), (1, 1))
    assert plan.pitch == dy.shape[3] + 1 and plan.phases == (1, 2, 2) and plan.x_plane * 4 % raster.PLANE_BYTES == 0
    np.testing.assert_array_equal(tensors["x_staged"].numpy(), want_x.ravel().astype(np.float32))
    np.testing.assert_array_equal(tensors["y_staged"].numpy(), want_dy.ravel().astype(np.float32))


@pytest.mark.parametrize(
    "case, arguments, channels_last",
    [
        ("fewer than 64 input channels", dict(c=32), False),
        ("a 1x1 filter over NHWC: its rasters would outgrow its columns", dict(filt=(1, 1), pre=(0, 0)), True),
        ("a 1x1 filter over NCHW, padded: x is not its own raster", dict(filt=(1, 1), pre=(1, 1)), False),
        ("a 1x1 filter over NCHW, stride 2: x is no raster", dict(filt=(1, 1), pre=(0, 0), stride=(2, 2)), False),
        ("float32 without TF32", dict(), None),
    ],
)
def test_the_route_leaves_problems_it_does_not_serve_to_the_others(case, arguments, channels_last):
    problem, *_ = filter_problem(**arguments, channels_last=bool(channels_last))
    if channels_last is None:
        problem = dataclasses.replace(problem, allow_tf32=False)
    assert raster.raster_plan(problem) is None
    assert kernels.choose(problem, tma_aligned=True) is not kernels.Strategy.RASTER_FILTER


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("NCHW", dict(size=(4, 8))),
        ("sub-regions of x and dy (channel and row margins), beta", dict(size=(4, 8), margin=2, beta=0.5)),
        ("slices summed in order", dict(n=24, size=(4, 8))),
        ("128 input channels, 80 output channels", dict(size=(4, 4), c=128, k=80)),
        ("sub-regions, dy's channels 60 bytes apart: read through pointers", dict(size=(3, 3), margin=2, beta=0.5)),
    ],
)
def test_1x1_nchw_backward_filters_read_x_and_dy_in_place(case, arguments):
    """x and dy are their own rasters: no copy, no workspace but the partial filters; dy by TMA
    where its strides are multiples of 16 bytes, else through pointers. The interpreter's products
    are float32's, so the result sits within float32 sums of the float64 product."""
    problem, x, dy, dw = filter_problem(filt=(1, 1), pre=(0, 0), **arguments)
    prior = dw.clone()
    plan = raster.raster_plan(problem)
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    assert plan.in_place and raster.raster_elements(problem, plan) == (0, 0)
    assert plan.dy_tma == ("pointers" not in case)
    launches = raster.raster_launches(problem, tl.float32)
    assert [launch.kernel.__name__ for launch in launches] == ["filter_raster_kernel"]
    if case == "slices summed in order":
        assert plan.partials > 1
    kernels.run(problem, bound("x", x), bound("w", dw), bound("y", dy), None, None, poisoned_workspace(problem))

    gradient = torch.einsum("nkhw,nchw->kc", dy.double(), x.double())[:, :, None, None]
    want = 0.75 * gradient + problem.beta * prior.double().nan_to_num()
    assert relative_error(dw.double(), want) < 2e-6, relative_error(dw.double(), want)


def test_1x1x1_ncdhw_bfloat16_backward_filters_read_x_and_dy_in_place():
    n, c, k, size = 2, 64, 72, (2, 3, 8)
    generator = torch.Generator().manual_seed(6)
    x = (torch.rand((n, c, *size), generator=generator) * 2 - 1).to(torch.bfloat16)
    dy = (torch.rand((n, k, *size), generator=generator) * 2 - 1).to(torch.bfloat16)
    dw = torch.full((k, c, 1, 1, 1), math.nan, dtype=torch.bfloat16)

    def described(name, t):
        return Bound(name, od.TensorDescriptor(od.DataType.BFLOAT16, tuple(t.shape), t.stride()), t, "cpu")

    xb, wb, yb = described("x", x), described("w", dw), described("y", dy)
    problem = ConvolutionProblem(
        FILTER, xb.desc, wb.desc, yb.desc, (0, 0, 0), (0, 0, 0), (1, 1, 1), (1, 1, 1), groups=1, flip=False,
        compute_type=FP32, allow_tf32=True, algo=od.ConvolutionBwdFilterAlgo.ALGO_0,
    )  # fmt: skip
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    assert raster.raster_plan(problem).in_place
    kernels.run(problem, xb, wb, yb, None, None, poisoned_workspace(problem))
    want = torch.einsum("nkdhw,ncdhw->kc", dy.double(), x.double())[:, :, None, None, None]
    assert relative_error(dw.double(), want) < 1e-2, relative_error(dw.double(), want)


@pytest.mark.parametrize("channels, size", [(64, 56), (128, 28), (256, 14), (512, 7)])
def test_resnet50_3x3_layers_take_the_route_and_split_their_pixels_where_tiles_are_fewer_than_sms(channels, size):
    problem = gluon_problem(direction=FILTER, dtype=FP32, allow_tf32=True, n=64, c=channels, size=size, k=channels)
    plan = raster.raster_plan(problem)
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    if plan.tiles < programs_to_fill(1):
        assert plan.slices >= 2 and plan.tiles * plan.slices >= 100


@pytest.mark.parametrize(
    "case, dtype, channels_last, stride, dilation, bound",
    [
        ("3-D float32 as TF32, NCDHW", FP32, False, (1, 1, 1), (1, 1, 1), TF32_ERROR),
        (
            "3-D float32 as TF32, channels-last, stride 2 in depth, dilation 2",
            FP32,
            True,
            (2, 1, 1),
            (1, 2, 1),
            TF32_ERROR,
        ),
        ("3-D bfloat16 (no TMA boxes in 3-D), channels-last", od.DataType.BFLOAT16, True, (1, 1, 1), (1, 1, 1), 1e-2),
    ],
)
def test_3d_backward_filters_take_rasters_with_depth_slices(case, dtype, channels_last, stride, dilation, bound):
    n, c, k, size = 2, 64, 64, (5, 6, 7)
    pad = (1, 1, 1)
    out = tuple((s + 2 * p - d * 2 - 1) // t + 1 for s, p, d, t in zip(size, pad, dilation, stride))
    generator = torch.Generator().manual_seed(5)
    torch_dtype = torch.float32 if dtype is FP32 else torch.bfloat16
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = (torch.rand((n, c, *size), generator=generator) * 2 - 1).to(torch_dtype).contiguous(memory_format=memory_format)
    dy = (torch.rand((n, k, *out), generator=generator) * 2 - 1).to(torch_dtype).contiguous(memory_format=memory_format)
    dw = torch.full((k, c, 3, 3, 3), math.nan, dtype=torch_dtype).contiguous(memory_format=memory_format)

    def described(name, t):
        return Bound(name, od.TensorDescriptor(dtype, tuple(t.shape), t.stride()), t, "cpu")

    xb, wb, yb = described("x", x), described("w", dw), described("y", dy)
    problem = ConvolutionProblem(
        FILTER, xb.desc, wb.desc, yb.desc, pad, pad, stride, dilation, groups=1, flip=False,
        compute_type=FP32, allow_tf32=True, algo=od.ConvolutionBwdFilterAlgo.ALGO_0,
    )  # fmt: skip
    plan = raster.raster_plan(problem)
    assert kernels.choose(problem, tma_aligned=True) is kernels.Strategy.RASTER_FILTER
    assert plan.x_depth == out[0] + 2 * dilation[0] // stride[0] and plan.phases[0] == min(3, stride[0])
    kernels.run(problem, xb, wb, yb, None, None, poisoned_workspace(problem))

    w64 = torch.zeros(dw.shape, dtype=torch.float64, requires_grad=True)
    y64 = F.conv3d(x.double(), w64, stride=stride, padding=pad, dilation=dilation)
    (want,) = torch.autograd.grad(y64, w64, dy.double())
    assert relative_error(dw.double(), want) < bound, relative_error(dw.double(), want)


@pytest.mark.parametrize("channels_last", [True, False])
def test_2d_16_bit_problems_take_the_tma_route_over_nchw_copies_not_rasters(channels_last):
    problem = gluon_problem(
        direction=FILTER, dtype=od.DataType.BFLOAT16, n=8, c=64, size=14, k=64, channels_last=channels_last
    )
    assert kernels.tma_blocks(problem) is not None and raster.raster_plan(problem) is None
    assert kernels.staged(problem) == (() if channels_last else ("x", "y"))


@pytest.mark.parametrize("channels_last", [False, True])
def test_an_infinite_x_at_the_edges_reaches_only_the_taps_that_read_it(channels_last):
    """x infinite in its last column and first row: taps that never read those pixels stay finite, as
    in float64 (dy's zero padding meeting them must add nothing, not 0 * inf = NaN)."""
    problem, x, dy, dw = filter_problem(channels_last=channels_last, size=(6, 7))
    x[0, :, :, -1] = math.inf
    x[1, :, 0, :] = -math.inf
    kernels.run(problem, bound("x", x), bound("w", dw), bound("y", dy), None, None, poisoned_workspace(problem))
    w64 = torch.zeros(dw.shape, dtype=torch.float64, requires_grad=True)
    y64 = F.conv2d(x.double(), w64, padding=1)
    (want,) = torch.autograd.grad(y64, w64, dy.double())
    want = 0.75 * want
    assert torch.equal(dw.isfinite(), want.isfinite())
    assert torch.equal(dw.isnan(), want.isnan())
    finite = want.isfinite()
    assert relative_error(dw.double()[finite], want[finite]) < TF32_ERROR
