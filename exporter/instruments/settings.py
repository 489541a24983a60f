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
    entropy_min: float = 1.0  # Part III: collapse below 1.0
    length_ratio_low: float = 0.5  # Part II: length < 0.5x baseline
    length_ratio_high: float = 2.0  # Part II: length > 2x baseline
    truncated_max: float = 0.2  # Part II: clipped ratio > 20%
    trend_t: float = 2.0  # a trend is rising/falling when |slope / stderr| >= this
    discontinuity_high: float = 2.0  # 002: pg loss "suddenly doubled ..."
    discontinuity_low: float = 0.5  # 002: "... or halved"
    # Read by the alert rules only (rules/posttrain.recording.yml), exported so a run can tune them:
    stall_seconds: float = 1800.0  # no record for this long: the trainer stalled
    zero_std_groups_max: float = 0.5  # share of groups whose rewards all tie
    kl_near_zero: float = 0.001  # Part II: "KL near zero throughout training: beta too high"
    clip_asymmetry_max: float = 0.8  # |asymmetry| beyond this: the policy moves one way only
    entropy_fast_decline: float = 0.1  # Part III: entropy declining too fast (share lost over the window)
    length_std_min: float = 10.0  # Part III: within-group length std below 10 tokens
    grad_norm_spike_factor: float = 10.0  # window max over window mean
    parse_error_ratio_max: float = 0.1  # share of record lines the exporter could not read


THRESHOLD_NAMES = tuple(f.name for f in fields(Thresholds))


@dataclass(frozen=True)
class DerivedSettings:
    window: WindowSpec = field(default_factory=WindowSpec)
    per_instrument: dict[str, WindowSpec] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    length_baseline: float | None = None  # tokens; else the mean of the first `baseline_points` logged
    baseline_points: int = 10

    def window_for(self, instrument: str) -> WindowSpec:
        return self.per_instrument.get(instrument, self.window)
