"""A sliding window of (step, value) points with O(1) statistics per point.

Running sums of shifted values give mean, stddev and the least-squares slope (the seeds'
`np.polyfit(x, y, 1)[0]`, with the real steps as x so irregular logging does not bend it);
monotonic deques give min and max. Sums are rebuilt from the points every `size` additions so
floating-point drift cannot accumulate."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable


class SlidingWindow:
    __slots__ = ("_added", "_hi", "_lo", "_pts", "_sx", "_sxx", "_sxy", "_sy", "_syy", "_x0", "_y0", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._pts: deque[tuple[int, float]] = deque()
        self._lo: deque[tuple[int, float]] = deque()  # increasing values: the front is the min
        self._hi: deque[tuple[int, float]] = deque()  # decreasing values: the front is the max
        self._reset_sums(0, 0.0)

    def _reset_sums(self, x0: int, y0: float) -> None:
        self._x0, self._y0 = x0, y0  # shift: sums of small numbers lose no precision
        self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0
        self._added = 0

    def add(self, x: int, y: float) -> None:
        if not self._pts:
            self._reset_sums(x, y)
        if len(self._pts) == self.size:
            ox, oy = self._pts.popleft()
            self._acc(ox, oy, -1.0)
            if self._lo[0][0] == ox:
                self._lo.popleft()
            if self._hi[0][0] == ox:
                self._hi.popleft()
        self._push(x, y)
        self._acc(x, y, 1.0)
        self._added += 1
        if self._added >= self.size:
            self._resum()

    def rebuild(self, points: Iterable[tuple[int, float]]) -> None:
        """Start over from these points (a resumed run cut the history back)."""
        self._pts.clear()
        self._lo.clear()
        self._hi.clear()
        for x, y in list(points)[-self.size :]:
            self._push(x, y)
        self._resum()

    def _push(self, x: int, y: float) -> None:
        self._pts.append((x, y))
        while self._lo and self._lo[-1][1] >= y:
            self._lo.pop()
        self._lo.append((x, y))
        while self._hi and self._hi[-1][1] <= y:
            self._hi.pop()
        self._hi.append((x, y))

    def _resum(self) -> None:
        self._reset_sums(*(self._pts[0] if self._pts else (0, 0.0)))
        for x, y in self._pts:
            self._acc(x, y, 1.0)

    def _acc(self, x: int, y: float, sign: float) -> None:
        dx, dy = x - self._x0, y - self._y0
        self._sx += sign * dx
        self._sy += sign * dy
        self._sxx += sign * dx * dx
        self._sxy += sign * dx * dy
        self._syy += sign * dy * dy

    def __len__(self) -> int:
        return len(self._pts)

    @property
    def points(self) -> deque[tuple[int, float]]:
        return self._pts

    @property
    def mean(self) -> float:
        return self._y0 + self._sy / len(self._pts)

    def _centred(self) -> tuple[float, float, float]:
        n = len(self._pts)
        sxx = self._sxx - self._sx * self._sx / n
        sxy = self._sxy - self._sx * self._sy / n
        syy = self._syy - self._sy * self._sy / n
        return max(sxx, 0.0), sxy, max(syy, 0.0)

    @property
    def stddev(self) -> float:
        """Population stddev (numpy's default ddof=0, as the seeds' np.std)."""
        _, _, syy = self._centred()
        return math.sqrt(syy / len(self._pts))

    @property
    def slope(self) -> float:
        sxx, sxy, _ = self._centred()
        return sxy / sxx if sxx > 0 else 0.0

    @property
    def slope_t(self) -> float:
        """The slope over its standard error: how far the trend stands out of the window's noise."""
        n = len(self._pts)
        sxx, sxy, syy = self._centred()
        if n < 3 or sxx <= 0:
            return 0.0
        slope = sxy / sxx
        resid = max(syy - slope * sxy, 0.0) / (n - 2)
        if resid <= 1e-300:
            return 0.0 if slope == 0 else math.copysign(math.inf, slope)
        return slope / math.sqrt(resid / sxx)

    @property
    def min(self) -> float:
        return self._lo[0][1]

    @property
    def max(self) -> float:
        return self._hi[0][1]
