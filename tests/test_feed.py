"""The in-process feed's two halves without a trainer: the JSON lines the callback writes (and that the exporter
reads with their exact steps and kinds), and the stop signal's reader (stop file, /api/v1/verdict). The callback
in a real TRL training: tests/test_trl_callback.py."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TRL, trainer_state
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.exposition.collector import ExporterCollector
from exporter.integrations.feed import FeedWriter, feed_line, numeric
from exporter.integrations.stopwatch import StopFileWatch, VerdictPoller, notice_of_verdict, verdict_url
from exporter.parsers.chain import LineParserChain
from exporter.stopsignal import write_atomically


class _Tensor:
    """A one-element tensor as far as the feed is concerned: it has .item()."""

    def __init__(self, v: object) -> None:
        self.v = v

    def item(self) -> object:
        if isinstance(self.v, list):
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self.v


def test_numbers_only_step_first() -> None:
    line = feed_line(7, {"loss": 0.25, "epoch": np.float32(0.5), "num_tokens": 434, "grad_norm": _Tensor(1.5),
                         "flag": True, "name": "grpo", "many": _Tensor([1, 2]), "nothing": None, "step": 99,
                         "kl": float("nan"), "big": float("inf")})
    assert line is not None and line.startswith('{"step": 7, ') and line.endswith("}\n")
    doc = json.loads(line)
    assert list(doc)[:1] == ["step"] and doc["step"] == 7
    assert {k: v for k, v in doc.items() if k not in ("kl", "big")} == {
        "step": 7, "loss": 0.25, "epoch": 0.5, "num_tokens": 434, "grad_norm": 1.5}
    assert math.isnan(doc["kl"]) and doc["big"] == math.inf
    rec = LineParserChain().parse(line.rstrip("\n"))
    assert rec is not None and rec.step == 7 and rec.fmt == "jsonl" and math.isnan(rec.values["kl"])
    assert feed_line(3, {"name": "x", "flag": False}) is None
    assert numeric(np.int64(3)) == 3.0 and numeric(True) is None and numeric("1.5") is None


def _dump(path: Path) -> dict[tuple[str, tuple], str]:
    """The training families of `dump PATH` as {(sample, labels): value} (the exporter's own health left out:
    its line counters name the format)."""
    ex = Exporter(Config(), [LogSpec(str(path), "run")])
    ex.read_to_end()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ExporterCollector(ex))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        if fam.name.startswith("posttrain_exporter_"):
            continue
        for s in fam.samples:
            out[s.name, tuple(sorted(s.labels.items()))] = repr(s.value)
    return out


@pytest.mark.parametrize("run", ["sft", "grpo", "dpo"])
def test_a_feed_reads_as_the_runs_trainer_state(run: str, tmp_path: Path) -> None:
    """Every log_history entry of a real run (training, evaluation, the end-of-training summary) written by the
    feed is the same record to the exporter as trainer_state.json's: same steps, values, kinds and metrics."""
    feed = FeedWriter(tmp_path / "feed.jsonl")
    history = trainer_state(run)
    for entry in history:
        assert feed.write(entry["step"], entry)
    feed.close()
    lines = (tmp_path / "feed.jsonl").read_text().splitlines()
    assert [json.loads(ln) for ln in lines] == [{"step": e["step"], **{k: v for k, v in e.items() if k != "step"}}
                                                 for e in history]
    chain = LineParserChain()
    records = [chain.parse(ln) for ln in lines]
    assert [r.step for r in records] == [e["step"] for e in history]
    # kinds as the console's records of the same run have them (its stdout.log, printed by the trainer)
    console = [chain.parse(ln) for ln in (TRL / run / "stdout.log").read_text().splitlines() if ln.startswith("{'")]
    assert [r.kind for r in records] == [r.kind for r in console]
    assert _dump(tmp_path / "feed.jsonl") == _dump(TRL / run / "trainer_state.json")


