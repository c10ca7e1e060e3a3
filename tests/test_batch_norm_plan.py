"""opendnn.functional's per-signature batch norm plans: a repeated signature reuses its plan and gives
what a fresh call gives; any change of signature (a parameter's dtype, layout, device or absence, eps,
momentum, x's layout, z, the activation, the handle's backend) gets a plan of its own and the
reference's results; a bad argument after a good call still raises its error, naming it; the plans
keep no caller's array alive, stay bounded and live on the handle. Outputs are poisoned (NaN, 0xFF
bytes) as allocated."""

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.core import plans as core_plans
from opendnn.families.batch_norm import functional as plans

BACKENDS = ["numpy", "triton"]
C = 4


HANDLES: dict[str, od.Handle] = {}  # a test's handle per backend, its plans with it


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output and scratch buffer the functions allocate starts as NaN (0xFF bytes), and each
    test starts with new handles, holding no plan."""
    allocate, scratch_bytes = plans.allocate, plans.scratch_bytes

    def poisoned_allocate(like, desc, name=None):
        out = allocate(like, desc, name)
        out.view[...] = np.nan
        return out

    def poisoned_scratch(like, count, name="workspace"):
        out = scratch_bytes(like, count, name)
        if out is not None:
            out.view[...] = 255
        return out

    monkeypatch.setattr(plans, "allocate", poisoned_allocate)
    monkeypatch.setattr(plans, "scratch_bytes", poisoned_scratch)
    clear()
    yield
    clear()


def clear():
    for handle in HANDLES.values():
        handle.destroy()
    HANDLES.clear()


def handle_of(backend):
    """The test's handle of ``backend``: every call of a test on one backend shares its plans."""
    if backend not in HANDLES:
        HANDLES[backend] = od.create("cpu", backend=backend)
    return HANDLES[backend]


def planned(call, backend="numpy"):
    """How many plans of ``call`` ("batch_norm", "batch_norm_backward") the backend's handle keeps."""
    return sum(key[0] == call for key in handle_of(backend).plans)


def forward_plans(backend="numpy"):
    return planned("batch_norm", backend)


def backward_plans(backend="numpy"):
    return planned("batch_norm_backward", backend)


def random(*shape, seed, dtype=torch.float32, low=-2.0, high=3.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low).to(dtype)


