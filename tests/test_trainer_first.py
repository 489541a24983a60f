"""The trainer comes first (issue 23, item 3): in `run -- CMD` and `serve --log -` the pass-through starts before
and apart from the HTTP side. Real processes, real pipes, real ports on loopback: a taken port or a bad web
config never stops the trainer or changes its output; the port is retried; a slow or failing standard output is
waited for or retried, never given up for good; a slow stdout never holds the trainer's stderr; and the exporter's
own log lines never land inside a trainer's line."""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, exporter_cmd, free_port

TRAINER_OUT = b"".join(b"{'loss': %d.5, 'grad_norm': 1.0, 'epoch': 0.%d}\n" % (i, i % 10) for i in range(2000))
TRAINER_ERR = b"".join(b" %3d%%|##   | %d/2000\r" % (i // 20, i) for i in range(0, 2000, 50)) + b"done\n"


def trainer(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


WRITER = trainer(f"""
    import os, sys
    out, err = {TRAINER_OUT!r}, {TRAINER_ERR!r}
    for i in range(0, len(out), 4096):
        os.write(1, out[i:i + 4096])
        os.write(2, err[i // 100:(i + 4096) // 100])
    os.write(2, err[(len(out) // 100) + 40:])
    sys.exit(3)
""")


def taken_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def without_exporter_lines(err: bytes) -> bytes:
    """The trainer's stderr: the exporter's own log lines (whole lines, logfmt) taken out."""
    return b"".join(ln for ln in err.splitlines(keepends=True) if not ln.startswith(b"ts="))


def test_run_with_the_port_taken_runs_the_trainer_to_its_end_unchanged() -> None:
    sock, port = taken_port()
    with sock:
        res = subprocess.run(exporter_cmd("run", "--no-gpu", "--web.listen-address", f"127.0.0.1:{port}", "--",
                                          *WRITER), cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 3, res.stderr[-2000:]
    assert res.stdout == TRAINER_OUT
    assert without_exporter_lines(res.stderr).endswith(b"done\n")
    assert b"cannot listen on 127.0.0.1:%d" % port in res.stderr and b"level=error" in res.stderr


def test_run_with_a_bad_web_config_runs_the_trainer_and_says_so(tmp_path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: [this is not a mapping\n")
    res = subprocess.run(exporter_cmd("run", "--no-gpu", "--web.listen-address", f"127.0.0.1:{free_port()}",
                                      "--web.config.file", str(bad), "--", *WRITER), cwd=REPO, capture_output=True,
                         timeout=60)
    assert res.returncode == 3 and res.stdout == TRAINER_OUT
    assert b"level=error" in res.stderr and b"the exporter cannot start" in res.stderr


def test_run_retries_a_taken_port_until_it_is_free() -> None:
    """The port is freed while the trainer runs: the exporter serves from then on, the trainer's run included."""
    sock, port = taken_port()
    body = """
        import time
        for i in range(40):
            print("{'loss': %d.5, 'epoch': 0.1}" % i, flush=True)
            time.sleep(0.5)
    """
    p = subprocess.Popen(exporter_cmd("run", "--no-gpu", "--run", "late", "--web.listen-address",
                                      f"127.0.0.1:{port}", "--", *trainer(body)), cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        sock.close()
        deadline, text = time.monotonic() + 20, ""
        while time.monotonic() < deadline and 'posttrain_step{run="late"}' not in text:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.3)
        assert 'posttrain_step{run="late"}' in text
    finally:
        p.kill()
        p.wait()
        sock.close()


def test_stdin_with_the_port_taken_copies_it_whole_and_the_trainer_lives() -> None:
    """`python train.py | posttrain-exporter serve --log -` with its port taken: the trainer writes to its end
    (no broken pipe), and standard output is its output, byte for byte."""
    sock, port = taken_port()
    with sock:
        exporter = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}",
                                                 "--log", "-"), cwd=REPO, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        got: list[bytes] = []
        said: list[bytes] = []

        def read(fd: int, into: list[bytes]) -> None:
            while chunk := os.read(fd, 1 << 16):
                into.append(chunk)

        reader = threading.Thread(target=read, args=(exporter.stdout.fileno(), got), daemon=True)
        reader.start()
        threading.Thread(target=read, args=(exporter.stderr.fileno(), said), daemon=True).start()
        try:
            for i in range(0, len(TRAINER_OUT), 1000):  # the trainer upstream: a broken pipe would raise here
                exporter.stdin.write(TRAINER_OUT[i:i + 1000])
                exporter.stdin.flush()
            exporter.stdin.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (len(b"".join(got)) < len(TRAINER_OUT)
                                                   or b"cannot listen on" not in b"".join(said)):
                time.sleep(0.1)
            assert exporter.poll() is None  # still serving (retrying the port), not dead
        finally:
            exporter.terminate()
            exporter.wait(10)
            reader.join(10)
    assert b"".join(got) == TRAINER_OUT
    assert b"cannot listen on" in b"".join(said)


def test_a_slow_stdout_reader_never_holds_the_trainers_stderr(tmp_path) -> None:
    """Nobody reads our stdout for a while: the trainer's stdout waits (as it would without us), but its stderr
    goes on: a thread of the trainer writes 1 MB to stderr and says so while its stdout is blocked."""
    marker = tmp_path / "stderr-done"
    body = f"""
        import os, threading, pathlib, time
        def err():
            time.sleep(1.0)  # stdout is full and unread by now
            for _ in range(256):
                os.write(2, b"e" * 4095 + b"\\n")
            pathlib.Path({str(marker)!r}).touch()
        t = threading.Thread(target=err)
        t.start()
        os.write(1, b"o" * (8 << 20))
        t.join()
    """
    r, w = os.pipe()
    with (tmp_path / "stderr").open("wb") as err:
        p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                                          f"127.0.0.1:{free_port()}", "--", *trainer(body)), cwd=REPO, stdout=w,
                             stderr=err)
    os.close(w)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not marker.exists():
            time.sleep(0.1)
        assert marker.exists(), "the trainer's stderr was held by a stdout nobody read"
        got = b""
        while chunk := os.read(r, 1 << 20):
            got += chunk
        assert got == b"o" * (8 << 20)
        assert p.wait(30) == 0
    finally:
        p.kill()
        os.close(r)


def test_a_non_blocking_stdout_that_is_full_is_waited_for_not_given_up(tmp_path) -> None:
    """Our stdout is a pipe someone made non-blocking (EAGAIN when full) and its reader is slow: every byte still
    arrives; the copy is never given up."""
    body = """
        import os
        for i in range(3000):
            os.write(1, b"line %05d ------------------------------------------------------------\\n" % i)
    """
    r, w = os.pipe()
    os.set_blocking(w, False)  # the file description is shared: our copy of it is non-blocking too
    p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                                      f"127.0.0.1:{free_port()}", "--", *trainer(body)), cwd=REPO, stdout=w,
                         stderr=subprocess.PIPE)
    os.close(w)
    try:
        time.sleep(1.5)  # the pipe fills: EAGAIN for a while
        got = b""
        while chunk := os.read(r, 1 << 16):
            got += chunk
        assert p.wait(30) == 0
    finally:
        p.kill()
        os.close(r)
    assert got.count(b"\n") == 3000 and got.endswith(b"line 02999 " + b"-" * 60 + b"\n")


