"""The table of operation samples: one list drives the test suite, ``pytest -m gpu`` and
``opendnn check``.

Each family module has ``samples(size)`` yielding its samples at ``size`` "small" (the CPU and the
Triton interpreter) or "large" (real sizes on a GPU), and ``error_samples()``, the calls that must
fail with a given error and message; ``base`` holds what samples share.
"""

from __future__ import annotations

from collections.abc import Iterator

from opendnn.samples import batch_norm, convolution, elementwise, matmul, normalization, pooling, softmax
from opendnn.samples.base import ErrorSample, Sample, relative_error

FAMILIES = (elementwise, convolution, matmul, softmax, batch_norm, pooling, normalization)


def samples(size: str = "small") -> Iterator[Sample]:
    """Every family's samples at ``size``: "small" or "large"."""
    for family in FAMILIES:
        yield from family.samples(size)


def error_samples() -> Iterator[ErrorSample]:
    """Every family's error samples."""
    for family in FAMILIES:
        yield from family.error_samples()


__all__ = ["FAMILIES", "ErrorSample", "Sample", "error_samples", "relative_error", "samples"]
