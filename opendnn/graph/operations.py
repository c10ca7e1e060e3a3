"""The operations a graph holds: each one's input and output roles and its shape and dtype rule.

A rule reads the dims and data types of a node's inputs (``Shape``), its attributes and the dims
its outputs already have (the caller's choice where the dims are not unique: a strided
``conv_dgrad``, a ``reduction``), and gives each output's dims and, where the operation fixes it,
its data type (statistics are FLOAT, DOUBLE for DOUBLE data; a convolution's output has its
input's type). The builder runs the rule when it adds a node, ``validate`` runs it again over the
finished graph; every error names the node and the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, NamedTuple

from opendnn import PointwiseMode, ReduceTensorOp
from opendnn.core.descriptors import TensorDescriptor, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status
from opendnn.families.attention.problem import (
    FP8_AMAX,
    FP8_BACKWARD_AMAX,
    FP8_BACKWARD_SCALES,
    FP8_SCALES,
    SLOTS,
    AttentionDescriptor,
    SlotNames,
    attention_problem,
)

Dims = tuple[int, ...]


class Shape(NamedTuple):
    """What a rule knows of an input tensor."""

    name: str
    dims: Dims
    dtype: DataType
    by_value: bool = False


class OutputSpec(NamedTuple):
    """An output's dims and, when the operation fixes it, its data type (None: the tensor's role decides)."""

    dims: Dims
    dtype: DataType | None = None


@dataclass(frozen=True)
class Operation:
    """An operation kind: its input roles (``optional`` may be absent), output roles and rule;
    ``memory_order``: the outputs whose strides, when not set, follow an input's memory order (the
    largest of the listed inputs of the output's rank, as cudnn-frontend infers them: a channels-last
    image gives a channels-last output); every other output is packed row-major."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    rule: Callable[[str, Mapping[str, Shape], Mapping[str, Any], Mapping[str, Dims]], dict[str, OutputSpec]]
    optional: tuple[str, ...] = ()
    memory_order: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    numbered: str | None = None  # the inputs of an operation of any number of them: x0, x1, ... in order

    def takes(self, role: str) -> bool:
        """Whether ``role`` names one of the operation's inputs."""
        if self.numbered is not None and role.startswith(self.numbered):
            index = role[len(self.numbered) :]
            return index.isdigit() and role == f"{self.numbered}{int(index)}"
        return role in self.inputs


def label(node_name: str, op: str) -> str:
    """How errors name a node: ``node 'conv_0' (conv_fprop)``."""
    return f"node '{node_name}' ({op})"


def fail(where: str, message: str) -> BadParam:
    return BadParam(f"{where}: {message}", Status.BAD_PARAM_SHAPE_MISMATCH)


def compute_type(dtype: DataType) -> DataType:
    """FLOAT, or DOUBLE for DOUBLE data: the type of statistics and accumulations."""
    return DataType.DOUBLE if dtype is DataType.DOUBLE else DataType.FLOAT


def require_float(where: str, role: str, shape: Shape) -> None:
    if not shape.dtype.is_floating:
        raise BadParam(
            f"{where}: {role} '{shape.name}' data type {shape.dtype.name} must be FLOAT, HALF, BFLOAT16 or DOUBLE",
            Status.BAD_PARAM,
        )


def require_dims(where: str, role: str, shape: Shape, dims: Dims, why: str) -> None:
    if shape.dims != dims:
        raise fail(where, f"{role} '{shape.name}' dims {list(shape.dims)} must be {list(dims)} ({why})")


def broadcast(where: str, shapes: list[tuple[str, Shape]]) -> Dims:
    """NumPy's broadcast of the inputs' dims (missing leading dims are 1)."""
    rank = max(len(s.dims) for _, s in shapes)
    result = [1] * rank
    for role, shape in shapes:
        padded = (1,) * (rank - len(shape.dims)) + shape.dims
        for k, d in enumerate(padded):
            if d != 1 and result[k] not in (1, d):
                others = ", ".join(f"{r} '{s.name}' {list(s.dims)}" for r, s in shapes)
                raise fail(
                    where,
                    f"{role} '{shape.name}' dims {list(shape.dims)} do not broadcast with the other inputs ({others})",
                )
            result[k] = max(result[k], d)
    return tuple(result)


# ---- pointwise, reduction, genstats -------------------------------------------------------------------

RELATIONAL = frozenset(
    {
        PointwiseMode.CMP_EQ,
        PointwiseMode.CMP_NEQ,
        PointwiseMode.CMP_GT,
        PointwiseMode.CMP_GE,
        PointwiseMode.CMP_LT,
        PointwiseMode.CMP_LE,
        PointwiseMode.LOGICAL_AND,
        PointwiseMode.LOGICAL_OR,
        PointwiseMode.LOGICAL_NOT,
    }
)
POINTWISE_ROLES = ("a", "b", "c")


def enum_attribute(where: str, kind: Any, attributes: Mapping[str, Any], key: str) -> Any:
    """The member of enum ``kind`` an attribute names (a deserialized graph may name none)."""
    try:
        return kind(attributes.get(key))
    except ValueError:
        raise BadParam(f"{where}: {key}={attributes.get(key)!r} must be one of {[m.value for m in kind]}") from None


