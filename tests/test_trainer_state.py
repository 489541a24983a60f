"""trainer_state.json whose log_history is rewritten under the exporter: a run resumed from an earlier checkpoint, a
new training in the same output folder, a file rewritten with other values. The entries already read that changed
must not stay in the run: it goes back to where the history departs (a reset, as a log whose step goes back), and
reads the new entries from there."""

from __future__ import annotations

import json
import logging
import math
import os

from exporter.app import Exporter
from exporter.config import Config, LogSpec
from exporter.sources.trainer_state import TrainerStateReader


def entry(step: int, kl: float = 0.02, reward: float = 0.5) -> dict:
    return {"epoch": step / 100, "kl": kl, "loss": 0.1, "reward": reward, "step": step}


def save(path, history: list[dict], mtime: int) -> None:
    """As the Trainer writes it (the whole file, at each save); mtimes set apart, as saves minutes apart are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"global_step": history[-1]["step"] if history else 0, "log_history": history},
                              indent=2))
    os.replace(tmp, path)
    os.utime(path, (mtime, mtime))


def checkpoint(out, step: int, history: list[dict], mtime: int) -> None:
    save(out / f"checkpoint-{step}" / "trainer_state.json", history, mtime)


def exporter(path) -> Exporter:
    ex = Exporter(Config(), [LogSpec(str(path), "r")])
    ex.poll_once()
    return ex


def series(ex: Exporter, name: str) -> dict[int, float]:
    run = ex.runs["r"]
    run.refresh()
    return dict(run.series[(name, None)].history)


def active(ex: Exporter) -> list[str]:
    run = ex.runs["r"]
    run.refresh()
    return [r.detector.name for r in run.detectors.readings() if r.state.active]


def test_a_run_resumed_from_an_earlier_checkpoint_forgets_the_abandoned_steps(tmp_path, caplog) -> None:
    """KL blew up after step 10; the user resumed from checkpoint-10 and the Trainer rewrote checkpoint-20 (entries
    1-10 as before, 11-20 new and healthy). Before, entries 11-20 were taken as read already: the blown-up values
    stayed, no reset, the KL detectors active on a healthy run."""
    out = tmp_path / "out"
    crashed = [entry(s, kl=0.02 if s <= 10 else 5.0, reward=1 + s / 100) for s in range(1, 21)]
    checkpoint(out, 10, crashed[:10], mtime=1_000)
    checkpoint(out, 20, crashed, mtime=2_000)
    ex = exporter(out)
    assert series(ex, "kl")[20] == 5.0 and "kl_critical" in active(ex)
    resumed = crashed[:10] + [entry(s, reward=2 + s / 100) for s in range(11, 41)]
    caplog.set_level(logging.INFO, logger="exporter.sources.trainer_state")
    checkpoint(out, 20, resumed[:20], mtime=3_000)
    ex.poll_once()
    assert series(ex, "reward") == {s: e["reward"] for s, e in ((e["step"], e) for e in resumed[:20])}
    assert set(series(ex, "kl").values()) == {0.02}
    assert ex.runs["r"].resets == 1 and ex.runs["r"].step == 20
    assert not [d for d in active(ex) if d.startswith("kl")]
    assert ex.inputs[0].follow.truncations == 1
    said = [r.getMessage() for r in caplog.records if "log_history differs" in r.getMessage()]
    assert len(said) == 1 and "from entry 11 on" in said[0] and "read again from step 10" in said[0]
    checkpoint(out, 30, resumed[:30], mtime=4_000)  # the resumed run saves on: read on, no other reset
    ex.poll_once()
    assert series(ex, "reward") == {e["step"]: e["reward"] for e in resumed[:30]} and ex.runs["r"].resets == 1


def test_a_file_rewritten_with_as_many_entries_but_other_values_is_read(tmp_path) -> None:
    path = tmp_path / "trainer_state.json"
    save(path, [entry(s, reward=1.0) for s in range(1, 31)], mtime=1_000)
    ex = exporter(path)
    save(path, [entry(s, reward=2.0) for s in range(1, 31)], mtime=2_000)
    ex.poll_once()
    assert series(ex, "reward") == {s: 2.0 for s in range(1, 31)} and ex.runs["r"].resets == 1


def test_a_rewrite_of_the_last_step_alone_goes_back_a_step(tmp_path) -> None:
    """The last entry changed: a record at the run's last step again would cut nothing (the detectors would keep the
    old value), so the step before it is read again too, and the run goes back there."""
    path = tmp_path / "trainer_state.json"
    history = [entry(s) for s in range(1, 21)]
    save(path, history, mtime=1_000)
    ex = exporter(path)
    save(path, [*history[:19], entry(20, kl=5.0)], mtime=2_000)
    ex.poll_once()
    assert series(ex, "kl")[20] == 5.0 and series(ex, "kl")[19] == 0.02 and len(series(ex, "kl")) == 20
    assert ex.runs["r"].resets == 1


def test_a_new_training_in_the_same_output_folder_replaces_the_old_one(tmp_path) -> None:
    out = tmp_path / "out"
    checkpoint(out, 10, [entry(s, reward=1.0) for s in range(1, 11)], mtime=1_000)
    ex = exporter(out)
    checkpoint(out, 20, [entry(s, reward=2.0) for s in range(1, 21)], mtime=2_000)  # run 2's first save
    ex.poll_once()
    assert series(ex, "reward") == {s: 2.0 for s in range(1, 21)} and ex.runs["r"].resets == 1


def test_a_shorter_history_cuts_the_run_back_to_its_end(tmp_path) -> None:
    path = tmp_path / "trainer_state.json"
    history = [entry(s) for s in range(1, 21)]
    save(path, history, mtime=1_000)
    ex = exporter(path)
    save(path, history[:12], mtime=2_000)  # an earlier checkpoint's state copied over it
    ex.poll_once()
    assert sorted(series(ex, "reward")) == list(range(1, 13)) and ex.runs["r"].resets == 1
    assert ex.runs["r"].step == 12


def test_a_history_saved_again_unchanged_or_grown_is_no_rewrite(tmp_path) -> None:
    """Entries holding NaN or a nested object, saved again: the same fingerprints, nothing read twice."""
    path = tmp_path / "trainer_state.json"
    history = [entry(s) for s in range(1, 11)]
    history[3]["loss"] = math.nan
    history[4]["nested"] = {"a": [1, 2]}
    save(path, history, mtime=1_000)
    ex = exporter(path)
    save(path, history, mtime=2_000)
    ex.poll_once()
    save(path, [*history, entry(11)], mtime=3_000)
    ex.poll_once()
    assert ex.stats["r"].lines["trainer_state", "record"] == 11
    assert ex.runs["r"].resets == 0 and ex.inputs[0].follow.truncations == 0


def test_fingerprints_tell_entries_apart() -> None:
    from exporter.sources.trainer_state import _fingerprint

    a = json.loads('{"step": 5, "loss": NaN, "kl": 0.1}')
    assert _fingerprint(a) == _fingerprint(json.loads('{"step": 5, "loss": NaN, "kl": 0.1}'))
    assert _fingerprint(a) != _fingerprint(json.loads('{"step": 5, "loss": NaN, "kl": 0.2}'))
    assert _fingerprint({"x": [1]}) != _fingerprint({"x": [2]}) and _fingerprint(3) != _fingerprint("3")


def test_the_reader_alone_reads_from_the_step_before_the_departure(tmp_path) -> None:
    """Entries 11-14 were dropped and 15 on rewritten: the records start at step 10 (below every abandoned step),
    whose entry is read again, unchanged."""
    path = tmp_path / "trainer_state.json"
    save(path, [entry(s) for s in range(1, 21)], mtime=1_000)
    reader = TrainerStateReader(str(path))
    assert [r.step for r in reader.poll()] == list(range(1, 21))
    save(path, [entry(s) for s in range(1, 11)] + [entry(s, reward=9.0) for s in range(15, 25)], mtime=2_000)
    assert [r.step for r in reader.poll()] == [10, *range(15, 25)] and reader.rewrites == 1
