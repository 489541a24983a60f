"""The pass-through, a process of its own: copies the trainer's output (its stdout and stderr pipes, or our standard
input) to where it would have gone without the exporter, and offers a copy to the exporter for parsing.

Why a process: the copy must never wait on the exporter. A thread beside the parser shares its interpreter lock
(a busy parser made a trainer printing 200 MB take 15 times longer), its memory (what it holds is the sidecar's)
and its fate (an exporter killed for memory closed the trainer's pipes). This process imports nothing of the
exporter, holds at most a chunk per stream (and, in the kernel, a pipe of 1 MiB per stream for the parser's copy),
and lives on if the exporter dies.

From a pipe to an output, the trainer's bytes never pass through this process: tee(2) duplicates them into the
parser's copy and splice(2) moves them on to the output, page references both, no byte copied (only the last byte
of a chunk is read, to know whether the output is at a line boundary). A trainer printing at memory speed waits on
us little more than on its output alone. A file or terminal as input, an output that takes no splice (a terminal,
a regular file: see `Output`) and small chunks are read and written instead.

Each stream has its own thread: a slow reader of our stdout holds the trainer's stdout, as it would without us,
never its stderr. A write that fails is retried, never given up for good:
- EAGAIN (someone made our output non-blocking): wait until it takes more, as a blocking write would;
- ENOSPC, EIO, ...: retried for RETRY_SECONDS, then that chunk is dropped (counted) and the next is tried at once;
- EPIPE (nobody reads our output any more): that copy stops, the reading goes on (the trainer never sees EPIPE).

The parser's copy: each stream's bytes go into a pipe of ours (`ParseCopy`), and a feeder thread per stream moves
them on to the parser's one pipe in frames (a tag byte: which stream, four length bytes, the bytes; `ParseFeed`),
waiting for the parser as long as it takes them. The exporter keeps one UTF-8 decoder per stream. When the parser
is so far behind that a stream's pipe is full, the trainer is not held: what does not fit is dropped for parsing
only (counted), and a GAP frame marks the place, so that the text on both sides of the hole is never glued into one
line. Once the trainer's streams ended, the feeders go on while the parser takes their bytes (LOG_DRAIN_SECONDS
without progress ends them, what is left counted as dropped).

The exporter's own log lines (`run`) come in on a pipe of their own, one line each, and are written to our stderr
only where the trainer's stderr is at a line boundary; held longer than HOLD_SECONDS, they go to stdout if that is
at a boundary. A trainer's line is never cut by them. At most HELD_LINES wait (older ones dropped, counted).

Usage: python -m exporter.sources.copier --stream SRC:DST:TAG [--stream ...] [--parse FD] [--log FD]
[--counters FD] [--log-format logfmt|json]. DST -1: read and parse only. The counters are little-endian uint64s
in a shared file (COUNTERS).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import select
import signal
import stat
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20  # asked of every pipe we read or feed (Linux: F_SETPIPE_SZ; the default is 64 KiB)
MAX_FRAME = 256 << 10
HEADER = struct.Struct(">cI")
GAP = b"g"
RETRY_SECONDS = 1.0
HOLD_SECONDS = 1.0
LOG_DRAIN_SECONDS = 5.0  # after the trainer's streams ended, the exporter's log lines are read until it closes them
HELD_LINES = 1000
COUNTERS = ("bytes_read", "parse_dropped_bytes", "gaps", "output_dropped_bytes", "output_write_errors",
            "log_lines_dropped")
COUNTERS_SIZE = 8 * len(COUNTERS)


def set_pipe_size(fd: int, size: int = PIPE_SIZE) -> None:
    """A larger pipe: the trainer blocks less often on a busy moment of ours. Best effort (Linux only)."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)


class Counters:
    def __init__(self, fd: int | None) -> None:
        self._lock = threading.Lock()
        self._map = mmap.mmap(fd, COUNTERS_SIZE) if fd is not None else None
        self._local = [0] * len(COUNTERS)

    def add(self, name: str, n: int = 1) -> None:
        i = COUNTERS.index(name)
        with self._lock:
            self._local[i] += n
            if self._map is not None:
                struct.pack_into("<Q", self._map, 8 * i, self._local[i])


LOG_FORMAT = ["logfmt"]  # the exporter's --log.format, set by main


