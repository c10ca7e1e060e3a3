"""For the GPU tests of handles driven from threads: jobs run at once, each on its own thread with
its own handle on a new stream of its device."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

import opendnn as od

REPEATS = 3  # each job runs this many times, so the threads' launches interleave


def run_on_own_streams(
    devices: list[str], job: Callable[[int, od.Handle], list[torch.Tensor]]
) -> list[list[torch.Tensor] | None]:
    """job(k, handle) for k = 0 .. len(devices) - 1, each on its own thread, its handle on a new
    stream of devices[k]; the last run's results per job (None where the thread failed)."""
    results: list[list[torch.Tensor] | None] = [None] * len(devices)

    def run(k: int) -> None:
        handle = od.create(devices[k])
        handle.set_stream(torch.cuda.Stream(devices[k]))
        for _ in range(REPEATS):
            results[k] = job(k, handle)
        handle.get_stream().synchronize()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(devices))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results
