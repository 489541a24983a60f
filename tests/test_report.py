"""`posttrain-exporter report`: the verdict on every labelled run, its agreement with the alert rules, the JSON
contract, the exit code for CI, and the HTML page in a real headless browser."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from conftest import REPO, require_binary, run_cli
from support.corpus import CAUGHT_BY, LabelledRun, labelled_runs
from support.stepwise import input_series, records_of, scrapes
from test_detection import RULES, _promtool

from exporter.app import Exporter
from exporter.config import Config, EarlyStopSettings, LogSpec
from exporter.parsers.record import RecordKind
from exporter.report import FAIL_ON
from exporter.report.command import EXIT_NO_DATA, failed, render, verdicts
from exporter.report.live import run_document
from exporter.report.verdict import RunVerdict

RUNS = labelled_runs()


def report_of(run: LabelledRun) -> RunVerdict:
    (v,) = verdicts(Config(), [LogSpec(str(run.log), run.name)])
    return v


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_verdict_of_every_labelled_run(run: LabelledRun) -> None:
    v = report_of(run)
    if run.healthy:
        assert v.verdict == "healthy" and v.findings == [], [f.alert for f in v.findings]
        return
    assert v.verdict == "unhealthy"
    for pathology, onset in run.onsets.items():
        on_it = [f for f in v.findings if f.instrument in CAUGHT_BY[pathology] and f.last_step >= onset]
        assert on_it, f"{pathology} at {onset}: no finding on {sorted(CAUGHT_BY[pathology])}"


def test_the_json_contract_and_best_step() -> None:
    """The best step is the reward's peak: before the diverging run fell apart (a reward being hacked, as the
    brevity reward of grpo_kl_blowup, peaks late: the report says what the reward says)."""
    run = next(r for r in RUNS if r.name == "grpo_kl_blowup_2")
    r = run_cli("report", str(run.log), "--run", run.name, "--output.format", "json")
    assert r.returncode == 0, r.stderr.decode()
    doc = json.loads(r.stdout)
    (one,) = doc["runs"]
    assert one["run"] == "grpo_kl_blowup_2" and one["verdict"] == "unhealthy"
    assert isinstance(one["best_step"], int) and one["best_step"] < run.onsets["kl_blowup"]
    assert one["kl_at_best_step"] < 0.5
    kl = next(f for f in one["findings"] if f["alert"] == "PostTrainKLCritical")
    assert kl["severity"] == "critical" and kl["first_step"] <= kl["last_step"]
    assert set(kl) >= {"alert", "severity", "first_step", "last_step"}
    assert all(f["severity"] in ("critical", "warning") for f in one["findings"])


def test_fail_on_turns_the_verdict_into_the_exit_code(tmp_path: Path) -> None:
    sick = next(r for r in RUNS if r.name == "grpo_entropy_collapse")  # warnings only
    paged = next(r for r in RUNS if r.name == "grpo_kl_blowup")
    healthy = next(r for r in RUNS if r.name == "grpo_healthy")
    for log, fail_on, code in ((healthy.log, "warning", 0), (sick.log, "critical", 0), (sick.log, "warning", 1),
                               (paged.log, "critical", 1)):
        r = run_cli("report", str(log), "--fail-on", fail_on, "--out", str(tmp_path / "r.txt"))
        assert r.returncode == code, (log, fail_on, r.stderr.decode())
    assert "WARNING  PostTrainEntropyCollapse" in (tmp_path / "r.txt").read_text() or code == 1


def test_report_findings_are_what_the_rules_fire(tmp_path: Path) -> None:
    """One source of truth: every finding of the report is an alert the real rules fire at the step it names
    (promtool on the exporter's state after each logged step), and a run the report calls healthy fires none."""
    for name in ("grpo_length_hacking_2", "dpo_displacement_2"):
        run = next(r for r in RUNS if r.name == name)
        v = report_of(run)
        steps = scrapes(run.log, run.name, f"{run.name}:9847")
        record_steps = [r.step for r in records_of(run.log) if r.kind is RecordKind.TRAIN]
        cases = []
        for f in v.findings:
            for e in f.episodes:
                minute = record_steps.index(e.start)
                comp = f', component="{f.component}"' if f.component else ""
                alerts = f'ALERTS{{alertname="{f.alert}", alertstate="firing"{comp}}}'
                cases.append({"expr": f"clamp_max(count({alerts}), 1)", "eval_time": f"{minute}m",
                              "exp_samples": [{"labels": "{}", "value": 1}]})
                # and not before it became active
                if minute > 0 and e is f.episodes[0]:
                    cases.append({"expr": f'ALERTS{{alertname="{f.alert}", alertstate="firing"{comp}}}',
                                  "eval_time": f"{minute - 1}m", "exp_samples": []})
        assert cases
        r = _promtool({"interval": "1m", "input_series": input_series(steps), "promql_expr_test": cases}, tmp_path)
        assert r.returncode == 0, r.stdout[-3000:]
    assert RULES


def test_failed() -> None:
    v = report_of(next(r for r in RUNS if r.name == "grpo_entropy_collapse"))
    assert not failed([v], None) and not failed([v], "critical") and failed([v], "warning")


# --- the HTML page ------------------------------------------------------------------------------------------


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and RGB(A) rows (unfiltered) of an 8-bit RGB or RGBA PNG, without an imaging library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return width, bpp, bytes(out)


def test_the_html_page_is_self_contained_and_renders_in_a_browser(tmp_path: Path) -> None:
    chromium = require_binary("chromium")
    runs = [next(r for r in RUNS if r.name == n) for n in ("grpo_kl_blowup_2", "grpo_healthy")]
    page = tmp_path / "report.html"
    r = run_cli("report", *(str(r.log) for r in runs), "--output.format", "html", "--out", str(page))
    assert r.returncode == 0, r.stderr.decode()
    text = page.read_text()
    assert "<script" not in text and "src=" not in text and "@import" not in text and "url(" not in text
    assert text.count("<svg") > 20 and "PostTrainKLCritical" in text and "healthy" in text
    shot = tmp_path / "report.png"
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1800",
                           f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists(), proc.stderr.decode()[-2000:]
    width, bpp, pixels = _png_pixels(shot)
    colours = {pixels[i:i + 3] for i in range(0, len(pixels), bpp * 7)}
    red = sum(1 for i in range(0, len(pixels), bpp) if pixels[i] > 180 and pixels[i + 1] < 70 and pixels[i + 2] < 70)
    assert width == 1200 and len(colours) > 50, "the page did not render"
    assert red > 500, "no red verdict badge or page marker on the screenshot"
    if os.environ.get("UPDATE_SCREENSHOTS"):
        shutil.copy(shot, REPO / "docs" / "img" / "report.png")


def test_text_report_reads_well() -> None:
    text = render([report_of(next(r for r in RUNS if r.name == "dpo_displacement_2"))], "text")
    assert text.startswith("run dpo_displacement_2: UNHEALTHY")
    assert "PostTrainDPOLikelihoodDisplacement" in text and "runbook: https://" in text
    assert "dpo_reward{kind=chosen}" in text


# --- a run without training records: no data, never healthy -------------------------------------------------------

# What a verl job's stdout shows when it crashed before step 1 or sent its metrics elsewhere: Ray's own lines
# (written here in that shape, with our own values).
RAY_NOISE = """\
2026-11-20 10:01:12,345\tINFO worker.py:1832 -- Started a local Ray instance. View the dashboard at 127.0.0.1:8265
(TaskRunner pid=4121) {'actor_rollout_ref': {'actor': {'ppo_mini_batch_size': 64, 'use_kl_loss': True}}}
(TaskRunner pid=4121) Using LocalLogger is deprecated. The constructor API will change
(WorkerDict pid=4388) [W1120 10:02:01.112] Warning: torch.distributed is using NCCL
(raylet) [2026-11-20 10:03:44,001 E 4050 4050] node_manager.cc:3069: 1 Workers killed due to memory pressure (OOM)
Error executing job with overrides: ['algorithm.adv_estimator=grpo', 'trainer.logger=[wandb]']
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
"""
NO_DATA_LOGS = {"empty": b"", "junk": b"\x00\x01binary\xff\xfe junk {{{ not a dict\n%%%% 12 34\n",
                "ray": RAY_NOISE.encode()}


@pytest.mark.parametrize("kind", sorted(NO_DATA_LOGS))
def test_a_log_without_training_records_is_no_data_and_fails_the_gate(kind: str, tmp_path: Path) -> None:
    log = tmp_path / f"{kind}.log"
    log.write_bytes(NO_DATA_LOGS[kind])
    lines = len(NO_DATA_LOGS[kind].splitlines())
    for fail_on in FAIL_ON:
        r = run_cli("report", str(log), "--fail-on", fail_on)
        assert r.returncode == EXIT_NO_DATA, (fail_on, r.stdout.decode(), r.stderr.decode())
        text = r.stdout.decode()
        assert text.startswith(f"run {kind}: NO DATA") and "HEALTHY" not in text and "-1" not in text
        assert f"read: {lines} lines" in text and f"unmatched lines: {lines}" in text and "try: " in text
        assert "no training record" in r.stderr.decode()
    r = run_cli("report", str(log), "--format", "json")
    assert r.returncode == 0  # without --fail-on the exit code carries no verdict
    (one,) = json.loads(r.stdout)["runs"]
    assert one["verdict"] == "no_data" and one["step"] is None and one["last_step"] is None
    assert one["read"] == {"lines": lines, "records": {}, "training_records": 0, "unmatched": lines, "errors": 0,
                           "progress_bar_draws": 0}
    # /api/v1/verdict says the same of the same run, with the same fields
    ex = Exporter(Config(), [LogSpec(str(log), kind)])
    ex.read_to_end()
    (live,) = ex.verdict()["runs"]
    assert {k: live[k] for k in ("run", "verdict", "step", "finished", "worst", "read")} == \
           {k: one[k] for k in ("run", "verdict", "step", "finished", "worst", "read")}


def test_no_data_runs_fail_the_gate_beside_judged_ones(tmp_path: Path) -> None:
    """A finding at the level exits 1 whatever else; a healthy run beside a no-data one exits 3."""
    empty = tmp_path / "empty.log"
    empty.write_text("")
    healthy = next(r for r in RUNS if r.name == "grpo_healthy")
    paged = next(r for r in RUNS if r.name == "grpo_kl_blowup")
    for logs, code in (([healthy.log], 0), ([healthy.log, empty], EXIT_NO_DATA), ([paged.log, empty], 1)):
        r = run_cli("report", *map(str, logs), "--fail-on", "warning", "--out", str(tmp_path / "r.txt"))
        assert r.returncode == code, (logs, r.stderr.decode())
    text = (tmp_path / "r.txt").read_text()  # the last one: a paged run and an empty log
    assert "UNHEALTHY" in text and "NO DATA" in text


def test_a_run_gone_quiet_for_longer_than_its_pace_is_stale(tmp_path: Path) -> None:
    """Live, a run that has logged nothing for longer than thresholds.stall_seconds and 5x its own mean interval,
    and has not finished, is stale; a finished run never is; before its first record it is no_data."""
    lines = next(r for r in RUNS if r.name == "grpo_healthy").log.read_text().splitlines(keepends=True)
    log = tmp_path / "partial.log"
    log.write_text("".join(lines[: len(lines) // 2]))  # half a run: no end-of-run summary
    ex = Exporter(Config(), [LogSpec(str(log), "partial")])
    ex.read_to_end()
    run = ex.runs["partial"]
    settings = EarlyStopSettings()
    stall = run.settings.thresholds.stall_seconds
    run.first_record_time, run.last_record_time = run.last_record_time - 100 * stall, run.last_record_time
    pace = (run.last_record_time - run.first_record_time) / (sum(run.records.values()) - 1)  # seconds a record
    at = run.last_record_time
    assert run_document(run, settings, now=at + stall / 2)["verdict"] == "healthy"
    assert run_document(run, settings, now=at + 1.01 * stall)["verdict"] == "healthy"  # within 5x its pace
    assert 5 * pace > stall and run_document(run, settings, now=at + 5.01 * pace)["verdict"] == "stale"
    run.finished = True
    assert run_document(run, settings, now=at + 1000 * stall)["verdict"] == "healthy"
    fresh = Exporter(Config(), [LogSpec(str(tmp_path / "not-yet.log"), "fresh")])
    (doc,) = fresh.verdict()["runs"]
    assert doc["verdict"] == "no_data" and doc["step"] is None
