"""The graph API's builder and lifecycle: the errors that name the node and tensor, validate,
check_support's reasons, the variant pack, scalars by value and by name, and serialization."""

import json
import weakref

import numpy as np
import pytest
import torch
from graph_helpers import build, cpu_graph, kernel_cache, random, relative_error, run, t64  # noqa: F401

import opendnn as od
import opendnn.graph as og
from opendnn.graph import engines

pytestmark = pytest.mark.usefixtures("kernel_cache")  # generated kernels in each test's own folder


def scale_bias_relu(handle=None, name="sbr"):
    """y = relu(x * s + b) over (2, 3, 4) with a per-channel bias and s a scalar given at execute time."""
    g = og.Graph(handle=handle or od.Handle("cpu"), name=name)
    x, b = g.tensor([2, 3, 4], name="x"), g.tensor([1, 3, 1], name="b")
    s = g.scalar(name="s")
    y = g.relu(g.bias(g.scale(x, s), b), name="relu")
    y.set_output(True).set_name("y")
    return g, x, b, s, y


# ---- the builder --------------------------------------------------------------------------------------


def test_tensor_accessors_and_the_data_types_each_role_takes():
    g = cpu_graph(io_data_type=og.DataType.HALF, intermediate_data_type=og.DataType.FLOAT)
    x = g.tensor([2, 3, 4], stride=[1, 2, 6], name="x")
    assert (x.get_name(), x.get_dim(), x.get_stride(), x.get_data_type()) == (
        "x",
        [2, 3, 4],
        [1, 2, 6],
        og.DataType.HALF,
    )
    y = g.exp(x, name="e")  # an output takes its input's memory order (x's innermost dim is its first)
    assert y.get_is_virtual() and y.get_data_type() is og.DataType.FLOAT and y.get_stride() == [1, 2, 6]
    assert g.exp(g.tensor([2, 3, 4])).get_stride() == [12, 4, 1]  # a row-major input, a row-major output
    assert y.set_output(True) is y and not y.get_is_virtual() and y.get_data_type() is og.DataType.HALF
    assert y.set_data_type("float32").get_data_type() is og.DataType.FLOAT
    array = np.zeros((5, 6), np.float64)[:, ::2]
    like = g.tensor_like(array, name="like")
    assert (like.get_dim(), like.get_stride(), like.get_data_type()) == ([5, 3], [6, 2], og.DataType.DOUBLE)