def note(text: str) -> None:
    """The copier's own word, to our stderr as one line (it comes before or after a trainer's line, see `Logs`), in
    the exporter's log format: the fields of its lines (exporter/cli.py), the caller left out."""
    fields = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "level": "warn",
              "logger": "posttrain-exporter.copier", "msg": text}
    if LOG_FORMAT[0] == "json":
        line = json.dumps(fields, ensure_ascii=False)
    else:
        line = " ".join(f"{k}={v if k != 'msg' else json.dumps(v, ensure_ascii=False)}" for k, v in fields.items())
    LOGS.add(line.encode() + b"\n")


class Output:
    """One of our output descriptors, written by one stream's thread and by the held log lines, whole lines apart."""

    def __init__(self, fd: int, name: str, counters: Counters) -> None:
        self.fd = fd
        self.name = name
        self.counters = counters
        self.lock = threading.Lock()
        self.at_boundary = True  # the last byte written ended a line (or nothing was written)
        self.closed = False  # EPIPE: nobody reads it any more
        self._failing = False  # the last chunk could not be written: the next is tried once, without waiting
        # Never into a regular file: splice(2) moves its offset without the lock write(2) takes, so with another
        # writer on the same open file (`> pod.log 2>&1`: the other stream, the exporter's own log) both write at one
        # offset and bytes are overwritten. A pipe or socket has no offset: spliced until it refuses.
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        self.splicing = _SPLICE is not None and not regular

    def write(self, data: memoryview) -> None:
        with self.lock:
            self._write(data)
            self.at_boundary = data[-1:] == b"\n"

    def forward(self, src: int, n: int, buf: memoryview) -> None:
        """Moves `n` bytes that the pipe `src` holds to this output: spliced (no copy) but for the last byte, which
        is read and written, so that we know whether the output is at a line boundary; copied where splice cannot be
        used (a terminal, a regular file), where the chunk is small, and where a splice failed (the copy
        retries, counts and says)."""
        with self.lock:
            if self.splicing and not self.closed and n >= SPLICE_MIN:
                n = self._splice(src, n - 1) + 1
            got = read_exactly(src, buf[:n])
            if got:
                self._write(buf[:got])
                self.at_boundary = buf[got - 1] == 0x0A

    def _splice(self, src: int, n: int) -> int:
        """Splices `n` bytes from `src`; the bytes left (a failure: they go the copying way)."""
        while n and _SPLICE is not None:
            try:
                moved = _SPLICE(src, self.fd, n)
            except BlockingIOError:  # our output was made non-blocking: wait as a blocking write would
                select.select([], [self.fd], [], 1.0)
                continue
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EBADF):  # this output takes no splice
                    self.splicing = False
                return n
            if not moved:
                return n
            n -= moved
            if self._failing:
                self._failing = False
                note(f"writing {self.name} again")
        return n

    def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        deadline = None
        while view and not self.closed:
            try:
                view = view[os.write(self.fd, view):]
                if self._failing:
                    self._failing = False
                    note(f"writing {self.name} again")
                continue
            except BlockingIOError:  # our output was made non-blocking: wait as a blocking write would
                select.select([], [self.fd], [], 1.0)
                continue
            except InterruptedError:
                continue
            except BrokenPipeError:
                self.closed = True
                note(f"nobody reads {self.name} any more: its copy stops (the trainer's output is still read)")
                return
            except OSError as e:
                error = e
            self.counters.add("output_write_errors")
            if deadline is None:
                deadline = time.monotonic() + (0 if self._failing else RETRY_SECONDS)
            if time.monotonic() >= deadline:  # give up this chunk, never the stream
                self.counters.add("output_dropped_bytes", len(view))
                if not self._failing:
                    self._failing = True
                    note(f"cannot write {self.name} ({os.strerror(error.errno or errno.EIO)}): dropping what cannot "
                         "be written, trying each new chunk")
                return
            time.sleep(0.02)


