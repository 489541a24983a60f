"""The early stop by signals (config `early_stop.action: signal`, exporter/stopping/): `run` stops the trainer it
started on a page, gracefully, with real processes shaped as verl, OpenRLHF and TRL launch them
(tests/support/standin_trainer.py); a healthy run is never signalled; a trainer that ignores the graceful signal
gets SIGTERM, then SIGKILL. The sidecar's way (a trainer in another container): tests/test_stop_sidecar.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO, exporter_cmd, free_port

from exporter.config import ConfigError, parse_config
from exporter.stopping.stopper import STOPPED_EXIT

STANDIN = REPO / "tests" / "support" / "standin_trainer.py"
BLOWUP_AT = 10  # the stand-in's KL jumps here; the page (median of 5 above 1.0, held 3 steps) comes 4 steps later
PAGE_STEP = BLOWUP_AT + 4
STEP_LINE = {"verl": re.compile(r"step:(\d+) - "), "openrlhf": re.compile(r"Global step (\d+):"),
             "trl": re.compile(r"^\{'loss'")}


@pytest.mark.parametrize(("raw", "error"), [
    ({"action": "kill"}, "early_stop.action: must be file"),
    ({"action": "signal", "signal": "SIGKILL"}, "early_stop.signal: must be a signal a trainer can catch"),
    ({"action": "signal", "grace_seconds": -1}, "early_stop.grace_seconds: must be greater than 0"),
    ({"action": "signal", "process": ""}, "early_stop.process: must be a piece of the trainer's command line"),
    ({"action": "signal", "pid": 1}, "early_stop.pid: must be the trainer's process id"),
    ({"action": "signal", "pid": 5, "process": "x"}, "early_stop.pid: give the trainer's process or its pid"),
    ({"process": "main_ppo"}, "early_stop.action: must be signal for early_stop.signal, process or pid"),
])
def test_config_errors_name_the_field(raw: dict, error: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(error)):
        parse_config({"early_stop": {"file": "/x/stop.json", **raw}})


def test_defaults_and_signal_names() -> None:
    es = parse_config({"early_stop": {"file": "/x/stop.json"}}).early_stop
    assert es.action == "file" and not es.signals
    es = parse_config({"early_stop": {"file": "/x/stop.json", "action": "signal", "signal": "USR1"}}).early_stop
    assert es.signals and es.signal == "SIGUSR1" and es.grace_seconds == 900 and es.kill_after_seconds == 30


def test_serve_without_a_trainer_to_signal_stops_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"early_stop": {"file": str(tmp_path / "stop.json"), "action": "signal"}}))
    res = subprocess.run(exporter_cmd("serve", "--log", str(tmp_path / "x.log"), "--config", str(cfg), "--no-gpu",
                                      "--listen-address", f"127.0.0.1:{free_port()}"),
                         cwd=REPO, capture_output=True, timeout=60)
    assert res.returncode == 2 and "early_stop.process: serve is not the trainer's parent" in res.stderr.decode()


def _config(tmp_path: Path, **early_stop) -> Path:
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"early_stop": {"file": str(tmp_path / "stop.json"), "action": "signal",
                                                  **early_stop}}))
    return cfg


def _verdict(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/verdict", timeout=2) as r:
            return json.loads(r.read())
    except OSError:
        return None


def _run(tmp_path: Path, child: list[str], cfg: Path, run: str = "train") -> tuple[int, str, str, dict | None]:
    """`run -- child` to its end: exit status, stdout, stderr, and the run's verdict while it lingers (or last seen)."""
    port = free_port()
    cmd = exporter_cmd("run", "--no-gpu", "--run", run, "--config", str(cfg), "--linger", "3",
                       "--web.listen-address", f"127.0.0.1:{port}", "--", *child)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=o, stderr=e)
        seen = None
        try:
            while p.poll() is None:
                doc = _verdict(port)
                if doc and doc["runs"]:
                    seen = doc["runs"][0]
                time.sleep(0.2)
        finally:
            if p.poll() is None:
                p.kill()
        p.wait(120)
    return p.returncode, out.read_text(errors="replace"), err.read_text(errors="replace"), seen


def _standin(framework: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(STANDIN), framework, "--out", str(out), "--steps", "40", *extra]


def _steps(framework: str, stdout: str) -> list[int]:
    lines = [ln for ln in stdout.splitlines() if STEP_LINE[framework].search(ln)]
    if framework == "trl":  # no step on a Trainer's console line: the n-th record is step n
        return list(range(1, len(lines) + 1))
    return [int(STEP_LINE[framework].search(ln).group(1)) for ln in lines]


