"""Kubeflow Katib's text format: `loss=0.3 accuracy=.98`, optionally after an RFC 3339 timestamp.

Detected automatically only when the whole line is such pairs (so `world_size=8` inside a
sentence is not a metric); a config that pins `katib` finds pairs anywhere in a line.

A pair is `key=number`: the key starts with a letter or `_` and runs over word characters and
`|/.-`, the number is followed by neither a word character nor a dot. The line is cut into runs of
key characters, each consumed once (possessive quantifiers), so a long word is read in linear time:
a pattern that looked for a key at every position of a word re-read the rest of the word from each
one (a 70k-character line took 85 s)."""

from __future__ import annotations

import re

from exporter.parsers.record import Record
from exporter.parsers.values import step_of_number, step_or_none

_NUM = (r"[+-]?+(?:\d++(?:\.\d*+)?+|\.\d++)(?:[eE][+-]?+\d++)?+"
        r"|[+-]?+(?:nan|NaN|NAN|Infinity|inf|Inf|INF)")
# One token per match, each character read once (possessive quantifiers: nothing is read again):
#   a key with what precedes it in its run of key characters (digits, non-ASCII letters, `|/.-`: text,
#   not part of the key), then the `=number` when one follows; whitespace and commas, allowed between
#   pairs; anything else (a run of key characters with no key in it, other text).
_TOKEN = re.compile(
    rf"((?:[^\W_A-Za-z]|[|/.-])*+)([A-Za-z_][\w|/.-]*+)(?:\s*+=\s*+({_NUM})(?![\w.]))?"
    r"|[\s,]++|((?:[^\W_A-Za-z]|[|/.-])++|[^\w|/.\s,-]++)"
)
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+")
_STEP_KEYS = ("step", "global_step")


def _pairs(text: str, strict: bool) -> list[tuple[str, str]] | None:
    """The line's (key, number) pairs; when strict, None unless the line is only pairs, whitespace and commas."""
    pairs: list[tuple[str, str]] = []
    for lead, key, number, other in _TOKEN.findall(text):
        if number:
            if strict and lead:
                return None  # `1abc=2`: a pair, after text
            pairs.append((key, number))
        elif strict and (key or other):
            return None  # a word that is no pair, or other text
    return pairs


def _record(pairs: list[tuple[str, str]] | None) -> Record | None:
    if not pairs:
        return None
    values = {k: float(v) for k, v in pairs}
    skipped: dict[str, int] = {}
    key = next((k for k in _STEP_KEYS if k in values), None)
    step = None if key is None else step_or_none(step_of_number, values.pop(key), skipped)
    if not values:
        return None
    return Record(values=values, fmt="katib", step=step, skipped=skipped)


def parse_katib_strict(line: str) -> Record | None:
    s = _TIMESTAMP.sub("", line.strip(), count=1)
    if "=" not in s:
        return None
    return _record(_pairs(s, strict=True))


def parse_katib_anywhere(line: str) -> Record | None:
    return _record(_pairs(line, strict=False))
