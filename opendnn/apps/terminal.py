"""What the commands print besides their results: a progress bar redrawn in place, shown only on a
terminal, and tables whose columns are as wide as their widest cell."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO


class ProgressBar:
    """``[#####.....] done/total  note`` rewritten in place with ``\\r`` while ``stream`` (default:
    stderr) is a terminal; on a pipe or a file the bar prints nothing, so logs hold no ``\\r``
    runs. ``line`` prints a message on its own line in either case."""

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.width = width
        self._drawn = 0  # characters of the bar on the screen now

    def show(self, done: int, total: int, note: str = "", prefix: str = "") -> None:
        if not self.live:
            return
        filled = self.width * done // max(total, 1)
        text = f"{prefix}[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}  {note}".rstrip()
        self.stream.write("\r" + text.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(text)

    def line(self, text: str) -> None:
        """``text`` on a line of its own (over the bar, on a terminal)."""
        self.stream.write(("\r" + text.ljust(self._drawn) if self._drawn else text) + "\n")
        self.stream.flush()
        self._drawn = 0

    def clear(self) -> None:
        """Erase the bar (on a terminal), leaving the cursor at the start of its line."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = ()) -> list[str]:
    """The lines of a table: each column as wide as its widest cell (header included), columns
    two spaces apart, those named in ``right`` aligned right (numbers), the others left."""
    widths = [max([len(name)] + [len(row[k]) for row in rows]) for k, name in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if name in right else cell.ljust(width)
            for name, cell, width in zip(header, cells, widths)
        ).rstrip()

    return [line(header)] + [line(row) for row in rows]
