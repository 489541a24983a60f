"""Fault injection on followed files: a writer writes numbered records (real TRL console lines, or JSON lines
with a step) through every fault a log file meets, and every number must reach the run exactly once.

Each record carries `marker: N`; a spy on the run's `ingest` collects the markers in the order they arrive.
Lost or duplicated records show as a marker list that is not 1..N."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import threading
import time
from pathlib import Path

import pytest
from conftest import TRL

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.sources.files import FileFollower
from exporter.sources.inputs.file import FileInput

REAL = [ln for ln in (TRL / "grpo" / "stdout.log").read_text().splitlines() if ln.startswith("{'loss'")]


def record_line(fmt: str, n: int) -> bytes:
    if fmt == "hf":  # a real GRPO line (about 1,500 bytes), numbered
        return (f"{{'marker': '{n}', " + REAL[n % len(REAL)][1:] + "\n").encode()
    return b'{"step": %d, "marker": %d, "loss": %.4f, "kl": %.5f, "reward_std": 0.25}\n' % (n, n, 1 / n, n / 1e4)


class Writer:
    """A trainer's log writer: holds its file open in append mode (as `tee` does) until told to reopen it."""

    def __init__(self, path: Path, fmt: str) -> None:
        self.path, self.fmt = path, fmt
        self.written = 0
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - held like a trainer's stream

    def records(self, k: int) -> bytes:
        data = b"".join(record_line(self.fmt, self.written + i + 1) for i in range(k))
        self.written += k
        return data

    def write(self, k: int = 1) -> None:
        self._f.write(self.records(k))

    def write_bytes(self, data: bytes) -> None:
        self._f.write(data)

    def reopen(self) -> None:
        self._f.close()
        self._f = open(self.path, "ab", buffering=0)  # noqa: SIM115

    def close(self) -> None:
        self._f.close()


class Follow:
    """The exporter on one file, with the markers that reached its run."""

    def __init__(self, path: Path) -> None:
        self.ex = Exporter(Config(), [LogSpec(str(path), "r")])
        self.markers: list[int] = []
        self.steps: list[int | None] = []
        run = self.ex.runs["r"]
        ingest = run.ingest

        def spy(rec) -> None:
            self.markers.append(int(rec.values["marker"]))
            self.steps.append(rec.step)
            ingest(rec)

        run.ingest = spy  # type: ignore[method-assign]

    @property
    def input(self) -> FileInput:
        inp = self.ex.inputs[0]
        assert isinstance(inp, FileInput)
        return inp

    @property
    def follower(self) -> FileFollower:
        return self.input.follower

    def poll(self) -> None:
        self.ex.poll_once()

    def finish(self) -> None:
        self.poll()
        self.input.finish()

    def assert_exactly_once(self, n: int) -> None:
        lost = sorted(set(range(1, n + 1)) - set(self.markers))
        dup = sorted({m for m in self.markers if self.markers.count(m) > 1})
        assert not lost and not dup, f"lost {len(lost)} {lost[:10]}, duplicated {len(dup)} {dup[:10]}"
        assert self.markers == list(range(1, n + 1)), [(i + 1, m) for i, m in enumerate(self.markers) if m != i + 1][:5]
        assert self.ex.runs["r"].resets == 0
        if self.steps and self.steps[0] is not None:  # JSON lines carry their step
            assert self.steps == list(range(1, n + 1))


FORMATS = ["hf", "json"]


@pytest.fixture(params=FORMATS)
def fmt(request) -> str:
    return request.param


@pytest.fixture
def log(tmp_path) -> Path:
    return tmp_path / "train.log"


def test_rotation_by_rename(log, fmt) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    w.write(3)  # written to the old file before the rotation, not yet read
    os.rename(log, log.with_suffix(".log.1"))
    w.reopen()  # the writer's new file under the same path
    w.write(4)
    f.poll()
    w.write(2)
    f.finish()
    f.assert_exactly_once(14)
    assert f.input.follow.rotations == 1 and f.input.follow.resumed == 0


def test_copytruncate(log, fmt) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    shutil.copy(log, log.with_suffix(".log.1"))
    os.truncate(log, 0)  # logrotate's copytruncate; the writer appends (O_APPEND) from the new end
    w.write(2)
    f.poll()
    w.write(2)
    f.finish()
    f.assert_exactly_once(9)
    assert f.input.follow.truncations == 1