def pointwise_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    mode = enum_attribute(where, PointwiseMode, attributes, "mode")
    if sorted(inputs) != list(POINTWISE_ROLES[: mode.arity]):
        raise BadParam(
            f"{where}: mode {mode.value} takes inputs {list(POINTWISE_ROLES[: mode.arity])}, not {sorted(inputs)}"
        )
    coef = attributes.get("coef", 0.0)
    if not isinstance(coef, (int, float)) or isinstance(coef, bool):
        raise BadParam(f"{where}: coef={coef!r} must be a number")
    return {"y": OutputSpec(broadcast(where, list(inputs.items())))}


def reduction_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    enum_attribute(where, ReduceTensorOp, attributes, "mode")
    x = inputs["x"]
    require_float(where, "input", x)
    dims = given["y"]
    if len(dims) != len(x.dims) or any(d not in (1, xd) for d, xd in zip(dims, x.dims)):
        raise fail(
            where,
            f"output dims {list(dims)} must have the {len(x.dims)} dims of input '{x.name}' "
            f"{list(x.dims)}, each equal to the input's or 1 (the reduced ones)",
        )
    return {"y": OutputSpec(dims, compute_type(x.dtype) if x.dtype is DataType.DOUBLE else None)}


def genstats_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    x = inputs["x"]
    require_float(where, "input", x)
    if len(x.dims) < 2:
        raise fail(where, f"input '{x.name}' dims {list(x.dims)} must have at least 2 dims (N, C, ...)")
    per_channel = channel_dims(x.dims)
    return {
        "sum": OutputSpec(per_channel, compute_type(x.dtype)),
        "sum_of_squares": OutputSpec(per_channel, compute_type(x.dtype)),
    }


def channel_dims(dims: Dims) -> Dims:
    """(1, C, 1, ...): one value per channel of an (N, C, ...) tensor."""
    return tuple(d if k == 1 else 1 for k, d in enumerate(dims))


# ---- convolution and matmul ---------------------------------------------------------------------------


def conv_output(x: Dims, w: Dims, attributes: Mapping[str, Any]) -> Dims:
    """The forward output (N, K, *out) of image dims x and filter dims w."""
    spatial = [
        (size + 2 * pad - dilation * (tap - 1) - 1) // stride + 1
        for size, tap, pad, stride, dilation in zip(
            x[2:], w[2:], attributes["padding"], attributes["stride"], attributes["dilation"]
        )
    ]
    return (x[0], w[0], *spatial)


def _conv_geometry(
    where: str, image: Shape, filter: Shape, attributes: Mapping[str, Any], image_role: str, filter_role: str
) -> None:
    """The rules that image (N, C, *in) and filter (K, C/groups, *taps) share in every direction."""
    rank = len(image.dims)
    if not 3 <= rank <= 5 or len(filter.dims) != rank:
        raise fail(
            where,
            f"{image_role} '{image.name}' dims {list(image.dims)} and {filter_role} '{filter.name}' "
            f"dims {list(filter.dims)} must both have 3, 4 or 5 dims (N, C, 1 to 3 spatial dims)",
        )
    for key in ("padding", "stride", "dilation"):
        if len(attributes[key]) != rank - 2:
            raise BadParam(
                f"{where}: {key}={list(attributes[key])} must have {rank - 2} values, one per spatial "
                f"dim of {image_role} '{image.name}' {list(image.dims)}"
            )
        low = 0 if key == "padding" else 1
        if any(v < low for v in attributes[key]):
            raise BadParam(f"{where}: {key}={list(attributes[key])} must hold values of at least {low}")
    for role, shape in ((image_role, image), (filter_role, filter)):
        require_float(where, role, shape)
    if filter.dtype is not image.dtype:
        raise BadParam(
            f"{where}: {filter_role} '{filter.name}' data type {filter.dtype.name} must equal "
            f"{image_role} '{image.name}' data type {image.dtype.name}",
            Status.BAD_PARAM,
        )


