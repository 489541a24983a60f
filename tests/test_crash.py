"""A run whose trainer died is judged `crashed`, never healthy: its output ends in a sign of it (a traceback, an
abort, a shell's `Killed`) with no training record after, or `run` saw the trainer exit non-zero. A traceback the
trainer survives, or one from a finaliser at exit, is no crash. On real TRL console logs, with the failure text
written here (the shapes torch, torchrun, Ray and bash print)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request

import pytest
from conftest import REPO, TRL, exporter_cmd, free_port, run_cli

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.parsers.failures import FailureWatch
from exporter.report.verdict import judge

LOG = TRL / "grpo" / "combined_unbuffered.log"  # a healthy GRPO run, as its console printed it
# The verdict of the intact log: the bundled demo run does not learn its task (its correctness reward never
# fires), so a survived sign leaves it at that, not at crashed.
LOG_VERDICT = "not_learning"
OOM = ("Traceback (most recent call last):\n"
       '  File "/workspace/train.py", line 88, in <module>\n'
       "    trainer.train()\n"
       '  File "/usr/lib/python3/site-packages/torch/utils/checkpoint.py", line 496, in forward\n'
       "    return fn(*args)\n"
       "           ^^^^^^^^^\n"
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of "
       "79.14 GiB of which 1.02 GiB is free.\n")


def _judge(tmp_path, text: str, name: str = "train.log"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    ex = Exporter(Config(), [LogSpec(str(path), "r")])
    ex.read_to_end()
    return judge(ex.runs["r"], stats=ex.stats["r"])


def _train_lines(text: str) -> list[int]:
    """Offsets just past each training dict line ({'loss': ...})."""
    out, at = [], 0
    while (i := text.find("{'loss'", at)) >= 0:
        at = text.index("\n", i) + 1
        out.append(at)
    return out


def test_a_log_that_ends_in_a_traceback_is_crashed_and_fails_the_gate(tmp_path) -> None:
    text = LOG.read_text(encoding="utf-8")
    healthy = _judge(tmp_path, text)
    assert healthy.verdict == LOG_VERDICT and healthy.crash is None
    cut = text[:_train_lines(text)[5]]  # six records in, then the trainer died
    v = _judge(tmp_path, cut + OOM)
    assert v.verdict == "crashed"
    assert v.crash.kind == "traceback" and v.crash.text.startswith("torch.OutOfMemoryError: CUDA out of memory.")
    assert v.last_step == _judge(tmp_path, cut, "cut.log").last_step  # the last step logged before it

    path = tmp_path / "train.log"
    res = run_cli("report", "--output.format", "json", "--fail-on", "critical", str(path))
    assert res.returncode == 4, res.stderr  # whatever the level: a dead trainer fails the gate
    run = json.loads(res.stdout)["runs"][0]
    assert run["verdict"] == "crashed" and run["crash"]["kind"] == "traceback"
    assert "CUDA out of memory" in run["crash"]["text"]
    assert b"the trainer died after step" in res.stderr
    text_report = run_cli("report", str(path)).stdout.decode()
    assert "CRASHED" in text_report and "crashed after step" in text_report
    html = run_cli("report", "--output.format", "html", str(path)).stdout.decode()
    assert "The trainer died after it" in html and "CUDA out of memory" in html


def test_a_record_waiting_for_its_redraw_when_the_trainer_died_is_no_sign_it_lived_on(tmp_path) -> None:
    """Unbuffered TRL prints a record's dict, then the bar's redraw that gives its step. Cut just after a dict, the
    record still waits when the traceback comes, and reaches the run after it (at the end of input): it was logged
    before the failure, so it must not clear it."""
    text = LOG.read_text(encoding="utf-8")
    cut = text[:_train_lines(text)[7]]
    assert not cut.rstrip("\n").endswith("it/s]")  # what follows the dict, its redraw, is cut off
    v = _judge(tmp_path, cut + OOM)
    assert v.verdict == "crashed", v.crash


@pytest.mark.parametrize("survived", [
    # logged and survived (logger.exception in a retry), training went on
    "ERROR:root:upload failed\n" + OOM.replace("torch.OutOfMemoryError: CUDA out of memory.",
                                                "ConnectionError: upload failed."),
    # a finaliser's traceback at the interpreter's exit is no crash
    "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2b>\n" + OOM,
])
def test_a_traceback_the_trainer_survives_is_no_crash(tmp_path, survived: str) -> None:
    text = LOG.read_text(encoding="utf-8")
    at = _train_lines(text)[3]
    mid = _judge(tmp_path, text[:at] + survived + text[at:])
    assert mid.verdict == LOG_VERDICT and mid.crash is None
    if survived.startswith("Exception ignored"):
        end = _judge(tmp_path, text + survived)
        assert end.verdict == LOG_VERDICT and end.crash is None


def test_a_traceback_after_the_end_summary_is_no_crash_and_the_summary_after_one_clears_it(tmp_path) -> None:
    """After the end summary the training is over: a traceback then is an exit handler's or a thread's (wandb's,
    vLLM's at shutdown), not the training's death (under `run`, a non-zero exit still says crashed). A traceback
    logged before the summary was survived."""
    text = LOG.read_text(encoding="utf-8")
    assert "'train_runtime'" in text
    for tail in (OOM, "Error in atexit._run_exitfuncs:\n" + OOM, "Exception in thread Thread-3 (_pin_memory_loop):\n"
                 + OOM):
        after = _judge(tmp_path, text + tail)
        assert after.verdict == LOG_VERDICT and after.finished and after.crash is None, tail[:40]
    summary_at = text.index("{'train_runtime'")
    before = _judge(tmp_path, text[:summary_at] + "\n" + OOM + text[summary_at:])
    assert before.verdict == LOG_VERDICT and before.crash is None


@pytest.mark.parametrize(("tail", "kind"), [
    ("Killed\n", "killed"),
    ("./train.sh: line 12:  4242 Killed                  python train.py\n", "killed"),
    ("terminate called after throwing an instance of 'c10::DistBackendError'\n", "abort"),
    ("Fatal Python error: Segmentation fault\n", "fatal_error"),
    ("Segmentation fault (core dumped)\n", "crash"),
    ("[rank0]:[E1126 10:01:02.123 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
     "WorkNCCL(SeqNum=4242, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n", "nccl_timeout"),
    ("".join(f"[rank1]: {line}\n" for line in OOM.splitlines()), "traceback"),
    ("".join(f"(WorkerDict pid=4388) {line}\n" for line in OOM.splitlines()), "traceback"),
    ("".join(f"[default0]:{line}\n" for line in OOM.splitlines()), "traceback"),  # torchrun --tee
    ("".join(f"0: {line}\n" for line in OOM.splitlines()), "traceback"),  # srun --label
    ("".join(f"2026-11-26T10:01:02.123456789Z {line}\n" for line in OOM.splitlines()), "traceback"),  # logs -t
    ("./train.sh: line 4: 13407 Segmentation fault      python3 train.py\n", "crash"),
    ("./train.sh: line 5: 13408 Aborted                 (core dumped) python3 train.py\n", "crash"),
    ("Segmentation fault\n", "crash"),  # dash, no core written
])
def test_every_sign_of_a_dead_trainer_is_read(tmp_path, tail: str, kind: str) -> None:
    text = LOG.read_text(encoding="utf-8")
    v = _judge(tmp_path, text[:_train_lines(text)[5]] + tail)
    assert v.verdict == "crashed" and v.crash.kind == kind, v.crash
    if kind == "traceback":  # the exception line, whatever process printed it
        assert v.crash.text.startswith("torch.OutOfMemoryError"), v.crash.text


def test_lines_that_only_look_like_a_sign_are_none() -> None:
    watch = FailureWatch()
    for line in ["Killed 3 stale workers before the run", "no core dumped here", "Traceback printing is on",
                 "  Traceback (most recent call last):", "warning: Fatal Python errors are reported below",
                 "INFO 11-26 10:01:02 [async_llm.py:420] Aborted request chatcmpl-42.", "Aborted request 42"]:
        assert watch.line(line) is None, line


def test_a_crash_before_the_first_step_is_no_data_that_says_how_the_trainer_died(tmp_path) -> None:
    v = _judge(tmp_path, "Loading checkpoint shards: 100%|##########| 2/2\n" + OOM)
    assert v.verdict == "no_data"
    res = run_cli("report", str(tmp_path / "train.log"))
    assert b"the trainer died before its first logged step: torch.OutOfMemoryError" in res.stdout


def _linger_verdict(child: list[str], ready) -> dict:
    """/api/v1/verdict's run while `run --linger` serves after the trainer exited, once `ready(run)`."""
    port = free_port()
    p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--linger", "30",
                                      "--web.listen-address", f"127.0.0.1:{port}", "--", *child),
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    doc: dict = {}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/verdict", timeout=5) as r:
                    doc = json.load(r)["runs"][0]
                if ready(doc):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        p.terminate()  # ends the linger
        p.communicate(timeout=20)
    finally:
        p.kill()
    return doc


