"""Convolution (cuDNN's convolution forward, backward data, backward filter): one operation, its
shape and dtype rules, and its NumPy reference.

CONTRACT (the fields of ``ConvolutionProblem`` and the tensor order of ``run()`` are shared by the
cuDNN-shaped API, the NumPy reference and the Triton kernels: a change here changes all three):

    x: (N, C, *spatial)        activation; dx for BACKWARD_DATA (the output then)
    w: (K, C / groups, *filt)  filter, always described in K, C/g, R, S dim order; KRSC memory
                               order is channels-last strides; dw for BACKWARD_FILTER (the output then)
    y: (N, K, *out)            output of FORWARD; dy for the two backward directions (an input then)

    out[d] = (spatial[d] + pre_padding[d] + post_padding[d] - dilation[d] * (filt[d] - 1) - 1)
             // stride[d] + 1

    FORWARD (cross-correlation, flip=False), per group g of G, k in g's K/G output channels:
        y[n, k, o] = sum_{c in g, r} x[n, c, o * stride - pre_padding + r * dilation] * w[k, c - g*C/G, r]
    flip=True (ConvolutionMode.CONVOLUTION) uses w[k, c, filt - 1 - r] instead of w[k, c, r].
    BACKWARD_DATA is the adjoint in x, BACKWARD_FILTER the adjoint in w, of that same map.

    Backend interface: ``run(problem, x, w, y, bias, z, workspace)`` with ``Bound`` tensors (bias, z
    and workspace may be None); the output is y, x or w by direction, blended as
    ``out = alpha * result + beta * out`` (never read when beta == 0). FORWARD alone has the fused
    epilogue: ``y = act(alpha * conv + alpha2 * z + bias)`` where bias is (1, K, 1, ...) and z has
    y's dims (z may be the very y buffer); with an epilogue, beta must be 0.

Around the contract: the mode and cuDNN's algorithm enums; ``METHOD``, how each algorithm
computes (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM, DIRECT; FFT and WINOGRAD are declared, not
implemented) and ``algorithm_refusal``, the one rule of which algorithm applies to which problem;
the filter and convolution descriptors; ``convolution_problem``, the shape and dtype rules every
call passes; and the float64 NumPy reference of each direction, of the fused epilogue and of
backward bias.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from opendnn.core.descriptors import (
    TensorDescriptor,
    TensorFormat,
    check_dtype,
    check_finite,
    check_int,
    check_ints,
    check_member,
    strides_for_order,
)
from opendnn.core.dtypes import DataType
from opendnn.core.errors import Status, require
from opendnn.core.handle import MathType
from opendnn.core.memo import cached_hash, canonical
from opendnn.families.pointwise.problem import PointwiseMode, resolved_coef
from opendnn.families.pointwise.problem import reference as pointwise_reference


class ConvolutionDirection(enum.Enum):
    FORWARD = "forward"
    BACKWARD_DATA = "backward_data"
    BACKWARD_FILTER = "backward_filter"


class ConvolutionMode(enum.Enum):
    """CONVOLUTION flips the filter in every spatial dim; CROSS_CORRELATION (what deep-learning
    frameworks call convolution) does not."""

    CONVOLUTION = 0
    CROSS_CORRELATION = 1


class ConvolutionFwdAlgo(enum.Enum):
    """cuDNN's forward algorithms (values as cuDNN's); ``METHOD`` says how opendnn computes each."""

    IMPLICIT_GEMM = 0
    IMPLICIT_PRECOMP_GEMM = 1
    GEMM = 2
    DIRECT = 3
    FFT = 4
    FFT_TILING = 5
    WINOGRAD = 6
    WINOGRAD_NONFUSED = 7


class ConvolutionBwdDataAlgo(enum.Enum):
    """cuDNN's backward-data algorithms (values as cuDNN's)."""

    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    FFT_TILING = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5


class ConvolutionBwdFilterAlgo(enum.Enum):
    """cuDNN's backward-filter algorithms (values as cuDNN's)."""

    ALGO_0 = 0
    ALGO_1 = 1
    FFT = 2
    ALGO_3 = 3
    WINOGRAD = 4
    WINOGRAD_NONFUSED = 5
    FFT_TILING = 6


class ConvolutionMethod(enum.Enum):
    """How an algorithm computes, whatever the direction.

    IMPLICIT_GEMM: a matrix product whose operand tiles are gathered from the tensors on the fly
        (no workspace).
    IMPLICIT_PRECOMP_GEMM: the same, gathering through a table of filter-tap offsets computed
        beforehand (a small workspace).
    GEMM: explicit im2col (forward, backward filter) or column (backward data) buffer in the
        workspace, then one matrix product.
    DIRECT: one program per output tile summing its taps without a matrix product (depthwise and
        few channels per group).
    FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED: not implemented by opendnn.
    """

    IMPLICIT_GEMM = "implicit_gemm"
    IMPLICIT_PRECOMP_GEMM = "implicit_precomp_gemm"
    GEMM = "gemm"
    DIRECT = "direct"
    FFT = "fft"
    FFT_TILING = "fft_tiling"
    WINOGRAD = "winograd"
    WINOGRAD_NONFUSED = "winograd_nonfused"


ALGORITHMS = {
    ConvolutionDirection.FORWARD: ConvolutionFwdAlgo,
    ConvolutionDirection.BACKWARD_DATA: ConvolutionBwdDataAlgo,
    ConvolutionDirection.BACKWARD_FILTER: ConvolutionBwdFilterAlgo,
}

METHOD: dict[enum.Enum, ConvolutionMethod] = {
    **{algo: ConvolutionMethod[algo.name] for algo in ConvolutionFwdAlgo},
    ConvolutionBwdDataAlgo.ALGO_0: ConvolutionMethod.IMPLICIT_GEMM,
    ConvolutionBwdDataAlgo.ALGO_1: ConvolutionMethod.GEMM,
    ConvolutionBwdDataAlgo.FFT: ConvolutionMethod.FFT,
    ConvolutionBwdDataAlgo.FFT_TILING: ConvolutionMethod.FFT_TILING,
    ConvolutionBwdDataAlgo.WINOGRAD: ConvolutionMethod.WINOGRAD,
    ConvolutionBwdDataAlgo.WINOGRAD_NONFUSED: ConvolutionMethod.WINOGRAD_NONFUSED,
    ConvolutionBwdFilterAlgo.ALGO_0: ConvolutionMethod.IMPLICIT_GEMM,
    ConvolutionBwdFilterAlgo.ALGO_1: ConvolutionMethod.GEMM,
    ConvolutionBwdFilterAlgo.FFT: ConvolutionMethod.FFT,
    ConvolutionBwdFilterAlgo.ALGO_3: ConvolutionMethod.IMPLICIT_PRECOMP_GEMM,
    ConvolutionBwdFilterAlgo.WINOGRAD: ConvolutionMethod.WINOGRAD,
    ConvolutionBwdFilterAlgo.WINOGRAD_NONFUSED: ConvolutionMethod.WINOGRAD_NONFUSED,
    ConvolutionBwdFilterAlgo.FFT_TILING: ConvolutionMethod.FFT_TILING,
}

# the default of each direction: implicit GEMM, no workspace, deterministic
DEFAULT_ALGORITHM = {
    ConvolutionDirection.FORWARD: ConvolutionFwdAlgo.IMPLICIT_GEMM,
    ConvolutionDirection.BACKWARD_DATA: ConvolutionBwdDataAlgo.ALGO_0,
    ConvolutionDirection.BACKWARD_FILTER: ConvolutionBwdFilterAlgo.ALGO_0,
}

UNIMPLEMENTED_METHODS = (
    ConvolutionMethod.FFT,
    ConvolutionMethod.FFT_TILING,
    ConvolutionMethod.WINOGRAD,
    ConvolutionMethod.WINOGRAD_NONFUSED,
)
DIRECT_MAX_CHANNELS_PER_GROUP = 4  # DIRECT sums taps one channel at a time: worth it only for few


def method_of(algo: enum.Enum) -> ConvolutionMethod:
    """The ConvolutionMethod an algorithm enum member stands for."""
    return METHOD[algo]


@dataclass(frozen=True)
class ConvolutionProblem:
    """A validated convolution: every backend receives exactly this.

    Attributes:
        direction: which of x, w, y is the output.
        x, w, y: descriptors as in the module docstring (dims in N/K, C, spatial order, any strides).
        pre_padding, post_padding, stride, dilation: one int per spatial dim.
        groups: G; C and K are multiples of G (depthwise: G == C).
        flip: True for ConvolutionMode.CONVOLUTION (the filter is flipped in every spatial dim).
        compute_type: FLOAT (fp32 accumulation) or DOUBLE.
        allow_tf32: the handle's math type allows TF32 for float32 products.
        algo: the algorithm's enum member (ConvolutionFwdAlgo, ...BwdDataAlgo, ...BwdFilterAlgo).
        alpha, beta: output blending.
        bias: (1, K, 1, ...) descriptor of a fused bias, or None (FORWARD only).
        z: descriptor of the fused residual, y's dims, or None (FORWARD only); alpha2 scales it.
        activation: a PointwiseMode *_FWD activation fused last (FORWARD only), or None;
            activation_coef is its coefficient (clipped relu's ceiling, elu's alpha, swish's beta).
        propagate_nan: the activation's NaN option (relu, clipped relu).
    """

    __hash__ = cached_hash  # problems key the per-call caches

    direction: ConvolutionDirection
    x: TensorDescriptor
    w: TensorDescriptor
    y: TensorDescriptor
    pre_padding: tuple[int, ...]
    post_padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    flip: bool
    compute_type: DataType
    allow_tf32: bool
    algo: enum.Enum
    alpha: float = 1.0
    beta: float = 0.0
    bias: TensorDescriptor | None = None
    z: TensorDescriptor | None = None
    alpha2: float = 0.0
    activation: PointwiseMode | None = None
    activation_coef: float = 0.0
    propagate_nan: bool = False

    @property
    def spatial_dims(self) -> int:
        return self.x.ndim - 2


def algorithm_refusal(problem: ConvolutionProblem) -> str | None:
    """Why ``problem.algo`` cannot compute ``problem`` on any backend, or None when it applies.

    The one declaration of which algorithms apply to which problems: every backend's ``supports``
    starts here (a backend may then refuse more, e.g. for a missing kernel).
    """
    method = METHOD[problem.algo]
    algo = f"{type(problem.algo).__name__}.{problem.algo.name}"
    if method in UNIMPLEMENTED_METHODS:
        return f"algo={algo} ({method.name}) is not implemented: use IMPLICIT_GEMM or GEMM algorithms"
    if method is ConvolutionMethod.DIRECT:
        per_group = problem.x.dims[1] // problem.groups
        if per_group > DIRECT_MAX_CHANNELS_PER_GROUP:
            return (
                f"algo={algo} applies to depthwise or few-channel convolutions (C/groups <= "
                f"{DIRECT_MAX_CHANNELS_PER_GROUP}), not C/groups={per_group}"
            )
    return None


# ---- descriptors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterDescriptor:
    """A filter of K output channels, C input channels per group and ``spatial`` taps (R, S[, T]).

    Args:
        dtype: element type.
        format: TensorFormat.NCHW for KCRS memory order, NHWC for KRSC (channels last).
        k, c, *spatial: the dims; c is C/groups for a grouped convolution.

    Raises:
        BadParam: a format other than NCHW or NHWC, a dim below 1, not 1 to 3 spatial dims.
    """

    dtype: DataType
    format: TensorFormat
    dims: tuple[int, ...]

    def __init__(self, dtype: Any, format: Any, k: int, c: int, *spatial: int) -> None:
        format = check_member("format", TensorFormat, format)
        require(1 <= len(spatial) <= 3, f"len(spatial)={len(spatial)} filter dims must be 1 to 3")
        dims = tuple(check_int(name, d) for name, d in zip(("k", "c", "r", "s", "t"), (k, c, *spatial)))
        for name, d in zip(("k", "c", "r", "s", "t"), dims):
            require(d >= 1, f"filter {name}={d} must be at least 1")
        object.__setattr__(self, "dtype", check_dtype("dtype", dtype))
        object.__setattr__(self, "format", format)
        object.__setattr__(self, "dims", dims)

    @property
    def tensor(self) -> TensorDescriptor:
        """The filter as a TensorDescriptor: dims K, C, R, S always, strides of the format."""
        if self.format is TensorFormat.NCHW:
            return TensorDescriptor(self.dtype, self.dims)
        order = (0, *range(2, len(self.dims)), 1)
        return TensorDescriptor(self.dtype, self.dims, strides_for_order(self.dims, order))


@dataclass(frozen=True)
class ConvolutionDescriptor:
    """The parameters of a convolution over 1 to 3 spatial dims.

    Args:
        pad: symmetric zero padding per spatial dim (cuDNN's), ignored where pre_padding and
            post_padding are given.
        stride, dilation: per spatial dim, each at least 1.
        mode: ConvolutionMode.
        compute_type: FLOAT (fp32 accumulation, for fp32/fp16/bf16 tensors) or DOUBLE (fp64).
        group_count: G; C and K must be multiples of G.
        math_type: MathType: TENSOR_OP allows TF32 for fp32 products, FMA forbids it, DEFAULT
            follows the handle's math type.
        pre_padding, post_padding: asymmetric padding (before and after each spatial dim).

    Raises:
        BadParam: lengths that differ, a negative pad, a stride or dilation below 1, ...
    """

    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION
    compute_type: DataType = DataType.FLOAT
    group_count: int = 1
    math_type: MathType = MathType.DEFAULT
    pre_padding: tuple[int, ...] | None = None
    post_padding: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        spatial = len(check_ints("stride", self.stride))
        require(1 <= spatial <= 3, f"len(stride)={spatial} must be 1, 2 or 3 (spatial dims)")
        fields = {
            "pad": self.pad,
            "stride": self.stride,
            "dilation": self.dilation,
            "pre_padding": self.pad if self.pre_padding is None else self.pre_padding,
            "post_padding": self.pad if self.post_padding is None else self.post_padding,
        }
        for name, value in fields.items():
            values = check_ints(name, value)
            require(len(values) == spatial, f"len({name})={len(values)} must equal len(stride)={spatial}")
            low = 0 if "pad" in name else 1
            for k, v in enumerate(values):
                require(v >= low, f"{name}[{k}]={v} must be at least {low}")
            object.__setattr__(self, name, values)
        object.__setattr__(self, "mode", check_member("mode", ConvolutionMode, self.mode))
        compute = check_dtype("compute_type", self.compute_type)
        require(compute in (DataType.FLOAT, DataType.DOUBLE), f"compute_type={compute.name} must be FLOAT or DOUBLE")
        object.__setattr__(self, "compute_type", compute)
        groups = check_int("group_count", self.group_count)
        require(groups >= 1, f"group_count={groups} must be at least 1")
        object.__setattr__(self, "group_count", groups)
        object.__setattr__(self, "math_type", check_member("math_type", MathType, self.math_type))

    @property
    def spatial_dims(self) -> int:
        return len(self.stride)

    def _paddings(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(pre_padding, post_padding): given or from ``pad``, always set once constructed."""
        return cast(tuple[int, ...], self.pre_padding), cast(tuple[int, ...], self.post_padding)


def filter_tensor(w_desc: FilterDescriptor | TensorDescriptor, name: str = "w_desc") -> TensorDescriptor:
    """A filter given as a FilterDescriptor or as a TensorDescriptor (K, C/G, R, S dims) as the latter."""
    if isinstance(w_desc, FilterDescriptor):
        return w_desc.tensor
    require(isinstance(w_desc, TensorDescriptor), f"{name}={w_desc!r} must be a FilterDescriptor or a TensorDescriptor")
    return w_desc


def output_dims(conv_desc: ConvolutionDescriptor, x_dims: Sequence[int], w_dims: Sequence[int]) -> tuple[int, ...]:
    """(N, K, *out) with out[d] = (in + pre + post - dilation * (filt - 1) - 1) // stride + 1 (may be < 1)."""
    pre_padding, post_padding = conv_desc._paddings()
    out = tuple(
        (x + pre + post - dil * (f - 1) - 1) // s + 1
        for x, f, pre, post, s, dil in zip(
            x_dims[2:], w_dims[2:], pre_padding, post_padding, conv_desc.stride, conv_desc.dilation
        )
    )
    return (x_dims[0], w_dims[0], *out)


def get_convolution_forward_output_dim(
    conv_desc: ConvolutionDescriptor, x_desc: TensorDescriptor, w_desc: FilterDescriptor | TensorDescriptor
) -> tuple[int, ...]:
    """The dims of y, (N, K, *out), for x convolved with w.

    Raises:
        BadParam: mismatched ranks or channels, groups not dividing C or K, an output dim below 1.
    """
    w = filter_tensor(w_desc)
    _check_geometry(conv_desc, x_desc, w)
    dims = output_dims(conv_desc, x_desc.dims, w.dims)
    _check_output_positive(dims)
    return dims


def _check_geometry(
    conv_desc: ConvolutionDescriptor,
    x: TensorDescriptor,
    w: TensorDescriptor,
    x_name: str = "x_desc",
    w_name: str = "w_desc",
) -> None:
    require(isinstance(conv_desc, ConvolutionDescriptor), f"conv_desc={conv_desc!r} must be a ConvolutionDescriptor")
    require(isinstance(x, TensorDescriptor), f"{x_name}={x!r} must be a TensorDescriptor")
    spatial = conv_desc.spatial_dims
    require(
        x.ndim == spatial + 2,
        f"{x_name}.ndim={x.ndim} must equal 2 + conv_desc's {spatial} spatial dims",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    require(
        w.ndim == spatial + 2,
        f"{w_name}.ndim={w.ndim} must equal 2 + conv_desc's {spatial} spatial dims",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    groups, channels, filters = conv_desc.group_count, x.dims[1], w.dims[0]
    require(channels % groups == 0, f"{x_name}.dims[1]={channels} (C) must be a multiple of group_count={groups}")
    require(filters % groups == 0, f"{w_name}.dims[0]={filters} (K) must be a multiple of group_count={groups}")
    require(
        w.dims[1] == channels // groups,
        f"{w_name}.dims[1]={w.dims[1]} must equal {x_name}.dims[1]/group_count={channels // groups}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )


def _check_output_positive(dims: tuple[int, ...]) -> None:
    for k, d in enumerate(dims[2:]):
        require(
            d >= 1,
            f"output spatial dim {k} = {d} must be at least 1: the dilated filter is larger than the padded input",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )


# ---- the problem ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)  # the cuDNN-shaped calls keep no plan: they ask again on every call
def convolution_problem(
    direction: ConvolutionDirection,
    conv_desc: ConvolutionDescriptor,
    x_desc: TensorDescriptor,
    w_desc: FilterDescriptor | TensorDescriptor,
    y_desc: TensorDescriptor,
    *,
    algo: enum.Enum | None = None,
    allow_tf32: bool = False,
    alpha: float = 1.0,
    beta: float = 0.0,
    bias_desc: TensorDescriptor | None = None,
    z_desc: TensorDescriptor | None = None,
    alpha2: float = 0.0,
    activation: PointwiseMode | None = None,
    activation_coef: float | None = None,
    propagate_nan: bool = False,
    names: Sequence[str] = ("x_desc", "w_desc", "y_desc"),
) -> ConvolutionProblem:
    """The shape and dtype rules of every convolution call; ``names`` are the caller's names of
    the x, w and y descriptors (dx_desc, dw_desc, dy_desc) for the messages. ``activation_coef``
    None is the activation's default (``resolved_coef`` of the pointwise family's problem.py).

    Raises:
        BadParam: ranks not 3 to 5 or unequal, C not w's C * groups, groups not dividing C or K,
            y's dims not (N, K, *out), an output dim below 1, dtypes that differ or are not float,
            a compute type that does not fit the dtype, a bias not (1, K, 1, ...), z not y's dims,
            an epilogue with beta != 0, an algorithm of another direction, non-finite scalars.
    """
    x_name, w_name, y_name = names
    w = filter_tensor(w_desc, w_name)
    require(isinstance(y_desc, TensorDescriptor), f"{y_name}={y_desc!r} must be a TensorDescriptor")
    _check_geometry(conv_desc, x_desc, w, x_name, w_name)
    expected = output_dims(conv_desc, x_desc.dims, w.dims)
    _check_output_positive(expected)
    require(
        y_desc.ndim == x_desc.ndim,
        f"{y_name}.ndim={y_desc.ndim} must equal {x_name}.ndim={x_desc.ndim}",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    for k, (got, want) in enumerate(zip(y_desc.dims, expected)):
        require(
            got == want,
            f"{y_name}.dims[{k}]={got} must equal {want} (get_convolution_forward_output_dim gives {list(expected)})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    dtype = x_desc.dtype
    require(
        dtype.is_floating,
        f"{x_name}.dtype={dtype.name} must be FLOAT, DOUBLE, HALF or BFLOAT16",
        Status.NOT_SUPPORTED_DATA_TYPE,
    )
    for name, desc in ((w_name, w), (y_name, y_desc)):
        require(desc.dtype is dtype, f"{name}.dtype={desc.dtype.name} must equal {x_name}.dtype={dtype.name}")
    compute = conv_desc.compute_type
    needed = DataType.DOUBLE if dtype is DataType.DOUBLE else DataType.FLOAT
    require(compute is needed, f"conv_desc.compute_type={compute.name} must be {needed.name} for {dtype.name} tensors")
    alpha, beta, alpha2 = check_finite("alpha", alpha), check_finite("beta", beta), check_finite("alpha2", alpha2)
    algo = DEFAULT_ALGORITHM[direction] if algo is None else algo
    family = ALGORITHMS[direction]
    if type(algo) is int and algo in family._value2member_map_:  # a cuDNN enum's value, as C passes it
        algo = family(algo)
    require(isinstance(algo, family), f"algo={algo!r} must be a {family.__name__} for {direction.value}")
    epilogue = bias_desc is not None or z_desc is not None or activation is not None
    if epilogue:
        require(direction is ConvolutionDirection.FORWARD, "a bias, z or activation epilogue is forward-only")
        require(beta == 0.0, f"beta={beta} must be 0 with a fused epilogue (alpha2 scales z instead)")
        activation = _check_epilogue(y_desc, bias_desc, z_desc, activation)
    coef = 0.0 if activation is None else resolved_coef(activation, activation_coef)
    if activation is PointwiseMode.IDENTITY:
        activation = None  # backends see *_FWD activations only
    flip = conv_desc.mode is ConvolutionMode.CONVOLUTION
    problem = ConvolutionProblem(
        direction,
        x_desc,
        w,
        y_desc,
        *conv_desc._paddings(),
        conv_desc.stride,
        conv_desc.dilation,
        conv_desc.group_count,
        flip,
        compute,
        bool(allow_tf32) and dtype is DataType.FLOAT,
        algo,
        alpha,
        beta,
        bias_desc,
        z_desc,
        alpha2,
        activation,
        coef,
        bool(propagate_nan),
    )
    return canonical(problem)


def _check_epilogue(
    y: TensorDescriptor, bias: TensorDescriptor | None, z: TensorDescriptor | None, activation: PointwiseMode | None
) -> PointwiseMode | None:
    if bias is not None:
        want = tuple(y.dims[1] if k == 1 else 1 for k in range(y.ndim))
        require(isinstance(bias, TensorDescriptor), f"bias_desc={bias!r} must be a TensorDescriptor")
        require(
            bias.dims == want,
            f"bias_desc.dims={list(bias.dims)} must be {list(want)} (one value per output channel K={y.dims[1]})",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            bias.dtype.is_floating,
            f"bias_desc.dtype={bias.dtype.name} must be a float type",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    if z is not None:
        require(isinstance(z, TensorDescriptor), f"z_desc={z!r} must be a TensorDescriptor")
        require(
            z.dims == y.dims,
            f"z_desc.dims={list(z.dims)} must equal y_desc.dims={list(y.dims)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
        require(
            z.dtype.is_floating, f"z_desc.dtype={z.dtype.name} must be a float type", Status.NOT_SUPPORTED_DATA_TYPE
        )
    if activation is not None:
        activation = check_member("activation", PointwiseMode, activation)
        require(
            activation is PointwiseMode.IDENTITY or activation.value.endswith("_fwd"),
            f"activation={activation.name} must be IDENTITY or a *_FWD activation mode",
        )
    return activation


# ---- the float64 NumPy reference -----------------------------------------------------------------


def _taps(problem: ConvolutionProblem) -> list[tuple[tuple[int, ...], tuple[slice, ...]]]:
    """For each filter tap r: (r, the slice of the padded x that tap r reads for every output)."""
    out = problem.y.dims[2:]
    taps = []
    for r in itertools.product(*(range(f) for f in problem.w.dims[2:])):
        index = tuple(
            slice(rd * dil, rd * dil + s * (o - 1) + 1, s)
            for rd, dil, s, o in zip(r, problem.dilation, problem.stride, out)
        )
        taps.append((r, index))
    return taps


def _grouped(a: np.ndarray, groups: int) -> np.ndarray:
    """(N, C, ...) -> (N, G, C/G, ...)."""
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, *a.shape[2:])


def _filter_groups(w: np.ndarray, problem: ConvolutionProblem) -> np.ndarray:
    """(K, C/G, *filt) -> (G, K/G, C/G, *filt), flipped for ConvolutionMode.CONVOLUTION."""
    if problem.flip:
        w = w[(slice(None), slice(None), *(slice(None, None, -1),) * problem.spatial_dims)]
    return w.reshape(problem.groups, w.shape[0] // problem.groups, *w.shape[1:])


def _tap(r: tuple[int, ...]) -> tuple[Any, ...]:
    """The index of filter tap ``r`` in the trailing dims of a filter array."""
    return (..., *r)


def _padded_shape(problem: ConvolutionProblem) -> tuple[int, ...]:
    x = problem.x.dims
    return (*x[:2], *(d + pre + post for d, pre, post in zip(x[2:], problem.pre_padding, problem.post_padding)))


def _interior(problem: ConvolutionProblem) -> tuple[slice, ...]:
    """The slice of the padded x holding x itself."""
    return (slice(None), slice(None), *(slice(p, p + d) for p, d in zip(problem.pre_padding, problem.x.dims[2:])))


def reference_forward(problem: ConvolutionProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[n, k, o] = sum_{c in k's group, r} x_padded[n, c, o * stride + r * dilation] * w[k, c, r]."""
    x_padded = np.zeros(_padded_shape(problem), x.dtype)
    x_padded[_interior(problem)] = x
    wg = _filter_groups(w, problem)
    y = np.zeros((x.shape[0], problem.groups, wg.shape[1], *problem.y.dims[2:]), x.dtype)
    for r, index in _taps(problem):
        patch = _grouped(x_padded[(slice(None), slice(None), *index)], problem.groups)
        y += np.einsum("ngc...,gkc->ngk...", patch, wg[_tap(r)])
    return y.reshape(problem.y.dims)


def reference_backward_data(problem: ConvolutionProblem, dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """dx: the adjoint of the forward map in x."""
    wg = _filter_groups(w, problem)
    dyg = _grouped(dy, problem.groups)
    dx_padded = np.zeros(_padded_shape(problem), dy.dtype)
    for r, index in _taps(problem):
        view = dx_padded[(slice(None), slice(None), *index)]
        view += np.einsum("ngk...,gkc->ngc...", dyg, wg[_tap(r)]).reshape(view.shape)
    return dx_padded[_interior(problem)]


def reference_backward_filter(problem: ConvolutionProblem, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """dw: the adjoint of the forward map in w."""
    x_padded = np.zeros(_padded_shape(problem), x.dtype)
    x_padded[_interior(problem)] = x
    dyg = _grouped(dy, problem.groups)
    groups, per_group = problem.groups, problem.w.dims[0] // problem.groups
    dw = np.zeros((groups, per_group, *problem.w.dims[1:]), x.dtype)
    for r, index in _taps(problem):
        patch = _grouped(x_padded[(slice(None), slice(None), *index)], groups)
        dw[_tap(r)] = np.einsum("ngko,ngco->gkc", dyg.reshape(*dyg.shape[:3], -1), patch.reshape(*patch.shape[:3], -1))
    dw = dw.reshape(problem.w.dims)
    if problem.flip:
        dw = dw[(slice(None), slice(None), *(slice(None, None, -1),) * problem.spatial_dims)]
    return dw


def reference_epilogue(
    problem: ConvolutionProblem, conv: np.ndarray, bias: np.ndarray | None, z: np.ndarray | None
) -> np.ndarray:
    """act(alpha * conv + alpha2 * z + bias): the fused forward epilogue (alpha alone without one)."""
    result = problem.alpha * conv
    if z is not None:
        result = result + problem.alpha2 * z
    if bias is not None:
        result = result + bias
    if problem.activation is not None and problem.activation is not PointwiseMode.IDENTITY:
        result = pointwise_reference(problem.activation, [result], problem.activation_coef, problem.propagate_nan)
    return result


def reference_backward_bias(dy: np.ndarray) -> np.ndarray:
    """db[0, k, 0, ...] = sum over n and the spatial dims of dy[n, k, ...]."""
    return dy.sum(axis=(0, *range(2, dy.ndim)), keepdims=True)


def reference(
    problem: ConvolutionProblem,
    x: np.ndarray | None,
    w: np.ndarray | None,
    y: np.ndarray | None,
    bias: np.ndarray | None = None,
    z: np.ndarray | None = None,
) -> np.ndarray:
    """The output of ``problem`` before the beta blend: alpha * (y, dx or dw), or the fused forward
    ``act(alpha * conv + alpha2 * z + bias)``; inputs given as arrays in the compute dtype (y is dy
    for the backward directions; the output's own array is not needed)."""
    if problem.direction is ConvolutionDirection.FORWARD:
        assert x is not None and w is not None, "the forward reads x and w"
        conv = reference_forward(problem, x, w)
    elif problem.direction is ConvolutionDirection.BACKWARD_DATA:
        assert y is not None and w is not None, "backward data reads dy and w"
        conv = reference_backward_data(problem, y, w)
    else:
        assert x is not None and y is not None, "backward filter reads x and dy"
        conv = reference_backward_filter(problem, x, y)
    return blend_output(problem, conv, bias, z)


def blend_output(
    problem: ConvolutionProblem, conv: np.ndarray, bias: np.ndarray | None, z: np.ndarray | None
) -> np.ndarray:
    """The output before the beta blend from the bare convolution of ``problem``'s direction:
    the fused forward epilogue, alpha * dx or alpha * dw."""
    if problem.direction is ConvolutionDirection.FORWARD:
        return reference_epilogue(problem, conv, bias, z)
    return problem.alpha * conv
