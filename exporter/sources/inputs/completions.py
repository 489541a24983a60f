"""TRL's completions folder (sources/completions.py reads its parquet files): one sample set per logged step."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.pipeline import IngestStats, take_samples
from exporter.runstate import RunState
from exporter.samples.sampleset import SampleSet
from exporter.sources.completions import FORMAT as PARQUET_FORMAT
from exporter.sources.completions import CompletionsReader
from exporter.sources.inputs.records import RunInput


class CompletionsInput(RunInput):
    """TRL's completions folder: each new parquet file is one logged step's sample set, handed to the run as the
    console's printed panels are (pipeline.take_samples); a file that never parses is counted, the next one read."""

    def __init__(self, spec: LogSpec, run: RunState, stats: IngestStats) -> None:
        super().__init__(spec, run, stats, CompletionsReader(spec.path))
        self._sets: list[SampleSet] = []

    @property
    def catching_up(self) -> bool:
        return self.reader.behind

    @property
    def drained(self) -> bool:
        return not self.reader.pending

    def read(self, timeout: float = 0.0) -> None:
        self._sets += self.reader.poll()

    def ingest(self) -> bool:
        sets, self._sets = self._sets, []
        for reason, name in self.reader.errors:
            self.stats.error(self.run.name, PARQUET_FORMAT, reason, 1, "%s/%s skipped (%s)", self.spec.path, name,
                             reason)
        self.reader.errors.clear()
        self._hand_over(PARQUET_FORMAT, [])
        for s in sets:
            take_samples(self.run, self.stats, s)
        return bool(sets)
