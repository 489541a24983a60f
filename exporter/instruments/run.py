"""The state of one training run: canonical instruments, pass-through keys and ingest counters."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from exporter.instruments.derived import DerivedState
from exporter.instruments.keymap import INSTRUMENTS, KeyMap
from exporter.instruments.series import Series
from exporter.instruments.settings import DerivedSettings
from exporter.parsers.record import Record, RecordKind

SeriesKey = tuple[str, str | None]  # (instrument, sub-label value)


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
    _plans: dict[tuple[str, ...], list[tuple[str, SeriesKey]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.derived = DerivedState(self.settings, {n: i.label for n, i in INSTRUMENTS.items()})

    def ingest(self, rec: Record) -> None:
        assert rec.step is not None, "records reach a run with a step"
        self.records[rec.kind.value] += 1
        self.last_record_time = time.time()
        for reason, n in rec.skipped.items():
            self.values_skipped[reason] += n
        self._pass_through(rec.values)
        if rec.kind is RecordKind.SUMMARY:
            self.finished = True
            return
        if rec.kind is RecordKind.EVAL:
            return  # exported as pass-through only: evaluation never enters the training history
        if rec.step < self.step:
            self._rewind(rec.step)
        self.step = rec.step
        self.finished = False
        values, step, series = rec.values, rec.step, self.series
        finite: dict[SeriesKey, float] = {}
        for key, sk in self._plan(tuple(values)):
            value = values[key]
            s = series.get(sk)
            if s is None:
                s = series[sk] = Series(self.limits.history_limit)
            if value - value == 0.0 and s.history and s.history[-1][0] < step:
                # Series.add's common case inlined: this loop runs for every key of every record.
                s.last_value, s.last_step = value, step
                s.history.append((step, value))
                finite[sk] = value
            else:
                s.add(step, value)
                if value - value == 0.0:  # no NaN, no inf
                    finite[sk] = value
                else:
                    self.nonfinite[sk] += 1  # counted: the next value would hide it from a scrape
        if finite:
            self.derived.on_record(series, finite, step)

    def refresh(self) -> None:
        """Bring the window statistics up to date before they are read (a scrape, the end of dump)."""
        self.derived.refresh(self.series)

    def _plan(self, keys: tuple[str, ...]) -> list[tuple[str, SeriesKey]]:
        """Which key feeds which series, for one record shape; trainers repeat a few shapes, so the
        key table and the priorities are consulted once per shape, not once per record."""
        plan = self._plans.get(keys)
        if plan is None:
            chosen: dict[SeriesKey, tuple[int, str]] = {}
            for k in keys:
                t = self.keymap.resolve(k)
                if t is not None:
                    sk = (t.instrument, t.label_value)
                    if sk not in chosen or t.priority < chosen[sk][0]:
                        chosen[sk] = (t.priority, k)
            plan = self._plans[keys] = [(k, sk) for sk, (_, k) in chosen.items()]
            if len(self._plans) > 4096:  # a trainer with ever-new shapes: keep the cache bounded
                self._plans.clear()
        return plan

    def _pass_through(self, values: dict[str, float]) -> None:
        pt = self.passthrough
        if len(pt) + len(values) <= self.limits.max_keys:
            pt.update(values)  # under the cap whatever the keys: one C-level update
            return
        for k, v in values.items():
            if k in pt or len(pt) < self.limits.max_keys:
                pt[k] = v
            else:
                self.keys_dropped += 1

    def _rewind(self, step: int) -> None:
        self.resets += 1
        for s in self.series.values():
            s.cut_back(step)
        self.derived.rebuild(self.series)
