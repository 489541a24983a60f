"""The derived series against numpy references on the real fixtures, and the classifiers on curves
that show each case."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import ingested, trainer_state, trainer_state_values

from exporter.config import parse_config
from exporter.instruments.keymap import KeyMap
from exporter.instruments.settings import DerivedSettings, WindowSpec
from exporter.parsers.record import Record
from exporter.runstate import RunState

W, MIN = 50, 10


def feed(run_name: str, upto: int | None = None, settings: DerivedSettings | None = None) -> RunState:
    """Every trainer_state entry (full precision, with its step) through a RunState."""
    entries = [(v, s) for v, s in trainer_state_values(run_name) if upto is None or s <= upto]
    return ingested(entries, run_name, settings)


def logged(run_name: str, key: str, upto: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    pts = [(e["step"], e[key]) for e in trainer_state(run_name)
           if key in e and "loss" in e and (upto is None or e["step"] <= upto)]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def gauge(run: RunState, metric: str, **labels: str) -> float | None:
    run.refresh()
    want = set(labels.items())
    for (m, lbl), v in run.derived.gauges.items():
        if m == metric and set(lbl) == want:
            return v
    return None


CASES = [  # (fixture, key, instrument, sub-label)
    ("grpo", "reward", "reward", {}),
    ("grpo", "reward_std", "reward_std", {}),
    ("grpo", "kl", "kl", {}),
    ("grpo", "entropy", "entropy", {}),
    ("grpo", "loss", "loss", {}),
    ("grpo", "grad_norm", "grad_norm", {}),
    ("grpo", "completions/mean_length", "completion_length", {"stat": "mean"}),
    ("grpo", "clip_ratio/low_mean", "clip_ratio", {"bound": "low"}),
    ("grpo", "clip_ratio/high_mean", "clip_ratio", {"bound": "high"}),
    ("grpo", "rewards/format_reward/mean", "reward_component", {"component": "format_reward"}),
    ("grpo", "rewards/length_reward/std", "reward_component_std", {"component": "length_reward"}),
    ("grpo", "rewards/correctness_reward/mean", "reward_component", {"component": "correctness_reward"}),
    ("grpo_saturated", "reward_std", "reward_std", {}),
    ("dpo", "rewards/margins", "dpo_reward", {"kind": "margin"}),
    ("dpo", "rewards/chosen", "dpo_reward", {"kind": "chosen"}),
    ("dpo", "rewards/rejected", "dpo_reward", {"kind": "rejected"}),
    ("sft", "loss", "loss", {}),
]


@pytest.mark.parametrize("upto", [37, 120, 300])
@pytest.mark.parametrize(("fixture", "key", "instrument", "sub"), CASES)
def test_window_statistics_match_numpy(fixture: str, key: str, instrument: str, sub: dict, upto: int) -> None:
    run = feed(fixture, upto)
    x, y = logged(fixture, key, upto)
    labels = {"instrument": instrument, **sub}
    if len(y) < MIN:
        assert gauge(run, "posttrain_trend", **labels) is None  # nothing before 10 points
        return
    xw, yw = x[-W:], y[-W:]
    assert gauge(run, "posttrain_trend", **labels) == pytest.approx(np.polyfit(xw, yw, 1)[0], rel=1e-6, abs=1e-12)
    assert gauge(run, "posttrain_window_stddev", **labels) == pytest.approx(np.std(yw), rel=1e-6, abs=1e-9)
    assert gauge(run, "posttrain_window_mean", **labels) == pytest.approx(np.mean(yw), rel=1e-9)
    assert gauge(run, "posttrain_window_max", **labels) == np.max(yw)
    assert gauge(run, "posttrain_window_min", **labels) == np.min(yw)


def test_saturating_grpo_run_shows_reward_std_collapsing() -> None:
    """grpo_saturated: two easy rewards; from about step 60 nearly every group ties."""
    for step in (30, 50, 60):  # the collapse happens over the first 60 steps
        assert gauge(feed("grpo_saturated", step), "posttrain_trend", instrument="reward_std") < 0
    assert gauge(feed("grpo_saturated", 50), "posttrain_trend_direction", instrument="reward_std") == -1
    run = feed("grpo_saturated")
    _, std = logged("grpo_saturated", "reward_std")
    assert gauge(run, "posttrain_reward_std_headroom") == std[-1] / 0.05 < 1
    assert run.derived.breaches[(("instrument", "reward_std"), ("level", "min"))] == int(np.sum(std < 0.05))
    for comp in ("format_reward", "even_answer_reward"):
        assert gauge(run, "posttrain_reward_component_dead", component=comp) == 1.0
    # Saturated: nothing changes any more, reward flat near its maximum of 2 with KL stable.
    assert gauge(run, "posttrain_regime", regime="converged") == 1.0
    assert gauge(run, "posttrain_reward_peak") == pytest.approx(2.0)


def test_composite_reward_run_has_per_component_series() -> None:
    run = feed("grpo")
    for comp in ("format_reward", "length_reward", "correctness_reward"):
        _, y = logged("grpo", f"rewards/{comp}/std")
        assert gauge(run, "posttrain_trend", instrument="reward_component", component=comp) is not None
        assert gauge(run, "posttrain_reward_component_dead", component=comp) == float(y[-1] < 0.01)


def test_grpo_regime_and_kl_spike() -> None:
    """grpo: at step 100 reward climbs (t > 4) while KL holds: 'improving without drift'. The KL spike
    to 9.1 near step 285 is one point, not a trend: the window max and the breach counters carry it."""
    assert gauge(feed("grpo", 100), "posttrain_regime", regime="improving_without_drift") == 1.0
    run = feed("grpo")
    _, kl = logged("grpo", "kl")
    assert gauge(run, "posttrain_window_max", instrument="kl") == kl[-W:].max() > 9
    assert run.derived.breaches[(("instrument", "kl"), ("level", "critical"))] == int(np.sum(kl > 1.0))
    assert run.derived.breaches[(("instrument", "kl"), ("level", "warning"))] == int(np.sum(kl > 0.5))


def test_saturated_run_started_by_learning_with_drift() -> None:
    """grpo_saturated at step 50: reward rising fast (t ~ 6) and KL rising (t ~ 2.7) before it saturates."""
    assert gauge(feed("grpo_saturated", 50), "posttrain_regime", regime="improving_with_drift") == 1.0


def test_clip_asymmetry_and_length_baseline_on_grpo() -> None:
    hist = [e for e in trainer_state("grpo") if "clip_ratio/low_mean" in e and "loss" in e]
    for e in hist:
        run = feed("grpo", e["step"])
        low, high = e["clip_ratio/low_mean"], e["clip_ratio/high_mean"]
        if low + high > 0.01:
            assert gauge(run, "posttrain_clip_asymmetry") == pytest.approx((high - low) / (high + low))
            break
    else:
        pytest.fail("grpo never clips")
    run = feed("grpo")
    steps, length = logged("grpo", "completions/mean_length")
    base = dict(run.detectors.baselines())[("completion_length", "mean")]
    # the run's own start: the median of its values logged in its first 10 steps (this run logs length every
    # other step: 5 points)
    assert base == pytest.approx(np.median(length[steps < steps[0] + 10]))
    assert gauge(run, "posttrain_completion_length_baseline_ratio") == pytest.approx(length[-W:].mean() / base)
    _, ent = logged("grpo", "entropy")
    w = ent[-W:]
    assert gauge(run, "posttrain_entropy_acceleration") == pytest.approx(w[W // 2:].mean() - w[:W // 2].mean())


# --- classifiers on curves that show each case ----------------------------------------------------------


def curve_run(kl, reward, settings=None) -> RunState:
    steps = enumerate(zip(kl, reward, strict=True), start=1)
    return ingested((({"kl": k, "reward": r}, step) for step, (k, r) in steps), "c", settings)


def noisy(trend: float, n: int = 50, seed: int = 0, level: float = 1.0, noise: float = 0.02) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(level + trend * np.arange(n) + rng.normal(0, noise, n))


@pytest.mark.parametrize(
    ("kl_trend", "reward_trend", "regime"),
    [(0.01, 0.01, "improving_with_drift"),  # changing and improving: healthy
     (0.01, 0.0, "drifting_without_gain"),  # "the training has run its course"
     (0.01, -0.01, "destructive"),  # "actively destructive. Stop immediately"
     (0.0, 0.01, "improving_without_drift"),  # "ideal but rare"
     (0.0, 0.0, "converged"),  # nothing is changing
     (-0.01, 0.0, "converged"),  # KL falling is not drift
     (0.0, -0.01, "declining")],
)
def test_regime_on_curves(kl_trend: float, reward_trend: float, regime: str) -> None:
    run = curve_run(noisy(kl_trend, seed=1, level=0.1), noisy(reward_trend, seed=2))
    run.refresh()
    states = {lbl[0][1]: v for (m, lbl), v in run.derived.gauges.items() if m == "posttrain_regime"}
    assert states[regime] == 1.0 and sum(states.values()) == 1.0


def test_regime_unknown_before_min_points() -> None:
    run = curve_run([0.1] * 5, [1.0] * 5)
    assert gauge(run, "posttrain_regime", regime="unknown") == 1.0


def test_noise_alone_is_flat() -> None:
    """A trend smaller than the noise does not count as rising: the t-statistic decides, not the sign."""
    run = curve_run(noisy(0.0002, seed=3, level=0.1, noise=0.05), noisy(0.0, seed=4))
    assert gauge(run, "posttrain_trend", instrument="kl") > 0
    assert gauge(run, "posttrain_trend_direction", instrument="kl") == 0


def loss_run(values, settings: DerivedSettings | None = None) -> RunState:
    return ingested((({"loss": float(v)}, step) for step, v in enumerate(values, start=1)), "l", settings)


def test_pg_loss_healthy_decline() -> None:
    run = loss_run(0.5 * np.exp(-np.arange(60) / 200) + np.random.default_rng(5).normal(0, 0.005, 60))
    assert run.derived.loss_sign_flips == 0 and run.derived.loss_discontinuities == 0
    assert gauge(run, "posttrain_loss_oscillating") == 0.0


def test_pg_loss_sign_flip() -> None:
    run = loss_run([0.3] * 30 + [-0.3] * 30)
    assert run.derived.loss_sign_flips == 1


def test_pg_loss_oscillating_around_zero() -> None:
    rng = np.random.default_rng(6)
    run = loss_run(rng.normal(0, 0.1, 60))
    assert gauge(run, "posttrain_loss_oscillating") == 1.0


@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_pg_loss_discontinuity(factor: float) -> None:
    rng = np.random.default_rng(7)
    run = loss_run(list(0.2 + rng.normal(0, 0.01, 40)) + list(0.2 * factor + rng.normal(0, 0.01 * factor, 12)))
    assert run.derived.loss_discontinuities == 1
    ratio = gauge(run, "posttrain_loss_magnitude_ratio")
    assert (ratio > 2) if factor > 1 else (ratio < 0.5)


def loss_shifts(values) -> int:
    return loss_run(values).derived.loss_discontinuities


def test_level_shift_needs_to_stand_out_of_the_series_own_swings() -> None:
    """002's "suddenly doubled or halved", on a pg loss whose magnitude swings from step to step
    the way GRPO's does (lognormal: a factor of 3 either way is ordinary): its swings are not shifts,
    a real quadrupling of its level is one."""
    swings = np.exp(np.random.default_rng(12).normal(np.log(0.02), 1.0, 400))
    assert loss_shifts(swings) <= 2  # 400 steps of ordinary swings
    before = loss_shifts(swings[:200])
    assert loss_shifts(np.concatenate([swings[:200], 4 * swings[200:260]])) == before + 1


@pytest.mark.parametrize(("size", "min_points"), [(10, 10), (1, 1), (15, 10)])
def test_loss_window_shorter_than_twice_min_points_has_no_level_shift_and_no_crash(size, min_points) -> None:
    """A level shift compares the last min_points losses with at least as many before them: a loss window
    with room for fewer never judges one (and a window of exactly min_points must not crash)."""
    spec = WindowSpec(size=size, min_points=min_points)
    swings = np.exp(np.random.default_rng(13).normal(np.log(0.02), 1.0, 300))
    run = loss_run([*swings, *(4 * swings[:60])], DerivedSettings(per_instrument={"loss": spec}))
    assert run.derived.loss_discontinuities == 0 and len(run.series["loss", None]) == min(360, 2048)


def test_reward_peak_drawdown_and_plateau() -> None:
    rise_fall = list(np.linspace(0, 1, 40)) + list(np.linspace(1, 0.6, 20))
    run = curve_run([0.1] * 60, rise_fall)
    peak_step = gauge(run, "posttrain_reward_peak_step")
    assert 40 <= peak_step <= 46  # the 10-point smoothed reward tops out just after the raw top at 40
    assert gauge(run, "posttrain_reward_drawdown") > 0.2
    saturating = list(1 - np.exp(-np.arange(60) / 12))
    assert gauge(curve_run([0.1] * 60, saturating), "posttrain_reward_plateau") == 1.0
    linear = list(np.arange(60) * 0.01)
    assert gauge(curve_run([0.1] * 60, linear), "posttrain_reward_plateau") == 0.0


def test_reward_peak_on_a_plateau_is_its_first_step() -> None:
    """grpo_saturated: from about step 60 both reward functions are solved and the smoothed reward sits at
    its top again and again. The best checkpoint is where it first got there, not a later window that
    rounding made a hair higher."""
    steps, reward = logged("grpo_saturated", "reward")
    smoothed = np.convolve(reward, np.ones(MIN) / MIN, "valid")
    at_top = np.isclose(smoothed, smoothed.max(), rtol=1e-9, atol=0)
    assert at_top.sum() > 1  # a plateau: several windows share the top
    assert gauge(feed("grpo_saturated"), "posttrain_reward_peak_step") == steps[MIN - 1 + int(np.argmax(at_top))]


def test_reward_peak_ignores_rounding() -> None:
    """A reward that repeats the same ten values: every smoothed window holds the same rewards in another
    order, so every window is the same mean, though summed in another order some land an ulp higher."""
    period = np.random.default_rng(1).uniform(0, 1, MIN)
    run = curve_run([0.1] * 6 * MIN, list(np.tile(period, 6)))
    assert gauge(run, "posttrain_reward_peak_step") == MIN  # the first full window, at step 10


def test_breach_between_scrapes_is_counted() -> None:
    run = curve_run([0.2] * 12 + [1.5] + [0.2] * 3, [1.0] * 16)
    assert run.series["kl", None].last_value == 0.2
    assert gauge(run, "posttrain_window_max", instrument="kl") == 1.5
    assert run.derived.breaches[(("instrument", "kl"), ("level", "critical"))] == 1


def test_per_run_thresholds_and_windows_from_config() -> None:
    cfg = parse_config({"thresholds": {"kl_warning": 0.1, "kl_critical": 0.15},
                        "windows": {"size": 20, "min_points": 5, "per_instrument": {"kl": {"size": 8}}}})
    kl = [0.12 + 0.001 * i for i in range(30)]  # 0.12 .. 0.149: all above 0.1, none above 0.15
    run = curve_run(kl, noisy(0.0, n=30), settings=cfg.derived)
    assert run.derived.breaches[(("instrument", "kl"), ("level", "warning"))] == 30
    assert run.derived.breaches.get((("instrument", "kl"), ("level", "critical")), 0) == 0
    kl_w, reward_w = (gauge(run, "posttrain_window_mean", instrument=i) for i in ("kl", "reward"))
    assert kl_w == pytest.approx(np.mean(kl[-8:]))
    assert gauge(curve_run(kl[:5], [1.0] * 5, settings=cfg.derived), "posttrain_trend", instrument="kl") is not None
    assert reward_w == pytest.approx(np.mean([v for _, v in list(run.series["reward", None].history)[-20:]]))


def test_resumed_run_rebuilds_windows_from_history() -> None:
    run = curve_run(noisy(0.001, n=80, seed=8, level=0.1), noisy(0.01, n=80, seed=9))
    run.ingest(Record({"kl": 0.3, "reward": 0.5}, "jsonl", step=61))  # resumed from step 60
    run.refresh()
    steps, values = zip(*run.series["reward", None].history, strict=True)
    assert max(steps) == 61 and len(steps) == 61
    assert gauge(run, "posttrain_trend", instrument="reward") == pytest.approx(
        np.polyfit(steps[-W:], values[-W:], 1)[0])
    assert math.isclose(gauge(run, "posttrain_window_max", instrument="reward"), max(values[-W:]))


def test_generation_share_of_step_time_from_verl_timing_keys() -> None:
    """verl logs timing_s/gen and timing_s/step per step (formats.md); the share is their ratio, window mean."""
    from exporter.parsers.chain import LineParserChain

    parsers, run = LineParserChain(), RunState("v", KeyMap())
    gen = [3.0 + (s % 3) for s in range(1, 31)]
    for s, g in enumerate(gen, start=1):
        rec = parsers.parse(f"(TaskRunner pid=1) step:{s} - timing_s/gen:{g} - timing_s/step:10.0 - actor/kl_loss:0.01")
        run.ingest(rec)
    assert gauge(run, "posttrain_generation_time_ratio") == pytest.approx(np.mean(np.array(gen) / 10.0))
    assert run.series["step_time", None].last_value == 10.0


def test_breach_counters_exist_at_zero_and_nonfinite_values_are_counted() -> None:
    run = curve_run([0.1, math.nan, 0.2], [1.0, 1.0, math.inf])
    assert run.derived.breaches[(("instrument", "kl"), ("level", "critical"))] == 0  # present before any breach
    assert run.nonfinite[("kl", None)] == 1 and run.nonfinite[("reward", None)] == 1


def test_rule_only_thresholds_are_exported_and_tunable() -> None:
    """The alert rules read these from posttrain_threshold (their recording rule falls back to defaults)."""
    from exporter.instruments.derived import threshold_series

    cfg = parse_config({"thresholds": {"stall_seconds": 600, "kl_near_zero": 0.01}})
    series = threshold_series(cfg.derived.thresholds)
    assert series["record_age", "stall"] == 600 and series["kl", "near_zero"] == 0.01
    assert series["grad_norm", "spike_factor"] == 10.0 and series["parse_errors", "max_ratio"] == 0.1
