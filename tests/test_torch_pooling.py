"""Max pooling through opendnn.torch side by side with torch's: the modules (converted), the functions
``functional_calls()`` routes and the aten operators ``enable()`` routes, 1-D to 3-D, padding, ceil_mode,
dilation 2 and 3, return_indices, unbatched inputs, channels-last memory, inputs with NaN and
infinities; outputs and indices bit for bit, input gradients (training) to float64 rounding, and the
same outputs without a gradient (eval)."""

import copy

import pytest
import torch
import torch.nn.functional as TF

import opendnn.torch as ot

nn = torch.nn

# name: (spatial dims, the pooling's options, an input shape of odd sizes)
CASES = {
    "1d_dilated_ceil": (1, {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True}, (2, 3, 12)),
    "1d_dilation_3": (1, {"kernel_size": 2, "stride": 1, "padding": 1, "dilation": 3}, (2, 3, 11)),
    "2d_ceil": (2, {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, (2, 3, 9, 8)),
    "2d_dilated": (
        2,
        {"kernel_size": (3, 2), "stride": (1, 2), "padding": 1, "dilation": (2, 3), "ceil_mode": True},
        (2, 3, 9, 8),
    ),
    "2d_dilation_3_stride_3": (
        2,
        {"kernel_size": 2, "stride": 3, "padding": 1, "dilation": 3, "ceil_mode": True},
        (2, 2, 10, 9),
    ),
    "3d_dilated": (
        3,
        {"kernel_size": 2, "stride": 2, "padding": 1, "dilation": (1, 2, 3), "ceil_mode": True},
        (1, 2, 7, 6, 7),
    ),
    "3d": (3, {"kernel_size": (2, 3, 2), "stride": 1, "padding": (1, 1, 0)}, (2, 2, 4, 5, 3)),
}
GRADIENT_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-6}  # (sums of a few dy, in another order)
MODULES = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
FUNCTIONS = {1: TF.max_pool1d, 2: TF.max_pool2d, 3: TF.max_pool3d}


def pair(theirs: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(torch's max pooling module, its converted copy)."""
    ours = copy.deepcopy(theirs)
    assert ot.convert(ours).converted == [("", type(theirs).__name__)]
    return theirs, ours


def case(name: str, return_indices: bool) -> tuple[nn.Module, nn.Module, int, tuple[int, ...]]:
    """(torch's module of CASES[name], its converted copy, the spatial dims, the input shape)."""
    spatial, options, shape = CASES[name]
    return *pair(MODULES[spatial](**options, return_indices=return_indices)), spatial, shape


def with_nonfinite(shape: tuple[int, ...], seed: int, nan: int = 1) -> torch.Tensor:
    """3 * randn with ``nan`` NaNs, a +inf and a block of -inf (windows of -inf alone) at random places."""
    gen = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(shape, generator=gen, dtype=torch.float64)
    x[(0, 0, *(slice(0, 3),) * (len(shape) - 2))] = -float("inf")
    flat = x.view(-1)
    places = torch.randperm(flat.numel(), generator=gen)[: nan + 1]
    flat[places[:-1]] = float("nan")
    flat[places[-1]] = float("inf")
    return x


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, exact: bool = True) -> None:
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    assert torch.equal(ours.isnan(), theirs.isnan()), "NaN in other places than torch's"
    if exact:
        assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    else:  # a gradient: the windows' dy summed in another order
        tolerance = GRADIENT_TOLERANCE[ours.dtype]
        torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance, equal_nan=True)


