"""A path that cannot say yet what it is: waited for (and said so), then read as what it turns out to be."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from exporter.config import LogSpec
from exporter.sources.base import FollowStats, Source

log = logging.getLogger(__name__)

# A path that is still not there after this long is said again: a typo, or a trainer that writes elsewhere.
STILL_WAITING_SECONDS = 60.0


class PendingInput(Source):
    """A path that cannot say yet what it is (not there yet, or a folder holding neither checkpoints nor event
    files): its reader is chosen at the first poll that finds out (sources/detect.py)."""

    def __init__(self, spec: LogSpec, choose: Callable[[LogSpec], Source | None]) -> None:
        self.spec = spec
        self._choose = choose
        self._chosen: Source | None = None
        self._waiting = FollowStats()
        self._since: float | None = None  # when the first look found nothing to read
        self._said = 0  # waiting lines logged: one at once, one more after STILL_WAITING_SECONDS

    @property
    def follow(self) -> FollowStats:  # type: ignore[override]
        return self._waiting if self._chosen is None else self._chosen.follow

    @property
    def catching_up(self) -> bool:
        return self._chosen is not None and self._chosen.catching_up

    @property
    def drained(self) -> bool:
        return self._chosen is None or self._chosen.drained

    def read(self, timeout: float = 0.0) -> None:
        if self._chosen is None:
            self._chosen = self._choose(self.spec)  # looks at the path (I/O): outside the lock
            if self._chosen is None:
                self._say_waiting()
            elif self._said:
                log.info("run %s: %s is there now; reading it", self.spec.run, self.spec.path)
        if self._chosen is not None:
            self._chosen.read(timeout)

    def _say_waiting(self) -> None:
        """A path that is not there may be one the trainer has not written yet, or a typo: said at once (with
        whether its folder exists), and again if it is still missing after STILL_WAITING_SECONDS."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if self._said == 0:
            self._said = 1
            folder = os.path.dirname(os.path.abspath(self.spec.path))
            if os.path.exists(self.spec.path):
                log.info("run %s: %s holds nothing to read yet (no checkpoint, event file or log); waiting",
                         self.spec.run, self.spec.path)
            else:
                log.warning("run %s: %s does not exist; waiting for it to appear (%s): check the path if the "
                            "trainer should have written it", self.spec.run, self.spec.path,
                            "its folder exists" if os.path.isdir(folder) else f"its folder {folder} does not exist "
                            "either")
        elif self._said == 1 and now - self._since >= STILL_WAITING_SECONDS:
            self._said = 2
            log.warning("run %s: still nothing to read at %s after %.0f s (posttrain_exporter_source_up is 0)",
                        self.spec.run, self.spec.path, now - self._since)

    def ingest(self) -> bool:
        return self._chosen is not None and self._chosen.ingest()

    def finish(self) -> None:
        if self._chosen is not None:
            self._chosen.finish()
