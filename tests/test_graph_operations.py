"""Every operation of the graph API, alone, on the reference engine (NumPy) and on the per-node
engine (Triton, through its interpreter), against torch in float64."""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from graph_helpers import (  # noqa: F401
    QUIET_NUMPY,
    assert_same_special_values,
    build,
    cpu_graph,
    graph_inputs,
    kernel_cache,
    on_both_engines,
    pointwise_special_values,
    random,
    relative_error,
    run,
    t64,
)

import opendnn as od
import opendnn.graph as og

ENGINES = ["reference", "per_node"]
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


@pytest.mark.parametrize("engine", ENGINES)
def test_conv_fprop_with_groups_stride_and_channels_last_input(engine):
    rng = np.random.default_rng(1)
    x = random(rng, (2, 5, 4, 4)).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)  # NHWC memory, NCHW dims
    w = random(rng, (4, 5, 3, 3))
    g = cpu_graph()
    xt, wt = graph_inputs(g, x=x, w=w)
    y = g.conv_fprop(xt, wt, padding=[1, 1], stride=[2, 1], dilation=[1, 1])
    y.set_output(True)
    assert y.get_dim() == [2, 4, 2, 4]
    (out,) = run(g, {xt: x, wt: w}, [y], engine)
    expected = TF.conv2d(t64(x), t64(w), padding=1, stride=(2, 1)).numpy()
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_conv_dgrad_with_the_image_size_set_for_stride_two(engine):
    rng = np.random.default_rng(2)
    dy, w = random(rng, (2, 4, 3, 3)), random(rng, (4, 3, 3, 3))
    g = cpu_graph()
    dyt, wt = graph_inputs(g, dy=dy, w=w)
    dx = g.conv_dgrad(dyt, wt, padding=[1, 1], stride=[2, 2])
    assert dx.get_dim() == [2, 3, 5, 5]  # the smallest image; 6 x 6 maps onto the same loss
    dx.set_dim([2, 3, 6, 6]).set_output(True)
    (out,) = run(g, {dyt: dy, wt: w}, [dx], engine)
    expected = torch.nn.grad.conv2d_input((2, 3, 6, 6), t64(w), t64(dy), stride=2, padding=1).numpy()
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_conv_wgrad(engine):
    rng = np.random.default_rng(3)
    x, dy = random(rng, (2, 3, 5, 5)), random(rng, (2, 4, 5, 5))
    g = cpu_graph()
    xt, dyt = graph_inputs(g, x=x, dy=dy)
    dw = g.conv_wgrad(xt, dyt, padding=[1, 1])
    dw.set_output(True)
    assert dw.get_dim() == [4, 3, 3, 3]
    (out,) = run(g, {xt: x, dyt: dy}, [dw], engine)
    expected = torch.nn.grad.conv2d_weight(t64(x), (4, 3, 3, 3), t64(dy), padding=1).numpy()
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_matmul_broadcasts_batch_dims_and_reads_a_transposed_operand(engine):
    rng = np.random.default_rng(4)
    a = random(rng, (3, 1, 4, 5))
    b = random(rng, (2, 6, 5)).transpose(0, 2, 1)  # (2, 5, 6), read through its strides
    g = cpu_graph()
    at, bt = graph_inputs(g, a=a, b=b)
    c = g.matmul(at, bt)
    c.set_output(True)
    assert c.get_dim() == [3, 2, 4, 6]
    (out,) = run(g, {at: a, bt: b}, [c], engine)
    assert relative_error(out, t64(a) @ t64(b)) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["add", "max", "amax", "avg", "norm2", "mul"])
