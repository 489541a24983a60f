"""Where a pathology begins in a real run: the labelling rules of the detection corpus.

Written before any detector was tuned against the corpus, and never changed to suit a detector: the
detectors are judged by how many logged steps after these onsets their first alert comes, and by the
alerts they raise on runs where no rule finds an onset (healthy runs). The rules read the trainer's own
record of the run, `trainer_state.json` (full precision, the trainer's own steps), not the exporter.

A rule is a condition on one logged value (and, for some, on the run's own start), and an onset is the
first logged step where the condition holds and keeps holding: at that step and at no fewer than 80%
of the `span` logged points that begin there (fewer points only where the run ends; at least 5). That
is what "the first logged step at which the pathology is visible" means here: a single excursion is
not an onset, a sustained state is, and it is dated from its first step, not from when it became
certain. Thresholds are the same numbers as the exporter's default limits (docs/derived.md#where-the-limits-come-from):

- kl_blowup: kl > 1.0, span 10 (KL to the reference far past its healthy drift).
- reward_std_collapse: reward_std < 0.05, span 20 (groups that tie give GRPO no advantage).
- length_hacking: completions/mean_length > 1.3 x its baseline, span 10 (a 30% change of the mean
  is worth a look).
- truncation: completions/clipped_ratio > 0.2, span 10 (one completion in five cut).
- entropy_collapse: entropy < 0.5 x its baseline, span 10, in runs that log a reward (entropy
  declining too fast; no absolute level, tasks differ).
- dpo_displacement: rewards/chosen < -0.5 while rewards/margins > 0, span 10 (the chosen
  reward should rise; here the margin grows by pushing both answers down: likelihood displacement).
- length_collapse: completions/mean_length < 0.5 x its baseline, span 10 (completions that lose half their
  length: the policy found that saying less is safer, or its answers degenerated to a bare end of text).
- dead_signal: frac_reward_zero_std >= 0.7 and grad_norm == 0, span 20 (GRPO-type: seven groups in ten give
  no advantage and the update is exactly zero, so the run learns nothing, whatever the mean reward std of the
  few groups that still differ says; a run with a KL term keeps a small gradient and is not dated here).
- dpo_saturation: loss < 0.01 and rewards/accuracies >= 1.0, span 10 (a DPO-family run that has separated
  every training pair and now only pushes margins).

baseline = the median of the key's values logged in the run's first 10 steps (counted from its first logged
step; at least its first value): dated by steps, not records, so that a run logging every 10 steps takes
its first record (an average over 10 steps) as its start and a collapse by its second record is not
averaged into its start. A run logging every step has 10 points there, as before.
Added with the judgment of whole runs, written before the detector that finds it (reward_component_silent):

- component_silent: one reward component's mean (`rewards/<name>/mean`) is exactly 0 while its baseline is 0,
  span 20 (a reward function that scored no completion at the run's start and still scores none: it never fired,
  so it ranks nothing and teaches nothing; one that fired and died is a dead component, not this).

Entropy collapse is judged only in runs that sample completions and score them (they log `reward`: GRPO,
RLOO, PPO): an SFT or DPO model's entropy falls as it fits its data, which is the point of those
trainings, not a pathology.
reward_std spans 20 points: with a few groups per batch a healthy run logs 0 on many single steps.
dpo_displacement's -0.5 is in reward units (beta x log-prob change): at TRL's default beta = 0.1 the
chosen answer has lost 5 nats against the reference while the margin still says the run is learning.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Points = list[tuple[int, float]]

FRACTION = 0.8  # share of the span's points at which the condition must hold
MIN_POINTS = 5  # a span cut short by the run's end still needs this many points
BASELINE_STEPS = 10  # the baseline: the values logged in the run's first this many steps


@dataclass(frozen=True)
class LabelRule:
    pathology: str
    keys: tuple[str, ...]  # the trainer keys the condition reads; the first one dates the points
    condition: Callable[[dict[str, float], dict[str, float]], bool]  # (values at the step, baselines)
    span: int
    description: str
    needs: str | None = None  # a key the run must log for the rule to apply at all


RULES: tuple[LabelRule, ...] = (
    LabelRule("kl_blowup", ("kl",), lambda v, b: v["kl"] > 1.0, 10, "kl > 1.0"),
    LabelRule("reward_std_collapse", ("reward_std",), lambda v, b: v["reward_std"] < 0.05, 20, "reward_std < 0.05"),
    LabelRule("length_hacking", ("completions/mean_length",),
              lambda v, b: v["completions/mean_length"] > 1.3 * b["completions/mean_length"], 10,
              "completions/mean_length > 1.3 x its baseline"),
    LabelRule("truncation", ("completions/clipped_ratio",), lambda v, b: v["completions/clipped_ratio"] > 0.2, 10,
              "completions/clipped_ratio > 0.2"),
    LabelRule("entropy_collapse", ("entropy",), lambda v, b: v["entropy"] < 0.5 * b["entropy"], 10,
              "entropy < 0.5 x its baseline, in runs that sample and score completions", needs="reward"),
    LabelRule("dpo_displacement", ("rewards/chosen", "rewards/margins"),
              lambda v, b: v["rewards/chosen"] < -0.5 and v["rewards/margins"] > 0, 10,
              "rewards/chosen < -0.5 and rewards/margins > 0"),
    LabelRule("length_collapse", ("completions/mean_length",),
              lambda v, b: v["completions/mean_length"] < 0.5 * b["completions/mean_length"], 10,
              "completions/mean_length < 0.5 x its baseline"),
    LabelRule("dead_signal", ("frac_reward_zero_std", "grad_norm"),
              lambda v, b: v["frac_reward_zero_std"] >= 0.7 and v["grad_norm"] == 0, 20,
              "frac_reward_zero_std >= 0.7 and grad_norm == 0"),
    LabelRule("dpo_saturation", ("loss", "rewards/accuracies"),
              lambda v, b: v["loss"] < 0.01 and v["rewards/accuracies"] >= 1.0, 10,
              "loss < 0.01 and rewards/accuracies >= 1.0"),
)


def training_records(log_history: list[dict]) -> list[dict]:
    """The training records of a trainer_state log_history: not evaluation, not the end-of-run summary."""
    return [e for e in log_history
            if "step" in e and not any(k.startswith("eval_") for k in e) and "train_runtime" not in e]


def load_records(trainer_state: Path) -> list[dict]:
    return training_records(json.loads(trainer_state.read_text())["log_history"])


def _points(records: list[dict], keys: tuple[str, ...]) -> list[tuple[int, dict[str, float]]]:
    """Logged steps at which every key of the rule was logged, with those values; a step logged twice
    (a resumed run) keeps its later value."""
    by_step: dict[int, dict[str, float]] = {}
    for e in records:
        if all(isinstance(e.get(k), int | float) for k in keys):
            by_step[int(e["step"])] = {k: float(e[k]) for k in keys}
    return sorted(by_step.items())


def onset(rule: LabelRule, records: list[dict]) -> int | None:
    """The first logged step where the rule's condition holds and keeps holding, or None."""
    if rule.needs is not None and not any(rule.needs in e for e in records):
        return None
    pts = _points(records, rule.keys)
    if len(pts) < MIN_POINTS + 1:
        return None
    start = [v for s, v in pts if s < pts[0][0] + BASELINE_STEPS] or [pts[0][1]]
    base = {k: statistics.median(v[k] for v in start) for k in rule.keys}
    held = [rule.condition(v, base) for _, v in pts]
    for i, (step, _) in enumerate(pts):
        if not held[i]:
            continue
        window = held[i : i + rule.span]
        if len(window) >= MIN_POINTS and sum(window) >= FRACTION * len(window):
            return step
    return None


def component_rules(records: list[dict]) -> list[LabelRule]:
    """component_silent, one rule per reward component the run logs."""
    keys = sorted({k for e in records for k in e if k.startswith("rewards/") and k.endswith("/mean")
                   and k.count("/") == 2})
    return [LabelRule("component_silent", (k,), lambda v, b, k=k: v[k] == 0 and b[k] == 0, 20,
                      f"{k} == 0 with its baseline 0") for k in keys]


def onsets(records: list[dict]) -> dict[str, int]:
    """Every pathology whose rule finds an onset in the run, with its onset step (a per-component rule: the first
    component's)."""
    out: dict[str, int] = {}
    for rule in (*RULES, *component_rules(records)):
        step = onset(rule, records)
        if step is not None:
            out[rule.pathology] = min(step, out.get(rule.pathology, step))
    return out
