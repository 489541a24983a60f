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
