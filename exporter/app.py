"""The exporter's state: its inputs, one RunState per run, and the loop that feeds them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from exporter.config import Config, EarlyStopSettings, LogSpec
from exporter.instruments.keymap import KeyMap
from exporter.instruments.run import RunLimits, RunState
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import ParseError, Record
from exporter.pipeline import ConsoleStream, IngestStats, warn_once
from exporter.report.live import verdict_document
from exporter.sources.detect import TENSORBOARD, TRAINER_STATE, input_kind
from exporter.sources.files import FileFollower, FollowStats
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


class Input:
    """One log source bound to its run. `poll` reads what is new and ingests it."""

    spec: LogSpec
    follow: FollowStats

    def poll(self) -> bool:
        raise NotImplementedError

    def finish(self) -> None:
        """End of input: ingest whatever is still held."""


class FileInput(Input):
    """A followed file. A poll reads at most POLL_BYTES and keeps its place in the file's new text, so a large
    log (the whole history, after a restart) is caught up on in slices between which scrapes get the lock."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream) -> None:
        self.spec = spec
        self.stream = stream
        self.follower = FileFollower(spec.path)
        self.follow = self.follower.stats
        self._chunks: Iterator[str] | None = None  # the new text not read yet, when a poll stopped short
        self.catching_up = False

    def poll(self) -> bool:
        if self._chunks is None:
            self._chunks = self.follower.poll()
        read = 0
        for chunk in self._chunks:
            self.stream.feed(chunk)
            read += len(chunk)
            if read >= POLL_BYTES:
                self.catching_up = True
                return True
        self._chunks, self.catching_up = None, False
        self.stream.settle(REDRAW_WAIT_SECONDS)
        return read > 0

    def finish(self) -> None:
        self.stream.finish()


class ChunkReader(Protocol):
    closed: bool

    def poll(self, timeout: float = 0.0) -> list[str]: ...


class ReaderInput(Input):
    """A stream handed out in chunks: standard input (a reader thread) or the demo's replay."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream, reader: ChunkReader | None = None) -> None:
        self.spec = spec
        self.stream = stream
        self.reader = reader or StdinReader()
        self.follow = FollowStats(up=True)
        self._finished = False

    def poll(self, timeout: float = 0.0) -> bool:
        chunks = self.reader.poll(timeout)
        for c in chunks:
            self.stream.feed(c)
            self.follow.bytes_read += len(c)
        if self.reader.closed and not self._finished:
            self._finished = True
            self.follow.up = False
            self.stream.finish()  # the trainer is gone: nothing more will complete a held line
        else:
            self.stream.settle(REDRAW_WAIT_SECONDS)
        return bool(chunks)

    @property
    def closed(self) -> bool:
        return self.reader.closed


class TrainerStateInput(Input):
    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = TrainerStateReader(spec.path)
        self.follow = FollowStats()

    def poll(self) -> bool:
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
        self.stats.lines["trainer_state", "error"] += n
        self.stats.parse_errors["trainer_state", reason] += n
        warn_once(self.run.name, ("trainer_state", reason), "skipped %s or entries of its log_history (%s); further "
                  "ones are only counted in posttrain_exporter_parse_errors_total", self.spec.path, reason)


class TensorBoardInput(Input):
    """A Trainer's TensorBoard event files: scalars with their exact steps. The writer flushes every couple of
    minutes, so a step's scalars are ingested once a later step appears or the files stop growing."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        self.spec = spec
        self.run = run
        self.stats = stats
        self.reader = TensorBoardReader(spec.path)
        self.follow = FollowStats()

    def poll(self) -> bool:
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
            self.stats.lines[TB_FORMAT, "error"] += n
            self.stats.parse_errors[TB_FORMAT, reason] += n
            warn_once(self.run.name, (TB_FORMAT, reason), "%s: event records skipped (%s); further ones are only "
                      "counted in posttrain_exporter_parse_errors_total", self.spec.path, reason)
        self.reader.errors.clear()
        for rec in records:
            self.stats.lines[TB_FORMAT, "record"] += 1
            self.run.ingest(rec)


class PendingInput(Input):
    """A path that cannot say yet what it is (not there yet, or a folder holding neither checkpoints nor event
    files): its reader is chosen at the first poll that finds out (sources/detect.py)."""

    def __init__(self, spec: LogSpec, choose: Callable[[LogSpec], Input | None]) -> None:
        self.spec = spec
        self._choose = choose
        self._chosen: Input | None = None
        self._waiting = FollowStats()

    @property
    def follow(self) -> FollowStats:  # type: ignore[override]
        return self._waiting if self._chosen is None else self._chosen.follow

    @property
    def catching_up(self) -> bool:
        return bool(getattr(self._chosen, "catching_up", False))

    def poll(self) -> bool:
        if self._chosen is None:
            self._chosen = self._choose(self.spec)
            if self._chosen is None:
                return False
        return self._chosen.poll()

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
        self.inputs: list[Input] = [self._input(s) for s in specs]
        self.heartbeat = time.monotonic()
        self.stop_signal: StopSignal | None = None  # config early_stop: set by serve and run

    def run_state(self, name: str) -> RunState:
        if name not in self.runs:
            limits = RunLimits(max_keys=self.cfg.max_keys, history_limit=self.cfg.history_limit,
                               max_key_length=self.cfg.max_key_length)
            self.runs[name] = RunState(name, self.keymap, limits, self.cfg.derived)
            self.stats[name] = IngestStats()
        return self.runs[name]

    def _input(self, spec: LogSpec) -> Input:
        self.run_state(spec.run)  # the run is there (and scraped) before its log is
        return self._reader(spec) or PendingInput(spec, self._reader)

    def _reader(self, spec: LogSpec) -> Input | None:
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
        stream = ConsoleStream(run, stats, LineParserChain(spec.format, self.cfg.formats), self.cfg.max_line_length)
        return ReaderInput(spec, stream) if spec.path == "-" else FileInput(spec, stream)

    def _kubernetes(self, spec: LogSpec) -> Input:
        """k8s://: bad paths, a missing POD_NAMESPACE/POD_NAME, package or credentials stop the start here."""
        if spec.format in (TRAINER_STATE, TENSORBOARD):
            raise KubernetesSourceError(f"{spec.path}: a container's log is console text, not {spec.format}")
        reader = KubernetesLogReader.from_path(spec.path)
        stream = ConsoleStream(self.run_state(spec.run), self.stats[spec.run],
                               LineParserChain(spec.format, self.cfg.formats), self.cfg.max_line_length)
        inp = ReaderInput(spec, stream, reader=reader)
        inp.follow = reader.stats  # up, reconnects (resumed) and read_errors, as files count theirs
        return inp

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
        with self.lock:
            for run in self.runs.values():
                run.refresh()
            settings = self.stop_signal.settings if self.stop_signal is not None else EarlyStopSettings()
            return verdict_document(self.runs.values(), settings, only)

    @property
    def catching_up(self) -> bool:
        """Some input has more text waiting than one poll reads: the exporter is reading a log's history."""
        return any(getattr(inp, "catching_up", False) for inp in self.inputs)

    def read_to_end(self) -> None:
        """`dump`: every input to its end, then everything held is ingested."""
        for inp in self.inputs:
            if isinstance(inp, ReaderInput):
                while not inp.closed:
                    inp.poll(timeout=0.5)
            else:
                inp.poll()
                while getattr(inp, "catching_up", False):
                    inp.poll()
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


def _watch(inputs: list[Input], wake: threading.Event):
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