def _libc_tee() -> Callable[[int, int, int, int], int] | None:
    """tee(2) (Linux): duplicates what a pipe holds into another pipe without reading it. Python has no os.tee."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).tee
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    fn.restype = ctypes.c_ssize_t
    return fn


_TEE = _libc_tee()
_SPLICE = getattr(os, "splice", None)
SPLICE_MIN = 1 << 14  # a smaller chunk is copied: three system calls for a few pages cost more than the copy


def tee(src: int, dst: int, n: int) -> int:
    """Duplicates up to `n` of the bytes `src` holds into `dst`, never waiting; OSError as os functions raise it."""
    if _TEE is None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    got = _TEE(src, dst, n, os.SPLICE_F_NONBLOCK)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return got


def pending(fd: int) -> int:
    """Bytes a pipe holds (FIONREAD); 0 where that cannot be told."""
    try:
        buf = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, buf)
    except OSError:
        return 0
    return buf[0]


def read_exactly(fd: int, view: memoryview) -> int:
    """Reads len(view) bytes that `fd` (a pipe we alone read) is known to hold; fewer only at its end."""
    got = 0
    while got < len(view):
        try:
            n = os.readv(fd, [view[got:]])
        except InterruptedError:
            continue
        if not n:
            break
        got += n
    return got


class ParseFeed:
    """The one pipe to the exporter's parser, in frames (`HEADER`: tag, length, then the bytes). Written by each
    stream's feeder thread (see `ParseCopy`), a whole frame at a time. A feeder waits for the parser; the trainer's
    copy never does."""

    def __init__(self, fd: int, counters: Counters) -> None:
        self.fd = fd
        self.counters = counters
        self.gone = False  # the exporter closed its end: no more copies are made for it
        self.stop = threading.Event()  # the trainer's streams ended and the parser took nothing for a while
        self.progress = time.monotonic()  # when the parser last took bytes
        self._lock = threading.Lock()
        os.set_blocking(fd, False)

    def frame(self, tag: bytes, src: int, n: int) -> int:
        """Moves `n` bytes of the pipe `src` (or none: a GAP) to the parser as one frame; the bytes moved, fewer than
        `n` once the frame could not be finished (the exporter is gone, or `stop`): the parser drops a cut frame."""
        with self._lock:
            if self.gone or self.stop.is_set() or not self._write(HEADER.pack(tag, n)):
                return -1
            done = 0
            while done < n:
                moved = self._splice(src, n - done)
                if moved is None:  # no splice here: copied
                    data = os.read(src, n - done)
                    if not self._write(data):
                        return done + len(data)
                    moved = len(data)
                if moved < 0:
                    return done
                done += moved
            return done

    def _splice(self, src: int, n: int) -> int | None:
        """Bytes moved from `src`, -1 once nothing can be, None where splice(2) cannot be used."""
        while _SPLICE is not None:
            try:
                moved = _SPLICE(src, self.fd, n, flags=os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK)
            except BlockingIOError:
                if not self._wait():
                    return -1
                continue
            except InterruptedError:
                continue
            except BrokenPipeError:  # the exporter is gone: the copy to the log goes on
                self.gone = True
                return -1
            except (OSError, ValueError):  # no splice between these two: copied (a write says what is wrong)
                return None
            self.progress = time.monotonic()
            return moved
        return None

    def _write(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
                self.progress = time.monotonic()
            except BlockingIOError:
                if not self._wait():
                    return False
            except InterruptedError:
                continue
            except OSError:  # the exporter is gone: the copy to the log goes on
                self.gone = True
                return False
        return True

    def _wait(self) -> bool:
        """Waits for room in the parser's pipe; False once told to stop."""
        while not self.stop.is_set():
            with contextlib.suppress(InterruptedError):
                _, ready, _ = select.select([], [self.fd], [], 0.2)
                if ready:
                    return True
        return False


class ParseCopy:
    """One stream's copy for the parser: a pipe of our own (`mid`) that the stream's bytes are duplicated into
    (tee(2): no copy made, or written where tee cannot be used), and a feeder thread that moves them on to the
    parser in frames. When `mid` is full (the parser is behind), what does not fit is dropped for parsing only
    (counted), and a GAP frame marks the place, so that the text on both sides of the hole is never glued into one
    line: `gaps` holds the offsets in `mid`'s bytes where a hole is, appended before any byte after it."""

    def __init__(self, tag: bytes, feed: ParseFeed, counters: Counters) -> None:
        self.tag = tag
        self.feed = feed
        self.counters = counters
        self.mid_r, self.mid_w = os.pipe()
        set_pipe_size(self.mid_w)
        os.set_blocking(self.mid_w, False)
        self.written = 0  # bytes put into mid
        self.gaps: deque[int] = deque()
        self._in_gap = False
        self.ended = False  # set after the stream's last byte went into mid
        self.thread = threading.Thread(target=self._feed, daemon=True)

    @property
    def wanted(self) -> bool:
        return not self.feed.gone

    def teed(self, n: int) -> None:
        self.written += n
        self._in_gap = False

    def dropped(self, n: int) -> None:
        if not self.wanted:
            return
        self.counters.add("parse_dropped_bytes", n)
        if not self._in_gap:
            self.gaps.append(self.written)
            self.counters.add("gaps")
            self._in_gap = True

    def offer(self, data: memoryview) -> None:
        """Where tee cannot be used: the bytes written into mid, what does not fit dropped."""
        if not self.wanted:
            return
        try:
            n = os.write(self.mid_w, data)
        except OSError:  # full (EAGAIN): dropped below, counted
            n = 0
        if n:
            self.teed(n)
        if n < len(data):
            self.dropped(len(data) - n)

    def end(self) -> None:
        self.ended = True
        os.close(self.mid_w)

    def _feed(self) -> None:
        fed = 0
        while True:
            ended = self.ended  # first: once ended, every byte and hole of the stream is in what is read below
            held = pending(self.mid_r)  # next: any hole before these bytes is in `gaps` by now
            gap = self.gaps[0] if self.gaps else None
            if gap is not None and gap <= fed:
                if self.feed.frame(GAP, self.mid_r, 0) < 0:
                    break
                self.gaps.popleft()
                continue
            if not held:
                if ended:
                    return
                with contextlib.suppress(InterruptedError):
                    select.select([self.mid_r], [], [], 0.2)
                if self.feed.stop.is_set() or self.feed.gone:
                    break
                continue
            n = min(held, MAX_FRAME, gap - fed if gap is not None else held)
            moved = self.feed.frame(self.tag, self.mid_r, n)
            if moved < n:
                self.dropped(max(moved, 0))  # a cut frame: the parser drops it whole
                break
            fed += n
        self.dropped(pending(self.mid_r))  # what the parser never took


