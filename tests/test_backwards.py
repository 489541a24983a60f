"""A log whose step goes back on every record (issue 24): a step that supersedes only the record before it is cut
when the batch is applied, not by a history cut per record, and the history, pass-through values and counters are
what cutting at every record gives. (A longer stretch superseded, a resume after a blow-up, is still judged by the
detectors before it is cut: tests/test_detectors.py::test_a_resume_rebuilds_the_detectors_from_history.)"""

from __future__ import annotations

import math

from exporter.instruments.keymap import KeyMap
from exporter.parsers.record import Record, RecordKind
from exporter.runstate import RunState


def back_and_forth(n: int) -> list[Record]:
    """Two writers a few steps apart (a resumed run's old and new process both still logging): the step goes back
    on every other record; one value is NaN, an evaluation record now and then."""
    out = []
    for i in range(n):
        step = i // 2 + (0 if i % 2 else 7)
        loss = math.nan if i == 300 else 1.0 / (i + 1)
        out.append(Record({"loss": loss, "reward": (i % 13) / 13, "kl": 0.01 * (i % 5), "epoch": i / 500},
                          "hf_dict", step))
        if i % 97 == 0:
            rec = Record({"eval_loss": 0.5 + i / 1e4, "epoch": i / 500}, "hf_dict", step)
            assert rec.kind is RecordKind.EVAL
            out.append(rec)
    return out


def state(run: RunState) -> tuple:
    run.refresh()
    return ({k: [(s, repr(v)) for s, v in s.history] for k, s in run.series.items()}, dict(run.passthrough),
            run.step, run.resets, dict(run.nonfinite), dict(run.records))


def test_a_step_that_goes_back_on_every_record_cuts_the_history_once_per_batch(monkeypatch) -> None:
    recs = back_and_forth(3000)
    each = RunState("r", KeyMap())
    for rec in recs:  # the history cut at every record that goes back: applied before each one
        each.refresh()
        each.ingest(rec)
    cuts: list[int] = []
    run = RunState("r", KeyMap())
    real = run._rewind
    monkeypatch.setattr(run, "_rewind", lambda step: (cuts.append(step), real(step)))
    for rec in recs:
        run.ingest(rec)
    assert state(run) == state(each)
    assert run.resets == 1500 and len(cuts) <= 3, "a cut per batch at most, not one per backwards record"
    assert sum(run.nonfinite.values()) == 1  # a dropped record's NaN is counted still
