"""The trainer as a child process: `posttrain-exporter run [serve options] -- python train.py ...`.

The child's stdout and stderr are passed through, byte for byte and as they come, to the exporter's own
stdout and stderr (so the pod log is what it would be without the exporter), and the same bytes, in the
order they were read from the two pipes (the combined `2>&1` stream, as near as two pipes can tell it),
are handed to the parser. The copy is made by a process of its own (exporter/sources/copier.py), started
before the trainer: it never waits on parsing, shares neither the exporter's interpreter lock nor its
memory, and goes on if the exporter fails or dies. When parsing is behind, what does not fit its pipe is
dropped for parsing only (counted), never for the log.

`CopierFeed` is the exporter's end of that process and a ChunkReader (exporter/sources/base.py): `closed`
and `poll(timeout) -> list[str]`, so it plugs into the exporter (`Exporter.add_input`) as a stream does.
`ChildOutput` is the trainer and its copier; its `feed` is what the exporter reads."""

from __future__ import annotations

import codecs
import contextlib
import logging
import mmap
import os
import select
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import exporter
from exporter.sources.base import FollowStats
from exporter.sources.copier import COUNTERS, COUNTERS_SIZE, GAP, HEADER, PIPE_SIZE, set_pipe_size

log = logging.getLogger(__name__)

POLL_READ = 1 << 20  # parse-pipe bytes taken by one poll (the pipe holds as much): more waiting, the loop polls again
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SIGNAL_CHECK_SECONDS = 0.1  # how soon a signal that reached another thread is handled (forwarded)
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(exporter.__file__)))


