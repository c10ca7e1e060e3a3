"""Executables (opendnn/torch/executables.py): a plain eager opendnn.torch call on a Triton handle
(here Triton's interpreter) is recorded once per signature and then replayed as its allocations and
launches. A replay must give what the full path gives, on new data, with outputs that start as NaN;
a changed signature, a handle's changed option, host work the replay cannot repeat and an input at
another alignment must each leave the call to the full path."""

from __future__ import annotations

import copy
import gc
import types
import weakref

import pytest
import test_direct_launch as direct_launch  # (its stand-ins for a compiled kernel and Triton's driver)
import torch
import torch.nn.functional as TF
from test_torch_activations import torch_elementwise
from triton.runtime import driver

import opendnn as od
import opendnn.torch as ot
from opendnn.core import dispatch
from opendnn.core.default_handle import shared_handle
from opendnn.kernels import launch as launch_module
from opendnn.kernels.launch import Launch, Slot
from opendnn.torch import executables, normalization, operators
from opendnn.torch.executables import Executable, Fallback, record
from opendnn.torch.operators import dense

CL = torch.channels_last


@pytest.fixture
def handle(monkeypatch):
    """The shared CPU handle on the Triton backend (its interpreter), with no executable kept yet."""
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    shared = shared_handle("cpu")
    shared.executables.clear()
    yield shared
    shared.executables.clear()


@pytest.fixture
def full_calls(monkeypatch):
    """How many problems ran through ``dispatch`` (the full path): a replay runs none."""
    calls = []
    run = dispatch._run

    def counted(*args):
        calls.append(args[1])
        return run(*args)

    monkeypatch.setattr(dispatch, "_run", counted)
    return calls


@pytest.fixture(autouse=True)
def poisoned_replays(monkeypatch):
    """Every output and scratch buffer a replay allocates starts as NaN (integers: -1, all bits set)."""

    def poisoned(allocate):
        def allocation(*args, **kwargs):
            tensor = allocate(*args, **kwargs)
            return tensor.fill_(float("nan") if tensor.is_floating_point() else -1)

        return allocation

    monkeypatch.setattr(executables, "empty_strided", poisoned(torch.empty_strided))
    monkeypatch.setattr(executables, "empty_like", poisoned(torch.empty_like))


def relative_error(ours, reference):
    return ((ours.double() - reference).norm() / reference.norm()).item()


# name: (inputs' shapes (a 4-d first one channels-last), how many of them take a gradient, the call on
# float32 tensors, the reference on their float64 copies)
CALLS = {
    "convolution": (
        [(2, 4, 5, 6), (6, 4, 3, 3), (6,)],
        3,
        lambda x, w, b: operators.convolution(x, w, b, (1, 1), (1, 1), (1, 1), 1),
        lambda x, w, b: TF.conv2d(x, w, b, padding=1),
    ),
    "batch_norm_inference": (  # (and its gradient: eval-mode training)
        [(2, 4, 5, 6), (4,), (4,), (4,), (4,)],
        3,
        lambda x, w, b, m, v: ot.functions.batch_norm(x, m, v.abs() + 0.5, w, b, False, 0.1, 1e-5),
        lambda x, w, b, m, v: TF.batch_norm(x, m, v.abs() + 0.5, w, b, False, 0.1, 1e-5),
    ),
    "batch_norm_training": (
        [(2, 4, 5, 6), (4,), (4,)],
        3,
        lambda x, w, b: ot.functions.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
        lambda x, w, b: TF.batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
    ),
    "relu": ([(2, 4, 5, 6)], 1, ot.functions.relu, TF.relu),
    "max_pool": ([(2, 4, 5, 6)], 1, lambda x: ot.functions.max_pool(x, 3, 2, 1), lambda x: TF.max_pool2d(x, 3, 2, 1)),
    "avg_pool": ([(2, 4, 5, 6)], 1, lambda x: ot.functions.avg_pool(x, 2), lambda x: TF.avg_pool2d(x, 2)),
    "linear": ([(3, 5), (7, 5), (7,)], 3, ot.functions.linear, TF.linear),
    "add": ([(2, 4, 5, 6), (2, 4, 5, 6)], 0, operators.add, torch.add),  # (fuse's residual: no gradient)
    "softmax": ([(3, 7)], 1, lambda x: ot.functions.softmax(x, 1), lambda x: torch.softmax(x, 1)),
}


