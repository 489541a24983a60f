"""Signs in a console stream that the trainer died: a Python traceback, a C++ abort, a fatal Python error, a
shell's `Killed`, a crash of the process, NCCL's watchdog giving up on a collective.

A sign is only a candidate: a traceback that a trainer logs and survives (`logger.exception`, a retried download)
is followed by more training records, and the run state drops a sign once one comes (runstate.py). A traceback
right after `Exception ignored in: ...` (an object's finaliser at the interpreter's exit) is no sign at all.

Lines may carry the prefix of the process that printed them: Ray's `(WorkerDict pid=4242) ` (verl, OpenRLHF) and
torchrun's `[rank1]: `."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_TEXT = 300  # characters of the line that says what happened, kept for the verdict

# Cheap first look (one search in C) before anything else: most lines hold none of these.
_CUES = ("Traceback (most recent call last)", "terminate called after throwing", "Fatal Python error", "Killed",
         "core dumped", "Watchdog caught collective operation timeout")
_CUE = re.compile("|".join(map(re.escape, _CUES)))
_PREFIX = re.compile(r"(?:\([\w.-]{1,64} pid=\d{1,10}(?:, ip=[\w.:]{1,64})?\) ?)?(?:\[rank\d{1,6}\]:? ?)?")
# a shell's word for its child killed by SIGKILL (the OOM killer): alone, or bash's `./t.sh: line 3:  42 Killed  cmd`
_KILLED = re.compile(r"Killed\s*$|\S{0,256}: line \d{1,9}: +\d{1,10} Killed\b")

_CORE = re.compile(r"(?:Segmentation fault|Aborted|Bus error)\b.{0,40}core dumped")


@dataclass
class Failure:
    kind: str  # traceback, abort, fatal_error, killed, crash, nccl_timeout, exit_status
    text: str  # the line that says what happened (a traceback's exception line, once it came)

    @property
    def said(self) -> bool:
        """Its text says what happened (a traceback's, once its exception line came)."""
        return self.kind != "traceback" or not self.text.startswith("Traceback")

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


class FailureWatch:
    """Reads a stream's lines that are no record; `line()` returns a Failure when one begins, and a traceback's
    again at its exception line, its text completed in place."""

    def __init__(self) -> None:
        self._traceback: Failure | None = None  # inside a traceback: its frames until the exception line
        self._ignored = False  # the last line began `Exception ignored in`

    def line(self, text: str) -> Failure | None:
        tb = self._traceback
        if tb is None and _CUE.search(text) is None:
            self._ignored = text.startswith("Exception ignored")
            return None
        body = text[_PREFIX.match(text).end():]  # type: ignore[union-attr]  # the prefix is optional: always matches
        if tb is not None:
            if not body.strip() or body[:1] in " \t":
                return None  # a frame, its source line, a caret line, a blank
            if body.startswith("Traceback (most recent call last)"):  # a traceback cut short: the next one counts
                return self._begin(body)
            tb.text = body.strip()[:MAX_TEXT]  # the exception: `torch.OutOfMemoryError: CUDA out of memory. ...`
            self._traceback = None
            return tb
        ignored, self._ignored = self._ignored, body.startswith("Exception ignored")
        if body.startswith("Traceback (most recent call last)"):
            return None if ignored else self._begin(body)
        if body.startswith("terminate called after throwing"):
            return Failure("abort", body.strip()[:MAX_TEXT])
        if body.startswith("Fatal Python error"):
            return Failure("fatal_error", body.strip()[:MAX_TEXT])
        if "Watchdog caught collective operation timeout" in body:
            return Failure("nccl_timeout", body.strip()[:MAX_TEXT])
        if _KILLED.match(body):
            return Failure("killed", body.strip()[:MAX_TEXT])
        if _CORE.match(body):
            return Failure("crash", body.strip()[:MAX_TEXT])
        return None

    def _begin(self, body: str) -> Failure:
        self._traceback = Failure("traceback", body.strip()[:MAX_TEXT])
        return self._traceback
