"""Building a graph: its tensors and the non-pointwise operations, named as cudnn-frontend's
Python API names them (``conv_fprop``, ``matmul``, ``genstats``, ``batchnorm``, ``sdpa``, ...).

Every method adds one node (``batchnorm_inference``, ``bn_finalize`` and ``dbn_weight`` add the
pointwise and reduction nodes they are made of) and returns its output tensors, virtual until
``set_output(True)``, with dims from the operation's rule (``opendnn.graph.operations``). A Python
number where a tensor is expected becomes a scalar passed by value; ``scalar(name=...)`` declares one
whose value comes by name at execute time.
"""

from __future__ import annotations

import builtins
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opendnn import PointwiseMode, PoolingMode, ReduceTensorOp
from opendnn.core.arrays import as_native, descriptor_of
from opendnn.core.descriptors import check_finite, packed_strides
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported
from opendnn.families.attention.problem import FP8_BACKWARD_AMAX, FP8_BACKWARD_SCALES, FP8_SCALES, MAX_OFFSET, MAX_SEED
from opendnn.families.batch_norm.problem import BN_MIN_EPSILON
from opendnn.families.pointwise.problem import resolved_coef
from opendnn.graph.operations import (
    CONCATENATED,
    OPERATIONS,
    SLICE_KEYS,
    Shape,
    apply_rule,
    channel_dims,
    label,
    step_fraction,
)
from opendnn.graph.pointwise_methods import PointwiseMethods
from opendnn.graph.tensor import Tensor, checked_dims, checked_strides, data_type_of

Operand = Tensor | float | int
NUMBERS = (int, float, np.integer, np.floating)  # a scalar's value, at build time and in the variant pack


class NormForwardPhase(enum.Enum):
    """TRAINING writes the statistics (mean, inverse standard deviation) next to y; INFERENCE writes y only."""

    TRAINING = "training"
    INFERENCE = "inference"


class ResampleMode(enum.Enum):
    """cudnn-frontend's resampling modes; the pooling ones name a PoolingMode (the value)."""

    MAXPOOL = PoolingMode.MAX.value
    AVGPOOL_INCLUDE_PADDING = PoolingMode.AVERAGE_COUNT_INCLUDE_PADDING.value
    AVGPOOL_EXCLUDE_PADDING = PoolingMode.AVERAGE_COUNT_EXCLUDE_PADDING.value
    BILINEAR = "bilinear"
    NEAREST = "nearest"


class PaddingMode(enum.Enum):
    """What cudnn-frontend's resampling reads past the edges: zeros, minus infinity, the edge's values."""

    ZERO_PAD = "zero"
    NEG_INF_PAD = "neg_inf"
    EDGE_VAL_PAD = "edge"


# the padding each pooling mode computes with: max pooling skips it (as minus infinity), the averages
# count zeros there (INCLUDE) or count only the window's pixels inside the input (EXCLUDE)
POOLING_PADDING = {
    ResampleMode.MAXPOOL: PaddingMode.NEG_INF_PAD,
    ResampleMode.AVGPOOL_INCLUDE_PADDING: PaddingMode.ZERO_PAD,
    ResampleMode.AVGPOOL_EXCLUDE_PADDING: PaddingMode.ZERO_PAD,
}


@dataclass(eq=False)
class Node:
    """One operation of a graph: its kind, its tensors by role and its attributes (JSON values)."""

    name: str
    op: str
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return label(self.name, self.op)


