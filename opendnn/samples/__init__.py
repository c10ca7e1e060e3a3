"""The table of operation samples: one list drives the test suite, ``pytest -m gpu`` and
``opendnn check``.

Each family's ``opendnn/families/<family>/samples.py`` has ``samples(size)`` yielding its samples at
``size`` "small" (the CPU and the Triton interpreter) or "large" (real sizes on a GPU),
and ``error_samples()``, the calls that must fail with a given error and message;
``opendnn.core.samples`` holds what samples share.
"""

from __future__ import annotations

from collections.abc import Iterator

from opendnn.core.samples import ErrorSample, Sample, relative_error
from opendnn.families.attention import samples as attention
from opendnn.families.batch_norm import samples as batch_norm
from opendnn.families.convolution import samples as convolution
from opendnn.families.lrn import samples as lrn
from opendnn.families.matmul import samples as matmul
from opendnn.families.normalization import samples as normalization
from opendnn.families.pointwise import samples as pointwise
from opendnn.families.pooling import samples as pooling
from opendnn.families.reduce import samples as reduce
from opendnn.families.resample import samples as resample
from opendnn.families.softmax import samples as softmax

FAMILIES = (
    pointwise,
    reduce,
    convolution,
    matmul,
    softmax,
    batch_norm,
    pooling,
    normalization,
    lrn,
    attention,
    resample,
)


def samples(size: str = "small") -> Iterator[Sample]:
    """Every family's samples at ``size``: "small" or "large"."""
    for family in FAMILIES:
        yield from family.samples(size)


def error_samples() -> Iterator[ErrorSample]:
    """Every family's error samples."""
    for family in FAMILIES:
        yield from family.error_samples()


__all__ = ["FAMILIES", "ErrorSample", "Sample", "error_samples", "relative_error", "samples"]
