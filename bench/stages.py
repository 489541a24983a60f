"""Where the exporter's time goes, stage by stage, on a log already in memory.

Drives the exporter's own classes over the same text, each stage adding one to the last:
  framing   the console framer alone (\\r/\\n segments, bar draws, clears, lines) into a sink that does nothing
  +parse    ... and the parser chain on every line
  +stream   ... and the whole console stream (step clock, line counters), records handed to a run that drops them
  full      ... and a real RunState: batches, series, per-record checks, then one refresh (the window statistics)
Each stage runs --repeat times; the minimum CPU time (process_time) is reported, which a busy
shared machine disturbs less than wall time. Python start-up and file reading are not included.

    .venv/bin/python bench/make_log.py --size-mb 20 -o bench/out/trl_20mb.log
    .venv/bin/python bench/stages.py bench/out/trl_20mb.log
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from exporter.console.framing import ConsoleFramer
from exporter.entry import tune_gc
from exporter.instruments.keymap import KeyMap
from exporter.parsers.chain import LineParserChain
from exporter.pipeline import ConsoleStream, IngestStats
from exporter.runstate import RunState


class DropSink:
    def bar(self, n: int, total: str, description: str | None) -> None: ...
    def clear(self) -> None: ...
    def line(self, text: str) -> None: ...
    def abandoned(self, text: str) -> None: ...
    def overlong(self) -> None: ...

    def redrawn_run(self, columns: list[tuple[str, ...]], start: int, stop: int) -> int:
        return stop  # tqdm.write's lines, taken at once as the console stream takes them



class ParseSink(DropSink):
    def __init__(self) -> None:
        self.parsers = LineParserChain()

    def line(self, text: str) -> None:
        self.parsers.parse(text)

    def line_run(self, texts: list[str]) -> None:  # the framer's runs of plain lines, read as the stream reads them
        if self.parsers.parse_run(texts) is None:
            for t in texts:
                self.parsers.parse(t)

    def redrawn_run(self, columns: list[tuple[str, ...]], start: int, stop: int) -> int:
        return start + len(self.parsers.dict_records(columns[4], start, stop))  # the rest: line() by line()


class DropRun:
    name = "bench"

    def ingest(self, rec) -> None: ...
    def ingest_many(self, recs) -> None: ...


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tune_gc()  # as the command does
    text = args.log.read_bytes().decode("utf-8", "replace")
    chunks = [text[i : i + (1 << 20)] for i in range(0, len(text), 1 << 20)]  # as the file reader hands them out

    def framing(sink) -> None:
        framer = ConsoleFramer(sink)
        for c in chunks:
            framer.feed(c)
        framer.flush()

    def stream(run) -> IngestStats:
        stats = IngestStats()
        s = ConsoleStream(run, stats, LineParserChain())
        for c in chunks:
            s.feed(c)
        s.finish()
        if isinstance(run, RunState):
            run.refresh()
        return stats

    records = sum(n for (_, outcome), n in stream(DropRun()).lines.items() if outcome == "record")
    stages: list[tuple[str, Callable[[], object]]] = [
        ("framing", lambda: framing(DropSink())),
        ("+parse", lambda: framing(ParseSink())),
        ("+stream", lambda: stream(DropRun())),
        ("full", lambda: stream(RunState("bench", KeyMap()))),
    ]
    print(f"{args.log}: {len(text) / 1e6:.1f} MB, {records:,} records; min CPU time of {args.repeat} runs")
    print(f"{'stage':<10}{'seconds':>10}{'us/record':>12}")
    for name, fn in stages:
        best = float("inf")
        for _ in range(args.repeat):
            t = time.process_time()
            fn()
            best = min(best, time.process_time() - t)
        print(f"{name:<10}{best:>10.3f}{best / records * 1e6:>12.1f}")


if __name__ == "__main__":
    main()
