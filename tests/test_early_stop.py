"""The exporter's early stop (config `early_stop`) and its /api/v1/verdict: the stop file is written at the step a
page becomes active, as the report and the alerts judge it, atomically and once per finding; the endpoint says what
the report says, behind the same TLS and basic auth as /metrics. The trainer's side: tests/test_feed.py,
tests/test_trl_callback.py."""

from __future__ import annotations

import base64
import json
import logging
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import yaml
from conftest import REPO, exporter_cmd, free_port, require_binary, run_cli
from support.certs import make_pki

from exporter.app import Exporter
from exporter.config import Config, ConfigError, LogSpec, parse_config
from exporter.integrations.feed import FeedWriter
from exporter.integrations.stopwatch import VerdictPoller
from exporter.parsers.training import Training
from exporter.report.command import verdicts
from exporter.stopsignal import StopSignal

CORPUS = REPO / "tests" / "fixtures" / "corpus"
KL_BLOWUP = CORPUS / "grpo_kl_blowup" / "trainer_state.json"
HISTORY = json.loads(KL_BLOWUP.read_text())["log_history"]


@pytest.mark.parametrize(("raw", "field"), [
    ({"early_stop": {"severity": "critical"}}, "early_stop.file: must be the path of the stop file"),
    ({"early_stop": {"file": ""}}, "early_stop.file: must be the path"),
    ({"early_stop": {"file": "/x", "severity": "page"}}, "early_stop.severity: must be critical"),
    ({"early_stop": {"file": "/x", "detectors": "kl_critical"}}, "early_stop.detectors: must be a non-empty list"),
    ({"early_stop": {"file": "/x", "detectors": ["kl_critcal"]}}, r"early_stop.detectors\[0\]: unknown detector"),
    ({"early_stop": {"file": "/x", "detectors": ["kl_high"]}},
     r"early_stop.detectors\[0\]: kl_high is a warning detector: set early_stop.severity: warning"),
    ({"early_stop": {"file": "/x", "when": "now"}}, "early_stop.when: unknown setting"),
    ({"early_stop": "/x"}, "early_stop: must be a mapping"),
])
def test_config_errors_name_the_field(raw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        parse_config(raw)


def test_off_by_default_and_parsed() -> None:
    assert not Config().early_stop.enabled and not parse_config({}).early_stop.enabled
    es = parse_config({"early_stop": {"file": "/logs/stop-{run}.json", "severity": "warning",
                                      "detectors": ["kl_high", "kl_critical"]}}).early_stop
    assert es.enabled and es.severity == "warning" and es.detectors == {"kl_high", "kl_critical"}
    assert StopSignal(es).path_for("a/trainer_state") == "/logs/stop-a_trainer_state.json"


def test_a_missing_stop_folder_stops_serve_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text(yaml.safe_dump({"early_stop": {"file": str(tmp_path / "gone" / "stop.json")}}))
    res = run_cli("serve", "--log", str(tmp_path / "x.log"), "--config", str(cfg), "--no-gpu",
                  "--listen-address", f"127.0.0.1:{free_port()}")
    err = res.stderr.decode().strip()
    assert res.returncode == 2 and "\n" not in err, err
    assert err.startswith("posttrain-exporter: config error: early_stop.file: folder ") and "does not exist" in err


def _writes_step_by_step(tmp_path: Path, early_stop: dict) -> tuple[list[dict], StopSignal]:
    """The corpus run grpo_kl_blowup fed one record at a time, as a trainer's callback writes them, polled after
    each: every stop file written, in order."""
    cfg = parse_config({"early_stop": early_stop})
    feed_path = tmp_path / "feed.jsonl"
    feed_path.touch()
    exporter = Exporter(cfg, [LogSpec(str(feed_path), "grpo")])
    exporter.stop_signal = signal = StopSignal(cfg.early_stop)
    feed = FeedWriter(feed_path)
    stop_file = Path(signal.path_for("grpo"))
    written, last = [], None
    for entry in HISTORY:
        feed.write(entry["step"], entry)
        exporter.poll_once()
        if stop_file.exists() and (text := stop_file.read_text()) != last:
            last = text
            written.append(json.loads(text))
    feed.close()
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
    return written, signal


def _report_findings() -> dict[str, list[tuple[int, int, int | None]]]:
    (v,) = verdicts(Config(), [LogSpec(str(KL_BLOWUP), "grpo")])
    return {f.alert: [(e.since, e.start, e.end) for e in f.episodes] for f in v.findings}


def test_the_stop_file_is_written_at_the_step_the_page_becomes_active(tmp_path: Path) -> None:
    found = _report_findings()
    written, signal = _writes_step_by_step(tmp_path, {"file": str(tmp_path / "stop.json")})
    kl_since, kl_start, _ = found["PostTrainKLCritical"][0]
    first = written[0]
    assert (first["run"], first["step"]) == ("grpo", kl_start)
    assert [a["alert"] for a in first["alerts"]] == ["PostTrainKLCritical"]
    assert first["alerts"][0]["since_step"] == kl_since and first["alerts"][0]["limit"] == 1.0
    assert first["reason"] == (f"PostTrainKLCritical (critical) at step {kl_start}, held since step {kl_since}: "
                               "KL divergence held beyond the stop threshold in run grpo.")
    # what to do once it stopped, as the judgment says it then: stop now, keep a checkpoint from before the page
    judged = first["judgment"]
    assert judged["recommendation"] == "stop_now" and judged["headline"].startswith("Stop now: "), judged
    assert judged["action"].startswith("Stop the run: continuing makes the model worse. Keep "), judged
    assert judged["keep"]["best_step"] < kl_start and "Before a new run: " in judged["action"]
    # again when the second page joins, and when it comes back after it cleared: never for warnings
    std = found["PostTrainRewardStdCollapsed"]
    assert [w["step"] for w in written] == [kl_start, *(start for _, start, _ in std)]
    assert [a["alert"] for a in written[1]["alerts"]] == ["PostTrainKLCritical", "PostTrainRewardStdCollapsed"]
    assert signal.writes["grpo", "written"] == len(written) and signal.writes["grpo", "failed"] == 0


def test_a_judgment_that_fails_never_holds_up_the_stop(tmp_path: Path, monkeypatch, caplog) -> None:
    """The stop file is what stops the trainer; the judgment only explains it. A judgment that raises is logged and
    the file is written without it, at the same step."""
    import exporter.stopsignal as stopsignal

    def broken(run):
        raise RuntimeError("judgment bug")

    expected, _ = _writes_step_by_step(tmp_path, {"file": str(tmp_path / "stop.json")})
    monkeypatch.setattr(stopsignal, "judgment_of", broken)
    other = tmp_path / "broken"
    other.mkdir()
    with caplog.at_level(logging.ERROR, logger="exporter.stopsignal"):
        written, signal = _writes_step_by_step(other, {"file": str(other / "stop.json")})
    assert [w["step"] for w in written] == [w["step"] for w in expected]
    assert all(w["judgment"] is None for w in written) and signal.writes["grpo", "failed"] == 0
    assert any("the judgment failed; the stop file is written without it" in r.getMessage() for r in caplog.records)


def test_severity_and_detectors_choose_what_stops(tmp_path: Path) -> None:
    found = _report_findings()
    warn, chosen = tmp_path / "warning", tmp_path / "chosen"
    warn.mkdir()
    chosen.mkdir()
    warned, _ = _writes_step_by_step(warn, {"file": str(warn / "stop.json"), "severity": "warning"})
    earliest = min(start for eps in found.values() for _, start, _ in eps)
    assert warned[0]["step"] == earliest and warned[0]["alerts"][0]["severity"] == "warning"
    chosen, _ = _writes_step_by_step(chosen, {"file": str(chosen / "stop.json"), "detectors": ["reward_std_collapsed"]})
    assert [w["step"] for w in chosen] == [start for _, start, _ in found["PostTrainRewardStdCollapsed"]]
    assert {a["alert"] for w in chosen for a in w["alerts"]} == {"PostTrainRewardStdCollapsed"}


def test_a_failed_write_is_counted_logged_once_and_tried_again(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    cfg = parse_config({"early_stop": {"file": str(folder / "stop.json")}})
    feed_path = tmp_path / "feed.jsonl"
    feed_path.touch()
    exporter = Exporter(cfg, [LogSpec(str(feed_path), "grpo")])
    exporter.stop_signal = signal = StopSignal(cfg.early_stop)
    feed = FeedWriter(feed_path)
    shutil.rmtree(folder)  # the volume went away
    with caplog.at_level(logging.ERROR, logger="exporter.stopsignal"):
        for step in range(1, 11):
            feed.write(step, {"kl": 5.0})
            exporter.poll_once()
    assert signal.writes["grpo", "failed"] >= 2 and signal.writes["grpo", "written"] == 0
    assert sum("cannot write the stop file" in r.getMessage() for r in caplog.records) == 1
    folder.mkdir()
    feed.write(11, {"kl": 5.0})
    exporter.poll_once()
    assert signal.writes["grpo", "written"] == 1 and json.loads((folder / "stop.json").read_text())["step"] == 11
    feed.close()


# --- /api/v1/verdict through `serve`, behind TLS and basic auth --------------------------------------------------

PASSWORD = "s3cret"


def _get(url: str, ctx: ssl.SSLContext, auth: bool = True, method: str = "GET") -> tuple[int, bytes, dict]:
    headers = {"Authorization": "Basic " + base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers, method=method), timeout=5,
                                    context=ctx) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _killed_at_the_end(path: Path) -> None:
    """grpo_kl_blowup's trainer_state.json as a training killed at its last step leaves it: no summary record."""
    state = json.loads(KL_BLOWUP.read_text())
    state["log_history"] = [e for e in state["log_history"] if "train_runtime" not in e]
    path.write_text(json.dumps(state))


def test_the_verdict_endpoint_says_what_the_report_says(tmp_path: Path) -> None:
    require_binary("openssl")
    pki = make_pki(tmp_path / "pki")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(pki.server_cert),
                                                         "key_file": str(pki.server_key)},
                                   "basic_auth_users": {"prometheus": hashed}}))
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"early_stop": {"file": str(tmp_path / "stop.json")}}))
    log = tmp_path / "trainer_state.json"
    _killed_at_the_end(log)
    port = free_port()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log", str(log),
                                      "--run", "grpo", "--config", str(cfg), "--web.config.file", str(web)),
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://localhost:{port}/api/v1/verdict"
    try:
        deadline, doc = time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            try:
                status, body, headers = _get(url, ctx)
                doc = json.loads(body)
                if doc["runs"] and doc["runs"][0]["step"] == 300:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert status == 200 and headers["Content-Type"] == "application/json", body
        (run,) = doc["runs"]
        (report,) = verdicts(Config(), [LogSpec(str(KL_BLOWUP), "grpo")])
        assert run["verdict"] == report.verdict == "unhealthy" and run["worst"] == "critical" and not run["finished"]
        assert run["training"] is None  # trainer_state.json does not say which training it is
        assert [(f["alert"], f["first_step"], f["last_step"]) for f in run["findings"]] == \
            [(f.alert, f.first_step, f.last_step) for f in report.findings]
        active = {f["alert"]: f for f in run["active"]}
        assert {f.alert for f in report.findings if f.episodes[-1].end is None} == set(active)
        assert active["PostTrainKLCritical"]["since_step"] == report.findings[0].episodes[-1].since
        assert active["PostTrainKLCritical"]["severity"] == "critical" and run["stop"]
        assert doc["early_stop"] == {"enabled": True, "file": str(tmp_path / "stop.json"), "severity": "critical",
                                     "detectors": None, "action": "file"}
        assert run["stopped"] is None  # the stop file alone: the exporter signals nothing
        assert json.loads(_get(url + "?run=other", ctx)[1])["runs"] == []
        assert json.loads(_get(url + "?run=grpo", ctx)[1])["runs"][0]["run"] == "grpo"
        assert _get(url, ctx, auth=False)[0] == 401  # the same gate as /metrics
        assert _get(url, ctx, method="HEAD")[:2] == (200, b"")
        stop = json.loads((tmp_path / "stop.json").read_text())
        assert stop["step"] == 300 and stop["alerts"][0]["alert"] == "PostTrainKLCritical"
        # the callback's way of asking: TLS with the CA, basic auth, and the run's name
        poller = VerdictPoller(f"https://localhost:{port}", run="grpo", auth=("prometheus", PASSWORD),
                               cafile=str(pki.ca))
        notice = poller.poll_once()
        assert notice is not None and notice.alerts[0] == "PostTrainKLCritical" and notice.step == 300
        assert VerdictPoller(f"https://localhost:{port}", cafile=str(pki.ca)).poll_once() is None  # no password
    finally:
        p.terminate()
        assert p.wait(10) == 0, p.stderr.read().decode()


