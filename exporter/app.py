"""The exporter's state: its inputs, one RunState per run, and the loop that feeds them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from exporter.config import Config, EarlyStopSettings, LogSpec
from exporter.instruments.keymap import KeyMap
from exporter.instruments.run import RunState
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import ParseError, Record
from exporter.pipeline import ConsoleStream, IngestStats
from exporter.sources.base import ChunkReader, FollowStats, Source
from exporter.sources.detect import TENSORBOARD, TRAINER_STATE, input_kind
from exporter.sources.files import FileFollower
from exporter.sources.kubernetes import KubernetesLogReader, KubernetesSourceError, is_kubernetes_path
from exporter.sources.stdin import StdinReader
from exporter.sources.tensorboard import FMT as TB_FORMAT
from exporter.sources.tensorboard import TensorBoardReader
from exporter.sources.trainer_state import TrainerStateReader

if TYPE_CHECKING:
    from exporter.stopsignal import StopSignal

log = logging.getLogger(__name__)

# A record printed before its progress-bar redraw waits at most this long for it.
REDRAW_WAIT_SECONDS = 2.0
# Text read from one file per poll while the lock is held: about 0.1 s of work, so a scrape waits no longer.
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

    @property
    def catching_up(self) -> bool:
        return self._behind

    def poll(self, timeout: float = 0.0) -> bool:
        if self._chunks is None:
            self._chunks = self.follower.poll()
        read = 0
        for chunk in self._chunks:
            self.stream.feed(chunk)
            read += len(chunk)
            if read >= POLL_BYTES:
                self._behind = True
                return True
        self._chunks, self._behind = None, False
        self.stream.settle(REDRAW_WAIT_SECONDS)
        return read > 0

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

    def poll(self, timeout: float = 0.0) -> bool:
        chunks = self.reader.poll(timeout)
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


class TrainerStateInput(Source):
    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = TrainerStateReader(spec.path)
        self.follow = FollowStats()

    def poll(self, timeout: float = 0.0) -> bool:
        try:
            records = self.reader.poll()
        except ParseError as e:
            self._error(e.reason, 1)
            records = []
        for reason, n in self.reader.entry_errors.items():
            self._error(reason, n)
        self.reader.entry_errors.clear()
        self.follow.up = self.reader.up
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

    def poll(self, timeout: float = 0.0) -> bool:
        records = self.reader.poll()
        if not self.reader.grew:
            records += self.reader.finish()
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

    def poll(self, timeout: float = 0.0) -> bool:
        if self._chosen is None:
            self._chosen = self._choose(self.spec)
            if self._chosen is None:
                return False
        return self._chosen.poll(timeout)

    def finish(self) -> None:
        if self._chosen is not None:
            self._chosen.finish()


class Exporter:
    def __init__(self, cfg: Config, specs: Iterable[LogSpec]) -> None:
        self.cfg = cfg
        self.lock = threading.Lock()
        self.keymap = KeyMap(cfg.aliases)
        self.runs: dict[str, RunState] = {}
        self.stats: dict[str, IngestStats] = {}
        self.inputs: list[Source] = []
        for spec in specs:
            self.add_input(spec)
        self.heartbeat = time.monotonic()
        self.stop_signal: StopSignal | None = None  # config early_stop: set by serve and run

    def run_state(self, name: str) -> RunState:
        if name not in self.runs:
            self.runs[name] = RunState(name, self.keymap, self.cfg.limits, self.cfg.derived)
            self.stats[name] = IngestStats()
        return self.runs[name]

    def add_input(self, spec: LogSpec, reader: ChunkReader | None = None, *, first: bool = False) -> Source:
        """Reads `spec` from now on: its path's source, or `reader` (a stream the caller made: the trainer child,
        the demo's replay). `first`: polled before the others (the trainer's own output). Call it under the lock
        once the loop runs."""
        self.run_state(spec.run)  # the run is there (and scraped) before its log is
        if reader is not None:
            source: Source = StreamInput(spec, self._console(spec), reader)
        else:
            source = self._reader(spec) or PendingInput(spec, self._reader)
        if first:
            self.inputs.insert(0, source)
        else:
            self.inputs.append(source)
        return source

    def _console(self, spec: LogSpec) -> ConsoleStream:
        """The path from text to the run for a console log: framing, the parsers the format allows, steps."""
        return ConsoleStream(self.run_state(spec.run), self.stats[spec.run],
                             LineParserChain(spec.format, self.cfg.formats), self.cfg.limits.max_line_length)

    def _reader(self, spec: LogSpec) -> Source | None:
        """The input reading `spec` as what its path holds, or None while that cannot be told."""
        if is_kubernetes_path(spec.path):  # a container's log through the Kubernetes API: a console stream
            return self._kubernetes(spec)
        kind = input_kind(spec.path, spec.format)
        if kind is None:
            return None
        run, stats = self.run_state(spec.run), self.stats[spec.run]
        if kind == TRAINER_STATE:
            return TrainerStateInput(spec, run, stats)
        if kind == TENSORBOARD:
            return TensorBoardInput(spec, run, stats)
        if spec.path == "-":
            return StreamInput(spec, self._console(spec), StdinReader())
        return FileInput(spec, self._console(spec))

    def _kubernetes(self, spec: LogSpec) -> Source:
        """k8s://: bad paths, a missing POD_NAMESPACE/POD_NAME, package or credentials stop the start here."""
        if spec.format in (TRAINER_STATE, TENSORBOARD):
            raise KubernetesSourceError(f"{spec.path}: a container's log is console text, not {spec.format}")
        return StreamInput(spec, self._console(spec), KubernetesLogReader.from_path(spec.path))

    def poll_once(self) -> bool:
        """One slice of every input, each under the lock on its own (scrapes get in between)."""
        got = False
        for inp in self.inputs:
            with self.lock:
                got |= inp.poll()
                self.heartbeat = time.monotonic()
        if got and self.stop_signal is not None and not self.catching_up:  # judged as things stand, not mid-history
            self.raise_stop_signal(self.stop_signal)
        return got

    def raise_stop_signal(self, signal: StopSignal) -> None:
        with self.lock:
            for run in self.runs.values():
                run.refresh()
            due = signal.due(self.runs.values())
        signal.write(due)

    def verdict(self, only: str | None = None) -> dict:
        """The runs' verdicts as they stand (/api/v1/verdict)."""
        from exporter.report.live import verdict_document  # not needed by `dump`

        with self.lock:
            for run in self.runs.values():
                run.refresh()
            settings = self.stop_signal.settings if self.stop_signal is not None else EarlyStopSettings()
            return verdict_document(self.runs.values(), settings, only)

    @property
    def catching_up(self) -> bool:
        """Some input has more text waiting than one poll reads: the exporter is reading a log's history."""
        return any(inp.catching_up for inp in self.inputs)

    def read_to_end(self) -> None:
        """`dump`: every input to its end, then everything held is ingested."""
        for inp in self.inputs:
            inp.poll(timeout=0.5)
            while not inp.drained:
                inp.poll(timeout=0.5)
            inp.finish()
        for run in self.runs.values():
            run.refresh()

    def follow_forever(self, stop: threading.Event) -> None:
        wake = threading.Event()
        observer = _watch(self.inputs, wake)
        try:
            while not stop.is_set():
                self.poll_once()
                if self.catching_up:  # more is waiting: read on at once, after a scrape waiting for the lock
                    stop.wait(0.002)  # (a lock is not fair: without a pause this thread would take it again)
                    continue
                wake.wait(self.cfg.poll_interval_seconds)
                wake.clear()
        finally:
            if observer is not None:
                observer.stop()


def _watch(inputs: list[Source], wake: threading.Event):
    """File-system events wake the loop early; polling at poll_interval stays as the fallback."""
    dirs = {os.path.dirname(os.path.abspath(i.spec.path)) for i in inputs if i.spec.path != "-"}
    dirs = {d for d in dirs if os.path.isdir(d)}
    if not dirs:
        return None
    try:
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer
    except ImportError:  # pragma: no cover - watchdog is a dependency; polling still works
        return None

    class _Wake(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            wake.set()

    observer = Observer()
    try:
        for d in dirs:
            observer.schedule(_Wake(), d, recursive=False)
        observer.daemon = True
        observer.start()
    except OSError as e:  # inotify limits reached, say: polling alone is enough
        log.info("file events unavailable (%s); polling every interval", e)
        return None
    return observer