def _inputs(shapes, seed):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(*shape, generator=generator, dtype=torch.float64) for shape in shapes]
    if tensors[0].ndim == 4:
        tensors[0] = tensors[0].contiguous(memory_format=CL)
    return tensors


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_repeated_call_replays_its_executable_forward_and_backward(call, handle, full_calls):
    shapes, differentiable, ours, reference = CALLS[call]
    counts = []
    for seed in (0, 1, 2):  # the first call records; the others, on other data, replay
        inputs = _inputs(shapes, seed)
        mine = [t.float().requires_grad_(k < differentiable) for k, t in enumerate(inputs)]
        theirs = [t.clone().requires_grad_(k < differentiable) for k, t in enumerate(inputs)]
        y, y_reference = ours(*mine), reference(*theirs)
        assert relative_error(y, y_reference) < 1e-5
        if differentiable:
            dy = torch.randn(y_reference.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 7))
            y.backward(dy.float())
            y_reference.backward(dy)
            for t, t_reference in zip(mine[:differentiable], theirs):
                assert relative_error(t.grad, t_reference.grad) < 1e-5
        counts.append(len(full_calls))
    assert counts[0] > 0 and counts[2] == counts[1] == counts[0]  # forward and backward each replayed
    kept = list(handle.executables.values())
    assert kept and all(isinstance(e, Executable) for e in kept), kept


def test_a_backward_keys_on_its_forwards_executable_and_the_gradients_signature(handle, full_calls):
    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL).requires_grad_()
    gradients = [torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6), torch.randn(2, 4, 5, 6).contiguous(memory_format=CL)]
    counts, sources = [], []
    for dy in gradients:
        x.grad = None
        y = ot.functions.relu(x)
        sources.append(y.grad_fn.source)
        y.backward(dy)
        assert torch.equal(x.grad, torch.where(x > 0, dy, 0.0))  # torch's relu gradient, exactly
        counts.append(len(full_calls))
    # the forward replays one executable; the backward records once per gradient layout, then replays
    assert isinstance(sources[0], Executable) and sources[1] is sources[0] is sources[2]
    assert counts[0] == 2 and counts[1] == 2 and counts[2] == 3, counts
    followers = [key for key in handle.executables if key[1] is sources[0]]
    assert sorted(key[4] for key in followers) == sorted([(120, 30, 6, 1), (120, 1, 24, 4)])


def test_a_backward_runs_on_the_handle_of_its_forward(handle, monkeypatch, full_calls):
    """The backend variable changed between a forward and its backward leaves the backward on the
    forward's handle (replayed); that handle's backend changed drops its executables, and the
    backward takes the full path on the new backend."""
    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL).requires_grad_()
    dy = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL)
    for _ in range(2):  # forward and backward recorded, then replayed
        x.grad = None
        ot.functions.relu(x).backward(dy)
    assert len(full_calls) == 2
    y = ot.functions.relu(x)
    monkeypatch.setenv("OPENDNN_BACKEND", "numpy")
    x.grad = None
    y.backward(dy)
    assert len(full_calls) == 2 and len(handle.executables) == 2
    assert torch.equal(x.grad, torch.where(x > 0, dy, 0.0))
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    y = ot.functions.relu(x)
    handle.backend = "numpy"
    try:
        x.grad = None
        y.backward(dy)
        assert len(full_calls) == 3 and not handle.executables
    finally:
        handle.backend = "triton"
    assert torch.equal(x.grad, torch.where(x > 0, dy, 0.0))


