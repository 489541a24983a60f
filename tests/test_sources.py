"""One Source interface for every input (exporter/sources/base.py), and `Exporter.add_input`."""

from __future__ import annotations

import os
import threading

from conftest import TRL

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.sources.base import Source
from exporter.sources.replay import ReplayReader
from exporter.sources.stdin import StdinReader

GRPO = TRL / "grpo" / "combined.log"


def _steps(ex: Exporter, run: str) -> int:
    return ex.runs[run].step


def test_every_input_is_a_source_with_one_poll_signature(tmp_path) -> None:
    log = tmp_path / "train.log"
    log.write_text("{'loss': 1.0, 'epoch': 0.1}\n")
    state = tmp_path / "trainer_state.json"
    state.write_text('{"log_history": [{"loss": 1.0, "step": 1}]}')
    r, w = os.pipe()
    os.close(w)
    ex = Exporter(Config(), [LogSpec(str(log), "a"), LogSpec(str(state), "b"), LogSpec(str(tmp_path / "later"), "c")])
    ex.add_input(LogSpec("-", "d"), StdinReader(fd=r))
    assert len(ex.inputs) == 4
    for inp in ex.inputs:
        assert isinstance(inp, Source)
        inp.poll(timeout=0.0)  # the same call for a file, a trainer_state, a path not there yet and a stream
    ex.read_to_end()
    assert ex.runs["a"].records["train"] == 1 and ex.runs["b"].records["train"] == 1


def test_standard_input_counts_bytes_once_as_bytes() -> None:
    """The stream's own reader counts what it read, undecoded: a multi-byte character is its bytes, not one."""
    text = "{'loss': 1.0, 'epoch': 0.1, 'note': 'é€'}\n".encode() * 3
    r, w = os.pipe()
    threading.Thread(target=lambda: (os.write(w, text), os.close(w)), daemon=True).start()
    ex = Exporter(Config(), [])
    src = ex.add_input(LogSpec("-", "stdin"), StdinReader(fd=r))
    ex.read_to_end()
    assert src.follow.bytes_read == len(text) and not src.follow.up
    assert ex.runs["stdin"].records["train"] == 3


def test_a_stream_added_first_is_polled_first_and_read_to_its_end() -> None:
    ex = Exporter(Config(), [LogSpec(str(GRPO), "file")])
    replay = ReplayReader(GRPO.read_text(), rate=1e9, loop=False)
    src = ex.add_input(LogSpec("bundled", "replayed"), replay, first=True)
    assert ex.inputs[0] is src
    ex.read_to_end()
    assert src.drained and _steps(ex, "replayed") == _steps(ex, "file") > 0
    assert src.follow.bytes_read == len(GRPO.read_text().encode())


def test_a_warning_logged_once_per_run_is_state_of_that_run(tmp_path, caplog) -> None:
    """Logged once per run and exporter, not once per process: a second exporter (a report after a dump, a
    restarted serve in the same interpreter) says it again."""
    log = tmp_path / "train.log"
    log.write_text('{"loss": 1.0, "step": 1}\n{"loss": [1, 2], "step": 2}\n{"loss": [3], "step": 3}\n')
    for _ in range(2):
        with caplog.at_level("WARNING"):
            caplog.clear()
            ex = Exporter(Config(), [LogSpec(str(log), "r", "json")])
            ex.read_to_end()
        said = [r for r in caplog.records if "could not be parsed" in r.getMessage()]
        assert len(said) == 1 and ex.stats["r"].lines["jsonl", "error"] == 2


def test_a_symlink_to_a_listed_log_is_read_once(tmp_path) -> None:
    """The log and a link to it (in another folder, under another name) are one file: one run, its records once."""
    from conftest import run_cli

    log = tmp_path / "train.log"
    log.write_bytes(GRPO.read_bytes())
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "latest.log"
    link.symlink_to(log)
    res = run_cli("dump", "--no-gpu", str(log), str(link))
    assert res.returncode == 0, res.stderr
    runs = {ln.split('run="')[1].split('"')[0] for ln in res.stdout.decode().splitlines()
            if ln.startswith("posttrain_step{")}
    assert runs == {tmp_path.name}  # train.log: its folder's name


def test_a_log_path_that_is_not_there_is_said_at_once_and_again_if_it_stays_missing(tmp_path, caplog, monkeypatch):
    """A mistyped --log waited for in silence looked like a healthy sidecar with nothing to say: it is said at once
    (with whether its folder exists), again when it is still missing later, and once more when it appears."""
    import logging

    import exporter.sources.inputs.pending as inputs
    from exporter.config import LogSpec
    from exporter.sources.inputs.pending import PendingInput

    caplog.set_level(logging.INFO, logger="exporter.sources.inputs.pending")
    monkeypatch.setattr(inputs, "STILL_WAITING_SECONDS", 0.0)
    path = tmp_path / "no-such-folder" / "trian.log"
    appeared: list[object] = []
    pending = PendingInput(LogSpec(str(path), "r"), lambda spec: appeared[0] if appeared else None)
    for _ in range(3):
        pending.read()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # once at once, once more later: not once a poll
    assert "does not exist; waiting for it to appear" in said[0] and "does not exist either" in said[0]
    assert "still nothing to read" in said[1]

    class _Found:
        def read(self, timeout: float = 0.0) -> None:
            pass

    appeared.append(_Found())
    pending.read()
    assert "is there now" in caplog.records[-1].getMessage()


def test_one_inputs_failure_never_starves_the_others(tmp_path, caplog) -> None:
    """An input whose read raises (a reader's bug) is counted as its read error and said once; the inputs after it
    in the same poll are still read."""
    import logging

    from exporter.app import Exporter
    from exporter.config import Config, LogSpec

    bad, good = tmp_path / "bad.log", tmp_path / "good.log"
    bad.write_text("{'loss': 0.5, 'epoch': 0.1}\n")
    good.write_text('{"step": 3, "loss": 0.25}\n')
    ex = Exporter(Config(), [LogSpec(str(bad), "bad"), LogSpec(str(good), "good")])

    def broken(timeout: float = 0.0) -> None:
        raise RuntimeError("reader bug")

    ex.inputs[0].read = broken  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR)
    for _ in range(3):
        ex.poll_once()
    ex.runs["good"].refresh()
    assert ex.runs["good"].step == 3
    assert ex.inputs[0].follow.read_errors == 3
    assert sum("ingest failed for" in r.getMessage() for r in caplog.records) == 1
