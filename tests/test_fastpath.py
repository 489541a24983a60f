"""The per-shape fast paths (parsers/fastpath.py, parsers/quoted.py, the framer's and the console stream's
runs of plain lines, RunState.ingest_many) change nothing: `dump`'s exposition is the same, byte for byte,
with them on and off (fastpath.ENABLED), on every fixture and on generated verl, OpenRLHF and JSON lines
with the cases a fast path could get wrong. Both sides run the current code, so a renamed metric changes
both alike; only the lines that measure time (timestamps, durations, process figures) are left out.

The exposition shows a pass-through key's last value only, so every record that reaches a run (its format,
kind, step, skipped values, keys and each number's bits, in order) is compared too."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re
import struct
from pathlib import Path

import pytest
from conftest import FIXTURES

from exporter import cli, pipeline
from exporter.console.steps import StepClock
from exporter.instruments.keymap import KeyMap
from exporter.parsers import chain, fastpath, jsonl, pydict, values
from exporter.parsers.quoted import QuotedShapes
from exporter.parsers.record import Record
from exporter.runstate import RunState

# Lines whose value is a clock reading or a duration: they differ between any two runs.
_CLOCK = re.compile(r"^(?:process_|python_gc_|posttrain_gpu_sampler_"
                    r"|[^{ ]*(?:timestamp|_seconds_(?:sum|count|bucket|total)|_duration|_cpu_seconds))")
FIXTURE_FILES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix not in (".py", ".md", ".txt")
                       and p.name != "run.json")


def _fresh_caches() -> None:
    """Shape caches start empty, so that each side learns its shapes from the first line on."""
    chain._VERL = fastpath.VerlConsoleFast()
    pydict._OPENRLHF_FAST = fastpath.OpenRLHFFast()
    pydict._QUOTED = QuotedShapes()
    jsonl._FAST = fastpath.JsonFast()


def described(r: Record) -> str:
    """What a record that reaches a run is: format, kind, step, skipped values, keys and each number's bits."""
    return f"{r.fmt} {r.kind} {r.step} {r.skipped} {r.shape} {[x.hex() for x in r.numbers]}"


def dump(path: Path, fast: bool, *args: str) -> str:
    """`posttrain-exporter dump` in this process, the fast paths on or off; the clock's lines left out."""
    saved, apply = fastpath.ENABLED, RunState._apply
    fastpath.ENABLED = fast
    _fresh_caches()
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    records: list[str] = []

    def applied(run: RunState) -> None:  # every record that reaches a run's history or pass-through, in order
        records.extend(f"{run.name} {described(r)}" for r in run._pending)
        apply(run)

    RunState._apply = applied  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(out):
            assert cli.main(["dump", "--no-gpu", *args, str(path)]) == 0
    finally:
        fastpath.ENABLED, RunState._apply = saved, apply  # type: ignore[method-assign]
    out.flush()
    text = out.buffer.getvalue().decode()  # type: ignore[attr-defined]
    return "\n".join([*(line for line in text.splitlines() if not _CLOCK.match(line)), *records])


def assert_same(path: Path, *args: str) -> str:
    fast, general = dump(path, True, *args), dump(path, False, *args)
    if fast != general:
        diff = [f"fast: {a}\ngeneral: {b}" for a, b in zip(fast.splitlines(), general.splitlines(), strict=False)
                if a != b]
        pytest.fail(f"{path.name}: the fast paths changed the exposition ({len(diff)} lines), first:\n"
                    + "\n".join(diff[:5]))
    return fast


