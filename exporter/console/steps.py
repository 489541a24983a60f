"""Which training step a console record belongs to.

The record's own step wins when its format carries one. HF Trainer's console lines carry none,
only `epoch`; but tqdm prints them through `tqdm.write`, which clears the bar, prints the line
and redraws the bar. The redraw after a clear shows the step the line was logged at, also when
stdout is block-buffered and the lines arrive many bar updates late: each clear-redraw pair is
queued, and records take the queued steps in order. A stream with no training bar numbers its
records by ordinal.

Only the training bar gives steps. It has no description (`Loading checkpoint shards: 100%|` and
`Map: 100%|` have one; the framer leaves out nested bars such as evaluation's), and its total is the
run's max steps: the first such bar sets the total, and a bar of another total is another bar (an
evaluation's, a prediction's), unless it starts (at 0) once the last one ran to its end or gave no record a
step (a new `trainer.train()`). A new training in the same stream before the last bar ended (a trainer that
died, restarted with another max_steps) is told apart by what only a training bar shows: the Trainer's
`Total optimization steps = N` read since the training bar was taken, and a bar of N from 0; or a training
record printed through tqdm.write whose redraw is the other bar's (it started at 0). Its records then take its
steps (a step that goes back is a resume, by the run state's rules). A bar from 0 left out while training
records take fallback steps is counted (`refused_bar`): their steps may be another training's.

A clear whose redraw never comes (a line of spaces that only looks like one) must not hold the
records after it: a clear before any bar draw is none, and once more records wait for one redraw
than a stdout block can hold, they take their fallback steps (the console stream also lets them go
after a few seconds).

A training record that takes a fallback step (no redraw of the training bar gave it one) is checked
against its `epoch` (EpochCheck); one that disagrees is counted, never changed.

A log without a usable bar often states its scale (StatedScale): the Trainer's `Total optimization steps`
and `Num Epochs`, or `Num examples` and the total batch size, give the steps per epoch, and a record's epoch
times that is its step (snapped to the logging interval once two records show it); a DeepSpeed
`global_stepN` checkpoint line says N steps are done, and the records after it continue from N at the interval
the records before it show. Only when the log states nothing is a record's step the next ordinal. Each record
without its own step is counted by where its step came from (`sources`).
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from collections.abc import Callable

from exporter.parsers.record import Record, RecordKind

_NONE: list[Record] = []  # returned, never changed: most bar draws release nothing
# Where a record was lost to a cut line (a metric line whose rest never came), in the records waiting for redraws:
# it takes the redraw its record would have taken, so that the records after it keep theirs.
_LOST = Record({}, "lost")
_TRAINERS = (RecordKind.TRAIN, RecordKind.SUMMARY)  # the trainer's own records (waiting_records)
_MAX_QUEUED = 4096  # a stderr-only stream queues redraws that no record will take
_MAX_WAITING = 256  # records after a clear waiting for its redraw; an 8 KB stdout block holds fewer


class EpochCheck:
    """Does a training record's step agree with its `epoch`?

    The Trainer's epoch grows in proportion to the step (steps per epoch, give or take one step at each
    epoch boundary under gradient accumulation), so a run's records share one steps-per-epoch ratio. Each
    record bounds it, allowing for how its epoch was printed (2 decimals, or 4 significant digits); the
    bounds of the records so far are intersected, and a record whose bounds miss them disagrees (and is left
    out). A step that goes back (a resumed run) starts over. Once the bounds are within 5% of each other,
    a record whose step / epoch falls inside them agrees without more arithmetic (the hot path)."""

    __slots__ = ("_high", "_last_step", "_low", "_tight")

    def __init__(self) -> None:
        self._restart()
        self._last_step = -1

    def _restart(self) -> None:
        self._low, self._high = 0.0, math.inf
        self._tight = -math.inf  # _high once the bounds are within 5%: a step / epoch from _low to it agrees

    def disagrees(self, rec: Record) -> bool:
        shape = rec.shape
        if shape and shape[-1] == "epoch":  # the Trainer adds it last
            epoch = rec.numbers[-1]
        elif "epoch" in shape:
            epoch = rec.numbers[shape.index("epoch")]
        else:
            return False
        step = rec.step or 0
        if step < self._last_step:
            self._restart()
        self._last_step = step
        if not 0.0 < epoch < 1e9:  # NaN too
            return False
        if self._low <= step / epoch <= self._tight:
            return False
        return self._narrow(step, epoch)

    def _narrow(self, step: int, epoch: float) -> bool:
        """The record's own bounds: missing the run's, it disagrees; else the run's are narrowed to them."""
        rounding = max(0.005, 5e-4 * epoch)
        slack = 1 + int(epoch)
        low = max(step - slack, 0) / (epoch + rounding)
        high = (step + slack) / (epoch - rounding) if epoch > rounding else math.inf
        if high < self._low or low > self._high:
            return True
        self._low, self._high = max(self._low, low), min(self._high, high)
        if self._high <= 1.05 * self._low:
            self._tight = self._high
        return False


