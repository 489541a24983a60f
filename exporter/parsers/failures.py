"""Signs in a console stream that the trainer died: a Python traceback, a C++ abort, a fatal Python error, a
shell's `Killed` or `Segmentation fault`, NCCL's watchdog giving up on a collective.

A sign is only a candidate: a traceback that a trainer logs and survives (`logger.exception`, a retried download)
is followed by more training records, and the run state drops a sign once one comes (runstate.py). A traceback
right after `Exception ignored in: ...` (an object's finaliser), `Error in atexit._run_exitfuncs:` or
`Exception in thread ...:` is no sign at all: the interpreter prints it and goes on.

A traceback whose frames are all outside the trainer's process is the reward function's, not the trainer's: code
run from a pseudo-file (`<string>` of exec or `python -c`, `<sandbox>`, `<stdin>`; not `<frozen ...>`, the
interpreter's own modules, which say nothing either way) or from a file in a folder or under a name Python's
`tempfile` made (`/tmp/tmpk3j9x2ab/solution.py`: the model's program, written out and run in a subprocess whose
output the trainer passes on). It is returned as kind `reward_function`, never a sign. One frame in any other file
(the reward function's own module that exec'd the code) makes it the trainer's process's.

Lines may carry the tags the record parsers know (parsers/prefix.py): Ray's `(WorkerDict pid=4242) ` (verl,
OpenRLHF), torchrun's `[rank1]: ` and `[default0]:`, mpirun's, Slurm's `0: `, a collector's timestamp."""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.parsers.prefix import BAR_TEXT, LINE_TAG

MAX_TEXT = 300  # characters of the line that says what happened, kept for the verdict

# A traceback after one of these lines is printed by the interpreter and goes on (a finaliser, an atexit
# function, a thread other than the main one): no sign that training died.
_NOT_FATAL = ("Exception ignored", "Error in atexit._run_exitfuncs", "Exception in thread")
# Cheap first look (one search in C) before anything else: most lines hold none of these (nor the lines above).
_CUES = ("Traceback (most recent call last)", "terminate called after throwing", "Fatal Python error", "Killed",
         "Segmentation fault", "Aborted", "Bus error", "Watchdog caught collective operation timeout", *_NOT_FATAL)
_CUE = re.compile("|".join(map(re.escape, _CUES)))
# The launchers' and collectors' tags the record parsers know (parsers/prefix.py), each after at most one space:
# the spaces after them are the line's own (a frame's indentation).
_PREFIX = re.compile(rf"(?:{BAR_TEXT})?+(?: ?+{LINE_TAG})*+")
# What a shell prints for a child that a signal ended: alone (dash, a container's runtime), or bash's
# `./t.sh: line 3:  42 Killed  python train.py`. Killed: SIGKILL, most often the kernel's OOM killer.
_SIGNALS = r"(Killed|Segmentation fault|Aborted|Bus error)"
_BARE_SIGNAL = re.compile(rf"{_SIGNALS}(?: \(core dumped\))?\s*$")
_SHELL_SIGNAL = re.compile(rf"\S{{0,256}}: line \d{{1,9}}: +\d{{1,10}} +{_SIGNALS}\b")
# A traceback's last line: the exception's (dotted) class name, Ray's `RayTaskError(OutOfMemoryError)` included,
# then its message. Another process's line printed in between (a logging header, a bar) is passed over.
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]{0,200}+(?:\([\w.]{0,200}+\))?+(?::|$)")
_MAX_PASSED = 64  # foreign lines passed over inside a traceback before it is left as cut short
# A frame's file; one outside the trainer's process: a pseudo-file other than the interpreter's frozen modules, or a
# path with a component that Python's tempfile named (`tmp` and 8 characters of [a-z0-9_]).
_FRAME = re.compile(r'File "([^"]{0,4096})", line \d')
_OUTSIDE = re.compile(r"^<(?!frozen )[^>]*>$|(?:^|/)tmp[a-z0-9_]{8}(?:/|\.py$)")
# What the trainer's own process logs at a level that is no error: Python logging's default header (`INFO:name:`),
# and the formats with the level in brackets or between dashes (`[INFO|trainer.py:2345]`, `... - INFO - ...`).
_TRAINER_LOG = re.compile(r"(?:INFO|DEBUG):[\w.]{1,200}:|\[(?:INFO|DEBUG)\b|[\d-]{10}[ T][\d:,.]{8,15} "
                          r"(?:- [\w.]{1,200} )?- (?:INFO|DEBUG) - ")


