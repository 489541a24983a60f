"""The PPO board: reward dynamics, KL health, policy ratio and clip fraction, value function, fundamentals."""

from __future__ import annotations

from exporter.dashboards.builders import (
    baseline,
    by_run,
    by_step,
    dashboard,
    limit,
    right,
    row,
    series,
    step_row,
    t,
    thr,
    timeseries,
)
from exporter.dashboards.panels import (
    detectors_panel,
    fundamentals,
    judgment_panels,
    regime_panel,
    reward_targets,
    step_stats,
)


def ppo() -> dict:
    return dashboard("posttrain-ppo", "Post-training: PPO",
                     "PPO: reward dynamics, KL health, policy ratio and clip "
                     "fraction, value function, fundamentals.", [
        row("Run state", [*judgment_panels(), *step_stats(w=4), regime_panel(w=12), detectors_panel()]),
        row("Reward dynamics and KL", [
            timeseries("Reward-model score",
                       "The reward model's raw score, smoothed and its peak. Never trust it alone: a score that "
                       "climbs while KL runs away is reward hacking, the default failure mode.",
                       reward_targets("score"),
                       overrides=[right(".*trend.*")]),
            timeseries("RLHF and non-score reward",
                       "rlhf = score + non-score; non-score is the KL penalty. A non-score reward growing more "
                       "negative means the policy pays ever more to drift from the reference.",
                       [t(series("posttrain_ppo_reward"), "{{run}} {{kind}}")]),
            timeseries("KL divergence",
                       "KL to the reference: above 0.5 is a warning, above 1.0 a stop sign. The window max keeps a "
                       "spike between scrapes visible.",
                       [t(series("posttrain_kl"), "{{run}} kl"),
                        t(by_run("max", series("posttrain_window_max", 'instrument="kl"')), "{{run}} window max"),
                        thr("kl")]),
        ]),
        row("Policy ratio and clip fraction", [
            timeseries("Policy ratio",
                       "Mean ratio of new to old policy probabilities: healthy near 1.0; regularly above 1.5 "
                       "means reduce the learning rate, outside 0.5..2.0 the update is unstable. Distance |r - 1| "
                       "on the right; approximate KL between old and new policy beside it.",
                       [t(series("posttrain_policy_ratio"), "{{run}} ratio"),
                        thr("policy_ratio"),
                        t(series("posttrain_policy_ratio_distance"), "{{run}} distance"),
                        t(series("posttrain_approx_kl"), "{{run}} approx kl")],
                       overrides=[right(".*(distance|approx kl).*")]),
            timeseries("Clip fraction",
                       "Share of updates where the ratio clip was active: above 30% the steps are too large "
                       "(reduce the learning rate), under 1% the policy barely moves.",
                       [t(series("posttrain_clip_fraction_ratio"), "{{run}} clip fraction"), thr("clip_fraction")],
                       unit="percentunit"),
            timeseries("Value loss",
                       "The critic's loss. Healthy: falls and settles; a climbing or exploding value loss makes the "
                       "advantages noise, and the policy follows.",
                       [t(series("posttrain_value_loss"), "{{run}} value loss")]),
        ]),
        row("Fundamentals", [
            timeseries("Entropy", "Exploration: a slow decline from the run's start (baseline) is healthy; below "
                       "the dashed limit (half the baseline) or a cliff is collapse.",
                       [t(series("posttrain_entropy"), "{{run}} entropy"), baseline("entropy"),
                        limit("entropy_collapse")]),
            timeseries("Completion length",
                       "Mean length against the baseline ratio (right): outside 0.7x..1.3x deserves investigation "
                       "(length hacking or collapse).",
                       [t(series("posttrain_completion_length_tokens", 'stat="mean"'), "{{run}} mean length"),
                        t(series("posttrain_completion_length_baseline_ratio"), "{{run}} baseline ratio"),
                        thr("completion_length")],
                       overrides=[right(".*(baseline ratio|threshold).*")]),
            *fundamentals(),
        ], collapsed=True),
        step_row([
            by_step("Score by step", "The reward model's score at each logged step.", "posttrain_reward", "reward"),
            by_step("KL by step", "KL to the reference at each logged step: 0.5 warns, 1.0 is a stop sign.",
                    "posttrain_kl", "kl"),
            by_step("Clip fraction by step", "Share of clipped updates at each logged step: above 30% the steps are "
                    "too large.", "posttrain_clip_fraction_ratio", "clip_fraction", unit="percentunit"),
        ]),
    ], ["ppo"])
