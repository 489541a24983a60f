"""A Trainer's trainer_state.json (sources/trainer_state.py reads it): its log_history as records, errors counted."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.parsers.checkpoints import CheckpointEvent
from exporter.parsers.record import Record
from exporter.pipeline import IngestStats
from exporter.runstate import RunState
from exporter.sources.inputs.records import RunInput
from exporter.sources.trainer_state import TrainerStateReader, checkpoints_in


class TrainerStateInput(RunInput):
    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, TrainerStateReader(spec.path))
        self._records: list[Record] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind  # a huge history is read a piece per poll

    def read(self, timeout: float = 0.0) -> None:
        self._records += self.reader.poll()

    def ingest(self) -> bool:
        records, self._records = self._records, []
        self.stats.lines_dropped.update(self.reader.dropped)
        self.reader.dropped.clear()
        for reason, n in self.reader.entry_errors.items():
            self._error(reason, n)
        self.reader.entry_errors.clear()
        self.follow.truncations = self.reader.rewrites  # a history rewritten under us, read again where it differs
        self._hand_over("trainer_state", records)
        if records:  # the checkpoints on disk beside it: the one to keep must be among them
            self._on_disk(checkpoints_in(self.reader.output_dir()))
        return bool(records)

    def _on_disk(self, found: list[tuple[int, str]]) -> None:
        there = {step for step, _ in found}
        self.run.checkpoints.listed = True
        for step, path in found:
            self.run.saved(CheckpointEvent(step, path, False))
        for step in [s for s in self.run.checkpoints.saved if s not in there]:
            self.run.saved(CheckpointEvent(step, self.run.checkpoints.saved[step], True))  # gone from disk

    def _error(self, reason: str, n: int) -> None:
        self.stats.error(self.run.name, "trainer_state", reason, n, "skipped %s or entries of its log_history (%s)",
                         self.spec.path, reason)
