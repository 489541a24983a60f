"""Persistence counted in logged steps: how long a condition has held, when a detector becomes active,
when it clears, and the excursions too short to become a state.

- held: consecutive logged points at which the condition holds (0 when it does not);
- active: from the point where held reaches `required` until the state has ended on `clear`
  consecutive points (the level back beyond its limit by a margin), so a state that wavers for a
  step neither resolves nor pages twice;
- onsets: times the detector became active (a counter, so a state that began and ended between two
  scrapes still reaches the rules);
- spikes: runs of the raw value beyond the limit shorter than `required` points that ended while the
  detector was not active: single-step excursions, counted and drawn, never alerted on their own.

All of it is computed over a whole batch of points at once, with what it needs of the previous batch
carried, so the result is the same wherever the batches were cut."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

MAX_EPISODES = 256  # kept per detector: a run that flaps for ever keeps its latest ones (and the count)


@dataclass(slots=True)
class Episode:
    """One time a detector was active: the step its condition began to hold, the step it became active,
    and the step it cleared (None while it is still active)."""

    since: int
    start: int
    end: int | None = None


def _run_lengths(flags: np.ndarray, carried: int) -> np.ndarray:
    """Length of the run of True ending at each position (0 where False); `carried` continues a run that
    ended the previous batch."""
    idx = np.arange(len(flags))
    last_false = np.maximum.accumulate(np.where(~flags, idx, -1))
    return np.where(last_false >= 0, idx - last_false, carried + idx + 1)


@dataclass
class Persistence:
    required: int  # points the condition must hold to become active
    clear: int  # points it must fail to clear
    held: int = 0
    failed: int = 0  # consecutive points at which the state had ended
    active: bool = False
    since_step: int = -1  # first step of the held run that made the detector active
    run_start_step: int = -1  # first step of the current held run
    onsets: int = 0
    spikes: int = 0
    last_step: int = -1  # the last step judged
    raw_run: int = 0  # consecutive points with the raw value beyond the limit
    episodes: deque[Episode] = field(default_factory=lambda: deque(maxlen=MAX_EPISODES))

    def update(self, steps: np.ndarray, cond: np.ndarray, raw: np.ndarray | None = None,
               clear: np.ndarray | None = None, count: bool = True) -> np.ndarray:
        """Judge a batch of points (in order); the active state at each. `clear` marks the points where a
        state has ended (default: where the condition fails; a detector with a margin clears only once
        its level is back beyond it, so a level hovering at its limit does not flap). `count` is off
        while a resumed run's history is replayed: onsets and spikes were counted when they happened."""
        n = len(cond)
        if n == 0:
            return np.zeros(0, dtype=bool)
        if not self.active and not self.held and not cond.any():  # quiet, and stays quiet: most batches
            self.failed = self.failed + n if clear is None or clear.all() else int(_run_lengths(clear, self.failed)[-1])
            if count and raw is not None and (self.raw_run or raw.any()):
                self.spikes += self._spikes(raw, np.zeros(n, dtype=bool))
            self.last_step = int(steps[-1])
            return np.zeros(n, dtype=bool)
        idx = np.arange(n)
        held = _run_lengths(cond, self.held)
        failed = _run_lengths(~cond if clear is None else clear, self.failed)
        last_set = np.maximum.accumulate(np.where(held >= self.required, idx, -1))
        last_clear = np.maximum.accumulate(np.where(failed >= self.clear, idx, -1))
        active = np.where((last_set < 0) & (last_clear < 0), self.active, last_set > last_clear)
        before = np.concatenate([[self.active], active[:-1]])
        rising = np.flatnonzero(active & ~before)

        first = np.minimum(idx - held + 1, idx)  # where each point's held run began (< 0: an earlier batch)
        run_starts = np.where(held == 0, -1, np.where(first >= 0, steps[np.maximum(first, 0)], self.run_start_step))
        if len(rising):
            self.since_step = int(run_starts[rising[-1]])
        if count:
            self._episodes(steps, active, run_starts)
            self.onsets += len(rising)
            if raw is not None:
                self.spikes += self._spikes(raw, active)
        self.held, self.failed, self.active = int(held[-1]), int(failed[-1]), bool(active[-1])
        self.last_step = int(steps[-1])
        self.run_start_step = int(run_starts[-1]) if self.held else -1
        return active

    def _episodes(self, steps: np.ndarray, active: np.ndarray, run_starts: np.ndarray) -> None:
        before = np.concatenate([[self.active], active[:-1]])
        for i in np.flatnonzero(active != before).tolist():
            if active[i]:
                self.episodes.append(Episode(int(run_starts[i]), int(steps[i])))
            elif self.episodes and self.episodes[-1].end is None:
                self.episodes[-1].end = int(steps[i])

    def _spikes(self, raw: np.ndarray, active: np.ndarray) -> int:
        runs = _run_lengths(raw, self.raw_run)
        ended = np.flatnonzero(~raw)  # a raw run ends at a point where the raw value is back
        before = np.concatenate([[self.raw_run], runs[:-1]])[ended]
        was_active = np.concatenate([[self.active], active[:-1]])[ended]
        self.raw_run = int(runs[-1])
        return int(np.count_nonzero((before > 0) & (before < self.required) & ~was_active))

    def reset(self) -> None:
        """Back to the start, counters and episodes kept (a resumed run's history is replayed from here)."""
        if self.episodes and self.episodes[-1].end is None:
            self.episodes[-1].end = self.last_step
        self.held = self.failed = self.raw_run = 0
        self.active = False
        self.since_step = self.run_start_step = -1
