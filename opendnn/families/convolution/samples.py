"""Samples of the convolution family: forward, backward data, backward filter, the fused
bias + activation forward and backward bias, over every geometry parameter, layout, dtype and
algorithm.

A sample's variant reads ``geometry/ALGO[/KRSC][/tf32][/epilogue]``: a name of GEOMETRIES[size],
the algorithm's member name, a channels-last filter, TF32 allowed (tolerance 1e-3), and for the
fused forward its epilogue (``bias+RELU+z`` or ``+z=y`` where the residual is y's own buffer).
Layouts: packed NCHW, ``nhwc`` (channels-last strides), ``permuted`` and ``subregion`` (see core/samples.py),
applied to x, y, dx and dy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from opendnn.core.descriptors import TensorDescriptor, TensorFormat
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle, MathType
from opendnn.core.samples import FLOAT_TYPES, ErrorSample, Sample, Tensors, checked, descriptor, values
from opendnn.families.convolution import functional as F
from opendnn.families.convolution.api import (
    convolution_backward_bias,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_bias_activation_forward,
    convolution_forward,
    get_convolution_backward_data_workspace_size,
    get_convolution_backward_filter_workspace_size,
    get_convolution_forward_workspace_size,
)
from opendnn.families.convolution.problem import (
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionDescriptor,
    ConvolutionDirection,
    ConvolutionFwdAlgo,
    ConvolutionMode,
    ConvolutionProblem,
    FilterDescriptor,
    convolution_problem,
    get_convolution_forward_output_dim,
    reference_backward_bias,
    reference_backward_data,
    reference_backward_filter,
    reference_epilogue,
    reference_forward,
)
from opendnn.families.pointwise.activation_api import ActivationDescriptor, ActivationMode
from opendnn.families.pointwise.problem import PointwiseMode

TF32_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Geometry:
    """One convolution's sizes and parameters (per spatial dim tuples)."""

    n: int
    c: int
    k: int
    spatial: tuple[int, ...]
    filt: tuple[int, ...]
    pre: tuple[int, ...]
    post: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION

    @property
    def x_shape(self) -> tuple[int, ...]:
        return (self.n, self.c, *self.spatial)

    @property
    def w_shape(self) -> tuple[int, ...]:
        return (self.k, self.c // self.groups, *self.filt)

    def descriptor(self, dtype: DataType, tf32: bool = False) -> ConvolutionDescriptor:
        compute = DataType.DOUBLE if dtype is DataType.DOUBLE else DataType.FLOAT
        return ConvolutionDescriptor(
            self.pre,
            self.stride,
            self.dilation,
            self.mode,
            compute,
            self.groups,
            MathType.TENSOR_OP if tf32 else MathType.FMA,
            pre_padding=self.pre,
            post_padding=self.post,
        )


def _g(
    n: int,
    c: int,
    k: int,
    spatial: tuple[int, ...],
    filt: tuple[int, ...],
    pad: tuple[int, ...],
    stride: tuple[int, ...] | None = None,
    dilation: tuple[int, ...] | None = None,
    *,
    post: tuple[int, ...] | None = None,
    groups: int = 1,
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION,
) -> Geometry:
    ones = (1,) * len(spatial)
    return Geometry(
        n, c, k, spatial, filt, pad, post if post is not None else pad, stride or ones, dilation or ones, groups, mode
    )


CONVOLUTION = ConvolutionMode.CONVOLUTION
GEOMETRIES: dict[str, dict[str, Geometry]] = {
    "small": {
        "1d": _g(2, 3, 4, (11,), (3,), (1,), (2,)),
        "2d": _g(2, 4, 6, (5, 6), (3, 3), (1, 1)),
        "2d_1x1": _g(2, 8, 5, (5, 6), (1, 1), (0, 0)),
        "2d_wide": _g(2, 64, 64, (5, 6), (3, 3), (1, 1)),
        "2d_stride_dilation": _g(2, 3, 5, (6, 7), (3, 2), (1, 2), (2, 1), (1, 2)),
        "2d_asymmetric": _g(2, 3, 4, (5, 6), (3, 3), (0, 2), (1, 2), post=(2, 1)),
        "2d_groups": _g(2, 6, 4, (5, 6), (3, 3), (1, 1), groups=2),
        "2d_depthwise": _g(2, 4, 4, (5, 6), (3, 3), (1, 1), (2, 2), groups=4),
        "2d_multiplier": _g(2, 3, 6, (5, 6), (3, 3), (1, 1), groups=3),
        "2d_convolution_mode": _g(2, 3, 4, (5, 6), (3, 2), (1, 0), mode=CONVOLUTION),
        "2d_odd": _g(2, 5, 7, (9, 11), (3, 3), (1, 1), (1, 2)),
        "2d_few_channels": _g(2, 3, 4, (9, 8), (5, 5), (2, 2), (2, 2)),
        "3d": _g(2, 3, 4, (4, 5, 3), (2, 3, 2), (1, 1, 0), (1, 2, 1), (1, 1, 2), mode=CONVOLUTION),
    },
    "large": {
        "1d": _g(16, 64, 96, (1000,), (5,), (2,), (2,)),
        "2d": _g(8, 64, 96, (28, 28), (3, 3), (1, 1)),
        "2d_1x1": _g(8, 256, 64, (28, 28), (1, 1), (0, 0)),
        "2d_wide": _g(8, 128, 192, (14, 14), (3, 3), (1, 1)),
        "2d_stride_dilation": _g(8, 64, 80, (30, 31), (3, 2), (1, 2), (2, 1), (1, 2)),
        "2d_asymmetric": _g(8, 32, 48, (27, 29), (3, 3), (0, 2), (1, 2), post=(2, 1)),
        "2d_groups": _g(8, 64, 128, (28, 28), (3, 3), (1, 1), groups=4),
        "2d_depthwise": _g(8, 128, 128, (28, 28), (3, 3), (1, 1), (2, 2), groups=128),
        "2d_multiplier": _g(8, 64, 128, (28, 28), (3, 3), (1, 1), groups=64),
        "2d_convolution_mode": _g(8, 32, 64, (28, 30), (3, 2), (1, 0), mode=CONVOLUTION),
        "2d_odd": _g(7, 35, 67, (29, 31), (3, 3), (1, 1), (1, 2)),
        "2d_few_channels": _g(8, 3, 64, (112, 112), (7, 7), (3, 3), (2, 2)),
        "3d": _g(4, 32, 48, (12, 14, 10), (3, 3, 3), (1, 1, 0), (1, 2, 1), (1, 1, 2), mode=CONVOLUTION),
    },
}


@dataclass(frozen=True)
class ConvolutionSample(Sample):
    """A Sample whose variant may ask for TF32 (then its float32 tolerance is TF32's)."""

    @property
    def tolerance(self) -> float:
        tf32 = "tf32" in self.variant.split("/")
        return max(super().tolerance, TF32_TOLERANCE) if tf32 else super().tolerance


# ---- tensors -------------------------------------------------------------------------------------


def _allocate(t: Tensors, shape: tuple[int, ...], dtype: DataType, layout: str, output: bool = False) -> Any:
    if layout == "nhwc":
        strides = TensorDescriptor.from_format(TensorFormat.NHWC, dtype, *shape).strides
        return t.empty_strided(shape, strides, dtype)
    return t._allocate(shape, dtype, layout, output=output)


def _input(t: Tensors, shape: tuple[int, ...], dtype: DataType, layout: str) -> Any:
    view = _allocate(t, shape, dtype, layout)
    t.fill(view, t.rng.uniform(-2.0, 2.0, shape))
    return view


def _filter(t: Tensors, geometry: Geometry, dtype: DataType, krsc: bool) -> tuple[Any, FilterDescriptor]:
    fmt = TensorFormat.NHWC if krsc else TensorFormat.NCHW
    w_desc = FilterDescriptor(dtype, fmt, *geometry.w_shape)
    w = t.empty_strided(w_desc.dims, w_desc.tensor.strides, dtype)
    t.fill(w, t.rng.uniform(-2.0, 2.0, w_desc.dims))
    return w, w_desc


def _output(sample: Sample, t: Tensors, shape: tuple[int, ...], result: np.ndarray) -> tuple[Any, np.ndarray]:
    """The output poisoned with NaN (or random for beta != 0) and the expected alpha*result + beta*out."""
    out = _allocate(t, shape, sample.dtype, sample.layout, output=True)
    if sample.beta == 0:
        t.fill(out, np.full(shape, np.nan))
        return out, sample.alpha * result
    t.fill(out, t.rng.uniform(-2.0, 2.0, shape))
    return out, sample.alpha * result + sample.beta * t.values(out)


def _workspace(t: Tensors, size: int) -> Any:
    return t.workspace(size)


# ---- runners -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    geometry: Geometry
    algo_name: str
    krsc: bool
    tf32: bool
    epilogue: str


def _variant(sample: Sample, size: str) -> Variant:
    parts = sample.variant.split("/")
    epilogue = next((p for p in parts[2:] if p not in ("KRSC", "tf32")), "")
    return Variant(GEOMETRIES[size][parts[0]], parts[1], "KRSC" in parts, "tf32" in parts, epilogue)


def _problem(
    direction: ConvolutionDirection, v: Variant, dtype: DataType, y_dims: tuple[int, ...], **epilogue: Any
) -> ConvolutionProblem:
    """The geometry as a problem, for the reference (float64 descriptors)."""
    g = v.geometry
    return convolution_problem(
        direction,
        g.descriptor(DataType.DOUBLE),
        TensorDescriptor("float64", g.x_shape),
        TensorDescriptor("float64", g.w_shape),
        TensorDescriptor("float64", y_dims),
        **epilogue,
    )


def run_forward(sample: Sample, t: Tensors, handle: Handle, size: str) -> tuple[np.ndarray, np.ndarray]:
    v = _variant(sample, size)
    conv_desc = v.geometry.descriptor(sample.dtype, v.tf32)
    x = _input(t, v.geometry.x_shape, sample.dtype, sample.layout)
    w, w_desc = _filter(t, v.geometry, sample.dtype, v.krsc)
    y_dims = get_convolution_forward_output_dim(conv_desc, descriptor(x), w_desc)
    problem = _problem(ConvolutionDirection.FORWARD, v, sample.dtype, y_dims)
    y, expected = _output(sample, t, y_dims, reference_forward(problem, t.values(x), t.values(w)))
    algo = ConvolutionFwdAlgo[v.algo_name]
    size_bytes = get_convolution_forward_workspace_size(handle, descriptor(x), w_desc, conv_desc, descriptor(y), algo)
    convolution_forward(
        handle,
        sample.alpha,
        descriptor(x),
        x,
        w_desc,
        w,
        conv_desc,
        algo,
        _workspace(t, size_bytes),
        sample.beta,
        descriptor(y),
        y,
    )
    return checked(t, y, expected)


def run_backward_data(sample: Sample, t: Tensors, handle: Handle, size: str) -> tuple[np.ndarray, np.ndarray]:
    v = _variant(sample, size)
    g = v.geometry
    conv_desc = g.descriptor(sample.dtype, v.tf32)
    w, w_desc = _filter(t, g, sample.dtype, v.krsc)
    y_dims = get_convolution_forward_output_dim(conv_desc, TensorDescriptor(sample.dtype, g.x_shape), w_desc)
    dy = _input(t, y_dims, sample.dtype, sample.layout)
    problem = _problem(ConvolutionDirection.BACKWARD_DATA, v, sample.dtype, y_dims)
    dx, expected = _output(sample, t, g.x_shape, reference_backward_data(problem, t.values(dy), t.values(w)))
    algo = ConvolutionBwdDataAlgo[v.algo_name]
    size_bytes = get_convolution_backward_data_workspace_size(
        handle, w_desc, descriptor(dy), conv_desc, descriptor(dx), algo
    )
    convolution_backward_data(
        handle,
        sample.alpha,
        w_desc,
        w,
        descriptor(dy),
        dy,
        conv_desc,
        algo,
        _workspace(t, size_bytes),
        sample.beta,
        descriptor(dx),
        dx,
    )
    return checked(t, dx, expected)


def run_backward_filter(sample: Sample, t: Tensors, handle: Handle, size: str) -> tuple[np.ndarray, np.ndarray]:
    """dw (KCRS, or KRSC with /KRSC) from x and dy in the sample's layout."""
    v = _variant(sample, size)
    g = v.geometry
    conv_desc = g.descriptor(sample.dtype, v.tf32)
    x = _input(t, g.x_shape, sample.dtype, sample.layout)
    w_desc = FilterDescriptor(sample.dtype, TensorFormat.NHWC if v.krsc else TensorFormat.NCHW, *g.w_shape)
    y_dims = get_convolution_forward_output_dim(conv_desc, descriptor(x), w_desc)
    dy = _input(t, y_dims, sample.dtype, sample.layout)
    problem = _problem(ConvolutionDirection.BACKWARD_FILTER, v, sample.dtype, y_dims)
    result = reference_backward_filter(problem, t.values(x), t.values(dy))
    dw, expected = _output(sample, t, g.w_shape, result)
    if v.krsc:  # the filter's own strides, whatever the sample's layout
        poisoned, dw = dw, t.empty_strided(w_desc.dims, w_desc.tensor.strides, sample.dtype)
        t.fill(dw, t.values(poisoned))
    algo = ConvolutionBwdFilterAlgo[v.algo_name]
    size_bytes = get_convolution_backward_filter_workspace_size(
        handle, descriptor(x), descriptor(dy), conv_desc, w_desc, algo
    )
    filter_desc = w_desc if v.krsc else descriptor(dw)
    convolution_backward_filter(
        handle,
        sample.alpha,
        descriptor(x),
        x,
        descriptor(dy),
        dy,
        conv_desc,
        algo,
        _workspace(t, size_bytes),
        sample.beta,
        filter_desc,
        dw,
    )
    return checked(t, dw, expected)


_ACTIVATIONS = {
    "RELU": (PointwiseMode.RELU_FWD, 0.0),
    "CLIPPED_RELU": (PointwiseMode.CLIPPED_RELU_FWD, 1.5),
    "GELU": (PointwiseMode.GELU_FWD, 0.0),
    "SWISH": (PointwiseMode.SWISH_FWD, 1.25),
    "IDENTITY": (None, 0.0),
}
ALPHA2 = 0.75


def run_bias_activation_forward(sample: Sample, t: Tensors, handle: Handle, size: str) -> tuple[np.ndarray, np.ndarray]:
    """y = act(alpha * conv + alpha2 * z + bias); the epilogue ``bias+ACT[+z|+z=y]``."""
    v = _variant(sample, size)
    parts = v.epilogue.split("+")
    mode, coef = _ACTIVATIONS[parts[1]]
    conv_desc = v.geometry.descriptor(sample.dtype, v.tf32)
    x = _input(t, v.geometry.x_shape, sample.dtype, sample.layout)
    w, w_desc = _filter(t, v.geometry, sample.dtype, v.krsc)
    y_dims = get_convolution_forward_output_dim(conv_desc, descriptor(x), w_desc)
    bias = _input(t, tuple(d if k == 1 else 1 for k, d in enumerate(y_dims)), sample.dtype, "packed")
    y = _allocate(t, y_dims, sample.dtype, sample.layout, output=True)
    t.fill(y, np.full(y_dims, np.nan))
    z = None
    if "z=y" in parts:
        t.fill(y, t.rng.uniform(-2.0, 2.0, y_dims))
        z = y
    elif "z" in parts:
        z = _input(t, y_dims, sample.dtype, sample.layout)
    problem = _problem(
        ConvolutionDirection.FORWARD,
        v,
        sample.dtype,
        y_dims,
        alpha=sample.alpha,
        alpha2=ALPHA2 if z is not None else 0.0,
        activation=mode,
        activation_coef=coef,
        bias_desc=TensorDescriptor("float64", bias.shape),
        z_desc=TensorDescriptor("float64", y_dims) if z is not None else None,
    )
    conv = reference_forward(problem, t.values(x), t.values(w))
    expected = reference_epilogue(problem, conv, t.values(bias), t.values(z) if z is not None else None)
    act_desc = ActivationDescriptor(ActivationMode[parts[1]], coef=coef or None)
    algo = ConvolutionFwdAlgo[v.algo_name]
    size_bytes = get_convolution_forward_workspace_size(handle, descriptor(x), w_desc, conv_desc, descriptor(y), algo)
    z_desc = descriptor(z) if z is not None else None
    convolution_bias_activation_forward(
        handle,
        sample.alpha,
        descriptor(x),
        x,
        w_desc,
        w,
        conv_desc,
        algo,
        _workspace(t, size_bytes),
        ALPHA2,
        z_desc,
        z,
        descriptor(bias),
        bias,
        act_desc,
        descriptor(y),
        y,
    )
    return checked(t, y, expected)


def run_backward_bias(sample: Sample, t: Tensors, handle: Handle, size: str) -> tuple[np.ndarray, np.ndarray]:
    dy = _input(t, sample.shape, sample.dtype, sample.layout)
    db_dims = tuple(d if k == 1 else 1 for k, d in enumerate(sample.shape))
    db, expected = _output(sample, t, db_dims, reference_backward_bias(t.values(dy)))
    convolution_backward_bias(handle, sample.alpha, descriptor(dy), dy, sample.beta, descriptor(db), db)
    return checked(t, db, expected)


# ---- the table -----------------------------------------------------------------------------------

FORWARD_ALGOS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM")
BACKWARD_DATA_ALGOS = ("ALGO_0", "ALGO_1")
BACKWARD_FILTER_ALGOS = ("ALGO_0", "ALGO_1", "ALGO_3")
DIRECTIONS = (
    ("convolution_forward", run_forward, "IMPLICIT_GEMM"),
    ("convolution_backward_data", run_backward_data, "ALGO_0"),
    ("convolution_backward_filter", run_backward_filter, "ALGO_0"),
)
LAYOUTS = ("nhwc", "permuted", "subregion")
EPILOGUES = ("bias+IDENTITY", "bias+RELU", "bias+RELU+z", "bias+CLIPPED_RELU+z=y", "bias+GELU+z", "bias+SWISH+z=y")


def samples(size: str = "small") -> Iterator[Sample]:
    """The convolution samples at GEOMETRIES[size]."""

    def sample(op: str, runner: Any, variant: str, dtype: DataType = DataType.FLOAT, **kw: Any) -> Sample:
        geometry = GEOMETRIES[size][variant.split("/")[0]]
        return ConvolutionSample(
            op, variant, dtype, kw.pop("shape", geometry.x_shape), runner=_sized(runner, size), **kw
        )

    for name, (op, runner, algo) in itertools.product(GEOMETRIES[size], DIRECTIONS):
        yield sample(op, runner, f"{name}/{algo}")
    for dtype, (op, runner, algo) in itertools.product(FLOAT_TYPES, DIRECTIONS):
        if dtype is not DataType.FLOAT:
            yield sample(op, runner, f"2d_stride_dilation/{algo}", dtype, layout="nhwc")
    for op, runner, algo in DIRECTIONS:
        yield sample(op, runner, f"2d/{algo}/tf32")
        yield sample(op, runner, f"2d_groups/{algo}/KRSC", DataType.BFLOAT16, layout="nhwc")
        yield sample(op, runner, f"2d_asymmetric/{algo}", alpha=0.5, beta=-0.75, layout="subregion")
        for layout in LAYOUTS:
            yield sample(
                op, runner, f"2d_stride_dilation/{algo}" + ("/KRSC" if layout == "nhwc" else ""), layout=layout
            )
    for op, runner, algos in (
        ("convolution_forward", run_forward, FORWARD_ALGOS[1:]),
        ("convolution_backward_data", run_backward_data, BACKWARD_DATA_ALGOS[1:]),
        ("convolution_backward_filter", run_backward_filter, BACKWARD_FILTER_ALGOS[1:]),
    ):
        for algo, name in itertools.product(algos, ("2d_stride_dilation", "2d_multiplier", "3d")):
            yield sample(op, runner, f"{name}/{algo}")
        for algo in algos:
            yield sample(op, runner, f"2d_groups/{algo}/KRSC", DataType.HALF, layout="nhwc", beta=0.5)
    for op, runner, algo in DIRECTIONS:  # forward and backward data are matrix products on the triton backend
        yield sample(op, runner, f"2d_1x1/{algo}/KRSC", DataType.BFLOAT16, layout="nhwc", alpha=1.5, beta=0.5)
    for op, runner, algo in DIRECTIONS:  # 64-channel multiples, stride 1, channels-last: TMA on the triton backend
        yield sample(op, runner, f"2d_wide/{algo}/KRSC", DataType.BFLOAT16, layout="nhwc", alpha=0.5, beta=0.25)
    yield sample(
        "convolution_bias_activation_forward",
        run_bias_activation_forward,
        "2d_wide/IMPLICIT_GEMM/KRSC/bias+RELU+z",
        DataType.HALF,
        layout="nhwc",
    )
    yield sample("convolution_forward", run_forward, "2d_1x1/IMPLICIT_GEMM/KRSC/tf32", layout="nhwc")
    yield sample(
        "convolution_bias_activation_forward",
        run_bias_activation_forward,
        "2d_1x1/IMPLICIT_GEMM/KRSC/bias+IDENTITY",
        DataType.HALF,
        layout="nhwc",
    )
    for name in ("2d_depthwise", "2d_multiplier", "2d_few_channels"):
        yield sample("convolution_forward", run_forward, f"{name}/DIRECT")
    yield sample("convolution_forward", run_forward, "2d_depthwise/DIRECT", DataType.BFLOAT16, layout="nhwc")
    for epilogue in EPILOGUES:
        yield sample("convolution_bias_activation_forward", run_bias_activation_forward, f"2d/IMPLICIT_GEMM/{epilogue}")
    yield sample(
        "convolution_bias_activation_forward",
        run_bias_activation_forward,
        "2d_groups/IMPLICIT_GEMM/KRSC/bias+RELU+z=y",
        DataType.BFLOAT16,
        layout="nhwc",
        alpha=1.5,
    )
    yield sample(
        "convolution_bias_activation_forward",
        run_bias_activation_forward,
        "2d_1x1/GEMM/bias+SWISH+z",
        DataType.HALF,
        layout="subregion",
    )
    for dtype, layout in zip(FLOAT_TYPES, ("packed", "nhwc", "permuted", "subregion")):
        yield sample("convolution_backward_bias", run_backward_bias, "2d/none", dtype, layout=layout)
    yield sample("convolution_backward_bias", run_backward_bias, "3d/none", alpha=0.5, beta=0.25)


def _sized(runner: Any, size: str) -> Any:
    """The runner with the table's size bound (Sample.run passes sample, tensors, handle)."""

    def run(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
        return runner(sample, t, handle, size)

    return run


__all__ = ["GEOMETRIES", "ConvolutionSample", "Geometry", "samples"]


def error_samples() -> list[ErrorSample]:
    """Bad calls of the convolutions and their messages."""
    x, w = lambda: values(1, 2, 5, 5), lambda: values(3, 2, 3, 3)  # noqa: E731
    return [
        ErrorSample(
            "fractional stride",
            F.conv,
            lambda: {"x": x(), "w": w(), "stride": 1.5},
            BadParam,
            "stride=1.5 must be an int",
        ),
        ErrorSample(
            "NaN stride",
            F.conv,
            lambda: {"x": x(), "w": w(), "stride": float("nan")},
            BadParam,
            "stride=nan must be an int",
        ),
        ErrorSample(
            "fractional padding",
            F.conv,
            lambda: {"x": x(), "w": w(), "padding": 1.5},
            BadParam,
            "padding=1.5 must be an int",
        ),
        ErrorSample(
            "groups of 0", F.conv, lambda: {"x": x(), "w": w(), "groups": 0}, BadParam, "groups=0 must be at least 1"
        ),
        ErrorSample(
            "mode out of range",
            ConvolutionDescriptor,
            lambda: {"pad": (0, 0), "stride": (1, 1), "dilation": (1, 1), "mode": 5},
            BadParam,
            "mode=5 must be a ConvolutionMode: one of ConvolutionMode.CONVOLUTION, ConvolutionMode.CROSS_CORRELATION",
        ),
        ErrorSample(
            "silu with beta 0",
            F.conv_bias_activation,
            lambda: {"x": x(), "w": w(), "activation": "silu", "coef": 0.0},
            BadParam,
            "coef=0.0 must be above 0: it is the beta of SWISH",
        ),
    ]
