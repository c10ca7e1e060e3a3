"""Per-call-signature plans (core/plans.py): a repeated functional call takes its plan from the
handle and gives what the full path gives; reference_io.read reads without a copy."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.core import plans as core_plans
from opendnn.core.arrays import allocate as real_allocate
from opendnn.core.arrays import wrap
from opendnn.core.errors import BadParam
from opendnn.core.reference_io import read
from opendnn.families.convolution import functional as conv_functional
from opendnn.families.matmul import functional as matmul_functional
from opendnn.families.pointwise import functional as pointwise_functional
from opendnn.families.pooling import functional as pooling_functional
from opendnn.families.softmax import functional as softmax_functional


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output a planned or full call allocates starts as NaN: an unwritten element fails."""

    def poisoned(like, desc, name=None):
        bound = real_allocate(like, desc, name)
        bound.view[...] = np.nan if desc.dtype.is_floating else 0
        return bound

    for module in (pointwise_functional, conv_functional, pooling_functional, matmul_functional, softmax_functional):
        monkeypatch.setattr(module, "allocate", poisoned)


def random(*shape, seed):
    return np.random.default_rng(seed).uniform(-2.0, 3.0, shape)


def as_kind(values, kind, dtype=np.float32):
    values = values.astype(dtype)
    return torch.from_numpy(values) if kind == "torch" else values


def conv_reference(x, w, padding):
    return torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=padding).numpy()


def pool_reference(x):
    return torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy()


# each call: (its name, the call given float32 arrays of one kind, the float64 reference of the same data)
CALLS = {
    "relu": (lambda a, h: F.relu(a["x"], handle=h), lambda a: np.maximum(a["x"], 0)),
    "add": (lambda a, h: F.add(a["x"], a["x2"], handle=h), lambda a: a["x"] + a["x2"]),
    "conv": (lambda a, h: F.conv(a["x"], a["w"], padding=1, handle=h), lambda a: conv_reference(a["x"], a["w"], 1)),
    "conv_backward_data": (
        lambda a, h: F.conv_backward_data(a["dy"], a["w"], (2, 4, 5, 6), padding=1, handle=h),
        lambda a: torch.nn.grad.conv2d_input(
            (2, 4, 5, 6), torch.from_numpy(a["w"]), torch.from_numpy(a["dy"]), padding=1
        ).numpy(),
    ),
    "conv_backward_filter": (
        lambda a, h: F.conv_backward_filter(a["x"], a["dy"], (6, 4, 3, 3), padding=1, handle=h),
        lambda a: torch.nn.grad.conv2d_weight(
            torch.from_numpy(a["x"]), (6, 4, 3, 3), torch.from_numpy(a["dy"]), padding=1
        ).numpy(),
    ),
    "max_pool": (lambda a, h: F.max_pool(a["x"], 3, 2, 1, handle=h), lambda a: pool_reference(a["x"])),
    "linear": (lambda a, h: F.linear(a["m"], a["m2"], a["b"], handle=h), lambda a: a["m"] @ a["m2"].T + a["b"]),
    "log_softmax": (
        lambda a, h: F.log_softmax(a["x"], 1, handle=h),
        lambda a: torch.log_softmax(torch.from_numpy(a["x"]), 1).numpy(),
    ),
}


def arguments(seed):
    return {
        "x": random(2, 4, 5, 6, seed=seed),
        "x2": random(2, 4, 5, 6, seed=seed + 1),
        "w": random(6, 4, 3, 3, seed=seed + 2),
        "dy": random(2, 6, 5, 6, seed=seed + 3),
        "m": random(3, 5, seed=seed + 4),
        "m2": random(7, 5, seed=seed + 5),
        "b": random(7, seed=seed + 6),
    }


def relative_error(out, reference):
    out = np.asarray(torch.as_tensor(out), dtype=np.float64)
    return np.linalg.norm(out - reference) / np.linalg.norm(reference)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_repeated_call_takes_its_plan_and_gives_the_reference_result(call, kind):
    run, reference = CALLS[call]
    handle = od.create("cpu", backend="numpy")
    for seed in (0, 10, 20):  # the first call plans; the later ones, on other data, take the plan
        values = arguments(seed)
        out = run({k: as_kind(v, kind) for k, v in values.items()}, handle)
        assert isinstance(out, torch.Tensor if kind == "torch" else np.ndarray)
        assert relative_error(out, reference(values)) < 1e-5
    assert len(handle.plans) == 1
    (plan,) = handle.plans.values()
    assert plan.implementation.__name__.endswith("numpy_backend")


def test_a_changed_signature_gets_its_own_plan_and_the_reference_result():
    handle = od.create("cpu", backend="numpy")
    values = random(2, 4, 5, 6, seed=0)
    F.relu(values.astype(np.float32), handle=handle)
    changed = {
        "dtype": values,
        "strides": np.transpose(values.astype(np.float32), (0, 2, 3, 1)),
        "shape": values[:, :3].astype(np.float32),
        "kind": torch.from_numpy(values.astype(np.float32)),
    }
    for count, (change, array) in enumerate(changed.items(), start=2):
        out = F.relu(array, handle=handle)
        expected = np.maximum(np.asarray(array, dtype=np.float64), 0)
        assert np.asarray(out).shape == expected.shape, change
        assert relative_error(out, expected) < 1e-6, change
        assert len(handle.plans) == count, change