def test_a_brief_write_failure_of_stdout_is_retried_not_given_up_for_good(tmp_path) -> None:
    """Writes to our stdout fail for a while (a file at its size limit: EFBIG, as ENOSPC on a full disk), then
    room is made: the lines written after that reach the file (a failure shorter than a second loses nothing: the
    chunk is retried); the trainer never notices."""
    out, room = tmp_path / "pod.log", tmp_path / "room-made"
    body = f"""
        import os, time
        for i in range(1200):
            if i == 900:  # the rest once room is made
                while not os.path.exists({str(room)!r}):
                    time.sleep(0.05)
            print("line %04d " % i + "-" * 80, flush=True)
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    port = free_port()
    try:
        p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                                          f"127.0.0.1:{port}", "--", *trainer(body)), cwd=REPO, stdout=fd,
                             stderr=subprocess.PIPE, preexec_fn=limit)
    finally:
        os.close(fd)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and out.stat().st_size < (64 << 10) - 200:
            time.sleep(0.05)
        time.sleep(2.0)  # writes fail now, for longer than a chunk is retried: chunks are dropped
        # ... and the loss is counted where the operator looks (the records themselves still reached the parser)
        lost = re.compile(r'^posttrain_exporter_source_dropped_bytes_total\{[^}]*reason="output_failed"[^}]*\} '
                          r'([0-9.e+]+)$', re.M)
        seen, deadline = 0.0, time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            try:
                body_now = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                seen = max((float(v) for v in lost.findall(body_now)), default=0.0)
            except OSError:
                time.sleep(0.2)
        assert seen > 0, "bytes the pod log lost are not counted"
        assert re.search(r'^posttrain_exporter_source_write_errors_total\{[^}]*\} [1-9]', body_now, re.M), \
            "the failed writes are not counted"
        os.truncate(out, 0)  # room again
        room.touch()
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0
    text = out.read_text()
    assert text.endswith("line 1199 " + "-" * 80 + "\n"), (text[-300:], err[-1000:])
    assert text.count("\n") == 300  # what came while it failed was dropped, what came after was not
    assert b"cannot write stdout" in err and b"writing stdout again" in err, err


def test_the_exporters_log_lines_never_land_inside_a_trainers_line() -> None:
    """The trainer starts a stderr line, pauses, and ends it; the exporter logs meanwhile (the port is taken):
    the trainer's line arrives whole, and the exporter's lines around it, whole."""
    sock, port = taken_port()
    body = """
        import os, time
        os.write(2, b"epoch 1: starting a line ")
        time.sleep(2.5)
        os.write(2, b"and ending it\\n")
    """
    with sock:
        res = subprocess.run(exporter_cmd("run", "--no-gpu", "--web.listen-address", f"127.0.0.1:{port}", "--",
                                          *trainer(body)), cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 0
    assert b"epoch 1: starting a line and ending it\n" in res.stderr, res.stderr
    both = res.stdout + res.stderr
    assert b"cannot listen on" in both  # said: on stdout, at a line boundary, while stderr was inside one
    for line in both.splitlines():
        assert line.startswith(b"ts=") or line == b"epoch 1: starting a line and ending it", line


def test_an_exporter_killed_for_memory_leaves_the_trainer_and_its_output_whole(tmp_path) -> None:
    """SIGKILL of the exporter (as the OOM killer does it) in the middle of the run: the trainer is not touched,
    its output reaches the log to its last line (the copier is a process of its own)."""
    out, done = tmp_path / "pod.log", tmp_path / "trainer-finished"
    body = f"""
        import pathlib, time
        for i in range(60):
            print("{{'loss': %d.5, 'epoch': 0.1}}" % i, flush=True)
            time.sleep(0.05)
        pathlib.Path({str(done)!r}).touch()
    """
    with out.open("wb") as f:
        p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                                          f"127.0.0.1:{free_port()}", "--", *trainer(body)), cwd=REPO, stdout=f,
                             stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    p.kill()
    p.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not done.exists():
        time.sleep(0.1)
    assert done.exists(), "the trainer died with the exporter"
    time.sleep(0.3)
    assert out.read_text().splitlines()[-1] == "{'loss': 59.5, 'epoch': 0.1}"


def test_stdin_with_a_bad_config_is_copied_whole_then_the_error_ends_serve(tmp_path) -> None:
    """`serve --log - --config broken.yml`: the input is copied to its end (the trainer upstream never sees a broken
    pipe), the error is said while it is, and once the input has ended it ends `serve` as it would at start."""
    bad = tmp_path / "broken.yml"
    bad.write_text("logs: [unclosed\n")
    res = subprocess.run(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{free_port()}", "--log",
                                      "-", "--config", str(bad)), cwd=REPO, input=TRAINER_OUT, capture_output=True,
                         timeout=120)
    assert res.stdout == TRAINER_OUT
    assert res.returncode == 2 and b"config error" in res.stderr


def _nice(path: str) -> int:
    return int(open(path).read().rsplit(")", 1)[1].split()[16])  # field 19 of stat(5)


@pytest.mark.parametrize("parent_nice", [0, 5, 10])
def test_parsing_yields_the_cpu_to_the_trainer(tmp_path, parent_nice: int) -> None:
    """`run`: the thread that parses runs at the trainer's niceness + 10 (capped at 19), so a burst the trainer prints
    never makes the two compete as equals, whatever niceness the launcher gave us both (a launcher at nice 10 left
    parser and trainer equal with an absolute nice 10); the trainer, the copier on its path and the exporter's other
    threads keep the niceness they were started with."""
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the suite itself may run niced
    start = min(19, base + parent_nice)
    expected = min(19, start + 10)
    said = tmp_path / "trainer-nice"
    body = f"""
        import os, pathlib, time
        pathlib.Path({str(said)!r}).write_text(str(os.getpriority(os.PRIO_PROCESS, 0)))
        time.sleep(4)
    """
    p = subprocess.Popen(["nice", "-n", str(parent_nice),
                          *exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                                        f"127.0.0.1:{free_port()}", "--", *trainer(body))], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        threads: dict[int, int] = {}
        copier = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (expected not in threads.values() or copier is None):
            try:
                tids = os.listdir(f"/proc/{p.pid}/task")
            except OSError:
                tids = []
            for tid in tids:
                try:
                    threads[int(tid)] = _nice(f"/proc/{p.pid}/task/{tid}/stat")
                except OSError:
                    continue
            try:
                kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            except OSError:
                kids = []
            for kid in kids:
                try:
                    if b"exporter.sources.copier" in Path(f"/proc/{kid}/cmdline").read_bytes():
                        copier = _nice(f"/proc/{kid}/stat")
                except OSError:
                    continue
            time.sleep(0.1)
        assert p.wait(30) == 0
    finally:
        p.kill()
    assert expected in threads.values(), f"no thread of the exporter yields: {threads} (expected nice {expected})"
    assert threads[p.pid] == start and copier == start, (threads, copier)
    assert said.read_text() == str(start)
    if start < 19:
        assert max(threads.values()) > start, threads  # the parser is below the trainer, never equal


def test_the_copiers_own_lines_follow_the_exporters_log_format() -> None:
    """--log.format json: the copier's note (nobody reads our stdout any more) is a JSON line as the exporter's are,
    its message whole; a trainer's quote in the message does not break it."""
    body = """
        import os, time
        for i in range(50):
            os.write(1, b"step %d \\"quoted\\"\\n" % i)
            time.sleep(0.01)
    """
    r, w = os.pipe()
    os.close(r)  # nobody reads our stdout: EPIPE
    res = subprocess.run(exporter_cmd("--log.format", "json", "--log-level", "warn", "run", "--no-gpu",
                                      "--web.listen-address", f"127.0.0.1:{free_port()}", "--", *trainer(body)),
                         cwd=REPO, stdout=w, stderr=subprocess.PIPE, timeout=60)
    os.close(w)
    assert res.returncode == 0
    lines = [json.loads(ln) for ln in res.stderr.splitlines() if ln.strip()]
    copier = [d for d in lines if d["logger"] == "posttrain-exporter.copier"]
    assert copier and "nobody reads stdout any more" in copier[0]["msg"], res.stderr