def test_floats_reads_every_text_as_float_does() -> None:
    """values.floats (fastnumbers, float() for what it refuses) gives float()'s bits, NaN's sign included, and
    raises where float() raises: on texts float() refuses, NaN spellings, the edges of a double's range, and the
    reprs and long expansions of random bit patterns."""
    rng = random.Random(3)
    texts = [*ODD_VALUES, "nan", "-nan", "NaN", "+inf", "-Infinity", "iNfInItY", "1_0", "_1", "1__0", "1e-400",
             "0." + "0" * 400 + "1", "1" * 400, "9007199254740993", " 1.5 ", "\u00a01.5", "\u0663.\u0665", ".5", "5.",
             "nan(123)", "inf()", "1.5()", "1,5", "--1", "e5", "1e", ""]
    for _ in range(3000):
        x = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        texts += [repr(x), f"{x:.20e}", f"{x:.3g}", f"{x:.30f}"]

    def bits(t: str) -> str:
        try:
            x = float(t)
        except ValueError:
            return "ValueError"
        return "nan" + str(math.copysign(1, x)) if x != x else x.hex()

    for t in texts:
        try:
            got = values.floats([t])[0]
            read = "nan" + str(math.copysign(1, got)) if got != got else got.hex()
        except ValueError:
            read = "ValueError"
        assert read == bits(t), t
    good = [t for t in texts if bits(t) != "ValueError"]
    assert [x.hex() for x in values.floats(good) if x == x] == [float(t).hex() for t in good if float(t) == float(t)]
    with pytest.raises(ValueError):
        values.floats([*good, "nan(1)"])  # fastnumbers reads NaN there: the whole list is read by float()


def test_the_fixtures_are_there() -> None:
    assert len(FIXTURE_FILES) > 30 and any(p.name == "combined_unbuffered.log" for p in FIXTURE_FILES)


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_fixture_reads_the_same_with_the_fast_paths_off(path: Path) -> None:
    assert_same(path)


# --- generated lines --------------------------------------------------------------------------------------

KEYS = [f"actor/k{i}" for i in range(6)] + ["critic/score/mean", "timing_s/step", "perf/total_num_tokens"]
ODD_VALUES = ["nan", "inf", "-inf", "None", "abc", "'0.5'", "1_000", "np.float64(nan)", "np.float64(x)", "",
              "1e400", "-0.0", "0x10", "tensor(0.5)", "np.int64(3)", "True",
              "nan(1)", "-nan()", "1.7976931348623159e308", "4.9e-324", "2.4703282292062328e-324", "+.5E-3"]
ODD_JSON = ["NaN", "Infinity", "-Infinity", "null", "true", '"0.5"', '"abc"', '{"a": 1}', "[1]", "1" * 400, "-0.0",
            "1e400", "12345678901234567890", "-0", "01", "1.", "1.e5", "+1", "1E+2", "9" * 305, "-" + "9" * 320]


def _number(rng: random.Random) -> float:
    return rng.gauss(0, 1) * 10 ** rng.randrange(-4, 4)


def _values(rng: random.Random, i: int) -> dict[str, object]:
    """A record: usually the common shape, sometimes a key missing, moved, added or turned odd."""
    keys = list(KEYS)
    r = rng.random()
    if r < 0.05:
        del keys[rng.randrange(len(keys))]
    elif r < 0.10:
        keys.insert(rng.randrange(len(keys)), keys.pop(rng.randrange(len(keys))))
    elif r < 0.15:
        keys.insert(rng.randrange(len(keys) + 1), f"extra/k{rng.randrange(3)}")
    vals: dict[str, object] = {k: (rng.randrange(10**6) if k == "perf/total_num_tokens" else _number(rng))
                               for k in keys}
    if i % 97 == 0:
        vals.update({"val-core/acc": _number(rng), "val-aux/std": _number(rng)})  # an evaluation shape
    if rng.random() < 0.04:
        vals[rng.choice(keys)] = "ODD"
    return vals


def _steps(n: int, rng: random.Random) -> list[int]:
    steps, step = [], 0
    for _ in range(n):
        step = max(0, step - rng.randrange(1, 20)) if rng.random() < 0.01 else step + 1  # sometimes back
        steps.append(step)
    return steps


def verl_console(n: int, rng: random.Random) -> str:
    out = []
    for i, step in enumerate(_steps(n, rng)):
        parts = []
        for k, v in _values(rng, i).items():
            text = rng.choice(ODD_VALUES) if v == "ODD" else repr(v)
            wrapped = k.startswith("actor/") and v != "ODD" and i % 5
            parts.append(f"{k}:np.float64({text})" if wrapped else f"{k}:{text}")
        prefix = rng.choice(["(TaskRunner pid=87031) ", "(TaskRunner pid=8) ", "", "(main_task pid=1, ip=10.0.0.5) "])
        line = prefix + f"step:{step} - " + " - ".join(parts)
        r = rng.random()
        if r < 0.02:
            line = line.replace(" - ", "  -  ", 1)  # another spacing
        elif r < 0.04:
            line += " [repeated 3x across cluster]"
        elif r < 0.05:
            line = f"(TaskRunner pid=87031) step:{'9' * 20} - a:1"  # a step beyond 2**53
        elif r < 0.06:
            line = "(TaskRunner pid=87031) some other output: step: none here"
        out.append(line)
    return "\n".join(out) + "\n"


