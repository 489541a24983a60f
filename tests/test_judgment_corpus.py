"""The judgment on every labelled run of the corpus, scored against what its labels imply: the pathology labels of
support/labels.py (and the printed completions' of support/sample_labels.py) and the judgment labels of
support/judgment_labels.py, both written before the runs and the judgment were made (run.json records them).

What is scored, per run:
- a run with a pathology gets the recommendation its pathologies imply (stop_now, or stop for a signal that died),
  and its first sign comes at most WITHIN logged steps after the earliest onset (earlier is an early warning);
- a run made for a judgment pattern (run.json's judgment_intent) gets the recommendation its labels imply, a
  course of that shape dated within WITHIN logged steps of the label, and says the KL drift it was made to show;
- a healthy run gets no sign, no finding, and continue or stop by its course: stop where the reward plateaued (its
  plateau dated within WITHIN logged steps of the label), continue where it is still rising.

One label is not followed: loss_discontinuity, as written, reads a change of the median |loss| between 20-point
windows. On a GRPO run the loss is the policy-gradient surrogate (zero-mean by construction) plus beta x KL, and the
rule fires on its noise: on 16 of 25 GRPO runs, 5 of them healthy, and only one (grpo_lr_step, made for it) at a
logged learning-rate step. The
judgment reads a surrogate's jump only beside a learning-rate step (judgment/loss.py), as a practitioner reads that
loss; test_a_surrogate_loss_label_without_a_learning_rate_step_is_not_followed holds the disagreement to those runs.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
from pathlib import Path

import pytest
from support.corpus import CORPUS
from support.judgment_labels import recommendation
from support.labels import load_records

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.judgment.judge import Judgment, judge_run
from exporter.report.verdict import findings, unjudged

WITHIN = 10  # logged steps, as the detectors are held to
SHAPE_OF = {"reward_peak_decline": "peaked", "reward_plateau": "plateau", "reward_no_trend": "no_trend"}
RUNS = sorted(p for p in CORPUS.iterdir() if (p / "run.json").exists())


def meta(folder: Path) -> dict:
    return json.loads((folder / "run.json").read_text())


@functools.cache
def judged(folder: Path) -> tuple[Judgment, frozenset[str], tuple[int, ...]]:
    """The judgment `report` makes of the run's console log, its findings' detectors, and its logged steps."""
    log = next(folder / n for n in ("combined_unbuffered.log", "combined.log") if (folder / n).exists())
    ex = Exporter(Config(), [LogSpec(str(log), folder.name)])
    ex.read_to_end()
    run = ex.runs[folder.name]
    run.refresh()
    found = findings(run)
    steps = tuple(sorted({int(r["step"]) for r in load_records(folder / "trainer_state.json")}))
    return judge_run(run, found, unjudged(run), run.crash), frozenset(f.detector for f in found), steps


def logged_between(steps: tuple[int, ...], a: int, b: int) -> int:
    """Logged steps after `a` up to `b` (negative when b is before a)."""
    if b >= a:
        return sum(1 for s in steps if a < s <= b)
    return -sum(1 for s in steps if b < s <= a)


def pathology(m: dict) -> dict[str, int]:
    return {**m["onsets"], **m.get("sample_onsets", {})}


PATHOLOGY_RUNS = [p for p in RUNS if pathology(meta(p))]
PATTERN_RUNS = [p for p in RUNS if not pathology(meta(p)) and "judgment_intent" in meta(p)]
HEALTHY_RUNS = [p for p in RUNS if not pathology(meta(p)) and "judgment_intent" not in meta(p)]


@pytest.mark.parametrize("folder", PATHOLOGY_RUNS, ids=lambda p: p.name)
def test_a_run_with_a_pathology_gets_its_recommendation_and_an_early_first_sign(folder: Path) -> None:
    m = meta(folder)
    j, _, steps = judged(folder)
    labels = pathology(m)
    # the pathologies decide (a peak-decline label beside them only agrees: both are stop_now)
    assert j.recommendation == recommendation(labels), (j.headline, labels)
    first = j.first_sign
    onset = min(labels.values())
    assert first is not None, j.headline
    assert logged_between(steps, onset, first.step) <= WITHIN, (first, labels)


@pytest.mark.parametrize("folder", PATTERN_RUNS, ids=lambda p: p.name)
def test_a_run_made_for_a_judgment_pattern_is_judged_as_its_labels_say(folder: Path) -> None:
    m = meta(folder)
    j, found, steps = judged(folder)
    labels = m["judgment_onsets"]
    assert j.recommendation == m["recommendation"], (j.headline, labels)
    assert set(labels) == set(m["judgment_intent"])
    shapes = {SHAPE_OF[k] for k in labels if k in SHAPE_OF}
    if shapes:
        assert j.course is not None and j.course.shape in shapes, (j.course, labels)
    for label, onset in labels.items():
        if label in ("reward_peak_decline", "reward_plateau"):
            assert abs(logged_between(steps, onset, j.course.since_step)) <= WITHIN, (j.course, label, onset)
        if label == "kl_rise_reward_flat":
            assert "drifting without gain" in j.aspects["kl_reward"], j.aspects
        if label == "loss_discontinuity":  # the first sign is the jump, beside the learning-rate step
            assert j.first_sign is not None and "loss" in j.first_sign.text, j.story
            assert 0 <= logged_between(steps, onset, j.first_sign.step) <= WITHIN, (j.first_sign, onset)
    if not labels:  # made to be still improving at its end
        assert j.recommendation == "continue" and j.course.shape in ("rising", "slowing"), j.course
    # none of these has a pathology: the only alert allowed is the one that says the pattern
    assert found <= ({"reward_peaked_and_fell"} if "reward_peak_decline" in labels else set()), found


@pytest.mark.parametrize("folder", HEALTHY_RUNS, ids=lambda p: p.name)
def test_a_healthy_run_has_no_sign_and_is_stopped_only_once_it_converged(folder: Path) -> None:
    m = meta(folder)
    j, found, steps = judged(folder)
    assert not found and j.first_sign is None, (found, j.story)
    assert j.learning is not False, j.headline
    plateau = m["judgment_onsets"].get("reward_plateau")
    if plateau is not None:
        assert j.recommendation == "stop" and j.course.shape == "plateau", j.headline
        assert abs(logged_between(steps, plateau, j.course.since_step)) <= WITHIN, (j.course, plateau)
    else:  # no reward key the rules read (DPO: the margin is its measure), or still rising
        assert j.recommendation in ("continue", "stop"), j.headline


def _lr_changes(folder: Path) -> list[int]:
    """Steps at which the logged learning rate stepped: a change of at least a third of its level and 5 times the
    median change between logged steps (a warm-up's ramp or a cosine decay moves by about its median each step)."""
    points = [(int(r["step"]), float(r["learning_rate"])) for r in load_records(folder / "trainer_state.json")
              if isinstance(r.get("learning_rate"), int | float)]
    pairs = list(itertools.pairwise(points))
    diffs = [abs(b - a) for (_, a), (_, b) in pairs]
    typical = statistics.median(diffs) if diffs else 0.0
    return [s for ((_, a), (s, b)), d in zip(pairs, diffs, strict=True)
            if d > 5 * typical and d >= max(a, b) / 3]


def test_a_surrogate_loss_label_without_a_learning_rate_step_is_not_followed() -> None:
    """Where the judgment does not say investigate though the loss_discontinuity label is there, the run is a GRPO
    run (its loss a policy-gradient surrogate) with no learning-rate step logged near the label; the run made for
    a discontinuity, with its learning-rate step, is followed."""
    disagree, followed = [], []
    for folder in RUNS:
        m = meta(folder)
        if "loss_discontinuity" not in m["judgment_onsets"]:
            continue
        j, _, _ = judged(folder)
        (followed if j.recommendation == "investigate" or j.recommendation == m["recommendation"] else disagree
         ).append(folder)
    assert followed and [f.name for f in followed if meta(f).get("judgment_intent")] == ["grpo_lr_step"]
    for folder in disagree:
        m = meta(folder)
        assert m["trainer"] == "grpo", folder.name
        onset = m["judgment_onsets"]["loss_discontinuity"]
        assert not [s for s in _lr_changes(folder) if abs(s - onset) <= 50], (folder.name, _lr_changes(folder))
        j, _, _ = judged(folder)
        assert "discontinuity" not in j.aspects.get("loss", ""), j.aspects
    assert _lr_changes(CORPUS / "grpo_lr_step"), "the run made for it steps its learning rate"
