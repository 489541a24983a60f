"""verl's console line: `step:12 - actor/pg_loss:0.1 - critic/score/mean:np.float64(0.5)`,
optionally behind Ray's actor prefix `(TaskRunner pid=87031) `."""

from __future__ import annotations

import re

from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip, step_of_digits, step_or_none, to_float

_LINE = re.compile(r"^(?:\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)\s+)?step:(\d+)\s+-\s+(.*)$")


def parse_verl_console(line: str) -> Record | None:
    if "step:" not in line:
        return None
    m = _LINE.match(line.strip())
    if not m:
        return None
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    step = step_or_none(step_of_digits, m.group(1), skipped)
    for part in m.group(2).split(" - "):
        key, sep, raw = part.partition(":")
        if not sep:
            raise ParseError("bad_pair", part[:60], "verl_console")
        try:
            values[key.strip()] = to_float(raw)
        except Skip as s:
            skipped[s.reason] = skipped.get(s.reason, 0) + 1
    return Record(values=values, fmt="verl_console", step=step, skipped=skipped)
