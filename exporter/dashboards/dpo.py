"""The DPO board: reward dynamics (implicit rewards, margin, preference accuracy) and the fundamentals."""

from __future__ import annotations

from exporter.dashboards.builders import (
    FLAG,
    by_run,
    by_step,
    dashboard,
    limit,
    right,
    row,
    series,
    stat,
    state,
    step_row,
    t,
    timeseries,
    value_mappings,
)
from exporter.dashboards.panels import detectors_panel, fundamentals, judgment_panels, step_stat


def dpo() -> dict:
    return dashboard("posttrain-dpo", "Post-training: DPO",
                     "DPO reward dynamics (implicit rewards, margin, preference accuracy) and the fundamentals.", [
        row("Run state", [
            *judgment_panels(),
            step_stat(w=6),
            stat("Preference accuracy", "Share of pairs where the chosen response wins. Healthy: climbs well "
                 "above 0.5; stuck at 0.5 is no preference learned, 1.0 early can mean the pairs are too easy.",
                 [t(by_run("max", series("posttrain_dpo_accuracy_ratio")))], unit="percentunit",
                 steps=[(None, "orange"), (0.6, "green")], w=6),
            state("Margin converging",
                  "1 (orange) while the margin trends down: chosen and rejected rewards converge, the model is "
                  "losing the preference.",
                  [t(by_run("max", series("posttrain_dpo_margin_converging")))],
                  mappings=value_mappings([("ok", "green"), ("converging", "orange")]),
                  steps=FLAG, w=12, h=4),
            detectors_panel(),
        ]),
        row("Reward dynamics", [
            timeseries("Chosen and rejected rewards",
                       "Implicit rewards of the chosen and rejected responses. Healthy: they separate, chosen "
                       "above rejected. The chosen reward below the dashed limit while the margin still grows is "
                       "likelihood displacement: both answers pushed down.",
                       [t(series("posttrain_dpo_reward", 'kind=~"chosen|rejected"'), "{{run}} {{kind}}"),
                        limit("dpo_displacement")], w=12),
            timeseries("Margin",
                       "Chosen minus rejected reward and its trend (right, per step). Healthy: grows then "
                       "plateaus; shrinking means chosen and rejected converge.",
                       [t(series("posttrain_dpo_reward", 'kind="margin"'), "{{run}} margin"),
                        t(series("posttrain_trend", 'instrument="dpo_reward"', 'kind="margin"'), "{{run}} trend")],
                       overrides=[right(".*trend.*")], w=12),
            timeseries("Preference accuracy",
                       "Share of pairs where the chosen response is preferred, with the window mean.",
                       [t(series("posttrain_dpo_accuracy_ratio"), "{{run}} accuracy"),
                        t(series("posttrain_window_mean", 'instrument="dpo_accuracy"'), "{{run}} window mean")],
                       unit="percentunit"),
            timeseries("Loss", "DPO loss: healthy falls below ln 2 = 0.693 (the loss of no preference) and "
                       "settles; near 0 fast can be overfitting to easy pairs.",
                       [t(series("posttrain_loss"), "{{run}} loss")]),
            *fundamentals(),
        ]),
        row("Fundamentals", [
            timeseries("Token accuracy", "Mean token accuracy on the batch.",
                       [t(series("posttrain_token_accuracy_ratio"), "{{run}} token accuracy")],
                       unit="percentunit", w=12),
            timeseries("Entropy", "Policy entropy: a slow decline is healthy, a cliff is collapse.",
                       [t(series("posttrain_entropy"), "{{run}} entropy")], w=12),
        ]),
        step_row([
            by_step("Chosen reward by step", "Implicit reward of the chosen responses at each logged step.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="chosen"', w=12),
            by_step("Rejected reward by step", "Implicit reward of the rejected responses at each logged step.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="rejected"', w=12),
            by_step("Margin by step", "Chosen minus rejected reward at each logged step: grows then plateaus.",
                    "posttrain_dpo_reward", "dpo_reward", 'kind="margin"', w=12),
            by_step("Preference accuracy by step", "Share of pairs where the chosen response wins, at each logged "
                    "step.", "posttrain_dpo_accuracy_ratio", "dpo_accuracy", unit="percentunit", w=12),
        ]),
    ], ["dpo"])
