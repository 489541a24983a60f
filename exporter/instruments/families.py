"""The derived gauge families, each declared once: name, HELP, what it serves, and whether it survives a resume.

instruments/derived.py sets them by these objects (so a family without help cannot be exported), the
collector takes their HELP from here, and docs/metrics.md is generated from FAMILIES."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One derived gauge family: its name, its HELP, the question about a run it helps answer
    (docs/metrics.md), and whether it outlives a resumed run's history cut (a state of the last record, not
    of the history)."""

    name: str
    help: str
    serves: str
    survives_resume: bool = False


TREND = Family(
    "posttrain_trend",
    "Least-squares slope per step over the instrument's window (steps as x).",
    "direction of every instrument: least squares over the window (np.polyfit); DPO margin trend",
)
TREND_DIRECTION = Family(
    "posttrain_trend_direction",
    "1 rising, -1 falling, 0 flat: the trend against the window's noise (|slope / stderr| >= thresholds.trend_t).",
    "is the trajectory rising, flat or falling, beyond its noise",
)
WINDOW_MEAN = Family(
    "posttrain_window_mean",
    "Mean of the instrument over its window.",
    "recent level of every instrument (window of 50 logged steps)",
)
WINDOW_STDDEV = Family(
    "posttrain_window_stddev",
    "Population stddev over the window (stability, variance).",
    "stability of an instrument: length stability and variance",
)
WINDOW_MIN = Family(
    "posttrain_window_min",
    "Minimum over the window: a dip between two scrapes stays visible.",
    "exporter: spikes between scrapes",
)
WINDOW_MAX = Family(
    "posttrain_window_max",
    "Maximum over the window: a spike between two scrapes stays visible.",
    "exporter: spikes between scrapes",
)
REWARD_STD_HEADROOM = Family(
    "posttrain_reward_std_headroom",
    "Reward std over its threshold (thresholds.reward_std_min); below 1 the learning signal is weak.",
    "learning signal: reward std against its threshold",
    survives_resume=True,
)
REWARD_COMPONENT_DEAD = Family(
    "posttrain_reward_component_dead",
    "1 when a reward component's std is below thresholds.component_std_min: it no longer gives learning signal.",
    "composite rewards: a component that no longer varies",
    survives_resume=True,
)
COMPLETION_LENGTH_BASELINE_RATIO = Family(
    "posttrain_completion_length_baseline_ratio",
    "Window mean of the mean completion length over its baseline (posttrain_baseline).",
    "generation length against its start: length bias or brevity",
)
COMPLETION_LENGTH_TRUNCATION_GAP = Family(
    "posttrain_completion_length_truncation_gap_tokens",
    "Mean length minus mean terminated length (tokens): truncation inflates the first.",
    "truncation: gap between mean length and mean terminated length",
    survives_resume=True,
)
CLIP_COMBINED = Family(
    "posttrain_clip_combined_ratio",
    "Share of tokens clipped at either bound: clip ratio low + high.",
    "size of each update: total clipping",
)
CLIP_ASYMMETRY = Family(
    "posttrain_clip_asymmetry",
    "(high - low) / (high + low) when the total exceeds 0.01: >0 the policy sharpens what it liked, <0 it unlearns.",
    "which way clipping leans: sharpening or unlearning",
)
ENTROPY_ACCELERATION = Family(
    "posttrain_entropy_acceleration",
    "Mean entropy of the window's second half minus its first half.",
    "exploration: is entropy falling faster",
)
DPO_MARGIN_CONVERGING = Family(
    "posttrain_dpo_margin_converging",
    "1 while the DPO margin trends down: chosen and rejected converge.",
    "DPO: chosen and rejected rewards converging",
)
POLICY_RATIO_DISTANCE = Family(
    "posttrain_policy_ratio_distance",
    "|policy ratio - 1|.",
    "size of each update: ratio far from 1.0",
)
REWARD_SMOOTHED = Family(
    "posttrain_reward_smoothed",
    "Mean reward over the last min_points logged steps.",
    "reward trajectory",
)
REWARD_PEAK = Family(
    "posttrain_reward_peak",
    "Highest smoothed reward so far.",
    "peak followed by decline",
)
REWARD_PEAK_STEP = Family(
    "posttrain_reward_peak_step",
    "Step of the highest smoothed reward so far: the best checkpoint.",
    "where is the best checkpoint",
)
REWARD_DRAWDOWN = Family(
    "posttrain_reward_drawdown",
    "Peak smoothed reward minus the current one.",
    "peak followed by decline",
)
REWARD_PLATEAU = Family(
    "posttrain_reward_plateau",
    "1 when the reward's rate of improvement is falling (slope of the window's second half under half the first's) "
    "without a falling trend.",
    "is the rate of improvement itself falling",
)
GENERATION_TIME_RATIO = Family(
    "posttrain_generation_time_ratio",
    "Share of step time spent generating, from the trainer's own timing keys, mean over the window.",
    "throughput: generation share of step time",
)
REGIME = Family(
    "posttrain_regime",
    "KL-versus-reward regime, judged from the trend directions of KL and reward (destructive: KL rising while "
    "reward falls); one series per regime, 1 for the current one.",
    "KL against reward: improving, drifting or destructive",
    survives_resume=True,
)
LOSS_OSCILLATING = Family(
    "posttrain_loss_oscillating",
    "1 when the loss oscillates around zero: its window mean is within noise of zero and it changes sign on at least "
    "40% of steps.",
    "pg loss oscillating around zero",
)
LOSS_MAGNITUDE_RATIO = Family(
    "posttrain_loss_magnitude_ratio",
    "Median |loss| of the last min_points steps over the median |loss| of the window before them; outside [0.5, 2], "
    "and beyond that window's 10th/90th percentile, is a discontinuity.",
    "pg loss suddenly doubled or halved",
)

FAMILIES: tuple[Family, ...] = (
    TREND,
    TREND_DIRECTION,
    WINDOW_MEAN,
    WINDOW_STDDEV,
    WINDOW_MIN,
    WINDOW_MAX,
    REWARD_STD_HEADROOM,
    REWARD_COMPONENT_DEAD,
    COMPLETION_LENGTH_BASELINE_RATIO,
    COMPLETION_LENGTH_TRUNCATION_GAP,
    CLIP_COMBINED,
    CLIP_ASYMMETRY,
    ENTROPY_ACCELERATION,
    DPO_MARGIN_CONVERGING,
    POLICY_RATIO_DISTANCE,
    REWARD_SMOOTHED,
    REWARD_PEAK,
    REWARD_PEAK_STEP,
    REWARD_DRAWDOWN,
    REWARD_PLATEAU,
    GENERATION_TIME_RATIO,
    REGIME,
    LOSS_OSCILLATING,
    LOSS_MAGNITUDE_RATIO,
)

BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
