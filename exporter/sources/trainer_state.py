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

import codecs
import json
import logging
import os
import re
import time
from array import array
from collections import Counter

from exporter.parsers.jsonl import flatten_numeric, parse_int_bounded, step_of_json
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
_WS = re.compile(r"\s*+")
_IN_STRING = re.compile(r'["\\]')
_OUTSIDE = re.compile(r'["{}\[\],]')
_DECODER = json.JSONDecoder(parse_int=parse_int_bounded)
READ_BYTES = 1 << 20  # read of the file at a time
MAX_ENTRY_CHARS = 1 << 20  # a log_history entry longer than this is skipped unread (entry_too_large)
MAX_VALUE_CHARS = 1 << 20  # so is any other value of the object longer than this (not counted: no record)
MAX_ENTRIES = 1 << 20  # entries of a history followed (16 bytes each); later ones are left out (entries_over_cap)
RECORDS_PER_POLL = 8192  # records one poll hands over; a longer history goes on at the next poll
RECORD_CHARS_PER_POLL = 8 << 20  # characters of entries one poll hands over as records
READ_DUTY = 3.0  # a changed file is read again at the earliest this many times its last pass's time after it
DUTY_FROM_SECONDS = 0.05  # a pass shorter than this (a file of a few MB) delays nothing
NO_STEP = -1
TOO_DEEP = object()  # an entry nested deeper than json's recursion allows: skipped, counted too_deep
# what the reader leaves out, by reason (entries): over MAX_ENTRY_CHARS, past MAX_ENTRIES
DROP_REASONS = ("entry_too_large", "entries_over_cap")


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
    """One trainer_state.json, or the newest of a Trainer's output folder (`path` is then the folder).

    Read in bounded memory whatever the file's size: a pass reads the file READ_BYTES at a time and decodes one
    log_history entry at a time (an entry over MAX_ENTRY_CHARS is skipped unread, counted), keeps 16 bytes per entry
    (MAX_ENTRIES at most) and hands over at most RECORDS_PER_POLL records or RECORD_CHARS_PER_POLL characters of
    entries per poll: the pass goes on at the next poll (`behind`) while the file is unchanged, and starts again from
    the file's start when it changed. A file that changes again and again is read whole at most once per
    READ_DUTY times the time its last pass took (when that was over DUTY_FROM_SECONDS), so that a huge file
    rewritten every 100 ms costs a bounded share of a core. A file that ends mid-value (written as it was read)
    hands over the entries read before that, the error is counted once (entry_errors), and it is read again when
    it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.up = False
        # One hash and one step per log_history entry read, in order: enough to find where a rewritten history
        # departs from what was read, at 16 bytes an entry (a long run's history holds tens of thousands), without
        # keeping the entries themselves.
        self._seen = array("q")
        self._steps = array("q")  # NO_STEP for an entry without one
        self._top = -1  # the highest step of the entries read
        self._sig: tuple[str, int, int, int] | None = None  # (file, inode, mtime_ns, size) of the last whole pass
        self._pass: _Pass | None = None  # a pass not finished at the last poll (more records than one poll hands)
        self._next_pass = 0.0  # monotonic time before which a changed file is not read again (READ_DUTY)
        self.entry_errors: Counter[str] = Counter()  # log_history entries that are no record, by reason
        self.dropped: Counter[str] = Counter()  # entries left out unread, by reason (DROP_REASONS)
        self.bytes_read = 0  # bytes read from the file, every (re)read whole
        self.rewrites = 0  # histories whose entries already read changed: read again from where they differ

    @property
    def behind(self) -> bool:
        """A pass is under way: more records are waiting than one poll hands over."""
        return self._pass is not None

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
        """New records since the last poll. A file that is not (yet) valid is counted in entry_errors (its reason),
        once per version of it."""
        try:
            path = self._file()
            if path is None:
                raise FileNotFoundError(self.path)
            st = os.stat(path)
        except OSError:
            self.up = False
            return []
        self.up = True
        sig = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        if self._pass is not None and self._pass.sig != sig:  # changed (or swapped) under a pass: start again
            self._pass.close()
            self._pass = None
        if self._pass is None:
            if sig == self._sig or time.monotonic() < self._next_pass:
                return []
            try:
                self._pass = _Pass(path)
            except OSError:
                self.up = False
                return []
        return self._take()

    def _take(self) -> list[Record]:
        """Records from the pass under way, at most one poll's worth; ends the pass at the file's end."""
        p = self._pass
        assert p is not None
        records: list[Record] = []
        chars = 0
        t0 = time.perf_counter()
        try:
            while len(records) < RECORDS_PER_POLL and chars < RECORD_CHARS_PER_POLL:
                item = p.next_entry()
                if item is None:  # the end of log_history, and of the file
                    if p.index < len(self._seen):  # shorter than the history read: it departs at its end
                        self._depart(p, p.index)
                        continue
                    self._end_pass(p, t0)
                    return records
                entry, size = item
                i = p.index - 1
                fingerprint = _fingerprint(entry) if size >= 0 else hash(("too_large", -size))
                if i < len(self._seen):
                    if self._seen[i] != fingerprint:
                        self._depart(p, i)
                    continue
                if i >= MAX_ENTRIES:
                    self.dropped["entries_over_cap"] += 1
                    continue
                self._seen.append(fingerprint)
                step = _step_of(entry) if size >= 0 else None
                self._steps.append(NO_STEP if step is None else step)
                if entry is TOO_DEEP:
                    self.entry_errors["too_deep"] += 1
                    continue
                if size < 0:
                    self.dropped["entry_too_large"] += 1
                    continue
                chars += size
                try:
                    rec = _record(entry)
                except Skip as s:
                    self.entry_errors[s.reason] += 1
                    continue
                if rec is not None:
                    records.append(rec)
                    self._top = max(self._top, rec.step)  # type: ignore[type-var]
        except ParseError as e:  # counted once per version of the file; the records before it are kept
            self.entry_errors[e.reason] += 1
            self._end_pass(p, t0)
            return records
        p.spent += time.perf_counter() - t0
        return records

    def _end_pass(self, p: _Pass, t0: float) -> None:
        p.spent += time.perf_counter() - t0
        p.close()
        self.bytes_read += p.bytes_read
        self._sig, self._pass = p.sig, None
        self._next_pass = time.monotonic() + READ_DUTY * p.spent if p.spent > DUTY_FROM_SECONDS else 0.0

    def _depart(self, p: _Pass, k: int) -> None:
        """The file's history departs at entry `k` from the one read: keep the entries before the record to read
        again (_restart), and read the file again from its start."""
        start = self._restart(p.path, k)
        del self._seen[start:]
        del self._steps[start:]
        p.rewind()

    def _restart(self, path: str, k: int) -> int:
        """The entry to read again from, for a history that departs at entry `k` from the one read. The run must
        forget what the entries from `k` on gave, and it does by its own rule (RunState.ingest): a training record
        whose step goes back cuts the history from that step on, counted as a reset. So the records read again
        start at the last step of the entries before `k` that is below the highest step read: no entry from `k` on
        was at a lower step (steps never go back within a history), and a record there goes back (one at the
        highest step again would cut nothing: the detectors would keep what the old entries gave). The entries of
        that step, unchanged, are read again after the cut."""
        self.rewrites += 1
        steps = self._steps
        below = [s for s in steps[:k] if s != NO_STEP and s < self._top]
        start = 0  # nothing kept below the highest step (a new training in the same folder): read whole
        if below:
            cut, start = below[-1], k
            while start > 0 and (steps[start - 1] == NO_STEP or steps[start - 1] >= cut):
                start -= 1
        log.info("%s: its log_history differs from the one read from entry %d on (a resumed or new training, or a "
                 "rewritten file): read again from %s", path, k + 1,
                 f"step {steps[start]}" if start < len(steps) and steps[start] != NO_STEP else f"entry {start + 1}")
        self._top = max((s for s in steps[:start] if s != NO_STEP), default=-1)
        return start


class _Pass:
    """One read of one version of the file: its log_history's entries one at a time, from READ_BYTES reads."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "rb")  # noqa: SIM115  # held across polls while the pass goes on; close() closes it
        st = os.fstat(self.f.fileno())  # the file opened (a symlink swapped since the stat is seen at the next poll)
        self.sig, self.path = (path, st.st_ino, st.st_mtime_ns, st.st_size), path
        self.spent = 0.0  # seconds of work on this pass
        self.bytes_read = 0
        self.rewind()

    def rewind(self) -> None:
        self.f.seek(0)
        self.index = 0  # entries of log_history read so far
        self._entries = _entries(_Text(self.f, self))

    def next_entry(self) -> tuple[object, int] | None:
        """The next entry and its length in characters (negative: too large, skipped; the entry is None); None at
        the end. Raises ParseError for a file that is no trainer_state or ends early."""
        try:
            item = next(self._entries)
        except StopIteration:
            return None
        self.index += 1
        return item

    def close(self) -> None:
        self.f.close()


