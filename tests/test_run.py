"""`posttrain-exporter run -- python train.py`: the trainer as a child, its output passed through byte for byte, read
as its run, its exit status and signals; and `serve --log -` copying its input to standard output."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, run_cli

from exporter import cli
from exporter.pipeline import ConsoleStream

# Bytes a trainer may print: partial lines, \r progress bars, invalid UTF-8, a character cut between two writes.
STDOUT_BYTES = b"plain line\n{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': 0.1}\n\xff\xfe raw\n"
STDERR_BYTES = b"  1%|          | 1/100 [00:01<00:10]\r  2%|          | 2/100\rno newline at the end \xe2\x82"


def child_script(body: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(body)]


WRITER = f"""
    import os, sys, time
    out, err = {STDOUT_BYTES!r}, {STDERR_BYTES!r}
    for i in range(0, max(len(out), len(err)), 7):  # small writes, interleaved
        os.write(1, out[i:i + 7]); os.write(2, err[i:i + 7])
    os.write(2, b"\\xac")  # the rest of the cut character
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def run_cmd(*args: str, child: list[str], port: int | None = None) -> list[str]:
    return exporter_cmd("--log-level", "error", "run", "--no-gpu", "--web.listen-address",
                        f"127.0.0.1:{port or free_port()}", *args, "--", *child)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def wait_metric(port: int, needle: str, timeout: float = 20) -> str:
    deadline, body = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            body = scrape(port)
            if needle in body:
                return body
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not scraped within {timeout}s:\n{body[:1500]}")


def test_output_passes_through_byte_for_byte_and_the_exit_code_is_the_trainers() -> None:
    res = subprocess.run(run_cmd(child=[*child_script(WRITER), "3"]), cwd=REPO, capture_output=True, timeout=60)
    assert res.stdout == STDOUT_BYTES
    assert res.stderr == STDERR_BYTES + b"\xac"
    assert res.returncode == 3


