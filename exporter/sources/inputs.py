"""The inputs of a run: each adapter takes one source (a followed file, a stream of chunks, trainer_state.json,
TensorBoard event files, or a path that cannot say yet what it is) and hands what it reads to the run."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

from exporter.config import LogSpec
from exporter.parsers.record import Record
from exporter.pipeline import ConsoleStream, IngestStats, take_samples
from exporter.runstate import RunState
from exporter.samples.sampleset import SampleSet
from exporter.sources.base import ChunkReader, FollowStats, Source
from exporter.sources.completions import FORMAT as PARQUET_FORMAT
from exporter.sources.completions import CompletionsReader
from exporter.sources.files import FileFollower
from exporter.sources.tensorboard import FMT as TB_FORMAT
from exporter.sources.tensorboard import TensorBoardReader
from exporter.sources.trainer_state import TrainerStateReader

log = logging.getLogger(__name__)

# A path that is still not there after this long is said again: a typo, or a trainer that writes elsewhere.
STILL_WAITING_SECONDS = 60.0

# A record printed before its progress-bar redraw waits at most this long for it.
REDRAW_WAIT_SECONDS = 2.0
# Text ingested from one file per poll while the lock is held: about 0.1 s of work, so a scrape waits no longer.
POLL_BYTES = 4 << 20


class FileInput(Source):
    """A followed file. A poll reads at most POLL_BYTES and keeps its place in the file's new text, so a large
    log (the whole history, after a restart) is caught up on in slices between which scrapes get the lock."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream) -> None:
        self.spec = spec
        self.stream = stream
        self.follower = FileFollower(spec.path)
        self.follow = self.follower.stats
        self._chunks: Iterator[str] | None = None  # the new text not read yet, when a poll stopped short
        self._behind = False
        self._got: list[str] = []  # read, not ingested yet

    @property
    def catching_up(self) -> bool:
        return self._behind

    @property
    def drained(self) -> bool:
        return not self._behind and self.follower.drained

    def read(self, timeout: float = 0.0) -> None:
        if self._chunks is None:
            self._chunks = self.follower.poll()
        size = 0
        for chunk in self._chunks:
            self._got.append(chunk)
            size += len(chunk)
            if size >= POLL_BYTES:
                self._behind = True
                return
        self._chunks, self._behind = None, False

    def ingest(self) -> bool:
        got, self._got = self._got, []
        for chunk in got:
            self.stream.feed(chunk)
        if not self._behind:
            self.stream.settle(REDRAW_WAIT_SECONDS)
        if self.follower.written_at is not None:  # its records are no younger than the file (stall, stale)
            self.stream.run.written_by(self.follower.written_at)
        return bool(got)

    def finish(self) -> None:
        self.stream.finish()


class StreamInput(Source):
    """A stream handed out in chunks (a ChunkReader): standard input, the trainer child, a pod's log, the demo."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream, reader: ChunkReader) -> None:
        self.spec = spec
        self.stream = stream
        self.reader = reader
        self.follow = reader.stats  # the reader counts its bytes (undecoded) and its own health
        self._finished = False
        self._got: list[str] = []

    def read(self, timeout: float = 0.0) -> None:
        self._got += self.reader.poll(timeout)

    def ingest(self) -> bool:
        chunks, self._got = self._got, []
        for c in chunks:
            self.stream.feed(c)
        if self.reader.closed:
            self.finish()  # the writer is gone: nothing more will complete a held line
        else:
            self.stream.settle(REDRAW_WAIT_SECONDS)
        return bool(chunks)

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.follow.up = False
            self.stream.finish()

    @property
    def drained(self) -> bool:
        return self.reader.closed

    @property
    def catching_up(self) -> bool:
        return bool(getattr(self.reader, "behind", False))  # the copier's pipe held more than one poll takes


class _RunInput(Source):
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


class TrainerStateInput(_RunInput):
    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, TrainerStateReader(spec.path))
        self._records: list[Record] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind

    def read(self, timeout: float = 0.0) -> None:
        self._records += self.reader.poll()

    def ingest(self) -> bool:
        records, self._records = self._records, []
        self.stats.lines_dropped.update(self.reader.dropped)
        self.reader.dropped.clear()
        for reason, n in self.reader.entry_errors.items():
            self._error(reason, n)
        self.reader.entry_errors.clear()
        self.follow.truncations = self.reader.rewrites  # a history rewritten under us, read again where it differs
        self._hand_over("trainer_state", records)
        return bool(records)

    def _error(self, reason: str, n: int) -> None:
        self.stats.error(self.run.name, "trainer_state", reason, n, "skipped %s or entries of its log_history (%s)",
                         self.spec.path, reason)


class TensorBoardInput(_RunInput):
    """A Trainer's TensorBoard event files: scalars with their exact steps. The writer flushes every couple of
    minutes, so a step's scalars are ingested once a later step appears or the files stop growing."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, TensorBoardReader(spec.path))
        self._records: list[Record] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind

    def read(self, timeout: float = 0.0) -> None:
        self._records += self.reader.poll()
        if not self.reader.grew:
            self._records += self.reader.finish()

    def ingest(self) -> bool:
        records, self._records = self._records, []
        self._ingest(records)
        return bool(records)

    def finish(self) -> None:
        self._ingest(self.reader.finish())

    def _ingest(self, records: list[Record]) -> None:
        for reason, n in self.reader.errors.items():
            self.stats.error(self.run.name, TB_FORMAT, reason, n, "%s: event records skipped (%s)", self.spec.path,
                             reason)
        self.reader.errors.clear()
        self.stats.lines_dropped.update(self.reader.dropped)
        self.reader.dropped.clear()
        self._hand_over(TB_FORMAT, records)


