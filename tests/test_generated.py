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
