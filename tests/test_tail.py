"""The tailer's fault cases, each with real TRL console lines written the way a trainer writes them."""

from __future__ import annotations

import os

import pytest
from conftest import TRL

from exporter.app import Exporter
from exporter.config import Config, LogSpec

LINES = [ln for ln in (TRL / "grpo" / "stdout.log").read_text().splitlines() if ln.startswith("{'loss'")]


def rec(i: int) -> str:
    return LINES[i] + "\n"


@pytest.fixture
def logfile(tmp_path):
    return tmp_path / "train.log"


def exporter_for(path) -> Exporter:
    return Exporter(Config(), [LogSpec(str(path), "r")])


def loss(ex: Exporter) -> dict[int, float]:
    ex.runs["r"].refresh()
    return dict(ex.runs["r"].series[("loss", None)].history)


def expected_loss(i: int) -> float:
    return float(LINES[i].split("'loss': '")[1].split("'")[0])


def test_growth_is_followed(logfile) -> None:
    logfile.write_text(rec(0))
    ex = exporter_for(logfile)
    ex.poll_once()
    with logfile.open("a") as f:
        f.write(rec(1) + rec(2))
    ex.poll_once()
    assert loss(ex) == {1: expected_loss(0), 2: expected_loss(1), 3: expected_loss(2)}


def test_partial_last_line_is_completed_later(logfile) -> None:
    line = rec(0)
    logfile.write_text(line[:57])
    ex = exporter_for(logfile)
    ex.poll_once()
    assert ex.runs["r"].records["train"] == 0 and not ex.stats["r"].parse_errors
    with logfile.open("a") as f:
        f.write(line[57:])
    ex.poll_once()
    assert loss(ex) == {1: expected_loss(0)}


def test_rotation_by_rename(logfile) -> None:
    logfile.write_text(rec(0))
    ex = exporter_for(logfile)
    ex.poll_once()
    with logfile.open("a") as f:
        f.write(rec(1))  # written before the rename, not yet read
    os.rename(logfile, logfile.with_suffix(".log.1"))
    logfile.write_text(rec(2))
    ex.poll_once()
    assert sorted(loss(ex)) == [1, 2, 3]
    assert ex.inputs[0].follow.rotations == 1


def test_copytruncate(logfile) -> None:
    logfile.write_text(rec(0) + rec(1) + rec(2))
    ex = exporter_for(logfile)
    ex.poll_once()
    with logfile.open("r+") as f:  # logrotate's copytruncate: same inode, emptied in place
        f.truncate(0)
    with logfile.open("a") as f:
        f.write(rec(3))
    ex.poll_once()
    assert sorted(loss(ex)) == [1, 2, 3, 4] and ex.inputs[0].follow.truncations == 1


def test_delete_and_recreate(logfile) -> None:
    logfile.write_text(rec(0))
    ex = exporter_for(logfile)
    ex.poll_once()
    logfile.unlink()
    ex.poll_once()
    assert ex.inputs[0].follow.up is False
    logfile.write_text(rec(1))
    ex.poll_once()
    assert ex.inputs[0].follow.up is True and sorted(loss(ex)) == [1, 2]


def test_file_that_appears_late(logfile) -> None:
    ex = exporter_for(logfile)
    ex.poll_once()
    assert ex.inputs[0].follow.up is False and not ex.runs["r"].series
    logfile.write_text(rec(0))
    ex.poll_once()
    assert loss(ex) == {1: expected_loss(0)}


def test_restart_reads_from_the_start_so_windows_are_whole(logfile) -> None:
    logfile.write_text("".join(rec(i) for i in range(60)))
    first = exporter_for(logfile)
    first.poll_once()
    again = exporter_for(logfile)  # the sidecar restarted
    again.poll_once()
    assert loss(again) == loss(first) and len(loss(again)) == 60


def test_a_folder_holding_no_log_yet_is_waited_for_not_a_read_error(tmp_path) -> None:
    """A folder is a Trainer's output_dir: read once it holds a checkpoint's trainer_state.json (or event files)."""
    ex = exporter_for(tmp_path)
    ex.poll_once()
    assert ex.inputs[0].follow.read_errors == 0 and ex.inputs[0].follow.up is False
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text(
        '{"log_history": [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]}')
    ex.poll_once()
    assert ex.inputs[0].follow.up is True and loss(ex) == {1: 0.5, 2: 0.25}


def test_resumed_run_cuts_history_back(logfile) -> None:
    """A trainer resumed from a checkpoint logs steps again (JSON lines carry their step)."""
    lines = [f'{{"step": {s}, "loss": {s / 10}}}\n' for s in range(1, 11)]
    lines += [f'{{"step": {s}, "loss": {-s / 10}}}\n' for s in range(6, 9)]
    logfile.write_text("".join(lines))
    ex = exporter_for(logfile)
    ex.poll_once()
    assert loss(ex) == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5, 6: -0.6, 7: -0.7, 8: -0.8}
    assert ex.runs["r"].resets == 1 and ex.runs["r"].step == 8
