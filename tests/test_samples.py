"""Every sample of the operation table, on both backends, against the float64 reference."""

import zlib

import numpy as np
import pytest

import opendnn as od
from opendnn.samples import error_samples, relative_error, samples

SAMPLES = list(samples())


@pytest.mark.parametrize("backend", ["numpy", "triton"])
@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_sample_matches_float64_reference(sample, backend):
    actual, expected = sample.run(od.create("cpu", backend=backend), seed=zlib.crc32(sample.name.encode()))
    error = relative_error(actual, expected)
    assert error <= sample.tolerance, f"relative error {error:.3g} above {sample.tolerance:g}"


def test_relative_error_fails_unwritten_nan_and_wrong_values():
    expected = np.arange(1.0, 7.0)
    assert relative_error(expected, expected) == 0.0
    assert relative_error(np.where(expected > 3, np.nan, expected), expected) == np.inf
    assert relative_error(expected * 1.01, expected) == pytest.approx(0.01)


ERRORS = list(error_samples())


@pytest.mark.parametrize("sample", ERRORS, ids=[s.name for s in ERRORS])
def test_error_sample_raises_its_error_and_leaves_its_arrays_alone(sample):
    arguments = sample.arguments()
    arrays = [(a, a.copy()) for a in arguments.values() if isinstance(a, np.ndarray)]
    with pytest.raises(sample.error) as raised:
        sample.call(**arguments)
    assert sample.fragment in str(raised.value)
    for array, before in arrays:
        np.testing.assert_array_equal(array, before)
