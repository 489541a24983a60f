"""The pipeline of a console log (a followed file or a stream): framing, the parsers its format allows, the step
clock, and the run its records go to (the trainer's, once a log of `run` turns out to be its feed: runset.py)."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.parsers.chain import LineParserChain
from exporter.pipeline import ConsoleStream
from exporter.runset import RunSet

# A record printed before its progress-bar redraw waits at most this long for it.
REDRAW_WAIT_SECONDS = 2.0


def console_stream(spec: LogSpec, runs: RunSet) -> ConsoleStream:
    cfg = runs.cfg
    return ConsoleStream(runs.console_sink(spec), runs.stats[spec.run],  # type: ignore[arg-type]  (as a RunState)
                         LineParserChain(spec.format, cfg.formats), cfg.limits.max_line_length,
                         spec.gradient_accumulation)
