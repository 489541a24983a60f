"""The copier process (exporter/sources/copier.py) on real pipes and files: the trainer's bytes go from its pipe to
the output without passing through the copier (tee and splice: the copier's read count stays far under what it
passes), every kind of output gets every byte, and a parser that falls behind loses text for parsing only, counted
and with the holes marked (never two pieces glued into one line)."""

from __future__ import annotations

import hashlib
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest

from exporter.sources.child import CopierFeed
from exporter.sources.copier import PIPE_SIZE, set_pipe_size


def _rchar(pid: int) -> int:
    """Bytes the process read with read(2) and its kin (splice and tee do not count)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def _drain(fd: int, into: list[bytes]) -> threading.Thread:
    def run() -> None:
        while chunk := os.read(fd, 1 << 20):
            into.append(chunk)
        os.close(fd)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _start(out_fd: int) -> tuple[CopierFeed, int]:
    """A copier on a new pipe (the trainer's stdout) to `out_fd`; the pipe's write end."""
    src_r, src_w = os.pipe()
    set_pipe_size(src_w)
    try:
        feed = CopierFeed([(src_r, out_fd, "o")])
    finally:
        os.close(src_r)
    return feed, src_w


def _poll_all(feed: CopierFeed, timeout: float = 30.0) -> str:
    text, deadline = [], time.monotonic() + timeout
    while not feed.closed and time.monotonic() < deadline:
        text += feed.poll(0.1)
    assert feed.closed, "the copier never ended"
    return "".join(text)


def test_bytes_from_a_pipe_to_a_pipe_never_pass_through_the_copier() -> None:
    """64 MiB of binary from the trainer's pipe to a pipe: the output gets them whole and in order, and the copier
    read (rchar) under a tenth of them: they were moved, not copied through it, which is what keeps a trainer
    printing at memory speed near its speed alone."""
    out_r, out_w = os.pipe()
    feed, src_w = _start(out_w)
    os.close(out_w)
    got: list[bytes] = []
    reader = _drain(out_r, got)
    blob = random.Random(7).randbytes(1 << 20)
    total = 64 << 20
    sent = hashlib.sha256()
    for i in range(64):  # the parser reads at the end only: its copy (which may be read, off the trainer's path)
        piece = blob[i:] + blob[:i]  # holds a few MiB, the rest is dropped for it
        os.write(src_w, piece)
        sent.update(piece)
    rchar = _rchar(feed.proc.pid)
    os.close(src_w)
    _poll_all(feed)
    reader.join(30)
    assert hashlib.sha256(b"".join(got)).digest() == sent.digest()
    assert feed.bytes_read == total
    assert rchar < total // 10, f"the copier read {rchar} of the {total} bytes it passed"


@pytest.mark.parametrize("kind", ["file", "appended file", "pipe"])
def test_every_kind_of_output_gets_every_byte(tmp_path: Path, kind: str) -> None:
    """Chunks of every size, lines and binary: a regular file and a file opened to append (copied: neither is
    spliced into) and a pipe (spliced into) all get the trainer's bytes exactly."""
    rng = random.Random(kind)
    pieces = []
    for i in range(400):
        size = rng.choice((1, 17, 4095, 4097, 65535, 65536, 65537, 300_000))
        pieces.append((b"line %d " % i + b"x" * size + b"\n") if i % 3 else rng.randbytes(size))
    data = b"".join(pieces)
    got: list[bytes] = []
    reader = None
    if kind == "pipe":
        out_r, out_w = os.pipe()
        reader = _drain(out_r, got)
    else:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if kind == "appended file" else os.O_TRUNC)
        out_w = os.open(tmp_path / "pod.log", flags)
    feed, src_w = _start(out_w)
    os.close(out_w)
    writer = threading.Thread(target=lambda: [os.write(src_w, p) for p in pieces] and None)
    writer.start()
    deadline = time.monotonic() + 60
    while writer.is_alive() and time.monotonic() < deadline:
        feed.poll(0.05)
    writer.join()
    os.close(src_w)
    _poll_all(feed)
    if reader is not None:
        reader.join(30)
        assert b"".join(got) == data
    else:
        assert (tmp_path / "pod.log").read_bytes() == data
    assert feed.bytes_read == len(data)