def _conv_groups(where: str, channels: int, per_group: int, filters: int, names: str) -> None:
    if channels % per_group or filters % (channels // per_group):
        raise fail(
            where,
            f"{names}: C={channels} must be a multiple of the filter's C/groups={per_group}, and "
            f"K={filters} a multiple of groups={channels // max(per_group, 1)}",
        )


def conv_fprop_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    x, w = inputs["image"], inputs["weight"]
    _conv_geometry(where, x, w, attributes, "image", "weight")
    _conv_groups(where, x.dims[1], w.dims[1], w.dims[0], f"image '{x.name}' and weight '{w.name}'")
    dims = conv_output(x.dims, w.dims, attributes)
    if min(dims[2:]) < 1:
        raise fail(
            where,
            f"weight '{w.name}' dims {list(w.dims)} (dilated) must fit the padded image '{x.name}' "
            f"dims {list(x.dims)}: the output would be {list(dims)}",
        )
    return {"y": OutputSpec(dims, x.dtype)}


def conv_dgrad_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    dy, w = inputs["loss"], inputs["filter"]
    _conv_geometry(where, dy, w, attributes, "loss", "filter")
    inferred = (
        dy.dims[0],
        w.dims[1],
        *[
            (out - 1) * stride - 2 * pad + dilation * (tap - 1) + 1
            for out, tap, pad, stride, dilation in zip(
                dy.dims[2:], w.dims[2:], attributes["padding"], attributes["stride"], attributes["dilation"]
            )
        ],
    )
    dims = _gradient_dims(
        where,
        given.get("dx", inferred),
        inferred,
        lambda d: (d, w.dims),
        dy,
        attributes,
        f"an image that filter '{w.name}' {list(w.dims)} maps",
    )
    _conv_groups(where, dims[1], w.dims[1], w.dims[0], f"output and filter '{w.name}'")
    return {"dx": OutputSpec(dims, dy.dtype)}


def conv_wgrad_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    x, dy = inputs["image"], inputs["loss"]
    _conv_geometry(where, x, dy, attributes, "image", "loss")
    inferred = (
        dy.dims[1],
        x.dims[1],
        *[
            (size + 2 * pad - 1 - (out - 1) * stride) // dilation + 1
            for size, out, pad, stride, dilation in zip(
                x.dims[2:], dy.dims[2:], attributes["padding"], attributes["stride"], attributes["dilation"]
            )
        ],
    )
    dims = _gradient_dims(
        where,
        given.get("dw", inferred),
        inferred,
        lambda d: (x.dims, d),
        dy,
        attributes,
        f"a filter that maps image '{x.name}' {list(x.dims)}",
    )
    _conv_groups(where, x.dims[1], dims[1], dims[0], f"image '{x.name}' and the output")
    return {"dw": OutputSpec(dims, x.dtype)}


def _gradient_dims(
    where: str,
    dims: Dims,
    inferred: Dims,
    operands: Callable[[Dims], tuple[Dims, Dims]],
    loss: Shape,
    attributes: Mapping[str, Any],
    what: str,
) -> Dims:
    """A gradient's dims, when the forward of its (image, filter) ``operands`` gives the loss's
    dims. With a stride above 1 several sizes do; ``inferred`` is the one the builder picks."""
    image, filter = operands(dims)
    if len(dims) != len(loss.dims) or min(dims) < 1 or conv_output(image, filter, attributes) != loss.dims:
        raise fail(
            where,
            f"output dims {list(dims)} must be {what} onto loss '{loss.name}' {list(loss.dims)} "
            f"(e.g. {list(inferred)})",
        )
    return dims


def matmul_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    a, b = inputs["a"], inputs["b"]
    for role, shape in (("a", a), ("b", b)):
        require_float(where, role, shape)
        if len(shape.dims) < 2:
            raise fail(
                where, f"{role} '{shape.name}' dims {list(shape.dims)} must have at least 2 dims (..., rows, cols)"
            )
    if a.dims[-1] != b.dims[-2]:
        raise fail(
            where,
            f"a '{a.name}' dims {list(a.dims)} and b '{b.name}' dims {list(b.dims)} do not multiply: "
            f"a's last dim {a.dims[-1]} must equal b's dim -2 {b.dims[-2]}",
        )
    if a.dtype is not b.dtype:
        raise BadParam(
            f"{where}: b '{b.name}' data type {b.dtype.name} must equal a '{a.name}' data type {a.dtype.name}",
            Status.BAD_PARAM,
        )
    batch = broadcast(
        where, [("a", Shape(a.name, a.dims[:-2] or (1,), a.dtype)), ("b", Shape(b.name, b.dims[:-2] or (1,), b.dtype))]
    )
    batch = batch if max(len(a.dims), len(b.dims)) > 2 else ()
    return {"c": OutputSpec((*batch, a.dims[-2], b.dims[-1]))}


# ---- normalizations -----------------------------------------------------------------------------------


def norm_param_dims(op: str, x: Dims, normalized_ndim: int) -> Dims:
    """Dims of scale and bias: per channel (batch, instance and group norm) or over the normalized dims."""
    if op.startswith(("batchnorm", "instancenorm", "groupnorm")):
        return channel_dims(x)
    lead = len(x) - normalized_ndim
    return tuple(1 if k < lead else d for k, d in enumerate(x))


def norm_stats_dims(op: str, x: Dims, attributes: Mapping[str, Any]) -> Dims:
    """Dims of the saved statistics (mean, inverse standard deviation): one per normalized set."""
    if op.startswith("batchnorm"):
        return channel_dims(x)
    if op.startswith("instancenorm"):
        return (x[0], x[1], *(1,) * (len(x) - 2))
    if op.startswith("groupnorm"):
        return (x[0], attributes["groups"], *(1,) * (len(x) - 2))
    lead = len(x) - attributes.get("normalized_ndim", 1)
    return tuple(d if k < lead else 1 for k, d in enumerate(x))


def _norm_checks(where: str, op: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any]) -> Shape:
    """The rules every normalization shares; returns x."""
    x = inputs["x"]
    require_float(where, "input", x)
    minimum = 3 if op.startswith("instancenorm") else 2
    if len(x.dims) < minimum:
        raise fail(where, f"input '{x.name}' dims {list(x.dims)} must have at least {minimum} dims")
    if op.startswith("groupnorm"):
        _group_checks(where, x, attributes)
    ndim = attributes.get("normalized_ndim", 1)
    params = norm_param_dims(op, x.dims, ndim)
    stats = norm_stats_dims(op, x.dims, attributes)
    for role, shape in inputs.items():
        if role in ("scale", "bias"):
            require_dims(
                where,
                role,
                shape,
                params,
                "one per normalized element" if op.startswith(("layernorm", "rmsnorm")) else "one per channel",
            )
            require_float(where, role, shape)
        elif role in ("mean", "inv_variance", "in_running_mean", "in_running_var"):
            require_dims(where, role, shape, stats, "one per normalized set")
            if shape.dtype is not compute_type(x.dtype):
                raise BadParam(
                    f"{where}: {role} '{shape.name}' data type {shape.dtype.name} must be {compute_type(x.dtype).name}",
                    Status.BAD_PARAM,
                )
        elif role == "grad":
            require_dims(where, role, shape, x.dims, f"the dims of input '{x.name}'")
            require_float(where, role, shape)
            if op == "batchnorm_backward" and shape.dtype is not x.dtype:  # one type for x, dy and dx
                raise BadParam(
                    f"{where}: grad '{shape.name}' data type {shape.dtype.name} must equal input '{x.name}' "
                    f"data type {x.dtype.name}",
                    Status.BAD_PARAM,
                )
    if op.startswith("batchnorm") and inputs["scale"].dtype is not compute_type(x.dtype):
        raise BadParam(
            f"{where}: scale '{inputs['scale'].name}' data type {inputs['scale'].dtype.name} must be "
            f"{compute_type(x.dtype).name}",
            Status.BAD_PARAM,
        )
    return x


