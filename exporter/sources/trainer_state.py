"""HF Trainer's `trainer_state.json`: `log_history` with full precision and each record's step.

The trainer rewrites the whole file at every checkpoint, so it is read whole when it changes and
only the entries not seen before become records. A shorter history than before is a new run.
An entry that cannot be a record (not an object, no valid step) is counted in `entry_errors`."""

from __future__ import annotations

import os
from collections import Counter

from exporter.parsers.jsonl import flatten_numeric, loads_bounded, step_of_json
from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip


def looks_like_trainer_state(path: str) -> bool:
    return os.path.basename(path) == "trainer_state.json"


class TrainerStateReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.up = False
        self._seen = 0
        self._sig: tuple[int, int] | None = None  # (mtime_ns, size) of the last read
        self.entry_errors: Counter[str] = Counter()  # log_history entries that are no record, by reason

    def poll(self) -> list[Record]:
        """New records since the last poll. Raises ParseError for a file that is not (yet) valid."""
        try:
            st = os.stat(self.path)
            sig = (st.st_mtime_ns, st.st_size)
            if sig == self._sig:
                return []
            with open(self.path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            self.up = False
            return []
        self.up = True
        history = _log_history(text)
        self._sig = sig
        if len(history) < self._seen:
            self._seen = 0
        records = []
        for entry in history[self._seen :]:
            try:
                rec = _record(entry)
            except Skip as s:
                self.entry_errors[s.reason] += 1
                continue
            if rec is not None:
                records.append(rec)
        self._seen = len(history)
        return records


def _log_history(text: str) -> list:
    """The file's log_history. Raises ParseError: a file half-written by the trainer, most likely, which
    the next change reads again."""
    doc = loads_bounded(text, "trainer_state", "bad_trainer_state")
    history = doc.get("log_history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        raise ParseError("bad_trainer_state", "no log_history list", "trainer_state")
    return history


def _record(entry: object) -> Record | None:
    """One log_history entry as a record (None when it holds no number); raises Skip when it cannot be one."""
    if not isinstance(entry, dict):
        raise Skip("bad_entry")
    if "step" not in entry:
        raise Skip("no_step")
    step = step_of_json(entry["step"])
    values: dict[str, float] = {}
    skipped: dict[str, int] = {}
    flatten_numeric({k: v for k, v in entry.items() if k != "step"}, "", values, skipped)
    return Record(values=values, fmt="trainer_state", step=step, skipped=skipped) if values else None
