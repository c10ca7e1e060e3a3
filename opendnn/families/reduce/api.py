"""Tensor reduction as cuDNN's: cudnnReduceTensor and its workspace and indices size queries.

``c = alpha * reduce(a) + beta * c`` over the dims where c is 1 and a is not (see
``problem.py`` for the operators, indices and NaN rules).
"""

from __future__ import annotations

from typing import Any

from opendnn.core.arrays import bind, bind_bytes
from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dispatch import dispatch, load_backend, require_handle
from opendnn.core.errors import Status, require
from opendnn.core.handle import Handle
from opendnn.families.reduce.problem import ReduceProblem, ReduceTensorDescriptor, reduce_problem


def get_reduction_workspace_size(
    handle: Handle, reduce_desc: ReduceTensorDescriptor, a_desc: TensorDescriptor, c_desc: TensorDescriptor
) -> int:
    """Bytes of workspace ``reduce_tensor`` needs for this reduction on this handle's backend.

    The NumPy backend needs none; the Triton backend needs room for partial results when it splits
    the reduced set over several programs (few outputs, many elements each), else none.

    Raises:
        BadParam: the descriptors break a rule of ``reduce_problem``.
    """
    return _workspace_size(handle, reduce_problem(reduce_desc, a_desc, c_desc))


def get_reduction_indices_size(
    handle: Handle, reduce_desc: ReduceTensorDescriptor, a_desc: TensorDescriptor, c_desc: TensorDescriptor
) -> int:
    """Bytes of the indices array: one ``reduce_desc.indices_type`` per element of C when indices
    are asked for, else 0.

    Raises:
        BadParam: the descriptors break a rule of ``reduce_problem``.
    """
    problem = reduce_problem(reduce_desc, a_desc, c_desc)
    return 0 if problem.indices is None else problem.indices.numel * problem.indices.dtype.itemsize


def reduce_tensor(
    handle: Handle,
    reduce_desc: ReduceTensorDescriptor,
    indices: Any,
    workspace: Any,
    alpha: float,
    a_desc: TensorDescriptor,
    a: Any,
    beta: float,
    c_desc: TensorDescriptor,
    c: Any,
) -> None:
    """``c = alpha * reduce(a) + beta * c``; with beta == 0, c is never read.

    Args:
        indices: with FLATTENED_INDICES (MIN, MAX, AMAX), an array of ``reduce_desc.indices_type``
            holding at least C's element count, written packed row-major with C's dims; else
            ignored (None is fine).
        workspace: a contiguous array (any dtype), 16-byte aligned, of at least
            ``get_reduction_workspace_size`` bytes; None when that size is 0.

    Raises:
        BadParam: C's dims not A's or 1, indices missing or asked of ADD..., a workspace missing,
            too small or misaligned, a tensor past its buffer or on another device.
    """
    ab = bind("a", a_desc, a)
    cb = bind("c", c_desc, c, output=True)
    problem = reduce_problem(reduce_desc, a_desc, c_desc, alpha=alpha, beta=beta)
    ib = None
    if problem.indices is not None:
        require(
            indices is not None,
            f"indices=None but reduce_desc.indices=FLATTENED_INDICES needs an array of "
            f"{problem.indices.numel} {problem.indices.dtype.name} elements",
            Status.BAD_PARAM_NULL_POINTER,
        )
        ib = bind("indices", problem.indices, indices, output=True)
    wb = bind_bytes("workspace", workspace, _workspace_size(handle, problem), "get_reduction_workspace_size")
    dispatch(handle, "reduce", problem, ab, cb, ib, wb)


def _workspace_size(handle: Handle, problem: ReduceProblem) -> int:
    size: int = load_backend("reduce", require_handle(handle).backend, handle.device).workspace_size(problem)
    return size
