"""The verdicts as text for a terminal, and as one JSON object for training CI."""

from __future__ import annotations

import json
import math
from typing import Any

from exporter.report.ranges import regime_shares, regime_timeline, shown, stretches
from exporter.report.samples import samples_json, samples_text
from exporter.report.verdict import (
    NO_DATA,
    Finding,
    RunVerdict,
    finite_or_none,
    hints,
    reward_function_json,
    reward_function_note,
)

SUMMARY_FINDINGS = 3  # findings named in a run's summary


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
        state = "finished" if v.finished else "ended" if v.crash is not None else "still running"
        out.append(f"run {v.run}: {v.verdict.upper()} (last step {v.last_step}, {state})")
        if v.crash is not None:
            out.append(f"  crashed after step {v.last_step}: {v.crash.text}")
        if (note := reward_function_note(v)) is not None:
            out.append(f"  {note}")
        out.extend(judgment_lines(v))
        out.extend(_summary_lines(v))
        if v.findings:
            out.append("  findings:")
        for f in v.findings:
            out.extend(_finding_lines(v, f))
        out += samples_text(v.samples)
        out.extend(_regime_lines(v))
        if v.instruments:
            out += _instrument_table(v)
        out.append("")
    return "\n".join(out)


JUDGMENT_TITLES = {"trajectory": "course", "kl_reward": "KL and reward", "signal": "learning signal",
                   "loss": "loss", "writing": "what it writes"}


def judgment_lines(v: RunVerdict) -> list[str]:
    """The judgment, first: what an experienced engineer would say, what to do, then how each aspect reads and the
    story in order of onset."""
    j = v.judgment
    if j is None or j.recommendation == "not_judged":
        return []
    out = [f"  {j.headline}", f"  what to do: {j.action}"]
    out += [f"  {JUDGMENT_TITLES.get(k, k)}: {text}" for k, text in j.aspects.items()]
    first = j.first_sign
    if j.story:
        out.append("  story:" + (f" (first sign at step {first.step})" if first else ""))
        lines, then = j.told()
        out += [f"    step {e.step:>6}  [{e.kind}] {e.text}" for e in lines]
        out += [f"    {line}" for line in then]
    if j.notes:
        out.append("  notes (passed without an alert):")
        out += [f"    step {e.step:>6}  {e.text}" for e in j.notes]
    return out


NAME_WIDTH_MAX = 64  # a longer instrument name is shortened in its middle, so that the table still fits a terminal


def _instrument_table(v: RunVerdict) -> list[str]:
    """The instruments, one a line, in columns as wide as their widest cell: a long pass-through key (verl's
    `critic/advantages/max`, a reward function's component) never pushes its numbers out of their columns."""
    head = ("instrument", "points", "first", "min", "max", "last", "trend")
    rows = [(_fit(r.label, NAME_WIDTH_MAX), str(r.points), _num(r.first), _num(r.min), _num(r.max), _num(r.last),
             {1: "rising", -1: "falling", 0: "flat"}[r.direction]) for r in v.instruments]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        name, *numbers, trend = cells
        return "  " + " ".join([name.ljust(widths[0]), *(c.rjust(w) for c, w in zip(numbers, widths[1:-1],
                                                                                       strict=True))]) + "  " + trend

    return [line(head), *(line(row) for row in rows)]


