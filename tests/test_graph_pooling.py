"""The graph API's pooling and resampling backward (``pooling_backward``, ``resample_backward``) on
the reference engine (NumPy) and the per-node and fused engines (Triton, through its interpreter),
against torch's float64 autograd."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import build, cpu_graph, graph_inputs, kernel_cache, random, relative_error, run, t64  # noqa: F401

import opendnn as od
import opendnn.graph as og

ENGINES = ["reference", "per_node", "fused"]
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("kernel_cache")


def torch_pool_gradient(x, dy, mode, window, stride, padding):
    """dx of torch's pooling of x (float64 autograd) for the loss dy."""
    xt = t64(x).requires_grad_(True)
    if mode == "max":
        y = TF.max_pool2d(xt, window, stride, padding) if x.ndim == 4 else TF.max_pool3d(xt, window, stride, padding)
    else:
        pool = TF.avg_pool2d if x.ndim == 4 else TF.avg_pool3d
        y = pool(xt, window, stride, padding, count_include_pad=mode == "avg_include")
    y.backward(t64(dy))
    return xt.grad.numpy()


# (x dims, window, stride, padding): overlapping, strided past the window, padded, 3-D, 1 x 1
POOLINGS = [
    ((2, 3, 7, 6), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 6, 9), (2, 3), (3, 2), (0, 1)),
    ((2, 2, 5, 4), (1, 1), (2, 1), (0, 0)),
    ((1, 2, 4, 5, 6), (2, 3, 2), (2, 1, 2), (1, 1, 0)),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["max", "avg_include", "avg_exclude"])
