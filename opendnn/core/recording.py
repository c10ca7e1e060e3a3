"""The scope in which a call's launches are recorded, to be replayed without the call's Python.

``opendnn.torch`` keeps, per signature of a plain eager call, an executable: the call's outputs'
allocations and its kernel launches with the tensors of each (docs/design/torch_host_path.md). It
learns them by running the call once inside ``recording(recorder)``, where the layers below report
to the recorder:

- every ``Launch`` (kernels/launch.py) hands itself and its tensors to ``recorder.launched``, which
  runs it;
- ``dispatch`` reports each problem it runs and the handle it runs on (``recorder.dispatched``): an
  executable is kept on that handle alone, and a warmup collects the problems;
- a host step that every replay must repeat (the scratch memory of kernels that build TMA
  descriptors on the device) reports itself (``recorder.repeated``).

Outside a recording each report is one read of a thread-local attribute.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Recorder(Protocol):
    """What a recording is told while the call it records runs."""

    def launched(self, launch: Any, tensors: dict[str, Any]) -> None:
        """``launch`` is called with ``tensors``: the recorder runs it (``launch.launch(tensors)``)."""

    def dispatched(self, handle: Any, operation: str, problem: Any) -> None:
        """``problem`` of ``operation`` (``dispatch.OPERATIONS``) runs on ``handle``."""

    def repeated(self, step: Callable[[], None]) -> None:
        """``step`` (a call without arguments) ran before the launches and must run before each replay."""


class _Scope(threading.local):
    recorder: Recorder | None = None  # the recording of this thread's current call, if any


SCOPE = _Scope()


@contextlib.contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Within the block, this thread's launches, dispatches and repeated steps report to ``recorder``."""
    previous, SCOPE.recorder = SCOPE.recorder, recorder
    try:
        yield recorder
    finally:
        SCOPE.recorder = previous
