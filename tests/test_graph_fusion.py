"""The fusion engine: random pointwise DAGs over broadcast shapes and any strides, the epilogue
chains of convolution and matmul, reductions and genstats at the end of a fused region, and the
rule that decides what fuses; every graph runs on the fused engine (Triton through its
interpreter) and on the reference engine, and both must agree with torch in float64."""

import ast
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import (  # noqa: F401
    QUIET_NUMPY,
    assert_same_special_values,
    build,
    cpu_graph,
    epilogue_special_values,
    graph_inputs,
    kernel_cache,
    on_both_engines,
    pointwise_special_values,
    prologue_special_values,
    random,
    relative_error,
    run,
    t64,
)

import opendnn as od
import opendnn.graph as og
from opendnn.graph.fusion import relabeled

ENGINES = ["fused", "reference"]
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


def steps(graph):
    return [type(step).__name__ for step in graph.plan.steps]


# ---- random pointwise DAGs ----------------------------------------------------------------------------

UNARY = {
    "neg": torch.neg,
    "abs": torch.abs,
    "sin": torch.sin,
    "cos": torch.cos,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "gelu": TF.gelu,
    "gelu_approx_tanh": lambda t: TF.gelu(t, approximate="tanh"),
    "swish": TF.silu,
    "relu": torch.relu,
    "elu": TF.elu,
    "softplus": TF.softplus,
    "erf": torch.erf,
    "identity": lambda t: t,
}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum, "min": torch.minimum}


def strided_array(rng, dims):
    """Random values of ``dims`` in a random memory order, one dim spread over twice its extent."""
    order = rng.permutation(len(dims))
    spread = int(rng.integers(len(dims)))
    memory = [dims[k] * (2 if position == spread else 1) for position, k in enumerate(order)]
    base = random(rng, memory)
    view = base[tuple(slice(None, None, 2) if position == spread else slice(None) for position in range(len(dims)))]
    return view.transpose(np.argsort(order))


