"""The verdicts as one self-contained HTML page: step-aligned charts of every instrument (inline SVG), the
detectors' limits as bands, the findings marked where they fired, the best step, the regime over time.

Nothing is loaded from the network: no scripts, no fonts, no images but the inline SVG."""

from __future__ import annotations

import html
import itertools
import math

import numpy as np

from exporter.detectors.catalog import BY_NAME
from exporter.report.ranges import regime_timeline, shown, stretches
from exporter.report.samples import CSS as SAMPLES_CSS
from exporter.report.samples import samples_html
from exporter.report.verdict import NO_DATA, Finding, RunVerdict, hints, reward_function_note

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 520, 170, 56, 12, 22, 24
MAX_POINTS = 1200  # a longer series is drawn as the min and max of each of this many buckets
ORDER = ["reward_std", "reward", "kl", "entropy", "completion_length", "completion_truncated", "clip_ratio",
         "reward_component", "reward_component_std", "dpo_reward", "dpo_accuracy", "loss", "grad_norm",
         "learning_rate", "policy_ratio", "clip_fraction"]
REGIME_COLOURS = {"improving_with_drift": "#7cb342", "improving_without_drift": "#2e7d32", "converged": "#9e9e9e",
                  "drifting_without_gain": "#f9a825", "destructive": "#c62828", "declining": "#ef6c00",
                  "unknown": "#e0e0e0"}
SEVERITY_COLOURS = {"critical": "#c62828", "warning": "#ef6c00"}
CSS = """
.pts circle:hover{fill-opacity:1}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#212121;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px} h3{font-size:13px;margin:0 0 2px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:600;font-size:13px}
.healthy{background:#2e7d32} .critical{background:#c62828} .warning{background:#ef6c00}
table{border-collapse:collapse;font-size:13px;background:#fff} td,th{border:1px solid #e0e0e0;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f0f0f0} .num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:flex;flex-wrap:wrap;gap:12px} .chart{background:#fff;border:1px solid #e0e0e0;padding:6px}
.muted{color:#757575;font-size:12px} .run{border-top:3px solid #bdbdbd;margin-top:32px;padding-top:8px}
.judgment{background:#f5f5f5;border-left:4px solid #1565c0;padding:4px 12px;margin:12px 0}
.story li.story-sign{font-weight:600;color:#b71c1c}
"""


def _esc(s: object) -> str:
    return html.escape(str(s))


def _fmt(v: float | None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.4g}"