def test_a_write_error_is_logged_once_and_writing_resumes(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the feed's folder should be")
    feed = FeedWriter(blocker / "feed.jsonl")
    with caplog.at_level(logging.WARNING, logger="exporter.integrations.feed"):
        assert not any(feed.write(step, {"loss": 1.0}) for step in range(1, 6))
        assert feed.lost == 5
        assert len(caplog.records) == 1 and "cannot write" in caplog.records[0].getMessage()
        blocker.unlink()
        assert feed.write(6, {"loss": 0.5})
        assert "again (5 records were lost)" in caplog.records[-1].getMessage()
    feed.close()
    assert (blocker / "feed.jsonl").read_text() == '{"step": 6, "loss": 0.5}\n'


def test_each_record_is_flushed_as_it_is_written(tmp_path: Path) -> None:
    feed = FeedWriter(tmp_path / "feed.jsonl")
    for step in (2, 4):
        feed.write(step, {"loss": 1.0 / step})
        assert (tmp_path / "feed.jsonl").read_text().splitlines()[-1] == json.dumps({"step": step, "loss": 1.0 / step})
    feed.close()


# --- the stop signal, read --------------------------------------------------------------------------------------


def _stop_doc(run: str = "grpo", step: int = 43) -> dict:
    return {"run": run, "step": step, "reason": f"PostTrainKLCritical (critical) at step {step}, held since step 41",
            "alerts": [{"alert": "PostTrainKLCritical", "severity": "critical", "since_step": 41}]}


def test_stop_file_watch(tmp_path: Path, caplog) -> None:
    path = tmp_path / "stop.json"
    write_atomically(str(path), json.dumps(_stop_doc(step=10)))  # an earlier training's
    watch = StopFileWatch(path)
    watch.start()
    with caplog.at_level(logging.WARNING, logger="exporter.integrations.stopwatch"):
        assert watch.check() is None and watch.check() is None
        assert sum("before this training started" in r.getMessage() for r in caplog.records) == 1
    write_atomically(str(path), json.dumps(_stop_doc(step=43)))
    notice = watch.check()
    assert notice is not None and (notice.run, notice.step, notice.alerts) == ("grpo", 43, ("PostTrainKLCritical",))
    assert notice.source == str(path) and "held since step 41" in notice.reason
    assert watch.check() is notice  # read once: unchanged files cost a stat
    os.unlink(path)
    assert watch.check() is None

    other = StopFileWatch(path, run="sft")
    other.start()
    write_atomically(str(path), json.dumps(_stop_doc(run="grpo")))
    assert other.check() is None
    write_atomically(str(path), json.dumps(_stop_doc(run="sft")))
    assert other.check() is not None

    with caplog.at_level(logging.WARNING, logger="exporter.integrations.stopwatch"):
        write_atomically(str(path), "not json")
        assert watch.check() is None and "cannot read the stop file" in caplog.records[-1].getMessage()
        write_atomically(str(path), '{"run": "grpo"}')
        assert watch.check() is None and "not one the exporter writes" in caplog.records[-1].getMessage()


def test_notice_of_a_verdict() -> None:
    doc = {"runs": [
        {"run": "a", "step": 50, "active": [{"alert": "PostTrainKLWarning", "severity": "warning", "since_step": 40,
                                             "summary": "KL held above the warning threshold."}]},
        {"run": "b", "step": 60, "active": [{"alert": "PostTrainKLCritical", "severity": "critical", "since_step": 55,
                                             "summary": "KL held beyond the stop threshold."}]},
    ]}
    n = notice_of_verdict(doc, "url", None, "critical")
    assert n is not None and (n.run, n.step, n.alerts) == ("b", 60, ("PostTrainKLCritical",))
    assert n.reason == ("PostTrainKLCritical (critical) at step 60, held since step 55: KL held beyond the stop "
                        "threshold.")
    assert notice_of_verdict(doc, "url", "a", "critical") is None
    assert notice_of_verdict(doc, "url", "a", "warning").alerts == ("PostTrainKLWarning",)
    assert notice_of_verdict({"runs": "nonsense"}, "url", None, "critical") is None
    assert notice_of_verdict([1, 2], "url", None, "critical") is None


def test_a_stop_says_the_exporters_judgment_in_one_bounded_line() -> None:
    """The exporter's judgment comes with a stop (the stop file's and the verdict's `judgment`) and goes to the
    trainer's log as one line, its headline then its action, however the file was written: cut at MAX_JUDGMENT,
    never a crash."""
    from exporter.integrations.stopwatch import MAX_JUDGMENT, notice_of_stop_file

    judged = {"headline": "Stop now: KL blew up.", "action": "Stop the run.\nKeep checkpoint-40."}
    n = notice_of_stop_file({**_stop_doc(), "judgment": judged}, "f")
    assert n is not None and n.judgment == "Stop now: KL blew up. Stop the run. Keep checkpoint-40."
    huge = notice_of_stop_file({**_stop_doc(), "judgment": {"action": "x" * 100_000}}, "f")
    assert huge is not None and len(huge.judgment) == MAX_JUDGMENT and huge.judgment.endswith("...")
    for odd in (None, 7, ["a"], {"a": 1}, {"headline": 3, "action": "  "}, "Stop."):
        got = notice_of_stop_file({**_stop_doc(), "judgment": odd}, "f")
        assert got is not None and got.judgment is None, odd
    verdict = {"runs": [{"run": "b", "step": 60, "judgment": {"headline": "Stop now.", "action": "Stop the run."},
                         "active": [{"alert": "PostTrainKLCritical", "severity": "critical", "since_step": 55}]}]}
    assert notice_of_verdict(verdict, "url", None, "critical").judgment == "Stop now. Stop the run."
    verdict["runs"][0]["judgment"] = "nonsense"
    assert notice_of_verdict(verdict, "url", None, "critical").judgment is None


def test_verdict_url() -> None:
    assert verdict_url("http://127.0.0.1:9847", None) == "http://127.0.0.1:9847/api/v1/verdict"
    assert verdict_url("https://h:9847/api/v1/verdict", "grpo 7b") == "https://h:9847/api/v1/verdict?run=grpo+7b"
    assert verdict_url("http://h/prefix/", "r") == "http://h/prefix/api/v1/verdict?run=r"


def test_verdict_poller_without_an_exporter_never_raises(caplog) -> None:
    from conftest import free_port

    poller = VerdictPoller(f"http://127.0.0.1:{free_port()}", timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="exporter.integrations.stopwatch"):
        assert poller.poll_once() is None and poller.poll_once() is None
    assert sum("cannot ask" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(ValueError, match="severity"):
        VerdictPoller("http://127.0.0.1:1", severity="page")


# --- only a stop for this training, at its own steps --------------------------------------------------------------


def test_a_stop_file_counts_only_for_its_own_training_and_steps(tmp_path: Path) -> None:
    path = tmp_path / "stop.json"
    watch = StopFileWatch(path)
    watch.start(training="aaa")
    write_atomically(str(path), json.dumps({**_stop_doc(step=43), "training": {"id": "bbb", "step": 0}}))
    assert watch.check(100) is None  # another training's stop
    write_atomically(str(path), json.dumps({**_stop_doc(step=43), "training": {"id": "aaa", "step": 0}}))
    assert watch.check(42) is None  # ahead of the trainer's own step: not about the steps it has run
    notice = watch.check(43)
    assert notice is not None and notice.training == "aaa" and notice.step == 43
    write_atomically(str(path), json.dumps(_stop_doc(step=43)))  # an exporter that names no training
    assert watch.check(44) is not None and watch.check(42) is None
    watch.start(training="ccc")  # the next training: the file is there already, and names none
    assert watch.check(50) is None


def test_a_verdict_counts_only_for_its_own_training_while_it_runs() -> None:
    active = [{"alert": "PostTrainKLCritical", "severity": "critical", "since_step": 55, "summary": "KL."}]
    run = {"run": "g", "step": 60, "finished": False, "training": {"id": "aaa"}, "active": active}
    assert notice_of_verdict({"runs": [run]}, "url", None, "critical", "aaa").training == "aaa"
    assert notice_of_verdict({"runs": [run]}, "url", None, "critical", "bbb") is None
    assert notice_of_verdict({"runs": [{**run, "finished": True}]}, "url", None, "critical", "aaa") is None
    legacy = notice_of_verdict({"runs": [{**run, "training": None}]}, "url", None, "critical", "aaa")
    assert legacy is not None and legacy.about("aaa", 60) and not legacy.about("aaa", 59)
    # the first run about this training wins over another training's run listed before it
    other = {**run, "run": "h", "training": {"id": "bbb"}}
    assert notice_of_verdict({"runs": [other, run]}, "url", None, "critical", "aaa").run == "g"


def test_the_verdict_poller_drops_a_stop_that_is_no_longer_about_its_training(tmp_path: Path) -> None:
    """A real `serve` on a feed whose training blew up (killed: not finished): the poller of that training sees the
    stop; once a new training's line is in the feed, the next answer is about the new one, and the stop is gone for
    both (the old poller's is not kept from before)."""
    from conftest import REPO, exporter_cmd, free_port

    from exporter.parsers.training import Training

    corpus = json.loads((REPO / "tests/fixtures/corpus/grpo_kl_blowup/trainer_state.json").read_text())
    history = [e for e in corpus["log_history"] if "train_runtime" not in e]
    first, second = Training.new(), Training.new()
    feed = FeedWriter(tmp_path / "feed.jsonl")
    feed.begin(first)
    for entry in history:
        feed.write(entry["step"], entry)
    port = free_port()
    p = subprocess.Popen(exporter_cmd("serve", "--no-gpu", "--listen-address", f"127.0.0.1:{port}", "--log",
                                      str(tmp_path / "feed.jsonl"), "--run", "grpo"),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        old, new = VerdictPoller(f"http://127.0.0.1:{port}"), VerdictPoller(f"http://127.0.0.1:{port}")
        old.training, new.training = first.id, second.id
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and old.poll_once() is None:
            time.sleep(0.1)
        notice = old.check(history[-1]["step"])
        assert notice is not None and notice.training == first.id and notice.alerts[0] == "PostTrainKLCritical"
        assert new.poll_once() is None and new.check(10_000) is None  # not its training
        feed.begin(second)
        feed.write(1, {"kl": 0.01, "loss": 0.1})
        while time.monotonic() < deadline and old.poll_once() is not None:
            time.sleep(0.1)
        assert old.check(10_000) is None and new.poll_once() is None
    finally:
        feed.close()
        p.terminate()
        assert p.wait(10) == 0, p.stderr.read().decode()


# --- hostile feeds --------------------------------------------------------------------------------------------------


def test_a_feed_with_garbage_and_lines_near_and_over_1_mib_keeps_its_records(tmp_path: Path) -> None:
    """The TRL feed with what a broken or hostile writer leaves in it: bytes that are no text, cut JSON, a line of
    1 MiB and more (dropped unread: too_long), a line just under it with 70,000 keys (read, its keys past
    limits.max_keys counted and not kept). Every record around them arrives, with its own step, and the run keeps
    no more keys than its limit. This held before; the test keeps it so."""
    from exporter.parsers.training import Training

    feed = tmp_path / "feed.jsonl"
    wide = json.dumps({"step": 4, **{f"k{i}": 1.0 for i in range(70_000)}})
    assert len(wide) < 1 << 20
    with feed.open("wb") as f:
        f.write(Training.new().line().encode())
        for s in (1, 2, 3):
            f.write(feed_line(s, {"loss": 1 / s, "reward": s / 10}).encode())
        f.write(b"\x00\xff\xfe garbage\n" + b'{"step": 3, "loss": \n' + wide.encode() + b"\n")
        f.write(b'{"step": 4, "pad": "' + b"x" * (1 << 20) + b'"}\n')
        for s in (5, 6):
            f.write(feed_line(s, {"loss": 1 / s, "reward": s / 10}).encode())
    ex = Exporter(Config(), [LogSpec(str(feed), "r")])
    ex.read_to_end()
    run, stats = ex.runs["r"], ex.stats["r"].total()
    run.refresh()
    assert run.step == 6 and dict(run.series[("reward", None)].history) == {s: s / 10 for s in (1, 2, 3, 5, 6)}
    assert stats.lines_dropped["too_long"] == 1 and run.keys_dropped["max_keys"] > 0
    assert len(run.passthrough) <= run.limits.max_keys
    assert stats.parse_errors["jsonl", "bad_json"] == 1  # the cut line; the garbage matches no format


def test_a_feed_of_another_training_appended_never_lends_it_this_ones_records(tmp_path: Path) -> None:
    """Another run's training appends to the same feed (the same output folder reused): from its training line on,
    the records are its own, from step 1 again, and the earlier training's values are not its. This held before;
    the test keeps it so."""
    from exporter.parsers.training import Training

    feed = tmp_path / "feed.jsonl"
    first, other = Training.new(), Training.new()
    lines = [first.line(), *(feed_line(s, {"kl": 5.0, "reward": 0.1}) for s in range(1, 31)),
             other.line(), *(feed_line(s, {"kl": 0.01, "reward": 0.9}) for s in range(1, 11))]
    feed.write_text("".join(lines))
    ex = Exporter(Config(), [LogSpec(str(feed), "r")])
    ex.read_to_end()
    run = ex.runs["r"]
    run.refresh()
    assert run.training == other and run.step == 10 and run.resets == 1
    assert dict(run.series[("kl", None)].history) == {s: 0.01 for s in range(1, 11)}
