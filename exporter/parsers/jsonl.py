"""JSON lines: a flat dict of metrics (optional `step`), or verl's file logger `{"step": N, "data": {...}}`."""

from __future__ import annotations

import json
import re
from itertools import accumulate

from exporter.parsers import fastpath
from exporter.parsers.record import ParseError, Record
from exporter.parsers.training import LINE_PREFIX, parse_training
from exporter.parsers.values import MAX_STEP, Skip, count_skip, int_to_float, step_of_number, step_or_none, to_float

_STEP_KEYS = ("step", "global_step", "_step")

# Nesting levels of objects and arrays a document may have; deeper is a parse error ("too_deep"), checked
# before json.loads, which would otherwise recurse until RecursionError.
MAX_JSON_DEPTH = 64
# A JSON string, its closing quote optional so that an unterminated one is consumed once, not rescanned.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_DEPTH_CHANGE = {"{": 1, "[": 1, "}": -1, "]": -1}
# An integer with more digits is beyond a float's range, and int() refuses 4,300 digits.
_MAX_INT_DIGITS = 310


class _OutOfRange:
    """What a JSON integer too long to be a float becomes: skipped as `out_of_range`."""


OUT_OF_RANGE = _OutOfRange()


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays outside strings (a bound on json.loads' recursion)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_DEPTH_CHANGE.__getitem__, brackets)), default=0)


def loads_bounded(text: str, fmt: str, reason: str = "bad_json") -> object:
    """json.loads, with the nesting depth bounded and over-long integers marked OUT_OF_RANGE.
    Raises ParseError (`too_deep`, or `reason` for invalid JSON)."""
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise ParseError("too_deep", f"nested deeper than {MAX_JSON_DEPTH} levels", fmt)
    try:
        return json.loads(text, parse_int=parse_int_bounded)
    except ValueError as e:
        raise ParseError(reason, str(e)[:80], fmt) from None


def parse_int_bounded(text: str) -> int | _OutOfRange:
    """json's parse_int: an integer too long to be a value (a hostile 100,000 digits) is OUT_OF_RANGE, unread."""
    return int(text) if len(text) <= _MAX_INT_DIGITS else OUT_OF_RANGE


def flatten_numeric(obj: dict, prefix: str, values: dict[str, float], skipped: dict[str, int]) -> None:
    for key, v in obj.items():
        name = f"{prefix}{key}"
        if isinstance(v, bool) or v is None:
            count_skip(skipped, "none" if v is None else "non_numeric")
        elif isinstance(v, float):
            values[name] = v
        elif isinstance(v, int):
            try:
                values[name] = int_to_float(v)
            except Skip as s:
                count_skip(skipped, s.reason)
        elif isinstance(v, dict):
            flatten_numeric(v, f"{name}/", values, skipped)
        elif isinstance(v, str):
            try:
                values[name] = to_float(v)
            except Skip as s:
                count_skip(skipped, s.reason)
        else:
            count_skip(skipped, "out_of_range" if v is OUT_OF_RANGE else "non_numeric")


def step_of_json(v: object) -> int:
    """A JSON value as a step (raises Skip): an integer too long to read is too large."""
    if v is OUT_OF_RANGE:
        raise Skip("step_too_large")
    return step_of_number(v)


def parse_json_line(line: str) -> Record | None:
    s = line.strip()
    if not s.startswith('{"'):
        return None
    if s.startswith(LINE_PREFIX):  # the TRL callback's feed: a training starts
        obj = loads_bounded(s, "jsonl")
        return parse_training(obj) if isinstance(obj, dict) else None
    if fastpath.ENABLED:
        rec = _FAST.parse(s)
        if rec is not None:
            return rec
    obj = loads_bounded(s, "jsonl")
    if not isinstance(obj, dict):
        return None
    if fastpath.ENABLED:
        rec = _numeric_fast(obj)
        if rec is not None:
            _FAST.learn(s, obj, rec)
            return rec
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    if isinstance(obj.get("data"), dict):  # verl file logger
        step = step_or_none(step_of_json, obj["step"], skipped) if "step" in obj else None
        flatten_numeric(obj["data"], "", values, skipped)
        fmt = "verl_jsonl"
    else:
        key = next((k for k in _STEP_KEYS if k in obj), None)
        step = None if key is None else step_or_none(step_of_json, obj[key], skipped)
        flatten_numeric({k: v for k, v in obj.items() if k not in _STEP_KEYS}, "", values, skipped)
        fmt = "jsonl"
    if not values:
        why = f" (skipped: {', '.join(skipped)})" if skipped else ""
        raise ParseError("no_numeric_values", s[:60] + why, "jsonl")
    return Record(values=values, fmt=fmt, step=step, skipped=skipped)


# JSON lines read per record shape (parsers/fastpath.py)
_FAST = fastpath.JsonFast()


def _numeric_fast(obj: dict) -> Record | None:
    """The record parse_json_line makes of `obj` when its step is a plain integer (or absent) and every
    value a plain float or int (parsers/fastpath.py); None: read it key by key."""
    data = obj.get("data")
    if isinstance(data, dict):
        fmt, values, key = "verl_jsonl", data, "step" if "step" in obj else None
    else:
        fmt, values = "jsonl", obj
        key = next((k for k in _STEP_KEYS if k in obj), None)
        if key is not None:
            values = obj.copy()  # without the step keys, in order
            for k in _STEP_KEYS:
                values.pop(k, None)
    step = None
    if key is not None:
        step = obj[key]
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            return None  # a step that is skipped (and counted) or converted: the general path
    return fastpath.numeric_record(values, fmt, step)
