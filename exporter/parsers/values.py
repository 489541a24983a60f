"""Turning one printed value into a float, and a printed step into a step, without eval.

Trainers print numbers as bare literals (`0.25`), quoted strings (`'0.25'`, transformers 5),
`nan`/`inf`, `None` (HF: every value was NaN), or reprs of array scalars (`np.float64(0.25)`,
`tensor(0.25)`).

Every number is range-checked here: a value is a float (NaN and inf included: the exporter counts
them), a step a non-negative integer below 2**53 (exact in a float, and far inside the int64
columns of the history). Anything else raises Skip with the reason it is counted under."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TypeVar

from fastnumbers import try_float

_WRAPPED = re.compile(
    r"^(?:np|numpy)\.(?:float|int|uint)\d*\((?P<a>[^()]*)\)$|^tensor\((?P<b>[^(),]*)(?:,[^()]*)?\)$"
)
_NONE = frozenset({"None", "null", "none"})
_Raw = TypeVar("_Raw")

MAX_STEP = 2**53 - 1
_MAX_STEP_DIGITS = len(str(MAX_STEP))


class Skip(Exception):
    """The value is present but not usable; `reason` says why (for the skipped counter)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def to_float(token: str) -> float:
    """Parse one printed value. Raises Skip for None, booleans, strings and containers."""
    t = token.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        t = t[1:-1].strip()
    try:
        return float(t)
    except ValueError:
        pass
    m = _WRAPPED.match(t)
    if m:
        inner = m.group("a") if m.group("a") is not None else m.group("b")
        try:
            return float(inner)
        except ValueError:
            raise Skip("non_numeric") from None
    if t in _NONE:
        raise Skip("none")
    raise Skip("non_numeric")


def floats(texts: Sequence[str]) -> list[float]:
    """[float(t) for t in texts], bit for bit, ValueError included, at about a third of the cost on long
    float reprs: fastnumbers parses with fast_float (correctly rounded, as float() is) and hands what it
    refuses (`1_0`, anything no number) to float() itself. It reads `nan(...)` as NaN where float() refuses
    it, so a list holding a NaN (its sum is NaN) is read again by float()."""
    numbers = try_float(texts, map=list, on_fail=float)
    total = sum(numbers)
    if total != total:
        return list(map(float, texts))
    return numbers


def int_to_float(v: int) -> float:
    """A logged integer as the float it is exported as; beyond a float's range it is skipped."""
    try:
        return float(v)
    except OverflowError:
        raise Skip("out_of_range") from None


def step_of_number(v: object) -> int:
    """A step given as a number (JSON, a parsed value): a non-negative integer up to MAX_STEP."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise Skip("step_not_a_number")
    if isinstance(v, float):
        if not math.isfinite(v):
            raise Skip("step_not_finite")
        if not v.is_integer():
            raise Skip("step_not_integer")
    if v < 0:
        raise Skip("step_negative")
    if v > MAX_STEP:
        raise Skip("step_too_large")
    return int(v)


def step_of_digits(text: str) -> int:
    """A step printed as decimal digits (a regex's `\\d+`): too many digits is too large, not a crash
    (int() refuses more than 4,300 digits)."""
    if len(text) > _MAX_STEP_DIGITS:
        raise Skip("step_too_large")
    return step_of_number(int(text))


def step_of_text(text: str) -> int:
    """A step printed as any number (`12`, `12.0`, `1e3`)."""
    t = text.strip()
    if t.isascii() and t.isdigit():
        return step_of_digits(t)
    try:
        return step_of_number(float(t))
    except ValueError:
        raise Skip("step_not_a_number") from None


def count_skip(skipped: dict[str, int], reason: str) -> None:
    skipped[reason] = skipped.get(reason, 0) + 1


def step_or_none(convert: Callable[[_Raw], int], raw: _Raw, skipped: dict[str, int]) -> int | None:
    """The step `convert` makes of `raw`, or None with the reason counted: the record is kept, without a step."""
    try:
        return convert(raw)
    except Skip as s:
        count_skip(skipped, s.reason)
        return None
