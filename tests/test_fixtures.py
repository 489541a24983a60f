"""The real TRL logs, every capture of them, against the trainer's own trainer_state.json.

trainer_state.json holds every logged record with full precision and its step; the console
prints the same records with 4 significant digits and no step. Each console record must come out
with the step trainer_state gives it, whether stdout was block-buffered, unbuffered, a separate
file or a pseudo-terminal."""

from __future__ import annotations

import math
import re

import pytest
from conftest import TRL, fixture_captures, trainer_state

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.console.framing import ConsoleFramer
from exporter.console.steps import StepClock
from exporter.parsers.chain import LineParserChain


class RecordingSink:
    """Framer sink that runs the parser chain and the step clock, and keeps what comes out."""

    def __init__(self) -> None:
        self.clock, self.parsers = StepClock(), LineParserChain()
        self.records: list = []
        self.abandoned_lines = 0

    def bar(self, n: int, total: str, description: str | None) -> None:
        self.records.extend(self.clock.bar(n, total, description))

    def clear(self) -> None:
        self.clock.clear()

    def line(self, text: str) -> None:
        rec = self.parsers.parse(text)
        if rec is not None:
            self.records.extend(self.clock.record(rec))

    def abandoned(self, text: str) -> None:
        self.abandoned_lines += 1


def console_records(path, chunk: int):
    """Framer + parser + step clock over a file fed in chunks of `chunk` characters."""
    sink = RecordingSink()
    framer = ConsoleFramer(sink)
    text = path.read_bytes().decode("utf-8", "replace")
    for i in range(0, len(text), chunk):
        framer.feed(text[i : i + chunk])
    framer.flush()
    sink.records.extend(sink.clock.flush())
    return sink.records, sink.abandoned_lines


# Each capture is a separate run of the same seeded script: values agree, wall-clock timings do not.
TIMING = re.compile(r"runtime|per_second|step_time")


def close4(printed: float, exact: float) -> bool:
    """The console prints '.4g': compare at that precision."""
    if math.isnan(exact):
        return math.isnan(printed)
    return printed == float(f"{exact:.4g}") or math.isclose(printed, exact, rel_tol=6e-4, abs_tol=1e-12)


@pytest.mark.parametrize(("run", "capture"), fixture_captures())
@pytest.mark.parametrize("chunk", [65536, 4093])
def test_every_record_gets_the_trainers_step_and_values(run: str, capture: str, chunk: int) -> None:
    history = trainer_state(run)
    records, abandoned = console_records(TRL / run / capture, chunk)
    assert abandoned == 0
    assert len(records) == len(history)
    for rec, entry in zip(records, history, strict=True):
        assert rec.step == entry["step"], f"{run}/{capture}: record {rec.values} got step {rec.step}"
        for key, printed in rec.values.items():
            if key != "epoch" and not TIMING.search(key):
                assert close4(printed, entry[key]), (key, printed, entry[key])


def test_small_chunks_cut_lines_anywhere() -> None:
    """Reads as small as 7 characters cut dicts, bars and \\r\\n pairs: nothing changes."""
    records, abandoned = console_records(TRL / "grpo" / "tty.log", 7)
    assert abandoned == 0 and [r.step for r in records] == [e["step"] for e in trainer_state("grpo")]


def load(*paths: str, run: str = "r") -> Exporter:
    ex = Exporter(Config(), [LogSpec(str(p), run) for p in paths])
    ex.read_to_end()
    return ex


def hist(ex: Exporter, instrument: str, label: str | None = None, run: str = "r") -> dict[int, float]:
    return dict(ex.runs[run].series[(instrument, label)].history)


def test_grpo_kl_spike_and_every_other_step_rewards() -> None:
    """grpo/: beta=0.04, num_iterations=2 (rewards and lengths on every other step), a KL spike near 285."""
    state = {e["step"]: e for e in trainer_state("grpo") if "loss" in e}
    ex = load(TRL / "grpo" / "combined.log")
    kl = hist(ex, "kl")
    spike_step = max(state, key=lambda s: state[s]["kl"])
    assert 280 <= spike_step <= 290 and state[spike_step]["kl"] > 9
    assert max(kl, key=kl.get) == spike_step and close4(kl[spike_step], state[spike_step]["kl"])
    reward = hist(ex, "reward")
    logged = sorted(s for s, e in state.items() if "reward" in e)
    assert sorted(reward) == logged and len(logged) == 150  # nothing carried forward to the other steps
    comp = hist(ex, "reward_component", "correctness_reward")
    assert all(close4(comp[s], state[s]["rewards/correctness_reward/mean"]) for s in logged)
    for s in (1, 2, 101, 299):  # length keys only where logged
        assert (s in hist(ex, "completion_length", "mean")) == ("completions/mean_length" in state[s])


