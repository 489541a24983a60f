"""The verdicts as text for a terminal, and as one JSON object for training CI."""

from __future__ import annotations

import json
import math
from typing import Any

from exporter.report.samples import samples_json, samples_text
from exporter.report.verdict import NO_DATA, RunVerdict, finite_or_none, hints


def _num(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}"


def to_text(verdicts: list[RunVerdict]) -> str:
    out = []
    for v in verdicts:
        if v.verdict == NO_DATA:
            out += _no_data(v)
            continue
        state = "finished" if v.finished else "still running"
        out.append(f"run {v.run}: {v.verdict.upper()} (last step {v.last_step}, {state})")
        if v.best_step is not None:
            out.append(f"  best step {v.best_step}: smoothed reward {_num(v.best_reward)}, KL {_num(v.kl_at_best)}"
                       " (the checkpoint to keep)")
        for f in v.findings:
            where = f" [{f.component}]" if f.component else ""
            spans = ", ".join(f"{e.start}-{e.end if e.end is not None else 'end'}" for e in f.episodes)
            out.append(f"  {f.severity.upper():8s} {f.alert}{where}: steps {spans}")
            out.append(f"           {f.summary} {f.meaning}")
            out.append(f"           runbook: {f.runbook_url}")
        out += samples_text(v.samples)
        if v.regimes:
            out.append("  regime: " + "; ".join(f"{a}-{b} {name}" for a, b, name in v.regimes))
        if v.instruments:
            out.append(f"  {'instrument':40s} {'points':>7s} {'first':>10s} {'min':>10s} {'max':>10s} {'last':>10s}"
                       "  trend")
            for r in v.instruments:
                arrow = {1: "rising", -1: "falling", 0: "flat"}[r.direction]
                out.append(f"  {r.label:40s} {r.points:7d} {_num(r.first):>10s} {_num(r.min):>10s} {_num(r.max):>10s} "
                           f"{_num(r.last):>10s}  {arrow}")
        out.append("")
    return "\n".join(out)


def _no_data(v: RunVerdict) -> list[str]:
    """A run without a training record: what was read, and what to try."""
    out = [f"run {v.run}: NO DATA (no training record read; not judged)"]
    if v.read is not None:
        r = v.read
        formats = ", ".join(f"{f} {n}" for f, n in sorted(r.records.items())) or "none"
        out.append(f"  read: {r.lines} lines; records by format: {formats}; unmatched lines: {r.unmatched}; "
                   f"unreadable: {r.errors}; progress-bar draws: {r.progress}")
        out += [f"  try: {h}" for h in hints(r)]
    out.append("")
    return out


_clean = finite_or_none


def to_json(verdicts: list[RunVerdict]) -> str:
    runs: list[dict[str, Any]] = []
    for v in verdicts:
        runs.append({
            "run": v.run, "verdict": v.verdict, "step": v.last_step, "best_step": v.best_step,
            "best_reward": _clean(v.best_reward), "kl_at_best_step": _clean(v.kl_at_best), "last_step": v.last_step,
            "finished": v.finished, "worst": v.worst(), "read": v.read.as_json() if v.read is not None else None,
            "findings": [{"alert": f.alert, "severity": f.severity, "first_step": f.first_step,
                          "last_step": f.last_step, "detector": f.detector, "instrument": f.instrument,
                          "component": f.component, "summary": f.summary, "runbook_url": f.runbook_url,
                          "episodes": [{"since": e.since, "start": e.start, "end": e.end} for e in f.episodes]}
                         for f in v.findings],
            "regimes": [{"from_step": a, "to_step": b, "regime": name} for a, b, name in v.regimes],
            "samples": samples_json(v.samples),
            "instruments": [{"instrument": r.label, "points": r.points, "first": _clean(r.first),
                             "min": _clean(r.min), "max": _clean(r.max), "last": _clean(r.last),
                             "slope_per_step": _clean(r.slope),
                             "trend": {1: "rising", -1: "falling", 0: "flat"}[r.direction]} for r in v.instruments],
        })
    return json.dumps({"runs": runs}, indent=2)
