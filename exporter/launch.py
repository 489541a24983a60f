"""`posttrain-exporter run --log FEED -- python train.py`: the trainer's console and the TRL callback's feed are two
records of one training, and make one run, not two that each alert.

`run` gives its trainer a token in the environment (LAUNCH_ENV); the callback repeats it in the identity line that
heads each training in its feed (exporter/parsers/training.py). A log of `run` whose training line carries the
token is that trainer's feed: from that line on its records go to the trainer's run, whose console records are
then left out (the feed's are exact, the console's steps may be guessed), and the log's own run, which held only
earlier trainings, is dropped. A log that never carries the token keeps its own run, as before."""

from __future__ import annotations

import operator
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.parsers.record import Record, RecordKind
from exporter.parsers.training import TrainingStart
from exporter.runstate import RunState
from exporter.samples.diversity import FORMAT as SAMPLES_FORMAT

_KIND = operator.attrgetter("kind")


@dataclass(frozen=True)
class Launch:
    """The trainer `run` started: its run and the token its feed will carry."""

    run: str
    token: str = field(default_factory=lambda: secrets.token_hex(8))

    def owns(self, rec: Record) -> bool:
        return isinstance(rec, TrainingStart) and rec.training.launch == self.token


class ConsoleBesideFeed:
    """The trainer's console run: records reach it until its feed has begun a training of this launch."""

    def __init__(self, run: RunState, launch: Launch) -> None:
        self.target, self.launch = run, launch

    @property
    def name(self) -> str:
        return self.target.name

    def _fed(self) -> bool:
        training = self.target.training
        return training is not None and training.launch == self.launch.token

    def ingest(self, rec: Record) -> None:
        # the feed carries the trainer's metrics, never what the console alone shows (the printed completions)
        if not self._fed() or rec.fmt == SAMPLES_FORMAT:
            self.target.ingest(rec)

    def ingest_many(self, recs: list[Record]) -> None:
        if not self._fed():
            self.target.ingest_many(recs)
        else:
            for rec in recs:
                self.ingest(rec)

    def narrowed(self, rec: Record) -> Record:
        return self.target.narrowed(rec)

    def __getattr__(self, name: str):
        """Everything else the stream reads of its run (its counters, its sample store) is the run's own."""
        return getattr(self.target, name)


class MaybeFeed:
    """A console log of `run`: its own run until a training line of this launch comes, the trainer's run from it."""

    def __init__(self, own: RunState, trainer: Callable[[], RunState], launch: Launch,
                 merged: Callable[[RunState], None]) -> None:
        self.target, self.launch = own, launch
        self._trainer, self._merged = trainer, merged
        self._own: RunState | None = own

    @property
    def name(self) -> str:
        return self.target.name

    def ingest(self, rec: Record) -> None:
        if self._own is not None and self.launch.owns(rec):
            self.target = self._trainer()
            self._merged(self._own)
            self._own = None
        self.target.ingest(rec)

    def ingest_many(self, recs: list[Record]) -> None:
        if self._own is None or RecordKind.TRAINING not in set(map(_KIND, recs)):
            self.target.ingest_many(recs)
            return
        start = 0
        for i, rec in enumerate(recs):
            if rec.kind is RecordKind.TRAINING:
                self.target.ingest_many(recs[start:i])
                self.ingest(rec)
                start = i + 1
        self.target.ingest_many(recs[start:])

    def __getattr__(self, name: str):
        """Everything else the stream reads of its run (its counters, its sample store): the current target's."""
        return getattr(self.target, name)

    def narrowed(self, rec: Record) -> Record:
        return self.target.narrowed(rec)
