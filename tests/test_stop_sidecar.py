"""The sidecar's stop by signals: `serve` is not the trainer's parent, and finds it by its command line in a shared
PID namespace (the pod's `shareProcessNamespace: true`), made here with `unshare --pid --fork --mount-proc` (as root)
and two processes in it: the trainer and the exporter (tests/support/sidecar_stop.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import IN_CI, REPO, free_port, require_binary

HELPER = REPO / "tests" / "support" / "sidecar_stop.py"
PAGE_STEP = 14  # the OpenRLHF stand-in's KL page (blow-up at step 10)


def _scenario(name: str) -> dict:
    require_binary("unshare")
    require_binary("setpriv")
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("a PID namespace of its own needs root: run the suite as root in CI")
        pytest.skip("a PID namespace of its own needs root")
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(HELPER), name],
                         cwd=REPO, capture_output=True, timeout=180, env=dict(os.environ, PORT=str(free_port())))
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    return json.loads(res.stdout)


def _last_step(log: str) -> int:
    return int(re.findall(r"Global step (\d+):", log)[-1])


def test_the_sidecar_stops_the_trainer_it_finds_and_the_trainer_saves() -> None:
    r = _scenario("stop")
    last = _last_step(r["log"])
    assert r["stop"]["step"] == PAGE_STEP and PAGE_STEP <= last <= PAGE_STEP + 1, r["exporter_err"]
    assert r["trainer_err"].count("got SIGINT") == 1 and f"stopping on SIGINT after saving step {last}" in r["log"]
    assert f"global_step{last}" in r["checkpoints"] and r["trainer_status"] == 0
    assert 'posttrain_exporter_trainer_signals_total{outcome="sent",run="grpo",signal="SIGINT"} 1.0' in r["signals"]
    assert "stopping the trainer (the processes whose command holds 'ray::PPOTrainer'" in r["exporter_err"][0]


def test_a_restarted_sidecar_does_not_stop_the_training_twice() -> None:
    r = _scenario("restart")
    assert len(r["exporter_err"]) == 2, r["exporter_err"]
    assert r["trainer_err"].count("got SIGINT") == 1  # the second exporter sent nothing
    assert "taking up the stop begun at" in r["exporter_err"][1] or \
        "the trainer was stopped before this exporter started" in r["exporter_err"][1], r["exporter_err"][1]
    assert r["trainer_status"] == 0 and f"global_step{_last_step(r['log'])}" in r["checkpoints"]


def test_a_signal_the_kernel_refuses_is_counted_logged_and_the_stop_file_still_written() -> None:
    """The exporter as another user than the trainer's (the chart's default runAsUser against a root trainer): the
    kill is refused (EPERM); the training goes on to its end, the stop file is written for a callback."""
    r = _scenario("denied")
    assert r["stop"]["step"] == PAGE_STEP and _last_step(r["log"]) == 25 and r["trainer_status"] == 0
    assert "got SIGINT" not in r["trainer_err"]
    assert 'posttrain_exporter_trainer_signals_total{outcome="denied",run="grpo",signal="SIGINT"} 1.0' in r["signals"]
    assert "cannot send SIGINT to the processes whose command holds 'ray::PPOTrainer'" in r["exporter_err"][0]
    assert "run the sidecar as the trainer's user" in r["exporter_err"][0]
