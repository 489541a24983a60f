"""One console stream's path from text to a run: framing, parsing, step attribution, ingest."""

from __future__ import annotations

import logging
import time
from collections import Counter

from exporter.console.framing import ConsoleFramer
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
        self.bar_draws = 0  # counted apart: one per progress-bar draw is the hottest path

    def line_counts(self) -> dict[tuple[str, str], int]:
        counts = dict(self.lines)
        if self.bar_draws:
            counts["tqdm", "progress"] = self.bar_draws
        return counts


class ConsoleStream:
    """Text of one stream (a file, stdin) in, records into `run` out. It is the framer's sink."""

    def __init__(self, run: RunState, stats: IngestStats, parsers: LineParserChain) -> None:
        self.run = run
        self.stats = stats
        self.parsers = parsers
        self.framer = ConsoleFramer(self)
        self.clock = StepClock()
        self.last_data = time.monotonic()

    def feed(self, text: str) -> None:
        self.last_data = time.monotonic()
        self.framer.feed(text)

    def finish(self) -> None:
        """End of input (dump, or stdin closed): the unterminated tail is a line; nothing waits."""
        self.framer.flush()
        self._ingest(self.clock.flush())

    def settle(self, idle_seconds: float) -> None:
        """Records waiting for a progress-bar redraw that has not come take their fallback step."""
        if time.monotonic() - self.last_data >= idle_seconds:
            self._ingest(self.clock.flush())

    # --- the framer's sink ----------------------------------------------------------------------

    def bar(self, n: int) -> None:
        self.stats.bar_draws += 1
        released = self.clock.bar(n)
        if released:
            self._ingest(released)

    def clear(self) -> None:
        self.clock.clear()

    def abandoned(self, text: str) -> None:
        self._error(ParseError("cut_line", text[:60], "unknown"))

    def line(self, text: str) -> None:
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
