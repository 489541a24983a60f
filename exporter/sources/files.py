"""Following a log file as a trainer writes it.

Handles growth, a partial last line (the framer holds it until its end arrives), rotation by
rename and delete-and-recreate (the old file is read to its end, then the new one from its start),
copytruncate (the file shrinks, or its start is rewritten: read again from its start), a file that
does not exist yet, and read errors (counted, retried). NUL bytes are never text and are skipped (counted in
`nul_bytes`, said once per file): mostly the hole that a writer not in append mode (`> train.log`) leaves when the
file is truncated under it, as it writes on at its old offset; glued to the next line, they cost its record.

A file is known by its identity (device and inode) and its fingerprint (its first bytes, up to
FINGERPRINT_BYTES, and the last bytes read before the offset reached). A file that was let go (it
vanished, or a read failed) and comes back is read on from where it was left, never again from its
start: moved away and back, a brief read error, or the same content put back under a new inode
(a copy, an rsync) all resume, while a new file that only reuses a freed inode number is read whole.

A FIFO is read as a stream: opened without waiting for a writer (O_NONBLOCK), never seeked or fingerprinted, and
held open for as long as the path names it, so that writers come and go without losing a byte (a record sits in
the pipe until it is read). Anything else that is not a regular file (a device, a socket, a folder) is not
read: it can never be a log (a character device such as /dev/zero would be read for ever), said once and counted.

Every call here may block (a hung network mount): the exporter calls `poll` without its state lock."""

from __future__ import annotations

import codecs
import logging
import os
import select
import stat
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from exporter.sources.base import FollowStats

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
FINGERPRINT_BYTES = 4096
REMEMBERED_FILES = 16  # files let go whose offsets are kept, most recent first to stay
_SEEK_DATA: int | None = getattr(os, "SEEK_DATA", None)  # Linux, macOS: the next offset holding data, past a hole


