"""The checkpoint to keep: the saved one nearest the best step, from what the trainer said it saved and deleted
(parsers/checkpoints.py); the best step itself where nothing says what was saved.

The best step is where the progress measure's smoothed level peaked, or where it reached its plateau (later
checkpoints are no better and further from the reference); for a run that must stop now, its peak before the first
sign of trouble (a checkpoint from after it holds the damage), and only saves from before that sign."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from exporter.judgment.course import smoothed, window_of
from exporter.judgment.measure import progress_arrays

if TYPE_CHECKING:
    from exporter.judgment.course import Course
    from exporter.runstate import RunState


@dataclass(frozen=True)
class Keep:
    best_step: int  # where the progress measure peaked (before `before`, when set)
    step: int | None  # the saved checkpoint to keep, on disk as far as the log says; None: no save read
    path: str | None
    rotated_step: int | None  # a save nearer the best step that was deleted since (save_total_limit)
    rotated_path: str | None
    before: int | None  # only checkpoints before this step (the first sign of trouble) are worth keeping
    saves_read: int  # saves the log reported
    known: bool = True  # what is on disk is known (a listing, or deletions the trainer reports)
    measure: str = ""  # what measures progress (measure.PROGRESS): "reward", "reward margin" or "loss"
    best_level: float | None = None  # its smoothed level at the best step (the loss turned over: higher is better)

    @staticmethod
    def _name(path: str | None, step: int) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1] if path else f"the checkpoint of step {step}"

    def text(self) -> str:
        if self.step is None and self.rotated_step is not None:
            return (f"nothing saved before step {self.before} is left on disk: "
                    f"{self._name(self.rotated_path, self.rotated_step)}, the nearest to the best step "
                    f"{self.best_step}, was deleted since (save_total_limit); restart from an earlier model with the "
                    "cause fixed")
        if self.step is None:
            where = f"the checkpoint nearest step {self.best_step}, where the run was at its best"
            if self.saves_read:
                return f"{where} (no save before step {self.before} was read)" if self.before is not None else where
            return where + " (no checkpoint save was read from the log)"
        name = self._name(self.path, self.step)
        out = f"{name} ({self.path})" if self.path else name
        out += f", the saved checkpoint nearest the best step {self.best_step}"
        if self.rotated_step is not None:
            out += (f"; {self._name(self.rotated_path, self.rotated_step)}, nearer, was deleted since "
                    "(save_total_limit)")
        if not self.known and self.saves_read > 1:
            out += " (the log does not say which saves were deleted since: check it is still on disk)"
        return out

    def as_json(self) -> dict[str, Any]:
        return {"best_step": self.best_step, "checkpoint_step": self.step, "checkpoint_path": self.path,
                "rotated_step": self.rotated_step, "rotated_path": self.rotated_path, "before_step": self.before,
                "saves_read": self.saves_read, "on_disk_known": self.known, "measure": self.measure,
                "best_level": self.best_level}


def best_step(course: Course | None, steps: np.ndarray | None, levels: np.ndarray | None, before: int | None,
              last_step: int) -> int:
    """The course's peak, or the peak of the same smoothing among the points before `before`."""
    if course is None or steps is None or levels is None or not len(steps):
        return last_step if before is None else max(before - 1, 0)
    # on a plateau, its first step: later checkpoints are no better and further from the reference (also when the
    # trouble came on the plateau: a noisy high before the sign is no better)
    if course.shape == "plateau" and course.since_step is not None and (before is None or course.since_step < before):
        return course.since_step
    if before is None:
        return course.peak_step
    keep = steps < before
    if not keep.any():
        return int(steps[0])
    s, v = steps[keep], levels[keep]
    m = smoothed(v, min(window_of(len(levels)), len(v)))
    finite = np.isfinite(m)
    return int(s[np.flatnonzero(finite)[int(np.argmax(m[finite]))]]) if finite.any() else int(s[-1])


def level_at(steps: np.ndarray | None, levels: np.ndarray | None, step: int) -> float | None:
    """The progress measure's level at `step`, smoothed as the course smooths it (None where it is not a number)."""
    if steps is None or levels is None or not len(steps):
        return None
    m = smoothed(levels, window_of(len(levels)))
    i = max(int(np.searchsorted(steps, step, side="right")) - 1, 0)
    return float(m[i]) if np.isfinite(m[i]) else None


def _nearest(candidates: list[int], step: int) -> int | None:
    return min(candidates, key=lambda s: (abs(s - step), s)) if candidates else None


def keep_of(run: RunState, course: Course | None, before: int | None) -> Keep:
    steps, levels, measure = progress_arrays(run)
    best = best_step(course, steps, levels, before, max(run.step, 0))
    saved = run.checkpoints.saved
    on_disk = run.checkpoints.on_disk()
    if before is not None:
        on_disk = [s for s in on_disk if s < before]
    pick = _nearest(on_disk, best)
    every = [s for s in saved if before is None or s < before]
    nearest = _nearest(every, best)
    rotated = nearest if nearest is not None and nearest != pick and nearest in run.checkpoints.deleted and (
        pick is None or abs(nearest - best) < abs(pick - best)) else None
    return Keep(best, pick, saved.get(pick) if pick is not None else None, rotated,
                saved.get(rotated) if rotated is not None else None, before, len(saved), run.checkpoints.known,
                measure, level_at(steps, levels, best))
