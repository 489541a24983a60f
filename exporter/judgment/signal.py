"""Whether the groups still carry a learning signal, and which reward components did the work.

GRPO-type trainers learn only from groups whose rewards differ. Two readings: the share of groups that tie (no
advantage), over the run; and per reward component whether it ever fired (a function that scores 0 on nearly every
completion from the start gives no signal at all), whether it started at its ceiling (nothing left to learn from
it), and how far it moved."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exporter.judgment.course import Course, course_of

EDGE = 10  # points at the run's start (and end) whose median is its level there
SILENT_SHARE = 0.8  # a component that never fired: exactly 0 at this share of its points, and of its first ones
CEILING_SHARE = 0.85  # a component at its ceiling from the start: its start at this share of its highest level
MOST_TIED = 0.5  # half of the groups tie: the signal is mostly gone


def edge_levels(values: np.ndarray) -> tuple[float, float]:
    k = max(1, min(EDGE, len(values) // 10 or 1))
    return float(np.median(values[:k])), float(np.median(values[-k:]))


@dataclass(frozen=True)
class TiedGroups:
    start: float  # share of groups whose rewards tie, at the start and at the end
    end: float
    most_since: int | None  # the step from which at least half of the groups tie (smoothed, held)


@dataclass(frozen=True)
class Component:
    name: str
    course: Course
    start: float
    end: float
    peak: float  # its highest point
    silent: bool  # never fired: 0 at SILENT_SHARE of its points from the start
    fired: int  # points at which it was not 0
    points: int
    at_ceiling: bool  # started at CEILING_SHARE of its highest level: nothing left to learn from it

    @property
    def moved(self) -> bool:
        return self.course.shape in ("rising", "slowing", "plateau", "peaked")

    @property
    def fell(self) -> bool:
        """Ended well below its highest level (under CEILING_SHARE of it): whatever it gave, it gives less now."""
        return self.peak > 0 and self.end < CEILING_SHARE * self.peak


def tied_groups(steps: np.ndarray, values: np.ndarray) -> TiedGroups | None:
    if len(values) < EDGE:
        return None
    start, end = edge_levels(values)
    w = max(5, min(20, len(values) // 10))
    c = np.cumsum(np.r_[0.0, values])
    m = (c[w:] - c[:-w]) / w
    most = m >= MOST_TIED
    since = None
    for i in np.flatnonzero(most).tolist():
        tail = most[i:i + 30]
        if len(tail) >= 5 and tail.mean() >= 0.8:
            since = int(steps[i + w - 1])
            break
    return TiedGroups(start, end, since)


def component_of(name: str, steps: np.ndarray, values: np.ndarray) -> Component:
    zero = values == 0
    first = zero[:max(EDGE * 2, len(values) // 10)]
    silent = len(values) >= 20 and float(zero.mean()) >= SILENT_SHARE and float(first.mean()) >= SILENT_SHARE
    start, end = edge_levels(values)
    peak = float(values.max()) if len(values) else math.nan
    at_ceiling = not silent and peak > 0 and start >= CEILING_SHARE * peak
    return Component(name, course_of(steps, values), start, end, peak, silent, int((~zero).sum()), len(values),
                     at_ceiling)
