"""A real log read to its end by the exporter, in process, and what its detectors judged: every episode of
every detector, with the step it began and cleared. The detection tests and bench/detection.py read it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.runstate import RunState


@dataclass(frozen=True)
class Finding:
    detector: str
    alert: str
    severity: str
    instrument: str
    component: str | None
    since: int  # the step the condition began to hold
    start: int  # the step the detector became active
    end: int | None  # the step it cleared, None if still active at the end


def read_log(path: Path, run: str = "run", cfg: Config | None = None) -> RunState:
    ex = Exporter(cfg or Config(), [LogSpec(str(path), run)])
    ex.read_to_end()
    return ex.runs[run]


def findings(state: RunState) -> list[Finding]:
    out = []
    for r in state.detectors.readings():
        d = r.detector
        out += [Finding(d.name, d.alert, d.severity, d.instrument, r.sub, e.since, e.start, e.end)
                for e in r.state.episodes]
    return sorted(out, key=lambda f: (f.start, f.detector))
