"""Softmax: the NumPy reference against torch and finite differences in float64, then the API on
both backends (Triton through its interpreter): special rows (-inf, NaN, huge values), rows past one
block (the two-pass kernels, split over several programs), in place, the Pythonic API, errors, and
the kernels compiled for the H200 (sm_90) under the launcher's own arguments."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import sm90
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.families.softmax.problem import (
    SoftmaxAlgorithm,
    SoftmaxMode,
    mode_axes,
    mode_problem,
    reference_backward,
    reference_forward,
)
from opendnn.families.softmax.triton_backend import softmax_plan
from opendnn.kernels import device

BACKENDS = ["numpy", "triton"]
ALGOS = list(SoftmaxAlgorithm)
MODES = list(SoftmaxMode)


def descriptor(tensor):
    return od.TensorDescriptor(tensor.dtype, tensor.shape, tensor.stride())


def torch_forward(algo, x, axes):
    """torch's softmax over ``axes`` (flattened into one dim)."""
    kept = [k for k in range(x.ndim) if k not in axes]
    rows = x.permute(*kept, *axes).reshape(*(x.shape[k] for k in kept), -1)
    out = (torch.log_softmax if algo is SoftmaxAlgorithm.LOG else torch.softmax)(rows, -1)
    return out.reshape(*(x.shape[k] for k in kept), *(x.shape[k] for k in axes)).permute(*np.argsort([*kept, *axes]))


def forward(backend, algo, mode, x, *, alpha=1.0, beta=0.0, y=None):
    y = torch.full_like(x, float("nan")) if y is None else y
    od.softmax_forward(od.create("cpu", backend=backend), algo, mode, alpha, descriptor(x), x, beta, descriptor(y), y)
    return y


def backward(backend, algo, mode, y, dy):
    dx = torch.full_like(y, float("nan"))
    od.softmax_backward(
        od.create("cpu", backend=backend),
        algo,
        mode,
        1.0,
        descriptor(y),
        y,
        descriptor(dy),
        dy,
        0.0,
        descriptor(dx),
        dx,
    )
    return dx


