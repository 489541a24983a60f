"""The state of one training run: canonical instruments, pass-through keys and ingest counters.

Read its series, derived state and counters after refresh(): training records are applied in batches."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from exporter.detectors.engine import DetectorSet
from exporter.instruments.columns import Shape, ShapePlan, batch_columns, rows_by_shape
from exporter.instruments.derived import DerivedState
from exporter.instruments.keymap import INSTRUMENTS, KeyMap
from exporter.instruments.series import Series
from exporter.instruments.settings import DerivedSettings
from exporter.parsers.record import Record, RecordKind

SeriesKey = tuple[str, str | None]  # (instrument, sub-label value)
# Training records wait in a batch of this many before they reach the series: applying a batch
# moves whole columns with C-level calls and numpy instead of one Python step per key and record.
BATCH_RECORDS = 1024


@dataclass
class RunLimits:
    max_keys: int = 500  # distinct pass-through keys per run
    history_limit: int = 2048  # points of history kept per series


@dataclass
class RunState:
    name: str
    keymap: KeyMap
    limits: RunLimits = field(default_factory=RunLimits)
    settings: DerivedSettings = field(default_factory=DerivedSettings)
    series: dict[SeriesKey, Series] = field(default_factory=dict)
    passthrough: dict[str, float] = field(default_factory=dict)
    step: int = -1  # last training step
    finished: bool = False
    last_record_time: float = 0.0
    records: Counter[str] = field(default_factory=Counter)  # by kind
    keys_dropped: int = 0
    values_skipped: Counter[str] = field(default_factory=Counter)  # by reason
    resets: int = 0
    nonfinite: Counter[SeriesKey] = field(default_factory=Counter)  # NaN/inf values, by series
    derived: DerivedState = field(init=False)
    detectors: DetectorSet = field(init=False)
    _plans: dict[Shape, ShapePlan] = field(init=False, default_factory=dict)
    _pending: list[Record] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.derived = DerivedState(self.settings, {n: i.label for n, i in INSTRUMENTS.items()})
        self.detectors = DetectorSet(self.settings)

    def ingest(self, rec: Record) -> None:
        """Counters at once; the record's values wait in a batch that is applied when it is full or
        before the state is read (refresh)."""
        assert rec.step is not None, "records reach a run with a step"
        self.records[rec.kind] += 1
        self.last_record_time = time.time()
        if rec.skipped:
            self.values_skipped.update(rec.skipped)
        if rec.kind is RecordKind.TRAIN:
            if rec.step < self.step:
                self._apply()
                self._rewind(rec.step)
            self.step = rec.step
            self.finished = False
        elif rec.kind is RecordKind.SUMMARY:
            self.finished = True
        # Evaluation and summary records wait too, for pass-through only (in record order, so the
        # last value of a key they share with training records is the latest); they never enter
        # the training history.
        self._pending.append(rec)
        if len(self._pending) >= BATCH_RECORDS:
            self._apply()

    def refresh(self) -> None:
        """Bring everything up to date before it is read (a scrape, the end of dump): the waiting
        records, then the window statistics."""
        self._apply()
        self.derived.refresh(self.series, dict(self.detectors.baselines()))

    def _apply(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        shapes = rows_by_shape(batch)
        self._pass_through(shapes, batch)
        cols = batch_columns(batch, shapes, self._plan)
        series = self.series
        for sk, col in cols.items():
            s = series.get(sk)
            if s is None:
                s = series[sk] = Series(self.limits.history_limit)
            s.extend(col)
            if not col.all_finite:
                self.nonfinite[sk] += len(col.values) - int(np.count_nonzero(col.finite))
        self.derived.on_batch(cols, len(batch))
        self.detectors.on_batch(cols, len(batch))

    def _plan(self, shape: Shape) -> ShapePlan:
        """Which key feeds which series, for one record shape; trainers repeat a few shapes, so the
        key table and the priorities are consulted once per shape, not once per record."""
        plan = self._plans.get(shape)
        if plan is None:
            chosen: dict[SeriesKey, tuple[int, int]] = {}  # series -> (priority, position)
            for pos, k in enumerate(shape):
                t = self.keymap.resolve(k)
                if t is not None:
                    sk = (t.instrument, t.label_value)
                    if sk not in chosen or t.priority < chosen[sk][0]:
                        chosen[sk] = (t.priority, pos)
            if len(self._plans) >= 4096:  # a trainer with ever-new shapes: keep the cache bounded
                self._plans.clear()
            plan = self._plans[shape] = ShapePlan(tuple(chosen), tuple(pos for _, pos in chosen.values()))
        return plan

    def _pass_through(self, shapes: dict[Shape, list[int]], batch: list[Record]) -> None:
        """Every key's last value. Under the cap, the last record of each shape, in record order,
        is all it takes; near the cap, which keys get in depends on record order, so record by record."""
        pt, cap = self.passthrough, self.limits.max_keys
        if len(pt) + sum(map(len, shapes)) <= cap:
            for shape, rows in sorted(shapes.items(), key=lambda item: item[1][-1]):
                pt.update(zip(shape, batch[rows[-1]].numbers, strict=True))
            return
        for rec in batch:
            for k, v in zip(rec.shape, rec.numbers, strict=True):
                if k in pt or len(pt) < cap:
                    pt[k] = v
                else:
                    self.keys_dropped += 1

    def _rewind(self, step: int) -> None:
        self.resets += 1
        for s in self.series.values():
            s.cut_back(step)
        self.derived.rebuild(self.series)
        self.detectors.rebuild(self.series, step)
