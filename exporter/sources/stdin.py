"""Standard input as a log stream: `python train.py 2>&1 | posttrain-exporter serve --log -`."""

from __future__ import annotations

import codecs
import os
import queue
import threading


class StdinReader:
    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._q: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.closed = False
        self.bytes_read = 0
        threading.Thread(target=self._pump, name="stdin-reader", daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                self._q.put(None)
                return
            self.bytes_read += len(data)
            self._q.put(self._decoder.decode(data))

    def poll(self, timeout: float = 0.0) -> list[str]:
        out: list[str] = []
        try:
            item = self._q.get(timeout=timeout) if timeout else self._q.get_nowait()
            while True:
                if item is None:
                    self.closed = True
                    return out
                out.append(item)
                item = self._q.get_nowait()
        except queue.Empty:
            return out
