"""Hostile inputs for each reader of the exporter, written to a file at a size asked for: the memory-ceiling tests
(small) and bench/memory_ceiling.py (about 100 MB each). Each input holds good data before and after the bad, so
that a reader that keeps the good data while leaving the bad out can be told from one that drops everything."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from exporter.sources.tensorboard import masked_crc

LAST_STEP = 10_000_000  # of the good data after the hostile part, in the inputs that end at a step of their own


def record_line(step: int, loss: float = 0.5) -> str:
    return json.dumps({"step": step, "loss": loss, "reward": 0.25 + step / 1000})


def panel_lines(step: int, headers: list[str], rows: list[list[str]]) -> Iterator[str]:
    """A TRL completion table as `rich` prints it (one line a cell, no wrapping)."""
    n = len(headers)

    def rule(left: str, mid: str, right: str, fill: str) -> str:
        return f"│ {left}{mid.join(fill * 3 for _ in range(n))}{right} │"

    yield f"╭──────── Step {step} ────────╮"
    yield rule("┏", "┳", "┓", "━")
    yield "│ ┃" + "┃".join(f" {h} " for h in headers) + "┃ │"
    yield rule("┡", "╇", "┩", "━")
    for i, row in enumerate(rows):
        yield "│ │" + "│".join(f" {c} " for c in row) + "│ │"
        yield rule("├", "┼", "┤", "─") if i < len(rows) - 1 else rule("└", "┴", "┘", "─")
    yield "╰──────────────────────────╯"


def good_panel(step: int) -> list[str]:
    return list(panel_lines(step, ["Prompt", "Completion", "correctness", "Advantage"],
                            [["What is 2+2?", f"4 at step {step}", "1.00", "0.50"],
                             ["What is 3+3?", "6", "1.00", "-0.50"]]))


def _write(path: Path, size: int, head: list[str], body: Callable[[int], Iterator[str]],
           tail: list[str] | Callable[[], list[str]]) -> Path:
    """head, then body(i) for i = 0, 1, ... until `size` bytes, then tail (or what it returns then); one line each."""
    with path.open("w", encoding="utf-8") as f:
        f.write("\n".join(head) + "\n")
        written, i = 0, 0
        while written < size:
            for line in body(i):
                f.write(line + "\n")
                written += len(line.encode()) + 1
            i += 1
        f.write("\n".join(tail() if callable(tail) else tail) + "\n")
    return path


def wide_table(path: Path, size: int, columns: int = 50_000, rows_per_panel: int = 80) -> Path:
    """Completion tables of `columns` named columns (each line well under 1 MiB), between good panels."""
    headers = ["Prompt", "Completion", *(f"r{i}" for i in range(columns - 2))]
    row = ["p", "c", *("1" for _ in range(columns - 2))]

    def body(i: int) -> Iterator[str]:
        yield record_line(10 + i)
        yield from panel_lines(10 + i, headers, [row] * rows_per_panel)

    return _write(path, size, [record_line(1), *good_panel(1)], body, [record_line(10_000), *good_panel(10_000)])


def long_table(path: Path, size: int) -> Path:
    """One completion table of ever more rows (each cell 2,000 characters), its bottom far away."""
    text = "x" * 2000
    head = [record_line(1), *good_panel(1), *list(panel_lines(2, ["Prompt", "Completion", "correctness"],
                                                              [["p", "c", "1.0"]]))[:-2]]

    def body(i: int) -> Iterator[str]:
        yield f"│ │ {text} │ {text} │ 1.0 │ │"
        yield "│ ├───┼───┼───┤ │"

    return _write(path, size, head, body, ["│ └───┴───┴───┘ │", "╰──────╯", record_line(10_000),
                                           *good_panel(10_000)])


def verl_samples(path: Path, size: int) -> Path:
    """verl's printed samples: steps of many long samples, each with hundreds of score keys."""
    prefix = "(TaskRunner pid=2817) "
    text = "y" * 3000

    def body(i: int) -> Iterator[str]:
        for _ in range(200):
            yield f"{prefix}[prompt] {text}"
            yield f"{prefix}[response] {text}"
            for k in range(100):
                yield f"{prefix}[score_{k}] 1.0"
        yield f"step:{10 + i} - critic/score/mean:1.0 - actor/entropy:0.5"

    return _write(path, size, [f"{prefix}[prompt] 1+1?", f"{prefix}[response] 2", f"{prefix}[score] 1.0",
                               "step:1 - critic/score/mean:1.0 - actor/entropy:0.5"], body,
                  [f"{prefix}[prompt] 2+2?", f"{prefix}[response] 4", f"{prefix}[score] 1.0",
                   "step:100000 - critic/score/mean:1.0 - actor/entropy:0.5"])


