"""Appending lines to a file from inside the trainer, never at the trainer's cost: the metrics feed and the GPU feed
(integrations/feed.py, gpu_feed.py) both write through this."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import IO


class LineAppender:
    """Appends lines to `path`: its folder made if missing, the file opened at the first line and kept open. Never
    raises: a line that cannot be made or written (a full disk, a volume gone, a value json refuses) is counted in
    `lost`, said once to `log`, and the next one is tried again; writing again after a failure is said too. `what`
    names the file in those lines ("feed"), `unit` what a line holds ("record")."""

    def __init__(self, path: str | os.PathLike[str], what: str, unit: str, log: logging.Logger) -> None:
        self.path = os.fspath(path)
        self.what, self.unit, self.log = what, unit, log
        self.written = 0
        self.lost = 0
        self._file: IO[str] | None = None
        self._failing = False

    def put(self, make_line: Callable[[], str | None]) -> bool:
        """Writes the line `make_line()` gives (None: nothing to write, False); False when it could not be."""
        try:
            line = make_line()
            if line is None:
                return False
            if self._file is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (kept open across lines)
            self._file.write(line)
            self._file.flush()
        except Exception as e:  # never the trainer's problem
            self.lost += 1
            self.close()
            if not self._failing:
                self._failing = True
                self.log.warning("posttrain-exporter %s: cannot write %s (%s); training goes on, and writing is "
                                 "tried again at the next %s", self.what, self.path, e, self.unit)
            return False
        self.written += 1
        if self._failing:
            self._failing = False
            self.log.warning("posttrain-exporter %s: writing %s again (%d %ss were lost)", self.what, self.path,
                             self.lost, self.unit)
        return True

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(Exception):  # closing a file on a vanished volume fails too: nothing to do
                f.close()


class AppendingWriter:
    """A writer whose lines go through a LineAppender (`_out`): what it wrote and lost are the appender's."""

    _out: LineAppender

    @property
    def written(self) -> int:
        return self._out.written

    @property
    def lost(self) -> int:
        """Lines that could not be made or written (a record, a sample)."""
        return self._out.lost