@pytest.mark.parametrize("shape, window, stride, padding", POOLINGS)
def test_pooling_backward_is_torchs_gradient(engine, mode, shape, window, stride, padding):
    rng = np.random.default_rng(hash((mode, shape)) % 2**32)
    x = random(rng, shape)
    x = x.transpose(0, *range(2, x.ndim), 1).copy().transpose(0, x.ndim - 1, *range(1, x.ndim - 1))  # channels-last
    pooled = [(n + 2 * p - w) // s + 1 for n, w, s, p in zip(shape[2:], window, stride, padding)]
    dy = random(rng, (*shape[:2], *pooled))
    g = cpu_graph()
    xt, dyt = graph_inputs(g, x=x, dy=dy)
    dx = g.pooling_backward(dyt, xt, mode, window, stride, padding, name="pool_bwd")
    assert dx.dims == x.shape
    dx.set_output(True)
    (out,) = run(g, {xt: x, dyt: dy}, [dx], engine)
    assert relative_error(out, torch_pool_gradient(x, dy, mode, window, stride, padding)) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_max_pooling_backward_gives_ties_and_nan_to_the_first_position(engine):
    """Ties go to the first position of the window holding the maximum; a window holding NaN gives its
    gradient to its first NaN (the family's rule)."""
    x = np.array([[[[1.0, 3.0, 3.0, 0.0], [2.0, 3.0, np.nan, np.nan]]]], np.float32)
    dy = np.array([[[[5.0, 7.0]]]], np.float32)
    g = cpu_graph()
    xt, dyt = graph_inputs(g, x=x, dy=dy)
    dx = g.pooling_backward(dyt, xt, "max", window=[2, 2])
    dx.set_output(True)
    (out,) = run(g, {xt: x, dyt: dy}, [dx], engine, poison=1234.5)
    expected = np.zeros(x.shape)
    expected[0, 0, 0, 1] = 5.0
    expected[0, 0, 1, 2] = 7.0
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_training_graph_pools_then_takes_the_gradient_through_a_pointwise_node(engine):
    """relu -> max pool forward, and the backward of both in one graph: the pooling backward's scratch
    (the maxima found again) and the forward's output side by side."""
    rng = np.random.default_rng(7)
    x, dy = random(rng, (2, 3, 6, 6)), random(rng, (2, 3, 3, 3))
    g = cpu_graph()
    xt, dyt = graph_inputs(g, x=x, dy=dy)
    r = g.relu(xt, name="relu")
    y = g.pooling(r, "max", [3, 3], [2, 2], [1, 1], name="pool")
    dr = g.pooling_backward(dyt, r, "max", [3, 3], [2, 2], [1, 1], name="pool_bwd")
    dx = g.relu_backward(dr, xt, name="relu_bwd")
    y.set_output(True)
    dx.set_output(True)
    build(g, engine)
    assert g.get_workspace_size() > 0
    out_y, out_dx = run(g, {xt: x, dyt: dy}, [y, dx], engine)
    xt64 = t64(x).requires_grad_(True)
    yt64 = TF.max_pool2d(torch.relu(xt64), 3, 2, 1)
    yt64.backward(t64(dy))
    assert relative_error(out_y, yt64.detach().numpy()) < TOLERANCE
    assert relative_error(out_dx, xt64.grad.numpy()) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "mode, shape, stride, dims, torch_mode",
    [
        ("BILINEAR", (2, 3, 6, 6), [0.5, 1 / 3], None, "bilinear"),
        (og.ResampleMode.NEAREST, (2, 3, 3, 4), [2, 0.75], (7, 3), "nearest"),
        ("bilinear", (1, 2, 4, 2, 5), [0.5, 2, 1], (2, 5, 5), "trilinear"),
    ],
)
def test_resample_backward_is_torchs_interpolation_gradient(engine, mode, shape, stride, dims, torch_mode):
    """dy of the forward's dims; dx inferred (the smallest input) or set to another input that the
    stride resamples onto dy's dims."""
    rng = np.random.default_rng(21)
    dy = random(rng, shape)
    g = cpu_graph()
    (dyt,) = graph_inputs(g, dy=dy)
    dx = g.resample_backward(dyt, None, mode, stride=stride, name="up_bwd")
    if dims is not None:
        dx.set_dim([*shape[:2], *dims])
    dx.set_output(True)
    (out,) = run(g, {dyt: dy}, [dx], engine)
    xt = torch.zeros(dx.dims, dtype=torch.float64, requires_grad=True)
    y = TF.interpolate(xt, scale_factor=[1 / s for s in stride], mode=torch_mode)
    assert tuple(y.shape) == shape
    y.backward(t64(dy))
    assert relative_error(out, xt.grad.numpy()) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_resample_backward_pooling_modes_are_pooling_backward(engine):
    rng = np.random.default_rng(22)
    x, dy = random(rng, (2, 3, 6, 7)), random(rng, (2, 3, 3, 4))
    g = cpu_graph()
    xt, dyt = graph_inputs(g, x=x, dy=dy)
    dx = g.resample_backward(
        dyt, xt, "AVGPOOL_EXCLUDE_PADDING", window=[3, 2], stride=[2, 2], pre_padding=[1, 1], post_padding=[1, 1]
    )
    assert g._nodes[-1].op == "pooling_backward"
    dx.set_output(True)
    (out,) = run(g, {xt: x, dyt: dy}, [dx], engine)
    assert relative_error(out, torch_pool_gradient(x, dy, "avg_exclude", (3, 2), 2, 1)) < TOLERANCE


def test_pooling_and_resample_backward_survive_serialization():
    rng = np.random.default_rng(23)
    x, dy, dz = random(rng, (1, 2, 4, 4)), random(rng, (1, 2, 2, 2)), random(rng, (1, 2, 8, 8))
    g = cpu_graph()
    xt, dyt, dzt = graph_inputs(g, x=x, dy=dy, dz=dz)
    dx = g.pooling_backward(dyt, xt, "max", [2, 2], name="pool_bwd")
    du = g.resample_backward(dzt, None, "bilinear", stride=[0.5, 0.5], name="up_bwd")
    dx.set_output(True).set_name("dx")
    du.set_output(True).set_name("du")
    build(g)
    again = og.Graph.deserialize(g.serialize(), handle=od.Handle("cpu"))
    assert [node.op for node in again._nodes] == ["pooling_backward", "resample_backward"]
    assert json.loads(again.serialize()) == json.loads(g.serialize())
    arrays = {"dx": np.full(x.shape, np.nan, np.float32), "du": np.full((1, 2, 4, 4), np.nan, np.float32)}
    again.execute({"x": x, "dy": dy, "dz": dz, **arrays}, np.empty(again.get_workspace_size(), np.uint8))
    assert relative_error(arrays["dx"], torch_pool_gradient(x, dy, "max", (2, 2), (2, 2), (0, 0))) < TOLERANCE
    xt64 = torch.zeros((1, 2, 4, 4), dtype=torch.float64, requires_grad=True)
    TF.interpolate(xt64, scale_factor=2, mode="bilinear").backward(t64(dz))
    assert relative_error(arrays["du"], xt64.grad.numpy()) < TOLERANCE


