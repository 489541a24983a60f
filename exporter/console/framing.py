"""Cutting a console stream into text lines, progress-bar draws and bar clears.

When a trainer's stdout and stderr share one stream, tqdm's bars (`\\r`-separated, ANSI escapes)
are mixed with the metric lines. Two things make it harder than splitting on newlines:
- a metric line can follow bar text with no separator (`... 7.95it/s]{'loss': ...`);
- with block-buffered stdout, an 8 KB block boundary can cut a metric line in two, and bar text
  written to stderr in between lands inside it. The first part is held open and the rest joined
  when it arrives.

A line (text up to a \\r or \\n) longer than `max_line_length` characters is dropped and counted, and
never held whole: once the unterminated text passes the limit it is let go, and the rest of the line
is skipped as it comes. Text without a line end is held in the pieces it came in, so a long line
arriving in small reads costs linear time, not a copy of everything held so far per read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import repeat
from operator import itemgetter
from typing import Protocol

from exporter.parsers import fastpath

_ANSI = re.compile(r"\x1b\[[0-9;?]*+[A-Za-z]")
_CURSOR_UP = "\x1b[A"  # tqdm moves up after drawing a bar at position >= 1 (nested, e.g. eval)
# `  4%|▍         | 13/300 [00:01<00:36,  7.95it/s]` with any description before the first | (group 1, None
# when there is only the percentage); a count or total of more than 15 digits is no bar (and would be no step).
_BAR = re.compile(r"^(?:\s*+\d{1,3}+%|([^{|]*+))\|[^|]*+\|\s*+(\d{1,15}+)/(\d{1,15}+)\s*+\[[^\]]*+\]")
_CLEAR_MIN_SPACES = 8
# A \n-line as tqdm.write leaves a metric line between draws of the training bar, the common line of a combined
# stream: draws of the bar (the percentage form, nothing after them, one total), a clear and a whole metric line:
# `\r  6%|▋    | 351/5700 [00:07<00:28,  8.67it/s]\r<8+ spaces>\r{'loss': ...}\n`. Stricter than _segments (spaces
# where _BAR takes \s, no escapes in the draws): a line it matches, with no \r or escape in its metric line (checked
# apart: `[^\n]` is scanned several times faster than a set), _segments frames as bar()s, clear(), line().
# _LINES reads a text of whole lines at once, a tuple per line: the line (this shape), the first draw's count, the
# total, the further draws, the last one's count ("" without further draws), the metric line; or the other line.
_DRAWN = r" *+\d{1,3}+%\|[^|\r\n\x1b]*+\| *+(\d{1,15}+)/"
_RATE = r" *+\[[^\]\r\n\x1b]*+\]"
_LINES = re.compile(
    rf"(?:(\r{_DRAWN}(?P<total>\d{{1,15}}+){_RATE}((?:\r{_DRAWN}(?P=total){_RATE})*+)\r {{8,}}+\r(\{{[^\n]*+))"
    r"|([^\n]*+))\n")
_WHOLE, _OTHER = itemgetter(0), itemgetter(6)
_MIN_MEAN_LINE = 64  # characters a line on average, for _LINES
# Starts of a line that a trainer prints in one piece; only these are held open when cut.
# (Possessive: `\d+[^)]*` without a `)` after it backtracked over every split of the digits.)
_LINE_START = re.compile(r"^(?:\{['\"]|(?:\([\w.-]++ pid=\d++[^)]*+\)\s++)?step:\d++ - )")
MAX_LINE_LENGTH = 1 << 20  # characters; the config's limits.max_line_length
# Ray's coloured actor prefix, which its driver prints before each line an actor printed (colorama's DIM, a colour,
# `(PPOTrainer pid=4242)` or `(pid=12, ip=10.0.0.5)`, RESET_ALL, a space): framing, not text. Taken out before
# the text is cut, so that a bar draw behind it (`prefix \r<bar>`) is a bar draw, and a line a line.
_RAY_PREFIX_START = "\x1b[2m\x1b[3"
_RAY_PREFIX = re.compile(r"\x1b\[2m\x1b\[3\dm\((?:[\w.-]{1,128}+ )?+pid=\d{1,10}+(?:, ip=[\w.:]{1,64}+)?+\)\x1b\[0m ?+")


# A \n-line that is `\r` and one plain bar draw, spaces after it at most (no other \r, no escape: the classes leave
# them out), as _segments frames it (_BAR): description (None: only the percentage), count, total, bracket text.
# Ray's log monitor prints each draw of a worker's bar as such a line.
_WS = r"[^\S\r\n]"  # \s of a segment: no \r or \n in it
_DRAW_LINE = re.compile(
    rf"\r(?:{_WS}*+\d{{1,3}}+%|([^{{|\r\n\x1b]*+))\|[^|\r\n\x1b]*+\|{_WS}*+(\d{{1,15}}+)/(\d{{1,15}}+){_WS}*+"
    rf"\[([^\]\r\n\x1b]*+)\]{_WS}*+")


class ConsoleSink(Protocol):
    """Receives what the framer finds, in stream order."""

    # A draw of a bar at count n of `total` (as printed), with the text before its first | when that is more
    # than the percentage (None: no description, as the training bar has). Nested bars are left out.
    def bar(self, n: int, total: str, description: str | None) -> None: ...

    def clear(self) -> None: ...  # the training bar was cleared (tqdm.write does this first)

    def line(self, text: str) -> None: ...  # a line of text, bar text before it removed

    def abandoned(self, text: str) -> None: ...  # an opened metric line whose rest never came

    def overlong(self) -> None: ...  # a line longer than max_line_length was dropped

    # Optional: `postfix(description, n, total, bracket, nested)`, a bar draw whose bracket text (`bracket`, inside
    # the [ ]) holds a `key=value` postfix, nested bars (drawn with cursor-up escapes) included (console/postfix.py).
    # Optional: `nested_bar()`, a nested bar's draw without a postfix (left out, counted).
    # Optional: `bar_run(draws)`, (description, count, total, bracket text) of lines that are one plain draw each
    # (_DRAW_LINE's groups): bar() for each, and postfix(..., False) for each whose bracket holds a `=`.
    # Optional: `complete(text) -> bool`: `text`, a dict or JSON object cut by a \r or an escape (a bar draw or a clear
    # follows it) that ends with its closing brace, read as a line when it is a record (True); False: it is held open.
    # Optional: `line_run(texts)`, the same as `line(text)` for each in turn (a run of plain lines at once).
    # Optional: `redrawn_run(columns, start, stop) -> int`, tqdm.write's lines (_LINES) at once: `columns` holds
    # their groups (first count, total, further draws, last count, metric line), column by column; of lines `start`
    # to `stop` (one total), the sink takes what it can from the first as bar(), clear() and line() would, and
    # returns the index of the first line it left (`start`: none taken), in time proportional to what it took.


class ConsoleFramer:
    def __init__(self, sink: ConsoleSink, max_line_length: int = MAX_LINE_LENGTH) -> None:
        self.sink = sink
        self.max_line_length = max_line_length
        self._held: list[str] = []  # text after the last \r or \n, not yet terminated, as it came
        self._held_length = 0
        self._skipping = False  # inside a line over max_line_length: dropped up to its end
        self._open: str | None = None  # start of a metric line cut by a \r
        self._batch = getattr(sink, "line_run", None)  # a run of plain \n-terminated lines at once
        self._redrawn = getattr(sink, "redrawn_run", None)  # a run of tqdm.write's lines at once
        self._postfix = getattr(sink, "postfix", None)  # bar draws with a postfix (console/postfix.py)
        self._nested_bar = getattr(sink, "nested_bar", None)
        self._bar_run = getattr(sink, "bar_run", None)  # lines that are one bar draw each, at once
        self._complete = getattr(sink, "complete", None)  # a record whole before its \n: read at once

    def feed(self, text: str) -> None:
        if _RAY_PREFIX_START in text:
            text = _RAY_PREFIX.sub("", text)
        if self._skipping:
            text = self._skip_overlong(text)
        if not text:
            return
        if self._extends_held(text):
            self._hold(text)
            return
        data = "".join(self._held) + text if self._held else text
        self._held, self._held_length = [], 0
        # A trailing \r may be the first half of a \r\n: wait for the next byte.
        cut = len(data) - 1 if data.endswith("\r") else len(data)
        last = max(data.rfind("\n", 0, cut), data.rfind("\r", 0, cut))
        if last < 0:
            self._hold(data)
            return
        self._hold(data[last + 1 :])
        nl = data.rfind("\n", 0, last + 1)
        if nl >= 0:
            self._lines(data[: nl + 1], last >= self.max_line_length)
        tail = data[nl + 1 : last + 1]  # after the last \n: \r-terminated segments only (possibly none)
        if tail:
            if len(tail) > self.max_line_length:
                tail = self._without_overlong(tail)
            segments = tail.split("\r")
            segments.pop()  # the empty text after the tail's last \r
            self._segments(segments, False)

    def _lines(self, text: str, may_be_overlong: bool) -> None:
        """`text`: whole \n-terminated lines. Cut by one C call (findall; split where no tqdm.write's line can be,
        or where lines are too short for a tuple each), then framed by _frame: one Python call per segment was the
        framer's whole cost in a combined stream (three to four per record)."""
        # findall makes a 7-tuple a line: only where lines are long enough for that to cost little next to them
        # (tqdm.write's are hundreds of characters; a hostile text of `\r\n`s must not cost a tuple each).
        # (Without a `\r{` no line is tqdm.write's: split, as for a Ray worker's bar draws.)
        if self._redrawn is not None and fastpath.ENABLED and "\r{" in text \
                and text.count("\n") * _MIN_MEAN_LINE <= len(text):
            parts = _LINES.findall(text)
            if not may_be_overlong or max(max(map(len, map(_WHOLE, parts))),
                                          max(map(len, map(_OTHER, parts)))) <= self.max_line_length:
                self._frame(parts)
                return
        lines = text.split("\n")
        lines.pop()  # the empty text after the last \n
        if may_be_overlong and max(map(len, lines)) > self.max_line_length:
            lines = [self._without_overlong(line) for line in lines]
        none = repeat("")  # endless: zip ends with the lines
        self._frame(zip(none, none, none, none, none, none, lines, strict=False))

    def _frame(self, parts: Iterable[tuple[str, ...]]) -> None:
        """Lines as _LINES cuts them. Runs of plain lines (no \r, no escape, no bar, not blank, no line held open)
        go to the sink in one call (sink.line_run): a trainer without bars prints nothing else. Runs of tqdm.write's
        lines go to sink.redrawn_run: a combined stream prints little else."""
        batch = self._batch if fastpath.ENABLED else None
        bars = self._bar_run if fastpath.ENABLED else None
        run: list[str] = []
        drawn: list[tuple[str, ...]] = []  # a run of tqdm.write's lines: their groups
        drawn_lines: list[str] = []
        draws: list[tuple[str | None, str, str, str]] = []  # a run of lines that are one bar draw each: _DRAW_LINE
        draw_line = _DRAW_LINE.fullmatch
        for whole, first, total, further, last, metric, line in parts:
            if bars is not None:
                if not whole and (not line or line == _CURSOR_UP):
                    continue  # frames as nothing (Ray prints the newline and the cursor-up of a nested draw apart)
                if line[:1] == "\r" and self._open is None and (m := draw_line(line)) is not None:
                    draw = m.groups()
                    if run:
                        batch(run)  # type: ignore[misc]
                        run = []
                    if drawn:
                        self._redrawn_run(drawn, drawn_lines)
                        drawn, drawn_lines = [], []
                    draws.append(draw)
                    continue
                if draws:
                    bars(draws)
                    draws = []
            if whole:
                # No \r or escape in the metric line (after it, a cut line could be held open), no line held open.
                if self._open is None and "\r" not in metric and "\x1b" not in metric:
                    if run:
                        batch(run)  # type: ignore[misc]
                        run = []
                    drawn.append((first, total, further, last, metric))
                    drawn_lines.append(whole)
                    continue
                line = whole
            elif batch is not None and line and self._open is None and "\r" not in line and "\x1b" not in line \
                    and "|" not in line and not line.isspace():
                if drawn:
                    self._redrawn_run(drawn, drawn_lines)
                    drawn, drawn_lines = [], []
                run.append(line)
                continue
            if run:
                batch(run)  # type: ignore[misc]
                run = []
            if drawn:
                self._redrawn_run(drawn, drawn_lines)
                drawn, drawn_lines = [], []
            self._line(line)
        if run:
            batch(run)  # type: ignore[misc]
        if drawn:
            self._redrawn_run(drawn, drawn_lines)
        if draws:
            bars(draws)  # type: ignore[misc]

    def _line(self, line: str) -> None:
        """A \n-terminated line (without its \n), segment by segment."""
        if "\r" in line:
            segments = line.split("\r")
            if not segments[-1]:
                segments.pop()  # the line ended with \r\n
            self._segments(segments, True)
        elif line:
            self._segment(line, True)
        elif self._open is not None:
            self._newline_alone()

    def _redrawn_run(self, drawn: list[tuple[str, ...]], lines: list[str]) -> None:
        """A run of tqdm.write's lines, offered to the sink a stretch of one bar total at a time: the sink takes what
        it can from the start, the first line it leaves (its clock, or a metric line that is no record) is framed on
        its own, and the rest offered again. The sink's work is in what it takes, so a run costs linear time."""
        columns = list(zip(*drawn, strict=True))
        totals, end = columns[1], len(lines)
        if totals.count(totals[0]) == end:
            stops = [end]
        else:  # where the total changes
            stops = [i for i in range(1, end) if totals[i] != totals[i - 1]]
            stops.append(end)
        start = 0
        for stop in stops:
            while start < stop:
                start = self._redrawn(columns, start, stop)
                if start < stop:
                    self._line(lines[start])  # as _segments frames it, it opens no line: the next ones are offered
                    start += 1

    def _extends_held(self, text: str) -> bool:
        """`text` ends no line: no \\n, no \\r but perhaps a last one (half of a \\r\\n?), and the held
        text does not end with a \\r that this text would complete."""
        if "\n" in text or (self._held and self._held[-1].endswith("\r")):
            return False
        cr = text.find("\r")
        return cr < 0 or cr == len(text) - 1

    def _hold(self, text: str) -> None:
        if not text:
            return
        self._held.append(text)
        self._held_length += len(text)
        if self._held_length > self.max_line_length:
            # Too long to be a line a trainer logs: let it go now, not when (if ever) it ends.
            self._skipping = not text.endswith("\r")
            self._held, self._held_length = [], 0
            self.sink.overlong()

    def _skip_overlong(self, text: str) -> str:
        """The text after the end of the dropped line (from its \\r or \\n), or "" while it goes on."""
        ends = [i for i in (text.find("\n"), text.find("\r")) if i >= 0]
        if not ends:
            return ""
        self._skipping = False
        return text[min(ends) :]

    def _without_overlong(self, line: str) -> str:
        """The \\n-line with each \\r-segment over the limit replaced by a blank, which frames as nothing."""
        if len(line) <= self.max_line_length:
            return line
        segments = line.split("\r")
        for i, segment in enumerate(segments):
            if len(segment) > self.max_line_length:
                segments[i] = " "
                self.sink.overlong()
        return "\r".join(segments)

    def _segments(self, segments: list[str], newline_last: bool) -> None:
        """\r-terminated segments, the last one \n-terminated when `newline_last`."""
        newline_at = len(segments) - 1 if newline_last else -1
        sink, bar_match = self.sink, _BAR.match
        for i, raw in enumerate(segments):
            if not raw:
                if i == newline_at and self._open is not None:
                    self._newline_alone()
                continue
            if "|" in raw and "\x1b" not in raw:
                m = bar_match(raw)
                if m is not None and m.end() == len(raw):  # a plain bar draw, nothing after it
                    description, n, total = m.groups()
                    sink.bar(int(n), total, description)
                    if "=" in raw and self._postfix is not None:
                        self._postfix_of(m, raw, False)
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
        self._skipping = False
        if self._held:
            tail = "".join(self._held)
            self._held, self._held_length = [], 0
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
                    description, n, total = m.groups()
                    self.sink.bar(int(n), total, description)
                    if "=" in text and self._postfix is not None:
                        self._postfix_of(m, text, False)
                elif not ("=" in text and self._postfix is not None and self._postfix_of(m, text, True)) \
                        and self._nested_bar is not None:
                    self._nested_bar()  # a nested bar (evaluation's, an inner loop's): left out, counted
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

    def _postfix_of(self, m: re.Match[str], text: str, nested: bool) -> bool:
        """Offers the bar draw `m` (of `text`) to sink.postfix when its bracket holds a `key=value`."""
        bracket = text[text.index("[", m.end(3)) + 1 : m.end() - 1]
        if "=" not in bracket:
            return False
        description, n, total = m.groups()
        self._postfix(description, int(n), total, bracket, nested)  # type: ignore[misc]
        return True

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
            if not self._read_at_cut(text):
                self._open = text  # cut by a \r: the rest comes after the bar text
            return
        self.sink.line(text)

    # --- a record cut from its \n (block-buffered stdout flushed between `}` and `\n`, stderr's bar drawn after it)

    def _read_at_cut(self, text: str) -> bool:
        """A dict or JSON object that ends with its closing brace where a \\r or an escape cut it is read now, when
        it is a record: its redraw, which gives its step, is the bar draw that cut it, or comes soon after. Held, it
        would wait for a \\n that comes with stdout's next block (hours later), or never. A verl step line has no
        end mark, so it waits for its \\n; it carries its own step, so its lateness shifts nothing."""
        return text[0] == "{" and self._complete is not None and text.rstrip().endswith("}") \
            and self._complete(text)

    def _newline_alone(self) -> None:
        """A \\n with nothing before it ends the open line: the line's text all came before a bar draw cut it."""
        text, self._open = self._open, None
        self.sink.line(text)  # type: ignore[arg-type]
