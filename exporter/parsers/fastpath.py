"""Per-shape fast paths for verl's console lines, OpenRLHF's step lines and JSON lines.

A trainer prints a few record shapes (the same keys in the same order, each value printed the same
way) over and over. The general parsers read each line key by key in Python; here a shape seen twice
gets one compiled pattern (its keys as literal text, a group per value), so that the next lines of
that shape are read by one fullmatch and one conversion of its values (values.floats), and share one
keys tuple. JSON lines are decoded by json.loads as before; when every value of the record is a plain
float or int, the record is built from the dict's keys and values at once instead of key by key.

A fast path answers only where it gives exactly what the general parser would give on the same
line: a pattern is installed only after it read its first line to the same record as the general
parser did, every pattern is stricter than the general parser (single spaces where the general one
takes any whitespace, values without spaces, quotes or brackets), and any value float() refuses, a
step too long, a key twice, a nested or non-numeric JSON value sends the line to the general parser.
`ENABLED = False` (or POSTTRAIN_EXPORTER_FASTPATH=0 in the environment) turns every fast path off;
tests/test_fastpath.py checks that the exposition is the same either way."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from itertools import chain
from operator import itemgetter

from exporter.parsers.record import Record, RecordKind, classify
from exporter.parsers.values import floats

ENABLED = os.environ.get("POSTTRAIN_EXPORTER_FASTPATH", "1") not in ("0", "false", "no", "off")

_MAX_SHAPES = 16  # patterns kept per format, most recently used first
_MAX_SEEN_ONCE = 16  # shapes seen once, waiting for a second line to earn a pattern
_MAX_LEARN_CHARS = 16384  # longer lines are left to the general parser
_MAX_STEP_DIGITS = 15  # up to 15 digits a step is below 2**53: int() is all the general parser does

# Shape = what a pattern is built from: the keys and, per key, how its value is printed.
Shape = tuple[tuple[str, str], ...]


class ShapeCache:
    """Compiled patterns of the shapes of one format, most recently used first, and the shapes seen once."""

    def __init__(self, build: Callable[[Shape], str]) -> None:
        self._build = build
        self.patterns: list[tuple[re.Pattern[str], tuple[str, ...], RecordKind, object]] = []
        self._seen_once: dict[Shape, None] = {}

    def match(self, text: str) -> tuple[re.Match[str], tuple[str, ...], RecordKind, object] | None:
        patterns = self.patterns
        for i, entry in enumerate(patterns):
            m = entry[0].fullmatch(text)
            if m is not None:
                if i:
                    patterns.insert(0, patterns.pop(i))
                return m, entry[1], entry[2], entry[3]
        return None

    def seen(self, shape: Shape) -> re.Pattern[str] | None:
        """A shape read by the general parser: the second time, its pattern (to be checked, then added)."""
        if shape not in self._seen_once:
            if len(self._seen_once) >= _MAX_SEEN_ONCE:
                del self._seen_once[next(iter(self._seen_once))]
            self._seen_once[shape] = None
            return None
        del self._seen_once[shape]
        return re.compile(self._build(shape))

    def add(self, pattern: re.Pattern[str], keys: tuple[str, ...], extra: object = None) -> None:
        """`extra`: what the format's reader needs besides the keys (JSON: format, step, literal length)."""
        self.patterns.insert(0, (pattern, keys, classify(keys), extra))
        del self.patterns[_MAX_SHAPES:]


def same_record(a: Record | None, b: Record | None) -> bool:
    """Two records that read the same (NaN equal to NaN, -0.0 apart from 0.0)."""
    if a is None or b is None:
        return a is b
    return (a.shape == b.shape and a.fmt == b.fmt and a.step == b.step and a.kind == b.kind
            and a.skipped == b.skipped and len(a.numbers) == len(b.numbers)
            and all(x.hex() == y.hex() or (x != x and y != y) for x, y in zip(a.numbers, b.numbers, strict=True)))


# --- verl console: `(TaskRunner pid=1) step:12 - actor/pg_loss:np.float64(0.1) - critic/score/mean:0.5` -----

# The general parser's prefix and step (parsers/verl.py), then single-spaced ` - ` separators.
_VERL_HEAD = r"(?:\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)\s+)?step:(\d+) - "
_VERL_WRAPPED = re.compile(r"((?:np|numpy)\.(?:float|int|uint)\d*)\([^ ()]*\)")
_VERL_PLAIN = "([^ ]*+)"  # no space: a value never runs into the next ` - `


def _verl_pattern(shape: Shape) -> str:
    parts = []
    for key, wrapper in shape:
        value = _VERL_PLAIN if not wrapper else re.escape(wrapper) + r"\(([^ ()]*+)\)"
        parts.append(re.escape(key + ":") + value)
    return _VERL_HEAD + " - ".join(parts)


