"""Standard input as a log stream: `python train.py 2>&1 | posttrain-exporter serve --log -`.

With `tee_fd` (serve sets it to standard output) every byte read is also written there, unchanged, so the
trainer's output still reaches the pod log. A closed downstream (EPIPE) stops the copy, never the reading:
the trainer upstream must not die of a broken pipe because nobody reads the exporter's output."""

from __future__ import annotations

import codecs
import logging
import os
import threading

from exporter.sources.base import FollowStats
from exporter.sources.child import MAX_PENDING_BYTES, PassThrough, PendingText

log = logging.getLogger(__name__)


class StdinReader:
    def __init__(self, fd: int = 0, tee_fd: int | None = None, max_pending: int = MAX_PENDING_BYTES) -> None:
        self._fd = fd
        self.tee = PassThrough(tee_fd, "stdout")
        self.text = PendingText("standard input", max_pending)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stats = FollowStats(up=True)
        self._thread: threading.Thread | None = None

    def start(self) -> StdinReader:
        """Starts reading (the first poll does it too): a reader built but replaced before use reads nothing."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="stdin-reader", daemon=True)
            self._thread.start()
        return self

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                self.text.put(self._decoder.decode(b"", final=True))
                self.text.end()
                return
            self.tee.write(data)
            self.stats.bytes_read += len(data)
            self.text.put(self._decoder.decode(data))

    def poll(self, timeout: float = 0.0) -> list[str]:
        self.start()
        return self.text.poll(timeout)

    @property
    def closed(self) -> bool:
        return self.text.closed

    @property
    def dropped_bytes(self) -> int:
        return self.text.dropped_bytes
