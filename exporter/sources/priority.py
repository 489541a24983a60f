"""The thread that reads and parses yields the CPU to the trainer.

A trainer beside us (`run`, `serve --log -` in its container) that prints a burst makes us parse the same burst at the
same moment; on a node with few cores the two compete, and the trainer's time is what counts. The reading thread runs
PARSING_NICE below the trainer (its niceness + 10, at most 19, the lowest there is): it takes whatever CPU the trainer
leaves, and what it cannot keep up with is dropped for parsing and counted, never held against the trainer. Relative,
not absolute: a launcher that already runs everything at nice 10 would otherwise leave parser and trainer equal. The
trainer is our child under `run` (its own niceness is read); beside us (`serve --log -`) it is taken to share ours (a
container's processes start at one niceness). Linux sets the nice value of one thread (a thread id is a process id to
setpriority(2)); the trainer, started by another thread, keeps its own. Elsewhere nothing is done: the call would lower
the whole process, children to come included."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

PARSING_NICE = 10  # how far below the trainer the parsing thread runs
LOWEST = 19  # the highest niceness Linux has


def parsing_nice(trainer_nice: int) -> int:
    return min(LOWEST, trainer_nice + PARSING_NICE)


def lower_this_thread(trainer_pid: int | None = None) -> bool:
    """Lowers the calling thread's priority to PARSING_NICE below the trainer's (the process `trainer_pid`, or else
    this process's main thread), never raising it; True where that was done."""
    if sys.platform != "linux":
        return False
    tid = threading.get_native_id()
    try:
        try:
            trainer = os.getpriority(os.PRIO_PROCESS, trainer_pid if trainer_pid is not None else os.getpid())
        except ProcessLookupError:  # the trainer already exited: ours, which it started with
            trainer = os.getpriority(os.PRIO_PROCESS, os.getpid())
        target = parsing_nice(trainer)
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as e:  # a sandbox that refuses it: parsing competes as before
        log.debug("cannot lower the parsing thread's priority: %s", e)
        return False
    return True