def _fit(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    keep = width - 1
    return text[:keep - keep // 2] + "…" + text[len(text) - keep // 2:]


def _no_data(v: RunVerdict) -> list[str]:
    """A run without a training record: what was read, and what to try."""
    out = [f"run {v.run}: NO DATA (no training record read; not judged)"]
    if v.read is not None:
        r = v.read
        formats = ", ".join(f"{f} {n}" for f, n in sorted(r.records.items())) or "none"
        out.append(f"  read: {r.lines} lines; records by format: {formats}; unmatched lines: {r.unmatched}; "
                   f"unreadable: {r.errors}; progress-bar draws: {r.progress}")
        out += [f"  try: {h}" for h in hints(r, v.crash)]
    out.append("")
    return out


_clean = finite_or_none


def _first_step(v: RunVerdict) -> int:
    return v.regimes[0][0] if v.regimes else min((f.first_step for f in v.findings), default=0)


def _summary_lines(v: RunVerdict) -> list[str]:
    """What to read first: the worst findings (pages first) in a line each, the best step, the regimes' shares."""
    out = []
    counts = {s: sum(f.severity == s for f in v.findings) for s in ("critical", "warning")}
    if v.findings:
        said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        worst = "; the worst:" if len(v.findings) > SUMMARY_FINDINGS else ":"
        out.append(f"  summary: {len(v.findings)} finding{'s' if len(v.findings) > 1 else ''} ({said}){worst}")
        for f in v.findings[:SUMMARY_FINDINGS]:
            where = f" [{f.component}]" if f.component else ""
            parts = stretches(f.episodes, _first_step(v), v.last_step)
            out.append(f"    {f.severity.upper():8s} {f.alert}{where}: steps {shown([p.text() for p in parts], 2)}")
        if len(v.findings) > SUMMARY_FINDINGS:
            out.append(f"    and {len(v.findings) - SUMMARY_FINDINGS} more (below)")
    else:
        out.append("  summary: no detector fired")
    if v.unjudged:
        out.append(f"  not judged: {', '.join(v.unjudged)} (it samples completions but logged no key read as "
                   "such; its keys are in posttrain_metric: map the trainer's one with a config `aliases:` entry, "
                   "e.g. {my/reward_mean: reward})")
    if v.best_step is not None:
        out.append(f"  best step {v.best_step}: smoothed reward {_num(v.best_reward)}, KL {_num(v.kl_at_best)}"
                   " (where the smoothed reward was highest; the checkpoint to keep is in the judgment above)")
    if v.regimes:
        out.append("  regime (share of the judged steps): "
                   + ", ".join(f"{name} {_share(share)}" for name, share in regime_shares(v.regimes)))
    return out


def _share(share: float) -> str:
    return f"{share:.0%}" if share >= 0.005 else "<1%"


def _finding_lines(v: RunVerdict, f: Finding) -> list[str]:
    where = f" [{f.component}]" if f.component else ""
    parts = stretches(f.episodes, _first_step(v), v.last_step)
    line = f"  {f.severity.upper():8s} {f.alert}{where}: steps {shown([p.text() for p in parts])}"
    if len(parts) < len(f.episodes):
        fired = sum(p.firing for p in parts)
        line += f"; firing {fired} steps in all"
    return [line, f"           {f.summary} {f.meaning}", f"           runbook: {f.runbook_url}"]


def _regime_lines(v: RunVerdict) -> list[str]:
    if not v.regimes:
        return []
    timeline = regime_timeline(v.regimes)
    items = [f"{a}-{b} {name}" + (f" ({_share(share)})" if share < 1 else "") for a, b, name, share in timeline]
    head = "  regime over time" + (" (the regime that held most of each stretch):" if len(timeline) < len(v.regimes)
                                   else ":")
    return [head, "    " + "; ".join(items)]



def to_json(verdicts: list[RunVerdict]) -> str:
    runs: list[dict[str, Any]] = []
    for v in verdicts:
        runs.append({
            "run": v.run, "verdict": v.verdict, "step": v.last_step, "best_step": v.best_step,
            "best_reward": _clean(v.best_reward), "kl_at_best_step": _clean(v.kl_at_best), "last_step": v.last_step,
            "finished": v.finished, "worst": v.worst(), "read": v.read.as_json() if v.read is not None else None,
            "crash": v.crash.as_json() if v.crash is not None else None, "unjudged": v.unjudged,
            "reward_function": reward_function_json(v.reward_function_errors, v.reward_function_error),
            "judgment": v.judgment.as_json() if v.judgment is not None else None,
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
