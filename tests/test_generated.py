"""Every artefact generated from the code (rules, boards, metrics doc, the chart's copies) is current, and
`scripts/generate.py --check` notices when one is not."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def _check() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/generate.py", "--check"], cwd=REPO, capture_output=True,
                          text=True)


def test_every_generated_artefact_is_current():
    done = _check()
    assert done.returncode == 0, done.stderr


def test_a_hand_edit_to_a_generated_file_is_reported(tmp_path):
    doc = REPO / "docs" / "metrics.md"
    original = doc.read_bytes()
    try:
        doc.write_bytes(original + b"\nedited by hand\n")
        done = _check()
    finally:
        doc.write_bytes(original)
    assert done.returncode == 1
    assert "docs/metrics.md" in done.stderr


def test_every_threshold_is_declared_once_with_where_it_is_exported():
    """Thresholds' fields carry their default and their (instrument, level): the exported series, the breach
    counters and the rules' limits all read them there, so a new threshold cannot be left unexported."""
    from dataclasses import fields

    from exporter.instruments.derived import threshold_key, threshold_series
    from exporter.instruments.settings import Thresholds

    series = threshold_series(Thresholds())
    keys = [w[:2] for f in fields(Thresholds) for w in f.metadata["series"]]
    assert len(keys) == len(set(keys)) == len(series)  # no (instrument, level) exported twice
    for f in fields(Thresholds):
        assert f.metadata["series"], f"{f.name} is not exported"
        assert series[threshold_key(f.name)] == f.default
    moved = threshold_series(Thresholds(kl_critical=3.0))
    assert moved["kl", "critical"] == 3.0 and moved["kl", "warning"] == 0.5
