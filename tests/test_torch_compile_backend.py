"""``torch.compile(model, backend="opendnn")`` on the CPU: a small CNN, an MLP and a transformer-ish
block against eager torch, forward and backward, in float32 and float64; which regions ran as
opendnn plans, on which engine; a graph with nothing to fuse left to torch; and which graphs run as
CUDA graphs (decided on fake CUDA tensors). On a GPU (``-m gpu``): the same models on the fusion
engine, and a ResNet-like block replayed from CUDA graphs with no Python of opendnn's."""

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as TF
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import opendnn.torch  # noqa: F401  (the "opendnn" backend itself is found through its entry point)
from opendnn.samples import relative_error
from opendnn.torch.compile_backend import LOWERINGS, OpendnnBackend, aten, cuda_graph_refusal

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: Dynamo's per-code cache would otherwise reach its recompile
    limit for nn.Sequential.forward and run it eagerly."""
    torch._dynamo.reset()


class ConvBlock(nn.Module):
    """(conv -> batch norm -> + residual -> relu) twice, then a 1x1 conv with bias (a bias right
    before a batch norm has a gradient of rounding noise, so the biased conv comes last)."""

    def __init__(self, channels=4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(channels), nn.BatchNorm2d(channels)
        self.head = nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)) + x)
        return self.head(torch.relu(self.bn2(self.conv2(y)) + y))


class TransformerBlock(nn.Module):
    """Pre-norm attention and a tanh-GELU MLP, each with its residual."""

    def __init__(self, width=16):
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ln2, self.fc1, self.fc2 = nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        x = x + self.proj(torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1) @ v)
        return x + self.fc2(TF.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


def training_step(model, x):
    """The output, the input's gradient and every parameter's gradient of sum(y^2), and the buffers after."""
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    return [y, x.grad, *grads, *model.buffers()]


def compare(make, shape, dtype, backend, options=None, device="cpu", tolerance=None):
    torch.manual_seed(0)
    model = make().to(dtype=dtype, device=device)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend, options=options)
    x = torch.randn(*shape, dtype=dtype, device=device)
    for _ in range(2):  # the second step runs the plans built by the first
        model.zero_grad()
        eager.zero_grad()
        ours, theirs = training_step(compiled, x), training_step(eager, x)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert not a.isnan().any()
            assert relative_error(a, b) < (tolerance or TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_cnn_of_conv_batch_norm_residual_relu_matches_eager_forward_and_backward(dtype):
    backend = OpendnnBackend()
    compare(ConvBlock, (2, 4, 6, 6), dtype, backend)
    # the forward graph and the backward graph: one region each, run once per step
    assert backend.graphs == 2 and len(backend.regions) == 2 and backend.fallbacks == []
    assert backend.plans_executed == 4
    assert {plan.engine for plan in backend.plans} == {"reference"}
    forward = backend.plans[0].describe()
    for op in ("conv_fprop", "batchnorm", "pointwise"):
        assert f"({op})" in forward


@pytest.mark.parametrize("norm", [nn.Identity, nn.BatchNorm2d], ids=["no_norm", "batch_norm"])
def test_under_bfloat16_autocast_each_result_keeps_torchs_dtype_and_the_regions_run_on_opendnn(norm):
    """A batch norm's saved statistics under autocast are bfloat16 in torch's CPU graph: the region
    casts the graph's float32 ones down, and its backward casts them up."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1, bias=False), norm(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
    )
    eager, backend = copy.deepcopy(model), OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4, 6, 6)
    for _ in range(2):
        model.zero_grad()
        eager.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            ours, theirs = training_step(compiled, x), training_step(eager, x)
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype and not a.isnan().any()
            assert relative_error(a.double(), b.double()) < 1e-2
    assert ours[0].dtype == torch.bfloat16
    assert backend.fallbacks == [] and backend.plans_executed == 4


def test_a_channels_last_model_keeps_its_activations_channels_last():
    """The regions' outputs and their graph tensors take torch's memory order (the FX values'
    strides): a channels-last convolution's output is channels-last inside the plan and out of it,
    not packed in its dims' order."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 1)
    ).eval()
    model = model.to(memory_format=torch.channels_last)
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ours, theirs = compiled(x), model(x)
    assert backend.fallbacks == [] and len(backend.plans) == 1
    assert ours.stride() == theirs.stride() == (288, 1, 48, 8)
    assert relative_error(ours, theirs) < TOLERANCE[torch.float32]
    activations = [t for t in backend.plans[0].graph.tensors if t.desc.dims == (2, 8, 6, 6)]
    assert len(activations) >= 3 and all(t.desc.strides == (288, 1, 48, 8) for t in activations)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_mlp_with_gelu_matches_eager_forward_and_backward(dtype):
    backend = OpendnnBackend()
    compare(mlp, (4, 16), dtype, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    forward = backend.plans[0].describe()
    assert "node 'gelu_" in forward and "(matmul)" in forward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_transformer_block_matches_eager_forward_and_backward(dtype):
    backend = OpendnnBackend()
    compare(TransformerBlock, (2, 5, 16), dtype, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    described = "\n".join(plan.describe() for plan in backend.plans)
    for op in ("layernorm", "layernorm_backward", "matmul", "softmax"):
        assert f"({op})" in described


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_a_layer_norm_of_any_epsilon_lowers_forward_and_backward(eps):
    """Its backward reads the statistics the forward saved: the ATen backward carries no epsilon."""
    backend = OpendnnBackend()
    compare(
        lambda: nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16, eps=eps), nn.Linear(16, 4)),
        (4, 16),
        torch.float64,
        backend,
    )
    assert backend.fallbacks == [] and "(layernorm_backward)" in "\n".join(plan.describe() for plan in backend.plans)


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_a_layer_norm_of_one_vector_lowers_forward_and_backward(options):
    """An input of one dim (an unbatched vector, its statistics of dims (1,)) is the graph's row of (1, N)."""
    backend = OpendnnBackend()
    model = lambda: nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Tanh())  # noqa: E731
    compare(model, (6,), torch.float64, backend, options)
    assert backend.fallbacks == [] and backend.plans_executed == 4  # the forward and backward, twice
    assert "(layernorm_backward)" in "\n".join(plan.describe() for plan in backend.plans)


