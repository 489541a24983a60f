"""Judge each run of a read log: its verdict, its findings (the detectors' episodes, one finding per alert), its
best step, its regime over time and a table of every instrument.

The findings are the detectors' own episodes, the state the alert rules read, so the report says what the
alerts would have said; an alert fires from the step its detector became active until it cleared.

A run without a training record has no verdict on its training: it is `no_data`, never healthy (a CI gate
pointed at the wrong file, a trainer that crashed before its first step or logs its metrics elsewhere), and
the verdict says what was read instead. A run whose trainer died is `crashed`: its output ends in a sign of it (a
traceback, an abort, a shell's `Killed`; parsers/failures.py) with nothing of the trainer's own after (a record, a
bar that moved on, a log line; RunState.crash_at), or `run` saw the trainer exit non-zero; its findings are listed
as for any run. A traceback of code outside the trainer's process (a reward function's sandbox) is no sign: it is
counted as the reward function's, and the report says the reward function is failing. A live run that has logged
nothing for longer than its own pace allows is `stale` (the PostTrainTrainerStalled alert's condition)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from exporter.detectors.catalog import Detector, SeriesKey
from exporter.instruments.derived import REGIME_OF
from exporter.instruments.keymap import INSTRUMENTS
from exporter.instruments.window import rolling_mean, window_stats
from exporter.judgment.checkpoints import Keep
from exporter.judgment.judge import Judgment, judge_run
from exporter.parsers.failures import Failure
from exporter.report.digest import RunDigest
from exporter.runbooks import RUNBOOK_BASE
from exporter.runstate import RunState
from exporter.samples.diversity import FORMAT as SAMPLES_FORMAT
from exporter.samples.sampleset import Sample

if TYPE_CHECKING:
    from exporter.pipeline import IngestStats

TREND_POINTS = 50  # the window of the derived trends (windows.size)
# The verdicts, worst first where a run could be judged at all. not_learning: no page, and the judgment finds the
# task is not being learnt (the progress measure never rose beyond its noise, or it rose only through reward
# components near their ceiling from the start while another never fired): a run that looks fine and teaches nothing.
NO_DATA, CRASHED, UNHEALTHY, NOT_LEARNING, STALE, HEALTHY = (
    "no_data", "crashed", "unhealthy", "not_learning", "stale", "healthy")
# A live run is stale once it has logged nothing for longer than thresholds.stall_seconds and this many times its
# mean interval between records (the PostTrainTrainerStalled alert's condition, rules.py).
STALL_INTERVALS = 5


@dataclass(frozen=True)
class ReadSummary:
    """What was read for a run: enough to tell a wrong path from a trainer that logs elsewhere."""

    lines: int  # lines (or file records) read: records, progress-bar draws, unmatched lines, errors
    records: dict[str, int]  # records by format (hf, json, verl, trainer_state, ...)
    training_records: int  # of which the trainer's training records (not evaluation, summary or completion sets)
    unmatched: int  # lines no parser claimed
    errors: int  # lines a parser claimed but could not read
    progress: int  # progress-bar draws

    def as_json(self) -> dict[str, Any]:
        return {"lines": self.lines, "records": dict(sorted(self.records.items())),
                "training_records": self.training_records, "unmatched": self.unmatched, "errors": self.errors,
                "progress_bar_draws": self.progress}


def read_summary(run: RunState, stats: IngestStats | None) -> ReadSummary:
    counts = stats.total().line_counts() if stats is not None else {}
    records: dict[str, int] = {}
    for (fmt, outcome), n in counts.items():
        if outcome == "record":
            records[fmt] = records.get(fmt, 0) + n
    return ReadSummary(sum(counts.values()), records, run.trainer_records,
                       sum(n for (_, o), n in counts.items() if o == "unmatched"),
                       sum(n for (_, o), n in counts.items() if o == "error"),
                       sum(n for (_, o), n in counts.items() if o == "progress"))


def stale(run: RunState, now: float) -> bool:
    """No record for longer than thresholds.stall_seconds and STALL_INTERVALS x the run's mean interval between
    records, and the run has not finished (its source is still expected to say more)."""
    if run.finished or not run.last_record_time:
        return False
    age = now - run.last_record_time
    n = sum(run.records.values())
    interval = (run.last_record_time - run.first_record_time) / (n - 1) if n > 1 and run.first_record_time else 0.0
    return age > run.settings.thresholds.stall_seconds and age > STALL_INTERVALS * interval


def verdict_of(run: RunState, found: list[Finding], now: float | None = None,
               judgment: Judgment | None = None) -> str:
    """no_data without a training record; else crashed when the trainer died (RunState.crash); else unhealthy with
    a page, or with a warning unless the judgment says the task is not being learnt; else stale when judged live
    (`now`) and the run has gone quiet; else not_learning when the judgment says so; else healthy."""
    if not run.trainer_records:
        return NO_DATA
    if run.crash is not None:
        return CRASHED
    not_learning = judgment is not None and judgment.learning is False
    if any(f.severity == "critical" for f in found) or (found and not not_learning):
        return UNHEALTHY
    if now is not None and stale(run, now):
        return STALE
    return NOT_LEARNING if not_learning else HEALTHY


# Instruments only a run that samples and scores completions logs (GRPO, PPO, RLOO): such a run without a reward
# instrument has the reward-based detectors silent for want of input, not because its reward is fine.
_SAMPLING = frozenset({"completion_length", "completion_truncated", "clip_ratio", "clip_fraction", "reward_component",
                       "reward_zero_std", "generation_time", "value_loss", "completion_diversity"})


def unjudged(run: RunState) -> list[str]:
    """Instruments the run's kind logs that it did not log, so their detectors judged nothing: a reward under a key
    of its own (say `config aliases: {my/reward: reward}`) reads as a healthy reward otherwise."""
    logged = {inst for inst, _ in run.series}
    return ["reward"] if "reward" not in logged and logged & _SAMPLING else []


def reward_function_note(v: RunVerdict) -> str | None:
    """What the report says of a reward function that is failing (None: it is not)."""
    n = v.reward_function_errors
    if not n:
        return None
    return f"the reward function is failing: {n} error{'s' if n != 1 else ''}, the last: {v.reward_function_error}"


def reward_function_json(errors: int, last: str | None) -> dict[str, Any] | None:
    """The reward function's failures as the JSON report and /api/v1/verdict give them (None: none)."""
    return {"errors": errors, "last": last} if errors else None


