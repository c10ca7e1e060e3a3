"""API logging configured by environment, as cuDNN's is.

``OPENDNN_LOGLEVEL``: 0 off (default), 1 errors, 2 warnings, 3 info (every API call with its
descriptors and the backend and kernel chosen). ``OPENDNN_LOGDEST``: ``stderr`` (default),
``stdout`` or a file path (appended to).
"""

from __future__ import annotations

import functools
import logging
import os
import sys

ERROR, WARNING, INFO = 1, 2, 3
_LEVELS = {ERROR: logging.ERROR, WARNING: logging.WARNING, INFO: logging.INFO}


@functools.cache
def logger() -> logging.Logger:
    """The "opendnn" logger, set up from the environment on first use."""
    log = logging.getLogger("opendnn")
    level = int(os.environ.get("OPENDNN_LOGLEVEL", "0") or 0)
    if level <= 0:
        log.setLevel(logging.CRITICAL + 1)
        return log
    destination = os.environ.get("OPENDNN_LOGDEST", "stderr")
    if destination in ("stdout", "stderr"):
        handler: logging.Handler = logging.StreamHandler(getattr(sys, destination))
    else:
        handler = logging.FileHandler(destination)
    handler.setFormatter(logging.Formatter("opendnn %(levelname)s %(asctime)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(_LEVELS[min(level, INFO)])
    log.propagate = False
    return log


def enabled(level: int = INFO) -> bool:
    return logger().isEnabledFor(_LEVELS[level])
