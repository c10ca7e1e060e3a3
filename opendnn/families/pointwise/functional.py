"""The Pythonic elementwise functions: pointwise arithmetic, math, comparisons and logic, tensor
transforms, and the planned pointwise call they and the activations (``activation_functional``) make.

See ``opendnn.functional``'s docstring for the conventions every function follows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opendnn.core.arrays import (
    Bound,
    allocate,
    as_native,
    broadcast_to,
    empty_like,
    index_along,
    keyed_bound,
    packed_like,
    wrap,
)
from opendnn.core.caller_arrays import shaped, to_caller_kind
from opendnn.core.caller_names import caller_dtypes
from opendnn.core.default_handle import handle_for
from opendnn.core.descriptors import (
    TensorDescriptor,
    TensorFormat,
    check_dtype,
    check_finite,
    check_int,
    check_ints,
    check_member,
)
from opendnn.core.dispatch import dispatch, execute
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, require
from opendnn.core.handle import Handle
from opendnn.core.plans import Plan, keep, lookup, signature
from opendnn.families.pointwise.problem import (
    ACTIVATION_NAMES,
    PointwiseMode,
    PointwiseProblem,
    pointwise_problem,
)

_FLOAT_RANK = {DataType.HALF: 1, DataType.BFLOAT16: 1, DataType.FLOAT: 2, DataType.DOUBLE: 3}
_RELATIONAL = {
    PointwiseMode.CMP_EQ,
    PointwiseMode.CMP_NEQ,
    PointwiseMode.CMP_GT,
    PointwiseMode.CMP_GE,
    PointwiseMode.CMP_LT,
    PointwiseMode.CMP_LE,
    PointwiseMode.LOGICAL_AND,
    PointwiseMode.LOGICAL_OR,
    PointwiseMode.LOGICAL_NOT,
}


def _result_dtype(mode: PointwiseMode, descs: Sequence[TensorDescriptor]) -> DataType:
    """The result's dtype: booleans for relational and logical modes, else the inputs' common dtype,
    the widest float among them (half with bfloat16 gives float); where's condition takes no part,
    as in NumPy and torch."""
    if mode in _RELATIONAL:
        return DataType.BOOLEAN
    dtypes = {d.dtype for d in (descs[:2] if mode is PointwiseMode.BINARY_SELECT else descs)}
    if len(dtypes) == 1:
        return dtypes.pop()
    floats = [d for d in dtypes if d.is_floating]
    if not floats:
        return DataType.INT64 if DataType.INT64 in dtypes else DataType.INT32
    widest = max(floats, key=lambda d: _FLOAT_RANK[d])
    return DataType.FLOAT if {DataType.HALF, DataType.BFLOAT16} <= dtypes and widest.itemsize == 2 else widest


def _pointwise(
    mode: PointwiseMode,
    *arrays: Any,
    handle: Handle | None = None,
    dtype: DataType | None = None,
    names: tuple[str, ...] | None = None,
    **parameters: Any,
) -> Any:
    """``mode`` of ``arrays``, which the caller calls ``names`` (default: the mode's ARGUMENT_NAMES)."""
    names = names or ARGUMENT_NAMES[mode]
    key = signature("pointwise", arrays, (mode, dtype, names, tuple(parameters), *parameters.values()))
    if key is not None:
        handle, plan = lookup(handle, key)
        if plan is not None:  # inputs of one shape whose checks passed for this signature
            descs, like, shape = plan.extra
            device = key[1][-1]
            inputs = [keyed_bound(name, desc, a, device) for name, desc, a in zip(names, descs, arrays)]
            output = allocate(inputs[like], plan.outputs[0])
            execute(handle, plan, inputs, output)
            return to_caller_kind(shaped(output.view, shape), arrays[0])
    inputs = [wrap(name, a) for name, a in zip(names, arrays)]
    handle = handle_for(inputs[0], handle)
    parameters["fast_math"] = handle.fast_math
    # a tensor (not 0-d) is its wrap's view, of the wrap's dims: its shape needs no asking
    shapes = [b.desc.dims if b.view is a else tuple(as_native(a).shape) for b, a in zip(inputs, arrays)]
    if shapes.count(shapes[0]) == len(shapes):  # no broadcasting: the output's layout is the inputs' alone
        shape = shapes[0]
        descs = tuple(b.desc for b in inputs)
        like, problem = _same_shape_problem(mode, descs, names, shape, dtype, **parameters)
        output = allocate(inputs[like], problem.output)
        implementation = dispatch(handle, "pointwise", problem, inputs, output)
        keep(handle, key, Plan("pointwise", problem, (problem.output,), implementation, (descs, like, shape)))
    else:
        shape, inputs, output = _broadcast(mode, inputs, arrays, shapes, dtype)
        problem = pointwise_problem(mode, inputs, output, **parameters)
        dispatch(handle, "pointwise", problem, inputs, output)
    return to_caller_kind(shaped(output.view, shape), arrays[0])


# what the Pythonic functions call the inputs of each mode
ARGUMENT_NAMES = {
    mode: ("a", "b", "condition")
    if mode is PointwiseMode.BINARY_SELECT
    else ("dy", "x")
    if mode.value.endswith("_bwd")
    else ("a", "b")
    if mode.arity == 2
    else ("x",)
    for mode in PointwiseMode
}


def _same_shape_problem(
    mode: PointwiseMode,
    descs: tuple[TensorDescriptor, ...],
    names: tuple[str, ...],
    shape: tuple[int, ...],
    dtype: DataType | None,
    **parameters: Any,
) -> tuple[int, PointwiseProblem]:
    """(the input whose memory order and device the output takes, the problem) for inputs of one
    shape: the output is packed in that input's memory order."""
    like = next((k for k, d in enumerate(descs) if 0 not in d.strides), 0)
    dtype = dtype or _result_dtype(mode, descs)
    # the rules read the names and descriptors alone: these Bounds have no memory
    inputs = [Bound(name, desc, None, "") for name, desc in zip(names, descs)]
    output = Bound(names[like], packed_like(descs[like], dtype, shape or (1,)), None, "")
    return like, pointwise_problem(mode, inputs, output, **parameters)


def _broadcast(
    mode: PointwiseMode,
    inputs: list[Bound],
    arrays: tuple[Any, ...],
    shapes: list[tuple[int, ...]],
    dtype: DataType | None,
) -> tuple[tuple[int, ...], list[Bound], Bound]:
    """(the broadcast shape, the inputs broadcast to it, the output) for inputs of different shapes."""
    try:
        shape = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        shapes_text = ", ".join(f"{b.name}.shape={tuple(np.shape(as_native(a)))}" for b, a in zip(inputs, arrays))
        raise BadParam(f"{shapes_text} do not broadcast together") from None
    dims = shape or (1,)
    inputs = [broadcast_to(b, dims) for b in inputs]
    like = next((b for b in inputs if 0 not in b.desc.strides), inputs[0])
    return shape, inputs, empty_like(like, dtype or _result_dtype(mode, [b.desc for b in inputs]), dims)


# arithmetic, mathematical, relational and logical ----------------------------------------------


@caller_dtypes
def pointwise(mode: PointwiseMode, *inputs: Any, coef: float | None = None, handle: Handle | None = None) -> Any:
    """Any PointwiseMode applied to broadcast inputs (as many as the mode's arity); ``coef`` None
    is the mode's default coefficient (ACTIVATION_TABLE's)."""
    names = tuple(f"inputs[{k}]" for k in range(len(inputs)))
    return _pointwise(check_member("mode", PointwiseMode, mode), *inputs, coef=coef, names=names, handle=handle)


@caller_dtypes
def add(a: Any, b: Any, *, alpha: float = 1.0, handle: Handle | None = None) -> Any:
    """a + alpha * b, broadcast together (torch.add's ``alpha``).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        alpha: the factor of ``b``, finite.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``a``'s kind and device, of the broadcast shape and the common dtype
            (the widest float among them; float16 with bfloat16 gives float32).

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together, or ``alpha`` is not finite.
    """
    return _pointwise(PointwiseMode.ADD, a, b, input_scales=_scales(alpha), handle=handle)


def _scales(alpha: float) -> tuple[float, float, float]:
    """The input scales of ``a op alpha * b``."""
    return (1.0, check_finite("alpha", alpha), 1.0)


@caller_dtypes
def sub(a: Any, b: Any, *, alpha: float = 1.0, handle: Handle | None = None) -> Any:
    """a - alpha * b, broadcast together (torch.sub's ``alpha``).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        alpha: the factor of ``b``, finite.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``a``'s kind and device, of the broadcast shape and the common dtype
            (the widest float among them; float16 with bfloat16 gives float32).

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together, or ``alpha`` is not finite.
    """
    return _pointwise(PointwiseMode.SUB, a, b, input_scales=_scales(alpha), handle=handle)


@caller_dtypes
def mul(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a * b, broadcast together.

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``a``'s kind and device, of the broadcast shape and the common dtype
            (the widest float among them; float16 with bfloat16 gives float32).

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.MUL, a, b, handle=handle)


@caller_dtypes
def div(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a / b, broadcast together (IEEE: x / 0 is inf or NaN).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``a``'s kind and device, of the broadcast shape and the common dtype
            (the widest float among them; float16 with bfloat16 gives float32).

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.DIV, a, b, handle=handle)


@caller_dtypes
def maximum(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """Elementwise max; NaN in either gives NaN."""
    return _pointwise(PointwiseMode.MAX, a, b, handle=handle)


@caller_dtypes
def minimum(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """Elementwise min; NaN in either gives NaN."""
    return _pointwise(PointwiseMode.MIN, a, b, handle=handle)


@caller_dtypes
def fmod(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """Remainder of a / b with a's sign (C's fmod; cuDNN's MOD)."""
    return _pointwise(PointwiseMode.MOD, a, b, handle=handle)


@caller_dtypes
def pow(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a ** b, broadcast together (NaN for a negative base with a fractional exponent).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``a``'s kind and device, of the broadcast shape and the common dtype
            (the widest float among them; float16 with bfloat16 gives float32).

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.POW, a, b, handle=handle)


@caller_dtypes
def add_square(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a + b * b."""
    return _pointwise(PointwiseMode.ADD_SQUARE, a, b, handle=handle)


@caller_dtypes
def abs(x: Any, *, handle: Handle | None = None) -> Any:
    """|x|.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.ABS, x, handle=handle)


@caller_dtypes
def ceil(x: Any, *, handle: Handle | None = None) -> Any:
    """The smallest integer value not below x, in x's dtype.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.CEIL, x, handle=handle)


@caller_dtypes
def floor(x: Any, *, handle: Handle | None = None) -> Any:
    """The largest integer value not above x, in x's dtype.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.FLOOR, x, handle=handle)


@caller_dtypes
def cos(x: Any, *, handle: Handle | None = None) -> Any:
    """Cosine of x (radians).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.COS, x, handle=handle)


@caller_dtypes
def sin(x: Any, *, handle: Handle | None = None) -> Any:
    """Sine of x (radians).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.SIN, x, handle=handle)


@caller_dtypes
def tan(x: Any, *, handle: Handle | None = None) -> Any:
    """Tangent of x (radians).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.TAN, x, handle=handle)


@caller_dtypes
def exp(x: Any, *, handle: Handle | None = None) -> Any:
    """e ** x.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.EXP, x, handle=handle)


@caller_dtypes
def log(x: Any, *, handle: Handle | None = None) -> Any:
    """Natural logarithm of x (-inf at 0, NaN below 0).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.LOG, x, handle=handle)


@caller_dtypes
def neg(x: Any, *, handle: Handle | None = None) -> Any:
    """-x.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.NEG, x, handle=handle)


@caller_dtypes
def sqrt(x: Any, *, handle: Handle | None = None) -> Any:
    """Square root of x (NaN below 0).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.SQRT, x, handle=handle)


@caller_dtypes
def rsqrt(x: Any, *, handle: Handle | None = None) -> Any:
    """1 / sqrt(x) (inf at 0, NaN below 0).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.RSQRT, x, handle=handle)