def test_an_eager_node_runs_its_backward_directly_and_gives_torchs_gradients(handle):
    """The engine calls a node's ``apply``: an eager node's is its Function's backward itself,
    called as torch's would call it (the node, then the output's gradient)."""
    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL).requires_grad_()
    w = torch.randn(6, 4, 3, 3, requires_grad=True)
    dy = torch.randn(2, 6, 5, 6).contiguous(memory_format=CL)
    y = operators.convolution(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    node = y.grad_fn
    assert type(node).apply is operators.convolution.eager.backward
    dx, dw, *rest = node.apply(dy)
    expected = torch.autograd.grad(TF.conv2d(x.double(), w.double(), padding=1), (x, w), dy.double())
    assert relative_error(dx, expected[0]) < 1e-5 and relative_error(dw, expected[1]) < 1e-5
    assert rest == [None] * 5


class _Marked(torch.Tensor):
    """A tensor subclass: opendnn's plain path must leave calls with one to the registered operator."""


@pytest.mark.parametrize("position", [0, 2])  # a convolution's x (a Tensor) and bias (a Tensor?)
def test_a_tensor_subclass_among_the_tensors_sends_the_call_to_the_registered_operator(position, handle, monkeypatch):
    registered = []
    operator = operators.convolution
    overload = operator.overload
    monkeypatch.setattr(operator, "overload", lambda *args: registered.append(args) or overload(*args))
    x, w, bias = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL), torch.randn(6, 4, 3, 3), torch.randn(6)
    args = [x, w, bias, [1, 1], [1, 1], [1, 1], 1]
    with torch.no_grad():
        plain = operator(*args)
        assert not registered
        args[position] = args[position].as_subclass(_Marked)
        marked = operator(*args)
    assert len(registered) == 1 and registered[0][position].__class__ is _Marked
    expected = TF.conv2d(x.double(), w.double(), bias.double(), padding=1)
    assert relative_error(plain, expected) < 1e-5 and relative_error(marked.as_subclass(torch.Tensor), expected) < 1e-5


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda x: ot.functions.relu(x), TF.relu),
        (lambda x: ot.functions.max_pool(x, 3, 2, 1), lambda x: TF.max_pool2d(x, 3, 2, 1)),
        (lambda x: ot.functions.avg_pool(x, 3, 2, 1), lambda x: TF.avg_pool2d(x, 3, 2, 1)),
    ],
    ids=["relu", "max_pool", "avg_pool"],
)
def test_a_stride_0_gradient_reaches_the_backward_kernel_as_it_comes(ours, theirs, handle, monkeypatch, full_calls):
    """``sum().backward()`` hands in a stride-0 expansion: the activations' and pooling's backward
    kernels read it without a copy, and x's gradient keeps x's channels-last order."""
    monkeypatch.setattr(operators, "dense", lambda *args: pytest.fail("a copy of the gradient"))
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=CL).requires_grad_()
    expected = torch.autograd.grad(theirs(x.double()).sum(), x)[0]
    counts = []
    for _ in range(3):
        x.grad = None
        ours(x).sum().backward()
        counts.append(len(full_calls))
        assert relative_error(x.grad, expected) < 1e-6 and x.grad.stride() == x.stride()
    assert counts[0] > 0 and counts[2] == counts[1] == counts[0]  # recorded, then replayed
    assert any(0 in key[4] for key in handle.executables if isinstance(key[1], Executable))  # keyed as given


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda x: ot.functions.log_softmax(x, 1), lambda x: TF.log_softmax(x, 1)),
        (lambda x: ot.functions.local_response_norm(x, 3), lambda x: TF.local_response_norm(x, 3)),
    ],
    ids=["log_softmax", "local_response_norm"],
)
def test_a_stride_0_gradient_is_made_dense_where_the_backward_kernel_needs_it(ours, theirs, handle, monkeypatch):
    """Softmax's dx follows dy and local response norm's vector kernel reads dy's channels as
    contiguous: their backward gets the gradient dense in x's channels-last order."""
    copies = []
    monkeypatch.setattr(operators, "dense", lambda *args: copies.append(args) or dense(*args))
    x = torch.randn(2, 6, 5, 5).contiguous(memory_format=CL).requires_grad_()
    expected = torch.autograd.grad(theirs(x.double()).sum(), x)[0]
    ours(x).sum().backward()
    assert len(copies) == 1 and 0 in copies[0][0].stride()
    assert relative_error(x.grad, expected) < 1e-6 and x.grad.stride() == x.stride()


def test_a_replay_in_inference_builds_no_problem_and_allocates_what_the_call_gave(handle, full_calls):
    x = torch.randn(2, 4, 5, 6).contiguous(memory_format=CL)
    with torch.no_grad():
        first = ot.functions.relu(x)
        assert len(full_calls) == 1 and len(handle.executables) == 1
        second = ot.functions.relu(-x)
    assert len(full_calls) == 1
    assert torch.equal(first, TF.relu(x)) and torch.equal(second, TF.relu(-x))
    assert second.stride() == x.stride() and second.dtype == x.dtype and not second.requires_grad
    (executable,) = handle.executables.values()
    assert "empty_like(s0)" in executable.source and executable.launches == 1  # y allocated like x


