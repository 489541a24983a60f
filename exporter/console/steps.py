"""Which training step a console record belongs to.

The record's own step wins when its format carries one. HF Trainer's console lines carry none,
only `epoch`; but tqdm prints them through `tqdm.write`, which clears the bar, prints the line
and redraws the bar. The redraw after a clear shows the step the line was logged at, also when
stdout is block-buffered and the lines arrive many bar updates late: each clear-redraw pair is
queued, and records take the queued steps in order. A stream with no bars numbers its records
by ordinal.

A clear whose redraw never comes (a line of spaces that only looks like one) must not hold the
records after it: a clear before any bar draw is none, and once more records wait for one redraw
than a stdout block can hold, they take their fallback steps (the console stream also lets them go
after a few seconds).
"""

from __future__ import annotations

from collections import deque

from exporter.parsers.record import Record, RecordKind

_NONE: list[Record] = []  # returned, never changed: most bar draws release nothing
_MAX_QUEUED = 4096  # a stderr-only stream queues redraws that no record will take
_MAX_WAITING = 256  # records after a clear waiting for its redraw; an 8 KB stdout block holds fewer


class StepClock:
    def __init__(self) -> None:
        self._redraws: deque[int] = deque(maxlen=_MAX_QUEUED)
        self._pending: deque[Record] = deque()
        self._cleared = False  # a clear was seen and its redraw has not come yet
        self._bar: int | None = None
        self.last_step = 0

    def bar(self, n: int) -> list[Record]:
        self._bar = n
        if self._cleared:
            self._redraws.append(n)
            self._cleared = False
            return self._release()
        return self._release() if self._pending else _NONE

    def clear(self) -> None:
        if self._bar is not None:  # no bar was ever drawn: this is no tqdm clear
            self._cleared = True

    @property
    def waiting(self) -> bool:
        """Records are held for a progress-bar redraw."""
        return bool(self._pending)

    def record(self, rec: Record) -> list[Record]:
        if rec.step is not None:
            self.last_step = rec.step
            return [rec]
        self._pending.append(rec)
        if self._cleared and not self._redraws:
            if len(self._pending) <= _MAX_WAITING:
                return []  # unbuffered: the redraw that follows this line carries its step
            self._cleared = False  # no redraw is coming
        return self._release()

    def _release(self) -> list[Record]:
        out: list[Record] = []
        while self._pending and self._redraws:
            rec = self._pending.popleft()
            rec.step = self._redraws.popleft()
            self.last_step = rec.step
            out.append(rec)
        if self._pending and not self._cleared:
            out.extend(self.flush())  # no redraw is coming: ordinal
        return out

    def flush(self) -> list[Record]:
        """Input ended or went quiet: records still waiting get the bar's step or the next ordinal."""
        out: list[Record] = []
        while self._pending:
            rec = self._pending.popleft()
            if rec.kind is not RecordKind.TRAIN:
                rec.step = self.last_step  # eval and summary lines belong to the last training step
            elif self._bar is not None and self._bar > self.last_step:
                rec.step = self._bar
            else:
                rec.step = self.last_step + 1
            self.last_step = rec.step
            out.append(rec)
        self._cleared = False
        return out