# `  Total optimization steps = 1,170` and the other facts the Trainer prints when training starts (any prefix).
_TOTAL_STEPS = "Total optimization steps"
_STATED = re.compile(r"\b(Total optimization steps|Num Epochs|Num examples|Total train batch size)\b[^=\n]{0,60}+="
                     r"\s*+([\d,]{1,20}+)")
_GLOBAL_STEP = re.compile(r"\bglobal_step(\d{1,15}+)\b")
STEP_SOURCES = ("bar", "bar_count", "epoch", "checkpoint", "ordinal")  # where a record's step came from


class StatedScale:
    """What a log says of its run's scale, read from its lines that are no record."""

    __slots__ = ("_facts", "checkpoint", "checkpoint_records", "per_epoch", "total_steps")

    def __init__(self) -> None:
        self._facts: dict[str, int] = {}
        self.per_epoch: float | None = None  # training steps per epoch
        self.checkpoint: int | None = None  # the step of the last `global_stepN` line
        self.checkpoint_records = 0  # training records since the line before it (or the start)
        self.total_steps: int | None = None  # the last `Total optimization steps` not yet matched by a training bar

    def read(self, line: str) -> bool:
        """Takes what `line` states; True when it stated a checkpoint's step."""
        if "=" in line:
            m = _STATED.search(line)
            if m is not None:
                value = int(m.group(2).replace(",", "") or 0)
                if value > 0:
                    self._facts[m.group(1)] = value
                    if m.group(1) == _TOTAL_STEPS:
                        self.total_steps = value
                    if m.group(1) != "Num examples":  # an evaluation prints its own, with no train batch size
                        self._per_epoch()
        if "global_step" in line:
            m = _GLOBAL_STEP.search(line)
            if m is not None:
                self.checkpoint = int(m.group(1))
                return True
        return False

    def _per_epoch(self) -> None:
        """Total steps over epochs is exact unless max_steps was set (the epochs are then rounded up): the examples
        over the total batch size (one step off per epoch under accumulation) tell the two apart."""
        facts = self._facts
        by_steps = by_examples = None
        if _TOTAL_STEPS in facts and "Num Epochs" in facts:
            by_steps = facts[_TOTAL_STEPS] / facts["Num Epochs"]
        if "Num examples" in facts and "Total train batch size" in facts:
            by_examples = float(math.ceil(facts["Num examples"] / facts["Total train batch size"]))
        if by_steps is not None and (by_examples is None or abs(by_steps - by_examples) <= 0.1 * by_examples):
            self.per_epoch = by_steps
        elif by_examples is not None:
            self.per_epoch = by_examples