def test_a_changed_stride_dtype_or_scalar_misses_and_the_signature_keeps_the_device():
    x = torch.randn(2, 4, 5, 6)
    key = operators.activation.key(operators.activation.eager_kernel, x, "relu", [])
    changed = {
        "strides": (x.contiguous(memory_format=CL), "relu", []),
        "dtype": (x.double(), "relu", []),
        "shape": (x[:1], "relu", []),
        "device": (x.to("meta"), "relu", []),
        "scalar": (x, "hardtanh", [0.0, 6.0]),
        "list item": (x, "hardtanh", [0.0, 5.0]),
    }
    keys = {
        change: operators.activation.key(operators.activation.eager_kernel, *args) for change, args in changed.items()
    }
    assert len({key, *keys.values()}) == len(changed) + 1
    assert operators.activation.key(operators.activation.eager_kernel, x, "relu", []) == key
    assert operators.activation.key(operators.activation.eager_kernel, x, "relu", ()) == key  # a list keys as its tuple
    assert operators.activation.key(operators.activation.eager_kernel, x, "softplus", [float("nan")]) is None


def test_a_tuple_argument_is_checked_once_and_a_bad_one_never_keys():
    """A list argument's tuple whose items passed is kept and not tested again; a tuple of other
    items (a NaN, a tensor) still leaves the call unkeyed, before and after."""
    x, key = torch.randn(2, 4, 5, 6), operators.activation.key
    kernel = operators.activation.eager_kernel
    window = (1.5, 3.0)
    checked = key(kernel, x, "softplus", window)
    assert checked is not None and checked[-1] is window
    assert key(kernel, x, "softplus", window) == checked == key(kernel, x, "softplus", [1.5, 3.0])
    nan, tensor = (1.5, float("nan")), (1.5, torch.tensor(3.0))
    for _ in range(2):
        assert key(kernel, x, "softplus", nan) is None
        assert key(kernel, x, "softplus", tensor) is None


def test_a_changed_signature_records_its_own_executable(handle, full_calls):
    x = torch.randn(2, 4, 5, 6)
    calls = [
        (x, 0.0, 6.0),
        (x.contiguous(memory_format=CL), 0.0, 6.0),
        (x.double(), 0.0, 6.0),
        (x, 0.0, 3.0),
        (x, 0.0, 6.0),  # the first signature again: replayed
    ]
    with torch.no_grad():
        for count, (tensor, low, high) in enumerate(calls, start=1):
            out = ot.functions.hardtanh(tensor, low, high)
            assert out.dtype == tensor.dtype and out.stride() == tensor.stride()
            assert torch.equal(out, TF.hardtanh(tensor, low, high))
            assert len(handle.executables) == min(count, 4)
    assert len(full_calls) == 4


def test_constants_made_on_the_host_are_kept_by_the_replay(handle, full_calls):
    x = torch.randn(3, 8)
    with torch.no_grad():
        for k in range(3):  # hardtanh below zero compares x with two 0-d tensors torch fills on the host
            expected = TF.hardtanh(x.double() * (k + 1), -2.0, 3.0)
            assert relative_error(ot.functions.hardtanh(x * (k + 1), -2.0, 3.0), expected) < 1e-6
    (kept,) = handle.executables.values()
    assert isinstance(kept, Executable) and kept.source.count("= kept") == 2
    assert len(full_calls) == 2  # maximum, minimum: the first call alone


def test_parameters_filled_on_the_host_are_kept_by_the_replay(handle, full_calls):
    """A batch norm without weight and bias fills a new one and a new zero on the host: constants a
    replay keeps, as torch.full's."""
    mean, var = torch.randn(4), torch.rand(4) + 0.5
    with torch.no_grad():
        for k in range(3):
            x = torch.randn(2, 4, 5, 6) * (k + 1)
            expected = TF.batch_norm(x.double(), mean.double(), var.double(), None, None, False, 0.1, 1e-5)
            assert relative_error(ot.functions.batch_norm(x, mean, var, None, None, False, 0.1, 1e-5), expected) < 1e-6
    (kept,) = handle.executables.values()
    assert isinstance(kept, Executable) and kept.source.count("= kept") == 2
    assert len(full_calls) == 1


@pytest.mark.parametrize(
    ("name", "parameters", "launches"),
    [("relu", [], 1), ("hardtanh", [0.0, 6.0], 1), ("elu", [0.5], 1), ("hardtanh", [-2.0, 3.0], 4)],
    ids=["relu", "relu6", "elu", "hardtanh_below_zero"],
)
def test_torchs_activation_gradients_take_one_launch_from_zero(name, parameters, launches, handle, full_calls):
    """relu's, relu6's (hardtanh from 0) and elu's gradients are one pointwise launch of torch's rule;
    a hardtanh from below 0 composes its tests (two comparisons, an or, a select)."""
    x = torch.randn(3, 8, dtype=torch.float64)
    x[0, :4] = torch.tensor([float("nan"), 0.0, -0.0, float("inf")])
    dy = torch.randn(3, 8, dtype=torch.float64)
    for _ in range(2):  # recorded, then replayed
        dx = operators.activation_backward(dy, x, name, parameters)
    torch_forward = {"relu": TF.relu, "hardtanh": TF.hardtanh, "elu": TF.elu}[name]
    _, reference = torch_elementwise(lambda t: torch_forward(t, *parameters), x, dy)  # (torch's scalar formula)
    torch.testing.assert_close(dx, reference, rtol=1e-12, atol=0.0, equal_nan=True)
    key = operators.activation_backward.key(operators.activation_backward.eager_kernel, dy, x, name, parameters)
    assert handle.executables[key].launches == launches and len(full_calls) == launches


