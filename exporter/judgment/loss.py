"""What the loss did: steady or declining, oscillating around zero with no direction, a discontinuity (its size
doubled or halved from one stretch to the next: a learning-rate step, a data shift, a gradient blow-up).

A policy-gradient surrogate (GRPO's, PPO's) is no progress metric: it oscillates around zero, and its size halves and
grows sevenfold between stretches of healthy runs. Its jump counts only where the learning rate stepped (2x or more
from one logged step to the next, not a warm-up's ramp) beside it; an SFT or DPO loss, which moves smoothly, jumps
when its size changes far beyond how it moves elsewhere in the run."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SIDE = 20  # points each side of a discontinuity's step whose median size is compared
NEAR = 5  # ... and the few right beside it: a jump, not a drift
JUMP_UP, JUMP_UP_NEAR = 2.5, 2.0  # the size after over the size before
JUMP_DOWN, JUMP_DOWN_NEAR = 0.4, 0.5
OSCILLATING_FLIPS = 0.3  # share of successive points that change sign
# A jump must also stand out of how much the size moves between neighbouring stretches elsewhere in the run: a
# surrogate loss near zero (GRPO's) halves and doubles by chance; an SFT or DPO loss moves smoothly.
BACKGROUND = 4.0
LR_STEP = 2.0  # a learning-rate step: the rate multiplied or divided by this much from one logged step to the next
RAMP = 5.0  # ... and its change this many times the typical change at the steps around it (not a ramp)


@dataclass(frozen=True)
class LossPattern:
    shape: str  # steady, declining, rising, oscillating, discontinuity, short
    step: int | None  # the discontinuity's step
    before: float  # median |loss| before and after it
    after: float
    flips: float  # share of successive points that changed sign
    lr_step: tuple[int, float, float] | None = None  # the learning-rate step the discontinuity sits beside


def lr_steps(steps: np.ndarray, rates: np.ndarray) -> list[tuple[int, float, float]]:
    """(step, rate before, rate after) where the learning rate stepped by LR_STEP or more from one logged step to
    the next, not from 0, and by far more than it changes at the steps around it (a warm-up's or a decay's ramp
    changes by the same amount every step)."""
    if len(rates) < 3:
        return []
    prev, cur = rates[:-1], rates[1:]
    delta = np.abs(np.diff(rates))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(prev > 0, cur / prev, 1.0)
    out = []
    for j in np.flatnonzero((ratio >= LR_STEP) | ((ratio > 0) & (ratio <= 1 / LR_STEP))).tolist():
        around = np.r_[delta[max(0, j - NEAR):j], delta[j + 1:j + 1 + NEAR]]
        if not len(around) or delta[j] > RAMP * float(np.median(around)):
            out.append((int(steps[j + 1]), float(rates[j]), float(rates[j + 1])))
    return out


def discontinuity(steps: np.ndarray, values: np.ndarray, near: list[int] | None = None
                  ) -> tuple[int, float, float] | None:
    """The first step where the loss's size (median |loss| of SIDE points) after it is at least 2.5x (or at most
    0.4x) the size before it, already 2x (0.5x) over the NEAR points beside it, and BACKGROUND times the typical
    change between neighbouring stretches of the run (in log size); with `near` (the steps of learning-rate steps),
    only within NEAR logged points of one of them, and the background test is not made. A size that falls to
    exactly 0 is no jump: the updates stopped (the learning-signal readings say why)."""
    size = np.abs(values)
    n = len(size)
    if n < 2 * SIDE:
        return None
    windows = np.lib.stride_tricks.sliding_window_view(size, SIDE)
    medians = np.median(windows, axis=1)  # medians[j]: the SIDE points from j
    before, after = medians[: n - 2 * SIDE + 1], medians[SIDE:]
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.abs(np.log(after / before))
    typical = float(np.median(shift[np.isfinite(shift)])) if np.isfinite(shift).any() else 0.0
    for j in range(len(before)):
        i = j + SIDE
        b, a = float(before[j]), float(after[j])
        near_before, near_after = float(np.median(size[i - NEAR:i])), float(np.median(size[i:i + NEAR]))
        if b <= 0 or near_before <= 0 or a == 0:
            continue
        if near is None and not shift[j] >= BACKGROUND * typical:
            continue
        if near is not None and not any(_beside(steps, s, i) for s in near):
            continue
        r, rn = a / b, near_after / near_before
        if (r >= JUMP_UP and rn >= JUMP_UP_NEAR) or (r <= JUMP_DOWN and rn <= JUMP_DOWN_NEAR):
            return int(steps[i]), b, a
    return None


def _beside(steps: np.ndarray, step: int, i: int) -> bool:
    """Whether `step` is within NEAR logged points of the i-th one."""
    return abs(int(np.searchsorted(steps, step)) - i) <= NEAR


def lr_step_beside(steps: np.ndarray, step: int, lr_changes: list[tuple[int, float, float]]
                   ) -> tuple[int, float, float] | None:
    """The learning-rate step (lr_steps()) nearest the logged step `step`, if it is within NEAR logged points."""
    i = int(np.searchsorted(steps, step))
    near = [c for c in lr_changes if _beside(steps, c[0], i)]
    return min(near, key=lambda c: abs(c[0] - step)) if near else None


def loss_pattern(steps: np.ndarray, values: np.ndarray, surrogate: bool,
                 lr_changes: list[tuple[int, float, float]] = ()) -> LossPattern:  # type: ignore[assignment]
    """`surrogate`: a policy-gradient loss (the run logs a reward); `lr_changes`: lr_steps() of its learning rate."""
    n = len(values)
    if n < 2 * SIDE:
        return LossPattern("short", None, math.nan, math.nan, math.nan)
    signs = np.sign(values)
    flips = float(np.mean(signs[1:] != signs[:-1]))
    jump = None
    if not surrogate:
        jump = discontinuity(steps, values)
    elif lr_changes:
        jump = discontinuity(steps, values, [s for s, _, _ in lr_changes])
    if jump is not None:
        return LossPattern("discontinuity", jump[0], jump[1], jump[2], flips,
                           lr_step_beside(steps, jump[0], list(lr_changes)))
    mean, se = float(values.mean()), float(values.std()) / math.sqrt(n)
    if flips >= OSCILLATING_FLIPS and abs(mean) < 2 * se:
        return LossPattern("oscillating", None, math.nan, math.nan, flips)
    x = steps.astype(np.float64) - steps.mean()
    slope = float((x * (values - mean)).sum() / max(float((x * x).sum()), 1e-300))
    change = slope * float(steps[-1] - steps[0])
    spread = float(values.std())
    shape = "declining" if change < -spread else "rising" if change > spread else "steady"
    return LossPattern(shape, None, math.nan, math.nan, flips)
