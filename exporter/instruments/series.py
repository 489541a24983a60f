"""One instrument series of one run: its last value and a bounded history indexed by step."""

from __future__ import annotations

import math

import numpy as np

from exporter.instruments.columns import Column


class Series:
    """History in two numpy arrays (steps, values) of twice the limit: a batch is appended with
    one copy, and the live region moves back to the front only when the arrays are full."""

    __slots__ = ("_end", "_start", "_steps", "_values", "last_step", "last_value", "limit")

    def __init__(self, history_limit: int) -> None:
        self.limit = history_limit
        self.last_value = math.nan
        self.last_step = -1
        # (step, value) of finite values only: NaN/inf are exported as the last value but would
        # poison every window statistic.
        self._steps = np.empty(2 * history_limit, dtype=np.int64)
        self._values = np.empty(2 * history_limit, dtype=np.float64)
        self._start = self._end = 0

    def __len__(self) -> int:
        return self._end - self._start

    def extend(self, col: Column) -> None:
        """A batch's values of this series, in record order (steps never go back inside a batch)."""
        self.last_value = float(col.values[-1])
        self.last_step = int(col.steps[-1])
        steps, values = col.finite_steps(), col.finite_values()
        if not len(steps):
            return
        repeated = steps[1:] == steps[:-1]
        if repeated.any():  # the same step logged again: the later value stands
            keep = np.append(~repeated, True)
            steps, values = steps[keep], values[keep]
        if len(self) and self._steps[self._end - 1] == steps[0]:
            self._end -= 1
        steps, values = steps[-self.limit :], values[-self.limit :]
        n = len(steps)
        if self._end + n > len(self._steps):  # full: keep what still fits in the limit, at the front
            keep = min(len(self), self.limit - n)
            self._move_to_front(keep)
        self._steps[self._end : self._end + n] = steps
        self._values[self._end : self._end + n] = values
        self._end += n
        self._start = max(self._start, self._end - self.limit)

    def _move_to_front(self, keep: int) -> None:
        lo = self._end - keep
        self._steps[:keep] = self._steps[lo : self._end]
        self._values[:keep] = self._values[lo : self._end]
        self._start, self._end = 0, keep

    def arrays(self, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Steps and values of the last n points (all when None), oldest first (views, not copies)."""
        lo = self._start if n is None else max(self._start, self._end - n)
        return self._steps[lo : self._end], self._values[lo : self._end]

    def tail(self, n: int) -> list[tuple[int, float]]:
        """The last n points, oldest first."""
        steps, values = self.arrays(n)
        return list(zip(steps.tolist(), values.tolist(), strict=True))

    @property
    def history(self) -> list[tuple[int, float]]:
        """Every point kept, oldest first."""
        return self.tail(len(self))

    def cut_back(self, step: int) -> None:
        """A resumed run logs `step` again: forget everything from that step on."""
        steps, _ = self.arrays()
        self._end = self._start + int(np.searchsorted(steps, step, side="left"))
        if len(self):
            self.last_step = int(self._steps[self._end - 1])
            self.last_value = float(self._values[self._end - 1])
        else:
            self.last_step, self.last_value = -1, math.nan
