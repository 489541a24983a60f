"""Fuzzing the exporter with mutated real log lines.

Lines of the real TRL logs (tests/fixtures/trl/*/{combined,stdout}.log), some rewritten into the other
formats the exporter reads (JSON lines, verl's file logger and console, OpenRLHF, Katib), are damaged
(bytes flipped, truncated, quotes and braces duplicated or removed, numbers made huge or inf/nan/-0,
digit runs, deep nesting, invalid UTF-8, 10k-character words, JSON escapes of lone surrogates) and fed
as bytes, through the decoder the file follower uses, to the real pipeline: ConsoleStream (framer, parser
chain, step clock) into a RunState, scraped by the real collector every --scrape-every lines.

A valid canary line follows every few damaged ones: each must arrive, in order, and the last one's value
must be exported. An exception anywhere is caught, counted and printed (there must be none), as is a
scrape that does not render or does not parse as the Prometheus text format.

    .venv/bin/python bench/fuzz.py                     # 1e6 lines: lines/s, exceptions caught, peak RSS
    .venv/bin/python bench/fuzz.py --lines 200000 --formats auto,hf,json,verl,openrlhf,katib
"""

from __future__ import annotations

import argparse
import codecs
import random
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config
from exporter.exposition.collector import ExporterCollector
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import Record
from exporter.pipeline import ConsoleStream

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "trl"
CANARY_KEY = "fuzz_canary"
CANARY_EVERY = 7  # damaged lines between two canaries

_PAIR = re.compile(rb"'([^']*)': '?([^',}]*)'?")
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_SPECIAL_NUMBERS = [b"inf", b"-inf", b"nan", b"NaN", b"-0", b"Infinity", b"1e999", b"-1e400", b"9223372036854775808",
                    b"18446744073709551616", b"9007199254740993", b"-1", b"1.5", b"0x1F", b"1_000", b"None", b"null",
                    b"true", b"np.float64(inf)", b"tensor(nan)"]
_QUOTE_OR_BRACE = re.compile(rb"['\"{}\[\]]")
_SPECIAL_BYTES = b"\x00\x1b\r\n\t '\"{}[]:=,|/\\-.\x7f\x80\xc3\xe2\xff"


def seed_lines() -> list[bytes]:
    """Every line of the real logs (\\n-split, with the \\r-separated bar draws they hold)."""
    lines: list[bytes] = []
    for path in sorted(FIXTURES.glob("*/combined.log")) + sorted(FIXTURES.glob("*/stdout.log")):
        lines += [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
    return lines


# --- the real line in another format --------------------------------------------------------------------

def _pairs(line: bytes) -> list[tuple[bytes, bytes]]:
    return _PAIR.findall(line)


def _json_members(line: bytes) -> bytes:
    return b", ".join(b'"%s": %s' % (k, v if _NUMBER.fullmatch(v) else b'"' + v + b'"') for k, v in _pairs(line))


def as_json(line: bytes, step: int) -> bytes:
    return b'{"step": %d, %s}' % (step, _json_members(line))


def as_verl_json(line: bytes, step: int) -> bytes:
    return b'{"step": %d, "data": {%s}}' % (step, _json_members(line))


def as_katib(line: bytes, step: int) -> bytes:
    return b" ".join(b"%s=%s" % kv for kv in _pairs(line)) + b" step=%d" % step


def as_verl_console(line: bytes, step: int) -> bytes:
    return b"(TaskRunner pid=87031) step:%d - " % step + b" - ".join(b"%s:%s" % kv for kv in _pairs(line))


def as_openrlhf(line: bytes, step: int) -> bytes:
    return b"Global step %d: " % step + line[line.find(b"{"):]


CONVERSIONS: list[Callable[[bytes, int], bytes]] = [as_json, as_verl_json, as_katib, as_verl_console, as_openrlhf]


# --- damage ---------------------------------------------------------------------------------------------

def _at(line: bytes, rng: random.Random) -> int:
    return rng.randint(0, len(line))


def flip_bytes(line: bytes, rng: random.Random) -> bytes:
    b = bytearray(line)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] = rng.choice(_SPECIAL_BYTES) if rng.random() < 0.5 else rng.randrange(256)
    return bytes(b)


def truncate(line: bytes, rng: random.Random) -> bytes:
    return line[: _at(line, rng)]


def quotes_and_braces(line: bytes, rng: random.Random) -> bytes:
    """One to four quotes or braces removed, doubled or tripled."""
    spots = [m.start() for m in _QUOTE_OR_BRACE.finditer(line)]
    for i in sorted(rng.sample(spots, min(len(spots), rng.randint(1, 4))), reverse=True):
        line = line[:i] + line[i:i + 1] * rng.choice((0, 2, 3)) + line[i + 1:]
    return line