def test_reduction_over_the_dims_the_output_sets_to_one(engine, mode):
    rng = np.random.default_rng(5)
    x = random(rng, (2, 3, 4)) * 0.5 + 1.0
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    y = g.reduction(xt, mode, [2, 1, 4])
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    x64 = x.astype(np.float64)
    expected = {
        "add": x64.sum(1, keepdims=True),
        "max": x64.max(1, keepdims=True),
        "amax": np.abs(x64).max(1, keepdims=True),
        "avg": x64.mean(1, keepdims=True),
        "norm2": np.sqrt((x64 * x64).sum(1, keepdims=True)),
        "mul": x64.prod(1, keepdims=True),
    }[mode]
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_genstats_gives_each_channels_sum_and_sum_of_squares(engine):
    rng = np.random.default_rng(6)
    x = random(rng, (2, 3, 4, 4))
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    total, squares = g.genstats(xt)
    for t in (total, squares):
        t.set_output(True)
    assert total.get_dim() == [1, 3, 1, 1] and total.get_data_type() is og.DataType.FLOAT
    out_sum, out_squares = run(g, {xt: x}, [total, squares], engine)
    x64 = x.astype(np.float64)
    assert relative_error(out_sum, x64.sum((0, 2, 3), keepdims=True)) < TOLERANCE
    assert relative_error(out_squares, (x64 * x64).sum((0, 2, 3), keepdims=True)) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_training_updates_the_running_statistics(engine):
    rng = np.random.default_rng(7)
    x = random(rng, (4, 3, 2, 2))
    scale, bias = random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    mean, var = random(rng, (1, 3, 1, 1)), np.abs(random(rng, (1, 3, 1, 1))) + 0.5
    g = cpu_graph()
    xt, st, bt, mt, vt = graph_inputs(g, x=x, scale=scale, bias=bias, mean=mean, var=var)
    outputs = g.batchnorm(xt, st, bt, mt, vt, epsilon=1e-5, momentum=0.25)
    for t in outputs:
        t.set_output(True)
    y, saved_mean, saved_inv, next_mean, next_var = run(
        g, {xt: x, st: scale, bt: bias, mt: mean, vt: var}, outputs, engine
    )
    running_mean, running_var = t64(mean).flatten(), t64(var).flatten()
    expected = TF.batch_norm(
        t64(x),
        running_mean,
        running_var,
        t64(scale).flatten(),
        t64(bias).flatten(),
        training=True,
        momentum=0.25,
        eps=1e-5,
    ).numpy()
    x64 = x.astype(np.float64)
    assert relative_error(y, expected) < TOLERANCE
    assert relative_error(saved_mean, x64.mean((0, 2, 3), keepdims=True)) < TOLERANCE
    assert relative_error(saved_inv, 1 / np.sqrt(x64.var((0, 2, 3), keepdims=True) + 1e-5)) < TOLERANCE
    assert relative_error(next_mean, running_mean.numpy().reshape(1, 3, 1, 1)) < TOLERANCE
    assert relative_error(next_var, running_var.numpy().reshape(1, 3, 1, 1)) < TOLERANCE


def _autograd(function, *arrays):
    tensors = [t64(a).requires_grad_() for a in arrays]
    return tensors, function(*tensors)


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_backward_from_the_saved_statistics(engine):
    rng = np.random.default_rng(8)
    x, dy, scale = random(rng, (4, 3, 2, 2)), random(rng, (4, 3, 2, 2)), random(rng, (1, 3, 1, 1))
    x64 = x.astype(np.float64)
    mean = x64.mean((0, 2, 3), keepdims=True).astype(np.float32)
    inv = (1 / np.sqrt(x64.var((0, 2, 3), keepdims=True) + 1e-5)).astype(np.float32)
    g = cpu_graph()
    xt, dyt, st, mt, it = graph_inputs(g, x=x, dy=dy, scale=scale, mean=mean, inv=inv)
    outputs = g.batchnorm_backward(dyt, xt, st, mt, it)
    for t in outputs:
        t.set_output(True)
    dx, dscale, dbias = run(g, {xt: x, dyt: dy, st: scale, mt: mean, it: inv}, outputs, engine)
    (xg, sg), y = _autograd(
        lambda a, s: TF.batch_norm(a, None, None, s.flatten(), None, training=True, eps=1e-5), x, scale
    )
    y.backward(t64(dy))
    assert relative_error(dx, xg.grad.numpy()) < 1e-4
    assert relative_error(dscale, sg.grad.numpy()) < TOLERANCE
    assert relative_error(dbias, dy.astype(np.float64).sum((0, 2, 3), keepdims=True)) < TOLERANCE


