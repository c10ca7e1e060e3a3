"""The operation graph: a validated, frozen snapshot of a graph's tensors and nodes in
topological order, with the key its plans are cached under and its JSON form.

``validate`` checks what the builder cannot check once and for all: names are unique, there is no
cycle (a deserialized graph may hold one), every operation's rule still holds after the caller's
``set_dim`` / ``set_data_type`` changes, a slice's or a reshape's output is a view of its input
(virtual, addressing the input's elements), nothing dangles (an input no node reads, a node none of
whose outputs is read or asked for), and the graph has an output. Errors name the node and
the tensor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opendnn.core.descriptors import TensorDescriptor
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, Status
from opendnn.graph.operations import OPERATIONS, Shape, addresses_within, apply_rule, label, view_strides

if TYPE_CHECKING:
    from opendnn.graph.builder import Node, OperationBuilder

FORMAT = "opendnn.graph/1"


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the operation graph: ``uid`` is its position, ``desc`` its dims, strides and type."""

    uid: int
    name: str
    desc: TensorDescriptor
    virtual: bool
    by_value: bool = False
    value: float | None = None

    @property
    def bound_by_caller(self) -> bool:
        """Whether the variant pack gives this tensor: graph inputs and outputs, and scalars whose
        value comes at execute time."""
        return not self.virtual and not (self.by_value and self.value is not None)


@dataclass(frozen=True)
class NodeSpec:
    """A node of the operation graph: its tensors by role (uids) and its attributes."""

    name: str
    op: str
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]
    attributes: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        return label(self.name, self.op)

    def input(self, role: str) -> int | None:
        return next((uid for r, uid in self.inputs if r == role), None)

    def output(self, role: str) -> int | None:
        return next((uid for r, uid in self.outputs if r == role), None)

    def attribute(self, key: str, default: Any = None) -> Any:
        return next((value for k, value in self.attributes if k == key), default)


