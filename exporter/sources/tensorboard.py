"""TensorBoard event files as a source: the scalars a trainer wrote, with their exact steps, without TensorFlow.

The HF Trainer (and so every TRL trainer) writes `runs/<date>_<host>/events.out.tfevents.*` when
tensorboard is installed and `report_to` includes it: one TFRecord per event, each an `Event` protobuf
holding a step and a `Summary` of tagged scalars (`train/loss`, `train/kl`, `eval/loss`, ...). This module
reads the TFRecord framing (length, masked CRC-32C of the length, payload, masked CRC-32C of the payload)
and the few protobuf fields it needs, follows the files as they grow, and turns the scalars of one step into
one record with the console's key names (`train/loss` -> `loss`, `eval/loss` -> `eval_loss`).

Bounded whatever the files hold: a poll reads at most CHUNK_BYTES of a file (more waiting: `behind`), a record over
MAX_EVENT bytes (an image, a histogram: no scalar is that long) is skipped unread, and a step keeps at most
MAX_TAGS scalars; both are counted in `dropped` (posttrain_exporter_lines_dropped_total)."""

from __future__ import annotations

import glob
import os
import struct
from collections import Counter
from dataclasses import dataclass, field

from exporter.parsers.record import EVAL_PREFIXES, SUMMARY_KEYS, Record

FMT = "tensorboard"
MAX_RECORD = 64 << 20  # a TFRecord longer than this is corruption, not a scalar
MAX_EVENT = 1 << 19  # a TFRecord longer than this is skipped unread (counted): an image or a histogram
CHUNK_BYTES = 1 << 20  # read of one file per poll (more than MAX_EVENT, so that any event read fits in one)
MAX_TAGS = 4096  # scalars kept of one step
# what the reader leaves out, by reason: records over MAX_EVENT (records), scalars of a step past MAX_TAGS (scalars)
DROP_REASONS = ("event_too_large", "event_tags_over_cap")
_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected


def _table() -> list[int]:
    out = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        out.append(c)
    return out


_CRC_TABLE = _table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# --- protobuf, the few fields needed --------------------------------------------------------------------


class ProtoError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of each field: ints for varint/fixed, bytes for length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise ProtoError("truncated fixed64")
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise ProtoError("truncated field")
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ProtoError("truncated fixed32")
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        yield num, wire, value


_DT_FLOAT, _DT_DOUBLE = 1, 2


def _tensor_scalar(buf: bytes) -> float | None:
    """A scalar TensorProto (new-style summaries): float_val (5), double_val (6) or tensor_content (4)."""
    dtype, content, value = None, None, None
    for num, wire, v in _fields(buf):
        if num == 1 and wire == 0:
            dtype = v
        elif num == 4 and wire == 2:
            content = v
        elif num == 5:
            value = struct.unpack("<f", v if wire == 5 else v[:4])[0] if len(v) >= 4 else None
        elif num == 6:
            value = struct.unpack("<d", v if wire == 1 else v[:8])[0] if len(v) >= 8 else None
    if value is None and content is not None:
        if dtype == _DT_FLOAT and len(content) == 4:
            value = struct.unpack("<f", content)[0]
        elif dtype == _DT_DOUBLE and len(content) == 8:
            value = struct.unpack("<d", content)[0]
    return value


def parse_event(data: bytes) -> tuple[int | None, list[tuple[str, float]]]:
    """The step and the scalars (tag, value) of one Event; text, images and histograms are skipped."""
    step, scalars = None, []
    for num, wire, v in _fields(data):
        if num == 2 and wire == 0:
            step = v if v < (1 << 63) else None  # an int64: a negative step is no step
        elif num == 5 and wire == 2:  # summary
            for vnum, vwire, value in _fields(v):
                if vnum != 1 or vwire != 2:
                    continue
                tag, scalar = None, None
                for fnum, fwire, fv in _fields(value):
                    if fnum == 1 and fwire == 2:
                        tag = fv.decode("utf-8", "replace")
                    elif fnum == 2 and fwire == 5:
                        scalar = struct.unpack("<f", fv)[0]
                    elif fnum == 8 and fwire == 2:
                        scalar = _tensor_scalar(fv)
                if tag is not None and scalar is not None:
                    scalars.append((tag, float(scalar)))
    return step, scalars


def console_key(tag: str) -> str:
    """The key the console prints for a TensorBoard tag: the Trainer logs `train/x` for `x`, `eval/x` for
    `eval_x`; other tags stay as they are."""
    if tag.startswith("train/"):
        return tag[len("train/"):]
    if tag.startswith("eval/"):
        return "eval_" + tag[len("eval/"):]
    return tag


