"""The thread that reads and parses yields the CPU to the trainer.

A trainer beside us (`run`, `serve --log -` in its container) that prints a burst makes us parse the same burst at the
same moment; on a node with few cores the two compete, and the trainer's time is what counts. The reading thread runs
at a lower priority (nice PARSING_NICE): it takes whatever CPU the trainer leaves, and what it cannot keep up with is
dropped for parsing and counted, never held against the trainer. Linux sets the nice value of one thread (a thread id
is a process id to setpriority(2)); the trainer, started by another thread, keeps its own. Elsewhere nothing is done:
the call would lower the whole process, children to come included."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

PARSING_NICE = 10


def lower_this_thread() -> bool:
    """Lowers the calling thread's priority to PARSING_NICE (never raises it); True where that was done."""
    if sys.platform != "linux":
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < PARSING_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, PARSING_NICE)
    except OSError as e:  # a sandbox that refuses it: parsing competes as before
        log.debug("cannot lower the parsing thread's priority: %s", e)
        return False
    return True
