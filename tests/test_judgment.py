"""The practitioner's judgment (exporter/judgment/): what it says of the bundled demo run and of every labelled run,
that it is the same live and after the run, the checkpoint to keep, and the parts it is made of."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.instruments.trajectory import TRAJECTORY_POINTS, Trajectory
from exporter.judgment.loss import loss_pattern, lr_steps
from exporter.parsers.checkpoints import checkpoint_event
from exporter.report.command import EXIT_NOT_LEARNING, verdicts
from exporter.report.live import run_document

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "exporter" / "data" / "grpo_demo.log"
GRPO = REPO / "tests" / "fixtures" / "trl" / "grpo" / "combined.log"


def _verdict(path: Path, run: str = "r"):
    (v,) = verdicts(Config(), [LogSpec(str(path), run)])
    return v


# --- the demo run: the task never fires -----------------------------------------------------------------------

def test_the_demo_run_is_judged_as_a_practitioner_would_and_the_report_says_so_first() -> None:
    """The bundled demo's reward rises from 1.79 to 1.96 in the first ~60 steps through format and length rewards
    near their ceiling from the start, while correctness_reward stays at 0 on nearly every step: not learning its
    task, converged, most groups tied; stop and fix the reward. Its KL spikes (9.1 at step 283) are noted."""
    v = _verdict(DEMO)
    j = v.judgment
    assert v.verdict == "not_learning"
    assert [(f.alert, f.component) for f in v.findings] == [("PostTrainRewardComponentSilent", "correctness_reward")]
    assert j.recommendation == "stop" and j.learning is False
    assert "correctness_reward never fired" in j.not_learning
    assert {"format_reward", "length_reward"} <= set(re.findall(r"\w+_reward", j.not_learning))
    assert j.course.shape == "plateau" and 40 <= j.course.since_step <= 90, j.course
    tied = re.search(r"(\d+)% at the end", j.aspects["signal"])
    assert tied and int(tied.group(1)) >= 75, j.aspects["signal"]
    assert 40 <= j.keep.best_step <= 90 and j.keep.step is None  # no save was read: the step itself
    spikes = [e for e in j.notes if "KL spiked" in e.text]
    assert any(e.step in (283, 284) and "9.1" in e.text for e in spikes), j.notes
    assert all(e.kind == "note" for e in j.notes)

    text = run_cli("report", str(DEMO)).stdout.decode().splitlines()
    assert text[0].startswith("run ") and "NOT_LEARNING" in text[0]
    head = "\n".join(text[1:4])
    assert "correctness_reward never fired" in head and "Stop" in head and "fix the task or the reward" in head.lower()
    assert j.first_sign.step <= 50 and "correctness_reward" in j.first_sign.text  # at the alert's onset
    assert text.index(next(t for t in text if "KL spiked to 9.15" in t)) < text.index(
        next(t for t in text if t.startswith("  summary:")))  # the judgment comes before the alarms


def test_fail_on_not_learning_exits_5_on_the_demo_and_critical_lets_it_pass() -> None:
    assert run_cli("report", "--fail-on", "not_learning", str(DEMO)).returncode == EXIT_NOT_LEARNING
    assert run_cli("report", "--fail-on", "warning", str(DEMO)).returncode == 1  # its silent component's warning
    assert run_cli("report", "--fail-on", "critical", str(DEMO)).returncode == 0
    doc = json.loads(run_cli("report", "--output.format", "json", str(DEMO)).stdout)
    (run,) = doc["runs"]
    assert run["verdict"] == "not_learning" and run["judgment"]["recommendation"] == "stop"
    assert run["judgment"]["first_sign"]["kind"] == "sign"


# --- live and after the run: one judgment --------------------------------------------------------------------

@pytest.mark.parametrize("log", [DEMO, REPO / "tests" / "fixtures" / "corpus" / "grpo_kl_blowup" / "combined.log",
                                 REPO / "tests" / "fixtures" / "corpus" / "grpo_healthy" / "combined.log"],
                         ids=lambda p: p.parent.name)
def test_the_judgment_is_the_same_live_and_after_the_run(log: Path) -> None:
    """/api/v1/verdict while the run is read (its series keep a short history) and `report` after it (its digest
    keeps the whole run) judge from the same trajectories: the same judgment, word for word."""
    ex = Exporter(Config(), [LogSpec(str(log), "r")])
    ex.read_to_end()
    run = ex.runs["r"]
    run.refresh()
    live = run_document(run, Config().early_stop)
    after = _verdict(log).judgment.as_json()
    assert live["judgment"] == after
    assert live["verdict"] == _verdict(log).verdict


# --- the checkpoint to keep is one on disk ---------------------------------------------------------------------

def _with_saves(tmp_path: Path, saves: dict[int, bool], every: int = 1, log: Path = DEMO) -> Path:
    """The demo log with HF Trainer's save lines (and deletions, False) printed after the record of each step."""
    lines = log.read_text(encoding="utf-8").split("\n")
    out, step = [], 0
    for line in lines:
        out.append(line)
        if line.startswith("{'loss'"):
            step += every
            if step in saves:
                out.append(f"[INFO|trainer.py:4012] Saving model checkpoint to /ckpt/out/checkpoint-{step}")
                if not saves[step]:
                    out.append(f"[INFO|trainer.py:4120] Deleting older checkpoint [/ckpt/out/checkpoint-{step}] due "
                               "to args.save_total_limit")
    path = tmp_path / "train.log"
    path.write_text("\n".join(out), encoding="utf-8")
    return path