def _group_checks(where: str, x: Shape, attributes: Mapping[str, Any]) -> None:
    """A group norm's groups: an int of at least 1 that divides the channels."""
    groups = attributes.get("groups")
    if not (isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1):
        raise BadParam(f"{where}: groups={groups!r} must be an int of at least 1")
    if x.dims[1] % groups:
        raise fail(
            where,
            f"input '{x.name}' channels {x.dims[1]} (dims[1] of {list(x.dims)}) must be a multiple of groups={groups}",
        )


def norm_forward_rule(op: str) -> Callable[..., dict[str, OutputSpec]]:
    def rule(
        where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
    ) -> dict[str, OutputSpec]:
        x = _norm_checks(where, op, inputs, attributes)
        stats = OutputSpec(norm_stats_dims(op, x.dims, attributes), compute_type(x.dtype))
        # batch norm's call writes y in x's type; the other normalizations write any float type
        outputs = {"y": OutputSpec(x.dims, x.dtype if op == "batchnorm" else None)}
        training = attributes.get("phase", "training") == "training"
        roles = [r for r in OPERATIONS[op].outputs if r != "y"]
        if op == "batchnorm" and "in_running_mean" not in inputs:
            roles = [r for r in roles if not r.startswith("next_running")]
        for role in roles if training else ():
            outputs[role] = stats
        return outputs

    return rule


def norm_backward_rule(op: str) -> Callable[..., dict[str, OutputSpec]]:
    def rule(
        where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
    ) -> dict[str, OutputSpec]:
        x = _norm_checks(where, op, inputs, attributes)
        outputs = {"dx": OutputSpec(x.dims, x.dtype if op == "batchnorm_backward" else None)}
        if "scale" not in inputs:  # a group norm without parameters has no parameter gradients
            return outputs
        params = norm_param_dims(op, x.dims, attributes.get("normalized_ndim", 1))
        param_type = inputs["scale"].dtype  # one descriptor describes scale and its gradients
        outputs["dscale"] = OutputSpec(params, param_type)
        if attributes.get("has_dbias", True):
            outputs["dbias"] = OutputSpec(params, param_type)
        return outputs

    return rule


# ---- views ---------------------------------------------------------------------------------------------

SLICE_KEYS = ("start", "stop", "step")  # a slice node's attributes: one value per dim of its input


