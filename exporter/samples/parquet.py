"""TRL's completions files: GRPOTrainer with `log_completions=True` writes every row of every logged step to
`OUTPUT_DIR/completions/completions_NNNNN.parquet` (columns step, prompt, completion, one per reward function, any
extra columns, advantage), whether or not `rich` is installed.

Optional: reading parquet needs pyarrow (`pip install posttrain-exporter[parquet]`), which is never imported on the
sidecar's path (only here, when a completions folder is read); without it `available()` is False and the report
says so. Prompts or completions given as chat messages (lists of {role, content}) are joined as `ROLE: content`."""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Iterator
from pathlib import Path

from exporter.samples.sampleset import Sample, SampleSet

_NAME = re.compile(r"completions_(\d{1,15})\.parquet$")
_FIXED = ("step", "prompt", "completion", "advantage")


def available() -> bool:
    try:
        return importlib.util.find_spec("pyarrow") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a half-imported module
        return False


def files(folder: Path) -> list[tuple[int, Path]]:
    """The folder's completions files by step (the step in the name)."""
    out = []
    for path in folder.glob("completions_*.parquet"):
        m = _NAME.search(path.name)
        if m:
            out.append((int(m.group(1)), path))
    return sorted(out)


def read_file(path: Path, step: int) -> SampleSet:
    """One file's rows. Raises ImportError without pyarrow, OSError/ValueError for a file that does not read."""
    import pyarrow.parquet as pq  # optional: see the module's docstring

    table = pq.read_table(path)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    n = table.num_rows
    rewards = [c for c in table.column_names if c not in _FIXED and _numeric(cols[c])]
    advantages = cols.get("advantage", [None] * n)
    samples = tuple(
        Sample(_text(cols.get("prompt", [""] * n)[i]), _text(cols.get("completion", [""] * n)[i]),
               {r: _float(cols[r][i]) for r in rewards}, _float_or_none(advantages[i]))
        for i in range(n))
    return SampleSet(step, "trl_parquet", samples)


def read_folder(folder: Path) -> Iterator[SampleSet]:
    for step, path in files(folder):
        yield read_file(path, step)


def _numeric(values: list) -> bool:
    return all(v is None or isinstance(v, int | float) for v in values)


def _text(value: object) -> str:
    if isinstance(value, list):
        return "\n".join(f"{str(m.get('role', '')).upper()}: {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in value)
    return "" if value is None else str(value)


def _float(value: object) -> float:
    return math.nan if value is None else float(value)  # type: ignore[arg-type]


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
