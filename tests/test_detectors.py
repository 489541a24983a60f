"""The detectors' parts: persistence counted in logged steps, the carried streams and baselines, and each
detector on curves that show its case and on the noise it must ignore."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from conftest import ingested

from exporter.detectors.persistence import Persistence
from exporter.detectors.streams import Baseline, Stream
from exporter.instruments.settings import DerivedSettings, DetectorSettings
from exporter.instruments.window import window_stats

# --- persistence ----------------------------------------------------------------------------------------------


def judge(cond: list[bool], required: int = 3, clear: int = 2, cuts: tuple[int, ...] = (), raw=None):
    p = Persistence(required, clear)
    steps = np.arange(1, len(cond) + 1)
    c = np.array(cond)
    r = None if raw is None else np.array(raw)
    bounds = [0, *cuts, len(cond)]
    active = []
    for a, b in itertools.pairwise(bounds):
        active += p.update(steps[a:b], c[a:b], None if r is None else r[a:b]).tolist()
    return p, active


def test_a_condition_must_hold_for_the_required_steps_and_fail_for_the_clear_steps() -> None:
    cond = [0, 1, 1, 0, 1, 1, 1, 1, 0, 1, 0, 0, 0, 1]
    p, active = judge([bool(x) for x in cond])
    #                  a state needs 3 points; one failed point in it does not end it, two do
    assert active == [bool(x) for x in [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]]
    assert p.onsets == 1 and [(e.since, e.start, e.end) for e in p.episodes] == [(5, 7, 12)]
    assert p.held == 1 and not p.active


@pytest.mark.parametrize("cuts", [(), (1,), (5, 6, 7), tuple(range(1, 14))])
def test_where_the_batches_are_cut_changes_nothing(cuts) -> None:
    rng = np.random.default_rng(5)
    cond = (rng.random(14) < 0.6).tolist()
    whole, active = judge(cond)
    cut, active_cut = judge(cond, cuts=cuts)
    assert active == active_cut
    assert (whole.held, whole.failed, whole.onsets, whole.since_step) == (cut.held, cut.failed, cut.onsets,
                                                                          cut.since_step)


def test_spikes_are_raw_excursions_shorter_than_a_state() -> None:
    raw = [0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0]
    cond = [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    p, _ = judge([bool(x) for x in cond], raw=[bool(x) for x in raw])
    assert p.spikes == 2  # the single point and the pair; the run of five became a state
    assert p.onsets == 1


def test_a_resumed_run_replays_without_counting_again() -> None:
    p = Persistence(2, 2)
    p.update(np.arange(1, 6), np.array([0, 1, 1, 1, 0], dtype=bool))
    assert p.onsets == 1
    p.reset()
    p.update(np.arange(1, 4), np.array([0, 1, 1], dtype=bool), count=False)
    assert p.onsets == 1 and p.active and len(p.episodes) == 1


# --- streams and baselines ---------------------------------------------------------------------------------------


def test_the_trend_statistic_is_the_window_statistics_one() -> None:
    rng = np.random.default_rng(2)
    values = np.cumsum(rng.normal(0.1, 1.0, 120))
    steps = np.arange(1, 121) * 2  # a key logged every other step
    s = Stream(60, Baseline(10))
    got = np.concatenate([s.push(steps[a:b], values[a:b]).trend_t(50, 10) for a, b in ((0, 7), (7, 64), (64, 120))])
    for i in (9, 30, 49, 50, 119):
        lo = max(0, i - 49)
        want = window_stats(list(zip(steps[lo:i + 1].tolist(), values[lo:i + 1].tolist(), strict=True))).slope_t
        assert got[i] == pytest.approx(want, rel=1e-9)
    assert (got[:9] == 0).all()  # fewer than 10 points: no trend


def test_rolling_statistics_skip_nonfinite_values_and_wait_for_enough_points() -> None:
    s = Stream(60, Baseline(3))
    v = s.push(np.arange(1, 8), np.array([1.0, math.nan, 2.0, 3.0, math.inf, 4.0, 5.0]))
    assert v.new_steps.tolist() == [1, 3, 4, 6, 7]
    med = v.rolling(3, "median")
    assert np.isnan(med[:2]).all() and med[2:].tolist() == [2.0, 3.0, 4.0]
    assert v.baseline.tolist() == [math.nan, math.nan, 2.0, 2.0, 2.0] or np.isnan(v.baseline[:2]).all()


def test_a_baseline_is_the_median_of_the_first_points_and_survives_a_later_resume() -> None:
    b = Baseline(5)
    out = b.feed(np.arange(1, 8), np.array([10.0, 100.0, 11.0, 12.0, 13.0, 50.0, 60.0]))
    assert np.isnan(out[:4]).all() and (out[4:] == 12.0).all()
    b.cut_back(7)  # a resume after the baseline: it stays
    assert b.value == 12.0
    b.cut_back(3)  # a resume into it: collected again
    assert math.isnan(b.value)
    assert Baseline(5, given=0.9).value == 0.9


# --- detectors on curves --------------------------------------------------------------------------------------------


def episodes(records, name: str, settings: DerivedSettings | None = None) -> list[tuple[int, int, int | None]]:
    run = ingested(records, settings=settings)
    for r in run.detectors.readings():
        if r.detector.name == name:
            return [(e.since, e.start, e.end) for e in r.state.episodes]
    return []


def series(key: str, values, extra: dict | None = None):
    return [({key: float(v), **(extra or {})}, i + 1) for i, v in enumerate(values)]


def test_kl_spikes_in_pairs_do_not_page_a_sustained_blowup_does() -> None:
    """GRPO with num_iterations=2 logs the same KL estimate on two steps: a pair of spikes is still a spike."""
    kl = [0.1] * 40
    kl[20] = kl[21] = 9.0
    assert episodes(series("kl", kl), "kl_critical") == []
    kl[30:] = [1.8] * 10
    assert episodes(series("kl", kl), "kl_critical") == [(33, 35, None)]  # 3 of 5 above, then held 3 steps


def test_reward_std_collapse_is_judged_on_the_share_of_steps_without_signal() -> None:
    rng = np.random.default_rng(0)
    healthy = np.where(rng.random(60) < 0.6, 0.0, rng.uniform(0.25, 0.7, 60))  # zero on 60% of single steps
    assert episodes(series("reward_std", healthy), "reward_std_collapsed") == []
    collapsed = np.concatenate([rng.uniform(0.3, 0.6, 30), np.where(rng.random(40) < 0.95, 0.0, 0.5)])
    (ep,) = episodes(series("reward_std", collapsed), "reward_std_collapsed")
    assert 30 < ep[0] <= 42 and ep[2] is None


def test_entropy_collapse_is_judged_against_the_runs_own_start_and_only_in_rl_runs() -> None:
    low_but_steady = series("entropy", [0.3] * 60, {"reward": 1.0})  # a math model sits well under 1.0: fine
    assert episodes(low_but_steady, "entropy_collapse") == []
    falling = np.concatenate([np.full(20, 0.6), np.linspace(0.6, 0.2, 20), np.full(20, 0.2)])
    (ep,) = episodes(series("entropy", falling, {"reward": 1.0}), "entropy_collapse")
    assert ep[2] is None and 30 <= ep[1] <= 40  # below 0.3 from about step 30
    assert episodes(series("entropy", falling), "entropy_collapse") == []  # SFT/DPO: the model fits its data


def test_length_growth_against_the_baseline() -> None:
    lengths = np.concatenate([np.full(20, 100.0), np.linspace(100, 200, 40)])
    (ep,) = episodes(series("completions/mean_length", lengths), "completion_length_growing")
    assert 20 + 12 <= ep[0] <= 20 + 16  # 1.3x the baseline from about step 32-33
    assert episodes(series("completions/mean_length", lengths), "completion_length_shrinking") == []


def test_dpo_displacement_needs_the_chosen_reward_down_and_the_margin_still_positive() -> None:
    n = 60
    chosen = np.concatenate([np.zeros(20), np.linspace(0, -2, n - 20)])
    displaced = [({"rewards/chosen": float(c), "rewards/margins": 3.0, "rewards/rejected": float(c) - 3}, i + 1)
                 for i, c in enumerate(chosen)]
    (ep,) = episodes(displaced, "dpo_displacement")
    assert ep[2] is None and 28 <= ep[1] <= 35
    forgetting = [({"rewards/chosen": float(c), "rewards/margins": -0.5}, i + 1) for i, c in enumerate(chosen)]
    assert episodes(forgetting, "dpo_displacement") == []


def test_destructive_regime_kl_rising_reward_falling() -> None:
    rng = np.random.default_rng(4)
    steps = np.arange(1, 101)
    kl = 0.2 + 0.008 * steps + rng.normal(0, 0.01, 100)  # above kl_warning (0.5) from step ~40
    reward = np.where(steps < 50, 1.0, 1.0 - 0.02 * (steps - 50)) + rng.normal(0, 0.02, 100)
    records = [({"kl": float(k), "reward": float(r)}, int(s)) for s, k, r in zip(steps, kl, reward, strict=True)]
    (ep, *_) = episodes(records, "destructive_regime")
    assert 55 <= ep[1] <= 80
    flat = [({"kl": float(k), "reward": 1.0 + float(e)}, int(s))
            for s, k, e in zip(steps, kl, rng.normal(0, 0.02, 100), strict=True)]
    assert episodes(flat, "destructive_regime") == []
    low_kl = [({"kl": float(k) / 4, "reward": float(r)}, int(s)) for s, k, r in zip(steps, kl, reward, strict=True)]
    assert episodes(low_kl, "destructive_regime") == []  # KL rising from zero under 0.5: every run's start


def test_a_resume_rebuilds_the_detectors_from_history() -> None:
    """A run resumed from step 30 after a blow-up that began at step 40: the detector is back to what the
    history up to step 29 says, and the blow-up's onset is not counted again when it is replayed."""
    kl = [0.1] * 30 + [2.0] * 20
    records = [({"kl": v}, i + 1) for i, v in enumerate(kl)] + [({"kl": 0.1}, s) for s in range(30, 60)]
    run = ingested(records)
    (r,) = [r for r in run.detectors.readings() if r.detector.name == "kl_critical"]
    assert r.state.onsets == 1 and not r.state.active
    assert [(e.since, e.start) for e in r.state.episodes] == [(33, 35)]


