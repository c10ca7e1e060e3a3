"""What the commands print besides their results: a progress bar redrawn in place, shown only on a
terminal (tqdm's when tqdm is installed), and tables whose columns are as wide as their widest cell."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO


class ProgressBar:
    """A progress bar of ``done/total`` with a note, shown while ``stream`` (default: stderr) is a
    terminal: tqdm's bar when tqdm is installed, else ``[#####.....] done/total  note`` rewritten in
    place with ``\\r``. On a pipe or a file the bar prints nothing, so logs hold no ``\\r`` runs.
    ``line`` prints a message on its own line in either case."""

    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.width = width
        self._drawn = 0  # characters of the hand-drawn bar on the screen now
        self._tqdm_class: Any = _tqdm_class() if self.live else None
        self._tqdm: Any = None  # the tqdm bar on the screen now

    def show(self, done: int, total: int, note: str = "", prefix: str = "") -> None:
        if not self.live:
            return
        if self._tqdm_class is not None:
            self._show_tqdm(done, total, note, prefix)
            return
        filled = self.width * done // max(total, 1)
        text = f"{prefix}[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}  {note}".rstrip()
        self.stream.write("\r" + text.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(text)

    def _show_tqdm(self, done: int, total: int, note: str, prefix: str) -> None:
        if self._tqdm is None or self._tqdm.total != total:
            self.clear()
            self._tqdm = self._tqdm_class(
                total=total, desc=prefix.rstrip(), file=self.stream, leave=False, dynamic_ncols=True
            )
        self._tqdm.set_description_str(prefix.rstrip(), refresh=False)
        self._tqdm.set_postfix_str(note, refresh=False)
        self._tqdm.update(done - self._tqdm.n)  # redrawn at most ten times a second
        if done == total:
            self._tqdm.refresh()  # the last state, whenever it comes

    def line(self, text: str) -> None:
        """``text`` on a line of its own (over the bar, on a terminal)."""
        if self._tqdm is not None:
            self._tqdm.write(text, file=self.stream)
            return
        self.stream.write(("\r" + text.ljust(self._drawn) if self._drawn else text) + "\n")
        self.stream.flush()
        self._drawn = 0

    def clear(self) -> None:
        """Erase the bar (on a terminal), leaving the cursor at the start of its line."""
        if self._tqdm is not None:
            self._tqdm.close()
            self._tqdm = None
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def _tqdm_class() -> Any:
    """tqdm's bar class, or None when tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


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