# --- one training at a time: a feed reused by a new training (the callback's identity lines) ----------------------

HEALTHY = CORPUS / "grpo_healthy" / "trainer_state.json"


def _feed_of(path: Path, *trainings: tuple[Training, list[dict]]) -> None:
    """A feed as the callback writes it: each training's identity line, then its records."""
    feed = FeedWriter(path)
    for training, history in trainings:
        feed.begin(training)
        for entry in history:
            feed.write(entry["step"], entry)
    feed.close()


def _unfinished(history: list[dict]) -> list[dict]:
    return [e for e in history if "train_runtime" not in e]  # killed: no end-of-training summary


def test_a_new_training_in_a_reused_feed_inherits_no_record_finding_or_stop(tmp_path: Path) -> None:
    """The blow-up (stopped at its page) and then a healthy training appended to the same feed, judged live by one
    exporter: the stop names the first training; the healthy one starts empty, is judged healthy and raises no
    stop; a third training that blows up raises its own stop, at the step of its own page, naming itself."""
    kl_start = _report_findings()["PostTrainKLCritical"][0][1]
    healthy = json.loads(HEALTHY.read_text())["log_history"]
    first, second, third = Training.new(), Training.new(), Training.new()
    cfg = parse_config({"early_stop": {"file": str(tmp_path / "stop.json")}})
    feed_path = tmp_path / "feed.jsonl"
    feed_path.touch()
    exporter = Exporter(cfg, [LogSpec(str(feed_path), "grpo")])
    exporter.stop_signal = StopSignal(cfg.early_stop)
    feed = FeedWriter(feed_path)
    stops: list[dict] = []

    def step(entry: dict | None = None, training: Training | None = None) -> dict:
        if training is not None:
            feed.begin(training)
        if entry is not None:
            feed.write(entry["step"], entry)
        exporter.poll_once()
        text = (tmp_path / "stop.json").read_text() if (tmp_path / "stop.json").exists() else None
        if text is not None and (not stops or json.loads(text) != stops[-1]):
            stops.append(json.loads(text))
        (run,) = exporter.verdict()["runs"]
        return run

    step(training=first)
    for entry in HISTORY:
        if entry["step"] > kl_start:
            break  # the callback stopped it here
        run = step(entry)
    assert run["stop"] and run["training"] == first.as_json()
    assert [(s["step"], s["training"]) for s in stops] == [(kl_start, first.as_json())]

    run = step(training=second)  # before its first record: about the new training, with nothing judged yet
    assert run["training"] == second.as_json() and run["step"] is None and not run["stop"]
    assert run["verdict"] == "healthy" and run["active"] == run["findings"] == []
    for entry in healthy:
        run = step(entry)
        assert not run["stop"], run
    assert run["verdict"] == "healthy" and run["finished"] and len(stops) == 1

    step(training=third)
    for entry in _unfinished(HISTORY):
        run = step(entry)
        if len(stops) > 1:
            break
    assert [(s["step"], s["training"]["id"]) for s in stops[1:]] == [(kl_start, third.id)]
    assert exporter.runs["grpo"].resets == 2  # each later training started the run's history again
    feed.close()


