"""cudnn-frontend's batch norm steps (``bn_finalize``, ``dbn_weight``) and views (``slice``) in the
graph API: on the reference engine (NumPy), the per-node and fused engines (Triton, through its
interpreter), against torch in float64, through a serialized graph, and their refusals."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import (  # noqa: F401
    cpu_graph,
    graph_inputs,
    kernel_cache,
    random,
    relative_error,
    run,
    t64,
)

import opendnn as od
import opendnn.graph as og

ENGINES = ["reference", "per_node", "fused"]
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


# ---- bn_finalize --------------------------------------------------------------------------------------


def _batchnorm2d(scale, bias, running_mean, running_var, momentum, epsilon):
    """torch's BatchNorm2d in float64, training, with the given parameters and running statistics."""
    channels = scale.size
    module = torch.nn.BatchNorm2d(channels, eps=epsilon, momentum=momentum).double().train()
    with torch.no_grad():
        for parameter, value in (
            (module.weight, scale),
            (module.bias, bias),
            (module.running_mean, running_mean),
            (module.running_var, running_var),
        ):
            parameter.copy_(t64(value).flatten())
    return module


@pytest.mark.parametrize("engine", ENGINES)
def test_genstats_bn_finalize_and_relu_match_torchs_batchnorm2d_training_forward(engine):
    """ResNet training's pattern: a convolution's statistics, finalized, folded into the scale and
    bias the next step applies; the running statistics move as torch's."""
    rng = np.random.default_rng(1)
    x, w = random(rng, (3, 4, 3, 3)), random(rng, (5, 4, 3, 3))
    scale, bias = random(rng, (1, 5, 1, 1)), random(rng, (1, 5, 1, 1))
    running_mean, running_var = random(rng, (1, 5, 1, 1)), np.abs(random(rng, (1, 5, 1, 1))) + 0.5
    g = cpu_graph()
    xt, wt, st, bt, mt, vt = graph_inputs(g, x=x, w=w, scale=scale, bias=bias, mean=running_mean, var=running_var)
    conv = g.conv_fprop(xt, wt, padding=[1, 1])
    total, squares = g.genstats(conv)
    eq_scale, eq_bias, mean, inv_variance, next_mean, next_var = g.bn_finalize(
        total, squares, st, bt, 1e-3, 3 * 3 * 3, mt, vt, 0.25
    )
    y = g.relu(g.add(g.mul(conv, eq_scale), eq_bias))
    outputs = [y, mean, inv_variance, next_mean, next_var]
    for t in outputs:
        t.set_output(True)
    assert [t.get_dim() for t in outputs[1:]] == [[1, 5, 1, 1]] * 4
    results = run(g, {xt: x, wt: w, st: scale, bt: bias, mt: running_mean, vt: running_var}, outputs, engine)

    module = _batchnorm2d(scale, bias, running_mean, running_var, momentum=0.25, epsilon=1e-3)
    image = TF.conv2d(t64(x), t64(w), padding=1)
    expected_y = torch.relu(module(image)).detach().numpy()
    batch_mean = image.mean((0, 2, 3), keepdim=True).numpy()
    biased_var = image.var((0, 2, 3), unbiased=False, keepdim=True).numpy()
    expected = [
        expected_y,
        batch_mean,
        1 / np.sqrt(biased_var + 1e-3),
        module.running_mean.numpy().reshape(1, 5, 1, 1),
        module.running_var.numpy().reshape(1, 5, 1, 1),
    ]
    for name, out, want in zip(("y", "mean", "inv_variance", "next_mean", "next_var"), results, expected):
        assert relative_error(out, want) < TOLERANCE, name


