"""Windows and thresholds of the derived series, with the project's defaults (each configurable; docs/derived.md
says why each default is what it is)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class WindowSpec:
    size: int = 50  # logged points of the instrument's own history: long enough for a trend to stand out of noise
    min_points: int = 10  # nothing is exported before this many points: fewer make a slope or mean meaningless


def _limit(default: float, *series: tuple[str, ...]) -> Any:
    """A threshold: its default, and each (instrument, level) it is exported under in posttrain_threshold (the
    boards draw it, the alerts quote it). A third item, 'above' or 'below', makes every logged value beyond it a
    breach counted in posttrain_threshold_breaches_total{instrument, level}."""
    return field(default=default, metadata={"series": series})


@dataclass(frozen=True)
class Thresholds:
    """Every threshold, declared once: its default, where it is exported and whether it counts breaches."""

    kl_warning: float = _limit(0.5, ("kl", "warning", "above"))  # project default: well past the drift of a healthy run
    kl_critical: float = _limit(1.0, ("kl", "critical", "above"))  # project default: twice the warning, a stop sign
    reward_std_min: float = _limit(0.05, ("reward_std", "min", "below"))  # 5% of a 0..1 reward: groups tie
    # a reward function whose std within groups is under 1% of a 0..1 scale no longer ranks completions
    component_std_min: float = _limit(0.01, ("reward_component_std", "min", "below"))
    # more than 30% of tokens clipped: most of the update is held at the trust region's edge
    clip_high: float = _limit(0.3, ("clip_fraction", "high", "above"), ("clip_total", "high", "above"))
    clip_excessive: float = _limit(0.4, ("clip_total", "excessive", "above"))  # a stricter 40% for clip low + high
    # under 1% clipped in a run that clipped before: updates have become too conservative
    clip_min: float = _limit(0.01, ("clip_fraction", "min", "below"), ("clip_total", "min", "below"))
    # asymmetry only when the total exceeds this: a ratio of two near-zero shares is noise
    clip_asymmetry_min_total: float = _limit(0.01, ("clip_total", "asymmetry_min_total"))
    policy_ratio_low: float = _limit(0.5, ("policy_ratio", "low", "below"))  # ratio halved ...
    policy_ratio_high: float = _limit(2.0, ("policy_ratio", "high", "above"))  # ... or doubled: far past the clip
    # a 30% change of the mean length, either way, against the run's baseline, is worth a look
    length_ratio_low: float = _limit(0.7, ("completion_length", "ratio_low"))
    length_ratio_high: float = _limit(1.3, ("completion_length", "ratio_high"))
    truncated_max: float = _limit(0.2, ("completion_truncated", "max", "above"))  # one completion in five cut
    # Against the run's own baseline (the median of its first logged points), where the healthy level depends
    # on the task, the model and the reward:
    reward_std_drop: float = _limit(0.25, ("reward_std", "drop"))  # recent mean under this share of its baseline
    entropy_drop: float = _limit(0.5, ("entropy", "drop"))  # recent median under this share of its baseline
    length_std_drop: float = _limit(0.5, ("completion_length_std", "drop"))  # within-group spread halved
    clip_rise_factor: float = _limit(3.0, ("clip_total", "rise_factor"))  # this many times its baseline, rising
    grad_norm_spike_factor: float = _limit(10.0, ("grad_norm", "spike_factor"))  # recent median over baseline
    # DPO implicit rewards, in reward units (beta x log-prob change; TRL's default beta is 0.1):
    dpo_chosen_min: float = _limit(-0.5, ("dpo_reward", "chosen_min"))  # chosen below this, margin grows
    dpo_chosen_max: float = _limit(2.0, ("dpo_reward", "chosen_max"))  # chosen rising past this: reward hacking
    dpo_margin_noise: float = _limit(1.0, ("dpo_reward", "margin_noise"))  # margin stddev over its mean
    dpo_loss_saturated: float = _limit(0.01, ("loss", "dpo_saturated"))  # DPO loss below this at accuracy 1
    # share of completion groups whose rewards all tie (mean of the last 10 logged points): most of a batch is dead
    zero_std_max: float = _limit(0.7, ("reward_zero_std", "max"))
    trend_t: float = _limit(2.0, ("trend", "t"))  # a trend is rising/falling when |slope / stderr| >= this
    discontinuity_high: float = _limit(2.0, ("loss", "discontinuity_high"))  # pg loss suddenly doubled ...
    discontinuity_low: float = _limit(0.5, ("loss", "discontinuity_low"))  # ... or halved
    # A template (exporter/samples): one completion for at least this share of a step's distinct prompts, and of
    # its rows (the labelling rule of the samples corpus runs, tests/fixtures/corpus/README.md)
    template_prompt_share: float = _limit(0.75, ("completion_diversity", "template_prompt_share"))
    template_row_share: float = _limit(0.5, ("completion_diversity", "template_row_share"))
    # Read by the alert rules only (rules/posttrain.recording.yml), exported so a run can tune them:
    stall_seconds: float = _limit(1800.0, ("record_age", "stall"))  # no record for this long: the trainer stalled
    kl_near_zero: float = _limit(0.001, ("kl", "near_zero"))  # the policy barely moves: beta too high, lr too low
    # share of record lines the exporter could not read
    parse_error_ratio_max: float = _limit(0.1, ("parse_errors", "max_ratio"))


THRESHOLD_NAMES = tuple(f.name for f in fields(Thresholds))


@dataclass(frozen=True)
class DetectorSettings:
    steps: dict[str, int] = field(default_factory=dict)  # logged points a condition must hold, by detector
    clear: dict[str, int] = field(default_factory=dict)  # logged points a state must have ended, by detector
    clear_steps: int = 5  # logged points at which a state has ended before an active detector clears
    clear_margin: float = 0.2  # a level must be back beyond its limit by this share of it to end a state
    disabled: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DerivedSettings:
    window: WindowSpec = field(default_factory=WindowSpec)
    per_instrument: dict[str, WindowSpec] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    baselines: dict[str, float] = field(default_factory=dict)  # given baselines by instrument (else measured)
    baseline_points: int = 10  # a measured baseline is the median of an input's values in its first this many steps
    detectors: DetectorSettings = field(default_factory=DetectorSettings)

    def window_for(self, instrument: str) -> WindowSpec:
        return self.per_instrument.get(instrument, self.window)
