"""cudnn-frontend's ``concatenate`` in the graph API: random inputs of random ranks, axes, memory
orders and sub-regions of larger buffers, bound and computed (virtual, in the workspace), joined into
a bound or a virtual output, on the reference engine (NumPy), the per-node and fused engines
(Triton, through its interpreter), against torch.cat in float64 with NaN-poisoned outputs; the
steps around it, ``in_place_index``, a serialized graph, ``check_support`` and the refusals."""

import json

import numpy as np
import pytest
import torch
from graph_helpers import build, cpu_graph, graph_inputs, kernel_cache, random, strided, t64  # noqa: F401

import opendnn as od
import opendnn.graph as og

ENGINES = ["reference", "per_node", "fused"]

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


def element_strides(array):
    return [s // array.itemsize for s in array.strides]


def execute(g, engine, pack):
    """Build ``g`` for ``engine`` (validate to build_plans) and execute it on ``pack``."""
    build(g, engine)
    g.execute(pack, np.empty(g.get_workspace_size(), np.uint8))


def random_case(rng, g):
    """A random concatenation in ``g``: (the graph inputs' arrays by tensor, the output tensor and
    its poisoned array, the expected float64 result)."""
    rank = int(rng.integers(1, 5))
    axis = int(rng.integers(0, rank))
    dims = [int(d) for d in rng.integers(1, 4, rank)]
    count = int(rng.integers(1, 5))
    pack, joined, expected = {}, [], []
    for k in range(count):
        shape = list(dims)
        shape[axis] = int(rng.integers(1, 4))
        values = random(rng, shape, np.float64)
        array = strided(rng, values, padded=bool(rng.integers(0, 2)))
        (tensor,) = graph_inputs(g, **{f"x{k}": array})
        pack[tensor] = array
        computed = bool(rng.integers(0, 2))  # a virtual input, written by a step before into the workspace
        joined.append(g.mul(tensor, 2.0) if computed else tensor)
        expected.append(t64(values) * (2.0 if computed else 1.0))
    given_axis = axis - rank if rng.integers(0, 2) else axis  # a negative axis counts from the last dim
    y = g.concatenate(joined, given_axis, name="cat")
    result = torch.cat(expected, axis).numpy()
    if rng.integers(0, 2):  # a virtual output, read from the workspace by a step after it
        y = g.neg(y)
        result = -result
    out = strided(rng, np.full(result.shape, np.nan), padded=bool(rng.integers(0, 2)))
    y.set_output(True).set_stride(element_strides(out))
    return pack, y, out, result


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(12))
def test_concatenate_of_random_layouts_equals_torch_cat(engine, seed):
    rng = np.random.default_rng(seed)
    g = cpu_graph(io_data_type=og.DataType.DOUBLE, intermediate_data_type=og.DataType.DOUBLE)
    pack, y, out, expected = random_case(rng, g)
    execute(g, engine, {**pack, y: out})
    np.testing.assert_array_equal(out, expected)  # a copy: every element exact
    assert np.count_nonzero(~np.isnan(out.base)) == out.size  # nothing written around the output's region
    assert "node 'cat' (concatenate) as its own call" in g.plan.describe()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_concatenate_keeps_the_type_signed_zeros_and_nan_of_its_inputs(engine, dtype):
    values = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5], dtype).reshape(2, 3)
    g = cpu_graph(io_data_type=og.DataType.of(dtype))
    a, b = graph_inputs(g, a=values, b=values[::-1].copy())
    y = g.concatenate([a, b], 1)
    y.set_output(True)
    assert y.get_data_type() is og.DataType.of(dtype)
    out = np.full((2, 6), 1234.5, dtype)
    execute(g, engine, {a: values, b: values[::-1].copy(), y: out})
    expected = np.concatenate([values, values[::-1]], 1)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(expected))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_densenet_step_concatenates_a_convolution_with_its_input_between_fused_kernels(engine):
    """relu(x * s + b) -> conv -> concatenate with x -> relu: the concatenation is a step of its own
    between a generated kernel (or the convolution's epilogue) and the next, its inputs and output in
    the workspace, the output channels-last like x."""
    rng = np.random.default_rng(11)
    x = random(rng, (2, 3, 4, 4)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # NHWC memory
    w, s, b = random(rng, (2, 3, 3, 3)), random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph()
    xt, wt, st, bt = graph_inputs(g, x=x, w=w, s=s, b=b)
    features = g.conv_fprop(g.relu(g.add(g.mul(xt, st), bt)), wt, padding=[1, 1])
    joined = g.concatenate([xt, g.relu(features)], 1, name="cat")
    assert joined.get_dim() == [2, 5, 4, 4] and joined.get_stride() == [80, 1, 20, 5]
    y = g.mul(joined, 0.5)
    y.set_output(True)
    out = np.full((2, 4, 4, 5), np.nan, np.float32).transpose(0, 3, 1, 2)
    execute(g, engine, {xt: x, wt: w, st: s, bt: b, y: out})
    image = torch.relu(t64(x) * t64(s) + t64(b))
    expected = 0.5 * torch.cat([t64(x), torch.relu(torch.nn.functional.conv2d(image, t64(w), padding=1))], 1)
    assert float(np.linalg.norm(out - expected.numpy()) / np.linalg.norm(expected.numpy())) < 1e-5
    steps = [type(step).__name__ for step in g.plan.steps]
    if engine == "fused":
        assert steps == ["FusedKernel", "EpilogueCall", "NodeCall", "FusedKernel"]
    assert g.get_workspace_size() > 0


@pytest.mark.parametrize("engine", ENGINES)
def test_slices_join_in_another_order_and_a_slice_of_the_joined_tensor_feeds_a_node(engine):
    """Views on both sides: the halves of a tensor swapped (the inputs are views of the caller's
    array), and a channel range of the virtual result (a view of its workspace region) negated."""
    rng = np.random.default_rng(14)
    x = random(rng, (2, 6, 3))
    g = cpu_graph()
    (xt,) = graph_inputs(g, x=x)
    swapped = g.concatenate([g.slice(xt, [slice(None), slice(3, 6)]), g.slice(xt, [slice(None), slice(0, 3)])], 1)
    y = g.neg(g.slice(swapped, [slice(None), slice(1, 5, 2)]))
    y.set_output(True)
    out = np.full((2, 2, 3), np.nan, np.float32)
    execute(g, engine, {xt: x, y: out})
    np.testing.assert_array_equal(out, -np.concatenate([x[:, 3:], x[:, :3]], 1)[:, 1:5:2])


@pytest.mark.parametrize("engine", ENGINES)
def test_the_in_place_input_may_already_live_in_the_outputs_memory(engine):
    """cuDNN's in_place_index: input 1 is a view of its sub-region of the output; it is copied onto
    itself, the other inputs around it."""
    rng = np.random.default_rng(12)
    a, c = random(rng, (2, 2, 3)), random(rng, (2, 1, 3))
    out = np.full((2, 6, 3), np.nan, np.float32)
    inside = out[:, 2:5]
    inside[...] = random(rng, (2, 3, 3))
    kept = inside.copy()
    g = cpu_graph()
    at, bt, ct = graph_inputs(g, a=a, b=inside, c=c)
    y = g.concatenate([at, bt, ct], 1, in_place_index=1)
    y.set_output(True)
    execute(g, engine, {at: a, bt: inside, ct: c, y: out})
    np.testing.assert_array_equal(out, np.concatenate([a, kept, c], 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_serialized_concatenation_of_eleven_inputs_joins_them_in_order(engine):
    """The serialized graph sorts its roles (x0, x1, x10, x2, ...): the inputs still join by number."""
    rng = np.random.default_rng(13)
    arrays = [random(rng, (2, k + 1)) for k in range(11)]
    g = cpu_graph()
    tensors = graph_inputs(g, **{f"in{k}": array for k, array in enumerate(arrays)})
    y = g.concatenate(tensors, -1, in_place_index=3, name="cat")
    y.set_output(True)
    execute(g, engine, {**dict(zip(tensors, arrays)), y: np.full((2, 66), np.nan, np.float32)})
    again = og.Graph.deserialize(g.serialize(), handle=od.Handle("cpu"))
    assert again.plan.engine == engine
    out = np.full((2, 66), np.nan, np.float32)
    again.execute({**{f"in{k}": array for k, array in enumerate(arrays)}, y.name: out}, None)
    np.testing.assert_array_equal(out, np.concatenate(arrays, 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_concatenate_copies_integers_and_booleans_exactly(engine):
    a = np.array([[16777217, -2147483647, 123456789]], np.int32)  # past float32's exact integers
    b = np.array([[2147483647, -7, 0]], np.int32)
    g = cpu_graph()
    at, bt = graph_inputs(g, a=a, b=b)
    y = g.concatenate([at, bt], 0)
    y.set_output(True)
    flags = np.array([[True, False]])
    ft = g.tensor_like(flags, name="flags")
    z = g.concatenate([ft, ft], 1)
    z.set_output(True)
    out, joined = np.zeros((2, 3), np.int32), np.zeros((1, 4), np.bool_)
    execute(g, engine, {at: a, bt: b, ft: flags, y: out, z: joined})
    np.testing.assert_array_equal(out, np.concatenate([a, b]))
    np.testing.assert_array_equal(joined, [[True, False, True, False]])


def test_an_int64_concatenation_is_refused_by_every_engine_with_the_reason():
    g = cpu_graph()
    a = g.tensor([2, 3], data_type=og.DataType.INT64, name="a")
    g.concatenate([a, a], 0, name="cat").set_output(True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.NotSupported, match=r"no engine supports it") as error:
        g.check_support()
    reason = "node 'cat' (concatenate): output y is INT64, which its copies (transform_tensor, in float64) keep"
    assert str(error.value).count(reason) == 3


def test_check_support_plans_a_concatenation_on_every_engine_and_refuses_past_the_workspace_limit():
    g = og.Graph(handle=od.Handle("cpu", workspace_limit=64))
    a, b = g.tensor([4, 8], name="a"), g.tensor([4, 8], name="b")
    g.neg(g.concatenate([g.relu(a), b], 0)).set_output(True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.NotSupported, match=r"needs \d+ bytes of workspace, above the handle's workspace_limit=64"):
        g.check_support()
    g = cpu_graph()
    a, b = g.tensor([4, 8], name="a"), g.tensor([4, 8], name="b")
    g.concatenate([g.relu(a), b], 0).set_output(True)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    assert g.check_support() == {"fused": None, "per_node": None, "reference": None}


def _inputs(g):
    return g.tensor([2, 3, 4], name="a"), g.tensor([2, 5, 4], name="b")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (lambda g, a, b: ([], 1), r"node 'concatenate_0' \(concatenate\): inputs=\[\] must be a non-empty sequence"),
        (lambda g, a, b: (a, 1), r"inputs=Tensor\('a'.* must be a non-empty sequence of Tensors"),
        (lambda g, a, b: ([a, 2.0], 1), r"inputs\[1\]=2.0 must be a Tensor of this graph"),
        (lambda g, a, b: ([a, cpu_graph().tensor([2, 5, 4])], 1), r"inputs\[1\]=Tensor\(.* must be a Tensor of this"),
        (lambda g, a, b: ([a, b], 3), r"axis=3 must be a dim of inputs\[0\] 'a' \[2, 3, 4\]"),
        (lambda g, a, b: ([a, b], -4), r"axis=-4 must be a dim of inputs\[0\] 'a'"),
        (lambda g, a, b: ([a, b], 1.0), r"axis=1.0 must be a dim"),
        (lambda g, a, b: ([a, b], 0), r"inputs\[1\] 'b' dims \[2, 5, 4\] must equal inputs\[0\] 'a' dims \[2, 3, 4\] "),
        (lambda g, a, b: ([a, g.tensor([2, 3], name="c")], 1), r"inputs\[1\] 'c' dims \[2, 3\] must equal inputs\[0\]"),
        (
            lambda g, a, b: ([a, g.tensor([2, 5, 4], data_type=og.DataType.HALF, name="h")], 1),
            r"inputs\[1\] 'h' data type HALF must be inputs\[0\] 'a''s FLOAT",
        ),
        (lambda g, a, b: ([a, b], 1, 2), r"in_place_index=2 must be None or the index of one of the 2 inputs"),
        (lambda g, a, b: ([a, b], 1, -1), r"in_place_index=-1 must be None or the index"),
        (lambda g, a, b: ([a, b], 1, "0"), r"in_place_index='0' must be None or an int"),
        (lambda g, a, b: ([a, g.scalar(1.0, name="s")], 0), r"x1 's' is a scalar passed by value"),
    ],
)
def test_concatenate_refuses_by_name(arguments, message):
    g = cpu_graph()
    a, b = _inputs(g)
    with pytest.raises(od.BadParam, match=message):
        g.concatenate(*arguments(g, a, b))


def test_validate_checks_the_rule_again_after_set_dim():
    g = cpu_graph()
    a, b = _inputs(g)
    g.concatenate([a, b], 1, name="cat").set_output(True)
    b.set_dim([3, 5, 4])
    with pytest.raises(od.BadParam, match=r"node 'cat' \(concatenate\): inputs\[1\] 'b' dims \[3, 5, 4\] must equal"):
        g.validate()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda node: node["inputs"].pop("x1"), r"inputs \['x0', 'x2'\] must be x0 to x1, one for each tensor"),
        (lambda node: node["inputs"].update(x01=node["inputs"].pop("x1")), r"input role 'x01' is not one of x0, x1"),
        (lambda node: node["inputs"].clear(), r"inputs is empty: concatenate joins one tensor or more"),
        (lambda node: node["attributes"].update(axis=3), r"axis=3 must be a dim of input 'a' \[2, 3, 4\]"),
        (lambda node: node["attributes"].update(in_place_index=True), r"in_place_index=True must be None or the"),
    ],
)
def test_a_deserialized_concatenation_out_of_its_rule_is_refused_by_name(edit, message):
    g = cpu_graph()
    a, b = _inputs(g)
    c = g.tensor([2, 1, 4], name="c")
    g.concatenate([a, b, c], 1, name="cat").set_output(True)
    g.validate()
    g.build_operation_graph()
    data = json.loads(g.serialize())
    edit(data["nodes"][0])
    with pytest.raises(od.BadParam, match=message):
        og.Graph.deserialize(json.dumps(data), handle=od.Handle("cpu"))
