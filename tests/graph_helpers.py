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


def run(graph, inputs, outputs, engine="reference", poison=np.nan):
    """Build ``graph`` for ``engine`` and execute it: ``inputs`` maps tensors (or names) to arrays,
    ``outputs`` lists the output tensors; returns their arrays (float64), each filled with
    ``poison`` before the run (NaN; a finite value where the graph's own results hold NaN)."""
    build(graph, engine)
    device = graph.handle.device
    if device != "cpu":  # the same run on the graph's device, as torch tensors (of dense inputs' strides)
        inputs = {t: torch.from_numpy(array).to(device) for t, array in inputs.items()}
        arrays = {t: torch.from_numpy(poisoned(t, poison)).to(device) for t in outputs}
        arrays = {t: a.as_strided(t.get_dim(), t.get_stride()) for t, a in arrays.items()}  # .to keeps no order
        workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=device)
        graph.execute({**inputs, **arrays}, workspace)
        return [arrays[t].cpu().double().numpy() for t in outputs]
    arrays = {t: poisoned(t, poison) for t in outputs}
    workspace = np.empty(graph.get_workspace_size(), np.uint8)
    graph.execute({**inputs, **arrays}, workspace)
    return [arrays[t].astype(np.float64) for t in outputs]


def poisoned(tensor, poison):
    """A NumPy array of ``tensor``'s dims, dtype and strides (packed in the memory order the graph
    gives it: an operation's output takes its input's), filled with ``poison``."""
    strides = tensor.get_stride()
    order = sorted(range(len(strides)), key=lambda k: -strides[k])
    array = np.full([tensor.get_dim()[k] for k in order], poison, tensor.get_data_type().to_numpy())
    array = array.transpose(np.argsort(order))
    assert [s // array.itemsize for s in array.strides] == strides or array.size == 1, "a packed layout"
    return array


def relative_error(actual, expected):
    expected = np.asarray(expected, np.float64)
    assert not np.isnan(actual).any(), "an output element was never written"
    return float(np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30))


# ---- NaN, infinities and signed zeros ----------------------------------------------------------------

SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 0.75, -1.5, 3.0], np.float32)
POISON = 1234.5  # the outputs' fill where NaN is a result: an element left unwritten then shows
QUIET_NUMPY = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's warnings of the NaN it computes


def special_operands(arity):
    """Every combination of SPECIAL_VALUES over ``arity`` operands, as one flat array per operand."""
    grids = np.meshgrid(*[SPECIAL_VALUES] * arity, indexing="ij")
    return [grid.ravel().copy() for grid in grids]


def pointwise_node(graph, mode, operands):
    """The graph method of ``mode`` (clipped relu with ceiling 6) applied to ``operands``."""
    name = mode.value
    if name.startswith("clipped_relu"):
        method = graph.relu if name.endswith("_fwd") else graph.relu_backward
        return method(*operands, upper_clip=6.0)
    if name.endswith("_fwd"):
        return getattr(graph, name.removesuffix("_fwd"))(*operands)
    if name.endswith("_bwd"):
        return getattr(graph, name.removesuffix("_bwd") + "_backward")(*operands)
    return getattr(graph, name)(*operands)


def pointwise_special_values(mode):
    """A graph builder (``on_both_engines``): ``mode`` alone over ``special_operands``."""

    def build_graph(g):
        operands = special_operands(mode.arity)
        tensors = [g.tensor_like(array, name=f"in{k}") for k, array in enumerate(operands)]
        y = pointwise_node(g, mode, tensors)
        y.set_output(True)
        return dict(zip(tensors, operands)), [y]

    return build_graph


SPECIAL_BIAS = np.array([-0.0, 0.0, np.inf, -np.inf], np.float32)  # per output channel: each zero, each infinity


