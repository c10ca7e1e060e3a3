"""cudnn-frontend's ``reshape`` in the graph API: a tensor's memory read in other dims and strides,
with no copy. Random chains of torch's views (merged and split dims, permutations, new dims of 1,
broadcasts) of bound inputs in random memory orders and sub-regions of larger buffers, and of
computed (virtual) tensors, read by the nodes after them, on the reference engine (NumPy) and the
per-node and fused engines (Triton, through its interpreter), against torch in float64 with
NaN-poisoned outputs; a reshape around a matmul, a serialized graph, and the refusals."""

import numpy as np
import pytest
import torch
from graph_helpers import cpu_graph, kernel_cache, random, relative_error, run, strided  # noqa: F401

import opendnn as od
import opendnn.graph as og

ENGINES = ["reference", "per_node", "fused"]
WIDE = {f"{kind}_data_type": og.DataType.DOUBLE for kind in ("io", "compute", "intermediate")}

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


def random_view(rng, tensor):
    """A random view of ``tensor`` as torch takes it (a reshape only where it is a view of the memory)."""
    shape = tensor.shape
    kind = ["view", "permute", "unsqueeze", "expand", "flatten"][int(rng.integers(0, 5))]
    if kind == "permute":
        return tensor.permute(*[int(k) for k in rng.permutation(tensor.dim())])
    if kind == "unsqueeze":
        return tensor.unsqueeze(int(rng.integers(0, tensor.dim() + 1)))
    if kind == "expand":
        ones = [k for k, size in enumerate(shape) if size == 1]
        if not ones:
            return tensor.unsqueeze(0).expand(int(rng.integers(2, 4)), *shape)
        wide = list(shape)
        wide[ones[int(rng.integers(0, len(ones)))]] = int(rng.integers(2, 4))
        return tensor.expand(*wide)
    if kind == "flatten" and tensor.dim() > 1:
        start = int(rng.integers(0, tensor.dim() - 1))
        try:
            return tensor.view(*shape[:start], shape[start] * shape[start + 1], *shape[start + 2 :])
        except RuntimeError:  # not a view of its memory
            return tensor
    factors = [(a, tensor.numel() // a) for a in range(1, tensor.numel() + 1) if tensor.numel() % a == 0]
    try:
        return tensor.view(*factors[int(rng.integers(0, len(factors)))])
    except RuntimeError:
        return tensor


def viewed(rng, dims, strides, count):
    """``count`` random views in a row of a tensor of ``dims`` and ``strides``: the views as functions
    of a torch tensor, and the last view's dims and strides."""
    chain = []
    probe = torch.empty_strided(dims, strides, device="meta")
    for _ in range(count):
        seed = int(rng.integers(0, 2**31))
        chain.append(lambda t, seed=seed: random_view(np.random.default_rng(seed), t))
        probe = chain[-1](probe)
    return chain, list(probe.shape), list(probe.stride())


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(12))
def test_random_views_of_bound_and_computed_tensors_read_their_elements(engine, seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    values = random(rng, [int(d) for d in rng.integers(1, 4, rank)], np.float64)
    x = strided(rng, values, padded=bool(rng.integers(0, 2)))
    computed = bool(rng.integers(0, 2))  # the view of the relu's output, not of x
    g = cpu_graph(**WIDE)
    xt = g.tensor_like(x, name="x")
    source = g.relu(xt) if computed else xt
    chain, dims, strides = viewed(rng, source.get_dim(), source.get_stride(), int(rng.integers(1, 4)))
    view = g.reshape(source, dims, strides)
    y = g.mul(view, 3.0).set_output(True).set_stride(torch.empty(dims).stride())  # packed, whatever the view's order

    expected = torch.empty_strided(source.get_dim(), source.get_stride(), dtype=torch.float64)
    expected.copy_(t64(np.maximum(values, 0) if computed else values))  # in the source's layout: the same views
    for step in chain:
        expected = step(expected)
    (result,) = run(g, {xt: x}, [y], engine)
    assert result.shape == tuple(dims)
    assert relative_error(result, 3.0 * expected.numpy()) < 1e-15


def t64(array):
    return torch.tensor(np.asarray(array, np.float64))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_linear_layer_over_three_dims_reads_its_input_and_output_through_reshapes(engine):
    """(B, L, W) merged to (B * L, W) for the matmul, whose output is split back and added to a
    residual: torch's view -> addmm -> view."""
    rng = np.random.default_rng(0)
    x, w, bias = random(rng, (2, 3, 4), np.float64), random(rng, (4, 5), np.float64), random(rng, (1, 5), np.float64)
    residual = random(rng, (2, 3, 5), np.float64)
    g = cpu_graph(**WIDE)
    xt, wt, bt, rt = (g.tensor_like(a, name=n) for a, n in ((x, "x"), (w, "w"), (bias, "bias"), (residual, "r")))
    rows = g.reshape(g.tanh(xt), [6, 4])
    product = g.add(g.matmul(rows, wt), bt)
    y = g.add(g.reshape(product, [2, 3, 5]), rt).set_output(True)

    (result,) = run(g, {xt: x, wt: w, bt: bias, rt: residual}, [y], engine)
    expected = (np.tanh(x).reshape(6, 4) @ w + bias).reshape(2, 3, 5) + residual
    assert relative_error(result, expected) < 1e-14
    assert "reshape" in g.plan.describe() and "as a view of its input's memory (no launch)" in g.plan.describe()


def test_a_serialized_reshape_reads_the_same_view():
    rng = np.random.default_rng(1)
    x = random(rng, (3, 4), np.float64)
    g = cpu_graph(**WIDE)
    xt = g.tensor_like(x, name="x")
    y = g.identity(g.reshape(g.exp(xt), [4, 3], [1, 4])).set_output(True).set_stride([3, 1])
    run(g, {xt: x}, [y])
    again = og.Graph.deserialize(g.serialize(), handle=od.Handle("cpu"))
    out = np.full((4, 3), np.nan)
    again.execute({"x": x, y.get_name(): out}, np.empty(again.get_workspace_size(), np.uint8))
    assert relative_error(out, np.exp(x).T) < 1e-15


def reshape_of(dims, strides, source_strides=None, output=False):
    """A graph reading a relu's (2, 3) output, or a bound (2, 2) input of ``source_strides``, as
    ``dims`` and ``strides``: the view copied out, or marked as the output itself."""
    g = cpu_graph()
    if source_strides is None:
        source = g.relu(g.tensor([2, 3], name="x"), name="relu")
    else:
        source = g.tensor([2, 2], source_strides, name="x")
    view = g.reshape(source, dims, strides, name="view")
    (view if output else g.identity(view)).set_output(True)
    return g


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: reshape_of([7], None),
            r"node 'view' \(reshape\): output y 'view::y' dims \[7\] strides \[1\] must address elements of "
            r"input 'relu::y' \(dims \[2, 3\], strides \[3, 1\]\)",
        ),
        (
            lambda: reshape_of([2], [2], source_strides=(4, 1)),
            r"output y 'view::y' dims \[2\] strides \[2\] must address elements of input 'x' \(dims \[2, 2\], "
            r"strides \[4, 1\]\)",
        ),
        (
            lambda: reshape_of([3], None, source_strides=(1, 1)),
            r"must address elements of input 'x' \(dims \[2, 2\], strides \[1, 1\]\)",
        ),
        (
            lambda: reshape_of([3, 2], None, output=True),
            r"node 'view' \(reshape\): output y 'view::y' is a view of input 'relu::y' and cannot be a graph output",
        ),
    ],
    ids=["past the input", "between its elements", "an overlapping input", "a graph output"],
)
def test_a_reshape_that_does_not_view_its_input_is_refused_naming_the_node(make, message):
    g = make()
    with pytest.raises(od.BadParam, match=message):
        g.validate()


def test_bad_arguments_of_a_reshape_are_refused_naming_the_node():
    g = cpu_graph()
    x = g.tensor([2, 3], name="x")
    with pytest.raises(od.BadParam, match=r"node 'view' \(reshape\): input=3 must be a Tensor of this graph"):
        g.reshape(3, [6], name="view")
    with pytest.raises(od.BadParam, match=r"tensor 'view::y': dims=\['a', 'b'\] must be a sequence of ints"):
        g.reshape(x, ["a", "b"], name="view")
    with pytest.raises(od.BadParam, match=r"tensor 'view::y': dims=\[6, 0\] must hold 1 or more dims"):
        g.reshape(x, [6, 0], name="view")
    with pytest.raises(od.BadParam, match=r"tensor 'view::y': stride=\[1\] must hold 2 strides"):
        g.reshape(x, [3, 2], [1], name="view")
    y = g.reshape(x, [6], name="view")
    g.identity(y).set_output(True)
    y.set_data_type(og.DataType.HALF)
    with pytest.raises(od.BadParam, match=r"node 'view' \(reshape\): output y 'view::y' data type HALF must be FLOAT"):
        g.validate()
