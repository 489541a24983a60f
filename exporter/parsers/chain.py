"""Choosing the parser for a line: automatic detection, or the one format a config pins."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exporter.parsers.jsonl import parse_json_line
from exporter.parsers.katib import parse_katib_anywhere, parse_katib_strict
from exporter.parsers.pydict import parse_hf_dict, parse_openrlhf
from exporter.parsers.record import Record
from exporter.parsers.userregex import RegexFormat
from exporter.parsers.verl import parse_verl_console

LineParser = Callable[[str], Record | None]

BUILTIN_FORMATS: dict[str, LineParser] = {
    "hf": lambda line: _hf_anywhere(line),
    "json": parse_json_line,
    "verl": parse_verl_console,
    "openrlhf": parse_openrlhf,
    "katib": parse_katib_anywhere,
}
# Not a line format: trainer_state.json is read whole (sources/trainer_state.py).
FILE_FORMATS = frozenset({"trainer_state", "tensorboard"})


def _hf_anywhere(line: str) -> Record | None:
    # Launchers prefix lines (`[default0]:`, logging headers); the dict runs to the line's end.
    i = line.find("{'")
    return None if i < 0 else parse_hf_dict(line[i:])


class LineParserChain:
    """Per line: the pinned format only, or each format in turn until one claims the line.

    A parser returns None for "not mine" and raises ParseError for "mine, but broken"."""

    def __init__(self, fmt: str = "auto", user_formats: Sequence[RegexFormat] = ()) -> None:
        users = {f.name: f.parse for f in user_formats}
        if fmt == "auto":
            # Cheap, specific formats first; user regexes before the loose katib pairs.
            self._parsers: list[LineParser] = [self._auto_structured, *users.values(), parse_katib_strict]
        elif fmt in users:
            self._parsers = [users[fmt]]
        else:
            self._parsers = [BUILTIN_FORMATS[fmt]]

    @staticmethod
    def _auto_structured(line: str) -> Record | None:
        if line.startswith("{'"):
            return parse_hf_dict(line)  # the HF console line as the framer hands it: the common case
        s = line.lstrip()
        if s.startswith('{"'):
            return parse_json_line(s)
        if "{'" in line:
            rec = parse_openrlhf(line) if "Global step" in line else None
            return rec if rec is not None else _hf_anywhere(line)
        if "step:" in line:
            return parse_verl_console(line)
        return None

    def parse(self, line: str) -> Record | None:
        for parser in self._parsers:
            rec = parser(line)
            if rec is not None:
                return rec
        return None
