"""`posttrain-exporter report`: the verdict on every labelled run, its agreement with the alert rules, the JSON
contract, the exit code for CI, and the HTML page in a real headless browser."""

from __future__ import annotations

import dataclasses
import html
import itertools
import json
import math
import os
import pty
import random
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, exporter_cmd, require_binary, run_cli
from support.corpus import CAUGHT_BY, LabelledRun, labelled_runs
from support.stepwise import input_series, records_of, scrapes
from test_detection import RULES, _promtool

from exporter.app import Exporter
from exporter.config import Config, EarlyStopSettings, LogSpec
from exporter.parsers.record import RecordKind
from exporter.report import FAIL_ON
from exporter.report.command import EXIT_NO_DATA, failed, render, verdicts
from exporter.report.digest import CHART_BUCKETS, SeriesDigest
from exporter.report.html import to_html
from exporter.report.live import run_document
from exporter.report.ranges import shown, stretches
from exporter.report.verdict import Episode, RunVerdict, judge

RUNS = labelled_runs()


def report_of(run: LabelledRun) -> RunVerdict:
    (v,) = verdicts(Config(), [LogSpec(str(run.log), run.name)])
    return v


# Runs that do not learn their task: the bundled demo's correctness reward never fires (component_silent) and its
# reward rose only through format and length rewards that were near their ceiling from the start.
NOT_LEARNING = {"grpo"}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_verdict_of_every_labelled_run(run: LabelledRun) -> None:
    v = report_of(run)
    if run.healthy:
        assert v.verdict == "healthy" and v.findings == [], [f.alert for f in v.findings]
        return
    assert v.verdict == ("not_learning" if run.name in NOT_LEARNING else "unhealthy")
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
    r = run_cli("report", str(log), "--output.format", "json")
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


# --- long runs (issue 28) -------------------------------------------------------------------------------------

LONG_STEPS = 100_000
KL_SPIKE_STEP, KL_SPIKE = 50_000, 43.0


