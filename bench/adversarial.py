"""Worst-case time of one hostile line: each format's parser, the console pipeline and `dump`.

A log can hold anything a program prints: a degenerate completion of 100k `x`, a number of 100k
digits, thousands of `{`. The exporter reads every line; one that makes a parser backtrack
quadratically freezes /metrics and /healthz for minutes. Each shape below is built at --chars
characters and timed once:

  parsers   LineParserChain per format (auto and every pinned built-in), in this process
  console   the whole ConsoleStream (framer, parser chain, step clock, run), the line and a newline
  trainer   TrainerStateReader on a trainer_state.json whose one log entry is the line (JSON shapes)
  dump      `posttrain-exporter dump` of a file holding the line (a child process: Python start-up,
            about 0.3 s, is included; the start-up of an empty file is printed apart)
  stdin     `dump -` of one line without a newline, --chars and --stdin-mb long

An exception is reported in place of a time (the line would have crashed the exporter).

    .venv/bin/python bench/adversarial.py                 # every shape at 100k characters
    .venv/bin/python bench/adversarial.py --chars 20000 --no-dump
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.instruments.keymap import KeyMap
from exporter.parsers.chain import BUILTIN_FORMATS, LineParserChain
from exporter.parsers.record import ParseError
from exporter.pipeline import ConsoleStream, IngestStats
from exporter.runstate import RunState
from exporter.sources.trainer_state import TrainerStateReader

REPO = Path(__file__).resolve().parents[1]


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def _pairs(n: int, pair: Callable[[int], str], sep: str) -> str:
    out, size, i = [], 0, 0
    while size < n:
        p = pair(i)
        out.append(p)
        size += len(p) + len(sep)
        i += 1
    return sep.join(out)


# name -> builder of a line of about n characters
SHAPES: dict[str, Callable[[int], str]] = {
    "word_after_eq": lambda n: "a=" + "x" * n,
    "word_then_eq": lambda n: "x" * n + "=1",
    "eq_then_words": lambda n: "lr=1 " + _repeat("completion ", n),
    "digits_after_eq": lambda n: "loss=" + "1" * n + "x",
    "digits_dot_after_eq": lambda n: "loss=" + _repeat("1.", n),
    "digit_run": lambda n: "1" * n,
    "json_digits": lambda n: '{"step": 3, "loss": ' + "9" * n + "}",
    "json_step_digits": lambda n: '{"step": ' + "9" * n + ', "loss": 1}',
    "json_deep": lambda n: '{"a": ' + "[" * (n // 2) + "]" * (n // 2) + "}",
    "json_deep_open": lambda n: _repeat('{"a":', n),
    "json_quotes": lambda n: '{"' + '\\"' * (n // 2),
    "open_braces": lambda n: "{" * n,
    "hf_open_braces": lambda n: _repeat("{'", n),
    "single_quotes": lambda n: "'" * n,
    "double_quotes": lambda n: '"' * n,
    "hf_unclosed_value": lambda n: "{'a': '" + "x" * n,
    "hf_quotes_in_value": lambda n: "{'a': '" + "'" * n + "}",
    "hf_pairs_unclosed": lambda n: "{" + _pairs(n, lambda i: f"'k{i}': {i}", ", "),
    "hf_pairs_new_shape": lambda n: "{" + _pairs(n, lambda i: f"'k{i}': '{i}'", ", ") + "}",
    "hf_wrapped": lambda n: "{'a': np.float64(" + "(" * n + ")}",
    "hf_long_key": lambda n: "{'" + "k" * n + "': 1.0}",
    "kv_chain": lambda n: _pairs(n, lambda i: f"k{i}={i}", " "),
    "kv_chain_bad_tail": lambda n: _pairs(n, lambda i: f"k{i}={i}", " ") + " x",
    "kv_chain_glued": lambda n: _pairs(n, lambda i: f"k{i}={i}", "|"),
    "kv_step_inf": lambda n: "step=inf " + _pairs(n, lambda i: f"k{i}={i}", " "),
    "verl_chain": lambda n: "step:1 - " + _pairs(n, lambda i: f"k{i}:{i}", " - "),
    "verl_prefix_digits": lambda n: "(TaskRunner pid=" + "1" * n,
    "verl_prefix_digits_cr": lambda n: "(TaskRunner pid=" + "1" * n + "\rdone",
    "verl_step_digits": lambda n: "step:" + "9" * n + " - a:1",
    "openrlhf_chain": lambda n: "Global step 1: {" + _pairs(n, lambda i: f"'k{i}': {i}", ", ") + "}",
    "openrlhf_repeat": lambda n: _repeat("Global step 1: ", n),
    "bar_pipes": lambda n: "|" * n,
    "bar_glyphs": lambda n: " 4%|" + "#" * n + "| 13/300 [",
    "bar_digits": lambda n: " 4%|#| " + "1" * n + "/300 [00:01<00:36]",
    "ansi_open": lambda n: _repeat("\x1b[", n),
    "ansi_digits": lambda n: "\x1b[" + "1" * n,
    "spaces": lambda n: " " * n,
    "step_line_digits": lambda n: "step:" + "1" * n,
    "non_ascii": lambda n: "a=" + "\u00e9" * n,
    # what may stand before a record (parsers/prefix.py), Ray's suffix, containers, metrics blocks (issue 16)
    "prose_then_dict": lambda n: _repeat("kwargs ", n) + "{'a': 1}",
    "rank_tags_then_dict": lambda n: _repeat("[r0]:", n) + "{'a': 1}",
    "ray_actors_then_dict": lambda n: _repeat("(W pid=1, ip=10.0.0.5) ", n) + "{'a': 1}",
    "timestamps_then_dict": lambda n: _repeat("2026-03-14T09:12:44.5Z ", n) + "{'a': 1}",
    "spaces_then_dict": lambda n: " " * n + "{'a': 1, 'epoch': 1}",
    "digits_then_dict": lambda n: "1" * n + ": {'a': 1}",
    "ray_repeated_spaces": lambda n: "x" + " " * n + "[repeated 2x across cluster]",
    "ray_repeated_many": lambda n: _repeat("[repeated ", n) + "2x across cluster]",
    "hf_container_brackets": lambda n: "{'a': " + "[" * n + "}",
    "hf_quotes_brackets": lambda n: "{'a': 1, " + _repeat("'[", n) + "}",
    "hf_colons_brackets": lambda n: "{'a': 1, " + _repeat(": ", n) + "[}",
    "metrics_entry_key": lambda n: "***** train metrics *****\n  " + "k" * n + " = 1",
    "metrics_entry_spaces": lambda n: "***** train metrics *****\n" + " " * n + "k = 1",
    "metrics_entry_value": lambda n: "***** train metrics *****\n  k = " + _repeat("1:", n),
    "metrics_header_long": lambda n: "***** " + "w" * n + " metrics *****",
    "bar_long_description": lambda n: "d" * n + " 100%|#| 4/4 [00:01<00:00]",
    "bar_spaces_percent": lambda n: " " * n + "4%|#| 4/4 [00:01<00:00]",
}
JSON_SHAPES = ("json_digits", "json_step_digits", "json_deep", "json_deep_open", "json_quotes")
FORMATS = ["auto", *BUILTIN_FORMATS]


def timed(fn: Callable[[], object]) -> tuple[float, str]:
    t = time.perf_counter()
    try:
        fn()
        note = ""
    except ParseError:
        note = ""  # "mine, but broken": the exporter counts it
    except Exception as e:  # the point is to see what escapes
        note = f"raised {type(e).__name__}"
    return time.perf_counter() - t, note


def console(line: str) -> None:
    run = RunState("bench", KeyMap())
    stream = ConsoleStream(run, IngestStats(), LineParserChain())
    stream.feed(line + "\n")
    stream.finish()
    run.refresh()


def trainer_state(line: str, tmp: Path) -> None:
    path = tmp / "trainer_state.json"
    path.write_text('{"log_history": [' + line + "]}", encoding="utf-8")
    TrainerStateReader(str(path)).poll()


def dump(args: list[str], stdin: bytes | None = None) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "exporter", "dump", "--no-gpu", *args]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, cwd=REPO, timeout=3600)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t, "timed out"
    wall = time.perf_counter() - t
    return wall, "" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.decode()[-80:].strip()!r}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chars", type=int, default=100_000, help="length of each hostile line (default 100k)")
    ap.add_argument("--stdin-mb", type=float, default=16.0, help="size of the long stdin line (default 16 MB)")
    ap.add_argument("--no-dump", action="store_true", help="skip the child processes (dump, stdin)")
    ap.add_argument("--shapes", help="comma-separated subset of the shapes")
    args = ap.parse_args()
    shapes = args.shapes.split(",") if args.shapes else list(SHAPES)
    worst: tuple[float, str] = (0.0, "")
    escapes = 0
    tmp = Path(tempfile.mkdtemp(prefix="adversarial-"))

    def report(shape: str, where: str, seconds: float, note: str) -> None:
        nonlocal worst, escapes
        if note.startswith(("raised", "exit", "timed")):
            escapes += 1
        if seconds > worst[0]:
            worst = (seconds, f"{shape} / {where}")
        print(f"{shape:<22}{where:<12}{seconds:>10.4f}  {note}", flush=True)

    empty = tmp / "empty.log"
    empty.write_text("")
    startup = min(dump([str(empty)])[0] for _ in range(3)) if not args.no_dump else 0.0
    print(f"{len(shapes)} shapes of {args.chars:,} characters; dump start-up on an empty file: {startup:.3f} s")
    print(f"{'shape':<22}{'where':<12}{'seconds':>10}  note")
    for shape in shapes:
        line = SHAPES[shape](args.chars)
        for fmt in FORMATS:
            chain = LineParserChain(fmt)
            report(shape, fmt, *timed(lambda c=chain, text=line: c.parse(text)))
        report(shape, "console", *timed(lambda text=line: console(text)))
        if shape in JSON_SHAPES:
            report(shape, "trainer", *timed(lambda text=line: trainer_state(text, tmp)))
        if not args.no_dump:
            path = tmp / f"{shape}.log"
            path.write_text(line + "\n", encoding="utf-8")
            report(shape, "dump", *dump([str(path)]))
    if not args.no_dump:
        for size in (args.chars, int(args.stdin_mb * 1e6)):
            wall, note = dump(["-"], stdin=b"x" * size)
            report(f"stdin_{size:,}", "dump -", wall, note)
    print(f"worst line: {worst[0]:.3f} s ({worst[1]}); exceptions or failed exits: {escapes}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())
