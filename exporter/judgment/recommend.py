"""The recommendation: which sign decides it, why, and what to do next."""

from __future__ import annotations

from exporter.judgment.checkpoints import Keep
from exporter.judgment.course import Course
from exporter.judgment.story import CONTINUE, INVESTIGATE, NOT_JUDGED, RECOMMENDATIONS, STOP, STOP_NOW, Event
from exporter.parsers.failures import Failure

# Detectors whose finding means continuing makes the model worse: stop now, keep a checkpoint from before it.
DESTRUCTIVE = frozenset({"kl_critical", "destructive_regime", "nonfinite_loss_or_kl", "completion_length_growing",
                         "completion_length_shrinking", "completions_truncated", "template_collapse",
                         "entropy_collapse", "dpo_displacement", "reward_peaked_and_fell"})
# ... whose finding means the run has nothing left to learn: stop, it has run its course.
RUN_ITS_COURSE = frozenset({"reward_std_collapsed", "learning_signal_dead", "dpo_saturated",
                            "drifting_without_gain"})
# ... a component that never fired: a sign to stop where the judgment finds the task is not being learnt.
SILENT = "reward_component_silent"


def calls_for(detector: str, learning: bool | None) -> str | None:
    """What a finding of `detector` calls for, if it is a sign (None: a warning that comes with one)."""
    if detector in DESTRUCTIVE:
        return STOP_NOW
    if detector in RUN_ITS_COURSE or (detector == SILENT and learning is False):
        return STOP
    return None


def recommend(story: list[Event], course: Course | None, learning: bool | None, relation: str,
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


def headline(rec: str, reason: str, why_not: str | None, keep: Keep | None) -> tuple[str, str]:
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