def _downsample(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(steps) <= MAX_POINTS:
        return steps, values
    edges = np.linspace(0, len(steps), MAX_POINTS // 2 + 1).astype(int)
    xs, ys = [], []
    for a, b in itertools.pairwise(edges.tolist()):
        if b <= a:
            continue
        seg = values[a:b]
        i, j = int(np.argmin(seg)), int(np.argmax(seg))
        for k in sorted({i, j}):
            xs.append(steps[a + k])
            ys.append(seg[k])
    return np.array(xs), np.array(ys)


LABEL_H = 12  # px between two limit labels' baselines: a 10px label's box is about 11.6 px high
CHAR_W = 6.4  # px per character of a 10px label: DejaVu Sans's digits (placing the x labels inside the chart)
LOG_DECADES = 2  # a positive series spanning more decades than this is drawn on a log scale
HOVER_R = 3
HALO = 'stroke="#fff" stroke-width="3" paint-order="stroke"'  # a label stays readable over the line it crosses


class _YScale:
    """Linear, or log (base 10) when a series spans decades: values at or below the floor sit on it."""

    def __init__(self, values: np.ndarray, limits: list[float]) -> None:
        every = np.concatenate([values, np.asarray(limits, dtype=np.float64)])
        lo, hi = float(every.min()), float(every.max())
        positive = every[every > 0]
        self.log = bool(lo >= 0 and len(positive) >= 2 and hi / float(positive.min()) > 10 ** LOG_DECADES)
        if self.log:
            floor = max(float(positive.min()), hi * 1e-6)
            lo, hi = 10 ** math.floor(math.log10(floor)), 10 ** math.ceil(math.log10(hi))
        elif hi - lo < 1e-12:
            lo, hi = lo - 0.5 * (abs(lo) or 1), hi + 0.5 * (abs(hi) or 1)
        self.lo, self.hi = lo, hi

    def frac(self, v: float) -> float:
        """0 at the bottom, 1 at the top."""
        if self.log:
            return (math.log10(max(v, self.lo)) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        return (v - self.lo) / (self.hi - self.lo)

    def ticks(self) -> list[float]:
        if not self.log:
            return [self.lo, (self.lo + self.hi) / 2, self.hi]
        a, b = round(math.log10(self.lo)), round(math.log10(self.hi))
        every = max(1, math.ceil((b - a) / 4))  # at most 5 decade labels
        return [10.0 ** e for e in range(a, b + 1, every)] + ([self.hi] if (b - a) % every else [])


def _spread(ys: list[float], top: float, bottom: float) -> list[float]:
    """Label baselines moved apart to LABEL_H at least, in their order, kept between top and bottom."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = list(ys)
    prev = -math.inf
    for i in order:
        out[i] = max(out[i], prev + LABEL_H, top)
        prev = out[i]
    nxt = math.inf
    for i in reversed(order):  # pushed past the bottom: move the stack up
        out[i] = min(out[i], nxt - LABEL_H, bottom)
        nxt = out[i]
    return out


def _x_label(x: float, text: str) -> tuple[float, str]:
    """An x tick label inside the chart: anchored at its end near the right edge, at its start near the left."""
    half = len(text) * CHAR_W / 2
    if x + half > W - 2:
        return W - 2, "end"
    if x - half < 2:
        return 2, "start"
    return x, "middle"


def _chart(title: str, steps: np.ndarray, values: np.ndarray, x0: int, x1: int,
           limits: list[tuple[str, float]], marks: list[tuple[Finding, int, int]], best: int | None) -> str:
    finite = np.isfinite(values)
    steps, values = _downsample(steps[finite], values[finite])
    if not len(values):
        return ""
    scale = _YScale(values, [lim for _, lim in limits])
    span = max(x1 - x0, 1)
    top, bottom = PAD_T, H - PAD_B

    def x(s: float) -> float:
        return PAD_L + (s - x0) / span * (W - PAD_L - PAD_R)

    def y(v: float) -> float:
        return bottom - scale.frac(v) * (bottom - top)

    kind = "log" if scale.log else "linear"
    parts = [f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{_esc(title)}" '
             f'data-y-scale="{kind}">',
             f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
             'fill="#fff" stroke="#e0e0e0"/>']
    for f, a, b in marks:  # where an alert on this instrument fired
        colour = SEVERITY_COLOURS[f.severity]
        parts.append(f'<rect x="{x(a):.1f}" y="{PAD_T}" width="{max(x(b) - x(a), 2):.1f}" '
                     f'height="{H - PAD_T - PAD_B}" fill="{colour}" fill-opacity="0.15">'
                     f'<title>{_esc(f.alert)} steps {a}-{b}</title></rect>')
    if best is not None and x0 <= best <= x1:
        parts.append(f'<line x1="{x(best):.1f}" x2="{x(best):.1f}" y1="{PAD_T}" y2="{H - PAD_B}" stroke="#2e7d32" '
                     'stroke-width="1.5"><title>best step</title></line>')
    label_ys = _spread([y(lim) - 3 for _, lim in limits], top + 9, bottom - 2)
    for name, lim in limits:
        parts.append(f'<line x1="{PAD_L}" x2="{W - PAD_R}" y1="{y(lim):.1f}" y2="{y(lim):.1f}" stroke="#c62828" '
                     f'stroke-dasharray="5,4" stroke-width="1"><title>{_esc(name)}: {_fmt(lim)}</title></line>')
    pts = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in zip(steps.tolist(), values.tolist(), strict=True))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#1565c0" stroke-width="1.2"/>')
    # Hovering a point shows its step and value (the browser's own tooltip: no script in the page).
    parts.append('<g class="pts" fill="#1565c0" fill-opacity="0">' + "".join(
        f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="{HOVER_R}"><title>step {s}: {_fmt(v)}</title></circle>'
        for s, v in zip(steps.tolist(), values.tolist(), strict=True)) + "</g>")
    for (name, lim), ly in zip(limits, label_ys, strict=True):  # over the line, so that it stays readable
        parts.append(f'<text class="limit" x="{W - PAD_R - 2}" y="{ly:.1f}" font-size="10" fill="#c62828" '
                     f'text-anchor="end" {HALO}>{_esc(name)} {_fmt(lim)}</text>')
    for v in scale.ticks():
        parts.append(f'<text class="ytick" x="{PAD_L - 4}" y="{y(v) + 3:.1f}" font-size="10" fill="#616161" '
                     f'text-anchor="end">{_fmt(v)}</text>')
    for s in sorted({x0, (x0 + x1) // 2, x1}):
        lx, anchor = _x_label(x(s), str(s))
        parts.append(f'<text class="xtick" x="{lx:.1f}" y="{H - 8}" font-size="10" fill="#616161" '
                     f'text-anchor="{anchor}">{s}</text>')
    scale_note = " (log scale)" if scale.log else ""
    parts.append(f'<text x="{PAD_L}" y="14" font-size="12" font-weight="600">{_esc(title)}{scale_note}</text></svg>')
    return "".join(parts)


def _step_ticks(x0: int, x1: int, most: int = 7) -> list[int]:
    """Round steps between x0 and x1 (multiples of 1, 2 or 5 times a power of ten), at most `most` of them."""
    span = max(x1 - x0, 1)
    unit = 10 ** math.floor(math.log10(span / most)) if span >= most else 1
    every = next(m * unit for m in (1, 2, 5, 10) if span / (m * unit) <= most)
    first = -(-x0 // every) * every
    return list(range(first, x1 + 1, every))


def _regime_bar(v: RunVerdict, x0: int, x1: int) -> str:
    if not v.regimes:
        return '<p class="muted">No regime: the run logs no KL or no reward.</p>'
    span = max(x1 - x0, 1)
    width = W * 2 - PAD_L
    total = PAD_L + width

    def x(step: float) -> float:
        return PAD_L + (step - x0) / span * width

    rects = []
    # At most one stretch per 2 px: on a long run the regime changes far more often than the bar can show.
    for a, b, name, share in regime_timeline(v.regimes, blocks=width // 2):
        held = f" ({share:.0%} of it)" if share < 1 else ""
        rects.append(f'<rect x="{x(a):.1f}" y="4" width="{max((b + 1 - a) / span * width, 1):.1f}" height="18" '
                     f'fill="{REGIME_COLOURS[name]}"><title>{a}-{b}: {name}{held}</title></rect>')
    # The step axis under the strip: where in the run each regime held, in the charts' unit (logged steps).
    axis = [f'<line class="axis" x1="{PAD_L}" x2="{total}" y1="23.5" y2="23.5" stroke="#9e9e9e"/>',
            f'<text class="axis-name" x="{PAD_L - 4}" y="37" font-size="10" fill="#616161" '
            'text-anchor="end">step</text>']
    for s in _step_ticks(x0, x1):
        tx = x(s)
        label = str(s)
        half = len(label) * CHAR_W / 2
        lx, anchor = (total - 1, "end") if tx + half > total - 1 else (tx, "middle")
        axis.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="23.5" y2="27" stroke="#9e9e9e"/>'
                    f'<text class="xtick" x="{lx:.1f}" y="37" font-size="10" fill="#616161" '
                    f'text-anchor="{anchor}">{label}</text>')
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {n}' for n, c in REGIME_COLOURS.items())
    return (f'<svg class="regime" width="{total}" height="42" viewBox="0 0 {total} 42">'
            f'{"".join(rects)}{"".join(axis)}</svg><div class="muted">{legend}</div>')


_ASPECTS = {"trajectory": "Course", "kl_reward": "KL and reward", "signal": "Learning signal", "loss": "Loss",
            "writing": "What it writes"}


def _judgment(v: RunVerdict) -> str:
    """The judgment first: what an experienced engineer would say and do, each aspect, the story by onset."""
    j = v.judgment
    if j is None or j.recommendation == "not_judged":
        return ""
    out = [f'<div class="judgment"><h2>Judgment: {_esc(j.recommendation.replace("_", " "))}</h2>',
           f"<p><b>{_esc(j.headline)}</b></p><p>{_esc(j.action)}</p><table>"]
    out += [f"<tr><th>{_esc(_ASPECTS.get(k, k))}</th><td>{_esc(t)}</td></tr>" for k, t in j.aspects.items()]
    out.append("</table>")
    if j.story:
        lines, then = j.told()
        out.append("<h3>Story</h3><ol class=\"story\">")
        out += [f'<li class="story-{_esc(e.kind)}">step {e.step} <span class="muted">[{_esc(e.kind)}]</span> '
                f"{_esc(e.text)}</li>" for e in lines]
        out.append("</ol>")
        out += [f'<p class="story-then">{_esc(line[0].upper() + line[1:])}</p>' for line in then]
    if j.notes:
        out.append("<h3>Notes: what passed without an alert</h3><ul>")
        out += [f"<li>step {e.step}: {_esc(e.text)}</li>" for e in j.notes]
        out.append("</ul>")
    out.append("</div>")
    return "".join(out)


def _run_section(v: RunVerdict) -> str:
    steps_all = [int(s[0]) for s, _ in v.series.values()] + [int(s[-1]) for s, _ in v.series.values()]
    x0, x1 = (min(steps_all), max(steps_all)) if steps_all else (0, max(v.last_step or 0, 1))
    worst = v.worst()
    cls = "critical" if v.crash is not None else worst or ("healthy" if v.verdict == "healthy" else "warning")
    # no data is not green, nor is a run whose trainer died
    badge = f'<span class="badge {cls}">{_esc(v.verdict)}</span>'
    out = [f'<section class="run"><h1>{_esc(v.run)} {badge}</h1>',
           f'<p>Last step {v.last_step if v.last_step is not None else "none (no training record read)"} '
           f'({"finished" if v.finished else "ended" if v.crash is not None else "still running"}).']
    if v.crash is not None:
        out.append(f" <b>The trainer died after it:</b> <code>{_esc(v.crash.text)}</code>.")
    if (note := reward_function_note(v)) is not None:
        out.append(f" <b>The reward function is failing:</b> {_esc(note.split(': ', 1)[1])}.")
    if v.unjudged:
        out.append(f" <b>Not judged:</b> {_esc(', '.join(v.unjudged))} (it samples completions but logged no key "
                   "read as such: map the trainer's own key with a config <code>aliases:</code> entry).")
    if v.best_step is not None:
        out.append(f' Best step <b>{v.best_step}</b> (smoothed reward {_fmt(v.best_reward)}, KL '
                   f'{_fmt(v.kl_at_best)}): the reward\'s smoothed peak (green line in the charts).')
    out.append("</p>")
    out.append(_judgment(v))
    if v.findings:
        out.append("<h2>Findings</h2><table><tr><th>severity</th><th>alert</th><th>steps</th>"
                   "<th>what it means</th></tr>")
        for f in v.findings:
            spans = shown([p.text("&ndash;") for p in stretches(f.episodes, x0, v.last_step)])
            comp = f" ({_esc(f.component)})" if f.component else ""
            out.append(f'<tr><td><span class="badge {f.severity}">{f.severity}</span></td>'
                       f'<td><a href="{_esc(f.runbook_url)}">{_esc(f.alert)}</a>{comp}</td><td>{spans}</td>'
                       f"<td>{_esc(f.summary)} {_esc(f.meaning)}</td></tr>")
        out.append("</table>")
    elif v.verdict == NO_DATA:  # not judged: say what was read instead
        read = v.read
        out.append("<p><b>No training record was read: the run is not judged.</b></p>")
        if read is not None:
            formats = ", ".join(f"{f} {n}" for f, n in sorted(read.records.items())) or "none"
            out.append(f"<p>Read {read.lines} lines; records by format: {_esc(formats)}; unmatched lines: "
                       f"{read.unmatched}; unreadable: {read.errors}.</p><ul>"
                       + "".join(f"<li>{_esc(h)}</li>" for h in hints(read, v.crash)) + "</ul>")
    else:
        out.append("<p>No detector fired: no page and no warning would have been raised.</p>")
    out.append(samples_html(v.samples))
    out.append("<h2>KL-versus-reward regime</h2>" + _regime_bar(v, x0, x1))
    out.append('<h2>Instruments, by logged step</h2><p class="muted">Blue: the logged value. Dashed red: the '
               "limit a detector judges it against. Shaded: where an alert on it fired (red a page, orange a "
               "warning).</p><div class=\"grid\">")
    marks_by_input: dict = {}
    for f in v.findings:
        key = BY_NAME[f.detector].input
        if isinstance(key, str):
            key = (key, f.component)
        for e in f.episodes:
            marks_by_input.setdefault(key, []).append((f, e.start, e.end if e.end is not None else f.last_step))
    rank = {name: i for i, name in enumerate(ORDER)}
    for key in sorted(v.series, key=lambda k: (rank.get(k[0], len(ORDER)), k[0], k[1] or "")):
        steps, values = v.series[key]
        title = key[0] + (f" ({key[1]})" if key[1] else "")
        chart = _chart(title, steps, values, x0, x1, v.limits.get(key, []), marks_by_input.get(key, []),
                       v.best_step)
        if chart:
            out.append(f'<div class="chart">{chart}</div>')
    out.append("</div><h2>Every instrument</h2><table><tr><th>instrument</th><th>points</th><th>first</th>"
               "<th>min</th><th>max</th><th>last</th><th>trend (last 50)</th></tr>")
    for r in v.instruments:
        trend = {1: "rising", -1: "falling", 0: "flat"}[r.direction]
        out.append(f"<tr><td>{_esc(r.label)}</td><td class=num>{r.points}</td><td class=num>{_fmt(r.first)}</td>"
                   f"<td class=num>{_fmt(r.min)}</td><td class=num>{_fmt(r.max)}</td><td class=num>{_fmt(r.last)}</td>"
                   f"<td>{trend}</td></tr>")
    out.append("</table></section>")
    return "".join(out)


def to_html(verdicts: list[RunVerdict]) -> str:
    body = "".join(_run_section(v) for v in verdicts)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>posttrain-exporter report</title>'
            f"<style>{CSS}{SAMPLES_CSS}</style></head><body>{body}"
            '<p class="muted">posttrain-exporter report: the same detectors and thresholds as the live alerts.</p>'
            "</body></html>")
