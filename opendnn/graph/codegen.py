"""The source of one Triton kernel for a fusion region, built as text and meant to be read.

The kernel walks the region's iteration space in the memory order of its dominant tensor (the
first it stores, else the largest it reads), that tensor's stride-1 dim fastest, so neighbouring
lanes touch neighbouring addresses whatever the layout (NCHW, channels-last, any permutation). A
pointwise region gives each program BLOCK consecutive elements of the space in that order; a region
ending in a reduction or genstats gives each program BLOCK_KEEP elements of the kept dims and loops
over the reduced ones BLOCK_REDUCE at a time, each in that order. Every tensor is addressed through
its own strides, known when the plan is built and written into the source as numbers (a broadcast
dim has no term; a tensor packed in the walk order reads at the flat index), so any layout and any
broadcast costs nothing at run time. Values are computed in the compute type and converted to each
output's type when stored; intermediates stay in registers.

The activations come from the library's shared Triton forms (``activation``,
``activation_derivative``), the same code the pointwise kernels and the convolution and matmul
epilogues run; relu and clipped relu give NaN for NaN, as torch's.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from opendnn import PointwiseMode
from opendnn.core.descriptors import TensorDescriptor, strides_for_order
from opendnn.core.dtypes import DataType
from opendnn.core.errors import NotSupported, Status
from opendnn.graph.fusion import Region
from opendnn.graph.operation_graph import NodeSpec, OperationGraph, TensorSpec
from opendnn.graph.operations import POINTWISE_ROLES, RELATIONAL

WIDE = 2**31 - 1  # above this many elements (or offsets), index arithmetic runs in int64
POINTWISE_BLOCK = 1024
REDUCE_BLOCK = 1024  # at most this many reduced elements per loop iteration
TILE = 4096  # at most this many elements (BLOCK_KEEP x BLOCK_REDUCE) per program of a reduction
NUM_WARPS = 4

# the floating types narrower than a kernel's compute type, which a value computed in it rounds to
NARROWER = {
    "tl.float32": (DataType.HALF, DataType.BFLOAT16),
    "tl.float64": (DataType.FLOAT, DataType.HALF, DataType.BFLOAT16),
}
TRITON_TYPES = {
    DataType.FLOAT: "tl.float32",
    DataType.DOUBLE: "tl.float64",
    DataType.HALF: "tl.float16",
    DataType.BFLOAT16: "tl.bfloat16",
    DataType.INT8: "tl.int8",
    DataType.UINT8: "tl.uint8",
    DataType.INT32: "tl.int32",
    DataType.INT64: "tl.int64",
    DataType.BOOLEAN: "tl.int1",
}
NAN_PROPAGATE = "propagate_nan=tl.PropagateNan.ALL"
EXPRESSIONS = {
    "add": "{a} + {b}",
    "sub": "{a} - {b}",
    "mul": "{a} * {b}",
    "div": "{a} / {b}",
    "max": "tm.maximum({a}, {b})",
    "min": "tm.minimum({a}, {b})",
    "mod": "tm.fmod({a}, {b})",
    "pow": "tm.pow({a}, {b})",
    "add_square": "{a} + {b} * {b}",
    "abs": "tl.abs({a})",
    "ceil": "tl.math.ceil({a})",
    "floor": "tl.math.floor({a})",
    "cos": "tl.cos({a})",
    "sin": "tl.sin({a})",
    "tan": "tm.tan({a})",
    "exp": "tl.exp({a})",
    "log": "tl.log({a})",
    "neg": "{a} * -1.0",  # not -{a}: Triton negates as 0 - a, which gives +0 for +0
    "sqrt": "tl.sqrt({a})",
    "rsqrt": "1.0 / tl.sqrt({a})",
    "reciprocal": "1.0 / {a}",
    "erf": "tl.math.erf({a})",
    "identity": "{a}",
    "cmp_eq": "tl.where({a} == {b}, 1.0, 0.0)",
    "cmp_neq": "tl.where({a} != {b}, 1.0, 0.0)",
    "cmp_gt": "tl.where({a} > {b}, 1.0, 0.0)",
    "cmp_ge": "tl.where({a} >= {b}, 1.0, 0.0)",
    "cmp_lt": "tl.where({a} < {b}, 1.0, 0.0)",
    "cmp_le": "tl.where({a} <= {b}, 1.0, 0.0)",
    # nested selects, not & and | of the comparisons: an operand may be a scalar, whose comparison
    # Triton's interpreter cannot combine bitwise with a tensor's
    "logical_and": "tl.where({a} != 0, tl.where({b} != 0, 1.0, 0.0), 0.0)",
    "logical_or": "tl.where({a} != 0, 1.0, tl.where({b} != 0, 1.0, 0.0))",
    "logical_not": "tl.where({a} == 0, 1.0, 0.0)",
    "binary_select": "tl.where({c} != 0, {a}, {b})",
}


@dataclass(frozen=True)
class Reduction:
    """How a reduction mode accumulates: the start value, each element's term, how two partial
    results combine (``sum`` or a combine function of the source), and the final step."""

    initial: str
    term: str
    combine: str
    finish: str = "{r}"


REDUCTIONS = {
    "add": Reduction("0.0", "{v}", "sum"),
    "avg": Reduction("0.0", "{v}", "sum", "{r} / {count}"),
    "norm1": Reduction("0.0", "tl.abs({v})", "sum"),
    "norm2": Reduction("0.0", "{v} * {v}", "sum", "tl.sqrt({r})"),
    "mul": Reduction("1.0", "{v}", "multiply"),
    "mul_no_zeros": Reduction("1.0", "tl.where({v} != 0, {v}, 1.0)", "multiply"),
    "min": Reduction('float("inf")', "{v}", "minimum_with_nan"),
    "max": Reduction('-float("inf")', "{v}", "maximum_with_nan"),
    "amax": Reduction("0.0", "tl.abs({v})", "maximum_with_nan"),
}
SUM_OF_SQUARES = Reduction("0.0", "{v} * {v}", "sum")  # genstats' second output
COMBINE_FUNCTIONS = {
    "multiply": "a * b",
    "minimum_with_nan": f"tl.minimum(a, b, {NAN_PROPAGATE})",
    "maximum_with_nan": f"tl.maximum(a, b, {NAN_PROPAGATE})",
}
ACCUMULATE = {
    "sum": "{acc} + {t}",
    "multiply": "{acc} * {t}",
    "minimum_with_nan": f"tl.minimum({{acc}}, {{t}}, {NAN_PROPAGATE})",
    "maximum_with_nan": f"tl.maximum({{acc}}, {{t}}, {NAN_PROPAGATE})",
}
RESERVED = {
    "index",
    "mask",
    "keep",
    "keep_mask",
    "red",
    "red_mask",
    "start",
    "tl",
    "tm",
    "triton",
    "activation",
    "activation_derivative",
    "fused_kernel",
    "multiply",
    "minimum_with_nan",
    "maximum_with_nan",
    "float",
}


@dataclass(frozen=True)
class GeneratedKernel:
    """A kernel's source and how to launch it: pointer arguments (uids) then scalar arguments (uids)
    in the kernel's order, the tensors it writes (the last pointers), the grid and the block sizes."""

    source: str
    pointers: tuple[int, ...]
    scalars: tuple[int, ...]
    writes: tuple[int, ...]
    grid: int
    blocks: tuple[tuple[str, int], ...]
    num_warps: int = NUM_WARPS


