"""One instrument series of one run: its last value and a bounded history indexed by step."""

from __future__ import annotations

import math
from collections import deque

from exporter.instruments.window import SlidingWindow


class Series:
    __slots__ = ("history", "last_step", "last_value", "window")

    def __init__(self, history_limit: int, window_size: int) -> None:
        self.last_value = math.nan
        self.last_step = -1
        # (step, value) of finite values only: NaN/inf are exported as the last value but would
        # poison every window statistic.
        self.history: deque[tuple[int, float]] = deque(maxlen=history_limit)
        self.window = SlidingWindow(window_size)

    def add(self, step: int, value: float) -> None:
        self.last_value = value
        self.last_step = step
        if not math.isfinite(value):
            return
        if self.history and self.history[-1][0] == step:
            self.history.pop()  # the same step logged again: the later value stands
            self.history.append((step, value))
            self.window.rebuild(self.history)
            return
        self.history.append((step, value))
        self.window.add(step, value)

    def cut_back(self, step: int) -> None:
        """A resumed run logs `step` again: forget everything from that step on."""
        while self.history and self.history[-1][0] >= step:
            self.history.pop()
        self.window.rebuild(self.history)
        if self.history:
            self.last_step, self.last_value = self.history[-1]
        else:
            self.last_step, self.last_value = -1, math.nan
