"""Reading bound tensors into NumPy arrays and writing results back through their strides."""

from __future__ import annotations

from typing import Any

import numpy as np

from opendnn.core.arrays import Bound, bf16_to_float32, float32_to_bf16
from opendnn.core.dtypes import DataType
from opendnn.core.errors import NotSupported


def numpy_view(bound: Bound) -> np.ndarray:
    """The bound view as a NumPy array sharing memory (bfloat16 as uint16 bits).

    Raises:
        NotSupported: an fp8 tensor, which only the matrix product's reference reads (its own way).
    """
    if bound.desc.dtype.is_fp8:
        raise NotSupported(f"{bound.name} of {bound.desc.dtype.name} on the NumPy backend: only matmul reads fp8")
    view: Any = bound.view
    if isinstance(view, np.ndarray):
        return view.view(np.uint16) if bound.desc.dtype is DataType.BFLOAT16 else view
    if bound.desc.dtype is DataType.BFLOAT16:
        import torch

        return view.view(torch.int16).numpy().view(np.uint16)
    return view.numpy()


def read(bound: Bound, dtype: DataType) -> np.ndarray:
    """The tensor's values in ``dtype``: the bound memory itself, read-only, when it already holds
    ``dtype`` (no pass over it), else a new array. Writing into a read-only view raises rather than
    changing the caller's input."""
    values = numpy_view(bound)
    if bound.desc.dtype is DataType.BFLOAT16:
        return bf16_to_float32(values).astype(dtype.to_numpy(), copy=False)
    target = dtype.to_numpy()
    if values.dtype != target:
        return values.astype(target)
    values = values.view()  # a view of its own: the flag below leaves the caller's array as it is
    values.setflags(write=False)  # (0.1 us less than setting ``flags.writeable``: no flags object)
    return values


def output_array(bound: Bound, dtype: DataType, alpha: float, beta: float, *inputs: np.ndarray) -> np.ndarray | None:
    """The output's own memory, for a backend to compute its result straight into instead of handing
    it to ``write`` (a pass saved): where alpha is 1, beta is 0 and the output holds ``dtype`` in C
    order, sharing no memory with ``inputs``; else None."""
    if alpha != 1.0 or beta != 0.0 or bound.desc.dtype is not dtype:
        return None
    out = numpy_view(bound)
    if not (out.flags.c_contiguous and out.flags.writeable) or any(np.may_share_memory(out, a) for a in inputs):
        return None
    return out


def write(bound: Bound, result: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> None:
    """``out = alpha * result + beta * out``, converted to the output's dtype; with beta == 0 the
    prior content of out is never read. ``result`` is float32 or float64 and broadcasts to out."""
    out = numpy_view(bound)
    if alpha != 1.0:
        result = alpha * result
    if beta != 0.0:
        result = result + beta * read(bound, DataType.of(result.dtype))
    out_dtype = bound.desc.dtype
    if out_dtype is DataType.BFLOAT16:
        result = float32_to_bf16(np.asarray(result, np.float32))
    elif out_dtype is DataType.BOOLEAN:
        result = np.asarray(result) != 0
    np.copyto(out, np.broadcast_to(np.asarray(result).astype(out.dtype, copy=False), out.shape))