@dataclass
class _Mark:
    """How far a file was read, and the bytes that tell it again: its first bytes and the last ones read."""

    dev: int
    ino: int
    offset: int = 0
    head: bytes = b""  # the file's first bytes, up to FINGERPRINT_BYTES
    tail: bytes = b""  # the FINGERPRINT_BYTES (or fewer) bytes just before `offset`
    blank: bool = True  # nothing but NUL bytes from the start to `offset`: a hole, skipped
    nul: int = 0  # NUL bytes skipped since the start
    said: bool = False  # the NUL bytes skipped were said

    @property
    def key(self) -> tuple[int, int]:
        return self.dev, self.ino

    def advance(self, data: bytes) -> None:
        if len(self.head) < FINGERPRINT_BYTES:
            self.head += data[: FINGERPRINT_BYTES - len(self.head)]
        self.tail = (self.tail + data[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]
        self.offset += len(data)

    def skip(self, n: int) -> None:
        """Past `n` NUL bytes (a hole, never read whole to be fingerprinted: it may be gigabytes)."""
        zeros = min(n, FINGERPRINT_BYTES)
        self.advance(bytes(zeros))
        self.offset += n - zeros
        self.nul += n

    def rewind(self) -> None:
        self.offset, self.head, self.tail = 0, b"", b""
        self.blank, self.nul, self.said = True, 0, False


class FileFollower:
    def __init__(self, path: str) -> None:
        self.path = path
        self.stats = FollowStats()
        self._fd: int | None = None  # the open file, held across polls to follow renames
        self._mark: _Mark | None = None  # the open file's identity and progress
        self._let_go: OrderedDict[tuple[int, int], _Mark] = OrderedDict()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._line_ended = True  # whether the last byte handed out ended a line
        self._last_read: _Mark | None = None  # the file whose bytes were handed out last
        self._warned_missing = False
        # The regular file's modification time at the last poll: its records were written by then, however late
        # they are read (a restarted exporter catching up on a log whose trainer died long ago). None: a stream.
        self.written_at: float | None = None
        self._fifo: int | None = None  # the FIFO held open (stream mode)
        self._fifo_key: tuple[int, int] | None = None
        self._fifo_writer_gone = False  # the last read of the FIFO found no writer (end of a stream, for `dump`)
        self._said_no_writer = False
        self._refused: int | None = None  # the mode of a path that is neither a file nor a FIFO, said once

    @property
    def drained(self) -> bool:
        """A FIFO is drained once its writers are gone (`dump` reads it to that end); a file always is."""
        return self._fifo is None or self._fifo_writer_gone

    def poll(self) -> Iterator[str]:
        """Everything new since the last poll, decoded, one chunk at a time (a large existing log is
        never held whole in memory)."""
        try:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                if self._fd is not None:
                    yield from self._drain()  # moved away or deleted: what was written before still counts
                    self._release()
                if not self._warned_missing:
                    log.info("waiting for %s to appear", self.path)
                    self._warned_missing = True
                self.stats.up = False
                return
            if stat.S_ISFIFO(st.st_mode) or self._fifo is not None:
                yield from self._poll_fifo(st)
                return
            if not stat.S_ISREG(st.st_mode):
                yield from self._refuse(st)
                return
            self._refused = None
            if self._mark is not None and (st.st_dev, st.st_ino) != self._mark.key:
                yield from self._drain()  # rotated: finish the old file, then take the new one
                self._release()
            if self._fd is None:
                yield from self._open()
            elif self._restarted(st):
                yield from self._end_previous()
            self.stats.up = True
            self.written_at = st.st_mtime
            yield from self._drain()
        except OSError as e:
            self._failed(e)

    def close(self) -> None:
        self._release()
        self._close_fifo()

    # --- a FIFO: a stream ---------------------------------------------------------------------------

    def _poll_fifo(self, st: os.stat_result) -> Iterator[str]:
        if self._fifo is not None and (st.st_dev, st.st_ino) != self._fifo_key:
            yield from self._read_fifo()  # the path names something else now: what the old FIFO holds still counts
            self._close_fifo()
            yield from self._end_previous()
            if not stat.S_ISFIFO(st.st_mode):
                return  # the next poll reads what took the path
        if self._fifo is None:
            if self._fd is not None:  # a file was followed at this path: it was replaced by a FIFO
                yield from self._drain()
                self._release()
            # O_NONBLOCK: a FIFO without a writer would block the open until one comes
            self._fifo = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            self._fifo_key = (st.st_dev, st.st_ino)
            self._warned_missing = False
            log.info("%s is a FIFO: read as a stream", self.path)
        self.stats.up = True
        yield from self._read_fifo()

    def _read_fifo(self) -> Iterator[str]:
        assert self._fifo is not None
        while True:
            try:
                data = os.read(self._fifo, READ_CHUNK)
            except BlockingIOError:  # a writer, nothing written yet
                self._fifo_writer_gone = False
                return
            if not data:  # no writer now: the FIFO stays open for the next one
                self._fifo_writer_gone = self._writer_left()
                return
            self._fifo_writer_gone = False
            self.stats.bytes_read += len(data)
            self._line_ended = data[-1:] in (b"\n", b"\r")
            yield self._decoder.decode(data)

    def _writer_left(self) -> bool:
        """A writer came and went since we opened the FIFO (the end of a stream), not none came yet: Linux tells the
        two apart by POLLHUP. `dump` of a FIFO nobody opened yet waits for its writer, as `cat` does."""
        assert self._fifo is not None
        poller = select.poll()
        poller.register(self._fifo, select.POLLIN)
        if not any(events & select.POLLHUP for _, events in poller.poll(0)):
            if not self._said_no_writer:
                log.info("%s: no writer has opened the FIFO yet: waiting for one", self.path)
                self._said_no_writer = True
            return False
        return True

    def _close_fifo(self) -> None:
        if self._fifo is not None:
            os.close(self._fifo)
        self._fifo, self._fifo_key = None, None

    def _refuse(self, st: os.stat_result) -> Iterator[str]:
        """Not a file and not a FIFO: never read (a device would be read for ever, a folder cannot be)."""
        if self._fd is not None:  # the file that had the path before: its last text still counts
            yield from self._drain()
            self._release()
        if self._refused != stat.S_IFMT(st.st_mode):
            self._refused = stat.S_IFMT(st.st_mode)
            self.stats.read_errors += 1
            log.warning("%s is %s, not a log file: not read (give a file, a FIFO or '-')", self.path,
                        describe_mode(st.st_mode))
        self.stats.up = False

    # --- opening: resume a known file, or start one ---------------------------------------------

    def _open(self) -> Iterator[str]:
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)  # the file actually opened (the path may have changed since the stat)
            outcome, mark = self._recognise(fd, st)
            if mark is not None:
                os.lseek(fd, mark.offset, os.SEEK_SET)
        except OSError:
            os.close(fd)
            raise
        self._warned_missing = False
        self._fd, self._mark = fd, mark or _Mark(st.st_dev, st.st_ino)
        if outcome == "resumed":
            self.stats.resumed += 1
            log.info("%s came back: reading on from byte %d", self.path, self._mark.offset)
            if self._mark is not self._last_read:  # another file was read meanwhile
                yield from self._end_previous()
            return
        if outcome == "truncated":
            self.stats.truncations += 1
        elif self._last_read is not None:  # a file was read before: this one replaces it
            self.stats.rotations += 1
        yield from self._end_previous()

    def _recognise(self, fd: int, st: os.stat_result) -> tuple[str, _Mark | None]:
        """("resumed", its mark) for a file let go before: the same identity and first bytes, or its
        content put back under a new inode (first bytes and the bytes before the offset); ("truncated",
        None) for a known identity that shrank below its offset; ("new", None) for anything else."""
        mark = self._let_go.pop((st.st_dev, st.st_ino), None)
        if mark is not None:
            start = _read_at(fd, len(mark.head), 0)
            if st.st_size >= mark.offset and start == mark.head:
                return "resumed", mark
            if start and mark.head.startswith(start):
                return "truncated", None  # emptied while away and written again, less than before
            return "new", None  # an inode number freed and reused by another file
        for key, old in self._let_go.items():
            if (st.st_size >= old.offset and _read_at(fd, len(old.head), 0) == old.head
                    and _read_at(fd, len(old.tail), old.offset - len(old.tail)) == old.tail):
                del self._let_go[key]
                old.dev, old.ino = st.st_dev, st.st_ino
                return "resumed", old
        return "new", None

    def _restarted(self, st: os.stat_result) -> bool:
        """The open file shrank, or its first bytes changed (truncated and written past our offset
        between two polls): read it again from its start."""
        assert self._fd is not None and self._mark is not None
        mark = self._mark
        if st.st_size >= mark.offset and _read_at(self._fd, len(mark.head), 0) == mark.head:
            return False
        self._rewind()
        return True

    def _rewind(self) -> None:
        assert self._fd is not None and self._mark is not None
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._mark.rewind()
        self.stats.truncations += 1

    # --- reading ----------------------------------------------------------------------------------

    def _read(self, fd: int, n: int) -> bytes:
        return os.read(fd, n)

    def _drain(self) -> Iterator[str]:
        assert self._fd is not None and self._mark is not None
        mark = self._mark
        while True:
            if mark.blank:
                self._past_hole()
            data = self._read(self._fd, READ_CHUNK)
            if not data:
                return
            if mark.head and _read_at(self._fd, len(mark.head), 0) != mark.head:
                # Truncated and written again while we read (copytruncate): these bytes may be new text at
                # an old offset. Drop them and read the file again from its start.
                self._rewind()
                yield from self._end_previous()
                continue
            mark.advance(data)
            self.stats.bytes_read += len(data)
            self._last_read = mark
            if b"\0" in data:  # a memchr: nothing to do for a log without them
                data = self._without_nul(data)
                if not data:
                    continue
            if mark.nul and not mark.said:
                self._say_nul()
            mark.blank = False
            self._line_ended = data[-1:] in (b"\n", b"\r")
            yield self._decoder.decode(data)

    def _past_hole(self) -> None:
        """Seek past what the filesystem holds as a hole at the start (SEEK_DATA), not reading it: a writer that
        truncated under it writes on at its old offset, which may be gigabytes in."""
        assert self._fd is not None and self._mark is not None
        mark = self._mark
        try:
            pos = os.lseek(self._fd, mark.offset, _SEEK_DATA) if _SEEK_DATA is not None else mark.offset
        except OSError:  # ENXIO: a hole to the end, which a write may end at any moment; EINVAL: not supported
            os.lseek(self._fd, mark.offset, os.SEEK_SET)
            return
        if pos > mark.offset:
            self.stats.nul_bytes += pos - mark.offset
            mark.skip(pos - mark.offset)

    def _without_nul(self, data: bytes) -> bytes:
        """`data` less its NUL bytes (counted): a hole's, glued to the next line, would cost its
        record (no parser takes a line starting with them); elsewhere they are no text either."""
        assert self._mark is not None
        mark = self._mark
        text = data.replace(b"\0", b"")
        self.stats.nul_bytes += len(data) - len(text)
        mark.nul += len(data) - len(text)
        return text

    def _say_nul(self) -> None:
        """Once per file (and again after each truncation): text came after NUL bytes skipped."""
        assert self._mark is not None
        mark = self._mark
        mark.said = True
        log.info("%s: skipped %d NUL bytes%s, no text: most likely the hole a writer not in append mode leaves when "
                 "the log is truncated under it (copytruncate; write the log with '>>', in append mode); further ones "
                 "are only counted in posttrain_exporter_source_dropped_bytes_total{reason=\"nul\"}", self.path,
                 mark.nul, " at its start" if mark.blank else "")

    def _end_previous(self) -> Iterator[str]:
        """Between two different files (or a file and its rewritten self): a line the old one left
        unterminated ends here, so that it is not glued to the new file's first line (costing both)."""
        rest = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        if rest or not self._line_ended:
            yield rest + "\n"
        self._line_ended = True

    # --- letting go ---------------------------------------------------------------------------------

    def _release(self) -> None:
        """Close the file and remember how far it was read, in case it comes back."""
        if self._mark is not None and self._mark.offset:
            self._let_go[self._mark.key] = self._mark
            self._let_go.move_to_end(self._mark.key)
            while len(self._let_go) > REMEMBERED_FILES:
                self._let_go.popitem(last=False)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._mark = None

    def _failed(self, e: OSError) -> None:
        if self.stats.up or not self.stats.read_errors:
            log.warning("cannot read %s: %s (retrying)", self.path, e)
        self.stats.read_errors += 1
        self.stats.up = False
        self._release()


def describe_mode(mode: int) -> str:
    """What a path is, in words, for the messages that refuse it."""
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISFIFO, "a FIFO"),
                        (stat.S_ISREG, "a file")):
        if test(mode):
            return words
    return "not a file"


def _read_at(fd: int, n: int, offset: int) -> bytes:
    return os.pread(fd, n, offset) if n else b""
