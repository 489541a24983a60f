"""What a trainer says it saved: the checkpoints on disk, so that the checkpoint to keep is one that exists.

- transformers' Trainer (TRL): `Saving model checkpoint to OUT/checkpoint-N` when it saves, and
  `Deleting older checkpoint [OUT/checkpoint-N] due to args.save_total_limit` when it rotates one away (both at
  log level info: `log_level="info"` in the training arguments, or TRANSFORMERS_VERBOSITY=info).
- verl's trainer: `local_global_step_folder: DIR/global_step_N` (printed at every save).
- DeepSpeed (OpenRLHF's saves): `Saving model checkpoint: DIR/global_stepN/...` and
  `[Torch] Checkpoint global_stepN is about to be saved!`.

Lines may carry the launchers' tags (Ray's `(pid=...)`, torchrun's `[rank0]:`): the patterns are searched, not
anchored."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CUE = re.compile(r"checkpoint|global_step", re.IGNORECASE)
_SAVED = (
    re.compile(r"Saving model checkpoint to (\S{0,4096}?checkpoint-(\d{1,12}))/?\s*$"),
    re.compile(r"local_global_step_folder: (\S{0,4096}?global_step_(\d{1,12}))/?\s*$"),
    re.compile(r"Saving model checkpoint: (\S{0,4096}?global_step(\d{1,12}))/"),
    re.compile(r"Checkpoint (global_step(\d{1,12})) is about to be saved"),
)
_DELETED = re.compile(r"Deleting older checkpoint \[(\S{0,4096}?checkpoint-(\d{1,12}))\]")
MAX_PATH = 512  # characters of a path kept for the report
MAX_SAVES = 4096  # saves remembered per run (the latest): a log that names a checkpoint on every line stays bounded


@dataclass(frozen=True)
class CheckpointEvent:
    step: int
    path: str
    deleted: bool  # rotated away (save_total_limit), not saved


def checkpoint_event(text: str) -> CheckpointEvent | None:
    """The save or deletion a line reports, or None (one cheap search first: most lines name no checkpoint)."""
    if _CUE.search(text) is None:
        return None
    m = _DELETED.search(text)
    if m is not None:
        return CheckpointEvent(int(m.group(2)), m.group(1)[:MAX_PATH], True)
    for pattern in _SAVED:
        m = pattern.search(text)
        if m is not None:
            return CheckpointEvent(int(m.group(2)), m.group(1)[:MAX_PATH], False)
    return None


@dataclass
class SavedCheckpoints:
    """The checkpoints a run's output says were saved (step -> path) and which of them were deleted since."""

    saved: dict[int, str]
    deleted: set[int]
    listed: bool = False  # the folder was listed (trainer_state.json's input): what is on disk is known

    @classmethod
    def empty(cls) -> SavedCheckpoints:
        return cls({}, set())

    @property
    def known(self) -> bool:
        """Whether what is on disk is known: the folder was listed, or the trainer says what it deletes (HF
        Trainer's own line; transformers 5 at its default log level says nothing of it)."""
        return self.listed or bool(self.deleted)

    def take(self, event: CheckpointEvent) -> None:
        if event.deleted:
            self.deleted.add(event.step)
            self.saved.setdefault(event.step, event.path)
        else:
            self.saved[event.step] = event.path
            self.deleted.discard(event.step)  # saved again at that step (a resumed run)
        while len(self.saved) > MAX_SAVES:
            oldest = min(self.saved)
            del self.saved[oldest]
            self.deleted.discard(oldest)

    def on_disk(self) -> list[int]:
        return sorted(s for s in self.saved if s not in self.deleted)

    def __bool__(self) -> bool:
        return bool(self.saved)
