"""The Pythonic convolution functions: ``conv`` for 1 to 3 spatial dims, ``conv_transpose``, and the
backward functions, with torch.nn.functional's arguments.

Each output has the memory order of the function's main input (NHWC in, NHWC out). ``algo`` picks
a cuDNN algorithm (default: implicit GEMM, no workspace for the forward, or the one the backend
prefers, ``algorithms.default_algorithm``: on the Triton backend a TF32 forward over NCHW x takes
IMPLICIT_PRECOMP_GEMM and reads channels-last copies in its workspace, a depthwise forward or
backward data the algorithm that reads its filter packed in the workspace, and a forward or backward
filter over fewer than 4 input channels the one that reads x padded in the workspace); any workspace
it needs is allocated here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from opendnn.core.arrays import (
    Bound,
    allocate,
    as_native,
    empty_like,
    keyed_bound,
    packed_like,
    scratch_bytes,
    strided_view,
    wrap,
)
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import TensorDescriptor, check_int, check_ints
from opendnn.core.dispatch import dispatch, execute, load_backend
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, OpenDnnError, Status, require
from opendnn.core.handle import Handle, MathType
from opendnn.core.memo import memoized
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.convolution.algorithms import default_algorithm
from opendnn.families.convolution.api import math_allows_tf32, workspace_size
from opendnn.families.convolution.problem import (
    ConvolutionDescriptor,
    ConvolutionDirection,
    ConvolutionMode,
    ConvolutionProblem,
    convolution_problem,
    get_convolution_forward_output_dim,
)
from opendnn.families.pointwise.functional import activation_mode
from opendnn.families.pointwise.problem import PointwiseMode
from opendnn.families.pointwise.tensor_ops_api import add_tensor
from opendnn.families.reduce.problem import ReduceTensorDescriptor, ReduceTensorOp, reduce_problem

IntOrTuple = int | Sequence[int]


@caller_dtypes
def conv(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """torch.nn.functional.conv{1,2,3}d: x (N, C, *in), w (K, C/groups, *filt), bias (K,) or None.

    Args:
        padding: an int or one per spatial dim (symmetric), "valid" (none) or "same" (stride 1:
            the output has the input's size; an odd total puts the extra zero after, as torch).
        mode: CROSS_CORRELATION (torch's) or CONVOLUTION (the filter flipped).

    Returns:
        y (N, K, *out) in x's memory order and of x's kind.
    """
    return _forward(x, w, bias, None, None, 0.0, 0.0, stride, padding, dilation, groups, mode, algo, handle)


@caller_dtypes
def conv_bias_activation(
    x: Any,
    w: Any,
    bias: Any = None,
    z: Any = None,
    activation: str | PointwiseMode | None = None,
    *,
    coef: float | None = None,
    alpha2: float = 1.0,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    mode: ConvolutionMode = ConvolutionMode.CROSS_CORRELATION,
    algo: enum.Enum | None = None,
    propagate_nan: bool = False,
    handle: Handle | None = None,
) -> Any:
    """``act(conv(x, w) + alpha2 * z + bias)`` in one pass: cuDNN's ConvolutionBiasActivationForward.

    Args:
        z: a residual of y's shape (any layout), or None.
        activation: a forward activation as torch names it ("relu", "silu", "identity", ...) or a
            PointwiseMode, or None; ``coef`` is its coefficient, None for torch's default (elu's
            alpha 1, silu's and softplus's beta 1); clipped relu's ceiling must be given (6.0 for relu6).
        propagate_nan: a relu or clipped relu keeps NaN (torch's ReLU, ReLU6 and Hardtanh); False
            (cuDNN's default, NOT_PROPAGATE_NAN): NaN becomes 0.
        The other arguments are ``conv``'s.

    Returns:
        y (N, K, *out) in x's memory order and of x's kind.
    """
    return _forward(
        x,
        w,
        bias,
        z,
        activation_mode(activation),
        coef,
        alpha2 if z is not None else 0.0,
        stride,
        padding,
        dilation,
        groups,
        mode,
        algo,
        handle,
        propagate_nan,
    )


def _forward(
    x: Any,
    w: Any,
    bias: Any,
    z: Any,
    activation: PointwiseMode | None,
    coef: float | None,
    alpha2: float,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    mode: ConvolutionMode,
    algo: enum.Enum | None,
    handle: Handle | None,
    propagate_nan: bool = False,
) -> Any:
    arguments = (stride, padding, dilation, groups, mode, algo, activation, coef, alpha2, propagate_nan)
    key = signature("conv", (x, w, bias, z), arguments)
    planned = None if key is None else _planned(key, handle, ("x", "w", "bias", "z"), (x, w, bias, z))
    if planned is not None:
        return planned
    xb, wb = wrap("x", x), wrap("w", w)
    biasb = _per_channel(wrap("bias", bias), xb.desc.ndim, wb.desc.dims[0]) if bias is not None else None
    zb = wrap("z", z) if z is not None else None
    handle = handle_for(xb, handle)
    try:
        y_desc, problem = _forward_plan(
            xb.desc,
            wb.desc,
            stride,
            padding,
            dilation,
            groups,
            mode,
            algo,
            handle.math_type,
            biasb.desc if biasb is not None else None,
            zb.desc if zb is not None else None,
            activation,
            coef,
            alpha2,
            propagate_nan,
        )
        if algo is None:  # the default, or the algorithm the handle's backend prefers for the problem
            problem = default_algorithm(handle, problem)
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    y = allocate(xb, y_desc)
    _run(handle, problem, key, (xb, wb, biasb, zb), xb, wb, y, biasb, zb)
    return to_caller_kind(y.view, x)


@caller_dtypes
def conv_transpose(
    x: Any,
    w: Any,
    bias: Any = None,
    stride: IntOrTuple = 1,
    padding: IntOrTuple = 0,
    output_padding: IntOrTuple = 0,
    groups: int = 1,
    dilation: IntOrTuple = 1,
    *,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """torch.nn.functional.conv_transpose{1,2,3}d: the backward data of a convolution.

    x (N, C_in, *in), w (C_in, C_out/groups, *filt), bias (C_out,) or None; the output has
    ``(in - 1) * stride - 2 * padding + dilation * (filt - 1) + output_padding + 1`` per spatial dim.
    """
    dyb, wb = wrap("x", x), wrap("w", w)
    spatial, groups = dyb.desc.ndim - 2, check_int("groups", groups)
    # the output's dims come from these before any rule sees them (the messages are formatted only on failure)
    if wb.desc.ndim != dyb.desc.ndim:
        raise BadParam(f"w.ndim={wb.desc.ndim} must equal x.ndim={dyb.desc.ndim}", Status.BAD_PARAM_SHAPE_MISMATCH)
    if wb.desc.dims[0] != dyb.desc.dims[1]:
        raise BadParam(
            f"w.shape[0]={wb.desc.dims[0]} must equal x.shape[1]={dyb.desc.dims[1]} (in_channels)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    if groups < 1:
        raise BadParam(f"groups={groups} must be at least 1")
    strides, pads = check_ints("stride", stride, spatial), check_ints("padding", padding, spatial)
    extras, dilations = check_ints("output_padding", output_padding, spatial), check_ints("dilation", dilation, spatial)
    for k, (extra, s, d) in enumerate(zip(extras, strides, dilations)):
        require(
            0 <= extra < max(s, d),
            f"output_padding[{k}]={extra} must be at least 0 and below stride or dilation ({max(s, d)})",
        )
    out = tuple(
        (i - 1) * s - 2 * p + d * (f - 1) + e + 1
        for i, s, p, d, f, e in zip(dyb.desc.dims[2:], strides, pads, dilations, wb.desc.dims[2:], extras)
    )
    dims = (dyb.desc.dims[0], wb.desc.dims[1] * groups, *out)
    biasb = _per_channel(wrap("bias", bias), dyb.desc.ndim, dims[1]) if bias is not None else None
    post = transpose_post_padding(pads, strides, extras)
    dx = _backward_data(dyb, wb, dims, strides, pads, dilations, groups, algo, handle, _TRANSPOSE_NAMES, post=post)
    if biasb is not None:
        add_tensor(handle_for(dx, handle), 1.0, biasb.desc, biasb.view, 1.0, dx.desc, dx.view)
    return to_caller_kind(dx.view, x)


def transpose_post_padding(pads: tuple[int, ...], strides: tuple[int, ...], extras: tuple[int, ...]) -> tuple[int, ...]:
    """The trailing padding of the forward convolution whose backward data is a transposed convolution
    with these output paddings: its own padding where the stride's rounding absorbs the extra outputs
    (output_padding below the stride), else less by the extra (an output_padding up to the dilation,
    past the stride: the outputs that the symmetric padding would crop, uncropped).

    Raises:
        NotSupported: an output_padding past padding + stride - 1, whose last outputs no input reaches.
    """
    post = []
    for k, (p, s, e) in enumerate(zip(pads, strides, extras)):
        if e <= s - 1:
            post.append(p)
            continue
        if e > p + s - 1:
            raise NotSupported(
                f"output_padding[{k}]={e} with padding[{k}]={p} and stride[{k}]={s}: outputs past every input's "
                f"reach (output_padding above padding + stride - 1 = {p + s - 1}) are not implemented"
            )
        post.append(max(p - e, 0))
    return tuple(post)


@caller_dtypes
def conv_backward_data(
    dy: Any,
    w: Any,
    input_shape: Sequence[int],
    stride: IntOrTuple = 1,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """dx of ``conv(x, w, stride=..., ...)`` given dy; ``input_shape`` is x's shape (N, C, *in).

    The gradient comes first, as in every backward function of ``opendnn.functional``;
    ``conv_input`` takes torch.nn.grad.conv{1,2,3}d_input's order (input_size, weight, grad_output).

    Raises:
        BadParam: ``dy`` is a shape (torch's order: call ``conv_input``), or a rule of ``conv``.
    """
    _refuse_shape("dy", dy, "conv_backward_data(dy, w, input_shape)", "conv_input(input_size, weight, grad_output)")
    return _data_gradient(dy, w, input_shape, stride, padding, dilation, groups, algo, handle, _BACKWARD_DATA_NAMES)


@caller_dtypes
def conv_input(
    input_size: Sequence[int],
    weight: Any,
    grad_output: Any,
    stride: IntOrTuple = 1,
    padding: IntOrTuple = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """torch.nn.grad.conv{1,2,3}d_input: the gradient of ``conv``'s input, in torch's argument order.

    Args:
        input_size: the input's shape (N, C, *in).
        weight: the filter (K, C/groups, *filt).
        grad_output: the gradient of the loss with respect to ``conv``'s output (N, K, *out).
        stride, padding, dilation, groups: the forward's.
        algo: a cuDNN backward-data algorithm (default: implicit GEMM, no workspace, or the one the
            backend prefers, as ``conv``'s).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        The input's gradient, of ``input_size``, in grad_output's memory order and of its kind.

    Raises:
        BadParam: ``input_size`` is an array (opendnn's order: call ``conv_backward_data``), or a rule of ``conv``.
    """
    _refuse_array("input_size", input_size, "conv_input(input_size, weight, grad_output)")
    return _data_gradient(
        grad_output, weight, input_size, stride, padding, dilation, groups, algo, handle, _INPUT_NAMES
    )


def _data_gradient(
    dy: Any,
    w: Any,
    input_shape: Sequence[int],
    stride: IntOrTuple,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    groups: int,
    algo: enum.Enum | None,
    handle: Handle | None,
    names: CallerNames,
) -> Any:
    arguments = (tuple(input_shape), stride, padding, dilation, groups, algo)
    key = signature("conv_backward_data", (dy, w), arguments) if isinstance(input_shape, Sequence) else None
    planned = None if key is None else _planned(key, handle, ("dy", "w"), (dy, w))
    if planned is not None:
        return planned
    try:
        dyb, wb = wrap("dy", dy), wrap("w", w)
        dims = _shape("input_shape", input_shape)
        if len(dims) != dyb.desc.ndim:  # (the message is formatted only on failure)
            raise BadParam(f"input_shape={dims} must have dy's {dyb.desc.ndim} dims", Status.BAD_PARAM_SHAPE_MISMATCH)
    except OpenDnnError as error:
        raise names.renamed(error) from None
    dx = _backward_data(dyb, wb, dims, stride, padding, dilation, groups, algo, handle, names, key)
    return to_caller_kind(dx.view, dy)


@caller_dtypes
def conv_backward_filter(
    x: Any,
    dy: Any,
    weight_shape: Sequence[int],
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """dw of ``conv(x, w, stride=..., ...)`` given dy; ``weight_shape`` is w's (K, C/groups, *filt).
    dw has x's memory order (KRSC for an NHWC x).

    ``conv_weight`` takes torch.nn.grad.conv{1,2,3}d_weight's order (input, weight_size, grad_output).

    Raises:
        BadParam: ``dy`` is a shape (torch's order: call ``conv_weight``), or a rule of ``conv``.
    """
    _refuse_shape("dy", dy, "conv_backward_filter(x, dy, weight_shape)", "conv_weight(input, weight_size, grad_output)")
    return _filter_gradient(
        x, dy, weight_shape, stride, padding, dilation, groups, algo, handle, _BACKWARD_FILTER_NAMES
    )


@caller_dtypes
def conv_weight(
    input: Any,
    weight_size: Sequence[int],
    grad_output: Any,
    stride: IntOrTuple = 1,
    padding: IntOrTuple | str = 0,
    dilation: IntOrTuple = 1,
    groups: int = 1,
    *,
    algo: enum.Enum | None = None,
    handle: Handle | None = None,
) -> Any:
    """torch.nn.grad.conv{1,2,3}d_weight: the gradient of ``conv``'s filter, in torch's argument order.

    Args:
        input: ``conv``'s input (N, C, *in).
        weight_size: the filter's shape (K, C/groups, *filt).
        grad_output: the gradient of the loss with respect to ``conv``'s output (N, K, *out).
        stride, padding, dilation, groups: the forward's.
        algo: a cuDNN backward-filter algorithm (default: implicit GEMM, no workspace).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        The filter's gradient, of ``weight_size``, in input's memory order and of its kind.

    Raises:
        BadParam: ``weight_size`` is an array (opendnn's order: call ``conv_backward_filter``), or a rule of ``conv``.
    """
    _refuse_array("weight_size", weight_size, "conv_weight(input, weight_size, grad_output)")
    return _filter_gradient(
        input, grad_output, weight_size, stride, padding, dilation, groups, algo, handle, _WEIGHT_NAMES
    )


def _filter_gradient(
    x: Any,
    dy: Any,
    weight_shape: Sequence[int],
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    algo: enum.Enum | None,
    handle: Handle | None,
    names: CallerNames,
) -> Any:
    arguments = (tuple(weight_shape), stride, padding, dilation, groups, algo)
    key = signature("conv_backward_filter", (x, dy), arguments) if isinstance(weight_shape, Sequence) else None
    planned = None if key is None else _planned(key, handle, ("x", "dy"), (x, dy))
    if planned is not None:
        return planned
    try:
        xb, dyb = wrap("x", x), wrap("dy", dy)
        handle = handle_for(xb, handle)
        dw_desc, problem = _backward_filter_plan(
            xb.desc,
            dyb.desc,
            _shape("weight_shape", weight_shape),
            stride,
            padding,
            dilation,
            groups,
            algo,
            handle.math_type,
        )
        if algo is None:  # the default, or the algorithm the handle's backend prefers for the problem
            problem = default_algorithm(handle, problem)
    except OpenDnnError as error:
        raise names.renamed(error) from None
    dw = allocate(xb, dw_desc)
    _run(handle, problem, key, (xb, dyb), xb, dw, dyb, None)
    return to_caller_kind(dw.view, x)


def _refuse_shape(name: str, value: Any, order: str, torch_form: str) -> None:
    """A shape (tuple, list, torch.Size) where ``order`` wants an array: torch's argument order."""
    if isinstance(value, (tuple, list)):
        raise BadParam(f"{name}={tuple(value)} must be an array, not a shape: {order}; torch's order is {torch_form}")


def _refuse_array(name: str, value: Any, order: str) -> None:
    """An array where ``order`` wants a shape: opendnn's conv_backward_* order."""
    if not isinstance(value, (tuple, list)):
        raise BadParam(f"{name} of type {type(value).__name__} must be a shape (a tuple of ints): {order}")


@caller_dtypes
def conv_backward_bias(dy: Any, *, handle: Handle | None = None) -> Any:
    """db (K,): the sum of dy (N, K, *out) over N and the spatial dims."""
    dyb = wrap("dy", dy)
    if not 3 <= dyb.desc.ndim <= 5:  # (messages are formatted only on failure: these run for every call)
        raise BadParam(f"dy.ndim={dyb.desc.ndim} must be 3, 4 or 5")
    k = dyb.desc.dims[1]
    db = empty_like(dyb, dims=(k,))
    dbb = Bound(
        "db",
        TensorDescriptor(db.desc.dtype, _channel_dims(k, dyb.desc.ndim)),
        db.view.reshape(_channel_dims(k, dyb.desc.ndim)),
        db.device,
    )
    compute = DataType.DOUBLE if dyb.desc.dtype is DataType.DOUBLE else DataType.FLOAT
    problem = reduce_problem(ReduceTensorDescriptor(ReduceTensorOp.ADD, compute), dyb.desc, dbb.desc)
    handle = handle_for(dyb, handle)
    needed = load_backend("reduce", handle.backend, handle.device).workspace_size(problem)
    workspace = scratch_bytes(dyb, needed)
    dispatch(handle, "reduce", problem, dyb, dbb, None, workspace)
    return to_caller_kind(db.view, dy)


# ---- helpers -------------------------------------------------------------------------------------

# what each function calls the convolution descriptor's fields and the problem's tensors
_GEOMETRY = {"group_count": "groups", "pad": "padding", "pre_padding": "padding", "post_padding": "padding"}
_NAMES = CallerNames({**_GEOMETRY, "x_desc": "x", "w_desc": "w", "y_desc": "y", "bias_desc": "bias", "z_desc": "z"})
_BACKWARD_DATA_NAMES = CallerNames({**_GEOMETRY, "x_desc": "input_shape", "w_desc": "w", "y_desc": "dy"})
_TRANSPOSE_NAMES = CallerNames(
    {**_GEOMETRY, "x_desc": "y", "input_shape": "y", "w_desc": "w", "y_desc": "x", "dy": "x"}
)
_BACKWARD_FILTER_NAMES = CallerNames(
    {**_GEOMETRY, "x_desc": "x", "w_desc": "weight_shape", "w": "weight_shape", "y_desc": "dy"}
)
_INPUT_NAMES = CallerNames(
    {**_GEOMETRY, "x_desc": "input_size", "input_shape": "input_size", "w_desc": "weight", "w": "weight"}
    | {"y_desc": "grad_output", "dy": "grad_output"}
)
_WEIGHT_NAMES = CallerNames(
    {**_GEOMETRY, "x_desc": "input", "x": "input", "w_desc": "weight_size", "w": "weight_size"}
    | {"weight_shape": "weight_size", "y_desc": "grad_output", "dy": "grad_output"}
)


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    """A tensor shape the caller gives (input_shape, weight_shape): ints of at least 1."""
    dims = check_ints(name, shape)
    if min(dims) < 1:  # (the message is formatted only on failure)
        raise BadParam(f"{name}={tuple(dims)} must hold sizes of at least 1")
    return dims


def _backward_data(
    dyb: Bound,
    wb: Bound,
    dims: tuple[int, ...],
    stride: IntOrTuple,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    groups: int,
    algo: enum.Enum | None,
    handle: Handle | None,
    names: CallerNames,
    key: tuple[Any, ...] | None = None,
    post: tuple[int, ...] | None = None,
) -> Bound:
    """dx of ``dims`` from dy; ``post``: the trailing padding where it differs from ``padding``."""
    handle = handle_for(dyb, handle)
    try:
        dx_desc, problem = _backward_data_plan(
            dyb.desc, wb.desc, dims, stride, padding, dilation, groups, algo, handle.math_type, post
        )
        if algo is None:  # the default, or the algorithm the handle's backend prefers for the problem
            problem = default_algorithm(handle, problem)
    except OpenDnnError as error:
        raise names.renamed(error) from None
    dx = allocate(dyb, dx_desc)
    _run(handle, problem, key, (dyb, wb), dx, wb, dyb, None)
    return dx


def _run(
    handle: Handle,
    problem: ConvolutionProblem,
    key: tuple[Any, ...] | None,
    keyed: tuple[Bound | None, ...],
    x: Bound,
    w: Bound,
    y: Bound,
    bias: Bound | None,
    z: Bound | None = None,
) -> None:
    """Dispatch, and keep the call's plan under ``key``: the descriptors of its ``keyed`` inputs (in
    the key's order), its output's and the workspace size."""
    needed = workspace_size(handle, problem)
    implementation = dispatch(handle, "convolution", problem, x, w, y, bias, z, scratch_bytes(x, needed))
    output = {ConvolutionDirection.FORWARD: y, ConvolutionDirection.BACKWARD_DATA: x}.get(problem.direction, w)
    descs = tuple(None if bound is None else bound.desc for bound in keyed)
    keep(handle, key, Plan("convolution", problem, (output.desc,), implementation, (descs, needed)))


def _planned(key: tuple[Any, ...], handle: Handle | None, names: tuple[str, ...], arrays: tuple[Any, ...]) -> Any:
    """The result of a call whose signature has a plan (None on the first call of a signature): its
    arrays bound to the plan's descriptors (a bias seen per channel), the output new, of the first
    array's kind; the arrays are (x, w, bias, z), (dy, w) or (x, dy) by the plan's direction."""
    handle, plan = lookup(handle, key)
    if plan is None:
        return None
    device = key[1][-1]
    bounds: list[Bound | None] = []
    for name, desc, array in zip(names, plan.extra[0], arrays):
        if array is None:
            bounds.append(None)
        elif name == "bias":
            bounds.append(Bound(name, desc, strided_view(as_native(array), desc), device))
        else:
            bounds.append(keyed_bound(name, desc, array, device))
    first, second = bounds[0], bounds[1]
    assert first is not None and second is not None  # (x or dy, and w or dy: never absent)
    out = allocate(first, plan.outputs[0])
    direction = plan.problem.direction
    if direction is ConvolutionDirection.FORWARD:
        execute(handle, plan, first, second, out, bounds[2], bounds[3], scratch_bytes(first, plan.extra[1]))
    elif direction is ConvolutionDirection.BACKWARD_DATA:
        execute(handle, plan, out, second, first, None, None, scratch_bytes(first, plan.extra[1]))
    else:
        execute(handle, plan, first, out, second, None, None, scratch_bytes(first, plan.extra[1]))
    return to_caller_kind(out.view, arrays[0])


# what a call's descriptors and arguments determine (its output's descriptor, its problem): run on
# the first call of a signature (later ones take its Plan, core/plans.py); the backward data's stays
# memoized for conv_transpose, which takes no plan


def _forward_plan(
    x: TensorDescriptor,
    w: TensorDescriptor,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    mode: ConvolutionMode,
    algo: enum.Enum | None,
    math_type: MathType,
    bias: TensorDescriptor | None,
    z: TensorDescriptor | None = None,
    activation: PointwiseMode | None = None,
    coef: float | None = None,
    alpha2: float = 0.0,
    propagate_nan: bool = False,
) -> tuple[TensorDescriptor, ConvolutionProblem]:
    conv_desc = _descriptor(x, w, stride, padding, dilation, groups, mode)
    y = packed_like(x, x.dtype, get_convolution_forward_output_dim(conv_desc, x, w))
    return y, convolution_problem(
        ConvolutionDirection.FORWARD,
        conv_desc,
        x,
        w,
        y,
        algo=algo,
        allow_tf32=math_allows_tf32(math_type, conv_desc),
        bias_desc=bias,
        z_desc=z,
        alpha2=alpha2,
        activation=activation,
        activation_coef=coef,
        propagate_nan=propagate_nan,
        names=("x", "w", "y"),
    )


@memoized  # conv_transpose keeps no plan: asked on every call
def _backward_data_plan(
    dy: TensorDescriptor,
    w: TensorDescriptor,
    dims: tuple[int, ...],
    stride: IntOrTuple,
    padding: IntOrTuple,
    dilation: IntOrTuple,
    groups: int,
    algo: enum.Enum | None,
    math_type: MathType,
    post: tuple[int, ...] | None = None,
) -> tuple[TensorDescriptor, ConvolutionProblem]:
    spatial = dy.ndim - 2
    strides, pads = check_ints("stride", stride, spatial), check_ints("padding", padding, spatial)
    dilations = check_ints("dilation", dilation, spatial)
    dx = packed_like(dy, dy.dtype, dims)
    conv_desc = _backward_data_descriptor(pads, strides, dilations, _compute_type(dy), groups, post)
    return dx, convolution_problem(
        ConvolutionDirection.BACKWARD_DATA,
        conv_desc,
        dx,
        w,
        dy,
        algo=algo,
        allow_tf32=math_allows_tf32(math_type, conv_desc),
        names=("input_shape", "w", "dy"),
    )


def _backward_filter_plan(
    x: TensorDescriptor,
    dy: TensorDescriptor,
    weight_shape: tuple[int, ...],
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    algo: enum.Enum | None,
    math_type: MathType,
) -> tuple[TensorDescriptor, ConvolutionProblem]:
    dw = packed_like(x, x.dtype, weight_shape)
    conv_desc = _descriptor(x, dw, stride, padding, dilation, groups, ConvolutionMode.CROSS_CORRELATION)
    return dw, convolution_problem(
        ConvolutionDirection.BACKWARD_FILTER,
        conv_desc,
        x,
        dw,
        dy,
        algo=algo,
        allow_tf32=math_allows_tf32(math_type, conv_desc),
        names=("x", "weight_shape", "dy"),
    )


def _descriptor(
    x: TensorDescriptor,
    w: TensorDescriptor,
    stride: IntOrTuple,
    padding: IntOrTuple | str,
    dilation: IntOrTuple,
    groups: int,
    mode: ConvolutionMode,
) -> ConvolutionDescriptor:
    spatial = x.ndim - 2
    require(1 <= spatial <= 3, f"x.ndim={x.ndim} must be 3, 4 or 5 (N, C and 1 to 3 spatial dims)")
    require(w.ndim == x.ndim, f"w.ndim={w.ndim} must equal x.ndim={x.ndim}")
    strides, dilations = check_ints("stride", stride, spatial), check_ints("dilation", dilation, spatial)
    if isinstance(padding, str):
        require(padding in ("valid", "same"), f"padding={padding!r} must be 'valid', 'same' or ints")
        require(padding == "valid" or strides == (1,) * spatial, f"padding='same' needs stride 1, not {strides}")
        total = [0 if padding == "valid" else d * (f - 1) for d, f in zip(dilations, w.dims[2:])]
        pre = tuple(t // 2 for t in total)
        post = tuple(t - p for t, p in zip(total, pre))
    else:
        pre = post = check_ints("padding", padding, spatial)
    return ConvolutionDescriptor(
        pre, strides, dilations, mode, _compute_type(x), groups, pre_padding=pre, post_padding=post
    )


def _backward_data_descriptor(
    pads: tuple[int, ...],
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    compute_type: DataType,
    groups: int,
    post: tuple[int, ...] | None = None,
) -> ConvolutionDescriptor:
    """Symmetric ``pads``, or ``pads`` before and ``post`` after."""
    mode = ConvolutionMode.CROSS_CORRELATION
    if post is None or post == pads:
        return ConvolutionDescriptor(pads, strides, dilations, mode, compute_type, groups)
    return ConvolutionDescriptor(
        pads, strides, dilations, mode, compute_type, groups, pre_padding=pads, post_padding=post
    )


def _compute_type(desc: TensorDescriptor) -> DataType:
    return DataType.DOUBLE if desc.dtype is DataType.DOUBLE else DataType.FLOAT


def _channel_dims(k: int, ndim: int) -> tuple[int, ...]:
    return tuple(k if axis == 1 else 1 for axis in range(ndim))


def _per_channel(bias: Bound, ndim: int, channels: int) -> Bound:
    """A (K,) bias seen as (1, K, 1, ...) without a copy."""
    desc = _per_channel_desc(bias.desc, ndim, channels)
    return Bound("bias", desc, strided_view(as_native(bias.view), desc), bias.device)


@memoized  # conv_transpose keeps no plan: asked on every call
def _per_channel_desc(bias: TensorDescriptor, ndim: int, channels: int) -> TensorDescriptor:
    if bias.dims != (channels,):
        raise BadParam(
            f"bias.shape={bias.dims} must be ({channels},): one value per output channel",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    return TensorDescriptor(
        bias.dtype, _channel_dims(channels, ndim), tuple(bias.strides[0] if a == 1 else 0 for a in range(ndim))
    )
