"""`serve` and `demo` as real processes, scraped over HTTP on loopback."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port
from prometheus_client.parser import text_string_to_metric_families

LINES = [ln for ln in (TRL / "grpo" / "stdout.log").read_text().splitlines() if ln.startswith("{'loss'")]


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def wait_for(port: int, pred, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            _, last = scrape(port)
            if pred(last):
                return last
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout}s; last scrape:\n{last[:2000]}")


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(*args: str, stdin=None) -> tuple[int, subprocess.Popen]:
        port = free_port()
        # standard output to a file: with `--log -` the exporter copies its input there, and a pipe nobody
        # reads would fill and hold it (as it would hold the trainer: the copy is the trainer's own output)
        with (tmp_path / f"stdout-{port}").open("wb") as out:
            p = subprocess.Popen(exporter_cmd("serve", "--listen-address", f"127.0.0.1:{port}", *args), cwd=REPO,
                                 stdin=stdin, stdout=out, stderr=subprocess.PIPE)
        p.stdout_path = tmp_path / f"stdout-{port}"  # type: ignore[attr-defined]
        procs.append(p)
        return port, p

    yield start
    for p in procs:
        p.terminate()
        assert p.wait(timeout=10) == 0, p.stderr.read().decode()


def test_appended_record_shows_on_metrics(serve, tmp_path) -> None:
    log = tmp_path / "train.log"
    log.write_text(LINES[0] + "\n")
    port, _ = serve("--log", str(log), "--run", "grpo-test")
    wait_for(port, lambda t: value(t, "posttrain_step", run="grpo-test") == 1)
    assert scrape(port, "/healthz") == (200, "ok\n")
    with log.open("a") as f:
        f.write(LINES[1] + "\n")
    text = wait_for(port, lambda t: value(t, "posttrain_step", run="grpo-test") == 2)
    assert value(text, "posttrain_kl", run="grpo-test") == float(LINES[1].split("'kl': '")[1].split("'")[0])
    assert value(text, "process_resident_memory_bytes") is not None


def test_waits_for_a_log_that_does_not_exist_yet(serve, tmp_path) -> None:
    log = tmp_path / "later.log"
    port, _ = serve("--log", str(log))
    wait_for(port, lambda t: value(t, "posttrain_exporter_source_up", run="later") == 0)
    log.write_text(LINES[0] + "\n")
    wait_for(port, lambda t: value(t, "posttrain_step", run="later") == 1)


def test_stdin_keeps_serving_after_input_ends(serve) -> None:
    port, popen = serve("--log", "-", stdin=subprocess.PIPE)
    # the unbuffered combined stream of a real run, progress bars included
    data = (TRL / "dpo" / "combined_unbuffered.log").read_bytes()
    popen.stdin.write(data)
    popen.stdin.close()
    text = wait_for(port, lambda t: value(t, "posttrain_run_finished", run="stdin") == 1)
    assert value(text, "posttrain_step", run="stdin") == 200
    time.sleep(0.5)
    assert scrape(port, "/healthz")[0] == 200 and popen.poll() is None
    assert popen.stdout_path.read_bytes() == data  # the trainer's output reached the pod log, byte for byte


def test_demo_serves_live_metrics_from_the_bundled_log() -> None:
    port = free_port()
    p = subprocess.Popen(exporter_cmd("demo", "--listen-address", f"127.0.0.1:{port}", "--steps-per-second", "100"),
                         cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = value(wait_for(port, lambda t: (value(t, "posttrain_step", run="demo-grpo") or 0) >= 5),
                      "posttrain_step", run="demo-grpo")
        text = wait_for(port, lambda t: (value(t, "posttrain_step", run="demo-grpo") or 0) > first + 20)
        assert value(text, "posttrain_reward_std", run="demo-grpo") is not None
        assert value(text, "posttrain_kl", run="demo-grpo") is not None
    finally:
        p.terminate()
        assert p.wait(timeout=10) == 0


def test_a_long_history_is_caught_up_on_while_scrapes_and_healthz_answer(tmp_path) -> None:
    """After a restart the sidecar reads the whole log again. It reads it in slices and lets scrapes in between
    (before, one poll held the lock for the whole file: 2.7 s per 100 MB); /healthz stays 200 and says so."""
    import json
    import sys

    log = tmp_path / "big.log"
    subprocess.run([sys.executable, str(REPO / "bench" / "make_log.py"), "--size-mb", "100", "-o", str(log)],
                   check=True, capture_output=True, timeout=300)
    final = json.loads((tmp_path / "big.log.meta.json").read_text())["final_step"]
    port = free_port()
    proc = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--log", str(log), "--listen-address",
                                         f"127.0.0.1:{port}"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        waits, said = [], []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                t = time.monotonic()
                status, text = scrape(port)
                waits.append(time.monotonic() - t)
                hstatus, health = scrape(port, "/healthz")
            except OSError:
                time.sleep(0.05)
                continue
            assert status == 200 and hstatus == 200
            said.append("catching up" in health)
            if value(text, "posttrain_step", run="big") == final and "catching up" not in health:
                break
        else:
            raise AssertionError("not caught up within 2 minutes")
        assert any(said), "/healthz never said it was catching up"
        assert max(waits) < 1.5, f"a scrape waited {max(waits):.1f} s during the catch-up"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
