"""The GRPO board: reward std is primary, loss is relegated to anomalies (primary: reward std, reward,
KL; secondary: length, truncation, clipping, entropy; tertiary: reward components and the loss)."""

from __future__ import annotations

from exporter.dashboards.builders import (
    FLAG,
    baseline,
    by_run,
    by_step,
    dashboard,
    limit,
    override,
    right,
    row,
    series,
    spikes,
    state,
    step_row,
    t,
    thr,
    timeseries,
    value_mappings,
)
from exporter.dashboards.panels import (
    detectors_panel,
    fundamentals,
    judgment_panels,
    regime_panel,
    reward_targets,
    step_stats,
)

UID = "posttrain-grpo"
# Queries that may legitimately return nothing on the fixtures: (dashboard uid, panel title, refId) -> why.
# Every other query must return data in tests/test_dashboards.py, and every panel must return some data.
OPTIONAL: dict[tuple[str, str, str], str] = {
    (UID, "Length diversity and baseline ratio", "A"):
        "completions/length_std comes from a custom logging callback; TRL 1.16 does not log it",
    (UID, "Clip ratios and asymmetry", "E"):
        "asymmetry is exported only while clipping (low + high) exceeds 1%",
}


def grpo() -> dict:
    return dashboard(UID, "Post-training: GRPO",
                     "GRPO: reward std is primary, loss is relegated to anomalies.", [
        row("Run state", [
            *judgment_panels(),
            *step_stats(w=4), regime_panel(w=12),
            state("Dead reward components",
                  "1 (orange) when a reward component's within-group std is below 0.01: it no longer gives "
                  "learning signal, dead weight in the composite reward.",
                  [t(by_run("max", series("posttrain_reward_component_dead"), "component"), "{{run}} {{component}}")],
                  mappings=value_mappings([("alive", "green"), ("dead", "orange")]),
                  steps=FLAG, w=24, h=6),
            detectors_panel(),
        ]),
        row("Primary: watch constantly", [
            timeseries("Reward std and headroom",
                       "The main learning-signal indicator: the spread of rewards within a group. Healthy well "
                       "above 0.05 (headroom > 1, right axis); below it every completion scores alike, advantages "
                       "vanish and learning stops (saturation, mode collapse or a bug).",
                       [t(series("posttrain_reward_std"), "{{run}} reward std"),
                        thr("reward_std"),
                        t(series("posttrain_reward_std_headroom"), "{{run}} headroom"),
                        t(series("posttrain_reward_zero_std_ratio"), "{{run}} zero-std groups")],
                       overrides=[right(".*(headroom|zero-std).*")]),
            timeseries("Mean reward",
                       "The objective, read with caution: a rising reward with collapsing reward std or runaway "
                       "KL is reward hacking, not progress. Smoothed reward and its peak show a peak followed by "
                       "decline; the trend (right, slope per step) shows whether it still rises.",
                       reward_targets("reward"),
                       overrides=[right(".*trend.*")]),
            timeseries("KL divergence",
                       "Distance from the reference policy (beta > 0). Healthy: slow growth under 0.5; held above "
                       "0.5 warns, held above 1.0 pages. Single-step spikes beyond 1.0 (bars, right) are counted "
                       "and drawn, never alerted on: per-step KL estimates are noisy.",
                       [t(series("posttrain_kl"), "{{run}} kl"),
                        t(by_run("max", series("posttrain_window_max", 'instrument="kl"')), "{{run}} window max"),
                        thr("kl"), spikes("kl_critical", "KL > critical")],
                       overrides=[right(".*spikes.*"), override(".*spikes.*", ("custom.drawStyle", "bars"))]),
        ]),
        row("Secondary: check regularly", [
            timeseries("Completion length",
                       "Mean, min and max completion length against the run's baseline (dashed). A steady climb "
                       "suggests a length bias in the reward; a collapse to one short template is mode collapse.",
                       [t(series("posttrain_completion_length_tokens", 'stat=~"mean|min|max|mean_terminated"'),
                          "{{run}} {{stat}}"),
                        baseline("completion_length", 'stat="mean"'),
                        limit("completion_length_growing", "completion_length_shrinking")],
                       unit="none", overrides=[override(".*baseline.*", ("custom.lineStyle", {"fill": "dash",
                                                                                            "dash": [4, 4]}))]),
            timeseries("Length diversity and baseline ratio",
                       "Within-group length std (completions/length_std, when logged) and the window "
                       "stddev of the mean length: falling to ~0 means every completion looks alike. Right: the "
                       "window mean over the baseline; outside 0.7x..1.3x deserves investigation (length hacking "
                       "or collapse).",
                       [t(series("posttrain_completion_length_tokens", 'stat="std"'), "{{run}} within-group std"),
                        t(series("posttrain_window_stddev", 'instrument="completion_length"', 'stat="mean"'),
                          "{{run}} window stddev"),
                        t(series("posttrain_completion_length_baseline_ratio"), "{{run}} baseline ratio"),
                        thr("completion_length")],
                       overrides=[right(".*(baseline ratio|threshold).*")]),
            timeseries("Truncation",
                       "Share of completions cut at the maximum length (healthy under 20%) and the gap between "
                       "mean length and mean terminated length (right, tokens): truncation inflates the first.",
                       [t(series("posttrain_completion_truncated_ratio"), "{{run}} truncated"),
                        thr("completion_truncated"),
                        t(series("posttrain_completion_length_truncation_gap_tokens"), "{{run}} truncation gap")],
                       unit="percentunit", overrides=[right(".*gap.*", "none")]),
            timeseries("Clip ratios and asymmetry",
                       "The two faces of clipping. Healthy: low and high roughly balanced, total between 1% and "
                       "40%. Above 40% updates are too large; under 1% the policy barely moves. Asymmetry (right) "
                       "> 0 sharpens what the policy liked, < 0 unlearns.",
                       [t(series("posttrain_clip_ratio", 'bound=~"low|high|region"'), "{{run}} {{bound}}"),
                        t(series("posttrain_clip_combined_ratio"), "{{run}} low + high"),
                        thr("clip_total"),
                        t(series("posttrain_trend", 'instrument="clip_ratio"', 'bound="region"'),
                          "{{run}} region trend"),
                        t(series("posttrain_clip_asymmetry"), "{{run}} asymmetry")],
                       unit="percentunit", overrides=[right(".*(asymmetry|trend).*", "none")], w=12),
            timeseries("Entropy and acceleration",
                       "Exploration versus exploitation. Healthy: a slow decline from the run's own start "
                       "(baseline). Below half of it (the dashed limit) is entropy collapse; an accelerating fall "
                       "(acceleration, right axis, strongly negative) comes first.",
                       [t(series("posttrain_entropy"), "{{run}} entropy"),
                        baseline("entropy"), limit("entropy_collapse"),
                        t(series("posttrain_entropy_acceleration"), "{{run}} acceleration"),
                        t(series("posttrain_trend", 'instrument="entropy"'), "{{run}} trend")],
                       overrides=[right(".*(acceleration|trend).*")], w=12),
        ]),
        row("Tertiary: investigate on anomalies", [
            timeseries("Partial reward components",
                       "Each reward function's mean (solid) and within-group std (dotted, right). A component whose "
                       "std stays under 0.01 is dead: it no longer separates completions.",
                       [t(series("posttrain_reward_component"), "{{run}} {{component}}"),
                        t(series("posttrain_reward_component_std"), "{{run}} {{component}} std"),
                        thr("reward_component_std")],
                       overrides=[right(".*(std|threshold).*")]),
            timeseries("Loss (discontinuities only)",
                       "Loss is not a progress metric: the GRPO loss is a surrogate objective, do not watch it "
                       "trend. Look only for discontinuities: the magnitude ratio (right) outside 0.5..2 means it "
                       "suddenly halved or doubled, a numerical problem.",
                       [t(series("posttrain_loss"), "{{run}} loss"),
                        t(series("posttrain_loss_magnitude_ratio"), "{{run}} magnitude ratio"),
                        t(f"increase({series('posttrain_loss_discontinuities_total')}[$__rate_interval])",
                          "{{run}} discontinuities")],
                       overrides=[right(".*(ratio|discontinuities).*")]),
            *fundamentals(),
        ], collapsed=True),
        step_row([
            by_step("Reward std by step", "Within-group reward spread at each logged step; healthy well above 0.05.",
                    "posttrain_reward_std", "reward_std"),
            by_step("Mean reward by step", "Mean reward at each logged step.", "posttrain_reward", "reward"),
            by_step("KL by step", "KL to the reference at each logged step: 0.5 warns, 1.0 is a stop sign.",
                    "posttrain_kl", "kl"),
            by_step("Entropy by step", "Policy entropy at each logged step: a slow decline is healthy, a cliff is "
                    "collapse.", "posttrain_entropy", "entropy", w=12),
            by_step("Completion length by step", "Mean completion length (tokens) at each logged step.",
                    "posttrain_completion_length_tokens", "completion_length", 'stat="mean"', unit="none", w=12),
        ]),
    ], ["grpo"])