def _json_value(v: object, rng: random.Random) -> str:
    return rng.choice(ODD_JSON) if v == "ODD" else json.dumps(v)


def verl_jsonl(n: int, rng: random.Random, flat: bool = False) -> str:
    out = []
    for i, step in enumerate(_steps(n, rng)):
        body = ", ".join(f"{json.dumps(k)}: {_json_value(v, rng)}" for k, v in _values(rng, i).items())
        r = rng.random()
        step_text = json.dumps(step) if r > 0.03 else rng.choice(["-1", "1.5", "true", "null", '"7"', "1e20", "7.0"])
        if flat:
            key = rng.choice(["step", "step", "step", "global_step", "_step"])
            line = f'{{"{key}": {step_text}, {body}}}' if rng.random() > 0.03 else f"{{{body}}}"
            if rng.random() < 0.02:
                line = f'{{"step": {step_text}, "global_step": 3, {body}}}'
        else:
            line = f'{{"step": {step_text}, "data": {{{body}}}}}' if rng.random() > 0.02 else f'{{"data": {{{body}}}}}'
        if rng.random() < 0.02:
            line = line.replace(", ", ",", 3)  # other separators
        out.append(line)
    return "\n".join(out) + "\n"


def openrlhf(n: int, rng: random.Random) -> str:
    out = []
    for i, step in enumerate(_steps(n, rng)):
        parts = []
        for k, v in _values(rng, i).items():
            parts.append(f"'{k}': {rng.choice(ODD_VALUES) if v == 'ODD' else repr(v)}")
        line = f"INFO 05-12 10:{i % 60:02d}:00 ppo_trainer.py:412] \u2728 Global step {step}: {{{', '.join(parts)}}}"
        r = rng.random()
        if r < 0.02:
            line = line.replace(": ", ":  ", 3)
        elif r < 0.03:
            line = line[: len(line) // 2]  # cut
        elif r < 0.04:
            line += " [repeated 2x across cluster]"
        elif r < 0.05:
            line = line.replace("Global step", "Global step 3: {'a': 1} Global step", 1)
        out.append(line)
    return "\n".join(out) + "\n"


GENERATED = {
    "verl_console": verl_console,
    "verl_jsonl": verl_jsonl,
    "jsonl": lambda n, rng: verl_jsonl(n, rng, flat=True),
    "openrlhf": openrlhf,
}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("shape", sorted(GENERATED))
def test_generated_lines_read_the_same_with_the_fast_paths_off(shape: str, seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    path = tmp_path / f"{shape}.log"
    path.write_text(GENERATED[shape](3000, rng))
    assert_same(path)
    # the fast paths were taken: each format learned a shape
    dump(path, True)
    learned = {"verl_console": chain._VERL.cache.patterns, "openrlhf": pydict._OPENRLHF_FAST.cache.patterns,
               "verl_jsonl": jsonl._FAST.cache.patterns, "jsonl": jsonl._FAST.cache.patterns}
    if shape in learned:
        assert learned[shape], f"{shape}: no shape was learned, the fast path was never taken"


@pytest.mark.parametrize("shape", sorted(GENERATED))
def test_mixed_with_tqdm_bars_and_a_pinned_format(shape: str, tmp_path: Path) -> None:
    """Runs of plain lines cut by bar draws, blank lines and \\r: the framer's batches start and stop."""
    rng = random.Random(7)
    lines = GENERATED[shape](1500, rng).splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i % 11 == 0:
            out.append(f"Map: {i % 100:3d}%|##   | {i}/1500 [00:01<00:02, 9.9it/s]")
        if i % 17 == 0:
            out.append(" " * 12)
        if i % 23 == 0:
            out[-1] = out[-1] + "\r"
    path = tmp_path / f"{shape}_mixed.log"
    path.write_text("\n".join(out) + "\n")
    assert_same(path)
    fmt = {"verl_console": "verl", "verl_jsonl": "json", "jsonl": "json", "openrlhf": "openrlhf"}[shape]
    assert_same(path, "--format", fmt)


def test_the_comparison_sees_a_fast_path_that_changes_a_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: a fast path that moves one value by one ulp, once its shape is learned (a new
    pattern is checked against the general parser on its first line), fails it."""
    path = tmp_path / "verl.log"
    path.write_text(verl_console(300, random.Random(3)))
    real = fastpath.VerlConsoleFast._record
    calls = [0]

    def off_by_one_ulp(*args: object) -> object:
        rec = real(*args)  # type: ignore[arg-type]
        calls[0] += 1
        if rec is not None and calls[0] > 20:
            rec.numbers[0] = math.nextafter(rec.numbers[0], math.inf)
        return rec

    fast_ok = dump(path, True)
    assert fast_ok == dump(path, False)
    monkeypatch.setattr(fastpath.VerlConsoleFast, "_record", staticmethod(off_by_one_ulp))
    assert dump(path, True) != fast_ok


# --- OpenRLHF runs of lines read at once (OpenRLHFFast.parse_run) -------------------------------------------

_RUN_KEYS = ["policy_loss", "actor_lr", "kl", "reward", "timing/generation", "e1e", "k.1"]
_RUN_MUTATIONS = [
    lambda line: line.replace("'kl': ", "'kl': np.float64(0.5)#", 1),  # a value float() refuses, mid-run
    lambda line: line.replace("'kl': ", "'kl': None, 'x': ", 1),  # None: the general parser skips it
    lambda line: line.replace("'reward'", "'reward2'", 1),  # another shape
    lambda line: line.replace("'reward': ", "'reward': '0.5', 'r': ", 1),  # a quoted value
    lambda line: line.replace("INFO", "INFO {x}", 1),  # a brace before the step
    lambda line: line.replace("INFO", "Global step 3: {'a': 1} INFO", 1),  # an earlier dict
    lambda line: line + " ",  # a trailing space
    lambda line: line + " [repeated 2x across cluster]",  # Ray's suffix
    lambda line: line.replace("Global step ", "Global step 1234567890123456", 1),  # a step past 2**53
    lambda line: line.replace("Global step ", "Global step \u0663", 1),  # an Arabic-Indic digit
    lambda line: line.replace(": {", ":\t{", 1),  # other spacing
    lambda line: line.replace(": {", ":  {", 1),
    lambda line: line.replace("}", ", 'epoch': 1.5}", 1),  # a longer shape
    lambda line: line[: len(line) // 2],  # cut
    lambda line: "",  # a blank line
    lambda line: line.replace("1", "\u0661"),  # Arabic-Indic digits in every number: float() reads them
    lambda line: line.replace("'actor_lr': ", "'actor_lr': 1_0", 1),  # float() reads underscores
    lambda line: line.replace("'actor_lr': ", "'actor_lr': -", 1),  # a value that is no number
    lambda line: line.replace("'actor_lr': ", "'actor_lr': nan", 1),
    lambda line: line.replace("'actor_lr': ", "'actor_lr': 1e999", 1),  # inf
]


def openrlhf_runs(rng: random.Random, runs: int = 120) -> str:
    """Runs of clean step lines of one shape, cut by progress-bar draws; one run in three has a line changed."""
    out: list[str] = []
    step = 0
    for r in range(runs):
        lines = []
        for _ in range(rng.randrange(2, 30)):
            step = max(0, step - 5) if rng.random() < 0.01 else step + rng.randrange(0, 2)  # repeats, a step back
            vals = ", ".join(f"'{k}': {rng.choice([_number(rng), rng.randrange(100), -0.0, 1e-300])!r}"
                             for k in _RUN_KEYS)
            lines.append(f"INFO 05-12 10:{step % 60:02d}:00 ppo_trainer.py:412] \u2728 Global step {step}: {{{vals}}}")
        if r % 3 == 2:
            i = rng.randrange(len(lines))
            lines[i] = rng.choice(_RUN_MUTATIONS)(lines[i])
        out.extend(lines)
        out.append(f"Episode: {r % 100:3d}%|##   | {r}/{runs} [00:01<00:02, 9.9it/s]\r")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_openrlhf_runs_read_at_once_read_the_same(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole runs of lines read by one findall (and a run with one changed line read line by line) give the same
    records and exposition as the general parser, auto-detected and with the format pinned."""
    monkeypatch.setattr(fastpath, "_RUN_RETRY", 0)  # try every run, right after one that did not read whole
    real = fastpath.OpenRLHFFast.parse_run
    outcomes: list[bool] = []

    def spy(self: fastpath.OpenRLHFFast, texts: list[str]) -> object:
        recs = real(self, texts)
        if self.cache.patterns:
            outcomes.append(recs is not None)
        return recs

    monkeypatch.setattr(fastpath.OpenRLHFFast, "parse_run", spy)
    rng = random.Random(seed)
    path = tmp_path / "openrlhf_runs.log"
    path.write_text(openrlhf_runs(rng))
    assert_same(path)
    assert_same(path, "--format", "openrlhf")
    assert True in outcomes and False in outcomes, "runs were read at once and line by line"
    line = "INFO x] Global step 1: {'kl': 1, 'reward': 2, 'actor_lr': 3}"
    path.write_text("\n".join(m(line) for m in _RUN_MUTATIONS) + "\n" + openrlhf_runs(rng, 30))
    assert_same(path)


def test_an_openrlhf_run_is_split_into_records_in_line_order() -> None:
    _fresh_caches()
    lines = [f"x Global step {s}: {{'a': {s / 3!r}, 'b': {-s}}}" for s in range(5)]
    parser = chain.LineParserChain()
    assert parser.parse_run(lines) is None  # no shape learned yet
    expected = [parser.parse(line) for line in lines]
    got = parser.parse_run(lines)
    assert got is not None
    assert [(r.step, r.shape, r.numbers, r.kind, r.fmt) for r in got] == \
        [(r.step, r.shape, r.numbers, r.kind, r.fmt) for r in expected if r is not None]
    assert parser.parse_run([*lines[:2], "x Global step 9: {'a': 1, 'b': oops}"]) is None


def test_the_comparison_sees_a_run_read_at_once_that_changes_a_value(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "openrlhf_runs.log"
    path.write_text(openrlhf_runs(random.Random(1)))
    fast_ok = dump(path, True)
    real = fastpath.OpenRLHFFast.parse_run

    def off_by_one_ulp(self: fastpath.OpenRLHFFast, texts: list[str]) -> object:
        recs = real(self, texts)
        if recs:
            recs[-1].numbers[0] = math.nextafter(recs[-1].numbers[0], math.inf)
        return recs

    monkeypatch.setattr(fastpath.OpenRLHFFast, "parse_run", off_by_one_ulp)
    assert dump(path, True) != fast_ok


# --- A combined stream's tqdm.write lines framed a run at a time (ConsoleStream.redrawn_run) ------------------

def _draw(n: int, total: int, rate: str = "8.67") -> str:
    return f"\r{100 * n // total:3d}%|{'#' * (10 * n // total):<10}| {n}/{total} [00:07<00:28, {rate}it/s]"


_QUOTED_KEYS = ["loss", "grad_norm", "learning_rate", "reward", "reward_std", "kl", "entropy"]


def _metric_line(rng: random.Random, epoch: float) -> str:
    keys = _QUOTED_KEYS if rng.random() < 0.5 else _QUOTED_KEYS[:4]  # GRPO alternates between two shapes
    values = ", ".join(f"'{k}': '{rng.choice([_number(rng), 0.0, 1.0]):.4g}'" for k in keys)
    return f"{{{values}, 'epoch': '{epoch:.4g}'}}"


# A tqdm.write line changed: each either leaves the framer's shape (_LINES) (framed one by one), or keeps it with a
# metric line that is no record, or one that changes the clock's state.
_REDRAWN_MUTATIONS = [
    lambda line, rng: line.replace("{'loss': '", "{'loss': 'abc", 1),  # a text value: skipped, still a record
    lambda line, rng: line[: line.index("{")] + "{'prompt': 'hi'}",  # only text: no record
    lambda line, rng: line[:-1],  # cut: a ParseError
    lambda line, rng: line[: line.index("{")] + '{"loss": 1.5, "epoch": 1}',  # JSON after the clear
    lambda line, rng: line[: line.index("{")] + "{'eval_loss': '0.5', 'eval_runtime': '1.2', 'epoch': '1'}",
    lambda line, rng: line[: line.index("{")] + "{'loss': 1.5, 'x': np.float64(2.0), 'kl': None}",  # general pairs
    lambda line, rng: line[: line.index("{")] + "{'train_runtime': '12.5', 'train_loss': '0.3'}",  # a summary
    lambda line, rng: line + "\r",  # \r\n
    lambda line, rng: line + _draw(5, 5700),  # a draw after the metric line: the line is held open
    lambda line, rng: line + _draw(5, 5700) + "\n" + line + "\nWarning: x",  # ... and the next line abandons it
    lambda line, rng: line + _draw(5, 5700) + "\nWarning: x",  # ... or is joined to it
    lambda line, rng: line.replace("'epoch'", "'\x1b[0mepoch'", 1),  # an escape in the metric line
    lambda line, rng: line.replace(" [00:07", "\t[00:07", 1),  # a tab where _BAR takes any space
    lambda line, rng: line.replace("\r  ", "\rEvaluating:  ", 1),  # a bar with a description
    lambda line, rng: line.replace("        \r{", "        \x1b[A\r{", 1),  # a nested bar's clear
    lambda line, rng: line.replace("        \r{", "\r{", 1) if line.count(" ") > 60 else line,
    lambda line, rng: line[: line.index("\r", 1)] + "\r" + " " * 7 + line[line.index("\r", 1):],  # a short clear
    lambda line, rng: line[: line.rindex("\r")],  # draws and a clear, no metric line
    lambda line, rng: _draw(3, 7) + line,  # a draw of another total
    # a new trainer.train(): a bar of another total from 0
    lambda line, rng: _draw(0, 9) + _draw(1, 9) + line[line.rindex("\r", 0, line.rindex("\r")):],
    lambda line, rng: line[: line.index("{")] + "{'loss': '1', '" + "k" * 20_000 + "': '2', 'epoch': '1'}",  # wide
    lambda line, rng: line.replace("/", "1234567890123456/", 1),  # a count of 16 digits
    lambda line, rng: line + "\n***** train metrics *****\n  epoch = 1.0\n  train_loss = 0.25",  # metrics block
    # a metrics block's entry, by its shape: `{'loss` = `x': ...`
    lambda line, rng: line + "\n***** eval metrics *****\n  epoch = 1.0\n" + line.replace("{'loss'", "{'loss=x'", 1),
    lambda line, rng: line + "\n" + " " * 40,  # a lone line of spaces
    lambda line, rng: line + "\nWarning: something\n",  # plain lines between
    lambda line, rng: line.replace("{'loss'", "{'loss': '0.1', 'loss'", 1),  # a key twice
]


def combined_stream(rng: random.Random, lines: int, total: int = 5700, mutate: float = 0.12,
                    back_every: int = 0) -> str:
    """tqdm.write's lines as TRL's combined console log has them, one line in ~8 changed (_REDRAWN_MUTATIONS)."""
    out, n = [], 0
    for i in range(lines):
        draws = ""
        for _ in range(rng.choice([1, 1, 2, 3])):
            n = min(total, n + rng.randrange(0, 2))
            draws += _draw(n, total, rng.choice(["8.67", "12.3", " 7.95"]))
        if back_every and i % back_every == back_every - 1:
            n = max(0, n - 40)  # a resumed run: the bar goes back
        line = draws + "\r" + " " * rng.randrange(8, 60) + "\r" + _metric_line(rng, n / 100)
        if rng.random() < mutate:
            line = rng.choice(_REDRAWN_MUTATIONS)(line, rng)
        out.append(line)
    return "\n".join(out) + "\n"


def _taken_lines(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spies on ConsoleStream.redrawn_run: how many lines each call took."""
    taken: list[int] = []
    real = pipeline.ConsoleStream.redrawn_run

    def spy(self: pipeline.ConsoleStream, columns: list[tuple[str, ...]], start: int, stop: int) -> int:
        end = real(self, columns, start, stop)
        taken.append(end - start)
        return end

    monkeypatch.setattr(pipeline.ConsoleStream, "redrawn_run", spy)
    return taken


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_tqdm_write_lines_framed_at_once_read_the_same(seed: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm.write's lines taken a run at a time give the records (steps included), counters and exposition that
    framing them segment by segment gives, through every change that leaves the shape or the clock's states."""
    taken = _taken_lines(monkeypatch)
    rng = random.Random(seed)
    path = tmp_path / "combined.log"
    path.write_text(combined_stream(rng, 2500, back_every=700 if seed % 2 else 0), newline="")
    assert_same(path)
    assert sum(taken) > 200 and 0 in taken, "lines were taken at once, and some calls took none"
    assert_same(path, "--format", "hf")
    taken.clear()
    assert_same(path, "--format", "json")  # the chain reads no dict lines: every line framed one by one
    assert not any(taken)


def test_every_change_of_a_tqdm_write_line_reads_the_same(tmp_path: Path) -> None:
    """Each change on its own, after lines of each clock state (a record waiting, none waiting after a clear, no
    clear yet), and followed by clean lines."""
    rng = random.Random(5)
    for k, mutation in enumerate(_REDRAWN_MUTATIONS):
        clean = combined_stream(rng, 6, mutate=0).split("\n")[:-1]
        text = "\n".join([*clean[:3], mutation(clean[3], rng), *clean[4:]]) + "\n"
        path = tmp_path / f"mutation_{k}.log"
        path.write_text(text, newline="")
        assert_same(path)


def _records_fed(text: str, fast: bool, chunks: list[int]) -> tuple[list[str], dict[str, object]]:
    """The records a console stream hands its run (step, kind, shape, number bits) and its counters, the text fed
    in pieces of the given lengths."""
    saved = fastpath.ENABLED
    fastpath.ENABLED = fast
    _fresh_caches()
    try:
        run = RunState("r", KeyMap())
        got: list[str] = []
        real_apply = run._apply

        def applied() -> None:
            got.extend(map(described, run._pending))
            real_apply()

        run._apply = applied  # type: ignore[method-assign]
        stats = pipeline.IngestStats()
        stream = pipeline.ConsoleStream(run, stats, chain.LineParserChain())
        at = 0
        for size in chunks:
            stream.feed(text[at : at + size])
            at += size
        stream.feed(text[at:])
        stream.finish()
        run._apply()
        return got, {"lines": dict(stats.lines), "bars": stats.bar_draws,
                     "disagreements": dict(stats.step_disagreements), "records": dict(run.records)}
    finally:
        fastpath.ENABLED = saved


@pytest.mark.parametrize("seed", [11, 12])
def test_tqdm_write_lines_read_the_same_however_the_stream_is_cut(seed: int) -> None:
    """Read pieces (a block-buffered stdout cuts anywhere, runs start in any clock state) give what one piece
    read segment by segment gives."""
    rng = random.Random(seed)
    text = combined_stream(rng, 1500, mutate=0.08)
    whole = _records_fed(text, False, [])
    assert len(whole[0]) > 1000
    chunks = [rng.choice([1, 7, 300, 4096, 65536]) for _ in range(len(text) // 2000)]
    assert _records_fed(text, True, chunks) == whole
    assert _records_fed(text, True, []) == whole


def test_the_comparison_sees_a_run_of_tqdm_write_lines_stepped_wrong(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The check has teeth: records of a run taken at once that get the draw of their own line instead of the next
    one's fail it."""
    path = tmp_path / "combined.log"
    path.write_text(combined_stream(random.Random(1), 800, mutate=0), newline="")
    fast_ok = dump(path, True)
    assert fast_ok == dump(path, False)
    real = StepClock.redrawn

    def own_line(self: StepClock, total: str, counts: list[int], last: int, recs: list[Record]) -> list[Record]:
        out = real(self, total, counts, last, recs)
        for rec, count in zip(out[1:], counts, strict=False):
            rec.step = count
        return out

    monkeypatch.setattr(StepClock, "redrawn", own_line)
    assert dump(path, True) != fast_ok
