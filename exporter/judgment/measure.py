"""What the judgment reads off a run: the whole course of one series, and the series that measures progress."""

from __future__ import annotations

import numpy as np

from exporter.runstate import RunState, SeriesKey

REWARD: SeriesKey = ("reward", None)
MARGIN: SeriesKey = ("dpo_reward", "margin")
LOSS: SeriesKey = ("loss", None)
# What measures a run's progress, in order of preference: the reward; a DPO run's margin; else the loss, turned
# over (an SFT run improves as it falls).
PROGRESS: tuple[tuple[SeriesKey, str, float], ...] = ((REWARD, "reward", 1.0), (MARGIN, "reward margin", 1.0),
                                                      (LOSS, "loss", -1.0))


def arrays(run: RunState, key: SeriesKey) -> tuple[np.ndarray, np.ndarray] | None:
    """Steps and (bucket) means of a series' whole course, or None when the run has not logged it."""
    t = run.trajectories.get(key)
    if t is None or not len(t):
        return None
    steps, means, _ = t.arrays()
    return steps, means


def progress_arrays(run: RunState) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    """The progress measure's steps and levels (higher is better) and its name; (None, None, '') without one."""
    for key, name, sign in PROGRESS:
        got = arrays(run, key)
        if got is not None:
            return got[0], sign * got[1], name
    return None, None, ""