def test_host_work_a_replay_cannot_repeat_keeps_a_fallback_with_the_reason(handle, full_calls):
    x = torch.randn(0, 8)
    with torch.no_grad():
        for _ in range(2):  # an empty batch: the fake outputs, zero-filled on the host
            assert ot.functions.relu(x).shape == (0, 8)
    (kept,) = handle.executables.values()
    assert isinstance(kept, Fallback) and "aten.zero_" in kept.reason
    assert not full_calls


def test_inputs_sharing_memory_are_not_recorded_and_a_replay_reads_each_input(handle, full_calls):
    x, y = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        assert torch.equal(operators.add(x, x), x + x)  # which input a launch reads is unknown: nothing kept
        assert not handle.executables
        assert torch.equal(operators.add(x, y), x + y)
        assert torch.equal(operators.add(y, x), y + x)  # replayed, each operand from its own argument
        assert torch.equal(operators.add(y, y), y + y)
    assert len(full_calls) == 2 and len(handle.executables) == 1


def test_inputs_in_one_storage_that_hold_each_tensor_apart_are_recorded_and_replayed(handle, full_calls):
    base = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(operators.add(base[:3], base[3:]), base[:3] + base[3:])  # one storage, apart: kept
        assert len(handle.executables) == 1
        x, y = torch.randn(3, 8), torch.randn(3, 8)
        assert torch.equal(operators.add(x, y), x + y)  # replayed, each operand from its own argument
        assert torch.equal(operators.add(base[3:], base[:3]), base[3:] + base[:3])
    assert len(full_calls) == 1


def test_packed_attention_inputs_are_replayed_forward_and_backward(handle, full_calls):
    """q, k and v as interleaved views of one (B, S, 3, H, D) projection (GPT-2's): each launch's
    tensor lies within one of them alone, so the calls are kept and replayed."""
    results = []
    for seed in (1, 2):
        generator = torch.Generator().manual_seed(seed)
        qkv = torch.randn(2, 48, 3, 2, 16, generator=generator, dtype=torch.float64).requires_grad_()
        dy = torch.randn(2, 2, 48, 16, generator=generator, dtype=torch.float64)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        y = ot.attention.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(dy)
        reference = qkv.detach().clone().requires_grad_()
        rq, rk, rv = reference.permute(2, 0, 3, 1, 4).unbind(0)
        expected = TF.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
        expected.backward(dy)
        results.append((relative_error(y, expected), relative_error(qkv.grad, reference.grad)))
    assert all(error < 1e-12 for pair in results for error in pair), results
    kept = list(handle.executables.values())
    assert len(kept) == 2 and all(isinstance(e, Executable) for e in kept)
    assert len(full_calls) == 2  # the first forward and backward; the second pair replayed


def test_attention_with_dropout_keeps_no_executable(handle, full_calls):
    """Each call draws its own seed: its signature never repeats, so none is recorded."""
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        first, second = (ot.attention.scaled_dot_product_attention(q, k, v, dropout_p=0.5) for _ in range(2))
    assert not handle.executables and len(full_calls) == 2
    assert not torch.equal(first, second)  # two masks


def test_an_input_at_another_alignment_takes_the_full_path(handle, full_calls):
    base = torch.randn(1 + 2 * 4 * 5 * 6)
    x, shifted = base[:-1].view(2, 4, 5, 6), base[1:].view(2, 4, 5, 6)  # 4 bytes apart
    with torch.no_grad():
        ot.functions.relu(x)
        ot.functions.relu(x)
        assert len(full_calls) == 1
        assert torch.equal(ot.functions.relu(shifted), TF.relu(shifted))
    assert len(full_calls) == 2 and len(handle.executables) == 1


