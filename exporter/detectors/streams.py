"""An input's recent points carried across batches, the rolling statistics detectors read, and baselines.

Records reach the detectors a batch at a time (instruments/run.py). A statistic "over the last m points
up to each point" must not depend on where the batches were cut, so each stream keeps the last points it
needs from the batches before and every statistic is computed over the carried points followed by the new
ones. Every finite value logged is a point, in record order (a step logged twice is judged twice)."""

from __future__ import annotations

import math

import numpy as np

_EMPTY_I = np.empty(0, dtype=np.int64)
_EMPTY_F = np.empty(0, dtype=np.float64)


class Baseline:
    """The run's own start: the median (or another quantile) of an input's first `points` logged values (a
    step logged twice before that keeps its later value, as the history does), fixed once complete; or a
    value the user gave (a measurement of the model before this training)."""

    __slots__ = ("_first", "given", "points", "quantile", "value")

    def __init__(self, points: int, given: float | None = None, quantile: float = 0.5) -> None:
        self.points = points
        self.given = given
        self.quantile = quantile
        self.value = given if given is not None else math.nan
        self._first: list[tuple[int, float]] = []

    @property
    def ready(self) -> bool:
        return not math.isnan(self.value)

    def feed(self, steps: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Take a batch's new points; the baseline in force at each of them (NaN before it exists)."""
        out = np.full(len(values), self.value)
        if self.ready:
            return out
        first = self._first
        for i, (step, value) in enumerate(zip(steps.tolist(), values.tolist(), strict=True)):
            if first and first[-1][0] == step:
                first[-1] = (step, value)
            else:
                first.append((step, value))
            if len(first) == self.points:
                self.value = float(np.quantile([v for _, v in first], self.quantile))
                out[i:] = self.value
                break
        return out

    def cut_back(self, step: int) -> None:
        """A resumed run forgets its steps from `step` on; a baseline that needed them is collected again."""
        if self.given is not None:
            return
        if self.ready and self._first[-1][0] < step:
            return
        self._first = [(s, v) for s, v in self._first if s < step]
        self.value = math.nan


class StreamView:
    """The carried points followed by a batch's new ones; statistics are given for the new points, each
    computed once per batch however many detectors read it."""

    __slots__ = ("_cache", "baseline", "start", "steps", "values")

    def __init__(self, steps: np.ndarray, values: np.ndarray, start: int, baseline: np.ndarray) -> None:
        self.steps = steps
        self.values = values
        self.start = start  # index of the first new point
        self.baseline = baseline  # the baseline in force at each new point (NaN before it exists)
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
            out[full] = np.median(windows, axis=1) if how == "median" else windows.mean(axis=1)
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
        full = ends >= size
        if full.any():
            rows = ends[full] - size
            out[full] = _slope_t(np.lib.stride_tricks.sliding_window_view(self.steps, size)[rows].astype(float),
                                 np.lib.stride_tricks.sliding_window_view(self.values, size)[rows])
        short = np.flatnonzero(~full & (ends >= min_points))  # the stream's first windows, shorter than size
        if len(short):
            out[short] = _expanding_slope_t(self.steps[: ends[short[-1]]].astype(float),
                                            self.values[: ends[short[-1]]])[ends[short] - 1]
        return out


def _slope_t(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row: slope / stderr(slope), as instruments/window.window_stats computes it (centred values)."""
    n = x.shape[1]
    dx = x - x.mean(axis=1, keepdims=True)
    dy = y - y.mean(axis=1, keepdims=True)
    sxx, sxy, syy = (dx * dx).sum(axis=1), (dx * dy).sum(axis=1), (dy * dy).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, sxy / sxx, 0.0)
        resid = np.maximum(syy - slope * sxy, 0.0) / max(n - 2, 1)
        t = slope / np.sqrt(resid / sxx)
    t = np.where(resid > 1e-300, t, np.where(slope != 0, np.copysign(np.inf, slope), 0.0))
    return np.where((sxx > 0) & (n >= 3), t, 0.0)


def _expanding_slope_t(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """_slope_t of every prefix x[:k], y[:k] at once, from running sums (offsets removed first, so the sums of a
    stream's first points lose no precision); the windows at a stream's start, before it holds a full one."""
    x, y = x - x[0], y - y[0]
    n = np.arange(1, len(x) + 1, dtype=float)
    sx, sy = np.cumsum(x), np.cumsum(y)
    sxx = np.cumsum(x * x) - sx * sx / n
    sxy = np.cumsum(x * y) - sx * sy / n
    syy = np.cumsum(y * y) - sy * sy / n
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(sxx > 0, sxy / sxx, 0.0)
        resid = np.maximum(syy - slope * sxy, 0.0) / np.maximum(n - 2, 1)
        t = slope / np.sqrt(resid / sxx)
    # below this share of the spread the residual is rounding, not noise: a perfect line
    exact = resid <= 1e-12 * np.maximum(syy, 1e-300) / np.maximum(n - 2, 1)
    t = np.where(exact, np.where(slope != 0, np.copysign(np.inf, slope), 0.0), t)
    return np.where((sxx > 0) & (n >= 3), t, 0.0)


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
        view = StreamView(np.concatenate([self._steps, steps]), np.concatenate([self._values, values]),
                          len(self._steps), self.baseline.feed(steps, values))
        self._steps, self._values = view.steps[-self.keep :], view.values[-self.keep :]
        return view

    def reset(self) -> None:
        self._steps, self._values = _EMPTY_I, _EMPTY_F
