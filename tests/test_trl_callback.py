"""The callback (exporter/integrations/trl.py) in real TRL trainings of a tiny random-init Qwen2 on CPU, each a
subprocess (tests/support/trl_train.py), against a real `serve` process: the feed carries the trainer's own steps
(with disable_tqdm=True and logging_steps=3), and a GRPO run whose KL blows up is stopped by the exporter's stop
signal shortly after the KL page became active, through the stop file and through /api/v1/verdict.

Needs the `trl` extra (scripts/setup.sh installs it): skipped without it, except in CI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO, exporter_cmd, free_port, require_module, run_cli
from prometheus_client.parser import text_string_to_metric_families

from exporter.parsers.training import TRAINING_KEY

TRAIN = REPO / "tests" / "support" / "trl_train.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONUNBUFFERED": "1"}
MAX_STEPS = 200  # the diverging run: its KL page is active within ~50 steps, so a stop comes well before this
STOP_SLACK_STEPS = 20  # steps the trainer may run on between the exporter's stop file and its check (~2 s here)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    require_module("trl", "trl")
    model = tmp_path_factory.mktemp("tiny") / "model"
    train("build", str(model))
    return model


def train(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, str(TRAIN), *args], env=ENV, capture_output=True, timeout=timeout, cwd=REPO)
    assert res.returncode == 0, res.stderr.decode()[-4000:]
    return res


def log_history(out: Path) -> list[dict]:
    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def feed_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def feed_records(path: Path) -> list[dict]:
    """The feed's records, without the lines that say which training they belong to."""
    return [d for d in feed_lines(path) if TRAINING_KEY not in d]


def feed_trainings(path: Path) -> list[dict]:
    return [d[TRAINING_KEY] for d in feed_lines(path) if TRAINING_KEY in d]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_feed_carries_the_trainers_own_steps(tiny_model: Path, tmp_path: Path) -> None:
    """SFT with disable_tqdm=True, logging_steps=3, an evaluation every 5 steps, 13 steps: every record of
    trainer_state.json's log_history (training, evaluation, the summary) is a feed line with its step and values,
    and `dump` of the feed gives the last training step (12) and its values."""
    out, feed = tmp_path / "out", tmp_path / "feed.jsonl"
    train_res = train("sft", str(tiny_model), str(out), "--feed", str(feed), "--max-steps", "13", "--logging-steps",
                      "3", "--eval-steps", "5")
    history = log_history(out)
    assert [e["step"] for e in history] == [3, 5, 6, 9, 10, 12, 13, 13]  # train at 3k, eval at 5k and the end
    (training,) = feed_trainings(feed)  # the training's identity heads its records
    assert feed_lines(feed)[0] == {TRAINING_KEY: training} and training["step"] == 0
    assert res_training(train_res) == training["id"]
    assert feed_records(feed) == [{"step": e["step"], **{k: v for k, v in e.items() if k != "step"}}
                                  for e in history]

    res = run_cli("dump", str(feed), "--run", "sft", "--no-gpu")
    assert res.returncode == 0, res.stderr.decode()
    got = samples(res.stdout.decode())
    last_train = history[5]
    last_eval = history[6]
    assert got["posttrain_step", (("run", "sft"),)] == 12
    assert got["posttrain_run_finished", (("run", "sft"),)] == 1
    assert got["posttrain_loss", (("run", "sft"),)] == last_train["loss"]
    assert got["posttrain_grad_norm", (("run", "sft"),)] == last_train["grad_norm"]
    assert got["posttrain_metric", (("key", "eval_loss"), ("run", "sft"))] == last_eval["eval_loss"]
    assert got["posttrain_metric", (("key", "train_runtime"), ("run", "sft"))] == history[7]["train_runtime"]
    for kind, n in (("train", 4), ("eval", 3), ("summary", 1)):
        assert got["posttrain_exporter_records_total", (("kind", kind), ("run", "sft"))] == n


def _serve(tmp_path: Path, feed: Path, config: dict) -> tuple[int, subprocess.Popen]:
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"poll_interval_seconds": 0.2, **config}))
    port = free_port()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log",
                                      str(feed), "--run", "grpo", "--config", str(cfg)),
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return port, p
        except OSError:
            time.sleep(0.1)
    p.terminate()
    raise AssertionError(f"serve did not come up: {p.stderr.read().decode()}")


def _stop(p: subprocess.Popen) -> str:
    p.terminate()
    err = p.stderr.read().decode()
    assert p.wait(10) == 0, err
    return err


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode()


