"""HF Trainer's `trainer_state.json`: `log_history` with full precision and each record's step.

The trainer rewrites the whole file at every checkpoint, so it is read whole when it changes and
only the entries not seen before become records. A history whose entries already read changed (a run
resumed from an earlier checkpoint, a new training in the same output folder, a file rewritten, a shorter
one) is read again from the last step before where it departs: the record at that step goes back, so the
run cuts its history there (a reset), as for a log whose step goes back, and takes the new entries. An
entry that cannot be a record (not an object, no valid step) is counted in `entry_errors`.

The file is known by its name, or by its content under another name (a JSON object with a
`log_history` key, copied out of a checkpoint or renamed). A Trainer's output folder is read through
its newest trainer_state.json: the Trainer writes one into each `checkpoint-N/` folder as it saves,
and its own at the end of training; a newer checkpoint is followed as it appears."""

from __future__ import annotations

import logging
import os
import re
from array import array
from collections import Counter

from exporter.parsers.jsonl import flatten_numeric, loads_bounded, step_of_json
from exporter.parsers.record import ParseError, Record
from exporter.parsers.values import Skip

log = logging.getLogger(__name__)

NAME = "trainer_state.json"
_SNIFF_BYTES = 64 << 10  # the Trainer sorts its keys: log_history comes after a few short ones
_CHECKPOINT = re.compile(r"checkpoint-(\d{1,15})")
# A JSON string or a bracket: the tokens that give the nesting. The string's closing quote is optional, so
# that an unclosed one is consumed once to the end, not scanned again from each of its escaped quotes.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[{}\[\]]', re.DOTALL)
_COLON = re.compile(r"\s*+:")


def looks_like_trainer_state(path: str) -> bool:
    """A trainer_state.json by name, a file holding one under another name, or a folder holding one."""
    if os.path.basename(path) == NAME:
        return True
    if os.path.isdir(path):
        return trainer_state_in(path) is not None
    return os.path.isfile(path) and holds_log_history(path)  # never read from a FIFO to judge it


