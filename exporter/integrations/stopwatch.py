"""The trainer's side of the early stop: whether the exporter says to stop, from its stop file (config
`early_stop`, exporter/stopsignal.py) or its `/api/v1/verdict` endpoint. Cheap enough to ask at every step: the
file is read only when it changed (one stat otherwise), and the endpoint is asked by a thread of its own, so a
slow or absent exporter never holds up a step. Nothing here raises; problems are logged once.

Only a stop for this training counts: a signal that names another training (the feed's identity line,
exporter/parsers/training.py) is ignored, and so is one about a finished run, one whose step is ahead of the
trainer's own, or a stop file that was there before the training started. The endpoint's latest answer replaces
the one before, so a stop that is no longer about this training is no longer obeyed. A signal that names no
training (an exporter that reads no feed, only the console, say) is taken on the other three checks."""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MAX_STOP_FILE_BYTES = 1 << 20
VERDICT_PATH = "/api/v1/verdict"
# The severities that stop, by the lowest one asked for (the exporter's early_stop.severity, the same words).
SEVERITY_LEVELS = {"critical": ("critical",), "warning": ("critical", "warning")}


@dataclass(frozen=True)
class StopNotice:
    """Why to stop: the run, its step when the exporter raised the signal, the alerts and a one-line reason."""

    run: str | None
    step: int | None
    alerts: tuple[str, ...]
    reason: str
    source: str  # the stop file or the verdict URL
    training: str | None = None  # the id of the training it is about, when the exporter knows it
    judgment: str | None = None  # the exporter's judgment: what it says of the run, the checkpoint, what to change

    def about(self, training: str | None, step: int | None) -> bool:
        """Whether it is a stop for the training `training` (its id) now at `step` (None: not checked)."""
        if training is not None and self.training is not None and self.training != training:
            return False
        return step is None or self.step is None or self.step <= step


