"""The console stream's tap for samples: every line no metric parser took goes through the trainers' sample readers;
a complete set comes back once (TRL prints the last step's panel again after its end-of-training summary)."""

from __future__ import annotations

from collections import Counter

from exporter.samples.panels import DROP_REASONS as PANEL_DROP_REASONS
from exporter.samples.panels import PanelError, PanelReader
from exporter.samples.sampleset import SampleSet
from exporter.samples.verl import DROP_REASONS as VERL_DROP_REASONS
from exporter.samples.verl import VerlSampleReader

# What the sample readers leave out, by reason (posttrain_exporter_lines_dropped_total)
DROP_REASONS = PANEL_DROP_REASONS + VERL_DROP_REASONS


class SampleReader:
    def __init__(self, dropped: Counter[str] | None = None) -> None:
        """`dropped`: where the lines the readers leave out are counted, by reason (the run's lines_dropped)."""
        self.dropped: Counter[str] = Counter() if dropped is None else dropped
        self.panels = PanelReader(self.dropped)
        self.verl = VerlSampleReader(self.dropped)
        self._last: SampleSet | None = None
        self.repeats = 0  # sets read again and left out (the repeated last panel)

    @property
    def waiting(self) -> bool:
        """verl samples wait for their step's metric line (`close`)."""
        return self.verl.pending

    def line(self, text: str) -> SampleSet | None:
        """A line no metric parser took. Raises PanelError for a panel that does not read."""
        if self.panels.open or "╭" in text:
            return self._fresh(self.panels.line(text))
        if "[" in text:
            self.verl.line(text)
        elif self.verl.pending:
            self.verl.line(text)  # a continued prompt or response
        return None

    def close(self, step: int) -> SampleSet | None:
        """A metric line of `step` arrived: the verl samples read before it are its set."""
        return self._fresh(self.verl.close(step)) if self.verl.pending else None

    def finish(self) -> None:
        """End of input: a panel or samples left open are counted as dropped."""
        self.panels.finish()
        self.verl.finish()

    def _fresh(self, s: SampleSet | None) -> SampleSet | None:
        if s is None:
            return None
        last = self._last
        if last is not None and s.step == last.step:
            self.repeats += 1
            return None  # one set per step: the panel printed again after the summary, or a step's second print
        self._last = s
        return s


__all__ = ["DROP_REASONS", "PanelError", "SampleReader"]
