"""The Pythonic matrix products: ``matmul`` (NumPy's/torch's, with a fused epilogue) and ``linear``
(torch's). See ``opendnn.functional``'s docstring for the conventions every function follows."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, allocate, as_native, empty_like, keyed_bound, wrap
from opendnn.core.caller_arrays import to_caller_kind
from opendnn.core.caller_names import CallerNames, caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import check_dtype
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, OpenDnnError, Status
from opendnn.core.handle import Handle, MathType
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.matmul.problem import BiasAxis, matmul_problem
from opendnn.families.pointwise.functional import activation_mode
from opendnn.families.pointwise.problem import PointwiseMode


@caller_dtypes
def matmul(
    a: Any,
    b: Any,
    bias: Any = None,
    activation: str | PointwiseMode | None = None,
    *,
    coef: float | None = None,
    residual: Any = None,
    bias_axis: str | BiasAxis = "column",
    alpha: float = 1.0,
    a_scale: float = 1.0,
    b_scale: float = 1.0,
    out_dtype: Any = None,
    allow_tf32: bool | None = None,
    handle: Handle | None = None,
) -> Any:
    """``act(a_scale * b_scale * (a @ b) + bias) + residual``, times alpha, as one fused kernel.

    Args:
        a, b: ``(..., M, K)`` and ``(..., K, N)``; batch dims broadcast like NumPy's; 1-D operands are
            a row (a) or a column (b) vector whose dim is dropped from the result, as NumPy's.
        bias: N values (bias_axis "column", torch's linear) or M values ("row").
        activation: a forward activation by name ("relu", "gelu", "gelu_approx_tanh", "silu",
            "identity", ...) or a ``PointwiseMode.*_FWD``; ``coef`` is its coefficient, None for
            torch's default (elu's alpha 1, silu's and softplus's beta 1; clipped relu's ceiling
            has none: it must be given).
        residual: an array of the result's shape, added after the activation.
        out_dtype: the result's dtype (default: the inputs', bfloat16 for fp8 inputs).
        allow_tf32: float32 products on TF32 tensor cores (default: the handle's math type, which
            also decides fast fp8 accumulation).

    Raises:
        BadParam: shapes that do not multiply or broadcast (both named), a bias or residual of
            another shape, a non-finite scalar, an unknown activation.
        NotSupported: a dtype the product lacks.
    """
    arguments = (activation, coef, bias_axis, alpha, a_scale, b_scale, out_dtype, allow_tf32)
    key = signature("matmul", (a, b, bias), arguments) if residual is None else None
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:  # matrices (no vector operand) whose checks passed for this signature
            device = key[1][-1]
            a_desc, b_desc, bias_desc = plan.extra
            a_bound, b_bound = keyed_bound("a", a_desc, a, device), keyed_bound("b", b_desc, b, device)
            bias_bound = None if bias is None else keyed_bound("bias", bias_desc, bias, device)
            output = allocate(a_bound, plan.outputs[0])
            execute(handle, plan, a_bound, b_bound, output, bias_bound, None)
            return to_caller_kind(output.view, a)
    a_bound, b_bound = wrap("a", a), wrap("b", b)
    a_vector, b_vector = a_bound.desc.ndim == 1, b_bound.desc.ndim == 1
    a_bound = _with_unit_dim(a_bound, 0) if a_vector else a_bound
    b_bound = _with_unit_dim(b_bound, 1) if b_vector else b_bound
    batch = _batch_shape(a_bound, b_bound)
    dims = (*batch, a_bound.desc.dims[-2], b_bound.desc.dims[-1])
    default = DataType.BFLOAT16 if a_bound.desc.dtype.is_fp8 else a_bound.desc.dtype
    output = empty_like(
        a_bound,
        check_dtype("out_dtype", out_dtype) if out_dtype is not None else default,
        dims,
        tuple(range(len(dims))),
    )
    bias_bound = None if bias is None else wrap("bias", bias)
    residual_bound = None if residual is None else _residual(wrap("residual", residual), dims, a_vector, b_vector)
    handle = handle_for(a_bound, handle)
    tf32 = handle.math_type is MathType.TENSOR_OP if allow_tf32 is None else allow_tf32
    try:
        problem = matmul_problem(
            a_bound.desc,
            b_bound.desc,
            output.desc,
            alpha=alpha,
            bias_desc=None if bias_bound is None else bias_bound.desc,
            bias_axis=bias_axis,
            activation=activation_mode(activation),
            coef=coef,
            residual_desc=None if residual_bound is None else residual_bound.desc,
            a_scale=a_scale,
            b_scale=b_scale,
            allow_tf32=tf32,
            fast_fp8_accumulation=handle.math_type is MathType.TENSOR_OP,
            fast_math=handle.fast_math,
        )
    except OpenDnnError as error:
        raise _NAMES.renamed(error) from None
    implementation = dispatch(handle, "matmul", problem, a_bound, b_bound, output, bias_bound, residual_bound)
    if not (a_vector or b_vector):
        descs = (a_bound.desc, b_bound.desc, None if bias_bound is None else bias_bound.desc)
        keep(handle, key, Plan("matmul", problem, (output.desc,), implementation, descs))
    result = output.view
    if b_vector:
        result = result[..., 0]
    if a_vector:
        result = result[..., 0, :] if not b_vector else result[..., 0]
    return to_caller_kind(result, a)


@caller_dtypes
def linear(x: Any, weight: Any, bias: Any = None, *, handle: Handle | None = None) -> Any:
    """``x @ weight.T + bias`` as torch.nn.functional.linear: weight is ``(out, in)``, read
    transposed in place (no copy); bias has ``out`` values.

    Raises:
        BadParam: weight not 2-D, x's last dim not weight's in_features, a bias not of
            out_features elements.
    """
    native, inputs = as_native(weight, "weight"), as_native(x, "x")
    # (the messages are formatted only on failure: this runs for every call)
    if native.ndim != 2:
        raise BadParam(f"weight.shape={tuple(native.shape)} must be 2-D (out_features, in_features)")
    if inputs.ndim == 0 or inputs.shape[-1] != native.shape[1]:
        raise BadParam(
            f"x.shape={tuple(inputs.shape)} must end with weight.shape[1]={native.shape[1]} (in_features)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    if bias is not None and tuple(as_native(bias, "bias").shape) != (native.shape[0],):
        raise BadParam(
            f"bias.shape={tuple(as_native(bias).shape)} must be ({native.shape[0]},) (out_features)",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    transposed = native.T if isinstance(native, np.ndarray) else native.t()
    return matmul(x, transposed, bias, handle=handle)


# what matmul calls the parameters of the matrix product's rules
_NAMES = CallerNames(
    {"a_desc": "a", "b_desc": "b", "bias_desc": "bias", "residual_desc": "residual", "c_desc.dtype": "out_dtype"}
)


def _with_unit_dim(bound: Bound, position: int) -> Bound:
    """A 1-D operand as a (1, K) row (position 0) or a (K, 1) column (position 1)."""
    view = bound.view[None, :] if position == 0 else bound.view[:, None]
    return wrap(bound.name, view)


def _residual(residual: Bound, dims: tuple[int, ...], a_vector: bool, b_vector: bool) -> Bound:
    """The residual seen with C's dims: one of the result's own shape (C's less the dims that a
    vector operand drops) gets those back as unit dims.

    Raises:
        BadParam: a residual of another shape.
    """
    if residual.desc.dims == dims:
        return residual
    result = dims[:-2] + (() if a_vector else dims[-2:-1]) + (() if b_vector else dims[-1:])
    if residual.desc.dims != (result or (1,)):
        raise BadParam(
            f"residual.shape={list(residual.desc.dims)} must equal the result's shape {list(result)}",
            Status.BAD_PARAM_SHAPE_MISMATCH,
        )
    return wrap("residual", residual.view.reshape(dims))


def _batch_shape(a: Bound, b: Bound) -> tuple[int, ...]:
    if a.desc.dims[:-2] == b.desc.dims[:-2]:  # (the common case, without NumPy's rules: this runs per call)
        return a.desc.dims[:-2]
    try:
        return tuple(np.broadcast_shapes(a.desc.dims[:-2], b.desc.dims[:-2]))
    except ValueError:
        raise BadParam(
            f"batch dims of a.shape={list(a.desc.dims)} and b.shape={list(b.desc.dims)} do not broadcast"
        ) from None