# the reference ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 5), (3, 4, 5, 6), (2, 3, 4, 2, 3)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_reference_matches_torch_forward_and_backward(algo, mode, shape):
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3
    axes = mode_axes(mode, len(shape))
    leaf = x.clone().requires_grad_()
    y = torch_forward(algo, leaf, axes)
    np.testing.assert_allclose(reference_forward(algo, x.numpy(), axes), y.detach().numpy(), rtol=1e-12, atol=1e-14)
    dy = torch.randn(shape, dtype=torch.float64)
    y.backward(dy)
    dx = reference_backward(algo, y.detach().numpy(), dy.numpy(), axes)
    np.testing.assert_allclose(dx, leaf.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_reference_backward_matches_finite_differences(algo, mode):
    rng = np.random.default_rng(2)
    x, dy, direction = (rng.uniform(-2, 2, (2, 3, 4)) for _ in range(3))
    axes = mode_axes(mode, 3)
    loss = lambda values: float((dy * reference_forward(algo, values, axes)).sum())  # noqa: E731
    h = 1e-6
    numeric = (loss(x + h * direction) - loss(x - h * direction)) / (2 * h)
    dx = reference_backward(algo, reference_forward(algo, x, axes), dy, axes)
    assert float((dx * direction).sum()) == pytest.approx(numeric, rel=1e-7, abs=1e-9)


def test_reference_fast_equals_accurate_for_moderate_values():
    x = np.random.default_rng(3).uniform(-5, 5, (3, 7))
    np.testing.assert_allclose(
        reference_forward(SoftmaxAlgorithm.FAST, x, (1,)),
        reference_forward(SoftmaxAlgorithm.ACCURATE, x, (1,)),
        rtol=1e-13,
    )


# special rows, on both backends -------------------------------------------------------------------


def rows_with_specials(length):
    """Row 0: all -inf; row 1: one NaN; row 2: some -inf; row 3: values near 1000; row 4: plain."""
    x = torch.linspace(-2, 2, 5 * length, dtype=torch.float32).reshape(5, length)
    x[0] = float("-inf")
    x[1, length // 2] = float("nan")
    x[2, ::3] = float("-inf")
    x[3] = 1000.0 + x[3]
    return x


@pytest.mark.parametrize("length", [7, 33000])  # one pass; two passes, each row split in 2 programs
@pytest.mark.parametrize("backend", BACKENDS)
def test_special_rows_follow_ieee_like_the_reference(backend, length):
    x = rows_with_specials(length)
    for algo in ALGOS:
        y = forward(backend, algo, SoftmaxMode.INSTANCE, x)
        expected = reference_forward(algo, x.double().numpy(), (1,))
        assert torch.isnan(y[0]).all() and torch.isnan(y[1]).all(), algo
        if algo is SoftmaxAlgorithm.FAST:  # exp(1000) overflows: inf / inf
            assert torch.isnan(y[3]).all()
            rows = [2, 4]
        else:
            rows = [2, 3, 4]
            assert torch.isfinite(y[3]).all()
        if algo is not SoftmaxAlgorithm.LOG:
            assert (y[2, ::3] == 0).all() and torch.allclose(y[rows].sum(1), torch.ones(len(rows)), atol=1e-5)
        np.testing.assert_allclose(y[rows].double().numpy(), expected[rows], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_row_of_one_element_is_one_and_its_log_is_zero(backend):
    x = torch.randn(3, 1, 2, 2)
    assert torch.equal(forward(backend, SoftmaxAlgorithm.ACCURATE, SoftmaxMode.CHANNEL, x), torch.ones_like(x))
    assert torch.equal(forward(backend, SoftmaxAlgorithm.LOG, SoftmaxMode.CHANNEL, x), torch.zeros_like(x))


def test_long_row_slices_follow_the_devices_multiprocessor_count(monkeypatch):
    desc = od.TensorDescriptor(od.DataType.FLOAT, (1, 1 << 26))
    problem = mode_problem(SoftmaxAlgorithm.ACCURATE, SoftmaxMode.INSTANCE, ("x_desc", "y_desc"), (desc, desc))
    assert device.programs_to_fill(8) == 8 * device.INTERPRETED_MULTIPROCESSORS == 1056
    assert device.programs_to_fill(8, power_of_two=True) == 1024
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(device, "multiprocessors", lambda index: 16)
    softmax_plan.cache_clear()
    try:
        assert device.programs_to_fill(8) == 128 and softmax_plan(problem).chunks == 128
    finally:
        softmax_plan.cache_clear()


@pytest.mark.parametrize("algo", ALGOS)
def test_two_pass_rows_split_over_programs_match_torch(algo):
    x = torch.randn(1, 40000, dtype=torch.float64) * 4
    problem = mode_problem(algo, SoftmaxMode.INSTANCE, ("x_desc", "y_desc"), (descriptor(x), descriptor(x)))
    assert softmax_plan(problem).chunks > 1
    y = forward("triton", algo, SoftmaxMode.INSTANCE, x)
    expected = torch_forward(algo, x, (1,))
    assert ((y - expected).norm() / expected.norm()).item() < 1e-12
    dy = torch.randn_like(x)
    dx = backward("triton", algo, SoftmaxMode.INSTANCE, y, dy)
    expected_dx = torch.from_numpy(reference_backward(algo, y.numpy(), dy.numpy(), (1,)))
    assert ((dx - expected_dx).norm() / expected_dx.norm()).item() < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_forward_and_backward(backend):
    x = torch.randn(4, 6, 3, 2)
    expected = torch.softmax(x, 1)
    y = x.clone()
    forward(backend, SoftmaxAlgorithm.ACCURATE, SoftmaxMode.CHANNEL, y, y=y)
    torch.testing.assert_close(y, expected)
    dy = torch.randn_like(x)
    handle = od.create("cpu", backend=backend)
    dx = dy.clone()
    od.softmax_backward(
        handle,
        SoftmaxAlgorithm.ACCURATE,
        SoftmaxMode.CHANNEL,
        1.0,
        descriptor(y),
        y,
        descriptor(dx),
        dx,
        0.0,
        descriptor(dx),
        dx,
    )
    torch.testing.assert_close(dx, y * (dy - (dy * y).sum(1, keepdim=True)))


# the plan: the design choices the speed depends on ---------------------------------------------------


def plan_of(dims, strides=None, mode=SoftmaxMode.INSTANCE, dtype="float32"):
    desc = od.TensorDescriptor(dtype, dims, strides)
    return softmax_plan(mode_problem(SoftmaxAlgorithm.ACCURATE, mode, ("x", "y"), (desc, desc)))


def test_plan_keeps_rows_of_4096_in_registers_and_splits_long_rows():
    rows = plan_of((32768, 4096))
    assert (rows.chunks, rows.block_k, rows.block_r, rows.num_warps) == (0, 1, 4096, 8)
    long_rows = plan_of((64, 1 << 20))
    assert long_rows.chunks * long_rows.k_blocks >= 1024  # 64 rows still fill 132 SMs
    channel = plan_of((64, 1000, 7, 7), mode=SoftmaxMode.CHANNEL)  # tiles of 8 pixels x 1024 channels
    assert (channel.chunks, channel.block_k, channel.block_r) == (0, 8, 1024)
    assert channel.inner == (49, (1, 1, 1)) and channel.reduced == ((1000, (49, 49, 49)),)


# the Pythonic API ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_any_dim_any_strides_matches_torch(backend):
    handle = od.create("cpu", backend=backend)
    x = torch.randn(5, 4, 3, dtype=torch.float64).permute(2, 0, 1)
    dy = torch.randn_like(x)
    for dim in (0, 1, -1):
        y, log_y = F.softmax(x, dim, handle=handle), F.log_softmax(x, dim, handle=handle)
        torch.testing.assert_close(y, torch.softmax(x, dim))
        torch.testing.assert_close(log_y, torch.log_softmax(x, dim))
        leaf = x.clone().requires_grad_()
        torch.softmax(leaf, dim).backward(dy)
        torch.testing.assert_close(F.softmax_grad(dy, y, dim, handle=handle), leaf.grad)
        leaf.grad = None
        torch.log_softmax(leaf, dim).backward(dy)
        torch.testing.assert_close(F.log_softmax_grad(dy, log_y, dim, handle=handle), leaf.grad)


def test_functional_returns_numpy_for_numpy_and_keeps_bfloat16():
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    y = F.softmax(x, 1, handle=od.create("cpu", backend="numpy"))
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, torch.softmax(torch.from_numpy(x), 1).numpy(), rtol=1e-6)
    xb = torch.randn(3, 8).to(torch.bfloat16)
    yb = F.softmax(xb, 0, handle=od.create("cpu", backend="triton"))
    assert yb.dtype == torch.bfloat16
    torch.testing.assert_close(yb.float(), torch.softmax(xb.float(), 0), rtol=1e-2, atol=1e-2)


# errors ----------------------------------------------------------------------------------------------


def call_forward(x_desc, y_desc, algo=SoftmaxAlgorithm.ACCURATE, mode=SoftmaxMode.INSTANCE, alpha=1.0):
    x = torch.zeros(64, dtype=torch.float64)
    od.softmax_forward(
        od.create("cpu", backend="numpy"),
        algo,
        mode,
        alpha,
        x_desc,
        x,
        0.0,
        y_desc,
        torch.zeros(64, dtype=torch.float64),
    )


PLAIN = od.TensorDescriptor("float64", (2, 3))


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: call_forward(od.TensorDescriptor("float64", (2, 3)), od.TensorDescriptor("float64", (2, 4))),
            r"y_desc.dims=\[2, 4\] must equal x_desc.dims=\[2, 3\]",
        ),
        (
            lambda: call_forward(od.TensorDescriptor("float64", (6,)), od.TensorDescriptor("float64", (6,))),
            r"x_desc.ndim=1 must be at least 2",
        ),
        (lambda: call_forward(PLAIN, PLAIN, algo="max"), r"algo='max' must be a SoftmaxAlgorithm"),
        (lambda: call_forward(PLAIN, PLAIN, mode=3), r"mode=3 must be a SoftmaxMode"),
        (lambda: call_forward(PLAIN, PLAIN, alpha=float("inf")), r"alpha=inf must be finite"),
        (lambda: call_forward(PLAIN, od.TensorDescriptor("float64", (2, 3), (0, 1))), r"overlapping elements"),
        (
            lambda: call_forward(od.TensorDescriptor("float64", (9, 9)), od.TensorDescriptor("float64", (9, 9))),
            r"x_desc reaches 81 elements but x holds 64",
        ),
        (lambda: F.softmax(torch.zeros(2, 3), 2), r"dim=2 must be between -2 and 1"),
    ],
)
def test_errors_name_the_parameter_and_the_rule(call, message):
    with pytest.raises(od.BadParam, match=message):
        call()


