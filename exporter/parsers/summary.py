"""The Trainer's end-of-run metrics blocks, which `trainer.log_metrics(split, metrics)` prints:

    ***** train metrics *****
      epoch                    =        2.0
      total_flos               =    12345GF
      train_loss               =     0.2231
      train_runtime            = 0:01:23.45

They summarise the run: each entry line becomes a summary record of its one key (exported as
pass-through, never a training step), whatever its split (train, eval, predict). Values are given back in
the Trainer's own units: `H:MM:SS.ss` durations in seconds, `GF` (total_flos >> 30) in flos, `MB` in bytes.
A block ends at the first line that is not an entry."""

from __future__ import annotations

import re

from exporter.parsers.prefix import after_prefix
from exporter.parsers.record import Record, RecordKind
from exporter.parsers.values import Skip, count_skip, to_float

FMT = "hf_metrics"
_HEADER = re.compile(r"\*{5} [\w-]{1,64}+ metrics \*{5}\s*+")
_ENTRY = re.compile(r"\s*+([^\s=]{1,256}+)\s*+=\s*+(\S[^=]*+)")
# datetime.timedelta's str with hundredths: `0:01:23.45`, `1 day, 2:03:04.50`
_DURATION = re.compile(r"(?:(\d{1,9}+) days?, )?+(\d{1,9}+):(\d\d):(\d\d)(?:\.(\d{1,9}+))?+")
_UNITS = {"GF": float(1 << 30), "MB": float(1 << 20)}


class MetricsBlocks:
    """Follows one stream's lines: after a block's header, its entries are summary records."""

    def __init__(self) -> None:
        self.active = False  # the last line was a header or an entry

    def header(self, line: str) -> bool:
        """`line` opens a block (it is no record itself)."""
        self.active = "metrics *****" in line and _HEADER.fullmatch(after_prefix(line)) is not None
        return self.active

    def entry(self, line: str) -> Record | None:
        """The entry on `line` as a summary record; None ends the block."""
        m = _ENTRY.fullmatch(after_prefix(line))
        if m is None:
            self.active = False
            return None
        key, raw = m.group(1), m.group(2).rstrip()
        values: dict[str, float] = {}
        skipped: dict[str, int] = {}
        try:
            values[key] = _value(raw)
        except Skip as s:
            count_skip(skipped, s.reason)
        rec = Record(values, FMT, skipped=skipped)
        rec.kind = RecordKind.SUMMARY
        return rec


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
