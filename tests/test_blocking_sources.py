"""A source that blocks or can never be read (issue 23, item 2): a FIFO, /dev/zero, a folder, a read that hangs.
Real `serve` processes, real FIFOs, scraped on loopback: scrapes answer within a second, SIGTERM ends the process
within five, a FIFO is read as a stream without losing a record, and what can never be read is refused at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port
from test_serve import value

LINES = [ln for ln in (TRL / "grpo" / "stdout.log").read_text().splitlines() if ln.startswith("{'loss'")]


def timed_scrape(port: int) -> tuple[float, str]:
    start = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return time.monotonic() - start, body


def wait_up(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            timed_scrape(port)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the exporter never served")


def wait_value(port: int, name: str, want: float, timeout: float = 20.0, **labels: str) -> str:
    deadline, body = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        took, body = timed_scrape(port)
        assert took < 1.0, f"a scrape took {took:.2f}s"
        if value(body, name, **labels) == want:
            return body
        time.sleep(0.1)
    raise AssertionError(f"{name} {labels} never reached {want}:\n{body[:1500]}")


def stop_within(p: subprocess.Popen, seconds: float = 5.0) -> None:
    start = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=seconds + 5)
    finally:
        p.kill()
    took = time.monotonic() - start
    assert took < seconds, f"SIGTERM took {took:.1f}s to end the process"


def serve(*args: str, argv: list[str] | None = None) -> tuple[int, subprocess.Popen]:
    port = free_port()
    p = subprocess.Popen([*(argv or exporter_cmd()), "serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}",
                          *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return port, p


def test_a_fifo_is_read_as_a_stream_without_losing_a_record(tmp_path) -> None:
    """No writer yet: scrapes answer. Writers come and go (three of them, the last writing more than a pipe
    holds): every record is read, none lost to a seek, and SIGTERM ends the process."""
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    port, p = serve("--log", str(fifo), "--run", "fifo")
    try:
        wait_up(port)
        for _ in range(5):  # no writer: the open and the reads never hold a scrape
            took, _ = timed_scrape(port)
            assert took < 1.0
        sent = 0
        for batch in (LINES[:3], LINES[3:10], LINES[10:] * 3):
            with open(fifo, "w") as w:  # opens at once: the exporter holds the FIFO open
                for line in batch:
                    w.write(line + "\n")
            sent += len(batch)
            time.sleep(0.3)
        assert sent > 300 and len("\n".join(LINES[10:] * 3)) > 1 << 16  # the last writer blocked on a full pipe
        wait_value(port, "posttrain_step", sent, run="fifo")
        body = wait_value(port, "posttrain_exporter_source_up", 1, run="fifo")
        assert value(body, "posttrain_exporter_source_read_errors_total", run="fifo") in (0, None)
    finally:
        stop_within(p)


@pytest.mark.parametrize("path, fmt, words", [("/dev/zero", "auto", "is a character device"),
                                              ("FOLDER", "hf", "is a folder")])
def test_what_can_never_be_read_is_refused_at_start(tmp_path, path, fmt, words) -> None:
    path = str(tmp_path) if path == "FOLDER" else path
    res = subprocess.run(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{free_port()}", "--log",
                                      path, "--format", fmt), cwd=REPO, capture_output=True, timeout=30)
    err = res.stderr.decode()
    assert res.returncode == 2 and words in err and path in err and len(err.splitlines()) == 1, err


def test_a_folder_is_still_a_trainer_output_dir(tmp_path) -> None:
    """Only what can never be read is refused: a folder read as a Trainer's output_dir is served (and its
    trainer_state.json, once there, read); that it holds nothing yet is said, not waited for without a word."""
    port, p = serve("--log", str(tmp_path), "--run", "outdir")
    try:
        wait_up(port)
        ckpt = tmp_path / "checkpoint-2"
        ckpt.mkdir()
        (ckpt / "trainer_state.json").write_text('{"log_history": [{"loss": 1.0, "step": 1}, '
                                                 '{"loss": 0.9, "step": 2}]}')
        wait_value(port, "posttrain_step", 2, run="outdir")
    finally:
        stop_within(p)
    assert b"holding no trainer_state.json and no event files yet: waiting" in p.stderr.read()  # said, once


HUNG_READ = """
    import sys, threading
    from exporter.sources import files
    files.FileFollower._read = lambda self, fd, n: threading.Event().wait()  # a read that never returns
    from exporter.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def test_a_read_that_hangs_holds_neither_a_scrape_nor_sigterm(tmp_path) -> None:
    """The read of a log on a hung mount never returns: scrapes still answer within a second, and SIGTERM ends
    the process within five seconds (the reading thread is left behind)."""
    log = tmp_path / "train.log"
    log.write_text(LINES[0] + "\n")
    port, p = serve("--log", str(log), argv=[sys.executable, "-c", textwrap.dedent(HUNG_READ)])
    try:
        wait_up(port)
        time.sleep(0.5)  # the loop is in its read by now
        for _ in range(5):
            took, body = timed_scrape(port)
            assert took < 1.0 and value(body, "posttrain_step", run=tmp_path.name) is None
    finally:
        stop_within(p)


def test_dump_of_a_fifo_waits_for_its_writer_then_reads_it_to_its_end(tmp_path) -> None:
    """`dump FIFO` before anyone opened it for writing: it waits for the writer (as `cat` does, said once), instead
    of taking the empty FIFO for an ended stream; then reads what the writer wrote, to its end."""
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    p = subprocess.Popen(exporter_cmd("dump", str(fifo)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = b""
        os.set_blocking(p.stderr.fileno(), False)
        deadline = time.monotonic() + 20
        while b"waiting for one" not in said and time.monotonic() < deadline and p.poll() is None:
            said += p.stderr.read() or b""
            time.sleep(0.1)
        assert b"no writer has opened the FIFO yet" in said, said
        time.sleep(1.0)
        assert p.poll() is None, "dump took a FIFO with no writer yet for an ended stream"
        with open(fifo, "w") as w:
            w.write("\n".join(LINES[:3]) + "\n")
        out, _ = p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 0
    assert f'posttrain_step{{run="{tmp_path.name}"}} 3.0' in out.decode()  # train.fifo: named by its folder


def test_dump_of_a_fifo_whose_writer_waits_already_never_cuts_it_off(tmp_path) -> None:
    """The usual order, `trainer > FIFO &` then `dump FIFO`: the writer waits in its open for a reader. dump's
    readability check must not open the FIFO: its open lets the writer go on, and its close at once leaves the
    writer with no reader (EPIPE; SIGPIPE kills a shell's redirect), and dump then waits for a writer that never
    comes. Here the writer writes a moment after its open returns; the check must leave it waiting for the reader
    that reads it (the follower's open, here ours)."""
    from exporter.commands.specs import check_readable
    from exporter.config import LogSpec
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        fd = os.open(sys.argv[1], os.O_WRONLY)  # waits for a reader
        time.sleep(0.3)
        os.write(fd, b"written\\n")
        os.close(fd)
        """), str(fifo)], stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)  # the writer waits in its open
        check_readable([LogSpec(str(fifo), "train")])
        time.sleep(0.6)  # had the check let the writer go, it wrote by now, to no reader
        assert writer.poll() is None, writer.communicate()[1].decode()
        with open(fifo, "rb") as r:  # the follower's open
            assert r.read() == b"written\n"
        _, werr = writer.communicate(timeout=10)
        assert writer.returncode == 0, werr.decode()
    finally:
        writer.kill()
