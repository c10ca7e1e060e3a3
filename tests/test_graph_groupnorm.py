"""The graph API's group norm and its backward on every engine (the Triton ones through the
interpreter, tiny shapes) against torch's group norm and autograd in float64: any rank, groups,
strides and parameter layouts, without parameters, inference, the errors, and serialization."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import build, cpu_graph, graph_inputs, kernel_cache, random, relative_error, run, t64  # noqa: F401

import opendnn as od
import opendnn.graph as og

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder

TOLERANCE = 1e-5


def channels_last(array):
    """``array`` of (N, C, spatial...) dims with its channels innermost in memory."""
    order = (0, *range(2, array.ndim), 1)
    return array.transpose(order).copy().transpose(np.argsort(order))


def strided_channels(array, step):
    """``array`` (1, C, 1, ...) as a view of every ``step``-th float of a larger buffer (NaN between)."""
    buffer = np.full(array.size * step, np.nan, array.dtype)
    buffer[::step] = array.ravel()
    return np.lib.stride_tricks.as_strided(buffer, array.shape, tuple(step * s for s in array.strides))


def torch_group_norm(x, scale, bias, dy, groups, epsilon):
    """torch's (y, mean, rstd) and autograd's (dx, dscale, dbias), in float64."""
    xs, ss, bs = (t64(a).requires_grad_() for a in (x, scale, bias))
    n, c = x.shape[:2]
    y, mean, rstd = torch.ops.aten.native_group_norm(
        xs, ss.flatten(), bs.flatten(), n, c, x.size // (n * c), groups, epsilon
    )
    y.backward(t64(dy))
    return [t.detach().numpy() for t in (y, mean, rstd, xs.grad, ss.grad, bs.grad)]


# (x dims, groups, x's layout, scale and bias stride: 1 packed, more a view of a larger buffer)
CASES = [
    ((2, 6, 3, 2), 3, channels_last, 1),
    ((3, 4, 5), 2, np.ascontiguousarray, 3),
    ((2, 4), 4, np.ascontiguousarray, 1),
    ((1, 8, 2, 3, 2), 1, channels_last, 2),
    ((2, 6, 1, 4), 6, lambda a: a.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2), 1),
]
TRITON_CASES = [0, 1]  # the interpreter is slow: the Triton engines run two of them


@pytest.mark.parametrize(
    "engine, case",
    [("reference", k) for k in range(len(CASES))] + [(e, k) for e in ("per_node", "fused") for k in TRITON_CASES],
)
def test_groupnorm_and_its_backward_match_torch(engine, case):
    """Forward writes torch's y and statistics ((N, groups, 1, ...) for torch's (N, groups)); the
    backward reads them: its node has no epsilon of its own (0.25 shows it)."""
    dims, groups, layout, step = CASES[case]
    rng = np.random.default_rng(100 + case)
    x, dy = layout(random(rng, dims)), random(rng, dims)
    params = (1, dims[1], *(1,) * (len(dims) - 2))
    scale, bias = (strided_channels(random(rng, params), step) for _ in range(2))
    g = cpu_graph()
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    y, mean, inv = g.groupnorm(xt, st, bt, groups, epsilon=0.25)
    assert mean.get_dim() == inv.get_dim() == [dims[0], groups, *(1,) * (len(dims) - 2)]
    dx, dscale, dbias = g.groupnorm_backward(dyt, xt, st, mean, inv, groups)
    outputs = [y, mean, inv, dx, dscale, dbias]
    for t in outputs:
        t.set_output(True)
    actual = run(g, {xt: x, dyt: dy, st: scale, bt: bias}, outputs, engine)
    expected = torch_group_norm(x, scale, bias, dy, groups, 0.25)
    for out, want in zip(actual, expected, strict=True):
        assert relative_error(out, want.reshape(out.shape)) < TOLERANCE
    assert all(f"({op})" in g.plan.describe() for op in ("groupnorm", "groupnorm_backward"))


@pytest.mark.parametrize("engine", ["reference", "per_node"])
def test_groupnorm_without_parameters_and_in_inference(engine):
    """No scale and no bias (torch's affine=False): scale 1 and bias 0, and a backward with no
    parameter gradients; INFERENCE writes y alone."""
    rng = np.random.default_rng(7)
    x, dy, bias = random(rng, (2, 4, 3, 3)), random(rng, (2, 4, 3, 3)), random(rng, (1, 4, 1, 1))
    g = cpu_graph()
    xt, dyt, bt = graph_inputs(g, x=x, dy=dy, bias=bias)
    y, mean, inv = g.groupnorm(xt, None, None, 2, epsilon=1e-3)
    dx, dscale, dbias = g.groupnorm_backward(dyt, xt, None, mean, inv, 2)
    assert dscale is None and dbias is None
    y_inference, none_mean, none_inv = g.groupnorm(xt, None, bt, 2, 1e-3, og.NormForwardPhase.INFERENCE)
    assert none_mean is None and none_inv is None
    for t in (y, dx, y_inference):
        t.set_output(True)
    outs = run(g, {xt: x, dyt: dy, bt: bias}, [y, dx, y_inference], engine)
    xs = t64(x).requires_grad_()
    expected = TF.group_norm(xs, 2, eps=1e-3)
    expected.backward(t64(dy))
    assert relative_error(outs[0], expected.detach().numpy()) < TOLERANCE
    assert relative_error(outs[1], xs.grad.numpy()) < TOLERANCE
    with_bias = TF.group_norm(t64(x), 2, bias=t64(bias).flatten(), eps=1e-3)
    assert relative_error(outs[2], with_bias.numpy()) < TOLERANCE


def test_groupnorm_of_half_inputs_keeps_float_statistics():
    rng = np.random.default_rng(8)
    x, scale, bias = random(rng, (2, 4, 3)), random(rng, (1, 4, 1)), random(rng, (1, 4, 1))
    g = cpu_graph(io_data_type=og.DataType.BFLOAT16)
    xt = g.tensor_like(x.astype(np.float64), name="x").set_data_type(og.DataType.BFLOAT16)
    st, bt = graph_inputs(g, scale=scale, bias=bias)
    y, mean, inv = g.groupnorm(xt, st, bt, 2)
    assert mean.get_data_type() == og.DataType.FLOAT and inv.get_data_type() == og.DataType.FLOAT


def groupnorm_graph(x_dims=(2, 4, 3, 3), scale_dims=(1, 4, 1, 1)):
    g = cpu_graph()
    return g, g.tensor(dim=list(x_dims), name="x"), g.tensor(dim=list(scale_dims), name="scale")


@pytest.mark.parametrize(
    "groups, match",
    [
        (
            3,
            r"node 'gn' \(groupnorm\): input 'x' channels 4 \(dims\[1\] of \[2, 4, 3, 3\]\) must be a multiple "
            r"of groups=3",
        ),
        (0, r"node 'gn' \(groupnorm\): groups=0 must be an int of at least 1"),
        (2.0, r"node 'gn' \(groupnorm\): groups=2.0 must be an int of at least 1"),
        (True, r"node 'gn' \(groupnorm\): groups=True must be an int of at least 1"),
    ],
)
def test_groupnorm_refuses_groups_that_do_not_split_the_channels(groups, match):
    g, x, scale = groupnorm_graph()
    with pytest.raises(od.BadParam, match=match):
        g.groupnorm(x, scale, scale, groups, name="gn")


def test_groupnorm_refuses_parameters_statistics_and_inputs_of_other_dims():
    g, x, scale = groupnorm_graph(scale_dims=(1, 2, 1, 1))
    with pytest.raises(
        od.BadParam,
        match=r"node 'gn' \(groupnorm\): scale 'scale' dims \[1, 2, 1, 1\] must be "
        r"\[1, 4, 1, 1\] \(one per channel\)",
    ):
        g.groupnorm(x, scale, None, 2, name="gn")
    g, x, scale = groupnorm_graph()
    wrong = g.tensor(dim=[2, 4, 1, 1], name="stats", data_type=og.DataType.FLOAT)
    with pytest.raises(
        od.BadParam,
        match=r"node 'gb' \(groupnorm_backward\): mean 'stats' dims \[2, 4, 1, 1\] must "
        r"be \[2, 2, 1, 1\] \(one per normalized set\)",
    ):
        g.groupnorm_backward(x, x, scale, wrong, wrong, 2, name="gb")
    g, x, scale = groupnorm_graph(x_dims=(4,), scale_dims=(1,))
    with pytest.raises(od.BadParam, match=r"node 'gn' \(groupnorm\): input 'x' dims \[4\] must have at least 2 dims"):
        g.groupnorm(x, None, None, 1, name="gn")
    with pytest.raises(od.BadParam, match=r"epsilon=-1.0 must be finite and at least 0"):
        groupnorm_graph()[0].groupnorm(x, None, None, 1, epsilon=-1.0)


def test_a_serialized_groupnorm_runs_again_and_a_changed_group_count_is_refused():
    rng = np.random.default_rng(9)
    x, scale, bias = random(rng, (2, 6, 2, 2)), random(rng, (1, 6, 1, 1)), random(rng, (1, 6, 1, 1))
    g = cpu_graph()
    xt, st, bt = graph_inputs(g, x=x, scale=scale, bias=bias)
    y, mean, _ = g.groupnorm(xt, st, bt, np.int64(3), name="gn")
    y.set_name("y").set_output(True)
    build(g)
    data = g.serialize()
    again = og.Graph.deserialize(data, handle=od.Handle("cpu"))
    out = np.full((2, 6, 2, 2), np.nan, np.float32)
    again.execute({"x": x, "scale": scale, "bias": bias, "y": out}, np.empty(again.get_workspace_size(), np.uint8))
    expected = TF.group_norm(t64(x), 3, t64(scale).flatten(), t64(bias).flatten())
    assert relative_error(out, expected.numpy()) < TOLERANCE
    changed = json.loads(data)
    next(n for n in changed["nodes"] if n["name"] == "gn")["attributes"]["groups"] = 4
    with pytest.raises(od.BadParam, match=r"node 'gn' \(groupnorm\): input 'x' channels 6 .* multiple of groups=4"):
        og.Graph.deserialize(json.dumps(changed), handle=od.Handle("cpu"))
