"""Standard input as a log stream: `python train.py 2>&1 | posttrain-exporter serve --log -`.

With `tee_fd` (serve sets it to standard output) the copier process (exporter/sources/copier.py) reads our input and
writes every byte to `tee_fd`, unchanged, so the trainer's output still reaches the pod log whatever the exporter
does (fails to listen, parses slowly, dies): a closed downstream (EPIPE) stops the copy, never the reading, and the
trainer upstream never dies of a broken pipe because of us. The copier starts before anything else of `serve`.

Without `tee_fd` (`dump -`, `report -`) the input is read here, in `poll`, whole: nothing is dropped."""

from __future__ import annotations

import codecs
import os
import select

from exporter.sources.base import FollowStats
from exporter.sources.child import CopierFeed
from exporter.sources.copier import PIPE_SIZE

READ_SIZE = 1 << 20


class StdinReader:
    def __init__(self, fd: int = 0, tee_fd: int | None = None, max_pending: int = PIPE_SIZE,
                 log_format: str = "logfmt") -> None:
        self._fd = fd
        self._tee = tee_fd
        self._pipe_size = max_pending
        self._log_format = log_format  # of the copier's own lines
        self.feed: CopierFeed | None = None
        self.stats = FollowStats(up=True)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._closed = False

    def start(self) -> StdinReader:
        """Starts the copier (with `tee_fd`; the first poll does it too)."""
        if self._tee is not None and self.feed is None:
            self.feed = CopierFeed([(self._fd, self._tee, "i")], pipe_size=self._pipe_size, stats=self.stats,
                                   log_format=self._log_format)
            # Only the copier reads our input from now on: were it gone, the writer upstream would be told so.
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, self._fd)
            os.close(devnull)
        return self

    def poll(self, timeout: float = 0.0) -> list[str]:
        self.start()
        if self.feed is not None:
            return self.feed.poll(timeout)
        if self._closed or not select.select([self._fd], [], [], timeout)[0]:
            return []
        try:
            data = os.read(self._fd, READ_SIZE)
        except OSError:
            data = b""
        if not data:
            self._closed = True
            return [self._decoder.decode(b"", final=True)]
        self.stats.bytes_read += len(data)
        return [self._decoder.decode(data)]

    @property
    def closed(self) -> bool:
        return self.feed.closed if self.feed is not None else self._closed

    @property
    def behind(self) -> bool:
        return self.feed is not None and self.feed.behind

    @property
    def dropped_bytes(self) -> int:
        return self.feed.dropped_bytes if self.feed is not None else 0

    def wait(self, timeout: float) -> bool:
        """True once every byte of our input was passed through (the copier ended), within `timeout`."""
        return self.feed is None or self.feed.wait(timeout)
