"""The source of one Triton kernel for a fusion region, built as text and meant to be read.

The kernel walks the region's iteration space in the memory order of its dominant tensor (the
first it stores, else the largest it reads), that tensor's stride-1 dim fastest, so neighbouring
lanes touch neighbouring addresses whatever the layout (NCHW, channels-last, any permutation). A
pointwise region gives each program BLOCK consecutive elements of the space in that order; a region
ending in a reduction or genstats gives each program BLOCK_KEEP elements of the kept dims and loops
over the reduced ones BLOCK_REDUCE at a time, each in that order; when its kept elements give fewer
programs than the GPU has multiprocessors, a second grid axis splits the reduced dims into slices
whose partial results a second kernel combines in a fixed order (``reduction_split``). Every
tensor is addressed through its own strides, known when the plan is built and written into the
source as numbers (a broadcast dim has no term; a tensor packed in the walk order reads at the flat
index), so any layout and any broadcast costs nothing at run time. Values are computed in the
compute type and converted to each output's type when stored; intermediates stay in registers.

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
from opendnn.graph.operations import POINTWISE_ROLES

WIDE = 2**31 - 1  # above this many elements (or offsets), index arithmetic runs in int64
POINTWISE_BLOCK = 1024
REDUCE_BLOCK = 1024  # at most this many reduced elements per loop iteration
TILE = 4096  # at most this many elements (BLOCK_KEEP x BLOCK_REDUCE) per program of a reduction
NUM_WARPS = 4
# a reduction split over its reduced dims aims for this many programs on each multiprocessor: enough
# loads in flight to stream from memory (4 programs of 4 warps, each loading a TILE at each loop step)
PROGRAMS_PER_MULTIPROCESSOR = 4
COMBINE_BLOCK = 1024  # kept elements per program of a split reduction's combining pass

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
    "logical_and": "tl.where(({a} != 0) & ({b} != 0), 1.0, 0.0)",
    "logical_or": "tl.where(({a} != 0) | ({b} != 0), 1.0, 0.0)",
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
    "split",
    "slice_start",
    "partials",
    "combine_partials",
}


@dataclass(frozen=True)
class Split:
    """A reduction split over its reduced dims: ``count`` slices of ``slice_steps`` loop steps each
    (the last may be shorter), each program reducing one slice of its kept elements into
    ``partials`` (flat, in the compute type, in the workspace: per accumulator, ``count`` rows of
    the kept elements); ``combine_partials``, the source's second kernel, combines each kept
    element's partial results in slice order and writes ``results`` (``combine_grid`` programs of
    ``combine_block`` kept elements)."""

    count: int
    slice_steps: int
    partials: TensorDescriptor
    results: tuple[int, ...]
    combine_grid: int
    combine_block: int


@dataclass(frozen=True)
class GeneratedKernel:
    """A kernel's source and how to launch it: pointer arguments (uids) then scalar arguments (uids)
    in the kernel's order, the tensors it writes (the last pointers), the grid and the block sizes;
    for a split reduction, the split (the kernel then takes the partial results' pointer after the
    other pointers, and the results are written by the source's second kernel)."""

    source: str
    pointers: tuple[int, ...]
    scalars: tuple[int, ...]
    writes: tuple[int, ...]
    grid: tuple[int, ...]
    blocks: tuple[tuple[str, int], ...]
    split: Split | None = None
    num_warps: int = NUM_WARPS


def generate(region: Region, graph: OperationGraph, library: dict[str, str], multiprocessors: int) -> GeneratedKernel:
    """The kernel of ``region``. ``library`` maps ``math`` and ``activation`` to the modules of the
    shared Triton pieces the source imports; ``multiprocessors`` is the GPU's count, which a
    reduction whose kept elements give fewer programs splits its reduced dims to fill
    (``reduction_split``).

    Raises:
        NotSupported: a tensor of a type the kernel cannot read or write (fp8), naming it.
    """
    return _Writer(region, graph, library, multiprocessors).kernel()


def reduction_split(keep_programs: int, reduce_steps: int, multiprocessors: int) -> tuple[int, int]:
    """(slices, loop steps per slice) of the reduced dims for a reduction whose kept elements give
    ``keep_programs`` programs, each looping ``reduce_steps`` times: none (1 slice) when they fill
    the ``multiprocessors`` already; else enough slices for PROGRAMS_PER_MULTIPROCESSOR programs on
    each, every slice at least one loop step (a program reduces at least BLOCK_REDUCE elements of
    each of its kept elements) and all but the last of equal length."""
    if keep_programs >= multiprocessors:
        return 1, reduce_steps
    wanted = -(-multiprocessors * PROGRAMS_PER_MULTIPROCESSOR // keep_programs)
    slice_steps = -(-reduce_steps // min(wanted, reduce_steps))
    return -(-reduce_steps // slice_steps), slice_steps


class _Writer:
    def __init__(self, region: Region, graph: OperationGraph, library: dict[str, str], multiprocessors: int) -> None:
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
        self.keep_count = math.prod(self.space[d] for d in self.kept)
        self.reduce_count = math.prod(self.space[d] for d in self.reduced)
        self.split: Split | None = None
        if not self.reducing:
            block = min(_power_of_two(self.keep_count), POINTWISE_BLOCK)
            self.blocks: tuple[tuple[str, int], ...] = (("BLOCK", block),)
            self.grid: tuple[int, ...] = (-(-self.keep_count // block),)
            return
        block_reduce = min(_power_of_two(self.reduce_count), REDUCE_BLOCK)
        block_keep = min(_power_of_two(self.keep_count), max(1, TILE // block_reduce))
        self.blocks = (("BLOCK_KEEP", block_keep), ("BLOCK_REDUCE", block_reduce))
        keep_programs = -(-self.keep_count // block_keep)
        self.block_reduce = block_reduce
        count, slice_steps = reduction_split(keep_programs, -(-self.reduce_count // block_reduce), multiprocessors)
        self.grid = (keep_programs, count)
        if count > 1:
            dtype = DataType.DOUBLE if self.compute == "tl.float64" else DataType.FLOAT
            partials = TensorDescriptor(dtype, (len(self.results) * count * self.keep_count,), (1,))
            combine_block = min(_power_of_two(self.keep_count), COMBINE_BLOCK)
            combine_grid = -(-self.keep_count // combine_block)
            self.split = Split(count, slice_steps, partials, tuple(self.results), combine_grid, combine_block)

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
        by_pointer = [uid for uid in self.reads if not self.graph.tensors[uid].by_value]
        pointers = by_pointer + self.stores + ([] if self.split else self.results)
        scalars = [uid for uid in self.reads if self.graph.tensors[uid].by_value]
        parameters = [f"{self.names[u]}_ptr" for u in pointers] + ["partials_ptr"] * (self.split is not None)
        parameters += [f"{self.names[u]}_value: tl.float64" for u in scalars]
        parameters += [f"{name}: tl.constexpr" for name, _ in self.blocks]
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
        if self.split:
            lines += ["", "", *self._combine_kernel()]
        writes = tuple(self.stores + self.results)
        return GeneratedKernel(
            "\n".join(lines) + "\n", tuple(pointers), tuple(scalars), writes, self.grid, self.blocks, self.split
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
        if self.split:
            walk += (
                f" split into {self.split.count} slices of {self.split.slice_steps} steps by program, whose "
                "partial results combine_partials combines in slice order"
            )
        return [
            f'"""Fused kernel of graph \'{graph.name}\': {nodes}.',
            "",
            f"Iteration space {shape} ({math.prod(self.space)} elements), {walk} (the last dim fastest);",
            f"compute in {self.compute}.",
            f"Reads {reads}.",
            f"Writes {writes}.",
            f"Memory traffic: {moved} bytes, each tensor read or written once"
            + (
                f", and {self.split.partials.size_in_bytes} bytes of partial results written and read."
                if self.split
                else "."
            ),
            '"""',
            "",
            "import triton",
            "import triton.language as tl",
            "",
            f"import {self.library['math']} as tm",
            f"from {self.library['activation']} import activation, activation_derivative",
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
        lines = [f"index = {self._program(0)} * BLOCK + tl.arange(0, BLOCK)", f"mask = index < {count}"]
        lines += self._unravel("index", self.kept, "i")
        lines += self._loads(self.reads, lambda d: f"i{d}", lambda dims: "mask")
        lines += self._nodes()
        for uid in self.stores:
            offsets = self._offsets(self.graph.tensors[uid].desc, lambda d: f"i{d}") or "0 * index"
            lines.append(self._store(uid, self.names[uid], offsets, "mask"))
        return lines

    def _reduction_body(self) -> list[str]:
        keep_count, reduce_count, split = self.keep_count, self.reduce_count, self.split
        lines = [
            f"keep = {self._program(0)} * BLOCK_KEEP + tl.arange(0, BLOCK_KEEP)",
            f"keep_mask = keep < {keep_count}",
        ]
        lines += self._unravel("keep", self.kept, "k")
        accumulators = self._accumulators()
        lines += [
            f"{acc} = tl.full([BLOCK_KEEP, BLOCK_REDUCE], {reduction.initial}, {self.compute})"
            for acc, reduction, _, _ in accumulators
        ]
        start = "tl.arange(0, BLOCK_REDUCE).to(tl.int64)" if self.wide else "tl.arange(0, BLOCK_REDUCE)"
        first = "" if split is None else "slice_start + "
        loop = [
            f"red = {first}start + {start}",
            f"red_mask = red < {reduce_count}",
            "mask = keep_mask[:, None] & red_mask[None, :]",
        ]
        loop += self._unravel("red", self.reduced, "r")
        invariant = [uid for uid in self.reads if not self._varies(uid)]
        lines[2 + len(self.kept) : 2 + len(self.kept)] = self._loads(invariant, self._tile_index, self._tile_mask)
        loop += self._loads([uid for uid in self.reads if self._varies(uid)], self._tile_index, self._tile_mask)
        loop += self._nodes()
        for uid in self.stores:
            offsets = self._offsets(self.graph.tensors[uid].desc, self._tile_index)
            loop.append(self._store(uid, self.names[uid], offsets, "mask"))
        for acc, reduction, value, _ in accumulators:
            masked = f"tl.where(mask, {reduction.term.format(v=value)}, {reduction.initial})"
            loop.append(f"{acc} = {ACCUMULATE[reduction.combine].format(acc=acc, t=masked)}")
        length = reduce_count
        if split is not None:  # a fixed number of steps: the last slice's steps past the end load nothing
            length = split.slice_steps * self.block_reduce
            lines += [f"split = {self._program(1)}", f"slice_start = split * {length}"]
        lines += [f"for start in range(0, {length}, BLOCK_REDUCE):", *("    " + line for line in loop)]
        for position, (acc, reduction, _, uid) in enumerate(accumulators):
            total = (
                f"tl.sum({acc}, axis=1)" if reduction.combine == "sum" else f"tl.reduce({acc}, 1, {reduction.combine})"
            )
            if split is None:
                lines += self._result(uid, reduction, total)
            else:
                lines.append(f"tl.store(partials_ptr + {self._partials_offsets(position)}, {total}, mask=keep_mask)")
        return lines

    def _combine_kernel(self) -> list[str]:
        """The second pass of a split reduction: each kept element's partial results combined in
        slice order (a fixed order: the results are the same bits at every run), finished and stored."""
        split = self.split
        assert split is not None
        parameters = ", ".join(["partials_ptr", *(f"{self.names[u]}_ptr" for u in self.results), "BLOCK: tl.constexpr"])
        body = [f"keep = {self._program(0)} * BLOCK + tl.arange(0, BLOCK)", f"keep_mask = keep < {self.keep_count}"]
        body += self._unravel("keep", self.kept, "k")
        for position, (acc, reduction, _, uid) in enumerate(self._accumulators()):
            partial = f"tl.load(partials_ptr + {self._partials_offsets(position)}, mask=keep_mask)"
            body += [
                f"{acc} = tl.full([BLOCK], {reduction.initial}, {self.compute})",
                f"for split in range(0, {split.count}):",
                f"    {acc} = {ACCUMULATE[reduction.combine].format(acc=acc, t=partial)}",
                *self._result(uid, reduction, acc),
            ]
        body = _without_unused_indices(body)
        return ["@triton.jit", f"def combine_partials({parameters}):", *("    " + line for line in body)]

    def _partials_offsets(self, position: int) -> str:
        """Where the kept elements' partial results of accumulator ``position`` over slice ``split``
        lie: row (accumulator, slice) of the partials, a row per slice of each accumulator."""
        assert self.split is not None
        first = position * self.split.count * self.keep_count
        return f"({first} + split * {self.keep_count} + keep)" if first else f"(split * {self.keep_count} + keep)"

    def _result(self, uid: int, reduction: Reduction, total: str) -> list[str]:
        """The lines that finish a reduction's total over the kept elements and store it."""
        result = self.names[uid]
        offsets = self._offsets(self.graph.tensors[uid].desc, lambda d: f"k{d}") or "0 * keep"
        return [
            f"{result} = {reduction.finish.format(r=total, count=f'{self.reduce_count}.0')}",
            self._store(uid, result, offsets, "keep_mask"),
        ]

    def _program(self, axis: int) -> str:
        return f"tl.program_id({axis}).to(tl.int64)" if self.wide else f"tl.program_id({axis})"

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
            lines.append(f"{output} = {pointwise_expression(node, operands)}  # {node.name}")
        return lines

    def _store(self, uid: int, value: str, offsets: str, mask: str) -> str:
        dtype = self.graph.tensors[uid].desc.dtype
        converted = f"({value} != 0)" if dtype is DataType.BOOLEAN else f"{value}.to({TRITON_TYPES[dtype]})"
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
