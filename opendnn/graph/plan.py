"""An execution plan: the steps an engine chose for an operation graph, the workspace they share,
and ``execute``, which binds the caller's tensors and runs the steps in order.

Three kinds of step: a ``NodeCall`` (one node through its cuDNN-shaped call), an ``EpilogueCall``
(a convolution or matmul with the chain after it in the call's fused epilogue) and a
``FusedKernel`` (a region as one generated Triton kernel). A plan refers to tensors by uid only, so
one plan serves every graph with the same key (a graph rebuilt or deserialized).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import opendnn as od
from opendnn.core.arrays import (
    Bound,
    as_native,
    bind,
    bind_bytes,
    descriptor_of,
    device_of,
    redescribed,
    strided_view,
    torch_view,
)
from opendnn.core.descriptors import NanPropagation, TensorDescriptor
from opendnn.core.errors import BadParam, Status
from opendnn.core.handle import Handle
from opendnn.graph.calls import (
    NodeCall,
    conv_algorithm,
    conv_descriptor,
    naming,
    optional_view,
    run_recorded,
    scalar_bound,
)
from opendnn.graph.codegen import GeneratedKernel, generate
from opendnn.graph.fusion import Epilogue, Region, saved_bytes
from opendnn.graph.memory import Binding, aligned, check_outputs_apart, in_place_inputs, typed_view
from opendnn.graph.operation_graph import NodeSpec, OperationGraph
from opendnn.graph.operations import slice_index

WORKSPACE_QUERY = "Graph.get_workspace_size()"


class Step(Protocol):
    reads: tuple[int, ...]
    writes: tuple[int, ...]
    scratch_bytes: int

    def run(self, binding: Binding, handle: Handle) -> None: ...

    def describe(self) -> str: ...


class EpilogueCall:
    """A conv_fprop or matmul whose fused epilogue computes the chain of pointwise nodes after it."""

    def __init__(self, epilogue: Epilogue, graph: OperationGraph, handle: Handle) -> None:
        self.epilogue = epilogue
        anchor = epilogue.anchor
        self.operands = tuple(uid for _, uid in anchor.inputs)
        extras = tuple(uid for uid in (epilogue.bias, epilogue.residual) if uid is not None)
        self.reads: tuple[int, ...] = self.operands + extras
        self.writes: tuple[int, ...] = (epilogue.output,)
        self.saved = saved_bytes(epilogue, graph)
        descs = {role: graph.tensors[uid].desc for role, uid in anchor.inputs}
        # the output and the residual as the call sees them: in the anchor's dims, past any reshape
        self.output = output = epilogue.in_anchor_dims(graph.tensors[epilogue.output].desc, graph)
        self.bias = None if epilogue.bias is None else graph.tensors[epilogue.bias].desc
        self.residual = (
            None if epilogue.residual is None else epilogue.in_anchor_dims(graph.tensors[epilogue.residual].desc, graph)
        )
        self.scratch_bytes = 0
        self.activation = None
        if anchor.op == "conv_fprop":
            with naming(anchor):
                if epilogue.activation is not None:
                    mode, coef = epilogue.activation
                    self.activation = od.ActivationDescriptor(
                        od.ActivationMode(mode.value[:-4]), NanPropagation.PROPAGATE_NAN, coef
                    )
                self.conv = conv_descriptor(anchor, descs)
                self.algorithm = conv_algorithm(anchor, {**descs, "y": output}, handle)
                self.scratch_bytes = od.get_convolution_forward_workspace_size(
                    handle, descs["image"], descs["weight"], self.conv, output, self.algorithm
                )

    def run(self, binding: Binding, handle: Handle) -> None:
        epilogue, bounds, scratch = self.epilogue, binding.bounds, binding.scratch
        a, b, y = (bounds[uid] for uid in (*self.operands, epilogue.output))
        bias = None if epilogue.bias is None else bounds[epilogue.bias]
        residual = None if epilogue.residual is None else bounds[epilogue.residual]
        assert a is not None and b is not None and y is not None
        # the output and the residual in the anchor's dims (past a reshape, views of the caller's)
        y = redescribed(y, self.output)
        if residual is not None and self.residual is not None:
            residual = redescribed(residual, self.residual)
        with naming(epilogue.anchor):
            run_recorded(self, binding, handle, lambda: self._call(handle, a, b, y, bias, residual, scratch))

    def _call(
        self, handle: Handle, a: Bound, b: Bound, y: Bound, bias: Bound | None, residual: Bound | None, scratch: Any
    ) -> None:
        epilogue = self.epilogue
        if epilogue.anchor.op == "conv_fprop":
            od.convolution_bias_activation_forward(
                handle,
                epilogue.scale,
                a.desc,
                a.view,
                b.desc,
                b.view,
                self.conv,
                self.algorithm,
                scratch,
                1.0,
                self.residual,
                optional_view(residual),
                self.bias,
                optional_view(bias),
                self.activation,
                y.desc,
                y.view,
            )
        else:
            od.matmul(
                handle,
                1.0,
                a.desc,
                a.view,
                b.desc,
                b.view,
                0.0,
                y.desc,
                y.view,
                self._matmul_epilogue(bias, residual),
            )

    def _matmul_epilogue(self, bias: Bound | None, residual: Bound | None) -> od.MatmulEpilogue:
        epilogue = self.epilogue
        bias_desc = bias_view = None
        if bias is not None:
            along = -1 if epilogue.bias_axis == "column" else -2
            bias_desc = TensorDescriptor(bias.desc.dtype, (bias.desc.dims[along],), (bias.desc.strides[along],))
            bias_view = strided_view(bias.view, bias_desc)
        mode, coef = epilogue.activation if epilogue.activation is not None else (None, 0.0)
        return od.MatmulEpilogue(
            bias_desc=bias_desc,
            bias=bias_view,
            bias_axis=od.BiasAxis(epilogue.bias_axis),
            activation=mode,
            coef=coef,
            residual_desc=self.residual,
            residual=optional_view(residual),
            a_scale=epilogue.scale,
        )

    def describe(self) -> str:
        slots = ", ".join(self.epilogue.filled)
        nodes = ", ".join(n.name for n in self.epilogue.chain)
        return f"{self.epilogue.anchor.label} with {nodes} in its fused epilogue ({slots}); saves {self.saved} bytes"


class FusedKernel:
    """A region as one generated kernel (``compile`` loads it)."""

    def __init__(self, region: Region, graph: OperationGraph, library: dict[str, str]) -> None:
        self.region = region
        self.generated: GeneratedKernel = generate(region, graph, library)
        self.writes = self.generated.writes
        self.reads = tuple(u for u in (*self.generated.pointers, *self.generated.scalars) if u not in self.writes)
        self.scratch_bytes = 0
        self.saved = saved_bytes(region, graph)
        self.names = tuple((f"t{uid}", uid) for uid in self.generated.pointers)
        self.constants = tuple(graph.tensors[uid].value for uid in self.generated.scalars)
        self.launch: Any = None

    def compile(self) -> None:
        from opendnn.graph.kernel_library import Launch, Slot, load_kernel

        kernel = load_kernel(self.generated.source)
        values = tuple(0.0 if v is None else v for v in self.constants)
        arguments = (*(Slot(name) for name, _ in self.names), *values)
        self.launch = Launch(
            kernel,
            (self.generated.grid,),
            arguments,
            {**dict(self.generated.blocks), "num_warps": self.generated.num_warps},
        )

    def run(self, binding: Binding, handle: Handle) -> None:
        kept = binding.launch_tensors.get(self)  # the launch tensors, or the launch bound to them
        if kept is not None and kept.__class__ is not dict:  # a BoundLaunch: every argument bound
            with handle.launching():
                kept()
            return
        tensors = kept if kept is not None else self._tensors(binding.bounds, handle)
        launch = self.launch
        if None in self.constants:  # scalars given at execute time: this call's arguments
            given = binding.arrays
            values = [
                v if v is not None else float(given[uid]) for v, uid in zip(self.constants, self.generated.scalars)
            ]
            launch = dataclasses.replace(
                launch, args=(*launch.args[: len(self.names)], *values), compiled=launch.compiled
            )
        with handle.launching():
            launch(tensors)
        binding.launch_tensors[self] = launch.bound(tensors) or tensors

    def _tensors(self, bounds: Sequence[Bound | None], handle: Handle) -> dict[str, Any]:
        """The launch's tensors by slot name, each checked to be on the handle's device."""
        tensors = {}
        for name, uid in self.names:
            bound = bounds[uid]
            assert bound is not None
            if bound.device != handle.device:
                handle.check_device(bound.name, bound.device)
            tensors[name] = torch_view(bound)
        return tensors

    def describe(self) -> str:
        nodes = ", ".join(n.name for n in self.region.nodes)
        return f"one generated kernel for {nodes}; saves {self.saved} bytes"


class ExecutionPlan:
    """An engine's steps for an operation graph and the workspace they need.

    Workspace layout: each virtual tensor that two steps exchange (aligned; a slice's or a reshape's
    output is a view of its input, not a region of its own), then the scratch the steps share, as large as the
    largest step's.
    """

    def __init__(self, engine: str, graph: OperationGraph, steps: Sequence[Step], backend: str) -> None:
        self.engine, self.graph, self.steps, self.backend = engine, graph, tuple(steps), backend
        # a slice's or a reshape's output is a view of its input's memory, bound with it (in topological
        # order): (its uid, its input's, the view of the input's array)
        # (a reshape inside a matmul's epilogue is the call's view of its output, bound by the call)
        inside = {id(node) for step in steps if isinstance(step, EpilogueCall) for node in step.epilogue.chain}
        self.views = tuple(
            (node.outputs[0][1], node.inputs[0][1], _view(node, graph))
            for node in graph.nodes
            if node.op in VIEWS and id(node) not in inside
        )
        viewed = {uid for uid, _, _ in self.views}
        exchanged = sorted(
            {uid for step in steps for uid in (*step.reads, *step.writes) if graph.tensors[uid].virtual} - viewed
        )
        self.intermediates: list[tuple[int, TensorDescriptor, int]] = []
        offset = 0
        for uid in exchanged:
            desc = graph.tensors[uid].desc
            self.intermediates.append((uid, desc, offset))
            offset += aligned(desc.size_in_bytes)
        self.scratch_offset = offset
        self.workspace_size = offset + max((step.scratch_bytes for step in steps), default=0)
        self.bound = tuple(
            (t.uid, t.name, t.desc, t.uid in graph.producer)
            for t in graph.tensors
            if t.bound_by_caller and not t.by_value
        )
        self.in_place = in_place_inputs(graph)
        called = {uid for step in steps if isinstance(step, NodeCall) for uid in step.reads}
        # scalars a call reads as one-element tensors (a generated kernel takes them as arguments)
        self.scalars = tuple((t.uid, t.desc.dtype, t.value) for t in graph.tensors if t.by_value and t.uid in called)
        self.empty: tuple[Bound | None, ...] = (None,) * len(graph.tensors)
        self._handles: dict[int, tuple[Handle, Handle]] = {}
        self._kinds: tuple[Any, tuple[Any, ...]] | None = None

    def compile(self) -> None:
        """Load the generated kernels (once; a plan cached on a handle keeps them)."""
        for step in self.steps:
            if isinstance(step, FusedKernel) and step.launch is None:
                step.compile()

    def execute(self, arrays: Sequence[Any], workspace: Any, handle: Handle, kept: Binding | None = None) -> Binding:
        """Run the plan over ``arrays`` (the caller's tensor, or a scalar's value, by uid).

        ``kept`` is the binding an earlier call returned: when this call gives the very same array
        objects, workspace and handle, it is used as it is, with no check (an array's contents may
        change between calls, not its shape, strides or memory: a tensor changed by ``set_`` or
        ``.data =`` in place must come as a new object).

        Returns:
            the binding of this call, for the next.

        Raises:
            BadParam: a tensor of the wrong type or past its buffer, on another device, a workspace
                missing, too small or misaligned.
        """
        if (
            kept is None
            or kept.handle is not handle
            or kept.workspace is not workspace
            or not all(map(operator.is_, arrays, kept.arrays))
        ):
            kept = Binding(handle, workspace, *self._bind(arrays, workspace))
        engine_handle = self.handle_for(handle)
        for step in self.steps:
            step.run(kept, engine_handle)
        return kept

    def _bind(self, arrays: Sequence[Any], workspace: Any) -> tuple[list[Bound | None], Sequence[Any], Any]:
        """Each tensor's Bound by uid (the caller's arrays checked, the crossing tensors carved out of
        the workspace, the scalars a call reads as tensors), the arrays, and the steps' scratch."""
        bounds = list(self.empty)
        tensor_class, torch_types = self._torch_kinds()
        for (uid, name, desc, written), torch_type in zip(self.bound, torch_types):
            array = arrays[uid]
            if (
                array.__class__ is tensor_class
                and array.dtype is torch_type
                and array.shape == desc.dims
                and array.stride() == desc.strides
            ):  # bind's checks, cut to what a torch tensor needs
                bounds[uid] = Bound(name, desc, array, device_of(array))
            else:
                bounds[uid] = self._bind_array(uid, name, desc, array, written)
        check_outputs_apart(bounds, self.bound, self.in_place)
        like = bounds[self.bound[0][0]]  # a graph has an output, so the pack has a tensor
        assert like is not None
        work = bind_bytes("workspace", workspace, self.workspace_size, WORKSPACE_QUERY)
        if work is not None:
            for uid, desc, offset in self.intermediates:
                bounds[uid] = Bound(
                    self.graph.tensors[uid].name, desc, typed_view(work.view, offset, desc), work.device
                )
        for uid, source, view in self.views:
            base = bounds[source]
            assert base is not None
            tensor = self.graph.tensors[uid]
            # on the Triton engines a view of a NumPy array is a view of its input's torch tensor: the views
            # of one input then share its storage, which Triton's interpreter copies to the host and back
            # once per address (two storages of one address and unequal sizes fail its copy back)
            source_view = base.view if self.backend == "numpy" else torch_view(base)
            bounds[uid] = Bound(tensor.name, tensor.desc, view(source_view), base.device)
        for uid, dtype, value in self.scalars:
            bounds[uid] = scalar_bound(arrays[uid] if value is None else value, dtype, like)
        return bounds, arrays, None if work is None else work.view[self.scratch_offset :]

    def _bind_array(self, uid: int, name: str, desc: TensorDescriptor, array: Any, written: bool) -> Bound:
        """``bind``, with the checks and messages of a variant pack: an array of another data type,
        or of several dims whose dims or strides (of the dims above 1) are not its tensor's, is
        refused naming the pack's key, the tensor and its node (its memory would be read or written
        in the tensor's layout, not in its own). A one-dimensional dense array is memory, as a
        pointer in cudnn-frontend's pack: the tensor's dims and strides lay it out, and ``bind``
        checks it holds them."""
        key = f"variant_pack['{name}']"
        own = descriptor_of(as_native(array, key), key)
        position = self.graph.producer.get(uid, next(iter(self.graph.consumers[uid]), None))
        tensor = f"tensor '{name}'" + ("" if position is None else f" of {self.graph.nodes[position].label}")
        if own.dtype is not desc.dtype:
            raise BadParam(f"{key} has data type {own.dtype.name}, but {tensor} is {desc.dtype.name}")
        dense_memory = own.ndim == 1 and own.strides[0] == 1
        matches = own.dims == desc.dims and all(
            a == b for d, a, b in zip(desc.dims, own.strides, desc.strides) if d > 1
        )
        if not (dense_memory or matches):
            raise BadParam(
                f"{key} has dims {list(own.dims)} and strides {list(own.strides)}, but {tensor} has dims "
                f"{list(desc.dims)} and strides {list(desc.strides)}: give a view of those (or set the "
                "tensor's strides with set_stride)",
                Status.BAD_PARAM_SHAPE_MISMATCH,
            )
        try:
            return bind(name, desc, array, output=written)
        except BadParam as error:
            raise BadParam(f"{key} for {tensor}: {error}", error.status) from None

    def _torch_kinds(self) -> tuple[Any, tuple[Any, ...]]:
        """(torch.Tensor, the torch dtype of each bound tensor) on the Triton backend, which runs on
        torch tensors; nothing on the NumPy backend, which needs no torch."""
        if self._kinds is None:
            if self.backend == "numpy":
                self._kinds = (None, (None,) * len(self.bound))
            else:
                import torch

                self._kinds = (torch.Tensor, tuple(desc.dtype.to_torch() for _, _, desc, _ in self.bound))
        return self._kinds

    def handle_for(self, handle: Handle) -> Handle:
        """``handle``, or one of its device, stream and policies on the plan's backend."""
        if handle.backend == self.backend:
            return handle
        kept = self._handles.get(id(handle))
        if kept is None or kept[0] is not handle:
            derived = Handle(
                handle.device,
                backend=self.backend,
                math_type=handle.math_type,
                deterministic=handle.deterministic,
                workspace_limit=handle.workspace_limit,
            )
            kept = self._handles[id(handle)] = (handle, derived)
        if handle.device != "cpu":
            kept[1].set_stream(handle.get_stream())
        return kept[1]

    def source(self) -> str:
        """The generated kernels' sources, in the order they run ("" when the plan generates none)."""
        return "\n\n".join(s.generated.source for s in self.steps if isinstance(s, FusedKernel))

    def describe(self) -> str:
        """The plan in words: its engine, workspace and each step."""
        lines = [f"engine '{self.engine}' on backend '{self.backend}', workspace {self.workspace_size} bytes"]
        lines += [f"  {k}. {step.describe()}" for k, step in enumerate(self.steps, 1)]
        return "\n".join(lines)

    @property
    def saved_bytes(self) -> int:
        """Bytes of memory traffic the plan's fusion saves against one call per node."""
        return sum(getattr(step, "saved", 0) for step in self.steps)


__all__ = ["EpilogueCall", "ExecutionPlan", "FusedKernel", "NodeCall", "Step"]


VIEWS = ("slice", "reshape")  # the operations whose output is a view of their input's memory


def _view(node: NodeSpec, graph: OperationGraph) -> Callable[[Any], Any]:
    """How a view node's output is taken from its input's array: a slice indexes it, a reshape reads
    its memory in the output's dims and strides."""
    if node.op == "slice":
        return operator.itemgetter(slice_index(dict(node.attributes)))
    return functools.partial(strided_view, desc=graph.tensors[node.outputs[0][1]].desc)