class Logs:
    """The exporter's own log lines, held until one of our outputs is at a line boundary. A flush never waits: a
    stream's thread that finds another flush under way (writing to a slow output) goes on copying."""

    def __init__(self) -> None:
        self.outputs: list[Output] = []  # stderr first
        self.counters: Counters | None = None
        self._held: deque[tuple[float, bytes]] = deque()
        self._held_lock = threading.Lock()  # the deque alone, held briefly
        self._flushing = threading.Lock()  # one flush at a time

    def add(self, line: bytes) -> None:
        with self._held_lock:
            self._held.append((time.monotonic(), line))
            while len(self._held) > HELD_LINES:
                self._held.popleft()
                if self.counters is not None:
                    self.counters.add("log_lines_dropped")
        self.flush()

    def flush(self, final: bool = False) -> None:
        """Writes the held lines to the first output at a line boundary: stderr, or, once they waited HOLD_SECONDS,
        stdout. `final` (the trainer's streams ended): to whichever is at a boundary, else after a newline."""
        if not self._flushing.acquire(blocking=final):
            return
        try:
            with self._held_lock:
                if not self._held:
                    return
                waited = time.monotonic() - self._held[0][0]
            open_ = [o for i, o in enumerate(self.outputs) if not o.closed and (i == 0 or waited >= HOLD_SECONDS
                                                                                  or final)]
            for out in open_:
                if not out.lock.acquire(blocking=final):  # its stream is writing now: at the next flush
                    continue
                try:
                    if out.at_boundary:
                        self._write_held(out)
                        return
                finally:
                    out.lock.release()
            if final and open_:
                with open_[0].lock:
                    self._write_held(open_[0])
            elif final:  # nowhere left to write them
                with self._held_lock:
                    if self.counters is not None:
                        self.counters.add("log_lines_dropped", len(self._held))
                    self._held.clear()
        finally:
            self._flushing.release()

    def _write_held(self, out: Output) -> None:
        with self._held_lock:
            lines = b"".join(line for _, line in self._held)
            self._held.clear()
        out._write((b"" if out.at_boundary else b"\n") + lines)
        out.at_boundary = True


LOGS = Logs()


def pump(src: int, name: str, out: Output | None, copy: ParseCopy | None, counters: Counters) -> None:
    """Copies one of the trainer's streams to its output and offers it to the parser. From a pipe to an output the
    bytes are not copied through us at all: duplicated into the parser's copy (tee) and moved on (splice), so a
    trainer printing at memory speed waits on us little more than on its output. Elsewhere (a file or terminal as
    input, no output) they are read and written."""
    buf = bytearray(CHUNK)  # one buffer, read into again and again: no new memory (and page faults) per read
    whole = memoryview(buf)
    zero_copy = out is not None and _SPLICE is not None and stat.S_ISFIFO(os.fstat(src).st_mode)
    while True:
        try:
            if zero_copy:
                n = _pass_pipe(src, out, copy, whole)
            else:
                try:
                    n = os.readv(src, [buf])
                except BlockingIOError:  # an input someone made non-blocking: wait as a blocking read would
                    select.select([src], [], [], 1.0)
                    continue
                if n:
                    if out is not None:
                        out.write(whole[:n])  # first the log, whatever parsing does
                    if copy is not None:
                        copy.offer(whole[:n])
        except InterruptedError:
            continue
        except NoZeroCopy:
            zero_copy = False
            continue
        except OSError as e:  # the trainer's pipe failed: its copy ends here, said (not taken for its end)
            note(f"reading the trainer's {name} failed ({e}); its copy stops here")
            n = 0
        if not n:
            break
        counters.add("bytes_read", n)
        LOGS.flush()
    os.close(src)
    if copy is not None:
        copy.end()


