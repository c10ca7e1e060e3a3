"""The sample table on a CUDA device (``pytest -m gpu``): every family's "large" samples on the Triton
backend, each against the float64 reference within the sample's tolerance. The same table runs on the
CPU (tests/test_samples.py) and through ``opendnn check``."""

import zlib

import pytest

import opendnn as od
from opendnn.samples import relative_error, samples

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
SAMPLES = list(samples("large"))


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_matches_float64_reference_on_gpu(sample):
    actual, expected = sample.run(od.create(DEVICE), seed=zlib.crc32(sample.name.encode()))
    error = relative_error(actual, expected)
    assert error <= sample.tolerance, f"relative error {error:.3g} above {sample.tolerance:g}"
