"""Cutting a console stream into text lines, progress-bar draws and bar clears.

When a trainer's stdout and stderr share one stream, tqdm's bars (`\\r`-separated, ANSI escapes)
are mixed with the metric lines. Two things make it harder than splitting on newlines:
- a metric line can follow bar text with no separator (`... 7.95it/s]{'loss': ...`);
- with block-buffered stdout, an 8 KB block boundary can cut a metric line in two, and bar text
  written to stderr in between lands inside it. The first part is held open and the rest joined
  when it arrives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CURSOR_UP = "\x1b[A"  # tqdm moves up after drawing a bar at position >= 1 (nested, e.g. eval)
# `  4%|▍         | 13/300 [00:01<00:36,  7.95it/s]` with any description before the first |
_BAR = re.compile(r"^[^{|]*\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]]*\]")
_CLEAR_MIN_SPACES = 8
_TERMINATOR = re.compile(r"\r\n|[\r\n]")  # a pseudo-terminal ends lines with \r\n
# Starts of a line that a trainer prints in one piece; only these are held open when cut.
_LINE_START = re.compile(r"^(?:\{['\"]|(?:\([\w.-]+ pid=\d+[^)]*\)\s+)?step:\d+ - )")


@dataclass(frozen=True, slots=True)
class Bar:
    n: int
    total: int


@dataclass(frozen=True, slots=True)
class Clear:
    pass


@dataclass(frozen=True, slots=True)
class Line:
    text: str


@dataclass(frozen=True, slots=True)
class Abandoned:
    """An opened metric line whose rest never came (counted, never parsed)."""

    text: str


Event = Bar | Clear | Line | Abandoned
CLEAR = Clear()


class ConsoleFramer:
    def __init__(self) -> None:
        self._carry = ""  # text after the last \r or \n, not yet terminated
        self._open: str | None = None  # start of a metric line cut by a \r

    def feed(self, text: str) -> list[Event]:
        data = self._carry + text
        # A trailing \r may be the first half of a \r\n: wait for the next byte.
        held = 1 if data.endswith("\r") else 0
        events: list[Event] = []
        start = 0
        for m in _TERMINATOR.finditer(data, 0, len(data) - held):
            self._segment(data[start : m.start()], m.group() != "\r", events)
            start = m.end()
        self._carry = data[start:]
        return events

    def flush(self) -> list[Event]:
        """End of input: the unterminated tail is a line; an open line is given up."""
        events: list[Event] = []
        if self._carry:
            tail, self._carry = self._carry, ""
            self._segment(tail, True, events)
        if self._open is not None:
            events.append(Abandoned(self._open))
            self._open = None
        return events

    @property
    def holding(self) -> bool:
        return bool(self._carry) or self._open is not None

    def _segment(self, raw: str, newline: bool, out: list[Event]) -> None:
        if not raw:
            return
        text = _ANSI.sub("", raw) if "\x1b" in raw else raw
        if not text.strip():
            # A clear that ends by moving the cursor up belongs to a nested bar, not the training bar.
            if len(text) >= _CLEAR_MIN_SPACES and _CURSOR_UP not in raw:
                out.append(CLEAR)
            return
        rest = text
        m = _BAR.match(text) if "|" in text else None
        if m:
            if _CURSOR_UP not in raw:
                out.append(Bar(int(m.group(1)), int(m.group(2))))
            rest = text[m.end() :]
            if not rest.strip():
                return
        self._text(rest, newline, out)

    def _text(self, text: str, newline: bool, out: list[Event]) -> None:
        if self._open is not None:
            if _LINE_START.match(text):
                out.append(Abandoned(self._open))
                self._open = None
            elif newline or text.rstrip().endswith("}"):
                joined, self._open = self._open + text, None
                out.append(Line(joined))
                return
            else:
                out.append(Line(text))  # foreign \r text while a line is open: leave the line open
                return
        if not newline and _LINE_START.match(text):
            self._open = text  # cut by a \r: the rest comes after the bar text
            return
        out.append(Line(text))
