"""What runs together: the fusion rule and its cost model (docs/design/graph.md has the reasoning).

A plan is a sequence of steps; a virtual tensor that crosses from one step to another lives in the
workspace, one that stays inside a step never reaches memory. The cost model counts the bytes a
fused intermediate saves: its write and one read per consumer, ``size * (1 + consumers)``; a fused
graph output saves its reads only. Recomputing a broadcast intermediate per element of a larger
space costs arithmetic, not memory traffic, so the rule fuses whenever the rule allows.

The rule, in two passes over the nodes in topological order:

1. Epilogues. A ``conv_fprop`` or ``matmul`` (the anchor) takes the pointwise chain after it into
   its fused epilogue while each link's input is virtual with that node as its only consumer and
   the node fills the next free slot of the anchor's epilogue. The slots come in stages, each
   stage's slots in any order, stages in order: convolution ``scale | bias, residual | activation``
   (``act(alpha * conv + z + bias)``), matmul ``scale | bias | activation | residual``
   (``act(alpha * (A @ B) + bias) + residual``). A scale is a multiply by a scalar given at build
   time; a bias an add of a per-channel (convolution) or per-column / per-row (matmul) tensor; a
   residual an add of a tensor of the output's dims; an activation any forward activation.
2. Regions, from the last node back. A reduction or genstats starts a region over its input's
   space; a pointwise node joins the region of its consumers when every consumer of its output is
   in that one region (so a region has one way out and no path leaves it and comes back), and
   starts a region of its own otherwise. A region's graph outputs are stored from the kernel, so
   one whose dims are smaller than the region's space (it would be written once per broadcast
   element) starts a region instead of joining.

Every other node (normalizations, softmax, pooling, convolution gradients, an anchor without an
epilogue) is a step of its own, run by its cuDNN-shaped call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from opendnn import PointwiseMode
from opendnn.graph.operation_graph import NodeSpec, OperationGraph
from opendnn.graph.operations import Dims, channel_dims

REDUCING = ("reduction", "genstats")


@dataclass
class Region:
    """Pointwise nodes in topological order ending at ``sink`` (pointwise, reduction or genstats),
    computed over the iteration ``space``: one generated kernel."""

    nodes: list[NodeSpec]
    space: Dims

    @property
    def sink(self) -> NodeSpec:
        return self.nodes[-1]


@dataclass
class Epilogue:
    """An anchor (conv_fprop or matmul) and the chain its fused epilogue computes."""

    anchor: NodeSpec
    chain: list[NodeSpec] = field(default_factory=list)
    scale: float = 1.0
    bias: int | None = None  # uid
    residual: int | None = None  # uid
    activation: tuple[PointwiseMode, float] | None = None
    filled: list[str] = field(default_factory=list)  # the slots taken, in chain order

    @property
    def output(self) -> int:
        last = self.chain[-1] if self.chain else self.anchor
        return last.outputs[0][1]


Part = Region | Epilogue | NodeSpec


def partition(graph: OperationGraph) -> list[Part]:
    """The graph's steps in an order that runs every producer before its consumers."""
    epilogues = [e for e in (grow_epilogue(node, graph) for node in graph.nodes
                             if node.op in EPILOGUE_STAGES) if e is not None]
    claimed = {id(n) for e in epilogues for n in (e.anchor, *e.chain)}
    regions = grow_regions(graph, claimed)
    position = {id(node): k for k, node in enumerate(graph.nodes)}
    parts: list[Part] = [*epilogues, *regions]
    parts += [n for n in graph.nodes if id(n) not in claimed and not any(n in r.nodes for r in regions)]
    return sorted(parts, key=lambda part: position[id(last_node(part))])


def last_node(part: Part) -> NodeSpec:
    if isinstance(part, Region):
        return part.sink
    if isinstance(part, Epilogue):
        return part.chain[-1] if part.chain else part.anchor
    return part


# ---- pass 1: epilogues --------------------------------------------------------------------------------

Matcher = Callable[[Epilogue, NodeSpec, int, OperationGraph], bool]


def grow_epilogue(anchor: NodeSpec, graph: OperationGraph) -> Epilogue | None:
    """The anchor's epilogue (None when no node joins it)."""
    epilogue = Epilogue(anchor)
    stages = EPILOGUE_STAGES[anchor.op]
    stage, current = 0, anchor.outputs[0][1]
    while True:
        consumers = graph.consumers[current]
        if not graph.tensors[current].virtual or len(consumers) != 1:
            break
        node = graph.nodes[consumers[0]]
        operands = [uid for _, uid in node.inputs]
        if node.op != "pointwise" or operands.count(current) != 1:
            break
        slot = next(((k, name) for k in range(stage, len(stages)) for name in stages[k]
                     if name not in epilogue.filled and SLOTS[name](epilogue, node, current, graph)), None)
        if slot is None:
            break
        stage = slot[0]
        epilogue.filled.append(slot[1])
        epilogue.chain.append(node)
        current = node.outputs[0][1]
    _trim(epilogue, graph)
    return epilogue if epilogue.chain else None


