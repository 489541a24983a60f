"""What a report keeps of a run while it is read, in memory that does not grow with the run: per series its
count, first value and extremes, and its min and max in at most CHART_BUCKETS step buckets (the charts); the whole
history only of the series the verdict reads point by point (reward and KL: the regimes and the KL at the best
step).

A run's series keep only their last history_limit points. The digest watches the run (RunState.watchers): after
each batch it takes the points the series gained, but the last one, which a record of the same step can still
replace; close() takes the rest. A resumed run (a step logged again after later ones) cuts the digest back too."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from exporter.instruments.columns import Column
from exporter.instruments.series import Series
from exporter.runstate import RunState, SeriesKey

log = logging.getLogger(__name__)

CHART_BUCKETS = 600  # a chart draws each bucket's min and max: at most 1,200 points however long the run
KEPT_WHOLE: frozenset[SeriesKey] = frozenset({("reward", None), ("kl", None)})
# Points a run's series must keep between two batches for the digest to see each one (a batch adds at most
# BATCH_RECORDS), with room to rebuild a bucket cut by a resume.
HISTORY_POINTS = 4096


@dataclass
class SeriesDigest:
    keep_whole: bool
    width: int = 1  # steps per bucket: doubles whenever there are more than CHART_BUCKETS
    buckets: dict[int, list[float]] = field(default_factory=dict)  # id -> [count, min, its step, max, its step]
    count: int = 0
    first: tuple[int, float] | None = None
    last: tuple[int, float] | None = None
    upto: int = -1  # every point up to this step is in the buckets
    approximate: bool = False  # a resume cut a bucket whose points the series no longer held
    _whole: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Points after `upto`, steps rising."""
        if not len(steps):
            return
        if self.first is None:
            self.first = (int(steps[0]), float(values[0]))
        self.count += len(steps)
        self.upto = int(steps[-1])
        self.last = (self.upto, float(values[-1]))
        if self.keep_whole:
            self._whole.append((steps.copy(), values.copy()))
        self._bucket(steps, values)

    def _bucket(self, steps: np.ndarray, values: np.ndarray) -> None:
        ids = steps // self.width
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        counts = np.diff(np.r_[starts, len(steps)])
        group = np.repeat(np.arange(len(starts)), counts)
        lo = np.lexsort((values, group))[starts]  # each group's first minimum (the sort is stable)
        hi = np.lexsort((-values, group))[starts]
        for key, n, lv, ls, hv, hs in zip(ids[starts].tolist(), counts.tolist(), values[lo].tolist(),
                                          steps[lo].tolist(), values[hi].tolist(), steps[hi].tolist(), strict=True):
            self._merge(key, [n, lv, ls, hv, hs])
        while len(self.buckets) > CHART_BUCKETS:
            self.buckets = _halved(self.buckets)
            self.width *= 2

    def _merge(self, key: int, b: list[float]) -> None:
        have = self.buckets.get(key)
        if have is None:
            self.buckets[key] = b
        else:
            self.buckets[key] = _combine(have, b)

    def cut(self, step: int, series: Series | None) -> None:
        """Forget the points from `step` on (the run resumed there); rebuild the bucket the cut falls in from the
        points the series still holds."""
        if self.upto < step:
            return
        edge = step // self.width
        part = self.buckets.get(edge)
        self.buckets = {k: b for k, b in self.buckets.items() if k < edge}
        self.upto = step - 1
        if self.keep_whole:
            steps = np.concatenate([s for s, _ in self._whole]) if self._whole else np.empty(0, np.int64)
            values = np.concatenate([v for _, v in self._whole]) if self._whole else np.empty(0)
            keep = steps < step
            self._whole = [(steps[keep], values[keep])]
        if part is not None and series is not None:
            steps, values = series.arrays()
            lo = edge * self.width
            inside = (steps >= lo) & (steps < step)
            if len(steps) and steps[0] > lo and part[0] > 0:
                self.approximate = True  # the cut bucket's older points are gone: keep its extremes as they were
                self.buckets[edge] = part
            elif inside.any():
                self._bucket(steps[inside], values[inside])
        self.count = int(sum(b[0] for b in self.buckets.values()))
        if not self.buckets:
            self.first = self.last = None
        elif series is not None and len(series):
            self.last = (int(series.arrays()[0][-1]), float(series.arrays()[1][-1]))

    def whole(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._whole:
            return np.empty(0, np.int64), np.empty(0)
        if len(self._whole) > 1:
            self._whole = [(np.concatenate([s for s, _ in self._whole]), np.concatenate([v for _, v in self._whole]))]
        return self._whole[0]

    def extremes(self) -> tuple[float, float]:
        return (min((b[1] for b in self.buckets.values()), default=math.nan),
                max((b[3] for b in self.buckets.values()), default=math.nan))

    def chart(self) -> tuple[np.ndarray, np.ndarray]:
        """Each bucket's min and max, and the first and last points, in step order."""
        pts = {p for p in (self.first, self.last) if p is not None}
        for _, lo, lo_step, hi, hi_step in self.buckets.values():
            pts |= {(int(lo_step), lo), (int(hi_step), hi)}
        ordered = sorted(pts)
        return (np.array([p[0] for p in ordered], dtype=np.int64),
                np.array([p[1] for p in ordered], dtype=np.float64))


def _combine(a: list[float], b: list[float]) -> list[float]:
    lo = a[1:3] if a[1] <= b[1] else b[1:3]
    hi = a[3:5] if a[3] >= b[3] else b[3:5]
    return [a[0] + b[0], *lo, *hi]


def _halved(buckets: dict[int, list[float]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for k in sorted(buckets):
        b = buckets[k]
        have = out.get(k // 2)
        out[k // 2] = b if have is None else _combine(have, b)
    return out


class RunDigest:
    """The digests of one run's series, fed by the run (a watcher) or at once from its series."""

    def __init__(self) -> None:
        self.series: dict[SeriesKey, SeriesDigest] = {}

    def _of(self, key: SeriesKey) -> SeriesDigest:
        d = self.series.get(key)
        if d is None:
            d = self.series[key] = SeriesDigest(keep_whole=key in KEPT_WHOLE)
        return d

    def _take(self, key: SeriesKey, s: Series, last_too: bool) -> None:
        d = self._of(key)
        steps, values = s.arrays()
        lo = int(np.searchsorted(steps, d.upto, side="right"))
        if lo == 0 and d.count and len(s) >= s.limit:  # the series dropped points the digest had not taken yet
            d.approximate = True
        hi = len(steps) if last_too else len(steps) - 1  # the last point: a record of its step may replace it
        if lo < hi:
            d.add(steps[lo:hi], values[lo:hi])

    # --- RunState.watchers -------------------------------------------------------------------------------

    def on_batch(self, run: RunState, cols: dict[SeriesKey, Column]) -> None:
        for key in cols:
            s = run.series.get(key)
            if s is not None and len(s):
                self._take(key, s, last_too=False)

    def on_rewind(self, run: RunState, step: int) -> None:
        for key, d in self.series.items():
            d.cut(step, run.series.get(key))

    def close(self, run: RunState) -> RunDigest:
        """Takes every point still in the series (call once the run is read to its end)."""
        for key, s in run.series.items():
            if len(s):
                self._take(key, s, last_too=True)
        if any(d.approximate for d in self.series.values()):
            log.warning("run %s: its series kept fewer points than the report needed (a resume further back than "
                        "they kept): its min, max and point counts may be off by the points around it", run.name)
        return self

    @classmethod
    def of(cls, run: RunState) -> RunDigest:
        """A digest from the series as they are (their kept history only)."""
        return cls().close(run)
