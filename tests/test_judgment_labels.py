"""The judgment labelling rules (tests/support/judgment_labels.py) on hand-made series, each beside its neighbours
(the shape it must not be mistaken for), and the corpus run.json files against what the rules compute."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from support.judgment_labels import JUDGMENT_LABELS, judgment_onsets, recommendation
from support.labels import load_records, onsets

CORPUS = Path(__file__).resolve().parent / "fixtures" / "corpus"
N = 300


def records(reward=None, kl=None, loss=None) -> list[dict]:
    """Trainer records of steps 1..N from per-index functions (None: the key is not logged)."""
    out = []
    for i in range(N):
        e: dict = {"step": i + 1}
        for key, f in (("reward", reward), ("kl", kl), ("loss", loss)):
            if f is not None:
                e[key] = f(i)
        out.append(e)
    return out


def noise(seed: int, scale: float = 0.05):
    rnd = random.Random(seed)
    values = [rnd.gauss(0, scale) for _ in range(N)]
    return lambda i: values[i]


def rise_to(top: float, until: int):
    """0 rising linearly to `top` at index `until`, `top` after it."""
    return lambda i: top * min(i, until) / until


FLAT_LOSS = noise(9, 0.01)  # sign-changing noise of a steady level: no discontinuity


def judged(**series) -> dict[str, int]:
    return judgment_onsets(records(**series))


# --- reward: peak and decline, plateau, no trend ---------------------------------------------------------------

def test_a_reward_that_rises_and_falls_for_good_is_a_peak_decline_not_a_plateau() -> None:
    n = noise(1)
    found = judged(reward=lambda i: (i / 100 if i < 150 else 1.5 - (i - 150) / 100) + n(i))
    assert set(found) == {"reward_peak_decline"}
    assert 160 <= found["reward_peak_decline"] <= 220  # after the peak (150), once a third of the rise is lost


def test_a_reward_that_rises_and_stays_is_a_plateau_dated_where_it_stops_moving() -> None:
    n = noise(2)
    found = judged(reward=lambda i: rise_to(1.0, 120)(i) + n(i))
    assert set(found) == {"reward_plateau"}
    assert 90 <= found["reward_plateau"] <= 140


def test_a_dip_that_recovers_is_no_decline() -> None:
    """A reward that loses its gain for 15 points and gets it back: a decline must hold at 80% of 30 points; the
    plateau is dated after the dip (its rolling mean moved during it)."""
    n = noise(3)
    found = judged(reward=lambda i: rise_to(1.0, 100)(i) - (0.8 if 140 <= i < 155 else 0) + n(i))
    assert "reward_peak_decline" not in found and found["reward_plateau"] > 155


def test_a_reward_still_rising_at_the_end_has_no_reward_label() -> None:
    n = noise(4)
    assert judged(reward=lambda i: i / 300 + n(i)) == {}


def test_a_plateau_too_late_in_the_run_is_not_one() -> None:
    """The reward stops rising with less than 30% of the run left."""
    n = noise(5)
    assert judged(reward=lambda i: rise_to(1.0, 240)(i) + n(i)) == {}


def test_pure_noise_is_no_trend_dated_at_the_first_step() -> None:
    assert judged(reward=noise(6, 0.2)) == {"reward_no_trend": 1}


def test_noise_on_a_slow_rise_is_a_trend() -> None:
    """A rise of 2 sigma across the run, smaller than the noise of one point: the line sees it."""
    n = noise(7, 0.2)
    assert "reward_no_trend" not in judged(reward=lambda i: 0.4 * i / N + n(i))


# --- KL rising while the reward is flat ------------------------------------------------------------------------

def kl_drift(i: int) -> float:
    return 0.02 + 0.3 * min(max(0, i - 100), 150) / 150  # 0.02 until index 100, then up to 0.32 at 250


def test_kl_drifting_up_under_a_flat_reward_is_labelled() -> None:
    n = noise(8)
    found = judged(reward=lambda i: 1.0 + n(i), kl=kl_drift)
    assert "kl_rise_reward_flat" in found
    assert 100 < found["kl_rise_reward_flat"] <= 150


def test_kl_rising_with_the_reward_is_not() -> None:
    n = noise(8)
    assert "kl_rise_reward_flat" not in judged(reward=lambda i: i / 150 + n(i), kl=kl_drift)


def test_kl_tripling_at_a_tiny_level_is_not() -> None:
    """x3 but by 0.02 (below the 0.05 a KL must gain)."""
    n = noise(8)
    assert "kl_rise_reward_flat" not in judged(reward=lambda i: 1.0 + n(i), kl=lambda i: kl_drift(i) / 15)


def test_a_run_without_kl_has_no_kl_label() -> None:
    n = noise(8)
    assert "kl_rise_reward_flat" not in judged(reward=lambda i: 1.0 + n(i))


# --- loss discontinuity ----------------------------------------------------------------------------------------

def test_a_loss_that_changes_its_level_at_one_step_is_a_discontinuity() -> None:
    for factor in (3.0, 1 / 3):
        found = judged(loss=lambda i, f=factor: FLAT_LOSS(i) * (f if i >= 150 else 1.0) + 0.0)
        assert 148 <= found["loss_discontinuity"] <= 153, (factor, found)


def test_a_loss_spike_or_a_smooth_ramp_is_no_discontinuity() -> None:
    spike = judged(loss=lambda i: FLAT_LOSS(i) * (20 if 150 <= i < 152 else 1))
    ramp = judged(loss=lambda i: 0.01 * (1 + 9 * i / N) + FLAT_LOSS(i) / 10)  # x10 over the run, gradually
    assert "loss_discontinuity" not in spike and "loss_discontinuity" not in ramp


def test_a_loss_exactly_zero_on_both_sides_is_no_discontinuity() -> None:
    assert judged(loss=lambda i: 0.0) == {}


# --- the recommendation ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("labels", "expected"), [
    ((), "continue"),
    (("reward_plateau",), "stop"),
    (("reward_no_trend", "kl_rise_reward_flat"), "stop"),
    (("dead_signal",), "stop"),
    (("loss_discontinuity", "reward_plateau"), "investigate"),
    (("loss_discontinuity", "reward_peak_decline"), "stop_now"),
    (("template_collapse", "reward_std_collapse"), "stop_now"),
    (("kl_blowup",), "stop_now"),
])
def test_the_recommendation_takes_the_most_urgent_label(labels: tuple[str, ...], expected: str) -> None:
    assert recommendation(labels) == expected


# --- the corpus ------------------------------------------------------------------------------------------------

RUNS = sorted(p for p in CORPUS.iterdir() if (p / "run.json").exists())


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_run_json_has_the_judgment_the_rules_compute(folder: Path) -> None:
    run = json.loads((folder / "run.json").read_text())
    recs = load_records(folder / "trainer_state.json")
    found = judgment_onsets(recs)
    assert run["judgment_onsets"] == found
    assert run["recommendation"] == recommendation({**onsets(recs), **run.get("sample_onsets", {}), **found})
    if "judgment_intent" in run:  # made for a judgment pattern: it shows what it was made for, and nothing else
        assert set(found) == set(run["judgment_intent"]), found


def test_the_corpus_has_every_judgment_label_and_recommendation() -> None:
    runs = [json.loads((p / "run.json").read_text()) for p in RUNS]
    made_for = {label for r in runs for label in r.get("judgment_intent", ())}
    assert set(JUDGMENT_LABELS) <= made_for
    assert {r["recommendation"] for r in runs if "judgment_intent" in r} == {"stop_now", "investigate", "stop",
                                                                            "continue"}


@pytest.mark.parametrize("folder", [p for p in RUNS if "checkpoints_on_disk" in json.loads((p / "run.json")
                                                                                        .read_text())],
                         ids=lambda p: p.name)
def test_the_checkpoints_left_on_disk_are_the_last_ones_the_log_says_were_saved(folder: Path) -> None:
    run = json.loads((folder / "run.json").read_text())
    saved = re.findall(r"Saving model checkpoint to \S*/(checkpoint-\d+)", (folder / "combined.log").read_text())
    limit = run["config"]["save_total_limit"]
    assert len(saved) > limit and run["checkpoints_on_disk"] == saved[-limit:]
