"""A Trainer's TensorBoard event files (sources/tensorboard.py reads them)."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.parsers.record import Record
from exporter.pipeline import IngestStats
from exporter.runstate import RunState
from exporter.sources.inputs.records import RunInput
from exporter.sources.tensorboard import FMT as TB_FORMAT
from exporter.sources.tensorboard import TensorBoardReader


class TensorBoardInput(RunInput):
    """A Trainer's TensorBoard event files: scalars with their exact steps. The writer flushes every couple of
    minutes, so a step's scalars are ingested once a later step appears or the files stop growing."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, TensorBoardReader(spec.path))
        self._records: list[Record] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind  # event files are read in bounded pieces

    def read(self, timeout: float = 0.0) -> None:
        self._records += self.reader.poll()
        if not self.reader.grew:
            self._records += self.reader.finish()

    def ingest(self) -> bool:
        records, self._records = self._records, []
        self._ingest(records)
        return bool(records)

    def finish(self) -> None:
        self._ingest(self.reader.finish())

    def _ingest(self, records: list[Record]) -> None:
        for reason, n in self.reader.errors.items():
            self.stats.error(self.run.name, TB_FORMAT, reason, n, "%s: event records skipped (%s)", self.spec.path,
                             reason)
        self.reader.errors.clear()
        self.stats.lines_dropped.update(self.reader.dropped)
        self.reader.dropped.clear()
        self._hand_over(TB_FORMAT, records)
