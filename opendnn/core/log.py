"""API logging through the standard ``logging`` module, on the "opendnn" logger.

As a library, opendnn gives its logger only a ``NullHandler``: handlers, level and propagation
belong to the application (``logging.getLogger("opendnn").setLevel(logging.INFO)`` and a handler
on it or on the root logger show every API call with its descriptors and the backend chosen).

``OPENDNN_LOGLEVEL``, read on first use, is a convenience on top, as cuDNN's logging is configured:
0 or unset adds nothing; 1 errors, 2 warnings, 3 info set the logger's level and attach a handler
at that level writing to ``OPENDNN_LOGDEST``: ``stderr`` (default), ``stdout`` or a file path
(appended to).
"""

from __future__ import annotations

import functools
import logging
import os
import sys

ERROR, WARNING, INFO = 1, 2, 3
_LEVELS = {ERROR: logging.ERROR, WARNING: logging.WARNING, INFO: logging.INFO}
NAME = "opendnn"


@functools.cache
def logger() -> logging.Logger:
    """The "opendnn" logger: a ``NullHandler``, plus the ``OPENDNN_LOGLEVEL`` handler when that is set."""
    log = logging.getLogger(NAME)
    log.addHandler(logging.NullHandler())
    level = int(os.environ.get("OPENDNN_LOGLEVEL", "0") or 0)
    if level > 0:
        destination = os.environ.get("OPENDNN_LOGDEST", "stderr")
        if destination in ("stdout", "stderr"):
            handler: logging.Handler = logging.StreamHandler(getattr(sys, destination))
        else:
            handler = logging.FileHandler(destination)
        handler.setFormatter(logging.Formatter("opendnn %(levelname)s %(asctime)s %(message)s"))
        handler.setLevel(_LEVELS[min(level, INFO)])
        log.addHandler(handler)
        log.setLevel(_LEVELS[min(level, INFO)])
    return log


def enabled(level: int = INFO) -> bool:
    """Whether the logger passes records of ``level`` (ERROR, WARNING or INFO) on."""
    return logger().isEnabledFor(_LEVELS[level])
