"""Kubeflow Katib's text format: `loss=0.3 accuracy=.98`, optionally after an RFC 3339 timestamp.

Detected automatically only when the whole line is such pairs (so `world_size=8` inside a
sentence is not a metric); a config that pins `katib` finds pairs anywhere in a line."""

from __future__ import annotations

import re

from exporter.parsers.record import Record

_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|NaN|NAN|inf|Inf|INF|Infinity)"
_PAIR = re.compile(rf"([A-Za-z_][\w|/.-]*)\s*=\s*({_NUM})(?![\w.])")
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+")
_STEP_KEYS = ("step", "global_step")


def _record(pairs: list[tuple[str, str]]) -> Record | None:
    if not pairs:
        return None
    values = {k: float(v) for k, v in pairs}
    step = next((int(values.pop(k)) for k in _STEP_KEYS if k in values and values[k] == values[k]), None)
    if not values:
        return None
    return Record(values=values, fmt="katib", step=step)


def parse_katib_strict(line: str) -> Record | None:
    s = _TIMESTAMP.sub("", line.strip(), count=1)
    if "=" not in s:
        return None
    pairs = _PAIR.findall(s)
    rest = _PAIR.sub("", s).replace(",", " ").strip()
    return None if rest else _record(pairs)


def parse_katib_anywhere(line: str) -> Record | None:
    return _record(_PAIR.findall(line))
