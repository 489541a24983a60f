"""Following a log file as a trainer writes it.

Handles growth, a partial last line (the framer holds it until its end arrives), rotation by
rename and delete-and-recreate (the old file is read to its end, then the new one from its start),
copytruncate (the file shrinks: read again from its start), a file that does not exist yet, and
read errors (counted, retried)."""

from __future__ import annotations

import codecs
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20


@dataclass
class FollowStats:
    up: bool = False  # the file exists and could be read at the last poll
    rotations: int = 0
    truncations: int = 0
    read_errors: int = 0
    bytes_read: int = 0


class FileFollower:
    def __init__(self, path: str) -> None:
        self.path = path
        self.stats = FollowStats()
        self._f = None  # the open file object (binary)
        self._ino: tuple[int, int] | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._warned_missing = False

    def poll(self) -> Iterator[str]:
        """Everything new since the last poll, decoded, one chunk at a time (a large existing log is
        never held whole in memory)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._f is not None:
                yield from self._drain()  # deleted: what was written before the delete still counts
                self._close()
            if not self._warned_missing:
                log.info("waiting for %s to appear", self.path)
                self._warned_missing = True
            self.stats.up = False
            return
        except OSError as e:
            self._failed(e)
            return
        try:
            if self._f is not None and (st.st_dev, st.st_ino) != self._ino:
                yield from self._drain()  # rotated: finish the old file, then start the new one
                self._close()
                self.stats.rotations += 1
            if self._f is None:
                self._open(st)
            elif st.st_size < self._f.tell():
                self._f.seek(0)  # copytruncate
                self.stats.truncations += 1
            self.stats.up = True
            yield from self._drain()
        except OSError as e:
            self._failed(e)

    def close(self) -> None:
        self._close()

    def _open(self, st: os.stat_result) -> None:
        self._f = open(self.path, "rb")  # noqa: SIM115 - held open across polls to follow renames
        self._ino = (st.st_dev, st.st_ino)
        self._warned_missing = False

    def _drain(self) -> Iterator[str]:
        assert self._f is not None
        while True:
            data = self._f.read(READ_CHUNK)
            if not data:
                return
            self.stats.bytes_read += len(data)
            yield self._decoder.decode(data)

    def _close(self) -> None:
        if self._f is not None:
            self._f.close()
        self._f = None
        self._ino = None

    def _failed(self, e: OSError) -> None:
        if self.stats.up or not self.stats.read_errors:
            log.warning("cannot read %s: %s (retrying)", self.path, e)
        self.stats.read_errors += 1
        self.stats.up = False
        self._close()