@pytest.fixture(scope="module")
def long_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A long run as flat JSON lines: noisy reward and KL (the regime changes thousands of times), KL held above
    its warning limit for 20 steps in every 300 after step 6,000 (hundreds of episodes), one KL spike to 43."""
    rng = random.Random(28)
    path = tmp_path_factory.mktemp("long") / "long.jsonl"
    with path.open("w") as f:
        for step in range(1, LONG_STEPS + 1):
            kl = 0.02 + 0.01 * rng.random()
            if step > 6000 and step % 300 < 20:
                kl = 0.7 + 0.1 * rng.random()
            if step == KL_SPIKE_STEP:
                kl = KL_SPIKE
            reward = 0.5 + 0.1 * math.sin(step / 700) + 0.05 * rng.random()
            f.write(json.dumps({"step": step, "kl": kl, "reward": reward, "reward_std": 0.2 + 0.05 * rng.random(),
                                "entropy": 0.6 + 0.05 * rng.random(), "learning_rate": 1e-6}) + "\n")
    return path


@pytest.fixture(scope="module")
def long_verdict(long_log: Path) -> RunVerdict:
    (v,) = verdicts(Config(), [LogSpec(str(long_log), "long")])
    return v


def test_a_long_run_reads_in_a_page_summary_first(long_verdict: RunVerdict) -> None:
    v = long_verdict
    assert len(v.regimes) > 1000 and max(len(f.episodes) for f in v.findings) > 200  # what made it 300 KB
    text = render([v], "text")
    assert len(text.encode()) < 20_000, len(text)
    assert max(len(line) for line in text.splitlines()) < 400
    lines = text.splitlines()
    summary, best, findings_at = (next(i for i, ln in enumerate(lines) if ln.strip().startswith(p))
                                  for p in ("summary:", "best step", "findings:"))
    assert 0 < summary < best < findings_at, "verdict, worst findings and best step come before the details"
    kl = next(ln for ln in lines[findings_at:] if "PostTrainKLWarning" in ln)
    episodes = next(f for f in v.findings if f.alert == "PostTrainKLWarning").episodes
    assert f"({len(episodes)} episodes)" in kl and kl.count("-") <= 2 * 6 + 2, kl  # one stretch, not 300 ranges
    shares = next(ln for ln in lines if "regime (share" in ln)
    assert "converged" in shares and "%" in shares
    timeline = lines[next(i for i, ln in enumerate(lines) if "regime over time" in ln) + 1]
    assert 1 <= timeline.count(";") + 1 <= 12


def test_episodes_join_where_gaps_are_small_and_the_rest_is_counted() -> None:
    close = [Episode(s, s, s + 10) for s in range(1000, 200_000, 300)]  # gaps of 290 steps in a 200k-step run
    (one,) = stretches(close, 0, 200_000)
    assert (one.start, one.end, one.episodes) == (1000, close[-1].end, len(close))
    assert one.firing == 11 * len(close)
    apart = [Episode(s, s, s + 10) for s in range(1000, 200_000, 20_000)]  # 10 episodes far apart
    parts = stretches(apart, 0, 200_000)
    assert len(parts) == 10 and shown([p.text() for p in parts]).endswith("and 4 more")
    assert stretches([Episode(5, 7, None)], 0, 100)[0].text() == "7-end"


def test_the_digest_sees_the_whole_run_through_a_resume(tmp_path: Path) -> None:
    """The report keeps a digest while reading instead of every point: what it says (point counts, first, min,
    max, regimes, KL at the best step) is what the whole history says, also when the run resumed from an earlier
    step (the points after the resume replace those logged before it)."""
    rng = random.Random(5)
    log = tmp_path / "resumed.jsonl"
    with log.open("w") as f:
        for before, steps in ((True, range(1, 9001)), (False, range(7000, 12_001))):  # resumed at 7,000
            for step in steps:
                f.write(json.dumps({"step": step, "kl": rng.random() * (3 if step < 7000 else 1), "reward":
                                    rng.gauss(0, 1) + (9 if before and step >= 8000 else 0)}) + "\n")
    (got,) = verdicts(Config(), [LogSpec(str(log), "r")])
    whole_cfg = Config()
    whole_cfg = dataclasses.replace(whole_cfg, limits=dataclasses.replace(whole_cfg.limits, history_limit=100_000))
    ex = Exporter(whole_cfg, [LogSpec(str(log), "r")])
    ex.read_to_end()
    want = judge(ex.runs["r"])  # no digest: everything from the series, which kept every point
    assert [dataclasses.astuple(r) for r in got.instruments] == [dataclasses.astuple(r) for r in want.instruments]
    reward = next(r for r in got.instruments if r.label == "reward")
    assert reward.points == 12_000 and reward.max < 5  # the points before the resume are gone with their peak
    assert got.regimes == want.regimes and len(got.regimes) > 10
    assert (got.best_step, got.kl_at_best) == (want.best_step, want.kl_at_best)


def test_a_digest_stays_small_however_long_the_series() -> None:
    d = SeriesDigest(keep_whole=False)
    rng = np.random.default_rng(3)
    values = rng.normal(size=1_000_000)
    for a in range(0, 1_000_000, 1024):
        d.add(np.arange(a, min(a + 1024, 1_000_000), dtype=np.int64), values[a:a + 1024])
    assert len(d.buckets) <= CHART_BUCKETS and d.count == 1_000_000
    assert d.extremes() == (values.min(), values.max())
    steps, _ = d.chart()
    assert len(steps) <= 2 * CHART_BUCKETS and np.all(np.diff(steps) > 0)
    assert values.argmax() in steps and values.argmin() in steps


def _stderr_on_a_terminal(*args: str) -> tuple[int, bytes]:
    """Runs the command with its standard error on a pseudo-terminal; its exit code and what that showed."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(exporter_cmd(*args), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sub,
                            cwd=REPO)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    return proc.wait(timeout=120), seen


def test_progress_on_stderr_only_when_it_is_a_terminal(long_log: Path, tmp_path: Path) -> None:
    code, seen = _stderr_on_a_terminal("report", str(long_log), "--out", str(tmp_path / "a.txt"))
    assert code in (0, 1)
    text = seen.decode()
    assert re.search(r"reading \S*long\.jsonl: \d+% \(\d+ of \d+ MB, \d+\.\d s\)", text), text
    assert text.endswith("\r\x1b[K"), "the progress line is cleared once the log is read"
    piped = run_cli("report", str(long_log), "--out", str(tmp_path / "b.txt"))
    assert piped.stderr == b"", piped.stderr  # a pipe (CI, a file) gets no progress
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()


