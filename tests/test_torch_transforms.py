"""Converted and fused models under torch's transforms, on the CPU: torch.compile (the "eager" and
"aot_eager" backends: inductor's first compile of a model takes over a minute here), torch.export,
torch.func.grad and vmap, torch.jit.trace; torch.jit.script refuses with a clear message. Each
against the same model run eagerly."""

import copy

import pytest
import torch
from test_fuse import Net, trained_looking
from test_torch import SmallCNN, TransformerBlock
from torch._dynamo.backends.common import aot_autograd
from torch.func import functional_call, grad, vmap

import opendnn.torch as ot
from opendnn.core.errors import NotSupported


def converted(model: torch.nn.Module) -> torch.nn.Module:
    ot.convert(model)
    return model


# name: (the opendnn model given its mode, its input's shape); the fused models are inference-only
# in eval mode (their inputs need no gradient) and fused batch norms in training mode
MODELS = {
    "converted_cnn": (lambda training: converted(SmallCNN().train(training)), (4, 3, 12, 12)),
    "converted_transformer": (lambda training: converted(TransformerBlock().train(training)), (2, 5, 16)),
    "fused_net": (lambda training: ot.fuse(trained_looking(Net(), torch.float32).train(training)), (2, 3, 12, 12)),
}
CASES = [(name, training) for name in MODELS for training in (True, False)]
IDS = [f"{name}-{'train' if training else 'eval'}" for name, training in CASES]


def model_and_input(name: str, training: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    make, shape = MODELS[name]
    return make(training), torch.randn(shape)


def run(model: torch.nn.Module, x: torch.Tensor, training: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(output, gradients of x and of the parameters) of a training step, (output, []) in eval."""
    if not training:
        with torch.no_grad():
            return model(x), []
    x = x.clone().requires_grad_()
    y = model(x)
    y.backward(torch.ones_like(y))
    return y, [x.grad, *(p.grad for p in model.parameters())]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def opendnn_operators(graph: torch.fx.Graph) -> set[str]:
    return {
        node.target.name()
        for node in graph.nodes
        if node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target.namespace == "opendnn"
    }


@pytest.mark.parametrize("name, training", CASES, ids=IDS)
def test_compile_traces_opendnn_operators_into_one_graph_and_matches_eager(name, training):
    model, x = model_and_input(name, training)
    compiled_model = copy.deepcopy(model)
    graphs: dict[str, list[torch.fx.GraphModule]] = {"forward": [], "backward": []}

    def keep(kind):
        def compiler(graph_module, example_inputs):
            graphs[kind].append(graph_module)
            return graph_module

        return compiler

    torch._dynamo.reset()
    compiled = torch.compile(
        compiled_model, backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    )
    y, gradients = run(compiled, x, training)
    y_eager, gradients_eager = run(model, x, training)
    assert_close(y, y_eager)
    for ours, theirs in zip(gradients, gradients_eager, strict=True):
        assert_close(ours, theirs)
    assert len(graphs["forward"]) == 1  # no graph break
    forward = opendnn_operators(graphs["forward"][0].graph)
    assert forward and (training or name != "fused_net" or "opendnn::convolution_bias_activation" in forward)
    if training:  # the gradients come from opendnn's backward operators
        backward = opendnn_operators(graphs["backward"][0].graph)
        assert any(op.endswith("_backward") for op in backward), backward
    for (key, ours), (_, theirs) in zip(compiled_model.state_dict().items(), model.state_dict().items()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=key)  # the running statistics too


@pytest.mark.parametrize("name, training", CASES, ids=IDS)
def test_compile_fullgraph_matches_eager(name, training):
    model, x = model_and_input(name, training)
    compiled_model = copy.deepcopy(model)
    torch._dynamo.reset()
    y, gradients = run(torch.compile(compiled_model, backend="eager", fullgraph=True), x, training)
    y_eager, gradients_eager = run(model, x, training)
    assert_close(y, y_eager)
    for ours, theirs in zip(gradients, gradients_eager, strict=True):
        assert_close(ours, theirs)
    for (key, ours), (_, theirs) in zip(compiled_model.state_dict().items(), model.state_dict().items()):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.parametrize("name, training", CASES, ids=IDS)
def test_export_gives_a_program_of_opendnn_operators_that_runs(name, training):
    model, x = model_and_input(name, training)
    program = torch.export.export(copy.deepcopy(model), (x,))
    assert opendnn_operators(program.graph)
    with torch.no_grad():
        assert_close(program.module()(x), model(x))


def test_an_exported_cumulative_batch_norm_updates_its_statistics_as_torchs():
    """A batch norm of ``momentum=None`` (the running statistics a cumulative average) in training
    mode: the exported program's outputs and buffers after two steps are torch's module's."""
    torch.manual_seed(0)
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, momentum=None)).double()
    program = torch.export.export(converted(copy.deepcopy(theirs)), (torch.zeros(2, 3, 5, 5, dtype=torch.float64),))
    assert "opendnn::batch_norm_training" in opendnn_operators(program.graph)
    exported = program.module()
    for _ in range(2):
        x = torch.randn(2, 3, 5, 5, dtype=torch.float64)
        torch.testing.assert_close(exported(x), theirs(x), rtol=1e-10, atol=1e-12)
    for key, buffer in theirs.named_buffers():
        torch.testing.assert_close(exported.get_buffer(key), buffer, rtol=1e-10, atol=1e-12, msg=key)


