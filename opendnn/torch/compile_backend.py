"""``torch.compile(model, backend="opendnn")``: the FX graphs torch.compile captures, with every
region opendnn's graph API can run replaced by a call of a built ``opendnn.graph`` plan.

aot_autograd hands the backend the forward and the backward graph in ATen operators. In each, the
nodes of ``LOWERINGS`` (convolution, transposed too, and its backward, matmuls, the pointwise
operations and their backward forms, sums and means, layer norm, group norm (a diffusion block's
GroupNorm -> SiLU -> conv) and its backward, batch norm in training and inference and their backward
forms, average pools and evenly divided adaptive average pools and their backward forms, max pooling
whose indices nothing reads, concatenations: ``CONCATENATION``, torch's views (a view of a region
input is torch's, a view of a computed tensor the graph's slice or reshape, a view returned torch's
view of the graph output it views): ``VIEWS``, scaled dot-product attention and its backward as
torch picks it on the CPU and on CUDA: ``ATTENTION``) are grouped by torch's capability partitioner
into regions: connected, and never depending on themselves through a node left outside.
Each region of two nodes or more, or of an attention operator alone, becomes one ``OpendnnRegion``:
on its first call for a signature of its inputs (shapes, strides, dtypes, device) it lowers the
region to an ``opendnn.graph.Graph``, builds the plan (the fusion engine's generated kernels,
convolution and matmul epilogues) and keeps it; each call then allocates the outputs and executes
the plan.
Everything else runs as the FX graph, eagerly, on torch.

Tensors on the CPU run on the reference engine (the NumPy backend) and CUDA tensors on the fusion
engine's, unless ``options={"heur_mode": ...}`` names the heuristics. A region whose lowering opendnn
refuses (a shape it cannot take, a value read in dims the graph cannot view it in) runs its FX graph
on torch, and says why in ``OpendnnBackend.fallbacks``.

With ``options={"cudagraphs": True}``, an FX graph whose inputs are all CUDA tensors of static shapes
runs as a CUDA graph, composed as
torch's own "cudagraphs" backend composes it (``torch._dynamo.backends.cudagraphs``): the compiled
graph goes to torch's cudagraph trees (``cudagraphify_impl``), whose first call runs it eagerly (a
warm-up: Triton compiles the kernels then), the second records it, and every later call replays it
with no Python of opendnn's. ``cuda_graph_refusal`` decides, with torch's checks (no input mutated
but the parameters, one device, no CPU node); the backward is captured only when its forward is.
Without the option every graph runs eagerly.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.cudagraphs import (
    check_for_skip,
    find_input_mutations,
    get_device_index,
    get_stack_traces,
)
from torch._inductor.cudagraph_utils import BoxedDeviceIndex, get_placeholder_info, log_cudagraph_skip_and_bump_counter
from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

import opendnn as od
import opendnn.graph as og
from opendnn.core.errors import OpenDnnError
from opendnn.families.pooling.problem import output_size
from opendnn.kernels.device import kept_buffer

aten = torch.ops.aten
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_TYPES = (torch.float16, torch.bfloat16)


class Refused(Exception):
    """A region the lowering cannot express as an opendnn graph (it then runs on torch)."""


class Empty:
    """A result no one reads: of no element (the saved statistics of a batch norm that normalizes with
    its running ones), or the Philox seed and offset of attention without dropout. A region allocates
    it for the caller and computes nothing."""


EMPTY = Empty()


Steps = tuple[tuple[Any, tuple[Any, ...]], ...]  # torch's views in a row: each an operator and its arguments


def _replayed(tensor: torch.Tensor, steps: Steps) -> Any:
    for op, op_args in steps:
        tensor = op(tensor, *op_args)
    return tensor


class InputView(NamedTuple):
    """A region input as the region reads it: the region's ``argument`` through torch's views
    ``steps`` (each an operator and its arguments after the tensor), taken by torch at every call."""

    argument: int
    steps: Steps = ()

    def of(self, args: Sequence[Any]) -> Any:
        return _replayed(args[self.argument], self.steps)


class LazyView(NamedTuple):
    """A view of a computed tensor: ``make`` adds it to the graph (a slice, a reshape) from the graph
    tensor of ``source`` when a node of the region reads it, so a view that is only a result of the
    region adds nothing; ``root`` is the FX node of the computed tensor it views, ``steps`` torch's
    views that take it from that node's result."""

    source: torch.fx.Node
    make: Callable[[og.Tensor], og.Tensor]
    root: torch.fx.Node
    steps: Steps


class Deferred(NamedTuple):
    """A graph tensor ``make`` adds when a node of the region reads it or the region returns it, and
    not otherwise (a cast of saved statistics that nothing reads would dangle)."""

    make: Callable[[], og.Tensor]


class Result(NamedTuple):
    """A region's result: torch's views ``steps`` of a graph output ``tensor`` allocated as torch
    computes it (``shape``, ``strides``, ``dtype``); of nothing computed when ``tensor`` is None (a
    result of no element, or ``input``, a view of a region input)."""

    tensor: og.Tensor | None
    shape: torch.Size
    strides: tuple[int, ...]
    dtype: torch.dtype
    steps: Steps = ()
    input: InputView | None = None


class Lowering:
    """One region's FX graph as an opendnn graph, built for one signature of its inputs."""

    def __init__(self, module: torch.fx.GraphModule, args: Sequence[Any], handle: od.Handle, name: str) -> None:
        wide = og.DataType.DOUBLE if any(a.dtype == torch.float64 for a in _tensors(args)) else og.DataType.FLOAT
        self.graph = og.Graph(compute_data_type=wide, intermediate_data_type=wide, handle=handle, name=name)
        self.args = args
        self.inputs: dict[tuple[InputView, tuple[int, ...]], og.Tensor] = {}  # (view, dims) -> graph tensor
        self.values: dict[torch.fx.Node, Any] = {}
        self.made: dict[torch.fx.Node, og.Tensor] = {}  # the LazyViews and Deferreds added to the graph
        self.reshaped: dict[tuple[og.Tensor, tuple[int, ...]], og.Tensor] = {}
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        self.position = {node: k for k, node in enumerate(placeholders)}
        for node in module.graph.nodes:
            if node.op == "call_function":
                self.values[node] = self._lower(node)
                _follow_torch(self.values[node], node.meta.get("val"))
            elif node.op == "output":
                self.outputs = self._outputs(node.args[0])

    def source(self, value: torch.fx.Node) -> Any:
        """What an FX value is in the graph: a graph tensor (or several, or EMPTY), an InputView, a
        LazyView or a Deferred."""
        return InputView(self.position[value]) if value.op == "placeholder" else self.values[value]

    def tensor(self, value: Any, dims: Sequence[int] | None = None) -> Any:
        """The graph tensor of an FX value (read as ``dims`` when given: a region input reshaped by
        torch, a computed tensor viewed with dims of 1 added or dropped), or a number. A value of no
        dims (a scalar tensor) is the graph's tensor of dims [1]: it broadcasts alike."""
        if not isinstance(value, torch.fx.Node):
            return value
        source = self.source(value)
        if isinstance(source, InputView):
            array = source.of(self.args)
            shape = (tuple(array.shape) if dims is None else tuple(dims)) or (1,)
            key = (source, shape)
            if key not in self.inputs:
                self.inputs[key] = self.graph.tensor_like(array.reshape(shape), name=f"{value.name}_{len(self.inputs)}")
            return self.inputs[key]
        if isinstance(source, (LazyView, Deferred)):
            source = self._made(value, source)
        shape = (tuple(value.meta["val"].shape) if dims is None else tuple(dims)) or (1,)
        if isinstance(source, og.Tensor) and tuple(source.get_dim()) != shape and _ones_apart(shape, source):
            return self._squeezed(source, shape)
        if not isinstance(source, og.Tensor) or tuple(source.get_dim()) != shape:
            computed = source.get_dim() if isinstance(source, og.Tensor) else "several outputs"
            raise Refused(f"{value.name} is read inside the region as {list(shape)}, the graph computes {computed}")
        return source

    def _made(self, value: torch.fx.Node, source: LazyView | Deferred) -> og.Tensor:
        """The graph tensor of a LazyView or a Deferred, added to the graph at its first use."""
        if value not in self.made:
            if isinstance(source, Deferred):
                self.made[value] = source.make()
                _follow_torch(self.made[value], value.meta["val"])
            else:
                self.made[value] = source.make(self.tensor(source.source))
        return self.made[value]

    def _squeezed(self, tensor: og.Tensor, shape: tuple[int, ...]) -> og.Tensor:
        """``tensor`` viewed as ``shape``, its dims with dims of 1 added or dropped (a sum without
        keepdim read by the next node, a mask of (Sq, Skv) read as attention's 4-D bias)."""
        key = (tensor, shape)
        if key not in self.reshaped:
            steps = iter(s for d, s in zip(tensor.get_dim(), tensor.get_stride()) if d != 1)
            self.reshaped[key] = self.graph.reshape(tensor, shape, [next(steps) if d != 1 else 1 for d in shape])
        return self.reshaped[key]

    def _lower(self, node: torch.fx.Node) -> Any:
        if node.target is operator.getitem:
            source, index = node.args
            assert isinstance(source, torch.fx.Node) and isinstance(index, int)
            if self.values[source][index] is None:
                raise Refused(f"{node.name}: output {index} of {source.name} has no graph tensor")
            return self.values[source][index]
        return LOWERINGS[node.target].lower(self, node, *node.args, **node.kwargs)

    def _outputs(self, returned: Any) -> list[Result]:
        """The region's results. A graph output is never a view: a view's result is torch's view of
        the output of the tensor it views."""
        nodes = returned if isinstance(returned, (tuple, list)) else [returned]
        outputs: list[Result] = []
        for node in nodes:
            tensor, val = self.values[node], node.meta["val"]
            steps: Steps = ()
            if isinstance(tensor, InputView):
                outputs.append(Result(None, val.shape, val.stride(), val.dtype, input=tensor))
                continue
            if tensor is EMPTY:
                outputs.append(Result(None, val.shape, val.stride(), val.dtype))
                continue
            if isinstance(tensor, LazyView):
                node, steps = tensor.root, tensor.steps
                tensor, val = self.values[node], node.meta["val"]
            if isinstance(tensor, Deferred):
                tensor = self._made(node, tensor)
            if not isinstance(tensor, og.Tensor) or tensor.numel != val.numel():
                raise Refused(f"output {node.name} has no graph tensor of its size")
            tensor.set_output(True).set_data_type(val.dtype)
            outputs.append(Result(tensor, val.shape, val.stride(), val.dtype, steps))
        return outputs


