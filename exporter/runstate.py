"""The state of one training run: canonical instruments, pass-through keys and ingest counters.

Read its series, derived state and counters after refresh(): training records are applied in batches."""

from __future__ import annotations

import logging
import math
import operator
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from exporter.console.framing import MAX_LINE_LENGTH
from exporter.detectors.engine import DetectorSet
from exporter.instruments.columns import Column, Shape, ShapePlan, batch_columns, rows_by_shape
from exporter.instruments.derived import DerivedState
from exporter.instruments.keymap import INSTRUMENTS, KeyMap
from exporter.instruments.series import Series
from exporter.instruments.settings import DerivedSettings
from exporter.instruments.trajectory import KEPT_INSTRUMENTS, Trajectory
from exporter.parsers.checkpoints import CheckpointEvent, SavedCheckpoints
from exporter.parsers.failures import Failure, exit_text
from exporter.parsers.record import Record, RecordKind
from exporter.parsers.training import Training, TrainingStart
from exporter.parsers.values import MAX_STEP
from exporter.samples.diversity import FORMAT as SAMPLES_FORMAT
from exporter.samples.store import SampleStore

log = logging.getLogger(__name__)

SeriesKey = tuple[str, str | None]  # (instrument, sub-label value)
# Training records wait in a batch of this many before they reach the series: applying a batch
# moves whole columns with C-level calls and numpy instead of one Python step per key and record.
BATCH_RECORDS = 1024
# Record shapes whose plan is kept: a trainer prints a handful; a log whose every line brings new keys
# must not fill memory with plans.
_MAX_PLANS = 64
# Reasons a key is not exported (posttrain_exporter_keys_dropped_total), all exported from the start.
KEY_DROP_REASONS = ("max_keys", "key_too_long", "key_not_utf8")
# Skipped values that are routine (HF prints None for a NaN) and not worth a log line.
_ROUTINE_SKIPS = frozenset({"none", "non_numeric"})
_KIND, _STEP, _SKIPPED, _NUMBERS = (operator.attrgetter(a) for a in ("kind", "step", "skipped", "numbers"))


class RunWatcher(Protocol):
    def on_batch(self, run: RunState, cols: dict[SeriesKey, Column]) -> None: ...

    def on_rewind(self, run: RunState, step: int) -> None: ...


@dataclass(frozen=True)
class RunLimits:
    """The config's `limits`: what one run may hold. `minimum` is exclusive (config.py checks it at start)."""

    max_keys: int = 500  # distinct keys per run: pass-through keys, which also bound a family's label values
    history_limit: int = field(default=2048, metadata={"minimum": 1})  # points of history kept per series
    max_key_length: int = 128  # characters in a key, and so in a label value taken from one
    # Characters in a line of a console log. Below a few KiB a limit would drop the metric lines themselves (a GRPO
    # line is about 1,500 characters).
    max_line_length: int = field(default=MAX_LINE_LENGTH, metadata={"minimum": 4095})


# A sign that the trainer died counts, where no exit says it (a file, a stream), once the trainer's output has been
# silent since for longer than this and than this many times its mean interval between records (RunState.crash_at).
SIGN_SILENCE_SECONDS = 60.0
SIGN_SILENCE_INTERVALS = 5


