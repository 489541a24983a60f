"""TRL's completions folder (`OUTPUT_DIR/completions/completions_NNNNN.parquet`) as a source: each file read once into
its step's sample set, whose diversity reaches the run as the printed panels' does; on the real files of the three
labelled sample runs (tests/fixtures/corpus/*/completions)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, exporter_cmd, require_module, run_cli
from support.judge import read_log
from support.loopback import free_port

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.sources.completions import CompletionsReader

CORPUS = REPO / "tests" / "fixtures" / "corpus"
SAMPLE_RUNS = ("grpo_samples_healthy", "grpo_template_collapse", "grpo_brevity_collapse")


def _diversity(state) -> dict[str, list[tuple[int, float]]]:
    state.refresh()
    return {sub: s.history for (inst, sub), s in state.series.items() if inst == "completion_diversity"}


def _metric_lines(text: str, name: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.parametrize("run", SAMPLE_RUNS)
def test_the_folder_gives_the_panels_diversity_at_its_steps(run: str) -> None:
    require_module("pyarrow", "parquet")
    folder = CORPUS / run / "completions"
    from_files = _diversity(read_log(folder, "p"))
    from_panels = _diversity(read_log(CORPUS / run / "combined.log", "c"))
    assert len(from_files) == 8
    for stat, history in from_files.items():
        assert [step for step, _ in history] == [1, 100, 200], stat
        printed = dict(from_panels[stat])
        assert [v for _, v in history] == pytest.approx([printed[s] for s, _ in history], nan_ok=True), stat
    # and through the command line: the same exported values as the console log's (whose last panel is step 200)
    res = run_cli("dump", "--no-gpu", "--run", "x", str(folder))
    assert res.returncode == 0, res.stderr
    console = run_cli("dump", "--no-gpu", "--run", "x", str(CORPUS / run / "combined.log"))
    got = _metric_lines(res.stdout.decode(), "posttrain_completion_diversity")
    assert len(got) == 8 and got == _metric_lines(console.stdout.decode(), "posttrain_completion_diversity")
    assert 'posttrain_step{run="x"} 200.0' in res.stdout.decode()


def test_serve_picks_up_each_file_as_it_is_written(tmp_path: Path) -> None:
    require_module("pyarrow", "parquet")
    from test_serve import value, wait_for

    src = CORPUS / "grpo_template_collapse" / "completions"
    folder = tmp_path / "out" / "completions"
    folder.mkdir(parents=True)  # TRL's folder, empty before its first logged step
    port = free_port()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--run", "tc",
                                      "--log", str(folder)), cwd=REPO, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        wait_for(port, lambda t: value(t, "posttrain_exporter_source_up", run="tc") == 1)
        expected = {1: 0.1875, 100: 0.9375, 200: 1.0}  # top_share of each step (the panels give the same)
        for step, share in expected.items():
            name = f"completions_{step:05d}.parquet"
            shutil.copy(src / name, folder / (name + ".tmp"))
            (folder / (name + ".tmp")).rename(folder / name)
            text = wait_for(port, lambda t, s=step: value(t, "posttrain_step", run="tc") == s)
            assert value(text, "posttrain_completion_diversity", run="tc", stat="top_share") == share
        assert value(text, "posttrain_exporter_parse_errors_total", run="tc", format="trl_parquet") in (None, 0)
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0, p.stderr.read().decode()[-2000:]


def test_a_file_still_being_written_waits_and_is_read_once_whole(tmp_path: Path) -> None:
    require_module("pyarrow", "parquet")
    whole = (CORPUS / "grpo_template_collapse" / "completions" / "completions_00100.parquet").read_bytes()
    target = tmp_path / "completions_00100.parquet"
    target.write_bytes(whole[: len(whole) // 2])
    reader = CompletionsReader(str(tmp_path))
    assert reader.poll() == [] and reader.pending and not reader.errors  # not parsed: tried again, not counted yet
    target.write_bytes(whole)
    got = reader.poll()
    assert [s.step for s in got] == [100] and len(got[0].samples) == 16
    assert not reader.errors and not reader.pending
    assert reader.poll() == []  # read once


def test_a_corrupt_file_is_counted_and_the_next_one_read(tmp_path: Path) -> None:
    require_module("pyarrow", "parquet")
    src = CORPUS / "grpo_brevity_collapse" / "completions"
    folder = tmp_path / "completions"
    folder.mkdir()
    shutil.copy(src / "completions_00001.parquet", folder)
    whole = (src / "completions_00100.parquet").read_bytes()
    (folder / "completions_00050.parquet").write_bytes(whole[:-40])  # truncated: its footer is gone
    (folder / "completions_00060.parquet").write_bytes(b"not parquet at all\n")
    shutil.copy(src / "completions_00100.parquet", folder)
    ex = Exporter(Config(), [LogSpec(str(folder), "b")])
    ex.read_to_end()
    assert ex.stats["b"].parse_errors == {("trl_parquet", "unreadable_parquet"): 2}
    assert [s for s, _ in _diversity(ex.runs["b"])["top_share"]] == [1, 100]
    res = run_cli("dump", "--no-gpu", "--run", "b", str(folder))
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert 'posttrain_exporter_parse_errors_total{format="trl_parquet",reason="unreadable_parquet",run="b"} 2.0' in out
    assert 'posttrain_step{run="b"} 100.0' in out
    assert res.stderr.decode().count("skipped (unreadable_parquet)") == 1  # said once, then only counted


_NO_PYARROW = """
import runpy, sys
class NoPyarrow:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoPyarrow())
try:
    import pyarrow  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("the blocker did not block pyarrow")
