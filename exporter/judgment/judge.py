"""One run's judgment: the course, the KL-reward relation, the learning signal, the loss, what the model writes, the
story in order of onset, the notes of what passed without an alert, the checkpoint to keep and the recommendation.

The findings (the detectors' episodes, what the alerts say) come in from the caller; everything else is read from
the run's trajectories (instruments/trajectory.py), the same live and after the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from exporter.judgment import aspects as say
from exporter.judgment.aspects import fmt, pct
from exporter.judgment.checkpoints import Keep, keep_of
from exporter.judgment.course import Course, course_of
from exporter.judgment.loss import LossPattern, loss_pattern, lr_steps
from exporter.judgment.measure import LOSS, arrays, progress_arrays
from exporter.judgment.recommend import SILENT, calls_for, headline, recommend
from exporter.judgment.signal import Component, TiedGroups, component_of, tied_groups
from exporter.judgment.story import (
    COURSE,
    DIED,
    INVESTIGATE,
    LOSS_JUMP,
    LR_JUMP,
    NOT_JUDGED,
    RECOMMENDATIONS,
    SIGN,
    STOP,
    STOP_NOW,
    WARNING,
    Event,
    FindingLike,
    followed,
    followed_lines,
)
from exporter.parsers.failures import Failure
from exporter.runstate import RunState, SeriesKey

ZERO_STD: SeriesKey = ("reward_zero_std", None)
LEARNING_RATE: SeriesKey = ("learning_rate", None)


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

    @property
    def followed(self) -> set[int]:
        """The story's lines that follow from its first sign (story.followed): said as names and steps only."""
        return followed(self.story)

    def told(self) -> tuple[list[Event], list[str]]:
        """The story as a reader is told it: the lines said whole, and the alerts that followed the first sign by
        name (story.followed_lines: with the first sign, after it; none when none did)."""
        after, first = self.followed, self.first_sign
        return ([e for i, e in enumerate(self.story) if i not in after],
                followed_lines([e for i, e in enumerate(self.story) if i in after], first.step) if first else [])

    def as_json(self) -> dict[str, Any]:
        first, after = self.first_sign, self.followed
        return {"recommendation": self.recommendation, "headline": self.headline, "action": self.action,
                "learning": self.learning, "not_learning": self.not_learning, "aspects": dict(self.aspects),
                "first_sign": first.as_json() if first else None,
                "story": [e.as_json(i in after) for i, e in enumerate(self.story)],
                "notes": [e.as_json() for e in self.notes], "keep": self.keep.as_json() if self.keep else None}


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
    said: dict[str, str] = {}
    course, what = _progress(run)
    if course is not None:
        said["trajectory"] = say.trajectory_text(course, what)
        story += say.course_events(course, what)
    components = _components(run)
    tied = _tied(run)
    signal = say.signal_text(tied, components)
    if signal:
        said["signal"] = signal
    learning, why_not = _learning(course, what, components)
    first = course.start_step if course is not None else max(run.step, 0)
    by_finding = {f.component for f in found if f.detector == SILENT}  # the alert says it: one line, not two
    for c in components:
        if c.silent and c.name not in by_finding:
            story.append(Event(_first_step(run, ("reward_component", c.name), first),
                               f"reward component {c.name} never fired: it scored 0 on {c.points - c.fired} of its "
                               f"{c.points} logged steps (highest {fmt(c.peak)})",
                               SIGN if learning is False else WARNING, STOP if learning is False else None,
                               reason=f"the task is not being learnt ({c.name} never fired)"))
    if tied is not None and tied.most_since is not None:
        story.append(Event(tied.most_since, "half or more of the groups tie from here (no reward spread, no "
                           f"advantage): {pct(tied.start)} at the start, {pct(tied.end)} at the end"))
    relation = say.kl_relation(run, course)
    if relation:
        said["kl_reward"] = relation
    lr_changes = _lr_changes(run)
    for step, a, b in lr_changes[:say.MAX_NOTES]:
        story.append(Event(step, f"the learning rate stepped from {fmt(a)} to {fmt(b)}", COURSE))
    loss = _loss(run, what, lr_changes)
    if loss is not None:
        said["loss"] = say.loss_text(loss, what)
        if loss.shape == "discontinuity" and loss.step is not None:
            beside = loss.lr_step
            why = (f"beside the learning rate's step from {fmt(beside[1])} to {fmt(beside[2])} at step {beside[0]}"
                   if beside else "a learning-rate step, a data shift or an update blowing up")
            story.append(Event(loss.step, f"the loss's size jumped from {fmt(loss.before)} to {fmt(loss.after)} "
                                          f"(median |loss| of 20 logged steps each side): {why}", SIGN, INVESTIGATE,
                               reason="the loss jumped" + (f" {fmt(loss.after / loss.before)}x, {why}" if beside
                                                           and loss.before else ""),
                               cause=LR_JUMP if beside else LOSS_JUMP))
    writing = say.writing_text(run)
    if writing:
        said["writing"] = writing
    for f in found:
        calls = calls_for(f.detector, learning)
        summary = f.summary.replace(f" in run {run.name}", "")  # the report is the run's own: no need to say it
        name = f"{f.alert} [{f.component}]" if f.component else f.alert
        story.append(Event(f.onset, f"{f.alert} ({f.severity}): {summary}", SIGN if calls else WARNING, calls,
                           f.severity == "critical", f"the task is not being learnt ({f.component} never fired)"
                           if f.detector == SILENT else _clause(summary), name, f.detector))
    if crash is not None:
        story.append(Event(max(run.step, 0), f"the trainer died: {crash.text}", SIGN, INVESTIGATE, True,
                           f"the trainer died: {crash.text}", cause=DIED))
    story.sort(key=lambda e: (e.step, e.kind != SIGN, RECOMMENDATIONS.index(e.recommends or NOT_JUDGED)))
    rec, reason, decisive = recommend(story, course, learning, relation, crash)
    # only the signs that agree with the recommendation stay signs; the others are warnings that came with them
    story = [e if not e.sign or e.recommends == rec else replace(e, kind=WARNING, recommends=None) for e in story]
    # a run whose measure never rose beyond its noise has no checkpoint better than the model it started from
    keep = None if not what or (learning is False and course is not None and course.shape in ("no_trend", "falling")) \
        else keep_of(run, course, decisive.step if rec == STOP_NOW and decisive else None)
    head, action = headline(rec, reason, why_not, keep, decisive.cause if decisive else "")
    return Judgment(rec, head, action, learning, why_not, said, story, say.spike_notes(run, found), keep, course)


def _clause(summary: str) -> str:
    """An alert's summary as a clause of the headline: no full stop, lower-case unless it starts with an acronym."""
    text = summary.strip().rstrip(".")
    head = text.split(" ", 1)[0]
    return text if head.isupper() or not text else text[0].lower() + text[1:]


def _progress(run: RunState) -> tuple[Course | None, str]:
    """The course of what measures the run's progress (measure.PROGRESS), and its name ('' when none is logged)."""
    steps, levels, what = progress_arrays(run)
    return (course_of(steps, levels), what) if steps is not None and levels is not None else (None, "")


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


def _lr_changes(run: RunState) -> list[tuple[int, float, float]]:
    got = arrays(run, LEARNING_RATE)
    t = run.trajectories.get(LEARNING_RATE)
    return lr_steps(*got) if got is not None and t is not None and t.width == 1 else []


def _loss(run: RunState, what: str, lr_changes: list[tuple[int, float, float]]) -> LossPattern | None:
    got = arrays(run, LOSS)
    return loss_pattern(*got, surrogate=what == "reward", lr_changes=lr_changes) if got is not None else None
