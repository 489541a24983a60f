"""One run's detectors: fed the columns of each batch of records, they judge every logged point.

The state they export (per detector: active, held steps, steps required, onsets, spikes, the level
judged and its limit, the step its state began) is what the alert rules read, so a page, the report of a
finished run and the boards all read one judgment."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from exporter.detectors.catalog import (
    BASELINE_QUANTILE,
    CLIP_TOTAL,
    DETECTORS,
    NONFINITE,
    SIGNAL,
    TREND,
    BatchContext,
    Detector,
    SeriesKey,
)
from exporter.detectors.persistence import Persistence
from exporter.detectors.streams import Baseline, Stream, StreamView
from exporter.instruments.columns import Column
from exporter.instruments.series import Series
from exporter.instruments.settings import DerivedSettings

Inputs = dict[SeriesKey, tuple[np.ndarray, np.ndarray]]  # per input: the steps and values of its points
StateKey = tuple[str, str | None]  # (detector, sub-label value: the reward component, or None)
REPLAY_POINTS = 4 * (TREND + SIGNAL)  # history judged again after a resume: a state held this long is a state
# Rows of records judged at once: judging costs ~2.7 ms a call whatever its length, so the inputs of four record
# batches wait (as arrays) and are judged together; any read judges what waits first. 8,192 saved little more.
# (The 1 GB catch-up peaked at 105 MiB with 4,096 rows while its process gave each thread a malloc arena, 69 MiB in
# one arena: entry.py; bench/README.md. The TRL callback judges in its trainer's process, whose allocator it
# leaves alone: there, a few MiB of temporaries beside a model are nothing.)
JUDGE_ROWS = 4096
_LOW, _HIGH, _REGION = ("clip_ratio", "low"), ("clip_ratio", "high"), ("clip_ratio", "region")


@dataclass(frozen=True, slots=True)
class DetectorReading:
    """A detector's state as exported: one per detector (and reward component) that has judged a point."""

    detector: Detector
    sub: str | None
    state: Persistence
    value: float
    limit: float
    step: int


