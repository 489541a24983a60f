"""Statistics of a window of (step, value) points, and a running mean for per-record checks."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowStats:
    n: int
    mean: float
    stddev: float  # population (numpy's default ddof=0, as the seeds' np.std)
    slope: float  # least squares, per step: the seeds' np.polyfit(x, y, 1)[0] with steps as x
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


class RunningMean:
    """Mean of the last `size` values in O(1) per value (re-summed every `size` values against drift)."""

    __slots__ = ("_added", "_sum", "_values")

    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self._sum = 0.0
        self._added = 0

    def add(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value
        self._added += 1
        if self._added >= self._values.maxlen:  # type: ignore[operator]
            self._sum, self._added = math.fsum(self._values), 0

    def reset(self, values: Iterable[float] = ()) -> None:
        self._values.clear()
        self._values.extend(values)
        self._sum, self._added = math.fsum(self._values), 0

    @property
    def full(self) -> bool:
        return len(self._values) == self._values.maxlen

    def __len__(self) -> int:
        return len(self._values)

    @property
    def mean(self) -> float:
        return self._sum / len(self._values)

    @property
    def values(self) -> deque[float]:
        return self._values