def huge_number(line: bytes, rng: random.Random) -> bytes:
    numbers = list(_NUMBER.finditer(line))
    if not numbers:
        return line + b"9" * rng.choice((20, 400, 5000))
    m = rng.choice(numbers)
    huge = rng.choice((b"9" * rng.choice((19, 20, 309, 400, 5000)), b"1e" + b"9" * rng.randint(3, 8),
                       b"-" + b"9" * 400, b"0." + b"0" * 400 + b"1"))
    return line[: m.start()] + huge + line[m.end():]


def special_number(line: bytes, rng: random.Random) -> bytes:
    numbers = list(_NUMBER.finditer(line))
    if not numbers:
        return line
    m = rng.choice(numbers)
    return line[: m.start()] + rng.choice(_SPECIAL_NUMBERS) + line[m.end():]


def digit_run(line: bytes, rng: random.Random) -> bytes:
    i = _at(line, rng)
    return line[:i] + b"7" * rng.choice((50, 1000, 10_000)) + line[i:]


def deep_nesting(line: bytes, rng: random.Random) -> bytes:
    i, depth = _at(line, rng), rng.choice((70, 1000, 5000))
    unit = rng.choice((b"[", b"{", b'{"a": ', b"{'a': ", b"("))
    closing = {b"[": b"]", b"{": b"}", b'{"a": ': b"}", b"{'a': ": b"}", b"(": b")"}[unit]
    return line[:i] + unit * depth + closing * rng.choice((0, depth)) + line[i:]


