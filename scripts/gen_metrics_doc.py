"""Rewrite docs/metrics.md from the code's key table and collector."""

from pathlib import Path

from exporter.metricdoc import render

target = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
target.write_text(render(), encoding="utf-8")
print(f"wrote {target}")