def test_report_of_a_reused_feed_judges_the_latest_training(tmp_path: Path) -> None:
    feed = tmp_path / "feed.jsonl"
    healthy = json.loads(HEALTHY.read_text())["log_history"]
    _feed_of(feed, (Training.new(), _unfinished(HISTORY)), (Training.new(), healthy))
    (v,) = verdicts(Config(), [LogSpec(str(feed), "grpo")])
    (alone,) = verdicts(Config(), [LogSpec(str(HEALTHY), "grpo")])
    assert v.verdict == alone.verdict == "healthy" and v.findings == [] and v.last_step == alone.last_step
    res = run_cli("report", str(feed), "--run", "grpo", "--output.format", "json")
    assert res.returncode == 0 and json.loads(res.stdout)["runs"][0]["verdict"] == "healthy", res.stderr.decode()
    _feed_of(feed, (Training.new(), _unfinished(HISTORY)))  # appended: the latest training is the blow-up
    (v,) = verdicts(Config(), [LogSpec(str(feed), "grpo")])
    assert v.verdict == "unhealthy" and v.findings[0].alert == "PostTrainKLCritical"


def test_an_exporter_started_on_an_old_log_writes_no_stop(tmp_path: Path) -> None:
    """Started on a finished blow-up (trainer_state.json, or a feed whose training ended): no stop file, since no
    trainer is left to stop; started once a new training has begun in the feed (its identity line read, no record
    yet): no stop either, the run is about the new training."""
    stop = tmp_path / "stop.json"
    cfg = parse_config({"early_stop": {"file": str(stop)}})
    finished_feed, begun_feed = tmp_path / "finished.jsonl", tmp_path / "begun.jsonl"
    _feed_of(finished_feed, (Training.new(), HISTORY))
    _feed_of(begun_feed, (Training.new(), _unfinished(HISTORY)), (Training.new(), []))
    for log in (KL_BLOWUP, finished_feed, begun_feed):
        exporter = Exporter(cfg, [LogSpec(str(log), "grpo")])
        exporter.stop_signal = StopSignal(cfg.early_stop)
        exporter.poll_once()
        assert not stop.exists(), log
        (run,) = exporter.verdict()["runs"]
        assert run["finished"] or (run["step"] is None and not run["stop"]), log
    # the same killed blow-up without a later training does raise it: the guard is the new training, not luck
    killed = tmp_path / "killed.jsonl"
    _feed_of(killed, (Training.new(), _unfinished(HISTORY)))
    exporter = Exporter(cfg, [LogSpec(str(killed), "grpo")])
    exporter.stop_signal = StopSignal(cfg.early_stop)
    exporter.poll_once()
    assert json.loads(stop.read_text())["step"] == _unfinished(HISTORY)[-1]["step"]


