"""The Trainer's end-of-run metrics blocks, which `trainer.log_metrics(split, metrics)` prints:

    ***** train metrics *****
      epoch                    =        2.0
      total_flos               =    12345GF
      train_loss               =     0.2231
      train_runtime            = 0:01:23.45

A block is one record: `train`'s a summary record (never a training step), `eval`'s (and `test`'s) an evaluation
record, any other split's a summary record. Values are given back in the Trainer's own units: `H:MM:SS.ss`
durations in seconds, `GF` (total_flos >> 30) in flos, `MB` in bytes. A block ends at the first line that is not
an entry (or at the end of the input). The block prints values rounded (4 decimals) that the Trainer logged
precisely just before, as a dict: `tolerance` says, per key, how far the printed value may be from the logged one,
so that the reader keeps the precise value (console stream, _take_block)."""

from __future__ import annotations

import re

from exporter.parsers.prefix import after_prefix
from exporter.parsers.record import Record, RecordKind
from exporter.parsers.values import Skip, count_skip, to_float

FMT = "hf_metrics"
_HEADER = re.compile(r"\*{5} ([\w-]{1,64}+) metrics \*{5}\s*+")
_ENTRY = re.compile(r"\s*+([^\s=]{1,256}+)\s*+=\s*+(\S[^=]*+)")
# datetime.timedelta's str with hundredths: `0:01:23.45`, `1 day, 2:03:04.50`
_DURATION = re.compile(r"(?:(\d{1,9}+) days?, )?+(\d{1,9}+):(\d\d):(\d\d)(?:\.(\d{1,9}+))?+")
_UNITS = {"GF": float(1 << 30), "MB": float(1 << 20)}
_EVAL_SPLITS = frozenset({"eval", "test"})
_MAX_ENTRIES = 4096  # entries of one block kept; a block longer than a Trainer prints is cut (the record's max_keys)


class MetricsBlocks:
    """Follows one stream's lines: a block's entries are gathered into one record, handed out (`ended`) when the
    line after the block comes, or at the end of the input (close)."""

    def __init__(self) -> None:
        self.active = False  # the last line was a header or an entry
        self.ended: Record | None = None  # a block that ended at the last line, for the reader to take
        self.tolerance: dict[str, float] = {}  # of the block in `ended`: how far each printed value may be off
        self._split = ""
        self._values: dict[str, float] = {}
        self._skipped: dict[str, int] = {}
        self._tolerance: dict[str, float] = {}

    def header(self, line: str) -> bool:
        """`line` opens a block (it is no record itself); a block open before it ends."""
        m = _HEADER.fullmatch(after_prefix(line)) if "metrics *****" in line else None
        self._end()
        if m is not None:
            self.active, self._split = True, m.group(1)
        return m is not None

    def entry(self, line: str) -> bool:
        """`line` is an entry of the open block (gathered); False ends the block (`ended` holds it)."""
        m = _ENTRY.fullmatch(after_prefix(line))
        if m is None:
            self._end()
            return False
        key, raw = m.group(1), m.group(2).rstrip()
        if len(self._values) < _MAX_ENTRIES:
            try:
                self._values[key] = _value(raw)
                self._tolerance[key] = _tolerance(raw)
            except Skip as s:
                count_skip(self._skipped, s.reason)
        return True

    def close(self) -> Record | None:
        """End of the input: the open block's record, if any."""
        self._end()
        rec, self.ended = self.ended, None
        return rec

    def _end(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._values or self._skipped:
            rec = Record(self._values, FMT, skipped=self._skipped)
            rec.kind = RecordKind.EVAL if self._split in _EVAL_SPLITS else RecordKind.SUMMARY
            self.ended, self.tolerance = rec, self._tolerance
        self._values, self._skipped, self._tolerance = {}, {}, {}


def _value(raw: str) -> float:
    """A value as `metrics_format` printed it, back in the Trainer's units; raises Skip."""
    d = _DURATION.fullmatch(raw)
    if d is not None:
        days, hours, minutes, seconds, fraction = d.groups()
        whole = int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + int(seconds)
        return whole + (float("0." + fraction) if fraction else 0.0)
    scale = _UNITS.get(raw[-2:])
    if scale is not None:
        return to_float(raw[:-2]) * scale
    return to_float(raw)


def _tolerance(raw: str) -> float:
    """How far `raw` may be from the value it prints, in the value's units: half its last digit (rounded to 4
    decimals), a whole one where the Trainer cuts (durations' hundredths, `>> 30` for GF)."""
    d = _DURATION.fullmatch(raw)
    if d is not None:
        return 10.0 ** -len(d.group(5) or "")  # hundredths cut, not rounded
    scale = _UNITS.get(raw[-2:])
    if scale is not None:
        return scale  # `>> 30` truncates: up to one unit
    mantissa, _, exponent = raw.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    try:
        return 0.5 * 10.0 ** (int(exponent or 0) - decimals)
    except (ValueError, OverflowError):
        return 0.0