def _ones_apart(shape: tuple[int, ...], tensor: og.Tensor) -> bool:
    """``shape`` holds ``tensor``'s dims in order, but for dims of 1."""
    return [d for d in shape if d != 1] == [d for d in tensor.get_dim() if d != 1]


def _follow_torch(value: Any, val: Any) -> None:
    """Give the graph tensors of an FX node's results the dtypes and the memory order torch computes
    them in: under autocast a convolution's or a batch norm's bfloat16 output, beside float32
    statistics (the graph's intermediate type is float32, and a node's call takes its output in its
    input's type); a channels-last model's activations channels-last (a graph tensor without strides
    is packed in its dims' order, which would turn every activation of such a model NCHW)."""
    if isinstance(value, og.Tensor) and isinstance(val, torch.Tensor):
        value.set_data_type(val.dtype)
        if tuple(value.get_dim()) == tuple(val.shape) and _dense(val):
            value.set_stride(val.stride())
    elif isinstance(value, (tuple, list)) and isinstance(val, (tuple, list)):
        for tensor, result in zip(value, val):
            _follow_torch(tensor, result)


def _dense(val: torch.Tensor) -> bool:
    """``val``'s elements fill its memory without a gap or an overlap (a permutation of a packed layout)."""
    order = sorted((stride, size) for size, stride in zip(val.shape, val.stride()) if size != 1)
    expected = 1
    for stride, size in order:
        if stride != expected:
            return False
        expected *= size
    return True


