"""GPU tests (``pytest -m gpu`` on a CUDA machine) of the pointwise, reduce and matmul families beyond the
sample table (tests/test_gpu_samples.py): the Pythonic API against torch on the device, the handle's
fast_math, streams and threads."""

import threading

import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import relative_error

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize(
    "ours, theirs",
    [
        (F.relu, torch.relu),
        (F.gelu, TF.gelu),
        (F.sigmoid, torch.sigmoid),
        (F.tanh, torch.tanh),
        (F.swish, TF.silu),
        (F.elu, TF.elu),
        (lambda x: F.softplus(x), TF.softplus),
    ],
)
def test_activations_match_torch_on_gpu(ours, theirs, dtype, tolerance):
    x = 3 * torch.randn(4096, 1000, device=DEVICE, dtype=dtype)
    expected = theirs(x.double())
    actual = ours(x)
    assert actual.device == x.device and actual.dtype == dtype
    assert ((actual.double() - expected).norm() / expected.norm()).item() < tolerance


@pytest.mark.parametrize("fast_math", [True, False])
def test_the_handles_fast_math_picks_the_16_bit_activation_forms_on_gpu(monkeypatch, fast_math):
    from opendnn.families.pointwise import triton_backend

    chosen = []
    launch = triton_backend.pointwise_launch
    monkeypatch.setattr(
        triton_backend, "pointwise_launch", lambda p, fast=False: chosen.append(fast) or launch(p, fast)
    )
    x = torch.randn(64, 4096, device=DEVICE, dtype=torch.bfloat16)
    y = F.gelu(x, handle=od.create(DEVICE, fast_math=fast_math))
    expected = TF.gelu(x.double())
    assert chosen == [fast_math]
    assert relative_error(y, expected) <= 1e-2


def test_transform_nchw_to_nhwc_matches_torch_on_gpu():
    x = torch.randn(16, 64, 56, 56, device=DEVICE)
    y = F.transform(x, "NHWC")
    assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, x)


def test_work_runs_on_the_handles_stream():
    from triton.runtime import driver

    handle = od.create(DEVICE)
    stream = torch.cuda.Stream()
    handle.set_stream(stream)
    with handle.launching():  # where Triton enqueues the kernels
        assert driver.active.get_current_stream(0) == stream.cuda_stream
    x = torch.randn(1 << 20, device=DEVICE)
    y = torch.full_like(x, float("nan"))
    desc = od.TensorDescriptor("float32", x.shape)
    relu = od.ActivationDescriptor(od.ActivationMode.RELU)
    od.activation_forward(handle, relu, 1.0, desc, x, 0.0, desc, torch.empty_like(x))  # compiled beforehand
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # keeps the handle's stream busy for a while
    od.activation_forward(handle, relu, 1.0, desc, x, 0.0, desc, y)
    assert not stream.query(), "the handle's stream finished at once: the sleep did not hold the work back"
    stream.synchronize()
    assert torch.equal(y, torch.relu(x))
    handle.set_stream(stream.cuda_stream)  # a raw cudaStream_t is accepted too
    assert handle.get_stream().cuda_stream == stream.cuda_stream


def test_threads_with_own_handles_and_streams_match_serial_bitwise():
    inputs = [torch.randn(2048, 999, device=DEVICE) for _ in range(8)]

    def work(x):
        handle = od.create(DEVICE)
        handle.set_stream(torch.cuda.Stream())
        y = torch.empty_like(x)
        desc = od.TensorDescriptor("float32", x.shape)
        act = od.ActivationDescriptor(od.ActivationMode.GELU)
        od.activation_forward(handle, act, 1.0, desc, x, 0.0, desc, y)
        od.activation_backward(handle, act, 2.0, desc, y, desc, y, desc, x, 0.0, desc, y)
        handle.get_stream().synchronize()
        return y

    serial = [work(x) for x in inputs]
    parallel = [None] * len(inputs)

    def run(k):
        parallel[k] = work(inputs[k])

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for one, other in zip(serial, parallel):
        assert torch.equal(one, other)
