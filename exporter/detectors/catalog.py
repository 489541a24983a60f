"""Every detector as data: what it reads, when its condition holds, how many logged steps it must hold,
its severity and the alert that reports it. The alert rules (rules/posttrain.alerts.yml), the runbooks'
headings and docs/derived.md's table are generated from or checked against this table.

A condition is judged at each logged point of the detector's input, on a robust recent level (a short
median or mean of the last few points, so one noisy step is not a state) against a limit: an absolute
number where a level means about the same on every run (the project's defaults, all configurable), else a
multiple of the run's own baseline (the median of its first logged points), where the healthy level depends
on the task. docs/derived.md says where each limit comes from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from exporter.detectors.streams import StreamView
from exporter.instruments.settings import Thresholds

SeriesKey = tuple[str, str | None]
Severity = Literal["critical", "warning"]

# Inputs the detectors read. Besides the canonical series, two made per record by the engine:
CLIP_TOTAL: SeriesKey = ("clip_total", None)  # clip_ratio low + high (or region), one point per record
NONFINITE: SeriesKey = ("nonfinite", None)  # 1 where a record's loss or KL is NaN or infinite, else 0
KL: SeriesKey = ("kl", None)
REWARD: SeriesKey = ("reward", None)
REWARD_STD: SeriesKey = ("reward_std", None)
ENTROPY: SeriesKey = ("entropy", None)
LENGTH: SeriesKey = ("completion_length", "mean")
LENGTH_STD: SeriesKey = ("completion_length", "std")
TRUNCATED: SeriesKey = ("completion_truncated", None)
CHOSEN: SeriesKey = ("dpo_reward", "chosen")
MARGIN: SeriesKey = ("dpo_reward", "margin")
ACCURACY: SeriesKey = ("dpo_accuracy", None)
LOSS: SeriesKey = ("loss", None)
GRAD_NORM: SeriesKey = ("grad_norm", None)
ZERO_STD: SeriesKey = ("reward_zero_std", None)
POLICY_RATIO: SeriesKey = ("policy_ratio", None)
CLIP_FRACTION: SeriesKey = ("clip_fraction", None)
COMPONENT_STD = "reward_component_std"  # per component: one detector state per sub-label value
COMPONENT = "reward_component"  # per component: its mean
# Read from the trainer's printed completions (exporter/samples/diversity.py), one point per sample set:
TOP_PROMPT_SHARE: SeriesKey = ("completion_diversity", "top_prompt_share")
TOP_SHARE: SeriesKey = ("completion_diversity", "top_share")

# The quantile of an input's first points that is its baseline, where the median would not be its level:
# GRPO logs a zero gradient norm on every step where all groups tie (no advantage, no update), and a run
# whose signal is rare at first would get a baseline of ~0; the upper quartile is the size of a real update.
BASELINE_QUANTILE: dict[SeriesKey, float] = {("grad_norm", None): 0.75}

# Carried facts about a run's start (`start:` keys survive a resume after them: (..., the step they were
# complete at) is their last element).
START_LOSS = "start:loss"

SHORT = 5  # points of the short median: three of the last five beyond a limit make a level
# Inputs that are zero on many single steps of a healthy run (reward std with a few groups per batch)
# are judged by the share of recent points beyond their limit, which one outlier cannot move much:
SHARE_POINTS = 10
SHARE_HELD = 0.9  # the state holds while at least this share of the last SHARE_POINTS is beyond the limit
SHARE_ENDED = 0.5  # and has ended once no more than this share is
SIGNAL = 10  # points of the mean of zero-inflated inputs (reward std, clipping): a few groups tie often
DEAD_GRAD_SHARE = 0.7  # a dead learning signal: the gradient norm exactly 0 at this share of its last SIGNAL points
TREND = 50  # points of a trend: as the derived series' default window
TREND_MIN = 10  # a trend needs at least this many points: as the window's min_points


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A detector's judgment at each of a batch's points of its input."""

    steps: np.ndarray
    cond: np.ndarray  # the condition holds
    value: np.ndarray  # the level judged
    limit: np.ndarray  # what it is judged against
    raw: np.ndarray | None = None  # the point's own value beyond the limit (for spikes)
    clear: np.ndarray | None = None  # the state has ended at this point (default: the condition fails)


class BatchContext:
    """What an evaluator reads: the views of this batch's inputs, the thresholds, state carried from the
    batches before (the reward's peak, other inputs' last values), and whether the run samples and
    scores completions (it logs a reward)."""

    def __init__(self, views: dict[SeriesKey, StreamView], thresholds: Thresholds, carry: dict[str, tuple],
                 rl: bool, clear_margin: float = 0.0) -> None:
        self.views = views
        self.t = thresholds
        self.clear_margin = clear_margin
        self.carry = carry
        self.rl = rl
        self._as_of: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def view(self, key: SeriesKey) -> StreamView | None:
        v = self.views.get(key)
        return v if v is not None and len(v.new_values) else None

    def direction(self, t: np.ndarray) -> np.ndarray:
        """1 rising, -1 falling, 0 flat: a trend's t-statistic against thresholds.trend_t."""
        return np.where(t >= self.t.trend_t, 1, np.where(t <= -self.t.trend_t, -1, 0))

    def as_of(self, name: str, key: SeriesKey, stat: Callable[[StreamView], np.ndarray],
              steps: np.ndarray) -> np.ndarray:
        """Another input's statistic as of each step (its last point at or before the step; NaN before
        it has one), continued from the batches before."""
        if name not in self._as_of:
            last_step, last_value = self.carry.get(name, (-1, np.nan))
            other = self.view(key)
            o_steps, o_vals = np.array([last_step]), np.array([last_value], dtype=float)
            if other is not None:
                o_steps = np.concatenate([o_steps, other.new_steps])
                o_vals = np.concatenate([o_vals, stat(other).astype(float)])
            self._as_of[name] = (o_steps, o_vals)
        o_steps, o_vals = self._as_of[name]
        at = np.searchsorted(o_steps, steps, side="right") - 1
        return np.where(at >= 0, o_vals[np.maximum(at, 0)], np.nan)

    def commit(self) -> None:
        """Carry the last value of every statistic read through as_of into the next batch."""
        for name, (o_steps, o_vals) in self._as_of.items():
            self.carry[name] = (int(o_steps[-1]), float(o_vals[-1]))


