"""Standard input as a log stream: `python train.py 2>&1 | posttrain-exporter serve --log -`.

With `tee_fd` (serve sets it to standard output) every byte read is also written there, unchanged, so the
trainer's output still reaches the pod log. A closed downstream (EPIPE) stops the copy, never the reading:
the trainer upstream must not die of a broken pipe because nobody reads the exporter's output."""

from __future__ import annotations

import codecs
import logging
import os
import queue
import threading

from exporter.sources.child import MAX_PENDING_BYTES, PassThrough

log = logging.getLogger(__name__)


class StdinReader:
    def __init__(self, fd: int = 0, tee_fd: int | None = None, max_pending: int = MAX_PENDING_BYTES) -> None:
        self._fd = fd
        self.tee = PassThrough(tee_fd, "stdout")
        self.dropped_bytes = 0  # read while parsing was more than max_pending behind: copied, not parsed
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._q: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.closed = False
        self.bytes_read = 0
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
                rest = self._decoder.decode(b"", final=True)
                if rest:
                    self._q.put(rest)
                self._q.put(None)
                return
            self.tee.write(data)
            self.bytes_read += len(data)
            text = self._decoder.decode(data)
            with self._lock:
                behind = self._pending + len(text) > self._max_pending
                if not behind:
                    self._pending += len(text)
            if behind:  # never hold the trainer back (upstream) for parsing: skip it, keep the copy
                if not self.dropped_bytes:
                    log.warning("parsing is more than %d MiB behind standard input; skipping input for parsing "
                                "until it catches up (the copy to standard output is whole)", self._max_pending >> 20)
                self.dropped_bytes += len(data)
                continue
            self._q.put(text)

    def poll(self, timeout: float = 0.0) -> list[str]:
        self.start()
        out: list[str] = []
        try:
            item = self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
            while True:
                if item is None:
                    self.closed = True
                    break
                out.append(item)
                item = self._q.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            self._pending -= sum(map(len, out))
        return out
