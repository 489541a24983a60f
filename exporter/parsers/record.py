"""The unit every parser produces: one logged dict of metrics."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import lru_cache


class RecordKind(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"
    SUMMARY = "summary"


# Keys that mark the end-of-training summary HF Trainer prints once.
SUMMARY_KEYS = frozenset({"train_runtime", "train_loss", "train_samples_per_second"})
# Prefixes of evaluation / validation keys (HF `eval_`, verl `val-core/` and `val-aux/`).
# Not `val/`: TRL's PPO logs training keys such as `val/ratio` under it.
EVAL_PREFIXES = ("eval_", "eval/", "val-core/", "val-aux/", "test_", "test/")
# Keys that are bookkeeping, not metrics of the kind of record.
NEUTRAL_KEYS = frozenset({"epoch", "step", "global_step", "training/global_step", "training/epoch"})


@dataclass(slots=True)
class Record:
    values: dict[str, float]
    fmt: str
    step: int | None = None  # the record's own step, when the format carries one
    kind: RecordKind = RecordKind.TRAIN
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count of values not exported

    def __post_init__(self) -> None:
        self.kind = classify(tuple(self.values))


@lru_cache(maxsize=1024)  # a trainer prints a few record shapes over and over
def classify(keys: tuple[str, ...]) -> RecordKind:
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
