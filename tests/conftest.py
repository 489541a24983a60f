"""Shared test fixtures: the real TRL logs in tests/fixtures and the external binaries.

In CI (CI=true) a missing fixture folder or binary is an error, never a silent skip."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from exporter.instruments.keymap import KeyMap
from exporter.instruments.settings import DerivedSettings
from exporter.parsers.record import Record
from exporter.runstate import RunLimits, RunState

REPO = Path(__file__).resolve().parent.parent
from support.loopback import free_port as free_port  # noqa: E402  (re-exported for the tests)

FIXTURES = Path(os.environ.get("POSTTRAIN_FIXTURES", REPO / "tests" / "fixtures"))
TRL = FIXTURES / "trl"
TRL_RUNS = ["sft", "sft_notqdm", "dpo", "grpo", "grpo_saturated"]
CAPTURES = ["stdout.log", "combined.log", "combined_unbuffered.log", "tty.log"]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed: .ci/run must install it (end-to-end tests never skip in CI)")
        pytest.skip(f"{name} not installed")
    return path


def require_module(name: str, extra: str) -> None:
    """A Python package of an optional extra (`pip install -e '.[EXTRA]'`): a failure in CI, a skip elsewhere."""
    if importlib.util.find_spec(name) is None:
        if IN_CI:
            pytest.fail(f"{name} is not installed: scripts/setup.sh must install the {extra!r} extra (end-to-end "
                        "tests never skip in CI)")
        pytest.skip(f"{name} not installed (pip install -e '.[{extra}]')")


@pytest.fixture(scope="session", autouse=True)
def _fixtures_present() -> None:
    if not TRL.is_dir():
        pytest.fail(f"real TRL fixtures not found at {TRL}; set POSTTRAIN_FIXTURES to the fixtures folder")


def fixture_captures() -> list[tuple[str, str]]:
    return [(run, cap) for run in TRL_RUNS for cap in CAPTURES if (TRL / run / cap).exists()]


def trainer_state(run: str) -> list[dict]:
    return json.loads((TRL / run / "trainer_state.json").read_text())["log_history"]


def trainer_state_values(run: str) -> list[tuple[dict[str, float], int]]:
    """Each trainer_state entry as (its numeric values, its step): full precision, the trainer's own steps."""
    return [({k: float(v) for k, v in e.items() if k != "step" and isinstance(v, int | float)}, e["step"])
            for e in trainer_state(run)]


def ingested(records: Iterable[tuple[dict[str, float], int]], name: str = "r",
             settings: DerivedSettings | None = None, limits: RunLimits | None = None) -> RunState:
    """(values, step) pairs through a RunState, brought up to date to be read."""
    run = RunState(name, KeyMap(), limits or RunLimits(), settings or DerivedSettings())
    for values, step in records:
        run.ingest(Record(values, "jsonl", step=step))
    run.refresh()
    return run


def exporter_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", *args]


def run_cli(*args: str, stdin: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(exporter_cmd(*args), input=stdin, capture_output=True, timeout=timeout, cwd=REPO)
