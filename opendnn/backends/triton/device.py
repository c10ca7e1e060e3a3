"""What the launchers ask of the GPU: its multiprocessor count, to size persistent grids."""

from __future__ import annotations

import functools


@functools.cache  # a property of the hardware, asked on every launch
def multiprocessors(device_index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)
