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
from exporter.judgment.story import RECOMMENDATIONS

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


# posttrain_run_recommendation as one number per run: what to do next, from the calmest to the most urgent.
RECOMMENDATION_STYLES: dict[str, tuple[str, str]] = {
    "not_judged": ("not judged (no progress measure read)", "text"),
    "continue": ("continue: still improving", "green"),
    "stop": ("stop: run its course, keep the checkpoint", "blue"),
    "investigate": ("investigate: something changed", "orange"),
    "stop_now": ("stop now: training is destructive", "red"),
}
RECOMMENDATION_EXPR, RECOMMENDATION_MAPPINGS = numbered_states(
    KEY, RECOMMENDATION_STYLES, RECOMMENDATIONS,
    lambda name: series("posttrain_run_recommendation", after=(f'recommendation="{name}"',)))


def judgment_panels() -> list[dict]:
    """The judgment of the run, first on every board: what to do next, whether the task is learnt, the checkpoint
    to keep (one row, 24 wide)."""
    return [
        state("What to do next",
              "The exporter's judgment of the run as a whole, as an experienced practitioner reads it: continue "
              "while it improves; stop once it has run its course (converged, nothing left to learn, the task not "
              "learnt) and keep the checkpoint beside; stop now when continuing makes the model worse; investigate "
              "an abrupt change. /api/v1/verdict and `report` say why and what to change.",
              [t(RECOMMENDATION_EXPR)], mappings=RECOMMENDATION_MAPPINGS, w=12, h=4),
        state("Learning its task",
              "Whether the run learns its task: red when its progress measure never rose beyond its noise, or rose "
              "only through reward components near their ceiling from the start while another never fired (a "
              "reward curve that looks fine and teaches nothing). Absent while it is too early to say.",
              [t(by_run("max", series("posttrain_run_learning")))],
              mappings=value_mappings([("not learning", "red"), ("learning", "green")]),
              steps=[(None, "red"), (1, "green")], w=8, h=4),
        stat("Checkpoint to keep",
             "Step of the checkpoint the judgment says to keep: the saved one nearest the run's best step (before "
             "its first sign of trouble when it must stop now). Empty when none is better than the starting model.",
             [t(by_run("max", series("posttrain_checkpoint_keep_step")))], decimals=0, w=4, h=4),
    ]


def step_stat(w: int = 4) -> dict:
    return stat("Step", "Last training step logged; a run that stops advancing has stalled.",
                [t(by_run("max", series("posttrain_step")))], decimals=0, w=w)


def step_stats(w: int = 4) -> list[dict]:
    return [
        step_stat(w),
        stat("Reward peak step",
             "Step of the highest smoothed reward so far (mean of the last logged rewards). Far behind the current "
             "step means the model was better earlier: a peak followed by decline. The checkpoint to keep is the "
             "judgment's (Checkpoint to keep): on a plateau it takes the plateau's first step, not a later noisy "
             "high.",
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