class SoftmaxHeads(nn.Module):
    """A linear layer read through a log softmax along its features and a softmax along the batch."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 12)

    def forward(self, x):
        y = self.fc(x)
        return torch.log_softmax(y, dim=-1) * torch.softmax(y, dim=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_and_log_softmax_lower_forward_and_backward(dtype):
    backend = OpendnnBackend()
    compare(SoftmaxHeads, (6, 16), dtype, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    forward, *backward = (plan.describe() for plan in backend.plans)
    assert forward.count("(softmax)") == 2 and "(matmul)" in forward
    backward = "\n".join(backward)  # the gradients as sums and pointwise ops
    assert backward.count("(reduction)") >= 2 and "softmax" not in backward


def test_softmax_regions_run_on_the_fusion_engine():
    backend = OpendnnBackend()
    compare(SoftmaxHeads, (6, 16), torch.float32, backend, options={"heur_mode": "a"})
    assert {plan.engine for plan in backend.plans} == {"fused"} and backend.fallbacks == []
    assert "(softmax)" in backend.plans[0].describe()


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_relus_gradient_at_a_nan_input_is_torchs(options):
    """relu keeps NaN; torch's backward (threshold_backward of relu's output) passes the gradient there."""
    torch.manual_seed(3)
    dtype = torch.float32 if options else torch.float64
    model = nn.Sequential(nn.ReLU(), nn.Linear(6, 5)).to(dtype)
    x, dy = torch.randn(4, 6, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    x[1, 2] = float("nan")
    backend = OpendnnBackend()
    compiled = torch.compile(copy.deepcopy(model), backend=backend, options=options)
    results = []
    for m in (compiled, model):
        x_m = x.clone().requires_grad_()
        m(x_m).backward(dy)
        results.append([x_m.grad, *(p.grad for p in m.parameters())])
    assert backend.fallbacks == [] and backend.plans_executed == len(backend.regions) == 2
    assert "cmp_le" in backend.plans[-1].describe()
    assert not results[1][0].isnan().any()  # x's gradient: dy passes relu where x is NaN
    for ours, theirs in zip(*results, strict=True):
        assert torch.equal(ours.isnan(), theirs.isnan())
        torch.testing.assert_close(ours, theirs, equal_nan=True)


def test_a_batch_norm_without_an_affine_transform_stays_on_torch_in_training():
    def make():
        return nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, affine=False), nn.ReLU(), nn.Tanh())

    backend = OpendnnBackend()
    compare(make, (2, 3, 6, 6), torch.float64, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    forward = backend.plans[0].describe()
    assert "batchnorm" not in forward and "relu" in forward


def test_a_batch_norm_that_tracks_no_running_statistics_lowers_in_training():
    def make():
        return nn.Sequential(
            nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, track_running_stats=False), nn.ReLU(), nn.Conv2d(4, 4, 1)
        )

    backend = OpendnnBackend()
    compare(make, (2, 3, 6, 6), torch.float64, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    forward, backward = backend.plans[0].describe(), backend.plans[1].describe()
    assert "(batchnorm)" in forward and "(batchnorm_backward)" in backward


class FrozenBatchNorm(nn.Module):
    """A network trained with one batch norm in eval mode (its statistics frozen, as when fine-tuning),
    the statistics drawn away from 0 and 1; ``affine=False`` leaves it without weight and bias."""

    def __init__(self, affine=True):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(4, affine=affine).eval()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(4)
        self.bn1.running_mean.uniform_(-1.0, 1.0)
        self.bn1.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.tanh(self.bn2(self.conv2(y)) + y)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_batch_norm_in_eval_mode_inside_a_training_graph_lowers_forward_and_backward(affine, dtype):
    """The inference batch norm's saved statistics have no element (torch's), and its backward is
    pointwise in x: dx = dy weight / sqrt(var + eps), dweight = sum(dy xhat), dbias = sum(dy)."""
    backend = OpendnnBackend()
    compare(lambda: FrozenBatchNorm(affine), (2, 3, 7, 7), dtype, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) == 4
    forward, backward = backend.plans[0].describe(), backend.plans[1].describe()
    assert "batchnorm_inference" in forward and "(batchnorm)" in forward
    assert backward.count("(batchnorm_backward)") == 1 and "rsqrt" in backward
    assert ("(reduction)" in backward) == affine  # dweight and dbias


def test_a_batch_norm_in_eval_mode_inside_a_training_graph_runs_on_the_fusion_engine():
    """Its backward's regions (dx, and dweight after its reduction) plan without waiting on each other."""
    backend = OpendnnBackend()
    compare(FrozenBatchNorm, (2, 3, 7, 7), torch.float32, backend, options={"heur_mode": "a"})
    assert {plan.engine for plan in backend.plans} == {"fused"} and backend.fallbacks == []
    assert backend.plans_executed == 2 * len(backend.regions) == 4


def test_a_model_in_eval_mode_computes_gradients_through_its_batch_norms():
    backend = OpendnnBackend()
    compare(lambda: ConvBlock().eval(), (2, 4, 6, 6), torch.float64, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) == 4
    assert "batchnorm_backward" not in backend.plans[1].describe()


def test_the_fusion_engine_runs_the_regions_when_the_options_ask_for_it():
    backend = OpendnnBackend()
    compare(mlp, (4, 16), torch.float32, backend, options={"heur_mode": "a"})
    assert {plan.engine for plan in backend.plans} == {"fused"} and backend.fallbacks == []
    assert "in its fused epilogue" in backend.plans[0].describe()


def test_the_registered_backend_name_compiles_through_opendnn():
    torch.manual_seed(1)
    model = mlp().double()
    x = torch.randn(3, 16, dtype=torch.float64)
    backend = torch._dynamo.lookup_backend("opendnn")
    assert isinstance(backend, OpendnnBackend)
    before = backend.plans_executed
    with torch.no_grad():
        ours = torch.compile(model, backend="opendnn")(x)
    assert relative_error(ours, model(x)) < TOLERANCE[torch.float64]
    assert backend.plans_executed > before


