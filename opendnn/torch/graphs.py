"""CUDA graphs: capture a step that runs on opendnn (or anything else torch can capture) once, then
replay it without the Python that launches its kernels.

opendnn does no host synchronization and no host-to-device copy inside its calls, allocates through
torch's caching allocator (the graph's private pool while capturing) and launches on the current
stream, so ``torch.cuda.graph`` records every kernel of a converted model's forward, backward and
optimizer step. Run autocast with ``cache_enabled=False`` inside a captured step, as torch asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture(step: Callable[[], Any], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """torch's whole-network capture recipe: ``warmup`` eager calls of ``step`` on a side stream
    (they compile the kernels and let an optimizer create its state), then one call captured:
    recorded, not run.

    Returns:
        the graph (``graph.replay()`` runs the step on whatever its input tensors hold now) and what
        the captured call returned, whose tensors hold each replay's results.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph, output
