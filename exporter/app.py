"""The exporter's state: the inputs sources/inputs built for it, its runs (runset.py), and the loop that polls
the inputs; nothing it holds calls back into it."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from exporter.config import Config, EarlyStopSettings, LogSpec
from exporter.launch import Launch
from exporter.pipeline import IngestStats
from exporter.runset import RunSet
from exporter.runstate import RunState
from exporter.sources.base import ChunkReader, Source
from exporter.sources.inputs import open_input

if TYPE_CHECKING:
    from exporter.stopping.stopper import TrainerStopper
    from exporter.stopsignal import StopSignal

log = logging.getLogger(__name__)


class Exporter:
    def __init__(self, cfg: Config, specs: Iterable[LogSpec], launch: Launch | None = None) -> None:
        self.cfg = cfg
        self.launch = launch  # `run`: the trainer it started, whose feed joins its console's run (launch.py)
        self.lock = threading.Lock()
        self.runset = RunSet(cfg, launch)  # the runs by name, made as inputs name them
        self.runs: dict[str, RunState] = self.runset.runs
        self.stats: dict[str, IngestStats] = self.runset.stats
        self.inputs: list[Source] = []
        for spec in specs:
            self.add_input(spec)
        self.heartbeat = time.monotonic()
        self._failed_inputs: set[int] = set()  # inputs whose read or ingest raised once (said once each)
        self.stop_signal: StopSignal | None = None  # config early_stop: set by serve and run
        self.trainer_stopper: TrainerStopper | None = None  # early_stop.action signal: the trainer's stop by signals

    def run_state(self, name: str) -> RunState:
        return self.runset.get(name)

    def add_input(self, spec: LogSpec, reader: ChunkReader | None = None, *, first: bool = False) -> Source:
        """Reads `spec` from now on: the input sources/inputs builds for it (its path's kind), or over `reader` (a
        stream the caller made: the trainer child, the demo's replay). `first`: polled before the others (the
        trainer's own output). Call it under the lock once the loop runs."""
        source = open_input(spec, self.runset, reader)
        if first:
            self.inputs.insert(0, source)
        else:
            self.inputs.append(source)
        return source

    def poll_once(self) -> bool:
        """One slice of every input: read without the lock (opening, reading, fingerprinting may block: a FIFO, a
        hung mount), then ingested under it, each input on its own (scrapes get in between)."""
        got = False
        for inp in list(self.inputs):  # `run` may add the trainer's input meanwhile
            try:
                inp.read()
                with self.lock:
                    got |= inp.ingest()
                    self.heartbeat = time.monotonic()
            except Exception:  # one input's bug must not starve the others: counted as its read error, said once
                inp.follow.read_errors += 1
                if id(inp) not in self._failed_inputs:
                    self._failed_inputs.add(id(inp))
                    log.exception("run %s: ingest failed for %s; the other inputs go on (further failures are "
                                  "counted in posttrain_exporter_source_read_errors_total)", inp.spec.run,
                                  inp.spec.path)
        if got and self.stop_signal is not None and not self.catching_up:  # judged as things stand, not mid-history
            self.raise_stop_signal(self.stop_signal)
        return got

    def raise_stop_signal(self, signal: StopSignal) -> None:
        with self.lock:
            for run in self.runs.values():
                run.refresh()
            due = signal.due(self.runs.values())
        signal.write(due)

    def supervise(self, run: str) -> None:
        """`run`: the run's trainer is our child, so its exit, not a silence, says that it stopped
        (RunState.crash_at)."""
        self.run_state(run).supervised = True

    def trainer_exited(self, run: str, status: int) -> None:
        """`run`: the trainer exited with `status` (as a shell gives it); its run's verdict takes it (RunState.crash:
        non-zero is a crash)."""
        with self.lock:
            state = self.runs.get(run)
            if state is not None:
                state.exit_status = status

    def trainer_stopped(self, run: str) -> None:
        """early_stop.action signal: the trainer of `run` was signalled to stop; its dying is no crash."""
        with self.lock:
            state = self.runs.get(run)
            if state is not None:
                state.stopped = True

    def verdict(self, only: str | None = None) -> dict:
        """The runs' verdicts as they stand (/api/v1/verdict)."""
        from exporter.report.live import verdict_document  # not needed by `dump`

        with self.lock:
            for run in self.runs.values():
                run.refresh()
            settings = self.stop_signal.settings if self.stop_signal is not None else EarlyStopSettings()
            stopper = self.trainer_stopper
            stopped = {stopper.run: stopper.stop} if stopper is not None and stopper.stop is not None else None
            return verdict_document(self.runs.values(), settings, only, self.stats, stopped)

    @property
    def catching_up(self) -> bool:
        """Some input has more text waiting than one poll reads: the exporter is reading a log's history."""
        return any(inp.catching_up for inp in self.inputs)

    def read_to_end(self, after_poll: Callable[[], None] | None = None) -> None:
        """`dump`: every input to its end, then everything held is ingested. `after_poll`: called after each
        slice read (the report's progress line)."""
        for inp in self.inputs:
            inp.poll(timeout=0.5)
            while not inp.drained:
                inp.poll(timeout=0.5)
                if after_poll is not None:
                    after_poll()
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