def test_a_changed_option_or_a_destroyed_handle_drops_the_executables(handle, full_calls):
    x = torch.randn(3, 8)
    with torch.no_grad():
        ot.functions.relu(x)
        assert len(handle.executables) == 1
        handle.fast_math = handle.fast_math  # the same value changes nothing
        assert len(handle.executables) == 1 and handle.plans
        for option, value in (("fast_math", not handle.fast_math), ("deterministic", not handle.deterministic)):
            before = getattr(handle, option)
            setattr(handle, option, value)
            try:
                assert not handle.executables and not handle.plans
                assert torch.equal(ot.functions.relu(x), TF.relu(x))  # recorded again
                assert len(handle.executables) == 1
            finally:
                setattr(handle, option, before)
        ot.functions.relu(x)
        handle.backend = "numpy"
        try:
            assert not handle.executables
            assert torch.equal(ot.functions.relu(x), TF.relu(x))  # NumPy's backend: the full path, nothing kept
            assert not handle.executables
        finally:
            handle.backend = "triton"
    assert len(full_calls) == 5
    mine = od.create("cpu", backend="triton")
    record(mine, ("relu",), lambda t: od.functional.relu(t, handle=mine), (x,))
    record(mine, ("relu on another handle",), od.functional.relu, (x,))
    assert isinstance(mine.executables[("relu",)], Executable)
    assert "runs on" in mine.executables[("relu on another handle",)].reason
    mine.destroy()
    assert not mine.executables


def test_the_products_keep_their_executables_on_the_handle_their_kernels_run_on(handle, monkeypatch, full_calls):
    """A float32 product on a GPU runs on the TF32 handle where torch allows TF32: here every
    product's kernel is given another handle, which its executable must live on."""
    other = od.create("cpu", backend="triton")
    monkeypatch.setattr(operators, "_product_handle", lambda x, kind: other)
    x, w = torch.randn(2, 4, 5, 6, requires_grad=True), torch.randn(6, 4, 3, 3, requires_grad=True)
    m, n = torch.randn(3, 5, requires_grad=True), torch.randn(7, 5, requires_grad=True)
    for _ in range(2):
        operators.convolution(x, w, None, (1, 1), (1, 1), (1, 1), 1).sum().backward()
        ot.functions.linear(m, n).sum().backward()
    kept = other.executables.values()
    assert len(kept) == 6 and all(isinstance(e, Executable) for e in kept)  # conv, its two backwards, 3 products
    assert not handle.executables and len(full_calls) == 6