def test_the_checkpoint_to_keep_is_the_saved_one_nearest_the_best_step(tmp_path: Path) -> None:
    best = _verdict(DEMO).judgment.keep.best_step
    saves = {s: True for s in range(50, 301, 50)}
    keep = _verdict(_with_saves(tmp_path, saves)).judgment.keep
    nearest = min(saves, key=lambda s: (abs(s - best), s))
    assert keep.best_step == best and keep.step == nearest and keep.path == f"/ckpt/out/checkpoint-{nearest}"
    assert keep.rotated_step is None and f"checkpoint-{nearest}" in keep.text()
    # transformers 5 at its default log level says nothing of what save_total_limit deletes: the text says so
    assert not keep.known and "check it is still on disk" in keep.text()


def test_a_nearer_checkpoint_rotated_away_is_said(tmp_path: Path) -> None:
    best = _verdict(DEMO).judgment.keep.best_step
    nearest = min(range(50, 301, 50), key=lambda s: (abs(s - best), s))
    saves = {s: s != nearest for s in range(50, 301, 50)}  # save_total_limit deleted the nearest one
    keep = _verdict(_with_saves(tmp_path, saves)).judgment.keep
    assert keep.step != nearest and keep.step in saves and keep.rotated_step == nearest
    assert "was deleted since (save_total_limit)" in keep.text()
    assert keep.known and "check it is still on disk" not in keep.text()  # the trainer says what it deletes


def test_a_run_to_stop_now_whose_saves_before_the_sign_were_all_deleted_says_so(tmp_path: Path) -> None:
    """KL blows up at step ~46; the saves of steps 20 and 40 were rotated out by later ones: no checkpoint on disk
    is worth keeping, and the text names the deleted one nearest the best step instead of a damaged one."""
    log = REPO / "tests" / "fixtures" / "corpus" / "grpo_kl_blowup" / "combined.log"
    j = _verdict(_with_saves(tmp_path, {20: False, 40: False, 60: True, 80: True}, log=log)).judgment
    assert j.recommendation == "stop_now" and j.keep.before is not None and 40 < j.keep.before <= 60
    assert j.keep.step is None and j.keep.rotated_step == 40
    assert j.keep.text().startswith(f"nothing saved before step {j.keep.before} is left on disk: checkpoint-40")


def test_a_run_to_stop_now_keeps_a_checkpoint_from_before_its_first_sign(tmp_path: Path) -> None:
    """KL blows up at step ~46 and the (brevity) reward keeps rising after it: the peak is no checkpoint to keep,
    nor a save after the first sign."""
    log = REPO / "tests" / "fixtures" / "corpus" / "grpo_kl_blowup" / "combined.log"
    lines = log.read_text(encoding="utf-8").split("\n")
    out, step = [], 0
    for line in lines:
        out.append(line)
        if line.startswith("{'loss'"):
            step += 1
            if step % 20 == 0:
                out.append(f"local_global_step_folder: /ckpt/global_step_{step}")  # verl's line
    path = tmp_path / "kl.log"
    path.write_text("\n".join(out), encoding="utf-8")
    j = _verdict(path).judgment
    first = j.first_sign
    assert j.recommendation == "stop_now" and first is not None and 40 <= first.step <= 50
    assert j.keep.before == first.step and j.keep.best_step < first.step
    assert j.keep.step is not None and j.keep.step < first.step and j.keep.path.endswith(f"global_step_{j.keep.step}")


