"""Which reader a log path needs when its format is `auto`.

- `-`: standard input, a console stream.
- trainer_state: a file named trainer_state.json, a file of another name whose text is a JSON object
  with `log_history`, or a folder holding one (a Trainer's output_dir, read through its newest
  `checkpoint-N/trainer_state.json`, or a checkpoint folder).
- tensorboard: an `events.out.tfevents.*` file, or a folder holding some.
- completions: a folder of TRL's `completions_*.parquet` files, or one named `completions` (sources/completions.py);
  refused at start without pyarrow (the `parquet` extra).
- console: any other file, or a FIFO (read as a stream). A device, a socket, or a folder given as a console
  log can never be read: `refusal` says so at start.

A folder holding both checkpoints and event files (a Trainer's output_dir with `runs/`) is read as
trainer_state: its values are the Trainer's own, at full precision (event files hold float32). A path
that is not there yet, or a folder holding neither yet, is decided when it first says what it is."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading

from exporter.samples import parquet
from exporter.sources.completions import looks_like_completions
from exporter.sources.files import describe_mode
from exporter.sources.tensorboard import looks_like_tensorboard
from exporter.sources.trainer_state import looks_like_trainer_state, trainer_state_in

CONSOLE = "console"
TRAINER_STATE = "trainer_state"
TENSORBOARD = "tensorboard"
COMPLETIONS = "completions"

log = logging.getLogger(__name__)


def input_kind(path: str, fmt: str) -> str | None:
    """CONSOLE, TRAINER_STATE, TENSORBOARD or COMPLETIONS; None while an auto path cannot tell yet."""
    if fmt in (TRAINER_STATE, TENSORBOARD):
        return fmt
    if fmt != "auto" or path == "-":
        return CONSOLE
    if looks_like_trainer_state(path):
        return TRAINER_STATE
    if looks_like_tensorboard(path):
        return TENSORBOARD
    if looks_like_completions(path):
        return COMPLETIONS
    if os.path.exists(path) and not os.path.isdir(path):
        return CONSOLE
    return None


def is_log_folder(path: str) -> bool:
    """A folder the exporter reads: it holds a trainer_state.json (its own or a checkpoint's), event files or TRL's
    completions files."""
    return os.path.isdir(path) and (trainer_state_in(path) is not None or looks_like_tensorboard(path)
                                    or looks_like_completions(path))


def refusal(path: str, fmt: str, within: float = 1.0) -> str | None:
    """Why `path` can never be read as a log, said at start; None when it can be (or is not there yet, or its
    stat does not answer within `within` seconds: a hung mount is waited for by the loop, not here)."""
    if path == "-" or "://" in path:
        return None
    st = stat_within(path, within)
    if st is None:
        return None
    mode = st.st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
        return (f"{path} is {describe_mode(mode)}, not a log: give a file, a FIFO or '-' (a device would be read "
                "for ever)")
    if stat.S_ISDIR(mode) and fmt not in ("auto", TRAINER_STATE, TENSORBOARD):
        return (f"{path} is a folder: a {fmt} log must be a file (a folder is read as a Trainer's output_dir or a "
                "TensorBoard folder, with --format auto, trainer_state or tensorboard)")
    if stat.S_ISDIR(mode) and fmt == "auto" and input_kind(path, fmt) == COMPLETIONS and not parquet.available():
        return (f"{path} holds TRL's completions files (parquet): reading them needs pyarrow; install the parquet "
                "extra: pip install 'posttrain-exporter[parquet]'")
    if stat.S_ISDIR(mode) and fmt == "auto" and not is_log_folder(path):
        log.warning("%s is a folder holding no trainer_state.json and no event files yet: waiting for them (a "
                    "console log must be a file)", path)
    return None


def stat_within(path: str, timeout: float) -> os.stat_result | None:
    """os.stat(path), or None when it fails or does not answer in time (the stat goes on in a thread left behind)."""
    box: list[os.stat_result] = []

    def look() -> None:
        with contextlib.suppress(OSError):
            box.append(os.stat(path))

    worker = threading.Thread(target=look, daemon=True)
    worker.start()
    worker.join(timeout)
    return box[0] if box else None