def test_a_graph_with_nothing_to_fuse_runs_on_torch():
    def nothing_fusable(x):
        return torch.cumsum(x, 0).flip(0).sort(dim=1).values

    backend = OpendnnBackend()
    x = torch.randn(5, 7, dtype=torch.float64)
    ours = torch.compile(nothing_fusable, backend=backend)(x)
    assert torch.equal(ours, nothing_fusable(x))
    assert backend.graphs == 1 and backend.regions == [] and backend.plans_executed == 0


def test_a_region_opendnn_refuses_runs_its_graph_on_torch_and_says_why():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4, eps=math.inf), nn.ReLU()).double()
    eager, backend = copy.deepcopy(model), OpendnnBackend()
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    with torch.no_grad():  # a training batch norm whose epsilon is not finite, which cuDNN's refuses
        ours = torch.compile(model, backend=backend)(x)
        assert torch.equal(ours, eager(x))
    assert backend.plans_executed == 0 and len(backend.regions) == 1
    assert len(backend.fallbacks) == 1 and backend.fallbacks[0].startswith("graph0.fused_0: ")
    assert "epsilon=inf must be finite and at least 0.0" in backend.fallbacks[0]


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_a_sum_that_drops_its_dims_is_read_by_the_next_node_through_a_view_of_its_result(options):
    def row_sums_doubled(x):  # sum's (5,) result is (5, 1) in the graph: the mul reads a reshape of it
        return torch.relu(x).sum(1) * 2.0

    backend = OpendnnBackend()
    x = torch.randn(5, 7, dtype=torch.float64)
    ours = torch.compile(row_sums_doubled, backend=backend, options=options)(x)
    assert ours.shape == (5,) and relative_error(ours, row_sums_doubled(x)) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and backend.plans_executed == len(backend.regions) == 1
    assert "(reshape) as a view of its input's memory" in backend.plans[0].describe()


class Decoder(nn.Module):
    """Transposed convolutions of a U-Net's decoder: strided, padded with an output_padding, grouped."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(6, 4, 2, stride=2)
        self.grouped = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, bias=False)

    def forward(self, x):
        return self.grouped(torch.relu(self.up(x)))


@pytest.mark.parametrize(
    "dtype, options",
    [(torch.float64, None), (torch.float32, None), (torch.float32, {"heur_mode": "a"})],
    ids=["reference-float64", "reference-float32", "fused-float32"],
)
def test_transposed_convolutions_lower_as_the_backward_data_of_a_convolution(dtype, options):
    backend = OpendnnBackend()
    compare(Decoder, (2, 6, 3, 4), dtype, backend, options=options)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) == 4
    forward, backward = backend.plans[0].describe(), backend.plans[1].describe()
    assert forward.count("(conv_dgrad)") == 2 and "conv_fprop" not in forward
    assert "(conv_fprop)" in backward and backward.count("(conv_wgrad)") == 2


# torch's CPU hardsigmoid backward multiplies by float32's 1/6 in float64 too (3e-8 from 1/6)
TORCHS_ONE_SIXTH = {torch.float32: TOLERANCE[torch.float32], torch.float64: 1e-7}


class MobileBlock(nn.Module):
    """The activations of MobileNetV2 and V3 and EfficientNet: relu6, hardswish, hardsigmoid, silu."""

    def __init__(self):
        super().__init__()
        self.expand, self.project = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 4, 1)
        self.relu6, self.hardswish = nn.ReLU6(inplace=True), nn.Hardswish()
        self.hardsigmoid, self.silu = nn.Hardsigmoid(), nn.SiLU()

    def forward(self, x):
        y = self.hardswish(self.relu6(self.expand(x)) * 2.0 - 4.0)
        return self.silu(self.project(y * self.hardsigmoid(y)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mobile_activations_lower_forward_and_backward(dtype):
    backend = OpendnnBackend()
    compare(MobileBlock, (2, 4, 5, 5), dtype, backend, tolerance=TORCHS_ONE_SIXTH[dtype])
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) == 4


@pytest.mark.parametrize(
    "activation",
    [
        TF.relu6,
        TF.hardswish,
        TF.hardsigmoid,
        TF.silu,
        TF.hardtanh,
        torch.sigmoid,
        torch.tanh,
        TF.leaky_relu,
        lambda t: TF.leaky_relu(t, 0.2, inplace=True),
        lambda t: torch.clamp(t, -1.0, 3.0),
        lambda t: torch.clamp(t, min=0.5),
        lambda t: torch.clamp(t, max=-0.5),
        lambda t: torch.clamp(t, 3.0, 1.0),  # crossed bounds: the upper wins
    ],
    ids=[
        "relu6",
        "hardswish",
        "hardsigmoid",
        "silu",
        "hardtanh",
        "sigmoid",
        "tanh",
        "leaky_relu",
        "leaky_relu_in_place",
        "clamp",
        "clamp_min",
        "clamp_max",
        "clamp_crossed",
    ],
)
def test_activations_follow_torch_at_their_kinks_and_at_nan(activation):
    """The backward formulas' boundaries (x = -3, -1, 0, 1, 3, 6) as torch's kernels take them; NaN
    forward (torch's backward at a NaN x depends on where its vectorized loop puts the element)."""
    x = torch.tensor([-4.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0], dtype=torch.float64)
    x = x.repeat(2, 1).requires_grad_()
    gradient = torch.linspace(-2.0, 3.0, x.numel(), dtype=torch.float64).view_as(x)
    backend = OpendnnBackend()
    compiled = torch.compile(lambda t: activation(t * 1.0), backend=backend)
    ours = compiled(x)
    (ours_grad,) = torch.autograd.grad(ours, x, gradient)
    theirs = activation(x * 1.0)
    (theirs_grad,) = torch.autograd.grad(theirs, x, gradient)
    torch.testing.assert_close(ours, theirs, rtol=1e-15, atol=0.0)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=TORCHS_ONE_SIXTH[torch.float64], atol=0.0)
    assert backend.fallbacks == [] and backend.plans_executed == 2
    with torch.no_grad():
        assert compiled(torch.full((2, 10), math.nan, dtype=torch.float64)).isnan().all()


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_the_scalar_overloads_of_the_arithmetic_lower(op):
    """``aten.div.Scalar`` and its kin (what torch's decompositions emit: a mean's backward divides by
    the count) join the region of what they read."""
    call = getattr(torch.ops.aten, op).Scalar
    backend = OpendnnBackend()
    compiled = torch.compile(lambda t: call(torch.relu(t), 3.0), backend=backend)
    x = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(compiled(x), call(torch.relu(x), 3.0), rtol=1e-15, atol=0.0)
    assert backend.fallbacks == [] and backend.plans_executed == 1