class OperationBuilder(PointwiseMethods):
    """The tensors and operations of a graph; ``Graph`` adds the lifecycle."""

    def __init__(
        self,
        io_data_type: Any = DataType.FLOAT,
        compute_data_type: Any = DataType.FLOAT,
        intermediate_data_type: Any = DataType.FLOAT,
        name: str = "graph",
    ) -> None:
        self.io_data_type = data_type_of("io_data_type", io_data_type)
        self.compute_data_type = data_type_of("compute_data_type", compute_data_type)
        if self.compute_data_type not in (DataType.FLOAT, DataType.DOUBLE):
            raise BadParam(f"compute_data_type={self.compute_data_type.name} must be FLOAT or DOUBLE")
        self.intermediate_data_type = data_type_of("intermediate_data_type", intermediate_data_type)
        self.name = str(name)
        self._tensors: list[Tensor] = []
        self._nodes: list[Node] = []

    def _changed(self) -> None:
        """Called on every change: the lifecycle starts again at validate (``Graph`` overrides)."""

    # ---- tensors --------------------------------------------------------------------------------------

    def tensor(
        self, dim: Sequence[int], stride: Sequence[int] | None = None, data_type: Any = None, name: str | None = None
    ) -> Tensor:
        """A graph input (or output, for the operations that write into a caller's tensor) of ``dim``
        with ``stride`` in elements (None: packed row-major) and ``data_type`` (None: io_data_type)."""
        return self._new_tensor(name, dim, stride, data_type, virtual=False)

    def tensor_like(self, array: Any, name: str | None = None) -> Tensor:
        """A graph input with the dims, strides and data type of ``array`` (NumPy, torch or DLPack)."""
        desc = descriptor_of(as_native(array, name or "array"), name or "array")
        return self._new_tensor(name, desc.dims, desc.strides, desc.dtype, virtual=False)

    def scalar(self, value: float | None = None, *, data_type: Any = None, name: str | None = None) -> Tensor:
        """A scalar passed by value: ``value`` at build time, or None to give it by name (or by the
        tensor) in the variant pack at every execute. ``data_type`` None is the compute data type.
        The value is an operand, as a one-element tensor's would be: NaN and the infinities are
        values like any other (a mask's -inf, a clamp's open bound), at build time and at execute."""
        if value is not None and not isinstance(value, NUMBERS):
            raise BadParam(f"scalar '{name}': value={value!r} must be a number")
        return self._new_tensor(name, (1,), None, data_type, virtual=False, value=value, pass_by_value=True)

    def _new_tensor(
        self,
        name: str | None,
        dims: Sequence[int],
        strides: Sequence[int] | None,
        data_type: Any,
        *,
        virtual: bool,
        value: float | None = None,
        pass_by_value: bool = False,
    ) -> Tensor:
        name = f"tensor_{len(self._tensors)}" if name is None else str(name)
        tensor = Tensor(self, name, dims, strides, data_type, virtual=virtual, value=value, pass_by_value=pass_by_value)
        self._tensors.append(tensor)
        self._changed()
        return tensor

    def _operand(self, operand: Operand | None, role: str, node_name: str, op: str) -> Tensor | None:
        """A tensor of this graph, or a Python number as a scalar passed by value."""
        if operand is None or isinstance(operand, Tensor):
            if isinstance(operand, Tensor) and operand._graph is not self:
                raise BadParam(f"{label(node_name, op)}: {role} '{operand.name}' belongs to another graph")
            return operand
        if isinstance(operand, (bool, int, float, np.number)):
            return self.scalar(float(operand), name=f"{node_name}::{role}")
        raise BadParam(f"{label(node_name, op)}: {role}={operand!r} must be a Tensor of this graph or a number")

    # ---- nodes ----------------------------------------------------------------------------------------

    def _add(
        self,
        op: str,
        inputs: dict[str, Operand | None],
        attributes: dict[str, Any],
        name: str | None,
        given: dict[str, tuple[int, ...]] | None = None,
    ) -> dict[str, Tensor]:
        """Add a node of ``op`` and make its outputs (virtual tensors of the rule's dims)."""
        name = f"{op}_{len(self._nodes)}" if name is None else str(name)
        if any(node.name == name for node in self._nodes):
            raise BadParam(f"name='{name}' is taken by another node of graph '{self.name}'")
        tensors: dict[str, Tensor] = {}
        for role, operand in inputs.items():
            tensor = self._operand(operand, role, name, op)
            if tensor is not None:
                tensors[role] = tensor
        missing = [r for r in OPERATIONS[op].inputs if r not in tensors and r not in OPERATIONS[op].optional]
        if missing:
            raise BadParam(f"{label(name, op)}: input {missing[0]} is required")
        shapes = {role: Shape(t.name, t.dims, t.data_type, t.pass_by_value) for role, t in tensors.items()}
        specs = apply_rule(name, op, shapes, attributes, given or {})
        outputs = {}
        for role, spec in specs.items():
            outputs[role] = self._new_tensor(f"{name}::{role}", spec.dims, None, None, virtual=True)
            outputs[role].inferred_data_type = spec.dtype
            followed = [tensors[r] for r in OPERATIONS[op].memory_order.get(role, ()) if r in tensors]
            outputs[role].order_like = _largest_of_rank(followed, len(spec.dims))
        self._nodes.append(Node(name, op, tensors, outputs, attributes))
        self._changed()
        return outputs

    def _pointwise(
        self,
        mode: PointwiseMode,
        operands: Sequence[Operand],
        name: str | None,
        coef: float | None = None,
        data_type: Any = None,
    ) -> Tensor:
        roles = ("a", "b", "c")[: len(operands)]
        name = f"{mode.value.removesuffix('_fwd')}_{len(self._nodes)}" if name is None else name
        attributes = {"mode": mode.value, "coef": resolved_coef(mode, coef)}  # None: the table's default
        output = self._add("pointwise", dict(zip(roles, operands)), attributes, name)["y"]
        if data_type is not None:
            output.set_data_type(data_type)
        return output

    def reduction(
        self, input: Tensor, mode: ReduceTensorOp | str, dims: Sequence[int], *, name: str | None = None
    ) -> Tensor:
        """``input`` reduced to ``dims`` (input's rank; each dim the input's or 1, where it reduces)
        by ADD, MUL, MIN, MAX, AMAX, AVG, NORM1, NORM2 or MUL_NO_ZEROS; NaN propagates."""
        attributes = {"mode": _enum_value(ReduceTensorOp, mode, "mode")}
        dims = tuple(int(d) for d in dims)
        return self._add("reduction", {"x": input}, attributes, name, {"y": dims})["y"]

    def genstats(self, input: Tensor, *, name: str | None = None) -> tuple[Tensor, Tensor]:
        """Per channel of an (N, C, ...) input: (sum, sum of squares), each (1, C, 1, ...) in FLOAT."""
        outputs = self._add("genstats", {"x": input}, {}, name)
        return outputs["sum"], outputs["sum_of_squares"]

    # ---- convolution and matmul -----------------------------------------------------------------------

    def conv_fprop(
        self,
        image: Tensor,
        weight: Tensor,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Cross-correlation of image (N, C, *in) with weight (K, C/groups, *taps): (N, K, *out);
        groups are C over the weight's second dim. Defaults: padding 0, stride 1, dilation 1."""
        attributes = _conv_attributes(len(image.dims) - 2, padding, stride, dilation)
        return self._add("conv_fprop", {"image": image, "weight": weight}, attributes, name)["y"]

    def conv_dgrad(
        self,
        loss: Tensor,
        filter: Tensor,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """The gradient of conv_fprop in its image: (N, C, *in) from loss (N, K, *out). With stride
        above 1 several image sizes map onto one loss size: the smallest is inferred, ``set_dim``
        picks another."""
        attributes = _conv_attributes(len(loss.dims) - 2, padding, stride, dilation)
        return self._add("conv_dgrad", {"loss": loss, "filter": filter}, attributes, name)["dx"]

    def conv_wgrad(
        self,
        image: Tensor,
        loss: Tensor,
        padding: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """The gradient of conv_fprop in its weight: (K, C, *taps). The largest filter that fits is
        inferred (the only one for stride 1); ``set_dim`` picks another, or groups (C/groups)."""
        attributes = _conv_attributes(len(image.dims) - 2, padding, stride, dilation)
        return self._add("conv_wgrad", {"image": image, "loss": loss}, attributes, name)["dw"]

    def matmul(self, A: Tensor, B: Tensor, *, name: str | None = None) -> Tensor:
        """A (..., M, K) times B (..., K, N): (*batch, M, N), batch dims broadcast as NumPy's."""
        return self._add("matmul", {"a": A, "b": B}, {}, name)["c"]

    # ---- normalizations -------------------------------------------------------------------------------

    def batchnorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        in_running_mean: Tensor | None = None,
        in_running_var: Tensor | None = None,
        epsilon: float = 1e-5,
        momentum: float = 0.1,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """Training batch norm per channel of (N, C, ...): (y, mean, inv_variance, next_running_mean,
        next_running_var), the last two None without running statistics; next = (1 - momentum) *
        running + momentum * batch (unbiased variance). Parameters and statistics (1, C, 1, ...) FLOAT."""
        if not (epsilon >= BN_MIN_EPSILON and math.isfinite(epsilon)):
            raise BadParam(f"epsilon={epsilon} must be finite and at least {BN_MIN_EPSILON}")
        if not 0.0 <= momentum <= 1.0:
            raise BadParam(f"momentum={momentum} must be in [0, 1]")
        if (in_running_mean is None) != (in_running_var is None):
            raise BadParam("in_running_mean and in_running_var must be given together")
        out = self._add(
            "batchnorm",
            {
                "x": input,
                "scale": scale,
                "bias": bias,
                "in_running_mean": in_running_mean,
                "in_running_var": in_running_var,
            },
            {"epsilon": float(epsilon), "momentum": float(momentum)},
            name,
        )
        return out["y"], out["mean"], out["inv_variance"], out.get("next_running_mean"), out.get("next_running_var")

    def batchnorm_inference(
        self,
        input: Tensor,
        mean: Tensor,
        inv_variance: Tensor,
        scale: Operand,
        bias: Operand,
        *,
        name: str | None = None,
    ) -> Tensor:
        """``(input - mean) * inv_variance * scale + bias``: four pointwise nodes, which the fusion
        engine fuses with their neighbours (scale and bias per channel, or numbers: 1 and 0 for a
        normalization without an affine transform)."""
        base = f"batchnorm_inference_{len(self._nodes)}" if name is None else str(name)
        centered = self.sub(input, mean, name=f"{base}.center")
        normalized = self.mul(centered, inv_variance, name=f"{base}.normalize")
        return self.add(self.mul(normalized, scale, name=f"{base}.scale"), bias, name=base)

    def batchnorm_backward(
        self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor, inv_variance: Tensor, *, name: str | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(dx, dscale, dbias) of training batch norm, from its saved mean and inv_variance."""
        out = self._add(
            "batchnorm_backward",
            {"grad": grad, "x": input, "scale": scale, "mean": mean, "inv_variance": inv_variance},
            {},
            name,
        )
        return out["dx"], out["dscale"], out["dbias"]

    def layernorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: float = 1e-5,
        norm_forward_phase: NormForwardPhase | str = NormForwardPhase.TRAINING,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Layer norm over the trailing dims where scale is not 1: (y, mean, inv_variance), the
        statistics None in INFERENCE."""
        out = self._norm("layernorm", input, scale, bias, epsilon, norm_forward_phase, name)
        return out["y"], out.get("mean"), out.get("inv_variance")

    def rmsnorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor | None = None,
        epsilon: float = 1e-5,
        norm_forward_phase: NormForwardPhase | str = NormForwardPhase.TRAINING,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """RMS norm over the trailing dims where scale is not 1: (y, inv_rms), inv_rms None in INFERENCE."""
        out = self._norm("rmsnorm", input, scale, bias, epsilon, norm_forward_phase, name)
        return out["y"], out.get("inv_variance")

    def instancenorm(
        self,
        input: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: float = 1e-5,
        norm_forward_phase: NormForwardPhase | str = NormForwardPhase.TRAINING,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Instance norm per (sample, channel) of (N, C, spatial...): (y, mean, inv_variance), the
        statistics (N, C, 1, ...) and None in INFERENCE."""
        out = self._norm("instancenorm", input, scale, bias, epsilon, norm_forward_phase, name)
        return out["y"], out.get("mean"), out.get("inv_variance")

    def groupnorm(
        self,
        input: Tensor,
        scale: Tensor | None,
        bias: Tensor | None,
        groups: int,
        epsilon: float = 1e-5,
        norm_forward_phase: NormForwardPhase | str = NormForwardPhase.TRAINING,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Group norm of (N, C, spatial...), the C channels split into ``groups`` equal groups, each
        (sample, group) normalized over its channels and spatial elements; scale and bias per channel
        (1, C, 1, ...), either None for none (1 and 0): (y, mean, inv_variance), the statistics
        (N, groups, 1, ...) and None in INFERENCE. An opendnn operation beyond cudnn-frontend's set."""
        out = self._norm("groupnorm", input, scale, bias, epsilon, norm_forward_phase, name, groups)
        return out["y"], out.get("mean"), out.get("inv_variance")

    def layernorm_backward(
        self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor, inv_variance: Tensor, *, name: str | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(dx, dscale, dbias) of layernorm, from its saved statistics."""
        out = self._add(
            "layernorm_backward",
            {"grad": grad, "x": input, "scale": scale, "mean": mean, "inv_variance": inv_variance},
            {"normalized_ndim": _normalized_ndim(scale)},
            name,
        )
        return out["dx"], out["dscale"], out["dbias"]

    def rmsnorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor,
        inv_variance: Tensor,
        has_dbias: bool = False,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(dx, dscale, dbias) of rmsnorm, dbias None unless has_dbias."""
        out = self._add(
            "rmsnorm_backward",
            {"grad": grad, "x": input, "scale": scale, "inv_variance": inv_variance},
            {"normalized_ndim": _normalized_ndim(scale), "has_dbias": bool(has_dbias)},
            name,
        )
        return out["dx"], out["dscale"], out.get("dbias")

    def instancenorm_backward(
        self, grad: Tensor, input: Tensor, scale: Tensor, mean: Tensor, inv_variance: Tensor, *, name: str | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(dx, dscale, dbias) of instancenorm, from its saved statistics."""
        out = self._add(
            "instancenorm_backward",
            {"grad": grad, "x": input, "scale": scale, "mean": mean, "inv_variance": inv_variance},
            {},
            name,
        )
        return out["dx"], out["dscale"], out["dbias"]

    def groupnorm_backward(
        self,
        grad: Tensor,
        input: Tensor,
        scale: Tensor | None,
        mean: Tensor,
        inv_variance: Tensor,
        groups: int,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(dx, dscale, dbias) of groupnorm of the same ``groups``, from its saved statistics; dscale
        and dbias None without scale (a group norm without parameters)."""
        out = self._add(
            "groupnorm_backward",
            {"grad": grad, "x": input, "scale": scale, "mean": mean, "inv_variance": inv_variance},
            {"groups": _groups(groups)},
            name,
        )
        return out["dx"], out.get("dscale"), out.get("dbias")

    def _norm(
        self,
        op: str,
        input: Tensor,
        scale: Tensor | None,
        bias: Tensor | None,
        epsilon: float,
        phase: NormForwardPhase | str,
        name: str | None,
        groups: int | None = None,
    ) -> dict[str, Tensor]:
        if not (epsilon >= 0 and math.isfinite(epsilon)):
            raise BadParam(f"epsilon={epsilon} must be finite and at least 0")
        attributes: dict[str, Any] = {
            "epsilon": float(epsilon),
            "phase": _enum_value(NormForwardPhase, phase, "norm_forward_phase"),
        }
        if op == "groupnorm":
            attributes["groups"] = _groups(groups)
        elif op != "instancenorm":
            attributes["normalized_ndim"] = _normalized_ndim(scale)
        return self._add(op, {"x": input, "scale": scale, "bias": bias}, attributes, name)

    # ---- batch norm in steps: finalize the statistics, the weight gradients; views ---------------------

    def bn_finalize(
        self,
        sum: Tensor,
        sq_sum: Tensor,
        scale: Tensor,
        bias: Tensor,
        epsilon: Operand,
        accum_count: Operand,
        prev_running_mean: Tensor | None = None,
        prev_running_var: Tensor | None = None,
        momentum: Operand | None = None,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
        """Batch norm's statistics from per-channel sums (cudnn-frontend's ``bn_finalize``): (eq_scale,
        eq_bias, mean, inv_variance, next_running_mean, next_running_var), the last two None without
        running statistics.

        With M = ``accum_count`` (the elements summed per channel, e.g. N * H * W of ``genstats``'s
        input): ``mean = sum / M``, ``var = sq_sum / M - mean^2`` (biased), ``inv_variance =
        1 / sqrt(var + epsilon)``, ``eq_scale = scale * inv_variance``, ``eq_bias = bias - mean *
        eq_scale``, so that ``x * eq_scale + eq_bias`` is x batch-normalized; ``next_running_* =
        prev + momentum * (batch - prev)`` with the unbiased variance ``var * M / (M - 1)``, as
        torch's BatchNorm and cuDNN keep it. ``epsilon``, ``accum_count`` and ``momentum`` are
        numbers or scalars (``scalar(name=...)``: given at execute time); the per-channel tensors
        share sum's dims. The pointwise nodes it adds fuse with their neighbours; as every node's,
        each output is read by a node or marked with ``set_output(True)``.

        Raises:
            BadParam: per-channel tensors of other dims, running statistics without momentum (or
                the reverse), a number out of its range.
        """
        base = f"bn_finalize_{len(self._nodes)}" if name is None else str(name)
        where = label(base, "bn_finalize")
        running = {"prev_running_mean": prev_running_mean, "prev_running_var": prev_running_var}
        if (prev_running_mean is None) != (prev_running_var is None) or (prev_running_mean is None) != (
            momentum is None
        ):
            raise BadParam(f"{where}: prev_running_mean, prev_running_var and momentum must be given together")
        for role, tensor in (("sum", sum), ("sq_sum", sq_sum)):
            if not isinstance(tensor, Tensor):
                raise BadParam(f"{where}: {role}={tensor!r} must be a Tensor of this graph")
        per_channel = {"sq_sum": sq_sum, "scale": scale, "bias": bias, **running}
        _require_same_dims(where, "sum", sum, per_channel)
        if isinstance(epsilon, (int, float)) and not (epsilon >= BN_MIN_EPSILON and math.isfinite(epsilon)):
            raise BadParam(f"{where}: epsilon={epsilon} must be finite and at least {BN_MIN_EPSILON}")
        least = 1 if momentum is None else 2  # the unbiased variance divides by accum_count - 1
        if isinstance(accum_count, (int, float)) and not (accum_count >= least and math.isfinite(accum_count)):
            raise BadParam(f"{where}: accum_count={accum_count} must be finite and at least {least}")
        if isinstance(momentum, (int, float)) and not 0.0 <= momentum <= 1.0:
            raise BadParam(f"{where}: momentum={momentum} must be in [0, 1]")
        mean = self.div(sum, accum_count, name=f"{base}.mean")
        mean_of_squares = self.div(sq_sum, accum_count, name=f"{base}.mean_of_squares")
        variance = self.sub(mean_of_squares, self.mul(mean, mean, name=f"{base}.square_of_mean"), name=f"{base}.var")
        inv_variance = self.rsqrt(self.add(variance, epsilon, name=f"{base}.var_epsilon"), name=f"{base}.inv_var")
        eq_scale = self.mul(scale, inv_variance, name=f"{base}.eq_scale")
        eq_bias = self.sub(bias, self.mul(mean, eq_scale, name=f"{base}.mean_eq_scale"), name=f"{base}.eq_bias")
        if prev_running_mean is None or prev_running_var is None or momentum is None:
            return eq_scale, eq_bias, mean, inv_variance, None, None
        less_one = accum_count - 1 if isinstance(accum_count, (int, float)) else self.sub(accum_count, 1.0)
        var_count = self.mul(variance, accum_count, name=f"{base}.var_count")
        unbiased = self.div(var_count, less_one, name=f"{base}.unbiased")
        next_running = []
        for role, batch, previous in (("mean", mean, prev_running_mean), ("var", unbiased, prev_running_var)):
            change = self.sub(batch, previous, name=f"{base}.{role}_change")
            step = self.mul(change, momentum, name=f"{base}.{role}_step")
            next_running.append(self.add(previous, step, name=f"{base}.next_running_{role}"))
        return eq_scale, eq_bias, mean, inv_variance, next_running[0], next_running[1]

    def dbn_weight(
        self, dy: Tensor, x: Tensor, mean: Tensor, inv_variance: Tensor, scale: Tensor, *, name: str | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Batch norm backward's weight gradients (cudnn-frontend's ``dbn_weight``): (dscale, dbias,
        eq_scale_dy, eq_scale_x, eq_bias), each (1, C, 1, ...).

        From the forward's saved ``mean`` and ``inv_variance`` over the M = N * spatial elements of
        each channel of x (N, C, ...): ``dbias = sum(dy)``, ``dscale = sum(dy * (x - mean)) *
        inv_variance``, and the factors that give the input gradient in one pointwise pass,
        ``dx = eq_scale_dy * dy + eq_scale_x * x + eq_bias``: ``eq_scale_dy = scale * inv_variance``,
        ``eq_scale_x = -eq_scale_dy * inv_variance * dscale / M``, ``eq_bias = -eq_scale_dy * dbias
        / M - eq_scale_x * mean``. Two reductions and pointwise nodes, which fuse with their
        neighbours.

        Raises:
            BadParam: dy not of x's dims, mean, inv_variance or scale not (1, C, 1, ...).
        """
        base = f"dbn_weight_{len(self._nodes)}" if name is None else str(name)
        where = label(base, "dbn_weight")
        for role, tensor in (("dy", dy), ("x", x), ("mean", mean), ("inv_variance", inv_variance), ("scale", scale)):
            if not isinstance(tensor, Tensor):
                raise BadParam(f"{where}: {role}={tensor!r} must be a Tensor of this graph")
        if len(x.dims) < 2:
            raise BadParam(f"{where}: x '{x.name}' dims {list(x.dims)} must have at least 2 dims (N, C, ...)")
        _require_same_dims(where, "x", x, {"dy": dy})
        per_channel = channel_dims(x.dims)
        for role, tensor in (("mean", mean), ("inv_variance", inv_variance), ("scale", scale)):
            if tensor.dims != per_channel:
                raise BadParam(
                    f"{where}: {role} '{tensor.name}' dims {list(tensor.dims)} must be {list(per_channel)} "
                    f"(one per channel of x '{x.name}' {list(x.dims)})"
                )
        count = math.prod(x.dims) // x.dims[1]
        dbias = self.reduction(dy, ReduceTensorOp.ADD, per_channel, name=f"{base}.dbias")
        centered = self.sub(x, mean, name=f"{base}.center")
        products = self.mul(dy, centered, name=f"{base}.dy_center")
        summed = self.reduction(products, ReduceTensorOp.ADD, per_channel, name=f"{base}.sum_dy_center")
        dscale = self.mul(summed, inv_variance, name=f"{base}.dscale")
        eq_scale_dy = self.mul(scale, inv_variance, name=f"{base}.eq_scale_dy")
        scaled = self.mul(self.mul(eq_scale_dy, inv_variance, name=f"{base}.scale_var"), dscale, name=f"{base}.x_term")
        eq_scale_x = self.div(scaled, -count, name=f"{base}.eq_scale_x")
        bias_term = self.div(self.mul(eq_scale_dy, dbias, name=f"{base}.dy_term"), -count, name=f"{base}.bias_term")
        eq_bias = self.sub(bias_term, self.mul(eq_scale_x, mean, name=f"{base}.mean_term"), name=f"{base}.eq_bias")
        return dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias

    def slice(self, input: Tensor, slices: Sequence[builtins.slice] = (), *, name: str | None = None) -> Tensor:
        """A sub-region of ``input`` (cudnn-frontend's ``slice``): one Python slice per dim, as in
        indexing (``slice(0, 2)``, ``slice(1, None, 2)``; dims past the last slice are taken whole).
        The output is a view of the input's memory, its strides the input's times the steps, so a
        packed QKV or a channel range feeds other operations with no copy; it is a virtual tensor
        (mark a copy, ``identity``, as a graph output).

        Raises:
            BadParam: more slices than dims, an item that is not a slice, a step below 1, a slice
                that selects no element.
        """
        base = f"slice_{len(self._nodes)}" if name is None else str(name)
        where = label(base, "slice")
        if not isinstance(input, Tensor):
            raise BadParam(f"{where}: input={input!r} must be a Tensor of this graph")
        if len(slices) > len(input.dims):
            raise BadParam(f"{where}: {len(slices)} slices for input '{input.name}' of dims {list(input.dims)}")
        bounds = []
        for k, size in enumerate(input.dims):
            item = slices[k] if k < len(slices) else slice(None)
            if not isinstance(item, slice):
                raise BadParam(f"{where}: slices[{k}]={item!r} must be a slice")
            try:
                start, stop, step = item.indices(size)
            except (TypeError, ValueError) as error:
                raise BadParam(f"{where}: slices[{k}]={item!r}: {error}") from None
            if step < 1:
                raise BadParam(f"{where}: slices[{k}]={item!r} has step {step}: a view walks its input forward")
            if len(range(start, stop, step)) == 0:
                raise BadParam(f"{where}: slices[{k}]={item!r} selects no element of dim {k} (size {size})")
            bounds.append((start, stop, step))
        attributes = dict(zip(SLICE_KEYS, (tuple(values) for values in zip(*bounds))))
        output = self._add("slice", {"x": input}, attributes, base)["y"]
        output.view_of = (input, attributes["step"])
        return output

    def reshape(
        self, input: Tensor, dims: Sequence[int], strides: Sequence[int] | None = None, *, name: str | None = None
    ) -> Tensor:
        """``input``'s memory read as a tensor of ``dims`` and ``strides`` (cudnn-frontend's
        ``reshape``), counted from its first element; strides default to packed row-major, so that a
        row-major input reshapes as NumPy's ``reshape``. A view, with no copy: dims merged or split,
        permuted strides (a transpose), strides of 0 (a broadcast). Every element must lie on one of
        the input's, each dim stepping along the input's dims (validate checks; the input must not
        overlap itself). The output is virtual and takes the input's type (mark a copy,
        ``identity``, as a graph output).

        Raises:
            BadParam: an input that is not a tensor of this graph, dims that are not ints of 1 or
                more, strides that are not ints of 0 or more, one per dim.
        """
        base = f"reshape_{len(self._nodes)}" if name is None else str(name)
        if not isinstance(input, Tensor):
            raise BadParam(f"{label(base, 'reshape')}: input={input!r} must be a Tensor of this graph")
        shape = checked_dims("dims", dims, f"{base}::y")
        layout = packed_strides(shape) if strides is None else checked_strides(strides, shape, f"{base}::y")
        output = self._add("reshape", {"x": input}, {}, base, {"y": shape})["y"]
        return output.set_stride(layout)

    # ---- concatenation --------------------------------------------------------------------------------

    def concatenate(
        self, inputs: Sequence[Tensor], axis: int, in_place_index: int | None = None, *, name: str | None = None
    ) -> Tensor:
        """``inputs`` joined along ``axis`` (cudnn-frontend's ``concatenate``; a negative axis counts
        from the last dim): dims equal but along the axis, one data type, and the output of that
        type, its dims the inputs' with the axis summed, packed in the first input's memory order.
        Each input is copied into its sub-region of the output, one step of its own on every engine.
        ``in_place_index`` names the input that, in cuDNN, already lives in its sub-region of the
        output's memory, so that cuDNN copies the others only; here it is copied too, which gives
        the same values whether or not its memory is the output's (a copy of an element onto itself
        leaves it as it is).

        Raises:
            BadParam: no input, an input that is not a tensor of this graph, an axis that is not a dim
                of the first input, inputs whose dims differ but along the axis or whose types differ,
                an ``in_place_index`` that names no input.
        """
        base = f"concatenate_{len(self._nodes)}" if name is None else str(name)
        where = label(base, "concatenate")
        if isinstance(inputs, Tensor) or not isinstance(inputs, Sequence) or not inputs:
            raise BadParam(f"{where}: inputs={inputs!r} must be a non-empty sequence of Tensors of this graph")
        for k, tensor in enumerate(inputs):
            if not isinstance(tensor, Tensor) or tensor._graph is not self:
                raise BadParam(f"{where}: inputs[{k}]={tensor!r} must be a Tensor of this graph")
        rank = len(inputs[0].dims)
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -rank <= axis < rank:
            first = inputs[0]
            raise BadParam(f"{where}: axis={axis!r} must be a dim of inputs[0] '{first.name}' {list(first.dims)}")
        if in_place_index is not None and not isinstance(in_place_index, (int, np.integer)):
            raise BadParam(f"{where}: in_place_index={in_place_index!r} must be None or an int")
        attributes = {
            "axis": int(axis) % rank,
            "in_place_index": None if in_place_index is None else int(in_place_index),
        }
        roles: dict[str, Operand | None] = {f"{CONCATENATED}{k}": tensor for k, tensor in enumerate(inputs)}
        return self._add("concatenate", roles, attributes, base)["y"]

    # ---- softmax and pooling --------------------------------------------------------------------------

    def softmax(self, input: Tensor, axis: int = -1, log: bool = False, *, name: str | None = None) -> Tensor:
        """exp(x) / sum(exp(x)) along ``axis`` (log: its logarithm, computed as x - max - log(sum))."""
        rank = len(input.dims) if isinstance(input, Tensor) else 1
        attributes = {"axis": int(axis) % rank if -rank <= int(axis) < rank else int(axis), "log": bool(log)}
        return self._add("softmax", {"x": input}, attributes, name)["y"]

    def pooling(
        self,
        input: Tensor,
        mode: PoolingMode | str = PoolingMode.MAX,
        window: Sequence[int] = (2, 2),
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """Max or average pooling of (N, C, spatial...) over ``window`` (stride default: the window,
        padding default 0); average modes count or skip the padding, as PoolingMode says."""
        attributes = _pooling_attributes(mode, window, stride, padding)
        return self._add("pooling", {"x": input}, attributes, name)["y"]

    def pooling_backward(
        self,
        grad: Tensor,
        input: Tensor,
        mode: PoolingMode | str = PoolingMode.MAX,
        window: Sequence[int] = (2, 2),
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """dx of ``pooling(input, mode, window, stride, padding)`` from its loss ``grad`` (the pooled
        dims): the max modes find each window's maximum in ``input`` again and give its grad to the
        window's first position holding it (NaN matching NaN), the averages spread it over the count."""
        attributes = _pooling_attributes(mode, window, stride, padding)
        return self._add("pooling_backward", {"dy": grad, "x": input}, attributes, name)["dx"]

    def resample(
        self,
        input: Tensor,
        resampling_mode: ResampleMode | str = ResampleMode.MAXPOOL,
        padding_mode: PaddingMode | str | None = None,
        window: Sequence[int] | None = None,
        stride: Sequence[float] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        generate_index: bool = False,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, None]:
        """cudnn-frontend's resampling forward, (y, index).

        The pooling modes are computed as ``pooling`` (window default 2 per spatial dim);
        ``padding_mode`` defaults to the one the mode computes with (NEG_INF_PAD for MAXPOOL, ZERO_PAD
        for the averages); no index tensor is made (the max pooling backward finds each window's
        maximum in x again), so index is None.

        BILINEAR (linear along each of 1 to 3 spatial dims) and NEAREST interpolate: ``stride`` is the
        input pixels per output pixel along each spatial dim (numbers or fractions: 0.5 doubles the
        size), the output ``floor(in / stride)`` pixels, read at half-pixel centres from the edge
        pixels' values (EDGE_VAL_PAD): torch's ``interpolate`` with ``scale_factor = 1 / stride``.

        Raises:
            BadParam: a padding mode other than the mode's, pre_padding unequal to post_padding,
                generate_index; for the interpolating modes a window, padding, or a missing or
                non-positive stride.
        """
        mode = _resampling_mode(resampling_mode, padding_mode)
        if generate_index:
            raise BadParam("generate_index=True: no index tensor is made (the backward finds the maxima in x again)")
        if mode not in POOLING_PADDING:
            attributes = _interpolation_attributes(mode, window, stride, pre_padding, post_padding)
            return self._add("resample", {"x": input}, attributes, name)["y"], None
        arguments = _pooling_arguments(mode, window, stride, pre_padding, post_padding)
        return self.pooling(input, *arguments, name=name), None

    def resample_backward(
        self,
        grad: Tensor,
        input: Tensor | None = None,
        resampling_mode: ResampleMode | str = ResampleMode.MAXPOOL,
        padding_mode: PaddingMode | str | None = None,
        window: Sequence[int] | None = None,
        stride: Sequence[float] | None = None,
        pre_padding: Sequence[int] | None = None,
        post_padding: Sequence[int] | None = None,
        *,
        name: str | None = None,
    ) -> Tensor:
        """dx of ``resample`` with the same parameters, from its loss ``grad`` (cuDNN's resampling
        backward operation, which takes no index: the max mode finds the maxima in x again).

        The pooling modes are ``pooling_backward`` and need the forward's ``input``. The
        interpolating modes read grad alone: each input pixel gathers the gradients of the outputs
        that read it, times their weights; dx's dims are the smallest input the stride resamples
        onto grad's (``ceil(out * stride)``), ``set_dim`` picks another of those (a stride above 1).

        Raises:
            BadParam: as ``resample``; a pooling mode without ``input``, an interpolating one with it.
        """
        mode = _resampling_mode(resampling_mode, padding_mode)
        if mode not in POOLING_PADDING:
            if input is not None:
                raise BadParam(f"input with {mode.name}: the interpolation's backward reads grad alone (input=None)")
            attributes = _interpolation_attributes(mode, window, stride, pre_padding, post_padding)
            return self._add("resample_backward", {"dy": grad}, attributes, name)["dx"]
        if input is None:
            raise BadParam(f"{mode.name} needs input: the forward's x (the pooled windows, and the maxima)")
        arguments = _pooling_arguments(mode, window, stride, pre_padding, post_padding)
        return self.pooling_backward(grad, input, *arguments, name=name)

    # ---- attention ------------------------------------------------------------------------------------

    def sdpa(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_scale: float | None = None,
        is_inference: bool = False,
        causal_mask: bool = False,
        causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        bias: Tensor | None = None,
        use_padding_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        dropout: tuple[float, int, int] | None = None,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Scaled dot-product attention (cudnn-frontend's ``sdpa``): (o, stats), stats None when
        ``is_inference``.

        q (B, Hq, Sq, D), k (B, Hkv, Skv, D), v (B, Hkv, Skv, Dv) of any strides (BHSD, BSHD, packed
        QKV); Hq a multiple of Hkv (grouped-query attention). o is (B, Hq, Sq, Dv) of q's type, stats
        (B, Hq, Sq, 1) FLOAT, the rows' logsumexp. The scores are ``attn_scale * q . k`` (None: 1.0,
        cudnn-frontend's default) plus ``bias`` (broadcast to (B, Hq, Sq, Skv); BOOLEAN: a mask,
        True where the key takes part); ``causal_mask`` keeps key j <= query i, aligned at the top
        left, ``causal_mask_bottom_right`` at the bottom right (the last query sees the last key);
        ``sliding_window_length`` W keeps the keys after i - W; ``use_padding_mask`` masks queries
        and keys past ``seq_len_q`` / ``seq_len_kv`` ((B, 1, 1, 1) INT32 or INT64; their rows give
        o = 0); ``dropout`` is (probability, seed, offset) of the attention family's Philox mask.
        What the family's kernels do not support is refused by ``check_support``.
        """
        attributes = _attention_attributes(
            attn_scale, causal_mask, causal_mask_bottom_right, sliding_window_length, dropout
        )
        attributes["generate_stats"] = not bool(is_inference)
        inputs: dict[str, Operand | None] = {
            "q": q,
            "k": k,
            "v": v,
            "bias": bias,
            **_padding(use_padding_mask, seq_len_q, seq_len_kv),
        }
        out = self._add("sdpa", inputs, attributes, name)
        return out["o"], out.get("stats")

    def sdpa_fp8(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        descale_q: Tensor,
        descale_k: Tensor,
        descale_v: Tensor,
        descale_s: Tensor,
        scale_s: Tensor,
        scale_o: Tensor,
        is_inference: bool = False,
        attn_scale: float | None = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        use_padding_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor, Tensor]:
        """fp8 scaled dot-product attention (cudnn-frontend's ``sdpa_fp8``): (o, stats, amax_s,
        amax_o), stats None when ``is_inference``.

        q, k and v FP8_E4M3 or FP8_E5M2 (one type), of ``sdpa``'s dims and strides; the per-tensor
        factors ``descale_q`` ... ``scale_o`` are FLOAT tensors of one element (read on the device at
        each execute). o is (B, Hq, Sq, Dv) of its role's type (``io_data_type`` or
        ``set_data_type``: FP8_E4M3, FP8_E5M2, BFLOAT16 or HALF), stats (B, Hq, Sq, 1) FLOAT;
        amax_s and amax_o (1, 1, 1, 1) FLOAT receive the largest softmax weight and the largest |o|
        before scale_o. The masks are ``sdpa``'s (``use_causal_mask`` is its ``causal_mask``); the
        formula is in ``opendnn.families.attention.reference``.
        """
        attributes = _fp8_attention_attributes(
            attn_scale, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length
        )
        attributes["generate_stats"] = not bool(is_inference)
        factors = (descale_q, descale_k, descale_v, descale_s, scale_s, scale_o)
        inputs: dict[str, Operand | None] = {
            "q": q,
            "k": k,
            "v": v,
            **dict(zip(FP8_SCALES, factors)),
            **_padding(use_padding_mask, seq_len_q, seq_len_kv),
        }
        out = self._add("sdpa_fp8", inputs, attributes, name)
        return out["o"], out.get("stats"), out["amax_s"], out["amax_o"]

    def sdpa_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        dO: Tensor,
        stats: Tensor,
        attn_scale: float | None = None,
        bias: Tensor | None = None,
        compute_dbias: bool = False,
        use_padding_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        causal_mask: bool = False,
        causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        dropout: tuple[float, int, int] | None = None,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, ...]:
        """The gradients of ``sdpa`` (cudnn-frontend's ``sdpa_backward``) from its o, its stats and
        dO (dims of o): (dQ, dK, dV) of the dims and types of q, k and v, then dBias of the bias's
        dims when ``compute_dbias`` (a float bias only). The parameters must be the forward's."""
        attributes = _attention_attributes(
            attn_scale, causal_mask, causal_mask_bottom_right, sliding_window_length, dropout
        )
        attributes["compute_dbias"] = bool(compute_dbias)
        inputs: dict[str, Operand | None] = {
            "q": q,
            "k": k,
            "v": v,
            "o": o,
            "do": dO,
            "stats": stats,
            "bias": bias,
            **_padding(use_padding_mask, seq_len_q, seq_len_kv),
        }
        out = self._add("sdpa_backward", inputs, attributes, name)
        return tuple(out[role] for role in ("dq", "dk", "dv", "dbias") if role in out)

    def sdpa_fp8_backward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        dO: Tensor,
        stats: Tensor,
        descale_q: Tensor,
        descale_k: Tensor,
        descale_v: Tensor,
        descale_o: Tensor,
        descale_dO: Tensor,
        descale_s: Tensor,
        descale_dP: Tensor,
        scale_s: Tensor,
        scale_dQ: Tensor,
        scale_dK: Tensor,
        scale_dV: Tensor,
        scale_dP: Tensor,
        attn_scale: float | None = None,
        use_padding_mask: bool = False,
        seq_len_q: Tensor | None = None,
        seq_len_kv: Tensor | None = None,
        use_causal_mask: bool = False,
        use_causal_mask_bottom_right: bool = False,
        sliding_window_length: int | None = None,
        *,
        name: str | None = None,
    ) -> tuple[Tensor, ...]:
        """The gradients of ``sdpa_fp8`` (cudnn-frontend's ``sdpa_fp8_backward``): (dQ, dK, dV,
        amax_dQ, amax_dK, amax_dV, amax_dP).

        q, k, v, o and stats are the forward's (o fp8, BFLOAT16 or HALF), dO FP8_E4M3 or FP8_E5M2 of
        o's dims; the per-tensor factors ``descale_q`` ... ``scale_dP`` are FLOAT tensors of one
        element (read on the device at each execute). dQ, dK and dV have the dims of q, k and v and
        their role's type (``io_data_type`` or ``set_data_type``: FP8_E4M3, FP8_E5M2, BFLOAT16 or
        HALF); amax_dQ, amax_dK, amax_dV (1, 1, 1, 1) FLOAT receive the largest |gradient| before
        its scale, amax_dP the largest |dS|. The parameters must be the forward's; the formula is in
        ``opendnn.families.attention.reference``.
        """
        attributes = _fp8_attention_attributes(
            attn_scale, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length
        )
        descales = (descale_q, descale_k, descale_v, descale_o, descale_dO, descale_s, descale_dP)
        scales = (scale_s, scale_dQ, scale_dK, scale_dV, scale_dP)
        inputs: dict[str, Operand | None] = {
            "q": q,
            "k": k,
            "v": v,
            "o": o,
            "do": dO,
            "stats": stats,
            **dict(zip(FP8_BACKWARD_SCALES, (*descales, *scales))),
            **_padding(use_padding_mask, seq_len_q, seq_len_kv),
        }
        out = self._add("sdpa_fp8_backward", inputs, attributes, name)
        return tuple(out[role] for role in ("dq", "dk", "dv", *FP8_BACKWARD_AMAX))


def _conv_attributes(
    spatial: int, padding: Sequence[int] | None, stride: Sequence[int] | None, dilation: Sequence[int] | None
) -> dict[str, Any]:
    def values(given: Sequence[int] | None, default: int) -> tuple[int, ...]:
        return (default,) * max(spatial, 1) if given is None else tuple(int(v) for v in given)

    return {"padding": values(padding, 0), "stride": values(stride, 1), "dilation": values(dilation, 1)}


def _pooling_attributes(
    mode: Any, window: Sequence[int], stride: Sequence[int] | None, padding: Sequence[int] | None
) -> dict[str, Any]:
    """A pooling's attributes: stride default the window, padding default 0."""
    window = tuple(int(w) for w in window)
    return {
        "mode": _enum_value(PoolingMode, mode, "mode"),
        "window": window,
        "stride": window if stride is None else tuple(int(s) for s in stride),
        "padding": (0,) * len(window) if padding is None else tuple(int(p) for p in padding),
    }


def _resampling_mode(resampling_mode: Any, padding_mode: Any) -> ResampleMode:
    """The resampling mode, checking that ``padding_mode`` (None: the mode's own) is the one it computes with."""
    mode = ResampleMode[_enum_name(ResampleMode, resampling_mode, "resampling_mode")]
    padding = POOLING_PADDING.get(mode, PaddingMode.EDGE_VAL_PAD)
    if padding_mode is not None:
        asked = PaddingMode[_enum_name(PaddingMode, padding_mode, "padding_mode")]
        if asked is not padding:
            raise BadParam(f"padding_mode={asked.name} with {mode.name}: {mode.name} computes with {padding.name}")
    return mode


def _pooling_arguments(
    mode: ResampleMode,
    window: Sequence[int] | None,
    stride: Sequence[float] | None,
    pre_padding: Sequence[int] | None,
    post_padding: Sequence[int] | None,
) -> tuple[str, Sequence[int], list[int] | None, Sequence[int]]:
    """A pooling mode's resampling parameters as ``pooling``'s (mode, window, stride, padding): window
    default 2 per spatial dim, the padding symmetric."""
    window = (2, 2) if window is None else window
    pre = pre_padding if pre_padding is not None else (0,) * len(window)
    post = post_padding if post_padding is not None else pre
    if tuple(pre) != tuple(post):
        raise BadParam(f"pre_padding={list(pre)} must equal post_padding={list(post)} (the padding is symmetric)")
    return mode.value, window, None if stride is None else [int(s) for s in stride], pre


def _interpolation_attributes(
    mode: ResampleMode,
    window: Sequence[int] | None,
    stride: Sequence[float] | None,
    pre_padding: Sequence[int] | None,
    post_padding: Sequence[int] | None,
) -> dict[str, Any]:
    """The attributes of a BILINEAR or NEAREST resampling (forward or backward): its mode and stride."""
    if window is not None:
        raise BadParam(f"window={list(window)} with {mode.name}: interpolation reads no window, give stride only")
    for role, padding in (("pre_padding", pre_padding), ("post_padding", post_padding)):
        if padding is not None and any(padding):
            raise BadParam(f"{role}={list(padding)} with {mode.name}: interpolation takes no padding")
    if stride is None:
        raise BadParam(f"{mode.name} needs stride: input pixels per output pixel (0.5 doubles the size)")
    for k, value in enumerate(stride):
        check_finite(f"stride[{k}]", value)  # (a real number: a float, an int or a Fraction)
    steps = [step_fraction(s) for s in stride]
    for k, step in enumerate(steps):
        if step <= 0:
            raise BadParam(f"stride[{k}]={stride[k]} must be positive (input pixels per output pixel)")
    return {"mode": mode.value, "stride": tuple(float(step) for step in steps)}


def _normalized_ndim(scale: Tensor | None) -> int:
    """How many trailing dims layer and RMS norm normalize: those from scale's first dim that is not 1."""
    dims = scale.dims if isinstance(scale, Tensor) else (1,)
    leading = next((k for k, d in enumerate(dims) if d != 1), len(dims) - 1)
    return len(dims) - leading


def _groups(groups: Any) -> Any:
    """A group count as a plain int (a NumPy integer too); anything else is left for the rule to refuse."""
    return int(groups) if isinstance(groups, np.integer) else groups


def _enum_name(kind: type[enum.Enum], value: Any, parameter: str) -> str:
    """The name of the enum member given as the member, its value or its name."""
    value = _enum_value(kind, value, parameter)
    return next(member.name for member in kind if member.value == value)


def _enum_value(kind: type[enum.Enum], value: Any, parameter: str) -> Any:
    """The value of an enum member given as the member, its value or its name."""
    if isinstance(value, kind):
        return value.value
    for member in kind:
        if value in (member.value, member.name) or str(value).upper() == member.name:
            return member.value
    raise BadParam(f"{parameter}={value!r} must be one of {[m.name for m in kind]}")


def _attention_attributes(
    attn_scale: Any,
    causal_mask: bool,
    causal_mask_bottom_right: bool,
    sliding_window_length: Any,
    dropout: Any,
    causal_names: tuple[str, str] = ("causal_mask", "causal_mask_bottom_right"),
) -> dict[str, Any]:
    """cudnn-frontend's SDPA parameters as the attention family's (``AttentionDescriptor``'s fields);
    ``causal_names``: the builder's names of the two causal flags."""
    if isinstance(attn_scale, Tensor):
        raise NotSupported(f"attn_scale=tensor '{attn_scale.name}' is not supported: give a number (None: 1.0)")
    if attn_scale is not None and not (
        isinstance(attn_scale, (int, float, np.number)) and math.isfinite(float(attn_scale))
    ):
        raise BadParam(f"attn_scale={attn_scale!r} must be a finite number or None")
    if causal_mask and causal_mask_bottom_right:
        raise BadParam(
            f"{causal_names[0]}=True and {causal_names[1]}=True: the causal diagonal is aligned at the "
            "top left or at the bottom right, not both"
        )
    left = None
    if sliding_window_length is not None:
        if not (isinstance(sliding_window_length, (int, np.integer)) and sliding_window_length >= 1):
            raise BadParam(f"sliding_window_length={sliding_window_length!r} must be an int of at least 1 or None")
        left = int(sliding_window_length) - 1  # key j takes part when j > i - W
    probability, seed, offset = _dropout(dropout)
    return {
        "scale": 1.0 if attn_scale is None else float(attn_scale),
        "causal": bool(causal_mask or causal_mask_bottom_right),
        "alignment": "bottom_right" if causal_mask_bottom_right else "top_left",
        "window": (left, None),
        "dropout_p": probability,
        "seed": seed,
        "offset": offset,
    }


def _dropout(dropout: Any) -> tuple[float, int, int]:
    """(probability, seed, offset) of cudnn-frontend's Philox form; its (mask, scale) form and
    tensors for the seed and offset are not supported."""
    if dropout is None:
        return 0.0, 0, 0
    if isinstance(dropout, (tuple, list)) and any(isinstance(item, Tensor) for item in dropout):
        raise NotSupported(
            f"dropout={_described(dropout)} is not supported: give (probability, seed, offset) as numbers "
            "(a mask tensor, or a seed or offset tensor, is not supported)"
        )
    if not (isinstance(dropout, (tuple, list)) and len(dropout) == 3):
        raise BadParam(f"dropout={dropout!r} must be (probability, seed, offset) or None")
    probability, seed, offset = dropout
    if not (isinstance(probability, (int, float)) and 0.0 <= probability < 1.0):
        raise BadParam(f"dropout probability={probability!r} must be at least 0 and below 1")
    for what, value, limit in (("seed", seed, MAX_SEED), ("offset", offset, MAX_OFFSET)):
        if not (isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value <= limit):
            raise BadParam(f"dropout {what}={value!r} must be an int from 0 to {limit}")
    return float(probability), int(seed), int(offset)


def _described(items: Sequence[Any]) -> str:
    return "(" + ", ".join(f"tensor '{i.name}'" if isinstance(i, Tensor) else repr(i) for i in items) + ")"


def _fp8_attention_attributes(
    attn_scale: Any, use_causal_mask: bool, use_causal_mask_bottom_right: bool, sliding_window_length: Any
) -> dict[str, Any]:
    """The family's parameters of an fp8 node: no dropout, the causal flags under their fp8 names."""
    causal_names = ("use_causal_mask", "use_causal_mask_bottom_right")
    return _attention_attributes(
        attn_scale, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, None, causal_names
    )


def _padding(use_padding_mask: bool, seq_len_q: Tensor | None, seq_len_kv: Tensor | None) -> dict[str, Tensor]:
    """The sequence lengths, given together with ``use_padding_mask`` (cudnn-frontend's rule)."""
    given = {role: t for role, t in (("seq_len_q", seq_len_q), ("seq_len_kv", seq_len_kv)) if t is not None}
    if use_padding_mask and len(given) != 2:
        raise BadParam("use_padding_mask=True needs both seq_len_q and seq_len_kv")
    if given and not use_padding_mask:
        raise BadParam(f"{' and '.join(given)} given with use_padding_mask=False: set it to True")
    return given


def _largest_of_rank(inputs: Sequence[Tensor], rank: int) -> Tensor | None:
    """The input of ``rank`` dims with the most elements (the first of equals), or None: the tensor
    whose memory order an operation's output takes."""
    candidates = [t for t in inputs if len(t.dims) == rank and not t.pass_by_value]
    return max(candidates, key=lambda t: t.numel, default=None)


def _require_same_dims(where: str, role: str, first: Tensor, others: dict[str, Tensor | None]) -> None:
    """Each tensor of ``others`` has the dims of ``first`` (named ``role``); numbers and None pass."""
    for other_role, tensor in others.items():
        if isinstance(tensor, Tensor) and tensor.dims != first.dims:
            raise BadParam(
                f"{where}: {other_role} '{tensor.name}' dims {list(tensor.dims)} must be {role} "
                f"'{first.name}' dims {list(first.dims)}"
            )
