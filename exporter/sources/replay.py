"""The demo's source: the bundled real TRL GRPO log, replayed at an accelerated pace, in a loop."""

from __future__ import annotations

import re
import time
from importlib import resources

from exporter.sources.base import FollowStats

DEMO_LOG = "grpo_demo.log"
_RECORD_START = re.compile(r"(?<=[\r\n])(?=\{')")


def demo_log_text() -> str:
    return resources.files("exporter").joinpath("data", DEMO_LOG).read_text(encoding="utf-8", errors="replace")


class ReplayReader:
    """Hands out the log in pieces, one metric record each, `rate` records per second.

    When the log ends it starts over: the step goes back to 1, which the run treats as a resumed
    run (its history is cut back), as a real restarted trainer would be."""

    def __init__(self, text: str, rate: float, loop: bool = True, clock=time.monotonic) -> None:
        starts = [0, *(m.start() for m in _RECORD_START.finditer(text))]
        self._pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True) if b > a]
        self._sizes = [len(p.encode("utf-8")) for p in self._pieces]
        self._rate = rate
        self._loop = loop
        self._clock = clock
        self._t0 = clock()
        self._sent = 0
        self.passes = 0
        self.closed = False
        self.stats = FollowStats(up=True)

    def poll(self, timeout: float = 0.0) -> list[str]:
        due = int((self._clock() - self._t0) * self._rate) + 1
        out: list[str] = []
        while self._sent < due and not self.closed:
            i = self._sent % len(self._pieces)
            if i == 0 and self._sent:
                self.passes += 1
                if not self._loop:
                    self.closed = True
                    break
            out.append(self._pieces[i])
            self.stats.bytes_read += self._sizes[i]
            self._sent += 1
        return out