def random_dag(seed):
    """A graph of 2 to 3 broadcast inputs and 6 to 9 pointwise nodes, its inputs, outputs and their
    float64 values (torch)."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(2, 5))
    space = tuple(int(d) for d in rng.integers(2, 6, rank))
    g = cpu_graph(f"dag{seed}")
    values, inputs = [], {}
    for k in range(int(rng.integers(2, 4))):
        rank_k = int(rng.integers(1, rank + 1))
        dims = tuple(d if rng.random() < 0.7 else 1 for d in space[rank - rank_k :])  # broadcast dims
        array = strided_array(rng, dims)
        tensor = g.tensor_like(array, name=f"in{k}")
        inputs[tensor] = array
        values.append((tensor, t64(array)))
    consumed = set()
    for step in range(int(rng.integers(6, 10))):
        pick = [values[-1]] + [values[int(k)] for k in rng.integers(0, len(values), 2)]  # mostly a chain
        if step < len(inputs):  # every input is read
            pick[0] = values[step]
        kind = rng.random()
        if kind < 0.45:
            name = rng.choice(list(UNARY))
            out, used = (getattr(g, name)(pick[0][0]), UNARY[name](pick[0][1])), pick[:1]
        elif kind < 0.85:
            name = rng.choice(list(BINARY))
            out, used = (getattr(g, name)(pick[0][0], pick[1][0]), BINARY[name](pick[0][1], pick[1][1])), pick[:2]
        elif kind < 0.93:
            scale = float(rng.uniform(-2, 2))
            out, used = (g.scale(pick[0][0], scale), pick[0][1] * scale), pick[:1]
        else:
            condition = torch.where(pick[2][1] > 0, pick[0][1], pick[1][1])
            shape = torch.broadcast_shapes(pick[0][1].shape, pick[1][1].shape, pick[2][1].shape)
            out, used = (
                (g.binary_select(pick[0][0], pick[1][0], g.cmp_gt(pick[2][0], 0.0)), condition.expand(shape)),
                pick,
            )
        consumed.update(id(tensor) for tensor, _ in used)
        values.append(out)
    outputs = [(t, v) for t, v in values[len(inputs) :] if id(t) not in consumed or rng.random() < 0.2]
    for tensor, _ in outputs:
        tensor.set_output(True)
    return g, inputs, outputs


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(8))
def test_random_pointwise_dags_over_broadcast_shapes_and_strides(seed, engine):
    g, inputs, outputs = random_dag(seed)
    results = run(g, inputs, [t for t, _ in outputs], engine)
    for (tensor, expected), actual in zip(outputs, results):
        assert relative_error(actual, expected.numpy().reshape(actual.shape)) < TOLERANCE, tensor.get_name()
    if engine == "fused":
        assert "FusedKernel" in steps(g) and "NodeCall" not in steps(g)


def test_a_fused_kernel_writes_outputs_of_any_layout_in_half_precision():
    rng = np.random.default_rng(30)
    g = cpu_graph("half", io_data_type=og.DataType.HALF)
    x = g.tensor([3, 4, 5], name="x")
    y = g.tanh(g.mul(x, x))
    y.set_output(True).set_stride([1, 15, 3])  # dim 0 innermost in memory
    xa = random(rng, (3, 4, 5), np.float16)
    buffer = np.full(60, np.nan, np.float16)
    out = np.lib.stride_tricks.as_strided(buffer, (3, 4, 5), (2, 30, 6))
    build(g, "fused")
    g.execute({x: xa, y: out}, None)
    assert relative_error(out.astype(np.float64), np.tanh(xa.astype(np.float64) ** 2)) < 1e-3
    source = g.plan.source()  # the walk follows the output's memory order: dims 1, 2, then 0 fastest
    assert "tl.store(tanh_1_y_ptr + index, tanh_1_y.to(tl.float16), mask=mask)" in source
    assert "x = tl.load(x_ptr + (i0 * 20 + i1 * 5 + i2), mask=mask)" in source


# ---- the walk order: the memory order of the region's dominant tensor --------------------------------

LAYOUTS = {"nchw": (0, 1, 2, 3), "channels_last": (0, 2, 3, 1), "hnwc": (2, 0, 3, 1)}  # memory order, outermost first
CHANNELS_LAST = (120, 1, 40, 8)  # strides of (2, 8, 3, 5)


def laid_out(array, order, crop=False):
    """``array`` copied into memory of dim ``order`` (outermost first); with ``crop``, the region
    [1, d + 1) along each dim of a NaN-filled buffer two larger along each."""
    margin = 2 if crop else 0
    buffer = np.full([array.shape[k] + margin for k in order], np.nan, array.dtype)
    view = buffer.transpose(np.argsort(order))
    if crop:
        view = view[tuple(slice(1, d + 1) for d in array.shape)]
    view[...] = array
    return view


def run_laid_out(graph, inputs, outputs, engine):
    """Build ``graph`` for ``engine`` and execute it; ``outputs`` maps each output tensor to the
    NaN-filled array it writes, whose strides it takes. Returns the outputs as float64."""
    for tensor, array in outputs.items():
        tensor.set_output(True).set_stride([stride // array.itemsize for stride in array.strides])
    build(graph, engine)
    graph.execute({**inputs, **outputs}, np.empty(graph.get_workspace_size(), np.uint8))
    return [array.astype(np.float64) for array in outputs.values()]


def poisoned(dims, layout, crop=False):
    return laid_out(np.full(dims, np.nan, np.float32), LAYOUTS[layout], crop)


def assert_written_inside_only(array):
    """Every element of the view ``array`` is written and no other element of its buffer."""
    assert np.isnan(array.base).sum() == array.base.size - array.size


@pytest.mark.parametrize("seed", range(8))
def test_random_pointwise_dags_writing_outputs_of_random_memory_orders(seed):
    g, inputs, outputs = random_dag(seed)
    rng = np.random.default_rng(seed + 100)
    arrays = {
        tensor: laid_out(np.full(tensor.get_dim(), np.nan, np.float32), rng.permutation(len(tensor.get_dim())))
        for tensor, _ in outputs
    }
    results = run_laid_out(g, inputs, arrays, "fused")
    for (tensor, expected), actual in zip(outputs, results):
        assert relative_error(actual, expected.numpy().reshape(actual.shape)) < TOLERANCE, tensor.get_name()
    assert "FusedKernel" in steps(g) and "NodeCall" not in steps(g)


@pytest.mark.parametrize("crop", [False, True], ids=["dense", "sub_region"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_pointwise_dag_in_a_permuted_layout_matches_the_reference_engine(layout, crop):
    rng = np.random.default_rng(44)
    dims = (2, 6, 3, 5)
    x, z = laid_out(random(rng, dims), LAYOUTS[layout], crop), random(rng, dims)  # z is NCHW in every case
    s1, b1, s2, b2 = (random(rng, (1, 6, 1, 1)) for _ in range(4))
    results = {}
    for engine in ENGINES:
        g = cpu_graph(f"tail_{engine}")
        xt, zt, s1t, b1t, s2t, b2t = graph_inputs(g, x=x, z=z, s1=s1, b1=b1, s2=s2, b2=b2)
        y = g.relu(g.add(g.add(g.mul(xt, s1t), b1t), g.add(g.mul(zt, s2t), b2t)))
        out = poisoned(dims, layout, crop)
        (results[engine],) = run_laid_out(g, {xt: x, zt: z, s1t: s1, b1t: b1, s2t: s2, b2t: b2}, {y: out}, engine)
        if crop:
            assert_written_inside_only(out)
    expected = torch.relu(t64(x) * t64(s1) + t64(b1) + (t64(z) * t64(s2) + t64(b2))).numpy()
    assert relative_error(results["reference"], expected) < TOLERANCE
    assert relative_error(results["fused"], results["reference"]) < TOLERANCE


@pytest.mark.parametrize("crop", [False, True], ids=["dense", "sub_region"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_genstats_in_a_permuted_layout_matches_the_reference_engine(layout, crop):
    rng = np.random.default_rng(45)
    dims = (3, 5, 4, 6)
    x, s, b = laid_out(random(rng, dims), LAYOUTS[layout], crop), random(rng, (1, 5, 1, 1)), random(rng, (1, 5, 1, 1))
    results = {}
    for engine in ENGINES:
        g = cpu_graph(f"stats_{engine}")
        xt, st, bt = graph_inputs(g, x=x, s=s, b=b)
        activated = g.relu(g.bias(g.scale(xt, st), bt))
        total, squares = g.genstats(activated)
        per_channel = (1, 5, 1, 1)
        outputs = {activated: poisoned(dims, layout, crop)} | {
            t: poisoned(per_channel, "nchw") for t in (total, squares)
        }
        results[engine] = run_laid_out(g, {xt: x, st: s, bt: b}, outputs, engine)
        if crop:
            assert_written_inside_only(outputs[activated])
    v = torch.relu(t64(x) * t64(s) + t64(b))
    expected = (v, v.sum((0, 2, 3), keepdim=True), (v * v).sum((0, 2, 3), keepdim=True))
    for name, fused, reference, exact in zip(("activated", "sum", "squares"), *results.values(), expected):
        assert relative_error(reference, exact.numpy()) < TOLERANCE, name
        assert relative_error(fused, reference) < TOLERANCE, name


def test_a_channels_last_kernel_reads_its_dense_tensors_at_the_flat_index():
    g = cpu_graph("nhwc")
    x = g.tensor([2, 8, 3, 5], name="x").set_stride(CHANNELS_LAST)
    y = g.mul(x, g.tensor([1, 8, 1, 1], name="s"), name="scaled")
    y.set_output(True).set_stride(CHANNELS_LAST).set_name("y")
    build(g, "fused")
    source = g.plan.source()
    assert "BLOCK elements per program over dims [0, 2, 3, 1] (the last dim fastest)" in source
    assert "    i1 = index % 8\n" in source  # the channel: the innermost dim, stride 1
    assert "    x = tl.load(x_ptr + index, mask=mask).to(tl.float32)\n" in source
    assert "    s = tl.load(s_ptr + i1, mask=mask).to(tl.float32)\n" in source
    assert "    tl.store(y_ptr + index, y.to(tl.float32), mask=mask)\n" in source


def genstats_source(strides):
    """The generated source of genstats over x (2, 8, 3, 5) of ``strides``."""
    g = cpu_graph("stats")
    total, squares = g.genstats(g.tensor([2, 8, 3, 5], name="x").set_stride(strides))
    total.set_output(True)
    squares.set_output(True)
    return build(g, "fused").plan.source()


def test_channels_last_genstats_keeps_the_contiguous_channels_and_loops_in_memory_order():
    source = genstats_source(CHANNELS_LAST)
    assert "kept dims [1] by program, reduced dims [0, 2, 3] in a loop" in source
    assert "    k1 = keep\n" in source  # a program's channels lie side by side in memory
    assert "x = tl.load(x_ptr + (r0[None, :] * 120 + k1[:, None] + r2[None, :] * 40 + r3[None, :] * 8)" in source


def test_genstats_loops_over_the_reduced_dims_in_their_memory_order():
    source = genstats_source([40, 1, 80, 8])  # memory order H, N, W, C
    assert "reduced dims [2, 0, 3] in a loop" in source
    assert "        r2 = red // 10\n        r0 = red // 5 % 2\n        r3 = red % 5\n" in source


# ---- convolution and matmul epilogues ----------------------------------------------------------------


def conv_workspace(graph, x, w, padding):
    """The workspace of the forward convolution of float32 ``x`` and ``w`` (stride 1) with the
    algorithm the heuristics rank first on the fused engine's backend (what a call naming none takes)."""
    descriptor = lambda dims, strides: od.TensorDescriptor(od.DataType.FLOAT, dims, strides)  # noqa: E731
    xd, wd = (descriptor(a.shape, [s // a.itemsize for s in a.strides]) for a in (x, w))
    spatial = x.ndim - 2
    conv = od.ConvolutionDescriptor((padding,) * spatial, (1,) * spatial, (1,) * spatial)
    dims = (x.shape[0], w.shape[0], *(d + 2 * padding - k + 1 for d, k in zip(x.shape[2:], w.shape[2:])))
    yd = descriptor(dims, [math.prod(dims[k + 1 :]) for k in range(len(dims))])
    handle = od.Handle(graph.handle.device, backend="triton", math_type=graph.handle.math_type)
    algo = od.get_convolution_forward_algorithm(handle, xd, wd, conv, yd)[0].algo
    return od.get_convolution_forward_workspace_size(handle, xd, wd, conv, yd, algo)


@pytest.mark.parametrize("engine", ENGINES)
def test_conv_bias_relu_is_one_call_with_the_fused_epilogue(engine):
    rng = np.random.default_rng(31)
    x = random(rng, (2, 3, 5, 5)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # channels last
    w, b = random(rng, (4, 3, 3, 3)), random(rng, (1, 4, 1, 1))
    g = cpu_graph("cbr")
    xt, wt, bt = graph_inputs(g, x=x, w=w, b=b)
    y = g.relu(g.bias(g.conv_fprop(xt, wt, padding=[1, 1]), bt))
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, bt: b}, [y], engine)
    expected = torch.relu(TF.conv2d(t64(x), t64(w), padding=1) + t64(b)).numpy()
    assert relative_error(out, expected) < TOLERANCE
    if engine == "fused":  # the epilogue writes y: the workspace is the convolution's own (x's channels padded)
        assert steps(g) == ["EpilogueCall"] and g.get_workspace_size() == conv_workspace(g, x, w, padding=1)
        assert "with add_1, relu_2 in its fused epilogue (bias, activation)" in g.plan.describe()


def test_a_graphs_convolution_takes_the_algorithm_a_call_naming_none_takes():
    """An NCHW float32 convolution under TF32 of one tile and 36 steps: on the fused engine its epilogue
    call reads x and the filter staged and slices its reduction (IMPLICIT_PRECOMP_GEMM's workspace), as a
    call naming no algorithm does; the result is the float64 convolution of the TF32-rounded operands."""
    rng = np.random.default_rng(38)
    x, w, b = random(rng, (1, 128, 12, 12)), random(rng, (40, 128, 3, 3)) / 30, random(rng, (1, 40, 1, 1))
    g = og.Graph(handle=od.Handle("cpu", math_type=od.MathType.TENSOR_OP), name="tf32_sliced")
    xt, wt, bt = graph_inputs(g, x=x, w=w, b=b)
    y = g.relu(g.bias(g.conv_fprop(xt, wt, padding=[1, 1]), bt))
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, bt: b}, [y], "fused")
    expected = torch.relu(TF.conv2d(t64(x), t64(w), padding=1) + t64(b)).numpy()
    assert relative_error(out, expected) < 1e-3  # TF32 operands
    assert steps(g) == ["EpilogueCall"]
    staged = (x.size + w.size) * 4
    assert g.get_workspace_size() > staged + 2 * 40 * 12 * 12 * 4  # the copies and two slices' partials or more


