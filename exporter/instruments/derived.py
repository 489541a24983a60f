"""The derived series (trends, regimes, peaks, ratios), over each instrument's window of logged steps.

Two kinds of work, split by what they need to see:
- per record, over a batch of records at a time (numpy on one column per series): everything that
  must see every record even when many arrive between two scrapes: threshold breach counters,
  the reward peak, pg-loss sign flips and level shifts, and the ratios of the record's own values;
- on read (a scrape, the end of `dump`), only for series that changed since the last read: the
  window statistics (trend, its direction, mean, stddev, min, max) and the judgments built on
  them (regime, plateau, entropy acceleration, margin convergence, oscillation). They are pure
  functions of the window, so computing them per record would only redo work no one reads:
  a trainer can log thousands of records between two scrapes.
The rules themselves are written out in docs/derived.md."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import fields
from itertools import pairwise

import numpy as np

from exporter.instruments.columns import Column
from exporter.instruments.families import BY_NAME as FAMILY_BY_NAME
from exporter.instruments.families import (
    CLIP_ASYMMETRY,
    CLIP_COMBINED,
    COMPLETION_LENGTH_BASELINE_RATIO,
    COMPLETION_LENGTH_TRUNCATION_GAP,
    DPO_MARGIN_CONVERGING,
    ENTROPY_ACCELERATION,
    GENERATION_TIME_RATIO,
    LOSS_MAGNITUDE_RATIO,
    LOSS_OSCILLATING,
    POLICY_RATIO_DISTANCE,
    REGIME,
    REWARD_COMPONENT_DEAD,
    REWARD_DRAWDOWN,
    REWARD_PEAK,
    REWARD_PEAK_STEP,
    REWARD_PLATEAU,
    REWARD_SMOOTHED,
    REWARD_STD_HEADROOM,
    TREND,
    TREND_DIRECTION,
    WINDOW_MAX,
    WINDOW_MEAN,
    WINDOW_MIN,
    WINDOW_STDDEV,
    Family,
)
from exporter.instruments.series import Series
from exporter.instruments.settings import DerivedSettings, Thresholds
from exporter.instruments.window import StreamTail, level_shifts, rolling_mean, window_stats

SeriesKey = tuple[str, str | None]
Labels = tuple[tuple[str, str], ...]
_PEAK_TOLERANCE = 1e-9  # relative: smoothed rewards closer than this are the same reward

REGIMES = (
    "improving_with_drift",  # KL rising, reward rising: changing and improving (healthy)
    "drifting_without_gain",  # KL rising, reward flat: "the training has run its course"
    "destructive",  # KL rising, reward falling: "actively destructive. Stop immediately"
    "improving_without_drift",  # KL stable, reward rising: "ideal but rare"
    "converged",  # KL stable, reward flat: "nothing is changing"
    "declining",  # KL stable, reward falling: not among the five; reward is lost without drift
    "unknown",  # fewer than min_points of KL or reward in their windows
)
REGIME_OF = {
    (1, 1): "improving_with_drift", (1, 0): "drifting_without_gain", (1, -1): "destructive",
    (0, 1): "improving_without_drift", (0, 0): "converged", (0, -1): "declining",
}

def _threshold_fields() -> list[tuple[str, tuple[tuple[str, ...], ...]]]:
    return [(f.name, f.metadata["series"]) for f in fields(Thresholds)]


# instrument -> [(level, threshold name, breached when a value is 'above' or 'below')], from Thresholds' fields
_BREACH_RULES: dict[str, list[tuple[str, str, str]]] = {}
for _name, _series in _threshold_fields():
    for _where in _series:
        if len(_where) == 3:
            _BREACH_RULES.setdefault(_where[0], []).append((_where[1], _name, _where[2]))


def threshold_series(t: Thresholds) -> dict[tuple[str, str], float]:
    """(instrument, level) -> value, as exported in posttrain_threshold for the boards and alert texts."""
    return {(where[0], where[1]): getattr(t, name) for name, series in _threshold_fields() for where in series}


def threshold_key(name: str) -> tuple[str, str]:
    """The (instrument, level) under which a Thresholds field is first exported in posttrain_threshold."""
    where = dict(_threshold_fields())[name][0]
    return where[0], where[1]


def labels_of(instrument: str, sub: tuple[str, str] | None) -> Labels:
    return (("instrument", instrument), sub) if sub else (("instrument", instrument),)


class DerivedState:
    def __init__(self, settings: DerivedSettings, sub_label: dict[str, str | None]) -> None:
        self.settings = settings
        self._sub_label = sub_label  # instrument -> its sub-label name
        self.gauges: dict[tuple[str, Labels], float] = {}  # (family name, labels) -> value
        self.breaches: Counter[Labels] = Counter()
        self.loss_sign_flips = 0
        self.loss_discontinuities = 0
        self._dirty: set[SeriesKey] = set()
        self._generation_tail = StreamTail(self._spec("generation_time").size)
        self._reward_tail = StreamTail(self._spec("reward").min_points)
        self._peak, self._peak_step = -math.inf, -1
        self._loss_tail = StreamTail(self._spec("loss").size)
        self._loss_sign = 0
        self._loss_shifted = False
        # the rules with their limits resolved, built once
        self._rules = {inst: [(level, getattr(self._t, name), side == "above") for level, name, side in rules]
                       for inst, rules in _BREACH_RULES.items()}
        # Every counter exists from the start at 0, so increase() sees even a first breach that
        # happened between two scrapes; per-component ones from the component's first record.
        for inst, rules in _BREACH_RULES.items():
            if sub_label.get(inst) is None:
                for level, _, _ in rules:
                    self.breaches[(*labels_of(inst, None), ("level", level))] = 0

    # --- per record, a batch at a time -----------------------------------------------------------
    # Everything here sees every record of the batch, in order, so a value that rose and fell
    # between two scrapes still counts; the state carried between batches (stream tails, the peak,
    # the loss's sign) makes the result the same wherever the batches were cut.

    def on_batch(self, cols: dict[SeriesKey, Column], nrows: int) -> None:
        self._dirty.update(cols)
        for key, col in cols.items():
            inst = key[0]
            if inst in self._rules:
                self._breaches(inst, self._sub(key), col.finite_values())
                if inst == "reward_component_std" and (v := col.last_finite()) is not None:
                    self._set(REWARD_COMPONENT_DEAD, (("component", key[1] or ""),),
                              1.0 if v < self._t.component_std_min else 0.0)
        get = cols.get
        if (c := get(("reward_std", None))) is not None and (v := c.last_finite()) is not None:
            self._set(REWARD_STD_HEADROOM, (), v / self._t.reward_std_min)
        low, high = get(("clip_ratio", "low")), get(("clip_ratio", "high"))
        if low is not None and high is not None:
            self._clipping(*low.paired_with(high, nrows))
        if (c := get(("policy_ratio", None))) is not None and (v := c.last_finite()) is not None:
            self._set(POLICY_RATIO_DISTANCE, (), abs(v - 1.0))
        if (c := get(("completion_length", "mean"))) is not None:
            self._length(c, get(("completion_length", "mean_terminated")), nrows)
        if (c := get(("reward", None))) is not None:
            self._reward(c.finite_values(), c.finite_steps())
        if (c := get(("loss", None))) is not None:
            self._loss(c.finite_values())
        gen, total = get(("generation_time", None)), get(("step_time", None))
        if gen is not None and total is not None:
            # a generation phase that takes a growing share of step time points at the rollout engine
            g, t = gen.paired_with(total, nrows)
            if (t != 0).any():
                stream, start = self._generation_tail.extend(g[t != 0] / t[t != 0])
                means, _ = rolling_mean(stream, start, self._spec("generation_time").size)
                self._set(GENERATION_TIME_RATIO, (), float(means[-1]))

    def _breaches(self, inst: str, sub: tuple[str, str] | None, values: np.ndarray) -> None:
        for level, limit, above in self._rules[inst]:
            n = int(np.count_nonzero(values > limit if above else values < limit))
            self.breaches[(*labels_of(inst, sub), ("level", level))] += n  # present at 0 once seen

    def _clipping(self, low: np.ndarray, high: np.ndarray) -> None:
        """Both bounds of the records that logged both."""
        if not len(low):
            return
        total = low + high
        self._set(CLIP_COMBINED, (), float(total[-1]))
        self._breaches("clip_total", None, total)
        if total[-1] > self._t.clip_asymmetry_min_total:
            self._set(CLIP_ASYMMETRY, (), float((high[-1] - low[-1]) / total[-1]))
        else:
            self.gauges.pop((CLIP_ASYMMETRY.name, ()), None)  # undefined without clipping

    def _length(self, mean: Column, terminated: Column | None, nrows: int) -> None:
        if terminated is not None:
            m, t = mean.paired_with(terminated, nrows)
            if len(m):
                self._set(COMPLETION_LENGTH_TRUNCATION_GAP, (), float(m[-1] - t[-1]))

    def _reward(self, values: np.ndarray, steps: np.ndarray) -> None:
        k = self._spec("reward").min_points
        stream, start = self._reward_tail.extend(values)
        smoothed, counts = rolling_mean(stream, start, k)
        full = counts == k  # smoothing starts once k rewards were logged
        if not full.any():
            return
        smoothed, steps = smoothed[full], steps[full]
        # A new peak must beat the old one by more than rounding, and among values equal up to rounding
        # the first is the peak: a reward that stays on a plateau keeps its first step as the best.
        top = float(smoothed.max())
        if self._peak == -math.inf or top > self._peak + _PEAK_TOLERANCE * max(1.0, abs(self._peak)):
            best = int(np.argmax(smoothed >= top - _PEAK_TOLERANCE * max(1.0, abs(top))))
            self._peak, self._peak_step = float(smoothed[best]), int(steps[best])
        now = float(smoothed[-1])
        self._set(REWARD_SMOOTHED, (), now)
        self._set(REWARD_PEAK, (), self._peak)
        self._set(REWARD_PEAK_STEP, (), float(self._peak_step))
        self._set(REWARD_DRAWDOWN, (), self._peak - now)

    def _loss(self, values: np.ndarray) -> None:
        if not len(values):
            return
        spec = self._spec("loss")
        k, size = spec.min_points, spec.size
        stream, start = self._loss_tail.extend(values)
        smoothed, counts = rolling_mean(stream, start, k)
        # a pg loss that went negative after being positive: sign changes of the smoothed loss, zeros skipped
        signs = np.sign(smoothed[counts == k])
        signs = np.concatenate([[self._loss_sign], signs[signs != 0]])
        self.loss_sign_flips += int(np.count_nonzero((signs[:-1] > 0) & (signs[1:] < 0)))
        self._loss_sign = int(signs[-1])
        # a pg loss that suddenly doubled or halved: the median |loss| of the last k points against the
        # median of the window before them; counted once each time a shift begins.
        mags = np.abs(stream)
        ends = np.arange(start + 1, len(stream) + 1)
        ratios, shifted = [], []
        for end in ends[(ends >= 2 * k) & (ends < size)]:  # a run's first windows are shorter
            r, out = level_shifts(mags[None, :end], k, self._t.discontinuity_low, self._t.discontinuity_high)
            ratios.append(r)
            shifted.append(out)
        full = ends[ends >= size] if size >= 2 * k else ends[:0]  # k points before the recent k, at least
        if len(full):
            windows = np.lib.stride_tricks.sliding_window_view(mags, size)[full - size]
            r, out = level_shifts(windows, k, self._t.discontinuity_low, self._t.discontinuity_high)
            ratios.append(r)
            shifted.append(out)
        if not ratios:
            return
        ratio, out = np.concatenate(ratios), np.concatenate([[self._loss_shifted], *shifted])
        self.loss_discontinuities += int(np.count_nonzero(out[1:] & ~out[:-1]))
        self._loss_shifted = bool(out[-1])
        if np.isfinite(ratio[-1]):
            self._set(LOSS_MAGNITUDE_RATIO, (), float(ratio[-1]))

    # --- on read --------------------------------------------------------------------------------

    def refresh(self, series: dict[SeriesKey, Series], baselines: dict[SeriesKey, float]) -> None:
        """Window statistics and judgments of the series that changed since the last read; `baselines` are
        the run's own (the detectors' median of each input's first points)."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        stats = {}
        for key in dirty:
            s = series.get(key)
            spec = self._spec(key[0])
            if s is None or len(s) < spec.min_points:
                continue
            pts = s.tail(spec.size)
            st = stats[key] = window_stats(pts)
            labels = labels_of(key[0], self._sub(key))
            self._set(TREND, labels, st.slope)
            self._set(TREND_DIRECTION, labels, float(self._direction(st.slope_t)))
            self._set(WINDOW_MEAN, labels, st.mean)
            self._set(WINDOW_STDDEV, labels, st.stddev)
            self._set(WINDOW_MIN, labels, st.min)
            self._set(WINDOW_MAX, labels, st.max)
            if key == ("entropy", None) and len(pts) >= 2 * spec.min_points:  # two halves of min_points each
                half = len(pts) // 2
                self._set(ENTROPY_ACCELERATION, (),
                          _mean(pts[half:]) - _mean(pts[:half]))
            elif key == ("dpo_reward", "margin"):
                self._set(DPO_MARGIN_CONVERGING, (), 1.0 if self._direction(st.slope_t) < 0 else 0.0)
            elif key == ("reward", None) and len(pts) >= 2 * spec.min_points:
                # Is the rate of improvement itself falling? Compare the slopes of the window's halves.
                half = len(pts) // 2
                early, late = _slope(pts[:half]), _slope(pts[half:])
                plateau = early > 0 and late < 0.5 * early and self._direction(st.slope_t) >= 0
                self._set(REWARD_PLATEAU, (), 1.0 if plateau else 0.0)
            elif key == ("loss", None):
                self._oscillation(pts, st.mean, st.stddev)
            elif key == ("completion_length", "mean") and baselines.get(key):
                self._set(COMPLETION_LENGTH_BASELINE_RATIO, (), st.mean / baselines[key])
        if ("kl", None) in dirty or ("reward", None) in dirty:
            self._regime(series, stats)

    def _oscillation(self, pts: list[tuple[int, float]], mean: float, std: float) -> None:
        values = [v for _, v in pts]
        changes = sum((a > 0) != (b > 0) for a, b in pairwise(values))
        centred = std > 0 and abs(mean) < 2 * std / math.sqrt(len(values))
        self._set(LOSS_OSCILLATING, (), 1.0 if centred and changes >= 0.4 * (len(values) - 1) else 0.0)

    def _regime(self, series: dict[SeriesKey, Series], stats: dict) -> None:
        directions = []
        for key in (("kl", None), ("reward", None)):
            s, spec = series.get(key), self._spec(key[0])
            if s is None or len(s) < spec.min_points:
                break
            st = stats.get(key) or window_stats(s.tail(spec.size))
            directions.append(self._direction(st.slope_t))
        state = REGIME_OF[max(directions[0], 0), directions[1]] if len(directions) == 2 else "unknown"
        for r in REGIMES:
            self._set(REGIME, (("regime", r),), 1.0 if r == state else 0.0)

    def rebuild(self, series: dict[SeriesKey, Series]) -> None:
        """A resumed run cut the history back: restart what depends on history, from history."""
        self.gauges = {k: v for k, v in self.gauges.items() if FAMILY_BY_NAME[k[0]].survives_resume}
        self._dirty.update(series)
        self._peak, self._peak_step = -math.inf, -1
        self._reward_tail.reset()
        if (reward := series.get(("reward", None))) is not None and len(reward):
            steps, values = reward.arrays()
            self._reward(values, steps)
        loss = series.get(("loss", None))
        self._loss_tail.reset(loss.arrays(self._spec("loss").size)[1].tolist() if loss else [])

    # --- helpers --------------------------------------------------------------------------------

    @property
    def _t(self) -> Thresholds:
        return self.settings.thresholds

    def _spec(self, instrument: str):
        return self.settings.window_for(instrument)

    def _direction(self, t: float) -> int:
        return 1 if t >= self._t.trend_t else -1 if t <= -self._t.trend_t else 0

    def _set(self, family: Family, labels: Labels, value: float) -> None:
        self.gauges[family.name, labels] = value

    def _sub(self, key: SeriesKey) -> tuple[str, str] | None:
        inst, lv = key
        name = self._sub_label.get(inst)
        return (name, lv or "") if name else None


def _mean(pts: list[tuple[int, float]]) -> float:
    return sum(v for _, v in pts) / len(pts)


def _slope(pts: list[tuple[int, float]]) -> float:
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
