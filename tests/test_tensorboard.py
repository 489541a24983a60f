"""TensorBoard event files as a source, read without TensorFlow: the real event file the grpo fixture's TRL run
wrote gives every training record with its exact step and the values trainer_state.json holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import TRL, trainer_state

from exporter.parsers.record import RecordKind
from exporter.sources.tensorboard import TensorBoardReader, crc32c, masked_crc

EVENTS = TRL / "grpo" / "tensorboard"


def read_all(path: Path) -> tuple[list, dict]:
    r = TensorBoardReader(str(path))
    return r.poll() + r.finish(), r.errors


def test_crc32c_known_value() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the standard CRC-32C check value
    assert masked_crc(b"") != crc32c(b"")


def test_every_training_record_with_its_exact_step_and_value() -> None:
    recs, errors = read_all(EVENTS)
    assert errors == {}
    train = {r.step: r.values for r in recs if r.kind is RecordKind.TRAIN}
    want = [e for e in trainer_state("grpo") if "loss" in e and "train_runtime" not in e and "eval_loss" not in e]
    assert sorted(train) == [e["step"] for e in want] == list(range(1, 301))
    for e in want:
        got = train[e["step"]]
        for key in ("loss", "kl", "entropy", "grad_norm"):
            assert got[key] == pytest.approx(e[key], rel=1e-6, abs=1e-9), (e["step"], key)  # float32 in the file
        if "reward_std" in e:
            assert got["reward_std"] == pytest.approx(e["reward_std"], rel=1e-6, abs=1e-9)
    kinds = [r.kind for r in recs]
    assert kinds.count(RecordKind.EVAL) == 3 and kinds.count(RecordKind.SUMMARY) == 1


def _event_file(folder: Path) -> Path:
    (f,) = folder.rglob("*tfevents*")
    return f


def test_a_growing_file_is_read_as_it_grows_without_loss_or_repeat(tmp_path: Path) -> None:
    data = _event_file(EVENTS).read_bytes()
    target = tmp_path / "events.out.tfevents.1.host"
    target.write_bytes(b"")
    r = TensorBoardReader(str(tmp_path))
    got = []
    for i in range(0, len(data), 7777):  # cuts fall inside records
        with target.open("ab") as f:
            f.write(data[i:i + 7777])
        got += r.poll()
    got += r.finish()
    whole, _ = read_all(EVENTS)
    assert [(x.step, x.values) for x in got] == [(x.step, x.values) for x in whole]


def test_damage_is_counted_and_the_rest_still_read(tmp_path: Path) -> None:
    data = bytearray(_event_file(EVENTS).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one payload byte: that record fails its CRC, the others are read
    (tmp_path / "events.out.tfevents.2.host").write_bytes(bytes(data))
    recs, errors = read_all(tmp_path)
    assert errors.get("bad_crc") == 1
    assert len([r for r in recs if r.kind is RecordKind.TRAIN]) >= 299
    corrupt = tmp_path / "c"
    corrupt.mkdir()
    head = bytes(data[:5000]) + b"\xff" * 16 + bytes(data[5000:])  # a length no CRC vouches for
    (corrupt / "events.out.tfevents.3.host").write_bytes(head)
    recs, errors = read_all(corrupt)
    assert errors.get("bad_length") == 1


def test_a_folder_with_several_event_files_is_read_in_order(tmp_path: Path) -> None:
    src = _event_file(EVENTS)
    (tmp_path / "a").mkdir()
    shutil.copy(src, tmp_path / "a" / "events.out.tfevents.1000.host.1.0")
    recs, _ = read_all(tmp_path)
    assert len(recs) == 304 and recs[0].step == 1


def test_the_exporter_reads_a_trainers_event_files_as_a_run() -> None:
    """Pointed at the folder the Trainer writes (auto-detected), the run has the same steps and detector state
    as when it reads the console log; its eval and summary records count as such."""
    from exporter.app import Exporter
    from exporter.config import Config, LogSpec

    tb = Exporter(Config(), [LogSpec(str(EVENTS), "tb")])
    tb.read_to_end()
    console = Exporter(Config(), [LogSpec(str(TRL / "grpo" / "combined.log"), "c")])
    console.read_to_end()
    a, b = tb.runs["tb"], console.runs["c"]
    assert a.step == b.step == 300 and a.finished
    assert dict(a.records) == dict(b.records)
    assert a.series["kl", None].last_value == pytest.approx(b.series["kl", None].last_value, rel=1e-3)
    assert [r.detector.name for r in a.detectors.readings() if r.state.episodes] == \
        [r.detector.name for r in b.detectors.readings() if r.state.episodes]
    assert tb.stats["tb"].lines["tensorboard", "record"] == 304
    # its bytes are counted as every source's are (posttrain_exporter_source_read_bytes_total)
    event_bytes = sum(p.stat().st_size for p in (EVENTS.glob("**/*tfevents*") if EVENTS.is_dir() else [EVENTS]))
    assert tb.inputs[0].follow.bytes_read == event_bytes > 0


def test_event_files_are_read_in_bounded_pieces_and_what_is_left_out_is_counted(tmp_path: Path) -> None:
    """The rest of an event file was read whole at each poll, a step kept every tag it had, and a record of up to
    64 MiB was read: now a poll reads at most CHUNK_BYTES (the reader is `behind` meanwhile), a record over
    MAX_EVENT is skipped unread (event_too_large) and a step keeps MAX_TAGS scalars (event_tags_over_cap); the
    steps around them are read."""
    from support.hostile_inputs import event, field_padding

    from exporter.sources.tensorboard import CHUNK_BYTES, MAX_EVENT, MAX_TAGS

    path = tmp_path / "events.out.tfevents.1.host"
    data = event(1, {"train/loss": 0.9}) + event(2, {f"train/t{k}": 1.0 for k in range(MAX_TAGS + 10)})
    data += event(3, {"train/loss": 0.5}, field_padding(MAX_EVENT + 1))
    data += b"".join(event(s, {"train/loss": 1 / s}) for s in range(4, 4 + 2 * CHUNK_BYTES // 30))
    path.write_bytes(data)
    reader = TensorBoardReader(str(path))
    records, polls = reader.poll(), 1
    assert reader.behind
    while reader.behind:
        records += reader.poll()
        polls += 1
    records += reader.finish()
    assert polls >= 3
    by_step = {r.step: r.values for r in records}
    assert by_step[1] == {"loss": pytest.approx(0.9)} and len(by_step[2]) == MAX_TAGS and 3 not in by_step
    assert max(by_step) == 3 + 2 * CHUNK_BYTES // 30 and len(by_step) == 2 + 2 * CHUNK_BYTES // 30
    assert dict(reader.dropped) == {"event_too_large": 1, "event_tags_over_cap": 10} and not reader.errors
