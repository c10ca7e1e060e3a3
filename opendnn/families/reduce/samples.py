"""Samples of the reduce family: reduce_tensor over several axes, with indices for MIN, MAX and AMAX."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.core.handle import Handle, create
from opendnn.core.samples import FLOAT_TYPES, ErrorSample, Sample, Tensors, blend, checked, descriptor, values
from opendnn.families.reduce.api import get_reduction_workspace_size, reduce_tensor
from opendnn.families.reduce.problem import ReduceTensorDescriptor, ReduceTensorIndices, ReduceTensorOp, reference


def run_reduce_tensor(sample: Sample, t: Tensors, handle: Handle) -> tuple[np.ndarray, np.ndarray]:
    """Reduces over the axes named in the variant ("MAX/0,2,3"); indices, when the operator has
    them, are checked too (appended to the values)."""
    name, _, axes_text = sample.variant.partition("/")
    op = ReduceTensorOp[name]
    axes = tuple(int(k) for k in axes_text.split(","))
    indexed = op in (ReduceTensorOp.MIN, ReduceTensorOp.MAX, ReduceTensorOp.AMAX)
    reduce_desc = ReduceTensorDescriptor(
        op,
        DataType.DOUBLE if sample.dtype is DataType.DOUBLE else DataType.FLOAT,
        indices=ReduceTensorIndices.FLATTENED_INDICES if indexed else ReduceTensorIndices.NO_INDICES,
    )
    products = (ReduceTensorOp.MUL, ReduceTensorOp.MUL_NO_ZEROS)  # kept inside float16's range
    a = t.input(sample.shape, sample.dtype, sample.layout, *((0.5, 1.5) if op in products else (-3.0, 3.0)))
    out_shape = tuple(1 if k in axes else d for k, d in enumerate(sample.shape))
    values, indices = reference(op, t.values(a), axes)
    c, expected = blend(sample, t, out_shape, values)
    workspace_bytes = get_reduction_workspace_size(handle, reduce_desc, descriptor(a), descriptor(c))
    workspace = t.workspace(workspace_bytes)
    index_array = t.array(np.full(out_shape, -1), DataType.INT32) if indexed else None
    reduce_tensor(
        handle, reduce_desc, index_array, workspace, sample.alpha, descriptor(a), a, sample.beta, descriptor(c), c
    )
    actual, expected = checked(t, c, expected)
    if indices is not None:  # (MIN, MAX, AMAX: the ops that index)
        actual = np.concatenate([actual.ravel(), t.values(index_array).ravel()])
        expected = np.concatenate([expected.ravel(), indices.ravel()])
    return actual, expected


# the table -------------------------------------------------------------------------------------

SHAPES = {"small": (2, 3, 4, 5), "large": (8, 64, 40, 48)}


def samples(size: str = "small") -> Iterator[Sample]:
    """The reduce_tensor samples at SHAPES[size]."""
    shape = SHAPES[size]
    for reduce_op, dtype in itertools.product(ReduceTensorOp, FLOAT_TYPES):
        axes = "0,2,3" if reduce_op.name in ("ADD", "MAX", "AVG") else "3"
        yield Sample(
            "reduce_tensor", f"{reduce_op.name}/{axes}", dtype, shape, layout="permuted", runner=run_reduce_tensor
        )
    yield Sample(
        "reduce_tensor",
        "ADD/3",
        DataType.FLOAT,
        shape,
        alpha=0.5,
        beta=0.25,
        layout="subregion",
        runner=run_reduce_tensor,
    )
    yield Sample("reduce_tensor", "MIN/1,2", DataType.FLOAT, shape, layout="subregion", runner=run_reduce_tensor)
    yield Sample("reduce_tensor", "NORM2/0,1,2,3", DataType.FLOAT, shape, runner=run_reduce_tensor)


def _c_of_other_dims() -> dict[str, Any]:
    """reduce_tensor's arguments with C's dims neither A's nor 1."""
    a, c = values(2, 3), values(2, 2)
    return {
        "handle": create("cpu"),
        "reduce_desc": ReduceTensorDescriptor(ReduceTensorOp.ADD),
        "indices": None,
        "workspace": None,
        "alpha": 1.0,
        "a_desc": TensorDescriptor("float32", (2, 3)),
        "a": a,
        "beta": 0.0,
        "c_desc": TensorDescriptor("float32", (2, 2)),
        "c": c,
    }


def error_samples() -> list[ErrorSample]:
    """Bad calls of reduce_tensor and their messages."""
    return [
        ErrorSample(
            "half compute type",
            ReduceTensorDescriptor,
            lambda: {"op": ReduceTensorOp.ADD, "compute_type": DataType.HALF},
            BadParam,
            "compute_type=HALF must be FLOAT or DOUBLE",
        ),
        ErrorSample(
            "c of other dims",
            reduce_tensor,
            _c_of_other_dims,
            BadParam,
            "c_desc.dims[1]=2 must equal a_desc.dims[1]=3 or 1",
        ),
    ]