class VerlConsoleFast:
    def __init__(self) -> None:
        self.cache = ShapeCache(_verl_pattern)

    def parse(self, line: str, general: Callable[[str], Record | None]) -> Record | None:
        """`line` as general(line) reads it (parsers/verl.py's parse_verl_console)."""
        if not ENABLED:
            return general(line)
        s = line.strip()
        rec = self._fast(s)
        if rec is not None:
            return rec
        rec = general(line)
        if rec is not None and not rec.skipped and len(s) <= _MAX_LEARN_CHARS:
            self._learn(s, rec)
        return rec

    def _fast(self, s: str) -> Record | None:
        found = self.cache.match(s)
        return None if found is None else self._record(*found)

    @staticmethod
    def _record(m: re.Match[str] | None, keys: tuple[str, ...], kind: RecordKind, _: object = None) -> Record | None:
        if m is None:
            return None
        groups = m.groups()
        step = groups[0]
        if len(step) > _MAX_STEP_DIGITS:
            return None
        try:
            return Record.of_kind(keys, floats(groups[1:]), "verl_console", int(step), kind)
        except ValueError:
            return None

    def _learn(self, s: str, rec: Record) -> None:
        i = s.find(" - ")
        if i < 0 or not rec.shape:
            return
        shape: list[tuple[str, str]] = []
        for part in s[i + 3 :].split(" - "):
            key, _, raw = part.partition(":")
            w = _VERL_WRAPPED.fullmatch(raw)
            shape.append((key, w.group(1) if w else ""))
        if tuple(k for k, _ in shape) != rec.shape:
            return  # spaces around keys, a key twice: the general parser's reading only
        pattern = self.cache.seen(tuple(shape))
        if pattern is None:
            return
        if same_record(self._record(pattern.fullmatch(s), rec.shape, rec.kind), rec):  # checked on its own line
            self.cache.add(pattern, rec.shape)


# --- OpenRLHF: `... ✨ Global step 12: {'policy_loss': -0.02, 'kl': 0.013}` --------------------------------

# A bare number as Python prints it (digits, sign, point, exponent, nan, inf): what float() reads, with nothing the
# pair regex could see. ASCII only: a class of ASCII ranges is checked faster than one excluding `\s` (a third of
# the run's findall); a value with any other character is read line by line.
_OPENRLHF_VALUE = "([-+.0-9A-Za-z]++)"


def _openrlhf_pattern(shape: Shape) -> str:
    return ", ".join(re.escape(f"'{key}': ") + _OPENRLHF_VALUE for key, _ in shape)


_OPENRLHF_KEY = re.compile(r"'([^'\"\\]*)': ")
# A run of lines is tried again this many runs after one that did not read whole (shapes mixed in a run).
_RUN_RETRY = 8
_first, _values = itemgetter(0), itemgetter(slice(1, None))  # a found line's step and values


def _openrlhf_run_pattern(keys: tuple[str, ...]) -> str:
    """Every line of a run of `keys`'s shape, each ended by a newline: what parse_openrlhf reads from the line's
    `Global step` on (one space after the colon, nothing after the closing brace), the body as the shape's pattern."""
    head = rf"Global step (\d{{1,{_MAX_STEP_DIGITS}}}): \{{"
    return head + _openrlhf_pattern(tuple((k, "") for k in keys)) + r"\}\n"


class OpenRLHFFast:
    def __init__(self) -> None:
        self.cache = ShapeCache(_openrlhf_pattern)
        self._runs: dict[tuple[str, ...], re.Pattern[str]] = {}  # run patterns of the learned shapes
        self._skip = 0  # runs left to read line by line after one that did not read whole

    def parse_run(self, texts: list[str]) -> list[Record] | None:
        """The records of `texts` (lines without line breaks, as the framer cuts them), when every one is an
        OpenRLHF step line of the shape read last, as parse_openrlhf reads it line by line; None otherwise
        (then read them one by one). One findall over the joined lines and one float() pass over all their
        values, instead of the chain's calls, a search and a fullmatch per line.

        The same records as line by line: each line has exactly one `{` (so nothing before `Global step` could
        be a dict, JSON or an earlier `Global step N: {`, and the leftmost match parse_openrlhf takes is this
        one), ends with the dict's `}` (no Ray suffix, no trailing space), and matches the shape's pattern, the
        one the line-by-line path would match first (a body fits one key sequence only)."""
        if self._skip:
            self._skip -= 1
            return None
        patterns = self.cache.patterns
        if not patterns:
            return None
        keys, kind = patterns[0][1], patterns[0][2]
        pattern = self._runs.get(keys)
        if pattern is None:
            if len(self._runs) >= _MAX_SHAPES:
                self._runs.clear()
            pattern = self._runs[keys] = re.compile(_openrlhf_run_pattern(keys))
        n = len(texts)
        joined = "\n".join(texts) + "\n"
        found = pattern.findall(joined) if joined.count("{") == n and joined.count("\n") == n else ()
        if len(found) != n:
            self._skip = _RUN_RETRY
            return None
        try:
            flat = floats(list(chain.from_iterable(map(_values, found))))  # every value of every line
        except ValueError:
            self._skip = _RUN_RETRY
            return None
        w = len(keys)
        rows = [flat[i : i + w] for i in range(0, n * w, w)]
        return Record.of_kind_rows(keys, rows, "openrlhf", list(map(int, map(_first, found))), kind)

    def parse_body(self, body: str, step: int | None) -> Record | None:
        """The record of `body` (inside the braces), or None: read it with the general parser."""
        found = self.cache.match(body)
        return None if found is None else self._record(*found, step)

    @staticmethod
    def _record(m: re.Match[str] | None, keys: tuple[str, ...], kind: RecordKind, _: object,
                step: int | None) -> Record | None:
        if m is None:
            return None
        try:
            return Record.of_kind(keys, floats(m.groups()), "openrlhf", step, kind)
        except ValueError:
            return None

    def learn(self, body: str, rec: Record) -> None:
        if rec.skipped or not rec.shape or len(body) > _MAX_LEARN_CHARS:
            return
        keys = tuple(_OPENRLHF_KEY.findall(body))
        if keys != rec.shape:
            return
        pattern = self.cache.seen(tuple((k, "") for k in keys))
        if pattern is None:
            return
        if same_record(self._record(pattern.fullmatch(body), keys, rec.kind, None, rec.step), rec):
            self.cache.add(pattern, keys)


