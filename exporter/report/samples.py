"""What the model wrote, where a person decides: a few printed completions at the run's best step, at the first step
of each finding and at the end (exporter/samples keeps a few rows of each step's set). Text and HTML renderers; the
HTML escapes every text. Only for the report: the samples are never served on /metrics."""

from __future__ import annotations

import html
import math

from exporter.report.verdict import RunVerdict, SampleView
from exporter.runstate import RunState
from exporter.samples.sampleset import Sample

TEXT_WIDTH = 160  # characters of a prompt or completion in the text report (the HTML shows what was kept)


def sample_views(run: RunState, v: RunVerdict) -> list[SampleView]:
    """The views of one run, in step order, one per step shown (reasons joined)."""
    store = run.samples
    if not store.sets:
        return []
    wanted: dict[int, list[str]] = {}
    if v.best_step is not None:
        wanted.setdefault(v.best_step, []).append("best step")
    for f in v.findings:
        wanted.setdefault(f.first_step, []).append(f"first step of {f.alert}")
    wanted.setdefault(max(store.sets), []).append("end")
    views: dict[int, SampleView] = {}
    for step in sorted(wanted):
        s = store.at(step)
        if s is None:
            continue
        if s.step in views:  # two steps asked for, one set kept near both
            old = views[s.step]
            views[s.step] = SampleView(f"{old.why}; {', '.join(wanted[step])}", old.step, s.step, s.source, s.samples)
        else:
            views[s.step] = SampleView(", ".join(wanted[step]), step, s.step, s.source, s.samples)
    return list(views.values())


def _one_line(text: str, width: int = TEXT_WIDTH) -> str:
    flat = repr(text)[1:-1]  # newlines and control characters visible, as escapes
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _rewards(x: Sample) -> str:
    parts = [f"{k}={'nan' if math.isnan(r) else f'{r:.3g}'}" for k, r in x.rewards.items()]
    if x.advantage is not None:
        parts.append(f"advantage={x.advantage:.3g}")
    return ", ".join(parts)


def samples_text(views: list[SampleView]) -> list[str]:
    out = []
    if views:
        out.append("  samples (printed by the trainer; a few rows of the step's set):")
    for view in views:
        at = f"step {view.shown_step}" + (f" (nearest kept to {view.step})" if view.shown_step != view.step else "")
        out.append(f"    {at}, {view.why}:")
        for x in view.rows:
            out.append(f"      prompt:     {_one_line(x.prompt)}")
            out.append(f"      completion: {_one_line(x.completion)}" + (f"   [{_rewards(x)}]" if _rewards(x) else ""))
    return out


def samples_json(views: list[SampleView]) -> list[dict]:
    return [{"why": view.why, "step": view.step, "shown_step": view.shown_step, "source": view.source,
             "rows": [{"prompt": x.prompt, "completion": x.completion,
                       "rewards": {k: (None if math.isnan(r) else r) for k, r in x.rewards.items()},
                       "advantage": x.advantage} for x in view.rows]} for view in views]


CSS = """
.samples td.text{font-family:ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;max-width:520px}
.samples caption{text-align:left;font-weight:600;padding:6px 0}
"""


def samples_html(views: list[SampleView]) -> str:
    if not views:
        return ""  # the trainer printed none (TRL: log_completions=True, with rich installed)
    out = ['<h2>Samples</h2><p class="muted">Completions as the trainer printed them (a few rows of the step\'s '
           "set): read them before trusting the reward.</p>"]
    for view in views:
        near = f" (nearest kept to {view.step})" if view.shown_step != view.step else ""
        out.append(f'<table class="samples"><caption>Step {view.shown_step}{near}: {html.escape(view.why)}</caption>'
                   "<tr><th>prompt</th><th>completion</th><th>rewards</th></tr>")
        for x in view.rows:
            out.append(f'<tr><td class="text">{html.escape(x.prompt)}</td>'
                       f'<td class="text">{html.escape(x.completion)}</td><td>{html.escape(_rewards(x))}</td></tr>')
        out.append("</table>")
    return "".join(out)
