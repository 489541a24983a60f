"""trainer_state.json whose log_history is rewritten under the exporter: a run resumed from an earlier checkpoint, a
new training in the same output folder, a file rewritten with other values. The entries already read that changed
must not stay in the run: it goes back to where the history departs (a reset, as a log whose step goes back), and
reads the new entries from there."""

from __future__ import annotations

import json
import logging
import math
import os
import time

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


# --- hostile files: huge, truncated mid-write, swapped, rewritten in place -----------------------------------------


def test_a_huge_history_is_read_in_bounded_pieces_and_an_entry_too_large_is_left_out(tmp_path) -> None:
    """The whole file was read, decoded and parsed at once (a 100 MB file took the exporter past 1 GB): entries are
    read one at a time and handed over at most RECORDS_PER_POLL a poll (the reader is `behind` meanwhile); an entry
    over 1 MiB is left out unread and counted, the entries around it read."""
    from exporter.sources.trainer_state import RECORDS_PER_POLL

    path = tmp_path / "trainer_state.json"
    history = [entry(s) for s in range(1, 2 * RECORDS_PER_POLL + 500)]
    history[99]["note"] = "z" * (2 << 20)
    save(path, history, mtime=1_000)
    reader = TrainerStateReader(str(path))
    polls = []
    while not polls or reader.behind:
        polls.append([r.step for r in reader.poll()])
        assert len(polls) < 10
    assert [len(p) for p in polls] == [RECORDS_PER_POLL, RECORDS_PER_POLL, len(history) - 1 - 2 * RECORDS_PER_POLL]
    assert [s for p in polls for s in p] == [s for s in range(1, len(history) + 1) if s != 100]
    assert reader.dropped == {"entry_too_large": 1} and reader.rewrites == 0
    assert reader.poll() == []  # unchanged: nothing read again


def test_a_file_cut_mid_write_gives_what_it_holds_and_is_counted_once(tmp_path) -> None:
    """The Trainer writes the file in place: read mid-write, it ends inside its JSON. The entries before the cut are
    taken, the error counted once for that version of the file (it was counted at every poll), and the whole file,
    once written, gives the rest with no reset."""
    path = tmp_path / "trainer_state.json"
    save(path, [entry(s) for s in range(1, 11)], mtime=1_000)
    ex = exporter(path)
    full = json.dumps({"global_step": 20, "log_history": [entry(s) for s in range(1, 21)]}, indent=2)
    path.write_text(full[: full.index('"step": 15') + 5])
    os.utime(path, (2_000, 2_000))
    for _ in range(5):
        ex.poll_once()
    assert sorted(series(ex, "kl")) == list(range(1, 15))
    assert ex.stats["r"].parse_errors["trainer_state", "bad_trainer_state"] == 1
    path.write_text(full)
    os.utime(path, (3_000, 3_000))
    ex.poll_once()
    assert sorted(series(ex, "kl")) == list(range(1, 21)) and ex.runs["r"].resets == 0


def test_a_symlink_swapped_to_another_file_of_the_same_size_and_time_is_read(tmp_path) -> None:
    """`trainer_state.json` a symlink, swapped to another training's file of the same size and modification time: it
    was taken as unchanged (known by path, time and size); the file's identity is part of what says it changed."""
    a, b, link = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "trainer_state.json"
    save(a, [entry(s, reward=1.0) for s in range(1, 11)], mtime=1_000)
    save(b, [entry(s, reward=2.0) for s in range(1, 11)], mtime=1_000)
    assert a.stat().st_size == b.stat().st_size
    link.symlink_to(a)
    ex = exporter(link)
    assert set(series(ex, "reward").values()) == {1.0}
    tmp = tmp_path / "swap"
    tmp.symlink_to(b)
    os.replace(tmp, link)
    ex.poll_once()
    assert series(ex, "reward") == {s: 2.0 for s in range(1, 11)} and ex.runs["r"].resets == 1


def test_a_history_rewritten_in_place_every_100_ms_gives_every_entry_once(tmp_path) -> None:
    """A writer rewrites the file in place (truncated, then written in pieces) every 100 ms, 5 entries longer each
    time, while the exporter polls: every entry arrives once, in order, with no reset. This held before; the test
    keeps it so with the streamed reader, which takes the entries of a file read mid-write."""
    import threading

    path = tmp_path / "trainer_state.json"
    save(path, [entry(1)], mtime=1_000)
    ex = exporter(path)
    done = threading.Event()

    def write() -> None:
        for n in range(5, 151, 5):
            text = json.dumps({"global_step": n, "log_history": [entry(s) for s in range(1, n + 1)]}, indent=2)
            with path.open("w") as f:
                for i in range(0, len(text), 4096):
                    f.write(text[i:i + 4096])
                    f.flush()
            time.sleep(0.1)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not done.is_set():
        ex.poll_once()
        time.sleep(0.01)
    writer.join()
    os.utime(path, (5_000, 5_000))  # a last, whole version
    ex.poll_once()
    while ex.inputs[0].catching_up:
        ex.poll_once()
    assert sorted(series(ex, "kl")) == list(range(1, 151))
    assert ex.runs["r"].resets == 0 and ex.stats["r"].lines["trainer_state", "record"] == 150
