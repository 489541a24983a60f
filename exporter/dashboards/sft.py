"""The SFT board: loss, gradients, learning rate, accuracy, entropy."""

from __future__ import annotations

from exporter.dashboards.builders import by_run, by_step, dashboard, row, series, stat, step_row, t, timeseries
from exporter.dashboards.panels import detectors_panel, judgment_panels, step_stat


def sft() -> dict:
    return dashboard("posttrain-sft", "Post-training: SFT",
                     "Supervised fine-tuning fundamentals: loss, gradients, learning rate, accuracy, entropy.", [
        row("Run state", [
            *judgment_panels(),
            step_stat(w=8),
            stat("Epoch", "Training epoch (fractional).", [t(by_run("max", series("posttrain_epoch")))],
                 decimals=2, w=8),
            stat("Loss trend", "Least-squares slope of the loss per step over the window: negative while "
                 "learning, ~0 once converged, positive is divergence.",
                 [t(by_run("max", series("posttrain_trend", 'instrument="loss"')))], decimals=5,
                 steps=[(None, "green"), (0, "orange")], w=8),
            detectors_panel(h=4),
        ]),
        row("Fundamentals", [
            timeseries("Loss", "Training loss with the window's min and max. Healthy: falls then flattens; a "
                       "rising loss or sudden jumps are divergence; a floor near 0 is memorisation.",
                       [t(series("posttrain_loss"), "{{run}} loss"),
                        t(series("posttrain_window_min", 'instrument="loss"'), "{{run}} window min"),
                        t(series("posttrain_window_max", 'instrument="loss"'), "{{run}} window max")], w=12),
            timeseries("Gradient norm",
                       "Gradient norm before clipping: a stable band is healthy; spikes precede divergence.",
                       [t(series("posttrain_grad_norm"), "{{run}} grad norm")], w=12),
            timeseries("Learning rate", "The schedule as the trainer applied it (warmup, decay).",
                       [t(series("posttrain_learning_rate"), "{{run}} learning rate")]),
            timeseries("Token accuracy", "Mean token accuracy on the training batch: rises as loss falls.",
                       [t(series("posttrain_token_accuracy_ratio"), "{{run}} token accuracy")],
                       unit="percentunit"),
            timeseries("Entropy", "Mean token entropy: falls as the model grows confident; a cliff to ~0 is "
                       "overconfidence.", [t(series("posttrain_entropy"), "{{run}} entropy")]),
        ]),
        step_row([
            by_step("Loss by step", "Training loss at each logged step: falls then flattens.", "posttrain_loss",
                    "loss", w=12),
            by_step("Gradient norm by step", "Gradient norm before clipping at each logged step.",
                    "posttrain_grad_norm", "grad_norm", w=12),
        ]),
    ], ["sft"])