def test_activations_take_their_inputs_memory_order_and_other_outputs_are_row_major():
    g = cpu_graph()
    image = g.tensor([2, 4, 5, 6], stride=[120, 1, 24, 4], name="image")  # channels-last
    weight = g.tensor([8, 4, 3, 3], stride=[36, 1, 12, 4], name="weight")
    y = g.conv_fprop(image, weight, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    relu = g.relu(g.add(y, g.tensor([1, 8, 1, 1], name="bias")))
    total, squares = g.genstats(relu)
    assert y.get_stride() == relu.get_stride() == [240, 1, 48, 8]
    assert total.get_stride() == squares.get_stride() == [8, 1, 1, 1]
    rows = g.matmul(g.tensor([3, 5], stride=[1, 3], name="a"), g.tensor([5, 4], name="b"))
    assert rows.get_stride() == [4, 1]  # a product's result row-major, whatever its operands' order
    assert relu.set_stride([240, 30, 6, 1]).get_stride() == [240, 30, 6, 1]  # a set layout wins


def test_pointwise_outputs_broadcast_as_numpy():
    g = cpu_graph()
    a, b = g.tensor([4, 1, 5]), g.tensor([3, 1])
    assert g.add(a, b).get_dim() == [4, 3, 5]
    assert g.binary_select(a, b, g.tensor([5])).get_dim() == [4, 3, 5]


def test_an_operand_that_does_not_broadcast_is_named_with_its_node():
    g = cpu_graph()
    x, y = g.tensor([2, 3], name="x"), g.tensor([4, 3], name="y")
    with pytest.raises(
        od.BadParam,
        match=r"node 'sum' \(pointwise\): b 'y' dims \[4, 3\] do not broadcast with the "
        r"other inputs \(a 'x' \[2, 3\], b 'y' \[4, 3\]\)",
    ):
        g.add(x, y, name="sum")


def test_shape_errors_of_convolution_and_matmul_name_node_and_tensors():
    g = cpu_graph()
    x, w = g.tensor([1, 4, 5, 5], name="x"), g.tensor([8, 3, 3, 3], name="w")
    with pytest.raises(
        od.BadParam,
        match=r"node 'conv' \(conv_fprop\): image 'x' and weight 'w': C=4 must be a "
        r"multiple of the filter's C/groups=3",
    ):
        g.conv_fprop(x, w, padding=[1, 1], name="conv")
    a, b = g.tensor([2, 3], name="a"), g.tensor([4, 5], name="b")
    with pytest.raises(
        od.BadParam,
        match=r"node 'mm' \(matmul\): a 'a' dims \[2, 3\] and b 'b' dims \[4, 5\] do not "
        r"multiply: a's last dim 3 must equal b's dim -2 4",
    ):
        g.matmul(a, b, name="mm")
    with pytest.raises(
        od.BadParam,
        match=r"node 'norm' \(layernorm\): bias 's' dims \[1, 4\] must be \[1, 5\] \(one "
        r"per normalized element\)",
    ):
        x2, s = g.tensor([3, 5], name="x2"), g.tensor([1, 4], name="s")
        g.layernorm(x2, g.tensor([1, 5], name="s5"), s, name="norm")


def test_parameter_errors_name_the_value_and_rule():
    g = cpu_graph()
    x = g.tensor([2, 3, 4, 4], name="x")
    with pytest.raises(od.BadParam, match=r"epsilon=-1e-06 must be finite and at least 0.0"):
        g.batchnorm(x, g.tensor([1, 3, 1, 1]), g.tensor([1, 3, 1, 1]), epsilon=-1e-6)
    with pytest.raises(
        od.BadParam,
        match=r"node 'r' \(reduction\): output dims \[2, 3\] must have the 4 dims of input "
        r"'x' \[2, 3, 4, 4\]",
    ):
        g.reduction(x, "add", [2, 3], name="r")
    with pytest.raises(od.BadParam, match=r"mode='median' must be one of \['ADD',"):
        g.reduction(x, "median", [1, 1, 1, 1])
    with pytest.raises(od.BadParam, match=r"tensor 'bad': dim=\[2, 0\] must hold 1 or more dims, each at least 1"):
        g.tensor([2, 0], name="bad")
    with pytest.raises(od.BadParam, match=r"name='x2' is taken by another node"):
        g.exp(x, name="x2")
        g.exp(x, name="x2")


def test_a_tensor_of_another_graph_is_refused():
    g, other = cpu_graph("g"), cpu_graph("other")
    x = other.tensor([3], name="x")
    with pytest.raises(od.BadParam, match=r"node 'e' \(pointwise\): a 'x' belongs to another graph"):
        g.exp(x, name="e")


# ---- validate -----------------------------------------------------------------------------------------


def test_validate_checks_dims_changed_after_the_node_was_added():
    g = cpu_graph()
    x = g.tensor([2, 3], name="x")
    y = g.exp(x, name="e")
    y.set_output(True).set_dim([3, 3])
    with pytest.raises(od.BadParam, match=r"node 'e' \(pointwise\): output y 'e::y' dims \[3, 3\] must be \[2, 3\]"):
        g.validate()


def test_validate_refuses_a_conv_output_of_another_type_than_its_image():
    g = cpu_graph()
    y = g.conv_fprop(g.tensor([1, 2, 3, 3], name="x"), g.tensor([2, 2, 1, 1], name="w"), name="conv")
    y.set_output(True).set_data_type(og.DataType.HALF)
    with pytest.raises(
        od.BadParam,
        match=r"node 'conv' \(conv_fprop\): output y 'conv::y' data type HALF must be "
        r"FLOAT",
    ):
        g.validate()


def test_validate_infers_an_operations_output_type_again_from_its_inputs_types():
    g = cpu_graph(io_data_type=og.DataType.DOUBLE)
    x = g.tensor([2, 3, 4], name="x")
    y = g.exp(x, name="e")  # a FLOAT intermediate, then bound: a DOUBLE output
    total, squares = g.genstats(y)
    reduced = g.reduction(y, "add", [1, 3, 1])
    for tensor in (total, squares, reduced):
        assert tensor.get_data_type() is og.DataType.FLOAT
    for tensor in (y, total, squares, reduced):
        tensor.set_output(True)
    g.validate()
    for tensor in (total, squares, reduced):
        assert tensor.get_data_type() is og.DataType.DOUBLE
    y.set_output(False)  # a FLOAT intermediate again
    g.validate()
    assert (total.get_data_type(), reduced.get_data_type()) == (og.DataType.FLOAT, og.DataType.DOUBLE)
    total.set_data_type(og.DataType.HALF)  # a type set by the caller is checked, not inferred
    with pytest.raises(
        od.BadParam,
        match=r"node 'genstats_1' \(genstats\): output sum 'genstats_1::sum' data type HALF must be FLOAT",
    ):
        g.validate()


def test_validate_refuses_dangling_nodes_and_inputs_and_a_graph_without_output():
    g = cpu_graph("dangling")
    x = g.tensor([2], name="x")
    g.exp(x, name="e")
    with pytest.raises(od.BadParam, match=r"node 'e' \(pointwise\): output 'e::y' is virtual and read by no node"):
        g.validate()
    g = cpu_graph("unused")
    g.exp(g.tensor([2], name="x"), name="e").set_output(True)
    g.tensor([2], name="spare")
    with pytest.raises(od.BadParam, match=r"tensor 'spare' is read by no node of graph 'unused'"):
        g.validate()
    g = cpu_graph("empty")
    g.tensor([2], name="x")
    with pytest.raises(od.BadParam, match=r"tensor 'x' is read by no node of graph 'empty'"):
        g.validate()
    g = cpu_graph("unbound")
    g.exp(g.tensor([2], name="x").set_output(False)).set_output(True)
    with pytest.raises(od.BadParam, match=r"tensor 'x' is virtual but no node of graph 'unbound' produces it"):
        g.validate()


def test_validate_refuses_an_output_whose_elements_overlap():
    g = cpu_graph()
    g.exp(g.tensor([2, 3], name="x"), name="e").set_output(True).set_stride([0, 1])
    with pytest.raises(
        od.BadParam,
        match=r"output 'e::y' has strides \[0, 1\] under which elements of dims \[2, 3\] "
        r"overlap: it cannot be written",
    ):
        g.validate()


def test_validate_refuses_two_tensors_of_one_name():
    g = cpu_graph("twins")
    x = g.tensor([2], name="x")
    g.exp(x).set_output(True).set_name("x")
    with pytest.raises(od.BadParam, match=r"graph 'twins': two tensors are named 'x'"):
        g.validate()


def test_a_cycle_in_serialized_data_is_named():
    g, *_ = scale_bias_relu()
    g.build_operation_graph()
    data = json.loads(g.serialize())
    relu = next(n for n in data["nodes"] if n["name"] == "relu")
    scale = next(n for n in data["nodes"] if n["op"] == "pointwise" and n["attributes"]["mode"] == "mul")
    scale["inputs"]["a"] = relu["outputs"]["y"]  # the scale now reads relu's output: a loop
    with pytest.raises(
        od.BadParam,
        match=r"the graph has a cycle through node 'mul_\d' \(pointwise\), node 'add_\d' "
        r"\(pointwise\), node 'relu' \(pointwise\)",
    ):
        og.Graph.deserialize(json.dumps(data), handle=od.Handle("cpu"))


def test_the_lifecycle_steps_come_in_order_and_a_change_restarts_it():
    g, x, *_ = scale_bias_relu()
    with pytest.raises(od.BadParam, match=r"create_execution_plans needs build_operation_graph first"):
        g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.BadParam, match=r"the graph has no built plan: call build_plans first"):
        g.get_workspace_size()
    build(g)
    x.set_name("input")
    with pytest.raises(od.BadParam, match=r"the graph has no built plan"):
        g.execute({}, None)