# --- following the files ------------------------------------------------------------------------------


def looks_like_tensorboard(path: str) -> bool:
    """An event file, or a folder holding some (a Trainer's `runs/` or `output_dir`)."""
    if "tfevents" in os.path.basename(path):
        return True
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, "**", "*tfevents*"), recursive=True))


@dataclass
class _File:
    path: str
    offset: int = 0
    broken: bool = False


@dataclass
class TensorBoardReader:
    """Event files of one run (a file, or a folder searched for `*tfevents*`), read as they grow; each step's
    scalars become one record once a later step appears (or at the end of input)."""

    path: str
    errors: dict[str, int] = field(default_factory=dict)  # reason -> count
    files: dict[str, _File] = field(default_factory=dict)
    up: bool = False
    grew: bool = False  # the last poll read new bytes
    behind: bool = False  # the last poll left bytes unread (it read CHUNK_BYTES of a file): poll again at once
    dropped: Counter = field(default_factory=Counter)  # what was left out, by reason (DROP_REASONS)
    _step: int | None = None
    _values: dict[str, float] = field(default_factory=dict)

    def _paths(self) -> list[str]:
        if os.path.isdir(self.path):
            return sorted(glob.glob(os.path.join(self.path, "**", "*tfevents*"), recursive=True),
                          key=lambda p: (os.path.basename(p), p))
        return [self.path] if os.path.exists(self.path) else []

    def _error(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    @property
    def bytes_read(self) -> int:
        """Bytes of the event files framed so far (a record not yet whole is read again at the next poll)."""
        return sum(f.offset for f in self.files.values())

    def poll(self) -> list[Record]:
        out: list[Record] = []
        paths = self._paths()
        self.up = bool(paths)
        before = sum(f.offset for f in self.files.values())
        self.behind = False
        for p in paths:
            f = self.files.setdefault(p, _File(p))
            if not f.broken:
                out += self._read(f)
        self.grew = sum(f.offset for f in self.files.values()) != before
        return out

    def finish(self) -> list[Record]:
        """End of input: the last step's scalars are a record too."""
        return self._flush()

    def _read(self, f: _File) -> list[Record]:
        try:
            with open(f.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(f.offset)
                data = fh.read(CHUNK_BYTES)
        except OSError:
            self._error("read_error")
            return []
        out, pos = [], 0
        self.behind = self.behind or f.offset + len(data) < size
        while pos + 12 <= len(data):
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            (len_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
            if masked_crc(header) != len_crc or length > MAX_RECORD:
                self._error("bad_length")  # nothing after a corrupt length can be framed: stop this file
                f.broken = True
                break
            end = pos + 12 + length + 4
            if length > MAX_EVENT:
                if f.offset + end > size:
                    break  # not written whole yet
                self.dropped["event_too_large"] += 1  # skipped unread
                pos = end
                continue
            if end > len(data):
                break  # the rest of this record is not written yet (or not read yet: the next poll reads it)
            payload = data[pos + 12:pos + 12 + length]
            (crc,) = struct.unpack("<I", data[end - 4:end])
            pos = end
            if masked_crc(payload) != crc:
                self._error("bad_crc")
                continue
            try:
                step, scalars = parse_event(payload)
            except ProtoError:
                self._error("bad_event")
                continue
            if step is None or not scalars:
                continue
            if self._step is not None and step != self._step:
                out += self._flush()
            self._step = step
            for tag, value in scalars:
                key = console_key(tag)
                if len(self._values) < MAX_TAGS or key in self._values:
                    self._values[key] = value
                else:
                    self.dropped["event_tags_over_cap"] += 1
        f.offset += pos
        return out

    def _flush(self) -> list[Record]:
        """One step's scalars: the training ones as one record; evaluation (`eval_*`) and the end-of-run
        summary (`train_runtime`, ...), which the Trainer writes at the same step, as records of their own,
        as the console prints them."""
        if self._step is None or not self._values:
            return []
        groups: dict[str, dict[str, float]] = {"train": {}, "eval": {}, "summary": {}}
        summary = not SUMMARY_KEYS.isdisjoint(self._values)
        for k, v in self._values.items():
            kind = "eval" if k.startswith(EVAL_PREFIXES) else "summary" if summary and (
                k in SUMMARY_KEYS or k.startswith("train_") or k == "total_flos") else "train"
            groups[kind][k] = v
        out = [Record(values, FMT, step=self._step) for values in groups.values() if values]
        self._step, self._values = None, {}
        return out