@pytest.mark.parametrize("engine", ENGINES)
def test_conv_scale_residual_bias_swish_fills_every_slot(engine):
    rng = np.random.default_rng(32)
    x, w = random(rng, (1, 2, 4, 4)), random(rng, (3, 2, 3, 3))
    z, b = random(rng, (1, 3, 4, 4)), random(rng, (1, 3, 1, 1))
    g = cpu_graph("slots")
    xt, wt, zt, bt = graph_inputs(g, x=x, w=w, z=z, b=b)
    y = g.swish(g.add(g.add(g.scale(g.conv_fprop(xt, wt, padding=[1, 1]), 0.5), zt), bt))
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, zt: z, bt: b}, [y], engine)
    expected = TF.silu(0.5 * TF.conv2d(t64(x), t64(w), padding=1) + t64(z) + t64(b)).numpy()
    assert relative_error(out, expected) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["EpilogueCall"]
        assert "(scale, residual, bias, activation)" in g.plan.describe()


@pytest.mark.parametrize("engine", ENGINES)
def test_scale_bias_relu_before_a_conv_is_one_kernel_then_the_conv(engine):
    rng = np.random.default_rng(33)
    x, w = random(rng, (2, 3, 4, 4)), random(rng, (2, 3, 3, 3))
    s, b = random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph("sbrc")
    xt, st, bt, wt = graph_inputs(g, x=x, s=s, b=b, w=w)
    y = g.conv_fprop(g.relu(g.bias(g.scale(xt, st), bt)), wt, padding=[1, 1])
    y.set_output(True)
    (out,) = run(g, {xt: x, st: s, bt: b, wt: w}, [y], engine)
    activated = torch.relu(t64(x) * t64(s) + t64(b))
    assert relative_error(out, TF.conv2d(activated, t64(w), padding=1).numpy()) < TOLERANCE
    if engine == "fused":  # relu's output, 96 floats, between the two steps, then the convolution's own
        assert steps(g) == ["FusedKernel", "NodeCall"]
        assert g.get_workspace_size() == 512 + conv_workspace(g, x, w, padding=1)


