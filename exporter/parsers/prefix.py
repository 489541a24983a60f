"""What may stand before a training record on its line, and Ray's suffix after it.

Launchers and log collectors put their own text before each line a program prints; a record keeps
being a record behind it. Anything else before a dict (a sentence, `kwargs:`, a logging header) makes
the line prose that mentions a dict (README, "What a training record is"). Known prefixes, in any
order and number, with whitespace between:

- tqdm bar text the line was printed after (`  4%|▍   | 13/300 [00:01<00:36,  7.95it/s]`), first only;
- a launcher's rank tag: torchrun `[default0]:`, `[rank3]:`; mpirun `[1,0]<stdout>:`;
- Ray's actor prefix: `(TaskRunner pid=87031)`, `(WorkerDict pid=1609, ip=10.0.0.5)`, `(pid=12)`;
- a timestamp (`kubectl logs --timestamps`, `docker logs -t`): `2026-05-01T10:00:00.123456789Z`;
- Slurm's task label (`srun --label`): `3:`.

Every quantifier is possessive and each part starts with its own character, so the prefix of a line is
read once, in linear time."""

from __future__ import annotations

import re

_BAR_TEXT = r"[^{|]*+\|[^|]*+\|\s*+\d{1,15}+/\d{1,15}+\s*+\[[^\]]*+\]"
_RANK_TAG = r"\[[^\[\]\s]{1,64}+\](?:<std(?:out|err)>)?+:"
_RAY_ACTOR = r"\((?:[\w.-]{1,128}+ )?+pid=\d{1,10}+(?:, ip=[\w.:]{1,64}+)?+\)"
_TIMESTAMP = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d{1,9}+)?+(?:Z|[+-]\d\d:?\d\d)?+"
_TASK_LABEL = r"\d{1,6}+:"
# The tags a launcher or collector puts before a line, without the spaces between them (failures.py keeps those:
# a traceback's frames are told from its exception line by their indentation).
LINE_TAG = rf"(?:{_RANK_TAG}|{_RAY_ACTOR}|{_TIMESTAMP}|{_TASK_LABEL})"
BAR_TEXT = _BAR_TEXT
LINE_PREFIX = re.compile(rf"(?:{_BAR_TEXT})?+(?:\s++|{LINE_TAG})*+")

# Ray folds lines that several workers print alike into one: `... [repeated 15x across cluster]`.
_RAY_REPEATED = re.compile(r"\[repeated \d{1,10}+x across cluster\]\s*+")


def known_prefix(line: str, end: int) -> bool:
    """`line[:end]` is nothing but known prefixes."""
    return LINE_PREFIX.fullmatch(line, 0, end) is not None


def after_prefix(line: str) -> str:
    """The line without its known prefixes."""
    m = LINE_PREFIX.match(line)
    return line[m.end() :] if m else line


def without_ray_suffix(line: str) -> str:
    """The line without Ray's `[repeated Nx across cluster]`: the record is the same, printed once here."""
    if "across cluster]" not in line:
        return line
    i = line.rfind("[repeated ")
    return line[:i].rstrip() if i >= 0 and _RAY_REPEATED.fullmatch(line, i) else line
