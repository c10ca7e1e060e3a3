"""Errors of a Pythonic call in the caller's names: the cuDNN-shaped layer's parameter names replaced,
and dtypes spelled as NumPy and torch spell them (``float16``, not cuDNN's ``HALF``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from opendnn.core.dtypes import DataType
from opendnn.core.errors import OpenDnnError

P = ParamSpec("P")
R = TypeVar("R")


class CallerNames:
    """How a Pythonic function names the parameters of the cuDNN-shaped layer it builds on
    (``{"epsilon": "eps", "x_desc": "x", ...}``), so that an error raised there names the caller's
    own parameters: ``raise NAMES.renamed(error) from None`` in an ``except OpenDnnError``. A name
    is replaced where it stands whole (``x_desc`` in ``x_desc.dims[1]``, not in ``dx_desc``)."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names
        alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![\w.])(?:{alternatives})(?!\w)")

    def renamed(self, error: OpenDnnError) -> OpenDnnError:
        """``error`` (same type, status and traceback) with the names in its message replaced."""
        message = self._pattern.sub(lambda match: self.names[match.group(0)], str(error))
        return type(error)(message, error.status).with_traceback(error.__traceback__)


# cuDNN's dtype names (DataType's members) as NumPy and torch spell them (DataType's values)
DTYPE_NAMES = CallerNames({member.name: member.value for member in DataType})


def caller_dtypes(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` whose opendnn errors spell dtypes as NumPy and torch do: ``x.dtype=float16``
    where the cuDNN-shaped layer says ``x_desc.dtype=HALF``. Every function of ``opendnn.functional``
    carries it."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except OpenDnnError as error:
            raise DTYPE_NAMES.renamed(error) from None

    return call