@pytest.mark.parametrize("engine", ENGINES)
def test_matmul_bias_gelu_is_one_call_with_the_fused_epilogue(engine):
    rng = np.random.default_rng(34)
    a, b, bias = random(rng, (2, 4, 6)), random(rng, (6, 5)), random(rng, (5,))
    g = cpu_graph("mbg")
    at, bt, biast = graph_inputs(g, a=a, b=b, bias=bias)
    c = g.gelu(g.add(g.matmul(at, bt), biast))
    c.set_output(True)
    (out,) = run(g, {at: a, bt: b, biast: bias}, [c], engine)
    assert relative_error(out, TF.gelu(t64(a) @ t64(b) + t64(bias)).numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["EpilogueCall"]


@pytest.mark.parametrize("engine", ENGINES)
def test_matmul_row_bias_activation_then_residual(engine):
    rng = np.random.default_rng(35)
    a, b, bias, residual = random(rng, (3, 4)), random(rng, (4, 5)), random(rng, (3, 1)), random(rng, (3, 5))
    g = cpu_graph("mbar")
    at, bt, biast, rt = graph_inputs(g, a=a, b=b, bias=bias, r=residual)
    c = g.add(g.tanh(g.bias(g.matmul(at, bt), biast)), rt)
    c.set_output(True)
    (out,) = run(g, {at: a, bt: b, biast: bias, rt: residual}, [c], engine)
    assert relative_error(out, (torch.tanh(t64(a) @ t64(b) + t64(bias)) + t64(residual)).numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["EpilogueCall"] and "(bias, activation, residual)" in g.plan.describe()


@pytest.mark.parametrize("anchor", ["conv_fprop", "matmul"])
def test_the_sum_of_two_anchors_joins_the_first_ones_epilogue_as_its_residual(anchor):
    rng = np.random.default_rng(37)
    convolving = anchor == "conv_fprop"
    x = random(rng, (1, 2, 4, 4) if convolving else (3, 4))
    w, v = (random(rng, (3, 2, 3, 3) if convolving else (4, 5)) for _ in range(2))
    g = cpu_graph("two_anchors")
    xt, wt, vt = graph_inputs(g, x=x, w=w, v=v)
    product = (lambda f: g.conv_fprop(xt, f, padding=[1, 1])) if convolving else (lambda f: g.matmul(xt, f))
    y = g.relu(g.add(product(wt), product(vt)))
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, vt: v}, [y], "fused")
    reference = (lambda f: TF.conv2d(t64(x), t64(f), padding=1)) if convolving else (lambda f: t64(x) @ t64(f))
    assert relative_error(out, torch.relu(reference(w) + reference(v)).numpy()) < TOLERANCE
    assert steps(g)[0] == "NodeCall" and steps(g)[1] == "EpilogueCall"
    assert f"{anchor}_0' ({anchor}) with add_2" in g.plan.describe()


def test_an_epilogue_stops_where_the_chain_stops_fitting_its_slots():
    g = cpu_graph("partial")
    a, b = g.tensor([3, 4], name="a"), g.tensor([4, 5], name="b")
    c = g.exp(g.tanh(g.matmul(a, b)))  # exp is a second activation: no slot left
    c.set_output(True)
    build(g, "fused")
    assert steps(g) == ["EpilogueCall", "FusedKernel"]
    assert "tanh_1 in its fused epilogue (activation)" in g.plan.describe()


# ---- epilogues through a reshape ----------------------------------------------------------------------