@pytest.mark.parametrize("framework", ["verl", "openrlhf"])
def test_run_stops_a_ray_driver_on_the_page(tmp_path: Path, framework: str) -> None:
    """verl's and OpenRLHF's drivers have no handler: SIGINT ends the driver at once (KeyboardInterrupt) and its
    actors with it, so what is kept is the last periodic checkpoint, whole. Stopped within one logged step of the
    page; `run` exits STOPPED_EXIT; the stop file, the verdict and the log line say why and at which step."""
    ckpt = tmp_path / "ckpt"
    status, out, err, verdict = _run(tmp_path, _standin(framework, ckpt, "--blowup-at", str(BLOWUP_AT)),
                                     _config(tmp_path))
    assert status == STOPPED_EXIT, err
    stop = json.loads((tmp_path / "stop.json").read_text())
    assert stop["step"] == PAGE_STEP and stop["alerts"][0]["alert"] == "PostTrainKLCritical"
    assert PAGE_STEP <= _steps(framework, out)[-1] <= PAGE_STEP + 1, out[-2000:]
    assert "KeyboardInterrupt" in err  # the driver's own way of taking SIGINT
    saved = sorted(int(re.sub(r"\D", "", d.name)) for d in ckpt.iterdir() if d.name.startswith("global_step"))
    assert saved == list(range(5, PAGE_STEP + 1, 5))  # every periodic save up to the stop, none half-written
    assert not list(ckpt.glob(".*.tmp"))
    assert f"the exporter stopped the trainer at step {PAGE_STEP} (PostTrainKLCritical" in err
    assert f"exit status {STOPPED_EXIT}" in err
    stopped = verdict["stopped"]
    assert stopped["step"] == PAGE_STEP and stopped["signals"][0]["signal"] == "SIGINT"
    assert stopped["signals"][0]["outcome"] == "sent" and [s["signal"] for s in stopped["signals"]] == ["SIGINT"]
    assert verdict["crash"] is None  # a trainer we stopped did not crash


def test_run_stops_a_torchrun_trainer_that_saves_on_the_signal(tmp_path: Path) -> None:
    """torchrun passes SIGINT on to its worker; a training script that saves on it ends the step, saves it, exits.
    The save is that step's checkpoint, within one logged step of the page."""
    ckpt = tmp_path / "ckpt"
    status, out, err, verdict = _run(tmp_path, _standin("trl", ckpt, "--blowup-at", str(BLOWUP_AT),
                                                        "--save-on-signal"), _config(tmp_path))
    assert status == STOPPED_EXIT, err
    last = _steps("trl", out)[-1]
    assert PAGE_STEP <= last <= PAGE_STEP + 1, out[-2000:]
    assert f"stopping on SIGINT after saving step {last}" in out
    assert json.loads((ckpt / f"checkpoint-{last}" / "state.json").read_text()) == {"step": last}
    assert "Received SIGINT death signal, shutting down workers" in err  # torchrun's agent passed it on
    assert err.count("got SIGINT") == 1
    assert verdict["stopped"]["step"] == PAGE_STEP


def test_a_healthy_run_runs_to_its_end(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    status, out, err, verdict = _run(tmp_path, _standin("verl", ckpt, "--steps", "20"), _config(tmp_path))
    assert status == 0, err
    assert _steps("verl", out)[-1] == 20 and (ckpt / "latest_checkpointed_iteration.txt").read_text() == "20"
    assert not (tmp_path / "stop.json").exists() and "stopping the trainer" not in err
    assert verdict["stopped"] is None and verdict["verdict"] == "healthy"


def test_a_trainer_that_ignores_the_graceful_signal_gets_sigterm_then_sigkill(tmp_path: Path) -> None:
    body = textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGINT, lambda *_: print("ignoring SIGINT", file=sys.stderr, flush=True))
        signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", file=sys.stderr, flush=True))
        for step in range(1, 200):
            print({"loss": 0.1, "kl": 5.0 if step > 3 else 0.01, "reward": 0.5, "epoch": step / 100}, flush=True)
            time.sleep(0.2)
    """)
    status, _, err, verdict = _run(tmp_path, [sys.executable, "-c", body],
                                     _config(tmp_path, grace_seconds=1.5, kill_after_seconds=1.5))
    assert status == STOPPED_EXIT, err
    assert "ignoring SIGINT" in err and "ignoring SIGTERM" in err
    assert "the trainer exited with status 137 (killed by signal 9)" in err
    assert [s["signal"] for s in verdict["stopped"]["signals"]] == ["SIGINT", "SIGTERM", "SIGKILL"]


def test_a_page_of_another_run_beside_the_trainer_does_not_stop_it(tmp_path: Path) -> None:
    """`run --log OTHER`: a log of another run (a finished blow-up's trainer_state.json, and one that has not finished)
    pages, but it is not the trainer's run: its stop file is written, the trainer runs on."""
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"step": s, "kl": 5.0 if s > 3 else 0.01}) + "\n" for s in range(1, 30)))
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"early_stop": {"file": str(tmp_path / "stop-{run}.json"), "action": "signal"}}))
    port = free_port()
    res = subprocess.run(exporter_cmd("run", "--no-gpu", "--run", "train", "--config", str(cfg), "--log", str(other),
                                      "--web.listen-address", f"127.0.0.1:{port}", "--",
                                      *_standin("verl", tmp_path / "ckpt", "--steps", "15", "--step-seconds", "0.2")),
                         cwd=REPO, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    assert json.loads((tmp_path / "stop-other.json").read_text())["run"] == "other"
    assert not (tmp_path / "stop-train.json").exists() and b"stopping the trainer" not in res.stderr