def test_grpo_saturated_reward_std_goes_to_zero() -> None:
    state = {e["step"]: e for e in trainer_state("grpo_saturated") if "loss" in e}
    ex = load(TRL / "grpo_saturated" / "stdout.log")
    std = hist(ex, "reward_std")
    zero = hist(ex, "reward_zero_std")
    late = [s for s in std if s >= 60]
    # From about step 60 nearly every group ties: reward_std 0 and every group zero-std.
    assert len(late) == 241 and sum(std[s] == 0 and zero[s] == 1 for s in late) / len(late) > 0.8
    assert all(close4(std[s], state[s]["reward_std"]) for s in std)


def test_dpo_rewards_are_dpo_not_components() -> None:
    state = {e["step"]: e for e in trainer_state("dpo") if "loss" in e}
    ex = load(TRL / "dpo" / "combined.log")
    run = ex.runs["r"]
    assert not any(inst == "reward_component" for inst, _ in run.series)
    for kind, key in [("chosen", "rewards/chosen"), ("rejected", "rewards/rejected"), ("margin", "rewards/margins")]:
        h = hist(ex, "dpo_reward", kind)
        assert all(close4(h[s], state[s][key]) for s in (1, 50, 137, 200))
    acc = hist(ex, "dpo_accuracy")
    assert close4(acc[100], state[100]["rewards/accuracies"])


def test_eval_records_never_enter_training_history() -> None:
    ex = load(TRL / "sft" / "combined_unbuffered.log")
    run = ex.runs["r"]
    evals = [e for e in trainer_state("sft") if "eval_loss" in e]
    assert run.records["eval"] == len(evals) == 6
    loss = hist(ex, "loss")
    assert all(close4(loss[e["step"]], next(t["loss"] for t in trainer_state("sft")
                                            if t["step"] == e["step"] and "loss" in t)) for e in evals)
    assert close4(run.passthrough["eval_loss"], evals[-1]["eval_loss"])
    assert run.finished and run.passthrough["train_runtime"] > 0


def test_trainer_state_json_full_precision() -> None:
    ex = load(TRL / "grpo" / "trainer_state.json")
    state = {e["step"]: e for e in trainer_state("grpo") if "loss" in e}
    kl = hist(ex, "kl")
    assert kl[285] == state[285]["kl"] and ex.runs["r"].step == 300 and ex.runs["r"].finished


# --- a new training in the same log, its bar of another total, before the last one ended ------------------------