# ---- check_support ------------------------------------------------------------------------------------


def test_the_reference_engine_refuses_a_cuda_handle():
    g, *_ = scale_bias_relu(od.Handle("cuda:0", backend="triton"))
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.FALLBACK])
    with pytest.raises(
        od.NotSupported,
        match=r"graph 'sbr': no engine supports it: engine 'reference' runs on the "
        r"CPU \(the NumPy backend\), not on the handle's device cuda:0",
    ):
        g.check_support()


def test_triton_engines_on_the_cpu_refuse_without_the_interpreter(monkeypatch):
    g, *_ = scale_bias_relu()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    monkeypatch.delenv("TRITON_INTERPRET")
    reasons = g.check_support()
    message = "runs Triton kernels, which on the CPU need Triton's interpreter: set TRITON_INTERPRET=1"
    assert reasons == {
        "fused": f"engine 'fused' {message} before triton is first imported",
        "per_node": f"engine 'per_node' {message} before triton is first imported",
        "reference": None,
    }


def test_engines_refuse_when_their_backend_is_missing(monkeypatch):
    def missing(backend):
        raise od.NotSupported(f"backend={backend!r} needs torch and triton: No module named 'triton'")

    monkeypatch.setattr(engines, "require_backend_available", missing)
    g, *_ = scale_bias_relu()
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.B])
    assert g.check_support()["per_node"] == (
        "engine 'per_node': backend='triton' needs torch and triton: No module named 'triton'"
    )


def test_engines_refuse_more_workspace_than_the_handle_allows():
    g = og.Graph(handle=od.Handle("cpu", workspace_limit=0), name="limited")
    x, w = g.tensor([1, 2, 4, 4], name="x"), g.tensor([2, 2, 3, 3], name="w")
    y = g.conv_fprop(g.relu(g.scale(x, 2.0)), w, padding=[1, 1])
    y.set_output(True)
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    with pytest.raises(od.NotSupported) as refusal:
        g.check_support()
    text = str(refusal.value)
    for engine in ("fused", "per_node", "reference"):
        assert f"engine '{engine}' needs " in text
    assert "bytes of workspace, above the handle's workspace_limit=0" in text