def hints(read: ReadSummary, crash: Failure | None = None) -> list[str]:
    """What to try when a run has no training record, from what was read (and how the trainer died, if it did)."""
    if crash is not None:
        return [f"the trainer died before its first logged step: {crash.text}"]
    if not read.lines:
        return ["nothing was read: check the path, and that the trainer writes there (the trainer container's "
                "stdout and stderr, or its log file; PYTHONUNBUFFERED=1 so lines are not held in a buffer)"]
    out = []
    if set(read.records) == {SAMPLES_FORMAT}:
        out.append(f"only completion samples were read ({read.records[SAMPLES_FORMAT]} sets), no metrics record of the "
                   "trainer's: give the exporter the trainer's log or output_dir too")
    elif read.records:
        out.append("records were read but none is a training record (evaluation or the end-of-run summary only): "
                   "the run may have crashed before its first logged step")
    else:
        out.append(f"no line of the {read.lines} read is a metrics record: the trainer may log its metrics "
                   "elsewhere (verl prints them only when trainer.logger includes 'console'; transformers and TRL "
                   "print a metrics dict every logging_steps steps, on the main process only: is this its output?)")
    out.append("point the exporter at the trainer's own record instead: trainer_state.json (transformers, TRL) or "
               "a TensorBoard event file, or pin the line format with --format (or a config `formats:` entry "
               "for a custom line)")
    return out


@dataclass(frozen=True)
class Episode:
    since: int  # the condition began to hold
    start: int  # the detector became active: the alert fires from here
    end: int | None  # it cleared; None: still active at the last step


@dataclass
class Finding:
    alert: str
    detector: str
    severity: str
    instrument: str
    component: str | None
    first_step: int  # the first step the alert would have fired
    last_step: int  # the last step it would still have been firing
    episodes: list[Episode]
    summary: str
    meaning: str
    runbook_url: str

    @property
    def onset(self) -> int:
        """The step its condition first began to hold (the story dates a finding by it)."""
        return min(e.since for e in self.episodes)