@pytest.mark.parametrize("engine", ENGINES)
def test_bn_finalize_takes_epsilon_and_accum_count_given_at_execute_time(engine):
    rng = np.random.default_rng(2)
    total = random(rng, (1, 6, 1, 1)) * 10
    squares = total * total / 8 + np.abs(random(rng, (1, 6, 1, 1))) * 20  # a positive variance
    scale, bias = random(rng, (1, 6, 1, 1)), random(rng, (1, 6, 1, 1))
    g = cpu_graph()
    tt, qt, st, bt = graph_inputs(g, sum=total, sq_sum=squares, scale=scale, bias=bias)
    epsilon, count = g.scalar(name="epsilon"), g.scalar(name="count")
    eq_scale, eq_bias, mean, inv_variance, next_mean, next_var = g.bn_finalize(tt, qt, st, bt, epsilon, count)
    assert next_mean is None and next_var is None
    outputs = [eq_scale, eq_bias, mean, inv_variance]
    for t in outputs:
        t.set_output(True)
    pack = {tt: total, qt: squares, st: scale, bt: bias, "epsilon": 0.01, "count": 8.0}
    results = run(g, pack, outputs, engine)
    s, q = total.astype(np.float64), squares.astype(np.float64)
    want_mean = s / 8
    want_inv = 1 / np.sqrt(q / 8 - want_mean**2 + 0.01)
    want_scale = scale * want_inv
    expected = [want_scale, bias - want_mean * want_scale, want_mean, want_inv]
    for name, out, want in zip(("eq_scale", "eq_bias", "mean", "inv_variance"), results, expected):
        assert relative_error(out, want) < TOLERANCE, name


def test_bn_finalize_with_a_count_given_at_execute_time_updates_the_unbiased_running_variance():
    rng = np.random.default_rng(3)
    total, squares = random(rng, (1, 3, 1, 1)), np.abs(random(rng, (1, 3, 1, 1))) + 4
    running_mean, running_var = random(rng, (1, 3, 1, 1)), np.abs(random(rng, (1, 3, 1, 1)))
    g = cpu_graph()
    tt, qt, mt, vt = graph_inputs(g, sum=total, sq_sum=squares, mean=running_mean, var=running_var)
    count = g.scalar(name="count")
    outputs = g.bn_finalize(tt, qt, 1.0, 0.0, 1e-5, count, mt, vt, g.scalar(name="momentum"))
    for t in outputs:
        t.set_output(True)  # every output is computed, so each is read or asked for
    pack = {tt: total, qt: squares, mt: running_mean, vt: running_var, "count": 5.0, "momentum": 0.3}
    *_, out_mean, out_var = run(g, pack, outputs)
    mean = total.astype(np.float64) / 5
    unbiased = (squares / 5 - mean**2) * 5 / 4
    assert relative_error(out_mean, 0.7 * running_mean + 0.3 * mean) < TOLERANCE
    assert relative_error(out_var, 0.7 * running_var + 0.3 * unbiased) < TOLERANCE


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"scale": (1, 4, 1, 1)},
            r"node 'bn_finalize_\d+' \(bn_finalize\): scale 'scale' dims \[1, 4, 1, 1\] must be sum 'sum' "
            r"dims \[1, 3, 1, 1\]",
        ),
        (
            {"running": False, "momentum": 0.1},
            r"prev_running_mean, prev_running_var and momentum must be given together",
        ),
        ({"momentum": None}, r"prev_running_mean, prev_running_var and momentum must be given together"),
        ({"epsilon": -1.0}, r"epsilon=-1.0 must be finite and at least 0.0"),
        ({"epsilon": float("nan")}, r"epsilon=nan must be finite"),
        ({"accum_count": 1}, r"accum_count=1 must be finite and at least 2"),
        ({"momentum": 1.5}, r"momentum=1.5 must be in \[0, 1\]"),
        ({"sum": 2.0}, r"sum=2.0 must be a Tensor of this graph"),
    ],
)
def test_bn_finalize_refuses_by_name(arguments, message):
    g = cpu_graph()
    per_channel = {name: g.tensor([1, 3, 1, 1], name=name) for name in ("sum", "sq_sum", "mean", "var")}
    given = {
        "sum": per_channel["sum"],
        "sq_sum": per_channel["sq_sum"],
        "scale": g.tensor(arguments.pop("scale", (1, 3, 1, 1)), name="scale"),
        "bias": g.tensor([1, 3, 1, 1], name="bias"),
        "epsilon": 1e-5,
        "accum_count": 16,
        "momentum": 0.1,
    }
    if arguments.pop("running", True):
        given |= {"prev_running_mean": per_channel["mean"], "prev_running_var": per_channel["var"]}
    with pytest.raises(od.BadParam, match=message):
        g.bn_finalize(**(given | arguments))