sys.argv = ["posttrain-exporter", *sys.argv[1:]]
runpy.run_module("exporter", run_name="__main__")
"""


@pytest.mark.parametrize("command", ["dump", "serve"])
def test_without_pyarrow_the_folder_is_refused_in_one_line_naming_the_extra(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "completions"
    empty.mkdir()  # before TRL's first file: known by its name
    for folder in (CORPUS / "grpo_template_collapse" / "completions", empty):
        args = [command, "--no-gpu", str(folder)]  # dump reads its logs as arguments, serve with --log
        if command == "serve":
            args = [command, "--no-gpu", "--log", str(folder), "--listen-address", f"127.0.0.1:{free_port()}"]
        res = subprocess.run([sys.executable, "-c", _NO_PYARROW, *args], capture_output=True, timeout=20, cwd=REPO)
        err = res.stderr.decode().strip()
        assert res.returncode == 2 and "\n" not in err and "Traceback" not in err, err
        assert str(folder) in err and "pyarrow" in err and "posttrain-exporter[parquet]" in err


def test_a_half_written_file_that_goes_away_waits_no_more(tmp_path: Path) -> None:
    """A file that did not parse yet and then vanished (TRL replaced it, a user cleaned up) must not keep the
    folder pending: `dump` and `report` read a folder until nothing waits, and would never end."""
    folder = tmp_path / "completions"
    folder.mkdir()
    half = folder / "completions_00010.parquet"
    half.write_bytes(b"PAR1 not yet whole")
    reader = CompletionsReader(str(folder))
    assert reader.poll() == [] and reader.pending
    half.unlink()
    reader.poll()
    assert not reader.pending


def test_a_set_behind_the_run_is_left_out_not_taken_for_a_resume() -> None:
    """A sample set whose step is behind the run (a completions folder read after the console got further) keeps
    its rows for the report, but its diversity numbers are counted as left out: as a training record they would
    cut the run's history back to that step."""
    from exporter.instruments.keymap import KeyMap
    from exporter.parsers.record import Record
    from exporter.pipeline import IngestStats, take_samples
    from exporter.runstate import RunState
    from exporter.samples.sampleset import Sample, SampleSet

    run, stats = RunState("r", KeyMap()), IngestStats()
    for step in range(1, 501):
        run.ingest(Record({"loss": 1.0 / step, "reward": 0.1}, "jsonl", step=step))
    rows = tuple(Sample(f"q{i}", "The answer is 7.") for i in range(8))
    take_samples(run, stats, SampleSet(10, "trl_parquet", rows))
    run.refresh()
    assert run.step == 500 and run.resets == 0 and len(run.series["loss", None]) == 500
    assert stats.lines["samples", "behind_run"] == 1 and run.samples.total_sets == 1
    take_samples(run, stats, SampleSet(500, "trl_parquet", rows))  # at the run's step: applied
    assert stats.lines["samples", "record"] == 1