def test_the_fused_engine_refuses_tensors_its_kernels_cannot_read():
    g = cpu_graph("fp8")
    q = g.tensor([4], data_type=og.DataType.FP8_E4M3, name="q")
    g.exp(q, name="e").set_output(True).set_data_type(og.DataType.FLOAT)
    g.build_operation_graph()
    g.create_execution_plans([og.HeurMode.A])
    reasons = g.check_support()
    assert reasons["fused"] == (
        "node 'e' (pointwise)'s fused kernel: tensor 'q' is FP8_E4M3, which the generated kernels do not read or write"
    )
    assert reasons["per_node"] is None


def test_tensors_one_descriptor_describes_may_have_any_layout():
    """A normalization's scale and bias of different strides each reach the call packed."""
    rng = np.random.default_rng(21)
    xa, sa = random(rng, (3, 8)), random(rng, (1, 8))
    ba = np.full((1, 16), np.nan, np.float32)
    ba[:, ::2] = random(rng, (1, 8))
    g = cpu_graph()
    x, s = g.tensor([3, 8], name="x"), g.tensor([1, 8], name="s")
    b = g.tensor([1, 8], stride=[16, 2], name="b")
    y, _, _ = g.layernorm(x, s, b, norm_forward_phase="inference", name="norm")
    y.set_output(True)
    (out,) = run(g, {x: xa, s: sa, b: ba[:, ::2]}, [y])
    expected = torch.nn.functional.layer_norm(t64(xa), (8,), t64(sa).flatten(), t64(ba[:, ::2]).flatten(), 1e-5)
    assert relative_error(out, expected.numpy()) < 1e-5


# ---- execute ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["reference", "fused"])
def test_the_variant_pack_takes_tensors_or_names_and_scalars_by_name(engine):
    rng = np.random.default_rng(20)
    g, x, b, s, y = scale_bias_relu()
    build(g, engine)
    xa, ba = random(rng, (2, 3, 4)), random(rng, (1, 3, 1))
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    for value, pack_x in ((0.5, {x: xa}), (-2.0, {"x": xa}), (np.float32(1.5), {x: xa})):  # any real number
        out = np.full((2, 3, 4), np.nan, np.float32)
        g.execute({**pack_x, "b": ba, "s": value, y: out}, workspace)
        assert relative_error(out, np.maximum(xa.astype(np.float64) * value + ba, 0)) < 1e-6


def test_execute_names_a_missing_or_unknown_tensor_and_a_bad_scalar():
    g, x, b, s, y = scale_bias_relu()
    build(g)
    xa, ba, out = np.ones((2, 3, 4), np.float32), np.ones((1, 3, 1), np.float32), np.ones((2, 3, 4), np.float32)
    with pytest.raises(od.BadParam, match=r"variant_pack has no entry for tensor 'b' \(by the Tensor or its name\)"):
        g.execute({x: xa, s: 1.0, y: out}, None)
    with pytest.raises(
        od.BadParam,
        match=r"variant_pack\['s'\]='two' must be a number: 's' is a scalar passed by "
        r"value",
    ):
        g.execute({x: xa, b: ba, s: "two", y: out}, None)
    with pytest.raises(od.BadParam, match=r"variant_pack holds 'z', which is no input or output of graph 'sbr'"):
        g.execute({x: xa, b: ba, s: 1.0, y: out, "z": out}, None)
    with pytest.raises(
        od.BadParam,
        match=r"^variant_pack\['x'\] has data type DOUBLE, but tensor 'x' of node 'mul_0' \(pointwise\) is FLOAT$",
    ):
        g.execute({x: xa.astype(np.float64), b: ba, s: 1.0, y: out}, None)


@pytest.mark.parametrize("engine", ["reference", "fused"])
def test_execute_names_the_pack_entry_its_tensor_and_node_for_a_bad_array(engine):
    g, x, b, s, y = scale_bias_relu()
    build(g, engine)
    xa, ba, out = np.ones((2, 3, 4), np.float32), np.ones((1, 3, 1), np.float32), np.ones((2, 3, 4), np.float32)
    tensor_x = r"tensor 'x' of node 'mul_0' \(pointwise\)"
    for pack, message in (
        (
            {y: out.astype(np.float16)},
            r"^variant_pack\['y'\] has data type HALF, but tensor 'y' of node 'relu' \(pointwise\) is FLOAT$",
        ),
        ({x: torch.ones(2, 3, 4, dtype=torch.int32)}, rf"^variant_pack\['x'\] has data type INT32, but {tensor_x} is"),
        ({x: np.ones(23, np.float32)}, rf"^variant_pack\['x'\] for {tensor_x}: x_desc reaches 24 elements but x holds"),
        ({x: xa.tolist()}, r"^variant_pack\['x'\] of type list is not a NumPy array"),
    ):
        with pytest.raises(od.BadParam, match=message):
            g.execute({x: xa, b: ba, s: 1.0, y: out} | pack, None)


