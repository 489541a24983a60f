"""verl's printed samples: the naive reward manager (verl/workers/reward_manager/naive.py) prints a few samples per
data source each step, before the step's metric line:

    (TaskRunner pid=2817) [prompt] system ... user What is 3 plus 4? ...
    (TaskRunner pid=2817) [response] <think>...</think> 7
    (TaskRunner pid=2817) [ground_truth] 7
    (TaskRunner pid=2817) [score] 1.0            (or one `[key] value` line per key of a dict score)

Ray puts its `(Actor pid=N)` prefix before every line, and a multi-line prompt or response continues on lines with
that prefix and no marker. The samples seen before a step's metric line (`step:N - ...`) are that step's set: the
console stream closes them with `close(step)` when the metric line's record arrives."""

from __future__ import annotations

import math
import re
from collections import Counter

from exporter.samples.sampleset import Sample, SampleSet

_LINE = re.compile(r"^(\([\w.-]++ pid=\d++[^)]*+\) ?)?\[(\w{1,64})\] ?(.*)$", re.S)
_PREFIX = re.compile(r"^\([\w.-]++ pid=\d++[^)]*+\) ?")
MAX_SAMPLES = 1024  # samples kept of one step
MAX_TEXT = 4000  # characters kept of one prompt or response
MAX_STEP_TEXT = 1 << 21  # characters kept of one step's samples (as a TRL panel's): past it, samples are left out
MAX_SCORES = 32  # `[key] value` scores kept of one sample
_TEXT_FIELDS = ("prompt", "response", "ground_truth")
# what the verl reader leaves out, by reason: the lines of samples no step line closed; samples past MAX_SAMPLES or
# MAX_STEP_TEXT, or without a response (one each); score lines of a sample past MAX_SCORES (lines)
DROP_REASONS = ("samples_without_step", "samples_over_cap", "sample_without_response", "sample_scores_over_cap")


class VerlSampleReader:
    def __init__(self, dropped: Counter[str] | None = None) -> None:
        self.dropped: Counter[str] = Counter() if dropped is None else dropped  # lines left out, by reason
        self._lines = 0  # lines of the samples kept since the last close
        self._sample_lines = 0  # lines of the sample being read
        self._done: list[Sample] = []
        self._kept = 0  # characters of the samples in _done
        self._fields: dict[str, str] = {}
        self._scores: dict[str, float] = {}
        self._open: str | None = None  # the text field that unmarked lines continue
        self._prefix: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self._done or self._fields)

    def line(self, text: str) -> bool:
        """Takes a line; True when it was part of a sample."""
        m = _LINE.match(text)
        if m is None:
            return self._continue(text)
        prefix, key, value = m.group(1) or "", m.group(2), m.group(3)
        if key == "prompt":
            self._finish()
            self._fields = {"prompt": value[:MAX_TEXT]}
            self._open, self._prefix, self._sample_lines = "prompt", prefix, 1
            return True
        if not self._fields:
            return False  # a bracketed word outside a sample
        self._sample_lines += 1
        if key in _TEXT_FIELDS:
            self._fields[key] = value[:MAX_TEXT]
            self._open = key
        elif key not in self._scores and len(self._scores) >= MAX_SCORES:
            self.dropped["sample_scores_over_cap"] += 1
            self._open = None
        else:
            try:
                self._scores[key] = float(value)
            except ValueError:
                self._scores[key] = {"true": 1.0, "false": 0.0}.get(value.strip().lower(), math.nan)
            self._open = None
        return True

    def _continue(self, text: str) -> bool:
        if self._open is None:
            return False
        p = _PREFIX.match(text)
        if (p.group(0) if p else "") != self._prefix:
            self._open = None  # another process's line, or text without the sample's prefix: the field ended
            return False
        rest = text[p.end() :] if p else text
        self._sample_lines += 1
        value = self._fields[self._open]
        if len(value) < MAX_TEXT:
            self._fields[self._open] = (value + "\n" + rest)[:MAX_TEXT]
        return True

    def _finish(self) -> None:
        """The sample read so far is complete: kept, or counted once as dropped (a sample, not its lines)."""
        size = sum(map(len, self._fields.values()))
        if "response" in self._fields and len(self._done) < MAX_SAMPLES and self._kept + size <= MAX_STEP_TEXT:
            self._done.append(Sample(self._fields.get("prompt", ""), self._fields["response"], dict(self._scores)))
            self._lines += self._sample_lines
            self._kept += size
        elif "response" in self._fields:
            self.dropped["samples_over_cap"] += 1
        elif self._fields:
            self.dropped["sample_without_response"] += 1
        self._fields, self._scores, self._open, self._sample_lines = {}, {}, None, 0

    def close(self, step: int) -> SampleSet | None:
        """The samples read so far are step `step`'s (its metric line has come)."""
        self._finish()
        done, self._done, self._lines, self._kept = self._done, [], 0, 0
        return SampleSet(step, "verl", tuple(done)) if done else None

    def finish(self) -> None:
        """The stream ended: samples no metric line closed have no step; their lines are counted as dropped."""
        self._finish()
        if self._done:
            self.dropped["samples_without_step"] += self._lines
        self._done, self._lines, self._kept = [], 0, 0