def test_scalar_arguments_are_part_of_the_signature():
    handle = od.create("cpu", backend="numpy")
    x = random(2, 4, 5, 6, seed=0).astype(np.float32)
    w = random(6, 4, 3, 3, seed=1).astype(np.float32)
    for padding in (1, 0, 1):
        out = F.conv(x, w, padding=padding, handle=handle)
        assert relative_error(out, conv_reference(x.astype(np.float64), w.astype(np.float64), padding)) < 1e-5
    assert len(handle.plans) == 2


def test_a_list_argument_takes_the_plan_of_its_tuple():
    handle = od.create("cpu", backend="numpy")
    x = random(2, 4, 5, 6, seed=0).astype(np.float32)
    w = random(6, 4, 3, 3, seed=1).astype(np.float32)
    first = F.conv(x, w, stride=(1, 2), padding=1, handle=handle)
    second = F.conv(x, w, stride=[1, 2], padding=1, handle=handle)
    np.testing.assert_array_equal(first, second)
    assert len(handle.plans) == 1


def test_arguments_a_key_cannot_describe_take_the_full_path_and_keep_no_plan():
    handle = od.create("cpu", backend="numpy")
    x = random(2, 4, 5, 6, seed=0).astype(np.float32)
    dlpack_only = SimpleNamespace(__dlpack__=x.__dlpack__, __dlpack_device__=x.__dlpack_device__)
    w = random(6, 4, 3, 3, seed=1).astype(np.float32)
    for _ in range(2):
        np.testing.assert_allclose(F.add(x, dlpack_only, handle=handle), x + x)
        out = F.conv(x, w, padding=np.int64(1), handle=handle)  # a NumPy integer: no plain value
        assert relative_error(out, conv_reference(x.astype(np.float64), w.astype(np.float64), 1)) < 1e-5
    assert not handle.plans


def test_the_default_handle_keeps_the_plans_of_calls_given_no_handle():
    x = random(2, 4, 5, 6, seed=0).astype(np.float32)
    F.relu(x)
    handle = od.core.default_handle.shared_handle("cpu")
    key = core_plans.signature("pointwise", (x,), ())
    assert key is not None
    assert any(k[:2] == key[:2] for k in handle.plans)
    np.testing.assert_allclose(F.relu(x), np.maximum(x, 0))


def test_the_plans_keep_no_callers_array_alive():
    handle = od.create("cpu", backend="numpy")
    values = arguments(0)
    arrays = {k: torch.from_numpy(v.astype(np.float32)) for k, v in values.items()}
    for run, _ in CALLS.values():
        run(arrays, handle)
    references = [weakref.ref(t) for t in arrays.values()]
    del arrays
    gc.collect()
    assert len(handle.plans) == len(CALLS)
    assert all(reference() is None for reference in references)


def test_the_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(core_plans, "LIMIT", 4)
    handle = od.create("cpu", backend="numpy")
    for k in range(10):
        x = random(1, k + 1, seed=k).astype(np.float32)
        np.testing.assert_allclose(F.relu(x, handle=handle), np.maximum(x, 0))
        assert 1 <= len(handle.plans) <= 4


def test_a_destroyed_handle_drops_its_plans_and_refuses_a_planned_call():
    handle = od.create("cpu", backend="numpy")
    x = random(2, 3, seed=0).astype(np.float32)
    F.relu(x, handle=handle)
    assert handle.plans
    handle.destroy()
    assert not handle.plans
    with pytest.raises(BadParam, match="handle was destroyed and cannot be used"):
        F.relu(x, handle=handle)


def test_a_bad_call_after_a_planned_one_is_refused_with_its_message():
    handle = od.create("cpu", backend="numpy")
    x = random(2, 4, 5, 6, seed=0).astype(np.float32)
    w = random(6, 4, 3, 3, seed=1).astype(np.float32)
    F.conv(x, w, padding=1, handle=handle)
    with pytest.raises(BadParam, match=r"w.dims\[1\]=4 must equal x.dims\[1\]/groups=3"):
        F.conv(x[:, :3], w, padding=1, handle=handle)


# ---- reading without a copy ----------------------------------------------------------------------------


def test_read_gives_the_callers_memory_read_only_when_no_conversion_is_needed():
    values = random(3, 4, seed=0).astype(np.float32)
    bound = wrap("x", values)
    view = read(bound, od.DataType.FLOAT)
    assert np.shares_memory(view, values) and not view.flags.writeable
    assert values.flags.writeable  # the caller's array is left as it is
    np.testing.assert_array_equal(view, values)
    with pytest.raises(ValueError, match="read-only"):
        view[0, 0] = 1.0
    converted = read(bound, od.DataType.DOUBLE)
    assert converted.dtype == np.float64 and not np.shares_memory(converted, values)
    np.testing.assert_array_equal(converted, values.astype(np.float64))


def test_backends_computing_in_place_leave_their_inputs_unchanged():
    x = random(4, 3, 2, 2, seed=0).astype(np.float32)
    dy = random(4, 3, 2, 2, seed=1).astype(np.float32)
    kept = x.copy(), dy.copy()
    handle = od.create("cpu", backend="numpy")
    y = F.softmax(x, dim=1, handle=handle)
    F.softmax_grad(dy, y, dim=1, handle=handle)
    F.batch_norm(x, None, None, training=True, handle=handle)
    F.avg_pool_backward(np.ascontiguousarray(dy[:, :, :1, :1]), x, 2, handle=handle)
    np.testing.assert_array_equal(x, kept[0])
    np.testing.assert_array_equal(dy, kept[1])