def generate(region: Region, graph: OperationGraph, library: dict[str, str]) -> GeneratedKernel:
    """The kernel of ``region``. ``library`` maps ``math`` and ``activation`` to the modules of the
    shared Triton pieces the source imports.

    Raises:
        NotSupported: a tensor of a type the kernel cannot read or write (fp8), naming it.
    """
    return _Writer(region, graph, library).kernel()


class _Writer:
    def __init__(self, region: Region, graph: OperationGraph, library: dict[str, str]) -> None:
        self.region, self.graph, self.library = region, graph, library
        self.space = region.space
        produced = {uid for node in region.nodes for _, uid in node.outputs}
        self.reads = list(dict.fromkeys(uid for node in region.nodes for _, uid in node.inputs if uid not in produced))
        self.reducer = region.reducer
        self.reducing = self.reducer is not None
        inside = {id(node) for node in region.nodes}
        # full-space tensors the kernel stores: graph outputs and what other steps read
        self.stores = [
            uid
            for node in region.nodes
            if node is not self.reducer
            for _, uid in node.outputs
            if not graph.tensors[uid].virtual or any(id(graph.nodes[c]) not in inside for c in graph.consumers[uid])
        ]
        self.results = [uid for _, uid in self.reducer.outputs] if self.reducer is not None else []
        tensors = [graph.tensors[uid] for uid in (*self.reads, *produced)]
        for tensor in tensors:
            if tensor.desc.dtype not in TRITON_TYPES:
                raise NotSupported(
                    f"tensor '{tensor.name}' is {tensor.desc.dtype.name}, which the generated "
                    "kernels do not read or write",
                    Status.NOT_SUPPORTED_DATA_TYPE,
                )
        double = graph.compute_data_type is DataType.DOUBLE or any(t.desc.dtype is DataType.DOUBLE for t in tensors)
        self.compute = "tl.float64" if double else "tl.float32"
        self.wide = max([math.prod(self.space), *(t.desc.extent for t in tensors)]) > WIDE
        self.names = _identifiers(tensors)
        self.order = self._walk_order()
        # the (dim, stride) pairs of a tensor packed in the walk order, which reads at the flat index
        packed = strides_for_order(self.space, tuple(self.order))  # size-1 dims have no stride to match
        self.packed_in_walk_order = sorted((d, packed[d]) for d in self.order)
        if self.results:
            out_dims = graph.tensors[self.results[0]].desc.dims
            self.kept = [d for d in self.order if out_dims[d] == self.space[d]]
            self.reduced = [d for d in self.order if out_dims[d] == 1]
        else:
            self.kept, self.reduced = self.order, []

    def _walk_order(self) -> list[int]:
        """The space's dims of size above 1, outermost first, in the memory order of the region's
        dominant tensor (the first it stores, else the largest it reads): its largest stride outermost,
        its stride-1 dim innermost. Equal strides, and the dims the tensor broadcasts along (size 1 or
        stride 0; each stays in its place), keep their logical order."""
        dominant = self.stores[0] if self.stores else max(self.reads, key=lambda u: self.graph.tensors[u].desc.numel)
        strides = {d: stride for d, stride in self._strided_dims(self.graph.tensors[dominant].desc) if stride > 0}
        dims = [d for d, size in enumerate(self.space) if size > 1]
        by_stride = iter(sorted(strides, key=lambda d: -strides[d]))  # a stable sort
        return [next(by_stride) if d in strides else d for d in dims]

    # ---- the whole source -----------------------------------------------------------------------------

    def kernel(self) -> GeneratedKernel:
        pointers = [uid for uid in self.reads if not self.graph.tensors[uid].by_value] + self.stores + self.results
        scalars = [uid for uid in self.reads if self.graph.tensors[uid].by_value]
        keep_count = math.prod(self.space[d] for d in self.kept)
        if self.reducing:
            reduce_count = math.prod(self.space[d] for d in self.reduced)
            block_reduce = min(_power_of_two(reduce_count), REDUCE_BLOCK)
            block_keep = min(_power_of_two(keep_count), max(1, TILE // block_reduce))
            blocks: tuple[tuple[str, int], ...] = (("BLOCK_KEEP", block_keep), ("BLOCK_REDUCE", block_reduce))
            grid = -(-keep_count // block_keep)
        else:
            block = min(_power_of_two(keep_count), POINTWISE_BLOCK)
            blocks, grid = (("BLOCK", block),), -(-keep_count // block)
        parameters = [f"{self.names[u]}_ptr" for u in pointers] + [
            f"{self.names[u]}_value: tl.float64" for u in scalars
        ]
        parameters += [f"{name}: tl.constexpr" for name, _ in blocks]
        lines = [
            *self._header(),
            "",
            "",
            *self._combine_functions(),
            "@triton.jit",
            f"def fused_kernel({', '.join(parameters)}):",
        ]
        body = _without_unused_indices(self._reduction_body() if self.reducing else self._pointwise_body())
        lines += ["    " + line if line else "" for line in body]
        return GeneratedKernel(
            "\n".join(lines) + "\n", tuple(pointers), tuple(scalars), tuple(self.stores + self.results), grid, blocks
        )

    def _header(self) -> list[str]:
        graph, region = self.graph, self.region
        nodes = ", ".join(f"{n.name} ({_mode_name(n)})" for n in region.nodes)
        reads = ", ".join(_describe(graph.tensors[u]) for u in self.reads)
        writes = ", ".join(_describe(graph.tensors[u]) for u in (*self.stores, *self.results))
        moved = sum(
            graph.tensors[u].desc.size_in_bytes
            for u in (*self.reads, *self.stores, *self.results)
            if not graph.tensors[u].by_value
        )
        shape = "x".join(str(d) for d in self.space)
        walk = (
            f"kept dims {self.kept} by program, reduced dims {self.reduced} in a loop"
            if self.reducing
            else f"BLOCK elements per program over dims {self.order}"
        )
        return [
            f'"""Fused kernel of graph \'{graph.name}\': {nodes}.',
            "",
            f"Iteration space {shape} ({math.prod(self.space)} elements), {walk} (the last dim fastest);",
            f"compute in {self.compute}.",
            f"Reads {reads}.",
            f"Writes {writes}.",
            f"Memory traffic: {moved} bytes, each tensor read or written once.",
            '"""',
            "",
            "import triton",
            "import triton.language as tl",
            "",
            f"import {self.library['math']} as tm",
            f"from {self.library['activation']} import activation, activation_derivative",
            f"from {self.library['blend']} import narrowed",
        ]

    def _combine_functions(self) -> list[str]:
        lines = []
        combines = {reduction.combine for _, reduction, _, _ in self._accumulators()} if self.reducer else set()
        for name in sorted(combines - {"sum"}):
            lines += ["@triton.jit", f"def {name}(a, b):", f"    return {COMBINE_FUNCTIONS[name]}", "", ""]
        return lines

    # ---- the two bodies -------------------------------------------------------------------------------

    def _pointwise_body(self) -> list[str]:
        count = math.prod(self.space)
        program = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        lines = [f"index = {program} * BLOCK + tl.arange(0, BLOCK)", f"mask = index < {count}"]
        lines += self._unravel("index", self.kept, "i")
        lines += self._loads(self.reads, lambda d: f"i{d}", lambda dims: "mask")
        lines += self._nodes()
        for uid in self.stores:
            offsets = self._offsets(self.graph.tensors[uid].desc, lambda d: f"i{d}") or "0 * index"
            lines.append(self._store(uid, self.names[uid], offsets, "mask"))
        return lines

    def _reduction_body(self) -> list[str]:
        keep_count = math.prod(self.space[d] for d in self.kept)
        reduce_count = math.prod(self.space[d] for d in self.reduced)
        program = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        lines = [f"keep = {program} * BLOCK_KEEP + tl.arange(0, BLOCK_KEEP)", f"keep_mask = keep < {keep_count}"]
        lines += self._unravel("keep", self.kept, "k")
        accumulators = self._accumulators()
        lines += [
            f"{acc} = tl.full([BLOCK_KEEP, BLOCK_REDUCE], {reduction.initial}, {self.compute})"
            for acc, reduction, _, _ in accumulators
        ]
        start = "tl.arange(0, BLOCK_REDUCE).to(tl.int64)" if self.wide else "tl.arange(0, BLOCK_REDUCE)"
        loop = [
            f"red = start + {start}",
            f"red_mask = red < {reduce_count}",
            "mask = keep_mask[:, None] & red_mask[None, :]",
        ]
        loop += self._unravel("red", self.reduced, "r")
        invariant = [uid for uid in self.reads if not self._varies(uid)]
        lines[2 + len(self.kept) : 2 + len(self.kept)] = self._loads(invariant, self._tile_index, self._tile_mask)
        loop += self._loads([uid for uid in self.reads if self._varies(uid)], self._tile_index, self._tile_mask)
        loop += self._nodes()
        for uid in self.stores:
            tile = "0 * (keep[:, None] + red[None, :])"  # one element stored by every lane of the tile
            offsets = self._offsets(self.graph.tensors[uid].desc, self._tile_index) or tile
            loop.append(self._store(uid, self.names[uid], offsets, "mask"))
        for acc, reduction, value, _ in accumulators:
            masked = f"tl.where(mask, {reduction.term.format(v=value)}, {reduction.initial})"
            loop.append(f"{acc} = {ACCUMULATE[reduction.combine].format(acc=acc, t=masked)}")
        lines += [f"for start in range(0, {reduce_count}, BLOCK_REDUCE):", *("    " + line for line in loop)]
        for acc, reduction, _, uid in accumulators:
            total = (
                f"tl.sum({acc}, axis=1)" if reduction.combine == "sum" else f"tl.reduce({acc}, 1, {reduction.combine})"
            )
            result = self.names[uid]
            lines.append(f"{result} = {reduction.finish.format(r=total, count=f'{reduce_count}.0')}")
            offsets = self._offsets(self.graph.tensors[uid].desc, lambda d: f"k{d}") or "0 * keep"
            lines.append(self._store(uid, result, offsets, "keep_mask"))
        return lines

    def _accumulators(self) -> list[tuple[str, Reduction, str, int]]:
        """(accumulator, reduction, the value it accumulates, the output it finishes into) of the reducer."""
        reducer = self.reducer
        assert reducer is not None
        value = self.names[reducer.inputs[0][1]]
        if reducer.op == "genstats":
            return [
                ("acc_sum", REDUCTIONS["add"], value, reducer.outputs[0][1]),
                ("acc_sum_of_squares", SUM_OF_SQUARES, value, reducer.outputs[1][1]),
            ]
        return [("acc", REDUCTIONS[reducer.attribute("mode")], value, reducer.outputs[0][1])]

    # ---- pieces ---------------------------------------------------------------------------------------

    def _unravel(self, flat: str, dims: list[int], prefix: str) -> list[str]:
        """``{prefix}{d} = ...``: the index along each of ``dims`` (outermost first) of the ``flat`` index."""
        lines = []
        for position, d in enumerate(dims):
            inner = math.prod(self.space[e] for e in dims[position + 1 :])
            expression = flat if inner == 1 else f"{flat} // {inner}"
            if position > 0:
                expression += f" % {self.space[d]}"
            lines.append(f"{prefix}{d} = {expression}")
        return lines

    def _tile_index(self, d: int) -> str:
        return f"k{d}[:, None]" if d in self.kept else f"r{d}[None, :]"

    def _tile_mask(self, dims: set[int]) -> str:
        keep, reduce = any(d in self.kept for d in dims), any(d in self.reduced for d in dims)
        if keep and reduce:
            return "mask"
        return "keep_mask[:, None]" if keep else "red_mask[None, :]"

    def _offsets(self, desc: TensorDescriptor, index: Callable[[int], str]) -> str:
        """The element offset of ``desc`` at the current indices: one term per dim it does not broadcast."""
        if not self.reducing and self._strided_dims(desc) == self.packed_in_walk_order:
            return "index"
        return " + ".join(_term(index(d), stride) for d, stride in self._strided_dims(desc))

    def _strided_dims(self, desc: TensorDescriptor) -> list[tuple[int, int]]:
        """(space dim, stride) of each dim where ``desc`` varies (right-aligned to the space)."""
        lead = len(self.space) - desc.ndim
        return [
            (lead + k, stride)
            for k, (size, stride) in enumerate(zip(desc.dims, desc.strides))
            if size > 1 and self.space[lead + k] > 1
        ]

    def _varies(self, uid: int) -> bool:
        """Whether a read varies over the space (a scalar, or a tensor broadcast over all of it, does not)."""
        tensor = self.graph.tensors[uid]
        return not tensor.by_value and bool(self._strided_dims(tensor.desc))

    def _loads(self, uids: list[int], index: Callable[[int], str], mask_of: Callable[[set[int]], str]) -> list[str]:
        lines = []
        for uid in uids:
            tensor, name = self.graph.tensors[uid], self.names[uid]
            if tensor.by_value:
                lines.append(f"{name} = tl.cast({name}_value, {self.compute})")
                continue
            offsets = self._offsets(tensor.desc, index)
            if not offsets:
                lines.append(f"{name} = tl.load({name}_ptr).to({self.compute})")
                continue
            dims = {d for d, _ in self._strided_dims(tensor.desc)}
            lines.append(f"{name} = tl.load({name}_ptr + {_grouped(offsets)}, mask={mask_of(dims)}).to({self.compute})")
        return lines

    def _nodes(self) -> list[str]:
        lines = []
        for node in self.region.nodes:
            if node.op != "pointwise":
                continue
            operands = {role: self.names[uid] for role, uid in node.inputs}
            output = self.names[node.outputs[0][1]]
            expression = pointwise_expression(node, operands)
            if self.compute == "tl.float64" and PointwiseMode(node.attribute("mode")) in RELATIONAL:
                # its 1.0 and 0.0 are float32 constants: what reads it computes in float64 too
                expression += ".to(tl.float64)"
            tensor = self.graph.tensors[node.outputs[0][1]]
            if not tensor.virtual and tensor.desc.dtype in NARROWER[self.compute]:
                # a graph output of a narrower type: what reads it reads the value the caller gets (a
                # virtual tensor keeps the compute type's value in the kernel, as a fused kernel may)
                expression = f"narrowed({expression}, {TRITON_TYPES[tensor.desc.dtype]}).to({self.compute})"
            lines.append(f"{output} = {expression}  # {node.name}")
        return lines

    def _store(self, uid: int, value: str, offsets: str, mask: str) -> str:
        dtype = self.graph.tensors[uid].desc.dtype
        if dtype is DataType.BOOLEAN:
            converted = f"({value} != 0)"
        elif dtype is DataType.BFLOAT16 and self.compute == "tl.float64":
            converted = f"narrowed({value}, tl.bfloat16)"  # through float32, as the library's stores convert it
        else:
            converted = f"{value}.to({TRITON_TYPES[dtype]})"
        return f"tl.store({self.names[uid]}_ptr + {_grouped(offsets)}, {converted}, mask={mask})"


def pointwise_expression(node: NodeSpec, operands: dict[str, str]) -> str:
    """The Triton expression of a pointwise node over its operands' variables."""
    mode = PointwiseMode(node.attribute("mode"))
    a, b, c = (operands.get(role, "") for role in POINTWISE_ROLES)
    name, coef = mode.value, repr(float(node.attribute("coef", 0.0)))
    if name in EXPRESSIONS:
        return EXPRESSIONS[name].format(a=a, b=b, c=c)
    activation = name[:-4]
    if name.endswith("_fwd"):
        x, expression = a, f'activation("{activation}", {a}, {coef})'
    else:
        x, expression = b, f'{a} * activation_derivative("{activation}", {b}, {coef})'
    if activation in ("relu", "clipped_relu"):  # NaN in, NaN out (torch's)
        return f"tl.where({x} != {x}, {x}, {expression})"
    return expression


def _without_unused_indices(lines: list[str]) -> list[str]:
    """``lines`` less the index definitions (``i0 = ...``) no other line reads: a dim no tensor
    varies along needs none."""
    text = "\n".join(lines)
    kept = []
    for line in lines:
        name = re.match(r"\s*([ikr]\d+) = ", line)
        if name is None or re.search(rf"\b{name.group(1)}\b", text.replace(line, "", 1)):
            kept.append(line)
    return kept


def _grouped(offsets: str) -> str:
    return f"({offsets})" if " " in offsets else offsets


def _term(index: str, stride: int) -> str:
    return index if stride == 1 else f"{index} * {stride}"


def _power_of_two(count: int) -> int:
    return 1 << max(count - 1, 0).bit_length()


def _identifiers(tensors: list[TensorSpec]) -> dict[int, str]:
    """A Python identifier per tensor, from its name: readable, unique, clear of the kernel's own names."""
    names: dict[int, str] = {}
    taken = set(RESERVED)
    for tensor in tensors:
        if tensor.uid in names:
            continue
        base = re.sub(r"\W+", "_", tensor.name).strip("_") or "t"
        if base[0].isdigit() or keyword.iskeyword(base) or re.fullmatch(r"[ikr]\d+|acc\w*", base):
            base = "t_" + base
        name, suffix = base, 1
        while name in taken:
            name, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(name)
        names[tensor.uid] = name
    return names


def _describe(tensor: TensorSpec) -> str:
    if tensor.by_value:
        return f"{tensor.name} (scalar by value)"
    return f"{tensor.name} {list(tensor.desc.dims)} {tensor.desc.dtype.name}"


def _mode_name(node: NodeSpec) -> str:
    return str(node.attribute("mode", node.op))
