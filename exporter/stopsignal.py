"""The early stop signal (config `early_stop`, off by default): when a run's detectors hold a finding at or above
`early_stop.severity` (a page, by default), a small JSON file on the volume the trainer shares says so, and the
trainer's callback (exporter/integrations/trl.py) stops the training on it.

The file holds the run, the training it is about (its identity, when the run's feed says: the callback obeys
only a stop for its own training), its step, the findings that raised it, a one-line reason, and the judgment of
the run as the stop was raised (what it says, the checkpoint to keep, what to change before a new run). It is written
atomically (a temporary file in the same folder, renamed over it), so a reader sees the whole of it or nothing;
written again when another finding joins, or one that had cleared comes back (each write is counted); and it stays
after the findings clear: it is the record of a stop, removed by whoever starts the next training (the callback
ignores a file that was there before it started, or that names another training). A finished run raises no
signal: there is no trainer left to stop, and an exporter started on an old log must not write a stop for it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from exporter import __version__
from exporter.config import ConfigError, EarlyStopSettings
from exporter.report.live import ActiveFinding, active_findings, judgment_of, stopping, training_of
from exporter.runstate import RunState

log = logging.getLogger(__name__)

RUN_PLACEHOLDER = "{run}"  # in early_stop.file: one stop file per run

Finding = tuple[str, str | None]  # (alert, reward component)
Raised = tuple[str, str | None]  # (run, training id): a new training in the run raises its own signal


class StopSignal:
    def __init__(self, settings: EarlyStopSettings) -> None:
        assert settings.file is not None, "a stop signal needs its file"
        self.settings = settings
        self.writes: Counter[tuple[str, str]] = Counter()  # (run, outcome: written or failed)
        self._raised: dict[Raised, frozenset[Finding]] = {}  # per run and training: the findings its file holds
        self._warned: set[str] = set()
        # called with (run, document) for every stop raised, whether its file could be written or not: the stop by
        # signals (exporter/stopping/), which must not wait on a volume that went away
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    def path_for(self, run: str) -> str:
        assert self.settings.file is not None
        return self.settings.file.replace(RUN_PLACEHOLDER, run.replace("/", "_"))  # a run named by its folders

    def due(self, runs: Iterable[RunState]) -> list[tuple[str, str, dict[str, Any]]]:
        """(run, path, document) of each stop file to write now: a run whose findings raising the signal include
        one its file does not hold yet. With the exporter's lock held, each run refreshed."""
        out = []
        for run in runs:
            if run.finished:
                continue
            found = stopping(active_findings(run), self.settings)
            keys = frozenset((f.alert, f.component) for f in found)
            raised = _raised_key(run.name, training_of(run))
            for earlier in [k for k in self._raised if k[0] == run.name and k != raised]:
                del self._raised[earlier]  # an earlier training of the run: its signal is history
            if not keys <= self._raised.get(raised, frozenset()):
                out.append((run.name, self.path_for(run.name), stop_document(run, found)))
            elif keys:
                self._raised[raised] = keys  # one that cleared raises the signal again when it comes back
            else:
                self._raised.pop(raised, None)
        return out

    def write(self, due: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Writes the files `due` returned (without the lock: file I/O must not hold up a scrape). A failed write
        is logged once per file and tried again after the next records."""
        for run, path, doc in due:
            for listener in self.listeners:
                listener(run, doc)
            try:
                write_atomically(path, json.dumps(doc, indent=1) + "\n")
            except OSError as e:
                self.writes[run, "failed"] += 1
                if path not in self._warned:
                    self._warned.add(path)
                    log.error("run %s: cannot write the stop file %s (%s); trying again after the next records "
                              "(further failures are only counted in posttrain_exporter_stop_signals_total)", run,
                              path, e.strerror or e)
                continue
            self.writes[run, "written"] += 1
            self._raised[_raised_key(run, doc["training"])] = frozenset((a["alert"], a["component"])
                                                                        for a in doc["alerts"])
            judged = doc["judgment"]
            log.warning("run %s: stop signal written to %s: %s%s", run, path, doc["reason"],
                        f". The exporter's judgment: {judged['headline']} {judged['action']}" if judged else "")


def stop_document(run: RunState, found: list[ActiveFinding]) -> dict[str, Any]:
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    where = f" [{first.component}]" if first.component else ""
    reason = (f"{first.alert}{where} ({first.severity}) at step {run.step}, held since step {first.since_step}: "
              f"{first.summary}{more}")
    return {"run": run.name, "training": training_of(run), "step": run.step, "alerts": [f.as_json() for f in found],
            "reason": reason, "judgment": _judgment(run),
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "exporter": f"posttrain-exporter {__version__}"}


JUDGMENT_KEYS = ("recommendation", "headline", "action", "keep")


def _judgment(run: RunState) -> dict[str, Any] | None:
    """What to do once it stopped (the judgment's recommendation, headline, action and checkpoint to keep); None,
    with the error logged, where the judgment fails: the stop is written all the same."""
    try:
        judged = judgment_of(run).as_json()
    except Exception:
        log.exception("run %s: the judgment failed; the stop file is written without it", run.name)
        return None
    return {k: judged[k] for k in JUDGMENT_KEYS}


def _raised_key(run: str, training: dict[str, Any] | None) -> Raised:
    return run, training["id"] if training is not None else None


def write_atomically(path: str, text: str) -> None:
    """`text` as the whole of `path`: a temporary file beside it, flushed to disk, renamed over it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a trainer running as another user
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_stop_folder(settings: EarlyStopSettings) -> None:
    """At start: the stop file's folder exists and can be written (raises ConfigError naming the field)."""
    if settings.file is None:
        return
    folder = os.path.dirname(os.path.abspath(settings.file.replace(RUN_PLACEHOLDER, "run")))
    if not os.path.isdir(folder):
        raise ConfigError(f"early_stop.file: folder {folder} does not exist (the volume shared with the trainer)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"early_stop.file: folder {folder} is not writable by the exporter")
