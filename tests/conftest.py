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


# --- the fast subset: `pytest -m "not slow"` ------------------------------------------------------------------------
# Tests that take a second or more on a 2-core machine (measured with `pytest --durations=0`): real trainings on CPU,
# the image build, real Prometheus and Alertmanager, browsers, soaks and floods. CI runs them all; the edit-test loop
# leaves them out. Whole modules first, then single tests of otherwise quick modules.
SLOW_MODULES = frozenset({
    "test_detection", "test_trl_callback", "test_gpu_sources", "test_image", "test_dashboards", "test_packaging",
    "test_alerting_e2e", "test_multinode", "test_fuzz", "test_trainer_first", "test_blocking_sources",
    "test_stop_sidecar",
})
SLOW_TESTS = frozenset({
    "test_run.py::test_an_exporter_killed_mid_read_and_restarted_counts_every_record_once",
    "test_stop_by_signal.py::test_run_stops_a_ray_driver_on_the_page",
    "test_stop_by_signal.py::test_run_stops_a_torchrun_trainer_that_saves_on_the_signal",
    "test_stop_by_signal.py::test_a_healthy_run_runs_to_its_end",
    "test_stop_by_signal.py::test_a_trainer_that_ignores_the_graceful_signal_gets_sigterm_then_sigkill",
    "test_stop_by_signal.py::test_a_page_of_another_run_beside_the_trainer_does_not_stop_it",
    "test_captures.py::test_serve_follows_a_renamed_state_and_an_output_folder",
    "test_conventions.py::test_debug_log_leaves_out_the_file_watchers_internals",
    "test_conventions.py::test_serve_configured_by_the_environment_alone",
    "test_dump.py::test_dump_output_passes_promtool_check_metrics",
    "test_early_stop.py::test_severity_and_detectors_choose_what_stops",
    "test_early_stop.py::test_the_verdict_endpoint_says_what_the_report_says",
    "test_feed.py::test_the_verdict_poller_drops_a_stop_that_is_no_longer_about_its_training",
    "test_helm.py::test_fallback_sidecar_ends_when_its_trainer_is_killed",
    "test_helm.py::test_fallback_wrapper_stops_the_exporter_when_the_trainer_is_done",
    "test_helm.py::test_gpu_only_worker_serves_the_run_label_for_real",
    "test_helm.py::test_web_config_from_a_secret_serves_tls_and_auth_for_real",
    "test_hostile.py::test_a_read_of_tiny_lines_with_carriage_returns_holds_little_memory",
    "test_hostile.py::test_serve_after_a_huge_step_scrapes_200_with_the_records_after_it",
    "test_kubernetes_source.py::test_follows_through_drops_and_equals_a_dump_of_the_file",
    "test_kubernetes_source.py::test_serve_follows_a_container_and_serves_its_records",
    "test_report.py::test_a_long_run_reads_in_a_page_summary_first",
    "test_report.py::test_chart_labels_in_a_browser_neither_overlap_nor_leave_the_chart",
    "test_report.py::test_progress_on_stderr_only_when_it_is_a_terminal",
    "test_report.py::test_report_findings_are_what_the_rules_fire",
    "test_report.py::test_the_html_page_is_self_contained_and_renders_in_a_browser",
    "test_report.py::test_long_run_charts_read_well",
    "test_run.py::test_stdin_is_copied_to_stdout_and_a_closed_stdout_does_not_stop_the_reading",
    "test_run.py::test_trainer_output_is_read_as_its_run",
    "test_samples.py::test_panels_at_other_widths_and_cut_headers",
    "test_samples.py::test_the_html_report_shows_the_completions_escaped_in_a_browser",
    "test_serve.py::test_a_long_history_is_caught_up_on_while_scrapes_and_healthz_answer",
    "test_serve.py::test_demo_serves_live_metrics_from_the_bundled_log",
    "test_serve.py::test_stdin_keeps_serving_after_input_ends",
    "test_web.py::test_cli_serves_on_ipv6_loopback",
    "test_web.py::test_fifty_concurrent_scrapers_with_slow_clients_holding_connections",
    "test_web.py::test_handshakes_left_halfway_are_capped",
    "test_web.py::test_stalled_handshakes_and_wrong_passwords_leave_a_verified_scraper_fast",
    "test_web.py::test_tls_and_basic_auth_through_the_cli",
    "test_web.py::test_right_password_served_while_its_address_sends_wrong_ones",
})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES or f"{item.path.name}::{item.originalname}" in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
