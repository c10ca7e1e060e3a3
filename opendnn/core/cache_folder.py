"""opendnn's folder of files kept between runs: the convolution algorithm cache and the graph engine's
generated kernels live under it (each may be moved alone by its own variable, docs/environment.md).

The folder is ``$OPENDNN_CACHE_DIR`` when set (not empty), else the platform's user cache folder:
platformdirs' ``user_cache_dir("opendnn")`` where platformdirs is installed (``$XDG_CACHE_HOME/opendnn``,
default ``~/.cache/opendnn``, on Linux; ``~/Library/Caches/opendnn`` on macOS; the local application
data folder on Windows), else ``$XDG_CACHE_HOME/opendnn``, else ``~/.cache/opendnn``. It is read from
the environment on every call, so a process (a test run) may move it at any time.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_VARIABLE = "OPENDNN_CACHE_DIR"
APP_NAME = "opendnn"


def user_cache_folder() -> Path:
    """The folder opendnn keeps its caches in (not created here: a cache creates it when it writes)."""
    override = os.environ.get(CACHE_DIR_VARIABLE)
    if override:
        return Path(override).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / APP_NAME
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
