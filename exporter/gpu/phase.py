"""Phase of a post-training GPU (generation, training or idle) from its power and utilization.

RL post-training (GRPO, PPO) alternates two workloads on the same GPUs: autoregressive generation
(decode is memory-bound, so the SMs wait on HBM and board power stays clearly below what the
compute-bound forward/backward passes of training draw) and training. Utilization alone cannot
tell them apart (both keep a kernel resident almost all the time, so NVML reports ~100 %); power
can. Memory is not used: colocated engines (vLLM's gpu_memory_utilization) preallocate, so the
memory used often stays flat across phases.

The rule, evaluated on every poll of one GPU (utilization u as a ratio, power p in watts):

1. u < idle_utilization (default 0.05)                        -> idle
   Idle samples never enter the reference below.
2. Otherwise the sample is busy and p joins the reference window. The reference R is the
   reference_quantile (default 0.9) of the busy power samples of the last
   reference_window_seconds (default 600 s, both ends included): the recent high power level, which is
   training's level once the window has seen a training phase. `reference_watts` pins R instead.
   The quantile is Prometheus's (`quantile_over_time`: linear between the two nearest ranks), so that the
   recording rules that derive the phase from dcgm-exporter's samples (exporter/gpu/rules.py) reach the
   same phase from the same samples.
3. p >= training_power_ratio * R (default 0.80)                  -> training
   p <= generation_power_ratio * R (default 0.70)                -> generation
   in between (hysteresis band)                                  -> the last busy phase
                                                                    (training if there is none)

The time since the previous sample is attributed to the phase of the current one (capped at
max_gap_seconds, or twice the poll interval if that is longer, so that a stall in polling is not
counted as hours of one phase). generation_time_ratio is the share of the last
ratio_window_seconds (default 600 s) spent in generation, idle time included in the denominator.

Limit, by construction: the rule is relative. Until the window has seen a higher busy level, a
busy GPU is called training; a job that only generates (an inference server) stays "training"
forever. Pin `reference_watts` (the power the GPU draws while training) for such jobs.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

PHASES: tuple[str, ...] = ("generation", "training", "idle")
GENERATION, TRAINING, IDLE = range(3)

# Bounds the reference window's memory when the poll interval is tiny (10 ms polls x 600 s).
MAX_REFERENCE_SAMPLES = 4096


@dataclass(frozen=True)
class PhaseConfig:
    idle_utilization: float = 0.05
    generation_power_ratio: float = 0.70
    training_power_ratio: float = 0.80
    reference_quantile: float = 0.90
    reference_window_seconds: float = 600.0
    reference_watts: float | None = None
    ratio_window_seconds: float = 600.0
    max_gap_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.idle_utilization < 1.0:
            raise ValueError("idle_utilization must be in [0, 1)")
        if not 0.0 < self.generation_power_ratio <= self.training_power_ratio <= 1.0:
            raise ValueError("need 0 < generation_power_ratio <= training_power_ratio <= 1")
        if not 0.0 < self.reference_quantile <= 1.0:
            raise ValueError("reference_quantile must be in (0, 1]")
        if self.reference_watts is not None and self.reference_watts <= 0:
            raise ValueError("reference_watts must be > 0")
        for name in ("reference_window_seconds", "ratio_window_seconds", "max_gap_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")


def prometheus_quantile(q: float, ordered: list[float]) -> float | None:
    """The q-quantile of sorted values as PromQL's quantile_over_time computes it (promql/quantile.go: rank
    q*(n-1), linear between its floor and the next value), float operation for float operation."""
    n = len(ordered)
    if n == 0:
        return None
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1.0, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[int(lower)] * (1 - weight) + ordered[int(upper)] * weight


class PhaseReading(NamedTuple):
    phase: str
    reference_watts: float | None  # None while idle with no busy sample in the window yet
    generation_ratio: float  # share of the ratio window spent in generation
    seconds: tuple[float, float, float]  # cumulative seconds in each phase, in PHASES order


class PhaseTracker:
    """One GPU's phase; `update` once per poll with that poll's utilization and power."""

    def __init__(self, cfg: PhaseConfig | None = None, interval_seconds: float = 1.0) -> None:
        self.cfg = cfg or PhaseConfig()
        self.max_gap = max(self.cfg.max_gap_seconds, 2.0 * interval_seconds)
        self._ref_times: deque[tuple[float, float]] = deque()  # (t, watts) of busy samples, in time order
        self._ref_sorted: list[float] = []  # the same watts, sorted, for the quantile
        self._spans: deque[tuple[float, float, int]] = deque()  # (t, dt, phase) inside the ratio window
        self._window_sums = [0.0, 0.0, 0.0]
        self._totals = [0.0, 0.0, 0.0]
        self._prev_t: float | None = None
        self._last_busy: int | None = None

    def update(self, t: float, utilization: float, power_watts: float) -> PhaseReading:
        cfg = self.cfg
        ref: float | None
        if utilization < cfg.idle_utilization:
            phase = IDLE
            ref = self._reference(t)
        else:
            self._add_reference(t, power_watts)
            ref = self._reference(t)
            assert ref is not None
            if power_watts >= cfg.training_power_ratio * ref:
                phase = TRAINING
            elif power_watts <= cfg.generation_power_ratio * ref:
                phase = GENERATION
            else:
                phase = self._last_busy if self._last_busy is not None else TRAINING
            self._last_busy = phase
        dt = 0.0 if self._prev_t is None else min(max(t - self._prev_t, 0.0), self.max_gap)
        self._prev_t = t
        self._account(t, dt, phase)
        total = sum(self._window_sums)
        ratio = self._window_sums[GENERATION] / total if total > 0 else 0.0
        return PhaseReading(PHASES[phase], ref, ratio, (self._totals[0], self._totals[1], self._totals[2]))

    def _add_reference(self, t: float, watts: float) -> None:
        self._ref_times.append((t, watts))
        bisect.insort(self._ref_sorted, watts)
        if len(self._ref_times) > MAX_REFERENCE_SAMPLES:
            self._drop_oldest_reference()

    def _drop_oldest_reference(self) -> None:
        _, w = self._ref_times.popleft()
        del self._ref_sorted[bisect.bisect_left(self._ref_sorted, w)]

    def _reference(self, t: float) -> float | None:
        if self.cfg.reference_watts is not None:
            return self.cfg.reference_watts
        horizon = t - self.cfg.reference_window_seconds
        while self._ref_times and self._ref_times[0][0] < horizon:
            self._drop_oldest_reference()
        return prometheus_quantile(self.cfg.reference_quantile, self._ref_sorted)

    def _account(self, t: float, dt: float, phase: int) -> None:
        self._totals[phase] += dt
        self._spans.append((t, dt, phase))
        self._window_sums[phase] += dt
        horizon = t - self.cfg.ratio_window_seconds
        while self._spans and self._spans[0][0] <= horizon:
            _, old_dt, old_phase = self._spans.popleft()
            self._window_sums[old_phase] -= old_dt


class PhaseByGpu:
    """One PhaseTracker per GPU, by UUID, made at its first reading with both utilization and power: a GPU that
    comes back (an NVML re-init, a feed's next sample) keeps its windows. The sampler and the feed reader share it."""

    def __init__(self, cfg: PhaseConfig, interval_seconds: float, limit: int | None = None) -> None:
        self.cfg, self.interval = cfg, interval_seconds
        self.limit = limit  # GPUs followed at most: a feed's GPUs may come and go without end
        self._trackers: dict[str, PhaseTracker] = {}

    def __len__(self) -> int:
        return len(self._trackers)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._trackers

    def bound(self, present: set[str]) -> None:
        """Once `limit` GPUs are followed, forget those absent from the latest sample (`present`)."""
        if self.limit is not None and len(self._trackers) >= self.limit:
            self._trackers = {k: v for k, v in self._trackers.items() if k in present}

    def update(self, uuid: str, t: float, utilization: float | None, power: float | None) -> PhaseReading | None:
        """This poll's phase of the GPU `uuid`; None when the poll lacks utilization or power."""
        if utilization is None or power is None:
            return None
        tracker = self._trackers.get(uuid)
        if tracker is None:
            tracker = self._trackers[uuid] = PhaseTracker(self.cfg, self.interval)
        return tracker.update(t, utilization, power)

    def clear(self) -> None:
        """Fresh windows for every GPU (the clock stepped back under them)."""
        self._trackers.clear()
