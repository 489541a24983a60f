"""Windows and thresholds of the derived series, with the seeds' defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class WindowSpec:
    size: int = 50  # steps of the instrument's own history (seed: deque(maxlen=50))
    min_points: int = 10  # nothing is exported before this many points (seed: len(history) >= 10)


@dataclass(frozen=True)
class Thresholds:
    kl_warning: float = 0.5  # Part II: "KL > 0.5 is a warning"
    kl_critical: float = 1.0  # Part II: "KL > 1.0 is a stop sign"
    reward_std_min: float = 0.05  # Part III: alert below 0.05
    component_std_min: float = 0.01  # Part III: a component with std < 0.01 is dead
    clip_high: float = 0.3  # Part II: clip fraction > 30%
    clip_excessive: float = 0.4  # Part III: total clipping > 40%
    clip_min: float = 0.01  # Part II/III: < 1%, updates may be too conservative
    clip_asymmetry_min_total: float = 0.01  # Part III: asymmetry only when total > 0.01
    policy_ratio_low: float = 0.5  # Part II: ratio below 0.5 ...
    policy_ratio_high: float = 2.0  # ... or above 2.0: updates too aggressive
    length_ratio_low: float = 0.7  # Part II: "> 30% change in mean deserves investigation" ...
    length_ratio_high: float = 1.3  # ... either way, against the run's baseline
    truncated_max: float = 0.2  # Part II: clipped ratio > 20%
    # Against the run's own baseline (the median of its first logged points), where the seeds say the
    # healthy level depends on the task:
    reward_std_drop: float = 0.25  # reward std's recent mean under this share of its baseline
    entropy_drop: float = 0.5  # entropy's recent median under this share of its baseline
    length_std_drop: float = 0.5  # Part II: "> 50% change in variance"
    clip_rise_factor: float = 3.0  # clipping this many times its baseline (and rising)
    grad_norm_spike_factor: float = 10.0  # grad norm's recent median over its baseline
    # DPO implicit rewards, in reward units (beta x log-prob change; TRL's default beta is 0.1):
    dpo_chosen_min: float = -0.5  # chosen reward below this while the margin grows: both pushed down
    dpo_chosen_max: float = 2.0  # chosen reward rising past this: reward hacking
    dpo_margin_noise: float = 1.0  # margin stddev over its mean: unstable
    trend_t: float = 2.0  # a trend is rising/falling when |slope / stderr| >= this
    discontinuity_high: float = 2.0  # 002: pg loss "suddenly doubled ..."
    discontinuity_low: float = 0.5  # 002: "... or halved"
    # Read by the alert rules only (rules/posttrain.recording.yml), exported so a run can tune them:
    stall_seconds: float = 1800.0  # no record for this long: the trainer stalled
    kl_near_zero: float = 0.001  # Part II: "KL near zero throughout training: beta too high"
    parse_error_ratio_max: float = 0.1  # share of record lines the exporter could not read


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
    baseline_points: int = 10  # a measured baseline is the median of an input's first this many points
    detectors: DetectorSettings = field(default_factory=DetectorSettings)

    def window_for(self, instrument: str) -> WindowSpec:
        return self.per_instrument.get(instrument, self.window)
