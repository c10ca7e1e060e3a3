"""Running one node through opendnn's cuDNN-shaped calls: the reference engine runs every node this
way on the NumPy backend, the other engines run the nodes they do not fuse this way on Triton.

A ``NodeCall`` is a step of a plan. Made at plan time, it asks the backend for the scratch bytes
the call needs (a convolution's or reduction's workspace; the squares genstats sums). The tensors
that one cuDNN descriptor describes together (batch norm's parameters and statistics, a
normalization's scale and bias) reach the call in one layout, packed: a graph tensor of other
strides is staged in a packed copy in scratch, copied in before the call (an input) or out after
it (an output). At run time it reads its tensors' ``Bound`` views by uid and writes its outputs in
place (``alpha = 1``, ``beta = 0``).

A call's descriptors, checks and planning cost tens of microseconds of host time a run, where its
launches cost a few. On a Triton handle the first run of a step for a binding is therefore recorded
(``run_recorded``): its launches with their tensors, and the host steps each launch needs again (a
TMA kernel's descriptor scratch). Later executes with the same binding (the same arrays, workspace
and handle: the same memory) replay those launches and skip the call. A call that does anything
else on the host (a copy, a fill, a tensor made from values) runs in full every time.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import opendnn as od
from opendnn.core.arrays import Bound, constant_like, redescribed
from opendnn.core.descriptors import NanPropagation, TensorDescriptor, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.core.errors import NotSupported, OpenDnnError, Status
from opendnn.core.handle import Handle
from opendnn.core.recording import SCOPE, recording
from opendnn.families.attention.problem import SLOTS as ATTENTION_SLOTS
from opendnn.families.attention.problem import attention_problem
from opendnn.families.convolution.algorithms import default_algorithm
from opendnn.families.convolution.api import allows_tf32
from opendnn.families.convolution.problem import ConvolutionDirection, convolution_problem
from opendnn.graph.memory import Binding, aligned, typed_view
from opendnn.graph.operation_graph import NodeSpec, OperationGraph
from opendnn.graph.operations import (
    GRAPH_NAMES,
    POINTWISE_ROLES,
    ROLE_OF_SLOT,
    attention_descriptor,
    attention_slot_descriptor,
    compute_type,
    concatenated,
)

RELU_MODES = (
    od.PointwiseMode.RELU_FWD,
    od.PointwiseMode.RELU_BWD,
    od.PointwiseMode.CLIPPED_RELU_FWD,
    od.PointwiseMode.CLIPPED_RELU_BWD,
)
NORM_MODES = {
    "layernorm": od.NormMode.LAYER_NORM,
    "rmsnorm": od.NormMode.RMS_NORM,
    "instancenorm": od.NormMode.INSTANCE_NORM,
    "groupnorm": od.NormMode.GROUP_NORM,
}
BN_BACKWARD_EPSILON = 1e-5  # read only when the saved statistics are absent: the graph always gives them
Tensors = Callable[[str], Any]  # role -> Bound (None for an absent optional input)


class NodeCall:
    """One node run by its cuDNN-shaped call on the plan's backend."""

    def __init__(self, node: NodeSpec, graph: OperationGraph, handle: Handle) -> None:
        self.node = node
        self.roles = {role: uid for role, uid in (*node.inputs, *node.outputs)}
        self.reads = tuple(uid for _, uid in node.inputs)
        self.writes = tuple(uid for _, uid in node.outputs)
        self.descs = {role: graph.tensors[uid].desc for role, uid in self.roles.items()}
        self._run, scratch = RUNNERS[node.op]
        self.staged = _staged_roles(node, self.descs)
        self.staging_bytes = sum(aligned(desc.size_in_bytes) for _, desc in self.staged.values())
        with naming(node):
            call_descs = {**self.descs, **{role: desc for role, (_, desc) in self.staged.items()}}
            self.scratch_bytes = self.staging_bytes + scratch(node, call_descs, handle)

    def run(self, binding: Binding, handle: Handle) -> None:
        bounds = binding.bounds

        def tensor(role: str) -> Any:
            uid = self.roles.get(role)
            return None if uid is None else bounds[uid]

        call = (
            self._staged_call(binding, handle, tensor)
            if self.staged
            else lambda: self._run(self.node, tensor, handle, binding.scratch)
        )
        with naming(self.node):
            run_recorded(self, binding, handle, call)

    def _staged_call(self, binding: Binding, handle: Handle, tensor: Tensors) -> Callable[[], None]:
        """The call with its staged roles read from and written to their packed copies in scratch."""

        def call() -> None:
            scratch = binding.scratch
            copies = {
                role: Bound(role, desc, typed_view(scratch, offset, desc), tensor(role).device)
                for role, (offset, desc) in self.staged.items()
            }
            for role, _ in self.node.inputs:
                if role in copies:
                    source, copy = tensor(role), copies[role]
                    od.transform_tensor(handle, 1.0, source.desc, source.view, 0.0, copy.desc, copy.view)
            self._run(self.node, lambda role: copies.get(role) or tensor(role), handle, scratch[self.staging_bytes :])
            for role, _ in self.node.outputs:
                if role in copies:
                    target, copy = tensor(role), copies[role]
                    od.transform_tensor(handle, 1.0, copy.desc, copy.view, 0.0, target.desc, target.view)

        return call

    def describe(self) -> str:
        if self._run is run_view:
            return f"{self.node.label} as a view of its input's memory (no launch)"
        return f"{self.node.label} as its own call"