def _trim(epilogue: Epilogue, graph: OperationGraph) -> None:
    """Drop links from the end until the output has a type the fused call writes: a convolution's
    output has its input's type, a matmul's any float type."""
    image_type = graph.tensors[epilogue.anchor.inputs[0][1]].desc.dtype
    while epilogue.chain:
        dtype = graph.tensors[epilogue.output].desc.dtype
        if (dtype is image_type) if epilogue.anchor.op == "conv_fprop" else dtype.is_floating:
            break
        epilogue.chain.pop()
        _unfill(epilogue, epilogue.filled.pop())


def _unfill(epilogue: Epilogue, slot: str) -> None:
    if slot == "scale":
        epilogue.scale = 1.0
    elif slot == "activation":
        epilogue.activation = None
    else:
        setattr(epilogue, slot, None)


def _other_operand(node: NodeSpec, current: int) -> int:
    """The operand of a node that is not ``current`` (``current`` itself for a one-input node)."""
    return next((uid for _, uid in node.inputs if uid != current), current)


def _mode(node: NodeSpec) -> PointwiseMode:
    return PointwiseMode(node.attribute("mode"))


def match_scale(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    other = graph.tensors[_other_operand(node, current)]
    if _mode(node) is not PointwiseMode.MUL or not other.by_value or other.value is None:
        return False
    epilogue.scale = other.value
    return True


def match_bias(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    other = graph.tensors[_other_operand(node, current)]
    if _mode(node) is not PointwiseMode.ADD or other.by_value or not other.desc.dtype.is_floating:
        return False
    dims = graph.tensors[current].desc.dims
    if epilogue.anchor.op == "conv_fprop":
        fits = other.desc.dims == channel_dims(dims)
    else:
        fits = bias_axis(other.desc.dims, dims) is not None
    if fits:
        epilogue.bias = other.uid
    return fits


def bias_axis(bias: Dims, output: Dims) -> str | None:
    """"column" for a matmul bias of N values along the last dim, "row" for M values along the one
    before, None for any other shape."""
    if len(bias) > len(output):
        return None
    padded = (1,) * (len(output) - len(bias)) + bias
    if padded[:-1] == (1,) * (len(output) - 1) and padded[-1] == output[-1]:
        return "column"
    if padded[:-2] == (1,) * (len(output) - 2) and padded[-2:] == (output[-2], 1):
        return "row"
    return None


def match_residual(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    other = graph.tensors[_other_operand(node, current)]
    fits = (_mode(node) is PointwiseMode.ADD and not other.by_value and other.desc.dtype.is_floating
            and other.desc.dims == graph.tensors[current].desc.dims)
    if fits:
        epilogue.residual = other.uid
    return fits


def match_activation(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    mode = _mode(node)
    if not mode.value.endswith("_fwd"):
        return False
    epilogue.activation = (mode, node.attribute("coef", 0.0))
    return True


SLOTS: dict[str, Matcher] = {"scale": match_scale, "bias": match_bias, "residual": match_residual,
                             "activation": match_activation}
EPILOGUE_STAGES = {
    "conv_fprop": (("scale",), ("bias", "residual"), ("activation",)),
    "matmul": (("scale",), ("bias",), ("activation",), ("residual",)),
}


# ---- pass 2: regions ----------------------------------------------------------------------------------

def grow_regions(graph: OperationGraph, claimed: set[int]) -> list[Region]:
    region_of: dict[int, Region] = {}  # node position -> its region
    regions: list[Region] = []
    for position in reversed(range(len(graph.nodes))):
        node = graph.nodes[position]
        if id(node) in claimed or node.op not in ("pointwise", *REDUCING):
            continue
        target = None
        if node.op == "pointwise":
            output = graph.tensors[node.outputs[0][1]]
            owners = {id(region_of.get(c)) for c in graph.consumers[output.uid]}
            consumer = region_of.get(graph.consumers[output.uid][0]) if graph.consumers[output.uid] else None
            if consumer is not None and owners == {id(consumer)} and (output.virtual or
                                                                      output.desc.dims == consumer.space):
                target = consumer
        if target is None:
            space = graph.tensors[node.inputs[0][1]].desc.dims if node.op in REDUCING else \
                graph.tensors[node.outputs[0][1]].desc.dims
            target = Region([], space)
            regions.append(target)
        target.nodes.insert(0, node)
        region_of[position] = target
    return regions


# ---- the cost model -----------------------------------------------------------------------------------

def saved_bytes(part: Part, graph: OperationGraph) -> int:
    """Bytes of memory traffic the part saves against running its nodes one by one: per fused
    intermediate its write (when virtual) and one read per consumer."""
    if isinstance(part, NodeSpec):
        return 0
    nodes = part.nodes[:-1] if isinstance(part, Region) else [part.anchor, *part.chain[:-1]]
    total = 0
    for node in nodes:
        for _, uid in node.outputs:
            tensor = graph.tensors[uid]
            reads = len(graph.consumers[uid])
            total += tensor.desc.size_in_bytes * (reads + (1 if tensor.virtual else 0))
    return total