def _svgs(page: str) -> dict[str, ET.Element]:
    return {e.get("aria-label"): e for e in (ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", page, re.S))
            if e.get("aria-label")}


def test_long_run_charts_read_well(long_verdict: RunVerdict) -> None:
    page = to_html([long_verdict])
    charts = _svgs(page)
    kl, reward = charts["kl"], charts["reward"]
    assert kl.get("data-y-scale") == "log", "KL spans 3 decades: one spike to 43 must not flatten the rest"
    assert reward.get("data-y-scale") == "linear"
    ticks = [float(t.text) for t in kl.iter("text") if t.get("class") == "ytick"]
    assert max(ticks) >= KL_SPIKE and min(ticks) <= 0.02
    for name, svg in charts.items():
        xs = [t.text for t in svg.iter("text") if t.get("class") == "xtick"]
        assert xs and xs[-1] == str(LONG_STEPS), (name, xs)
        line = next(svg.iter("polyline")).get("points").split()
        titles = [c.find("title").text for c in svg.iter("circle")]
        assert len(titles) == len(line) and all(re.fullmatch(r"step \d+: \S+", t) for t in titles), name
    assert any(t.startswith(f"step {KL_SPIKE_STEP}: 43") for t in (c.find("title").text for c in kl.iter("circle")))
    assert "<script" not in page and "src=" not in page and "url(" not in page


def test_the_regime_strip_has_a_step_axis(long_verdict: RunVerdict) -> None:
    """Under the KL-versus-reward strip, round steps (multiples of 1, 2 or 5 times a power of ten) from the run's
    first to its last logged step, each placed where that step is on the strip, inside it."""
    page = to_html([long_verdict])
    strip = ET.fromstring(re.search(r'<svg class="regime".*?</svg>', page, re.S).group(0))
    width = float(strip.get("width"))
    bar = [r for r in strip.iter("rect")]
    left, right = float(bar[0].get("x")), max(float(r.get("x")) + float(r.get("width")) for r in bar)
    ticks = [(int(t.text), float(t.get("x"))) for t in strip.iter("text") if t.get("class") == "xtick"]
    steps = [s for s, _ in ticks]
    assert 3 <= len(ticks) <= 7 and steps == sorted(steps) and steps[-1] <= LONG_STEPS, ticks
    gap = steps[1] - steps[0]
    assert all(b - a == gap for a, b in itertools.pairwise(steps))
    assert re.fullmatch(r"[125]0*", str(gap)), gap
    for step, x in ticks[:-1]:  # the last label may be anchored at its end, inside the strip
        assert abs(x - (left + (step - 1) / (LONG_STEPS - 1) * (right - left))) < 2, (step, x)
    assert all(0 <= x <= width for _, x in ticks)
    assert any(t.text == "step" for t in strip.iter("text"))


# Measures the rendered page (a copy with this script added: the report itself has none) and writes what it found
# into the DOM, which chromium --dump-dom prints.
_MEASURE = """<script>
const boxes = [];
for (const svg of document.querySelectorAll('svg[aria-label]')) {
  const w = svg.viewBox.baseVal.width;
  const box = t => { const b = t.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height]; };
  boxes.push({chart: svg.getAttribute('aria-label'), width: w,
              limits: [...svg.querySelectorAll('text.limit')].map(box),
              xticks: [...svg.querySelectorAll('text.xtick')].map(t => [t.textContent, ...box(t)])});
}
const out = document.createElement('pre'); out.id = 'measured'; out.textContent = JSON.stringify(boxes);
document.body.appendChild(out);
</script>"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_chart_labels_in_a_browser_neither_overlap_nor_leave_the_chart(long_verdict: RunVerdict,
                                                                       tmp_path: Path) -> None:
    """Measured in headless chromium: the KL chart's limit labels (kl_critical 1 and kl_high 0.5, 0.3 decades
    apart on a log scale) do not overlap, and the x labels of a 100,000-step run are inside their chart."""
    chromium = require_binary("chromium")
    blowup = report_of(next(r for r in RUNS if r.name == "grpo_kl_blowup_2"))
    page = to_html([blowup, long_verdict])
    shot_page = tmp_path / "report.html"
    shot_page.write_text(page)
    measured = tmp_path / "measured.html"
    measured.write_text(page.replace("</body>", _MEASURE + "</body>"))
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1800"]
    dom = subprocess.run([*flags, "--dump-dom", measured.as_uri()], capture_output=True, timeout=120)
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout.decode())
    assert found, dom.stderr.decode()[-2000:]
    charts = json.loads(html.unescape(found.group(1)))
    limited = [c for c in charts if len(c["limits"]) >= 2]
    assert any(c["chart"] == "kl" for c in limited)
    for c in limited:
        for a, b in itertools.combinations(c["limits"], 2):
            assert not _overlap(a, b), (c["chart"], a, b)
    for c in charts:
        for text, x0, _, x1, _ in c["xticks"]:
            assert x0 >= 0 and x1 <= c["width"], (c["chart"], text, x0, x1)
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", shot_page.as_uri()], capture_output=True, timeout=120)
    width, _, pixels = _png_pixels(shot)
    assert width == 1200 and len(set(pixels[::97])) > 20, "the page did not render"


def test_a_sampling_run_whose_reward_key_is_not_read_says_it_was_not_judged(tmp_path: Path) -> None:
    """A GRPO run whose trainer logs its reward under a key of its own: the reward detectors judged nothing, and
    `healthy` alone would read as a healthy reward. The report says so, and an alias makes it judged."""
    from conftest import TRL
    text = (TRL / "grpo" / "combined.log").read_text(encoding="utf-8")
    assert text.count("'reward': ") == 150
    log = tmp_path / "own_key.log"
    log.write_text(text.replace("'reward': ", "'my_reward': "), encoding="utf-8")
    res = run_cli("report", "--output.format", "json", str(log))
    run = json.loads(res.stdout)["runs"][0]
    assert run["unjudged"] == ["reward"] and run["best_step"] is None, run["unjudged"]
    assert "not judged: reward" in run_cli("report", str(log)).stdout.decode()
    assert "Not judged:</b> reward" in run_cli("report", "--output.format", "html", str(log)).stdout.decode()
    config = tmp_path / "c.yml"
    config.write_text("aliases: {my_reward: reward}\n", encoding="utf-8")
    aliased = json.loads(run_cli("report", "--config", str(config), "--output.format", "json", str(log)).stdout)
    assert aliased["runs"][0]["unjudged"] == [] and aliased["runs"][0]["best_step"] is not None
    for name in ("grpo", "sft", "dpo"):  # the trainers' own keys: nothing left unjudged
        out = json.loads(run_cli("report", "--output.format", "json", str(TRL / name / "combined.log")).stdout)
        assert out["runs"][0]["unjudged"] == [], name


def test_the_instrument_table_keeps_its_columns_on_long_names(tmp_path) -> None:
    """Reward functions with long names (TRL's `rewards/<function>/mean`, one instrument each): every row's numbers
    end where the header's columns end, and a name past the cap is shortened in its middle, keeping both ends."""
    names = ["format_reward", "accuracy_reward_of_the_verifier_that_checks_the_final_boxed_answer",
             "length_penalty_" + "scaled_by_the_reference_length_of_the_prompt_" * 2 + "end"]
    log = tmp_path / "grpo.jsonl"
    log.write_text("".join(json.dumps({"step": i, "reward": i / 40, "kl": 0.01,
                                       **{f"rewards/{n}/mean": 0.5 + i / 70 for n in names}}) + "\n"
                           for i in range(1, 40)))
    res = run_cli("report", str(log))
    assert res.returncode == 0, res.stderr.decode()
    text = res.stdout.decode().splitlines()
    head = next(i for i, ln in enumerate(text) if ln.lstrip().startswith("instrument "))
    rows = [ln for ln in text[head + 1:] if ln.startswith("  ") and ln.rstrip().endswith(("rising", "falling", "flat"))]
    assert len(rows) >= 3, text[head:]

    def ends(line: str) -> list[int]:  # where each number column ends: before the trend
        body = line.rsplit("  ", 1)[0]
        return [m.end() for m in re.finditer(r"\S+", body)][-5:]

    assert all(ends(r) == ends(text[head]) for r in rows), "\n".join(text[head:head + len(rows) + 1])
    shortened = [r.split()[0] for r in rows if "…" in r]
    assert len(shortened) == 2 and all(n.startswith("reward_component{comp") and len(n) == 64 for n in shortened)
    assert {n[-7:] for n in shortened} == {"answer}", "pt_end}"}