Evaluator = Callable[[BatchContext, StreamView], Evaluation | None]


@dataclass(frozen=True)
class Detector:
    name: str
    alert: str  # the Prometheus alert that reports it
    severity: Severity
    instrument: str  # the `instrument` label of its alert: what a page or warning is about
    input: SeriesKey | str  # judged at each logged point of this input (a str: per sub-label of that instrument)
    evaluate: Evaluator
    required: int  # logged points the condition must hold (config: detectors.<name>.steps)
    help: str  # what it judges, for HELP texts and docs
    basis: str  # why the condition and its limit are what they are, with a public source where one exists
    summary: str  # the alert's summary; {run} is the run
    saw: str  # what it saw, for the alert's description: {value} and {limit} are the level and its limit,
    #           {threshold.<name>} a threshold of the run
    meaning: str  # what that means for the run, and what to do
    reads: tuple[SeriesKey, ...] = ()  # other inputs the evaluator reads (their streams are kept)
    clear: int | None = None  # points a state must have ended to clear; None: detectors.clear_steps
    percent: bool = False  # value and limit are shares (0..1), written as percentages
    band: bool = False  # the limit is in the input's own units: charts draw it as a line beside the input


# --- evaluators -------------------------------------------------------------------------------------------


def _above(ctx: BatchContext, view: StreamView, level: np.ndarray, limit: float | np.ndarray) -> Evaluation:
    """The level above the limit; the state ends once the level is back below it by the clear margin."""
    limit = np.broadcast_to(np.asarray(limit, dtype=float), level.shape)
    with np.errstate(invalid="ignore"):
        back = limit - ctx.clear_margin * np.abs(limit)
        return Evaluation(view.new_steps, level > limit, level, limit, view.new_values > limit,
                          ~(level >= back))


def _below(ctx: BatchContext, view: StreamView, level: np.ndarray, limit: float | np.ndarray) -> Evaluation:
    """The level below the limit; the state ends once the level is back above it by the clear margin."""
    limit = np.broadcast_to(np.asarray(limit, dtype=float), level.shape)
    with np.errstate(invalid="ignore"):
        back = limit + ctx.clear_margin * np.abs(limit)
        return Evaluation(view.new_steps, level < limit, level, limit, view.new_values < limit,
                          ~(level <= back))


def kl_critical(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SHORT, "median"), ctx.t.kl_critical)


def kl_high(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SHORT, "median"), ctx.t.kl_warning)


def kl_near_zero(ctx: BatchContext, v: StreamView) -> Evaluation:
    top = np.full(len(v.new_values), np.nan)
    ends = np.arange(v.start + 1, len(v.values) + 1)
    full = ends >= TREND
    if full.any():
        top[full] = np.lib.stride_tricks.sliding_window_view(v.values, TREND)[ends[full] - TREND].max(axis=1)
    ev = _below(ctx, v, top, ctx.t.kl_near_zero)
    return Evaluation(ev.steps, ev.cond, ev.value, ev.limit, clear=ev.clear)  # a low KL step is no excursion


def _share_below(v: StreamView, limit: float, points: int = SHARE_POINTS) -> Evaluation:
    """The share of the last `points` values below `limit`, at each new point (NaN with fewer logged)."""
    below = StreamView(v.steps, (v.values < limit).astype(float), v.start, v.baseline)
    share = below.rolling(points, "mean")
    with np.errstate(invalid="ignore"):
        return Evaluation(v.new_steps, share >= SHARE_HELD, share, np.full(len(share), SHARE_HELD),
                          v.new_values < limit, ~(share > SHARE_ENDED))


