"""The fast path for transformers 5's console lines, where every value is a quoted string:
`{'loss': '6.176', 'grad_norm': '4.169', ...}`.

A trainer prints a few record shapes (the same keys in the same order) over and over. A line of a
new shape is cut with one str.split and checked; when the shape comes a second time it gets a
pattern of its own, the shape's keys as literal text with a group for each value, so that the next
lines of that shape are read by one fullmatch (which also checks the whole line) and share one keys
tuple. Not at the first line, and not for long lines: a stream whose every line brings new keys
would compile a pattern per line, and `re` keeps the last 512 it compiled. Anything else (a value
that is not a number, a quote inside a key or value, a new shape beyond the cache) returns None and
goes to the general pair parser."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from exporter.parsers import fastpath
from exporter.parsers.record import Record, RecordKind, classify

_MAX_SHAPES = 16  # patterns kept, most recently used first; a trainer has a handful of shapes
_MAX_SEEN_ONCE = 16  # shapes seen once, waiting for a second line to earn a pattern
_MAX_PATTERN_CHARS = 8192  # longer lines are read by str.split each time (a GRPO line is about 1,500)


class _Shape(NamedTuple):
    pattern: re.Pattern[str]  # the dict, braces included
    keys: tuple[str, ...]
    kind: RecordKind


class QuotedShapes:
    def __init__(self) -> None:
        self._shapes: list[_Shape] = []
        self._seen_once: dict[tuple[str, ...], tuple[str, ...]] = {}  # keys -> the first line's keys tuple

    def parse(self, text: str) -> Record | None:
        """The record of a dict `{...}` (stripped, braces included) whose values are all quoted numbers."""
        shapes = self._shapes
        for i, shape in enumerate(shapes):
            m = shape.pattern.fullmatch(text)
            if m is not None:
                if i:  # most recent first: GRPO alternates between two shapes
                    shapes.insert(0, shapes.pop(i))
                return _record(shape.keys, m.groups())
        split = _split(text[1:-1])
        if split is None:
            return None
        keys, values = split
        if len(text) - 2 <= _MAX_PATTERN_CHARS:
            keys = self._remember(keys)
        return _record(keys, values)

    def read_lines(self, texts: Sequence[str], start: int, stop: int) -> list[Record]:
        """The records of texts[start:stop] up to the first that no learned shape reads whole (as parse_hf_dict reads a
        metric line `{...}` with no space around it, by parse(): a shape's keys leave no other reading).
        One call for the run, not six a line. The shape of the line before the last is tried first: GRPO's
        trainer alternates two shapes, and a shape that does not match cost as much as one that does."""
        out: list[Record] = []
        shapes = [(shape.pattern.fullmatch, shape.keys, shape.kind) for shape in self._shapes]
        if not shapes:
            return out
        floats, of_kind, append = _FLOATS.__getitem__, Record.of_kind, out.append
        last = before = shapes[0]
        for i in range(start, stop):
            text = texts[i]
            shape = before
            m = shape[0](text)
            if m is None:
                for shape in shapes:
                    m = shape[0](text)
                    if m is not None:
                        break
                else:
                    break
            before, last = last, shape
            try:
                numbers = list(map(floats, m.groups()))
            except ValueError:
                break  # a value that is no number: the general path reads the line
            append(of_kind(shape[1], numbers, "hf_dict", None, shape[2]))
        return out

    def _remember(self, keys: tuple[str, ...]) -> tuple[str, ...]:
        """The shape's keys tuple, shared by its lines; a shape seen before gets its pattern."""
        first = self._seen_once.pop(keys, None)
        if first is None:
            if len(self._seen_once) >= _MAX_SEEN_ONCE:
                del self._seen_once[next(iter(self._seen_once))]  # the oldest
            self._seen_once[keys] = keys
            return keys
        self._shapes.insert(0, _Shape(_pattern_of(first), first, classify(first)))
        del self._shapes[_MAX_SHAPES:]
        return first


class _Floats(dict[str, float]):
    """float(text), remembered: transformers prints 4 significant digits, so a long run repeats a few tens of
    thousands of value texts ('0', '0.25', '1.913') and a dict lookup is several times cheaper than float().
    Bounded: emptied when full."""

    def __missing__(self, text: str) -> float:
        value = float(text)  # ValueError for text that is no number: nothing is remembered
        if len(self) >= _MAX_FLOATS:
            self.clear()
        self[text] = value
        return value


_MAX_FLOATS = 1 << 15  # about 3 MiB when full
_FLOATS = _Floats()


def _record(keys: tuple[str, ...], values: tuple[str, ...] | list[str]) -> Record | None:
    try:
        numbers = list(map(_FLOATS.__getitem__, values)) if fastpath.ENABLED else list(map(float, values))
    except ValueError:
        return None  # a 'None' or text value somewhere: the general path counts it
    return Record.of(keys, numbers, "hf_dict")


def _split(body: str) -> tuple[tuple[str, ...], list[str]] | None:
    parts = body.split("'")  # '', k, ': ', v, ', ', k, ': ', v, ''
    n4 = len(parts) - 1
    if n4 % 4 or parts[0] or parts[-1]:
        return None
    n = n4 // 4
    # no key or value holds a quote, or a separator would be out of place
    if parts[2::4].count(": ") != n or parts[4:-1:4].count(", ") != n - 1:
        return None
    keys = tuple(parts[1::4])
    if len(set(keys)) != n:
        return None  # a key twice: the general path keeps the last value, as a dict does
    return keys, parts[3::4]


def _pattern_of(keys: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"\{" + ", ".join(re.escape(f"'{k}': '") + "([^']*)'" for k in keys) + r"\}")