class StepClock:
    def __init__(self, disagreements: Counter[str] | None = None,
                 refused: Callable[[str, str, int], None] | None = None) -> None:
        self._redraws: deque[int] = deque(maxlen=_MAX_QUEUED)
        self._pending: deque[Record] = deque()
        self._cleared = False  # a clear was seen and its redraw has not come yet
        self._bar: int | None = None  # the training bar's last count
        self._total: str | None = None  # the training bar's total as printed: the run's max steps
        self._bar_used = False  # a record took a step from the training bar
        self._epochs = EpochCheck()
        self._exact: tuple[int, float] | None = None  # (step, epoch) of the last record a redraw gave its step
        self._interval = 0  # steps between the last two such records: the logging interval
        self._guessed: Record | None = None  # the last record that took a fallback step while its redraw was due
        self.scale = StatedScale()
        self._stated_interval = 0  # the logging interval that the log's stated facts show (0: not known yet)
        self._since_checkpoint = 0  # training records since the last global_step line (or the start)
        self._checkpoint_base: int | None = None  # step of the last global_step line, while records continue it
        self.sources: Counter[str] = Counter()  # records without their own step, by where their step came from
        self._just_cleared = False  # the last thing seen was a clear (no draw, record or line since)
        self._block_buffered = False  # a record came after its redraw: stdout reaches the stream in blocks
        self._exact_epoch_step: int | None = None  # the last step read exactly off an epoch (for the interval)
        self.disagreements: Counter[str] = Counter() if disagreements is None else disagreements  # by reason
        self.last_step = 0
        # A description-less bar of another total drawn from 0 and left out, since the training bar last drew: a new
        # training's bar, or an evaluation's (None: none, or the training bar drew since)
        self._candidate: str | None = None
        self._candidate_counted = False  # a training record took a fallback step while it was left out (counted)
        self._candidate_before = False  # it began, and has drawn since, with no record waiting for a redraw
        self.refused = refused  # told when that is counted (_refused_bar)

    @property
    def bar_count(self) -> int | None:
        """The training bar's last count (None before its first draw)."""
        return self._bar

    def bar(self, n: int, total: str, description: str | None = None) -> list[Record]:
        """A bar draw (sink.bar of console/framing.py); the records it releases."""
        if description is not None and description.strip():
            return _NONE  # a loading or processing bar
        if total != self._total and not self._new_training_bar(n, total):
            return _NONE
        self._bar, self._just_cleared, self._candidate = n, False, None
        if self._guessed is not None:
            self._late_redraw(n)
        if self._cleared:
            self._redraws.append(n)
            self._cleared = False
            return self._release()
        return self._release() if self._pending else _NONE

    def _late_redraw(self, n: int) -> None:
        """The first training-bar draw after records took fallback steps while a redraw was due: it is that redraw.
        It shows the step the last of them was logged at; another one is counted."""
        guessed, self._guessed = self._guessed, None
        if guessed.kind is RecordKind.TRAIN and guessed.step != n:  # type: ignore[union-attr]
            self.disagreements["late_redraw"] += 1

    def _new_training_bar(self, n: int, total: str) -> bool:
        """A description-less bar of another total is the training bar when none was seen yet, or when it
        starts once the last one ran to its end or gave no record a step (a new `trainer.train()`). Before that, an
        evaluation's bar looks the same; a new training's (the trainer died and was started again with another
        max_steps) is told by the total the Trainer stated for it, or by a training record whose redraw it is."""
        last = self._total
        if last is None or (n == 0 and (not self._bar_used or (self._bar or 0) >= int(last))):
            self._total, self._bar_used, self.scale.total_steps = total, False, None
            return True
        if n == 0 and self.scale.total_steps is not None and total.isdigit() and int(total) == self.scale.total_steps:
            # `Total optimization steps = N` since the training bar was taken, then a bar of N from 0: a new
            # training. Records still waiting for the old bar's redraw will not get it: they take fallback steps.
            self._cleared = False
            self._restart(total)
            return True
        if total == self._candidate:
            if self._candidate_before and self._cleared and not self._redraws and not self._block_buffered \
                    and len(self._pending) == 1 and self._pending[0].kind is RecordKind.TRAIN:
                # The bar drawn, tqdm.write's clear, a training record, then the bar's draw: the record's redraw, so
                # the bar the trainer writes through (an evaluation's bar is gone before the records after it are
                # printed). Only where each record is followed by its redraw at once (unbuffered): a bar that began
                # while the record waited is drawn between it and its redraw, and block-buffered records come late.
                self._restart(total)
                return True
            if self._pending:
                self._candidate_before = False
        else:
            self._candidate, self._candidate_counted = (total if n == 0 else None), False
            self._candidate_before = not self._pending
        return False

    def _restart(self, total: str) -> None:
        """A new training's bar replaces one that had not ended: what was learnt of the last one's steps goes."""
        self._total, self._bar_used, self.scale.total_steps = total, False, None
        self._guessed, self._exact, self._interval = None, None, 0

    def clear(self) -> None:
        if self._bar is not None:  # no training bar was ever drawn: this is no tqdm clear
            self._cleared = self._just_cleared = True

    def text_line(self) -> None:
        """A line that is no record. Printed through tqdm.write (a message, a table), it has a clear and a redraw
        like a record's, and no record may take that redraw. Directly after a clear, with nothing waiting and no
        redraw queued, on a stream that has shown no block buffering (where stdout lines come long after their
        clears), the redraw that follows is this line's: it is not queued, and the judgment is counted."""
        if self._just_cleared and self._cleared and not self._pending and not self._redraws \
                and not self._block_buffered:
            self._cleared = False
            self.disagreements["stale_redraw"] += 1
        self._just_cleared = False

    @property
    def waiting(self) -> bool:
        """Records are held for a progress-bar redraw."""
        return bool(self._pending)

    def waiting_records(self) -> int:
        """Training and summary records held for a redraw (the trainer's own records on their way to the run)."""
        return sum(1 for rec in self._pending if rec is not _LOST and rec.kind in _TRAINERS)

    def record(self, rec: Record) -> list[Record]:
        if rec.step is not None:
            self.last_step = rec.step
            return [rec]
        self._just_cleared = False
        if len(self._redraws) > 1:
            self._block_buffered = True  # its redraw and a later one came before it: stdout comes in blocks
        self._pending.append(rec)
        if self._cleared and not self._redraws:
            if len(self._pending) <= _MAX_WAITING:
                return []  # unbuffered: the redraw that follows this line carries its step
            self._cleared = False  # no redraw is coming
        return self._release()

    def ordinal(self, rec: Record) -> bool:
        """record(rec) for a record without its step on a stream that never drew a training bar, when nothing
        waits: it takes its step at once (the next ordinal; eval and summary records the last step), as
        record() would give it. False (nothing done) otherwise."""
        if self._bar is not None or self._pending or self._cleared or self._redraws:
            return False
        if rec.kind is not RecordKind.TRAIN:
            rec.step = self.last_step
        elif self.scale.per_epoch is None and not self._stated_interval:  # nothing stated: _fallback's ordinal
            self._since_checkpoint += 1
            self.sources["ordinal"] += 1
            self._step(rec, self.last_step + 1)
        else:
            self._step(rec, self._fallback(rec))
        return True

    def stated(self, line: str) -> None:
        """A line that is no record: what it states of the run's scale. A `global_stepN` line: N steps are done;
        the records before it show the logging interval (N over their number, since the last such line)."""
        if not self.scale.read(line):
            return
        step = self.scale.checkpoint or 0
        base = self._checkpoint_base or 0
        if self._since_checkpoint and step > base and (step - base) % self._since_checkpoint == 0:
            self._stated_interval = (step - base) // self._since_checkpoint
        self._checkpoint_base, self._since_checkpoint = step, 0

    def _fallback(self, rec: Record) -> int:
        """The step of a training record that no bar gave one: from what the log stated (its epoch times the
        steps per epoch, or on from a checkpoint's step), else the next ordinal. Never back from the last."""
        self._since_checkpoint += 1
        last, interval = self.last_step, self._stated_interval
        per_epoch = self.scale.per_epoch
        if per_epoch is not None:
            epoch = _epoch_of(rec)
            if epoch is not None and epoch > 0:
                estimate = epoch * per_epoch
                resolution = max(0.005, 5e-4 * epoch) * per_epoch  # how the epoch was printed, in steps
                step = 0
                if interval and resolution < interval / 2:
                    step = round(estimate / interval) * interval
                elif resolution <= 0.5:
                    step = round(estimate)
                if step > last:
                    if resolution <= 0.5 and self._exact_epoch_step is not None and step > self._exact_epoch_step:
                        self._stated_interval = step - self._exact_epoch_step
                    self._exact_epoch_step = step if resolution <= 0.5 else None
                    self.sources["epoch"] += 1
                    return step
        if self._checkpoint_base is not None and interval:
            self.sources["checkpoint"] += 1
            return max(last, self._checkpoint_base) + interval
        self.sources["ordinal"] += 1
        return last + 1

    def takes_redraws(self, total: str) -> bool:
        """redrawn() covers the clock's state: the bar of `total` is the training bar, no redraw is queued, and at
        most one record waits, after a clear (for the next draw)."""
        return total == self._total and not self._redraws and (
            not self._pending or (len(self._pending) == 1 and self._cleared and self._pending[0] is not _LOST))

    def redrawn(self, total: str, counts: list[int], last_count: int, recs: list[Record]) -> list[Record]:
        """For each i: bar(counts[i], total), further draws of the bar ending at `last_count`, clear(), then
        record(recs[i]) of a record without its step (tqdm.write's lines in a combined stream), when
        takes_redraws(total); the records released, as bar() and record() would release them."""
        pending = self._pending
        if pending:
            out = [pending.popleft(), *recs[:-1]]  # each record takes the next line's first draw
            pending.append(recs[-1])
        elif self._cleared:  # a redraw came when no record waited: each record takes its own line's first draw
            out = recs
        else:  # no clear before the first line: its draws release nothing
            out, counts = recs[:-1], counts[1:]
            pending.append(recs[-1])
        for rec, count in zip(out, counts, strict=True):
            rec.step = count
        if out:
            self.last_step = counts[-1]
            self._bar_used = True
            self._note_exact_run(out)
            self.sources["bar"] += len(out)
        self._bar, self._candidate = last_count, None
        self._cleared, self._just_cleared = True, False
        return out

    def lost(self) -> None:
        """A record was lost to a cut line where it stood among the records waiting for redraws: it takes the
        redraw it would have taken (the records after it keep theirs). Whether the cut text was a record at all is
        a guess, counted: when the next record's epoch says that redraw is its own (_fits), it is given back."""
        self._pending.append(_LOST)  # released with the record after it (the line that abandoned the cut one)
        self.disagreements["cut_line"] += 1

    def _release(self) -> list[Record]:
        out: list[Record] = []
        while self._pending and self._redraws:
            rec = self._pending.popleft()
            if rec is _LOST:
                if not self._pending:  # the record after it decides: it comes with the line that abandoned it
                    self._pending.appendleft(rec)
                    break
                if not self._fits(self._pending[0], self._redraws[0]):
                    self._redraws.popleft()  # the lost record's redraw
                continue
            redraws = self._redraws
            if self._stale(rec, redraws):
                redraws.popleft()  # a line that is no record took it (tqdm.write of a message): the epoch says so
                self.disagreements["stale_redraw"] += 1
                if not redraws:  # its own comes after the clear
                    self._pending.appendleft(rec)
                    break
            rec.step = self.last_step = redraws.popleft()  # read off the training bar: exact
            self._note_exact(rec)
            out.append(rec)
        if out:
            self._bar_used = True
            self.sources["bar"] += len(out)
        if self._pending and not self._cleared:
            out.extend(self.flush())  # no redraw is coming: ordinal
        return out

    def _expected(self, rec: Record) -> tuple[float, float] | None:
        """The step `rec`'s epoch puts it at, on from the last record a redraw gave its step at that record's steps
        per epoch, and how far that may be off (both epochs as printed, the steps per epoch taken from one printed
        epoch, a step at an epoch's boundary); None when it cannot be told within half the logging interval (no
        epoch, no such record, too coarse an epoch)."""
        epoch = _epoch_of(rec)
        if epoch is None or self._exact is None or not epoch > 0:
            return None
        at, at_epoch = self._exact
        per_epoch, at_rounding = at / at_epoch, max(0.005, 5e-4 * at_epoch)
        drift = abs(epoch - at_epoch) * at_rounding / at_epoch  # the steps per epoch's own error, carried on
        error = 1 + per_epoch * (max(0.005, 5e-4 * epoch) + at_rounding + drift)
        return (at + (epoch - at_epoch) * per_epoch, error) if 2 * error < self._interval else None

    def _fits(self, rec: Record, step: int) -> bool:
        """Does `step` fit `rec`'s epoch (_expected), within half the logging interval?"""
        expected = self._expected(rec)
        return expected is not None and abs(step - expected[0]) < self._interval / 2

    def _stale(self, rec: Record, redraws: deque[int]) -> bool:
        """Is the first queued redraw, by `rec`'s epoch, not `rec`'s but that of a line before it which is no record
        (tqdm.write of a message, in a block-buffered stream)? So when it is further from the epoch's step than the
        estimate may be off and the next queued redraw is closer."""
        if not self._block_buffered:  # unbuffered, a message's redraw is left out as it comes (text_line)
            return False
        estimate = self._expected(rec)
        if estimate is None:
            return False
        (expected, error), first = estimate, redraws[0]
        # (With one queued, a record's own redraw after a clear that no line took looks the same: not judged.)
        return len(redraws) > 1 and abs(first - expected) > error and abs(redraws[1] - expected) < abs(first - expected)

    def _note_exact_run(self, recs: list[Record]) -> None:
        """_note_exact for each of `recs` in turn, in the time of the last few: what it leaves (the last record and
        the last rise of the step between two records it takes) is found from the end."""
        noted: list[Record] = []  # from the end: the records _note_exact takes
        for rec in reversed(recs):
            if rec.kind is RecordKind.TRAIN:
                epoch = _epoch_of(rec)
                if epoch is not None and epoch > 0:
                    noted.append(rec)
                    if len(noted) > 1 and (noted[-1].step or 0) < (noted[-2].step or 0):
                        break  # the last rise: what came before it changes nothing that stays
        for rec in reversed(noted):
            self._note_exact(rec)

    def _note_exact(self, rec: Record) -> None:
        epoch = _epoch_of(rec)
        if epoch is not None and epoch > 0 and rec.kind is RecordKind.TRAIN:
            step = rec.step or 0
            if self._exact is not None and step > self._exact[0]:
                self._interval = step - self._exact[0]
            self._exact = (step, epoch)

    def flush(self) -> list[Record]:
        """Input ended or went quiet: records still waiting get the bar's step or the next ordinal. When they
        waited for the redraw after a clear and it comes after all (the stream paused between a line and its
        redraw), a redraw that shows another step than the last one's is counted (late_redraw)."""
        out: list[Record] = []
        if not self._pending:
            return out  # a clear whose line has not come yet stays a clear: its redraw gives that line its step
        while self._pending:
            rec = self._pending.popleft()
            if rec is _LOST:
                continue
            if rec.kind is not RecordKind.TRAIN:
                rec.step = self.last_step  # eval and summary lines belong to the last training step
                out.append(rec)
                continue
            if self._candidate is not None and not self._candidate_counted:
                self._refused_bar()
            if self._bar is not None and self._bar > self.last_step:
                self._step(rec, self._bar)
                self._bar_used = True
                self.sources["bar_count"] += 1
            else:
                self._step(rec, self._fallback(rec))
            out.append(rec)
        if self._cleared and out:
            self._guessed = out[-1]
        self._cleared = False
        return out

    def _refused_bar(self) -> None:
        """A training record takes a fallback step while a bar from 0 of another total was left out: if that is a new
        training's bar (one whose total no `Total optimization steps` line stated), its steps are guesses. `refused`
        is told the bar's total, the training bar's and the last step given before it."""
        self._candidate_counted = True
        self.disagreements["refused_bar"] += 1
        if self.refused is not None:
            self.refused(self._candidate or "", self._total or "", self.last_step)

    def _step(self, rec: Record, step: int) -> None:
        """A training record's fallback step: checked against its epoch."""
        rec.step = self.last_step = step
        if self._epochs.disagrees(rec):
            self.disagreements["epoch"] += 1


def _epoch_of(rec: Record) -> float | None:
    shape = rec.shape
    if shape and shape[-1] == "epoch":  # the Trainer adds it last
        return rec.numbers[-1]
    return rec.numbers[shape.index("epoch")] if "epoch" in shape else None