@pytest.mark.parametrize("route", ["functional_calls", "enabled"])
def test_routed_functional_calls_replay_the_executables_of_their_signature(route, handle, full_calls):
    """torch's F.conv2d and F.relu, routed by functional_calls() or enable(): forward and backward
    recorded by the first step, replayed by the next ones, with torch's results."""
    w = torch.randn(6, 4, 3, 3, dtype=torch.float64)
    counts = []
    for seed in range(3):
        x = torch.randn(2, 4, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        with ot.functional_calls() if route == "functional_calls" else ot.enabled():
            y = TF.relu(TF.conv2d(mine, w, None, 1, 1))
        y.sum().backward()
        reference = TF.relu(TF.conv2d(theirs, w, None, 1, 1))
        reference.sum().backward()
        assert relative_error(y, reference) < 1e-12 and relative_error(mine.grad, theirs.grad) < 1e-12
        counts.append(len(full_calls))
    assert counts[0] == 4 and counts[2] == counts[1] == counts[0]  # conv, relu, their backwards (of x)


class _InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: 1x1 conv -> BN -> ReLU6 -> 3x3 depthwise conv -> BN -> ReLU6 -> 1x1 conv
    -> BN, + x."""

    def __init__(self, channels: int = 4, hidden: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Conv2d(channels, hidden, 1, bias=False),
            torch.nn.BatchNorm2d(hidden),
            torch.nn.ReLU6(inplace=True),
            torch.nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            torch.nn.BatchNorm2d(hidden),
            torch.nn.ReLU6(inplace=True),
            torch.nn.Conv2d(hidden, channels, 1, bias=False),
            torch.nn.BatchNorm2d(channels),
        )

    def forward(self, x):
        return x + self.layers(x)


@pytest.fixture
def waits(monkeypatch):
    """The calls that wait for the device on a GPU, by name, as they are made."""
    calls = []

    def counted(name, method):
        def call(*args, **kwargs):
            calls.append(name)
            return method(*args, **kwargs)

        return call

    for name in ("item", "cpu", "numpy", "tolist", "nonzero", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counted("synchronize", torch.cuda.synchronize))
    return calls


@pytest.mark.parametrize("fused", [False, True], ids=["converted", "fused"])
def test_training_steps_of_a_mobilenet_block_replay_every_call_after_the_first(fused, handle, full_calls, waits):
    """A converted MobileNetV2 block (depthwise convolution, ReLU6's gradient, batch norm's running
    statistics and batch counter) and the same through opendnn.torch.fuse (batch norm + ReLU6 and
    batch norm + residual as one call each way): after the first training step every opendnn call
    replays its executable, with torch's results, and no step makes a call that waits for the device."""
    torch.manual_seed(0)
    reference = _InvertedResidual().to(memory_format=CL)
    model, float32 = copy.deepcopy(reference), copy.deepcopy(reference)  # (torch's float32: the gradients' bound)
    ot.convert(model)
    model = ot.fuse(model.train()) if fused else model
    reference.double()
    counts, waited = [], []
    for seed in range(3):
        x = torch.randn(2, 4, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        dy = torch.randn(2, 4, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 7))
        mine, theirs = x.float().contiguous(memory_format=CL).requires_grad_(), x.clone().requires_grad_()
        before = len(waits)
        y = model(mine)
        y.backward(dy.float())
        waited.append(waits[before:])
        y_reference = reference(theirs)
        y_reference.backward(dy)
        float32(x.float().contiguous(memory_format=CL)).backward(dy.float())
        assert relative_error(y, y_reference) < 1e-5 and relative_error(mine.grad, theirs.grad) < 1e-5
        counts.append(len(full_calls))
    for ours, torchs, theirs in zip(model.parameters(), float32.parameters(), reference.parameters()):
        # (a first batch norm's weight gradient sums terms that cancel: torch's float32 is 5e-3 off)
        assert relative_error(ours.grad, theirs.grad) < max(1e-5, 2 * relative_error(torchs.grad, theirs.grad))
    for ours, theirs in zip(model.buffers(), reference.buffers()):  # running statistics, batch counters
        assert torch.equal(ours, theirs) if not ours.is_floating_point() else relative_error(ours, theirs) < 1e-5
    assert counts[0] > 0 and counts[2] == counts[1] == counts[0], counts  # the first step alone ran the full path
    assert waited == [[], [], []]
    kept = list(handle.executables.values())
    assert kept and all(isinstance(e, Executable) for e in kept), [e for e in kept if not isinstance(e, Executable)]


def test_the_executables_are_bounded(handle, monkeypatch):
    monkeypatch.setattr(executables, "LIMIT", 2)
    with torch.no_grad():
        for n in (3, 4, 5):
            ot.functions.relu(torch.randn(n))
    assert len(handle.executables) == 1


def test_the_executables_keep_no_callers_tensor_alive(handle):
    x, w = torch.randn(2, 4, 5, 6), torch.randn(6, 4, 3, 3)
    with torch.no_grad():
        y = operators.convolution(x, w, None, (1, 1), (1, 1), (1, 1), 1)
    references = [weakref.ref(t) for t in (x, w, y)]
    del x, w, y
    gc.collect()
    assert len(handle.executables) == 1 and all(r() is None for r in references)


def test_a_plain_eager_batch_norm_updates_its_running_statistics_in_place(handle, full_calls):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5).contiguous(memory_format=CL)
    module = ot.BatchNorm2d(3).to(memory_format=CL)
    reference = torch.nn.BatchNorm2d(3).double()
    mean, var = module.running_mean, module.running_var
    for k in range(3):
        module(x * (k + 1)).sum().backward()
        reference(x.double() * (k + 1)).sum().backward()
    assert module.running_mean is mean and module.running_var is var
    assert relative_error(mean, reference.running_mean) < 1e-5 and relative_error(var, reference.running_var) < 1e-5

    def arguments():
        return (x, None, None, None, mean.clone(), var.clone(), 0.1, 1e-5, None, 0.0)

    eager_args, registered_args = arguments(), arguments()
    with torch.no_grad():
        eager = normalization.batch_norm_training(*eager_args)
        registered = torch.ops.opendnn.batch_norm_training(*registered_args)
    assert eager[4:] == (None, None)  # the eager call updated its arguments' statistics in place
    assert torch.equal(registered[4], eager_args[4]) and torch.equal(registered[5], eager_args[5])
    assert torch.equal(registered_args[4], mean) and torch.equal(registered_args[5], var)  # the operator's: copies


