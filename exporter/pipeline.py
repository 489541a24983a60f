"""One console stream's path from text to a run: framing, parsing, step attribution, ingest."""

from __future__ import annotations

import logging
import time
from collections import Counter

from exporter.console.framing import Abandoned, Bar, Clear, ConsoleFramer, Event, Line
from exporter.console.steps import StepClock
from exporter.instruments.run import RunState
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import ParseError, Record

log = logging.getLogger(__name__)

# One warning per (run, format, reason): a broken stream must not flood the sidecar's own log.
_warned: set[tuple[str, str, str]] = set()


class IngestStats:
    """Counters of what the exporter read, for its self-metrics (per run)."""

    def __init__(self) -> None:
        self.lines: Counter[tuple[str, str]] = Counter()  # (format, outcome)
        self.parse_errors: Counter[tuple[str, str]] = Counter()  # (format, reason)


class ConsoleStream:
    """Text of one stream (a file, stdin) in, records into `run` out."""

    def __init__(self, run: RunState, stats: IngestStats, parsers: LineParserChain) -> None:
        self.run = run
        self.stats = stats
        self.parsers = parsers
        self.framer = ConsoleFramer()
        self.clock = StepClock()
        self.last_data = time.monotonic()

    def feed(self, text: str) -> None:
        self.last_data = time.monotonic()
        self._events(self.framer.feed(text))

    def finish(self) -> None:
        """End of input (dump, or stdin closed): the unterminated tail is a line; nothing waits."""
        self._events(self.framer.flush())
        self._ingest(self.clock.flush())

    def settle(self, idle_seconds: float) -> None:
        """Records waiting for a progress-bar redraw that has not come take their fallback step."""
        if time.monotonic() - self.last_data >= idle_seconds:
            self._ingest(self.clock.flush())

    def _events(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, Line):
                self._line(ev.text)
            elif isinstance(ev, Bar):
                self.stats.lines["tqdm", "progress"] += 1
                self._ingest(self.clock.bar(ev.n))
            elif isinstance(ev, Clear):
                self.clock.clear()
            elif isinstance(ev, Abandoned):
                self._error(ParseError("cut_line", ev.text[:60], "unknown"))

    def _line(self, text: str) -> None:
        try:
            rec = self.parsers.parse(text)
        except ParseError as e:
            self._error(e)
            return
        if rec is None:
            self.stats.lines["none", "unmatched"] += 1
            return
        self.stats.lines[rec.fmt, "record"] += 1
        self._ingest(self.clock.record(rec))

    def _error(self, e: ParseError) -> None:
        self.stats.lines[e.fmt, "error"] += 1
        self.stats.parse_errors[e.fmt, e.reason] += 1
        key = (self.run.name, e.fmt, e.reason)
        if key not in _warned:
            _warned.add(key)
            log.warning("run %s: skipped a line that could not be parsed (%s); further ones are only "
                        "counted in posttrain_exporter_parse_errors_total", self.run.name, e)

    def _ingest(self, records: list[Record]) -> None:
        for rec in records:
            self.run.ingest(rec)