def _channel_strided(array, step):
    """``array`` (1, C, 1, 1) as a view of every ``step``-th float of a larger buffer (NaN between)."""
    buffer = np.full(array.size * step, np.nan, array.dtype)
    buffer[::step] = array.ravel()
    return np.lib.stride_tricks.as_strided(buffer, array.shape, tuple(step * s for s in array.strides))


@pytest.mark.parametrize("engine", ENGINES)
def test_batchnorm_takes_parameters_and_statistics_of_any_strides(engine):
    """Scale, bias and running statistics of different strides (views of larger buffers), and
    gradients written to strided outputs: each reaches the call through a packed copy."""
    rng = np.random.default_rng(11)
    x, dy = random(rng, (4, 3, 2, 2)), random(rng, (4, 3, 2, 2))
    scale, bias = _channel_strided(random(rng, (1, 3, 1, 1)), 2), _channel_strided(random(rng, (1, 3, 1, 1)), 3)
    mean, var = random(rng, (1, 3, 1, 1)), _channel_strided(np.abs(random(rng, (1, 3, 1, 1))) + 0.5, 4)
    g = cpu_graph()
    xt, dyt, st, bt, mt, vt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias, mean=mean, var=var)
    y, saved_mean, saved_inv, next_mean, next_var = g.batchnorm(xt, st, bt, mt, vt, epsilon=1e-5, momentum=0.25)
    dx, dscale, dbias = g.batchnorm_backward(dyt, xt, st, saved_mean, saved_inv)
    for t in (y, next_mean, next_var, dx, dscale, dbias):
        t.set_output(True)
    dscale.set_stride([6, 2, 2, 2])
    next_var.set_stride([9, 3, 3, 3])
    build(g, engine)
    arrays = {t: np.full(t.get_dim(), np.nan, np.float32) for t in (y, next_mean, dx, dbias)}
    arrays[dscale], arrays[next_var] = (_channel_strided(np.full((1, 3, 1, 1), np.nan, np.float32), k) for k in (2, 3))
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    g.execute({xt: x, dyt: dy, st: scale, bt: bias, mt: mean, vt: var, **arrays}, workspace)
    outputs = [arrays[t] for t in (y, next_mean, next_var, dx, dscale, dbias)]
    running_mean, running_var = t64(mean).flatten(), t64(var).flatten()
    (xg, sg, bg), expected = _autograd(
        lambda a, s, b: TF.batch_norm(
            a, running_mean, running_var, s.flatten(), b.flatten(), training=True, momentum=0.25, eps=1e-5
        ),
        x,
        scale,
        bias,
    )
    expected.backward(t64(dy))
    references = [expected.detach(), running_mean.reshape(1, 3, 1, 1), running_var.reshape(1, 3, 1, 1)]
    references += [xg.grad, sg.grad, bg.grad]
    for out, reference in zip(outputs, references):
        assert relative_error(out, reference.numpy()) < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_layernorm_and_its_backward(engine):
    """The backward reads the forward's saved statistics: its node has no epsilon of its own (an
    epsilon other than the default shows it)."""
    rng = np.random.default_rng(9)
    x, dy = random(rng, (2, 3, 8)), random(rng, (2, 3, 8))
    scale, bias = random(rng, (1, 1, 8)), random(rng, (1, 1, 8))
    g = cpu_graph()
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    y, mean, inv = g.layernorm(xt, st, bt, epsilon=0.25)
    dx, dscale, dbias = g.layernorm_backward(dyt, xt, st, mean, inv)
    for t in (y, dx, dscale, dbias):
        t.set_output(True)
    outs = run(g, {xt: x, dyt: dy, st: scale, bt: bias}, [y, dx, dscale, dbias], engine)
    (xg, sg, bg), expected = _autograd(
        lambda a, s, b: TF.layer_norm(a, (8,), s.flatten(), b.flatten(), 0.25), x, scale, bias
    )
    expected.backward(t64(dy))
    for actual, want in zip(outs, (expected.detach(), xg.grad, sg.grad, bg.grad)):
        assert relative_error(actual, want.numpy().reshape(actual.shape)) < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_rmsnorm_inference_and_the_backward_of_its_training_form(engine):
    rng = np.random.default_rng(10)
    x, dy, scale = random(rng, (3, 8)), random(rng, (3, 8)), random(rng, (1, 8))
    g = cpu_graph()
    xt, dyt, st = graph_inputs(g, x=x, dy=dy, scale=scale)
    (y_inference, none) = g.rmsnorm(xt, st, epsilon=1e-5, norm_forward_phase=og.NormForwardPhase.INFERENCE)
    assert none is None
    _, inv_rms = g.rmsnorm(xt, st, epsilon=0.25)
    dx, dscale, dbias = g.rmsnorm_backward(dyt, xt, st, inv_rms)
    assert dbias is None
    for t in (y_inference, dx, dscale):
        t.set_output(True)
    y, dx_out, dscale_out = run(g, {xt: x, dyt: dy, st: scale}, [y_inference, dx, dscale], engine)
    _, inference = _autograd(lambda a, s: TF.rms_norm(a, (8,), s.flatten(), 1e-5), x, scale)
    (xg, sg), training = _autograd(lambda a, s: TF.rms_norm(a, (8,), s.flatten(), 0.25), x, scale)
    training.backward(t64(dy))  # the backward reads the training form's saved statistics (epsilon 0.25)
    assert relative_error(y, inference.detach().numpy()) < 1e-4
    assert relative_error(dx_out, xg.grad.numpy()) < 1e-4
    assert relative_error(dscale_out, sg.grad.numpy().reshape(1, 8)) < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
