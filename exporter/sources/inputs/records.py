"""What the inputs whose readers yield records of their own (trainer_state.json, event files, completions) share."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.parsers.record import Record
from exporter.pipeline import IngestStats
from exporter.runstate import RunState
from exporter.sources.base import FollowStats, Source


class RunInput(Source):
    """A file source whose reader yields records (or sample sets) of its own, not console text: read outside the
    lock, handed to the run under it, each counted as a record of its format."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats, reader) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = reader
        self.follow = FollowStats()

    def _hand_over(self, fmt: str, records: list[Record]) -> None:
        self.follow.up = self.reader.up
        self.follow.bytes_read = self.reader.bytes_read
        for rec in records:
            self.stats.lines[fmt, "record"] += 1
            self.run.ingest(rec)