def reward_std_collapsed(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _share_below(v, ctx.t.reward_std_min)


def reward_std_falling(ctx: BatchContext, v: StreamView) -> Evaluation:
    """Before it reaches the absolute floor: the signal's mean has lost most of the run's early level."""
    ev = _below(ctx, v, v.rolling(2 * SIGNAL, "mean"), ctx.t.reward_std_drop * v.baseline)
    return Evaluation(ev.steps, ev.cond, ev.value, ev.limit, clear=ev.clear)


def _regime(ctx: BatchContext, v: StreamView, kl_dir: int, reward_dir: int) -> Evaluation:
    """At each reward point: the direction of the reward's trend, and of KL's trend as of that step (KL
    falling counts as stable: the policy is not moving further from the reference). Only once KL itself is
    above thresholds.kl_warning: every run's KL rises from zero over its first steps, and a run that has
    barely moved from its reference is neither destructive nor finished."""
    reward_dirs = ctx.direction(v.trend_t(TREND, TREND_MIN))
    kl_dirs = ctx.as_of("kl_direction", KL, lambda kv: ctx.direction(kv.trend_t(TREND, TREND_MIN)), v.new_steps)
    kl_level = ctx.as_of("kl_median", KL, lambda kv: kv.rolling(SHORT, "median"), v.new_steps)
    enough = np.arange(v.start + 1, len(v.values) + 1) >= TREND_MIN
    with np.errstate(invalid="ignore"):
        drifted = kl_level > ctx.t.kl_warning
    cond = enough & drifted & (np.maximum(kl_dirs, 0) == kl_dir) & (reward_dirs == reward_dir)
    return Evaluation(v.new_steps, cond, reward_dirs.astype(float), np.full(len(cond), float(reward_dir)))


def destructive_regime(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _regime(ctx, v, 1, -1)


def drifting_without_gain(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _regime(ctx, v, 1, 0)


NONFINITE_OF = (2, 3)  # a record's loss or KL not a number, and so were 2 of the last 3 records (this one included)


def nonfinite(ctx: BatchContext, v: StreamView) -> Evaluation:
    """Consecutive records (a diverged run) and a failure on every other step alike; one overflow step alone never
    (fp16 loss scaling skips such a step and goes on)."""
    needed, of = NONFINITE_OF
    sums = np.cumsum(np.concatenate([[0.0], v.values]))
    ends = np.arange(v.start + 1, len(v.values) + 1)
    recent = sums[ends] - sums[np.maximum(ends - of, 0)]  # nonfinite records among the last `of` (fewer at the start)
    new = v.new_values
    fire = (new > 0) & (recent >= needed)
    if "nonfinite_first" not in ctx.carry and fire.any():
        # where the first failure began: the first step of the window that made it fire (the report's checkpoint to
        # keep is before it; the episode's own start is the step it fired at)
        at = v.start + int(np.argmax(fire))
        lo = max(at - of + 1, 0)
        first = lo + int(np.argmax(v.values[lo:at + 1] > 0))
        ctx.carry["nonfinite_first"] = (int(v.steps[at]), int(v.steps[first]))
    # cleared once the last `of` records are all numbers: every other step failing keeps it active, not flapping
    return Evaluation(v.new_steps, fire, new, np.zeros(len(new)), clear=recent == 0)


def reward_peaked_and_fell(ctx: BatchContext, v: StreamView) -> Evaluation:
    """The smoothed reward below the best smoothed reward so far by more than twice the reward's noise."""
    smooth = v.rolling(TREND_MIN, "mean")
    prev = ctx.carry.get("reward_peak", (-np.inf,))[0]
    peak = np.maximum.accumulate(np.concatenate([[prev], np.where(np.isnan(smooth), -np.inf, smooth)]))[1:]
    ctx.carry["reward_peak"] = (float(peak[-1]),)
    drawdown = peak - smooth
    limit = 2 * v.rolling_std(TREND_MIN * 2)
    with np.errstate(invalid="ignore"):
        cond = np.isfinite(drawdown) & (drawdown > limit)
    return Evaluation(v.new_steps, cond, drawdown, limit)


def learning_signal_dead(ctx: BatchContext, v: StreamView) -> Evaluation:
    """Most completion groups tie (the mean share of the last 10 logged points at or above thresholds.zero_std_max)
    and the gradient norm is exactly zero at 7 of its last 10 logged points: GRPO without a KL term learns
    nothing on those steps, whatever the mean reward std of the few groups that still differ says. A run with a
    KL term keeps a small gradient on tied steps (and a healthy run with four groups a batch ties often): there
    the reward-std detectors judge."""
    level = v.rolling(SIGNAL, "mean")
    zero_grad = ctx.as_of("grad_zero_share", GRAD_NORM, lambda g: StreamView(
        g.steps, (g.values == 0).astype(float), g.start, g.baseline).rolling(SIGNAL, "mean"), v.new_steps)
    limit = np.full(len(level), ctx.t.zero_std_max)
    with np.errstate(invalid="ignore"):
        cond = (level >= limit) & (zero_grad >= DEAD_GRAD_SHARE)
        return Evaluation(v.new_steps, cond, level, limit, clear=~((level >= limit) & (zero_grad > 0)))


def component_dead(ctx: BatchContext, v: StreamView) -> Evaluation:
    """A reward component that gave signal at the run's start and almost never does now: below its floor at 18 of
    its last 20 logged points, or at 9 of its last 10 where the whole reward's std has collapsed too (9 of 10, as
    reward_std_collapsed judges it), so a component that carries the only signal is found as soon as the reward's
    collapse is. A component of a reward whose other parts still vary is given the longer window: a healthy run's
    format reward saturates for a while and comes back."""
    slow = _share_below(v, ctx.t.component_std_min, 2 * SHARE_POINTS)
    fast = _share_below(v, ctx.t.component_std_min)
    total = ctx.as_of("reward_std_share_low", REWARD_STD, lambda rv: _share_below(rv, ctx.t.reward_std_min).value,
                      v.new_steps)
    with np.errstate(invalid="ignore"):
        alive_once = v.baseline > ctx.t.component_std_min
        quick = fast.cond & (total >= SHARE_HELD)
    cond = (slow.cond | quick) & alive_once
    value = np.where(quick, fast.value, slow.value)
    return Evaluation(slow.steps, cond, value, slow.limit, slow.raw & alive_once,
                      (slow.clear & fast.clear) | ~alive_once)


SILENT_POINTS = 20  # a silent component: exactly 0 at SILENT_SHARE of its last this many logged points ...
SILENT_SHARE = 0.8


def component_silent(ctx: BatchContext, v: StreamView) -> Evaluation:
    """A reward component that never fired: its baseline (the median of its first logged steps) is exactly 0 and it
    is exactly 0 at SILENT_SHARE of its last SILENT_POINTS logged points. One that fired at the start and died is
    reward_component_dead's; a negative penalty that is 0 when nothing is penalised starts at 0 too, which is why a
    warning, not a page (the judgment weighs it against what the other components did)."""
    zero = StreamView(v.steps, (v.values == 0).astype(float), v.start, v.baseline)
    share = zero.rolling(SILENT_POINTS, "mean")
    with np.errstate(invalid="ignore"):
        never = v.baseline == 0
        return Evaluation(v.new_steps, never & (share >= SILENT_SHARE), share, np.full(len(share), SILENT_SHARE),
                          clear=~(share > SHARE_ENDED) | ~never)


def clipping_excessive(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SIGNAL, "mean"), ctx.t.clip_excessive)


def clipping_high(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SIGNAL, "mean"), ctx.t.clip_high)


def clipping_rising(ctx: BatchContext, v: StreamView) -> Evaluation:
    """Clipping well above the run's early level and still rising: updates grow more aggressive."""
    level = v.rolling(SIGNAL, "mean")
    limit = np.maximum(ctx.t.clip_rise_factor * v.baseline, ctx.t.clip_min)
    rising = ctx.direction(v.trend_t(TREND, TREND_MIN)) > 0
    with np.errstate(invalid="ignore"):
        cond = (level > limit) & rising
    return Evaluation(v.new_steps, cond, level, limit)


def clipping_stopped(ctx: BatchContext, v: StreamView) -> Evaluation:
    """A run that clipped at its start and almost no longer does (one that never clipped is on-policy)."""
    level = v.rolling(SIGNAL, "mean")
    with np.errstate(invalid="ignore"):
        cond = (v.baseline >= ctx.t.clip_rise_factor * ctx.t.clip_min) & (level < ctx.t.clip_min)
    return Evaluation(v.new_steps, cond, level, np.full(len(level), ctx.t.clip_min))


def policy_ratio_out_of_range(ctx: BatchContext, v: StreamView) -> Evaluation:
    level = v.rolling(SHORT, "median")
    lo, hi = ctx.t.policy_ratio_low, ctx.t.policy_ratio_high
    with np.errstate(invalid="ignore"):
        cond = (level > hi) | (level < lo)
        raw = (v.new_values > hi) | (v.new_values < lo)
    return Evaluation(v.new_steps, cond, level, np.where(level > hi, hi, lo), raw)


def _moved(ev: Evaluation, v: StreamView, up: bool) -> Evaluation:
    """A movement away from the run's start holds only where the level is also beyond the input's first logged
    value in that direction: whatever the baseline, a level below where the run began is never reported as
    growth (nor one above it as a fall)."""
    with np.errstate(invalid="ignore"):
        beyond = ev.value > v.first if up else ev.value < v.first
    keep = beyond | np.isnan(v.first)
    return Evaluation(ev.steps, ev.cond & keep, ev.value, ev.limit, None if ev.raw is None else ev.raw & keep,
                      ev.clear if ev.clear is None else ev.clear | ~keep)


def entropy_collapse(ctx: BatchContext, v: StreamView) -> Evaluation | None:
    if not ctx.rl:  # SFT and DPO entropy falls as the model fits its data: that is their point
        return None
    return _moved(_below(ctx, v, v.rolling(SHORT, "median"), ctx.t.entropy_drop * v.baseline), v, up=False)


def template_collapse(ctx: BatchContext, v: StreamView) -> Evaluation:
    """One completion answering most distinct prompts and filling most rows, on the median of the last 5 sample
    sets: the text itself has collapsed, whatever the metrics say."""
    t = ctx.t
    level = v.rolling(SHORT, "median")
    rows = ctx.as_of("top_share_median", TOP_SHARE, lambda tv: tv.rolling(SHORT, "median"), v.new_steps)
    keep = 1.0 - ctx.clear_margin
    with np.errstate(invalid="ignore"):
        cond = (level >= t.template_prompt_share) & (rows >= t.template_row_share)
        ended = (level < keep * t.template_prompt_share) | (rows < keep * t.template_row_share)
    return Evaluation(v.new_steps, cond, level, np.full(len(level), t.template_prompt_share), clear=ended)


def length_growing(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _moved(_above(ctx, v, v.rolling(SHORT, "median"), ctx.t.length_ratio_high * v.baseline), v, up=True)


def length_shrinking(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _moved(_below(ctx, v, v.rolling(SHORT, "median"), ctx.t.length_ratio_low * v.baseline), v, up=False)


def length_diversity_collapsing(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _moved(_below(ctx, v, v.rolling(SHORT, "median"), ctx.t.length_std_drop * v.baseline), v, up=False)


def truncated(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SHORT, "median"), ctx.t.truncated_max)


def dpo_displacement(ctx: BatchContext, v: StreamView) -> Evaluation:
    """The chosen answers' implicit reward falling below the reference while the margin still grows:
    the policy pushes both answers down (likelihood displacement)."""
    level = v.rolling(SHORT, "median")
    margin = ctx.as_of("margin_median", MARGIN, lambda mv: mv.rolling(SHORT, "median"), v.new_steps)
    with np.errstate(invalid="ignore"):
        cond = (level < ctx.t.dpo_chosen_min) & (margin > 0)
    return Evaluation(v.new_steps, cond, level, np.full(len(level), ctx.t.dpo_chosen_min),
                      v.new_values < ctx.t.dpo_chosen_min)


def dpo_saturated(ctx: BatchContext, v: StreamView) -> Evaluation:
    """A DPO-family run that has separated its training pairs: accuracy 1 and the loss near 0 (medians of the last
    5 logged steps) while the margin is not falling over its window (a falling margin is
    dpo_rewards_converging's). The gradient now only pushes margins apart, whether they still visibly rise or
    already sit far beyond what the loss can tell."""
    level = v.rolling(SHORT, "median")
    loss = ctx.as_of("loss_median", LOSS, lambda lv: lv.rolling(SHORT, "median"), v.new_steps)
    margin_dir = ctx.as_of("margin_direction", MARGIN,
                           lambda mv: ctx.direction(mv.trend_t(TREND, TREND_MIN)).astype(float), v.new_steps)
    with np.errstate(invalid="ignore"):
        cond = (level >= 1.0) & (loss < ctx.t.dpo_loss_saturated) & (margin_dir >= 0)
    return Evaluation(v.new_steps, cond, loss, np.full(len(level), ctx.t.dpo_loss_saturated))


def dpo_chosen_unbounded(ctx: BatchContext, v: StreamView) -> Evaluation:
    """Chosen rewards that keep climbing past a bound: the objective being exploited in DPO."""
    level = v.rolling(SHORT, "median")
    rising = ctx.direction(v.trend_t(TREND, TREND_MIN)) > 0
    with np.errstate(invalid="ignore"):
        cond = rising & (level > ctx.t.dpo_chosen_max)
    return Evaluation(v.new_steps, cond, level, np.full(len(level), ctx.t.dpo_chosen_max))


def dpo_margin_unstable(ctx: BatchContext, v: StreamView) -> Evaluation:
    """The margin's noise as large as its level over the recent points: unstable optimisation."""
    noise, level = v.rolling_std(SIGNAL * 2), v.rolling(SIGNAL * 2, "mean")
    with np.errstate(invalid="ignore"):
        cond = noise > ctx.t.dpo_margin_noise * np.abs(level)
    return Evaluation(v.new_steps, cond, noise, ctx.t.dpo_margin_noise * np.abs(level))


def dpo_rewards_converging(ctx: BatchContext, v: StreamView) -> Evaluation:
    """The margin falling steadily: chosen and rejected rewards approach each other."""
    t = v.trend_t(TREND, TREND_MIN)
    return Evaluation(v.new_steps, ctx.direction(t) < 0, t, np.full(len(t), -ctx.t.trend_t))


def loss_sign_flip(ctx: BatchContext, v: StreamView) -> Evaluation:
    """The loss, clearly positive over the run's first 10 points, now clearly negative: its mean over the
    last 10 more than two standard errors below zero. A loss that merely hovers around zero (the GRPO
    surrogate) is neither, and flips sign all the time."""
    if START_LOSS not in ctx.carry:
        seen = ctx.carry.get("loss_points", (0,))[0]
        ctx.carry["loss_points"] = (seen + len(v.new_values),)
        if seen + len(v.new_values) >= SIGNAL:
            first = v.values[v.start - seen :][:SIGNAL]
            step10 = int(v.steps[v.start - seen + SIGNAL - 1])
            ctx.carry[START_LOSS] = (float(first.mean() > 2 * first.std() / np.sqrt(SIGNAL)), step10)
    mean, std = v.rolling(SIGNAL, "mean"), v.rolling_std(SIGNAL)
    limit = -2 * std / np.sqrt(SIGNAL)
    started_positive = ctx.carry.get(START_LOSS, (0.0,))[0] > 0
    with np.errstate(invalid="ignore"):
        cond = started_positive & (mean < limit)
    return Evaluation(v.new_steps, cond, mean, limit)


def grad_norm_high(ctx: BatchContext, v: StreamView) -> Evaluation:
    return _above(ctx, v, v.rolling(SHORT, "median"), ctx.t.grad_norm_spike_factor * v.baseline)


DETECTORS: tuple[Detector, ...] = (
    # --- pages: the stop signs, sustained -----------------------------------------------------------------
    Detector(
        "kl_critical", "PostTrainKLCritical", "critical", "kl", KL, kl_critical, 3,
        help="KL to the reference: median of the last 5 logged steps above thresholds.kl_critical.",
        basis="project default: KL to the reference above 1.0 per token, twice the warning level, is a stop sign",
        summary="KL divergence held beyond the stop threshold in run {run}.",
        saw="the median KL to the reference over its last 5 logged steps is {value}, above the stop threshold "
            "of {limit}",
        meaning="The policy has drifted far from the reference, and not on one noisy step: KL > 1.0 is a stop "
                "sign. Single-step spikes are counted (posttrain_detector_spikes_total) and do not page.", band=True),
    Detector(
        "reward_std_collapsed", "PostTrainRewardStdCollapsed", "critical", "reward_std", REWARD_STD,
        reward_std_collapsed, 1,
        help="Reward std within groups below thresholds.reward_std_min at 9 of the last 10 logged steps "
             "(value: that share).",
        basis="GRPO learns only from groups whose rewards differ (DeepSeekMath, arXiv:2402.03300)",
        summary="GRPO learning signal collapsed in run {run}.",
        saw="reward std within completion groups was below {threshold.reward_std_min} at {value} of its last 10 "
            "logged steps", percent=True,
        meaning="The completions of a group score alike, so GRPO's advantages are zero and there is nothing "
                "left to learn from: saturation, mode collapse or a bug."),
    Detector(
        "learning_signal_dead", "PostTrainLearningSignalDead", "critical", "reward_zero_std", ZERO_STD,
        learning_signal_dead, 1,
        help="Share of completion groups whose rewards all tie: mean of the last 10 logged steps at or above "
             "thresholds.zero_std_max, with the gradient norm exactly 0 at 7 of its last 10 logged steps.",
        basis="GRPO's advantage is a reward's deviation within its group (DeepSeekMath, arXiv:2402.03300): a group "
              "whose rewards all tie gives none, which is why DAPO (arXiv:2503.14476) filters such groups out",
        summary="GRPO learning signal is dead in run {run}.",
        saw="{value} of completion groups scored alike (mean of its last 10 logged steps, limit {limit}) and the "
            "gradient norm was exactly 0 at 7 or more of its last 10 logged steps", percent=True,
        meaning="Most groups give no advantage and the updates are zero: the run spends its compute learning "
                "nothing, even where the mean reward std of the groups that still differ looks alive. The task "
                "is too easy or too hard for the policy, or the reward cannot tell completions apart.",
        reads=(GRAD_NORM,)),
    Detector(
        "destructive_regime", "PostTrainDestructiveRegime", "critical", "regime", REWARD, destructive_regime, 5,
        help="KL above thresholds.kl_warning and rising while the reward falls (trends over their windows, "
             "against their noise).",
        basis="KL is the price of reward (InstructGPT, arXiv:2203.02155): paying more for less is destructive",
        summary="KL rising while reward falls in run {run}: training is actively destructive.",
        saw="KL to the reference is above the warning threshold and rising, and the reward is falling over "
            "their windows of logged steps",
        meaning="The model is getting worse and moving away from a known-good reference: stop, and keep the "
                "checkpoint the judgment names (posttrain_checkpoint_keep_step).", reads=(KL,)),
    Detector(
        "nonfinite_loss_or_kl", "PostTrainNonFiniteLossOrKL", "critical", "loss", NONFINITE, nonfinite, 1,
        help="Loss or KL logged as NaN or infinite on 2 of the last 3 logged steps (consecutive ones, or every "
             "other step).",
        basis="numerical failure: the steps after it train on garbage",
        summary="Loss or KL is not a number in run {run}.",
        saw="the loss or the KL was logged as NaN or infinite",
        meaning="A numerical failure (overflow, division by a near-zero group std, a diverged update): the "
                "steps after it train on garbage."),
    # --- warnings ------------------------------------------------------------------------------------------
    Detector(
        "kl_high", "PostTrainKLWarning", "warning", "kl", KL, kl_high, 3,
        help="KL to the reference: median of the last 5 logged steps above thresholds.kl_warning.",
        basis="project default: KL to the reference above 0.5 per token is a policy drifting far",
        summary="KL divergence held above the warning threshold in run {run}.",
        saw="the median KL to the reference over its last 5 logged steps is {value}, above {limit}",
        meaning="The policy is drifting from the reference; check that the reward is still honest.", band=True),
    Detector(
        "kl_near_zero", "PostTrainKLNearZero", "warning", "kl", KL, kl_near_zero, 1,
        help="KL to the reference below thresholds.kl_near_zero at every one of the last 50 logged steps.",
        basis="a policy that never moves from its reference is not being trained",
        summary="KL stays near zero in run {run}: the policy is barely moving.",
        saw="KL to the reference stayed at or below {value} over its last 50 logged steps (limit {limit})",
        meaning="The KL penalty (beta) is probably too high or the learning rate too low."),
    Detector(
        "drifting_without_gain", "PostTrainDriftingWithoutGain", "warning", "regime", REWARD,
        drifting_without_gain, 10,
        help="KL above thresholds.kl_warning and rising while the reward is flat (trends over their windows).",
        basis="drift without gain: the training has run its course",
        summary="KL rising with a flat reward in run {run}: the training has run its course.",
        saw="KL to the reference is above the warning threshold and keeps rising while the reward is flat over "
            "their windows of logged steps",
        meaning="The policy drifts without getting better; the realistic upside of continuing is near zero.",
        reads=(KL,)),
    Detector(
        "reward_peaked_and_fell", "PostTrainRewardPeakedAndFell", "warning", "reward", REWARD,
        reward_peaked_and_fell, 10,
        help="The smoothed reward (mean of 10) below its best by more than twice its recent stddev.",
        basis="a peak followed by a decline beyond the reward's noise: the best checkpoint is behind",
        summary="Reward peaked and fell in run {run}.",
        saw="the smoothed reward is {value} below its best so far, more than twice its recent noise ({limit})",
        meaning="The model was better earlier: keep the checkpoint the judgment names "
                "(posttrain_checkpoint_keep_step); continuing is actively harmful."),
    Detector(
        "reward_std_falling", "PostTrainRewardStdFalling", "warning", "reward_std", REWARD_STD,
        reward_std_falling, 3,
        help="Reward std: mean of the last 20 logged steps below thresholds.reward_std_drop x its baseline.",
        basis="the learning signal fading, warned before it is gone (DAPO, arXiv:2503.14476, filters such groups)",
        summary="Reward std is falling towards zero in run {run}.",
        saw="reward std within completion groups averages {value} over its last 20 logged steps, below {limit} "
            "({threshold.reward_std_drop} of its level at the run's start)",
        meaning="The model is saturating before the signal is gone: the most common GRPO failure mode.", band=True),
    Detector(
        "reward_component_dead", "PostTrainRewardComponentDead", "warning", "reward_component_std",
        COMPONENT_STD, component_dead, 1, reads=(REWARD_STD,),
        help="A reward component whose std was above thresholds.component_std_min at the run's start and is "
             "below it at 18 of the last 20 logged steps (at 9 of the last 10 where the reward's std collapsed too).",
        basis="a reward function that no longer varies within groups no longer ranks completions",
        summary="Reward component {component} no longer gives learning signal in run {run}.",
        saw="the std of reward component {component} within groups was below {threshold.component_std_min} at "
            "{value} of its last 20 logged steps (of its last 10 where the whole reward's std collapsed too), "
            "although it varied at the run's start", percent=True,
        meaning="The component is saturated and now dead weight in the composite reward."),
    Detector(
        "reward_component_silent", "PostTrainRewardComponentSilent", "warning", "reward_component", COMPONENT,
        component_silent, 1,
        help="A reward component whose mean was exactly 0 at the run's start (its baseline) and is exactly 0 at 16 "
             "of its last 20 logged steps (value: that share).",
        basis="a reward function that scores no completion ranks none: GRPO's advantages are deviations within a "
              "group (DeepSeekMath, arXiv:2402.03300), so it adds nothing the policy can learn from",
        summary="Reward component {component} never fired in run {run}.",
        saw="reward component {component} scored exactly 0 at {value} of its last 20 logged steps, as at the run's "
            "start", percent=True,
        meaning="This reward function gives no learning signal: the task it scores is out of the policy's reach "
                "(too hard, a wrong answer format, a parsing bug in the reward), and any rise of the total reward "
                "comes from the other components. Read the judgment: if they were near their ceiling from the "
                "start, the run is not learning its task."),
    Detector(
        "clipping_excessive", "PostTrainClippingExcessive", "warning", "clip_total", CLIP_TOTAL,
        clipping_excessive, 3,
        help="Ratio clipping (low + high): mean of the last 10 logged steps above thresholds.clip_excessive.",
        basis="PPO's clipped objective (arXiv:1707.06347): 40% of tokens at the clip bound is excessive",
        summary="Excessive ratio clipping in run {run}.",
        saw="{value} of tokens were clipped (low + high, mean of its last 10 logged steps), above {limit}",
        percent=True, meaning="The learning rate is probably too high for the trust region."),
    Detector(
        "clipping_high", "PostTrainClippingHigh", "warning", "clip_total", CLIP_TOTAL, clipping_high, 3,
        help="Ratio clipping (low + high): mean of the last 10 logged steps above thresholds.clip_high.",
        basis="PPO's clipped objective (arXiv:1707.06347): a third of tokens at the clip bound is too much",
        summary="Most updates are clipped in run {run}.",
        saw="{value} of tokens were clipped (low + high, mean of its last 10 logged steps), above {limit}",
        percent=True, meaning="The learning rate is too high relative to epsilon."),
    Detector(
        "clipping_rising", "PostTrainClippingRising", "warning", "clip_total", CLIP_TOTAL, clipping_rising, 5,
        help="Ratio clipping: mean of the last 10 above thresholds.clip_rise_factor x its baseline, and rising.",
        basis="clipping growing against the run's start: updates ever more aggressive, before KL blows up",
        summary="Clipping keeps growing in run {run}.",
        saw="ratio clipping averages {value} over its last 10 logged steps, above {limit} "
            "({threshold.clip_rise_factor}x its level at the run's start), and is rising", percent=True,
        meaning="The optimisation is becoming more aggressive; this often precedes a KL explosion."),
    Detector(
        "clipping_stopped", "PostTrainClippingStopped", "warning", "clip_total", CLIP_TOTAL, clipping_stopped, 10,
        help="Ratio clipping: a run that clipped at its start, now under thresholds.clip_min.",
        basis="under 1% clipped in a run that clipped: updates have become too conservative",
        summary="Ratio clipping stopped in run {run}.",
        saw="ratio clipping averages {value} over its last 10 logged steps, under {limit}, although the run "
            "clipped at its start", percent=True,
        meaning="Policy updates have become very conservative (a decayed learning rate), or something else is "
                "wrong."),
    Detector(
        "ppo_clipping_high", "PostTrainPPOClippingHigh", "warning", "clip_fraction", CLIP_FRACTION,
        clipping_high, 3,
        help="PPO clip fraction: mean of the last 10 logged steps above thresholds.clip_high.",
        basis="PPO's clipped objective (arXiv:1707.06347): a third of updates clipped is too much",
        summary="Most PPO updates are clipped in run {run}.",
        saw="the clip fraction averages {value} over its last 10 logged steps, above {limit}", percent=True,
        meaning="The learning rate is too high relative to epsilon."),
    Detector(
        "policy_ratio_out_of_range", "PostTrainPolicyRatioOutOfRange", "warning", "policy_ratio",
        POLICY_RATIO, policy_ratio_out_of_range, 3,
        help="Policy ratio: median of the last 5 logged steps outside [policy_ratio_low, policy_ratio_high].",
        basis="a ratio halved or doubled is far outside PPO's clip range (arXiv:1707.06347)",
        summary="Policy ratio far from 1.0 in run {run}.",
        saw="the median ratio of current to old policy probabilities over its last 5 logged steps is {value}, "
            "beyond {limit}",
        meaning="Consecutive policy updates are too drastic: reduce the learning rate."),
    Detector(
        "entropy_collapse", "PostTrainEntropyCollapse", "warning", "entropy", ENTROPY, entropy_collapse, 3,
        help="Policy entropy: median of the last 5 logged steps below thresholds.entropy_drop x its baseline "
             "(runs that log a reward).",
        basis="entropy collapse closes exploration (DAPO, arXiv:2503.14476); relative, as levels differ by task",
        summary="Policy entropy collapsed in run {run}.",
        saw="the median token entropy over its last 5 logged steps is {value}, below {limit} "
            "({threshold.entropy_drop} of its level at the run's start)",
        meaning="The model is becoming too confident too quickly; this often precedes mode collapse.", band=True),
    Detector(
        "completion_length_growing", "PostTrainCompletionLengthGrowing", "warning", "completion_length",
        LENGTH, length_growing, 3,
        help="Mean completion length: median of the last 5 logged steps above thresholds.length_ratio_high x "
             "its baseline.",
        basis="length bias in GRPO and in rewards (Dr. GRPO, arXiv:2503.20783); 30% is worth a look",
        summary="Completions are growing longer in run {run}.",
        saw="the median of the mean completion length over its last 5 logged steps is {value} tokens, above "
            "{limit} ({threshold.length_ratio_high}x its length at the run's start)",
        meaning="Verbosity is being rewarded: the reward probably has a length bias (length hacking).", band=True),
    Detector(
        "completion_length_shrinking", "PostTrainCompletionLengthShrinking", "warning", "completion_length",
        LENGTH, length_shrinking, 3,
        help="Mean completion length: median of the last 5 logged steps below thresholds.length_ratio_low x "
             "its baseline.",
        basis="30% shorter than at the start: short answers avoid negative reward rather than earn reward",
        summary="Completions are getting shorter in run {run}.",
        saw="the median of the mean completion length over its last 5 logged steps is {value} tokens, below "
            "{limit} ({threshold.length_ratio_low}x its length at the run's start)",
        meaning="The model may have learnt that short answers are safer rather than better.", band=True),
    Detector(
        "completions_truncated", "PostTrainCompletionsTruncated", "warning", "completion_truncated",
        TRUNCATED, truncated, 3,
        help="Share of completions cut at the length limit: median of the last 5 above thresholds.truncated_max.",
        basis="one completion in five cut at the limit: the reward scores unfinished answers",
        summary="Completions hit the length limit in run {run}.",
        saw="{value} of completions were cut at max_completion_length (median of its last 5 logged steps), "
            "above {limit}", percent=True,
        meaning="The reward scores incomplete answers, and truncated groups bias the advantages.", band=True),
    Detector(
        "length_diversity_collapsing", "PostTrainLengthDiversityCollapsing", "warning", "completion_length",
        LENGTH_STD, length_diversity_collapsing, 3,
        help="Within-group length std: median of the last 5 below thresholds.length_std_drop x its baseline.",
        basis="within-group length spread halved: completions converging on one template",
        summary="Completions of a group are converging to one length in run {run}.",
        saw="the within-group std of completion length is {value} tokens (median of its last 5 logged steps), "
            "below {limit} ({threshold.length_std_drop} of its level at the run's start)",
        meaning="Completions may be converging to one template; this often precedes mode collapse.", band=True),
    Detector(
        "dpo_displacement", "PostTrainDPOLikelihoodDisplacement", "warning", "dpo_reward", CHOSEN,
        dpo_displacement, 3,
        help="DPO chosen reward: median of the last 5 below thresholds.dpo_chosen_min while the margin is positive.",
        basis="likelihood displacement (arXiv:2410.08847) in DPO's implicit reward (arXiv:2305.18290)",
        summary="DPO is pushing the chosen answers down in run {run}.",
        saw="the implicit reward of the chosen answers is {value} (median of its last 5 logged steps), below "
            "{limit}, while the margin over the rejected ones is still positive",
        meaning="The margin grows because both answers lose likelihood (likelihood displacement): the model "
                "unlearns the preferred answers too.", reads=(MARGIN,), band=True),
    Detector(
        "dpo_saturated", "PostTrainDPOSaturated", "warning", "dpo_accuracy", ACCURACY, dpo_saturated, 5,
        help="DPO-family run: accuracy 1 and loss below thresholds.dpo_loss_saturated (medians of the last 5 "
             "logged steps) while the reward margin is not falling over its window.",
        basis="DPO's loss (arXiv:2305.18290) goes to 0 only as every pair's implicit-reward margin grows without "
              "bound: past that point the loss no longer asks anything the evaluation pairs could confirm",
        summary="DPO has separated every training pair in run {run}.",
        saw="every pair is ranked right and the loss is {value} (median of its last 5 logged steps), below "
            "{limit}, while the margin between chosen and rejected rewards is not falling",
        meaning="The model only pushes the margins apart now: more steps overfit the training pairs. Check the "
                "evaluation pairs (eval_rewards/accuracies, eval_loss): if they stopped improving, stop here or "
                "raise beta.", reads=(LOSS, MARGIN)),
    Detector(
        "dpo_chosen_unbounded", "PostTrainDPOChosenRewardUnbounded", "warning", "dpo_reward", CHOSEN,
        dpo_chosen_unbounded, 10,
        help="DPO chosen reward: rising over its window and its recent median above thresholds.dpo_chosen_max.",
        basis="chosen answers pushed ever further from the reference: the objective is being exploited",
        summary="DPO chosen rewards keep climbing in run {run}.",
        saw="the implicit reward of the chosen answers is {value} (median of its last 5 logged steps), above "
            "{limit}, and still rising",
        meaning="Unbounded reward growth is likely the model exploiting the objective; check the KL to the "
                "reference.", band=True),
    Detector(
        "dpo_margin_unstable", "PostTrainDPORewardsUnstable", "warning", "dpo_reward", MARGIN,
        dpo_margin_unstable, 10,
        help="DPO margin: stddev of the last 20 logged steps above thresholds.dpo_margin_noise x their mean.",
        basis="a margin noisier than its own size: unstable optimisation",
        summary="DPO rewards are unstable in run {run}.",
        saw="the stddev of the reward margin over its last 20 logged steps is {value}, above {limit}",
        meaning="Unstable optimisation: reduce the learning rate or increase beta."),
    Detector(
        "dpo_rewards_converging", "PostTrainDPORewardsConverging", "warning", "dpo_reward", MARGIN,
        dpo_rewards_converging, 10,
        help="DPO margin falling over its window, against its noise.",
        basis="chosen and rejected rewards converging: the preference is being lost",
        summary="DPO chosen and rejected rewards are converging in run {run}.",
        saw="the margin between chosen and rejected rewards is falling over its window (trend t = {value})",
        meaning="The model is losing its ability to tell preferred from rejected answers: catastrophic "
                "forgetting or a learning rate that is too high."),
    Detector(
        "loss_sign_flip", "PostTrainLossSignFlip", "warning", "loss", LOSS, loss_sign_flip, 5,
        help="Loss clearly positive over its first 10 logged steps, its mean of the last 10 now more than 2 "
             "standard errors below 0.",
        basis="a pg loss that went negative after being positive: the update direction reversed",
        summary="The policy-gradient loss went negative after being positive in run {run}.",
        saw="the mean loss of its last 10 logged steps is {value}, clearly below zero (limit {limit}) after a "
            "positive start",
        meaning="The update direction reversed: the model is being pushed away from reward improvement."),
    Detector(
        "grad_norm_high", "PostTrainGradNormHigh", "warning", "grad_norm", GRAD_NORM, grad_norm_high, 3,
        help="Gradient norm: median of the last 5 above thresholds.grad_norm_spike_factor x its baseline (the "
             "upper quartile of its first points: GRPO's no-signal steps log a zero norm).",
        basis="gradient health: a lasting rise far above the run's start, not one spike",
        summary="Gradient norm far above its start in run {run}.",
        saw="the median gradient norm over its last 5 logged steps is {value}, above {limit} "
            "({threshold.grad_norm_spike_factor}x its level at the run's start)",
        meaning="Updates are exploding; single spikes are counted, this one has lasted.", band=True),
    Detector(
        "template_collapse", "PostTrainTemplateCollapse", "warning", "completion_diversity", TOP_PROMPT_SHARE,
        template_collapse, 3,
        help="Printed completions (TRL log_completions, verl's samples): the most common completion answers at least "
             "thresholds.template_prompt_share of a step's distinct prompts and fills at least "
             "thresholds.template_row_share of its rows (medians of the last 5 sample sets).",
        basis="reading the outputs: one answer for every prompt is a collapse to a single strategy",
        summary="Completions collapsed to one template in run {run}.",
        saw="one completion is the answer to {value} of the distinct prompts of a step (median of its last 5 "
            "printed sample sets), at least {limit}, and to at least {threshold.template_row_share} of its rows",
        meaning="The model gives the same text whatever it is asked: reward can still rise while the answers stop "
                "depending on the prompt. Read the samples in the report (posttrain-exporter report --html).",
        reads=(TOP_SHARE,), percent=True),
)

BY_NAME: dict[str, Detector] = {d.name: d for d in DETECTORS}