def test_run_judges_the_trainer_by_its_exit_status(tmp_path) -> None:
    """Under `run` a non-zero status is a crash, even with nothing in its output to say so (137: killed); status 0
    clears nothing (a wrapper script that swallows the trainer's status: its output still ends in a traceback); a
    trainer ended by a signal `run` forwarded (the pod stopping) was stopped, not crashed."""
    log = tmp_path / "out.log"
    log.write_text(LOG.read_text(encoding="utf-8"), encoding="utf-8")
    killed = _linger_verdict(["sh", "-c", f"cat {log}; kill -9 $$"],
                             lambda d: d["crash"] is not None and d["crash"]["kind"] == "exit_status")
    assert killed["verdict"] == "crashed", killed
    assert killed["crash"] == {"kind": "exit_status", "text": "the trainer exited with status 137 (killed by signal 9)"}
    text = LOG.read_text(encoding="utf-8")
    (tmp_path / "cut.log").write_text(text[:_train_lines(text)[5]] + OOM, encoding="utf-8")
    done = tmp_path / "done"
    masked = _linger_verdict(["sh", "-c", f"cat {tmp_path / 'cut.log'}; echo uploading logs; touch {done}; exit 0"],
                             lambda d: done.exists() and time.time() - done.stat().st_mtime > 3)
    assert masked["verdict"] == "crashed" and masked["crash"]["kind"] == "traceback", masked