# --- JSON lines: every value a plain float or int -------------------------------------------------------

_NUMBER_TYPES = frozenset({float, int})


def numeric_record(values: dict, fmt: str, step: int | None) -> Record | None:
    """A record of a flat dict whose values are all floats and ints (no bool, no None, nothing nested,
    no integer beyond a float's range), as the general flatten would make it; None otherwise."""
    if not values or not _NUMBER_TYPES.issuperset(map(type, values.values())):
        return None
    try:
        numbers = list(map(float, values.values()))
    except OverflowError:
        return None
    return Record.of(tuple(values), numbers, fmt, step)


# --- JSON lines read by pattern: `{"step": 12, "data": {"a": 0.1, ...}}` and `{"step": 12, "a": 0.1, ...}` ------

# A JSON number (NaN and the infinities too), which float() reads as json.loads + flatten_numeric do, but for
# `-0` (json: the integer 0) and integers past a float's range (json: skipped, float(): inf): values of more
# than 300 characters and `-0` are left to json.loads.
_JSON_NUMBER = r"(-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+|NaN|-?Infinity)"  # possessive: linear
_JSON_STEP = "(0|[1-9][0-9]{0,14})"  # a JSON integer below 2**53


def _json_pattern(shape: tuple) -> str:
    """shape: (step key or None, nested under "data", key, key, ...)."""
    step_key, nested, *keys = shape
    pairs = ", ".join(re.escape(json.dumps(k) + ": ") + _JSON_NUMBER for k in keys)
    head = "" if step_key is None else re.escape(json.dumps(step_key) + ": ") + _JSON_STEP + ", "
    return r"\{" + head + (r'"data": \{' + pairs + r"\}\}" if nested else pairs + r"\}")


class JsonFast:
    def __init__(self) -> None:
        self.cache = ShapeCache(_json_pattern)

    def parse(self, s: str) -> Record | None:
        """The record of the stripped line `s`, or None: read it with json.loads."""
        found = self.cache.match(s)
        return None if found is None else self._record(*found)

    @staticmethod
    def _record(m: re.Match[str] | None, keys: tuple[str, ...], kind: RecordKind, extra: object) -> Record | None:
        if m is None:
            return None
        fmt, has_step, literal = extra  # type: ignore[misc]
        groups = m.groups()
        if has_step:
            step: int | None = int(groups[0])
            groups = groups[1:]
        else:
            step = None
        if "-0" in groups or (len(m.string) - literal > 300 and max(map(len, groups)) > 300):
            return None  # json reads `-0` as the integer 0 (exported 0.0, not -0.0); a long integer may overflow
        return Record.of_kind(keys, floats(groups), fmt, step, kind)

    def learn(self, s: str, obj: dict, rec: Record) -> None:
        """`obj` (json.loads of `s`) read by the general path to `rec`: its shape may earn a pattern."""
        if rec.skipped or not rec.shape or len(s) > _MAX_LEARN_CHARS:
            return
        top = tuple(obj)
        if rec.fmt == "verl_jsonl":
            if top not in (("step", "data"), ("data",)) or tuple(obj["data"]) != rec.shape:
                return
            shape = (top[0] if len(top) == 2 else None, True, *rec.shape)
        elif rec.fmt == "jsonl":
            if top[1:] == rec.shape and top[0] in ("step", "global_step", "_step"):
                shape = (top[0], False, *rec.shape)
            elif top == rec.shape:
                shape = (None, False, *rec.shape)
            else:
                return
        else:
            return
        pattern = self.cache.seen(shape)  # type: ignore[arg-type]
        if pattern is None:
            return
        literal = sum(len(json.dumps(k)) for k in rec.shape)  # at most the line's text that is no value
        extra = (rec.fmt, shape[0] is not None, literal)
        if same_record(self._record(pattern.fullmatch(s), rec.shape, rec.kind, extra), rec):
            self.cache.add(pattern, rec.shape, extra)
