"""HF Trainer's `trainer_state.json`: `log_history` with full precision and each record's step.

The trainer rewrites the whole file at every checkpoint, so it is read whole when it changes and
only the entries not seen before become records. A shorter history than before is a new run."""

from __future__ import annotations

import json
import os

from exporter.parsers.jsonl import flatten_numeric
from exporter.parsers.record import ParseError, Record


def looks_like_trainer_state(path: str) -> bool:
    return os.path.basename(path) == "trainer_state.json"


class TrainerStateReader:
    def __init__(self, path: str) -> None:
        self.path = path
        self.up = False
        self._seen = 0
        self._sig: tuple[int, int] | None = None  # (mtime_ns, size) of the last read

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
        try:
            history = json.loads(text)["log_history"]
            if not isinstance(history, list):
                raise TypeError("log_history is not a list")
        except (ValueError, KeyError, TypeError) as e:
            # Half-written by the trainer, most likely: the next change is read again.
            raise ParseError("bad_trainer_state", str(e)[:80], "trainer_state") from None
        self._sig = sig
        if len(history) < self._seen:
            self._seen = 0
        records = []
        for entry in history[self._seen :]:
            if not isinstance(entry, dict):
                continue
            values: dict[str, float] = {}
            skipped: dict[str, int] = {}
            step = entry.get("step")
            flatten_numeric({k: v for k, v in entry.items() if k != "step"}, "", values, skipped)
            if isinstance(step, int) and values:
                records.append(Record(values=values, fmt="trainer_state", step=step, skipped=skipped))
        self._seen = len(history)
        return records
