"""What runs together: the fusion rule and its cost model (docs/design/graph.md has the reasoning).

A plan is a sequence of steps; a virtual tensor that crosses from one step to another lives in the
workspace, one that stays inside a step never reaches memory. The cost model counts the bytes a
fused intermediate saves: its write and one read per consumer, ``size * (1 + consumers)``; a fused
graph output saves its reads only. Recomputing a broadcast intermediate per element of a larger
space costs arithmetic, not memory traffic, so the rule fuses whenever the rule allows.

The rule, in two passes over the nodes in topological order:

1. Epilogues. A ``conv_fprop`` or ``matmul`` (the anchor) takes the pointwise chain after it into
   its fused epilogue while each link's input is virtual with that node as its only consumer, the
   node is in no earlier anchor's epilogue (the sum of two convolutions joins the first one's, as
   its residual) and the node fills the next free slot of the anchor's epilogue. The slots come in
   stages, each stage's slots in any order, stages in order: convolution ``scale | bias, residual |
   activation`` (``act(alpha * conv + z + bias)``), matmul ``scale | bias | activation | residual``
   (``act(alpha * (A @ B) + bias) + residual``). A scale is a multiply by a finite scalar given at
   build time; a bias an add of a per-channel (convolution) or per-column / per-row (matmul) tensor; a
   residual an add of a tensor of the output's dims; an activation any forward activation, less
   relu and clipped relu for a matmul (its epilogue turns NaN into 0, the graph keeps NaN). A
   matmul's chain also passes through a ``reshape`` that relabels the product's rows (split or
   merged, the last dim kept, every element where row-major order puts it: a linear layer's
   ``(B * L, N)`` read as ``(B, L, N)``); after it, the call reads the residual and writes the
   output through their views in the product's dims, so each must have one (``relabeled``).
2. Regions, from the last node back. A reduction or genstats starts a region over its input's
   space; a pointwise node joins the region of its consumers when every consumer of its output is
   in that one region, and starts a region of its own otherwise. When its consumers lie in several
   regions of one space (at most one of them reducing, none reading its result) and no path
   through another step connects them, those regions merge first and the node joins: so a
   pointwise DAG over one space is one kernel, whatever its number of outputs, and no path ever
   leaves a region and comes back. Regions of one space left apart at the end merge under the same
   conditions (outputs that share no node still share a launch and their common inputs' reads).
   A region stores the graph outputs and the tensors other steps read; a graph output whose dims
   are smaller than the region's space (it would be written once per broadcast element) starts a
   region instead of joining.

Every other node (normalizations, softmax, pooling, convolution gradients, an anchor without an
epilogue) is a step of its own, run by its cuDNN-shaped call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from opendnn import PointwiseMode
from opendnn.core.descriptors import TensorDescriptor, packed_strides
from opendnn.graph.calls import RELU_MODES
from opendnn.graph.operation_graph import NodeSpec, OperationGraph
from opendnn.graph.operations import Dims, channel_dims

REDUCING = ("reduction", "genstats")


@dataclass
class Region:
    """Pointwise nodes, and at most one reduction or genstats, in topological order, computed over
    the iteration ``space``: one generated kernel."""

    nodes: list[NodeSpec]
    space: Dims

    @property
    def reducer(self) -> NodeSpec | None:
        return next((node for node in self.nodes if node.op in REDUCING), None)


@dataclass
class Epilogue:
    """An anchor (conv_fprop or matmul) and the chain its fused epilogue computes."""

    anchor: NodeSpec
    chain: list[NodeSpec] = field(default_factory=list)
    scale: float = 1.0
    bias: int | None = None  # uid
    bias_axis: str = "column"  # a matmul's: "column" (N values along the last dim) or "row" (M values)
    residual: int | None = None  # uid
    activation: tuple[PointwiseMode, float] | None = None
    filled: list[str] = field(default_factory=list)  # the slots taken (or "reshape"), in chain order

    @property
    def output(self) -> int:
        last = self.chain[-1] if self.chain else self.anchor
        return last.outputs[0][1]

    def in_anchor_dims(self, desc: TensorDescriptor, graph: OperationGraph) -> TensorDescriptor:
        """``desc`` (the chain's output or residual, in the dims after its reshapes) viewed in the
        anchor's output dims, the view the fused call reads or writes."""
        view = relabeled(desc, graph.tensors[self.anchor.outputs[0][1]].desc.dims)
        assert view is not None  # the chain only grows (and is trimmed) where it exists
        return view


Part = Region | Epilogue | NodeSpec


def partition(graph: OperationGraph) -> list[Part]:
    """The graph's steps in an order that runs every producer before its consumers."""
    epilogues: list[Epilogue] = []
    claimed: set[int] = set()
    for node in graph.nodes:
        epilogue = grow_epilogue(node, graph, claimed) if node.op in EPILOGUE_STAGES else None
        if epilogue is not None:
            epilogues.append(epilogue)
            claimed |= {id(n) for n in (epilogue.anchor, *epilogue.chain)}
    regions = grow_regions(graph, claimed)
    in_region = {id(n) for r in regions for n in r.nodes}
    parts: list[Part] = [*epilogues, *regions]
    parts += [n for n in graph.nodes if id(n) not in claimed and id(n) not in in_region]
    return _in_dependency_order(parts, graph)


def nodes_of(part: Part) -> list[NodeSpec]:
    if isinstance(part, Region):
        return part.nodes
    if isinstance(part, Epilogue):
        return [part.anchor, *part.chain]
    return [part]


def _in_dependency_order(parts: list[Part], graph: OperationGraph) -> list[Part]:
    """``parts`` topologically sorted by the tensors they pass (Kahn's algorithm; among the ready
    ones, the one whose first node comes first)."""
    writer = {uid: k for k, part in enumerate(parts) for node in nodes_of(part) for _, uid in node.outputs}
    needs = [
        {writer[uid] for node in nodes_of(part) for _, uid in node.inputs if writer.get(uid, k) != k}
        for k, part in enumerate(parts)
    ]
    first = [min(graph.position[id(node)] for node in nodes_of(part)) for part in parts]
    order: list[int] = []
    while len(order) < len(parts):
        ready = min((k for k in range(len(parts)) if k not in order and needs[k] <= set(order)), key=lambda k: first[k])
        order.append(ready)
    return [parts[k] for k in order]


# ---- pass 1: epilogues --------------------------------------------------------------------------------

Matcher = Callable[[Epilogue, NodeSpec, int, OperationGraph], bool]


def grow_epilogue(anchor: NodeSpec, graph: OperationGraph, claimed: set[int]) -> Epilogue | None:
    """The anchor's epilogue (None when no node joins it); a node of ``claimed`` (by id), already in
    another anchor's epilogue, ends the chain."""
    epilogue = Epilogue(anchor)
    stages = EPILOGUE_STAGES[anchor.op]
    stage, current = 0, anchor.outputs[0][1]
    while True:
        consumers = graph.consumers[current]
        if not graph.tensors[current].virtual or len(consumers) != 1:
            break
        node = graph.nodes[consumers[0]]
        if node.op == "reshape" and epilogue.anchor.op == "matmul" and _relabels_rows(node, epilogue, graph):
            epilogue.filled.append("reshape")
            epilogue.chain.append(node)
            current = node.outputs[0][1]
            continue
        operands = [uid for _, uid in node.inputs]
        if node.op != "pointwise" or operands.count(current) != 1 or id(node) in claimed:
            break
        slot = next(
            (
                (k, name)
                for k in range(stage, len(stages))
                for name in stages[k]
                if name not in epilogue.filled and SLOTS[name](epilogue, node, current, graph)
            ),
            None,
        )
        if slot is None:
            break
        stage = slot[0]
        epilogue.filled.append(slot[1])
        epilogue.chain.append(node)
        current = node.outputs[0][1]
    _trim(epilogue, graph)
    return epilogue if epilogue.chain else None


def _trim(epilogue: Epilogue, graph: OperationGraph) -> None:
    """Drop links from the end until the output has a type the fused call writes (a convolution's
    output has its input's type, a matmul's any float type) and, past a reshape, a view in the
    product's dims; a reshape is not the last link (its output would be the product itself)."""
    image_type = graph.tensors[epilogue.anchor.inputs[0][1]].desc.dtype
    product_dims = graph.tensors[epilogue.anchor.outputs[0][1]].desc.dims
    while epilogue.chain:
        desc = graph.tensors[epilogue.output].desc
        writable = (desc.dtype is image_type) if epilogue.anchor.op == "conv_fprop" else desc.dtype.is_floating
        if writable and epilogue.filled[-1] != "reshape" and relabeled(desc, product_dims) is not None:
            break
        epilogue.chain.pop()
        _unfill(epilogue, epilogue.filled.pop())


def _relabels_rows(node: NodeSpec, epilogue: Epilogue, graph: OperationGraph) -> bool:
    """Whether a reshape after a matmul's chain reads the product's elements where row-major order
    puts them, with the product's last dim kept: the same memory, its rows split or merged."""
    source, result = (graph.tensors[uid].desc for uid in (node.inputs[0][1], node.outputs[0][1]))
    product_dims = graph.tensors[epilogue.anchor.outputs[0][1]].desc.dims
    view = relabeled(source, result.dims)
    return (
        result.dims[-1:] == product_dims[-1:]
        and view is not None
        and all(a == b for d, a, b in zip(result.dims, view.strides, result.strides) if d > 1)
    )


def relabeled(desc: TensorDescriptor, dims: Dims) -> TensorDescriptor | None:
    """The view of ``desc``'s memory in ``dims`` that holds its elements in row-major order (NumPy's
    ``reshape`` without a copy), or None where its strides allow none: each run of ``desc``'s dims
    that one dim of ``dims`` merges (or that one of its dims splits into) must be one strided run."""
    if math.prod(dims) != math.prod(desc.dims):
        return None
    if desc.dims == dims:
        return desc
    if math.prod(dims) == 0:
        return TensorDescriptor(desc.dtype, tuple(dims), packed_strides(tuple(dims)))
    # ``desc``'s dims grouped into strided runs (dims of 1 dropped), innermost run first
    runs: list[tuple[int, int]] = []  # (elements, stride of the run's innermost dim)
    for extent, stride in reversed([(d, s) for d, s in zip(desc.dims, desc.strides) if d != 1]):
        if runs and stride == runs[-1][0] * runs[-1][1]:
            runs[-1] = (runs[-1][0] * extent, runs[-1][1])
        else:
            runs.append((extent, stride))
    strides = [0] * len(dims)
    run, inside = 0, 1  # the run the next dim lies in, the elements of it below that dim
    for k in reversed(range(len(dims))):
        if dims[k] == 1 or not runs:
            strides[k] = 1
            continue
        elements, stride = runs[run]
        strides[k] = stride * inside
        inside *= dims[k]
        if inside == elements:
            run, inside = run + 1, 1
        elif elements % inside:
            return None  # the dim straddles two runs
    return TensorDescriptor(desc.dtype, tuple(dims), tuple(strides))


def _unfill(epilogue: Epilogue, slot: str) -> None:
    if slot == "scale":
        epilogue.scale = 1.0
    elif slot == "activation":
        epilogue.activation = None
    elif slot != "reshape":
        setattr(epilogue, slot, None)


def _other_operand(node: NodeSpec, current: int) -> int:
    """The operand of a node that is not ``current`` (``current`` itself for a one-input node)."""
    return next((uid for _, uid in node.inputs if uid != current), current)


def _mode(node: NodeSpec) -> PointwiseMode:
    return PointwiseMode(node.attribute("mode"))


def match_scale(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    other = graph.tensors[_other_operand(node, current)]
    # (the call's alpha is finite: a NaN or infinite scale stays a multiply in a generated kernel)
    if _mode(node) is not PointwiseMode.MUL or not other.by_value or other.value is None:
        return False
    if not math.isfinite(other.value):
        return False
    epilogue.scale = other.value
    return True


def match_bias(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    other = graph.tensors[_other_operand(node, current)]
    if _mode(node) is not PointwiseMode.ADD or other.by_value or not other.desc.dtype.is_floating:
        return False
    dims = graph.tensors[current].desc.dims
    axis: str | None = "column"
    if epilogue.anchor.op == "conv_fprop":
        fits = other.desc.dims == channel_dims(dims)
    else:
        axis = bias_axis(other.desc.dims, dims)
        # past a reshape the rows are relabelled: a column bias alone keeps its meaning
        fits = axis == "column" or (axis == "row" and "reshape" not in epilogue.filled)
    if fits:
        epilogue.bias, epilogue.bias_axis = other.uid, axis or "column"
    return fits


def bias_axis(bias: Dims, output: Dims) -> str | None:
    """ "column" for a matmul bias of N values along the last dim, "row" for M values along the one
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
    fits = (
        _mode(node) is PointwiseMode.ADD
        and not other.by_value
        and other.desc.dtype.is_floating
        and other.desc.dims == graph.tensors[current].desc.dims
        and relabeled(other.desc, graph.tensors[epilogue.anchor.outputs[0][1]].desc.dims) is not None
    )
    if fits:
        epilogue.residual = other.uid
    return fits


def match_activation(epilogue: Epilogue, node: NodeSpec, current: int, graph: OperationGraph) -> bool:
    """Any forward activation; for a matmul, not relu or clipped relu: its epilogue has no NaN option
    (cuBLASLt's relu turns NaN into 0), the graph's relu keeps NaN."""
    mode = _mode(node)
    if not mode.value.endswith("_fwd") or (epilogue.anchor.op == "matmul" and mode in RELU_MODES):
        return False
    epilogue.activation = (mode, node.attribute("coef", 0.0))
    return True


SLOTS: dict[str, Matcher] = {
    "scale": match_scale,
    "bias": match_bias,
    "residual": match_residual,
    "activation": match_activation,
}
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
        target = _consumers_region(node, graph, region_of, regions) if node.op == "pointwise" else None
        if target is None:
            space = graph.tensors[node.inputs[0][1] if node.op in REDUCING else node.outputs[0][1]].desc.dims
            target = Region([], space)
            regions.append(target)
        target.nodes.append(node)
        region_of[position] = target
    _merge_apart(regions, graph)
    for region in regions:
        region.nodes.sort(key=lambda node: graph.position[id(node)])
    return regions


def _merge_apart(regions: list[Region], graph: OperationGraph) -> None:
    """Merge the regions left of one space that may merge (``_mergeable``): outputs that share no
    node still share one kernel, its launch and its reads of common inputs."""
    merged = True
    while merged:
        merged = False
        region_of = {graph.position[id(node)]: r for r in regions for node in r.nodes}
        for first in regions:
            partner = next((r for r in regions if r is not first and _mergeable([first, r], graph, region_of)), None)
            if partner is not None:
                first.nodes += partner.nodes
                regions.remove(partner)
                merged = True
                break


def _consumers_region(
    node: NodeSpec, graph: OperationGraph, region_of: dict[int, Region], regions: list[Region]
) -> Region | None:
    """The region a pointwise node joins: the one holding every consumer of its output, after
    merging the consumers' regions when they are several of one space (at most one of them
    reducing) that no path through another step connects; None when it starts its own."""
    output = graph.tensors[node.outputs[0][1]]
    owners = [region_of.get(c) for c in graph.consumers[output.uid]]
    if not owners or any(owner is None for owner in owners):
        return None
    distinct = list({id(r): r for r in owners if r is not None}.values())
    target = distinct[0]
    if any(r.space != target.space for r in distinct):
        return None
    if not output.virtual and output.desc.dims != target.space:
        return None  # a graph output smaller than the space would be stored once per broadcast element
    if len(distinct) > 1:
        if not _mergeable(distinct, graph, region_of, node):
            return None
        for region in distinct[1:]:
            target.nodes += region.nodes
            regions.remove(region)
        for k, region in list(region_of.items()):
            if any(region is d for d in distinct):
                region_of[k] = target
    return target


def _mergeable(
    regions: list[Region], graph: OperationGraph, region_of: dict[int, Region], joining: NodeSpec | None = None
) -> bool:
    """Whether ``regions`` (with the node ``joining`` them) may be one kernel: one space, at most one
    reducing, no node reading its result, no path through another step from one to another
    (``region_of``: the region of each node position grouped so far)."""
    if any(r.space != regions[0].space for r in regions) or sum(r.reducer is not None for r in regions) > 1:
        return False
    members = {graph.position[id(node)] for r in regions for node in r.nodes}
    return not _reads_the_reduction(regions, joining) and not _path_outside(members, graph, region_of)


def _reads_the_reduction(regions: list[Region], joining: NodeSpec | None) -> bool:
    """Whether a node of ``regions`` (or ``joining``) reads a reduction's result: a kernel has it
    only after its loop, so that node needs a step of its own."""
    reducer = next((r.reducer for r in regions if r.reducer is not None), None)
    if reducer is None:
        return False
    results = {uid for _, uid in reducer.outputs}
    nodes = [*(m for r in regions for m in r.nodes), *([joining] if joining is not None else [])]
    return any(uid in results for n in nodes for _, uid in n.inputs)


def _path_outside(members: set[int], graph: OperationGraph, region_of: dict[int, Region]) -> bool:
    """Whether a path leaves the nodes at positions ``members`` and comes back to them: merged into
    one step, they would then wait on a step that waits on them. The path runs through steps, not
    only nodes: a region already grouped (``region_of``) is one kernel, which writes its outputs
    after it has read all its inputs, so a path entering it at one node leaves it at every other."""

    def step(k: int) -> set[int]:
        region = region_of.get(k)
        return {k} if region is None else {graph.position[id(node)] for node in region.nodes}

    def consumers(k: int) -> set[int]:
        return {c for _, uid in graph.nodes[k].outputs for c in graph.consumers[uid]}

    frontier = {c for k in members for c in consumers(k)} - members
    seen: set[int] = set()
    while frontier:
        entered = step(frontier.pop()) - seen
        seen |= entered
        reached = {c for k in entered for c in consumers(k)}
        if reached & members:
            return True
        frontier |= reached - seen
    return False


# ---- the cost model -----------------------------------------------------------------------------------


def saved_bytes(part: Part, graph: OperationGraph) -> int:
    """Bytes of memory traffic the part saves against running its nodes one by one: per
    intermediate, its reads inside the part and, when nothing outside needs it, its write."""
    inside = {id(node) for node in nodes_of(part)}
    total = 0
    for node in nodes_of(part):
        for _, uid in node.outputs:
            tensor = graph.tensors[uid]
            reads = [c for c in graph.consumers[uid] if id(graph.nodes[c]) in inside]
            stored = not tensor.virtual or len(reads) < len(graph.consumers[uid])
            total += tensor.desc.size_in_bytes * (len(reads) + (0 if stored else 1))
    return total