def test_a_trainer_stopped_by_a_signal_run_forwarded_is_not_crashed(tmp_path) -> None:
    port = free_port()
    p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--linger", "30",
                                      "--web.listen-address", f"127.0.0.1:{port}", "--", "sh", "-c",
                                      f"cat {LOG.parent / 'combined.log'}; exec sleep 60"),
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        doc: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not doc.get("step"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/verdict", timeout=5) as r:
                    doc = json.load(r)["runs"][0]
            except OSError:
                pass
            time.sleep(0.2)
        p.terminate()  # forwarded to the trainer, which dies of it (143); `run` lingers on
        time.sleep(3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/verdict", timeout=5) as r:
            doc = json.load(r)["runs"][0]
        assert doc["crash"] is None and doc["verdict"] != "crashed", doc
        p.terminate()  # a signal in the linger ends it
        p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 128 + 15


def _with_nan_loss(text: str, at: set[int]) -> str:
    """The log with the loss of the training records numbered in `at` (0-based) printed as NaN."""
    out, n = [], 0
    for line in text.splitlines(keepends=True):
        if "{'loss': '" in line:
            if n in at:
                head, rest = line.split("{'loss': '", 1)
                line = head + "{'loss': 'nan" + rest[rest.index("'"):]
            n += 1
        out.append(line)
    return "".join(out)


@pytest.mark.parametrize(("nan_at", "paged_from"), [
    (set(range(100, 300, 2)), 102),  # every other step from record 100: a numerical failure, not an overflow
    (set(range(100, 300)), 101),  # every step from record 100 (the page came at the second before too)
    ({100, 150, 200}, None),  # isolated overflow steps (fp16 loss scaling skips them and goes on): no page
])
def test_a_loss_that_is_nan_on_two_of_three_logged_steps_pages(tmp_path, nan_at: set[int],
                                                                paged_from: int | None) -> None:
    text = (TRL / "sft" / "combined.log").read_text(encoding="utf-8")
    v = _judge(tmp_path, _with_nan_loss(text, nan_at))
    nonfinite = [f for f in v.findings if f.alert == "PostTrainNonFiniteLossOrKL"]
    if paged_from is None:
        assert not nonfinite, nonfinite
        return
    assert len(nonfinite) == 1 and len(nonfinite[0].episodes) == 1, nonfinite  # held, not flapping
    assert nonfinite[0].first_step == paged_from + 1, nonfinite  # record N is logged step N + 1 here


def test_the_checkpoint_to_keep_is_never_after_a_numerical_failure(tmp_path) -> None:
    """The reward may still peak after the loss went NaN (its logged mean keeps moving); the report's best step is
    the peak before the first NaN step, though the page holds only from the second (`since`)."""
    text = LOG.read_text(encoding="utf-8")
    best = _judge(tmp_path, text, "healthy.log").best_step
    for first_nan in (best, best - 20):  # record N is logged step N + 1 in this run
        v = _judge(tmp_path, _with_nan_loss(text, set(range(first_nan - 1, 400))))
        since = next(f for f in v.findings if f.alert == "PostTrainNonFiniteLossOrKL").episodes[0].since
        assert since == first_nan + 1
        assert v.best_step is not None and v.best_step < first_nan, (v.best_step, first_nan)
        assert v.best_reward is not None and v.kl_at_best is not None


def test_a_log_last_written_long_ago_is_stale_at_once_not_after_the_stall_time(tmp_path) -> None:
    """`serve` started (or restarted) on the log of a trainer that died two days ago without a sign: its records
    are as old as the file, so the run is stale at once and the stall alert's timestamp says two days, not "just
    now" (which read healthy for the next 30 minutes). The same log freshly written is healthy."""
    import os

    text = LOG.read_text(encoding="utf-8")
    cut = text[:_train_lines(text)[100]]  # no end summary: it did not finish
    for age, verdict in ((2 * 86400, "stale"), (0, LOG_VERDICT)):
        path = tmp_path / f"old{age}.log"
        path.write_text(cut, encoding="utf-8")
        written = time.time() - age
        os.utime(path, (written, written))
        ex = Exporter(Config(), [LogSpec(str(path), "r")])
        ex.poll_once()
        while ex.catching_up:
            ex.poll_once()
        doc = ex.verdict()["runs"][0]
        assert doc["verdict"] == verdict, (age, doc["verdict"])
        assert abs(ex.runs["r"].last_record_time - written) < 5, age


def test_loss_and_kl_logged_in_two_records_of_one_step_are_one_step(tmp_path) -> None:
    """A trainer that logs its loss and its KL in two records of each step: one overflow step (both NaN) is one
    step of three, not two records of three, and pages nothing."""
    def log(bad) -> str:
        lines = []
        for step in range(1, 101):
            lines.append(json.dumps({"step": step, "loss": "nan" if bad(step) else 0.5 - step / 1000}))
            lines.append(json.dumps({"step": step, "kl": "nan" if bad(step) else 0.01 + step / 10000}))
        return "\n".join(lines) + "\n"

    v = _judge(tmp_path, log(lambda step: step == 50), "two.jsonl")
    assert v.last_step == 100
    assert not [f for f in v.findings if f.alert == "PostTrainNonFiniteLossOrKL"], v.findings
    v = _judge(tmp_path, log(lambda step: step >= 60), "diverged.jsonl")  # the second NaN step pages
    assert [f.first_step for f in v.findings if f.alert == "PostTrainNonFiniteLossOrKL"] == [61]


def test_a_line_of_another_process_inside_a_traceback_is_not_its_reason() -> None:
    watch = FailureWatch()
    lines = OOM.splitlines()
    lines.insert(3, "[2026-11-26 10:00:00] INFO saving checkpoint-60")  # another thread's line, unindented
    lines.insert(5, "  4%|4         | 13/300 [00:01<00:36,  7.95it/s]")
    got = [f for line in lines if (f := watch.line(line)) is not None]
    assert got and got[-1].text.startswith("torch.OutOfMemoryError: CUDA out of memory."), got[-1].text
    ray = FailureWatch()
    for line in ["Traceback (most recent call last):", '  File "main_ppo.py", line 4, in <module>',
                 "ray.exceptions.RayTaskError(OutOfMemoryError): ray::WorkerDict.actor_rollout_update_actor()"]:
        failure = ray.line(line)
    assert failure is not None and failure.text.startswith("ray.exceptions.RayTaskError(OutOfMemoryError):")


# --- what the model or the reward function prints is no crash -------------------------------------------------------

# What a code-execution reward function commonly prints of the model's program, run in a sandbox: every frame is in
# code that is no file of the trainer's process.
SANDBOX = ("Traceback (most recent call last):\n"
           '  File "<sandbox>", line 2, in f\n'
           "ZeroDivisionError: division by zero\n")
# The same from `python -c CODE` and from a program written to a temporary file, run in a subprocess
STRING = ("Traceback (most recent call last):\n"
          '  File "<string>", line 1, in <module>\n'
          '  File "<string>", line 1, in solve\n'
          "IndexError: list index out of range\n")
SUBPROCESS = ("Traceback (most recent call last):\n"
              '  File "/tmp/tmpk3j9x2ab/solution.py", line 7, in <module>\n'
              "    print(solve(int(input())))\n"
              "                ^^^^^^^^^^^^\n"
              "ValueError: invalid literal for int() with base 10: ''\n")


def _after_record(text: str, n: int, inserted: str, rest: int | None = None) -> str:
    """The log cut after its n-th training record, `inserted`, then the log's next `rest` characters (None: all)."""
    at = _train_lines(text)[n - 1]
    return text[:at] + inserted + (text[at:] if rest is None else text[at:at + rest])


@pytest.mark.parametrize("printed", [SANDBOX, STRING, SUBPROCESS])
def test_a_reward_functions_traceback_is_no_crash_and_is_counted(tmp_path, printed: str) -> None:
    """30 healthy records, then the reward function prints a traceback of the model's program: healthy, whether the
    log ends there or goes on, and the reward function's failures are counted with their last reason."""
    text = LOG.read_text(encoding="utf-8")
    reason = printed.rstrip("\n").rsplit("\n", 1)[1]
    assert _judge(tmp_path, _after_record(text, 30, "", rest=0), "cut.log").verdict == "healthy"
    at_end = _judge(tmp_path, _after_record(text, 30, printed, rest=0))
    assert at_end.verdict == "healthy" and at_end.crash is None, at_end.crash
    assert (at_end.reward_function_errors, at_end.reward_function_error) == (1, reason)
    twice = _judge(tmp_path, _after_record(_after_record(text, 60, printed), 30, printed), "twice.log")
    assert twice.verdict == LOG_VERDICT and twice.crash is None and twice.reward_function_errors == 2


def test_the_report_says_the_reward_function_is_failing(tmp_path) -> None:
    text = LOG.read_text(encoding="utf-8")
    path = tmp_path / "train.log"
    path.write_text(_after_record(text, 30, SANDBOX, rest=0), encoding="utf-8")
    res = run_cli("report", "--output.format", "json", "--fail-on", "critical", str(path))
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)["runs"][0]
    assert run["verdict"] == "healthy" and run["crash"] is None
    assert run["reward_function"] == {"errors": 1, "last": "ZeroDivisionError: division by zero"}
    said = run_cli("report", str(path)).stdout.decode()
    assert "the reward function is failing: 1 error, the last: ZeroDivisionError: division by zero" in said, said
    html = run_cli("report", "--output.format", "html", str(path)).stdout.decode()
    assert "The reward function is failing" in html and "ZeroDivisionError: division by zero" in html
    dump = run_cli("dump", "--run", "train", str(path)).stdout.decode()
    assert 'posttrain_reward_function_errors_total{run="train"} 1.0' in dump
    assert 'posttrain_run_crashed{run="train"} 0.0' in dump


def test_a_traceback_with_a_frame_of_the_trainers_own_is_still_a_sign(tmp_path) -> None:
    """One frame in a file of the trainer's (the reward function's own module that exec'd the model's code) makes it
    a traceback of the trainer's process: at the end of the log it is a crash; nothing is counted as the reward
    function's."""
    text = LOG.read_text(encoding="utf-8")
    mixed = SANDBOX.replace('  File "<sandbox>"', '  File "/workspace/rewards.py", line 40, in code_reward\n'
                                                  '    exec(code, {})\n  File "<string>"')
    v = _judge(tmp_path, _after_record(text, 30, mixed, rest=0))
    assert v.verdict == "crashed" and v.crash.text == "ZeroDivisionError: division by zero"
    assert v.reward_function_errors == 0


def _bars_after(text: str, n: int) -> tuple[str, str]:
    """The two progress-bar draws that follow the n-th training record in the log: its own redraw (the count that
    gives its step) and the next step's."""
    at = _train_lines(text)[n - 1]
    own = text.index("it/s]", at) + len("it/s]")
    following = text.index("it/s]", own) + len("it/s]")
    assert "{" not in text[at:following], text[at:following]
    return text[at:own] + "\n", text[own:following] + "\n"


@pytest.mark.parametrize("sign", ["Killed\n", "Segmentation fault (core dumped)\n", OOM])
def test_a_sign_the_trainers_own_output_follows_is_no_crash(tmp_path, sign: str) -> None:
    """What the model writes, printed by the reward function (`Killed`), then the trainer's own output with no record
    yet (its bar moves on to the next step; or it logs a checkpoint save or a line): the trainer lived on. A redraw
    of the bar at the count it had (as tqdm draws it once more at exit), or the redraw a record printed before the
    sign was waiting for, is no sign of life."""
    text = LOG.read_text(encoding="utf-8")
    own, following = _bars_after(text, 30)
    drawn = _after_record(text, 30, own + sign, rest=0)  # record 30, its bar's redraw, then the sign
    for tail in (following, "Saving model checkpoint to /out/checkpoint-30\n",
                 "INFO:trl.trainer.grpo_trainer:syncing weights to vLLM\n"):
        v = _judge(tmp_path, drawn + tail)
        assert v.verdict != "crashed" and v.crash is None, (tail, v.crash)
    before_redraw = _judge(tmp_path, _after_record(text, 30, sign, rest=0) + own + following)
    assert before_redraw.verdict != "crashed" and before_redraw.crash is None, before_redraw.crash
    for dead in (drawn + own, _after_record(text, 30, sign, rest=0) + own,
                 drawn + "wandb: Find logs at: wandb/run-2026/logs\n"):
        v = _judge(tmp_path, dead)
        assert v.verdict == "crashed", dead[-200:]


def _follow(path) -> Exporter:
    ex = Exporter(Config(), [LogSpec(str(path), "r")])
    ex.poll_once()
    while ex.catching_up:
        ex.poll_once()
    return ex


def test_live_a_sign_is_a_crash_only_once_the_trainer_stayed_silent_longer_than_its_usual_silence(tmp_path) -> None:
    """`serve` on a log being written: a lone `Killed` after 30 records is no crash while the trainer may still be
    saving a checkpoint; it is one once its output has stayed silent for longer than the run's usual silence. Its
    own output after (the next step's bar) clears it, as a record would."""
    text = LOG.read_text(encoding="utf-8")
    path = tmp_path / "train.log"
    path.write_text(_after_record(text, 30, "Killed\n", rest=0), encoding="utf-8")
    ex = _follow(path)
    run = ex.runs["r"]
    now = time.time()
    assert run.crash is None and ex.verdict()["runs"][0]["verdict"] != "crashed"
    assert run.crash_at(now + 30) is None  # a checkpoint save's minute: the trainer may well be alive
    late = run.crash_at(now + run.usual_silence() + 1)
    assert late is not None and late.kind == "killed"
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(_bars_after(text, 30)))
    ex.poll_once()
    assert run.crash_at(now + run.usual_silence() + 1) is None  # it lived on


