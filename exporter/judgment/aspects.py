"""Each aspect of a run in one sentence, as a practitioner says it, and the story lines of its course and notes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from exporter.judgment.course import Course, rolling_median, window_of
from exporter.judgment.loss import LossPattern
from exporter.judgment.measure import arrays
from exporter.judgment.signal import Component, TiedGroups, edge_levels
from exporter.judgment.story import COURSE, NO_TREND, NOTE, PEAKED, SIGN, STOP, STOP_NOW, Event, FindingLike
from exporter.runstate import RunState, SeriesKey

KL_RISE_RATIO, KL_RISE_MIN = 1.5, 0.05  # KL rising over the recent third: 1.5x its level there, and by 0.05
MAX_NOTES = 5
KL: SeriesKey = ("kl", None)
LENGTH: SeriesKey = ("completion_length", "mean")
TRUNCATED: SeriesKey = ("completion_truncated", None)
ENTROPY: SeriesKey = ("entropy", None)
TOP_SHARE: SeriesKey = ("completion_diversity", "top_share")


def fmt(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def level(v: float, what: str) -> float:
    return -v if what == "loss" else v


def trajectory_text(c: Course, what: str) -> str:
    if c.shape == "short":
        return f"too early to say where the {what} is going: {c.points} logged steps"
    a, b, p, last = (fmt(level(x, what)) for x in (c.start, c.peak, c.peak, c.last))
    verb = "fell" if what == "loss" else "rose"
    if c.shape == "rising":
        return f"the {what} is still improving: {verb} from {a} to {last} (smoothed), no plateau yet"
    if c.shape == "slowing":
        return f"the {what} is still improving but more slowly: {verb} from {a} to {last}, its rate falling"
    if c.shape == "plateau":
        return (f"the {what} {verb} from {a} to {b} and has been flat since step {c.since_step} (at {last}): "
                "converged")
    if c.shape == "peaked":
        return (f"the {what} peaked at {p} at step {c.peak_step} and has declined since step {c.since_step} "
                f"(now {last})")
    if c.shape == "falling":
        return f"the {what} never improved: it went from {a} to {last}"
    return (f"no trend in the {what} through its noise: {a} at the start, {last} at the end, within "
            f"{fmt(c.real)} of each other")


def course_events(c: Course, what: str) -> list[Event]:
    if c.shape == "plateau" and c.since_step is not None:
        return [Event(c.since_step, f"the {what} stopped improving (flat from here at "
                                    f"{fmt(level(c.last, what))})", COURSE)]
    if c.shape == "peaked" and c.since_step is not None:
        return [Event(c.peak_step, f"the {what} peaked ({fmt(level(c.peak, what))})", COURSE),
                Event(c.since_step, f"the {what} declined clearly below its peak (now {fmt(level(c.last, what))})",
                      SIGN, STOP_NOW, reason=f"the {what} peaked at step {c.peak_step} and is declining: the model "
                                             "was better earlier", cause=PEAKED)]
    if c.shape in ("no_trend", "falling"):
        return [Event(c.start_step, f"the {what} shows no improvement from the start"
                                    + (" (falling)" if c.shape == "falling" else " (no trend through the noise)"),
                      SIGN, STOP, reason=f"the {what} never improved: the task is not being learnt",
                      cause=NO_TREND)]
    return []


def signal_text(tied: TiedGroups | None, components: list[Component]) -> str:
    parts = []
    if tied is not None:
        s = f"{pct(tied.start)} of groups tie at the start, {pct(tied.end)} at the end"
        if tied.most_since is not None:
            s += f" (half or more from step {tied.most_since}: they give no advantage)"
        parts.append(s)
    parts += [component_text(c) for c in components]
    return "; ".join(parts)


def component_text(c: Component) -> str:
    """What one reward component did, as its course and its levels say: never fired, at its ceiling from the start
    (and whether it stayed there), rose, peaked and fell back, or did not move."""
    span = f"{fmt(c.start)} -> {fmt(c.end)}"
    course = c.course
    since = f" from step {course.since_step}" if course.shape in ("peaked", "falling") and course.since_step else ""
    if c.silent:
        return f"{c.name} never fired (0 on {c.points - c.fired} of {c.points} logged steps)"
    if c.at_ceiling and c.fell:
        return f"{c.name} started near its ceiling ({fmt(c.start)}, highest {fmt(c.peak)}) and fell to {fmt(c.end)}" \
               + since
    if c.at_ceiling:
        return f"{c.name} was near its ceiling from the start ({span}, highest {fmt(c.peak)})"
    if course.shape == "peaked":
        # back to where it began: within a tenth of its rise of its first level
        back = c.end - c.start <= 0.1 * (course.peak - c.start)
        return (f"{c.name} peaked at step {course.peak_step} ({fmt(course.peak)} smoothed, from {fmt(c.start)}) and "
                f"fell back{since}{' to where it began' if back else ''} (now {fmt(c.end)})")
    if course.shape == "plateau":
        return f"{c.name} rose, then flattened from step {course.since_step} ({span})"
    if course.shape in ("rising", "slowing"):
        return f"{c.name} rose ({span}{', its rate falling' if course.shape == 'slowing' else ''})"
    if course.shape == "falling":
        return f"{c.name} fell ({span})"
    return f"{c.name} did not move ({span})"


REWARD_DIRECTION = {"rising": 1, "slowing": 1, "plateau": 0, "no_trend": 0, "peaked": -1, "falling": -1}


def kl_relation(run: RunState, course: Course | None) -> str:
    """What the KL did beside the progress measure, over the same stretch as the measure's course says: since its
    plateau or peak, else the whole run. The measure's direction is the course's own, so the two sentences never
    disagree; KL levels are rolling medians, so that one spike moves no level."""
    kl = arrays(run, KL)
    if kl is None or len(kl[0]) < 20 or course is None or course.shape not in REWARD_DIRECTION:
        return ""
    steps, values = kl
    w = window_of(len(values))
    levels = rolling_median(values, w)
    since = course.since_step if course.shape in ("plateau", "peaked") and course.since_step is not None else None
    i = w - 1 if since is None else max(w - 1, int(np.searchsorted(steps, since)))
    if i >= len(values) - 1:
        return ""
    before, after = float(levels[i]), float(levels[-1])
    rising = after >= KL_RISE_RATIO * before and after - before >= KL_RISE_MIN
    falling = before >= KL_RISE_RATIO * after and before - after >= KL_RISE_MIN
    r_dir = REWARD_DIRECTION[course.shape]
    k = "rising" if rising else "falling" if falling else "stable"
    name = {("rising", 1): "changing and improving (healthy)",
            ("rising", 0): "drifting without gain: the run has run its course",
            ("rising", -1): "destructive: worse and further from the reference",
            ("stable", 1): "improving without drifting (ideal)",
            ("stable", 0): "converged: neither moves",
            ("stable", -1): "the reward falls without drift",
            ("falling", 1): "the KL falls while the reward rises",
            ("falling", 0): "the KL falls, the reward is flat",
            ("falling", -1): "both fall"}[k, r_dir]
    limit = run.settings.thresholds.kl_critical
    if after >= limit and k != "falling":  # that far from its reference, the policy is lost
        name = f"past the KL stop threshold of {fmt(limit)}: whatever the reward does, the policy left its reference"
    stretch = f"since step {since}" if since is not None else "over the run"
    top = int(np.argmax(values))
    return (f"{stretch}: KL {k} ({fmt(before)} -> {fmt(after)}), reward "
            f"{'rising' if r_dir > 0 else 'falling' if r_dir < 0 else 'flat'}: {name}; KL highest {fmt(values[top])}"
            f" (smoothed over its bucket) at step {int(steps[top])}")


def loss_text(p: LossPattern, what: str) -> str:
    surrogate = what in ("reward", "reward margin")
    if p.shape == "short":
        return "too few logged steps to read the loss"
    if p.shape == "discontinuity":
        return (f"a discontinuity at step {p.step}: its size went from {fmt(p.before)} to {fmt(p.after)} "
                "(investigate: a learning-rate step, a data shift, an update blowing up)")
    if p.shape == "oscillating":
        return ("oscillating around zero with no direction" + (
            " (a policy-gradient surrogate: expected while the reward moves, noise if it does not)" if surrogate
            else ""))
    return {"steady": "steady", "declining": "steadily declining", "rising": "rising"}[p.shape] + (
        " (a surrogate objective: not a progress measure)" if surrogate else "")


def writing_text(run: RunState) -> str:
    parts = []
    for key, name, unit in ((LENGTH, "completion length", " tokens"), (ENTROPY, "entropy", ""),
                            (TRUNCATED, "truncated completions", ""), (TOP_SHARE, "rows that are the most common "
                                                                                   "completion", "")):
        got = arrays(run, key)
        if got is None or len(got[1]) < 10:
            continue
        a, b = edge_levels(got[1])
        if unit or name == "entropy":
            change = f" ({(b / a - 1) * 100:+.0f}%)" if a else ""
            parts.append(f"{name} {fmt(a)} -> {fmt(b)}{unit}{change}{turns_text(*got, unit)}")
        else:
            parts.append(f"{name} {pct(a)} -> {pct(b)}")
    return "; ".join(parts)


TURN_RATIO = 0.6  # a low below 0.6x the lower end, or a high above the higher end / 0.6: the course turned
TURN_WINDOW = 5  # rolling median of this many points, so that one odd step is no turn


def turns_text(steps: np.ndarray, values: np.ndarray, unit: str = "") -> str:
    """Where a series went far outside both its ends on the way (length that collapsed, then grew back past where
    it began): its low and its high with their steps; '' where it went from one end to the other."""
    if len(values) < 2 * TURN_WINDOW:
        return ""
    a, b = edge_levels(values)
    m = rolling_median(values, TURN_WINDOW)
    finite = np.isfinite(m)
    if not finite.any() or min(a, b) <= 0:
        return ""
    idx = np.flatnonzero(finite)
    lo, hi = idx[int(np.argmin(m[finite]))], idx[int(np.argmax(m[finite]))]
    out = []
    if m[lo] < TURN_RATIO * min(a, b):
        out.append((int(steps[lo]), f"a low of {fmt(float(m[lo]))}{unit} at step {int(steps[lo])}"))
    if m[hi] > max(a, b) / TURN_RATIO:
        out.append((int(steps[hi]), f"a high of {fmt(float(m[hi]))}{unit} at step {int(steps[hi])}"))
    return ", through " + " and ".join(t for _, t in sorted(out)) if out else ""


def spike_notes(run: RunState, found: Sequence[FindingLike]) -> list[Event]:
    """Single steps past the KL stop threshold that no KL page covered (it needs the level held): their step and
    value, the highest first, at most MAX_NOTES."""
    t = run.trajectories.get(KL)
    if t is None or not len(t):
        return []
    limit = run.settings.thresholds.kl_critical
    paged = any(f.detector == "kl_critical" for f in found)
    steps, peaks = t.peaks()
    over = np.flatnonzero(peaks > limit)
    if paged or not len(over):
        return []
    spikes: list[tuple[int, int, float]] = []  # (first step, last step, highest): adjacent buckets are one spike
    for i in over.tolist():
        if spikes and i - 1 in over and spikes[-1][1] == int(steps[i - 1]):
            a, _, top = spikes[-1]
            spikes[-1] = (a, int(steps[i]), max(top, float(peaks[i])))
        else:
            spikes.append((int(steps[i]), int(steps[i]), float(peaks[i])))
    chosen = sorted(sorted(spikes, key=lambda s: -s[2])[:MAX_NOTES])
    out = [Event(a, f"KL spiked to {fmt(top)} at step {a}" + (f"-{b}" if b != a else "")
                 + f" (past the {fmt(limit)} stop threshold) and came back: no page, which needs the level held",
                 NOTE) for a, b, top in chosen]
    if len(spikes) > MAX_NOTES:
        out.append(Event(chosen[-1][0], f"{len(spikes) - MAX_NOTES} more such KL spikes", NOTE))
    return out
