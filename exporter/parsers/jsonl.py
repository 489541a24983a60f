"""JSON lines: a flat dict of metrics (optional `step`), or verl's file logger `{"step": N, "data": {...}}`."""

from __future__ import annotations

import json
import math

from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip, to_float

_STEP_KEYS = ("step", "global_step", "_step")


def flatten_numeric(obj: dict, prefix: str, values: dict[str, float], skipped: dict[str, int]) -> None:
    for key, v in obj.items():
        name = f"{prefix}{key}"
        if isinstance(v, bool) or v is None:
            reason = "none" if v is None else "non_numeric"
            skipped[reason] = skipped.get(reason, 0) + 1
        elif isinstance(v, int | float):
            values[name] = float(v)
        elif isinstance(v, dict):
            flatten_numeric(v, f"{name}/", values, skipped)
        elif isinstance(v, str):
            try:
                values[name] = to_float(v)
            except Skip as s:
                skipped[s.reason] = skipped.get(s.reason, 0) + 1
        else:
            skipped["non_numeric"] = skipped.get("non_numeric", 0) + 1


def _step_of(v: object) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return int(v)


def parse_json_line(line: str) -> Record | None:
    s = line.strip()
    if not s.startswith('{"'):
        return None
    try:
        obj = json.loads(s)
    except ValueError as e:
        raise ParseError("bad_json", str(e), "jsonl") from None
    if not isinstance(obj, dict):
        return None
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    if isinstance(obj.get("data"), dict):  # verl file logger
        step = _step_of(obj.get("step"))
        flatten_numeric(obj["data"], "", values, skipped)
        fmt = "verl_jsonl"
    else:
        step = next((_step_of(obj[k]) for k in _STEP_KEYS if k in obj), None)
        flatten_numeric({k: v for k, v in obj.items() if k not in _STEP_KEYS}, "", values, skipped)
        fmt = "jsonl"
    if not values:
        raise ParseError("no_numeric_values", s[:80], "jsonl")
    return Record(values=values, fmt=fmt, step=step, skipped=skipped)
