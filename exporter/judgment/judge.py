"""One run's judgment: the course, the KL-reward relation, the learning signal, the loss, what the model writes, the
story in order of onset, the notes of what passed without an alert, the checkpoint to keep and the recommendation.

The findings (the detectors' episodes, what the alerts say) come in from the caller; everything else is read from
the run's trajectories (instruments/trajectory.py), the same live and after the run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from exporter.judgment.checkpoints import Keep, keep_of
from exporter.judgment.course import Course, change_over, course_of
from exporter.judgment.loss import LossPattern, loss_pattern, lr_steps
from exporter.judgment.measure import LOSS, MARGIN, REWARD, arrays, progress_arrays
from exporter.judgment.signal import Component, TiedGroups, component_of, edge_levels, tied_groups
from exporter.parsers.failures import Failure
from exporter.runstate import RunState, SeriesKey

# The recommendations, most urgent first.
STOP_NOW, INVESTIGATE, STOP, CONTINUE, NOT_JUDGED = "stop_now", "investigate", "stop", "continue", "not_judged"
RECOMMENDATIONS = (STOP_NOW, INVESTIGATE, STOP, CONTINUE, NOT_JUDGED)
# Detectors whose finding means continuing makes the model worse: stop now, keep a checkpoint from before it.
DESTRUCTIVE = frozenset({"kl_critical", "destructive_regime", "nonfinite_loss_or_kl", "completion_length_growing",
                         "completion_length_shrinking", "completions_truncated", "template_collapse",
                         "entropy_collapse", "dpo_displacement", "reward_peaked_and_fell"})
# ... whose finding means the run has nothing left to learn: stop, it has run its course.
RUN_ITS_COURSE = frozenset({"reward_std_collapsed", "learning_signal_dead", "dpo_saturated",
                            "drifting_without_gain"})
# ... a component that never fired: a sign to stop where the judgment finds the task is not being learnt.
SILENT = "reward_component_silent"
# ... whose finding asks for a look before anything else.
LOOK_FIRST = frozenset({"loss_discontinuity"})
KL_RISE_RATIO, KL_RISE_MIN = 1.5, 0.05  # KL rising over the recent third: 1.5x its level there, and by 0.05
MAX_NOTES = 5

KL: SeriesKey = ("kl", None)
ZERO_STD: SeriesKey = ("reward_zero_std", None)
LENGTH: SeriesKey = ("completion_length", "mean")
TRUNCATED: SeriesKey = ("completion_truncated", None)
ENTROPY: SeriesKey = ("entropy", None)
TOP_SHARE: SeriesKey = ("completion_diversity", "top_share")


class FindingLike(Protocol):
    """What the judgment reads of a finding (report/verdict.py's Finding)."""

    alert: str
    detector: str
    severity: str
    component: str | None
    first_step: int
    summary: str

    @property
    def onset(self) -> int: ...


# What a line of the story is: a sign that decides the recommendation (the story's first sign is the earliest),
# a warning that came with it, the course of the progress measure, or a note of what passed without an alert.
SIGN, WARNING, COURSE, NOTE = "sign", "warning", "course", "note"


@dataclass(frozen=True)
class Event:
    step: int
    text: str
    kind: str = WARNING
    recommends: str | None = None  # for a sign: what it calls for
    page: bool = False  # a sign that pages (a critical finding, the trainer's death)
    reason: str = ""  # for a sign: what it says, short (the headline's reason)

    @property
    def sign(self) -> bool:
        return self.kind == SIGN

    def as_json(self) -> dict[str, Any]:
        return {"step": self.step, "text": self.text, "kind": self.kind}


@dataclass
class Judgment:
    recommendation: str  # RECOMMENDATIONS
    headline: str  # what an experienced engineer would say, in one or two sentences
    action: str  # what to do next
    learning: bool | None  # whether the task is being learnt (None: not judged)
    not_learning: str | None  # why not, when it is not
    aspects: dict[str, str]  # trajectory, kl_reward, signal, loss, writing: one sentence each (absent: not logged)
    story: list[Event]
    notes: list[Event]
    keep: Keep | None
    course: Course | None = field(default=None, repr=False)

    @property
    def first_sign(self) -> Event | None:
        return next((e for e in self.story if e.sign), None)

    def as_json(self) -> dict[str, Any]:
        first = self.first_sign
        return {"recommendation": self.recommendation, "headline": self.headline, "action": self.action,
                "learning": self.learning, "not_learning": self.not_learning, "aspects": dict(self.aspects),
                "first_sign": first.as_json() if first else None, "story": [e.as_json() for e in self.story],
                "notes": [e.as_json() for e in self.notes], "keep": self.keep.as_json() if self.keep else None}


def _fmt(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def not_judged(reason: str) -> Judgment:
    return Judgment(NOT_JUDGED, f"Not judged: {reason}.", "Point the exporter at the trainer's metrics.", None,
                    None, {}, [], [], None)


def judge_run(run: RunState, found: Sequence[FindingLike], unjudged: Sequence[str] = (),
              crash: Failure | None = None) -> Judgment:
    """The judgment of `run` (refreshed) with its findings; `unjudged`: instruments its kind logs that it did not
    (report/verdict.py), `crash`: how its trainer died."""
    if not run.trainer_records:
        return not_judged("no training record was read")
    if "reward" in unjudged:
        return not_judged("the run samples completions but logs no reward the exporter reads (map its key with "
                          "`aliases:`)")
    story: list[Event] = []
    aspects: dict[str, str] = {}
    course, what = _progress(run)
    if course is not None:
        aspects["trajectory"] = _trajectory_text(course, what)
        story += _course_events(course, what)
    components = _components(run)
    tied = _tied(run)
    signal = _signal_text(tied, components)
    if signal:
        aspects["signal"] = signal
    learning, why_not = _learning(course, what, components)
    first = course.start_step if course is not None else max(run.step, 0)
    by_finding = {f.component for f in found if f.detector == SILENT}  # the alert says it: one line, not two
    for c in components:
        if c.silent and c.name not in by_finding:
            story.append(Event(_first_step(run, ("reward_component", c.name), first),
                               f"reward component {c.name} never fired: it scored 0 on {c.points - c.fired} of its "
                               f"{c.points} logged steps (highest {_fmt(c.peak)})",
                               SIGN if learning is False else WARNING, STOP if learning is False else None,
                               reason=f"the task is not being learnt ({c.name} never fired)"))
    if tied is not None and tied.most_since is not None:
        story.append(Event(tied.most_since, "half or more of the groups tie from here (no reward spread, no "
                           f"advantage): {_pct(tied.start)} at the start, {_pct(tied.end)} at the end"))
    relation = _kl_relation(run, course)
    if relation:
        aspects["kl_reward"] = relation
    lr_changes = _lr_changes(run)
    for step, a, b in lr_changes[:MAX_NOTES]:
        story.append(Event(step, f"the learning rate stepped from {_fmt(a)} to {_fmt(b)}", COURSE))
    loss = _loss(run, what, lr_changes)
    if loss is not None:
        aspects["loss"] = _loss_text(loss, what)
        if loss.shape == "discontinuity" and loss.step is not None:
            story.append(Event(loss.step, f"the loss's size jumped from {_fmt(loss.before)} to {_fmt(loss.after)} "
                                          "(median |loss| of 20 logged steps each side): a learning-rate step, a data "
                                          "shift or an update blowing up", SIGN, INVESTIGATE,
                               reason="the loss jumped"))
    writing = _writing_text(run)
    if writing:
        aspects["writing"] = writing
    for f in found:
        calls = (STOP_NOW if f.detector in DESTRUCTIVE else STOP if f.detector in RUN_ITS_COURSE
                 or (f.detector == SILENT and learning is False) else INVESTIGATE if f.detector in LOOK_FIRST
                 else None)
        story.append(Event(f.onset, f"{f.alert} ({f.severity}): {f.summary}", SIGN if calls else WARNING, calls,
                           f.severity == "critical", f"the task is not being learnt ({f.component} never fired)"
                           if f.detector == SILENT else f.summary.rstrip(".")))
    if crash is not None:
        story.append(Event(max(run.step, 0), f"the trainer died: {crash.text}", SIGN, INVESTIGATE, True,
                           f"the trainer died: {crash.text}"))
    story.sort(key=lambda e: (e.step, e.kind != SIGN, RECOMMENDATIONS.index(e.recommends or NOT_JUDGED)))
    rec, reason, decisive = _recommend(story, course, learning, relation, crash)
    # only the signs that agree with the recommendation stay signs; the others are warnings that came with them
    story = [e if not e.sign or e.recommends == rec else Event(e.step, e.text, WARNING) for e in story]
    keep = keep_of(run, course, decisive.step if rec == STOP_NOW and decisive else None) if what else None
    headline, action = _headline(rec, reason, why_not, keep)
    return Judgment(rec, headline, action, learning, why_not, aspects, story, _spike_notes(run, found), keep, course)


# --- the course ----------------------------------------------------------------------------------------------

def _progress(run: RunState) -> tuple[Course | None, str]:
    """The course of what measures the run's progress (measure.PROGRESS), and its name ('' when none is logged)."""
    steps, levels, what = progress_arrays(run)
    return (course_of(steps, levels), what) if steps is not None and levels is not None else (None, "")


def _level(v: float, what: str) -> float:
    return -v if what == "loss" else v


def _trajectory_text(c: Course, what: str) -> str:
    if c.shape == "short":
        return f"too early to say where the {what} is going: {c.points} logged steps"
    a, b, p, last = (_fmt(_level(x, what)) for x in (c.start, c.peak, c.peak, c.last))
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
            f"{_fmt(c.real)} of each other")


def _course_events(c: Course, what: str) -> list[Event]:
    if c.shape == "plateau" and c.since_step is not None:
        return [Event(c.since_step, f"the {what} stopped improving (flat from here at "
                                    f"{_fmt(_level(c.last, what))})", COURSE)]
    if c.shape == "peaked" and c.since_step is not None:
        return [Event(c.peak_step, f"the {what} peaked ({_fmt(_level(c.peak, what))})", COURSE),
                Event(c.since_step, f"the {what} declined clearly below its peak (now {_fmt(_level(c.last, what))})",
                      SIGN, STOP_NOW, reason=f"the {what} peaked at step {c.peak_step} and is declining: the model "
                                             "was better earlier")]
    if c.shape in ("no_trend", "falling"):
        return [Event(c.start_step, f"the {what} shows no improvement from the start"
                                    + (" (falling)" if c.shape == "falling" else " (no trend through the noise)"),
                      SIGN, STOP, reason=f"the {what} never improved: the task is not being learnt")]
    return []


# --- the learning signal -------------------------------------------------------------------------------------

def _components(run: RunState) -> list[Component]:
    out = []
    for (inst, sub), t in sorted(run.trajectories.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        if inst == "reward_component" and sub is not None and len(t):
            steps, means, _ = t.arrays()
            out.append(component_of(sub, steps, means))
    return out


def _tied(run: RunState) -> TiedGroups | None:
    got = arrays(run, ZERO_STD)
    return tied_groups(*got) if got is not None else None


def _first_step(run: RunState, key: SeriesKey, default: int) -> int:
    got = arrays(run, key)
    return int(got[0][0]) if got is not None and len(got[0]) else default


def _signal_text(tied: TiedGroups | None, components: list[Component]) -> str:
    parts = []
    if tied is not None:
        s = f"{_pct(tied.start)} of groups tie at the start, {_pct(tied.end)} at the end"
        if tied.most_since is not None:
            s += f" (half or more from step {tied.most_since}: they give no advantage)"
        parts.append(s)
    for c in components:
        if c.silent:
            parts.append(f"{c.name} never fired (0 on {c.points - c.fired} of {c.points} logged steps)")
        elif c.at_ceiling:
            parts.append(f"{c.name} was near its ceiling from the start ({_fmt(c.start)} -> {_fmt(c.end)}, highest "
                         f"{_fmt(c.peak)})")
        elif c.moved:
            parts.append(f"{c.name} moved ({_fmt(c.start)} -> {_fmt(c.end)})")
        else:
            parts.append(f"{c.name} did not move ({_fmt(c.start)} -> {_fmt(c.end)})")
    return "; ".join(parts)


def _learning(course: Course | None, what: str, components: list[Component]) -> tuple[bool | None, str | None]:
    """Whether the task is being learnt: the progress measure moved, and (with reward components) the rise came
    from a component with room to learn, not only from ones near their ceiling from the start while another
    never fired."""
    if course is None or course.shape == "short":
        return None, None
    if course.shape in ("no_trend", "falling"):
        return False, f"the {what} never improved beyond its noise"
    silent = [c.name for c in components if c.silent]
    movers = [c for c in components if c.moved or (c.end - c.start) > 0]
    if silent and movers and all(c.at_ceiling for c in movers):
        return False, (f"{', '.join(silent)} never fired, and the rise came only from "
                       f"{', '.join(c.name for c in movers)}, near their ceiling from the start")
    return True, None


# --- KL and reward together ----------------------------------------------------------------------------------

def _kl_relation(run: RunState, course: Course | None) -> str:
    kl = arrays(run, KL)
    if kl is None or len(kl[0]) < 20 or course is None or course.shape == "short":
        return ""
    steps, values = kl
    third = max(5, len(values) // 3)
    before, after, _ = change_over(values, third, robust=True)
    rising = after >= KL_RISE_RATIO * before and after - before >= KL_RISE_MIN
    falling = before >= KL_RISE_RATIO * after and before - after >= KL_RISE_MIN
    reward = arrays(run, REWARD) or arrays(run, MARGIN)
    r_dir = 0
    if reward is not None and len(reward[0]) >= 20:
        r_before, r_after, r_se = change_over(reward[1], max(5, len(reward[1]) // 3))
        r_dir = 1 if r_after - r_before > 3 * r_se else -1 if r_before - r_after > 3 * r_se else 0
    since = int(steps[max(0, len(steps) - 1 - third)])
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
    top = int(np.argmax(values))
    return (f"since step {since}: KL {k} ({_fmt(before)} -> {_fmt(after)}), reward "
            f"{'rising' if r_dir > 0 else 'falling' if r_dir < 0 else 'flat'}: {name}; KL highest {_fmt(values[top])}"
            f" (smoothed over its bucket) at step {int(steps[top])}")


# --- the loss ------------------------------------------------------------------------------------------------

LEARNING_RATE: SeriesKey = ("learning_rate", None)


def _lr_changes(run: RunState) -> list[tuple[int, float, float]]:
    got = arrays(run, LEARNING_RATE)
    t = run.trajectories.get(LEARNING_RATE)
    return lr_steps(*got) if got is not None and t is not None and t.width == 1 else []


def _loss(run: RunState, what: str, lr_changes: list[tuple[int, float, float]]) -> LossPattern | None:
    got = arrays(run, LOSS)
    return loss_pattern(*got, surrogate=what == "reward", lr_changes=lr_changes) if got is not None else None


def _loss_text(p: LossPattern, what: str) -> str:
    surrogate = what in ("reward", "reward margin")
    if p.shape == "short":
        return "too few logged steps to read the loss"
    if p.shape == "discontinuity":
        return (f"a discontinuity at step {p.step}: its size went from {_fmt(p.before)} to {_fmt(p.after)} "
                "(investigate: a learning-rate step, a data shift, an update blowing up)")
    if p.shape == "oscillating":
        return ("oscillating around zero with no direction" + (
            " (a policy-gradient surrogate: expected while the reward moves, noise if it does not)" if surrogate
            else ""))
    return {"steady": "steady", "declining": "steadily declining", "rising": "rising"}[p.shape] + (
        " (a surrogate objective: not a progress measure)" if surrogate else "")


# --- what the model writes -----------------------------------------------------------------------------------

def _writing_text(run: RunState) -> str:
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
            parts.append(f"{name} {_fmt(a)} -> {_fmt(b)}{unit}{change}")
        else:
            parts.append(f"{name} {_pct(a)} -> {_pct(b)}")
    return "; ".join(parts)


# --- notes: what passed without an alert ---------------------------------------------------------------------

def _spike_notes(run: RunState, found: Sequence[FindingLike]) -> list[Event]:
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
    out = [Event(a, f"KL spiked to {_fmt(top)} at step {a}" + (f"-{b}" if b != a else "")
                 + f" (past the {_fmt(limit)} stop threshold) and came back: no page, which needs the level held",
                 NOTE) for a, b, top in chosen]
    if len(spikes) > MAX_NOTES:
        out.append(Event(chosen[-1][0], f"{len(spikes) - MAX_NOTES} more such KL spikes", NOTE))
    return out


# --- the recommendation --------------------------------------------------------------------------------------

def _recommend(story: list[Event], course: Course | None, learning: bool | None, relation: str,
               crash: Failure | None) -> tuple[str, str, Event | None]:
    """The recommendation, why, and the sign that decided it. The signs that count are every page and the
    warnings before the first page (a warning after a page follows from it); of those, the most urgent decides:
    a finding that makes the model worse calls for stopping now, a jump or a death for a look, one that says
    nothing is left to learn for stopping. Without a sign, the course: not learning, drift without gain or a
    plateau say stop."""
    signs = [e for e in story if e.sign and e.recommends in (STOP_NOW, STOP, INVESTIGATE)]
    first_page = next((e.step for e in signs if e.page), None)
    counted = [e for e in signs if e.page or first_page is None or e.step < first_page]
    if crash is not None:
        counted = [e for e in counted if e.recommends == INVESTIGATE and e.page] or counted
    if counted:
        rec = min((e.recommends for e in counted), key=lambda r: RECOMMENDATIONS.index(r or NOT_JUDGED))
        first = next(e for e in counted if e.recommends == rec)
        why = first.reason or first.text
        return rec or STOP, {
            STOP_NOW: f"training is destructive since step {first.step} ({why})",
            INVESTIGATE: f"something changed at step {first.step} ({why})",
            STOP: f"nothing more to learn since step {first.step} ({why})"}[rec or STOP], first
    if learning is False:
        return STOP, "the task is not being learnt", None
    if "drifting without gain" in relation:
        return STOP, "the KL keeps rising while the reward is flat: the run has run its course", None
    if course is not None and course.shape == "plateau":
        return STOP, f"the run has converged (flat since step {course.since_step})", None
    if course is None:
        return CONTINUE, "no progress measure is logged (reward, margin or loss): nothing says to stop", None
    return CONTINUE, "it is still improving" if course.shape in ("rising", "slowing") else "too early to judge", None


def _headline(rec: str, reason: str, why_not: str | None, keep: Keep | None) -> tuple[str, str]:
    keep_text = f" Keep {keep.text()}." if keep is not None else ""
    first = {STOP_NOW: "Stop now: " + reason + ".",
             INVESTIGATE: "Investigate: " + reason + ".",
             STOP: "Stop: " + reason + ".",
             CONTINUE: "Continue: " + reason + "."}[rec]
    if why_not:
        first = f"The task is not being learnt: {why_not}. " + ("Stop." if rec == STOP else first)
    if rec == STOP_NOW:
        action = "Stop the run." + keep_text + " Fix what broke it before a new run (the story says what came first)."
    elif rec == INVESTIGATE:
        action = "Look at what changed at that step (learning-rate schedule, data, the trainer's output) before " \
                 "trusting later checkpoints." + keep_text
    elif rec == STOP:
        action = ("Stop: more steps have no realistic upside." + keep_text
                  + (" Fix the task or the reward (a component that never fires teaches nothing) before a new run."
                     if why_not else ""))
    else:
        action = "Let it run; the alerts page if that changes."
    return first, action
