"""Runs as they stand now, for the exporter's `/api/v1/verdict` and its stop signal: the report's verdict (the
detectors' episodes so far) and the findings active at the last logged step, the state the alerts read.

Call with the exporter's lock held and each run refreshed (its waiting records applied)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exporter.config import STOP_SEVERITIES, EarlyStopSettings
from exporter.judgment.judge import Judgment, judge_run
from exporter.report.verdict import (
    findings,
    read_summary,
    reward_function_json,
    step_of,
    summary_of,
    unjudged,
    verdict_of,
)
from exporter.runstate import RunState

if TYPE_CHECKING:
    from exporter.pipeline import IngestStats

_ORDER = {"critical": 0, "warning": 1}


@dataclass(frozen=True)
class ActiveFinding:
    """A detector active now: its alert is firing (or would be, once Prometheus has scraped it)."""

    alert: str
    detector: str
    severity: str
    component: str | None  # the reward component, for per-component detectors
    since_step: int  # the logged step at which the condition that made it active began to hold
    value: float  # the level judged at its last logged step, and its limit
    limit: float
    summary: str

    def as_json(self) -> dict[str, Any]:
        return {"alert": self.alert, "detector": self.detector, "severity": self.severity,
                "component": self.component, "since_step": self.since_step, "value": _finite(self.value),
                "limit": _finite(self.limit), "summary": self.summary}


# One judgment per run and state: a scrape between two records reads the last one (a judgment costs a few ms).
_JUDGED: dict[int, tuple[RunState, tuple, Judgment]] = {}


def judgment_of(run: RunState) -> Judgment:
    """The run's judgment now (as `report` would make it), computed again only once the run has changed."""
    key = (sum(run.records.values()), run.step, run.resets, run.finished, run.crash is not None,
           len(run.checkpoints.saved), len(run.checkpoints.deleted), run.training)
    got = _JUDGED.get(id(run))
    if got is not None and got[0] is run and got[1] == key:
        return got[2]
    judged = judge_run(run, findings(run), unjudged(run), run.crash)
    if len(_JUDGED) > 4096:  # runs of exporters long gone (tests, `report` calls)
        _JUDGED.clear()
    _JUDGED[id(run)] = (run, key, judged)
    return judged


def active_findings(run: RunState) -> list[ActiveFinding]:
    """The run's detectors that are active now, pages first."""
    out = [ActiveFinding(r.detector.alert, r.detector.name, r.detector.severity, r.sub, r.state.since_step, r.value,
                         r.limit, summary_of(r.detector, run.name, r.sub))
           for r in run.detectors.readings() if r.state.active]
    return sorted(out, key=lambda f: (_ORDER[f.severity], f.since_step, f.alert, f.component or ""))


def stopping(active: list[ActiveFinding], settings: EarlyStopSettings) -> list[ActiveFinding]:
    """The active findings that raise the stop signal: at or above its severity, among its detectors if listed."""
    levels = STOP_SEVERITIES[: STOP_SEVERITIES.index(settings.severity) + 1]
    chosen = settings.detectors
    return [f for f in active if f.severity in levels and (chosen is None or f.detector in chosen)]


def run_document(run: RunState, settings: EarlyStopSettings, stats: IngestStats | None = None,
                 now: float | None = None, stopped: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's verdict as /api/v1/verdict gives it: the fields of `posttrain-exporter report --format json` that
    a run has while it runs (run, verdict, step, finished, worst, read, crash), its active findings, and `stopped`:
    the exporter's stop of its trainer by signals (early_stop.action: signal), once begun."""
    found = findings(run)
    judged = judgment_of(run)  # as `report` judges it (one function)
    active = active_findings(run)
    severities = {f.severity for f in found}
    firing = {(f.alert, f.component) for f in active}
    return {
        "run": run.name,
        "training": training_of(run),
        "step": step_of(run),
        "finished": run.finished,
        # as `posttrain-exporter report` says it, and `stale` once the run has gone quiet for longer than its pace
        "verdict": verdict_of(run, found, time.time() if now is None else now, judged),
        "judgment": judged.as_json(),  # what to do next, as `report` says it
        "read": read_summary(run, stats).as_json(),
        "crash": crash.as_json() if (crash := run.crash) is not None else None,  # how the trainer died, if it did
        # the reward function is failing: its tracebacks, the last one's reason
        "reward_function": reward_function_json(run.reward_function_errors, run.reward_function_error),
        "worst": next((s for s in STOP_SEVERITIES if s in severities), None),
        "stop": bool(stopping(active, settings)),
        "stopped": stopped,
        "active": [f.as_json() for f in active],
        "findings": [{"alert": f.alert, "detector": f.detector, "severity": f.severity, "component": f.component,
                      "first_step": f.first_step, "last_step": f.last_step,
                      "active": (f.alert, f.component) in firing} for f in found],
    }


def training_of(run: RunState) -> dict[str, Any] | None:
    """The training the run's verdict is about ({id, started, step}), when its log says (the TRL callback's feed):
    the trainer acts only on a verdict about its own training. None for logs that do not say."""
    return run.training.as_json() if run.training is not None else None


def verdict_document(runs: Iterable[RunState], settings: EarlyStopSettings, only: str | None = None,
                     stats: Mapping[str, IngestStats] | None = None,
                     stopped: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every run's verdict (or the run named `only`), and the stop signal's settings. `stopped`: by run, the stop
    of its trainer by signals."""
    return {
        "runs": [run_document(r, settings, (stats or {}).get(r.name), stopped=(stopped or {}).get(r.name))
                 for r in runs if only is None or r.name == only],
        "early_stop": {"enabled": settings.enabled, "file": settings.file, "severity": settings.severity,
                       "detectors": None if settings.detectors is None else sorted(settings.detectors),
                       "action": settings.action,
                       **({"signal": settings.signal, "grace_seconds": settings.grace_seconds,
                           "kill_after_seconds": settings.kill_after_seconds} if settings.signals else {})},
    }


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no NaN