# ---- dbn_weight ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_dbn_weight_gives_torchs_parameter_gradients_and_the_factors_of_dx(engine):
    rng = np.random.default_rng(4)
    x, dy, scale = random(rng, (3, 4, 2, 3)), random(rng, (3, 4, 2, 3)), random(rng, (1, 4, 1, 1))
    x64 = x.astype(np.float64)
    mean = x64.mean((0, 2, 3), keepdims=True).astype(np.float32)
    inv_variance = (1 / np.sqrt(x64.var((0, 2, 3), keepdims=True) + 1e-5)).astype(np.float32)
    g = cpu_graph()
    dyt, xt, mt, it, st = graph_inputs(g, dy=dy, x=x, mean=mean, inv_variance=inv_variance, scale=scale)
    dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias = g.dbn_weight(dyt, xt, mt, it, st)
    dx = g.add(g.add(g.mul(dyt, eq_scale_dy), g.mul(xt, eq_scale_x)), eq_bias)
    outputs = [dscale, dbias, dx]
    for t in outputs:
        t.set_output(True)
    assert [t.get_dim() for t in (dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias)] == [[1, 4, 1, 1]] * 5
    results = run(g, {dyt: dy, xt: x, mt: mean, it: inv_variance, st: scale}, outputs, engine)

    image, weight = t64(x).requires_grad_(), t64(scale).flatten().requires_grad_()
    shift = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    TF.batch_norm(image, None, None, weight, shift, training=True, eps=1e-5).backward(t64(dy))
    expected = [weight.grad.numpy().reshape(1, 4, 1, 1), shift.grad.numpy().reshape(1, 4, 1, 1), image.grad.numpy()]
    for name, out, want in zip(("dscale", "dbias", "dx"), results, expected):
        assert relative_error(out, want) < TOLERANCE, name


@pytest.mark.parametrize(
    ("dims", "message"),
    [
        ({"dy": (2, 3, 4, 5)}, r"node 'dbn_weight_\d+' \(dbn_weight\): dy 'dy' dims \[2, 3, 4, 5\] must be x 'x'"),
        ({"mean": (1, 3, 1)}, r"mean 'mean' dims \[1, 3, 1\] must be \[1, 3, 1, 1\] \(one per channel of x 'x'"),
        ({"scale": (3,)}, r"scale 'scale' dims \[3\] must be \[1, 3, 1, 1\]"),
        ({"x": (3,), "dy": (3,)}, r"x 'x' dims \[3\] must have at least 2 dims \(N, C, ...\)"),
    ],
)
def test_dbn_weight_refuses_by_name(dims, message):
    g = cpu_graph()
    shapes = {"dy": (2, 3, 4, 4), "x": (2, 3, 4, 4), "mean": (1, 3, 1, 1), "inv_variance": (1, 3, 1, 1)}
    shapes |= {"scale": (1, 3, 1, 1)} | dims
    tensors = {name: g.tensor(shape, name=name) for name, shape in shapes.items()}
    with pytest.raises(od.BadParam, match=message):
        g.dbn_weight(**tensors)