def test_trainer_killed_by_a_signal_exits_as_a_shell_reports_it() -> None:
    res = subprocess.run(run_cmd(child=child_script("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")),
                         cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 128 + signal.SIGKILL


@pytest.mark.parametrize(("sig", "handled"), [(signal.SIGTERM, True), (signal.SIGTERM, False), (signal.SIGINT, True)])
def test_signals_are_forwarded_to_the_trainer(sig, handled) -> None:
    body = """
        import signal, sys, time
        def bye(signum, frame):
            print("trainer got", signal.Signals(signum).name, flush=True)
            sys.exit(0)
        if HANDLED:
            signal.signal(signal.SIGTERM, bye)
            signal.signal(signal.SIGINT, bye)
        print("ready", flush=True)
        time.sleep(60)
    """.replace("HANDLED", str(handled))
    p = subprocess.Popen(run_cmd(child=child_script(body)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    if handled:
        assert out == f"trainer got {sig.name}\n".encode() and p.returncode == 0, err
    else:
        assert p.returncode == 128 + sig


def test_trainer_output_is_read_as_its_run(tmp_path) -> None:
    """The real combined stream of a TRL GRPO run (stdout records, stderr progress bars), printed by the child."""
    log = TRL / "grpo" / "combined.log"
    body = f"""
        import os, sys, time
        data = open({str(log)!r}, "rb").read()
        for i in range(0, len(data), 4096):
            os.write(1, data[i:i + 4096])
        time.sleep(60)
    """
    port = free_port()
    out = tmp_path / "stdout"
    with out.open("wb") as f:
        p = subprocess.Popen(run_cmd("--run", "grpo-child", child=child_script(body), port=port), cwd=REPO,
                             stdout=f, stderr=subprocess.PIPE)
    try:
        text = wait_metric(port, 'posttrain_step{run="grpo-child"} 300.0')  # the run's last step
        assert "posttrain_reward_std{" in text
        assert out.read_bytes() == log.read_bytes()
        p.send_signal(signal.SIGTERM)  # forwarded: the trainer dies of it, and so the exit status says
        p.wait(timeout=20)
        assert p.returncode == 128 + signal.SIGTERM
    finally:
        p.kill()


def test_ingest_failure_never_stops_the_pass_through(monkeypatch, capfd, caplog) -> None:
    """Parsing that raises on every chunk: the trainer's output still passes through whole and its exit status is
    returned."""

    def broken(self, text: str) -> None:
        raise RuntimeError("parser bug")

    monkeypatch.setattr(ConsoleStream, "feed", broken)
    lines = b"".join(b"{'loss': %d.5, 'epoch': 0.1}\n" % i for i in range(2000))
    body = f"""
        import os, sys
        data = {lines!r}
        for i in range(0, len(data), 999):
            os.write(1, data[i:i + 999])
        sys.exit(5)
    """
    code = cli.main(["run", "--no-gpu", "--web.listen-address", f"127.0.0.1:{free_port()}", "--",
                     *child_script(body)])
    out, err = capfd.readouterr()
    assert code == 5
    assert out.encode() == lines
    assert "ingest failed" in err + caplog.text


def test_trainer_survives_a_closed_stdout_of_the_exporter() -> None:
    """Nobody reads the exporter's standard output any more (EPIPE): the trainer still runs to its end."""
    body = """
        import sys, time
        for i in range(3000):
            print("{'loss': 0.5, 'epoch': 0.1} padding padding padding padding padding padding", flush=True)
        sys.stderr.write("trainer finished\\n")
    """
    r, w = os.pipe()
    os.close(r)  # the reading end is gone before the first write
    try:
        res = subprocess.run(run_cmd(child=child_script(body)), cwd=REPO, stdout=w, stderr=subprocess.PIPE,
                             timeout=60)
    finally:
        os.close(w)
    assert res.returncode == 0 and b"trainer finished" in res.stderr


def test_cannot_start_the_trainer_is_a_one_line_error() -> None:
    res = subprocess.run(run_cmd(child=["/nonexistent/python", "train.py"]), cwd=REPO, capture_output=True,
                         timeout=60)
    assert res.returncode == 2 and b"cannot start /nonexistent/python" in res.stderr


def test_run_needs_a_command() -> None:
    res = subprocess.run(exporter_cmd("run", "--no-gpu"), cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 2 and b"COMMAND" in res.stderr


# --- serve --log -: standard input copied to standard output ---------------------------------------------------


def test_stdin_is_copied_to_stdout_and_a_closed_stdout_does_not_stop_the_reading(tmp_path) -> None:
    """`python train.py 2>&1 | posttrain-exporter serve --log - | head -1`: once `head` is gone the exporter's
    standard output is a broken pipe; it goes on reading (the trainer upstream never sees EPIPE) and parsing."""
    data = (TRL / "dpo" / "combined_unbuffered.log").read_bytes()
    port = free_port()
    r, w = os.pipe()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log", "-"),
                         cwd=REPO, stdin=subprocess.PIPE, stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    try:
        p.stdin.write(data[:1000])
        p.stdin.flush()
        first = os.read(r, 100)
        assert data.startswith(first)
        os.close(r)  # `head` exits
        p.stdin.write(data[1000:])  # would raise BrokenPipeError if the exporter had stopped reading
        p.stdin.close()
        wait_metric(port, 'posttrain_run_finished{run="stdin"} 1.0')
        assert p.poll() is None
    finally:
        p.terminate()
        assert p.wait(10) == 0, p.stderr.read().decode()


def test_parsing_that_falls_behind_never_holds_the_trainer_back(tmp_path) -> None:
    """Nobody polls the reader (parsing stuck): the trainer's 4 MB still pass through whole, parsing skips what
    is beyond its limit (counted), and the trainer finishes."""
    from exporter.sources.child import ChildOutput

    data = b"".join(b"{'loss': %d.5, 'epoch': 0.1}\n" % i for i in range(150_000))
    src = tmp_path / "out.bin"
    src.write_bytes(data)
    out = (tmp_path / "passed").open("wb")
    try:
        child = ChildOutput([sys.executable, "-c", f"import sys; sys.stdout.buffer.write(open({str(src)!r}, 'rb')"
                             ".read())"], stdout_fd=out.fileno(), stderr_fd=None, max_pending=1 << 20)
        assert child.exit_status() == 0
        assert child.wait_output(10)
    finally:
        out.close()
    assert (tmp_path / "passed").read_bytes() == data
    feed = child.feed  # what the exporter reads
    assert feed.dropped_bytes > 0 and feed.bytes_read == len(data)
    parsed = "".join(feed.poll())
    assert len(parsed) + feed.dropped_bytes == len(data) and feed.closed


def _beside_feed_stream(fed: bool):
    """The trainer's console stream as `run --` with the feed builds it (exporter/launch.py), over a real run."""
    from conftest import FIXTURES

    from exporter.instruments.keymap import KeyMap
    from exporter.launch import ConsoleBesideFeed, Launch
    from exporter.parsers.chain import LineParserChain
    from exporter.parsers.training import Training
    from exporter.pipeline import ConsoleStream, IngestStats
    from exporter.runstate import RunState

    run = RunState("trainer", KeyMap())
    launch = Launch("trainer")
    if fed:  # the feed has begun this launch's training: the console's metric records are the feed's duplicates
        run.training = Training.new(0, launch.token)
    stream = ConsoleStream(ConsoleBesideFeed(run, launch), IngestStats(), LineParserChain("auto"))  # type: ignore[arg-type]
    return run, stream, FIXTURES


@pytest.mark.parametrize("fed", [False, True])
def test_the_trainers_console_beside_its_feed_reads_postfixes_and_completions(fed: bool) -> None:
    """Everything a console stream reads of its run works through the wrapper `run --` puts between them: bar
    postfixes (OpenRLHF) and printed completions (TRL's tables). Once the feed carries the training, the console's
    metrics are left to it, but the completions, which only the console shows, still reach the run."""
    run, stream, fixtures = _beside_feed_stream(fed)
    stream.feed((fixtures / "openrlhf" / "sft_v0_8_0.log").read_text(errors="replace"))
    stream.feed((fixtures / "corpus" / "grpo_template_collapse" / "combined.log").read_text(errors="replace"))
    stream.finish()
    run.refresh()
    assert ("loss" in run.series or any(k[0] == "loss" for k in run.series)) != fed
    assert run.samples.total_sets > 0
    assert any("diversity" in str(k) for k in run.series)


def _signal_a_side_thread(pid: int, sig: int) -> None:
    """`sig` to one of the process's threads other than its main one (tgkill): the kernel may hand a process's
    signal to any thread that does not block it, and this makes that case happen every time, not by chance."""
    tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)
    assert tids, "the exporter runs threads beside its main one by now"
    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # SYS_tgkill
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(number, pid, tids[-1], sig) == 0, os.strerror(ctypes.get_errno())


def test_a_signal_handed_to_a_side_thread_still_reaches_the_trainer() -> None:
    body = """
        import time
        print("ready", flush=True)
        time.sleep(60)
    """
    p = subprocess.Popen(run_cmd(child=child_script(body)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        time.sleep(1.0)  # the exporter's side is up: its threads are there
        _signal_a_side_thread(p.pid, signal.SIGTERM)
        p.communicate(timeout=10)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM


def test_sigterm_ends_the_linger_at_once() -> None:
    """`run --linger 60` keeps serving after the trainer exited, for a last scrape; a SIGTERM (the pod stopping)
    ends it at once with the trainer's status, whichever of the exporter's threads the kernel handed it to."""
    p = subprocess.Popen(run_cmd("--linger", "60", child=child_script('print("done", flush=True)')), cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"done\n"
        time.sleep(1.5)  # the trainer has exited: lingering now
        assert p.poll() is None
        _signal_a_side_thread(p.pid, signal.SIGTERM)
        p.communicate(timeout=10)
    finally:
        p.kill()
    assert p.returncode == 0


def test_a_log_that_is_the_trainers_feed_counts_its_lines_for_the_trainers_run(tmp_path) -> None:
    """`run --` with a feed log beside it: once the feed's identity line names this launch, the log's records are the
    trainer's run, and so are its lines, records and unreadable lines in /metrics and in the verdict's `read` (before,
    its counts stayed with the log's own run, which is dropped: they were lost from both)."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from exporter.app import Exporter
    from exporter.config import Config, LogSpec
    from exporter.exposition.collector import ExporterCollector
    from exporter.launch import Launch

    launch = Launch("trainer")
    feed = tmp_path / "feed.jsonl"
    identity = {"posttrain_training": {"id": "t1", "started": "2026-11-26T06:04:02Z", "step": 0,
                                       "launch": launch.token}}
    rows = [json.dumps(identity)] + [json.dumps({"loss": 1.0 / i, "step": i}) for i in range(1, 6)]
    rows.insert(3, '{"loss": 0.5, "step": ')  # a cut line inside the feed
    feed.write_text("\n".join(rows) + "\n")
    ex = Exporter(Config(), [LogSpec(str(feed), "feed", "json")], launch=launch)
    ex.read_to_end()
    assert set(ex.runs) == {"trainer"} and ex.runs["trainer"].step == 5
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ex))
    text = generate_latest(registry).decode()
    records = re.search(r'posttrain_exporter_lines_total\{format="jsonl",outcome="record",run="trainer"\} (\S+)', text)
    assert records and float(records.group(1)) == 6, text[:3000]  # the identity line and the five
    assert re.search(r'posttrain_exporter_parse_errors_total\{format="jsonl",reason="\w+",run="trainer"\} 1', text)
    (doc,) = ex.verdict()["runs"]
    assert doc["read"]["records"].get("jsonl") == 6 and doc["read"]["errors"] == 1, doc["read"]


# --- a hostile trainer: its exit status and its bytes are ours, whatever it does ------------------------------------


def test_a_trainer_that_forks_children_keeps_its_status_and_their_output() -> None:
    """The trainer starts a child that outlives it and prints after it exited (a data-loader worker, a background
    upload): `run` exits with the trainer's status, and the late child's bytes are passed on too."""
    body = """
        import os, sys, time
        if os.fork() == 0:
            time.sleep(0.5)
            os.write(1, b"late child line\\n")
            os._exit(0)
        os.write(1, b"trainer line\\n")
        os.write(2, b"trainer stderr\\n")
        sys.exit(7)
    """
    res = subprocess.run(run_cmd(child=child_script(body)), cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 7
    assert res.stdout == b"trainer line\nlate child line\n" and res.stderr == b"trainer stderr\n"


def test_a_trainer_that_ignores_sigterm_keeps_its_status_and_output() -> None:
    """SIGTERM is forwarded once; a trainer that ignores it runs on to its end, its output whole and its status ours
    (`run` neither kills it nor exits before it)."""
    body = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"ready\\n")
        for i in range(20):
            os.write(1, b"{'loss': %d.5, 'epoch': 0.%d}\\n" % (i, i))
            time.sleep(0.1)
        sys.exit(3)
    """
    p = subprocess.Popen(run_cmd(child=child_script(body)), cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, bufsize=0)  # unbuffered: readline takes no more than its line
    try:
        assert p.stdout.readline() == b"ready\n"
        p.terminate()
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 3
    assert out == b"".join(b"{'loss': %d.5, 'epoch': 0.%d}\n" % (i, i) for i in range(20))


def test_a_trainer_that_closes_its_stdout_early_keeps_its_status_and_stderr() -> None:
    """The trainer closes its standard output at once and goes on writing to stderr: nothing is lost of stderr, the
    status is its own, and the exporter does not take the closed stream for the trainer's end."""
    body = """
        import os, sys, time
        os.write(1, b"before close\\n")
        os.close(1)
        time.sleep(0.5)
        for i in range(200):
            os.write(2, b"err line %d\\n" % i)
        os._exit(5)
    """
    res = subprocess.run(run_cmd(child=child_script(body)), cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 5
    assert res.stdout == b"before close\n"
    assert res.stderr == b"".join(b"err line %d\n" % i for i in range(200))


def test_an_exporter_killed_mid_read_and_restarted_counts_every_record_once(tmp_path) -> None:
    """`serve` on a log, killed with SIGKILL while it reads the log's history, restarted on the same file: the new
    process reads every record once (the counts are the log's, no record lost, none counted twice)."""
    text = (TRL / "grpo" / "combined_unbuffered.log").read_text(encoding="utf-8")
    log = tmp_path / "train.log"
    log.write_text(text * 150, encoding="utf-8")  # 34 MB: long enough to be mid-read when killed
    needle = 'posttrain_exporter_lines_total{format="hf_dict",outcome="record",run="r"} '
    dumped = run_cli("dump", "--run", "r", str(log), timeout=300).stdout.decode()  # one process, read whole
    records = float(dumped.split(needle, 1)[1].split("\n", 1)[0])
    assert records >= 150 * text.count("{'loss'")

    def serve() -> tuple[subprocess.Popen, int]:
        port = free_port()
        return subprocess.Popen(exporter_cmd("--log-level", "error", "serve", "--no-gpu", "--web.listen-address",
                                             f"127.0.0.1:{port}", "--log", str(log), "--run", "r"),
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port

    first, port = serve()
    try:
        seen = wait_metric(port, needle, timeout=30)
        first.kill()  # mid-read: its history is far from read whole
        assert float(seen.split(needle, 1)[1].split("\n", 1)[0]) < records, "read whole before it was killed"
        first.wait(10)
    finally:
        first.kill()
    second, port = serve()
    try:
        deadline, got = time.monotonic() + 240, -1.0
        while time.monotonic() < deadline:
            body = wait_metric(port, needle, timeout=30)
            got = float(body.split(needle, 1)[1].split("\n", 1)[0])
            if got >= records:
                break
            time.sleep(0.5)
        time.sleep(1)
        body = scrape(port)
        assert float(body.split(needle, 1)[1].split("\n", 1)[0]) == records
    finally:
        second.terminate()
        second.wait(20)