@pytest.mark.parametrize(("line", "step", "deleted"), [
    ("[INFO|trainer.py:4012] 2026-12-01 >> Saving model checkpoint to out/checkpoint-150", 150, False),
    ("Saving model checkpoint to /data/run 1/checkpoint-7/", None, None),  # a space in the path: not read whole
    ("Deleting older checkpoint [out/checkpoint-50] due to args.save_total_limit", 50, True),
    ("(TaskRunner pid=1234) local_global_step_folder: /ckpt/exp/global_step_40", 40, False),
    ("[2026-12-01 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] Saving model checkpoint: "
     "/ckpt/_actor/global_step30/mp_rank_00_model_states.pt", 30, False),
    ("[Torch] Checkpoint global_step60 is about to be saved!", 60, False),
    ("the model saved a checkpoint of its thoughts", None, None),
])
def test_what_the_trainers_say_they_saved(line: str, step: int | None, deleted: bool | None) -> None:
    e = checkpoint_event(line)
    assert (e.step, e.deleted) == (step, deleted) if step is not None else e is None


# --- the parts -----------------------------------------------------------------------------------------------

def test_a_trajectory_stays_bounded_keeps_means_and_spikes_and_cuts_back() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(1.0, 0.1, 100_000)
    values[77_777] = 50.0
    t = Trajectory()
    for a in range(0, len(values), 999):  # batches of any size
        steps = np.arange(a, min(a + 999, len(values)))
        t.extend(steps, values[steps])
    steps, means, counts = t.arrays()
    assert len(t) <= TRAJECTORY_POINTS and counts.sum() == len(values) and (np.diff(steps) > 0).all()
    assert abs(float((means * counts).sum() / counts.sum()) - float(values.mean())) < 1e-9
    peak_steps, peaks = t.peaks()
    assert peak_steps[int(np.argmax(peaks))] == 77_777 and peaks.max() == 50.0
    t.cut_back(50_000)
    assert t.arrays()[0][-1] < 50_000 and t.points > 50_000 - t.width


def test_a_learning_rate_step_is_not_a_ramp() -> None:
    steps = np.arange(1, 301)
    warmup = np.minimum(steps / 50, 1.0) * 1e-4  # doubles early in its ramp: no step
    assert lr_steps(steps, warmup) == []
    stepped = np.where(steps < 150, 1e-4, 1e-3)
    assert lr_steps(steps, stepped) == [(150, 1e-4, 1e-3)]


def test_a_surrogate_loss_jumps_only_beside_a_learning_rate_step() -> None:
    """GRPO's surrogate halves and grows sevenfold by chance between stretches of healthy runs (it is near zero):
    only a jump beside a learning-rate step counts. An SFT loss that jumps, counts by itself."""
    rng = np.random.default_rng(3)
    steps = np.arange(1, 301)
    noise = rng.normal(0, 0.02, 300)
    jumped = noise * np.where(steps < 150, 1.0, 6.0)
    assert loss_pattern(steps, jumped, surrogate=True).shape != "discontinuity"
    p = loss_pattern(steps, jumped, surrogate=True, lr_changes=[(150, 1e-4, 1e-3)])
    assert p.shape == "discontinuity" and abs(p.step - 150) <= 5
    sft = 2.0 * np.exp(-steps / 400) + rng.normal(0, 0.01, 300) + np.where(steps < 200, 0.0, 2.0)
    p = loss_pattern(steps, sft, surrogate=False)
    assert p.shape == "discontinuity" and abs(p.step - 200) <= 5
    assert loss_pattern(steps, 2.0 * np.exp(-steps / 400) + rng.normal(0, 0.01, 300), surrogate=False).shape in (
        "declining", "steady")


def test_the_live_gauges_carry_the_recommendation_and_the_checkpoint_to_keep(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.exposition.collector import ExporterCollector

    log = _with_saves(tmp_path, {s: True for s in range(50, 301, 50)})
    ex = Exporter(Config(), [LogSpec(str(log), "r")])
    ex.read_to_end()
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ex))
    text = generate_latest(registry).decode()
    keep = _verdict(log).judgment.keep
    assert 'posttrain_run_recommendation{recommendation="stop",run="r"} 1.0' in text
    assert 'posttrain_run_recommendation{recommendation="continue",run="r"} 0.0' in text
    assert 'posttrain_run_learning{run="r"} 0.0' in text
    assert f'posttrain_checkpoint_keep_step{{run="r",saved="true"}} {float(keep.step)}' in text


