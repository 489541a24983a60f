"""HF Trainer / TRL console lines: `str(dict)` of the logged values, and OpenRLHF's step lines.

`{'loss': '6.176', 'grad_norm': 4.2, 'kl': None, 'x': np.float64(0.1), 'epoch': 0.5}`
A regex walks the key/value pairs; nothing is evaluated."""

from __future__ import annotations

import re

from exporter.parsers.quoted import QuotedShapes
from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip, step_of_digits, step_or_none, to_float

# key: '...' or "..." (repr switches quotes when the key holds a '); value: a quoted string, whose
# inside is captured apart (transformers 5 quotes every number), or anything up to the next , or }
_PAIR = re.compile(r"""(?:'([^']*)'|"([^"]*)")\s*:\s*(?:'([^']*)'|("[^"]*"|[^,{}]*))""")
# OpenRLHF logs `✨ Global step 12: {...}` through Python logging.
_OPENRLHF = re.compile(r"Global step (\d+):\s*(\{.*)$")


def parse_pairs(body: str, fmt: str, step: int | None = None, skipped: dict[str, int] | None = None) -> Record:
    values: dict[str, float] = {}
    skipped = {} if skipped is None else skipped
    for k1, k2, quoted, raw in _PAIR.findall(body):
        try:
            values[k1 or k2] = float(quoted or raw)  # the common case, without the slower path's checks
        except ValueError:
            try:
                values[k1 or k2] = to_float(quoted or raw)
            except Skip as s:
                skipped[s.reason] = skipped.get(s.reason, 0) + 1
    if not values and not skipped:
        raise ParseError("no_pairs", body[:80], fmt)
    return Record(values=values, fmt=fmt, step=step, skipped=skipped)


# transformers 5's all-quoted lines, read per record shape (parsers/quoted.py)
_QUOTED = QuotedShapes()


def parse_hf_dict(line: str) -> Record | None:
    s = line.strip()
    if not s.startswith("{'") and not s.startswith('{"'):
        return None
    if s.startswith('{"'):
        return None  # JSON has its own parser; a repr key with a ' inside is too rare to guess at
    if not s.endswith("}"):
        raise ParseError("truncated", s[-40:], "hf_dict")
    body = s[1:-1]
    if '"' not in body:
        rec = _QUOTED.parse(body)
        if rec is not None:
            return rec
    return parse_pairs(body, "hf_dict")


def parse_openrlhf(line: str) -> Record | None:
    if "Global step" not in line:
        return None
    m = _OPENRLHF.search(line)
    if not m:
        return None
    body = m.group(2).rstrip()
    if not body.endswith("}"):
        raise ParseError("truncated", body[-40:], "openrlhf")
    skipped: dict[str, int] = {}
    step = step_or_none(step_of_digits, m.group(1), skipped)
    return parse_pairs(body[1:-1], "openrlhf", step, skipped)