@pytest.mark.parametrize("engine", ["reference", "per_node", "fused"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("given", ["build", "execute"])
def test_a_scalar_may_be_nan_or_infinite_given_at_build_or_at_execute(engine, value, given):
    """A scalar is an operand, as a one-element tensor's value: a convolution's scale (which a finite
    build-time value folds into the convolution's alpha) and a max's bound of NaN or an infinity give
    NumPy's values, whenever the scalar is given."""
    rng = np.random.default_rng(25)
    xa, wa = random(rng, (2, 3, 4, 4)), random(rng, (4, 3, 3, 3))
    g = cpu_graph()
    x, w = g.tensor_like(xa, name="x"), g.tensor_like(wa, name="w")
    scale, bound = (g.scalar(value if given == "build" else None, name=name) for name in ("scale", "bound"))
    scaled = g.mul(g.conv_fprop(x, w, padding=[1, 1]), scale).set_output(True)
    clamped = g.max(x, bound).set_output(True)
    at_execute = {"scale": value, "bound": value} if given == "execute" else {}
    out_scaled, out_clamped = run(g, {x: xa, w: wa, **at_execute}, [scaled, clamped], engine, poison=7.0)
    expected_scaled = torch.nn.functional.conv2d(t64(xa), t64(wa), padding=1).numpy() * value
    expected_clamped = np.maximum(xa.astype(np.float64), value)  # (NaN propagates)
    np.testing.assert_allclose(out_scaled, expected_scaled, rtol=1e-5)
    np.testing.assert_allclose(out_clamped, expected_clamped, rtol=1e-6)


def test_a_scalar_that_is_no_number_is_refused_naming_it():
    g = cpu_graph()
    with pytest.raises(od.BadParam, match=r"^scalar 's': value='2' must be a number$"):
        g.scalar("2", name="s")


def test_a_data_type_that_is_no_type_is_refused_naming_the_tensor_or_the_graphs_parameter():
    g = cpu_graph()
    with pytest.raises(od.BadParam, match=r"^tensor 'x': data_type='fp8' is not one of \['float32', "):
        g.tensor([2, 3], data_type="fp8", name="x")
    y = g.relu(g.tensor([2, 3], name="x"), name="r")
    with pytest.raises(od.BadParam, match=r"^tensor 'r::y': data_type='half16' is not one of \['float32', "):
        y.set_data_type("half16")
    with pytest.raises(od.BadParam, match=r"^tensor 'r::y': data_type=None is not one of \['float32', "):
        y.set_data_type(None)  # NumPy's dtype of None is float64
    with pytest.raises(od.BadParam, match=r"^io_data_type=None is not one of \['float32', "):
        og.Graph(io_data_type=None, handle=od.Handle("cpu"))
    with pytest.raises(od.BadParam, match=r"^intermediate_data_type='int4' is not one of \['float32', "):
        og.Graph(intermediate_data_type="int4", handle=od.Handle("cpu"))


@pytest.mark.parametrize("engine", ["reference", "fused"])
def test_execute_refuses_an_array_of_other_dims_or_strides_than_its_tensors(engine):
    rng = np.random.default_rng(24)
    g, x, b, s, y = scale_bias_relu()
    build(g, engine)
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    xa, ba = random(rng, (2, 3, 4)), random(rng, (1, 3, 1))
    transposed = np.ascontiguousarray(xa.transpose(0, 2, 1)).transpose(0, 2, 1)  # x's values, strides [12, 1, 3]
    with pytest.raises(
        od.BadParam,
        match=r"variant_pack\['x'\] has dims \[2, 3, 4\] and strides \[12, 1, 3\], but tensor 'x' of node "
        r"'mul_0' \(pointwise\) has dims \[2, 3, 4\] and strides \[12, 4, 1\]: give a view of those",
    ):
        g.execute({x: transposed, b: ba, s: 0.5, y: np.empty((2, 3, 4), np.float32)}, workspace)
    with pytest.raises(
        od.BadParam,
        match=r"variant_pack\['y'\] has dims \[4, 6\] and strides \[6, 1\], but tensor 'y' of node 'relu' "
        r"\(pointwise\) has dims \[2, 3, 4\]",
    ):
        g.execute({x: xa, b: ba, s: 0.5, y: np.empty((4, 6), np.float32)}, workspace)
    out = np.full((2, 3, 4), np.nan, np.float32)
    g.execute({x: transposed.copy(), b: ba, s: 0.5, y: out}, workspace)  # the same values in the tensor's layout
    expected = np.maximum(xa.astype(np.float64) * 0.5 + ba, 0)
    assert relative_error(out, expected) < 1e-6
    memory = np.full(30, np.nan, np.float32)  # one dim: memory the tensor's layout reads, as a pointer
    g.execute({x: xa.reshape(-1), b: ba, s: 0.5, y: memory}, workspace)
    assert relative_error(memory[:24].reshape(2, 3, 4), expected) < 1e-6
    assert np.isnan(memory[24:]).all()


def views_of_one_buffer(rng, case):
    """Two float32 arrays of one shape that are views of one buffer: overlapping slices, an array and
    its every other element, a matrix and its transpose."""
    if case == "slices":
        base = random(rng, 80)
        return base[:40].reshape(5, 8), base[16:56].reshape(5, 8)
    if case == "strided":
        base = random(rng, 80)
        return base[:40].reshape(5, 8), base[::2].reshape(5, 8)
    square = random(rng, (8, 8))
    return square[:5], square.T[:5]


@pytest.mark.parametrize("engine", ["reference", "per_node", "fused"])
@pytest.mark.parametrize("case", ["slices", "strided", "transposed"])
def test_inputs_that_are_views_of_one_numpy_buffer_give_the_references_results(engine, case):
    rng = np.random.default_rng(26)
    a, b = views_of_one_buffer(rng, case)
    g = cpu_graph()
    at, bt = g.tensor_like(a, name="a"), g.tensor_like(b, name="b")
    product = g.mul(at, bt)
    outputs = [g.add(product, at).set_output(True), g.reduction(product, "add", [5, 1]).set_output(True)]
    total, row_sums = run(g, {at: a, bt: b}, outputs, engine)
    expected = t64(a) * t64(b)
    assert relative_error(total, (expected + t64(a)).numpy()) < 1e-6
    assert relative_error(row_sums, expected.sum(1, keepdim=True).numpy()) < 1e-6


@pytest.mark.parametrize("engine", ["reference", "per_node", "fused"])
def test_a_convolution_epilogue_reads_image_filter_bias_and_residual_from_one_numpy_buffer(engine):
    rng = np.random.default_rng(27)
    memory = random(rng, 200)
    x, w = memory[:50].reshape(1, 2, 5, 5), memory[:54].reshape(3, 2, 3, 3)  # from the same first element
    b, z = memory[::7][:3].reshape(1, 3, 1, 1), memory[5:80].reshape(1, 3, 5, 5)
    g = cpu_graph()
    xt, wt, bt, zt = (g.tensor_like(array, name=name) for name, array in zip("xwbz", (x, w, b, z)))
    y = g.relu(g.add(g.bias(g.conv_fprop(xt, wt, padding=[1, 1]), bt), zt)).set_output(True)
    (out,) = run(g, {xt: x, wt: w, bt: b, zt: z}, [y], engine)
    expected = torch.relu(torch.nn.functional.conv2d(t64(x), t64(w), padding=1) + t64(b) + t64(z))
    assert relative_error(out, expected.numpy()) < 1e-6


@pytest.mark.parametrize("engine", ["reference", "per_node", "fused"])
def test_an_output_sharing_memory_with_an_input_or_another_output_is_refused_naming_both(engine):
    """Whatever the overlap, the very same elements too: the engines would read and write them in
    different orders (an output over an input read by a later node changes what that node reads on
    one engine and not on another)."""
    rng = np.random.default_rng(28)
    g = cpu_graph()
    x = g.tensor([8], name="x")
    y = g.exp(x, name="e").set_output(True).set_name("y")
    z = g.add(y, x, name="sum").set_output(True).set_name("z")
    build(g, engine)
    workspace = np.empty(g.get_workspace_size(), np.uint8)
    memory = random(rng, 24)
    an_output, an_input = r"\(an output\)", r"\(an input\)"
    for pack, message in (
        ({x: memory[:8], y: memory[4:12], z: memory[16:]}, rf"\['y'\] {an_output} and variant_pack\['x'\] {an_input}"),
        ({x: memory[:8], y: memory[:8], z: memory[16:]}, rf"\['y'\] {an_output} and variant_pack\['x'\] {an_input}"),
        (
            {x: memory[:8], y: memory[8:16], z: memory[12:20]},
            rf"\['y'\] {an_output} and variant_pack\['z'\] {an_output}",
        ),
        ({x: memory[:8], y: memory[16:], z: memory[4:12]}, rf"\['z'\] {an_output} and variant_pack\['x'\] {an_input}"),
    ):
        with pytest.raises(od.BadParam, match=rf"^variant_pack{message} share memory: a graph's output needs memory"):
            g.execute(pack, workspace)
    out = np.full(16, np.nan, np.float32)  # outputs side by side in one buffer share no element: they pass
    g.execute({x: memory[:8], y: out[:8], z: out[8:]}, workspace)
    x64 = memory[:8].astype(np.float64)
    assert relative_error(out[:8], np.exp(x64)) < 1e-6 and relative_error(out[8:], np.exp(x64) + x64) < 1e-6


@pytest.mark.parametrize("engine", ["reference", "fused"])
def test_a_repeated_execute_reuses_its_binding_and_a_new_array_is_checked_again(engine):
    rng = np.random.default_rng(21)
    g, x, b, s, y = scale_bias_relu()
    build(g, engine)
    xa, ba = torch.from_numpy(random(rng, (2, 3, 4))), torch.from_numpy(random(rng, (1, 3, 1)))
    out = torch.full((2, 3, 4), float("nan"))
    pack = {x: xa, b: ba, s: 0.5, y: out}
    workspace = torch.empty(4096, dtype=torch.uint8)  # enough for either engine's plan
    g.execute(pack, workspace)
    kept = g._kept[0]
    for _ in range(2):  # the same arrays with new contents: the binding is reused, the results are new
        xa.copy_(torch.from_numpy(random(rng, (2, 3, 4))))
        out.fill_(float("nan"))
        g.execute(pack, workspace)
        assert g._kept[0] is kept
        assert relative_error(out.numpy(), np.maximum(xa.double().numpy() * 0.5 + ba.double().numpy(), 0)) < 1e-6
    with pytest.raises(od.BadParam, match=r"variant_pack\['x'\] has data type DOUBLE, but tensor 'x' of node"):
        g.execute({**pack, x: xa.double()}, workspace)
    g.execute({**pack, s: -2.0}, workspace)  # a new scalar value binds again
    assert g._kept[0] is not kept
    assert relative_error(out.numpy(), np.maximum(xa.double().numpy() * -2.0 + ba.double().numpy(), 0)) < 1e-6
    g.execute(pack, workspace)
    build(g, "per_node" if engine == "fused" else "fused")  # another plan binds the same pack again
    out.fill_(float("nan"))
    g.execute(pack, workspace)
    assert relative_error(out.numpy(), np.maximum(xa.double().numpy() * 0.5 + ba.double().numpy(), 0)) < 1e-6


@pytest.mark.parametrize("engine", ["fused", "per_node"])
def test_a_repeated_execute_replays_its_calls_launches_and_a_new_binding_calls_again(engine, monkeypatch):
    rng = np.random.default_rng(23)
    g = og.Graph(handle=od.Handle("cpu"), name="conv_relu")
    x, w = g.tensor([2, 3, 5, 5], name="x"), g.tensor([4, 3, 3, 3], name="w")
    y = g.relu(g.conv_fprop(x, w, padding=[1, 1], name="conv"), name="relu")
    y.set_output(True).set_name("y")
    build(g, engine)
    xa, wa = torch.from_numpy(random(rng, (2, 3, 5, 5))), torch.from_numpy(random(rng, (4, 3, 3, 3)))
    out = torch.empty(2, 4, 5, 5)
    pack, workspace = {x: xa, w: wa, y: out}, torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8)

    def expected():
        return torch.relu(torch.nn.functional.conv2d(xa.double(), wa.double(), padding=1)).numpy()

    g.execute(pack, workspace)

    def refuse(*args, **kwargs):
        raise AssertionError("a replayed step called its cuDNN-shaped function")

    for name in ("convolution_forward", "convolution_bias_activation_forward", "pointwise"):
        monkeypatch.setattr(od, name, refuse)
    for _ in range(2):  # new contents in the same arrays: the recorded launches compute the new results
        xa.copy_(torch.from_numpy(random(rng, (2, 3, 5, 5))))
        out.fill_(float("nan"))
        g.execute(pack, workspace)
        assert relative_error(out.numpy(), expected()) < 1e-6
    with pytest.raises(AssertionError, match="a replayed step called its cuDNN-shaped function"):
        g.execute({**pack, y: torch.empty(2, 4, 5, 5)}, workspace)  # a new array binds and calls again


def test_drop_kept_binding_leaves_no_array_of_the_last_execute_alive():
    rng = np.random.default_rng(22)
    g, x, b, s, y = scale_bias_relu()
    build(g, "reference")
    out = torch.full((2, 3, 4), float("nan"))
    workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8)
    g.execute({x: torch.from_numpy(random(rng, (2, 3, 4))), b: torch.ones(1, 3, 1), s: 0.5, y: out}, workspace)
    held = weakref.ref(out)
    del out
    assert held() is not None  # the kept binding holds the pack's arrays
    g.drop_kept_binding()
    assert held() is None