def test_a_reward_component_is_said_as_its_course_went() -> None:
    """A component at its ceiling that collapsed is not 'near its ceiling from the start' alone, and one that rose
    and fell back to where it began is not said to have 'moved' from a level to the same level (both read so on a
    real KL blow-up run, grpo_kl_blowup_2)."""
    from exporter.judgment.aspects import component_text
    from exporter.judgment.signal import component_of

    steps = np.arange(1, 201)
    collapsed = component_of("format_reward", steps, np.where(steps < 90, 0.95, 0.0))
    assert collapsed.at_ceiling and collapsed.fell
    said = component_text(collapsed)
    assert "started near its ceiling" in said and "fell to 0" in said
    kept = component_of("format_reward", steps, np.full(200, 0.97) - 0.02 * (steps % 2))
    assert "near its ceiling from the start" in component_text(kept) and not kept.fell
    hump = np.where((steps > 50) & (steps < 100), 0.6, 0.03) + 0.001 * (steps % 3)
    peaked = component_of("correctness_reward", steps, hump)
    said = component_text(peaked)
    assert peaked.course.shape == "peaked" and "peaked at step" in said and "fell back" in said
    rising = component_of("closeness_reward", steps, 0.2 + 0.003 * steps + 0.01 * (steps % 2))
    assert component_text(rising).startswith("closeness_reward rose")
    assert "to where it began" in said and "->" not in said  # not 'fell back (0.03 -> 0.03)'


# --- the story as it is told: the first sign, what paged, then the rest in a line ---------------------------------

CORPUS = REPO / "tests" / "fixtures" / "corpus"


def _corpus(run: str):
    return _verdict(CORPUS / run / "combined.log", run)


def test_the_alerts_that_followed_the_first_sign_are_told_in_one_line() -> None:
    """A KL blow-up brings most detectors behind it (grpo_kl_blowup_2: 13 findings). The story says the first sign
    and every page whole, and the warnings that came after it as names and steps in one line; JSON marks them."""
    v = _corpus("grpo_kl_blowup_2")
    j = v.judgment
    first = j.first_sign
    lines, then = j.told()
    after = [e for i, e in enumerate(j.story) if i in j.followed]
    assert first is not None and first.step < min(e.step for e in after)
    assert all(not e.page and e.name for e in after) and len(after) >= 5
    assert all(e.page or not e.name or e.step <= first.step for e in lines)  # what is said whole
    assert {"PostTrainDestructiveRegime", "PostTrainKLCritical"} <= {e.name for e in lines}
    assert then == ["after it: " + "; ".join(f"{e.name} (step {e.step})" for e in after)]
    assert len(lines) + len(after) == len(j.story) and len(lines) <= 8, lines
    text = run_cli("report", str(CORPUS / "grpo_kl_blowup_2" / "combined.log")).stdout.decode()
    story = text[text.index("  story:"):text.index("  summary:")]
    assert story.count("\n    step ") == len(lines) and "\n    " + then[0] + "\n" in story
    assert " in run grpo_kl_blowup_2" not in story  # the report is the run's own
    doc = j.as_json()
    assert [s.get("followed", False) for s in doc["story"]] == [i in j.followed for i in range(len(j.story))]
    html = run_cli("report", "--format", "html", str(CORPUS / "grpo_kl_blowup_2" / "combined.log")).stdout.decode()
    assert '<p class="story-then">After it: PostTrainKLWarning (step 70)' in html


def test_the_alerts_raised_at_the_first_signs_step_come_with_it() -> None:
    """grpo_length_collapse: KL critical pages at step 50 with the length, entropy and KL-warning alerts at the
    same step; they came with the first sign, not after it."""
    j = _corpus("grpo_length_collapse").judgment
    _, then = j.told()
    assert j.first_sign.step == 50 and then[0].startswith("with the first sign: ")
    assert "PostTrainEntropyCollapse" in then[0] and "(step" not in then[0]
    assert then[1].startswith("after it: ") and all(int(s) > 50 for s in re.findall(r"step (\d+)", then[1]))


@pytest.mark.parametrize("run", ["grpo_healthy", "grpo_healthy_rising", "dpo_healthy"])
def test_a_healthy_run_has_nothing_that_followed(run: str) -> None:
    j = _corpus(run).judgment
    assert j.first_sign is None and not j.followed and j.told() == (j.story, [])


def test_the_report_names_one_best_step() -> None:
    """The summary's best step is the judgment's (the checkpoint to keep is near it), not a second peak of another
    smoothing (grpo_kl_blowup_2 said 53 in the summary and 58 in the judgment)."""
    for run in ("grpo_kl_blowup_2", "grpo_peak_decline", "grpo_healthy"):
        v = _corpus(run)
        assert v.best_step == v.judgment.keep.best_step, run
        assert v.best_reward == pytest.approx(v.judgment.keep.best_level), run
    j = _corpus("grpo_kl_blowup_2").judgment
    assert f"nearest step {j.keep.best_step}" in j.action