def test_copytruncate_then_written_past_the_old_end_before_a_poll(log, fmt) -> None:
    """The file is longer than the offset again when the exporter looks: only its first bytes tell."""
    w, f = Writer(log, fmt), Follow(log)
    w.write(3)
    f.poll()
    os.truncate(log, 0)
    w.write(6)
    f.finish()
    f.assert_exactly_once(9)
    assert f.input.follow.truncations == 1


VERL = "step:{} - actor/kl_loss:0.01 - critic/rewards/mean:{} - actor/entropy:1.0\n"


def numbered(kind: str, steps: range) -> bytes:
    """JSON lines (a parser that needs `{"` at the line's start) or verl's step lines (`step:` at the start)."""
    if kind == "json":
        return "".join(json.dumps({"step": s, "reward": s / 10, "kl": 0.01}) + "\n" for s in steps).encode()
    return "".join(VERL.format(s, s / 10) for s in steps).encode()


@pytest.mark.parametrize("kind", ["json", "verl"])
@pytest.mark.parametrize("poll_between", [False, True])
def test_copytruncate_under_a_writer_that_does_not_append(log, kind: str, poll_between: bool) -> None:
    """`python train.py > train.log`: no O_APPEND, so after copytruncate the writer writes on at its old offset and
    the file starts with a hole of NUL bytes. Glued to the first new line, they cost its record."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        first = numbered(kind, range(1, 50))
        os.write(fd, first)
        ex = Exporter(Config(), [LogSpec(str(log), "r")])
        ex.poll_once()
        shutil.copy(log, log.with_suffix(".log.1"))
        os.truncate(log, 0)
        if poll_between:  # the exporter sees the empty file before the writer writes again
            ex.poll_once()
        os.write(fd, numbered(kind, range(50, 53)))
    finally:
        os.close(fd)
    ex.poll_once()
    ex.inputs[0].finish()
    run = ex.runs["r"]
    run.refresh()
    assert [s for s, _ in run.series[("kl", None)].history] == list(range(1, 53))
    lines = ex.stats["r"].lines
    assert sum(n for (_, outcome), n in lines.items() if outcome == "record") == 52 and not lines["none", "unmatched"]
    assert ex.inputs[0].follow.truncations == 1 and ex.inputs[0].follow.nul_bytes == len(first)
    assert run.resets == 0


def test_a_hole_larger_than_a_line_can_be_is_skipped_not_read(log, caplog) -> None:
    """A writer that had written 64 MiB: the hole is longer than limits.max_line_length, so glued to the next line it
    cost that line as too long; it is passed by seeking (SEEK_DATA), not read, and said once."""
    log.write_bytes(numbered("json", range(1, 4)))
    ex = Exporter(Config(), [LogSpec(str(log), "r")])
    ex.poll_once()
    with open(log, "r+b") as f:
        f.truncate(0)
        f.seek(64 << 20)  # the writer's old offset
        f.write(numbered("json", range(4, 6)))
    caplog.set_level(logging.INFO, logger="exporter.sources.files")
    t = time.perf_counter()
    ex.poll_once()
    assert time.perf_counter() - t < 2.0
    run = ex.runs["r"]
    run.refresh()
    assert [s for s, _ in run.series[("reward", None)].history] == [1, 2, 3, 4, 5]
    assert not ex.stats["r"].lines_dropped["too_long"] and ex.inputs[0].follow.nul_bytes == 64 << 20
    assert ex.inputs[0].follow.bytes_read < 1 << 20  # the hole was not read
    said = [r.getMessage() for r in caplog.records if "NUL bytes" in r.getMessage()]
    assert len(said) == 1 and f"skipped {64 << 20} NUL bytes at its start" in said[0]


def test_nul_bytes_between_lines_are_skipped(log) -> None:
    """NUL bytes after a line (a writer that appends and one that does not, after a truncation; blocks zeroed by a
    crash) would be glued to the next one: they are no text, and skipped."""
    log.write_bytes(numbered("verl", range(1, 5)) + b"\0" * 3000 + numbered("verl", range(5, 8)))
    ex = Exporter(Config(), [LogSpec(str(log), "r")])
    ex.poll_once()
    run = ex.runs["r"]
    run.refresh()
    assert [s for s, _ in run.series[("kl", None)].history] == list(range(1, 8))
    assert not ex.stats["r"].lines["none", "unmatched"] and ex.inputs[0].follow.nul_bytes == 3000


def test_delete_and_recreate(log, fmt) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    w.write(2)  # not yet read when the file is deleted: read from the file the exporter holds
    log.unlink()
    f.poll()
    assert f.input.follow.up is False
    w.reopen()  # creates it again
    w.write(3)
    f.finish()
    f.assert_exactly_once(10)


def test_delete_and_recreate_between_two_polls(log, fmt) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    w.write(1)
    log.unlink()
    w.reopen()
    w.write(3)
    f.finish()
    f.assert_exactly_once(9)
    assert f.input.follow.rotations == 1


def test_vanish_and_return(log, fmt, tmp_path) -> None:
    """Moved away (the writer goes on writing into it) and moved back: read on from its offset."""
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    away = tmp_path / "elsewhere.log"
    os.rename(log, away)
    f.poll()
    assert f.input.follow.up is False
    w.write(3)
    os.rename(away, log)
    f.poll()
    w.write(2)
    f.finish()
    f.assert_exactly_once(10)
    assert f.input.follow.resumed == 1 and f.input.follow.rotations == 0


def test_vanish_and_return_as_a_copy(log, fmt, tmp_path) -> None:
    """The same content put back under a new inode (a copy, an rsync): read on from its offset too."""
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    w.close()
    away = tmp_path / "elsewhere.log"
    os.rename(log, away)
    f.poll()
    shutil.copy(away, log)
    away.unlink()
    w = Writer(log, fmt)
    w.written = 5
    w.write(3)
    f.finish()
    f.assert_exactly_once(8)
    assert f.input.follow.resumed == 1


def test_renamed_away_and_back_with_another_file_between(log, fmt, tmp_path) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(4)
    f.poll()
    away = tmp_path / "elsewhere.log"
    os.rename(log, away)
    other = Writer(log, fmt)  # a second writer's file takes the path for a while
    other.written = 4
    other.write(2)
    f.poll()
    other.close()
    os.rename(away, log)  # ... and the first file is back in its place
    w.written = 6
    w.write(3)
    f.finish()
    f.assert_exactly_once(9)
    assert f.input.follow.resumed == 1 and f.input.follow.rotations == 1


def test_partial_line_completed_later(log, fmt) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(2)
    data = w.records(1)
    for cut in (7, len(data) // 2 - 7, len(data) // 2 - 3):  # up to three bytes short of its end
        w.write_bytes(data[:cut])
        data = data[cut:]
        f.poll()
        assert len(f.markers) == 2
    w.write_bytes(data)
    f.finish()
    f.assert_exactly_once(3)


def test_byte_by_byte_writes(log, fmt) -> None:
    w, f = Writer(log, "json" if fmt == "json" else fmt), Follow(log)
    data = w.records(3 if fmt == "hf" else 20)
    for i in range(len(data)):
        w.write_bytes(data[i : i + 1])
        f.poll()
    f.finish()
    f.assert_exactly_once(w.written)


def test_read_error_resumes_at_the_offset(log, fmt, monkeypatch) -> None:
    w, f = Writer(log, fmt), Follow(log)
    w.write(5)
    f.poll()
    w.write(3)
    follower = f.follower

    def eio(fd: int, n: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(follower, "_read", eio)
    f.poll()
    assert f.input.follow.read_errors == 1 and f.input.follow.up is False
    monkeypatch.undo()
    w.write(2)
    f.finish()
    f.assert_exactly_once(10)
    assert f.input.follow.resumed == 1 and f.input.follow.up is True


def test_read_error_in_the_middle_of_a_read(log, fmt, monkeypatch) -> None:
    """A read that hands out part of the data, then fails: nothing handed out is read again."""
    w, f = Writer(log, fmt), Follow(log)
    w.write(6)
    follower = f.follower
    real = FileFollower._read
    calls = {"n": 0}

    def flaky(fd: int, n: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real(follower, fd, min(n, 700))  # short reads, cutting lines

    monkeypatch.setattr(follower, "_read", flaky)
    f.poll()
    f.poll()
    monkeypatch.undo()
    f.finish()
    f.assert_exactly_once(6)
    assert f.input.follow.read_errors == 1


def test_open_refused_for_a_while(log, fmt, monkeypatch, tmp_path) -> None:
    """The file vanishes, comes back unreadable (a permission flip: as root chmod would not stop us, so the
    open is refused by hand), then readable: read on from its offset."""
    w, f = Writer(log, fmt), Follow(log)
    w.write(4)
    f.poll()
    away = tmp_path / "elsewhere.log"
    os.rename(log, away)
    f.poll()
    os.rename(away, log)
    w.write(2)
    real_open = os.open

    def refuse(path, flags, *a, **kw):
        if str(path) == str(log):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr("exporter.sources.files.os.open", refuse)
    f.poll()
    f.poll()
    assert f.input.follow.read_errors == 2 and f.input.follow.up is False
    monkeypatch.undo()
    w.write(1)
    f.finish()
    f.assert_exactly_once(7)
    assert f.input.follow.resumed == 1


def test_unterminated_line_at_rotation_costs_only_itself(log) -> None:
    """A rotated file that ends inside a line: the next file's first record is not glued to it."""
    w, f = Writer(log, "json"), Follow(log)
    w.write(3)
    w.write_bytes(b'{"step": 99, "marker": 99, "lo')  # the trainer died mid-line
    f.poll()
    os.rename(log, log.with_suffix(".log.1"))
    w.reopen()
    w.written = 3
    w.write(2)
    f.finish()
    assert f.markers == [1, 2, 3, 4, 5]
    assert f.ex.stats["r"].parse_errors  # the cut line is counted, not silently glued


