"""Convolution as cuDNN's: forward, backward data, backward filter, backward bias, the fused
convolution + bias + activation forward, and the workspace size queries.

Every call is ``out = alpha * result + beta * out`` (out never read when beta == 0) over tensors of
any strides; filters are FilterDescriptors (KCRS or KRSC) or TensorDescriptors in K, C/G, R, S dim
order. See ``problem.py`` for the definition of each direction and of the algorithms.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

from opendnn.core.arrays import Bound, allocate_bytes, bind, bind_bytes
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, check_finite
from opendnn.core.dispatch import dispatch, load_backend, refusal, require_handle
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status, require
from opendnn.core.handle import Handle, MathType
from opendnn.families.convolution.problem import (
    ConvolutionDescriptor,
    ConvolutionDirection,
    ConvolutionProblem,
    FilterDescriptor,
    convolution_problem,
)
from opendnn.families.pointwise.activation_api import ActivationDescriptor
from opendnn.families.reduce.problem import ReduceTensorDescriptor, ReduceTensorOp, reduce_problem

Filter = FilterDescriptor | TensorDescriptor
_SIZE_QUERY = {
    ConvolutionDirection.FORWARD: "get_convolution_forward_workspace_size",
    ConvolutionDirection.BACKWARD_DATA: "get_convolution_backward_data_workspace_size",
    ConvolutionDirection.BACKWARD_FILTER: "get_convolution_backward_filter_workspace_size",
}


def allows_tf32(handle: Handle, conv_desc: ConvolutionDescriptor) -> bool:
    """TF32 for float32 products: the descriptor's TENSOR_OP allows it, FMA forbids it, DEFAULT
    follows the handle's math type."""
    return math_allows_tf32(require_handle(handle).math_type, conv_desc)


def math_allows_tf32(handle_math_type: MathType, conv_desc: ConvolutionDescriptor) -> bool:
    """``allows_tf32`` for a handle of ``handle_math_type``.

    Raises:
        BadParam: conv_desc not a ConvolutionDescriptor.
    """
    if not isinstance(conv_desc, ConvolutionDescriptor):  # (the message is formatted only on failure)
        raise BadParam(f"conv_desc={conv_desc!r} must be a ConvolutionDescriptor")
    if conv_desc.math_type is MathType.DEFAULT:
        return handle_math_type is MathType.TENSOR_OP
    return conv_desc.math_type is MathType.TENSOR_OP


# ---- workspace sizes -----------------------------------------------------------------------------


def get_convolution_forward_workspace_size(
    handle: Handle,
    x_desc: TensorDescriptor,
    w_desc: Filter,
    conv_desc: ConvolutionDescriptor,
    y_desc: TensorDescriptor,
    algo: enum.Enum,
) -> int:
    """Bytes of workspace ``convolution_forward`` needs with ``algo`` on this handle's backend.

    Raises:
        BadParam: the descriptors break a rule of ``convolution_problem``.
        NotSupported: the algorithm does not apply to this problem (with the reason).
    """
    problem = convolution_problem(
        ConvolutionDirection.FORWARD,
        conv_desc,
        x_desc,
        w_desc,
        y_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
    )
    return workspace_size(handle, problem)


def get_convolution_backward_data_workspace_size(
    handle: Handle,
    w_desc: Filter,
    dy_desc: TensorDescriptor,
    conv_desc: ConvolutionDescriptor,
    dx_desc: TensorDescriptor,
    algo: enum.Enum,
) -> int:
    """Bytes of workspace ``convolution_backward_data`` needs with ``algo`` (see the forward query)."""
    problem = convolution_problem(
        ConvolutionDirection.BACKWARD_DATA,
        conv_desc,
        dx_desc,
        w_desc,
        dy_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        names=("dx_desc", "w_desc", "dy_desc"),
    )
    return workspace_size(handle, problem)


def get_convolution_backward_filter_workspace_size(
    handle: Handle,
    x_desc: TensorDescriptor,
    dy_desc: TensorDescriptor,
    conv_desc: ConvolutionDescriptor,
    dw_desc: Filter,
    algo: enum.Enum,
) -> int:
    """Bytes of workspace ``convolution_backward_filter`` needs with ``algo`` (see the forward query)."""
    problem = convolution_problem(
        ConvolutionDirection.BACKWARD_FILTER,
        conv_desc,
        x_desc,
        dw_desc,
        dy_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        names=("x_desc", "dw_desc", "dy_desc"),
    )
    return workspace_size(handle, problem)