class DetectorSet:
    def __init__(self, settings: DerivedSettings) -> None:
        self.settings = settings
        self.detectors = [d for d in DETECTORS if d.name not in settings.detectors.disabled]
        self.states: dict[StateKey, Persistence] = {}
        self._last: dict[StateKey, tuple[float, float, int]] = {}  # (value, limit, step) at the last point
        self.streams: dict[SeriesKey, Stream] = {}
        self.carry: dict[str, tuple] = {}
        self.rl = False  # the run logs a reward: it samples and scores completions
        self._waiting: list[Inputs] = []  # inputs of batches not judged
        self._waiting_rows = 0
        for d in self.detectors:
            if not isinstance(d.input, str):  # counters from 0, so a first onset between two scrapes is seen
                self._state(d, None)
        self._inputs = {d.input for d in self.detectors if not isinstance(d.input, str)}
        self._inputs |= {k for d in self.detectors for k in d.reads}
        self._per_sub = {d.input for d in self.detectors if isinstance(d.input, str)}  # instruments judged per label

    def required(self, d: Detector) -> int:
        return self.settings.detectors.steps.get(d.name, d.required)

    def clear_steps(self, d: Detector) -> int:
        given = self.settings.detectors.clear.get(d.name)
        return given if given is not None else d.clear if d.clear is not None else self.settings.detectors.clear_steps

    def _state(self, d: Detector, sub: str | None) -> Persistence:
        st = self.states.get((d.name, sub))
        if st is None:
            st = self.states[d.name, sub] = Persistence(self.required(d), self.clear_steps(d))
        return st

    def _stream(self, key: SeriesKey) -> Stream:
        s = self.streams.get(key)
        if s is None:
            given = self.settings.baselines.get(key[0] if key[1] in (None, "mean") else f"{key[0]}_{key[1]}")
            baseline = Baseline(self.settings.baseline_points, given, BASELINE_QUANTILE.get(key, 0.5))
            s = self.streams[key] = Stream(TREND + SIGNAL, baseline)
        return s

    # --- a batch ----------------------------------------------------------------------------------------

    def on_batch(self, cols: dict[SeriesKey, Column], nrows: int, count: bool = True) -> None:
        """Take the batch's inputs, to be judged point by point in order once JUDGE_ROWS rows wait or something
        reads the state. `count` is off while a resumed run's history is replayed (its onsets and spikes were
        counted when they happened): that batch is judged at once."""
        reward = cols.get(("reward", None))
        # The run's first reward: the records before it are judged as a run's without one (as one at a time would be).
        if reward is not None and len(reward.rows) and not self.rl:
            first = int(reward.rows[0])
            if first:
                self._waiting.append(self._inputs_of(_rows(cols, lambda r: r < first), nrows))
            self.flush(count)
            self.rl = True
            cols = _rows(cols, lambda r: r >= first)
        self._waiting.append(self._inputs_of(cols, nrows))
        self._waiting_rows += nrows
        if not count or self._waiting_rows >= JUDGE_ROWS:
            self.flush(count)

    def flush(self, count: bool = True) -> None:
        """Judge the inputs that wait, as one batch: the same states as judged batch by batch."""
        if not self._waiting:
            return
        waiting, self._waiting, self._waiting_rows = self._waiting, [], 0
        inputs = waiting[0] if len(waiting) == 1 else _joined(waiting)
        views: dict[SeriesKey, StreamView] = {}
        for key, (steps, values) in inputs.items():
            views[key] = self._stream(key).push(steps, values)
        ctx = BatchContext(views, self.settings.thresholds, self.carry, self.rl, self.settings.detectors.clear_margin)
        with np.errstate(all="ignore"):  # a logged 1e300 overflows a sum of squares: its statistic is inf, no error
            self._judge(ctx, views, count)
        ctx.commit()

    def _judge(self, ctx: BatchContext, views: dict[SeriesKey, StreamView], count: bool) -> None:
        for d in self.detectors:
            per_sub = isinstance(d.input, str)
            targets = [(k, k[1]) for k in views if k[0] == d.input] if per_sub else [(d.input, None)]
            for key, sub in targets:
                view = ctx.view(key)
                if view is None:
                    continue
                ev = d.evaluate(ctx, view)
                if ev is None or not len(ev.steps):
                    continue
                state = self._state(d, sub)
                state.update(ev.steps, ev.cond, ev.raw, ev.clear, count)
                self._last[d.name, sub] = (float(ev.value[-1]), float(ev.limit[-1]), int(ev.steps[-1]))

    def _inputs_of(self, cols: dict[SeriesKey, Column], nrows: int) -> Inputs:
        out = {k: (c.steps, c.values) for k, c in cols.items() if k in self._inputs or k[0] in self._per_sub}
        low, high, region = cols.get(_LOW), cols.get(_HIGH), cols.get(_REGION)
        if low is not None and high is not None:  # GRPO: low + high, at the records that logged both
            with np.errstate(invalid="ignore"):  # inf + -inf is NaN, which the stream drops
                out[CLIP_TOTAL] = _combine(low, high, nrows, lambda a, b: a + b)
        elif region is not None:  # TRL before the low/high split
            out[CLIP_TOTAL] = (region.steps, region.values)
        loss, kl = cols.get(("loss", None)), cols.get(("kl", None))
        if loss is not None or kl is not None:  # 1 where a record's loss or KL is not a number
            present, bad = np.zeros(nrows, dtype=bool), np.zeros(nrows)
            steps = np.zeros(nrows, dtype=np.int64)
            for c in (loss, kl):
                if c is not None:
                    present[c.rows] = True
                    steps[c.rows] = c.steps
                    if not c.all_finite:
                        bad[c.rows[~c.finite]] = 1.0
            steps, bad = steps[present], bad[present]
            if len(steps) > 1:  # one point per step: loss and KL logged in two records of one step are one step
                first = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
                steps, bad = steps[first], np.maximum.reduceat(bad, first)
            out[NONFINITE] = (steps, bad)
        return out

    # --- a resumed run ----------------------------------------------------------------------------------

    def rebuild(self, series: dict[SeriesKey, Series], step: int) -> None:
        """The run went back to `step`: judge the last REPLAY_POINTS points of the remaining history again,
        counting no onset or spike twice (a detector needs at most 60 points before a step, and a log whose
        step goes back and forth must not cost a whole history each time). Baselines and other facts about
        the run's start that were complete before `step` stay; the others are collected again."""
        self.flush()  # the points before the resume count as they did when logged
        for st in self.states.values():
            st.reset()
        self._last.clear()
        self.carry = {k: v for k, v in self.carry.items() if k.startswith("start:") and v[-1] < step}
        for s in self.streams.values():
            s.reset()
            s.baseline.cut_back(step)
        keys = [k for k in series if k in self._inputs or k[0] in self._per_sub or k[0] == "clip_ratio"]
        if not keys:
            return
        arrays = {}
        for k in keys:
            steps, values = series[k].arrays(REPLAY_POINTS)
            b = self._stream(k).baseline
            if not b.ready:  # a baseline collected again needs the input's first points
                steps, values = series[k].arrays()
            arrays[k] = (steps, values)
        all_steps = np.unique(np.concatenate([a[0] for a in arrays.values()]))
        cols = {}
        for k, (steps, values) in arrays.items():  # one row per step: records are matched by step
            rows = np.searchsorted(all_steps, steps)
            cols[k] = Column(rows, steps.copy(), values.copy(), np.isfinite(values))
        self.on_batch(cols, len(all_steps), count=False)

    # --- reading ----------------------------------------------------------------------------------------

    def readings(self) -> Iterator[DetectorReading]:
        self.flush()
        by_name = {d.name: d for d in self.detectors}
        for (name, sub), st in sorted(self.states.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            value, limit, step = self._last.get((name, sub), (np.nan, np.nan, -1))
            yield DetectorReading(by_name[name], sub, st, value, limit, step)

    def baselines(self) -> Iterator[tuple[SeriesKey, float]]:
        self.flush()
        for key, s in sorted(self.streams.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if s.baseline.ready and key != NONFINITE:
                yield key, s.baseline.value


def _rows(cols: dict[SeriesKey, Column], keep: Callable[[np.ndarray], np.ndarray]) -> dict[SeriesKey, Column]:
    """The columns at the records whose row `keep` keeps; a column with none left is left out."""
    out = {}
    for k, c in cols.items():
        mask = keep(c.rows)
        if mask.any():
            out[k] = c.where(mask)
    return out


def _joined(batches: list[Inputs]) -> Inputs:
    """The inputs of consecutive batches as one: each key's points in order, keys in order of first appearance."""
    parts: dict[SeriesKey, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for inputs in batches:
        for key, (steps, values) in inputs.items():
            p = parts.setdefault(key, ([], []))
            p[0].append(steps)
            p[1].append(values)
    return {k: (np.concatenate(st), np.concatenate(v)) for k, (st, v) in parts.items()}


def _combine(a: Column, b: Column, nrows: int, fn) -> tuple[np.ndarray, np.ndarray]:
    """Two columns' values at the records that logged both (NaN kept: the stream drops it)."""
    va, vb = np.full(nrows, np.nan), np.full(nrows, np.nan)
    present = np.zeros(nrows, dtype=bool)
    steps = np.zeros(nrows, dtype=np.int64)
    va[a.rows], vb[b.rows] = a.values, b.values
    present[a.rows] = True
    both = present & np.isin(np.arange(nrows), b.rows)
    steps[a.rows] = a.steps
    return steps[both], fn(va[both], vb[both])