@caller_dtypes
def reciprocal(x: Any, *, handle: Handle | None = None) -> Any:
    """1 / x (inf at 0).

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.RECIPROCAL, x, handle=handle)


@caller_dtypes
def erf(x: Any, *, handle: Handle | None = None) -> Any:
    """The error function, 2 / sqrt(pi) * integral from 0 to x of exp(-t ** 2) dt.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new array of ``x``'s kind, device, shape, dimension order and dtype.
    """
    return _pointwise(PointwiseMode.ERF, x, handle=handle)


@caller_dtypes
def eq(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a == b as booleans."""
    return _pointwise(PointwiseMode.CMP_EQ, a, b, handle=handle)


@caller_dtypes
def ne(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a != b as booleans (NaN differs from everything).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.CMP_NEQ, a, b, handle=handle)


@caller_dtypes
def gt(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a > b as booleans (false where either is NaN).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.CMP_GT, a, b, handle=handle)


@caller_dtypes
def ge(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a >= b as booleans (false where either is NaN).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.CMP_GE, a, b, handle=handle)


@caller_dtypes
def lt(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a < b as booleans (false where either is NaN).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.CMP_LT, a, b, handle=handle)


@caller_dtypes
def le(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a <= b as booleans (false where either is NaN).

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.CMP_LE, a, b, handle=handle)