def test_instancenorm_and_its_backward(engine):
    rng = np.random.default_rng(11)
    x, dy = random(rng, (2, 3, 4, 4)), random(rng, (2, 3, 4, 4))
    scale, bias = random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph()
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    y, mean, inv = g.instancenorm(xt, st, bt, epsilon=0.25)
    assert mean.get_dim() == [2, 3, 1, 1]
    dx, dscale, dbias = g.instancenorm_backward(dyt, xt, st, mean, inv)
    for t in (y, dx, dscale, dbias):
        t.set_output(True)
    outs = run(g, {xt: x, dyt: dy, st: scale, bt: bias}, [y, dx, dscale, dbias], engine)
    (xg, sg, bg), expected = _autograd(
        lambda a, s, b: TF.instance_norm(a, weight=s.flatten(), bias=b.flatten(), eps=0.25), x, scale, bias
    )
    expected.backward(t64(dy))
    for actual, want in zip(outs, (expected.detach(), xg.grad, sg.grad, bg.grad)):
        assert relative_error(actual, want.numpy().reshape(actual.shape)) < 1e-4


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("axis, log", [(1, False), (-1, True), (0, False)])
def test_softmax_along_any_axis(engine, axis, log):
    rng = np.random.default_rng(12)
    x = random(rng, (3, 4, 5))
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    y = g.softmax(xt, axis=axis, log=log)
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    expected = (TF.log_softmax if log else TF.softmax)(t64(x), dim=axis).numpy()
    assert relative_error(out, expected) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
def test_softmax_and_matmul_of_double_inputs_write_bfloat16_outputs(engine):
    rng = np.random.default_rng(17)
    x, w = random(rng, (3, 5), np.float64), random(rng, (5, 4), np.float64)
    g = cpu_graph(io_data_type=og.DataType.DOUBLE)
    xt, wt = graph_inputs(g, x=x, w=w)
    probabilities, product = g.softmax(xt, axis=1), g.matmul(xt, wt)
    for tensor in (probabilities, product):
        tensor.set_output(True).set_data_type(og.DataType.BFLOAT16)
    out_probabilities, out_product = run(g, {xt: x, wt: w}, [probabilities, product], engine)
    assert relative_error(out_probabilities, TF.softmax(t64(x), dim=1).numpy()) < 1e-2
    assert relative_error(out_product, (t64(x) @ t64(w)).numpy()) < 1e-2


