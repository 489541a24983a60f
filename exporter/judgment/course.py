"""The course of one series over the whole run, as one reads it off a chart: smoothed, against its own noise.

A level is a trailing mean of W points (W: a tenth of the run, 5 to 20 points); the noise is the spread of the point-
to-point differences (robust: a median, so a spike does not widen it), and the standard error of a level is that
noise over the square root of W. A change is real when it is larger than four standard errors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MIN_POINTS = 20  # fewer logged points: too early to say where the run is going
SIGNIFICANT = 4.0  # standard errors of a smoothed level that make a change real
DECLINE_SHARE = 0.3  # a decline: the smoothed level below its peak by this share of the rise (or the noise)
PLATEAU_SHARE = 0.15  # a plateau: every later level within this share of the rise (or the noise) of its start
PLATEAU_ROOM = 0.3  # ... with at least this share of the run after its start
HELD_POINTS = 30  # a decline holds at 80% of this many points after it began (fewer where the run ends)
HELD_SHARE = 0.8


def window_of(n: int) -> int:
    return max(5, min(20, n // 10))


def smoothed(values: np.ndarray, w: int) -> np.ndarray:
    """Trailing means of w points: the i-th is the mean of points i-w+1..i (the first w-1 are NaN)."""
    out = np.full(len(values), np.nan)
    if len(values) >= w:
        c = np.cumsum(np.r_[0.0, values])
        out[w - 1:] = (c[w:] - c[:-w]) / w
    return out


def noise_of(values: np.ndarray) -> float:
    """The point-to-point noise of a series (its trend cancels in the differences): 1.4826 x the median absolute
    difference over sqrt(2), the standard deviation of white noise; the mean absolute difference where more than
    half of the differences are 0 (a reward that is 0 on most steps)."""
    if len(values) < 3:
        return 0.0
    d = np.abs(np.diff(values))
    med = float(np.median(d))
    return 1.4826 * (med if med > 0 else float(d.mean())) / math.sqrt(2)


def held(cond: np.ndarray, i: int, span: int = HELD_POINTS) -> bool:
    window = cond[i:i + span]
    return len(window) >= 5 and float(window.mean()) >= HELD_SHARE


@dataclass(frozen=True)
class Course:
    """Where a series went. shape: rising, slowing (rising, its rate falling), plateau (rose, flat since
    `since_step`), peaked (rose to `peak_step`, declining since `since_step`), no_trend (no change beyond its
    noise), falling (lower than it started, never rose), short (fewer than MIN_POINTS points)."""

    shape: str
    points: int
    start: float  # smoothed level at the start (its first full window)
    start_step: int
    peak: float  # highest smoothed level, and the step its window ends at
    peak_step: int
    last: float
    last_step: int
    since_step: int | None
    se: float  # standard error of a smoothed level

    @property
    def rise(self) -> float:
        return self.peak - self.start

    @property
    def real(self) -> float:
        """The smallest change that is no noise."""
        return SIGNIFICANT * self.se


def course_of(steps: np.ndarray, values: np.ndarray) -> Course:
    n = len(values)
    if n < MIN_POINTS:
        last = float(values[-1]) if n else math.nan
        step = int(steps[-1]) if n else -1
        return Course("short", n, last, step, last, step, last, step, None, math.nan)
    w = window_of(n)
    m = smoothed(values, w)
    se = noise_of(values) / math.sqrt(w)
    first = w - 1
    p = first + int(np.argmax(m[first:]))
    start, peak, last = float(m[first]), float(m[p]), float(m[-1])
    real = SIGNIFICANT * se
    rise = peak - start

    def shape(name: str, since: int | None = None) -> Course:
        return Course(name, n, start, int(steps[first]), peak, int(steps[p]), last, int(steps[-1]),
                      None if since is None else int(steps[since]), se)

    if rise > real:
        drop = max(DECLINE_SHARE * rise, real)
        below = m < peak - drop
        for i in range(p + 1, n):
            if below[i] and held(below, i):
                return shape("peaked", i)
        band = max(real, PLATEAU_SHARE * rise)
        # the first level that every later one stays near: from the end backwards, the running extremes
        hi = np.maximum.accumulate(m[::-1])[::-1]
        lo = np.minimum.accumulate(m[::-1])[::-1]
        flat = (hi - m <= band) & (m - lo <= band)
        for t in range(first, n):
            if flat[t]:
                if n - t >= PLATEAU_ROOM * n:
                    return shape("plateau", t)
                break
        third = max(w, n // 3)
        early, late = _slope(steps[:third], values[:third]), _slope(steps[-third:], values[-third:])
        return shape("slowing" if early > 0 and late < 0.5 * early else "rising")
    if last < start - real:
        return shape("falling")
    return shape("no_trend")


def _slope(steps: np.ndarray, values: np.ndarray) -> float:
    x = steps.astype(np.float64) - steps.mean()
    sxx = float((x * x).sum())
    return float((x * (values - values.mean())).sum() / sxx) if sxx > 0 else 0.0


def rolling_median(values: np.ndarray, w: int) -> np.ndarray:
    out = np.full(len(values), np.nan)
    if len(values) >= w:
        out[w - 1:] = np.median(np.lib.stride_tricks.sliding_window_view(values, w), axis=1)
    return out


def change_over(values: np.ndarray, points: int, robust: bool = False) -> tuple[float, float, float]:
    """The smoothed level `points` before the end and at the end, and the standard error of a level; `robust`:
    levels are medians, so that one spike (a KL of 9 on one step) moves no level."""
    n = len(values)
    w = window_of(n)
    m = rolling_median(values, w) if robust else smoothed(values, w)
    i = max(w - 1, n - 1 - points)
    return float(m[i]), float(m[-1]), noise_of(values) / math.sqrt(w)
