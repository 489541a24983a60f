"""The unit every parser produces: one logged dict of metrics."""

from __future__ import annotations

import enum


class RecordKind(enum.StrEnum):  # a str: counters keyed by kind read as "train", "eval", "summary"
    TRAIN = "train"
    EVAL = "eval"
    SUMMARY = "summary"
    TRAINING = "training"  # a training's start (parsers/training.py): no values, a new identity for the run


# Keys that mark the end-of-training summary HF Trainer prints once.
SUMMARY_KEYS = frozenset({"train_runtime", "train_loss", "train_samples_per_second"})
# Prefixes of evaluation / validation keys (HF `eval_`, verl `val-core/` and `val-aux/`).
# Not `val/`: TRL's PPO logs training keys such as `val/ratio` under it.
EVAL_PREFIXES = ("eval_", "eval/", "val-core/", "val-aux/", "test_", "test/")
# Keys that are bookkeeping, not metrics of the kind of record.
NEUTRAL_KEYS = frozenset({"epoch", "step", "global_step", "training/global_step", "training/epoch"})


_NO_SKIPS: dict[str, int] = {}  # shared, never written: the hot path's records skip nothing


class Record:
    """A record's keys (its shape) and numbers, in the order the trainer printed them.

    Stored as two sequences rather than a dict: a run applies records a batch at a time, per
    shape, and the hot parser produces the two directly. `values` builds the dict on demand."""

    __slots__ = ("_values", "fmt", "kind", "numbers", "shape", "skipped", "step")

    def __init__(self, values: dict[str, float], fmt: str, step: int | None = None,
                 skipped: dict[str, int] | None = None) -> None:
        self._fill(tuple(values), list(values.values()), fmt, step, skipped or _NO_SKIPS, values)

    @classmethod
    def of(cls, shape: tuple[str, ...], numbers: list[float], fmt: str, step: int | None = None) -> Record:
        """The hot parser's constructor: no dict is built."""
        rec = cls.__new__(cls)
        rec._fill(shape, numbers, fmt, step, _NO_SKIPS, None)
        return rec

    @classmethod
    def of_kind(cls, shape: tuple[str, ...], numbers: list[float], fmt: str, step: int | None,
                kind: RecordKind) -> Record:
        """Record.of for a shape whose kind is known (classify(shape)): the per-shape fast parsers."""
        rec = cls.__new__(cls)
        rec.shape, rec.numbers, rec.fmt, rec.step, rec.skipped, rec.kind, rec._values = (
            shape, numbers, fmt, step, _NO_SKIPS, kind, None)
        return rec

    @classmethod
    def of_kind_rows(cls, shape: tuple[str, ...], rows: list[list[float]], fmt: str, steps: list[int],
                     kind: RecordKind) -> list[Record]:
        """[Record.of_kind(shape, row, fmt, step, kind) for row, step in zip(rows, steps)], without a call each."""
        new, out = cls.__new__, []
        for numbers, step in zip(rows, steps, strict=True):
            rec = new(cls)
            rec.shape, rec.numbers, rec.fmt, rec.step, rec.skipped, rec.kind, rec._values = (
                shape, numbers, fmt, step, _NO_SKIPS, kind, None)
            out.append(rec)
        return out

    def _fill(self, shape: tuple[str, ...], numbers: list[float], fmt: str, step: int | None,
              skipped: dict[str, int], values: dict[str, float] | None, kind: RecordKind | None = None) -> None:
        self.shape = shape
        self.numbers = numbers
        self.fmt = fmt
        self.step = step  # the record's own step, when the format carries one
        self.skipped = skipped  # reason -> count of values not exported (never written after this)
        self.kind = classify(shape) if kind is None else kind
        self._values = values

    def subset(self, positions: list[int]) -> Record:
        """The record with only the keys at `positions`; its kind, format, step and skips unchanged."""
        rec = Record.__new__(Record)
        shape, numbers = self.shape, self.numbers
        rec._fill(tuple(shape[i] for i in positions), [numbers[i] for i in positions], self.fmt, self.step,
                  self.skipped, None, self.kind)
        return rec

    @property
    def values(self) -> dict[str, float]:
        if self._values is None:
            self._values = dict(zip(self.shape, self.numbers, strict=True))
        return self._values

    def __repr__(self) -> str:
        return f"Record({self.values!r}, {self.fmt!r}, step={self.step!r}, kind={self.kind.value})"


# Kinds of the shapes seen last: a trainer prints a few record shapes over and over. Bounded in
# shapes and in the size of each, so that lines that each bring new keys cannot fill memory.
_KINDS: dict[tuple[str, ...], RecordKind] = {}
_MAX_KINDS = 64
_MAX_KIND_KEYS = 512
_MAX_KIND_CHARS = 16384


def classify(keys: tuple[str, ...]) -> RecordKind:
    kind = _KINDS.get(keys)
    if kind is None:
        kind = _classify(keys)
        if len(keys) <= _MAX_KIND_KEYS and sum(map(len, keys)) <= _MAX_KIND_CHARS:
            if len(_KINDS) >= _MAX_KINDS:
                _KINDS.clear()
            _KINDS[keys] = kind
    return kind


def _classify(keys: tuple[str, ...]) -> RecordKind:
    if not SUMMARY_KEYS.isdisjoint(keys):
        return RecordKind.SUMMARY
    metric_keys = [k for k in keys if k not in NEUTRAL_KEYS]
    if metric_keys and all(k.startswith(EVAL_PREFIXES) for k in metric_keys):
        return RecordKind.EVAL
    return RecordKind.TRAIN


class ParseError(Exception):
    """A line that is recognisably in a format but cannot be read; `reason` is a short label."""

    def __init__(self, reason: str, detail: str = "", fmt: str = "unknown") -> None:
        super().__init__(f"{fmt}: {reason}: {detail}" if detail else f"{fmt}: {reason}")
        self.reason = reason
        self.fmt = fmt