def test_a_resumed_training_keeps_the_history_up_to_its_step_and_no_later_finding(tmp_path: Path) -> None:
    """A training resumed from a checkpoint at step N (its identity line says N): the history before N stays (the
    detectors' windows), the old training's findings after N do not."""
    kl_since = _report_findings()["PostTrainKLCritical"][0][0]
    resume_at = kl_since - 10
    feed = tmp_path / "feed.jsonl"
    before = [e for e in HISTORY if e["step"] <= resume_at + 5]
    _feed_of(feed, (Training.new(), _unfinished(HISTORY)), (Training.new(step=resume_at), before[-5:]))
    exporter = Exporter(Config(), [LogSpec(str(feed), "grpo")])
    exporter.read_to_end()
    (run,) = exporter.verdict()["runs"]
    assert run["training"]["step"] == resume_at and run["step"] == before[-1]["step"] and run["findings"] == []
    points = exporter.runs["grpo"].series["kl", None].arrays()[0]
    assert points[0] == HISTORY[0]["step"] and points[-1] == before[-1]["step"]  # the history before N stayed


@pytest.mark.parametrize("line", [
    '{"posttrain_training": "abc"}',
    '{"posttrain_training": {"id": "a b", "started": "2026-11-26T06:04:02.123Z", "step": 0}}',
    '{"posttrain_training": {"id": "abc", "started": "yesterday", "step": 0}}',
    '{"posttrain_training": {"id": "abc", "started": "2026-11-26T06:04:02Z", "step": -1}}',
    '{"posttrain_training": {"id": "abc", "started": "2026-11-26T06:04:02Z"}, "loss": 1.0}',
])
def test_a_malformed_training_line_is_counted_and_resets_nothing(tmp_path: Path, line: str) -> None:
    feed = tmp_path / "feed.jsonl"
    _feed_of(feed, (Training.new(), HISTORY[:30]))
    with feed.open("a") as f:
        f.write(line + "\n" + json.dumps({"step": 31, "kl": 0.5}) + "\n")
    exporter = Exporter(Config(), [LogSpec(str(feed), "grpo")])
    exporter.read_to_end()
    run = exporter.runs["grpo"]
    assert run.step == 31 and run.resets == 0 and len(run.series["kl", None]) == 31
    assert exporter.stats["grpo"].parse_errors["jsonl", "bad_training"] == 1
