"""Panels more than one board shows: the run's step and best step, the detectors, the KL-versus-reward regime,
the gradient norm and learning rate."""

from __future__ import annotations

from exporter.dashboards.builders import (
    FLAG,
    KEY,
    by_run,
    numbered_states,
    right,
    series,
    stat,
    state,
    t,
    timeseries,
    value_mappings,
)
from exporter.instruments.derived import REGIMES

# posttrain_regime as one number per run, for a state timeline: each regime's text and color, in the order of
# their numbers (unknown first, then from the healthiest to the most destructive). The names are the exporter's.
REGIME_STYLES: dict[str, tuple[str, str]] = {
    "unknown": ("unknown (not enough points / no KL)", "text"),
    "improving_without_drift": ("improving without drift (ideal)", "green"),
    "improving_with_drift": ("improving with drift (healthy)", "green"),
    "converged": ("converged (nothing changes)", "blue"),
    "drifting_without_gain": ("drifting without gain (run its course)", "orange"),
    "declining": ("declining (reward lost, no drift)", "orange"),
    "destructive": ("destructive: stop immediately", "red"),
}
REGIME_EXPR, REGIME_MAPPINGS = numbered_states(
    KEY, REGIME_STYLES, REGIMES, lambda name: series("posttrain_regime", after=(f'regime="{name}"',)))


def step_stat(w: int = 4) -> dict:
    return stat("Step", "Last training step logged; a run that stops advancing has stalled.",
                [t(by_run("max", series("posttrain_step")))], decimals=0, w=w)


def step_stats(w: int = 4) -> list[dict]:
    return [
        step_stat(w),
        stat("Best step (reward peak)",
             "Step of the highest smoothed reward so far: the checkpoint to keep. Far behind the current step "
             "means the model was better earlier: a peak followed by decline.",
             [t(by_run("max", series("posttrain_reward_peak_step")))], decimals=0, w=w),
        stat("Reward drawdown from peak",
             "Peak smoothed reward minus the current one. Zero while improving; above zero for long means "
             "continuing training is actively harmful.",
             [t(by_run("max", series("posttrain_reward_drawdown")))], decimals=3,
             steps=[(None, "green"), (0.05, "orange")], w=w),
    ]


def detectors_panel(w: int = 24, h: int = 6) -> dict:
    return state(
        "Detectors",
        "Each judgment of the exporter for the run, as the alerts read it: active (orange) once its condition has "
        "held for its required logged steps. A detector that never saw its inputs is absent.",
        [t(by_run("max", series("posttrain_detector_active"), "detector"), "{{run}} {{detector}}")],
        mappings=value_mappings([("quiet", "green"), ("active", "orange")]),
        steps=FLAG, w=w, h=h)


def regime_panel(w: int = 12) -> dict:
    return state(
        "KL-versus-reward regime",
        "Five regimes from the trend directions of KL and reward: improving with or "
        "without drift is healthy; drifting without gain means the run has run its course; KL rising while "
        "reward falls is destructive: stop immediately.",
        [t(REGIME_EXPR)], mappings=REGIME_MAPPINGS, w=w)


def reward_targets(name: str) -> list[dict]:
    """The reward (legend `name`), smoothed, its peak and its trend (for a right axis matching `.*trend.*`)."""
    return [t(series("posttrain_reward"), f"{{{{run}}}} {name}"),
            t(series("posttrain_reward_smoothed"), "{{run}} smoothed"),
            t(series("posttrain_reward_peak"), "{{run}} peak"),
            t(series("posttrain_trend", 'instrument="reward"'), "{{run}} trend")]


def fundamentals(w: int = 8) -> list[dict]:
    return [
        timeseries("Gradient norm and learning rate",
                   "Gradient norm before clipping (left) and learning rate (right). Healthy: a stable band; "
                   "spikes or a steady climb precede divergence, a collapse to ~0 means nothing is learned.",
                   [t(series("posttrain_grad_norm"), "{{run}} grad norm"),
                    t(series("posttrain_learning_rate"), "{{run}} learning rate")],
                   overrides=[right(".*learning rate.*")], w=w),
    ]