def test_cuda_graph_capture_on_the_cpu_is_not_supported_and_names_the_reason():
    g, x, b, s, y = scale_bias_relu()
    with pytest.raises(od.BadParam, match=r"the graph has no built plan: call build_plans first"):
        g.populate_cuda_graph({}, None)
    build(g, "fused")
    pack = {x: torch.randn(2, 3, 4), b: torch.randn(1, 3, 1), s: 0.5, y: torch.empty(2, 3, 4)}
    workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8)
    reason = "graph 'sbr' runs on the handle's device cpu, and a CUDA graph captures launches on a CUDA device"
    with pytest.raises(od.NotSupported, match=f"populate_cuda_graph: {reason}"):
        g.populate_cuda_graph(pack, workspace)
    with pytest.raises(od.NotSupported, match=f"update_cuda_graph: {reason}"):
        g.update_cuda_graph(pack, workspace, cuda_graph=None)


def test_execute_checks_the_workspace_size():
    g = cpu_graph("ws")
    x, w = g.tensor([1, 2, 4, 4], name="x"), g.tensor([2, 2, 3, 3], name="w")
    y = g.conv_fprop(g.relu(x), w, padding=[1, 1])
    y.set_output(True)
    build(g)
    size = g.get_workspace_size()
    assert size == 256  # relu's output (32 floats, 128 bytes) in the workspace, aligned to 256 bytes
    arrays = {
        x: np.ones((1, 2, 4, 4), np.float32),
        w: np.ones((2, 2, 3, 3), np.float32),
        y: np.ones((1, 2, 4, 4), np.float32),
    }
    with pytest.raises(od.BadParam, match=r"workspace=None but Graph.get_workspace_size\(\) needs 256 bytes"):
        g.execute(arrays, None)
    with pytest.raises(od.BadParam, match=r"workspace holds 16 bytes but Graph.get_workspace_size\(\) needs 256"):
        g.execute(arrays, np.empty(16, np.uint8))