def epilogue_special_values(anchor, activation):
    """A graph builder: ``activation(-0.5 * product + bias)`` after a 1x1 ``conv_fprop`` or a
    ``matmul`` of one input channel. NaN and infinities come from the input and the bias, -0.0 from
    -0.5 * (+0) (the input holds +0, not -0, and the weights are positive, so the product's zero is
    +0 whatever the order of its sum), +0 from adding a bias of +0."""
    column = np.where(np.signbit(SPECIAL_VALUES) & (SPECIAL_VALUES == 0), -0.25, SPECIAL_VALUES)
    weights = np.random.default_rng(42).uniform(0.5, 1.5, 4).astype(np.float32)

    def build_graph(g):
        if anchor == "conv_fprop":
            x, w, b = column.reshape(1, 1, 2, 4), weights.reshape(4, 1, 1, 1), SPECIAL_BIAS.reshape(1, 4, 1, 1)
            xt, wt, bt = graph_inputs(g, x=x, w=w, b=b)
            product = g.conv_fprop(xt, wt, padding=[0, 0])
        else:
            x, w, b = column.reshape(8, 1), weights.reshape(1, 4), SPECIAL_BIAS
            xt, wt, bt = graph_inputs(g, x=x, w=w, b=b)
            product = g.matmul(xt, wt)
        y = pointwise_node(g, activation, [g.bias(g.scale(product, -0.5), bt)])
        y.set_output(True)
        return {xt: x, wt: w, bt: b}, [y]

    return build_graph


def prologue_special_values(activation):
    """A graph builder: ``activation(-0.5 * x)``, a comparison and a select fused before a sum over
    each row, x of NaN, infinities, zeros of each sign and finite values, each row mixing them;
    every one of them is an output."""
    rows = np.stack([np.roll(SPECIAL_VALUES, k) for k in range(0, 8, 3)], axis=1)  # (8, 3)

    def build_graph(g):
        (xt,) = graph_inputs(g, x=rows)
        activated = pointwise_node(g, activation, [g.scale(xt, -0.5)])
        keep = g.cmp_ge(activated, 0.25)
        selected = g.binary_select(activated, xt, keep)
        total = g.reduction(selected, "add", [8, 1])
        for t in (activated, keep, selected, total):
            t.set_output(True)
        return {xt: rows}, [activated, keep, selected, total]

    return build_graph


def on_both_engines(build_graph, engine, device="cpu"):
    """``build_graph(graph) -> (inputs, outputs)`` run on ``engine`` on ``device`` and on the
    reference engine: (the engine's outputs, the reference's, the engine's plan's steps)."""
    results, steps = {}, []
    for name, where in ((engine, device), ("reference", "cpu")):
        g = og.Graph(handle=od.Handle(where), name=f"special_{name}")
        inputs, outputs = build_graph(g)
        results[name] = run(g, inputs, outputs, name, poison=POISON)
        steps = steps or [type(step).__name__ for step in g.plan.steps]
    return results[engine], results["reference"], steps


def assert_same_special_values(actual, expected, tolerance, what=""):
    """``actual`` holds NaN, each infinity and each signed zero exactly where ``expected`` does, and
    its other values within ``tolerance`` (relative error of the norm)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), f"{what}: NaN positions")
    infinite, zero = np.isinf(expected), expected == 0
    np.testing.assert_array_equal(np.isinf(actual), infinite, f"{what}: infinite positions")
    np.testing.assert_array_equal(actual[infinite], expected[infinite], f"{what}: infinities")
    np.testing.assert_array_equal(actual[zero], 0.0, f"{what}: zeros")
    np.testing.assert_array_equal(np.signbit(actual[zero]), np.signbit(expected[zero]), f"{what}: signs of zeros")
    finite = np.isfinite(expected) & ~zero
    assert relative_error(actual[finite], expected[finite]) < tolerance, what


def random(rng, shape, dtype=np.float32):
    """Random normal values (never zeros), as ``dtype``."""
    return rng.standard_normal(shape).astype(dtype)


def strided(rng, values, padded):
    """``values`` in a random memory order, inside a larger buffer (a sub-region, the rest NaN) when
    ``padded``: the array a caller binds, of the same values."""
    order = rng.permutation(values.ndim)
    margin = [int(rng.integers(0, 2)) if padded else 0 for _ in range(values.ndim)]
    buffer = np.full([values.shape[k] + 2 * margin[k] for k in order], np.nan, values.dtype)
    inside = buffer[tuple(slice(margin[k], margin[k] + values.shape[k]) for k in order)]
    view = inside.transpose(np.argsort(order))
    view[...] = values
    return view


def graph_inputs(graph, **arrays):
    """A graph input per array, named by its keyword, with the array's dims, strides and type."""
    return [graph.tensor_like(array, name=name) for name, array in arrays.items()]


def cpu_graph(name="graph", **types):
    return og.Graph(handle=od.Handle("cpu"), name=name, **types)


def t64(array):
    return torch.tensor(np.asarray(array, np.float64))