@pytest.mark.parametrize("engine", ENGINES)
def test_pooling_and_batchnorm_write_their_outputs_in_their_inputs_type(engine):
    rng = np.random.default_rng(18)
    x, scale, bias = random(rng, (2, 3, 4, 4)), random(rng, (1, 3, 1, 1)), random(rng, (1, 3, 1, 1))
    g = cpu_graph(io_data_type=og.DataType.BFLOAT16)  # a bound tensor's type, unless its operation fixes it
    xt, st, bt = (g.tensor_like(a, name=n) for a, n in ((x, "x"), (scale, "scale"), (bias, "bias")))
    pooled = g.pooling(g.tanh(xt), "max", window=[2, 2], name="pool")  # tanh's output is a FLOAT intermediate
    normalized, *_ = g.batchnorm(g.tanh(xt), st, bt, name="bn")
    for tensor in (pooled, normalized):
        tensor.set_output(True)
    out_pooled, out_normalized = run(g, {xt: x, st: scale, bt: bias}, [pooled, normalized], engine)
    assert pooled.get_data_type() is normalized.get_data_type() is og.DataType.FLOAT
    activated = torch.tanh(t64(x))
    assert relative_error(out_pooled, TF.max_pool2d(activated, 2).numpy()) < TOLERANCE
    expected = TF.batch_norm(activated, None, None, t64(scale).flatten(), t64(bias).flatten(), training=True)
    assert relative_error(out_normalized, expected.numpy()) < 1e-4
    pooled.set_data_type(og.DataType.BFLOAT16)
    with pytest.raises(
        od.BadParam, match=r"node 'pool' \(pooling\): output y 'pool::y' data type BFLOAT16 must be FLOAT"
    ):
        g.validate()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_norms_parameter_gradients_take_its_scales_type(engine):
    rng = np.random.default_rng(19)
    x, dy = random(rng, (2, 3, 4)).astype(np.float16), random(rng, (2, 3, 4)).astype(np.float16)
    scale, bias = random(rng, (1, 1, 4)), random(rng, (1, 1, 4))
    g = cpu_graph(io_data_type=og.DataType.HALF)  # x and dy HALF, the parameters FLOAT
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    _, mean, inv = g.layernorm(xt, st, bt, epsilon=1e-5)
    outputs = g.layernorm_backward(dyt, xt, st, mean, inv)
    for t in (*outputs, mean, inv):
        t.set_output(True)
    dx, dscale, dbias, *_ = run(g, {xt: x, dyt: dy, st: scale, bt: bias}, [*outputs, mean, inv], engine)
    assert [t.get_data_type() for t in outputs] == [og.DataType.HALF, og.DataType.FLOAT, og.DataType.FLOAT]
    (xg, sg, bg), y = _autograd(lambda a, s, b: TF.layer_norm(a, (4,), s.flatten(), b.flatten(), 1e-5), x, scale, bias)
    y.backward(t64(dy))
    assert relative_error(dx, xg.grad.numpy()) < 1e-2
    assert relative_error(dscale, sg.grad.numpy()) < 1e-4
    assert relative_error(dbias, bg.grad.numpy()) < 1e-4


@pytest.mark.parametrize("engine", [*ENGINES, "fused"])
def test_a_double_norms_bfloat16_parameter_gradients(engine):
    """x DOUBLE, scale BFLOAT16: the float64 sums are stored as bfloat16 through float32."""
    rng = np.random.default_rng(20)
    x, dy = random(rng, (2, 3, 4, 2), np.float64), random(rng, (2, 3, 4, 2), np.float64)
    scale, bias = (random(rng, (1, 3, 1, 1)).astype(og.DataType.BFLOAT16.to_numpy()) for _ in range(2))
    g = cpu_graph(io_data_type=og.DataType.DOUBLE)
    xt, dyt, st, bt = graph_inputs(g, x=x, dy=dy, scale=scale, bias=bias)
    _, mean, inv = g.instancenorm(xt, st, bt, epsilon=1e-5)
    outputs = g.instancenorm_backward(dyt, xt, st, mean, inv)
    for t in (*outputs, mean, inv):
        t.set_output(True)
    dx, dscale, dbias, *_ = run(g, {xt: x, dyt: dy, st: scale, bt: bias}, [*outputs, mean, inv], engine)
    assert [t.get_data_type() for t in outputs[1:]] == [og.DataType.BFLOAT16] * 2
    (xg, sg, bg), y = _autograd(
        lambda a, s, b: TF.instance_norm(a, weight=s.flatten(), bias=b.flatten(), eps=1e-5), x, scale, bias
    )
    y.backward(t64(dy))
    assert relative_error(dx, xg.grad.numpy()) < 1e-10
    assert relative_error(dscale, sg.grad.numpy().reshape(dscale.shape)) < 1e-2
    assert relative_error(dbias, bg.grad.numpy().reshape(dbias.shape)) < 1e-2


