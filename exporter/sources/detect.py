"""Which reader a log path needs when its format is `auto`.

- `-`: standard input, a console stream.
- trainer_state: a file named trainer_state.json, a file of another name whose text is a JSON object
  with `log_history`, or a folder holding one (a Trainer's output_dir, read through its newest
  `checkpoint-N/trainer_state.json`, or a checkpoint folder).
- tensorboard: an `events.out.tfevents.*` file, or a folder holding some.
- console: any other file (or a FIFO, a device).

A folder holding both checkpoints and event files (a Trainer's output_dir with `runs/`) is read as
trainer_state: its values are the Trainer's own, at full precision (event files hold float32). A path
that is not there yet, or a folder holding neither yet, is decided when it first says what it is."""

from __future__ import annotations

import os

from exporter.sources.tensorboard import looks_like_tensorboard
from exporter.sources.trainer_state import looks_like_trainer_state, trainer_state_in

CONSOLE = "console"
TRAINER_STATE = "trainer_state"
TENSORBOARD = "tensorboard"


def input_kind(path: str, fmt: str) -> str | None:
    """CONSOLE, TRAINER_STATE or TENSORBOARD; None while an auto path cannot tell yet."""
    if fmt in (TRAINER_STATE, TENSORBOARD):
        return fmt
    if fmt != "auto" or path == "-":
        return CONSOLE
    if looks_like_trainer_state(path):
        return TRAINER_STATE
    if looks_like_tensorboard(path):
        return TENSORBOARD
    if os.path.exists(path) and not os.path.isdir(path):
        return CONSOLE
    return None


def is_log_folder(path: str) -> bool:
    """A folder the exporter reads: it holds a trainer_state.json (its own or a checkpoint's) or event files."""
    return os.path.isdir(path) and (trainer_state_in(path) is not None or looks_like_tensorboard(path))