@pytest.mark.parametrize(
    "build_node, error, message",
    [
        (
            lambda g, x, dy: g.pooling_backward(dy, x, "max", [3, 3], name="p"),
            od.BadParam,
            r"node 'p' \(pooling_backward\): grad 'dy' dims \[2, 3, 3, 3\] must be \[2, 3, 2, 2\] "
            r"\(the pooling of input 'x' \[2, 3, 6, 6\]\)",
        ),
        (
            lambda g, x, dy: g.pooling_backward(g.tensor([2, 3, 3, 3], data_type="half", name="h"), x, name="p"),
            od.BadParam,
            r"node 'p' \(pooling_backward\): grad 'h' data type HALF must equal input 'x' data type FLOAT",
        ),
        (
            lambda g, x, dy: g.pooling_backward(dy, x, "avg_include", [2, 2], padding=[2, 2], name="p"),
            od.BadParam,
            r"node 'p' \(pooling_backward\): window=\[2, 2\], stride=\[2, 2\], padding=\[2, 2\] need",
        ),
        (
            lambda g, x, dy: g.pooling_backward(dy, x, "median", name="p"),
            od.BadParam,
            r"mode='median' must be one of",
        ),
        (
            lambda g, x, dy: g.resample_backward(dy, None, "MAXPOOL", name="r"),
            od.BadParam,
            "MAXPOOL needs input: the forward's x",
        ),
        (
            lambda g, x, dy: g.resample_backward(dy, x, "NEAREST", stride=[0.5, 0.5], name="r"),
            od.BadParam,
            "input with NEAREST: the interpolation's backward reads grad alone",
        ),
        (
            lambda g, x, dy: g.resample_backward(dy, None, "BILINEAR", window=[2, 2], stride=[2, 2]),
            od.BadParam,
            r"window=\[2, 2\] with BILINEAR: interpolation reads no window",
        ),
        (
            lambda g, x, dy: g.resample_backward(dy, None, "BILINEAR", stride=[0.5], name="r"),
            od.BadParam,
            r"node 'r' \(resample_backward\): grad 'dy' dims \[2, 3, 3, 3\] must have 3 dims",
        ),
        (  # 1.5 times the size: 2 input pixels give 3 output pixels, 3 give 4, none gives 5
            lambda g, x, dy: g.resample_backward(g.tensor([2, 3, 3, 5], name="d"), None, "BILINEAR", stride=[1, 2 / 3]),
            od.BadParam,
            r"grad 'd' dims \[2, 3, 3, 5\]: no input resamples onto 5 pixels along spatial dim 1 at stride "
            r"0.666.* \(3 pixels give 4, 4 give 6\)",
        ),
        (
            lambda g, x, dy: g.resample_backward(dy, x, "AVGPOOL_INCLUDE_PADDING", padding_mode="EDGE_VAL_PAD"),
            od.BadParam,
            "padding_mode=EDGE_VAL_PAD with AVGPOOL_INCLUDE_PADDING",
        ),
    ],
)
def test_pooling_and_resample_backward_refuse_by_name(build_node, error, message):
    g = cpu_graph()
    x, dy = g.tensor([2, 3, 6, 6], name="x"), g.tensor([2, 3, 3, 3], name="dy")
    with pytest.raises(error, match=message):
        build_node(g, x, dy)


def test_resample_backward_refuses_an_input_size_the_stride_does_not_resample_onto_grad():
    g = cpu_graph()
    dy = g.tensor([1, 2, 4, 4], name="dy")
    dx = g.resample_backward(dy, None, "nearest", stride=[2, 2], name="r")
    assert dx.dims == (1, 2, 8, 8)
    dx.set_dim([1, 2, 8, 10]).set_output(True)
    with pytest.raises(
        od.BadParam,
        match=r"node 'r' \(resample_backward\): output dims \[1, 2, 8, 10\] must be an input that stride "
        r"\[2.0, 2.0\] resamples onto grad 'dy' \[1, 2, 4, 4\]",
    ):
        g.validate()
