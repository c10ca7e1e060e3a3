"""Capturing a built plan's launches into a CUDA graph (``Graph.populate_cuda_graph``).

A plan launches on the handle's stream (or the current one), does no host synchronization and no
host-to-device copy, so its launches record as they are. What a capture cannot hold is Triton's
compilation of a kernel for a new pointer alignment: one eager run on the capturing stream comes
first, with the same tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opendnn.core.handle import Handle


def capture_cuda_graph(run: Callable[[], None], handle: Handle, cuda_graph: Any = None) -> Any:
    """``run`` once eagerly, then captured into ``cuda_graph`` (a new ``torch.cuda.CUDAGraph`` when
    None) on the handle's stream, or a side stream of its device when it has none (a capture cannot
    run on the default stream); returns the graph."""
    import torch

    stream = handle.get_stream()
    capturing = stream if stream is not None else torch.cuda.Stream(handle.device)
    capturing.wait_stream(torch.cuda.current_stream(handle.device))
    with torch.cuda.device(handle.device), torch.cuda.stream(capturing):
        run()
    graph = cuda_graph if cuda_graph is not None else torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capturing):
        run()
    torch.cuda.current_stream(handle.device).wait_stream(capturing)
    return graph
