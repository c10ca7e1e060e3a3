"""Strided convolutions read by TMA, through Triton's interpreter on tiny shapes against torch's float64
convolution on the CPU: forwards through x's phase view (``triton_gemm.phase_view_box``), backward data
as one launch per stride phase of dx (``triton_tma.output_phases``), the box arithmetic of every tap,
and the problems the kernels cannot read taking another route."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import opendnn as od
from opendnn.core.arrays import Bound
from opendnn.families.convolution import triton_backend as kernels
from opendnn.families.convolution.problem import ConvolutionDirection, ConvolutionProblem, convolution_problem
from opendnn.families.convolution.triton_backend import REGIONS
from opendnn.kernels.device import tma_ready
from opendnn.samples import relative_error

FWD, DATA, FILTER = ConvolutionDirection
S = kernels.Strategy
BF16 = od.DataType.BFLOAT16
ALGORITHMS = {FWD: od.ConvolutionFwdAlgo.IMPLICIT_GEMM, DATA: od.ConvolutionBwdDataAlgo.ALGO_0}


def channels_last(n, c, h, w, rows=0, channels=0, seed=None):
    """An (N, C, H, W) bfloat16 view, channels-last, inside a NaN-filled buffer ``rows`` rows taller
    (the view starts one row in) and ``channels`` channels a pixel wider; ``seed``: random values."""
    buffer = torch.full((n, h + rows, w, c + channels), math.nan, dtype=torch.bfloat16)
    view = buffer[:, 1 if rows else 0 :, :, :c][:, :h].permute(0, 3, 1, 2)
    if seed is not None:
        view.copy_(torch.rand((n, c, h, w), generator=torch.Generator().manual_seed(seed)) * 2 - 1)
    return view, buffer


def bound(name, view):
    return Bound(name, od.TensorDescriptor(BF16, tuple(view.shape), view.stride()), view, "cpu")


def run(
    direction=FWD,
    n=2,
    c=64,
    size=(8, 8),
    k=48,
    filt=(3, 3),
    pre=(1, 1),
    post=None,
    stride=(2, 2),
    dilation=(1, 1),
    x_rows=0,
    x_channels=0,
    y_rows=0,
    y_channels=0,
    beta=0.0,
):
    """The problem run through ``kernels.run`` (its output poisoned with NaN, or holding a prior for
    beta), checked against torch in float64; returns the problem and the strategy the run took."""
    post = post or pre
    out = tuple(
        (s + a + b - d * (f - 1) - 1) // t + 1 for s, a, b, d, f, t in zip(size, pre, post, dilation, filt, stride)
    )
    forward = direction is FWD
    x, _ = channels_last(n, c, *size, x_rows, x_channels, seed=1 if forward else None)
    y, y_buffer = channels_last(n, k, *out, y_rows, y_channels, seed=None if forward else 3)
    w = (torch.rand((k, c, *filt), generator=torch.Generator().manual_seed(2)) * 2 - 1).to(torch.bfloat16)
    w = w.contiguous(memory_format=torch.channels_last)
    output = y if forward else x
    prior = (torch.rand(output.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1).to(torch.bfloat16)
    output.copy_(prior if beta else torch.full_like(prior, math.nan))
    xb, wb, yb = bound("x", x), bound("w", w), bound("y", y)
    problem = ConvolutionProblem(
        direction,
        xb.desc,
        wb.desc,
        yb.desc,
        pre,
        post,
        stride,
        dilation,
        groups=1,
        flip=False,
        compute_type=od.DataType.FLOAT,
        allow_tf32=False,
        algo=ALGORITHMS[direction],
        beta=beta,
    )
    assert kernels.supports(problem) is None and kernels.workspace_size(problem) == 0
    kernels.run(problem, xb, wb, yb)

    padding = (pre[1], post[1], pre[0], post[0])
    if forward:
        want = F.conv2d(F.pad(x.double(), padding), w.double(), stride=stride, dilation=dilation)
    else:
        x64 = torch.zeros(x.shape, dtype=torch.float64, requires_grad=True)
        y64 = F.conv2d(F.pad(x64, padding), w.double(), stride=stride, dilation=dilation)
        (want,) = torch.autograd.grad(y64, x64, y.double())
    want = want + beta * prior.double()
    assert relative_error(output.double(), want) < 1e-2, relative_error(output.double(), want)
    if forward and (y_rows or y_channels):  # nothing written outside the output
        inside = torch.zeros_like(y_buffer, dtype=torch.bool)
        inside[:, (1 if y_rows else 0) :, :, :k][:, : out[0]] = True
        assert y_buffer[~inside].isnan().all()
    strategy = kernels.choose(problem, tma_aligned=tma_ready(x if forward else y, w, interpreted=True))
    return problem, strategy


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("3x3 pad 1, even output 4 x 4", dict()),
        ("3x3 pad 1, odd output 5 x 3, two 64-channel chunks", dict(c=128, size=(10, 6), k=64)),
        ("1x1 pad 0, odd output 3 x 3 (ResNet's downsample)", dict(c=128, size=(6, 6), k=80, filt=(1, 1), pre=(0, 0))),
        ("dilation 2, pad 2", dict(size=(8, 12), pre=(2, 2), dilation=(2, 2))),
        (
            "strides 3 and 2, asymmetric padding, 2 x 3 filter",
            dict(size=(9, 8), filt=(2, 3), pre=(2, 0), post=(0, 1), stride=(3, 2)),
        ),
        ("a row stride only: pixels need not be packed", dict(size=(8, 6), stride=(2, 1), x_channels=64)),
        ("sub-regions: x rows, y rows and channels, beta", dict(x_rows=3, y_rows=2, y_channels=16, beta=0.5)),
    ],
)
def test_strided_forward_reads_each_taps_box_from_the_phase_view(case, arguments):
    problem, strategy = run(**arguments)
    assert kernels.tma_blocks(problem) is not None
    assert strategy is S.TMA  # what the run took: conv_tma_kernel reading the phase view


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("odd height: a view row could lie past x", dict(size=(7, 8))),
        ("odd width", dict(size=(8, 9), stride=(1, 2))),
        ("pixel stride 128 for 64 channels", dict(x_channels=64)),
    ],
)
def test_strided_problems_the_view_cannot_read_take_the_cp_async_gemm(case, arguments):
    problem, strategy = run(**arguments)
    assert kernels.tma_blocks(problem) is None
    assert strategy is S.IMPLICIT_GEMM


def run_filter(n=2, c=64, size=(8, 8), k=64, filt=(3, 3), pre=(1, 1), post=None, stride=(2, 2), x_rows=0, beta=0.0):
    """A backward filter run through ``kernels.run`` with its workspace (dw poisoned with NaN, or
    holding a prior for beta; the workspace's partial filters NaN too), checked against torch's
    float64 gradient; returns the problem and the strategy the run took."""
    post = post or pre
    out = tuple((s + a + b - f) // t + 1 for s, a, b, f, t in zip(size, pre, post, filt, stride))
    x, _ = channels_last(n, c, *size, x_rows, seed=1)
    dy, _ = channels_last(n, k, *out, seed=3)
    dw = torch.empty((k, c, *filt), dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    prior = (torch.rand(dw.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1).to(torch.bfloat16)
    dw.copy_(prior if beta else torch.full_like(prior, math.nan))
    xb, wb, yb = bound("x", x), bound("w", dw), bound("y", dy)
    problem = ConvolutionProblem(
        FILTER,
        xb.desc,
        wb.desc,
        yb.desc,
        pre,
        post,
        stride,
        (1, 1),
        groups=1,
        flip=False,
        compute_type=od.DataType.FLOAT,
        allow_tf32=False,
        algo=od.ConvolutionBwdFilterAlgo.ALGO_0,
        beta=beta,
    )
    assert kernels.supports(problem) is None
    size_bytes = kernels.workspace_size(problem)
    workspace = None
    if size_bytes:
        space = torch.full((size_bytes,), 255, dtype=torch.uint8)
        workspace = Bound("workspace", od.TensorDescriptor(od.DataType.UINT8, (size_bytes,)), space, "cpu")
    kernels.run(problem, xb, wb, yb, None, None, workspace)

    w64 = torch.zeros(dw.shape, dtype=torch.float64, requires_grad=True)
    y64 = F.conv2d(F.pad(x.double(), (pre[1], post[1], pre[0], post[0])), w64, stride=stride)
    (want,) = torch.autograd.grad(y64, w64, dy.double())
    want = want + beta * prior.double()
    assert relative_error(dw.double(), want) < 1e-2, relative_error(dw.double(), want)
    return problem, kernels.choose(problem, tma_aligned=tma_ready(x, dy, interpreted=True))


@pytest.mark.parametrize(
    "case, arguments",
    [
        ("3x3 pad 1, even output 4 x 4", dict()),
        ("3x3 pad 1, odd output 5 x 3, 128 input channels", dict(c=128, size=(10, 6), k=64)),
        ("1x1 pad 0 (ResNet's downsample), beta", dict(c=128, size=(6, 6), k=80, filt=(1, 1), pre=(0, 0), beta=0.5)),
        (
            "strides 3 and 2, asymmetric padding, 2 x 3 filter",
            dict(size=(9, 8), filt=(2, 3), pre=(2, 0), post=(0, 1), stride=(3, 2)),
        ),
        ("x in a sub-region of taller images", dict(x_rows=3)),
    ],
)
def test_strided_backward_filter_reads_each_taps_box_from_the_phase_view(case, arguments):
    problem, strategy = run_filter(**arguments)
    assert kernels.tma_blocks(problem) is not None
    assert strategy is S.TMA  # what the run took: filter_tma_kernel reading the phase view


def test_a_strided_backward_filter_over_an_odd_height_takes_the_cp_async_gemm():
    problem, strategy = run_filter(size=(7, 8))
    assert kernels.tma_blocks(problem) is None and strategy is S.IMPLICIT_GEMM


def backward_data(
    c=48,
    size=(8, 8),
    k=64,
    filt=(3, 3),
    pre=(1, 1),
    post=None,
    stride=(2, 2),
    dilation=(1, 1),
    rows=0,
    channels=0,
    beta=0.0,
    flip=False,
    tf32=False,
    channels_first=False,
):
    """dx by ``od.convolution_backward_data`` on the Triton backend (its interpreter here), the
    workspace poisoned: dx an (N, C, H, W) channels-last view (``channels_first``: NCHW, dy too)
    inside a buffer ``rows`` rows taller and ``channels`` channels wider, NaN outside it and NaN in it
    too unless beta holds a prior; checked against torch's float64 gradient, and nothing outside dx
    written. ``tf32``: float32 tensors on a TENSOR_OP handle. Returns the problem."""
    dtype, torch_dtype = (od.DataType.FLOAT, torch.float32) if tf32 else (BF16, torch.bfloat16)
    post = post or pre
    n = 2
    out = tuple(
        (s + a + b - d * (f - 1) - 1) // t + 1 for s, a, b, d, f, t in zip(size, pre, post, dilation, filt, stride)
    )
    generator = torch.Generator().manual_seed(5)
    if channels_first:
        buffer = torch.full((n, c + channels, size[0] + rows, size[1]), math.nan, dtype=torch_dtype)
        dx = buffer[:, :c, rows:]
    else:
        buffer = torch.full((n, size[0] + rows, size[1], c + channels), math.nan, dtype=torch_dtype)
        dx = buffer[:, rows:, :, :c].permute(0, 3, 1, 2)
    prior = (torch.rand(dx.shape, generator=generator) * 2 - 1).to(torch_dtype)
    if beta:
        dx.copy_(prior)
    dy = (torch.rand((n, k, *out), generator=generator) * 2 - 1).to(torch_dtype)
    w = (torch.rand((k, c, *filt), generator=generator) * 2 - 1).to(torch_dtype)
    if not channels_first:
        dy, w = dy.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    mode = od.ConvolutionMode.CONVOLUTION if flip else od.ConvolutionMode.CROSS_CORRELATION
    math_type = od.MathType.TENSOR_OP if tf32 else od.MathType.DEFAULT
    conv = od.ConvolutionDescriptor(
        pre, stride, dilation, mode, math_type=math_type, pre_padding=pre, post_padding=post
    )
    descriptors = {name: od.TensorDescriptor(dtype, tuple(t.shape), t.stride()) for name, t in zip("xwy", (dx, w, dy))}
    handle = od.create("cpu", backend="triton", math_type=math_type)
    algo = od.ConvolutionBwdDataAlgo.ALGO_0
    xd, wd, yd = descriptors["x"], descriptors["w"], descriptors["y"]
    workspace = torch.full(  # every float32 and bfloat16 in it NaN
        (od.get_convolution_backward_data_workspace_size(handle, wd, yd, conv, xd, algo),), 255, dtype=torch.uint8
    )
    od.convolution_backward_data(handle, 1.0, wd, w, yd, dy, conv, algo, workspace, beta, xd, dx)

    x64 = torch.zeros(dx.shape, dtype=torch.float64, requires_grad=True)
    w64 = w.double().flip(-1, -2) if flip else w.double()
    y64 = F.conv2d(F.pad(x64, (pre[1], post[1], pre[0], post[0])), w64, stride=stride, dilation=dilation)
    (want,) = torch.autograd.grad(y64, x64, dy.double())
    want = want + beta * prior.double()
    tolerance = 1e-3 if tf32 else 1e-2
    assert relative_error(dx.double(), want) < tolerance, relative_error(dx.double(), want)
    inside = torch.zeros(buffer.shape, dtype=torch.bool)
    if channels_first:
        inside[:, :c, rows:] = True
    else:
        inside[:, rows:, :, :c] = True
    assert buffer[~inside].isnan().all()
    return convolution_problem(DATA, conv, xd, wd, yd, allow_tf32=tf32, beta=beta)


@pytest.mark.parametrize(
    "case, arguments, phases",
    [
        ("3x3 pad 1, even dx 8 x 8", dict(), 4),
        ("3x3 pad 1, odd dx 7 x 9: phases of 4 and 3 rows, 5 and 4 columns, two chunks", dict(size=(7, 9), k=128), 4),
        (
            "1x1 pad 0 (ResNet's downsample): three phases without taps write beta * dx",
            dict(c=80, filt=(1, 1), pre=(0, 0), beta=0.5),
            4,
        ),
        ("dilation 2, pad 2: the odd phases have no taps", dict(size=(9, 8), pre=(2, 2), dilation=(2, 2)), 4),
        ("strides 2 and 1", dict(size=(7, 6), stride=(2, 1)), 2),
        (
            "strides 3 and 2, asymmetric padding, 2 x 3 filter",
            dict(size=(10, 7), filt=(2, 3), pre=(2, 0), post=(0, 1), stride=(3, 2)),
            6,
        ),
        ("a sub-region of dx: rows and channels, beta", dict(rows=3, channels=16, beta=0.25), 4),
        ("true convolution", dict(size=(7, 8), flip=True), 4),
        ("TF32: the repacked filter, taps walked from the last", dict(size=(7, 8), tf32=True, flip=True), 4),
    ],
)
def test_strided_backward_data_runs_one_launch_per_output_phase_of_dx(case, arguments, phases):
    problem = backward_data(**arguments)
    assert kernels.choose(problem, tma_aligned=True) is S.TMA
    launches = kernels.launch_plan(problem, True, S.TMA).launches
    tma = [launch for launch in launches if launch.kernel.__name__ == "conv_tma_kernel"]
    assert len(tma) == phases


@pytest.mark.parametrize(
    "case, arguments, row_phases",
    [
        ("3x3 pad 1, even dx 8 x 8", dict(), 2),
        ("odd dx 7 x 9: row phases of 4 and 3 rows, two chunks", dict(size=(7, 9), k=128), 2),
        ("1x1 pad 0 (ResNet's downsample): phases without taps write zeros", dict(c=80, filt=(1, 1), pre=(0, 0)), 2),
        (
            "strides 3 and 2, asymmetric padding, 2 x 3 filter",
            dict(size=(10, 7), filt=(2, 3), pre=(2, 0), post=(0, 1), stride=(3, 2)),
            3,
        ),
        ("strides 1 and 2: one row phase of two column phases", dict(size=(7, 8), stride=(1, 2)), 1),
        ("a sub-region of dx: rows and channels, true convolution", dict(rows=3, channels=16, flip=True), 2),
    ],
)
def test_nchw_tf32_strided_backward_data_writes_row_phases_channels_last_then_copies_them(case, arguments, row_phases):
    problem = backward_data(tf32=True, channels_first=True, **arguments)
    assert kernels.choose(problem, tma_aligned=True) is S.TMA and kernels.stages_output(problem)
    launches = kernels.launch_plan(problem, True, S.TMA).launches
    names = [launch.args[0].name if launch.kernel.__name__ == "staging_kernel" else "phase" for launch in launches]
    copies_back = [index for index, name in enumerate(names) if name == "x"]
    assert len(copies_back) == row_phases and copies_back[-1] == len(names) - 1  # each after its row phase's launches
    workspace = kernels._workspace_regions(problem)[REGIONS.index("x_staged")]
    assert workspace == kernels.aligned(kernels.staged_rows(problem, 0).numel * 4)


def test_nchw_tf32_strided_backward_data_with_beta_writes_dx_where_it_lies():
    problem = backward_data(tf32=True, channels_first=True, rows=1, beta=0.5)
    assert not kernels.stages_output(problem) and kernels._workspace_regions(problem)[REGIONS.index("x_staged")] == 0


def test_each_phase_takes_the_box_of_its_own_output_size():
    problem = backward_data(size=(3, 8), stride=(2, 1))  # phases of 2 x 8 and 1 x 8 pixels, 2 images
    boxes = [
        (launch.options["IMAGES"], launch.options["BLOCK_H"], launch.options["BLOCK_W"])
        for launch in kernels.launch_plan(problem, True, S.TMA).launches
    ]
    assert boxes == [(2, 2, 32), (2, 1, 64)]  # each the widest that covers its phase in one box