class _Text:
    """A file's text, read READ_BYTES at a time: what is held is the value being decoded, not the file."""

    def __init__(self, f, owner: _Pass) -> None:
        self._f, self._owner = f, owner
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        self.buf, self.pos, self.eof = "", 0, False

    def more(self) -> bool:
        if self.eof:
            return False
        data = self._f.read(READ_BYTES)
        self._owner.bytes_read += len(data)
        self.eof = not data
        self.buf = self.buf[self.pos:] + self._decode(data, final=self.eof)
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end), not taken."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def take(self, expected: str) -> str:
        c = self.peek()
        if c not in expected:
            raise _bad(f"expected {' or '.join(map(repr, expected))}, found {c!r}" if c else "ends early")
        self.pos += 1
        return c

    def value(self, limit: int) -> tuple[object, int]:
        """The JSON value here and its length; (None, -length) when it is over `limit` characters (skipped)."""
        self.peek()
        while True:
            end = -1
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except RecursionError:  # nested thousands deep: read past, as one too large
                return TOO_DEEP, -self._skip()
            except ValueError:
                pass
            if end >= 0 and (end < len(self.buf) or self.eof):  # a number at the end of the text may go on
                n, self.pos = end - self.pos, end
                return obj, n
            if len(self.buf) - self.pos > limit:
                return None, -self._skip()
            if not self.more():
                raise _bad("ends inside a value")

    def _skip(self) -> int:
        """Moves past the value here without decoding it (a container, a string, or a bare number or word);
        its length."""
        depth, in_string, length = 0, False, 0
        first = self.buf[self.pos]
        if first == '"':
            in_string, self.pos, length = True, self.pos + 1, 1
        while True:
            buf, i = self.buf, self.pos
            while True:
                if in_string:
                    m = _IN_STRING.search(buf, i)
                    if m is None:
                        i = len(buf)
                        break
                    if m.group() == "\\":
                        if m.end() >= len(buf):  # the escaped character is in the next read
                            i = m.start()
                            break
                        i = m.end() + 1
                        continue
                    in_string, i = False, m.end()
                    if depth == 0:
                        return self._moved(length, i)
                    continue
                m = _OUTSIDE.search(buf, i)
                if m is None:
                    i = len(buf)
                    break
                c = m.group()
                if depth == 0 and c in ",]}":  # the end of a bare number or word
                    return self._moved(length, m.start())
                i = m.end()
                if c == '"':
                    in_string = True
                elif c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        return self._moved(length, i)
            length += i - self.pos
            self.pos = i
            if not self.more():
                raise _bad("ends inside a value")

    def _moved(self, length: int, to: int) -> int:
        length += to - self.pos
        self.pos = to
        return length


def _entries(text: _Text):
    """The log_history entries of a trainer_state.json, one at a time, as (entry, length) (`_Text.value`); the
    other values of the object are read past. Raises ParseError for a file that is no trainer_state."""
    text.take("{")
    found = False
    if text.peek() == "}":
        text.take("}")
    else:
        while True:
            key, _ = text.value(MAX_VALUE_CHARS)
            if not isinstance(key, str):
                raise _bad("a key that is not a string")
            text.take(":")
            if key == "log_history" and not found:
                found = True
                if text.peek() != "[":
                    raise _bad("log_history is not a list")
                text.take("[")
                if text.peek() == "]":
                    text.take("]")
                else:
                    while True:
                        yield text.value(MAX_ENTRY_CHARS)
                        if text.take(",]") == "]":
                            break
            else:
                text.value(MAX_VALUE_CHARS)  # read past, not kept
            if text.take(",}") == "}":
                break
    if text.peek():
        raise _bad("more text after the object")
    if not found:
        raise _bad("no log_history list")


def _bad(why: str, reason: str = "bad_trainer_state") -> ParseError:
    return ParseError(reason, why, "trainer_state")


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