def _kl_page(feed: Path) -> dict:
    """The KL page's finding in `report` of the feed: the step it became active (first_step)."""
    res = run_cli("report", str(feed), "--run", "grpo", "--output.format", "json")
    assert res.returncode == 0, res.stderr.decode()
    (run,) = json.loads(res.stdout)["runs"]
    return next(f for f in run["findings"] if f["alert"] == "PostTrainKLCritical")


def res_training(res: subprocess.CompletedProcess) -> str:
    """The id of the training the callback made (trl_train.py prints it)."""
    m = re.search(r"^training: (\S+)$", res.stdout.decode(), re.MULTILINE)
    assert m, res.stdout.decode()[-3000:]
    return m[1]


def _stopped_at(res: subprocess.CompletedProcess) -> tuple[int, str]:
    """The step the callback stopped the training at, and its warning."""
    m = re.search(r"posttrain-exporter: stopping the training at step (\d+): (.*)", res.stderr.decode())
    assert m, res.stderr.decode()[-3000:]
    return int(m[1]), m[2]


def test_a_diverging_grpo_run_is_stopped_by_the_stop_file(tiny_model: Path, tmp_path: Path) -> None:
    """GRPO of the random-init model on a brevity reward at lr 3e-3: KL passes 1 near step 40. The exporter follows
    the callback's feed with early_stop on; the callback stops the training on its stop file a few steps after
    the page became active, and says why."""
    out, feed, stop_file = tmp_path / "out", tmp_path / "feed.jsonl", tmp_path / "posttrain-stop.json"
    port, exporter = _serve(tmp_path, feed, {"early_stop": {"file": str(stop_file), "severity": "critical"}})
    try:
        started = time.monotonic()
        res = train("grpo", str(tiny_model), str(out), "--feed", str(feed), "--stop-file", str(stop_file),
                    "--max-steps", str(MAX_STEPS), "--logging-steps", "1")
        wall = time.monotonic() - started
        verdict = json.loads(_get(port, "/api/v1/verdict"))
        metrics = samples(_get(port, "/metrics"))
    finally:
        exporter_log = _stop(exporter)

    stop = json.loads(stop_file.read_text())
    signal_step = stop["step"]
    assert stop["run"] == "grpo" and stop["alerts"][0]["alert"] == "PostTrainKLCritical", stop
    assert stop["reason"].startswith(f"PostTrainKLCritical (critical) at step {signal_step}, held since step ")
    page = _kl_page(feed)
    assert page["first_step"] <= signal_step <= page["first_step"] + 10, (page, stop)

    history = log_history(out)
    stopped = json.loads((out / "trainer_state.json").read_text())["global_step"]
    assert signal_step < stopped <= signal_step + STOP_SLACK_STEPS < MAX_STEPS, (signal_step, stopped, wall)
    # and the exporter's judgment as the stop was written (stop now, the checkpoint, what to change)
    judged = stop["judgment"]
    assert judged["recommendation"] == "stop_now" and judged["action"].startswith("Stop the run: "), judged
    assert _stopped_at(res) == (stopped, f"{stop['reason']} (from {stop_file}). The exporter's judgment: "
                                         f"{judged['headline']} {judged['action']}")
    assert f"stopped_by: {stop['reason']}" in res.stdout.decode()
    assert [e["step"] for e in history] == [r["step"] for r in feed_records(feed)]
    assert history[-2]["step"] == stopped and "kl" in history[-2]  # the step it stopped at is logged and fed
    assert "stop signal written to" in exporter_log

    (run,) = verdict["runs"]
    assert run["stop"] and run["finished"] and run["step"] == stopped
    assert "PostTrainKLCritical" in {f["alert"] for f in run["active"]}
    assert metrics["posttrain_exporter_stop_signals_total", (("outcome", "written"), ("run", "grpo"))] >= 1


def test_a_diverging_grpo_run_is_stopped_by_the_verdict_endpoint(tiny_model: Path, tmp_path: Path) -> None:
    """The same run with `verdict_url=` instead (no early_stop in the exporter's config: the callback judges the
    endpoint's active findings itself)."""
    out, feed = tmp_path / "out", tmp_path / "feed.jsonl"
    port, exporter = _serve(tmp_path, feed, {})
    try:
        res = train("grpo", str(tiny_model), str(out), "--feed", str(feed), "--verdict-url",
                    f"http://127.0.0.1:{port}", "--max-steps", str(MAX_STEPS), "--logging-steps", "1")
    finally:
        _stop(exporter)
    stopped, why = _stopped_at(res)
    page = _kl_page(feed)
    assert page["first_step"] < stopped <= page["first_step"] + STOP_SLACK_STEPS, (page, stopped)
    assert why.startswith("PostTrainKLCritical (critical) at step ")
    assert f"(from http://127.0.0.1:{port}/api/v1/verdict). The exporter's judgment: Stop now: " in why, why
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == stopped
    assert not (tmp_path / "posttrain-stop.json").exists()