def test_a_serialized_bn_finalize_and_dbn_weight_graph_runs_as_the_original():
    rng = np.random.default_rng(5)
    x, dy = random(rng, (2, 3, 2, 2)), random(rng, (2, 3, 2, 2))
    scale, bias = random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph()
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    total, squares = g.genstats(xt)
    eq_scale, eq_bias, mean, inv_variance, *_ = g.bn_finalize(total, squares, st, bt, 1e-5, 8)
    y = g.add(g.mul(xt, eq_scale), eq_bias)
    outputs = [y, *g.dbn_weight(dyt, xt, mean, inv_variance, st)]
    for t in outputs:
        t.set_output(True)
    pack = {xt: x, dyt: dy, st: scale, bt: bias}
    original = run(g, pack, outputs)
    again = og.Graph.deserialize(g.serialize(), handle=od.Handle("cpu"))
    arrays = [np.full(t.get_dim(), np.nan, np.float32) for t in outputs]
    names = dict(zip((t.name for t in outputs), arrays))
    workspace = np.empty(again.get_workspace_size(), np.uint8)
    again.execute({"x": x, "dy": dy, "scale": scale, "bias": bias, **names}, workspace)
    for out, want in zip(arrays, original):
        assert np.array_equal(out, want)


# ---- slice --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_slices_of_a_packed_qkv_feed_pointwise_nodes_as_views(engine):
    rng = np.random.default_rng(6)
    qkv = random(rng, (2, 5, 12))
    g = cpu_graph()
    (packed,) = graph_inputs(g, qkv=qkv)
    q = g.slice(packed, [slice(None), slice(None), slice(0, 4)])
    k = g.slice(packed, [slice(None), slice(1, 5, 2), slice(4, 8)])
    v = g.slice(packed, [slice(None), slice(None, None, 2), slice(8, None)])  # dims past the last taken whole
    assert (q.get_dim(), q.get_stride()) == ([2, 5, 4], [60, 12, 1])
    assert (k.get_dim(), k.get_stride()) == ([2, 2, 4], [60, 24, 1])
    assert (v.get_dim(), v.get_stride()) == ([2, 3, 4], [60, 24, 1])
    y = g.mul(q, 3.0)
    z = g.add(g.add(g.slice(q, [slice(0, 2), slice(1, 3)]), g.slice(v, [slice(None), slice(0, 2)])), k)
    for t in (y, z):
        t.set_output(True)
    out_y, out_z = run(g, {packed: qkv}, [y, z], engine)
    q64 = qkv.astype(np.float64)
    assert relative_error(out_y, 3 * q64[:, :, 0:4]) < TOLERANCE
    assert relative_error(out_z, q64[:, 1:3, 0:4] + q64[:, 0:4:2, 8:12] + q64[:, 1:5:2, 4:8]) < TOLERANCE
    assert "node 'slice_0' (slice) as a view of its input's memory (no launch)" in g.plan.describe()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_channel_range_of_a_computed_tensor_feeds_a_convolution(engine):
    """The sliced tensor is virtual: it lives in the workspace, and the slice is a view of it there."""
    rng = np.random.default_rng(7)
    x, w = random(rng, (2, 6, 4, 4)), random(rng, (3, 2, 3, 3))
    g = cpu_graph()
    xt, wt = graph_inputs(g, x=x, w=w)
    activated = g.relu(g.mul(xt, 0.5))
    channels = g.slice(activated, [slice(None), slice(1, 5, 2)])
    assert channels.get_dim() == [2, 2, 4, 4] and channels.get_stride() == [96, 32, 4, 1]
    y = g.conv_fprop(channels, wt, padding=[1, 1])
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w}, [y], engine)
    relu = torch.relu(t64(x) * 0.5)
    expected = TF.conv2d(relu[:, 1:5:2], t64(w), padding=1).numpy()
    assert relative_error(out, expected) < TOLERANCE
    assert g.get_workspace_size() > 0  # relu's output crosses to the convolution's step through the slice


