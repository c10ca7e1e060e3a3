"""The engines that turn an operation graph into a plan, and the heuristics that rank them.

    fused      the fusion rule of ``opendnn.graph.fusion``: generated Triton kernels for pointwise
               regions (ending in a reduction or genstats), convolutions and matmuls with their
               epilogues, every other node as its own call, on the Triton backend;
    per_node   every node as its own call on the Triton backend;
    reference  every node as its own call on the NumPy backend: the float64-exact oracle, CPU only.

An engine refuses a graph with a reason (``NotSupported``): its backend missing or not runnable on
the handle's device, a node its backend refuses, a type its kernels do not take, or more workspace
than the handle's ``workspace_limit``.
"""

from __future__ import annotations

import enum
import os

from opendnn.core.arrays import CPU
from opendnn.core.errors import NotSupported, Status
from opendnn.core.handle import Handle, require_backend_available
from opendnn.graph.calls import NodeCall
from opendnn.graph.fusion import Epilogue, Region, partition
from opendnn.graph.operation_graph import OperationGraph
from opendnn.graph.plan import EpilogueCall, ExecutionPlan, FusedKernel, Step


class HeurMode(enum.Enum):
    """Which engines ``create_execution_plans`` proposes, best first (cudnn-frontend's heur_mode)."""

    A = "a"  # fused, then per_node, then reference
    B = "b"  # per_node, then reference
    FALLBACK = "fallback"  # reference


class BuildPlanPolicy(enum.Enum):
    """``build_plans`` builds the first supported plan (HEURISTICS_CHOICE) or every supported one (ALL)."""

    HEURISTICS_CHOICE = "heuristics_choice"
    ALL = "all"


ENGINES = ("fused", "per_node", "reference")
HEURISTICS = {
    HeurMode.A: ("fused", "per_node", "reference"),
    HeurMode.B: ("per_node", "reference"),
    HeurMode.FALLBACK: ("reference",),
}
BACKEND = {"fused": "triton", "per_node": "triton", "reference": "numpy"}


def plan(engine: str, graph: OperationGraph, handle: Handle) -> ExecutionPlan:
    """``engine``'s plan of ``graph`` on ``handle``'s device (kernels not loaded yet).

    Raises:
        NotSupported: the engine refuses the graph, with the reason.
        BadParam: the graph breaks a rule of one of its operations' calls, naming the node.
    """
    backend = BACKEND[engine]
    _require_runnable(engine, backend, handle)
    probe = Handle(
        handle.device,
        backend=backend,
        math_type=handle.math_type,
        deterministic=handle.deterministic,
        workspace_limit=handle.workspace_limit,
    )
    steps: list[Step] = []
    if engine == "fused":
        from opendnn.graph.kernel_library import LIBRARY

        for part in partition(graph):
            if isinstance(part, Region):
                steps.append(_fused(part, graph, LIBRARY))
            elif isinstance(part, Epilogue):
                steps.append(EpilogueCall(part, graph, probe))
            else:
                steps.append(NodeCall(part, graph, probe))
    else:
        steps = [NodeCall(node, graph, probe) for node in graph.nodes]
    result = ExecutionPlan(engine, graph, steps, backend)
    limit = handle.workspace_limit
    if limit is not None and result.workspace_size > limit:
        raise NotSupported(
            f"engine '{engine}' needs {result.workspace_size} bytes of workspace, above the handle's "
            f"workspace_limit={limit}",
            Status.NOT_SUPPORTED,
        )
    return result


def _fused(region: Region, graph: OperationGraph, library: dict[str, str]) -> FusedKernel:
    try:
        return FusedKernel(region, graph, library)
    except NotSupported as error:
        raise NotSupported(f"{region.nodes[-1].label}'s fused kernel: {error}", error.status) from None


def _require_runnable(engine: str, backend: str, handle: Handle) -> None:
    if backend == "numpy":
        if handle.device != CPU:
            raise NotSupported(
                f"engine '{engine}' runs on the CPU (the NumPy backend), not on the handle's device {handle.device}",
                Status.NOT_SUPPORTED,
            )
        return
    if handle.device == CPU and os.environ.get("TRITON_INTERPRET") != "1":  # asked before triton is imported
        raise NotSupported(
            f"engine '{engine}' runs Triton kernels, which on the CPU need Triton's interpreter: set "
            "TRITON_INTERPRET=1 before triton is first imported",
            Status.NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING,
        )
    try:
        require_backend_available(backend)
    except NotSupported as error:
        raise NotSupported(f"engine '{engine}': {error}", error.status) from None
