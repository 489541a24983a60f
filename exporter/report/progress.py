"""How far a long read has got, on one line of standard error, only when that is a terminal: a report of a
long run takes seconds, and a person at a terminal should see it move (a pipe or a CI log gets nothing)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO

SHOW_AFTER_S = 0.5  # a read that ends sooner prints nothing
EVERY_S = 0.2  # redraws at most this often
_MB = 1e6


class ReadProgress:
    """`reading LOG: 42% (50 of 118 MB, 3.1 s)`, redrawn in place; cleared when done."""

    def __init__(self, stream: TextIO, label: str, total_bytes: int | None, read_bytes: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.label, self.total = stream, label, total_bytes
        self.read_bytes = read_bytes
        self.clock = clock
        self.start = clock()
        self.drawn_at: float | None = None

    @classmethod
    def for_terminal(cls, stream: TextIO, paths: list[str], read_bytes: Callable[[], int]) -> ReadProgress | None:
        """A progress line on `stream` if it is a terminal, else None."""
        try:
            if not stream.isatty():
                return None
        except (AttributeError, ValueError):  # closed or not a file
            return None
        sizes = [os.stat(p).st_size for p in paths if os.path.isfile(p)]
        total = sum(sizes) if len(sizes) == len(paths) else None  # stdin or a stream: no end known
        label = paths[0] if len(paths) == 1 else f"{len(paths)} logs"
        return cls(stream, label, total, read_bytes)

    def line(self) -> str:
        done = self.read_bytes()
        took = self.clock() - self.start
        if self.total:
            pct = min(100, int(100 * done / self.total))
            return f"reading {self.label}: {pct}% ({done / _MB:.0f} of {self.total / _MB:.0f} MB, {took:.1f} s)"
        return f"reading {self.label}: {done / _MB:.0f} MB ({took:.1f} s)"

    def tick(self) -> None:
        now = self.clock()
        if now - self.start < SHOW_AFTER_S or (self.drawn_at is not None and now - self.drawn_at < EVERY_S):
            return
        self.drawn_at = now
        self.stream.write("\r\x1b[K" + self.line())
        self.stream.flush()

    def done(self) -> None:
        if self.drawn_at is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