def exit_text(status: int) -> str:
    """A trainer's exit status as a shell gives it (128 + N: ended by signal N), in words."""
    return f"the trainer exited with status {status}" + (f" (killed by signal {status - 128})" if status > 128 else "")


@dataclass
class Failure:
    # traceback, abort, fatal_error, killed, crash, nccl_timeout, exit_status; reward_function: a traceback of code
    # outside the trainer's process (no sign)
    kind: str
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
        self._passed = 0  # lines inside it that are neither a frame nor its exception line
        self._ignored = False  # the last line began one of _NOT_FATAL
        self._frames = [0, 0]  # the traceback's frames so far: [outside the trainer's process, the others]

    def line(self, text: str) -> Failure | None:
        tb = self._traceback
        if tb is None and _CUE.search(text) is None:
            self._ignored = False  # a line in between: whatever came before it no longer excuses what follows
            return None
        rest = text[_PREFIX.match(text).end():]  # type: ignore[union-attr]  # the prefix is optional: always matches
        body, indented = rest.strip(), rest.startswith(("  ", "\t"))
        if tb is not None:
            if not body or indented:
                if body.startswith("File "):
                    self._frame(body)
                return None  # a frame, its source line, a caret line, a blank
            if body.startswith("Traceback (most recent call last)"):  # a traceback cut short: the next one counts
                return self._begin(body)
            if not _EXCEPTION_LINE.match(body):  # another process's line, printed in the middle of it
                self._passed += 1
                if self._passed > _MAX_PASSED:
                    self._traceback = None
                return None
            tb.text = body[:MAX_TEXT]  # the exception: `torch.OutOfMemoryError: CUDA out of memory. ...`
            if self._frames[0] and not self._frames[1]:
                tb.kind = "reward_function"
            self._traceback = None
            return tb
        ignored, self._ignored = self._ignored, body.startswith(_NOT_FATAL)
        if indented:  # inside something printed (a message, a nested exception's report): no sign of its own
            return None
        if body.startswith("Traceback (most recent call last)"):
            return None if ignored else self._begin(body)
        if body.startswith("terminate called after throwing"):
            return Failure("abort", body[:MAX_TEXT])
        if body.startswith("Fatal Python error"):
            return Failure("fatal_error", body[:MAX_TEXT])
        if "Watchdog caught collective operation timeout" in body:
            return Failure("nccl_timeout", body[:MAX_TEXT])
        m = _BARE_SIGNAL.match(body) or _SHELL_SIGNAL.match(body)
        if m:
            return Failure("killed" if m.group(1) == "Killed" else "crash", body[:MAX_TEXT])
        return None

    def _frame(self, body: str) -> None:
        m = _FRAME.match(body)
        if m is not None and not m.group(1).startswith("<frozen "):
            self._frames[_OUTSIDE.search(m.group(1)) is None] += 1

    def _begin(self, body: str) -> Failure:
        self._passed = 0
        self._frames = [0, 0]
        self._traceback = Failure("traceback", body.strip()[:MAX_TEXT])
        return self._traceback


def trainer_log_line(text: str) -> bool:
    """The line is one the trainer's process logs at a level below error (after the launchers' tags): a sign of life
    after a sign of death. A launcher's error lines (torchrun's `E1126 ...`) and wandb's lines are none."""
    rest = text[_PREFIX.match(text).end():]  # type: ignore[union-attr]  # the prefix is optional: always matches
    return _TRAINER_LOG.match(rest) is not None