def test_live_a_sign_in_a_log_last_written_long_ago_is_a_crash_at_once(tmp_path) -> None:
    import os

    text = LOG.read_text(encoding="utf-8")
    path = tmp_path / "train.log"
    path.write_text(_after_record(text, 30, OOM, rest=0), encoding="utf-8")
    written = time.time() - 86400
    os.utime(path, (written, written))
    ex = _follow(path)
    assert ex.runs["r"].crash is not None and ex.verdict()["runs"][0]["verdict"] == "crashed"


def _verdict_of(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/verdict", timeout=5) as r:
        return json.load(r)["runs"][0]


def test_under_run_a_sign_counts_only_at_the_trainers_exit(tmp_path) -> None:
    """`run`: the trainer prints 30 records, a lone `Killed` (what its model wrote), and stays silent for a while
    (a checkpoint save) before it goes on: no crash meanwhile, and none at its exit with status 0."""
    text = LOG.read_text(encoding="utf-8")
    (tmp_path / "a.log").write_text(_after_record(text, 30, "Killed\n", rest=0), encoding="utf-8")
    (tmp_path / "b.log").write_text(text[_train_lines(text)[29]:], encoding="utf-8")
    paused, done = tmp_path / "paused", tmp_path / "done"
    port = free_port()
    p = subprocess.Popen(exporter_cmd("--log-level", "error", "run", "--no-gpu", "--linger", "30",
                                      "--web.listen-address", f"127.0.0.1:{port}", "--", "sh", "-c",
                                      f"cat {tmp_path / 'a.log'}; touch {paused}; sleep 4; cat {tmp_path / 'b.log'}; "
                                      f"touch {done}"),
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        during: dict = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done.exists():
            if paused.exists() and time.time() - paused.stat().st_mtime > 1.5 and not during:
                with contextlib.suppress(OSError):
                    during = _verdict_of(port)
            time.sleep(0.2)
        assert during.get("step", 0) >= 29 and during["crash"] is None and during["verdict"] != "crashed", during
        time.sleep(2)  # the trainer exited with 0; `run` lingers
        after = _verdict_of(port)
        assert after["crash"] is None and after["verdict"] != "crashed", after
        p.terminate()
        p.communicate(timeout=20)
    finally:
        p.kill()
    assert p.returncode == 0
