"""The trainer as a child process: `posttrain-exporter run [serve options] -- python train.py ...`.

The child's stdout and stderr are passed through, byte for byte and as they come, to the exporter's own
stdout and stderr (so the pod log is what it would be without the exporter), and the same bytes, in the
order they were read from the two pipes (the combined `2>&1` stream, as near as two pipes can tell it),
are handed to the parser. Pass-through never waits for parsing: it runs in its own thread, and when
parsing falls more than MAX_PENDING_BYTES behind, chunks are dropped for parsing only (counted in
`dropped_bytes`), never for the log. A closed stdout or stderr of ours (EPIPE) stops that copy and nothing
else: the child's pipes are always drained, so the trainer never blocks or dies on a broken pipe because
of the exporter.

`ChildOutput` is a ChunkReader (exporter/sources/base.py): `closed` and `poll(timeout) -> list[str]`, so it plugs
into the exporter (`Exporter.add_input`) as standard input does."""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

from exporter.sources.base import FollowStats, drain

log = logging.getLogger(__name__)

READ_SIZE = 1 << 16
MAX_PENDING_BYTES = 64 << 20  # text waiting for the parser; beyond it, new chunks skip parsing (not the log)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a pipe takes what fits)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PassThrough:
    """Copies bytes to one of our own file descriptors. A failed write (EPIPE: nobody reads our output any
    more, or any other error) stops the copy for good, once logged, and never raises."""

    def __init__(self, fd: int | None, name: str) -> None:
        self.fd = fd
        self.name = name
        self.failed: OSError | None = None

    def write(self, data: bytes) -> None:
        if self.fd is None or self.failed is not None:
            return
        try:
            write_all(self.fd, data)
        except OSError as e:
            self.failed = e
            log.warning("cannot copy the trainer's output to our %s any more (%s); still reading it", self.name,
                        e.strerror or e)


class PendingText:
    """Text read from a stream and waiting for the parser, bounded: past `max_pending` characters (parsing far
    behind the writer) new text is skipped for parsing and counted, never held, so the writer is never
    slowed down or the exporter's memory grown. `put` from the reading thread; `poll` from the ingest loop."""

    def __init__(self, what: str, max_pending: int = MAX_PENDING_BYTES) -> None:
        self.what = what
        self.closed = False
        self.dropped_bytes = 0  # read while parsing was too far behind: passed through, not parsed
        self._max = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._q: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def put(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            behind = self._pending + len(text) > self._max
            if not behind:
                self._pending += len(text)
        if behind:
            if not self.dropped_bytes:
                log.warning("parsing is more than %d MiB behind %s; skipping it for parsing until it catches up "
                            "(the pass-through is whole)", self._max >> 20, self.what)
            self.dropped_bytes += len(text.encode("utf-8", "replace"))
            return
        self._q.put(text)

    def end(self) -> None:
        self._q.put(None)

    def poll(self, timeout: float = 0.0) -> list[str]:
        """What is waiting (blocking up to `timeout` for the first piece); `closed` once the stream ended."""
        out, ended = drain(self._q, timeout)
        self.closed = self.closed or ended
        with self._lock:
            self._pending -= sum(map(len, out))
        return out


class ChildOutput:
    """Starts `argv` with its stdout and stderr on pipes; reads both in a thread that passes them through and
    queues the text for `poll`."""

    def __init__(self, argv: Sequence[str], stdout_fd: int | None = 1, stderr_fd: int | None = 2,
                 max_pending: int = MAX_PENDING_BYTES) -> None:
        # Its own process group: a terminal's Ctrl-C reaches the exporter alone, which forwards it once.
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                     process_group=0)
        self.stats = FollowStats(up=True)
        self.text = PendingText("the trainer's output", max_pending)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._outs = {self.proc.stdout.fileno(): PassThrough(stdout_fd, "stdout"),
                      self.proc.stderr.fileno(): PassThrough(stderr_fd, "stderr")}
        # One decoder per pipe: a character cut between two reads of one pipe is joined, never mixed with the other.
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in self._outs}
        self._thread = threading.Thread(target=self._pump, name="trainer-output", daemon=True)
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _pump(self) -> None:
        sel = selectors.DefaultSelector()
        for fd in self._outs:
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                for key, _ in sel.select():
                    fd = key.fd
                    try:
                        data = os.read(fd, READ_SIZE)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(fd)
                        self.text.put(self._decoders[fd].decode(b"", final=True))
                        continue
                    self._outs[fd].write(data)  # first the log, whatever parsing does
                    self.stats.bytes_read += len(data)
                    self.text.put(self._decoders[fd].decode(data))
        finally:
            sel.close()
            self.text.end()

    @property
    def bytes_read(self) -> int:
        return self.stats.bytes_read

    @property
    def closed(self) -> bool:
        return self.text.closed

    @property
    def dropped_bytes(self) -> int:
        return self.text.dropped_bytes

    def poll(self, timeout: float = 0.0) -> list[str]:
        return self.text.poll(timeout)

    def forward(self, signum: int) -> None:
        """Passes a signal we received on to the trainer (once it has exited, there is no one to tell)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def wait_output(self, timeout: float) -> bool:
        """After the trainer exited: wait for its pipes to close (a process it started may still hold them),
        at most `timeout` seconds. True when all its output was read."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def exit_status(self) -> int:
        """The trainer's exit status as a shell reports it: its code, or 128 + the signal that ended it."""
        code = self.proc.wait()
        return 128 - code if code < 0 else code


def run_child(child: ChildOutput, poll_once, stop: threading.Event, interval: float, linger: float = 0.0,
              output_grace: float = 5.0) -> int:
    """The `run` loop: ingest while the trainer runs, never letting an ingest failure stop the trainer's
    output (it is passed through by the reader thread regardless); forward SIGTERM/SIGINT/SIGHUP (set `stop`
    from the handler and call `child.forward`); return the trainer's exit status once it exited and its
    output was read."""
    failures = 0
    while True:
        try:
            poll_once()
        except Exception:  # a parsing bug costs metrics, never the trainer's output or its exit status
            failures += 1
            if failures == 1:
                log.exception("ingest failed; the trainer's output still passes through (further failures are "
                              "only counted)")
        if child.proc.poll() is not None:
            break
        stop.wait(interval)
        stop.clear()
    if not child.wait_output(output_grace):
        log.warning("the trainer exited but a process it started still holds its output open; not waiting for it")
    try:
        poll_once()
    except Exception:
        failures += 1
    deadline = time.monotonic() + linger
    while time.monotonic() < deadline:  # keep serving for a last scrape
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    return child.exit_status()
