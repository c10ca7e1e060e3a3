"""The per-call host path's caches: shared default handles, memoized descriptors and problems,
zero-copy batch norm parameters. Each cache must give what the uncached code gave."""

import numpy as np
import pytest
import torch

import opendnn as od
import opendnn.functional as F
from opendnn.core.arrays import descriptor_of, wrap
from opendnn.core.default_handle import handle_for, shared_handle
from opendnn.core.memo import memoized
from opendnn.families.pointwise.problem import PointwiseMode, PointwiseProblem


def test_default_handle_is_shared_per_device_and_follows_the_backend_variable(monkeypatch):
    x = wrap("x", np.ones((2, 3), np.float32))
    assert handle_for(x, None) is handle_for(x, None)
    monkeypatch.setenv("OPENDNN_BACKEND", "numpy")
    numpy_handle = handle_for(x, None)
    monkeypatch.setenv("OPENDNN_BACKEND", "triton")
    assert handle_for(x, None).backend == "triton" and numpy_handle.backend == "numpy"
    assert shared_handle("cpu", od.MathType.TENSOR_OP).math_type is od.MathType.TENSOR_OP
    mine = od.create("cpu")
    assert handle_for(x, mine) is mine


def test_memoized_descriptors_are_equal_values_and_errors_still_name_the_array():
    a, b = torch.ones(4, 3).t(), torch.zeros(4, 3).t()
    assert descriptor_of(a) is descriptor_of(b) and descriptor_of(a).strides == (1, 3)
    assert descriptor_of(a, "x") == od.TensorDescriptor("float32", (3, 4), (1, 3))
    with pytest.raises(od.BadParam, match="y.shape=.* must have no empty dimension"):
        descriptor_of(torch.ones(0, 3), "y")
    with pytest.raises(od.BadParam, match="z.shape"):
        descriptor_of(torch.ones(0, 3), "z")  # the failure is not cached under another name


def test_memoized_calls_unhashable_arguments_directly_and_raises_every_time():
    calls = []

    @memoized
    def total(values):
        calls.append(values)
        if not values:
            raise od.BadParam("values must not be empty")
        return sum(values)

    assert total((1, 2)) == total((1, 2)) == 3 and len(calls) == 1
    assert total([1, 2]) == 3 and len(calls) == 2
    for _ in range(2):
        with pytest.raises(od.BadParam):
            total(())
    assert len(calls) == 4


def test_problems_hash_once_and_compare_by_value():
    d = od.TensorDescriptor("float32", (2, 3))
    first, second = PointwiseProblem(PointwiseMode.ADD, (d, d), d), PointwiseProblem(PointwiseMode.ADD, (d, d), d)
    assert first == second and hash(first) == hash(second) and {first: 1}[second] == 1
    assert PointwiseProblem(PointwiseMode.SUB, (d, d), d) != first


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.float64])
def test_batch_norm_reads_float32_parameters_in_place_and_converts_others(weight_dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.rand(3, dtype=weight_dtype) + 0.5, torch.randn(3, dtype=weight_dtype)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    expected = torch.nn.functional.batch_norm(x.double(), mean.double(), var.double(), weight.double(), bias.double())
    before = (weight.clone(), bias.clone())
    y = F.batch_norm(x, mean, var, weight, bias)
    assert torch.allclose(y.double(), expected, atol=1e-5)
    assert torch.equal(weight, before[0]) and torch.equal(bias, before[1])


def test_torchs_argument_forms_resolve_once_and_a_refused_form_is_named_as_given():
    from opendnn.torch import functions

    window = functions.max_pool_window(2, 3, 2, 1)
    assert window == ((3, 3), (2, 2), (1, 1), (1, 1)) and functions.max_pool_window(2, 3, 2, 1) is window
    as_lists = functions.max_pool_window(2, [3, 3], [2, 2], [1, 1], [1, 1])  # (aten's int[] arguments)
    assert as_lists == window and functions.max_pool_window(2, [3, 3], [2, 2], [1, 1], [1, 1]) is as_lists
    for _ in range(2):  # (a refusal is resolved again, never kept)
        with pytest.raises(od.BadParam, match=r"kernel_size=\[3, 3, 3\] must be an int or 2 ints"):
            functions.max_pool_window(2, [3, 3, 3], [], [1, 1], [1, 1])
        with pytest.raises(od.BadParam, match=r"padding\[0\]=2 must be at most half of kernel_size\[0\]=3"):
            functions.max_pool_window(2, (3, 3), None, (2, 2))


def test_a_convolutions_gradient_from_a_sum_keeps_x_channels_last():
    import opendnn.torch as ot

    generator = torch.Generator().manual_seed(3)
    x64 = torch.randn(2, 4, 5, 6, generator=generator, dtype=torch.float64)
    x64 = x64.contiguous(memory_format=torch.channels_last).requires_grad_()
    w64 = torch.randn(6, 4, 3, 3, generator=generator, dtype=torch.float64).requires_grad_()
    x, w = x64.detach().float().requires_grad_(), w64.detach().float().requires_grad_()
    # .sum()'s gradient is a stride-0 expansion; autograd.grad hands back dx as the backward made it
    ours = torch.autograd.grad(ot.functions.conv(x, w, None, 1, 1).sum(), (x, w))
    reference = torch.autograd.grad(torch.nn.functional.conv2d(x64, w64, None, 1, 1).sum(), (x64, w64))
    assert ours[0].is_contiguous(memory_format=torch.channels_last) and not ours[0].is_contiguous()
    for mine, theirs in zip(ours, reference):
        assert ((mine.double() - theirs).norm() / theirs.norm()).item() < 1e-5
