"""Processes as /proc shows them: a process's identity (its PID and start time, so that a PID the kernel gave again
to another process is not taken for it), its command line and its parent. Linux only; elsewhere nothing is found."""

from __future__ import annotations

import os
from dataclasses import dataclass

PROC = "/proc"
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ash", "ksh", "busybox"})


@dataclass(frozen=True)
class Process:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22): with the PID, one process for ever
    parent: int
    command: str  # the command line, its arguments joined by spaces
    zombie: bool = False

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "started": self.started, "command": self.command[:200]}


def process(pid: int) -> Process | None:
    """The process `pid` now, or None when there is none (or /proc cannot say)."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            stat = f.read().decode("utf-8", "replace")
        with open(f"{PROC}/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after the command name, which may hold spaces and parentheses
    if len(fields) < 20:
        return None
    command = " ".join(a.decode("utf-8", "replace") for a in cmdline.split(b"\0") if a)
    return Process(pid, int(fields[19]), int(fields[1]), command, fields[0] == "Z")


def alive(p: Process) -> bool:
    """`p` still runs: the same PID, started at the same time, not a zombie."""
    now = process(p.pid)
    return now is not None and now.started == p.started and not now.zombie


def all_processes() -> list[Process]:
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    found = (process(int(n)) for n in names if n.isdigit())
    return [p for p in found if p is not None]


def ancestors(pid: int) -> set[int]:
    """`pid` and its parents up to the namespace's first process."""
    out, seen = set(), pid
    while seen > 0 and seen not in out:
        out.add(seen)
        p = process(seen)
        seen = p.parent if p is not None else 0
    return out


def is_shell(p: Process) -> bool:
    """A shell that wraps the trainer (`bash -c '... train.py ... | tee'`): its command line holds the trainer's, but
    the signal is for the trainer, which a waiting shell would not pass on."""
    first = p.command.split(" ", 1)[0]
    return os.path.basename(first) in SHELLS
