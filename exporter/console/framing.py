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
from typing import Protocol

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CURSOR_UP = "\x1b[A"  # tqdm moves up after drawing a bar at position >= 1 (nested, e.g. eval)
# `  4%|▍         | 13/300 [00:01<00:36,  7.95it/s]` with any description before the first |
_BAR = re.compile(r"^[^{|]*\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]]*\]")
_CLEAR_MIN_SPACES = 8
# A segment and its terminator; a pseudo-terminal ends lines with \r\n.
_SEGMENT = re.compile(r"([^\r\n]*)(\r\n|\r|\n)")
# Starts of a line that a trainer prints in one piece; only these are held open when cut.
_LINE_START = re.compile(r"^(?:\{['\"]|(?:\([\w.-]+ pid=\d+[^)]*\)\s+)?step:\d+ - )")


class ConsoleSink(Protocol):
    """Receives what the framer finds, in stream order."""

    def bar(self, n: int) -> None: ...  # a draw of the training bar (nested bars are left out)

    def clear(self) -> None: ...  # the training bar was cleared (tqdm.write does this first)

    def line(self, text: str) -> None: ...  # a line of text, bar text before it removed

    def abandoned(self, text: str) -> None: ...  # an opened metric line whose rest never came


class ConsoleFramer:
    def __init__(self, sink: ConsoleSink) -> None:
        self.sink = sink
        self._carry = ""  # text after the last \r or \n, not yet terminated
        self._open: str | None = None  # start of a metric line cut by a \r

    def feed(self, text: str) -> None:
        data = self._carry + text
        # A trailing \r may be the first half of a \r\n: wait for the next byte.
        cut = len(data) - 1 if data.endswith("\r") else len(data)
        last = max(data.rfind("\n", 0, cut), data.rfind("\r", 0, cut))
        self._carry = data[last + 1 :]
        if last < 0:
            return
        # Splitting with str.split (C) and taking the common segments inline: one Python call
        # per segment was the framer's whole cost in a combined stream (three to four per record).
        lines = data[: last + 1].split("\n")
        tail = lines.pop()  # after the last \n: \r-terminated segments only (possibly none)
        for line in lines:
            if "\r" in line:
                segments = line.split("\r")
                if not segments[-1]:
                    segments.pop()  # the line ended with \r\n
                self._segments(segments, True)
            elif line:
                self._segment(line, True)
        if tail:
            segments = tail.split("\r")
            segments.pop()  # the empty text after the tail's last \r
            self._segments(segments, False)

    def _segments(self, segments: list[str], newline_last: bool) -> None:
        """\r-terminated segments, the last one \n-terminated when `newline_last`."""
        newline_at = len(segments) - 1 if newline_last else -1
        sink, bar_match = self.sink, _BAR.match
        for i, raw in enumerate(segments):
            if not raw:
                continue
            if "|" in raw and "\x1b" not in raw:
                m = bar_match(raw)
                if m is not None and m.end() == len(raw):  # a plain bar draw, nothing after it
                    sink.bar(int(m.group(1)))
                    continue
            elif " " == raw[0] == raw[-1] and raw.isspace():
                if len(raw) >= _CLEAR_MIN_SPACES:
                    sink.clear()
                continue
            elif raw[0] == "{" and i == newline_at and self._open is None and "\x1b" not in raw:
                sink.line(raw)  # a whole metric line
                continue
            self._segment(raw, i == newline_at)

    def flush(self) -> None:
        """End of input: the unterminated tail is a line; an open line is given up."""
        if self._carry:
            tail, self._carry = self._carry, ""
            self._segment(tail, True)
        if self._open is not None:
            self.sink.abandoned(self._open)
            self._open = None

    def _segment(self, raw: str, newline: bool) -> None:
        text = _ANSI.sub("", raw) if "\x1b" in raw else raw
        if "|" in text:  # the common case in a combined stream: a bar draw
            m = _BAR.match(text)
            if m:
                if _CURSOR_UP not in raw:
                    self.sink.bar(int(m.group(1)))
                rest = text[m.end() :]
                if rest and not rest.isspace():
                    self._text(rest, newline)
                return
        if text.isspace():
            # A clear that ends by moving the cursor up belongs to a nested bar, not the training bar.
            if len(text) >= _CLEAR_MIN_SPACES and _CURSOR_UP not in raw:
                self.sink.clear()
            return
        if text:
            self._text(text, newline)

    def _text(self, text: str, newline: bool) -> None:
        if self._open is not None:
            if _LINE_START.match(text):
                self.sink.abandoned(self._open)
                self._open = None
            elif newline or text.rstrip().endswith("}"):
                joined, self._open = self._open + text, None
                self.sink.line(joined)
                return
            else:
                self.sink.line(text)  # foreign \r text while a line is open: leave the line open
                return
        if not newline and _LINE_START.match(text):
            self._open = text  # cut by a \r: the rest comes after the bar text
            return
        self.sink.line(text)
