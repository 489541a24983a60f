"""User-defined line formats from the config: a regex with named groups.

Either one group per metric (`(?P<loss>\\S+)`, the group name is the key; `step` is the step),
or a `key` and a `value` group, matched repeatedly along the line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.parsers.record import Record
from exporter.parsers.values import Skip, step_of_text, step_or_none, to_float


@dataclass(frozen=True)
class RegexFormat:
    name: str
    pattern: re.Pattern[str]

    @property
    def pairwise(self) -> bool:
        return {"key", "value"} <= set(self.pattern.groupindex)

    def parse(self, line: str) -> Record | None:
        values: dict[str, float] = {}
        skipped: dict[str, int] = {}
        step: int | None = None
        if self.pairwise:
            matches = list(self.pattern.finditer(line))
            if not matches:
                return None
            groups = [(m.group("key"), m.group("value")) for m in matches]
            step_texts = [m.group("step") for m in matches if "step" in m.groupdict() and m.group("step")]
        else:
            m = self.pattern.search(line)
            if not m:
                return None
            groups = [(k, v) for k, v in m.groupdict().items() if k != "step" and v is not None]
            step_texts = [m.group("step")] if "step" in m.groupdict() and m.group("step") else []
        for key, raw in groups:
            try:
                values[key] = to_float(raw)
            except Skip as s:
                skipped[s.reason] = skipped.get(s.reason, 0) + 1
        if step_texts:
            step = step_or_none(step_of_text, step_texts[0], skipped)
        if not values:
            return None
        return Record(values=values, fmt=f"regex:{self.name}", step=step, skipped=skipped)
