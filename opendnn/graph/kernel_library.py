"""The library's shared Triton pieces that the fusion engine builds on: the activations' Triton
forms and the elementary functions the generated kernels import, and the planned launch that runs
them with the least host work. Loading this module loads triton."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from opendnn.core.cache_folder import user_cache_folder
from opendnn.kernels import activation as activation_forms
from opendnn.kernels import blend
from opendnn.kernels import math as triton_math
from opendnn.kernels.launch import Launch, Slot

LIBRARY = {"math": triton_math.__name__, "activation": activation_forms.__name__, "blend": blend.__name__}
CACHE_VARIABLE = "OPENDNN_GRAPH_KERNELS"
CACHE_FOLDER_NAME = "graph_kernels"  # in opendnn's user cache folder, unless CACHE_VARIABLE names another

__all__ = ["LIBRARY", "Launch", "Slot", "load_kernel"]


def kernel_path(source: str) -> Path:
    """Where a generated source lives: ``$OPENDNN_GRAPH_KERNELS``, else ``graph_kernels`` in opendnn's
    user cache folder (``$OPENDNN_CACHE_DIR`` or the platform's, ``opendnn.core.cache_folder``); one
    file per source, named by its hash."""
    folder = os.environ.get(CACHE_VARIABLE)
    directory = Path(folder).expanduser() if folder else user_cache_folder() / CACHE_FOLDER_NAME
    return directory / f"fused_{hashlib.sha256(source.encode()).hexdigest()[:24]}.py"


def load_kernel(source: str) -> Any:
    """The ``fused_kernel`` of ``source``: written to its cache file (Triton's JIT reads a kernel's
    source from its file) and loaded from there."""
    path = kernel_path(source)
    if not path.exists() or path.read_text() != source:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(source)
        os.replace(partial, path)  # atomic: another process never reads half a file
    spec = importlib.util.spec_from_file_location(f"opendnn_graph_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the generated kernel {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_kernel
