"""Run inside a PID namespace of its own (`unshare --pid --fork --mount-proc`), as a pod with
`shareProcessNamespace: true` is: a trainer (the OpenRLHF stand-in, its training loop in a `ray::PPOTrainer`
process) writes its log to a file, and `posttrain-exporter serve` beside it, not its parent, reads the log and stops
the trainer it finds by its command line. Prints one JSON object: what happened.

    sidecar_stop.py SCENARIO    (stop | restart | denied)

restart: the exporter is killed once it has signalled, and a second one started on the same log and stop file.
denied: the exporter runs as another user (nobody), so the kernel refuses its signal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "support" / "standin_trainer.py"


def serve(tmp: Path, port: int, as_nobody: bool, n: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "exporter", "serve", "--no-gpu", "--log", str(tmp / "train.log"), "--run", "grpo",
           "--config", str(tmp / "exporter.yml"), "--listen-address", f"127.0.0.1:{port}"]
    if as_nobody:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=(tmp / f"exporter{n}.err").open("wb"))


def metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return ""


def main(scenario: str) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="sidecar-stop-", dir="/tmp"))  # a folder the exporter as nobody can reach
    tmp.chmod(0o777)
    try:
        return scenario_in(scenario, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scenario_in(scenario: str, tmp: Path) -> dict:
    (tmp / "exporter.yml").write_text(json.dumps({"early_stop": {
        "file": str(tmp / "stop.json"), "action": "signal", "process": "ray::PPOTrainer", "grace_seconds": 20}}))
    steps = "25" if scenario == "denied" else "40"
    save_seconds = "3" if scenario == "restart" else "1"
    log = (tmp / "train.log").open("wb")
    trainer = subprocess.Popen([sys.executable, str(STANDIN), "openrlhf", "--out", str(tmp / "ckpt"), "--steps", steps,
                                "--blowup-at", "10", "--save-on-signal", "--save-seconds", save_seconds,
                                "--step-seconds", "0.5"], stdout=log, stderr=(tmp / "trainer.err").open("wb"))
    port = int(os.environ["PORT"])
    exporters = [serve(tmp, port, scenario == "denied", 1)]
    record = tmp / ".stop.json.signalled"
    while trainer.poll() is None:
        if scenario == "restart" and len(exporters) == 1 and record.exists():
            exporters[0].kill()  # mid-stop: the trainer got SIGINT and is saving
            exporters[0].wait()
            exporters.append(serve(tmp, port, False, 2))
        time.sleep(0.1)
    time.sleep(2)  # the last exporter reads the log's end and is scraped
    scraped = metrics(port)
    for e in exporters:
        e.terminate()
        e.wait(20)
    return {"trainer_status": trainer.returncode, "trainer_err": (tmp / "trainer.err").read_text(),
            "log": (tmp / "train.log").read_text(errors="replace"),
            "exporter_err": [(tmp / f"exporter{i + 1}.err").read_text() for i in range(len(exporters))],
            "stop": json.loads((tmp / "stop.json").read_text()) if (tmp / "stop.json").exists() else None,
            "checkpoints": sorted(p.name for p in (tmp / "ckpt").iterdir()),
            "signals": [ln for ln in scraped.splitlines() if ln.startswith("posttrain_exporter_trainer_signals_total")]}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