@dataclass(frozen=True)
class OperationGraph:
    """Tensors by uid and nodes in topological order; ``consumers`` and ``producer`` index them."""

    name: str
    io_data_type: DataType
    compute_data_type: DataType
    intermediate_data_type: DataType
    tensors: tuple[TensorSpec, ...]
    nodes: tuple[NodeSpec, ...]
    consumers: dict[int, tuple[int, ...]] = field(init=False, compare=False)  # uid -> node positions
    producer: dict[int, int] = field(init=False, compare=False)  # uid -> node position
    position: dict[int, int] = field(init=False, compare=False)  # id(node) -> node position

    def __post_init__(self) -> None:
        consumers: dict[int, list[int]] = {t.uid: [] for t in self.tensors}
        producer = {}
        for position, node in enumerate(self.nodes):
            for _, uid in node.inputs:
                if position not in consumers[uid]:
                    consumers[uid].append(position)
            for _, uid in node.outputs:
                producer[uid] = position
        object.__setattr__(self, "consumers", {uid: tuple(c) for uid, c in consumers.items()})
        object.__setattr__(self, "producer", producer)
        object.__setattr__(self, "position", {id(node): k for k, node in enumerate(self.nodes)})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "name": self.name,
            "io_data_type": self.io_data_type.name,
            "compute_data_type": self.compute_data_type.name,
            "intermediate_data_type": self.intermediate_data_type.name,
            "tensors": [
                {
                    "name": t.name,
                    "dims": list(t.desc.dims),
                    "strides": list(t.desc.strides),
                    "data_type": t.desc.dtype.name,
                    "virtual": t.virtual,
                    "by_value": t.by_value,
                    "value": t.value,
                }
                for t in self.tensors
            ],
            "nodes": [
                {
                    "name": n.name,
                    "op": n.op,
                    "inputs": dict(n.inputs),
                    "outputs": dict(n.outputs),
                    "attributes": dict(n.attributes),
                }
                for n in self.nodes
            ],
        }

    @property
    def key(self) -> str:
        """What the graph's plans are cached under: a hash of its JSON form."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


def validate(graph: OperationBuilder) -> OperationGraph:
    """The checked snapshot of ``graph``.

    Raises:
        BadParam: naming the node and tensor that break a rule (see the module docstring).
    """
    _unique_names(graph)
    order = _topological_order(graph._nodes)
    for node in order:
        _check_rule(node)
    _check_views(graph)
    _check_dangling(graph)
    for tensor in _produced(graph):
        if not tensor.is_virtual and not tensor.descriptor().is_non_overlapping:
            raise BadParam(
                f"output '{tensor.name}' has strides {list(tensor.strides)} under which elements of dims "
                f"{list(tensor.dims)} overlap: it cannot be written"
            )
    if not any(not t.is_virtual and t in _produced(graph) for t in graph._tensors):
        raise BadParam(f"graph '{graph.name}' has no output: mark an operation's output with set_output(True)")
    return snapshot(graph, order)


def snapshot(graph: OperationBuilder, order: Sequence[Node]) -> OperationGraph:
    tensors = tuple(
        TensorSpec(t.uid, t.name, t.descriptor(), t.is_virtual, t.pass_by_value, t.value) for t in graph._tensors
    )
    nodes = tuple(
        NodeSpec(
            n.name,
            n.op,
            tuple((r, t.uid) for r, t in n.inputs.items()),
            tuple((r, t.uid) for r, t in n.outputs.items()),
            tuple(sorted((k, _hashable(v)) for k, v in n.attributes.items())),
        )
        for n in order
    )
    return OperationGraph(
        graph.name, graph.io_data_type, graph.compute_data_type, graph.intermediate_data_type, tensors, nodes
    )


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _unique_names(graph: OperationBuilder) -> None:
    seen: dict[str, str] = {}
    for tensor in graph._tensors:
        if tensor.name in seen:
            raise BadParam(
                f"graph '{graph.name}': two tensors are named '{tensor.name}': names key the variant pack "
                "and must be unique"
            )
        seen[tensor.name] = tensor.name
    nodes: set[str] = set()
    for node in graph._nodes:
        if node.name in nodes:
            raise BadParam(f"graph '{graph.name}': two nodes are named '{node.name}'")
        nodes.add(node.name)


def _topological_order(nodes: Sequence[Node]) -> list[Node]:
    """The nodes, each after the producers of its inputs (Kahn's algorithm, stable).

    Raises:
        BadParam: naming the nodes of a cycle.
    """
    producer = {id(t): n for n in nodes for t in n.outputs.values()}
    waiting = {id(n): {id(producer[id(t)]) for t in n.inputs.values() if id(t) in producer} for n in nodes}
    order: list[Node] = []
    done: set[int] = set()
    while len(order) < len(nodes):
        ready = [n for n in nodes if id(n) not in done and waiting[id(n)] <= done]
        if not ready:
            stuck = [n.label for n in nodes if id(n) not in done]
            raise BadParam(f"the graph has a cycle through {', '.join(stuck)}", Status.BAD_PARAM)
        order.extend(ready)
        done.update(id(n) for n in ready)
    return order


def _check_rule(node: Node) -> None:
    operation = OPERATIONS[node.op]
    shapes = {role: Shape(t.name, t.dims, t.data_type, t.pass_by_value) for role, t in node.inputs.items()}
    specs = apply_rule(node.name, node.op, shapes, node.attributes, {r: t.dims for r, t in node.outputs.items()})
    if set(specs) != set(node.outputs) or not set(specs) <= set(operation.outputs):
        raise BadParam(f"{node.label}: outputs {sorted(node.outputs)} must be {sorted(specs)}")
    for role, spec in specs.items():
        tensor = node.outputs[role]
        if tensor.dims != spec.dims:
            raise BadParam(
                f"{node.label}: output {role} '{tensor.name}' dims {list(tensor.dims)} must be {list(spec.dims)}",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
        tensor.inferred_data_type = spec.dtype  # the inputs' types may have changed since the node was added
        if spec.dtype is not None and tensor.data_type is not spec.dtype:
            raise BadParam(
                f"{node.label}: output {role} '{tensor.name}' data type {tensor.data_type.name} must be "
                f"{spec.dtype.name}",
                Status.BAD_PARAM,
            )
        if tensor.pass_by_value:
            raise BadParam(f"{node.label}: output {role} '{tensor.name}' cannot be a scalar passed by value")


def _check_views(graph: OperationBuilder) -> None:
    """A slice's or a reshape's output is a view of its input's memory, and virtual. A slice's strides
    are its input's times the steps along each dim of more than one element (a dim of 1 addresses
    nothing, whatever its stride: torch's views keep their own there); a reshape's, set on its output,
    must address elements of its input (``addresses_within``)."""
    for node in graph._nodes:
        if node.op not in ("slice", "reshape"):
            continue
        x, y = node.inputs["x"], node.outputs["y"]
        if not y.is_virtual:
            raise BadParam(
                f"{node.label}: output y '{y.name}' is a view of input '{x.name}' and cannot be a graph "
                "output: mark a copy of it (identity) instead"
            )
        if node.op == "reshape":
            if not addresses_within(y.dims, y.strides, x.dims, x.strides):
                raise BadParam(
                    f"{node.label}: output y '{y.name}' dims {list(y.dims)} strides {list(y.strides)} must "
                    f"address elements of input '{x.name}' (dims {list(x.dims)}, strides {list(x.strides)}), "
                    "whose memory it views, each dim stepping along the input's dims",
                    Status.BAD_PARAM_SHAPE_MISMATCH,
                )
            continue
        strides = view_strides(x.strides, node.attributes["step"])
        if any(a != b for a, b, size in zip(y.strides, strides, y.dims) if size != 1):
            raise BadParam(
                f"{node.label}: output y '{y.name}' strides {list(y.strides)} must be {list(strides)}, input "
                f"'{x.name}' strides {list(x.strides)} times the steps (a view of its memory)",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )


def _produced(graph: OperationBuilder) -> set[Any]:
    return {t for n in graph._nodes for t in n.outputs.values()}


def _check_dangling(graph: OperationBuilder) -> None:
    """A node none of whose outputs is read or asked for, and an input no node reads, dangle."""
    read = {t for n in graph._nodes for t in n.inputs.values()}
    produced = _produced(graph)
    for node in graph._nodes:
        if all(t.is_virtual and t not in read for t in node.outputs.values()):
            first = next(iter(node.outputs.values()))
            raise BadParam(
                f"{node.label}: output '{first.name}' is virtual and read by no node, and so is every other "
                "output of the node: mark one with set_output(True) or leave the node out"
            )
    for tensor in graph._tensors:
        if tensor not in read and tensor not in produced:
            raise BadParam(f"tensor '{tensor.name}' is read by no node of graph '{graph.name}'")
        if tensor.is_virtual and tensor not in produced:
            raise BadParam(
                f"tensor '{tensor.name}' is virtual but no node of graph '{graph.name}' produces it: "
                "an input is bound by the caller (set_output(True))"
            )