class CopierFeed:
    """Starts the copier on `streams` ((source fd, destination fd or None, tag), tags one byte each), and reads
    its copy for the parser. The caller closes its own copies of the source fds once this returns. `relay_log`:
    a pipe for the exporter's own log lines (`log_fd`), written by the copier between the trainer's lines."""

    def __init__(self, streams: Sequence[tuple[int, int | None, str]], *, relay_log: bool = False,
                 pipe_size: int = PIPE_SIZE, stats: FollowStats | None = None, log_format: str = "logfmt") -> None:
        self.stats = stats or FollowStats()
        self.stats.up = True
        self.closed = False
        self.behind = False  # the last poll left text waiting
        self._counters_file = tempfile.TemporaryFile()  # noqa: SIM115 (shared with the copier for its life)
        self._counters_file.truncate(COUNTERS_SIZE)
        self._counters = mmap.mmap(self._counters_file.fileno(), COUNTERS_SIZE)
        parse_r, parse_w = os.pipe()
        set_pipe_size(parse_w, pipe_size)
        argv = [sys.executable, "-m", "exporter.sources.copier", "--parse", str(parse_w),
                "--counters", str(self._counters_file.fileno()), "--log-format", log_format]
        keep = [parse_w, self._counters_file.fileno()]
        dups = []  # the copier's standard input is /dev/null: our own standard input is passed as another fd
        for src, dst, tag in streams:
            if src <= 2:
                src = os.dup(src)
                dups.append(src)
            argv += ["--stream", f"{src}:{-1 if dst is None else dst}:{tag}"]
            keep += [src] + ([dst] if dst is not None and dst > 2 else [])
        log_r = None
        self.log_fd: int | None = None
        if relay_log:
            log_r, self.log_fd = os.pipe()
            argv += ["--log", str(log_r)]
            keep.append(log_r)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        try:  # its own process group: a terminal's Ctrl-C is for the exporter and the trainer, not the copy
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=keep, env=env, process_group=0)
        finally:
            for fd in [parse_w, *dups]:
                os.close(fd)
            if log_r is not None:
                os.close(log_r)
        self._fd = parse_r
        os.set_blocking(parse_r, False)
        self._buf = bytearray()
        self._decoders: dict[bytes, codecs.IncrementalDecoder] = {}
        self.gaps = 0

    def counter(self, name: str) -> int:
        return struct.unpack_from("<Q", self._counters, 8 * COUNTERS.index(name))[0]

    @property
    def dropped_bytes(self) -> int:
        return self.counter("parse_dropped_bytes")

    @property
    def bytes_read(self) -> int:
        return self.counter("bytes_read")

    def poll(self, timeout: float = 0.0) -> list[str]:
        """The text the copier offered since the last poll (up to POLL_READ bytes of it), waiting up to `timeout`
        for the first piece; `closed` once the copier ended and everything was handed out."""
        if self.closed:
            return []
        if timeout:
            select.select([self._fd], [], [], timeout)
        ended, budget = False, POLL_READ
        while budget > 0:
            try:
                data = os.read(self._fd, min(budget, 1 << 20))
            except BlockingIOError:
                break
            if not data:
                ended = True
                break
            self._buf += data
            budget -= len(data)
        self.behind = budget <= 0
        text = self._frames()
        self.stats.bytes_read, self.stats.dropped_bytes = self.bytes_read, self.dropped_bytes
        self.stats.output_dropped_bytes = self.counter("output_dropped_bytes")
        self.stats.output_write_errors = self.counter("output_write_errors")
        self.stats.log_lines_dropped = self.counter("log_lines_dropped")
        if ended:
            text += "".join(d.decode(b"", final=True) for d in self._decoders.values())
            self.closed, self.stats.up = True, False
            os.close(self._fd)
        return [text] if text else []

    def _frames(self) -> str:
        pieces, i, buf = [], 0, self._buf
        while len(buf) - i >= HEADER.size:
            tag, n = HEADER.unpack_from(buf, i)
            if len(buf) - i - HEADER.size < n:
                break
            payload = bytes(buf[i + HEADER.size:i + HEADER.size + n])
            i += HEADER.size + n
            if tag == GAP:  # text was dropped here: what is before and after it are not one line
                pieces += [d.decode(b"", final=True) for d in self._decoders.values()]
                pieces.append("\n")
                self.gaps += 1
                continue
            decoder = self._decoders.get(tag)
            if decoder is None:  # one per stream: a character cut between two reads of one pipe is joined
                decoder = self._decoders[tag] = codecs.getincrementaldecoder("utf-8")("replace")
            pieces.append(decoder.decode(payload))
        del buf[:i]
        return "".join(pieces)

    def wait(self, timeout: float) -> bool:
        """True once the copier ended (its streams closed: every byte passed through), within `timeout`."""
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        """The exporter ends: a copier still held by a process the trainer left behind ends with it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class ChildOutput:
    """The trainer, started with its stdout and stderr on pipes that the copier alone reads."""

    def __init__(self, argv: Sequence[str], stdout_fd: int | None = 1, stderr_fd: int | None = 2,
                 max_pending: int = PIPE_SIZE, relay_log: bool = False, log_format: str = "logfmt") -> None:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            set_pipe_size(out_w)
            set_pipe_size(err_w)
            # the copier first: from the trainer's first byte, something reads its pipes
            self.feed = CopierFeed([(out_r, stdout_fd, "o"), (err_r, stderr_fd, "e")], relay_log=relay_log,
                                   pipe_size=max_pending, log_format=log_format)
        except BaseException:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        os.close(out_r)
        os.close(err_r)
        try:  # its own process group: a terminal's Ctrl-C reaches the exporter alone, which forwards it once
            self.proc = subprocess.Popen(list(argv), stdout=out_w, stderr=err_w, bufsize=0, process_group=0)
        finally:
            os.close(out_w)  # the copier sees their end when the trainer (and whatever it started) closes them
            os.close(err_w)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def forward(self, signum: int) -> None:
        """Passes a signal we received on to the trainer (once it has exited, there is no one to tell)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def wait_output(self, timeout: float) -> bool:
        """After the trainer exited: wait for its pipes to close (a process it started may still hold them),
        at most `timeout` seconds. True when all its output was passed through."""
        return self.feed.wait(timeout)

    def exit_status(self) -> int:
        """The trainer's exit status as a shell reports it: its code, or 128 + the signal that ended it."""
        # Not one blocking waitpid: the kernel may hand a signal for this process to any of its threads, and then a
        # main thread blocked in waitpid never wakes to run the handler that forwards it to the trainer (which
        # then never ends). A wait with a timeout sleeps in short steps and runs pending handlers between them.
        while True:
            try:
                code = self.proc.wait(timeout=SIGNAL_CHECK_SECONDS)
                break
            except subprocess.TimeoutExpired:
                continue
        return 128 - code if code < 0 else code
