"""Real processes on loopback, for the end-to-end tests and the dashboard previews: a free port, processes
whose output goes to a log file and that are stopped on exit, and waiting for a condition with those logs
in the error when it does not come."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ready(port: int, path: str = "/-/ready") -> bool:
    """Prometheus and Alertmanager answer 200 on /-/ready once they serve."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
        return r.status == 200


def scrape_until(port: int, done: Callable[[str], bool], proc: subprocess.Popen, timeout: float) -> str:
    """Scrapes an exporter started as `proc` until `done(body)` or `timeout`; its last /metrics body (empty if
    none came). A process that exits meanwhile fails the test with its standard error."""
    body, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and not done(body):
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else f"exit {proc.returncode}"
            time.sleep(0.2)
    return body


class Processes:
    """Started processes, each logging to `<logdir>/<name>.log`; all are stopped when the block ends."""

    def __init__(self, logdir: Path, cwd: Path) -> None:
        self.logdir, self.cwd = logdir, cwd
        self.logs: dict[str, Path] = {}
        self._stack = ExitStack()

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        path = self.logs[name] = self.logdir / f"{name}.log"
        out = self._stack.enter_context(path.open("wb"))
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd)

        def stop() -> None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

        self._stack.callback(stop)
        return proc

    def tails(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {name} ---\n{p.read_text(errors='replace')[-chars:]}"
                         for name, p in self.logs.items() if p.exists())

    def wait(self, what: str, pred: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
        """`pred()`'s first truthy answer; connection errors count as "not yet"."""
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                got = pred()
                if got:
                    return got
            except OSError as e:  # not listening yet
                last_error = e
            time.sleep(every)
        raise AssertionError(f"{what}: not within {timeout:.0f}s (last error: {last_error})\n{self.tails()}")