# ---- serialization ------------------------------------------------------------------------------------


def test_serialize_round_trips_the_graph_and_its_plan_choice_and_reuses_the_cached_plan():
    rng = np.random.default_rng(21)
    handle = od.Handle("cpu")
    g, x, b, s, y = scale_bias_relu(handle)
    build(g, "fused")
    data = g.serialize()
    assert json.loads(data)["plans"] == ["fused"]
    again = og.Graph.deserialize(data, handle=handle)
    assert again.plan is g.plan  # the plan cached on the handle under the graph's key
    assert again.serialize() == data
    fresh = og.Graph.deserialize(data, handle=od.Handle("cpu"))
    assert fresh.plan is not g.plan and fresh.plan.source() == g.plan.source()
    xa, ba = random(rng, (2, 3, 4)), random(rng, (1, 3, 1))
    outputs = []
    for graph in (g, fresh):
        out = np.full((2, 3, 4), np.nan, np.float32)
        graph.execute({"x": xa, "b": ba, "s": 1.5, "y": out}, None)
        outputs.append(out)
    assert np.array_equal(outputs[0], outputs[1])


def test_deserialize_refuses_other_data():
    with pytest.raises(
        od.BadParam,
        match=r"data is not a graph serialized by Graph.serialize \(opendnn.graph/1\): "
        r"format=None",
    ):
        og.Graph.deserialize(b"{}", handle=od.Handle("cpu"))
    g, *_ = scale_bias_relu()
    g.build_operation_graph()
    data = json.loads(g.serialize())
    data["nodes"][0]["op"] = "fft"
    with pytest.raises(od.BadParam, match=r"node 'mul_\d' has op='fft', not one of \['batchnorm',"):
        og.Graph.deserialize(json.dumps(data), handle=od.Handle("cpu"))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda nodes: nodes[0]["inputs"].update(z=0), r"node 'mul_0' \(pointwise\): input role 'z' is not one of"),
        (
            lambda nodes: nodes[2]["inputs"].update(b=0),
            r"node 'relu' \(pointwise\): mode relu_fwd takes inputs \['a'\]",
        ),
        (
            lambda nodes: nodes[0]["attributes"].update(mode="fma"),
            r"node 'mul_0' \(pointwise\): mode='fma' must be one",
        ),
        (
            lambda nodes: nodes[2]["attributes"].update(coef="6"),
            r"node 'relu' \(pointwise\): coef='6' must be a number",
        ),
        (
            lambda nodes: nodes[3]["attributes"].update(mode="median"),
            r"node 'red' \(reduction\): mode='median' must be",
        ),
        (lambda nodes: nodes[0].update(attributes=[]), r"data is not a graph serialized by Graph.serialize"),
    ],
)
def test_deserialize_names_a_node_of_unknown_roles_or_attributes(change, message):
    g, *_, y = scale_bias_relu()
    g.reduction(y, "add", [1, 3, 1], name="red").set_output(True)
    g.build_operation_graph()
    data = json.loads(g.serialize())
    change(data["nodes"])
    with pytest.raises(od.BadParam, match=message):
        og.Graph.deserialize(json.dumps(data), handle=od.Handle("cpu"))


def test_an_operation_with_a_scalar_passed_by_value_where_it_needs_a_tensor():
    g = cpu_graph()
    s = g.scalar(2.0, name="two")
    with pytest.raises(
        od.BadParam,
        match=r"node 'mm' \(matmul\): a 'two' is a scalar passed by value; only pointwise "
        "operations take those",
    ):
        g.matmul(s, g.tensor([1, 3]), name="mm").set_output(True)
        g.validate()


def test_reference_and_fused_engines_agree_on_a_graph_built_twice():
    rng = np.random.default_rng(22)
    results = []
    for engine in ("reference", "fused"):
        g, x, b, s, y = scale_bias_relu()
        xa, ba = random(rng, (2, 3, 4)), random(rng, (1, 3, 1))
        results.append((run(g, {x: xa, b: ba, s: 0.75}, [y], engine)[0], xa, ba))
    for out, xa, ba in results:
        assert relative_error(out, np.maximum(xa.astype(np.float64) * 0.75 + ba, 0)) < 1e-6