def test_loss_sign_flip_needs_a_clearly_positive_start() -> None:
    rng = np.random.default_rng(3)
    flips = np.concatenate([rng.normal(0.3, 0.05, 40), rng.normal(-0.3, 0.05, 30)])
    (ep,) = episodes(series("loss", flips), "loss_sign_flip")
    assert 41 <= ep[0] <= 48
    assert episodes(series("loss", np.concatenate([rng.normal(0, 0.3, 40), rng.normal(-0.3, 0.05, 30)])),
                    "loss_sign_flip") == []


def test_no_detector_fires_on_noise_around_a_steady_level() -> None:
    rng = np.random.default_rng(9)
    n = 300
    records = [({"loss": float(rng.normal(0, 0.05)), "kl": float(abs(rng.normal(0.1, 0.05))),
                 "reward": float(rng.normal(1.0, 0.1)), "reward_std": float(abs(rng.normal(0.3, 0.1))),
                 "entropy": float(rng.normal(0.7, 0.02)), "grad_norm": float(abs(rng.normal(0.5, 0.2))),
                 "completions/mean_length": float(rng.normal(100, 5)), "clip_ratio/low_mean": 0.01,
                 "clip_ratio/high_mean": 0.01}, i + 1) for i in range(n)]
    run = ingested(records, settings=DerivedSettings(detectors=DetectorSettings()))
    fired = {r.detector.name: len(r.state.episodes) for r in run.detectors.readings() if r.state.episodes}
    assert fired == {}


