"""A module sits above what it uses: the data flow's lower stages never import the ones above them.

Parsers and console framing know nothing of runs; instruments and detectors know nothing of the run state that
drives them (exporter/runstate.py sits above both); low-level sources know nothing of what their text becomes
(their adapters, exporter/sources/inputs.py, sit above the pipeline)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"

# module prefix -> what it must never import (prefixes of dotted module names)
UPWARD = ("exporter.runstate", "exporter.pipeline", "exporter.app", "exporter.sources.inputs",
          "exporter.exposition", "exporter.report", "exporter.cli", "exporter.commands")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "exporter.parsers": ("exporter.instruments", "exporter.detectors", "exporter.console", *UPWARD),
    "exporter.console": ("exporter.instruments", "exporter.detectors", *UPWARD),
    "exporter.samples": ("exporter.instruments", "exporter.detectors", "exporter.console", *UPWARD),
    "exporter.instruments": ("exporter.detectors", *UPWARD),
    "exporter.detectors": UPWARD,
    "exporter.runstate": UPWARD[1:],
    "exporter.judgment": UPWARD[1:],  # above the run state it reads, below the report and the server that show it
    "exporter.sources": ("exporter.runstate", "exporter.pipeline", "exporter.app", "exporter.exposition",
                         "exporter.report"),
}
ABOVE_ITS_SOURCES = {"exporter.sources.inputs"}  # the adapters: above the pipeline by design


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.startswith("exporter")}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_no_import_runs_back_up(module: str, path: Path) -> None:
    if module in ABOVE_ITS_SOURCES:
        return
    for layer, forbidden in FORBIDDEN.items():
        if not _under(module, layer):
            continue
        wrong = sorted(i for i in _imports(path) if any(_under(i, f) for f in forbidden))
        assert not wrong, f"{module} ({layer}) imports {wrong}, which sit above it"


def test_the_rule_sees_an_upward_import(tmp_path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from exporter.runstate import RunState\n")
    assert "exporter.runstate" in _imports(bad)
