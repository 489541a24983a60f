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
