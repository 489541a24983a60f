"""An input's recent points carried across batches, the rolling statistics detectors read, and baselines.

Records reach the detectors a batch at a time (runstate.py). A statistic "over the last m points
up to each point" must not depend on where the batches were cut, so each stream keeps the last points it
needs from the batches before and every statistic is computed over the carried points followed by the new
ones. Every finite value logged is a point, in record order (a step logged twice is judged twice)."""

from __future__ import annotations

import math

import numpy as np

_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_F = np.empty(0, dtype=np.float64)


class Baseline:
    """The run's own start: the median (or another quantile) of an input's values logged in its first `points`
    steps (a step logged twice before that keeps its later value, as the history does), fixed once complete;
    or a value the user gave (a measurement of the model before this training).

    Dated by steps, not records: a run that logs every step has `points` points there, one that logs every 10
    steps has one, its first record, itself an average over 10 steps (TRL averages its generation metrics
    between logs). A baseline of the first `points` records would there be a median over 100 steps, and a run
    that collapsed by its second record would take the collapse as its start. `first` is the input's first
    logged value (also beside a given baseline): a detector of a movement away from the start never reports one
    opposite to it."""

    __slots__ = ("_first", "first", "given", "points", "quantile", "value")

    def __init__(self, points: int, given: float | None = None, quantile: float = 0.5) -> None:
        self.points = points
        self.given = given
        self.quantile = quantile
        self.value = given if given is not None else math.nan
        self.first = math.nan
        self._first: list[tuple[int, float]] = []

    @property
    def ready(self) -> bool:
        return not math.isnan(self.value)

    def feed(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Take a batch's new points; the baseline in force at each of them (NaN before it exists)."""
        out = np.full(len(values), self.value)
        if math.isnan(self.first) and len(values):
            self.first = float(values[0])
        if self.ready:
            return out
        first = self._first
        for i, (step, value) in enumerate(zip(steps.tolist(), values.tolist(), strict=True)):
            if first and step >= first[0][0] + self.points:  # past the run's first `points` steps
                self._fix()
                out[i:] = self.value
                break
            if first and first[-1][0] == step:
                first[-1] = (step, value)
            else:
                first.append((step, value))
            self.first = first[0][1]  # a step logged twice at the start keeps its later value, as the history
            if len(first) == self.points:
                self._fix()
                out[i:] = self.value
                break
        return out

    def _fix(self) -> None:
        self.value = _quantile(sorted(v for _, v in self._first), self.quantile)

    def cut_back(self, step: int) -> None:
        """A resumed run forgets its steps from `step` on; a baseline that needed them is collected again."""
        if self.given is not None:
            return
        if self.ready and self._first[-1][0] < step:
            return
        self._first = [(s, v) for s, v in self._first if s < step]
        self.value = math.nan
        self.first = self._first[0][1] if self._first else math.nan


def _quantile(sorted_values: list[float], q: float) -> float:
    """numpy's default ("linear") quantile of sorted values (np.quantile imports numpy.ma: 30 ms at start)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


class StreamView:
    """The carried points followed by a batch's new ones; statistics are given for the new points, each
    computed once per batch however many detectors read it."""

    __slots__ = ("_cache", "baseline", "first", "start", "steps", "values")

    def __init__(self, steps: np.ndarray, values: np.ndarray, start: int, baseline: np.ndarray,
                 first: float = math.nan) -> None:
        self.steps = steps
        self.values = values
        self.start = start  # index of the first new point
        self.baseline = baseline  # the baseline in force at each new point (NaN before it exists)
        self.first = first  # the input's first logged value (Baseline.first)
        self._cache: dict[tuple, np.ndarray] = {}

    def _memo(self, key: tuple, compute) -> np.ndarray:
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = compute()
        return got

    @property
    def new_steps(self) -> np.ndarray:
        return self.steps[self.start :]

    @property
    def new_values(self) -> np.ndarray:
        return self.values[self.start :]

    def _ends(self) -> np.ndarray:
        return np.arange(self.start + 1, len(self.values) + 1)  # each new point's window ends after it

    def rolling(self, points: int, how: str) -> np.ndarray:
        """Median or mean of the last `points` values up to each new point; NaN with fewer logged."""
        return self._memo(("rolling", points, how), lambda: self._rolling(points, how))

    def _rolling(self, points: int, how: str) -> np.ndarray:
        out = np.full(len(self.values) - self.start, np.nan)
        ends = self._ends()
        full = ends >= points
        if full.any():
            windows = np.lib.stride_tricks.sliding_window_view(self.values, points)[ends[full] - points]
            out[full] = _median_rows(windows) if how == "median" else windows.sum(axis=1) / points
        return out

    def rolling_std(self, points: int) -> np.ndarray:
        """Population stddev of the last `points` values up to each new point; NaN with fewer logged."""
        return self._memo(("std", points), lambda: self._rolling_std(points))

    def _rolling_std(self, points: int) -> np.ndarray:
        out = np.full(len(self.values) - self.start, np.nan)
        ends = self._ends()
        full = ends >= points
        if full.any():
            windows = np.lib.stride_tricks.sliding_window_view(self.values, points)[ends[full] - points]
            out[full] = windows.std(axis=1)
        return out

    def trend_t(self, size: int, min_points: int) -> np.ndarray:
        """Least-squares slope of value against step over the last `size` points (at least `min_points`)
        up to each new point, over its standard error: how far the trend stands out of the noise."""
        return self._memo(("trend", size, min_points), lambda: self._trend_t(size, min_points))

    def _trend_t(self, size: int, min_points: int) -> np.ndarray:
        ends = self._ends()
        out = np.zeros(len(ends))
        ok = ends >= min_points
        if ok.any():
            e = ends[ok]
            out[ok] = _window_slope_t(self.steps.astype(float), self.values, np.maximum(e - size, 0), e)
        return out


def _median_rows(windows: np.ndarray) -> np.ndarray:
    """np.median(windows, axis=1) of short rows, by sorting them (about twice as fast on 5 points)."""
    k = windows.shape[1]
    rows = np.sort(windows, axis=1)
    return rows[:, k // 2] if k % 2 else (rows[:, k // 2 - 1] + rows[:, k // 2]) / 2


def _window_slope_t(x: np.ndarray, y: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Least-squares slope over its standard error, for each window x[start:end], y[start:end], from prefix
    sums: O(points), not O(points x window). The first point is subtracted from both first, so the sums of
    steps are exact integers and those of values lose no precision to a large offset."""
    x, y = x - x[0], y - y[0]
    z = np.zeros(1)
    sx, sy = np.concatenate([z, np.cumsum(x)]), np.concatenate([z, np.cumsum(y)])
    sxx, sxy, syy = (np.concatenate([z, np.cumsum(a)]) for a in (x * x, x * y, y * y))
    n = (ends - starts).astype(float)
    mx, my = (sx[ends] - sx[starts]) / n, (sy[ends] - sy[starts]) / n
    cxx = np.maximum(sxx[ends] - sxx[starts] - n * mx * mx, 0.0)
    cxy = sxy[ends] - sxy[starts] - n * mx * my
    cyy = np.maximum(syy[ends] - syy[starts] - n * my * my, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(cxx > 0, cxy / cxx, 0.0)
        resid = np.maximum(cyy - slope * cxy, 0.0) / np.maximum(n - 2, 1)
        t = slope / np.sqrt(resid / cxx)
    # a residual this small against the values' spread is rounding, not noise: a perfect line
    exact = resid <= 1e-12 * cyy / np.maximum(n - 2, 1)
    t = np.where(exact, np.where(slope != 0, np.copysign(np.inf, slope), 0.0), t)
    return np.where((cxx > 0) & (n >= 3), t, 0.0)


class Stream:
    """One input's last `keep` finite points and its baseline, carried from batch to batch."""

    __slots__ = ("_steps", "_values", "baseline", "keep")

    def __init__(self, keep: int, baseline: Baseline) -> None:
        self.keep = keep
        self.baseline = baseline
        self._steps, self._values = _EMPTY_I, _EMPTY_F

    def push(self, steps: np.ndarray, values: np.ndarray) -> StreamView:
        ok = np.isfinite(values)
        if not ok.all():
            steps, values = steps[ok], values[ok]
        baseline = self.baseline.feed(steps, values)
        view = StreamView(np.concatenate([self._steps, steps]), np.concatenate([self._values, values]),
                          len(self._steps), baseline, self.baseline.first)
        self._steps, self._values = view.steps[-self.keep :], view.values[-self.keep :]
        return view

    def reset(self) -> None:
        self._steps, self._values = _EMPTY_I, _EMPTY_F