def linear_layer(g, x, w, bias, dims):
    """A linear layer as the compile backend lowers one over (B, L, K): the product of (B * L, K) rows
    and its bias, read back as ``dims``."""
    return g.reshape(g.add(g.matmul(x, w), bias), dims)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_matmul_epilogue_reads_through_a_reshape_of_its_rows(engine):
    rng = np.random.default_rng(61)
    x, w, bias, skip = random(rng, (6, 4)), random(rng, (4, 5)), random(rng, (5,)), random(rng, (2, 3, 5))
    g = cpu_graph("linear_gelu_residual")
    xt, wt, biast, skipt = graph_inputs(g, x=x, w=w, bias=bias, skip=skip)
    y = g.add(g.gelu(linear_layer(g, xt, wt, biast, [2, 3, 5])), skipt)
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, biast: bias, skipt: skip}, [y], engine)
    expected = TF.gelu((t64(x) @ t64(w) + t64(bias)).reshape(2, 3, 5)) + t64(skip)
    assert relative_error(out, expected.numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["EpilogueCall"]
        assert "(bias, reshape, activation, residual)" in g.plan.describe()


def spread_rows(values):
    """``values`` (B, L, N) in a NaN-filled buffer of rows of N + 3 elements, at [1, N + 1) of each
    row: B and L still merge into one strided run of rows."""
    buffer = np.full((*values.shape[:-1], values.shape[-1] + 3), np.nan, values.dtype)
    view = buffer[..., 1 : values.shape[-1] + 1]
    view[...] = values
    return view


@pytest.mark.parametrize("spread", [False, True], ids=["dense", "spread_rows"])
def test_an_epilogue_past_a_reshape_writes_and_reads_strided_rows_in_place(spread):
    """The output and the residual (B, L, N) whose B and L merge into one run of rows: the call
    writes every element of the output's view and nothing else of its buffer."""
    rng = np.random.default_rng(62)
    x, w, bias, values = random(rng, (6, 4)), random(rng, (4, 5)), random(rng, (5,)), random(rng, (2, 3, 5))
    laid = spread_rows if spread else np.ascontiguousarray
    skip, out = laid(values), laid(np.full((2, 3, 5), np.nan, np.float32))
    g = cpu_graph("strided_rows")
    xt, wt, biast = graph_inputs(g, x=x, w=w, bias=bias)
    skipt = g.tensor([2, 3, 5], [s // 4 for s in skip.strides], name="skip")
    y = g.add(linear_layer(g, xt, wt, biast, [2, 3, 5]), skipt)
    (result,) = run_laid_out(g, {xt: x, wt: w, biast: bias, skipt: skip}, {y: out}, "fused")
    expected = (t64(x) @ t64(w) + t64(bias)).reshape(2, 3, 5) + t64(values)
    assert relative_error(result, expected.numpy()) < TOLERANCE
    assert steps(g) == ["EpilogueCall"]
    if spread:
        assert_written_inside_only(out)


def test_a_residual_whose_rows_do_not_merge_is_added_by_a_kernel_after_the_epilogue():
    """A residual (B, L, N) stored L-major has no view in the product's (B * L, N) rows."""
    rng = np.random.default_rng(63)
    x, w, bias = random(rng, (6, 4)), random(rng, (4, 5)), random(rng, (5,))
    skip = laid_out(random(rng, (2, 3, 5)), (1, 0, 2))
    g = cpu_graph("unmerged_residual")
    xt, wt, biast = graph_inputs(g, x=x, w=w, bias=bias)
    skipt = g.tensor([2, 3, 5], [s // 4 for s in skip.strides], name="skip")
    y = g.add(g.tanh(linear_layer(g, xt, wt, biast, [2, 3, 5])), skipt)
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, biast: bias, skipt: skip}, [y], "fused")
    expected = torch.tanh((t64(x) @ t64(w) + t64(bias)).reshape(2, 3, 5)) + t64(skip)
    assert relative_error(out, expected.numpy()) < TOLERANCE
    assert steps(g) == ["EpilogueCall", "FusedKernel"]
    assert "(bias, reshape, activation)" in g.plan.describe()


@pytest.mark.parametrize(
    "dims, reads_through",
    [((6, 5), True), ((2, 3, 5), True), ((1, 6, 1, 5), True), ((6, 5, 1), False), ((3, 10), False)],
    ids=["same", "split_rows", "ones_added", "last_dim_moved", "rows_and_columns_merged"],
)
def test_an_epilogue_reads_through_a_reshape_that_splits_or_merges_rows_only(dims, reads_through):
    """A reshape keeping the product's last dim relabels rows; one that moves it changes which
    elements a column bias or an activation after it meets, and ends the epilogue."""
    rng = np.random.default_rng(64)
    x, w, bias = random(rng, (6, 4)), random(rng, (4, 5)), random(rng, (5,))
    g = cpu_graph("reshapes")
    xt, wt, biast = graph_inputs(g, x=x, w=w, bias=bias)
    y = g.sigmoid(linear_layer(g, xt, wt, biast, list(dims)))
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, biast: bias}, [y], "fused")
    expected = torch.sigmoid((t64(x) @ t64(w) + t64(bias)).reshape(dims))
    assert relative_error(out, expected.numpy()) < TOLERANCE
    assert steps(g) == (["EpilogueCall"] if reads_through else ["EpilogueCall", "NodeCall", "FusedKernel"])


def test_a_row_bias_past_a_reshape_is_not_the_products_row_bias():
    """(1, L, 1) after (B * L, N) -> (B, L, N) adds per l, not per product row: a generated kernel."""
    rng = np.random.default_rng(65)
    x, w, per_position = random(rng, (6, 4)), random(rng, (4, 5)), random(rng, (1, 3, 1))
    g = cpu_graph("row_bias_past_reshape")
    xt, wt, pt = graph_inputs(g, x=x, w=w, p=per_position)
    y = g.add(g.reshape(g.matmul(xt, wt), [2, 3, 5]), pt)
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w, pt: per_position}, [y], "fused")
    expected = (t64(x) @ t64(w)).reshape(2, 3, 5) + t64(per_position)
    assert relative_error(out, expected.numpy()) < TOLERANCE
    assert "EpilogueCall" not in steps(g)


@pytest.mark.parametrize("seed", range(40))
def test_relabeled_views_a_layout_in_new_dims_exactly_where_torch_view_does(seed):
    """``relabeled`` against torch's ``view`` (which refuses where no strided view exists), over
    random dims, memory orders, spread dims and regroupings of the same elements."""
    rng = np.random.default_rng(seed)
    dims = tuple(int(d) for d in rng.choice([1, 2, 3, 4, 6], size=int(rng.integers(1, 5))))
    array = torch.from_numpy(strided_array(rng, dims))
    factors = [p for d in dims for p in _prime_factors(d)]
    rng.shuffle(factors)
    cuts = sorted(rng.choice(len(factors) + 1, size=int(rng.integers(0, 3)), replace=True)) if factors else []
    groups = np.split(np.array(factors, dtype=np.int64), cuts)
    target = tuple(int(np.prod(group)) for group in groups) if factors else (1,)
    desc = od.TensorDescriptor(od.DataType.FLOAT, dims, array.stride())
    view = relabeled(desc, target)
    try:
        expected = array.view(target)
    except RuntimeError:
        assert view is None, (dims, array.stride(), target)
        return
    assert view is not None, (dims, array.stride(), target)
    assert view.dims == target
    assert torch.equal(array.as_strided(target, view.strides), expected)


def _prime_factors(n):
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