def invalid_utf8(line: bytes, rng: random.Random) -> bytes:
    i = _at(line, rng)
    return line[:i] + rng.choice((b"\xff\xfe", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80")) + line[i:]


def long_word(line: bytes, rng: random.Random) -> bytes:
    i = _at(line, rng)
    return line[:i] + rng.choice((b"x", b"ab", b"=", b"'", b'"', b"\\", b" ", b"\x1b[")) * 10_000 + line[i:]


def json_escape(line: bytes, rng: random.Random) -> bytes:
    i = line.find(b'"')
    return line if i < 0 else line[: i + 1] + rng.choice((b"\\ud800", b"\\udfff", b"\\u0000", b"\\x")) + line[i + 1:]


# (mutation, weight): the ones that make a line thousands of characters longer are drawn less often.
MUTATIONS: list[tuple[Callable[[bytes, random.Random], bytes], int]] = [
    (flip_bytes, 4), (truncate, 3), (quotes_and_braces, 4), (huge_number, 2), (special_number, 4), (digit_run, 1),
    (deep_nesting, 1), (invalid_utf8, 3), (long_word, 1), (json_escape, 2),
]


def damaged_lines(n: int, seed: int, structured_share: float = 0.4) -> Iterator[tuple[str, bytes, int]]:
    """n damaged lines (without their \\n), as (stream, line, step): the real lines in their order, each with
    1-3 mutations; a share of them first rewritten into another format with a rising step (the `structured`
    stream, where every record carries its step), the others left in the TRL console stream."""
    rng = random.Random(seed)
    seeds = seed_lines()
    mutations, weights = zip(*MUTATIONS, strict=True)
    step = 0
    for i in range(n):
        line, stream = seeds[i % len(seeds)], "console"
        if _pairs(line) and rng.random() < structured_share:
            step += 1
            line, stream = rng.choice(CONVERSIONS)(line, step), "structured"
        for mutate in rng.choices(mutations, weights, k=rng.randint(1, 3)):
            line = mutate(line, rng)
        yield stream, line, step


# A valid line of each format, holding the canary's number; auto reads them all.
CANARIES: dict[str, Callable[[int, int], bytes]] = {
    "auto": lambda i, step: b"{'%s': '%d'}" % (CANARY_KEY.encode(), i),
    "hf": lambda i, step: b"{'%s': %d}" % (CANARY_KEY.encode(), i),
    "json": lambda i, step: b'{"%s": %d}' % (CANARY_KEY.encode(), i),
    "katib": lambda i, step: b"%s=%d" % (CANARY_KEY.encode(), i),
    "verl": lambda i, step: b"step:%d - %s:%d" % (step, CANARY_KEY.encode(), i),
    "openrlhf": lambda i, step: b"Global step %d: {'%s': %d}" % (step, CANARY_KEY.encode(), i),
}


# --- the harness ----------------------------------------------------------------------------------------

class Harness:
    """One exporter; per pinned format, a console and a structured stream, each into its own run."""

    def __init__(self, formats: list[str]) -> None:
        self.exporter = Exporter(Config(), [])
        self.streams: dict[str, list[tuple[str, ConsoleStream, codecs.IncrementalDecoder]]] = {}
        self.arrived: dict[str, list[float]] = {}
        for kind in ("console", "structured"):
            self.streams[kind] = []
            for fmt in formats:
                run = self.exporter.run_state(f"{kind}-{fmt}")
                self.arrived[run.name] = []
                run.ingest = self._counting(run.ingest, self.arrived[run.name])  # type: ignore[method-assign]
                stream = ConsoleStream(run, self.exporter.stats[run.name], LineParserChain(fmt))
                self.streams[kind].append((fmt, stream, codecs.getincrementaldecoder("utf-8")("replace")))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ExporterCollector(self.exporter))
        self.exceptions: list[str] = []
        self.scrapes = 0

    @staticmethod
    def _counting(ingest: Callable[[Record], None], arrived: list[float]) -> Callable[[Record], None]:
        def counted(rec: Record) -> None:
            if CANARY_KEY in rec.shape:
                arrived.append(rec.values[CANARY_KEY])
            ingest(rec)
        return counted

    def feed(self, kind: str, data: bytes) -> None:
        for _, stream, decoder in self.streams[kind]:
            self._feed(stream, decoder.decode(data), data)

    def feed_canary(self, i: int, step: int) -> None:
        for kind in self.streams:
            for fmt, stream, decoder in self.streams[kind]:
                self._feed(stream, decoder.decode(CANARIES[fmt](i, step) + b"\n"), b"canary")

    def _feed(self, stream: ConsoleStream, text: str, data: bytes) -> None:
        try:
            stream.feed(text)
        except Exception:
            self.exceptions.append(f"{stream.run.name}: {traceback.format_exc()}\nafter {data[:300]!r}")

    def scrape(self, check_format: bool = True) -> str:
        self.scrapes += 1
        try:
            text = generate_latest(self.registry).decode()
            if check_format:
                for _ in text_string_to_metric_families(text):
                    pass
            return text
        except Exception:
            self.exceptions.append(f"scrape {self.scrapes}: {traceback.format_exc()}")
            return ""

    def finish(self) -> None:
        for streams in self.streams.values():
            for _, stream, _ in streams:
                try:
                    stream.finish()
                except Exception:
                    self.exceptions.append(f"{stream.run.name} finish: {traceback.format_exc()}")

    def internal_errors(self) -> int:
        return sum(st.parse_errors["unknown", "internal_error"] for st in self.exporter.stats.values())

    def lost_canaries(self, placed: int) -> dict[str, int]:
        """Per run, canaries that did not arrive (or arrived out of order)."""
        expected = [float(i) for i in range(placed)]
        return {run: placed - len(got) for run, got in self.arrived.items() if got != expected}


def run_fuzz(lines: int, seed: int, formats: list[str], scrape_every: int,
             progress: Callable[[int], None] | None = None) -> tuple[Harness, int]:
    """`lines` damaged lines, a canary after every CANARY_EVERY; returns the harness and the canaries placed."""
    h = Harness(formats)
    h.feed_canary(0, 0)  # first, so that its key is admitted before mutated keys fill max_keys
    placed = 1
    for i, (kind, line, step) in enumerate(damaged_lines(lines, seed), 1):
        h.feed(kind, line + b"\n")
        if i % CANARY_EVERY == 0:
            h.feed_canary(placed, step)
            placed += 1
        if i % scrape_every == 0:
            h.scrape(check_format=i % (scrape_every * 5) == 0)
            if progress:
                progress(i)
    h.finish()
    return h, placed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--formats", default="auto", help="parser chains, comma-separated: auto and the pinned "
                    "formats (hf, json, verl, openrlhf, katib); each line goes through every one")
    ap.add_argument("--scrape-every", type=int, default=10_000)
    args = ap.parse_args()
    formats = args.formats.split(",")
    t0 = time.perf_counter()

    def progress(i: int) -> None:
        if i % 100_000 == 0:
            print(f"  {i:,} lines, {i / (time.perf_counter() - t0):,.0f} lines/s", flush=True)

    h, placed = run_fuzz(args.lines, args.seed, formats, args.scrape_every, progress)
    text = h.scrape()
    wall = time.perf_counter() - t0
    lost = h.lost_canaries(placed)
    exported = all(f'{CANARY_KEY}",run="{run}"}} {placed - 1}.0' in text for run in h.arrived)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for e in h.exceptions[:5]:
        print(e, file=sys.stderr)
    print(f"{args.lines:,} damaged lines (seed {args.seed}), each through {len(formats)} parser chains "
          f"({','.join(formats)}), in {wall:.1f} s: {args.lines / wall:,.0f} lines/s")
    print(f"exceptions caught: {len(h.exceptions)}; parser failures caught by the stream: {h.internal_errors()}")
    print(f"canaries placed: {placed:,}; lost or out of order per run: {lost or 'none'}; last one exported: {exported}")
    print(f"scrapes: {h.scrapes}, last one {len(text):,} bytes; peak RSS {rss:.0f} MiB")
    return 1 if h.exceptions or h.internal_errors() or lost or not exported else 0


if __name__ == "__main__":
    sys.exit(main())