def test_batchnorm_backward_names_a_gradient_of_another_type_than_its_input():
    g = cpu_graph()
    x, dy = g.tensor([2, 3, 2], name="x"), g.tensor([2, 3, 2], data_type=og.DataType.HALF, name="dy")
    scale, mean, inv = (g.tensor([1, 3, 1], name=n) for n in ("scale", "mean", "inv"))
    with pytest.raises(
        od.BadParam,
        match=r"node 'bn_bwd' \(batchnorm_backward\): grad 'dy' data type HALF must equal input 'x' data type FLOAT",
    ):
        g.batchnorm_backward(dy, x, scale, mean, inv, name="bn_bwd")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["max", "avg_include"])
def test_pooling(engine, mode):
    rng = np.random.default_rng(13)
    x = random(rng, (2, 3, 5, 5))
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    y = g.pooling(xt, mode, window=[3, 3], stride=[2, 2], padding=[1, 1])
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    if mode == "max":
        expected = TF.max_pool2d(t64(x), 3, 2, 1)
    else:
        expected = TF.avg_pool2d(t64(x), 3, 2, 1, count_include_pad=True)
    assert relative_error(out, expected.numpy()) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode", ["MAXPOOL", og.ResampleMode.AVGPOOL_INCLUDE_PADDING, "avgpool_exclude_padding"])
def test_resample_computes_cudnn_frontends_pooling_modes(engine, mode):
    rng = np.random.default_rng(15)
    x = random(rng, (2, 3, 6, 7))
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    y, index = g.resample(xt, mode, window=[3, 2], stride=[2, 2], pre_padding=[1, 1], post_padding=[1, 1])
    assert index is None and y.dims == (2, 3, 3, 4)
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    if mode == "MAXPOOL":
        expected = TF.max_pool2d(t64(x), (3, 2), 2, 1)
    else:
        include = mode is og.ResampleMode.AVGPOOL_INCLUDE_PADDING
        expected = TF.avg_pool2d(t64(x), (3, 2), 2, 1, count_include_pad=include)
    assert relative_error(out, expected.numpy()) < TOLERANCE


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "mode, shape, stride, dims, torch_mode",
    [
        ("BILINEAR", (2, 3, 5, 6), [0.5, 1 / 3], (10, 18), "bilinear"),
        (og.ResampleMode.NEAREST, (2, 3, 7, 6), [2, 0.75], (3, 8), "nearest"),
        ("bilinear", (1, 2, 3, 4, 5), [0.5, 2, 1], (6, 2, 5), "trilinear"),
    ],
)
def test_resample_interpolates_as_torch_with_the_inverse_scale_factor(engine, mode, shape, stride, dims, torch_mode):
    """stride = 1 / torch's scale_factor; the output floor(in / stride), 1/3 counted as a third."""
    rng = np.random.default_rng(16)
    x = random(rng, shape)
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    y, index = g.resample(xt, mode, stride=stride)
    assert index is None and y.dims == (*shape[:2], *dims)
    y.set_output(True)
    (out,) = run(g, {xt: x}, [y], engine)
    factors = [1 / s for s in stride]
    expected = TF.interpolate(t64(x), scale_factor=factors, mode=torch_mode)
    assert expected.shape == y.dims
    assert relative_error(out, expected.numpy()) < TOLERANCE


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(resampling_mode="BILINEAR"), r"window=\[2, 2\] with BILINEAR: interpolation reads no window"),
        (dict(resampling_mode="nearest", window=None), "NEAREST needs stride: input pixels per output pixel"),
        (
            dict(resampling_mode="nearest", window=None, stride=[0.5, 0]),
            r"stride\[1\]=0 must be positive",
        ),
        (
            dict(resampling_mode="BILINEAR", window=None, stride=[0.5, 0.5], pre_padding=[1, 1]),
            r"pre_padding=\[1, 1\] with BILINEAR: interpolation takes no padding",
        ),
        (
            dict(resampling_mode="BILINEAR", window=None, stride=[0.5, 0.5], padding_mode="ZERO_PAD"),
            "padding_mode=ZERO_PAD with BILINEAR: BILINEAR computes with EDGE_VAL_PAD",
        ),
        (
            dict(resampling_mode="BILINEAR", window=None, stride=[8, 8]),
            r"stride\[0\]=8.0 leaves no output pixel of input 'x' dim 6",
        ),
        (
            dict(padding_mode=og.PaddingMode.ZERO_PAD),
            "padding_mode=ZERO_PAD with MAXPOOL: MAXPOOL computes with NEG_INF_PAD",
        ),
        (
            dict(resampling_mode="AVGPOOL_INCLUDE_PADDING", padding_mode="EDGE_VAL_PAD"),
            "padding_mode=EDGE_VAL_PAD with",
        ),
        (
            dict(padding_mode="reflect"),
            r"padding_mode='reflect' must be one of \['ZERO_PAD', 'NEG_INF_PAD', 'EDGE_VAL_PAD'\]",
        ),
        (dict(pre_padding=[1, 0], post_padding=[0, 1]), r"pre_padding=\[1, 0\] must equal post_padding=\[0, 1\]"),
        (dict(generate_index=True), "generate_index=True: no index tensor is made"),
    ],
)
def test_resample_refuses_what_it_does_not_compute_by_name(arguments, message):
    g = cpu_graph()
    xt = g.tensor(dim=[2, 3, 6, 6], name="x")
    with pytest.raises(od.BadParam, match=message):
        g.resample(xt, **{"window": [2, 2], **arguments})