def test_a_parser_far_behind_loses_text_for_parsing_only_with_every_hole_marked() -> None:
    """Nobody parses while the trainer prints 16 MiB of numbered lines (more than the copier's pipes hold): the
    output gets them all; the parser later gets what was kept, the rest counted as dropped to the byte, and each
    hole is marked: no line it sees is two pieces of different lines glued together."""
    lines = [b"<%07d>\n" % i for i in range(16 << 20 >> 4)]
    data = b"".join(lines) * 2
    out_r, out_w = os.pipe()
    feed, src_w = _start(out_w)
    os.close(out_w)
    got: list[bytes] = []
    reader = _drain(out_r, got)
    for i in range(0, len(data), 1 << 16):
        os.write(src_w, data[i:i + (1 << 16)])
    os.close(src_w)  # the trainer's end; only now does the parser read
    text = _poll_all(feed)
    reader.join(30)
    assert b"".join(got) == data
    assert feed.dropped_bytes > 0 and feed.gaps > 0
    # each hole is one "\n" in the text (a GAP): what was parsed and what was dropped make up the whole
    assert len(text) - feed.gaps + feed.dropped_bytes == len(data)
    whole = 0
    for line in text.split("\n"):
        assert re.fullmatch(r"<?\d{0,7}>?", line), line
        if line.startswith("<") and line.endswith(">"):
            assert len(line) == 9, f"two pieces glued: {line!r}"
            whole += 1
    assert whole > PIPE_SIZE // 9  # the copier's pipes held lines for the parser, whole


def test_stdout_and_stderr_into_one_file_lose_no_byte(tmp_path: Path) -> None:
    """`run ... > pod.log 2>&1`: both streams write one open file. splice(2) moves the file's offset without the lock
    that write(2) takes, so a splice and a write (or two splices) at once wrote at one offset and overwrote each other
    (a quarter of the bytes lost): the file gets every byte of both streams."""
    log = os.open(tmp_path / "pod.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    log2 = os.dup(log)  # 2>&1: two descriptors, one open file (one offset)
    pipes = [os.pipe(), os.pipe()]
    for _, w in pipes:
        set_pipe_size(w)
    try:
        feed = CopierFeed([(pipes[0][0], log, "o"), (pipes[1][0], log2, "e")])
    finally:
        for fd in (pipes[0][0], pipes[1][0], log, log2):
            os.close(fd)
    chunks = [(b"o" * 1023 + b"\n") * 256, (b"e" * 1023 + b"\n") * 256]

    def write(i: int) -> None:
        for _ in range(32):
            os.write(pipes[i][1], chunks[i])
        os.close(pipes[i][1])
    writers = [threading.Thread(target=write, args=(i,)) for i in (0, 1)]
    for t in writers:
        t.start()
    _poll_all(feed)
    for t in writers:
        t.join()
    data = (tmp_path / "pod.log").read_bytes()
    assert len(data) == 2 * 32 * len(chunks[0])
    assert data.count(b"o" * 1023 + b"\n") == data.count(b"e" * 1023 + b"\n") == 32 * 256


def test_short_lines_fill_the_parsers_copy_by_their_bytes_not_their_number() -> None:
    """A trainer printing short lines one write each (a logger, python -u) while the parser is busy: a pipe holds
    at most 256 buffers however small, and tee/splice handed on one per write, so 512 lines of 100 bytes filled the
    parser's copy and the rest was dropped (two thirds of 200 kB, with 2 MiB of pipes). Copied by the feeder, they
    take their bytes: 200 kB reach the parser whole, nothing dropped."""
    out_r, out_w = os.pipe()
    feed, src_w = _start(out_w)
    os.close(out_w)
    got: list[bytes] = []
    reader = _drain(out_r, got)
    lines = [b"step %06d loss 0.25 " % i + b"x" * 78 + b"\n" for i in range(2000)]
    for line in lines:  # one buffer each: the copier keeps up with every write
        os.write(src_w, line)
        time.sleep(0.0005)
    os.close(src_w)  # the parser was busy until now
    text = _poll_all(feed)
    reader.join(30)
    assert b"".join(got) == b"".join(lines)
    assert (feed.dropped_bytes, feed.gaps) == (0, 0)
    assert text == b"".join(lines).decode()
