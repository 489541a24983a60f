"""TRL's completion tables: the `rich` panel GRPOTrainer and RLOOTrainer print after each log line when
`log_completions=True` (trl/trainer/utils.py, print_prompt_completions_sample).

    ╭──────────────── Step 42 ────────────────╮
    │ ┏━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━┓ │
    │ ┃ Prompt ┃ Completion ┃ corr… ┃ Adva… ┃ │      header: Prompt, Completion, one column per reward
    │ ┡━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━┩ │      function, Advantage, then any extra columns
    │ │ What   │  The       │  1.00 │  0.50 │ │      cells wrap at spaces onto further lines
    │ │ is 2?  │ answer     │       │       │ │
    │ ├────────┼────────────┼───────┼───────┤ │      a light rule after every row
    │ └────────┴────────────┴───────┴───────┘ │
    ╰─────────────────────────────────────────╯

Read line by line, at any width (it is the terminal's, or 80, and may change between panels); headers cut with `…`
are matched by what is left of them. The panel's top line may come glued after other text (the bar's line in a
`> log 2>&1` capture). A wrapped cell's lines are joined with one space: spacing is the one thing not recoverable.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from exporter.samples.sampleset import Sample, SampleSet

_TITLE = re.compile(r"╭─*+ Step (\d{1,15}) ─*+╮\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*+[A-Za-z]")
MAX_ROWS = 4096  # rows kept of one panel: a printout of a whole large batch is read, its rows past this are not
MAX_COLUMNS = 64  # Prompt, Completion, one per reward function, Advantage, extras: a wider table is not TRL's
MAX_CELLS = 1 << 15  # rows x columns kept of one panel: a wide table keeps fewer rows
MAX_CELL = 4000  # characters kept of one cell
MAX_PANEL = 1 << 21  # characters kept of one panel: a hostile or huge table costs bounded memory
# what a panel reader leaves out, by reason (lines): a panel whose bottom never came, rows past MAX_ROWS (or past
# MAX_CELLS in all), a panel of more than MAX_COLUMNS columns
DROP_REASONS = ("panel_unfinished", "panel_rows_over_cap", "panel_too_wide")
_MAX_FOREIGN = 64  # other lines inside a panel before it is given up (another stream's text interleaved)


class PanelError(ValueError):
    """A panel that could not be read (its rows do not have its header's columns)."""


class PanelReader:
    """Feed it lines; `line()` returns a SampleSet when a panel ends, else None. Raises PanelError for a panel
    whose table does not read (the rest of it is skipped)."""

    def __init__(self, dropped: Counter[str] | None = None) -> None:
        self.dropped: Counter[str] = Counter() if dropped is None else dropped  # lines left out, by reason
        self._lines = 0  # lines of the open panel taken so far
        self._given_up = False  # a panel was given up: the rest of it is counted as it comes
        self._step: int | None = None  # inside a panel of this step
        self._headers: list[str] = []
        self._rows: list[list[list[str]]] = []  # rows, each cells, each its lines
        self._cells: list[list[str]] | None = None  # the row being read
        self._lengths: list[int] = []  # characters kept of each of its cells
        self._kept = 0  # characters kept of the panel
        self._ncols = 0
        self._max_rows = MAX_ROWS
        self._foreign = 0
        self._broken = False
        self._too_wide = False  # the open panel has more than MAX_COLUMNS columns: its lines are only counted

    @property
    def open(self) -> bool:
        """Inside a panel, or in the rest of one given up (its rows are counted as dropped until its bottom line)."""
        return self._step is not None or self._given_up

    def line(self, text: str) -> SampleSet | None:
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        text = text.rstrip()
        if "╭" in text:
            m = _TITLE.search(text)
            if m is not None:
                self._start(int(m.group(1)))
                return None
        if self._step is None:
            if self._given_up:
                self._rest_of_given_up(text)
            return None
        if text.startswith("╰"):
            if self._too_wide:
                self.dropped["panel_too_wide"] += 1
                self._step = None
                return None
            return self._end()
        if not (text.startswith("│") and text.endswith("│")) or len(text) < 4:
            self._foreign += 1
            if self._foreign > _MAX_FOREIGN:
                self.finish()
                self._given_up, self._foreign = True, 0
            return None
        self._lines += 1
        if self._too_wide:
            self.dropped["panel_too_wide"] += 1
            return None
        if self._broken:
            return None
        try:
            self._table_line(text[1:-1].strip())
        except PanelError:
            self._broken = True
            raise
        return None

    def finish(self) -> None:
        """The panel never ended (its bottom line never came: the stream ended, or too much other text came inside
        it): its lines are counted as dropped."""
        if self._step is not None:
            if not self._too_wide:  # a too wide one's lines were counted as they came
                self.dropped["panel_unfinished"] += self._lines + 1  # its title line too
            self._step = None

    def _rest_of_given_up(self, text: str) -> None:
        """After a panel was given up (too much other text inside it): its rows and bottom line, counted as dropped,
        until the bottom line or as much other text again."""
        if text.startswith("│") or text.startswith("╰"):
            self.dropped["panel_unfinished"] += 1
            self._given_up = not text.startswith("╰")
        else:
            self._foreign += 1
            self._given_up = self._foreign <= _MAX_FOREIGN

    def _start(self, step: int) -> None:
        self._given_up = False
        self.finish()  # a new title inside an open panel: the open one never ended
        self._step, self._headers, self._rows, self._cells = step, [], [], None
        self._ncols, self._foreign, self._broken, self._kept, self._lines = 0, 0, False, 0, 0
        self._too_wide, self._max_rows = False, MAX_ROWS

    def _table_line(self, inner: str) -> None:
        head = inner[:1]
        if head == "┏":
            self._ncols = inner.count("┳") + 1
            if self._ncols > MAX_COLUMNS:  # its header, rows and title counted as dropped; the next panel is read
                self._too_wide, self._headers = True, []
                self.dropped["panel_too_wide"] += self._lines + 1
                return
            self._headers = [""] * self._ncols
            self._max_rows = min(MAX_ROWS, MAX_CELLS // self._ncols)
        elif head == "┃":
            for i, piece in enumerate(self._split(inner, "┃")):
                self._headers[i] = (self._headers[i] + " " + piece).strip() if piece else self._headers[i]
        elif head == "│":
            if len(self._rows) >= self._max_rows:
                self.dropped["panel_rows_over_cap"] += 1
                return
            if self._cells is None:
                self._cells = [[] for _ in range(self._ncols)]
                self._lengths = [0] * self._ncols
            for i, piece in enumerate(self._split(inner, "│")):
                if piece and self._lengths[i] < MAX_CELL and self._kept < MAX_PANEL:
                    self._cells[i].append(piece)
                    self._lengths[i] += len(piece)
                    self._kept += len(piece)
        elif head in ("├", "└"):
            self._close_row()

    def _split(self, inner: str, bar: str) -> list[str]:
        parts = inner.split(bar)
        if len(parts) != self._ncols + 2 or parts[0] or parts[-1]:
            raise PanelError(f"a row of {len(parts) - 2} cells under a header of {self._ncols} columns")
        # One space of padding each side; a completion's own leading space stays.
        return [p[1:].rstrip() if p.startswith(" ") else p.rstrip() for p in parts[1:-1]]

    def _close_row(self) -> None:
        if self._cells is not None and len(self._rows) < self._max_rows:
            self._rows.append(self._cells)
        self._cells = None

    def _end(self) -> SampleSet | None:
        self._close_row()
        step, headers, rows = self._step, self._headers, self._rows
        self._step = None
        if self._broken or step is None or len(headers) < 2:
            return None
        if not (_is(headers[0], "Prompt") and _is(headers[1], "Completion")):
            return None  # another rich panel titled "Step N": not a completion table
        adv = next((i for i in range(2, len(headers)) if _is(headers[i], "Advantage")
                    and all(_number(_joined(r[i])) is not None for r in rows)), None)
        reward_cols = range(2, adv if adv is not None else len(headers))
        samples = []
        for r in rows:
            cells = [_joined(c) for c in r]
            rewards = {headers[i]: _number(cells[i]) for i in reward_cols}
            samples.append(Sample(cells[0], cells[1],
                                  {k: (math.nan if v is None else v) for k, v in rewards.items()},
                                  None if adv is None else _number(cells[adv])))
        return SampleSet(step, "trl_panel", tuple(samples))


def _is(header: str, name: str) -> bool:
    """The header is `name`, or `name` cut with an ellipsis."""
    if header == name:
        return True
    return header.endswith("…") and len(header) > 1 and name.startswith(header[:-1])


def _joined(lines: list[str]) -> str:
    if not lines:
        return ""
    return " ".join([lines[0].rstrip(), *(p.strip() for p in lines[1:])])[:MAX_CELL].rstrip()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
