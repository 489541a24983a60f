"""The recommendation: which sign decides it, why, and what to do next."""

from __future__ import annotations

from exporter.judgment.checkpoints import Keep
from exporter.judgment.course import Course
from exporter.judgment.story import (
    CONTINUE,
    INVESTIGATE,
    LOSS_JUMP,
    LR_JUMP,
    NO_TREND,
    NOT_JUDGED,
    PEAKED,
    RECOMMENDATIONS,
    STOP,
    STOP_NOW,
    Event,
)
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


# What to change before a new run, by what raised the deciding sign (a detector, or the judgment's own reading).
# Knob names are TRL's (GRPOConfig, DPOConfig); verl and OpenRLHF have the same knobs under their own names.
_PEAK = ("lower the learning rate or raise beta (the KL penalty), and read the completions around the peak for what "
         "the reward began to pay for")
_FLAT = ("fix the task or the reward: read a few completions beside their scores to check the reward scores what you "
         "expect, then try easier prompts or a higher learning rate")
_SPREAD = ("give the groups something to tell apart: harder prompts, more completions per prompt (num_generations) or "
           "a graded reward in place of a pass/fail one")
NEXT_STEPS: dict[str, str] = {
    "kl_critical": "lower the learning rate or raise beta (the KL penalty) so the policy stays near its reference, and "
                   "read the completions from the first sign for an exploit of the reward",
    "destructive_regime": "lower the learning rate or raise beta, and read the completions from the first sign: a "
                          "reward that falls while the KL rises is being gamed or the updates are too large",
    "nonfinite_loss_or_kl": "find the first non-finite step: lower the learning rate, clip gradients (max_grad_norm), "
                            "check fp16 overflow (bf16 is safer) and the reward for NaN or inf",
    "completion_length_growing": "the reward pays for length: penalise or normalise it by length, or cap "
                                 "max_completion_length",
    "completions_truncated": "raise max_completion_length, or keep truncated completions out of the loss "
                             "(mask_truncated_completions=True): a cut-off answer scored as one biases the advantages",
    "completion_length_shrinking": "short answers became safer than good ones: check that the reward does not punish "
                                   "length or a failed parse harder than a wrong answer",
    "template_collapse": "raise the sampling temperature or beta, and check that the reward cannot be met by one fixed "
                         "template",
    "entropy_collapse": "raise the sampling temperature or beta, or lower the learning rate: the policy grew sure too "
                        "fast",
    "dpo_displacement": "the chosen answers lose likelihood with the rejected ones: lower the learning rate, "
                        "add an SFT term on the chosen answers (rpo_alpha), and look for near-identical pairs",
    "reward_peaked_and_fell": _PEAK,
    PEAKED: _PEAK,
    "reward_std_collapsed": _SPREAD,
    "learning_signal_dead": _SPREAD,
    "dpo_saturated": "the pairs are learnt: more or harder preference pairs if more is wanted",
    "drifting_without_gain": "nothing: the run has run its course (a new run needs a harder task or a better reward)",
    SILENT: "fix the task or the reward: a component that never fires teaches nothing (check how it parses a "
            "completion, or start from prompts the model can sometimes solve)",
    NO_TREND: _FLAT,
    LR_JUMP: "if the learning rate's step was not meant, fix the schedule (lr_scheduler_type, warmup_steps); if it "
             "was, trust no later checkpoint until the reward shows the step helped",
    LOSS_JUMP: "compare the batches and the gradient norm around that step: a data shift, a bad batch or an update "
               "that blew up",
}


def headline(rec: str, reason: str, why_not: str | None, keep: Keep | None, cause: str = "") -> tuple[str, str]:
    """What an experienced engineer says first (the recommendation and its reason), and what to do: the checkpoint
    to keep and what to change before a new run (NEXT_STEPS, by what raised the deciding sign)."""
    keep_text = f" Keep {keep.text()}." if keep is not None else ""
    nxt = NEXT_STEPS.get(cause) or (NEXT_STEPS[NO_TREND] if why_not else "")
    before = f" Before a new run: {nxt}." if nxt else ""
    first = {STOP_NOW: "Stop now: " + reason + ".",
             INVESTIGATE: "Investigate: " + reason + ".",
             STOP: "Stop: " + reason + ".",
             CONTINUE: "Continue: " + reason + "."}[rec]
    if why_not:
        first = f"The task is not being learnt: {why_not}. " + ("Stop." if rec == STOP else first)
    if rec == STOP_NOW:
        action = ("Stop the run: continuing makes the model worse." + keep_text
                  + (before or " Fix what broke it before a new run (the story says what came first)."))
    elif rec == INVESTIGATE:
        action = "Look at what changed at that step (learning-rate schedule, data, the trainer's output) before " \
                 "trusting later checkpoints." + keep_text + (f" Then: {nxt}." if nxt else "")
    elif rec == STOP:
        if keep is None and why_not:
            keep_text = " No checkpoint is better than the model the run started from."
        action = "Stop: more steps have no realistic upside." + keep_text + before
    else:
        action = "Let it run; the alerts page if that changes."
    return first, action
