"""Tensors reaching past 2^31 - 1 elements are refused by the Triton backend before any launch (its
kernels' element offsets are 32-bit), and computed by the NumPy backend."""

import pytest
import torch

import opendnn as od
import opendnn.functional as F

REACH = 2**31  # elements: the view's last element sits at offset 2^31, one past the 32-bit limit


def far_apart_pair():
    """Two float16 elements 2^31 elements apart in one buffer (4 GiB of address space, two pages touched)."""
    buffer = torch.empty(REACH + 1, dtype=torch.float16)
    view = buffer.as_strided((2,), (REACH,))
    view.copy_(torch.tensor([-1.5, 2.5], dtype=torch.float16))
    return view


def test_triton_refuses_a_tensor_past_32_bit_offsets_before_launching():
    x = far_apart_pair()
    handle = od.create("cpu", backend="triton")
    y = torch.full((2,), float("nan"), dtype=torch.float16)
    desc_x = od.TensorDescriptor("float16", (2,), (REACH,))
    desc_y = od.TensorDescriptor("float16", (2,))
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    with pytest.raises(od.NotSupported, match=r"reaches 2147483649 elements, past the 2\^31 - 1"):
        od.activation_forward(handle, relu, 1.0, desc_x, x, 0.0, desc_y, y)
    assert torch.isnan(y).all()  # nothing was launched


def test_numpy_backend_computes_a_tensor_past_32_bit_offsets():
    x = far_apart_pair()
    assert F.relu(x, handle=od.create("cpu", backend="numpy")).tolist() == [0.0, 2.5]
