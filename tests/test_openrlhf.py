"""OpenRLHF as it prints (tests/fixtures/openrlhf, made by its make.py with real tqdm and Ray-like prefixes): every
trainer and version read at every step, with its step and its values, on the canonical instruments; metrics in a
plain tqdm loop's postfix; nothing a framer leaves out uncounted."""

from __future__ import annotations

import importlib.util
import io
import logging
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import FIXTURES, run_cli

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.console.framing import ConsoleFramer
from exporter.console.postfix import FORMAT, postfix_pairs
from exporter.parsers.record import RecordKind

OPENRLHF = FIXTURES / "openrlhf"
_spec = importlib.util.spec_from_file_location("openrlhf_make", OPENRLHF / "make.py")
make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make)  # type: ignore[union-attr]

# (log, the key of the loss, the key of KL or None); the canonical instruments they land on: loss, kl
RUNS = [
    ("ppo_v0_8_0", "policy_loss", "kl"),
    ("grpo_v0_8_0", "policy_loss", "kl"),
    ("ppo_v0_11_0", "policy_loss", "kl"),
    ("grpo_v0_11_0", "policy_loss", "kl"),
    ("sft_v0_8_0", "gpt_loss", None),
    ("sft_v0_11_0", "gpt_loss", None),
    ("dpo_v0_8_0", "loss", None),
    ("dpo_v0_11_0", "loss", None),
    ("custom_tqdm_loop", "loss", "kl"),
]


def read(path: Path, accumulation: int = 1) -> Exporter:
    ex = Exporter(Config(), [LogSpec(str(path), "r", "auto", accumulation)])
    ex.read_to_end()
    ex.runs["r"].refresh()
    return ex


def history(ex: Exporter, instrument: str, label: str | None = None) -> dict[int, float]:
    return dict(ex.runs["r"].series[instrument, label].history)


def close(a: float, b: float) -> bool:
    """A value as a postfix prints it (3 significant digits) or exactly (a step line)."""
    return math.isclose(a, b, rel_tol=5e-3, abs_tol=1e-12)


def test_the_fixtures_are_what_make_py_makes() -> None:
    for name in make.LOGS:
        text, _ = make.build(name)
        assert (OPENRLHF / f"{name}.log").read_bytes().decode() == text, name


@pytest.mark.parametrize(("name", "loss_key", "kl_key"), RUNS)
def test_every_step_is_read_with_its_step_loss_and_kl(name: str, loss_key: str, kl_key: str | None) -> None:
    _, truth = make.build(name)
    ex = read(OPENRLHF / f"{name}.log")
    run = ex.runs["r"]
    assert run.records[RecordKind.TRAIN] == len(truth) == 200  # each step once
    loss = history(ex, "loss")
    assert sorted(loss) == sorted(truth) == list(range(1, 201))
    assert all(close(loss[s], truth[s][loss_key]) for s in truth)
    if kl_key is not None:
        kl = history(ex, "kl")
        assert sorted(kl) == list(range(1, 201)) and all(close(kl[s], truth[s][kl_key]) for s in truth)
    assert run.step == 200


@pytest.mark.parametrize("name", ["dpo_v0_8_0", "dpo_v0_11_0"])
def test_dpo_keys_reach_the_dpo_instruments(name: str) -> None:
    _, truth = make.build(name)
    ex = read(OPENRLHF / f"{name}.log")
    chosen, rejected = history(ex, "dpo_reward", "chosen"), history(ex, "dpo_reward", "rejected")
    accuracy = history(ex, "dpo_accuracy")
    for s, values in truth.items():
        assert close(chosen[s], values["chosen_reward"]) and close(rejected[s], values["reject_reward"])
        assert close(accuracy[s], values["acc"])


def test_sft_keys_reach_the_fundamentals() -> None:
    _, truth = make.build("sft_v0_11_0")
    ex = read(OPENRLHF / "sft_v0_11_0.log")
    lr, grad = history(ex, "learning_rate"), history(ex, "grad_norm")
    assert all(close(lr[s], v["lr"]) and close(grad[s], v["grad_norm"]) for s, v in truth.items())


def test_the_v0_11_step_line_is_read_in_full_precision_and_the_eval_line_as_an_eval_record() -> None:
    _, truth = make.build("ppo_v0_11_0")
    ex = read(OPENRLHF / "ppo_v0_11_0.log")
    loss = history(ex, "loss")
    assert all(loss[s] == v["policy_loss"] for s, v in truth.items())  # exact: the step line, not a bar's postfix
    run = ex.runs["r"]
    assert run.records[RecordKind.EVAL] == 4  # every 50 steps
    assert run.passthrough["eval_gsm8k_pass4"] > 0 and "eval_gsm8k_pass1" in run.passthrough
    # the workers' `Train epoch [1/1]` bars carry a postfix per micro-batch: counted, never a step
    assert ex.stats["r"].lines[FORMAT, "not_training"] > 0 and ex.stats["r"].lines[FORMAT, "record"] == 0