def masked(t, u):
    """Comparisons (to numbers and tensors), logical operators and selects, a boolean result among the
    outputs."""
    a, b = t * 2.0, u + 1.0
    inside = torch.logical_and(a >= -1.0, torch.logical_not(a > 2.0))
    either = torch.logical_or(a == b, a != a)  # (a != a: NaN)
    picked = torch.where(inside, a, b) + torch.where(a < b, 0.5, a) * torch.where(b <= 1.0, a, -2.0)
    return picked, either


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_comparisons_logical_operators_and_selects_lower_with_their_booleans(options):
    backend = OpendnnBackend()
    compiled = torch.compile(masked, backend=backend, options=options)
    values = torch.tensor([-3.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, math.inf, -math.inf, math.nan], dtype=torch.float64)
    t = values.repeat(10, 1).T.contiguous().requires_grad_()
    u = values.repeat(10, 1).requires_grad_()  # every pair of the special values
    ours, theirs = compiled(t, u), masked(t, u)
    assert ours[1].dtype == torch.bool and torch.equal(ours[1], theirs[1])
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-15, atol=0.0, equal_nan=True)
    gradient = torch.randn_like(theirs[0])
    ours_grads = torch.autograd.grad(ours[0], (t, u), gradient)
    theirs_grads = torch.autograd.grad(theirs[0], (t, u), gradient)
    for a, b in zip(ours_grads, theirs_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-15, atol=0.0, equal_nan=True)
    assert backend.fallbacks == [] and backend.plans_executed == 2


class SqueezeExcite(nn.Module):
    """x * sigmoid(conv(relu(conv(mean of x over its pixels)))): the mean keeps its dims."""

    def __init__(self):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)

    def forward(self, x):
        scale = self.expand(torch.relu(self.reduce(x.mean((2, 3), keepdim=True))))
        return x * torch.sigmoid(scale)


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_a_mean_over_pixels_lowers_as_the_graphs_average(options):
    backend = OpendnnBackend()
    compare(SqueezeExcite, (2, 8, 5, 6), torch.float32, backend, options=options)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions)
    assert [name for name in backend.regions if name.startswith("graph0.")] == ["graph0.fused_0"]
    assert "reduction" in backend.plans[0].describe()  # the whole forward, its mean included


def test_scalar_tensors_lower_as_tensors_of_one_element():
    def losses(x, y):  # the sums run on torch, the arithmetic of their 0-dim results on opendnn
        return torch.tanh(x.sum() * 0.5 + y.square().sum()) - torch.exp(x.sum() / y.sum())

    backend = OpendnnBackend()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    ours = torch.compile(losses, backend=backend)(x, y)
    assert ours.shape == () and relative_error(ours, losses(x, y)) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and backend.plans_executed == len(backend.regions) == 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_new_shapes_build_new_plans_and_symbolic_shapes_stay_on_torch(dynamic):
    torch.manual_seed(2)
    model = mlp().double()
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for batch in (3, 5, 3):
            x = torch.randn(batch, 16, dtype=torch.float64)
            assert relative_error(compiled(x), model(x)) < TOLERANCE[torch.float64]
    if dynamic:  # symbolic dims: no graph of fixed dims to build, every node on torch
        assert backend.regions == [] and backend.plans_executed == 0
    else:  # a graph per batch size, each region's plan built once and run on every call of its graph
        assert backend.graphs == 2 and len(backend.plans) == len(backend.regions) > 0
        assert backend.plans_executed == 3 * len(backend.regions) // 2


def test_every_lowering_names_an_aten_operator():
    assert all(isinstance(op, torch._ops.OpOverload) for op in LOWERINGS)


# ---- CUDA graphs: which graphs the backend captures ---------------------------------------------------


def linear_relu(x, w, b):
    return (torch.relu(x @ w + b) * 2.0,)


def fake_inputs(device, dims=((4, 8), (8, 8), (8,))):
    """Fake tensors (no memory, no device needed) of ``dims`` on ``device``."""
    with FakeTensorMode():
        return [torch.empty(d, device=device) for d in dims]


def test_the_decision_takes_cuda_graphs_for_cuda_tensors_of_static_shapes_only():
    static = make_fx(linear_relu, tracing_mode="fake")(*fake_inputs("cuda"))
    placeholders = [node.meta["val"] for node in static.graph.nodes if node.op == "placeholder"]
    assert cuda_graph_refusal(static, placeholders, 0) is None  # on a GPU: captured
    on_cpu = make_fx(linear_relu, tracing_mode="fake")(*fake_inputs("cpu"))
    placeholders = [node.meta["val"] for node in on_cpu.graph.nodes if node.op == "placeholder"]
    assert cuda_graph_refusal(on_cpu, placeholders, 0) == "input 0 is on cpu, not a CUDA device"
    shapes = ShapeEnv()
    with FakeTensorMode(shape_env=shapes):
        rows = shapes.create_unbacked_symint()
        dynamic = [torch.empty(rows, 8, device="cuda"), *fake_inputs("cuda")[1:]]
    assert cuda_graph_refusal(static, dynamic, 0) == "input 0 has a dynamic shape [u0, 8]"
    assert cuda_graph_refusal(static, [rows, *dynamic[1:]], 0) == "input 0 is SymInt u0, not a tensor (a dynamic size)"

    def mutates(x, w, b):
        x.add_(1.0)
        return (x @ w + b,)

    mutating = make_fx(mutates, tracing_mode="fake")(*fake_inputs("cuda"))
    placeholders = [node.meta["val"] for node in mutating.graph.nodes if node.op == "placeholder"]
    assert "mutated inputs" in cuda_graph_refusal(mutating, placeholders, 0)  # torch's own check
    assert cuda_graph_refusal(mutating, placeholders, 1) is None  # a parameter's update: its address is fixed


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("options", [{"cudagraphs": True}, None, {"cudagraphs": False}])
def test_a_graph_of_static_cuda_tensors_goes_to_cudagraph_trees_where_the_option_asks(device, options):
    """Compiled (not run) on fake tensors: the CUDA graph's decision is made at compile time."""
    backend = OpendnnBackend()
    compiled = backend(torch.fx.symbolic_trace(linear_relu), fake_inputs(device), options=options)
    assert callable(compiled) and backend.regions == ["graph0.fused_0"]
    if options != {"cudagraphs": True}:
        assert backend.captured == [] and backend.uncaptured == []
    elif device == "cuda":
        assert backend.captured == ["graph0"] and backend.uncaptured == []
    else:
        assert backend.captured == [] and backend.uncaptured == ["graph0: input 0 is on cpu, not a CUDA device"]


