"""TRL's completions folder followed: `OUTPUT_DIR/completions/completions_NNNNN.parquet`, one file per logged step
(GRPOTrainer with `log_completions=True`), each read once into a SampleSet (exporter/samples/parquet.py).

TRL writes a file whole but not atomically, so a file is read when it parses; one that does not parse is tried
again at the next poll, and counted as bad once its size and mtime stayed the same over two polls (a file still
being written grows). A file is read once by name: one written again later (a resume over the same step) is not
read again. Reading needs pyarrow (the `parquet` extra): without it such a folder is refused at start
(sources/detect.py)."""

from __future__ import annotations

import os
from pathlib import Path

from exporter.samples import parquet
from exporter.samples.sampleset import SampleSet

FORMAT = "trl_parquet"
# Files read in one poll: about 0.1 s of work each way (read here, diversity under the lock); more waits a poll.
FILES_PER_POLL = 32


def looks_like_completions(path: str) -> bool:
    """A folder holding TRL's completions files, or named `completions` (TRL's own name, before its first file)."""
    if not os.path.isdir(path):
        return False
    return Path(path).name == "completions" or bool(parquet.files(Path(path)))


class CompletionsReader:
    """New completions files, in step order, as sample sets; bad ones as (reason, file name) in `errors`."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.up = False
        self.bytes_read = 0
        self.behind = False  # more new files than one poll reads
        self.errors: list[tuple[str, str]] = []  # (reason, "file name: the error"), taken by the adapter
        self._done: set[str] = set()  # names read or given up on
        self._seen: dict[str, tuple[int, int]] = {}  # a file that did not parse: its (size, mtime_ns) then

    @property
    def pending(self) -> bool:
        """A file waits: more than one poll's worth, or one that did not parse yet and may still be growing."""
        return self.behind or bool(self._seen)

    def poll(self) -> list[SampleSet]:
        try:
            found = parquet.files(self.folder)
            self.up = self.folder.is_dir()  # a folder removed globs as empty
        except OSError:
            self.up = False
            return []
        names = {path.name for _, path in found}
        for gone in [n for n in self._seen if n not in names]:  # a half-written file that went away waits no more
            del self._seen[gone]
        new = [(step, path) for step, path in found if path.name not in self._done]
        self.behind = len(new) > FILES_PER_POLL
        out = []
        for step, path in new[:FILES_PER_POLL]:
            got = self._read(step, path)
            if got is not None:
                out.append(got)
        return out

    def _read(self, step: int, path: Path) -> SampleSet | None:
        try:
            st = path.stat()
        except OSError:
            self._seen.pop(path.name, None)
            return None  # gone between the listing and now
        try:
            got = parquet.read_file(path, step)
        except Exception as e:  # pyarrow's errors are many (ArrowInvalid, OSError, ...): all mean "not readable yet"
            mark = (st.st_size, st.st_mtime_ns)
            if self._seen.get(path.name) == mark:  # unchanged since the last poll: not being written, bad
                del self._seen[path.name]
                self._done.add(path.name)
                self.errors.append((_reason(e), f"{path.name}: {type(e).__name__}: {str(e)[:200]}"))
            else:
                self._seen[path.name] = mark
            return None
        self._seen.pop(path.name, None)
        self._done.add(path.name)
        self.bytes_read += st.st_size
        return got


def _reason(e: Exception) -> str:
    return "pyarrow_missing" if isinstance(e, ImportError) else "unreadable_parquet"
