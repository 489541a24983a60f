"""Turning one printed value into a float, without eval.

Trainers print numbers as bare literals (`0.25`), quoted strings (`'0.25'`, transformers 5),
`nan`/`inf`, `None` (HF: every value was NaN), or reprs of array scalars (`np.float64(0.25)`,
`tensor(0.25)`)."""

from __future__ import annotations

import re

_WRAPPED = re.compile(
    r"^(?:np|numpy)\.(?:float|int|uint)\d*\((?P<a>[^()]*)\)$|^tensor\((?P<b>[^(),]*)(?:,[^()]*)?\)$"
)
_NONE = frozenset({"None", "null", "none"})


class Skip(Exception):
    """The value is present but not a number; `reason` says why (for the skipped counter)."""

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