@pytest.mark.gpu
@pytest.mark.parametrize("make, shape", [(ConvBlock, (8, 4, 16, 16)), (mlp, (32, 16)), (TransformerBlock, (4, 9, 16))])
def test_on_cuda_the_regions_run_on_the_fusion_engine_and_match_eager(make, shape, strict_float32):
    backend = OpendnnBackend()
    compare(make, shape, torch.float32, backend, device="cuda:0", tolerance=1e-4)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) > 0
    engines = {plan.engine for plan in backend.plans}
    assert "fused" in engines and engines <= {"fused", "per_node"}


@pytest.fixture
def python_launches():
    """How many Triton kernels were launched from Python so far (Triton's launch hook counts them; a
    CUDA graph's replay launches from the graph, not from Python)."""
    from triton import knobs

    count = [0]

    def counted(*args):
        count[0] += 1

    knobs.runtime.launch_enter_hook.add(counted)
    yield count
    knobs.runtime.launch_enter_hook.remove(counted)


@pytest.mark.gpu
@pytest.mark.parametrize("training", [True, False])
def test_on_cuda_a_resnet_block_replays_from_cuda_graphs_with_no_python(training, strict_float32, python_launches):
    """Two conv -> batch norm -> + residual -> relu stages and a 1x1 conv, channels last: the first
    step warms up (Triton compiles), the second records, the others replay: same results as eager
    torch on new inputs, and neither a region's Python nor a kernel launched from Python."""
    torch.manual_seed(0)
    model = ConvBlock(8).to("cuda:0", memory_format=torch.channels_last).train(training)
    eager = copy.deepcopy(model)
    backend = OpendnnBackend()
    compiled = torch.compile(model, backend=backend, options={"cudagraphs": True})
    counts = []
    for step in range(5):
        x = torch.randn(8, 8, 16, 16, device="cuda:0").contiguous(memory_format=torch.channels_last)
        torch.compiler.cudagraph_mark_step_begin()
        if training:
            model.zero_grad()
            eager.zero_grad()
            ours, theirs = training_step(compiled, x), training_step(eager, x)
        else:
            with torch.no_grad():
                ours, theirs = [compiled(x)], [eager(x)]
        for a, b in zip(ours, theirs, strict=True):
            assert relative_error(a, b) < 1e-4, f"step {step}"
        torch.cuda.synchronize()
        counts.append((backend.plans_executed, python_launches[0]))
    assert backend.captured == (["graph0", "graph1"] if training else ["graph0"]) and backend.uncaptured == []
    assert backend.fallbacks == [] and len(backend.regions) > 0
    assert 0 < counts[0][0] < counts[1][0] and 0 < counts[0][1] < counts[1][1]  # warm-up, then recording
    assert counts[1] == counts[2] == counts[3] == counts[4]  # replays: nothing from Python


# ---- pooling ------------------------------------------------------------------------------------------


def pooled(pool):
    """relu -> pool -> tanh: the pooling between two lowered nodes, so that it joins their region."""
    return lambda: nn.Sequential(nn.ReLU(), pool(), nn.Tanh())


def pooling_ops(backend):
    """The pooling nodes of every plan built, by operation."""
    described = " ".join(plan.describe() for plan in backend.plans)
    return {op for op in ("(pooling)", "(pooling_backward)") if op in described}


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
@pytest.mark.parametrize(
    "make, shape",
    [
        (pooled(lambda: nn.AvgPool2d(3, 2, 1)), (2, 3, 7, 8)),
        (pooled(lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False)), (2, 3, 7, 8)),
        (pooled(lambda: nn.AvgPool2d((2, 3), (1, 2))), (1, 2, 5, 7)),
        (pooled(lambda: nn.AvgPool2d(2, divisor_override=4)), (1, 2, 6, 6)),
        (pooled(lambda: nn.AvgPool2d(3, 2, ceil_mode=True)), (1, 2, 7, 9)),  # ceil adds no window
        (pooled(lambda: nn.AvgPool3d((2, 2, 3), 2, (1, 0, 1))), (1, 2, 4, 5, 6)),
        (pooled(lambda: nn.AdaptiveAvgPool2d((3, 2))), (2, 3, 6, 8)),
    ],
)
def test_average_pools_lower_forward_and_backward(make, shape, options):
    backend = OpendnnBackend()
    compare(make, shape, torch.float64, backend, options=options)
    assert backend.fallbacks == [] and len(backend.regions) == 2
    assert backend.plans_executed == 4
    assert pooling_ops(backend) == {"(pooling)", "(pooling_backward)"}