def test_a_run_whose_reward_never_rose_keeps_no_checkpoint() -> None:
    """No checkpoint of a run with no trend is better than the model it started from: none is named, the action
    says so, and the live gauge is absent."""
    v = _corpus("grpo_no_trend")
    j = v.judgment
    assert j.learning is False and j.keep is None and j.as_json()["keep"] is None
    assert "No checkpoint is better than the model the run started from" in j.action
    assert "Keep " not in j.action
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.exposition.collector import ExporterCollector

    ex = Exporter(Config(), [LogSpec(str(CORPUS / "grpo_no_trend" / "combined.log"), "r")])
    ex.read_to_end()
    registry = CollectorRegistry()
    registry.register(ExporterCollector(ex))
    text = generate_latest(registry).decode()
    assert 'posttrain_run_learning{run="r"} 0.0' in text and "posttrain_checkpoint_keep_step{" not in text


# The recommendation that stops a run says what to change before the next one, in the trainer's own knobs.
NEXT = {"grpo_kl_blowup": ("beta", "learning rate"), "grpo_kl_blowup_2": ("learning rate", "beta"),
        "grpo_length_hacking": ("length",), "grpo_template_collapse": ("temperature",),
        "grpo_entropy_collapse": ("temperature",), "dpo_displacement": ("rpo_alpha",),
        "grpo_reward_std_collapse": ("num_generations",), "grpo_no_trend": ("fix the task or the reward",)}


@pytest.mark.parametrize("run", sorted(NEXT))
def test_a_run_told_to_stop_is_told_what_to_change(run: str) -> None:
    j = _corpus(run).judgment
    assert j.recommendation in ("stop_now", "stop"), j.headline
    assert "Before a new run: " in j.action, j.action
    for word in NEXT[run]:
        assert word in j.action, (word, j.action)


def test_every_sign_that_stops_a_run_has_a_next_step() -> None:
    from exporter.judgment.recommend import DESTRUCTIVE, NEXT_STEPS, RUN_ITS_COURSE, SILENT
    from exporter.judgment.story import NO_TREND, PEAKED

    assert DESTRUCTIVE | RUN_ITS_COURSE | {SILENT, PEAKED, NO_TREND} <= set(NEXT_STEPS)


def test_a_length_that_turned_on_the_way_is_said_with_its_low() -> None:
    """grpo_kl_blowup_2's completions went from 7.5 tokens to 16, through a collapse to about 4 at step ~93: the
    two ends alone read as plain growth. A series that went from one end to the other says no turn."""
    from exporter.judgment.aspects import turns_text

    said = _corpus("grpo_kl_blowup_2").judgment.aspects["writing"]
    low = re.search(r"completion length [^;]*, through a low of ([\d.]+) tokens at step (\d+)", said)
    assert low and float(low.group(1)) < 6 and 80 <= int(low.group(2)) <= 110, said
    steps = np.arange(100)
    assert turns_text(steps, 7 + 0.1 * steps) == ""
    dip = np.where((steps > 40) & (steps < 60), 2.0, 8.0)
    assert turns_text(steps, dip, " tokens").startswith(", through a low of 2 tokens at step ")


def test_a_loss_jump_beside_a_learning_rate_step_names_the_step() -> None:
    """grpo_lr_step: the learning rate steps 10x at step 300 and the loss's size jumps there. The headline says
    which step of the rate the jump sits beside, and the action what to check in the schedule."""
    j = _corpus("grpo_lr_step").judgment
    assert j.recommendation == "investigate" and j.first_sign.cause == "lr_jump"
    assert re.search(r"the loss jumped [\d.]+x, beside the learning rate's step from 5e-05 to 0.0005 at step 30\d",
                     j.headline), j.headline
    assert "lr_scheduler_type" in j.action


def test_trouble_on_a_plateau_keeps_the_plateaus_first_step() -> None:
    """OpenRLHF's KL blow-up (fixture): the reward is flat from step ~128 and the KL page comes at 154. The
    checkpoint to keep is the plateau's first step (as good, less drift), not a noisy high just before the page."""
    v = _verdict(REPO / "tests" / "fixtures" / "openrlhf" / "grpo_v0_11_0_kl_blowup.log")
    j = v.judgment
    assert j.recommendation == "stop_now" and j.course.shape == "plateau"
    assert j.keep.best_step == j.course.since_step < j.first_sign.step, (j.keep, j.course, j.first_sign)
