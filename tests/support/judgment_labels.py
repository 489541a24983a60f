"""A practitioner's judgment of a whole run: the labelling rules the exporter's per-run judgment is scored against.

Written before any run that shows them was made and before the judgment was tuned, and never changed to suit a run
or the exporter (a run that does not show its pattern is changed instead). Like tests/support/labels.py they read
the trainer's own record, `trainer_state.json` (labels.load_records), not the exporter.

Per key, over its logged points x_0..x_{n-1} (a step logged twice keeps its later value, as labels._points does):
W = max(5, min(20, n // 10)) points; M(i) = the mean of x_{i-W+1}..x_i (defined for i >= W-1); sigma = 1.4826 x
the median of |x_i - x_{i-1}| / sqrt(2) (the point-to-point noise, robust to steps); se = sigma / sqrt(W) (the
noise of one M). "Holding at >= 80% of the next N points" counts from that point on (it included), as labels.py
does: at least 80% of the N points that begin there, fewer only where the run ends (at least 5).

For the reward (key `reward`): first = M(W-1), P = the first index of the largest M, rise = M(P) - first.

- reward_peak_decline: rise > 4 se, and some i > P with M(i) < M(P) - d, d = max(0.3 rise, 4 se), holding at
  >= 80% of the next 30 points; onset = the first such i's step (the reward rose, peaked, and lost a good part of
  what it gained, for good).
- reward_plateau: rise > 4 se, and the first index t >= W-1 after which every later M(u) stays within
  max(4 se, 0.15 rise) of M(t) leaves at least 30% of the run's points after t; onset = t's step (the reward rose
  and then stopped moving). Not labelled when reward_peak_decline is.
- reward_no_trend: the least-squares line through all reward points (x in points) changes by less than sigma
  across the run (|slope| x (n - 1) < sigma), and max M - min M < 6 se; onset = the run's first logged step (no
  signal the policy can follow: nothing to learn from).
- kl_rise_reward_flat (runs logging `kl` and `reward`: GRPO, PPO), over the steps that log both: L = max(5,
  min(30, n // 6)); at index t >= W-1+L, M_kl(t) >= 1.5 M_kl(t-L) and M_kl(t) - M_kl(t-L) >= 0.05 while
  |M_r(t) - M_r(t-L)| < 3 se_r; onset = the first t where it holds at >= 80% of the next 20 points (the policy
  keeps moving away from its reference for no reward).
- loss_discontinuity: at an index i with at least 20 points before it and 20 from it on, R20 = the median |loss|
  of points i..i+19 / the median |loss| of points i-20..i-1, R5 = the same with 5 points each side; R20 >= 2.5
  and R5 >= 2, or R20 <= 0.4 and R5 <= 0.5; onset = the first such i's step (the loss changed its level at one
  step: a learning-rate step, a data or config change, a resume that did not restore the state). A median of 0
  under a larger one is an infinite ratio; two zero medians are a ratio of 1.

The recommendation a run's labels imply, over these labels and the pathology labels of labels.onsets (and
template_collapse, from a run.json's sample_onsets): stop_now if any of kl_blowup, length_hacking, truncation,
length_collapse, template_collapse, entropy_collapse, dpo_displacement, reward_peak_decline (the run is getting
worse: stop it and keep an earlier checkpoint); else investigate if loss_discontinuity (something changed under
the run); else stop if any of reward_std_collapse, dead_signal, dpo_saturation, kl_rise_reward_flat,
reward_no_trend, reward_plateau (it has nothing more to learn: stopping costs nothing); else continue.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from support.labels import _points

FRACTION = 0.8  # share of the following points at which a condition must hold
MIN_POINTS = 5  # a window cut short by the run's end still needs this many points
DECLINE_SPAN = 30
KL_SPAN = 20

STOP_NOW = frozenset({"kl_blowup", "length_hacking", "truncation", "length_collapse", "template_collapse",
                      "entropy_collapse", "dpo_displacement", "reward_peak_decline"})
INVESTIGATE = frozenset({"loss_discontinuity"})
STOP = frozenset({"reward_std_collapse", "dead_signal", "dpo_saturation", "kl_rise_reward_flat", "reward_no_trend",
                  "reward_plateau"})
JUDGMENT_LABELS = ("reward_peak_decline", "reward_plateau", "reward_no_trend", "kl_rise_reward_flat",
                   "loss_discontinuity")


class Series:
    """One key's logged values with its rolling mean and noise: W, M, sigma, se of the module docstring."""

    def __init__(self, values: list[float]) -> None:
        self.x = values
        n = len(values)
        self.n = n
        self.w = max(5, min(20, n // 10))
        self.m: dict[int, float] = {}
        if n >= self.w:
            total = sum(values[: self.w])
            self.m[self.w - 1] = total / self.w
            for i in range(self.w, n):
                total += values[i] - values[i - self.w]
                self.m[i] = total / self.w
        diffs = [abs(values[i] - values[i - 1]) for i in range(1, n)]
        self.sigma = 1.4826 * statistics.median(diffs) / math.sqrt(2) if diffs else 0.0
        self.se = self.sigma / math.sqrt(self.w)


def series(records: list[dict], key: str) -> tuple[list[int], Series]:
    pts = _points(records, (key,))
    return [s for s, _ in pts], Series([v[key] for _, v in pts])


def _first_holding(held: list[bool], span: int) -> int | None:
    """The first index where `held` is true and holds at >= 80% of the `span` points that begin there."""
    for i, h in enumerate(held):
        if not h:
            continue
        window = held[i : i + span]
        if len(window) >= MIN_POINTS and sum(window) >= FRACTION * len(window):
            return i
    return None


def _rise(s: Series) -> tuple[int, float] | None:
    """(P, rise): the first index of the largest rolling mean and how far it is above the first one."""
    if not s.m:
        return None
    first = s.m[s.w - 1]
    peak = max(s.m.values())
    p = next(i for i in sorted(s.m) if s.m[i] == peak)
    return p, peak - first


def _clear_rise(s: Series) -> tuple[int, float] | None:
    """The peak's index and the rise, where the rise stands above 4 se (both rules ask it first)."""
    found = _rise(s)
    return found if found is not None and found[1] > 4 * s.se else None


def peak_decline(steps: list[int], s: Series) -> int | None:
    found = _clear_rise(s)
    if found is None:
        return None
    p, rise = found
    d = max(0.3 * rise, 4 * s.se)
    held = [i > p and s.m[i] < s.m[p] - d for i in range(s.n)]
    i = _first_holding(held, DECLINE_SPAN)
    return None if i is None else steps[i]


def plateau(steps: list[int], s: Series) -> int | None:
    found = _clear_rise(s)
    if found is None:
        return None
    _, rise = found
    tol = max(4 * s.se, 0.15 * rise)
    for t in range(s.w - 1, s.n):
        if all(abs(s.m[u] - s.m[t]) <= tol for u in range(t + 1, s.n)):
            return steps[t] if s.n - 1 - t >= 0.3 * s.n else None
    return None


def no_trend(steps: list[int], s: Series) -> int | None:
    if not s.m or s.n < 2:
        return None
    xs = range(s.n)
    mx, my = (s.n - 1) / 2, statistics.fmean(s.x)
    slope = sum((i - mx) * (y - my) for i, y in zip(xs, s.x, strict=True)) / sum((i - mx) ** 2 for i in xs)
    flat_line = abs(slope) * (s.n - 1) < s.sigma
    flat_mean = max(s.m.values()) - min(s.m.values()) < 6 * s.se
    return steps[0] if flat_line and flat_mean else None


def kl_rise_reward_flat(records: list[dict]) -> int | None:
    pts = _points(records, ("kl", "reward"))
    if not pts:
        return None
    kl = Series([v["kl"] for _, v in pts])
    r = Series([v["reward"] for _, v in pts])
    lag = max(5, min(30, kl.n // 6))
    held = []
    for t in range(kl.n):
        if t < kl.w - 1 + lag:
            held.append(False)
            continue
        now, then = kl.m[t], kl.m[t - lag]
        held.append(now >= 1.5 * then and now - then >= 0.05 and abs(r.m[t] - r.m[t - lag]) < 3 * r.se)
    t = _first_holding(held, KL_SPAN)
    return None if t is None else pts[t][0]


def _ratio(after: list[float], before: list[float]) -> float:
    a, b = statistics.median(after), statistics.median(before)
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def loss_discontinuity(steps: list[int], s: Series) -> int | None:
    y = [abs(v) for v in s.x]
    for i in range(20, s.n - 19):
        r20 = _ratio(y[i : i + 20], y[i - 20 : i])
        r5 = _ratio(y[i : i + 5], y[i - 5 : i])
        if (r20 >= 2.5 and r5 >= 2) or (r20 <= 0.4 and r5 <= 0.5):
            return steps[i]
    return None


def judgment_onsets(records: list[dict]) -> dict[str, int]:
    """Every judgment label the rules find in the run, with its onset step."""
    out: dict[str, int] = {}
    steps, reward = series(records, "reward")
    if reward.n:
        decline = peak_decline(steps, reward)
        if decline is not None:
            out["reward_peak_decline"] = decline
        else:
            flat = plateau(steps, reward)
            if flat is not None:
                out["reward_plateau"] = flat
        none = no_trend(steps, reward)
        if none is not None:
            out["reward_no_trend"] = none
    kl = kl_rise_reward_flat(records)
    if kl is not None:
        out["kl_rise_reward_flat"] = kl
    steps, loss = series(records, "loss")
    jump = loss_discontinuity(steps, loss)
    if jump is not None:
        out["loss_discontinuity"] = jump
    return out


def recommendation(run_labels: Iterable[str]) -> str:
    """What the run's labels (judgment and pathology labels together) say to do with it."""
    found = set(run_labels)
    if found & STOP_NOW:
        return "stop_now"
    if found & INVESTIGATE:
        return "investigate"
    if found & STOP:
        return "stop"
    return "continue"