@dataclass(frozen=True)
class InstrumentRow:
    key: SeriesKey
    label: str  # e.g. "kl", "completion_length{stat=mean}"
    points: int
    first: float
    min: float
    max: float
    last: float
    slope: float  # per step, over the last TREND_POINTS points
    direction: int  # 1 rising, -1 falling, 0 flat (against the window's noise)


@dataclass(frozen=True)
class SampleView:
    """Printed completions the report shows at one step, and why (chosen by report/samples.py)."""

    why: str  # "best step", "first step of PostTrainX", "end"
    step: int  # the step asked for
    shown_step: int  # the step whose set is shown (the nearest kept one)
    source: str
    rows: tuple[Sample, ...]


@dataclass
class RunVerdict:
    run: str
    last_step: int | None  # None: no training record
    finished: bool
    findings: list[Finding]
    best_step: int | None  # the reward's peak (smoothed), the checkpoint to keep
    best_reward: float | None
    kl_at_best: float | None
    regimes: list[tuple[int, int, str]]  # (from step, to step, regime)
    instruments: list[InstrumentRow]
    series: dict[SeriesKey, tuple[np.ndarray, np.ndarray]] = field(repr=False, default_factory=dict)
    limits: dict[SeriesKey, list[tuple[str, float]]] = field(repr=False, default_factory=dict)
    samples: list[SampleView] = field(repr=False, default_factory=list)  # printed completions (report/samples.py)
    verdict: str = HEALTHY  # verdict_of: no_data, crashed, unhealthy, stale or healthy
    read: ReadSummary | None = None
    crash: Failure | None = None  # how the trainer died (RunState.crash), whatever the verdict
    reward_function_errors: int = 0  # tracebacks of code outside the trainer's process: the reward function's
    reward_function_error: str | None = None  # the last one's exception line
    unjudged: list[str] = field(default_factory=list)  # instruments its kind logs that it did not (unjudged())
    judgment: Judgment | None = None  # the practitioner's judgment (exporter/judgment/): what to do next

    def worst(self) -> str | None:
        sev = {f.severity for f in self.findings}
        return "critical" if "critical" in sev else "warning" if sev else None


def judge(run: RunState, runbook_base: str = RUNBOOK_BASE, stats: IngestStats | None = None,
          digest: RunDigest | None = None) -> RunVerdict:
    """`stats`: what was read for the run (the no_data verdict says it); `digest`: what was kept of the whole run
    while it was read (without one, the series' kept history)."""
    run.refresh()
    digest = (digest or RunDigest()).close(run)
    found = findings(run, runbook_base)
    missing = unjudged(run)
    judged = judge_run(run, found, missing, run.crash)
    best_step, best_reward, kl_at_best = _best(run, digest, found, judged.keep)
    return RunVerdict(run.name, step_of(run), run.finished, found, best_step, best_reward, kl_at_best,
                      _regimes(run, digest), _instruments(run, digest),
                      {k: d.chart() for k, d in digest.series.items() if d.count},
                      _limits(run), verdict=verdict_of(run, found, judgment=judged), read=read_summary(run, stats),
                      crash=run.crash, unjudged=missing, judgment=judged,
                      reward_function_errors=run.reward_function_errors,
                      reward_function_error=run.reward_function_error)


def step_of(run: RunState) -> int | None:
    """The run's last training step; None before its first (no sentinel)."""
    return run.step if run.step >= 0 else None


