"""Handles are independent: threads each with their own handle reproduce a serial run bitwise."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

import opendnn as od
import opendnn.functional as F


def work(seed: int) -> np.ndarray:
    handle = od.create("cpu", backend="numpy")
    x = np.random.default_rng(seed).normal(size=(64, 33)).astype(np.float32)
    y = F.gelu(F.add(x, x[:1], handle=handle), handle=handle)
    desc = od.TensorDescriptor("float32", y.shape)
    od.scale_tensor(handle, desc, y, 0.5)
    return y


def test_threads_with_their_own_handles_match_serial_runs_bitwise():
    serial = [work(seed) for seed in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(work, range(16)))
    for one, other in zip(serial, parallel):
        np.testing.assert_array_equal(one, other)
