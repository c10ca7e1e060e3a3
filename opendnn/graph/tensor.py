"""The tensors of an operation graph: graph inputs and outputs the caller binds to memory at
execute time, virtual tensors that live between operations, and scalars passed by value.

A tensor's data type, when not set, is the one its operation fixes (statistics are FLOAT, a
convolution's output has its image's type), else follows its role: the graph's ``io_data_type`` for a tensor
the caller binds (an input, or an operation's output marked with ``set_output(True)``), the
graph's ``intermediate_data_type`` for a virtual one. Strides, when not set, are packed: the
activations an operation computes (``Operation.memory_order``) in the memory order of its input
(cudnn-frontend's inference: a channels-last image gives channels-last outputs), a slice's output
its input's strides times the steps (a view of its memory), every other tensor row-major.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from opendnn.core.arrays import memory_order
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam
from opendnn.graph.operations import view_strides

if TYPE_CHECKING:
    from opendnn.graph.builder import OperationBuilder


class Tensor:
    """One tensor of a graph (cudnn-frontend's ``tensor``); made by ``Graph.tensor``,
    ``Graph.tensor_like`` or as an operation's output, never directly.

    The setters return the tensor itself, so calls chain: ``y.set_output(True).set_data_type(...)``.
    """

    def __init__(
        self,
        graph: OperationBuilder,
        name: str,
        dims: Sequence[int],
        strides: Sequence[int] | None,
        data_type: DataType | None,
        *,
        virtual: bool,
        value: float | None = None,
        pass_by_value: bool = False,
    ) -> None:
        self._graph = graph
        self.uid = len(graph._tensors)  # the tensor's position in its graph: serialized plans refer to it
        self._name = name
        self._dims = checked_dims("dim", dims, name)
        self._strides = None if strides is None else checked_strides(strides, self._dims, name)
        self._data_type = None if data_type is None else data_type_of(f"tensor '{name}': data_type", data_type)
        self._virtual = virtual
        self._value = None if value is None else float(value)
        self.pass_by_value = pass_by_value
        self.order_like: Tensor | None = None  # an operation's output: the input whose memory order it takes
        # a slice's output: its input and the steps; a view of the input's memory, of its strides times the steps
        self.view_of: tuple[Tensor, tuple[int, ...]] | None = None
        # an operation's output: the type its rule fixes (statistics FLOAT, a convolution's its image's),
        # inferred again by validate as the inputs' types change; None where the role decides
        self.inferred_data_type: DataType | None = None

    # ---- the cudnn-frontend accessors --------------------------------------------------------------

    def set_output(self, is_output: bool = True) -> Tensor:
        """Mark an operation's output as a graph output (the caller binds memory to it), or back to
        virtual."""
        self._graph._changed()
        self._virtual = not is_output
        return self

    def set_data_type(self, data_type: Any) -> Tensor:
        self._graph._changed()
        self._data_type = data_type_of(f"tensor '{self._name}': data_type", data_type)
        return self

    def set_name(self, name: str) -> Tensor:
        self._graph._changed()
        self._name = str(name)
        return self

    def set_dim(self, dims: Sequence[int]) -> Tensor:
        """Set the dims (an operation's output: where its dims are not unique, as a strided
        ``conv_dgrad``); ``validate`` checks them against the operation's rule."""
        self._graph._changed()
        self._dims = checked_dims("dim", dims, self._name)
        if self._strides is not None and len(self._strides) != len(self._dims):
            self._strides = None
        return self

    def set_stride(self, strides: Sequence[int]) -> Tensor:
        """Set the strides in elements: any layout, e.g. channels-last for an operation's output."""
        self._graph._changed()
        self._strides = checked_strides(strides, self._dims, self._name)
        return self

    def get_name(self) -> str:
        return self._name

    def get_dim(self) -> list[int]:
        return list(self._dims)

    def get_stride(self) -> list[int]:
        return list(self.strides)

    def get_data_type(self) -> DataType:
        return self.data_type

    def get_is_virtual(self) -> bool:
        return self._virtual

    # ---- what the graph reads ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def dims(self) -> tuple[int, ...]:
        return self._dims

    @property
    def strides(self) -> tuple[int, ...]:
        if self._strides is not None:
            return self._strides
        if self.view_of is not None:
            return view_strides(self.view_of[0].strides, self.view_of[1])
        return strides_for_order(self._dims, self._memory_order())

    def _memory_order(self) -> tuple[int, ...]:
        """The dims, outermost first, of the first tensor up the chain of ``order_like`` whose strides
        are set or a view's (dims of equal strides in their order); row-major where the chain reaches none."""
        tensor = self
        while tensor._strides is None and tensor.view_of is None and tensor.order_like is not None:
            tensor = tensor.order_like
        if tensor._strides is None and tensor.view_of is None:
            return tuple(range(len(self._dims)))
        return memory_order(tensor.strides)

    @property
    def data_type(self) -> DataType:
        if self._data_type is not None:
            return self._data_type
        if self.inferred_data_type is not None:
            return self.inferred_data_type
        if self.pass_by_value:
            return self._graph.compute_data_type
        return self._graph.intermediate_data_type if self._virtual else self._graph.io_data_type

    @property
    def explicit_data_type(self) -> DataType | None:
        """The data type set on the tensor, or None when its operation or its role decides it."""
        return self._data_type

    @property
    def is_virtual(self) -> bool:
        return self._virtual

    @property
    def value(self) -> float | None:
        """A scalar's value given at build time; None for every other tensor and for a scalar whose
        value comes by name at execute time."""
        return self._value

    @property
    def numel(self) -> int:
        return math.prod(self._dims)

    def descriptor(self) -> TensorDescriptor:
        return TensorDescriptor(self.data_type, self._dims, self.strides)

    def __repr__(self) -> str:
        role = "by value" if self.pass_by_value else "virtual" if self._virtual else "io"
        return f"Tensor('{self._name}', dims={list(self._dims)}, {self.data_type.name}, {role})"


def data_type_of(what: str, data_type: Any) -> DataType:
    """The DataType ``data_type`` names (a DataType, its value, a NumPy or torch dtype), or BadParam
    naming ``what`` (the tensor and parameter, or the graph's parameter). None names no type (NumPy
    would read it as float64)."""
    try:
        if data_type is not None:
            return DataType.of(data_type)
    except BadParam:
        pass
    raise BadParam(f"{what}={data_type!r} is not one of {[m.value for m in DataType]}")


def checked_dims(what: str, dims: Sequence[int], name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(d) for d in dims)
    except (TypeError, ValueError):
        raise BadParam(f"tensor '{name}': {what}={dims!r} must be a sequence of ints") from None
    if not values or any(d < 1 for d in values):
        raise BadParam(f"tensor '{name}': {what}={list(values)} must hold 1 or more dims, each at least 1")
    return values


def checked_strides(strides: Sequence[int], dims: tuple[int, ...], name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in strides)
    except (TypeError, ValueError):
        raise BadParam(f"tensor '{name}': stride={strides!r} must be a sequence of ints") from None
    if len(values) != len(dims) or any(s < 0 for s in values):
        raise BadParam(
            f"tensor '{name}': stride={list(values)} must hold {len(dims)} strides (one per dim of "
            f"{list(dims)}), each at least 0"
        )
    return values