# ---- normalizations and the fused tail ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_norm_activation_residual(engine):
    rng = np.random.default_rng(36)
    x, r = random(rng, (2, 3, 8)), random(rng, (2, 3, 8))
    scale, bias = random(rng, (1, 1, 8)), random(rng, (1, 1, 8))
    g = cpu_graph("nar")
    xt, rt, st, bt = graph_inputs(g, x=x, r=r, scale=scale, bias=bias)
    y, _, _ = g.layernorm(xt, st, bt, norm_forward_phase="inference")
    out_t = g.add(g.relu(y), rt)
    out_t.set_output(True)
    (out,) = run(g, {xt: x, rt: r, st: scale, bt: bias}, [out_t], engine)
    expected = torch.relu(TF.layer_norm(t64(x), (8,), t64(scale).flatten(), t64(bias).flatten())) + t64(r)
    assert relative_error(out, expected.numpy()) < 1e-4
    if engine == "fused":
        assert steps(g) == ["NodeCall", "FusedKernel"]


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_inference_and_relu_fuse_into_one_kernel(engine):
    rng = np.random.default_rng(37)
    x = random(rng, (2, 3, 4, 4))
    mean, scale, bias = random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    inv = np.abs(random(rng, (1, 3, 1, 1))) + 0.5
    g = cpu_graph("bnr")
    xt, mt, it, st, bt = graph_inputs(g, x=x, mean=mean, inv=inv, scale=scale, bias=bias)
    y = g.relu(g.batchnorm_inference(xt, mt, it, st, bt))
    y.set_output(True)
    (out,) = run(g, {xt: x, mt: mean, it: inv, st: scale, bt: bias}, [y], engine)
    expected = torch.relu((t64(x) - t64(mean)) * t64(inv) * t64(scale) + t64(bias)).numpy()
    assert relative_error(out, expected) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"]


# ---- reductions at the end of a region ----------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pointwise_chain_ending_in_a_reduction_over_trailing_dims(engine):
    rng = np.random.default_rng(38)
    x, b = random(rng, (3, 4, 5)), random(rng, (5,))
    g = cpu_graph("rowsum")
    xt, bt = graph_inputs(g, x=x, b=b)
    squared = g.mul(g.add(xt, bt), g.add(xt, bt))
    squared.set_output(True)  # an intermediate the reduction kernel also stores
    y = g.reduction(g.sqrt(squared), "add", [3, 1, 1])
    y.set_output(True)
    out_squared, out = run(g, {xt: x, bt: b}, [squared, y], engine)
    shifted = t64(x) + t64(b)
    assert relative_error(out_squared, (shifted * shifted).numpy()) < TOLERANCE
    assert relative_error(out, shifted.abs().sum((1, 2), keepdim=True).numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"]


@pytest.mark.parametrize("engine", ENGINES)
def test_scale_bias_relu_genstats_is_one_kernel(engine):
    rng = np.random.default_rng(39)
    x, s, b = random(rng, (2, 3, 4, 4)), random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph("sbrg")
    xt, st, bt = graph_inputs(g, x=x, s=s, b=b)
    activated = g.relu(g.bias(g.scale(xt, st), bt))
    activated.set_output(True)
    total, squares = g.genstats(activated)
    total.set_output(True)
    squares.set_output(True)
    out_activated, out_sum, out_squares = run(g, {xt: x, st: s, bt: b}, [activated, total, squares], engine)
    v = torch.relu(t64(x) * t64(s) + t64(b))
    assert relative_error(out_activated, v.numpy()) < TOLERANCE
    assert relative_error(out_sum, v.sum((0, 2, 3), keepdim=True).numpy()) < TOLERANCE
    assert relative_error(out_squares, (v * v).sum((0, 2, 3), keepdim=True).numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"]


@pytest.mark.parametrize("mode", ["min", "max", "amax", "avg", "norm1", "norm2", "mul", "mul_no_zeros"])
def test_every_reduction_mode_in_a_fused_kernel(mode):
    rng = np.random.default_rng(40)
    x = random(rng, (2, 6, 3)) * 0.5
    g = cpu_graph(f"reduce_{mode}")
    xt = g.tensor_like(x, name="x")
    y = g.reduction(g.add(xt, 1.0), mode, [1, 6, 1])
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], "fused")
    v = x.astype(np.float64) + 1.0
    axes = (0, 2)
    expected = {
        "min": v.min(axes, keepdims=True),
        "max": v.max(axes, keepdims=True),
        "amax": np.abs(v).max(axes, keepdims=True),
        "avg": v.mean(axes, keepdims=True),
        "norm1": np.abs(v).sum(axes, keepdims=True),
        "norm2": np.sqrt((v * v).sum(axes, keepdims=True)),
        "mul": v.prod(axes, keepdims=True),
        "mul_no_zeros": v.prod(axes, keepdims=True),
    }[mode]
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_a_double_region_stores_bfloat16_outputs_through_float32(engine):
    rng = np.random.default_rng(41)
    x = random(rng, (3, 5), np.float64)
    g = cpu_graph("double_to_bf16", io_data_type=og.DataType.DOUBLE, compute_data_type=og.DataType.DOUBLE)
    xt = g.tensor_like(x, name="x")
    y = g.tanh(g.scale(xt, 1.5))
    total = g.reduction(y, "add", [3, 1])
    for tensor in (y, total):
        tensor.set_output(True).set_data_type(og.DataType.BFLOAT16)
    out, out_total = run(g, {xt: x}, [y, total], engine)
    expected = torch.tanh(t64(x) * 1.5)
    assert relative_error(out, expected.numpy()) < 1e-2
    assert relative_error(out_total, expected.sum(1, keepdim=True).numpy()) < 1e-2


@pytest.mark.parametrize("engine", ENGINES)
def test_what_reads_a_comparison_computes_in_double_precision(engine):
    rng = np.random.default_rng(43)
    x = random(rng, (4, 5), np.float64)
    g = cpu_graph("double_compare", io_data_type=og.DataType.DOUBLE, intermediate_data_type=og.DataType.DOUBLE)
    xt = g.tensor_like(x, name="x")
    y = g.softplus(g.logical_or(g.cmp_gt(xt, 0.25), g.cmp_lt(xt, -1.0)))
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    selected = ((t64(x) > 0.25) | (t64(x) < -1.0)).double()
    assert relative_error(out, TF.softplus(selected).numpy()) < 1e-13