def test_integer_tensors_are_not_supported():
    desc = od.TensorDescriptor("int32", (2, 3))
    with pytest.raises(od.NotSupported, match=r"x_desc.dtype=INT32 must be FLOAT"):
        call_forward(desc, desc)


# compiled for the H200 (sm_90): Triton's CUDA compiler runs without a GPU ---------------------------

# (algo, reduced axes, float32 dims, backward). Triton 3.6 once failed to compile the stats kernel of
# float32 LOG backward on two-pass rows ("PassManager::run failed" in TritonGPUOptimizeThreadLocality).
SM90_PROBLEMS = [
    (SoftmaxAlgorithm.LOG, (1, 2, 3), (64, 1000, 7, 7), True),  # INSTANCE, rows of 49000: two passes
    *((algo, (1,), (3, 1 << 20), backward) for algo, backward in itertools.product(ALGOS, (False, True))),
    *((SoftmaxAlgorithm.LOG, (1,), (64, 1000, 7, 7), backward) for backward in (False, True)),  # one pass
]
SM90_LAUNCHES = 2 * 7 + 2  # stats + apply for each two-pass problem, one kernel for each one-pass problem


def test_kernels_compile_for_sm90_with_any_int_divisibility():
    """Each launch of SM90_PROBLEMS with the divisibility attrs the launcher gives its int args, with
    all of them on and with all off. In a subprocess: triton must load without its interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=300)
    if result.returncode == sm90.SKIP_STATUS:
        pytest.skip(result.stdout.strip())
    assert result.returncode == 0, result.stdout.splitlines()[-1:] + [result.stderr[-3000:]]
    assert result.stdout.splitlines()[-1] == f"compiled {3 * SM90_LAUNCHES}"


class LaunchRecorder:
    """Stands in for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch instead of running it."""

    def __init__(self, kernel, launches):
        self.kernel, self.launches, self.arg_names = kernel, launches, kernel.arg_names
        self.fn = kernel.fn  # Launch reads the parameters' annotations of its float arguments

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((self.kernel, args, kwargs))


def compile_softmax_for_sm90() -> None:
    """Record the arguments ``run()`` passes to each kernel of SM90_PROBLEMS, specialize them as
    Triton's launcher does, and compile each for sm_90 down to a cubin, 3 times: with the launcher's
    divisibility attrs, with every int arg divisible by 16, with none."""
    from triton._utils import find_paths_if

    from opendnn.core.arrays import bind
    from opendnn.families.softmax import triton_backend as kernels
    from opendnn.families.softmax.problem import softmax_problem

    target, backend = sm90.target_or_exit()
    launches = []
    for name in ("softmax_one_pass_kernel", "softmax_stats_kernel", "softmax_apply_kernel"):
        setattr(kernels, name, LaunchRecorder(getattr(kernels, name), launches))
    for algo, axes, dims, backward in SM90_PROBLEMS:
        desc = od.TensorDescriptor("float32", dims)
        count = 3 if backward else 2
        problem = softmax_problem(algo, axes, ["a", "b", "out"][:count], [desc] * count, backward=backward)
        tensors = [bind(f"t{k}", desc, torch.empty(dims), output=k == count - 1) for k in range(count)]
        kernels.run(problem, tensors[:-1], tensors[-1])
    compiled = 0
    for kernel, args, kwargs in launches:
        options, signature, constexprs, attrs = sm90.specialize(kernel, args, kwargs, backend)
        ints = find_paths_if(list(signature.values()), lambda _, kind: kind in ("i32", "i64"))
        pointers = {path: attr for path, attr in attrs.items() if path not in ints}
        patterns = {
            "the launcher's": attrs,
            "all": {**pointers, **{path: [["tt.divisibility", 16]] for path in ints}},
            "no": pointers,
        }
        for pattern, pattern_attrs in patterns.items():
            print(f"compiling {kernel.__name__} {kwargs} with {pattern} int divisibility attrs", flush=True)
            assert "cubin" in sm90.compile_sm90(kernel, signature, constexprs, pattern_attrs, options, target).asm
            compiled += 1
    print("compiled", compiled)


if __name__ == "__main__":
    compile_softmax_for_sm90()