class _Once:
    """Logs a problem the first time it happens (per kind), so a failing source does not flood the trainer's log."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def warn(self, kind: str, msg: str, *args: object) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.warning(msg, *args)


class StopFileWatch:
    """The exporter's stop file. A file already there when the training started, and unchanged since, was written
    for an earlier training: it is ignored (and said once). `run`: only a signal for this run counts."""

    def __init__(self, path: str | os.PathLike[str], run: str | None = None) -> None:
        self.path = os.fspath(path)
        self.run = run
        self.training: str | None = None  # the id of the training it watches for, from start()
        self._stale: tuple[int, ...] | None = None
        self._seen: tuple[int, ...] | None = None
        self._notice: StopNotice | None = None
        self._once = _Once()

    def start(self, training: str | None = None) -> None:
        """At the training's start: note the file that is there already, and the training's id."""
        self._stale = self._identity()
        self._seen, self._notice = None, None
        self.training = training

    def check(self, step: int | None = None) -> StopNotice | None:
        """The stop for this training at `step` (the trainer's own), if the file holds one."""
        notice = self._current()
        return notice if notice is not None and notice.about(self.training, step) else None

    def _current(self) -> StopNotice | None:
        ident = self._identity()
        if ident is None:
            self._seen, self._notice = None, None
            return None
        if ident == self._stale:
            self._once.warn("stale", "posttrain-exporter: ignoring the stop file %s: it was there before this "
                            "training started (remove it after a stop)", self.path)
            return None
        if ident != self._seen:
            self._seen, self._notice = ident, self._read()
        return self._notice

    def _identity(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._once.warn("stat", "posttrain-exporter: cannot read the stop file %s (%s)", self.path, e)
            return None
        return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size

    def _read(self) -> StopNotice | None:
        try:
            with open(self.path, "rb") as f:
                doc = json.loads(f.read(MAX_STOP_FILE_BYTES))
        except (OSError, ValueError) as e:
            self._once.warn("read", "posttrain-exporter: cannot read the stop file %s (%s)", self.path, e)
            return None
        notice = notice_of_stop_file(doc, self.path)
        if notice is None:
            self._once.warn("content", "posttrain-exporter: the stop file %s is not one the exporter writes", self.path)
        elif self.run is not None and notice.run != self.run:
            return None
        return notice


def notice_of_stop_file(doc: Any, source: str) -> StopNotice | None:
    """The exporter's stop file as a notice: {"run", "step", "alerts": [{"alert", ...}], "reason", "judgment"}."""
    if not isinstance(doc, dict) or not isinstance(doc.get("reason"), str):
        return None
    alerts = tuple(str(a["alert"]) for a in doc.get("alerts") or [] if isinstance(a, dict) and "alert" in a)
    step = doc.get("step")
    return StopNotice(_str_or_none(doc.get("run")), step if isinstance(step, int) else None, alerts, doc["reason"],
                      source, _training_id(doc), _judgment_text(doc.get("judgment")))


def notice_of_verdict(doc: Any, source: str, run: str | None, severity: str,
                      training: str | None = None) -> StopNotice | None:
    """The first run of /api/v1/verdict (or `run`) with an active finding at or above `severity`, that has not
    finished and, with `training` (an id), is not about another training."""
    levels = SEVERITY_LEVELS[severity]
    for r in doc.get("runs", []) if isinstance(doc, dict) else []:
        if not isinstance(r, dict) or (run is not None and r.get("run") != run) or r.get("finished") is True:
            continue
        about = _training_id(r)
        if training is not None and about is not None and about != training:
            continue
        found = [f for f in r.get("active") or [] if isinstance(f, dict) and f.get("severity") in levels]
        if not found:
            continue
        first = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        step = r.get("step")
        reason = (f"{first.get('alert')} ({first.get('severity')}) at step {step}, held since step "
                  f"{first.get('since_step')}: {first.get('summary')}{more}")
        return StopNotice(_str_or_none(r.get("run")), step if isinstance(step, int) else None,
                          tuple(str(f.get("alert")) for f in found), reason, source, about,
                          _judgment_text(r.get("judgment")))
    return None


def verdict_url(address: str, run: str | None) -> str:
    """The exporter's address (http://127.0.0.1:9847) or its verdict URL, as the URL to ask (for `run` only)."""
    parts = urllib.parse.urlsplit(address)
    path = parts.path.rstrip("/")
    if not path.endswith(VERDICT_PATH):
        path += VERDICT_PATH
    query = urllib.parse.urlencode({"run": run}) if run is not None else parts.query
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


class VerdictPoller:
    """Asks the exporter's /api/v1/verdict every `interval` seconds in a daemon thread; `check` returns the last
    answer at once. `auth`: (user, password) for basic auth; `cafile`: the CA of its TLS certificate."""

    def __init__(self, address: str, run: str | None = None, severity: str = "critical", interval: float = 2.0,
                 timeout: float = 5.0, auth: tuple[str, str] | None = None, cafile: str | None = None) -> None:
        if severity not in SEVERITY_LEVELS:
            raise ValueError(f"severity must be one of {', '.join(SEVERITY_LEVELS)}, got {severity!r}")
        self.url = verdict_url(address, run)
        self.run, self.severity, self.interval, self.timeout = run, severity, interval, timeout
        self._headers = {"Accept": "application/json"}
        if auth is not None:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._context = ssl.create_default_context(cafile=cafile) if cafile else None
        self._notice: StopNotice | None = None
        self.training: str | None = None  # the id of the training it asks for, from start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._once = _Once()
        self._failing = False

    def start(self, training: str | None = None) -> None:
        self.training = training
        self._notice = None
        if self._thread is None:
            self._stop = threading.Event()  # the thread of a previous training keeps its own, set
            self._thread = threading.Thread(target=self._loop, args=(self._stop,), name="posttrain-verdict",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None

    def check(self, step: int | None = None) -> StopNotice | None:
        """The last answer's stop for this training at `step` (the trainer's own), if it said one."""
        notice = self._notice
        return notice if notice is not None and notice.about(self.training, step) else None

    def poll_once(self) -> StopNotice | None:
        """One request; its answer replaces the one before for `check` (an error keeps the previous answer)."""
        try:
            req = urllib.request.Request(self.url, headers=self._headers)
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context) as resp:
                doc = json.loads(resp.read(MAX_STOP_FILE_BYTES * 8))
        except Exception as e:  # the exporter not up yet, restarting, refusing: training goes on
            if not self._failing:
                self._failing = True
                self._once.warn("url", "posttrain-exporter: cannot ask %s (%s); asking again every %gs", self.url, e,
                                self.interval)
            return self._notice
        self._failing = False
        self._notice = notice_of_verdict(doc, self.url, self.run, self.severity, self.training)
        return self._notice

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.poll_once()
            stop.wait(self.interval)


def _training_id(doc: dict) -> str | None:
    """The id of the training a stop file or a run's verdict names (None: it names none)."""
    training = doc.get("training")
    return _str_or_none(training.get("id")) if isinstance(training, dict) else None


def _str_or_none(v: object) -> str | None:
    return v if isinstance(v, str) else None


MAX_JUDGMENT = 2000  # characters of the exporter's judgment said in the trainer's log; a longer one is cut


def _judgment_text(judged: object) -> str | None:
    """The judgment of a stop file or a verdict ({"headline", "action", ...}) for the trainer's log: its headline
    and its action in one line of at most MAX_JUDGMENT characters; None where it holds neither as text."""
    if not isinstance(judged, dict):
        return None
    parts = [v for v in (judged.get("headline"), judged.get("action")) if isinstance(v, str) and v.strip()]
    if not parts:
        return None
    line = " ".join(" ".join(parts).split())
    return line if len(line) <= MAX_JUDGMENT else line[:MAX_JUDGMENT - 3] + "..."