@dataclass
class RunState:
    name: str
    keymap: KeyMap
    limits: RunLimits = field(default_factory=RunLimits)
    settings: DerivedSettings = field(default_factory=DerivedSettings)
    series: dict[SeriesKey, Series] = field(default_factory=dict)
    # the whole course of the series the judgment reads, bucketed once long (instruments/trajectory.py)
    trajectories: dict[SeriesKey, Trajectory] = field(default_factory=dict)
    passthrough: dict[str, float] = field(default_factory=dict)
    step: int = -1  # last training step
    finished: bool = False
    last_record_time: float = 0.0
    first_record_time: float = 0.0  # with last_record_time and the record count: the run's mean pace (stale)
    records: Counter[str] = field(default_factory=Counter)  # by kind
    # of records["train"]: completion sets' diversity (pipeline.take_samples, counted in ingest), no metric of the
    # trainer's
    sample_records: int = 0
    keys_dropped: Counter[str] = field(default_factory=Counter)  # values of keys not exported, by reason
    values_skipped: Counter[str] = field(default_factory=Counter)  # by reason
    resets: int = 0
    training: Training | None = None  # the training the run is about, when its feed says (parsers/training.py)
    nonfinite: Counter[SeriesKey] = field(default_factory=Counter)  # NaN/inf values, by series
    samples: SampleStore = field(default_factory=SampleStore)  # printed completions, a few per step (report only)
    # The last sign in the log that the trainer died (parsers/failures.py), and the count of the trainer's records
    # (of every kind) that had reached or were on their way to the run then: a record beyond it means the trainer
    # lived on (see `crash_at`).
    failure: Failure | None = None
    _failure_mark: int = field(init=False, default=0, repr=False)
    failure_time: float = 0.0  # when the sign was written (read, or its file's modification time if earlier)
    _before_failure: tuple[Failure | None, int, float] = field(init=False, default=(None, 0, 0.0), repr=False)
    exit_status: int | None = None  # `run`: the trainer's exit status, as a shell gives it, once it exited
    supervised: bool = False  # `run`: the trainer is our child, so its exit (not a silence) says it stopped
    output_ended: bool = False  # a stream of the run ended (dump and report read to the end; stdin closed)
    longest_gap: float = 0.0  # seconds: the longest the run has gone without a record so far (and lived on)
    # tracebacks of code outside the trainer's process (parsers/failures.py): the reward function is failing
    reward_function_errors: int = 0
    reward_function_error: str | None = None  # the last one's exception line
    # the checkpoints its output says were saved and deleted (parsers/checkpoints.py): the one to keep must exist
    checkpoints: SavedCheckpoints = field(default_factory=SavedCheckpoints.empty)
    # early_stop.action signal: the exporter signalled the trainer to stop; how it dies after that is no crash
    stopped: bool = False
    derived: DerivedState = field(init=False)
    detectors: DetectorSet = field(init=False)
    _plans: dict[Shape, ShapePlan] = field(init=False, default_factory=dict)
    _pending: list[Record] = field(init=False, default_factory=list, repr=False)
    _history_end: int = field(init=False, default=-1, repr=False)  # the history holds no training step above it
    _cut_waiting: bool = field(init=False, default=False, repr=False)  # a step went back within the waiting batch
    _admitted: set[str] = field(init=False, default_factory=set, repr=False)  # keys counted against max_keys
    _warned: set[str] = field(init=False, default_factory=set, repr=False)  # reasons already logged
    # Told of every batch applied and every resume (the report's digest: what it keeps of the whole run).
    watchers: list[RunWatcher] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._new_judgment()

    @property
    def trainer_records(self) -> int:
        """Training records the trainer logged: a completion set's diversity is a training record at its step (it
        becomes series), but no metric of the training's."""
        return self.records[RecordKind.TRAIN] - self.sample_records

    def failed(self, failure: Failure, on_their_way: int = 0) -> None:
        """A sign that the trainer died, seen after its records so far and `on_their_way` more (read before the
        sign, waiting for their step)."""
        if failure is not self.failure:  # a traceback is told at its start and again at its exception line
            self._before_failure = (self.failure, self._failure_mark, self.failure_time)
        self.failure = failure
        self._failure_mark = self._trainer_output() + on_their_way
        self.failure_time = time.time()

    def reward_function_failed(self, failure: Failure) -> None:
        """A traceback of code outside the trainer's process (the reward function's sandbox or subprocess): counted,
        and no sign; where it was taken for one as it began (failed()), the sign before it stands again."""
        self.reward_function_errors += 1
        self.reward_function_error = failure.text
        if self.failure is failure:
            self.failure, self._failure_mark, self.failure_time = self._before_failure

    def stream_ended(self) -> None:
        """A console stream of the run ended: its last sign, with nothing of the trainer's after, is judged now."""
        self.output_ended = True

    def lived_on(self) -> None:
        """The trainer's own output after its last sign (its bar moved on, it logged a line or a checkpoint): no
        sign stands."""
        self.failure = None

    def saved(self, event: CheckpointEvent) -> None:
        self.checkpoints.take(event)

    def written_by(self, t: float) -> None:
        """The records read so far were written by `t` (their file's modification time): the last one is no younger,
        and neither is the first. A log whose trainer died long ago reads as silent since then, not since it was
        read (the stall alert, the stale verdict)."""
        if self.last_record_time > t:
            self.last_record_time = t
            self.first_record_time = min(self.first_record_time, t)
        if self.failure_time > t:  # the sign too: a trainer that died two days ago has been silent since
            self.failure_time = t

    @property
    def crash(self) -> Failure | None:
        """crash_at(now), or as at the end of the trainer's output once a stream of the run ended."""
        return self.crash_at(None if self.output_ended else time.time())

    def crash_at(self, now: float | None) -> Failure | None:
        """Why the run is judged crashed at `now` (None: at the end of its output, as a finished log is read), or
        None. A sign counts only when the trainer's output shows it stopped: no record of any kind, bar that moved
        on, log line or checkpoint of the trainer's after it (the pipeline clears it then: lived_on), no end summary
        before it, and then, under `run`, the trainer exited (non-zero is a crash by itself, with the sign as the
        reason; status 0 clears nothing: a wrapper script that swallows the trainer's status is common; a signal
        `run` forwarded is no crash, its status is not taken); elsewhere, its output ended or has been silent since
        the sign for longer than the run's usual silence (usual_silence). A trainer the exporter stopped (`stopped`)
        did not crash, whatever it printed or exited with."""
        if self.stopped:
            return None
        failed = self.failure is not None and not self.finished and self._trainer_output() <= self._failure_mark
        if self.exit_status:
            said = exit_text(self.exit_status)
            if failed:
                said += f"; its output ended in: {self.failure.text}"  # type: ignore[union-attr]
            return Failure("exit_status", said)
        if not failed:
            return None
        if self.supervised:
            return self.failure if self.exit_status is not None else None
        if now is None or now - self.failure_time > self.usual_silence():
            return self.failure
        return None

    def usual_silence(self) -> float:
        """Seconds of silence after a sign that a living trainer of this run's pace may well keep (a checkpoint
        save, an evaluation): SIGN_SILENCE_SECONDS, SIGN_SILENCE_INTERVALS times its mean interval between records,
        and twice its longest silence so far, whichever is longest."""
        n = sum(self.records.values())
        mean = (self.last_record_time - self.first_record_time) / (n - 1) if n > 1 else 0.0
        return max(SIGN_SILENCE_SECONDS, SIGN_SILENCE_INTERVALS * mean, 2 * self.longest_gap)

    def _trainer_output(self) -> int:
        """The records that reached the run so far, of every kind: each is the trainer's output."""
        return sum(self.records.values())

    def _recorded(self) -> None:
        """Records came now: the run's pace (stale) and its longest silence so far between them (usual_silence)."""
        now = time.time()
        if self.last_record_time:
            self.longest_gap = max(self.longest_gap, now - self.last_record_time)
        self.last_record_time = now
        self.first_record_time = self.first_record_time or now

    def _new_judgment(self) -> None:
        self.derived = DerivedState(self.settings, {n: i.label for n, i in INSTRUMENTS.items()})
        self.detectors = DetectorSet(self.settings)

    def ingest(self, rec: Record) -> None:
        """Counters at once; the record's values wait in a batch that is applied when it is full or
        before the state is read (refresh)."""
        assert rec.step is not None, "records reach a run with a step"
        if rec.kind is RecordKind.TRAINING:
            assert isinstance(rec, TrainingStart)
            self.begin_training(rec.training)
            return
        if not 0 <= rec.step <= MAX_STEP:  # the parsers check steps; this guards the int64 history
            self.values_skipped["step_out_of_range"] += len(rec.numbers)
            self._warn_once("step_out_of_range", f"dropped a record at step {rec.step}, which the history cannot "
                            "hold; further ones are only counted in posttrain_exporter_values_skipped_total")
            return
        if len(rec.numbers) > self.limits.max_keys:
            rec = self.narrowed(rec)
        self.records[rec.kind] += 1
        if rec.fmt == SAMPLES_FORMAT and rec.kind is RecordKind.TRAIN:
            # counted here, by the run that takes it: a console stream's run may be a wrapper (launch.py), and a
            # counter set on it would never reach this run
            self.sample_records += 1
        self._recorded()
        if rec.skipped:
            self._skip_values(rec.skipped)
        if rec.kind is RecordKind.TRAIN:
            if rec.step < self.step:
                if rec.step > self._history_end and self._replaces_one(rec.step):
                    self.resets += 1  # cut when the batch is applied, in one pass (_superseded_left_out)
                    self._cut_waiting = True
                else:
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

    def ingest_many(self, recs: list[Record]) -> None:
        """ingest(rec) for each of `recs`, records that carry their step (the console stream's runs of
        lines): training records whose step does not go back are taken without a call each."""
        if not recs:
            return
        if "ingest" in vars(self):  # ingest wrapped on this run (a test's hook): it sees every record
            for rec in recs:
                self.ingest(rec)
            return
        if self._take_all(recs):
            return
        pending, limit, max_keys = self._pending, BATCH_RECORDS, self.limits.max_keys
        train = RecordKind.TRAIN
        last, taken, fresh = self.step, 0, False  # fresh: training records taken since step and finished were set
        for rec in recs:
            step = rec.step
            if rec.kind is not train or rec.skipped or not last <= step <= MAX_STEP or len(rec.numbers) > max_keys:
                if fresh:
                    self.step, self.finished, fresh = last, False, False
                self.ingest(rec)
                last, pending = self.step, self._pending
                continue
            last, fresh = step, True
            taken += 1
            pending.append(rec)
            if len(pending) >= limit:
                self.step, self.finished, fresh = last, False, False
                self._apply()
                pending = self._pending
        if fresh:
            self.step, self.finished = last, False
        if taken:
            self.records[train] += taken
        self._recorded()

    def _take_all(self, recs: list[Record]) -> bool:
        """ingest_many's loop in C-level passes, when every record is one it takes without a call (training,
        nothing skipped, steps that never go back, within max_keys): a run of one shape read at once. False (and
        nothing done) otherwise."""
        steps = list(map(_STEP, recs))
        if not (self.step <= steps[0] and steps[-1] <= MAX_STEP and all(map(operator.le, steps, steps[1:]))
                and set(map(_KIND, recs)) == {RecordKind.TRAIN} and not any(map(_SKIPPED, recs))
                and max(map(len, map(_NUMBERS, recs))) <= self.limits.max_keys):
            return False
        n, limit = len(recs), BATCH_RECORDS
        i = 0
        while i < n:
            pending = self._pending
            j = min(n, i + limit - len(pending))
            pending += recs[i:j]
            if len(pending) >= limit:
                self.step, self.finished = steps[j - 1], False  # as the loop leaves them before a batch
                self._apply()
            i = j
        self.step, self.finished = steps[-1], False
        self.records[RecordKind.TRAIN] += n
        self._recorded()
        return True

    def begin_training(self, training: Training) -> None:
        """A training starts (its feed says so) and the run is about it from here. A fresh one (step 0) inherits
        nothing of an earlier one in the same log: history, pass-through values, derived state and detectors (so
        findings and the stop signal) start empty; counters stay, and count it as a history reset. One resumed
        from a checkpoint at step N keeps the history up to N, as a log whose step goes back does, and no finding
        that began after N."""
        if training.step == 0 and (self.step >= 0 or self._pending or self.series or self.passthrough):
            self.resets += 1
            self._pending = []
            self.series, self.passthrough, self.trajectories = {}, {}, {}
            self.checkpoints = SavedCheckpoints.empty()
            self._new_judgment()
            self._plans, self._admitted = {}, set()
            self.step = -1
        elif training.step > 0:
            self._apply()
            if training.step < self.step:
                self._rewind(training.step)
            for state in self.detectors.states.values():
                kept = [e for e in state.episodes if e.start <= training.step]
                state.episodes.clear()
                state.episodes.extend(kept)
        self.finished = False
        self.failure = None  # a new training's: an earlier one's death is not its own
        self.training = training

    def refresh(self) -> None:
        """Bring everything up to date before it is read (a scrape, the end of dump): the waiting
        records, then the window statistics."""
        self._apply()
        self.derived.refresh(self.series, dict(self.detectors.baselines()))

    def narrowed(self, rec: Record) -> Record:
        """The record without its keys over max_key_length, and without its keys past the first max_keys
        (both counted as dropped): a record from a huge line must not wait in a batch whole."""
        limit = self.limits.max_key_length
        keep = [i for i, k in enumerate(rec.shape) if len(k) <= limit]
        self._drop_keys("key_too_long", len(rec.shape) - len(keep))
        self._drop_keys("max_keys", len(keep) - self.limits.max_keys)
        del keep[self.limits.max_keys :]
        return rec if len(keep) == len(rec.shape) else rec.subset(keep)

    def _apply(self) -> None:
        if not self._pending:
            return
        self._history_end = self.step  # the batch's training records step up to it, at most
        batch, self._pending = self._pending, []
        shapes = rows_by_shape(batch)
        # Planned in order of first appearance, so that keys are admitted under max_keys in record order.
        plans = {shape: self._plan(shape) for shape in shapes}
        for shape, rows in shapes.items():
            for reason, n in plans[shape].dropped:
                self._drop_keys(reason, n * len(rows))
        self._pass_through(shapes, plans, batch)  # every record's keys, superseded or not: the last values logged
        if self._cut_waiting:
            self._cut_waiting = False
            batch = self._superseded_left_out(batch)
            shapes = rows_by_shape(batch)
        cols = batch_columns(batch, shapes, plans.__getitem__)
        series = self.series
        for sk, col in cols.items():
            s = series.get(sk)
            if s is None:
                s = series[sk] = Series(self.limits.history_limit)
            s.extend(col)
            if sk[0] in KEPT_INSTRUMENTS:
                t = self.trajectories.get(sk)
                if t is None:
                    t = self.trajectories[sk] = Trajectory()
                t.extend(col.finite_steps(), col.finite_values())
            if not col.all_finite:
                self.nonfinite[sk] += len(col.values) - int(np.count_nonzero(col.finite))
        self.derived.on_batch(cols, len(batch))
        self.detectors.on_batch(cols, len(batch))
        for w in self.watchers:
            w.on_batch(self, cols)

    def _plan(self, shape: Shape) -> ShapePlan:
        """Which key feeds which series, and which keys are exported, for one record shape; trainers
        repeat a few shapes, so the key table, the priorities and the limits are consulted once per
        shape, not once per record."""
        plan = self._plans.get(shape)
        if plan is None:
            plan = self._new_plan(shape)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[shape] = plan
        return plan

    def _new_plan(self, shape: Shape) -> ShapePlan:
        chosen: dict[SeriesKey, tuple[int, int]] = {}  # series -> (priority, position)
        exported: list[int] = []
        dropped: Counter[str] = Counter()
        resolve = self.keymap.resolver(shape)  # a reference-free preference record feeds no DPO instrument
        for pos, k in enumerate(shape):
            refused = self._admit(k)
            if refused is None:
                exported.append(pos)
            else:
                dropped[refused] += 1
                if refused != "max_keys":
                    continue  # a key past max_keys still feeds its canonical series
            t = resolve(k)
            if t is None or (t.label_from_key and refused is not None):
                continue  # ... but makes no label value (a reward component): their number is bounded too
            sk = (t.instrument, t.label_value)
            if sk not in chosen or t.priority < chosen[sk][0]:
                chosen[sk] = (t.priority, pos)
        return ShapePlan(tuple(chosen), tuple(pos for _, pos in chosen.values()),
                         None if len(exported) == len(shape) else tuple(exported), tuple(dropped.items()))

    def _admit(self, key: str) -> str | None:
        """Admits a key to the run's exported keys, or says why not: too long, not text a scrape can carry,
        or past max_keys distinct keys."""
        if len(key) > self.limits.max_key_length:
            return "key_too_long"
        if not key.isascii() and not _is_utf8(key):
            return "key_not_utf8"  # a lone surrogate from a JSON escape would fail every scrape
        if key not in self._admitted:
            if len(self._admitted) >= self.limits.max_keys:
                return "max_keys"
            self._admitted.add(key)
        return None

    def _pass_through(self, shapes: dict[Shape, list[int]], plans: dict[Shape, ShapePlan],
                      batch: list[Record]) -> None:
        """Every exported key's last value: the last record of each shape, in record order."""
        pt = self.passthrough
        for shape, rows in sorted(shapes.items(), key=lambda item: item[1][-1]):
            numbers, exported = batch[rows[-1]].numbers, plans[shape].exported
            if exported is None:
                pt.update(zip(shape, numbers, strict=True))
            else:
                pt.update((shape[i], numbers[i]) for i in exported)

    def _drop_keys(self, reason: str, n: int) -> None:
        if n > 0:
            self.keys_dropped[reason] += n
            self._warn_once(reason, f"dropped values of keys ({reason}: limits max_keys={self.limits.max_keys}, "
                            f"max_key_length={self.limits.max_key_length}); further ones are only counted in "
                            "posttrain_exporter_keys_dropped_total")

    def _skip_values(self, skipped: dict[str, int]) -> None:
        self.values_skipped.update(skipped)
        for reason in skipped:
            if reason not in _ROUTINE_SKIPS:
                what = ("read a record without its step, which is no non-negative integer below 2**53"
                        if reason.startswith("step_") else "skipped a value beyond a float's range")
                self._warn_once(reason, f"{what} ({reason}); further ones are only counted in "
                                "posttrain_exporter_values_skipped_total")

    def _warn_once(self, reason: str, message: str) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("run %s: %s", self.name, message)

    def _replaces_one(self, step: int) -> bool:
        """Going back to `step` supersedes one training record only, the last one, still waiting in the batch: a
        log whose step goes back and forth on every record (two writers, a record logged again). That one is left
        out of the history when the batch is applied, without a history cut; its values never reach the detectors.
        A longer stretch (a run resumed after a blow-up) is applied, judged, then cut, as logged."""
        pending, found = self._pending, 0
        for i in range(len(pending) - 1, max(len(pending) - 9, -1), -1):  # past a few evaluation records at most
            rec = pending[i]
            if rec.kind is not RecordKind.TRAIN:
                continue
            if rec.step < step:  # type: ignore[operator]
                return found == 1
            found += 1
            if found > 1:
                return False
        return found == 1 and len(pending) <= 9  # the history, before the batch, ends below `step`

    def _superseded_left_out(self, batch: list[Record]) -> list[Record]:
        """The batch less its training records that a later one in it superseded (it went back to their step or
        before: a resumed run, or two writers), as cutting the history at each would leave it; their non-finite
        values are counted still. A log whose step goes back and forth costs one pass per batch, no history cut."""
        kept: list[Record] = []
        low = math.inf  # the lowest step of the training records after this one
        for rec in reversed(batch):
            if rec.kind is RecordKind.TRAIN:
                if rec.step >= low:  # type: ignore[operator]
                    if not all(map(math.isfinite, rec.numbers)):
                        plan = self._plan(rec.shape)
                        for sk, pos in zip(plan.series, plan.positions, strict=True):
                            if not math.isfinite(rec.numbers[pos]):
                                self.nonfinite[sk] += 1
                    continue
                low = rec.step  # type: ignore[assignment]
            kept.append(rec)
        kept.reverse()
        return kept

    def _rewind(self, step: int) -> None:
        self._history_end = step - 1
        self.resets += 1
        for s in self.series.values():
            s.cut_back(step)
        for t in self.trajectories.values():
            t.cut_back(step)
        self.derived.rebuild(self.series)
        self.detectors.rebuild(self.series, step)
        for w in self.watchers:
            w.on_rewind(self, step)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