def _tensors(args: Sequence[Any]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


# ---- the lowerings: one per ATen operator ------------------------------------------------------------


class Op:
    """An ATen operator's lowering: ``accepts(node)`` (asked by the partitioner) and ``lower``."""

    types: tuple[torch.dtype, ...] = FLOATS  # what the tensors it reads and writes may hold

    def __init__(self, lower: Callable[..., Any], accepts: Callable[..., bool] = lambda *args, **kwargs: True) -> None:
        self.lower, self._accepts = lower, accepts

    def accepts(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` lowers: every tensor it reads and writes of ``types`` (floating point), of
        static shape (a graph is built for fixed dims), and the operator's own rule holds."""
        vals = [self.results(node)] + [a.meta.get("val") for a in node.all_input_nodes]
        for val in vals:
            for tensor in val if isinstance(val, (tuple, list)) else [val]:
                if tensor is None:
                    continue
                if not isinstance(tensor, torch.Tensor) or tensor.dtype not in self.types:
                    return False
                if not all(isinstance(d, int) for d in (*tensor.shape, *tensor.stride())):
                    return False
        return self._accepts(*node.args, **node.kwargs)

    def results(self, node: torch.fx.Node) -> Any:
        """The results of ``node`` that its lowering computes: all of them."""
        return node.meta.get("val")


def _pointwise(method: str) -> Op:
    return Op(lambda low, node, *args: getattr(low.graph, method)(*(low.tensor(a) for a in args)))


def _channel_dims(value: Any, rank: int) -> list[int]:
    """A per-channel tensor (C,)'s dims as (1, C, 1, ...) of ``rank`` dims."""
    return [1, value.meta["val"].shape[0], *([1] * (rank - 2))]


def _channel(low: Lowering, value: Any, rank: int) -> Any:
    """A per-channel tensor (C,) viewed as (1, C, 1, ...) of ``rank`` dims."""
    return low.tensor(value, _channel_dims(value, rank))


def _convolution(
    low: Lowering,
    node: torch.fx.Node,
    x: Any,
    w: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    *rest: Any,
) -> Any:
    """A convolution, or a transposed one: the backward data of the convolution whose output x is
    (its output_padding in the dims torch gives y)."""
    geometry = {"padding": padding, "stride": stride, "dilation": dilation}
    if transposed:
        y = low.graph.conv_dgrad(low.tensor(x), low.tensor(w), **geometry)
        y.set_dim(list(node.meta["val"].shape))
    else:
        y = low.graph.conv_fprop(low.tensor(x), low.tensor(w), **geometry)
    return y if bias is None else low.graph.bias(y, _channel(low, bias, len(y.get_dim())))


def _convolution_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    x: Any,
    w: Any,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: Any,
    output_padding: Any,
    groups: Any,
    mask: Sequence[bool],
) -> Any:
    """The gradients of a convolution, or of a transposed one: the convolution whose image is the
    transposed one's output (dy), read forward for dx, its filter's gradient with x as its gradient."""
    g, dy, rank = low.graph, low.tensor(grad), len(grad.meta["val"].shape)
    geometry = {"padding": padding, "stride": stride, "dilation": dilation}
    dx = dw = db = None
    if mask[0]:
        if transposed:
            dx = g.conv_fprop(dy, low.tensor(w), **geometry)
        else:
            dx = g.conv_dgrad(dy, low.tensor(w), **geometry)
        dx.set_dim(list(x.meta["val"].shape))
    if mask[1]:
        image, gradient = (dy, low.tensor(x)) if transposed else (low.tensor(x), dy)
        dw = g.conv_wgrad(image, gradient, **geometry)
        dw.set_dim(list(w.meta["val"].shape))
    if mask[2]:
        db = g.reduction(dy, "ADD", [1, dy.get_dim()[1], *([1] * (rank - 2))])
    return (dx, dw, db)


def _addmm(low: Lowering, node: torch.fx.Node, bias: Any, a: Any, b: Any) -> Any:
    product = low.graph.matmul(low.tensor(a), low.tensor(b))
    shape = bias.meta["val"].shape
    return low.graph.add(product, low.tensor(bias, [1, shape[0]]) if len(shape) == 1 else low.tensor(bias))


def _summed(node: Any, dims: Sequence[int]) -> list[int]:
    """``node``'s dims with each of ``dims`` reduced to 1: a sum's dims over them, kept for broadcasting."""
    shape = list(node.meta["val"].shape)
    reduced = {d % len(shape) for d in dims}
    return [1 if k in reduced else size for k, size in enumerate(shape)]


def _reduction(mode: str) -> Op:
    """A sum or mean over dims (``aten.sum.dim_IntList``, ``aten.mean.dim``): the graph's reduction."""

    def lower(low: Lowering, node: torch.fx.Node, x: Any, dims: Sequence[int], keepdim: bool = False) -> Any:
        return low.graph.reduction(low.tensor(x), mode, _summed(x, dims))

    return Op(lower, lambda x, dims, keepdim=False, dtype=None: bool(dims) and dtype is None)


REDUCTIONS = {aten.sum.dim_IntList: _reduction("ADD"), aten.mean.dim: _reduction("AVG")}


def _softmax(low: Lowering, node: torch.fx.Node, x: Any, dim: int, half_to_float: bool, log: bool = False) -> Any:
    return low.graph.softmax(low.tensor(x), axis=dim, log=log)


def _softmax_backward(low: Lowering, node: torch.fx.Node, grad: Any, y: Any, dim: int, input_dtype: Any) -> Any:
    """dx = y (dy - sum(dy y)) along dim."""
    g, dy, out = low.graph, low.tensor(grad), low.tensor(y)
    return g.mul(out, g.sub(dy, g.reduction(g.mul(dy, out), "ADD", _summed(y, [dim]))))


def _log_softmax_backward(low: Lowering, node: torch.fx.Node, grad: Any, y: Any, dim: int, input_dtype: Any) -> Any:
    """dx = dy - exp(y) sum(dy) along dim."""
    g, dy = low.graph, low.tensor(grad)
    return g.sub(dy, g.mul(g.exp(low.tensor(y)), g.reduction(dy, "ADD", _summed(grad, [dim]))))


def _same_dtype(grad: Any, y: Any, dim: int, input_dtype: Any) -> bool:
    """A softmax backward whose input had the gradient's dtype (no half-to-float step to undo)."""
    return grad.meta["val"].dtype == input_dtype


def _float32(low: Lowering, value: Any, dims: Sequence[int] | None = None) -> Any:
    """The graph tensor of an FX value (read as ``dims``) in float32, what the graph's norms read: one
    of a half type (statistics torch's CPU kernels save in a half-type x's type, the parameters and
    running statistics of a module cast to bfloat16) is cast up."""
    tensor = low.tensor(value, dims)
    return low.graph.identity(tensor) if value.meta["val"].dtype in HALF_TYPES else tensor


def _as_torchs(low: Lowering, half: bool, *values: Any) -> tuple[Any, ...]:
    """A norm's float32 results as torch gives them: where torch keeps them in a ``half`` type, each a
    cast of the graph's float32 one, added only where the region reads or returns it (inference reads
    no statistics)."""
    if not half:
        return values
    return tuple(Deferred(functools.partial(low.graph.identity, value)) for value in values)


def _saved_statistics(low: Lowering, node: torch.fx.Node, *statistics: Any) -> tuple[Any, ...]:
    """A normalization's saved statistics as torch keeps them: in x's half type where torch's CPU
    kernels save them so (a half-type x and weight, as under autocast)."""
    return _as_torchs(low, node.meta["val"][1].dtype in HALF_TYPES, *statistics)


def _rows(x: Any) -> list[int]:
    """A layer norm's x as the graph reads it: its dims, with a leading 1 where it has one dim (the
    graph's norms take two dims or more)."""
    shape = list(x.meta["val"].shape)
    return [1] * (2 - len(shape)) + shape


def _layer_norm(
    low: Lowering, node: torch.fx.Node, x: Any, normalized: Sequence[int], w: Any, b: Any, eps: float
) -> Any:
    """(y, mean, rstd), the statistics as torch saves them (``_saved_statistics``)."""
    rows = _rows(x)
    dims = [1] * (len(rows) - len(normalized)) + list(normalized)
    y, mean, inv = low.graph.layernorm(low.tensor(x, rows), low.tensor(w, dims), low.tensor(b, dims), epsilon=eps)
    return (y, *_saved_statistics(low, node, mean, inv))


def _layer_norm_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    x: Any,
    normalized: Sequence[int],
    mean: Any,
    rstd: Any,
    w: Any,
    b: Any,
    mask: Sequence[bool],
) -> Any:
    rows = _rows(x)
    dims = [1] * (len(rows) - len(normalized)) + list(normalized)
    per_row = rows[: len(rows) - len(normalized)] + [1] * len(normalized)
    dx, dw, db = low.graph.layernorm_backward(
        low.tensor(grad, rows),
        low.tensor(x, rows),
        low.tensor(w, dims),
        _float32(low, mean, per_row),
        _float32(low, rstd, per_row),
    )
    return (dx, dw, db)


def _batch_norm_training(
    low: Lowering,
    node: torch.fx.Node,
    x: Any,
    w: Any,
    b: Any,
    mean: Any,
    var: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    """(y, saved mean, saved inverse deviation, next running mean, next running variance), the last
    two None without running statistics (a module that tracks none). Parameters and running
    statistics of a half type (a module cast to bfloat16) are read as float32 and the next running
    statistics cast back."""
    rank = len(x.meta["val"].shape)
    y, saved_mean, inv, next_mean, next_var = low.graph.batchnorm(
        low.tensor(x),
        _float_channel(low, w, rank),
        _float_channel(low, b, rank),
        None if mean is None else _float_channel(low, mean, rank),
        None if var is None else _float_channel(low, var, rank),
        epsilon=eps,
        momentum=momentum,
    )
    following = _as_torchs(low, mean is not None and mean.meta["val"].dtype in HALF_TYPES, next_mean, next_var)
    return (y, *_saved_statistics(low, node, saved_mean, inv), *following)


def _batch_norm_without_statistics(
    low: Lowering, node: torch.fx.Node, x: Any, w: Any, b: Any, training: bool, momentum: float, eps: float
) -> Any:
    return _batch_norm_training(low, node, x, w, b, None, None, training, momentum, eps)[:3]


def _batch_norm_inference(
    low: Lowering, node: torch.fx.Node, x: Any, w: Any, b: Any, mean: Any, var: Any, momentum: float, eps: float
) -> Any:
    """(y, and the two saved statistics, which torch gives no element: the backward of a batch norm
    of frozen statistics reads the running ones). A missing weight scales by 1, a missing bias adds 0."""
    g, rank = low.graph, len(x.meta["val"].shape)
    inv = g.rsqrt(g.add(_channel(low, var, rank), eps))
    scale = 1.0 if w is None else _channel(low, w, rank)
    shift = 0.0 if b is None else _channel(low, b, rank)
    y = g.batchnorm_inference(low.tensor(x), _channel(low, mean, rank), inv, scale, shift)
    return (y, EMPTY, EMPTY)


def _batch_norm_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    x: Any,
    w: Any,
    running_mean: Any,
    running_var: Any,
    mean: Any,
    invstd: Any,
    training: bool,
    eps: float,
    mask: Sequence[bool],
) -> Any:
    rank = len(x.meta["val"].shape)
    if not training:
        return _frozen_batch_norm_backward(low, grad, x, w, running_mean, running_var, eps, mask)
    dx, dw, db = low.graph.batchnorm_backward(
        low.tensor(grad),
        low.tensor(x),
        _float_channel(low, w, rank),
        _float_channel(low, mean, rank),
        _float_channel(low, invstd, rank),
    )
    return (dx, *_as_torchs(low, w.meta["val"].dtype in HALF_TYPES, dw, db))  # the parameters' gradients


def _float_channel(low: Lowering, value: Any, rank: int) -> Any:
    """A batch norm's per-channel tensor as (1, C, 1, ...) in float32 (``_float32``)."""
    return _float32(low, value, _channel_dims(value, rank))


def _frozen_batch_norm_backward(
    low: Lowering, grad: Any, x: Any, w: Any, running_mean: Any, running_var: Any, eps: float, mask: Sequence[bool]
) -> Any:
    """The backward of a batch norm that normalized with its running statistics (a module in eval
    mode inside a training graph): pointwise in x, with inv = 1 / sqrt(running_var + eps),
    dx = dy * weight * inv, dweight = sum(dy * (x - running_mean) * inv), dbias = sum(dy)."""
    g, dy, rank = low.graph, low.tensor(grad), len(x.meta["val"].shape)
    inv = g.rsqrt(g.add(_channel(low, running_var, rank), eps))
    per_channel = _summed(x, [0, *range(2, rank)])
    dx = dw = db = None
    if mask[0]:
        dx = g.mul(dy, inv if w is None else g.mul(inv, _channel(low, w, rank)))
    if mask[1]:
        centered = g.sub(low.tensor(x), _channel(low, running_mean, rank))
        dw = g.mul(g.reduction(g.mul(dy, centered), "ADD", per_channel), inv)
    if mask[2]:
        db = g.reduction(dy, "ADD", per_channel)
    return (dx, dw, db)


def _group_norm(
    low: Lowering, node: torch.fx.Node, x: Any, w: Any, b: Any, n: int, c: int, hxw: int, group: int, eps: float
) -> Any:
    """(y, mean, rstd): the graph's statistics are (N, G, 1, ...), bound where torch's (N, G) are
    (the same elements); saved in a half type (torch's CPU rule for a half-type x and weight), a
    cast of the graph's float32."""
    rank = len(x.meta["val"].shape)
    y, mean, inv = low.graph.groupnorm(
        low.tensor(x),
        None if w is None else _channel(low, w, rank),
        None if b is None else _channel(low, b, rank),
        group,
        epsilon=eps,
    )
    assert mean is not None and inv is not None  # a training forward writes its statistics
    return (y, *_saved_statistics(low, node, mean, inv))


def _group_norm_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    x: Any,
    mean: Any,
    rstd: Any,
    w: Any,
    n: int,
    c: int,
    hxw: int,
    group: int,
    mask: Sequence[bool],
) -> Any:
    """(dx, dweight, dbias) from the saved (N, G) statistics, read as the graph's (N, G, 1, ...) in
    float32; without a weight, no parameter gradients (``_exact_group_norm_backward``)."""
    rank = len(x.meta["val"].shape)
    dx, dw, db = low.graph.groupnorm_backward(
        low.tensor(grad),
        low.tensor(x),
        None if w is None else _channel(low, w, rank),
        _group_statistic(low, mean, x, group),
        _group_statistic(low, rstd, x, group),
        group,
    )
    return (dx, dw, db)


def _group_statistic(low: Lowering, value: Any, x: Any, group: int) -> Any:
    """A group norm's saved (N, G) statistic as (N, G, 1, ...) in float32 (cast up from a half type)."""
    shape = x.meta["val"].shape
    return _float32(low, value, [shape[0], group, *([1] * (len(shape) - 2))])


def _exact_group_norm(x: Any, w: Any, b: Any, n: int, c: int, hxw: int, group: int, eps: float) -> bool:
    """x of two dims or more whose (N, C, spatial...) are the operator's N, C and HxW."""
    shape = x.meta["val"].shape
    return len(shape) >= 2 and (shape[0], shape[1], math.prod(shape[2:])) == (n, c, hxw)


def _exact_group_norm_backward(
    grad: Any, x: Any, mean: Any, rstd: Any, w: Any, n: int, c: int, hxw: int, group: int, mask: Sequence[bool]
) -> bool:
    """As the forward; a bias gradient needs the weight (the graph's parameter gradients come together)."""
    return _exact_group_norm(x, w, None, n, c, hxw, group, 0.0) and (_is_tensor(w) or not any(mask[1:]))


def _gelu(low: Lowering, node: torch.fx.Node, x: Any, approximate: str = "none") -> Any:
    return (low.graph.gelu_approx_tanh if approximate == "tanh" else low.graph.gelu)(low.tensor(x))


def _gelu_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any, approximate: str = "none") -> Any:
    backward = low.graph.gelu_approx_tanh_backward if approximate == "tanh" else low.graph.gelu_backward
    return backward(low.tensor(grad), low.tensor(x))


def _threshold_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any, threshold: float) -> Any:
    """torch's formula, ``x <= threshold ? 0 : grad``: grad where x is NaN (relu's backward reads
    relu's NaN-keeping output), where the graph's relu_backward gives NaN (cuDNN's propagated NaN)."""
    g = low.graph
    return g.binary_select(0.0, low.tensor(grad), g.cmp_le(low.tensor(x), threshold))


class Logical(Op):
    """A comparison, a logical operator, a select: booleans (the graph's BOOLEAN tensors) beside
    floating-point tensors."""

    types = (*FLOATS, torch.bool)


def _compared(a: Any, b: Any) -> bool:
    """A comparison of floating-point operands (a tensor and a tensor or number)."""
    return _binary(a, b) and all(not _is_tensor(v) or v.meta["val"].dtype in FLOATS for v in (a, b))


def _comparisons() -> dict[Any, Op]:
    """torch's comparisons, tensor to tensor or to a number, as the graph's (a BOOLEAN result)."""
    methods = {"eq": "cmp_eq", "ne": "cmp_neq", "gt": "cmp_gt", "ge": "cmp_ge", "lt": "cmp_lt", "le": "cmp_le"}
    return {
        getattr(getattr(aten, name), overload): Logical(
            lambda low, node, a, b, method=method: getattr(low.graph, method)(low.tensor(a), low.tensor(b)), _compared
        )
        for name, method in methods.items()
        for overload in ("Tensor", "Scalar")
    }


def _where(low: Lowering, node: torch.fx.Node, condition: Any, a: Any, b: Any) -> Any:
    """``condition ? a : b``."""
    return low.graph.binary_select(low.tensor(a), low.tensor(b), low.tensor(condition))


def _selects(condition: Any, a: Any, b: Any) -> bool:
    """A boolean condition choosing between floating-point tensors or numbers."""
    values = (a, b)
    return (
        _is_tensor(condition)
        and condition.meta["val"].dtype == torch.bool
        and all(not _is_tensor(v) or v.meta["val"].dtype in FLOATS for v in values)
    )


def _logical(method: str) -> Op:
    """torch's logical operators of boolean tensors."""
    return Logical(
        lambda low, node, *args: getattr(low.graph, method)(*(low.tensor(a) for a in args)),
        lambda *args: all(_is_tensor(a) and a.meta["val"].dtype == torch.bool for a in args),
    )


def _scalar_tensor(low: Lowering, node: torch.fx.Node, value: float, **options: Any) -> Any:
    """A tensor of no dims holding ``value`` (what torch's decompositions select against): a graph
    scalar passed by value, dims [1]."""
    return low.graph.scalar(value)


def _clamp(low: Lowering, node: torch.fx.Node, x: Any, min: float | None = None, max: float | None = None) -> Any:
    """torch's ``min(max(x, min), max)`` (the upper bound wins where they cross), NaN kept; a bound of
    None is none."""
    g, value = low.graph, low.tensor(x)
    value = value if min is None else g.max(value, min)
    return value if max is None else g.min(value, max)


def _leaky_relu(low: Lowering, node: torch.fx.Node, x: Any, negative_slope: float = 0.01) -> Any:
    """torch's ``x > 0 ? x : x * negative_slope`` (NaN times the slope: NaN)."""
    g, value = low.graph, low.tensor(x)
    return g.binary_select(value, g.mul(value, negative_slope), g.cmp_gt(value, 0.0))


def _leaky_relu_backward(
    low: Lowering, node: torch.fx.Node, grad: Any, x: Any, negative_slope: float, self_is_result: bool
) -> Any:
    """torch's ``x > 0 ? grad : grad * negative_slope`` (the slope where x is NaN); x may be the
    result (in place), of x's sign for a positive slope (the rule refuses others)."""
    g, gradient = low.graph, low.tensor(grad)
    return g.binary_select(gradient, g.mul(gradient, negative_slope), g.cmp_gt(low.tensor(x), 0.0))


def _sigmoid_backward(low: Lowering, node: torch.fx.Node, grad: Any, y: Any) -> Any:
    """torch's formula from the output, ``grad * (1 - y) * y``, in its order (the graph's sigmoid
    backward reads the input, as cuDNN's does)."""
    g, out = low.graph, low.tensor(y)
    return g.mul(g.mul(low.tensor(grad), g.sub(1.0, out)), out)


def _tanh_backward(low: Lowering, node: torch.fx.Node, grad: Any, y: Any) -> Any:
    """torch's formula from the output, ``grad * (1 - y * y)`` (the graph's reads the input)."""
    g, out = low.graph, low.tensor(y)
    return g.mul(low.tensor(grad), g.sub(1.0, g.mul(out, out)))


def _hardtanh(low: Lowering, node: torch.fx.Node, x: Any, min_val: float = -1.0, max_val: float = 1.0) -> Any:
    """``min(max(x, min_val), max_val)``: NaN stays NaN (relu6 is hardtanh from 0 to 6)."""
    return low.graph.max(low.graph.min(low.tensor(x), max_val), min_val)


def _hardtanh_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any, min_val: float, max_val: float) -> Any:
    """torch's formula, ``x <= min_val or x >= max_val ? 0 : grad`` (grad where x is NaN)."""
    g, xt = low.graph, low.tensor(x)
    return g.binary_select(0.0, low.tensor(grad), g.logical_or(g.cmp_le(xt, min_val), g.cmp_ge(xt, max_val)))


def _relu6_of_shifted(low: Lowering, x: Any) -> Any:
    """``min(max(x + 3, 0), 6)``, what hardsigmoid and hardswish divide by 6."""
    g = low.graph
    return g.min(g.max(g.add(low.tensor(x), 3.0), 0.0), 6.0)


def _hardsigmoid_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any) -> Any:
    """torch's formula, ``-3 < x < 3 ? grad / 6 : 0`` (0 where x is NaN)."""
    g, xt = low.graph, low.tensor(x)
    inside = g.logical_and(g.cmp_gt(xt, -3.0), g.cmp_lt(xt, 3.0))
    return g.binary_select(g.div(low.tensor(grad), 6.0), 0.0, inside)


def _hardswish_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any) -> Any:
    """torch's formula: 0 up to -3, ``grad * (x / 3 + 0.5)`` below 3, grad from 3 (and where x is NaN)."""
    g, xt, gradient = low.graph, low.tensor(x), low.tensor(grad)
    ramp = g.mul(gradient, g.add(g.div(xt, 3.0), 0.5))
    return g.binary_select(0.0, g.binary_select(ramp, gradient, g.cmp_lt(xt, 3.0)), g.cmp_le(xt, -3.0))


# ---- pooling ------------------------------------------------------------------------------------------


class Windows(NamedTuple):
    """A pooling's geometry as the graph's ``pooling`` takes it, one value per spatial dim."""

    window: list[int]
    stride: list[int]
    padding: list[int]


def _windows(x: Any, kernel: Sequence[int], stride: Sequence[int], padding: Any) -> Windows:
    """torch's pooling arguments as the graph's, one value per spatial dim of x (torch repeats a
    single value; an empty stride is the kernel)."""
    rank = len(x.meta["val"].shape) - 2

    def per_dim(values: Any) -> list[int]:
        values = [values] if isinstance(values, int) else list(values)
        return values * rank if len(values) == 1 else values

    window = per_dim(kernel)
    return Windows(window, per_dim(stride) if stride else window, per_dim(padding))


def _floor_windows(x: Any, geometry: Windows, ceil_mode: bool) -> bool:
    """Whether the windows are those the graph's pooling computes: torch's ceil_mode only where it adds
    no window (then every window, and each average's divisor, is the floor mode's)."""
    return not ceil_mode or all(
        output_size(size, window, pad, stride, True) == output_size(size, window, pad, stride)
        for size, window, stride, pad in zip(x.meta["val"].shape[2:], *geometry)
    )


def _average_mode(count_include_pad: bool) -> str:
    return "avg_include" if count_include_pad else "avg_exclude"


def _avg_pool(
    low: Lowering,
    node: torch.fx.Node,
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Any:
    return low.graph.pooling(low.tensor(x), _average_mode(count_include_pad), *_windows(x, kernel, stride, padding))


def _avg_pool_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Any,
) -> Any:
    geometry = _windows(x, kernel, stride, padding)
    mode = _average_mode(count_include_pad)
    return low.graph.pooling_backward(low.tensor(grad), low.tensor(x), mode, *geometry)


def _exact_average(
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> bool:
    """An average pool the graph's computes: its windows (``_floor_windows``), and a divisor_override
    only where it is the count already (the window's size, every window full or counted so)."""
    geometry = _windows(x, kernel, stride, padding)
    if divisor_override is not None:
        full = count_include_pad or not any(geometry.padding)
        if not full or divisor_override != math.prod(geometry.window):
            return False
    return _floor_windows(x, geometry, ceil_mode)


def _exact_average_backward(grad: Any, x: Any, *arguments: Any) -> bool:
    return _exact_average(x, *arguments)


def _cells(x: Any, output_size: Sequence[int]) -> Windows | None:
    """An adaptive pool's cells as one window and stride, where the output divides the input evenly
    (every cell then has one size and step); None where it does not."""
    sizes = x.meta["val"].shape[2:]
    if len(output_size) != len(sizes) or any(size % out for size, out in zip(sizes, output_size)):
        return None
    window = [size // out for size, out in zip(sizes, output_size)]
    return Windows(window, window, [0] * len(window))


def _adaptive_avg_pool(low: Lowering, node: torch.fx.Node, x: Any, output_size: Sequence[int]) -> Any:
    cells = _cells(x, output_size)
    assert cells is not None  # the rule takes only cells that divide the input evenly
    return low.graph.pooling(low.tensor(x), "avg_include", *cells)


def _adaptive_avg_pool_backward(low: Lowering, node: torch.fx.Node, grad: Any, x: Any) -> Any:
    cells = _cells(x, grad.meta["val"].shape[2:])
    assert cells is not None  # the rule takes only cells that divide the input evenly
    return low.graph.pooling_backward(low.tensor(grad), low.tensor(x), "avg_include", *cells)


def _max_pool(
    low: Lowering,
    node: torch.fx.Node,
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Any:
    """(y, None): the indices are never made (``MaxValues`` lowers only a node whose indices nothing reads)."""
    return (low.graph.pooling(low.tensor(x), "max", *_windows(x, kernel, stride, padding)), None)


def _exact_max(
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> bool:
    """Undilated windows (the graph's pooling has no dilation), ceil_mode only where it adds none."""
    dilations = [dilation] if isinstance(dilation, int) else list(dilation)
    return all(d == 1 for d in dilations) and _floor_windows(x, _windows(x, kernel, stride, padding), ceil_mode)


class MaxValues(Op):
    """``max_pool2d_with_indices`` whose indices nothing reads (an inference graph): its values lower.
    Indices read elsewhere (saved for the backward in training) would have to be torch's, which the
    graph's pooling does not make, so such a node stays on torch. Its backward,
    ``max_pool2d_with_indices_backward``, stays on torch too: the graph's recomputes the maxima from x
    and gives a window holding several NaN its gradient at the first, where torch's index is the last."""

    def accepts(self, node: torch.fx.Node) -> bool:
        reads_indices = any(user.target is not operator.getitem or user.args[1] != 0 for user in node.users)
        return not reads_indices and super().accepts(node)

    def results(self, node: torch.fx.Node) -> Any:
        return node.meta["val"][0]


POOLINGS = {
    aten.avg_pool2d.default: Op(_avg_pool, _exact_average),
    aten.avg_pool3d.default: Op(_avg_pool, _exact_average),
    aten.avg_pool2d_backward.default: Op(_avg_pool_backward, _exact_average_backward),
    aten.avg_pool3d_backward.default: Op(_avg_pool_backward, _exact_average_backward),
    aten._adaptive_avg_pool2d.default: Op(_adaptive_avg_pool, lambda x, size: _cells(x, size) is not None),
    aten._adaptive_avg_pool2d_backward.default: Op(
        _adaptive_avg_pool_backward, lambda grad, x: _cells(x, grad.meta["val"].shape[2:]) is not None
    ),
    aten.max_pool2d_with_indices.default: MaxValues(_max_pool, _exact_max),
}


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.fx.Node)


def _binary(a: Any, b: Any, alpha: Any = 1) -> bool:
    """A pointwise operator of a tensor and a tensor or number (torch's ``alpha`` only at 1)."""
    return (
        alpha == 1
        and (_is_tensor(a) or _is_tensor(b))
        and all(_is_tensor(v) or isinstance(v, float | int) for v in (a, b))
    )


# ---- attention -------------------------------------------------------------------------------------------


class Attention(Op):
    """An attention operator's lowering. Besides its floating-point tensors (query, key, value, out,
    logsumexp, gradients, a float mask) such an operator carries integer ones (the Philox seed and
    offset, which nothing reads without dropout) and sizes, so ``accepts`` asks of its floating-point
    tensors only that they be of static shape and of a type the graph takes, and leaves the rest to
    the operator's rule (``_attention_rule`` and the operator's own)."""

    def accepts(self, node: torch.fx.Node) -> bool:
        vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
        for val in vals:
            for value in val if isinstance(val, (tuple, list)) else [val]:
                if isinstance(value, torch.SymInt):
                    return False
                if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                    continue
                if value.dtype not in FLOATS or not all(isinstance(d, int) for d in (*value.shape, *value.stride())):
                    return False
        return self._accepts(*node.args, **node.kwargs)


def _attention_rule(q: Any, k: Any, v: Any, dropout_p: float, mask: Any = None) -> bool:
    """What every attention lowering needs: no dropout (torch's mask comes from its own generator, and
    its Philox seed and offset are outputs opendnn's would not reproduce), query, key and value of
    4 dims and one floating type, the query heads a multiple of the key's (grouped-query attention),
    and a mask, if any, of the query's type and of 2 to 4 dims (torch turns a boolean mask into a
    float one before the operator)."""
    query, key, value = (t.meta["val"] for t in (q, k, v))
    if dropout_p != 0 or any(t.dim() != 4 or t.dtype != query.dtype for t in (query, key, value)):
        return False
    if query.dtype not in FLOATS or query.shape[1] % key.shape[1] != 0:
        return False
    return mask is None or (mask.meta["val"].dtype == query.dtype and 2 <= mask.meta["val"].dim() <= 4)


def _attention_scale(q: Any, scale: float | None) -> float:
    """torch's scale: the one given, else 1 / sqrt(head dim) (where the graph's default is 1)."""
    return 1.0 / math.sqrt(q.meta["val"].shape[-1]) if scale is None else float(scale)


def _attention_bias(low: Lowering, mask: Any) -> Any:
    """A mask of 2 to 4 dims as the graph's bias of (B, H, Sq, Skv), its missing leading dims 1."""
    if mask is None:
        return None
    shape = list(mask.meta["val"].shape)
    return low.tensor(mask, [1] * (4 - len(shape)) + shape)


def _stats_dims(q: Any) -> list[int]:
    """The graph's statistics of a query (B, H, Sq, D): (B, H, Sq, 1)."""
    return [*q.meta["val"].shape[:3], 1]


def _as_logsumexp(stats: Any, logsumexp: torch.Tensor) -> Any:
    """The graph's statistics (B, H, Sq, 1) in torch's logsumexp memory: the CPU kernel's (B, H, Sq)
    is laid out (B, Sq, H), cuDNN's is (B, H, Sq, 1); a logsumexp unwritten (no element) or read by
    no node (no statistics: None) is EMPTY."""
    if stats is None:
        return EMPTY
    return stats.set_stride([*logsumexp.stride(), 1][:4])


def _sdpa_forward(
    low: Lowering, node: torch.fx.Node, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any
) -> tuple[Any, Any]:
    """(out, the rows' logsumexp (B, H, Sq, 1), None when torch's logsumexp has no element or no node
    reads it). Both are torch's: the natural log of the sum of exp of the scaled, masked scores (the
    graph's stats)."""
    saves = node.meta["val"][1].numel() > 0 and any(
        user.target is operator.getitem and user.args[1] == 1 for user in node.users
    )
    return low.graph.sdpa(
        low.tensor(q),
        low.tensor(k),
        low.tensor(v),
        attn_scale=_attention_scale(q, scale),
        is_inference=not saves,
        causal_mask=is_causal,
        bias=_attention_bias(low, mask),
    )


def _sdpa_backward(
    low: Lowering,
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    logsumexp: Any,
    mask: Any,
    is_causal: bool,
    scale: Any,
    mask_grad: bool = False,
) -> tuple[Any, ...]:
    """(dq, dk, dv), then the mask's gradient when ``mask_grad``, from torch's logsumexp viewed as
    the graph's (B, H, Sq, 1) statistics (the rules refuse a padded one)."""
    return low.graph.sdpa_backward(
        low.tensor(q),
        low.tensor(k),
        low.tensor(v),
        low.tensor(out),
        low.tensor(grad),
        low.tensor(logsumexp, _stats_dims(q)),
        attn_scale=_attention_scale(q, scale),
        bias=_attention_bias(low, mask),
        compute_dbias=mask_grad,
        causal_mask=is_causal,
    )


def _cpu_attention(
    low: Lowering,
    node: torch.fx.Node,
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Any = None,
    scale: float | None = None,
) -> Any:
    """(out, logsumexp) of torch's CPU kernel, whose logsumexp is 0 for a row no key takes part in
    (a float mask of -inf across it) where the graph's is -inf: so converted (the graph's scalars are
    finite: -inf is what lies below the type's lowest number), torch's own backward reads it as it
    reads its own."""
    out, stats = _sdpa_forward(low, node, q, k, v, attn_mask, is_causal, scale)
    if stats is None:
        return (out, EMPTY)
    g, val = low.graph, node.meta["val"][1]
    logsumexp = g.binary_select(0.0, stats, g.cmp_lt(stats, torch.finfo(val.dtype).min))
    return (out, _as_logsumexp(logsumexp, val))


def _cpu_attention_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    logsumexp: Any,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: Any = None,
    scale: float | None = None,
) -> Any:
    """(dq, dk, dv); a row of logsumexp 0 that no key takes part in gives no gradient, as its -inf."""
    return _sdpa_backward(low, grad, q, k, v, out, logsumexp, attn_mask, is_causal, scale)


def _flash_attention(
    low: Lowering,
    node: torch.fx.Node,
    q: Any,
    k: Any,
    v: Any,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    """FlashAttention's nine results: out, logsumexp (B, H, Sq), no sequence offsets, the sizes, and
    the Philox state and debug mask, which the region allocates without computing them (nothing
    reads them without dropout)."""
    out, stats = _sdpa_forward(low, node, q, k, v, None, is_causal, scale)
    val = node.meta["val"]
    return (out, _as_logsumexp(stats, val[1]), None, None, val[4], val[5], EMPTY, EMPTY, EMPTY)


def _flash_attention_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    logsumexp: Any,
    cum_seq_q: Any,
    cum_seq_k: Any,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: Any,
    philox_offset: Any,
    *,
    scale: float | None = None,
) -> Any:
    return _sdpa_backward(low, grad, q, k, v, out, logsumexp, None, is_causal, scale)


def _flash_rule(
    q: Any, k: Any, v: Any, dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False, **kw: Any
) -> bool:
    """No debug mask; causal only for as many queries as keys: FlashAttention aligns its causal mask
    at the bottom right, torch's (the graph's ``causal_mask``) at the top left, which agree there."""
    square = q.meta["val"].shape[2] == k.meta["val"].shape[2]
    return _attention_rule(q, k, v, dropout_p) and (square or not is_causal) and not return_debug_mask


def _efficient_attention(
    low: Lowering,
    node: torch.fx.Node,
    q: Any,
    k: Any,
    v: Any,
    attn_bias: Any,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    """The memory-efficient kernel's out, logsumexp (B, H, Sq; no element without compute_log_sumexp)
    and the Philox seed and offset, allocated and not computed."""
    out, stats = _sdpa_forward(low, node, q, k, v, attn_bias, is_causal, scale)
    return (out, _as_logsumexp(stats, node.meta["val"][1]), EMPTY, EMPTY)


def _efficient_attention_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    attn_bias: Any,
    out: Any,
    logsumexp: Any,
    philox_seed: Any,
    philox_offset: Any,
    dropout_p: float,
    grad_input_mask: Sequence[bool],
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    """(dq, dk, dv, the bias's gradient or None): that gradient in torch's memory, whose rows are
    padded to a multiple of 16 elements."""
    mask_grad = attn_bias is not None and grad_input_mask[3]
    grads = _sdpa_backward(low, grad, q, k, v, out, logsumexp, attn_bias, is_causal, scale, mask_grad)
    if not mask_grad:
        return (*grads, None)
    dq, dk, dv, dbias = grads
    return (dq, dk, dv, dbias.set_stride(node.meta["val"][3].stride()))


def _unpadded(q: Any, compute_log_sumexp: bool) -> bool:
    """The memory-efficient kernel's logsumexp has as many entries per row as queries: it pads its
    rows to a multiple of 32 (with +inf), which the graph's statistics do not hold, so the other query
    counts stay on torch."""
    return not compute_log_sumexp or q.meta["val"].shape[2] % 32 == 0


def _cudnn_attention(
    low: Lowering,
    node: torch.fx.Node,
    q: Any,
    k: Any,
    v: Any,
    attn_bias: Any,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    """cuDNN's nine results: out, logsumexp (B, H, Sq, 1: the graph's statistics as they are), no
    sequence offsets, the sizes, the Philox seed and offset (allocated, not computed), no debug mask."""
    out, stats = _sdpa_forward(low, node, q, k, v, attn_bias, is_causal, scale)
    val = node.meta["val"]
    return (out, _as_logsumexp(stats, val[1]), None, None, val[4], val[5], EMPTY, EMPTY, None)


def _cudnn_attention_backward(
    low: Lowering,
    node: torch.fx.Node,
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    logsumexp: Any,
    philox_seed: Any,
    philox_offset: Any,
    attn_bias: Any,
    cum_seq_q: Any,
    cum_seq_k: Any,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    *,
    scale: float | None = None,
) -> Any:
    return _sdpa_backward(low, grad, q, k, v, out, logsumexp, attn_bias, is_causal, scale)


def _efficient_backward_rule(
    grad: Any, q: Any, k: Any, v: Any, attn_bias: Any, out: Any, logsumexp: Any, *rest: Any, **kw: Any
) -> bool:
    """``_attention_rule`` (dropout_p is the tenth argument) and a logsumexp not padded (``_unpadded``)."""
    unpadded = logsumexp.meta["val"].shape[-1] == q.meta["val"].shape[2]
    return _attention_rule(q, k, v, rest[2], attn_bias) and unpadded


def _cudnn_backward_rule(
    grad: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    logsumexp: Any,
    seed: Any,
    offset: Any,
    attn_bias: Any,
    *rest: Any,
    **kw: Any,
) -> bool:
    """``_attention_rule`` (dropout_p is the fourteenth argument) and no sequence offsets (nested tensors)."""
    return rest[0] is None and _attention_rule(q, k, v, rest[4], attn_bias)


# the attention operators torch picks on the CPU and on CUDA, forward and backward
ATTENTION: dict[Any, Op] = {
    aten._scaled_dot_product_flash_attention_for_cpu.default: Attention(
        _cpu_attention,
        lambda q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None: _attention_rule(
            q, k, v, dropout_p, attn_mask
        ),
    ),
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: Attention(
        _cpu_attention_backward,
        lambda grad, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None: _attention_rule(
            q, k, v, dropout_p, attn_mask
        ),
    ),
    aten._scaled_dot_product_flash_attention.default: Attention(_flash_attention, _flash_rule),
    aten._scaled_dot_product_flash_attention_backward.default: Attention(
        _flash_attention_backward,
        lambda grad, q, k, v, out, lse, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *rest, **kw: (
            cum_seq_q is None and _flash_rule(q, k, v, dropout_p, is_causal)
        ),
    ),
    aten._scaled_dot_product_efficient_attention.default: Attention(
        _efficient_attention,
        lambda q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, *rest, **kw: (
            _attention_rule(q, k, v, dropout_p, attn_bias) and _unpadded(q, compute_log_sumexp)
        ),
    ),
    aten._scaled_dot_product_efficient_attention_backward.default: Attention(
        _efficient_attention_backward, _efficient_backward_rule
    ),
    aten._scaled_dot_product_cudnn_attention.default: Attention(
        _cudnn_attention,
        lambda q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, debug=False, **kw: (
            _attention_rule(q, k, v, dropout_p, attn_bias) and not debug
        ),
    ),
    aten._scaled_dot_product_cudnn_attention_backward.default: Attention(
        _cudnn_attention_backward, _cudnn_backward_rule
    ),
}


# ---- concatenation and slices ------------------------------------------------------------------------


def _concatenate(low: Lowering, node: torch.fx.Node, tensors: Sequence[Any], dim: int = 0) -> Any:
    """torch.cat as the graph's concatenate, of the tensors that hold elements: torch skips an empty
    one-dimensional tensor whatever the others' dims, and an empty one of their rank adds nothing."""
    rank = node.meta["val"].dim()
    joined = [low.tensor(t) for t in tensors if t.meta["val"].numel() > 0]
    return low.graph.concatenate(joined, dim % rank)


def _converts(
    x: Any,
    *,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    non_blocking: bool = False,
    memory_format: Any = None,
) -> bool:
    """``aten._to_copy`` that converts the type alone (autocast's casts), on x's device: the graph's
    identity into a tensor of the new type (``_follow_torch`` gives it the type)."""
    same_device = device is None or torch.device(device) == x.meta["val"].device
    kept = layout in (None, torch.strided) and memory_format in (None, torch.preserve_format) and not pin_memory
    return dtype is not None and same_device and kept


def _stack(low: Lowering, node: torch.fx.Node, tensors: Sequence[Any], dim: int = 0) -> Any:
    """torch.stack as the graph's concatenate of each tensor viewed with a dim of 1 at ``dim``."""
    rank = node.meta["val"].dim()
    shape = list(tensors[0].meta["val"].shape)
    wide = [*shape[: dim % rank], 1, *shape[dim % rank :]]
    return low.graph.concatenate([low.tensor(t, wide) for t in tensors], dim % rank)


def _concatenates(tensors: Sequence[Any], dim: int = 0) -> bool:
    """A concatenation of tensors of one type (torch promotes mixed ones) into a result that holds
    elements (the graph's tensors hold at least one)."""
    if not all(_is_tensor(t) for t in tensors):
        return False
    vals = [t.meta["val"] for t in tensors]
    return len({v.dtype for v in vals}) == 1 and any(v.numel() > 0 for v in vals)


class View(Op):
    """An operator whose result views its input's memory: torch's views (``VIEWS``), the slices of
    torch.cat's backward. A view of a region input is torch's view of the argument, taken at every
    call (``InputView``); a view of a computed tensor is the graph's slice or reshape, which copies
    nothing; a view that is a result of the region is torch's view of the graph output it views
    (``Lowering._outputs``)."""

    types = (*FLOATS, torch.bool)

    def accepts(self, node: torch.fx.Node) -> bool:
        val = node.meta.get("val")
        results = val if isinstance(val, (tuple, list)) else [val]
        return (
            all(isinstance(r, torch.Tensor) and r.numel() > 0 for r in results)
            and not any(isinstance(a, torch.fx.Node) for a in (*node.args[1:], *node.kwargs.values()))
            and super().accepts(node)
        )


def _view(low: Lowering, node: torch.fx.Node, x: Any, *args: Any) -> Any:
    """torch's view of a region input, or the graph's reshape of a computed tensor in the strides torch
    gives the view of a tensor of its strides."""

    def make(tensor: og.Tensor) -> og.Tensor:
        val = x.meta["val"]
        like = torch.empty_strided(val.shape, tensor.get_stride() if val.dim() else (), device="meta")
        view: Any = node.target
        probe = view(like, *args)
        if probe.storage_offset():
            raise Refused(f"{node.name} views {x.name} from element {probe.storage_offset()}")
        return low.graph.reshape(tensor, list(probe.shape) or [1], list(probe.stride()) or [1])

    return _viewed(low, x, make, ((node.target, _frozen(args)),))


def _viewed(low: Lowering, x: torch.fx.Node, make: Callable[[og.Tensor], og.Tensor], steps: Steps) -> Any:
    """``x`` viewed by torch's ``steps``: of a region input, torch's own view (an InputView); of a
    computed tensor, the LazyView whose ``make`` adds the graph's view of its graph tensor."""
    source = low.source(x)
    if isinstance(source, InputView):
        return InputView(source.argument, (*source.steps, *steps))
    root, before = (source.root, source.steps) if isinstance(source, LazyView) else (x, ())
    return LazyView(x, make, root, (*before, *steps))


def _frozen(value: Any) -> Any:
    """``value`` with its lists as tuples (an InputView's steps are a key)."""
    return tuple(map(_frozen, value)) if isinstance(value, (list, tuple)) else value


def _split(low: Lowering, node: torch.fx.Node, x: Any, sizes: Any, dim: int = 0) -> Any:
    """``aten.split.Tensor`` / ``split_with_sizes``: slices of ``x`` along ``dim``, one per result."""
    pieces = node.meta["val"]
    dim %= len(pieces[0].shape)
    split, start, views = (node.target, _frozen((sizes, dim))), 0, []
    for k, piece in enumerate(pieces):
        end = start + piece.shape[dim]
        views.append(_viewed(low, x, _slicing(low, dim, start, end), (split, (operator.getitem, (k,)))))
        start = end
    return views


def _slice(
    low: Lowering, node: torch.fx.Node, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Any:
    dim %= node.meta["val"].dim()
    return _viewed(low, x, _slicing(low, dim, start, end, step), ((node.target, (dim, start, end, step)),))


def _slicing(low: Lowering, dim: int, start: Any, end: Any, step: int = 1) -> Callable[[og.Tensor], og.Tensor]:
    """The graph's slice of a tensor along ``dim``."""
    return lambda tensor: low.graph.slice(tensor, [slice(None)] * dim + [slice(start, end, step)])


def _select(low: Lowering, node: torch.fx.Node, x: Any, dim: int, index: int) -> Any:
    """``aten.select.int``: the element ``index`` of ``x`` along ``dim``, the dim dropped."""
    return _selected(low, x, dim, index, ((node.target, (dim, index)),))


def _unbind(low: Lowering, node: torch.fx.Node, x: Any, dim: int = 0) -> Any:
    """``aten.unbind.int``: each element of ``x`` along ``dim`` (a packed QKV's q, k and v)."""
    count = x.meta["val"].shape[dim]
    return [_selected(low, x, dim, k, ((node.target, (dim,)), (operator.getitem, (k,)))) for k in range(count)]


def _selected(low: Lowering, x: Any, dim: int, index: int, steps: Steps) -> Any:
    """The element ``index`` of ``x`` along ``dim``, the dim dropped, which torch's ``steps`` take: a
    slice of one element, then a reshape without its dim."""
    shape = x.meta["val"].shape
    dim %= len(shape)
    index %= shape[dim]

    def make(tensor: og.Tensor) -> og.Tensor:
        piece = _slicing(low, dim, index, index + 1)(tensor)
        dims = [d for k, d in enumerate(piece.get_dim()) if k != dim] or [1]
        strides = [s for k, s in enumerate(piece.get_stride()) if k != dim] or [1]
        return low.graph.reshape(piece, dims, strides)

    return _viewed(low, x, make, steps)


VIEWS: dict[Any, Op] = {
    **{
        op: View(_view)
        for op in (
            aten.view.default,
            aten._unsafe_view.default,
            aten.reshape.default,
            aten.permute.default,
            aten.transpose.int,
            aten.t.default,
            aten.unsqueeze.default,
            aten.squeeze.dim,
            aten.squeeze.dims,
            aten.squeeze.default,
            aten.expand.default,
            aten.alias.default,
            aten.detach.default,
        )
    },
    aten.split.Tensor: View(_split),
    aten.select.int: View(_select),
    aten.unbind.int: View(_unbind),
    aten.split_with_sizes.default: View(_split),
    aten.slice.Tensor: View(
        _slice,
        lambda x, dim=0, start=None, end=None, step=1: (
            all(v is None or isinstance(v, int) for v in (start, end, step)) and step >= 1
        ),
    ),
}


CONCATENATION: dict[Any, Op] = {
    aten.cat.default: Op(_concatenate, _concatenates),
    aten.stack.default: Op(_stack, _concatenates),
}


LOWERINGS: dict[Any, Op] = {
    aten.convolution.default: Op(_convolution),
    aten.convolution_backward.default: Op(_convolution_backward),
    aten.mm.default: _pointwise("matmul"),
    aten.bmm.default: _pointwise("matmul"),
    aten.addmm.default: Op(_addmm, lambda bias, a, b, beta=1, alpha=1: beta == 1 and alpha == 1),
    aten.add.Tensor: Op(lambda low, node, a, b, alpha=1: low.graph.add(low.tensor(a), low.tensor(b)), _binary),
    aten.sub.Tensor: Op(lambda low, node, a, b, alpha=1: low.graph.sub(low.tensor(a), low.tensor(b)), _binary),
    aten.mul.Tensor: Op(lambda low, node, a, b: low.graph.mul(low.tensor(a), low.tensor(b)), _binary),
    aten.div.Tensor: Op(lambda low, node, a, b: low.graph.div(low.tensor(a), low.tensor(b)), _binary),
    aten.add.Scalar: Op(lambda low, node, a, b, alpha=1: low.graph.add(low.tensor(a), b), _binary),
    aten.sub.Scalar: Op(lambda low, node, a, b, alpha=1: low.graph.sub(low.tensor(a), b), _binary),
    aten.mul.Scalar: Op(lambda low, node, a, b: low.graph.mul(low.tensor(a), b), _binary),
    aten.div.Scalar: Op(lambda low, node, a, b: low.graph.div(low.tensor(a), b), _binary),
    aten.neg.default: _pointwise("neg"),
    aten.exp.default: _pointwise("exp"),
    aten.sqrt.default: _pointwise("sqrt"),
    aten.rsqrt.default: _pointwise("rsqrt"),
    aten.relu.default: _pointwise("relu"),
    aten.sigmoid.default: _pointwise("sigmoid"),
    aten.tanh.default: _pointwise("tanh"),
    aten.sigmoid_backward.default: Op(_sigmoid_backward),
    aten.tanh_backward.default: Op(_tanh_backward),
    aten.clamp.default: Op(
        _clamp, lambda x, min=None, max=None: all(v is None or isinstance(v, float | int) for v in (min, max))
    ),
    aten.leaky_relu.default: Op(_leaky_relu),
    aten.leaky_relu_backward.default: Op(
        _leaky_relu_backward, lambda grad, x, slope, self_is_result: slope > 0 or not self_is_result
    ),
    **_comparisons(),
    aten.where.self: Logical(_where, _selects),
    aten.logical_and.default: _logical("logical_and"),
    aten.logical_or.default: _logical("logical_or"),
    aten.logical_not.default: _logical("logical_not"),
    aten.scalar_tensor.default: Op(
        _scalar_tensor, lambda value, **options: isinstance(value, float | int) and not isinstance(value, bool)
    ),
    aten.silu.default: Op(lambda low, node, x: low.graph.swish(low.tensor(x), 1.0)),
    aten.silu_backward.default: Op(
        lambda low, node, grad, x: low.graph.swish_backward(low.tensor(grad), low.tensor(x), 1.0)
    ),
    aten.hardtanh.default: Op(_hardtanh),
    aten.hardtanh_backward.default: Op(_hardtanh_backward),
    aten.hardsigmoid.default: Op(lambda low, node, x: low.graph.div(_relu6_of_shifted(low, x), 6.0)),
    aten.hardsigmoid_backward.default: Op(_hardsigmoid_backward),
    aten.hardswish.default: Op(
        lambda low, node, x: low.graph.div(low.graph.mul(low.tensor(x), _relu6_of_shifted(low, x)), 6.0)
    ),
    aten.hardswish_backward.default: Op(_hardswish_backward),
    aten.gelu.default: Op(_gelu),
    aten.gelu_backward.default: Op(_gelu_backward),
    aten.threshold_backward.default: Op(_threshold_backward),
    aten._softmax.default: Op(_softmax, lambda x, dim, half_to_float: not half_to_float),
    aten._log_softmax.default: Op(
        lambda low, node, x, dim, half_to_float: _softmax(low, node, x, dim, half_to_float, log=True),
        lambda x, dim, half_to_float: not half_to_float,
    ),
    aten._softmax_backward_data.default: Op(_softmax_backward, _same_dtype),
    aten._log_softmax_backward_data.default: Op(_log_softmax_backward, _same_dtype),
    **ATTENTION,
    **REDUCTIONS,
    **CONCATENATION,
    **VIEWS,
    aten.clone.default: Op(lambda low, node, x, memory_format=None: low.graph.identity(low.tensor(x))),
    aten._to_copy.default: Op(lambda low, node, x, **kwargs: low.graph.identity(low.tensor(x)), _converts),
    **POOLINGS,
    aten.native_layer_norm.default: Op(_layer_norm, lambda x, normalized, w, b, eps: _is_tensor(w) and _is_tensor(b)),
    aten.native_layer_norm_backward.default: Op(
        _layer_norm_backward, lambda grad, x, normalized, mean, rstd, w, b, mask: _is_tensor(w) and _is_tensor(b)
    ),
    aten.native_group_norm.default: Op(_group_norm, _exact_group_norm),
    aten.native_group_norm_backward.default: Op(_group_norm_backward, _exact_group_norm_backward),
    aten._native_batch_norm_legit_functional.default: Op(
        _batch_norm_training,
        lambda x, w, b, mean, var, training, *rest: training and all(map(_is_tensor, (w, b, mean, var))),
    ),
    aten._native_batch_norm_legit.no_stats: Op(
        _batch_norm_without_statistics, lambda x, w, b, training, *rest: training and _is_tensor(w) and _is_tensor(b)
    ),
    aten._native_batch_norm_legit_no_training.default: Op(
        _batch_norm_inference, lambda x, w, b, mean, var, *rest: _is_tensor(mean) and _is_tensor(var)
    ),
    aten.native_batch_norm_backward.default: Op(
        _batch_norm_backward,
        lambda grad, x, w, rm, rv, mean, invstd, training, *rest: (
            _is_tensor(w) if training else _is_tensor(rm) and _is_tensor(rv)
        ),
    ),
}


# ---- the regions and the backend ---------------------------------------------------------------------


class Built:
    """A region's graph built for one signature of its inputs: how each argument binds, the outputs
    to allocate, the workspace."""

    def __init__(self, lowering: Lowering, heur_mode: og.HeurMode) -> None:
        graph = self.graph = lowering.graph
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([heur_mode])
        graph.check_support()
        graph.build_plans()
        # (graph tensor, the argument's view, the dims it is reshaped to or None for its own)
        self.inputs = [
            (tensor, view, None if dims == tuple(view.of(lowering.args).shape) else dims)
            for (view, dims), tensor in lowering.inputs.items()
        ]
        self.outputs = lowering.outputs
        self.workspace_size = graph.get_workspace_size()
        self.workspace: torch.Tensor | None = None

    def __call__(self, args: Sequence[Any]) -> list[torch.Tensor]:
        device = _tensors(args)[0].device
        pack: dict[og.Tensor | str, Any] = {
            tensor: view.of(args) if dims is None else view.of(args).reshape(dims) for tensor, view, dims in self.inputs
        }
        results = []
        for result in self.outputs:
            if result.input is not None:  # a view of an input
                results.append(result.input.of(args))
                continue
            tensor, shape, strides = result.tensor, result.shape, result.strides
            if tensor is None:  # no element: nothing to compute
                results.append(torch.empty_strided(shape, strides, dtype=result.dtype, device=device))
                continue
            if tensor not in pack:  # in torch's memory order, the graph tensor's (_follow_torch)
                allocated = torch.empty_strided(shape, strides, dtype=result.dtype, device=device)
                pack[tensor] = allocated.view(tensor.get_dim())
            results.append(_replayed(pack[tensor].view(shape), result.steps))
        if self.workspace is None and self.workspace_size:
            self.workspace = (
                kept_buffer(self.workspace_size, device.index)
                if device.type == "cuda"
                else torch.empty(self.workspace_size, dtype=torch.uint8)
            )
        self.graph.execute(pack, self.workspace)
        self.graph.drop_kept_binding()  # the outputs are new at every call: a kept binding would only hold them
        return results


class OpendnnRegion(torch.nn.Module):
    """A region of the FX graph run as an opendnn graph plan, built per signature of its inputs
    (falling back to the region's FX graph on torch where opendnn refuses it)."""

    def __init__(
        self, module: torch.fx.GraphModule, backend: OpendnnBackend, name: str, heur_mode: og.HeurMode | None
    ) -> None:
        super().__init__()
        self.module, self.backend, self.region, self.heur_mode = module, backend, name, heur_mode
        self.single = not isinstance(_returned(module), (tuple, list))
        self.built: dict[tuple[Any, ...], Built | None] = {}

    def forward(self, *args: Any) -> Any:
        key = tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        if key not in self.built:
            self.built[key] = self._build(args)
        built = self.built[key]
        if built is None:
            return self.module(*args)
        results = built(args)
        self.backend.plans_executed += 1
        return results[0] if self.single else tuple(results)

    def _build(self, args: Sequence[Any]) -> Built | None:
        handle = self.backend.handle(_tensors(args)[0].device)
        heur_mode = self.heur_mode or (og.HeurMode.FALLBACK if handle.device == "cpu" else og.HeurMode.A)
        try:
            built = Built(Lowering(self.module, args, handle, self.region), heur_mode)
        except (Refused, OpenDnnError) as error:
            self.backend.fallbacks.append(f"{self.region}: {error}")
            return None
        self.backend.plans.append(built.graph.plan)
        return built


def _computes(module: torch.fx.GraphModule) -> bool:
    """Whether a region computes enough for a plan: two operators or more besides its views, or an
    attention operator (a lone operator between views stays on torch, as a lone node does)."""
    calls = [n.target for n in module.graph.nodes if n.op == "call_function"]
    computed = [target for target in calls if target not in VIEWS and target is not operator.getitem]
    return len(computed) > 1 or any(target in ATTENTION for target in computed)


def _returned(module: torch.fx.GraphModule) -> Any:
    return next(n for n in module.graph.nodes if n.op == "output").args[0]


class Supported(OperatorSupportBase):
    """The nodes a region may hold: an operator of ``LOWERINGS`` that accepts its arguments, or an
    item of such a node's outputs."""

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, torch.fx.Node) and self.is_node_supported(submodules, source)
        op = LOWERINGS.get(node.target)
        return op is not None and op.accepts(node)


def boxed(module: torch.fx.GraphModule) -> Callable[[list[Any]], Any]:
    """``module`` under aot_autograd's boxed calling convention: called with the list of inputs, it
    empties the list before running, so that each input can be freed as soon as the graph is done
    with it (torch's cudagraph trees assert the list is empty after a call)."""

    def run(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        return module(*inputs)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def cuda_graph_refusal(module: torch.fx.GraphModule, inputs: Sequence[Any], fixed: int) -> str | None:
    """Why ``module`` (an FX graph aot_autograd hands over) does not run as a CUDA graph; None when
    it does: every input a CUDA tensor of static shape, and torch's "cudagraphs" backend's own checks
    pass (no input mutated but the first ``fixed``, the parameters and buffers; one device; no CPU
    node; no operator a capture cannot hold)."""
    for k, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            return f"input {k} is {type(value).__name__} {value}, not a tensor (a dynamic size)"
        if value.device.type != "cuda":
            return f"input {k} is on {value.device}, not a CUDA device"
        if not all(isinstance(d, int) for d in (*value.shape, *value.stride())):
            return f"input {k} has a dynamic shape {list(value.shape)}"
    return check_for_skip(module, fixed)


class CudaGraphs:
    """The CUDA graphs of one compiled model: its forward (or inference) graph and its backward graph
    compiled to opendnn plans, then given to torch's cudagraph trees as torch's "cudagraphs" backend
    gives them, when ``cuda_graph_refusal`` finds nothing against it. The backward is captured only
    when its forward is; a backward not captured after a captured forward tells the trees it runs."""

    def __init__(self, backend: OpendnnBackend, compile_graph: Callable[..., Any], dynamo_inputs: int) -> None:
        self.backend, self.compile_graph, self.dynamo_inputs = backend, compile_graph, dynamo_inputs
        self.forward_captured = BoxedBool(True)
        self.device_index = BoxedDeviceIndex(None)

    def forward(self, module: torch.fx.GraphModule, inputs: list[Any], is_inference: bool = False) -> Any:
        fixed = num_fw_fixed_arguments(self.dynamo_inputs, len(inputs))
        refusal = self._refusal(module, inputs, fixed)
        if refusal is not None:
            BoxedBool.disable(self.forward_captured)
            return self.compile_graph(module, inputs)
        self.device_index.set(get_device_index(module))
        return self._captured(module, inputs, fixed, is_backward=False, is_inference=is_inference)

    def backward(self, module: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        if not self.forward_captured:
            return self.compile_graph(module, inputs)
        fixed = count_tangents(module)
        if self._refusal(module, inputs, fixed) is None:
            return self._captured(module, inputs, fixed, is_backward=True, is_inference=False)
        compiled = self.compile_graph(module, inputs)
        index = self.device_index.value

        def run(args: list[Any]) -> Any:  # torch's cudagraphs backend's "backward generation handling"
            manager = torch._inductor.cudagraph_trees.get_manager(index or 0, create_if_none_exists=False)
            assert manager is not None, "a captured forward has a cudagraph tree manager"
            manager.set_to_running_backward()
            return compiled(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _refusal(self, module: torch.fx.GraphModule, inputs: list[Any], fixed: int) -> str | None:
        refusal = cuda_graph_refusal(module, inputs, fixed)
        name = f"graph{self.backend.graphs}"
        if refusal is None:
            self.backend.captured.append(name)
            return None
        self.backend.uncaptured.append(f"{name}: {refusal}")
        if any(isinstance(value, torch.Tensor) and value.device.type == "cuda" for value in inputs):
            log_cudagraph_skip_and_bump_counter(f"skipping cudagraphs due to {refusal}")  # torch's warning
        return refusal

    def _captured(self, module: torch.fx.GraphModule, inputs: list[Any], fixed: int, **kind: bool) -> Any:
        """``module`` compiled, then cudagraphified (read from the graph as aot_autograd gave it, before
        the regions replace its nodes)."""
        from torch._inductor.cudagraph_trees import cudagraphify_impl

        device_index = self.device_index.value if self.device_index.value is not None else get_device_index(module)
        described = dict(
            device_index=device_index,
            stack_traces=get_stack_traces(module),
            placeholders=get_placeholder_info(module.graph),
            mutated_input_idxs=find_input_mutations(module.graph),
        )
        compiled = cudagraphify_impl(self.compile_graph(module, inputs), inputs, range(fixed), **kind, **described)
        compiled._boxed_call = True  # type: ignore[attr-defined]
        return compiled


class OpendnnBackend:
    """The torch.compile backend (``backend="opendnn"`` is one, registered with torch; an instance of
    one's own counts its own plans).

    Attributes:
        plans_executed: how many times a region ran as an opendnn plan (a CUDA graph's replay runs
            none: only its warm-up and its recording count).
        graphs: how many FX graphs it compiled (a forward and a backward each count).
        regions: the regions of every graph compiled so far, by name.
        plans: the plan built for each region and signature of its inputs.
        fallbacks: each region that runs on torch, with opendnn's reason.
        captured: the FX graphs that run as CUDA graphs, by name ("graph0").
        uncaptured: each FX graph that does not, with the reason ("graph0: input 0 is on cpu, not a
            CUDA device"); both stay empty unless ``options={"cudagraphs": True}``.
    """

    def __init__(self) -> None:
        self.plans_executed = 0
        self.graphs = 0
        self.regions: list[str] = []
        self.plans: list[og.ExecutionPlan] = []
        self.fallbacks: list[str] = []
        self.captured: list[str] = []
        self.uncaptured: list[str] = []
        self._handles: dict[torch.device, od.Handle] = {}

    def __call__(
        self, model: torch.fx.GraphModule, example_inputs: Sequence[Any], options: dict[str, Any] | None = None
    ) -> Any:
        """Compile ``model``. ``options``: ``"heur_mode"`` (an og.HeurMode or its value), the heuristics
        every region's plan is built with; ``"cudagraphs"`` (default False): True runs each graph of
        static-shape CUDA tensors as a CUDA graph (``CudaGraphs``)."""
        options = options or {}
        heur_mode = options.get("heur_mode")
        compiler = functools.partial(
            self.compile_graph, heur_mode=None if heur_mode is None else og.HeurMode(heur_mode)
        )
        if not options.get("cudagraphs", False):
            return aot_autograd(fw_compiler=compiler, bw_compiler=compiler)(model, example_inputs)
        graphs = CudaGraphs(self, compiler, len(example_inputs))
        return aot_autograd(
            fw_compiler=graphs.forward,
            bw_compiler=graphs.backward,
            inference_compiler=functools.partial(graphs.forward, is_inference=True),
            keep_inference_input_mutations=torch._dynamo.config.cudagraph_backend_keep_input_mutation,
        )(model, example_inputs)

    def compile_graph(
        self, module: torch.fx.GraphModule, example_inputs: Sequence[Any], heur_mode: og.HeurMode | None = None
    ) -> Callable[..., Any]:
        """``module`` with each region of two supported operators or more besides its views, or of an
        attention operator (one kernel of its own, between operators left to torch), run as an
        opendnn plan, built with ``heur_mode`` (None: the reference engine
        on the CPU, the fusion engine on CUDA)."""
        partitioner = CapabilityBasedPartitioner(
            module,
            Supported(),
            allows_single_node_partition=False,
            allowed_single_node_partition_ops=[_get_qualified_name(target) for target in ATTENTION],
        )
        fused = partitioner.fuse_partitions(partitioner.propose_partitions())
        for node in fused.graph.nodes:
            if node.op == "call_module" and node.target.startswith("fused_") and _computes(getattr(fused, node.target)):
                name = f"graph{self.graphs}.{node.target}"
                setattr(fused, node.target, OpendnnRegion(getattr(fused, node.target), self, name, heur_mode))
                self.regions.append(name)
        fused.recompile()
        self.graphs += 1
        return boxed(fused)

    def handle(self, device: torch.device) -> od.Handle:
        if device not in self._handles:
            self._handles[device] = od.Handle(str(device))
        return self._handles[device]


# torch.compile finds it by name through the torch_dynamo_backends entry point (pyproject.toml), which
# imports this module only when a model is compiled with backend="opendnn"
opendnn_backend = OpendnnBackend()