@pytest.mark.parametrize("engine", ENGINES)
def test_cast_and_comparisons_store_the_types_asked_for(engine):
    rng = np.random.default_rng(14)
    x = random(rng, (4, 5))
    g = cpu_graph()
    xt = g.tensor_like(x, name="x")
    half = g.cast(xt, og.DataType.HALF)
    positive = g.cmp_gt(xt, 0.0)
    positive.set_data_type(og.DataType.BOOLEAN)
    for t in (half, positive):
        t.set_output(True)
    out_half, out_positive = run(g, {xt: x}, [half, positive], engine)
    assert relative_error(out_half, x) < 1e-3
    assert np.array_equal(out_positive, (x > 0).astype(np.float64))


def test_activations_without_a_coefficient_take_torchs_defaults():
    import opendnn.graph as og

    rng = np.random.default_rng(7)
    x_array = rng.uniform(-3, 3, (4, 5))
    expected = {
        "swish": x_array / (1 + np.exp(-x_array)),
        "elu": np.where(x_array > 0, x_array, np.expm1(x_array)),
        "softplus": np.log1p(np.exp(x_array)),
    }
    for method, reference in expected.items():
        g = og.Graph(io_data_type=og.DataType.DOUBLE, compute_data_type=og.DataType.DOUBLE)
        x = g.tensor(dim=[4, 5], data_type=og.DataType.DOUBLE, name="x")
        y = getattr(g, method)(x)
        y.set_output(True)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([og.HeurMode.A])
        g.check_support()
        g.build_plans()
        out = np.full((4, 5), np.nan)
        g.execute({x: x_array, y: out}, np.empty(g.get_workspace_size(), np.uint8))
        np.testing.assert_allclose(out, reference, rtol=1e-12, err_msg=method)


@QUIET_NUMPY
@pytest.mark.parametrize("mode", list(od.PointwiseMode), ids=lambda mode: mode.value)
def test_every_pointwise_mode_gives_the_reference_engines_nan_infinities_and_signed_zeros(mode):
    """NaN, both infinities, both zeros and finite values of each sign, in every combination of the
    mode's operands: the per-node engine's Triton kernel against the reference engine (NumPy)."""
    (actual,), (expected,), _ = on_both_engines(pointwise_special_values(mode), "per_node")
    assert_same_special_values(actual, expected, TOLERANCE, mode.value)