def test_a_plain_eager_batch_norm_allocates_no_reserve_without_activation_and_no_dz_without_z(handle, full_calls):
    """The eager kernels return None where the operators return an empty tensor, and the
    executables allocate only what their launches use; the gradients stay torch's."""
    torch.manual_seed(1)
    x = torch.randn(4, 3, 5, 5).contiguous(memory_format=CL).requires_grad_()
    w, b = (torch.rand(3) + 0.5).requires_grad_(), torch.randn(3).requires_grad_()
    dy = torch.randn_like(x)
    for _ in range(2):
        y = ot.functions.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    eager = (x.detach(), None, w.detach(), b.detach(), None, None, 0.1, 1e-5, None, 0.0)
    with torch.no_grad():
        assert normalization.batch_norm_training(*eager)[3] is None
        assert torch.ops.opendnn.batch_norm_training(*eager)[3].numel() == 0
    forward, backward = handle.executables.values()
    assert forward.allocations == backward.allocations == 4  # y, two statistics, workspace; dx, dw, db, workspace
    reference = [t.detach().double().requires_grad_() for t in (x, w, b)]
    expected = torch.autograd.grad(
        TF.batch_norm(reference[0], None, None, *reference[1:], True), reference, dy.double()
    )
    for got, want in zip((dx, dw, db), expected):
        assert relative_error(got, want) < 1e-5


# ---- the direct replay: a compiled kernel's C launcher, as on a GPU ------------------------------------


class _Driver(direct_launch._Driver):
    """The stand-in driver, for CPU tensors (whose device has no index)."""

    def get_current_stream(self, device: int | None) -> int:
        return super().get_current_stream(device or 0)


@pytest.mark.skipif(not launch_module.DIRECT_LAUNCH, reason="the direct launch is written for triton 3.6")
def test_a_direct_replay_passes_what_the_launch_passes(handle, monkeypatch):
    monkeypatch.setattr(driver, "_active", _Driver())
    calls = []
    planned = Launch(
        direct_launch._Kernel(direct_launch._compiled(calls)), (3, 2), (Slot("x"), Slot("y"), 7), {"BLOCK": 128}
    )
    backend = types.SimpleNamespace(run=lambda problem, x, y: planned({"x": x[1:], "y": y}))

    def scale(x):  # a kernel of one launch: y (a new tensor) from x at an offset of one element
        y = torch.empty_strided((x.numel() - 1,), (1,), dtype=x.dtype, device=x.device)
        dispatch._run(handle, "pointwise", backend, None, (x, y))
        return y

    record(handle, ("scale",), scale, (torch.randn(9),))
    executable = handle.executables[("scale",)]
    assert isinstance(executable, Executable) and executable.direct
    x = torch.randn(9)
    y = executable.replay((x,))
    planned.launch({"x": x[1:], "y": y})  # the launch's own direct path, for the same tensors
    replayed, launched = calls[-2:]
    assert replayed == launched
    assert replayed[: direct_launch.LAUNCH_METADATA] == (
        3,
        2,
        1,
        direct_launch.STREAM,
        0xF00,
        False,
        False,
        None,
        None,
        (4, 1, 0),
    )
    assert replayed[direct_launch.ARGUMENTS :] == (x.data_ptr() + 4, y.data_ptr(), 7, 128)
    kept = [value for value in executable.replay.__globals__.values() if isinstance(value, torch.Tensor)]
    assert kept == []  # the replay keeps no tensor of the recorded call


@pytest.mark.parametrize("fused", [False, True])
def test_a_cumulative_batch_norm_keeps_one_signature_and_torchs_running_statistics(fused, handle, full_calls):
    """momentum=None: the factor 1 / batches changes every step; the call keeps the signature of
    momentum 0 (replayed after the first step) and the running statistics follow torch's."""
    model = torch.nn.Sequential(torch.nn.BatchNorm2d(4, momentum=None), torch.nn.ReLU())
    ours = copy.deepcopy(model)
    ot.convert(ours)
    if fused:
        ours = ot.fuse(ours)
    (norm,) = [module for module in ours.modules() if isinstance(module, torch.nn.BatchNorm2d)]
    counts = []
    for step in range(4):
        x = torch.randn(3, 4, 5, 6, generator=torch.Generator().manual_seed(step)) * (step + 1) + step
        assert relative_error(ours(x), model(x)) < 1e-5
        assert relative_error(norm.running_mean, model[0].running_mean) < 1e-5
        assert relative_error(norm.running_var, model[0].running_var) < 1e-5
        counts.append(len(full_calls))
    assert int(norm.num_batches_tracked) == 4
    assert counts[0] > 0 and counts[3] == counts[2] == counts[1] == counts[0]  # recorded once, then replayed
