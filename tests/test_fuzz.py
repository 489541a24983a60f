"""Mutated real log lines through the real pipeline (bench/fuzz.py's mutations and harness): no exception
escapes, every scrape renders as the Prometheus text format, and the valid lines placed after damaged ones
arrive, in order, with their values exported. Seeded: a failure is reproducible with its seed."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import fuzz


def check(formats: list[str], lines: int, seed: int) -> None:
    h, placed = fuzz.run_fuzz(lines, seed, formats, scrape_every=2500)
    text = h.scrape()
    assert not h.exceptions, h.exceptions[0]
    assert h.internal_errors() == 0  # no parser bug swallowed by the stream's safety net
    assert h.scrapes == lines // 2500 + 1 and text
    assert placed == lines // fuzz.CANARY_EVERY + 1 and not h.lost_canaries(placed)
    for run in h.arrived:
        assert f'posttrain_metric{{key="{fuzz.CANARY_KEY}",run="{run}"}} {placed - 1}.0' in text
        st = h.exporter.stats[run]
        assert sum(n for (_, outcome), n in st.lines.items() if outcome == "record") >= placed


def test_mutations_damage_every_part_of_a_line() -> None:
    """The fuzzer does what it claims: every mutation and every format conversion is drawn."""
    lines = [line for _, line, _ in fuzz.damaged_lines(3000, 5)]
    assert len(lines) == 3000 and len(set(lines)) > 2900
    joined = b"\n".join(lines)
    for marker in (b"x" * 10_000, b"7" * 1000, b"[" * 1000, b"\\ud800", b"\xff\xfe", b"inf", b"9" * 400,
                   b'{"step": ', b'"data": {', b" step=", b"step:", b"Global step "):
        assert marker in joined, marker


def test_fuzzed_lines_through_the_automatic_chain() -> None:
    check(["auto"], 50_000, seed=11)


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_lines_through_every_pinned_format(seed: int) -> None:
    check(["hf", "json", "verl", "openrlhf", "katib"], 5_000, seed=seed)