@pytest.mark.parametrize("engine", ENGINES)
def test_an_operation_after_a_slice_of_a_channels_last_image_keeps_its_memory_order(engine):
    rng = np.random.default_rng(8)
    x = random(rng, (2, 4, 3, 3)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # NHWC memory
    g = cpu_graph()
    (xt,) = graph_inputs(g, x=x)
    part = g.slice(xt, [slice(None), slice(0, 3), slice(1, 3)])
    assert part.get_stride() == [36, 1, 12, 4]
    y = g.sigmoid(part)
    y.set_output(True)
    assert y.get_stride() == [18, 1, 9, 3]  # channels-last, packed
    (out,) = run(g, {xt: x}, [y], engine)
    assert relative_error(out, torch.sigmoid(t64(x)[:, 0:3, 1:3]).numpy()) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("computed", [False, True])
def test_slices_of_one_tensor_starting_at_one_element_feed_one_node(engine, computed):
    """Two views of one input (or of a computed tensor, in the workspace) from the same first element
    with different extents, read by one node."""
    rng = np.random.default_rng(10)
    x = random(rng, (4, 5))
    g = cpu_graph()
    (xt,) = graph_inputs(g, x=x)
    source = g.relu(g.mul(xt, 0.5)) if computed else xt
    a = g.slice(source, [slice(2, 3), slice(2, 3)])
    b = g.slice(source, [slice(2, 4), slice(2, 5)])
    y = g.add(a, b)
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    source64 = torch.relu(t64(x) * 0.5) if computed else t64(x)
    assert relative_error(out, (source64[2:3, 2:3] + source64[2:4, 2:5]).numpy()) < TOLERANCE


def test_a_serialized_slice_runs_as_the_original():
    rng = np.random.default_rng(9)
    x = random(rng, (4, 6))
    g = cpu_graph()
    (xt,) = graph_inputs(g, x=x)
    y = g.neg(g.slice(xt, [slice(1, 4), slice(0, 6, 3)]))
    y.set_output(True)
    (original,) = run(g, {xt: x}, [y])
    again = og.Graph.deserialize(g.serialize(), handle=od.Handle("cpu"))
    out = np.full((3, 2), np.nan, np.float32)
    again.execute({"x": x, y.name: out}, None)
    assert np.array_equal(out, original) and np.array_equal(out, -x[1:4, 0:6:3])


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        ([slice(0, 2)] * 3, r"node 'slice_\d+' \(slice\): 3 slices for input 'x' of dims \[4, 6\]"),
        ([1], r"slices\[0\]=1 must be a slice"),
        ([slice(None), slice(None, None, -1)], r"slices\[1\]=slice\(None, None, -1\) has step -1: a view walks"),
        ([slice(None, None, 0)], r"slices\[0\]=slice\(None, None, 0\): slice step cannot be zero"),
        ([slice(3, 3)], r"slices\[0\]=slice\(3, 3, None\) selects no element of dim 0 \(size 4\)"),
        ([slice("a", 2)], r"slices\[0\]=slice\('a', 2, None\): "),
    ],
)
def test_slice_refuses_by_name(slices, message):
    g = cpu_graph()
    with pytest.raises(od.BadParam, match=message):
        g.slice(g.tensor([4, 6], name="x"), slices)


def test_a_slice_is_a_view_so_validate_refuses_it_as_a_graph_output_or_with_other_strides():
    g = cpu_graph()
    part = g.slice(g.tensor([4, 6], name="x"), [slice(0, 2)])
    part.set_output(True)
    with pytest.raises(
        od.BadParam, match=r"node 'slice_0' \(slice\): output y 'slice_0::y' is a view of input 'x' and cannot be"
    ):
        g.validate()
    part.set_output(False).set_stride([1, 2])
    g.identity(part).set_output(True)
    with pytest.raises(
        od.BadParam,
        match=r"output y 'slice_0::y' strides \[1, 2\] must be \[6, 1\], input 'x' strides \[6, 1\] times the steps",
    ):
        g.validate()


def test_a_deserialized_slice_out_of_its_input_is_refused_by_name():
    g = cpu_graph()
    g.identity(g.slice(g.tensor([4, 6], name="x"), [slice(1, 3)])).set_output(True)
    g.validate()
    g.build_operation_graph()
    data = json.loads(g.serialize())
    data["nodes"][0]["attributes"]["stop"] = [5, 6]
    with pytest.raises(
        od.BadParam, match=r"slices\[0\] from 1 to 5 must select elements of input 'x' dim 0 \(size 4\)"
    ):
        og.Graph.deserialize(json.dumps(data), handle=od.Handle("cpu"))
