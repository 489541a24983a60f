"""Records reach a run's series a batch at a time. Where the batches are cut (the batch size, a
scrape in between) must change nothing: the state carried from one batch to the next (stream
tails, the reward peak, the loss's sign and level) has to make every batching give what one record
at a time gives."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import ingested, trainer_state_values

import exporter.detectors.engine as engine_module
import exporter.runstate as run_module
from exporter.instruments.columns import Column
from exporter.instruments.keymap import KeyMap
from exporter.instruments.series import Series
from exporter.parsers.chain import LineParserChain
from exporter.parsers.record import Record
from exporter.runstate import RunLimits, RunState


def synthetic_records() -> list[tuple[dict[str, float], int]]:
    """NaN and inf, a step logged twice, evaluation records between training ones, a shape that
    changes, and a resume from a checkpoint (the step goes back)."""
    rng = np.random.default_rng(11)
    out: list[tuple[dict[str, float], int]] = []
    for step in range(1, 400):
        v = {"loss": float(rng.normal(0.2 if step < 200 else 0.5, 0.02)), "kl": float(abs(rng.normal(0.3, 0.4))),
             "reward": float(np.sin(step / 30) + rng.normal(0, 0.1)), "reward_std": float(abs(rng.normal(0.06, 0.03))),
             "clip_ratio/low_mean": float(abs(rng.normal(0.02, 0.03))),
             "clip_ratio/high_mean": float(abs(rng.normal(0.02, 0.03))),
             "rewards/f/std": float(abs(rng.normal(0.01, 0.01))),
             "timing_s/gen": float(rng.uniform(1, 5)), "timing_s/step": 10.0}
        if step % 2:
            v["completions/mean_length"] = float(100 + step / 2 + rng.normal(0, 5))
            v["completions/mean_terminated_length"] = v["completions/mean_length"] - 3
        if step % 37 == 0:
            v["kl"] = math.nan
        if step % 53 == 0:
            v["reward"] = math.inf
        out.append((v, step))
        if step % 41 == 0:
            out.append(({"loss": 0.3, "kl": 0.2}, step))  # the same step logged again
        if step % 50 == 0:
            out.append(({"eval_loss": float(step), "epoch": step / 100}, step))
        if step == 300:
            out.extend(({"loss": 0.25, "kl": 0.1, "reward": 0.0}, s) for s in range(250, 260))  # resumed
    return out


def late_reward_records() -> list[tuple[dict[str, float], int]]:
    """The synthetic run without its reward for its first 150 steps, its entropy falling from 2 to 0.2 by step 100:
    what waits to be judged when the first reward arrives was logged by a run that did not sample, so the
    entropy collapse (RL runs only) must not judge it."""
    out = []
    for values, step in synthetic_records():
        values = {k: v for k, v in values.items() if k != "reward" or step > 150}
        if "loss" in values and "reward_std" in values:
            values["entropy"] = max(0.2, 2.0 - step / 50)
        out.append((values, step))
    return out


def run_in_batches(records, batch: int, scrape_every: int | None, monkeypatch, judge_rows: int = 4096) -> RunState:
    monkeypatch.setattr(run_module, "BATCH_RECORDS", batch)
    monkeypatch.setattr(engine_module, "JUDGE_ROWS", judge_rows)
    run = RunState("r", KeyMap())
    for i, (values, step) in enumerate(records):
        run.ingest(Record(dict(values), "jsonl", step=step))
        if scrape_every and i % scrape_every == scrape_every - 1:
            run.refresh()
    run.refresh()
    return run


def state_of(run: RunState) -> dict:
    return {
        "series": {k: (s.history, s.last_step, s.last_value) for k, s in run.series.items()},
        "gauges": dict(run.derived.gauges),
        "breaches": dict(run.derived.breaches),
        "flips": run.derived.loss_sign_flips,
        "shifts": run.derived.loss_discontinuities,
        "passthrough": dict(run.passthrough),
        "nonfinite": dict(run.nonfinite),
        "records": dict(run.records),
        "resets": run.resets,
        "step": run.step,
        "detectors": {(r.detector.name, r.sub): (r.state.active, r.state.held, r.state.onsets, r.state.spikes,
                                                 r.state.since_step, r.value, r.limit, r.step,
                                                 [(e.since, e.start, e.end) for e in r.state.episodes])
                      for r in run.detectors.readings()},
        "baselines": dict(run.detectors.baselines()),
    }


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):  # rolling sums restart at batch cuts: equal to rounding
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


@pytest.mark.parametrize("source", ["grpo", "grpo_saturated", "dpo", "sft", "synthetic", "late_reward"])
def test_where_batches_are_cut_changes_nothing(source: str, monkeypatch) -> None:
    """Record batches of any size, scrapes in between, and the detectors judging each batch as it comes
    (judge_rows 1) or waiting for several (judge_rows above the batch) leave the state of one record at a time."""
    synthetic = {"synthetic": synthetic_records, "late_reward": late_reward_records}
    records = synthetic[source]() if source in synthetic else trainer_state_values(source)
    one_at_a_time = state_of(run_in_batches(records, 1, None, monkeypatch, judge_rows=1))
    assert one_at_a_time["series"] and one_at_a_time["gauges"]
    for batch, scrape_every, judge_rows in [(1024, None, 4096), (7, None, 4096), (7, None, 50), (64, 13, 4096),
                                            (1024, 1, 4096), (64, None, 1)]:
        batched = state_of(run_in_batches(records, batch, scrape_every, monkeypatch, judge_rows))
        for part, value in one_at_a_time.items():
            assert same(value, batched[part]), (f"batch {batch}, scrape every {scrape_every}, judge rows "
                                                f"{judge_rows}: {part} differs")


def test_synthetic_run_exercises_what_it_claims(monkeypatch) -> None:
    run = run_in_batches(synthetic_records(), 64, None, monkeypatch)
    assert run.resets == 1 and run.records["eval"] == 7
    assert run.nonfinite[("kl", None)] > 0 and run.nonfinite[("reward", None)] > 0
    assert run.derived.breaches[(("instrument", "kl"), ("level", "critical"))] > 0
    assert run.derived.loss_discontinuities >= 1  # the loss level goes from 0.2 to 0.5 at step 200


def column(steps, values) -> Column:
    v = np.array(values, dtype=float)
    s = np.array(steps, dtype=np.int64)
    return Column(np.arange(len(s)), s, v, np.isfinite(v))


def test_series_keeps_the_last_finite_points_within_its_limit() -> None:
    s = Series(5)
    expected: list[tuple[int, float]] = []
    rng = random.Random(3)
    step = 0
    for _ in range(200):  # many batches of random sizes: the buffer wraps many times
        n = rng.randint(1, 9)
        steps = list(range(step + 1, step + n + 1))
        values = [rng.choice([float(i), math.nan]) for i in steps]
        step += n
        s.extend(column(steps, values))
        expected.extend((st, v) for st, v in zip(steps, values, strict=True) if not math.isnan(v))
        assert s.history == expected[-5:]
        assert s.last_step == steps[-1] and (s.last_value == values[-1] or math.isnan(values[-1]))


def test_series_same_step_again_replaces_and_cut_back_forgets() -> None:
    s = Series(100)
    s.extend(column([1, 2, 3, 3], [1.0, 2.0, 3.0, 30.0]))
    s.extend(column([3, 4], [300.0, 4.0]))
    assert s.history == [(1, 1.0), (2, 2.0), (3, 300.0), (4, 4.0)]
    s.cut_back(3)
    assert s.history == [(1, 1.0), (2, 2.0)] and (s.last_step, s.last_value) == (2, 2.0)
    s.cut_back(0)
    assert s.history == [] and s.last_step == -1 and math.isnan(s.last_value)


# Edge cases where applying a whole batch at once could read the wrong points (found in review).

def length_run(lengths, steps=None, terminated=None, history_limit=2048, batch=1024, monkeypatch=None) -> RunState:
    if monkeypatch is not None:
        monkeypatch.setattr(run_module, "BATCH_RECORDS", batch)
    records = []
    for i, v in enumerate(lengths):
        values = {"completions/mean_length": float(v)}
        if terminated is not None:
            values["completions/mean_terminated_length"] = float(terminated)
        records.append((values, steps[i] if steps else i + 1))
    return ingested(records, "l", limits=RunLimits(history_limit=history_limit))


def baseline(run: RunState, key=("completion_length", "mean")) -> float | None:
    return dict(run.detectors.baselines()).get(key)


def test_truncation_gap_does_not_wait_for_the_length_baseline() -> None:
    run = length_run([100 + s for s in range(1, 6)], terminated=90)  # 5 records, baseline needs 10
    assert run.derived.gauges[("posttrain_completion_length_truncation_gap_tokens", ())] == 105 - 90
    assert baseline(run) is None


@pytest.mark.parametrize("batch", [1, 8, 1024])
def test_length_baseline_is_the_first_lengths_logged_even_past_the_history_limit(batch, monkeypatch) -> None:
    lengths = np.array([100 + 10 * s for s in range(1, 101)], dtype=float)
    run = length_run(lengths, history_limit=20, batch=batch, monkeypatch=monkeypatch)
    assert baseline(run) == float(np.median(lengths[:10])) == 155.0
    ratio = run.derived.gauges[("posttrain_completion_length_baseline_ratio", ())]
    assert ratio == lengths[-20:].mean() / 155.0  # the window is the history kept


def test_length_baseline_is_not_moved_by_a_step_logged_again_after_it() -> None:
    steps = [*range(1, 11), 10, 11, 12]
    run = length_run([100] * 10 + [5000] * 3, steps=steps)
    assert baseline(run) == 100.0


def test_length_baseline_takes_the_later_value_of_a_step_logged_twice_before_it() -> None:
    """As the history does: the first 10 steps, step 5 with its later value."""
    steps = [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11]
    run = length_run([100, 100, 100, 100, 100, 200, 100, 100, 100, 100, 100, 100], steps=steps)
    assert baseline(run) == float(np.median([100] * 4 + [200] + [100] * 5))


def test_a_key_printed_twice_keeps_its_last_value_as_a_dict_does() -> None:
    run = RunState("d", KeyMap())
    rec = LineParserChain().parse("{'kl': '0.1', 'kl': '5.0'}")
    rec.step = 1
    run.ingest(rec)
    run.refresh()
    assert run.series["kl", None].last_value == 5.0 == run.passthrough["kl"]
    assert run.derived.breaches[(("instrument", "kl"), ("level", "critical"))] == 1


@pytest.mark.parametrize("batch", [7, 64, 1024])
def test_ingest_many_is_ingest_one_at_a_time(batch: int, monkeypatch) -> None:
    """RunState.ingest_many over runs of records (the console stream's runs of lines), whole runs taken in
    C-level passes (_take_all: one shape, training, steps that never go back) or record by record, leaves the
    same state as ingest() of each record, wherever batches are cut."""
    records = [(v, s) for v, s in synthetic_records() if "eval_loss" not in v or s % 100]
    # long runs of one training shape, steps rising, repeated, then going back (a resume) between runs
    records += [({"loss": 0.1 + s / 1e4, "kl": 0.01}, s) for s in range(400, 700) for _ in range(1 + (s % 5 == 0))]
    records += [({"loss": 0.2, "kl": 0.02}, s) for s in range(500, 520)]
    one_by_one = state_of(run_in_batches(records, batch, None, monkeypatch))
    real, whole = RunState._take_all, []

    def spy(self: RunState, recs: list[Record]) -> bool:
        whole.append(real(self, recs))
        return whole[-1]

    monkeypatch.setattr(RunState, "_take_all", spy)
    rng = random.Random(batch)
    run, i = RunState("r", KeyMap()), 0
    while i < len(records):
        n = rng.choice([1, 2, 5, 17, 64, 300])
        run.ingest_many([Record(dict(v), "jsonl", step=s) for v, s in records[i : i + n]])
        i += n
    run.refresh()
    assert True in whole and False in whole
    for part, value in one_by_one.items():
        assert same(value, state_of(run)[part]), f"batch {batch}: {part} differs"