@pytest.mark.parametrize(
    "make, shape",
    [
        (pooled(lambda: nn.AvgPool2d(3, 2, ceil_mode=True)), (1, 2, 8, 8)),  # a last window past the input
        (pooled(lambda: nn.AvgPool2d(2, 2, 1, divisor_override=3)), (1, 2, 6, 6)),
        (pooled(lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False, divisor_override=9)), (1, 2, 6, 6)),
        (pooled(lambda: nn.AdaptiveAvgPool2d((4, 3))), (1, 2, 6, 6)),  # cells of two sizes
        (pooled(lambda: nn.MaxPool2d(2, dilation=2)), (1, 2, 6, 6)),
        (pooled(lambda: nn.MaxPool2d(3, 2, ceil_mode=True)), (1, 2, 8, 8)),
        (pooled(lambda: nn.MaxPool2d(3, 2, 1)), (2, 3, 7, 8)),  # training: the indices go to the backward
    ],
)
def test_pools_the_graph_does_not_compute_exactly_stay_on_torch(make, shape):
    backend = OpendnnBackend()
    compare(make, shape, torch.float64, backend)
    assert backend.fallbacks == [] and pooling_ops(backend) == set()


class Stem(nn.Module):
    """A ResNet stem: conv, batch norm, relu, max pool, then a 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 4, 3, 2, 1, bias=False), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.head(TF.max_pool2d(torch.relu(self.bn(self.conv(x))), 3, 2, 1))


@pytest.mark.parametrize("options", [None, {"heur_mode": "a"}], ids=["reference", "fused"])
def test_a_resnet_stem_in_eval_lowers_its_max_pool_into_one_region(options):
    torch.manual_seed(3)
    model = Stem().double().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    backend = OpendnnBackend()
    x = torch.randn(2, 3, 13, 12, dtype=torch.float64)
    x[0, 1, 4:6, 4:6] = math.nan  # windows holding NaN pool to NaN, as torch's
    with torch.no_grad():
        ours = torch.compile(model, backend=backend, options=options)(x)
        theirs = model(x)
    assert torch.equal(ours.isnan(), theirs.isnan()) and ours.isnan().any()
    assert relative_error(ours.nan_to_num(), theirs.nan_to_num()) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and backend.regions == ["graph0.fused_0"] and backend.plans_executed == 1
    described = backend.plans[0].describe()
    assert "(conv_fprop)" in described and "(pooling)" in described


def test_max_pool_in_training_keeps_torchs_gradient_for_windows_of_ties_and_nan():
    """The forward's indices and the backward stay on torch: a window of several NaN sends its gradient
    to the last, which the graph's pooling backward (the first) would not."""
    model = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Tanh()).double()
    x = torch.tensor([[[[1.0, 1.0, math.nan, 2.0], [0.5, 1.0, 3.0, math.nan]]]], dtype=torch.float64)
    backend = OpendnnBackend()
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.compile(model, backend=backend)(xa).sum().backward()
    model(xb).sum().backward()
    assert torch.equal(xa.grad.nan_to_num(), xb.grad.nan_to_num()) and xb.grad[0, 0, 1, 3] != 0
    assert pooling_ops(backend) == set()


class UNetLike(nn.Module):
    """An encoder level (conv, relu, average pool), a bottleneck and a decoder level (upsampling, a
    skip connection added, conv)."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.down, self.bottleneck = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.up = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        skip = torch.relu(self.down(x))
        deep = torch.relu(self.bottleneck(TF.avg_pool2d(skip, 2)))
        upsampled = TF.interpolate(deep, scale_factor=2, mode=self.mode)
        return self.up(upsampled + skip)


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_a_unet_like_model_trains_with_its_pools_lowered_and_its_upsampling_on_torch(mode):
    """aot_autograd hands over upsampling decomposed into index arithmetic (``_unsafe_index``), which
    stays on torch between the regions."""
    backend = OpendnnBackend()
    compare(lambda: UNetLike(mode), (2, 2, 8, 6), torch.float64, backend)
    assert backend.fallbacks == [] and pooling_ops(backend) == {"(pooling)", "(pooling_backward)"}


class DiffusionBlock(nn.Module):
    """A diffusion U-Net's residual block: (GroupNorm -> SiLU -> conv) twice, plus the input; the
    norms' parameters drawn away from 1 and 0 (``affine=False``: none)."""

    def __init__(self, channels=4, groups=2, affine=True):
        super().__init__()
        self.norm1, self.norm2 = (nn.GroupNorm(groups, channels, affine=affine) for _ in range(2))
        self.conv1, self.conv2 = (nn.Conv2d(channels, channels, 3, padding=1) for _ in range(2))
        for norm in (self.norm1, self.norm2) if affine else ():
            nn.init.uniform_(norm.weight, 0.5, 1.5)
            nn.init.uniform_(norm.bias, -0.5, 0.5)

    def forward(self, x):
        h = self.conv1(TF.silu(self.norm1(x)))
        return x + self.conv2(TF.silu(self.norm2(h)))


@pytest.mark.parametrize("affine", [True, False])
def test_a_diffusion_block_lowers_its_group_norms_forward_and_backward(affine):
    """torch's (N, G) statistics are the graph's (N, G, 1, 1), bound and read in place."""
    backend = OpendnnBackend()
    compare(lambda: DiffusionBlock(affine=affine), (2, 4, 5, 5), torch.float64, backend)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions) == 4
    forward, backward = backend.plans[0].describe(), backend.plans[1].describe()
    assert forward.count("(groupnorm)") == 2 and backward.count("(groupnorm_backward)") == 2


def test_a_diffusion_block_without_affine_parameters_runs_on_the_fusion_engine():
    backend = OpendnnBackend()
    compare(lambda: DiffusionBlock(affine=False), (1, 4, 3, 3), torch.float32, backend, options={"heur_mode": "a"})
    assert {plan.engine for plan in backend.plans} == {"fused"} and backend.fallbacks == []
    assert "(groupnorm_backward)" in backend.plans[1].describe()


