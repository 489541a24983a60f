"""A call made every few seconds in a daemon thread of its own: the GPU sampler's polls, the trainer's GPU feed, the
sidecar's reading of that feed. Written once because the three share what is easy to get wrong: the schedule
keeps its tick times (a slow call skips the ticks it missed instead of bursting to catch up), a stop wakes the
wait at once, and a call stuck past the stop's timeout is left running and said so (the caller must not tear down
what the call is still using)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Periodic:
    """Calls `tick()` at once and then every `interval` seconds, in a daemon thread named `name`, from `start()`
    to `stop()`. `tick` must not raise: an exception ends the thread (the callers catch their own)."""

    def __init__(self, tick: Callable[[], object], interval: float, name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._tick, self._name, self._clock = tick, name, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Started and not stopped (or stopped while a call was stuck: it may still return)."""
        return self._thread is not None

    def start(self) -> bool:
        """Start the thread; False when it runs already."""
        if self._thread is not None:
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop and wait up to `timeout` seconds for the thread. False when it is still inside a call: it is left
        (a daemon) and counts as running, and whatever that call uses must be left as it is."""
        self._stop.set()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._thread = None
        return True

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            self._tick()
            next_at += self.interval
            now = self._clock()
            if next_at < now:  # a slow call: the missed ticks are skipped, never made up in a burst
                next_at = now + self.interval
            self._stop.wait(next_at - now)