class Replay:
    """A step's recorded launches, each bound to the tensors it took (``Launch.bound``; under the
    interpreter the launch with its tensors), and the host steps that precede them."""

    def __init__(self, launches: list[tuple[Any, dict[str, Any]]], repeats: list[Callable[[], None]]) -> None:
        self.launches = [launch.bound(tensors) or functools.partial(launch, tensors) for launch, tensors in launches]
        self.repeats = repeats

    def __call__(self, handle: Handle) -> None:
        with handle.launching():
            for step in self.repeats:
                step()
            for launch in self.launches:
                launch()


FULL_PATH = "full path"  # a binding's mark on a step whose calls cannot be replayed


def run_recorded(step: object, binding: Binding, handle: Handle, call: Callable[[], None]) -> None:
    """``call`` (the step's cuDNN-shaped calls over ``binding``), replayed where it can be (module
    docstring): the first run of ``step`` for ``binding`` on a Triton handle is recorded, unless
    an outer recording is running (a recorded torch call that executes the plan keeps the launches
    itself)."""
    replay = binding.launch_tensors.get(step)
    if replay.__class__ is Replay:
        replay(handle)
        return
    if replay is not None or handle.backend != "triton" or SCOPE.recorder is not None:
        call()
        return
    from opendnn.torch.executables import Recording

    with Recording() as recorder, recording(recorder):
        call()
    replayable = recorder.refusal is None and not recorder.made and recorder.launches
    binding.launch_tensors[step] = Replay(recorder.launches, recorder.repeats) if replayable else FULL_PATH


@contextlib.contextmanager
def naming(node: NodeSpec) -> Iterator[None]:
    """An error of the node's call, re-raised with the node's name in front (every graph error names it)."""
    try:
        yield
    except OpenDnnError as error:
        raise type(error)(f"{node.label}: {error}", error.status) from None


def _staged_roles(node: NodeSpec, descs: Mapping[str, TensorDescriptor]) -> dict[str, tuple[int, TensorDescriptor]]:
    """The node's tensors that one cuDNN descriptor describes together and that are not packed in
    their group's type (the first present role's): per role, its packed copy's scratch offset and
    descriptor. Only the strides of dims above 1 tell layouts apart."""
    groups: tuple[tuple[str, ...], ...] = ()
    if node.op.startswith("batchnorm"):
        groups = (
            (
                "scale",
                "bias",
                "in_running_mean",
                "in_running_var",
                "mean",
                "inv_variance",
                "next_running_mean",
                "next_running_var",
                "dscale",
                "dbias",
            ),
        )
    elif node.op in NORM_MODES or node.op.removesuffix("_backward") in NORM_MODES:
        groups = (("scale", "bias", "dscale", "dbias"), ("mean", "inv_variance"))
    staged, offset = {}, 0
    for group in groups:
        present = [role for role in group if role in descs]
        if not present:
            continue
        first = descs[present[0]]
        packed = TensorDescriptor(first.dtype, first.dims, packed_strides(first.dims))
        for role in present:
            if _layout(descs[role]) != _layout(packed):
                staged[role] = offset, packed
                offset += aligned(packed.size_in_bytes)
    return staged