def inputs(seed=0, dtype=torch.float32, channels_last=False, shape=(3, C, 3, 5)):
    x = random(*shape, seed=seed, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return dict(
        x=x,
        weight=random(C, seed=seed + 1, low=0.5),
        bias=random(C, seed=seed + 2),
        running_mean=random(C, seed=seed + 3),
        running_var=random(C, seed=seed + 4, low=0.5),
    )


def run_forward(
    backend,
    x,
    weight=None,
    bias=None,
    running_mean=None,
    running_var=None,
    z=None,
    momentum=0.1,
    eps=1e-5,
    activation=None,
    training=True,
):
    handle = handle_of(backend)
    out = F.batch_norm_add_activation(
        x,
        z,
        running_mean,
        running_var,
        weight,
        bias,
        training,
        momentum,
        eps,
        activation=activation,
        return_state=True,
        handle=handle,
    )
    return out if training else (out, None)


def expected_forward(
    x,
    weight=None,
    bias=None,
    running_mean=None,
    running_var=None,
    z=None,
    momentum=0.1,
    eps=1e-5,
    activation=None,
    training=True,
):
    """torch's float64 result, and the running statistics after the call (each updated alone:
    torch takes both or neither)."""
    x = x.double()
    mean, var = (None if s is None else s.double() for s in (running_mean, running_var))
    y = TF.batch_norm(
        x,
        mean if not training else None,
        var if not training else None,
        None if weight is None else weight.double(),
        None if bias is None else bias.double(),
        training,
        momentum,
        eps,
    )
    if training and mean is not None:
        mean = (1 - momentum) * mean + momentum * x.mean((0, 2, 3))
    if training and var is not None:
        var = (1 - momentum) * var + momentum * x.var((0, 2, 3), unbiased=True)
    if z is not None:
        y = y + z.double()
    if activation == "relu":
        y = torch.relu(y)
    return y, mean, var


def check_forward(backend, args, **options):
    """The call's y, running and saved statistics against torch's (the caller's running statistics
    are cloned first: they are updated in place); returns (y, state)."""
    args = {k: v.clone() if k.startswith("running") and v is not None else v for k, v in args.items()}
    expected, mean, var = expected_forward(**args, **options)
    y, state = run_forward(backend, **args, **options)
    y = torch.as_tensor(y)
    tolerance = 2e-2 if args["x"].dtype in (torch.bfloat16, torch.float16) else 1e-5
    assert y.dtype == args["x"].dtype and y.shape == args["x"].shape and y.stride() == args["x"].stride()
    torch.testing.assert_close(y.double(), expected, rtol=tolerance, atol=tolerance)
    for actual, wanted in ((args.get("running_mean"), mean), (args.get("running_var"), var)):
        if wanted is not None:
            torch.testing.assert_close(actual.double(), wanted, rtol=1e-5, atol=1e-6)
    if state is not None:
        x = args["x"].double()
        batch_mean, batch_var = x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)
        assert tuple(state.saved_mean.shape) == (1, C, 1, 1)
        torch.testing.assert_close(
            torch.as_tensor(state.saved_mean).double().reshape(C), batch_mean, rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(
            torch.as_tensor(state.saved_inv_std).double().reshape(C),
            (batch_var + options.get("eps", 1e-5)).rsqrt(),
            rtol=1e-5,
            atol=1e-5,
        )
    return y, state


def check_backward(backend, x, weight, dy, state, bias=None, z=None, activation=None, eps=1e-5):
    """dx (dz), dweight, dbias against torch autograd's of the float64 forward."""

    def leaf(t, default=0.0):
        return (torch.full((C,), default) if t is None else t).detach().to(torch.float64, copy=True).requires_grad_()

    xr, wr, br = leaf(x), leaf(weight, 1.0), leaf(bias)
    zr = None if z is None else leaf(z)
    y = TF.batch_norm(xr, None, None, wr, br, True, 0.1, eps)
    if zr is not None:
        y = y + zr
    if activation == "relu":
        y = torch.relu(y)
    y.backward(dy.double())
    handle = handle_of(backend)
    dx, dz, dweight, dbias = F.batch_norm_add_activation_backward(
        dy, x, weight, state, eps, activation=activation, has_z=z is not None, handle=handle
    )
    assert dx.dtype == x.dtype and dx.stride() == x.stride() and dweight.shape == (C,) and dbias.shape == (C,)
    tolerance = 5e-2 if x.dtype in (torch.bfloat16, torch.float16) else 1e-4
    wanted = ((dx, xr.grad), (dweight, wr.grad), (dbias, br.grad)) + (() if z is None else ((dz, zr.grad),))
    for actual, grad in wanted:
        torch.testing.assert_close(actual.double(), grad, rtol=tolerance, atol=tolerance)
    return dx, dz, dweight, dbias


# ---- a repeated signature ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_repeated_signature_reuses_its_plan_and_gives_what_a_fresh_call_gives(backend):
    results = []
    for seed in (0, 10):  # the same signature, other data
        args = inputs(seed, channels_last=True)
        y, state = check_forward(backend, args)
        dy = random(3, C, 3, 5, seed=seed + 5)
        grads = check_backward(backend, args["x"], args["weight"], dy, state)
        results.append((args, y, state, dy, grads))
    assert forward_plans(backend) == 1 and backward_plans(backend) == 1
    assert len(handle_of(backend).plans) == 2
    args, y, state, dy, grads = results[-1]
    clear()  # a fresh call of the last arguments: bitwise the planned call's results
    fresh_y, fresh_state = run_forward(backend, **{k: v.clone() for k, v in args.items()})
    fresh_grads = F.batch_norm_add_activation_backward(
        dy, args["x"], args["weight"], fresh_state, activation=None, has_z=False, handle=handle_of(backend)
    )
    assert torch.equal(torch.as_tensor(fresh_y), y)
    assert torch.equal(torch.as_tensor(fresh_state.saved_mean), torch.as_tensor(state.saved_mean))
    for fresh, planned in zip(fresh_grads, grads):
        assert (fresh is None and planned is None) or torch.equal(fresh, planned)


# ---- a changed signature -------------------------------------------------------------------------------

FORWARD_CHANGES = {
    "weight float64 (converted)": lambda a, o: a.update(weight=a["weight"].double()),
    "bias bfloat16 (converted)": lambda a, o: a.update(bias=a["bias"].bfloat16()),
    "weight strided (converted)": lambda a, o: a.update(weight=random(2 * C, seed=7)[::2]),
    "weight as (1, C, 1, 1)": lambda a, o: a.update(weight=a["weight"].reshape(1, C, 1, 1)),
    "weight and bias absent": lambda a, o: a.update(weight=None, bias=None),
    "running statistics absent": lambda a, o: a.update(running_mean=None, running_var=None),
    "running variance absent": lambda a, o: a.update(running_var=None),
    "eps": lambda a, o: o.update(eps=1e-2),
    "momentum": lambda a, o: o.update(momentum=0.7),
    "x channels last": lambda a, o: a.update(x=a["x"].contiguous(memory_format=torch.channels_last)),
    "x permuted (H, W swapped in memory)": lambda a, o: a.update(x=a["x"].transpose(2, 3).contiguous().transpose(2, 3)),
    "x bfloat16": lambda a, o: a.update(x=a["x"].bfloat16()),
    "x of another shape": lambda a, o: a.update(x=random(2, C, 5, 2, seed=8)),
    "z and relu": lambda a, o: o.update(z=random(3, C, 3, 5, seed=9), activation="relu"),
    "relu": lambda a, o: o.update(activation="relu"),
    "inference": lambda a, o: o.update(training=False),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", FORWARD_CHANGES)
def test_a_changed_forward_signature_gets_its_own_plan_and_the_reference_results(backend, change):
    check_forward(backend, inputs(0))
    args, options = inputs(20), {}
    FORWARD_CHANGES[change](args, options)
    check_forward(backend, args, **options)
    assert forward_plans(backend) == 2
    check_forward(backend, inputs(30))  # the first signature's plan again
    assert forward_plans(backend) == 2


def test_each_handle_keeps_its_own_plans():
    for backend in BACKENDS:
        check_forward(backend, inputs(0))
        check_forward(backend, inputs(10))
        assert forward_plans(backend) == 1
    other = od.create("cpu", backend="numpy")
    F.batch_norm(inputs(20)["x"], training=True, handle=other)
    assert [key[0] for key in other.plans] == ["batch_norm"]


def test_a_destroyed_handle_drops_its_batch_norm_plans_and_refuses_a_planned_call():
    handle = handle_of("numpy")
    check_forward("numpy", inputs(0))
    assert forward_plans() == 1
    handle.destroy()
    assert not handle.plans
    with pytest.raises(od.BadParam, match="handle was destroyed and cannot be used"):
        run_forward("numpy", **inputs(0))


BACKWARD_CHANGES = {  # each changes the backward call (and the forward's eps with it)
    "saved statistics absent (recomputed)": lambda c: c.update(state=plans.BatchNormState(None, None, None)),
    "weight float64 (converted)": lambda c: c.update(weight=c["weight"].double()),
    "weight absent": lambda c: c.update(weight=None),
    "eps": lambda c: c.update(eps=1e-2),
    "dy channels last": lambda c: c.update(dy=c["dy"].contiguous(memory_format=torch.channels_last)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("change", BACKWARD_CHANGES)
def test_a_changed_backward_signature_gets_its_own_plan_and_the_reference_results(backend, change):
    for seed, changed in ((0, False), (20, True), (30, False)):
        args = inputs(seed)
        call = dict(x=args["x"], weight=args["weight"], dy=random(3, C, 3, 5, seed=seed + 5), state=None)
        if changed:
            BACKWARD_CHANGES[change](call)
        _, state = run_forward(backend, **args, eps=call.get("eps", 1e-5))
        call["state"] = call["state"] or state
        check_backward(backend, **call)
    assert backward_plans(backend) == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_fused_add_relu_backward_reads_its_forwards_reserve_through_the_plan(backend):
    for seed in (0, 10):
        args = inputs(seed)
        z = random(3, C, 3, 5, seed=seed + 6)
        _, state = check_forward(backend, args, z=z, activation="relu")
        check_backward(
            backend,
            args["x"],
            args["weight"],
            random(3, C, 3, 5, seed=seed + 5),
            state,
            args["bias"],
            z=z,
            activation="relu",
        )
    assert forward_plans(backend) == 1 and backward_plans(backend) == 1


def test_numpy_arrays_are_planned_and_bound():
    for seed in (0, 10):
        args = inputs(seed)
        expected, expected_mean, _ = expected_forward(args["x"], args["weight"], running_mean=args["running_mean"])
        x, weight, mean = args["x"].numpy(), args["weight"].numpy(), args["running_mean"].numpy()
        y = F.batch_norm(x, mean, None, weight, None, training=True, handle=handle_of("numpy"))
        assert isinstance(y, np.ndarray) and y.dtype == np.float32
        np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mean, expected_mean.numpy(), rtol=1e-5, atol=1e-6)
    assert forward_plans() == 1


# ---- what a key cannot describe --------------------------------------------------------------------------


@pytest.mark.parametrize("unkeyed", ["dlpack weight", "numpy eps"])
def test_arguments_a_key_cannot_describe_are_planned_per_call_and_not_kept(unkeyed):
    x, weight = random(3, C, 3, 5, seed=0), random(C, seed=1)
    expected, _, _ = expected_forward(x, weight, eps=1e-3)
    for _ in range(2):
        if unkeyed == "dlpack weight":  # (read by NumPy: a NumPy x)
            dlpack_only = SimpleNamespace(__dlpack__=weight.__dlpack__, __dlpack_device__=weight.__dlpack_device__)
            y = F.batch_norm(x.numpy(), None, None, dlpack_only, training=True, eps=1e-3, handle=handle_of("numpy"))
        else:
            y = F.batch_norm(x, None, None, weight, training=True, eps=np.float64(1e-3), handle=handle_of("numpy"))
        torch.testing.assert_close(torch.as_tensor(y).double(), expected, rtol=1e-5, atol=1e-5)
    assert not handle_of("numpy").plans


# ---- errors after a good call ----------------------------------------------------------------------------

FORWARD_ERRORS = {
    "weight of 3 elements": (
        lambda a, o: a.update(weight=torch.ones(3)),
        r"weight.shape=\(3,\) must hold C=4 elements",
    ),
    "bias not an array": (lambda a, o: a.update(bias=[0.0] * C), r"bias of type list is not a NumPy array"),
    "running_mean float64": (
        lambda a, o: a.update(running_mean=a["running_mean"].double()),
        r"running_mean.dtype=float64 must be float32 \(running statistics are used in place\)",
    ),
    "running_var strided": (
        lambda a, o: a.update(running_var=torch.ones(2 * C)[::2]),
        r"running_var must be contiguous",
    ),
    "running_var of (1, C)": (
        lambda a, o: a.update(running_var=torch.ones(1, C)),
        r"running_var.shape=\(1, 4\) must be \(4,\)",
    ),
    "negative eps": (lambda a, o: o.update(eps=-1e-6), r"eps=-1e-06 must be at least 0.0"),
    "momentum above 1": (lambda a, o: o.update(momentum=1.5), r"momentum=1.5 must be between 0 and 1"),
    "activation tanh": (
        lambda a, o: o.update(activation="tanh"),
        r"activation='tanh' must be 'relu', 'clipped_relu', 'identity' or None",
    ),
    "z of another shape": (
        lambda a, o: o.update(z=torch.ones(3, C, 3, 4), activation="relu"),
        r"z.dims\[3\]=4 must equal x.dims\[3\]=5",
    ),
    "weight on another device": (
        lambda a, o: a.update(weight=torch.ones(C, device="meta")),
        r"weight is on meta:0 but the handle is bound to cpu",
    ),
    "x of one dim": (lambda a, o: a.update(x=torch.ones(C)), r"x.ndim=1 must be at least 2"),
    "inference without running statistics": (
        lambda a, o: (a.update(running_mean=None), o.update(training=False)),
        r"running_mean and running_var are needed when training=False",
    ),
    "inference with z": (
        lambda a, o: o.update(training=False, z=torch.ones(3, C, 3, 5)),
        r"inference takes no z and no activation",
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("error", FORWARD_ERRORS)
def test_a_bad_argument_after_a_good_call_still_raises_naming_it(backend, error):
    check_forward(backend, inputs(0))
    change, message = FORWARD_ERRORS[error]
    args, options = inputs(10), {}
    change(args, options)
    for _ in range(2):  # errors are never kept
        with pytest.raises((od.BadParam, od.NotSupported), match=message):
            run_forward(backend, **args, **options)
    check_forward(backend, inputs(20))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_errors_after_a_good_call(backend):
    args = inputs(0)
    _, state = run_forward(backend, **args, activation="relu")
    handle = handle_of(backend)
    dy = random(3, C, 3, 5, seed=5)

    def backward(state, weight=args["weight"]):
        return F.batch_norm_add_activation_backward(dy, args["x"], weight, state, has_z=False, handle=handle)

    backward(state)
    with pytest.raises(od.BadParam, match="saved_mean and saved_inv_variance must be given together"):
        backward(plans.BatchNormState(state.saved_mean, None, state.reserve))
    with pytest.raises(od.BadParam, match="reserve_space=None but get_batch_normalization_training_ex_reserve"):
        backward(plans.BatchNormState(state.saved_mean, state.saved_inv_std, None))
    with pytest.raises(od.BadParam, match="reserve_space holds 16 bytes but"):
        backward(plans.BatchNormState(state.saved_mean, state.saved_inv_std, torch.empty(16, dtype=torch.uint8)))
    with pytest.raises(od.BadParam, match=r"weight.shape=\(5,\) must hold C=4 elements"):
        backward(state, torch.ones(5))
    backward(state)


# ---- what the plans keep --------------------------------------------------------------------------------


def test_the_plans_keep_no_callers_array_alive():
    args = inputs(0)
    dy = random(3, C, 3, 5, seed=5)
    _, state = run_forward("numpy", **args)
    F.batch_norm_add_activation_backward(
        dy, args["x"], args["weight"], state, activation=None, has_z=False, handle=handle_of("numpy")
    )
    references = [weakref.ref(t) for t in (*args.values(), dy, state.saved_mean, state.saved_inv_std)]
    del args, dy, state
    gc.collect()
    assert forward_plans() == 1 and backward_plans() == 1
    assert all(reference() is None for reference in references)


def test_the_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(core_plans, "LIMIT", 4)
    x = random(2, C, 1, 3, seed=0)
    for k in range(10):
        eps = 1e-5 * (k + 1)
        y = F.batch_norm(x, training=True, eps=eps, handle=handle_of("numpy"))
        torch.testing.assert_close(y.double(), expected_forward(x, eps=eps)[0], rtol=1e-5, atol=1e-5)
        assert 1 <= forward_plans() <= 4