def test_a_diffusion_block_in_eval_lowers_into_one_region():
    torch.manual_seed(0)
    model, backend = DiffusionBlock(channels=6, groups=3).double().eval(), OpendnnBackend()
    x = torch.randn(2, 6, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend)
        for _ in range(2):
            assert relative_error(compiled(x), model(x)) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and len(backend.regions) == 1 and backend.plans_executed == 2
    assert backend.plans[0].describe().count("(groupnorm)") == 2


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "bfloat16_model"])
def test_group_norms_of_bfloat16_keep_torchs_dtypes(autocast):
    """Under autocast, and in a bfloat16 model (whose group norms torch's CPU kernels save the
    statistics of in bfloat16: the region casts the graph's float32 ones down, the backward up).
    Each result is as close to the float64 model's as torch's own (bfloat16 rounds a parameter's
    gradient summed over the batch by a few percent)."""
    torch.manual_seed(0)
    model = DiffusionBlock() if autocast else DiffusionBlock().to(torch.bfloat16)
    eager, exact, backend = copy.deepcopy(model), copy.deepcopy(model).double(), OpendnnBackend()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(2, 4, 5, 5, dtype=torch.float32 if autocast else torch.bfloat16)
    reference = training_step(exact, x.double())
    for _ in range(2):
        model.zero_grad()
        eager.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ours, theirs = training_step(compiled, x), training_step(eager, x)
        for a, b, want in zip(ours, theirs, reference, strict=True):
            assert a.dtype == b.dtype and not a.isnan().any()
            assert relative_error(a.double(), want) < max(2 * relative_error(b.double(), want), 1e-2)
    assert backend.fallbacks == [] and backend.plans_executed == 2 * len(backend.regions)
    described = "\n".join(plan.describe() for plan in backend.plans)
    assert described.count("(groupnorm)") == described.count("(groupnorm_backward)") == 2


def test_a_group_norm_backward_lowers_only_what_the_graph_computes():
    """The graph's parameter gradients need the weight: a bias gradient without one stays on torch
    (traced on fake tensors: torch's own CPU kernel fails on that call)."""

    def backward_node(mask, weight):
        def backward(grad, x, mean, rstd, w):
            return aten.native_group_norm_backward(grad, x, mean, rstd, w if weight else None, 2, 4, 9, 2, mask)

        x, stats = torch.randn(2, 4, 3, 3), torch.randn(2, 2)
        traced = make_fx(backward, tracing_mode="fake")(x, x, stats, stats, torch.randn(4))
        return next(n for n in traced.graph.nodes if n.target is aten.native_group_norm_backward.default)

    lowering = LOWERINGS[aten.native_group_norm_backward.default]
    assert lowering.accepts(backward_node([True, True, True], weight=True))
    assert lowering.accepts(backward_node([True, False, False], weight=False))
    assert not lowering.accepts(backward_node([True, False, True], weight=False))


# ---- concatenation and slices -------------------------------------------------------------------------


class DenseBlock(nn.Module):
    """DenseNet's block: each layer (conv -> batch norm -> relu) adds its features to its input's
    channels (torch.cat), twice."""

    def __init__(self, channels=3, growth=2):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(channels + k * growth, growth, 3, padding=1, bias=False) for k in (0, 1))
        self.norms = nn.ModuleList(nn.BatchNorm2d(growth) for _ in (0, 1))

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            x = torch.cat([x, torch.relu(norm(conv(x)))], 1)
        return x


def described(backend):
    return [plan.describe() for plan in backend.plans]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_a_densenet_block_keeps_its_concatenations_inside_its_regions(training):
    """The forward's torch.cat and the backward's slices of its gradient lower: one region a graph. The
    slices the backward's nodes read are the graph's views; the two it returns, torch's views of the
    region's output."""
    backend = OpendnnBackend()
    compare(lambda: DenseBlock().train(training), (2, 3, 4, 4), torch.float64, backend)
    assert backend.fallbacks == [] and backend.graphs == 2 and len(backend.regions) == 2
    forward, backward = described(backend)
    assert forward.count("(concatenate) as its own call") == 2
    assert backward.count("(slice) as a view of its input's memory") == 2


def test_a_densenet_block_runs_on_the_fusion_engine():
    backend = OpendnnBackend()
    compare(DenseBlock, (2, 3, 4, 4), torch.float32, backend, options={"heur_mode": "a"})
    assert {plan.engine for plan in backend.plans} == {"fused"} and backend.fallbacks == []
    assert "(concatenate) as its own call" in described(backend)[0]


def test_cat_skips_empty_tensors_and_takes_a_negative_dim_as_torch_does():
    def joined(x, y, empty, none_wide):
        return torch.relu(torch.cat([empty, x, none_wide, y], -2)) * 2.0

    backend = OpendnnBackend()
    args = (torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64))
    args += (torch.empty(0, dtype=torch.float64), torch.empty(0, 3, dtype=torch.float64))
    ours = torch.compile(joined, backend=backend)(*args)
    assert torch.equal(ours, joined(*args))
    assert backend.fallbacks == [] and backend.plans_executed == 1
    assert "(concatenate)" in described(backend)[0]


@pytest.mark.parametrize(
    ("inputs", "lowers"),
    [
        ([torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64)], False),  # torch promotes x to float64
        ([torch.randn(0, 3), torch.randn(0, 2)], False),  # a result of no element is no graph tensor
        ([torch.randn(2, 3), torch.randn(2, 2)], True),
    ],
    ids=["promoted", "no_element", "lowered"],
)
def test_a_cat_of_mixed_types_or_of_no_element_stays_on_torch(inputs, lowers):
    traced = make_fx(lambda x, y: torch.cat([x, y], 1), tracing_mode="fake")(*inputs)
    (cat,) = [node for node in traced.graph.nodes if node.target is torch.ops.aten.cat.default]
    assert LOWERINGS[torch.ops.aten.cat.default].accepts(cat) is lowers


def test_slices_read_outside_their_region_or_returned_are_torchs_views_of_its_output():
    def sliced(x):
        z = torch.relu(x) * 2.0
        return torch.cumsum(z[:, 1:4:2], 0), z[1:3]

    backend = OpendnnBackend()
    x = torch.randn(4, 5, dtype=torch.float64)
    summed, rows = torch.compile(sliced, backend=backend)(x)
    expected = sliced(x)
    assert torch.equal(summed, expected[0]) and torch.equal(rows, expected[1]) and rows._is_view()
    assert backend.fallbacks == [] and backend.plans_executed == 1
    (forward,) = described(backend)
    assert "(slice)" not in forward and "identity" not in forward