def postfix_bars(path: Path, size: int) -> Path:
    """tqdm bars with a postfix, each under a description of its own 8,000 characters long."""
    def body(i: int) -> Iterator[str]:
        yield f"{i:08d}{'d' * 8000}:  50%|█████     | 5/10 [00:01<00:01, 5.00it/s, loss=0.5, kl=0.01]"

    return _write(path, size, ["Train step:  10%|█         | 1/10 [00:01<00:09, 1.00it/s, loss=0.9]"], body,
                  ["Train step:  20%|██        | 2/10 [00:02<00:08, 1.00it/s, loss=0.8]"])


def trl_feed(path: Path, size: int, line_bytes: int = 1 << 20) -> Path:
    """The TRL callback's feed with garbage, lines near 1 MiB of numbers, and a line of another training."""
    wide = json.dumps({"step": 5, **{f"k{i}": 1.0 for i in range(line_bytes // 14)}})[: line_bytes - 1]

    def body(i: int) -> Iterator[str]:
        yield "\x00\xff garbage {not json"
        yield wide
        yield record_line(10 + i)

    return _write(path, size, [record_line(1)], body, [record_line(100_000)])


def gpu_feed(path: Path, size: int, t: float | None = None) -> Path:
    """GPU samples of 1 MiB lines, of thousands of GPUs, of new UUIDs each; good samples at `t` (default: the time
    each is written) first and last."""
    def sample(gpus: int, uuid: str, model: str = "m") -> str:
        return json.dumps({"t": time.time() if t is None else t, "nvml_up": True, "cuda_devices": 1, "gpus": [
            {"gpu": g, "uuid": f"{uuid}-{g}", "model": model, "utilization_ratio": 1.0, "power_watts": 300.0}
            for g in range(gpus)]})

    def body(i: int) -> Iterator[str]:
        yield sample(1, f"GPU-a{i}", "m" * (1 << 20))
        yield sample(5000, f"GPU-b{i}")
        yield sample(8, f"GPU-c{i}")

    return _write(path, size, [sample(1, "GPU-good")], body, lambda: [sample(1, "GPU-good")])


def trainer_state(path: Path, size: int, entry_keys: int = 20) -> Path:
    """A trainer_state.json as the Trainer writes it (indent 2) with a log_history of `size` bytes, one entry over
    1 MiB in its middle, its last entry at LAST_STEP."""
    with path.open("w") as f:
        f.write('{\n  "best_metric": null,\n  "global_step": 0,\n  "log_history": [\n')
        written, step = 0, 0
        while written < size:
            step += 1
            entry = {"step": step, "loss": 0.5, **{f"m{k}": k / 10 for k in range(entry_keys)}}
            if step == 100:
                entry["note"] = "z" * (2 << 20)
            text = ("    " if step == 1 else ",\n    ") + json.dumps(entry, indent=2).replace("\n", "\n    ")
            f.write(text)
            written += len(text)
        last = json.dumps({"step": LAST_STEP, "loss": 0.1}, indent=2).replace("\n", "\n    ")
        f.write(f',\n    {last}\n  ],\n  "max_steps": {LAST_STEP}\n}}\n')
    return path


def event(step: int, scalars: dict[str, float], extra: bytes = b"") -> bytes:
    """One TFRecord of an Event at `step` with `scalars` (Summary.Value simple_value), `extra` appended to it."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(num: int, payload: bytes) -> bytes:
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    values = b"".join(field(1, field(1, tag.encode()) + varint(2 << 3 | 5) + struct.pack("<f", v))
                      for tag, v in scalars.items())
    data = varint(2 << 3) + varint(step) + field(5, values) + extra
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def tensorboard(path: Path, size: int) -> Path:
    """Event records: steps with 20,000 tags each, records of 2 MiB (an image, say), good steps around."""
    with path.open("wb") as f:
        f.write(event(1, {"train/loss": 0.9}))
        written, step = 0, 1
        while written < size:
            step += 1
            for data in (event(step, {f"train/t{k}": 1.0 for k in range(20_000)}),
                         event(step, {"train/loss": 0.5}, field_padding(2 << 20))):
                f.write(data)
                written += len(data)
        f.write(event(LAST_STEP - 1, {"train/loss": 0.1}) + event(LAST_STEP, {"train/loss": 0.05}))
    return path


def field_padding(n: int) -> bytes:
    """An Event field the reader skips (number 9, length-delimited) of about `n` bytes."""
    length = bytearray()
    m = n
    while True:
        b, m = m & 0x7F, m >> 7
        length.append(b | (0x80 if m else 0))
        if not m:
            break
    return bytes([9 << 3 | 2]) + bytes(length) + b"\0" * n
