"""One instrument series of one run: its last value and a bounded history indexed by step."""

from __future__ import annotations

import math
from collections import deque
from itertools import islice


class Series:
    __slots__ = ("history", "last_step", "last_value")

    def __init__(self, history_limit: int) -> None:
        self.last_value = math.nan
        self.last_step = -1
        # (step, value) of finite values only: NaN/inf are exported as the last value but would
        # poison every window statistic.
        self.history: deque[tuple[int, float]] = deque(maxlen=history_limit)

    def add(self, step: int, value: float) -> None:
        self.last_value = value
        self.last_step = step
        if value - value != 0.0:  # NaN or inf, without a function call on the hot path
            return
        h = self.history
        if h and h[-1][0] == step:
            h.pop()  # the same step logged again: the later value stands
        h.append((step, value))

    def tail(self, n: int) -> list[tuple[int, float]]:
        """The last n points, oldest first."""
        if n >= len(self.history):
            return list(self.history)
        out = list(islice(reversed(self.history), n))
        out.reverse()
        return out

    def cut_back(self, step: int) -> None:
        """A resumed run logs `step` again: forget everything from that step on."""
        while self.history and self.history[-1][0] >= step:
            self.history.pop()
        if self.history:
            self.last_step, self.last_value = self.history[-1]
        else:
            self.last_step, self.last_value = -1, math.nan
