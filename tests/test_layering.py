"""A module sits above what it uses: the data flow's lower stages never import the ones above them.

Parsers and console framing know nothing of runs; instruments and detectors know nothing of the run state that
drives them (exporter/runstate.py sits above both); low-level sources know nothing of what their text becomes
(the inputs built over them, exporter/sources/inputs/, sit above the pipeline and the runs, exporter/runset.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "exporter"

# module prefix -> what it must never import (prefixes of dotted module names)
UPWARD = ("exporter.runstate", "exporter.pipeline", "exporter.runset", "exporter.app", "exporter.sources.inputs",
          "exporter.exposition", "exporter.report", "exporter.cli", "exporter.commands")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "exporter.parsers": ("exporter.instruments", "exporter.detectors", "exporter.console", *UPWARD),
    "exporter.console": ("exporter.instruments", "exporter.detectors", *UPWARD),
    "exporter.samples": ("exporter.instruments", "exporter.detectors", "exporter.console", *UPWARD),
    "exporter.instruments": ("exporter.detectors", *UPWARD),
    "exporter.detectors": UPWARD,
    "exporter.runstate": UPWARD[1:],
    "exporter.judgment": UPWARD[1:],  # above the run state it reads, below the report and the server that show it
    "exporter.runset": ("exporter.app", "exporter.sources", "exporter.exposition", "exporter.report", "exporter.cli",
                        "exporter.commands"),
    "exporter.sources": ("exporter.runstate", "exporter.pipeline", "exporter.runset", "exporter.app",
                         "exporter.exposition", "exporter.report"),
}
ABOVE_ITS_SOURCES = "exporter.sources.inputs"  # the inputs, built over the pipeline and the runs: above them by design


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
    if _under(module, ABOVE_ITS_SOURCES):
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


def _module_of(name: str, modules: set[str]) -> str | None:
    """`exporter.gpu.collector.GpuCollector` -> `exporter.gpu.collector`: the longest prefix that is a module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph() -> dict[str, set[str]]:
    """Every module's imports of the package's modules, wherever they stand: at the top, inside a function, or
    under TYPE_CHECKING (a loop a type checker or a reader walks is a loop too)."""
    paths = dict(_modules())
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets = {_module_of(name, set(paths)) for name in _imports(path)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm): each is at least one loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_import_loop_in_the_package() -> None:
    assert _cycles(_import_graph()) == []


def test_the_loop_finder_sees_a_loop_through_a_type_only_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_source_imports_the_exporter() -> None:
    """The inputs are built in sources/ and handed to the exporter, which holds them: none calls back into it."""
    for module, path in _modules():
        if _under(module, "exporter.sources"):
            wrong = sorted(i for i in _imports(path) if _under(i, "exporter.app"))
            assert not wrong, f"{module} imports {wrong}: a source never reaches back into the exporter"
