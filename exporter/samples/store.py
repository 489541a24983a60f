"""A run's completions as a person reads them: a few rows of each step's set, for the report. Bounded: the latest
`steps` sets (the report shows the best step, the first step of each finding and the end; an older step shows its
nearest kept set), each at most ROWS_KEPT rows, each text cut at TEXT_KEPT characters. Nothing here reaches /metrics."""

from __future__ import annotations

from collections import Counter, OrderedDict

from exporter.samples.sampleset import Sample, SampleSet, normal

ROWS_KEPT = 4
TEXT_KEPT = 400
STEPS_KEPT = 2048


class SampleStore:
    def __init__(self, steps: int = STEPS_KEPT) -> None:
        self.steps = steps
        self.sets: OrderedDict[int, SampleSet] = OrderedDict()  # step -> its kept rows
        self.total_sets = 0

    def add(self, s: SampleSet) -> None:
        self.total_sets += 1
        rows = _spread(s.samples)
        self.sets[s.step] = SampleSet(s.step, s.source, tuple(
            Sample(x.prompt[:TEXT_KEPT], x.completion[:TEXT_KEPT], x.rewards, x.advantage) for x in rows))
        self.sets.move_to_end(s.step)
        while len(self.sets) > self.steps:
            self.sets.popitem(last=False)

    def at(self, step: int) -> SampleSet | None:
        """The kept set at `step`, or the nearest one before it (else after it)."""
        if not self.sets:
            return None
        if step in self.sets:
            return self.sets[step]
        before = [k for k in self.sets if k <= step]
        return self.sets[max(before)] if before else self.sets[min(self.sets)]


def _spread(samples: tuple[Sample, ...]) -> tuple[Sample, ...]:
    """ROWS_KEPT rows from across the set: for each distinct prompt (in order), its most common completion (its
    first row with it), so that a prompt group of one answer shows as that answer; then further rows in order."""
    if len(samples) <= ROWS_KEPT:
        return samples
    groups: dict[str, list[Sample]] = {}
    for x in samples:
        groups.setdefault(x.prompt, []).append(x)
    picked: list[Sample] = []
    for rows in list(groups.values())[:ROWS_KEPT]:
        counts = Counter(normal(x.completion) for x in rows)
        top = counts.most_common(1)[0][0]
        picked.append(next(x for x in rows if normal(x.completion) == top))
    if len(picked) < ROWS_KEPT:
        rest = [x for x in samples if not any(x is p for p in picked)]
        picked += rest[: ROWS_KEPT - len(picked)]
    return tuple(picked)
