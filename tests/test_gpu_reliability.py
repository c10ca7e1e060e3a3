"""GPU reliability (``pytest -m gpu``): every sample of the table is bitwise repeatable on one handle and
across two handles on two streams, eight threads with their own handles and streams match a serial run
bitwise, and tensors past 2^31 elements either compute correctly or are refused before any launch."""

import threading
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import opendnn as od
import opendnn.functional as F
from opendnn.samples import samples

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
SAMPLES = list(samples("large"))
REPEATS = 10
THREADS = 8


def _seed(sample):
    return zlib.crc32(sample.name.encode())


def _run_on_stream(sample, handle, stream):
    """The sample's output with its inputs made and its kernels enqueued on ``stream``."""
    handle.set_stream(stream)
    with torch.cuda.stream(stream):
        actual, _ = sample.run(handle, seed=_seed(sample))
    stream.synchronize()
    return actual


def _assert_bitwise_equal(first, other, what):
    assert first.shape == other.shape, what
    assert np.array_equal(first.view(np.uint64), other.view(np.uint64)), f"{what}: results differ bitwise"


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_repeats_bitwise_on_one_handle_and_across_two_streams(sample):
    handle = od.create(DEVICE)
    first = _run_on_stream(sample, handle, torch.cuda.Stream())
    for repeat in range(1, REPEATS):
        _assert_bitwise_equal(first, _run_on_stream(sample, handle, torch.cuda.Stream()), f"run {repeat}")
    other_handle = od.create(DEVICE)
    _assert_bitwise_equal(first, _run_on_stream(sample, other_handle, torch.cuda.Stream()), "second handle")


def test_threads_with_own_handles_and_streams_match_a_serial_run_bitwise():
    table = SAMPLES[:: max(1, len(SAMPLES) // 64)]  # every family, a spread of its samples
    serial = [_run_on_stream(sample, od.create(DEVICE), torch.cuda.Stream()) for sample in table]
    results: list[list[np.ndarray] | None] = [None] * THREADS
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            handle, stream = od.create(DEVICE), torch.cuda.Stream()
            order = table[k:] + table[:k]  # threads start at different samples, so their launches mix
            outputs = {sample.name: _run_on_stream(sample, handle, stream) for sample in order}
            results[k] = [outputs[sample.name] for sample in table]
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for k, outputs in enumerate(results):
        assert outputs is not None
        for sample, expected, actual in zip(table, serial, outputs):
            _assert_bitwise_equal(expected, actual, f"thread {k}, {sample.name}")


# Past 2^31 elements: 32-bit offsets wrap. Each case builds its inputs on the GPU, runs opendnn and
# torch, and compares rows of the result at the start, the middle and past the 2^31 boundary.
BIG = (1 << 31) + 4096


def _compare(actual, expected, tolerance):
    rows = torch.tensor([0, actual.shape[0] // 2, actual.shape[0] - 1], device=actual.device)
    a, e = actual.index_select(0, rows).double(), expected.index_select(0, rows).double()
    assert ((a - e).norm() / e.norm()).item() <= tolerance


def _pointwise():
    x = torch.randn(BIG, dtype=torch.float16, device=DEVICE)
    return F.gelu(x).view(-1, 4096), TF.gelu(x.float()).view(-1, 4096), 1e-2


def _transform():
    x = torch.randn(BIG // 4096, 4096, dtype=torch.float16, device=DEVICE)
    return F.transform(x, (1, 0)), x, 0.0


def _softmax():
    x = torch.randn(BIG // 4096, 4096, dtype=torch.float16, device=DEVICE)
    return F.softmax(x, dim=-1), torch.softmax(x.float(), dim=-1), 1e-2


def _batch_norm():
    x = torch.randn(BIG // (64 * 64 * 16), 16, 64, 64, dtype=torch.float16, device=DEVICE)
    result = F.batch_norm(x, training=True)
    result = result[0] if isinstance(result, tuple) else result
    return result, TF.batch_norm(x.float(), None, None, training=True), 2e-2


def _pooling():
    x = torch.randn(BIG // (64 * 64 * 16), 16, 64, 64, dtype=torch.float16, device=DEVICE)
    return F.max_pool(x, 2), TF.max_pool2d(x, 2), 0.0


def _convolution():
    x = torch.randn(BIG // (64 * 64 * 16), 16, 64, 64, dtype=torch.float16, device=DEVICE)
    w = torch.randn(16, 16, 3, 3, dtype=torch.float16, device=DEVICE)
    return F.conv(x, w, padding=1), TF.conv2d(x, w, padding=1), 1e-2


def _matmul():
    a = torch.randn(BIG // 4096, 4096, dtype=torch.float16, device=DEVICE)
    b = torch.randn(4096, 64, dtype=torch.float16, device=DEVICE)
    return F.matmul(a, b), a @ b, 1e-2


@pytest.mark.parametrize(
    "case",
    [_pointwise, _transform, _softmax, _batch_norm, _pooling, _convolution, _matmul],
    ids=lambda case: case.__name__.strip("_"),
)
def test_tensors_past_two_to_the_31_elements_compute_correctly_or_are_refused(case):
    try:
        actual, expected, tolerance = case()
    except od.NotSupported as refusal:
        assert "2^31" in str(refusal) or "elements" in str(refusal), refusal
        return
    finally:
        torch.cuda.synchronize()
    _compare(actual, expected, tolerance)
    del actual, expected
    torch.cuda.empty_cache()