PAGE_TO_STOP_STEPS = 2  # issue 23's bar: a blow-up is stopped within this many steps of its page


def test_a_stopped_runs_folder_feed_and_exporter_stop_only_the_training_that_earns_it(tiny_model: Path,
                                                                                      tmp_path: Path) -> None:
    """One exporter (early_stop on) follows one feed; three GRPO trainings in turn in one output folder, each with
    the stop file and /api/v1/verdict: a blow-up, stopped at its page; then a healthy training, while the stop file
    of the first is still there and the exporter still says the first one's page: it runs to its end; then a
    blow-up again, stopped within PAGE_TO_STOP_STEPS steps of its own page."""
    out, feed, stop_file = tmp_path / "out", tmp_path / "feed.jsonl", tmp_path / "posttrain-stop.json"
    port, exporter = _serve(tmp_path, feed, {"early_stop": {"file": str(stop_file), "severity": "critical"}})
    common = ("--feed", str(feed), "--stop-file", str(stop_file), "--verdict-url", f"http://127.0.0.1:{port}",
              "--logging-steps", "1")
    try:
        first = train("grpo", str(tiny_model), str(out), *common, "--max-steps", str(MAX_STEPS))
        first_stopped, _ = _stopped_at(first)
        (before,) = json.loads(_get(port, "/api/v1/verdict"))["runs"]
        healthy = train("grpo", str(tiny_model), str(out), *common, "--max-steps", "25", "--learning-rate", "1e-6")
        healthy_state = json.loads((out / "trainer_state.json").read_text())
        third = train("grpo", str(tiny_model), str(out), *common, "--max-steps", str(MAX_STEPS))
        third_state = json.loads((out / "trainer_state.json").read_text())
        (after,) = json.loads(_get(port, "/api/v1/verdict"))["runs"]
    finally:
        _stop(exporter)

    ids = [res_training(r) for r in (first, healthy, third)]
    assert [t["id"] for t in feed_trainings(feed)] == ids and len(set(ids)) == 3
    # what the healthy training met at its start: the first one's page and its stop file
    assert before["training"]["id"] == ids[0] and before["stop"] and before["finished"]
    assert "PostTrainKLCritical" in {f["alert"] for f in before["active"]}
    assert "stopping the training" not in healthy.stderr.decode(), healthy.stderr.decode()[-2000:]
    assert healthy_state["global_step"] == 25 and "stopped_by" not in healthy.stdout.decode()

    stopped, _ = _stopped_at(third)
    page = _kl_page(feed)  # report of the feed judges its latest training
    print(f"first blow-up stopped at step {first_stopped}; healthy ran {healthy_state['global_step']} steps; "
          f"second blow-up: KL page at step {page['first_step']}, stopped at step {stopped}")  # pytest -s shows it
    assert page["first_step"] <= stopped <= page["first_step"] + PAGE_TO_STOP_STEPS, (page, stopped, first_stopped)
    assert third_state["global_step"] == stopped
    stop = json.loads(stop_file.read_text())
    assert stop["training"]["id"] == ids[2] and stop["step"] == page["first_step"], stop
    assert after["training"]["id"] == ids[2] and after["step"] == stopped