def finite_or_none(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else v  # JSON has no NaN


def summary_of(d: Detector, run: str, component: str | None) -> str:
    """The alert's summary for this run (and reward component)."""
    return d.summary.replace("{run}", run).replace("{component}", component or "")


def findings(run: RunState, runbook_base: str = RUNBOOK_BASE) -> list[Finding]:
    """The run's findings: its detectors' episodes, one finding per alert (and reward component), pages first."""
    by_alert: dict[tuple[str, str | None], Finding] = {}
    for r in run.detectors.readings():
        d: Detector = r.detector
        for e in r.state.episodes:
            ep = Episode(e.since, e.start, e.end)
            last = e.end if e.end is not None else max(run.step, e.start)
            f = by_alert.get((d.alert, r.sub))
            if f is None:
                by_alert[d.alert, r.sub] = Finding(d.alert, d.name, d.severity, d.instrument, r.sub, e.start, last,
                                                   [ep], summary_of(d, run.name, r.sub), d.meaning,
                                                   f"{runbook_base}#{d.alert.lower()}")
            else:
                f.episodes.append(ep)
                f.first_step, f.last_step = min(f.first_step, e.start), max(f.last_step, last)
    order = {"critical": 0, "warning": 1}
    return sorted(by_alert.values(), key=lambda f: (order[f.severity], f.first_step, f.alert))


# A numerical failure poisons every step from its onset: no checkpoint from then on is one to keep.
_POISONS = "nonfinite_loss_or_kl"


def _best(run: RunState, digest: RunDigest, found: list[Finding],
          keep: Keep | None = None) -> tuple[int | None, float | None, float | None]:
    """The run's best step and reward there: the judgment's (the checkpoint it says to keep is near it), where the
    reward measures its progress; else the reward's smoothed peak (posttrain_reward_peak_step). Either way before a
    numerical failure where one began (the live gauge does not know the detectors)."""
    g = run.derived.gauges
    step, peak = g.get(("posttrain_reward_peak_step", ())), g.get(("posttrain_reward_peak", ()))
    poisoned = min((e.since for f in found if f.detector == _POISONS for e in f.episodes), default=None)
    if poisoned is not None:
        poisoned = _first_nonfinite(run, poisoned)
    if keep is not None and keep.measure == "reward" and keep.best_level is not None and (
            poisoned is None or keep.best_step < poisoned):
        step, peak, poisoned = keep.best_step, keep.best_level, None  # one best step in the whole report
    if step is None:
        return None, None, None
    if poisoned is not None and step >= poisoned:
        step, peak = _peak_before(run, digest, poisoned)
        if step is None:
            return None, None, None
    kl = digest.series.get(("kl", None))
    kl_at = None
    if kl is not None and kl.count:
        steps, values = kl.whole()
        i = int(np.searchsorted(steps, step, side="right")) - 1
        kl_at = float(values[i]) if i >= 0 else None
    return int(step), peak, kl_at


def _first_nonfinite(run: RunState, since: int) -> int:
    """The first step whose loss or KL was not a number in the window that made the detector fire at `since` (the
    detector notes it, detectors/catalog.py `nonfinite`); `since` where it did not (a rebuilt history)."""
    fired, first = run.detectors.carry.get("nonfinite_first", (None, since))
    return int(first) if fired == since else since


def _peak_before(run: RunState, digest: RunDigest, step: int) -> tuple[int | None, float | None]:
    """The highest mean of `min_points` consecutive logged rewards ending before `step` (as the live peak smooths),
    and the step it ends at; None where fewer were logged."""
    reward = digest.series.get(("reward", None))
    if reward is None or not reward.count:
        return None, None
    steps, values = reward.whole()
    keep = (steps < step) & np.isfinite(values)
    steps, values = steps[keep], values[keep]
    k = run.settings.window_for("reward").min_points
    smoothed, counts = rolling_mean(values, 0, k)  # the live peak's smoothing (instruments/derived.py)
    full = np.flatnonzero(counts == k)
    if not len(full):
        return None, None
    best = int(full[np.argmax(smoothed[full])])
    return int(steps[best]), float(smoothed[best])


def _direction(t: float, trend_t: float) -> int:
    return 1 if t >= trend_t else -1 if t <= -trend_t else 0


def _regimes(run: RunState, digest: RunDigest) -> list[tuple[int, int, str]]:
    """The KL-versus-reward regime at each logged reward step (trends over their last 50 points, as the
    derived series), merged into spans."""
    reward, kl = digest.series.get(("reward", None)), digest.series.get(("kl", None))
    if reward is None or kl is None or reward.count < 10 or kl.count < 10:
        return []
    t = run.settings.thresholds.trend_t
    r_steps, r_values = reward.whole()
    k_steps, k_values = kl.whole()
    rd = _directions(rolling_slope_t(r_steps, r_values, TREND_POINTS), t)
    kd = _directions(rolling_slope_t(k_steps, k_values, TREND_POINTS), t)
    j = np.searchsorted(k_steps, r_steps, side="right")  # the KL points logged up to each reward step
    used = np.flatnonzero((np.arange(len(r_steps)) >= 9) & (j >= 10))
    if not len(used):
        return []
    names = sorted(set(REGIME_OF.values()))
    code_of = np.full((2, 3), -1)  # (KL direction clipped at 0, reward direction + 1) -> index in names
    for (k, r), name in REGIME_OF.items():
        code_of[k, r + 1] = names.index(name)
    codes = code_of[np.maximum(kd[j[used] - 1], 0), rd[used] + 1]
    steps = r_steps[used]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    ends = np.r_[starts[1:] - 1, len(codes) - 1]
    return [(int(steps[a]), int(steps[b]), names[codes[a]])
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _directions(slope_t: np.ndarray, trend_t: float) -> np.ndarray:
    return np.where(slope_t >= trend_t, 1, np.where(slope_t <= -trend_t, -1, 0))


def rolling_slope_t(steps: np.ndarray, values: np.ndarray, size: int, chunk: int = 4096) -> np.ndarray:
    """window_stats(...).slope_t of the window of the last `size` points (fewer at the start) ending at each
    point, in numpy over chunks of windows (a window's own Python sums took most of a long run's report)."""
    n = len(values)
    out = np.zeros(n)
    for i in range(min(size - 1, n)):  # the first windows are shorter
        out[i] = window_stats(list(zip(steps[:i + 1].tolist(), values[:i + 1].tolist(), strict=True))).slope_t
    if n < size:
        return out
    xs = np.lib.stride_tricks.sliding_window_view(steps.astype(np.float64), size)
    ys = np.lib.stride_tricks.sliding_window_view(values.astype(np.float64), size)
    for a in range(0, len(xs), chunk):
        dx = xs[a:a + chunk] - xs[a:a + chunk].mean(axis=1, keepdims=True)  # centred, as window_stats
        dy = ys[a:a + chunk] - ys[a:a + chunk].mean(axis=1, keepdims=True)
        sxx, sxy, syy = (dx * dx).sum(axis=1), (dx * dy).sum(axis=1), (dy * dy).sum(axis=1)
        slope = np.divide(sxy, sxx, out=np.zeros_like(sxx), where=sxx > 0)
        resid = np.maximum(syy - slope * sxy, 0.0) / (size - 2)
        t = np.zeros_like(sxx)
        noisy = (sxx > 0) & (resid > 1e-300)
        t[noisy] = slope[noisy] / np.sqrt(resid[noisy] / sxx[noisy])
        line = (sxx > 0) & ~noisy & (slope != 0)  # a perfect line
        t[line] = np.copysign(np.inf, slope[line])
        out[size - 1 + a:size - 1 + a + len(t)] = t
    return out


def _label(key: SeriesKey) -> str:
    inst, sub = key
    name = INSTRUMENTS[inst].label if inst in INSTRUMENTS else None
    return f"{inst}{{{name}={sub}}}" if name and sub else inst


def _instruments(run: RunState, digest: RunDigest) -> list[InstrumentRow]:
    rows = []
    t = run.settings.thresholds.trend_t
    for key, s in sorted(run.series.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        d = digest.series.get(key)
        if not len(s) or d is None or d.first is None:
            continue
        steps, values = s.arrays(TREND_POINTS)
        st = window_stats(list(zip(steps.tolist(), values.tolist(), strict=True)))
        lo, hi = d.extremes()
        rows.append(InstrumentRow(key, _label(key), d.count, d.first[1], lo, hi, float(values[-1]), st.slope,
                                  _direction(st.slope_t, t)))
    return rows


def _limits(run: RunState) -> dict[SeriesKey, list[tuple[str, float]]]:
    """The limits the detectors judged each input against, as of the last step (for the charts' bands)."""
    out: dict[SeriesKey, list[tuple[str, float]]] = {}
    for r in run.detectors.readings():
        d = r.detector
        if d.band and r.step >= 0 and np.isfinite(r.limit) and not isinstance(d.input, str) and d.input in run.series:
            out.setdefault(d.input, []).append((d.name, r.limit))
    return out
