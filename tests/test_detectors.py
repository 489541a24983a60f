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
