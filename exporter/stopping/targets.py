"""Whom a stop signals: the trainer `run` started (its process group), or the trainer beside the sidecar, found by
a piece of its command line or its PID (a pod with `shareProcessNamespace: true` shows the sidecar every
container's processes).

`find()` names the processes once, when the stop begins; every later signal of that stop goes to those same
processes (by PID and start time), never to one started since."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from exporter.stopping import procfs
from exporter.stopping.procfs import Process

SENT, DENIED, NOT_FOUND = "sent", "denied", "not_found"  # a signal's outcome, as posttrain_exporter counts it


@dataclass
class Outcome:
    """What one signal did: sent to every process, or why not (the processes, and the error that said so)."""

    outcome: str
    detail: str = ""
    pids: list[int] = field(default_factory=list)


class Target(Protocol):
    def describe(self) -> str: ...

    def find(self) -> list[Process]: ...

    def send(self, sig: signal.Signals, processes: list[Process]) -> Outcome: ...

    def alive(self, processes: list[Process]) -> bool: ...


class ChildGroup:
    """`run`'s trainer: its process group (it was started as the leader of one), so that a launcher's children in the
    group get the signal as they would from a terminal. `running`: whether the trainer has not exited yet."""

    def __init__(self, pid: int, running: Callable[[], bool]) -> None:
        self.pid, self._running = pid, running

    def describe(self) -> str:
        return f"the trainer's process group {self.pid}"

    def find(self) -> list[Process]:
        p = procfs.process(self.pid)
        return [p] if p is not None else [Process(self.pid, 0, 0, "")]

    def send(self, sig: signal.Signals, processes: list[Process]) -> Outcome:
        if not self._running():
            return Outcome(NOT_FOUND, "the trainer has exited")
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return Outcome(NOT_FOUND, "the trainer has exited")
        except PermissionError as e:
            return Outcome(DENIED, e.strerror or str(e), [self.pid])
        return Outcome(SENT, pids=[self.pid])

    def alive(self, processes: list[Process]) -> bool:
        if self._running():
            return True
        with contextlib.suppress(OSError):  # what it started in its group may outlive it
            os.killpg(self.pid, 0)
            return True
        return False


class MatchedProcesses:
    """The trainer beside the sidecar: the process `pid`, or every process whose command line holds `command`,
    leaving out this process and its parents, and shells (a `bash -c '... train.py ...'` wrapper holds the
    trainer's command line but would not pass a signal on while it waits)."""

    def __init__(self, command: str | None = None, pid: int | None = None) -> None:
        assert (command is None) != (pid is None), "a command or a pid"
        self.command, self.pid = command, pid

    def describe(self) -> str:
        return f"process {self.pid}" if self.pid is not None else f"the processes whose command holds {self.command!r}"

    def find(self) -> list[Process]:
        if self.pid is not None:
            p = procfs.process(self.pid)
            return [p] if p is not None and not p.zombie else []
        ours = procfs.ancestors(os.getpid())
        return [p for p in procfs.all_processes()
                if self.command in p.command and p.pid not in ours and not p.zombie and not procfs.is_shell(p)]

    def send(self, sig: signal.Signals, processes: list[Process]) -> Outcome:
        sent, denied, why = [], [], ""
        for p in processes:
            if not procfs.alive(p):
                continue
            try:
                os.kill(p.pid, sig)
                sent.append(p.pid)
            except ProcessLookupError:
                continue
            except PermissionError as e:
                denied.append(p.pid)
                why = e.strerror or errno.errorcode.get(e.errno or 0, str(e))
        if denied:
            return Outcome(DENIED, f"{why} (a process of another user: run the sidecar as the trainer's user)",
                           denied)
        if not sent:
            return Outcome(NOT_FOUND, f"no running process: {self.describe()}")
        return Outcome(SENT, pids=sent)

    def alive(self, processes: list[Process]) -> bool:
        return any(procfs.alive(p) for p in processes)
