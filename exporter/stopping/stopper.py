"""The stop by signals: once per training, when the stop signal is raised for the run this stopper watches, the
graceful signal, then SIGTERM after the grace period, then SIGKILL, each only while the trainer still runs.

Once the graceful signal is sent the stop goes ahead, even if the finding clears meanwhile: the trainer may be
saving already, and a half-stopped trainer is worse than a stopped one. Each signal is counted by outcome
(posttrain_exporter_trainer_signals_total) and logged; a signal that cannot be sent (a process of another user,
none found) is logged at error level, and the stop file is written all the same.

`record` (serve): the stop is kept in a small JSON file beside the stop file, so that an exporter restarted
mid-run does not stop the training a second time: it takes up the escalation where it was (by the times
recorded) while the processes it signalled still run, and sends nothing when they are gone."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from exporter.config import EarlyStopSettings
from exporter.stopping.procfs import Process
from exporter.stopping.targets import SENT, Outcome, Target
from exporter.stopsignal import write_atomically

log = logging.getLogger(__name__)

# `run`'s exit status when it stopped its trainer: none of a shell's (1-2, 126-128, 128+N for a signal N up to 64)
# nor one a trainer gives for its own failures in common use; the trainer's own status is logged beside it.
STOPPED_EXIT = 86
POLL_SECONDS = 0.2  # how often a stopping trainer is checked for having exited


class TrainerStopper:
    def __init__(self, settings: EarlyStopSettings, run: str, target: Target, record: str | None = None) -> None:
        self.settings, self.run, self.target, self.record = settings, run, target, record
        self.signals: Counter[tuple[str, str]] = Counter()  # (signal, outcome)
        self.stop: dict[str, Any] | None = None  # the stop as the verdict gives it, once begun
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._record_base: dict[str, Any] = {}  # what the record holds besides the signals sent
        self.on_sent: Callable[[str], None] = lambda run: None  # told once the trainer was signalled to stop

    @property
    def stopped(self) -> bool:
        """The graceful signal reached the trainer: the exporter stopped it (`run` exits STOPPED_EXIT)."""
        stop = self.stop
        return stop is not None and any(s["outcome"] == SENT for s in stop["signals"])

    def request(self, run: str, doc: dict[str, Any]) -> None:
        """The stop signal was raised (exporter/stopsignal.py's document `doc`): begin the stop, once, for our run."""
        if run != self.run:  # another run's log or feed beside the trainer's: never a reason to stop this trainer
            return
        with self._lock:
            if self.stop is not None or self._closed.is_set():
                return
            training = (doc.get("training") or {}).get("id")
            self.stop = {"run": run, "training": training, "step": doc.get("step"), "reason": doc.get("reason"),
                         "alerts": [a.get("alert") for a in doc.get("alerts", [])], "target": self.target.describe(),
                         "signals": [], "grace_seconds": self.settings.grace_seconds}
            earlier = self._recorded(training)
            self._thread = threading.Thread(target=self._escalate, args=(earlier,), name="trainer-stop", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Until the escalation ended (the trainer exited, or the last signal was sent); True if it did."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        self._closed.set()

    # --- the escalation ---------------------------------------------------------------------------------------

    def _escalate(self, earlier: dict[str, Any] | None) -> None:
        assert self.stop is not None
        s = self.settings
        if earlier is not None:  # a restarted exporter: the processes it signalled, and when
            processes = [Process(p["pid"], p["started"], 0, p.get("command", "")) for p in earlier["processes"]]
            if not self.target.alive(processes):
                log.info("run %s: the trainer was stopped before this exporter started (%s); not stopping it again",
                         self.run, self.record)
                self.stop["signals"] = earlier.get("signals", [])
                return
            began = float(earlier["sent_at"])
            self.stop["signals"] = earlier.get("signals", [])
            log.warning("run %s: taking up the stop begun at %s (the exporter restarted): not signalling again",
                        self.run, _iso(began))
        else:
            processes = self.target.find()
            began = time.time()
            if not self._send(signal.Signals[s.signal], processes, first=True):
                return
            self._write_record(processes, began)
        self.on_sent(self.run)
        for sig, at in ((signal.SIGTERM, began + s.grace_seconds),
                        (signal.SIGKILL, began + s.grace_seconds + s.kill_after_seconds)):
            if not self._until(at, processes):
                return
            if any(st["signal"] == sig.name for st in self.stop["signals"]):
                continue  # sent before a restart
            self._send(sig, processes)

    def _until(self, at: float, processes: list[Process]) -> bool:
        """Waits until `at` (wall time) while the trainer runs; False once it has exited (or we close)."""
        while self.target.alive(processes):
            left = at - time.time()
            if left <= 0:
                return True
            if self._closed.wait(min(left, POLL_SECONDS)):
                return False
        log.info("run %s: the trainer exited after the stop", self.run)
        return False

    def _send(self, sig: signal.Signals, processes: list[Process], *, first: bool = False) -> bool:
        assert self.stop is not None
        out: Outcome = self.target.send(sig, processes) if processes else Outcome(
            "not_found", f"no process found: {self.target.describe()}")
        self.signals[sig.name, out.outcome] += 1
        self.stop["signals"].append({"signal": sig.name, "at": _iso(time.time()), "outcome": out.outcome,
                                     "pids": out.pids, **({"detail": out.detail} if out.detail else {})})
        if out.outcome != SENT:
            log.error("run %s: cannot send %s to %s: %s; the stop file is written all the same (further attempts "
                      "are counted in posttrain_exporter_trainer_signals_total)", self.run, sig.name,
                      self.target.describe(), out.detail)
            return False
        if first:
            log.warning("run %s: stopping the trainer (%s, pid %s): %s sent at step %s: %s; SIGTERM in %gs and "
                        "SIGKILL %gs later if it still runs", self.run, self.target.describe(),
                        ",".join(map(str, out.pids)), sig.name, self.stop["step"], self.stop["reason"],
                        self.settings.grace_seconds, self.settings.kill_after_seconds)
        else:
            log.warning("run %s: the trainer still runs %s after the stop began: %s sent", self.run,
                        "its grace period" if sig is signal.SIGTERM else "SIGTERM", sig.name)
        if self.record is not None and not first:
            self._write_record(None, None)
        return True

    # --- the record of a stop, for an exporter that restarts --------------------------------------------------

    def _recorded(self, training: str | None) -> dict[str, Any] | None:
        if self.record is None:
            return None
        try:
            with open(self.record, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("run") != self.run or doc.get("training") != training:
            return None  # another training's stop: history
        if not isinstance(doc.get("processes"), list) or not isinstance(doc.get("sent_at"), int | float):
            return None
        return doc

    def _write_record(self, processes: list[Process] | None, began: float | None) -> None:
        if self.record is None:
            return
        assert self.stop is not None
        if processes is not None:
            self._record_base = {"run": self.run, "training": self.stop["training"], "step": self.stop["step"],
                                 "sent_at": began, "processes": [p.as_json() for p in processes]}
        doc = {**self._record_base, "signals": self.stop["signals"]}
        try:
            write_atomically(self.record, json.dumps(doc) + "\n")
        except OSError as e:
            log.error("run %s: cannot write the stop's record %s (%s): an exporter restarted now would not "
                      "know this training was stopped", self.run, self.record, e.strerror or e)


def record_path(stop_file: str) -> str:
    """The record of a stop by signals, beside the stop file."""
    folder, name = os.path.split(stop_file)
    return os.path.join(folder, f".{name}.signalled")


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