def holds_log_history(path: str) -> bool:
    """The file's text is a JSON object with a `log_history` key (judged from its first 64 KiB)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES).decode("utf-8", "replace").lstrip()
    except OSError:
        return False
    return head[:1] == "{" and head[1:].lstrip()[:1] == '"' and _key_of_first_object(head, '"log_history"')


def _key_of_first_object(text: str, key: str) -> bool:
    """`key` (quoted) is a key of the JSON object `text` starts with, before that object closes (a JSON
    lines file's later objects do not count)."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in ("{", "["):
            depth += 1
        elif token in ("}", "]"):
            depth -= 1
            if depth == 0:
                return False
        elif depth == 1 and token == key and _COLON.match(text, m.end()):
            return True
    return False


def trainer_state_in(folder: str) -> str | None:
    """The newest trainer_state.json of a Trainer's output folder (its own, or a `checkpoint-N/` one's), by
    modification time and then by checkpoint number; None when it holds none."""
    best: tuple[int, int, str] | None = None
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    for entry in entries:
        if entry.name == NAME:
            candidate, number = entry.path, -1
        elif (m := _CHECKPOINT.fullmatch(entry.name)) is not None:
            candidate, number = os.path.join(entry.path, NAME), int(m.group(1))
        else:
            continue
        try:
            mtime = os.stat(candidate).st_mtime_ns
        except OSError:
            continue
        if best is None or (mtime, number) > best[:2]:
            best = (mtime, number, candidate)
    return None if best is None else best[2]


def checkpoints_in(folder: str) -> list[tuple[int, str]]:
    """The `checkpoint-N/` folders of a Trainer's output folder, by step: what is on disk now."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    out = []
    for entry in entries:
        m = _CHECKPOINT.fullmatch(entry.name)
        if m is not None and entry.is_dir():
            out.append((int(m.group(1)), entry.path))
    return sorted(out)


class TrainerStateReader:
    """One trainer_state.json, or the newest of a Trainer's output folder (`path` is then the folder)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.up = False
        # One hash per log_history entry read, in order: enough to find where a rewritten history departs from
        # what was read, at 8 bytes an entry (a long run's history holds tens of thousands), without keeping
        # the entries themselves.
        self._seen = array("q")
        self._top = -1  # the highest step of the entries read
        self._sig: tuple[str, int, int] | None = None  # (file, mtime_ns, size) of the last read
        self.entry_errors: Counter[str] = Counter()  # log_history entries that are no record, by reason
        self.bytes_read = 0  # bytes read from the file, every (re)read whole
        self.rewrites = 0  # histories whose entries already read changed: read again from where they differ

    def _file(self) -> str | None:
        return trainer_state_in(self.path) if os.path.isdir(self.path) else self.path

    def output_dir(self) -> str:
        """The Trainer's output folder: the one given, or the one holding the file (OUT/trainer_state.json, or
        OUT/checkpoint-N/trainer_state.json)."""
        if os.path.isdir(self.path):
            return self.path
        parent = os.path.dirname(os.path.abspath(self.path))
        return os.path.dirname(parent) if _CHECKPOINT.fullmatch(os.path.basename(parent)) else parent

    def poll(self) -> list[Record]:
        """New records since the last poll. Raises ParseError for a file that is not (yet) valid."""
        try:
            path = self._file()
            if path is None:
                raise FileNotFoundError(self.path)
            st = os.stat(path)
            sig = (path, st.st_mtime_ns, st.st_size)
            if sig == self._sig:
                return []
            with open(path, "rb") as f:
                data = f.read()
            self.bytes_read += len(data)
            text = data.decode("utf-8", "replace")
        except OSError:
            self.up = False
            return []
        self.up = True
        history = _log_history(text)
        self._sig = sig
        seen = array("q", map(_fingerprint, history))
        start = len(self._seen)
        if seen[:start] != self._seen:  # entries already read changed (or are gone): not the history read
            start = self._restart(path, history, _divergence(self._seen, seen))
        records = []
        for entry in history[start:]:
            try:
                rec = _record(entry)
            except Skip as s:
                self.entry_errors[s.reason] += 1
                continue
            if rec is not None:
                records.append(rec)
                self._top = max(self._top, rec.step)  # type: ignore[type-var]
        self._seen = seen
        return records

    def _restart(self, path: str, history: list, k: int) -> int:
        """The entry to read again from, for a history that departs at entry `k` from the one read. The run must
        forget what the entries from `k` on gave, and it does by its own rule (RunState.ingest): a training record
        whose step goes back cuts the history from that step on, counted as a reset. So the records read again
        start at the last step of the entries before `k` that is below the highest step read: no entry from `k` on
        was at a lower step (steps never go back within a history), and a record there goes back (one at the
        highest step again would cut nothing: the detectors would keep what the old entries gave). The entries of
        that step, unchanged, are read again after the cut."""
        self.rewrites += 1
        steps = [_step_of(e) for e in history]  # only here, on a rewrite: not for every save
        below = [s for s in steps[:k] if s is not None and s < self._top]
        start = 0  # nothing kept below the highest step (a new training in the same folder): read whole
        if below:
            cut, start = below[-1], k
            while start > 0 and (steps[start - 1] is None or steps[start - 1] >= cut):  # type: ignore[operator]
                start -= 1
        log.info("%s: its log_history differs from the one read from entry %d on (a resumed or new training, or a "
                 "rewritten file): read again from %s", path, k + 1,
                 f"step {steps[start]}" if start < len(steps) else "its end")
        self._top = max((s for s in steps[:start] if s is not None), default=-1)
        return start


def _fingerprint(entry: object) -> int:
    """A hash of one log_history entry, stable within the process (never stored). A flat entry (the Trainer's:
    numbers and a few strings) hashes as its items, 6 times cheaper than its repr (18 against 118 ms for 50,000
    entries, beside 70 ms to parse them); one holding a list or an object, by its repr. NaN is safe: json gives
    the same NaN object every time (json.decoder.NaN), so its identity-based hash holds. Two entries that differ
    only where hashes collide read as one (in 64 bits, in practice only CPython's hash(-1) == hash(-2): an integer
    value rewritten from -1 to -2), a cost taken for not keeping the entries."""
    try:
        return hash(tuple(entry.items())) if isinstance(entry, dict) else hash(repr(entry))
    except TypeError:
        return hash(repr(entry))


def _divergence(old: array, new: array) -> int:
    """The index of the first entry that differs (the shorter length when one is the other's start)."""
    return next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))


def _step_of(entry: object) -> int | None:
    try:
        return step_of_json(entry["step"]) if isinstance(entry, dict) and "step" in entry else None
    except Skip:
        return None


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