def slice_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """A sub-region of the input, ``start`` to ``stop`` (excluded) by ``step`` along each dim:
    ``ceil((stop - start) / step)`` elements, of the input's type (the output is a view of its memory)."""
    x = inputs["x"]
    bounds = [tuple(attributes.get(key, ())) for key in SLICE_KEYS]
    if any(len(values) != len(x.dims) for values in bounds):
        raise BadParam(
            f"{where}: start, stop and step {[list(values) for values in bounds]} must each have one value "
            f"per dim of input '{x.name}' {list(x.dims)}"
        )
    dims = []
    for k, (size, start, stop, step) in enumerate(zip(x.dims, *bounds)):
        if not (isinstance(step, int) and step >= 1 and isinstance(start, int) and isinstance(stop, int)):
            raise BadParam(
                f"{where}: slices[{k}] start={start!r}, stop={stop!r}, step={step!r} must be ints, step >= 1"
            )
        if not 0 <= start < stop <= size:
            raise fail(
                where,
                f"slices[{k}] from {start} to {stop} must select elements of input '{x.name}' dim {k} (size {size})",
            )
        dims.append(-(-(stop - start) // step))
    return {"y": OutputSpec(tuple(dims), x.dtype)}


def reshape_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """The input's memory read in the dims and strides set on the output, of the input's type (a view:
    validate checks that it addresses the input's elements, ``addresses_within``)."""
    return {"y": OutputSpec(given["y"], inputs["x"].dtype)}


def addresses_within(dims: Dims, strides: Dims, source_dims: Dims, source_strides: Dims) -> bool:
    """Whether every element of ``dims`` and ``strides`` lies on an element of the source's, both
    counted from the source's first element. The source's dims that address more than one element
    are merged into runs where one continues another; the source must not overlap itself (a run
    starting inside another), and each dim of the view that steps (more than one element, a nonzero
    stride) must step along one run by a whole multiple of its stride, the steps along a run summing
    to less than its length. That holds for every view torch takes (split or merged dims, permuted
    dims, broadcast dims of stride 0), of any source that does not overlap itself."""
    runs: list[list[int]] = []  # [stride, length] of each run, innermost first
    for stride, size in sorted((s, d) for d, s in zip(source_dims, source_strides) if d > 1 and s > 0):
        if runs and stride == runs[-1][0] * runs[-1][1]:
            runs[-1][1] *= size
        elif runs and stride < runs[-1][0] * runs[-1][1]:
            return False
        else:
            runs.append([stride, size])
    reach = [0] * len(runs)
    for size, stride in zip(dims, strides):
        if size == 1 or stride == 0:
            continue
        run = next((k for k, (step, length) in enumerate(runs) if stride % step == 0 and stride < step * length), None)
        if run is None:
            return False
        reach[run] += (size - 1) * (stride // runs[run][0])
    return all(steps < length for steps, (_, length) in zip(reach, runs))


def slice_index(attributes: Mapping[str, Any]) -> tuple[slice, ...]:
    """A slice node's sub-region as Python slices (a NumPy or torch view of its input's view)."""
    return tuple(slice(*bounds) for bounds in zip(*(attributes[key] for key in SLICE_KEYS)))


def view_strides(strides: Dims, steps: Dims) -> Dims:
    """A slice's strides: its input's, each times the step along its dim."""
    return tuple(stride * step for stride, step in zip(strides, steps))


# ---- concatenation -------------------------------------------------------------------------------------

CONCATENATED = "x"  # a concatenate node's inputs are x0, x1, ..., in the order they are joined


def concatenated(inputs: Mapping[str, Any]) -> list[Any]:
    """A concatenate node's inputs (shapes, tensors or uids by role) in the order they are joined: by
    the number of their role, whatever the order of the mapping (a serialized graph sorts its roles)."""
    return [inputs[role] for role in sorted(inputs, key=lambda role: int(role[len(CONCATENATED) :]))]


def concatenate_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """The inputs joined along ``axis``: their dims with that dim summed, every other dim equal, of
    their one type (the output is a copy of their values). ``in_place_index``, when given, names
    one of the inputs."""
    roles = concatenated({role: role for role in inputs})
    if roles != [f"{CONCATENATED}{k}" for k in range(len(roles))]:
        raise BadParam(f"{where}: inputs {roles} must be x0 to x{len(roles) - 1}, one for each tensor joined")
    shapes = [inputs[role] for role in roles]
    if not shapes:
        raise BadParam(f"{where}: inputs is empty: concatenate joins one tensor or more")
    first, axis, in_place = shapes[0], attributes.get("axis"), attributes.get("in_place_index")
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(first.dims):
        raise BadParam(f"{where}: axis={axis!r} must be a dim of input '{first.name}' {list(first.dims)}")
    if in_place is not None and (
        not isinstance(in_place, int) or isinstance(in_place, bool) or not 0 <= in_place < len(shapes)
    ):
        raise BadParam(
            f"{where}: in_place_index={in_place!r} must be None or the index of one of the {len(shapes)} inputs"
        )
    for k, shape in enumerate(shapes):
        if shape.dtype is not first.dtype:
            raise BadParam(
                f"{where}: inputs[{k}] '{shape.name}' data type {shape.dtype.name} must be inputs[0] "
                f"'{first.name}''s {first.dtype.name} (one type is joined)",
                Status.BAD_PARAM,
            )
        others = [d for j, d in enumerate(shape.dims) if j != axis]
        if len(shape.dims) != len(first.dims) or others != [d for j, d in enumerate(first.dims) if j != axis]:
            raise fail(
                where,
                f"inputs[{k}] '{shape.name}' dims {list(shape.dims)} must equal inputs[0] '{first.name}' dims "
                f"{list(first.dims)} but along axis {axis}",
            )
    dims = list(first.dims)
    dims[axis] = sum(shape.dims[axis] for shape in shapes)
    return {"y": OutputSpec(tuple(dims), first.dtype)}


# ---- softmax and pooling ------------------------------------------------------------------------------


def softmax_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    x = inputs["x"]
    require_float(where, "input", x)
    if not 0 <= attributes["axis"] < len(x.dims):
        raise BadParam(f"{where}: axis={attributes['axis']} must be a dim of input '{x.name}' {list(x.dims)}")
    return {"y": OutputSpec(x.dims)}


def pooling_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    x = inputs["x"]
    return {"y": OutputSpec(pooled(where, x, attributes), x.dtype)}  # the call writes y in x's type


def pooled(where: str, x: Shape, attributes: Mapping[str, Any]) -> Dims:
    """The dims a pooling of input ``x`` gives: (N, C, ``(size + 2 * padding - window) // stride + 1``...)."""
    require_float(where, "input", x)
    spatial = len(attributes["window"])
    if len(x.dims) != spatial + 2:
        raise fail(
            where,
            f"input '{x.name}' dims {list(x.dims)} must have {spatial + 2} dims (N, C and one per "
            f"window dim {list(attributes['window'])})",
        )
    out = []
    for k, (size, window, stride, pad) in enumerate(
        zip(x.dims[2:], attributes["window"], attributes["stride"], attributes["padding"])
    ):
        if window < 1 or stride < 1 or not 0 <= pad < window:
            raise BadParam(
                f"{where}: window={list(attributes['window'])}, stride={list(attributes['stride'])}, "
                f"padding={list(attributes['padding'])} need windows and strides of at least 1 and "
                "paddings in [0, window)"
            )
        out.append((size + 2 * pad - window) // stride + 1)
        if out[-1] < 1:
            raise fail(where, f"window[{k}]={window} must fit input '{x.name}' dim {size} with padding {pad}")
    return (*x.dims[:2], *out)


def pooling_backward_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """dx of x's dims and type from the loss ``grad`` (dy), which has the pooled dims and x's type."""
    dy, x = inputs["dy"], inputs["x"]
    require_dims(where, "grad", dy, pooled(where, x, attributes), f"the pooling of input '{x.name}' {list(x.dims)}")
    if dy.dtype is not x.dtype:
        raise BadParam(
            f"{where}: grad '{dy.name}' data type {dy.dtype.name} must equal input '{x.name}' data type {x.dtype.name}",
            Status.BAD_PARAM,
        )
    return {"dx": OutputSpec(x.dims, x.dtype)}  # the call writes dx in x's type


def _check_resampled(where: str, role: str, tensor: Shape, stride: Sequence[Any]) -> None:
    """An interpolation's image or loss: floating point, (N, C) and one spatial dim per stride, 1 to 3."""
    require_float(where, role, tensor)
    if not 1 <= len(stride) <= 3 or len(tensor.dims) != len(stride) + 2:
        raise fail(
            where,
            f"{role} '{tensor.name}' dims {list(tensor.dims)} must have {len(stride) + 2} dims (N, C and one per "
            f"stride {list(stride)}), 1 to 3 spatial",
        )


def resample_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """Interpolation (``Graph.resample``'s BILINEAR and NEAREST): ``floor(in / stride)`` pixels per spatial dim."""
    x = inputs["x"]
    stride = attributes["stride"]
    _check_resampled(where, "input", x, stride)
    out = [math.floor(size / step_fraction(step)) for size, step in zip(x.dims[2:], stride)]
    for k, size in enumerate(out):
        if size < 1:
            raise fail(where, f"stride[{k}]={stride[k]} leaves no output pixel of input '{x.name}' dim {x.dims[2 + k]}")
    return {"y": OutputSpec((*x.dims[:2], *out), None)}


def resample_backward_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """dx of an interpolation from its loss ``grad`` (dy): the input dims whose forward gives dy's
    dims. Where several do (a stride above 1), the smallest, ``ceil(out * stride)``, is inferred."""
    dy = inputs["dy"]
    stride = attributes["stride"]
    _check_resampled(where, "grad", dy, stride)
    steps = [step_fraction(step) for step in stride]
    smallest = [math.ceil(out * step) for out, step in zip(dy.dims[2:], steps)]
    for k, (size, step, out) in enumerate(zip(smallest, steps, dy.dims[2:])):
        if math.floor(size / step) != out:  # floor(in / stride) jumps over out
            raise fail(
                where,
                f"grad '{dy.name}' dims {list(dy.dims)}: no input resamples onto {out} pixels along spatial dim "
                f"{k} at stride {stride[k]} ({size - 1} pixels give {math.floor((size - 1) / step)}, {size} give "
                f"{math.floor(size / step)})",
            )
    inferred = (*dy.dims[:2], *smallest)
    dims = given.get("dx", inferred)
    if (
        len(dims) != len(dy.dims)
        or tuple(dims[:2]) != dy.dims[:2]
        or any(math.floor(size / step) != out for size, step, out in zip(dims[2:], steps, dy.dims[2:]))
    ):
        raise fail(
            where,
            f"output dims {list(dims)} must be an input that stride {list(stride)} resamples onto grad "
            f"'{dy.name}' {list(dy.dims)} (floor(input / stride) pixels; e.g. {list(inferred)})",
        )
    return {"dx": OutputSpec(tuple(dims), None)}


def step_fraction(step: Any) -> Fraction:
    """An interpolation's stride as the fraction it names: a float rounded to the nearest fraction of
    denominator at most 2^20 (1/3 and 0.1 stay a third and a tenth, so that ``in / stride`` is exact)."""
    return Fraction(step).limit_denominator(1 << 20)


# ---- attention ----------------------------------------------------------------------------------------

ATTENTION_PARAMETERS = ("scale", "causal", "alignment", "window", "dropout_p", "seed", "offset")
ROLE_OF_SLOT = {"seq_lens_q": "seq_len_q", "seq_lens_kv": "seq_len_kv"}  # where a node's role differs
# cudnn-frontend's spelling of a gradient in the builder's parameters (dO, descale_dO, amax_dQ, ...)
GRADIENT_NAMES = {"do": "dO", "dq": "dQ", "dk": "dK", "dv": "dV", "dp": "dP", "dbias": "dBias"}


def graph_name(slot: str) -> str:
    """The builder's parameter of the attention family's slot: its last word spelled as cudnn-frontend does."""
    prefix, separator, last = slot.rpartition("_")
    return f"{prefix}{separator}{GRADIENT_NAMES.get(last, last)}"


# the attention family's slots as the builder's parameters name them
GRAPH_NAMES = SlotNames(
    (
        ("params", "sdpa"),
        ("max_seqlen_q", "max_seqlen_q"),
        ("max_seqlen_kv", "max_seqlen_kv"),
        *((slot, graph_name(slot)) for slot in SLOTS),
    )
)


# the tensors a graph gives in cudnn-frontend's 4-dim form: (dims the family keeps, the form)
GRAPH_FORMS = {
    "stats": (3, "(batch, heads, queries, 1)"),
    "seq_len_q": (1, "(batch, 1, 1, 1)"),
    "seq_len_kv": (1, "(batch, 1, 1, 1)"),
}


def attention_descriptor(attributes: Mapping[str, Any]) -> AttentionDescriptor:
    """The attention family's parameters of an sdpa, sdpa_fp8, sdpa_backward or sdpa_fp8_backward node."""
    values = {key: attributes[key] for key in ATTENTION_PARAMETERS}
    return AttentionDescriptor(**{**values, "window": tuple(values["window"])})


def attention_slot_descriptor(slot: str, desc: TensorDescriptor) -> TensorDescriptor:
    """A node's tensor as the attention family describes it: stats (B, H, S, 1) as (B, H, S), a
    sequence length (B, 1, 1, 1) as (B,); the others as they are."""
    form = GRAPH_FORMS.get(ROLE_OF_SLOT.get(slot, slot))
    kept = desc.ndim if form is None else form[0]
    return TensorDescriptor(desc.dtype, desc.dims[:kept], desc.strides[:kept])


def _attention_check(
    where: str, inputs: Mapping[str, Shape], outputs: Mapping[str, OutputSpec], attributes: Mapping[str, Any]
) -> None:
    """The attention family's shape and dtype rules over the node's tensors (packed), naming the
    builder's parameters. What the family does not support is left to the call, which refuses it
    when an engine plans the node (``check_support`` gives the reason)."""
    for role, (kept, what) in GRAPH_FORMS.items():
        shape = inputs.get(role)
        if shape is not None and (len(shape.dims) != 4 or any(d != 1 for d in shape.dims[kept:])):
            raise fail(where, f"{role} '{shape.name}' dims {list(shape.dims)} must be {what}")
    shapes = {**{role: (s.dims, s.dtype) for role, s in inputs.items()}, **outputs}
    descs = {}
    for slot in SLOTS:
        role = ROLE_OF_SLOT.get(slot, slot)
        if role in shapes:
            dims, dtype = shapes[role]
            descs[slot] = attention_slot_descriptor(slot, TensorDescriptor(dtype, dims, packed_strides(dims)))
    try:
        attention_problem(attention_descriptor(attributes), **descs, names=GRAPH_NAMES)
    except NotSupported:
        pass
    except BadParam as error:
        raise BadParam(f"{where}: {error}", error.status) from None


def _forward_outputs(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], o_dtype: DataType | None
) -> dict[str, OutputSpec]:
    """o (B, Hq, Sq, Dv) and, unless inference, stats (B, Hq, Sq, 1) of a forward node."""
    q, v = inputs["q"], inputs["v"]
    for role, shape in (("q", q), ("k", inputs["k"]), ("v", v)):
        if len(shape.dims) != 4:
            raise fail(
                where,
                f"{role} '{shape.name}' dims {list(shape.dims)} must have 4 dims (batch, heads, sequence, head dim)",
            )
    outputs = {"o": OutputSpec((*q.dims[:3], v.dims[3]), o_dtype)}
    if attributes["generate_stats"]:
        outputs["stats"] = OutputSpec((*q.dims[:3], 1), compute_type(q.dtype))
    return outputs


def sdpa_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    outputs = _forward_outputs(where, inputs, attributes, inputs["q"].dtype)
    _attention_check(where, inputs, outputs, attributes)
    return outputs


def sdpa_fp8_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """o's type follows its role (fp8, BFLOAT16 or HALF, which the family checks when an engine plans
    the node; the rule checks the rest with q's type in its place); amax_s and amax_o are FLOAT."""
    outputs = _forward_outputs(where, inputs, attributes, None)
    outputs |= {slot: OutputSpec((1, 1, 1, 1), DataType.FLOAT) for slot in FP8_AMAX}
    _attention_check(where, inputs, {**outputs, "o": OutputSpec(outputs["o"].dims, inputs["q"].dtype)}, attributes)
    return outputs


def sdpa_backward_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    outputs = {f"d{role}": OutputSpec(inputs[role].dims, inputs[role].dtype) for role in ("q", "k", "v")}
    if attributes["compute_dbias"]:
        bias = inputs.get("bias")
        if bias is None:
            raise BadParam(f"{where}: compute_dbias=True needs a bias")
        outputs["dbias"] = OutputSpec(bias.dims, bias.dtype)
    _attention_check(where, inputs, outputs, attributes)
    return outputs


def sdpa_fp8_backward_rule(
    where: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """dq, dk and dv of q, k and v's dims, their types following their roles (as ``sdpa_fp8``'s o:
    the rule checks the rest with q's type in their place); the four maxima FLOAT."""
    gradients = {f"d{role}": inputs[role].dims for role in ("q", "k", "v")}
    _attention_check(
        where, inputs, {slot: OutputSpec(dims, inputs["q"].dtype) for slot, dims in gradients.items()}, attributes
    )
    outputs = {slot: OutputSpec(dims, None) for slot, dims in gradients.items()}
    return outputs | {slot: OutputSpec((1, 1, 1, 1), DataType.FLOAT) for slot in FP8_BACKWARD_AMAX}


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        Operation(
            "pointwise",
            POINTWISE_ROLES,
            ("y",),
            pointwise_rule,
            optional=("b", "c"),
            memory_order={"y": POINTWISE_ROLES},
        ),
        Operation("reduction", ("x",), ("y",), reduction_rule),
        Operation("genstats", ("x",), ("sum", "sum_of_squares"), genstats_rule),
        Operation("conv_fprop", ("image", "weight"), ("y",), conv_fprop_rule, memory_order={"y": ("image",)}),
        Operation("conv_dgrad", ("loss", "filter"), ("dx",), conv_dgrad_rule, memory_order={"dx": ("loss",)}),
        Operation("conv_wgrad", ("image", "loss"), ("dw",), conv_wgrad_rule),
        Operation("matmul", ("a", "b"), ("c",), matmul_rule),
        Operation(
            "batchnorm",
            ("x", "scale", "bias", "in_running_mean", "in_running_var"),
            ("y", "mean", "inv_variance", "next_running_mean", "next_running_var"),
            norm_forward_rule("batchnorm"),
            optional=("in_running_mean", "in_running_var"),
            memory_order={"y": ("x",)},
        ),
        Operation(
            "batchnorm_backward",
            ("grad", "x", "scale", "mean", "inv_variance"),
            ("dx", "dscale", "dbias"),
            norm_backward_rule("batchnorm_backward"),
            memory_order={"dx": ("x",)},
        ),
        Operation("layernorm", ("x", "scale", "bias"), ("y", "mean", "inv_variance"), norm_forward_rule("layernorm")),
        Operation(
            "layernorm_backward",
            ("grad", "x", "scale", "mean", "inv_variance"),
            ("dx", "dscale", "dbias"),
            norm_backward_rule("layernorm_backward"),
        ),
        Operation(
            "rmsnorm", ("x", "scale", "bias"), ("y", "inv_variance"), norm_forward_rule("rmsnorm"), optional=("bias",)
        ),
        Operation(
            "rmsnorm_backward",
            ("grad", "x", "scale", "inv_variance"),
            ("dx", "dscale", "dbias"),
            norm_backward_rule("rmsnorm_backward"),
        ),
        Operation(
            "instancenorm", ("x", "scale", "bias"), ("y", "mean", "inv_variance"), norm_forward_rule("instancenorm")
        ),
        Operation(
            "instancenorm_backward",
            ("grad", "x", "scale", "mean", "inv_variance"),
            ("dx", "dscale", "dbias"),
            norm_backward_rule("instancenorm_backward"),
        ),
        Operation(
            "groupnorm",
            ("x", "scale", "bias"),
            ("y", "mean", "inv_variance"),
            norm_forward_rule("groupnorm"),
            optional=("scale", "bias"),
        ),
        Operation(
            "groupnorm_backward",
            ("grad", "x", "scale", "mean", "inv_variance"),
            ("dx", "dscale", "dbias"),
            norm_backward_rule("groupnorm_backward"),
            optional=("scale",),
        ),
        Operation("slice", ("x",), ("y",), slice_rule),
        Operation("reshape", ("x",), ("y",), reshape_rule),
        Operation("concatenate", (), ("y",), concatenate_rule, memory_order={"y": ("x0",)}, numbered=CONCATENATED),
        Operation("softmax", ("x",), ("y",), softmax_rule, memory_order={"y": ("x",)}),
        Operation("pooling", ("x",), ("y",), pooling_rule, memory_order={"y": ("x",)}),
        Operation("resample", ("x",), ("y",), resample_rule, memory_order={"y": ("x",)}),
        Operation("pooling_backward", ("dy", "x"), ("dx",), pooling_backward_rule, memory_order={"dx": ("x",)}),
        Operation("resample_backward", ("dy",), ("dx",), resample_backward_rule, memory_order={"dx": ("dy",)}),
        Operation(
            "sdpa",
            ("q", "k", "v", "bias", "seq_len_q", "seq_len_kv"),
            ("o", "stats"),
            sdpa_rule,
            optional=("bias", "seq_len_q", "seq_len_kv"),
        ),
        Operation(
            "sdpa_fp8",
            ("q", "k", "v", *FP8_SCALES, "seq_len_q", "seq_len_kv"),
            ("o", "stats", *FP8_AMAX),
            sdpa_fp8_rule,
            optional=("seq_len_q", "seq_len_kv"),
        ),
        Operation(
            "sdpa_backward",
            ("q", "k", "v", "o", "do", "stats", "bias", "seq_len_q", "seq_len_kv"),
            ("dq", "dk", "dv", "dbias"),
            sdpa_backward_rule,
            optional=("bias", "seq_len_q", "seq_len_kv"),
        ),
        Operation(
            "sdpa_fp8_backward",
            ("q", "k", "v", "o", "do", "stats", *FP8_BACKWARD_SCALES, "seq_len_q", "seq_len_kv"),
            ("dq", "dk", "dv", *FP8_BACKWARD_AMAX),
            sdpa_fp8_backward_rule,
            optional=("seq_len_q", "seq_len_kv"),
        ),
    )
}


def apply_rule(
    node_name: str, op: str, inputs: Mapping[str, Shape], attributes: Mapping[str, Any], given: Mapping[str, Dims]
) -> dict[str, OutputSpec]:
    """The outputs of a node: its operation's rule, with errors naming the node."""
    operation = OPERATIONS[op]
    unknown = [role for role in inputs if not operation.takes(role)]
    if unknown:  # a deserialized graph may name any role
        numbered = operation.numbered
        roles = list(operation.inputs) if numbered is None else f"{numbered}0, {numbered}1, ..."
        raise BadParam(f"{label(node_name, op)}: input role '{unknown[0]}' is not one of {roles}")
    for role, shape in inputs.items():
        if shape.by_value and op != "pointwise":
            raise BadParam(
                f"{label(node_name, op)}: {role} '{shape.name}' is a scalar passed by value; only "
                "pointwise operations take those"
            )
    return OPERATIONS[op].rule(label(node_name, op), inputs, attributes, given)