def test_with_gradient_accumulation_the_step_is_the_optimizers() -> None:
    _, truth = make.build("sft_v0_11_0_accum2")
    per_micro_batch = read(OPENRLHF / "sft_v0_11_0_accum2.log")
    assert sorted(history(per_micro_batch, "loss")) == list(range(1, 401))  # the bar counts micro-batches
    ex = read(OPENRLHF / "sft_v0_11_0_accum2.log", accumulation=2)
    loss = history(ex, "loss")
    assert sorted(loss) == list(range(1, 201))
    assert all(close(loss[s], v["gpt_loss"]) for s, v in truth.items())  # the micro-batch that completes the step
    assert ex.stats["r"].lines[FORMAT, "accumulating"] == 200


def test_gradient_accumulation_is_checked_at_start(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logs:\n  - path: x.log\n    gradient_accumulation: 0\n")
    out = run_cli("dump", "--no-gpu", "--config", str(cfg), "x.log")
    assert out.returncode == 2 and b"logs[0].gradient_accumulation" in out.stderr


def critical_report(name: str) -> tuple[int, str]:
    out = run_cli("report", "--fail-on", "critical", str(OPENRLHF / f"{name}.log"), timeout=120)
    return out.returncode, out.stdout.decode()


def test_a_kl_blow_up_in_the_old_shape_pages_like_in_the_new() -> None:
    old_rc, old = critical_report("ppo_v0_8_0_kl_blowup")
    new_rc, new = critical_report("grpo_v0_11_0_kl_blowup")
    assert old_rc == new_rc == 1
    first = [next(line for line in text.splitlines() if "CRITICAL PostTrainKLCritical" in line) for text in (old, new)]
    assert first[0].split("steps")[1] == first[1].split("steps")[1]  # the same steps: KL is read at every one
    healthy_rc, healthy = critical_report("ppo_v0_8_0")
    assert healthy_rc == 0 and "CRITICAL" not in healthy


# --- the postfix and its step, in a plain tqdm loop -----------------------------------------------------------------


def tqdm_text(body: Callable[[io.StringIO], None]) -> str:
    """What `body(file)` prints through real tqdm bars (make.py's clock: every update() draws)."""
    make.CLOCK.now = make.Clock().now
    out = io.StringIO()
    body(out)
    return out.getvalue()


def read_text(tmp_path: Path, text: str) -> Exporter:
    path = tmp_path / "train.log"
    path.write_text(text, encoding="utf-8", newline="")
    return read(path)


def test_postfix_numbers_in_tqdm_formatting_are_read() -> None:
    pairs = postfix_pairs("02:01<1:05:12, 20.2s/it, actor_lr=1e-7, kl=0.00481, loss=2.39, big=-3.1e+3, "
                          "text=a, b, eval gpt_loss=0.5")
    assert pairs == [("actor_lr", "1e-7"), ("kl", "0.00481"), ("loss", "2.39"), ("big", "-3.1e+3"),
                     ("text", "a, b"), ("eval gpt_loss", "0.5")]


def test_a_precise_line_of_the_same_step_wins_and_the_step_counts_once(tmp_path: Path) -> None:
    precise: dict[int, float] = {}

    def body(out: io.StringIO) -> None:
        bar = make.tqdm(range(50), desc="Episode [1/1]", file=out)
        for i in range(50):
            make.CLOCK.advance(5)
            loss = 0.1234567 + i / 1000
            bar.set_postfix({"policy_loss": loss, "kl": 0.01})
            out.write(f"\u2728 Global step {i + 1}: {{'policy_loss': {loss!r}, 'kl': 0.01}}\n")
            precise[i + 1] = loss
            bar.update()
        bar.close()

    ex = read_text(tmp_path, tqdm_text(body))
    assert ex.runs["r"].records[RecordKind.TRAIN] == 50
    assert history(ex, "loss") == precise  # full precision
    assert ex.stats["r"].lines[FORMAT, "superseded"] == 50


def test_completion_panels_between_postfix_draws_supersede_no_postfix_record(tmp_path: Path) -> None:
    """A custom loop that reports in its bar's postfix and prints TRL's completions panel each step: a panel's
    diversity record is no trainer record, so it must not make the next postfix record look superseded (it did when
    the postfix reader counted every record of the run)."""
    corpus = FIXTURES / "corpus" / "grpo_samples_healthy" / "combined.log"
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    top = next(i for i, ln in enumerate(lines) if "Step 1 " in ln and "\u256d" in ln)
    bottom = next(i for i in range(top, len(lines)) if lines[i].startswith("\u2570"))
    panel = "\u256d" + lines[top].split("\u256d", 1)[1] + "".join(lines[top + 1:bottom + 1])

    def body(out: io.StringIO) -> None:
        bar = make.tqdm(range(9), desc="train", file=out)
        for i in range(9):
            make.CLOCK.advance(5)
            bar.set_postfix({"loss": 0.5 - i / 100, "kl": 0.01 + i / 1000})
            bar.update()
            out.write(panel.replace("Step 1 ", f"Step {i + 1} "))
        bar.close()

    ex = read_text(tmp_path, tqdm_text(body))
    run = ex.runs["r"]
    assert run.sample_records == 9, run.sample_records  # every panel was read as a set
    assert ex.stats["r"].lines[FORMAT, "superseded"] == 0
    assert ex.stats["r"].lines[FORMAT, "record"] == 9
    assert sorted(history(ex, "loss")) == list(range(1, 10))


def test_a_nested_bar_without_a_postfix_is_counted_not_silently_dropped(tmp_path: Path) -> None:
    def body(out: io.StringIO) -> None:
        outer = make.tqdm(range(1), desc="Train epoch", file=out)
        inner = make.tqdm(range(30), desc="Preparing", file=out)
        for _ in range(30):
            make.CLOCK.advance(1)
            inner.update()
        inner.close()
        outer.close()

    ex = read_text(tmp_path, tqdm_text(body))
    assert ex.stats["r"].lines["tqdm", "nested"] >= 30


def test_bars_without_any_record_are_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def body(out: io.StringIO) -> None:
        bar = make.tqdm(range(20), desc="Train step of epoch 0", file=out)
        for _ in range(20):
            make.CLOCK.advance(1)
            bar.set_postfix(status="warming up")  # no number: nothing to read
            bar.update()

    with caplog.at_level(logging.WARNING):
        ex = read_text(tmp_path, tqdm_text(body))
    assert sum(ex.runs["r"].records.values()) == 0 and ex.stats["r"].bars_seen > 20
    assert ex.stats["r"].lines[FORMAT, "no_numbers"] == 20
    assert any("progress-bar draws but no metric record" in r.getMessage() for r in caplog.records)


def test_a_second_bar_of_another_description_is_not_the_training_bar(tmp_path: Path) -> None:
    def body(out: io.StringIO) -> None:
        for desc in ("train", "other"):
            bar = make.tqdm(range(10), desc=desc, file=out)
            for i in range(10):
                make.CLOCK.advance(1)
                bar.set_postfix(loss=float(i + (desc == "other") * 100))
                bar.update()
            bar.close()

    ex = read_text(tmp_path, tqdm_text(body))
    loss = history(ex, "loss")
    assert sorted(loss) == list(range(1, 11)) and max(loss.values()) < 100
    assert ex.stats["r"].lines[FORMAT, "not_training"] == 21  # the other bar's draws: set_postfix, update, close


def test_equal_values_on_consecutive_steps_are_two_records(tmp_path: Path) -> None:
    def body(out: io.StringIO) -> None:
        bar = make.tqdm(range(10), desc="train", file=out)
        for i in range(10):
            make.CLOCK.advance(1)
            bar.set_postfix(loss=0.5 if i in (3, 4) else 1.0 + i)
            bar.update()
        bar.close()

    ex = read_text(tmp_path, tqdm_text(body))
    loss = history(ex, "loss")
    assert sorted(loss) == list(range(1, 11)) and loss[4] == loss[5] == 0.5


class _Sink:
    def __init__(self) -> None:
        self.postfixes: list[tuple] = []
        self.nested = 0

    def bar(self, *_: object) -> None: ...
    def clear(self) -> None: ...
    def line(self, _: str) -> None: ...
    def abandoned(self, _: str) -> None: ...
    def overlong(self) -> None: ...

    def postfix(self, *args: object) -> None:
        self.postfixes.append(args)

    def nested_bar(self) -> None:
        self.nested += 1


def test_the_framer_hands_nested_postfix_draws_to_the_sink() -> None:
    sink = _Sink()
    framer = ConsoleFramer(sink)
    framer.feed("\rTrain epoch:   0%|          | 0/2 [00:00<?, ?it/s]\n\rTrain step of epoch 0:   1%|1         "
                "| 1/100 [00:01<02:18,  1.40s/it, gpt_loss=2.2, lr=1e-6]\x1b[A\n"
                "\rEval stage of steps 5:   0%|          | 0/10 [00:00<?, ?it/s]\x1b[A\x1b[A\n")
    framer.flush()
    assert sink.postfixes == [("Train step of epoch 0:   1%", 1, "100", "00:01<02:18,  1.40s/it, gpt_loss=2.2, lr=1e-6",
                               True)]
    assert sink.nested == 1


# --- lines that are one bar draw each, framed at once (framing._single_draw, ConsoleStream.bar_run) ------------------

_DRAW_MUTATIONS = [
    lambda line: line,
    lambda line: line + "   ",  # tqdm's padding after a shorter draw
    lambda line: line + " x",  # text after the draw
    lambda line: line.replace("\r", "\r\r", 1),  # a second \r
    lambda line: line.replace("]", "]\x1b[A", 1),  # a nested draw
    lambda line: line.replace("Train", "{Train", 1),  # a description no bar has
    lambda line: line.split(": ", 1)[-1] if ": " in line else line,  # only the percentage: the training-bar shape
    lambda line: line.replace(", ", ",", 1),
    lambda line: line.replace("=", "", 1),
    lambda line: "",
    lambda line: "\x1b[A",
    lambda line: line[:-1],  # the bracket left open
]


@pytest.mark.parametrize("seed", range(4))
def test_lines_of_one_draw_each_read_the_same_with_the_fast_paths_off(seed: int, tmp_path: Path) -> None:
    import random

    from test_fastpath import assert_same

    rng = random.Random(seed)
    text = (OPENRLHF / ("ppo_v0_8_0.log" if seed % 2 else "sft_v0_11_0.log")).read_bytes().decode()
    lines = text.split("\n")
    for i in rng.sample(range(len(lines)), len(lines) // 8):
        lines[i] = rng.choice(_DRAW_MUTATIONS)(lines[i])
    path = tmp_path / "mutated.log"
    path.write_text("\n".join(lines), encoding="utf-8", newline="")
    assert_same(path)


def test_episodes_and_epochs_continue_the_step() -> None:
    from exporter.console.postfix import PostfixReader

    reader = PostfixReader()
    steps = []
    for desc, n in [("Episode [1/2]:  99%", 98), ("Episode [1/2]: 100%", 99), ("Episode [2/2]:   0%", 0),
                    ("Episode [2/2]:   1%", 1)]:
        reader.draw(desc, n, "100", f"00:01<00:02,  1.0s/it, kl={n}, loss=0.{n}", 0)
        steps += [r.step for r in reader.release(len(steps))]
    assert steps == [99, 100, 101, 102]  # episode 2 goes on from the 100 steps of episode 1
    reader = PostfixReader()
    reader.draw("Train step of epoch 3", 4, "50", "00:01<00:02,  1.0s/it, gpt_loss=1.5", 0)
    assert [r.step for r in reader.release(0)] == [3 * 50 + 5]  # epochs are 0-based


def test_hostile_postfixes_cost_a_count_not_the_sidecar(tmp_path: Path) -> None:
    pairs = ", ".join(f"k{i}={i}.5" for i in range(2000))
    lines = [f"\rtrain:   1%|1         | {n}/100 [00:01<02:18,  1.40s/it, {pairs}, n={n}]\n" for n in range(3)]
    lines += [f"\rEpisode [{10**8 + n}/9]:   1%|1      | {n}/999999999999999 [00:01<02:18,  1.40s/it, kl=1]\n"
              for n in range(5000)]  # another bar, its description new at every draw
    lines.append("\rtrain:   1%|1         | 3/100 [00:01<02:18,  1.40s/it, loss=nan, kl=1e+999, x=tensor(1.0, d=2)]\n")
    ex = read_text(tmp_path, "".join(lines))
    run, counts = ex.runs["r"], ex.stats["r"].lines
    assert run.records[RecordKind.TRAIN] == 4 and run.keys_dropped["max_keys"] > 0  # the run's own limits hold
    assert counts[FORMAT, "not_training"] == 5000
    assert run.values_skipped["non_numeric"] >= 1 and run.values_skipped["out_of_range"] >= 1


def test_a_held_postfix_record_is_let_go_when_the_stream_goes_quiet() -> None:
    from exporter.instruments.keymap import KeyMap
    from exporter.parsers.chain import LineParserChain
    from exporter.pipeline import ConsoleStream, IngestStats
    from exporter.runstate import RunState

    run = RunState("r", KeyMap())
    stream = ConsoleStream(run, IngestStats(), LineParserChain())
    stream.feed("\rEpisode [1/1]:   0%|          | 0/200 [00:00<?, ?it/s]\n")
    stream.feed("\rEpisode [1/1]:   0%|          | 0/200 [00:36<?, ?it/s, policy_loss=0.0123, kl=0.0456]\n")
    assert run.records[RecordKind.TRAIN] == 0  # held for the update() draw that follows set_postfix()'s
    stream.settle(3600.0)
    assert run.records[RecordKind.TRAIN] == 0  # not quiet yet
    stream.settle(0.0)  # quiet: no update() draw is coming
    assert run.records[RecordKind.TRAIN] == 1 and run.step == 1