def run(call, x: torch.Tensor, seed: int = 0) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(call's outputs, x's gradient for a random gradient of the first output)."""
    x = x.clone().requires_grad_()
    outputs = call(x)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    dy = torch.randn(outputs[0].shape, generator=torch.Generator().manual_seed(seed), dtype=x.dtype).to(x.device)
    outputs[0].backward(dy)
    return tuple(t.detach() for t in outputs), x.grad


def assert_runs_as_torchs(ours, theirs, x: torch.Tensor, torchs_input: torch.Tensor | None = None) -> None:
    """Outputs (and indices) bit for bit, the input gradient, and the outputs without a gradient
    (torch's of ``torchs_input`` where given: the same values in another memory order)."""
    (outputs, dx), (expected, dx_expected) = run(ours, x), run(theirs, x if torchs_input is None else torchs_input)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert_same(got, want)
    assert_same(dx, dx_expected, exact=False)
    with torch.no_grad():
        evaluated = ours(x)
    for got, want in zip(evaluated if isinstance(evaluated, tuple) else (evaluated,), expected):
        assert_same(got, want)


@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("name", CASES)
def test_converted_max_pool_modules_are_torchs(name, return_indices):
    theirs, ours, _, shape = case(name, return_indices)
    for seed in range(3):
        assert_runs_as_torchs(ours, theirs, with_nonfinite(shape, seed))
    unbatched = with_nonfinite(shape[1:], seed=3)
    assert_runs_as_torchs(ours, theirs, unbatched)


@pytest.mark.parametrize("name", CASES)
def test_indices_and_their_gradient_are_torchs_in_windows_of_many_nans(name):
    """torch's index of a window holding NaN is its last NaN, and the gradient goes there."""
    theirs, ours, _, shape = case(name, return_indices=True)
    x = with_nonfinite(shape, seed=4, nan=torch.Size(shape).numel() // 4)
    assert_runs_as_torchs(ours, theirs, x)


def test_without_indices_a_window_of_several_nans_passes_its_gradient_to_the_first():
    """cuDNN's backward (the first position equal to y, NaN matching NaN), where torch's index is the
    window's last NaN; with return_indices the gradient follows the indices, as torch's."""
    x = torch.tensor([[[float("nan"), float("nan"), 1.0, 2.0]]], dtype=torch.float64)
    dy = torch.tensor([[[0.5, 0.25]]], dtype=torch.float64)

    def gradient(pool) -> list[float]:
        x_grad = x.clone().requires_grad_()
        y = pool(x_grad)
        (y[0] if isinstance(y, tuple) else y).backward(dy)
        return x_grad.grad[0, 0].tolist()

    assert gradient(ot.MaxPool1d(2)) == [0.5, 0.0, 0.0, 0.25]
    assert gradient(ot.MaxPool1d(2, return_indices=True)) == [0.0, 0.5, 0.0, 0.25]
    assert gradient(nn.MaxPool1d(2)) == gradient(nn.MaxPool1d(2, return_indices=True)) == [0.0, 0.5, 0.0, 0.25]


def test_a_channels_last_input_gives_torchs_values_and_keeps_its_memory_order():
    theirs, ours = pair(nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True, return_indices=True))
    x = with_nonfinite((2, 5, 9, 8), seed=5).contiguous(memory_format=torch.channels_last)
    assert_runs_as_torchs(ours, theirs, x)
    y, indices = ours(x)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert indices.is_contiguous(memory_format=torch.channels_last)


def test_float32_gives_torchs_values_indices_and_gradients():
    theirs, ours = pair(nn.MaxPool3d(2, 1, 1, dilation=2, return_indices=True))
    x = with_nonfinite((1, 2, 5, 6, 4), seed=6).float()
    assert_runs_as_torchs(ours, theirs, x)


@pytest.mark.parametrize("route", ["functional_calls", "enable"])
@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("name", CASES)
def test_routed_max_pool_functions_are_torchs(name, return_indices, route):
    spatial, options, shape = CASES[name]
    function = FUNCTIONS[spatial]

    def call(x):
        return function(x, **options, return_indices=return_indices)

    def routed(x):
        if route == "functional_calls":
            with ot.functional_calls() as calls:
                outputs = call(x)
            assert sum(calls.routed.values()) == 1, calls.left_to_torch
            return outputs
        with ot.enabled(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            outputs = call(x)
        assert any(event.name.startswith("opendnn::max_pool") for event in profile.events())
        return outputs

    for x in (with_nonfinite(shape, seed=7), with_nonfinite(shape[1:], seed=8)):  # batched and unbatched
        assert_runs_as_torchs(routed, call, x)


def test_enable_routes_max_pooling_with_indices_to_opendnn():
    x = with_nonfinite((2, 3, 9, 8), seed=9).requires_grad_()
    with ot.enabled(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        y, _ = TF.max_pool2d(x, 3, 2, 1, dilation=2, return_indices=True)
        y.sum().backward()
    called = {event.name for event in profile.events() if event.name.startswith("opendnn::")}
    assert {"opendnn::max_pool_with_indices", "opendnn::max_pool_indices_backward"} <= called


@pytest.mark.parametrize("with_indices", [False, True])
def test_a_padding_over_half_the_kernel_is_refused_as_torch_refuses_it(with_indices):
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="pad should be"):
        TF.max_pool2d(x, 3, 1, 2, return_indices=with_indices)
    pool = ot.functions.max_pool_with_indices if with_indices else ot.functions.max_pool
    with pytest.raises(RuntimeError, match=r"padding\[0\]=2 must be at most half of kernel_size\[0\]=3"):
        pool(x, 3, 1, 2)


@pytest.mark.parametrize("route", ["enable", "functional_calls", "convert"])
def test_an_average_pooling_padded_over_half_its_kernel_is_refused_as_torch_refuses_it(route):
    x = torch.randn(1, 2, 7, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="pad should be"):
        TF.avg_pool2d(x, 3, 1, (1, 2))
    converted = nn.Sequential(nn.AvgPool2d(3, 1, (1, 2)))
    ot.convert(converted)
    calls = {
        "enable": lambda: ot.enabled(),
        "functional_calls": lambda: ot.functional_calls(),
        "convert": lambda: torch.no_grad(),
    }
    call = converted if route == "convert" else lambda t: TF.avg_pool2d(t, 3, 1, (1, 2))
    with (
        calls[route](),
        pytest.raises(RuntimeError, match=r"padding\[1\]=2 must be at most half of kernel_size\[1\]=3"),
    ):
        call(x)


@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
def test_an_empty_batch_gives_torchs_empty_results(return_indices):
    theirs, ours = pair(nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True, return_indices=return_indices))
    x = torch.randn(0, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    outputs, expected = ours(x), theirs(x)
    for got, want in zip(*(o if return_indices else (o,) for o in (outputs, expected))):
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    (outputs[0] if return_indices else outputs).sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("return_indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("name", CASES)
def test_on_cuda_converted_max_pool_modules_are_torchs(name, return_indices):
    theirs, ours, spatial, shape = case(name, return_indices)
    layouts = (torch.contiguous_format, torch.channels_last) if spatial == 2 else (torch.contiguous_format,)
    nans = (1, torch.Size(shape).numel() // 4) if return_indices else (1,)  # (without indices: windows of one NaN)
    for layout in layouts:
        for nan in nans:
            x = with_nonfinite(shape, seed=nan, nan=nan).to("cuda", torch.float32).contiguous(memory_format=layout)
            # torch's channels-last CUDA kernel gives a window of -inf alone the index 0, inside the
            # window or not (its contiguous kernel and its CPU kernel give the window's first tap, as
            # opendnn does): torch's answer is its contiguous kernel's
            assert_runs_as_torchs(ours, theirs, x, x.contiguous())
