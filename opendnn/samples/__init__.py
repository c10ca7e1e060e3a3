"""The table of operation samples: one list drives the test suite, ``pytest -m gpu`` and
``opendnn check``.

Each family module has ``samples(size)`` yielding its samples at ``size`` "small" (the CPU and the
Triton interpreter) or "large" (real sizes on a GPU); ``base`` holds what samples share.
"""

from __future__ import annotations

from collections.abc import Iterator

from opendnn.families.attention import samples as attention
from opendnn.samples import batch_norm, convolution, elementwise, matmul, normalization, pooling, softmax
from opendnn.samples.base import Sample, relative_error

FAMILIES = (elementwise, convolution, matmul, softmax, batch_norm, pooling, normalization, attention)


def samples(size: str = "small") -> Iterator[Sample]:
    """Every family's samples at ``size``: "small" or "large"."""
    for family in FAMILIES:
        yield from family.samples(size)


__all__ = ["FAMILIES", "Sample", "relative_error", "samples"]
