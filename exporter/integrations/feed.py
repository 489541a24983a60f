"""The trainer's side of the exact feed: each logged record as one JSON line, `{"step": N, ...numbers...}`, the
format the exporter reads with the record's own step (exporter/parsers/jsonl.py), so no step is guessed from a
progress bar. Numbers only (a NaN or an infinity as Python's json writes them, which the exporter reads); each
line is flushed as it is written. Each training begins with a line that says which training the records after it
belong to (exporter/parsers/training.py): a feed appended to by a new training never lends it an earlier one's
records.

It never raises: the trainer matters more than its metrics. A failed write is logged once, the file is closed
and opened again at the next record; the records lost meanwhile are counted and said when writing works again."""

from __future__ import annotations

import json
import logging
import numbers
import os
from collections.abc import Mapping

from exporter.integrations.appender import AppendingWriter, LineAppender
from exporter.parsers.training import Training

log = logging.getLogger(__name__)

STEP_KEY = "step"


def numeric(v: object) -> int | float | None:
    """A logged value as a JSON number, or None when it is not one (a string, a bool, a tensor of many)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return v
    if isinstance(v, numbers.Real):  # numpy scalars
        return float(v)
    item = getattr(v, "item", None)  # a one-element tensor or array
    if callable(item):
        try:
            x = item()
        except Exception:  # more than one element, or a device error: not a metric of ours
            return None
        return x if isinstance(x, int | float) and not isinstance(x, bool) else None
    return None


def feed_line(step: int, values: Mapping[str, object]) -> str | None:
    """`{"step": N, ...}` with the numeric values (None when there is none)."""
    record: dict[str, int | float] = {}
    for key, v in values.items():
        n = numeric(v)
        if n is not None and key != STEP_KEY:
            record[str(key)] = n
    if not record:
        return None
    return json.dumps({STEP_KEY: int(step), **record}, separators=(", ", ": ")) + "\n"


class FeedWriter(AppendingWriter):
    """Appends feed lines to `path` (its folder made if missing), opened at the first record."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._out = LineAppender(path, "feed", "record", log)

    def begin(self, training: Training) -> bool:
        """A training starts: its identity line, before its records."""
        return self._out.put(training.line)

    def write(self, step: int, values: Mapping[str, object]) -> bool:
        return self._out.put(lambda: feed_line(step, values))

    def close(self) -> None:
        self._out.close()
