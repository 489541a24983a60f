"""What every log source is to the exporter, whatever it reads.

Two levels, as mtail separates its log streams from the loop that drives them:
- a `ChunkReader` is a stream of text handed out in chunks (standard input, the trainer child, the demo's
  replay, a pod's log through the Kubernetes API); files, trainer_state.json and TensorBoard folders have
  readers of their own shape (they are polled, not streamed);
- a `Source` is one log bound to its run: the exporter's loop calls `poll` and `finish` on it, and the
  collector reads its `follow` counters. app.py builds the right Source for a path (`Exporter.add_input`).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exporter.config import LogSpec


@dataclass
class FollowStats:
    """A source's own health, exported per log (posttrain_exporter_source_*)."""

    up: bool = False  # the source could be read at the last poll (a stream: it is open)
    rotations: int = 0  # another file took the path (rename, delete and recreate): read from its start
    # the file shrank or its start was rewritten (copytruncate): read again from its start; a trainer_state.json whose
    # entries already read changed: read again from where they differ
    truncations: int = 0
    resumed: int = 0  # read on after an interruption (a file that came back, a pod log's stream reopened)
    read_errors: int = 0
    bytes_read: int = 0  # bytes, as read from the file, pipe or connection (not characters after decoding)
    dropped_bytes: int = 0  # a copied stream's bytes skipped for parsing (the parser was behind), never for the log
    nul_bytes: int = 0  # a file's NUL bytes, no text: skipped (a hole a writer not in append mode left at a truncation)
    output_dropped_bytes: int = 0  # a copied stream's bytes its copy to standard output could not write (disk full)
    output_write_errors: int = 0  # a copied stream's failed writes to standard output (each retried, then dropped)
    log_lines_dropped: int = 0  # the exporter's own log lines the copier could not place between the trainer's


class ChunkReader(Protocol):
    """A stream of text handed out in chunks. It counts its own bytes in `stats` (it alone sees them undecoded)."""

    stats: FollowStats

    @property
    def closed(self) -> bool:
        """True once the stream ended and everything it held was handed out."""
        ...

    def poll(self, timeout: float = 0.0) -> list[str]:
        """The text waiting now, waiting up to `timeout` seconds for the first piece."""
        ...


class Source:
    """One log bound to its run, driven by the exporter's loop in two halves: `read` does the I/O (opening,
    stat, reading, fingerprinting: any of it may block, on a FIFO or a hung mount) and runs without the state lock;
    `ingest` hands what was read to the run, under the lock that scrapes take. `poll` is both, for callers that
    hold no lock (`dump`, `report`)."""

    spec: LogSpec
    follow: FollowStats

    def poll(self, timeout: float = 0.0) -> bool:
        """Reads what is new (a stream waits up to `timeout` for it) and ingests it; True when something came."""
        self.read(timeout)
        return self.ingest()

    def read(self, timeout: float = 0.0) -> None:
        """The I/O half of `poll`: what is new is read and held for `ingest`. Never under the state lock."""

    def ingest(self) -> bool:
        """The state half of `poll`: what `read` held goes to the run; True when something came."""
        raise NotImplementedError

    def finish(self) -> None:
        """End of input: ingest whatever is still held (a line without its newline, a record waiting for its bar)."""

    @property
    def catching_up(self) -> bool:
        """More is waiting than one poll reads (a log's history after a start): poll again at once."""
        return False

    @property
    def drained(self) -> bool:
        """Everything there is now has been read: `dump` stops polling here (a stream: once it has ended)."""
        return not self.catching_up


def drain(q: queue.Queue[str | None] | queue.SimpleQueue[str | None], timeout: float) -> tuple[list[str], bool]:
    """Everything waiting in `q`, a reading thread's queue of text ended by None, waiting up to `timeout` for the
    first piece; and whether the end was reached."""
    out: list[str] = []
    try:
        item = q.get(timeout=timeout) if timeout else q.get_nowait()
        while item is not None:
            out.append(item)
            item = q.get_nowait()
        return out, True
    except queue.Empty:
        return out, False