def workspace_size(handle: Handle, problem: ConvolutionProblem) -> int:
    """The handle's backend's workspace bytes for ``problem``, once it says it supports it."""
    backend = load_backend("convolution", require_handle(handle).backend, handle.device)
    reason = refusal(backend, problem)
    if reason is not None:
        raise NotSupported(f"convolution on backend {handle.backend!r}: {reason}", Status.NOT_SUPPORTED)
    try:
        return _workspace_bytes(backend, problem)
    except TypeError:  # a problem holding something unhashable
        size: int = backend.workspace_size(problem)
        return size


@functools.lru_cache(maxsize=1024)  # the cuDNN-shaped calls and queries keep no plan: asked on every call
def _workspace_bytes(backend: Any, problem: ConvolutionProblem) -> int:
    size: int = backend.workspace_size(problem)
    return size


# ---- the calls -----------------------------------------------------------------------------------


def convolution_forward(
    handle: Handle,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    w_desc: Filter,
    w: Any,
    conv_desc: ConvolutionDescriptor,
    algo: enum.Enum,
    workspace: Any,
    beta: float,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = alpha * conv(x, w) + beta * y``.

    Args:
        algo: a ConvolutionFwdAlgo (IMPLICIT_GEMM, the default choice, needs no workspace;
            ``get_convolution_forward_algorithm`` ranks first the one to take).
        workspace: a contiguous, 16-byte aligned array of at least
            ``get_convolution_forward_workspace_size`` bytes; None when that is 0.

    Raises:
        BadParam: a rule of ``convolution_problem`` broken, a tensor past its buffer or on another
            device, a workspace missing or too small (naming both sizes).
        NotSupported: the algorithm does not apply to this problem.
    """
    problem = convolution_problem(
        ConvolutionDirection.FORWARD,
        conv_desc,
        x_desc,
        w_desc,
        y_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        alpha=alpha,
        beta=beta,
    )
    xb, wb, yb = bind("x", x_desc, x), bind("w", problem.w, w), bind("y", y_desc, y, output=True)
    _run(handle, problem, xb, wb, yb, None, None, workspace)


def convolution_backward_data(
    handle: Handle,
    alpha: float,
    w_desc: Filter,
    w: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    conv_desc: ConvolutionDescriptor,
    algo: enum.Enum,
    workspace: Any,
    beta: float,
    dx_desc: TensorDescriptor,
    dx: Any,
) -> None:
    """``dx = alpha * conv_backward_data(dy, w) + beta * dx`` (the transposed convolution).

    Args:
        algo: a ConvolutionBwdDataAlgo (ALGO_0, implicit GEMM, the default, needs no workspace).

    Raises:
        BadParam, NotSupported: as ``convolution_forward``.
    """
    problem = convolution_problem(
        ConvolutionDirection.BACKWARD_DATA,
        conv_desc,
        dx_desc,
        w_desc,
        dy_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        alpha=alpha,
        beta=beta,
        names=("dx_desc", "w_desc", "dy_desc"),
    )
    wb, dyb = bind("w", problem.w, w), bind("dy", dy_desc, dy)
    dxb = bind("dx", dx_desc, dx, output=True)
    _run(handle, problem, dxb, wb, dyb, None, None, workspace)


def convolution_backward_filter(
    handle: Handle,
    alpha: float,
    x_desc: TensorDescriptor,
    x: Any,
    dy_desc: TensorDescriptor,
    dy: Any,
    conv_desc: ConvolutionDescriptor,
    algo: enum.Enum,
    workspace: Any,
    beta: float,
    dw_desc: Filter,
    dw: Any,
) -> None:
    """``dw = alpha * conv_backward_filter(x, dy) + beta * dw``.

    Args:
        algo: a ConvolutionBwdFilterAlgo (ALGO_0, implicit GEMM, the default). Its workspace holds
            the float32 partial filters of a reduction split over pixels (summed in a fixed order):
            ``get_convolution_backward_filter_workspace_size`` says how much.

    Raises:
        BadParam, NotSupported: as ``convolution_forward``.
    """
    problem = convolution_problem(
        ConvolutionDirection.BACKWARD_FILTER,
        conv_desc,
        x_desc,
        dw_desc,
        dy_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        alpha=alpha,
        beta=beta,
        names=("x_desc", "dw_desc", "dy_desc"),
    )
    xb, dyb = bind("x", x_desc, x), bind("dy", dy_desc, dy)
    dwb = bind("dw", problem.w, dw, output=True)
    _run(handle, problem, xb, dwb, dyb, None, None, workspace)


def convolution_bias_activation_forward(
    handle: Handle,
    alpha1: float,
    x_desc: TensorDescriptor,
    x: Any,
    w_desc: Filter,
    w: Any,
    conv_desc: ConvolutionDescriptor,
    algo: enum.Enum,
    workspace: Any,
    alpha2: float,
    z_desc: TensorDescriptor | None,
    z: Any,
    bias_desc: TensorDescriptor | None,
    bias: Any,
    act_desc: ActivationDescriptor | None,
    y_desc: TensorDescriptor,
    y: Any,
) -> None:
    """``y = act(alpha1 * conv(x, w) + alpha2 * z + bias)`` in one pass.

    Args:
        z: a tensor of y's dims, or y itself (a residual added in place); None (or z_desc None) for none.
        bias: (1, K, 1, ...), or None for none.
        act_desc: an ActivationDescriptor, or None for identity.

    Raises:
        BadParam: as ``convolution_forward``, a bias not (1, K, 1, ...), z not of y's dims.
        NotSupported: the algorithm does not apply to this problem.
    """
    require(
        act_desc is None or isinstance(act_desc, ActivationDescriptor),
        f"act_desc={act_desc!r} must be an ActivationDescriptor or None",
    )
    alpha1 = check_finite("alpha1", alpha1)  # (convolution_problem calls it alpha)
    with_z = z_desc is not None and z is not None
    problem = convolution_problem(
        ConvolutionDirection.FORWARD,
        conv_desc,
        x_desc,
        w_desc,
        y_desc,
        algo=algo,
        allow_tf32=allows_tf32(handle, conv_desc),
        alpha=alpha1,
        bias_desc=bias_desc if bias is not None else None,
        z_desc=z_desc if with_z else None,
        alpha2=alpha2 if with_z else 0.0,
        activation=act_desc.forward_mode if act_desc is not None else None,
        activation_coef=(act_desc.coef or 0.0) if act_desc is not None else 0.0,
        propagate_nan=act_desc is not None and act_desc.nan_opt is NanPropagation.PROPAGATE_NAN,
    )
    xb, wb = bind("x", x_desc, x), bind("w", problem.w, w)
    zb = bind("z", z_desc, z) if problem.z is not None else None
    biasb = bind("bias", bias_desc, bias) if problem.bias is not None else None
    yb = bind("y", y_desc, y, output=True)
    _run(handle, problem, xb, wb, yb, biasb, zb, workspace)


def convolution_backward_bias(
    handle: Handle, alpha: float, dy_desc: TensorDescriptor, dy: Any, beta: float, db_desc: TensorDescriptor, db: Any
) -> None:
    """``db = alpha * sum over N and the spatial dims of dy + beta * db``; db is (1, K, 1, ...).
    A reduction: it runs on the reduce kernels, with any workspace they need allocated here.

    Raises:
        BadParam: db_desc not (1, K, 1, ...), dtypes not float, a tensor past its buffer.
    """
    require(isinstance(dy_desc, TensorDescriptor), f"dy_desc={dy_desc!r} must be a TensorDescriptor")
    require(isinstance(db_desc, TensorDescriptor), f"db_desc={db_desc!r} must be a TensorDescriptor")
    require(3 <= dy_desc.ndim <= 5, f"dy_desc.ndim={dy_desc.ndim} must be 3, 4 or 5 (N, K, 1-3 spatial dims)")
    want = tuple(dy_desc.dims[1] if k == 1 else 1 for k in range(dy_desc.ndim))
    require(
        db_desc.dims == want,
        f"db_desc.dims={list(db_desc.dims)} must be {list(want)} (one value per channel K={dy_desc.dims[1]})",
        Status.BAD_PARAM_SHAPE_MISMATCH,
    )
    dyb, dbb = bind("dy", dy_desc, dy), bind("db", db_desc, db, output=True)
    compute = DataType.DOUBLE if DataType.DOUBLE in (dy_desc.dtype, db_desc.dtype) else DataType.FLOAT
    problem = reduce_problem(
        ReduceTensorDescriptor(ReduceTensorOp.ADD, compute), dy_desc, db_desc, alpha=alpha, beta=beta
    )
    needed = load_backend("reduce", require_handle(handle).backend, handle.device).workspace_size(problem)
    workspace = allocate_bytes(dyb, needed) if needed else None
    dispatch(handle, "reduce", problem, dyb, dbb, None, bind_bytes("workspace", workspace, needed, "the reduction"))


def _run(
    handle: Handle,
    problem: ConvolutionProblem,
    x: Bound,
    w: Bound,
    y: Bound,
    bias: Bound | None,
    z: Bound | None,
    workspace: Any,
) -> None:
    needed = workspace_size(handle, problem)
    dispatch(
        handle,
        "convolution",
        problem,
        x,
        w,
        y,
        bias,
        z,
        bind_bytes("workspace", workspace, needed, _SIZE_QUERY[problem.direction]),
    )
