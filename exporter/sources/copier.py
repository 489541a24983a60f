"""The pass-through, a process of its own: copies the trainer's output (its stdout and stderr pipes, or our standard
input) to where it would have gone without the exporter, and offers a copy to the exporter for parsing.

Why a process: the copy must never wait on the exporter. A thread beside the parser shares its interpreter lock
(a busy parser made a trainer printing 200 MB take 15 times longer), its memory (what it holds is the sidecar's)
and its fate (an exporter killed for memory closed the trainer's pipes). This process imports nothing of the
exporter, holds at most a chunk per stream, and lives on if the exporter dies.

Each stream has its own thread: a slow reader of our stdout holds the trainer's stdout, as it would without us,
never its stderr. A write that fails is retried, never given up for good:
- EAGAIN (someone made our output non-blocking): wait until it takes more, as a blocking write would;
- ENOSPC, EIO, ...: retried for RETRY_SECONDS, then that chunk is dropped (counted) and the next is tried at once;
- EPIPE (nobody reads our output any more): that copy stops, the reading goes on (the trainer never sees EPIPE).

The parser's copy goes through one pipe, in frames (a tag byte: which stream, four length bytes, the bytes),
each written whole or not at all, never cut (see `Parse`): the exporter reads frames in the order the chunks were
read, and keeps one UTF-8 decoder per stream. A frame that does not fit (the parser is behind) is dropped and
counted, and a GAP frame goes first once there is room again, so that the text on both sides of the hole is never
glued into one line.

The exporter's own log lines (`run`) come in on a pipe of their own, one line each, and are written to our stderr
only where the trainer's stderr is at a line boundary; held longer than HOLD_SECONDS, they go to stdout if that is
at a boundary. A trainer's line is never cut by them. At most HELD_LINES wait (older ones dropped, counted).

Usage: python -m exporter.sources.copier --stream SRC:DST:TAG [--stream ...] [--parse FD] [--log FD]
[--counters FD]. DST -1: read and parse only. The counters are little-endian uint64s in a shared file (COUNTERS).
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import fcntl
import mmap
import os
import select
import signal
import struct
import sys
import termios
import threading
import time
from collections import deque

CHUNK = 1 << 20
PIPE_SIZE = 1 << 20  # asked of every pipe we read or feed (Linux: F_SETPIPE_SZ; the default is 64 KiB)
FRAME = 4096  # PIPE_BUF on Linux (POSIX: at least 512): a write this small is whole or refused
PAGE = 4096
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


def note(text: str) -> None:
    """The copier's own word, to our stderr as one line (it comes before or after a trainer's line, see `Logs`)."""
    LOGS.add(f'ts={time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} level=warn logger=posttrain-exporter.copier '
             f'msg="{text}"\n'.encode())


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

    def write(self, data: memoryview) -> None:
        with self.lock:
            self._write(data)
            self.at_boundary = data[-1:] == b"\n"

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


class Parse:
    """The parser's copy: frames on a non-blocking pipe, each written whole or not at all, dropped (counted) when
    the parser is behind. A frame is at most PIPE_BUF bytes (POSIX: such a write is whole or refused), or, where
    the pipe says how full it is (Linux: F_GETPIPE_SZ, FIONREAD), as large as it surely has room for."""

    def __init__(self, fd: int | None, counters: Counters) -> None:
        self.fd = fd
        self.counters = counters
        self._lock = threading.Lock()
        self._gap = False
        self._size = pipe_size(fd) if fd is not None else None
        if fd is not None:
            os.set_blocking(fd, False)

    def send(self, tag: bytes, data: memoryview) -> None:
        if self.fd is None:
            return
        with self._lock:
            i = 0
            while i < len(data):
                room = self._room()
                if self._gap and room >= HEADER.size and self._frame(GAP, b""):
                    self._gap = False
                    room -= HEADER.size
                piece = data[i:i + min(room - HEADER.size, MAX_FRAME)]
                if self._gap or len(piece) <= 0 or not self._frame(tag, piece):
                    self.counters.add("parse_dropped_bytes", len(data) - i)  # the pipe is full: the rest too
                    if not self._gap:
                        self.counters.add("gaps")
                    self._gap = True
                    return
                i += len(piece)

    def _room(self) -> int:
        """Bytes a write is sure to take whole: the pipe's free bytes less two pages (a partly read page and a
        partly written one each take a whole slot), or PIPE_BUF where that cannot be told."""
        if self._size is None:
            return FRAME
        try:
            buf = array.array("i", [0])
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return FRAME
        return max(FRAME, self._size - buf[0] - 2 * PAGE)

    def _frame(self, tag: bytes, piece: bytes | memoryview) -> bool:
        header = HEADER.pack(tag, len(piece))
        try:
            n = os.writev(self.fd, (header, piece))
        except BlockingIOError:
            return False
        except OSError:  # the exporter is gone: the copy to the log goes on
            self.fd = None
            return False
        if n < len(header) + len(piece):  # never expected (room was checked): finish the frame, or stop the copy
            rest = (bytes(header) + bytes(piece))[n:]
            deadline = time.monotonic() + 5.0
            while rest and time.monotonic() < deadline:
                select.select([], [self.fd], [], 0.1)
                try:
                    rest = rest[os.write(self.fd, rest):]
                except BlockingIOError:
                    continue
                except OSError:
                    break
            if rest:
                note("the parser's copy was cut inside a frame: parsing stops here (the trainer's output goes on)")
                os.close(self.fd)
                self.fd = None
        return True


def pipe_size(fd: int) -> int | None:
    try:
        return fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    except OSError:
        return None


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


def pump(src: int, out: Output | None, tag: bytes, parse: Parse, counters: Counters) -> None:
    buf = bytearray(CHUNK)  # one buffer, read into again and again: no new memory (and page faults) per read
    whole = memoryview(buf)
    while True:
        try:
            n = os.readv(src, [buf])
        except InterruptedError:
            continue
        except OSError as e:  # the trainer's pipe failed: its copy ends here, said (not taken for its end)
            note(f"reading the trainer's {'stderr' if tag == b'e' else 'stdout'} failed ({e}); its copy stops here")
            n = 0
        if not n:
            break
        data = whole[:n]
        counters.add("bytes_read", n)
        if out is not None:
            out.write(data)  # first the log, whatever parsing does
        parse.send(tag, data)
        LOGS.flush()
    os.close(src)


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
    args = p.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # the trainer's end ends us: its pipes close
        signal.signal(sig, signal.SIG_IGN)
    counters = Counters(args.counters)
    LOGS.counters = counters
    parse = Parse(args.parse, counters)
    outputs: dict[int, Output] = {}
    threads = []
    for spec in args.stream:
        src, dst, tag = spec.split(":")
        out = None
        if int(dst) >= 0:
            out = outputs.setdefault(int(dst), Output(int(dst), {1: "stdout", 2: "stderr"}.get(int(dst), dst),
                                                      counters))
        set_pipe_size(int(src))
        threads.append(threading.Thread(target=pump, args=(int(src), out, tag.encode(), parse, counters)))
    LOGS.outputs = sorted(outputs.values(), key=lambda o: o.fd != 2)  # stderr first
    done = threading.Event()
    logger = threading.Thread(target=read_logs, args=(args.log, done), daemon=True) if args.log is not None else None
    for t in threads:
        t.start()
    if logger is not None:
        logger.start()
    for t in threads:
        t.join()
    if logger is not None:  # the exporter's last lines: until it closes its end (it does once the trainer exited)
        logger.join(LOG_DRAIN_SECONDS)
    done.set()
    if logger is not None:
        logger.join(1.0)
    LOGS.flush(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
