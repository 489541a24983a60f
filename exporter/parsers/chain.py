"""Choosing the parser for a line: automatic detection, or the one format a config pins."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exporter.parsers.fastpath import VerlConsoleFast
from exporter.parsers.jsonl import parse_json_line
from exporter.parsers.katib import parse_katib_anywhere, parse_katib_strict
from exporter.parsers.openrlhf_eval import parse_openrlhf_eval
from exporter.parsers.prefix import without_ray_suffix
from exporter.parsers.pydict import (
    parse_hf_dict,
    parse_hf_line,
    parse_openrlhf,
    parse_openrlhf_run,
    read_hf_dicts,
)
from exporter.parsers.record import Record
from exporter.parsers.summary import MetricsBlocks
from exporter.parsers.userregex import RegexFormat
from exporter.parsers.verl import parse_verl_console

LineParser = Callable[[str], Record | None]
# verl's console lines, read per record shape (parsers/fastpath.py)
_VERL = VerlConsoleFast()


def _verl(line: str) -> Record | None:
    return _VERL.parse(without_ray_suffix(line), parse_verl_console)


BUILTIN_FORMATS: dict[str, LineParser] = {
    "hf": lambda line: parse_hf_dict(line) if line.startswith("{'") else parse_hf_line(line),
    "json": parse_json_line,
    "verl": _verl,
    "openrlhf": lambda line: parse_openrlhf(line) or parse_openrlhf_eval(line),
    "katib": parse_katib_anywhere,
}
# Not a line format: trainer_state.json is read whole (sources/trainer_state.py).
FILE_FORMATS = frozenset({"trainer_state", "tensorboard"})


def known_formats(user_formats: Sequence[RegexFormat] = ()) -> list[str]:
    """Every name a log's format may be: `auto`, the built-in line formats, the file formats and the config's own."""
    return sorted({"auto", *BUILTIN_FORMATS, *FILE_FORMATS, *(f.name for f in user_formats)})


# Formats whose streams carry the Trainer's end-of-run metrics blocks (parsers/summary.py).
_WITH_METRICS_BLOCKS = frozenset({"auto", "hf"})


class LineParserChain:
    """Per line: the pinned format only, or each format in turn until one claims the line.

    A parser returns None for "not mine" and raises ParseError for "mine, but broken". One chain reads one
    stream: it follows the Trainer's metrics blocks across lines."""

    def __init__(self, fmt: str = "auto", user_formats: Sequence[RegexFormat] = ()) -> None:
        users = {f.name: f.parse for f in user_formats}
        if fmt == "auto":
            # Cheap, specific formats first; user regexes before the loose katib pairs.
            self._parsers: list[LineParser] = [self._auto_structured, *users.values(), parse_katib_strict]
        elif fmt in users:
            self._parsers = [users[fmt]]
        else:
            self._parsers = [BUILTIN_FORMATS[fmt]]
        self._blocks = MetricsBlocks() if fmt in _WITH_METRICS_BLOCKS else None
        self.metrics_blocks = self._blocks  # read by the console stream: a block that ended, to take
        # OpenRLHF's step lines come first where the chain tries them (auto: before user formats and katib).
        self._openrlhf_runs = fmt in ("auto", "openrlhf")
        self._dict_lines = fmt in ("auto", "hf")  # formats whose parse() reads a `{'` line with parse_hf_dict first
        self.block_line = False  # the last line parse() read was a metrics block's header or entry

    def parse_run(self, texts: list[str]) -> list[Record] | None:
        """[parse(text) for text in texts] when every line is a record of a shape read at once (OpenRLHF's step
        lines; parsers/fastpath.py), without a call per line; None: parse them one by one."""
        blocks = self._blocks
        if self._openrlhf_runs and (blocks is None or not blocks.active) and "Global step" in texts[0]:
            return parse_openrlhf_run(texts)
        return None

    def dict_records(self, texts: Sequence[str], start: int, stop: int) -> list[Record]:
        """parse(text) for the leading texts[start:stop] that are HF dict lines (`{'...}`, whole) read to a record;
        stops at the first that is not one (it is left to parse())."""
        if not self._dict_lines or (self._blocks is not None and self._blocks.active):
            return []
        out: list[Record] = []
        i = start
        while i < stop:
            got = read_hf_dicts(texts, i, stop)  # the lines of learned shapes, at once
            out += got
            i += len(got)
            if i == stop:
                break
            text = texts[i]
            if not text.startswith("{'"):
                break
            try:
                rec = parse_hf_dict(text)  # what parse() would call first, and all it would call for a record
            except Exception:  # ParseError or a parser bug: parse() counts it
                break
            if rec is None:
                break
            out.append(rec)
            i += 1
        return out

    @staticmethod
    def _auto_structured(line: str) -> Record | None:
        if line.startswith("{'"):
            return parse_hf_dict(line)  # the HF console line as the framer hands it: the common case
        s = line.lstrip()
        if s.startswith('{"'):
            return parse_json_line(s)
        if "{'" in line:
            line = without_ray_suffix(line)
            rec = parse_openrlhf(line) if "Global step" in line else (
                parse_openrlhf_eval(line) if "eval_metrics: {" in line else None)
            return rec if rec is not None else parse_hf_line(line)
        if "step:" in line:
            return _verl(line)
        return None

    @property
    def ended_block(self) -> Record | None:
        """A metrics block that the last line parsed ended, as one record (parsers/summary.py); taken by reading it:
        the reader ingests it before that line's own record. None: none ended."""
        blocks = self._blocks
        if blocks is None or blocks.ended is None:
            return None
        rec, blocks.ended = blocks.ended, None
        return rec

    def block_tolerance(self) -> dict[str, float]:
        """Per key of the last block taken: how far its printed value may be from the value it rounds."""
        return {} if self._blocks is None else self._blocks.tolerance

    def close_block(self) -> Record | None:
        """The input ended (or went quiet): an open metrics block's record."""
        return None if self._blocks is None else self._blocks.close()

    def parse(self, line: str) -> Record | None:
        """The line's record, None when it is none (or an entry of a metrics block, gathered: see block_line)."""
        blocks = self._blocks
        self.block_line = False
        if blocks is not None and blocks.active and blocks.entry(line):
            self.block_line = True
            return None
        for parser in self._parsers:
            rec = parser(line)
            if rec is not None:
                return rec
        if blocks is not None:
            self.block_line = blocks.header(line)
        return None
