"""The whole course of a series in memory that does not grow with the run: every point while the run is short, then
bucket means of a width that doubles whenever there are more than TRAJECTORY_POINTS buckets.

The judgment of a run (exporter/judgment/) reads what a practitioner reads on a chart of the whole run: where the
reward rose, peaked or went flat, how the KL moved with it. A series keeps only its last history_limit points, and
the report's digest exists only in `report`; a trajectory is kept by the run itself, so the judgment is the same
live (/api/v1/verdict) and after the run (`report`)."""

from __future__ import annotations

import numpy as np

TRAJECTORY_POINTS = 1024  # buckets kept: a 300-step run keeps every point; a 100k-step one buckets of 128
# The instruments whose whole course the judgment reads (every sub-label value of each).
KEPT_INSTRUMENTS = frozenset({
    "reward", "reward_std", "reward_zero_std", "reward_component", "reward_component_std", "kl", "loss", "entropy",
    "grad_norm", "learning_rate", "completion_length", "completion_truncated", "completion_diversity", "dpo_reward",
    "dpo_accuracy",
})


class Trajectory:
    """Bucket ends (the last step in each), sums and counts, steps rising; the last bucket fills up to `width`.
    Numpy arrays with room for twice the buckets kept, so a batch is appended with a few vector operations."""

    __slots__ = ("_counts", "_ends", "_max_steps", "_maxes", "_n", "_sums", "width")

    def __init__(self) -> None:
        self.width = 1
        self._n = 0
        self._ends = np.empty(2 * TRAJECTORY_POINTS + 2, dtype=np.int64)
        self._sums = np.empty(2 * TRAJECTORY_POINTS + 2, dtype=np.float64)
        self._counts = np.empty(2 * TRAJECTORY_POINTS + 2, dtype=np.int64)
        # each bucket's highest point and its step: a single-step spike survives the bucketing
        self._maxes = np.empty(2 * TRAJECTORY_POINTS + 2, dtype=np.float64)
        self._max_steps = np.empty(2 * TRAJECTORY_POINTS + 2, dtype=np.int64)

    def __len__(self) -> int:
        return self._n

    @property
    def points(self) -> int:
        """The logged points the trajectory stands for."""
        return int(self._counts[: self._n].sum())

    def extend(self, steps: np.ndarray, values: np.ndarray) -> None:
        """Finite points, steps rising; points at or before the last step held are dropped, except that a point at
        the last step replaces it while it is a bucket of one (the same step logged again: the later value
        stands)."""
        if not len(steps):
            return
        repeated = steps[1:] == steps[:-1]
        if repeated.any():
            keep = np.append(~repeated, True)
            steps, values = steps[keep], values[keep]
        n = self._n
        if n:
            last = self._ends[n - 1]
            if steps[0] == last and self._counts[n - 1] == 1:
                self._sums[n - 1] = self._maxes[n - 1] = values[0]
            after = int(np.searchsorted(steps, last, side="right"))
            steps, values = steps[after:], values[after:]
        while len(steps):
            steps, values = self._fill(steps, values)

    def _fill(self, steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Takes as many of the points as fit before the buckets must be halved; returns the rest."""
        n, w = self._n, self.width
        if n and self._counts[n - 1] < w:  # the last bucket is still filling
            k = min(w - int(self._counts[n - 1]), len(steps))
            self._ends[n - 1] = steps[k - 1]
            self._sums[n - 1] += float(values[:k].sum())
            self._counts[n - 1] += k
            top = int(np.argmax(values[:k]))
            if values[top] > self._maxes[n - 1]:
                self._maxes[n - 1], self._max_steps[n - 1] = values[top], steps[top]
            steps, values = steps[k:], values[k:]
        room = len(self._ends) - self._n
        take = min(len(steps), room * w)
        if take:
            full = take // w
            m = full * w
            grouped = slice(self._n, self._n + full)
            self._ends[grouped] = steps[w - 1 : m : w]
            rows = values[:m].reshape(full, w)
            self._sums[grouped] = rows.sum(axis=1)
            self._counts[grouped] = w
            top = np.argmax(rows, axis=1)
            self._maxes[grouped] = rows[np.arange(full), top]
            self._max_steps[grouped] = steps[:m].reshape(full, w)[np.arange(full), top]
            self._n += full
            if take > m:  # a partial bucket, still filling
                self._ends[self._n] = steps[take - 1]
                self._sums[self._n] = float(values[m:take].sum())
                self._counts[self._n] = take - m
                top = m + int(np.argmax(values[m:take]))
                self._maxes[self._n], self._max_steps[self._n] = values[top], steps[top]
                self._n += 1
        while self._n > TRAJECTORY_POINTS:
            self._halve()
        return steps[take:], values[take:]

    def _halve(self) -> None:
        """Adjacent buckets merged in pairs (an odd last one stays as it is, still filling)."""
        n = self._n
        pairs = n // 2
        m = 2 * pairs
        ends, sums, counts = self._ends, self._sums, self._counts
        maxes, max_steps = self._maxes, self._max_steps
        odd = (int(ends[m]), float(sums[m]), int(counts[m]), float(maxes[m]), int(max_steps[m])) if n > m else None
        second = maxes[1:m:2] > maxes[0:m:2]
        max_steps[:pairs] = np.where(second, max_steps[1:m:2], max_steps[0:m:2])
        maxes[:pairs] = np.maximum(maxes[0:m:2], maxes[1:m:2])
        ends[:pairs] = ends[1:m:2]
        sums[:pairs] = sums[0:m:2] + sums[1:m:2]
        counts[:pairs] = counts[0:m:2] + counts[1:m:2]
        self._n = pairs
        if odd is not None:
            ends[pairs], sums[pairs], counts[pairs], maxes[pairs], max_steps[pairs] = odd
            self._n += 1
        self.width *= 2

    def cut_back(self, step: int) -> None:
        """A resumed run logs `step` again: forget the buckets that reach it (a bucket that straddles the step goes
        whole: at most width - 1 earlier points with it)."""
        self._n = int(np.searchsorted(self._ends[: self._n], step, side="left"))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Steps (each bucket's last), means and counts, oldest first (copies)."""
        n = self._n
        counts = self._counts[:n].copy()
        return self._ends[:n].copy(), self._sums[:n] / np.maximum(counts, 1), counts

    def peaks(self) -> tuple[np.ndarray, np.ndarray]:
        """Each bucket's highest point: its step and value, oldest first (copies)."""
        return self._max_steps[: self._n].copy(), self._maxes[: self._n].copy()