@caller_dtypes
def logical_and(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """Nonzero is true; booleans out."""
    return _pointwise(PointwiseMode.LOGICAL_AND, a, b, handle=handle)


@caller_dtypes
def logical_or(a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a or b as booleans; nonzero (NaN included) is true.

    Args:
        a: the first operand: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array.
        b: the second operand, broadcastable with ``a`` (NumPy's rules).
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``a``'s kind and device, of the broadcast shape.

    Raises:
        BadParam: ``a`` and ``b`` do not broadcast together.
    """
    return _pointwise(PointwiseMode.LOGICAL_OR, a, b, handle=handle)


@caller_dtypes
def logical_not(x: Any, *, handle: Handle | None = None) -> Any:
    """not x as booleans; nonzero (NaN included) is true.

    Args:
        x: the input: a torch tensor (CPU or CUDA), a NumPy array or any DLPack array, any strides.
        handle: the handle to run on (default: one for the input's device, on the framework's current stream).

    Returns:
        A new boolean array of ``x``'s kind, device and shape.
    """
    return _pointwise(PointwiseMode.LOGICAL_NOT, x, handle=handle)


@caller_dtypes
def where(condition: Any, a: Any, b: Any, *, handle: Handle | None = None) -> Any:
    """a where condition is nonzero, else b (cuDNN's BINARY_SELECT), broadcast together."""
    return _pointwise(PointwiseMode.BINARY_SELECT, a, b, condition, handle=handle)


@caller_dtypes
def gen_index(x: Any, axis: int, *, dtype: Any = "int64", handle: Handle | None = None) -> Any:
    """An array shaped like x holding each element's index along ``axis`` (cuDNN's GEN_INDEX)."""
    like, axis = wrap("x", x), check_int("axis", axis)
    require(-like.desc.ndim <= axis < like.desc.ndim, f"axis={axis} must be in [-{like.desc.ndim}, {like.desc.ndim})")
    output = empty_like(like, check_dtype("dtype", dtype))
    index = index_along(output, axis % like.desc.ndim)
    problem = pointwise_problem(PointwiseMode.IDENTITY, [index], output)
    dispatch(handle_for(like, handle), "pointwise", problem, [index], output)
    return to_caller_kind(output.view, x)


# tensor transforms -----------------------------------------------------------------------------


@caller_dtypes
def transform(
    x: Any, layout: Any = None, *, dtype: Any = None, alpha: float = 1.0, handle: Handle | None = None
) -> Any:
    """alpha * x in a new layout and/or dtype.

    Args:
        layout: None (keep x's dimension order), TensorFormat.NCHW / "NCHW" (packed, channels
            first; any rank), TensorFormat.NHWC / "NHWC" (channels last), or a memory order as a
            tuple of dims, outermost first (``(0, 2, 3, 1)`` is NHWC for 4-D).
        dtype: the output's dtype (default: x's).
    """
    source = wrap("x", x)
    ndim = source.desc.ndim
    order = None
    if isinstance(layout, (str, TensorFormat)):
        channels_last = check_member("layout", TensorFormat, layout) is TensorFormat.NHWC
        order = (0, *range(2, ndim), 1) if channels_last and ndim > 2 else tuple(range(ndim))
    elif layout is not None:
        order = check_ints("layout", layout)
        require(sorted(order) == list(range(ndim)), f"layout={layout} must order the dims 0..{ndim - 1}")
    output = empty_like(source, check_dtype("dtype", dtype) if dtype is not None else None, order=order)
    problem = pointwise_problem(PointwiseMode.IDENTITY, [source], output, alpha=alpha)
    dispatch(handle_for(source, handle), "pointwise", problem, [source], output)
    return to_caller_kind(output.view, x)


# the activation of a fused epilogue ------------------------------------------------------------


def activation_mode(activation: str | PointwiseMode | None) -> PointwiseMode | None:
    """The mode of a fused epilogue's activation, named as torch does ("relu", "silu", "gelu_tanh",
    "identity", ...: ``ACTIVATION_TABLE``'s names and aliases) or given as a PointwiseMode; None
    for none.

    Raises:
        BadParam: a name that is not an activation's.
    """
    if activation is None or isinstance(activation, PointwiseMode):
        return activation
    name = ACTIVATION_NAMES.get(str(activation).lower().removesuffix("_fwd"))
    if name is None:
        raise BadParam(
            f"activation={activation!r} is not a forward activation: None or one of "
            f"{', '.join(map(repr, ACTIVATION_NAMES))}"
        )
    return PointwiseMode.IDENTITY if name == "identity" else PointwiseMode(f"{name}_fwd")