def test_run_with_the_feed_is_one_run(tiny_model: Path, tmp_path: Path) -> None:
    """`posttrain-exporter run --log FEED -- python trl_train.py grpo ...` on a feed that holds an earlier, killed
    blow-up: the trainer's console and its feed make one run (the trainer's), which the stop file stops; the
    earlier training's run is gone, so nothing alerts twice or for a training that is over."""
    from exporter.integrations.feed import FeedWriter
    from exporter.parsers.training import Training

    out, feed, stop_file = tmp_path / "out", tmp_path / "feed.jsonl", tmp_path / "posttrain-stop.json"
    old = FeedWriter(feed)
    old.begin(Training.new())
    for entry in json.loads((REPO / "tests/fixtures/corpus/grpo_kl_blowup/trainer_state.json").read_text())[
            "log_history"]:
        if "train_runtime" not in entry:  # killed: it never logged its end
            old.write(entry["step"], entry)
    old.close()
    cfg = tmp_path / "exporter.yml"
    cfg.write_text(yaml.safe_dump({"poll_interval_seconds": 0.2, "early_stop": {"file": str(stop_file)}}))
    port = free_port()
    cmd = exporter_cmd("run", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log", str(feed), "--config",
                       str(cfg), "--linger", "10", "--", sys.executable, str(TRAIN), "grpo", str(tiny_model), str(out),
                       "--feed", str(feed), "--stop-file", str(stop_file), "--max-steps", str(MAX_STEPS),
                       "--logging-steps", "1")
    p = subprocess.Popen(cmd, env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (out / "trainer_state.json").exists():
            assert p.poll() is None, p.stderr.read().decode()[-3000:]
            time.sleep(0.5)
        time.sleep(1.0)  # the trainer's last lines read
        verdict = json.loads(_get(port, "/api/v1/verdict"))
        metrics = _get(port, "/metrics")
    finally:
        stdout, stderr = p.communicate(timeout=120)  # it ends once it lingered (SIGTERM does not cut a linger short)
    (training,) = [t for t in feed_trainings(feed) if "launch" in t]
    assert [r["run"] for r in verdict["runs"]] == ["trl_train"], verdict
    (run,) = verdict["runs"]
    assert run["training"]["id"] == training["id"] == res_training(subprocess.CompletedProcess(cmd, 0, stdout))
    stop = json.loads(stop_file.read_text())
    assert stop["run"] == "trl_train" and stop["training"]["id"] == training["id"]
    assert f"stopped_by: {stop['reason']}" in stdout.decode(), stderr.decode()[-3000:]
    runs = {s.labels.get("run") for fam in text_string_to_metric_families(metrics) for s in fam.samples
            if fam.name.startswith("posttrain_") and not fam.name.startswith("posttrain_exporter_source")}
    assert runs - {None} == {"trl_train"}, runs
    # one run's records: the feed's, with the trainer's steps (the console's were left out)
    got = samples(metrics)
    assert got["posttrain_step", (("run", "trl_train"),)] == run["step"] == feed_records(feed)[-2]["step"]


def test_every_rank_stops_at_the_same_step(tmp_path: Path) -> None:
    """Two processes (torch.distributed, gloo): only the main one sees the stop file, and both stop at its step."""
    require_module("torch", "trl")
    res = train("ranks", str(tmp_path / "stop.json"))
    out = res.stdout.decode()
    assert "rank 0 stopped at step 5" in out and "rank 1 stopped at step 5" in out, out
    assert (tmp_path / "feed-0.jsonl").exists() and not (tmp_path / "feed-1.jsonl").exists()  # one writer


def test_the_callback_never_raises_into_the_trainer(tmp_path: Path, caplog) -> None:
    """Through transformers' own CallbackHandler: a feed that cannot be written and a stop check that fails cost
    log lines (once each), never an exception or a changed control; a stop file then stops the training."""
    require_module("transformers", "trl")
    import logging

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler

    from exporter.integrations.trl import ExporterFeedCallback
    from exporter.stopsignal import write_atomically

    (tmp_path / "not-a-folder").write_text("")
    stop_file = tmp_path / "stop.json"
    callback = ExporterFeedCallback(tmp_path / "not-a-folder" / "feed.jsonl", stop_file=stop_file)
    handler = CallbackHandler([callback], None, None, None, None)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    with caplog.at_level(logging.WARNING):
        handler.on_train_begin(args, state, control)
        for step in (1, 2, 3):
            state.global_step = step
            state.log_history.append({"loss": 1.0, "step": step})
            control = handler.on_log(args, state, control, {"loss": 1.0})
            control = handler.on_step_end(args, state, control)
        assert not control.should_training_stop and callback.writer.lost == 4  # the training line and 3 records
        assert sum("cannot write" in r.getMessage() for r in caplog.records) == 1

        def broken() -> None:
            raise RuntimeError("a bug in a stop source")

        callback.stop_file.check = broken  # type: ignore[method-assign]
        for step in (4, 5):
            state.global_step = step
            control = handler.on_step_end(args, state, control)
        assert not control.should_training_stop
        assert sum("checking the stop signal failed" in r.getMessage() for r in caplog.records) == 1

        callback.writer.write = broken  # type: ignore[method-assign]
        control = handler.on_log(args, state, control, {"loss": 1.0})
        control = handler.on_log(args, state, control, {"loss": 1.0})
        assert sum("on_log failed" in r.getMessage() for r in caplog.records) == 1

        del callback.stop_file.check  # the real one again
        signal = {"run": "r", "step": 5, "alerts": [{"alert": "PostTrainKLCritical"}],
                  "reason": "PostTrainKLCritical (critical) at step 5"}
        write_atomically(str(stop_file), json.dumps(signal))
        state.global_step = 6
        control = handler.on_step_end(args, state, control)
        assert control.should_training_stop and control.should_log
        assert callback.stopped is not None and callback.stopped.alerts == ("PostTrainKLCritical",)
        assert any(r.getMessage() == "posttrain-exporter: stopping the training at step 6: PostTrainKLCritical "
                   f"(critical) at step 5 (from {stop_file})" for r in caplog.records)
        handler.on_train_end(args, state, control)