@pytest.mark.parametrize("engine", ENGINES)
def test_a_region_of_one_element_ending_in_a_reduction_stores_its_intermediates(engine):
    x, z = np.array([0.75], np.float32), np.array([-1.5], np.float32)
    g = cpu_graph("one_element")
    xt, zt = graph_inputs(g, x=x, z=z)
    erf = g.erf(xt)
    erf.set_output(True)  # stored inside the reduction's loop, at the one element's offset
    y = g.reduction(g.add(erf, zt), "max", [1])
    y.set_output(True)
    out_erf, out = run(g, {xt: x, zt: z}, [erf, y], engine)
    assert relative_error(out_erf, torch.erf(t64(x)).numpy()) < TOLERANCE
    assert relative_error(out, (torch.erf(t64(x)) + t64(z)).numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["logical_and", "logical_or", "pow"])
def test_a_binary_mode_between_a_block_and_a_scalar_operand(engine, mode):
    rng = np.random.default_rng(42)
    x = np.abs(random(rng, (4, 3))) * np.array([0, 1, 1], np.float32)  # a column of zeros
    e = np.array([2.0], np.float32)  # broadcast over the whole space: one load, not a block
    g = cpu_graph(f"scalar_{mode}")
    xt, et = graph_inputs(g, x=x, e=e)
    outputs = [getattr(g, mode)(xt, et), getattr(g, mode)(0.5, xt), getattr(g, mode)(xt, 0.0)]
    for tensor in outputs:
        tensor.set_output(True)
    results = run(g, {xt: x, et: e}, outputs, engine)
    xs = t64(x)
    function = {
        "logical_and": lambda a, b: ((a != 0) & (b != 0)).double(),
        "logical_or": lambda a, b: ((a != 0) | (b != 0)).double(),
        "pow": torch.pow,
    }[mode]
    expected = [function(xs, t64(e)), function(torch.tensor(0.5, dtype=torch.float64), xs), function(xs, 0.0 * xs)]
    for actual, want in zip(results, expected):
        assert relative_error(actual, want.expand(actual.shape).numpy()) < TOLERANCE


# ---- NaN, infinities and signed zeros: what the reference engine computes -------------------------------

ACTIVATIONS = [mode for mode in od.PointwiseMode if mode.value.endswith("_fwd")]


@QUIET_NUMPY
@pytest.mark.parametrize("mode", list(od.PointwiseMode), ids=lambda mode: mode.value)
def test_every_pointwise_mode_in_a_generated_kernel_gives_the_reference_engines_special_values(mode):
    (actual,), (expected,), fused_steps = on_both_engines(pointwise_special_values(mode), "fused")
    assert_same_special_values(actual, expected, TOLERANCE, mode.value)
    assert fused_steps == ["FusedKernel"]


@QUIET_NUMPY
@pytest.mark.parametrize("anchor", ["conv_fprop", "matmul"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda mode: mode.value)
def test_an_epilogues_activation_gives_the_reference_engines_nan_infinities_and_signed_zeros(activation, anchor):
    (actual,), (expected,), fused_steps = on_both_engines(epilogue_special_values(anchor, activation), "fused")
    assert_same_special_values(actual, expected, TOLERANCE, activation.value)
    # the product's epilogue turns NaN into 0 (cuBLASLt's relu): relu and clipped relu run after it
    nan_to_zero = anchor == "matmul" and activation.value.startswith(("relu", "clipped_relu"))
    assert fused_steps == (["EpilogueCall", "FusedKernel"] if nan_to_zero else ["EpilogueCall"])


@QUIET_NUMPY
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=lambda mode: mode.value)
def test_a_prologue_of_activation_comparison_and_select_gives_the_reference_engines_special_values(activation):
    fused, reference, fused_steps = on_both_engines(prologue_special_values(activation), "fused")
    for name, actual, expected in zip(("activated", "keep", "selected", "total"), fused, reference):
        assert_same_special_values(actual, expected, TOLERANCE, f"{activation.value}: {name}")
    assert fused_steps == ["FusedKernel"]


# ---- the rule -----------------------------------------------------------------------------------------


