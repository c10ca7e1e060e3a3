"""Errors of a Pythonic call in the caller's names: the cuDNN-shaped layer's parameter names replaced."""

from __future__ import annotations

import re

from opendnn.core.errors import OpenDnnError


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
