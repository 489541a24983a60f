"""Statistics of a window of (step, value) points, and the rolling statistics of the per-record checks."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class WindowStats:
    n: int
    mean: float
    stddev: float  # population (ddof=0, numpy's default)
    slope: float  # least squares, per step, with steps as x (np.polyfit(x, y, 1)[0])
    slope_t: float  # slope / its standard error: how far the trend stands out of the window's noise
    min: float
    max: float


def window_stats(points: Sequence[tuple[int, float]]) -> WindowStats:
    """Two passes over centred values, so large steps or offsets lose no precision."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sxy = syy = 0.0
    lo = hi = points[0][1]
    for x, y in points:
        dx, dy = x - mx, y - my
        sxx += dx * dx
        sxy += dx * dy
        syy += dy * dy
        lo = y if y < lo else lo
        hi = y if y > hi else hi
    slope = sxy / sxx if sxx > 0 else 0.0
    slope_t = 0.0
    if n >= 3 and sxx > 0:
        resid = max(syy - slope * sxy, 0.0) / (n - 2)
        if resid > 1e-300:
            slope_t = slope / math.sqrt(resid / sxx)
        elif slope != 0:
            slope_t = math.copysign(math.inf, slope)  # a perfect line
    return WindowStats(n, my, math.sqrt(syy / n), slope, slope_t, lo, hi)


class StreamTail:
    """The last values of a stream, carried from one batch to the next, so that a statistic over
    "the last `size` values up to each record" does not depend on where the batches were cut."""

    __slots__ = ("_values",)

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=max(size - 1, 0))  # a window needs size - 1 before it

    def extend(self, new: np.ndarray) -> tuple[np.ndarray, int]:
        """The carried values followed by `new`, and where `new` starts in it; the carry moves on."""
        prev = np.fromiter(self._values, np.float64, len(self._values))
        self._values.extend(new.tolist())
        return np.concatenate([prev, new]), len(prev)

    def reset(self, values: Iterable[float] = ()) -> None:
        self._values.clear()
        self._values.extend(values)


def rolling_mean(stream: np.ndarray, start: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean of the last `size` values (fewer at the stream's start) ending at each of stream[start:],
    and how many values each mean is over. Each full window is summed on its own, not as a difference
    of running sums: equal windows give equal means, wherever they fall and however batches were cut."""
    ends = np.arange(start + 1, len(stream) + 1)
    counts = np.minimum(ends, size)
    means = np.empty(len(ends))
    full = ends >= size
    if full.any():
        windows = np.lib.stride_tricks.sliding_window_view(stream, size)  # window j ends at j + size
        means[full] = windows[ends[full] - size].mean(axis=1)
    if not full.all():  # the stream's first windows, shorter than size
        first = ends[~full]
        means[~full] = np.cumsum(stream[: first[-1]])[first - 1] / first
    return means, counts


def level_shifts(windows: np.ndarray, recent: int, low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """For each row of `windows` (oldest first): the median of its last `recent` values over the median
    of the values before them, and whether that is a level shift: the ratio outside [low, high] with
    the recent median also beyond the earlier values' 10th/90th percentile, so that a series whose
    magnitude swings widely from step to step does not count its ordinary swings as shifts."""
    now = _quantiles(np.sort(windows[:, -recent:], axis=1), (0.5,))[0]
    p10, p50, p90 = _quantiles(np.sort(windows[:, :-recent], axis=1), (0.1, 0.5, 0.9))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p50 > 0, now / p50, np.nan)
    shifted = ((ratio > high) & (now > p90)) | ((ratio < low) & (now < p10))
    return ratio, shifted


def _quantiles(rows_sorted: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Quantiles of each sorted row, interpolated as numpy's default ("linear") does; one sort for
    all of them is several times cheaper than np.percentile on many short rows."""
    m = rows_sorted.shape[1]
    out = []
    for q in qs:
        pos = q * (m - 1)
        lo = int(pos)
        hi = min(lo + 1, m - 1)
        frac = pos - lo
        out.append(rows_sorted[:, lo] * (1 - frac) + rows_sorted[:, hi] * frac)
    return out