class NoZeroCopy(Exception):
    """tee(2) is refused here: the stream is read and written instead."""


def _pass_pipe(src: int, out: Output, copy: ParseCopy | None, buf: memoryview) -> int:
    """One chunk of the pipe `src`: duplicated for the parser, then moved to `out`. 0 at its end."""
    select.select([src], [], [])
    held = min(pending(src), CHUNK)
    if not held:  # readable and empty: its end (we alone read it)
        return 0
    if held < SPLICE_MIN:
        # A small chunk is read and written: tee(2) would hand the parser's copy one pipe buffer per write of the
        # trainer's, and a pipe holds 256 buffers however small (a trainer printing short lines one write each
        # filled it after 256 lines); written, the bytes fill its pages.
        n = read_exactly(src, buf[:held])
        out.write(buf[:n])
        if copy is not None:
            copy.offer(buf[:n])
        return n
    teed = 0  # a chunk this large was written while we were busy: the trainer's writes filled whole pages
    if copy is not None and copy.wanted:
        try:
            teed = tee(src, copy.mid_w, held)
        except BlockingIOError:  # the parser's copy is full: this chunk is not parsed
            pass
        except OSError as e:  # no tee(2) here
            raise NoZeroCopy from e
    n = teed or held
    if copy is not None:
        if teed:
            copy.teed(n)
        else:
            copy.dropped(n)
    out.forward(src, n, buf)
    return n


def read_logs(fd: int, done: threading.Event) -> None:
    """The exporter's log lines: one line each, held until a boundary; flushed now and then while held."""
    rest = b""
    while not done.is_set():
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            *lines, rest = (rest + data).split(b"\n")
            for line in lines:
                LOGS.add(line + b"\n")
            if len(rest) > 1 << 20:  # a line that never ends: held no longer
                LOGS.add(rest + b"\n")
                rest = b""
        LOGS.flush()
    LOGS.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="posttrain-exporter copier")
    p.add_argument("--stream", action="append", default=[], help="SRC:DST:TAG")
    p.add_argument("--parse", type=int)
    p.add_argument("--log", type=int)
    p.add_argument("--counters", type=int)
    p.add_argument("--log-format", choices=("logfmt", "json"), default="logfmt")
    args = p.parse_args(argv)
    LOG_FORMAT[0] = args.log_format
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # the trainer's end ends us: its pipes close
        signal.signal(sig, signal.SIG_IGN)
    counters = Counters(args.counters)
    LOGS.counters = counters
    feed = ParseFeed(args.parse, counters) if args.parse is not None else None
    outputs: dict[int, Output] = {}
    threads, copies = [], []
    for spec in args.stream:
        src, dst, tag = spec.split(":")
        out = None
        if int(dst) >= 0:
            out = outputs.setdefault(int(dst), Output(int(dst), {1: "stdout", 2: "stderr"}.get(int(dst), dst),
                                                      counters))
        set_pipe_size(int(src))
        copy = ParseCopy(tag.encode(), feed, counters) if feed is not None else None
        copies += [copy] if copy is not None else []
        name = "stderr" if tag == "e" else "stdout"
        threads.append(threading.Thread(target=pump, args=(int(src), name, out, copy, counters)))
    LOGS.outputs = sorted(outputs.values(), key=lambda o: o.fd != 2)  # stderr first
    done = threading.Event()
    logger = threading.Thread(target=read_logs, args=(args.log, done), daemon=True) if args.log is not None else None
    for t in [*threads, *(c.thread for c in copies)]:
        t.start()
    if logger is not None:
        logger.start()
    for t in threads:
        t.join()
    if feed is not None:  # what the parser's copies hold: fed on while the parser takes it
        ended = time.monotonic()
        while any(c.thread.is_alive() for c in copies):
            if time.monotonic() - max(feed.progress, ended) > LOG_DRAIN_SECONDS:
                feed.stop.set()
            for c in copies:
                c.thread.join(0.2)
    if logger is not None:  # the exporter's last lines: until it closes its end (it does once the trainer exited)
        logger.join(LOG_DRAIN_SECONDS)
    done.set()
    if logger is not None:
        logger.join(1.0)
    LOGS.flush(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