@pytest.mark.parametrize("seed", [1, 2])
def test_writer_and_poller_race_through_every_fault(tmp_path, fmt, seed) -> None:
    """A writer thread writes 1,500 records in pieces cut at random bytes, with a fault every few dozen
    records, while the exporter polls as fast as it can; every record arrives exactly once."""
    rng = random.Random(seed)
    log = tmp_path / "train.log"
    w, f = Writer(log, fmt), Follow(log)
    total = 1500
    lock = threading.Lock()
    failing = {"reads": 0}
    follower = f.follower
    real_read = FileFollower._read

    def flaky_read(fd: int, n: int) -> bytes:
        with lock:
            if failing["reads"]:
                failing["reads"] -= 1
                raise OSError(errno.EIO, "Input/output error")
        return real_read(follower, fd, n)

    follower._read = flaky_read  # type: ignore[method-assign]

    def caught_up(timeout: float = 10.0) -> None:
        """Faults that drop a file's unread bytes by design (copytruncate) wait for the exporter first."""
        deadline = time.monotonic() + timeout
        while len(f.markers) < w.written and time.monotonic() < deadline:
            time.sleep(0.001)

    def write() -> None:
        away = tmp_path / "away.log"
        while w.written < total:
            data = w.records(rng.randint(1, 30))
            while data:
                cut = rng.randint(1, len(data))
                w.write_bytes(data[:cut])
                data = data[cut:]
                if rng.random() < 0.2:
                    time.sleep(0.0005)
            fault = rng.choice(["none", "none", "rename", "copytruncate", "recreate", "vanish", "read_error"])
            if fault == "rename":
                caught_up()
                os.rename(log, tmp_path / "train.log.1")
                w.reopen()
            elif fault == "copytruncate":
                caught_up()
                os.truncate(log, 0)
            elif fault == "recreate":
                caught_up()
                log.unlink()
                w.reopen()
            elif fault == "vanish":
                os.rename(log, away)
                time.sleep(rng.random() * 0.005)
                w.write(rng.randint(0, 3))
                os.rename(away, log)
            elif fault == "read_error":
                with lock:
                    failing["reads"] = rng.randint(1, 3)

    t = threading.Thread(target=write)
    t.start()
    deadline = time.monotonic() + 60
    while (t.is_alive() or len(f.markers) < w.written) and time.monotonic() < deadline:
        f.poll()
    t.join()
    f.finish()
    f.assert_exactly_once(w.written)
    assert w.written >= total
