"""Detection judged on labelled real runs: every pathology caught within 10 logged steps of its onset (the
stop signs paged), not one page or warning on a healthy run.

Two levels: the exporter's own judgments (its detectors' episodes, read in process), and the real alert
rules evaluated by promtool on what the exporter exported after every logged step (one step per minute),
which is the fast, deterministic variant of bench/detection.py (real Prometheus and Alertmanager)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO, require_binary
from support.corpus import CAUGHT_BY, PAGE_WORTHY, LabelledRun, labelled_runs, within
from support.judge import Finding, findings, read_log
from support.labels import load_records
from support.stepwise import input_series, logged_steps_of, records_of, scrapes

RUNS = labelled_runs()
CORPUS = [r for r in RUNS if r.source == "corpus"]
RULES = [REPO / "rules" / "posttrain.recording.yml", REPO / "rules" / "posttrain.alerts.yml"]


def logged_steps(run: LabelledRun) -> list[int]:
    return sorted({int(e["step"]) for e in load_records(run.trainer_state)})


def delay(run: LabelledRun, onset: int, step: int) -> int:
    """Logged steps from the onset to `step` (negative: before the onset)."""
    steps = logged_steps(run)
    if step >= onset:
        return sum(1 for s in steps if onset < s <= step)
    return -sum(1 for s in steps if step < s <= onset)


def catching(run: LabelledRun, fs: list[Finding], pathology: str) -> list[Finding]:
    """Findings on the pathology's instruments that were active at its onset or began after it."""
    onset = run.onsets[pathology]
    return [f for f in fs if f.instrument in CAUGHT_BY[pathology] and (f.end is None or f.end > onset)]


def test_the_corpus_has_what_the_issue_asks_for() -> None:
    shown = {p for r in CORPUS for p in r.onsets}
    assert {"kl_blowup", "reward_std_collapse", "length_hacking", "entropy_collapse", "dpo_displacement"} <= shown
    assert {"length_collapse", "dead_signal", "dpo_saturation"} <= shown  # issue 25's shapes
    assert sum(r.healthy for r in CORPUS) >= 3
    sparse = [r for r in CORPUS if len(logged_steps(r)) * 5 <= max(logged_steps(r))]  # logging every 5+ steps
    assert any(r.healthy for r in sparse) and any(not r.healthy for r in sparse)


def test_completions_shrinking_from_the_first_record_are_reported_as_shrinking() -> None:
    """grpo_length_collapse logs every 10 steps; its completions fall from 4.3 tokens (the first record, an average
    over steps 1-10) to ~1 by the second: a shrink found within a few records, never growth."""
    run = next(r for r in CORPUS if r.name == "grpo_length_collapse")
    fs = findings(read_log(run.log))
    assert not [f for f in fs if f.detector == "completion_length_growing"], fs
    (shrink, *_) = [f for f in fs if f.detector == "completion_length_shrinking"]
    assert delay(run, run.onsets["length_collapse"], shrink.start) <= 5 and shrink.end is None


def test_a_dead_learning_signal_and_a_saturated_dpo_run_are_found() -> None:
    """grpo_dead_signal: 75-100% of groups tie and grad_norm is 0 on 48 of 60 records while reward_std stays above
    0.05 on most: the dead signal pages, the reward-std detectors alone would not (they warn that it falls).
    dpo_saturated: a warning, and nothing else."""
    dead = next(r for r in CORPUS if r.name == "grpo_dead_signal")
    fs = findings(read_log(dead.log))
    assert [f.alert for f in fs if f.severity == "critical"] == ["PostTrainLearningSignalDead"], fs
    assert {f.alert for f in fs} <= {"PostTrainLearningSignalDead", "PostTrainRewardStdFalling"}
    saturated = next(r for r in CORPUS if r.name == "dpo_saturated")
    assert {f.alert for f in findings(read_log(saturated.log))} == {"PostTrainDPOSaturated"}


@pytest.mark.parametrize("run", CORPUS, ids=lambda r: r.name)
def test_each_corpus_run_shows_what_it_was_made_to_show(run: LabelledRun) -> None:
    assert set(run.onsets) == set(run.intent or ()), f"labels {run.onsets}, intent {run.intent}"


