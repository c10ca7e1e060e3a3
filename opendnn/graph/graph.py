"""``Graph``: an operation graph's builder and lifecycle, as cudnn-frontend's Python ``pygraph``.

    g = Graph(io_data_type=..., compute_data_type=..., intermediate_data_type=..., handle=...)
    x = g.tensor(dim=..., stride=..., name="x"); ...; y = g.relu(g.conv_fprop(x, w)); y.set_output(True)
    g.validate(); g.build_operation_graph(); g.create_execution_plans([HeurMode.A])
    g.check_support(); g.build_plans()
    workspace = ...get_workspace_size() bytes...
    g.execute({x: x_array, w: w_array, y: y_array}, workspace)   # or keyed by name: {"x": ...}

Any change to the graph (a node, a tensor, a setter) sends it back to the start of the lifecycle.
Plans are cached on the handle under the graph's key (a hash of its JSON form), so building the
same graph again (or deserializing it) finds its plans, generated kernels loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from opendnn.core.arrays import CPU
from opendnn.core.dtypes import DataType
from opendnn.core.errors import BadParam, NotSupported, Status
from opendnn.core.handle import Handle, create
from opendnn.graph import engines
from opendnn.graph.builder import NUMBERS, Node, OperationBuilder
from opendnn.graph.capture import capture_cuda_graph
from opendnn.graph.engines import BuildPlanPolicy, HeurMode
from opendnn.graph.memory import Binding
from opendnn.graph.operation_graph import FORMAT, OperationGraph, validate
from opendnn.graph.operations import OPERATIONS
from opendnn.graph.plan import ExecutionPlan
from opendnn.graph.tensor import Tensor

PLAN_CACHE_LIMIT = 256  # graph plans kept in a handle's algorithm cache


class Graph(OperationBuilder):
    """An operation graph (see the module docstring for the lifecycle).

    Args:
        io_data_type: the type of tensors the caller binds, unless set per tensor (default FLOAT).
        compute_data_type: FLOAT or DOUBLE: the arithmetic of fused kernels (default FLOAT).
        intermediate_data_type: the type of virtual tensors, unless set (default FLOAT).
        handle: the Handle plans are built for and run on (default: a new one, on the current CUDA
            device when torch sees one, else the CPU).
        name: the graph's name, in messages and generated kernels.
    """

    def __init__(
        self,
        io_data_type: Any = DataType.FLOAT,
        compute_data_type: Any = DataType.FLOAT,
        intermediate_data_type: Any = DataType.FLOAT,
        handle: Handle | None = None,
        name: str = "graph",
    ) -> None:
        super().__init__(io_data_type, compute_data_type, intermediate_data_type, name)
        self.handle = handle if handle is not None else create()
        self._changed()

    def _changed(self) -> None:
        self._operation_graph: OperationGraph | None = None
        self._validated: OperationGraph | None = None
        self._candidates: list[str] = []
        self._support: dict[str, str | None] = {}
        self._planned: dict[str, ExecutionPlan] = {}
        self._plans: list[ExecutionPlan] = []
        self._binding: list[tuple[int, Tensor, str, bool]] = []  # the tensors execute takes from the pack
        self._kept: dict[int, Binding] = {}  # the last execute's binding, by plan index
        self._captures: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(CUDA graph) -> (it, what it captured)

    # ---- the lifecycle --------------------------------------------------------------------------------

    def validate(self) -> None:
        """Check the whole graph (see ``opendnn.graph.operation_graph``).

        Raises:
            BadParam: naming the node and tensor that break a rule.
        """
        self._validated = validate(self)

    def build_operation_graph(self) -> None:
        """Freeze the validated graph into the operation graph the engines plan."""
        if self._validated is None:
            self.validate()
        self._operation_graph = self._validated

    def create_execution_plans(self, modes: HeurMode | Iterable[HeurMode] = (HeurMode.A,)) -> None:
        """Propose engines, best first, from the heuristics ``modes`` (HeurMode.A: fused, per_node,
        reference; B: per_node, reference; FALLBACK: reference)."""
        self._require(self._operation_graph, "create_execution_plans", "build_operation_graph")
        modes = [modes] if isinstance(modes, HeurMode) else list(modes)
        names: list[str] = []
        for mode in modes:
            if not isinstance(mode, HeurMode):
                raise BadParam(f"modes holds {mode!r}: each must be a HeurMode ({[m.name for m in HeurMode]})")
            names += [name for name in engines.HEURISTICS[mode] if name not in names]
        self._candidates = names
        self._support, self._planned, self._plans = {}, {}, []

    def check_support(self) -> dict[str, str | None]:
        """Plan every proposed engine: {engine: None if it supports the graph, else its reason}.

        Raises:
            NotSupported: no proposed engine supports the graph, with each engine's reason.
            BadParam: the graph breaks a rule of an operation's call, naming the node.
        """
        graph = self._require(self._operation_graph, "check_support", "build_operation_graph")
        if not self._candidates:
            raise BadParam("check_support needs create_execution_plans first")
        for name in self._candidates:
            if name in self._support:
                continue
            cached = self.handle.algorithm_cache.get(_cache_key(graph, name))
            try:
                self._planned[name] = cached if cached is not None else engines.plan(name, graph, self.handle)
                self._support[name] = None
            except NotSupported as error:
                self._support[name] = str(error)
        if not any(reason is None for reason in self._support.values()):
            reasons = "; ".join(f"{reason}" for reason in self._support.values())
            raise NotSupported(f"graph '{self.name}': no engine supports it: {reasons}", Status.NOT_SUPPORTED)
        return dict(self._support)

    def build_plans(self, policy: BuildPlanPolicy = BuildPlanPolicy.HEURISTICS_CHOICE) -> None:
        """Build the best supported plan (or all of them), loading their generated kernels."""
        graph = self._require(self._operation_graph, "build_plans", "build_operation_graph")
        self.check_support()
        chosen = [name for name in self._candidates if self._support.get(name) is None]
        if BuildPlanPolicy(policy) is BuildPlanPolicy.HEURISTICS_CHOICE:
            chosen = chosen[:1]
        self._plans, self._kept = [], {}  # a kept binding belongs to the plan it was made for
        for name in chosen:
            plan = self._planned[name]
            plan.compile()
            key = _cache_key(graph, name)
            if key not in self.handle.algorithm_cache and len(self.handle.algorithm_cache) < PLAN_CACHE_LIMIT:
                self.handle.algorithm_cache[key] = plan
            self._plans.append(plan)
        bound = [t for t in graph.tensors if t.bound_by_caller]
        self._binding = [(t.uid, self._tensors[t.uid], t.name, t.by_value) for t in bound]

    def get_execution_plan_count(self) -> int:
        return len(self._plans)

    def get_workspace_size(self) -> int:
        """Bytes of workspace ``execute`` needs (the first plan's)."""
        return self.get_workspace_size_plan_at_index(0)

    def get_workspace_size_plan_at_index(self, index: int) -> int:
        return self._plan_at(index).workspace_size

    @property
    def plan(self) -> ExecutionPlan:
        """The plan ``execute`` runs: ``plan.source()`` is its generated kernels' source,
        ``plan.describe()`` its steps."""
        return self._plan_at(0)

    def execute(self, variant_pack: Mapping[Tensor | str, Any], workspace: Any, handle: Handle | None = None) -> None:
        """Run the first plan: ``variant_pack`` maps each graph input and output (the Tensor or its
        name) to an array, and each scalar given at execute time to its value; ``workspace`` is a
        contiguous array of at least ``get_workspace_size()`` bytes (None for 0).

        Raises:
            BadParam: a tensor missing from the pack, an unknown key, an array of the wrong type,
                shape or device, a workspace missing or too small.
        """
        self.execute_plan_at_index(variant_pack, workspace, 0, handle)

    def execute_plan_at_index(
        self, variant_pack: Mapping[Tensor | str, Any], workspace: Any, index: int, handle: Handle | None = None
    ) -> None:
        plan = self._plan_at(index)
        self._kept[index] = plan.execute(
            self._arrays(variant_pack), workspace, handle if handle is not None else self.handle, self._kept.get(index)
        )

    def drop_kept_binding(self) -> None:
        """Forget the binding the last execute kept (reused when the next pack gives the very same
        arrays): a caller whose packs hold new arrays at every call then keeps none of them alive."""
        self._kept.clear()

    def _arrays(self, variant_pack: Mapping[Tensor | str, Any]) -> list[Any]:
        """The pack's arrays and execute-time scalars by uid (None for the other tensors)."""
        arrays: list[Any] = [None] * len(self._tensors)
        for uid, tensor, name, by_value in self._binding:
            array = variant_pack.get(tensor)
            if array is None:
                array = variant_pack.get(name)
                if array is None:
                    raise BadParam(f"variant_pack has no entry for tensor '{name}' (by the Tensor or its name)")
            if by_value and not isinstance(array, NUMBERS):
                raise BadParam(
                    f"variant_pack['{name}']={array!r} must be a number: '{name}' is a scalar passed by value"
                )
            arrays[uid] = array
        if len(variant_pack) != len(self._binding):
            self._refuse_unknown(variant_pack)
        return arrays

    def _refuse_unknown(self, variant_pack: Mapping[Tensor | str, Any]) -> None:
        known = {key for _, tensor, name, _ in self._binding for key in (tensor, name)}
        for key in variant_pack:
            if key not in known:
                what = f"tensor '{key.name}'" if isinstance(key, Tensor) else repr(key)
                raise BadParam(f"variant_pack holds {what}, which is no input or output of graph '{self.name}'")
        raise BadParam("variant_pack gives a tensor twice (by the Tensor and by its name)")

    def _plan_at(self, index: int) -> ExecutionPlan:
        if not self._plans:
            raise BadParam("the graph has no built plan: call build_plans first")
        if not 0 <= index < len(self._plans):
            raise BadParam(f"index={index} must be below get_execution_plan_count()={len(self._plans)}")
        return self._plans[index]

    def _require(self, state: OperationGraph | None, step: str, before: str) -> OperationGraph:
        if state is None:
            raise BadParam(f"{step} needs {before} first (the graph changed, or the step was skipped)")
        return state

    # ---- CUDA graphs ----------------------------------------------------------------------------------

    def populate_cuda_graph(
        self,
        variant_pack: Mapping[Tensor | str, Any],
        workspace: Any,
        cuda_graph: Any = None,
        handle: Handle | None = None,
    ) -> Any:
        """Capture the first plan's launches over ``variant_pack`` into ``cuda_graph`` (a new
        ``torch.cuda.CUDAGraph`` when None) and return it. ``cuda_graph.replay()`` then runs the plan
        with no host work per launch, on what the pack's tensors and the workspace hold at replay
        time: copy new inputs into them. The capture fixes the tensors' memory (their data
        pointers), the workspace's and the execute-time scalars' values; ``update_cuda_graph`` points
        the graph at other ones. One eager execute (on the capturing stream) comes first: it checks
        the pack and compiles the kernels for its pointers, which cannot happen inside a capture.

        Raises:
            NotSupported: the handle on the CPU (a CUDA graph records launches on a CUDA device).
            BadParam: the pack or workspace refused, as by ``execute``.
        """
        handle = self._cuda_handle("populate_cuda_graph", handle)
        captured = self._captured(variant_pack, workspace)
        graph = capture_cuda_graph(lambda: self.execute(variant_pack, workspace, handle), handle, cuda_graph)
        self._captures[id(graph)] = (graph, captured)
        return graph

    def update_cuda_graph(
        self, variant_pack: Mapping[Tensor | str, Any], workspace: Any, cuda_graph: Any, handle: Handle | None = None
    ) -> list[str]:
        """Point ``cuda_graph`` (made by ``populate_cuda_graph``) at ``variant_pack``: captured again
        when a tensor's memory (its data pointer), the workspace's or an execute-time scalar's value
        differs from the capture's; new contents in the same tensors need nothing.

        Returns:
            the names of the pack's entries that differ ("workspace" for it), in the graph's order;
            empty when the capture already fits the pack.

        Raises:
            NotSupported: the handle on the CPU.
            BadParam: ``cuda_graph`` not captured by this graph's ``populate_cuda_graph``.
        """
        handle = self._cuda_handle("update_cuda_graph", handle)
        kept = self._captures.get(id(cuda_graph))
        if kept is None or kept[0] is not cuda_graph:
            raise BadParam(f"cuda_graph={cuda_graph!r} was not captured by populate_cuda_graph of graph '{self.name}'")
        captured = self._captured(variant_pack, workspace)
        changed = [name for name, value in captured.items() if kept[1][name] != value]
        if changed:
            cuda_graph.reset()
            self.populate_cuda_graph(variant_pack, workspace, cuda_graph, handle)
        return changed

    def _cuda_handle(self, step: str, handle: Handle | None) -> Handle:
        """``handle`` (the graph's when None) for a CUDA graph step, which needs a built plan and a CUDA device."""
        self._plan_at(0)
        handle = handle if handle is not None else self.handle
        if handle.device == CPU:
            raise NotSupported(
                f"{step}: graph '{self.name}' runs on the handle's device cpu, and a CUDA graph captures "
                "launches on a CUDA device",
                Status.NOT_SUPPORTED,
            )
        return handle

    def _captured(self, variant_pack: Mapping[Tensor | str, Any], workspace: Any) -> dict[str, Any]:
        """What a capture fixes, by name: each tensor's data pointer, each execute-time scalar's value."""
        arrays = self._arrays(variant_pack)
        fixed = {name: _address(arrays[uid]) for uid, _, name, _ in self._binding}
        fixed["workspace"] = None if workspace is None else _address(workspace)
        return fixed

    # ---- serialization --------------------------------------------------------------------------------

    def serialize(self) -> bytes:
        """The graph and its plan choice as JSON bytes; ``Graph.deserialize`` rebuilds both."""
        graph = self._require(self._operation_graph, "serialize", "build_operation_graph")
        data = graph.to_json()
        data["plans"] = [plan.engine for plan in self._plans]
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def deserialize(cls, data: bytes | str, handle: Handle | None = None) -> Graph:
        """The graph ``serialize`` wrote, validated, its operation graph built and, when plans were
        chosen, the same engines' plans built.

        Raises:
            BadParam: data that is not a serialized graph, or a graph that breaks a rule.
        """
        try:
            content = json.loads(data)
            if content.get("format") != FORMAT:
                raise ValueError(f"format={content.get('format')!r}")
            graph = cls(
                DataType[content["io_data_type"]],
                DataType[content["compute_data_type"]],
                DataType[content["intermediate_data_type"]],
                handle,
                content["name"],
            )
            graph._restore(content["tensors"], content["nodes"])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
            raise BadParam(f"data is not a graph serialized by Graph.serialize ({FORMAT}): {error}") from None
        graph.build_operation_graph()
        if content.get("plans"):
            unknown = [name for name in content["plans"] if name not in engines.ENGINES]
            if unknown:
                raise BadParam(f"data names engine {unknown[0]!r}, not one of {list(engines.ENGINES)}")
            graph._candidates = list(content["plans"])
            graph.build_plans(BuildPlanPolicy.ALL)
        return graph

    def _restore(self, tensors: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        for entry in tensors:
            self._new_tensor(
                entry["name"],
                entry["dims"],
                entry["strides"],
                DataType[entry["data_type"]],
                virtual=entry["virtual"],
                value=entry["value"],
                pass_by_value=entry["by_value"],
            )
        for entry in nodes:
            if entry["op"] not in OPERATIONS:
                raise ValueError(f"node '{entry['name']}' has op={entry['op']!r}, not one of {sorted(OPERATIONS)}")
            attributes = {k: tuple(v) if isinstance(v, list) else v for k, v in entry["attributes"].items()}
            inputs = {role: self._tensors[uid] for role, uid in entry["inputs"].items()}
            outputs = {role: self._tensors[uid] for role, uid in entry["outputs"].items()}
            self._nodes.append(Node(entry["name"], entry["op"], inputs, outputs, attributes))
        self._changed()


def _cache_key(graph: OperationGraph, engine: str) -> tuple[str, str, str]:
    return ("opendnn.graph", graph.key, engine)


def _address(array: Any) -> Any:
    """A scalar's value; a tensor's data pointer; the identity of another object."""
    if isinstance(array, NUMBERS):
        return array
    data_ptr = getattr(array, "data_ptr", None)
    return data_ptr() if callable(data_ptr) else id(array)