def test_an_intermediate_read_by_two_regions_is_written_once_and_read_by_both():
    rng = np.random.default_rng(41)
    x, w = random(rng, (1, 2, 4, 4)), random(rng, (2, 2, 1, 1))
    g = cpu_graph("shared")
    xt, wt = graph_inputs(g, x=x, w=w)
    shared = g.exp(xt, name="shared")  # read by the conv and by the add: its own region
    y = g.add(g.conv_fprop(shared, wt), shared, name="sum")
    y.set_output(True)
    (out,) = run(g, {xt: x, wt: w}, [y], "fused")
    e = torch.exp(t64(x))
    assert relative_error(out, (TF.conv2d(e, t64(w)) + e).numpy()) < TOLERANCE
    assert steps(g) == ["FusedKernel", "EpilogueCall"]  # the add is the conv's residual
    assert "shared" in g.plan.describe().splitlines()[1]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pointwise_dag_of_several_outputs_is_one_kernel(engine):
    rng = np.random.default_rng(42)
    x, b = random(rng, (3, 4)), random(rng, (4,))
    g = cpu_graph("outputs")
    xt, bt = graph_inputs(g, x=x, b=b)
    shared = g.exp(g.mul(xt, 0.5), name="shared")
    outputs = [g.sin(shared, name="y1"), g.add(shared, bt, name="y2"), g.mul(g.cos(shared), bt, name="y3")]
    for t in outputs:
        t.set_output(True)
    results = run(g, {xt: x, bt: b}, outputs, engine)
    e = torch.exp(t64(x) * 0.5)
    for actual, expected in zip(results, (torch.sin(e), e + t64(b), torch.cos(e) * t64(b))):
        assert relative_error(actual, expected.numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"] and g.get_workspace_size() == 0


def test_regions_a_path_through_another_step_connects_do_not_merge():
    g = cpu_graph("apart")
    x = g.tensor([2, 6], name="x")
    shared = g.exp(x, name="shared")
    first = g.relu(shared, name="first")
    first.set_output(True)
    second = g.add(shared, g.softmax(first), name="second")  # waits on the softmax, which waits on first
    second.set_output(True)
    build(g, "fused")
    assert steps(g) == ["FusedKernel", "NodeCall", "FusedKernel"]
    assert [node.name for node in g.plan.steps[0].region.nodes] == ["shared", "first"]  # second stays apart


@pytest.mark.parametrize("engine", ENGINES)
def test_regions_a_path_through_a_third_region_connects_do_not_merge(engine):
    """An inference batch norm's backward: dx's region reads scale, whose region also computes dw
    from the reduction over the gate, and the gate's region feeds that reduction. Merging the gate's
    region with dx's would make two kernels that each wait on the other."""
    rng = np.random.default_rng(44)
    arrays = {"dy": random(rng, (2, 4, 3, 3)), "x": random(rng, (2, 4, 3, 3)), "w": random(rng, (1, 4, 1, 1))}
    arrays["v"] = np.abs(random(rng, (1, 4, 1, 1))) + 0.5
    g = cpu_graph("frozen_batch_norm_backward")
    dy, x, w, v = graph_inputs(g, **arrays)
    gate = g.relu(dy, name="gate")
    inv = g.rsqrt(v, name="inv")
    dx = g.mul(gate, g.mul(inv, w, name="scale"), name="dx")
    dw = g.mul(g.reduction(g.mul(gate, x), "add", [1, 4, 1, 1], name="dot"), inv, name="dw")
    db = g.reduction(gate, "add", [1, 4, 1, 1], name="db")
    for t in (dx, dw, db):
        t.set_output(True)
    results = run(g, dict(zip((dy, x, w, v), arrays.values())), [dx, dw, db], engine)
    relu_dy, inv_v = torch.relu(t64(arrays["dy"])), torch.rsqrt(t64(arrays["v"]))
    expected = [
        relu_dy * inv_v * t64(arrays["w"]),
        (relu_dy * t64(arrays["x"])).sum((0, 2, 3), keepdim=True) * inv_v,
        relu_dy.sum((0, 2, 3), keepdim=True),
    ]
    for actual, exact in zip(results, expected, strict=True):
        assert relative_error(actual, exact.numpy()) < TOLERANCE
    if engine == "fused":
        assert steps(g) == ["FusedKernel"] * 3
        kernels = [{node.name for node in step.region.nodes} for step in g.plan.steps]
        assert not any({"gate", "dx"} <= kernel for kernel in kernels)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_node_that_reads_a_reduction_result_is_not_in_its_kernel(engine):
    rng = np.random.default_rng(43)
    x = random(rng, (4, 5))
    g = cpu_graph("centered")
    xt = g.tensor_like(x, name="x")
    e = g.exp(xt, name="e")
    total = g.reduction(e, "add", [4, 1], name="total")
    share = g.div(e, total, name="share")
    share.set_output(True)
    (out,) = run(g, {xt: x}, [share], engine)
    expected = torch.softmax(t64(x), dim=1).numpy()
    assert relative_error(out, expected) < TOLERANCE
    if engine == "fused":  # exp and the sum in one kernel (which also stores e), the division after it
        assert steps(g) == ["FusedKernel", "FusedKernel"]
        assert [node.name for node in g.plan.steps[0].region.nodes] == ["e", "total"]


def test_a_broadcast_graph_output_starts_its_own_region():
    g = cpu_graph("small_output")
    x, c = g.tensor([4, 5], name="x"), g.tensor([1, 5], name="c")
    per_column = g.exp(c, name="per_column")
    per_column.set_output(True)  # stored once per column, not once per element of x
    y = g.mul(x, per_column, name="product")
    y.set_output(True)
    build(g, "fused")
    assert steps(g) == ["FusedKernel", "FusedKernel"]


def test_the_cost_model_counts_a_write_and_a_read_per_fused_intermediate():
    g = cpu_graph("cost")
    x, b = g.tensor([2, 3, 4, 5], name="x"), g.tensor([1, 3, 1, 1], name="b")
    y = g.relu(g.mul(g.add(x, b), 0.5))
    y.set_output(True)
    build(g, "fused")
    assert g.plan.saved_bytes == 2 * (120 * 4) * 2  # two float intermediates of 120 elements, written and read
    assert "saves 1920 bytes" in g.plan.describe()


def test_the_generated_source_is_python_that_names_each_node():
    g = cpu_graph("readable")
    x = g.tensor([8, 16], name="x")
    y = g.softplus(g.sub(x, 1.0, name="shift"), beta=2.0, name="smooth")
    y.set_output(True).set_name("y")
    build(g, "fused")
    source = g.plan.source()
    ast.parse(source)
    assert '"""Fused kernel of graph \'readable\': shift (sub), smooth (softplus_fwd).' in source
    assert "@triton.jit\ndef fused_kernel(x_ptr, y_ptr, shift_b_value: tl.float64, BLOCK: tl.constexpr):" in source
    assert "    shift_y = x - shift_b  # shift\n" in source
    assert '    y = activation("softplus", shift_y, 2.0)  # smooth\n' in source
    assert "i0 =" not in source and "i1 =" not in source  # packed tensors of the space's dims read at index


@pytest.mark.parametrize("narrow", ["float16"])
def test_a_value_read_inside_a_kernel_is_the_one_its_tensor_holds(narrow):
    """A node's output of a narrower type than the kernel computes in, read by another node of the
    kernel, is rounded to that type first: the engines that store it between nodes read it so.
    (Not bfloat16 here: Triton 3.6's interpreter truncates float32 to bfloat16, where GPUs round.)"""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (4, 8)).astype(np.float32)
    results = {}
    for engine in ("reference", "fused"):
        g = cpu_graph()
        (xt,) = graph_inputs(g, x=x)
        scaled = g.mul(xt, 1.0001)
        scaled.set_output(True).set_data_type(narrow)
        difference = g.sub(scaled, xt)
        difference.set_output(True)
        results[engine] = run(g, {xt: x}, [scaled, difference], engine)
    expected = (torch.from_numpy(x) * 1.0001).to(getattr(torch, narrow)).float() - torch.from_numpy(x)
    for engine, (_, out) in results.items():
        assert np.array_equal(out, expected.numpy()), engine
    assert "one generated kernel for mul_0, sub_1" in g.plan.describe()