@pytest.mark.parametrize("name", ["converted_cnn", "converted_transformer"])
def test_func_grad_and_vmap_of_grad_match_torchs_model(name):
    """Gradients of the parameters, and per-sample gradients of the input (vmap of grad), in eval
    mode (in training mode torch's own batch norm refuses torch.func.grad: it updates a buffer)."""
    model, x = model_and_input(name, training=False)
    torch.manual_seed(0)
    reference = {"converted_cnn": SmallCNN, "converted_transformer": TransformerBlock}[name]().eval()
    results = []
    for network in (model, reference):
        parameters = {key: value.detach() for key, value in network.named_parameters()}
        buffers = dict(network.named_buffers())
        by_parameter = grad(
            lambda p, network=network, buffers=buffers: functional_call(network, (p, buffers), (x,)).sum()
        )(parameters)
        per_sample = vmap(grad(lambda sample, network=network: network(sample.unsqueeze(0)).sum()))(x)
        results.append((by_parameter, per_sample))
    (ours, ours_per_sample), (theirs, theirs_per_sample) = results
    for key in theirs:
        assert_close(ours[key], theirs[key])
    assert_close(ours_per_sample, theirs_per_sample)


@pytest.mark.parametrize("name", ["converted_cnn", "converted_transformer"])
def test_vmap_matches_torchs_model(name):
    model, x = model_and_input(name, training=False)
    torch.manual_seed(0)
    reference = {"converted_cnn": SmallCNN, "converted_transformer": TransformerBlock}[name]().eval()
    batches = torch.stack([x, 2 * x, -x])
    assert_close(vmap(model)(batches), vmap(reference)(batches))


@pytest.mark.parametrize("check_trace", [True, False])
@pytest.mark.parametrize("name, training", CASES, ids=IDS)
def test_jit_trace_gives_eager_results(name, training, check_trace):
    model, x = model_and_input(name, training)
    traced_model = copy.deepcopy(model)
    with torch.no_grad():
        traced = torch.jit.trace(traced_model, x, check_trace=check_trace)
        assert_close(traced(x), model(x))
    assert "opendnn::" in str(traced.inlined_graph)


def test_jit_script_refuses_with_a_clear_message():
    model = converted(SmallCNN())
    with pytest.raises(NotSupported, match="torch.jit.script cannot compile Conv2d.forward") as refusal:
        torch.jit.script(model)
    assert isinstance(refusal.value, RuntimeError)
