"""The inputs of a run: each adapter takes one source (a followed file, a stream of chunks, trainer_state.json,
TensorBoard event files, or a path that cannot say yet what it is) and hands what it reads to the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from exporter.config import LogSpec
from exporter.parsers.record import ParseError, Record
from exporter.pipeline import ConsoleStream, IngestStats
from exporter.runstate import RunState
from exporter.sources.base import ChunkReader, FollowStats, Source
from exporter.sources.files import FileFollower
from exporter.sources.tensorboard import FMT as TB_FORMAT
from exporter.sources.tensorboard import TensorBoardReader
from exporter.sources.trainer_state import TrainerStateReader

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


class TrainerStateInput(Source):
    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = TrainerStateReader(spec.path)
        self.follow = FollowStats()
        self._records: list[Record] = []
        self._failed: list[str] = []  # a whole read that failed, by reason

    def read(self, timeout: float = 0.0) -> None:
        try:
            self._records += self.reader.poll()
        except ParseError as e:
            self._failed.append(e.reason)

    def ingest(self) -> bool:
        records, self._records = self._records, []
        for reason in self._failed:
            self._error(reason, 1)
        self._failed.clear()
        for reason, n in self.reader.entry_errors.items():
            self._error(reason, n)
        self.reader.entry_errors.clear()
        self.follow.up = self.reader.up
        self.follow.bytes_read = self.reader.bytes_read
        for rec in records:
            self.stats.lines["trainer_state", "record"] += 1
            self.run.ingest(rec)
        return bool(records)

    def _error(self, reason: str, n: int) -> None:
        self.stats.error(self.run.name, "trainer_state", reason, n, "skipped %s or entries of its log_history (%s)",
                         self.spec.path, reason)


class TensorBoardInput(Source):
    """A Trainer's TensorBoard event files: scalars with their exact steps. The writer flushes every couple of
    minutes, so a step's scalars are ingested once a later step appears or the files stop growing."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = TensorBoardReader(spec.path)
        self.follow = FollowStats()
        self._records: list[Record] = []

    def read(self, timeout: float = 0.0) -> None:
        self._records += self.reader.poll()
        if not self.reader.grew:
            self._records += self.reader.finish()

    def ingest(self) -> bool:
        records, self._records = self._records, []
        self.follow.up = self.reader.up
        self._ingest(records)
        return bool(records)

    def finish(self) -> None:
        self._ingest(self.reader.finish())

    def _ingest(self, records: list[Record]) -> None:
        for reason, n in self.reader.errors.items():
            self.stats.error(self.run.name, TB_FORMAT, reason, n, "%s: event records skipped (%s)", self.spec.path,
                             reason)
        self.reader.errors.clear()
        for rec in records:
            self.stats.lines[TB_FORMAT, "record"] += 1
            self.run.ingest(rec)


class PendingInput(Source):
    """A path that cannot say yet what it is (not there yet, or a folder holding neither checkpoints nor event
    files): its reader is chosen at the first poll that finds out (sources/detect.py)."""

    def __init__(self, spec: LogSpec, choose: Callable[[LogSpec], Source | None]) -> None:
        self.spec = spec
        self._choose = choose
        self._chosen: Source | None = None
        self._waiting = FollowStats()

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
        if self._chosen is not None:
            self._chosen.read(timeout)

    def ingest(self) -> bool:
        return self._chosen is not None and self._chosen.ingest()

    def finish(self) -> None:
        if self._chosen is not None:
            self._chosen.finish()
