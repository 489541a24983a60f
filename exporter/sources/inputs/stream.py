"""A console stream handed out in chunks by a ChunkReader: standard input (sources/stdin.py), the trainer child
(sources/child.py), a pod's log (sources/kubernetes.py), the demo's replay (sources/replay.py)."""

from __future__ import annotations

from exporter.config import LogSpec
from exporter.pipeline import ConsoleStream
from exporter.sources.base import ChunkReader, Source
from exporter.sources.inputs.console import REDRAW_WAIT_SECONDS


class StreamInput(Source):
    """A stream handed out in chunks (a ChunkReader): standard input, the trainer child, a pod's log, the demo."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream, reader: ChunkReader) -> None:
        self.spec = spec
        self.stream = stream
        self.reader = reader
        self.follow = reader.stats  # the reader counts its bytes (undecoded) and its own health
        self._finished = False
        self._got: list[str] = []

    def read(self, timeout: float = 0.0) -> None:
        self._got += self.reader.poll(timeout)

    def ingest(self) -> bool:
        chunks, self._got = self._got, []
        for c in chunks:
            self.stream.feed(c)
        if self.reader.closed:
            self.finish()  # the writer is gone: nothing more will complete a held line
        else:
            self.stream.settle(REDRAW_WAIT_SECONDS)
        return bool(chunks)

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self.follow.up = False
            self.stream.finish()

    @property
    def drained(self) -> bool:
        return self.reader.closed

    @property
    def catching_up(self) -> bool:
        return bool(getattr(self.reader, "behind", False))  # the copier's pipe held more than one poll takes
