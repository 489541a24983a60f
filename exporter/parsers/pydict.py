"""HF Trainer / TRL console lines: `str(dict)` of the logged values, and OpenRLHF's step lines.

`{'loss': '6.176', 'grad_norm': 4.2, 'kl': None, 'x': np.float64(0.1), 'epoch': 0.5}`
A regex walks the key/value pairs; nothing is evaluated.

Programs print other dicts too (generation kwargs, Ray and DeepSpeed configs, a model card). A dict is a
training record only when it is flat (no value is a dict or a list), holds a number (or `None`, a metric
that was NaN throughout), runs to the end of its line, and has nothing but known prefixes before it
(parsers/prefix.py), or else carries `epoch`, which the Trainer adds to every record it logs in training."""

from __future__ import annotations

import re
from collections.abc import Sequence

from exporter.parsers import fastpath
from exporter.parsers.prefix import known_prefix, without_ray_suffix
from exporter.parsers.quoted import QuotedShapes
from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip, step_of_digits, step_or_none, to_float

# key: '...' or "..." (repr switches quotes when the key holds a '); value: a quoted string, whose
# inside is captured apart (transformers 5 quotes every number), or anything up to the next , or }
_PAIR = re.compile(r"""(?:'([^']*)'|"([^"]*)")\s*:\s*(?:'([^']*)'|("[^"]*"|[^,{}]*))""")
# OpenRLHF logs `✨ Global step 12: {...}` through Python logging.
_OPENRLHF = re.compile(r"Global step (\d+):\s*(\{.*)$")
# Quoted strings, dropped before looking for a value that opens a dict or a list (possessive: an unclosed
# quote is scanned once).
_QUOTED_STRING = re.compile("'[^']*+'|\"[^\"]*+\"")
_CONTAINER_VALUE = re.compile(r":\s*+[\[{]")


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
# OpenRLHF's step lines, read per record shape (parsers/fastpath.py)
_OPENRLHF_FAST = fastpath.OpenRLHFFast()


def parse_hf_dict(line: str) -> Record | None:
    s = line.strip()
    if not s.startswith("{'") and not s.startswith('{"'):
        return None
    if s.startswith('{"'):
        return None  # JSON has its own parser; a repr key with a ' inside is too rare to guess at
    if not s.endswith("}"):
        s = without_ray_suffix(s)
        if not s.endswith("}"):
            raise ParseError("truncated", s[-40:], "hf_dict")
    body = s[1:-1]
    if '"' not in body and fastpath.ENABLED:
        rec = _QUOTED.parse(s)
        if rec is not None:
            return rec
    if _has_container_value(body):
        return None  # a model card, a config: not metrics
    rec = parse_pairs(body, "hf_dict")
    return rec if rec.numbers or "none" in rec.skipped else None  # only text values: a data sample


def read_hf_dicts(texts: Sequence[str], start: int, stop: int) -> list[Record]:
    """parse_hf_dict(text) of texts[start:stop] up to the first that a learned quoted shape does not read whole."""
    return _QUOTED.read_lines(texts, start, stop) if fastpath.ENABLED else []


def parse_hf_line(line: str) -> Record | None:
    """A dict after other text on its line: a record behind known prefixes; after anything else (prose
    that mentions a dict) only when it carries the Trainer's `epoch`. Prose is never an error."""
    line = without_ray_suffix(line)
    i = line.find("{'")
    if i < 0:
        return None
    if known_prefix(line, i):
        return parse_hf_dict(line[i:])
    try:
        rec = parse_hf_dict(line[i:])
    except ParseError:
        return None
    return rec if rec is not None and "epoch" in rec.shape else None


def _has_container_value(body: str) -> bool:
    """A value that is a dict or a list, outside quoted strings."""
    if "{" not in body and "[" not in body:
        return False
    return _CONTAINER_VALUE.search(_QUOTED_STRING.sub("", body)) is not None


def parse_openrlhf_run(texts: list[str]) -> list[Record] | None:
    """parse_openrlhf of each of `texts` (a run of lines) when they are all step lines of one learned shape
    (parsers/fastpath.py); None: read them one by one."""
    return _OPENRLHF_FAST.parse_run(texts) if fastpath.ENABLED else None


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
    digits = m.group(1)
    if len(digits) <= 15 and fastpath.ENABLED:  # below 2**53: all step_of_digits would do is int()
        step: int | None = int(digits)
    else:
        step = step_or_none(step_of_digits, digits, skipped)
    if not fastpath.ENABLED or skipped:
        return parse_pairs(body[1:-1], "openrlhf", step, skipped)
    rec = _OPENRLHF_FAST.parse_body(body[1:-1], step)
    if rec is None:
        rec = parse_pairs(body[1:-1], "openrlhf", step, skipped)
        _OPENRLHF_FAST.learn(body[1:-1], rec)
    return rec