def _layout(desc: TensorDescriptor) -> tuple[Any, ...]:
    return desc.dtype, desc.dims, tuple(s for d, s in zip(desc.dims, desc.strides) if d > 1)


def no_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    return 0


def ranked(bound: Bound, ndim: int) -> Bound:
    """``bound`` with leading dims of 1 up to ``ndim`` dims (NumPy's broadcast, as a view)."""
    if bound.desc.ndim == ndim:
        return bound
    extra = ndim - bound.desc.ndim
    return redescribed(
        bound, TensorDescriptor(bound.desc.dtype, (1,) * extra + bound.desc.dims, (0,) * extra + bound.desc.strides)
    )


# ---- pointwise, reduction, genstats -------------------------------------------------------------------


def run_pointwise(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    mode = od.PointwiseMode(node.attribute("mode"))
    y = tensor("y")
    inputs = [ranked(tensor(role), y.desc.ndim) for role in POINTWISE_ROLES[: mode.arity]]
    od.pointwise(
        handle,
        mode,
        1.0,
        [(b.desc, b.view) for b in inputs],
        0.0,
        y.desc,
        y.view,
        coef=node.attribute("coef", 0.0),
        propagate_nan=mode in RELU_MODES,
    )


def reduce_descriptor(op: od.ReduceTensorOp, x: TensorDescriptor) -> od.ReduceTensorDescriptor:
    return od.ReduceTensorDescriptor(op, compute_type(x.dtype), NanPropagation.PROPAGATE_NAN)


def reduction_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    reduce_desc = reduce_descriptor(od.ReduceTensorOp(node.attribute("mode")), descs["x"])
    return od.get_reduction_workspace_size(handle, reduce_desc, descs["x"], descs["y"])


def run_reduction(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y = tensor("x"), tensor("y")
    reduce_desc = reduce_descriptor(od.ReduceTensorOp(node.attribute("mode")), x.desc)
    od.reduce_tensor(handle, reduce_desc, None, scratch, 1.0, x.desc, x.view, 0.0, y.desc, y.view)


def squares_descriptor(x: TensorDescriptor) -> TensorDescriptor:
    return TensorDescriptor(compute_type(x.dtype), x.dims, packed_strides(x.dims))


def genstats_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    x, squares, total = descs["x"], squares_descriptor(descs["x"]), descs["sum"]
    add = reduce_descriptor(od.ReduceTensorOp.ADD, x)
    reduce_bytes = max(
        od.get_reduction_workspace_size(handle, add, x, total),
        od.get_reduction_workspace_size(handle, add, squares, total),
    )
    return aligned(squares.size_in_bytes) + reduce_bytes


def run_genstats(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    """The sum by a reduction of x, the sum of squares by a reduction of x * x (in scratch)."""
    x, total, sum_of_squares = tensor("x"), tensor("sum"), tensor("sum_of_squares")
    squares_desc = squares_descriptor(x.desc)
    offset = aligned(squares_desc.size_in_bytes)
    squares = typed_view(scratch, 0, squares_desc)
    workspace = scratch[offset:] if len(scratch) > offset else None
    add = reduce_descriptor(od.ReduceTensorOp.ADD, x.desc)
    od.reduce_tensor(handle, add, None, workspace, 1.0, x.desc, x.view, 0.0, total.desc, total.view)
    od.pointwise(handle, od.PointwiseMode.MUL, 1.0, [(x.desc, x.view), (x.desc, x.view)], 0.0, squares_desc, squares)
    od.reduce_tensor(
        handle, add, None, workspace, 1.0, squares_desc, squares, 0.0, sum_of_squares.desc, sum_of_squares.view
    )


# ---- convolution and matmul ---------------------------------------------------------------------------

CONV_ROLES = {
    "conv_fprop": ("image", "weight", "y"),
    "conv_dgrad": ("dx", "filter", "loss"),
    "conv_wgrad": ("image", "dw", "loss"),
}  # the (x, w, y) of each direction
CONV_DIRECTIONS = {
    "conv_fprop": ConvolutionDirection.FORWARD,
    "conv_dgrad": ConvolutionDirection.BACKWARD_DATA,
    "conv_wgrad": ConvolutionDirection.BACKWARD_FILTER,
}


def conv_descriptor(node: NodeSpec, descs: Mapping[str, TensorDescriptor]) -> od.ConvolutionDescriptor:
    x_role, w_role, _ = CONV_ROLES[node.op]
    x, w = descs[x_role], descs[w_role]
    return od.ConvolutionDescriptor(
        node.attribute("padding"),
        node.attribute("stride"),
        node.attribute("dilation"),
        compute_type=compute_type(x.dtype),
        group_count=x.dims[1] // w.dims[1],
    )


def conv_algorithm(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> enum.Enum:
    """The algorithm of a convolution node's call: the one a call naming none takes on ``handle``
    (``default_algorithm``): the direction's default, or the one the backend prefers where its route
    needs a workspace (an NCHW float32 forward's staged copies, a forward of few tiles sliced), within
    the handle's workspace limit. Build and run ask alike."""
    x, w, y = (descs[role] for role in CONV_ROLES[node.op])
    conv = conv_descriptor(node, descs)
    problem = convolution_problem(CONV_DIRECTIONS[node.op], conv, x, w, y, allow_tf32=allows_tf32(handle, conv))
    return default_algorithm(handle, problem).algo


def conv_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    x_role, w_role, y_role = CONV_ROLES[node.op]
    x, w, y = descs[x_role], descs[w_role], descs[y_role]
    conv = conv_descriptor(node, descs)
    algo = conv_algorithm(node, descs, handle)
    if node.op == "conv_fprop":
        return od.get_convolution_forward_workspace_size(handle, x, w, conv, y, algo)
    if node.op == "conv_dgrad":
        return od.get_convolution_backward_data_workspace_size(handle, w, y, conv, x, algo)
    return od.get_convolution_backward_filter_workspace_size(handle, x, y, conv, w, algo)


def run_conv(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, w, y = (tensor(role) for role in CONV_ROLES[node.op])
    x_role, w_role, y_role = CONV_ROLES[node.op]
    descs = {x_role: x.desc, w_role: w.desc, y_role: y.desc}
    conv = conv_descriptor(node, descs)
    algo = conv_algorithm(node, descs, handle)
    if node.op == "conv_fprop":
        od.convolution_forward(handle, 1.0, x.desc, x.view, w.desc, w.view, conv, algo, scratch, 0.0, y.desc, y.view)
    elif node.op == "conv_dgrad":
        od.convolution_backward_data(
            handle, 1.0, w.desc, w.view, y.desc, y.view, conv, algo, scratch, 0.0, x.desc, x.view
        )
    else:
        od.convolution_backward_filter(
            handle, 1.0, x.desc, x.view, y.desc, y.view, conv, algo, scratch, 0.0, w.desc, w.view
        )


def run_matmul(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    a, b, c = tensor("a"), tensor("b"), tensor("c")
    od.matmul(handle, 1.0, a.desc, a.view, b.desc, b.view, 0.0, c.desc, c.view)


# ---- normalizations -----------------------------------------------------------------------------------


def run_batchnorm(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y, scale, bias = tensor("x"), tensor("y"), tensor("scale"), tensor("bias")
    running_mean, running_var = running = [tensor("next_running_mean"), tensor("next_running_var")]
    for source, target in zip((tensor("in_running_mean"), tensor("in_running_var")), running):
        if source is not None:  # the update is in place: the next statistics start as copies
            od.transform_tensor(handle, 1.0, source.desc, source.view, 0.0, target.desc, target.view)
    od.batch_normalization_forward_training(
        handle,
        od.BatchNormMode.SPATIAL,
        1.0,
        0.0,
        x.desc,
        x.view,
        y.desc,
        y.view,
        scale.desc,
        scale.view,
        bias.view,
        node.attribute("momentum"),
        optional_view(running_mean),
        optional_view(running_var),
        node.attribute("epsilon"),
        tensor("mean").view,
        tensor("inv_variance").view,
    )


def run_batchnorm_backward(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, dy, dx, scale = tensor("x"), tensor("grad"), tensor("dx"), tensor("scale")
    od.batch_normalization_backward(
        handle,
        od.BatchNormMode.SPATIAL,
        1.0,
        0.0,
        1.0,
        0.0,
        x.desc,
        x.view,
        dy.desc,
        dy.view,
        dx.desc,
        dx.view,
        scale.desc,
        scale.view,
        tensor("dscale").view,
        tensor("dbias").view,
        BN_BACKWARD_EPSILON,
        tensor("mean").view,
        tensor("inv_variance").view,
    )


def norm_descriptor(node: NodeSpec) -> od.NormDescriptor:
    mode = NORM_MODES[node.op.removesuffix("_backward")]
    return od.NormDescriptor(
        mode,
        node.attribute("epsilon", 1e-5),
        normalized_ndim=node.attribute("normalized_ndim", 1),
        groups=node.attribute("groups", 1),
    )


def optional_view(bound: Bound | None) -> Any:
    return None if bound is None else bound.view


def run_norm(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y, scale, bias = tensor("x"), tensor("y"), tensor("scale"), tensor("bias")
    params = scale if scale is not None else bias  # one descriptor describes both (a group norm may have neither)
    common = (
        handle,
        norm_descriptor(node),
        1.0,
        x.desc,
        x.view,
        None if params is None else params.desc,
        optional_view(scale),
        optional_view(bias),
        0.0,
        y.desc,
        y.view,
    )
    if node.attribute("phase") == "inference":
        od.normalization_forward_inference(*common)
        return
    inv_std = tensor("inv_variance")
    od.normalization_forward_training(*common, inv_std.desc, optional_view(tensor("mean")), inv_std.view)


def run_norm_backward(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, dy, dx, scale, inv_std = tensor("x"), tensor("grad"), tensor("dx"), tensor("scale"), tensor("inv_variance")
    od.normalization_backward(
        handle,
        norm_descriptor(node),
        1.0,
        0.0,
        1.0,
        0.0,
        x.desc,
        x.view,
        dy.desc,
        dy.view,
        None if scale is None else scale.desc,
        optional_view(scale),
        optional_view(tensor("dscale")),
        optional_view(tensor("dbias")),
        inv_std.desc,
        optional_view(tensor("mean")),
        inv_std.view,
        dx.desc,
        dx.view,
    )


# ---- views ---------------------------------------------------------------------------------------------


def run_view(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    """A slice or a reshape launches nothing: the plan binds its output as a view of its input's memory."""


# ---- concatenation -------------------------------------------------------------------------------------


def concatenate_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    """0: the copies need no scratch. An INT64 join is refused here, by every engine: the transform
    computes in float64, which holds integers exactly only up to 2**53, and a join moves values as
    they are."""
    y = descs["y"]
    if y.dtype is DataType.INT64:
        raise NotSupported(
            "output y is INT64, which its copies (transform_tensor, in float64) keep exact only up to 2**53",
            Status.NOT_SUPPORTED_DATA_TYPE,
        )
    return 0


def run_concatenate(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    """Each input copied into its sub-region of y along the axis (a view of y's memory, of y's
    strides), one transform per input: any layout on either side, NumPy's copy on the NumPy backend."""
    y, axis, start = tensor("y"), node.attribute("axis"), 0
    for x in concatenated({role: tensor(role) for role, _ in node.inputs}):
        size = x.desc.dims[axis]
        region = TensorDescriptor(y.desc.dtype, x.desc.dims, y.desc.strides)
        view = y.view[(slice(None),) * axis + (slice(start, start + size),)]
        od.transform_tensor(handle, 1.0, x.desc, x.view, 0.0, region, view)
        start += size


# ---- softmax and pooling ------------------------------------------------------------------------------


def axis_as_channel(desc: TensorDescriptor, axis: int) -> TensorDescriptor:
    """``desc`` with ``axis`` moved to dim 1 (the same memory): softmax's CHANNEL mode then runs
    along it, whatever its position and stride."""
    if desc.ndim == 1:
        return TensorDescriptor(desc.dtype, (1, *desc.dims), (0, *desc.strides))
    order = [k for k in range(desc.ndim) if k != axis]
    order.insert(1, axis)
    return TensorDescriptor(desc.dtype, [desc.dims[k] for k in order], [desc.strides[k] for k in order])


def run_softmax(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y = tensor("x"), tensor("y")
    axis = node.attribute("axis")
    algorithm = od.SoftmaxAlgorithm.LOG if node.attribute("log") else od.SoftmaxAlgorithm.ACCURATE
    od.softmax_forward(
        handle,
        algorithm,
        od.SoftmaxMode.CHANNEL,
        1.0,
        axis_as_channel(x.desc, axis),
        x.view,
        0.0,
        axis_as_channel(y.desc, axis),
        y.view,
    )


def pooling_descriptor(node: NodeSpec) -> od.PoolingDescriptor:
    return od.PoolingDescriptor(
        od.PoolingMode(node.attribute("mode")),
        NanPropagation.PROPAGATE_NAN,
        node.attribute("window"),
        node.attribute("padding"),
        node.attribute("stride"),
    )


def run_pooling(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y = tensor("x"), tensor("y")
    od.pooling_forward(handle, pooling_descriptor(node), 1.0, x.desc, x.view, 0.0, y.desc, y.view)


def maxima_descriptor(node: NodeSpec, dy: TensorDescriptor) -> TensorDescriptor | None:
    """Where a max pooling's backward keeps the windows' maxima it finds in x again (the pooled dims,
    packed, in scratch); None for the averages, whose backward reads no y."""
    if not od.PoolingMode(node.attribute("mode")).is_max:
        return None
    return TensorDescriptor(dy.dtype, dy.dims, packed_strides(dy.dims))


def pooling_backward_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    maxima = maxima_descriptor(node, descs["dy"])
    return 0 if maxima is None else maxima.size_in_bytes


def run_pooling_backward(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    """The max modes pool x again into scratch, then give each window's dy to its first position
    equal to that maximum; the averages' call reads no y, so dy (of y's dims and type) stands in."""
    dy, x, dx = tensor("dy"), tensor("x"), tensor("dx")
    pool = pooling_descriptor(node)
    y_desc, y = dy.desc, dy.view
    maxima = maxima_descriptor(node, dy.desc)
    if maxima is not None:
        y_desc, y = maxima, typed_view(scratch, 0, maxima)
        od.pooling_forward(handle, pool, 1.0, x.desc, x.view, 0.0, y_desc, y)
    od.pooling_backward(handle, pool, 1.0, y_desc, y, dy.desc, dy.view, x.desc, x.view, 0.0, dx.desc, dx.view)


def resample_descriptor(node: NodeSpec) -> od.ResampleDescriptor:
    mode = od.InterpolationMode.LINEAR if node.attribute("mode") == "bilinear" else od.InterpolationMode.NEAREST
    return od.ResampleDescriptor(mode, scales=node.attribute("stride"))


def run_resample(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    x, y = tensor("x"), tensor("y")
    od.resample_forward(handle, resample_descriptor(node), 1.0, x.desc, x.view, 0.0, y.desc, y.view)


def run_resample_backward(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    dy, dx = tensor("dy"), tensor("dx")
    od.resample_backward(handle, resample_descriptor(node), 1.0, dy.desc, dy.view, 0.0, dx.desc, dx.view)


# ---- attention ----------------------------------------------------------------------------------------

FORWARD_SLOTS = ("q", "k", "v", "o")
BACKWARD_SLOTS = ("q", "k", "v", "o", "do", "stats", "dq", "dk", "dv")
BACKWARD_OPS = ("sdpa_backward", "sdpa_fp8_backward")


def attention_slots(node: NodeSpec, described: Callable[[str], Any]) -> dict[str, Any]:
    """``described(role)`` for each of the family's slots the node has, keyed by slot: the node's
    descriptors (at plan time) or its bound arrays (at run time)."""
    roles = {role for role, _ in (*node.inputs, *node.outputs)}
    return {
        slot: described(ROLE_OF_SLOT.get(slot, slot))
        for slot in ATTENTION_SLOTS
        if ROLE_OF_SLOT.get(slot, slot) in roles
    }


def attention_scratch(node: NodeSpec, descs: Mapping[str, TensorDescriptor], handle: Handle) -> int:
    """0: the attention calls allocate their workspace themselves. The node's problem and the call's
    workspace query run here all the same, when an engine plans the node: what the family or the
    backend refuses is that engine's reason in ``check_support``, naming the builder's parameters."""
    slots = {
        slot: attention_slot_descriptor(slot, desc) for slot, desc in attention_slots(node, descs.__getitem__).items()
    }
    params = attention_descriptor(dict(node.attributes))
    attention_problem(params, **slots, names=GRAPH_NAMES)  # its refusals name the builder's parameters
    direction = BACKWARD_SLOTS if node.op in BACKWARD_OPS else FORWARD_SLOTS
    required: list[Any] = [slots[s] for s in direction]
    optional: dict[str, Any] = {f"{slot}_desc": desc for slot, desc in slots.items() if slot not in direction}
    if node.op in BACKWARD_OPS:
        od.get_attention_backward_workspace_size(handle, params, *required, **optional)
    else:
        od.get_attention_forward_workspace_size(handle, params, *required, **optional)
    return 0


def run_attention(node: NodeSpec, tensor: Tensors, handle: Handle, scratch: Any) -> None:
    bounds = {slot: attention_bound(slot, bound) for slot, bound in attention_slots(node, tensor).items()}
    params = attention_descriptor(dict(node.attributes))
    direction = BACKWARD_SLOTS if node.op in BACKWARD_OPS else FORWARD_SLOTS
    positional: list[Any] = [item for slot in direction for item in (bounds[slot].desc, bounds[slot].view)]
    optional: dict[str, Any] = {}
    for slot, bound in bounds.items():
        if slot not in direction:
            optional[f"{slot}_desc"], optional[slot] = bound.desc, bound.view
    call = od.attention_backward if node.op in BACKWARD_OPS else od.attention_forward
    call(handle, params, *positional, **optional)


def attention_bound(slot: str, bound: Bound) -> Bound:
    """``bound`` as the attention family describes the slot (stats and sequence lengths lose their
    trailing dims of 1), the same memory."""
    return redescribed(bound, attention_slot_descriptor(slot, bound.desc))


Runner = Callable[[NodeSpec, Tensors, Handle, Any], None]
Scratch = Callable[[NodeSpec, Mapping[str, TensorDescriptor], Handle], int]
RUNNERS: dict[str, tuple[Runner, Scratch]] = {
    "pointwise": (run_pointwise, no_scratch),
    "reduction": (run_reduction, reduction_scratch),
    "genstats": (run_genstats, genstats_scratch),
    "conv_fprop": (run_conv, conv_scratch),
    "conv_dgrad": (run_conv, conv_scratch),
    "conv_wgrad": (run_conv, conv_scratch),
    "matmul": (run_matmul, no_scratch),
    "batchnorm": (run_batchnorm, no_scratch),
    "batchnorm_backward": (run_batchnorm_backward, no_scratch),
    "layernorm": (run_norm, no_scratch),
    "rmsnorm": (run_norm, no_scratch),
    "instancenorm": (run_norm, no_scratch),
    "layernorm_backward": (run_norm_backward, no_scratch),
    "rmsnorm_backward": (run_norm_backward, no_scratch),
    "instancenorm_backward": (run_norm_backward, no_scratch),
    "groupnorm": (run_norm, no_scratch),
    "groupnorm_backward": (run_norm_backward, no_scratch),
    "slice": (run_view, no_scratch),
    "reshape": (run_view, no_scratch),
    "concatenate": (run_concatenate, concatenate_scratch),
    "softmax": (run_softmax, no_scratch),
    "pooling": (run_pooling, no_scratch),
    "resample": (run_resample, no_scratch),
    "pooling_backward": (run_pooling_backward, pooling_backward_scratch),
    "resample_backward": (run_resample_backward, no_scratch),
    "sdpa": (run_attention, attention_scratch),
    "sdpa_fp8": (run_attention, attention_scratch),
    "sdpa_backward": (run_attention, attention_scratch),
    "sdpa_fp8_backward": (run_attention, attention_scratch),
}


def scalar_bound(value: float, dtype: DataType, like: Bound) -> Bound:
    """A one-element tensor holding a scalar passed by value, of ``like``'s kind and device."""
    return constant_like(Bound("scalar", TensorDescriptor(dtype, (1,)), like.view, like.device), value)