class CompletionsInput(_RunInput):
    """TRL's completions folder: each new parquet file is one logged step's sample set, handed to the run as the
    console's printed panels are (pipeline.take_samples); a file that never parses is counted, the next one read."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, CompletionsReader(spec.path))
        self._sets: list[SampleSet] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind

    @property
    def drained(self) -> bool:
        return not self.reader.pending

    def read(self, timeout: float = 0.0) -> None:
        self._sets += self.reader.poll()

    def ingest(self) -> bool:
        sets, self._sets = self._sets, []
        for reason, name in self.reader.errors:
            self.stats.error(self.run.name, PARQUET_FORMAT, reason, 1, "%s/%s skipped (%s)", self.spec.path, name,
                             reason)
        self.reader.errors.clear()
        self._hand_over(PARQUET_FORMAT, [])
        for s in sets:
            take_samples(self.run, self.stats, s)
        return bool(sets)


class PendingInput(Source):
    """A path that cannot say yet what it is (not there yet, or a folder holding neither checkpoints nor event
    files): its reader is chosen at the first poll that finds out (sources/detect.py)."""

    def __init__(self, spec: LogSpec, choose: Callable[[LogSpec], Source | None]) -> None:
        self.spec = spec
        self._choose = choose
        self._chosen: Source | None = None
        self._waiting = FollowStats()
        self._since: float | None = None  # when the first look found nothing to read
        self._said = 0  # waiting lines logged: one at once, one more after STILL_WAITING_SECONDS

    @property
    def follow(self) -> FollowStats:  # type: ignore[override]
        return self._waiting if self._chosen is None else self._chosen.follow

    @property
    def catching_up(self) -> bool:
        return self._chosen is not None and self._chosen.catching_up

    @property
    def drained(self) -> bool:
        return self._chosen is None or self._chosen.drained

    def read(self, timeout: float = 0.0) -> None:
        if self._chosen is None:
            self._chosen = self._choose(self.spec)  # looks at the path (I/O): outside the lock
            if self._chosen is None:
                self._say_waiting()
            elif self._said:
                log.info("run %s: %s is there now; reading it", self.spec.run, self.spec.path)
        if self._chosen is not None:
            self._chosen.read(timeout)

    def _say_waiting(self) -> None:
        """A path that is not there may be one the trainer has not written yet, or a typo: said at once (with
        whether its folder exists), and again if it is still missing after STILL_WAITING_SECONDS."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self._said == 0:
            self._said = 1
            folder = os.path.dirname(os.path.abspath(self.spec.path))
            if os.path.exists(self.spec.path):
                log.info("run %s: %s holds nothing to read yet (no checkpoint, event file or log); waiting",
                         self.spec.run, self.spec.path)
            else:
                log.warning("run %s: %s does not exist; waiting for it to appear (%s): check the path if the "
                            "trainer should have written it", self.spec.run, self.spec.path,
                            "its folder exists" if os.path.isdir(folder) else f"its folder {folder} does not exist "
                            "either")
        elif self._said == 1 and now - self._since >= STILL_WAITING_SECONDS:
            self._said = 2
            log.warning("run %s: still nothing to read at %s after %.0f s (posttrain_exporter_source_up is 0)",
                        self.spec.run, self.spec.path, now - self._since)

    def ingest(self) -> bool:
        return self._chosen is not None and self._chosen.ingest()

    def finish(self) -> None:
        if self._chosen is not None:
            self._chosen.finish()