# --- baselines that cannot invert a finding ------------------------------------------------------------------------


def test_a_baseline_is_dated_by_steps_when_logging_is_sparse() -> None:
    """Logging every 10 steps, the run's first 10 steps are its first record (an average over them): that is the
    baseline, not a median over its first 100 steps; logging every step it is the first 10 points, as before."""
    sparse = Baseline(10)
    out = sparse.feed(np.arange(10, 110, 10), np.array([53.0, 3.0, 3.2, 2.9, 3.1, 4.0, 4.3, 4.1, 4.5, 4.2]))
    assert math.isnan(out[0]) and (out[1:] == 53.0).all() and sparse.first == 53.0
    every5 = Baseline(10)
    every5.feed(np.arange(5, 40, 5), np.array([8.0, 6.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert every5.value == 7.0  # steps 5 and 10: the first 10 steps
    dense = Baseline(10)
    out = dense.feed(np.arange(1, 13), np.arange(1.0, 13.0))
    assert np.isnan(out[:9]).all() and dense.value == 5.5


def test_completions_shrinking_from_the_first_record_are_a_shrink_not_growth() -> None:
    """Logged every 10 steps, completions fall from 53 tokens to 3 by the second record and then creep up to ~5:
    reported as shrinking, never as growing (issue 25: the median of the first 10 records was the collapse)."""
    rng = np.random.default_rng(7)
    lengths = np.concatenate([[53.0], np.linspace(3.0, 5.0, 49) + rng.normal(0, 0.2, 49)])
    records = [({"completions/mean_length": float(v), "reward": 1.0}, 10 * (i + 1)) for i, v in enumerate(lengths)]
    assert episodes(records, "completion_length_growing") == []
    (ep,) = episodes(records, "completion_length_shrinking")
    assert ep[2] is None and ep[1] <= 10 * 8  # within a few records of the second
    # the same start logged every step (no collapse in the baseline): growth from 10 to 20 tokens is growth
    growth = [({"completions/mean_length": float(v)}, i + 1) for i, v in enumerate(np.linspace(10, 20, 50))]
    assert episodes(growth, "completion_length_growing") and not episodes(growth, "completion_length_shrinking")


def test_a_movement_opposite_to_the_data_is_never_reported() -> None:
    """A baseline the user gave (or any) below where the run began: a level still under the run's first value is
    not growth, whatever its ratio to the baseline."""
    lengths = [40.0] + [12.0] * 39  # began at 40, sits at 12
    settings = DerivedSettings(baselines={"completion_length": 5.0})  # 12 > 1.3 x 5, but below the start
    assert episodes(series("completions/mean_length", lengths), "completion_length_growing", settings) == []
    assert episodes(series("completions/mean_length", [4.0] + [12.0] * 39), "completion_length_growing", settings)
    entropy = [0.2] + [0.5] * 39  # began low: rising entropy is no collapse
    assert episodes(series("entropy", entropy, {"reward": 1.0}), "entropy_collapse") == []


# --- a dead learning signal, a saturated preference run, a dead reward component ----------------------------


def grpo_records(frac, grad, reward_std, every: int = 1):
    return [({"frac_reward_zero_std": float(f), "grad_norm": float(g), "reward_std": float(s), "reward": 1.0},
             every * (i + 1)) for i, (f, g, s) in enumerate(zip(frac, grad, reward_std, strict=True))]


def test_a_dead_learning_signal_is_found_from_the_groups_that_tie_and_the_zero_gradient() -> None:
    """70-100% of groups tie and the gradient is exactly 0 on most records, while the mean reward std of the groups
    that still differ stays near 0.15: no reward-std detector sees it, the share of tied groups does."""
    rng = np.random.default_rng(11)
    n = 50
    frac = rng.uniform(0.7, 1.0, n)
    grad = np.where(rng.random(n) < 0.85, 0.0, rng.uniform(0.2, 1.5, n))
    std = rng.uniform(0.1, 0.2, n)
    run = ingested(grpo_records(frac, grad, std, every=10))
    got = {r.detector.name: [(e.since, e.start, e.end) for e in r.state.episodes]
           for r in run.detectors.readings() if r.state.episodes}
    assert set(got) == {"learning_signal_dead"}, got
    (ep,) = got["learning_signal_dead"]
    assert ep[1] <= 10 * 12 and ep[2] is None  # as soon as 10 records say so, as reward_std_collapsed would


def test_a_healthy_run_with_few_groups_and_a_kl_term_is_not_a_dead_signal() -> None:
    """Four groups a batch: 75-100% tie on many steps (the grpo fixture), but the KL term keeps a gradient; and a
    beta=0 run whose tied steps are single ones (a zero gradient on every third step) is not dead either."""
    rng = np.random.default_rng(12)
    n = 120
    frac = rng.choice([0.5, 0.75, 1.0], n, p=[0.2, 0.5, 0.3])
    with_kl = grpo_records(frac, np.where(frac == 1.0, 0.02, 0.3), np.where(frac == 1.0, 0.0, 0.3))
    assert episodes(with_kl, "learning_signal_dead") == []
    frac0 = np.where(np.arange(n) % 3 == 0, 1.0, rng.choice([0.0, 0.25, 0.5], n))  # every third step all tie
    single_ties = grpo_records(frac0, np.where(frac0 == 1.0, 0.0, 0.4), np.where(frac0 == 1.0, 0.0, 0.4))
    assert episodes(single_ties, "learning_signal_dead") == []


def dpo_records(loss, acc, margin):
    return [({"loss": float(lo), "rewards/accuracies": float(a), "rewards/margins": float(m),
              "rewards/chosen": 0.0}, i + 1) for i, (lo, a, m) in enumerate(zip(loss, acc, margin, strict=True))]


def test_a_saturated_dpo_run_is_found_and_a_healthy_one_is_not() -> None:
    """Loss at 0 and accuracy 1 with margins at 16 on every record (or still widening): a warning. A healthy run
    whose accuracy touches 1 on single batches, with a loss well above 0, is not saturated."""
    n = 80
    flat = dpo_records(np.zeros(n), np.ones(n), np.full(n, 16.0))
    (ep,) = episodes(flat, "dpo_saturated")
    assert ep[1] <= 10 and ep[2] is None
    widening = dpo_records(np.concatenate([np.linspace(0.69, 0.005, 40), np.full(40, 0.004)]),
                           np.concatenate([np.linspace(0.5, 1, 40), np.ones(40)]), np.linspace(0, 8, n))
    assert episodes(widening, "dpo_saturated")
    rng = np.random.default_rng(13)
    healthy = dpo_records(rng.uniform(0.2, 0.5, n), rng.choice([0.75, 0.875, 1.0], n), np.linspace(0, 2, n))
    assert episodes(healthy, "dpo_saturated") == []
    start = 20  # a margin that falls once the pairs are separated is dpo_rewards_converging's finding, not this one
    converging = dpo_records(np.concatenate([np.full(start, 0.3), np.full(n - start, 0.001)]),
                             np.concatenate([np.full(start, 0.875), np.ones(n - start)]), np.linspace(16, 4, n))
    assert episodes(converging, "dpo_saturated") == []


def test_a_dead_reward_component_is_found_as_fast_as_the_reward_std_collapse_on_the_same_signal() -> None:
    """A single-component reward whose std dies at step 30: the component's warning comes at the step
    reward_std_collapsed pages, not 10-20 steps later; a component that dies while the reward still varies keeps
    the longer window (a healthy run's format reward saturates for a while)."""
    n = 80
    std = np.concatenate([np.full(30, 0.4), np.zeros(n - 30)])
    records = [({"reward_std": float(s), "rewards/only/std": float(s), "rewards/only/mean": 1.0, "reward": 1.0}, i + 1)
               for i, s in enumerate(std)]
    run = ingested(records)
    starts = {r.detector.name: r.state.episodes[0].start for r in run.detectors.readings() if r.state.episodes}
    assert starts["reward_component_dead"] == starts["reward_std_collapsed"]
    other = [({"reward_std": 0.4, "rewards/only/std": float(s), "rewards/only/mean": 1.0, "reward": 1.0}, i + 1)
             for i, s in enumerate(std)]
    (ep,) = episodes(other, "reward_component_dead")
    assert ep[1] > starts["reward_std_collapsed"]


def test_entropy_collapse_is_found_within_a_few_steps_of_a_sustained_fall_below_half_its_start() -> None:
    rng = np.random.default_rng(14)
    entropy = np.concatenate([rng.normal(0.45, 0.03, 40), rng.normal(0.15, 0.03, 40)])  # below half from step 41
    (ep,) = episodes(series("entropy", entropy, {"reward": 1.0}), "entropy_collapse")
    assert 41 <= ep[1] <= 41 + 10
