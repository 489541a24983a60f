"""A followed console log file (sources/files.py follows it), read in slices between which scrapes get the lock."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.config import LogSpec
from exporter.pipeline import ConsoleStream
from exporter.sources.base import Source
from exporter.sources.files import FileFollower
from exporter.sources.inputs.console import REDRAW_WAIT_SECONDS

# Text ingested from one file per poll while the lock is held: about 0.1 s of work, so a scrape waits no longer.
POLL_BYTES = 4 << 20


class FileInput(Source):
    """A followed file. A poll reads at most POLL_BYTES and keeps its place in the file's new text, so a large
    log (the whole history, after a restart) is caught up on in slices between which scrapes get the lock."""

    def __init__(self, spec: LogSpec, stream: ConsoleStream) -> None:
        self.spec = spec
        self.stream = stream
        self.follower = FileFollower(spec.path)
        self.follow = self.follower.stats
        self._chunks: Iterator[str] | None = None  # the new text not read yet, when a poll stopped short
        self._behind = False
        self._got: list[str] = []  # read, not ingested yet

    @property
    def catching_up(self) -> bool:
        return self._behind

    @property
    def drained(self) -> bool:
        return not self._behind and self.follower.drained

    def read(self, timeout: float = 0.0) -> None:
        if self._chunks is None:
            self._chunks = self.follower.poll()
        size = 0
        for chunk in self._chunks:
            self._got.append(chunk)
            size += len(chunk)
            if size >= POLL_BYTES:
                self._behind = True
                return
        self._chunks, self._behind = None, False

    def ingest(self) -> bool:
        got, self._got = self._got, []
        for chunk in got:
            self.stream.feed(chunk)
        if not self._behind:
            self.stream.settle(REDRAW_WAIT_SECONDS)
        if self.follower.written_at is not None:  # its records are no younger than the file (stall, stale)
            self.stream.run.written_by(self.follower.written_at)
        return bool(got)

    def finish(self) -> None:
        self.stream.finish()
