"""What the graph tests share: building a graph through its whole lifecycle, running it on one
engine with NaN-poisoned outputs, and comparing with a float64 result."""

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.graph as og


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Generated kernels in a test's own folder (a test module imports this fixture and marks it autouse)."""
    monkeypatch.setenv("OPENDNN_GRAPH_KERNELS", str(tmp_path))


ENGINE_MODES = {"fused": og.HeurMode.A, "per_node": og.HeurMode.B, "reference": og.HeurMode.FALLBACK}


def build(graph, engine="reference"):
    """validate -> build_operation_graph -> create_execution_plans -> check_support -> build_plans,
    with ``engine`` the first proposed."""
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([ENGINE_MODES[engine]])
    graph.check_support()
    graph.build_plans()
    assert graph.plan.engine == engine
    return graph


def run(graph, inputs, outputs, engine="reference"):
    """Build ``graph`` for ``engine`` and execute it: ``inputs`` maps tensors (or names) to arrays,
    ``outputs`` lists the output tensors; returns their arrays (float64), each poisoned with NaN
    before the run."""
    build(graph, engine)
    arrays = {t: np.full(t.get_dim(), np.nan, t.get_data_type().to_numpy()) for t in outputs}
    workspace = np.empty(graph.get_workspace_size(), np.uint8)
    graph.execute({**inputs, **arrays}, workspace)
    return [arrays[t].astype(np.float64) for t in outputs]


def relative_error(actual, expected):
    expected = np.asarray(expected, np.float64)
    assert not np.isnan(actual).any(), "an output element was never written"
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


def random(rng, shape, dtype=np.float32):
    """Random normal values (never zeros), as ``dtype``."""
    return rng.standard_normal(shape).astype(dtype)


def graph_inputs(graph, **arrays):
    """A graph input per array, named by its keyword, with the array's dims, strides and type."""
    return [graph.tensor_like(array, name=name) for name, array in arrays.items()]


def cpu_graph(name="graph", **types):
    return og.Graph(handle=od.Handle("cpu"), name=name, **types)


def t64(array):
    return torch.tensor(np.asarray(array, np.float64))