def packed_attention_scores(x, w):
    """A timm attention's head: one matmul for q, k and v, reshaped and permuted into heads, unbound."""
    qkv = (x @ w).reshape(2, 3, 3, 2, 2).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    return (q * k).sum(-1) + v.mean(-1)


VIEWING = {  # (function, its inputs' shapes): views of inputs and of computed tensors, in one region
    "linear over three dims": (lambda x, w: (torch.relu(x) @ w.t()).view(2, 3, 5) + 1.0, [(6, 4), (5, 4)]),
    "packed qkv unbound": (packed_attention_scores, [(2, 3, 4), (4, 12)]),
    "selects": (lambda x, w: torch.tanh(x)[:, 1] * torch.tanh(x).select(0, -1) + w, [(3, 3), (3,)]),
    "expand": (lambda x, w: torch.exp(x).unsqueeze(1).expand(-1, 4, -1) * w, [(2, 3), (2, 4, 3)]),
    "split of an input": (
        lambda x, w: torch.relu(x.split([2, 3], 1)[0]).sum(1) * x.split([2, 3], 1)[1].mean(1) + w,
        [(4, 5), (4,)],
    ),
    "a view returned and read": (lambda x, w: ((x * w).view(-1), (x * w).view(-1).sum() + 1.0), [(2, 3), (2, 3)]),
}


@pytest.mark.parametrize("case", list(VIEWING))
def test_views_of_inputs_and_of_computed_tensors_lower_inside_one_region(case):
    function, shapes = VIEWING[case]
    torch.manual_seed(0)
    inputs = [torch.randn(shape, dtype=torch.float64, requires_grad=True) for shape in shapes]
    backend = OpendnnBackend()
    ours = torch.compile(function, backend=backend)(*inputs)
    ours = ours if isinstance(ours, tuple) else (ours,)
    grads = torch.autograd.grad([o.sum() for o in ours], inputs)
    theirs = function(*inputs)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    expected_grads = torch.autograd.grad([t.sum() for t in theirs], inputs)
    for a, b in zip((*ours, *grads), (*theirs, *expected_grads), strict=True):
        assert a.shape == b.shape and relative_error(a, b) < TOLERANCE[torch.float64]
    assert backend.fallbacks == [] and backend.graphs == 2
    assert len([name for name in backend.regions if name.startswith("graph0.")]) == 1  # the forward: one region


def test_autocasts_conversions_lower_as_the_graphs_and_round_as_torch():
    def rounded(x):  # float32 -> bfloat16 -> float32, torch's round to nearest even both ways
        return (x.to(torch.bfloat16) * 2).to(torch.float32) + 1

    backend = OpendnnBackend()
    x = torch.randn(64, 33) * 1e3
    assert torch.equal(torch.compile(rounded, backend=backend)(x), rounded(x))
    assert backend.fallbacks == [] and len(backend.regions) == 1


@pytest.mark.parametrize(
    "convert, lowers",
    [
        (lambda x: x.to(torch.float16), True),
        (lambda x: x.to(torch.float16, memory_format=torch.channels_last), False),  # a copy in another layout
        (lambda x: x.to(torch.int32), False),  # the graph converts floating types
    ],
    ids=["type", "layout", "integer"],
)
def test_a_conversion_lowers_when_it_changes_the_floating_type_alone(convert, lowers):
    traced = make_fx(convert, tracing_mode="fake")(torch.randn(2, 3, 4, 5))
    (copy_node,) = [node for node in traced.graph.nodes if node.target is torch.ops.aten._to_copy.default]
    assert LOWERINGS[torch.ops.aten._to_copy.default].accepts(copy_node) is lowers


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("make", [lambda: nn.LayerNorm(6), lambda: nn.GroupNorm(2, 4), lambda: nn.BatchNorm2d(4)])
def test_norms_of_a_bfloat16_module_lower_with_torchs_bfloat16_statistics_and_parameters(make, grad):
    """A module cast to bfloat16: torch's CPU norms save their statistics in bfloat16, and batch norm
    keeps bfloat16 running statistics and parameter gradients. The graph's norms read and write
    float32: casts up and down, each added only where the region reads or returns it (inference reads
    no statistics)."""
    torch.manual_seed(0)
    norm = make().bfloat16()  # in training mode: batch norm normalizes with the batch's statistics
    wide = copy.deepcopy(norm).double()
    x = torch.randn(2, 4, 3, 6, dtype=torch.bfloat16, requires_grad=grad)
    backend = OpendnnBackend()
    with torch.set_grad_enabled(grad):
        ours = torch.compile(lambda x: torch.relu(norm(x)) * 2.0, backend=backend)(x)
    x64 = x.detach().double().requires_grad_(grad)
    expected = torch.relu(wide(x64)) * 2.0
    assert ours.dtype == torch.bfloat16 and relative_error(ours, expected) < 1e-2
    if grad:
        dy = torch.randn_like(ours)
        ours.backward(dy)
        expected.backward(dy.double())
        assert relative_error(x.grad, x64.grad) < 2e-2
        assert relative_error(norm.weight.grad, wide.weight.grad) < 2e-2 and norm.weight.grad.dtype == torch.bfloat16
    assert backend.fallbacks == []


def test_a_slice_of_a_channels_last_batch_of_one_lowers_forward_and_backward():
    """torch's strides along a dim of 1 are its own (a batch of one channels-last: N's stride is C*H*W,
    not C): a view's strides match its input's times the steps only where a dim holds more than one."""

    def rotated(x):
        return torch.cat([x[..., 1:], x[..., :1]], dim=-1) * 2.0

    backend = OpendnnBackend()
    x = torch.randn(1, 3, 1, 2, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, expected = torch.compile(rotated, backend=backend)(ours), rotated(theirs)
    grad = torch.randn_like(expected)
    assert torch.equal(out, expected)
    assert torch.equal(torch.autograd.grad(out, ours, grad)[0], torch.autograd.grad(expected, theirs, grad)[0])
    assert backend.fallbacks == []