@pytest.mark.parametrize("run", [r for r in RUNS if r.healthy], ids=lambda r: r.name)
def test_a_healthy_run_raises_nothing(run: LabelledRun) -> None:
    fs = findings(read_log(run.log))
    assert fs == [], "\n".join(f"{f.severity} {f.alert} steps {f.since}..{f.end}" for f in fs)


@pytest.mark.parametrize(("run", "pathology"), [(r, p) for r in CORPUS for p in r.onsets],
                         ids=lambda x: x.name if isinstance(x, LabelledRun) else x)
def test_a_pathology_is_caught_within_ten_logged_steps(run: LabelledRun, pathology: str) -> None:
    """A warning (or a page) on the pathology's instruments within 10 logged steps of its onset (a reward-std
    collapse: 20, see support/corpus.py); the stop signs (KL blow-up, reward-std collapse) also page, within the
    same bound."""
    fs = findings(read_log(run.log))
    caught = catching(run, fs, pathology)
    onset = run.onsets[pathology]
    assert caught, f"{pathology} (onset {onset}) never caught; findings: {fs}"
    first = min(caught, key=lambda f: f.start)
    assert delay(run, onset, first.start) <= within(pathology), f"{first.alert} at {first.start}, onset {onset}"
    if pathology in PAGE_WORTHY:
        pages = [f for f in caught if f.severity == "critical"]
        assert pages, f"{pathology} warned ({first.alert}) but never paged"
        assert delay(run, onset, min(f.start for f in pages)) <= within(pathology)


def test_the_saturated_fixture_pages_on_reward_std() -> None:
    fs = findings(read_log(next(r for r in RUNS if r.name == "grpo_saturated").log))
    assert any(f.alert == "PostTrainRewardStdCollapsed" and f.severity == "critical" for f in fs), fs


# --- the real rules, on the exporter's state after each logged step ----------------------------------------


def _promtool_case(run: LabelledRun, tmp: Path) -> tuple[dict, list[int]]:
    steps = scrapes(run.log, run.name, f"{run.name}:9847")
    record_steps = logged_steps_of(records_of(run.log))
    series = input_series(steps)
    return {"interval": "1m", "input_series": series}, record_steps


def _minute_of(record_steps: list[int], step: int) -> int:
    """The minute (index of the logged step) at which the exporter had read `step`."""
    return next((i for i, s in enumerate(record_steps) if s >= step), len(record_steps) - 1)


def _promtool(test: dict, tmp: Path) -> subprocess.CompletedProcess:
    path = tmp / "case.test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [str(p) for p in RULES], "evaluation_interval": "1m",
                                    "group_eval_order": ["posttrain.recording", "posttrain.pages",
                                                         "posttrain.warnings", "posttrain.exporter"],
                                    "tests": [test]}, sort_keys=False))
    return subprocess.run([require_binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("run", [r for r in RUNS if r.healthy], ids=lambda r: r.name)
def test_rules_raise_nothing_on_a_healthy_run(run: LabelledRun, tmp_path: Path) -> None:
    test, record_steps = _promtool_case(run, tmp_path)
    test["promql_expr_test"] = [{"expr": 'count(ALERTS{alertstate="firing"}) > 0', "eval_time": f"{i}m",
                                 "exp_samples": []} for i in range(len(record_steps))]
    r = _promtool(test, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.parametrize(("run", "pathology"), [(r, p) for r in CORPUS for p in r.onsets],
                         ids=lambda x: x.name if isinstance(x, LabelledRun) else x)
def test_rules_alert_within_ten_logged_steps(run: LabelledRun, pathology: str, tmp_path: Path) -> None:
    test, record_steps = _promtool_case(run, tmp_path)
    onset_at = _minute_of(record_steps, run.onsets[pathology])
    at = min(onset_at + within(pathology), len(record_steps) - 1)
    instruments = "|".join(sorted(CAUGHT_BY[pathology]))
    severities = "critical" if pathology in PAGE_WORTHY else "critical|warning"
    expr = (f'clamp_max(count(ALERTS{{alertstate="firing", run="{run.name}", instrument=~"{instruments}", '
            f'severity=~"{severities}"}}), 1)')
    test["promql_expr_test"] = [{"expr": expr, "eval_time": f"{at}m", "exp_samples": [{"labels": "{}", "value": 1}]}]
    r = _promtool(test, tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
