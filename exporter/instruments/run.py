"""The state of one training run: canonical instruments, pass-through keys and ingest counters."""

from __future__ import annotations

import math
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
    derived: DerivedState = field(init=False)

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
        updated = self._canonical(rec.values)
        for key, value in updated.items():
            s = self.series.get(key)
            if s is None:
                window = self.settings.window_for(key[0]).size
                s = self.series[key] = Series(self.limits.history_limit, window)
            s.add(rec.step, value)
        finite = {k: v for k, v in updated.items() if math.isfinite(v)}
        if finite:
            self.derived.on_record(self.series, finite, rec.step)

    def _canonical(self, values: dict[str, float]) -> dict[SeriesKey, float]:
        chosen: dict[SeriesKey, tuple[int, float]] = {}
        for k, v in values.items():
            t = self.keymap.resolve(k)
            if t is None:
                continue
            sk = (t.instrument, t.label_value)
            held = chosen.get(sk)
            if held is None or t.priority < held[0]:
                chosen[sk] = (t.priority, v)
        return {sk: v for sk, (_, v) in chosen.items()}

    def _pass_through(self, values: dict[str, float]) -> None:
        pt = self.passthrough
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

    @property
    def seconds_since_record(self) -> float:
        return math.inf if not self.last_record_time else time.time() - self.last_record_time