CRASH = ('Traceback (most recent call last):\n  File "train.py", line 44, in <module>\n    trainer.train()\n'
         "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
BANNER = ("***** Running training *****\n  Num examples = 1,100\n  Num Epochs = 5\n"
          "  Instantaneous batch size per device = 4\n  Total optimization steps = 600\n")
EVALUATION = "".join(f"\r{100 * n // 7:3d}%|          | {n}/7 [00:00<00:00, 30.1it/s]" for n in range(8))
_PRINTED = re.compile(r"\{'[^{}\n]*\}")  # a record as ProgressCallback prints it (no nested braces)


def captured(run: str, capture: str) -> str:
    return (TRL / run / capture).read_bytes().decode()  # read_text would turn the bars' \r into \n


def crashed_at(run: str, capture: str, step: int) -> str:
    """The capture cut where its bar shows `step`, then an OOM traceback; the records at or before `step` that
    stdout still held (block-buffered) come after it, flushed as the interpreter exits."""
    text = captured(run, capture)
    at = text.index(f"| {step}/300")
    cut = min(i for i in (text.find("\r", at), text.find("\n", at)) if i >= 0)
    done = sum(1 for e in trainer_state(run) if e["step"] <= step and "train_runtime" not in e)
    late = _PRINTED.findall(text[cut:])[: max(0, done - len(_PRINTED.findall(text[:cut])))]
    return text[:cut] + "\n" + CRASH + "".join(r + "\n" for r in late)


def restarted(run: str, capture: str, after: int = 0) -> str:
    """The capture again, as a new training of 600 steps (batch size halved) would print it; from the step after
    `after` (unbuffered: a resume from checkpoint-`after`, whose bar starts at 0 and jumps there)."""
    text = captured(run, capture)
    if after:
        start = text.index(f"| {after + 1}/300")
        text = "\r  0%|          | 0/300 [00:00<?, ?it/s]" + text[text.rindex("\r", 0, start):]
    return re.sub(r"(\| *\d+)/300\b", r"\1/600", text)


def new_training(tmp_path, text: str) -> tuple[Exporter, dict[int, float]]:
    path = tmp_path / "train.log"
    path.write_text(text, encoding="utf-8")
    ex = load(path)
    return ex, hist(ex, "loss")


@pytest.mark.parametrize("run", ["sft", "grpo"])
@pytest.mark.parametrize("capture", ["combined.log", "combined_unbuffered.log"])
def test_a_restarted_training_with_another_total_takes_its_bars_steps(tmp_path, run: str, capture: str) -> None:
    """A run of 300 steps dies at 150; the same log then has a new `***** Running training *****` with `Total
    optimization steps = 600` and its bar from 0/600. Its records take the new bar's steps (a reset: the steps go
    back), not the steps after the dead run's (151, 152, ...)."""
    ex, loss = new_training(tmp_path, crashed_at(run, capture, 150) + BANNER + restarted(run, capture))
    state = {e["step"]: e["loss"] for e in trainer_state(run) if "loss" in e}
    assert sorted(loss) == sorted(state) and all(close4(loss[s], state[s]) for s in state)
    assert ex.runs["r"].resets == 1 and ex.runs["r"].step == 300
    assert ex.stats["r"].step_sources["bar"] > 0 and ex.stats["r"].step_sources["ordinal"] == 0
    assert not ex.stats["r"].step_disagreements


@pytest.mark.parametrize("run", ["sft", "grpo"])
def test_a_resumed_training_with_another_total_takes_its_bars_steps(tmp_path, run: str) -> None:
    """Resumed from checkpoint-100 with another total: the new bar from 0/600 jumps to 101; the records take 101 on
    (a reset back from 150), the history is the trainer's."""
    capture = "combined_unbuffered.log"
    ex, loss = new_training(tmp_path, crashed_at(run, capture, 150) + BANNER + restarted(run, capture, after=100))
    state = {e["step"]: e["loss"] for e in trainer_state(run) if "loss" in e}
    assert sorted(loss) == sorted(state) and all(close4(loss[s], state[s]) for s in state)
    assert ex.runs["r"].resets == 1 and not ex.stats["r"].step_disagreements
    assert ex.stats["r"].step_sources["ordinal"] == 0


@pytest.mark.parametrize("run", ["sft", "grpo"])
def test_a_restarted_training_without_its_banner_is_told_by_a_records_redraw(tmp_path, run: str) -> None:
    """No `Total optimization steps` line (the Trainer logs it at INFO): unbuffered, the first record's redraw is
    the new bar's, which began at 0 before it: that is the training bar. A baseline evaluation's bar before it (no
    description, not nested: no training bar is open) stays another bar."""
    capture = "combined_unbuffered.log"
    ex, loss = new_training(tmp_path, crashed_at(run, capture, 150) + EVALUATION + "\n" + restarted(run, capture))
    state = {e["step"]: e["loss"] for e in trainer_state(run) if "loss" in e}
    assert sorted(loss) == sorted(state) and all(close4(loss[s], state[s]) for s in state)
    assert ex.runs["r"].resets == 1 and not ex.stats["r"].step_disagreements
    assert ex.stats["r"].step_sources["ordinal"] == 0


def test_a_restarted_training_that_nothing_tells_apart_is_counted_and_said(tmp_path, caplog) -> None:
    """Block-buffered and without the banner, the new bar looks like an evaluation's: its records take fallback
    steps, and that is counted once (refused_bar) and logged once, never silent."""
    ex, _ = new_training(tmp_path, crashed_at("sft", "combined.log", 150) + restarted("sft", "combined.log"))
    assert ex.stats["r"].step_disagreements["refused_bar"] == 1
    assert sum("refused_bar" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("where", ["| 75/300", "| 76/300"])  # before the record's redraw, or after it
def test_an_evaluation_bar_while_the_training_bar_runs_is_still_left_out(tmp_path, where: str) -> None:
    """An evaluation's bar from 0 of another total, not nested, while the training bar runs (its banner read): left
    out as before, the records after it keep the training bar's redraws; nothing is counted."""
    text = captured("sft", "combined_unbuffered.log")
    cut = text.rindex("\r", 0, text.index(where))
    ex, loss = new_training(tmp_path, BANNER.replace("600", "300") + text[:cut] + EVALUATION + text[cut:])
    state = {e["step"]: e["loss"] for e in trainer_state("sft") if "loss" in e}
    assert sorted(loss) == sorted(state) and all(close4(loss[s], state[s]) for s in state)
    assert ex.runs["r"].resets == 0 and not ex.stats["r"].step_disagreements
    assert ex.stats["r"].step_sources["ordinal"] == 0  # (sft logs every step: ordinals would look right)
