"""Metrics in a tqdm bar's postfix: `Episode [1/1]:  3%|▎  | 6/200 [02:01<1:05:12, 20.2s/it, kl=0.00481, ...]`.

`bar.set_postfix(status)` draws the status, each number in tqdm's short form (3 significant digits: `1e-7`,
`0.00481`, `2.39`), inside the bar's brackets after the rate. Many trainers report only there: OpenRLHF's SFT, DPO
and RM trainers (a nested `Train step of epoch N` bar under `Train epoch`), its PPO/GRPO controller up to v0.8.0
(the `Episode [e/E]` bar), and custom loops. A postfix is read as a training record when its bar is the training
bar, at the step the bar's count gives.

Which bar trains: the first bar whose postfix holds a number, by its description with the digits taken out
(`Train step of epoch 0` and `... 1` are one bar, run per epoch), unless its description says it is no training
bar: evaluation (`Eval stage of steps 10`), OpenRLHF's PPO actor and critic inner loops (`Train epoch [1/1]`: the
micro-batches of one global step, whose mean the controller reports), sample generation, loading. A later bar of
another description is not read (counted).

Which step: trainers call `set_postfix(...)` and then `update()` (OpenRLHF's trainers; `for x in tqdm(...)`, whose
count moves on when the next item is asked for), so a new postfix is drawn at the count of the steps before it:
its step is that count + 1 (within the run: plus the bars of earlier epochs or episodes, from the description's
number where OpenRLHF prints one: `Train step of epoch N` is 0-based, `Episode [e/E]` 1-based; else the counts of
the family's earlier bars). Only a set_postfix() draw makes a record: a postfix that changed, or the same one
drawn again at the same count (equal values); update()'s draws, close()'s and tqdm.write's redraws repeat it. OpenRLHF's
`Train step of epoch` counts micro-batches; with gradient accumulation N (the log's `gradient_accumulation`), the
step is the optimizer's (micro-batch / N), read at the micro-batch that completes it.

Where the stream also carries records of its own (OpenRLHF v0.8.1+'s `✨ Global step N: {...}` lines in full
precision, HF dict lines), those are the records: a postfix record waits for the bar's next draw (update()'s, at
once), and a training record that reached the run from elsewhere meanwhile supersedes it; from then on postfix
records stop, and the draws that would have made one are counted as superseded.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from exporter.parsers.record import Record, RecordKind

FORMAT = "tqdm_postfix"  # the format label of postfix records (posttrain_exporter_lines_total)

_DIGITS = re.compile(r"\d+")
_PERCENTAGE = re.compile(r"(?::\s*+)?\d{1,3}+%\s*+$")  # tqdm's `{desc}: {percentage}%` before the bar
# Bars whose postfix is no training step: evaluation, OpenRLHF's PPO actor/critic micro-batch loops (`Train epoch
# [1/1]`, in the Ray workers), rollout generation, loading and preprocessing.
_NOT_TRAINING = re.compile(r"eval|valid|^test|^Train epoch \[|generat|^sampl|load|^map\b|tokeniz|^process|^reward",
                           re.IGNORECASE)
_EPISODE = re.compile(r"Episode \[(\d{1,9})/\d{1,9}\]")  # OpenRLHF PPO: 1-based
_EPOCH_OF = re.compile(r"\bepoch (\d{1,9})\s*$")  # OpenRLHF `Train step of epoch N`: 0-based
_NONE: list[Record] = []  # returned, never changed
_MAX_NAMES = 4096
_MAX_NAMED = 256  # characters of a description remembered (a longer one is named again at each draw): the caches
# hold at most _MAX_NAMES x _MAX_NAMED characters, whatever the bars' descriptions


def postfix_pairs(bracket: str) -> list[tuple[str, str]]:
    """The `key=value` pairs of a bar's bracket text (`00:01<00:36,  7.95it/s, loss=0.5, kl=0.01`): tqdm joins the
    postfix's pairs with `, ` after the rate. A piece without `=` belongs to the value before it (a value that
    holds `, `)."""
    pairs: list[tuple[str, str]] = []
    for piece in bracket.split(", ")[1:]:
        key, eq, value = piece.partition("=")
        if eq and key and "<" not in key:
            pairs.append((key.strip(), value.strip()))
        elif pairs:
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + ", " + piece)
    return pairs  # as many as the line holds (limits.max_line_length): the run's key limits count the excess


def postfix_record(pairs: list[tuple[str, str]], step: int) -> Record | None:
    """The record of `pairs` at `step`: the numbers (tqdm's short forms read by float()); None without any."""
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    for key, raw in pairs:
        try:
            x = float(raw)
        except ValueError:
            skipped["non_numeric"] = skipped.get("non_numeric", 0) + 1
            continue
        if not math.isfinite(x) and raw.strip().lower() not in ("nan", "inf", "-inf", "+inf"):
            skipped["out_of_range"] = skipped.get("out_of_range", 0) + 1
            continue
        values[key] = x
    if not values:
        return None
    return Record(values, FORMAT, step, skipped or None)


class _Bar:
    """What was last drawn by one bar family."""

    __slots__ = ("description", "last_n", "offset", "postfix", "total")

    def __init__(self) -> None:
        self.description: str | None = None
        self.total = ""
        self.last_n = -1
        self.offset = 0  # micro-steps of the family's earlier bars
        self.postfix = ""


class PostfixReader:
    """Postfix draws in, training records out; every draw with a postfix counted by outcome."""

    def __init__(self, counts: Counter[tuple[str, str]] | None = None, accumulation: int = 1) -> None:
        self.accumulation = max(1, accumulation)
        # (FORMAT, outcome) -> draws: the stream's lines counter (posttrain_exporter_lines_total)
        self.counts: Counter[tuple[str, str]] = Counter() if counts is None else counts
        self.emitted = 0  # training records made here
        self._family: str | None = None  # the training bar's description, digits taken out
        self._bar = _Bar()
        self._last_step = -1
        self._after_clear = False  # a bar was cleared since the last draw: the next one redraws it
        self._held: Record | None = None  # made at a set_postfix() draw, released at the next draw
        self._names: dict[str | None, tuple[str, str]] = {}  # _name's results
        # Descriptions (as drawn) of bars that are not the training bar: draw() only counts them (while nothing
        # is held: see idle)
        self.refused: set[str | None] = set()

    def cleared(self) -> None:
        self._after_clear = True

    def draw(self, description: str | None, n: int, total: str, bracket: str, others: int) -> list[Record]:
        """A draw of a bar at count `n` whose bracket text may hold a postfix; `others`: the training records the run
        took so far, these included. The records it releases (its outcome is counted either way).

        A record is held until the next postfix draw (update()'s, which follows set_postfix()'s at once) or until
        `release()`: a line of the same step printed in between (a precise one) supersedes it."""
        out = self.release(others) if self._held is not None else _NONE
        named = self._names.get(description)
        if named is None:
            named = self._name(description)
        desc, family = named
        if family != self._family:
            if self._family is not None or _NOT_TRAINING.search(desc):
                if description is None or len(description) <= _MAX_NAMED:
                    self.refused.add(description)  # for good: the training bar, once chosen, stays
                self.counts[FORMAT, "not_training"] += 1
                return out
            self._family = family
        pairs = postfix_pairs(bracket)
        if not pairs:
            self._count("no_numbers")
            return out
        text = ", ".join(f"{k}={v}" for k, v in pairs)
        bar = self._bar
        if desc != bar.description or n < bar.last_n or total != bar.total:
            self._next_bar(bar, desc, total)
        # The same postfix drawn again at the same count is set_postfix() of equal values (3 significant digits
        # repeat), unless it is a redraw: after a clear (tqdm.write), or close() at the end of the bar.
        changed = text != bar.postfix or (
            n == bar.last_n and not self._after_clear and not (total.isdigit() and n >= int(total)))
        bar.last_n, bar.postfix, self._after_clear = n, text, False
        micro = bar.offset + n + 1
        step = micro // self.accumulation
        if not changed:
            self._count("repeat")
        elif micro % self.accumulation:
            self._count("accumulating")
        elif step == self._last_step:
            self._count("repeat")
        elif others > self.emitted:
            self._count("superseded")
        else:
            rec = postfix_record(pairs, step)
            if rec is None:
                self._count("no_numbers")
            elif rec.kind is not RecordKind.TRAIN:
                self._count("not_training")
            else:
                self._last_step, self._held = step, rec
        return out

    @property
    def idle(self) -> bool:
        """No record is held: a draw of a refused bar would only be counted."""
        return self._held is None

    def _name(self, description: str | None) -> tuple[str, str]:
        """The bar's description without its percentage, and its family (digits taken out); cached: a bar is drawn
        with few distinct percentages."""
        desc = _PERCENTAGE.sub("", description.strip()).rstrip() if description else ""
        named = (desc, _DIGITS.sub("#", desc))
        if description is not None and len(description) > _MAX_NAMED:
            return named
        if len(self._names) >= _MAX_NAMES or len(self.refused) >= _MAX_NAMES:
            self._names.clear()
            self.refused.clear()
        self._names[description] = named
        return named

    def release(self, others: int) -> list[Record]:
        """The held record, unless training records from elsewhere reached the run since (`others`: all of the
        run's so far): then it is superseded."""
        rec, self._held = self._held, None
        if rec is None:
            return _NONE
        if others > self.emitted:
            self._count("superseded")
            return _NONE
        self.emitted += 1
        self._count("record")
        return [rec]

    def _count(self, outcome: str) -> None:
        self.counts[FORMAT, outcome] += 1

    @staticmethod
    def _next_bar(bar: _Bar, desc: str, total: str) -> None:
        """Another bar of the family (the next epoch or episode, or a restart): where its counts begin."""
        count = int(total) if total.isdigit() else max(bar.last_n, 0)
        m = _EPISODE.search(desc) or _EPOCH_OF.search(desc)
        if m is not None:
            index = int(m.group(1)) - (m.re is _EPISODE)
            bar.offset = max(index, 0) * count
        elif bar.description is not None:
            bar.offset += int(bar.total) if bar.total.isdigit() else max(bar.last_n, 0)
        bar.description, bar.total, bar.last_n, bar.postfix = desc, total, -1, ""
